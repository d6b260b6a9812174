#include "io/atomic_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "common/error.h"

namespace thpc {
namespace {

namespace fs = std::filesystem;

}  // namespace

void fsync_path(const std::string& path, const std::string& what) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0 || ::fsync(fd) != 0) {
    const int error = errno;
    if (fd >= 0) ::close(fd);
    THPC_FAIL("cannot write " << what << ": fsync of " << path << ": " << std::strerror(error));
  }
  ::close(fd);
}

std::string temporary_path(const std::string& path) {
  const fs::path final_path(path);
  return (final_path.parent_path() / ("." + final_path.filename().string() + ".tmp")).string();
}

void write_atomically(const std::string& path, const std::string& what,
                      const std::function<void(const std::string& temporary)>& write) {
  const fs::path final_path(path);
  const fs::path directory = final_path.has_parent_path() ? final_path.parent_path() : ".";
  std::error_code error;
  fs::create_directories(directory, error);
  if (error) {
    THPC_FAIL("cannot write " << what << ": cannot create directory " << directory << ": "
                              << error.message());
  }
  const std::string temporary = temporary_path(path);
  try {
    write(temporary);
    fsync_path(temporary, what);
  } catch (...) {
    fs::remove(temporary, error);  // a partial file helps nobody
    throw;
  }
  fs::rename(temporary, final_path, error);
  if (error) {
    THPC_FAIL("cannot write " << what << ": rename of " << temporary << ": "
                              << error.message());
  }
  // The rename itself is durable only once the directory entry is on disk.
  fsync_path(directory.string(), what);
}

}  // namespace thpc
