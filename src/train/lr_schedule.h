// The learning-rate schedule of §5.3:
//   lrate = d_model^-0.5 * min(step^-0.5, step * warmup_steps^-1.5)
// linear warm-up for warmup_steps, then decay with the inverse square root of the step.
// `scale` multiplies it (1 = the paper; small models on short runs like a larger one).
#pragma once

#include <cstdint>

namespace thpc {

struct Config;

double learning_rate(int64_t step, int d_model, int warmup_steps, double scale = 1.0);

// The learning rate a run's settings give `step` (1-based): what every program that
// updates the parameters asks (the trainer, which multiplies in its rollbacks' reduction,
// and transformer_bench_step), so that a schedule changed here is changed for all of them
// (a helper's trial: a new schedule wired into the trainer alone left the benchmark on the
// paper's, and nothing said so).
double scheduled_learning_rate(int64_t step, const Config& config);

}  // namespace thpc
