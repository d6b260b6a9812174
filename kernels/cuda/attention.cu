// Multi-head scaled dot-product attention (§3.2.1, §3.2.2) on the GPU:
//   out_i = Dropout(softmax(Q_i K_i^T / sqrt(d_k) + mask)) V_i,  heads concatenated,
// with the CPU twin kernels/cpu/attention.cc as the specification (same layouts, same
// saved probabilities, same Philox dropout draws).
//
// Shape of the computation. Per (sentence, head) pair there are two products, QK^T
// (2 Lq Lk d_k FLOP) and P'V (2 Lq Lk d_v FLOP), and between them a row-wise masked
// softmax + dropout over Lq Lk scores (~10 FLOP and ~10 bytes per score: fp32 S read,
// T P and P' written). The products run on the tensor cores as ONE batched GEMM each
// over all B*h pairs (cublasGemmBatchedEx, fp32 accumulation): the head views of q, k,
// v are column blocks of wider row-major matrices, so pair (b, i) starts at
// q + b*Lq*ldq + i*d_k. That offset is not one uniform stride across b and i (Lq*ldq
// vs d_k), so strided-batched GEMMs would need one call per sentence (B launches per
// product, each only h wide); a device array of B*h pointers, built by one tiny kernel,
// gives one launch per product whatever B is. The softmax is one warp per score row
// (rows are Lk long, typically <= a few hundred: a warp's 32 lanes stride the row with
// coalesced loads and reduce with shuffles, no shared memory, no block barriers).
//
// Backward (5 batched GEMMs + 1 row kernel, mask regenerated from the DropoutKey):
//   dV += P'^T dO,  dP' = dO V^T,  dS = P * (dP - rowsum(dP * P)) with dP = dP' M/(1-p),
//   dQ += dS K / sqrt(d_k),  dK += dS^T Q / sqrt(d_k).
//
// cuBLAS is column-major: a row-major [R, C] matrix with row stride ld is, to cuBLAS, the
// column-major [C, R] matrix (its transpose) with leading dimension ld. Each call below
// is written as the column-major product of those transposes (the comment on each shows
// the row-major product it computes).
//
// Determinism: GEMMs with a fixed configuration and warp-shuffle butterflies in a fixed
// order; no atomics. Scratch (one Context::scratch call per launcher): the pointer
// arrays, fp32 scores (or score gradients), and the T probability buffers.

#include <cmath>
#include <cstdint>
#include <utility>

#include "common/error.h"
#include "common/philox.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_ops.h"

namespace thpc::cuda {
namespace {

constexpr int kWarp = 32;
constexpr int kRowsPerBlock = 4;  // warps (= score rows) per block of the row kernels

template <typename T>
__device__ __forceinline__ float to_float(T x) {
  return static_cast<float>(x);
}
template <>
__device__ __forceinline__ float to_float<bf16>(bf16 x) {
  return __bfloat162float(x);
}
template <typename T>
__device__ __forceinline__ T from_float(float x) {
  return static_cast<T>(x);
}
template <>
__device__ __forceinline__ bf16 from_float<bf16>(float x) {
  return __float2bfloat16_rn(x);
}

template <typename T>
cudaDataType_t cuda_type();
template <>
cudaDataType_t cuda_type<float>() {
  return CUDA_R_32F;
}
template <>
cudaDataType_t cuda_type<bf16>() {
  return CUDA_R_16BF;
}

__device__ __forceinline__ float warp_max(float x) {
  for (int offset = kWarp / 2; offset > 0; offset /= 2) {
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, offset));
  }
  return x;
}
__device__ __forceinline__ float warp_sum(float x) {
  for (int offset = kWarp / 2; offset > 0; offset /= 2) {
    x += __shfl_xor_sync(0xffffffffu, x, offset);
  }
  return x;
}

// Everything a row kernel needs to know about the mask and the dropout of one score
// row r in [0, B*h*Lq) (r = (b*h + head)*Lq + t, so r*Lk + j is the flat index of
// P[b, head, t, j] in [B, h, Lq, Lk]: the saved layout and the dropout element index).
struct RowMask {
  int heads, query_len, key_len;
  bool causal;
  const int32_t* key_lengths;  // device, may be null (all keys valid)
  float dropout;
  float keep_scale;  // 1 / (1 - p)
  DropoutKey key;
};

// Keys [0, visible) are visible to row r: the sentence's non-pad keys and, when causal,
// only positions <= t. A key length outside [0, Lk] (the CPU throws on it; a kernel
// cannot) is clamped.
__device__ __forceinline__ int visible_keys(const RowMask& m, int64_t r) {
  const int t = static_cast<int>(r % m.query_len);
  const int b = static_cast<int>(r / (static_cast<int64_t>(m.heads) * m.query_len));
  int valid = m.key_len;
  if (m.key_lengths != nullptr) valid = min(max(m.key_lengths[b], 0), m.key_len);
  return m.causal && t + 1 < valid ? t + 1 : valid;
}

// M / (1 - p) of element `element`: keep_scale where kept, 0 where dropped (the CPU's
// dropout_factors, exactly the same draws).
__device__ __forceinline__ float dropout_factor(const RowMask& m, uint64_t element) {
  if (m.dropout == 0.0f) return 1.0f;
  return dropout_keep(m.key.seed, m.key.site, m.key.step, m.key.stream, element, m.dropout)
             ? m.keep_scale
             : 0.0f;
}

// One warp per score row: masked, stable softmax of the fp32 scores S (already scaled
// by 1/sqrt(d_k)) -> P (type T, masked entries exactly 0) and P' = P * M / (1 - p),
// computed from the rounded P so forward and backward use the same P'. probs_dropped
// may equal nullptr when p == 0 (then P' = P and the caller uses probs).
template <typename T>
__global__ void softmax_dropout_rows(T* __restrict__ probs, T* __restrict__ probs_dropped,
                                     const float* __restrict__ scores, int64_t rows,
                                     RowMask mask) {
  const int lane = threadIdx.x % kWarp;
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / kWarp;
  if (r >= rows) return;  // whole warp leaves together: the shuffles below stay full
  const int Lk = mask.key_len;
  const int visible = visible_keys(mask, r);
  const float* s = scores + r * Lk;
  float row_max = -INFINITY;
  for (int j = lane; j < visible; j += kWarp) row_max = fmaxf(row_max, s[j]);
  row_max = warp_max(row_max);
  float sum = 0.0f;
  for (int j = lane; j < visible; j += kWarp) sum += expf(s[j] - row_max);
  sum = warp_sum(sum);
  const float inverse_sum = visible > 0 ? 1.0f / sum : 0.0f;
  T* p_row = probs + r * Lk;
  T* d_row = probs_dropped != nullptr ? probs_dropped + r * Lk : nullptr;
  for (int j = lane; j < Lk; j += kWarp) {
    const T p = from_float<T>(j < visible ? expf(s[j] - row_max) * inverse_sum : 0.0f);
    p_row[j] = p;
    if (d_row != nullptr) {
      d_row[j] = from_float<T>(to_float(p) * dropout_factor(mask, static_cast<uint64_t>(r) * Lk + j));
    }
  }
}

// P' = P * M / (1 - p) over all B*h*Lq*Lk saved probabilities (backward, p > 0).
template <typename T>
__global__ void apply_dropout(T* __restrict__ dropped, const T* __restrict__ probs, int64_t n,
                              RowMask mask) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < n;
       e += stride) {
    dropped[e] = from_float<T>(to_float(probs[e]) * dropout_factor(mask, static_cast<uint64_t>(e)));
  }
}

// One warp per row: dP = dP' * M / (1 - p), dS = P * (dP - rowsum(dP * P)) -> T.
// Masked entries have P = 0 and so dS = 0.
template <typename T>
__global__ void softmax_backward_rows(T* __restrict__ d_scores, const float* __restrict__ d_dropped,
                                      const T* __restrict__ probs, int64_t rows, RowMask mask) {
  const int lane = threadIdx.x % kWarp;
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / kWarp;
  if (r >= rows) return;
  const int Lk = mask.key_len;
  const float* g = d_dropped + r * Lk;
  const T* p_row = probs + r * Lk;
  float dot = 0.0f;
  for (int j = lane; j < Lk; j += kWarp) {
    dot += g[j] * dropout_factor(mask, static_cast<uint64_t>(r) * Lk + j) * to_float(p_row[j]);
  }
  dot = warp_sum(dot);
  T* out = d_scores + r * Lk;
  for (int j = lane; j < Lk; j += kWarp) {
    const float dp = g[j] * dropout_factor(mask, static_cast<uint64_t>(r) * Lk + j);
    out[j] = from_float<T>(to_float(p_row[j]) * (dp - dot));
  }
}

// The B*h pointers of one operand of a batched GEMM: pair i = b*h + head points at
// base + b*b_stride + head*head_stride (bytes).
struct PointerSpec {
  const char* base;
  int64_t b_stride;
  int64_t head_stride;
};
constexpr int kMaxPointerArrays = 12;
struct PointerPlan {
  PointerSpec spec[kMaxPointerArrays];
  int count;
  int heads;
  int pairs;
};

// arrays[a * pairs + i] = the pointer of pair i in operand a.
__global__ void build_pointers(const void** arrays, PointerPlan plan) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= plan.pairs) return;
  const int b = i / plan.heads, head = i % plan.heads;
  for (int a = 0; a < plan.count; ++a) {
    const PointerSpec& s = plan.spec[a];
    arrays[static_cast<int64_t>(a) * plan.pairs + i] = s.base + b * s.b_stride + head * s.head_stride;
  }
}

// Bump allocation inside one scratch buffer, every piece 256-byte aligned: first plan
// the sizes (take with base == nullptr), then call Context::scratch once and take again.
class ScratchPlan {
 public:
  explicit ScratchPlan(char* base) : base_(base) {}
  template <typename U>
  U* take(int64_t count) {
    char* at = base_ != nullptr ? base_ + used_ : nullptr;
    used_ += (static_cast<size_t>(count) * sizeof(U) + 255) / 256 * 256;
    return reinterpret_cast<U*>(at);
  }
  size_t used() const { return used_; }

 private:
  char* base_;
  size_t used_ = 0;
};

// Adds an operand to the pointer plan; returns the index of its array.
template <typename U>
int add_operand(PointerPlan& plan, const U* base, int64_t b_stride, int64_t head_stride) {
  THPC_CHECK(plan.count < kMaxPointerArrays, "attention pointer plan overflow");
  plan.spec[plan.count] = PointerSpec{reinterpret_cast<const char*>(base),
                                      b_stride * static_cast<int64_t>(sizeof(U)),
                                      head_stride * static_cast<int64_t>(sizeof(U))};
  return plan.count++;
}

void launch_build_pointers(const void** arrays, const PointerPlan& plan, cudaStream_t stream) {
  const int threads = 128;
  build_pointers<<<(plan.pairs + threads - 1) / threads, threads, 0, stream>>>(arrays, plan);
  THPC_CUDA_CHECK_LAUNCH("build_pointers");
}

// One batched GEMM over all pairs, fp32 compute: C = alpha op(A) op(B) + beta C in
// cuBLAS's column-major terms. A and B have type AB, C has type C.
void batched_gemm(Context& context, cublasOperation_t op_a, cublasOperation_t op_b, int m, int n,
                  int k, float alpha, const void* const* a, cudaDataType_t ab_type, int lda,
                  const void* const* b, int ldb, float beta, void* const* c,
                  cudaDataType_t c_type, int ldc, int pairs) {
  THPC_CUBLAS_CHECK(cublasGemmBatchedEx(context.blas(), op_a, op_b, m, n, k, &alpha, a, ab_type,
                                        lda, b, ab_type, ldb, &beta, c, c_type, ldc, pairs,
                                        CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

void check_shape(const AttentionShape& shape, int ldq, int ldk, int ldv) {
  THPC_CHECK(shape.batch >= 0 && shape.heads >= 0 && shape.query_len >= 0 &&
                 shape.key_len >= 0,
             "attention shape B=" << shape.batch << " h=" << shape.heads
                                  << " Lq=" << shape.query_len << " Lk=" << shape.key_len);
  THPC_CHECK(shape.d_k > 0 && shape.d_v > 0,
             "attention head widths d_k=" << shape.d_k << " d_v=" << shape.d_v);
  THPC_CHECK(ldq >= shape.heads * shape.d_k && ldk >= shape.heads * shape.d_k &&
                 ldv >= shape.heads * shape.d_v,
             "attention row strides ldq=" << ldq << " ldk=" << ldk << " ldv=" << ldv
                                          << " narrower than h*d_k=" << shape.heads * shape.d_k
                                          << " / h*d_v=" << shape.heads * shape.d_v);
  THPC_CHECK(shape.dropout >= 0.0f && shape.dropout < 1.0f,
             "attention dropout " << shape.dropout << " outside [0, 1)");
}

RowMask row_mask(const AttentionShape& shape) {
  const float p = shape.dropout;
  return RowMask{shape.heads, shape.query_len, shape.key_len, shape.causal, shape.key_lengths,
                 p, 1.0f / (1.0f - p), shape.dropout_key};
}

unsigned row_blocks(int64_t rows) {
  return static_cast<unsigned>((rows + kRowsPerBlock - 1) / kRowsPerBlock);
}

// Cublas' default pointer mode is host; set it anyway (alpha and beta live on the host)
// in case another user of the shared handle changed it.
void host_scalars(Context& context) {
  THPC_CUBLAS_CHECK(cublasSetPointerMode(context.blas(), CUBLAS_POINTER_MODE_HOST));
}

}  // namespace

int64_t attention_saved_numel(const AttentionShape& shape) {
  return static_cast<int64_t>(shape.batch) * shape.heads * shape.query_len * shape.key_len;
}

template <typename T>
void attention_forward(Context& context, T* out, T* saved, const T* q, int ldq, const T* k,
                       int ldk, const T* v, int ldv, const AttentionShape& shape) {
  check_shape(shape, ldq, ldk, ldv);
  const int B = shape.batch, h = shape.heads, Lq = shape.query_len, Lk = shape.key_len;
  const int d_k = shape.d_k, d_v = shape.d_v, ld_out = h * d_v;
  const int pairs = B * h;
  if (pairs == 0 || Lq == 0) return;
  cudaStream_t stream = context.stream();
  if (Lk == 0) {  // nothing to attend to: every weighted sum is empty (out is contiguous)
    THPC_CUDA_CHECK(cudaMemsetAsync(out, 0, static_cast<size_t>(B) * Lq * ld_out * sizeof(T),
                                    stream));
    return;
  }
  const int64_t scores_numel = attention_saved_numel(shape);
  const int64_t block = static_cast<int64_t>(Lq) * Lk;  // scores of one pair
  const bool dropping = shape.dropout > 0.0f;

  PointerPlan plan{};
  plan.heads = h;
  plan.pairs = pairs;
  // S = Q K^T: A = K, B = Q, C = S. out = P' V: A = V, B = P', C = out.
  auto layout = [&](char* base, float** scores, T** probs, T** dropped) {
    ScratchPlan scratch(base);
    const void** arrays = scratch.take<const void*>(static_cast<int64_t>(6) * pairs);
    *scores = scratch.take<float>(scores_numel);
    *probs = saved != nullptr ? saved : scratch.take<T>(scores_numel);
    *dropped = dropping ? scratch.take<T>(scores_numel) : nullptr;
    return std::make_pair(arrays, scratch.used());
  };
  float* scores;
  T *probs, *dropped;
  const size_t bytes = layout(nullptr, &scores, &probs, &dropped).second;
  const void** arrays = layout(static_cast<char*>(context.scratch(bytes)), &scores, &probs,
                               &dropped).first;
  const T* weights = dropping ? dropped : probs;  // P'
  const int a_k = add_operand(plan, k, static_cast<int64_t>(Lk) * ldk, d_k);
  const int a_q = add_operand(plan, q, static_cast<int64_t>(Lq) * ldq, d_k);
  const int a_s = add_operand(plan, scores, h * block, block);
  const int a_v = add_operand(plan, v, static_cast<int64_t>(Lk) * ldv, d_v);
  const int a_p = add_operand(plan, weights, h * block, block);
  const int a_o = add_operand(plan, out, static_cast<int64_t>(Lq) * ld_out, d_v);
  launch_build_pointers(arrays, plan, stream);
  auto array = [&](int a) { return arrays + static_cast<int64_t>(a) * pairs; };
  host_scalars(context);

  const float scale = 1.0f / std::sqrt(static_cast<float>(d_k));
  // S [Lq, Lk] = Q K^T / sqrt(d_k), fp32 out   (column-major: S^T = K^T' Q^T)
  batched_gemm(context, CUBLAS_OP_T, CUBLAS_OP_N, Lk, Lq, d_k, scale, array(a_k), cuda_type<T>(),
               ldk, array(a_q), ldq, 0.0f, const_cast<void* const*>(array(a_s)), CUDA_R_32F, Lk,
               pairs);
  const int64_t rows = static_cast<int64_t>(pairs) * Lq;
  softmax_dropout_rows<T><<<row_blocks(rows), kRowsPerBlock * kWarp, 0, stream>>>(
      probs, dropped, scores, rows, row_mask(shape));
  THPC_CUDA_CHECK_LAUNCH("softmax_dropout_rows");
  // out [Lq, d_v] = P' V   (column-major: out^T = V^T P'^T)
  batched_gemm(context, CUBLAS_OP_N, CUBLAS_OP_N, d_v, Lq, Lk, 1.0f, array(a_v), cuda_type<T>(),
               ldv, array(a_p), Lk, 0.0f, const_cast<void* const*>(array(a_o)), cuda_type<T>(),
               ld_out, pairs);
}

template <typename T>
void attention_backward(Context& context, T* dq, T* dk, T* dv, const T* d_out, const T* saved,
                        const T* q, int ldq, const T* k, int ldk, const T* v, int ldv,
                        const AttentionShape& shape) {
  check_shape(shape, ldq, ldk, ldv);
  THPC_CHECK(saved != nullptr, "attention backward needs the probabilities saved by forward");
  const int B = shape.batch, h = shape.heads, Lq = shape.query_len, Lk = shape.key_len;
  const int d_k = shape.d_k, d_v = shape.d_v, ld_out = h * d_v;
  const int pairs = B * h;
  if (pairs == 0 || Lq == 0 || Lk == 0) return;  // no products, no gradient
  const bool need_scores = dq != nullptr || dk != nullptr;
  if (dv == nullptr && !need_scores) return;
  cudaStream_t stream = context.stream();
  const int64_t scores_numel = attention_saved_numel(shape);
  const int64_t block = static_cast<int64_t>(Lq) * Lk;
  const bool dropping = shape.dropout > 0.0f;
  const RowMask mask = row_mask(shape);

  auto layout = [&](char* base, T** dropped, float** d_dropped, T** d_scores) {
    ScratchPlan scratch(base);
    const void** arrays = scratch.take<const void*>(static_cast<int64_t>(kMaxPointerArrays) * pairs);
    *dropped = dropping && dv != nullptr ? scratch.take<T>(scores_numel) : nullptr;
    *d_dropped = need_scores ? scratch.take<float>(scores_numel) : nullptr;
    *d_scores = need_scores ? scratch.take<T>(scores_numel) : nullptr;
    return std::make_pair(arrays, scratch.used());
  };
  T *dropped, *d_scores;
  float* d_dropped;
  const size_t bytes = layout(nullptr, &dropped, &d_dropped, &d_scores).second;
  const void** arrays = layout(static_cast<char*>(context.scratch(bytes)), &dropped, &d_dropped,
                               &d_scores).first;

  PointerPlan plan{};
  plan.heads = h;
  plan.pairs = pairs;
  const int a_do = add_operand(plan, d_out, static_cast<int64_t>(Lq) * ld_out, d_v);
  int a_p = -1, a_dv = -1, a_v = -1, a_g = -1, a_k = -1, a_ds = -1, a_dq = -1, a_q = -1,
      a_dk = -1;
  if (dv != nullptr) {
    a_p = add_operand(plan, dropping ? dropped : saved, h * block, block);
    a_dv = add_operand(plan, dv, static_cast<int64_t>(Lk) * ldv, d_v);
  }
  if (need_scores) {
    a_v = add_operand(plan, v, static_cast<int64_t>(Lk) * ldv, d_v);
    a_g = add_operand(plan, d_dropped, h * block, block);
    a_ds = add_operand(plan, d_scores, h * block, block);
    if (dq != nullptr) {
      a_k = add_operand(plan, k, static_cast<int64_t>(Lk) * ldk, d_k);
      a_dq = add_operand(plan, dq, static_cast<int64_t>(Lq) * ldq, d_k);
    }
    if (dk != nullptr) {
      a_q = add_operand(plan, q, static_cast<int64_t>(Lq) * ldq, d_k);
      a_dk = add_operand(plan, dk, static_cast<int64_t>(Lk) * ldk, d_k);
    }
  }
  launch_build_pointers(arrays, plan, stream);
  auto array = [&](int a) { return arrays + static_cast<int64_t>(a) * pairs; };
  auto out_array = [&](int a) { return const_cast<void* const*>(array(a)); };
  host_scalars(context);
  const cudaDataType_t type = cuda_type<T>();

  if (dv != nullptr) {
    if (dropping) {
      const int threads = 256;
      const int64_t wanted = (scores_numel + threads - 1) / threads;
      const unsigned blocks = static_cast<unsigned>(wanted < 65536 ? wanted : 65536);
      apply_dropout<T><<<blocks, threads, 0, stream>>>(dropped, saved, scores_numel, mask);
      THPC_CUDA_CHECK_LAUNCH("apply_dropout");
    }
    // dV [Lk, d_v] += P'^T dO   (column-major: dV^T += dO^T P')
    batched_gemm(context, CUBLAS_OP_N, CUBLAS_OP_T, d_v, Lk, Lq, 1.0f, array(a_do), type, ld_out,
                 array(a_p), Lk, 1.0f, out_array(a_dv), type, ldv, pairs);
  }
  if (!need_scores) return;
  // dP' [Lq, Lk] = dO V^T, fp32 out   (column-major: dP'^T = V dO^T)
  batched_gemm(context, CUBLAS_OP_T, CUBLAS_OP_N, Lk, Lq, d_v, 1.0f, array(a_v), type, ldv,
               array(a_do), ld_out, 0.0f, out_array(a_g), CUDA_R_32F, Lk, pairs);
  const int64_t rows = static_cast<int64_t>(pairs) * Lq;
  softmax_backward_rows<T><<<row_blocks(rows), kRowsPerBlock * kWarp, 0, stream>>>(
      d_scores, d_dropped, saved, rows, mask);
  THPC_CUDA_CHECK_LAUNCH("softmax_backward_rows");
  const float scale = 1.0f / std::sqrt(static_cast<float>(d_k));
  if (dq != nullptr) {
    // dQ [Lq, d_k] += dS K / sqrt(d_k)   (column-major: dQ^T += K^T dS^T)
    batched_gemm(context, CUBLAS_OP_N, CUBLAS_OP_N, d_k, Lq, Lk, scale, array(a_k), type, ldk,
                 array(a_ds), Lk, 1.0f, out_array(a_dq), type, ldq, pairs);
  }
  if (dk != nullptr) {
    // dK [Lk, d_k] += dS^T Q / sqrt(d_k)   (column-major: dK^T += Q^T dS)
    batched_gemm(context, CUBLAS_OP_N, CUBLAS_OP_T, d_k, Lk, Lq, scale, array(a_q), type, ldq,
                 array(a_ds), Lk, 1.0f, out_array(a_dk), type, ldk, pairs);
  }
}

#define INSTANTIATE(T)                                                                         \
  template void attention_forward<T>(Context&, T*, T*, const T*, int, const T*, int, const T*, \
                                     int, const AttentionShape&);                              \
  template void attention_backward<T>(Context&, T*, T*, T*, const T*, const T*, const T*, int, \
                                      const T*, int, const T*, int, const AttentionShape&);
INSTANTIATE(float)
INSTANTIATE(bf16)
#undef INSTANTIATE

}  // namespace thpc::cuda
