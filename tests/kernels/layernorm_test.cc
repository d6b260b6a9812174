// Layer norm (kernels/cpu/layernorm.cc, kernels/cuda/layernorm.cu): the CPU reference
// against its definition and central finite differences (cpu_reference.h), then the
// CUDA twins.
// The CUDA twins run the op on the GPU and on the CPU reference backend (tests/cuda_twin.h)
// in fp32 and bf16; without a GPU (or in a CPU-only build) they report SKIPPED.
//
// Twin tolerances, relative to the magnitude the result is made of (u_out is the
// rounding of the stored result: 0 for fp32 outputs, 2^-8 relative for bf16 ones):
// * Layer norm: the row statistics are fp32 sums over d (32 lanes of d/32 sequential
//   terms, then a 5-level tree) vs double on the CPU: bounded by (d/32 + 8) * 2^-23
//   relative to the sum of magnitudes; y, dx get that times a small constant for the
//   normalised values (|xhat| < 4 here, rstd < 2) plus u_out relative; dgamma, dbeta are
//   sums over rows in fp32 (chunks of 64 rows in order): (rows + 8) * 2^-23 relative to
//   the sum of magnitudes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "cpu_reference.h"
#include "cuda_twin.h"
#include "kernels/cpu/cpu_ops.h"

namespace thpc::cpu_test {
namespace {

struct LayerNormProblem {
  static constexpr int kRows = 5, kDim = 9;
  static constexpr float kEps = 1e-5f;  // the op takes a float eps, as the Backend does
  Values x, gamma, beta, weights;
  explicit LayerNormProblem(std::mt19937& rng)
      : x(random_values(kRows * kDim, rng)),
        gamma(random_values(kDim, rng)),
        beta(random_values(kDim, rng)),
        weights(random_values(kRows * kDim, rng)) {
    for (int i = 0; i < kRows * kDim; ++i) x[i] += 0.5 * (i / kDim);  // non-zero row means
  }
  Values forward(Values* mean = nullptr, Values* rstd = nullptr) const {
    Values y(kRows * kDim);
    Values row_mean(kRows), row_rstd(kRows);
    cpu::layernorm_forward<double>(y.data(), row_mean.data(), row_rstd.data(), x.data(),
                                   gamma.data(), beta.data(), kRows, kDim, kEps);
    if (mean != nullptr) *mean = row_mean;
    if (rstd != nullptr) *rstd = row_rstd;
    return y;
  }
};

TEST(LayerNorm, ForwardNormalisesEachRow) {
  std::mt19937 rng(31);
  LayerNormProblem problem(rng);
  constexpr int kDim = LayerNormProblem::kDim;
  // With gamma = 1 and beta = 0 every row of y has mean 0 and biased variance
  // var / (var + eps) ~ 1.
  const Values gamma = problem.gamma, beta = problem.beta;
  std::fill(problem.gamma.begin(), problem.gamma.end(), 1.0);
  std::fill(problem.beta.begin(), problem.beta.end(), 0.0);
  Values mean, rstd;
  const Values normalized = problem.forward(&mean, &rstd);
  for (int r = 0; r < LayerNormProblem::kRows; ++r) {
    double row_mean = 0.0, row_var = 0.0, x_mean = 0.0, x_var = 0.0;
    for (int c = 0; c < kDim; ++c) row_mean += normalized[r * kDim + c] / kDim;
    for (int c = 0; c < kDim; ++c) x_mean += problem.x[r * kDim + c] / kDim;
    for (int c = 0; c < kDim; ++c) {
      row_var += std::pow(normalized[r * kDim + c] - row_mean, 2) / kDim;
      x_var += std::pow(problem.x[r * kDim + c] - x_mean, 2) / kDim;
    }
    EXPECT_NEAR(row_mean, 0.0, 1e-14) << r;
    EXPECT_NEAR(row_var, x_var / (x_var + LayerNormProblem::kEps), 1e-13) << r;
    EXPECT_NEAR(row_var, 1.0, 1e-3) << r;
    EXPECT_NEAR(mean[r], x_mean, 1e-15) << r;
    EXPECT_NEAR(rstd[r], 1.0 / std::sqrt(x_var + LayerNormProblem::kEps), 1e-12) << r;
  }
  // The affine part: y = xhat * gamma + beta.
  problem.gamma = gamma;
  problem.beta = beta;
  const Values y = problem.forward();
  for (int e = 0; e < LayerNormProblem::kRows * kDim; ++e) {
    EXPECT_NEAR(y[e], normalized[e] * gamma[e % kDim] + beta[e % kDim], 1e-14) << e;
  }
}

TEST(LayerNorm, BackwardMatchesFiniteDifferencesAndAccumulates) {
  std::mt19937 rng(32);
  LayerNormProblem problem(rng);
  Values mean, rstd;
  problem.forward(&mean, &rstd);
  const Values dx_before = random_values(problem.x.size(), rng);
  const Values dgamma_before = random_values(problem.gamma.size(), rng);
  const Values dbeta_before = random_values(problem.beta.size(), rng);
  Values dx = dx_before, dgamma = dgamma_before, dbeta = dbeta_before;
  cpu::layernorm_backward<double>(dx.data(), dgamma.data(), dbeta.data(),
                                  problem.weights.data(), problem.x.data(), mean.data(),
                                  rstd.data(), problem.gamma.data(), LayerNormProblem::kRows,
                                  LayerNormProblem::kDim);
  const auto objective = [&] { return weighted_sum(problem.forward(), problem.weights); };
  expect_gradient_matches("dx", problem.x, difference(dx, dx_before), objective);
  expect_gradient_matches("dgamma", problem.gamma, difference(dgamma, dgamma_before),
                          objective);
  expect_gradient_matches("dbeta", problem.beta, difference(dbeta, dbeta_before), objective);

  // Null outputs are skipped and do not change the others.
  Values dx_only = dx_before;
  cpu::layernorm_backward<double>(dx_only.data(), nullptr, nullptr, problem.weights.data(),
                                  problem.x.data(), mean.data(), rstd.data(),
                                  problem.gamma.data(), LayerNormProblem::kRows,
                                  LayerNormProblem::kDim);
  EXPECT_EQ(dx_only, dx);
}

}  // namespace
}  // namespace thpc::cpu_test

namespace thpc::test {
namespace {

struct NormShape {
  int rows, d;
};

// M = 1, odd widths, several 64-row chunks with a partial last one, wide rows.
const std::vector<NormShape> kNormShapes = {{1, 37},    {7, 61},    {129, 512}, {1000, 129},
                                            {200, 1024}, {33, 4096}, {3, 1}};

// Error factor of an fp32 sum of `terms` values as the kernels order it.
double sum_factor(int terms) { return (terms / 32 + 8) * kEps32; }

TEST(CudaLayerNorm, ForwardMatchesCpu) {
  THPC_REQUIRE_GPU();
  uint32_t seed = 800;
  for (DType dtype : gpu_compute_dtypes()) {
    for (const NormShape& s : kNormShapes) {
      SCOPED_TRACE(::testing::Message() << dtype_name(dtype) << " rows=" << s.rows
                                        << " d=" << s.d);
      std::mt19937 rng(seed++);
      const size_t n = static_cast<size_t>(s.rows) * s.d;
      const auto x = representable(random_values(n, rng), dtype);
      const auto gamma = representable(random_values(static_cast<size_t>(s.d), rng), dtype);
      const auto beta = representable(random_values(static_cast<size_t>(s.d), rng), dtype);
      const float eps = 1e-6f;
      Twins twins(dtype);
      Scope cpu(*twins.cpu), gpu(*twins.gpu);
      Tensor y_cpu = cpu.alloc(DType::F32, static_cast<int64_t>(n));
      Tensor mean_cpu = cpu.alloc(DType::F32, s.rows), rstd_cpu = cpu.alloc(DType::F32, s.rows);
      Tensor y_gpu = gpu.alloc(dtype, static_cast<int64_t>(n));
      Tensor mean_gpu = gpu.alloc(DType::F32, s.rows), rstd_gpu = gpu.alloc(DType::F32, s.rows);
      twins.cpu->layernorm_forward(y_cpu, mean_cpu, rstd_cpu, cpu.put(DType::F32, x),
                                   cpu.put(DType::F32, gamma), cpu.put(DType::F32, beta),
                                   s.rows, s.d, eps);
      twins.gpu->layernorm_forward(y_gpu, mean_gpu, rstd_gpu, gpu.put(dtype, x),
                                   gpu.put(dtype, gamma), gpu.put(dtype, beta), s.rows, s.d,
                                   eps);
      // mean: |x| <= 1, so the sum's error is sum_factor * d and the mean's sum_factor.
      EXPECT_TRUE(all_close(gpu.get(mean_gpu), cpu.get(mean_cpu), sum_factor(s.d), 0.0))
          << "mean";
      // rstd: var's relative error a few sum_factors (the mean's error enters squared).
      const double rstd_rel = 4 * sum_factor(s.d);
      EXPECT_TRUE(all_close(gpu.get(rstd_gpu), cpu.get(rstd_cpu), 0.0, rstd_rel)) << "rstd";
      // y = xhat * gamma + beta, |xhat| < 4 (uniform rows; sqrt(3) at most for d > 1,
      // except d = 1 where xhat = 0), |gamma|, |beta| <= 1: absolute error from the
      // statistics plus the output rounding relative to y.
      EXPECT_TRUE(all_close(gpu.get(y_gpu), cpu.get(y_cpu), 16 * sum_factor(s.d),
                            output_rounding(dtype) + 4 * kEps32))
          << "y";
    }
  }
}

void check_layernorm_backward(DType dtype, const NormShape& s, bool want_dx, bool want_dgamma,
                              bool want_dbeta, uint32_t seed) {
  SCOPED_TRACE(::testing::Message() << dtype_name(dtype) << " rows=" << s.rows << " d=" << s.d
                                    << " dx=" << want_dx << " dgamma=" << want_dgamma
                                    << " dbeta=" << want_dbeta);
  std::mt19937 rng(seed);
  const size_t n = static_cast<size_t>(s.rows) * s.d;
  const auto x = representable(random_values(n, rng), dtype);
  const auto gamma = representable(random_values(static_cast<size_t>(s.d), rng), dtype);
  const auto beta = representable(random_values(static_cast<size_t>(s.d), rng), dtype);
  const auto dy = representable(random_values(n, rng), dtype);
  const auto dx0 = representable(random_values(n, rng), dtype);
  const auto dgamma0 = random_values(static_cast<size_t>(s.d), rng);
  const auto dbeta0 = random_values(static_cast<size_t>(s.d), rng);
  Twins twins(dtype);
  Scope cpu(*twins.cpu), gpu(*twins.gpu);
  // Statistics from the CPU forward, given to both backward passes (fp32 on both).
  Tensor y_cpu = cpu.alloc(DType::F32, static_cast<int64_t>(n));
  Tensor mean_cpu = cpu.alloc(DType::F32, s.rows), rstd_cpu = cpu.alloc(DType::F32, s.rows);
  const Tensor x_cpu = cpu.put(DType::F32, x), gamma_cpu = cpu.put(DType::F32, gamma);
  twins.cpu->layernorm_forward(y_cpu, mean_cpu, rstd_cpu, x_cpu, gamma_cpu,
                               cpu.put(DType::F32, beta), s.rows, s.d, 1e-6f);
  const std::vector<float> mean = cpu.get(mean_cpu), rstd = cpu.get(rstd_cpu);
  Tensor dx_cpu = want_dx ? cpu.put(DType::F32, dx0) : Tensor{};
  Tensor dgamma_cpu = want_dgamma ? cpu.put(DType::F32, dgamma0) : Tensor{};
  Tensor dbeta_cpu = want_dbeta ? cpu.put(DType::F32, dbeta0) : Tensor{};
  Tensor dx_gpu = want_dx ? gpu.put(dtype, dx0) : Tensor{};
  Tensor dgamma_gpu = want_dgamma ? gpu.put(DType::F32, dgamma0) : Tensor{};
  Tensor dbeta_gpu = want_dbeta ? gpu.put(DType::F32, dbeta0) : Tensor{};
  twins.cpu->layernorm_backward(dx_cpu, dgamma_cpu, dbeta_cpu, cpu.put(DType::F32, dy), x_cpu,
                                mean_cpu, rstd_cpu, gamma_cpu, s.rows, s.d);
  twins.gpu->layernorm_backward(dx_gpu, dgamma_gpu, dbeta_gpu, gpu.put(dtype, dy),
                                gpu.put(dtype, x), gpu.put(DType::F32, mean),
                                gpu.put(DType::F32, rstd), gpu.put(dtype, gamma), s.rows, s.d);
  if (want_dx) {
    // rstd * (g - mean(g) - xhat mean(g xhat)) with |g| <= 1, |xhat| < 4, rstd < 2: the two
    // row means carry sum_factor(d) * 4 each; plus the rounding of the stored dx.
    EXPECT_TRUE(all_close(gpu.get(dx_gpu), cpu.get(dx_cpu), 64 * sum_factor(s.d),
                          output_rounding(dtype) + 8 * kEps32))
        << "dx";
  }
  // Column sums over rows: relative to the sum of magnitudes (plus the prefill's).
  std::vector<double> gamma_scale(static_cast<size_t>(s.d)), beta_scale(static_cast<size_t>(s.d));
  for (int col = 0; col < s.d; ++col) {
    gamma_scale[col] = std::abs(dgamma0[col]);
    beta_scale[col] = std::abs(dbeta0[col]);
    for (int row = 0; row < s.rows; ++row) {
      const size_t i = static_cast<size_t>(row) * s.d + col;
      const double xhat = (static_cast<double>(x[i]) - mean[row]) * rstd[row];
      gamma_scale[col] += std::abs(dy[i] * xhat);
      beta_scale[col] += std::abs(dy[i]);
    }
  }
  // xhat itself differs by a few eps (fp32 vs double), hence + 8.
  const double column_factor = (s.rows + 8) * kEps32;
  if (want_dgamma) {
    EXPECT_TRUE(within_scaled(gpu.get(dgamma_gpu), cpu.get(dgamma_cpu), gamma_scale,
                              column_factor))
        << "dgamma";
  }
  if (want_dbeta) {
    EXPECT_TRUE(within_scaled(gpu.get(dbeta_gpu), cpu.get(dbeta_cpu), beta_scale,
                              column_factor))
        << "dbeta";
  }
}

TEST(CudaLayerNorm, BackwardMatchesCpu) {
  THPC_REQUIRE_GPU();
  uint32_t seed = 900;
  for (DType dtype : gpu_compute_dtypes()) {
    for (const NormShape& s : kNormShapes) {
      check_layernorm_backward(dtype, s, true, true, true, seed++);
    }
  }
}

TEST(CudaLayerNorm, BackwardWithNullOutputsMatchesCpu) {
  THPC_REQUIRE_GPU();
  uint32_t seed = 1000;
  for (DType dtype : gpu_compute_dtypes()) {
    check_layernorm_backward(dtype, {130, 61}, true, false, false, seed++);
    check_layernorm_backward(dtype, {130, 61}, false, true, false, seed++);
    check_layernorm_backward(dtype, {130, 61}, false, false, true, seed++);
    check_layernorm_backward(dtype, {130, 61}, false, false, false, seed++);
  }
}

// Two identical backward calls from the same pre-filled gradients: bit-identical.
TEST(CudaLayerNorm, BackwardIsDeterministic) {
  THPC_REQUIRE_GPU();
  for (DType dtype : gpu_compute_dtypes()) {
    SCOPED_TRACE(dtype_name(dtype));
    const int rows = 3000, d = 1024;
    const size_t n = static_cast<size_t>(rows) * d;
    std::mt19937 rng(1100);
    const auto x = random_values(n, rng), dy = random_values(n, rng), dx0 = random_values(n, rng);
    const auto gamma = random_values(d, rng), beta = random_values(d, rng);
    const auto dgamma0 = random_values(d, rng), dbeta0 = random_values(d, rng);
    Twins twins(dtype);
    Scope gpu(*twins.gpu);
    const Tensor x_t = gpu.put(dtype, x), dy_t = gpu.put(dtype, dy),
                 gamma_t = gpu.put(dtype, gamma);
    Tensor y = gpu.alloc(dtype, static_cast<int64_t>(n));
    Tensor mean = gpu.alloc(DType::F32, rows), rstd = gpu.alloc(DType::F32, rows);
    twins.gpu->layernorm_forward(y, mean, rstd, x_t, gamma_t, gpu.put(dtype, beta), rows, d,
                                 1e-6f);
    std::vector<float> first[3];
    for (int run = 0; run < 2; ++run) {
      Tensor dx = gpu.put(dtype, dx0), dgamma = gpu.put(DType::F32, dgamma0),
             dbeta = gpu.put(DType::F32, dbeta0);
      twins.gpu->layernorm_backward(dx, dgamma, dbeta, dy_t, x_t, mean, rstd, gamma_t, rows, d);
      const std::vector<float> got[3] = {gpu.get(dx), gpu.get(dgamma), gpu.get(dbeta)};
      for (int i = 0; i < 3; ++i) {
        if (run == 0) first[i] = got[i];
        else EXPECT_TRUE(got[i] == first[i]) << "output " << i << " differs between runs";
      }
    }
  }
}

}  // namespace
}  // namespace thpc::test
