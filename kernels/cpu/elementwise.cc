// ReLU (the position-wise feed-forward network of §3.3), dropout and the residual
// connection with dropout (§5.4, "Residual Dropout") on the CPU; the row copies of
// incremental decoding, the sum of squares and the scaling of parameter-side tensors.
#include <algorithm>
#include <cstdint>
#include <cstring>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "common/error.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/dropout_mask.h"
#include "kernels/cpu/parallel.h"

namespace thpc::cpu {
namespace {

// Calls visit(i, keep) for i in [0, n) with element i's dropout draw, the elements cut
// into chunks (whole Philox blocks) spread over the threads. Each chunk's mask is drawn
// first (dropout_keep_mask), so that a visit written as a select is a loop the compiler
// vectorises.
template <typename Visit>
void parallel_dropout_draws(const DropoutKey& key, int64_t n, float p, Visit&& visit) {
  constexpr int64_t kChunk = 4096;  // a multiple of the 4 draws of a Philox block
  const int64_t chunks = (n + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static) num_threads(threads_for(n))
  for (int64_t chunk = 0; chunk < chunks; ++chunk) {
    const int64_t first = chunk * kChunk;
    const int64_t count = std::min(kChunk, n - first);
    uint8_t keep[kChunk];
    dropout_keep_mask(key, first, count, p, keep);
    for (int64_t j = 0; j < count; ++j) visit(first + j, keep[j] != 0);
  }
}

// Calls body(i) for i in [0, n) over the threads.
template <typename Body>
void parallel_elements(int64_t n, Body&& body) {
#pragma omp parallel for schedule(static) num_threads(threads_for(n))
  for (int64_t i = 0; i < n; ++i) body(i);
}

}  // namespace

// y = max(0, x)
template <typename T>
void relu_forward(T* y, const T* x, int64_t n) {
  parallel_elements(n, [&](int64_t i) { y[i] = x[i] > T(0) ? x[i] : T(0); });
}

// dx += dy * (y > 0): the output tells where the input was positive, so x is not kept.
// kWrite: dx = 0 + (y > 0 ? dy : 0), kAdd's value in a zeroed buffer.
template <typename T>
void relu_backward(T* dx, const T* dy, const T* y, int64_t n, GradStore store) {
  if (dx == nullptr) return;
  if (store == GradStore::kWrite) {
    parallel_elements(n, [&](int64_t i) { dx[i] = T(0) + (y[i] > T(0) ? dy[i] : T(0)); });
    return;
  }
  parallel_elements(n, [&](int64_t i) {
    if (y[i] > T(0)) dx[i] += dy[i];
  });
}

#if defined(__SSE2__)
// fp32, four lanes at a time: the sign of y is a coin toss per element, and the branch
// above, mispredicted half the time, made this loop ~2% of a one-thread step of the small
// preset (18x relu_forward's time). Without a branch: dx + (y > 0 ? dy : -0), and adding
// -0 is IEEE's exact identity (x + -0 = x for every x, -0 and NaN included), so dx keeps
// its bits where y <= 0, as in the CUDA kernel's `if`. Written with intrinsics because GCC
// folds the plain C++ form (x + -0 -> x) back into the branch.
// kWrite adds onto a zero instead of onto dx (no load of dx).
template <>
void relu_backward<float>(float* dx, const float* dy, const float* y, int64_t n,
                          GradStore store) {
  if (dx == nullptr) return;
  const bool write = store == GradStore::kWrite;
  constexpr int64_t kChunk = 4096;  // elements per task, a multiple of the 4 lanes
  const int64_t chunks = (n + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static) num_threads(threads_for(n))
  for (int64_t chunk = 0; chunk < chunks; ++chunk) {
    const int64_t first = chunk * kChunk;
    const int64_t last = std::min(n, first + kChunk);
    const __m128 zero = _mm_setzero_ps(), minus_zero = _mm_set1_ps(-0.0f);
    int64_t i = first;
    for (; i + 4 <= last; i += 4) {
      const __m128 positive = _mm_cmpgt_ps(_mm_loadu_ps(y + i), zero);
      const __m128 added = _mm_or_ps(_mm_and_ps(positive, _mm_loadu_ps(dy + i)),
                                     _mm_andnot_ps(positive, minus_zero));
      const __m128 onto = write ? zero : _mm_loadu_ps(dx + i);
      _mm_storeu_ps(dx + i, _mm_add_ps(onto, added));
    }
    for (; i < last; ++i) {
      if (write) {
        dx[i] = 0.0f + (y[i] > 0.0f ? dy[i] : -0.0f);
      } else if (y[i] > 0.0f) {
        dx[i] += dy[i];
      }
    }
  }
}
#endif

// y = x * keep / (1 - p); p = 0 copies without drawing.
template <typename T>
void dropout_forward(T* y, const T* x, int64_t n, float p, DropoutKey key) {
  check_probability(p);
  if (p == 0.0f) {
    parallel_elements(n, [&](int64_t i) { y[i] = x[i]; });
    return;
  }
  const T scale = keep_scale<T>(p);
  // Element i is kept when its Philox draw (element index i) is >= p.
  parallel_dropout_draws(key, n, p, [&](int64_t i, bool keep) {
    const T scaled = x[i] * scale;
    y[i] = keep ? scaled : T(0);
  });
}

// dx += dy * keep / (1 - p), the mask redrawn from the key; kWrite: dx = 0 + that (0
// where dropped), kAdd's value in a zeroed buffer.
template <typename T>
void dropout_backward(T* dx, const T* dy, int64_t n, float p, DropoutKey key,
                      GradStore store) {
  check_probability(p);
  if (dx == nullptr) return;
  const bool write = store == GradStore::kWrite;
  if (p == 0.0f) {
    parallel_elements(n, [&](int64_t i) { dx[i] = (write ? T(0) : dx[i]) + dy[i]; });
    return;
  }
  const T scale = keep_scale<T>(p);
  // dx + (keep ? dy * scale : -0): where dropped, adding -0 leaves dx's bits as they are
  // (kWrite: 0 + -0 = 0), and the select vectorises.
  parallel_dropout_draws(key, n, p, [&](int64_t i, bool keep) {
    const T scaled = dy[i] * scale;
    dx[i] = (write ? T(0) : dx[i]) + (keep ? scaled : T(-0.0));
  });
}

// §3.1/§5.4: the sub-layer output is dropped out before it is added to its input,
// y = x + Dropout(sub) (the layer norm follows as a separate op).
template <typename T>
void residual_dropout_forward(T* y, const T* x, const T* sub, int64_t n, float p,
                              DropoutKey key) {
  check_probability(p);
  if (p == 0.0f) {
    parallel_elements(n, [&](int64_t i) { y[i] = x[i] + sub[i]; });
    return;
  }
  const T scale = keep_scale<T>(p);
  parallel_dropout_draws(key, n, p, [&](int64_t i, bool keep) {  // x + -0 = x where dropped
    const T scaled = sub[i] * scale;
    y[i] = x[i] + (keep ? scaled : T(-0.0));
  });
}

// dx += dy;  d_sub += dy * keep / (1 - p): the dropout's own backward (both written,
// onto zeros, with kWrite).
template <typename T>
void residual_dropout_backward(T* dx, T* d_sub, const T* dy, int64_t n, float p,
                               DropoutKey key, GradStore store) {
  check_probability(p);
  if (dx != nullptr) {
    const bool write = store == GradStore::kWrite;
    parallel_elements(n, [&](int64_t i) { dx[i] = (write ? T(0) : dx[i]) + dy[i]; });
  }
  dropout_backward(d_sub, dy, n, p, key, store);
}

// Row gathers/scatters (kernels/op_list.h). The source rows are read before any row is
// written only per row, so dst and src must not overlap.
template <typename T>
void copy_rows(T* dst, const int32_t* dst_rows, const T* src, const int32_t* src_rows,
               int count, int width) {
  for (int i = 0; i < count; ++i) {
    const int64_t to = dst_rows != nullptr ? dst_rows[i] : i;
    const int64_t from = src_rows != nullptr ? src_rows[i] : i;
    THPC_CHECK(to >= 0 && from >= 0, "negative row index in copy_rows (" << to << ", " << from
                                                                          << ")");
    std::copy(src + from * width, src + (from + 1) * width, dst + to * width);
  }
}

// The sum of squares (gradient norms) in double, in order; x *= alpha.
template <typename T>
double sum_squares(const T* x, int64_t n) {
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) sum += static_cast<double>(x[i]) * x[i];
  return sum;
}

// `totals` holds a StepTotals' bytes (StepTotalsBuffer): copied in, its norm set, out.
template <typename T>
void sum_squares_into(T* totals, const T* x, int64_t n) {
  THPC_CHECK(totals != nullptr, "sum_squares_into without its totals");
  StepTotals sum;
  std::memcpy(static_cast<void*>(&sum), totals, sizeof(sum));  // trivially copyable
  sum.grad_squares = sum_squares(x, n);
  std::memcpy(totals, &sum, sizeof(sum));
}

// `inputs` holds a StepInputs' bytes (StepInputsBuffer).
template <typename T>
void write_step_inputs(T* inputs, StepInputs values) {
  THPC_CHECK(inputs != nullptr, "write_step_inputs without its buffer");
  std::memcpy(inputs, &values, sizeof(values));
}

template <typename T>
void scale(T* x, int64_t n, float alpha) {
  for (int64_t i = 0; i < n; ++i) x[i] *= static_cast<T>(alpha);
}

THPC_CPU_TWIN(relu_forward)
#if defined(__SSE2__)
// relu_backward<float> is the explicit specialisation above: only double to instantiate.
template decltype(relu_backward<double>) relu_backward<double>;
#else
THPC_CPU_TWIN(relu_backward)
#endif
THPC_CPU_TWIN(dropout_forward)
THPC_CPU_TWIN(dropout_backward)
THPC_CPU_TWIN(residual_dropout_forward)
THPC_CPU_TWIN(residual_dropout_backward)
THPC_CPU_TWIN(copy_rows)
THPC_CPU_TWIN(sum_squares)
THPC_CPU_TWIN(sum_squares_into)
THPC_CPU_TWIN(write_step_inputs)
THPC_CPU_TWIN(scale)

}  // namespace thpc::cpu
