// HDF5 plumbing shared by the files the programs write: checkpoints (checkpoint.cc) and
// the attention dumps of transformer_decode (decode/attention_dump.cc). Errors are one
// line naming the file and quoting HDF5's most specific message, never HDF5's printed
// stack; files appear whole or not at all.
#pragma once

#include <hdf5.h>

#include <cstdint>
#include <functional>
#include <string>
#include <type_traits>
#include <utility>

namespace thpc::hdf5 {

// HDF5 prints its whole error stack to stderr by default; a user should see one line
// naming the file and the problem instead. Call before the first HDF5 call.
void silence_error_printing();

// The most specific message of HDF5's current error stack ("truncated file: eof = ..."),
// which it clears.
std::string reason();

// Owns one HDF5 identifier and closes it with the function of its kind.
class Handle {
 public:
  Handle(hid_t id, herr_t (*closer)(hid_t)) : id_(id), close_(closer) {}
  ~Handle() {
    if (id_ >= 0) close_(id_);
  }
  Handle(Handle&& other) noexcept : id_(std::exchange(other.id_, -1)), close_(other.close_) {}
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  Handle& operator=(Handle&&) = delete;
  hid_t get() const { return id_; }
  bool valid() const { return id_ >= 0; }
  // Closes now, reporting failure (a file's close is where its last bytes are written).
  herr_t close() {
    const herr_t status = id_ >= 0 ? close_(id_) : 0;
    id_ = -1;
    return status;
  }

 private:
  hid_t id_;
  herr_t (*close_)(hid_t);
};

// Writes attributes and groups; every failure throws thpc::Error "cannot write WHAT:
// <the object> (<HDF5's reason>)", WHAT naming the file ("checkpoint PATH").
class Writer {
 public:
  explicit Writer(std::string what) : what_(std::move(what)) {}

  [[noreturn]] void fail(const std::string& object) const;
  void check(herr_t status, const std::string& object) const {
    if (status < 0) fail(object);
  }

  // A scalar fixed-length, NUL-terminated string attribute.
  void string_attribute(hid_t object, const char* name, const std::string& value) const;

  // A scalar 64-bit integer attribute, signed or not as Integer is.
  template <typename Integer>
  void integer_attribute(hid_t object, const char* name, Integer value) const {
    const hid_t type = std::is_signed_v<Integer> ? H5T_NATIVE_INT64 : H5T_NATIVE_UINT64;
    using Stored = std::conditional_t<std::is_signed_v<Integer>, int64_t, uint64_t>;
    const Stored stored = static_cast<Stored>(value);
    Handle space(H5Screate(H5S_SCALAR), H5Sclose);
    Handle attribute(H5Acreate2(object, name, type, space.get(), H5P_DEFAULT, H5P_DEFAULT),
                     H5Aclose);
    if (!attribute.valid()) fail(std::string("attribute ") + name);
    check(H5Awrite(attribute.get(), type, &stored), std::string("attribute ") + name);
  }

  // A new group; the caller closes it (H5Gclose, e.g. through a Handle).
  hid_t group(hid_t parent, const char* name) const;

 private:
  std::string what_;
};

// Writes `path` all at once or not at all: `write` creates the whole file at the
// temporary path it is given (.NAME.tmp in the same directory, which is created if
// missing), which is then fsync'ed and renamed over `path`, and the directory fsync'ed so
// that the rename is durable. When anything fails the temporary file is removed and
// thpc::Error says "cannot write WHAT: ..." (WHAT names the file, e.g. "checkpoint PATH").
void write_atomically(const std::string& path, const std::string& what,
                      const std::function<void(const std::string& temporary)>& write);

// The temporary name write_atomically writes `path` under first: .NAME.tmp beside it.
std::string temporary_path(const std::string& path);

// fsync of the file or directory `path`; thpc::Error "cannot write WHAT: ..." when it fails.
void fsync_path(const std::string& path, const std::string& what);

}  // namespace thpc::hdf5
