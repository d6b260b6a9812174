// Synthetic transduction tasks generated from a seed: no files, no downloads. They let
// the trainer run anywhere (smoke tests, the learning test, benchmarks with fixed
// shapes) and are a sharp check of the model: reversal, for one, cannot be learned
// without working attention and position encodings.
//
// Pair i of a stream is a pure function of (seed, split, i): symbols are drawn
// uniformly from the non-special ids [4, vocab), lengths uniformly from [min, max].
// Each pair belongs to exactly one split by a hash of its source, so held-out pairs are
// never seen in training.
#pragma once

#include <string>

#include "data/batch_source.h"

namespace thpc {

enum class SyntheticTask { Reverse, Copy, Sort };
enum class SyntheticSplit { Train, HeldOut };

SyntheticTask parse_synthetic_task(const std::string& name);

struct SyntheticSpec {
  SyntheticTask task = SyntheticTask::Reverse;
  int vocab = 32;
  int min_len = 3;
  int max_len = 12;
  uint64_t seed = 1;
  SyntheticSplit split = SyntheticSplit::Train;
  // Rank `shard` of `shards` takes batches shard, shard + shards, ... of the stream, so
  // the ranks together see every pair exactly once.
  int shard = 0;
  int shards = 1;
};

// The target the task asks for, given a source.
TokenSequence synthetic_target(SyntheticTask task, const TokenSequence& source);

class SyntheticSource final : public BatchSource {
 public:
  explicit SyntheticSource(const SyntheticSpec& spec);
  int vocab_size() const override { return spec_.vocab; }
  SpecialIds special_ids() const override { return SpecialIds{}; }
  Batch next(int64_t max_tokens) override;
  DataPosition position() const override { return DataPosition{0, cursor_}; }
  void seek(const DataPosition& position) override { cursor_ = position.index; }
  // For the training split, a line that says the run trains on this task: an empty
  // data.dir (a $DATA that was not set) must not pass for the corpus it was meant to name.
  void print_notes(std::ostream& log, const std::string& what) const override;
  // The longest sentence and its eos or bos (every task keeps the source's length): a
  // micro-batch smaller took one sentence over its budget each, where shards are refused.
  int64_t longest_padded_side() const override { return int64_t{spec_.max_len} + 1; }

  // The next source sentence of this split (advances the cursor).
  TokenSequence next_source();

 private:
  Batch next_of_stream(int64_t max_tokens);
  TokenSequence candidate(int64_t index) const;
  bool in_split(const TokenSequence& source) const;

  SyntheticSpec spec_;
  int64_t cursor_ = 0;  // next candidate index
};

}  // namespace thpc
