#include "train/lr_schedule.h"

#include <algorithm>
#include <cmath>

#include "common/error.h"
#include "config/config.h"

namespace thpc {

double learning_rate(int64_t step, int d_model, int warmup_steps, double scale) {
  THPC_CHECK(step >= 1, "learning_rate() takes a 1-based step, got " << step);
  THPC_CHECK(warmup_steps >= 1, "warmup_steps " << warmup_steps);
  const double s = static_cast<double>(step);
  return scale * std::pow(static_cast<double>(d_model), -0.5) *
         std::min(std::pow(s, -0.5), s * std::pow(static_cast<double>(warmup_steps), -1.5));
}

double scheduled_learning_rate(int64_t step, const Config& config) {
  return learning_rate(step, config.model.d_model, config.train.warmup_steps,
                       config.train.lr_scale);
}

}  // namespace thpc
