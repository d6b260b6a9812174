// Where the tests find the public data sets (Multi30k, newstest2014, the PTB sample, EVALB's
// and sacreBLEU's test vectors): one setting, the environment variable THPC_DATA, naming a
// folder laid out as `tools/fetch_data.sh` writes it (DATA/multi30k, DATA/wmt14_test,
// DATA/ptb_sample, DATA/evalb, DATA/sacrebleu_tests); when set and non-empty it is used
// as given. When it is unset or empty, the fallback is `shared/data` in the folder that
// holds the repository (THPC_SOURCE_DIR/../shared/data), used when it is a directory (a
// checkout next to a prepared data tree).
// A test that needs absent data skips, naming the command that fetches it, so a clone with
// nothing beside it still passes.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <string>

namespace thpc {

// The data root: THPC_DATA when set and non-empty, else the fallback folder (canonical
// path) when it is a directory, else "".
inline std::string data_root() {
  namespace fs = std::filesystem;
  if (const char* chosen = std::getenv("THPC_DATA"); chosen != nullptr && *chosen != '\0') {
    return chosen;
  }
  const fs::path beside = fs::path(THPC_SOURCE_DIR) / ".." / "shared" / "data";
  std::error_code error;
  return fs::is_directory(beside, error) ? fs::canonical(beside, error).string() : std::string();
}

// DATA/relative, or "" when the data root is unknown or the path does not exist.
inline std::string data_path(const std::string& relative) {
  const std::string root = data_root();
  if (root.empty()) return {};
  const std::filesystem::path path = std::filesystem::path(root) / relative;
  std::error_code error;
  return std::filesystem::exists(path, error) ? path.string() : std::string();
}

// The reason a test skips when DATA/relative is absent: which setting and which command.
inline std::string missing_data_reason(const std::string& relative) {
  const std::string set = data_root();
  const std::string name = relative.substr(0, relative.find('/'));
  return "needs data '" + relative + "' under THPC_DATA (" + (set.empty() ? "unset" : set) +
         "): run `bash tools/fetch_data.sh " + name + " DIR` and set THPC_DATA=DIR";
}

}  // namespace thpc

// Skips the current test unless DATA/relative exists.
#define THPC_REQUIRE_DATA(relative)                                              \
  do {                                                                           \
    if (::thpc::data_path(relative).empty()) {                                   \
      GTEST_SKIP() << ::thpc::missing_data_reason(relative);                     \
    }                                                                            \
  } while (0)
