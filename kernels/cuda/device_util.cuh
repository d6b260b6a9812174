// Device helpers shared by the kernels of kernels/cuda: fp32 <-> T conversion (T = float
// or bf16; arithmetic is always fp32, a bf16 store rounds to nearest even), fixed-order
// warp reductions (a butterfly: every lane ends with the same value, bit-identical from
// run to run), and the launch shape of the grid-stride elementwise kernels.
#pragma once

#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
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

// exp(x) as the hardware's exp2 of x log2(e) (ex2.approx.ftz: a multiply and one
// MUFU.EX2, where expf's range reduction for full accuracy takes about eight instructions
// and __expf's care for denormal results four to seven): ~2^-22 relative error (PTX ISA)
// plus the argument's rounding, |x log2 e| 2^-24; results below 2^-126 flush to zero.
// For the softmax-like sums of the candidates fast_loss_exp (the loss's rows) and
// fused_attention (a head's scores), whose exps are most of their instructions; the
// verified kernels keep expf.
__device__ __forceinline__ float exp_by_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x * 1.4426950408889634f));
  return y;
}

// 16-byte vectors: kVector<T> elements of T (8 bf16 or 4 floats) moved by one load or
// store instruction, so that a warp moves 512 contiguous bytes at once (the
// memory-bound row and column passes; a scalar bf16 load moves 64 bytes a warp). The
// pointer must be 16-byte aligned: callers check with aligned16 and fall back to scalar
// code where it is not.
template <typename T>
constexpr int kVector = 16 / static_cast<int>(sizeof(T));

inline bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// The kVector<T> elements at p widened to fp32; in rounded to T and stored at p (the
// bits move through memcpy, which the compiler turns into register moves). kStreaming:
// ld.global.cs / st.global.cs, data read or written for the last time soon, which the
// caches evict first (the loss's second pass over a row, kernels/cuda/cross_entropy.cu).
template <typename T, bool kStreaming = false>
__device__ __forceinline__ void load16(float (&out)[kVector<T>], const T* p) {
  const uint4 bits = kStreaming ? __ldcs(reinterpret_cast<const uint4*>(p))
                                : *reinterpret_cast<const uint4*>(p);
  T items[kVector<T>];
  memcpy(items, &bits, sizeof(bits));
#pragma unroll
  for (int k = 0; k < kVector<T>; ++k) out[k] = to_float(items[k]);
}
template <typename T, bool kStreaming = false>
__device__ __forceinline__ void store16(T* p, const float (&in)[kVector<T>]) {
  T items[kVector<T>];
#pragma unroll
  for (int k = 0; k < kVector<T>; ++k) items[k] = from_float<T>(in[k]);
  uint4 bits;
  memcpy(&bits, items, sizeof(bits));
  if constexpr (kStreaming) {
    __stcs(reinterpret_cast<uint4*>(p), bits);
  } else {
    *reinterpret_cast<uint4*>(p) = bits;
  }
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
