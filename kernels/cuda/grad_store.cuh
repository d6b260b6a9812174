// GradStore (kernels/ops.h) on the GPU: how a twin honours kWrite for one of its
// activation-gradient outputs.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_ops.h"

namespace thpc::cuda {

// Zeroes rows x cols elements of T with row stride ld (elements).
template <typename T>
void zero_columns(Context& context, T* out, int64_t rows, int64_t cols, int64_t ld) {
  if (out == nullptr || rows <= 0 || cols <= 0) return;
  if (cols == ld) {  // contiguous
    THPC_CUDA_CHECK(cudaMemsetAsync(out, 0, static_cast<size_t>(rows * cols) * sizeof(T),
                                    context.stream()));
  } else {  // a column block of a wider matrix (attention's q|k|v gradients)
    THPC_CUDA_CHECK(cudaMemset2DAsync(out, static_cast<size_t>(ld) * sizeof(T), 0,
                                      static_cast<size_t>(cols) * sizeof(T),
                                      static_cast<size_t>(rows), context.stream()));
  }
}

// Whether the twin is to write `out` (rows x cols elements of T, row stride ld elements)
// rather than add into it:
// * kAdd, or a null out: no.
// * kWrite with the candidate kernels (train.cuda_kernels = candidate or write_gradients):
//   yes. The GEMMs run with beta = 0 and the kernels store without loading out: no
//   zeroing pass, and no read of the old values (base: ~130 zeroed buffers, ~5 GB, a step).
// * kWrite on the verified path: out is zeroed here and the twin adds into it, as before
//   GradStore, when the model zeroed each buffer: the memset and the kernels that ran on
//   a GPU.
template <typename T>
bool writes_gradient(Context& context, GradStore store, T* out, int64_t rows, int64_t cols,
                     int64_t ld) {
  if (store == GradStore::kAdd || out == nullptr) return false;
  if (context.candidate_kernel(kWriteGradients)) return true;
  zero_columns(context, out, rows, cols, ld);
  return false;
}

// The same for a contiguous output of n elements.
template <typename T>
bool writes_gradient(Context& context, GradStore store, T* out, int64_t n) {
  return writes_gradient(context, store, out, 1, n, n);
}

// The beta of a GEMM whose C is an activation gradient the twin writes (0: what
// writes_gradient said) or adds into (1).
inline float gradient_beta(bool write) { return write ? 0.0f : 1.0f; }

}  // namespace thpc::cuda
