// Spack.yaml must name every dependency that CMakeLists.txt looks for, so that a
// cluster user who installs the Spack environment can build without surprises.
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>

namespace {

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << "cannot open " << path;
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// The dependencies CMakeLists.txt asks for: find_package names, pkg-config modules and
// the libraries located with find_library.
std::set<std::string> cmake_dependencies(const std::string& cmake) {
  std::set<std::string> found;
  const std::regex find_package(R"(find_package\((\w+))");
  const std::regex pkg_module(R"(pkg_check_modules\(\w+\s+(?:REQUIRED\s+)?(?:IMPORTED_TARGET\s+)?(\w+))");
  const std::regex find_library(R"(find_library\(\w+\s+(\w+))");
  for (const auto* re : {&find_package, &pkg_module, &find_library}) {
    for (std::sregex_iterator it(cmake.begin(), cmake.end(), *re), end; it != end; ++it) {
      found.insert((*it)[1]);
    }
  }
  return found;
}

// The spec names of Spack.yaml's `specs:` list.
std::set<std::string> spack_specs(const std::string& yaml) {
  std::set<std::string> specs;
  std::istringstream lines(yaml);
  std::string line;
  bool in_specs = false;
  const std::regex item(R"(^\s*-\s*([a-z0-9_-]+))");
  while (std::getline(lines, line)) {
    if (line.find("specs:") != std::string::npos) {
      in_specs = true;
      continue;
    }
    std::smatch m;
    if (in_specs && std::regex_search(line, m, item)) {
      specs.insert(m[1]);
    } else if (in_specs && !line.empty() && line.find_first_not_of(' ') != std::string::npos &&
               line.find('-') == std::string::npos) {
      in_specs = false;  // the next key of the environment
    }
  }
  return specs;
}

TEST(Spack, NamesEveryDependencyCMakeLooksFor) {
  const std::string root = THPC_SOURCE_DIR;
  const std::set<std::string> deps = cmake_dependencies(read_file(root + "/CMakeLists.txt"));
  const std::set<std::string> specs = spack_specs(read_file(root + "/Spack.yaml"));
  // CMake's name -> the Spack package that provides it. Threads is the C library's.
  const std::map<std::string, std::string> provider = {
      {"MPI", "openmpi"},         {"HDF5", "hdf5"},       {"Boost", "boost"},
      {"PkgConfig", "pkgconf"},   {"sentencepiece", "sentencepiece"},
      {"OpenBLAS", "openblas"},   {"GTest", "googletest"}, {"CUDAToolkit", "cuda"},
      {"nccl", "nccl"},           {"Threads", ""}};
  ASSERT_GE(deps.size(), 9u) << "the CMakeLists.txt parser found too little";
  for (const std::string& dep : deps) {
    auto it = provider.find(dep);
    ASSERT_NE(it, provider.end()) << "CMakeLists.txt looks for '" << dep
                                  << "': add its Spack package to Spack.yaml and to this map";
    if (it->second.empty()) continue;
    EXPECT_TRUE(specs.count(it->second)) << "Spack.yaml lacks '" << it->second << "' (for "
                                         << dep << ")";
  }
  EXPECT_TRUE(specs.count("cmake")) << "Spack.yaml lacks cmake";
  EXPECT_NE(read_file(root + "/Spack.yaml").find("program_options"), std::string::npos)
      << "boost needs +program_options";
}

}  // namespace
