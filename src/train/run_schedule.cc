// When the training loop logs, validates, saves and stops (run_schedule.h).
#include "train/run_schedule.h"

#include <algorithm>

namespace thpc {

RunSchedule::RunSchedule(const Config& config)
    : configured_max_steps_(config.train.max_steps),
      max_steps_(config.train.max_steps),
      log_every_(config.train.log_every),
      valid_every_(config.train.valid_every),
      checkpoint_every_steps_(config.checkpoint.every_steps),
      checkpoint_seconds_(60.0 * static_cast<double>(config.checkpoint.minutes)),
      limit_seconds_(60.0 * static_cast<double>(config.train.max_minutes)),
      patience_(config.checkpoint.patience) {}

bool RunSchedule::log_due(int64_t step) const {
  return (log_every_ > 0 && step % log_every_ == 0) || is_last_step(step);
}

bool RunSchedule::validation_due(int64_t step) const {
  return validates() && (step % valid_every_ == 0 || is_last_step(step));
}

bool RunSchedule::checkpoint_due(int64_t step, double seconds_since_last_save) const {
  if (checkpoint_every_steps_ > 0 && step % checkpoint_every_steps_ == 0) return true;
  return checkpoint_seconds_ > 0.0 && seconds_since_last_save >= checkpoint_seconds_;
}

bool RunSchedule::out_of_time(double seconds_of_training) const {
  return limit_seconds_ > 0.0 && seconds_of_training >= limit_seconds_;
}

bool RunSchedule::patience_exhausted(int64_t validations_since_best) const {
  return patience_ > 0 && validations_since_best >= patience_;
}

EpochsEnd end_of_epochs(int64_t epochs, int64_t per_epoch, int64_t per_step, int64_t read,
                        int64_t completed) {
  EpochsEnd end;
  if (per_epoch != 0 && epochs > INT64_MAX / per_epoch) return end;
  end.left = std::max<int64_t>(0, epochs * per_epoch - read);
  const int64_t steps = end.left / per_step + (end.left % per_step != 0 ? 1 : 0);
  if (steps <= INT64_MAX - completed) end.last_step = completed + steps;
  return end;
}

}  // namespace thpc
