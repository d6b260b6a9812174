#include "model/transformer.h"

#include <cmath>

#include "common/error.h"
#include "kernels/cpu/cpu_ops.h"

namespace thpc {
namespace {

// Dropout sites: each place the model draws a mask has its own Philox site,
// part << 16 | layer << 4 | slot, so no two sites share a mask.
enum class SitePart : uint32_t { Embedding = 0, Encoder = 1, Decoder = 2 };
enum class SiteSlot : uint32_t {
  SelfAttentionResidual = 0,
  SelfAttentionProbs = 1,
  CrossAttentionResidual = 2,
  CrossAttentionProbs = 3,
  FfnResidual = 4,
  SourceEmbedding = 5,
  TargetEmbedding = 6,
};

DropoutKey dropout_key(const DropoutContext& ctx, SitePart part, int layer, SiteSlot slot) {
  DropoutKey key;
  key.seed = ctx.seed;
  key.step = ctx.step;
  key.stream = ctx.stream;
  key.site = (static_cast<uint32_t>(part) << 16) | (static_cast<uint32_t>(layer) << 4) |
             static_cast<uint32_t>(slot);
  return key;
}

std::string layer_prefix(const char* stack, int layer) {
  return std::string(stack) + "." + std::to_string(layer) + ".";
}

// A parameter together with its gradient; both empty for an absent optional bias.
// value is the weight as the ops read it (ParamStore::compute: the bf16 copy on a bf16
// GPU backend, the fp32/fp64 master otherwise); grad is always in param_dtype, so
// weight gradients accumulate in fp32 even when the activations are bf16.
struct Param {
  Tensor value, grad;
};

struct AttentionParams {
  Param in_weight, in_bias;  // self: fused Q|K|V [d, h(2dk+dv)]; cross: Q [d, h dk]
  Param kv_weight, kv_bias;  // cross only: fused K|V [d, h(dk+dv)] applied to the encoder
  Param out_weight, out_bias;  // W^O [h dv, d]
};
struct NormParams {
  Param gamma, beta;
};
struct FfnParams {
  Param w1, b1, w2, b2;
};
struct LayerParams {
  AttentionParams self_attention, cross_attention;
  NormParams norm1, norm2, norm3;  // after self-attention, cross-attention (decoder), FFN
  FfnParams ffn;
};

// Forward activations of one sublayer kind; what backward reads.
struct AttentionActs {
  Tensor in;     // self: q|k|v [R, h(2dk+dv)]; cross: q [R, h dk]
  Tensor kv;     // cross only: k|v of the encoder output [Rs, h(dk+dv)]
  Tensor saved;  // what the attention op keeps for backward
  Tensor context;  // heads concatenated [R, h dv]
  Tensor out;      // context W^O [R, d]
};
struct AddNormActs {
  Tensor residual;  // x + Dropout(sublayer) [R, d]
  Tensor mean, rstd;  // [R]
  Tensor y;         // LayerNorm(residual) [R, d]
};
struct FfnActs {
  Tensor hidden;  // max(0, x W1 + b1) [R, d_ff]
  Tensor out;     // hidden W2 + b2 [R, d]
};
struct LayerActs {
  Tensor x;  // the layer's input
  AttentionActs self_attention, cross_attention;
  AddNormActs norm1, norm2, norm3;
  FfnActs ffn;
  Tensor output() const { return norm3.y ? norm3.y : norm2.y; }
};

// Device copies of a batch's ids, grown as batches grow.
struct IdBuffer {
  int32_t* ids = nullptr;
  int64_t capacity = 0;
};

}  // namespace

struct Transformer::State {
  explicit State(Backend& backend)
      : encoder_arena(backend), decoder_arena(backend), grad_arena(backend),
        scratch_arena(backend), step_arena(backend) {}

  // Parameters.
  Param embedding;        // E [vocab, d], shared (§3.4)
  Param positions;        // learned [max_positions, d], or empty
  Tensor sinusoid;        // §3.5 table [max_positions, d] when sinusoidal
  std::vector<LayerParams> encoder, decoder;

  // The current batch on the backend.
  IdBuffer src, tgt_in, tgt_out, src_lengths, tgt_lengths;
  int batch_size = 0, src_len = 0, tgt_len = 0;

  // Activations.
  Arena encoder_arena, decoder_arena, grad_arena, scratch_arena;
  Tensor src_embedded, tgt_embedded;  // before the embedding dropout
  std::vector<LayerActs> encoder_acts, decoder_acts;
  Tensor encoder_out, decoder_out, logits;
  Tensor d_encoder_out;  // filled by backward_decoder, read by backward_encoder
  std::vector<int32_t> src_lengths_host;

  // Incremental decoding: per decoder layer, the fused q|k|v rows of every past position
  // of every hypothesis [H * max_len, h(2dk+dv)] (the k|v columns are what attention
  // reads) and the encoder's k|v rows expanded per hypothesis [H * S, h(dk+dv)].
  struct Incremental {
    int hypotheses = 0, capacity = 0, max_len = 0;
    int filled = 0;  // cache positions written so far (0..filled-1)
    // Per layer: the live caches, and spares of the same size that a reorder gathers
    // into before the two swap, so no decode step allocates or zeroes a cache.
    std::vector<Tensor> self_cache, cross_kv, self_spare, cross_spare;
    std::vector<int32_t> cross_lengths_host;
    std::vector<int> source_of;  // the source sentence each hypothesis row reads
    IdBuffer self_lengths, cross_lengths, rows, from_rows;
  } incremental;
  Arena step_arena;  // one incremental step's activations
};

// ---------------------------------------------------------------------------------
// Parameter table

void add_transformer_parameters(const ModelConfig& c, int vocab, ParamStore& store) {
  const int64_t d = c.d_model, dk = c.head_dim_k(), dv = c.head_dim_v(), h = c.heads;
  THPC_CHECK(vocab > 0, "the vocabulary size is " << vocab);
  store.add("embed.weight", vocab, d, ParamInit::EmbeddingNormal);
  if (c.positions == "learned") {
    store.add("embed.positions", c.max_positions, d, ParamInit::EmbeddingNormal);
  }
  auto add_norm = [&](const std::string& name) {
    store.add(name + ".gamma", 1, d, ParamInit::Ones);
    store.add(name + ".beta", 1, d, ParamInit::Zeros);
  };
  auto add_projection = [&](const std::string& name, int64_t in, int64_t out,
                            int64_t block_width) {
    store.add(name + ".weight", in, out, ParamInit::XavierUniform, in, block_width);
    if (c.attention_bias) store.add(name + ".bias", 1, out, ParamInit::Zeros);
  };
  auto add_ffn = [&](const std::string& name) {
    store.add(name + ".fc1.weight", d, c.d_ff, ParamInit::XavierUniform);
    store.add(name + ".fc1.bias", 1, c.d_ff, ParamInit::Zeros);
    store.add(name + ".fc2.weight", c.d_ff, d, ParamInit::XavierUniform);
    store.add(name + ".fc2.bias", 1, d, ParamInit::Zeros);
  };
  for (int layer = 0; layer < c.layers; ++layer) {
    const std::string p = layer_prefix("encoder", layer);
    // Xavier for a fused projection uses the fan of one head block group (d -> h dk).
    add_projection(p + "self_attn.qkv", d, h * (2 * dk + dv), h * dk);
    add_projection(p + "self_attn.out", h * dv, d, d);
    add_norm(p + "norm1");
    add_ffn(p + "ffn");
    add_norm(p + "norm2");
  }
  for (int layer = 0; layer < c.layers; ++layer) {
    const std::string p = layer_prefix("decoder", layer);
    add_projection(p + "self_attn.qkv", d, h * (2 * dk + dv), h * dk);
    add_projection(p + "self_attn.out", h * dv, d, d);
    add_norm(p + "norm1");
    add_projection(p + "cross_attn.q", d, h * dk, h * dk);
    add_projection(p + "cross_attn.kv", d, h * (dk + dv), h * dk);
    add_projection(p + "cross_attn.out", h * dv, d, d);
    add_norm(p + "norm2");
    add_ffn(p + "ffn");
    add_norm(p + "norm3");
  }
}

namespace {

Param lookup(const ParamStore& store, const std::string& name) {
  if (!store.has(name)) return Param{};
  return Param{store.compute(name), store.grad(name)};
}

LayerParams lookup_layer(const ParamStore& store, const std::string& p, bool decoder) {
  LayerParams lp;
  lp.self_attention.in_weight = lookup(store, p + "self_attn.qkv.weight");
  lp.self_attention.in_bias = lookup(store, p + "self_attn.qkv.bias");
  lp.self_attention.out_weight = lookup(store, p + "self_attn.out.weight");
  lp.self_attention.out_bias = lookup(store, p + "self_attn.out.bias");
  lp.norm1 = {lookup(store, p + "norm1.gamma"), lookup(store, p + "norm1.beta")};
  lp.norm2 = {lookup(store, p + "norm2.gamma"), lookup(store, p + "norm2.beta")};
  lp.ffn = {lookup(store, p + "ffn.fc1.weight"), lookup(store, p + "ffn.fc1.bias"),
            lookup(store, p + "ffn.fc2.weight"), lookup(store, p + "ffn.fc2.bias")};
  if (decoder) {
    lp.cross_attention.in_weight = lookup(store, p + "cross_attn.q.weight");
    lp.cross_attention.in_bias = lookup(store, p + "cross_attn.q.bias");
    lp.cross_attention.kv_weight = lookup(store, p + "cross_attn.kv.weight");
    lp.cross_attention.kv_bias = lookup(store, p + "cross_attn.kv.bias");
    lp.cross_attention.out_weight = lookup(store, p + "cross_attn.out.weight");
    lp.cross_attention.out_bias = lookup(store, p + "cross_attn.out.bias");
    lp.norm3 = {lookup(store, p + "norm3.gamma"), lookup(store, p + "norm3.beta")};
  }
  return lp;
}

void ensure_ids(Backend& backend, IdBuffer& buffer, const std::vector<int32_t>& host) {
  const int64_t count = static_cast<int64_t>(host.size());
  if (count > buffer.capacity) {
    backend.free_ids(buffer.ids);
    buffer.capacity = std::max<int64_t>(count, 2 * buffer.capacity);
    buffer.ids = backend.alloc_ids(buffer.capacity);
  }
  backend.upload_ids(buffer.ids, host.data(), count);
}

// The sublayer computations, forward and backward side by side. `ops` is the backend;
// every size argument is spelled out because the op interface takes explicit shapes.
struct Sublayers {
  Backend& ops;
  const ModelConfig& c;
  DType act;    // activation dtype
  DType stat;   // per-row statistics dtype
  int d, dk, dv, h;

  // ---- x = LayerNorm(x + Dropout(sub)) ----
  void add_norm_forward(AddNormActs& a, Arena& arena, Tensor x, Tensor sub,
                        const NormParams& p, int rows, float p_drop, DropoutKey key) {
    a.residual = arena.take(act, int64_t(rows) * d);
    a.mean = arena.take(stat, rows);
    a.rstd = arena.take(stat, rows);
    a.y = arena.take(act, int64_t(rows) * d);
    ops.residual_dropout_forward(a.residual, x, sub, int64_t(rows) * d, p_drop, key);
    ops.layernorm_forward(a.y, a.mean, a.rstd, a.residual, p.gamma.value, p.beta.value, rows,
                          d, c.layernorm_eps);
  }
  void add_norm_backward(Tensor d_x, Tensor d_sub, Tensor d_y, const AddNormActs& a,
                         const NormParams& p, Arena& scratch, int rows, float p_drop,
                         DropoutKey key) {
    Tensor d_residual = scratch.take_zeroed(act, int64_t(rows) * d);
    ops.layernorm_backward(d_residual, p.gamma.grad, p.beta.grad, d_y, a.residual, a.mean,
                           a.rstd, p.gamma.value, rows, d);
    ops.residual_dropout_backward(d_x, d_sub, d_residual, int64_t(rows) * d, p_drop, key);
  }

  // ---- self-attention: fused Q|K|V projection, attention, W^O ----
  int qkv_width() const { return h * (2 * dk + dv); }
  void self_attention_forward(AttentionActs& a, Arena& arena, Tensor x,
                              const AttentionParams& p, const AttentionShape& shape) {
    const int rows = shape.batch * shape.query_len;
    const int width = qkv_width();
    a.in = arena.take(act, int64_t(rows) * width);
    a.saved = arena.take(act, ops.attention_saved_numel(shape));
    a.context = arena.take(act, int64_t(rows) * h * dv);
    a.out = arena.take(act, int64_t(rows) * d);
    ops.linear_forward(a.in, x, p.in_weight.value, p.in_bias.value, rows, d, width);
    ops.attention_forward(a.context, a.saved, a.in, width, a.in.slice(h * dk, a.in.numel - h * dk),
                          width, a.in.slice(2 * h * dk, a.in.numel - 2 * h * dk), width, shape);
    ops.linear_forward(a.out, a.context, p.out_weight.value, p.out_bias.value, rows, h * dv, d);
  }
  void self_attention_backward(Tensor d_x, Tensor d_out, const AttentionActs& a, Tensor x,
                               const AttentionParams& p, const AttentionShape& shape,
                               Arena& scratch) {
    const int rows = shape.batch * shape.query_len;
    const int width = qkv_width();
    Tensor d_context = scratch.take_zeroed(act, int64_t(rows) * h * dv);
    ops.linear_backward(d_context, p.out_weight.grad, p.out_bias.grad, d_out, a.context,
                        p.out_weight.value, rows, h * dv, d);
    Tensor d_in = scratch.take_zeroed(act, int64_t(rows) * width);
    const int64_t k_off = h * dk, v_off = 2 * h * dk;
    ops.attention_backward(d_in, d_in.slice(k_off, d_in.numel - k_off),
                           d_in.slice(v_off, d_in.numel - v_off), d_context, a.saved, a.in,
                           width, a.in.slice(k_off, a.in.numel - k_off), width,
                           a.in.slice(v_off, a.in.numel - v_off), width, shape);
    ops.linear_backward(d_x, p.in_weight.grad, p.in_bias.grad, d_in, x, p.in_weight.value,
                        rows, d, width);
  }

  // ---- encoder-decoder attention: Q from the decoder, K|V from the encoder output ----
  void cross_attention_forward(AttentionActs& a, Arena& arena, Tensor x, Tensor memory,
                               const AttentionParams& p, const AttentionShape& shape) {
    const int rows = shape.batch * shape.query_len;
    const int memory_rows = shape.batch * shape.key_len;
    const int kv_width = h * (dk + dv);
    a.in = arena.take(act, int64_t(rows) * h * dk);
    a.kv = arena.take(act, int64_t(memory_rows) * kv_width);
    a.saved = arena.take(act, ops.attention_saved_numel(shape));
    a.context = arena.take(act, int64_t(rows) * h * dv);
    a.out = arena.take(act, int64_t(rows) * d);
    ops.linear_forward(a.in, x, p.in_weight.value, p.in_bias.value, rows, d, h * dk);
    ops.linear_forward(a.kv, memory, p.kv_weight.value, p.kv_bias.value, memory_rows, d,
                       kv_width);
    ops.attention_forward(a.context, a.saved, a.in, h * dk, a.kv, kv_width,
                          a.kv.slice(h * dk, a.kv.numel - h * dk), kv_width, shape);
    ops.linear_forward(a.out, a.context, p.out_weight.value, p.out_bias.value, rows, h * dv, d);
  }
  void cross_attention_backward(Tensor d_x, Tensor d_memory, Tensor d_out,
                                const AttentionActs& a, Tensor x, Tensor memory,
                                const AttentionParams& p, const AttentionShape& shape,
                                Arena& scratch) {
    const int rows = shape.batch * shape.query_len;
    const int memory_rows = shape.batch * shape.key_len;
    const int kv_width = h * (dk + dv);
    Tensor d_context = scratch.take_zeroed(act, int64_t(rows) * h * dv);
    ops.linear_backward(d_context, p.out_weight.grad, p.out_bias.grad, d_out, a.context,
                        p.out_weight.value, rows, h * dv, d);
    Tensor d_q = scratch.take_zeroed(act, int64_t(rows) * h * dk);
    Tensor d_kv = scratch.take_zeroed(act, int64_t(memory_rows) * kv_width);
    const int64_t v_off = h * dk;
    ops.attention_backward(d_q, d_kv, d_kv.slice(v_off, d_kv.numel - v_off), d_context,
                           a.saved, a.in, h * dk, a.kv, kv_width,
                           a.kv.slice(v_off, a.kv.numel - v_off), kv_width, shape);
    ops.linear_backward(d_x, p.in_weight.grad, p.in_bias.grad, d_q, x, p.in_weight.value, rows,
                        d, h * dk);
    ops.linear_backward(d_memory, p.kv_weight.grad, p.kv_bias.grad, d_kv, memory,
                        p.kv_weight.value, memory_rows, d, kv_width);
  }

  // ---- FFN(x) = max(0, x W1 + b1) W2 + b2 (§3.3) ----
  void ffn_forward(FfnActs& a, Arena& arena, Tensor x, const FfnParams& p, int rows) {
    a.hidden = arena.take(act, int64_t(rows) * c.d_ff);
    a.out = arena.take(act, int64_t(rows) * d);
    ops.linear_forward(a.hidden, x, p.w1.value, p.b1.value, rows, d, c.d_ff);
    ops.relu_forward(a.hidden, a.hidden, int64_t(rows) * c.d_ff);  // in place
    ops.linear_forward(a.out, a.hidden, p.w2.value, p.b2.value, rows, c.d_ff, d);
  }
  void ffn_backward(Tensor d_x, Tensor d_out, const FfnActs& a, Tensor x, const FfnParams& p,
                    int rows, Arena& scratch) {
    Tensor d_hidden = scratch.take_zeroed(act, int64_t(rows) * c.d_ff);
    ops.linear_backward(d_hidden, p.w2.grad, p.b2.grad, d_out, a.hidden, p.w2.value, rows,
                        c.d_ff, d);
    Tensor d_pre = scratch.take_zeroed(act, int64_t(rows) * c.d_ff);
    ops.relu_backward(d_pre, d_hidden, a.hidden, int64_t(rows) * c.d_ff);
    ops.linear_backward(d_x, p.w1.grad, p.b1.grad, d_pre, x, p.w1.value, rows, d, c.d_ff);
  }
};

}  // namespace

// ---------------------------------------------------------------------------------

Transformer::Transformer(const ModelConfig& config, int vocab_size, const SpecialIds& ids,
                         Backend& backend, std::optional<uint64_t> init_seed)
    : config_(config), vocab_(vocab_size), ids_(ids), backend_(backend),
      state_(std::make_unique<State>(backend)) {
  add_transformer_parameters(config_, vocab_, params_);
  params_.allocate(backend_);
  if (init_seed) params_.initialize(*init_seed);

  State& s = *state_;
  s.embedding = lookup(params_, "embed.weight");
  s.positions = lookup(params_, "embed.positions");
  if (!s.positions.value) {
    // The fixed sinusoidal table, computed on the host in double and uploaded once.
    std::vector<double> table(static_cast<size_t>(config_.max_positions) * config_.d_model);
    cpu::sinusoidal_positions<double>(table.data(), config_.max_positions, config_.d_model);
    s.sinusoid = backend_.alloc(backend_.compute_dtype(), static_cast<int64_t>(table.size()));
    Tensor staging = backend_.alloc(backend_.param_dtype(), static_cast<int64_t>(table.size()));
    if (backend_.param_dtype() == DType::F64) {
      backend_.upload(staging, table.data());
    } else {
      std::vector<float> single(table.begin(), table.end());
      backend_.upload(staging, single.data());
    }
    backend_.copy(s.sinusoid, staging);
    backend_.free(staging);
  }
  for (int layer = 0; layer < config_.layers; ++layer) {
    s.encoder.push_back(lookup_layer(params_, layer_prefix("encoder", layer), false));
    s.decoder.push_back(lookup_layer(params_, layer_prefix("decoder", layer), true));
  }
}

Transformer::~Transformer() {
  release_incremental();
  State& s = *state_;
  for (IdBuffer* b : {&s.src, &s.tgt_in, &s.tgt_out, &s.src_lengths, &s.tgt_lengths,
                      &s.incremental.self_lengths, &s.incremental.cross_lengths,
                      &s.incremental.rows, &s.incremental.from_rows}) {
    backend_.free_ids(b->ids);
  }
  if (s.sinusoid) backend_.free(s.sinusoid);
}

void Transformer::upload_batch(const Batch& batch) {
  State& s = *state_;
  THPC_CHECK(batch.src_len <= config_.max_positions && batch.tgt_len <= config_.max_positions,
             "a batch of source length " << batch.src_len << " and target length "
             << batch.tgt_len << " exceeds model.max_positions = " << config_.max_positions);
  s.batch_size = batch.size;
  s.src_len = batch.src_len;
  s.tgt_len = batch.tgt_len;
  ensure_ids(backend_, s.src, batch.src);
  ensure_ids(backend_, s.src_lengths, batch.src_lengths);
  s.src_lengths_host = batch.src_lengths;
  if (!batch.tgt_in.empty()) {
    ensure_ids(backend_, s.tgt_in, batch.tgt_in);
    ensure_ids(backend_, s.tgt_out, batch.tgt_out);
    ensure_ids(backend_, s.tgt_lengths, batch.tgt_lengths);
  }
}

namespace {

Sublayers sublayers_for(Backend& backend, const ModelConfig& c) {
  return Sublayers{backend, c, backend.compute_dtype(), backend.param_dtype(),
                   c.d_model, c.head_dim_k(), c.head_dim_v(), c.heads};
}

AttentionShape attention_shape(const ModelConfig& c, int batch, int query_len, int key_len,
                               bool causal, const int32_t* key_lengths, float dropout,
                               DropoutKey key) {
  AttentionShape shape;
  shape.batch = batch;
  shape.heads = c.heads;
  shape.query_len = query_len;
  shape.key_len = key_len;
  shape.d_k = c.head_dim_k();
  shape.d_v = c.head_dim_v();
  shape.causal = causal;
  shape.key_lengths = key_lengths;
  shape.dropout = dropout;
  shape.dropout_key = key;
  return shape;
}

}  // namespace

// x_0 = Dropout(E[tokens] * sqrt(d) + PE), then N encoder layers.
void Transformer::forward_encoder(bool train, const DropoutContext& ctx) {
  State& s = *state_;
  Sublayers sub = sublayers_for(backend_, config_);
  const int rows = s.batch_size * s.src_len;
  const int d = config_.d_model;
  const float p_drop = train ? config_.dropout : 0.0f;
  const float p_attn = train ? config_.attention_dropout : 0.0f;
  Arena& arena = s.encoder_arena;
  arena.reset();

  Tensor positions = s.positions.value ? s.positions.value : s.sinusoid;
  s.src_embedded = arena.take(sub.act, int64_t(rows) * d);
  backend_.embedding_forward(s.src_embedded, s.src.ids, s.embedding.value, positions, rows,
                             s.src_len, d, vocab_, std::sqrt(static_cast<float>(d)));
  Tensor x = arena.take(sub.act, int64_t(rows) * d);
  backend_.dropout_forward(x, s.src_embedded, int64_t(rows) * d, p_drop,
                           dropout_key(ctx, SitePart::Embedding, 0, SiteSlot::SourceEmbedding));

  s.encoder_acts.assign(config_.layers, LayerActs{});
  for (int layer = 0; layer < config_.layers; ++layer) {
    const LayerParams& p = s.encoder[layer];
    LayerActs& a = s.encoder_acts[layer];
    a.x = x;
    const AttentionShape shape = attention_shape(
        config_, s.batch_size, s.src_len, s.src_len, false, s.src_lengths.ids, p_attn,
        dropout_key(ctx, SitePart::Encoder, layer, SiteSlot::SelfAttentionProbs));
    sub.self_attention_forward(a.self_attention, arena, a.x, p.self_attention, shape);
    sub.add_norm_forward(a.norm1, arena, a.x, a.self_attention.out, p.norm1, rows, p_drop,
                         dropout_key(ctx, SitePart::Encoder, layer,
                                     SiteSlot::SelfAttentionResidual));
    sub.ffn_forward(a.ffn, arena, a.norm1.y, p.ffn, rows);
    sub.add_norm_forward(a.norm2, arena, a.norm1.y, a.ffn.out, p.norm2, rows, p_drop,
                         dropout_key(ctx, SitePart::Encoder, layer, SiteSlot::FfnResidual));
    x = a.output();
  }
  s.encoder_out = x;
}

void Transformer::forward_decoder(int batch_size, int T, bool train, const DropoutContext& ctx) {
  State& s = *state_;
  Sublayers sub = sublayers_for(backend_, config_);
  const int rows = batch_size * T;
  const int d = config_.d_model;
  const float p_drop = train ? config_.dropout : 0.0f;
  const float p_attn = train ? config_.attention_dropout : 0.0f;
  Arena& arena = s.decoder_arena;
  arena.reset();

  Tensor positions = s.positions.value ? s.positions.value : s.sinusoid;
  s.tgt_embedded = arena.take(sub.act, int64_t(rows) * d);
  backend_.embedding_forward(s.tgt_embedded, s.tgt_in.ids, s.embedding.value, positions, rows,
                             T, d, vocab_, std::sqrt(static_cast<float>(d)));
  Tensor x = arena.take(sub.act, int64_t(rows) * d);
  backend_.dropout_forward(x, s.tgt_embedded, int64_t(rows) * d, p_drop,
                           dropout_key(ctx, SitePart::Embedding, 0, SiteSlot::TargetEmbedding));

  s.decoder_acts.assign(config_.layers, LayerActs{});
  for (int layer = 0; layer < config_.layers; ++layer) {
    const LayerParams& p = s.decoder[layer];
    LayerActs& a = s.decoder_acts[layer];
    a.x = x;
    const AttentionShape self_shape = attention_shape(
        config_, batch_size, T, T, true, s.tgt_lengths.ids, p_attn,
        dropout_key(ctx, SitePart::Decoder, layer, SiteSlot::SelfAttentionProbs));
    sub.self_attention_forward(a.self_attention, arena, a.x, p.self_attention, self_shape);
    sub.add_norm_forward(a.norm1, arena, a.x, a.self_attention.out, p.norm1, rows, p_drop,
                         dropout_key(ctx, SitePart::Decoder, layer,
                                     SiteSlot::SelfAttentionResidual));
    const AttentionShape cross_shape = attention_shape(
        config_, batch_size, T, s.src_len, false, s.src_lengths.ids, p_attn,
        dropout_key(ctx, SitePart::Decoder, layer, SiteSlot::CrossAttentionProbs));
    sub.cross_attention_forward(a.cross_attention, arena, a.norm1.y, s.encoder_out,
                                p.cross_attention, cross_shape);
    sub.add_norm_forward(a.norm2, arena, a.norm1.y, a.cross_attention.out, p.norm2, rows,
                         p_drop,
                         dropout_key(ctx, SitePart::Decoder, layer,
                                     SiteSlot::CrossAttentionResidual));
    sub.ffn_forward(a.ffn, arena, a.norm2.y, p.ffn, rows);
    sub.add_norm_forward(a.norm3, arena, a.norm2.y, a.ffn.out, p.norm3, rows, p_drop,
                         dropout_key(ctx, SitePart::Decoder, layer, SiteSlot::FfnResidual));
    x = a.output();
  }
  s.decoder_out = x;
  // The tied pre-softmax projection (§3.4): logits = h E^T.
  s.logits = arena.take(sub.act, int64_t(rows) * vocab_);
  backend_.output_projection_forward(s.logits, s.decoder_out, s.embedding.value, rows, d,
                                     vocab_);
}

LossSums Transformer::train_step(const Batch& batch, float grad_scale,
                                 const DropoutContext& dropout) {
  State& s = *state_;
  upload_batch(batch);
  forward_encoder(true, dropout);
  forward_decoder(s.batch_size, s.tgt_len, true, dropout);
  const int rows = s.batch_size * s.tgt_len;
  // Loss and its gradient in one pass; the gradient overwrites the logits.
  const LossSums sums = backend_.softmax_cross_entropy(
      s.logits, s.logits, s.tgt_out.ids, rows, vocab_, config_.label_smoothing, ids_.pad,
      grad_scale);
  s.grad_arena.reset();
  backward_decoder(dropout, true);
  backward_encoder(dropout, true);
  return sums;
}

LossSums Transformer::evaluate(const Batch& batch) {
  State& s = *state_;
  upload_batch(batch);
  const DropoutContext none;
  forward_encoder(false, none);
  forward_decoder(s.batch_size, s.tgt_len, false, none);
  return backend_.softmax_cross_entropy(s.logits, s.logits, s.tgt_out.ids,
                                        s.batch_size * s.tgt_len, vocab_,
                                        config_.label_smoothing, ids_.pad, 0.0f);
}

// Backward through the decoder, from d_logits (in s.logits) to the target embedding,
// leaving the encoder output's gradient in `d_encoder_out` for backward_encoder().
void Transformer::backward_decoder(const DropoutContext& ctx, bool train) {
  State& s = *state_;
  Sublayers sub = sublayers_for(backend_, config_);
  const int rows = s.batch_size * s.tgt_len;
  const int src_rows = s.batch_size * s.src_len;
  const int d = config_.d_model;
  const float p_drop = train ? config_.dropout : 0.0f;
  const float p_attn = train ? config_.attention_dropout : 0.0f;
  Arena& grads = s.grad_arena;

  Tensor d_y = grads.take_zeroed(sub.act, int64_t(rows) * d);
  backend_.output_projection_backward(d_y, s.embedding.grad, s.logits, s.decoder_out,
                                      s.embedding.value, rows, d, vocab_);
  Tensor d_encoder_out = grads.take_zeroed(sub.act, int64_t(src_rows) * d);
  Tensor d_x = grads.take(sub.act, int64_t(rows) * d);

  for (int layer = config_.layers - 1; layer >= 0; --layer) {
    const LayerParams& p = s.decoder[layer];
    const LayerActs& a = s.decoder_acts[layer];
    Arena& scratch = s.scratch_arena;
    scratch.reset();
    backend_.zero(d_x);
    Tensor d_norm2 = scratch.take_zeroed(sub.act, int64_t(rows) * d);
    Tensor d_ffn_out = scratch.take_zeroed(sub.act, int64_t(rows) * d);
    sub.add_norm_backward(d_norm2, d_ffn_out, d_y, a.norm3, p.norm3, scratch, rows, p_drop,
                          dropout_key(ctx, SitePart::Decoder, layer, SiteSlot::FfnResidual));
    sub.ffn_backward(d_norm2, d_ffn_out, a.ffn, a.norm2.y, p.ffn, rows, scratch);

    Tensor d_norm1 = scratch.take_zeroed(sub.act, int64_t(rows) * d);
    Tensor d_cross_out = scratch.take_zeroed(sub.act, int64_t(rows) * d);
    sub.add_norm_backward(d_norm1, d_cross_out, d_norm2, a.norm2, p.norm2, scratch, rows, p_drop,
                          dropout_key(ctx, SitePart::Decoder, layer,
                                      SiteSlot::CrossAttentionResidual));
    const AttentionShape cross_shape = attention_shape(
        config_, s.batch_size, s.tgt_len, s.src_len, false, s.src_lengths.ids, p_attn,
        dropout_key(ctx, SitePart::Decoder, layer, SiteSlot::CrossAttentionProbs));
    sub.cross_attention_backward(d_norm1, d_encoder_out, d_cross_out, a.cross_attention,
                                 a.norm1.y, s.encoder_out, p.cross_attention, cross_shape,
                                 scratch);

    Tensor d_self_out = scratch.take_zeroed(sub.act, int64_t(rows) * d);
    sub.add_norm_backward(d_x, d_self_out, d_norm1, a.norm1, p.norm1, scratch, rows, p_drop,
                          dropout_key(ctx, SitePart::Decoder, layer,
                                      SiteSlot::SelfAttentionResidual));
    const AttentionShape self_shape = attention_shape(
        config_, s.batch_size, s.tgt_len, s.tgt_len, true, s.tgt_lengths.ids, p_attn,
        dropout_key(ctx, SitePart::Decoder, layer, SiteSlot::SelfAttentionProbs));
    sub.self_attention_backward(d_x, d_self_out, a.self_attention, a.x, p.self_attention,
                                self_shape, scratch);
    std::swap(d_x, d_y);  // this layer's input gradient is the next one's output gradient
    // Parameters are laid out embedding, encoder 0..N-1, decoder 0..N-1, and a layer's
    // first entry is its fused QKV weight: from it upwards every gradient is final.
    gradients_final_from(params_.entry(layer_prefix("decoder", layer) + "self_attn.qkv.weight").offset);
  }
  // d_y now holds the gradient of the dropped-out target embedding.
  Tensor d_embedded = s.scratch_arena.take_zeroed(sub.act, int64_t(rows) * d);
  backend_.dropout_backward(d_embedded, d_y, int64_t(rows) * d, p_drop,
                            dropout_key(ctx, SitePart::Embedding, 0, SiteSlot::TargetEmbedding));
  backend_.embedding_backward(s.embedding.grad, s.positions.grad, d_embedded, s.tgt_in.ids, rows,
                              s.tgt_len, d, vocab_, std::sqrt(static_cast<float>(d)));
  s.d_encoder_out = d_encoder_out;
}

void Transformer::backward_encoder(const DropoutContext& ctx, bool train) {
  State& s = *state_;
  Sublayers sub = sublayers_for(backend_, config_);
  const int rows = s.batch_size * s.src_len;
  const int d = config_.d_model;
  const float p_drop = train ? config_.dropout : 0.0f;
  const float p_attn = train ? config_.attention_dropout : 0.0f;
  Arena& grads = s.grad_arena;

  Tensor d_y = s.d_encoder_out;
  Tensor d_x = grads.take(sub.act, int64_t(rows) * d);
  for (int layer = config_.layers - 1; layer >= 0; --layer) {
    const LayerParams& p = s.encoder[layer];
    const LayerActs& a = s.encoder_acts[layer];
    Arena& scratch = s.scratch_arena;
    scratch.reset();
    backend_.zero(d_x);
    Tensor d_norm1 = scratch.take_zeroed(sub.act, int64_t(rows) * d);
    Tensor d_ffn_out = scratch.take_zeroed(sub.act, int64_t(rows) * d);
    sub.add_norm_backward(d_norm1, d_ffn_out, d_y, a.norm2, p.norm2, scratch, rows, p_drop,
                          dropout_key(ctx, SitePart::Encoder, layer, SiteSlot::FfnResidual));
    sub.ffn_backward(d_norm1, d_ffn_out, a.ffn, a.norm1.y, p.ffn, rows, scratch);

    Tensor d_self_out = scratch.take_zeroed(sub.act, int64_t(rows) * d);
    sub.add_norm_backward(d_x, d_self_out, d_norm1, a.norm1, p.norm1, scratch, rows, p_drop,
                          dropout_key(ctx, SitePart::Encoder, layer,
                                      SiteSlot::SelfAttentionResidual));
    const AttentionShape shape = attention_shape(
        config_, s.batch_size, s.src_len, s.src_len, false, s.src_lengths.ids, p_attn,
        dropout_key(ctx, SitePart::Encoder, layer, SiteSlot::SelfAttentionProbs));
    sub.self_attention_backward(d_x, d_self_out, a.self_attention, a.x, p.self_attention, shape,
                                scratch);
    std::swap(d_x, d_y);
    gradients_final_from(params_.entry(layer_prefix("encoder", layer) + "self_attn.qkv.weight").offset);
  }
  Tensor d_embedded = s.scratch_arena.take_zeroed(sub.act, int64_t(rows) * d);
  backend_.dropout_backward(d_embedded, d_y, int64_t(rows) * d, p_drop,
                            dropout_key(ctx, SitePart::Embedding, 0, SiteSlot::SourceEmbedding));
  backend_.embedding_backward(s.embedding.grad, s.positions.grad, d_embedded, s.src.ids, rows,
                              s.src_len, d, vocab_, std::sqrt(static_cast<float>(d)));
  gradients_final_from(0);
}

void Transformer::encode(const Batch& batch) {
  upload_batch(batch);
  forward_encoder(false, DropoutContext{});
}

std::vector<float> Transformer::next_token_log_probs(const std::vector<int32_t>& tgt_in,
                                                     const std::vector<int32_t>& prefix_lengths,
                                                     int T) {
  State& s = *state_;
  const int B = s.batch_size;
  THPC_CHECK(static_cast<int>(prefix_lengths.size()) == B &&
                 static_cast<int64_t>(tgt_in.size()) == int64_t(B) * T,
             "prefixes [" << prefix_lengths.size() << ", " << T << "] for a batch of " << B);
  THPC_CHECK(T <= config_.max_positions,
             "a target prefix of " << T << " exceeds model.max_positions = "
                                   << config_.max_positions);
  ensure_ids(backend_, s.tgt_in, tgt_in);
  ensure_ids(backend_, s.tgt_lengths, prefix_lengths);
  forward_decoder(B, T, false, DropoutContext{});
  backend_.log_softmax(s.logits, s.logits, B * T, vocab_);

  // The rows at each sentence's last prefix position.
  std::vector<float> result;
  for (int b = 0; b < B; ++b) {
    const int row = b * T + prefix_lengths[b] - 1;
    const std::vector<float> one =
        download_rows_f32(s.logits.slice(int64_t(row) * vocab_, vocab_), 1, vocab_);
    result.insert(result.end(), one.begin(), one.end());
  }
  return result;
}

std::vector<float> Transformer::download_rows_f32(Tensor rows, int count, int width) {
  std::vector<float> result(static_cast<size_t>(count) * width);
  THPC_CHECK(rows.numel >= int64_t(count) * width, "downloading " << count << " rows of "
                                                                  << width << " from "
                                                                  << rows.numel);
  Tensor used = rows.slice(0, int64_t(count) * width);
  if (used.dtype == DType::F64) {
    std::vector<double> host(result.size());
    backend_.download(host.data(), used);
    std::copy(host.begin(), host.end(), result.begin());
  } else if (used.dtype == DType::BF16) {
    // Widen on the device (exact: every bf16 is an fp32), then download.
    Tensor wide = backend_.alloc(DType::F32, used.numel);
    backend_.copy(wide, used);
    backend_.download(result.data(), wide);
    backend_.free(wide);
  } else {
    THPC_CHECK(used.dtype == DType::F32, "rows in " << dtype_name(used.dtype));
    backend_.download(result.data(), used);
  }
  return result;
}

// ---------------------------------------------------------------------------------
// Incremental decoding

void Transformer::release_incremental() {
  State::Incremental& inc = state_->incremental;
  for (std::vector<Tensor>* caches :
       {&inc.self_cache, &inc.cross_kv, &inc.self_spare, &inc.cross_spare}) {
    for (Tensor& t : *caches) backend_.free(t);
    caches->clear();
  }
  inc.hypotheses = 0;
  inc.capacity = 0;
  inc.filled = 0;
}

void Transformer::begin_incremental(const std::vector<int>& source_of, int max_len) {
  State& s = *state_;
  State::Incremental& inc = s.incremental;
  THPC_CHECK(s.encoder_out, "begin_incremental() before encode()");
  THPC_CHECK(max_len >= 1 && max_len <= config_.max_positions,
             "incremental decoding of " << max_len << " positions (model.max_positions = "
                                        << config_.max_positions << ")");
  release_incremental();
  Sublayers sub = sublayers_for(backend_, config_);
  const int H = static_cast<int>(source_of.size());
  const int S = s.src_len;
  const int kv_width = sub.h * (sub.dk + sub.dv);
  inc.hypotheses = H;
  inc.max_len = max_len;
  // Which encoder rows each hypothesis reads: hypothesis h, key j <- row source*S + j.
  std::vector<int32_t> rows;
  inc.cross_lengths_host.clear();
  for (int h = 0; h < H; ++h) {
    THPC_CHECK(source_of[h] >= 0 && source_of[h] < s.batch_size,
               "hypothesis " << h << " continues source " << source_of[h] << " of "
                             << s.batch_size);
    for (int j = 0; j < S; ++j) rows.push_back(source_of[h] * S + j);
    inc.cross_lengths_host.push_back(s.src_lengths_host[source_of[h]]);
  }
  ensure_ids(backend_, inc.rows, rows);
  ensure_ids(backend_, inc.cross_lengths, inc.cross_lengths_host);
  Arena& arena = s.step_arena;
  arena.reset();
  for (int layer = 0; layer < config_.layers; ++layer) {
    const AttentionParams& p = s.decoder[layer].cross_attention;
    // The encoder's k|v once per source, then one copy per hypothesis.
    Tensor per_source = arena.take(sub.act, int64_t(s.batch_size) * S * kv_width);
    backend_.linear_forward(per_source, s.encoder_out, p.kv_weight.value, p.kv_bias.value,
                            s.batch_size * S, sub.d, kv_width);
    inc.cross_kv.push_back(backend_.alloc(sub.act, int64_t(H) * S * kv_width));
    backend_.copy_rows(inc.cross_kv.back(), nullptr, per_source, inc.rows.ids, H * S, kv_width);
    // Zeroed once: attention multiplies the rows not yet written by probability 0, and 0
    // times uninitialised memory could be NaN. Later steps leave only finite values there.
    inc.self_cache.push_back(backend_.alloc(sub.act, int64_t(H) * max_len * sub.qkv_width()));
    backend_.zero(inc.self_cache.back());
  }
  inc.capacity = H;
  inc.source_of = source_of;
}

void Transformer::reorder_incremental(const std::vector<int>& parent) {
  State& s = *state_;
  State::Incremental& inc = s.incremental;
  Sublayers sub = sublayers_for(backend_, config_);
  const int H = static_cast<int>(parent.size());
  const int S = s.src_len;
  const int kv_width = sub.h * (sub.dk + sub.dv);
  std::vector<int> source_of(H);
  for (int h = 0; h < H; ++h) {
    THPC_CHECK(parent[h] >= 0 && parent[h] < inc.hypotheses,
               "hypothesis " << h << " continues " << parent[h] << " of " << inc.hypotheses);
    source_of[h] = inc.source_of[parent[h]];
  }
  // The beam widens from one hypothesis per sentence to `beam` once, at the first step:
  // only then are caches (and their spares) allocated anew, zeroed, at the new capacity.
  const bool grow = H > inc.capacity;
  const int capacity = std::max(H, inc.capacity);
  // Gathers each cache's first `rows_used` rows of every hypothesis' parent into the
  // spare (hypothesis h <- parent[h]) and swaps the two: the steady state moves only the
  // rows written so far, and allocates, frees and zeroes nothing.
  auto gather = [&](std::vector<Tensor>& caches, std::vector<Tensor>& spares,
                    int rows_per_hypothesis, int rows_used, int width) {
    std::vector<int32_t> to, from;
    for (int h = 0; h < H; ++h) {
      for (int j = 0; j < rows_used; ++j) {
        to.push_back(h * rows_per_hypothesis + j);
        from.push_back(parent[h] * rows_per_hypothesis + j);
      }
    }
    if (to.empty()) return;
    ensure_ids(backend_, inc.rows, to);
    ensure_ids(backend_, inc.from_rows, from);
    const int64_t numel = int64_t(capacity) * rows_per_hypothesis * width;
    for (size_t layer = 0; layer < caches.size(); ++layer) {
      if (spares.size() <= layer) spares.push_back(Tensor{});
      if (grow || !spares[layer]) {
        if (spares[layer]) backend_.free(spares[layer]);
        spares[layer] = backend_.alloc(sub.act, numel);
        backend_.zero(spares[layer]);
      }
      backend_.copy_rows(spares[layer], inc.rows.ids, caches[layer], inc.from_rows.ids,
                         static_cast<int>(to.size()), width);
      std::swap(caches[layer], spares[layer]);
      if (grow) {  // the old, smaller cache cannot serve as a spare
        backend_.free(spares[layer]);
        spares[layer] = Tensor{};
      }
    }
  };
  gather(inc.self_cache, inc.self_spare, inc.max_len, inc.filled, sub.qkv_width());
  // The encoder's k|v depend only on the source a row reads: while every row keeps its
  // source (hypotheses reordered within their own sentence's beam), nothing moves.
  if (grow || H != inc.hypotheses || source_of != inc.source_of) {
    gather(inc.cross_kv, inc.cross_spare, S, S, kv_width);
  }
  std::vector<int32_t> lengths;
  for (int h = 0; h < H; ++h) lengths.push_back(inc.cross_lengths_host[parent[h]]);
  inc.cross_lengths_host = lengths;
  ensure_ids(backend_, inc.cross_lengths, inc.cross_lengths_host);
  inc.source_of = source_of;
  inc.hypotheses = H;
  inc.capacity = capacity;
}

std::vector<float> Transformer::incremental_log_probs(const std::vector<int32_t>& tokens,
                                                      int position) {
  State& s = *state_;
  State::Incremental& inc = s.incremental;
  Sublayers sub = sublayers_for(backend_, config_);
  const int H = inc.hypotheses;
  const int d = config_.d_model;
  const int width = sub.qkv_width();
  const int kv_width = sub.h * (sub.dk + sub.dv);
  THPC_CHECK(static_cast<int>(tokens.size()) == H,
             tokens.size() << " tokens for " << H << " hypotheses");
  THPC_CHECK(position >= 0 && position < inc.max_len,
             "position " << position << " outside the cache of " << inc.max_len);
  Arena& arena = s.step_arena;
  arena.reset();
  ensure_ids(backend_, s.tgt_in, tokens);
  ensure_ids(backend_, inc.self_lengths, std::vector<int32_t>(H, position + 1));

  // The token embedding at this position: the position table's row `position`.
  Tensor table = s.positions.value ? s.positions.value : s.sinusoid;
  Tensor x = arena.take(sub.act, int64_t(H) * d);
  backend_.embedding_forward(x, s.tgt_in.ids, s.embedding.value,
                             table.slice(int64_t(position) * d, d), H, 1, d, vocab_,
                             std::sqrt(static_cast<float>(d)));
  std::vector<int32_t> append_rows;
  for (int h = 0; h < H; ++h) append_rows.push_back(h * inc.max_len + position);
  ensure_ids(backend_, inc.rows, append_rows);
  const DropoutKey none;
  for (int layer = 0; layer < config_.layers; ++layer) {
    const LayerParams& p = s.decoder[layer];
    LayerActs a;
    // Self-attention: project the new position, append it to the cache, attend over
    // positions 0..position (the cache rows beyond are masked by the key lengths).
    Tensor qkv = arena.take(sub.act, int64_t(H) * width);
    backend_.linear_forward(qkv, x, p.self_attention.in_weight.value,
                            p.self_attention.in_bias.value, H, d, width);
    Tensor& cache = inc.self_cache[layer];
    backend_.copy_rows(cache, inc.rows.ids, qkv, nullptr, H, width);
    AttentionShape self_shape = attention_shape(config_, H, 1, inc.max_len, false,
                                                inc.self_lengths.ids, 0.0f, none);
    Tensor context = arena.take(sub.act, int64_t(H) * sub.h * sub.dv);
    const int64_t k_off = int64_t(sub.h) * sub.dk, v_off = 2 * k_off;
    backend_.attention_forward(context, Tensor{}, qkv, width,
                               cache.slice(k_off, cache.numel - k_off), width,
                               cache.slice(v_off, cache.numel - v_off), width, self_shape);
    Tensor self_out = arena.take(sub.act, int64_t(H) * d);
    backend_.linear_forward(self_out, context, p.self_attention.out_weight.value,
                            p.self_attention.out_bias.value, H, sub.h * sub.dv, d);
    sub.add_norm_forward(a.norm1, arena, x, self_out, p.norm1, H, 0.0f, none);

    // Encoder-decoder attention over the cached encoder k|v of each hypothesis.
    Tensor q = arena.take(sub.act, int64_t(H) * sub.h * sub.dk);
    backend_.linear_forward(q, a.norm1.y, p.cross_attention.in_weight.value,
                            p.cross_attention.in_bias.value, H, d, sub.h * sub.dk);
    AttentionShape cross_shape = attention_shape(config_, H, 1, s.src_len, false,
                                                 inc.cross_lengths.ids, 0.0f, none);
    Tensor& kv = inc.cross_kv[layer];
    backend_.attention_forward(context, Tensor{}, q, sub.h * sub.dk, kv, kv_width,
                               kv.slice(k_off, kv.numel - k_off), kv_width, cross_shape);
    Tensor cross_out = arena.take(sub.act, int64_t(H) * d);
    backend_.linear_forward(cross_out, context, p.cross_attention.out_weight.value,
                            p.cross_attention.out_bias.value, H, sub.h * sub.dv, d);
    sub.add_norm_forward(a.norm2, arena, a.norm1.y, cross_out, p.norm2, H, 0.0f, none);
    sub.ffn_forward(a.ffn, arena, a.norm2.y, p.ffn, H);
    sub.add_norm_forward(a.norm3, arena, a.norm2.y, a.ffn.out, p.norm3, H, 0.0f, none);
    x = a.norm3.y;
  }
  inc.filled = position + 1;
  Tensor logits = arena.take(sub.act, int64_t(H) * vocab_);
  backend_.output_projection_forward(logits, x, s.embedding.value, H, d, vocab_);
  backend_.log_softmax(logits, logits, H, vocab_);
  return download_rows_f32(logits, H, vocab_);
}

}  // namespace thpc
