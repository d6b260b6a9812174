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

// Whether the twin is to write `out` rather than add into it: kWrite with an output.
// Writing, the GEMMs run with beta = 0 and the kernels store without loading out: no
// zeroing pass and no read of the old values (base: ~130 zeroed buffers, ~5 GB, 2.6 ms
// a step on the H100). Until 2026-11-26 a candidate (train.cuda_kernels =
// write_gradients) whose verified stand-in zeroed out and added; that day it ran on an
// H100, twins and memcheck clean, and became the only path.
inline bool writes_gradient(GradStore store, const void* out) {
  return store == GradStore::kWrite && out != nullptr;
}

// The beta of a GEMM whose C is an activation gradient the twin writes (0: what
// writes_gradient said) or adds into (1).
inline float gradient_beta(bool write) { return write ? 0.0f : 1.0f; }

}  // namespace thpc::cuda
