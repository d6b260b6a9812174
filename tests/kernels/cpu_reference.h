// Helpers of the CPU reference tests (tests/kernels/<op>_test.cc). The CPU ops
// (kernels/cpu) are the specification every other backend is checked against, so each
// op is checked against first principles:
//
// * Every backward is compared with central finite differences of a scalar objective
//   L = sum(out * R) (R a fixed random tensor, so dL/dout = R) in the double
//   instantiation. Gradient buffers are pre-filled with random values before backward
//   and the analytic gradient is read as (after - before), which checks the
//   accumulate-into-gradients rule of kernels/ops.h for every op at the same time.
// * Forwards are compared with direct, naive evaluations of their formulas.
// * The float instantiation is compared with the double one.
// All inputs are random and non-zero (std::mt19937 with fixed seeds), sizes are odd.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "kernels/ops.h"

namespace thpc::cpu_test {

using Values = std::vector<double>;

// Uniform in [-1, 1]: never exactly zero in practice, and mixed signs.
inline Values random_values(size_t count, std::mt19937& rng) {
  std::uniform_real_distribution<double> uniform(-1.0, 1.0);
  Values values(count);
  for (double& value : values) value = uniform(rng);
  return values;
}

// Magnitude in [min_abs, 1] with a random sign: for inputs that must stay away from a
// kink (ReLU at 0), so that x +- h never crosses it.
inline Values random_away_from_zero(size_t count, std::mt19937& rng, double min_abs) {
  std::uniform_real_distribution<double> magnitude(min_abs, 1.0);
  std::bernoulli_distribution negative(0.5);
  Values values(count);
  for (double& value : values) value = negative(rng) ? -magnitude(rng) : magnitude(rng);
  return values;
}

// The scalar objective L = sum_i out_i * weights_i.
inline double weighted_sum(const Values& out, const Values& weights) {
  EXPECT_EQ(out.size(), weights.size());
  double sum = 0.0;
  for (size_t i = 0; i < out.size(); ++i) sum += out[i] * weights[i];
  return sum;
}

inline Values difference(const Values& after, const Values& before) {
  Values diff(after.size());
  for (size_t i = 0; i < after.size(); ++i) diff[i] = after[i] - before[i];
  return diff;
}

inline double max_abs(const Values& values) {
  double largest = 0.0;
  for (double value : values) largest = std::max(largest, std::abs(value));
  return largest;
}

template <typename T>
std::vector<T> cast_to(const Values& values) {
  return std::vector<T>(values.begin(), values.end());
}

template <typename T>
inline Values to_double(const std::vector<T>& values) {
  return Values(values.begin(), values.end());
}

// Bitwise equality of two vectors of T (signed zeros and NaN bits included): a fused op
// against the separate ops it replaces.
template <typename T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

// Finite-difference step and tolerance. In double precision the central difference
// (L(x+h) - L(x-h)) / 2h has truncation error O(h^2) * L''' ~ 1e-12 and rounding error
// ~ eps * |L| / h ~ 1e-16 * 10 / 1e-6 ~ 1e-9 for the |L| <= ~10 of these tests, so an
// absolute 1e-7 plus relative 1e-6 separates a correct gradient (agreement to ~1e-9)
// from any wrong term (the gradients themselves are O(0.1..1)).
inline constexpr double kStep = 1e-6;
inline constexpr double kAbsTolerance = 1e-7;
inline constexpr double kRelTolerance = 1e-6;

// Compares analytic[i] with the central difference of objective() in x[i], for every i.
// x is perturbed in place and restored. The gradient must not be identically zero,
// so a backward that does nothing cannot pass against an objective that ignores x.
inline void expect_gradient_matches(const std::string& what, Values& x, const Values& analytic,
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
inline void expect_close_float_double(const std::string& what, const Values& from_float,
                                      const Values& from_double) {
  ASSERT_EQ(from_float.size(), from_double.size()) << what;
  ASSERT_FALSE(from_double.empty()) << what;
  for (size_t i = 0; i < from_double.size(); ++i) {
    EXPECT_NEAR(from_float[i], from_double[i], 1e-5 + 1e-4 * std::abs(from_double[i]))
        << what << "[" << i << "]";
  }
}

inline constexpr DropoutKey kDropoutKey{/*seed=*/0x123456789abcdefULL, /*step=*/7, /*stream=*/2,
                                        /*site=*/5};

}  // namespace thpc::cpu_test
