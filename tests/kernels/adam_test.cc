// Adam (kernels/cpu/adam.cc, kernels/cuda/adam.cu): the CPU reference against two steps
// computed by hand, then the CUDA twin (exact by construction: the GPU performs the
// CPU's fp32 operations in its order; 2 ulp of slack).
// The CUDA twins run the op on the GPU and on the CPU reference backend (tests/cuda_twin.h)
// in fp32 and bf16; without a GPU (or in a CPU-only build) they report SKIPPED.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "cpu_reference.h"
#include "cuda_twin.h"
#include "kernels/cpu/cpu_ops.h"

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
  cpu::adam_update<T>(params.data(), g1.data(), m.data(), v.data(), 3, lr, beta1, beta2, eps,
                      1);
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
  cpu::adam_update<T>(params.data(), g2.data(), m.data(), v.data(), 3, lr, beta1, beta2, eps,
                      2);
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
        both.cpu().adam_update(params.cpu, grads.cpu, m.cpu, v.cpu, n, lr, beta1, beta2, eps, step);
        both.gpu().adam_update(params.gpu, grads.gpu, m.gpu, v.gpu, n, lr, beta1, beta2, eps, step);
      }
      EXPECT_TRUE(all_close(both.gpu_values(m), both.cpu_values(m), 0.0, rel));
      EXPECT_TRUE(all_close(both.gpu_values(v), both.cpu_values(v), 0.0, rel));
      EXPECT_TRUE(all_close(both.gpu_values(params), both.cpu_values(params), 0.0, rel));
    }
  }
  Both both(twins);
  Pair p = both.param({1.0f});
  EXPECT_ANY_THROW(both.gpu().adam_update(p.gpu, p.gpu, p.gpu, p.gpu, 1, lr, beta1, beta2, eps, 0));
}

}  // namespace
}  // namespace thpc::test
