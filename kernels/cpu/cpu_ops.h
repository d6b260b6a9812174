// The CPU reference ops: the specification every other backend is checked against.
//
// Plain loops or a BLAS call, written for clarity. Each op is a function template over
// the element type T and is instantiated for float (what the CPU backend trains with)
// and double (what the finite-difference tests use, so a gradient check can be tight).
// Contracts, layouts and the accumulate-into-gradients rule are those of kernels/ops.h;
// the comments there are the documentation, the ones here only add what is CPU-specific.
//
// One .cc file per op family: embedding.cc, linear.cc, layernorm.cc, attention.cc,
// elementwise.cc (ReLU, dropout, residual), cross_entropy.cc, adam.cc, top_k.cc (the
// decoder's ranked next tokens).
#pragma once

#include <cstdint>

#include "kernels/ops.h"

namespace thpc::cpu {

// ---- embedding.cc ----
template <typename T>
void embedding_forward(T* out, const int32_t* tokens, const T* table, const T* positions,
                       int rows, int length, int d, int vocab, T scale);
template <typename T>
void embedding_backward(T* d_table, T* d_positions, const T* d_out, const int32_t* tokens,
                        int rows, int length, int d, int vocab, T scale);

// ---- linear.cc (BLAS: sgemm / dgemm) ----
// y = x W + b;  x [M, K], W [K, N], b [N] or null.
template <typename T>
void linear_forward(T* y, const T* x, const T* W, const T* b, int M, int K, int N);
template <typename T>
void linear_backward(T* dx, T* dW, T* db, const T* dy, const T* x, const T* W, int M, int K,
                     int N);
// logits = h E^T; h [M, d], E [vocab, d].
template <typename T>
void output_projection_forward(T* logits, const T* h, const T* E, int M, int d, int vocab);
template <typename T>
void output_projection_backward(T* dh, T* dE, const T* d_logits, const T* h, const T* E,
                                int M, int d, int vocab);

// ---- layernorm.cc ----
template <typename T>
void layernorm_forward(T* y, T* mean, T* rstd, const T* x, const T* gamma, const T* beta,
                       int rows, int d, T eps);
template <typename T>
void layernorm_backward(T* dx, T* dgamma, T* dbeta, const T* dy, const T* x, const T* mean,
                        const T* rstd, const T* gamma, int rows, int d);

// ---- attention.cc ----
// saved = the attention probabilities before dropout, [B, h, Lq, Lk] (masked entries 0).
int64_t attention_saved_numel(const AttentionShape& shape);
template <typename T>
void attention_forward(T* out, T* saved, const T* q, int ldq, const T* k, int ldk,
                       const T* v, int ldv, const AttentionShape& shape);
template <typename T>
void attention_backward(T* dq, T* dk, T* dv, const T* d_out, const T* saved, const T* q,
                        int ldq, const T* k, int ldk, const T* v, int ldv,
                        const AttentionShape& shape);

// ---- elementwise.cc ----
template <typename T>
void relu_forward(T* y, const T* x, int64_t n);
template <typename T>
void relu_backward(T* dx, const T* dy, const T* y, int64_t n);
template <typename T>
void dropout_forward(T* y, const T* x, int64_t n, float p, DropoutKey key);
template <typename T>
void dropout_backward(T* dx, const T* dy, int64_t n, float p, DropoutKey key);
template <typename T>
void residual_dropout_forward(T* y, const T* x, const T* sub, int64_t n, float p,
                              DropoutKey key);
template <typename T>
void residual_dropout_backward(T* dx, T* d_sub, const T* dy, int64_t n, float p,
                               DropoutKey key);

template <typename T>
void copy_rows(T* dst, const int32_t* dst_rows, const T* src, const int32_t* src_rows,
               int count, int width);

// ---- cross_entropy.cc ----
template <typename T>
LossSums softmax_cross_entropy(T* d_logits, const T* logits, const int32_t* targets, int rows,
                               int vocab, float eps, int pad_id, float grad_scale);
template <typename T>
void log_softmax(T* log_probs, const T* logits, int rows, int vocab);

// ---- top_k.cc ----
// Backend::row_top_k on host memory.
template <typename T>
void row_top_k(T* values, int32_t* columns, const T* x, int rows, int width, int k,
               int skip_a, int skip_b);
// The columns of a row of `width` that skip_a and skip_b leave selectable; and the
// op's argument check (throws naming the sizes), the second form also checking that
// the tensors hold [rows, k] and [rows, width]: what both backends' row_top_k check.
int row_top_k_selectable(int width, int skip_a, int skip_b);
void check_row_top_k(int rows, int width, int k, int skip_a, int skip_b);
void check_row_top_k(const Tensor& values, const Tensor& x, int rows, int width, int k,
                     int skip_a, int skip_b);

// ---- adam.cc ----
template <typename T>
void adam_update(T* params, const T* grads, T* m, T* v, int64_t n, float lr, float beta1,
                 float beta2, float eps, int64_t step);

}  // namespace thpc::cpu
