// The learning-rate schedule of §5.3:
//   lrate = d_model^-0.5 * min(step^-0.5, step * warmup_steps^-1.5)
// linear warm-up for warmup_steps, then decay with the inverse square root of the step.
// `scale` multiplies it (1 = the paper; small models on short runs like a larger one).
#pragma once

#include <cstdint>

namespace thpc {

double learning_rate(int64_t step, int d_model, int warmup_steps, double scale = 1.0);

}  // namespace thpc
