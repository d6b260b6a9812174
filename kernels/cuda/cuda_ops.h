// The CUDA ops: the contracts of kernels/ops.h on an sm_90 GPU.
//
// Each op's launcher (its twin) takes the backend's Context, then (outputs, inputs,
// sizes) like llm.c's; it queues its work on the Context's stream, and the ones that
// call cuBLASLt or need scratch memory use the Context's handles and buffers. Each op is
// a template over the activation type T, instantiated for float (the fp32 mode, checked
// tightly against the CPU) and __nv_bfloat16 (training precision); the ops whose
// tensors are all fp32 (Adam, the sum of squares, scaling) ignore T.
// Parameter-side tensors that the op writes — weight gradients, layer-norm statistics,
// Adam state — are always fp32 (float*), whatever T is: master weights, moments and
// statistics stay in fp32 (docs/design-model.md, "Mixed precision"). The weights the GEMMs read
// are the bf16 (or fp32) compute copy, type T.
//
// One .cu file per op family, forward and backward side by side, each with its CPU twin
// in kernels/cpu and a test against that twin in tests/kernels/<family>_test.cc:
//   embedding.cu, linear.cu, layernorm.cu, attention.cu, elementwise.cu,
//   cross_entropy.cu, top_k.cu, adam.cu.
//
// Determinism: no op uses floating-point atomics. Reductions over rows (embedding and
// bias/gamma gradients, loss sums, norms) run in a fixed order, so two runs of the same
// step give bit-identical results — what the golden resume test needs on the GPU too.
#pragma once

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/ops.h"

namespace thpc {
namespace cuda {
using bf16 = __nv_bfloat16;
}  // namespace cuda

// A bf16 Tensor holds __nv_bfloat16: what the backend checks before a twin gets a bf16*.
template <>
constexpr DType dtype_of<cuda::bf16>() { return DType::BF16; }

}  // namespace thpc

namespace thpc::cuda {

// Bytes an element of a GEMM operand type takes: fp32 4, bf16 2 (the only two used).
inline size_t gemm_type_bytes(cudaDataType_t type) { return type == CUDA_R_32F ? 4 : 2; }

// cudaFree and cudaFreeHost behind a FreeGate (kernels/capture_free_lock.h): they wait
// while another thread's capture that holds a ConcurrentCaptureScope is under way (the
// candidate worker_graphs' decoding workers), since their device synchronisation would
// invalidate it. Every free of the backends and their Contexts goes through them.
cudaError_t free_device_memory(void* pointer);
cudaError_t free_pinned_memory(void* pointer);
// cudaMallocHost behind the same gate. Its documentation does not say it synchronises,
// but pinning pages may (the driver maps them for every context), and an allocation waits
// for another thread's capture at no cost that shows: pinned buffers grow a few times in
// a run. On the capturing thread itself it runs at once, as before.
cudaError_t allocate_pinned_memory(void** pointer, size_t bytes);

// What a launcher may use besides its stream: the cuBLAS/cuBLASLt handles bound to the
// stream, a fixed cuBLASLt workspace, and a scratch buffer that grows on demand. Ops run
// one after another on `stream`, so an op may use the scratch freely during its own
// launches but must not expect it to survive to the next op.
class Context {
 public:
  // kernels: which kernels the ops may choose (kernels/ops.h, from [train] cuda_kernels
  // and short_attention_max_len): without candidates, only those whose twins passed
  // on a GPU.
  Context(int device, const CudaKernelChoice& kernels = {});
  ~Context();
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  int device() const { return device_; }
  // The device's streaming multiprocessors (132 on an H100 or H200 SXM).
  int multiprocessors() const { return multiprocessors_; }
  // Whether an op may take candidate kernel `which` (a faster variant that has not yet run
  // on a GPU: it lands behind train.cuda_kernels until a GPU session sees its twins pass).
  bool candidate_kernel(CandidateKernels which) const {
    return (kernels_.candidates & which) != 0;
  }
  // Whether decoding steps are captured without the candidate step_graphs
  // (CudaKernelChoice::capture_decoding_steps).
  bool captures_decoding_steps() const { return kernels_.capture_decoding_steps; }
  // The longest query or key length the short-sentence attention takes (0: none).
  int short_attention_max_len() const { return kernels_.short_attention_max_len; }
  cudaStream_t stream() const { return stream_; }
  cublasHandle_t blas() const { return blas_; }
  cublasLtHandle_t lt() const { return lt_; }
  void* lt_workspace() const { return lt_workspace_; }
  size_t lt_workspace_bytes() const { return kLtWorkspaceBytes; }
  // At least `bytes` of device memory, 256-byte aligned, valid until the next call.
  void* scratch(size_t bytes);
  // Pinned host memory of at least `bytes` (loss sums, norms read back to the host).
  void* pinned(size_t bytes);
  // A device vector of at least `count` elements of `element_bytes` (2: bf16, 4: fp32)
  // that nothing else writes: the bias gradient's ones vector (linear.cu, the former
  // kept_ones), filled once, not before each use. When it was (re)made, or its fill was
  // never queued (an error in between), `to_fill` says how many elements the caller must
  // fill now (all it holds, so that a later, longer use finds them filled), and the caller
  // says kept_vector_filled() once the fill is queued; else 0. Null, nothing allocated,
  // when it would have to grow or be filled while the stream is being captured (a fill
  // captured into a graph that is then dropped would leave it unfilled): the caller then
  // takes its old path.
  void* kept_vector(size_t count, size_t element_bytes, size_t& to_fill);
  void kept_vector_filled(size_t element_bytes);
  // At least `count` floats of device memory, 256-byte aligned, for the side stream's work
  // alone (the candidates bias_grads_in_gemm and weight_grads_beside together: a layer's
  // bias sums written by its dW product beside, where the scratch buffer, stream()'s, may
  // be in use); valid until the next call. Null, nothing allocated, when it would have to
  // grow while stream() is being captured (the caller then takes its path on stream()).
  float* side_sums(size_t count);

  // The second stream of the candidate weight_grads_beside (linear.cu), with its own
  // cuBLASLt workspace (a product on it runs beside one on stream(), so they cannot share
  // one): a layer's weight gradient's products run there beside its input gradient's.
  // fork_side() makes it wait for everything queued on stream() so far, join_side() makes
  // stream() wait for everything queued on it so far; an op that forks joins before it
  // returns, so that to every other op (and a captured graph, and the profile's events)
  // the op is still one piece of work on stream(). Only with the candidate: has_side().
  bool has_side() const { return side_stream_ != nullptr; }
  cudaStream_t side_stream() const { return side_stream_; }
  void* side_lt_workspace() const { return side_lt_workspace_; }
  void fork_side();
  void join_side();
  // join_side() on a path that leaves by an exception already in flight: unchecked, its
  // errors cleared, so that it neither throws nor hides the first error.
  void join_side_unchecked() noexcept;

  // Device memory allocated through cudaMalloc by this Context (workspace, scratch) and
  // by the backend that owns it (its tensors and ids), counted on the host: what
  // Backend::peak_memory_bytes reports. cudaMalloc and cudaFree calls report here.
  void count_allocation(size_t bytes);
  void count_free(size_t bytes);
  int64_t peak_allocated_bytes() const { return peak_allocated_bytes_; }
  // How many frees count_free has seen: a captured graph (Backend::capture) is replayed
  // only while this is what it was at the capture, since its pointers may be stale after.
  uint64_t frees() const { return frees_; }

  // 32 MiB: what cuBLASLt's heuristics ask for the largest Hopper GEMM kernels.
  static constexpr size_t kLtWorkspaceBytes = size_t(32) << 20;

 private:
  // Replaces `*buffer` (of `*buffer_bytes`, counted) with at least `bytes` of device
  // memory, 256-byte aligned, 25% more to grow less often: scratch()'s and side_sums()'.
  void reallocate(void** buffer, size_t* buffer_bytes, size_t bytes);

  int device_ = 0;
  int multiprocessors_ = 1;
  CudaKernelChoice kernels_;
  cudaStream_t stream_ = nullptr;
  cublasHandle_t blas_ = nullptr;
  cublasLtHandle_t lt_ = nullptr;
  void* lt_workspace_ = nullptr;
  void* scratch_ = nullptr;
  size_t scratch_bytes_ = 0;
  void* pinned_ = nullptr;
  size_t pinned_bytes_ = 0;
  void* kept_[2] = {nullptr, nullptr};  // kept_vector's, of 2- and 4-byte elements
  size_t kept_count_[2] = {0, 0};
  bool kept_filled_[2] = {false, false};  // each one's fill queued
  cudaStream_t side_stream_ = nullptr;  // and its events and workspace: weight_grads_beside
  cudaEvent_t fork_event_ = nullptr, join_event_ = nullptr;
  void* side_lt_workspace_ = nullptr;
  void* side_sums_ = nullptr;  // side_sums()'
  size_t side_sums_bytes_ = 0;
  int64_t allocated_bytes_ = 0, peak_allocated_bytes_ = 0;
  uint64_t frees_ = 0;
};

// The Context of a backend that make_cuda_backend made (its stream, cuBLASLt handle and
// scratch), for code that adds GPU work beside its ops (Int8CudaBackend); null for any
// other backend.
Context* context_of(Backend& backend);

// y [M, N] = dequantize(xq Wq^T) + b, then max(0, .) with relu: the int8 products of
// Int8CudaBackend (kernels/cuda/int8_cuda_backend.h, where the formulas are). x [M, K]
// row-major in T; weights Wq [N, K] row-major int8 (each output's K weights together),
// column_scales s_n [N]; b [N] in T or null. The rows are quantized into the context's
// scratch, multiplied by cuBLASLt's int8 kernels into int32, and dequantized in one pass.
template <typename T>
void int8_linear(Context& context, T* y, const T* x, const int8_t* weights,
                 const float* column_scales, const T* b, int M, int K, int N, bool relu);

// The ReLU bit-mask the FFN's first layer of `rows` x `n` keeps with the candidate
// relu_masks (linear.cu): cuBLASLt's layout, the column-major [n, rows] output's bits with
// a leading dimension of n rounded up to 128 bits; its size in 32-bit words.
int64_t relu_mask_ld_bits(int n);
int64_t relu_mask_words(int rows, int n);

// dst[i] = convert(src[i]) between fp32 and bf16 (round to nearest even), or a copy
// when the types match: Backend::copy, and the refresh of the bf16 weight copy
// (elementwise.cu).
void convert(void* dst, DType dst_dtype, const void* src, DType src_dtype, int64_t n,
             cudaStream_t stream);

// The twins of the ops of kernels/op_list.h, made from the list: the twin of
//   THPC_OP(ret, name, (parameters), (arguments))
// is `template <typename T> ret name(Context& context, parameters)` with In and Out
// tensors as const T* and T*, ParamIn and ParamOut as const float* and float*. Each is
// defined in its family's .cu file and followed there by THPC_CUDA_TWIN(name), which
// instantiates it for float and bf16. A twin queues its work on context.stream().
#define In const T*
#define Out T*
#define ParamIn const float*
#define ParamOut float*
#define THPC_OP(ret, name, params, args) \
  template <typename T>                  \
  ret name(Context& context, THPC_UNPAREN params);
#include "kernels/op_list.h"
#undef THPC_OP
#undef In
#undef Out
#undef ParamIn
#undef ParamOut

}  // namespace thpc::cuda

// After a twin's definition, in its family's .cu file: its float and bf16 instantiations
// (a definition that differs from the list's declaration fails to compile here, as
// THPC_CPU_TWIN's does).
#define THPC_CUDA_TWIN(name)                    \
  template decltype(name<float>) name<float>; \
  template decltype(name<bf16>) name<bf16>;
