// Attention (kernels/cpu/attention.cc, kernels/cuda/attention.cu): the CPU reference
// against a naive evaluation of §3.2 and central finite differences (cpu_reference.h),
// then the CUDA twins.
// The CUDA twins run the op on the GPU and on the CPU reference backend (tests/cuda_twin.h)
// in fp32 and bf16; without a GPU (or in a CPU-only build) they report SKIPPED.
//
// The twins cover self- and cross-attention (Lq != Lk), d_k != d_v, fused-QKV strided
// views and separate buffers with a spare column, causal and padding masks (one
// sentence with no key at all), dropout 0 and 0.1 (the GPU must draw the CPU's mask
// exactly, or whole probabilities would differ), no key lengths, a long sequence
// (257), decoding without `saved`, and the backward pass accumulating into pre-filled
// gradients. Head widths that are multiples of 8 take the one-call pointer-array GEMM
// path, odd ones (d_k = 5, a spare column in ldq) the per-sentence strided fallback.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common/philox.h"
#include "cpu_reference.h"
#include "cuda_twin.h"
#include "threaded_blocks.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cuda/decode_attention.cuh"
#include "kernels/cuda/fused_attention.cuh"
#include "kernels/cuda/short_attention.cuh"

namespace thpc::cpu_test {
namespace {

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
    Values probabilities(static_cast<size_t>(Backend::attention_saved_numel(shape)), 99.0);
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
                                    ldq, k(), ldk, v(), ldv, shape, GradStore::kAdd);
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
  EXPECT_EQ(Backend::attention_saved_numel(shape), 3 * 5 * 7 * 11);
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

// The CPU attention never reads keys and values past key_lengths[b]: NaN there changes
// no output bit, so padding need not be finite. The cases include one query against a
// cache, the decoder's step (the GEMV path).
TEST(Attention, KeysPastTheLengthsAreNeverRead) {
  std::mt19937 rng(46);
  std::vector<AttentionCase> cases = attention_cases();
  cases.push_back({"decoding_step", 3, 2, 1, 6, 4, 4, false, 0.0f, {1, 4, 6}, false});
  cases.push_back({"decoding_step_fused", 2, 2, 1, 1, 3, 3, false, 0.0f, {1, 0}, true});
  for (const AttentionCase& c : cases) {
    SCOPED_TRACE(c.name);
    const AttentionProblem clean(c, rng);
    AttentionProblem poisoned = clean;
    Values& kv = c.fused_qkv ? poisoned.q_buffer : poisoned.kv_buffer;
    const size_t width_k = static_cast<size_t>(c.heads) * c.d_k;
    const size_t width_v = static_cast<size_t>(c.heads) * c.d_v;
    int poisoned_rows = 0;
    for (int b = 0; b < c.batch; ++b) {
      for (int j = c.key_lengths[b]; j < c.key_len; ++j, ++poisoned_rows) {
        const size_t row = static_cast<size_t>(b) * c.key_len + j;
        for (size_t e = 0; e < width_k; ++e) {
          kv[row * poisoned.ldk + poisoned.k_offset + e] = std::nan("");
        }
        for (size_t e = 0; e < width_v; ++e) {
          kv[row * poisoned.ldv + poisoned.v_offset + e] = std::nan("");
        }
      }
    }
    EXPECT_GT(poisoned_rows, 0);
    poisoned.shape.key_lengths = poisoned.config.key_lengths.data();
    Values clean_saved, poisoned_saved;
    const Values expected = clean.forward(&clean_saved);
    const Values got = poisoned.forward(&poisoned_saved);
    for (size_t i = 0; i < got.size(); ++i) EXPECT_EQ(got[i], expected[i]) << i;
    ASSERT_EQ(poisoned_saved.size(), clean_saved.size());
    for (size_t i = 0; i < clean_saved.size(); ++i) {
      EXPECT_EQ(poisoned_saved[i], clean_saved[i]) << i;
    }
  }
}

// Keys and values gathered by AttentionShape::key_rows (incremental decoding's
// shared-prefix cache) from a pool holding each sentence's rows scattered among rows
// of NaN: the naive evaluation of the same keys in place, the probabilities too (the
// loops sum in another order than BLAS: within 1e-14 as above), and no NaN row read,
// neither between the listed rows nor where the rows past a sentence's length point.
// d_k = 64 runs the unrolled products, the other widths the general ones.
TEST(Attention, GatheredKeyRowsGiveTheNaiveEvaluation) {
  std::mt19937 rng(48);
  std::vector<AttentionCase> cases = attention_cases();
  cases.push_back({"decoding_step", 3, 2, 1, 6, 4, 4, false, 0.0f, {1, 4, 6}, false});
  cases.push_back({"decoding_step_dk64", 4, 3, 1, 7, 64, 64, false, 0.0f, {7, 2, 5, 1}, false});
  cases.push_back({"decoding_step_dropout", 2, 2, 1, 5, 64, 3, false, 0.3f, {5, 3}, false});
  for (const AttentionCase& c : cases) {
    SCOPED_TRACE(c.name);
    const AttentionProblem problem(c, rng);
    const int width_k = c.heads * c.d_k, width_v = c.heads * c.d_v;
    const int ld_pool = width_k + width_v;
    // Pool row 3 n + 1 holds key row n (n = b Lk + j) of the sentences, in reverse
    // order; every other pool row is NaN.
    const int keys = c.batch * c.key_len;
    Values pool(static_cast<size_t>(3 * keys + 1) * ld_pool, std::nan(""));
    std::vector<int32_t> key_rows(static_cast<size_t>(keys));
    for (int n = 0; n < keys; ++n) {
      const int at = 3 * (keys - 1 - n) + 1;
      const int b = n / c.key_len, j = n % c.key_len;
      key_rows[n] = j < c.key_lengths[b] ? at : 0;  // past the length: a NaN row
      for (int e = 0; e < width_k; ++e) {
        pool[static_cast<size_t>(at) * ld_pool + e] = problem.k()[static_cast<size_t>(n) * problem.ldk + e];
      }
      for (int e = 0; e < width_v; ++e) {
        pool[static_cast<size_t>(at) * ld_pool + width_k + e] =
            problem.v()[static_cast<size_t>(n) * problem.ldv + e];
      }
    }
    AttentionShape shape = problem.shape;
    shape.key_rows = key_rows.data();
    Values out(problem.out_numel(), 99.0);
    Values saved(static_cast<size_t>(Backend::attention_saved_numel(shape)), 99.0);
    cpu::attention_forward<double>(out.data(), saved.data(), problem.q(), problem.ldq,
                                   pool.data(), ld_pool, pool.data() + width_k, ld_pool, shape);
    Values naive_probabilities;
    const Values naive = problem.naive_forward(&naive_probabilities);
    for (size_t i = 0; i < out.size(); ++i) EXPECT_NEAR(out[i], naive[i], 1e-14) << i;
    for (size_t i = 0; i < saved.size(); ++i) {
      EXPECT_NEAR(saved[i], naive_probabilities[i], 1e-15) << i;
    }
    // Without saved probabilities (a decoding step's): the same output, bit for bit.
    Values unsaved_out(problem.out_numel(), 99.0);
    cpu::attention_forward<double>(unsaved_out.data(), nullptr, problem.q(), problem.ldq,
                                   pool.data(), ld_pool, pool.data() + width_k, ld_pool, shape);
    EXPECT_EQ(unsaved_out, out);
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
                                  problem.ldv, problem.shape, GradStore::kAdd);
  for (size_t e = 0; e < d_kv.size(); ++e) {
    const bool is_v_column = (e % problem.ldv) >= problem.v_offset;
    EXPECT_EQ(d_v_only[e], is_v_column ? d_kv[e] : 0.0) << e;
  }
  // Only dQ.
  Values d_q_only(problem.q_buffer.size(), 0.0);
  cpu::attention_backward<double>(d_q_only.data(), nullptr, nullptr, problem.weights.data(),
                                  saved.data(), problem.q(), problem.ldq, problem.k(),
                                  problem.ldk, problem.v(), problem.ldv, problem.shape,
                                                         GradStore::kAdd);
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

}  // namespace
}  // namespace thpc::cpu_test

namespace thpc::test {
namespace {

struct AttentionCase {
  std::string name;
  int batch, heads, query_len, key_len, d_k, d_v;
  bool causal;
  float dropout;
  std::vector<int32_t> key_lengths;  // empty: all keys valid (shape.key_lengths = null)
  bool fused;  // Q, K, V as three offset views of one [rows, h(2d_k+d_v)] buffer
  // Columns of q's buffer (when not fused) that no head reads: 1 makes the row stride
  // odd (the strided fallback); 8 keeps rows 16-byte aligned (the short kernels).
  int spare_q_columns = 1;
};

std::vector<AttentionCase> attention_cases() {
  return {
      {"self_fused", 2, 3, 7, 7, 8, 8, false, 0.0f, {7, 5}, true},
      {"causal_fused_dropout_empty_sentence", 3, 2, 9, 9, 16, 16, true, 0.1f, {9, 4, 0}, true},
      {"cross_dk_ne_dv_dropout", 2, 4, 5, 11, 12, 20, false, 0.1f, {11, 3}, false},
      {"cross_causal_odd", 3, 1, 13, 6, 5, 7, true, 0.0f, {6, 1, 4}, false},
      {"no_key_lengths_dropout", 2, 2, 6, 6, 8, 8, true, 0.1f, {}, true},
      {"long_257_causal_dropout", 1, 2, 257, 257, 32, 32, true, 0.1f, {257}, true},
      {"long_257_padded", 2, 2, 257, 257, 24, 40, false, 0.0f, {257, 200}, false},
  };
}

// Host buffers of one case: q (or the fused qkv) buffer, the kv buffer (unless fused),
// the output gradient and the pre-filled input gradients, all random and never zero.
struct AttentionData {
  AttentionCase c;
  int ldq = 0, ldk = 0, ldv = 0;
  int64_t k_offset = 0, v_offset = 0;  // into the kv buffer (the q buffer when fused)
  std::vector<float> q, kv, d_out, dq_fill, dkv_fill;

  AttentionData(const AttentionCase& config, DType dtype, std::mt19937& rng) : c(config) {
    const int wk = c.heads * c.d_k, wv = c.heads * c.d_v;
    if (c.fused) {
      ldq = ldk = ldv = 2 * wk + wv;
      k_offset = wk;
      v_offset = 2 * wk;
    } else {
      ldq = wk + c.spare_q_columns;  // columns no head reads: must stay untouched
      ldk = ldv = wk + wv;
      v_offset = wk;
    }
    // Scores of O(1) (inputs in [-2, 2]) make the softmax neither flat nor one-hot.
    q = representable(random_values(static_cast<size_t>(c.batch) * c.query_len * ldq, rng,
                                    -2.0f, 2.0f), dtype);
    dq_fill = representable(random_values(q.size(), rng), dtype);
    if (!c.fused) {
      kv = representable(random_values(static_cast<size_t>(c.batch) * c.key_len * ldk, rng,
                                       -2.0f, 2.0f), dtype);
      dkv_fill = representable(random_values(kv.size(), rng), dtype);
    }
    d_out = representable(
        random_values(static_cast<size_t>(c.batch) * c.query_len * wv, rng), dtype);
  }
  int64_t out_numel() const {
    return static_cast<int64_t>(c.batch) * c.query_len * c.heads * c.d_v;
  }
};

// What one backend computed for one case.
struct AttentionResult {
  std::vector<float> out, saved, dq_buffer, dkv_buffer;
};

struct AttentionRun {
  bool with_saved = true;
  bool backward = true;
  bool want_dq = true, want_dk = true, want_dv = true;
  // kWrite: the head columns of the gradient buffers start as NaN (written, not added
  // into); a column no head reads keeps its random value, which must stay untouched.
  GradStore store = GradStore::kAdd;
};

// `fill` with columns [0, width) of each row of `ld` set to NaN.
std::vector<float> poisoned_columns(std::vector<float> fill, int ld, int width) {
  for (size_t i = 0; i < fill.size(); ++i) {
    if (static_cast<int>(i % static_cast<size_t>(ld)) < width) fill[i] = NAN;
  }
  return fill;
}

// A case's shape, its key lengths at `key_lengths` (backend memory, or null), and the
// dropout key every run uses.
AttentionShape shape_of(const AttentionCase& c, const int32_t* key_lengths) {
  AttentionShape shape;
  shape.batch = c.batch;
  shape.heads = c.heads;
  shape.query_len = c.query_len;
  shape.key_len = c.key_len;
  shape.d_k = c.d_k;
  shape.d_v = c.d_v;
  shape.causal = c.causal;
  shape.key_lengths = key_lengths;
  shape.dropout = c.dropout;
  shape.dropout_key.seed = 0x1234abcd5678ull;
  shape.dropout_key.step = 17;
  shape.dropout_key.stream = 3;
  shape.dropout_key.site = 5;
  return shape;
}

AttentionResult run_attention(Backend& backend, DType dtype, const AttentionData& data,
                              const AttentionRun& run) {
  Scope scope(backend);
  const AttentionCase& c = data.c;
  const AttentionShape shape =
      shape_of(c, c.key_lengths.empty() ? nullptr : scope.put_ids(c.key_lengths));

  const Tensor q_buffer = scope.put(dtype, data.q);
  const Tensor kv_buffer = c.fused ? q_buffer : scope.put(dtype, data.kv);
  const Tensor q = q_buffer;
  const Tensor k = kv_buffer.slice(data.k_offset, kv_buffer.numel - data.k_offset);
  const Tensor v = kv_buffer.slice(data.v_offset, kv_buffer.numel - data.v_offset);
  const Tensor out = scope.alloc(dtype, data.out_numel());
  const int64_t saved_numel = backend.attention_saved_numel(shape);
  const Tensor saved = run.with_saved ? scope.alloc(dtype, saved_numel) : Tensor{};
  backend.attention_forward(out, saved, q, data.ldq, k, data.ldk, v, data.ldv, shape);

  AttentionResult result;
  result.out = scope.get(out);
  if (run.with_saved) result.saved = scope.get(saved);
  if (!run.backward) return result;

  const Tensor d_out = scope.put(dtype, data.d_out);
  const bool write = run.store == GradStore::kWrite;
  const int q_heads_width = c.fused ? data.ldq : c.heads * c.d_k;  // dq (+ dk, dv if fused)
  const Tensor dq_buffer = scope.put(
      dtype, write ? poisoned_columns(data.dq_fill, data.ldq, q_heads_width) : data.dq_fill);
  const Tensor dkv_buffer =
      c.fused ? dq_buffer
              : scope.put(dtype, write ? poisoned_columns(data.dkv_fill, data.ldk, data.ldk)
                                       : data.dkv_fill);
  const Tensor dq = run.want_dq ? dq_buffer : Tensor{};
  const Tensor dk = run.want_dk ? dkv_buffer.slice(data.k_offset, dkv_buffer.numel - data.k_offset)
                                : Tensor{};
  const Tensor dv = run.want_dv ? dkv_buffer.slice(data.v_offset, dkv_buffer.numel - data.v_offset)
                                : Tensor{};
  backend.attention_backward(dq, dk, dv, d_out, saved, q, data.ldq, k, data.ldk, v, data.ldv,
                             shape, run.store);
  result.dq_buffer = scope.get(dq_buffer);
  if (!c.fused) result.dkv_buffer = scope.get(dkv_buffer);
  return result;
}

// Tolerances (abs, rel in units of eps_of(dtype); eps = 2^-23 fp32, 2^-7 bf16).
// fp32: both sides compute in fp32 with different summation orders (BLAS vs tensor-core
// GEMM, shuffle trees vs loops) and expf vs std::exp: errors of a few ulps per term,
// growing like sqrt(K) over K <= 257 terms of O(1): ~1e-5 absolute on O(1) values.
// bf16: inputs are identical, scores accumulate in fp32, but P, P' and dS are rounded
// to bf16 (2^-9 relative each) before the second GEMM and the result is rounded once
// more: out = sum_j P'_j v_j (|v| <= 2, sum_j P'_j <= 1.12) errs by at most
// 2^-8 * 2.2 ~ 1.1 eps in the worst case (random roundings make it far less) plus the
// output rounding (rel): abs 2 eps, rel 1 eps. The gradients (O(1); dP sums <= 40
// products) err by a few eps/4 plus the rounding of the pre-filled sum: abs 2 eps,
// rel 1 eps.
struct Tolerance {
  double abs, rel;
};
Tolerance out_tolerance(DType dtype) {
  const double eps = eps_of(dtype);
  return dtype == DType::F32 ? Tolerance{200 * eps, 800 * eps} : Tolerance{2 * eps, eps};
}
Tolerance probability_tolerance(DType dtype) {
  // Probabilities are <= 1; bf16: one rounding (2^-9 relative) of a value whose fp32
  // score error is negligible.
  const double eps = eps_of(dtype);
  return dtype == DType::F32 ? Tolerance{64 * eps, 256 * eps} : Tolerance{eps / 8, eps};
}
Tolerance gradient_tolerance(DType dtype) {
  const double eps = eps_of(dtype);
  return dtype == DType::F32 ? Tolerance{500 * eps, 1000 * eps} : Tolerance{2 * eps, eps};
}

std::string label(const AttentionCase& c, DType dtype) {
  return c.name + " in " + dtype_name(dtype);
}

TEST(CudaAttention, ForwardMatchesCpu) {
  THPC_REQUIRE_GPU();
  for (DType dtype : gpu_compute_dtypes()) {
    std::mt19937 rng(11);
    for (const AttentionCase& c : attention_cases()) {
      SCOPED_TRACE(label(c, dtype));
      Twins twins(dtype);
      const AttentionData data(c, dtype, rng);
      AttentionRun run;
      run.backward = false;
      const AttentionResult cpu = run_attention(*twins.cpu, DType::F32, data, run);
      const AttentionResult gpu = run_attention(*twins.gpu, dtype, data, run);
      const Tolerance o = out_tolerance(dtype), p = probability_tolerance(dtype);
      EXPECT_TRUE(all_close(gpu.out, cpu.out, o.abs, o.rel)) << "out";
      EXPECT_TRUE(all_close(gpu.saved, cpu.saved, p.abs, p.rel)) << "saved probabilities";
      // Masked probabilities are exactly 0 on both sides (random scores never give an
      // exact 0 otherwise), and nothing else is.
      ASSERT_EQ(gpu.saved.size(), cpu.saved.size());
      size_t mismatched_zeros = 0;
      for (size_t i = 0; i < cpu.saved.size(); ++i) {
        if ((cpu.saved[i] == 0.0f) != (gpu.saved[i] == 0.0f)) ++mismatched_zeros;
      }
      EXPECT_EQ(mismatched_zeros, 0u) << "masks differ";
    }
  }
}

// Decoding passes no `saved`: the probabilities go to scratch, the output is the same,
// bit for bit (the same kernels on the same data).
TEST(CudaAttention, ForwardWithoutSavedEqualsForwardWithSaved) {
  THPC_REQUIRE_GPU();
  for (DType dtype : gpu_compute_dtypes()) {
    std::mt19937 rng(12);
    for (const AttentionCase& c : attention_cases()) {
      SCOPED_TRACE(label(c, dtype));
      Twins twins(dtype);
      const AttentionData data(c, dtype, rng);
      AttentionRun with, without;
      with.backward = without.backward = false;
      without.with_saved = false;
      const AttentionResult a = run_attention(*twins.gpu, dtype, data, with);
      const AttentionResult b = run_attention(*twins.gpu, dtype, data, without);
      EXPECT_EQ(a.out, b.out);
    }
  }
}

// Every case's gradients on the GPU against the CPU, stored as `mode` says (kAdd into
// random values; kWrite onto NaN in the head columns, the three GEMMs with beta = 0; the
// column of q's buffer no head reads keeps its value either way); and bit-identical when
// repeated: no atomics, fixed reduction orders.
void check_attention_backward(const StoreMode& mode, uint32_t seed) {
  for (DType dtype : gpu_compute_dtypes()) {
    std::mt19937 rng(seed);
    for (const AttentionCase& c : attention_cases()) {
      SCOPED_TRACE(label(c, dtype) + " " + mode.name());
      Twins twins(dtype);
      const AttentionData data(c, dtype, rng);
      AttentionRun run;
      run.store = mode.store;
      const AttentionResult cpu = run_attention(*twins.cpu, DType::F32, data, run);
      const AttentionResult gpu = run_attention(*twins.gpu, dtype, data, run);
      const Tolerance g = gradient_tolerance(dtype);
      EXPECT_TRUE(all_close(gpu.dq_buffer, cpu.dq_buffer, g.abs, g.rel))
          << (c.fused ? "d qkv" : "dq");
      if (!c.fused) {
        EXPECT_TRUE(all_close(gpu.dkv_buffer, cpu.dkv_buffer, g.abs, g.rel)) << "d kv";
      }
      const AttentionResult again = run_attention(*twins.gpu, dtype, data, run);
      EXPECT_EQ(again.dq_buffer, gpu.dq_buffer);
      EXPECT_EQ(again.dkv_buffer, gpu.dkv_buffer);
    }
  }
}

TEST(CudaAttention, BackwardMatchesCpuAndAccumulates) {
  THPC_REQUIRE_GPU();
  check_attention_backward({}, 13);
}

TEST(CudaAttention, BackwardWritingMatchesCpu) {
  THPC_REQUIRE_GPU();
  check_attention_backward({GradStore::kWrite}, 16);
}

// Null gradient outputs are skipped; the others still match (and the skipped ones'
// memory keeps its pre-filled values).
TEST(CudaAttention, BackwardSkipsNullOutputs) {
  THPC_REQUIRE_GPU();
  const std::vector<AttentionCase> cases = attention_cases();
  for (DType dtype : gpu_compute_dtypes()) {
    std::mt19937 rng(14);
    for (int variant = 0; variant < 3; ++variant) {
      const AttentionCase& c = cases[2];  // separate q and kv buffers, dropout
      SCOPED_TRACE(label(c, dtype) + " variant " + std::to_string(variant));
      Twins twins(dtype);
      const AttentionData data(c, dtype, rng);
      AttentionRun run;
      run.want_dq = variant == 0;
      run.want_dk = variant == 1;
      run.want_dv = variant != 1;
      const AttentionResult cpu = run_attention(*twins.cpu, DType::F32, data, run);
      const AttentionResult gpu = run_attention(*twins.gpu, dtype, data, run);
      const Tolerance g = gradient_tolerance(dtype);
      EXPECT_TRUE(all_close(gpu.dq_buffer, cpu.dq_buffer, g.abs, g.rel));
      EXPECT_TRUE(all_close(gpu.dkv_buffer, cpu.dkv_buffer, g.abs, g.rel));
    }
  }
}

// No keys at all: every output row is 0, as on the CPU.
TEST(CudaAttention, NoKeysGivesZeros) {
  THPC_REQUIRE_GPU();
  for (DType dtype : gpu_compute_dtypes()) {
    std::mt19937 rng(15);
    const AttentionCase c{"no_keys", 2, 2, 3, 0, 4, 4, false, 0.0f, {0, 0}, false};
    SCOPED_TRACE(label(c, dtype));
    Twins twins(dtype);
    AttentionData data(c, dtype, rng);
    // K and V have no rows; one spare row gives the views something to point into.
    data.kv = std::vector<float>(static_cast<size_t>(data.ldk), 1.0f);
    AttentionRun run;
    run.backward = false;
    run.with_saved = false;
    const AttentionResult gpu = run_attention(*twins.gpu, dtype, data, run);
    EXPECT_EQ(gpu.out, std::vector<float>(static_cast<size_t>(data.out_numel()), 0.0f));
  }
}


// ---- Short sentences in one launch (kernels/cuda/short_attention.cuh) ----

// Shapes the short kernels take (d_k = d_v = 64, Lq and Lk <= 128, 16-byte rows): self-
// and cross-attention, lengths that are and are not whole tiles, the longest (128), one
// query (a decoding step), causal with Lq != Lk, padding with an empty sentence, dropout.
std::vector<AttentionCase> short_attention_cases() {
  return {
      {"short_self_padded", 3, 2, 40, 40, 64, 64, false, 0.0f, {40, 33, 17}, true},
      {"short_causal_dropout", 2, 3, 23, 23, 64, 64, true, 0.1f, {23, 9}, true},
      {"short_cross_128_keys_dropout", 2, 2, 37, 128, 64, 64, false, 0.1f, {128, 50}, false, 8},
      {"short_causal_128", 1, 2, 128, 128, 64, 64, true, 0.0f, {128}, true},
      {"short_one_query_empty_sentence", 3, 2, 1, 19, 64, 64, false, 0.0f, {19, 0, 7}, false, 8},
      {"short_cross_causal_no_lengths", 2, 1, 50, 12, 64, 64, true, 0.1f, {}, false, 8},
  };
}

// The backward variants each case runs: every gradient, then (adding; writing leaves a
// skipped output's NaN columns NaN on both sides) each of dq, dk, dv alone: null outputs
// skipped, their memory untouched.
std::vector<AttentionRun> short_attention_runs(GradStore store) {
  std::vector<AttentionRun> runs;
  for (int variant = 0; variant < (store == GradStore::kAdd ? 4 : 1); ++variant) {
    AttentionRun run;
    run.store = store;
    run.want_dq = variant == 0 || variant == 1;
    run.want_dk = variant == 0 || variant == 2;
    run.want_dv = variant == 0 || variant == 3;
    runs.push_back(run);
  }
  return runs;
}

std::string variant_name(const AttentionRun& run) {
  return std::string(run.store == GradStore::kWrite ? "write" : "add") + (run.want_dq ? " dq" : "") +
         (run.want_dk ? " dk" : "") + (run.want_dv ? " dv" : "");
}

// The short kernels against the CPU at bf16's tolerances (the roundings are the verified
// path's: see short_attention.cuh), masks exactly where the CPU has them.
// Forward's output and saved probabilities against the CPU's at `dtype`'s tolerances,
// and the masked probabilities (exact zeros) in the same places.
void expect_forward_matches(const AttentionResult& actual, const AttentionResult& cpu,
                            DType dtype) {
  const Tolerance o = out_tolerance(dtype), p = probability_tolerance(dtype);
  EXPECT_TRUE(all_close(actual.out, cpu.out, o.abs, o.rel)) << "out";
  EXPECT_TRUE(all_close(actual.saved, cpu.saved, p.abs, p.rel)) << "saved probabilities";
  size_t mismatched_zeros = 0;
  for (size_t i = 0; i < cpu.saved.size() && i < actual.saved.size(); ++i) {
    if ((cpu.saved[i] == 0.0f) != (actual.saved[i] == 0.0f)) ++mismatched_zeros;
  }
  EXPECT_EQ(mismatched_zeros, 0u) << "masks differ";
}

void expect_short_attention_matches(const AttentionResult& actual, const AttentionResult& cpu,
                                    bool fused) {
  expect_forward_matches(actual, cpu, DType::BF16);
  const Tolerance g = gradient_tolerance(DType::BF16);
  EXPECT_TRUE(all_close(actual.dq_buffer, cpu.dq_buffer, g.abs, g.rel)) << (fused ? "d qkv" : "dq");
  if (!fused) {
    EXPECT_TRUE(all_close(actual.dkv_buffer, cpu.dkv_buffer, g.abs, g.rel)) << "d kv";
  }
}

// The execution policy of short_attention's bodies on the host: one block run
// sequentially (every loop's first iteration 0, step 1: the block's threads, warps and
// lanes one after another, phases in order), a tile product as fp32 sums of bf16
// products, bf16 rounded to nearest even. The GPU's wmma semantics: A row-major means
// A(i, k) = a[i * lda + k], column-major A(i, k) = a[k * lda + i]; B row-major B(k, j) =
// b[k * ldb + j], column-major B(k, j) = b[j * ldb + k].
struct HostBf16 {
  uint16_t bits;
};
float widen_bf16(HostBf16 value) { return from_bf16_bits(value.bits); }
struct HostBlock {
  using Element = HostBf16;
  struct Accumulator {
    float tile[16][16];
  };
  int first_thread() const { return 0; }
  int thread_step() const { return 1; }
  int first_warp() const { return 0; }
  int warp_step() const { return 1; }
  int warp_slot() const { return 0; }
  int first_lane() const { return 0; }
  int lane_step() const { return 1; }
  void sync() const {}
  void warp_sync() const {}
  // A warp's lanes are one sequential loop here, whose one variable already holds the
  // whole row's value.
  float warp_sum(float value) const { return value; }
  float warp_max(float value) const { return value; }
  void zero(Accumulator& acc) const {
    for (auto& row : acc.tile) {
      for (float& value : row) value = 0.0f;
    }
  }
  void scale(Accumulator& acc, float factor) const {
    for (auto& row : acc.tile) {
      for (float& value : row) value *= factor;
    }
  }
  template <bool kAColumns, bool kBColumns>
  void mma(Accumulator& acc, const Element* a, int lda, const Element* b, int ldb) const {
    for (int i = 0; i < 16; ++i) {
      for (int j = 0; j < 16; ++j) {
        float sum = acc.tile[i][j];
        for (int k = 0; k < 16; ++k) {
          const Element a_ik = kAColumns ? a[k * lda + i] : a[i * lda + k];
          const Element b_kj = kBColumns ? b[j * ldb + k] : b[k * ldb + j];
          sum += widen_bf16(a_ik) * widen_bf16(b_kj);
        }
        acc.tile[i][j] = sum;
      }
    }
  }
  void store(float* to, const Accumulator& acc, int ld) const {
    for (int i = 0; i < 16; ++i) {
      for (int j = 0; j < 16; ++j) to[i * ld + j] = acc.tile[i][j];
    }
  }
  float exp(float value) const { return std::exp(value); }
  Element round(float value) const { return Element{bf16_bits(value)}; }
  float widen(Element value) const { return widen_bf16(value); }
  void copy16(Element* to, const Element* from) const { std::memcpy(to, from, 16); }
  void zero16(Element* to) const { std::memset(to, 0, 16); }
  void load8(float (&values)[8], const Element* from) const {
    for (int e = 0; e < 8; ++e) values[e] = widen_bf16(from[e]);
  }
  void store8(Element* to, const float (&values)[8]) const {
    for (int e = 0; e < 8; ++e) to[e] = round(values[e]);
  }
};

std::vector<HostBf16> to_host_bf16(const std::vector<float>& values) {
  std::vector<HostBf16> out(values.size());
  for (size_t i = 0; i < values.size(); ++i) out[i] = HostBf16{bf16_bits(values[i])};
  return out;
}
std::vector<float> from_host_bf16(const std::vector<HostBf16>& values) {
  std::vector<float> out(values.size());
  for (size_t i = 0; i < values.size(); ++i) out[i] = widen_bf16(values[i]);
  return out;
}

// Runs the blocks of one launch sequentially with HostBlock, each block's shared memory
// filled with NaN first (0xff bytes: a NaN in bf16 and fp32), so that a read of anything
// a phase did not write shows in the results.
struct SequentialBlocks {
  void operator()(bool backward, const short_attention::Args<HostBf16>& args, int pairs,
                  int bytes) const {
    std::vector<char> shared(static_cast<size_t>(bytes));
    HostBlock block;
    for (int pair = 0; pair < pairs; ++pair) {
      std::fill(shared.begin(), shared.end(), static_cast<char>(0xff));
      if (backward) {
        short_attention::backward_block(block, args, pair, shared.data());
      } else {
        short_attention::forward_block(block, args, pair, shared.data());
      }
    }
  }
};

// The host buffers of a host run of a kernel's body: one case's inputs as bf16, its
// outputs (NaN first: an element not written shows) and, for backward, the gradients as
// run_attention fills them; `args` (short_attention::Args or a type derived from it)
// pointed at them, and the results read back as run_attention returns them.
struct HostAttentionBuffers {
  const AttentionData& data;
  const AttentionRun& run;
  std::vector<HostBf16> q_buffer, kv_buffer, out, saved, dq_buffer, dkv_buffer, d_out;
  AttentionShape shape;  // run_attention's, the key lengths in host memory

  HostAttentionBuffers(const AttentionData& d, const AttentionRun& r) : data(d), run(r) {
    const AttentionCase& c = data.c;
    q_buffer = to_host_bf16(data.q);
    if (!c.fused) kv_buffer = to_host_bf16(data.kv);
    out.assign(static_cast<size_t>(data.out_numel()), HostBf16{0xffff});
    saved.assign(static_cast<size_t>(c.batch) * c.heads * c.query_len * c.key_len,
                 HostBf16{0xffff});
    shape = shape_of(c, c.key_lengths.empty() ? nullptr : c.key_lengths.data());
  }
  template <class Args>
  void set_forward(Args& args) {
    const HostBf16* kv = data.c.fused ? q_buffer.data() : kv_buffer.data();
    static_cast<short_attention::Args<HostBf16>&>(args) = short_attention::args_of<HostBf16>(
        q_buffer.data(), data.ldq, kv + data.k_offset, data.ldk, kv + data.v_offset, data.ldv,
        shape);
    args.out = out.data();
    args.saved = run.with_saved ? saved.data() : nullptr;
  }
  template <class Args>
  void set_backward(Args& args) {
    const AttentionCase& c = data.c;
    const bool write = run.store == GradStore::kWrite;
    const int q_heads_width = c.fused ? data.ldq : c.heads * c.d_k;
    dq_buffer = to_host_bf16(write ? poisoned_columns(data.dq_fill, data.ldq, q_heads_width)
                                   : data.dq_fill);
    if (!c.fused) {
      dkv_buffer = to_host_bf16(write ? poisoned_columns(data.dkv_fill, data.ldk, data.ldk)
                                      : data.dkv_fill);
    }
    HostBf16* dkv = c.fused ? dq_buffer.data() : dkv_buffer.data();
    d_out = to_host_bf16(data.d_out);
    args.d_out = d_out.data();
    args.dq = run.want_dq ? dq_buffer.data() : nullptr;
    args.dk = run.want_dk ? dkv + data.k_offset : nullptr;
    args.dv = run.want_dv ? dkv + data.v_offset : nullptr;
    args.write_dq = args.write_dk = args.write_dv = write;
  }
  void read_forward(AttentionResult& result) const {
    result.out = from_host_bf16(out);
    if (run.with_saved) result.saved = from_host_bf16(saved);
  }
  void read_backward(AttentionResult& result) const {
    result.dq_buffer = from_host_bf16(dq_buffer);
    if (!data.c.fused) result.dkv_buffer = from_host_bf16(dkv_buffer);
  }
};

// run_attention's buffers and results, computed by the short kernels' bodies on the host,
// one block per (sentence, head) pair, run by `run_blocks` (SequentialBlocks, or
// ThreadedBlocks below).
template <class RunBlocks = SequentialBlocks>
AttentionResult run_short_attention_on_host(const AttentionData& data, const AttentionRun& run,
                                            const RunBlocks& run_blocks = RunBlocks{}) {
  const AttentionCase& c = data.c;
  HostAttentionBuffers buffers(data, run);
  short_attention::Args<HostBf16> args;
  buffers.set_forward(args);
  const int pairs = c.batch * c.heads;
  run_blocks(false, args, pairs, short_attention::layout(c.query_len, c.key_len, false).bytes);
  AttentionResult result;
  buffers.read_forward(result);
  if (!run.backward) return result;
  buffers.set_backward(args);
  run_blocks(true, args, pairs, short_attention::layout(c.query_len, c.key_len, true).bytes);
  buffers.read_backward(result);
  return result;
}

// A block as the GPU runs it: kThreads host threads, x.sync() a barrier of all of them,
// x.warp_sync() one of the warp's 32, warp_sum / warp_max the device's xor butterfly (so
// every lane gets the same bits, in the device's order), and a tile product done by the
// warp's lane 0 after a warp barrier (wmma is warp-collective) and stored by it: a lane
// reading the stage before the warp's barrier, or a phase reading what another warp
// writes before the block's, reads stale or NaN data here. (What remains the GPU's own:
// the fragments' real layout in registers, and timing.)
struct ThreadedTeam {
  ThreadBarrier block{short_attention::kThreads};
  ThreadBarrier warp[short_attention::kWarps] = {ThreadBarrier(32), ThreadBarrier(32),
                                                 ThreadBarrier(32), ThreadBarrier(32)};
  float exchange[short_attention::kWarps][32] = {};
};
static_assert(short_attention::kWarps == 4, "ThreadedTeam's warp barriers");

struct ThreadedBlock : HostBlock {
  int thread = 0;
  ThreadedTeam* team = nullptr;
  int lane() const { return thread % 32; }
  int warp() const { return thread / 32; }
  int first_thread() const { return thread; }
  int thread_step() const { return short_attention::kThreads; }
  int first_warp() const { return warp(); }
  int warp_step() const { return short_attention::kWarps; }
  int warp_slot() const { return warp(); }
  int first_lane() const { return lane(); }
  int lane_step() const { return 32; }
  void sync() const { team->block.wait(); }
  void warp_sync() const { team->warp[warp()].wait(); }
  template <class Op>
  float butterfly(float value, Op op) const {
    float* slots = team->exchange[warp()];
    slots[lane()] = value;
    warp_sync();
    float values[32];
    std::copy(slots, slots + 32, values);
    warp_sync();  // the slots are free again
    return warp_butterfly(values, lane(), op);
  }
  float warp_sum(float value) const {
    return butterfly(value, [](float a, float b) { return a + b; });
  }
  float warp_max(float value) const {
    return butterfly(value, [](float a, float b) { return std::fmax(a, b); });
  }
  template <bool kAColumns, bool kBColumns>
  void mma(Accumulator& acc, const Element* a, int lda, const Element* b, int ldb) const {
    warp_sync();
    if (lane() == 0) HostBlock::mma<kAColumns, kBColumns>(acc, a, lda, b, ldb);
  }
  void store(float* to, const Accumulator& acc, int ld) const {
    warp_sync();
    if (lane() == 0) HostBlock::store(to, acc, ld);
  }
};

struct ThreadedBlocks {
  void operator()(bool backward, const short_attention::Args<HostBf16>& args, int pairs,
                  int bytes) const {
    run_threaded_blocks<ThreadedBlock, ThreadedTeam>(
        short_attention::kThreads, pairs, bytes, [&](ThreadedBlock& x, int pair, char* shared) {
          if (backward) {
            short_attention::backward_block(x, args, pair, shared);
          } else {
            short_attention::forward_block(x, args, pair, shared);
          }
        });
  }
};

// A host run of a kernel's body (`run_on_host(data, run)`) computes the same output for
// decoding (no saved P) as with P saved.
template <class RunOnHost>
void expect_decoding_output_unchanged(const AttentionData& data, const RunOnHost& run_on_host) {
  AttentionRun without_saved;
  without_saved.backward = false;
  without_saved.with_saved = false;
  AttentionRun with_saved = without_saved;
  with_saved.with_saved = true;
  EXPECT_EQ(run_on_host(data, without_saved).out, run_on_host(data, with_saved).out)
      << data.c.name << ": decoding (no saved P) computes the same output";
}

// The short kernels' bodies, run on the host, against the CPU attention: forward
// (out, saved P, masks) and every backward variant, adding and writing. This is the
// kernels' rehearsal without a GPU: indices, masks, padding, dropout draws, the
// epilogues and which tiles are skipped, all run here on every build.
TEST(ShortAttentionOnTheHost, ForwardAndBackwardMatchCpu) {
  auto cpu = make_cpu_backend(DType::F32);
  std::mt19937 rng(41);
  for (const AttentionCase& c : short_attention_cases()) {
    const AttentionData data(c, DType::BF16, rng);
    ASSERT_TRUE(short_attention::short_attention_fits(c.d_k, c.d_v, c.query_len, c.key_len,
                                                      data.ldq, data.ldk, data.ldv))
        << c.name;
    for (GradStore store : {GradStore::kAdd, GradStore::kWrite}) {
      for (const AttentionRun& run : short_attention_runs(store)) {
        SCOPED_TRACE(c.name + " " + variant_name(run));
        const AttentionResult expected = run_attention(*cpu, DType::F32, data, run);
        const AttentionResult actual = run_short_attention_on_host(data, run);
        expect_short_attention_matches(actual, expected, c.fused);
      }
    }
    expect_decoding_output_unchanged(data, [](const AttentionData& d, const AttentionRun& r) {
      return run_short_attention_on_host(d, r);
    });
  }
}

// The same bodies run by kThreads threads a block (ThreadedBlock: barriers, the warp
// butterflies, warp-collective tiles): the results match the CPU, and a second run gives
// the same bits (a race between phases would not). Three of the cases; every gradient
// adding and writing, and dV alone (the threads make a run ~100x slower than the
// sequential one).
TEST(ShortAttentionOnTheHost, ThreadedBlocksMatchCpuAndRepeatBitForBit) {
  auto cpu = make_cpu_backend(DType::F32);
  std::mt19937 rng(44);
  const std::vector<AttentionCase> cases = short_attention_cases();
  for (const AttentionCase& c : {cases[1], cases[2], cases[4]}) {
    const AttentionData data(c, DType::BF16, rng);
    const std::vector<AttentionRun> runs = {short_attention_runs(GradStore::kAdd)[0],
                                            short_attention_runs(GradStore::kWrite)[0],
                                            short_attention_runs(GradStore::kAdd)[3]};
    for (const AttentionRun& run : runs) {
      SCOPED_TRACE(c.name + " " + variant_name(run) + " (threaded)");
      const AttentionResult expected = run_attention(*cpu, DType::F32, data, run);
      const AttentionResult actual = run_short_attention_on_host(data, run, ThreadedBlocks{});
      expect_short_attention_matches(actual, expected, c.fused);
      if (&run != &runs.front()) continue;
      const AttentionResult again = run_short_attention_on_host(data, run, ThreadedBlocks{});
      EXPECT_EQ(again.out, actual.out);
      EXPECT_EQ(again.saved, actual.saved);
      EXPECT_EQ(again.dq_buffer, actual.dq_buffer);
      EXPECT_EQ(again.dkv_buffer, actual.dkv_buffer);
    }
  }
}

// The tolerance is not vacuous: the CPU's result for another dropout draw (a changed
// seed, so whole probabilities are dropped elsewhere) is far outside it.
TEST(ShortAttentionOnTheHost, AnotherDropoutDrawIsCaught) {
  auto cpu = make_cpu_backend(DType::F32);
  std::mt19937 rng(42);
  AttentionCase c = short_attention_cases()[1];  // causal, dropout 0.1
  const AttentionData data(c, DType::BF16, rng);
  AttentionRun run;
  const AttentionResult expected = run_attention(*cpu, DType::F32, data, run);
  AttentionData other = data;
  other.c.dropout = 0.2f;
  const AttentionResult actual = run_short_attention_on_host(other, run);
  const Tolerance o = out_tolerance(DType::BF16);
  EXPECT_FALSE(all_close(actual.out, expected.out, o.abs, o.rel));
}

// One case's GPU twins as the one-launch kernels (short, fused) check them: forward and
// every backward variant, adding and writing, against the CPU (bf16: the short kernels'
// tolerances, fp32: the batched path's), `launches` counting 2 a bf16 run (forward and
// backward: the kernels under test were the ones taken), a repeated run bit-identical (no
// atomics), and decoding without saved P the same output.
void expect_one_launch_twins_match(Twins& twins, const AttentionData& data,
                                   int64_t (*launches)(), const char* kernels) {
  const AttentionCase& c = data.c;
  const DType dtype = twins.compute;
  for (GradStore store : {GradStore::kAdd, GradStore::kWrite}) {
    for (const AttentionRun& run : short_attention_runs(store)) {
      SCOPED_TRACE(label(c, dtype) + " " + variant_name(run));
      const AttentionResult cpu = run_attention(*twins.cpu, DType::F32, data, run);
      const int64_t before = launches();
      const AttentionResult gpu = run_attention(*twins.gpu, dtype, data, run);
      if (dtype == DType::BF16 && !twin_rehearsal()) {
        EXPECT_EQ(launches(), before + 2)
            << "the " << kernels << " kernels were not taken (forward and backward)";
      }
      if (dtype == DType::BF16) {
        expect_short_attention_matches(gpu, cpu, c.fused);
      } else {
        const Tolerance o = out_tolerance(dtype), g = gradient_tolerance(dtype);
        EXPECT_TRUE(all_close(gpu.out, cpu.out, o.abs, o.rel)) << "out";
        EXPECT_TRUE(all_close(gpu.dq_buffer, cpu.dq_buffer, g.abs, g.rel)) << "dq";
        EXPECT_TRUE(all_close(gpu.dkv_buffer, cpu.dkv_buffer, g.abs, g.rel)) << "d kv";
      }
      const AttentionResult again = run_attention(*twins.gpu, dtype, data, run);
      EXPECT_EQ(again.out, gpu.out);
      EXPECT_EQ(again.dq_buffer, gpu.dq_buffer);
      EXPECT_EQ(again.dkv_buffer, gpu.dkv_buffer);
    }
  }
  AttentionRun with, without;
  with.backward = without.backward = false;
  without.with_saved = false;
  EXPECT_EQ(run_attention(*twins.gpu, dtype, data, with).out,
            run_attention(*twins.gpu, dtype, data, without).out)
      << label(c, dtype) << ": without saved P";
}

// The same on the GPU (bf16, with every length the kernels can take allowed, up to 128;
// fp32 takes the batched path and is checked too): forward, every backward variant adding
// and writing, decoding without saved P, and a repeated run bit-identical (no atomics).
TEST(CudaAttention, ShortSentencesMatchCpu) {
  THPC_REQUIRE_GPU();
  CudaKernelChoice longest;
  longest.short_attention_max_len = kShortAttentionLongest;
  for (DType dtype : gpu_compute_dtypes()) {
    std::mt19937 rng(43);
    for (const AttentionCase& c : short_attention_cases()) {
      Twins twins(dtype, longest);
      expect_one_launch_twins_match(twins, AttentionData(c, dtype, rng), short_attention_launches,
                                    "short");
    }
  }
}

// The short kernels run where train.short_attention_max_len allows and nowhere else:
// with the default (48) a 40-piece case takes them and a 128-key one the batched GEMMs;
// with 0 neither does; with 128 both do. Both paths give the CPU's values either way.
TEST(CudaAttention, ShortKernelsOnlyUpToTheConfiguredLength) {
  THPC_REQUIRE_GPU();
  if (twin_rehearsal()) GTEST_SKIP() << "the launch counter needs the GPU itself";
  const std::vector<AttentionCase> cases = short_attention_cases();
  const AttentionCase& short_case = cases[0];   // 40 x 40
  const AttentionCase& long_case = cases[2];    // 37 queries x 128 keys
  ASSERT_EQ(short_case.key_len, 40);
  ASSERT_EQ(long_case.key_len, 128);
  struct Expectation {
    int max_length;
    bool short_taken, long_taken;
  };
  for (const Expectation& e : {Expectation{kShortAttentionDefaultMaxLength, true, false},
                               Expectation{0, false, false},
                               Expectation{kShortAttentionLongest, true, true}}) {
    CudaKernelChoice kernels;
    kernels.short_attention_max_len = e.max_length;
    Twins twins(DType::BF16, kernels);
    std::mt19937 rng(44);
    const std::pair<const AttentionCase*, bool> expected_launches[] = {
        {&short_case, e.short_taken}, {&long_case, e.long_taken}};
    for (const auto& [c, taken] : expected_launches) {
      SCOPED_TRACE(c->name + " with short_attention_max_len " + std::to_string(e.max_length));
      const AttentionData data(*c, DType::BF16, rng);
      const AttentionRun run;
      const AttentionResult cpu = run_attention(*twins.cpu, DType::F32, data, run);
      const int64_t launches = short_attention_launches();
      const AttentionResult gpu = run_attention(*twins.gpu, DType::BF16, data, run);
      EXPECT_EQ(short_attention_launches() - launches, taken ? 2 : 0);
      expect_short_attention_matches(gpu, cpu, c->fused);
    }
  }
}

// ---- Attention in registers (kernels/cuda/fused_attention.cuh; candidate fused_attention) ----

// Shapes for the fused kernels besides the short kernels' (d_k = d_v = 64, lengths <= 128):
// two query blocks and two key blocks with a partial last one (100 x 77), causal at the
// longest length, one query with an empty sentence, causal cross-attention without key
// lengths, dropout, blocks of several pairs. One or two heads, to keep the host run short.
std::vector<AttentionCase> fused_attention_cases() {
  return {
      {"fused_self_padded", 2, 1, 40, 40, 64, 64, false, 0.0f, {40, 17}, true},
      {"fused_causal_dropout", 2, 1, 23, 23, 64, 64, true, 0.1f, {23, 9}, true},
      {"fused_cross_100x77_dropout", 2, 1, 100, 77, 64, 64, false, 0.1f, {77, 30}, false, 8},
      {"fused_causal_128", 1, 1, 128, 128, 64, 64, true, 0.0f, {128}, true},
      {"fused_one_query_empty_sentence", 3, 1, 1, 19, 64, 64, false, 0.0f, {19, 0, 7}, false, 8},
      {"fused_cross_causal_no_lengths", 1, 2, 50, 12, 64, 64, true, 0.1f, {}, false, 8},
      // Packed blocks (fused_attention::Packing): ten pairs of 12 queries, four a block
      // (the last block two); three pairs of 20 queries and 33 keys, two a block (query
      // blocks), the key step count 3; 12 queries of 128 keys, one pair a block for its
      // shared memory, and its key blocks of 16 queries, two a pair; 128 queries of 12 keys
      // (key blocks: one a pair for their shared memory).
      {"fused_packed_12_causal_dropout", 5, 2, 12, 12, 64, 64, true, 0.1f, {12, 7, 12, 3, 12},
       true},
      {"fused_packed_20x33", 3, 1, 20, 33, 64, 64, false, 0.0f, {33, 20, 1}, false, 8},
      {"fused_cross_12x128_dropout", 2, 1, 12, 128, 64, 64, false, 0.1f, {128, 61}, false, 8},
      {"fused_cross_128x12", 1, 1, 128, 12, 64, 64, false, 0.0f, {12}, false, 8},
  };
}

// The barriers and exchange slots of a fused block's 128 host threads (the blocking
// barriers of the short kernels' threaded run: with more threads than cores, spinning
// ones took the cores from the threads they waited for).
struct FusedTeam {
  ThreadBarrier block{fused_attention::kThreads};
  ThreadBarrier warp[fused_attention::kWarps] = {ThreadBarrier(32), ThreadBarrier(32),
                                                 ThreadBarrier(32), ThreadBarrier(32)};
  struct Exchange {
    float value[32];
    const void* address[32];
    uint32_t words[32][6];  // a lane's A fragment (4 words) and B fragment (2)
  } exchange[fused_attention::kWarps] = {};
};
static_assert(fused_attention::kWarps == 4, "FusedTeam's warp barriers");

// The execution policy of fused_attention's bodies on the host: each thread of the block a
// host thread, the warp collectives emulated from the PTX ISA's fragment layouts (the
// ones fused_attention.cuh lists): a lane posts its operand, the warp meets, each lane
// computes its own result from the posted ones, the warp meets again.
struct FusedLane {
  using Element = HostBf16;
  int thread = 0;
  FusedTeam* team = nullptr;
  int first_thread() const { return thread; }
  int thread_step() const { return fused_attention::kThreads; }
  int warp() const { return thread / 32; }
  int lane() const { return thread % 32; }
  void sync() const { team->block.wait(); }
  void warp_sync() const { team->warp[warp()].wait(); }
  FusedTeam::Exchange& exchange() const { return team->exchange[warp()]; }
  float shfl_xor(float value, int mask) const {
    exchange().value[lane()] = value;
    warp_sync();
    const float result = exchange().value[lane() ^ mask];
    warp_sync();
    return result;
  }
  // Tile i's rows at the addresses lanes 8i..8i+7 posted; word i of lane (g, c) holds tile
  // i's (row g, columns 2c, 2c+1), or with trans its (rows 2c, 2c+1, column g).
  void ldmatrix(uint32_t (&words)[4], const Element* row, bool trans) const {
    exchange().address[lane()] = row;
    warp_sync();
    const int g = lane() / 4, c = lane() % 4;
    for (int i = 0; i < 4; ++i) {
      uint32_t halves[2];
      for (int e = 0; e < 2; ++e) {
        const int r = trans ? 2 * c + e : g, column = trans ? g : 2 * c + e;
        halves[e] = static_cast<const Element*>(exchange().address[8 * i + r])[column].bits;
      }
      words[i] = halves[0] | (halves[1] << 16);
    }
    warp_sync();
  }
  void ldmatrix_x4(uint32_t (&words)[4], const Element* row) const { ldmatrix(words, row, false); }
  void ldmatrix_x4_trans(uint32_t (&words)[4], const Element* row) const {
    ldmatrix(words, row, true);
  }
  static float half_of(uint32_t word, int upper) {
    return from_bf16_bits(static_cast<uint16_t>(upper ? word >> 16 : word & 0xffffu));
  }
  // acc (row g / g + 8, columns 2c, 2c + 1) += sum over k of A(row, k) B(k, column), A's
  // elements from the lanes holding them (word (row >= 8) + 2 (k >= 8) of lane
  // 4 (row % 8) + (k % 8) / 2), B's likewise (word k >= 8 of lane 4 n + (k % 8) / 2).
  void mma(float (&acc)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) const {
    uint32_t* mine = exchange().words[lane()];
    for (int i = 0; i < 4; ++i) mine[i] = a[i];
    mine[4] = b0;
    mine[5] = b1;
    warp_sync();
    const auto& posted = exchange().words;
    const int g = lane() / 4, c = lane() % 4;
    for (int e = 0; e < 4; ++e) {
      const int row = g + 8 * (e >> 1), column = 2 * c + (e & 1);
      float sum = acc[e];
      for (int k = 0; k < 16; ++k) {
        const float a_value =
            half_of(posted[4 * (row % 8) + (k % 8) / 2][(row >= 8) + 2 * (k >= 8)], k % 2);
        const float b_value = half_of(posted[4 * column + (k % 8) / 2][4 + (k >= 8)], k % 2);
        sum += a_value * b_value;
      }
      acc[e] = sum;
    }
    warp_sync();
  }
  uint32_t pack(Element low, Element high) const {
    return low.bits | (static_cast<uint32_t>(high.bits) << 16);
  }
  float exp(float value) const { return std::exp(value); }
  Element round(float value) const { return Element{bf16_bits(value)}; }
  float widen(Element value) const { return widen_bf16(value); }
  void copy16(Element* to, const Element* from) const { std::memcpy(to, from, 16); }
  void zero16(Element* to) const { std::memset(to, 0, 16); }
  void store_pair(Element* to, float v0, float v1) const {
    to[0] = round(v0);
    to[1] = round(v1);
  }
  void store_raw_pair(Element* at, Element first, Element second) const {
    EXPECT_EQ(reinterpret_cast<uintptr_t>(at) % 4, 0u) << "a pair's access is not aligned";
    at[0] = first;
    at[1] = second;
  }
  void load_raw_pair(const Element* at, Element (&pair)[2]) const {
    EXPECT_EQ(reinterpret_cast<uintptr_t>(at) % 4, 0u) << "a pair's access is not aligned";
    pair[0] = at[0];
    pair[1] = at[1];
  }
};

// One launch of a fused kernel on the host: `blocks` blocks, each run by a team of
// kThreads threads (run_threaded_blocks); body(x, block, shared).
template <class Body>
void run_fused_launch(int blocks, int bytes, const Body& body) {
  run_threaded_blocks<FusedLane, FusedTeam>(fused_attention::kThreads, blocks, bytes, body);
}

// run_attention's buffers and results, computed by the fused kernels' bodies on the host:
// forward, then (backward) the query blocks and the key blocks, as the launcher runs them.
AttentionResult run_fused_attention_on_host(const AttentionData& data, const AttentionRun& run) {
  namespace fa = fused_attention;
  const AttentionCase& c = data.c;
  HostAttentionBuffers buffers(data, run);
  fa::Args<HostBf16> args;
  buffers.set_forward(args);
  const int pairs = c.batch * c.heads;
  // The launcher's packing and instantiation (attention.cu): a block of up to four pairs
  // for short sentences, the bodies for the call's key steps.
  const fa::Packing query_blocks = fa::query_packing(c.query_len, c.key_len, pairs);
  const fa::Packing key_blocks = fa::key_packing(c.query_len, c.key_len, pairs);
  EXPECT_LE(query_blocks.bytes(), fa::kQueryBlockBytes);
  EXPECT_LE(key_blocks.bytes(), fa::kKeyBlockBytes);
  fa::with_key_steps(fa::key_steps_of(c.key_len), [&](auto ks) {
    run_fused_launch(query_blocks.blocks(), query_blocks.bytes(),
                     [&](FusedLane& x, int block, char* shared) {
                       fa::forward_block<decltype(ks)::value>(x, args, query_blocks, block, shared);
                     });
  });
  AttentionResult result;
  buffers.read_forward(result);
  if (!run.backward) return result;
  buffers.set_backward(args);
  std::vector<HostBf16> d_scores(buffers.saved.size(), HostBf16{0xffff});  // NaN until written
  args.d_scores = run.want_dk ? d_scores.data() : nullptr;
  if (args.dq != nullptr || args.dk != nullptr) {
    fa::with_key_steps(fa::key_steps_of(c.key_len), [&](auto ks) {
      run_fused_launch(query_blocks.blocks(), query_blocks.bytes(),
                       [&](FusedLane& x, int block, char* shared) {
                         fa::query_block_backward<decltype(ks)::value>(x, args, query_blocks,
                                                                       block, shared);
                       });
    });
  }
  if (args.dk != nullptr || args.dv != nullptr) {
    run_fused_launch(key_blocks.blocks(), key_blocks.bytes(),
                     [&](FusedLane& x, int block, char* shared) {
                       fa::key_block_backward(x, args, key_blocks, block, shared);
                     });
  }
  buffers.read_backward(result);
  return result;
}

// The fused kernels' bodies, every lane a host thread and the fragments as the PTX ISA
// lays them out, against the CPU attention: forward (out, saved P, masks), backward with
// every gradient adding and writing, and each of dq, dk, dv alone in the two cases with
// two blocks a direction; decoding without saved P gives the same output. Its rehearsal
// without a GPU: every index, fragment, mask, dropout draw and epilogue runs here.
TEST(FusedAttentionOnTheHost, ForwardAndBackwardMatchCpu) {
  auto cpu = make_cpu_backend(DType::F32);
  std::mt19937 rng(45);
  for (const AttentionCase& c : fused_attention_cases()) {
    const AttentionData data(c, DType::BF16, rng);
    ASSERT_TRUE(fused_attention::fused_attention_fits(c.d_k, c.d_v, c.query_len, c.key_len,
                                                      data.ldq, data.ldk, data.ldv))
        << c.name;
    std::vector<AttentionRun> runs = {short_attention_runs(GradStore::kAdd)[0],
                                      short_attention_runs(GradStore::kWrite)[0]};
    if (c.query_len > fused_attention::kBlockRows) {
      for (int variant = 1; variant < 4; ++variant) {
        runs.push_back(short_attention_runs(GradStore::kAdd)[variant]);
      }
    }
    for (const AttentionRun& run : runs) {
      SCOPED_TRACE(c.name + " " + variant_name(run));
      const AttentionResult expected = run_attention(*cpu, DType::F32, data, run);
      const AttentionResult actual = run_fused_attention_on_host(data, run);
      expect_short_attention_matches(actual, expected, c.fused);
    }
    expect_decoding_output_unchanged(data, run_fused_attention_on_host);
  }
}

// The tolerance is not vacuous for the fused bodies either: the CPU's result for another
// dropout draw is far outside it. (Nor is the comparison blind to the fragments: with two
// of an ldmatrix's tiles swapped in rows_times_heads, ForwardAndBackwardMatchCpu fails;
// tried when it was written.)
TEST(FusedAttentionOnTheHost, AnotherDropoutDrawIsCaught) {
  auto cpu = make_cpu_backend(DType::F32);
  std::mt19937 rng(46);
  const AttentionCase c = fused_attention_cases()[1];  // causal, dropout 0.1
  const AttentionData data(c, DType::BF16, rng);
  AttentionRun run;
  run.backward = false;
  const AttentionResult expected = run_attention(*cpu, DType::F32, data, run);
  AttentionData other = data;
  other.c.dropout = 0.2f;
  const AttentionResult actual = run_fused_attention_on_host(other, run);
  const Tolerance o = out_tolerance(DType::BF16);
  EXPECT_FALSE(all_close(actual.out, expected.out, o.abs, o.rel));
}

// The probe's host run is what the PTX ISA says, computed another way: lane (g, c)'s word
// i of ldmatrix.x4 is T(row, 2c), T(row, 2c + 1) of the A tile's quarter i (rows +8 for
// odd i, columns +8 for i >= 2), the transposed load T(2c, g), T(2c + 1, g) of the
// quarter's transpose, and the products T T^T's rows g and g + 8, columns 2c, 2c + 1
// (n-tile 0) and 8 + 2c, 9 + 2c (n-tile 1).
TEST(FusedAttentionOnTheHost, TheFragmentProbeGivesThePtxLayouts) {
  std::vector<uint32_t> words(32 * 4), trans(32 * 4);
  std::vector<float> products(32 * 8);
  std::vector<HostBf16> tile(16 * fused_attention::kLdHead, HostBf16{0xffff});
  run_fused_launch(1, 0, [&](FusedLane& x, int, char*) {
    fused_attention::fragment_probe(x, tile.data(), words.data(), trans.data(), products.data());
  });
  const auto T = [](int r, int c) { return static_cast<float>(16 * r + c); };
  const auto word = [](float low, float high) {
    return static_cast<uint32_t>(bf16_bits(low)) | (static_cast<uint32_t>(bf16_bits(high)) << 16);
  };
  for (int lane = 0; lane < 32; ++lane) {
    const int g = lane / 4, c = lane % 4;
    for (int i = 0; i < 4; ++i) {
      const int rows = (i & 1) * 8, columns = (i >> 1) * 8;
      EXPECT_EQ(words[lane * 4 + i], word(T(rows + g, columns + 2 * c), T(rows + g, columns + 2 * c + 1)))
          << "lane " << lane << " word " << i;
      EXPECT_EQ(trans[lane * 4 + i], word(T(rows + 2 * c, columns + g), T(rows + 2 * c + 1, columns + g)))
          << "lane " << lane << " word " << i;
    }
    for (int e = 0; e < 8; ++e) {
      const int row = g + 8 * ((e % 4) >> 1), column = 8 * (e / 4) + 2 * c + (e & 1);
      float sum = 0.0f;
      for (int k = 0; k < 16; ++k) sum += T(row, k) * T(column, k);
      EXPECT_EQ(products[lane * 8 + e], sum) << "lane " << lane << " product " << e;
    }
  }
}

// The hardware's fragments against the host run's: fused_attention::fragment_probe on the
// GPU (one warp) and by the host's 32 lane threads (FusedLane), bit for bit: the ldmatrix
// words, the transposed ones, and the products. A difference names the layout the host
// emulation gets wrong, and so where the kernels' indices must change: the first thing
// to read when the fused twins fail.
TEST(CudaCandidateFusedAttention, FragmentsAreThoseTheHostRunAssumes) {
  THPC_REQUIRE_REAL_GPU();  // the GPU's own fragments: no rehearsal
  std::vector<uint32_t> words, trans_words;
  std::vector<float> products;
  ASSERT_TRUE(fused_attention_fragment_probe(words, trans_words, products));
  std::vector<uint32_t> host_words(32 * 4), host_trans(32 * 4);
  std::vector<float> host_products(32 * 8);
  std::vector<HostBf16> tile(16 * fused_attention::kLdHead, HostBf16{0xffff});
  run_fused_launch(1, 0, [&](FusedLane& x, int, char*) {
    fused_attention::fragment_probe(x, tile.data(), host_words.data(), host_trans.data(),
                                    host_products.data());
  });
  const auto first_difference = [](const auto& gpu, const auto& host) {
    for (size_t i = 0; i < gpu.size(); ++i) {
      if (gpu[i] != host[i]) return static_cast<int>(i);
    }
    return -1;
  };
  int at = first_difference(words, host_words);
  EXPECT_EQ(at, -1) << "ldmatrix.x4: lane " << at / 4 << " word " << at % 4;
  at = first_difference(trans_words, host_trans);
  EXPECT_EQ(at, -1) << "ldmatrix.x4.trans: lane " << at / 4 << " word " << at % 4;
  at = first_difference(products, host_products);
  EXPECT_EQ(at, -1) << "mma.sync m16n8k16 (with ldmatrix's words): lane " << at / 8
                    << " n-tile " << at % 8 / 4 << " accumulator " << at % 4;
}

// The same on the GPU with the candidate named (train.cuda_kernels = fused_attention):
// the short kernels' cases and the fused ones, bf16 through the fused kernels (one launch
// a forward, one a backward, counted), fp32 through the batched path; a repeated run
// bit-identical (no atomics); decoding without saved P the same output.
TEST(CudaCandidateFusedAttention, MatchesCpu) {
  THPC_REQUIRE_GPU();
  const CudaKernelChoice fused = kernels_with(kFusedAttention);
  std::vector<AttentionCase> cases = short_attention_cases();
  for (const AttentionCase& c : fused_attention_cases()) cases.push_back(c);
  for (DType dtype : gpu_compute_dtypes()) {
    std::mt19937 rng(47);
    for (const AttentionCase& c : cases) {
      Twins twins(dtype, fused);
      expect_one_launch_twins_match(twins, AttentionData(c, dtype, rng), fused_attention_launches,
                                    "fused");
    }
  }
}

// ---- Gathered keys on the GPU (decoding's shared-prefix cache) ----

// A decoding step's attention over a shared-prefix pool (AttentionShape::key_rows): the
// data's key|value rows copied into a pool at scattered rows among NaN rows, sentences
// 2m and 2m + 1 sharing the rows of their first half of positions (a beam's hypotheses
// share their prefix) and reading their own after, the rows past a sentence's length
// pointing at a NaN row, which must not be read. The outputs start as NaN: an element
// not written fails.
struct GatheredPool {
  int ld_pool = 0;
  std::vector<float> pool;        // [2 B Lk + 1, ld_pool], NaN between the sentences' rows
  std::vector<int32_t> key_rows;  // [B, Lk]
};
GatheredPool gathered_pool(const AttentionData& data) {
  const AttentionCase& c = data.c;
  GatheredPool g;
  g.ld_pool = c.heads * (c.d_k + c.d_v);
  const int keys = c.batch * c.key_len;
  g.pool.assign(static_cast<size_t>(2 * keys + 1) * g.ld_pool, NAN);
  g.key_rows.assign(static_cast<size_t>(keys), 0);
  for (int b = 0; b < c.batch; ++b) {
    for (int j = 0; j < c.key_len; ++j) {
      const int owner = j < c.key_len / 2 ? b - b % 2 : b;  // whose row sentence b reads
      const int n = b * c.key_len + j, source = owner * c.key_len + j;
      const int at = 2 * (keys - 1 - source) + 1;
      if (j < (c.key_lengths.empty() ? c.key_len : c.key_lengths[b])) g.key_rows[n] = at;
      std::copy_n(data.kv.begin() + static_cast<int64_t>(source) * data.ldk, g.ld_pool,
                  g.pool.begin() + static_cast<int64_t>(at) * g.ld_pool);
    }
  }
  return g;
}

AttentionResult run_gathered_attention(Backend& backend, DType dtype, const AttentionData& data,
                                       bool with_saved) {
  Scope scope(backend);
  const AttentionCase& c = data.c;
  const int width_k = c.heads * c.d_k;
  const GatheredPool g = gathered_pool(data);
  const int ld_pool = g.ld_pool;
  AttentionShape shape = shape_of(c, c.key_lengths.empty() ? nullptr : scope.put_ids(c.key_lengths));
  shape.key_rows = scope.put_ids(g.key_rows);
  const Tensor q = scope.put(dtype, data.q);
  const Tensor k = scope.put(dtype, g.pool);
  const Tensor v = k.slice(width_k, k.numel - width_k);
  const Tensor out = scope.put(dtype, std::vector<float>(data.out_numel(), NAN));
  const Tensor saved =
      with_saved ? scope.put(dtype, std::vector<float>(backend.attention_saved_numel(shape), NAN))
                 : Tensor{};
  backend.attention_forward(out, saved, q, data.ldq, k, ld_pool, v, ld_pool, shape);
  AttentionResult result;
  result.out = scope.get(out);
  if (with_saved) result.saved = scope.get(saved);
  return result;
}

std::vector<AttentionCase> gathered_attention_cases() {
  return {
      // One query per hypothesis, d_k = 64 (base), an empty sentence, a sentence of one key.
      {"step_dk64", 6, 8, 1, 40, 64, 64, false, 0.0f, {40, 23, 1, 0, 40, 39}, false, 8},
      // Keys beyond the block's threads, widths not multiples of a warp, no lengths.
      {"step_300_keys_dk24_dv40", 4, 3, 1, 300, 24, 40, false, 0.0f, {}, false},
      // A few queries per sentence, causal, lengths shorter than the queries.
      {"causal_3_queries", 4, 2, 3, 9, 16, 8, true, 0.0f, {9, 2, 5, 1}, false},
      // model.max_positions' 1024 keys: the most shared memory a block takes here (8 KB).
      {"step_1024_keys", 2, 2, 1, 1024, 64, 64, false, 0.0f, {1024, 700}, false, 8},
  };
}

// The gathered kernel against the CPU's gathered loops, fp32 and bf16 at the tolerances of
// the batched path (the same roundings: S fp32, P rounded to T before the product, out
// rounded once); saved probabilities too, zeros past the visible keys; without saved
// (a decoding step's), the same output; a repeated run bit-identical.
void expect_gathered_twins_match(Twins& twins, DType dtype, const AttentionCase& c,
                                 std::mt19937& rng) {
  SCOPED_TRACE(label(c, dtype));
  const AttentionData data(c, dtype, rng);
  const AttentionResult cpu = run_gathered_attention(*twins.cpu, DType::F32, data, true);
  const AttentionResult gpu = run_gathered_attention(*twins.gpu, dtype, data, true);
  expect_forward_matches(gpu, cpu, dtype);
  EXPECT_EQ(run_gathered_attention(*twins.gpu, dtype, data, false).out, gpu.out)
      << "without saved probabilities";
  EXPECT_EQ(run_gathered_attention(*twins.gpu, dtype, data, true).out, gpu.out) << "repeated";
}

TEST(CudaAttention, GatheredKeysMatchCpu) {
  THPC_REQUIRE_GPU();
  for (DType dtype : gpu_compute_dtypes()) {
    std::mt19937 rng(45);
    Twins twins(dtype);
    for (const AttentionCase& c : gathered_attention_cases()) {
      expect_gathered_twins_match(twins, dtype, c, rng);
    }
  }
}

// ---- A decoding step's self-attention, a warp a head (the former decode_attention) ----

// The cases decode_attention::fits takes: gathered_attention_cases()' heads of 64, a
// head count that leaves a block's last warps idle (6 = 4 + 2; 2), and a few causal
// queries a sentence.
std::vector<AttentionCase> decode_attention_cases() {
  std::vector<AttentionCase> cases;
  for (const AttentionCase& c : gathered_attention_cases()) {
    if (c.d_k == 64 && c.d_v == 64) cases.push_back(c);
  }
  cases.push_back({"step_6_heads", 3, 6, 1, 37, 64, 64, false, 0.0f, {37, 5, 20}, false, 8});
  cases.push_back({"causal_3_queries_dk64", 2, 4, 3, 9, 64, 64, true, 0.0f, {9, 2}, false, 1});
  return cases;
}

HostBf16 host_round(float value, HostBf16) { return HostBf16{bf16_bits(value)}; }
float host_round(float value, float) { return value; }
float host_widen(HostBf16 value) { return widen_bf16(value); }
float host_widen(float value) { return value; }

// The execution policy of decode_attention's block body on the host: each thread of the
// block a host thread (run_threaded_blocks), the shuffles FusedLane's posted exchange, the
// warps' max and sum the device's xor butterflies in its order (warp_butterfly), fma and
// the roundings as the GPU's; the vector loads and stores check the alignment the GPU's
// need.
template <typename T>
struct DecodeLane : FusedLane {  // its threads, barriers, exchange and shuffle
  int first_warp() const { return warp(); }
  int warp_step() const { return decode_attention::kWarps; }
  int first_lane() const { return lane(); }
  int lane_step() const { return 32; }
  template <class Op>
  float butterfly(float value, Op op) const {
    exchange().value[lane()] = value;
    warp_sync();
    const float result = warp_butterfly(exchange().value, lane(), op);
    warp_sync();
    return result;
  }
  float warp_sum(float value) const {
    return butterfly(value, [](float a, float b) { return a + b; });
  }
  float warp_max(float value) const {
    return butterfly(value, [](float a, float b) { return std::fmax(a, b); });
  }
  float exp(float value) const { return std::exp(value); }
  float fma(float a, float b, float c) const { return std::fma(a, b, c); }
  float widen(T value) const { return host_widen(value); }
  T round(float value) const { return host_round(value, T{}); }
  void load8(float (&values)[8], const T* from) const {
    EXPECT_EQ(reinterpret_cast<uintptr_t>(from) % 16, 0u) << "a key row's load is not aligned";
    for (int e = 0; e < 8; ++e) values[e] = widen(from[e]);
  }
  void store8(T* to, const float (&values)[8]) const {
    EXPECT_EQ(reinterpret_cast<uintptr_t>(to) % 16, 0u) << "an output store is not aligned";
    for (int e = 0; e < 8; ++e) to[e] = round(values[e]);
  }
};
static_assert(decode_attention::kWarps == fused_attention::kWarps &&
                  decode_attention::kThreads == fused_attention::kThreads,
              "DecodeLane's team and threads are FusedLane's");

// run_gathered_attention's pool and rows, attended by decode_attention's block body on the
// host in T (HostBf16 for bf16, float for fp32): every block of the launch, the outputs
// and the saved probabilities NaN until written.
template <typename T>
AttentionResult run_decode_attention_on_host(const AttentionData& data, bool with_saved) {
  const AttentionCase& c = data.c;
  const GatheredPool g = gathered_pool(data);
  const auto to_host = [](const std::vector<float>& values) {
    std::vector<T> out(values.size());
    for (size_t i = 0; i < values.size(); ++i) out[i] = host_round(values[i], T{});
    return out;
  };
  const std::vector<T> q = to_host(data.q), pool = to_host(g.pool);
  std::vector<T> out = to_host(std::vector<float>(data.out_numel(), NAN));
  AttentionShape shape = shape_of(c, c.key_lengths.empty() ? nullptr : c.key_lengths.data());
  shape.key_rows = g.key_rows.data();
  std::vector<T> saved =
      to_host(std::vector<float>(with_saved ? Backend::attention_saved_numel(shape) : 0, NAN));
  EXPECT_TRUE(decode_attention::fits(shape, g.ld_pool, g.ld_pool, sizeof(T))) << c.name;
  const decode_attention::Args<T> args = decode_attention::args_of(
      out.data(), with_saved ? saved.data() : nullptr, q.data(), data.ldq, pool.data(),
      g.ld_pool, pool.data() + c.heads * c.d_k, g.ld_pool, shape);
  run_threaded_blocks<DecodeLane<T>, FusedTeam>(
      decode_attention::kThreads, static_cast<int>(decode_attention::blocks(shape)),
      decode_attention::shared_bytes(c.key_len),
      [&](DecodeLane<T>& x, int block, char* shared) {
        decode_attention::block(x, args, block, shared);
      });
  AttentionResult result;
  for (const T& value : out) result.out.push_back(host_widen(value));
  for (const T& value : saved) result.saved.push_back(host_widen(value));
  return result;
}

// decode_attention's body, every thread a host thread, against the CPU's gathered
// attention at the tolerances of the batched path, in bf16 and fp32: out, the saved
// probabilities (zeros past the visible keys), the same out without them, and no NaN row
// of the pool read (between the listed rows and where rows past a length point). Its
// rehearsal without a GPU: every index, gather, mask, rounding and the shared layout.
TEST(DecodeAttentionOnTheHost, MatchesTheCpusGatheredAttention) {
  auto cpu = make_cpu_backend(DType::F32);
  for (const DType dtype : {DType::BF16, DType::F32}) {
    std::mt19937 rng(49);
    for (const AttentionCase& c : decode_attention_cases()) {
      SCOPED_TRACE(c.name + (dtype == DType::BF16 ? " bf16" : " fp32"));
      const AttentionData data(c, dtype, rng);
      const AttentionResult expected = run_gathered_attention(*cpu, DType::F32, data, true);
      const auto run = [&](bool with_saved) {
        return dtype == DType::BF16 ? run_decode_attention_on_host<HostBf16>(data, with_saved)
                                    : run_decode_attention_on_host<float>(data, with_saved);
      };
      const AttentionResult actual = run(true);
      expect_forward_matches(actual, expected, dtype);
      EXPECT_EQ(run(false).out, actual.out) << "without saved probabilities";
    }
  }
}

// The tolerance is not vacuous: another sentence's key rows (the rows list of the
// sentence after) give outputs far outside it.
TEST(DecodeAttentionOnTheHost, AnotherSentencesKeysAreCaught) {
  auto cpu = make_cpu_backend(DType::F32);
  std::mt19937 rng(50);
  AttentionCase c = decode_attention_cases()[0];
  const AttentionData data(c, DType::BF16, rng);
  const AttentionResult expected = run_gathered_attention(*cpu, DType::F32, data, true);
  AttentionData shifted = data;  // sentence b's queries read sentence b+1's keys
  const int row = c.query_len * data.ldq;
  std::rotate(shifted.q.begin(), shifted.q.begin() + row, shifted.q.end());
  const AttentionResult actual = run_decode_attention_on_host<HostBf16>(shifted, true);
  const Tolerance o = out_tolerance(DType::BF16);
  EXPECT_FALSE(all_close(actual.out, expected.out, o.abs, o.rel));
}

// What decode_attention::fits takes: a decoding step's gathered keys with heads of 64 and
// no dropout, key and value rows 16-byte aligned, ~2,400 keys at
// most; anything else goes to the gathered kernel.
TEST(DecodeAttentionOnTheHost, FitsOnlyTheStepsItCanRead) {
  const int32_t rows[1] = {0};
  AttentionShape shape = shape_of(decode_attention_cases()[0], nullptr);
  shape.key_rows = rows;
  EXPECT_TRUE(decode_attention::fits(shape, 1024, 1024, 2));
  EXPECT_TRUE(decode_attention::fits(shape, 1028, 1028, 4));   // 16-byte rows in fp32
  EXPECT_FALSE(decode_attention::fits(shape, 1028, 1028, 2));  // 2,056-byte rows in bf16
  EXPECT_FALSE(decode_attention::fits(shape, 1024, 1028, 2));  // 2,056-byte value rows
  AttentionShape other = shape;
  other.key_rows = nullptr;  // training's and the cross-attention's contiguous keys
  EXPECT_FALSE(decode_attention::fits(other, 1024, 1024, 2));
  other = shape;
  other.d_k = 32;
  EXPECT_FALSE(decode_attention::fits(other, 1024, 1024, 2));
  other = shape;
  other.dropout = 0.1f;
  EXPECT_FALSE(decode_attention::fits(other, 1024, 1024, 2));
  other = shape;
  other.heads = 0;  // no block to launch: the gathered kernel's empty return
  EXPECT_FALSE(decode_attention::fits(other, 1024, 1024, 2));
  other = shape;
  other.key_len = 2400;
  EXPECT_TRUE(decode_attention::fits(other, 1024, 1024, 2));
  other.key_len = 2500;  // more shared memory than a block may take
  EXPECT_FALSE(decode_attention::fits(other, 1024, 1024, 2));
}

// On the GPU (the default since 2026-12-04, the former candidate decode_attention): the
// kernel itself (its launches counted) against the CPU, as the host run above, and a
// repeated run bit-identical.
TEST(CudaAttention, DecodeAttentionMatchesCpu) {
  THPC_REQUIRE_GPU();
  for (DType dtype : gpu_compute_dtypes()) {
    std::mt19937 rng(45);
    Twins twins(dtype);
    const std::vector<AttentionCase> cases = decode_attention_cases();
    const int64_t before = decode_attention_launches();
    for (const AttentionCase& c : cases) expect_gathered_twins_match(twins, dtype, c, rng);
    if (twin_rehearsal()) continue;  // the CPU stands in: no launches
    EXPECT_EQ(decode_attention_launches() - before, static_cast<int64_t>(3 * cases.size()))
        << "the warp-a-head kernel did not run";
  }
}

}  // namespace
}  // namespace thpc::test
