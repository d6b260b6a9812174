// The residual + dropout + layer norm of add_dropout_layernorm_* (layernorm.cu) with
// each row in its warp's registers: the fused ops' default for the rows that fit since
// 2026-12-04 (the former candidate vector_norms, kernels/ops.h).
//
// Why: at base size the 30 add & norms of a step are 5.64 of the H200's 32 profiled ms
// (issue 51), against ~1.3 ms for the bytes they must move at 4.8 TB/s (26 MB a
// [25,000 x 512] bf16 tensor; forward reads x and sub and writes the residual and y,
// backward reads dy and the residual and writes dx and d_sub). The verified kernels move
// those bytes as scalar loads and stores (64 bytes a warp an instruction) and read each
// row three times from cache. Here a lane holds kVectors 16-byte vectors of each of its
// tensors (bf16: 8 columns a vector; base's d = 512 is 2 vectors a lane, big's 1,024 is
// 4), loads and stores them once, and takes the statistics from registers. The column
// sums of dgamma and dbeta stay layernorm.cu's.
//
// The same arithmetic as the verified kernels, element by element (the residual x +
// Dropout(sub) rounded to T, the variance around the mean, the input gradient rounded to
// T before it is added); only the order of the row sums differs (a lane sums its own
// columns first), so the results are the CPU's within the twin tests' bounds, not the
// verified kernels' bits.
//
// One body, two executions (as fused_attention.cuh): written per lane for a policy X
// (lane(), warp_sum, 16-byte load and store, rounding to T). On the GPU (layernorm.cu,
// WarpLanes) X is the warp's shuffles and uint4 moves; in tests/kernels/layernorm_test.cc
// (VectorNormOnTheHost.*) each lane is a host thread and warp_sum the device's xor
// butterfly, so the columns each lane takes, the dropout draws, the roundings and the
// stores run on the CPU against the CPU's ops.
#pragma once

#include <cmath>
#include <cstdint>

#include "common/philox.h"
#include "kernels/cuda/dropout_mask.cuh"
#include "kernels/cuda/rounded.cuh"

#if defined(__CUDACC__)
#define THPC_VECTOR_NORM_BODY __device__ __forceinline__
#define THPC_VECTOR_NORM_UNROLL _Pragma("unroll")
#else
#define THPC_VECTOR_NORM_BODY inline
#define THPC_VECTOR_NORM_UNROLL
#endif

namespace thpc::vector_norm {

constexpr int kLanes = 32;
constexpr int kMaxVectors = 4;  // 16-byte vectors a lane holds of each tensor

// Elements of T in 16 bytes: 8 bf16, 4 floats.
template <typename T>
constexpr int kWidth = 16 / static_cast<int>(sizeof(T));

// The vectors a lane takes of a row of d elements of T: d / (32 lanes x kWidth) when
// that divides and is at most kMaxVectors; 0 when the row does not fit (the verified
// kernels then take it).
template <typename T>
constexpr int vectors_for(int d) {
  const int step = kLanes * kWidth<T>;
  return d > 0 && d % step == 0 && d / step <= kMaxVectors ? d / step : 0;
}

// Arithmetic rounded as written (no contraction into a fused multiply-add), as the
// verified kernels' __fadd_rn and __fmul_rn.
using rounded::add_rn;
using rounded::mul_rn;
using rounded::sub_rn;

// The layer norm's input gradient at one element, rstd * (g - mean(g) - xhat *
// mean(g * xhat)) with means = (mean(g), mean(g * xhat)): layernorm.cu's kernels, plain,
// fused and these, share it.
THPC_HOST_DEVICE float input_gradient(float g, float xhat, float mean_g, float mean_g_xhat,
                                      float row_rstd) {
  return mul_rn(row_rstd, sub_rn(sub_rn(g, mean_g), mul_rn(xhat, mean_g_xhat)));
}

// The first column of a lane's vector v: vectors are laid out lane after lane, so a
// warp's 32 loads of one v are 512 contiguous bytes.
template <typename T, class X>
THPC_VECTOR_NORM_BODY int first_column(const X& x, int v) {
  return (v * kLanes + x.lane()) * kWidth<T>;
}

// One row of residual = x + Dropout(sub) (stored, rounded to T) and y = LayerNorm(residual)
// (with its mean and rstd, by lane 0), the warp's lanes each holding kVectors vectors.
// Element e of the row is kept iff keep_bits(mask, e / 4) says so: the CPU's draws.
template <typename T, int kVectors, class X>
THPC_VECTOR_NORM_BODY void forward_row(const X& x, T* y, T* residual, float* mean_out,
                                       float* rstd_out, const T* in, const T* sub,
                                       const T* gamma, const T* beta, int row, int d, float eps,
                                       const cuda::DropMask& mask, float scale) {
  constexpr int W = kWidth<T>;
  const int64_t base = static_cast<int64_t>(row) * d;
  float r[kVectors][W];
  float sum = 0.0f;
  THPC_VECTOR_NORM_UNROLL
  for (int v = 0; v < kVectors; ++v) {
    const int col = first_column<T>(x, v);
    float a[W], b[W];
    x.load(a, in + base + col);
    x.load(b, sub + base + col);
    THPC_VECTOR_NORM_UNROLL
    for (int q = 0; q < W; q += 4) {
      const unsigned keep = cuda::keep_bits(mask, (base + col + q) >> 2);
      THPC_VECTOR_NORM_UNROLL
      for (int k = 0; k < 4; ++k) {
        const float kept = add_rn(a[q + k], mul_rn(b[q + k], scale));
        r[v][q + k] = x.template round<T>(((keep >> k) & 1u) != 0u ? kept : a[q + k]);
      }
    }
    x.store(residual + base + col, r[v]);
    THPC_VECTOR_NORM_UNROLL
    for (int k = 0; k < W; ++k) sum += r[v][k];
  }
  const float mean = x.warp_sum(sum) / d;
  float squares = 0.0f;
  THPC_VECTOR_NORM_UNROLL
  for (int v = 0; v < kVectors; ++v) {
    THPC_VECTOR_NORM_UNROLL
    for (int k = 0; k < W; ++k) {
      const float centered = r[v][k] - mean;
      squares += centered * centered;
    }
  }
  const float rstd = 1.0f / sqrtf(x.warp_sum(squares) / d + eps);
  if (x.lane() == 0) {
    if (mean_out != nullptr) mean_out[row] = mean;
    if (rstd_out != nullptr) rstd_out[row] = rstd;
  }
  THPC_VECTOR_NORM_UNROLL
  for (int v = 0; v < kVectors; ++v) {
    const int col = first_column<T>(x, v);
    float g[W], b[W], out[W];
    x.load(g, gamma + col);
    x.load(b, beta + col);
    THPC_VECTOR_NORM_UNROLL
    for (int k = 0; k < W; ++k) out[k] = (r[v][k] - mean) * rstd * g[k] + b[k];
    x.store(y + base + col, out);
  }
}

// Where a lane's sum of column first_column(v) + k lives among a warp's d sums: lane-minor,
// so that the warp's 32 lanes adding their k-th column of vector v touch 32 consecutive
// floats, one shared-memory bank each (by column they would be kWidth floats apart: bf16's
// 8 floats, an 8-way bank conflict at each of a row's 4 d / 32 accesses a lane).
template <typename T>
THPC_HOST_DEVICE constexpr int sum_slot(int v, int k, int lane) {
  return (v * kWidth<T> + k) * kLanes + lane;
}

// sum_slot of column `col` (col = (v * kLanes + lane) * kWidth + k).
template <typename T>
THPC_HOST_DEVICE constexpr int sum_slot_of_column(int col) {
  return sum_slot<T>(col / (kLanes * kWidth<T>), col % kWidth<T>, col / kWidth<T> % kLanes);
}

// One row of the backward: g = the norm's input gradient, rounded to T, then dx += g and
// d_sub += g * scale where kept (write: = instead of +=, a dropped d_sub element 0; not
// writing, a dropped element keeps its value). dx or d_sub may be null. With `sums` (a
// warp's [2, d] floats, each lane's own columns at their sum_slot), the row's dy * xhat
// and dy are added to the lane's sums of dgamma (sums[slot]) and dbeta (sums[d + slot])
// too, from the bytes this row has loaded.
template <typename T, int kVectors, class X>
THPC_VECTOR_NORM_BODY void backward_row(const X& x, T* dx, T* d_sub, const T* dy,
                                        const T* residual, const float* mean,
                                        const float* rstd, const T* gamma, int row, int d,
                                        const cuda::DropMask& mask, float scale, bool write,
                                        float* sums = nullptr) {
  constexpr int W = kWidth<T>;
  const int64_t base = static_cast<int64_t>(row) * d;
  const float row_mean = mean[row], row_rstd = rstd[row];
  float g[kVectors][W], xhat[kVectors][W];
  float sum_g = 0.0f, sum_g_xhat = 0.0f;
  THPC_VECTOR_NORM_UNROLL
  for (int v = 0; v < kVectors; ++v) {
    const int col = first_column<T>(x, v);
    float gradient[W], value[W], weight[W];
    x.load(gradient, dy + base + col);
    x.load(value, residual + base + col);
    x.load(weight, gamma + col);
    THPC_VECTOR_NORM_UNROLL
    for (int k = 0; k < W; ++k) {
      xhat[v][k] = (value[k] - row_mean) * row_rstd;
      g[v][k] = gradient[k] * weight[k];
      sum_g += g[v][k];
      sum_g_xhat += g[v][k] * xhat[v][k];
      if (sums != nullptr) {
        const int slot = sum_slot<T>(v, k, x.lane());
        sums[slot] += gradient[k] * xhat[v][k];
        sums[d + slot] += gradient[k];
      }
    }
  }
  const float mean_g = x.warp_sum(sum_g) / d, mean_g_xhat = x.warp_sum(sum_g_xhat) / d;
  THPC_VECTOR_NORM_UNROLL
  for (int v = 0; v < kVectors; ++v) {
    const int col = first_column<T>(x, v);
    float g_residual[W];
    THPC_VECTOR_NORM_UNROLL
    for (int k = 0; k < W; ++k) {
      g_residual[k] = x.template round<T>(
          add_rn(0.0f, input_gradient(g[v][k], xhat[v][k], mean_g, mean_g_xhat, row_rstd)));
    }
    if (dx != nullptr) {
      float out[W];
      if (!write) x.load(out, dx + base + col);
      THPC_VECTOR_NORM_UNROLL
      for (int k = 0; k < W; ++k) out[k] = add_rn(write ? 0.0f : out[k], g_residual[k]);
      x.store(dx + base + col, out);
    }
    if (d_sub != nullptr) {
      float out[W];
      if (!write) x.load(out, d_sub + base + col);
      THPC_VECTOR_NORM_UNROLL
      for (int q = 0; q < W; q += 4) {
        const unsigned keep = cuda::keep_bits(mask, (base + col + q) >> 2);
        THPC_VECTOR_NORM_UNROLL
        for (int k = 0; k < 4; ++k) {
          const float before = write ? 0.0f : out[q + k];
          out[q + k] = ((keep >> k) & 1u) != 0u
                           ? add_rn(before, mul_rn(g_residual[q + k], scale))
                           : before;
        }
      }
      x.store(d_sub + base + col, out);
    }
  }
}

// `mask` with its seed hidden from the compiler: in a loop over rows it otherwise keeps
// the Philox rounds' key words, derived from the seed, in 18 registers across the rows
// (cuobjdump's SASS of backward_rows_summing: 100 registers a thread with them, 80
// without, for bf16 rows of 512; the one-row kernel derives them as it draws). Costs a
// few integer adds a row; the draws are the same.
THPC_VECTOR_NORM_BODY cuda::DropMask mask_drawn_afresh(cuda::DropMask mask) {
#if defined(__CUDA_ARCH__)
  asm volatile("" : "+l"(mask.seed));
#endif
  return mask;
}

// The candidate fused_norm_grads: the backward of add & norm with the layer norm's
// dgamma and dbeta summed where dy and the residual are already loaded, instead of
// layernorm.cu's partial-sum kernel reading both again ([rows, d] twice: ~51 MB an add &
// norm of the base step at 25,000 tokens, 1.5 GB over its 30; at one rank's 3,125 tokens,
// 30 launches fewer). Block `block` of `blocks`, its warps x.warps(): warp w takes rows
// block * warps + w, then every blocks * warps rows on, summing its lanes' columns in that
// order into its own [2, d] of `shared` (warps x 2 x d floats, at sum_slot; shared memory,
// not registers, where the sums took the kernel to 128 on sm_90); then, past the block's one
// barrier, thread t adds the warps' sums of columns t, t + threads, ... in warp order into
// row `block` of partial_gamma and partial_beta ([blocks, d]), which column_sums.cuh's
// finish adds in block order. The order of every sum is fixed by (rows, blocks): the same
// bits run after run, not those of the verified path (whose chunks sum 64 rows a column).
template <typename T, int kVectors, class X>
THPC_VECTOR_NORM_BODY void backward_rows_summing(
    const X& x, int block, int blocks, float* shared, float* partial_gamma,
    float* partial_beta, T* dx, T* d_sub, const T* dy, const T* residual, const float* mean,
    const float* rstd, const T* gamma, int rows, int d, const cuda::DropMask& mask,
    float scale, bool write) {
  const int warps = x.warps();
  float* sums = shared + static_cast<int64_t>(x.warp()) * 2 * d;
  THPC_VECTOR_NORM_UNROLL
  for (int v = 0; v < kVectors; ++v) {
    THPC_VECTOR_NORM_UNROLL
    for (int k = 0; k < kWidth<T>; ++k) {
      const int slot = sum_slot<T>(v, k, x.lane());
      sums[slot] = sums[d + slot] = 0.0f;
    }
  }
  const int64_t stride = static_cast<int64_t>(blocks) * warps;
  for (int64_t row = static_cast<int64_t>(block) * warps + x.warp(); row < rows; row += stride) {
    backward_row<T, kVectors>(x, dx, d_sub, dy, residual, mean, rstd, gamma,
                              static_cast<int>(row), d, mask_drawn_afresh(mask), scale, write,
                              sums);
  }
  x.block_sync();
  const int64_t out = static_cast<int64_t>(block) * d;
  for (int col = x.block_thread(); col < d; col += warps * kLanes) {
    const int slot = sum_slot_of_column<T>(col);
    float sum_gamma = 0.0f, sum_beta = 0.0f;
    for (int w = 0; w < warps; ++w) {
      sum_gamma += shared[static_cast<int64_t>(w) * 2 * d + slot];
      sum_beta += shared[static_cast<int64_t>(w) * 2 * d + d + slot];
    }
    partial_gamma[out + col] = sum_gamma;
    partial_beta[out + col] = sum_beta;
  }
}

// The shared memory backward_rows_summing takes: `warps` x 2 x d floats.
constexpr int summing_shared_bytes(int warps, int d) {
  return warps * 2 * d * static_cast<int>(sizeof(float));
}

// backward_rows_summing's blocks of `warps` warps for `rows` rows, with `resident` such
// blocks on the device at once: the fewest rows a warp that one wave allows (at least one),
// then only the blocks those rows need, so that every warp takes as many rows as the
// busiest one and no more partial rows are written than blocks are at work (25,000 rows
// on 396 resident blocks of 8 warps: 391 blocks, 8 rows a warp; 3,125 rows: 391, 1).
inline int summing_blocks(int rows, int resident, int warps) {
  const int64_t warps_at_once = static_cast<int64_t>(resident > 1 ? resident : 1) * warps;
  const int64_t wave_rows = (rows + warps_at_once - 1) / warps_at_once;
  const int64_t rows_a_warp = wave_rows > 1 ? wave_rows : 1;
  const int64_t warps_needed = (rows + rows_a_warp - 1) / rows_a_warp;
  return static_cast<int>((warps_needed + warps - 1) / warps);
}

}  // namespace thpc::vector_norm
