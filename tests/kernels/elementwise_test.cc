// The elementwise ops (kernels/cpu/elementwise.cc, kernels/cuda/elementwise.cu): ReLU,
// dropout, residual + dropout, row copies, and on the GPU the dtype conversion, scale and
// sum_squares. The CPU reference against its formula, the Philox draws and central
// finite differences (cpu_reference.h), then the CUDA twins.
// The CUDA twins run the op on the GPU and on the CPU reference backend (tests/cuda_twin.h)
// in fp32 and bf16; without a GPU (or in a CPU-only build) they report SKIPPED.
//
// Tolerances. These kernels perform the CPU's IEEE fp32 operations in the CPU's order
// (explicitly rounded intrinsics, no FMA contraction; reductions in the CPU's row
// order), on the same bf16-representable inputs. So:
// * fp32 mode: results are bit-identical to the CPU's (tolerance 0). Any difference is a
//   changed operation order or a contraction, which is worth a failure.
// * bf16 mode: an activation output is the CPU's fp32 result rounded once to bf16, at
//   most half an ulp = 2^-8 |x| away; we allow eps_of(bf16) = 2^-7 relative.
// * sum_squares: the squares are exact in double; the sums run in another order, so
//   the relative error is <= n * 2^-53 in the worst case (1.1e-10 at 1e6 elements,
//   typically sqrt(n) * 2^-53): we allow 1e-10. A dropped or doubled element would move
//   the sum by ~1/n relative, >= 1e-6 at our sizes.
// Dropout masks must agree exactly: the zero patterns of outputs and of gradients
// accumulated into zeros are compared position by position.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "common/error.h"
#include "common/philox.h"
#include "cpu_reference.h"
#include "cuda_twin.h"
#include "expect_error.h"
#include "kernels/cpu/cpu_ops.h"

namespace thpc::cpu_test {
namespace {

TEST(Relu, ForwardAndBackwardMatchFiniteDifferences) {
  std::mt19937 rng(51);
  const int64_t n = 37;
  // |x| >= 0.1, so x +- h never crosses the kink at 0.
  Values x = random_away_from_zero(n, rng, 0.1);
  const Values weights = random_values(n, rng);
  const auto forward = [&] {
    Values y(n);
    cpu::relu_forward<double>(y.data(), x.data(), n);
    return y;
  };
  const Values y = forward();
  for (int64_t i = 0; i < n; ++i) EXPECT_EQ(y[i], std::max(0.0, x[i])) << i;
  const Values dx_before = random_values(n, rng);
  Values dx = dx_before;
  cpu::relu_backward<double>(dx.data(), weights.data(), y.data(), n, GradStore::kAdd);
  expect_gradient_matches("relu dx", x, difference(dx, dx_before),
                          [&] { return weighted_sum(forward(), weights); });
}

// The fp32 relu_backward is written with SSE intrinsics (no branch); it must give the bits
// of the plain `if (y > 0) dx += dy`, including the cases where an add of -0 or a select
// could differ: dx = -0 or NaN where y <= 0, dy = inf where y <= 0, y = +0 and -0. Nine
// chunks of 4096 (above kParallelMinWork: spread over the machine's threads) and a tail of 7.
TEST(Relu, FloatBackwardHasTheBitsOfTheBranch) {
  std::mt19937 rng(57);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  const int64_t n = 9 * 4096 + 7;
  std::vector<float> dx(n), dy(n), y(n);
  for (int64_t i = 0; i < n; ++i) {
    dx[i] = uniform(rng);
    dy[i] = uniform(rng);
    y[i] = uniform(rng);
    if (y[i] == 0.0f) y[i] = 0.5f;  // never zero by chance: the zeros below are placed
  }
  for (int64_t i = 0; i < n; i += 97) {
    y[i] = (i / 97) % 2 == 0 ? 0.0f : -0.0f;
    dx[i] = (i / 97) % 3 == 0 ? -0.0f : ((i / 97) % 3 == 1 ? NAN : dx[i]);
    dy[i] = (i / 97) % 5 == 0 ? INFINITY : dy[i];
  }
  dx[n - 1] = -0.0f;  // in the scalar tail
  y[n - 1] = -0.5f;
  std::vector<float> expected = dx;
  for (int64_t i = 0; i < n; ++i) {
    if (y[i] > 0.0f) expected[i] += dy[i];
  }
  cpu::relu_backward<float>(dx.data(), dy.data(), y.data(), n, GradStore::kAdd);
  EXPECT_EQ(std::memcmp(dx.data(), expected.data(), n * sizeof(float)), 0);
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_EQ(std::signbit(dx[i]), std::signbit(expected[i])) << i;
    ASSERT_EQ(std::isnan(dx[i]), std::isnan(expected[i])) << i;
  }
}

TEST(Dropout, MaskIsTheDrawOfTheFlatIndex) {
  std::mt19937 rng(52);
  const int64_t n = 1001;
  const float p = 0.3f;
  const Values x = random_values(n, rng), sub = random_values(n, rng);
  Values y(n), residual(n);
  cpu::dropout_forward<double>(y.data(), x.data(), n, p, kDropoutKey);
  cpu::residual_dropout_forward<double>(residual.data(), x.data(), sub.data(), n, p,
                                        kDropoutKey);
  int64_t dropped = 0;
  for (int64_t i = 0; i < n; ++i) {
    const bool keep = dropout_keep(kDropoutKey.seed, kDropoutKey.site, kDropoutKey.step,
                                   kDropoutKey.stream, static_cast<uint64_t>(i), p);
    const double scale = 1.0 / (1.0 - static_cast<double>(p));
    EXPECT_EQ(y[i], keep ? x[i] * scale : 0.0) << i;
    EXPECT_EQ(residual[i], keep ? x[i] + sub[i] * scale : x[i]) << i;
    dropped += keep ? 0 : 1;
  }
  EXPECT_GT(dropped, 0);
  EXPECT_LT(dropped, n);
  // In place, y over x, and the backward's dx over dy (kWrite): the same bits.
  Values in_place = x;
  cpu::dropout_forward<double>(in_place.data(), in_place.data(), n, p, kDropoutKey);
  EXPECT_EQ(in_place, y);
  Values written(n, 7.0), dy_in_place = sub;
  cpu::dropout_backward<double>(written.data(), sub.data(), n, p, kDropoutKey,
                                GradStore::kWrite);
  cpu::dropout_backward<double>(dy_in_place.data(), dy_in_place.data(), n, p, kDropoutKey,
                                GradStore::kWrite);
  EXPECT_EQ(dy_in_place, written);
  // Another step draws another mask.
  DropoutKey next_step = kDropoutKey;
  next_step.step += 1;
  Values y_next(n);
  cpu::dropout_forward<double>(y_next.data(), x.data(), n, p, next_step);
  EXPECT_NE(y_next, y);
}

TEST(Dropout, ZeroProbabilityIsIdentityAndInvalidProbabilityIsRejected) {
  std::mt19937 rng(53);
  const int64_t n = 17;
  const Values x = random_values(n, rng), sub = random_values(n, rng);
  Values y(n), residual(n), dx(n, 0.0);
  cpu::dropout_forward<double>(y.data(), x.data(), n, 0.0f, kDropoutKey);
  EXPECT_EQ(y, x);
  cpu::residual_dropout_forward<double>(residual.data(), x.data(), sub.data(), n, 0.0f,
                                        kDropoutKey);
  for (int64_t i = 0; i < n; ++i) EXPECT_EQ(residual[i], x[i] + sub[i]);
  cpu::dropout_backward<double>(dx.data(), x.data(), n, 0.0f, kDropoutKey, GradStore::kAdd);
  EXPECT_EQ(dx, x);
  EXPECT_THROW(cpu::dropout_forward<double>(y.data(), x.data(), n, 1.0f, kDropoutKey), Error);
  EXPECT_THROW(cpu::dropout_forward<double>(y.data(), x.data(), n, -0.1f, kDropoutKey), Error);
}

TEST(Dropout, BackwardMatchesFiniteDifferences) {
  std::mt19937 rng(54);
  const int64_t n = 37;
  const float p = 0.3f;
  Values x = random_values(n, rng);
  const Values weights = random_values(n, rng);
  const Values dx_before = random_values(n, rng);
  Values dx = dx_before;
  cpu::dropout_backward<double>(dx.data(), weights.data(), n, p, kDropoutKey, GradStore::kAdd);
  expect_gradient_matches("dropout dx", x, difference(dx, dx_before), [&] {
    Values y(n);
    cpu::dropout_forward<double>(y.data(), x.data(), n, p, kDropoutKey);
    return weighted_sum(y, weights);
  });
}

TEST(ResidualDropout, BackwardMatchesFiniteDifferences) {
  std::mt19937 rng(55);
  const int64_t n = 37;
  const float p = 0.3f;
  Values x = random_values(n, rng), sub = random_values(n, rng);
  const Values weights = random_values(n, rng);
  const Values dx_before = random_values(n, rng), d_sub_before = random_values(n, rng);
  Values dx = dx_before, d_sub = d_sub_before;
  cpu::residual_dropout_backward<double>(dx.data(), d_sub.data(), weights.data(), n, p,
                                         kDropoutKey, GradStore::kAdd);
  const auto objective = [&] {
    Values y(n);
    cpu::residual_dropout_forward<double>(y.data(), x.data(), sub.data(), n, p, kDropoutKey);
    return weighted_sum(y, weights);
  };
  expect_gradient_matches("residual dx", x, difference(dx, dx_before), objective);
  expect_gradient_matches("residual d_sub", sub, difference(d_sub, d_sub_before), objective);
  // Null d_sub (or dx) is skipped.
  Values dx_only = dx_before;
  cpu::residual_dropout_backward<double>(dx_only.data(), nullptr, weights.data(), n, p,
                                         kDropoutKey, GradStore::kAdd);
  EXPECT_EQ(dx_only, dx);
}

TEST(CopyRows, GathersAndScattersByIndex) {
  // src rows r = [10r, 10r + 1, 10r + 2]; gather rows 2, 0 into dst rows 1, 3.
  std::vector<float> src(4 * 3), dst(4 * 3, -1.0f);
  for (int r = 0; r < 4; ++r) {
    for (int c = 0; c < 3; ++c) src[r * 3 + c] = 10.0f * r + c;
  }
  const int32_t from[] = {2, 0}, to[] = {1, 3};
  cpu::copy_rows<float>(dst.data(), to, src.data(), from, 2, 3);
  const std::vector<float> expected = {-1, -1, -1, 20, 21, 22, -1, -1, -1, 0, 1, 2};
  EXPECT_EQ(dst, expected);
  // Null index lists mean rows 0, 1, ...
  std::vector<float> copy(2 * 3, 0.0f);
  cpu::copy_rows<float>(copy.data(), nullptr, src.data(), from, 2, 3);
  EXPECT_EQ(copy, (std::vector<float>{20, 21, 22, 0, 1, 2}));
}

// Zero-sized transfers through the CPU backend do nothing, also with the null pointers
// an empty tensor or an empty host vector may carry (the M = 0 cases of the linear
// twins upload such vectors). memcpy/memset with a null pointer are undefined even for
// zero bytes: in a plain build this passes either way, under UBSan (tools/sanitize.sh)
// it fails without the backend's zero-size checks.
TEST(Transfers, ZeroSizedTransfersWithNullPointersAreNoOps) {
  for (DType dtype : {DType::F32, DType::F64}) {
    auto backend = make_cpu_backend(dtype);
    Tensor empty;
    empty.dtype = dtype;
    empty.numel = 0;
    backend->zero(empty);
    backend->copy(empty, empty);
    backend->upload(empty, nullptr);
    backend->download(nullptr, empty);
    backend->upload_ids(nullptr, nullptr, 0);
    backend->download_ids(nullptr, nullptr, 0);
  }
}

// Backend::peak_memory_bytes on the CPU: the process's peak resident set, which holds a
// tensor once its pages are written, and which a free does not lower. Linux keeps the
// resident-set counters per thread and folds them in every 64 page faults, so two reads
// of VmHWM can differ by a few hundred KiB either way (seen: 300 KiB lower after the
// free): the checks allow 16 MiB of that, against a 64 MiB tensor.
int64_t resident_bytes() {  // VmRSS, the resident set now
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::strtoll(line.c_str() + 6, nullptr, 10) * 1024;
  }
  return -1;
}

TEST(PeakMemory, CpuBackendReportsThePeakResidentSet) {
  auto backend = make_cpu_backend(DType::F32);
  constexpr int64_t kSlack = int64_t(16) << 20;
  const int64_t before = backend->peak_memory_bytes(), resident = resident_bytes();
  ASSERT_GT(before, 0) << "no VmHWM in /proc/self/status";
  ASSERT_GT(resident, 0) << "no VmRSS in /proc/self/status";
  constexpr int64_t kBytes = int64_t(64) << 20;
  Tensor big = backend->alloc(DType::F32, kBytes / 4);
  backend->zero(big);  // written: resident, on top of what was
  const int64_t held = backend->peak_memory_bytes();
  EXPECT_GE(held, resident + kBytes - kSlack);
  EXPECT_GE(held, before - kSlack);
  backend->free(big);
  EXPECT_GE(backend->peak_memory_bytes(), held - kSlack);
}

// Each op override the backends make from kernels/op_list.h (kernels/twin_call.h) checks
// every tensor's dtype against the element type its twin takes before the twin sees the
// data, and names the op and the argument; a null tensor reaches the twin as a null
// pointer (linear_forward without a bias). What the CUDA backend's overrides do too.
TEST(OpDispatch, ATensorOfAnotherDtypeIsRefusedNamingTheOpAndArgument) {
  auto backend = make_cpu_backend(DType::F32);
  std::vector<float> floats(4, 1.5f), weights{1.0f, 2.0f, 3.0f, 4.0f};
  std::vector<double> doubles(4, -2.0);
  const auto tensor = [](void* data, DType dtype, int64_t numel) {
    Tensor t;
    t.data = data;
    t.dtype = dtype;
    t.numel = numel;
    return t;
  };
  const Tensor y = tensor(floats.data(), DType::F32, 4);
  const Tensor wrong = tensor(doubles.data(), DType::F64, 4);
  expect_error([&] { backend->relu_forward(y, wrong, 4); },
               {"relu_forward: argument 2 is a fp64 tensor where the cpu-fp32 backend takes fp32"});
  EXPECT_EQ(floats, std::vector<float>(4, 1.5f)) << "the twin ran before the check";
  expect_error(
      [&] { backend->adam_update(y, Tensor{}, y, y, wrong, 4, 0.1f, 0.9f, 0.98f, 1e-9f, 1); },
      {"adam_update: argument 5 is a fp64 tensor"});
  expect_error([&] { make_cpu_backend(DType::F64)->sum_squares(y, 4); },
               {"sum_squares: argument 1 is a fp32 tensor where the cpu-fp64 backend takes fp64"});

  // x [1, 2] times W [2, 2], no bias.
  const Tensor x = tensor(floats.data(), DType::F32, 2);
  const Tensor W = tensor(weights.data(), DType::F32, 4);
  std::vector<float> out(2, 99.0f);
  backend->linear_forward(tensor(out.data(), DType::F32, 2), x, W, Tensor{}, 1, 2, 2);
  EXPECT_EQ(out, (std::vector<float>{1.5f * 1 + 1.5f * 3, 1.5f * 2 + 1.5f * 4}));

  EXPECT_STREQ(op_name(OpId::embedding_forward), "embedding_forward");
  EXPECT_STREQ(op_name(OpId::scale), "scale");
}

}  // namespace
}  // namespace thpc::cpu_test

namespace thpc::test {
namespace {

// Sizes: tiny, odd, not multiples of 4 (the GPU draws dropout masks 4 elements at a
// time), of 32, 128 or 256 (threads per block), and one over a million elements.
const std::vector<int64_t> kSizes = {1, 3, 37, 1027, 65539, 1000003};

// Same positions of exact zeros (the dropped elements): the dropout masks agree.
::testing::AssertionResult same_zeros(const std::vector<float>& actual,
                                      const std::vector<float>& expected) {
  if (actual.size() != expected.size()) return ::testing::AssertionFailure() << "sizes differ";
  size_t mismatches = 0, first = 0, zeros = 0;
  for (size_t i = 0; i < actual.size(); ++i) {
    zeros += expected[i] == 0.0f;
    if ((actual[i] == 0.0f) != (expected[i] == 0.0f)) {
      if (mismatches++ == 0) first = i;
    }
  }
  if (mismatches == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << mismatches << " of " << actual.size()
                                       << " mask positions differ (CPU drops " << zeros
                                       << "); first at " << first << ": got " << actual[first]
                                       << ", expected " << expected[first];
}

// A key with every field non-zero, high seed bits included.
DropoutKey test_key(int64_t n) {
  return DropoutKey{0xfedcba9876543210ull ^ static_cast<uint64_t>(n), 1234u, 7u, 5u};
}

// ---- device memory ------------------------------------------------------------------

// Backend::peak_memory_bytes on the GPU: the peak of what the backend holds through
// cudaMalloc, counted at each allocation and free (tensors and ids alike).
TEST(CudaPeakMemory, CountsTheBackendsDeviceAllocations) {
  THPC_REQUIRE_REAL_GPU();  // the CPU stand-in reports its resident set instead
  Twins twins(DType::F32);
  Backend& gpu = *twins.gpu;
  const int64_t start = gpu.peak_memory_bytes();  // the Context's cuBLASLt workspace
  EXPECT_GE(start, int64_t(32) << 20);
  constexpr int64_t kMiB = int64_t(1) << 20;
  Tensor a = gpu.alloc(DType::F32, 64 * kMiB);  // 256 MiB
  int32_t* ids = gpu.alloc_ids(kMiB);            // 4 MiB
  const int64_t peak = gpu.peak_memory_bytes();
  EXPECT_GE(peak, start + 260 * kMiB);
  gpu.free(a);
  gpu.free_ids(ids);
  Tensor b = gpu.alloc(DType::BF16, 64 * kMiB);  // 128 MiB: below the peak
  EXPECT_EQ(gpu.peak_memory_bytes(), peak);
  Tensor c = gpu.alloc(DType::F32, 64 * kMiB);   // 128 + 256 MiB held: a new peak
  EXPECT_EQ(gpu.peak_memory_bytes(), peak + 124 * kMiB);
  gpu.free(b);
  gpu.free(c);
}

// ---- conversion ---------------------------------------------------------------------

TEST(CudaElementwise, ConvertRoundsToNearestEvenAndCopies) {
  THPC_REQUIRE_REAL_GPU();  // bf16 tensors: no rehearsal on the CPU
  Twins twins(DType::BF16);
  Scope gpu(*twins.gpu);
  std::mt19937 rng(1);
  for (int64_t n : kSizes) {
    SCOPED_TRACE(describe(DType::BF16, n));
    std::vector<float> host = random_values(static_cast<size_t>(n), rng, -1000.0f, 1000.0f);
    // Exact ties between two bf16 values (low 16 bits 0x8000): round to even.
    std::uniform_int_distribution<uint32_t> high(0x0080u, 0x7f00u);
    for (size_t i = 0; i < host.size(); i += 3) {
      const uint32_t bits = (high(rng) << 16) | 0x8000u | (i % 2 ? 0x80000000u : 0u);
      std::memcpy(&host[i], &bits, 4);
    }
    Tensor f32 = gpu.put(DType::F32, host);
    Tensor bf = gpu.alloc(DType::BF16, n);
    twins.gpu->copy(bf, f32);  // F32 -> BF16
    EXPECT_TRUE(all_close(gpu.get(bf), representable(host, DType::BF16), 0.0, 0.0));
    Tensor f32_copy = gpu.alloc(DType::F32, n);
    twins.gpu->copy(f32_copy, f32);  // F32 -> F32
    EXPECT_TRUE(all_close(gpu.get(f32_copy), host, 0.0, 0.0));
    Tensor bf_copy = gpu.alloc(DType::BF16, n);
    twins.gpu->copy(bf_copy, bf);  // BF16 -> BF16, then BF16 -> F32 inside get()
    EXPECT_TRUE(all_close(gpu.get(bf_copy), representable(host, DType::BF16), 0.0, 0.0));
  }
}

// ---- ReLU -----------------------------------------------------------------------------

TEST(CudaElementwise, ReluForwardBackwardMatchCpu) {
  THPC_REQUIRE_GPU();
  std::mt19937 rng(2);
  for (DType dtype : gpu_compute_dtypes()) {
    Twins twins(dtype);
    for (int64_t n : kSizes) {
      SCOPED_TRACE(describe(dtype, n));
      const size_t count = static_cast<size_t>(n);
      Both both(twins);
      Pair x = both.act(random_values(count, rng));
      Pair y = both.act_poisoned(n);
      both.cpu().relu_forward(y.cpu, x.cpu, n);
      both.gpu().relu_forward(y.gpu, x.gpu, n);
      // A selection, no arithmetic: exact in both precisions.
      EXPECT_TRUE(all_close(both.gpu_values(y), both.cpu_values(y), 0.0, 0.0));

      Pair dy = both.act(random_values(count, rng));
      Pair dx = both.act(random_values(count, rng));  // accumulated into
      both.cpu().relu_backward(dx.cpu, dy.cpu, y.cpu, n, GradStore::kAdd);
      both.gpu().relu_backward(dx.gpu, dy.gpu, y.gpu, n, GradStore::kAdd);
      EXPECT_TRUE(all_close(both.gpu_values(dx), both.cpu_values(dx), 0.0, rounding_rel(dtype)));
    }
  }
}

// ---- dropout --------------------------------------------------------------------------

// Runs check(both, n, p, key, rel) for every precision, p in {0, 0.1, 0.3} and size;
// rel is the precision's tolerance, key_offset varies the key between tests.
template <typename Check>
void for_each_dropout_case(int64_t key_offset, const Check& check) {
  for (DType dtype : gpu_compute_dtypes()) {
    Twins twins(dtype);
    for (float p : {0.0f, 0.1f, 0.3f}) {
      for (int64_t n : kSizes) {
        SCOPED_TRACE(describe(dtype, n, p));
        Both both(twins);
        check(both, n, p, test_key(n + key_offset), rounding_rel(dtype));
      }
    }
  }
}

TEST(CudaElementwise, DropoutMatchesCpuMaskExactly) {
  THPC_REQUIRE_GPU();
  std::mt19937 rng(3);
  for_each_dropout_case(0, [&](Both& both, int64_t n, float p, const DropoutKey& key,
                               double rel) {
    const size_t count = static_cast<size_t>(n);
    Pair x = both.act(random_values(count, rng));
    Pair y = both.act_poisoned(n);
    both.cpu().dropout_forward(y.cpu, x.cpu, n, p, key);
    both.gpu().dropout_forward(y.gpu, x.gpu, n, p, key);
    const std::vector<float> y_cpu = both.cpu_values(y), y_gpu = both.gpu_values(y);
    EXPECT_TRUE(same_zeros(y_gpu, y_cpu));
    EXPECT_TRUE(all_close(y_gpu, y_cpu, 0.0, rel));

    // Into zeros: the kept positions are exactly the non-zero gradients.
    Pair dy = both.act(random_values(count, rng));
    Pair dx0 = both.act_zeros(n);
    both.cpu().dropout_backward(dx0.cpu, dy.cpu, n, p, key, GradStore::kAdd);
    both.gpu().dropout_backward(dx0.gpu, dy.gpu, n, p, key, GradStore::kAdd);
    EXPECT_TRUE(same_zeros(both.gpu_values(dx0), both.cpu_values(dx0)));

    // Into random values: accumulation.
    Pair dx = both.act(random_values(count, rng));
    both.cpu().dropout_backward(dx.cpu, dy.cpu, n, p, key, GradStore::kAdd);
    both.gpu().dropout_backward(dx.gpu, dy.gpu, n, p, key, GradStore::kAdd);
    EXPECT_TRUE(all_close(both.gpu_values(dx), both.cpu_values(dx), 0.0, rel));

    // In place (the FFN's activation dropout, 2026-12-07): y over x, dx over dy with
    // kWrite, the out-of-place results' bits.
    both.gpu().dropout_forward(x.gpu, x.gpu, n, p, key);
    EXPECT_EQ(both.gpu_values(x), y_gpu);
    Pair written = both.act_poisoned(n);
    both.gpu().dropout_backward(written.gpu, dy.gpu, n, p, key, GradStore::kWrite);
    both.gpu().dropout_backward(dy.gpu, dy.gpu, n, p, key, GradStore::kWrite);
    EXPECT_EQ(both.gpu_values(dy), both.gpu_values(written));
  });
}

TEST(CudaElementwise, ResidualDropoutMatchesCpu) {
  THPC_REQUIRE_GPU();
  std::mt19937 rng(4);
  for_each_dropout_case(1, [&](Both& both, int64_t n, float p, const DropoutKey& key,
                               double rel) {
    const size_t count = static_cast<size_t>(n);
    Pair x = both.act(random_values(count, rng));
    Pair sub = both.act(random_values(count, rng));
    Pair y = both.act_poisoned(n);
    both.cpu().residual_dropout_forward(y.cpu, x.cpu, sub.cpu, n, p, key);
    both.gpu().residual_dropout_forward(y.gpu, x.gpu, sub.gpu, n, p, key);
    EXPECT_TRUE(all_close(both.gpu_values(y), both.cpu_values(y), 0.0, rel));

    // d_sub into zeros: the mask, position by position.
    Pair dy = both.act(random_values(count, rng));
    Pair d_sub0 = both.act_zeros(n);
    both.cpu().residual_dropout_backward(Tensor{}, d_sub0.cpu, dy.cpu, n, p, key, GradStore::kAdd);
    both.gpu().residual_dropout_backward(Tensor{}, d_sub0.gpu, dy.gpu, n, p, key, GradStore::kAdd);
    EXPECT_TRUE(same_zeros(both.gpu_values(d_sub0), both.cpu_values(d_sub0)));

    // Both gradients, accumulated into random values.
    Pair dx = both.act(random_values(count, rng));
    Pair d_sub = both.act(random_values(count, rng));
    both.cpu().residual_dropout_backward(dx.cpu, d_sub.cpu, dy.cpu, n, p, key, GradStore::kAdd);
    both.gpu().residual_dropout_backward(dx.gpu, d_sub.gpu, dy.gpu, n, p, key, GradStore::kAdd);
    EXPECT_TRUE(all_close(both.gpu_values(dx), both.cpu_values(dx), 0.0, rel));
    EXPECT_TRUE(all_close(both.gpu_values(d_sub), both.cpu_values(d_sub), 0.0, rel));

    // dx only (d_sub not needed).
    Pair dx_only = both.act(random_values(count, rng));
    both.cpu().residual_dropout_backward(dx_only.cpu, Tensor{}, dy.cpu, n, p, key, GradStore::kAdd);
    both.gpu().residual_dropout_backward(dx_only.gpu, Tensor{}, dy.gpu, n, p, key, GradStore::kAdd);
    EXPECT_TRUE(all_close(both.gpu_values(dx_only), both.cpu_values(dx_only), 0.0, rel));
  });
}

// GradStore::kWrite: the three backward ops' gradients written onto NaN (dropped elements
// 0), stored without a load.
TEST(CudaElementwise, BackwardsWritingMatchCpu) {
  THPC_REQUIRE_GPU();
  std::mt19937 rng(5);
  for (DType dtype : gpu_compute_dtypes()) {
    Twins twins(dtype);
    for (float p : {0.0f, 0.1f, 0.3f}) {
      for (int64_t n : kSizes) {
        SCOPED_TRACE(describe(dtype, n, p) + " write");
        const double rel = rounding_rel(dtype);
        const DropoutKey key = test_key(n + 7);
        const size_t count = static_cast<size_t>(n);
        Both both(twins);
        auto y_values = random_values(count, rng);
        for (float& value : y_values) value = value > 0.0f ? value : 0.0f;  // a ReLU output
        const Pair y = both.act(y_values), dy = both.act(random_values(count, rng));
        Pair dx = both.act_poisoned(n);
        both.cpu().relu_backward(dx.cpu, dy.cpu, y.cpu, n, GradStore::kWrite);
        both.gpu().relu_backward(dx.gpu, dy.gpu, y.gpu, n, GradStore::kWrite);
        EXPECT_TRUE(all_close(both.gpu_values(dx), both.cpu_values(dx), 0.0, rel)) << "relu";

        Pair dropped = both.act_poisoned(n);
        both.cpu().dropout_backward(dropped.cpu, dy.cpu, n, p, key, GradStore::kWrite);
        both.gpu().dropout_backward(dropped.gpu, dy.gpu, n, p, key, GradStore::kWrite);
        const auto dropped_cpu = both.cpu_values(dropped), dropped_gpu = both.gpu_values(dropped);
        EXPECT_TRUE(same_zeros(dropped_gpu, dropped_cpu)) << "dropout";
        EXPECT_TRUE(all_close(dropped_gpu, dropped_cpu, 0.0, rel)) << "dropout";

        Pair d_x = both.act_poisoned(n), d_sub = both.act_poisoned(n);
        both.cpu().residual_dropout_backward(d_x.cpu, d_sub.cpu, dy.cpu, n, p, key,
                                             GradStore::kWrite);
        both.gpu().residual_dropout_backward(d_x.gpu, d_sub.gpu, dy.gpu, n, p, key,
                                             GradStore::kWrite);
        EXPECT_TRUE(all_close(both.gpu_values(d_x), both.cpu_values(d_x), 0.0, rel)) << "dx";
        EXPECT_TRUE(all_close(both.gpu_values(d_sub), both.cpu_values(d_sub), 0.0, rel))
            << "d_sub";
      }
    }
  }
}

TEST(CudaElementwise, DropoutRejectsBadProbabilityAndHandlesEmpty) {
  THPC_REQUIRE_GPU();
  for (DType dtype : gpu_compute_dtypes()) {
    Twins twins(dtype);
    Scope gpu(*twins.gpu);
    Tensor a = gpu.put(dtype, {0.5f, -0.25f}), b = gpu.put(dtype, {1.0f, 2.0f});
    const DropoutKey key = test_key(2);
    EXPECT_ANY_THROW(twins.gpu->dropout_forward(b, a, 2, 1.0f, key));
    EXPECT_ANY_THROW(twins.gpu->dropout_backward(b, a, 2, -0.1f, key, GradStore::kAdd));
    EXPECT_ANY_THROW(twins.gpu->residual_dropout_forward(b, a, a, 2, 1.5f, key));
    // Zero sizes launch nothing (and do not throw).
    twins.gpu->relu_forward(b, a, 0);
    twins.gpu->relu_backward(b, a, a, 0, GradStore::kAdd);
    twins.gpu->dropout_forward(b, a, 0, 0.1f, key);
    twins.gpu->dropout_backward(b, a, 0, 0.1f, key, GradStore::kAdd);
    twins.gpu->residual_dropout_forward(b, a, a, 0, 0.1f, key);
    twins.gpu->residual_dropout_backward(b, b, a, 0, 0.1f, key, GradStore::kAdd);
    twins.gpu->copy_rows(b, nullptr, a, nullptr, 0, 1);
    twins.gpu->synchronize();
    EXPECT_TRUE(all_close(gpu.get(b), representable({1.0f, 2.0f}, dtype), 0.0, 0.0));
  }
}

// ---- row copies -----------------------------------------------------------------------

TEST(CudaElementwise, CopyRowsMatchesCpu) {
  THPC_REQUIRE_GPU();
  std::mt19937 rng(5);
  const int src_rows_count = 11, dst_rows_count = 13, count = 9;
  for (DType dtype : gpu_compute_dtypes()) {
    Twins twins(dtype);
    for (int width : {1, 37, 512, 1025}) {
      SCOPED_TRACE(describe(dtype, width));
      // Destination rows: distinct (a scatter into a cache); sources: with repeats.
      std::vector<int32_t> dst_rows(dst_rows_count);
      std::iota(dst_rows.begin(), dst_rows.end(), 0);
      std::shuffle(dst_rows.begin(), dst_rows.end(), rng);
      dst_rows.resize(count);
      std::uniform_int_distribution<int32_t> pick(0, src_rows_count - 1);
      std::vector<int32_t> src_rows(count);
      for (int32_t& row : src_rows) row = pick(rng);
      for (int variant = 0; variant < 4; ++variant) {
        SCOPED_TRACE(variant);
        Both both(twins);
        auto [dst_ids_cpu, dst_ids_gpu] = both.ids(dst_rows);
        auto [src_ids_cpu, src_ids_gpu] = both.ids(src_rows);
        const bool use_dst = (variant & 1) != 0, use_src = (variant & 2) != 0;
        Pair src = both.act(random_values(static_cast<size_t>(src_rows_count) * width, rng));
        Pair dst = both.act(random_values(static_cast<size_t>(dst_rows_count) * width, rng));
        both.cpu().copy_rows(dst.cpu, use_dst ? dst_ids_cpu : nullptr, src.cpu,
                             use_src ? src_ids_cpu : nullptr, count, width);
        both.gpu().copy_rows(dst.gpu, use_dst ? dst_ids_gpu : nullptr, src.gpu,
                             use_src ? src_ids_gpu : nullptr, count, width);
        EXPECT_TRUE(all_close(both.gpu_values(dst), both.cpu_values(dst), 0.0, 0.0));
      }
    }
  }
}

TEST(CudaElementwise, ScaleAndSumSquaresMatchCpu) {
  THPC_REQUIRE_GPU();
  std::mt19937 rng(6);
  Twins twins(DType::F32);  // parameter-side ops are fp32 in both GPU precisions
  for (int64_t n : {int64_t{1}, int64_t{255}, int64_t{257}, int64_t{65539}, int64_t{1000003}}) {
    SCOPED_TRACE(describe(DType::F32, n));
    Both both(twins);
    Pair x = both.param(random_values(static_cast<size_t>(n), rng, -3.0f, 3.0f));
    both.cpu().scale(x.cpu, n, 0.37f);
    both.gpu().scale(x.gpu, n, 0.37f);
    EXPECT_TRUE(all_close(both.gpu_values(x), both.cpu_values(x), 0.0, 0.0));

    const double expected = both.cpu().sum_squares(x.cpu, n);
    const double first = both.gpu().sum_squares(x.gpu, n);
    const double second = both.gpu().sum_squares(x.gpu, n);
    EXPECT_NEAR(first, expected, 1e-10 * expected);
    EXPECT_EQ(std::memcmp(&first, &second, sizeof(double)), 0) << "not deterministic";
  }
  Scope gpu(*twins.gpu);
  EXPECT_EQ(twins.gpu->sum_squares(gpu.put(DType::F32, {2.0f}), 0), 0.0);
}

// sum_squares_into: the same kernels as sum_squares, the total written into the step's
// StepTotals (grad_squares; the other fields kept) instead of read back: the same bits.
TEST(CudaElementwise, SumSquaresIntoTheStepTotalsIsSumSquares) {
  THPC_REQUIRE_GPU();
  std::mt19937 rng(7);
  Twins twins(DType::F32);
  for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{257}, int64_t{1000003}}) {
    SCOPED_TRACE(describe(DType::F32, n));
    Both both(twins);
    Pair x = both.param(random_values(static_cast<size_t>(std::max<int64_t>(n, 1)), rng, -3.0f, 3.0f));
    for (Backend* backend : {&both.cpu(), &both.gpu()}) {
      const Tensor values = backend == &both.cpu() ? x.cpu : x.gpu;
      StepTotalsBuffer totals(*backend);
      StepTotals start;
      start.loss = 1.5;
      start.tokens = 4;
      start.grad_squares = 99.0;
      backend->upload(totals.tensor(), &start);
      backend->sum_squares_into(totals.tensor(), values, n);
      const StepTotals read = totals.read(10);
      const double returned = backend->sum_squares(values, n);
      EXPECT_EQ(std::memcmp(&read.grad_squares, &returned, sizeof(double)), 0)
          << backend->name() << ": " << read.grad_squares << " vs " << returned;
      EXPECT_EQ(read.loss, 1.5);
      EXPECT_EQ(read.tokens, 4);
    }
  }
}

}  // namespace
}  // namespace thpc::test
