// The best k entries of each row (Backend::row_top_k) on the GPU, with the CPU twin
// kernels/cpu/top_k.cc as specification: larger values first, NaN after every number,
// among equals (NaN with NaN too) the smaller column first; columns skip_a and skip_b
// (the decoders' pad and bos) never chosen. Beam search asks for 2 * beam entries of
// each hypothesis' [vocab] log-probabilities, so [rows, k] values and columns travel to
// the host instead of [rows, vocab].
//
// Shape: k is small (8 for beam 4) against the row (8,000-37,000 entries). One block
// per row makes k passes over it: pass r finds, by a block-wide argmax under the total
// order above, the best entry that ranks after pass r-1's choice. The order is strict
// (columns differ), so "ranks after the previous choice" excludes exactly the entries
// already chosen: no marks, no per-thread lists, any k. Cost: k reads of the row, the
// first from memory and the rest from L2 (a 37,000-entry bf16 row is 74 KB); for beam
// search's few hundred rows this is microseconds against the decoder step it follows.
//
// Determinism: each thread scans a fixed stride, partials combine in a fixed shuffle /
// shared-memory tree, and the order is total, so the result is the CPU's bit for bit.
#include <cstdint>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/device_util.cuh"

namespace thpc::cuda {
namespace {

constexpr int kThreads = 256;  // per row block
constexpr int kWarps = kThreads / kWarp;
constexpr int kNone = -1;  // "no entry": ranks after every entry

// The op's total order on (value, column), with kNone after everything.
__device__ __forceinline__ bool ranks_before(float value_a, int column_a, float value_b,
                                             int column_b) {
  if (column_b == kNone) return column_a != kNone;
  if (column_a == kNone) return false;
  const bool nan_a = isnan(value_a), nan_b = isnan(value_b);
  if (nan_a != nan_b) return nan_b;
  if (!nan_a && value_a != value_b) return value_a > value_b;
  return column_a < column_b;
}

// Keeps the better of (value, column) and the candidate shuffled from lane + offset.
__device__ __forceinline__ void warp_best(float& value, int& column) {
  for (int offset = kWarp / 2; offset > 0; offset /= 2) {
    const float other_value = __shfl_down_sync(0xffffffffu, value, offset);
    const int other_column = __shfl_down_sync(0xffffffffu, column, offset);
    if (ranks_before(other_value, other_column, value, column)) {
      value = other_value;
      column = other_column;
    }
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    row_top_k_rows(float* values, int32_t* columns, const T* x, int width, int k, int skip_a,
                   int skip_b) {
  const int64_t row = blockIdx.x;
  const T* entries = x + row * width;
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  __shared__ float warp_values[kWarps];
  __shared__ int warp_columns[kWarps];
  __shared__ float chosen_value;
  __shared__ int chosen_column;
  float previous_value = 0.0f;
  int previous_column = kNone;  // before the first pass every entry is eligible
  for (int pass = 0; pass < k; ++pass) {
    float best_value = 0.0f;
    int best_column = kNone;
    for (int column = threadIdx.x; column < width; column += kThreads) {
      if (column == skip_a || column == skip_b) continue;
      const float value = to_float(entries[column]);
      if (previous_column != kNone &&
          !ranks_before(previous_value, previous_column, value, column)) {
        continue;  // chosen in an earlier pass, or ranks before something that was
      }
      if (ranks_before(value, column, best_value, best_column)) {
        best_value = value;
        best_column = column;
      }
    }
    warp_best(best_value, best_column);
    if (lane == 0) {
      warp_values[warp] = best_value;
      warp_columns[warp] = best_column;
    }
    __syncthreads();
    if (warp == 0) {
      best_value = lane < kWarps ? warp_values[lane] : 0.0f;
      best_column = lane < kWarps ? warp_columns[lane] : kNone;
      warp_best(best_value, best_column);
      if (lane == 0) {
        chosen_value = best_value;
        chosen_column = best_column;
        values[row * k + pass] = best_value;
        columns[row * k + pass] = best_column;
      }
    }
    // Every thread reads this pass's choice before any writes the next pass's partials
    // (they are written after the next scan, which follows this barrier).
    __syncthreads();
    previous_value = chosen_value;
    previous_column = chosen_column;
  }
}

}  // namespace

// values [rows, k] fp32, columns [rows, k]. The backend has checked k against the
// selectable columns (check_row_top_k, kernels/ops.h) before this runs.
template <typename T>
void row_top_k(Context& context, float* values, int32_t* columns, const T* x, int rows,
               int width, int k, int skip_a, int skip_b) {
  const cudaStream_t stream = context.stream();
  if (rows <= 0 || k <= 0) return;
  row_top_k_rows<T><<<rows, kThreads, 0, stream>>>(values, columns, x, width, k, skip_a, skip_b);
  THPC_CUDA_CHECK_LAUNCH("row_top_k_rows");
}

THPC_CUDA_TWIN(row_top_k)

}  // namespace thpc::cuda
