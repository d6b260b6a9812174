// Int8 products on the GPU (kernels/cuda/int8_cuda_backend.h has the formulas): the row
// quantization, cuBLASLt's int8 GEMM, the dequantization, and the backend that takes
// them for the decoder's weight matrices.
//
// Shape: decoding multiplies few rows (batch x beam, 128 at batch 32 and beam 4) by
// whole weight matrices, so a product reads its weights once and little else: it is
// bound by the weights' bytes, which int8 halves against bf16. The two row passes read
// x [M, K] and write y [M, N] once each, and the int32 products [M, N] make one round
// trip: small beside the weights at these M.
#include "kernels/cuda/int8_cuda_backend.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <mutex>
#include <tuple>
#include <vector>

#include "common/error.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/lt_plan.cuh"

namespace thpc {
namespace cuda {
namespace {

constexpr int kQuantizeThreads = 256;  // one block per row

size_t aligned(size_t bytes) { return (bytes + 255) / 256 * 256; }

// The largest |x| of the block's threads, to every thread (one warp shuffle tree, then
// the warps' maxima through shared memory; max is exact whatever the order).
__device__ float block_max(float value) {
  __shared__ float warp_largest[kQuantizeThreads / kWarp];
  value = warp_max(value);
  if (threadIdx.x % kWarp == 0) warp_largest[threadIdx.x / kWarp] = value;
  __syncthreads();
  float largest = warp_largest[0];
  for (int w = 1; w < kQuantizeThreads / kWarp; ++w) largest = fmaxf(largest, warp_largest[w]);
  return largest;
}

// Row m of x: s_m = max |x| / 127 and xq = round(x * (127 / max)) held to [-127, 127],
// as cpu::quantize_row (which adds 128 for its unsigned products); a row of zeros has
// s_m = 0 and xq = 0; a row holding a NaN or an infinity has s_m = NaN and xq = 0.
template <typename T>
__global__ void __launch_bounds__(kQuantizeThreads)
    quantize_rows_kernel(int8_t* xq, float* row_scales, const T* x, int K) {
  const int64_t m = blockIdx.x;
  const T* row = x + m * K;
  int8_t* out = xq + m * K;
  float largest = 0.0f;
  int finite = 1;
  for (int k = threadIdx.x; k < K; k += kQuantizeThreads) {
    const float value = to_float(row[k]);
    finite &= isfinite(value) ? 1 : 0;
    largest = fmaxf(largest, fabsf(value));
  }
  finite = __syncthreads_and(finite);
  largest = block_max(largest);
  if (!finite) {
    for (int k = threadIdx.x; k < K; k += kQuantizeThreads) out[k] = 0;
    if (threadIdx.x == 0) row_scales[m] = NAN;
    return;
  }
  const float inverse = largest > 0.0f ? 127.0f / largest : 0.0f;
  for (int k = threadIdx.x; k < K; k += kQuantizeThreads) {
    // __fmul_rn: one rounding, as the CPU's product (no contraction into what follows).
    const float q = rintf(__fmul_rn(to_float(row[k]), inverse));
    out[k] = static_cast<int8_t>(fminf(fmaxf(q, -127.0f), 127.0f));
  }
  if (threadIdx.x == 0) row_scales[m] = largest / 127.0f;
}

// y[m, n] = float(acc[m, n]) * (s_m * s_n) + b[n] (+ 0 without a bias), then the ReLU as
// the CPU writes it (a NaN becomes 0); each operation rounded on its own, as on the CPU.
template <typename T>
__global__ void dequantize_kernel(T* y, const int32_t* acc, const float* row_scales,
                                  const float* column_scales, const T* b, int M, int N,
                                  bool relu) {
  const int64_t total = static_cast<int64_t>(M) * N;
  for (int64_t i = first_index(); i < total; i += grid_stride()) {
    const int64_t m = i / N;
    const int n = static_cast<int>(i - m * N);
    const float scale = __fmul_rn(row_scales[m], column_scales[n]);
    float value = __fadd_rn(__fmul_rn(__int2float_rn(acc[i]), scale),
                            b != nullptr ? to_float(b[n]) : 0.0f);
    if (relu) value = value > 0.0f ? value : 0.0f;
    y[i] = from_float<T>(value);
  }
}

// acc [M, N] row-major (= [N, M] column-major) = xq [M, K] Wq[N, K]^T, in cuBLASLt's
// column-major terms C = op(A) op(B) with A = Wq stored [K, N] (ld K) and transposed,
// B = xq stored [K, M] (ld K): the "TN" case of its int8 tensor-core kernels. One plan
// (descriptors and the heuristic's algorithm) per shape, kept.
class Int8Plans {
 public:
  ~Int8Plans() {
    for (auto& entry : plans_) entry.second.destroy();
  }

  void multiply(Context& context, int32_t* acc, const int8_t* weights, const int8_t* xq, int M,
                int K, int N) {
    std::lock_guard<std::mutex> lock(mutex_);
    const LtPlan& plan = get(context, M, K, N);
    const int32_t alpha = 1, beta = 0;
    if (!plan.usable) {
      // No cuBLASLt kernel for this shape: cublasGemmEx's int8 path, the same integers.
      THPC_CUBLAS_CHECK(cublasGemmEx(context.blas(), CUBLAS_OP_T, CUBLAS_OP_N, N, M, K, &alpha,
                                     weights, CUDA_R_8I, K, xq, CUDA_R_8I, K, &beta, acc,
                                     CUDA_R_32I, N, CUBLAS_COMPUTE_32I, CUBLAS_GEMM_DEFAULT));
      return;
    }
    THPC_CUBLAS_CHECK(cublasLtMatmul(context.lt(), plan.desc, &alpha, weights, plan.a, xq, plan.b,
                                     &beta, acc, plan.c, acc, plan.c, &plan.algo,
                                     context.lt_workspace(), context.lt_workspace_bytes(),
                                     context.stream()));
  }

 private:
  const LtPlan& get(Context& context, int M, int K, int N) {
    const auto key = std::make_tuple(context.device(), M, K, N);
    const auto found = plans_.find(key);
    if (found != plans_.end()) return found->second;
    LtPlan plan;
    THPC_CUBLAS_CHECK(cublasLtMatmulDescCreate(&plan.desc, CUBLAS_COMPUTE_32I, CUDA_R_32I));
    const int32_t transpose = CUBLAS_OP_T, keep = CUBLAS_OP_N;
    THPC_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_TRANSA,
                                                     &transpose, sizeof(transpose)));
    THPC_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_TRANSB,
                                                     &keep, sizeof(keep)));
    THPC_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan.a, CUDA_R_8I, K, N, K));
    THPC_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan.b, CUDA_R_8I, K, M, K));
    THPC_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan.c, CUDA_R_32I, N, M, N));
    cublasLtMatmulPreference_t preference = nullptr;
    THPC_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&preference));
    const uint64_t workspace = context.lt_workspace_bytes();
    THPC_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
        preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace, sizeof(workspace)));
    plan.choose_algorithm(context.lt(), preference);
    return plans_.emplace(key, plan).first->second;
  }

  std::map<std::tuple<int, int, int, int>, LtPlan> plans_;
  std::mutex mutex_;
};

Int8Plans& int8_plans() {
  static Int8Plans plans;
  return plans;
}

}  // namespace

template <typename T>
void int8_linear(Context& context, T* y, const T* x, const int8_t* weights,
                 const float* column_scales, const T* b, int M, int K, int N, bool relu) {
  THPC_CHECK(M >= 0 && K > 0 && N > 0, "an int8 product of " << M << " x " << K << " by " << K
                                                             << " x " << N);
  // cuBLAS's int8 kernels (and cublasGemmEx's) ask for leading dimensions that are
  // multiples of 4; Int8CudaBackend::adopt keeps other matrices in float.
  THPC_CHECK(K % 4 == 0 && N % 4 == 0,
             "int8 products need K and N multiples of 4, not " << K << " and " << N);
  if (M == 0) return;
  const cudaStream_t stream = context.stream();
  const size_t xq_bytes = aligned(static_cast<size_t>(M) * K);
  const size_t scales_bytes = aligned(sizeof(float) * static_cast<size_t>(M));
  char* scratch = static_cast<char*>(
      context.scratch(xq_bytes + scales_bytes + sizeof(int32_t) * static_cast<size_t>(M) * N));
  int8_t* xq = reinterpret_cast<int8_t*>(scratch);
  float* row_scales = reinterpret_cast<float*>(scratch + xq_bytes);
  int32_t* acc = reinterpret_cast<int32_t*>(scratch + xq_bytes + scales_bytes);
  quantize_rows_kernel<T><<<M, kQuantizeThreads, 0, stream>>>(xq, row_scales, x, K);
  THPC_CUDA_CHECK_LAUNCH("quantize_rows_kernel");
  int8_plans().multiply(context, acc, weights, xq, M, K, N);
  dequantize_kernel<T><<<grid_blocks(static_cast<int64_t>(M) * N), kGridThreads, 0, stream>>>(
      y, acc, row_scales, column_scales, b, M, N, relu);
  THPC_CUDA_CHECK_LAUNCH("dequantize_kernel");
}

template void int8_linear<float>(Context&, float*, const float*, const int8_t*, const float*,
                                 const float*, int, int, int, bool);
template void int8_linear<bf16>(Context&, bf16*, const bf16*, const int8_t*, const float*,
                                const bf16*, int, int, int, bool);

}  // namespace cuda

Int8CudaMatrix::~Int8CudaMatrix() {
  if (values != nullptr) cuda::free_device_memory(values);  // no throw in a destructor
  if (scales != nullptr) cuda::free_device_memory(scales);
  if (context != nullptr) context->count_free(bytes);
}

Int8CudaBackend::Int8CudaBackend(std::unique_ptr<Backend> cuda_backend)
    : Int8ProductsBackend(*cuda_backend), cuda_backend_(std::move(cuda_backend)) {
  THPC_CHECK(cuda::context_of(*cuda_backend_) != nullptr,
             "Int8CudaBackend wraps a CUDA backend, not " << cuda_backend_->name());
}

Int8CudaBackend::~Int8CudaBackend() {
  // The stream may still read the matrices.
  cudaStreamSynchronize(cuda::context_of(*cuda_backend_)->stream());
  forget_matrices();
}

bool Int8CudaBackend::adopt(Tensor weights, const cpu::QuantizedWeights& quantized) {
  const int K = quantized.inputs, N = quantized.outputs;
  THPC_CHECK(weights && K > 0 && N > 0 && weights.numel == static_cast<int64_t>(K) * N &&
                 quantized.values.size() == static_cast<size_t>(K) * N &&
                 quantized.scales.size() == static_cast<size_t>(N),
             "int8 weights of " << K << " x " << N << " for a tensor of " << weights.numel);
  // -128 is the one int8 value outside the symmetric range the scales assume.
  for (const int8_t value : quantized.values) {
    THPC_CHECK(value != -128, "an int8 weight of -128 (outside +-127)");
  }
  // A matrix cuBLAS's int8 kernels cannot take (K or N not a multiple of 4: a vocabulary
  // of another size) keeps its float product.
  if (K % 4 != 0 || N % 4 != 0) return false;
  // Wq [K, N] -> [N, K]: each output's weights together, the layout the TN kernels read.
  std::vector<int8_t> by_output(quantized.values.size());
  for (int k = 0; k < K; ++k) {
    for (int n = 0; n < N; ++n) {
      by_output[static_cast<size_t>(n) * K + k] = quantized.values[static_cast<size_t>(k) * N + n];
    }
  }
  cuda::Context& context = *cuda::context_of(*cuda_backend_);
  // A decoding step captured before this adoption holds the float product: counted as a
  // free (of nothing), it makes every graph taken before now refused at its next replay,
  // so that the step is captured again with the int8 product.
  context.count_free(0);
  auto matrix = std::make_unique<Int8CudaMatrix>();
  matrix->input_count = K;
  matrix->output_count = N;
  THPC_CUDA_CHECK(cudaMalloc(&matrix->values, by_output.size()));
  THPC_CUDA_CHECK(cudaMalloc(&matrix->scales, sizeof(float) * quantized.scales.size()));
  matrix->context = &context;
  matrix->bytes = by_output.size() + sizeof(float) * quantized.scales.size();
  context.count_allocation(matrix->bytes);
  // On the context's stream, waited for: a plain cudaMemcpy from pageable memory may return
  // before its last DMA lands, and it runs on the legacy stream, to which the context's
  // non-blocking stream (where the products run) is not ordered; the host vectors also end
  // with this function.
  THPC_CUDA_CHECK(cudaMemcpyAsync(matrix->values, by_output.data(), by_output.size(),
                                  cudaMemcpyHostToDevice, context.stream()));
  THPC_CUDA_CHECK(cudaMemcpyAsync(matrix->scales, quantized.scales.data(),
                                  sizeof(float) * quantized.scales.size(), cudaMemcpyHostToDevice,
                                  context.stream()));
  THPC_CUDA_CHECK(cudaStreamSynchronize(context.stream()));
  keep(weights, std::move(matrix));
  return true;
}

void Int8CudaBackend::multiply(Tensor y, Tensor x, const Int8CudaMatrix& matrix, Tensor b,
                               int M, bool relu) {
  THPC_CHECK(y.dtype == x.dtype && y.dtype == compute_dtype() && (!b || b.dtype == y.dtype),
             "int8 product of " << dtype_name(x.dtype) << " rows on " << name());
  cuda::Context& context = *cuda::context_of(*cuda_backend_);
  if (y.dtype == DType::BF16) {
    cuda::int8_linear<cuda::bf16>(context, static_cast<cuda::bf16*>(y.data),
                                  static_cast<const cuda::bf16*>(x.data), matrix.values,
                                  matrix.scales, static_cast<const cuda::bf16*>(b.data), M,
                                  matrix.input_count, matrix.output_count, relu);
  } else {
    cuda::int8_linear<float>(context, static_cast<float*>(y.data),
                             static_cast<const float*>(x.data), matrix.values, matrix.scales,
                             static_cast<const float*>(b.data), M, matrix.input_count,
                             matrix.output_count, relu);
  }
}

}  // namespace thpc
