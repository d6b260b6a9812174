// When the training loop logs, validates, saves and stops (run_schedule.h).
#include "train/run_schedule.h"

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

}  // namespace thpc
