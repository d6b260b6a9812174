// The trainer's reader of HDF5 corpus shards (shard_file.h): length-bucketed batches,
// packed to a token budget, shuffled per epoch, each rank getting its share.
//
// The plan of an epoch:
//  * Within each shard, pairs are ordered by the longer side, then source - target
//    length (a snake over the length grid), and cut into batches whose padded size, rows
//    x longest sentence (eos and bos included), stays within the budget on both sides;
//    the cuts make as few batches as greedy packing to the budget would and, among such
//    partitions, the fewest padded tokens (dynamic programming, least_padded_cuts in
//    shard_reader.cc). Batches never span shards, so a shard is all a rank needs in
//    memory to assemble them.
//  * Each epoch visits the shards in an order shuffled from (seed, epoch) and each
//    shard's batches in an order shuffled from (seed, epoch, shard).
//  * The epochs form one stream of batches. Rank r of W takes batches g + r of each group
//    g, g + W, ...: every batch goes to exactly one rank, so every pair is seen exactly
//    once per epoch across the ranks, and the ranks step in lockstep.
//
// Memory: the per-pair lengths and the plan stay resident (12 bytes per pair); token
// arrays stay resident only while the whole corpus fits `memory_budget_bytes`,
// otherwise one shard at a time is loaded as the stream reaches it.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "data/batch_source.h"
#include "data/shard_file.h"

namespace thpc {

// The files PREFIX.00000.h5, PREFIX.00001.h5, ... of `directory`, in order. Throws if
// there are none, or if the numbering has a gap (a shard is missing). With none, the sets
// the directory does hold are named, and how the user named PREFIX (`named_by`:
// "data.valid = nope", "--prefix nope"; "": not said), and of `directory` when it is
// missing (`directory_named_by`: "data.dir = nowhere"; "": the path alone).
std::vector<std::string> find_shards(const std::string& directory, const std::string& prefix,
                                     const std::string& named_by = "",
                                     const std::string& directory_named_by = "");

struct ShardReaderSpec {
  std::vector<std::string> files;  // the shards of one corpus
  uint64_t seed = 1;
  bool shuffle = true;  // false: shards and batches in file order (validation)
  int rank = 0;         // this reader's share: batches rank, rank + ranks, ...
  int ranks = 1;
  int64_t memory_budget_bytes = int64_t{1} << 30;
  // The longest sentence (without bos/eos) the model can take: model.max_positions - 1.
  // Longer pairs are dropped before training and counted (dropped_too_long()), as
  // preprocessing drops pairs over --max-len, rather than stopping the run when a batch
  // reaches them.
  int64_t max_sentence_tokens = std::numeric_limits<int32_t>::max();
  // The settings behind the batches' budget, memory_budget_bytes and
  // max_sentence_tokens, in the words of whoever gave them, for the messages that advise
  // raising one (transformer_data_stats: --tokens-per-step, --memory-mb, --max-positions).
  struct SettingNames {
    std::string budget = "train.tokens_per_step";
    std::string memory = "data.memory_mb";
    std::string positions = "model.max_positions";
  };
  SettingNames setting_names;
  // Called between the summaries' read and the contents' at start-up (tests: a shard
  // replaced there, as another corpus preprocessed into data.dir meanwhile); none: nothing.
  std::function<void()> between_reads;
};

class ShardReader final : public BatchSource {
 public:
  // Opens and validates every shard: format, offsets, ids within the vocabulary, one
  // vocabulary (size, special ids, SentencePiece model) and direction for all of them, and
  // the whole set as preprocessing numbered it (none missing, renamed or of another run).
  explicit ShardReader(const ShardReaderSpec& spec);
  ~ShardReader() override;

  int vocab_size() const override { return metadata_.vocab_size; }
  int source_vocab_size() const override { return metadata_.source_vocab_size; }
  SpecialIds special_ids() const override { return metadata_.ids; }
  const ShardMetadata& metadata() const { return metadata_; }

  // This rank's next batch; an epoch that ends mid-group continues into the next epoch.
  Batch next(int64_t max_tokens) override;
  // This rank's next batch of the current epoch, or nothing once the epoch has none left
  // for it (the ranks may get one batch more or less): one pass, as validation needs.
  std::optional<Batch> next_in_epoch(int64_t max_tokens);

  // The start of the next group of batches (the same on every rank).
  DataPosition position() const override { return position_; }
  void seek(const DataPosition& position) override;

  const std::string* spm_model() const override { return &metadata_.spm_model; }
  const std::string* source_spm_model() const override {
    return metadata_.separate_vocabularies() ? &metadata_.source_spm_model : nullptr;
  }
  std::string direction() const override {
    return metadata_.source_lang + "->" + metadata_.target_lang;
  }
  // The pairs an epoch delivers: those of the shards, less dropped_too_long().
  int64_t pairs() const override { return total_pairs_; }
  // Over the shards in order: each one's sentence lengths and the sha256 recorded with its
  // tokens (verified against them as the shard was read; format 1 has only the lengths).
  std::string corpus_sha256() const override { return corpus_sha256_; }
  int64_t dropped_too_long() const { return dropped_too_long_; }
  int64_t longest_padded_side() const override { return longest_padded_side_; }
  std::string longest_pair_file() const override { return longest_pair_file_; }
  // One line for each thing a user should know before training on this corpus (named
  // `what`: "data.train"): pairs dropped as too long, shards without checksums or numbers.
  void print_notes(std::ostream& log, const std::string& what) const override;
  // "data.train: 4457477 pairs en->de in 64 shards, 639.2 MiB of tokens streamed shard by
  // shard (more than data.memory_mb, 40 MiB)" or "... held in memory": whether the memory setting
  // took effect, which no line said (a helper's scale walk).
  std::string corpus_line(const std::string& what) const override;
  int64_t batches_per_epoch(int64_t max_tokens) override;
  // Shard by shard, in the epoch's shard order: the shard `position` is in and the same
  // share of that shard's batches (the shards' counts change by different ratios).
  int64_t index_at_budget(const DataPosition& position, int64_t from_tokens,
                          int64_t to_tokens) override;
  // Bytes of token arrays held now (for the memory-budget test and the docs).
  int64_t resident_token_bytes() const;

 private:
  struct Shard;
  void plan(int64_t max_tokens);
  Batch assemble(int64_t epoch, int64_t index);
  const ShardContents& load(int shard);
  // shuffled_order with the spec's seed; the identity when the spec says not to shuffle.
  std::vector<int64_t> permutation(int64_t size, uint32_t site, uint32_t stream,
                                   int64_t epoch) const;

  ShardReaderSpec spec_;
  ShardMetadata metadata_;
  std::vector<std::unique_ptr<Shard>> shards_;
  int64_t total_pairs_ = 0;
  std::string corpus_sha256_;
  int64_t dropped_too_long_ = 0;
  int64_t longest_padded_side_ = 0;
  std::string longest_pair_file_;
  std::vector<std::string> unchecksummed_files_;
  bool numbered_ = true;  // the shards record their number and count (ShardNumber)
  bool all_resident_ = false;
  int64_t planned_budget_ = -1;
  int64_t batches_per_epoch_ = 0;
  DataPosition position_;
  // The last epoch's shard order and the last shard's batch order, reused while the
  // stream stays in them.
  int64_t shard_order_epoch_ = -1;
  std::vector<int64_t> shard_order_;
  int64_t batch_order_epoch_ = -1;
  int batch_order_shard_ = -1;
  std::vector<int64_t> batch_order_;
};

// A permutation of [0, size) by Fisher-Yates, its draws Philox's keyed by (seed; site,
// epoch, stream): the reader's order of the shards in an epoch and of a shard's batches.
// Every permutation equally likely (a test counts them: a swap loop stopping one step
// early never swapped the first two, and two shards were read in one order every epoch).
std::vector<int64_t> shuffled_order(int64_t size, uint64_t seed, uint32_t site,
                                    uint32_t stream, int64_t epoch);

}  // namespace thpc
