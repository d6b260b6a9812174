// The model as a whole: its gradient against finite differences, its parameter count
// against the closed form, the learning-rate schedule against §5.3, the synthetic data,
// and the training loop's determinism.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <iomanip>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <random>
#include <regex>
#include <set>
#include <sstream>

#include "common/sha256.h"
#include "config/config.h"
#include "data/synthetic.h"
#include "decode_oracles.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/forwarding_backend.h"
#include "model/transformer.h"
#include "model/transformer_state.h"
#include "program.h"
#include "train/lr_schedule.h"
#include "train/trainer.h"

namespace thpc {
namespace {

const std::string kRoot = THPC_SOURCE_DIR;

TEST(Sha256, KnownVectors) {
  // FIPS 180-4 examples.
  EXPECT_EQ(sha256_hex("", 0),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(sha256_hex("abc", 3),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  const std::string two_blocks = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
  EXPECT_EQ(sha256_hex(two_blocks.data(), two_blocks.size()),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
}

TEST(LearningRate, MatchesThePaperFormula) {
  // lrate = d^-0.5 * min(step^-0.5, step * warmup^-1.5), computed here by hand.
  const int d = 512, warmup = 4000;
  EXPECT_NEAR(learning_rate(1, d, warmup), 1.0 / std::sqrt(512.0) * 1.0 / std::pow(4000.0, 1.5),
              1e-15);
  EXPECT_NEAR(learning_rate(100, d, warmup), 100.0 / std::sqrt(512.0) / std::pow(4000.0, 1.5),
              1e-15);
  // At the end of warm-up both branches meet: d^-0.5 * warmup^-0.5 = 6.9877e-4.
  EXPECT_NEAR(learning_rate(4000, d, warmup), 1.0 / std::sqrt(512.0 * 4000.0), 1e-15);
  EXPECT_NEAR(learning_rate(4000, d, warmup), 6.98771242e-4, 1e-11);
  EXPECT_NEAR(learning_rate(16000, d, warmup), 1.0 / std::sqrt(512.0) / std::sqrt(16000.0),
              1e-15);
  EXPECT_NEAR(learning_rate(100000, d, warmup), 1.0 / std::sqrt(512.0 * 100000.0), 1e-15);
  // Peak at warmup: rising before, falling after.
  EXPECT_LT(learning_rate(3999, d, warmup), learning_rate(4000, d, warmup));
  EXPECT_LT(learning_rate(4001, d, warmup), learning_rate(4000, d, warmup));
  EXPECT_NEAR(learning_rate(4000, d, warmup, 2.0), 2.0 * learning_rate(4000, d, warmup), 1e-15);
}

// A run's rate is its settings' schedule: base.ini's d_model and warm-up, and lr_scale.
TEST(LearningRate, ARunsRateIsItsSettingsSchedule) {
  const Config base = load_config(kRoot + "/input/base.ini", {"train.lr_scale=1.5"});
  for (const int64_t step : {1, 3999, 4000, 4001, 100000}) {
    EXPECT_EQ(scheduled_learning_rate(step, base), learning_rate(step, 512, 4000, 1.5)) << step;
  }
}

// The closed form of the parameter count for the paper's architecture (no attention
// biases, shared embedding, post-norm with no final norm).
int64_t closed_form_count(int64_t N, int64_t d, int64_t f, int64_t vocab) {
  const int64_t ffn = 2 * d * f + f + d;
  const int64_t norm = 2 * d;
  const int64_t encoder_layer = 4 * d * d + ffn + 2 * norm;
  const int64_t decoder_layer = 8 * d * d + ffn + 3 * norm;
  return vocab * d + N * (encoder_layer + decoder_layer);
}

TEST(ParameterCount, BaseIniMatchesClosedForm) {
  const Config config = load_config(kRoot + "/input/base.ini", {"model.vocab_size=37000"});
  ParamStore table;
  add_transformer_parameters(config.model, 37000, table);
  EXPECT_EQ(table.count(), closed_form_count(6, 512, 2048, 37000));
  EXPECT_EQ(table.count(), 63045632);  // ≈ 63M; Table 3 rounds base to 65M
}

TEST(ParameterCount, BigIniMatchesClosedForm) {
  const Config config = load_config(kRoot + "/input/big.ini", {"model.vocab_size=37000"});
  ParamStore table;
  add_transformer_parameters(config.model, 37000, table);
  EXPECT_EQ(table.count(), closed_form_count(6, 1024, 4096, 37000));
}

// Learned positions (Table 3 row E) start as the embeddings do, N(0, d^-1/2) each: a
// mutation audit initialised them to zeros and every test passed (the count above and the
// model against itself saw nothing).
TEST(ParameterInit, LearnedPositionsStartAsTheEmbeddingsDo) {
  ModelConfig c;
  c.layers = 1;
  c.d_model = 64;
  c.d_ff = 128;
  c.heads = 4;
  c.max_positions = 64;
  c.positions = "learned";
  auto backend = make_cpu_backend(DType::F32);
  Transformer model(c, 100, SpecialIds{}, *backend, 3);
  std::vector<float> positions(64 * 64);
  backend->download(positions.data(), model.params().param("embed.positions"));
  double sum = 0, squares = 0;
  for (const float value : positions) {
    sum += value;
    squares += static_cast<double>(value) * value;
  }
  const double mean = sum / positions.size();
  const double deviation = std::sqrt(squares / positions.size() - mean * mean);
  // 4096 draws of N(0, 1/8): the sample deviation within 5% of 0.125 (its own deviation
  // is 0.125 / sqrt(2 * 4096) = 1.1%), the mean within 0.01 (its deviation 0.002).
  EXPECT_NEAR(deviation, 1.0 / std::sqrt(64.0), 0.125 * 0.05);
  EXPECT_NEAR(mean, 0.0, 0.01);
  EXPECT_NE(std::vector<float>(positions.begin(), positions.begin() + 64),
            std::vector<float>(positions.begin() + 64, positions.begin() + 128));
}

TEST(ParameterCount, OptionalPartsAddWhatTheyShould) {
  ModelConfig c;
  c.layers = 2;
  c.d_model = 16;
  c.d_ff = 32;
  c.heads = 4;
  c.max_positions = 50;
  ParamStore plain, learned, biased;
  add_transformer_parameters(c, 100, plain);
  c.positions = "learned";
  add_transformer_parameters(c, 100, learned);
  EXPECT_EQ(learned.count() - plain.count(), 50 * 16);
  c.positions = "sinusoidal";
  c.attention_bias = true;
  add_transformer_parameters(c, 100, biased);
  // Per layer: encoder q,k,v,o biases (4d), decoder self (4d) and cross (4d).
  EXPECT_EQ(biased.count() - plain.count(), 2 * (4 * 16 + 8 * 16));
  // Pre-norm: a final norm (gamma, beta) after each stack, laid out after its layers.
  c.attention_bias = false;
  c.norm = "pre";
  ParamStore pre;
  add_transformer_parameters(c, 100, pre);
  EXPECT_EQ(pre.count() - plain.count(), 2 * 2 * 16);
  // (Transformer::layer_gradients_final reports the gradients final in this order.)
  std::vector<std::string> names;
  for (const ParamEntry& entry : pre.entries()) names.push_back(entry.name);
  const auto at = [&](const std::string& name) {
    return std::find(names.begin(), names.end(), name) - names.begin();
  };
  EXPECT_EQ(at("encoder.norm.gamma") + 2, at("decoder.0.self_attn.qkv.weight"));
  EXPECT_EQ(at("decoder.norm.beta") + 1, static_cast<ptrdiff_t>(names.size()));
}

// ---- the whole model's gradient against central finite differences ---------------

ModelConfig small_model(bool learned_positions, bool attention_bias) {
  ModelConfig c;
  c.layers = 2;
  c.d_model = 8;
  c.d_ff = 12;
  c.heads = 2;
  c.d_k = 3;  // d_k != d_v != d_model / h: Table 3 row B style
  c.d_v = 5;
  c.dropout = 0.1f;
  c.attention_dropout = 0.1f;
  c.label_smoothing = 0.1f;
  c.positions = learned_positions ? "learned" : "sinusoidal";
  c.max_positions = 16;
  c.attention_bias = attention_bias;
  return c;
}

Batch small_batch() {
  // Three pairs of different lengths: padding on both sides, cross-attention with
  // S != T.
  const std::vector<TokenSequence> sources = {{4, 5, 6, 7, 8}, {9, 10}, {11, 4, 12}};
  const std::vector<TokenSequence> targets = {{5, 6}, {7, 8, 9, 10, 11, 12}, {4}};
  return make_batch(sources, targets, SpecialIds{});
}

std::vector<double> download_f64(Backend& backend, Tensor t) {
  std::vector<double> host(t.numel);
  backend.download(host.data(), t);
  return host;
}

// (learned positions, attention biases, model.fused_ops, model.norm,
// model.activation_dropout): the fused sub-layer ops and the separate ones are each
// differentiated by hand, and so is pre-norm (its layers, the stacks' lead-in norms and
// final norms: every parameter tensor is sampled, encoder.norm and decoder.norm among
// them, and the embedding's gradient has come through all of it), and the FFN's
// activation dropout (W2's input the dropped hidden layer, the ReLU's backward through
// the same mask), and a separate source vocabulary (the encoder's own table, its source
// ids beyond the target's 13, the target table still tied to the projection); the last
// parameter is that source vocabulary's size (0: shared).
class ModelGradient
    : public ::testing::TestWithParam<
          std::tuple<bool, bool, const char*, const char*, float, int>> {};

// small_batch's pairs with source ids up to 16: of a source vocabulary of 17, beyond
// the target's 13.
Batch small_batch_of_separate_vocabularies() {
  const std::vector<TokenSequence> sources = {{4, 5, 16, 7, 8}, {13, 10}, {15, 14, 12}};
  const std::vector<TokenSequence> targets = {{5, 6}, {7, 8, 9, 10, 11, 12}, {4}};
  return make_batch(sources, targets, SpecialIds{});
}

TEST_P(ModelGradient, MatchesCentralDifferences) {
  const auto [learned_positions, attention_bias, fused_ops, norm, activation_dropout,
              source_vocab] = GetParam();
  ModelConfig c = small_model(learned_positions, attention_bias);
  c.fused_ops = fused_ops;
  c.norm = norm;
  c.activation_dropout = activation_dropout;
  auto backend = make_cpu_backend(DType::F64);
  Transformer model(c, VocabularySizes{13, source_vocab}, SpecialIds{}, *backend, 7);
  const Batch batch =
      source_vocab > 0 ? small_batch_of_separate_vocabularies() : small_batch();
  const DropoutContext dropout{11, 3, 1};
  const double scale = 1.0 / static_cast<double>(batch.tgt_tokens());
  ParamStore& params = model.params();

  backend->zero(params.grads());
  model.train_step(batch, static_cast<float>(scale), dropout);
  const std::vector<double> analytic = download_f64(*backend, params.grads());
  std::vector<double> values = download_f64(*backend, params.params());

  auto loss_at = [&](int64_t index, double delta) {
    std::vector<double> shifted = values;
    shifted[index] += delta;
    backend->upload(params.params(), shifted.data());
    const LossSums sums = model.train_step(batch, 0.0f, dropout);
    return sums.loss * scale;
  };

  // A few elements of every parameter tensor, chosen at random.
  std::mt19937 rng(5);
  int checked = 0, nonzero = 0;
  for (const ParamEntry& entry : params.entries()) {
    for (int sample = 0; sample < 4; ++sample) {
      const int64_t index =
          entry.offset + std::uniform_int_distribution<int64_t>(0, entry.numel() - 1)(rng);
      // h = 1e-5 in double: truncation error ~h^2 |f'''| ≈ 1e-10, rounding ~eps/h ≈ 1e-11;
      // the tolerance leaves room for ReLU kinks not being crossed by chance.
      const double h = 1e-5;
      const double numeric = (loss_at(index, h) - loss_at(index, -h)) / (2 * h);
      EXPECT_NEAR(analytic[index], numeric, 1e-8 + 1e-5 * std::abs(numeric))
          << entry.name << " element " << index - entry.offset;
      ++checked;
      if (std::abs(analytic[index]) > 1e-6) ++nonzero;
    }
  }
  backend->upload(params.params(), values.data());
  // Token ids absent from the batch have zero embedding gradient, and so may a few
  // samples; most must carry signal, or the test checks nothing.
  EXPECT_GT(nonzero, checked * 3 / 4);
}

INSTANTIATE_TEST_SUITE_P(Variants, ModelGradient,
                         ::testing::Values(std::make_tuple(false, false, "on", "post", 0.0f, 0),
                                           std::make_tuple(true, true, "on", "post", 0.0f, 0),
                                           std::make_tuple(false, false, "off", "post", 0.0f, 0),
                                           std::make_tuple(true, true, "off", "post", 0.0f, 0),
                                           std::make_tuple(false, false, "on", "pre", 0.0f, 0),
                                           std::make_tuple(true, true, "on", "pre", 0.0f, 0),
                                           std::make_tuple(false, false, "off", "pre", 0.0f, 0),
                                           std::make_tuple(true, true, "off", "pre", 0.0f, 0),
                                           std::make_tuple(false, false, "on", "post", 0.3f, 0),
                                           std::make_tuple(true, true, "off", "pre", 0.3f, 0),
                                           std::make_tuple(false, false, "on", "post", 0.0f, 17),
                                           std::make_tuple(true, true, "off", "pre", 0.0f, 17)));

// model.activation_dropout (fairseq's --activation-dropout): in a training pass each layer's
// FFN draws one dropout over its [rows, d_ff] hidden layer with the key's own site
// (SiteSlot::FfnActivation, the layer's number) and rate; evaluation (and so decoding)
// draws none, and with rate 0 training draws none either. It changes the training loss
// and not the evaluation's; ModelGradient holds its backward to finite differences.
class DropoutCounting : public ForwardingBackend {
 public:
  using ForwardingBackend::ForwardingBackend;
  void dropout_forward(Tensor y, Tensor x, int64_t n, float p, DropoutKey key) override {
    if ((key.site & 0xF) == static_cast<uint32_t>(model_detail::SiteSlot::FfnActivation)) {
      sites.insert(key.site);
      sizes.insert(n);
      rates.insert(p);
      ++ffn_calls;
    }
    inner().dropout_forward(y, x, n, p, key);
  }
  std::set<uint32_t> sites;
  std::set<int64_t> sizes;
  std::set<float> rates;
  int ffn_calls = 0;
};

TEST(ActivationDropout, DropsEachFfnsHiddenLayerInTrainingOnly) {
  const Batch batch = small_batch();
  const DropoutContext dropout{11, 3, 1};
  std::vector<double> train_losses, valid_losses;
  for (const float rate : {0.0f, 0.25f}) {
    SCOPED_TRACE(rate);
    ModelConfig c = small_model(false, false);
    c.activation_dropout = rate;
    auto inner = make_cpu_backend(DType::F64);
    DropoutCounting counting(*inner);
    Transformer model(c, 13, SpecialIds{}, counting, 7);
    train_losses.push_back(model.train_step(batch, 0.0f, dropout).loss);
    if (rate == 0.0f) {
      EXPECT_EQ(counting.ffn_calls, 0);
    } else {
      EXPECT_EQ(counting.ffn_calls, 2 * c.layers);  // the encoder's layers and the decoder's
      EXPECT_EQ(counting.sites.size(), static_cast<size_t>(2 * c.layers));
      const int64_t src_rows = int64_t(batch.size) * batch.src_len;
      const int64_t tgt_rows = int64_t(batch.size) * batch.tgt_len;
      EXPECT_EQ(counting.sizes, (std::set<int64_t>{src_rows * c.d_ff, tgt_rows * c.d_ff}));
      EXPECT_EQ(counting.rates, std::set<float>{rate});
    }
    counting.ffn_calls = 0;
    valid_losses.push_back(model.evaluate(batch).loss);
    EXPECT_EQ(counting.ffn_calls, 0);
  }
  EXPECT_GT(std::abs(train_losses[1] - train_losses[0]), 1e-6 * train_losses[0]);
  EXPECT_EQ(valid_losses[1], valid_losses[0]);
}

// Separate vocabularies: the source ids index the encoder's own table, the target table
// stays the projection's and the target lookups'. The tied table summed per use
// (dist.embedding_sum = per_use, what GradientSums does on several ranks) then collects
// the target lookups apart, and only those rows (the source's ids, up to 16, are not rows
// of a 13-row table): added back, the gradient is the plain pass's, to the order of
// additions.
TEST(SeparateVocabularies, TheTargetLookupsSummedApartGiveThePlainGradient) {
  const ModelConfig c = small_model(false, false);
  auto backend = make_cpu_backend(DType::F64);
  const VocabularySizes sizes{13, 17};
  Transformer plain(c, sizes, SpecialIds{}, *backend, 7);
  Transformer apart(c, sizes, SpecialIds{}, *backend, 7);
  ASSERT_EQ(plain.params().sha256_hex(), apart.params().sha256_hex());
  ASSERT_TRUE(plain.separate_source_embedding());
  EXPECT_EQ(plain.source_vocab_size(), 17);
  EXPECT_EQ(plain.vocab_size(), 13);
  EXPECT_EQ(plain.params().entry(kSourceEmbeddingName).numel(), 17 * c.d_model);
  EXPECT_EQ(plain.params().entry("embed.weight").numel(), 13 * c.d_model);

  const Batch batch = small_batch_of_separate_vocabularies();
  const DropoutContext dropout{11, 3, 1};
  const float scale = 1.0f / static_cast<float>(batch.tgt_tokens());
  backend->zero(plain.params().grads());
  const double plain_loss = plain.train_step(batch, scale, dropout).loss;

  std::vector<int32_t> rows = batch.tgt_in;  // the target's lookups alone
  std::sort(rows.begin(), rows.end());
  rows.erase(std::unique(rows.begin(), rows.end()), rows.end());
  apart.sum_lookups_apart(rows);
  backend->zero(apart.params().grads());
  EXPECT_EQ(apart.train_step(batch, scale, dropout).loss, plain_loss);
  apart.add_lookup_gradient_rows(apart.lookup_gradient_rows());

  const std::vector<double> expected = download_f64(*backend, plain.params().grads());
  const std::vector<double> got = download_f64(*backend, apart.params().grads());
  ASSERT_EQ(got.size(), expected.size());
  double largest = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    largest = std::max(largest, std::abs(expected[i]));
    // Only the order of the target lookups' additions differs: a few ulps in double.
    EXPECT_NEAR(got[i], expected[i], 1e-14 + 1e-12 * std::abs(expected[i])) << "element " << i;
  }
  EXPECT_GT(largest, 1e-3);
  // The source rows beyond the target's vocabulary learn: the encoder's table took them.
  const ParamEntry& source = plain.params().entry(kSourceEmbeddingName);
  for (const int id : {13, 14, 15, 16}) {
    double norm = 0;
    for (int k = 0; k < c.d_model; ++k) {
      norm += std::abs(expected[source.offset + int64_t(id) * c.d_model + k]);
    }
    EXPECT_GT(norm, 1e-6) << "source id " << id;
  }
}

// model.fused_ops on the CPU: the fused sub-layer ops give the separate ops' bits, so
// training (dropout on, three steps with Adam, threaded sizes: rows * d_model >= 2^15)
// and a forward without dropout (what decoding runs) are the same with either, and
// auto takes them on the CPU; in both layer-norm orders (pre-norm runs the fused op
// forward, with the next sub-layer's norm, and the separate ops backward).
TEST(FusedOps, CpuTrainingIsBitIdenticalToTheSeparateOps) {
  for (const char* norm : {"post", "pre"}) {
    SCOPED_TRACE(std::string(norm) + "-norm");
    ModelConfig c = small_model(false, true);
    c.norm = norm;
    c.d_model = 64;
    c.d_ff = 96;
    c.d_k = c.d_v = 0;
    c.heads = 4;
    c.max_positions = 64;
    std::vector<TokenSequence> sources, targets;
    std::mt19937 rng(17);
    std::uniform_int_distribution<int32_t> token(4, 39);
    for (int sentence = 0; sentence < 24; ++sentence) {
      sources.emplace_back(20 + sentence % 7);
      targets.emplace_back(18 + sentence % 5);
      for (int32_t& id : sources.back()) id = token(rng);
      for (int32_t& id : targets.back()) id = token(rng);
    }
    const Batch batch = make_batch(sources, targets, SpecialIds{});
    ASSERT_GE(int64_t(batch.size) * batch.tgt_len * c.d_model, int64_t(1) << 15);
    const auto run = [&](const char* fused_ops, std::vector<float>* parameters) {
      ModelConfig variant = c;
      variant.fused_ops = fused_ops;
      auto backend = make_cpu_backend(DType::F32);
      Transformer model(variant, 40, SpecialIds{}, *backend, 9);
      Adam adam(model.params(), *backend, AdamSettings{});
      std::vector<double> losses;
      for (uint32_t step = 1; step <= 3; ++step) {
        backend->zero(model.params().grads());
        const LossSums sums = model.train_step(batch, 1.0f / batch.tgt_tokens(),
                                               DropoutContext{5, step, 0});
        adam.update(1e-3f, step);
        losses.push_back(sums.loss);
      }
      losses.push_back(model.evaluate(batch).loss);
      parameters->resize(size_t(model.params().buffer_numel()));
      backend->download(parameters->data(), model.params().params());
      return losses;
    };
    std::vector<float> fused, separate, automatic;
    const std::vector<double> fused_losses = run("on", &fused);
    EXPECT_EQ(fused_losses, run("off", &separate));
    EXPECT_EQ(fused_losses, run("auto", &automatic));
    EXPECT_TRUE(fused.size() == separate.size() &&
                std::memcmp(fused.data(), separate.data(), fused.size() * sizeof(float)) == 0)
        << "the parameters after three steps differ";
    EXPECT_TRUE(fused == automatic);
  }
}

TEST(ModelForward, FloatAndDoubleBackendsAgree) {
  // Same parameters (initialised in double, then rounded to float), same batch: the
  // fp32 loss must track the fp64 one to fp32 accuracy over a deep-enough stack
  // (tolerance: ~1e-7 eps times a few hundred accumulated terms).
  auto f64 = make_cpu_backend(DType::F64);
  auto f32 = make_cpu_backend(DType::F32);
  const ModelConfig c = small_model(false, false);
  Transformer reference(c, 13, SpecialIds{}, *f64, 3);
  Transformer single(c, 13, SpecialIds{}, *f32, 3);
  const Batch batch = small_batch();
  const DropoutContext dropout{1, 1, 0};
  const LossSums a = reference.train_step(batch, 1.0f, dropout);
  const LossSums b = single.train_step(batch, 1.0f, dropout);
  EXPECT_NEAR(a.loss, b.loss, 1e-4 * std::abs(a.loss));
  EXPECT_NEAR(a.nll, b.nll, 1e-4 * std::abs(a.nll));
  EXPECT_EQ(a.tokens, batch.tgt_tokens());
}

TEST(ModelForward, PaddingDoesNotChangeAnotherSentence) {
  // A sentence's loss is the same alone or batched with a longer one: padding is
  // masked in attention and ignored by the loss.
  auto backend = make_cpu_backend(DType::F64);
  ModelConfig c = small_model(false, false);
  c.dropout = 0.0f;
  c.attention_dropout = 0.0f;
  Transformer model(c, 13, SpecialIds{}, *backend, 3);
  const Batch alone = make_batch({{9, 10}}, {{7, 8}}, SpecialIds{});
  const Batch padded = make_batch({{9, 10}, {4, 5, 6, 7, 8, 9}}, {{7, 8}, {4, 4, 4, 4, 4}},
                                  SpecialIds{});
  const Batch other = make_batch({{4, 5, 6, 7, 8, 9}}, {{4, 4, 4, 4, 4}}, SpecialIds{});
  const double loss_alone = model.evaluate(alone).loss;
  const double loss_other = model.evaluate(other).loss;
  EXPECT_NEAR(model.evaluate(padded).loss, loss_alone + loss_other, 1e-10);
}

// A model built for inference (transformer_decode) has no gradient buffer, evaluates
// exactly as a training one with the same parameters, and refuses to train.
TEST(ModelForward, InferenceModelEvaluatesAlikeAndRefusesToTrain) {
  auto backend = make_cpu_backend(DType::F64);
  const ModelConfig c = small_model(false, false);
  Transformer training(c, 13, SpecialIds{}, *backend, 3);
  Transformer inference(c, 13, SpecialIds{}, *backend, 3, Transformer::ModelUse::kInference);
  EXPECT_TRUE(static_cast<bool>(training.params().grads()));
  EXPECT_FALSE(static_cast<bool>(inference.params().grads()));
  EXPECT_FALSE(static_cast<bool>(inference.params().grad("embed.weight")));
  const Batch batch = small_batch();
  EXPECT_EQ(inference.evaluate(batch).loss, training.evaluate(batch).loss);
  try {
    inference.train_step(batch, 1.0f, DropoutContext{1, 1, 0});
    FAIL() << "train_step ran without gradients";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("built for inference"), std::string::npos)
        << error.what();
  }
}

TEST(ModelForward, DecoderIsCausal) {
  // Changing a later target token must not change the log-probabilities predicted at
  // earlier positions.
  auto backend = make_cpu_backend(DType::F64);
  ModelConfig c = small_model(false, false);
  Transformer model(c, 13, SpecialIds{}, *backend, 3);
  model.encode(make_batch({{4, 5, 6}}, {{}}, SpecialIds{}));
  const std::vector<float> a = model.next_token_log_probs({2, 7, 8, 9}, {2}, 4);
  const std::vector<float> b = model.next_token_log_probs({2, 7, 11, 12}, {2}, 4);
  ASSERT_EQ(a.size(), 13u);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_FLOAT_EQ(a[i], b[i]);
  const std::vector<float> c3 = model.next_token_log_probs({2, 7, 11, 12}, {3}, 4);
  bool differs = false;
  for (size_t i = 0; i < a.size(); ++i) differs |= a[i] != c3[i];
  EXPECT_TRUE(differs) << "the next-token distribution ignores the prefix";
}

// ---- encode() in length groups ----------------------------------------------------

TEST(EncodeInGroups, GroupsAreRunsOfSentencesOfSimilarLength) {
  using model_detail::encoder_length_groups;
  // Two long sentences among short ones: padding the short ones to 41 costs more rows
  // than a second group; ties keep batch order.
  const std::vector<int32_t> lengths = {3, 41, 4, 3, 40, 3, 4, 3};
  const std::vector<std::vector<int>> expected = {{1, 4}, {2, 6, 0, 3, 5, 7}};
  EXPECT_EQ(encoder_length_groups(lengths, 16), expected);
  // A group costing more than the padding it saves: one group, longest first.
  const std::vector<std::vector<int>> one = {{1, 4, 2, 6, 0, 3, 5, 7}};
  EXPECT_EQ(encoder_length_groups(lengths, 1000), one);
  // Equal lengths: nothing to save.
  EXPECT_EQ(encoder_length_groups({7, 7, 7}, 0).size(), 1u);
  // No cost at all: a group per length.
  EXPECT_EQ(encoder_length_groups(lengths, 0).size(), 4u);
  EXPECT_TRUE(encoder_length_groups({}, 16).empty());
}

TEST(EncodeInGroups, TheDecoderReadsWhatTheWholeBatchGives) {
  // encode() runs this batch (two long sentences, ten short ones) in two groups on the
  // CPU; evaluate() runs it whole. The decoder's log-probabilities read the encoder output
  // of the last of the two: a row copied to the wrong place, a pad row read as a key or a
  // group padded short would change them by far more than rounding. Tolerance: a
  // sentence's rows are rounded differently by the GEMM's tiles when the rows around it
  // change (OpenBLAS's sgemm: about a third of a row's elements differ by an ulp between
  // M = 492 and M = 7); through two layers and the decoder that stays below 1e-5 on
  // log-probabilities of magnitude ~3 (measured: F32 2e-6, F64 0).
  std::vector<TokenSequence> sources;
  for (int i = 0; i < 12; ++i) {
    const int length = i == 2 ? 40 : i == 7 ? 38 : 2 + i % 2;
    TokenSequence source;
    for (int t = 0; t < length; ++t) source.push_back(4 + (3 * i + t) % 9);
    sources.push_back(source);
  }
  const SpecialIds ids;
  const std::vector<TokenSequence> targets(sources.size(), TokenSequence{5, 6});
  const Batch batch = make_batch(sources, targets, ids);
  for (const DType dtype : {DType::F32, DType::F64}) {
    auto backend = make_cpu_backend(dtype);
    ASSERT_EQ(model_detail::encoder_length_groups(batch.src_lengths,
                                                  backend->encoder_group_cost_rows())
                  .size(),
              2u);
    ModelConfig c = small_model(false, true);
    c.d_model = 16;
    c.heads = 2;
    c.d_k = 8;
    c.d_v = 8;
    c.max_positions = 64;
    Transformer model(c, 13, ids, *backend, 7);
    const int B = batch.size, T = 2;
    std::vector<int32_t> tgt_in, prefix_lengths(B, T);
    for (int b = 0; b < B; ++b) tgt_in.insert(tgt_in.end(), {ids.bos, 4 + b % 7});
    model.evaluate(batch);  // the whole batch's encoder output
    const std::vector<float> whole = model.next_token_log_probs(tgt_in, prefix_lengths, T);
    model.encode(batch);  // in groups
    const std::vector<float> grouped = model.next_token_log_probs(tgt_in, prefix_lengths, T);
    ASSERT_EQ(whole.size(), grouped.size());
    float largest = 0;
    for (size_t i = 0; i < whole.size(); ++i) {
      largest = std::max(largest, std::abs(whole[i] - grouped[i]));
      ASSERT_NEAR(whole[i], grouped[i], 1e-5) << dtype_name(dtype) << " element " << i;
    }
    std::cout << dtype_name(dtype) << " largest difference " << largest << "\n";
  }
}

// ---- synthetic data ---------------------------------------------------------------

TEST(Synthetic, BatchesRespectTheBudgetAndTheTask) {
  SyntheticSpec spec;
  spec.vocab = 20;
  spec.min_len = 2;
  spec.max_len = 9;
  SyntheticSource source(spec);
  for (int i = 0; i < 50; ++i) {
    const Batch batch = source.next(64);
    EXPECT_LE(int64_t(batch.size) * batch.src_len, 64);
    EXPECT_LE(int64_t(batch.size) * batch.tgt_len, 64);
    for (int b = 0; b < batch.size; ++b) {
      const int n = batch.src_lengths[b] - 1;
      ASSERT_EQ(batch.tgt_lengths[b], n + 1);
      for (int t = 0; t < n; ++t) {
        EXPECT_EQ(batch.tgt_out[b * batch.tgt_len + t], batch.src[b * batch.src_len + n - 1 - t]);
        EXPECT_GE(batch.src[b * batch.src_len + t], 4);
        EXPECT_LT(batch.src[b * batch.src_len + t], 20);
      }
      EXPECT_EQ(batch.src[b * batch.src_len + n], SpecialIds{}.eos);
      EXPECT_EQ(batch.tgt_out[b * batch.tgt_len + n], SpecialIds{}.eos);
      EXPECT_EQ(batch.tgt_in[b * batch.tgt_len], SpecialIds{}.bos);
    }
  }
}

TEST(Synthetic, HeldOutIsDisjointFromTrainingAndPositionsRestart) {
  SyntheticSpec spec;
  spec.vocab = 8;  // few symbols: collisions would be frequent if splits overlapped
  spec.min_len = 2;
  spec.max_len = 4;
  SyntheticSource train(spec);
  spec.split = SyntheticSplit::HeldOut;
  SyntheticSource held_out(spec);
  std::set<TokenSequence> seen;
  for (int i = 0; i < 5000; ++i) seen.insert(train.next_source());
  for (int i = 0; i < 200; ++i) EXPECT_EQ(seen.count(held_out.next_source()), 0u);

  const DataPosition mark = train.position();
  const Batch first = train.next(40);
  train.seek(mark);
  EXPECT_EQ(train.next(40).src, first.src);
}

// ---- the training loop ------------------------------------------------------------

TEST(Trainer, TwoRunsAreBitIdentical) {
  // Each run ends with a checkpoint; keep them out of the source tree.
  const std::filesystem::path run =
      std::filesystem::temp_directory_path() / ("thpc_test_model_" + std::to_string(::getpid()));
  // Two runs, two run directories (a run owns its own).
  const auto config_in = [&](const std::string& name) {
    return load_config(kRoot + "/input/tiny.ini",
                       {"train.max_steps=3", "checkpoint.dir=" + (run / name / "checkpoints").string()});
  };
  std::ostringstream log_a, log_b;
  Trainer(config_in("a")).run(log_a);
  Trainer(config_in("b")).run(log_b);
  EXPECT_NE(log_a.str().find("final: step=3 loss="), std::string::npos) << log_a.str();
  EXPECT_EQ(log_a.str().substr(log_a.str().find("final:")),
            log_b.str().substr(log_b.str().find("final:")));
  std::filesystem::remove_all(run);
}

// The whole program's view of model.fused_ops on the CPU: three steps of input/tiny.ini
// on two threads (dropout, label smoothing, the schedule, clipping, Adam) end with the
// same loss and params_sha256 with the fused sub-layer ops and the separate ones, so the
// CPU's default (auto = fused) leaves every pinned number of the separate ops as it was.
TEST(FusedOps, TrainerEndsWithTheSameParametersOnAndOff) {
  const std::filesystem::path run =
      std::filesystem::temp_directory_path() / ("thpc_test_fused_" + std::to_string(::getpid()));
  std::string final_line[2];
  const char* settings[2] = {"model.fused_ops=on", "model.fused_ops=off"};
  for (int i = 0; i < 2; ++i) {
    std::ostringstream log;
    Trainer(load_config(kRoot + "/input/tiny.ini",
                        {"train.max_steps=3", "train.threads=2", settings[i],
                         "checkpoint.dir=" + (run / std::to_string(i)).string(),
                         // Each run its own metrics file: a run owns its directory.
                         "train.metrics_dir=" + (run / std::to_string(i)).string()}))
        .run(log);
    const size_t final_at = log.str().find("final: step=3 loss=");
    ASSERT_NE(final_at, std::string::npos) << log.str();
    final_line[i] = log.str().substr(final_at);
    EXPECT_NE(final_line[i].find("params_sha256="), std::string::npos) << final_line[i];
  }
  EXPECT_EQ(final_line[0], final_line[1]);
  std::filesystem::remove_all(run);
}

// train.loss_chunk_rows: the projection, the loss and the projection's backward a chunk
// of target rows at a time give the whole batch's loss and gradients. In fp64 they agree
// to the summation orders (the embedding's gradient adds the chunks' shares one after
// another; the loss sums the chunks' sums): 1e-12 relative. Chunks of 1 row, of 8 (not
// dividing the 21 rows: a short last chunk) and of more rows than there are (one chunk).
TEST(LossInChunks, GivesTheWholeBatchsLossAndGradients) {
  const ModelConfig c = small_model(true, true);
  const Batch batch = small_batch();
  const int rows = batch.size * batch.tgt_len;
  ASSERT_EQ(rows, 21);
  const auto run = [&](int64_t chunk_rows, LossSums& sums) {
    auto backend = make_cpu_backend(DType::F64);
    Transformer model(c, 16, SpecialIds{}, *backend, 3);
    model.set_loss_chunk_rows(chunk_rows);
    backend->zero(model.params().grads());
    sums = model.train_step(batch, 0.25f, DropoutContext{7, 2, 1});
    return download_f64(*backend, model.params().grads());
  };
  LossSums whole;
  const std::vector<double> expected = run(0, whole);
  double largest = 0.0;
  for (const double g : expected) largest = std::max(largest, std::abs(g));
  ASSERT_GT(largest, 0.0);
  for (const int64_t chunk_rows : {int64_t{1}, int64_t{8}, int64_t{100}}) {
    SCOPED_TRACE("loss_chunk_rows " + std::to_string(chunk_rows));
    LossSums chunked;
    const std::vector<double> gradients = run(chunk_rows, chunked);
    EXPECT_EQ(chunked.tokens, whole.tokens);
    EXPECT_NEAR(chunked.loss, whole.loss, 1e-12 * std::abs(whole.loss));
    EXPECT_NEAR(chunked.nll, whole.nll, 1e-12 * std::abs(whole.nll));
    ASSERT_EQ(gradients.size(), expected.size());
    for (size_t i = 0; i < gradients.size(); ++i) {
      ASSERT_NEAR(gradients[i], expected[i], 1e-12 * largest) << "gradient element " << i;
    }
  }
}

// Validation (evaluate) takes the logits in the same chunks: the whole batch's sums.
TEST(LossInChunks, EvaluationGivesTheWholeBatchsSums) {
  const ModelConfig c = small_model(false, false);
  const Batch batch = small_batch();
  auto backend = make_cpu_backend(DType::F64);
  Transformer model(c, 16, SpecialIds{}, *backend, 4);
  const LossSums whole = model.evaluate(batch);
  for (const int64_t chunk_rows : {int64_t{1}, int64_t{8}}) {
    SCOPED_TRACE("loss_chunk_rows " + std::to_string(chunk_rows));
    model.set_loss_chunk_rows(chunk_rows);
    const LossSums chunked = model.evaluate(batch);
    EXPECT_EQ(chunked.tokens, whole.tokens);
    EXPECT_NEAR(chunked.loss, whole.loss, 1e-12 * std::abs(whole.loss));
    EXPECT_NEAR(chunked.nll, whole.nll, 1e-12 * std::abs(whole.nll));
  }
}

// The first six losses of input/tiny.ini (RegressionPin.FirstLossesOfTinyIni says where
// they come from).
const double kTinyGoldenLosses[] = {4.196724, 4.082856, 3.915161, 3.775877, 3.627720, 3.573549};

TEST(RegressionPin, FirstLossesOfTinyIni) {
  // A regression pin, not an independent check: the first steps of input/tiny.ini (seed
  // 1, one BLAS thread) as the program itself printed them when the model had been
  // checked against finite differences (ModelGradient.*) and shown to learn
  // (Learning.*). A change to the model, the initialisation, the data or the schedule
  // moves these; whether the new values are right is for those tests to say. The tolerance
  // (1e-4 absolute) allows another CPU's BLAS kernels to round differently (fp32 sums
  // differ by ~1e-6 relative) while any change of substance moves the loss by more.
  const Config config = load_config(kRoot + "/input/tiny.ini", {"train.max_steps=6"});
  Trainer trainer(config);
  for (double expected : kTinyGoldenLosses) {
    const StepStats stats = trainer.step();
    EXPECT_NEAR(stats.loss, expected, 1e-4) << "step " << stats.step;
  }
}

// The trainer with train.loss_chunk_rows: the step's loss adds the chunks' sums (through
// the step's totals), and training goes as without chunks, to fp32 rounding: the golden
// losses of tiny.ini within RegressionPin's 1e-4.
TEST(LossInChunks, TheTrainerKeepsTheGoldenLosses) {
  const Config config =
      load_config(kRoot + "/input/tiny.ini", {"train.max_steps=6", "train.loss_chunk_rows=5"});
  Trainer trainer(config);
  for (double expected : kTinyGoldenLosses) {
    const StepStats stats = trainer.step();
    EXPECT_NEAR(stats.loss, expected, 1e-4) << "step " << stats.step;
  }
}

// The norm of the gradient buffer as the test computes it, in double on the host.
double host_gradient_norm(Trainer& trainer) {
  std::vector<float> grads(trainer.model().params().buffer_numel());
  trainer.backend().download(grads.data(), trainer.model().params().grads());
  double sum = 0.0;
  for (float g : grads) sum += static_cast<double>(g) * g;
  return std::sqrt(sum);
}

TEST(Trainer, GradientNormIsTheNormOfTheGradientBuffer) {
  // Adam leaves the gradient buffer as the step summed it, so the norm reported by the
  // step can be recomputed from it independently.
  Trainer trainer(load_config(kRoot + "/input/tiny.ini", {"train.max_steps=3"}));
  for (int i = 0; i < 3; ++i) {
    const StepStats stats = trainer.step();
    const double expected = host_gradient_norm(trainer);
    EXPECT_GT(expected, 0.0);
    EXPECT_NEAR(stats.grad_norm, expected, 1e-9 * expected) << "step " << stats.step;
  }
}

TEST(Trainer, ClippingScalesTheGradientToTheBound) {
  // A bound of 0.5 is below step 1's norm (asserted), one of 1000 far above it.
  const std::string tiny = kRoot + "/input/tiny.ini";
  Trainer unclipped(load_config(tiny, {"train.max_steps=1"}));
  const StepStats reference = unclipped.step();
  ASSERT_GT(reference.grad_norm, 0.5);

  Trainer clipped(load_config(tiny, {"train.max_steps=1", "train.clip_norm=0.5"}));
  const StepStats stats = clipped.step();
  // The reported norm is the one before clipping; the buffer Adam read holds the bound.
  EXPECT_EQ(stats.grad_norm, reference.grad_norm);
  EXPECT_NEAR(host_gradient_norm(clipped), 0.5, 1e-6);
  // Adam used the clipped gradient: after step 1 its first moment is (1 - beta1) g.
  double moment_squares = 0.0;
  for (const NamedTensor& tensor : clipped.snapshot().adam_m) {
    for (float m : tensor.values) moment_squares += static_cast<double>(m) * m;
  }
  EXPECT_NEAR(std::sqrt(moment_squares), (1.0 - 0.9) * 0.5, 1e-6);

  Trainer loose(load_config(tiny, {"train.max_steps=1", "train.clip_norm=1000"}));
  loose.step();
  EXPECT_EQ(host_gradient_norm(loose), host_gradient_norm(unclipped));
  EXPECT_EQ(loose.model().params().sha256_hex(), unclipped.model().params().sha256_hex());
  // Just below and just above the norm: a comparison off by any factor (a mutation
  // audit's `> 2 * clip` clipped nothing between the bound and twice it) fails one of them.
  for (const double share : {0.99, 1.01}) {
    const double bound = share * reference.grad_norm;
    std::ostringstream value;
    value << std::setprecision(17) << bound;
    Trainer near(load_config(tiny, {"train.max_steps=1", "train.clip_norm=" + value.str()}));
    near.step();
    EXPECT_NEAR(host_gradient_norm(near), std::min(bound, reference.grad_norm),
                1e-6 * reference.grad_norm)
        << share;
  }
}

// train.weight_decay reaches Adam as AdamW's decay: after one step each parameter is the
// undecayed run's less lr x weight_decay x its value before the step (the step's lr, the
// schedule's at step 1; the gradient and so Adam's step are the same in both runs, the
// decay being applied after backward), to a few float roundings of the parameter. 0 is
// the run without it, bit for bit.
TEST(Trainer, WeightDecayTakesItsShareOfEachParameterBeforeAdam) {
  const std::string tiny = kRoot + "/input/tiny.ini";
  Trainer plain(load_config(tiny, {"train.max_steps=1"}));
  const std::vector<float> before = plain.model().params().to_host_f32();
  const StepStats reference = plain.step();
  const float weight_decay = 0.5f;  // large, so that the decay stands far above the roundings
  Trainer decayed(load_config(tiny, {"train.max_steps=1", "train.weight_decay=0.5"}));
  const StepStats stats = decayed.step();
  EXPECT_EQ(stats.loss, reference.loss);
  EXPECT_EQ(stats.grad_norm, reference.grad_norm);
  const std::vector<float> after_plain = plain.model().params().to_host_f32();
  const std::vector<float> after_decayed = decayed.model().params().to_host_f32();
  ASSERT_EQ(after_plain.size(), before.size());
  const double decay = static_cast<double>(stats.lr) * weight_decay;
  ASSERT_GT(decay, 1e-5);
  int decayed_values = 0;
  for (size_t i = 0; i < before.size(); ++i) {
    const double expected = -decay * before[i];
    const double ulp = std::ldexp(std::abs(double(after_plain[i])) + std::abs(double(before[i])),
                                  -23);
    ASSERT_NEAR(double(after_decayed[i]) - after_plain[i], expected, 2 * ulp) << i;
    decayed_values += std::abs(expected) > 4 * ulp;
  }
  EXPECT_GT(decayed_values, static_cast<int>(before.size() / 2));

  Trainer zero(load_config(tiny, {"train.max_steps=1", "train.weight_decay=0"}));
  zero.step();
  EXPECT_EQ(zero.model().params().sha256_hex(), plain.model().params().sha256_hex());
}

TEST(Trainer, ClipNormZeroKeepsTheGoldenLosses) {
  // clip_norm = 0 (the default RegressionPin.FirstLossesOfTinyIni runs with) is the same run as no
  // clipping at all; said explicitly so that a changed default would fail here.
  Trainer trainer(load_config(kRoot + "/input/tiny.ini",
                              {"train.max_steps=6", "train.clip_norm=0"}));
  for (double expected : kTinyGoldenLosses) {
    EXPECT_NEAR(trainer.step().loss, expected, 1e-4);
  }
}

TEST(Trainer, ProgressAndSummaryLinesCarryEveryField) {
  const std::string checkpoints = (std::filesystem::temp_directory_path() /
                                   ("thpc_test_progress_" + std::to_string(::getpid())) /
                                   "checkpoints")
                                      .string();
  std::ostringstream log;
  Trainer(load_config(kRoot + "/input/tiny.ini",
                      {"train.max_steps=4", "train.log_every=2", "checkpoint.dir=" + checkpoints}))
      .run(log);
  const std::string number = R"([0-9]+(\.[0-9]+)?)";
  const std::regex progress("(^|\n)step 2/4 \\| loss " + number + " \\| ppl " + number +
                            " \\| epoch 1 \\| lr [0-9]\\.[0-9]{3}e[-+][0-9]+ \\| gnorm "
                            "[0-9.e+-]+ \\| tgt tokens/s [0-9]+ \\| ms/step " + number +
                            " \\| peak mem " + number + " MiB \\| elapsed " + number +
                            "s \\| eta " + number + "s\n");
  EXPECT_TRUE(std::regex_search(log.str(), progress)) << log.str();
  const std::regex summary("\nsummary: steps 4 \\(0 to 4\\) \\| wall " + number +
                           "s \\| tgt tokens/s [0-9]+ \\| best valid ppl n/a \\| "
                           "best valid bleu n/a \\| checkpoints 1\nfinal: step=4 ");
  EXPECT_TRUE(std::regex_search(log.str(), summary)) << log.str();
  std::filesystem::remove_all(std::filesystem::path(checkpoints).parent_path());
  // The documents show the line and say what each field is, by hand: a field added to or
  // renamed in RunProgress::log_step must be there too (nothing compared them; a helper's
  // changeability trial). The fields' labels, in order: "loss", ..., "peak mem", "eta".
  const auto labels = [](const std::string& line) {
    std::vector<std::string> found;
    std::istringstream fields(line);
    std::string field;
    std::getline(fields, field, '|');  // "step N/M "
    while (std::getline(fields, field, '|')) {
      const size_t value = field.find_first_of("0123456789-", 1);
      found.push_back(field.substr(1, value == std::string::npos ? field.npos : value - 2));
    }
    return found;
  };
  const auto line_starting = [](const std::string& text, const std::string& start) {
    const size_t at = text.find(start);
    return at == std::string::npos ? std::string() : text.substr(at, text.find('\n', at) - at);
  };
  const std::vector<std::string> fields = labels(line_starting(log.str(), "step 2/4 |"));
  ASSERT_EQ(fields.size(), 10u) << log.str();
  const std::string running = read_file(kRoot + "/docs/running.md");
  EXPECT_EQ(labels(line_starting(running, "step 100/200 |")), fields) << "docs/running.md";
  EXPECT_EQ(labels(line_starting(read_file(kRoot + "/README.md"), "step 100/1200 |")), fields)
      << "README.md";
  const std::string table = running.substr(running.find("| field | meaning |"));
  for (const std::string& field : fields) {
    EXPECT_NE(table.substr(0, table.find("\n\n")).find("`" + field + "`"), std::string::npos)
        << "docs/running.md's table of the progress line's fields lacks " << field;
  }
}

TEST(Trainer, AccumulationEqualsOneBigBatchOfTheSameSentences) {
  // The gradient of one step over two micro-batches equals that of one batch holding
  // both, when dropout is off (masks are per micro-batch by design): the loss is
  // normalised by the step's total target tokens either way.
  Config config = load_config(kRoot + "/input/tiny.ini",
                              {"train.max_steps=1", "model.dropout=0", "train.accumulate=2",
                               "train.tokens_per_step=200"});
  Trainer accumulated(config);
  const StepStats stats = accumulated.step();
  EXPECT_EQ(stats.micro_batches, 2);
  // Adam leaves the gradient buffer as it was: the accumulated gradient of the step.
  std::vector<float> a(accumulated.model().params().buffer_numel());
  accumulated.backend().download(a.data(), accumulated.model().params().grads());

  // The same two micro-batches, drawn from a fresh source, concatenated.
  auto source = make_training_source(config);
  Batch first = source->next(100), second = source->next(100);
  std::vector<TokenSequence> sources, targets;
  for (const Batch* batch : {&first, &second}) {
    for (int b = 0; b < batch->size; ++b) {
      const int n = batch->src_lengths[b] - 1;
      sources.emplace_back(batch->src.begin() + b * batch->src_len,
                           batch->src.begin() + b * batch->src_len + n);
      targets.push_back(synthetic_target(SyntheticTask::Reverse, sources.back()));
    }
  }
  const Batch joined = make_batch(sources, targets, SpecialIds{});
  EXPECT_EQ(joined.tgt_tokens(), stats.tgt_tokens);
  auto backend = make_cpu_backend(DType::F32);
  Transformer model(config.model, source->vocab_size(), SpecialIds{}, *backend,
                    config.train.seed);
  backend->zero(model.params().grads());
  model.train_step(joined, 1.0f / joined.tgt_tokens(), DropoutContext{});
  std::vector<float> b(model.params().buffer_numel());
  backend->download(b.data(), model.params().grads());

  // Summation order differs (two GEMMs of different shapes vs one): fp32 rounding,
  // relative to the largest gradient (eps 1.2e-7 times sums of a few hundred terms).
  double largest = 0;
  for (float g : b) largest = std::max(largest, double(std::abs(g)));
  ASSERT_GT(largest, 0.0);
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_NEAR(a[i], b[i], 1e-5 * largest) << "gradient element " << i;
  }
}

}  // namespace
}  // namespace thpc
