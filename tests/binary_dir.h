// The build folder whose programs the tests run (BUILD/transformer_*): the folder above
// the running test executable's own, since CMake puts every test executable in BUILD/tests
// (tests/tests.cmake). Found at run time rather than compiled in as a path, so that a
// test's object file is the same in every build folder: ccache then hands the Makefiles
// tree (CI's build-make/) the Ninja tree's test objects instead of compiling them again.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <system_error>

namespace thpc {

inline const std::string& binary_dir() {
  static const std::string dir = [] {
    std::error_code error;
    const std::filesystem::path executable = std::filesystem::read_symlink("/proc/self/exe", error);
    if (error) {
      std::fprintf(stderr, "binary_dir: cannot read /proc/self/exe (%s): the tests find the "
                   "build folder's programs through it\n", error.message().c_str());
      std::abort();
    }
    return executable.parent_path().parent_path().string();
  }();
  return dir;
}

}  // namespace thpc
