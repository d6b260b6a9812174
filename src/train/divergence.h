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
#include <functional>
#include <iosfwd>
#include <string>

#include "checkpoint/checkpoint.h"
#include "config/config.h"
#include "distributed/communicator.h"
#include "train/checkpoint_keeping.h"
#include "train/run_log.h"

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

  // What a diverged run's last line advises, after its reason (the policy that ran, e.g.
  // rollback without a checkpoint to go back to, is not advice): `resume_point` is
  // CheckpointKeeping::resume_point() ("" when no checkpoint is healthy), `stop_reason`
  // what DivergenceHandling::handle said. A loss spike before any update of a run that
  // started from `initialised_parameters` (no resume, no checkpoint.init) is the
  // initialised model's loss against train.divergence_loss_factor x ln(vocabulary): no
  // learning rate helps there, the factor does. (A trained model's first loss that far
  // above ln(vocabulary) is something else: its data, say.)
  std::string advice(DivergenceKind kind, bool initialised_parameters,
                     const std::string& resume_point, const std::string& checkpoint_dir,
                     const std::string& stop_reason) const;

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

// What a run does about divergence, beside the training loop that calls it: a step every
// rank agreed diverged is left out, rolled back or ends the run (train.divergence), and a
// validation whose perplexity exploded marks the checkpoints after the last passed one.
// Rank 0 marks the files (CheckpointKeeping); every rank decides alike.
class DivergenceHandling {
 public:
  enum class Action { Skipped, RolledBack, Stop };
  // Puts the run back at a checkpoint that every rank has read (the trainer's restore,
  // its best validation values kept).
  using Restore = std::function<void(const Checkpoint& checkpoint, const std::string& path)>;

  // `run_id` is the trainer's, read at each use (a restore may set it).
  DivergenceHandling(const Config& config, const Communicator& comm,
                     DivergenceDetector& detector, CheckpointKeeping& keeping,
                     const std::string& run_id);

  // A run() begins at `step`: the starting point counts as a passed validation.
  void begin(int64_t step);

  // A divergent step (`step`, its `loss`, `grad_norm` and agreed `kind`; `why` in words)
  // after `completed_step`, under train.divergence: left out (up to divergence_limit in a
  // row), rolled back to the newest healthy checkpoint with the learning rate times
  // divergence_lr_factor (up to divergence_limit times), or Stop, with *stop_reason
  // saying why for the run's last line. The metrics file records the divergence.
  Action handle(int64_t step, double loss, double grad_norm, DivergenceKind kind,
                const std::string& why, int64_t completed_step, std::ostream& log,
                MetricsFile& metrics, double wall_s, const Restore& restore,
                std::string* stop_reason);

  // A validation at `step` whose nll's is more than train.divergence_loss_factor times the
  // best's (`best_ppl`, at least 1), or not finite, diverged: the checkpoints of this run
  // written after the newest validation that did not are marked diverged, and so is every
  // one saved until a validation passes again (validation_diverged()), so that the
  // checkpoint named to resume from is not one whose perplexity exploded.
  void judge_validation(double nll, const BestValidation& best_ppl, int64_t step,
                        std::ostream& log);
  bool validation_diverged() const { return validation_diverged_; }
  // The step of the newest validation that passed (0 before any).
  int64_t last_good_validation_step() const { return last_good_validation_step_; }

 private:
  // Continues from the newest healthy checkpoint of checkpoint.dir (rank 0 chooses, every
  // rank reads it); false when there is none.
  bool roll_back(int64_t diverged_step, int64_t completed_step, std::ostream& log,
                 const Restore& restore);

  const Config& config_;
  const Communicator& comm_;
  DivergenceDetector& detector_;
  CheckpointKeeping& keeping_;
  const std::string& run_id_;
  bool validation_diverged_ = false;
  int64_t last_good_validation_step_ = 0;
};

}  // namespace thpc
