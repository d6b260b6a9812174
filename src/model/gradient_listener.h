// What a training pass tells while its backward runs, to whoever sums the gradients over
// ranks (train/gradient_sums.h): the listener handed to Transformer::train_step for the
// one micro-batch whose backward finishes the step's gradients. The other micro-batches
// run without one.
#pragma once

#include <cstdint>

namespace thpc {

class GradientListener {
 public:
  virtual ~GradientListener() = default;

  // Every gradient at a flat offset >= `offset` is final. The offset falls layer by layer
  // (decoder N-1..0, encoder N-1..0) and ends at 0 once the shared embedding is done: the
  // all-reduce starts its buckets from it.
  virtual void gradients_final_from(int64_t offset) = 0;
  // With the embedding's lookups summed apart (Transformer::sum_lookups_apart): the
  // embedding's gradient holds the output projection's share alone and is final, before
  // the rest of backward has run.
  virtual void output_projection_final() {}
  // The pass's end, inside it (captured with it where it is): the sums queue their finish.
  virtual void pass_end() {}
  // Whether the calls above queue only stream work a CUDA graph can hold (NCCL's
  // launches), so that the pass may be captured with them; a listener that calls host
  // code (MPI) keeps its pass uncaptured.
  virtual bool capturable() const { return false; }
  // The backend refused the capture of the pass after the calls above had begun: what
  // they queued went with the capture and never runs. The pass runs again uncaptured and
  // tells everything anew, from the start (the sums start over: GradientReducer::restart).
  virtual void pass_discarded() {}
};

}  // namespace thpc
