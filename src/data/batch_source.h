// Where the trainer's batches come from. Two implementations: SyntheticSource
// (synthetic.h, the generated tasks) and ShardReader (shard_reader.h, the HDF5 corpus
// shards that transformer_preprocess writes).
#pragma once

#include <cstdint>

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
  virtual int vocab_size() const = 0;
  virtual SpecialIds special_ids() const = 0;
  // The next micro-batch, packed to at most `max_tokens` padded tokens on each side.
  virtual Batch next(int64_t max_tokens) = 0;
  virtual DataPosition position() const = 0;
  virtual void seek(const DataPosition& position) = 0;
};

}  // namespace thpc
