// Label-smoothed cross-entropy and log-softmax (kernels/cpu/cross_entropy.cc,
// kernels/cuda/cross_entropy.cu): the CPU reference against the direct formulas and
// central finite differences (cpu_reference.h), then the CUDA twins.
// The CUDA twins run the op on the GPU and on the CPU reference backend (tests/cuda_twin.h)
// in fp32 and bf16; without a GPU (or in a CPU-only build) they report SKIPPED.
//
// The twins cover pad rows, eps 0 and 0.1, aliasing, a 37000-ish and a small odd
// vocabulary, sums only, each row's nll (softmax_nll_rows), and a bad target id.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "common/error.h"
#include "cpu_reference.h"
#include "kernels/cpu/row_max.h"
#include "cuda_twin.h"
#include "expect_error.h"
#include "kernels/cpu/cpu_ops.h"

namespace thpc::cpu_test {
namespace {

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

// softmax_nll_rows keeps the loss op's rows apart: 0 on pad rows, the direct formula
// elsewhere, and a run of rows added in order from 0 gives the loss op's nll over that run
// bit for bit, in double and in float at a model's vocabulary (the libmvec rows): so
// scoring's sentences, summed from the rows, keep the bits of one loss call a sentence.
// A bad target throws, naming its row.
TEST(CrossEntropy, NllRowsAreTheLossOpsRowsKeptApart) {
  std::mt19937 rng(67);
  const CrossEntropyProblem problem(rng);
  constexpr int kRows = CrossEntropyProblem::kRows, kVocab = CrossEntropyProblem::kVocab;
  constexpr int kPad = CrossEntropyProblem::kPad;
  const std::vector<double> nll = cpu::softmax_nll_rows<double>(
      problem.logits.data(), problem.targets.data(), kRows, kVocab, kPad);
  ASSERT_EQ(nll.size(), static_cast<size_t>(kRows));
  for (int r = 0; r < kRows; ++r) {
    const int target = problem.targets[static_cast<size_t>(r)];
    if (target == kPad) {
      EXPECT_EQ(nll[static_cast<size_t>(r)], 0.0) << r;
      continue;
    }
    EXPECT_NEAR(nll[static_cast<size_t>(r)],
                direct_negative_log_probability(problem.logits.data() + r * kVocab, kVocab,
                                                target),
                1e-13)
        << r;
  }
  const auto run_sum = [](const std::vector<double>& rows, int begin, int end) {
    double sum = 0.0;
    for (int r = begin; r < end; ++r) sum += rows[static_cast<size_t>(r)];
    return sum;
  };
  for (const auto& [begin, end] : {std::pair{0, kRows}, std::pair{1, 5}, std::pair{3, 7}}) {
    const LossSums sums = cpu::softmax_cross_entropy<double>(
        nullptr, problem.logits.data() + begin * kVocab, problem.targets.data() + begin,
        end - begin, kVocab, 0.1f, kPad, 1.0f);
    EXPECT_EQ(run_sum(nll, begin, end), sums.nll) << begin << ".." << end;
  }

  const int rows = 5, vocab = 8003;
  const std::vector<int32_t> targets{17, 8002, kPad, 1, 4000};
  std::vector<float> logits(static_cast<size_t>(rows) * vocab);
  std::uniform_real_distribution<float> uniform(-10.0f, 10.0f);
  for (float& z : logits) z = uniform(rng);
  const std::vector<double> float_rows =
      cpu::softmax_nll_rows<float>(logits.data(), targets.data(), rows, vocab, kPad);
  EXPECT_EQ(float_rows[2], 0.0);
  for (const auto& [begin, end] : {std::pair{0, rows}, std::pair{3, 5}}) {
    const LossSums sums = cpu::softmax_cross_entropy<float>(
        nullptr, logits.data() + static_cast<size_t>(begin) * vocab, targets.data() + begin,
        end - begin, vocab, 0.0f, kPad, 1.0f);
    EXPECT_EQ(run_sum(float_rows, begin, end), sums.nll) << begin << ".." << end;
  }

  std::vector<int32_t> bad = problem.targets;
  bad[4] = -3;
  expect_error([&] {
    cpu::softmax_nll_rows<double>(problem.logits.data(), bad.data(), kRows, kVocab, kPad);
  }, {"target id -3", "row 4", "[0, 9)"});
  EXPECT_TRUE(cpu::softmax_nll_rows<double>(nullptr, nullptr, 0, kVocab, kPad).empty());
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

// The fp32 rows take their own path (exponentials in float, four at a time through
// libmvec, a float gradient): against the double instantiation at a model's vocabulary
// (8003: 2000 groups of four and a scalar tail of 3), logits of a trained model's spread,
// with the gradient written over the logits. Tolerances: each exp errs by <= 4 float ulps
// (libmvec) plus |z - max| * 2^-24 from rounding its argument to float (|z - max| <= 40
// here: 2.4e-6 relative), so each row's log-sum-exp by ~3e-6 and the loss sums by
// ~3e-6 per row (1e-5 per row allowed); the gradient p_j - q_j by ~3e-6 relative to p_j
// plus two float roundings of terms <= grad_scale (rel 1e-5, abs 2^-24 * grad_scale * 4).
TEST(CrossEntropy, FloatRowsAgreeWithDoubleAtAModelsVocabulary) {
  std::mt19937 rng(62);
  const int rows = 6, vocab = 8003, pad = 0;
  const std::vector<int32_t> targets{17, 8002, pad, 1, 4000, 8000};
  std::vector<float> logits_float(static_cast<size_t>(rows) * vocab);
  Values logits_double(logits_float.size());
  std::uniform_real_distribution<float> uniform(-10.0f, 10.0f);
  for (size_t e = 0; e < logits_float.size(); ++e) {
    logits_float[e] = uniform(rng);
    logits_double[e] = logits_float[e];  // the same inputs, exactly
  }
  const float eps = 0.1f, grad_scale = 0.37f;
  Values d_double(logits_double.size());
  const LossSums from_double =
      cpu::softmax_cross_entropy<double>(d_double.data(), logits_double.data(), targets.data(),
                                         rows, vocab, eps, pad, grad_scale);
  std::vector<float> d_float = logits_float;  // in place: the output aliases the logits
  const LossSums from_float = cpu::softmax_cross_entropy<float>(
      d_float.data(), d_float.data(), targets.data(), rows, vocab, eps, pad, grad_scale);
  EXPECT_EQ(from_float.tokens, from_double.tokens);
  EXPECT_NEAR(from_float.loss, from_double.loss, 1e-5 * rows);
  EXPECT_NEAR(from_float.nll, from_double.nll, 1e-5 * rows);
  const double abs_tolerance = 4 * std::ldexp(1.0, -24) * grad_scale;
  for (size_t e = 0; e < d_double.size(); ++e) {
    ASSERT_NEAR(d_float[e], d_double[e], abs_tolerance + 1e-5 * std::abs(d_double[e])) << e;
  }
  // log_softmax of the same rows: the log-sum-exp as above, then one float rounding of
  // z - lse (|z - lse| < 32: 2^-19 absolute).
  std::vector<float> log_probs_float(logits_float.size());
  Values log_probs_double(logits_double.size());
  cpu::log_softmax<float>(log_probs_float.data(), logits_float.data(), rows, vocab);
  cpu::log_softmax<double>(log_probs_double.data(), logits_double.data(), rows, vocab);
  for (size_t e = 0; e < log_probs_double.size(); ++e) {
    ASSERT_NEAR(log_probs_float[e], log_probs_double[e], 1e-5) << e;
  }
}

// The step's form adds each micro-batch's sums into a StepTotals in micro-batch order:
// the same bits as adding the sums softmax_cross_entropy returns (what the trainer did
// before), the same gradient, and a row with a bad target counted and skipped.
template <typename T>
void expect_added_sums_are_the_returned_ones() {
  std::mt19937 rng(65);
  constexpr int kRows = CrossEntropyProblem::kRows, kVocab = CrossEntropyProblem::kVocab;
  std::unique_ptr<Backend> backend = make_cpu_backend(dtype_of<T>());
  StepTotalsBuffer totals(*backend);
  std::vector<T> bytes(sizeof(StepTotals) / sizeof(T));
  LossSums expected;
  for (int micro = 0; micro < 3; ++micro) {
    const CrossEntropyProblem problem(rng);
    const std::vector<T> logits(problem.logits.begin(), problem.logits.end());
    std::vector<T> returned_grad(logits.size()), added_grad(logits.size());
    const LossSums returned = cpu::softmax_cross_entropy<T>(
        returned_grad.data(), logits.data(), problem.targets.data(), kRows, kVocab, 0.1f,
        CrossEntropyProblem::kPad, 0.37f);
    expected.loss += returned.loss;
    expected.nll += returned.nll;
    expected.tokens += returned.tokens;
    backend->download(bytes.data(), totals.tensor());
    StepInputs inputs;
    inputs.grad_scale = 0.37f;
    cpu::softmax_cross_entropy_add<T>(added_grad.data(), logits.data(), problem.targets.data(),
                                      kRows, kVocab, 0.1f, CrossEntropyProblem::kPad, &inputs,
                                      bytes.data());
    backend->upload(totals.tensor(), bytes.data());
    EXPECT_EQ(added_grad, returned_grad) << "micro-batch " << micro;
  }
  const StepTotals sums = totals.read(kVocab);
  EXPECT_EQ(sums.loss, expected.loss);  // bit for bit: the same adds in the same order
  EXPECT_EQ(sums.nll, expected.nll);
  EXPECT_EQ(sums.tokens, expected.tokens);
  EXPECT_EQ(sums.bad_rows, 0);
  EXPECT_EQ(sums.grad_squares, 0.0);
}

TEST(CrossEntropy, AddedSumsAreTheReturnedSumsInMicroBatchOrder) {
  expect_added_sums_are_the_returned_ones<double>();
  expect_added_sums_are_the_returned_ones<float>();
}

TEST(CrossEntropy, AddCountsBadTargetsAndTheReadNamesTheFirst) {
  std::mt19937 rng(66);
  constexpr int kRows = CrossEntropyProblem::kRows, kVocab = CrossEntropyProblem::kVocab;
  CrossEntropyProblem problem(rng);
  std::unique_ptr<Backend> backend = make_cpu_backend(DType::F64);
  StepTotalsBuffer totals(*backend);
  Values bytes(sizeof(StepTotals) / sizeof(double));
  backend->download(bytes.data(), totals.tensor());
  // Row 3's target is the vocabulary size, row 6's negative; the other rows count.
  std::vector<int32_t> bad_targets = problem.targets;
  bad_targets[3] = kVocab;
  bad_targets[6] = -5;
  Values d_logits(problem.logits.size(), 7.0);
  StepInputs inputs;
  inputs.grad_scale = 1.0f;
  cpu::softmax_cross_entropy_add<double>(d_logits.data(), problem.logits.data(),
                                         bad_targets.data(), kRows, kVocab, 0.1f,
                                         CrossEntropyProblem::kPad, &inputs, bytes.data());
  StepTotals sums;
  std::memcpy(static_cast<void*>(&sums), bytes.data(), sizeof(sums));
  EXPECT_EQ(sums.bad_rows, 2);
  EXPECT_EQ(sums.first_bad_row, 3);
  EXPECT_EQ(sums.first_bad_target, kVocab);
  EXPECT_EQ(sums.tokens, 3);  // 7 rows: 2 pad, 2 bad
  for (int j = 0; j < kVocab; ++j) EXPECT_EQ(d_logits[3 * kVocab + j], 7.0) << j;  // skipped
  // The good rows' sums are those of the same rows with the bad ones made padding.
  std::vector<int32_t> padded = bad_targets;
  padded[3] = padded[6] = CrossEntropyProblem::kPad;
  const LossSums good = cpu::softmax_cross_entropy<double>(
      nullptr, problem.logits.data(), padded.data(), kRows, kVocab, 0.1f,
      CrossEntropyProblem::kPad, 1.0f);
  EXPECT_EQ(sums.loss, good.loss);
  EXPECT_EQ(sums.nll, good.nll);
  backend->upload(totals.tensor(), bytes.data());
  expect_error([&] { totals.read(kVocab); }, {"target id 9 at row 3", "[0, 9)"});
}

}  // namespace
}  // namespace thpc::cpu_test

namespace thpc::test {
namespace {

constexpr int kPad = 1;

struct LossCase {
  std::string name;
  int rows, vocab;
  float eps;
  int pad_rows;  // rows whose target is the pad id
};

std::vector<LossCase> loss_cases() {
  return {
      {"small_odd_vocab", 9, 37, 0.1f, 3},
      {"small_odd_vocab_no_smoothing", 7, 37, 0.0f, 2},
      {"vocab_1003", 13, 1003, 0.1f, 4},
      {"vocab_37003", 5, 37003, 0.1f, 1},
      {"vocab_37003_no_smoothing", 4, 37003, 0.0f, 0},
  };
}

// Random logits in [-4, 4] (a realistic spread: probabilities span e^8) and targets in
// [0, vocab) other than the pad id, with `pad_rows` rows set to the pad id.
struct LossData {
  std::vector<float> logits;
  std::vector<int32_t> targets;
  LossData(const LossCase& c, DType dtype, std::mt19937& rng) {
    logits = representable(random_values(static_cast<size_t>(c.rows) * c.vocab, rng, -4.0f,
                                          4.0f), dtype);
    std::uniform_int_distribution<int32_t> id(0, c.vocab - 1);
    targets.resize(static_cast<size_t>(c.rows));
    for (int32_t& t : targets) {
      do t = id(rng);
      while (t == kPad);
    }
    for (int r = 0; r < c.pad_rows; ++r) targets[static_cast<size_t>((r * 5 + 1) % c.rows)] = kPad;
  }
};

struct LossResult {
  LossSums sums;
  std::vector<float> d_logits;
};

// mode 0: separate d_logits; 1: d_logits aliases logits; 2: sums only (null d_logits).
LossResult run_loss(Backend& backend, DType dtype, const LossCase& c, const LossData& data,
                    float grad_scale, int mode) {
  Scope scope(backend);
  const Tensor logits = scope.put(dtype, data.logits);
  const int32_t* targets = scope.put_ids(data.targets);
  const Tensor d_logits = mode == 0   ? scope.alloc(dtype, logits.numel)
                          : mode == 1 ? logits
                                      : Tensor{};
  LossResult result;
  result.sums = backend.softmax_cross_entropy(d_logits, logits, targets, c.rows, c.vocab, c.eps,
                                              kPad, grad_scale);
  if (d_logits) result.d_logits = scope.get(d_logits);
  return result;
}

// The sums: both sides read the same logits and the GPU keeps fp32 row statistics (the
// CPU double): the log-sum-exp of up to 37003 terms errs by ~sqrt(V) * 2^-24 relative,
// ~1e-5 absolute per row, in either precision (bf16 only rounds the gradient).
// The gradient p - q: fp32, the exp of an argument with ~1e-5 error: rel 1e-4, abs
// 1e-5 * grad_scale; bf16, one rounding of the output: rel eps (2^-7 >= 2 * 2^-9).
void expect_sums_close(const LossSums& gpu, const LossSums& cpu, int rows) {
  EXPECT_EQ(gpu.tokens, cpu.tokens);
  EXPECT_NEAR(gpu.loss, cpu.loss, 1e-4 * rows + 1e-5 * std::abs(cpu.loss));
  EXPECT_NEAR(gpu.nll, cpu.nll, 1e-4 * rows + 1e-5 * std::abs(cpu.nll));
}

// The GPU's loss, gradient and sums against the CPU's on `cases`, with `kernels`.
void expect_cross_entropy_matches_cpu(const std::vector<LossCase>& cases,
                                      const CudaKernelChoice& kernels = {}) {
  for (DType dtype : gpu_compute_dtypes()) {
    std::mt19937 rng(21);
    for (const LossCase& c : cases) {
      for (int mode = 0; mode < 3; ++mode) {
        SCOPED_TRACE(c.name + " in " + dtype_name(dtype) + " mode " + std::to_string(mode));
        Twins twins(dtype, kernels);
        const LossData data(c, dtype, rng);
        const float grad_scale = 0.37f;
        const LossResult cpu = run_loss(*twins.cpu, DType::F32, c, data, grad_scale, mode);
        const LossResult gpu = run_loss(*twins.gpu, dtype, c, data, grad_scale, mode);
        expect_sums_close(gpu.sums, cpu.sums, c.rows);
        const double eps = eps_of(dtype);
        const double abs_tol = 1e-5 * grad_scale;
        const double rel_tol = dtype == DType::F32 ? 1000 * eps : eps;
        EXPECT_TRUE(all_close(gpu.d_logits, cpu.d_logits, abs_tol, rel_tol));
        // Pad rows are exactly zero.
        for (int r = 0; r < c.rows && !gpu.d_logits.empty(); ++r) {
          if (data.targets[static_cast<size_t>(r)] != kPad) continue;
          for (int j = 0; j < c.vocab; ++j) {
            ASSERT_EQ(gpu.d_logits[static_cast<size_t>(r) * c.vocab + j], 0.0f) << "pad row " << r;
          }
        }
        // Deterministic: the same call gives the same sums, bit for bit.
        if (mode == 2) {
          const LossResult again = run_loss(*twins.gpu, dtype, c, data, grad_scale, mode);
          EXPECT_EQ(again.sums.loss, gpu.sums.loss);
          EXPECT_EQ(again.sums.nll, gpu.sums.nll);
        }
      }
    }
  }
}

TEST(CudaCrossEntropy, MatchesCpu) {
  THPC_REQUIRE_GPU();
  expect_cross_entropy_matches_cpu(loss_cases());
}

// The odd vocabularies above take the scalar loops; a multiple of 8 (both precisions'
// vector widths) takes the 16-byte vectors, in blocks of 512, two an SM, the second pass
// streaming (kernels/cuda/cross_entropy.cu; the former candidate loss_rows_from_l2): one
// vector a row, an odd number of vectors (a row's last pair of loads is a single one),
// every thread two vectors and one, the model's 37,000. Launches are counted: a
// vectorised vocabulary that the scalar kernel took would prove nothing.
void expect_vectorized_rows_match_cpu(const CudaKernelChoice& kernels) {
  const int64_t before = loss_rows_from_l2_launches();
  expect_cross_entropy_matches_cpu(loss_cases(), kernels);
  EXPECT_EQ(loss_rows_from_l2_launches(), before) << "an odd vocabulary took the vectors";
  expect_cross_entropy_matches_cpu({
      {"vocab_8", 9, 8, 0.1f, 2},
      {"vocab_2056", 11, 2056, 0.1f, 3},
      {"vocab_4104_all_threads_two_vectors_and_one", 3, 4104, 0.1f, 1},
      {"vocab_37000", 5, 37000, 0.1f, 1},
      {"vocab_37000_no_smoothing", 4, 37000, 0.0f, 0},
  }, kernels);
  if (!twin_rehearsal()) {
    // 5 cases x 3 modes (the deterministic repeat a fourth call) per compute dtype.
    EXPECT_EQ(loss_rows_from_l2_launches() - before,
              5 * 4 * static_cast<int64_t>(gpu_compute_dtypes().size()));
  }
}

TEST(CudaCrossEntropy, VectorizedRowsMatchCpu) {
  THPC_REQUIRE_GPU();
  expect_vectorized_rows_match_cpu({});
}

// The candidate fast_loss_exp (the vectorised rows' exps as the hardware's exp2,
// kernels/cuda/cross_entropy.cu's row_exp): the same cases and bounds, which hold each
// row's loss to 1e-4 and the fp32 gradient to 1000 eps (1.2e-4 relative), where its
// exps err by ~1e-6; an exp of the wrong base (2^x for e^x) misses by far.
TEST(CudaCandidateFastLossExp, VectorizedRowsMatchCpu) {
  THPC_REQUIRE_GPU();
  expect_vectorized_rows_match_cpu(kernels_with(kFastLossExp));
}

TEST(CudaCrossEntropy, AllPadRowsAndNoRows) {
  THPC_REQUIRE_GPU();
  for (DType dtype : gpu_compute_dtypes()) {
    std::mt19937 rng(22);
    Twins twins(dtype);
    const LossCase all_pad{"all_pad", 3, 41, 0.1f, 3};
    LossData data(all_pad, dtype, rng);
    for (int32_t& t : data.targets) t = kPad;
    const LossResult gpu = run_loss(*twins.gpu, dtype, all_pad, data, 1.0f, 0);
    EXPECT_EQ(gpu.sums.tokens, 0);
    EXPECT_EQ(gpu.sums.loss, 0.0);
    EXPECT_EQ(gpu.d_logits, std::vector<float>(gpu.d_logits.size(), 0.0f));
    const LossSums none = twins.gpu->softmax_cross_entropy(Tensor{}, Tensor{}, nullptr, 0, 41,
                                                           0.1f, kPad, 1.0f);
    EXPECT_EQ(none.tokens, 0);
  }
}

// softmax_cross_entropy_add, three micro-batches into one StepTotals, on `backend`.
struct AddedResult {
  StepTotals totals;       // read raw (a bad target does not throw here)
  LossSums returned;       // softmax_cross_entropy's sums of the same micro-batches, added
  std::vector<float> d_logits;  // all micro-batches' gradients, one after the other
};
// `returned`: also softmax_cross_entropy's sums (which throws on a bad target).
AddedResult run_added(Backend& backend, DType dtype, const LossCase& c,
                      const std::vector<LossData>& micro_batches, float grad_scale,
                      bool returned = true) {
  Scope scope(backend);
  StepTotalsBuffer totals(backend);
  StepInputsBuffer inputs(backend);
  StepInputs scale;
  scale.grad_scale = grad_scale;
  inputs.set(scale);
  AddedResult result;
  for (const LossData& data : micro_batches) {
    const Tensor logits = scope.put(dtype, data.logits);
    const int32_t* targets = scope.put_ids(data.targets);
    backend.softmax_cross_entropy_add(logits, logits, targets, c.rows, c.vocab, c.eps, kPad,
                                      inputs.in_backend(), totals.tensor());
    const std::vector<float> d_logits = scope.get(logits);
    result.d_logits.insert(result.d_logits.end(), d_logits.begin(), d_logits.end());
    if (!returned) continue;
    const Tensor again = scope.put(dtype, data.logits);
    const LossSums sums = backend.softmax_cross_entropy(Tensor{}, again, targets, c.rows,
                                                        c.vocab, c.eps, kPad, grad_scale);
    result.returned.loss += sums.loss;
    result.returned.nll += sums.nll;
    result.returned.tokens += sums.tokens;
  }
  backend.download(&result.totals, totals.tensor());
  return result;
}

// The step's form on the GPU (the sums added into the step's totals on the device; the
// former candidate step_totals, passed on an H200 on 2026-11-29): the sums equal the CPU's
// within expect_sums_close's tolerance times the three micro-batches, and bit for bit the
// GPU's own returned sums added in order (each micro-batch's sum comes from the same
// fixed tree); the gradients as softmax_cross_entropy's.
void expect_added_sums_match_cpu() {
  for (DType dtype : gpu_compute_dtypes()) {
    SCOPED_TRACE(dtype_name(dtype));
    std::mt19937 rng(24);
    for (const LossCase& c : {LossCase{"vocab_1003", 13, 1003, 0.1f, 4},
                              LossCase{"vocab_37000", 5, 37000, 0.1f, 1}}) {
      SCOPED_TRACE(c.name);
      Twins twins(dtype);
      const std::vector<LossData> micro = {LossData(c, dtype, rng), LossData(c, dtype, rng),
                                           LossData(c, dtype, rng)};
      const float grad_scale = 0.37f;
      const AddedResult cpu = run_added(*twins.cpu, DType::F32, c, micro, grad_scale);
      const AddedResult gpu = run_added(*twins.gpu, dtype, c, micro, grad_scale);
      const LossSums gpu_added{gpu.totals.loss, gpu.totals.nll, gpu.totals.tokens};
      const LossSums cpu_added{cpu.totals.loss, cpu.totals.nll, cpu.totals.tokens};
      expect_sums_close(gpu_added, cpu_added, 3 * c.rows);
      EXPECT_EQ(gpu.totals.loss, gpu.returned.loss);
      EXPECT_EQ(gpu.totals.nll, gpu.returned.nll);
      EXPECT_EQ(gpu.totals.tokens, gpu.returned.tokens);
      EXPECT_EQ(gpu.totals.bad_rows, 0);
      EXPECT_EQ(gpu.totals.grad_squares, 0.0);
      const double rel_tol = dtype == DType::F32 ? 1000 * eps_of(dtype) : eps_of(dtype);
      EXPECT_TRUE(all_close(gpu.d_logits, cpu.d_logits, 1e-5 * grad_scale, rel_tol));
    }
  }
}

// The step's form; the vocabulary of 37,000 takes the vectorised rows (counted).
TEST(CudaCrossEntropy, AddedSumsMatchCpu) {
  THPC_REQUIRE_GPU();
  const int64_t before = loss_rows_from_l2_launches();
  expect_added_sums_match_cpu();
  if (!twin_rehearsal()) {
    EXPECT_GT(loss_rows_from_l2_launches(), before);
  }
}

// A bad target in the step's form: counted on the device, as the CPU does, and the read
// of the step's totals names the first, before any update.
TEST(CudaCrossEntropy, AddedBadTargetsAreCountedAndTheReadThrows) {
  THPC_REQUIRE_GPU();
  for (DType dtype : gpu_compute_dtypes()) {
    SCOPED_TRACE(dtype_name(dtype));
    std::mt19937 rng(25);
    Twins twins(dtype);
    const LossCase c{"bad", 8, 37, 0.1f, 1};
    std::vector<LossData> micro = {LossData(c, dtype, rng), LossData(c, dtype, rng)};
    micro[1].targets[3] = 37;
    micro[1].targets[6] = -5;
    const AddedResult cpu = run_added(*twins.cpu, DType::F32, c, {micro[1]}, 1.0f, false);
    EXPECT_EQ(cpu.totals.bad_rows, 2);
    Scope scope(*twins.gpu);
    StepTotalsBuffer totals(*twins.gpu);
    StepInputsBuffer inputs(*twins.gpu);
    StepInputs scale;
    scale.grad_scale = 1.0f;
    inputs.set(scale);
    const auto add = [&](const LossData& data) {
      const Tensor logits = scope.put(dtype, data.logits);
      twins.gpu->softmax_cross_entropy_add(logits, logits, scope.put_ids(data.targets),
                                           c.rows, c.vocab, c.eps, kPad, inputs.in_backend(),
                                           totals.tensor());
    };
    add(micro[0]);
    add(micro[1]);
    StepTotals raw;
    twins.gpu->download(&raw, totals.tensor());
    EXPECT_EQ(raw.bad_rows, 2);
    EXPECT_EQ(raw.first_bad_row, 3);
    EXPECT_EQ(raw.first_bad_target, 37);
    EXPECT_EQ(raw.tokens, 2 * (c.rows - 1) - 2);  // a pad row in each, two bad
    expect_error([&] { totals.read(c.vocab); }, {"target id 37 at row 3", "[0, 37)"});
  }
}

// A target outside [0, vocab) that is not the pad id throws, naming the first such row
// and the id, as the CPU does.
TEST(CudaCrossEntropy, BadTargetThrows) {
  THPC_REQUIRE_GPU();
  for (DType dtype : gpu_compute_dtypes()) {
    std::mt19937 rng(23);
    Twins twins(dtype);
    const LossCase c{"bad", 8, 37, 0.1f, 1};
    LossData data(c, dtype, rng);
    data.targets[3] = 37;
    data.targets[6] = -5;
    expect_error([&] { run_loss(*twins.gpu, dtype, c, data, 1.0f, 0); },
                 {"target id 37", "row 3", "[0, 37)"});
    expect_error([&] { run_loss(*twins.cpu, DType::F32, c, data, 1.0f, 0); },
                 {"target id 37", "row 3", "[0, 37)"});
    // The backend is still usable afterwards.
    data.targets[3] = 2;
    data.targets[6] = 4;
    const LossResult ok = run_loss(*twins.gpu, dtype, c, data, 1.0f, 2);
    EXPECT_EQ(ok.sums.tokens, c.rows - 1);
  }
}

// softmax_nll_rows on the GPU: softmax_cross_entropy's row kernels as they are (the
// scalar ones at the odd vocabularies, the vectorised at 8 and 37,000), each row's nll
// read back: against the CPU's row by row, to the sums' bound for one row (1e-4 + 1e-5
// relative: the fp32 log-sum-exp of up to 37003 terms), in both compute dtypes (bf16
// rounds only the inputs, which both sides read); pad rows exactly 0; every other row
// positive (a row left unwritten would read as the NaN a call on NaN logits left in the
// scratch just before); no rows: nothing; a bad target throws naming its row, and the
// backend goes on.
TEST(CudaCrossEntropy, NllRowsMatchCpu) {
  THPC_REQUIRE_GPU();
  std::vector<LossCase> cases = loss_cases();
  cases.push_back({"vocab_8", 9, 8, 0.0f, 2});
  cases.push_back({"vocab_37000", 6, 37000, 0.0f, 2});
  for (DType dtype : gpu_compute_dtypes()) {
    std::mt19937 rng(24);
    Twins twins(dtype);
    const auto nll_rows = [&](Backend& backend, DType in, const LossCase& c,
                              const LossData& data) {
      Scope scope(backend);
      const Tensor logits = scope.put(in, data.logits);
      const int32_t* targets = scope.put_ids(data.targets);
      return backend.softmax_nll_rows(logits, targets, c.rows, c.vocab, kPad);
    };
    for (const LossCase& c : cases) {
      SCOPED_TRACE(c.name + " in " + dtype_name(dtype));
      const LossData data(c, dtype, rng);
      // First the same rows with NaN logits, so that the scratch the rows' nll pass through
      // holds NaN where a row of the next call would be left unwritten.
      LossData poison = data;
      for (float& z : poison.logits) z = NAN;
      nll_rows(*twins.gpu, dtype, c, poison);
      const std::vector<double> cpu = nll_rows(*twins.cpu, DType::F32, c, data);
      const std::vector<double> gpu = nll_rows(*twins.gpu, dtype, c, data);
      ASSERT_EQ(gpu.size(), cpu.size());
      for (size_t r = 0; r < gpu.size(); ++r) {
        if (data.targets[r] == kPad) {
          EXPECT_EQ(gpu[r], 0.0) << "pad row " << r;
          continue;
        }
        EXPECT_GT(gpu[r], 0.0) << r;
        EXPECT_NEAR(gpu[r], cpu[r], 1e-4 + 1e-5 * std::abs(cpu[r])) << r;
      }
    }
    const LossCase bad{"bad", 8, 37, 0.0f, 1};
    LossData data(bad, dtype, rng);
    data.targets[5] = 37;
    expect_error([&] { nll_rows(*twins.gpu, dtype, bad, data); },
                 {"target id 37", "row 5", "[0, 37)"});
    data.targets[5] = 2;
    EXPECT_EQ(nll_rows(*twins.gpu, dtype, bad, data).size(), 8u);
    EXPECT_TRUE(twins.gpu->softmax_nll_rows(Tensor{}, nullptr, 0, 37, kPad).empty());
  }
}

// log_softmax = z - lse: fp32, the lse of up to 37003 terms errs by ~1e-5 (and the
// outputs are ~-lse ~ -10): abs 200 eps + rel 100 eps; bf16, one rounding of the
// output (2^-9 relative) plus that: rel eps, abs 1e-4.
TEST(CudaLogSoftmax, MatchesCpuIncludingAliasing) {
  THPC_REQUIRE_GPU();
  for (DType dtype : gpu_compute_dtypes()) {
    std::mt19937 rng(31);
    for (const int vocab : {37, 1003, 37003}) {
      for (const bool alias : {false, true}) {
        SCOPED_TRACE("vocab " + std::to_string(vocab) + " in " + dtype_name(dtype) +
                     (alias ? " aliased" : ""));
        Twins twins(dtype);
        const int rows = vocab > 10000 ? 3 : 11;
        const std::vector<float> logits = representable(
            random_values(static_cast<size_t>(rows) * vocab, rng, -4.0f, 4.0f), dtype);
        auto run = [&](Backend& backend, DType type) {
          Scope scope(backend);
          const Tensor z = scope.put(type, logits);
          const Tensor out = alias ? z : scope.alloc(type, z.numel);
          backend.log_softmax(out, z, rows, vocab);
          return scope.get(out);
        };
        const std::vector<float> cpu = run(*twins.cpu, DType::F32);
        const std::vector<float> gpu = run(*twins.gpu, dtype);
        const double eps = eps_of(dtype);
        if (dtype == DType::F32) {
          EXPECT_TRUE(all_close(gpu, cpu, 200 * eps, 100 * eps));
        } else {
          EXPECT_TRUE(all_close(gpu, cpu, 1e-4, eps));
        }
      }
    }
  }
}

// The loss's row maximum in SSE lanes (kernels/cpu/row_max.h) is the plain loop's value
// for every length around the sixteen-lane blocks, a maximum in every position, rows of
// negative logits only, NaN logits (first: kept; elsewhere: skipped) and infinities.
TEST(CrossEntropy, RowMaxInLanesIsThePlainLoops) {
  const auto plain = [](const std::vector<float>& z) {
    float max = z[0];
    for (size_t j = 1; j < z.size(); ++j) max = z[j] > max ? z[j] : max;
    return max;
  };
  const auto same = [](float a, float b) { return (std::isnan(a) && std::isnan(b)) || a == b; };
  std::mt19937 random(11);
  std::uniform_real_distribution<float> uniform(-30.0f, 30.0f), negative(-60.0f, -30.0f);
  int checked = 0;
  for (int vocab = 1; vocab <= 70; ++vocab) {
    for (int at = 0; at < vocab; ++at) {
      std::vector<float> z(static_cast<size_t>(vocab));
      for (float& v : z) v = at % 2 == 0 ? uniform(random) : negative(random);
      z[at] = (at % 2 == 0 ? 100.0f : -20.0f) + static_cast<float>(at) / 8;  // the maximum
      EXPECT_EQ(cpu::row_max(z.data(), vocab), plain(z)) << vocab << " " << at;
      z[at] = std::numeric_limits<float>::quiet_NaN();  // skipped, unless first
      EXPECT_TRUE(same(cpu::row_max(z.data(), vocab), plain(z))) << vocab << " " << at;
      z[at] = std::numeric_limits<float>::infinity();
      EXPECT_EQ(cpu::row_max(z.data(), vocab), plain(z)) << vocab << " " << at;
      z[at] = -std::numeric_limits<float>::infinity();
      EXPECT_EQ(cpu::row_max(z.data(), vocab), plain(z)) << vocab << " " << at;
      checked += 4;
    }
  }
  EXPECT_GT(checked, 9000);
}

}  // namespace
}  // namespace thpc::test
