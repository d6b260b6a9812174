// HDF5, once, for every file format of the project: the corpus shards (data/shard_file),
// the checkpoints (checkpoint/checkpoint) and the attention dumps (decode/attention_dump).
// Each format says what it stores; this says how a file is opened, created, read and
// written through HDF5's C API, and how a failure reads: one line naming the file ("WHAT"
// below: "checkpoint PATH", "shard PATH") and quoting HDF5's most specific message, never
// HDF5's printed error stack.
#pragma once

#include <hdf5.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "common/sha256.h"

namespace thpc::hdf5 {

// HDF5 prints its whole error stack to stderr by default; a user should see one line
// naming the file and the problem instead. Every entry point below calls it.
void silence_error_printing();

// HDF5_USE_FILE_LOCKING=FALSE in this process's environment: HDF5's own lock of a file
// it creates (flock, on a descriptor of its own) collides with the program's lock of the
// same temporary file (OutputClaim, io/atomic_file.h), and the variable, where a site sets
// it to TRUE or BEST_EFFORT, overrides the file-access property that turns it off (every
// write failed with "unable to lock file"). Every file written is claimed by the
// program's own lock, and every file read is whole (written under a temporary name and
// renamed), so HDF5's adds nothing. Called first in every main(), before any thread.
void use_our_locks_not_hdf5s();

// Whether this HDF5 was built thread-safe (Debian's is; Spack's needs +threadsafe): its
// calls may then come from two threads at once, each held while the other's runs.
bool library_is_threadsafe();

// The most specific message of HDF5's current error stack ("truncated file: eof = ..."),
// which it clears.
std::string reason();

// Owns one HDF5 identifier and closes it with the function of its kind.
class Handle {
 public:
  Handle() : id_(-1), close_(nullptr) {}
  Handle(hid_t id, herr_t (*closer)(hid_t)) : id_(id), close_(closer) {}
  ~Handle() {
    if (id_ >= 0) close_(id_);
  }
  Handle(Handle&& other) noexcept : id_(std::exchange(other.id_, -1)), close_(other.close_) {}
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  Handle& operator=(Handle&& other) noexcept {
    if (this != &other) {
      close();
      id_ = std::exchange(other.id_, -1);
      close_ = other.close_;
    }
    return *this;
  }
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

// The element types the formats store, in memory and in the file (little-endian).
template <typename T>
struct Type;
template <>
struct Type<int8_t> {
  static constexpr const char* kName = "int8";
  static hid_t memory() { return H5T_NATIVE_INT8; }
  static hid_t file() { return H5T_STD_I8LE; }
};
template <>
struct Type<uint8_t> {
  static constexpr const char* kName = "uint8";
  static hid_t memory() { return H5T_NATIVE_UINT8; }
  static hid_t file() { return H5T_STD_U8LE; }
};
template <>
struct Type<int32_t> {
  static constexpr const char* kName = "int32";
  static hid_t memory() { return H5T_NATIVE_INT32; }
  static hid_t file() { return H5T_STD_I32LE; }
};
template <>
struct Type<int64_t> {
  static constexpr const char* kName = "int64";
  static hid_t memory() { return H5T_NATIVE_INT64; }
  static hid_t file() { return H5T_STD_I64LE; }
};
template <>
struct Type<float> {
  static constexpr const char* kName = "float32";
  static hid_t memory() { return H5T_NATIVE_FLOAT; }
  static hid_t file() { return H5T_IEEE_F32LE; }
};
template <>
struct Type<double> {
  static constexpr const char* kName = "float64";
  static hid_t memory() { return H5T_NATIVE_DOUBLE; }
  static hid_t file() { return H5T_IEEE_F64LE; }
};

// The sha256 (hex) of `count` values' bytes as they lie in memory (little-endian): the
// checksum both formats record for each dataset, checkable with sha256sum on the bytes
// h5py reads.
template <typename T>
std::string values_sha256(const T* values, size_t count) {
  return sha256_hex(values, count * sizeof(T));
}

// ---- opening ----

// Whether `path` is an HDF5 file (its signature, where HDF5 looks for one). Clears what
// HDF5 said.
bool is_hdf5(const std::string& path);

// `path` opened read-only, or an invalid Handle (reason() says why).
Handle open_read_only(const std::string& path);

// The bytes of a whole file in memory opened read-only through HDF5's core driver, on a
// copy of `image` and without a backing file (nothing is read from or written to the
// file system; `name` is the file's name for HDF5), or an invalid Handle.
Handle open_image(const std::string& name, std::string_view image);

// ---- writing ----

// How a file is created; the defaults are HDF5's.
struct FileOptions {
  // Bytes before HDF5's own, which HDF5 and every HDF5 tool skip (the checkpoint header).
  hsize_t user_block = 0;
  // The 1.8 file format or later: dense attribute storage, which lets an attribute exceed
  // the 64 KiB of a compact one (a shard's SentencePiece model).
  bool format_1_8 = false;
  // Modification times on the file's objects. Without them the same content gives the
  // same bytes (shards).
  bool timestamps = true;
};

// Creates files, groups, attributes and datasets; every failure throws thpc::Error
// "cannot write WHAT: <the object> (<HDF5's reason>)".
class Writer {
 public:
  explicit Writer(std::string what, FileOptions options = {})
      : what_(std::move(what)), options_(options) {}

  [[noreturn]] void fail(const std::string& object) const;
  void check(herr_t status, const std::string& object) const {
    if (status < 0) fail(object);
  }

  // A new file at `path` (replacing one there), created with the options.
  Handle create_file(const std::string& path) const;

  // A new group of `parent`.
  Handle group(hid_t parent, const char* name) const;

  // A scalar fixed-length, NUL-terminated string attribute.
  void string_attribute(hid_t object, const char* name, const std::string& value) const;

  // A scalar 64-bit integer attribute, signed or not as Integer is.
  template <typename Integer>
  void integer_attribute(hid_t object, const char* name, Integer value) const {
    using Stored = std::conditional_t<std::is_signed_v<Integer>, int64_t, uint64_t>;
    const Stored stored = static_cast<Stored>(value);
    attribute(object, name, std::is_signed_v<Integer> ? H5T_NATIVE_INT64 : H5T_NATIVE_UINT64,
              nullptr, &stored);
  }

  // A one-dimensional attribute of `count` values of the memory type `type` (stored as
  // that type; HDF5's null dataspace when `count` is 0).
  void array_attribute(hid_t object, const char* name, hid_t type, hsize_t count,
                       const void* values) const {
    attribute(object, name, type, &count, values);
  }

  // A new contiguous dataset of `parent` of shape `dims` (a scalar when empty) and file
  // type `file_type`, not yet written; `where` names it in messages.
  Handle create_dataset(hid_t parent, const std::string& name, const std::string& where,
                        hid_t file_type, const std::vector<hsize_t>& dims) const;

  // All of a dataset's values at once, or values [start, start + count) of a
  // one-dimensional one (the storage is allocated whole at the first write, so the file's
  // bytes do not depend on how the values were cut into blocks).
  void write(hid_t dataset, const std::string& where, hid_t memory_type,
             const void* values) const;
  void write_block(hid_t dataset, const std::string& where, hid_t memory_type, hsize_t start,
                   hsize_t count, const void* values) const;

  // create_dataset() and write() in one: `values` as a dataset of their type T.
  template <typename T>
  Handle dataset(hid_t parent, const std::string& name, const std::string& where,
                 const std::vector<hsize_t>& dims, const T* values) const {
    Handle created = create_dataset(parent, name, where, Type<T>::file(), dims);
    write(created.get(), where, Type<T>::memory(), values);
    return created;
  }

 private:
  // `count` null: a scalar.
  void attribute(hid_t object, const char* name, hid_t type, const hsize_t* count,
                 const void* values) const;
  // The creation property list of a group or dataset: HDF5's default, or one without
  // timestamps.
  Handle object_creation(hid_t plist_class) const;

  std::string what_;
  FileOptions options_;
};

// ---- reading ----

// Reads one open file; every failure throws thpc::Error "WHAT: <what is wrong>", where
// `where` arguments name an object by its path in the file ("/params/embed.weight").
class Reader {
 public:
  Reader(std::string what, Handle file) : what_(std::move(what)), file_(std::move(file)) {}

  // `path` or an image in memory, read-only; a file HDF5 cannot open (truncated, a
  // damaged superblock) throws "WHAT: cannot be opened, the file is truncated or damaged
  // (HDF5: ...)".
  static Reader open(std::string what, const std::string& path);
  static Reader open_image(std::string what, const std::string& name, std::string_view image);

  [[noreturn]] void fail(const std::string& problem) const;
  // WHAT, as failures begin.
  const std::string& subject() const { return what_; }
  hid_t root() const { return file_.get(); }
  // Closes the file now, which fails on some damage that reading did not reach.
  void close();

  // Whether `parent` has a link `name` (a group or dataset).
  bool exists(hid_t parent, const std::string& name) const;
  bool has_attribute(hid_t object, const char* name) const;
  Handle open_group(hid_t parent, const std::string& name) const;
  // "missing dataset WHERE" when there is none.
  Handle open_dataset(hid_t parent, const std::string& name, const std::string& where) const;
  // The names of a group's members, in HDF5's (alphabetical) order.
  std::vector<std::string> member_names(hid_t group, const std::string& group_path) const;
  // The names of an object's attributes, alphabetically.
  std::vector<std::string> attribute_names(hid_t object, const std::string& object_name) const;

  // Attributes of `object` (named `object_name` in messages: "/", "/src/tokens").
  std::string string_attribute(hid_t object, const std::string& object_name,
                               const char* name) const;  // fixed-length string
  std::string bytes_attribute(hid_t object, const std::string& object_name,
                              const char* name) const;  // uint8 array
  template <typename Integer>
  Integer integer_attribute(hid_t object, const std::string& object_name,
                            const char* name) const {
    Integer value = 0;
    read_integer_attribute(object, object_name, name,
                           std::is_signed_v<Integer> ? H5T_NATIVE_INT64 : H5T_NATIVE_UINT64,
                           &value);
    return value;
  }

  // The extent of a dataset of rank `rank` (refused otherwise).
  std::vector<hsize_t> extent(hid_t dataset, const std::string& where, int rank) const;

  // The values of a dataset of rank `rank` whose stored type is exactly T's (HDF5 would
  // otherwise convert float32 tokens or int32 offsets silently), after checking that the
  // file really holds as many as its header states; its extent in `dims`.
  template <typename T>
  std::vector<T> values(hid_t dataset, const std::string& where, int rank,
                        std::vector<hsize_t>* dims = nullptr) const {
    std::vector<hsize_t> extent_of = checked_extent(dataset, where, rank, Type<T>::kName,
                                                    std::is_floating_point_v<T> ? H5T_FLOAT
                                                                                : H5T_INTEGER,
                                                    std::is_signed_v<T>, sizeof(T));
    hsize_t count = 1;
    for (const hsize_t dim : extent_of) count *= dim;
    std::vector<T> read(static_cast<size_t>(count));
    read_all(dataset, where, Type<T>::memory(), count, read.data());
    if (dims) *dims = std::move(extent_of);
    return read;
  }

  // The extent `values` would read, checked as it checks it (type, layout, the file holding
  // as many values as its header states), without reading them: a size to plan with.
  template <typename T>
  std::vector<hsize_t> stored_extent(hid_t dataset, const std::string& where, int rank) const {
    return checked_extent(dataset, where, rank, Type<T>::kName,
                          std::is_floating_point_v<T> ? H5T_FLOAT : H5T_INTEGER,
                          std::is_signed_v<T>, sizeof(T));
  }

  // Throws "WHAT: bad checksum for dataset WHERE (sha256 ACTUAL, recorded RECORDED): the
  // file is corrupt" unless the two agree.
  void verify_checksum(const std::string& where, const std::string& actual,
                       const std::string& recorded) const;

 private:
  void read_integer_attribute(hid_t object, const std::string& object_name, const char* name,
                              hid_t type, void* value) const;
  Handle open_attribute(hid_t object, const std::string& object_name, const char* name) const;
  std::vector<hsize_t> checked_extent(hid_t dataset, const std::string& where, int rank,
                                      const char* type_name, H5T_class_t type_class,
                                      bool is_signed, size_t size) const;
  void read_all(hid_t dataset, const std::string& where, hid_t memory_type, hsize_t count,
                void* values) const;

  std::string what_;
  Handle file_;
};

}  // namespace thpc::hdf5
