// Elementwise ops on the GPU: dtype conversion, ReLU (the position-wise feed-forward
// network of §3.3, FFN(x) = max(0, x W1 + b1) W2 + b2), dropout and the residual
// connection with dropout (§5.4 "Residual Dropout": y = x + Dropout(Sublayer(x))), row
// copies for the decoder's caches, and the fp32 scale / sum-of-squares used by gradient
// clipping and norms. CPU twin: kernels/cpu/elementwise.cc (+ cpu_backend.cc).
//
// Shape: every op here does O(1) flops per element and moves 4-12 bytes per element
// (e.g. bf16 residual forward: read x, sub, write y = 6 B, 2 flops), so all are
// memory-bound; they are one grid-stride pass with coalesced accesses (consecutive
// threads touch consecutive elements), 256 threads per block and at most 8192 blocks.
// The exception is dropout's Philox4x32-10 draw (~10 rounds of 2 wide multiplies), about
// 60 integer instructions per call: at one call per element that would make dropout
// compute-bound, so each thread takes a group of 4 consecutive elements and uses the 4
// words of one Philox call, exactly the words dropout_keep(...) picks for them
// (counter = element / 4, lane = element % 4) — the CPU and GPU masks are identical.
//
// Rounding: arithmetic is fp32 with explicit round-to-nearest intrinsics (__fmul_rn,
// __fadd_rn) so nvcc does not contract a*b+c into an FMA: in fp32 mode the results are
// then bit-identical to the CPU's, and in bf16 mode they are the CPU's fp32 results
// rounded once.
//
// sum_squares is a deterministic two-stage reduction in double: a fixed grid (a function
// of n only) of per-block partial sums in a fixed tree order into the Context scratch,
// then one block sums the partials in a fixed order; the result is read back through
// the Context's pinned buffer.
#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "common/error.h"
#include "common/philox.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/dropout_mask.cuh"
#include "kernels/cuda/grad_store.cuh"

namespace thpc::cuda {
namespace {

// ---- conversion ----------------------------------------------------------------------

template <typename D, typename S>
__global__ void convert_kernel(D* dst, const S* src, int64_t n) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) store(dst, i, load(src, i));
}

// ---- ReLU ---------------------------------------------------------------------------

template <typename T>
__global__ void relu_forward_kernel(T* y, const T* x, int64_t n) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) {
    const float v = load(x, i);
    store(y, i, v > 0.0f ? v : 0.0f);  // as the CPU: NaN and -0 give +0
  }
}

// dx += dy where y > 0 (elsewhere dx keeps its value); with `write`, dx = 0 + that.
template <typename T>
__global__ void relu_backward_kernel(T* dx, const T* dy, const T* y, int64_t n, bool write) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) {
    if (load(y, i) > 0.0f) {
      store(dx, i, __fadd_rn(write ? 0.0f : load(dx, i), load(dy, i)));
    } else if (write) {
      store(dx, i, 0.0f);
    }
  }
}

// ---- dropout ------------------------------------------------------------------------

// One thread per group of 4 elements; op(i, kept) does element i's work.
template <typename Op>
__global__ void dropout_kernel(Op op, int64_t n, DropMask mask) {
  const int64_t groups = (n + 3) / 4;
  for (int64_t g = first_index(); g < groups; g += grid_stride()) {
    const unsigned keep = keep_bits(mask, g);
    const int64_t first = g * 4;
    const int count = static_cast<int>(n - first < 4 ? n - first : 4);
    for (int k = 0; k < count; ++k) op(first + k, ((keep >> k) & 1u) != 0u);
  }
}

// y = kept ? x * scale : 0
template <typename T>
struct DropoutForwardOp {
  T* y;
  const T* x;
  float scale;
  __device__ void operator()(int64_t i, bool kept) const {
    store(y, i, kept ? __fmul_rn(load(x, i), scale) : 0.0f);
  }
};

// dx += kept ? dy * scale : 0 (dropped elements are left untouched); with `write`, dx =
// 0 + that (dropped ones 0).
template <typename T>
struct DropoutBackwardOp {
  T* dx;
  const T* dy;
  float scale;
  bool write;
  __device__ void operator()(int64_t i, bool kept) const {
    if (kept) {
      store(dx, i, __fadd_rn(write ? 0.0f : load(dx, i), __fmul_rn(load(dy, i), scale)));
    } else if (write) {
      store(dx, i, 0.0f);
    }
  }
};

// y = kept ? x + sub * scale : x
template <typename T>
struct ResidualForwardOp {
  T* y;
  const T* x;
  const T* sub;
  float scale;
  __device__ void operator()(int64_t i, bool kept) const {
    const float xi = load(x, i);
    store(y, i, kept ? __fadd_rn(xi, __fmul_rn(load(sub, i), scale)) : xi);
  }
};

// dx += dy (if dx); d_sub += kept ? dy * scale : 0 (if d_sub); with `write`, both = 0 +
// that.
template <typename T>
struct ResidualBackwardOp {
  T* dx;
  T* d_sub;
  const T* dy;
  float scale;
  bool write;
  __device__ void operator()(int64_t i, bool kept) const {
    const float g = load(dy, i);
    if (dx != nullptr) store(dx, i, __fadd_rn(write ? 0.0f : load(dx, i), g));
    if (d_sub != nullptr && kept) {
      store(d_sub, i, __fadd_rn(write ? 0.0f : load(d_sub, i), __fmul_rn(g, scale)));
    } else if (d_sub != nullptr && write) {
      store(d_sub, i, 0.0f);
    }
  }
};

template <typename Op>
void launch_dropout(const Op& op, int64_t n, const DropMask& mask, cudaStream_t stream) {
  if (n <= 0) return;
  dropout_kernel<<<grid_blocks((n + 3) / 4), kGridThreads, 0, stream>>>(op, n, mask);
  THPC_CUDA_CHECK_LAUNCH("dropout_kernel");
}

// ---- row copies, scale --------------------------------------------------------------

// dst[to, :] = src[from, :]; element-parallel so that each row copy is coalesced. Negative
// indices (which the CPU twin rejects) are skipped rather than written out of bounds.
template <typename T>
__global__ void copy_rows_kernel(T* dst, const int32_t* dst_rows, const T* src,
                                 const int32_t* src_rows, int count, int width) {
  const int64_t total = static_cast<int64_t>(count) * width;
  for (int64_t i = first_index(); i < total; i += grid_stride()) {
    const int64_t row = i / width;
    const int64_t col = i - row * width;
    const int64_t to = dst_rows != nullptr ? dst_rows[row] : row;
    const int64_t from = src_rows != nullptr ? src_rows[row] : row;
    if (to < 0 || from < 0) continue;
    dst[to * width + col] = src[from * width + col];
  }
}

__global__ void scale_kernel(float* x, int64_t n, float alpha) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) x[i] = __fmul_rn(x[i], alpha);
}

// ---- sum of squares -----------------------------------------------------------------

constexpr int kMaxPartials = 1024;

// The sum of v over the block, valid in thread 0; a fixed shuffle/shared tree, so the
// same inputs always give the same bits. blockDim.x must be a multiple of 32 (<= 1024).
__device__ double block_sum(double v) {
  __shared__ double warp_sums[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_down_sync(0xffffffffu, v, offset);
  if (lane == 0) warp_sums[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < static_cast<int>(blockDim.x >> 5) ? warp_sums[lane] : 0.0;
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_down_sync(0xffffffffu, v, offset);
  }
  return v;
}

__global__ void sum_squares_partial_kernel(const float* x, int64_t n, double* partials) {
  double acc = 0.0;
  for (int64_t i = first_index(); i < n; i += grid_stride()) {
    const double v = x[i];
    acc += v * v;
  }
  acc = block_sum(acc);
  if (threadIdx.x == 0) partials[blockIdx.x] = acc;
}

// One block: the partials summed in a fixed order.
__global__ void sum_partials_kernel(const double* partials, int count, double* total) {
  double acc = 0.0;
  for (int i = threadIdx.x; i < count; i += blockDim.x) acc += partials[i];
  acc = block_sum(acc);
  if (threadIdx.x == 0) *total = acc;
}

}  // namespace

void convert(void* dst, DType dst_dtype, const void* src, DType src_dtype, int64_t n,
             cudaStream_t stream) {
  THPC_CHECK((dst_dtype == DType::F32 || dst_dtype == DType::BF16) &&
                 (src_dtype == DType::F32 || src_dtype == DType::BF16),
             "the CUDA backend converts fp32 and bf16, not " << dtype_name(src_dtype) << " to "
                                                             << dtype_name(dst_dtype));
  if (n <= 0) return;
  if (dst_dtype == src_dtype) {
    if (dst != src) {
      THPC_CUDA_CHECK(cudaMemcpyAsync(dst, src, static_cast<size_t>(n) * dtype_size(dst_dtype),
                                      cudaMemcpyDeviceToDevice, stream));
    }
    return;
  }
  if (dst_dtype == DType::BF16) {
    convert_kernel<<<grid_blocks(n), kGridThreads, 0, stream>>>(static_cast<bf16*>(dst),
                                                         static_cast<const float*>(src), n);
  } else {
    convert_kernel<<<grid_blocks(n), kGridThreads, 0, stream>>>(static_cast<float*>(dst),
                                                         static_cast<const bf16*>(src), n);
  }
  THPC_CUDA_CHECK_LAUNCH("convert_kernel");
}

template <typename T>
void relu_forward(Context& context, T* y, const T* x, int64_t n) {
  const cudaStream_t stream = context.stream();
  if (n <= 0) return;
  relu_forward_kernel<<<grid_blocks(n), kGridThreads, 0, stream>>>(y, x, n);
  THPC_CUDA_CHECK_LAUNCH("relu_forward_kernel");
}

template <typename T>
void relu_backward(Context& context, T* dx, const T* dy, const T* y, int64_t n,
                   GradStore store) {
  const cudaStream_t stream = context.stream();
  if (n <= 0 || dx == nullptr) return;
  const bool write = writes_gradient(store, dx);
  relu_backward_kernel<<<grid_blocks(n), kGridThreads, 0, stream>>>(dx, dy, y, n, write);
  THPC_CUDA_CHECK_LAUNCH("relu_backward_kernel");
}

// Masks are the CPU's: element i is kept when dropout_keep(seed, site, step, stream, i, p).
template <typename T>
void dropout_forward(Context& context, T* y, const T* x, int64_t n, float p, DropoutKey key) {
  const cudaStream_t stream = context.stream();
  check_probability(p);
  launch_dropout(DropoutForwardOp<T>{y, x, keep_scale(p)}, n, make_mask(key, p, true), stream);
}

template <typename T>
void dropout_backward(Context& context, T* dx, const T* dy, int64_t n, float p,
                      DropoutKey key, GradStore store) {
  const cudaStream_t stream = context.stream();
  check_probability(p);
  if (dx == nullptr) return;
  const bool write = writes_gradient(store, dx);
  launch_dropout(DropoutBackwardOp<T>{dx, dy, keep_scale(p), write}, n,
                 make_mask(key, p, true), stream);
}

template <typename T>
void residual_dropout_forward(Context& context, T* y, const T* x, const T* sub, int64_t n,
                              float p, DropoutKey key) {
  const cudaStream_t stream = context.stream();
  check_probability(p);
  launch_dropout(ResidualForwardOp<T>{y, x, sub, keep_scale(p)}, n, make_mask(key, p, true),
                 stream);
}

template <typename T>
void residual_dropout_backward(Context& context, T* dx, T* d_sub, const T* dy, int64_t n,
                               float p, DropoutKey key, GradStore store) {
  const cudaStream_t stream = context.stream();
  check_probability(p);
  if (dx == nullptr && d_sub == nullptr) return;
  const bool write_dx = writes_gradient(store, dx);
  const bool write_d_sub = writes_gradient(store, d_sub);
  // Without d_sub the mask is not needed: dx += dy alone draws nothing.
  launch_dropout(ResidualBackwardOp<T>{dx, d_sub, dy, keep_scale(p), write_dx || write_d_sub},
                 n, make_mask(key, p, d_sub != nullptr), stream);
}

template <typename T>
void copy_rows(Context& context, T* dst, const int32_t* dst_rows, const T* src,
               const int32_t* src_rows, int count, int width) {
  const cudaStream_t stream = context.stream();
  if (count <= 0 || width <= 0) return;
  copy_rows_kernel<<<grid_blocks(static_cast<int64_t>(count) * width), kGridThreads, 0, stream>>>(
      dst, dst_rows, src, src_rows, count, width);
  THPC_CUDA_CHECK_LAUNCH("copy_rows_kernel");
}

// x *= alpha over fp32 values (T plays no part).
template <typename T>
void scale(Context& context, float* x, int64_t n, float alpha) {
  const cudaStream_t stream = context.stream();
  if (n <= 0) return;
  scale_kernel<<<grid_blocks(n), kGridThreads, 0, stream>>>(x, n, alpha);
  THPC_CUDA_CHECK_LAUNCH("scale_kernel");
}

// sum_i x_i^2 in double, in a fixed order; synchronises the stream to return it.
template <typename T>
double sum_squares(Context& context, const float* x, int64_t n) {
  if (n <= 0) return 0.0;
  const cudaStream_t stream = context.stream();
  // The grid depends on n only, so the summation order (and the bits) is fixed.
  const int blocks = static_cast<int>(
      std::min<int64_t>((n + kGridThreads - 1) / kGridThreads, static_cast<int64_t>(kMaxPartials)));
  double* partials = static_cast<double*>(context.scratch(sizeof(double) * (blocks + 1)));
  double* total = partials + blocks;
  sum_squares_partial_kernel<<<blocks, kGridThreads, 0, stream>>>(x, n, partials);
  THPC_CUDA_CHECK_LAUNCH("sum_squares_partial_kernel");
  sum_partials_kernel<<<1, kMaxPartials, 0, stream>>>(partials, blocks, total);
  THPC_CUDA_CHECK_LAUNCH("sum_partials_kernel");
  double* host = static_cast<double*>(context.pinned(sizeof(double)));
  THPC_CUDA_CHECK(cudaMemcpyAsync(host, total, sizeof(double), cudaMemcpyDeviceToHost, stream));
  THPC_CUDA_CHECK(cudaStreamSynchronize(stream));
  return *host;
}

// The same two kernels as sum_squares (the same grid, order and bits), the total written
// into totals' StepTotals::grad_squares instead of read back: nothing waits. Only the
// destination is new, so this takes no candidate switch.
template <typename T>
void sum_squares_into(Context& context, float* totals, const float* x, int64_t n) {
  THPC_CHECK(totals != nullptr, "sum_squares_into without its totals");
  double* grad_squares =
      reinterpret_cast<double*>(reinterpret_cast<char*>(totals) + offsetof(StepTotals, grad_squares));
  const cudaStream_t stream = context.stream();
  if (n <= 0) {
    THPC_CUDA_CHECK(cudaMemsetAsync(grad_squares, 0, sizeof(double), stream));
    return;
  }
  const int blocks = static_cast<int>(
      std::min<int64_t>((n + kGridThreads - 1) / kGridThreads, static_cast<int64_t>(kMaxPartials)));
  double* partials = static_cast<double*>(context.scratch(sizeof(double) * blocks));
  sum_squares_partial_kernel<<<blocks, kGridThreads, 0, stream>>>(x, n, partials);
  THPC_CUDA_CHECK_LAUNCH("sum_squares_partial_kernel");
  sum_partials_kernel<<<1, kMaxPartials, 0, stream>>>(partials, blocks, grad_squares);
  THPC_CUDA_CHECK_LAUNCH("sum_partials_kernel");
}

__global__ void write_step_inputs_kernel(StepInputs* inputs, StepInputs values) { *inputs = values; }

// One thread writing the 16 bytes, queued like any kernel, so that the host goes on at
// once (the step waits only for its totals; a captured pass's inputs are written before
// each replay; CudaCrossEntropy.AddedSumsMatchCpu reads the scale it writes). Until the
// H200 window of 2026-11-29 (the former candidate step_totals): a copy and a wait.
template <typename T>
void write_step_inputs(Context& context, float* inputs, StepInputs values) {
  THPC_CHECK(inputs != nullptr, "write_step_inputs without its buffer");
  const cudaStream_t stream = context.stream();
  write_step_inputs_kernel<<<1, 1, 0, stream>>>(reinterpret_cast<StepInputs*>(inputs), values);
  THPC_CUDA_CHECK_LAUNCH("write_step_inputs_kernel");
}

THPC_CUDA_TWIN(relu_forward)
THPC_CUDA_TWIN(relu_backward)
THPC_CUDA_TWIN(dropout_forward)
THPC_CUDA_TWIN(dropout_backward)
THPC_CUDA_TWIN(residual_dropout_forward)
THPC_CUDA_TWIN(residual_dropout_backward)
THPC_CUDA_TWIN(copy_rows)
THPC_CUDA_TWIN(scale)
THPC_CUDA_TWIN(sum_squares)
THPC_CUDA_TWIN(sum_squares_into)
THPC_CUDA_TWIN(write_step_inputs)

}  // namespace thpc::cuda
