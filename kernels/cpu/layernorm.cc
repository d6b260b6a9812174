// Layer normalization (Ba et al. 2016), applied after every residual connection (§3.1),
// on the CPU; and the residual connection, its dropout and the layer norm fused
// (LayerNorm(x + Dropout(sub)), §3.1 and §5.4) into one pass over the rows.
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "common/error.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/dropout_mask.h"
#include "kernels/cpu/parallel.h"

namespace thpc::cpu {

namespace {

// Per row: mean = (1/d) sum x,  var = (1/d) sum (x - mean)^2 (biased),
//   rstd = 1 / sqrt(var + eps),  y = (x - mean) * rstd * gamma + beta.
// The row statistics are accumulated in double (two passes, so the variance does not
// suffer the cancellation of E[x^2] - E[x]^2) whatever T is. mean and rstd are saved
// for backward; either may be null when no backward follows.
//
// kRows consecutive rows (stride d) at a time: each row's sums run over its columns in
// order, as for one row alone, but the kRows chains are interleaved. A double sum is a
// chain of dependent additions (each waits for the last), so one row at a time ran at
// the adder's latency; independent chains fill its pipeline, with the same bits per row
// (LayerNorm.RowsNormalisedTogetherHaveTheBitsOfOneRowAlone). A decoding step normalises
// a few hundred rows of d_model 18 times: this was 2% of a one-thread base-model beam
// search, 0.9% after.
template <int kRows, typename T>
void normalize_rows(T* y, T* mean, T* rstd, const T* x, const T* gamma, const T* beta, int d,
                    float eps) {
  double sum[kRows], row_mean[kRows], squares[kRows];
  for (int r = 0; r < kRows; ++r) sum[r] = squares[r] = 0.0;
  for (int col = 0; col < d; ++col) {
    for (int r = 0; r < kRows; ++r) sum[r] += static_cast<double>(x[int64_t(r) * d + col]);
  }
  for (int r = 0; r < kRows; ++r) row_mean[r] = sum[r] / d;
  for (int col = 0; col < d; ++col) {
    for (int r = 0; r < kRows; ++r) {
      const double centered = static_cast<double>(x[int64_t(r) * d + col]) - row_mean[r];
      squares[r] += centered * centered;
    }
  }
  for (int r = 0; r < kRows; ++r) {
    const double row_rstd = 1.0 / std::sqrt(squares[r] / d + static_cast<double>(eps));
    // Normalise with the saved (T-rounded) statistics so that backward, which only has
    // those, differentiates exactly the function forward computed.
    const T saved_mean = static_cast<T>(row_mean[r]);
    const T saved_rstd = static_cast<T>(row_rstd);
    if (mean != nullptr) mean[r] = saved_mean;
    if (rstd != nullptr) rstd[r] = saved_rstd;
    const T* x_row = x + int64_t(r) * d;
    T* y_row = y + int64_t(r) * d;
    for (int col = 0; col < d; ++col) {
      const T normalized = (x_row[col] - saved_mean) * saved_rstd;
      y_row[col] = normalized * gamma[col] + beta[col];
    }
  }
}

// Rows in groups of kNormGroup, then the last rows one by one: calls
// rows_body(first_row, count) for each, spread over the threads (work items are
// independent, so the bits do not depend on the thread count).
constexpr int kNormGroup = 4;
template <typename Body>
void for_row_groups(int rows, int d, Body&& rows_body) {
  const int groups = rows / kNormGroup, rest = rows % kNormGroup;
#pragma omp parallel for schedule(static) num_threads(threads_for(int64_t(rows) * d))
  for (int item = 0; item < groups + rest; ++item) {
    if (item < groups) {
      rows_body(item * kNormGroup, std::integral_constant<int, kNormGroup>{});
    } else {
      rows_body(groups * kNormGroup + item - groups, std::integral_constant<int, 1>{});
    }
  }
}

// dgamma += sum over rows of dy * xhat,  dbeta += sum over rows of dy: each thread owns
// a range of columns and adds the rows in order, as one thread would.
template <typename T>
void add_norm_parameter_gradients(T* dgamma, T* dbeta, const T* dy, const T* x, const T* mean,
                                  const T* rstd, int rows, int d, int threads) {
  if (dgamma == nullptr && dbeta == nullptr) return;
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

// The gradient of one row's layer norm with respect to its input, passed to
// visit(col, g) column by column: with xhat = (x - mean) * rstd and g = dy * gamma,
//   rstd * (g - mean(g) - xhat * mean(g * xhat)),
// the two row means accumulated in double, the result rounded to T.
template <typename T, typename Visit>
void normalized_row_gradient(const T* dy_row, const T* x_row, T mean, T rstd, const T* gamma,
                             int d, Visit&& visit) {
  const double row_mean = static_cast<double>(mean);
  const double row_rstd = static_cast<double>(rstd);
  double sum_g = 0.0, sum_g_xhat = 0.0;
  for (int col = 0; col < d; ++col) {
    const double xhat = (static_cast<double>(x_row[col]) - row_mean) * row_rstd;
    const double g = static_cast<double>(dy_row[col]) * gamma[col];
    sum_g += g;
    sum_g_xhat += g * xhat;
  }
  const double mean_g = sum_g / d, mean_g_xhat = sum_g_xhat / d;
  for (int col = 0; col < d; ++col) {
    const double xhat = (static_cast<double>(x_row[col]) - row_mean) * row_rstd;
    const double g = static_cast<double>(dy_row[col]) * gamma[col];
    visit(col, static_cast<T>(row_rstd * (g - mean_g - xhat * mean_g_xhat)));
  }
}

// normalized_row_gradient of kRows consecutive rows (stride d) at once, the gradients into
// g_rows [kRows, d]: each row's two sums run over its columns in order, as for one row
// alone, with the rows' chains interleaved (as normalize_rows does: one chain of dependent
// double additions runs at the adder's latency), and the per-element pass, free of the
// caller's stores and draws, is one the compiler vectorises. The same bits as
// normalized_row_gradient row by row (AddNorm.FusedBackwardIsTheUnfusedOpsBitForBit).
template <int kRows, typename T>
void normalized_rows_gradient(T* g_rows, const T* dy, const T* x, const T* mean,
                              const T* rstd, const T* gamma, int d) {
  double row_mean[kRows], row_rstd[kRows], sum_g[kRows], sum_g_xhat[kRows];
  for (int r = 0; r < kRows; ++r) {
    row_mean[r] = static_cast<double>(mean[r]);
    row_rstd[r] = static_cast<double>(rstd[r]);
    sum_g[r] = sum_g_xhat[r] = 0.0;
  }
  for (int col = 0; col < d; ++col) {
    for (int r = 0; r < kRows; ++r) {
      const int64_t i = int64_t(r) * d + col;
      const double xhat = (static_cast<double>(x[i]) - row_mean[r]) * row_rstd[r];
      const double g = static_cast<double>(dy[i]) * gamma[col];
      sum_g[r] += g;
      sum_g_xhat[r] += g * xhat;
    }
  }
  for (int r = 0; r < kRows; ++r) {
    const double mean_g = sum_g[r] / d, mean_g_xhat = sum_g_xhat[r] / d;
    const int64_t offset = int64_t(r) * d;
    for (int col = 0; col < d; ++col) {
      const double xhat = (static_cast<double>(x[offset + col]) - row_mean[r]) * row_rstd[r];
      const double g = static_cast<double>(dy[offset + col]) * gamma[col];
      g_rows[offset + col] = static_cast<T>(row_rstd[r] * (g - mean_g - xhat * mean_g_xhat));
    }
  }
}

}  // namespace

// Each row normalised independently (normalize_rows, a few rows at a time).
template <typename T>
void layernorm_forward(T* y, T* mean, T* rstd, const T* x, const T* gamma, const T* beta,
                       int rows, int d, float eps) {
  for_row_groups(rows, d, [&](int first, auto count) {
    const int64_t offset = static_cast<int64_t>(first) * d;
    normalize_rows<decltype(count)::value>(y + offset, mean != nullptr ? mean + first : nullptr,
                                           rstd != nullptr ? rstd + first : nullptr, x + offset,
                                           gamma, beta, d, eps);
  });
}

// dx += rstd * (g - mean(g) - xhat * mean(g * xhat)) (normalized_row_gradient; kWrite:
// dx = 0 + that); dgamma, dbeta += their column sums (add_norm_parameter_gradients).
template <typename T>
void layernorm_backward(T* dx, T* dgamma, T* dbeta, const T* dy, const T* x, const T* mean,
                        const T* rstd, const T* gamma, int rows, int d, GradStore store) {
  const int threads = threads_for(int64_t(rows) * d);
  add_norm_parameter_gradients(dgamma, dbeta, dy, x, mean, rstd, rows, d, threads);
  if (dx == nullptr) return;
  const bool write = store == GradStore::kWrite;
#pragma omp parallel for schedule(static) num_threads(threads)
  for (int row = 0; row < rows; ++row) {
    const int64_t offset = static_cast<int64_t>(row) * d;
    T* dx_row = dx + offset;
    normalized_row_gradient(dy + offset, x + offset, mean[row], rstd[row], gamma, d,
                            [&](int col, T g) {
                              dx_row[col] = (write ? T(0) : dx_row[col]) + g;
                            });
  }
}

// LayerNorm(x + Dropout(sub)) a few rows at a time: each row's residual (the expression of
// residual_dropout_forward, the same Philox draws of the same elements) is written and
// normalised while it is in cache, instead of one pass over [rows, d] for the residual
// and three more for the norm. The same bits as the two ops one after the other.
template <typename T>
void add_dropout_layernorm_forward(T* y, T* residual, T* mean, T* rstd, const T* x,
                                   const T* sub, const T* gamma, const T* beta, int rows, int d,
                                   float eps, float p, DropoutKey key) {
  check_probability(p);
  THPC_CHECK(residual != nullptr, "add_dropout_layernorm_forward needs its residual output");
  const T scale = keep_scale<T>(p);
  for_row_groups(rows, d, [&](int first, auto count) {
    const int64_t first_offset = static_cast<int64_t>(first) * d;
    thread_local std::vector<uint8_t> keep;  // a row's mask (see the backward)
    keep.resize(static_cast<size_t>(d));
    for (int row = first; row < first + decltype(count)::value; ++row) {
      const int64_t offset = static_cast<int64_t>(row) * d;
      const T* x_row = x + offset;
      const T* sub_row = sub + offset;
      T* r_row = residual + offset;
      if (p == 0.0f) {
        for (int col = 0; col < d; ++col) r_row[col] = x_row[col] + sub_row[col];
      } else {
        // keep ? x + sub * scale : x, as x + (keep ? sub * scale : -0): adding -0 is IEEE's
        // exact identity, and the select (both sides loaded) vectorises.
        dropout_keep_mask(key, offset, d, p, keep.data());
        for (int col = 0; col < d; ++col) {
          const T dropped_sub = sub_row[col] * scale;
          r_row[col] = x_row[col] + (keep[col] != 0 ? dropped_sub : T(-0.0));
        }
      }
    }
    normalize_rows<decltype(count)::value>(
        y + first_offset, mean != nullptr ? mean + first : nullptr,
        rstd != nullptr ? rstd + first : nullptr, residual + first_offset, gamma, beta, d, eps);
  });
}

// The backward of the two in one pass over the rows: each row's residual gradient g
// (normalized_row_gradient, not stored) goes straight to dx += g and d_sub += g * keep /
// (1 - p), as layernorm_backward into a zeroed buffer followed by
// residual_dropout_backward would put it (same bits: the buffer's 0 + g is kept). kWrite
// stores the same sums onto zeros instead of onto dx and d_sub (0 where dropped).
template <typename T>
void add_dropout_layernorm_backward(T* dx, T* d_sub, T* dgamma, T* dbeta, const T* dy,
                                    const T* residual, const T* mean, const T* rstd,
                                    const T* gamma, int rows, int d, float p, DropoutKey key,
                                    GradStore store) {
  check_probability(p);
  const int threads = threads_for(int64_t(rows) * d);
  add_norm_parameter_gradients(dgamma, dbeta, dy, residual, mean, rstd, rows, d, threads);
  if (dx == nullptr && d_sub == nullptr) return;
  const T scale = keep_scale<T>(p);
  const bool write = store == GradStore::kWrite;
  for_row_groups(rows, d, [&](int first, auto count) {
    constexpr int kRows = decltype(count)::value;
    // This thread's residual gradients of the group's rows (a thread runs one group at a
    // time; d_model wide, so kept between groups instead of allocated for each).
    thread_local std::vector<T> gradients;
    gradients.resize(static_cast<size_t>(kRows) * d);
    const int64_t first_offset = static_cast<int64_t>(first) * d;
    normalized_rows_gradient<kRows>(gradients.data(), dy + first_offset,
                                    residual + first_offset, mean + first, rstd + first,
                                    gamma, d);
    for (int r = 0; r < kRows; ++r) {
      const int64_t offset = first_offset + int64_t(r) * d;
      const T* g_row = gradients.data() + int64_t(r) * d;
      T* dx_row = dx != nullptr ? dx + offset : nullptr;
      T* d_sub_row = d_sub != nullptr ? d_sub + offset : nullptr;
      if (dx_row != nullptr) {
        for (int col = 0; col < d; ++col) {
          dx_row[col] = (write ? T(0) : dx_row[col]) + (T(0) + g_row[col]);
        }
      }
      if (d_sub_row == nullptr) continue;
      if (p == 0.0f) {
        for (int col = 0; col < d; ++col) {
          d_sub_row[col] = (write ? T(0) : d_sub_row[col]) + (T(0) + g_row[col]);
        }
        continue;
      }
      // d_sub += (keep ? g * scale : -0): where dropped, adding -0 leaves d_sub's bits as
      // they are (kWrite: 0 + -0 = 0), and the select vectorises.
      thread_local std::vector<uint8_t> keep;
      keep.resize(static_cast<size_t>(d));
      dropout_keep_mask(key, offset, d, p, keep.data());
      for (int col = 0; col < d; ++col) {
        const T kept = (T(0) + g_row[col]) * scale;
        d_sub_row[col] = (write ? T(0) : d_sub_row[col]) + (keep[col] != 0 ? kept : T(-0.0));
      }
    }
  });
}

THPC_CPU_TWIN(layernorm_forward)
THPC_CPU_TWIN(layernorm_backward)
THPC_CPU_TWIN(add_dropout_layernorm_forward)
THPC_CPU_TWIN(add_dropout_layernorm_backward)

}  // namespace thpc::cpu
