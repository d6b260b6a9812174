// The BLAS entry points of the CPU reference ops, overloaded so a template over the
// element type picks the float (s) or double (d) routine: row-major
// C = alpha * op(A) op(B) + beta * C with op(A) [m, k] and op(B) [k, n], and its
// one-row case y = alpha * op(A) x + beta * y, which BLAS does without packing A (the
// packing copy dominates a GEMM whose result is a single row).
//
// The fp32 matrix products, nearly three quarters of a CPU training step and most of a
// decoding, are oneDNN's (dnnl_sgemm) where the build has it and its kernels are AVX-512
// ones, but for the smallest, which its cost per call outweighs (blas.cc); OpenBLAS's on a
// CPU without AVX-512, where its AVX2 kernels outrun oneDNN's (onednn_sgemm_leads),
// without oneDNN, or when THPC_CPU_GEMM=openblas says so. oneDNN chooses its kernels from
// the CPU's instruction set, so neither OPENBLAS_CORETYPE (some machines set Haswell for
// every process: AVX2 kernels on an AVX-512 CPU) nor a CPU newer than the OpenBLAS
// (which then falls back to SSE3 kernels: openblas_core.h) slows them. Measured on an
// Intel Xeon (AVX-512), 2 threads, the small preset's step: 362 ms with oneDNN with or
// without OPENBLAS_CORETYPE=Haswell, 367 ms with OpenBLAS's SkylakeX kernels (equal
// within the machine's spread), 568 ms with its Haswell ones (bench/RESULTS.md,
// 2026-11-30). The fp64 products (the tests' finite differences) and the matrix-vector
// products (decoding's attention of one query, a small share) stay OpenBLAS's. Before
// oneDNN 3.11.2 a signal handled during one of its fp32 products corrupts the heap: the
// threads that run them hold the asynchronous signals blocked (blas.cc,
// SignalsHeldDuringTheProduct; onednn_library.h).
#pragma once

#include <cblas.h>

#include <string>

#include "kernels/ops.h"

namespace thpc::cpu {

enum class GemmLibrary { kOneDnn, kOpenBlas };

// The library the fp32 gemm below calls, read once from THPC_CPU_GEMM ("onednn",
// "openblas"; unset or empty: oneDNN where this build has it and onednn_sgemm_leads says
// so on this CPU, OpenBLAS otherwise). A value it does not know, or onednn in a build
// without oneDNN, throws an Error naming the variable; make_cpu_backend asks first, so a
// run stops there, before any op.
GemmLibrary gemm_library();

// Whether oneDNN's fp32 products are the faster here: where its kernels are AVX-512 ones
// (`onednn_avx512`) or OpenBLAS's kernels (`openblas_kernels`, as openblas_core names them)
// predate AVX2. Where both have AVX2 kernels alone, OpenBLAS's lead: measured on a Zen 3
// EPYC (AVX2, 2 cores; bench/RESULTS.md, 2026-11-30), OpenBLAS 0.3.21's Zen kernels
// against oneDNN 2.6.3's avx2 ones, the small preset's step 517-625 ms against 676-723,
// the base preset's 1,999 against 2,147 (medians of six runs, with and without
// OPENBLAS_CORETYPE=Haswell), decoding 40 newstest lines on one
// thread 12.7-13.0 s against 16.9-17.1 (its one-thread x^T dy products, a backward's
// weight gradients, 1.1-2.3x slower). There OPENBLAS_CORETYPE=Haswell names the CPU's own
// kernels, so OpenBLAS loses nothing by it.
bool onednn_sgemm_leads(bool onednn_avx512, const std::string& openblas_kernels);

// The library `value` (THPC_CPU_GEMM's value, nullptr when unset) names, in a build that
// has oneDNN or not, where oneDNN's products lead or not: gemm_library's rule, apart for
// testing.
GemmLibrary gemm_library_named(const char* value, bool with_onednn, bool onednn_leads);

// Whether THPC_CPU_GEMM=onednn can choose oneDNN: the build has it, on OpenMP.
bool onednn_usable();

// For the first line of a run: "matrix products by oneDNN 2.6.3, avx512_core_bf16, the
// smallest by OpenBLAS SkylakeX kernels"; "matrix products by OpenBLAS, ahead of oneDNN
// 2.6.3, avx2 here: OpenBLAS Zen kernels" where the rule passed oneDNN over; or OpenBLAS's
// kernels alone; with what chose OpenBLAS's kernels (openblas_description).
std::string gemm_library_description();

// What computes the matrix products, without advice: "oneDNN 2.6.3, avx512_core_bf16, the
// smallest by OpenBLAS 0.3.21 SkylakeX kernels", or "OpenBLAS 0.3.21 Haswell kernels, 2
// threads" (OpenBLAS's sums depend on its thread count; oneDNN's here do not). Two
// runs whose texts differ round their products differently: a checkpoint records it, and
// a resume under another says that its losses are not bit for bit the uninterrupted run's.
std::string gemm_identity();

// The threads the fp32 and fp64 products run on (set_cpu_threads sets them with the ops'
// threads; a test holds them at one). Until set: OpenMP's default.
void set_gemm_threads(int threads);

// The beta of a GEMM whose C is an activation gradient stored as `store` says: 1 adds into
// C; 0 writes it (BLAS then reads no C and scales a zeroed C, so the bits are those of
// adding into zeros).
template <typename T>
T gradient_beta(GradStore store) {
  return store == GradStore::kWrite ? T(0) : T(1);
}

// gemm by `library` whatever the product's size (oneDNN only where the build has it), but
// an empty one (m, n or k of 0), which is OpenBLAS's: for the tests comparing the two.
void gemm_by(GemmLibrary library, CBLAS_TRANSPOSE trans_a, CBLAS_TRANSPOSE trans_b, int m, int n,
             int k, float alpha, const float* a, int lda, const float* b, int ldb, float beta,
             float* c, int ldc);

// By gemm_library(); on one thread inside a parallel region (the attention's products
// per (sentence, head) block), on set_gemm_threads' otherwise.
void gemm(CBLAS_TRANSPOSE trans_a, CBLAS_TRANSPOSE trans_b, int m, int n, int k, float alpha,
          const float* a, int lda, const float* b, int ldb, float beta, float* c, int ldc);

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
