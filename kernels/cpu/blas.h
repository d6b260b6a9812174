// The BLAS entry points of the CPU reference ops, overloaded so a template over the
// element type picks the float (s) or double (d) routine: row-major
// C = alpha * op(A) op(B) + beta * C with op(A) [m, k] and op(B) [k, n], and its
// one-row case y = alpha * op(A) x + beta * y, which BLAS does without packing A (the
// packing copy dominates a GEMM whose result is a single row).
#pragma once

#include <cblas.h>

#include "kernels/ops.h"

namespace thpc::cpu {

// The beta of a GEMM whose C is an activation gradient stored as `store` says: 1 adds into
// C; 0 writes it (BLAS then reads no C and scales a zeroed C, so the bits are those of
// adding into zeros).
template <typename T>
T gradient_beta(GradStore store) {
  return store == GradStore::kWrite ? T(0) : T(1);
}

inline void gemm(CBLAS_TRANSPOSE trans_a, CBLAS_TRANSPOSE trans_b, int m, int n, int k,
                 float alpha, const float* a, int lda, const float* b, int ldb, float beta,
                 float* c, int ldc) {
  cblas_sgemm(CblasRowMajor, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

inline void gemm(CBLAS_TRANSPOSE trans_a, CBLAS_TRANSPOSE trans_b, int m, int n, int k,
                 double alpha, const double* a, int lda, const double* b, int ldb, double beta,
                 double* c, int ldc) {
  cblas_dgemm(CblasRowMajor, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

// y = alpha * op(A) x + beta * y, A row-major [m, n] with leading dimension lda.
inline void gemv(CBLAS_TRANSPOSE trans_a, int m, int n, float alpha, const float* a, int lda,
                 const float* x, float beta, float* y) {
  cblas_sgemv(CblasRowMajor, trans_a, m, n, alpha, a, lda, x, 1, beta, y, 1);
}

inline void gemv(CBLAS_TRANSPOSE trans_a, int m, int n, double alpha, const double* a,
                 int lda, const double* x, double beta, double* y) {
  cblas_dgemv(CblasRowMajor, trans_a, m, n, alpha, a, lda, x, 1, beta, y, 1);
}

}  // namespace thpc::cpu
