// Layer normalization (Ba et al. 2016), applied after every residual connection (§3.1),
// on the CPU.
#include <cmath>
#include <cstdint>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/parallel.h"

namespace thpc::cpu {

// Per row: mean = (1/d) sum x,  var = (1/d) sum (x - mean)^2 (biased),
//   rstd = 1 / sqrt(var + eps),  y = (x - mean) * rstd * gamma + beta.
// The row statistics are accumulated in double (two passes, so the variance does not
// suffer the cancellation of E[x^2] - E[x]^2) whatever T is. mean and rstd are saved
// for backward; either may be null when no backward follows.
template <typename T>
void layernorm_forward(T* y, T* mean, T* rstd, const T* x, const T* gamma, const T* beta,
                       int rows, int d, float eps) {
#pragma omp parallel for schedule(static) num_threads(threads_for(int64_t(rows) * d))
  for (int row = 0; row < rows; ++row) {
    const T* x_row = x + static_cast<int64_t>(row) * d;
    T* y_row = y + static_cast<int64_t>(row) * d;
    double sum = 0.0;
    for (int col = 0; col < d; ++col) sum += static_cast<double>(x_row[col]);
    const double row_mean = sum / d;
    double squares = 0.0;
    for (int col = 0; col < d; ++col) {
      const double centered = static_cast<double>(x_row[col]) - row_mean;
      squares += centered * centered;
    }
    const double row_rstd = 1.0 / std::sqrt(squares / d + static_cast<double>(eps));
    // Normalise with the saved (T-rounded) statistics so that backward, which only has
    // those, differentiates exactly the function forward computed.
    const T saved_mean = static_cast<T>(row_mean);
    const T saved_rstd = static_cast<T>(row_rstd);
    if (mean != nullptr) mean[row] = saved_mean;
    if (rstd != nullptr) rstd[row] = saved_rstd;
    for (int col = 0; col < d; ++col) {
      const T normalized = (x_row[col] - saved_mean) * saved_rstd;
      y_row[col] = normalized * gamma[col] + beta[col];
    }
  }
}

// With xhat = (x - mean) * rstd and g = dy * gamma (the gradient reaching xhat):
//   dx += rstd * (g - mean(g) - xhat * mean(g * xhat)),
//   dgamma += sum over rows of dy * xhat,  dbeta += sum over rows of dy.
// The two row means are accumulated in double.
template <typename T>
void layernorm_backward(T* dx, T* dgamma, T* dbeta, const T* dy, const T* x, const T* mean,
                        const T* rstd, const T* gamma, int rows, int d) {
  const int threads = threads_for(int64_t(rows) * d);
  // dgamma and dbeta sum over rows: each thread owns a range of columns and adds the
  // rows in order, as one thread would.
  if (dgamma != nullptr || dbeta != nullptr) {
    parallel_ranges(d, threads, [&](int col_begin, int col_end) {
      for (int row = 0; row < rows; ++row) {
        const T* x_row = x + static_cast<int64_t>(row) * d;
        const T* dy_row = dy + static_cast<int64_t>(row) * d;
        const double row_mean = static_cast<double>(mean[row]);
        const double row_rstd = static_cast<double>(rstd[row]);
        for (int col = col_begin; col < col_end; ++col) {
          const double xhat = (static_cast<double>(x_row[col]) - row_mean) * row_rstd;
          if (dgamma != nullptr) dgamma[col] += static_cast<T>(dy_row[col] * xhat);
          if (dbeta != nullptr) dbeta[col] += dy_row[col];
        }
      }
    });
  }
  if (dx == nullptr) return;
#pragma omp parallel for schedule(static) num_threads(threads)
  for (int row = 0; row < rows; ++row) {
    const T* x_row = x + static_cast<int64_t>(row) * d;
    const T* dy_row = dy + static_cast<int64_t>(row) * d;
    const double row_mean = static_cast<double>(mean[row]);
    const double row_rstd = static_cast<double>(rstd[row]);
    double sum_g = 0.0, sum_g_xhat = 0.0;
    for (int col = 0; col < d; ++col) {
      const double xhat = (static_cast<double>(x_row[col]) - row_mean) * row_rstd;
      const double g = static_cast<double>(dy_row[col]) * gamma[col];
      sum_g += g;
      sum_g_xhat += g * xhat;
    }
    const double mean_g = sum_g / d, mean_g_xhat = sum_g_xhat / d;
    T* dx_row = dx + static_cast<int64_t>(row) * d;
    for (int col = 0; col < d; ++col) {
      const double xhat = (static_cast<double>(x_row[col]) - row_mean) * row_rstd;
      const double g = static_cast<double>(dy_row[col]) * gamma[col];
      dx_row[col] += static_cast<T>(row_rstd * (g - mean_g - xhat * mean_g_xhat));
    }
  }
}

THPC_CPU_TWIN(layernorm_forward)
THPC_CPU_TWIN(layernorm_backward)

}  // namespace thpc::cpu
