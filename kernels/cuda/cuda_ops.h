// The CUDA ops: the contracts of kernels/ops.h on an sm_90 GPU.
//
// Launchers take (outputs, inputs, sizes, stream) like llm.c's; the ones that call
// cuBLASLt or need scratch memory take the backend's Context instead of a bare stream.
// Each op is a template over the activation type T, instantiated for float (the fp32
// mode, checked tightly against the CPU) and __nv_bfloat16 (training precision).
// Parameter-side tensors that the op writes — weight gradients, layer-norm statistics,
// Adam state — are always fp32 (float*), whatever T is: master weights, moments and
// statistics stay in fp32 (docs/design.md, "Mixed precision"). The weights the GEMMs read are
// the bf16 (or fp32) compute copy, type T.
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

namespace thpc::cuda {

using bf16 = __nv_bfloat16;

// What a launcher may use besides its stream: the cuBLAS/cuBLASLt handles bound to the
// stream, a fixed cuBLASLt workspace, and a scratch buffer that grows on demand. Ops run
// one after another on `stream`, so an op may use the scratch freely during its own
// launches but must not expect it to survive to the next op.
class Context {
 public:
  explicit Context(int device);
  ~Context();
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  int device() const { return device_; }
  cudaStream_t stream() const { return stream_; }
  cublasHandle_t blas() const { return blas_; }
  cublasLtHandle_t lt() const { return lt_; }
  void* lt_workspace() const { return lt_workspace_; }
  size_t lt_workspace_bytes() const { return kLtWorkspaceBytes; }
  // At least `bytes` of device memory, 256-byte aligned, valid until the next call.
  void* scratch(size_t bytes);
  // Pinned host memory of at least `bytes` (loss sums, norms read back to the host).
  void* pinned(size_t bytes);

  // 32 MiB: what cuBLASLt's heuristics ask for the largest Hopper GEMM kernels.
  static constexpr size_t kLtWorkspaceBytes = size_t(32) << 20;

 private:
  int device_ = 0;
  cudaStream_t stream_ = nullptr;
  cublasHandle_t blas_ = nullptr;
  cublasLtHandle_t lt_ = nullptr;
  void* lt_workspace_ = nullptr;
  void* scratch_ = nullptr;
  size_t scratch_bytes_ = 0;
  void* pinned_ = nullptr;
  size_t pinned_bytes_ = 0;
};

// ---- elementwise.cu ----------------------------------------------------------------
// dst[i] = convert(src[i]) between fp32 and bf16 (round to nearest even), or a copy
// when the types match. Backend::copy, and the refresh of the bf16 weight copy.
void convert(void* dst, DType dst_dtype, const void* src, DType src_dtype, int64_t n,
             cudaStream_t stream);
template <typename T>
void relu_forward(T* y, const T* x, int64_t n, cudaStream_t stream);
template <typename T>
void relu_backward(T* dx, const T* dy, const T* y, int64_t n, cudaStream_t stream);
// Masks are the CPU's: element i is kept when dropout_keep(seed, site, step, stream, i, p).
template <typename T>
void dropout_forward(T* y, const T* x, int64_t n, float p, DropoutKey key,
                     cudaStream_t stream);
template <typename T>
void dropout_backward(T* dx, const T* dy, int64_t n, float p, DropoutKey key,
                      cudaStream_t stream);
template <typename T>
void residual_dropout_forward(T* y, const T* x, const T* sub, int64_t n, float p,
                              DropoutKey key, cudaStream_t stream);
template <typename T>
void residual_dropout_backward(T* dx, T* d_sub, const T* dy, int64_t n, float p,
                               DropoutKey key, cudaStream_t stream);
template <typename T>
void copy_rows(T* dst, const int32_t* dst_rows, const T* src, const int32_t* src_rows,
               int count, int width, cudaStream_t stream);
// x *= alpha over fp32 values.
void scale(float* x, int64_t n, float alpha, cudaStream_t stream);
// sum_i x_i^2 in double, in a fixed order; synchronises the stream to return it.
double sum_squares(Context& context, const float* x, int64_t n);

// ---- embedding.cu --------------------------------------------------------------------
template <typename T>
void embedding_forward(T* out, const int32_t* tokens, const T* table, const T* positions,
                       int rows, int length, int d, int vocab, float scale,
                       cudaStream_t stream);
// d_table[tokens[r]] += d_out[r] * scale (and d_positions[r % length] += d_out[r] when
// d_positions is non-null), rows with the same token summed in row order.
template <typename T>
void embedding_backward(Context& context, float* d_table, float* d_positions, const T* d_out,
                        const int32_t* tokens, int rows, int length, int d, int vocab,
                        float scale);

// ---- linear.cu (cuBLASLt, fp32 accumulation) ----------------------------------------
// y = x W + b; x [M, K], W [K, N], b [N] or null (fused as the bias epilogue).
template <typename T>
void linear_forward(Context& context, T* y, const T* x, const T* W, const T* b, int M, int K,
                    int N);
// dx += dy W^T (T); dW += x^T dy and db += colsum(dy) in fp32. Any output may be null.
template <typename T>
void linear_backward(Context& context, T* dx, float* dW, float* db, const T* dy, const T* x,
                     const T* W, int M, int K, int N);
// logits = h E^T; h [M, d], E [vocab, d].
template <typename T>
void output_projection_forward(Context& context, T* logits, const T* h, const T* E, int M,
                               int d, int vocab);
// dh += d_logits E (T); dE += d_logits^T h (fp32).
template <typename T>
void output_projection_backward(Context& context, T* dh, float* dE, const T* d_logits,
                                const T* h, const T* E, int M, int d, int vocab);

// ---- layernorm.cu (fp32 statistics) --------------------------------------------------
template <typename T>
void layernorm_forward(T* y, float* mean, float* rstd, const T* x, const T* gamma,
                       const T* beta, int rows, int d, float eps, cudaStream_t stream);
// dx += ...; dgamma, dbeta += column sums in fp32, in a fixed order.
template <typename T>
void layernorm_backward(Context& context, T* dx, float* dgamma, float* dbeta, const T* dy,
                        const T* x, const float* mean, const float* rstd, const T* gamma,
                        int rows, int d);

// ---- attention.cu (batched GEMMs + a fused masked softmax) ---------------------------
// saved = the probabilities before dropout, [B, h, Lq, Lk] of T, as on the CPU.
// shape.key_lengths is device memory.
int64_t attention_saved_numel(const AttentionShape& shape);
template <typename T>
void attention_forward(Context& context, T* out, T* saved, const T* q, int ldq, const T* k,
                       int ldk, const T* v, int ldv, const AttentionShape& shape);
template <typename T>
void attention_backward(Context& context, T* dq, T* dk, T* dv, const T* d_out, const T* saved,
                        const T* q, int ldq, const T* k, int ldk, const T* v, int ldv,
                        const AttentionShape& shape);

// ---- cross_entropy.cu (fused softmax + label smoothing, fp32 statistics) ------------
// Reads each row of logits once for its statistics and writes d_logits (may alias
// logits) without materialising fp32 logits; returns the sums (synchronises the
// stream). A target outside [0, vocab) that is not pad_id throws, naming the row.
template <typename T>
LossSums softmax_cross_entropy(Context& context, T* d_logits, const T* logits,
                               const int32_t* targets, int rows, int vocab, float eps,
                               int pad_id, float grad_scale);
template <typename T>
void log_softmax(T* log_probs, const T* logits, int rows, int vocab, cudaStream_t stream);

// ---- top_k.cu (Backend::row_top_k) -------------------------------------------------------
// Each row's k best entries of x [rows, width], larger first, NaN last, ties to the
// smaller column, never skip_a or skip_b: values [rows, k] fp32, columns [rows, k].
// The caller checks k against the selectable columns (cpu::check_row_top_k).
template <typename T>
void row_top_k(float* values, int32_t* columns, const T* x, int rows, int width, int k,
               int skip_a, int skip_b, cudaStream_t stream);

// ---- adam.cu --------------------------------------------------------------------------
// One fused pass over the flat fp32 buffers (§5.3, with bias correction).
void adam_update(float* params, const float* grads, float* m, float* v, int64_t n, float lr,
                 float beta1, float beta2, float eps, int64_t step, cudaStream_t stream);

}  // namespace thpc::cuda
