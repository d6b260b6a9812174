// The fp32 matrix products' library (see blas.h).
#include "kernels/cpu/blas.h"

#include <omp.h>
#include <pthread.h>
#include <signal.h>
#include <strings.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#include "common/error.h"
#include "kernels/cpu/onednn_library.h"
#include "kernels/cpu/openblas_core.h"

#if THPC_HAVE_ONEDNN
#include <oneapi/dnnl/dnnl.h>
#endif

namespace thpc::cpu {

namespace {

#if THPC_HAVE_ONEDNN
// oneDNN built on OpenMP (Debian's; Spack's cpu_runtime=omp) runs its products on the
// calling thread's OpenMP team, which set_gemm_threads sizes and whose workers hold the
// signals (below); a oneDNN on TBB or a thread pool would do neither: OpenBLAS then.
constexpr bool kOneDnnOnOpenMp = DNNL_CPU_RUNTIME == DNNL_RUNTIME_OMP;
#else
constexpr bool kOneDnnOnOpenMp = false;
#endif

std::atomic<int> gemm_thread_count{0};  // 0: not set, OpenMP's default

// A product of fewer multiply-adds (m n k) than this is OpenBLAS's where oneDNN multiplies
// the rest: oneDNN's sgemm spends ~0.35 us a call before it multiplies, OpenBLAS's ~0.05,
// which the attention's products for one head of a short sentence do not repay (24 x 24
// x 64: 1.0 us by OpenBLAS, 1.4 by oneDNN; the tiny config's step 30 -> 37 ms with
// oneDNN for all). From 64 x 64 x 64 on the two are even or oneDNN is ahead (128 x 128 x
// 64: 15.4 us, 13.1 us). Measured one thread on the Intel Xeon of 2026-11-30, OpenBLAS's
// SkylakeX kernels.
constexpr int64_t kSmallestOneDnnProduct = int64_t(1) << 18;

#if THPC_HAVE_ONEDNN
// The asynchronous signals, every one a process can be sent but the faults a thread
// raises itself (blocking those is undefined).
const sigset_t& asynchronous_signals() {
  static const sigset_t signals = [] {
    sigset_t set;
    sigfillset(&set);
    for (const int fault : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGTRAP, SIGSYS, SIGABRT}) {
      sigdelset(&set, fault);
    }
    return set;
  }();
  return signals;
}

// Where oneDNN's fp32 kernels corrupt the heap when a signal is handled on a thread running
// one (onednn_library.h: before 3.11.2; seen here as a trainer stopped by SIGTERM aborting
// in free()), and the stop signals have handlers (train/stop_request.h), the threads that
// run those kernels hold the asynchronous signals blocked: the calling thread for the call
// (this guard), its OpenMP workers from before each product on (block_the_workers). A
// signal then waits for the product's end, or is taken by a thread that is not
// multiplying (the calling thread between products, MPI's, the checkpoint writer's); two
// of one kind during one product arrive as one, as pending signals do.
// Two system calls a product, and a region of the team that blocks the workers' signals
// (libgomp ends a team's surplus workers when a smaller team runs, and the next larger
// team's new workers copy the calling thread's mask of that moment: blocking them once
// per thread would leave those unblocked): microseconds, against ~2 us and more from
// 2^18 multiply-adds on.
class SignalsHeldDuringTheProduct {
 public:
  SignalsHeldDuringTheProduct() {
    if (!needed()) return;
    held_ = pthread_sigmask(SIG_BLOCK, &asynchronous_signals(), &previous_) == 0;
  }
  ~SignalsHeldDuringTheProduct() {
    if (held_) pthread_sigmask(SIG_SETMASK, &previous_, nullptr);
  }
  SignalsHeldDuringTheProduct(const SignalsHeldDuringTheProduct&) = delete;
  SignalsHeldDuringTheProduct& operator=(const SignalsHeldDuringTheProduct&) = delete;

  static bool needed() {
    static const bool unsafe = !onednn_gemm_is_signal_safe();
    return unsafe;
  }

  // The calling thread's OpenMP workers, up to `threads` (the team oneDNN's product will
  // run on: the same pool threads, nothing runs between), block the asynchronous signals;
  // workers libgomp creates for this team copy the calling thread's mask, held here.
  static void block_the_workers(int threads) {
    if (!needed() || threads <= 1) return;
#pragma omp parallel num_threads(threads)
    {
      if (omp_get_thread_num() != 0) pthread_sigmask(SIG_BLOCK, &asynchronous_signals(), nullptr);
    }
  }

 private:
  sigset_t previous_{};
  bool held_ = false;
};

// oneDNN's sgemm runs on the calling thread's OpenMP team, omp_get_max_threads() threads:
// held at set_gemm_threads' count, as OpenBLAS's is by openblas_set_num_threads. Inside a
// parallel region it runs on its own thread whatever the count. m, n, k >= 1 (gemm_by).
void onednn_gemm(CBLAS_TRANSPOSE trans_a, CBLAS_TRANSPOSE trans_b, int m, int n, int k,
                 float alpha, const float* a, int lda, const float* b, int ldb, float beta,
                 float* c, int ldc) {
  const SignalsHeldDuringTheProduct held;
  if (!omp_in_parallel()) {
    const int threads = gemm_thread_count.load(std::memory_order_relaxed);
    if (threads > 0 && omp_get_max_threads() != threads) omp_set_num_threads(threads);
    SignalsHeldDuringTheProduct::block_the_workers(omp_get_max_threads());
  }
  const dnnl_status_t status =
      dnnl_sgemm(trans_a != CblasNoTrans ? 'T' : 'N', trans_b != CblasNoTrans ? 'T' : 'N', m, n,
                 k, alpha, a, lda, b, ldb, beta, c, ldc);
  // Arguments that do not describe the matrices (a mistake of ours), or no memory for its
  // packed copies.
  THPC_CHECK(status == dnnl_success,
             "oneDNN's sgemm failed on the product [" << m << ", " << k << "] x [" << k << ", "
                 << n << "]: "
                 << (status == dnnl_out_of_memory ? std::string("out of memory")
                                                  : "status " + std::to_string(int(status))));
}
#endif

}  // namespace

bool onednn_sgemm_leads(bool onednn_avx512, const std::string& openblas_kernels) {
  return onednn_avx512 || core_predates_avx2(openblas_kernels);
}

GemmLibrary gemm_library_named(const char* value, bool with_onednn, bool onednn_leads) {
  if (value == nullptr || value[0] == '\0') {
    return with_onednn && onednn_leads ? GemmLibrary::kOneDnn : GemmLibrary::kOpenBlas;
  }
  if (strcasecmp(value, "openblas") == 0) return GemmLibrary::kOpenBlas;
  if (strcasecmp(value, "onednn") == 0) {
    if (with_onednn) return GemmLibrary::kOneDnn;
    THPC_FAIL("THPC_CPU_GEMM=onednn, but this build has no oneDNN built on OpenMP: install "
              "one (Debian: apt install libdnnl-dev; Spack: onednn cpu_runtime=omp) and "
              "configure again, or unset THPC_CPU_GEMM to multiply with OpenBLAS");
  }
  THPC_FAIL("THPC_CPU_GEMM is " << quoted(value)
                                << ", not a library of the CPU's matrix products: set it to "
                                   "'onednn' or 'openblas', or unset it (oneDNN where its "
                                   "kernels are AVX-512 ones, OpenBLAS elsewhere)");
}

bool onednn_usable() { return onednn_built() && kOneDnnOnOpenMp; }

namespace {

// THPC_CPU_GEMM as the program started, read once: whether it named a library.
bool library_named() {
  static const bool named = [] {
    const char* value = std::getenv("THPC_CPU_GEMM");
    return value != nullptr && value[0] != '\0';
  }();
  return named;
}

}  // namespace

GemmLibrary gemm_library() {
  static const GemmLibrary library =
      gemm_library_named(std::getenv("THPC_CPU_GEMM"), onednn_usable(),
                         onednn_sgemm_leads(onednn_runs_avx512(), openblas_core()));
  return library;
}

std::string gemm_library_description() {
  if (gemm_library() == GemmLibrary::kOneDnn) {
    return "matrix products by " + onednn_version_and_isa() + ", the smallest by " +
           openblas_description();
  }
  if (onednn_usable() && !library_named()) {
    // The rule chose OpenBLAS in a build with oneDNN: say which oneDNN it passed over.
    return "matrix products by OpenBLAS, ahead of " + onednn_version_and_isa() + " here: " +
           openblas_description();
  }
  return openblas_description();
}

std::string gemm_identity() {
  const OpenBlasChoice choice = openblas_choice();
  const std::string openblas = choice.library + " " + choice.core + " kernels";
  if (gemm_library() == GemmLibrary::kOneDnn) {
    return onednn_version_and_isa() + ", the smallest by " + openblas;
  }
  // OpenBLAS's products split their sums by thread: another count rounds otherwise (a
  // helper's audit: 1 and 2 threads ended in other digests; oneDNN's gave the same).
  const int threads = gemm_thread_count.load(std::memory_order_relaxed);
  return openblas + ", " + std::to_string(threads > 0 ? threads : omp_get_max_threads()) +
         " threads";
}

void set_gemm_threads(int threads) {
  THPC_CHECK(threads >= 1, "matrix product threads must be at least 1, not " << threads);
  gemm_thread_count.store(threads, std::memory_order_relaxed);
  // The OpenMP build of OpenBLAS (CMakeLists.txt) runs its products on this many threads
  // of the same OpenMP pool the ops' loops use.
  openblas_set_num_threads(threads);
}

void gemm_by(GemmLibrary library, CBLAS_TRANSPOSE trans_a, CBLAS_TRANSPOSE trans_b, int m, int n,
             int k, float alpha, const float* a, int lda, const float* b, int ldb, float beta,
             float* c, int ldc) {
  // An empty product stays OpenBLAS's: with k = 0 BLAS sets C = beta C, which oneDNN's
  // sgemm leaves undone (it returns C unchanged).
  if (library == GemmLibrary::kOneDnn && m > 0 && n > 0 && k > 0) {
#if THPC_HAVE_ONEDNN
    onednn_gemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    return;
#else
    THPC_FAIL("oneDNN's products asked for in a build without oneDNN");
#endif
  }
  cblas_sgemm(CblasRowMajor, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

void gemm(CBLAS_TRANSPOSE trans_a, CBLAS_TRANSPOSE trans_b, int m, int n, int k, float alpha,
          const float* a, int lda, const float* b, int ldb, float beta, float* c, int ldc) {
  const bool small = int64_t(m) * n * k < kSmallestOneDnnProduct;
  gemm_by(small ? GemmLibrary::kOpenBlas : gemm_library(), trans_a, trans_b, m, n, k, alpha, a,
          lda, b, ldb, beta, c, ldc);
}

}  // namespace thpc::cpu
