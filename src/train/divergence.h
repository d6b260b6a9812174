// Divergence detection (train.divergence*): the judgement of each step's loss and
// gradient norm that tells a run leaving healthy training from one that continues, made
// before the step's update so that a divergent step can be left out.
//
// A step diverges when its loss or its gradient norm is not finite, or when either is a
// spike: the loss above train.divergence_loss_factor times max(1, min(its running
// average, ln(vocabulary))),
// the gradient norm above train.divergence_gnorm_factor times its running average once
// train.divergence_warmup healthy steps have set that average. The loss needs no warm-up:
// before the first step its reference is ln(vocabulary), the label-smoothed
// cross-entropy of the uniform prediction, which is what an initialised model scores;
// the "max(1, ...)" keeps a run whose loss is near zero from calling 0.04 a spike of 0.01.
// The averages are of healthy steps only, over about 50 steps (an exponential average,
// a plain mean over the first 50), and travel in checkpoints (/divergence), so a resumed
// run judges as the uninterrupted one would. Judging never changes a healthy step's
// numbers: it reads the loss and the norm the step computes anyway.
//
// What a divergent step does is train.divergence: stop (the default: no update, no
// checkpoint of the parameters that produced it, exit 4), skip (no update; the next
// batch; at most train.divergence_limit steps in a row) or rollback (continue from the
// newest healthy checkpoint with the learning rate times train.divergence_lr_factor, at
// most train.divergence_limit times a run).
#pragma once

#include <cstdint>
#include <string>

#include "checkpoint/checkpoint.h"
#include "config/config.h"

namespace thpc {

enum class DivergenceKind : int64_t {
  None = 0,
  NonFiniteLoss = 1,
  NonFiniteGradNorm = 2,
  LossSpike = 3,
  GradNormSpike = 4,
};

// What the detector found on one step: the kind, the value and what it was compared
// with (for the message).
struct DivergenceVerdict {
  DivergenceKind kind = DivergenceKind::None;
  double value = 0.0;
  double reference = 0.0;  // the bound the value exceeded (spikes)
  bool diverged() const { return kind != DivergenceKind::None; }
};

class DivergenceDetector {
 public:
  // `vocab_size` gives the loss its reference before the first healthy step.
  DivergenceDetector(const TrainConfig& config, int vocab_size);

  // The verdict on a step's loss and gradient norm (judged against the averages of the
  // healthy steps before it).
  DivergenceVerdict judge(double loss, double grad_norm) const;
  // A step found healthy and applied: its values join the averages, and the run of
  // skipped steps ends.
  void accept(double loss, double grad_norm);

  // "loss nan is not finite", "loss 3.3e+07 is above 4 x max(1, its running average 3.21)".
  std::string describe(const DivergenceVerdict& verdict) const;

  DivergenceState& state() { return state_; }
  const DivergenceState& state() const { return state_; }
  // A checkpoint's state; one written before the state was stored starts afresh.
  void restore(const DivergenceState& state) { state_ = state; }

 private:
  double loss_reference() const;
  TrainConfig config_;
  double uniform_loss_;  // ln(vocabulary)
  DivergenceState state_;
};

// "non-finite loss", "gradient-norm spike", ... (for log lines and the metrics file).
const char* divergence_name(DivergenceKind kind);

}  // namespace thpc
