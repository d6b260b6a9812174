// GradStore (kernels/ops.h) on the CPU: every backward op with activation-gradient outputs,
// run with kWrite into buffers full of NaN, gives bit for bit what kAdd into zeroed
// buffers gives (the model's buffers were zeroed before each first writer until the
// model passed kWrite), parameter gradients included; null outputs stay allowed. Random
// inputs, never zero; shapes with an empty product too, where writing means writing
// zeros. The CUDA twins of kWrite are tested in each op family's file
// (Cuda*.…Writing…, CudaCandidate*.…Writing…).
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "cuda_twin.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/ops.h"

namespace thpc {
namespace {

using test::random_values;
using test::same_bits;
using test::Scope;

// One op call: its inputs made once; outputs() lists its gradient outputs, activation
// ones (`written`: what kWrite writes) and parameter ones (always added into); run(store)
// calls the op on them.
struct Case {
  std::string name;
  std::vector<int64_t> activation_sizes, parameter_sizes;
  std::function<void(Backend&, Scope&, const std::vector<Tensor>& activations,
                     const std::vector<Tensor>& parameters, GradStore)>
      run;
};

// The op on outputs starting at `start` (activation gradients) and at the same random
// parameter gradients both times; returns every output's values, activations first.
std::vector<std::vector<float>> outputs_after(const Case& c, float start, GradStore store) {
  auto backend = make_cpu_backend(DType::F32);
  Scope scope(*backend);
  std::vector<Tensor> activations, parameters;
  for (int64_t n : c.activation_sizes) {
    activations.push_back(
        n < 0 ? Tensor{} : scope.put(DType::F32, std::vector<float>(size_t(n), start)));
  }
  std::mt19937 rng(99);
  for (int64_t n : c.parameter_sizes) {
    parameters.push_back(n < 0 ? Tensor{}
                               : scope.put(DType::F32, random_values(size_t(n), rng)));
  }
  c.run(*backend, scope, activations, parameters, store);
  std::vector<std::vector<float>> values;
  for (const Tensor& t : activations) values.push_back(t ? scope.get(t) : std::vector<float>{});
  for (const Tensor& t : parameters) values.push_back(t ? scope.get(t) : std::vector<float>{});
  return values;
}

void expect_write_is_add_into_zeros(const Case& c) {
  SCOPED_TRACE(c.name);
  const auto added = outputs_after(c, 0.0f, GradStore::kAdd);
  const auto written = outputs_after(c, NAN, GradStore::kWrite);
  ASSERT_EQ(added.size(), written.size());
  for (size_t i = 0; i < added.size(); ++i) {
    EXPECT_TRUE(same_bits(written[i], added[i])) << "output " << i;
    for (float value : written[i]) {
      if (std::isnan(value)) {
        ADD_FAILURE() << "output " << i << " holds a NaN: an element kWrite did not write";
        break;
      }
    }
  }
}

// Inputs of `n` random values, never zero (seeded by the case's order).
class Inputs {
 public:
  explicit Inputs(Scope& scope) : scope_(scope) {}
  Tensor random(int64_t n) { return scope_.put(DType::F32, random_values(size_t(n), rng_)); }
  // A ReLU's output: half of it zero.
  Tensor relu_output(int64_t n) {
    auto values = random_values(size_t(n), rng_);
    for (float& v : values) v = v > 0.0f ? v : 0.0f;
    return scope_.put(DType::F32, values);
  }
  std::mt19937& rng() { return rng_; }

 private:
  Scope& scope_;
  std::mt19937 rng_{7};
};

constexpr DropoutKey kKey{1234, 5, 6, 7};

TEST(GradStore, LinearBackwardWritesWhatAddingIntoZerosGives) {
  // Sizes by name, not by structured binding: the lambdas below capture them, and C++17
  // lets no lambda capture a structured binding (clang refuses).
  for (const std::array<int, 3>& size :
       {std::array<int, 3>{7, 13, 29}, {64, 96, 33}, {5, 0, 3}, {4, 6, 0}}) {
    const int M = size[0], K = size[1], N = size[2];
    for (bool all : {true, false}) {
      expect_write_is_add_into_zeros(
          {"M=" + std::to_string(M) + " K=" + std::to_string(K) + " N=" + std::to_string(N) +
               (all ? " all outputs" : " dx only"),
           {int64_t(M) * K},
           {all ? int64_t(K) * N : -1, all ? int64_t(N) : -1},
           [=](Backend& b, Scope& s, const auto& act, const auto& par, GradStore store) {
             Inputs in(s);
             b.linear_backward(act[0], par[0], par[1], in.random(int64_t(M) * N),
                               in.random(int64_t(M) * K), in.random(int64_t(K) * N), M, K, N,
                               store);
           }});
    }
  }
}

TEST(GradStore, OutputProjectionBackwardWritesWhatAddingIntoZerosGives) {
  for (const std::array<int, 3>& size :
       {std::array<int, 3>{9, 16, 101}, {33, 64, 517}, {3, 8, 0}}) {
    const int M = size[0], d = size[1], vocab = size[2];  // captured below: not bindings
    expect_write_is_add_into_zeros(
        {"M=" + std::to_string(M) + " d=" + std::to_string(d) + " vocab=" + std::to_string(vocab),
         {int64_t(M) * d},
         {int64_t(vocab) * d},
         [=](Backend& b, Scope& s, const auto& act, const auto& par, GradStore store) {
           Inputs in(s);
           b.output_projection_backward(act[0], par[0], in.random(int64_t(M) * vocab),
                                        in.random(int64_t(M) * d), in.random(int64_t(vocab) * d),
                                        M, d, vocab, store);
         }});
  }
}

TEST(GradStore, ReluBackwardsWriteWhatAddingIntoZerosGives) {
  for (const std::array<int, 2>& size : {std::array<int, 2>{7, 61}, {130, 512}}) {
    const int rows = size[0], n = size[1];  // captured below: not bindings
    const int64_t count = int64_t(rows) * n;
    expect_write_is_add_into_zeros(
        {"relu_bias_backward rows=" + std::to_string(rows) + " n=" + std::to_string(n),
         {count},
         {n},
         [=](Backend& b, Scope& s, const auto& act, const auto& par, GradStore store) {
           Inputs in(s);
           b.relu_bias_backward(act[0], par[0], in.random(count), in.relu_output(count), rows,
                                n, store);
         }});
    // relu_backward: the SSE lanes and a scalar tail (count not a multiple of 4 for 7x61).
    expect_write_is_add_into_zeros(
        {"relu_backward n=" + std::to_string(count),
         {count},
         {},
         [=](Backend& b, Scope& s, const auto& act, const auto&, GradStore store) {
           Inputs in(s);
           b.relu_backward(act[0], in.random(count), in.relu_output(count), count, store);
         }});
  }
}

TEST(GradStore, DropoutBackwardsWriteWhatAddingIntoZerosGive) {
  for (float p : {0.0f, 0.1f, 0.5f}) {
    for (int64_t n : {int64_t(37), int64_t(10000)}) {
      const std::string shape = " p=" + std::to_string(p) + " n=" + std::to_string(n);
      expect_write_is_add_into_zeros(
          {"dropout_backward" + shape, {n}, {},
           [=](Backend& b, Scope& s, const auto& act, const auto&, GradStore store) {
             Inputs in(s);
             b.dropout_backward(act[0], in.random(n), n, p, kKey, store);
           }});
      for (int nulls = 0; nulls < 3; ++nulls) {  // both, dx only, d_sub only
        expect_write_is_add_into_zeros(
            {"residual_dropout_backward" + shape + " nulls=" + std::to_string(nulls),
             {nulls == 2 ? -1 : n, nulls == 1 ? -1 : n},
             {},
             [=](Backend& b, Scope& s, const auto& act, const auto&, GradStore store) {
               Inputs in(s);
               b.residual_dropout_backward(act[0], act[1], in.random(n), n, p, kKey, store);
             }});
      }
    }
  }
}

// Mean and rstd of each row of x as layernorm_forward saves them.
std::pair<Tensor, Tensor> row_statistics(Backend& b, Scope& s, Tensor x, Tensor gamma,
                                         Tensor beta, int rows, int d) {
  Tensor y = s.alloc(DType::F32, int64_t(rows) * d);
  Tensor mean = s.alloc(DType::F32, rows), rstd = s.alloc(DType::F32, rows);
  b.layernorm_forward(y, mean, rstd, x, gamma, beta, rows, d, 1e-6f);
  return {mean, rstd};
}

TEST(GradStore, LayerNormBackwardsWriteWhatAddingIntoZerosGives) {
  for (const std::array<int, 2>& size : {std::array<int, 2>{5, 37}, {67, 256}}) {
    const int rows = size[0], d = size[1];  // captured below: not bindings
    const int64_t n = int64_t(rows) * d;
    const std::string shape = " rows=" + std::to_string(rows) + " d=" + std::to_string(d);
    expect_write_is_add_into_zeros(
        {"layernorm_backward" + shape, {n}, {d, d},
         [=](Backend& b, Scope& s, const auto& act, const auto& par, GradStore store) {
           Inputs in(s);
           const Tensor x = in.random(n), gamma = in.random(d), beta = in.random(d);
           const auto [mean, rstd] = row_statistics(b, s, x, gamma, beta, rows, d);
           b.layernorm_backward(act[0], par[0], par[1], in.random(n), x, mean, rstd, gamma,
                                rows, d, store);
         }});
    for (float p : {0.0f, 0.1f}) {
      for (int nulls = 0; nulls < 3; ++nulls) {  // both, dx only, d_sub only
        expect_write_is_add_into_zeros(
            {"add_dropout_layernorm_backward" + shape + " p=" + std::to_string(p) +
                 " nulls=" + std::to_string(nulls),
             {nulls == 2 ? -1 : n, nulls == 1 ? -1 : n},
             {d, d},
             [=](Backend& b, Scope& s, const auto& act, const auto& par, GradStore store) {
               Inputs in(s);
               const Tensor residual = in.random(n), gamma = in.random(d), beta = in.random(d);
               const auto [mean, rstd] = row_statistics(b, s, residual, gamma, beta, rows, d);
               b.add_dropout_layernorm_backward(act[0], act[1], par[0], par[1], in.random(n),
                                                residual, mean, rstd, gamma, rows, d, p, kKey,
                                                store);
             }});
      }
    }
  }
}

// Self-attention over a fused q|k|v row (the model's layout: the three gradients are
// column blocks of one wider buffer, which they fill), causal or not, with padded keys.
TEST(GradStore, AttentionBackwardWritesWhatAddingIntoZerosGives) {
  const int B = 3, h = 2, L = 9, dk = 8, dv = 8, width = h * (2 * dk + dv);
  const int rows = B * L;
  for (bool causal : {true, false}) {
    expect_write_is_add_into_zeros(
        {std::string("self-attention causal=") + (causal ? "1" : "0"),
         {int64_t(rows) * width},
         {},
         [=](Backend& b, Scope& s, const auto& act, const auto&, GradStore store) {
           Inputs in(s);
           int32_t* lengths = s.put_ids({9, 4, 7});
           AttentionShape shape{B, h, L, L, dk, dv, causal, lengths, 0.0f, {}};
           const Tensor qkv = in.random(int64_t(rows) * width);
           const Tensor out = s.alloc(DType::F32, int64_t(rows) * h * dv);
           const Tensor saved = s.alloc(DType::F32, b.attention_saved_numel(shape));
           const int64_t k_off = h * dk, v_off = 2 * h * dk;
           const Tensor q = qkv, k = qkv.slice(k_off, qkv.numel - k_off),
                        v = qkv.slice(v_off, qkv.numel - v_off);
           b.attention_forward(out, saved, q, width, k, width, v, width, shape);
           const Tensor d_in = act[0];
           b.attention_backward(d_in, d_in.slice(k_off, d_in.numel - k_off),
                                d_in.slice(v_off, d_in.numel - v_off),
                                in.random(int64_t(rows) * h * dv), saved, q, width, k, width, v,
                                width, shape, store);
         }});
  }
}

}  // namespace
}  // namespace thpc
