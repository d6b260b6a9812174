#include "data/shard_file.h"

#include <hdf5.h>

#include <algorithm>
#include <filesystem>
#include <utility>

#include "common/error.h"
#include "common/sha256.h"
#include "data/hdf5_storage.h"

namespace thpc {
namespace {

// HDF5 prints an error stack of its internals on every failed call unless told not to;
// every failure here is reported as one line naming the file instead.
void silence_hdf5_error_stacks() {
  static const bool silenced = [] {
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
    return true;
  }();
  (void)silenced;
}

// An HDF5 identifier closed by its matching H5*close when it goes out of scope.
class Handle {
 public:
  Handle(hid_t id, herr_t (*close)(hid_t)) : id_(id), close_(close) {}
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  Handle(Handle&& other) noexcept : id_(std::exchange(other.id_, -1)), close_(other.close_) {}
  ~Handle() {
    if (id_ >= 0) close_(id_);
  }
  hid_t get() const { return id_; }
  bool valid() const { return id_ >= 0; }

 private:
  hid_t id_;
  herr_t (*close_)(hid_t);
};

constexpr const char* kChecksumAttribute = "sha256";

template <typename T>
std::string sha256_of(const std::vector<T>& values) {
  return sha256_hex(values.data(), values.size() * sizeof(T));
}

// ---- writing ----

// A whole in-memory side as a ShardColumnSource of one block: write_shard's shard is
// write_shard_streamed's, written with one H5Dwrite per dataset and no copy.
class WholeColumn final : public ShardColumnSource {
 public:
  explicit WholeColumn(const TokenColumn& column) : column_(column) {}
  int64_t sentences() const override { return column_.sentences(); }
  int64_t tokens() const override { return static_cast<int64_t>(column_.tokens.size()); }
  void rewind() override { given_ = false; }
  const TokenColumn& next_block() override {
    static const TokenColumn kEnd;
    if (given_) return kEnd;
    given_ = true;
    return column_;
  }

 private:
  const TokenColumn& column_;
  bool given_ = false;
};

class ShardWriter {
 public:
  explicit ShardWriter(const std::string& path) : path_(path) {}

  void write(const ShardMetadata& meta, ShardColumnSource& source, ShardColumnSource& target) {
    // Dense attribute storage (format 1.8+) lets the SentencePiece model, which exceeds
    // the 64 KiB of a compact attribute, live in an attribute.
    const Handle fapl(H5Pcreate(H5P_FILE_ACCESS), H5Pclose);
    check(H5Pset_libver_bounds(fapl.get(), H5F_LIBVER_V18, H5F_LIBVER_LATEST), "set format");
    const Handle fcpl(H5Pcreate(H5P_FILE_CREATE), H5Pclose);
    check(H5Pset_obj_track_times(fcpl.get(), false), "disable timestamps");
    const Handle file(H5Fcreate(path_.c_str(), H5F_ACC_TRUNC, fcpl.get(), fapl.get()),
                      H5Fclose);
    if (!file.valid()) THPC_FAIL(path_ << ": cannot create the HDF5 file");
    checksummed_ = meta.format_version >= 2;
    write_column(file.get(), "src", source);
    write_column(file.get(), "tgt", target);
    write_int(file.get(), "format_version", meta.format_version);
    write_int(file.get(), "vocab_size", meta.vocab_size);
    write_int(file.get(), "pad_id", meta.ids.pad);
    write_int(file.get(), "unk_id", meta.ids.unk);
    write_int(file.get(), "bos_id", meta.ids.bos);
    write_int(file.get(), "eos_id", meta.ids.eos);
    write_int(file.get(), "pairs", source.sentences());
    write_string(file.get(), "source_lang", meta.source_lang);
    write_string(file.get(), "target_lang", meta.target_lang);
    write_bytes(file.get(), "spm_model", meta.spm_model);
    check(H5Fflush(file.get(), H5F_SCOPE_GLOBAL), "flush");
  }

 private:
  void check(herr_t status, const char* what) const {
    if (status < 0) THPC_FAIL(path_ << ": HDF5 failed to " << what);
  }

  static Handle object_create_plist(hid_t plist_class) {
    Handle plist(H5Pcreate(plist_class), H5Pclose);
    H5Pset_obj_track_times(plist.get(), false);
    return plist;
  }

  // One contiguous dataset of a size known at creation, written in consecutive runs of
  // values, its sha256 taken on the way. Its bytes in the file do not depend on how the
  // values were cut into runs: the storage is allocated whole at the first write.
  template <typename T>
  class DatasetWriter {
   public:
    DatasetWriter(ShardWriter& writer, hid_t group, const char* name, hid_t type, hsize_t size)
        : writer_(writer), name_(name), type_(type), size_(size),
          space_(H5Screate_simple(1, &size, nullptr), H5Sclose),
          dataset_(H5Dcreate2(group, name, type, space_.get(), H5P_DEFAULT,
                              object_create_plist(H5P_DATASET_CREATE).get(), H5P_DEFAULT),
                   H5Dclose) {
      if (!dataset_.valid()) THPC_FAIL(writer_.path_ << ": cannot create dataset " << name);
    }

    void append(const T* values, size_t count) {
      if (count == 0) return;
      THPC_CHECK(written_ + count <= size_, writer_.path_ << ": " << written_ + count << " values for dataset "
                                                          << name_ << " of " << size_);
      if (written_ == 0 && count == size_) {
        writer_.check(H5Dwrite(dataset_.get(), type_, H5S_ALL, H5S_ALL, H5P_DEFAULT, values),
                      "write a dataset");
      } else {
        const hsize_t start = written_, length = count;
        const Handle memory(H5Screate_simple(1, &length, nullptr), H5Sclose);
        const Handle file_space(H5Scopy(space_.get()), H5Sclose);
        writer_.check(H5Sselect_hyperslab(file_space.get(), H5S_SELECT_SET, &start, nullptr,
                                          &length, nullptr),
                      "select a block of a dataset");
        writer_.check(H5Dwrite(dataset_.get(), type_, memory.get(), file_space.get(),
                               H5P_DEFAULT, values),
                      "write a block of a dataset");
      }
      hash_.update(values, count * sizeof(T));
      written_ += count;
    }

    void finish() {
      THPC_CHECK(written_ == size_, writer_.path_ << ": " << written_ << " values for dataset "
                                                  << name_ << " of " << size_);
      if (writer_.checksummed_) {
        writer_.write_bytes(dataset_.get(), kChecksumAttribute, hash_.hex_digest());
      }
    }

   private:
    ShardWriter& writer_;
    const char* name_;
    hid_t type_;
    hsize_t size_, written_ = 0;
    Handle space_, dataset_;
    Sha256 hash_;
  };

  // The tokens, then the offsets (each block's, shifted by the tokens before it): the
  // side is read twice, one block at a time.
  void write_column(hid_t file, const char* group_name, ShardColumnSource& column) {
    const Handle gcpl = object_create_plist(H5P_GROUP_CREATE);
    const Handle group(H5Gcreate2(file, group_name, H5P_DEFAULT, gcpl.get(), H5P_DEFAULT),
                       H5Gclose);
    if (!group.valid()) THPC_FAIL(path_ << ": cannot create group " << group_name);
    {  // each dataset closed before the next is created, as the file's layout has it
      DatasetWriter<int32_t> tokens(*this, group.get(), "tokens", H5T_NATIVE_INT32,
                                    static_cast<hsize_t>(column.tokens()));
      column.rewind();
      for (const TokenColumn* block = &column.next_block(); block->sentences() > 0;
           block = &column.next_block()) {
        tokens.append(block->tokens.data(), block->tokens.size());
      }
      tokens.finish();
    }
    DatasetWriter<int64_t> offsets(*this, group.get(), "offsets", H5T_NATIVE_INT64,
                                   static_cast<hsize_t>(column.sentences() + 1));
    column.rewind();
    int64_t base = 0;
    bool first = true;
    std::vector<int64_t> shifted;
    for (const TokenColumn* block = &column.next_block(); block->sentences() > 0;
         block = &column.next_block(), first = false) {
      if (first && block->sentences() == column.sentences()) {
        offsets.append(block->offsets.data(), block->offsets.size());  // the whole side
      } else {
        shifted.assign(first ? 1 : 0, 0);  // the leading 0 with the first block
        for (size_t i = 1; i < block->offsets.size(); ++i) {
          shifted.push_back(base + block->offsets[i]);
        }
        offsets.append(shifted.data(), shifted.size());
      }
      base += block->offsets.back();
    }
    if (column.sentences() == 0) offsets.append(&base, 1);  // [0]
    offsets.finish();
  }

  void write_attribute(hid_t object, const char* name, hid_t type, hsize_t count,
                       const void* data) {
    const Handle space(count == 0 ? H5Screate(H5S_NULL) : H5Screate_simple(1, &count, nullptr),
                       H5Sclose);
    const Handle attribute(H5Acreate2(object, name, type, space.get(), H5P_DEFAULT, H5P_DEFAULT),
                           H5Aclose);
    if (!attribute.valid()) THPC_FAIL(path_ << ": cannot create attribute " << name);
    if (count > 0) check(H5Awrite(attribute.get(), type, data), "write an attribute");
  }

  void write_int(hid_t object, const char* name, int64_t value) {
    write_attribute(object, name, H5T_NATIVE_INT64, 1, &value);
  }
  void write_string(hid_t object, const char* name, const std::string& value) {
    write_bytes(object, name, value);
  }
  // Strings and the model are stored as uint8 arrays: exact bytes, no encoding questions.
  void write_bytes(hid_t object, const char* name, const std::string& value) {
    write_attribute(object, name, H5T_NATIVE_UINT8, value.size(), value.data());
  }

  std::string path_;
  bool checksummed_ = true;
};

// ---- reading ----

class ShardFileReader {
 public:
  explicit ShardFileReader(const std::string& path) : path_(path), file_(open_file(path)) {}
  ShardFileReader(const std::string& name, std::string_view image)
      : path_(name), file_(open_image(name, image)) {}

  ShardMetadata metadata(int64_t* pairs) {
    ShardMetadata meta;
    meta.format_version = static_cast<int>(read_int("format_version"));
    if (meta.format_version < kOldestShardFormatVersion ||
        meta.format_version > kShardFormatVersion) {
      THPC_FAIL(path_ << ": shard format version " << meta.format_version
                      << ", this program reads versions " << kOldestShardFormatVersion
                      << " to " << kShardFormatVersion << " (re-run transformer_preprocess)");
    }
    checksummed_ = meta.format_version >= 2;
    meta.vocab_size = static_cast<int>(read_int("vocab_size"));
    meta.ids.pad = static_cast<int>(read_int("pad_id"));
    meta.ids.unk = static_cast<int>(read_int("unk_id"));
    meta.ids.bos = static_cast<int>(read_int("bos_id"));
    meta.ids.eos = static_cast<int>(read_int("eos_id"));
    meta.source_lang = read_bytes("source_lang");
    meta.target_lang = read_bytes("target_lang");
    meta.spm_model = read_bytes("spm_model");
    *pairs = read_int("pairs");
    if (meta.vocab_size <= 0) THPC_FAIL(path_ << ": vocabulary size " << meta.vocab_size);
    for (const int id : {meta.ids.pad, meta.ids.unk, meta.ids.bos, meta.ids.eos}) {
      if (id < 0 || id >= meta.vocab_size) {
        THPC_FAIL(path_ << ": special id " << id << " outside the vocabulary of "
                        << meta.vocab_size);
      }
    }
    if (*pairs < 0) THPC_FAIL(path_ << ": negative pair count " << *pairs);
    return meta;
  }

  // The offsets of one side, checked against the pair count and the token count.
  std::vector<int64_t> offsets(const std::string& side, int64_t pairs,
                               int64_t* token_count) const {
    std::vector<int64_t> values = read_dataset<int64_t>(side + "/offsets", H5T_NATIVE_INT64);
    verify_checksum(side + "/offsets", values);
    *token_count = dataset_size(side + "/tokens");
    const std::string name = "/" + side + "/offsets";
    // (pairs is any int64 the file states: pairs + 1 could overflow)
    if (static_cast<int64_t>(values.size()) - 1 != pairs) {
      THPC_FAIL(path_ << ": " << name << " has " << values.size() << " entries for " << pairs
                      << " pairs (expected " << static_cast<uint64_t>(pairs) + 1 << ")");
    }
    if (values.front() != 0) THPC_FAIL(path_ << ": " << name << " does not start at 0");
    for (size_t i = 1; i < values.size(); ++i) {
      if (values[i] < values[i - 1]) {
        THPC_FAIL(path_ << ": " << name << " is not monotone at entry " << i << " ("
                        << values[i - 1] << " then " << values[i] << ")");
      }
    }
    if (values.back() != *token_count) {
      THPC_FAIL(path_ << ": " << name << " ends at " << values.back() << " but /" << side
                      << "/tokens holds " << *token_count << " tokens");
    }
    // Preprocessing drops empty pairs; one here was written by something else, and an
    // empty source would leave the encoder nothing but eos to attend to.
    for (size_t i = 1; i < values.size(); ++i) {
      if (values[i] == values[i - 1]) {
        THPC_FAIL(path_ << ": pair " << i - 1 << " has an empty "
                        << (side == "src" ? "source" : "target") << " sentence (" << name << "["
                        << i - 1 << "] = " << name << "[" << i
                        << "]); transformer_preprocess drops empty pairs");
      }
    }
    return values;
  }

  bool checksummed() const { return checksummed_; }

  std::vector<int32_t> tokens(const std::string& side, int vocab_size) const {
    std::vector<int32_t> values = read_dataset<int32_t>(side + "/tokens", H5T_NATIVE_INT32);
    verify_checksum(side + "/tokens", values);
    for (size_t i = 0; i < values.size(); ++i) {
      if (values[i] < 0 || values[i] >= vocab_size) {
        THPC_FAIL(path_ << ": /" << side << "/tokens[" << i << "] = " << values[i]
                        << " is outside the vocabulary [0, " << vocab_size << ")");
      }
    }
    return values;
  }

 private:
  static Handle open_file(const std::string& path) {
    silence_hdf5_error_stacks();
    std::error_code error;
    if (!std::filesystem::is_regular_file(path, error)) THPC_FAIL(path << ": no such shard file");
    if (H5Fis_hdf5(path.c_str()) <= 0) {
      THPC_FAIL(path << ": not an HDF5 file (or its header is damaged)");
    }
    Handle file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
    if (!file.valid()) THPC_FAIL(path << ": cannot open the HDF5 file (truncated or damaged?)");
    return file;
  }

  // HDF5's core driver on a copy of the image, without a backing file: nothing is read
  // from or written to the file system.
  static Handle open_image(const std::string& name, std::string_view image) {
    silence_hdf5_error_stacks();
    if (image.empty()) THPC_FAIL(name << ": not an HDF5 file (or its header is damaged)");
    const Handle fapl(H5Pcreate(H5P_FILE_ACCESS), H5Pclose);
    if (H5Pset_fapl_core(fapl.get(), image.size(), false) < 0 ||
        H5Pset_file_image(fapl.get(), const_cast<char*>(image.data()), image.size()) < 0) {
      THPC_FAIL(name << ": HDF5 cannot take the file image");
    }
    Handle file(H5Fopen(name.c_str(), H5F_ACC_RDONLY, fapl.get()), H5Fclose);
    if (!file.valid()) THPC_FAIL(name << ": cannot open the HDF5 file (truncated or damaged?)");
    return file;
  }

  Handle open_dataset(const std::string& name) const {
    Handle dataset(H5Dopen2(file_.get(), name.c_str(), H5P_DEFAULT), H5Dclose);
    if (!dataset.valid()) THPC_FAIL(path_ << ": missing dataset /" << name);
    return dataset;
  }

  int64_t dataset_size(const std::string& name) const {
    const Handle dataset = open_dataset(name);
    const Handle space(H5Dget_space(dataset.get()), H5Sclose);
    if (H5Sget_simple_extent_ndims(space.get()) != 1) {
      THPC_FAIL(path_ << ": dataset /" << name << " is not one-dimensional");
    }
    hsize_t size = 0;
    H5Sget_simple_extent_dims(space.get(), &size, nullptr);
    return static_cast<int64_t>(size);
  }

  // A bit flip that leaves ids in range and offsets monotone passes every other check.
  template <typename T>
  void verify_checksum(const std::string& name, const std::vector<T>& values) const {
    if (!checksummed_) return;
    const Handle dataset = open_dataset(name);
    if (H5Aexists(dataset.get(), kChecksumAttribute) <= 0) {
      THPC_FAIL(path_ << ": dataset /" << name << " has no " << kChecksumAttribute
                      << " attribute (required by shard format " << kShardFormatVersion << ")");
    }
    const std::string recorded = read_bytes(dataset.get(), kChecksumAttribute);
    const std::string actual = sha256_of(values);
    if (actual != recorded) {
      THPC_FAIL(path_ << ": bad checksum for dataset /" << name << " (sha256 " << actual
                      << ", recorded " << recorded << "): the shard is corrupt");
    }
  }

  // The datasets are integers of exactly the reader's width: HDF5 would otherwise convert
  // float32 tokens or int32 offsets silently on reading.
  template <typename T>
  std::vector<T> read_dataset(const std::string& name, hid_t type) const {
    const int64_t size = dataset_size(name);
    const Handle dataset = open_dataset(name);
    const Handle stored(H5Dget_type(dataset.get()), H5Tclose);
    const H5T_class_t stored_class = H5Tget_class(stored.get());
    if (stored_class != H5T_INTEGER || H5Tget_size(stored.get()) != sizeof(T) ||
        H5Tget_sign(stored.get()) != H5T_SGN_2) {
      THPC_FAIL(path_ << ": dataset /" << name << " is "
                      << (stored_class == H5T_FLOAT     ? "float"
                          : stored_class == H5T_INTEGER ? (H5Tget_sign(stored.get()) == H5T_SGN_2
                                                               ? "int"
                                                               : "uint")
                                                        : "non-numeric")
                      << 8 * H5Tget_size(stored.get()) << ", expected int" << 8 * sizeof(T));
    }
    if (!stores_values(dataset.get(), static_cast<hsize_t>(size), sizeof(T))) {
      THPC_FAIL(path_ << ": dataset /" << name << " states " << size
                      << " values that the file does not hold (truncated or damaged)");
    }
    std::vector<T> values(static_cast<size_t>(size));
    if (size > 0 &&
        H5Dread(dataset.get(), type, H5S_ALL, H5S_ALL, H5P_DEFAULT, values.data()) < 0) {
      THPC_FAIL(path_ << ": cannot read dataset /" << name << " (truncated or damaged file?)");
    }
    return values;
  }

  Handle open_attribute(const char* name, hid_t object = -1) const {
    if (object < 0) object = file_.get();
    if (H5Aexists(object, name) <= 0) THPC_FAIL(path_ << ": missing attribute " << name);
    Handle attribute(H5Aopen(object, name, H5P_DEFAULT), H5Aclose);
    if (!attribute.valid()) THPC_FAIL(path_ << ": cannot open attribute " << name);
    return attribute;
  }

  int64_t read_int(const char* name) const {
    const Handle attribute = open_attribute(name);
    const Handle space(H5Aget_space(attribute.get()), H5Sclose);
    if (H5Sget_simple_extent_npoints(space.get()) != 1) {
      THPC_FAIL(path_ << ": attribute " << name << " is not a single number");
    }
    int64_t value = 0;
    if (H5Aread(attribute.get(), H5T_NATIVE_INT64, &value) < 0) {
      THPC_FAIL(path_ << ": cannot read attribute " << name << " as an integer");
    }
    return value;
  }

  std::string read_bytes(const char* name) const { return read_bytes(file_.get(), name); }
  std::string read_bytes(hid_t object, const char* name) const {
    const Handle attribute = open_attribute(name, object);
    const Handle space(H5Aget_space(attribute.get()), H5Sclose);
    if (H5Sget_simple_extent_type(space.get()) == H5S_NULL) return "";
    const hssize_t count = H5Sget_simple_extent_npoints(space.get());
    std::string value(static_cast<size_t>(std::max<hssize_t>(count, 0)), '\0');
    if (count < 0 || H5Aread(attribute.get(), H5T_NATIVE_UINT8, value.data()) < 0) {
      THPC_FAIL(path_ << ": cannot read attribute " << name << " as bytes");
    }
    return value;
  }

  std::string path_;
  Handle file_;
  bool checksummed_ = true;  // from format_version, read first by metadata()
};

std::vector<int32_t> lengths_of(const std::vector<int64_t>& offsets) {
  std::vector<int32_t> lengths(offsets.size() - 1);
  for (size_t i = 0; i + 1 < offsets.size(); ++i) {
    lengths[i] = static_cast<int32_t>(offsets[i + 1] - offsets[i]);
  }
  return lengths;
}

ShardSummary summarize(ShardFileReader& reader) {
  ShardSummary summary;
  summary.metadata = reader.metadata(&summary.pairs);
  summary.checksummed = reader.checksummed();
  summary.source_lengths =
      lengths_of(reader.offsets("src", summary.pairs, &summary.source_tokens));
  summary.target_lengths =
      lengths_of(reader.offsets("tgt", summary.pairs, &summary.target_tokens));
  return summary;
}

ShardContents read_contents(ShardFileReader& reader) {
  ShardContents contents;
  int64_t pairs = 0;
  int64_t token_count = 0;
  contents.metadata = reader.metadata(&pairs);
  const int vocab = contents.metadata.vocab_size;
  contents.source.offsets = reader.offsets("src", pairs, &token_count);
  contents.source.tokens = reader.tokens("src", vocab);
  contents.target.offsets = reader.offsets("tgt", pairs, &token_count);
  contents.target.tokens = reader.tokens("tgt", vocab);
  return contents;
}

}  // namespace

void write_shard(const std::string& path, const ShardContents& contents) {
  WholeColumn source(contents.source), target(contents.target);
  write_shard_streamed(path, contents.metadata, source, target);
}

void write_shard_streamed(const std::string& path, const ShardMetadata& metadata,
                          ShardColumnSource& source, ShardColumnSource& target) {
  silence_hdf5_error_stacks();
  THPC_CHECK(source.sentences() == target.sentences(),
             path << ": " << source.sentences() << " sources but " << target.sentences()
                  << " targets");
  ShardWriter(path).write(metadata, source, target);
}

ShardSummary read_shard_summary(const std::string& path) {
  ShardFileReader reader(path);
  return summarize(reader);
}

ShardContents read_shard(const std::string& path) {
  ShardFileReader reader(path);
  return read_contents(reader);
}

ShardSummary read_shard_summary_image(const std::string& name, std::string_view image) {
  ShardFileReader reader(name, image);
  return summarize(reader);
}

ShardContents read_shard_image(const std::string& name, std::string_view image) {
  ShardFileReader reader(name, image);
  return read_contents(reader);
}

}  // namespace thpc
