// The dense layer and the tied output projection (kernels/cpu/linear.cc,
// kernels/cuda/linear.cu): the CPU reference against direct products and central finite
// differences (cpu_reference.h), then the CUDA twins.
// The CUDA twins run the op on the GPU and on the CPU reference backend (tests/cuda_twin.h)
// in fp32 and bf16; without a GPU (or in a CPU-only build) they report SKIPPED.
//
// Inputs are random and non-zero; the CPU gets the inputs as the GPU tensors hold them
// (`representable`), so only the GPU op's own arithmetic and output rounding differ.
// Gradient outputs are pre-filled with random values, checking the += rule.
//
// Tolerances, per element, relative to the magnitude the result is made of:
// * GEMMs: |gpu - cpu| <= (u_out + L * 2^-23) * (|prefill| + sum_l |a_il| |b_lj|), L the
//   reduction length. L * 2^-23 bounds the difference of two fp32 summation orders
//   (cuBLAS vs OpenBLAS: each is within ~L*eps of the exact sum in the worst case, the
//   typical error ~ sqrt(L)*eps is far smaller); u_out is the rounding of the stored
//   result: 0 for fp32 outputs, 2^-8 (half a bf16 ulp, relative) for bf16 outputs.
//   Products of bf16 inputs are exact in fp32, so bf16 inputs add nothing else.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "cpu_reference.h"
#include "cuda_twin.h"
#include "kernels/cpu/cpu_ops.h"

namespace thpc::cpu_test {
namespace {

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
                               LinearProblem::kK, LinearProblem::kN, GradStore::kAdd);
  const auto objective = [&] { return weighted_sum(problem.forward(), problem.weights); };
  expect_gradient_matches("dx", problem.x, difference(dx, dx_before), objective);
  expect_gradient_matches("dW", problem.W, difference(dW, dW_before), objective);
  expect_gradient_matches("db", problem.b, difference(db, db_before), objective);

  // Accumulate: a second backward into the same buffers adds the same gradient again.
  Values dx_twice = dx;
  cpu::linear_backward<double>(dx_twice.data(), nullptr, nullptr, problem.weights.data(),
                               problem.x.data(), problem.W.data(), LinearProblem::kM,
                               LinearProblem::kK, LinearProblem::kN, GradStore::kAdd);
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
                               LinearProblem::kM, LinearProblem::kK, LinearProblem::kN,
                               GradStore::kAdd);
  Values dW_only(problem.W.size(), 0.0), db_only(problem.b.size(), 0.0);
  cpu::linear_backward<double>(nullptr, dW_only.data(), nullptr, problem.weights.data(),
                               problem.x.data(), problem.W.data(), LinearProblem::kM,
                               LinearProblem::kK, LinearProblem::kN, GradStore::kAdd);
  cpu::linear_backward<double>(nullptr, nullptr, db_only.data(), problem.weights.data(),
                               problem.x.data(), problem.W.data(), LinearProblem::kM,
                               LinearProblem::kK, LinearProblem::kN, GradStore::kAdd);
  EXPECT_EQ(dW_only, dW_all);
  EXPECT_EQ(db_only, db_all);
}

// ---- the FFN's bias + ReLU fused with its layer (linear_relu_forward, relu_bias_backward)

// The fused forward against the two ops it replaces, linear_forward then relu_forward.
template <typename T>
void expect_linear_relu_is_linear_then_relu(int M, int K, int N, bool bias, uint32_t seed) {
  SCOPED_TRACE(::testing::Message() << "M=" << M << " K=" << K << " N=" << N << " bias=" << bias
                                    << " " << sizeof(T) * 8 << "-bit");
  std::mt19937 rng(seed);
  const auto x = cast_to<T>(random_values(size_t(M) * K, rng));
  const auto W = cast_to<T>(random_values(size_t(K) * N, rng));
  const auto b = cast_to<T>(random_values(size_t(N), rng));
  std::vector<T> fused(size_t(M) * N, T(99)), unfused(size_t(M) * N, T(-99));
  cpu::linear_relu_forward<T>(fused.data(), x.data(), W.data(), bias ? b.data() : nullptr, M, K,
                              N);
  cpu::linear_forward<T>(unfused.data(), x.data(), W.data(), bias ? b.data() : nullptr, M, K, N);
  cpu::relu_forward<T>(unfused.data(), unfused.data(), int64_t(M) * N);
  EXPECT_TRUE(same_bits(fused, unfused));
  EXPECT_GT(std::count(fused.begin(), fused.end(), T(0)), 0) << "no ReLU at work";
}

// K = 1000 is longer than OpenBLAS's K blocks (the product is then summed in pieces, so
// adding the bias after it would round differently), 300 x 257 spreads over the threads.
TEST(LinearRelu, ForwardIsLinearThenReluBitForBit) {
  uint32_t seed = 2000;
  for (bool bias : {true, false}) {
    expect_linear_relu_is_linear_then_relu<float>(5, 7, 3, bias, seed++);
    expect_linear_relu_is_linear_then_relu<float>(300, 1000, 257, bias, seed++);
    expect_linear_relu_is_linear_then_relu<double>(5, 7, 3, bias, seed++);
    expect_linear_relu_is_linear_then_relu<double>(33, 1000, 65, bias, seed++);
  }
}

// relu_bias_backward into a zeroed d_pre (as the model calls it) against relu_backward
// into a zeroed buffer and linear_backward's bias sums of that buffer; with one output
// null, the other as with both.
template <typename T>
void expect_relu_bias_backward_is_the_unfused_ops(int rows, int n, uint32_t seed) {
  SCOPED_TRACE(::testing::Message() << "rows=" << rows << " n=" << n << " "
                                    << sizeof(T) * 8 << "-bit");
  std::mt19937 rng(seed);
  const auto dy = cast_to<T>(random_values(size_t(rows) * n, rng));
  auto y = cast_to<T>(random_values(size_t(rows) * n, rng));
  for (T& value : y) value = value > T(0) ? value : T(0);  // a ReLU's output: half zeros
  const auto db0 = cast_to<T>(random_values(size_t(n), rng));
  std::vector<T> d_pre(size_t(rows) * n, T(0)), db = db0;
  cpu::relu_bias_backward<T>(d_pre.data(), db.data(), dy.data(), y.data(), rows, n,
                             GradStore::kAdd);
  std::vector<T> d_pre_unfused(size_t(rows) * n, T(0)), db_unfused = db0;
  cpu::relu_backward<T>(d_pre_unfused.data(), dy.data(), y.data(), int64_t(rows) * n,
                        GradStore::kAdd);
  cpu::linear_backward<T>(nullptr, nullptr, db_unfused.data(), d_pre_unfused.data(), nullptr,
                          nullptr, rows, /*K=*/1, n, GradStore::kAdd);
  EXPECT_TRUE(same_bits(d_pre, d_pre_unfused)) << "d_pre";
  EXPECT_TRUE(same_bits(db, db_unfused)) << "db";
  std::vector<T> d_pre_only(size_t(rows) * n, T(0)), db_only = db0;
  cpu::relu_bias_backward<T>(d_pre_only.data(), nullptr, dy.data(), y.data(), rows, n,
                             GradStore::kAdd);
  cpu::relu_bias_backward<T>(nullptr, db_only.data(), dy.data(), y.data(), rows, n,
                             GradStore::kAdd);
  EXPECT_TRUE(same_bits(d_pre_only, d_pre)) << "d_pre alone";
  EXPECT_TRUE(same_bits(db_only, db)) << "db alone";
}

TEST(ReluBiasBackward, IsReluBackwardThenTheBiasSumsBitForBit) {
  uint32_t seed = 2100;
  for (const auto& [rows, n] : {std::pair{5, 3}, std::pair{1, 37}, std::pair{300, 257},
                                std::pair{64, 1024}}) {
    expect_relu_bias_backward_is_the_unfused_ops<float>(rows, n, seed++);
    expect_relu_bias_backward_is_the_unfused_ops<double>(rows, n, seed++);
  }
}

// The layer y = max(0, x W + b) differentiated by the two fused-path ops: relu_bias_backward
// (d_pre and db) then linear_backward of d_pre (dx and dW), against central differences of
// L = sum(y * R); the outputs pre-filled, so the += rule is checked too.
TEST(LinearRelu, BackwardMatchesFiniteDifferencesAndAccumulates) {
  std::mt19937 rng(2200);
  LinearProblem problem(rng);
  constexpr int kM = LinearProblem::kM, kK = LinearProblem::kK, kN = LinearProblem::kN;
  const auto forward = [&] {
    Values y(kM * kN, 99.0);
    cpu::linear_relu_forward<double>(y.data(), problem.x.data(), problem.W.data(),
                                     problem.b.data(), kM, kK, kN);
    return y;
  };
  // No pre-activation within reach of the step of its kink: the objective is smooth here.
  Values pre(kM * kN);
  cpu::linear_forward<double>(pre.data(), problem.x.data(), problem.W.data(), problem.b.data(),
                              kM, kK, kN);
  int negative = 0;
  for (double value : pre) {
    ASSERT_GT(std::abs(value), 1e-3);
    negative += value < 0;
  }
  ASSERT_GT(negative, 0) << "the ReLU must cut something";
  const Values y = forward();
  const Values d_pre0 = random_values(y.size(), rng);
  const Values db0 = random_values(problem.b.size(), rng);
  const Values dx0 = random_values(problem.x.size(), rng);
  const Values dW0 = random_values(problem.W.size(), rng);
  Values d_pre = d_pre0, db = db0, dx = dx0, dW = dW0;
  cpu::relu_bias_backward<double>(d_pre.data(), db.data(), problem.weights.data(), y.data(), kM,
                                  kN, GradStore::kAdd);
  const Values g = difference(d_pre, d_pre0);  // d_pre accumulated this call's gradient
  cpu::linear_backward<double>(dx.data(), dW.data(), nullptr, g.data(), problem.x.data(),
                               problem.W.data(), kM, kK, kN, GradStore::kAdd);
  const auto objective = [&] { return weighted_sum(forward(), problem.weights); };
  expect_gradient_matches("dx", problem.x, difference(dx, dx0), objective);
  expect_gradient_matches("dW", problem.W, difference(dW, dW0), objective);
  expect_gradient_matches("db", problem.b, difference(db, db0), objective);
}

// ---- the FFN's second layer's backward with the ReLU's (linear_relu_backward) --------

// linear_relu_backward against what it composes (linear_backward writing d_pre, then
// relu_backward's select in place), bit for bit, dW and db pre-filled; and
// linear_relu_mask_forward is linear_relu_forward (the CPU keeps no mask).
template <typename T>
void expect_linear_relu_backward_is_the_layer_then_the_relu(int M, int K, int N, uint32_t seed) {
  SCOPED_TRACE(::testing::Message() << "M=" << M << " K=" << K << " N=" << N << " "
                                    << sizeof(T) * 8 << "-bit");
  std::mt19937 rng(seed);
  auto y = cast_to<T>(random_values(size_t(M) * K, rng));
  for (T& value : y) value = value > T(0) ? value : T(0);  // a ReLU's output
  const auto W = cast_to<T>(random_values(size_t(K) * N, rng));
  const auto dy = cast_to<T>(random_values(size_t(M) * N, rng));
  const auto dW0 = cast_to<T>(random_values(size_t(K) * N, rng));
  const auto db0 = cast_to<T>(random_values(size_t(N), rng));
  std::vector<T> d_pre(size_t(M) * K, T(7)), dW = dW0, db = db0;
  cpu::linear_relu_backward<T>(d_pre.data(), dW.data(), db.data(), dy.data(), y.data(), nullptr,
                               W.data(), M, K, N);
  std::vector<T> expected(size_t(M) * K, T(-3)), dW_expected = dW0, db_expected = db0;
  cpu::linear_backward<T>(expected.data(), dW_expected.data(), db_expected.data(), dy.data(),
                          y.data(), W.data(), M, K, N, GradStore::kWrite);
  cpu::relu_backward<T>(expected.data(), expected.data(), y.data(), int64_t(M) * K,
                        GradStore::kWrite);
  EXPECT_TRUE(same_bits(d_pre, expected)) << "d_pre";
  EXPECT_TRUE(same_bits(dW, dW_expected)) << "dW";
  EXPECT_TRUE(same_bits(db, db_expected)) << "db";
  size_t zeros = 0;
  for (size_t i = 0; i < y.size(); ++i) zeros += y[i] > T(0) ? 0 : (d_pre[i] == T(0) ? 1 : 0);
  EXPECT_GT(zeros, 0u) << "the ReLU must cut something";

  const auto x = cast_to<T>(random_values(size_t(M) * N, rng));
  const auto W1 = cast_to<T>(random_values(size_t(N) * K, rng));
  const auto b1 = cast_to<T>(random_values(size_t(K), rng));
  std::vector<T> kept(size_t(M) * K), plain(size_t(M) * K);
  uint32_t unused_mask[4] = {};
  cpu::linear_relu_mask_forward<T>(kept.data(), unused_mask, x.data(), W1.data(), b1.data(), M,
                                   N, K);
  cpu::linear_relu_forward<T>(plain.data(), x.data(), W1.data(), b1.data(), M, N, K);
  EXPECT_TRUE(same_bits(kept, plain)) << "linear_relu_mask_forward";
}

TEST(LinearReluBackward, IsTheLayersBackwardThenTheReluBitForBit) {
  uint32_t seed = 2600;
  for (const auto& [M, K, N] : {std::tuple{5, 7, 3}, std::tuple{1, 37, 61},
                                std::tuple{33, 256, 64}}) {
    expect_linear_relu_backward_is_the_layer_then_the_relu<float>(M, K, N, seed++);
    expect_linear_relu_backward_is_the_layer_then_the_relu<double>(M, K, N, seed++);
  }
}

// The FFN, out = max(0, x W1 + b1) W2 + b2 (§3.3), differentiated through the masked ops:
// linear_relu_backward (d_pre, dW2, db2) then the first layer's linear_backward of d_pre
// (dx, dW1, db1), against central differences of L = sum(out * R); outputs pre-filled but
// d_pre (written), so the += rule is checked too.
TEST(LinearReluBackward, FfnMatchesFiniteDifferencesAndAccumulates) {
  std::mt19937 rng(2700);
  constexpr int kM = 5, kD = 4, kF = 6;
  Values x = random_values(kM * kD, rng), W1 = random_values(kD * kF, rng),
         b1 = random_values(kF, rng), W2 = random_values(kF * kD, rng),
         b2 = random_values(kD, rng);
  const Values weights = random_values(kM * kD, rng);
  const auto hidden_of = [&] {
    Values hidden(kM * kF, 99.0);
    cpu::linear_relu_mask_forward<double>(hidden.data(), nullptr, x.data(), W1.data(),
                                          b1.data(), kM, kD, kF);
    return hidden;
  };
  const auto forward = [&] {
    const Values hidden = hidden_of();
    Values out(kM * kD, 99.0);
    cpu::linear_forward<double>(out.data(), hidden.data(), W2.data(), b2.data(), kM, kF, kD);
    return out;
  };
  // No pre-activation within reach of the step of its kink: the objective is smooth here.
  Values pre(kM * kF);
  cpu::linear_forward<double>(pre.data(), x.data(), W1.data(), b1.data(), kM, kD, kF);
  int negative = 0;
  for (double value : pre) {
    ASSERT_GT(std::abs(value), 1e-3);
    negative += value < 0;
  }
  ASSERT_GT(negative, 0) << "the ReLU must cut something";
  const Values hidden = hidden_of();
  const Values dx0 = random_values(x.size(), rng), dW1_0 = random_values(W1.size(), rng),
               db1_0 = random_values(b1.size(), rng), dW2_0 = random_values(W2.size(), rng),
               db2_0 = random_values(b2.size(), rng);
  Values d_pre(kM * kF, 99.0), dx = dx0, dW1 = dW1_0, db1 = db1_0, dW2 = dW2_0, db2 = db2_0;
  cpu::linear_relu_backward<double>(d_pre.data(), dW2.data(), db2.data(), weights.data(),
                                    hidden.data(), nullptr, W2.data(), kM, kF, kD);
  cpu::linear_backward<double>(dx.data(), dW1.data(), db1.data(), d_pre.data(), x.data(),
                               W1.data(), kM, kD, kF, GradStore::kAdd);
  const auto objective = [&] { return weighted_sum(forward(), weights); };
  expect_gradient_matches("dx", x, difference(dx, dx0), objective);
  expect_gradient_matches("dW1", W1, difference(dW1, dW1_0), objective);
  expect_gradient_matches("db1", b1, difference(db1, db1_0), objective);
  expect_gradient_matches("dW2", W2, difference(dW2, dW2_0), objective);
  expect_gradient_matches("db2", b2, difference(db2, db2_0), objective);
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
                                          OutputProjectionProblem::kVocab, GradStore::kAdd);
  const auto objective = [&] { return weighted_sum(problem.forward(), problem.weights); };
  expect_gradient_matches("dh", problem.h, difference(dh, dh_before), objective);
  expect_gradient_matches("dE", problem.E, difference(dE, dE_before), objective);
}

}  // namespace
}  // namespace thpc::cpu_test

namespace thpc::test {
namespace {

// scale[i*N + j] = |prefill[i*N + j]| + sum_l |a(i, l)| |b(l, j)| with a(i, l) =
// a[i*a_row + l*a_col] and b(l, j) = b[l*b_row + j*b_col]: the magnitude of C += A B.
std::vector<double> product_scale(int rows, int cols, int inner, const std::vector<float>& a,
                                  int64_t a_row, int64_t a_col, const std::vector<float>& b,
                                  int64_t b_row, int64_t b_col,
                                  const std::vector<float>* prefill) {
  std::vector<double> scale(static_cast<size_t>(rows) * cols, 0.0);
  for (int i = 0; i < rows; ++i) {
    for (int j = 0; j < cols; ++j) {
      double sum = prefill != nullptr ? std::abs((*prefill)[static_cast<size_t>(i) * cols + j])
                                      : 0.0;
      for (int l = 0; l < inner; ++l) {
        sum += std::abs(static_cast<double>(a[i * a_row + l * a_col])) *
               std::abs(static_cast<double>(b[l * b_row + j * b_col]));
      }
      scale[static_cast<size_t>(i) * cols + j] = sum;
    }
  }
  return scale;
}

// Tolerance factor of a GEMM with reduction length `inner` and output dtype `out`.
double gemm_factor(int inner, DType out) {
  return output_rounding(out) + (inner + 1) * kEps32;
}

// Sets THPC_GEMM_FALLBACK=1 (cublasGemmEx instead of cuBLASLt) for its lifetime.
class ForceGemmFallback {
 public:
  ForceGemmFallback() { setenv("THPC_GEMM_FALLBACK", "1", 1); }
  ~ForceGemmFallback() { unsetenv("THPC_GEMM_FALLBACK"); }
  ForceGemmFallback(const ForceGemmFallback&) = delete;
  ForceGemmFallback& operator=(const ForceGemmFallback&) = delete;
};

struct LinearShape {
  int M, K, N;
};

// Odd sizes, M = 1, N not a multiple of 8, a K = 0 (empty product: y = b), a larger one.
const std::vector<LinearShape> kLinearShapes = {
    {1, 37, 61}, {5, 129, 7}, {17, 64, 100}, {3, 0, 5}, {33, 512, 129}, {128, 256, 512}};

// bias_offset > 0 places the bias that many elements into its buffer: a slice of the
// flat parameter buffer that is not 16-byte aligned. relu: linear_relu_forward instead
// (the ReLU moves no value further from the CPU's than its input was: the same bound).
void check_linear_forward(DType dtype, const LinearShape& s, bool bias, uint32_t seed,
                          int bias_offset = 0, bool relu = false) {
  SCOPED_TRACE(::testing::Message() << dtype_name(dtype) << " M=" << s.M << " K=" << s.K
                                    << " N=" << s.N << (bias ? " bias" : " no bias")
                                    << " bias offset " << bias_offset << (relu ? " relu" : ""));
  std::mt19937 rng(seed);
  const auto x = representable(random_values(static_cast<size_t>(s.M) * s.K, rng), dtype);
  const auto W = representable(random_values(static_cast<size_t>(s.K) * s.N, rng), dtype);
  const auto padded_b =
      representable(random_values(static_cast<size_t>(s.N + bias_offset), rng), dtype);
  const std::vector<float> b(padded_b.begin() + bias_offset, padded_b.end());
  Twins twins(dtype);
  Scope cpu(*twins.cpu), gpu(*twins.gpu);
  Tensor y_cpu = cpu.alloc(DType::F32, static_cast<int64_t>(s.M) * s.N);
  Tensor y_gpu = gpu.alloc(dtype, static_cast<int64_t>(s.M) * s.N);
  const auto forward = relu ? &Backend::linear_relu_forward : &Backend::linear_forward;
  (twins.cpu.get()->*forward)(
      y_cpu, cpu.put(DType::F32, x), cpu.put(DType::F32, W),
      bias ? cpu.put(DType::F32, padded_b).slice(bias_offset, s.N) : Tensor{}, s.M, s.K, s.N);
  (twins.gpu.get()->*forward)(
      y_gpu, gpu.put(dtype, x), gpu.put(dtype, W),
      bias ? gpu.put(dtype, padded_b).slice(bias_offset, s.N) : Tensor{}, s.M, s.K, s.N);
  auto scale = product_scale(s.M, s.N, s.K, x, s.K, 1, W, s.N, 1, nullptr);
  if (bias) {
    for (int i = 0; i < s.M; ++i) {
      for (int j = 0; j < s.N; ++j) scale[static_cast<size_t>(i) * s.N + j] += std::abs(b[j]);
    }
  }
  EXPECT_TRUE(within_scaled(gpu.get(y_gpu), cpu.get(y_cpu), scale, gemm_factor(s.K, dtype)));
}

// check_linear_forward in every compute dtype on every shape, the seeds from `seed` on:
// with and without a bias, or (misaligned_bias) with a bias 1 and then 3 elements into its
// buffer. relu: linear_relu_forward.
void check_linear_forward_on_every_shape(uint32_t seed, bool relu, bool misaligned_bias) {
  for (DType dtype : gpu_compute_dtypes()) {
    for (const LinearShape& shape : kLinearShapes) {
      if (misaligned_bias) {
        for (int offset : {1, 3}) check_linear_forward(dtype, shape, true, seed++, offset, relu);
      } else {
        for (bool bias : {true, false}) check_linear_forward(dtype, shape, bias, seed++, 0, relu);
      }
    }
  }
}

TEST(CudaLinear, ForwardMatchesCpu) {
  THPC_REQUIRE_GPU();
  check_linear_forward_on_every_shape(1, /*relu=*/false, /*misaligned_bias=*/false);
}

TEST(CudaLinear, ForwardThroughGemmExFallbackMatchesCpu) {
  THPC_REQUIRE_GPU();
  ForceGemmFallback fallback;
  check_linear_forward_on_every_shape(100, /*relu=*/false, /*misaligned_bias=*/false);
}

// A bias 1 or 3 elements into its buffer (2 to 12 bytes off 16-byte alignment) takes the
// cublasGemmEx path and must give the same result as an aligned one.
TEST(CudaLinear, ForwardWithAMisalignedBiasMatchesCpu) {
  THPC_REQUIRE_GPU();
  check_linear_forward_on_every_shape(200, /*relu=*/false, /*misaligned_bias=*/true);
}

// ---- the FFN's bias + ReLU -------------------------------------------------------------
// The forward is checked as linear_forward is (on the cuBLASLt path with the RELU_BIAS /
// RELU epilogue, through cublasGemmEx and relu_forward, with a misaligned bias);
// relu_bias_backward's d_pre is one fp32 addition per element, as on the CPU (fp32:
// bit-identical; bf16: one rounding, rounding_rel), and db is a column sum in another
// order: (rows + 8) * 2^-23 of the sum of magnitudes, as the layer norm's dbeta.

TEST(CudaLinearRelu, ForwardMatchesCpu) {
  THPC_REQUIRE_GPU();
  check_linear_forward_on_every_shape(2300, /*relu=*/true, /*misaligned_bias=*/false);
}

TEST(CudaLinearRelu, ForwardThroughGemmExFallbackMatchesCpu) {
  THPC_REQUIRE_GPU();
  ForceGemmFallback fallback;
  check_linear_forward_on_every_shape(2400, /*relu=*/true, /*misaligned_bias=*/false);
}

TEST(CudaLinearRelu, ForwardWithAMisalignedBiasMatchesCpu) {
  THPC_REQUIRE_GPU();
  check_linear_forward_on_every_shape(2500, /*relu=*/true, /*misaligned_bias=*/true);
}

struct ReluShape {
  int rows, n;
};
// One row, odd widths, a partial last 64-row chunk, several column blocks, an FFN-sized one.
const std::vector<ReluShape> kReluShapes = {{1, 37}, {7, 61}, {129, 512}, {1000, 129},
                                            {200, 1024}, {3000, 2048}};

void check_relu_bias_backward(DType dtype, const ReluShape& s, bool want_d_pre, bool want_db,
                              uint32_t seed, const StoreMode& mode = {},
                              const CudaKernelChoice& kernels = {}) {
  SCOPED_TRACE(::testing::Message() << dtype_name(dtype) << " rows=" << s.rows << " n=" << s.n
                                    << " d_pre=" << want_d_pre << " db=" << want_db << " "
                                    << mode.name());
  std::mt19937 rng(seed);
  const size_t count = static_cast<size_t>(s.rows) * s.n;
  const auto dy = representable(random_values(count, rng), dtype);
  auto y = representable(random_values(count, rng), dtype);
  for (float& value : y) value = value > 0.0f ? value : 0.0f;  // a ReLU's output
  const auto d_pre0 = representable(random_values(count, rng), dtype);
  const auto db0 = random_values(static_cast<size_t>(s.n), rng);
  Twins twins(dtype, kernels);
  Both both(twins);
  const Pair dy_t = both.act(dy), y_t = both.act(y);
  const Pair d_pre = want_d_pre ? both.act(mode.start(d_pre0)) : Pair{};
  const Pair db = want_db ? both.param(db0) : Pair{};
  both.cpu().relu_bias_backward(d_pre.cpu, db.cpu, dy_t.cpu, y_t.cpu, s.rows, s.n, mode.store);
  both.gpu().relu_bias_backward(d_pre.gpu, db.gpu, dy_t.gpu, y_t.gpu, s.rows, s.n, mode.store);
  if (want_d_pre) {
    EXPECT_TRUE(all_close(both.gpu_values(d_pre), both.cpu_values(d_pre), 0.0,
                          rounding_rel(dtype)))
        << "d_pre";
  }
  if (want_db) {
    std::vector<double> scale(static_cast<size_t>(s.n));
    for (int col = 0; col < s.n; ++col) {
      scale[col] = std::abs(db0[col]);
      for (int row = 0; row < s.rows; ++row) {
        const size_t i = static_cast<size_t>(row) * s.n + col;
        if (y[i] > 0.0f) scale[col] += std::abs(dy[i]);
      }
    }
    EXPECT_TRUE(within_scaled(both.gpu_values(db), both.cpu_values(db), scale,
                              (s.rows + 8) * kEps32))
        << "db";
  }
}

TEST(CudaReluBiasBackward, MatchesCpu) {
  THPC_REQUIRE_GPU();
  uint32_t seed = 2600;
  for (DType dtype : gpu_compute_dtypes()) {
    for (const ReluShape& shape : kReluShapes) {
      check_relu_bias_backward(dtype, shape, true, true, seed++);
    }
  }
}

TEST(CudaReluBiasBackward, NullOutputsMatchCpu) {
  THPC_REQUIRE_GPU();
  uint32_t seed = 2700;
  for (DType dtype : gpu_compute_dtypes()) {
    check_relu_bias_backward(dtype, {130, 61}, true, false, seed++);
    check_relu_bias_backward(dtype, {130, 61}, false, true, seed++);
    check_relu_bias_backward(dtype, {130, 61}, false, false, seed++);
  }
}

// Shapes whose n is a multiple of 8 take the 16-byte-vector kernel (groups of rows,
// kVector<T> columns a thread): one vector a row, a partial last group of rows, several
// column blocks, the FFN's width; odd n (the shapes above mostly) the scalar one.
const std::vector<ReluShape> kVectorReluShapes = {{131, 8}, {67, 24}, {129, 512},
                                                  {1000, 4104}, {3000, 2048}};

TEST(CudaReluBiasBackward, VectorizedColumnsMatchCpu) {
  THPC_REQUIRE_GPU();
  uint32_t seed = 2900;
  for (DType dtype : gpu_compute_dtypes()) {
    for (const ReluShape& shape : kVectorReluShapes) {
      check_relu_bias_backward(dtype, shape, true, true, seed++);
    }
    check_relu_bias_backward(dtype, {130, 64}, true, false, seed++);
    check_relu_bias_backward(dtype, {130, 64}, false, true, seed++);
  }
}

// The vector kernel sums every column in the scalar kernel's order (rows in order within
// the same chunks), so its outputs are the scalar kernel's, bit for bit. The scalar one
// runs here on the same values one element past a 16-byte boundary (the vector kernel
// needs aligned rows).
void expect_vector_relu_bias_backward_is_the_scalar_kernels(const CudaKernelChoice& kernels) {
  for (DType dtype : gpu_compute_dtypes()) {
    for (const ReluShape& s : {ReluShape{3000, 2048}, ReluShape{129, 512}, ReluShape{67, 24}}) {
      SCOPED_TRACE(::testing::Message() << dtype_name(dtype) << " rows=" << s.rows << " n=" << s.n);
      const int64_t count = static_cast<int64_t>(s.rows) * s.n;
      std::mt19937 rng(3000 + s.n);
      const auto dy = random_values(static_cast<size_t>(count), rng);
      const auto d_pre0 = random_values(static_cast<size_t>(count), rng);
      auto y = random_values(static_cast<size_t>(count), rng);
      for (float& value : y) value = value > 0.0f ? value : 0.0f;
      const auto db0 = random_values(static_cast<size_t>(s.n), rng);
      Twins twins(dtype, kernels);
      Scope gpu(*twins.gpu);
      std::vector<float> outputs[2][2];
      for (int offset = 0; offset < 2; ++offset) {  // 0: aligned (vectors); 1: scalar
        auto placed = [&](const std::vector<float>& values) {
          std::vector<float> padded(values.size() + 1, 0.5f);
          std::copy(values.begin(), values.end(), padded.begin() + offset);
          return gpu.put(dtype, padded).slice(offset, count);
        };
        const Tensor dy_t = placed(dy), y_t = placed(y), d_pre = placed(d_pre0);
        const Tensor db = gpu.put(DType::F32, db0);
        twins.gpu->relu_bias_backward(d_pre, db, dy_t, y_t, s.rows, s.n, GradStore::kAdd);
        outputs[offset][0] = gpu.get(d_pre);
        outputs[offset][1] = gpu.get(db);
      }
      EXPECT_TRUE(outputs[0][0] == outputs[1][0]) << "d_pre differs from the scalar kernel's";
      EXPECT_TRUE(outputs[0][1] == outputs[1][1]) << "db differs from the scalar kernel's";
    }
  }
}

TEST(CudaReluBiasBackward, VectorizedIsTheScalarKernelBitForBit) {
  THPC_REQUIRE_GPU();
  expect_vector_relu_bias_backward_is_the_scalar_kernels({});
}

// Two identical calls from the same pre-filled outputs: bit-identical.
void expect_relu_bias_backward_deterministic(const CudaKernelChoice& kernels, int rows, int n,
                                             uint32_t seed) {
  for (DType dtype : gpu_compute_dtypes()) {
    SCOPED_TRACE(dtype_name(dtype));
    const size_t count = static_cast<size_t>(rows) * n;
    std::mt19937 rng(seed);
    const auto dy = random_values(count, rng), d_pre0 = random_values(count, rng);
    auto y = random_values(count, rng);
    for (float& value : y) value = value > 0.0f ? value : 0.0f;
    const auto db0 = random_values(static_cast<size_t>(n), rng);
    Twins twins(dtype, kernels);
    Scope gpu(*twins.gpu);
    const Tensor dy_t = gpu.put(dtype, dy), y_t = gpu.put(dtype, y);
    std::vector<float> first[2];
    for (int run = 0; run < 2; ++run) {
      Tensor d_pre = gpu.put(dtype, d_pre0), db = gpu.put(DType::F32, db0);
      twins.gpu->relu_bias_backward(d_pre, db, dy_t, y_t, rows, n, GradStore::kAdd);
      const std::vector<float> got[2] = {gpu.get(d_pre), gpu.get(db)};
      for (int i = 0; i < 2; ++i) {
        if (run == 0) first[i] = got[i];
        else EXPECT_TRUE(got[i] == first[i]) << "output " << i << " differs between runs";
      }
    }
  }
}

TEST(CudaReluBiasBackward, IsDeterministic) {
  THPC_REQUIRE_GPU();
  expect_relu_bias_backward_deterministic({}, 3000, 2048, 2800);
}

// ---- the candidate fuller_column_sums: db in chunks that fill the device ---------------
// (kernels/cuda/column_sums.cuh.) The vector kernel's shapes (one rank's FFN of 3,125
// rows: 8-row chunks; 1,000 of 4,104: 3 column blocks a chunk, 8 rows) and the scalar
// one's (odd widths), one row through 30,000 of 256 (64-row chunks, as without it: the
// cap), the finish
// with eight lanes a column, d_pre written and added: against the CPU with the verified
// path's bounds (db's order is other, the bound is order-free), and twice the same bits.
TEST(CudaCandidateFullerColumnSums, ReluBiasGradientsMatchCpu) {
  THPC_REQUIRE_GPU();
  const CudaKernelChoice fuller = kernels_with(kFullerColumnSums);
  uint32_t seed = 3100;
  for (DType dtype : gpu_compute_dtypes()) {
    for (const ReluShape& shape : {ReluShape{1, 37}, ReluShape{7, 61}, ReluShape{67, 24},
                                   ReluShape{1000, 129}, ReluShape{1000, 4104},
                                   ReluShape{3125, 2048}, ReluShape{30000, 256}}) {
      check_relu_bias_backward(dtype, shape, true, true, seed++, {}, fuller);
    }
    StoreMode writing;
    writing.store = GradStore::kWrite;
    check_relu_bias_backward(dtype, {3125, 2048}, true, true, seed++, writing, fuller);
    check_relu_bias_backward(dtype, {3125, 2048}, false, true, seed++, {}, fuller);
  }
}

// Its chunks follow the shape, not the pointers' alignment: the scalar kernel (one
// element past a 16-byte boundary) sums in the vector kernel's order, bit for bit.
TEST(CudaCandidateFullerColumnSums, VectorizedIsTheScalarKernelBitForBit) {
  THPC_REQUIRE_GPU();
  const CudaKernelChoice fuller = kernels_with(kFullerColumnSums);
  expect_vector_relu_bias_backward_is_the_scalar_kernels(fuller);
}

TEST(CudaCandidateFullerColumnSums, ReluBiasGradientsAreDeterministic) {
  THPC_REQUIRE_GPU();
  const CudaKernelChoice fuller = kernels_with(kFullerColumnSums);
  expect_relu_bias_backward_deterministic(fuller, 3125, 2048, 3200);
}

// ---- the candidate relu_masks: the FFN's ReLU as cuBLASLt's bit-mask -------------------

struct FfnShape {
  int M, d, d_ff;
};

// The FFN's first layer keeping its mask (linear_relu_mask_forward) and the second layer's
// backward reading it (linear_relu_backward) on the GPU with the candidate, against the
// CPU's twins: hidden as linear_relu_forward's bound; the backward given the GPU's hidden
// on both sides (so that both see the same ReLU), d_pre as a product of dy and W2^T with
// exact zeros where the ReLU cut, dW2 and db2 as linear_backward's. Returns how many
// products ran with the mask's epilogues. With `mask_decides`, a second backward is handed
// a hidden layer that is positive everywhere: where the mask was read (the epilogue ran)
// its d_pre must be the first one's bit for bit.
int64_t check_relu_mask_ffn(DType dtype, const FfnShape& s, uint32_t seed) {
  SCOPED_TRACE(::testing::Message() << dtype_name(dtype) << " M=" << s.M << " d=" << s.d
                                    << " d_ff=" << s.d_ff);
  std::mt19937 rng(seed);
  const size_t Md = size_t(s.M) * s.d, MF = size_t(s.M) * s.d_ff, dF = size_t(s.d) * s.d_ff;
  const auto x = representable(random_values(Md, rng), dtype);
  const auto W1 = representable(random_values(dF, rng), dtype);
  const auto b1 = representable(random_values(size_t(s.d_ff), rng), dtype);
  const auto W2 = representable(random_values(dF, rng), dtype);
  const auto dy = representable(random_values(Md, rng), dtype);
  const auto dW0 = random_values(dF, rng);
  const auto db0 = random_values(size_t(s.d), rng);
  const CudaKernelChoice kernels = kernels_with(kReluMasks);
  Twins twins(dtype, kernels);
  Scope cpu(*twins.cpu), gpu(*twins.gpu);
  const int64_t before = relu_mask_products();
  const int64_t words = twins.gpu->relu_mask_words(s.M, s.d_ff);
  EXPECT_EQ(words > 0, !twin_rehearsal()) << "the GPU keeps a mask with the candidate";
  uint32_t* mask = words > 0 ? reinterpret_cast<uint32_t*>(gpu.put_ids(
                                   std::vector<int32_t>(size_t(words), int32_t(0x5a5a5a5a))))
                             : nullptr;
  // Forward.
  Tensor hidden_cpu = cpu.alloc(DType::F32, int64_t(MF)), hidden_gpu = gpu.alloc(dtype, int64_t(MF));
  twins.cpu->linear_relu_mask_forward(hidden_cpu, nullptr, cpu.put(DType::F32, x),
                                      cpu.put(DType::F32, W1), cpu.put(DType::F32, b1), s.M,
                                      s.d, s.d_ff);
  twins.gpu->linear_relu_mask_forward(hidden_gpu, mask, gpu.put(dtype, x), gpu.put(dtype, W1),
                                      gpu.put(dtype, b1), s.M, s.d, s.d_ff);
  // The epilogue may round the product to the output type before it adds the bias (on an
  // H200, 2026-11-29, bf16: hidden 0 exactly where bf16(x W1) = -b1): a rounding of
  // |x W1| and one of |x W1 + b1|, both within |x W1| + |b1|; the bound takes both.
  const auto product = product_scale(s.M, s.d_ff, s.d, x, s.d, 1, W1, s.d_ff, 1, nullptr);
  std::vector<double> forward_scale(product);
  for (size_t i = 0; i < MF; ++i) {
    forward_scale[i] += product[i] + std::abs(b1[i % size_t(s.d_ff)]);
  }
  const std::vector<float> hidden = gpu.get(hidden_gpu);
  EXPECT_TRUE(within_scaled(hidden, cpu.get(hidden_cpu), forward_scale, gemm_factor(s.d, dtype)))
      << "hidden";
  // The ReLU's kink: pre-activations within the forward's bound of zero. There the mask
  // and the stored hidden layer may disagree: cuBLASLt's mask keeps the gradient where
  // the epilogue's pre-activation is exactly 0 (y = 0, the bit set), the CPU's ReLU cuts
  // it (y > 0); on the H200 one element in 500 of the odd bf16 shapes, pre-activations
  // -1.5e-3 and +1.6e-4 whose product rounded to bf16 was -b1. Both are derivatives of
  // the ReLU at the kink within rounding, so there d_pre may be 0 or the product;
  // elsewhere the cut is exact.
  Tensor pre_cpu = cpu.alloc(DType::F32, int64_t(MF));
  twins.cpu->linear_forward(pre_cpu, cpu.put(DType::F32, x), cpu.put(DType::F32, W1),
                            cpu.put(DType::F32, b1), s.M, s.d, s.d_ff);
  const std::vector<float> pre = cpu.get(pre_cpu);
  std::vector<bool> at_kink(MF);
  for (size_t i = 0; i < MF; ++i) {
    at_kink[i] = std::abs(pre[i]) <= forward_scale[i] * gemm_factor(s.d, dtype);
  }
  // Backward, both sides from the GPU's hidden layer.
  Tensor d_pre_cpu = cpu.alloc(DType::F32, int64_t(MF)), d_pre_gpu = gpu.alloc(dtype, int64_t(MF));
  Tensor dW_cpu = cpu.put(DType::F32, dW0), db_cpu = cpu.put(DType::F32, db0);
  Tensor dW_gpu = gpu.put(DType::F32, dW0), db_gpu = gpu.put(DType::F32, db0);
  twins.cpu->linear_relu_backward(d_pre_cpu, dW_cpu, db_cpu, cpu.put(DType::F32, dy),
                                  cpu.put(DType::F32, hidden), nullptr, cpu.put(DType::F32, W2),
                                  s.M, s.d_ff, s.d);
  const Tensor dy_gpu = gpu.put(dtype, dy), W2_gpu = gpu.put(dtype, W2);
  twins.gpu->linear_relu_backward(d_pre_gpu, dW_gpu, db_gpu, dy_gpu, hidden_gpu, mask, W2_gpu,
                                  s.M, s.d_ff, s.d);
  const std::vector<float> d_pre = gpu.get(d_pre_gpu);
  std::vector<float> d_pre_expected = cpu.get(d_pre_cpu);
  // The product uncut (the CPU's backward of a hidden layer positive everywhere), the
  // expectation at the kink where the GPU let the gradient through.
  std::vector<float> positive_hidden(hidden);
  for (float& value : positive_hidden) value = std::abs(value) + 1.0f;
  Tensor uncut_cpu = cpu.alloc(DType::F32, int64_t(MF));
  Tensor dW_unused = cpu.put(DType::F32, dW0), db_unused = cpu.put(DType::F32, db0);
  twins.cpu->linear_relu_backward(uncut_cpu, dW_unused, db_unused, cpu.put(DType::F32, dy),
                                  cpu.put(DType::F32, positive_hidden), nullptr,
                                  cpu.put(DType::F32, W2), s.M, s.d_ff, s.d);
  const std::vector<float> uncut = cpu.get(uncut_cpu);
  size_t cut = 0, wrong_cuts = 0, kink_taken_otherwise = 0;
  for (size_t i = 0; i < MF; ++i) {
    const bool cut_here = hidden[i] <= 0.0f;
    cut += cut_here;
    if (at_kink[i]) {
      // Either side of the kink: the uncut product or 0, whichever the GPU took.
      const bool passed = d_pre[i] != 0.0f;
      kink_taken_otherwise += passed == cut_here;
      d_pre_expected[i] = passed ? uncut[i] : 0.0f;
    } else if (cut_here) {
      wrong_cuts += d_pre[i] != 0.0f;
    }
  }
  // d_pre [M, d_ff] = dy [M, d] W2^T where hidden > 0: W2^T(l, j) = W2[j*d + l].
  const auto backward_scale = product_scale(s.M, s.d_ff, s.d, dy, s.d, 1, W2, 1, s.d, nullptr);
  EXPECT_TRUE(within_scaled(d_pre, d_pre_expected, backward_scale, gemm_factor(s.d, dtype)))
      << "d_pre";
  EXPECT_GT(cut, 0u) << "the ReLU must cut something";
  EXPECT_EQ(wrong_cuts, 0u) << "d_pre where the ReLU cut, away from its kink";
  if (kink_taken_otherwise > 0) {
    std::printf("relu mask twin %s M=%d d=%d d_ff=%d: %zu element(s) at the kink where the "
                "mask and the hidden layer disagree\n",
                dtype_name(dtype), s.M, s.d, s.d_ff, kink_taken_otherwise);
  }
  const auto dW_scale = product_scale(s.d_ff, s.d, s.M, hidden, 1, s.d_ff, dy, s.d, 1, &dW0);
  EXPECT_TRUE(within_scaled(gpu.get(dW_gpu), cpu.get(dW_cpu), dW_scale,
                            gemm_factor(s.M, DType::F32)))
      << "dW";
  const std::vector<float> ones(size_t(s.M), 1.0f);
  const auto db_scale = product_scale(1, s.d, s.M, ones, 0, 1, dy, s.d, 1, &db0);
  EXPECT_TRUE(within_scaled(gpu.get(db_gpu), cpu.get(db_cpu), db_scale,
                            gemm_factor(s.M, DType::F32)))
      << "db";
  const int64_t products = relu_mask_products() - before;
  if (products == 2) {
    // The mask decides, not the hidden layer handed in: one positive everywhere changes
    // nothing.
    std::vector<float> positive(hidden);
    for (float& value : positive) value = std::abs(value) + 1.0f;
    Tensor again = gpu.alloc(dtype, int64_t(MF));
    Tensor dW_again = gpu.put(DType::F32, dW0), db_again = gpu.put(DType::F32, db0);
    twins.gpu->linear_relu_backward(again, dW_again, db_again, dy_gpu, gpu.put(dtype, positive),
                                    mask, W2_gpu, s.M, s.d_ff, s.d);
    EXPECT_EQ(gpu.get(again), d_pre) << "the DRELU epilogue did not read the forward's mask";
  }
  return products;
}

// The candidate relu_masks (kernels/cuda/linear.cu): where cuBLASLt takes the epilogues
// (aligned shapes: d and d_ff multiples of 8), one forward and one backward product each
// with the mask, and the results the CPU's; odd shapes may fall back to the product and
// relu_backward reading the hidden layer (the same results). Counted: a candidate whose
// epilogues never ran would prove nothing.
TEST(CudaCandidateReluMasks, FfnLayersMatchCpu) {
  THPC_REQUIRE_GPU();
  uint32_t seed = 2800;
  const std::vector<FfnShape> aligned = {{37, 64, 256}, {200, 128, 512}};
  const std::vector<FfnShape> odd = {{5, 7, 100}, {3, 16, 129}};
  for (DType dtype : gpu_compute_dtypes()) {
    for (const FfnShape& shape : aligned) {
      const int64_t products = check_relu_mask_ffn(dtype, shape, seed++);
      if (!twin_rehearsal()) {
        EXPECT_EQ(products, 2) << "cuBLASLt took no mask epilogue for " << dtype_name(dtype)
                               << " M=" << shape.M;
      }
    }
    for (const FfnShape& shape : odd) check_relu_mask_ffn(dtype, shape, seed++);
  }
}

// Which gradients a backward call asks for.
struct Wanted {
  bool dx, dW, db;
};

void check_linear_backward(DType dtype, const LinearShape& s, Wanted wanted, uint32_t seed,
                           const StoreMode& mode = {}, const CudaKernelChoice& kernels = {}) {
  SCOPED_TRACE(::testing::Message() << dtype_name(dtype) << " M=" << s.M << " K=" << s.K
                                    << " N=" << s.N << " dx=" << wanted.dx << " dW="
                                    << wanted.dW << " db=" << wanted.db << " " << mode.name());
  std::mt19937 rng(seed);
  const size_t MK = static_cast<size_t>(s.M) * s.K, KN = static_cast<size_t>(s.K) * s.N,
               MN = static_cast<size_t>(s.M) * s.N;
  const auto x = representable(random_values(MK, rng), dtype);
  const auto W = representable(random_values(KN, rng), dtype);
  const auto dy = representable(random_values(MN, rng), dtype);
  const auto dx0 = representable(random_values(MK, rng), dtype);  // activation-side: T
  const auto dW0 = random_values(KN, rng);                         // parameter-side: fp32
  const auto db0 = random_values(static_cast<size_t>(s.N), rng);
  Twins twins(dtype, kernels);
  Scope cpu(*twins.cpu), gpu(*twins.gpu);
  Tensor dx_cpu = wanted.dx ? cpu.put(DType::F32, mode.start(dx0)) : Tensor{};
  Tensor dW_cpu = wanted.dW ? cpu.put(DType::F32, dW0) : Tensor{};
  Tensor db_cpu = wanted.db ? cpu.put(DType::F32, db0) : Tensor{};
  Tensor dx_gpu = wanted.dx ? gpu.put(dtype, mode.start(dx0)) : Tensor{};
  Tensor dW_gpu = wanted.dW ? gpu.put(DType::F32, dW0) : Tensor{};
  Tensor db_gpu = wanted.db ? gpu.put(DType::F32, db0) : Tensor{};
  twins.cpu->linear_backward(dx_cpu, dW_cpu, db_cpu, cpu.put(DType::F32, dy),
                             cpu.put(DType::F32, x), cpu.put(DType::F32, W), s.M, s.K, s.N,
                             mode.store);
  twins.gpu->linear_backward(dx_gpu, dW_gpu, db_gpu, gpu.put(dtype, dy), gpu.put(dtype, x),
                             gpu.put(dtype, W), s.M, s.K, s.N, mode.store);
  if (wanted.dx) {  // dx [M, K] += dy [M, N] W^T: W^T(l, j) = W[j*N + l]
    const auto dx_onto = mode.onto(dx0);
    const auto scale = product_scale(s.M, s.K, s.N, dy, s.N, 1, W, 1, s.N, &dx_onto);
    EXPECT_TRUE(within_scaled(gpu.get(dx_gpu), cpu.get(dx_cpu), scale, gemm_factor(s.N, dtype)))
        << "dx";
  }
  if (wanted.dW) {  // dW [K, N] += x^T [K, M] dy [M, N]: x^T(i, l) = x[l*K + i]
    const auto scale = product_scale(s.K, s.N, s.M, x, 1, s.K, dy, s.N, 1, &dW0);
    EXPECT_TRUE(within_scaled(gpu.get(dW_gpu), cpu.get(dW_cpu), scale,
                              gemm_factor(s.M, DType::F32)))
        << "dW";
  }
  if (wanted.db) {  // db [1, N] += ones [1, M] dy [M, N]
    const std::vector<float> ones(static_cast<size_t>(s.M), 1.0f);
    const auto scale = product_scale(1, s.N, s.M, ones, 0, 1, dy, s.N, 1, &db0);
    EXPECT_TRUE(within_scaled(gpu.get(db_gpu), cpu.get(db_cpu), scale,
                              gemm_factor(s.M, DType::F32)))
        << "db";
  }
}

TEST(CudaLinear, BackwardMatchesCpu) {
  THPC_REQUIRE_GPU();
  uint32_t seed = 200;
  for (DType dtype : gpu_compute_dtypes()) {
    for (const LinearShape& shape : kLinearShapes) {
      check_linear_backward(dtype, shape, {true, true, true}, seed++);
    }
  }
}

TEST(CudaLinear, BackwardWithNullOutputsMatchesCpu) {
  THPC_REQUIRE_GPU();
  uint32_t seed = 300;
  for (DType dtype : gpu_compute_dtypes()) {
    for (const Wanted wanted : {Wanted{true, false, false}, Wanted{false, true, false},
                                Wanted{false, false, true}, Wanted{false, false, false}}) {
      check_linear_backward(dtype, {17, 37, 61}, wanted, seed++);
    }
  }
}

TEST(CudaLinear, BackwardThroughGemmExFallbackMatchesCpu) {
  THPC_REQUIRE_GPU();
  ForceGemmFallback fallback;
  uint32_t seed = 400;
  for (DType dtype : gpu_compute_dtypes()) {
    for (const LinearShape& shape : kLinearShapes) {
      check_linear_backward(dtype, shape, {true, true, true}, seed++);
    }
  }
}

// Two identical backward calls from the same pre-filled gradients: bit-identical.
void expect_backward_deterministic(const CudaKernelChoice& kernels) {
  for (DType dtype : gpu_compute_dtypes()) {
    SCOPED_TRACE(dtype_name(dtype));
    const int M = 1000, K = 129, N = 257;
    std::mt19937 rng(500);
    const auto x = random_values(static_cast<size_t>(M) * K, rng);
    const auto W = random_values(static_cast<size_t>(K) * N, rng);
    const auto dy = random_values(static_cast<size_t>(M) * N, rng);
    const auto dx0 = random_values(static_cast<size_t>(M) * K, rng);
    const auto dW0 = random_values(static_cast<size_t>(K) * N, rng);
    const auto db0 = random_values(static_cast<size_t>(N), rng);
    Twins twins(dtype, kernels);
    Scope gpu(*twins.gpu);
    const Tensor x_t = gpu.put(dtype, x), W_t = gpu.put(dtype, W), dy_t = gpu.put(dtype, dy);
    std::vector<float> first[3];
    for (int run = 0; run < 2; ++run) {
      Tensor dx = gpu.put(dtype, dx0), dW = gpu.put(DType::F32, dW0),
             db = gpu.put(DType::F32, db0);
      twins.gpu->linear_backward(dx, dW, db, dy_t, x_t, W_t, M, K, N, GradStore::kAdd);
      const std::vector<float> got[3] = {gpu.get(dx), gpu.get(dW), gpu.get(db)};
      for (int i = 0; i < 3; ++i) {
        if (run == 0) first[i] = got[i];
        else EXPECT_TRUE(got[i] == first[i]) << "output " << i << " differs between runs";
      }
    }
  }
}

TEST(CudaLinear, BackwardIsDeterministic) {
  THPC_REQUIRE_GPU();
  expect_backward_deterministic({});
}

// The candidate bias_grads_in_gemm (kernels/cuda/linear.cu: db summed by dW's product,
// cuBLASLt's BGRADA epilogue, then added into db): the verified twin's cases against the
// CPU with its bounds (db's is the ones product's: an M-long fp32 sum either way), every
// shape (odd ones, M = 1, an empty product K = 0 whose db takes the ones) with dx added
// and written, dx or dW not asked for (db alone takes the ones), one rank's row counts
// (3,125 and a bucket's 3,128); the sums taken in the product counted where they were
// planned (a shape with K > 0 whose product cuBLASLt plans with the epilogue).
TEST(CudaCandidateBiasGradsInGemm, LayerGradientsMatchCpu) {
  THPC_REQUIRE_GPU();
  CudaKernelChoice kernels;
  kernels.candidates = kBiasGradsInGemm;
  std::vector<LinearShape> shapes = kLinearShapes;
  shapes.push_back({3125, 512, 512});
  shapes.push_back({3128, 2048, 512});
  uint32_t seed = 4200;
  for (DType dtype : gpu_compute_dtypes()) {
    const int64_t before = bias_grads_in_gemm();
    for (const LinearShape& shape : shapes) {
      for (const StoreMode& mode : {StoreMode{GradStore::kAdd}, StoreMode{GradStore::kWrite}}) {
        check_linear_backward(dtype, shape, {true, true, true}, seed++, mode, kernels);
      }
    }
    for (const Wanted wanted : {Wanted{false, true, true}, Wanted{false, false, true}}) {
      check_linear_backward(dtype, {128, 256, 512}, wanted, seed++, {}, kernels);
    }
    if (twin_rehearsal()) continue;  // the CPU stands in: no cuBLASLt
    // At least {128, 256, 512}'s three (dx added, written, not asked for): the model's
    // layer shape, every operand 16-byte aligned. How many of the calls with dW and db
    // took the sums in the product is printed for the GPU session's log.
    const int64_t taken = bias_grads_in_gemm() - before;
    std::printf("bias_grads_in_gemm %s: %lld of %zu layer backwards with dW and db\n",
                dtype_name(dtype), static_cast<long long>(taken), 2 * shapes.size() + 1);
    // Asserted in bf16, what training runs; fp32 (CUBLAS_COMPUTE_32F without TF32) may
    // have no BGRADA kernel, and then takes the ones, correct either way: printed only.
    if (dtype == DType::BF16) {
      EXPECT_GE(taken, 3) << "the aligned layers' sums were not taken in dW's product";
    }
  }
}

TEST(CudaCandidateBiasGradsInGemm, LayerGradientsAreDeterministic) {
  THPC_REQUIRE_GPU();
  CudaKernelChoice kernels;
  kernels.candidates = kBiasGradsInGemm;
  expect_backward_deterministic(kernels);
}

// The bias gradient db += dy^T ones on `backend` ([M, N] dy, K = 8 for its unused x, W),
// after an op that writes the scratch buffer (sum_squares' partials), as a step's other
// ops do between two bias gradients.
std::vector<float> bias_gradient(Backend& backend, DType dtype, int M, int N,
                                 const std::vector<float>& dy, const std::vector<float>& db0) {
  Scope scope(backend);
  const std::vector<float> filler(static_cast<size_t>(4 * M + 1000), 0.5f);
  backend.sum_squares(scope.put(DType::F32, filler), static_cast<int64_t>(filler.size()));
  Tensor db = scope.put(DType::F32, db0);
  const std::vector<float> small(static_cast<size_t>(8) * std::max(M, N), 0.25f);
  backend.linear_backward(Tensor{}, Tensor{}, db, scope.put(dtype, dy),
                          scope.put(dtype, std::vector<float>(small.begin(),
                                                              small.begin() + 8 * M)),
                          scope.put(dtype, std::vector<float>(small.begin(),
                                                              small.begin() + 8 * N)),
                          M, 8, N, GradStore::kAdd);
  return scope.get(db);
}

// The kept ones (kernels/cuda/linear.cu: the bias gradient's ones vector filled once and
// kept; the former candidate kept_ones, the default since 2026-12-04): over row counts
// that grow the kept vector, use less of it and grow it again, with the scratch buffer
// written in between, every bias gradient equals what the CPU gives within the GEMM's
// rounding and read the kept vector (counted). A capture whose rows outgrow it takes the
// scratch buffer's ones inside the graph (a fill captured and then dropped would leave the
// vector unfilled); that gradient equals the kept vector's (another backend's, uncaptured)
// bit for bit, and the uncaptured call after grows and fills it.
TEST(CudaLinear, BiasGradientsReadTheKeptOnes) {
  THPC_REQUIRE_GPU();
  const CudaKernelChoice graphs = kernels_with(kStepGraphs);
  const int N = 96;
  for (DType dtype : gpu_compute_dtypes()) {
    SCOPED_TRACE(dtype_name(dtype));
    Twins reference(dtype), capturing(dtype, graphs);
    std::mt19937 rng(2900);
    const std::vector<int> rows = {17, 1000, 5, 2000, 300};
    int64_t read = 0;
    for (const int M : rows) {
      SCOPED_TRACE("M=" + std::to_string(M));
      const auto dy = representable(random_values(static_cast<size_t>(M) * N, rng), dtype);
      const auto db0 = random_values(static_cast<size_t>(N), rng);
      const int64_t before = kept_ones_bias_gradients();
      const std::vector<float> got = bias_gradient(*capturing.gpu, dtype, M, N, dy, db0);
      read += kept_ones_bias_gradients() - before;
      const std::vector<float> on_cpu = bias_gradient(*capturing.cpu, DType::F32, M, N, dy, db0);
      const std::vector<float> ones(static_cast<size_t>(M), 1.0f);
      EXPECT_TRUE(within_scaled(got, on_cpu, product_scale(1, N, M, ones, 0, 1, dy, N, 1, &db0),
                                gemm_factor(M, DType::F32)));
    }
    if (twin_rehearsal()) continue;  // the CPU stands in: no kept vector, no capture
    EXPECT_EQ(read, static_cast<int64_t>(rows.size()));

    // 3,000 rows outgrow the vector kept for 2,000 (2,564 elements) inside a capture.
    const int M = 3000;
    const auto dy = representable(random_values(static_cast<size_t>(M) * N, rng), dtype);
    const auto db0 = random_values(static_cast<size_t>(N), rng);
    const std::vector<float> expected = bias_gradient(*reference.gpu, dtype, M, N, dy, db0);
    Backend& gpu = *capturing.gpu;
    Scope scope(gpu);
    // The scratch grown first (the old path's ones go there, M of them): a capture may not
    // free. The loss over M rows takes ~20 bytes a row of it (queue_loss_sums); sum_squares
    // would not do, its partials take a few kB whatever the length.
    const int32_t* targets = scope.put_ids(std::vector<int32_t>(static_cast<size_t>(M), 1));
    gpu.softmax_cross_entropy(Tensor{},
                              scope.put(dtype, std::vector<float>(static_cast<size_t>(8) * M,
                                                                  0.5f)),
                              targets, M, 8, 0.0f, 0, 0.0f);
    const Tensor dy_t = scope.put(dtype, dy);
    const Tensor x_t = scope.put(dtype, std::vector<float>(static_cast<size_t>(8) * M, 0.25f));
    const Tensor W_t = scope.put(dtype, std::vector<float>(static_cast<size_t>(8) * N, 0.25f));
    Tensor db = scope.put(DType::F32, db0);
    const int64_t reads = kept_ones_bias_gradients();
    const std::unique_ptr<CapturedWork> work = gpu.capture([&] {
      gpu.linear_backward(Tensor{}, Tensor{}, db, dy_t, x_t, W_t, M, 8, N, GradStore::kAdd);
    });
    ASSERT_NE(work, nullptr) << "the capture was refused";
    EXPECT_EQ(kept_ones_bias_gradients(), reads) << "the capture read the kept vector";
    ASSERT_TRUE(work->replay());
    EXPECT_EQ(scope.get(db), expected) << "captured";
    EXPECT_EQ(bias_gradient(gpu, dtype, M, N, dy, db0), expected) << "grown after it";
    EXPECT_EQ(kept_ones_bias_gradients(), reads + 1);
  }
}

// ---- the candidate weight_grads_beside --------------------------------------------------

struct LayerBackwardCase {
  int M, K, N;
  bool with_db;
  GradStore store;
  bool relu;  // the FFN's second layer: linear_relu_backward after a masked forward
};

// One layer's backward on `backend`, from the same random values whatever the backend:
// linear_backward (dx stored by `store` onto random values or NaN, dW and db added onto
// random values), or with `relu` linear_relu_mask_forward of a 16-wide input (the mask
// kept where the backend keeps one) and then linear_relu_backward writing d_pre. With
// `capture`, the backward is captured into a graph and replayed instead of run (the
// forward is not). Returns dx (or d_pre), dW and db.
std::vector<std::vector<float>> layer_backward(Backend& backend, DType dtype,
                                               const LayerBackwardCase& c, uint32_t seed,
                                               bool capture = false) {
  std::mt19937 rng(seed);
  const size_t MK = size_t(c.M) * c.K, KN = size_t(c.K) * c.N, MN = size_t(c.M) * c.N;
  Scope scope(backend);
  const Tensor dy = scope.put(dtype, representable(random_values(MN, rng), dtype));
  const Tensor W = scope.put(dtype, representable(random_values(KN, rng), dtype));
  Tensor dx = scope.put(dtype, StoreMode{c.store}.start(random_values(MK, rng)));
  Tensor dW = scope.put(DType::F32, random_values(KN, rng));
  Tensor db = c.with_db ? scope.put(DType::F32, random_values(size_t(c.N), rng)) : Tensor{};
  Tensor x;  // the layer's input: random, or the ReLU's output
  uint32_t* mask = nullptr;
  if (c.relu) {
    x = scope.alloc(dtype, int64_t(MK));
    const int words = static_cast<int>(backend.relu_mask_words(c.M, c.K));
    if (words > 0) {
      mask = reinterpret_cast<uint32_t*>(scope.put_ids(std::vector<int32_t>(size_t(words), 0)));
    }
    const size_t inputs = size_t(c.M) * 16, weights = size_t(16) * c.K;
    backend.linear_relu_mask_forward(
        x, mask, scope.put(dtype, representable(random_values(inputs, rng), dtype)),
        scope.put(dtype, representable(random_values(weights, rng), dtype)),
        scope.put(dtype, representable(random_values(size_t(c.K), rng), dtype)), c.M, 16, c.K);
  } else {
    x = scope.put(dtype, representable(random_values(MK, rng), dtype));
  }
  const auto backward = [&] {
    if (c.relu) {
      backend.linear_relu_backward(dx, dW, db, dy, x, mask, W, c.M, c.K, c.N);
    } else {
      backend.linear_backward(dx, dW, db, dy, x, W, c.M, c.K, c.N, c.store);
    }
  };
  if (capture) {
    const std::unique_ptr<CapturedWork> work = backend.capture(backward);
    EXPECT_NE(work, nullptr) << "the capture was refused";
    if (work == nullptr || !work->replay()) return {};
  } else {
    backward();
  }
  return {scope.get(dx), scope.get(dW), c.with_db ? scope.get(db) : std::vector<float>{}};
}

// Layer backwards whose every leading dimension is a multiple of 16 bytes (cuBLASLt has
// plans for all their products), with and without a bias, dx added or written, the FFN's
// second layer among them, one rank's 3,128-row bucket too.
const std::vector<LayerBackwardCase> kAlignedLayerCases = {
    {64, 128, 96, true, GradStore::kAdd, false},
    {304, 512, 512, true, GradStore::kWrite, false},
    {1000, 512, 1536, false, GradStore::kAdd, false},
    {3128, 2048, 512, true, GradStore::kWrite, true},
    {256, 256, 128, true, GradStore::kWrite, true}};

// The candidate weight_grads_beside (kernels/cuda/linear.cu: a layer's dW and db products
// on a second stream beside its dx product): every output equals the verified kernels'
// bit for bit (the same cuBLASLt plans, only another stream and workspace), with and
// without a bias, dx added or written, the FFN's second layer with the ReLU's mask
// (relu_masks in both), the product shapes of one rank's batch among them; the products
// that went beside are counted (all but the odd shapes', which may take cublasGemmEx); and
// captured into a CUDA graph (the side stream a branch of it, joined) they equal it too.
TEST(CudaCandidateWeightGradsBeside, LayerGradientsEqualTheVerifiedBitForBit) {
  THPC_REQUIRE_GPU();
  CudaKernelChoice verified_kernels, beside_kernels;
  verified_kernels.candidates = kReluMasks;
  beside_kernels.candidates = kReluMasks | kWeightGradsBeside | kStepGraphs;
  // Aligned (kAlignedLayerCases): every leading dimension a multiple of 16 bytes, so
  // cuBLASLt has plans for all the products and each case's go beside (counted). Odd: the
  // counts left out (a plan may be missing: cublasGemmEx on the context's stream), among
  // them one rank's real row count, 3,125, whose db product reads the ones with a leading
  // dimension of 6,250 bytes.
  const std::vector<LayerBackwardCase>& aligned = kAlignedLayerCases;
  const std::vector<LayerBackwardCase> odd = {{3, 5, 7, true, GradStore::kAdd, false},
                                              {33, 129, 17, true, GradStore::kWrite, true},
                                              {3125, 2048, 512, true, GradStore::kWrite, true},
                                              {257, 512, 512, true, GradStore::kAdd, false}};
  for (DType dtype : gpu_compute_dtypes()) {
    SCOPED_TRACE(dtype_name(dtype));
    Twins verified(dtype, verified_kernels), beside(dtype, beside_kernels);
    uint32_t seed = 3000;
    const int64_t before = weight_grads_beside();
    for (const auto* cases : {&aligned, &odd}) {
      for (const LayerBackwardCase& c : *cases) {
        SCOPED_TRACE(::testing::Message() << "M=" << c.M << " K=" << c.K << " N=" << c.N
                                          << (c.relu ? " relu" : "") << " db=" << c.with_db
                                          << " " << StoreMode{c.store}.name());
        const auto expected = layer_backward(*verified.gpu, dtype, c, seed);
        EXPECT_EQ(layer_backward(*beside.gpu, dtype, c, seed), expected);
        ++seed;
      }
    }
    if (twin_rehearsal()) continue;  // the CPU stands in: one stream, no graphs
    EXPECT_GE(weight_grads_beside() - before, static_cast<int64_t>(aligned.size()))
        << "the aligned products did not go beside";
    for (const LayerBackwardCase& c : aligned) {
      SCOPED_TRACE(::testing::Message() << "captured M=" << c.M << " K=" << c.K << " N=" << c.N);
      const auto expected = layer_backward(*verified.gpu, dtype, c, seed);
      // Once uncaptured first: the kept ones vector grows outside the capture.
      EXPECT_EQ(layer_backward(*beside.gpu, dtype, c, seed), expected);
      const int64_t queued = weight_grads_beside();
      EXPECT_EQ(layer_backward(*beside.gpu, dtype, c, seed, true), expected);
      EXPECT_EQ(weight_grads_beside(), queued + 1) << "the capture's products did not go beside";
      ++seed;
    }
  }
}

// The candidates bias_grads_in_gemm and weight_grads_beside together (kernels/cuda/
// linear.cu, WeightGradients): a layer's summing dW product and the addition of its sums
// go beside its dx product, the sums in the side stream's own buffer (Context::side_sums).
// Every output equals bias_grads_in_gemm's on the context's stream bit for bit (the same
// plans and epilogue, only another stream, workspace and sums buffer), the FFN's second
// layer (linear_relu_backward, which the candidate's own twin leaves to the whole model)
// among the cases; in bf16 the aligned layers with db both went beside and took their
// sums in the product (counted); and captured into a graph (a branch of it, joined) once
// the buffer has grown outside the capture, equal too, beside and summed in the product.
TEST(CudaCandidateBiasGradsInGemm, BesideEqualsOnTheContextsStreamBitForBit) {
  THPC_REQUIRE_GPU();
  CudaKernelChoice inline_kernels, beside_kernels;
  inline_kernels.candidates = kReluMasks | kBiasGradsInGemm | kStepGraphs;
  beside_kernels.candidates = kReluMasks | kBiasGradsInGemm | kWeightGradsBeside | kStepGraphs;
  std::vector<LayerBackwardCase> cases = kAlignedLayerCases;
  cases.push_back({3125, 2048, 512, true, GradStore::kWrite, true});  // one rank's rows
  cases.push_back({33, 129, 17, true, GradStore::kAdd, false});
  for (DType dtype : gpu_compute_dtypes()) {
    SCOPED_TRACE(dtype_name(dtype));
    Twins on_stream(dtype, inline_kernels), beside(dtype, beside_kernels);
    uint32_t seed = 3500;
    for (const LayerBackwardCase& c : cases) {
      SCOPED_TRACE(::testing::Message() << "M=" << c.M << " K=" << c.K << " N=" << c.N
                                        << (c.relu ? " relu" : "") << " db=" << c.with_db);
      const auto expected = layer_backward(*on_stream.gpu, dtype, c, seed);
      const int64_t went_beside = weight_grads_beside(), summed = bias_grads_in_gemm();
      EXPECT_EQ(layer_backward(*beside.gpu, dtype, c, seed), expected);
      // bf16, every operand 16-byte aligned, db asked for: both candidates took it (fp32
      // may have no BGRADA plan; the odd shapes may take cublasGemmEx).
      const bool aligned = c.M % 8 == 0 && c.K % 8 == 0 && c.N % 8 == 0;
      if (!twin_rehearsal() && dtype == DType::BF16 && aligned && c.with_db) {
        EXPECT_EQ(weight_grads_beside(), went_beside + 1) << "the products did not go beside";
        EXPECT_EQ(bias_grads_in_gemm(), summed + 1) << "the sums were not taken in dW's product";
      }
      ++seed;
    }
    if (twin_rehearsal()) continue;  // the CPU stands in: one stream, no graphs
    for (const LayerBackwardCase& c : {cases[1], cases[3]}) {
      SCOPED_TRACE(::testing::Message() << "captured M=" << c.M << " K=" << c.K << " N=" << c.N);
      const auto expected = layer_backward(*on_stream.gpu, dtype, c, seed);
      // Once uncaptured first: the side stream's sums buffer grows outside the capture.
      EXPECT_EQ(layer_backward(*beside.gpu, dtype, c, seed), expected);
      const int64_t went_beside = weight_grads_beside(), summed = bias_grads_in_gemm();
      EXPECT_EQ(layer_backward(*beside.gpu, dtype, c, seed, true), expected);
      if (dtype == DType::BF16) {
        EXPECT_EQ(weight_grads_beside(), went_beside + 1) << "the capture's products stayed";
        EXPECT_EQ(bias_grads_in_gemm(), summed + 1) << "the capture's sums took the ones";
      }
      ++seed;
    }
  }
}

// transformer_bench_step --gemm-sweep (kernels/gemm_sweep.h): the cuBLASLt products a
// layer's forward and backward ran, counted by shape from count_gemm_uses() on, and for
// each shape the heuristic's first offers timed on random operands, every offer computing
// the first's product. Bound: each offer sums in fp32 and rounds its output once, so two
// offers differ by at most one unit in the last place of the output type (eps(bf16) =
// 2^-7 of the value, so of the largest |D|) plus the fp32 sums' order (K eps(fp32) of the
// terms, < 1e-4 of |D| here); 2 eps(bf16) leaves room for both, and a wrong product (a
// transposed operand, a lost bias) is off by O(1).
TEST(CudaGemmSweep, CountsEachShapesUsesAndEveryOfferComputesTheFirstsProduct) {
  THPC_REQUIRE_REAL_GPU();
  const DType dtype = DType::BF16;
  Twins twins(dtype);
  constexpr int M = 304, K = 512, N = 256, kForwards = 3, kOffers = 4;
  std::mt19937 rng(4100);
  Scope scope(*twins.gpu);
  const Tensor x = scope.put(dtype, representable(random_values(size_t(M) * K, rng), dtype));
  const Tensor W = scope.put(dtype, representable(random_values(size_t(K) * N, rng), dtype));
  const Tensor b = scope.put(dtype, representable(random_values(size_t(N), rng), dtype));
  Tensor y = scope.alloc(dtype, int64_t(M) * N);
  count_gemm_uses();
  for (int i = 0; i < kForwards; ++i) twins.gpu->linear_forward(y, x, W, b, M, K, N);
  layer_backward(*twins.gpu, dtype, {M, K, N, true, GradStore::kAdd, false}, 4101);
  std::vector<GemmSweepRow> rows;
  ASSERT_TRUE(sweep_gemm_algorithms(kOffers, rows));
  // The forward's product: column-major y^T [N, M] = W^T [N, K] x^T [K, M], with its bias.
  const std::string forward = "m=" + std::to_string(N) + " n=" + std::to_string(M) +
                              " k=" + std::to_string(K) + " op=NN ab=bf16 c=bf16 beta=0 "
                              "epilogue=bias";
  bool forward_seen = false;
  ASSERT_GE(rows.size(), 3u) << "the forward's, dx's and dW's products";
  for (const GemmSweepRow& row : rows) {
    SCOPED_TRACE(row.product);
    if (row.product.rfind(forward, 0) == 0) {
      forward_seen = true;
      EXPECT_EQ(row.uses, kForwards);
    } else {
      EXPECT_EQ(row.uses, 1);
    }
    EXPECT_GE(row.algorithms, 1);
    EXPECT_LE(row.algorithms, kOffers);
    EXPECT_GE(row.best, 0);
    EXPECT_LT(row.best, row.algorithms);
    EXPECT_GT(row.heuristic_us, 0.0);
    EXPECT_LE(row.best_us, row.heuristic_us);
    EXPECT_LE(row.max_relative_difference, 2 * eps_of(DType::BF16));
  }
  EXPECT_TRUE(forward_seen) << "no product " << forward;
}

// The tied output projection's backward with the candidate: dE beside dh (one rank's
// batch against a vocabulary of 8,000, and odd shapes), bit for bit the verified kernels',
// dh added or written, counted where both took cuBLASLt plans.
TEST(CudaCandidateWeightGradsBeside, OutputProjectionGradientsEqualTheVerifiedBitForBit) {
  THPC_REQUIRE_GPU();
  CudaKernelChoice beside_kernels;
  beside_kernels.candidates = kWeightGradsBeside;
  struct Case {
    int M, d, vocab;
    GradStore store;
  };
  // The first two aligned (every leading dimension a multiple of 16 bytes: cuBLASLt has a
  // plan, so dE goes beside, counted); the last two odd (d_logits' rows of 4,099 or 517
  // elements: a plan may be missing and dE stays on the stream, bit for bit all the same).
  const std::vector<Case> cases = {{300, 512, 8000, GradStore::kWrite},
                                   {128, 256, 4096, GradStore::kAdd},
                                   {64, 512, 4099, GradStore::kAdd},
                                   {33, 129, 517, GradStore::kWrite}};
  const size_t aligned_cases = 2;
  for (DType dtype : gpu_compute_dtypes()) {
    SCOPED_TRACE(dtype_name(dtype));
    Twins verified(dtype), beside(dtype, beside_kernels);
    uint32_t seed = 3100;
    for (const Case& c : cases) {
      SCOPED_TRACE(::testing::Message() << "M=" << c.M << " d=" << c.d << " vocab=" << c.vocab
                                        << " " << StoreMode{c.store}.name());
      const auto run = [&](Backend& backend) {
        std::mt19937 rng(seed);
        const size_t Md = size_t(c.M) * c.d, MV = size_t(c.M) * c.vocab,
                     Vd = size_t(c.vocab) * c.d;
        Scope scope(backend);
        const Tensor d_logits = scope.put(dtype, representable(random_values(MV, rng), dtype));
        const Tensor h = scope.put(dtype, representable(random_values(Md, rng), dtype));
        const Tensor E = scope.put(dtype, representable(random_values(Vd, rng), dtype));
        Tensor dh = scope.put(dtype, StoreMode{c.store}.start(random_values(Md, rng)));
        Tensor dE = scope.put(DType::F32, random_values(Vd, rng));
        backend.output_projection_backward(dh, dE, d_logits, h, E, c.M, c.d, c.vocab, c.store);
        return std::vector<std::vector<float>>{scope.get(dh), scope.get(dE)};
      };
      const int64_t before = weight_grads_beside();
      const std::vector<std::vector<float>> beside_results = run(*beside.gpu);
      const int64_t went_beside = weight_grads_beside() - before;
      EXPECT_EQ(beside_results, run(*verified.gpu));
      // Each aligned case itself (an odd case's plan may go beside too: not a stand-in).
      if (!twin_rehearsal() && static_cast<size_t>(&c - cases.data()) < aligned_cases) {
        EXPECT_EQ(went_beside, 1) << "the aligned product did not go beside";
      }
      ++seed;
    }
  }
}

// ---- tied output projection -----------------------------------------------------------

struct ProjectionShape {
  int M, d, vocab;
};

const std::vector<ProjectionShape> kProjectionShapes = {
    {1, 37, 61}, {9, 64, 1001}, {33, 129, 517}, {64, 512, 4099}};

TEST(CudaOutputProjection, ForwardMatchesCpu) {
  THPC_REQUIRE_GPU();
  uint32_t seed = 600;
  for (DType dtype : gpu_compute_dtypes()) {
    for (const ProjectionShape& s : kProjectionShapes) {
      SCOPED_TRACE(::testing::Message() << dtype_name(dtype) << " M=" << s.M << " d=" << s.d
                                        << " vocab=" << s.vocab);
      std::mt19937 rng(seed++);
      const auto h = representable(random_values(static_cast<size_t>(s.M) * s.d, rng), dtype);
      const auto E =
          representable(random_values(static_cast<size_t>(s.vocab) * s.d, rng), dtype);
      Twins twins(dtype);
      Scope cpu(*twins.cpu), gpu(*twins.gpu);
      const int64_t count = static_cast<int64_t>(s.M) * s.vocab;
      Tensor logits_cpu = cpu.alloc(DType::F32, count), logits_gpu = gpu.alloc(dtype, count);
      twins.cpu->output_projection_forward(logits_cpu, cpu.put(DType::F32, h),
                                           cpu.put(DType::F32, E), s.M, s.d, s.vocab);
      twins.gpu->output_projection_forward(logits_gpu, gpu.put(dtype, h), gpu.put(dtype, E),
                                           s.M, s.d, s.vocab);
      // logits [M, V] = h [M, d] E^T: E^T(l, j) = E[j*d + l]
      const auto scale = product_scale(s.M, s.vocab, s.d, h, s.d, 1, E, 1, s.d, nullptr);
      EXPECT_TRUE(within_scaled(gpu.get(logits_gpu), cpu.get(logits_cpu), scale,
                                gemm_factor(s.d, dtype)));
    }
  }
}

void check_output_projection_backward(DType dtype, const ProjectionShape& s, bool want_dh,
                                      bool want_dE, uint32_t seed, const StoreMode& mode = {}) {
  SCOPED_TRACE(::testing::Message() << dtype_name(dtype) << " M=" << s.M << " d=" << s.d
                                    << " vocab=" << s.vocab << " dh=" << want_dh
                                    << " dE=" << want_dE << " " << mode.name());
  std::mt19937 rng(seed);
  const size_t Md = static_cast<size_t>(s.M) * s.d, Vd = static_cast<size_t>(s.vocab) * s.d,
               MV = static_cast<size_t>(s.M) * s.vocab;
  const auto h = representable(random_values(Md, rng), dtype);
  const auto E = representable(random_values(Vd, rng), dtype);
  const auto dl = representable(random_values(MV, rng), dtype);
  const auto dh0 = representable(random_values(Md, rng), dtype);
  const auto dE0 = random_values(Vd, rng);
  Twins twins(dtype);
  Scope cpu(*twins.cpu), gpu(*twins.gpu);
  Tensor dh_cpu = want_dh ? cpu.put(DType::F32, mode.start(dh0)) : Tensor{};
  Tensor dE_cpu = want_dE ? cpu.put(DType::F32, dE0) : Tensor{};
  Tensor dh_gpu = want_dh ? gpu.put(dtype, mode.start(dh0)) : Tensor{};
  Tensor dE_gpu = want_dE ? gpu.put(DType::F32, dE0) : Tensor{};
  twins.cpu->output_projection_backward(dh_cpu, dE_cpu, cpu.put(DType::F32, dl),
                                        cpu.put(DType::F32, h), cpu.put(DType::F32, E), s.M,
                                        s.d, s.vocab, mode.store);
  twins.gpu->output_projection_backward(dh_gpu, dE_gpu, gpu.put(dtype, dl), gpu.put(dtype, h),
                                        gpu.put(dtype, E), s.M, s.d, s.vocab, mode.store);
  if (want_dh) {  // dh [M, d] += dl [M, V] E [V, d]
    const auto dh_onto = mode.onto(dh0);
    const auto scale = product_scale(s.M, s.d, s.vocab, dl, s.vocab, 1, E, s.d, 1, &dh_onto);
    EXPECT_TRUE(within_scaled(gpu.get(dh_gpu), cpu.get(dh_cpu), scale,
                              gemm_factor(s.vocab, dtype)))
        << "dh";
  }
  if (want_dE) {  // dE [V, d] += dl^T [V, M] h [M, d]: dl^T(i, l) = dl[l*V + i]
    const auto scale = product_scale(s.vocab, s.d, s.M, dl, 1, s.vocab, h, s.d, 1, &dE0);
    EXPECT_TRUE(within_scaled(gpu.get(dE_gpu), cpu.get(dE_cpu), scale,
                              gemm_factor(s.M, DType::F32)))
        << "dE";
  }
}

TEST(CudaOutputProjection, BackwardMatchesCpu) {
  THPC_REQUIRE_GPU();
  uint32_t seed = 700;
  for (DType dtype : gpu_compute_dtypes()) {
    for (const ProjectionShape& s : kProjectionShapes) {
      for (int nulls = 0; nulls < 3; ++nulls) {  // 0: both, 1: dh only, 2: dE only
        check_output_projection_backward(dtype, s, nulls != 2, nulls != 1, seed++);
      }
    }
  }
}

// ---- GradStore::kWrite: the activation gradient written, not added into ----------------
// GEMMs with beta = 0, the ReLU kernels storing without a load. The outputs start as NaN:
// an element left unwritten fails. Shapes as above plus the empty products (K = 0 or
// N = 0: a zero gradient to write).
TEST(CudaLinear, BackwardWritingMatchesCpu) {
  THPC_REQUIRE_GPU();
  uint32_t seed = 5000;
  for (DType dtype : gpu_compute_dtypes()) {
    const StoreMode mode{GradStore::kWrite};
    for (const LinearShape& shape : kLinearShapes) {
      check_linear_backward(dtype, shape, {true, true, true}, seed++, mode);
    }
    check_linear_backward(dtype, {65, 33, 17}, {true, false, false}, seed++, mode);
    check_linear_backward(dtype, {4, 6, 0}, {true, false, false}, seed++, mode);
    check_relu_bias_backward(dtype, {1000, 129}, true, true, seed++, mode);    // scalar kernel
    check_relu_bias_backward(dtype, {3000, 2048}, true, true, seed++, mode);   // vectors
    check_relu_bias_backward(dtype, {131, 8}, true, false, seed++, mode);
    for (const ProjectionShape& s : kProjectionShapes) {
      check_output_projection_backward(dtype, s, true, true, seed++, mode);
    }
    check_output_projection_backward(dtype, {33, 129, 517}, true, false, seed++, mode);
  }
}

}  // namespace
}  // namespace thpc::test
