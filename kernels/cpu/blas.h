// The one BLAS entry point of the CPU reference ops: row-major
// C = alpha * op(A) op(B) + beta * C with op(A) [m, k] and op(B) [k, n], overloaded so a
// template over the element type picks sgemm (float) or dgemm (double).
#pragma once

#include <cblas.h>

namespace thpc::cpu {

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

}  // namespace thpc::cpu
