// Multi-head scaled dot-product attention (§3.2.1, §3.2.2) on the GPU:
//   out_i = Dropout(softmax(Q_i K_i^T / sqrt(d_k) + mask)) V_i,  heads concatenated,
// with the CPU twin kernels/cpu/attention.cc as the specification (same layouts, same
// saved probabilities, same Philox dropout draws).
//
// Shape of the computation. Per (sentence, head) pair there are two products, QK^T
// (2 Lq Lk d_k FLOP) and P'V (2 Lq Lk d_v FLOP), and between them a row-wise masked
// softmax + dropout over Lq Lk scores (~10 FLOP and ~10 bytes per score: fp32 S read,
// T P and P' written): GEMM-bound for d_k = 64, the row pass memory-bound. The products
// run on the tensor cores as ONE batched GEMM each over all B*h pairs
// (cublasGemmBatchedEx, fp32 accumulation): the head views of q, k, v are column blocks
// of wider row-major matrices, so pair (b, i) starts at q + b*Lq*ldq + i*d_k. That
// offset is not one uniform stride across b and i (Lq*ldq vs d_k), so strided-batched
// GEMMs would need one call per sentence (B launches per product, each only h wide); a
// device array of B*h pointers, built by one tiny kernel, gives one launch per product
// whatever B is. cuBLAS cannot check the alignment of each pointer of such an array and
// assumes it from k (gemm_pairs); our scratch matrices are padded so that it holds, and
// when a caller's head views break it (odd head widths or offsets, never the model's
// d_k = d_v = 64) we fall back to the per-sentence strided-batched loop, which cuBLAS
// checks itself. The softmax is one warp per score row (rows are Lk long, typically
// <= a few hundred: 32 lanes stride the row with coalesced loads and reduce with
// shuffles, no shared memory, no block barriers).
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
// arrays, fp32 scores (or score gradients) and the T matrices P' (and dS), each pair's
// matrix padded to a multiple of 8 elements.

#include <mma.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <map>
#include <mutex>
#include <type_traits>
#include <utility>
#include <vector>

#include "common/error.h"
#include "common/philox.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/decode_attention.cuh"
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/dropout_mask.cuh"
#include "kernels/cuda/fused_attention.cuh"
#include "kernels/cuda/grad_store.cuh"
#include "kernels/cuda/short_attention.cuh"

namespace thpc::cuda {
namespace {

constexpr int kRowsPerBlock = 4;  // warps (= score rows) per block of the row kernels

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
  return dropout_keep(m.key.seed, m.key.site, step_as_it_runs(m.key.step, m.key.inputs),
                      stream_as_it_runs(m.key.stream, m.key.inputs), element, m.dropout)
             ? m.keep_scale
             : 0.0f;
}

// Scratch matrices of one (sentence, head) pair are Lq*Lk long but start every
// `stride` = Lq*Lk rounded up to 8 elements, so that every per-pair pointer handed to
// the batched GEMMs is 16-byte aligned (see gemm_pairs). Row r = pair*Lq + t of such a
// matrix starts at pair*stride + t*Lk; the same row of `saved` (contiguous, the CPU's
// layout) at r*Lk.
__device__ __forceinline__ int64_t padded_row(int64_t r, int query_len, int key_len,
                                              int64_t stride) {
  return (r / query_len) * stride + (r % query_len) * key_len;
}

// One warp per score row: masked, stable softmax of the fp32 scores S (already scaled
// by 1/sqrt(d_k)) -> P (type T, masked entries exactly 0) into `saved` (contiguous; may
// be null) and P' = P * M / (1 - p) into `weights` (padded), P' computed from the
// rounded P so that forward and backward use the same P'.
template <typename T>
__global__ void softmax_dropout_rows(T* __restrict__ saved, T* __restrict__ weights,
                                     const float* __restrict__ scores, int64_t rows,
                                     int64_t stride, RowMask mask) {
  const int lane = threadIdx.x % kWarp;
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / kWarp;
  if (r >= rows) return;  // whole warp leaves together: the shuffles below stay full
  const int Lk = mask.key_len;
  const int visible = visible_keys(mask, r);
  const int64_t at = padded_row(r, mask.query_len, Lk, stride);
  const float* s = scores + at;
  float row_max = -INFINITY;
  for (int j = lane; j < visible; j += kWarp) row_max = fmaxf(row_max, s[j]);
  row_max = warp_max(row_max);
  float sum = 0.0f;
  for (int j = lane; j < visible; j += kWarp) sum += expf(s[j] - row_max);
  sum = warp_sum(sum);
  const float inverse_sum = visible > 0 ? 1.0f / sum : 0.0f;
  T* p_row = saved != nullptr ? saved + r * Lk : nullptr;
  T* w_row = weights + at;
  const uint64_t first = static_cast<uint64_t>(r) * Lk;  // element index of P[.., t, 0]
  for (int j = lane; j < Lk; j += kWarp) {
    const T p = from_float<T>(j < visible ? expf(s[j] - row_max) * inverse_sum : 0.0f);
    if (p_row != nullptr) p_row[j] = p;
    w_row[j] = mask.dropout == 0.0f ? p : from_float<T>(to_float(p) * dropout_factor(mask, first + j));
  }
}

// P' = P * M / (1 - p) (a copy when p = 0) from the contiguous saved P into the padded
// weights, over all B*h*Lq*Lk elements (backward).
template <typename T>
__global__ void dropped_weights(T* __restrict__ weights, const T* __restrict__ saved,
                                int64_t n, int64_t block, int64_t stride, RowMask mask) {
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < n;
       e += step) {
    const T p = saved[e];
    weights[(e / block) * stride + e % block] =
        mask.dropout == 0.0f ? p : from_float<T>(to_float(p) * dropout_factor(mask, static_cast<uint64_t>(e)));
  }
}

// One warp per row: dP = dP' * M / (1 - p), dS = P * (dP - rowsum(dP * P)) -> T.
// Masked entries have P = 0 and so dS = 0. dP' and dS are padded, P (saved) is not.
template <typename T>
__global__ void softmax_backward_rows(T* __restrict__ d_scores, const float* __restrict__ d_dropped,
                                      const T* __restrict__ saved, int64_t rows, int64_t stride,
                                      RowMask mask) {
  const int lane = threadIdx.x % kWarp;
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / kWarp;
  if (r >= rows) return;
  const int Lk = mask.key_len;
  const int64_t at = padded_row(r, mask.query_len, Lk, stride);
  const float* g = d_dropped + at;
  const T* p_row = saved + r * Lk;
  const uint64_t first = static_cast<uint64_t>(r) * Lk;
  float dot = 0.0f;
  for (int j = lane; j < Lk; j += kWarp) {
    dot += g[j] * dropout_factor(mask, first + j) * to_float(p_row[j]);
  }
  dot = warp_sum(dot);
  T* out = d_scores + at;
  for (int j = lane; j < Lk; j += kWarp) {
    const float dp = g[j] * dropout_factor(mask, first + j);
    out[j] = from_float<T>(to_float(p_row[j]) * (dp - dot));
  }
}

// One GEMM operand over the B*h pairs: pair (b, head) starts at
// base + b*b_stride + head*head_stride elements of `type`, leading dimension ld.
struct Operand {
  const void* base;
  int64_t b_stride, head_stride;
  cudaDataType_t type;
  int ld;
  int array = -1;  // index of its device pointer array (set by PointerArrays::add)
};


template <typename U>
Operand operand(const U* base, int64_t b_stride, int64_t head_stride, int ld) {
  return Operand{base, b_stride, head_stride,
                 std::is_same<U, float>::value ? CUDA_R_32F : CUDA_R_16BF, ld};
}

// The device arrays of per-pair pointers of up to kMaxPointerArrays operands, filled by
// one launch of build_pointers.
struct PointerSpec {
  const char* base;
  int64_t b_stride;     // bytes
  int64_t head_stride;  // bytes
};
constexpr int kMaxPointerArrays = 12;
struct PointerPlan {
  PointerSpec spec[kMaxPointerArrays];
  int count;
  int heads;
  int pairs;
};

// arrays[a * pairs + i] = the pointer of pair i = b*h + head in operand a.
__global__ void build_pointers(const void** arrays, PointerPlan plan) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= plan.pairs) return;
  const int b = i / plan.heads, head = i % plan.heads;
  for (int a = 0; a < plan.count; ++a) {
    const PointerSpec& s = plan.spec[a];
    arrays[static_cast<int64_t>(a) * plan.pairs + i] =
        s.base + b * s.b_stride + head * s.head_stride;
  }
}

class PointerArrays {
 public:
  PointerArrays(int heads, int pairs) {
    plan_.count = 0;
    plan_.heads = heads;
    plan_.pairs = pairs;
  }
  void add(Operand& op) {
    THPC_CHECK(plan_.count < kMaxPointerArrays, "attention pointer plan overflow");
    const int64_t size = static_cast<int64_t>(gemm_type_bytes(op.type));
    plan_.spec[plan_.count] = PointerSpec{static_cast<const char*>(op.base),
                                          op.b_stride * size, op.head_stride * size};
    op.array = plan_.count++;
  }
  void build(const void** arrays, cudaStream_t stream) {
    arrays_ = arrays;
    const int threads = 128;
    build_pointers<<<(plan_.pairs + threads - 1) / threads, threads, 0, stream>>>(arrays, plan_);
    THPC_CUDA_CHECK_LAUNCH("build_pointers");
  }
  const void* const* of(const Operand& op) const {
    return arrays_ + static_cast<int64_t>(op.array) * plan_.pairs;
  }

 private:
  PointerPlan plan_{};
  const void** arrays_ = nullptr;
};

// Whether every per-pair pointer of `op` meets cuBLAS's alignment rule for pointer-array
// batched GEMMs with reduced-precision / tensor-core math (cuBLAS cannot inspect each
// pointer, so it assumes: k % 8 == 0 -> 16-byte aligned, k % 2 == 0 -> 4-byte aligned).
bool meets_alignment(const Operand& op, int k) {
  const int64_t need = k % 8 == 0 ? 16 : k % 2 == 0 ? 4 : 1;
  const int64_t size = static_cast<int64_t>(gemm_type_bytes(op.type));
  return reinterpret_cast<uintptr_t>(op.base) % need == 0 && op.b_stride * size % need == 0 &&
         op.head_stride * size % need == 0;
}

// C = alpha op(A) op(B) + beta C for every pair, in cuBLAS's column-major terms, fp32
// compute. One cublasGemmBatchedEx over all B*h pairs when every pointer meets the
// alignment rule (always so for the model's d_k = d_v = 64 and our padded scratch);
// otherwise (odd head widths or offsets) one cublasGemmStridedBatchedEx per sentence over
// its h heads, whose base pointers cuBLAS checks itself.
void gemm_pairs(Context& context, const PointerArrays& arrays, int batch, int heads,
                cublasOperation_t op_a, cublasOperation_t op_b, int m, int n, int k,
                float alpha, const Operand& a, const Operand& b, float beta, const Operand& c) {
  if (meets_alignment(a, k) && meets_alignment(b, k) && meets_alignment(c, k)) {
    THPC_CUBLAS_CHECK(cublasGemmBatchedEx(
        context.blas(), op_a, op_b, m, n, k, &alpha, arrays.of(a), a.type, a.ld, arrays.of(b),
        b.type, b.ld, &beta, const_cast<void* const*>(arrays.of(c)), c.type, c.ld,
        batch * heads, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    return;
  }
  auto at = [](const Operand& op, int s) {
    return static_cast<const char*>(op.base) +
           static_cast<int64_t>(s) * op.b_stride * static_cast<int64_t>(gemm_type_bytes(op.type));
  };
  for (int s = 0; s < batch; ++s) {
    THPC_CUBLAS_CHECK(cublasGemmStridedBatchedEx(
        context.blas(), op_a, op_b, m, n, k, &alpha, at(a, s), a.type, a.ld, a.head_stride,
        at(b, s), b.type, b.ld, b.head_stride, &beta, const_cast<char*>(at(c, s)), c.type,
        c.ld, c.head_stride, heads, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  }
}

// Bump allocation inside one scratch buffer, every piece 256-byte aligned: first plan
// the sizes (base == nullptr), then call Context::scratch once and take again.
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

RowMask row_mask(const AttentionShape& shape) {
  const float p = shape.dropout;
  return RowMask{shape.heads, shape.query_len, shape.key_len, shape.causal, shape.key_lengths,
                 p, 1.0f / (1.0f - p), shape.dropout_key};
}

// Lq*Lk rounded up to 8 elements: the per-pair stride of the scratch matrices (16 bytes
// or more in both precisions).
int64_t padded_block(int Lq, int Lk) {
  return (static_cast<int64_t>(Lq) * Lk + 7) / 8 * 8;
}

unsigned row_blocks(int64_t rows) {
  return static_cast<unsigned>((rows + kRowsPerBlock - 1) / kRowsPerBlock);
}

// Cublas' default pointer mode is host; set it anyway (alpha and beta live on the host)
// in case another user of the shared handle changed it.
void host_scalars(Context& context) {
  THPC_CUBLAS_CHECK(cublasSetPointerMode(context.blas(), CUBLAS_POINTER_MODE_HOST));
}

// ---- Short sentences in one launch (kernels/cuda/short_attention.cuh) ----

// What the GPU's execution policies of the bodies written once for two executions
// (short_attention.cuh, decode_attention.cuh) share: loops over the block's threads, its
// warps and a warp's lanes, the barriers, and the warps' fixed butterflies.
struct BlockLoops {
  __device__ int first_thread() const { return threadIdx.x; }
  __device__ int thread_step() const { return blockDim.x; }
  __device__ int first_warp() const { return threadIdx.x / kWarp; }
  __device__ int warp_step() const { return blockDim.x / kWarp; }
  __device__ int first_lane() const { return threadIdx.x % kWarp; }
  __device__ int lane_step() const { return kWarp; }
  __device__ void sync() const { __syncthreads(); }
  __device__ void warp_sync() const { __syncwarp(); }
  // The fixed butterflies of device_util.cuh: every lane ends with the same bits.
  __device__ float warp_sum(float value) const { return ::thpc::cuda::warp_sum(value); }
  __device__ float warp_max(float value) const { return ::thpc::cuda::warp_max(value); }
};

// The execution policy of short_attention's bodies on the GPU: the block's threads, its
// warps computing 16x16x16 bf16 tiles with nvcuda::wmma (fp32 accumulators).
struct WmmaBlock : BlockLoops {
  using Element = __nv_bfloat16;
  struct Accumulator {
    nvcuda::wmma::fragment<nvcuda::wmma::accumulator, 16, 16, 16, float> tile;
  };
  __device__ int warp_slot() const { return threadIdx.x / kWarp; }
  __device__ void zero(Accumulator& acc) const { nvcuda::wmma::fill_fragment(acc.tile, 0.0f); }
  __device__ void scale(Accumulator& acc, float factor) const {
    for (int e = 0; e < acc.tile.num_elements; ++e) acc.tile.x[e] *= factor;
  }
  // acc += A B for one 16x16x16 step; A (B) is read column-major, i.e. it is the
  // transpose of the row-major matrix at a (b), when kAColumns (kBColumns).
  template <bool kAColumns, bool kBColumns>
  __device__ void mma(Accumulator& acc, const Element* a, int lda, const Element* b,
                      int ldb) const {
    using namespace nvcuda;
    using ALayout = std::conditional_t<kAColumns, wmma::col_major, wmma::row_major>;
    using BLayout = std::conditional_t<kBColumns, wmma::col_major, wmma::row_major>;
    wmma::fragment<wmma::matrix_a, 16, 16, 16, Element, ALayout> fa;
    wmma::fragment<wmma::matrix_b, 16, 16, 16, Element, BLayout> fb;
    wmma::load_matrix_sync(fa, a, lda);
    wmma::load_matrix_sync(fb, b, ldb);
    wmma::mma_sync(acc.tile, fa, fb, acc.tile);
  }
  __device__ void store(float* to, const Accumulator& acc, int ld) const {
    nvcuda::wmma::store_matrix_sync(to, acc.tile, ld, nvcuda::wmma::mem_row_major);
  }
  __device__ float exp(float value) const { return expf(value); }
  __device__ Element round(float value) const { return __float2bfloat16_rn(value); }
  __device__ float widen(Element value) const { return __bfloat162float(value); }
  __device__ void copy16(Element* to, const Element* from) const {
    *reinterpret_cast<uint4*>(to) = *reinterpret_cast<const uint4*>(from);
  }
  __device__ void zero16(Element* to) const {
    *reinterpret_cast<uint4*>(to) = make_uint4(0u, 0u, 0u, 0u);
  }
  __device__ void load8(float (&values)[8], const Element* from) const {
    load16<Element>(values, from);
  }
  __device__ void store8(Element* to, const float (&values)[8]) const {
    store16<Element>(to, values);
  }
};

__global__ void __launch_bounds__(short_attention::kThreads)
    short_attention_forward_kernel(short_attention::Args<__nv_bfloat16> args) {
  extern __shared__ __align__(128) char shared[];
  WmmaBlock block;
  short_attention::forward_block(block, args, static_cast<int>(blockIdx.x), shared);
}

__global__ void __launch_bounds__(short_attention::kThreads)
    short_attention_backward_kernel(short_attention::Args<__nv_bfloat16> args) {
  extern __shared__ __align__(128) char shared[];
  WmmaBlock block;
  short_attention::backward_block(block, args, static_cast<int>(blockIdx.x), shared);
}

std::atomic<int64_t> short_attention_launch_count{0};

// Whether `kernel` may use `bytes` of dynamic shared memory on `device`: the first call
// per kernel and device raises its limit to `largest` (the kernel's largest layout,
// beyond the default 48 KiB) where the device's opt-in allows it, and remembers the
// limit. False: the batched path runs.
bool kernel_shared_memory(const void* kernel, int device, int largest, int bytes) {
  static std::mutex mutex;
  static std::map<std::pair<const void*, int>, int> limits;
  std::lock_guard<std::mutex> lock(mutex);
  auto found = limits.find({kernel, device});
  if (found == limits.end()) {
    int optin = 0;
    THPC_CUDA_CHECK(
        cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
    int limit = 48 * 1024;
    if (optin >= largest) {
      THPC_CUDA_CHECK(
          cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, largest));
      limit = largest;
    }
    found = limits.emplace(std::make_pair(kernel, device), limit).first;
  }
  return bytes <= found->second;
}

bool short_attention_shared_memory(const void* kernel, int device, int bytes) {
  return kernel_shared_memory(
      kernel, device,
      short_attention::layout(short_attention::kMaxLength, short_attention::kMaxLength, true)
          .bytes,
      bytes);
}

// Whether a call has the shapes both one-launch kernels (short and fused) take: bf16, no
// gathered key rows, short_attention_fits (d_k = d_v = 64, lengths 1..128, 16-byte
// rows), every pointer the kernels move 16 bytes at a time 16-byte aligned.
template <typename T>
bool one_launch_attention_fits(const AttentionShape& shape, int ldq, int ldk, int ldv,
                               std::initializer_list<const void*> pointers) {
  if (!std::is_same<T, __nv_bfloat16>::value) return false;
  if (shape.key_rows != nullptr || shape.batch <= 0 || shape.heads <= 0) return false;
  if (!short_attention::short_attention_fits(shape.d_k, shape.d_v, shape.query_len,
                                             shape.key_len, ldq, ldk, ldv)) {
    return false;
  }
  for (const void* pointer : pointers) {
    if (pointer != nullptr && !aligned16(pointer)) return false;
  }
  return true;
}

// Whether this call takes the short kernels: one_launch_attention_fits, and both lengths
// within train.short_attention_max_len (past ~48 pieces the batched GEMMs are faster:
// kShortAttentionDefaultMaxLength).
template <typename T>
bool takes_short_attention(Context& context, const AttentionShape& shape, int ldq, int ldk,
                           int ldv, std::initializer_list<const void*> pointers) {
  const int longest = std::max(shape.query_len, shape.key_len);
  return longest <= context.short_attention_max_len() &&
         one_launch_attention_fits<T>(shape, ldq, ldk, ldv, pointers);
}

template <typename T>
bool short_attention_forward(Context& context, T* out, T* saved, const T* q, int ldq,
                             const T* k, int ldk, const T* v, int ldv,
                             const AttentionShape& shape) {
  if constexpr (!std::is_same<T, __nv_bfloat16>::value) {
    return false;
  } else {
    if (!takes_short_attention<T>(context, shape, ldq, ldk, ldv, {out, q, k, v})) return false;
    const int bytes = short_attention::layout(shape.query_len, shape.key_len, false).bytes;
    const void* kernel = reinterpret_cast<const void*>(&short_attention_forward_kernel);
    if (!short_attention_shared_memory(kernel, context.device(), bytes)) return false;
    short_attention::Args<T> args = short_attention::args_of(q, ldq, k, ldk, v, ldv, shape);
    args.out = out;
    args.saved = saved;
    short_attention_forward_kernel<<<shape.batch * shape.heads, short_attention::kThreads,
                                     bytes, context.stream()>>>(args);
    THPC_CUDA_CHECK_LAUNCH("short_attention_forward_kernel");
    ++short_attention_launch_count;
    return true;
  }
}

// The backward's part of a one-launch kernel's arguments (short, fused): the gradients
// (null: not wanted), dO, the saved P, and which gradients are written (kWrite: stored
// without a read) rather than added into.
template <typename T>
void set_backward_args(short_attention::Args<T>& args, T* dq, T* dk, T* dv, const T* d_out,
                       const T* saved, GradStore store) {
  args.saved = const_cast<T*>(saved);
  args.d_out = d_out;
  args.dq = dq;
  args.dk = dk;
  args.dv = dv;
  args.write_dq = writes_gradient(store, dq);
  args.write_dk = writes_gradient(store, dk);
  args.write_dv = writes_gradient(store, dv);
}

template <typename T>
bool short_attention_backward(Context& context, T* dq, T* dk, T* dv, const T* d_out,
                              const T* saved, const T* q, int ldq, const T* k, int ldk,
                              const T* v, int ldv, const AttentionShape& shape, GradStore store) {
  if constexpr (!std::is_same<T, __nv_bfloat16>::value) {
    return false;
  } else {
    if (!takes_short_attention<T>(context, shape, ldq, ldk, ldv, {dq, dk, dv, d_out, q, k, v})) {
      return false;
    }
    const int bytes = short_attention::layout(shape.query_len, shape.key_len, true).bytes;
    const void* kernel = reinterpret_cast<const void*>(&short_attention_backward_kernel);
    if (!short_attention_shared_memory(kernel, context.device(), bytes)) return false;
    if (dq == nullptr && dk == nullptr && dv == nullptr) return true;
    short_attention::Args<T> args = short_attention::args_of(q, ldq, k, ldk, v, ldv, shape);
    set_backward_args(args, dq, dk, dv, d_out, saved, store);
    short_attention_backward_kernel<<<shape.batch * shape.heads, short_attention::kThreads,
                                      bytes, context.stream()>>>(args);
    THPC_CUDA_CHECK_LAUNCH("short_attention_backward_kernel");
    ++short_attention_launch_count;
    return true;
  }
}

// ---- Attention in registers (kernels/cuda/fused_attention.cuh; candidate) ----

// The execution policy of fused_attention's bodies on the GPU: the block's threads, the
// tensor cores' warp-level mma.sync m16n8k16 (bf16 in, fp32 accumulators) on fragments
// loaded by ldmatrix from shared memory, and xor shuffles.
struct MmaWarps {
  using Element = __nv_bfloat16;
  __device__ int first_thread() const { return threadIdx.x; }
  __device__ int thread_step() const { return blockDim.x; }
  __device__ int warp() const { return threadIdx.x / kWarp; }
  __device__ int lane() const { return threadIdx.x % kWarp; }
  __device__ void sync() const { __syncthreads(); }
  __device__ void warp_sync() const { __syncwarp(); }
  __device__ float shfl_xor(float value, int mask) const {
    return __shfl_xor_sync(0xffffffffu, value, mask);
  }
  // Four 8x8 tiles of 16-bit elements: lanes 8i..8i+7 give tile i's row addresses
  // (shared memory, 16-byte aligned); word i of each lane is its part of tile i.
  __device__ void ldmatrix_x4(uint32_t (&words)[4], const Element* row) const {
    const unsigned address = static_cast<unsigned>(__cvta_generic_to_shared(row));
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(words[0]), "=r"(words[1]), "=r"(words[2]), "=r"(words[3])
                 : "r"(address)
                 : "memory");
  }
  __device__ void ldmatrix_x4_trans(uint32_t (&words)[4], const Element* row) const {
    const unsigned address = static_cast<unsigned>(__cvta_generic_to_shared(row));
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(words[0]), "=r"(words[1]), "=r"(words[2]), "=r"(words[3])
                 : "r"(address)
                 : "memory");
  }
  // acc (16x8, fp32) += A (16x16) B (16x8), bf16 operands.
  __device__ void mma(float (&acc)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) const {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(acc[0]), "+f"(acc[1]), "+f"(acc[2]), "+f"(acc[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
  // Two bf16 in one word, the first (lower column) in the low half.
  __device__ uint32_t pack(Element low, Element high) const {
    return static_cast<uint32_t>(__bfloat16_as_ushort(low)) |
           (static_cast<uint32_t>(__bfloat16_as_ushort(high)) << 16);
  }
  // A score's exp as the hardware's exp2 (device_util.cuh's exp_by_exp2): the exps are
  // most of the softmax's instructions, which outnumber the tensor cores' (a 16 x 8 x 16
  // mma.sync serves 128 scores' two products); its ~1e-6 relative error is far inside P's
  // bf16 rounding (2^-8).
  __device__ float exp(float value) const { return exp_by_exp2(value); }
  __device__ Element round(float value) const { return __float2bfloat16_rn(value); }
  __device__ float widen(Element value) const { return __bfloat162float(value); }
  __device__ void copy16(Element* to, const Element* from) const {
    *reinterpret_cast<uint4*>(to) = *reinterpret_cast<const uint4*>(from);
  }
  __device__ void zero16(Element* to) const {
    *reinterpret_cast<uint4*>(to) = make_uint4(0u, 0u, 0u, 0u);
  }
  // Two rounded values to `to` (4-byte aligned: an even column of a row of ld % 8 == 0).
  __device__ void store_pair(Element* to, float v0, float v1) const {
    *reinterpret_cast<__nv_bfloat162*>(to) = __floats2bfloat162_rn(v0, v1);
  }
  // Two elements to or from `at` in one 4-byte access (`at` 4-byte aligned).
  __device__ void store_raw_pair(Element* at, Element first, Element second) const {
    *reinterpret_cast<__nv_bfloat162*>(at) = __halves2bfloat162(first, second);
  }
  __device__ void load_raw_pair(const Element* at, Element (&pair)[2]) const {
    const __nv_bfloat162 both = *reinterpret_cast<const __nv_bfloat162*>(at);
    pair[0] = __low2bfloat16(both);
    pair[1] = __high2bfloat16(both);
  }
};

using FusedArgs = fused_attention::Args<__nv_bfloat16>;

// The forward and the query blocks for calls of KS key steps (fused_attention::
// with_key_steps chooses); the key blocks hold no key-long registers.
template <int KS>
__global__ void __launch_bounds__(fused_attention::kThreads)
    fused_attention_forward_kernel(FusedArgs args, fused_attention::Packing packing) {
  extern __shared__ __align__(128) char shared[];
  MmaWarps x;
  fused_attention::forward_block<KS>(x, args, packing, static_cast<int>(blockIdx.x), shared);
}

template <int KS>
__global__ void __launch_bounds__(fused_attention::kThreads)
    fused_attention_query_kernel(FusedArgs args, fused_attention::Packing packing) {
  extern __shared__ __align__(128) char shared[];
  MmaWarps x;
  fused_attention::query_block_backward<KS>(x, args, packing, static_cast<int>(blockIdx.x),
                                            shared);
}

__global__ void __launch_bounds__(fused_attention::kThreads)
    fused_attention_key_kernel(FusedArgs args, fused_attention::Packing packing) {
  extern __shared__ __align__(128) char shared[];
  MmaWarps x;
  fused_attention::key_block_backward(x, args, packing, static_cast<int>(blockIdx.x), shared);
}

std::atomic<int64_t> fused_attention_launch_count{0};

__global__ void fused_attention_fragment_probe_kernel(uint32_t* words, uint32_t* trans_words,
                                                      float* products) {
  __shared__ __align__(128) __nv_bfloat16 tile[16 * fused_attention::kLdHead];
  MmaWarps x;
  fused_attention::fragment_probe(x, tile, words, trans_words, products);
}

// Whether this call takes the fused kernels: the candidate named (train.cuda_kernels =
// fused_attention) and one_launch_attention_fits (the fused kernels' limits are the short
// kernels', fused_attention_fits). Checked before the short kernels: where both fit, the
// fused ones run.
template <typename T>
bool takes_fused_attention(Context& context, const AttentionShape& shape, int ldq, int ldk,
                           int ldv, std::initializer_list<const void*> pointers) {
  return context.candidate_kernel(kFusedAttention) &&
         one_launch_attention_fits<T>(shape, ldq, ldk, ldv, pointers);
}

template <typename T>
bool fused_attention_forward(Context& context, T* out, T* saved, const T* q, int ldq,
                             const T* k, int ldk, const T* v, int ldv,
                             const AttentionShape& shape) {
  if constexpr (!std::is_same<T, __nv_bfloat16>::value) {
    return false;
  } else {
    if (!takes_fused_attention<T>(context, shape, ldq, ldk, ldv, {out, saved, q, k, v})) {
      return false;
    }
    FusedArgs args;
    static_cast<short_attention::Args<T>&>(args) =
        short_attention::args_of(q, ldq, k, ldk, v, ldv, shape);
    args.out = out;
    args.saved = saved;
    const fused_attention::Packing packing =  // <= kQueryBlockBytes (46,080) a block
        fused_attention::query_packing(shape.query_len, shape.key_len, shape.batch * shape.heads);
    fused_attention::with_key_steps(fused_attention::key_steps_of(shape.key_len), [&](auto ks) {
      fused_attention_forward_kernel<decltype(ks)::value>
          <<<packing.blocks(), fused_attention::kThreads, packing.bytes(), context.stream()>>>(
              args, packing);
    });
    THPC_CUDA_CHECK_LAUNCH("fused_attention_forward_kernel");
    ++fused_attention_launch_count;
    return true;
  }
}

template <typename T>
bool fused_attention_backward(Context& context, T* dq, T* dk, T* dv, const T* d_out,
                              const T* saved, const T* q, int ldq, const T* k, int ldk,
                              const T* v, int ldv, const AttentionShape& shape, GradStore store) {
  if constexpr (!std::is_same<T, __nv_bfloat16>::value) {
    return false;
  } else {
    if (!takes_fused_attention<T>(context, shape, ldq, ldk, ldv,
                                  {dq, dk, dv, d_out, saved, q, k, v})) {
      return false;
    }
    const int pairs = shape.batch * shape.heads;
    const fused_attention::Packing query_blocks =
        fused_attention::query_packing(shape.query_len, shape.key_len, pairs);
    const fused_attention::Packing key_blocks =
        fused_attention::key_packing(shape.query_len, shape.key_len, pairs);
    const void* key_kernel = reinterpret_cast<const void*>(&fused_attention_key_kernel);
    if (!kernel_shared_memory(key_kernel, context.device(), fused_attention::kKeyBlockBytes,
                              key_blocks.bytes())) {
      return false;
    }
    if (dq == nullptr && dk == nullptr && dv == nullptr) return true;
    FusedArgs args;
    static_cast<short_attention::Args<T>&>(args) =
        short_attention::args_of(q, ldq, k, ldk, v, ldv, shape);
    set_backward_args(args, dq, dk, dv, d_out, saved, store);
    if (dk != nullptr) {  // dS of every (pair, query, key), from the query blocks to the key blocks
      args.d_scores = static_cast<T*>(context.scratch(static_cast<size_t>(pairs) * shape.query_len *
                                                      shape.key_len * sizeof(T)));
    }
    if (dq != nullptr || dk != nullptr) {
      fused_attention::with_key_steps(fused_attention::key_steps_of(shape.key_len), [&](auto ks) {
        fused_attention_query_kernel<decltype(ks)::value>
            <<<query_blocks.blocks(), fused_attention::kThreads, query_blocks.bytes(),
               context.stream()>>>(args, query_blocks);
      });
      THPC_CUDA_CHECK_LAUNCH("fused_attention_query_kernel");
    }
    if (dk != nullptr || dv != nullptr) {
      fused_attention_key_kernel<<<key_blocks.blocks(), fused_attention::kThreads,
                                   key_blocks.bytes(), context.stream()>>>(args, key_blocks);
      THPC_CUDA_CHECK_LAUNCH("fused_attention_key_kernel");
    }
    ++fused_attention_launch_count;
    return true;
  }
}

// ---- Gathered keys: a decoding step over the shared-prefix cache ----
// (A candidate until its twins, memcheck and newstest2014 decoding passed on an H100 on
// 2026-11-26: bf16 beam 4 went 27,714 -> 31,372 tokens/s in 4,096-token batches and
// 15,353 -> 18,356 at 32 sentences, bench/RESULTS.md.) Incremental decoding
// keeps one pool of key|value rows that a beam's hypotheses share (model/
// decoder_state.h) when the backend's attention can read a sentence's keys where
// AttentionShape::key_rows lists them: then a beam reorder moves no cache rows (on the
// H100's decode profile, the row copies and top-k were 12% of a batch) and a query
// reads only the keys it sees (the batched path reads all max_len of a hypothesis'
// cache rows, masked: attention was 25% of the batch at 0.85 TFLOP/s, ~10x its bytes).
// One block per (sentence b, head, query t): the query and the row list in shared
// memory; S_j = q . k_j / sqrt(d_k) a warp per key (lanes over the head's columns, a
// fixed butterfly); the row's max and sum over the block in a fixed order; P rounded to
// T, as the batched path rounds it before its second product; out = sum_j P_j v_j, each
// warp over every fourth key with its lanes over the columns, the warps' partial rows
// added in a fixed order. No
// dropout (decoding has none); P saved when asked (zeros past the visible keys, as the
// CPU's). Forward only. Bound: memory, each visible key and value row read once per
// (b, head, t); deterministic (no atomics, fixed orders).
constexpr int kGatheredThreads = 128;
constexpr int kGatheredWarps = kGatheredThreads / kWarp;

template <typename T>
struct GatheredArgs {
  T* out;
  T* saved;
  const T* q;
  const T* k;
  const T* v;
  int ldq, ldk, ldv;
  const int32_t* key_rows;     // [B, Lk]
  const int32_t* key_lengths;  // [B] or null (all Lk)
  int heads, query_len, key_len, d_k, d_v;
  bool causal;
  float scale;  // 1 / sqrt(d_k)
};

// The block's combination (Max or Sum) of one value per thread, in every thread;
// `partials` holds a value per warp. A fixed tree (device_util.cuh's butterfly in each
// warp, then the warps in order): the same inputs give the same bits.
struct MaxOf {
  static __device__ float warp(float x) { return warp_max(x); }
  __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};
struct SumOf {
  static __device__ float warp(float x) { return warp_sum(x); }
  __device__ float operator()(float a, float b) const { return a + b; }
};
template <typename Combine>
__device__ float gathered_block_reduce(float x, float* partials, Combine combine) {
  const int lane = threadIdx.x & (kWarp - 1), warp = threadIdx.x / kWarp;
  x = Combine::warp(x);
  if (lane == 0) partials[warp] = x;
  __syncthreads();
  float result = partials[0];
  for (int w = 1; w < kGatheredWarps; ++w) result = combine(result, partials[w]);
  __syncthreads();  // partials is reused by the next reduction
  return result;
}

// Shared memory: the query's d_k floats, then Lk scores (then probabilities), then each
// warp's partial output (kGatheredWarps x d_v floats), then the sentence's Lk row indices.
inline size_t gathered_shared_bytes(const AttentionShape& shape) {
  return sizeof(float) * static_cast<size_t>(shape.d_k + shape.key_len +
                                             kGatheredWarps * shape.d_v) +
         sizeof(int32_t) * static_cast<size_t>(shape.key_len);
}

template <typename T>
__global__ void __launch_bounds__(kGatheredThreads)
    gathered_attention_kernel(GatheredArgs<T> a) {
  extern __shared__ float gathered_shared[];
  __shared__ float partials[kGatheredWarps];
  float* query = gathered_shared;
  float* probs = query + a.d_k;
  float* warp_out = probs + a.key_len;  // [kGatheredWarps, d_v]
  int32_t* rows = reinterpret_cast<int32_t*>(warp_out + kGatheredWarps * a.d_v);
  const int t = blockIdx.x % a.query_len;
  const int pair = blockIdx.x / a.query_len;
  const int head = pair % a.heads, b = pair / a.heads;
  // Clamped to [0, Lk] as the batched path's row mask does: never a row past the list.
  const int valid =
      a.key_lengths != nullptr ? min(max(a.key_lengths[b], 0), a.key_len) : a.key_len;
  const int visible = a.causal && t + 1 < valid ? t + 1 : valid;
  const int lane = threadIdx.x & (kWarp - 1), warp = threadIdx.x / kWarp;

  const int64_t query_row = static_cast<int64_t>(b) * a.query_len + t;
  for (int c = threadIdx.x; c < a.d_k; c += kGatheredThreads) {
    query[c] = to_float(a.q[query_row * a.ldq + static_cast<int64_t>(head) * a.d_k + c]);
  }
  for (int j = threadIdx.x; j < visible; j += kGatheredThreads) {
    rows[j] = a.key_rows[static_cast<int64_t>(b) * a.key_len + j];
  }
  __syncthreads();
  // S_j, a warp per key.
  for (int j = warp; j < visible; j += kGatheredWarps) {
    const T* key = a.k + static_cast<int64_t>(rows[j]) * a.ldk + static_cast<int64_t>(head) * a.d_k;
    float partial = 0.0f;
    for (int c = lane; c < a.d_k; c += kWarp) partial = fmaf(query[c], to_float(key[c]), partial);
    partial = warp_sum(partial);
    if (lane == 0) probs[j] = partial * a.scale;
  }
  __syncthreads();
  // P_j = exp(S_j - max) / sum over the visible keys, rounded to T.
  float row_max = -INFINITY;
  for (int j = threadIdx.x; j < visible; j += kGatheredThreads) row_max = fmaxf(row_max, probs[j]);
  row_max = gathered_block_reduce(row_max, partials, MaxOf{});
  float sum = 0.0f;
  for (int j = threadIdx.x; j < visible; j += kGatheredThreads) {
    const float e = expf(probs[j] - row_max);
    probs[j] = e;
    sum += e;
  }
  sum = gathered_block_reduce(sum, partials, SumOf{});
  const float inverse = visible > 0 ? 1.0f / sum : 0.0f;
  for (int j = threadIdx.x; j < visible; j += kGatheredThreads) {
    probs[j] = to_float(from_float<T>(probs[j] * inverse));
  }
  __syncthreads();
  if (a.saved != nullptr) {
    T* saved_row = a.saved + ((static_cast<int64_t>(b) * a.heads + head) * a.query_len + t) * a.key_len;
    for (int j = threadIdx.x; j < a.key_len; j += kGatheredThreads) {
      saved_row[j] = from_float<T>(j < visible ? probs[j] : 0.0f);
    }
  }
  // out = sum_j P_j v_j: warp w sums the keys j = w, w + kGatheredWarps, ... in order (its lanes
  // over the columns: a value row read by the warp together), then the warps' partial
  // rows are added in warp order. Every warp is busy and 4 keys' loads are in flight
  // (a thread per column left half the block idle at d_v = 64, one load at a time).
  for (int c = lane; c < a.d_v; c += kWarp) {
    float acc = 0.0f;
    for (int j = warp; j < visible; j += kGatheredWarps) {
      acc = fmaf(probs[j], to_float(a.v[static_cast<int64_t>(rows[j]) * a.ldv +
                                         static_cast<int64_t>(head) * a.d_v + c]),
                 acc);
    }
    warp_out[warp * a.d_v + c] = acc;
  }
  __syncthreads();
  T* out_row = a.out + query_row * (static_cast<int64_t>(a.heads) * a.d_v) +
               static_cast<int64_t>(head) * a.d_v;
  for (int c = threadIdx.x; c < a.d_v; c += kGatheredThreads) {
    float sum_of_warps = warp_out[c];
    for (int w = 1; w < kGatheredWarps; ++w) sum_of_warps += warp_out[w * a.d_v + c];
    out_row[c] = from_float<T>(sum_of_warps);
  }
}

template <typename T>
void gathered_attention_forward(Context& context, T* out, T* saved, const T* q, int ldq,
                                const T* k, int ldk, const T* v, int ldv,
                                const AttentionShape& shape) {
  THPC_CHECK(shape.dropout == 0.0f,
             "attention over gathered key rows with dropout " << shape.dropout
                 << " on CUDA: decoding has none");
  // 48 KiB a block, static (the reduction's partials) and dynamic together: ~6,000 keys
  // at d_k = 64, far beyond any decoding length a model's positions allow in practice.
  const size_t bytes = gathered_shared_bytes(shape);
  const size_t static_bytes = sizeof(float) * kGatheredWarps;
  if (bytes + static_bytes > 48 * 1024) {
    THPC_FAIL("decoding " << shape.key_len << " positions on the GPU needs "
                          << bytes + static_bytes
                          << " bytes of shared memory a block for the attention over the "
                             "cached keys, more than the 48 KiB it may take: decode shorter "
                             "outputs (--max-len-a, --max-len-b) or on the CPU");
  }
  const int64_t blocks = static_cast<int64_t>(shape.batch) * shape.heads * shape.query_len;
  if (blocks == 0) return;
  THPC_CHECK(blocks <= INT32_MAX, blocks << " attention blocks");
  GatheredArgs<T> args{out, saved, q, k, v, ldq, ldk, ldv, shape.key_rows, shape.key_lengths,
                       shape.heads, shape.query_len, shape.key_len, shape.d_k, shape.d_v,
                       shape.causal, 1.0f / std::sqrt(static_cast<float>(shape.d_k))};
  gathered_attention_kernel<T><<<static_cast<int>(blocks), kGatheredThreads, bytes,
                                 context.stream()>>>(args);
  THPC_CUDA_CHECK_LAUNCH("gathered_attention_kernel");
}

// ---- A decoding step's self-attention, a warp a head (the former decode_attention) ----
// (decode_attention.cuh; its twins passed on an H200, 2026-12-04.) The execution policy of
// its block body: a loop over lanes shared among a warp's 32 lanes, the fixed butterflies
// of device_util.cuh, and the rows' loads and the output's stores as 16-byte vectors.
template <typename T>
struct LaneWarps : BlockLoops {
  __device__ float exp(float value) const { return expf(value); }
  __device__ float fma(float a, float b, float c) const { return fmaf(a, b, c); }
  __device__ float widen(T value) const { return to_float(value); }
  __device__ T round(float value) const { return from_float<T>(value); }
  // Eight elements from 16-byte aligned memory (decode_attention::fits and the launcher
  // checked the rows' alignment): device_util.cuh's 16-byte moves, one or two.
  __device__ void load8(float (&values)[8], const T* from) const {
    constexpr int kPer = kVector<T>;  // 8 bf16 or 4 floats a move
#pragma unroll
    for (int part = 0; part < 8 / kPer; ++part) {
      float moved[kPer];
      load16(moved, from + part * kPer);
#pragma unroll
      for (int e = 0; e < kPer; ++e) values[part * kPer + e] = moved[e];
    }
  }
  __device__ int lane() const { return threadIdx.x % kWarp; }
  __device__ float shfl_xor(float value, int mask) const {
    return __shfl_xor_sync(0xffffffffu, value, mask);
  }
  // Eight elements, rounded, to 16-byte aligned memory.
  __device__ void store8(T* to, const float (&values)[8]) const {
    constexpr int kPer = kVector<T>;
#pragma unroll
    for (int part = 0; part < 8 / kPer; ++part) {
      float moved[kPer];
#pragma unroll
      for (int e = 0; e < kPer; ++e) moved[e] = values[part * kPer + e];
      store16(to + part * kPer, moved);
    }
  }
};

template <typename T>
__global__ void __launch_bounds__(decode_attention::kThreads)
    decode_attention_kernel(decode_attention::Args<T> args) {
  extern __shared__ __align__(16) char decode_shared[];
  LaneWarps<T> x;
  decode_attention::block(x, args, static_cast<int64_t>(blockIdx.x), decode_shared);
}

std::atomic<int64_t> decode_attention_launch_count{0};

// The warp-a-head kernel's launch (the former candidate decode_attention, the default since
// the H200 window of 2026-12-04), or false where it does not fit (the gathered kernel then
// runs).
template <typename T>
bool decode_attention_forward(Context& context, T* out, T* saved, const T* q, int ldq,
                              const T* k, int ldk, const T* v, int ldv,
                              const AttentionShape& shape) {
  if (!decode_attention::fits(shape, ldk, ldv, static_cast<int>(sizeof(T))) || !aligned16(k) ||
      !aligned16(v) || !aligned16(out)) {
    return false;
  }
  const int64_t blocks = decode_attention::blocks(shape);
  THPC_CHECK(blocks <= INT32_MAX, blocks << " decoding attention blocks");
  const decode_attention::Args<T> args =
      decode_attention::args_of(out, saved, q, ldq, k, ldk, v, ldv, shape);
  decode_attention_kernel<T><<<static_cast<unsigned>(blocks), decode_attention::kThreads,
                               decode_attention::shared_bytes(shape.key_len), context.stream()>>>(
      args);
  THPC_CUDA_CHECK_LAUNCH("decode_attention_kernel");
  ++decode_attention_launch_count;
  return true;
}

}  // namespace

template <typename T>
void attention_forward(Context& context, T* out, T* saved, const T* q, int ldq, const T* k,
                       int ldk, const T* v, int ldv, const AttentionShape& shape) {
  check_attention_shape(shape, ldq, ldk, ldv);
  if (shape.key_rows != nullptr) {
    if (decode_attention_forward(context, out, saved, q, ldq, k, ldk, v, ldv, shape)) return;
    gathered_attention_forward(context, out, saved, q, ldq, k, ldk, v, ldv, shape);
    return;
  }
  const int B = shape.batch, h = shape.heads, Lq = shape.query_len, Lk = shape.key_len;
  const int d_k = shape.d_k, d_v = shape.d_v, ld_out = h * d_v;
  const int pairs = B * h;
  if (pairs == 0 || Lq == 0) return;
  if (fused_attention_forward(context, out, saved, q, ldq, k, ldk, v, ldv, shape)) return;
  if (short_attention_forward(context, out, saved, q, ldq, k, ldk, v, ldv, shape)) return;
  cudaStream_t stream = context.stream();
  if (Lk == 0) {  // nothing to attend to: every weighted sum is empty (out is contiguous)
    THPC_CUDA_CHECK(cudaMemsetAsync(out, 0, static_cast<size_t>(B) * Lq * ld_out * sizeof(T),
                                    stream));
    return;
  }
  const int64_t stride = padded_block(Lq, Lk);
  // Scratch: pointer arrays, S (fp32), P' (T), the last two padded per pair.
  auto layout = [&](char* base, const void*** arrays, float** scores, T** weights) {
    ScratchPlan plan(base);
    *arrays = plan.take<const void*>(static_cast<int64_t>(6) * pairs);
    *scores = plan.take<float>(pairs * stride);
    *weights = plan.take<T>(pairs * stride);
    return plan.used();
  };
  const void** arrays;
  float* scores;
  T* weights;
  const size_t bytes = layout(nullptr, &arrays, &scores, &weights);
  layout(static_cast<char*>(context.scratch(bytes)), &arrays, &scores, &weights);

  // S = Q K^T: A = K, B = Q, C = S. out = P' V: A = V, B = P', C = out.
  Operand op_k = operand(k, static_cast<int64_t>(Lk) * ldk, d_k, ldk);
  Operand op_q = operand(q, static_cast<int64_t>(Lq) * ldq, d_k, ldq);
  Operand op_s = operand(scores, h * stride, stride, Lk);
  Operand op_v = operand(v, static_cast<int64_t>(Lk) * ldv, d_v, ldv);
  Operand op_w = operand(weights, h * stride, stride, Lk);
  Operand op_o = operand(out, static_cast<int64_t>(Lq) * ld_out, d_v, ld_out);
  PointerArrays pointers(h, pairs);
  for (Operand* op : {&op_k, &op_q, &op_s, &op_v, &op_w, &op_o}) pointers.add(*op);
  pointers.build(arrays, stream);
  host_scalars(context);

  const float scale = 1.0f / std::sqrt(static_cast<float>(d_k));
  // S [Lq, Lk] = Q K^T / sqrt(d_k), fp32   (column-major: S^T = (K^T)^T Q^T)
  gemm_pairs(context, pointers, B, h, CUBLAS_OP_T, CUBLAS_OP_N, Lk, Lq, d_k, scale, op_k, op_q,
             0.0f, op_s);
  const int64_t rows = static_cast<int64_t>(pairs) * Lq;
  softmax_dropout_rows<T><<<row_blocks(rows), kRowsPerBlock * kWarp, 0, stream>>>(
      saved, weights, scores, rows, stride, row_mask(shape));
  THPC_CUDA_CHECK_LAUNCH("softmax_dropout_rows");
  // out [Lq, d_v] = P' V   (column-major: out^T = V^T P'^T)
  gemm_pairs(context, pointers, B, h, CUBLAS_OP_N, CUBLAS_OP_N, d_v, Lq, Lk, 1.0f, op_v, op_w,
             0.0f, op_o);
}

template <typename T>
void attention_backward(Context& context, T* dq, T* dk, T* dv, const T* d_out, const T* saved,
                        const T* q, int ldq, const T* k, int ldk, const T* v, int ldv,
                        const AttentionShape& shape, GradStore store) {
  check_attention_shape(shape, ldq, ldk, ldv);
  THPC_CHECK(shape.key_rows == nullptr, "attention backward over gathered key rows");
  THPC_CHECK(saved != nullptr, "attention backward needs the probabilities saved by forward");
  const int B = shape.batch, h = shape.heads, Lq = shape.query_len, Lk = shape.key_len;
  const int d_k = shape.d_k, d_v = shape.d_v, ld_out = h * d_v;
  const int pairs = B * h;
  if (fused_attention_backward(context, dq, dk, dv, d_out, saved, q, ldq, k, ldk, v, ldv, shape,
                               store) ||
      short_attention_backward(context, dq, dk, dv, d_out, saved, q, ldq, k, ldk, v, ldv, shape,
                               store)) {
    return;
  }
  // kWrite: the three products below with beta = 0 (each covers its head columns of every
  // row).
  const int64_t q_rows = static_cast<int64_t>(B) * Lq, k_rows = static_cast<int64_t>(B) * Lk;
  const bool write_dq = writes_gradient(store, dq);
  const bool write_dk = writes_gradient(store, dk);
  const bool write_dv = writes_gradient(store, dv);
  if (pairs == 0 || Lq == 0 || Lk == 0) {  // no products: a zero gradient
    if (write_dq) zero_columns(context, dq, q_rows, h * d_k, ldq);
    if (write_dk) zero_columns(context, dk, k_rows, h * d_k, ldk);
    if (write_dv) zero_columns(context, dv, k_rows, h * d_v, ldv);
    return;
  }
  const bool need_scores = dq != nullptr || dk != nullptr;
  if (dv == nullptr && !need_scores) return;
  cudaStream_t stream = context.stream();
  const int64_t block = static_cast<int64_t>(Lq) * Lk, stride = padded_block(Lq, Lk);
  const RowMask mask = row_mask(shape);

  // Scratch: pointer arrays; P' (T, for dV), dP' (fp32) and dS (T), padded per pair.
  auto layout = [&](char* base, const void*** arrays, T** weights, float** d_dropped,
                    T** d_scores) {
    ScratchPlan plan(base);
    *arrays = plan.take<const void*>(static_cast<int64_t>(kMaxPointerArrays) * pairs);
    *weights = dv != nullptr ? plan.take<T>(pairs * stride) : nullptr;
    *d_dropped = need_scores ? plan.take<float>(pairs * stride) : nullptr;
    *d_scores = need_scores ? plan.take<T>(pairs * stride) : nullptr;
    return plan.used();
  };
  const void** arrays;
  T *weights, *d_scores;
  float* d_dropped;
  const size_t bytes = layout(nullptr, &arrays, &weights, &d_dropped, &d_scores);
  layout(static_cast<char*>(context.scratch(bytes)), &arrays, &weights, &d_dropped, &d_scores);

  PointerArrays pointers(h, pairs);
  Operand op_do = operand(d_out, static_cast<int64_t>(Lq) * ld_out, d_v, ld_out);
  pointers.add(op_do);
  Operand op_w{}, op_dv{}, op_v{}, op_g{}, op_ds{}, op_k{}, op_dq{}, op_q{}, op_dk{};
  if (dv != nullptr) {
    op_w = operand(weights, h * stride, stride, Lk);
    op_dv = operand(dv, static_cast<int64_t>(Lk) * ldv, d_v, ldv);
    pointers.add(op_w);
    pointers.add(op_dv);
  }
  if (need_scores) {
    op_v = operand(v, static_cast<int64_t>(Lk) * ldv, d_v, ldv);
    op_g = operand(d_dropped, h * stride, stride, Lk);
    op_ds = operand(d_scores, h * stride, stride, Lk);
    for (Operand* op : {&op_v, &op_g, &op_ds}) pointers.add(*op);
    if (dq != nullptr) {
      op_k = operand(k, static_cast<int64_t>(Lk) * ldk, d_k, ldk);
      op_dq = operand(dq, static_cast<int64_t>(Lq) * ldq, d_k, ldq);
      pointers.add(op_k);
      pointers.add(op_dq);
    }
    if (dk != nullptr) {
      op_q = operand(q, static_cast<int64_t>(Lq) * ldq, d_k, ldq);
      op_dk = operand(dk, static_cast<int64_t>(Lk) * ldk, d_k, ldk);
      pointers.add(op_q);
      pointers.add(op_dk);
    }
  }
  pointers.build(arrays, stream);
  host_scalars(context);

  if (dv != nullptr) {
    const int threads = 256;
    const int64_t n = static_cast<int64_t>(pairs) * block;
    const int64_t wanted = (n + threads - 1) / threads;
    const unsigned blocks = static_cast<unsigned>(wanted < 65536 ? wanted : 65536);
    dropped_weights<T><<<blocks, threads, 0, stream>>>(weights, saved, n, block, stride, mask);
    THPC_CUDA_CHECK_LAUNCH("dropped_weights");
    // dV [Lk, d_v] += P'^T dO   (column-major: dV^T += dO^T P')
    gemm_pairs(context, pointers, B, h, CUBLAS_OP_N, CUBLAS_OP_T, d_v, Lk, Lq, 1.0f, op_do, op_w,
               gradient_beta(write_dv), op_dv);
  }
  if (!need_scores) return;
  // dP' [Lq, Lk] = dO V^T, fp32   (column-major: dP'^T = (V^T)^T dO^T)
  gemm_pairs(context, pointers, B, h, CUBLAS_OP_T, CUBLAS_OP_N, Lk, Lq, d_v, 1.0f, op_v, op_do,
             0.0f, op_g);
  const int64_t rows = static_cast<int64_t>(pairs) * Lq;
  softmax_backward_rows<T><<<row_blocks(rows), kRowsPerBlock * kWarp, 0, stream>>>(
      d_scores, d_dropped, saved, rows, stride, mask);
  THPC_CUDA_CHECK_LAUNCH("softmax_backward_rows");
  const float scale = 1.0f / std::sqrt(static_cast<float>(d_k));
  if (dq != nullptr) {
    // dQ [Lq, d_k] += dS K / sqrt(d_k)   (column-major: dQ^T += K^T dS^T)
    gemm_pairs(context, pointers, B, h, CUBLAS_OP_N, CUBLAS_OP_N, d_k, Lq, Lk, scale, op_k, op_ds,
               gradient_beta(write_dq), op_dq);
  }
  if (dk != nullptr) {
    // dK [Lk, d_k] += dS^T Q / sqrt(d_k)   (column-major: dK^T += Q^T dS)
    gemm_pairs(context, pointers, B, h, CUBLAS_OP_N, CUBLAS_OP_T, d_k, Lk, Lq, scale, op_q, op_ds,
               gradient_beta(write_dk), op_dk);
  }
}

THPC_CUDA_TWIN(attention_forward)
THPC_CUDA_TWIN(attention_backward)

}  // namespace thpc::cuda

int64_t thpc::cuda_short_attention_launches() {
  return thpc::cuda::short_attention_launch_count.load();
}

int64_t thpc::cuda_decode_attention_launches() {
  return thpc::cuda::decode_attention_launch_count.load();
}

int64_t thpc::cuda_fused_attention_launches() {
  return thpc::cuda::fused_attention_launch_count.load();
}

void thpc::cuda_fused_attention_fragment_probe(std::vector<uint32_t>& words,
                                               std::vector<uint32_t>& trans_words,
                                               std::vector<float>& products) {
  using namespace thpc::cuda;
  words.assign(32 * 4, 0u);
  trans_words.assign(32 * 4, 0u);
  products.assign(32 * 8, 0.0f);
  uint32_t* device_words = nullptr;
  float* device_products = nullptr;
  THPC_CUDA_CHECK(cudaMalloc(&device_words, sizeof(uint32_t) * 2 * 32 * 4));
  THPC_CUDA_CHECK(cudaMalloc(&device_products, sizeof(float) * 32 * 8));
  fused_attention_fragment_probe_kernel<<<1, 32>>>(device_words, device_words + 32 * 4,
                                                   device_products);
  THPC_CUDA_CHECK_LAUNCH("fused_attention_fragment_probe_kernel");
  THPC_CUDA_CHECK(cudaMemcpy(words.data(), device_words, sizeof(uint32_t) * 32 * 4,
                             cudaMemcpyDeviceToHost));
  THPC_CUDA_CHECK(cudaMemcpy(trans_words.data(), device_words + 32 * 4,
                             sizeof(uint32_t) * 32 * 4, cudaMemcpyDeviceToHost));
  THPC_CUDA_CHECK(cudaMemcpy(products.data(), device_products, sizeof(float) * 32 * 8,
                             cudaMemcpyDeviceToHost));
  THPC_CUDA_CHECK(cudaFree(device_words));
  THPC_CUDA_CHECK(cudaFree(device_products));
}
