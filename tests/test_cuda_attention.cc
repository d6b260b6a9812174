// The CUDA attention and cross-entropy ops against their CPU twins (kernels/cpu), through
// the Backend interface, in fp32 and bf16: same random inputs (bf16-rounded for both
// sides when the GPU computes in bf16), outputs compared within abs + rel * |expected|.
//
// Attention covers self- and cross-attention (Lq != Lk), d_k != d_v, fused-QKV strided
// views and separate buffers with a spare column, causal and padding masks (one
// sentence with no key at all), dropout 0 and 0.1 (the GPU must draw the CPU's mask
// exactly, or whole probabilities would differ), no key lengths, a long sequence
// (257), decoding without `saved`, and the backward pass accumulating into pre-filled
// gradients. Head widths that are multiples of 8 take the one-call pointer-array GEMM
// path, odd ones (d_k = 5, a spare column in ldq) the per-sentence strided fallback. Cross-entropy covers pad rows, eps 0 and 0.1, aliasing, a 37000-ish and a
// small odd vocabulary, sums only, and a bad target id.
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "cuda_twin.h"
#include "expect_error.h"

namespace thpc::test {
namespace {

// ---- attention ------------------------------------------------------------------------

struct AttentionCase {
  std::string name;
  int batch, heads, query_len, key_len, d_k, d_v;
  bool causal;
  float dropout;
  std::vector<int32_t> key_lengths;  // empty: all keys valid (shape.key_lengths = null)
  bool fused;  // Q, K, V as three offset views of one [rows, h(2d_k+d_v)] buffer
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
      ldq = wk + 1;  // a column no head reads: must stay untouched
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
};

AttentionResult run_attention(Backend& backend, DType dtype, const AttentionData& data,
                              const AttentionRun& run) {
  Scope scope(backend);
  const AttentionCase& c = data.c;
  AttentionShape shape;
  shape.batch = c.batch;
  shape.heads = c.heads;
  shape.query_len = c.query_len;
  shape.key_len = c.key_len;
  shape.d_k = c.d_k;
  shape.d_v = c.d_v;
  shape.causal = c.causal;
  shape.key_lengths = c.key_lengths.empty() ? nullptr : scope.put_ids(c.key_lengths);
  shape.dropout = c.dropout;
  shape.dropout_key.seed = 0x1234abcd5678ull;
  shape.dropout_key.step = 17;
  shape.dropout_key.stream = 3;
  shape.dropout_key.site = 5;

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
  const Tensor dq_buffer = scope.put(dtype, data.dq_fill);
  const Tensor dkv_buffer = c.fused ? dq_buffer : scope.put(dtype, data.dkv_fill);
  const Tensor dq = run.want_dq ? dq_buffer : Tensor{};
  const Tensor dk = run.want_dk ? dkv_buffer.slice(data.k_offset, dkv_buffer.numel - data.k_offset)
                                : Tensor{};
  const Tensor dv = run.want_dv ? dkv_buffer.slice(data.v_offset, dkv_buffer.numel - data.v_offset)
                                : Tensor{};
  backend.attention_backward(dq, dk, dv, d_out, saved, q, data.ldq, k, data.ldk, v, data.ldv,
                             shape);
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

TEST(CudaAttention, BackwardMatchesCpuAndAccumulates) {
  THPC_REQUIRE_GPU();
  for (DType dtype : gpu_compute_dtypes()) {
    std::mt19937 rng(13);
    for (const AttentionCase& c : attention_cases()) {
      SCOPED_TRACE(label(c, dtype));
      Twins twins(dtype);
      const AttentionData data(c, dtype, rng);
      const AttentionRun run;
      const AttentionResult cpu = run_attention(*twins.cpu, DType::F32, data, run);
      const AttentionResult gpu = run_attention(*twins.gpu, dtype, data, run);
      const Tolerance g = gradient_tolerance(dtype);
      EXPECT_TRUE(all_close(gpu.dq_buffer, cpu.dq_buffer, g.abs, g.rel))
          << (c.fused ? "d qkv" : "dq");
      if (!c.fused) {
        EXPECT_TRUE(all_close(gpu.dkv_buffer, cpu.dkv_buffer, g.abs, g.rel)) << "d kv";
      }
      // Bit-identical when repeated: no atomics, fixed reduction orders.
      const AttentionResult again = run_attention(*twins.gpu, dtype, data, run);
      EXPECT_EQ(again.dq_buffer, gpu.dq_buffer);
      EXPECT_EQ(again.dkv_buffer, gpu.dkv_buffer);
    }
  }
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

// ---- cross-entropy --------------------------------------------------------------------

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

TEST(CudaCrossEntropy, MatchesCpu) {
  THPC_REQUIRE_GPU();
  for (DType dtype : gpu_compute_dtypes()) {
    std::mt19937 rng(21);
    for (const LossCase& c : loss_cases()) {
      for (int mode = 0; mode < 3; ++mode) {
        SCOPED_TRACE(c.name + " in " + dtype_name(dtype) + " mode " + std::to_string(mode));
        Twins twins(dtype);
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

}  // namespace
}  // namespace thpc::test
