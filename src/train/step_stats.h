// What one training step did: its loss, learning rate, gradient norm and token counts,
// the same on every rank (sums over ranks and micro-batches), and its divergence.
#pragma once

#include <cstdint>

#include "train/divergence.h"

namespace thpc {

struct StepStats {
  int64_t step = 0;
  double loss = 0.0;  // label-smoothed cross-entropy per target token
  double nll = 0.0;   // negative log-likelihood per target token (log of perplexity)
  double lr = 0.0;
  // L2 norm of the step's gradient of the mean loss, summed over ranks and micro-batches,
  // before any clipping (the same on every rank).
  double grad_norm = 0.0;
  int64_t epoch = 1;  // 1-based pass over the training data the step's batches began in
  int64_t src_tokens = 0, tgt_tokens = 0;  // non-pad tokens of the step, all ranks
  int64_t local_tgt_tokens = 0;             // this rank's share
  int micro_batches = 0;                    // per rank
  // The divergence the step was found to be (train/divergence.h); None when it was
  // healthy and applied.
  DivergenceKind divergence = DivergenceKind::None;
};

}  // namespace thpc
