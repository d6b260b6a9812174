// What Transformer::train_step's captured passes (train.cuda_kernels step_graphs) make of
// a sequence of pass shapes, without a model or a device: which passes run uncaptured,
// which are captured (and replayed at once) and which replay a graph taken before.
//
// Why: a graph pays only where its shape comes back. The trainer pads each batch to its
// longest sentence, so a corpus's batches have many shapes (batch size, source length,
// target length); transformer_data_stats runs a corpus's batches through this schedule to
// say what share of a rank's passes would replay, before a GPU run measures what a
// replay and a capture cost.
//
// The rules are Transformer::run_capturable's for a backend that accepts every capture:
// a shape's first pass runs uncaptured, its second is captured, the following ones
// replay; at most `capacity` shapes keep their state (Transformer::kMaxCapturedPasses),
// the least recently used dropped (least_recently_used_entry, below, which the
// Transformer's captures keep their entries with too), and a dropped shape starts again
// from its first pass. CaptureSchedule.CountsAreTheTransformers
// (tests/test_captured_passes.cc) holds the two to the same counts through the CPU's
// stand-in for graphs.
#pragma once

#include <algorithm>
#include <cstdint>
#include <set>
#include <tuple>
#include <vector>

namespace thpc {

// The entry of `key` in `entries` (structs with a `key` and a `last_use`), made
// default-constructed if new; each call is a use, counted by `clock`. Beyond `capacity`
// entries the least recently used gives its place up (its graph's memory, for the
// Transformer's captures) and `evicted` counts it.
template <typename Entry, typename Key>
Entry& least_recently_used_entry(std::vector<Entry>& entries, const Key& key, size_t capacity,
                                 uint64_t& clock, int64_t& evicted) {
  ++clock;
  for (Entry& entry : entries) {
    if (entry.key == key) {
      entry.last_use = clock;
      return entry;
    }
  }
  if (entries.size() >= capacity) {
    entries.erase(std::min_element(
        entries.begin(), entries.end(),
        [](const Entry& a, const Entry& b) { return a.last_use < b.last_use; }));
    ++evicted;
  }
  entries.emplace_back();
  entries.back().key = key;
  entries.back().last_use = clock;
  return entries.back();
}

// A training pass as the captures key it: its shape, and whether it starts the sums over
// ranks (the last micro-batch of a step with more than one rank: its GradientListener's
// work is in its capture, so such a pass and one without never share a graph). The rest
// of the Transformer's key (the step's buffers, the dropout's seed) is the same for every
// pass of a run.
struct PassShape {
  int batch_size = 0, src_len = 0, tgt_len = 0;
  bool summed = false;
  bool operator==(const PassShape& other) const {
    return batch_size == other.batch_size && src_len == other.src_len &&
           tgt_len == other.tgt_len && summed == other.summed;
  }
  bool operator<(const PassShape& other) const {
    return std::tie(batch_size, src_len, tgt_len, summed) <
           std::tie(other.batch_size, other.src_len, other.tgt_len, other.summed);
  }
};

class CaptureSchedule {
 public:
  enum class Run { kUncaptured, kCaptured, kReplayed };
  struct Tally {
    int64_t uncaptured = 0, captured = 0, replayed = 0;  // replayed: not counting captured
    int64_t evicted = 0;                                  // shapes dropped for the capacity
    int64_t shapes = 0;                                   // distinct shapes seen
    int64_t passes() const { return uncaptured + captured + replayed; }
  };

  explicit CaptureSchedule(size_t capacity) : capacity_(capacity) {}

  Run next(const PassShape& shape) {
    if (seen_.insert(shape).second) ++tally_.shapes;
    Entry& entry = least_recently_used_entry(entries_, shape, capacity_, clock_, tally_.evicted);
    ++entry.passes;
    if (entry.passes == 1) {
      ++tally_.uncaptured;
      return Run::kUncaptured;
    }
    if (entry.passes == 2) {
      ++tally_.captured;
      return Run::kCaptured;
    }
    ++tally_.replayed;
    return Run::kReplayed;
  }

  const Tally& tally() const { return tally_; }

 private:
  struct Entry {
    PassShape key;
    uint64_t last_use = 0;
    int64_t passes = 0;  // since the shape was (last) taken in
  };
  size_t capacity_;
  uint64_t clock_ = 0;
  std::vector<Entry> entries_;
  std::set<PassShape> seen_;
  Tally tally_;
};

}  // namespace thpc
