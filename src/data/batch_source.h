// Where the trainer's batches come from. Two implementations: SyntheticSource
// (synthetic.h, the generated tasks) and ShardReader (shard_reader.h, the HDF5 corpus
// shards that transformer_preprocess writes).
#pragma once

#include <cstdint>
#include <iosfwd>
#include <string>

#include "data/batch.h"

namespace thpc {

// A reader's place in its stream, so that a resumed run continues with the very batch
// the uninterrupted run would have read next.
struct DataPosition {
  int64_t epoch = 0;
  int64_t index = 0;  // the next item of the epoch (its meaning is the source's)
};

class BatchSource {
 public:
  virtual ~BatchSource() = default;
  virtual int vocab_size() const = 0;  // the target's (both sides' when shared)
  // Separate vocabularies: the source's own size, else 0 (the source shares vocab_size).
  virtual int source_vocab_size() const { return 0; }
  virtual SpecialIds special_ids() const = 0;
  // The next micro-batch, packed to at most `max_tokens` padded tokens on each side.
  virtual Batch next(int64_t max_tokens) = 0;
  virtual DataPosition position() const = 0;
  virtual void seek(const DataPosition& position) = 0;

  // What the trainer records and checks about a corpus the batches come from (the
  // shards of transformer_preprocess): its SentencePiece model, serialized, which each
  // checkpoint carries, or null for a generated task, which has no corpus.
  virtual const std::string* spm_model() const { return nullptr; }
  // With separate vocabularies, the source's model (else null: spm_model() serves both).
  virtual const std::string* source_spm_model() const { return nullptr; }
  // The corpus's languages, "en->de" ("" for a generated task): one vocabulary serves both
  // directions, so the vocabulary alone does not tell an en->de corpus from a de->en one.
  virtual std::string direction() const { return ""; }
  // The pairs an epoch delivers (0 for a generated task, which has no end).
  virtual int64_t pairs() const { return 0; }
  // A digest of those pairs, equal on two ranks only if they read the same corpus ("" for
  // a generated task).
  virtual std::string corpus_sha256() const { return ""; }
  // The micro-batches an epoch is cut into at a budget of `max_tokens` (what a
  // position's index counts; 0 for a generated task, whose index is not an epoch's).
  virtual int64_t batches_per_epoch(int64_t max_tokens) { return 0; }
  // The index at which `position`, written by a reader cutting micro-batches of
  // `from_tokens`, continues when they are cut to `to_tokens`: the same share of the
  // same part of the epoch (its index unchanged for a generated task).
  virtual int64_t index_at_budget(const DataPosition& position, int64_t from_tokens,
                                  int64_t to_tokens) {
    return position.index;
  }
  // The most padded tokens one side of one pair takes in a batch (its sentence and eos
  // or bos): a micro-batch budget below it cannot hold that pair. 0 when unknown.
  virtual int64_t longest_padded_side() const { return 0; }
  // The file that holds the pair longest_padded_side() measures ("" for a generated task):
  // a refusal names it, so the user knows which shards to preprocess again.
  virtual std::string longest_pair_file() const { return ""; }
  // One line for each thing a user should know before training on the data (named
  // `what`: "data.train"); nothing by default.
  virtual void print_notes(std::ostream& log, const std::string& what) const {}
  // What the corpus is and how it is read, one line without a newline (named `what`):
  // its pairs, shards and direction, and whether its tokens are held in memory or
  // streamed; "" for a generated task.
  virtual std::string corpus_line(const std::string& what) const { return ""; }
};

}  // namespace thpc
