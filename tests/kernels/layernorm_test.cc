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
// * The fused residual + dropout + layer norm (add_dropout_layernorm_*): the same bounds,
//   argued beside CudaAddNorm below; and on the GPU the unfused kernels' bits exactly.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <type_traits>
#include <utility>
#include <vector>

#include "common/bf16.h"
#include "common/philox.h"
#include "cpu_reference.h"
#include "cuda_twin.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cuda/vector_norm.cuh"
#include "threaded_blocks.h"

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

TEST(LayerNorm, ForwardNormalizesEachRow) {
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
                                  LayerNormProblem::kDim, GradStore::kAdd);
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
                                  LayerNormProblem::kDim, GradStore::kAdd);
  EXPECT_EQ(dx_only, dx);
}

// ---- residual + dropout + layer norm fused (add_dropout_layernorm_*) -------------------

// A sublayer's inputs: x (the residual stream), sub (the sublayer's output), the norm's
// gamma and beta, random; x's rows shifted so that their means differ.
template <typename T>
struct AddNormInputs {
  int rows, d;
  std::vector<T> x, sub, gamma, beta;
  AddNormInputs(int rows_, int d_, std::mt19937& rng)
      : rows(rows_), d(d_), x(cast_to<T>(random_values(size_t(rows_) * d_, rng))),
        sub(cast_to<T>(random_values(size_t(rows_) * d_, rng))),
        gamma(cast_to<T>(random_values(size_t(d_), rng))),
        beta(cast_to<T>(random_values(size_t(d_), rng))) {
    for (size_t i = 0; i < x.size(); ++i) x[i] += T(0.25) * T(int(i / d) % 5);
  }
  size_t count() const { return size_t(rows) * d; }
};

constexpr float kEps = 1e-5f;

// What the fused forward writes, and what the two unfused ops write.
template <typename T>
struct AddNormOutputs {
  std::vector<T> y, residual, mean, rstd;
  explicit AddNormOutputs(const AddNormInputs<T>& in)
      : y(in.count(), T(99)), residual(in.count(), T(99)), mean(in.rows, T(99)),
        rstd(in.rows, T(99)) {}
};

template <typename T>
AddNormOutputs<T> fused_forward(const AddNormInputs<T>& in, float p) {
  AddNormOutputs<T> out(in);
  cpu::add_dropout_layernorm_forward<T>(out.y.data(), out.residual.data(), out.mean.data(),
                                        out.rstd.data(), in.x.data(), in.sub.data(),
                                        in.gamma.data(), in.beta.data(), in.rows, in.d, kEps, p,
                                        kDropoutKey);
  return out;
}

template <typename T>
AddNormOutputs<T> unfused_forward(const AddNormInputs<T>& in, float p) {
  AddNormOutputs<T> out(in);
  cpu::residual_dropout_forward<T>(out.residual.data(), in.x.data(), in.sub.data(),
                                   int64_t(in.count()), p, kDropoutKey);
  cpu::layernorm_forward<T>(out.y.data(), out.mean.data(), out.rstd.data(), out.residual.data(),
                            in.gamma.data(), in.beta.data(), in.rows, in.d, kEps);
  return out;
}

// Odd widths (rows then straddle Philox's groups of four elements), and sizes that the
// CPU ops spread over their threads (rows * d >= 2^15).
const std::vector<std::pair<int, int>> kAddNormShapes = {{5, 9}, {1, 3}, {37, 1027}, {64, 512}};

template <typename T>
void expect_fused_forward_is_unfused(uint32_t seed) {
  for (const auto& [rows, d] : kAddNormShapes) {
    for (float p : {0.0f, 0.1f, 0.5f}) {
      SCOPED_TRACE(::testing::Message() << "rows=" << rows << " d=" << d << " p=" << p << " "
                                        << sizeof(T) * 8 << "-bit");
      std::mt19937 rng(seed++);
      const AddNormInputs<T> in(rows, d, rng);
      const AddNormOutputs<T> fused = fused_forward(in, p), unfused = unfused_forward(in, p);
      EXPECT_TRUE(same_bits(fused.residual, unfused.residual)) << "residual";
      EXPECT_TRUE(same_bits(fused.y, unfused.y)) << "y";
      EXPECT_TRUE(same_bits(fused.mean, unfused.mean)) << "mean";
      EXPECT_TRUE(same_bits(fused.rstd, unfused.rstd)) << "rstd";
    }
  }
}

TEST(AddNorm, FusedForwardIsTheUnfusedOpsBitForBit) {
  expect_fused_forward_is_unfused<float>(3000);
  expect_fused_forward_is_unfused<double>(3100);
}

// Backward from pre-filled gradients: the fused op against layernorm_backward into a
// zeroed buffer (as the model's add & norm did it) and residual_dropout_backward of that
// buffer; every combination of null outputs.
template <typename T>
void expect_fused_backward_is_unfused(uint32_t seed) {
  for (const auto& [rows, d] : kAddNormShapes) {
    for (float p : {0.0f, 0.1f, 0.5f}) {
      for (int wanted = 0; wanted < 16; ++wanted) {
        if (d < 100 || wanted == 15 || wanted == 0) {  // all masks on the small shapes
          SCOPED_TRACE(::testing::Message() << "rows=" << rows << " d=" << d << " p=" << p
                                            << " outputs " << wanted << " " << sizeof(T) * 8
                                            << "-bit");
          std::mt19937 rng(seed++);
          const AddNormInputs<T> in(rows, d, rng);
          const AddNormOutputs<T> forward = fused_forward(in, p);
          const auto dy = cast_to<T>(random_values(in.count(), rng));
          const auto dx0 = cast_to<T>(random_values(in.count(), rng));
          const auto d_sub0 = cast_to<T>(random_values(in.count(), rng));
          const auto dgamma0 = cast_to<T>(random_values(size_t(d), rng));
          const auto dbeta0 = cast_to<T>(random_values(size_t(d), rng));
          std::vector<T> dx[2] = {dx0, dx0}, d_sub[2] = {d_sub0, d_sub0};
          std::vector<T> dgamma[2] = {dgamma0, dgamma0}, dbeta[2] = {dbeta0, dbeta0};
          const auto out = [&](std::vector<T>* outputs, int bit, int which) {
            return (wanted >> bit) & 1 ? outputs[which].data() : nullptr;
          };
          cpu::add_dropout_layernorm_backward<T>(
              out(dx, 0, 0), out(d_sub, 1, 0), out(dgamma, 2, 0), out(dbeta, 3, 0), dy.data(),
              forward.residual.data(), forward.mean.data(), forward.rstd.data(),
              in.gamma.data(), rows, d, p, kDropoutKey, GradStore::kAdd);
          std::vector<T> d_residual(in.count(), T(0));
          cpu::layernorm_backward<T>(d_residual.data(), out(dgamma, 2, 1), out(dbeta, 3, 1),
                                     dy.data(), forward.residual.data(), forward.mean.data(),
                                     forward.rstd.data(), in.gamma.data(), rows, d,
                                                       GradStore::kAdd);
          cpu::residual_dropout_backward<T>(out(dx, 0, 1), out(d_sub, 1, 1), d_residual.data(),
                                            int64_t(in.count()), p, kDropoutKey, GradStore::kAdd);
          EXPECT_TRUE(same_bits(dx[0], dx[1])) << "dx";
          EXPECT_TRUE(same_bits(d_sub[0], d_sub[1])) << "d_sub";
          EXPECT_TRUE(same_bits(dgamma[0], dgamma[1])) << "dgamma";
          EXPECT_TRUE(same_bits(dbeta[0], dbeta[1])) << "dbeta";
        }
      }
    }
  }
}

TEST(AddNorm, FusedBackwardIsTheUnfusedOpsBitForBit) {
  expect_fused_backward_is_unfused<float>(3200);
  expect_fused_backward_is_unfused<double>(3400);
}

// LayerNorm(x + Dropout(sub)) differentiated by the fused backward against central
// differences of L = sum(y * R) in x, sub, gamma and beta, with p = 0.3 (the mask is a
// function of the key: fixed, so L is smooth); outputs pre-filled (the += rule).
TEST(AddNorm, FusedBackwardMatchesFiniteDifferencesAndAccumulates) {
  std::mt19937 rng(3600);
  AddNormInputs<double> in(5, 9, rng);
  const float p = 0.3f;
  const Values weights = random_values(in.count(), rng);
  const AddNormOutputs<double> forward = fused_forward(in, p);
  int dropped = 0;
  for (size_t i = 0; i < in.count(); ++i) dropped += forward.residual[i] == in.x[i];
  ASSERT_GT(dropped, 0) << "p = 0.3 must drop some of 45 elements";
  const Values dx0 = random_values(in.count(), rng), d_sub0 = random_values(in.count(), rng);
  const Values dgamma0 = random_values(size_t(in.d), rng), dbeta0 = random_values(size_t(in.d), rng);
  Values dx = dx0, d_sub = d_sub0, dgamma = dgamma0, dbeta = dbeta0;
  cpu::add_dropout_layernorm_backward<double>(dx.data(), d_sub.data(), dgamma.data(),
                                              dbeta.data(), weights.data(),
                                              forward.residual.data(), forward.mean.data(),
                                              forward.rstd.data(), in.gamma.data(), in.rows,
                                              in.d, p, kDropoutKey, GradStore::kAdd);
  const auto objective = [&] { return weighted_sum(fused_forward(in, p).y, weights); };
  expect_gradient_matches("dx", in.x, difference(dx, dx0), objective);
  expect_gradient_matches("d_sub", in.sub, difference(d_sub, d_sub0), objective);
  expect_gradient_matches("dgamma", in.gamma, difference(dgamma, dgamma0), objective);
  expect_gradient_matches("dbeta", in.beta, difference(dbeta, dbeta0), objective);
}

// The forward normalises rows four at a time, their sums interleaved (layernorm.cc):
// each row must get the bits it gets alone, in float and double, for row counts with and
// without a remainder, at a model's width; the fused add & norm too.
template <typename T>
void expect_row_groups_equal_single_rows(uint32_t seed) {
  std::mt19937 rng(seed);
  for (const int rows : {1, 3, 4, 7, 12}) {
    for (const int d : {9, 512}) {
      SCOPED_TRACE(::testing::Message() << rows << " rows of " << d);
      std::vector<T> x(static_cast<size_t>(rows) * d), gamma(d), beta(d);
      std::uniform_real_distribution<double> u(-2.0, 2.0);
      for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<T>(u(rng) + 0.3 * (i / d));
      for (T& g : gamma) g = static_cast<T>(u(rng));
      for (T& b : beta) b = static_cast<T>(u(rng));
      std::vector<T> y(x.size()), mean(rows), rstd(rows);
      cpu::layernorm_forward<T>(y.data(), mean.data(), rstd.data(), x.data(), gamma.data(),
                                beta.data(), rows, d, 1e-5f);
      for (int r = 0; r < rows; ++r) {
        std::vector<T> y_row(d), mean_row(1), rstd_row(1);
        cpu::layernorm_forward<T>(y_row.data(), mean_row.data(), rstd_row.data(),
                                  x.data() + static_cast<size_t>(r) * d, gamma.data(),
                                  beta.data(), 1, d, 1e-5f);
        ASSERT_EQ(mean[r], mean_row[0]) << "row " << r;
        ASSERT_EQ(rstd[r], rstd_row[0]) << "row " << r;
        ASSERT_TRUE(std::equal(y_row.begin(), y_row.end(), y.begin() + int64_t(r) * d))
            << "row " << r;
      }
    }
  }
}

TEST(LayerNorm, RowsNormalizedTogetherHaveTheBitsOfOneRowAlone) {
  expect_row_groups_equal_single_rows<float>(33);
  expect_row_groups_equal_single_rows<double>(34);
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

// The vectors a lane of the register-held kernels (vector_norm.cuh) holds for rows of d
// elements of `dtype`; 0 where they do not take such rows (a bf16 is 2 bytes).
int register_held_vectors(DType dtype, int d) {
  return dtype == DType::BF16 ? vector_norm::vectors_for<uint16_t>(d)
                              : vector_norm::vectors_for<float>(d);
}

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

// dgamma (gamma = true: the column sums of dy * xhat) or dbeta (of dy) from the GPU
// against the CPU's: sums over rows, relative to the sum of the terms' magnitudes plus
// the pre-filled value's; xhat itself differs by a few eps (fp32 vs double), hence + 8.
void expect_column_sums(const std::vector<float>& gpu, const std::vector<float>& cpu,
                        const std::vector<float>& prefill, const NormShape& s,
                        const std::vector<float>& x, const std::vector<float>& dy,
                        const std::vector<float>& mean, const std::vector<float>& rstd,
                        bool gamma) {
  std::vector<double> scale(static_cast<size_t>(s.d));
  for (int col = 0; col < s.d; ++col) {
    scale[col] = std::abs(prefill[col]);
    for (int row = 0; row < s.rows; ++row) {
      const size_t i = static_cast<size_t>(row) * s.d + col;
      const double xhat = (static_cast<double>(x[i]) - mean[row]) * rstd[row];
      scale[col] += std::abs(gamma ? dy[i] * xhat : static_cast<double>(dy[i]));
    }
  }
  EXPECT_TRUE(within_scaled(gpu, cpu, scale, (s.rows + 8) * kEps32))
      << (gamma ? "dgamma" : "dbeta");
}

void check_layernorm_backward(DType dtype, const NormShape& s, bool want_dx, bool want_dgamma,
                              bool want_dbeta, uint32_t seed, const StoreMode& mode = {},
                              const CudaKernelChoice& kernels = {}) {
  SCOPED_TRACE(::testing::Message() << dtype_name(dtype) << " rows=" << s.rows << " d=" << s.d
                                    << " dx=" << want_dx << " dgamma=" << want_dgamma
                                    << " dbeta=" << want_dbeta << " " << mode.name());
  std::mt19937 rng(seed);
  const size_t n = static_cast<size_t>(s.rows) * s.d;
  const auto x = representable(random_values(n, rng), dtype);
  const auto gamma = representable(random_values(static_cast<size_t>(s.d), rng), dtype);
  const auto beta = representable(random_values(static_cast<size_t>(s.d), rng), dtype);
  const auto dy = representable(random_values(n, rng), dtype);
  const auto dx0 = representable(random_values(n, rng), dtype);
  const auto dgamma0 = random_values(static_cast<size_t>(s.d), rng);
  const auto dbeta0 = random_values(static_cast<size_t>(s.d), rng);
  Twins twins(dtype, kernels);
  Scope cpu(*twins.cpu), gpu(*twins.gpu);
  // Statistics from the CPU forward, given to both backward passes (fp32 on both).
  Tensor y_cpu = cpu.alloc(DType::F32, static_cast<int64_t>(n));
  Tensor mean_cpu = cpu.alloc(DType::F32, s.rows), rstd_cpu = cpu.alloc(DType::F32, s.rows);
  const Tensor x_cpu = cpu.put(DType::F32, x), gamma_cpu = cpu.put(DType::F32, gamma);
  twins.cpu->layernorm_forward(y_cpu, mean_cpu, rstd_cpu, x_cpu, gamma_cpu,
                               cpu.put(DType::F32, beta), s.rows, s.d, 1e-6f);
  const std::vector<float> mean = cpu.get(mean_cpu), rstd = cpu.get(rstd_cpu);
  Tensor dx_cpu = want_dx ? cpu.put(DType::F32, mode.start(dx0)) : Tensor{};
  Tensor dgamma_cpu = want_dgamma ? cpu.put(DType::F32, dgamma0) : Tensor{};
  Tensor dbeta_cpu = want_dbeta ? cpu.put(DType::F32, dbeta0) : Tensor{};
  Tensor dx_gpu = want_dx ? gpu.put(dtype, mode.start(dx0)) : Tensor{};
  Tensor dgamma_gpu = want_dgamma ? gpu.put(DType::F32, dgamma0) : Tensor{};
  Tensor dbeta_gpu = want_dbeta ? gpu.put(DType::F32, dbeta0) : Tensor{};
  twins.cpu->layernorm_backward(dx_cpu, dgamma_cpu, dbeta_cpu, cpu.put(DType::F32, dy), x_cpu,
                                mean_cpu, rstd_cpu, gamma_cpu, s.rows, s.d, mode.store);
  twins.gpu->layernorm_backward(dx_gpu, dgamma_gpu, dbeta_gpu, gpu.put(dtype, dy),
                                gpu.put(dtype, x), gpu.put(DType::F32, mean),
                                gpu.put(DType::F32, rstd), gpu.put(dtype, gamma), s.rows, s.d,
                                mode.store);
  if (want_dx) {
    // rstd * (g - mean(g) - xhat mean(g xhat)) with |g| <= 1, |xhat| < 4, rstd < 2: the two
    // row means carry sum_factor(d) * 4 each; plus the rounding of the stored dx.
    EXPECT_TRUE(all_close(gpu.get(dx_gpu), cpu.get(dx_cpu), 64 * sum_factor(s.d),
                          output_rounding(dtype) + 8 * kEps32))
        << "dx";
  }
  if (want_dgamma) {
    expect_column_sums(gpu.get(dgamma_gpu), cpu.get(dgamma_cpu), dgamma0, s, x, dy, mean, rstd,
                       true);
  }
  if (want_dbeta) {
    expect_column_sums(gpu.get(dbeta_gpu), cpu.get(dbeta_cpu), dbeta0, s, x, dy, mean, rstd,
                       false);
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
void expect_layernorm_backward_deterministic(const CudaKernelChoice& kernels, int rows, int d,
                                             uint32_t seed) {
  for (DType dtype : gpu_compute_dtypes()) {
    SCOPED_TRACE(dtype_name(dtype));
    const size_t n = static_cast<size_t>(rows) * d;
    std::mt19937 rng(seed);
    const auto x = random_values(n, rng), dy = random_values(n, rng), dx0 = random_values(n, rng);
    const auto gamma = random_values(d, rng), beta = random_values(d, rng);
    const auto dgamma0 = random_values(d, rng), dbeta0 = random_values(d, rng);
    Twins twins(dtype, kernels);
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
      twins.gpu->layernorm_backward(dx, dgamma, dbeta, dy_t, x_t, mean, rstd, gamma_t, rows, d,
                                    GradStore::kAdd);
      const std::vector<float> got[3] = {gpu.get(dx), gpu.get(dgamma), gpu.get(dbeta)};
      for (int i = 0; i < 3; ++i) {
        if (run == 0) first[i] = got[i];
        else EXPECT_TRUE(got[i] == first[i]) << "output " << i << " differs between runs";
      }
    }
  }
}

TEST(CudaLayerNorm, BackwardIsDeterministic) {
  THPC_REQUIRE_GPU();
  expect_layernorm_backward_deterministic({}, 3000, 1024, 1100);
}

// ---- residual + dropout + layer norm fused ---------------------------------------------
const std::vector<float> kAddNormDropouts = {0.0f, 0.1f};

// The fused row-per-block kernels against the unfused ones on the same backend: the same
// bits (they share the norm's code and round where the unfused path stores), in fp32 and
// bf16. Rows the register-held kernels take (d = 512 and 1,024 here; their row sums in
// another order) are left to CudaVectorNorms.*, which hold them against the CPU. (In the
// rehearsal the CPU's fused ops against its unfused ones, as AddNorm.* above.)
TEST(CudaAddNorm, FusedIsTheUnfusedKernelsBitForBit) {
  THPC_REQUIRE_GPU();
  uint32_t seed = 1500;
  for (DType dtype : gpu_compute_dtypes()) {
    for (const NormShape& s : kNormShapes) {
      if (register_held_vectors(dtype, s.d) > 0 && !twin_rehearsal()) continue;
      for (float p : kAddNormDropouts) {
        SCOPED_TRACE(::testing::Message() << dtype_name(dtype) << " rows=" << s.rows
                                          << " d=" << s.d << " p=" << p);
        std::mt19937 rng(seed++);
        const int64_t n = int64_t(s.rows) * s.d;
        const DropoutKey key{0x77ull + seed, 5u, 9u, 0x10010u};
        Twins twins(dtype);
        Backend& gpu = *twins.gpu;
        Scope scope(gpu);
        const auto put = [&](size_t count) {
          return scope.put(dtype, random_values(count, rng));
        };
        const Tensor x = put(size_t(n)), sub = put(size_t(n)), gamma = put(size_t(s.d)),
                     beta = put(size_t(s.d)), dy = put(size_t(n));
        Tensor y[2], residual[2], mean[2], rstd[2];
        for (int i = 0; i < 2; ++i) {
          y[i] = scope.alloc(dtype, n);
          residual[i] = scope.alloc(dtype, n);
          mean[i] = scope.alloc(DType::F32, s.rows);
          rstd[i] = scope.alloc(DType::F32, s.rows);
        }
        gpu.add_dropout_layernorm_forward(y[0], residual[0], mean[0], rstd[0], x, sub, gamma,
                                          beta, s.rows, s.d, 1e-5f, p, key);
        gpu.residual_dropout_forward(residual[1], x, sub, n, p, key);
        gpu.layernorm_forward(y[1], mean[1], rstd[1], residual[1], gamma, beta, s.rows, s.d,
                              1e-5f);
        for (Tensor* t : {y, residual, mean, rstd}) {
          EXPECT_TRUE(same_bits(scope.get(t[0]), scope.get(t[1])));
        }
        const std::vector<float> dx0 = random_values(size_t(n), rng),
                                 d_sub0 = random_values(size_t(n), rng),
                                 dgamma0 = random_values(size_t(s.d), rng),
                                 dbeta0 = random_values(size_t(s.d), rng);
        Tensor dx[2], d_sub[2], dgamma[2], dbeta[2];
        for (int i = 0; i < 2; ++i) {
          dx[i] = scope.put(dtype, dx0);
          d_sub[i] = scope.put(dtype, d_sub0);
          dgamma[i] = scope.put(DType::F32, dgamma0);
          dbeta[i] = scope.put(DType::F32, dbeta0);
        }
        gpu.add_dropout_layernorm_backward(dx[0], d_sub[0], dgamma[0], dbeta[0], dy, residual[0],
                                           mean[0], rstd[0], gamma, s.rows, s.d, p, key,
                                           GradStore::kAdd);
        Tensor d_residual = scope.zeros(dtype, n);
        gpu.layernorm_backward(d_residual, dgamma[1], dbeta[1], dy, residual[0], mean[0],
                               rstd[0], gamma, s.rows, s.d, GradStore::kAdd);
        gpu.residual_dropout_backward(dx[1], d_sub[1], d_residual, n, p, key, GradStore::kAdd);
        for (Tensor* t : {dx, d_sub, dgamma, dbeta}) {
          EXPECT_TRUE(same_bits(scope.get(t[0]), scope.get(t[1])));
        }
      }
    }
  }
}

// Forward: the residual is the elementwise residual kernel's expression (fp32 with
// explicit roundings): bit-identical in fp32, one bf16 rounding in bf16 (rounding_rel),
// and a dropout mask that differs from the CPU's would move an element by |sub| ~ 0.5,
// far outside that. y, mean and rstd are then the norm of the residual the GPU stored,
// so they are checked against the CPU's layernorm_forward of that stored residual with
// the layer norm twin's bounds above (in bf16 the stored residual is rounded, which the
// CPU's own fused residual is not). Backward: dx = dx0 + g with g the norm's input
// gradient (the layer norm dx bound, plus in bf16 half an ulp of |g|: g is rounded to
// bf16 before it is added, as the unfused path's buffer holds it), d_sub = d_sub0 +
// g / (1 - p) where kept (that bound times 1 / (1 - p)); dgamma and dbeta as the layer
// norm's.

// The fused forward on the GPU against the CPU.
void check_add_norm_forward(DType dtype, const NormShape& s, float p, uint32_t seed) {
  SCOPED_TRACE(::testing::Message() << dtype_name(dtype) << " rows=" << s.rows << " d=" << s.d
                                    << " p=" << p);
  std::mt19937 rng(seed);
  const size_t n = static_cast<size_t>(s.rows) * s.d;
  const DropoutKey key{0x5eed5eed12345ull + seed + 1, 17u, 3u, 0x10020u};
  const float eps = 1e-6f;
  Twins twins(dtype);
  Both both(twins);
  const Pair x = both.act(random_values(n, rng)), sub = both.act(random_values(n, rng));
  const Pair gamma = both.act(random_values(static_cast<size_t>(s.d), rng));
  const Pair beta = both.act(random_values(static_cast<size_t>(s.d), rng));
  const Pair y = both.act_poisoned(int64_t(n)), residual = both.act_poisoned(int64_t(n));
  const Pair mean = both.param(std::vector<float>(s.rows, NAN));
  const Pair rstd = both.param(std::vector<float>(s.rows, NAN));
  both.cpu().add_dropout_layernorm_forward(y.cpu, residual.cpu, mean.cpu, rstd.cpu, x.cpu,
                                           sub.cpu, gamma.cpu, beta.cpu, s.rows, s.d, eps,
                                           p, key);
  both.gpu().add_dropout_layernorm_forward(y.gpu, residual.gpu, mean.gpu, rstd.gpu, x.gpu,
                                           sub.gpu, gamma.gpu, beta.gpu, s.rows, s.d, eps,
                                           p, key);
  const std::vector<float> gpu_residual = both.gpu_values(residual);
  EXPECT_TRUE(all_close(gpu_residual, both.cpu_values(residual), 0.0, rounding_rel(dtype)))
      << "residual";
  // The norm of what the GPU stored, on the CPU.
  Scope reference(both.cpu());
  Tensor y_ref = reference.alloc(DType::F32, int64_t(n));
  Tensor mean_ref = reference.alloc(DType::F32, s.rows);
  Tensor rstd_ref = reference.alloc(DType::F32, s.rows);
  both.cpu().layernorm_forward(y_ref, mean_ref, rstd_ref,
                               reference.put(DType::F32, gpu_residual), gamma.cpu,
                               beta.cpu, s.rows, s.d, eps);
  // |residual| <= 2.2 here (x, sub in [-1, 1], 1 / (1 - p) <= 1.12): the bounds of the
  // layer norm twin (inputs within 1) scaled by that.
  const double magnitude = 2.2;
  EXPECT_TRUE(all_close(both.gpu_values(mean), reference.get(mean_ref),
                        magnitude * sum_factor(s.d), 0.0))
      << "mean";
  EXPECT_TRUE(all_close(both.gpu_values(rstd), reference.get(rstd_ref), 0.0,
                        4 * sum_factor(s.d)))
      << "rstd";
  EXPECT_TRUE(all_close(both.gpu_values(y), reference.get(y_ref), 16 * sum_factor(s.d),
                        output_rounding(dtype) + 4 * kEps32))
      << "y";
}

TEST(CudaAddNorm, ForwardMatchesCpu) {
  THPC_REQUIRE_GPU();
  uint32_t seed = 1200;
  for (DType dtype : gpu_compute_dtypes()) {
    for (const NormShape& s : kNormShapes) {
      for (float p : kAddNormDropouts) check_add_norm_forward(dtype, s, p, seed++);
    }
  }
}

// The bound of the fused backward's dx and d_sub: `absolute` (the layer norm dx bound),
// plus the stored result's rounding and, in bf16, one more rounding of |g| = |result -
// prefill|: g is rounded to T before it is added, as the unfused path's buffer held it.
std::vector<double> add_norm_gradient_bound(DType dtype, const std::vector<float>& expected,
                                            const std::vector<float>& prefill, double absolute) {
  std::vector<double> allowed(expected.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    allowed[i] = absolute + (output_rounding(dtype) + 8 * kEps32) * std::abs(expected[i]) +
                 output_rounding(dtype) * std::abs(double(expected[i]) - prefill[i]);
  }
  return allowed;
}

void check_add_norm_backward(DType dtype, const NormShape& s, float p, bool want_dx,
                             bool want_d_sub, bool want_params, uint32_t seed,
                             const StoreMode& mode = {}, const CudaKernelChoice& kernels = {}) {
  SCOPED_TRACE(::testing::Message() << dtype_name(dtype) << " rows=" << s.rows << " d=" << s.d
                                    << " p=" << p << " dx=" << want_dx << " d_sub="
                                    << want_d_sub << " dgamma,dbeta=" << want_params << " "
                                    << mode.name());
  std::mt19937 rng(seed);
  const size_t n = static_cast<size_t>(s.rows) * s.d;
  const DropoutKey key{0xabcdef0123ull + seed, 29u, 1u, 0x20044u};
  const auto residual = representable(random_values(n, rng), dtype);
  const auto gamma = representable(random_values(static_cast<size_t>(s.d), rng), dtype);
  const auto beta = representable(random_values(static_cast<size_t>(s.d), rng), dtype);
  const auto dy = representable(random_values(n, rng), dtype);
  const auto dx0 = representable(random_values(n, rng), dtype);
  const auto d_sub0 = representable(random_values(n, rng), dtype);
  const auto dgamma0 = random_values(static_cast<size_t>(s.d), rng);
  const auto dbeta0 = random_values(static_cast<size_t>(s.d), rng);
  Twins twins(dtype, kernels);
  Both both(twins);
  const Pair residual_t = both.act(residual), gamma_t = both.act(gamma), dy_t = both.act(dy);
  // The statistics of the residual, from the CPU, given to both backward passes.
  Scope stats(both.cpu());
  Tensor y = stats.alloc(DType::F32, int64_t(n));
  Tensor mean_cpu = stats.alloc(DType::F32, s.rows), rstd_cpu = stats.alloc(DType::F32, s.rows);
  both.cpu().layernorm_forward(y, mean_cpu, rstd_cpu, residual_t.cpu, gamma_t.cpu,
                               stats.put(DType::F32, beta), s.rows, s.d, 1e-6f);
  const std::vector<float> mean = stats.get(mean_cpu), rstd = stats.get(rstd_cpu);
  const Pair mean_t = both.param(mean), rstd_t = both.param(rstd);
  const Pair dx = want_dx ? both.act(mode.start(dx0)) : Pair{};
  const Pair d_sub = want_d_sub ? both.act(mode.start(d_sub0)) : Pair{};
  const Pair dgamma = want_params ? both.param(dgamma0) : Pair{};
  const Pair dbeta = want_params ? both.param(dbeta0) : Pair{};
  both.cpu().add_dropout_layernorm_backward(dx.cpu, d_sub.cpu, dgamma.cpu, dbeta.cpu, dy_t.cpu,
                                            residual_t.cpu, mean_t.cpu, rstd_t.cpu, gamma_t.cpu,
                                            s.rows, s.d, p, key, mode.store);
  both.gpu().add_dropout_layernorm_backward(dx.gpu, d_sub.gpu, dgamma.gpu, dbeta.gpu, dy_t.gpu,
                                            residual_t.gpu, mean_t.gpu, rstd_t.gpu, gamma_t.gpu,
                                            s.rows, s.d, p, key, mode.store);
  // The gradient g the residual receives is rounded to T before it is added (as the
  // unfused path's buffer held it): in bf16 one more rounding, of |g| = |result - prefill|.
  const auto bound = [&](const std::vector<float>& expected, const std::vector<float>& prefill,
                         double absolute) {
    return add_norm_gradient_bound(dtype, expected, prefill, absolute);
  };
  if (want_dx) {
    const std::vector<float> expected = both.cpu_values(dx);
    EXPECT_TRUE(within_scaled(both.gpu_values(dx), expected, bound(expected, mode.onto(dx0),
                              64 * sum_factor(s.d)), 1.0))
        << "dx";
  }
  if (want_d_sub) {
    const double keep_scale = 1.0 / (1.0 - p);
    const std::vector<float> got = both.gpu_values(d_sub), expected = both.cpu_values(d_sub);
    const auto onto = mode.onto(d_sub0);
    EXPECT_TRUE(within_scaled(got, expected,
                              bound(expected, onto, 64 * sum_factor(s.d) * keep_scale), 1.0))
        << "d_sub";
    if (p > 0.0f) {  // the dropped elements keep their pre-filled values exactly (kWrite: 0)
      size_t kept_as_is = 0;
      for (size_t i = 0; i < n; ++i) kept_as_is += got[i] == onto[i];
      EXPECT_GT(kept_as_is, 0u) << "no element dropped";
    }
  }
  if (want_params) {
    expect_column_sums(both.gpu_values(dgamma), both.cpu_values(dgamma), dgamma0, s, residual,
                       dy, mean, rstd, true);
    expect_column_sums(both.gpu_values(dbeta), both.cpu_values(dbeta), dbeta0, s, residual, dy,
                       mean, rstd, false);
  }
}

TEST(CudaAddNorm, BackwardMatchesCpu) {
  THPC_REQUIRE_GPU();
  uint32_t seed = 1300;
  for (DType dtype : gpu_compute_dtypes()) {
    for (const NormShape& s : kNormShapes) {
      for (float p : kAddNormDropouts) check_add_norm_backward(dtype, s, p, true, true, true, seed++);
    }
  }
}

TEST(CudaAddNorm, BackwardWithNullOutputsMatchesCpu) {
  THPC_REQUIRE_GPU();
  uint32_t seed = 1400;
  for (DType dtype : gpu_compute_dtypes()) {
    check_add_norm_backward(dtype, {130, 61}, 0.1f, true, false, false, seed++);
    check_add_norm_backward(dtype, {130, 61}, 0.1f, false, true, false, seed++);
    check_add_norm_backward(dtype, {130, 61}, 0.1f, false, false, true, seed++);
    check_add_norm_backward(dtype, {130, 61}, 0.1f, false, false, false, seed++);
  }
}

// GradStore::kWrite: dx (and d_sub) written onto NaN, stored without a load; dropped d_sub
// elements 0.
TEST(CudaLayerNorm, BackwardWritingMatchesCpu) {
  THPC_REQUIRE_GPU();
  uint32_t seed = 5200;
  const StoreMode mode{GradStore::kWrite};
  for (DType dtype : gpu_compute_dtypes()) {
    for (const NormShape& s : kNormShapes) {
      check_layernorm_backward(dtype, s, true, true, true, seed++, mode);
      for (float p : kAddNormDropouts) {
        check_add_norm_backward(dtype, s, p, true, true, true, seed++, mode);
      }
    }
    check_add_norm_backward(dtype, {130, 61}, 0.1f, true, false, false, seed++, mode);
    check_add_norm_backward(dtype, {130, 61}, 0.1f, false, true, false, seed++, mode);
  }
}

// ---- the register-held add & norm (kernels/cuda/vector_norm.cuh, the fused ops' default) --

// bf16 on the host for vector_norm's bodies: 2 bytes, so 8 to a 16-byte vector as on the
// GPU.
struct HostBf16Element {
  uint16_t bits;
};
float widen(float value) { return value; }
float widen(HostBf16Element value) { return float_from_bf16(value.bits); }
template <typename E>
E narrow(float value) {
  if constexpr (std::is_same_v<E, float>) {
    return value;
  } else {
    return E{bf16_from_float(value)};
  }
}

// A warp of 32 host threads meeting at a barrier (run_threaded_blocks, one block a row).
struct VectorTeam {
  ThreadBarrier warp{32};
  float posted[32] = {};
};

// vector_norm.cuh's policy on the host: the lane a host thread, warp_sum the device's xor
// butterfly over the posted values, 16-byte moves checked for alignment.
struct VectorLane {
  int thread = 0;
  VectorTeam* team = nullptr;
  int lane() const { return thread; }
  void sync() const { team->warp.wait(); }
  float warp_sum(float value) const {
    team->posted[thread] = value;
    sync();
    float values[32];
    std::copy(team->posted, team->posted + 32, values);
    sync();  // the slots are free again
    return warp_butterfly(values, thread, [](float a, float b) { return a + b; });
  }
  template <typename E>
  void load(float (&out)[vector_norm::kWidth<E>], const E* p) const {
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 16, 0u) << "a vector load is not aligned";
    for (int k = 0; k < vector_norm::kWidth<E>; ++k) out[k] = widen(p[k]);
  }
  template <typename E>
  void store(E* p, const float (&in)[vector_norm::kWidth<E>]) const {
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 16, 0u) << "a vector store is not aligned";
    for (int k = 0; k < vector_norm::kWidth<E>; ++k) p[k] = narrow<E>(in[k]);
  }
  template <typename E>
  float round(float value) const {
    return widen(narrow<E>(value));
  }
};

// A block of 8 such warps (backward_rows_summing): each warp's own barrier and sums, and
// the block's barrier of 256 host threads.
constexpr int kSummingWarps = 8;
struct VectorBlockTeam {
  VectorTeam warps[kSummingWarps];
  ThreadBarrier block{kSummingWarps * vector_norm::kLanes};
};

// vector_norm.cuh's policy for a thread of such a block: VectorLane's within its warp.
struct VectorBlockLane {
  int thread = 0;  // in the block
  VectorBlockTeam* team = nullptr;
  VectorLane in_warp() const {
    VectorLane lane;
    lane.thread = thread % vector_norm::kLanes;
    lane.team = &team->warps[thread / vector_norm::kLanes];
    return lane;
  }
  int lane() const { return thread % vector_norm::kLanes; }
  int warp() const { return thread / vector_norm::kLanes; }
  int warps() const { return kSummingWarps; }
  int block_thread() const { return thread; }
  void sync() const { team->block.wait(); }
  void block_sync() const { team->block.wait(); }
  float warp_sum(float value) const { return in_warp().warp_sum(value); }
  template <typename E>
  void load(float (&out)[vector_norm::kWidth<E>], const E* p) const {
    in_warp().load(out, p);
  }
  template <typename E>
  void store(E* p, const float (&in)[vector_norm::kWidth<E>]) const {
    in_warp().store(p, in);
  }
  template <typename E>
  float round(float value) const {
    return in_warp().template round<E>(value);
  }
};

// Host vectors of T aligned to 16 bytes, as the GPU's allocations are.
template <typename T>
struct AlignedValues {
  explicit AlignedValues(const std::vector<float>& values)
      : storage(values.size() + 16 / sizeof(T)) {
    const auto address = reinterpret_cast<uintptr_t>(storage.data());
    offset = (16 - address % 16) % 16 / sizeof(T);
    for (size_t i = 0; i < values.size(); ++i) storage[offset + i] = narrow<T>(values[i]);
    size = values.size();
  }
  T* data() { return storage.data() + offset; }
  std::vector<float> widened() const {
    std::vector<float> out(size);
    for (size_t i = 0; i < size; ++i) out[i] = widen(storage[offset + i]);
    return out;
  }
  std::vector<T> storage;
  size_t offset = 0, size = 0;
};

// vector_norm's bodies for `rows` rows of d, one warp of host threads a row, against the
// CPU's fused ops: forward (the residual the CPU's own within the storage's rounding, y,
// mean and rstd those of the CPU's layer norm of the stored residual, with the GPU twin's
// bounds) and backward adding and writing (dx, d_sub with check_add_norm_backward's
// bounds; dropped elements of d_sub kept exactly, or 0 when writing).
template <typename T, int kVectors>
void expect_vector_norm_rows_match_cpu(int rows, float p, bool write, uint32_t seed) {
  const DType dtype = std::is_same_v<T, float> ? DType::F32 : DType::BF16;
  const int d = kVectors * vector_norm::kLanes * vector_norm::kWidth<T>;
  ASSERT_EQ(vector_norm::vectors_for<T>(d), kVectors);
  SCOPED_TRACE(::testing::Message() << dtype_name(dtype) << " d=" << d << " p=" << p
                                    << (write ? " write" : " add"));
  std::mt19937 rng(seed);
  const size_t n = static_cast<size_t>(rows) * d;
  const DropoutKey key{0x77aa55ull + seed, 9u, 2u, 0x30011u};
  const float eps = 1e-6f;
  const auto put = [&](size_t count) {
    return representable(random_values(count, rng), dtype);
  };
  const std::vector<float> x = put(n), sub = put(n), gamma = put(d), beta = put(d);
  AlignedValues<T> x_t(x), sub_t(sub), gamma_t(gamma), beta_t(beta);
  AlignedValues<T> y_t(std::vector<float>(n, NAN)), residual_t(std::vector<float>(n, NAN));
  std::vector<float> mean(rows, NAN), rstd(rows, NAN);
  const cuda::DropMask mask = cuda::make_mask(key, p, true);
  run_threaded_blocks<VectorLane, VectorTeam>(32, rows, 0, [&](VectorLane& lane, int row, char*) {
    vector_norm::forward_row<T, kVectors>(lane, y_t.data(), residual_t.data(), mean.data(),
                                          rstd.data(), x_t.data(), sub_t.data(), gamma_t.data(),
                                          beta_t.data(), row, d, eps, mask, cuda::keep_scale(p));
  });
  std::vector<float> cpu_y(n), cpu_residual(n), cpu_mean(rows), cpu_rstd(rows);
  cpu::add_dropout_layernorm_forward<float>(cpu_y.data(), cpu_residual.data(), cpu_mean.data(),
                                            cpu_rstd.data(), x.data(), sub.data(), gamma.data(),
                                            beta.data(), rows, d, eps, p, key);
  const std::vector<float> residual = residual_t.widened();
  EXPECT_TRUE(all_close(residual, cpu_residual, 0.0, rounding_rel(dtype))) << "residual";
  std::vector<float> ref_y(n), ref_mean(rows), ref_rstd(rows);
  cpu::layernorm_forward<float>(ref_y.data(), ref_mean.data(), ref_rstd.data(), residual.data(),
                                gamma.data(), beta.data(), rows, d, eps);
  const double magnitude = 2.2;  // |residual| <= 1 + 1 / (1 - p)
  EXPECT_TRUE(all_close(mean, ref_mean, magnitude * sum_factor(d), 0.0)) << "mean";
  EXPECT_TRUE(all_close(rstd, ref_rstd, 0.0, 4 * sum_factor(d))) << "rstd";
  EXPECT_TRUE(all_close(y_t.widened(), ref_y, 16 * sum_factor(d),
                        output_rounding(dtype) + 4 * kEps32))
      << "y";

  // Backward from the stored residual and the CPU's statistics of it.
  const std::vector<float> dy = put(n), dx0 = put(n), d_sub0 = put(n);
  StoreMode mode;
  mode.store = write ? GradStore::kWrite : GradStore::kAdd;
  AlignedValues<T> dy_t(dy), dx_t(mode.start(dx0)), d_sub_t(mode.start(d_sub0));
  const cuda::DropMask backward_mask = cuda::make_mask(key, p, true);
  run_threaded_blocks<VectorLane, VectorTeam>(32, rows, 0, [&](VectorLane& lane, int row, char*) {
    vector_norm::backward_row<T, kVectors>(lane, dx_t.data(), d_sub_t.data(), dy_t.data(),
                                           residual_t.data(), ref_mean.data(), ref_rstd.data(),
                                           gamma_t.data(), row, d, backward_mask,
                                           cuda::keep_scale(p), write);
  });
  std::vector<float> cpu_dx = mode.start(dx0), cpu_d_sub = mode.start(d_sub0);
  cpu::add_dropout_layernorm_backward<float>(cpu_dx.data(), cpu_d_sub.data(), nullptr, nullptr,
                                             dy.data(), residual.data(), ref_mean.data(),
                                             ref_rstd.data(), gamma.data(), rows, d, p, key,
                                             mode.store);
  const auto bound = [&](const std::vector<float>& expected, const std::vector<float>& prefill,
                         double absolute) {
    return add_norm_gradient_bound(dtype, expected, prefill, absolute);
  };
  EXPECT_TRUE(within_scaled(dx_t.widened(), cpu_dx,
                            bound(cpu_dx, mode.onto(dx0), 64 * sum_factor(d)), 1.0))
      << "dx";
  const std::vector<float> d_sub = d_sub_t.widened(), onto = mode.onto(d_sub0);
  EXPECT_TRUE(within_scaled(d_sub, cpu_d_sub,
                            bound(cpu_d_sub, onto, 64 * sum_factor(d) / (1.0 - p)), 1.0))
      << "d_sub";
  size_t dropped = 0;
  for (size_t i = 0; i < n; ++i) {
    const bool kept = dropout_keep(key.seed, key.site, key.step, key.stream, int64_t(i), p);
    if (kept) continue;
    ++dropped;
    ASSERT_EQ(d_sub[i], onto[i]) << "dropped element " << i << " of d_sub changed";
  }
  if (p > 0.0f) {
    EXPECT_GT(dropped, 0u);
  }
}

// The kernels' own bodies on the host (each lane a host thread, the warp's sums the
// device's butterfly), every vector count of both element types: base's d = 512 is 2
// bf16 vectors a lane or 4 fp32 ones, big's 1,024 4 bf16 ones.
TEST(VectorNormOnTheHost, ForwardAndBackwardMatchCpu) {
  uint32_t seed = 2100;
  for (float p : kAddNormDropouts) {
    for (bool write : {false, true}) {
      expect_vector_norm_rows_match_cpu<float, 1>(5, p, write, seed++);
      expect_vector_norm_rows_match_cpu<float, 4>(3, p, write, seed++);
      expect_vector_norm_rows_match_cpu<HostBf16Element, 1>(4, p, write, seed++);
      expect_vector_norm_rows_match_cpu<HostBf16Element, 2>(5, p, write, seed++);
      expect_vector_norm_rows_match_cpu<HostBf16Element, 3>(2, p, write, seed++);
      expect_vector_norm_rows_match_cpu<HostBf16Element, 4>(3, p, write, seed++);
    }
  }
}

// The candidate fused_norm_grads' body (vector_norm::backward_rows_summing) on the host:
// `blocks` blocks of 8 warps of host threads over `rows` rows, then each column's partials
// added in block order (column_sums.cuh's finish adds them eight lanes a column; the
// bound below is order-free). Against the one-row body
// (backward_row, each row a warp, the default's): dx and d_sub the same bits (the sums
// change no input gradient, and every row is taken once); against the CPU's add & norm
// backward: dgamma and dbeta within the column sums' order-free bound.
template <typename T, int kVectors>
void expect_summing_rows_match_cpu(int rows, int blocks, float p, bool write, uint32_t seed) {
  const DType dtype = std::is_same_v<T, float> ? DType::F32 : DType::BF16;
  const int d = kVectors * vector_norm::kLanes * vector_norm::kWidth<T>;
  SCOPED_TRACE(::testing::Message() << dtype_name(dtype) << " d=" << d << " rows=" << rows
                                    << " blocks=" << blocks << " p=" << p
                                    << (write ? " write" : " add"));
  std::mt19937 rng(seed);
  const size_t n = static_cast<size_t>(rows) * d;
  const DropoutKey key{0x5eed00ull + seed, 11u, 3u, 0x40021u};
  const auto put = [&](size_t count) {
    return representable(random_values(count, rng), dtype);
  };
  const std::vector<float> residual = put(n), gamma = put(d), beta = put(d), dy = put(n);
  const std::vector<float> dx0 = put(n), d_sub0 = put(n);
  const std::vector<float> dgamma0 = random_values(d, rng), dbeta0 = random_values(d, rng);
  std::vector<float> y(n), mean(rows), rstd(rows);
  cpu::layernorm_forward<float>(y.data(), mean.data(), rstd.data(), residual.data(),
                                gamma.data(), beta.data(), rows, d, 1e-6f);
  StoreMode mode;
  mode.store = write ? GradStore::kWrite : GradStore::kAdd;
  AlignedValues<T> residual_t(residual), gamma_t(gamma), dy_t(dy);
  const cuda::DropMask mask = cuda::make_mask(key, p, true);
  const float scale = cuda::keep_scale(p);

  AlignedValues<T> dx_t(mode.start(dx0)), d_sub_t(mode.start(d_sub0));
  std::vector<float> partials(2 * static_cast<size_t>(blocks) * d, NAN);
  float* partial_gamma = partials.data();
  float* partial_beta = partials.data() + static_cast<size_t>(blocks) * d;
  run_threaded_blocks<VectorBlockLane, VectorBlockTeam>(
      kSummingWarps * vector_norm::kLanes, blocks,
      vector_norm::summing_shared_bytes(kSummingWarps, d),
      [&](VectorBlockLane& lane, int block, char* shared) {
        vector_norm::backward_rows_summing<T, kVectors>(
            lane, block, blocks, reinterpret_cast<float*>(shared), partial_gamma, partial_beta,
            dx_t.data(), d_sub_t.data(), dy_t.data(), residual_t.data(), mean.data(),
            rstd.data(), gamma_t.data(), rows, d, mask, scale, write);
      });
  std::vector<float> dgamma = dgamma0, dbeta = dbeta0;
  for (int col = 0; col < d; ++col) {
    float sum_gamma = 0.0f, sum_beta = 0.0f;
    for (int block = 0; block < blocks; ++block) {
      sum_gamma += partial_gamma[static_cast<size_t>(block) * d + col];
      sum_beta += partial_beta[static_cast<size_t>(block) * d + col];
    }
    dgamma[col] += sum_gamma;
    dbeta[col] += sum_beta;
  }

  AlignedValues<T> row_dx_t(mode.start(dx0)), row_d_sub_t(mode.start(d_sub0));
  run_threaded_blocks<VectorLane, VectorTeam>(32, rows, 0, [&](VectorLane& lane, int row, char*) {
    vector_norm::backward_row<T, kVectors>(lane, row_dx_t.data(), row_d_sub_t.data(),
                                           dy_t.data(), residual_t.data(), mean.data(),
                                           rstd.data(), gamma_t.data(), row, d, mask, scale,
                                           write);
  });
  const std::vector<float> dx = dx_t.widened(), d_sub = d_sub_t.widened();
  const std::vector<float> row_dx = row_dx_t.widened(), row_d_sub = row_d_sub_t.widened();
  EXPECT_TRUE(same_bits(dx, row_dx)) << "dx";
  EXPECT_TRUE(same_bits(d_sub, row_d_sub)) << "d_sub";

  std::vector<float> cpu_dx = mode.start(dx0), cpu_d_sub = mode.start(d_sub0);
  std::vector<float> cpu_dgamma = dgamma0, cpu_dbeta = dbeta0;
  cpu::add_dropout_layernorm_backward<float>(cpu_dx.data(), cpu_d_sub.data(), cpu_dgamma.data(),
                                             cpu_dbeta.data(), dy.data(), residual.data(),
                                             mean.data(), rstd.data(), gamma.data(), rows, d, p,
                                             key, mode.store);
  EXPECT_TRUE(within_scaled(dx, cpu_dx,
                            add_norm_gradient_bound(dtype, cpu_dx, mode.onto(dx0),
                                                    64 * sum_factor(d)),
                            1.0))
      << "dx";
  const NormShape shape{rows, d};
  expect_column_sums(dgamma, cpu_dgamma, dgamma0, shape, residual, dy, mean, rstd, true);
  expect_column_sums(dbeta, cpu_dbeta, dbeta0, shape, residual, dy, mean, rstd, false);
}

// Blocks whose warps take several rows, one, or none (5 rows on 8 warps; 20 rows on 3
// blocks: 4 warps idle), with and without dropout, adding and writing; base's d = 512 as
// 2 bf16 vectors a lane and 4 fp32 ones, big's 1,024 as 4 bf16.
TEST(VectorNormOnTheHost, SummingBackwardIsTheRowBodysWithTheCpusParameterGradients) {
  uint32_t seed = 2700;
  for (float p : kAddNormDropouts) {
    for (bool write : {false, true}) {
      expect_summing_rows_match_cpu<HostBf16Element, 2>(37, 2, p, write, seed++);
      expect_summing_rows_match_cpu<HostBf16Element, 2>(5, 1, p, write, seed++);
      expect_summing_rows_match_cpu<float, 4>(20, 3, p, write, seed++);
      expect_summing_rows_match_cpu<HostBf16Element, 4>(9, 1, p, write, seed++);
      expect_summing_rows_match_cpu<float, 1>(40, 1, p, write, seed++);
    }
  }
}

// As many blocks as the rows need at the rows a warp one wave of resident blocks allows.
TEST(VectorNormOnTheHost, SummingBlocksGiveEveryWarpTheBusiestWarpsRows) {
  EXPECT_EQ(vector_norm::summing_blocks(25000, 396, 8), 391);  // 8 rows a warp
  EXPECT_EQ(vector_norm::summing_blocks(3125, 396, 8), 391);   // 1 row a warp
  EXPECT_EQ(vector_norm::summing_blocks(100, 396, 8), 13);
  EXPECT_EQ(vector_norm::summing_blocks(3169, 396, 8), 199);   // 2 rows a warp
  EXPECT_EQ(vector_norm::summing_blocks(1, 0, 8), 1);
  for (int rows : {1, 7, 3125, 3169, 25000, 100000}) {
    for (int resident : {1, 132, 396}) {
      const int blocks = vector_norm::summing_blocks(rows, resident, 8);
      EXPECT_LE(blocks, resident) << rows << " rows";
      EXPECT_LT((blocks - 1) * 8, rows) << "a block without rows";  // warp w's first row: w
    }
  }
}

// Where the rows do not fit, vectors_for says so and the launcher takes the verified
// kernels: widths that are not a multiple of 32 lanes x a vector, or above 4 a lane.
// The register-held kernels (kernels/cuda/vector_norm.cuh; the former candidate
// vector_norms, the default since 2026-12-04): the fused forward and backward by them
// where the rows fit (bf16 d = 256, 512 (base), 768, 1,024 (big); fp32 d = 128, 512), and
// by the row-per-block ones where they do not (d = 61, 129, 4,096), against the CPU with
// the row-per-block kernels' bounds (the same arithmetic, the row sums in another order);
// every backward output alone and together, adding and writing. Launches are counted: a
// fitting shape that the row-per-block kernels took would prove nothing.
const std::vector<NormShape> kVectorNormShapes = {{37, 256}, {129, 512}, {5, 768}, {200, 1024},
                                                  {64, 128},  {130, 61}, {1000, 129}, {33, 4096}};

// Runs `check` (one op of the GPU), expecting one launch of the register-held kernels
// where rows of d fit them and none where they do not (not counted in the rehearsal,
// which has no GPU kernels).
template <typename Check>
void expect_vector_launch_where_rows_fit(DType dtype, int d, const Check& check) {
  const int64_t before = vector_norm_launches();
  check();
  if (twin_rehearsal()) return;
  EXPECT_EQ(vector_norm_launches() - before, register_held_vectors(dtype, d) > 0 ? 1 : 0)
      << dtype_name(dtype) << " d=" << d;
}

TEST(CudaVectorNorms, ForwardMatchesCpu) {
  THPC_REQUIRE_GPU();
  uint32_t seed = 2300;
  for (DType dtype : gpu_compute_dtypes()) {
    for (const NormShape& s : kVectorNormShapes) {
      for (float p : kAddNormDropouts) {
        expect_vector_launch_where_rows_fit(
            dtype, s.d, [&] { check_add_norm_forward(dtype, s, p, seed++); });
      }
    }
  }
}

// The register-held add & norm backward against the CPU over `shapes`, with `kernels`:
// every output together (with and without dropout), each input gradient alone and with
// dgamma and dbeta, adding and writing; where rows fit, one launch of those kernels a call.
void expect_register_held_backward_matches_cpu(const std::vector<NormShape>& shapes,
                                               uint32_t seed, const CudaKernelChoice& kernels) {
  for (DType dtype : gpu_compute_dtypes()) {
    for (const NormShape& s : shapes) {
      for (GradStore store : {GradStore::kAdd, GradStore::kWrite}) {
        StoreMode mode;
        mode.store = store;
        const auto check = [&](float p, bool want_dx, bool want_d_sub, bool want_params) {
          expect_vector_launch_where_rows_fit(dtype, s.d, [&] {
            check_add_norm_backward(dtype, s, p, want_dx, want_d_sub, want_params, seed++, mode,
                                    kernels);
          });
        };
        for (float p : kAddNormDropouts) check(p, true, true, true);
        for (bool want_params : {false, true}) {
          check(0.1f, true, false, want_params);
          check(0.1f, false, true, want_params);
        }
      }
    }
  }
}

TEST(CudaVectorNorms, BackwardMatchesCpu) {
  THPC_REQUIRE_GPU();
  expect_register_held_backward_matches_cpu(kVectorNormShapes, 2400, {});
}

// ---- the candidate fuller_column_sums: dgamma and dbeta in chunks that fill the device --
// (kernels/cuda/column_sums.cuh.) Rows from one (a chunk) through a small batch's (3,125
// of 512 on 132 SMs: the chunks shortened to 16 rows; 1,000 of 129: to 8) to 30,000 of
// 128 (64-row chunks, as without it: the cap), the finish with eight lanes a column:
// against the CPU with the bounds of the verified path (the sums' order is other, the
// bound is order-free), and twice the same bits. Through the layer norm's backward and
// the register-held add & norm's.
const std::vector<NormShape> kFullerColumnShapes = {{1, 37},     {7, 61},     {1000, 129},
                                                    {3125, 512}, {200, 1024}, {30000, 128}};

TEST(CudaCandidateFullerColumnSums, LayerNormGradientsMatchCpu) {
  THPC_REQUIRE_GPU();
  const CudaKernelChoice fuller = kernels_with(kFullerColumnSums);
  uint32_t seed = 2500;
  for (DType dtype : gpu_compute_dtypes()) {
    for (const NormShape& s : kFullerColumnShapes) {
      check_layernorm_backward(dtype, s, true, true, true, seed++, {}, fuller);
      check_add_norm_backward(dtype, s, 0.1f, true, true, true, seed++, {}, fuller);
    }
    check_layernorm_backward(dtype, {3125, 512}, false, true, false, seed++, {}, fuller);
    check_layernorm_backward(dtype, {3125, 512}, false, false, true, seed++, {}, fuller);
  }
}

TEST(CudaCandidateFullerColumnSums, LayerNormGradientsAreDeterministic) {
  THPC_REQUIRE_GPU();
  const CudaKernelChoice fuller = kernels_with(kFullerColumnSums);
  expect_layernorm_backward_deterministic(fuller, 3125, 512, 2600);
}

// ---- the candidate fused_norm_grads: dgamma and dbeta summed by the add & norm backward --
// (vector_norm::backward_rows_summing.) Where rows fit the register-held kernels, one
// launch of the summing kernel gives dx, d_sub, dgamma and dbeta (launches counted: a
// fitting shape that the verified kernels took would prove nothing), against the CPU
// with the verified path's bounds (the sums' order is other, the bound is order-free),
// adding and writing, with and without dropout, each input gradient alone; where they
// do not fit (d = 61, 129), the verified kernels. Base's rows at one rank's batch (a row
// a warp on 132 SMs) and at the whole one (8 rows a warp; big's 1,024 too, ~12 a warp),
// and twice the same bits.
// (The small shapes in a test of their own: racecheck's, bench/gpu_session.sh.)
const std::vector<NormShape> kFusedNormGradShapes = {
    {37, 256}, {129, 512}, {5, 768}, {200, 1024}, {64, 128}, {130, 61}, {1000, 129}};

TEST(CudaCandidateFusedNormGrads, AddNormGradientsMatchCpu) {
  THPC_REQUIRE_GPU();
  expect_register_held_backward_matches_cpu(kFusedNormGradShapes, 2800,
                                            kernels_with(kFusedNormGrads));
}

TEST(CudaCandidateFusedNormGrads, AddNormGradientsMatchCpuAtOneRanksAndTheWholeBatch) {
  THPC_REQUIRE_GPU();
  const CudaKernelChoice fused = kernels_with(kFusedNormGrads);
  uint32_t seed = 2850;
  for (DType dtype : gpu_compute_dtypes()) {
    // And big's width over the whole batch: several rows a warp at d = 1,024 (bf16 only
    // fits it), where the kernel holds 127 registers and two blocks an SM.
    for (const NormShape& s :
         {NormShape{3125, 512}, NormShape{25000, 512}, NormShape{25000, 1024}}) {
      expect_vector_launch_where_rows_fit(dtype, s.d, [&] {
        check_add_norm_backward(dtype, s, 0.1f, true, true, true, seed++, {}, fused);
      });
    }
  }
}

TEST(CudaCandidateFusedNormGrads, AddNormGradientsAreDeterministic) {
  THPC_REQUIRE_GPU();
  const CudaKernelChoice fused = kernels_with(kFusedNormGrads);
  for (const NormShape& s : {NormShape{3125, 512}, NormShape{25000, 512}}) {
    for (DType dtype : gpu_compute_dtypes()) {
      SCOPED_TRACE(::testing::Message() << dtype_name(dtype) << " rows=" << s.rows);
      const size_t n = static_cast<size_t>(s.rows) * s.d;
      std::mt19937 rng(2900 + s.rows);
      const auto residual = random_values(n, rng), dy = random_values(n, rng);
      const auto dx0 = random_values(n, rng), d_sub0 = random_values(n, rng);
      const auto gamma = random_values(s.d, rng), beta = random_values(s.d, rng);
      const auto dgamma0 = random_values(s.d, rng), dbeta0 = random_values(s.d, rng);
      const DropoutKey key{0x1234567ull, 7u, 5u, 0x10001u};
      Twins twins(dtype, fused);
      Scope gpu(*twins.gpu);
      const Tensor residual_t = gpu.put(dtype, residual), dy_t = gpu.put(dtype, dy),
                   gamma_t = gpu.put(dtype, gamma);
      Tensor y = gpu.alloc(dtype, static_cast<int64_t>(n));
      Tensor mean = gpu.alloc(DType::F32, s.rows), rstd = gpu.alloc(DType::F32, s.rows);
      twins.gpu->layernorm_forward(y, mean, rstd, residual_t, gamma_t, gpu.put(dtype, beta),
                                   s.rows, s.d, 1e-6f);
      std::vector<float> first[4];
      for (int run = 0; run < 2; ++run) {
        Tensor dx = gpu.put(dtype, dx0), d_sub = gpu.put(dtype, d_sub0);
        Tensor dgamma = gpu.put(DType::F32, dgamma0), dbeta = gpu.put(DType::F32, dbeta0);
        twins.gpu->add_dropout_layernorm_backward(dx, d_sub, dgamma, dbeta, dy_t, residual_t,
                                                  mean, rstd, gamma_t, s.rows, s.d, 0.1f, key,
                                                  GradStore::kAdd);
        const std::vector<float> got[4] = {gpu.get(dx), gpu.get(d_sub), gpu.get(dgamma),
                                           gpu.get(dbeta)};
        for (int i = 0; i < 4; ++i) {
          if (run == 0) first[i] = got[i];
          else EXPECT_TRUE(same_bits(got[i], first[i])) << "output " << i << " differs";
        }
      }
    }
  }
}

TEST(VectorNormOnTheHost, OnlyRowsThatFitAreTaken) {
  EXPECT_EQ(vector_norm::vectors_for<HostBf16Element>(512), 2);
  EXPECT_EQ(vector_norm::vectors_for<float>(512), 4);
  EXPECT_EQ(vector_norm::vectors_for<HostBf16Element>(1024), 4);
  EXPECT_EQ(vector_norm::vectors_for<float>(1024), 0);
  EXPECT_EQ(vector_norm::vectors_for<HostBf16Element>(2048), 0);
  EXPECT_EQ(vector_norm::vectors_for<HostBf16Element>(384), 0);
  EXPECT_EQ(vector_norm::vectors_for<float>(129), 0);
  EXPECT_EQ(vector_norm::vectors_for<float>(0), 0);
}

}  // namespace
}  // namespace thpc::test
