// One HDF5 corpus shard: the file format shared by transformer_preprocess (which writes
// it) and the trainer's reader (which validates and reads it).
//
//   /src/tokens   int32 [n_src_tokens]   every source sentence's subword ids, concatenated
//   /src/offsets  int64 [pairs + 1]      sentence i is tokens[offsets[i], offsets[i+1])
//   /tgt/tokens, /tgt/offsets            the same for the targets
//   attributes of /: format_version, vocab_size, pad_id, unk_id, bos_id, eos_id,
//   source_lang, target_lang, pairs, spm_model (the SentencePiece model's bytes);
//   shard_index, shard_count (optional: ShardNumber);
//   format 3, separate vocabularies: source_vocab_size, source_spm_model (the source's
//   own model; vocab_size and spm_model are then the target's)
//   attribute of each of the four datasets (format 2): sha256, the hex digest of its
//   values' bytes (little-endian), as uint8 text like the other string attributes
//
// Sentences carry no bos/eos: make_batch adds them; no sentence is empty (preprocessing
// drops such pairs, the reader refuses them). Files are written without object
// timestamps, so the same content gives the same bytes.
//
// The checksums are sha256 rather than HDF5's Fletcher32 filter: Fletcher32 needs chunked
// datasets (another layout, a chunk size to choose), is weaker, and is checked only
// through HDF5, while a sha256 per dataset is what checkpoints carry (one mechanism to
// trust, checkable with sha256sum on the bytes h5py reads) and keeps the layout of format 1.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "data/batch.h"

namespace thpc {

// Version 2 adds the datasets' sha256; version 1 shards (without) are still read, with
// a warning (ShardSummary::checksummed is false). Version 3 adds a source vocabulary of
// its own, and is written only for one (a corpus of one vocabulary is written as version
// 2, the same bytes as before, readable by earlier builds; one of two vocabularies is
// refused by them, rather than read as one). Other versions are refused.
constexpr int kShardFormatVersion = 3;
constexpr int kOneVocabularyShardFormatVersion = 2;
constexpr int kOldestShardFormatVersion = 1;

// The file name of shard `index` of a split: "train.00003.h5" (SPLIT.NNNNN.h5, as
// transformer_preprocess writes them and the reader looks for them).
std::string shard_file_name(const std::string& split, int64_t index);
// Whether `name` (a file's name, without its directory) is one of `split`'s shards.
bool is_shard_file_name(const std::string& name, const std::string& split);

// Flat token arrays with offsets: the in-memory image of one side of a shard.
struct TokenColumn {
  std::vector<int32_t> tokens;
  std::vector<int64_t> offsets{0};

  int64_t sentences() const { return static_cast<int64_t>(offsets.size()) - 1; }
  int64_t length(int64_t i) const { return offsets[i + 1] - offsets[i]; }
  void append(const std::vector<int>& sentence) {
    tokens.insert(tokens.end(), sentence.begin(), sentence.end());
    offsets.push_back(static_cast<int64_t>(tokens.size()));
  }
  TokenSequence sentence(int64_t i) const {
    return TokenSequence(tokens.begin() + offsets[i], tokens.begin() + offsets[i + 1]);
  }
};

// What every shard of one corpus states about itself; equal across a corpus's shards.
struct ShardMetadata {
  int format_version = kOneVocabularyShardFormatVersion;
  int vocab_size = 0;  // the target's (both sides' when source_vocab_size is 0)
  SpecialIds ids;      // both vocabularies'
  std::string source_lang, target_lang;
  std::string spm_model;  // serialized SentencePiece ModelProto (the target's, or shared)
  // Separate vocabularies (format 3): the source's size and model; 0 and "": the source
  // shares vocab_size and spm_model.
  int source_vocab_size = 0;
  std::string source_spm_model;
  bool separate_vocabularies() const { return source_vocab_size > 0; }
  // The source ids' range.
  int source_ids_limit() const { return separate_vocabularies() ? source_vocab_size : vocab_size; }
};

// Whether two metadata's vocabularies are one: sizes, special ids and models, the
// source's too (the shards of a corpus, a shard read again, validation against training).
bool same_vocabularies(const ShardMetadata& a, const ShardMetadata& b);

// Where a shard stands in its split: shard `index` of `count`. transformer_preprocess
// records it (since 2026-12-02) so that the reader can tell a set copied short: a missing
// last shard left no gap in the numbering, and the run trained on the rest without a word.
// count 0: not recorded (older shards, or a test's write_shard without it).
// With it (since 2026-12-06) the sha256 of the whole split's kept pairs, the same in
// every shard of one preprocessing run: a shard of another run under the same number (a
// corpus preprocessed again with another filter, its shards copied in part) is told apart.
// "" when not recorded.
struct ShardNumber {
  int64_t index = 0;
  int64_t count = 0;
  std::string split_sha256;
  bool recorded() const { return count > 0; }
};

struct ShardContents {
  ShardMetadata metadata;
  ShardNumber number;
  TokenColumn source, target;
  // As read (read_shard): the sha256 recorded with each side's tokens, which the tokens
  // were checked against ("" for format 1). write_shard records its own.
  std::string source_tokens_sha256, target_tokens_sha256;
};

// Writes `contents` to `path` (replacing it), in the layout of its metadata's
// format_version (version 1: without checksums). Throws thpc::Error naming the file.
void write_shard(const std::string& path, const ShardContents& contents);

// One side of a shard handed to the writer a block of whole sentences at a time, for a
// shard too large to hold in memory (transformer_preprocess's: its memory must not grow
// with the corpus). The writer reads the side twice, tokens then offsets.
class ShardColumnSource {
 public:
  virtual ~ShardColumnSource() = default;
  // Known before the first block: the datasets are created at their final size.
  virtual int64_t sentences() const = 0;
  virtual int64_t tokens() const = 0;
  // Back to the first sentence.
  virtual void rewind() = 0;
  // The next sentences (offsets from 0, as a TokenColumn of their own); none after the
  // last. Valid until the next call.
  virtual const TokenColumn& next_block() = 0;
};

// The file write_shard writes for the same metadata and sentences, byte for byte (tested
// in test_preprocess_memory), holding one block of one side at a time.
// `number` is recorded when given (preprocessing gives it).
void write_shard_streamed(const std::string& path, const ShardMetadata& metadata,
                          ShardColumnSource& source, ShardColumnSource& target,
                          const ShardNumber& number = {});

// The metadata and pair count of a shard, with the offsets of both sides checked (monotone,
// starting at 0, ending at the token count, as many as the pairs + 1). Throws thpc::Error
// naming the file and the problem: not HDF5 or truncated, a missing dataset or attribute,
// a format version this program does not read, a dataset of another type than int32
// tokens / int64 offsets, offsets whose sha256 is not the recorded one, bad offsets, an
// empty sentence, a shard number outside its count.
struct ShardSummary {
  ShardMetadata metadata;
  ShardNumber number;
  bool checksummed = true;  // false for format 1 shards: corruption goes undetected
  int64_t pairs = 0;
  int64_t source_tokens = 0, target_tokens = 0;
  std::vector<int32_t> source_lengths, target_lengths;  // per pair
  // The sha256 recorded with each side's tokens ("" for format 1), not checked here:
  // read_shard checks them against the tokens.
  std::string source_tokens_sha256, target_tokens_sha256;
};
ShardSummary read_shard_summary(const std::string& path);

// The whole shard, with every id checked against the vocabulary and every dataset
// against its sha256 (format 2).
ShardContents read_shard(const std::string& path);

// The same two from the bytes of a shard file in memory (HDF5's core driver; `name`
// stands for the file in messages): what the shard reader's fuzzer feeds.
ShardSummary read_shard_summary_image(const std::string& name, std::string_view image);
ShardContents read_shard_image(const std::string& name, std::string_view image);

}  // namespace thpc
