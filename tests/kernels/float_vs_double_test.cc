// Every CPU reference op in its float instantiation (what the CPU backend trains with)
// against its double one (what the finite-difference tests check), on the same inputs.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "cpu_reference.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/positions.h"

namespace thpc::cpu_test {
namespace {

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
    sinusoidal_positions<T>(sinusoids.data(), length, d);
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
                            K, N, GradStore::kAdd);
    record("linear y", y);
    record("linear dx", dx);
    record("linear dW", dW);
    record("linear db", db);
    const int vocab = 29;
    const std::vector<T> E = random_t(vocab * K), d_logits = random_t(M * vocab);
    std::vector<T> logits(M * vocab), dh(M * K, T(0)), dE(vocab * K, T(0));
    cpu::output_projection_forward<T>(logits.data(), x.data(), E.data(), M, K, vocab);
    cpu::output_projection_backward<T>(dh.data(), dE.data(), d_logits.data(), x.data(),
                                       E.data(), M, K, vocab, GradStore::kAdd);
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
                               mean.data(), rstd.data(), gamma.data(), rows, d, GradStore::kAdd);
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
    std::vector<T> out(rows * kw), saved(Backend::attention_saved_numel(shape));
    std::vector<T> d_qkv(rows * ld, T(0));
    cpu::attention_forward<T>(out.data(), saved.data(), qkv.data(), ld, qkv.data() + kw, ld,
                              qkv.data() + 2 * kw, ld, shape);
    cpu::attention_backward<T>(d_qkv.data(), d_qkv.data() + kw, d_qkv.data() + 2 * kw,
                               d_out.data(), saved.data(), qkv.data(), ld, qkv.data() + kw, ld,
                               qkv.data() + 2 * kw, ld, shape, GradStore::kAdd);
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
    cpu::relu_backward<T>(d_relu.data(), dy.data(), relu.data(), n, GradStore::kAdd);
    cpu::dropout_forward<T>(dropped.data(), x.data(), n, 0.1f, kDropoutKey);
    cpu::dropout_backward<T>(d_dropped.data(), dy.data(), n, 0.1f, kDropoutKey, GradStore::kAdd);
    cpu::residual_dropout_forward<T>(residual.data(), x.data(), sub.data(), n, 0.1f,
                                     kDropoutKey);
    cpu::residual_dropout_backward<T>(d_x.data(), d_sub.data(), dy.data(), n, 0.1f,
                                      kDropoutKey, GradStore::kAdd);
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
      cpu::adam_update<T>(params.data(), nullptr, grads.data(), m.data(), v.data(), n, 1e-3f,
                          0.9f, 0.98f, 1e-9f, step);
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
}  // namespace thpc::cpu_test
