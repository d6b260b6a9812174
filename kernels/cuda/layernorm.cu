// Layer normalization (Ba et al. 2016) on the GPU, after every residual connection:
// LayerNorm(x + Sublayer(x)) (§3.1). CPU twin: kernels/cpu/layernorm.cc.
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
// The column sums dgamma, dbeta are deterministic without atomics: a 2-D grid of blocks,
// each thread owning one column of one chunk of rows, sums its chunk in row order into a
// partial (Context scratch, [chunks, d] each); a second kernel adds the partials of each
// column in chunk order into dgamma/dbeta. Reads are coalesced across the columns.
#include <cstdint>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/device_util.cuh"

namespace thpc::cuda {
namespace {

constexpr int kRowsPerBlock = 8;               // warps per block in the row kernels
constexpr int kRowThreads = kRowsPerBlock * kWarp;
constexpr int kColumnThreads = 256;            // columns per block in the column sums
constexpr int kMinRowsPerChunk = 64;           // rows one thread sums for a partial
constexpr int kMaxChunks = 65535;              // gridDim.y limit

template <typename T>
__global__ void layernorm_forward_kernel(T* y, float* mean_out, float* rstd_out, const T* x,
                                         const T* gamma, const T* beta, int rows, int d,
                                         float eps) {
  const int lane = threadIdx.x % kWarp;
  const int row = blockIdx.x * kRowsPerBlock + threadIdx.x / kWarp;
  if (row >= rows) return;  // the whole warp leaves together
  const int64_t base = static_cast<int64_t>(row) * d;
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
__global__ void layernorm_backward_dx_kernel(T* dx, const T* dy, const T* x, const float* mean,
                                             const float* rstd, const T* gamma, int rows,
                                             int d) {
  const int lane = threadIdx.x % kWarp;
  const int row = blockIdx.x * kRowsPerBlock + threadIdx.x / kWarp;
  if (row >= rows) return;
  const int64_t base = static_cast<int64_t>(row) * d;
  const float row_mean = mean[row], row_rstd = rstd[row];
  float sum_g = 0.0f, sum_g_xhat = 0.0f;
  for (int col = lane; col < d; col += kWarp) {
    const float xhat = (load(x, base + col) - row_mean) * row_rstd;
    const float g = load(dy, base + col) * load(gamma, col);
    sum_g += g;
    sum_g_xhat += g * xhat;
  }
  const float mean_g = warp_sum(sum_g) / d;
  const float mean_g_xhat = warp_sum(sum_g_xhat) / d;
  for (int col = lane; col < d; col += kWarp) {
    const float xhat = (load(x, base + col) - row_mean) * row_rstd;
    const float g = load(dy, base + col) * load(gamma, col);
    store(dx, base + col, load(dx, base + col) + row_rstd * (g - mean_g - xhat * mean_g_xhat));
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

// dgamma[col] += sum over chunks (in order) of partial_gamma[chunk, col]; likewise dbeta.
__global__ void layernorm_param_finish_kernel(float* dgamma, float* dbeta,
                                              const float* partial_gamma,
                                              const float* partial_beta, int chunks, int d) {
  const int col = blockIdx.x * kColumnThreads + threadIdx.x;
  if (col >= d) return;
  float sum_gamma = 0.0f, sum_beta = 0.0f;
  for (int chunk = 0; chunk < chunks; ++chunk) {
    const int64_t index = static_cast<int64_t>(chunk) * d + col;
    if (dgamma != nullptr) sum_gamma += partial_gamma[index];
    if (dbeta != nullptr) sum_beta += partial_beta[index];
  }
  if (dgamma != nullptr) dgamma[col] += sum_gamma;
  if (dbeta != nullptr) dbeta[col] += sum_beta;
}

int row_blocks(int rows) { return (rows + kRowsPerBlock - 1) / kRowsPerBlock; }

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

// dx += ...; dgamma, dbeta += column sums in fp32, in a fixed order.
template <typename T>
void layernorm_backward(Context& context, T* dx, float* dgamma, float* dbeta, const T* dy,
                        const T* x, const float* mean, const float* rstd, const T* gamma,
                        int rows, int d) {
  if (rows == 0 || d == 0) return;
  cudaStream_t stream = context.stream();
  if (dx != nullptr) {
    layernorm_backward_dx_kernel<T><<<row_blocks(rows), kRowThreads, 0, stream>>>(
        dx, dy, x, mean, rstd, gamma, rows, d);
    THPC_CUDA_CHECK_LAUNCH("layernorm_backward_dx_kernel");
  }
  if (dgamma == nullptr && dbeta == nullptr) return;
  // The chunking depends only on rows, so the summation order is fixed for a shape.
  int rows_per_chunk = kMinRowsPerChunk;
  if ((rows + rows_per_chunk - 1) / rows_per_chunk > kMaxChunks) {
    rows_per_chunk = (rows + kMaxChunks - 1) / kMaxChunks;
  }
  const int chunks = (rows + rows_per_chunk - 1) / rows_per_chunk;
  const size_t partial_count = static_cast<size_t>(chunks) * d;
  float* partials = static_cast<float*>(context.scratch(2 * partial_count * sizeof(float)));
  float* partial_gamma = dgamma != nullptr ? partials : nullptr;
  float* partial_beta = dbeta != nullptr ? partials + partial_count : nullptr;
  const int column_blocks = (d + kColumnThreads - 1) / kColumnThreads;
  layernorm_param_partials_kernel<T><<<dim3(column_blocks, chunks), kColumnThreads, 0, stream>>>(
      partial_gamma, partial_beta, dy, x, mean, rstd, rows, d, rows_per_chunk);
  THPC_CUDA_CHECK_LAUNCH("layernorm_param_partials_kernel");
  layernorm_param_finish_kernel<<<column_blocks, kColumnThreads, 0, stream>>>(
      dgamma, dbeta, partial_gamma, partial_beta, chunks, d);
  THPC_CUDA_CHECK_LAUNCH("layernorm_param_finish_kernel");
}

THPC_CUDA_TWIN(layernorm_forward)
THPC_CUDA_TWIN(layernorm_backward)

}  // namespace thpc::cuda
