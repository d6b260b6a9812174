// Tests of the CPU reference ops (kernels/cpu): the specification every other backend is
// checked against, so each op is checked here against first principles.
//
// * Every backward is compared with central finite differences of a scalar objective
//   L = sum(out * R) (R a fixed random tensor, so dL/dout = R) in the double
//   instantiation. Gradient buffers are pre-filled with random values before backward
//   and the analytic gradient is read as (after - before), which checks the
//   accumulate-into-gradients rule of kernels/ops.h for every op at the same time.
// * Forwards are compared with direct, naive evaluations of their formulas.
// * The float instantiation is compared with the double one.
// All inputs are random and non-zero (std::mt19937 with fixed seeds), sizes are odd.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "common/error.h"
#include "expect_error.h"
#include "common/philox.h"
#include "kernels/cpu/cpu_ops.h"

namespace thpc {
namespace {

using Values = std::vector<double>;

// ---- helpers ---------------------------------------------------------------------

// Uniform in [-1, 1]: never exactly zero in practice, and mixed signs.
Values random_values(size_t count, std::mt19937& rng) {
  std::uniform_real_distribution<double> uniform(-1.0, 1.0);
  Values values(count);
  for (double& value : values) value = uniform(rng);
  return values;
}

// Magnitude in [min_abs, 1] with a random sign: for inputs that must stay away from a
// kink (ReLU at 0), so that x +- h never crosses it.
Values random_away_from_zero(size_t count, std::mt19937& rng, double min_abs) {
  std::uniform_real_distribution<double> magnitude(min_abs, 1.0);
  std::bernoulli_distribution negative(0.5);
  Values values(count);
  for (double& value : values) value = negative(rng) ? -magnitude(rng) : magnitude(rng);
  return values;
}

// The scalar objective L = sum_i out_i * weights_i.
double weighted_sum(const Values& out, const Values& weights) {
  EXPECT_EQ(out.size(), weights.size());
  double sum = 0.0;
  for (size_t i = 0; i < out.size(); ++i) sum += out[i] * weights[i];
  return sum;
}

Values difference(const Values& after, const Values& before) {
  Values diff(after.size());
  for (size_t i = 0; i < after.size(); ++i) diff[i] = after[i] - before[i];
  return diff;
}

double max_abs(const Values& values) {
  double largest = 0.0;
  for (double value : values) largest = std::max(largest, std::abs(value));
  return largest;
}

template <typename T>
std::vector<T> cast_to(const Values& values) {
  return std::vector<T>(values.begin(), values.end());
}

template <typename T>
Values to_double(const std::vector<T>& values) {
  return Values(values.begin(), values.end());
}

// Finite-difference step and tolerance. In double precision the central difference
// (L(x+h) - L(x-h)) / 2h has truncation error O(h^2) * L''' ~ 1e-12 and rounding error
// ~ eps * |L| / h ~ 1e-16 * 10 / 1e-6 ~ 1e-9 for the |L| <= ~10 of these tests, so an
// absolute 1e-7 plus relative 1e-6 separates a correct gradient (agreement to ~1e-9)
// from any wrong term (the gradients themselves are O(0.1..1)).
constexpr double kStep = 1e-6;
constexpr double kAbsTolerance = 1e-7;
constexpr double kRelTolerance = 1e-6;

// Compares analytic[i] with the central difference of objective() in x[i], for every i.
// x is perturbed in place and restored. The gradient must not be identically zero,
// so a backward that does nothing cannot pass against an objective that ignores x.
void expect_gradient_matches(const std::string& what, Values& x, const Values& analytic,
                             const std::function<double()>& objective) {
  ASSERT_EQ(x.size(), analytic.size()) << what;
  EXPECT_GT(max_abs(analytic), 1e-3) << what << ": the analytic gradient is all zero";
  for (size_t i = 0; i < x.size(); ++i) {
    const double original = x[i];
    x[i] = original + kStep;
    const double plus = objective();
    x[i] = original - kStep;
    const double minus = objective();
    x[i] = original;
    const double numeric = (plus - minus) / (2.0 * kStep);
    EXPECT_NEAR(analytic[i], numeric, kAbsTolerance + kRelTolerance * std::abs(numeric))
        << what << "[" << i << "]";
  }
}

// Float vs double: fp32 has eps 1.2e-7; the ops sum up to ~100 terms (dot products,
// softmax denominators, row statistics) and pass through exp/log, which amplifies the
// input rounding by the conditioning of the function, so results agree to ~1e-5
// relative at worst. abs 1e-5 + rel 1e-4 leaves margin while any real difference
// between the instantiations (a term dropped in one of them) shows as O(0.1).
void expect_close_float_double(const std::string& what, const Values& from_float,
                               const Values& from_double) {
  ASSERT_EQ(from_float.size(), from_double.size()) << what;
  ASSERT_FALSE(from_double.empty()) << what;
  for (size_t i = 0; i < from_double.size(); ++i) {
    EXPECT_NEAR(from_float[i], from_double[i], 1e-5 + 1e-4 * std::abs(from_double[i]))
        << what << "[" << i << "]";
  }
}

constexpr DropoutKey kDropoutKey{/*seed=*/0x123456789abcdefULL, /*step=*/7, /*stream=*/2,
                                 /*site=*/5};

// ---- Philox ----------------------------------------------------------------------

// Known-answer vectors of Random123 (kat_vectors, philox4x32_10).
TEST(Philox, MatchesRandom123KnownAnswers) {
  const Philox4x32 zeros = philox4x32_10(0, 0, 0, 0, 0, 0);
  EXPECT_EQ(zeros.v[0], 0x6627e8d5u);
  EXPECT_EQ(zeros.v[1], 0xe169c58du);
  EXPECT_EQ(zeros.v[2], 0xbc57ac4cu);
  EXPECT_EQ(zeros.v[3], 0x9b00dbd8u);

  const Philox4x32 ones = philox4x32_10(0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu,
                                        0xffffffffu, 0xffffffffu);
  EXPECT_EQ(ones.v[0], 0x408f276du);
  EXPECT_EQ(ones.v[1], 0x41c83b0eu);
  EXPECT_EQ(ones.v[2], 0xa20bc7c6u);
  EXPECT_EQ(ones.v[3], 0x6d5451fdu);

  const Philox4x32 pi = philox4x32_10(0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u,
                                      0xa4093822u, 0x299f31d0u);
  EXPECT_EQ(pi.v[0], 0xd16cfe09u);
  EXPECT_EQ(pi.v[1], 0x94fdccebu);
  EXPECT_EQ(pi.v[2], 0x5001e420u);
  EXPECT_EQ(pi.v[3], 0x24126ea1u);
}

// Keeps are Bernoulli(1 - p): over n draws the kept count is within 5 standard
// deviations sqrt(n p (1 - p)) of n (1 - p).
TEST(Philox, DropoutKeepRateIsOneMinusP) {
  const float p = 0.3f;
  const int64_t n = 1000000;
  int64_t kept = 0;
  for (int64_t i = 0; i < n; ++i) {
    kept += dropout_keep(kDropoutKey.seed, kDropoutKey.site, kDropoutKey.step,
                         kDropoutKey.stream, static_cast<uint64_t>(i), p);
  }
  const double expected = n * (1.0 - p);
  const double sigma = std::sqrt(n * static_cast<double>(p) * (1.0 - p));
  EXPECT_NEAR(static_cast<double>(kept), expected, 5.0 * sigma);
}

// ---- embedding -------------------------------------------------------------------

struct EmbeddingProblem {
  static constexpr int kVocab = 7, kDim = 5, kLength = 4, kBatch = 3;
  static constexpr int kRows = kBatch * kLength, kMaxLen = kLength + 2;
  // Repeated ids (3 four times, 1 twice) so the backward's accumulation per id matters.
  std::vector<int32_t> tokens{3, 1, 3, 6, 0, 3, 5, 2, 1, 4, 3, 2};
  Values table, positions, weights;
  double scale = 1.7;

  explicit EmbeddingProblem(std::mt19937& rng)
      : table(random_values(kVocab * kDim, rng)),
        positions(random_values(kMaxLen * kDim, rng)),
        weights(random_values(kRows * kDim, rng)) {}

  Values forward() const {
    Values out(kRows * kDim);
    cpu::embedding_forward<double>(out.data(), tokens.data(), table.data(), positions.data(),
                                   kRows, kLength, kDim, kVocab, scale);
    return out;
  }
};

TEST(Embedding, ForwardIsScaledRowPlusPosition) {
  std::mt19937 rng(11);
  const EmbeddingProblem problem(rng);
  const Values out = problem.forward();
  for (int r = 0; r < EmbeddingProblem::kRows; ++r) {
    for (int c = 0; c < EmbeddingProblem::kDim; ++c) {
      const double expected =
          problem.table[problem.tokens[r] * EmbeddingProblem::kDim + c] * problem.scale +
          problem.positions[(r % EmbeddingProblem::kLength) * EmbeddingProblem::kDim + c];
      EXPECT_DOUBLE_EQ(out[r * EmbeddingProblem::kDim + c], expected) << r << "," << c;
    }
  }
}

TEST(Embedding, BackwardMatchesFiniteDifferences) {
  std::mt19937 rng(12);
  EmbeddingProblem problem(rng);
  const Values d_table_before = random_values(problem.table.size(), rng);
  const Values d_positions_before = random_values(problem.positions.size(), rng);
  Values d_table = d_table_before, d_positions = d_positions_before;
  cpu::embedding_backward<double>(d_table.data(), d_positions.data(), problem.weights.data(),
                                  problem.tokens.data(), EmbeddingProblem::kRows,
                                  EmbeddingProblem::kLength, EmbeddingProblem::kDim,
                                  EmbeddingProblem::kVocab, problem.scale);
  const auto objective = [&] { return weighted_sum(problem.forward(), problem.weights); };
  expect_gradient_matches("d_table", problem.table, difference(d_table, d_table_before),
                          objective);
  expect_gradient_matches("d_positions", problem.positions,
                          difference(d_positions, d_positions_before), objective);
}

TEST(Embedding, NullGradientOutputsAreSkipped) {
  std::mt19937 rng(13);
  EmbeddingProblem problem(rng);
  Values d_table(problem.table.size(), 0.0), d_table_only(problem.table.size(), 0.0);
  Values d_positions(problem.positions.size(), 0.0);
  cpu::embedding_backward<double>(d_table.data(), d_positions.data(), problem.weights.data(),
                                  problem.tokens.data(), EmbeddingProblem::kRows,
                                  EmbeddingProblem::kLength, EmbeddingProblem::kDim,
                                  EmbeddingProblem::kVocab, problem.scale);
  // Sinusoidal positions are not learned: no d_positions.
  cpu::embedding_backward<double>(d_table_only.data(), nullptr, problem.weights.data(),
                                  problem.tokens.data(), EmbeddingProblem::kRows,
                                  EmbeddingProblem::kLength, EmbeddingProblem::kDim,
                                  EmbeddingProblem::kVocab, problem.scale);
  EXPECT_EQ(d_table_only, d_table);
  EXPECT_GT(max_abs(d_table), 0.0);
}

TEST(Embedding, RejectsTokenOutsideVocabulary) {
  std::mt19937 rng(14);
  EmbeddingProblem problem(rng);
  problem.tokens[5] = EmbeddingProblem::kVocab;  // one past the end
  expect_error([&] { problem.forward(); }, {"token id 7", "[0, 7)"});
  problem.tokens[5] = -1;
  EXPECT_THROW(problem.forward(), Error);
}

TEST(Embedding, SinusoidalPositionsFollowTheFormula) {
  const int max_len = 50, d = 9;  // odd d: the last column is a sine without its cosine
  Values table(max_len * d);
  cpu::sinusoidal_positions<double>(table.data(), max_len, d);
  // PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos(pos / 10000^(2i/d)).
  const std::vector<std::pair<int, int>> pos_and_i{{0, 0}, {1, 0}, {3, 1}, {17, 2}, {49, 3},
                                                   {49, 4}, {25, 4}};
  for (const auto& [pos, i] : pos_and_i) {
    const double angle = pos / std::pow(10000.0, 2.0 * i / d);
    EXPECT_NEAR(table[pos * d + 2 * i], std::sin(angle), 1e-15) << pos << "," << i;
    if (2 * i + 1 < d) {
      EXPECT_NEAR(table[pos * d + 2 * i + 1], std::cos(angle), 1e-15) << pos << "," << i;
    }
  }
  EXPECT_EQ(table[0], 0.0);  // sin(0)
  EXPECT_EQ(table[1], 1.0);  // cos(0)
  std::vector<float> table_float(max_len * d);
  cpu::sinusoidal_positions<float>(table_float.data(), max_len, d);
  for (size_t e = 0; e < table.size(); ++e) {
    EXPECT_EQ(table_float[e], static_cast<float>(table[e])) << e;  // rounded from double
  }
}

// ---- linear and output projection ------------------------------------------------

struct LinearProblem {
  static constexpr int kM = 5, kK = 7, kN = 3;
  Values x, W, b, weights;
  explicit LinearProblem(std::mt19937& rng)
      : x(random_values(kM * kK, rng)),
        W(random_values(kK * kN, rng)),
        b(random_values(kN, rng)),
        weights(random_values(kM * kN, rng)) {}
  Values forward(bool with_bias = true) const {
    Values y(kM * kN, 99.0);  // forward overwrites
    cpu::linear_forward<double>(y.data(), x.data(), W.data(), with_bias ? b.data() : nullptr,
                                kM, kK, kN);
    return y;
  }
};

TEST(Linear, ForwardIsXWPlusB) {
  std::mt19937 rng(21);
  const LinearProblem problem(rng);
  const Values y = problem.forward(), y_no_bias = problem.forward(false);
  for (int i = 0; i < LinearProblem::kM; ++i) {
    for (int j = 0; j < LinearProblem::kN; ++j) {
      double product = 0.0;
      for (int l = 0; l < LinearProblem::kK; ++l) {
        product += problem.x[i * LinearProblem::kK + l] * problem.W[l * LinearProblem::kN + j];
      }
      EXPECT_NEAR(y[i * LinearProblem::kN + j], product + problem.b[j], 1e-14);
      EXPECT_NEAR(y_no_bias[i * LinearProblem::kN + j], product, 1e-14);
    }
  }
}

TEST(Linear, BackwardMatchesFiniteDifferencesAndAccumulates) {
  std::mt19937 rng(22);
  LinearProblem problem(rng);
  const Values dx_before = random_values(problem.x.size(), rng);
  const Values dW_before = random_values(problem.W.size(), rng);
  const Values db_before = random_values(problem.b.size(), rng);
  Values dx = dx_before, dW = dW_before, db = db_before;
  cpu::linear_backward<double>(dx.data(), dW.data(), db.data(), problem.weights.data(),
                               problem.x.data(), problem.W.data(), LinearProblem::kM,
                               LinearProblem::kK, LinearProblem::kN);
  const auto objective = [&] { return weighted_sum(problem.forward(), problem.weights); };
  expect_gradient_matches("dx", problem.x, difference(dx, dx_before), objective);
  expect_gradient_matches("dW", problem.W, difference(dW, dW_before), objective);
  expect_gradient_matches("db", problem.b, difference(db, db_before), objective);

  // Accumulate: a second backward into the same buffers adds the same gradient again.
  Values dx_twice = dx;
  cpu::linear_backward<double>(dx_twice.data(), nullptr, nullptr, problem.weights.data(),
                               problem.x.data(), problem.W.data(), LinearProblem::kM,
                               LinearProblem::kK, LinearProblem::kN);
  for (size_t i = 0; i < dx.size(); ++i) {
    EXPECT_NEAR(dx_twice[i], dx_before[i] + 2.0 * (dx[i] - dx_before[i]), 1e-14) << i;
  }
}

TEST(Linear, NullGradientOutputsAreSkipped) {
  std::mt19937 rng(23);
  const LinearProblem problem(rng);
  Values dx_all(problem.x.size(), 0.0), dW_all(problem.W.size(), 0.0);
  Values db_all(problem.b.size(), 0.0);
  cpu::linear_backward<double>(dx_all.data(), dW_all.data(), db_all.data(),
                               problem.weights.data(), problem.x.data(), problem.W.data(),
                               LinearProblem::kM, LinearProblem::kK, LinearProblem::kN);
  Values dW_only(problem.W.size(), 0.0), db_only(problem.b.size(), 0.0);
  cpu::linear_backward<double>(nullptr, dW_only.data(), nullptr, problem.weights.data(),
                               problem.x.data(), problem.W.data(), LinearProblem::kM,
                               LinearProblem::kK, LinearProblem::kN);
  cpu::linear_backward<double>(nullptr, nullptr, db_only.data(), problem.weights.data(),
                               problem.x.data(), problem.W.data(), LinearProblem::kM,
                               LinearProblem::kK, LinearProblem::kN);
  EXPECT_EQ(dW_only, dW_all);
  EXPECT_EQ(db_only, db_all);
}

struct OutputProjectionProblem {
  static constexpr int kM = 5, kD = 7, kVocab = 11;
  Values h, E, weights;
  explicit OutputProjectionProblem(std::mt19937& rng)
      : h(random_values(kM * kD, rng)),
        E(random_values(kVocab * kD, rng)),
        weights(random_values(kM * kVocab, rng)) {}
  Values forward() const {
    Values logits(kM * kVocab, 99.0);
    cpu::output_projection_forward<double>(logits.data(), h.data(), E.data(), kM, kD, kVocab);
    return logits;
  }
};

TEST(OutputProjection, ForwardIsHTimesETransposed) {
  std::mt19937 rng(24);
  const OutputProjectionProblem problem(rng);
  const Values logits = problem.forward();
  constexpr int kD = OutputProjectionProblem::kD, kVocab = OutputProjectionProblem::kVocab;
  for (int i = 0; i < OutputProjectionProblem::kM; ++i) {
    for (int j = 0; j < kVocab; ++j) {
      double product = 0.0;
      for (int l = 0; l < kD; ++l) product += problem.h[i * kD + l] * problem.E[j * kD + l];
      EXPECT_NEAR(logits[i * kVocab + j], product, 1e-14);
    }
  }
}

TEST(OutputProjection, BackwardMatchesFiniteDifferencesAndAccumulates) {
  std::mt19937 rng(25);
  OutputProjectionProblem problem(rng);
  const Values dh_before = random_values(problem.h.size(), rng);
  const Values dE_before = random_values(problem.E.size(), rng);
  Values dh = dh_before, dE = dE_before;
  cpu::output_projection_backward<double>(dh.data(), dE.data(), problem.weights.data(),
                                          problem.h.data(), problem.E.data(),
                                          OutputProjectionProblem::kM,
                                          OutputProjectionProblem::kD,
                                          OutputProjectionProblem::kVocab);
  const auto objective = [&] { return weighted_sum(problem.forward(), problem.weights); };
  expect_gradient_matches("dh", problem.h, difference(dh, dh_before), objective);
  expect_gradient_matches("dE", problem.E, difference(dE, dE_before), objective);
}

// ---- layer norm ------------------------------------------------------------------

struct LayerNormProblem {
  static constexpr int kRows = 5, kDim = 9;
  static constexpr double kEps = 1e-5;
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

// ---- attention -------------------------------------------------------------------

// One attention configuration. Self-attention reads Q, K and V from one fused
// [rows, 3 h d_k] buffer (the fused QKV projection: three offset views with the same row
// stride); cross-attention reads Q from its own buffer (with a spare column, so the
// row stride exceeds h d_k) and K, V from a fused [rows, h (d_k + d_v)] buffer.
struct AttentionCase {
  std::string name;
  int batch, heads, query_len, key_len, d_k, d_v;
  bool causal;
  float dropout;
  std::vector<int32_t> key_lengths;
  bool fused_qkv;
};

struct AttentionProblem {
  AttentionCase config;
  AttentionShape shape;
  Values q_buffer, kv_buffer;  // kv_buffer is empty when Q, K, V are fused in q_buffer
  int ldq = 0, ldk = 0, ldv = 0;
  size_t k_offset = 0, v_offset = 0;  // into kv_buffer, or q_buffer when fused
  Values weights;                     // R, [B*Lq, h*d_v]

  AttentionProblem(const AttentionCase& c, std::mt19937& rng) : config(c) {
    shape.batch = c.batch;
    shape.heads = c.heads;
    shape.query_len = c.query_len;
    shape.key_len = c.key_len;
    shape.d_k = c.d_k;
    shape.d_v = c.d_v;
    shape.causal = c.causal;
    shape.key_lengths = config.key_lengths.data();
    shape.dropout = c.dropout;
    shape.dropout_key = kDropoutKey;
    const int width_k = c.heads * c.d_k, width_v = c.heads * c.d_v;
    if (c.fused_qkv) {
      ldq = ldk = ldv = 2 * width_k + width_v;
      k_offset = width_k;
      v_offset = 2 * width_k;
      q_buffer = random_values(static_cast<size_t>(c.batch) * c.query_len * ldq, rng);
    } else {
      ldq = width_k + 1;  // a column no head reads
      ldk = ldv = width_k + width_v;
      k_offset = 0;
      v_offset = width_k;
      q_buffer = random_values(static_cast<size_t>(c.batch) * c.query_len * ldq, rng);
      kv_buffer = random_values(static_cast<size_t>(c.batch) * c.key_len * ldk, rng);
    }
    weights = random_values(out_numel(), rng);
  }

  size_t out_numel() const {
    return static_cast<size_t>(shape.batch) * shape.query_len * shape.heads * shape.d_v;
  }
  const double* q() const { return q_buffer.data(); }
  const double* kv_base() const { return config.fused_qkv ? q_buffer.data() : kv_buffer.data(); }
  const double* k() const { return kv_base() + k_offset; }
  const double* v() const { return kv_base() + v_offset; }

  Values forward(Values* saved = nullptr) const {
    Values out(out_numel(), 99.0);
    Values probabilities(static_cast<size_t>(cpu::attention_saved_numel(shape)), 99.0);
    cpu::attention_forward<double>(out.data(), probabilities.data(), q(), ldq, k(), ldk, v(),
                                   ldv, shape);
    if (saved != nullptr) *saved = probabilities;
    return out;
  }

  // Gradients wrt q_buffer and kv_buffer, accumulated into the given buffers.
  void backward(Values& d_q_buffer, Values& d_kv_buffer, const Values& saved) const {
    double* d_kv_base = config.fused_qkv ? d_q_buffer.data() : d_kv_buffer.data();
    cpu::attention_backward<double>(d_q_buffer.data(), d_kv_base + k_offset,
                                    d_kv_base + v_offset, weights.data(), saved.data(), q(),
                                    ldq, k(), ldk, v(), ldv, shape);
  }

  // The naive evaluation of §3.2: for each sentence, head and query t, p_j =
  // softmax_j(q_t . k_j / sqrt(d_k)) over the visible keys j < key_lengths[b] (and
  // j <= t when causal), the dropout draw of element ((b h + i) Lq + t) Lk + j,
  // out_t = sum_j p_j keep_j / (1 - p) v_j. Also returns the probabilities.
  Values naive_forward(Values* probabilities) const {
    const int B = shape.batch, H = shape.heads, Lq = shape.query_len, Lk = shape.key_len;
    const int dk = shape.d_k, dv = shape.d_v;
    Values out(out_numel(), 0.0);
    probabilities->assign(static_cast<size_t>(B) * H * Lq * Lk, 0.0);
    for (int b = 0; b < B; ++b) {
      for (int head = 0; head < H; ++head) {
        for (int t = 0; t < Lq; ++t) {
          std::vector<double> scores;
          for (int j = 0; j < Lk; ++j) {
            if (j >= config.key_lengths[b] || (shape.causal && j > t)) break;
            double dot = 0.0;
            for (int c = 0; c < dk; ++c) {
              dot += q()[(b * Lq + t) * ldq + head * dk + c] *
                     k()[(b * Lk + j) * ldk + head * dk + c];
            }
            scores.push_back(dot / std::sqrt(static_cast<double>(dk)));
          }
          double denominator = 0.0;
          for (double score : scores) denominator += std::exp(score);
          for (size_t j = 0; j < scores.size(); ++j) {
            const double probability = std::exp(scores[j]) / denominator;
            const int64_t element = ((static_cast<int64_t>(b) * H + head) * Lq + t) * Lk +
                                    static_cast<int64_t>(j);
            (*probabilities)[element] = probability;
            double dropped = probability;
            if (shape.dropout > 0.0f) {
              const bool keep = dropout_keep(kDropoutKey.seed, kDropoutKey.site,
                                             kDropoutKey.step, kDropoutKey.stream,
                                             static_cast<uint64_t>(element), shape.dropout);
              dropped = keep ? probability / (1.0 - static_cast<double>(shape.dropout)) : 0.0;
            }
            for (int c = 0; c < dv; ++c) {
              out[(b * Lq + t) * H * dv + head * dv + c] +=
                  dropped * v()[(b * Lk + static_cast<int>(j)) * ldv + head * dv + c];
            }
          }
        }
      }
    }
    return out;
  }
};

std::vector<AttentionCase> attention_cases() {
  return {
      // name, B, h, Lq, Lk, d_k, d_v, causal, dropout, key_lengths, fused
      {"encoder_self_padded", 2, 3, 5, 5, 3, 3, false, 0.0f, {5, 3}, true},
      {"decoder_self_causal", 2, 2, 5, 5, 3, 3, true, 0.0f, {4, 5}, true},
      {"decoder_self_causal_dropout", 2, 2, 5, 5, 3, 3, true, 0.2f, {5, 3}, true},
      {"cross_dropout", 2, 2, 3, 5, 3, 4, false, 0.2f, {5, 2}, false},
      {"cross_no_dropout", 3, 1, 5, 3, 4, 3, false, 0.0f, {3, 1, 2}, false},
  };
}

TEST(Attention, SavedNumelIsBatchHeadsQueryKey) {
  AttentionShape shape;
  shape.batch = 3;
  shape.heads = 5;
  shape.query_len = 7;
  shape.key_len = 11;
  EXPECT_EQ(cpu::attention_saved_numel(shape), 3 * 5 * 7 * 11);
}

TEST(Attention, ForwardMatchesNaiveEvaluation) {
  std::mt19937 rng(42);
  // The cases, plus the plainest one: a single head, no mask, no dropout.
  std::vector<AttentionCase> cases = attention_cases();
  cases.push_back({"single_head", 1, 1, 3, 4, 2, 3, false, 0.0f, {4}, false});
  for (const AttentionCase& c : cases) {
    SCOPED_TRACE(c.name);
    const AttentionProblem problem(c, rng);
    Values saved, naive_probabilities;
    const Values out = problem.forward(&saved);
    const Values naive = problem.naive_forward(&naive_probabilities);
    for (size_t i = 0; i < out.size(); ++i) EXPECT_NEAR(out[i], naive[i], 1e-14) << i;
    for (size_t i = 0; i < saved.size(); ++i) {
      EXPECT_NEAR(saved[i], naive_probabilities[i], 1e-15) << i;
    }
  }
}

// Masked keys get probability exactly 0 and every query row is a distribution (the
// saved probabilities are those before dropout).
TEST(Attention, MaskedProbabilitiesAreZeroAndRowsSumToOne) {
  std::mt19937 rng(43);
  for (const AttentionCase& c : attention_cases()) {
    SCOPED_TRACE(c.name);
    const AttentionProblem problem(c, rng);
    Values saved;
    problem.forward(&saved);
    for (int b = 0; b < c.batch; ++b) {
      for (int head = 0; head < c.heads; ++head) {
        for (int t = 0; t < c.query_len; ++t) {
          const size_t row = ((static_cast<size_t>(b) * c.heads + head) * c.query_len + t) *
                             c.key_len;
          double sum = 0.0;
          for (int j = 0; j < c.key_len; ++j) {
            const bool masked = j >= c.key_lengths[b] || (c.causal && j > t);
            if (masked) {
              EXPECT_EQ(saved[row + j], 0.0) << b << "," << head << "," << t << "," << j;
            } else {
              EXPECT_GT(saved[row + j], 0.0) << b << "," << head << "," << t << "," << j;
            }
            sum += saved[row + j];
          }
          EXPECT_NEAR(sum, 1.0, 1e-14) << b << "," << head << "," << t;
        }
      }
    }
  }
}

// Attention dropout changes the output (some probabilities are dropped) but not the
// saved probabilities.
TEST(Attention, DropoutDropsSomeProbabilities) {
  std::mt19937 rng(44);
  AttentionCase c = attention_cases()[2];
  AttentionProblem with_dropout(c, rng);
  AttentionProblem without_dropout = with_dropout;
  without_dropout.shape.dropout = 0.0f;
  without_dropout.shape.key_lengths = without_dropout.config.key_lengths.data();
  Values saved_with, saved_without;
  const Values out_with = with_dropout.forward(&saved_with);
  const Values out_without = without_dropout.forward(&saved_without);
  EXPECT_EQ(saved_with, saved_without);
  EXPECT_GT(max_abs(difference(out_with, out_without)), 1e-3);
}

TEST(Attention, BackwardMatchesFiniteDifferencesAndAccumulates) {
  std::mt19937 rng(45);
  for (const AttentionCase& c : attention_cases()) {
    SCOPED_TRACE(c.name);
    AttentionProblem problem(c, rng);
    Values saved;
    problem.forward(&saved);
    const Values d_q_before = random_values(problem.q_buffer.size(), rng);
    const Values d_kv_before = random_values(problem.kv_buffer.size(), rng);
    Values d_q = d_q_before, d_kv = d_kv_before;
    problem.backward(d_q, d_kv, saved);
    const auto objective = [&] { return weighted_sum(problem.forward(), problem.weights); };
    expect_gradient_matches(c.name + " q buffer", problem.q_buffer,
                            difference(d_q, d_q_before), objective);
    if (!c.fused_qkv) {
      expect_gradient_matches(c.name + " kv buffer", problem.kv_buffer,
                              difference(d_kv, d_kv_before), objective);
    }
  }
}

TEST(Attention, NullGradientOutputsAreSkipped) {
  std::mt19937 rng(46);
  const AttentionProblem problem(attention_cases()[3], rng);
  Values saved;
  problem.forward(&saved);
  Values d_q(problem.q_buffer.size(), 0.0), d_kv(problem.kv_buffer.size(), 0.0);
  problem.backward(d_q, d_kv, saved);
  // Only dV: the V columns of d_kv match, everything else stays zero.
  Values d_v_only(problem.kv_buffer.size(), 0.0);
  cpu::attention_backward<double>(nullptr, nullptr, d_v_only.data() + problem.v_offset,
                                  problem.weights.data(), saved.data(), problem.q(),
                                  problem.ldq, problem.k(), problem.ldk, problem.v(),
                                  problem.ldv, problem.shape);
  for (size_t e = 0; e < d_kv.size(); ++e) {
    const bool is_v_column = (e % problem.ldv) >= problem.v_offset;
    EXPECT_EQ(d_v_only[e], is_v_column ? d_kv[e] : 0.0) << e;
  }
  // Only dQ.
  Values d_q_only(problem.q_buffer.size(), 0.0);
  cpu::attention_backward<double>(d_q_only.data(), nullptr, nullptr, problem.weights.data(),
                                  saved.data(), problem.q(), problem.ldq, problem.k(),
                                  problem.ldk, problem.v(), problem.ldv, problem.shape);
  for (size_t e = 0; e < d_q.size(); ++e) EXPECT_NEAR(d_q_only[e], d_q[e], 1e-15) << e;
}

// A padding sentence with no valid key (key length 0) yields zeros, not NaN, forward
// and backward.
TEST(Attention, SentenceWithoutKeysGivesZeros) {
  std::mt19937 rng(47);
  const AttentionProblem problem({"empty", 2, 2, 3, 4, 3, 2, false, 0.2f, {0, 4}, false},
                                 rng);
  Values saved;
  const Values out = problem.forward(&saved);
  const int row_width = 2 * 2;  // h * d_v
  for (size_t e = 0; e < out.size(); ++e) {
    ASSERT_TRUE(std::isfinite(out[e])) << e;
    if (e < static_cast<size_t>(3 * row_width)) {
      EXPECT_EQ(out[e], 0.0) << e;  // sentence 0
    }
  }
  EXPECT_GT(max_abs(out), 0.0);  // sentence 1 is not empty
  Values d_q(problem.q_buffer.size(), 0.0), d_kv(problem.kv_buffer.size(), 0.0);
  problem.backward(d_q, d_kv, saved);
  for (double g : d_q) ASSERT_TRUE(std::isfinite(g));
  for (double g : d_kv) ASSERT_TRUE(std::isfinite(g));
  for (int e = 0; e < 3 * problem.ldq; ++e) EXPECT_EQ(d_q[e], 0.0) << e;  // sentence 0's Q
  for (int e = 0; e < 4 * problem.ldk; ++e) EXPECT_EQ(d_kv[e], 0.0) << e;  // its K and V
}

// ---- ReLU, dropout, residual -----------------------------------------------------

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
  cpu::relu_backward<double>(dx.data(), weights.data(), y.data(), n);
  expect_gradient_matches("relu dx", x, difference(dx, dx_before),
                          [&] { return weighted_sum(forward(), weights); });
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
  cpu::dropout_backward<double>(dx.data(), x.data(), n, 0.0f, kDropoutKey);
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
  cpu::dropout_backward<double>(dx.data(), weights.data(), n, p, kDropoutKey);
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
                                         kDropoutKey);
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
                                         kDropoutKey);
  EXPECT_EQ(dx_only, dx);
}

// ---- cross-entropy and log-softmax -----------------------------------------------

struct CrossEntropyProblem {
  static constexpr int kRows = 7, kVocab = 9, kPad = 0;
  Values logits;
  // Rows 2 and 5 are padding (target == pad id 0).
  std::vector<int32_t> targets{3, 8, kPad, 1, 4, kPad, 7};
  explicit CrossEntropyProblem(std::mt19937& rng) : logits(random_values(kRows * kVocab, rng)) {
    for (double& z : logits) z *= 3.0;  // a spread of probabilities
  }
  LossSums run(Values* d_logits, float eps, float grad_scale) const {
    return cpu::softmax_cross_entropy<double>(d_logits ? d_logits->data() : nullptr,
                                              logits.data(), targets.data(), kRows, kVocab,
                                              eps, kPad, grad_scale);
  }
};

// -log softmax(z)_j evaluated directly from the definition.
double direct_negative_log_probability(const double* z, int vocab, int j) {
  double denominator = 0.0;
  for (int c = 0; c < vocab; ++c) denominator += std::exp(z[c]);
  return -std::log(std::exp(z[j]) / denominator);
}

TEST(CrossEntropy, WithoutSmoothingLossIsNegativeLogSoftmaxAtTarget) {
  std::mt19937 rng(61);
  const CrossEntropyProblem problem(rng);
  const LossSums sums = problem.run(nullptr, 0.0f, 1.0f);
  double expected = 0.0;
  for (int r = 0; r < CrossEntropyProblem::kRows; ++r) {
    if (problem.targets[r] == CrossEntropyProblem::kPad) continue;
    expected += direct_negative_log_probability(
        problem.logits.data() + r * CrossEntropyProblem::kVocab, CrossEntropyProblem::kVocab,
        problem.targets[r]);
  }
  EXPECT_NEAR(sums.loss, expected, 1e-13);
  EXPECT_NEAR(sums.nll, expected, 1e-13);
  EXPECT_EQ(sums.tokens, 5);
}

TEST(CrossEntropy, LabelSmoothingMatchesDirectComputation) {
  std::mt19937 rng(62);
  const CrossEntropyProblem problem(rng);
  const float eps = 0.1f;
  const LossSums sums = problem.run(nullptr, eps, 1.0f);
  // loss_r = -sum_j q_j log p_j with q = (1 - eps) onehot(t) + eps / V.
  double expected_loss = 0.0, expected_nll = 0.0;
  constexpr int kVocab = CrossEntropyProblem::kVocab;
  for (int r = 0; r < CrossEntropyProblem::kRows; ++r) {
    const int target = problem.targets[r];
    if (target == CrossEntropyProblem::kPad) continue;
    const double* z = problem.logits.data() + r * kVocab;
    for (int j = 0; j < kVocab; ++j) {
      const double q = (j == target ? 1.0 - eps : 0.0) + static_cast<double>(eps) / kVocab;
      expected_loss += q * direct_negative_log_probability(z, kVocab, j);
    }
    expected_nll += direct_negative_log_probability(z, kVocab, target);
  }
  EXPECT_NEAR(sums.loss, expected_loss, 1e-13);
  EXPECT_NEAR(sums.nll, expected_nll, 1e-13);
  EXPECT_GT(sums.loss - sums.nll, 1e-3);  // smoothing changes the loss, not the nll
  EXPECT_EQ(sums.tokens, 5);
}

TEST(CrossEntropy, GradientMatchesFiniteDifferencesWithPadRows) {
  std::mt19937 rng(63);
  CrossEntropyProblem problem(rng);
  const float eps = 0.1f, grad_scale = 0.37f;
  // d_logits is written, not accumulated: garbage before must not survive, and pad rows
  // must become exactly 0.
  Values d_logits = random_values(problem.logits.size(), rng);
  problem.run(&d_logits, eps, grad_scale);
  constexpr int kVocab = CrossEntropyProblem::kVocab;
  for (int r = 0; r < CrossEntropyProblem::kRows; ++r) {
    if (problem.targets[r] != CrossEntropyProblem::kPad) continue;
    for (int j = 0; j < kVocab; ++j) EXPECT_EQ(d_logits[r * kVocab + j], 0.0) << r << "," << j;
  }
  // The gradient of grad_scale * sum_r loss_r.
  expect_gradient_matches("d_logits", problem.logits, d_logits, [&] {
    return static_cast<double>(grad_scale) * problem.run(nullptr, eps, grad_scale).loss;
  });
}

TEST(CrossEntropy, GradientMayOverwriteTheLogits) {
  std::mt19937 rng(64);
  const CrossEntropyProblem problem(rng);
  Values separate(problem.logits.size());
  const LossSums expected = problem.run(&separate, 0.1f, 0.5f);
  Values in_place = problem.logits;
  const LossSums sums = cpu::softmax_cross_entropy<double>(
      in_place.data(), in_place.data(), problem.targets.data(), CrossEntropyProblem::kRows,
      CrossEntropyProblem::kVocab, 0.1f, CrossEntropyProblem::kPad, 0.5f);
  EXPECT_EQ(in_place, separate);
  EXPECT_EQ(sums.loss, expected.loss);
  EXPECT_EQ(sums.nll, expected.nll);
  EXPECT_EQ(sums.tokens, expected.tokens);
}

TEST(CrossEntropy, RejectsTargetOutsideVocabulary) {
  std::mt19937 rng(65);
  CrossEntropyProblem problem(rng);
  problem.targets[1] = CrossEntropyProblem::kVocab;
  EXPECT_THROW(problem.run(nullptr, 0.1f, 1.0f), Error);
}

TEST(LogSoftmax, MatchesDirectFormulaIsStableAndMayAlias) {
  std::mt19937 rng(66);
  const int rows = 3, vocab = 11;
  const Values logits = random_values(rows * vocab, rng);
  Values log_probs(rows * vocab);
  cpu::log_softmax<double>(log_probs.data(), logits.data(), rows, vocab);
  for (int r = 0; r < rows; ++r) {
    for (int j = 0; j < vocab; ++j) {
      EXPECT_NEAR(log_probs[r * vocab + j],
                  -direct_negative_log_probability(logits.data() + r * vocab, vocab, j), 1e-14);
    }
  }
  // Shifting a row by 1000 (exp would overflow without the max subtraction) leaves the
  // log-probabilities unchanged; and the op may write over its input.
  Values shifted = logits;
  for (double& z : shifted) z += 1000.0;
  cpu::log_softmax<double>(shifted.data(), shifted.data(), rows, vocab);
  for (size_t e = 0; e < shifted.size(); ++e) EXPECT_NEAR(shifted[e], log_probs[e], 1e-12) << e;
}

// ---- Adam --------------------------------------------------------------------------

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

// ---- float vs double -------------------------------------------------------------

// Runs every op in instantiation T on the same (double-generated) inputs and returns
// the outputs, named, as doubles.
template <typename T>
std::vector<std::pair<std::string, Values>> run_every_op(std::mt19937::result_type seed) {
  std::mt19937 rng(seed);
  std::vector<std::pair<std::string, Values>> results;
  const auto record = [&](const std::string& name, const std::vector<T>& values) {
    results.emplace_back(name, to_double(values));
  };
  const auto random_t = [&](size_t count) { return cast_to<T>(random_values(count, rng)); };

  // Embedding.
  {
    const int vocab = 23, d = 16, length = 5, rows = 15;
    std::vector<int32_t> tokens(rows);
    for (int r = 0; r < rows; ++r) tokens[r] = static_cast<int32_t>((r * 7 + 3) % vocab);
    const std::vector<T> table = random_t(vocab * d), positions = random_t(length * d);
    const std::vector<T> d_out = random_t(rows * d);
    std::vector<T> out(rows * d), d_table(vocab * d, T(0)), d_positions(length * d, T(0));
    cpu::embedding_forward<T>(out.data(), tokens.data(), table.data(), positions.data(), rows,
                              length, d, vocab, T(4));
    cpu::embedding_backward<T>(d_table.data(), d_positions.data(), d_out.data(), tokens.data(),
                               rows, length, d, vocab, T(4));
    record("embedding out", out);
    record("embedding d_table", d_table);
    record("embedding d_positions", d_positions);
    std::vector<T> sinusoids(length * d);
    cpu::sinusoidal_positions<T>(sinusoids.data(), length, d);
    record("sinusoidal", sinusoids);
  }
  // Linear and output projection.
  {
    const int M = 9, K = 33, N = 17;
    const std::vector<T> x = random_t(M * K), W = random_t(K * N), b = random_t(N);
    const std::vector<T> dy = random_t(M * N);
    std::vector<T> y(M * N), dx(M * K, T(0)), dW(K * N, T(0)), db(N, T(0));
    cpu::linear_forward<T>(y.data(), x.data(), W.data(), b.data(), M, K, N);
    cpu::linear_backward<T>(dx.data(), dW.data(), db.data(), dy.data(), x.data(), W.data(), M,
                            K, N);
    record("linear y", y);
    record("linear dx", dx);
    record("linear dW", dW);
    record("linear db", db);
    const int vocab = 29;
    const std::vector<T> E = random_t(vocab * K), d_logits = random_t(M * vocab);
    std::vector<T> logits(M * vocab), dh(M * K, T(0)), dE(vocab * K, T(0));
    cpu::output_projection_forward<T>(logits.data(), x.data(), E.data(), M, K, vocab);
    cpu::output_projection_backward<T>(dh.data(), dE.data(), d_logits.data(), x.data(),
                                       E.data(), M, K, vocab);
    record("projection logits", logits);
    record("projection dh", dh);
    record("projection dE", dE);
  }
  // Layer norm.
  {
    const int rows = 7, d = 33;
    const std::vector<T> x = random_t(rows * d), gamma = random_t(d), beta = random_t(d);
    const std::vector<T> dy = random_t(rows * d);
    std::vector<T> y(rows * d), mean(rows), rstd(rows);
    std::vector<T> dx(rows * d, T(0)), dgamma(d, T(0)), dbeta(d, T(0));
    cpu::layernorm_forward<T>(y.data(), mean.data(), rstd.data(), x.data(), gamma.data(),
                              beta.data(), rows, d, T(1e-6));
    cpu::layernorm_backward<T>(dx.data(), dgamma.data(), dbeta.data(), dy.data(), x.data(),
                               mean.data(), rstd.data(), gamma.data(), rows, d);
    record("layernorm y", y);
    record("layernorm mean", mean);
    record("layernorm rstd", rstd);
    record("layernorm dx", dx);
    record("layernorm dgamma", dgamma);
    record("layernorm dbeta", dbeta);
  }
  // Attention: fused self-attention, causal, padded, with dropout.
  {
    const std::vector<int32_t> key_lengths{9, 6};
    AttentionShape shape;
    shape.batch = 2;
    shape.heads = 3;
    shape.query_len = 9;
    shape.key_len = 9;
    shape.d_k = 8;
    shape.d_v = 8;
    shape.causal = true;
    shape.key_lengths = key_lengths.data();
    shape.dropout = 0.1f;
    shape.dropout_key = kDropoutKey;
    const int ld = 3 * shape.heads * shape.d_k, rows = shape.batch * shape.query_len;
    const int kw = shape.heads * shape.d_k;
    const std::vector<T> qkv = random_t(rows * ld), d_out = random_t(rows * kw);
    std::vector<T> out(rows * kw), saved(cpu::attention_saved_numel(shape));
    std::vector<T> d_qkv(rows * ld, T(0));
    cpu::attention_forward<T>(out.data(), saved.data(), qkv.data(), ld, qkv.data() + kw, ld,
                              qkv.data() + 2 * kw, ld, shape);
    cpu::attention_backward<T>(d_qkv.data(), d_qkv.data() + kw, d_qkv.data() + 2 * kw,
                               d_out.data(), saved.data(), qkv.data(), ld, qkv.data() + kw, ld,
                               qkv.data() + 2 * kw, ld, shape);
    record("attention out", out);
    record("attention saved", saved);
    record("attention d_qkv", d_qkv);
  }
  // Elementwise.
  {
    const int64_t n = 101;
    const std::vector<T> x = random_t(n), sub = random_t(n), dy = random_t(n);
    std::vector<T> relu(n), d_relu(n, T(0)), dropped(n), d_dropped(n, T(0));
    std::vector<T> residual(n), d_x(n, T(0)), d_sub(n, T(0));
    cpu::relu_forward<T>(relu.data(), x.data(), n);
    cpu::relu_backward<T>(d_relu.data(), dy.data(), relu.data(), n);
    cpu::dropout_forward<T>(dropped.data(), x.data(), n, 0.1f, kDropoutKey);
    cpu::dropout_backward<T>(d_dropped.data(), dy.data(), n, 0.1f, kDropoutKey);
    cpu::residual_dropout_forward<T>(residual.data(), x.data(), sub.data(), n, 0.1f,
                                     kDropoutKey);
    cpu::residual_dropout_backward<T>(d_x.data(), d_sub.data(), dy.data(), n, 0.1f,
                                      kDropoutKey);
    record("relu", relu);
    record("relu dx", d_relu);
    record("dropout", dropped);
    record("dropout dx", d_dropped);
    record("residual", residual);
    record("residual dx", d_x);
    record("residual d_sub", d_sub);
  }
  // Cross-entropy and log-softmax.
  {
    const int rows = 7, vocab = 97, pad = 0;
    const std::vector<int32_t> targets{5, 0, 96, 1, 50, 0, 33};
    std::vector<T> logits = random_t(rows * vocab);
    for (T& z : logits) z *= T(4);
    std::vector<T> d_logits(rows * vocab), log_probs(rows * vocab);
    const LossSums sums = cpu::softmax_cross_entropy<T>(d_logits.data(), logits.data(),
                                                        targets.data(), rows, vocab, 0.1f, pad,
                                                        0.25f);
    cpu::log_softmax<T>(log_probs.data(), logits.data(), rows, vocab);
    record("cross-entropy d_logits", d_logits);
    results.emplace_back("cross-entropy sums",
                         Values{sums.loss, sums.nll, static_cast<double>(sums.tokens)});
    record("log_softmax", log_probs);
  }
  // Adam, paper hyperparameters (§5.3), three steps.
  {
    const int64_t n = 31;
    std::vector<T> params = random_t(n), m(n, T(0)), v(n, T(0));
    for (int64_t step = 1; step <= 3; ++step) {
      const std::vector<T> grads = random_t(n);
      cpu::adam_update<T>(params.data(), grads.data(), m.data(), v.data(), n, 1e-3f, 0.9f,
                          0.98f, 1e-9f, step);
    }
    record("adam params", params);
    record("adam m", m);
    record("adam v", v);
  }
  return results;
}

TEST(FloatVsDouble, InstantiationsAgree) {
  const auto from_float = run_every_op<float>(71);
  const auto from_double = run_every_op<double>(71);
  ASSERT_EQ(from_float.size(), from_double.size());
  for (size_t i = 0; i < from_double.size(); ++i) {
    ASSERT_EQ(from_float[i].first, from_double[i].first);
    expect_close_float_double(from_double[i].first, from_float[i].second,
                              from_double[i].second);
  }
}

}  // namespace
}  // namespace thpc

namespace thpc {
namespace {

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

}  // namespace
}  // namespace thpc
