#include "io/hdf5.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <limits>

#include "common/error.h"

namespace thpc::hdf5 {
namespace {

// HDF5 closes whatever files are still open when the process exits (H5_term_library,
// registered with atexit at its first call). A file whose write failed (a full disk, the
// file-size limit) could not be closed, and closing it again at exit crashed in
// H5F__close_cb (exit 139, after the error had been reported). Every file here is closed
// by its Handle; no file needs the library's exit. Set before the library's first call:
// a static initializer runs before main().
[[maybe_unused]] const bool kNoCloseAtExit = (H5dont_atexit(), true);

// Whether `dataset` really holds `count` values of `value_size` bytes: its layout stores
// exactly that many bytes (the formats' datasets are contiguous, unfiltered; `chunked`,
// unfiltered: at least that many, the last chunks padded), and they fit in the file. False
// for an extent that a damaged header made up (up to 2^64 values), checked before anything
// is allocated for it.
bool stores_values(hid_t dataset, hsize_t count, size_t value_size, bool chunked) {
  if (count > std::numeric_limits<hsize_t>::max() / value_size) return false;
  const hsize_t stored = H5Dget_storage_size(dataset);
  if (chunked ? stored < count * value_size : stored != count * value_size) return false;
  const Handle file(H5Iget_file_id(dataset), H5Fclose);
  if (!file.valid()) return false;
  hsize_t file_size = 0;
  return H5Fget_filesize(file.get(), &file_size) >= 0 && stored <= file_size;
}

// "float32", "uint8", "non-numeric64": a stored type in the words of Type<T>::kName.
std::string type_name(hid_t type) {
  const H5T_class_t type_class = H5Tget_class(type);
  // (text has no width a reader knows: "non-numeric64" was a variable-length string's)
  if (type_class == H5T_STRING) return "text";
  const char* kind = type_class == H5T_FLOAT     ? "float"
                     : type_class == H5T_INTEGER ? (H5Tget_sign(type) == H5T_SGN_2 ? "int" : "uint")
                                                 : "non-numeric";
  return kind + std::to_string(8 * H5Tget_size(type));
}

std::string dims_text(const std::vector<hsize_t>& dims) {
  std::string text;
  for (const hsize_t dim : dims) text += (text.empty() ? "" : "x") + std::to_string(dim);
  return text;
}

}  // namespace

void use_our_locks_not_hdf5s() { ::setenv("HDF5_USE_FILE_LOCKING", "FALSE", 1); }

void silence_error_printing() {
  // Per thread: a thread-safe HDF5 keeps an error stack, and its printing, for each thread
  // (a checkpoint written on a thread of its own, checkpoint.background_write).
  thread_local const bool silenced = [] {
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
    return true;
  }();
  (void)silenced;
}

bool library_is_threadsafe() {
  hbool_t threadsafe = false;
  return H5is_library_threadsafe(&threadsafe) >= 0 && threadsafe;
}

std::string reason() {
  std::string reason;
  H5Ewalk2(
      H5E_DEFAULT, H5E_WALK_UPWARD,
      [](unsigned depth, const H5E_error2_t* error, void* data) -> herr_t {
        auto* text = static_cast<std::string*>(data);
        if (depth == 0 && error->desc != nullptr) *text = error->desc;
        // A failed system call: HDF5's text holds the errno, the message and buffer
        // addresses; the user needs the first two.
        const char* errno_at = error->desc ? std::strstr(error->desc, "errno = ") : nullptr;
        const char* message_at = error->desc ? std::strstr(error->desc, "error message = '") : nullptr;
        if (depth == 0 && errno_at != nullptr && message_at != nullptr) {
          message_at += std::strlen("error message = '");
          const char* message_end = std::strchr(message_at, '\'');
          const std::string call = std::string(error->desc, std::strcspn(error->desc, ":("));
          *text = (call.empty() ? std::string("a system call failed") : call) + ": " +
                  std::string(message_at, message_end ? message_end - message_at : std::strlen(message_at)) +
                  " (errno " + std::to_string(std::atoi(errno_at + std::strlen("errno = "))) + ")";
        }
        return 0;
      },
      &reason);
  H5Eclear2(H5E_DEFAULT);
  return reason.empty() ? std::string("unknown HDF5 error") : reason;
}

// ---- opening ----

bool is_hdf5(const std::string& path) {
  silence_error_printing();
  const bool is = H5Fis_hdf5(path.c_str()) > 0;
  H5Eclear2(H5E_DEFAULT);
  return is;
}

Handle open_read_only(const std::string& path) {
  silence_error_printing();
  return Handle(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
}

Handle open_image(const std::string& name, std::string_view image) {
  silence_error_printing();
  const Handle access(H5Pcreate(H5P_FILE_ACCESS), H5Pclose);
  if (H5Pset_fapl_core(access.get(), image.size(), false) < 0 ||
      H5Pset_file_image(access.get(), const_cast<char*>(image.data()), image.size()) < 0) {
    return Handle();
  }
  return Handle(H5Fopen(name.c_str(), H5F_ACC_RDONLY, access.get()), H5Fclose);
}

// ---- writing ----

void Writer::fail(const std::string& object) const {
  THPC_FAIL("cannot write " << what_ << ": " << object << " (" << reason() << ")");
}

Handle Writer::create_file(const std::string& path) const {
  silence_error_printing();
  // HDF5's default property lists where an option is at its default, as the formats'
  // files were always created.
  Handle creation, access;
  if (options_.user_block > 0 || !options_.timestamps) {
    creation = Handle(H5Pcreate(H5P_FILE_CREATE), H5Pclose);
  }
  if (options_.user_block > 0) {
    check(H5Pset_userblock(creation.get(), options_.user_block), "file header (user block)");
  }
  if (!options_.timestamps) {
    check(H5Pset_obj_track_times(creation.get(), false), "file creation properties");
  }
  access = Handle(H5Pcreate(H5P_FILE_ACCESS), H5Pclose);
  if (options_.format_1_8) {
    check(H5Pset_libver_bounds(access.get(), H5F_LIBVER_V18, H5F_LIBVER_LATEST), "file format");
  }
  // Every file is created under its temporary name, which write_atomically has locked
  // (flock) against other programs for the whole write: HDF5's own flock of it, on a
  // descriptor of its own, would be refused by ours. (HDF5 1.10.7 and 1.12.1 on; before,
  // the environment's HDF5_USE_FILE_LOCKING=FALSE, read at each open, which the programs
  // set first, use_our_locks_not_hdf5s, does the same; and it overrides this property
  // where a site sets it to TRUE.)
#if H5_VERSION_GE(1, 12, 1) || (H5_VERSION_GE(1, 10, 7) && !H5_VERSION_GE(1, 12, 0))
  check(H5Pset_file_locking(access.get(), false, true), "file locking");
#endif
  Handle file(H5Fcreate(path.c_str(), H5F_ACC_TRUNC,
                        creation.valid() ? creation.get() : H5P_DEFAULT,
                        access.get()),
              H5Fclose);
  if (!file.valid()) fail("cannot create " + path);
  return file;
}

Handle Writer::object_creation(hid_t plist_class) const {
  if (options_.timestamps) return Handle();  // H5P_DEFAULT
  Handle plist(H5Pcreate(plist_class), H5Pclose);
  check(H5Pset_obj_track_times(plist.get(), false), "creation properties");
  return plist;
}

Handle Writer::group(hid_t parent, const char* name) const {
  const Handle creation = object_creation(H5P_GROUP_CREATE);
  Handle group(H5Gcreate2(parent, name, H5P_DEFAULT,
                          creation.valid() ? creation.get() : H5P_DEFAULT, H5P_DEFAULT),
               H5Gclose);
  if (!group.valid()) fail(std::string("group ") + name);
  return group;
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

void Writer::attribute(hid_t object, const char* name, hid_t type, const hsize_t* count,
                       const void* values) const {
  Handle space(count == nullptr ? H5Screate(H5S_SCALAR)
               : *count == 0    ? H5Screate(H5S_NULL)
                                : H5Screate_simple(1, count, nullptr),
               H5Sclose);
  Handle attribute(H5Acreate2(object, name, type, space.get(), H5P_DEFAULT, H5P_DEFAULT),
                   H5Aclose);
  if (!attribute.valid()) fail(std::string("attribute ") + name);
  if (count == nullptr || *count > 0) {
    check(H5Awrite(attribute.get(), type, values), std::string("attribute ") + name);
  }
}

Handle Writer::create_dataset(hid_t parent, const std::string& name, const std::string& where,
                              hid_t file_type, const std::vector<hsize_t>& dims) const {
  Handle space(dims.empty() ? H5Screate(H5S_SCALAR)
                            : H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr),
               H5Sclose);
  const Handle creation = object_creation(H5P_DATASET_CREATE);
  Handle dataset(H5Dcreate2(parent, name.c_str(), file_type, space.get(), H5P_DEFAULT,
                            creation.valid() ? creation.get() : H5P_DEFAULT, H5P_DEFAULT),
                 H5Dclose);
  if (!dataset.valid()) fail("dataset " + where);
  return dataset;
}

void Writer::write(hid_t dataset, const std::string& where, hid_t memory_type,
                   const void* values) const {
  check(H5Dwrite(dataset, memory_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, values), "dataset " + where);
}

void Writer::write_block(hid_t dataset, const std::string& where, hid_t memory_type,
                         hsize_t start, hsize_t count, const void* values) const {
  const Handle memory(H5Screate_simple(1, &count, nullptr), H5Sclose);
  const Handle file_space(H5Dget_space(dataset), H5Sclose);
  check(H5Sselect_hyperslab(file_space.get(), H5S_SELECT_SET, &start, nullptr, &count, nullptr),
        "a block of dataset " + where);
  check(H5Dwrite(dataset, memory_type, memory.get(), file_space.get(), H5P_DEFAULT, values),
        "a block of dataset " + where);
}

// ---- reading ----

Reader Reader::open(std::string what, const std::string& path) {
  Handle file = open_read_only(path);
  Reader reader(std::move(what), std::move(file));
  if (!reader.file_.valid()) {
    reader.fail("cannot be opened, the file is truncated or damaged (HDF5: " + reason() + ")");
  }
  return reader;
}

Reader Reader::open_image(std::string what, const std::string& name, std::string_view image) {
  Handle file = hdf5::open_image(name, image);
  Reader reader(std::move(what), std::move(file));
  if (!reader.file_.valid()) {
    reader.fail("cannot be opened, the file is truncated or damaged (HDF5: " + reason() + ")");
  }
  return reader;
}

void Reader::fail(const std::string& problem) const { THPC_FAIL(what_ << ": " << problem); }

void Reader::close() {
  if (file_.close() < 0) fail("cannot be closed (" + reason() + ")");
}

bool Reader::exists(hid_t parent, const std::string& name) const {
  // H5Lexists fails on a path whose intermediate group is missing ("src/tokens" without
  // "src"), so each step of the path is looked up in turn.
  for (size_t end = name.find('/'); ; end = name.find('/', end + 1)) {
    const std::string step = name.substr(0, end);
    const htri_t found = H5Lexists(parent, step.c_str(), H5P_DEFAULT);
    if (found < 0) fail("cannot look up " + step + " (" + reason() + ")");
    if (found == 0) return false;
    if (end == std::string::npos) return true;
  }
}

bool Reader::has_attribute(hid_t object, const char* name) const {
  const htri_t found = H5Aexists(object, name);
  if (found < 0) fail("cannot look up attribute " + std::string(name) + " (" + reason() + ")");
  return found > 0;
}

Handle Reader::open_group(hid_t parent, const std::string& name) const {
  if (!exists(parent, name)) fail("missing group " + name);
  Handle group(H5Gopen2(parent, name.c_str(), H5P_DEFAULT), H5Gclose);
  if (!group.valid()) fail("cannot open group " + name + " (" + reason() + ")");
  return group;
}

Handle Reader::open_dataset(hid_t parent, const std::string& name,
                            const std::string& where) const {
  if (!exists(parent, name)) fail("missing dataset " + where);
  Handle dataset(H5Dopen2(parent, name.c_str(), H5P_DEFAULT), H5Dclose);
  if (!dataset.valid()) fail("cannot open dataset " + where + " (" + reason() + ")");
  return dataset;
}

std::vector<std::string> Reader::member_names(hid_t group, const std::string& group_path) const {
  std::vector<std::string> names;
  const herr_t status = H5Literate(
      group, H5_INDEX_NAME, H5_ITER_INC, nullptr,
      [](hid_t, const char* name, const H5L_info_t*, void* data) -> herr_t {
        static_cast<std::vector<std::string>*>(data)->push_back(name);
        return 0;
      },
      &names);
  if (status < 0) fail("cannot list " + group_path + " (" + reason() + ")");
  return names;
}

std::vector<std::string> Reader::attribute_names(hid_t object,
                                                 const std::string& object_name) const {
  std::vector<std::string> names;
  const herr_t status = H5Aiterate2(
      object, H5_INDEX_NAME, H5_ITER_INC, nullptr,
      [](hid_t, const char* name, const H5A_info_t*, void* data) -> herr_t {
        static_cast<std::vector<std::string>*>(data)->push_back(name);
        return 0;
      },
      &names);
  if (status < 0) fail("cannot list the attributes of " + object_name + " (" + reason() + ")");
  return names;
}

Handle Reader::open_attribute(hid_t object, const std::string& object_name,
                              const char* name) const {
  if (!has_attribute(object, name)) {
    fail("missing attribute " + std::string(name) + " of " + object_name);
  }
  Handle attribute(H5Aopen(object, name, H5P_DEFAULT), H5Aclose);
  if (!attribute.valid()) {
    fail("cannot open attribute " + std::string(name) + " of " + object_name + " (" + reason() +
         ")");
  }
  return attribute;
}

std::string Reader::string_attribute(hid_t object, const std::string& object_name,
                                     const char* name) const {
  const Handle attribute = open_attribute(object, object_name, name);
  const Handle type(H5Aget_type(attribute.get()), H5Tclose);
  if (H5Tget_class(type.get()) != H5T_STRING || H5Tis_variable_str(type.get()) != 0) {
    fail("attribute " + std::string(name) + " of " + object_name + " is not a fixed-length string");
  }
  std::string value(H5Tget_size(type.get()), '\0');
  if (H5Aread(attribute.get(), type.get(), value.data()) < 0) {
    fail("cannot read attribute " + std::string(name) + " of " + object_name + " (" + reason() +
         ")");
  }
  value.resize(std::strlen(value.c_str()));
  return value;
}

std::string Reader::bytes_attribute(hid_t object, const std::string& object_name,
                                    const char* name) const {
  const Handle attribute = open_attribute(object, object_name, name);
  const Handle space(H5Aget_space(attribute.get()), H5Sclose);
  if (H5Sget_simple_extent_type(space.get()) == H5S_NULL) return "";
  const hssize_t count = H5Sget_simple_extent_npoints(space.get());
  std::string value(static_cast<size_t>(std::max<hssize_t>(count, 0)), '\0');
  if (count < 0 || H5Aread(attribute.get(), H5T_NATIVE_UINT8, value.data()) < 0) {
    fail("cannot read attribute " + std::string(name) + " of " + object_name + " as bytes (" +
         reason() + ")");
  }
  return value;
}

void Reader::read_integer_attribute(hid_t object, const std::string& object_name,
                                    const char* name, hid_t type, void* value) const {
  const Handle attribute = open_attribute(object, object_name, name);
  const Handle space(H5Aget_space(attribute.get()), H5Sclose);
  if (H5Sget_simple_extent_npoints(space.get()) != 1) {
    fail("attribute " + std::string(name) + " of " + object_name + " is not a single number");
  }
  // A float stored where a whole number belongs (vocab_size = 500.7, written by hand) was
  // converted by HDF5, truncated, without a word (a helper's finding).
  const Handle stored(H5Aget_type(attribute.get()), H5Tclose);
  if (H5Tget_class(stored.get()) != H5T_INTEGER) {
    fail("attribute " + std::string(name) + " of " + object_name + " is " +
         type_name(stored.get()) + ", not a whole number");
  }
  if (H5Aread(attribute.get(), type, value) < 0) {
    fail("cannot read attribute " + std::string(name) + " of " + object_name +
         " as an integer (" + reason() + ")");
  }
}

std::vector<hsize_t> Reader::extent(hid_t dataset, const std::string& where, int rank) const {
  const Handle space(H5Dget_space(dataset), H5Sclose);
  std::vector<hsize_t> dims(static_cast<size_t>(rank), 0);
  if (H5Sget_simple_extent_ndims(space.get()) != rank ||
      H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr) != rank) {
    fail("dataset " + where + " is not " + (rank == 1 ? "one" : rank == 2 ? "two" : "N") +
         "-dimensional");
  }
  return dims;
}

std::vector<hsize_t> Reader::checked_extent(hid_t dataset, const std::string& where, int rank,
                                            const char* type_name_wanted, H5T_class_t type_class,
                                            bool is_signed, size_t size) const {
  const Handle stored(H5Dget_type(dataset), H5Tclose);
  if (H5Tget_class(stored.get()) != type_class || H5Tget_size(stored.get()) != size ||
      (type_class == H5T_INTEGER &&
       (H5Tget_sign(stored.get()) == H5T_SGN_2) != is_signed)) {
    fail("dataset " + where + " is " + type_name(stored.get()) + ", expected " +
         type_name_wanted);
  }
  const std::vector<hsize_t> dims = extent(dataset, where, rank);
  hsize_t count = 1;
  for (const hsize_t dim : dims) {
    if (dim != 0 && count > std::numeric_limits<hsize_t>::max() / dim) {
      fail("dataset " + where + " has an impossible shape");
    }
    count *= dim;
  }
  // A compressed dataset (h5py's compression=) is said as such, not as the damage its
  // storage size reads as (a helper's finding: "values that the file does not hold
  // (truncated or damaged)"); its stored size cannot bound what a damaged header states.
  // Chunked and compact ones, unfiltered, are read as HDF5 reads them.
  const Handle layout(H5Dget_create_plist(dataset), H5Pclose);
  const bool chunked = layout.valid() && H5Pget_layout(layout.get()) == H5D_CHUNKED;
  if (layout.valid() && H5Pget_nfilters(layout.get()) > 0) {
    fail("dataset " + where + " is stored compressed (filtered), and this program reads "
         "uncompressed datasets only (as its own programs write them): write it without "
         "compression (h5py: create_dataset without compression=), or make the file again "
         "with the program that writes it");
  }
  if (!stores_values(dataset, count, size, chunked)) {
    fail("dataset " + where + " states " + dims_text(dims) +
         " values that the file does not hold (truncated or damaged)");
  }
  return dims;
}

void Reader::read_all(hid_t dataset, const std::string& where, hid_t memory_type, hsize_t count,
                      void* values) const {
  if (count > 0 && H5Dread(dataset, memory_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, values) < 0) {
    fail("cannot read dataset " + where + " (" + reason() + ")");
  }
}

void Reader::verify_checksum(const std::string& where, const std::string& actual,
                             const std::string& recorded) const {
  if (actual != recorded) {
    fail("bad checksum for dataset " + where + " (sha256 " + actual + ", recorded " + recorded +
         "): the file is corrupt");
  }
}

}  // namespace thpc::hdf5
