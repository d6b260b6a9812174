// Adam (kernels/cpu/adam.cc, kernels/cuda/adam.cu): the CPU reference against two steps
// computed by hand, then the CUDA twin (exact by construction: the GPU performs the
// CPU's fp32 operations in its order; 2 ulp of slack).
// The CUDA twins run the op on the GPU and on the CPU reference backend (tests/cuda_twin.h)
// in fp32 and bf16; without a GPU (or in a CPU-only build) they report SKIPPED.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "backend/factory.h"
#include "common/bf16.h"
#include "cpu_reference.h"
#include "cuda_twin.h"
#include "expect_error.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cuda/fused_adam.cuh"

namespace thpc::cpu_test {
namespace {

// Two steps on three parameters with binary-exact hyperparameters lr = 1/4, b1 = 1/2,
// b2 = 3/4, eps = 1/8 (a large eps, so adding it to sqrt(v_hat) rather than to v_hat
// makes a visible difference).
template <typename T>
void check_adam_by_hand(double tolerance) {
  const float lr = 0.25f, beta1 = 0.5f, beta2 = 0.75f, eps = 0.125f;
  std::vector<T> params{T(1.0), T(-2.0), T(0.5)};
  std::vector<T> m(3, T(0)), v(3, T(0));

  // Step 1, g = (0.5, -1, 2):
  //   m = 0.5 * 0 + 0.5 g = (0.25, -0.5, 1);  v = 0.75 * 0 + 0.25 g^2 = (0.0625, 0.25, 1)
  //   1 - b1^1 = 0.5, 1 - b2^1 = 0.25:  m_hat = (0.5, -1, 2), v_hat = (0.25, 1, 4)
  //   sqrt(v_hat) + eps = (0.625, 1.125, 2.125)
  //   p -= 0.25 * m_hat / that = (0.125 / 0.625, -0.25 / 1.125, 0.5 / 2.125)
  const std::vector<T> g1{T(0.5), T(-1.0), T(2.0)};
  cpu::adam_update<T>(params.data(), nullptr, g1.data(), m.data(), v.data(), 3, lr, beta1, beta2,
                      eps, 1);
  const double step1[3] = {1.0 - 0.125 / 0.625, -2.0 + 0.25 / 1.125, 0.5 - 0.5 / 2.125};
  EXPECT_NEAR(params[0], 0.8, tolerance);  // 1 - 0.2
  for (int i = 0; i < 3; ++i) EXPECT_NEAR(params[i], step1[i], tolerance) << i;
  EXPECT_NEAR(m[0], 0.25, tolerance);
  EXPECT_NEAR(v[2], 1.0, tolerance);

  // Step 2, g = (-0.5, 0.25, 1):
  //   m = 0.5 m + 0.5 g = (0.125 - 0.25, -0.25 + 0.125, 0.5 + 0.5) = (-0.125, -0.125, 1)
  //   v = 0.75 v + 0.25 g^2 = (0.046875 + 0.0625, 0.1875 + 0.015625, 0.75 + 0.25)
  //     = (0.109375, 0.203125, 1)
  //   1 - b1^2 = 0.75, 1 - b2^2 = 1 - 0.5625 = 0.4375
  //   m_hat = m / 0.75 = (-1/6, -1/6, 4/3);  v_hat = v / 0.4375 = (0.25, 0.4642857.., 2.2857..)
  //   p -= 0.25 * m_hat / (sqrt(v_hat) + 0.125)
  const std::vector<T> g2{T(-0.5), T(0.25), T(1.0)};
  cpu::adam_update<T>(params.data(), nullptr, g2.data(), m.data(), v.data(), 3, lr, beta1, beta2,
                      eps, 2);
  const double m_hat[3] = {-0.125 / 0.75, -0.125 / 0.75, 1.0 / 0.75};
  const double v_hat[3] = {0.109375 / 0.4375, 0.203125 / 0.4375, 1.0 / 0.4375};
  for (int i = 0; i < 3; ++i) {
    const double expected = step1[i] - 0.25 * m_hat[i] / (std::sqrt(v_hat[i]) + 0.125);
    EXPECT_NEAR(params[i], expected, tolerance) << i;
  }
  // Parameter 0 by hand: v_hat = 0.25, sqrt = 0.5, 0.25 * (-1/6) / 0.625 = -1/15.
  EXPECT_NEAR(params[0], 0.8 + 1.0 / 15.0, tolerance);
  EXPECT_NEAR(m[1], -0.125, tolerance);
  EXPECT_NEAR(v[1], 0.203125, tolerance);
}

TEST(Adam, TwoStepsMatchHandComputation) {
  check_adam_by_hand<double>(1e-15);
  check_adam_by_hand<float>(1e-6);
}

// The compute copy (ParamStore's, where the weights the ops read are another buffer) is
// the updated parameters, the masters and moments as without it.
TEST(Adam, ComputeCopyHoldsTheUpdatedParameters) {
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  std::vector<float> params(37), grads(37), m(37, 0.0f), v(37, 0.0f);
  for (float& x : params) x = uniform(rng);
  for (float& x : grads) x = uniform(rng);
  std::vector<float> alone = params, m_alone = m, v_alone = v;
  std::vector<float> compute(37, NAN);
  cpu::adam_update<float>(params.data(), compute.data(), grads.data(), m.data(), v.data(), 37,
                          1e-3f, 0.9f, 0.98f, 1e-9f, 4);
  cpu::adam_update<float>(alone.data(), nullptr, grads.data(), m_alone.data(), v_alone.data(),
                          37, 1e-3f, 0.9f, 0.98f, 1e-9f, 4);
  EXPECT_EQ(params, alone);
  EXPECT_EQ(m, m_alone);
  EXPECT_EQ(v, v_alone);
  EXPECT_EQ(compute, params);
}

// adamw_update (train.weight_decay): the decay folded into Adam's update,
// p -= step + decay p. In double, against Adam's update of the same state less decay x
// the weights (the step does not read them), and the moments Adam's.
TEST(AdamW, IsAdamsStepLessTheDecayedShare) {
  std::mt19937 rng(6);
  std::uniform_real_distribution<double> uniform(-1.0, 1.0);
  const int n = 9;
  std::vector<double> params(n), grads(n), m(n, 0.0), v(n, 0.0);
  for (double& x : params) x = uniform(rng);
  for (double& x : grads) x = uniform(rng);
  const std::vector<double> original = params;
  std::vector<double> plain = params, m_plain = m, v_plain = v;
  const float lr = 0.01f, decay = lr * 0.1f;
  cpu::adamw_update<double>(params.data(), nullptr, grads.data(), m.data(), v.data(), n, lr, 0.9f,
                            0.98f, 1e-9f, decay, 1);
  cpu::adam_update<double>(plain.data(), nullptr, grads.data(), m_plain.data(), v_plain.data(), n,
                           lr, 0.9f, 0.98f, 1e-9f, 1);
  for (int i = 0; i < n; ++i) {
    // (p0 - (step + decay p0)) - (p0 - step), in double: a few roundings of terms <= 1.
    EXPECT_NEAR(params[i] - plain[i], -static_cast<double>(decay) * original[i], 1e-15) << i;
  }
  EXPECT_EQ(m, m_plain);
  EXPECT_EQ(v, v_plain);
  // Decay 0 is Adam, bit for bit.
  std::vector<double> undecayed = original, m0(n, 0.0), v0(n, 0.0);
  cpu::adamw_update<double>(undecayed.data(), nullptr, grads.data(), m0.data(), v0.data(), n, lr,
                            0.9f, 0.98f, 1e-9f, 0.0f, 1);
  EXPECT_EQ(undecayed, plain);
}

// In float, a decay far below half a weight's float step (1e-8 of it; a separate
// p -= decay p, fairseq's and PyTorch's form, changes no weight below 2^-25 ~ 3e-8) is not
// lost: it moves the rounding of the whole update, so over many weights the decayed
// run's weights sit below Adam's by decay x |p| on average, to a few percent. And the
// compute copy is the updated masters, as adam_update's.
TEST(AdamW, KeepsADecayBelowHalfAFloatStepOnAverage) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  const int n = 200000;
  std::vector<float> params(n), grads(n);
  for (float& x : params) x = uniform(rng);
  for (float& x : grads) x = uniform(rng);
  // Moments of a run under way (step 1000), so that the steps differ from weight to weight
  // in their last bits, as in training: at step 1 from zero moments every step is
  // lr g / |g|, the same for all, and the decay's share of the rounding is then the same
  // for every weight of a binade instead of spread.
  std::vector<float> m(n), v(n);
  std::uniform_real_distribution<float> first(-0.01f, 0.01f), second(1e-3f, 1e-2f);
  for (float& x : m) x = first(rng);
  for (float& x : v) x = second(rng);
  const std::vector<float> original = params;
  std::vector<float> plain = params, m_plain = m, v_plain = v;
  std::vector<float> compute(n, NAN);
  const float lr = 1e-3f, decay = 1e-8f;
  cpu::adamw_update<float>(params.data(), compute.data(), grads.data(), m.data(), v.data(), n,
                           lr, 0.9f, 0.98f, 1e-9f, decay, 1000);
  cpu::adam_update<float>(plain.data(), nullptr, grads.data(), m_plain.data(), v_plain.data(), n,
                          lr, 0.9f, 0.98f, 1e-9f, 1000);
  double shrink = 0.0, magnitude = 0.0;
  int moved = 0;
  for (int i = 0; i < n; ++i) {
    const double toward_zero =
        (static_cast<double>(plain[i]) - params[i]) * (original[i] > 0 ? 1.0 : -1.0);
    shrink += toward_zero;
    magnitude += std::abs(static_cast<double>(original[i]));
    moved += params[i] != plain[i];
  }
  // Each weight moves by 0 or 1 float step (6e-8 of it at most, 1e-8 expected): the mean
  // of 200,000 such has a relative error of about 2 / sqrt(200,000 x 1/6) ~ 1%.
  EXPECT_NEAR(shrink / magnitude, decay, 0.05 * decay);
  EXPECT_GT(moved, n / 20);
  EXPECT_EQ(compute, params);
}

// ---- the one-pass Adam's body on the host (kernels/cuda/fused_adam.cuh) ----------------

// A host bf16 value (its bits), as the GPU's compute copy holds it.
struct HostBf16 {
  uint16_t bits;
};

// fused_adam.cuh's policy on the host: 16-byte moves of four floats checked for their
// alignment, the compute copy rounded as the GPU's conversion rounds (to nearest even).
struct HostMoves {
  void load(float (&out)[4], const float* p) const {
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 16, 0u);
    std::memcpy(out, p, sizeof(out));
  }
  void store(float* p, const float (&in)[4]) const {
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 16, 0u);
    std::memcpy(p, in, sizeof(in));
  }
  template <typename T>
  T round(float value) const {
    if constexpr (std::is_same_v<T, float>) {
      return value;
    } else {
      return T{bf16_from_float(value)};
    }
  }
  template <typename T>
  void store_compute(T* p, const float (&in)[4]) const {
    for (int k = 0; k < 4; ++k) p[k] = round<T>(in[k]);
  }
};

float widened(float value) { return value; }
float widened(HostBf16 value) { return float_from_bf16(value.bits); }

// n parameters updated by `threads` host calls of the body (each a thread of the grid),
// three steps, against the CPU's Adam: the same masters and moments bit for bit (every
// element updated once, by the same arithmetic), the compute copy the masters rounded to T.
template <typename T, bool kDecay = false>
void expect_fused_body_matches_cpu(int64_t n, int64_t threads, uint32_t seed) {
  SCOPED_TRACE("n " + std::to_string(n) + " threads " + std::to_string(threads));
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  const size_t count = static_cast<size_t>(n);
  // 16-byte aligned, as cudaMalloc's buffers.
  struct alignas(16) Block {
    float values[4];
  };
  const auto aligned = [&](std::vector<Block>& storage, bool random) {
    storage.assign((count + 3) / 4 + 1, Block{});
    float* data = storage.front().values;
    for (size_t i = 0; i < count; ++i) data[i] = random ? uniform(rng) : 0.0f;
    return data;
  };
  std::vector<Block> p_store, g_store, m_store, v_store;
  float* params = aligned(p_store, true);
  float* grads = aligned(g_store, true);
  float* m = aligned(m_store, false);
  float* v = aligned(v_store, false);
  std::vector<float> cpu_params(params, params + count), cpu_m(count, 0.0f), cpu_v(count, 0.0f);
  std::vector<T> compute(count + 4, HostMoves{}.round<T>(NAN));
  for (int64_t step = 1; step <= 3; ++step) {
    for (size_t i = 0; i < count; ++i) grads[i] = uniform(rng);
    const float decay = kDecay ? 3e-8f : 0.0f;  // (below half a float step of most weights)
    if (kDecay) {
      cpu::adamw_update<float>(cpu_params.data(), nullptr, grads, cpu_m.data(), cpu_v.data(), n,
                               1e-3f, 0.9f, 0.98f, 1e-9f, decay, step);
    } else {
      cpu::adam_update<float>(cpu_params.data(), nullptr, grads, cpu_m.data(), cpu_v.data(), n,
                              1e-3f, 0.9f, 0.98f, 1e-9f, step);
    }
    const fused_adam::Constants c = fused_adam::constants_for(1e-3f, 0.9f, 0.98f, 1e-9f, step);
    for (int64_t thread = 0; thread < threads; ++thread) {
      fused_adam::thread_body<T, HostMoves, kDecay>(HostMoves{}, thread, threads, c, params,
                                                    compute.data(), grads, m, v, n, decay);
    }
  }
  EXPECT_EQ(std::vector<float>(params, params + count), cpu_params);
  EXPECT_EQ(std::vector<float>(m, m + count), cpu_m);
  EXPECT_EQ(std::vector<float>(v, v + count), cpu_v);
  for (size_t i = 0; i < count; ++i) {
    ASSERT_EQ(widened(compute[i]), widened(HostMoves{}.round<T>(cpu_params[i]))) << i;
  }
  EXPECT_TRUE(std::isnan(widened(compute[count]))) << "written past the end";
}

// Every split of the groups and the tail among the threads (fewer threads than tail
// elements too), fp32 and bf16 compute copies.
TEST(FusedAdamOnTheHost, EveryElementUpdatedOnceAsTheCpu) {
  uint32_t seed = 40;
  for (int64_t n : {int64_t{1}, int64_t{3}, int64_t{4}, int64_t{5}, int64_t{8}, int64_t{11},
                    int64_t{1027}}) {
    for (int64_t threads : {int64_t{1}, int64_t{2}, int64_t{3}, int64_t{64}, int64_t{300}}) {
      expect_fused_body_matches_cpu<float>(n, threads, seed++);
      expect_fused_body_matches_cpu<HostBf16>(n, threads, seed++);
    }
  }
}

// AdamW's form of the same body (the candidate weight_decay's kernels): the CPU's
// adamw_update bit for bit.
TEST(FusedAdamOnTheHost, AdamWsUpdateIsTheCpusAdamW) {
  uint32_t seed = 80;
  for (int64_t n : {int64_t{1}, int64_t{5}, int64_t{11}, int64_t{1027}}) {
    for (int64_t threads : {int64_t{1}, int64_t{3}, int64_t{300}}) {
      expect_fused_body_matches_cpu<float, true>(n, threads, seed++);
      expect_fused_body_matches_cpu<HostBf16, true>(n, threads, seed++);
    }
  }
}

}  // namespace
}  // namespace thpc::cpu_test

namespace thpc::test {
namespace {

TEST(CudaAdam, UpdateMatchesCpu) {
  THPC_REQUIRE_GPU();
  std::mt19937 rng(7);
  Twins twins(DType::F32);  // Adam works on the fp32 master weights in both precisions
  const float lr = 1e-3f, beta1 = 0.9f, beta2 = 0.98f, eps = 1e-9f;
  // Exact by construction; 2 ulp of slack.
  const double rel = 2.0 * eps_of(DType::F32);
  for (int64_t n : {int64_t{1}, int64_t{1027}, int64_t{1000003}}) {
    for (int64_t first_step : {int64_t{1}, int64_t{1000}}) {
      SCOPED_TRACE(describe(DType::F32, n) + " step " + std::to_string(first_step));
      const size_t count = static_cast<size_t>(n);
      Both both(twins);
      Pair params = both.param(random_values(count, rng));
      Pair m = both.param(random_values(count, rng, -0.01f, 0.01f));
      std::vector<float> v_host = random_values(count, rng, 1e-3f, 1e-2f);
      Pair v = both.param(v_host);
      // Three consecutive steps, each reading the state the previous one left.
      for (int64_t step = first_step; step < first_step + 3; ++step) {
        Pair grads = both.param(random_values(count, rng, -0.1f, 0.1f));
        both.cpu().adam_update(params.cpu, Tensor{}, grads.cpu, m.cpu, v.cpu, n, lr, beta1, beta2,
                               eps, step);
        both.gpu().adam_update(params.gpu, Tensor{}, grads.gpu, m.gpu, v.gpu, n, lr, beta1, beta2,
                               eps, step);
      }
      EXPECT_TRUE(all_close(both.gpu_values(m), both.cpu_values(m), 0.0, rel));
      EXPECT_TRUE(all_close(both.gpu_values(v), both.cpu_values(v), 0.0, rel));
      EXPECT_TRUE(all_close(both.gpu_values(params), both.cpu_values(params), 0.0, rel));
    }
  }
  Both both(twins);
  Pair p = both.param({1.0f});
  EXPECT_ANY_THROW(
      both.gpu().adam_update(p.gpu, Tensor{}, p.gpu, p.gpu, p.gpu, 1, lr, beta1, beta2, eps, 0));
}

// `t` without its first element: a view whose data is 4 bytes (a float) or 2 (bf16) past
// an allocation's start, so that no 16-byte move may take it.
Tensor shifted(Tensor t) {
  t.data = static_cast<char*>(t.data) + dtype_size(t.dtype);
  t.numel -= 1;
  return t;
}

struct AdamRun {
  std::vector<float> params, m, v, compute;
};

// Three Adam steps on n parameters with a compute copy, on the GPU of `twins` (and its
// CPU reference, checked: masters and moments as the CPU's within 2 ulp, exact by
// construction; the copy the GPU's masters in the compute dtype, exactly), on fresh
// buffers or, with `misaligned`, on views one element into them holding the same values
// (the same seed: the same run, on addresses the one-pass kernel leaves alone). With a
// `decay`, AdamW's steps (adamw_update; the candidate weight_decay).
AdamRun adam_with_compute(Twins& twins, int64_t n, bool misaligned, uint32_t seed,
                          float decay = 0.0f) {
  std::mt19937 rng(seed);
  const float lr = 1e-3f, beta1 = 0.9f, beta2 = 0.98f, eps = 1e-9f;
  const double rel = 2.0 * eps_of(DType::F32);
  const size_t count = static_cast<size_t>(n);
  Both both(twins);
  // The values where the update reads them: misaligned, one element (never read) before.
  const auto place = [&](std::vector<float> values) {
    if (!misaligned) return both.param(values);
    values.insert(values.begin(), 0.5f);
    const Pair pair = both.param(values);
    return Pair{shifted(pair.cpu), shifted(pair.gpu)};
  };
  Pair params = place(random_values(count, rng));
  Pair m = place(random_values(count, rng, -0.01f, 0.01f));
  Pair v = place(random_values(count, rng, 1e-3f, 1e-2f));
  Pair compute = both.act_poisoned(static_cast<int64_t>(count + (misaligned ? 1 : 0)));
  if (misaligned) compute = Pair{shifted(compute.cpu), shifted(compute.gpu)};
  for (int64_t step = 1; step <= 3; ++step) {
    Pair grads = place(random_values(count, rng, -0.1f, 0.1f));
    if (decay > 0.0f) {
      both.cpu().adamw_update(params.cpu, compute.cpu, grads.cpu, m.cpu, v.cpu, n, lr, beta1,
                              beta2, eps, decay, step);
      both.gpu().adamw_update(params.gpu, compute.gpu, grads.gpu, m.gpu, v.gpu, n, lr, beta1,
                              beta2, eps, decay, step);
      continue;
    }
    both.cpu().adam_update(params.cpu, compute.cpu, grads.cpu, m.cpu, v.cpu, n, lr, beta1,
                           beta2, eps, step);
    both.gpu().adam_update(params.gpu, compute.gpu, grads.gpu, m.gpu, v.gpu, n, lr, beta1,
                           beta2, eps, step);
  }
  AdamRun gpu{both.gpu_values(params), both.gpu_values(m), both.gpu_values(v),
              both.gpu_values(compute)};
  EXPECT_TRUE(all_close(gpu.m, both.cpu_values(m), 0.0, rel));
  EXPECT_TRUE(all_close(gpu.v, both.cpu_values(v), 0.0, rel));
  EXPECT_TRUE(all_close(gpu.params, both.cpu_values(params), 0.0, rel));
  EXPECT_EQ(gpu.compute, representable(gpu.params, twins.compute))
      << "the compute copy is not the masters converted";
  return gpu;
}

// Adam with the compute copy in fp32 and bf16, on aligned buffers (the one-pass kernel)
// and on views one element in (Adam's scalar kernel, then the conversion copy() does):
// the bf16 GPU's optimizer step as the trainer takes it.
TEST(CudaAdam, ComputeCopyIsTheUpdatedParametersConverted) {
  THPC_REQUIRE_GPU();
  uint32_t seed = 70;
  for (DType dtype : gpu_compute_dtypes()) {
    Twins twins(dtype);
    for (int64_t n : {int64_t{1}, int64_t{1027}, int64_t{1000003}}) {
      for (bool misaligned : {false, true}) {
        SCOPED_TRACE(describe(dtype, n) + (misaligned ? " misaligned" : ""));
        adam_with_compute(twins, n, misaligned, seed++);
      }
    }
  }
}

// The one-pass kernel (kernels/cuda/fused_adam.cuh; the candidate fused_adam until its
// twins passed on an H200 on 2026-11-29): Adam and the compute copy in one pass of
// 16-byte moves, bit for bit the two-kernel path's (the same arithmetic and conversion),
// in fp32 and bf16, sizes with and without a tail of 1-3 elements: the same values on
// aligned buffers (one launch an update, counted: a fused pass that never ran proves
// nothing) and on views one element off (left to the two kernels: no launch of its own).
// FusedAdamOnTheHost.* runs its body on the CPU in ctest.
TEST(CudaAdam, FusedPassEqualsTheSeparateKernelsBitForBit) {
  THPC_REQUIRE_GPU();
  uint32_t seed = 90;
  for (DType dtype : gpu_compute_dtypes()) {
    Twins twins(dtype);
    for (int64_t n : {int64_t{1}, int64_t{4}, int64_t{1027}, int64_t{1000003}, int64_t{1000004}}) {
      SCOPED_TRACE(describe(dtype, n));
      int64_t before = fused_adam_launches();
      const AdamRun separate = adam_with_compute(twins, n, true, seed);
      if (!twin_rehearsal()) {
        EXPECT_EQ(fused_adam_launches() - before, 0);
      }
      before = fused_adam_launches();
      const AdamRun fused = adam_with_compute(twins, n, false, seed++);
      if (!twin_rehearsal()) {
        EXPECT_EQ(fused_adam_launches() - before, 3);
      }
      EXPECT_EQ(fused.params, separate.params);
      EXPECT_EQ(fused.m, separate.m);
      EXPECT_EQ(fused.v, separate.v);
      EXPECT_EQ(fused.compute, separate.compute);
    }
  }
}

// The candidate weight_decay (not yet run on a GPU): adamw_update is the CPU's bit for bit
// (the CPU's operations in its order, as adam_update's twin), three steps over sizes
// that leave tails, through the fused pass with a bf16 compute copy and through the
// scalar kernel (views one float into the buffers), at a decay below half a float step
// and a large one; without the candidate the GPU refuses it, naming the setting.
TEST(CudaCandidateWeightDecay, AdamWIsTheCpusBitForBit) {
  THPC_REQUIRE_GPU();
  std::mt19937 rng(8);
  Twins twins(DType::F32, kernels_with(kWeightDecay));
  for (int64_t n : {int64_t{5}, int64_t{1027}, int64_t{1000003}}) {
    for (float decay : {1e-8f, 0.01f}) {
      for (bool views : {false, true}) {
        SCOPED_TRACE(describe(DType::F32, n) + " decay " + std::to_string(decay) +
                     (views ? " (views)" : ""));
        const size_t count = static_cast<size_t>(n);
        Both both(twins);
        Pair params = both.param(random_values(count, rng));
        Pair m = both.param(random_values(count, rng, -0.01f, 0.01f));
        Pair v = both.param(random_values(count, rng, 1e-3f, 1e-2f));
        const auto view = [&](Tensor t) { return views ? shifted(t) : t; };
        const int64_t length = views ? n - 1 : n;
        for (int64_t step = 1; step <= 3; ++step) {
          Pair grads = both.param(random_values(count, rng, -0.1f, 0.1f));
          both.cpu().adamw_update(view(params.cpu), Tensor{}, view(grads.cpu), view(m.cpu),
                                  view(v.cpu), length, 1e-3f, 0.9f, 0.98f, 1e-9f, decay, step);
          both.gpu().adamw_update(view(params.gpu), Tensor{}, view(grads.gpu), view(m.gpu),
                                  view(v.gpu), length, 1e-3f, 0.9f, 0.98f, 1e-9f, decay, step);
        }
        EXPECT_EQ(both.gpu_values(params), both.cpu_values(params));
        EXPECT_EQ(both.gpu_values(m), both.cpu_values(m));
        EXPECT_EQ(both.gpu_values(v), both.cpu_values(v));
      }
    }
  }
  // With the compute copy, in fp32 and bf16, the training step's call: the fused pass
  // (aligned) and the scalar kernel then the conversion (views one element in) give the
  // same masters, moments and copy, bit for bit, the CPU's within adam_with_compute's
  // bounds, the copy the masters converted (before, the twin passed no compute copy).
  uint32_t seed = 110;
  for (DType dtype : gpu_compute_dtypes()) {
    Twins with_copy(dtype, kernels_with(kWeightDecay));
    for (int64_t n : {int64_t{1}, int64_t{1027}, int64_t{1000003}}) {
      SCOPED_TRACE(describe(dtype, n) + " with the compute copy");
      const int64_t before = fused_adam_launches();
      const AdamRun separate = adam_with_compute(with_copy, n, true, seed, 0.01f);
      const AdamRun fused = adam_with_compute(with_copy, n, false, seed++, 0.01f);
      if (!twin_rehearsal()) {
        EXPECT_EQ(fused_adam_launches() - before, 3) << "AdamW's fused pass did not run";
      }
      EXPECT_EQ(fused.params, separate.params);
      EXPECT_EQ(fused.m, separate.m);
      EXPECT_EQ(fused.v, separate.v);
      EXPECT_EQ(fused.compute, separate.compute);
    }
  }
  if (!twin_rehearsal()) {
    Twins verified(DType::F32);
    Both both(verified);
    Pair one = both.param({1.0f});
    expect_error(
        [&] {
          both.gpu().adamw_update(one.gpu, Tensor{}, one.gpu, one.gpu, one.gpu, 1, 1e-3f, 0.9f,
                                  0.98f, 1e-9f, 0.5f, 1);
        },
        {"adamw_update", "weight_decay", "train.cuda_kernels"});
  }
}

}  // namespace
}  // namespace thpc::test
