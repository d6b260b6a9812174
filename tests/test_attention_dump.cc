// Attention pictures: Transformer::attention_weights on padded batches, and
// `transformer_decode --dump-attention FILE --dump-lines ...` run as a user runs it, on a
// SentencePiece model trained here on generated sentences and a randomly initialised
// 2-layer model (no data set needed): the file's layout and shapes, rows that sum to 1,
// exact zeros where the masks are, the cross-attention against an independent
// recomputation in double from the checkpoint's parameters, translations unchanged by the
// dump, bad --dump-lines refused, and tools/plot_attention.py drawing the file.
#include <gtest/gtest.h>
#include <hdf5.h>
#include <sentencepiece_processor.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "common/error.h"
#include "config/config.h"
#include "hdf5_strings.h"
#include "kernels/cpu/cpu_backend.h"
#include "model/checkpoint_params.h"
#include "model/transformer.h"
#include "program.h"
#include "spm_model.h"
#include "python_interpreter.h"

namespace thpc {
namespace {

namespace fs = std::filesystem;

// Each row of attention weights is a float32 softmax: every weight is the float rounding
// of exp(s_j - max) times the float reciprocal of the row's double sum, a relative error
// of a few 2^-24, so a row of at most S positive weights sums to 1 within a few 1e-7
// whatever S; 1e-5 leaves a wide margin and still catches a missing or doubled weight.
constexpr double kRowSumTolerance = 1e-5;

// tiny.ini with a narrower model: 2 + 2 layers of width 32, 4 heads.
Config small_config() {
  return load_config(std::string(THPC_SOURCE_DIR) + "/input/tiny.ini",
                     {"model.layers=2", "model.d_model=32", "model.d_ff=64", "model.heads=4",
                      "model.max_positions=40"});
}

// Checks the rows [Lq, Lk] of every head of `weights` [heads, Lq, Lk]: a row of a query
// below `queries` sums to 1, keys at or beyond `keys` (padding) are exactly 0, and with
// `causal` so is every key after the query.
void expect_softmax_rows(const float* weights, int heads, int Lq, int Lk, int queries,
                         int keys, bool causal, const std::string& what) {
  for (int head = 0; head < heads; ++head) {
    for (int q = 0; q < Lq; ++q) {
      const float* row = weights + (static_cast<int64_t>(head) * Lq + q) * Lk;
      double sum = 0.0;
      for (int k = 0; k < Lk; ++k) {
        sum += row[k];
        if (k >= keys || (causal && k > q)) {
          ASSERT_EQ(row[k], 0.0f) << what << " head " << head << " query " << q << " key " << k;
        } else {
          ASSERT_GE(row[k], 0.0f) << what << " head " << head << " query " << q << " key " << k;
        }
      }
      if (q < queries) {
        ASSERT_NEAR(sum, 1.0, kRowSumTolerance) << what << " head " << head << " query " << q;
      }
    }
  }
}

// ---- Transformer::attention_weights ------------------------------------------------

TEST(AttentionWeights, PaddingAndFuturePositionsAreExactlyZeroAndRowsSumToOne) {
  const ModelConfig c = small_config().model;
  auto backend = make_cpu_backend(DType::F32);
  Transformer model(c, 40, SpecialIds{}, *backend, 5);
  // Two sentences of different lengths: the shorter one's keys beyond its length are pad.
  const std::vector<TokenSequence> sources = {{5, 6, 7}, {8, 9, 10, 11, 12, 13}};
  const std::vector<TokenSequence> targets = {{14, 15, 16, 17, 18}, {19, 20}};
  const Batch batch = make_batch(sources, targets, SpecialIds{});
  model.evaluate(batch);
  const int S = batch.src_len, T = batch.tgt_len, h = c.heads;
  using Kind = Transformer::AttentionKind;
  for (int layer = 0; layer < c.layers; ++layer) {
    const std::vector<float> encoder = model.attention_weights(Kind::EncoderSelf, layer);
    const std::vector<float> decoder = model.attention_weights(Kind::DecoderSelf, layer);
    const std::vector<float> cross = model.attention_weights(Kind::Cross, layer);
    ASSERT_EQ(encoder.size(), size_t(2) * h * S * S);
    ASSERT_EQ(decoder.size(), size_t(2) * h * T * T);
    ASSERT_EQ(cross.size(), size_t(2) * h * T * S);
    for (int b = 0; b < 2; ++b) {
      const std::string where = "layer " + std::to_string(layer) + " sentence " +
                                std::to_string(b) + " ";
      const int s = batch.src_lengths[b], t = batch.tgt_lengths[b];
      expect_softmax_rows(&encoder[size_t(b) * h * S * S], h, S, S, s, s, false,
                          where + "encoder self");
      expect_softmax_rows(&decoder[size_t(b) * h * T * T], h, T, T, t, t, true,
                          where + "decoder self");
      expect_softmax_rows(&cross[size_t(b) * h * T * S], h, T, S, t, s, false, where + "cross");
    }
  }
  // The weights belong to the last forward pass: a new source leaves no decoder weights
  // to pair with it, and encode() (decoding) keeps no encoder weights either.
  model.encode(make_batch({{5, 6}}, {{}}, SpecialIds{}));
  EXPECT_THROW(model.attention_weights(Kind::EncoderSelf, 0), Error);
  EXPECT_THROW(model.attention_weights(Kind::Cross, 0), Error);
  EXPECT_THROW(model.attention_weights(Kind::EncoderSelf, c.layers), Error);
}

// ---- reading the dump back with HDF5's C API ----------------------------------------


struct FloatArray {
  std::vector<hsize_t> dims;
  std::vector<float> values;
};

std::vector<hsize_t> dims_of(hid_t dataset) {
  const hid_t space = H5Dget_space(dataset);
  std::vector<hsize_t> dims(H5Sget_simple_extent_ndims(space));
  H5Sget_simple_extent_dims(space, dims.data(), nullptr);
  H5Sclose(space);
  return dims;
}

FloatArray read_floats(const File& file, const std::string& path) {
  const hid_t dataset = H5Dopen2(file.id, path.c_str(), H5P_DEFAULT);
  EXPECT_GE(dataset, 0) << path;
  FloatArray array;
  if (dataset < 0) return array;
  array.dims = dims_of(dataset);
  size_t count = 1;
  for (hsize_t dim : array.dims) count *= dim;
  array.values.resize(count);
  EXPECT_GE(H5Dread(dataset, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, array.values.data()), 0);
  H5Dclose(dataset);
  return array;
}

std::vector<int32_t> read_ids(const File& file, const std::string& path) {
  const hid_t dataset = H5Dopen2(file.id, path.c_str(), H5P_DEFAULT);
  EXPECT_GE(dataset, 0) << path;
  if (dataset < 0) return {};
  std::vector<int32_t> ids(dims_of(dataset).at(0));
  EXPECT_GE(H5Dread(dataset, H5T_NATIVE_INT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, ids.data()), 0);
  H5Dclose(dataset);
  return ids;
}


int64_t read_integer_attribute(hid_t object, const char* name) {
  int64_t value = -1;
  const hid_t attribute = H5Aopen(object, name, H5P_DEFAULT);
  EXPECT_GE(attribute, 0) << name;
  if (attribute < 0) return value;
  H5Aread(attribute, H5T_NATIVE_INT64, &value);
  H5Aclose(attribute);
  return value;
}

std::vector<std::string> group_names(const File& file) {
  std::vector<std::string> names;
  H5Literate(
      file.id, H5_INDEX_NAME, H5_ITER_INC, nullptr,
      [](hid_t, const char* name, const H5L_info_t*, void* data) -> herr_t {
        static_cast<std::vector<std::string>*>(data)->push_back(name);
        return 0;
      },
      &names);
  return names;
}

// ---- an independent forward pass, in double, from the checkpoint's parameters -------

using Matrix = std::vector<double>;  // row-major

class Reference {
 public:
  Reference(const Checkpoint& checkpoint, const ModelConfig& c) : c_(c) {
    for (const NamedTensor& tensor : checkpoint.params) {
      params_[tensor.name] = Matrix(tensor.values.begin(), tensor.values.end());
      cols_[tensor.name] = tensor.cols;
    }
  }

  // The cross-attention weights [heads, T, S] of decoder layer `last_layer` for the
  // source ids (eos included) and decoder input ids (bos first).
  Matrix cross_attention(const TokenSequence& source, const TokenSequence& target,
                         int last_layer) const {
    Matrix memory = embed(source);
    const int S = static_cast<int>(source.size()), T = static_cast<int>(target.size());
    for (int layer = 0; layer < c_.layers; ++layer) {
      const std::string p = "encoder." + std::to_string(layer) + ".";
      memory = norm(add(memory, self_attention(memory, S, p, false)), S, p + "norm1");
      memory = norm(add(memory, ffn(memory, S, p)), S, p + "norm2");
    }
    Matrix x = embed(target);
    for (int layer = 0;; ++layer) {
      const std::string p = "decoder." + std::to_string(layer) + ".";
      x = norm(add(x, self_attention(x, T, p, true)), T, p + "norm1");
      const Matrix q = linear(x, T, p + "cross_attn.q.weight");
      const Matrix kv = linear(memory, S, p + "cross_attn.kv.weight");
      const int hk = c_.heads * c_.head_dim_k();
      const Matrix weights = probabilities(q, hk, 0, kv, hk + c_.heads * c_.head_dim_v(), 0,
                                           T, S, false);
      if (layer == last_layer) return weights;
      const Matrix context = weighted_values(weights, kv, hk + c_.heads * c_.head_dim_v(), hk, T, S);
      x = norm(add(x, linear(context, T, p + "cross_attn.out.weight")), T, p + "norm2");
      x = norm(add(x, ffn(x, T, p)), T, p + "norm3");
    }
  }

  // log softmax(h_t E^T) at every position t of the decoder input `target` (bos first),
  // [T, vocab], h the decoder's output: post-norm the top layer's last LayerNorm, pre-norm
  // decoder.norm of the residual stream (model.norm, Figure 1 with the norms moved).
  Matrix log_probs(const TokenSequence& source, const TokenSequence& target) const {
    const int S = static_cast<int>(source.size()), T = static_cast<int>(target.size());
    Matrix memory = embed(source);
    for (int layer = 0; layer < c_.layers; ++layer) {
      const std::string p = "encoder." + std::to_string(layer) + ".";
      memory = residual(memory, S, p + "norm1",
                        [&](const Matrix& x) { return self_attention(x, S, p, false); });
      memory = residual(memory, S, p + "norm2", [&](const Matrix& x) { return ffn(x, S, p); });
    }
    if (c_.norm == "pre") memory = norm(memory, S, "encoder.norm");
    Matrix x = embed(target);
    for (int layer = 0; layer < c_.layers; ++layer) {
      const std::string p = "decoder." + std::to_string(layer) + ".";
      x = residual(x, T, p + "norm1", [&](const Matrix& in) { return self_attention(in, T, p, true); });
      x = residual(x, T, p + "norm2", [&](const Matrix& in) {
        const Matrix q = linear(in, T, p + "cross_attn.q.weight");
        const Matrix kv = linear(memory, S, p + "cross_attn.kv.weight");
        const int hk = c_.heads * c_.head_dim_k(), width = hk + c_.heads * c_.head_dim_v();
        const Matrix weights = probabilities(q, hk, 0, kv, width, 0, T, S, false);
        return linear(weighted_values(weights, kv, width, hk, T, S), T, p + "cross_attn.out.weight");
      });
      x = residual(x, T, p + "norm3", [&](const Matrix& in) { return ffn(in, T, p); });
    }
    if (c_.norm == "pre") x = norm(x, T, "decoder.norm");
    const Matrix& embedding = param("embed.weight");
    const int d = c_.d_model, vocab = static_cast<int>(embedding.size() / d);
    Matrix result(size_t(T) * vocab);
    for (int t = 0; t < T; ++t) {
      double largest = -INFINITY, sum = 0.0;
      for (int v = 0; v < vocab; ++v) {
        double logit = 0.0;
        for (int i = 0; i < d; ++i) logit += x[size_t(t) * d + i] * embedding[size_t(v) * d + i];
        result[size_t(t) * vocab + v] = logit;
        largest = std::max(largest, logit);
      }
      for (int v = 0; v < vocab; ++v) sum += std::exp(result[size_t(t) * vocab + v] - largest);
      for (int v = 0; v < vocab; ++v) result[size_t(t) * vocab + v] -= largest + std::log(sum);
    }
    return result;
  }

 private:
  const Matrix& param(const std::string& name) const { return params_.at(name); }

  // A sub-layer with its residual and norm `norm_name`: post-norm (§3.1)
  // LayerNorm(x + Sublayer(x)), pre-norm x + Sublayer(LayerNorm(x)) (no dropout here).
  template <typename Sublayer>
  Matrix residual(const Matrix& x, int rows, const std::string& norm_name,
                  Sublayer sublayer) const {
    if (c_.norm == "pre") return add(x, sublayer(norm(x, rows, norm_name)));
    return norm(add(x, sublayer(x)), rows, norm_name);
  }

  // E[id] * sqrt(d) + PE(position), PE(pos, 2i) = sin(pos / 10000^(2i/d)), 2i+1: cos.
  Matrix embed(const TokenSequence& ids) const {
    const int d = c_.d_model;
    Matrix x(ids.size() * d);
    for (size_t pos = 0; pos < ids.size(); ++pos) {
      for (int col = 0; col < d; ++col) {
        const double angle = pos / std::pow(10000.0, 2.0 * (col / 2) / d);
        x[pos * d + col] = param("embed.weight")[size_t(ids[pos]) * d + col] * std::sqrt(double(d)) +
                           (col % 2 == 0 ? std::sin(angle) : std::cos(angle));
      }
    }
    return x;
  }
  // x W (+ b when `bias` names one), W [in, out].
  Matrix linear(const Matrix& x, int rows, const std::string& weight,
                const std::string& bias = "") const {
    const Matrix& w = param(weight);
    const int out = static_cast<int>(cols_.at(weight));
    const int in = static_cast<int>(w.size() / out);
    Matrix y(size_t(rows) * out, 0.0);
    for (int r = 0; r < rows; ++r) {
      for (int o = 0; o < out; ++o) {
        double sum = bias.empty() ? 0.0 : param(bias)[o];
        for (int i = 0; i < in; ++i) sum += x[size_t(r) * in + i] * w[size_t(i) * out + o];
        y[size_t(r) * out + o] = sum;
      }
    }
    return y;
  }
  static Matrix add(Matrix a, const Matrix& b) {
    for (size_t i = 0; i < a.size(); ++i) a[i] += b[i];
    return a;
  }
  Matrix norm(const Matrix& x, int rows, const std::string& name) const {
    const int d = c_.d_model;
    Matrix y(x.size());
    for (int r = 0; r < rows; ++r) {
      double mean = 0.0, var = 0.0;
      for (int i = 0; i < d; ++i) mean += x[size_t(r) * d + i] / d;
      for (int i = 0; i < d; ++i) var += std::pow(x[size_t(r) * d + i] - mean, 2) / d;
      for (int i = 0; i < d; ++i) {
        y[size_t(r) * d + i] = (x[size_t(r) * d + i] - mean) / std::sqrt(var + c_.layernorm_eps) *
                                   param(name + ".gamma")[i] +
                               param(name + ".beta")[i];
      }
    }
    return y;
  }
  Matrix ffn(const Matrix& x, int rows, const std::string& p) const {
    Matrix hidden = linear(x, rows, p + "ffn.fc1.weight", p + "ffn.fc1.bias");
    for (double& v : hidden) v = std::max(v, 0.0);
    return linear(hidden, rows, p + "ffn.fc2.weight", p + "ffn.fc2.bias");
  }
  // softmax(Q_i K_i^T / sqrt(d_k)) per head i, [heads, Lq, Lk]; Q_i is columns
  // q_offset + i d_k of q (row width q_width), likewise K_i of k.
  Matrix probabilities(const Matrix& q, int q_width, int q_offset, const Matrix& k, int k_width,
                       int k_offset, int Lq, int Lk, bool causal) const {
    const int dk = c_.head_dim_k();
    Matrix p(size_t(c_.heads) * Lq * Lk, 0.0);
    for (int head = 0; head < c_.heads; ++head) {
      for (int t = 0; t < Lq; ++t) {
        const int visible = causal ? t + 1 : Lk;
        std::vector<double> scores(visible);
        double largest = -INFINITY, sum = 0.0;
        for (int j = 0; j < visible; ++j) {
          double dot = 0.0;
          for (int c = 0; c < dk; ++c) {
            dot += q[size_t(t) * q_width + q_offset + head * dk + c] *
                   k[size_t(j) * k_width + k_offset + head * dk + c];
          }
          scores[j] = dot / std::sqrt(double(dk));
          largest = std::max(largest, scores[j]);
        }
        for (double& s : scores) sum += (s = std::exp(s - largest));
        for (int j = 0; j < visible; ++j) p[(size_t(head) * Lq + t) * Lk + j] = scores[j] / sum;
      }
    }
    return p;
  }
  // Heads concatenated: context_i = P_i V_i, V_i columns v_offset + i d_v of v.
  Matrix weighted_values(const Matrix& p, const Matrix& v, int v_width, int v_offset, int Lq,
                         int Lk) const {
    const int dv = c_.head_dim_v(), width = c_.heads * dv;
    Matrix context(size_t(Lq) * width, 0.0);
    for (int head = 0; head < c_.heads; ++head) {
      for (int t = 0; t < Lq; ++t) {
        for (int j = 0; j < Lk; ++j) {
          const double weight = p[(size_t(head) * Lq + t) * Lk + j];
          for (int c = 0; c < dv; ++c) {
            context[size_t(t) * width + head * dv + c] +=
                weight * v[size_t(j) * v_width + v_offset + head * dv + c];
          }
        }
      }
    }
    return context;
  }
  Matrix self_attention(const Matrix& x, int rows, const std::string& p, bool causal) const {
    const int hk = c_.heads * c_.head_dim_k();
    const int width = 2 * hk + c_.heads * c_.head_dim_v();
    const Matrix qkv = linear(x, rows, p + "self_attn.qkv.weight");
    const Matrix weights = probabilities(qkv, width, 0, qkv, width, hk, rows, rows, causal);
    const Matrix context = weighted_values(weights, qkv, width, 2 * hk, rows, rows);
    return linear(context, rows, p + "self_attn.out.weight");
  }

  ModelConfig c_;
  std::map<std::string, Matrix> params_;
  std::map<std::string, int64_t> cols_;
};

// The model's log-probabilities (Transformer::next_token_log_probs, every prefix of one
// target) against the Reference's, in both layer-norm orders, every layer norm's gamma
// and beta drawn away from 1 and 0 so that each (the final norms' too) shows in the
// output: the float32 forward differs from the double recomputation by rounding only
// (~1e-7 relative per op through 2 + 2 layers of width 16; measured: 1.2e-6
// post-norm, 6.3e-7 pre-norm; the bound 2e-5). The pre-norm model is checked against the post-norm recomputation of
// its parameters too (the final norms left out), which must differ, or the test could
// not tell the orders apart.
TEST(ModelForward, BothLayerNormOrdersEqualAnIndependentRecomputation) {
  for (const char* norm : {"post", "pre"}) {
    SCOPED_TRACE(std::string(norm) + "-norm");
    ModelConfig c;
    c.layers = 2;
    c.d_model = 16;
    c.d_ff = 24;
    c.heads = 4;
    c.max_positions = 16;
    c.norm = norm;
    const int vocab = 20;
    auto backend = make_cpu_backend(DType::F32);
    Transformer model(c, vocab, SpecialIds{}, *backend, 5);
    ParamStore& params = model.params();
    std::vector<float> values(size_t(params.buffer_numel()));
    backend->download(values.data(), params.params());
    std::mt19937 rng(3);
    std::uniform_real_distribution<float> spread(-0.5f, 0.5f);
    for (const ParamEntry& entry : params.entries()) {
      const auto ends_with = [&](const std::string& tail) {
        return entry.name.size() > tail.size() &&
               entry.name.compare(entry.name.size() - tail.size(), tail.size(), tail) == 0;
      };
      const bool gamma = ends_with(".gamma"), beta = ends_with(".beta");
      if (!gamma && !beta) continue;
      for (int64_t i = 0; i < entry.numel(); ++i) {
        values[size_t(entry.offset + i)] = (gamma ? 1.0f : 0.0f) + spread(rng);
      }
    }
    backend->upload(params.params(), values.data());
    params.refresh_compute();

    const TokenSequence source = {4, 9, 7, 12, 5}, target = {6, 11, 8};
    model.encode(make_batch({source}, {target}, SpecialIds{}));
    TokenSequence decoder_input = {SpecialIds{}.bos};
    decoder_input.insert(decoder_input.end(), target.begin(), target.end());
    TokenSequence source_with_eos = source;
    source_with_eos.push_back(SpecialIds{}.eos);
    Checkpoint checkpoint;
    checkpoint.params = gather_named(params, *backend, params.params());
    ModelConfig post = c;
    post.norm = "post";
    const Matrix expected = Reference(checkpoint, c).log_probs(source_with_eos, decoder_input);
    const Matrix as_post = Reference(checkpoint, post).log_probs(source_with_eos, decoder_input);
    const int T = static_cast<int>(decoder_input.size());
    double largest_error = 0.0, largest_from_post = 0.0;
    for (int t = 1; t <= T; ++t) {
      const std::vector<float> actual = model.next_token_log_probs(
          std::vector<int32_t>(decoder_input.begin(), decoder_input.end()), {t}, T);
      ASSERT_EQ(actual.size(), size_t(vocab));
      for (int v = 0; v < vocab; ++v) {
        const size_t at = size_t(t - 1) * vocab + v;
        largest_error = std::max(largest_error, std::abs(actual[v] - expected[at]));
        largest_from_post = std::max(largest_from_post, std::abs(actual[v] - as_post[at]));
      }
    }
    EXPECT_LT(largest_error, 2e-5);
    if (c.norm == "pre") {
      EXPECT_GT(largest_from_post, 1e-2);
    }
  }
}

// ---- transformer_decode --dump-attention ---------------------------------------------

class AttentionDumpProgram : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = fs::temp_directory_path() / ("thpc_attention_" + std::to_string(getpid()));
    fs::create_directories(dir_);
    // A SentencePiece model with the project's special ids, on sentences made of a
    // small word list.
    const std::vector<std::string> words = {"the", "cat", "sat", "on", "mat", "two", "dogs",
                                            "play", "in", "snow", "a", "man", "rides", "red",
                                            "bike", "big", "small", "house", "runs", "over"};
    {
      std::ofstream corpus(dir_ / "corpus.en");
      for (size_t line = 0; line < 400; ++line) {
        for (size_t k = 0; k < 6; ++k) {
          corpus << (k ? " " : "") << words[(line * 7 + k * k * 3 + line / 20) % words.size()];
        }
        corpus << "\n";
      }
    }
    const auto status =
        train_test_spm_model((dir_ / "corpus.en").string(), (dir_ / "spm").string(), 60);
    ASSERT_TRUE(status.ok()) << status.ToString();

    // A random 2-layer model of that vocabulary carrying its SentencePiece model, as the
    // trainer writes checkpoints.
    const Config config = small_config();
    config_ = config.model;
    auto backend = make_cpu_backend(DType::F32);
    Transformer model(config_, 60, SpecialIds{}, *backend, 3);
    Checkpoint checkpoint;
    checkpoint.architecture = architecture_text(config_, 60);
    checkpoint.config_ini = config.to_ini();
    checkpoint.params = gather_named(model.params(), *backend, model.params().params());
    checkpoint.spm_model = read_file(dir_ / "spm.model");
    write_checkpoint((dir_ / "model.h5").string(), checkpoint);

    std::ofstream(dir_ / "input.en") << "the cat sat on the mat\ntwo dogs play in the snow\n"
                                        "\na man rides a red bike over the house\n";
  }
  static void TearDownTestSuite() {
    if (!dir_.empty()) fs::remove_all(dir_);
  }

  // transformer_decode on the input with `options`: exit code, stdout in `out`, stderr in
  // `err`.
  static int decode(const std::string& options, std::string& out, std::string& err) {
    const fs::path out_file = dir_ / "out.txt", err_file = dir_ / "err.txt";
    const std::string command = thpc::binary_dir() + "/transformer_decode --checkpoint " +
                                (dir_ / "model.h5").string() + " --input " +
                                (dir_ / "input.en").string() + " --max-len-b 6 " + options +
                                " > " + out_file.string() + " 2> " + err_file.string();
    const int status = std::system(command.c_str());
    out = read_file(out_file);
    err = read_file(err_file);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }

  // The largest difference between the last decoder layer's cross attention that `file`
  // dumped for `line` (every head) and the Reference's recomputation from `checkpoint`'s
  // parameters and the dumped ids; infinity when the dump's size is not the model's.
  static double cross_attention_error(const File& file, const std::string& line,
                                      const fs::path& checkpoint) {
    const std::vector<int32_t> source = read_ids(file, line + "/source_ids");
    const std::vector<int32_t> target = read_ids(file, line + "/target_ids");
    const FloatArray cross = read_floats(file, line + "/cross");
    const Reference reference(read_checkpoint(checkpoint.string(), CheckpointParts::ParamsOnly),
                              config_);
    const int last = config_.layers - 1;
    const Matrix expected = reference.cross_attention(source, target, last);
    const size_t per_layer = expected.size();
    if (cross.values.size() != per_layer * config_.layers) {
      return std::numeric_limits<double>::infinity();
    }
    double largest_error = 0.0;
    for (size_t i = 0; i < per_layer; ++i) {
      largest_error = std::max(
          largest_error, std::abs(cross.values[last * per_layer + i] - expected[i]));
    }
    return largest_error;
  }

  static fs::path dir_;
  static ModelConfig config_;
};

fs::path AttentionDumpProgram::dir_;
ModelConfig AttentionDumpProgram::config_;

TEST_F(AttentionDumpProgram, ChosenLinesWithShapesRowSumsAndMasks) {
  const std::string dump = (dir_ / "shapes.h5").string();
  std::string out, err;
  ASSERT_EQ(decode("--dump-attention " + dump + " --dump-lines 4,1", out, err), 0) << err;
  const std::vector<std::string> translations = lines_of(out);
  ASSERT_EQ(translations.size(), 4u) << out;
  EXPECT_FALSE(fs::exists(dir_ / ".shapes.h5.tmp"));

  sentencepiece::SentencePieceProcessor spm;
  ASSERT_TRUE(spm.Load((dir_ / "spm.model").string()).ok());
  const std::vector<std::string> inputs = lines_of(read_file(dir_ / "input.en"));
  File file(dump);
  ASSERT_GE(file.id, 0) << dump;
  EXPECT_EQ(group_names(file), (std::vector<std::string>{"line_1", "line_4"}));
  EXPECT_EQ(read_integer_attribute(file.id, "format_version"), 1);
  EXPECT_EQ(read_integer_attribute(file.id, "layers"), config_.layers);
  EXPECT_EQ(read_integer_attribute(file.id, "heads"), config_.heads);
  const hsize_t L = config_.layers, h = config_.heads;
  for (int line : {1, 4}) {
    const std::string g = "/line_" + std::to_string(line) + "/";
    SCOPED_TRACE(g);
    const hid_t group = H5Gopen2(file.id, g.c_str(), H5P_DEFAULT);
    EXPECT_EQ(read_integer_attribute(group, "line"), line);
    H5Gclose(group);
    EXPECT_EQ(read_strings(file, g + "source_text"), std::vector<std::string>{inputs[line - 1]});
    EXPECT_EQ(read_strings(file, g + "target_text"),
              std::vector<std::string>{translations[line - 1]});
    // The source is the input's pieces and eos; the target bos and pieces that spell the
    // printed translation (compared as text: a random model's pieces need not be the
    // ones encoding its output would give).
    std::vector<std::string> source_pieces;
    spm.Encode(inputs[line - 1], &source_pieces);
    source_pieces.push_back("</s>");
    const std::vector<std::string> source_tokens = read_strings(file, g + "source_tokens");
    const std::vector<std::string> target_tokens = read_strings(file, g + "target_tokens");
    EXPECT_EQ(source_tokens, source_pieces);
    ASSERT_FALSE(target_tokens.empty());
    EXPECT_EQ(target_tokens.front(), "<s>");
    std::string spelled;
    spm.Decode(std::vector<std::string>(target_tokens.begin() + 1, target_tokens.end()), &spelled);
    EXPECT_EQ(spelled, translations[line - 1]);
    const hsize_t S = source_tokens.size(), T = target_tokens.size();
    ASSERT_EQ(read_ids(file, g + "source_ids").size(), S);
    ASSERT_EQ(read_ids(file, g + "target_ids").size(), T);
    EXPECT_EQ(read_ids(file, g + "target_ids").front(), 2);  // bos
    const FloatArray encoder = read_floats(file, g + "encoder_self");
    const FloatArray decoder = read_floats(file, g + "decoder_self");
    const FloatArray cross = read_floats(file, g + "cross");
    ASSERT_EQ(encoder.dims, (std::vector<hsize_t>{L, h, S, S}));
    ASSERT_EQ(decoder.dims, (std::vector<hsize_t>{L, h, T, T}));
    ASSERT_EQ(cross.dims, (std::vector<hsize_t>{L, h, T, S}));
    for (hsize_t layer = 0; layer < L; ++layer) {
      const std::string where = "layer " + std::to_string(layer) + " ";
      expect_softmax_rows(&encoder.values[layer * h * S * S], h, S, S, S, S, false,
                          where + "encoder self");
      expect_softmax_rows(&decoder.values[layer * h * T * T], h, T, T, T, T, true,
                          where + "decoder self");
      expect_softmax_rows(&cross.values[layer * h * T * S], h, T, S, T, S, false,
                          where + "cross");
    }
  }
}

// A model whose SentencePiece model lacks pad (spm_train's defaults: unk 0, bos 1, eos 2,
// pad 60 after its 60 pieces) or lacks eos too (eos 61): the dump's passes start from the
// model's own bos and end the source with its own eos, named "<s>" and "</s>" where they
// are ids after the pieces, and the weights are those an independent recomputation gives
// for those ids (a mutation audit: 0/1/2/3 or SentencePiece's names of the ids passed).
TEST_F(AttentionDumpProgram, AModelWithoutPadOrEosDumpsWithItsOwnIds) {
  struct Layout {
    std::string name, flags;
    int vocab;
    SpecialIds ids;
  };
  for (const Layout& layout : {Layout{"no_pad", "", 61, SpecialIds{60, 0, 1, 2}},
                               Layout{"no_eos", "--eos_id=-1", 62, SpecialIds{60, 0, 1, 61}}}) {
    SCOPED_TRACE(layout.name);
    const fs::path prefix = dir_ / ("spm_" + layout.name);
    const auto status = train_test_spm_model((dir_ / "corpus.en").string(), prefix.string(),
                                             60, layout.flags);
    ASSERT_TRUE(status.ok()) << status.ToString();
    auto backend = make_cpu_backend(DType::F32);
    const Transformer model(config_, layout.vocab, layout.ids, *backend, 3);
    Checkpoint checkpoint;
    checkpoint.architecture = architecture_text(config_, layout.vocab);
    checkpoint.config_ini = small_config().to_ini();
    checkpoint.params = gather_named(model.params(), *backend, model.params().params());
    checkpoint.spm_model = read_file(prefix.string() + ".model");
    const fs::path path = dir_ / ("model_" + layout.name + ".h5");
    write_checkpoint(path.string(), checkpoint);
    const std::string dump = (dir_ / ("dump_" + layout.name + ".h5")).string();
    const std::string command = thpc::binary_dir() + "/transformer_decode --checkpoint " +
                                path.string() + " --input " + (dir_ / "input.en").string() +
                                " --max-len-b 6 --dump-attention " + dump +
                                " --dump-lines 1 > /dev/null 2> " +
                                (dir_ / "err.txt").string();
    ASSERT_EQ(std::system(command.c_str()), 0) << read_file(dir_ / "err.txt");

    sentencepiece::SentencePieceProcessor spm;
    ASSERT_TRUE(spm.Load(prefix.string() + ".model").ok());
    std::vector<std::string> source_pieces;
    spm.Encode(lines_of(read_file(dir_ / "input.en")).front(), &source_pieces);
    source_pieces.push_back("</s>");
    File file(dump);
    ASSERT_GE(file.id, 0) << dump;
    EXPECT_EQ(read_strings(file, "/line_1/source_tokens"), source_pieces);
    const std::vector<int32_t> source = read_ids(file, "/line_1/source_ids");
    const std::vector<int32_t> target = read_ids(file, "/line_1/target_ids");
    ASSERT_FALSE(source.empty());
    ASSERT_FALSE(target.empty());
    EXPECT_EQ(source.back(), layout.ids.eos);
    EXPECT_EQ(target.front(), layout.ids.bos);
    EXPECT_EQ(read_strings(file, "/line_1/target_tokens").front(), "<s>");
    // The bound of CrossAttentionEqualsAnIndependentRecomputation.
    EXPECT_LT(cross_attention_error(file, "/line_1", path), 1e-5);
  }
}

// The dumped cross-attention of the last decoder layer, every head, against softmax(Q_i
// K_i^T / sqrt(d_k)) computed in double by the Reference above from the checkpoint's
// parameters and the dumped ids: the float32 forward differs from it by rounding only
// (each op's ~1e-7 relative error, through four layers of width 32; measured: 2.2e-7).
TEST_F(AttentionDumpProgram, CrossAttentionEqualsAnIndependentRecomputation) {
  const std::string dump = (dir_ / "cross.h5").string();
  std::string out, err;
  ASSERT_EQ(decode("--dump-attention " + dump + " --dump-lines 2", out, err), 0) << err;
  File file(dump);
  ASSERT_GE(file.id, 0) << dump;
  EXPECT_LT(cross_attention_error(file, "/line_2", dir_ / "model.h5"), 1e-5);
}

TEST_F(AttentionDumpProgram, TranslationsAreTheSameWithAndWithoutTheDump) {
  for (const char* threads : {"1", "2"}) {
    std::string plain, dumped, err;
    ASSERT_EQ(decode(std::string("--threads ") + threads, plain, err), 0) << err;
    ASSERT_EQ(decode(std::string("--threads ") + threads + " --dump-attention " +
                         (dir_ / "same.h5").string() + " --dump-lines 1,2,4",
                     dumped, err),
              0)
        << err;
    EXPECT_EQ(dumped, plain) << "--threads " << threads;
    ASSERT_EQ(decode(std::string("--threads ") + threads + " --nbest 2 --dump-attention " +
                         (dir_ / "same.h5").string() + " --dump-lines 4",
                     dumped, err),
              0)
        << err;
    ASSERT_EQ(decode(std::string("--threads ") + threads + " --nbest 2", plain, err), 0) << err;
    EXPECT_EQ(dumped, plain) << "--nbest 2 --threads " << threads;
  }
}

TEST_F(AttentionDumpProgram, BadDumpLinesAreRefused) {
  const std::string dump = (dir_ / "bad.h5").string();
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"--dump-attention " + dump + " --dump-lines x", "'x' is not a line number"},
      {"--dump-attention " + dump + " --dump-lines 0", "'0' is not a line number"},
      {"--dump-attention " + dump + " --dump-lines 1,,2", "'' is not a line number"},
      {"--dump-attention " + dump + " --dump-lines 1,-2", "'-2' is not a line number"},
      {"--dump-attention " + dump + " --dump-lines 2,", "expected 1-based line numbers"},
      {"--dump-attention " + dump + " --dump-lines 1,5",
       "--dump-lines: line 5 is beyond the 4 lines of " + (dir_ / "input.en").string()},
      {"--dump-attention " + dump + " --dump-lines 3",
       "--dump-lines: line 3 of " + (dir_ / "input.en").string() + " is empty"},
      {"--dump-lines 1", "--dump-attention FILE and --dump-lines N,... go together"},
      {"--dump-attention " + dump, "--dump-attention FILE and --dump-lines N,... go together"},
  };
  for (const auto& [options, message] : cases) {
    std::string out, err;
    EXPECT_EQ(decode(options, out, err), 2) << options << "\n" << err;
    EXPECT_NE(err.find(message), std::string::npos) << options << "\n" << err;
    EXPECT_EQ(lines_of(err).size(), 1u) << options << "\n" << err;
    EXPECT_EQ(out, "") << options;
    EXPECT_FALSE(fs::exists(dump)) << options;
  }
}

// Width and height of a PNG, from its IHDR chunk (big-endian at bytes 16 and 20); 0, 0
// when the signature is not PNG's.
std::pair<uint32_t, uint32_t> png_size(const std::string& bytes) {
  if (bytes.size() < 24 || bytes.compare(0, 8, "\x89PNG\r\n\x1a\n") != 0) return {0, 0};
  auto big_endian = [&](size_t at) {
    uint32_t value = 0;
    for (size_t i = 0; i < 4; ++i) value = value << 8 | static_cast<unsigned char>(bytes[at + i]);
    return value;
  };
  return {big_endian(16), big_endian(20)};
}

TEST_F(AttentionDumpProgram, PlotScriptDrawsEveryViewAsNonEmptyPngs) {
  const Interpreter interpreter = python_interpreter();
  const ProcessResult modules =
      run_process(interpreter.path + " -c 'import matplotlib, h5py, numpy'");
  if (modules.exit_code != 0) {
    GTEST_SKIP() << interpreter.path << " cannot import matplotlib, h5py and numpy "
                 << "(bash tools/install_deps.sh installs them into ~/.cache/thpc-venv, or "
                    "set THPC_PYTHON): "
                 << modules.output;
  }
  const std::string dump = (dir_ / "plot.h5").string();
  std::string out, err;
  ASSERT_EQ(decode("--dump-attention " + dump + " --dump-lines 1,4", out, err), 0) << err;
  const fs::path pictures = dir_ / "pictures";
  const std::string script = interpreter.path + " " + THPC_SOURCE_DIR + "/tools/plot_attention.py ";
  const ProcessResult plotted =
      run_process(script + dump + " --line 4 --layer 2 --word 1 --out " + pictures.string());
  ASSERT_EQ(plotted.exit_code, 0) << plotted.output;
  // One file per view, each the size the script reports.
  const std::vector<std::string> reported = lines_of(plotted.output);
  ASSERT_EQ(reported.size(), 4u) << plotted.output;
  for (const char* view : {"encoder_self", "decoder_self", "cross", "word_1"}) {
    const fs::path png = pictures / (std::string("line_4_layer_2_") + view + ".png");
    const auto [width, height] = png_size(read_file(png));
    EXPECT_GT(width, 100u) << png;
    EXPECT_GT(height, 100u) << png;
    const std::string line = "wrote " + png.string() + " (" + std::to_string(width) + "x" +
                             std::to_string(height) + " px)";
    EXPECT_NE(plotted.output.find(line), std::string::npos) << line << "\n" << plotted.output;
  }
  // Without a choice: every line, every layer, 4 views each.
  const ProcessResult all = run_process(script + dump + " --out " + (dir_ / "all").string());
  ASSERT_EQ(all.exit_code, 0) << all.output;
  EXPECT_EQ(lines_of(all.output).size(), 2u * config_.layers * 4u) << all.output;
  // A line the file lacks, a layer the model lacks: exit code 2, one line.
  for (const std::string& bad : {std::string(" --line 2"), std::string(" --layer 3")}) {
    const ProcessResult refused = run_process(script + dump + bad + " --out " + pictures.string());
    EXPECT_EQ(refused.exit_code, 2) << bad << "\n" << refused.output;
    EXPECT_EQ(lines_of(refused.output).size(), 1u) << refused.output;
  }
}

}  // namespace
}  // namespace thpc
