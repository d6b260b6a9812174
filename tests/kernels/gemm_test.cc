// The fp32 matrix products of the CPU ops (kernels/cpu/blas.h): by oneDNN where the build
// has it, by OpenBLAS for the smallest and where it has not. Each library, each transpose
// pair, both sides of the size at which oneDNN takes over, against the product in double
// precision; beta 0 writes C without reading it, beta 1 adds into it, as BLAS defines;
// THPC_CPU_GEMM chooses the library and a value it does not know stops a run.
//
// Tolerance, per element: |c - exact| <= (L + 2) * 2^-24 * (|beta c0| + |alpha| sum_l
// |a_il b_lj|), L the reduction length: each fp32 product and sum of the length-L dot
// product rounds once (at most 2^-24 relative each, the classic L u bound, whatever order
// or blocking a library sums in), the alpha scaling and the beta addition once each.
// A wrong element, a dropped or doubled term, is off by the size of a term: ~1e-2
// relative to the sum at these lengths, far above ~1e-5 for the longest (L = 300).
#include <gtest/gtest.h>

#include <omp.h>
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <map>
#include <random>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "expect_error.h"
#include "kernels/cpu/blas.h"
#include "kernels/cpu/onednn_library.h"
#include "program.h"

namespace thpc::cpu {
namespace {

struct Product {
  CBLAS_TRANSPOSE trans_a, trans_b;
  int m, n, k;
};

std::string name(const Product& p) {
  return std::string(p.trans_a == CblasTrans ? "T" : "N") + (p.trans_b == CblasTrans ? "T" : "N") +
         " " + std::to_string(p.m) + "x" + std::to_string(p.n) + "x" + std::to_string(p.k);
}

// Checks gemm_by(library, ...) on `p` with leading dimensions wider than the matrices (the
// attention's products read one head's columns of a wider row), alpha and beta as given.
void expect_product(GemmLibrary library, const Product& p, float alpha, float beta,
                    std::mt19937& rng) {
  SCOPED_TRACE(name(p) + " alpha " + std::to_string(alpha) + " beta " + std::to_string(beta));
  std::uniform_real_distribution<float> value(0.25f, 1.0f);
  std::bernoulli_distribution negative(0.5);
  auto random = [&] { return negative(rng) ? -value(rng) : value(rng); };  // never zero
  // op(A) is [m, k]: A is [m, k] or, transposed, [k, m]; likewise B.
  const bool a_transposed = p.trans_a == CblasTrans, b_transposed = p.trans_b == CblasTrans;
  const int a_rows = a_transposed ? p.k : p.m, a_cols = a_transposed ? p.m : p.k;
  const int b_rows = b_transposed ? p.n : p.k, b_cols = b_transposed ? p.k : p.n;
  const int lda = a_cols + 3, ldb = b_cols + 5, ldc = p.n + 2;
  std::vector<float> a(size_t(a_rows) * lda), b(size_t(b_rows) * ldb);
  for (float& x : a) x = random();
  for (float& x : b) x = random();
  std::vector<float> c(size_t(p.m) * ldc);
  const float kUnread = std::numeric_limits<float>::quiet_NaN();
  for (float& x : c) x = beta == 0.0f ? kUnread : random();
  const std::vector<float> c0 = c;
  auto a_at = [&](int i, int l) {
    return p.trans_a == CblasTrans ? a[size_t(l) * lda + i] : a[size_t(i) * lda + l];
  };
  auto b_at = [&](int l, int j) {
    return p.trans_b == CblasTrans ? b[size_t(j) * ldb + l] : b[size_t(l) * ldb + j];
  };
  gemm_by(library, p.trans_a, p.trans_b, p.m, p.n, p.k, alpha, a.data(), lda, b.data(), ldb,
          beta, c.data(), ldc);
  const double unit = std::ldexp(1.0, -24);
  int wrong = 0;
  for (int i = 0; i < p.m; ++i) {
    for (int j = 0; j < ldc; ++j) {
      const size_t at = size_t(i) * ldc + j;
      if (j >= p.n) {  // past the row's n columns: untouched
        if (!(std::isnan(c[at]) && std::isnan(c0[at])) && c[at] != c0[at]) ++wrong;
        continue;
      }
      double exact = 0.0, magnitude = 0.0;
      for (int l = 0; l < p.k; ++l) {
        const double term = double(a_at(i, l)) * b_at(l, j);
        exact += term;
        magnitude += std::fabs(term);
      }
      exact *= alpha;
      magnitude *= std::fabs(alpha);
      if (beta != 0.0f) {
        exact += double(beta) * c0[at];
        magnitude += std::fabs(double(beta) * c0[at]);
      }
      const double bound = (p.k + 2) * unit * magnitude;
      if (!(std::fabs(c[at] - exact) <= bound) && ++wrong <= 5) {
        ADD_FAILURE() << "c[" << i << ", " << j << "] = " << c[at] << ", exact " << exact
                      << ", bound " << bound;
      }
    }
  }
  EXPECT_EQ(wrong, 0);
}

// Both sides of kSmallestOneDnnProduct (2^18 multiply-adds), the model's shapes among them:
// an attention head's products (24 x 24 x 64), a layer's (300 x 256 x 64 and its
// gradients), one decoding step's rows (4 x 512 x 512).
const Product kProducts[] = {
    {CblasNoTrans, CblasNoTrans, 3, 5, 7},      {CblasNoTrans, CblasTrans, 24, 24, 64},
    {CblasTrans, CblasNoTrans, 24, 64, 24},     {CblasTrans, CblasTrans, 9, 11, 13},
    {CblasNoTrans, CblasNoTrans, 300, 256, 64}, {CblasNoTrans, CblasTrans, 300, 64, 256},
    {CblasTrans, CblasNoTrans, 256, 64, 300},   {CblasTrans, CblasTrans, 70, 90, 80},
    {CblasNoTrans, CblasNoTrans, 4, 512, 512},  {CblasNoTrans, CblasTrans, 1, 1000, 300},
};

std::vector<GemmLibrary> libraries() {
  std::vector<GemmLibrary> all{GemmLibrary::kOpenBlas};
  if (onednn_built()) all.push_back(GemmLibrary::kOneDnn);
  return all;
}

TEST(Gemm, EachLibraryIsTheProductInEveryTransposeAndSize) {
  for (const GemmLibrary library : libraries()) {
    SCOPED_TRACE(library == GemmLibrary::kOneDnn ? "oneDNN" : "OpenBLAS");
    std::mt19937 rng(31);
    for (const Product& p : kProducts) {
      expect_product(library, p, 1.0f, 0.0f, rng);   // writes C, NaNs there unread
      expect_product(library, p, 1.0f, 1.0f, rng);   // adds into C (the gradients' +=)
      expect_product(library, p, 0.125f, 1.0f, rng); // the attention's 1/sqrt(d_k) scale
    }
  }
}

TEST(Gemm, IsTheProductOnTwoThreadsAndOnOne) {
  // set_gemm_threads sizes oneDNN's team too (blas.cc): the product either way.
  for (const int threads : {2, 1}) {
    set_gemm_threads(threads);
    std::mt19937 rng(37);
    for (const GemmLibrary library : libraries()) {
      expect_product(library, {CblasNoTrans, CblasTrans, 300, 256, 64}, 1.0f, 1.0f, rng);
    }
  }
}

TEST(Gemm, AnEmptySumIsBetaTimesC) {
  // k = 0: BLAS's C = beta C, which oneDNN's sgemm leaves undone (gemm_by gives the
  // empty product to OpenBLAS whichever library is asked for).
  for (const GemmLibrary library : libraries()) {
    for (const float beta : {0.0f, 0.5f}) {
      std::vector<float> c{std::numeric_limits<float>::quiet_NaN(), 2.0f, 3.0f, 4.0f};
      if (beta != 0.0f) c[0] = 1.0f;
      const float a = 1.0f, b = 1.0f;
      // m n k = 0 is below oneDNN's size, and gemm_by gives an empty product to OpenBLAS.
      gemm_by(library, CblasNoTrans, CblasNoTrans, 2, 2, 0, 1.0f, &a, 1, &b, 2, beta, c.data(), 2);
      const std::vector<float> expected =
          beta == 0.0f ? std::vector<float>{0, 0, 0, 0} : std::vector<float>{0.5f, 1, 1.5f, 2};
      EXPECT_EQ(c, expected) << "beta " << beta;
    }
  }
}

// A signal with a handler, sent to the process every 5 us while oneDNN multiplies on
// two threads: before oneDNN 3.11.2 its fp32 kernels point the stack register into the
// heap, and a handler's frame written there corrupted it (a segmentation fault within
// seconds here, without blocking the signals: blas.cc, SignalsHeldDuringTheProduct). The
// stop signals of a run (SIGTERM from Slurm, Ctrl-C) have handlers.
std::atomic<long> g_signals_handled{0};
extern "C" void count_signal(int) { g_signals_handled.fetch_add(1, std::memory_order_relaxed); }

TEST(Gemm, OneDnnProductsOutlastASignalStorm) {
  if (!onednn_built()) GTEST_SKIP() << "built without oneDNN";
  struct sigaction handler {}, previous {};
  handler.sa_handler = count_signal;
  sigemptyset(&handler.sa_mask);
  handler.sa_flags = SA_RESTART;
  ASSERT_EQ(sigaction(SIGUSR2, &handler, &previous), 0);
  set_gemm_threads(2);
  std::atomic<bool> done{false};
  int wrong = 0, workers_taking_signals = -1, team_before_the_products = 0;
  // A thread of its own multiplies, so that its OpenMP workers are new: made by a loop of
  // the ops (as a training step's first ops do) before its first product, they start with
  // the signals unblocked.
  std::thread multiplying([&] {
#pragma omp parallel num_threads(2)
    {
#pragma omp single
      team_before_the_products = omp_get_num_threads();
    }
    constexpr int kSize = 512;
    const std::vector<float> a(kSize * kSize, 0.5f), b(kSize * kSize, 0.25f);
    std::vector<float> c(kSize * kSize);
    for (int product = 0; product < 1500; ++product) {
      std::vector<float> churn(1000 + product % 777, 1.0f);  // the heap in use around it
      gemm_by(GemmLibrary::kOneDnn, CblasNoTrans, CblasTrans, kSize, kSize, kSize, 1.0f,
              a.data(), kSize, b.data(), kSize, 0.0f, c.data(), kSize);
      if (c[product % c.size()] != 0.5f * 0.25f * kSize) ++wrong;  // exact: powers of two
    }
    done.store(true);
    // The storm reached this thread between products; a worker's frame would land in its
    // own part of the heap, where this test would not see the damage: the workers that
    // ran the products hold the signals blocked for good instead (where oneDNN needs it).
    workers_taking_signals = 0;
#pragma omp parallel num_threads(2) reduction(+ : workers_taking_signals)
    {
      sigset_t mask;
      pthread_sigmask(SIG_BLOCK, nullptr, &mask);
      if (omp_get_thread_num() != 0 && !sigismember(&mask, SIGUSR2)) workers_taking_signals += 1;
    }
  });
  std::thread storm([&done] {
    // Not taken here: the signals go to the threads that multiply, or wait.
    sigset_t own;
    sigemptyset(&own);
    sigaddset(&own, SIGUSR2);
    pthread_sigmask(SIG_BLOCK, &own, nullptr);
    while (!done.load()) {
      ::kill(::getpid(), SIGUSR2);
      ::usleep(5);
    }
  });
  multiplying.join();
  storm.join();
  sigaction(SIGUSR2, &previous, nullptr);
  ASSERT_EQ(team_before_the_products, 2) << "no OpenMP workers before the products";
  EXPECT_EQ(wrong, 0);
  EXPECT_GT(g_signals_handled.load(), 1000) << "the storm did not happen";
  EXPECT_EQ(workers_taking_signals, onednn_gemm_is_signal_safe() ? 1 : 0);
}

TEST(Gemm, TheSmallestProductsAreOpenBlassTheOthersTheChosenLibrarys) {
  // Told apart by their bits: on random operands of some shapes the two libraries round
  // some element differently (checked first), and each is the same bits for the same call.
  // Which shapes differ is the CPU's: on a Zen 4 EPYC (AVX-512) both gave the same bits at
  // 64 x 64 and 32 x 32 in every draw tried, and differed in every one with k of 1,000 or
  // more (their sums over k split in other places); on other CPUs, at 64 x 64 already.
  if (gemm_library() != GemmLibrary::kOneDnn) GTEST_SKIP() << "OpenBLAS multiplies all";
  set_gemm_threads(2);
  struct Shape {
    int rows_and_columns, k_below, k_at;  // m = n; m n k_below < 2^18 <= m n k_at
  };
  for (const Shape shape : {Shape{64, 60, 64}, Shape{16, 1023, 1024}, Shape{8, 4095, 4096}}) {
    const int m = shape.rows_and_columns, n = shape.rows_and_columns;
    std::mt19937 rng(41);
    std::uniform_real_distribution<float> value(-1.0f, 1.0f);
    std::map<int, std::vector<float>> by_gemm, by_openblas, by_onednn;
    for (const int k : {shape.k_below, shape.k_at}) {
      std::vector<float> a(size_t(m) * k), b(size_t(k) * n);
      for (float& x : a) x = value(rng);
      for (float& x : b) x = value(rng);
      for (auto* out : {&by_gemm, &by_openblas, &by_onednn}) (*out)[k].resize(size_t(m) * n);
      gemm(CblasNoTrans, CblasNoTrans, m, n, k, 1.0f, a.data(), k, b.data(), n, 0.0f,
           by_gemm[k].data(), n);
      gemm_by(GemmLibrary::kOpenBlas, CblasNoTrans, CblasNoTrans, m, n, k, 1.0f, a.data(), k,
              b.data(), n, 0.0f, by_openblas[k].data(), n);
      gemm_by(GemmLibrary::kOneDnn, CblasNoTrans, CblasNoTrans, m, n, k, 1.0f, a.data(), k,
              b.data(), n, 0.0f, by_onednn[k].data(), n);
    }
    if (by_openblas[shape.k_below] == by_onednn[shape.k_below] ||
        by_openblas[shape.k_at] == by_onednn[shape.k_at]) {
      continue;  // no evidence at this shape: the next
    }
    EXPECT_EQ(by_gemm[shape.k_below], by_openblas[shape.k_below]) << m << " x " << n << " x "
                                                                  << shape.k_below;
    EXPECT_EQ(by_gemm[shape.k_at], by_onednn[shape.k_at]) << m << " x " << n << " x "
                                                          << shape.k_at;
    return;
  }
  GTEST_SKIP() << "the libraries agree bit for bit at every shape tried on this CPU: which "
                  "one multiplied cannot be told from the results";
}

TEST(Gemm, OneDnnsWorkersHoldTheSignalsWhateverTeamsRanBetweenProducts) {
  // libgomp ends a team's surplus workers when a smaller team runs and makes new ones for
  // the next larger team, copying the calling thread's signal mask of that moment: made by
  // a loop of the ops, unblocked. Before each product they must be blocked again.
  if (gemm_library() != GemmLibrary::kOneDnn || onednn_gemm_is_signal_safe()) {
    GTEST_SKIP() << "oneDNN's products are signal-safe here, or OpenBLAS multiplies";
  }
  int unblocked = -1;
  std::thread multiplying([&unblocked] {
    set_gemm_threads(3);
    const std::vector<float> a(256 * 256, 0.5f), b(256 * 256, 0.25f);
    std::vector<float> c(256 * 256);
    auto product = [&] {
      gemm(CblasNoTrans, CblasNoTrans, 256, 256, 256, 1.0f, a.data(), 256, b.data(), 256, 0.0f,
           c.data(), 256);
    };
    product();
    std::atomic<int> members{0};  // a body the compiler keeps
#pragma omp parallel num_threads(2)  // the third thread ends
    members.fetch_add(1);
#pragma omp parallel num_threads(3)  // a new one, unblocked
    members.fetch_add(1);
    ASSERT_EQ(members.load(), 5);
    product();
    unblocked = 0;
#pragma omp parallel num_threads(3) reduction(+ : unblocked)
    {
      sigset_t mask;
      pthread_sigmask(SIG_BLOCK, nullptr, &mask);
      if (omp_get_thread_num() != 0 && !sigismember(&mask, SIGTERM)) unblocked += 1;
    }
  });
  multiplying.join();
  set_gemm_threads(2);
  EXPECT_EQ(unblocked, 0) << "workers that ran oneDNN's product take signals";
}

TEST(GemmLibrary, ThpcCpuGemmNamesTheLibrary) {
  for (const bool onednn_leads : {true, false}) {
    SCOPED_TRACE(onednn_leads ? "oneDNN's products lead here" : "OpenBLAS's lead here");
    const GemmLibrary by_default = onednn_leads ? GemmLibrary::kOneDnn : GemmLibrary::kOpenBlas;
    EXPECT_EQ(gemm_library_named(nullptr, true, onednn_leads), by_default);
    EXPECT_EQ(gemm_library_named("", true, onednn_leads), by_default);
    EXPECT_EQ(gemm_library_named(nullptr, false, onednn_leads), GemmLibrary::kOpenBlas);
    EXPECT_EQ(gemm_library_named("openblas", true, onednn_leads), GemmLibrary::kOpenBlas);
    EXPECT_EQ(gemm_library_named("onednn", true, onednn_leads), GemmLibrary::kOneDnn);
    // As the docs write them.
    EXPECT_EQ(gemm_library_named("oneDNN", true, onednn_leads), GemmLibrary::kOneDnn);
    EXPECT_EQ(gemm_library_named("OpenBLAS", true, onednn_leads), GemmLibrary::kOpenBlas);
    expect_error([&] { gemm_library_named("onednn", false, onednn_leads); },
                 {"THPC_CPU_GEMM=onednn, but this build has no oneDNN", "libdnnl-dev"});
    expect_error([&] { gemm_library_named("MKL", true, onednn_leads); },
                 {"THPC_CPU_GEMM is 'MKL', not a library", "'onednn' or 'openblas'"});
  }
}

TEST(GemmLibrary, OneDnnLeadsWithAvx512KernelsOrWhereOpenBlasRunsOlderThanAvx2) {
  // oneDNN's AVX-512 kernels: whatever OpenBLAS runs (its own AVX-512 ones, or the AVX2 ones
  // OPENBLAS_CORETYPE=Haswell forces on such a CPU).
  for (const char* kernels : {"SkylakeX", "Cooperlake", "Haswell", "Zen", "Prescott"}) {
    EXPECT_TRUE(onednn_sgemm_leads(true, kernels)) << kernels;
  }
  // oneDNN's AVX2 kernels: OpenBLAS's AVX2 ones outrun them; kernels older than AVX2 (an
  // OpenBLAS that does not know the CPU and could not be told) do not.
  EXPECT_FALSE(onednn_sgemm_leads(false, "Haswell"));
  EXPECT_FALSE(onednn_sgemm_leads(false, "Zen"));
  EXPECT_TRUE(onednn_sgemm_leads(false, "Prescott"));
  EXPECT_TRUE(onednn_sgemm_leads(false, "Nehalem"));
}

TEST(GemmLibrary, TheFirstLineNamesItAndAWrongNameStopsTheRun) {
  // One step of tiny.ini on the CPU with THPC_CPU_GEMM=value: its output.
  auto run = [](const std::string& value) {
    const std::filesystem::path dir = std::filesystem::temp_directory_path() /
                                      ("thpc_gemm_test_" + std::to_string(::getpid()));
    std::filesystem::remove_all(dir);
    const ProcessResult result = run_process(
        "THPC_CPU_GEMM=" + value + " " + thpc::binary_dir() + "/transformer_hpc " +
        std::string(THPC_SOURCE_DIR) + "/input/tiny.ini --train.max_steps=1 " +
        "--train.backend=cpu --checkpoint.dir=" + (dir / "checkpoints").string());
    std::filesystem::remove_all(dir);
    return result;
  };
  const ProcessResult openblas = run("openblas");
  EXPECT_EQ(openblas.exit_code, 0) << openblas.output;
  EXPECT_NE(openblas.output.find("(cpu-fp32, OpenBLAS "), std::string::npos) << openblas.output;
  if (onednn_usable()) {
    const ProcessResult onednn = run("onednn");
    EXPECT_EQ(onednn.exit_code, 0) << onednn.output;
    EXPECT_NE(onednn.output.find("(cpu-fp32, matrix products by oneDNN "), std::string::npos)
        << onednn.output;
    EXPECT_NE(onednn.output.find(", the smallest by OpenBLAS "), std::string::npos)
        << onednn.output;
    // Unset (empty): oneDNN where its kernels lead on this CPU, else OpenBLAS, saying which
    // oneDNN it passed over. The rule is asked of the kernels the run names: on a CPU
    // OpenBLAS does not know the program starts again with others than this process has.
    const ProcessResult by_default = run("");
    EXPECT_EQ(by_default.exit_code, 0) << by_default.output;
    std::smatch kernels;
    ASSERT_TRUE(std::regex_search(by_default.output, kernels,
                                  std::regex("OpenBLAS ([A-Za-z0-9]+) kernels")))
        << by_default.output;
    const bool onednn_leads = onednn_sgemm_leads(onednn_runs_avx512(), kernels[1].str());
    EXPECT_NE(by_default.output.find(onednn_leads
                                         ? "(cpu-fp32, matrix products by oneDNN "
                                         : "(cpu-fp32, matrix products by OpenBLAS, ahead of "
                                           "oneDNN "),
              std::string::npos)
        << by_default.output;
  }
  // A bad configuration: exit 2 before anything runs (before: exit 1 as the backend was
  // made), and no "(see --help)", which lists no environment variables.
  const ProcessResult wrong = run("mkl");
  EXPECT_EQ(wrong.exit_code, 2) << wrong.output;
  EXPECT_EQ(wrong.output.find("see --help"), std::string::npos) << wrong.output;
  EXPECT_EQ(wrong.output.find("training "), std::string::npos) << wrong.output;
  EXPECT_NE(wrong.output.find("THPC_CPU_GEMM is 'mkl', not a library of the CPU's matrix "
                              "products: set it to 'onednn' or 'openblas'"),
            std::string::npos)
      << wrong.output;
}

}  // namespace
}  // namespace thpc::cpu
