// Shared helpers of the CUDA twin tests (tests/kernels/<op>_test.cc, beside each op's CPU
// reference tests, and tests/test_cuda_training.cc): each CUDA op is run on the same
// random inputs as its CPU reference twin, through the Backend interface, and the
// outputs are compared with a tolerance abs + rel * eps(dtype) chosen per op.
//
// Without a GPU (or in a CPU-only build) every such test reports SKIPPED with the
// reason — never a silent pass (ctest shows them as "Skipped").
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "backend/factory.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/ops.h"

// First statement of a test that needs a GPU: skips with the reason when none is usable.
// THPC_REQUIRE_GPU is for the kernel twin tests, which may be rehearsed on the CPU
// (twin_rehearsal below); THPC_REQUIRE_REAL_GPU for tests that use the GPU otherwise
// (whole-model runs, NCCL), which always skip without one.
#define THPC_REQUIRE_REAL_GPU()                                                        \
  do {                                                                                 \
    const std::string thpc_gpu_reason_ = ::thpc::cuda_unavailable_reason();            \
    if (!thpc_gpu_reason_.empty()) GTEST_SKIP() << "needs a GPU: " << thpc_gpu_reason_; \
  } while (0)
#define THPC_REQUIRE_GPU()                                      \
  do {                                                          \
    if (!::thpc::test::twin_rehearsal()) THPC_REQUIRE_REAL_GPU(); \
  } while (0)

namespace thpc::test {

// THPC_TWIN_REHEARSAL=1 (set by `bench/gpu_session.sh --dry-run`): the kernel twin tests
// run with a second CPU backend in fp32 standing in for the GPU. The comparison is then
// the CPU against itself and proves nothing about the CUDA code; what it proves is that
// each test's own logic holds (arguments the op accepts, sizes, indices, the twin lines
// it prints), so that a mistake there shows on the CPU machine instead of costing GPU
// minutes. (A k larger than the row in CudaRowTopK.MatchesCpu was found this way.)
inline bool twin_rehearsal() {
  const char* value = std::getenv("THPC_TWIN_REHEARSAL");
  return value != nullptr && std::strcmp(value, "1") == 0;
}

// Machine epsilon (distance from 1 to the next value) of a compute dtype: 2^-23 for fp32,
// 2^-7 for bf16 (8 significand bits), 2^-52 for fp64.
inline double eps_of(DType dtype) {
  switch (dtype) {
    case DType::F32: return std::ldexp(1.0, -23);
    case DType::BF16: return std::ldexp(1.0, -7);
    case DType::F64: return std::ldexp(1.0, -52);
  }
  return 0.0;
}

// The GPU precisions every twin test runs: fp32 (tight), bf16 (training).
// (A rehearsal has no bf16 backend: fp32 only.)
inline std::vector<DType> gpu_compute_dtypes() {
  if (twin_rehearsal()) return {DType::F32};
  return {DType::F32, DType::BF16};
}

// fp32 -> bf16 bits, round to nearest even (what __float2bfloat16_rn does); NaN stays NaN.
inline uint16_t bf16_bits(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, 4);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40);
  const uint32_t rounding = 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>((bits + rounding) >> 16);
}
inline float from_bf16_bits(uint16_t half) {
  const uint32_t bits = static_cast<uint32_t>(half) << 16;
  float value;
  std::memcpy(&value, &bits, 4);
  return value;
}
// The value as a tensor of `dtype` holds it: rounded to bf16 for BF16, unchanged else.
// The CPU twin gets the rounded inputs, so differences come from the op, not the upload.
inline std::vector<float> representable(const std::vector<float>& values, DType dtype) {
  if (dtype != DType::BF16) return values;
  std::vector<float> out(values.size());
  for (size_t i = 0; i < values.size(); ++i) out[i] = from_bf16_bits(bf16_bits(values[i]));
  return out;
}

// Uniform in [lo, hi], redrawn while |x| < 1e-3: random and never zero.
inline std::vector<float> random_values(size_t count, std::mt19937& rng, float lo = -1.0f,
                                        float hi = 1.0f) {
  std::uniform_real_distribution<float> uniform(lo, hi);
  std::vector<float> values(count);
  for (float& value : values) {
    do value = uniform(rng);
    while (std::abs(value) < 1e-3f);
  }
  return values;
}

// Tensors allocated on one backend, freed together when the scope ends.
class Scope {
 public:
  explicit Scope(Backend& backend) : backend_(backend) {}
  ~Scope() {
    for (Tensor& t : tensors_) backend_.free(t);
    for (int32_t*& ids : ids_) backend_.free_ids(ids);
  }
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;
  Backend& backend() { return backend_; }

  // A tensor of `dtype` holding `host` (rounded to the dtype).
  Tensor put(DType dtype, const std::vector<float>& host) {
    Tensor t = alloc(dtype, static_cast<int64_t>(host.size()));
    if (dtype == DType::F32) {
      backend_.upload(t, host.data());
    } else {
      Tensor staging = backend_.alloc(DType::F32, t.numel);
      backend_.upload(staging, host.data());
      backend_.copy(t, staging);  // converts
      backend_.free(staging);
    }
    return t;
  }
  Tensor alloc(DType dtype, int64_t numel) {
    tensors_.push_back(backend_.alloc(dtype, numel));
    return tensors_.back();
  }
  Tensor zeros(DType dtype, int64_t numel) {
    Tensor t = alloc(dtype, numel);
    backend_.zero(t);
    return t;
  }
  int32_t* put_ids(const std::vector<int32_t>& host) {
    ids_.push_back(backend_.alloc_ids(static_cast<int64_t>(host.size())));
    backend_.upload_ids(ids_.back(), host.data(), static_cast<int64_t>(host.size()));
    return ids_.back();
  }
  // The tensor's values widened to fp32.
  std::vector<float> get(Tensor t) {
    std::vector<float> host(static_cast<size_t>(t.numel));
    if (t.dtype == DType::F32) {
      backend_.download(host.data(), t);
    } else {
      Tensor staging = backend_.alloc(DType::F32, t.numel);
      backend_.copy(staging, t);
      backend_.download(host.data(), staging);
      backend_.free(staging);
    }
    return host;
  }

 private:
  Backend& backend_;
  std::vector<Tensor> tensors_;
  std::vector<int32_t*> ids_;
};

// The CUDA kernel choice with `candidates` (CandidateKernels bits), the rest defaults.
inline CudaKernelChoice kernels_with(unsigned candidates) {
  CudaKernelChoice kernels;
  kernels.candidates = candidates;
  return kernels;
}

// A CPU reference backend and a CUDA backend computing in `gpu_dtype`, for one test;
// `kernels` chooses among the CUDA kernels (the defaults of [train] cuda_kernels and
// short_attention_max_len unless a test says otherwise; candidates: kAllCandidates,
// the kernels not yet checked on a GPU, where an op has one).
struct Twins {
  explicit Twins(DType gpu_dtype, const CudaKernelChoice& kernels = {})
      : compute(gpu_dtype), cpu(make_cpu_backend(DType::F32)),
        gpu(twin_rehearsal()
                ? make_cpu_backend(DType::F32)
                : make_backend(BackendRequest{"cuda", gpu_dtype == DType::BF16 ? "bf16" : "fp32",
                                              0, 0, kernels})) {}
  DType compute;
  std::unique_ptr<Backend> cpu, gpu;
};

// How a twin test has an op store its activation gradients (kernels/ops.h, GradStore):
// kAdd onto the test's random values (the += rule), or kWrite onto NaN (an element the op
// does not write fails the comparison).
struct StoreMode {
  GradStore store = GradStore::kAdd;

  bool writes() const { return store == GradStore::kWrite; }
  // The values an activation gradient starts from: `added_to` for kAdd, NaN for kWrite.
  std::vector<float> start(const std::vector<float>& added_to) const {
    return writes() ? std::vector<float>(added_to.size(), NAN) : added_to;
  }
  // What the op's result is added onto, as the tolerances count it: zeros for kWrite.
  std::vector<float> onto(const std::vector<float>& added_to) const {
    return writes() ? std::vector<float>(added_to.size(), 0.0f) : added_to;
  }
  const char* name() const {
    return writes() ? "write" : "add";
  }
};

// Every |actual - expected| <= abs_tol + rel_tol * |expected|; on failure names the
// worst element and how many failed. Every call also prints one line
//   twin SUITE.TEST: max |error| E, max error/allowed U, tolerance A + R*|expected|, N elements
// pass or fail, so a GPU run yields the measured errors to tighten the tolerances with
// (U is the share of the tolerance used; bench/gpu_session.sh collects these lines).
inline ::testing::AssertionResult all_close(const std::vector<float>& actual,
                                            const std::vector<float>& expected, double abs_tol,
                                            double rel_tol) {
  if (actual.size() != expected.size()) {
    return ::testing::AssertionFailure()
           << "sizes differ: " << actual.size() << " vs " << expected.size();
  }
  size_t failures = 0, worst = 0;
  double worst_excess = 0.0, max_error = 0.0, max_used = 0.0;
  for (size_t i = 0; i < actual.size(); ++i) {
    const double diff = std::abs(static_cast<double>(actual[i]) - expected[i]);
    const double allowed = abs_tol + rel_tol * std::abs(static_cast<double>(expected[i]));
    max_error = std::isnan(diff) ? INFINITY : std::max(max_error, diff);
    max_used = std::max(max_used, allowed > 0.0 ? diff / allowed : (diff > 0.0 ? INFINITY : 0.0));
    if (!(diff <= allowed)) {  // also catches NaN
      ++failures;
      const double excess = std::isnan(diff) ? INFINITY : diff - allowed;
      if (failures == 1 || excess > worst_excess) {
        worst_excess = excess;
        worst = i;
      }
    }
  }
  const ::testing::TestInfo* test = ::testing::UnitTest::GetInstance()->current_test_info();
  std::printf("twin %s.%s: max |error| %.3g, max error/allowed %.3g, "
              "tolerance %.3g + %.3g*|expected|, %zu elements\n",
              test != nullptr ? test->test_suite_name() : "?", test != nullptr ? test->name() : "?",
              max_error, max_used, abs_tol, rel_tol, actual.size());
  if (failures == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << failures << " of " << actual.size() << " elements outside " << abs_tol << " + "
         << rel_tol << "*|expected|; worst at " << worst << ": got " << actual[worst]
         << ", expected " << expected[worst];
}

// ---- comparing the two backends, shared by the twin tests -----------------------------

// Relative tolerance of an activation output of an op that performs the CPU's fp32
// operations in the CPU's order: 0 in fp32 (bit-identical), and in bf16 eps_of(bf16), the
// CPU's fp32 result rounded once to bf16 (at most half an ulp, 2^-8 |x|, away).
inline double rounding_rel(DType dtype) { return dtype == DType::F32 ? 0.0 : eps_of(dtype); }

// The same tensor on each backend.
struct Pair {
  Tensor cpu, gpu;
};

// Tensors on the CPU twin and on the GPU, freed at scope end. Activations are in the
// GPU's compute dtype on the GPU and hold the same (representable) values in fp32 on
// the CPU; parameter-side tensors are fp32 on both.
class Both {
 public:
  explicit Both(Twins& twins)
      : dtype_(twins.compute), cpu_(*twins.cpu), gpu_(*twins.gpu) {}
  Backend& cpu() { return cpu_.backend(); }
  Backend& gpu() { return gpu_.backend(); }
  DType dtype() const { return dtype_; }

  Pair act(const std::vector<float>& host) {
    return {cpu_.put(DType::F32, representable(host, dtype_)), gpu_.put(dtype_, host)};
  }
  Pair param(const std::vector<float>& host) {
    return {cpu_.put(DType::F32, host), gpu_.put(DType::F32, host)};
  }
  // Filled with NaN, so an element the op does not write fails the comparison.
  Pair act_poisoned(int64_t n) { return act(std::vector<float>(static_cast<size_t>(n), NAN)); }
  Pair act_zeros(int64_t n) { return {cpu_.zeros(DType::F32, n), gpu_.zeros(dtype_, n)}; }
  std::pair<int32_t*, int32_t*> ids(const std::vector<int32_t>& host) {
    return {cpu_.put_ids(host), gpu_.put_ids(host)};
  }
  std::vector<float> cpu_values(const Pair& t) { return cpu_.get(t.cpu); }
  std::vector<float> gpu_values(const Pair& t) { return gpu_.get(t.gpu); }

 private:
  DType dtype_;
  Scope cpu_, gpu_;
};

// "DTYPE n=N p=P": what a test's SCOPED_TRACE names.
inline std::string describe(DType dtype, int64_t n, float p = 0.0f) {
  std::ostringstream out;
  out << dtype_name(dtype) << " n=" << n << " p=" << p;
  return out.str();
}

// Bitwise equality of two float vectors (determinism). Empty vectors are equal without
// memcmp, whose pointers must not be null even for a size of 0.
inline bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

// 2^-23, the machine epsilon of fp32, as the GEMM and sum tolerances count it.
inline constexpr double kEps32 = 1.0 / (1 << 23);

// Half a ulp of the output type, relative: the rounding of a stored result.
inline double output_rounding(DType dtype) {
  return dtype == DType::BF16 ? eps_of(dtype) / 2 : 0.0;
}

// Every |actual - expected| <= factor * scale[i] (+ a floor of 1e-30 for scale 0).
inline ::testing::AssertionResult within_scaled(const std::vector<float>& actual,
                                                const std::vector<float>& expected,
                                                const std::vector<double>& scale,
                                                double factor) {
  if (actual.size() != expected.size() || actual.size() != scale.size()) {
    return ::testing::AssertionFailure() << "sizes differ: " << actual.size() << ", "
                                         << expected.size() << ", " << scale.size();
  }
  size_t failures = 0, worst = 0;
  double worst_ratio = 0.0;
  for (size_t i = 0; i < actual.size(); ++i) {
    const double diff = std::abs(static_cast<double>(actual[i]) - expected[i]);
    const double allowed = factor * scale[i] + 1e-30;
    if (!(diff <= allowed)) {
      ++failures;
      const double ratio = std::isnan(diff) ? INFINITY : diff / allowed;
      if (failures == 1 || ratio > worst_ratio) {
        worst_ratio = ratio;
        worst = i;
      }
    }
  }
  if (failures == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << failures << " of " << actual.size() << " elements outside " << factor
         << " * scale; worst at " << worst << ": got " << actual[worst] << ", expected "
         << expected[worst] << ", scale " << scale[worst] << " (" << worst_ratio
         << " times the tolerance)";
}

}  // namespace thpc::test
