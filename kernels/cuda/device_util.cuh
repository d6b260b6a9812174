// Device helpers shared by the kernels of kernels/cuda: fp32 <-> T conversion (T = float
// or bf16; arithmetic is always fp32, a bf16 store rounds to nearest even), fixed-order
// warp reductions (a butterfly: every lane ends with the same value, bit-identical from
// run to run), and the launch shape of the grid-stride elementwise kernels.
#pragma once

#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

namespace thpc::cuda {

constexpr int kWarp = 32;

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T>
__device__ __forceinline__ T from_float(float x) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    return __float2bfloat16_rn(x);
  } else {
    return x;
  }
}

// p[i] widened to fp32; p[i] = v rounded to T.
template <typename T>
__device__ __forceinline__ float load(const T* p, int64_t i) {
  return to_float(p[i]);
}
template <typename T>
__device__ __forceinline__ void store(T* p, int64_t i, float v) {
  p[i] = from_float<T>(v);
}

__device__ __forceinline__ float warp_sum(float x) {
  for (int offset = kWarp / 2; offset > 0; offset /= 2) {
    x += __shfl_xor_sync(0xffffffffu, x, offset);
  }
  return x;
}
__device__ __forceinline__ float warp_max(float x) {
  for (int offset = kWarp / 2; offset > 0; offset /= 2) {
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, offset));
  }
  return x;
}

// Grid-stride kernels: blocks of kGridThreads, at most kGridMaxBlocks of them (enough to
// fill an H200's 132 SMs many times over; each thread then loops).
constexpr int kGridThreads = 256;
constexpr int64_t kGridMaxBlocks = 8192;

inline int grid_blocks(int64_t work) {
  return static_cast<int>(
      std::min<int64_t>((work + kGridThreads - 1) / kGridThreads, kGridMaxBlocks));
}
__device__ __forceinline__ int64_t first_index() {
  return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ int64_t grid_stride() {
  return static_cast<int64_t>(gridDim.x) * blockDim.x;
}

}  // namespace thpc::cuda
