// When the training loop logs, validates, saves and stops: the one place that decides
// from train.max_steps (or the step train.max_epochs ends at), train.log_every,
// train.valid_every, train.max_minutes,
// checkpoint.every_steps / checkpoint.minutes and checkpoint.patience (the trainer's
// messages still quote them). Trainer::run asks it at each step instead of computing
// modulos and clocks itself (Marian's Scheduler plays this part). It decides from what
// it is told (the step, rank 0's clock, the validations since the best); agreeing the
// decision over the ranks stays with StepDecision.
#pragma once

#include <cstdint>

#include "config/config.h"

namespace thpc {

class RunSchedule {
 public:
  explicit RunSchedule(const Config& config);

  // train.max_steps, or an earlier step end_by_step set.
  int64_t max_steps() const { return max_steps_; }
  // Ends the run at `step` when that is before train.max_steps (train.max_epochs: the
  // step that reads the last epoch's last batch), else at train.max_steps.
  void end_by_step(int64_t step) {
    max_steps_ = step < configured_max_steps_ ? step : configured_max_steps_;
  }
  // Whether the run validates at all (train.valid_every > 0, which requires data.valid).
  bool validates() const { return valid_every_ > 0; }
  bool is_last_step(int64_t step) const { return step == max_steps_; }
  // The "step N/M" progress line (and the buckets' timings with dist.log_buckets): every
  // train.log_every steps and at the last step.
  bool log_due(int64_t step) const;
  // A validation pass: every train.valid_every steps and at the last step, when the run
  // validates at all.
  bool validation_due(int64_t step) const;
  // A checkpoint of `step`: every checkpoint.every_steps steps, or once
  // checkpoint.minutes have passed since the last (either 0: that trigger off). Rank 0
  // asks with its own clock; StepDecision gives every rank its answer, so that all save
  // at the same step without consulting their own clocks.
  bool checkpoint_due(int64_t step, double seconds_since_last_save) const;
  // train.max_minutes of training reached (0: no limit).
  bool out_of_time(double seconds_of_training) const;
  // checkpoint.patience validations without a better checkpoint.keep_best metric
  // (0: never).
  bool patience_exhausted(int64_t validations_since_best) const;

 private:
  int64_t configured_max_steps_;
  int64_t max_steps_;
  int64_t log_every_;
  int64_t valid_every_;  // 0: no validation
  int64_t checkpoint_every_steps_;
  double checkpoint_seconds_;  // 0: none by time
  double limit_seconds_;       // 0: no limit
  int64_t patience_;
};

// Where train.max_epochs = `epochs` ends a run that has completed `completed` steps and
// read `read` micro-batches of the data (epoch x per_epoch + index), each step reading
// `per_step` of them (ranks x train.accumulate) from epochs of `per_epoch` each: the
// micro-batches `left` to read, and the step that reads the last of them (`last_step`,
// `completed` when none is left). A limit whose batches int64 cannot count (10^18 epochs)
// is no limit, not an overflow: INT64_MAX for both.
struct EpochsEnd {
  int64_t left = INT64_MAX;
  int64_t last_step = INT64_MAX;
};
EpochsEnd end_of_epochs(int64_t epochs, int64_t per_epoch, int64_t per_step, int64_t read,
                        int64_t completed);

}  // namespace thpc
