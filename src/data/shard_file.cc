#include "data/shard_file.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <limits>
#include <utility>

#include "common/error.h"
#include "common/input_file.h"
#include "common/sha256.h"
#include "io/hdf5.h"

namespace thpc {
namespace {

using hdf5::Handle;

constexpr const char* kChecksumAttribute = "sha256";
// The root attribute with the sha256 of the stored SentencePiece model (written since
// 2026-12-01; shards without it are read as before): the token datasets had checksums,
// but a flipped byte in a piece of the model passed into every checkpoint and decoding.
constexpr const char* kSpmModelChecksumAttribute = "spm_model_sha256";
constexpr const char* kSourceVocabSizeAttribute = "source_vocab_size";
constexpr const char* kSourceSpmModelAttribute = "source_spm_model";
constexpr const char* kSourceSpmModelChecksumAttribute = "source_spm_model_sha256";
// ShardNumber's root attributes, both or neither.
constexpr const char* kShardIndexAttribute = "shard_index";
constexpr const char* kShardCountAttribute = "shard_count";
constexpr const char* kSplitChecksumAttribute = "split_sha256";

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
  // Dense attribute storage (format 1.8+) lets the SentencePiece model, which exceeds the
  // 64 KiB of a compact attribute, live in an attribute; no timestamps, so that the same
  // content gives the same bytes.
  explicit ShardWriter(const std::string& path) : path_(path), writer_("shard " + path, options()) {}

  void write(const ShardMetadata& meta, const ShardNumber& number, ShardColumnSource& source,
             ShardColumnSource& target) {
    const Handle file = writer_.create_file(path_);
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
    write_bytes(file.get(), "source_lang", meta.source_lang);
    write_bytes(file.get(), "target_lang", meta.target_lang);
    write_bytes(file.get(), "spm_model", meta.spm_model);
    if (checksummed_) {
      write_bytes(file.get(), kSpmModelChecksumAttribute,
                  sha256_hex(meta.spm_model.data(), meta.spm_model.size()));
    }
    if (meta.separate_vocabularies()) {
      THPC_CHECK(meta.format_version >= 3,
                 path_ << ": separate vocabularies in shard format " << meta.format_version);
      write_int(file.get(), kSourceVocabSizeAttribute, meta.source_vocab_size);
      write_bytes(file.get(), kSourceSpmModelAttribute, meta.source_spm_model);
      write_bytes(file.get(), kSourceSpmModelChecksumAttribute,
                  sha256_hex(meta.source_spm_model.data(), meta.source_spm_model.size()));
    }
    if (number.recorded()) {
      THPC_CHECK(number.index >= 0 && number.index < number.count,
                 path_ << ": shard " << number.index << " of " << number.count);
      write_int(file.get(), kShardIndexAttribute, number.index);
      write_int(file.get(), kShardCountAttribute, number.count);
      if (!number.split_sha256.empty()) {
        write_bytes(file.get(), kSplitChecksumAttribute, number.split_sha256);
      }
    }
    writer_.check(H5Fflush(file.get(), H5F_SCOPE_GLOBAL), "flush");
  }

 private:
  // One contiguous dataset of a size known at creation, written in consecutive runs of
  // values, its sha256 taken on the way.
  template <typename T>
  class DatasetWriter {
   public:
    DatasetWriter(ShardWriter& shard, hid_t group, const std::string& where, const char* name,
                  hsize_t size)
        : shard_(shard), where_(where), size_(size),
          // the native type, as shards were always written (little-endian: Type<T>::file())
          dataset_(shard.writer_.create_dataset(group, name, where, hdf5::Type<T>::memory(),
                                                {size})) {}

    void append(const T* values, size_t count) {
      if (count == 0) return;
      THPC_CHECK(written_ + count <= size_, shard_.path_ << ": " << written_ + count
                                                        << " values for dataset " << where_
                                                        << " of " << size_);
      if (written_ == 0 && count == size_) {
        shard_.writer_.write(dataset_.get(), where_, hdf5::Type<T>::memory(), values);
      } else {
        shard_.writer_.write_block(dataset_.get(), where_, hdf5::Type<T>::memory(), written_,
                                   count, values);
      }
      hash_.update(values, count * sizeof(T));
      written_ += count;
    }

    void finish() {
      THPC_CHECK(written_ == size_, shard_.path_ << ": " << written_ << " values for dataset "
                                                 << where_ << " of " << size_);
      if (shard_.checksummed_) {
        shard_.write_bytes(dataset_.get(), kChecksumAttribute, hash_.hex_digest());
      }
    }

   private:
    ShardWriter& shard_;
    std::string where_;
    hsize_t size_, written_ = 0;
    Handle dataset_;
    Sha256 hash_;
  };

  // The tokens, then the offsets (each block's, shifted by the tokens before it): the
  // side is read twice, one block at a time.
  void write_column(hid_t file, const char* group_name, ShardColumnSource& column) {
    const Handle group = writer_.group(file, group_name);
    const std::string where = std::string("/") + group_name;
    {  // each dataset closed before the next is created, as the file's layout has it
      DatasetWriter<int32_t> tokens(*this, group.get(), where + "/tokens", "tokens",
                                    static_cast<hsize_t>(column.tokens()));
      column.rewind();
      for (const TokenColumn* block = &column.next_block(); block->sentences() > 0;
           block = &column.next_block()) {
        tokens.append(block->tokens.data(), block->tokens.size());
      }
      tokens.finish();
    }
    DatasetWriter<int64_t> offsets(*this, group.get(), where + "/offsets", "offsets",
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

  // Numbers are int64 arrays of one value, strings and the model uint8 arrays: exact
  // bytes, no encoding questions.
  void write_int(hid_t object, const char* name, int64_t value) {
    writer_.array_attribute(object, name, H5T_NATIVE_INT64, 1, &value);
  }
  void write_bytes(hid_t object, const char* name, const std::string& value) {
    writer_.array_attribute(object, name, H5T_NATIVE_UINT8, value.size(), value.data());
  }

  static hdf5::FileOptions options() {
    hdf5::FileOptions options;
    options.format_1_8 = true;
    options.timestamps = false;
    return options;
  }

  std::string path_;
  hdf5::Writer writer_;
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
    meta.format_version = read_int32("format_version");
    if (meta.format_version < kOldestShardFormatVersion ||
        meta.format_version > kShardFormatVersion) {
      THPC_FAIL(path_ << ": shard format version " << meta.format_version
                      << ", this program reads versions " << kOldestShardFormatVersion
                      << " to " << kShardFormatVersion << " (re-run transformer_preprocess)");
    }
    checksummed_ = meta.format_version >= 2;
    meta.vocab_size = read_int32("vocab_size");
    meta.ids.pad = read_int32("pad_id");
    meta.ids.unk = read_int32("unk_id");
    meta.ids.bos = read_int32("bos_id");
    meta.ids.eos = read_int32("eos_id");
    meta.source_lang = read_bytes("source_lang");
    meta.target_lang = read_bytes("target_lang");
    meta.spm_model = read_bytes("spm_model");
    if (checksummed_ && file_.has_attribute(file_.root(), kSpmModelChecksumAttribute)) {
      const std::string actual = sha256_hex(meta.spm_model.data(), meta.spm_model.size());
      const std::string recorded = read_bytes(kSpmModelChecksumAttribute);
      if (actual != recorded) {
        THPC_FAIL(path_ << ": bad checksum for the stored SentencePiece model (attribute "
                        << "spm_model: sha256 " << actual << ", recorded " << recorded
                        << "): the file is corrupt (re-run transformer_preprocess)");
      }
    }
    if (meta.format_version >= 3) {
      meta.source_vocab_size = read_int32(kSourceVocabSizeAttribute);
      if (meta.source_vocab_size <= 0) {
        THPC_FAIL(path_ << ": source vocabulary size " << meta.source_vocab_size);
      }
      meta.source_spm_model = read_bytes(kSourceSpmModelAttribute);
      const std::string actual =
          sha256_hex(meta.source_spm_model.data(), meta.source_spm_model.size());
      const std::string recorded = read_bytes(kSourceSpmModelChecksumAttribute);
      if (actual != recorded) {
        THPC_FAIL(path_ << ": bad checksum for the stored source SentencePiece model "
                        << "(attribute source_spm_model: sha256 " << actual << ", recorded "
                        << recorded << "): the file is corrupt (re-run transformer_preprocess)");
      }
    }
    *pairs = read_int("pairs");
    if (meta.vocab_size <= 0) THPC_FAIL(path_ << ": vocabulary size " << meta.vocab_size);
    for (const int id : {meta.ids.pad, meta.ids.unk, meta.ids.bos, meta.ids.eos}) {
      if (id < 0 || id >= std::min(meta.vocab_size, meta.source_ids_limit())) {
        THPC_FAIL(path_ << ": special id " << id << " outside the vocabulary of "
                        << std::min(meta.vocab_size, meta.source_ids_limit()));
      }
    }
    if (*pairs < 0) THPC_FAIL(path_ << ": negative pair count " << *pairs);
    // (trained on without a word before: a helper's shard rewritten with none)
    if (*pairs == 0) {
      THPC_FAIL(path_ << ": holds no pairs, and transformer_preprocess writes none such (each "
                      << "of its shards holds at least one): damaged, or written by another "
                      << "program? (re-run transformer_preprocess)");
    }
    return meta;
  }

  ShardNumber number() const {
    const bool has_index = file_.has_attribute(file_.root(), kShardIndexAttribute);
    const bool has_count = file_.has_attribute(file_.root(), kShardCountAttribute);
    if (has_index != has_count) {
      THPC_FAIL(path_ << ": attribute " << (has_index ? kShardIndexAttribute : kShardCountAttribute)
                      << " without " << (has_index ? kShardCountAttribute : kShardIndexAttribute)
                      << ": the shard is damaged (re-run transformer_preprocess)");
    }
    ShardNumber number;
    if (!has_index) return number;
    number.index = read_int(kShardIndexAttribute);
    number.count = read_int(kShardCountAttribute);
    if (file_.has_attribute(file_.root(), kSplitChecksumAttribute)) {
      number.split_sha256 = read_bytes(kSplitChecksumAttribute);
    }
    if (number.count < 1 || number.index < 0 || number.index >= number.count) {
      THPC_FAIL(path_ << ": shard_index " << number.index << " of shard_count " << number.count
                      << " (an index from 0 to the count - 1): the shard is damaged (re-run "
                      << "transformer_preprocess)");
    }
    return number;
  }

  // The offsets of one side, checked against the pair count and the token count.
  std::vector<int64_t> offsets(const std::string& side, int64_t pairs,
                               int64_t* token_count) const {
    std::vector<int64_t> values = read_dataset<int64_t>(side + "/offsets");
    *token_count = dataset_size(side + "/tokens");
    const std::string name = "/" + side + "/offsets";
    // (pairs is any int64 the file states: pairs + 1 could overflow)
    if (static_cast<int64_t>(values.size()) - 1 != pairs) {
      THPC_FAIL(path_ << ": " << name << " has " << values.size() << " entries for the "
                      << pairs << " pairs its attribute pairs states (expected "
                      << static_cast<uint64_t>(pairs) + 1 << "): the shard is damaged (re-run "
                      << "transformer_preprocess)");
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

  // The sha256 recorded with `side`'s tokens (format 2), or "" (format 1): what the
  // shard's text is, read without reading the text.
  std::string recorded_tokens_checksum(const std::string& side) const {
    if (!checksummed_) return "";
    const std::string where = "/" + side + "/tokens";
    const Handle dataset = file_.open_dataset(file_.root(), side + "/tokens", where);
    if (!file_.has_attribute(dataset.get(), kChecksumAttribute)) return "";
    return file_.bytes_attribute(dataset.get(), where, kChecksumAttribute);
  }

  // A sentence's ids: within the vocabulary, and none of pad, bos or eos, which the
  // batches put around and after the sentences (a shard written with them, fairseq's eos
  // appended or pads inside, was trained on with them twice, or with targets left out of
  // the loss: a helper's finding). unk is a piece the text may have.
  std::vector<int32_t> tokens(const std::string& side, const ShardMetadata& metadata) const {
    std::vector<int32_t> values = read_dataset<int32_t>(side + "/tokens");
    const int vocab_size = side == "src" ? metadata.source_ids_limit() : metadata.vocab_size;
    const SpecialIds& ids = metadata.ids;
    for (size_t i = 0; i < values.size(); ++i) {
      const int32_t id = values[i];
      if (id < 0 || id >= vocab_size) {
        THPC_FAIL(path_ << ": /" << side << "/tokens[" << i << "] = " << id
                        << " is outside the vocabulary [0, " << vocab_size << ")");
      }
      if (id == ids.pad || id == ids.bos || id == ids.eos) {
        THPC_FAIL(path_ << ": /" << side << "/tokens[" << i << "] = " << id << " is the "
                        << (id == ids.pad ? "pad" : id == ids.bos ? "bos" : "eos")
                        << " id, which no sentence holds (the batches add bos and eos "
                        << "around it, and pad after): write the sentences without it "
                        << "(transformer_preprocess does)");
      }
    }
    return values;
  }

 private:
  static hdf5::Reader open_file(const std::string& path) {
    const std::string unreadable = unreadable_file_reason(path);
    if (unreadable == "no such file") THPC_FAIL(path << ": no such shard file");
    if (!unreadable.empty()) THPC_FAIL(path << ": " << unreadable << " (a shard)");
    if (!hdf5::is_hdf5(path)) THPC_FAIL(path << ": not an HDF5 file (or its header is damaged)");
    // A checkpoint is HDF5 too, and read as a shard said "missing attribute vocab_size of /".
    std::string head(64, '\0');
    std::ifstream(path, std::ios::binary)
        .read(head.data(), static_cast<std::streamsize>(head.size()));
    if (begins_as_checkpoint(head)) {
      THPC_FAIL(path << ": is a checkpoint, not a data shard (a shard is one of "
                     << "transformer_preprocess's PREFIX.NNNNN.h5 files): move it out of the "
                     << "data directory");
    }
    return hdf5::Reader::open(path, path);
  }

  static hdf5::Reader open_image(const std::string& name, std::string_view image) {
    if (image.empty()) THPC_FAIL(name << ": not an HDF5 file (or its header is damaged)");
    return hdf5::Reader::open_image(name, name, image);
  }

  // The number of int32 values a dataset holds, checked as reading it checks it: a header
  // stating 10^10 tokens was taken for a shard too large for data.memory_mb ("raise
  // data.memory_mb"), its damage said only once the budget allowed it (a helper's finding).
  int64_t dataset_size(const std::string& name) const {
    const Handle dataset = file_.open_dataset(file_.root(), name, "/" + name);
    return static_cast<int64_t>(file_.stored_extent<int32_t>(dataset.get(), "/" + name, 1)[0]);
  }

  // The values of a dataset of integers of exactly T's width, checked against the sha256
  // recorded with it (format 2): a bit flip that leaves ids in range and offsets monotone
  // passes every other check.
  template <typename T>
  std::vector<T> read_dataset(const std::string& name) const {
    const std::string where = "/" + name;
    const Handle dataset = file_.open_dataset(file_.root(), name, where);
    std::vector<T> values = file_.values<T>(dataset.get(), where, 1);
    if (checksummed_) {
      if (!file_.has_attribute(dataset.get(), kChecksumAttribute)) {
        THPC_FAIL(path_ << ": dataset " << where << " has no " << kChecksumAttribute
                        << " attribute (required by shard formats 2 and later)");
      }
      file_.verify_checksum(where, hdf5::values_sha256(values.data(), values.size()),
                            file_.bytes_attribute(dataset.get(), where, kChecksumAttribute));
    }
    return values;
  }

  int64_t read_int(const char* name) const {
    return file_.integer_attribute<int64_t>(file_.root(), "/", name);
  }
  // An attribute the format keeps as an int, its range checked before it is narrowed
  // (before, 2^32 + 500 was read as a vocabulary of 500, and 2^40 as 0).
  int read_int32(const char* name) const {
    const int64_t value = read_int(name);
    if (value < std::numeric_limits<int32_t>::min() ||
        value > std::numeric_limits<int32_t>::max()) {
      THPC_FAIL(path_ << ": attribute " << name << " = " << value
                      << " is beyond the 32-bit range the format allows: the shard is damaged "
                      << "(re-run transformer_preprocess)");
    }
    return static_cast<int>(value);
  }
  std::string read_bytes(const char* name) const {
    return file_.bytes_attribute(file_.root(), "/", name);
  }

  std::string path_;
  hdf5::Reader file_;
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
  summary.number = reader.number();
  summary.checksummed = reader.checksummed();
  summary.source_lengths =
      lengths_of(reader.offsets("src", summary.pairs, &summary.source_tokens));
  summary.target_lengths =
      lengths_of(reader.offsets("tgt", summary.pairs, &summary.target_tokens));
  summary.source_tokens_sha256 = reader.recorded_tokens_checksum("src");
  summary.target_tokens_sha256 = reader.recorded_tokens_checksum("tgt");
  return summary;
}

ShardContents read_contents(ShardFileReader& reader) {
  ShardContents contents;
  int64_t pairs = 0;
  int64_t token_count = 0;
  contents.metadata = reader.metadata(&pairs);
  contents.number = reader.number();
  contents.source.offsets = reader.offsets("src", pairs, &token_count);
  contents.source.tokens = reader.tokens("src", contents.metadata);
  contents.target.offsets = reader.offsets("tgt", pairs, &token_count);
  contents.target.tokens = reader.tokens("tgt", contents.metadata);
  contents.source_tokens_sha256 = reader.recorded_tokens_checksum("src");
  contents.target_tokens_sha256 = reader.recorded_tokens_checksum("tgt");
  return contents;
}

}  // namespace

std::string shard_file_name(const std::string& split, int64_t index) {
  char number[32];
  std::snprintf(number, sizeof number, ".%05lld.h5", static_cast<long long>(index));
  return split + number;
}

bool is_shard_file_name(const std::string& name, const std::string& split) {
  const size_t digits = split.size() + 1;  // after "SPLIT."
  return name.size() == split.size() + 9 && name.rfind(split + ".", 0) == 0 &&
         name.compare(digits + 5, 3, ".h5") == 0 &&
         std::all_of(name.begin() + digits, name.begin() + digits + 5,
                     [](char c) { return c >= '0' && c <= '9'; });
}

void write_shard(const std::string& path, const ShardContents& contents) {
  WholeColumn source(contents.source), target(contents.target);
  write_shard_streamed(path, contents.metadata, source, target, contents.number);
}

void write_shard_streamed(const std::string& path, const ShardMetadata& metadata,
                          ShardColumnSource& source, ShardColumnSource& target,
                          const ShardNumber& number) {
  THPC_CHECK(source.sentences() == target.sentences(),
             path << ": " << source.sentences() << " sources but " << target.sentences()
                  << " targets");
  ShardWriter(path).write(metadata, number, source, target);
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

bool same_vocabularies(const ShardMetadata& a, const ShardMetadata& b) {
  return a.vocab_size == b.vocab_size && a.ids == b.ids && a.spm_model == b.spm_model &&
         a.source_vocab_size == b.source_vocab_size && a.source_spm_model == b.source_spm_model;
}

}  // namespace thpc
