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

// The gradient of layer norm with respect to its input, for kRows consecutive rows (stride
// d) at once, into g_rows [kRows, d]: with xhat = (x - mean) * rstd and g = dy * gamma,
//   rstd * (g - mean(g) - xhat * mean(g * xhat)),
// the two row means accumulated in double over the row's columns in order, the result
// rounded to T. The rows' sum chains are interleaved (as normalize_rows does: one chain of
// dependent double additions runs at the adder's latency), so a row's bits do not depend
// on the rows beside it, and the per-element pass, free of the caller's stores and draws,
// is one the compiler vectorises.
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

// A buffer of `count` elements of E for the calling thread, kept between calls (a row or a
// group of rows' worth, d_model wide: allocated once per thread, not once per group).
template <typename E>
E* thread_buffer(size_t count) {
  thread_local std::vector<E> buffer;
  buffer.resize(count);
  return buffer.data();
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

// dx += rstd * (g - mean(g) - xhat * mean(g * xhat)) (normalized_rows_gradient; kWrite:
// dx = 0 + that); dgamma, dbeta += their column sums (add_norm_parameter_gradients).
template <typename T>
void layernorm_backward(T* dx, T* dgamma, T* dbeta, const T* dy, const T* x, const T* mean,
                        const T* rstd, const T* gamma, int rows, int d, GradStore store) {
  const int threads = threads_for(int64_t(rows) * d);
  add_norm_parameter_gradients(dgamma, dbeta, dy, x, mean, rstd, rows, d, threads);
  if (dx == nullptr) return;
  const bool write = store == GradStore::kWrite;
  for_row_groups(rows, d, [&](int first, auto count) {
    constexpr int kRows = decltype(count)::value;
    T* gradients = thread_buffer<T>(static_cast<size_t>(kRows) * d);
    const int64_t offset = static_cast<int64_t>(first) * d;
    normalized_rows_gradient<kRows>(gradients, dy + offset, x + offset, mean + first,
                                    rstd + first, gamma, d);
    T* dx_rows = dx + offset;
    for (int64_t i = 0; i < int64_t(kRows) * d; ++i) {
      dx_rows[i] = (write ? T(0) : dx_rows[i]) + gradients[i];
    }
  });
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
    uint8_t* keep = thread_buffer<uint8_t>(static_cast<size_t>(d));  // a row's mask
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
        dropout_keep_mask(key, offset, d, p, keep);
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
// (normalized_rows_gradient, not stored) goes straight to dx += g and d_sub += g * keep /
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
    T* gradients = thread_buffer<T>(static_cast<size_t>(kRows) * d);  // the group's rows'
    const int64_t first_offset = static_cast<int64_t>(first) * d;
    normalized_rows_gradient<kRows>(gradients, dy + first_offset,
                                    residual + first_offset, mean + first, rstd + first,
                                    gamma, d);
    for (int r = 0; r < kRows; ++r) {
      const int64_t offset = first_offset + int64_t(r) * d;
      const T* g_row = gradients + int64_t(r) * d;
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
      uint8_t* keep = thread_buffer<uint8_t>(static_cast<size_t>(d));
      dropout_keep_mask(key, offset, d, p, keep);
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
