#include "checkpoint/hdf5_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "common/error.h"

namespace thpc::hdf5 {
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

void silence_error_printing() {
  static const bool silenced = [] {
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
    return true;
  }();
  (void)silenced;
}

std::string reason() {
  std::string reason;
  H5Ewalk2(
      H5E_DEFAULT, H5E_WALK_UPWARD,
      [](unsigned depth, const H5E_error2_t* error, void* data) -> herr_t {
        auto* text = static_cast<std::string*>(data);
        if (depth == 0 && error->desc != nullptr) *text = error->desc;
        return 0;
      },
      &reason);
  H5Eclear2(H5E_DEFAULT);
  return reason.empty() ? std::string("unknown HDF5 error") : reason;
}

void Writer::fail(const std::string& object) const {
  THPC_FAIL("cannot write " << what_ << ": " << object << " (" << reason() << ")");
}

void Writer::string_attribute(hid_t object, const char* name, const std::string& value) const {
  Handle type(H5Tcopy(H5T_C_S1), H5Tclose);
  check(H5Tset_size(type.get(), value.size() + 1), "string type");
  check(H5Tset_strpad(type.get(), H5T_STR_NULLTERM), "string type");
  Handle space(H5Screate(H5S_SCALAR), H5Sclose);
  Handle attribute(H5Acreate2(object, name, type.get(), space.get(), H5P_DEFAULT, H5P_DEFAULT),
                   H5Aclose);
  if (!attribute.valid()) fail(std::string("attribute ") + name);
  check(H5Awrite(attribute.get(), type.get(), value.c_str()), std::string("attribute ") + name);
}

hid_t Writer::group(hid_t parent, const char* name) const {
  const hid_t id = H5Gcreate2(parent, name, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  if (id < 0) fail(std::string("group ") + name);
  return id;
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

}  // namespace thpc::hdf5
