#include "common/input_file.h"

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <sstream>

#include "common/error.h"

namespace thpc {

std::string unreadable_file_reason(const std::string& path) {
  std::error_code error;
  const std::filesystem::file_status status = std::filesystem::status(path, error);
  if (status.type() == std::filesystem::file_type::not_found) return "no such file";
  if (status.type() == std::filesystem::file_type::directory) {
    return "is a directory, not a file";
  }
  errno = 0;
  std::ifstream probe(path, std::ios::binary);
  if (!probe) return errno != 0 ? std::strerror(errno) : "cannot be opened";
  return "";
}

std::ifstream open_input_file(const std::string& path, const std::string& what) {
  const std::string why = unreadable_file_reason(path);
  const std::string named = what.empty() ? "" : " (" + what + ")";
  if (!why.empty()) THPC_FAIL(path << ": " << why << named);
  std::ifstream in(path, std::ios::binary);
  if (!in) THPC_FAIL(path << ": cannot be opened" << named);
  return in;
}

std::string read_input_file(const std::string& path, const std::string& what) {
  std::ifstream in = open_input_file(path, what);
  std::ostringstream bytes;
  bytes << in.rdbuf();
  if (in.bad()) {
    THPC_FAIL(path << ": read error" << (what.empty() ? "" : " (" + what + ")"));
  }
  return bytes.str();
}

}  // namespace thpc
