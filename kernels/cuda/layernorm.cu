// Layer normalization (Ba et al. 2016) on the GPU, after every residual connection:
// LayerNorm(x + Sublayer(x)) (§3.1), alone or fused with the residual and its dropout.
// CPU twin: kernels/cpu/layernorm.cc.
//
// Forward, per row of d values:
//   mean = (1/d) sum x,  var = (1/d) sum (x - mean)^2 (biased),  rstd = 1 / sqrt(var + eps),
//   y = (x - mean) * rstd * gamma + beta;  mean and rstd are saved (fp32) for backward.
// Backward, with xhat = (x - mean) * rstd and g = dy * gamma:
//   dx += rstd * (g - mean(g) - xhat * mean(g * xhat)),
//   dgamma += sum over rows of dy * xhat,  dbeta += sum over rows of dy.
//
// Shape: ~8 FLOPs per element against 2 (forward: x in, y out) or 3 (backward: x, dy, dx)
// element transfers, so both directions are memory-bound. Forward and dx use one warp per
// row (8 rows per 256-thread block): lanes stride the row (coalesced), the row statistics
// are warp-shuffle sums, and the row is read again from L1/L2 for the second pass (the
// variance is computed around the mean, not as E[x^2] - mean^2, as on the CPU) and for the
// output. Statistics are fp32 whatever T is.
//
// The column sums dgamma, dbeta are deterministic without atomics (column_sums.cuh): a
// 2-D grid of blocks, each thread owning one column of one chunk of rows, sums its chunk
// in row order into a partial (Context scratch, [chunks, d] each); a second kernel adds
// the partials of each column in chunk order into dgamma/dbeta.
//
// The residual connection, its dropout and the norm fused (add_dropout_layernorm_*,
// LayerNorm(x + Dropout(sub)), §3.1 and §5.4). Unfused, a post-norm sublayer costs
// forward a residual kernel (read x and sub, write the residual) and the norm (read the
// residual three times, write y); backward a zeroed gradient buffer, the norm's dx kernel
// accumulating into it (dy and the residual twice each, the buffer read and written), and
// the residual's backward reading the buffer back into dx and d_sub: in device-memory
// passes over [rows, d], 5 forward and 10 backward (+ 2 for the column sums), in seven
// launches. Fused: forward reads x and sub and writes the residual and y, re-reading the
// warp's own row from cache (4); backward reads dy and the residual and updates dx and
// d_sub (6, + 2), in four launches. At base size (25,000 rows of 512 bf16: 26 MB a pass,
// 30 add & norms a step) that is 5 of the 15 passes, ~3.9 GB a step, where the residual
// round trips went to device memory (the 50 MB L2 holds one 26 MB tensor, so part of
// the saving may be L2 traffic; the launches are saved in any case). One warp per row, as above; the fused
// kernels share normalize_row, norm_gradient_means and norm_input_gradient with the
// plain ones and round where the unfused path stores (the residual, the zeroed
// buffer's 0 + g) to the same T, so they compute the unfused kernels' bits
// (CudaAddNorm.*IsTheUnfusedKernelsBitForBit). Lanes take the dropout's columns four at
// a time (lane l: 4l..4l+3, then +128), so one Philox call gives a lane the draws of its
// four elements (dropout_mask.cuh).
//
// The fused forms take rows that fit vector_norm.cuh's register-held kernels (bf16 d a
// multiple of 256 up to 1,024; fp32 of 128 up to 512; 16-byte aligned tensors; the
// default since the H200 window of 2026-12-04, the former candidate vector_norms: the
// base step's add & norm 5.77 -> 3.77 ms); the rest, and every plain layer norm, as above.
#include <atomic>
#include <cstdint>
#include <initializer_list>
#include <type_traits>

#include "kernels/cuda/column_sums.cuh"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/dropout_mask.cuh"
#include "kernels/cuda/grad_store.cuh"
#include "kernels/cuda/vector_norm.cuh"

namespace thpc::cuda {
namespace {

std::atomic<int64_t> vector_norm_launch_count{0};

constexpr int kRowsPerBlock = 8;               // warps per block in the row kernels
constexpr int kRowThreads = kRowsPerBlock * kWarp;
constexpr int kColumnsPerLane = 4;             // consecutive columns a lane takes at once
constexpr int kColumnStride = kColumnsPerLane * kWarp;

// The norm of one row of x at `base` into y (and its statistics, lane 0): the warp's
// lanes stride the columns; the statistics are fp32 warp sums, the variance around the
// mean. What layernorm_forward_kernel does per row and add_dropout_layernorm_forward_kernel
// after writing the row's residual: the same code, so the same bits.
template <typename T>
__device__ __forceinline__ void normalize_row(T* y, float* mean_out, float* rstd_out,
                                              const T* x, const T* gamma, const T* beta,
                                              int row, int64_t base, int d, float eps,
                                              int lane) {
  float sum = 0.0f;
  for (int col = lane; col < d; col += kWarp) sum += load(x, base + col);
  const float mean = warp_sum(sum) / d;
  float squares = 0.0f;
  for (int col = lane; col < d; col += kWarp) {
    const float centered = load(x, base + col) - mean;
    squares += centered * centered;
  }
  const float rstd = 1.0f / sqrtf(warp_sum(squares) / d + eps);
  if (lane == 0) {
    if (mean_out != nullptr) mean_out[row] = mean;
    if (rstd_out != nullptr) rstd_out[row] = rstd;
  }
  for (int col = lane; col < d; col += kWarp) {
    const float normalized = (load(x, base + col) - mean) * rstd;
    store(y, base + col, normalized * load(gamma, col) + load(beta, col));
  }
}

template <typename T>
__global__ void layernorm_forward_kernel(T* y, float* mean_out, float* rstd_out, const T* x,
                                         const T* gamma, const T* beta, int rows, int d,
                                         float eps) {
  const int lane = threadIdx.x % kWarp;
  const int row = blockIdx.x * kRowsPerBlock + threadIdx.x / kWarp;
  if (row >= rows) return;  // the whole warp leaves together
  normalize_row(y, mean_out, rstd_out, x, gamma, beta, row, static_cast<int64_t>(row) * d, d,
                eps, lane);
}

// The two row means of the norm's backward, mean(g) and mean(g * xhat) with
// g = dy * gamma and xhat = (x - mean) * rstd, over the row at `base`, summed by the
// warp (lanes stride the columns).
template <typename T>
__device__ __forceinline__ float2 norm_gradient_means(const T* dy, const T* x, const T* gamma,
                                                      int64_t base, int d, float row_mean,
                                                      float row_rstd, int lane) {
  float sum_g = 0.0f, sum_g_xhat = 0.0f;
  for (int col = lane; col < d; col += kWarp) {
    const float xhat = (load(x, base + col) - row_mean) * row_rstd;
    const float g = load(dy, base + col) * load(gamma, col);
    sum_g += g;
    sum_g_xhat += g * xhat;
  }
  return make_float2(warp_sum(sum_g) / d, warp_sum(sum_g_xhat) / d);
}

// The norm's input gradient at one element, rstd * (g - mean(g) - xhat * mean(g * xhat)),
// with explicit roundings (no contraction), so that the plain and the fused backward
// kernels compute it alike.
__device__ __forceinline__ float norm_input_gradient(float g, float xhat, float2 means,
                                                     float row_rstd) {
  return vector_norm::input_gradient(g, xhat, means.x, means.y, row_rstd);
}

template <typename T>
__global__ void layernorm_backward_dx_kernel(T* dx, const T* dy, const T* x, const float* mean,
                                             const float* rstd, const T* gamma, int rows,
                                             int d, bool write) {
  const int lane = threadIdx.x % kWarp;
  const int row = blockIdx.x * kRowsPerBlock + threadIdx.x / kWarp;
  if (row >= rows) return;
  const int64_t base = static_cast<int64_t>(row) * d;
  const float row_mean = mean[row], row_rstd = rstd[row];
  const float2 means = norm_gradient_means(dy, x, gamma, base, d, row_mean, row_rstd, lane);
  for (int col = lane; col < d; col += kWarp) {
    const float xhat = (load(x, base + col) - row_mean) * row_rstd;
    const float g = load(dy, base + col) * load(gamma, col);
    store(dx, base + col, __fadd_rn(write ? 0.0f : load(dx, base + col),
                                    norm_input_gradient(g, xhat, means, row_rstd)));
  }
}

// Block (blockIdx.x, chunk = blockIdx.y): thread -> column; sums rows
// [chunk * rows_per_chunk, ...) in order into partial_gamma/partial_beta[chunk * d + col].
template <typename T>
__global__ void layernorm_param_partials_kernel(float* partial_gamma, float* partial_beta,
                                                const T* dy, const T* x, const float* mean,
                                                const float* rstd, int rows, int d,
                                                int rows_per_chunk) {
  const int col = blockIdx.x * kColumnThreads + threadIdx.x;
  if (col >= d) return;
  const int chunk = blockIdx.y;
  const int first = chunk * rows_per_chunk;
  const int last = min(rows, first + rows_per_chunk);
  float sum_gamma = 0.0f, sum_beta = 0.0f;
  for (int row = first; row < last; ++row) {
    const int64_t index = static_cast<int64_t>(row) * d + col;
    const float g = load(dy, index);
    if (partial_gamma != nullptr) sum_gamma += g * ((load(x, index) - mean[row]) * rstd[row]);
    sum_beta += g;
  }
  const int64_t out = static_cast<int64_t>(chunk) * d + col;
  if (partial_gamma != nullptr) partial_gamma[out] = sum_gamma;
  if (partial_beta != nullptr) partial_beta[out] = sum_beta;
}

// residual = x + Dropout(sub), the expression of the residual kernel of elementwise.cu
// (fp32 with explicit roundings, stored as T), then normalize_row of the stored residual:
// the bits of residual_dropout_forward followed by layernorm_forward. Lanes write the
// residual four columns at a time (one Philox call per four draws) and read it back in
// normalize_row's order, after __syncwarp() makes the warp's writes visible to it.
template <typename T>
__global__ void add_dropout_layernorm_forward_kernel(T* y, T* residual, float* mean_out,
                                                     float* rstd_out, const T* x, const T* sub,
                                                     const T* gamma, const T* beta, int rows,
                                                     int d, float eps, DropMask mask,
                                                     float scale) {
  const int lane = threadIdx.x % kWarp;
  const int row = blockIdx.x * kRowsPerBlock + threadIdx.x / kWarp;
  if (row >= rows) return;  // the whole warp leaves together
  const int64_t base = static_cast<int64_t>(row) * d;
  for (int first = kColumnsPerLane * lane; first < d; first += kColumnStride) {
    const int count = min(kColumnsPerLane, d - first);
    const unsigned keep = keep_bits_at(mask, base + first, count);
    for (int k = 0; k < count; ++k) {
      const int64_t i = base + first + k;
      const float xi = load(x, i);
      store(residual, i,
            ((keep >> k) & 1u) != 0u ? __fadd_rn(xi, __fmul_rn(load(sub, i), scale)) : xi);
    }
  }
  __syncwarp();
  normalize_row(y, mean_out, rstd_out, residual, gamma, beta, row, base, d, eps, lane);
}

// The backward of the two: g = norm_input_gradient, rounded to T as the unfused path's
// zeroed buffer holds it (0 + g), then dx += g and d_sub += g * scale where kept, the
// residual backward's expressions: the bits of layernorm_backward into a zeroed buffer
// followed by residual_dropout_backward, without the buffer.
template <typename T>
__global__ void add_dropout_layernorm_backward_kernel(T* dx, T* d_sub, const T* dy,
                                                      const T* residual, const float* mean,
                                                      const float* rstd, const T* gamma,
                                                      int rows, int d, DropMask mask,
                                                      float scale, bool write) {
  const int lane = threadIdx.x % kWarp;
  const int row = blockIdx.x * kRowsPerBlock + threadIdx.x / kWarp;
  if (row >= rows) return;
  const int64_t base = static_cast<int64_t>(row) * d;
  const float row_mean = mean[row], row_rstd = rstd[row];
  const float2 means =
      norm_gradient_means(dy, residual, gamma, base, d, row_mean, row_rstd, lane);
  for (int first = kColumnsPerLane * lane; first < d; first += kColumnStride) {
    const int count = min(kColumnsPerLane, d - first);
    const unsigned keep = d_sub != nullptr ? keep_bits_at(mask, base + first, count) : 0u;
    for (int k = 0; k < count; ++k) {
      const int col = first + k;
      const int64_t i = base + col;
      const float xhat = (load(residual, i) - row_mean) * row_rstd;
      const float g = load(dy, i) * load(gamma, col);
      const float g_residual = to_float(
          from_float<T>(__fadd_rn(0.0f, norm_input_gradient(g, xhat, means, row_rstd))));
      if (dx != nullptr) store(dx, i, __fadd_rn(write ? 0.0f : load(dx, i), g_residual));
      if (d_sub != nullptr && ((keep >> k) & 1u) != 0u) {
        store(d_sub, i,
              __fadd_rn(write ? 0.0f : load(d_sub, i), __fmul_rn(g_residual, scale)));
      } else if (d_sub != nullptr && write) {
        store(d_sub, i, 0.0f);  // dropped: kAdd leaves it, writing makes it 0
      }
    }
  }
}

int row_blocks(int rows) { return (rows + kRowsPerBlock - 1) / kRowsPerBlock; }

// vector_norm.cuh's policy on the GPU: a lane of the row's warp, its warp's shuffles, and
// 16-byte moves.
struct WarpLanes {
  __device__ int lane() const { return static_cast<int>(threadIdx.x) % kWarp; }
  __device__ float warp_sum(float value) const { return cuda::warp_sum(value); }
  template <typename E>
  __device__ void load(float (&out)[kVector<E>], const E* p) const {
    load16(out, p);
  }
  template <typename E>
  __device__ void store(E* p, const float (&in)[kVector<E>]) const {
    store16(p, in);
  }
  template <typename E>
  __device__ float round(float value) const {
    return to_float(from_float<E>(value));
  }
  // The block's warps, for backward_rows_summing.
  __device__ int warp() const { return static_cast<int>(threadIdx.x) / kWarp; }
  __device__ int warps() const { return static_cast<int>(blockDim.x) / kWarp; }
  __device__ int block_thread() const { return static_cast<int>(threadIdx.x); }
  __device__ void block_sync() const { __syncthreads(); }
};

// One warp a row, as the verified kernels (kRowsPerBlock rows a block).
template <typename T, int kVectors>
__global__ void __launch_bounds__(kRowThreads)
    vector_add_norm_forward_kernel(T* y, T* residual, float* mean_out, float* rstd_out,
                                   const T* x, const T* sub, const T* gamma, const T* beta,
                                   int rows, int d, float eps, DropMask mask, float scale) {
  const int row = blockIdx.x * kRowsPerBlock + threadIdx.x / kWarp;
  if (row >= rows) return;  // the whole warp leaves together
  vector_norm::forward_row<T, kVectors>(WarpLanes{}, y, residual, mean_out, rstd_out, x, sub,
                                        gamma, beta, row, d, eps, mask, scale);
}

template <typename T, int kVectors>
__global__ void __launch_bounds__(kRowThreads)
    vector_add_norm_backward_kernel(T* dx, T* d_sub, const T* dy, const T* residual,
                                    const float* mean, const float* rstd, const T* gamma,
                                    int rows, int d, DropMask mask, float scale, bool write) {
  const int row = blockIdx.x * kRowsPerBlock + threadIdx.x / kWarp;
  if (row >= rows) return;
  vector_norm::backward_row<T, kVectors>(WarpLanes{}, dx, d_sub, dy, residual, mean, rstd,
                                         gamma, row, d, mask, scale, write);
}

// The candidate fused_norm_grads (vector_norm::backward_rows_summing): the backward of
// add & norm that sums dgamma's and dbeta's partials of its block too.
template <typename T, int kVectors>
__global__ void __launch_bounds__(kRowThreads)
    vector_add_norm_backward_summing_kernel(T* dx, T* d_sub, float* partial_gamma,
                                            float* partial_beta, const T* dy,
                                            const T* residual, const float* mean,
                                            const float* rstd, const T* gamma, int rows, int d,
                                            DropMask mask, float scale, bool write) {
  extern __shared__ float warp_sums[];  // kRowsPerBlock x 2 x d
  vector_norm::backward_rows_summing<T, kVectors>(
      WarpLanes{}, static_cast<int>(blockIdx.x), static_cast<int>(gridDim.x), warp_sums,
      partial_gamma, partial_beta, dx, d_sub, dy, residual, mean, rstd, gamma, rows, d, mask,
      scale, write);
}

// The vectors a lane holds for these rows, when every tensor the kernels move 16 bytes at
// a time is aligned to 16 bytes; 0: the row-per-block kernels above.
template <typename T>
int vector_norm_vectors(int d, std::initializer_list<const void*> tensors) {
  for (const void* tensor : tensors) {
    if (tensor != nullptr && !aligned16(tensor)) return 0;
  }
  return vector_norm::vectors_for<T>(d);
}

// Calls launch(std::integral_constant<int, v>{}) for the vectors v a lane holds (1 to
// kMaxVectors): the register-held kernels' instantiations, chosen at run time.
template <typename Launch>
void with_vectors(int vectors, const char* name, const Launch& launch) {
  switch (vectors) {
    case 1: launch(std::integral_constant<int, 1>{}); break;
    case 2: launch(std::integral_constant<int, 2>{}); break;
    case 3: launch(std::integral_constant<int, 3>{}); break;
    case 4: launch(std::integral_constant<int, 4>{}); break;
    default: THPC_FAIL(name << " for " << vectors << " vectors a lane");
  }
}

// Launches `kernel<T, v>` for the vectors v a lane holds, a warp a row.
template <typename T, template <typename, int> class Kernel, typename... Args>
void launch_vector_norm(int vectors, int rows, cudaStream_t stream, const char* name,
                        Args... args) {
  const int blocks = row_blocks(rows);
  with_vectors(vectors, name, [&](auto vectors_a_lane) {
    Kernel<T, decltype(vectors_a_lane)::value>::kernel<<<blocks, kRowThreads, 0, stream>>>(
        args...);
  });
  ++vector_norm_launch_count;
}
template <typename T, int kVectors>
struct VectorForward {
  static constexpr auto kernel = vector_add_norm_forward_kernel<T, kVectors>;
};
template <typename T, int kVectors>
struct VectorBackward {
  static constexpr auto kernel = vector_add_norm_backward_kernel<T, kVectors>;
};

// dx, d_sub, dgamma and dbeta in one pass over dy and the residual (fused_norm_grads):
// the summing kernel for `vectors` vectors a lane, its partials in Context scratch, then
// column_sums.cuh's finish with eight lanes a column (its partial rows are a block each,
// up to a wave of them).
template <typename T, int kVectors>
void launch_summing_backward(Context& context, T* dx, T* d_sub, float* dgamma, float* dbeta,
                             const T* dy, const T* residual, const float* mean,
                             const float* rstd, const T* gamma, int rows, int d, DropMask mask,
                             float scale, bool write) {
  const auto kernel = vector_add_norm_backward_summing_kernel<T, kVectors>;
  // Rows of d = kVectors x 32 lanes x kVector<T> (vector_norm::vectors_for): 8 to 64 KB
  // of warp sums a block; past 48 KB a kernel must ask for it.
  constexpr int kSharedBytes =
      vector_norm::summing_shared_bytes(kRowsPerBlock, kVectors * kWarp * kVector<T>);
  THPC_CHECK(d == kVectors * kWarp * kVector<T>, "summing kernel for rows of " << d);
  if (kSharedBytes > 48 * 1024) {  // per device, so at each call (a host call, no launch)
    THPC_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         kSharedBytes));
  }
  // Asked once a process (a host query kept off every step): one rank drives one GPU, so
  // the first device's answer is every call's; a process driving GPUs of different kinds
  // would size the others' grids by it (still correct, a different summing order).
  static const int resident_an_sm = [&] {
    int blocks = 0;
    THPC_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, kRowThreads,
                                                                  kSharedBytes));
    return blocks;
  }();
  const int blocks = vector_norm::summing_blocks(rows, resident_an_sm * context.multiprocessors(),
                                                kRowsPerBlock);
  const size_t partial_count = static_cast<size_t>(blocks) * d;
  float* partials = static_cast<float*>(context.scratch(2 * partial_count * sizeof(float)));
  float* partial_gamma = partials;
  float* partial_beta = partials + partial_count;
  kernel<<<blocks, kRowThreads, kSharedBytes, context.stream()>>>(
      dx, d_sub, partial_gamma, partial_beta, dy, residual, mean, rstd, gamma, rows, d, mask,
      scale, write);
  THPC_CUDA_CHECK_LAUNCH("vector_add_norm_backward_summing_kernel");
  ++vector_norm_launch_count;
  finish_column_sums(dgamma, dbeta, partial_gamma, partial_beta, blocks, d, true,
                     context.stream());
  THPC_CUDA_CHECK_LAUNCH("finish_column_sums");
}

// dgamma, dbeta += the column sums of dy * xhat and dy, in a fixed order.
template <typename T>
void layernorm_parameter_gradients(Context& context, float* dgamma, float* dbeta, const T* dy,
                                   const T* x, const float* mean, const float* rstd, int rows,
                                   int d) {
  if (dgamma == nullptr && dbeta == nullptr) return;
  const cudaStream_t stream = context.stream();
  const ColumnChunks chunks = column_chunks(rows, column_blocks(d), column_fill_blocks(context));
  const size_t partial_count = static_cast<size_t>(chunks.chunks) * d;
  float* partials = static_cast<float*>(context.scratch(2 * partial_count * sizeof(float)));
  float* partial_gamma = dgamma != nullptr ? partials : nullptr;
  float* partial_beta = dbeta != nullptr ? partials + partial_count : nullptr;
  layernorm_param_partials_kernel<T><<<chunks.grid(d), kColumnThreads, 0, stream>>>(
      partial_gamma, partial_beta, dy, x, mean, rstd, rows, d, chunks.rows_per_chunk);
  THPC_CUDA_CHECK_LAUNCH("layernorm_param_partials_kernel");
  finish_column_sums(dgamma, dbeta, partial_gamma, partial_beta, chunks.chunks, d,
                     context.candidate_kernel(kFullerColumnSums), stream);
  THPC_CUDA_CHECK_LAUNCH("finish_column_sums");
}

}  // namespace

template <typename T>
void layernorm_forward(Context& context, T* y, float* mean, float* rstd, const T* x,
                       const T* gamma, const T* beta, int rows, int d, float eps) {
  const cudaStream_t stream = context.stream();
  if (rows == 0 || d == 0) return;
  layernorm_forward_kernel<T><<<row_blocks(rows), kRowThreads, 0, stream>>>(
      y, mean, rstd, x, gamma, beta, rows, d, eps);
  THPC_CUDA_CHECK_LAUNCH("layernorm_forward_kernel");
}

// dx += ... (kWrite: =); dgamma, dbeta += column sums in fp32, in a fixed order.
template <typename T>
void layernorm_backward(Context& context, T* dx, float* dgamma, float* dbeta, const T* dy,
                        const T* x, const float* mean, const float* rstd, const T* gamma,
                        int rows, int d, GradStore store) {
  if (rows == 0 || d == 0) return;
  cudaStream_t stream = context.stream();
  if (dx != nullptr) {
    const bool write = writes_gradient(store, dx);
    layernorm_backward_dx_kernel<T><<<row_blocks(rows), kRowThreads, 0, stream>>>(
        dx, dy, x, mean, rstd, gamma, rows, d, write);
    THPC_CUDA_CHECK_LAUNCH("layernorm_backward_dx_kernel");
  }
  layernorm_parameter_gradients(context, dgamma, dbeta, dy, x, mean, rstd, rows, d);
}

template <typename T>
void add_dropout_layernorm_forward(Context& context, T* y, T* residual, float* mean,
                                   float* rstd, const T* x, const T* sub, const T* gamma,
                                   const T* beta, int rows, int d, float eps, float p,
                                   DropoutKey key) {
  check_probability(p);
  THPC_CHECK(residual != nullptr, "add_dropout_layernorm_forward needs its residual output");
  if (rows == 0 || d == 0) return;
  const int vectors = vector_norm_vectors<T>(d, {y, residual, x, sub, gamma, beta});
  if (vectors > 0) {
    launch_vector_norm<T, VectorForward>(vectors, rows, context.stream(),
                                         "vector_add_norm_forward_kernel", y, residual, mean,
                                         rstd, x, sub, gamma, beta, rows, d, eps,
                                         make_mask(key, p, true), keep_scale(p));
    THPC_CUDA_CHECK_LAUNCH("vector_add_norm_forward_kernel");
    return;
  }
  add_dropout_layernorm_forward_kernel<T><<<row_blocks(rows), kRowThreads, 0, context.stream()>>>(
      y, residual, mean, rstd, x, sub, gamma, beta, rows, d, eps, make_mask(key, p, true),
      keep_scale(p));
  THPC_CUDA_CHECK_LAUNCH("add_dropout_layernorm_forward_kernel");
}

template <typename T>
void add_dropout_layernorm_backward(Context& context, T* dx, T* d_sub, float* dgamma,
                                    float* dbeta, const T* dy, const T* residual,
                                    const float* mean, const float* rstd, const T* gamma,
                                    int rows, int d, float p, DropoutKey key, GradStore store) {
  check_probability(p);
  if (rows == 0 || d == 0) return;
  if (dx != nullptr || d_sub != nullptr) {
    // One flag for both outputs: the kernel writes (or adds into) each one it is given.
    const bool write = writes_gradient(store, dx) || writes_gradient(store, d_sub);
    const int vectors = vector_norm_vectors<T>(d, {dx, d_sub, dy, residual, gamma});
    if (vectors > 0 && dgamma != nullptr && dbeta != nullptr &&
        context.candidate_kernel(kFusedNormGrads)) {
      const DropMask mask = make_mask(key, p, d_sub != nullptr);
      with_vectors(vectors, "vector_add_norm_backward_summing_kernel", [&](auto vectors_a_lane) {
        launch_summing_backward<T, decltype(vectors_a_lane)::value>(
            context, dx, d_sub, dgamma, dbeta, dy, residual, mean, rstd, gamma, rows, d, mask,
            keep_scale(p), write);
      });
      return;
    }
    if (vectors > 0) {
      launch_vector_norm<T, VectorBackward>(vectors, rows, context.stream(),
                                            "vector_add_norm_backward_kernel", dx, d_sub, dy,
                                            residual, mean, rstd, gamma, rows, d,
                                            make_mask(key, p, d_sub != nullptr), keep_scale(p),
                                            write);
      THPC_CUDA_CHECK_LAUNCH("vector_add_norm_backward_kernel");
    } else {
      add_dropout_layernorm_backward_kernel<T>
          <<<row_blocks(rows), kRowThreads, 0, context.stream()>>>(
              dx, d_sub, dy, residual, mean, rstd, gamma, rows, d,
              make_mask(key, p, d_sub != nullptr), keep_scale(p), write);
      THPC_CUDA_CHECK_LAUNCH("add_dropout_layernorm_backward_kernel");
    }
  }
  layernorm_parameter_gradients(context, dgamma, dbeta, dy, residual, mean, rstd, rows, d);
}

THPC_CUDA_TWIN(layernorm_forward)
THPC_CUDA_TWIN(layernorm_backward)
THPC_CUDA_TWIN(add_dropout_layernorm_forward)
THPC_CUDA_TWIN(add_dropout_layernorm_backward)

}  // namespace thpc::cuda

int64_t thpc::cuda_vector_norm_launches() { return thpc::cuda::vector_norm_launch_count.load(); }
