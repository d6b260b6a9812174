// The embedding op (kernels/cpu/embedding.cc, kernels/cuda/embedding.cu) and the
// sinusoidal position table (kernels/positions.h): the CPU reference against its
// formula and central finite differences (cpu_reference.h), then the CUDA twins.
// The CUDA twins run the op on the GPU and on the CPU reference backend (tests/cuda_twin.h)
// in fp32 and bf16; without a GPU (or in a CPU-only build) they report SKIPPED.
//
// Twin tolerances: the GPU performs the CPU's fp32 operations in the CPU's order, so
// fp32 results are bit-identical; a bf16 output is the CPU's fp32 result rounded once
// (rounding_rel); the fp32 gradients d_table, d_positions see the CPU's chain: exact.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "common/error.h"
#include "cpu_reference.h"
#include "cuda_twin.h"
#include "expect_error.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/positions.h"

namespace thpc::cpu_test {
namespace {

struct EmbeddingProblem {
  static constexpr int kVocab = 7, kDim = 5, kLength = 4, kBatch = 3;
  static constexpr int kRows = kBatch * kLength, kMaxLen = kLength + 2;
  // Repeated ids (3 four times, 1 twice) so the backward's accumulation per id matters.
  std::vector<int32_t> tokens{3, 1, 3, 6, 0, 3, 5, 2, 1, 4, 3, 2};
  Values table, positions, weights;
  float scale = 1.7f;  // the op takes a float scale, as Backend::embedding_forward does

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
  sinusoidal_positions<double>(table.data(), max_len, d);
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
  sinusoidal_positions<float>(table_float.data(), max_len, d);
  for (size_t e = 0; e < table.size(); ++e) {
    EXPECT_EQ(table_float[e], static_cast<float>(table[e])) << e;  // rounded from double
  }
}

}  // namespace
}  // namespace thpc::cpu_test

namespace thpc::test {
namespace {

struct EmbeddingShape {
  int batch, length, max_len, d, vocab;
};
// Odd widths, d over 256 (two column passes per block), one long sequence, and a tiny
// vocabulary whose tokens repeat over a thousand times (runs longer than a block).
const std::vector<EmbeddingShape> kEmbeddingShapes = {
    {3, 7, 9, 37, 50}, {2, 129, 130, 512, 1000}, {1, 1000, 1000, 64, 33},
    {4, 33, 40, 300, 5}, {8, 600, 600, 40, 3},   {5, 1, 1, 1, 2}};

// Token ids with repeats: about a third are the pad id 0, the rest uniform.
std::vector<int32_t> random_tokens(int rows, int vocab, std::mt19937& rng) {
  std::uniform_int_distribution<int32_t> token(0, vocab - 1);
  std::bernoulli_distribution pad(0.3);
  std::vector<int32_t> tokens(static_cast<size_t>(rows));
  for (int32_t& t : tokens) t = pad(rng) ? 0 : token(rng);
  return tokens;
}

std::string describe(DType dtype, const EmbeddingShape& s, bool learned) {
  std::ostringstream out;
  out << dtype_name(dtype) << " B=" << s.batch << " L=" << s.length << " d=" << s.d
      << " vocab=" << s.vocab << (learned ? " learned" : " sinusoidal/none");
  return out.str();
}

// Runs check(both, shape, positions on/off, rows, scale, CPU tokens, GPU tokens) for
// every precision, shape and positions setting, on fresh random tokens.
template <typename Check>
void for_each_embedding_case(std::mt19937& rng, const Check& check) {
  for (DType dtype : gpu_compute_dtypes()) {
    Twins twins(dtype);
    for (const EmbeddingShape& s : kEmbeddingShapes) {
      for (bool with_positions : {true, false}) {
        SCOPED_TRACE(describe(dtype, s, with_positions));
        const int rows = s.batch * s.length;
        const float scale = std::sqrt(static_cast<float>(s.d));
        Both both(twins);
        auto [tokens_cpu, tokens_gpu] = both.ids(random_tokens(rows, s.vocab, rng));
        check(both, s, with_positions, rows, scale, tokens_cpu, tokens_gpu);
      }
    }
  }
}

TEST(CudaEmbedding, ForwardMatchesCpu) {
  THPC_REQUIRE_GPU();
  std::mt19937 rng(8);
  for_each_embedding_case(rng, [&](Both& both, const EmbeddingShape& s, bool with_positions,
                                   int rows, float scale, const int32_t* tokens_cpu,
                                   const int32_t* tokens_gpu) {
    Pair table = both.act(random_values(static_cast<size_t>(s.vocab) * s.d, rng));
    Pair positions = with_positions
                         ? both.act(random_values(static_cast<size_t>(s.max_len) * s.d, rng))
                         : Pair{};
    Pair out = both.act_poisoned(static_cast<int64_t>(rows) * s.d);
    both.cpu().embedding_forward(out.cpu, tokens_cpu, table.cpu, positions.cpu, rows,
                                 s.length, s.d, s.vocab, scale);
    both.gpu().embedding_forward(out.gpu, tokens_gpu, table.gpu, positions.gpu, rows,
                                 s.length, s.d, s.vocab, scale);
    EXPECT_TRUE(all_close(both.gpu_values(out), both.cpu_values(out), 0.0,
                          rounding_rel(both.dtype())));
  });
}

TEST(CudaEmbedding, BackwardMatchesCpuWithRepeatedTokens) {
  THPC_REQUIRE_GPU();
  std::mt19937 rng(9);
  for_each_embedding_case(rng, [&](Both& both, const EmbeddingShape& s, bool learned, int rows,
                                   float scale, const int32_t* tokens_cpu,
                                   const int32_t* tokens_gpu) {
    Pair d_out = both.act(random_values(static_cast<size_t>(rows) * s.d, rng));
    // fp32 gradients, pre-filled: the op accumulates.
    Pair d_table = both.param(random_values(static_cast<size_t>(s.vocab) * s.d, rng));
    Pair d_positions =
        learned ? both.param(random_values(static_cast<size_t>(s.max_len) * s.d, rng))
                : Pair{};
    both.cpu().embedding_backward(d_table.cpu, d_positions.cpu, d_out.cpu, tokens_cpu, rows,
                                  s.length, s.d, s.vocab, scale);
    both.gpu().embedding_backward(d_table.gpu, d_positions.gpu, d_out.gpu, tokens_gpu, rows,
                                  s.length, s.d, s.vocab, scale);
    // The CPU's per-(token, column) chain of fp32 roundings, in row order: exact, in
    // both precisions (the bf16 d_out values are the CPU's inputs too).
    EXPECT_TRUE(all_close(both.gpu_values(d_table), both.cpu_values(d_table), 0.0, 0.0));
    if (learned) {
      EXPECT_TRUE(
          all_close(both.gpu_values(d_positions), both.cpu_values(d_positions), 0.0, 0.0));
    }
  });
}

TEST(CudaEmbedding, BackwardIsDeterministic) {
  THPC_REQUIRE_GPU();
  std::mt19937 rng(10);
  const int batch = 64, length = 256, d = 512, vocab = 100;  // ~16k rows, long token runs
  const int rows = batch * length;
  for (DType dtype : gpu_compute_dtypes()) {
    SCOPED_TRACE(dtype_name(dtype));
    Twins twins(dtype);
    Scope gpu(*twins.gpu);
    int32_t* tokens = gpu.put_ids(random_tokens(rows, vocab, rng));
    Tensor d_out = gpu.put(dtype, random_values(static_cast<size_t>(rows) * d, rng));
    const std::vector<float> table_init = random_values(static_cast<size_t>(vocab) * d, rng);
    const std::vector<float> positions_init = random_values(static_cast<size_t>(length) * d, rng);
    std::vector<std::vector<float>> tables, positions;
    for (int run = 0; run < 2; ++run) {
      Tensor d_table = gpu.put(DType::F32, table_init);
      Tensor d_positions = gpu.put(DType::F32, positions_init);
      twins.gpu->embedding_backward(d_table, d_positions, d_out, tokens, rows, length, d, vocab,
                                    std::sqrt(static_cast<float>(d)));
      tables.push_back(gpu.get(d_table));
      positions.push_back(gpu.get(d_positions));
    }
    EXPECT_TRUE(same_bits(tables[0], tables[1])) << "d_table differs between identical calls";
    EXPECT_TRUE(same_bits(positions[0], positions[1]))
        << "d_positions differs between identical calls";
  }
}

// The tied embedding's lookup rows summed apart (dist.embedding_sum = per_use) on the GPU:
// gathered from an fp32 table by copy_rows and, summed, added back into the fp32 gradient
// by embedding_backward with fp32 rows as d_out (scale 1, distinct rows): in the bf16
// backend too, whose row ops otherwise take bf16. The same values as the CPU's, exactly
// (a copy, and one fp32 addition per element).
TEST(CudaEmbedding, Fp32RowsGatheredAndAddedBackInEveryPrecision) {
  THPC_REQUIRE_GPU();
  std::mt19937 rng(12);
  const int vocab = 300, d = 64, count = 37;
  std::vector<int32_t> rows(vocab);
  std::iota(rows.begin(), rows.end(), 0);
  std::shuffle(rows.begin(), rows.end(), rng);
  rows.resize(count);
  std::sort(rows.begin(), rows.end());  // as rows_looked_up_by_any_rank gives them
  for (DType dtype : gpu_compute_dtypes()) {
    SCOPED_TRACE(dtype_name(dtype));
    Twins twins(dtype);
    Both both(twins);
    auto [rows_cpu, rows_gpu] = both.ids(rows);
    Pair table = both.param(random_values(static_cast<size_t>(vocab) * d, rng));
    Pair gathered = both.param(std::vector<float>(static_cast<size_t>(count) * d, NAN));
    both.cpu().copy_rows(gathered.cpu, nullptr, table.cpu, rows_cpu, count, d);
    both.gpu().copy_rows(gathered.gpu, nullptr, table.gpu, rows_gpu, count, d);
    EXPECT_TRUE(all_close(both.gpu_values(gathered), both.cpu_values(gathered), 0.0, 0.0));
    Pair summed = both.param(random_values(static_cast<size_t>(count) * d, rng));
    Pair gradient = both.param(random_values(static_cast<size_t>(vocab) * d, rng));
    both.cpu().embedding_backward(gradient.cpu, Tensor{}, summed.cpu, rows_cpu, count, 1, d,
                                  vocab, 1.0f);
    both.gpu().embedding_backward(gradient.gpu, Tensor{}, summed.gpu, rows_gpu, count, 1, d,
                                  vocab, 1.0f);
    EXPECT_TRUE(all_close(both.gpu_values(gradient), both.cpu_values(gradient), 0.0, 0.0));
  }
}

// The GPU cannot throw from a kernel: an out-of-vocabulary token gives a NaN row in the
// forward (visible in the loss) and is skipped by the backward; nothing is out of bounds.
TEST(CudaEmbedding, OutOfVocabularyTokensArePoisonedNotReadOutOfBounds) {
  THPC_REQUIRE_REAL_GPU();  // the GPU's own behaviour (the CPU throws): no rehearsal
  std::mt19937 rng(11);
  const int d = 5, vocab = 4, length = 4, rows = 4;
  const std::vector<int32_t> tokens = {1, -1, vocab, 2};
  Twins twins(DType::F32);
  Scope gpu(*twins.gpu);
  int32_t* ids = gpu.put_ids(tokens);
  const std::vector<float> table_host = random_values(static_cast<size_t>(vocab) * d, rng);
  Tensor table = gpu.put(DType::F32, table_host);
  Tensor out = gpu.put(DType::F32, std::vector<float>(static_cast<size_t>(rows) * d, 0.0f));
  twins.gpu->embedding_forward(out, ids, table, Tensor{}, rows, length, d, vocab, 2.0f);
  const std::vector<float> got = gpu.get(out);
  for (int r = 0; r < rows; ++r) {
    for (int c = 0; c < d; ++c) {
      const float value = got[static_cast<size_t>(r) * d + c];
      if (r == 1 || r == 2) {
        EXPECT_TRUE(std::isnan(value)) << "row " << r;
      } else {
        EXPECT_EQ(value, table_host[static_cast<size_t>(tokens[r]) * d + c] * 2.0f) << "row " << r;
      }
    }
  }
  const std::vector<float> d_out_host = random_values(static_cast<size_t>(rows) * d, rng);
  Tensor d_out = gpu.put(DType::F32, d_out_host);
  Tensor d_table = gpu.put(DType::F32, table_host);
  twins.gpu->embedding_backward(d_table, Tensor{}, d_out, ids, rows, length, d, vocab, 2.0f);
  std::vector<float> expected = table_host;
  for (int r : {0, 3}) {
    for (int c = 0; c < d; ++c) {
      expected[static_cast<size_t>(tokens[r]) * d + c] += d_out_host[static_cast<size_t>(r) * d + c] * 2.0f;
    }
  }
  EXPECT_TRUE(all_close(gpu.get(d_table), expected, 0.0, 0.0));
}

}  // namespace
}  // namespace thpc::test
