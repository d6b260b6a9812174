// Dense layers and the tied output projection on the GPU (CPU twin: kernels/cpu/linear.cc).
//
//   linear:            y = x W + b                      (every projection of §3.2.2, FFN §3.3)
//                      dx += dy W^T,  dW += x^T dy,  db += colsum(dy)
//   output projection: logits = h E^T                   (weights shared with the embedding, §3.4)
//                      dh += d_logits E,  dE += d_logits^T h
//
// Every product is one cuBLASLt matmul with fp32 accumulation (CUBLAS_COMPUTE_32F, so no
// TF32 in the fp32 mode): 2*M*K*N FLOPs against (M*K + K*N + M*N) elements moved, i.e.
// hundreds of FLOPs per byte at model sizes, so these ops are GEMM(tensor-core)-bound and
// nothing is gained by hand-written kernels. The bias of the forward pass is fused as the
// BIAS epilogue (its vector has D's type, T: see CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE), the
// bias gradient is one more GEMM, dy^T times a vector of ones, accumulated in fp32 into db
// (an M-long dot product per column, ~M*N FLOPs, memory-bound but reads dy once).
//
// Row-major <-> column-major: a row-major [R, C] matrix is a column-major [C, R] one, so
// each row-major product P = X Y is computed as the column-major P^T = Y^T X^T.
//
// Determinism: cuBLAS(Lt) gives bit-identical results for identical calls on one GPU model
// and toolkit; the algorithm is chosen once per shape and cached, and split-K reductions
// are restricted to the kinds that sum partials in fp32 in a separate, ordered pass (never
// in bf16 in the output buffer), so nothing here depends on timing.
//
// The FFN's first layer, max(0, x W1 + b1) (§3.3), fuses its ReLU into the same matmul as
// the RELU_BIAS epilogue (RELU without a bias), so the [M, d_ff] hidden layer is written
// once, already rectified, instead of written, read and written again by a ReLU kernel
// (base: 25,000 x 2,048 bf16 = 102 MB a side and layer, two transfers of it saved per
// FFN, 12 FFNs a step: ~2.5 GB, ~0.8 ms at 3 TB/s). Where the product takes the
// cublasGemmEx path the ReLU runs after it as relu_forward. Its backward,
// relu_bias_backward, is one pass over [rows, d_ff] (read dy, y and d_pre, write d_pre)
// that also sums the bias gradient's columns (column_sums.cuh), where the unfused layer
// read d_pre once more in a ones-vector GEMM for db.
//
// Fallback: when cuBLASLt's heuristic offers no algorithm (an alignment or type it does
// not cover), or THPC_GEMM_FALLBACK=1 is set (the tests use it to check that path), the
// product goes through cublasGemmEx with the same types and fp32 compute; the bias is then
// written into the output first and the GEMM adds onto it (beta = 1).
#include <array>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/error.h"
#include "common/philox.h"
#include "kernels/cuda/column_sums.cuh"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/lt_plan.cuh"
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/grad_store.cuh"
#include "kernels/gemm_sweep.h"

namespace thpc::cuda {
namespace {

template <typename T>
constexpr cudaDataType_t cuda_type();
template <>
constexpr cudaDataType_t cuda_type<float>() { return CUDA_R_32F; }
template <>
constexpr cudaDataType_t cuda_type<bf16>() { return CUDA_R_16BF; }

// One column-major product D = alpha op(A) op(B) + beta C with C = D, optional bias
// (length m, type of C, only with beta = 0), and with relu the ReLU of the result (only
// with beta = 0).
struct Gemm {
  cublasOperation_t trans_a = CUBLAS_OP_N, trans_b = CUBLAS_OP_N;
  int m = 0, n = 0, k = 0;
  const void* A = nullptr;
  int lda = 0;
  const void* B = nullptr;
  int ldb = 0;
  void* C = nullptr;
  int ldc = 0;
  cudaDataType_t ab_type = CUDA_R_32F, c_type = CUDA_R_32F;
  float beta = 0.0f;
  const void* bias = nullptr;
  bool relu = false;
  // The ReLU's bit-mask (candidate relu_masks): with relu, written beside D (RELU_AUX);
  // with drelu, read to zero D where the forward's ReLU was (DRELU). aux_ld in bits.
  void* aux = nullptr;
  int64_t aux_ld = 0;
  bool drelu = false;
  // Where it runs: null, the context's stream and cuBLASLt workspace; else the side
  // stream's (candidate weight_grads_beside), for cuBLASLt plans only (cublasGemmEx's
  // handle is bound to the context's stream).
  cudaStream_t stream = nullptr;
  void* workspace = nullptr;
  // The sums of A's rows over k written here, fp32, m of them (BGRADA: candidate
  // bias_grads_in_gemm, a layer's bias gradient in its weight gradient's product); never
  // with a bias.
  float* bias_grad = nullptr;
};

// The cuBLASLt epilogue of a product: its bias and ReLU applied before D is stored, the
// ReLU's mask written (forward) or applied (backward) with an aux buffer.
uint32_t epilogue_of(const Gemm& g) {
  if (g.bias_grad != nullptr) return CUBLASLT_EPILOGUE_BGRADA;
  if (g.drelu) return CUBLASLT_EPILOGUE_DRELU;
  if (g.relu && g.aux != nullptr) {
    return g.bias != nullptr ? CUBLASLT_EPILOGUE_RELU_AUX_BIAS : CUBLASLT_EPILOGUE_RELU_AUX;
  }
  if (g.relu) return g.bias != nullptr ? CUBLASLT_EPILOGUE_RELU_BIAS : CUBLASLT_EPILOGUE_RELU;
  return g.bias != nullptr ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
}

// Whether a product asks for an epilogue that only cuBLASLt's path gives (the cublasGemmEx
// fallback adds the bias alone).
bool asks_epilogue(const Gemm& g) {
  return g.relu || g.drelu || g.aux != nullptr || g.bias_grad != nullptr;
}

// The largest power of two (<= 256) dividing the address: what cuBLASLt may assume.
uint32_t alignment_of(const void* pointer) {
  const auto address = reinterpret_cast<uintptr_t>(pointer);
  uint32_t alignment = 1;
  while (alignment < 256 && address % (2 * alignment) == 0) alignment *= 2;
  return alignment;
}

// C[i + j*ldc] = bias ? bias[i] : 0 for i < m, j < n (column-major m x n): the bias
// broadcast along the columns, i.e. along the rows of the row-major output.
template <typename T>
__global__ void fill_columns_kernel(T* C, int ldc, int m, int n, const T* bias) {
  const int64_t count = static_cast<int64_t>(m) * n;
  for (int64_t index = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
       index < count; index += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int i = static_cast<int>(index % m);
    const int64_t j = index / m;
    C[i + j * ldc] = bias != nullptr ? bias[i] : static_cast<T>(0.0f);
  }
}

template <typename T>
__global__ void fill_value_kernel(T* values, int n, float value) {
  const int index = blockIdx.x * blockDim.x + threadIdx.x;
  if (index < n) values[index] = static_cast<T>(value);
}

constexpr int kFillThreads = 256;

int fill_blocks(int64_t count) {
  const int64_t blocks = (count + kFillThreads - 1) / kFillThreads;
  return static_cast<int>(blocks < 65536 ? blocks : 65536);  // grid-stride beyond
}

void fill_columns(void* C, cudaDataType_t type, int ldc, int m, int n, const void* bias,
                  cudaStream_t stream) {
  const int64_t count = static_cast<int64_t>(m) * n;
  if (count == 0) return;
  if (type == CUDA_R_32F) {
    fill_columns_kernel<float><<<fill_blocks(count), kFillThreads, 0, stream>>>(
        static_cast<float*>(C), ldc, m, n, static_cast<const float*>(bias));
  } else {
    fill_columns_kernel<bf16><<<fill_blocks(count), kFillThreads, 0, stream>>>(
        static_cast<bf16*>(C), ldc, m, n, static_cast<const bf16*>(bias));
  }
  THPC_CUDA_CHECK_LAUNCH("fill_columns_kernel");
}

// A cached cuBLASLt plan (lt_plan.cuh); unusable: cublasGemmEx instead.
using Plan = LtPlan;

// Everything the descriptors and the heuristic's choice depend on.
using PlanKey = std::array<int64_t, 22>;

PlanKey key_of(const Context& context, const Gemm& g) {
  return {context.device(), g.trans_a, g.trans_b, g.m, g.n, g.k, g.lda, g.ldb,
          g.ldc, g.ab_type, g.c_type, g.bias != nullptr,
          alignment_of(g.A), alignment_of(g.B), alignment_of(g.C),
          g.bias != nullptr ? alignment_of(g.bias) : 0,
          static_cast<int64_t>(context.lt_workspace_bytes()), g.relu,
          g.drelu, g.aux_ld, g.aux != nullptr ? alignment_of(g.aux) : 0,
          g.bias_grad != nullptr ? alignment_of(g.bias_grad) : 0};
}

// The plan's matmul descriptor and matrix layouts for `g`: its transposes, epilogue, bias
// and mask (their pointers, whose alignments the heuristic reads), A, B and C (C and D
// alike).
void describe(Plan& plan, const Gemm& g) {
  THPC_CUBLAS_CHECK(cublasLtMatmulDescCreate(&plan.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const int32_t trans_a = g.trans_a, trans_b = g.trans_b;
  THPC_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_TRANSA,
                                                   &trans_a, sizeof(trans_a)));
  THPC_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_TRANSB,
                                                   &trans_b, sizeof(trans_b)));
  const uint32_t epilogue = epilogue_of(g);
  THPC_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_EPILOGUE,
                                                   &epilogue, sizeof(epilogue)));
  if (g.bias != nullptr) {
    const int32_t bias_type = g.c_type;  // the bias has the output's type
    THPC_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(
        plan.desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type, sizeof(bias_type)));
    // The heuristic reads the pointer's alignment.
    THPC_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                     &g.bias, sizeof(g.bias)));
  }
  if (g.bias_grad != nullptr) {  // the sums have D's type (cublasLt.h): fp32, a dW's
    // One bias pointer a product: a bias added and sums asked for would lose the bias.
    THPC_CHECK(g.bias == nullptr, "a product asked both to add a bias and to sum its rows");
    THPC_CHECK(g.c_type == CUDA_R_32F, "a product's row sums are fp32 here, its D is not");
    const int32_t sums_type = CUDA_R_32F;
    THPC_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(
        plan.desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &sums_type, sizeof(sums_type)));
    THPC_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(
        plan.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &g.bias_grad, sizeof(g.bias_grad)));
  }
  if (g.aux != nullptr) {
    // The bit-mask's leading dimension (bits, a multiple of 128 and at least m); the
    // heuristic reads the pointer's alignment, as the bias's.
    THPC_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(
        plan.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &g.aux_ld, sizeof(g.aux_ld)));
    THPC_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(
        plan.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &g.aux, sizeof(g.aux)));
  }
  // Stored shapes: op(A) is m x k, op(B) is k x n, C is m x n.
  const bool ta = g.trans_a != CUBLAS_OP_N, tb = g.trans_b != CUBLAS_OP_N;
  THPC_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan.a, g.ab_type, ta ? g.k : g.m,
                                               ta ? g.m : g.k, g.lda));
  THPC_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan.b, g.ab_type, tb ? g.n : g.k,
                                               tb ? g.k : g.n, g.ldb));
  THPC_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan.c, g.c_type, g.m, g.n, g.ldc));
}

// What the heuristic may choose from for `g` (the caller destroys it): the context's
// workspace, split-K only with ordered fp32 partials, the pointers' actual alignments.
cublasLtMatmulPreference_t preference_for(const Context& context, const Gemm& g) {
  cublasLtMatmulPreference_t preference = nullptr;
  THPC_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&preference));
  const uint64_t workspace = context.lt_workspace_bytes();
  THPC_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace, sizeof(workspace)));
  // Split-K only with partials summed in fp32 in a separate pass: no bf16 partial sums.
  const uint32_t reductions = CUBLASLT_REDUCTION_SCHEME_NONE | CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
  THPC_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      preference, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &reductions, sizeof(reductions)));
  // The actual alignments (weights are slices of one flat buffer, not 256-aligned).
  const uint32_t align_a = alignment_of(g.A), align_b = alignment_of(g.B),
                 align_c = alignment_of(g.C);
  THPC_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align_a, sizeof(align_a)));
  THPC_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align_b, sizeof(align_b)));
  THPC_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align_c, sizeof(align_c)));
  THPC_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align_c, sizeof(align_c)));
  return preference;
}

// A product's uses, counted for transformer_bench_step --gemm-sweep (count_gemm_uses):
// the call as first seen (its pointers' values kept for their alignments only).
struct ProductUses {
  Gemm call;
  int64_t uses = 0;
};

class PlanCache {
 public:
  ~PlanCache() { clear(); }
  std::mutex& mutex() { return mutex_; }
  // Callers hold mutex().
  Plan& get(Context& context, const Gemm& g);
  // The cuBLASLt product `g` ran (callers hold mutex()): counted by its key from
  // count_uses_from_now() on, the call kept as first seen.
  void used(Context& context, const Gemm& g) {
    if (!counting_) return;
    ProductUses& entry = uses_[key_of(context, g)];
    if (entry.uses++ == 0) entry.call = g;
  }
  void count_uses_from_now() {
    std::lock_guard<std::mutex> lock(mutex_);
    uses_.clear();
    counting_ = true;
  }
  std::vector<ProductUses> uses() {
    std::lock_guard<std::mutex> lock(mutex_);
    std::vector<ProductUses> all;
    for (const auto& entry : uses_) all.push_back(entry.second);
    return all;
  }

 private:
  void clear() {
    for (auto& entry : plans_) entry.second.destroy();
    plans_.clear();
  }
  // The row count M follows the batch, so shapes keep coming; past this many plans the
  // cache starts over (the heuristic is deterministic: a re-made plan is the same).
  static constexpr size_t kMaxPlans = 4096;
  std::map<PlanKey, Plan> plans_;
  bool counting_ = false;
  std::map<PlanKey, ProductUses> uses_;
  std::mutex mutex_;
};

PlanCache& plan_cache() {
  static PlanCache cache;
  return cache;
}

Plan& PlanCache::get(Context& context, const Gemm& g) {
  const PlanKey key = key_of(context, g);
  auto found = plans_.find(key);
  if (found != plans_.end()) return found->second;
  if (plans_.size() >= kMaxPlans) clear();

  Plan plan;
  try {
    describe(plan, g);
    // Only the sums are optional: without them the caller takes the ones product.
    plan.choose_algorithm(context.lt(), preference_for(context, g), g.bias_grad != nullptr);
  } catch (...) {
    plan.destroy();  // the descriptors made before the failure
    throw;
  }
  return plans_.emplace(key, plan).first->second;
}

bool fallback_forced() {
  const char* value = std::getenv("THPC_GEMM_FALLBACK");
  return value != nullptr && std::strcmp(value, "1") == 0;
}

void gemm_ex(Context& context, const Gemm& g) {
  THPC_CHECK(g.stream == nullptr, "a cublasGemmEx product queued beside the context's stream");
  float beta = g.beta;
  if (g.bias != nullptr) {
    fill_columns(g.C, g.c_type, g.ldc, g.m, g.n, g.bias, context.stream());
    beta = 1.0f;
  }
  const float alpha = 1.0f;
  THPC_CUBLAS_CHECK(cublasGemmEx(context.blas(), g.trans_a, g.trans_b, g.m, g.n, g.k, &alpha,
                                 g.A, g.ab_type, g.lda, g.B, g.ab_type, g.ldb, &beta, g.C,
                                 g.c_type, g.ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

// Whether a product goes to cublasGemmEx without asking cuBLASLt: forced, or a misaligned
// bias. cuBLASLt's BIAS epilogue reads the bias with vector loads: a bias that is not
// 16-byte aligned (a slice of the flat parameter buffer at an odd offset, e.g. d_model not
// a multiple of 8 in bf16) may be accepted by the heuristic and then fail or misread at
// run time. Such products take the cublasGemmEx path with the bias written first.
bool bypasses_lt(const Gemm& g) {
  return fallback_forced() || (g.bias != nullptr && alignment_of(g.bias) < 16) ||
         (g.bias_grad != nullptr && alignment_of(g.bias_grad) < 16);
}

// Returns whether the epilogue asked for (g.relu, the mask's g.aux, g.drelu or the sums of
// g.bias_grad) was applied; when it was asked for and not, D holds the plain product
// (+ bias) and the caller applies the rest (the cublasGemmEx path and the empty product have
// no epilogue; a product without columns, n = 0, computes no sums of A's rows either).
bool gemm(Context& context, const Gemm& g) {
  if (g.m == 0 || g.n == 0) return g.m == 0 || g.bias_grad == nullptr;
  const cudaStream_t stream = g.stream != nullptr ? g.stream : context.stream();
  void* workspace = g.workspace != nullptr ? g.workspace : context.lt_workspace();
  if (g.k == 0) {  // an empty product: D = beta C + bias
    if (g.beta == 0.0f) fill_columns(g.C, g.c_type, g.ldc, g.m, g.n, g.bias, stream);
    return !asks_epilogue(g);  // beta = 1 (accumulation): nothing to add
  }
  if (bypasses_lt(g)) {
    gemm_ex(context, g);
    return !asks_epilogue(g);
  }
  PlanCache& cache = plan_cache();
  std::lock_guard<std::mutex> lock(cache.mutex());
  Plan& plan = cache.get(context, g);
  if (!plan.usable) {
    gemm_ex(context, g);
    return !asks_epilogue(g);
  }
  if (g.bias != nullptr) {  // same alignment as when planned (it is in the key)
    THPC_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                     &g.bias, sizeof(g.bias)));
  }
  if (g.bias_grad != nullptr) {  // likewise
    THPC_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(
        plan.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &g.bias_grad, sizeof(g.bias_grad)));
  }
  if (g.aux != nullptr) {  // likewise
    THPC_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(
        plan.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &g.aux, sizeof(g.aux)));
  }
  const float alpha = 1.0f;
  THPC_CUBLAS_CHECK(cublasLtMatmul(context.lt(), plan.desc, &alpha, g.A, plan.a, g.B, plan.b,
                                   &g.beta, g.C, plan.c, g.C, plan.c, &plan.algo, workspace,
                                   context.lt_workspace_bytes(), stream));
  cache.used(context, g);
  return true;
}

// Whether `g` runs through a cuBLASLt plan (not cublasGemmEx): what a product queued on
// the side stream must (a plan made here is the one gemm() then takes: the same key).
bool takes_lt_plan(Context& context, const Gemm& g) {
  if (bypasses_lt(g)) return false;
  PlanCache& cache = plan_cache();
  std::lock_guard<std::mutex> lock(cache.mutex());
  return cache.get(context, g).usable;
}

// Block (blockIdx.x, chunk = blockIdx.y): thread -> column of [rows, n]; over the rows of
// its chunk in order, g = dy where y > 0 (else 0): d_pre += g (if d_pre; with `write`
// d_pre = 0 + g, not loaded), and the sum of g into partial[chunk * n + col] (if partial).
template <typename T>
__global__ void relu_bias_backward_kernel(T* d_pre, float* partial, const T* dy, const T* y,
                                          int rows, int n, int rows_per_chunk, bool write) {
  const int col = blockIdx.x * kColumnThreads + threadIdx.x;
  if (col >= n) return;
  const int chunk = blockIdx.y;
  const int first = chunk * rows_per_chunk;
  const int last = min(rows, first + rows_per_chunk);
  float sum = 0.0f;
  for (int row = first; row < last; ++row) {
    const int64_t i = static_cast<int64_t>(row) * n + col;
    if (load(y, i) > 0.0f) {  // as relu_backward: where y <= 0, d_pre keeps its value
      const float g = load(dy, i);
      if (d_pre != nullptr) store(d_pre, i, __fadd_rn(write ? 0.0f : load(d_pre, i), g));
      sum += g;
    } else if (write && d_pre != nullptr) {
      store(d_pre, i, 0.0f);  // ... which writing makes 0
    }
  }
  if (partial != nullptr) partial[static_cast<int64_t>(chunk) * n + col] = sum;
}

// relu_bias_backward_kernel with each thread owning kVector<T> adjacent columns, moved by
// 16-byte loads and stores: the same sums in the same order, so bit for bit the same
// results. Taken whenever n % kVector<T> == 0 and d_pre, dy and y are 16-byte aligned.
// Why: the scalar kernel's loads (64 bytes a warp, one row at a time, d_pre and dy only
// after y) took 3.60 ms of the base step on an H100 for ~1.2 ms of bytes (12 calls over
// [25,000 x 2,048] bf16: dy, y, d_pre read, d_pre written); here every load of a row is
// independent of the others, a group of rows' loads is in flight per thread at once, and
// the class took 2.02 ms (2026-11-26, bench/RESULTS.md, with its twins and memcheck).
template <typename T>
__global__ void __launch_bounds__(kColumnThreads)
    relu_bias_backward_vector_kernel(T* d_pre, float* partial, const T* dy, const T* y,
                                     int rows, int n, int rows_per_chunk, bool write) {
  constexpr int W = kVector<T>;
  const int col = (blockIdx.x * kColumnThreads + threadIdx.x) * W;
  if (col >= n) return;
  const int chunk = blockIdx.y;
  const int first = chunk * rows_per_chunk;
  const int last = min(rows, first + rows_per_chunk);
  float sum[W];
#pragma unroll
  for (int k = 0; k < W; ++k) sum[k] = 0.0f;
  // Rows in groups of kRowGroup: all loads of a group first (independent of each other
  // and of the group's stores, which go to other rows), then its sums and stores in row
  // order. A partial last group loads nothing past `last`. 16 columns' worth of rows a
  // group (2 rows of bf16, 4 of fp32): ~70 registers, three blocks an SM, so that the
  // base model's 391 chunks run as one wave on 132 SMs with ~70 kB of loads in flight
  // an SM (4 bf16 rows took 134 registers: one block an SM, three waves).
  constexpr int kRowGroup = 16 / W;
  for (int row = first; row < last; row += kRowGroup) {
    float y_rows[kRowGroup][W], g[kRowGroup][W], d[kRowGroup][W];
#pragma unroll
    for (int r = 0; r < kRowGroup; ++r) {
      if (row + r >= last) break;
      const int64_t i = static_cast<int64_t>(row + r) * n + col;
      load16<T>(y_rows[r], y + i);
      load16<T>(g[r], dy + i);
      if (d_pre != nullptr && !write) {
        load16<T>(d[r], d_pre + i);
      } else {  // written: onto zeros
#pragma unroll
        for (int k = 0; k < W; ++k) d[r][k] = 0.0f;
      }
    }
#pragma unroll
    for (int r = 0; r < kRowGroup; ++r) {
      if (row + r >= last) break;
#pragma unroll
      for (int k = 0; k < W; ++k) {
        if (y_rows[r][k] > 0.0f) {
          d[r][k] = __fadd_rn(d[r][k], g[r][k]);  // else d_pre keeps its value
          sum[k] += g[r][k];
        }
      }
      if (d_pre != nullptr) store16<T>(d_pre + static_cast<int64_t>(row + r) * n + col, d[r]);
    }
  }
  if (partial == nullptr) return;
#pragma unroll
  for (int k = 0; k < W; ++k) partial[static_cast<int64_t>(chunk) * n + col + k] = sum[k];
}

// The masks the last linear_relu_mask_forward at each address wrote through cuBLASLt's
// epilogue, with their shapes: a backward takes the DRELU epilogue only on a mask its
// pass's forward wrote so (a forward that fell back to cublasGemmEx wrote none, and
// forgets its address). Host bookkeeping, in the order the ops are queued, so a captured
// pass keeps it as it runs.
class WrittenMasks {
 public:
  void remember(int device, const void* mask, int rows, int n) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (masks_.size() >= kMaxMasks) masks_.clear();  // an arena's addresses repeat
    masks_[{device, mask}] = {rows, n};
  }
  void forget(int device, const void* mask) {
    std::lock_guard<std::mutex> lock(mutex_);
    masks_.erase({device, mask});
  }
  bool written(int device, const void* mask, int rows, int n) {
    std::lock_guard<std::mutex> lock(mutex_);
    const auto found = masks_.find({device, mask});
    return found != masks_.end() && found->second == std::make_pair(rows, n);
  }

 private:
  static constexpr size_t kMaxMasks = 4096;
  std::map<std::pair<int, const void*>, std::pair<int, int>> masks_;
  std::mutex mutex_;
};

WrittenMasks& written_masks() {
  static WrittenMasks masks;
  return masks;
}

// Products that ran with the mask's epilogues (RELU_AUX forward, DRELU backward).
std::atomic<int64_t> relu_mask_product_count{0};
// Bias gradients that read the kept ones vector (the former kept_ones), for its twin test.
std::atomic<int64_t> kept_ones_count{0};
// Weight gradients queued on the side stream (candidate weight_grads_beside).
std::atomic<int64_t> weight_grads_beside_count{0};
// Bias gradients summed in their weight gradient's product (candidate bias_grads_in_gemm).
std::atomic<int64_t> bias_grads_in_gemm_count{0};

// db[i] += sums[i], fp32, one rounding each: what the ones product's beta = 1 adds.
__global__ void add_sums_kernel(float* db, const float* sums, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) db[i] = __fadd_rn(db[i], sums[i]);
}

// Whether `products` may run on the side stream (candidate weight_grads_beside): it exists
// and each takes a cuBLASLt plan (cublasGemmEx's handle is bound to the context's stream).
bool may_go_beside(Context& context, std::initializer_list<const Gemm*> products) {
  if (!context.has_side()) return false;
  for (const Gemm* product : products) {
    if (!takes_lt_plan(context, *product)) return false;
  }
  return true;
}

// An op's products sent to the side stream: fork() forks it and points `products` at it
// and its workspace; the op queues them, then its own products on the context's stream,
// then join(). Should the op leave by an exception between the two (a cuBLAS call or a
// launch failing), the destructor joins without checking, the exception in flight being
// the error to report: a capture of the stream then ends with its branch joined, where
// cudaStreamEndCapture would otherwise answer "unjoined" and the capture's fallback would
// see that instead of the first error.
class SideBranch {
 public:
  SideBranch() = default;
  SideBranch(const SideBranch&) = delete;
  SideBranch& operator=(const SideBranch&) = delete;
  ~SideBranch() {
    if (context_ != nullptr) context_->join_side_unchecked();
  }

  void fork(Context& context, std::initializer_list<Gemm*> products) {
    context.fork_side();
    context_ = &context;
    for (Gemm* product : products) {
      product->stream = context.side_stream();
      product->workspace = context.side_lt_workspace();
    }
    ++weight_grads_beside_count;
  }
  void join() {
    if (context_ == nullptr) return;
    Context* context = context_;
    context_ = nullptr;  // joined, or its error thrown: the destructor has nothing to do
    context->join_side();
  }

 private:
  Context* context_ = nullptr;  // set while forked and not joined
};

// dx^T [K, M] (+)= W [K, N] dy^T [N, M]: W is stored column-major [N, K] (ld N), so op T.
// (An empty product, N = 0, with beta = 0 writes zeros: gemm's k == 0 case.)
template <typename T>
void input_gradient(Context& context, T* dx, const T* dy, const T* W, int M, int K, int N,
                    GradStore store) {
  if (dx == nullptr) return;
  gemm(context, Gemm{CUBLAS_OP_T, CUBLAS_OP_N, K, M, N, W, N, dy, N, dx, K, cuda_type<T>(),
                     cuda_type<T>(), gradient_beta(writes_gradient(store, dx)), nullptr});
}

// A layer's dW += x^T dy and db += colsum(dy) ([M, K] x, [M, N] dy; either may be null).
// With the candidate weight_grads_beside they go to the side stream (beside()): the
// caller queues them first, then its own products on the context's stream, then join();
// otherwise after its products, on the context's stream, in the
// verified path's order. With the candidate bias_grads_in_gemm, db's sums come from dW's
// product (below). Why beside: the products of a layer's backward that read dy, dx's
// and dW's, need not wait for each other, and at one rank's 3,125 tokens each fills a wave
// of the GPU or less (a 512 x 512 weight's dW is 16 output tiles of 128 x 128, its dx
// 100); side by side, one's tiles take the SMs the other leaves idle. The products are the
// same (the same plans: the two workspaces have one size), so the gradients are the
// verified path's bit for bit. They go beside only when both take cuBLASLt plans and db's
// ones come from the kept vector, or its sums from dW's product into the side stream's own
// buffer (the scratch buffer belongs to the context's stream).
template <typename T>
class WeightGradients {
 public:
  WeightGradients(Context& context, float* dW, float* db, const T* dy, const T* x, int M, int K,
                  int N)
      : context_(context),
        with_dW_(dW != nullptr),
        with_db_(db != nullptr && M > 0 && N > 0),
        // dW^T [N, K] += dy^T [N, M] x [M, K]: x is stored column-major [K, M] (ld K), op T.
        dW_product_{CUBLAS_OP_N, CUBLAS_OP_T, N, K, M, dy, N, x, K, dW, N, cuda_type<T>(),
                    CUDA_R_32F, 1.0f, nullptr} {
    beside_ = context.has_side() && M > 0 && N > 0 && K > 0 && (with_dW_ || with_db_);
    if (!with_db_) {
      beside_ = beside_ && may_go_beside(context, {&dW_product_});
      return;
    }
    // Candidate bias_grads_in_gemm: dW's product sums dy's columns as it reads them, into
    // the scratch buffer (cuBLASLt's BGRADA epilogue: A = dy^T, its rows summed over k = M),
    // and one launch of N threads adds them into db; the ones product, which read all of
    // dy again for N sums (~54 of them a base step, n = 1 GEMMs of a few microseconds at
    // one rank's 3,125 tokens), is not queued. Only where dW's product takes a cuBLASLt
    // plan with that epilogue (else the ones, as verified). With weight_grads_beside too,
    // the product and the addition go beside, the sums in the side stream's own buffer
    // (Context::side_sums: the scratch buffer is the context's stream's, which the caller's
    // products use meanwhile); where that buffer would have to grow inside a capture, on
    // the context's stream with the scratch buffer. The same plan and epilogue either way:
    // the same bits.
    if (with_dW_ && K > 0 && context.candidate_kernel(kBiasGradsInGemm)) {
      Gemm summing = dW_product_;
      float* side_sums = beside_ ? context.side_sums(static_cast<size_t>(N)) : nullptr;
      summing.bias_grad = side_sums != nullptr
                              ? side_sums
                              : static_cast<float*>(context.scratch(sizeof(float) * N));
      if (takes_lt_plan(context, summing)) {
        db_ = db;
        sums_in_gemm_ = true;
        beside_ = side_sums != nullptr && may_go_beside(context, {&summing});
        return;
      }
    }
    // db [N] += dy^T [N, M] ones [M]: a GEMM with n = 1, fp32 accumulation and output.
    // The ones: a vector filled once and kept (a step's ~50 bias gradients each launched a
    // fill of M ones before; at one rank's 3,125 tokens a few microseconds each; the
    // former candidate kept_ones, the default since the H200 window of 2026-12-04), else,
    // inside a capture that would have to grow it, written into the scratch buffer.
    ones_ = static_cast<T*>(context.kept_vector(static_cast<size_t>(M), sizeof(T), to_fill_));
    kept_ = ones_ != nullptr;
    if (kept_) ++kept_ones_count;
    if (ones_ == nullptr) {
      beside_ = false;
      ones_ = static_cast<T*>(context.scratch(static_cast<size_t>(M) * sizeof(T)));
      to_fill_ = static_cast<size_t>(M);
    }
    db_product_ = Gemm{CUBLAS_OP_N, CUBLAS_OP_N, N, 1, M, dy, N, ones_, M, db, N,
                       cuda_type<T>(), CUDA_R_32F, 1.0f, nullptr};
    beside_ = beside_ && may_go_beside(context, {&db_product_}) &&
              (!with_dW_ || may_go_beside(context, {&dW_product_}));
  }

  bool beside() const { return beside_; }

  // Forks the side stream first when beside.
  void queue() {
    const cudaStream_t stream = beside_ ? context_.side_stream() : context_.stream();
    if (sums_in_gemm_) {
      if (beside_) branch_.fork(context_, {&dW_product_});  // (its stream and workspace)
      // The buffer as the constructor saw it (256-byte aligned, as planned), taken again
      // now: ops queued in between may have used the scratch buffer. The side stream's
      // fitted then, and nothing else grows it.
      Gemm summing = dW_product_;
      summing.bias_grad =
          beside_ ? context_.side_sums(static_cast<size_t>(summing.m))
                  : static_cast<float*>(context_.scratch(sizeof(float) * summing.m));
      THPC_CHECK(summing.bias_grad != nullptr, "the side stream's bias sums were not kept");
      THPC_CHECK(gemm(context_, summing), "the bias gradient's sums were planned in dW's "
                                          "product, and its epilogue was not applied");
      const int n = summing.m;
      add_sums_kernel<<<(n + kFillThreads - 1) / kFillThreads, kFillThreads, 0, stream>>>(
          db_, summing.bias_grad, n);
      THPC_CUDA_CHECK_LAUNCH("add_sums_kernel");
      ++bias_grads_in_gemm_count;
      return;
    }
    if (beside_) branch_.fork(context_, {&dW_product_, &db_product_});
    if (with_dW_) gemm(context_, dW_product_);
    if (!with_db_) return;
    if (to_fill_ > 0) {
      const int n = static_cast<int>(to_fill_);
      fill_value_kernel<T><<<(n + kFillThreads - 1) / kFillThreads, kFillThreads, 0, stream>>>(
          ones_, n, 1.0f);
      THPC_CUDA_CHECK_LAUNCH("fill_value_kernel");
      if (kept_) context_.kept_vector_filled(sizeof(T));
    }
    gemm(context_, db_product_);
  }
  // After the caller's own products, when beside(): the context's stream waits for them.
  void join() { branch_.join(); }

 private:
  Context& context_;
  bool with_dW_, with_db_;
  Gemm dW_product_, db_product_;
  T* ones_ = nullptr;
  size_t to_fill_ = 0;
  bool kept_ = false;  // ones_ is the Context's kept vector (not the scratch buffer)
  bool beside_ = false;
  bool sums_in_gemm_ = false;  // candidate bias_grads_in_gemm: db's sums in dW's product
  float* db_ = nullptr;
  SideBranch branch_;
};

}  // namespace

int64_t relu_mask_ld_bits(int n) { return (static_cast<int64_t>(n) + 127) / 128 * 128; }
int64_t relu_mask_words(int rows, int n) { return relu_mask_ld_bits(n) / 32 * rows; }

// Each product below is written as the column-major Gemm
//   {trans_a, trans_b, m, n, k, A, lda, B, ldb, C, ldc, ab_type, c_type, beta, bias}.

// y^T [N, M] = W^T [N, K] x^T [K, M]: row-major W [K, N] is column-major [N, K] (ld N),
// row-major x [M, K] is column-major [K, M] (ld K); the bias runs along D's rows (N).
template <typename T>
void linear_forward(Context& context, T* y, const T* x, const T* W, const T* b, int M, int K,
                    int N) {
  gemm(context, Gemm{CUBLAS_OP_N, CUBLAS_OP_N, N, M, K, W, N, x, K, y, N, cuda_type<T>(),
                     cuda_type<T>(), 0.0f, b});
}

// The same product with the ReLU as its epilogue: y = max(0, x W + b); with a mask and
// the candidate relu_masks the RELU_AUX_BIAS epilogue also writes the ReLU's bit-mask
// beside y, [N, M] column-major bits with ld relu_mask_ld_bits(N). Without the candidate,
// or where the product falls back to cublasGemmEx, y alone (the ReLU then a pass of its
// own, and linear_relu_backward reads y).
template <typename T>
void linear_relu_mask_forward(Context& context, T* y, uint32_t* mask, const T* x, const T* W,
                              const T* b, int M, int K, int N) {
  Gemm g{CUBLAS_OP_N, CUBLAS_OP_N, N, M, K, W, N, x, K, y, N, cuda_type<T>(), cuda_type<T>(),
         0.0f, b};
  g.relu = true;
  if (mask != nullptr && context.candidate_kernel(kReluMasks)) {
    g.aux = mask;
    g.aux_ld = relu_mask_ld_bits(N);
  }
  const bool applied = gemm(context, g);
  // An empty product writes no mask (and its backward reads none): not counted.
  if (g.aux != nullptr && applied && M > 0 && N > 0) {
    written_masks().remember(context.device(), mask, M, N);
    ++relu_mask_product_count;
  } else if (mask != nullptr) {
    written_masks().forget(context.device(), mask);
  }
  if (!applied) relu_forward<T>(context, y, y, static_cast<int64_t>(M) * N);
}

template <typename T>
void linear_relu_forward(Context& context, T* y, const T* x, const T* W, const T* b, int M,
                         int K, int N) {
  linear_relu_mask_forward<T>(context, y, nullptr, x, W, b, M, K, N);
}

// out = y W + b's backward with the ReLU's (y = max(0, pre), [M, K]): d_pre = (dy W^T)
// where y > 0, written. With the candidate and a mask this pass's forward wrote through
// the epilogue, d_pre^T [K, M] = W [K, N] dy^T [N, M] with the DRELU epilogue reading it
// (the ReLU's backward inside the GEMM: no pass over [M, K] reading dy and y); otherwise
// the product and relu_backward in place, reading y. dW and db as linear_backward's.
template <typename T>
void linear_relu_backward(Context& context, T* d_pre, float* dW, float* db, const T* dy,
                          const T* y, const uint32_t* mask, const T* W, int M, int K, int N) {
  const bool with_mask = d_pre != nullptr && mask != nullptr &&
                         context.candidate_kernel(kReluMasks) &&
                         written_masks().written(context.device(), mask, M, K);
  // dW and db beside (candidate weight_grads_beside: they read dy and y, which nothing
  // below writes), or after d_pre's product as in the verified path.
  WeightGradients<T> weights(context, dW, db, dy, y, M, K, N);
  if (weights.beside()) weights.queue();
  bool masked = false;
  if (with_mask) {
    Gemm g{CUBLAS_OP_T, CUBLAS_OP_N, K, M, N, W, N, dy, N, d_pre, K, cuda_type<T>(),
           cuda_type<T>(), 0.0f, nullptr};
    g.drelu = true;
    g.aux = const_cast<uint32_t*>(mask);  // read, not written, by DRELU
    g.aux_ld = relu_mask_ld_bits(K);
    masked = gemm(context, g);  // false: the plain product is in d_pre
    if (masked) ++relu_mask_product_count;
  } else {
    input_gradient<T>(context, d_pre, dy, W, M, K, N, GradStore::kWrite);  // written
  }
  if (!weights.beside()) weights.queue();
  if (d_pre != nullptr && !masked) {
    relu_backward<T>(context, d_pre, d_pre, y, static_cast<int64_t>(M) * K, GradStore::kWrite);
  }
  weights.join();
}

// d_pre += g (kWrite: =), db += column sums of g (g = dy where y > 0): one pass over
// [rows, n], the sums in fp32 in a fixed order (column_sums.cuh).
template <typename T>
void relu_bias_backward(Context& context, T* d_pre, float* db, const T* dy, const T* y, int rows,
                        int n, GradStore store) {
  if (rows <= 0 || n <= 0 || (d_pre == nullptr && db == nullptr)) return;
  const bool write = writes_gradient(store, d_pre);
  const cudaStream_t stream = context.stream();
  constexpr int W = kVector<T>;
  const bool vectors = n % W == 0 && aligned16(dy) && aligned16(y) &&
                       (d_pre == nullptr || aligned16(d_pre));
  // The chunks from the shape alone (the vector kernel's blocks a chunk, whichever kernel
  // runs), so that the scalar kernel sums in the vector kernel's order: the same bits.
  const ColumnChunks chunks =
      column_chunks(rows, column_blocks((n + W - 1) / W), column_fill_blocks(context));
  float* partial = db != nullptr ? static_cast<float*>(context.scratch(
                                       static_cast<size_t>(chunks.chunks) * n * sizeof(float)))
                                 : nullptr;
  if (vectors) {
    const dim3 grid(static_cast<unsigned>(column_blocks((n + W - 1) / W)),
                    static_cast<unsigned>(chunks.chunks));
    relu_bias_backward_vector_kernel<T><<<grid, kColumnThreads, 0, stream>>>(
        d_pre, partial, dy, y, rows, n, chunks.rows_per_chunk, write);
    THPC_CUDA_CHECK_LAUNCH("relu_bias_backward_vector_kernel");
  } else {
    relu_bias_backward_kernel<T><<<chunks.grid(n), kColumnThreads, 0, stream>>>(
        d_pre, partial, dy, y, rows, n, chunks.rows_per_chunk, write);
    THPC_CUDA_CHECK_LAUNCH("relu_bias_backward_kernel");
  }
  if (db == nullptr) return;
  finish_column_sums(db, nullptr, partial, nullptr, chunks.chunks, n,
                     context.candidate_kernel(kFullerColumnSums), stream);
  THPC_CUDA_CHECK_LAUNCH("finish_column_sums");
}

template <typename T>
void linear_backward(Context& context, T* dx, float* dW, float* db, const T* dy, const T* x,
                     const T* W, int M, int K, int N, GradStore store) {
  WeightGradients<T> weights(context, dW, db, dy, x, M, K, N);
  if (weights.beside()) {
    weights.queue();
    input_gradient<T>(context, dx, dy, W, M, K, N, store);
    weights.join();
  } else {  // the verified path's order
    input_gradient<T>(context, dx, dy, W, M, K, N, store);
    weights.queue();
  }
}

// logits^T [V, M] = E [V, d] h^T [d, M]: row-major E [V, d] is column-major [d, V] (ld d),
// so op T; row-major h [M, d] is column-major [d, M] (ld d).
template <typename T>
void output_projection_forward(Context& context, T* logits, const T* h, const T* E, int M,
                               int d, int vocab) {
  gemm(context, Gemm{CUBLAS_OP_T, CUBLAS_OP_N, vocab, M, d, E, d, h, d, logits, vocab,
                     cuda_type<T>(), cuda_type<T>(), 0.0f, nullptr});
}

template <typename T>
void output_projection_backward(Context& context, T* dh, float* dE, const T* d_logits,
                                const T* h, const T* E, int M, int d, int vocab,
                                GradStore store) {
  // dE^T [d, V] += h^T [d, M] d_logits [M, V]: d_logits stored column-major [V, M]
  // (ld V), so op T. With the candidate weight_grads_beside on the side stream beside dh
  // (as a layer's dW beside its dx: at one rank's 3,125 tokens dh is 25 x 4 tiles over a
  // K of the vocabulary, under one wave), else after it, the verified path's order.
  Gemm dE_product{CUBLAS_OP_N, CUBLAS_OP_T, d, vocab, M, h, d, d_logits, vocab, dE, d,
                  cuda_type<T>(), CUDA_R_32F, 1.0f, nullptr};
  const bool beside = dE != nullptr && dh != nullptr && M > 0 && d > 0 && vocab > 0 &&
                      may_go_beside(context, {&dE_product});
  SideBranch branch;
  if (beside) {
    branch.fork(context, {&dE_product});
    gemm(context, dE_product);
  }
  if (dh != nullptr) {
    const bool write = writes_gradient(store, dh);
    // dh^T [d, M] += E^T [d, V] d_logits^T [V, M]: E stored column-major [d, V] (ld d),
    // d_logits column-major [V, M] (ld V).
    gemm(context, Gemm{CUBLAS_OP_N, CUBLAS_OP_N, d, M, vocab, E, d, d_logits, vocab, dh, d,
                       cuda_type<T>(), cuda_type<T>(), gradient_beta(write), nullptr});
  }
  if (beside) {
    branch.join();
  } else if (dE != nullptr) {
    gemm(context, dE_product);
  }
}

// ---- the sweep of cuBLASLt's offers (transformer_bench_step --gemm-sweep) -------------
namespace {

// n values of T in [-1, 1), element i from the Philox draws of the dropout masks
// (common/philox.h; `seed` as the key): neither zero nor special, so that every algorithm
// does the work a step's product does.
template <typename T>
__global__ void fill_sweep_kernel(T* values, int64_t n, uint32_t seed) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float u = uniform_from_bits(philox_bits(seed, 0, 0, 0, static_cast<uint64_t>(i)));
    values[i] = from_float<T>(2.0f * u - 1.0f);
  }
}

// Device memory whose start has exactly the alignment a step's operand had (a weight is a
// slice of the flat parameter buffer: the heuristic's offers depend on it).
class SweepBuffer {
 public:
  SweepBuffer(size_t bytes, uint32_t alignment) : bytes_(bytes) {
    THPC_CUDA_CHECK(cudaMalloc(&base_, bytes + 256));
    data_ = static_cast<char*>(base_) + (alignment < 256 ? alignment : 0);
  }
  ~SweepBuffer() { cudaFree(base_); }  // errors ignored, as in every destructor here
  SweepBuffer(const SweepBuffer&) = delete;
  SweepBuffer& operator=(const SweepBuffer&) = delete;
  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  // Random values of `type` (4-byte words of random bits for a mask).
  void fill(cudaDataType_t type, uint32_t seed, cudaStream_t stream) {
    const int64_t n = static_cast<int64_t>(bytes_ / gemm_type_bytes(type));
    if (n == 0) return;
    if (type == CUDA_R_32F) {
      fill_sweep_kernel<float><<<fill_blocks(n), kFillThreads, 0, stream>>>(
          static_cast<float*>(data_), n, seed);
    } else {
      fill_sweep_kernel<bf16><<<fill_blocks(n), kFillThreads, 0, stream>>>(
          static_cast<bf16*>(data_), n, seed);
    }
    THPC_CUDA_CHECK_LAUNCH("fill_sweep_kernel");
  }

 private:
  void* base_ = nullptr;
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

// A plan made for one sweep, destroyed with it.
struct SweepPlan {
  Plan plan;
  ~SweepPlan() { plan.destroy(); }
};

// Holds `stream` on the device for `nanoseconds` (the device's global timer), so that the
// products queued behind it while it runs start back to back: one small product at one
// rank's 3,125 tokens (a few microseconds, the n = 1 sums one) takes about as long as the
// host takes to queue one (cublasLtMatmul's own work), and timed as they were queued the
// offers would all measure the host. In a step they run as queued ahead of the device, or
// replayed from a graph: back to back.
__global__ void hold_stream_kernel(uint64_t nanoseconds) {
  uint64_t start = 0, now = 0;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  do {
    __nanosleep(1000);
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  } while (now - start < nanoseconds);
}

// The two events a sweep times between.
struct SweepEvents {
  cudaEvent_t start = nullptr, stop = nullptr;
  SweepEvents() {
    THPC_CUDA_CHECK(cudaEventCreate(&start));
    THPC_CUDA_CHECK(cudaEventCreate(&stop));
  }
  ~SweepEvents() {
    if (start) cudaEventDestroy(start);
    if (stop) cudaEventDestroy(stop);
  }
  SweepEvents(const SweepEvents&) = delete;
  SweepEvents& operator=(const SweepEvents&) = delete;
};

const char* epilogue_name(const Gemm& g) {
  switch (epilogue_of(g)) {
    case CUBLASLT_EPILOGUE_BGRADA: return "bgrada";
    case CUBLASLT_EPILOGUE_DRELU: return "drelu";
    case CUBLASLT_EPILOGUE_RELU_AUX_BIAS: return "relu_aux_bias";
    case CUBLASLT_EPILOGUE_RELU_AUX: return "relu_aux";
    case CUBLASLT_EPILOGUE_RELU_BIAS: return "relu_bias";
    case CUBLASLT_EPILOGUE_RELU: return "relu";
    case CUBLASLT_EPILOGUE_BIAS: return "bias";
    default: return "none";
  }
}

std::string describe_product(const Gemm& g) {
  char text[256];
  std::snprintf(text, sizeof text,
                "m=%d n=%d k=%d op=%c%c ab=%s c=%s beta=%g epilogue=%s ld=%d/%d/%d "
                "align=%u/%u/%u/%u/%u aux_ld=%lld",
                g.m, g.n, g.k, g.trans_a == CUBLAS_OP_N ? 'N' : 'T',
                g.trans_b == CUBLAS_OP_N ? 'N' : 'T', g.ab_type == CUDA_R_32F ? "fp32" : "bf16",
                g.c_type == CUDA_R_32F ? "fp32" : "bf16", g.beta, epilogue_name(g), g.lda, g.ldb,
                g.ldc, alignment_of(g.A), alignment_of(g.B), alignment_of(g.C),
                g.bias != nullptr ? alignment_of(g.bias) : 0u,
                g.bias_grad != nullptr ? alignment_of(g.bias_grad) : 0u,
                static_cast<long long>(g.aux_ld));
  return text;
}

// out[i] = in[i * stride] widened to fp32, i < count.
template <typename T>
__global__ void gather_every_kernel(float* out, const T* in, int64_t count, int64_t stride) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    out[i] = to_float(in[i * stride]);
  }
}

// At most this many of an output's elements are compared between offers, evenly spaced:
// a wrong product shows in any of them, and the logits' product at 25,000 tokens (925M
// elements) is not copied to the host and compared whole eight times.
constexpr int64_t kComparedElements = int64_t{1} << 22;

// D (m x n, column-major, ld ldc: its stored elements, the padding rows too; every
// stride-th of them when there are more than kComparedElements) as floats. `sample` holds
// kComparedElements floats.
std::vector<float> download_output(const SweepBuffer& C, cudaDataType_t type,
                                   SweepBuffer& sample, cudaStream_t stream) {
  const int64_t n = static_cast<int64_t>(C.bytes() / gemm_type_bytes(type));
  const int64_t stride = (n + kComparedElements - 1) / kComparedElements;
  const int64_t count = stride > 0 ? n / stride : 0;
  std::vector<float> values(static_cast<size_t>(count));
  if (count == 0) return values;
  if (type == CUDA_R_32F) {
    gather_every_kernel<float><<<fill_blocks(count), kFillThreads, 0, stream>>>(
        static_cast<float*>(sample.data()), static_cast<const float*>(C.data()), count, stride);
  } else {
    gather_every_kernel<bf16><<<fill_blocks(count), kFillThreads, 0, stream>>>(
        static_cast<float*>(sample.data()), static_cast<const bf16*>(C.data()), count, stride);
  }
  THPC_CUDA_CHECK_LAUNCH("gather_every_kernel");
  THPC_CUDA_CHECK(cudaMemcpyAsync(values.data(), sample.data(), values.size() * sizeof(float),
                                  cudaMemcpyDeviceToHost, stream));
  THPC_CUDA_CHECK(cudaStreamSynchronize(stream));
  return values;
}

// Products run back to back per timing, and timings per offer (the best is kept): a
// product of a few microseconds is timed over 20 launches, its launch gaps included as
// in a step.
constexpr int kSweepRepeats = 20;
constexpr int kSweepTimings = 3;
// hold_stream_kernel's first hold (20 products queued in ~5 us each: 100 us) and its
// longest (a host that slow is reported, not waited for: GemmSweepRow::unheld_timings).
constexpr uint64_t kFirstHoldNs = 200'000;
constexpr uint64_t kLongestHoldNs = 12'800'000;

GemmSweepRow sweep_product(Context& context, const ProductUses& product, int max_algorithms) {
  const Gemm& used = product.call;
  GemmSweepRow row;
  row.product = describe_product(used);
  row.uses = product.uses;
  row.flops = 2.0 * used.m * used.n * static_cast<double>(used.k);
  const cudaStream_t stream = context.stream();
  const bool ta = used.trans_a != CUBLAS_OP_N, tb = used.trans_b != CUBLAS_OP_N;
  const size_t ab = gemm_type_bytes(used.ab_type), cb = gemm_type_bytes(used.c_type);
  SweepBuffer A(ab * used.lda * (ta ? used.m : used.k), alignment_of(used.A));
  SweepBuffer B(ab * used.ldb * (tb ? used.k : used.n), alignment_of(used.B));
  SweepBuffer C(cb * used.ldc * used.n, alignment_of(used.C));
  SweepBuffer C0(C.bytes(), 256);
  SweepBuffer sample(sizeof(float) * kComparedElements, 256);
  std::optional<SweepBuffer> bias, aux, sums;
  if (used.bias != nullptr) bias.emplace(cb * used.m, alignment_of(used.bias));
  if (used.bias_grad != nullptr) sums.emplace(sizeof(float) * used.m, alignment_of(used.bias_grad));
  if (used.aux != nullptr) aux.emplace(used.aux_ld / 8 * used.n, alignment_of(used.aux));
  A.fill(used.ab_type, 1, stream);
  B.fill(used.ab_type, 2, stream);
  C0.fill(used.c_type, 3, stream);
  if (bias) bias->fill(used.c_type, 4, stream);
  if (aux) aux->fill(CUDA_R_32F, 5, stream);  // random bits: the mask DRELU reads

  Gemm call = used;
  call.A = A.data();
  call.B = B.data();
  call.C = C.data();
  call.bias = bias ? bias->data() : nullptr;
  call.aux = aux ? aux->data() : nullptr;
  call.bias_grad = sums ? static_cast<float*>(sums->data()) : nullptr;
  SweepPlan sweep;
  Plan& plan = sweep.plan;
  describe(plan, call);
  std::vector<cublasLtMatmulHeuristicResult_t> offers(static_cast<size_t>(max_algorithms));
  int returned = 0;
  cublasLtMatmulPreference_t preference = preference_for(context, call);
  const cublasStatus_t status =
      cublasLtMatmulAlgoGetHeuristic(context.lt(), plan.desc, plan.a, plan.b, plan.c, plan.c,
                                     preference, max_algorithms, offers.data(), &returned);
  cublasLtMatmulPreferenceDestroy(preference);
  // None for this case (not expected: the step planned it with the same alignments): the
  // row says so with no offers timed, the other shapes' rows stand.
  if (status == CUBLAS_STATUS_NOT_SUPPORTED) return row;
  THPC_CUBLAS_CHECK(status);

  auto run = [&](const cublasLtMatmulAlgo_t& algo) {
    const float alpha = 1.0f;
    THPC_CUBLAS_CHECK(cublasLtMatmul(context.lt(), plan.desc, &alpha, call.A, plan.a, call.B,
                                     plan.b, &call.beta, call.C, plan.c, call.C, plan.c, &algo,
                                     context.lt_workspace(), context.lt_workspace_bytes(),
                                     stream));
  };
  // One product on C as the step's was (C0's values), read back.
  // ... and the row sums a BGRADA product writes beside D, appended (m floats).
  auto output = [&](const cublasLtMatmulAlgo_t& algo) {
    THPC_CUDA_CHECK(
        cudaMemcpyAsync(C.data(), C0.data(), C.bytes(), cudaMemcpyDeviceToDevice, stream));
    run(algo);
    std::vector<float> values = download_output(C, call.c_type, sample, stream);
    if (sums) {
      std::vector<float> row_sums(static_cast<size_t>(call.m));
      THPC_CUDA_CHECK(cudaMemcpyAsync(row_sums.data(), sums->data(), sums->bytes(),
                                      cudaMemcpyDeviceToHost, stream));
      THPC_CUDA_CHECK(cudaStreamSynchronize(stream));
      values.insert(values.end(), row_sums.begin(), row_sums.end());
    }
    return values;
  };
  const SweepEvents events;
  // Long enough to queue the repeats behind it (a few microseconds each); doubled when the
  // device reached the start before they were all queued, up to kLongestHoldNs.
  uint64_t hold_ns = kFirstHoldNs;
  auto time_us = [&](const cublasLtMatmulAlgo_t& algo) {
    for (int i = 0; i < 3; ++i) run(algo);  // warm: its kernels loaded, caches as in a step
    double best = std::numeric_limits<double>::infinity();
    for (int timing = 0; timing < kSweepTimings; ++timing) {
      hold_stream_kernel<<<1, 1, 0, stream>>>(hold_ns);
      THPC_CUDA_CHECK_LAUNCH("hold_stream_kernel");
      THPC_CUDA_CHECK(cudaEventRecord(events.start, stream));
      for (int r = 0; r < kSweepRepeats; ++r) run(algo);
      THPC_CUDA_CHECK(cudaEventRecord(events.stop, stream));
      // Not ready: the hold still ran when the last repeat was queued (the query is no
      // error, and leaves none behind).
      const cudaError_t reached = cudaEventQuery(events.start);
      if (reached != cudaErrorNotReady) THPC_CUDA_CHECK(reached);
      THPC_CUDA_CHECK(cudaEventSynchronize(events.stop));
      if (reached == cudaSuccess && hold_ns < kLongestHoldNs) {
        hold_ns *= 2;  // this timing may hold the host's gaps: not counted, taken again
        --timing;
        continue;
      }
      if (reached == cudaSuccess) ++row.unheld_timings;
      float ms = 0.0f;
      THPC_CUDA_CHECK(cudaEventElapsedTime(&ms, events.start, events.stop));
      best = std::min(best, 1e3 * ms / kSweepRepeats);
    }
    return best;
  };
  std::vector<float> first;
  double first_scale = 0.0;
  for (int i = 0; i < returned; ++i) {
    if (offers[i].state != CUBLAS_STATUS_SUCCESS) continue;
    const std::vector<float> values = output(offers[i].algo);
    const double us = time_us(offers[i].algo);
    if (row.algorithms == 0) {
      first = values;
      for (float v : first) first_scale = std::max(first_scale, std::fabs(double{v}));
      row.heuristic_us = row.best_us = us;
    } else {
      double worst = 0.0;
      for (size_t e = 0; e < values.size(); ++e) {
        worst = std::max(worst, std::fabs(double{values[e]} - double{first[e]}));
      }
      row.max_relative_difference =
          std::max(row.max_relative_difference, worst / std::max(first_scale, 1e-30));
      if (us < row.best_us) {
        row.best_us = us;
        row.best = row.algorithms;
      }
    }
    ++row.algorithms;
  }
  return row;
}

}  // namespace

THPC_CUDA_TWIN(linear_forward)
THPC_CUDA_TWIN(linear_backward)
THPC_CUDA_TWIN(linear_relu_forward)
THPC_CUDA_TWIN(relu_bias_backward)
THPC_CUDA_TWIN(linear_relu_mask_forward)
THPC_CUDA_TWIN(linear_relu_backward)
THPC_CUDA_TWIN(output_projection_forward)
THPC_CUDA_TWIN(output_projection_backward)

}  // namespace thpc::cuda

int64_t thpc::cuda_relu_mask_products() { return thpc::cuda::relu_mask_product_count.load(); }
int64_t thpc::cuda_kept_ones_bias_gradients() { return thpc::cuda::kept_ones_count.load(); }
int64_t thpc::cuda_weight_grads_beside() {
  return thpc::cuda::weight_grads_beside_count.load();
}
int64_t thpc::cuda_bias_grads_in_gemm() { return thpc::cuda::bias_grads_in_gemm_count.load(); }

void thpc::cuda_count_gemm_uses() { thpc::cuda::plan_cache().count_uses_from_now(); }

std::vector<thpc::GemmSweepRow> thpc::cuda_sweep_gemm_algorithms(int max_algorithms) {
  THPC_CHECK(max_algorithms >= 1, "a GEMM sweep of " << max_algorithms << " algorithms");
  int device = 0;
  THPC_CUDA_CHECK(cudaGetDevice(&device));
  thpc::cuda::Context context(device);
  std::vector<thpc::GemmSweepRow> rows;
  for (const auto& product : thpc::cuda::plan_cache().uses()) {
    rows.push_back(thpc::cuda::sweep_product(context, product, max_algorithms));
  }
  THPC_CUDA_CHECK(cudaStreamSynchronize(context.stream()));
  return rows;
}
