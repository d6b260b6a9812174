#include "model/transformer.h"

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "common/error.h"
#include "kernels/positions.h"
#include "model/capture_schedule.h"
#include "model/layer.h"
#include "model/transformer_state.h"

namespace thpc {

using namespace model_detail;

namespace {


Param lookup(const ParamStore& store, const std::string& name) {
  if (!store.has(name)) return Param{};
  return Param{store.compute(name), store.grad(name)};
}

NormParams lookup_norm(const ParamStore& store, const std::string& name) {
  return {lookup(store, name + ".gamma"), lookup(store, name + ".beta")};
}

LayerParams lookup_layer(const ParamStore& store, const std::string& p, bool decoder) {
  LayerParams lp;
  lp.self_attention.in_weight = lookup(store, p + "self_attn.qkv.weight");
  lp.self_attention.in_bias = lookup(store, p + "self_attn.qkv.bias");
  lp.self_attention.out_weight = lookup(store, p + "self_attn.out.weight");
  lp.self_attention.out_bias = lookup(store, p + "self_attn.out.bias");
  lp.norm1 = lookup_norm(store, p + "norm1");
  lp.norm2 = lookup_norm(store, p + "norm2");
  lp.ffn = {lookup(store, p + "ffn.fc1.weight"), lookup(store, p + "ffn.fc1.bias"),
            lookup(store, p + "ffn.fc2.weight"), lookup(store, p + "ffn.fc2.bias")};
  if (decoder) {
    lp.cross_attention.in_weight = lookup(store, p + "cross_attn.q.weight");
    lp.cross_attention.in_bias = lookup(store, p + "cross_attn.q.bias");
    lp.cross_attention.kv_weight = lookup(store, p + "cross_attn.kv.weight");
    lp.cross_attention.kv_bias = lookup(store, p + "cross_attn.kv.bias");
    lp.cross_attention.out_weight = lookup(store, p + "cross_attn.out.weight");
    lp.cross_attention.out_bias = lookup(store, p + "cross_attn.out.bias");
    lp.norm3 = lookup_norm(store, p + "norm3");
  }
  return lp;
}

// A stack's pass over `batch` sentences of `len` positions, each attending to its own
// positions up to `lengths` (the encoder's over the source is just this).
LayerPass stack_pass(const ModelConfig& c, SitePart part, int batch, int len,
                     const int32_t* lengths, bool train, const DropoutContext& ctx) {
  LayerPass pass;
  pass.part = part;
  pass.dropout = ctx;
  pass.p_drop = train ? c.dropout : 0.0f;
  pass.p_attn = train ? c.attention_dropout : 0.0f;
  pass.p_act = train ? c.activation_dropout : 0.0f;
  pass.batch = batch;
  pass.len = len;
  pass.lengths = lengths;
  return pass;
}

// The decoder's pass over target prefixes [batch, T] (the batch's targets in training):
// causal self-attention, cross-attention over the encoder output `memory` [batch, S].
LayerPass decoder_pass(const ModelConfig& c, int batch, int T, const int32_t* lengths,
                       Tensor memory, int S, const int32_t* memory_lengths, bool train,
                       const DropoutContext& ctx) {
  LayerPass pass = stack_pass(c, SitePart::Decoder, batch, T, lengths, train, ctx);
  pass.causal = true;
  pass.memory = memory;
  pass.memory_len = S;
  pass.memory_lengths = memory_lengths;
  return pass;
}

}  // namespace

// ---------------------------------------------------------------------------------
// Parameter table

void add_transformer_parameters(const ModelConfig& c, int vocab, ParamStore& store,
                                int source_vocab) {
  const int64_t d = c.d_model, dk = c.head_dim_k(), dv = c.head_dim_v(), h = c.heads;
  THPC_CHECK(vocab > 0, "the vocabulary size is " << vocab);
  THPC_CHECK(source_vocab >= 0, "the source vocabulary size is " << source_vocab);
  store.add("embed.weight", vocab, d, ParamInit::EmbeddingNormal);
  if (c.positions == "learned") {
    store.add("embed.positions", c.max_positions, d, ParamInit::EmbeddingNormal);
  }
  // Before the layers: backward finishes its gradient last, with E's (the listener's
  // gradients_final_from(0)).
  if (source_vocab > 0) {
    store.add(kSourceEmbeddingName, source_vocab, d, ParamInit::EmbeddingNormal);
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
  // Pre-norm's final norms, each after its stack's layers: backward finishes their
  // gradients with the top layer's (Transformer::layer_gradients_final).
  if (c.norm == "pre") add_norm("encoder.norm");
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
  if (c.norm == "pre") add_norm("decoder.norm");
}

std::vector<ProductWeight> product_weights(const ParamStore& store) {
  // Every matrix of the table is one of these: the layers' ".weight" entries (the
  // projections and fc1/fc2) and "embed.weight"; learned positions are added, not
  // multiplied, and the norms' and biases' vectors are not matrices.
  std::vector<ProductWeight> weights;
  for (const ParamEntry& entry : store.entries()) {
    if (is_product_weight(entry.name)) {
      weights.push_back({entry.name, is_output_projection(entry.name)});
    }
  }
  return weights;
}

bool is_product_weight(const std::string& name) {
  return name.size() > 7 && name.compare(name.size() - 7, 7, ".weight") == 0 &&
         name != kSourceEmbeddingName;
}

bool is_output_projection(const std::string& name) { return name == "embed.weight"; }


// ---------------------------------------------------------------------------------

Transformer::Transformer(const ModelConfig& config, VocabularySizes vocabularies,
                         const SpecialIds& ids, Backend& backend,
                         std::optional<uint64_t> init_seed, ModelUse use)
    : config_(config), vocab_(vocabularies.target), source_vocab_(vocabularies.source),
      ids_(ids), backend_(backend), state_(std::make_unique<State>(backend)),
      decoder_state_(std::make_unique<DecoderState>(backend)) {
  add_transformer_parameters(config_, vocab_, params_, source_vocab_);
  params_.allocate(backend_, /*gradients=*/use == ModelUse::kTraining);
  if (init_seed) params_.initialize(*init_seed);

  State& s = *state_;
  s.embedding = lookup(params_, "embed.weight");
  s.source_embedding = lookup(params_, kSourceEmbeddingName);
  s.positions = lookup(params_, "embed.positions");
  if (!s.positions.value) {
    // The fixed sinusoidal table, computed on the host in double and uploaded once.
    std::vector<double> table(static_cast<size_t>(config_.max_positions) * config_.d_model);
    sinusoidal_positions<double>(table.data(), config_.max_positions, config_.d_model);
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
  s.encoder_norm = lookup_norm(params_, "encoder.norm");
  s.decoder_norm = lookup_norm(params_, "decoder.norm");
}

Transformer::~Transformer() {
  State& s = *state_;
  for (IdBuffer* b : {&s.batch_ids, &s.prefix_ids, &s.prefix_lengths, &s.group_rows_to,
                      &s.group_rows_from, &s.lookup_rows}) {
    backend_.free_ids(b->ids);
  }
  for (Tensor* t : {&s.sinusoid, &s.grouped_encoder_out, &s.lookup_grad, &s.lookup_rows_grad,
                    &s.widened_rows}) {
    if (*t) backend_.free(*t);
  }
}

void Transformer::sum_lookups_apart(const std::vector<int32_t>& rows) {
  State& s = *state_;
  s.lookup_row_count = static_cast<int>(rows.size());
  if (rows.empty()) return;
  const int d = config_.d_model;
  const DType dtype = s.embedding.grad.dtype;
  model_detail::ensure_capacity(backend_, s.lookup_grad, dtype, int64_t(vocab_) * d, false);
  backend_.zero(s.lookup_grad);
  model_detail::ensure_capacity(backend_, s.lookup_rows_grad, dtype,
                                int64_t(rows.size()) * d, false);
  ensure_ids(backend_, s.lookup_rows, rows);
}

bool Transformer::lookups_summed_apart() const { return state_->lookup_row_count > 0; }

Tensor Transformer::lookups_gradient() const {
  const State& s = *state_;
  return s.lookup_row_count > 0 ? s.lookup_grad : s.embedding.grad;
}

Tensor Transformer::lookup_gradient_rows() {
  State& s = *state_;
  const int d = config_.d_model;
  const Tensor gathered = s.lookup_rows_grad.slice(0, int64_t(s.lookup_row_count) * d);
  backend_.copy_rows(gathered, nullptr, s.lookup_grad, s.lookup_rows.ids, s.lookup_row_count, d);
  return gathered;
}

void Transformer::add_lookup_gradient_rows(Tensor summed) {
  State& s = *state_;
  // Row i of `summed` into the embedding's row lookup_rows[i]: a lookup's backward of
  // scale 1 (the rows are distinct, so each adds once).
  backend_.embedding_backward(s.embedding.grad, Tensor{}, summed, s.lookup_rows.ids,
                              s.lookup_row_count, 1, config_.d_model, vocab_, 1.0f);
}

void Transformer::upload_batch(const Batch& batch) {
  State& s = *state_;
  THPC_CHECK(batch.src_len <= config_.max_positions && batch.tgt_len <= config_.max_positions,
             "a batch of source length " << batch.src_len << " and target length "
             << batch.tgt_len << " exceeds model.max_positions = " << config_.max_positions);
  s.batch_size = batch.size;
  s.src_len = batch.src_len;
  s.tgt_len = batch.tgt_len;
  s.src_lengths_host = batch.src_lengths;
  // One upload: the five arrays packed, each from a 64-id boundary.
  const std::vector<int32_t>* parts[] = {&batch.src, &batch.src_lengths, &batch.tgt_in,
                                         &batch.tgt_out, &batch.tgt_lengths};
  size_t at[5] = {};
  std::vector<int32_t>& host = s.batch_host;
  host.clear();
  for (int i = 0; i < 5; ++i) {
    host.resize((host.size() + 63) / 64 * 64, 0);
    at[i] = host.size();
    host.insert(host.end(), parts[i]->begin(), parts[i]->end());
  }
  ensure_ids(backend_, s.batch_ids, host);
  s.src = s.batch_ids.ids + at[0];
  s.src_lengths = s.batch_ids.ids + at[1];
  // A source-only batch (decoding) leaves the targets to next_token_log_probs.
  if (!batch.tgt_in.empty()) {
    s.tgt_in = s.batch_ids.ids + at[2];
    s.tgt_out = s.batch_ids.ids + at[3];
    s.tgt_lengths = s.batch_ids.ids + at[4];
  }
}


// x_0 = Dropout(E[tokens] * sqrt(d) + PE), then N encoder layers.
void Transformer::forward_encoder(bool train, const DropoutContext& ctx,
                                  EncoderActivations keep) {
  State& s = *state_;
  Sublayers sub(backend_, config_);
  const int rows = s.batch_size * s.src_len;
  const int d = config_.d_model;
  const float p_drop = train ? config_.dropout : 0.0f;
  const bool keep_all = keep == EncoderActivations::kAll;
  THPC_CHECK(keep_all || !train, "a training forward keeps the activations backward reads");
  // Keeping every layer's activations (for backward, or attention_weights()) takes them
  // all from one arena. Without them, layer l takes its own from arena l % 2 after
  // resetting it, reading its input from the other, which holds layer l-1's: two
  // layers' worth of memory instead of N (and of fresh pages for a decoder's first
  // batches). The scratch arena serves as the second: only backward uses it otherwise.
  Arena* arenas[2] = {&s.encoder_arena, keep_all ? &s.encoder_arena : &s.scratch_arena};
  Arena& embedding_arena = *arenas[1];  // layer 0 reads x_0 from the other arena
  arenas[0]->reset();
  if (!keep_all) arenas[1]->reset();

  Tensor positions = s.positions.value ? s.positions.value : s.sinusoid;
  s.src_embedded = embedding_arena.take(sub.act, int64_t(rows) * d);
  const Tensor source_table =
      separate_source_embedding() ? s.source_embedding.value : s.embedding.value;
  backend_.embedding_forward(s.src_embedded, s.src, source_table, positions, rows, s.src_len,
                             d, source_vocab_size(), std::sqrt(static_cast<float>(d)));
  Tensor x0 = embedding_arena.take(sub.act, int64_t(rows) * d);
  backend_.dropout_forward(x0, s.src_embedded, int64_t(rows) * d, p_drop,
                           dropout_key(ctx, SitePart::Embedding, 0, SiteSlot::SourceEmbedding));
  LayerInput in = sub.stack_input(s.encoder_lead, embedding_arena, x0, s.encoder[0].norm1, rows);

  s.encoder_acts.assign(config_.layers, LayerActs{});
  // The decoder's activations belong to the previous source: attention_weights() must
  // not pair them with this one.
  s.decoder_acts.clear();
  LayerPass pass = stack_pass(config_, SitePart::Encoder, s.batch_size, s.src_len,
                              s.src_lengths, train, ctx);
  pass.keep_probabilities = keep_all;
  for (int layer = 0; layer < config_.layers; ++layer) {
    LayerActs& a = s.encoder_acts[layer];
    Arena& arena = *arenas[layer % 2];
    if (!keep_all && layer >= 2) arena.reset();  // it holds layer l-2's: read by no one now
    layer_forward(sub, a, arena, in, s.encoder[layer],
                  norm_after(s.encoder, s.encoder_norm, layer), pass, layer);
    in = sub.after(a.last());
  }
  s.encoder_out = in.normed;
  // Their tensors are overwritten, layer by layer: nothing may read them.
  if (!keep_all) s.encoder_acts.clear();
}

void Transformer::forward_decoder(int batch_size, int T, bool train, const DropoutContext& ctx,
                                  bool with_logits) {
  State& s = *state_;
  Sublayers sub(backend_, config_);
  const int rows = batch_size * T;
  const int d = config_.d_model;
  const float p_drop = train ? config_.dropout : 0.0f;
  Arena& arena = s.decoder_arena;
  arena.reset();

  Tensor positions = s.positions.value ? s.positions.value : s.sinusoid;
  s.tgt_embedded = arena.take(sub.act, int64_t(rows) * d);
  backend_.embedding_forward(s.tgt_embedded, s.tgt_in, s.embedding.value, positions, rows,
                             T, d, vocab_, std::sqrt(static_cast<float>(d)));
  Tensor x0 = arena.take(sub.act, int64_t(rows) * d);
  backend_.dropout_forward(x0, s.tgt_embedded, int64_t(rows) * d, p_drop,
                           dropout_key(ctx, SitePart::Embedding, 0, SiteSlot::TargetEmbedding));
  LayerInput in = sub.stack_input(s.decoder_lead, arena, x0, s.decoder[0].norm1, rows);

  s.decoder_acts.assign(config_.layers, LayerActs{});
  s.decoder_len = T;
  const LayerPass pass = decoder_pass(config_, batch_size, T, s.tgt_lengths, s.encoder_out,
                                      s.src_len, s.src_lengths, train, ctx);
  for (int layer = 0; layer < config_.layers; ++layer) {
    LayerActs& a = s.decoder_acts[layer];
    layer_forward(sub, a, arena, in, s.decoder[layer],
                  norm_after(s.decoder, s.decoder_norm, layer), pass, layer);
    in = sub.after(a.last());
  }
  s.decoder_out = in.normed;
  s.logits = with_logits ? vocabulary_logits(arena, s.decoder_out, rows) : Tensor{};
}

// The tied pre-softmax projection (§3.4): logits = h E^T, the decoder's top for a full
// pass and a decoding step alike.
Tensor Transformer::vocabulary_logits(Arena& arena, Tensor decoder_out, int rows) {
  State& s = *state_;
  Tensor logits = arena.take(backend_.compute_dtype(), int64_t(rows) * vocab_);
  backend_.output_projection_forward(logits, decoder_out, s.embedding.value, rows,
                                     config_.d_model, vocab_);
  return logits;
}

template <typename Body>
void Transformer::logits_in_chunks(int rows, int64_t chunk, Body&& body) {
  State& s = *state_;
  const int d = config_.d_model;
  const Tensor logits = s.grad_arena.take(backend_.compute_dtype(), chunk * vocab_);
  for (int first = 0; first < rows; first += static_cast<int>(chunk)) {
    const int count = static_cast<int>(std::min<int64_t>(chunk, rows - first));
    const Tensor chunk_logits = logits.slice(0, int64_t(count) * vocab_);
    const Tensor h = s.decoder_out.slice(int64_t(first) * d, int64_t(count) * d);
    backend_.output_projection_forward(chunk_logits, h, s.embedding.value, count, d, vocab_);
    body(first, count, chunk_logits, h);
  }
}

void Transformer::set_loss_chunk_rows(int64_t rows) {
  if (rows != loss_chunk_rows_) captured_passes_.clear();
  loss_chunk_rows_ = rows;
}

template <typename Loss>
void Transformer::train_pass(const Batch& batch, const DropoutContext& dropout, Loss&& loss) {
  THPC_CHECK(params_.grads(), "train_step on a model built for inference (no gradients)");
  upload_batch(batch);
  queue_train_pass(dropout, loss);
}

template <typename Loss>
void Transformer::queue_train_pass(const DropoutContext& dropout, Loss&& loss) {
  State& s = *state_;
  forward_encoder(true, dropout);
  const int rows = s.batch_size * s.tgt_len;
  const int64_t chunk = loss_chunk(rows);
  if (chunk == rows) {
    forward_decoder(s.batch_size, s.tgt_len, true, dropout);
    // Loss and its gradient in one pass; the gradient overwrites the logits.
    loss(s.logits, s.tgt_out, rows);
    s.grad_arena.reset();
    backward_decoder(dropout);
    backward_encoder(dropout);
    if (listener_ != nullptr) listener_->pass_end();
    return;
  }
  // train.loss_chunk_rows: the tied projection (§3.4), the loss and the projection's
  // backward a chunk of target rows at a time, into one [chunk, vocabulary] buffer: a
  // chunk's rows need only their own logits (each row's softmax is over the vocabulary),
  // so the whole [rows, vocabulary] never exists. dh is written chunk by chunk; dE adds
  // each chunk's share.
  forward_decoder(s.batch_size, s.tgt_len, true, dropout, /*with_logits=*/false);
  s.grad_arena.reset();
  const int d = config_.d_model;
  const Tensor d_decoder_out =
      s.grad_arena.take(Sublayers(backend_, config_).act, int64_t(rows) * d);
  logits_in_chunks(rows, chunk, [&](int first, int count, Tensor chunk_logits, Tensor h) {
    loss(chunk_logits, s.tgt_out + first, count);
    backend_.output_projection_backward(d_decoder_out.slice(int64_t(first) * d, int64_t(count) * d),
                                        s.embedding.grad, chunk_logits, h, s.embedding.value,
                                        count, d, vocab_, GradStore::kWrite);
  });
  backward_decoder(dropout, d_decoder_out);
  backward_encoder(dropout);
  if (listener_ != nullptr) listener_->pass_end();
}

namespace {

// The listener of one train_step, told what its pass's backward finishes, and forgotten
// when the step returns or throws.
class ListenerForThePass {
 public:
  ListenerForThePass(GradientListener*& slot, GradientListener* listener)
      : slot_(slot), before_(std::exchange(slot, listener)) {}
  ~ListenerForThePass() { slot_ = before_; }
  ListenerForThePass(const ListenerForThePass&) = delete;
  ListenerForThePass& operator=(const ListenerForThePass&) = delete;

 private:
  GradientListener*& slot_;
  GradientListener* before_;  // null but inside a pass
};

}  // namespace

LossSums Transformer::train_step(const Batch& batch, float grad_scale,
                                 const DropoutContext& dropout, GradientListener* listener) {
  const ListenerForThePass listening(listener_, listener);
  LossSums sums;
  train_pass(batch, dropout, [&](Tensor logits, const int32_t* targets, int rows) {
    const LossSums part = backend_.softmax_cross_entropy(
        logits, logits, targets, rows, vocab_, config_.label_smoothing, ids_.pad, grad_scale);
    sums.loss += part.loss;  // 0 + the whole's sums when not in chunks: the same bits
    sums.nll += part.nll;
    sums.tokens += part.tokens;
  });
  return sums;
}

void Transformer::train_step(const Batch& batch, const DropoutContext& dropout,
                             const StepInputs* inputs, Tensor totals,
                             GradientListener* listener) {
  THPC_CHECK(inputs != nullptr, "train_step without its step inputs");
  const ListenerForThePass listening(listener_, listener);
  const auto loss = [&](Tensor logits, const int32_t* targets, int rows) {
    backend_.softmax_cross_entropy_add(logits, logits, targets, rows, vocab_,
                                       config_.label_smoothing, ids_.pad, inputs, totals);
  };
  // A listener that calls host code during backward (MPI's sums) and the lookups summed
  // apart, which change from step to step, keep a pass uncaptured.
  const bool capturable = backend_.can_capture(CaptureUse::kTrainingPass) &&
                          (listener == nullptr || listener->capturable()) &&
                          !lookups_summed_apart();
  if (!capturable) {
    train_pass(batch, dropout, loss);
    return;
  }
  THPC_CHECK(params_.grads(), "train_step on a model built for inference (no gradients)");
  upload_batch(batch);
  State& s = *state_;
  CapturedPass& pass =
      lru_entry(captured_passes_, CapturedPassKey{s.batch_size, s.src_len, s.tgt_len, inputs,
                                                  totals.data, listener, dropout.seed});
  // The captured ops read the dropout's step and stream where the loss reads its scale:
  // in `inputs`, written before each micro-batch with what `dropout` says here.
  DropoutContext from_inputs = dropout;
  from_inputs.inputs = inputs;
  const CaptureRun run = run_capturable(
      pass,
      [&] {  // arenas grown by other shapes give their blocks back now, not in the capture
        s.encoder_arena.reset();
        s.decoder_arena.reset();
        s.grad_arena.reset();
        s.scratch_arena.reset();
      },
      [&, tried_capture = false](bool captured) mutable {
        // An uncaptured run after a refused capture: the listener's calls of the capture
        // queued work that went with it.
        if (captured) {
          tried_capture = true;
        } else if (tried_capture && listener != nullptr) {
          listener->pass_discarded();
        }
        queue_train_pass(captured ? from_inputs : dropout, loss);
      });
  if (run != CaptureRun::kUncaptured) forget_pass_views();
}

Transformer::CaptureRun Transformer::run_capturable(CaptureState& entry,
                                                    const std::function<void()>& settle,
                                                    const std::function<void(bool)>& queue) {
  if (entry.work != nullptr && entry.work->replay()) {
    ++capture_counts_.replays;
    return CaptureRun::kReplayed;
  }
  if (entry.refused || (entry.work == nullptr && entry.uncaptured_runs == 0)) {
    ++entry.uncaptured_runs;
    queue(false);
    return CaptureRun::kUncaptured;
  }
  settle();
  entry.work = backend_.capture([&] { queue(true); });
  if (entry.work != nullptr && entry.work->replay()) {
    ++capture_counts_.captures;
    ++capture_counts_.replays;
    return CaptureRun::kCaptured;
  }
  entry.work.reset();
  entry.refused = true;
  ++capture_counts_.refused;
  queue(false);
  return CaptureRun::kUncaptured;
}

template <typename Entry, typename Key>
Entry& Transformer::lru_entry(std::vector<Entry>& entries, const Key& key) {
  return least_recently_used_entry(entries, key, kMaxCapturedPasses, capture_clock_,
                                   capture_counts_.evicted);
}

template Transformer::CapturedDecodeStep& Transformer::lru_entry(
    std::vector<CapturedDecodeStep>&, const CapturedDecodeKey&);

void Transformer::forget_pass_views() {
  // The host's views of a pass's activations were set when its shape last ran on the host,
  // maybe another's since: attention_weights() must not read them.
  State& s = *state_;
  s.encoder_acts.clear();
  s.decoder_acts.clear();
}

LossSums Transformer::evaluate(const Batch& batch) {
  State& s = *state_;
  upload_batch(batch);
  const DropoutContext none;
  forward_encoder(false, none);
  const int rows = s.batch_size * s.tgt_len;
  const int64_t chunk = loss_chunk(rows);
  if (chunk == rows) {
    forward_decoder(s.batch_size, s.tgt_len, false, none);
    return backend_.softmax_cross_entropy(s.logits, s.logits, s.tgt_out, rows, vocab_,
                                          config_.label_smoothing, ids_.pad, 0.0f);
  }
  // train.loss_chunk_rows holds for validation too: a run that fits only with the logits
  // in chunks must not make them whole to validate.
  forward_decoder(s.batch_size, s.tgt_len, false, none, /*with_logits=*/false);
  s.grad_arena.reset();
  LossSums sums;
  logits_in_chunks(rows, chunk, [&](int first, int count, Tensor chunk_logits, Tensor) {
    const LossSums part =
        backend_.softmax_cross_entropy(Tensor{}, chunk_logits, s.tgt_out + first, count, vocab_,
                                       config_.label_smoothing, ids_.pad, 0.0f);
    sums.loss += part.loss;
    sums.nll += part.nll;
    sums.tokens += part.tokens;
  });
  return sums;
}

std::vector<double> Transformer::target_log_probs(
    const Batch& batch, std::vector<std::vector<float>>* piece_log_probs) {
  State& s = *state_;
  upload_batch(batch);
  const DropoutContext none;
  forward_encoder(false, none);
  const int T = s.tgt_len;
  const int rows = s.batch_size * T;
  std::vector<double> log_probs(static_cast<size_t>(s.batch_size), 0.0);
  if (piece_log_probs != nullptr) piece_log_probs->assign(static_cast<size_t>(s.batch_size), {});
  // The rows [first, first + count) of the pass, whose logits are `logits`: their nll in
  // one call (on a GPU one read-back), each sentence's added in order from 0 (the bits of
  // the loss op's sum over the sentence, on the CPU), each piece's kept with
  // piece_log_probs. Pad rows (they trail) add nothing.
  const auto add_rows = [&](int first, int count, Tensor logits) {
    const std::vector<double> nll =
        backend_.softmax_nll_rows(logits, s.tgt_out + first, count, vocab_, ids_.pad);
    for (int b = first / T; b < s.batch_size && b * T < first + count; ++b) {
      const int begin = std::max(first, b * T), end = std::min(first + count, (b + 1) * T);
      double sentence_nll = 0.0;
      for (int row = begin; row < end && batch.tgt_out[static_cast<size_t>(row)] != ids_.pad;
           ++row) {
        const double one = nll[static_cast<size_t>(row - first)];
        sentence_nll += one;
        if (piece_log_probs != nullptr) {
          (*piece_log_probs)[static_cast<size_t>(b)].push_back(static_cast<float>(-one));
        }
      }
      log_probs[static_cast<size_t>(b)] -= sentence_nll;
    }
  };
  const int64_t chunk = loss_chunk(rows);
  if (chunk == rows) {
    forward_decoder(s.batch_size, T, false, none);
    add_rows(0, rows, s.logits);
    return log_probs;
  }
  forward_decoder(s.batch_size, T, false, none, /*with_logits=*/false);
  s.grad_arena.reset();
  logits_in_chunks(rows, chunk, [&](int first, int count, Tensor chunk_logits, Tensor) {
    add_rows(first, count, chunk_logits);
  });
  return log_probs;
}

// Backward through the decoder, from d_logits (in s.logits) to the target embedding,
// leaving the encoder output's gradient in `d_encoder_out` for backward_encoder().
void Transformer::backward_decoder(const DropoutContext& ctx, Tensor d_decoder_out) {
  State& s = *state_;
  Sublayers sub(backend_, config_);
  const int rows = s.batch_size * s.tgt_len;
  const int src_rows = s.batch_size * s.src_len;
  const int d = config_.d_model;
  const float p_drop = config_.dropout;
  Arena& grads = s.grad_arena;

  Tensor d_y = d_decoder_out;
  if (!d_y) {
    d_y = grads.take(sub.act, int64_t(rows) * d);
    backend_.output_projection_backward(d_y, s.embedding.grad, s.logits, s.decoder_out,
                                        s.embedding.value, rows, d, vocab_, GradStore::kWrite);
  }
  // With the lookups summed apart, the embedding's gradient is now final.
  if (listener_ != nullptr && lookups_summed_apart()) listener_->output_projection_final();
  Tensor d_encoder_out = grads.take_zeroed(sub.act, int64_t(src_rows) * d);
  Tensor d_x = grads.take(sub.act, int64_t(rows) * d);
  // Pre-norm: the residual stream's gradient, zero above the top layer (the final norm,
  // the top layer's last block, is all the output projection reads).
  Tensor d_stream = sub.pre_norm ? grads.take_zeroed(sub.act, int64_t(rows) * d) : Tensor{};

  LayerPass pass = decoder_pass(config_, s.batch_size, s.tgt_len, s.tgt_lengths,
                                s.encoder_out, s.src_len, s.src_lengths, true, ctx);
  pass.d_memory = d_encoder_out;
  for (int layer = config_.layers - 1; layer >= 0; --layer) {
    layer_backward(sub, d_x, d_y, d_stream, s.decoder_acts[layer], s.decoder[layer],
                   norm_after(s.decoder, s.decoder_norm, layer), pass, layer, s.scratch_arena);
    std::swap(d_x, d_y);  // this layer's input gradient is the next one's output gradient
    layer_gradients_final("decoder", layer);
  }
  // The gradient of the dropped-out target embedding.
  const Tensor d_x0 = sub.stack_input_backward(d_stream, d_y, s.decoder_lead, s.decoder[0].norm1,
                                               rows);
  layer_gradients_final("decoder", -1);
  Tensor d_embedded = s.scratch_arena.take(sub.act, int64_t(rows) * d);
  backend_.dropout_backward(d_embedded, d_x0, int64_t(rows) * d, p_drop,
                            dropout_key(ctx, SitePart::Embedding, 0, SiteSlot::TargetEmbedding),
                            GradStore::kWrite);
  backend_.embedding_backward(lookups_gradient(), s.positions.grad, d_embedded, s.tgt_in, rows,
                              s.tgt_len, d, vocab_, std::sqrt(static_cast<float>(d)));
  s.d_encoder_out = d_encoder_out;
}

void Transformer::backward_encoder(const DropoutContext& ctx) {
  State& s = *state_;
  Sublayers sub(backend_, config_);
  const int rows = s.batch_size * s.src_len;
  const int d = config_.d_model;
  const float p_drop = config_.dropout;
  Arena& grads = s.grad_arena;

  Tensor d_y = s.d_encoder_out;
  Tensor d_x = grads.take(sub.act, int64_t(rows) * d);
  Tensor d_stream = sub.pre_norm ? grads.take_zeroed(sub.act, int64_t(rows) * d) : Tensor{};
  const LayerPass pass = stack_pass(config_, SitePart::Encoder, s.batch_size, s.src_len,
                                    s.src_lengths, true, ctx);
  for (int layer = config_.layers - 1; layer >= 0; --layer) {
    layer_backward(sub, d_x, d_y, d_stream, s.encoder_acts[layer], s.encoder[layer],
                   norm_after(s.encoder, s.encoder_norm, layer), pass, layer, s.scratch_arena);
    std::swap(d_x, d_y);
    layer_gradients_final("encoder", layer);
  }
  const Tensor d_x0 = sub.stack_input_backward(d_stream, d_y, s.encoder_lead, s.encoder[0].norm1,
                                               rows);
  layer_gradients_final("encoder", -1);
  Tensor d_embedded = s.scratch_arena.take(sub.act, int64_t(rows) * d);
  backend_.dropout_backward(d_embedded, d_x0, int64_t(rows) * d, p_drop,
                            dropout_key(ctx, SitePart::Embedding, 0, SiteSlot::SourceEmbedding),
                            GradStore::kWrite);
  // A separate source table's gradient is its own, dense (never summed per use).
  const Tensor source_gradient =
      separate_source_embedding() ? s.source_embedding.grad : lookups_gradient();
  backend_.embedding_backward(source_gradient, s.positions.grad, d_embedded, s.src, rows,
                              s.src_len, d, source_vocab_size(),
                              std::sqrt(static_cast<float>(d)));
  gradients_final_from(0);
}

// Parameters are laid out embedding, encoder 0..N-1 (pre-norm: then encoder.norm),
// decoder 0..N-1 (then decoder.norm), a layer's first entry being its fused QKV weight.
// Post-norm, once layer `layer`'s backward is done every gradient from that entry
// upwards is final. Pre-norm, its norm1's is not: the block below (layer - 1's last, or
// the stack's lead-in norm) finishes it, so the gradients are final from the entry after
// the layer (the next layer's first, or the final norm), and from layer 0's first once
// the lead-in is done (layer = -1, where post-norm has nothing left to report).
void Transformer::layer_gradients_final(const char* stack, int layer) const {
  if (listener_ == nullptr) return;
  const bool pre_norm = config_.norm == "pre";
  if (layer < 0 && !pre_norm) return;
  const int first_final = pre_norm ? layer + 1 : layer;
  const std::string entry = first_final < config_.layers
                                ? layer_prefix(stack, first_final) + "self_attn.qkv.weight"
                                : std::string(stack) + ".norm.gamma";
  gradients_final_from(params_.entry(entry).offset);
}

namespace model_detail {

std::vector<std::vector<int>> encoder_length_groups(const std::vector<int32_t>& lengths,
                                                    int group_cost_rows) {
  const int n = static_cast<int>(lengths.size());
  std::vector<int> order(n);
  for (int i = 0; i < n; ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(),
                   [&](int a, int b) { return lengths[a] > lengths[b]; });
  // cost[j]: the fewest rows for the first j sentences of `order`; a group [i, j) is
  // padded to its first (longest) sentence's length.
  std::vector<int64_t> cost(n + 1, 0);
  std::vector<int> group_start(n + 1, 0);
  for (int j = 1; j <= n; ++j) {
    cost[j] = -1;
    for (int i = 0; i < j; ++i) {
      const int64_t rows = cost[i] + int64_t(j - i) * lengths[order[i]] + group_cost_rows;
      if (cost[j] < 0 || rows < cost[j]) {
        cost[j] = rows;
        group_start[j] = i;
      }
    }
  }
  std::vector<std::vector<int>> groups;
  for (int j = n; j > 0; j = group_start[j]) {
    groups.emplace_back(order.begin() + group_start[j], order.begin() + j);
  }
  std::reverse(groups.begin(), groups.end());
  return groups;
}

}  // namespace model_detail

void Transformer::encode(const Batch& batch) {
  // A decoding batch holds sentences of many lengths (transformer_decode's are sorted by
  // length but budgeted in tokens, and a short input is one batch): padded to the
  // longest, the encoder computes pad rows as well, half of the rows for the first 40
  // lines of newstest2014. Where the backend prices a group (Backend::
  // encoder_group_cost_rows), the sentences are encoded in groups of similar length and
  // the output put together. Each sentence's encoding is its own either way (attention
  // and the row ops are per sentence, a product's row is that row times the weights); the
  // bits may differ as they do between batchings (BLAS kernels round a row differently
  // by its place in the tile).
  const int group_cost = backend_.encoder_group_cost_rows();
  const std::vector<std::vector<int>> groups =
      group_cost > 0 ? encoder_length_groups(batch.src_lengths, group_cost)
                     : std::vector<std::vector<int>>{};
  if (groups.size() <= 1) {
    upload_batch(batch);
    forward_encoder(false, DropoutContext{}, EncoderActivations::kOutputOnly);
    return;
  }
  State& s = *state_;
  const int d = config_.d_model;
  const int64_t numel = int64_t(batch.size) * batch.src_len * d;
  ensure_capacity(backend_, s.grouped_encoder_out, backend_.compute_dtype(), numel, false);
  const Tensor out = s.grouped_encoder_out.slice(0, numel);
  backend_.zero(out);  // the pad rows, which the decoder's k|v projection reads
  std::vector<int32_t> to, from;
  for (const std::vector<int>& members : groups) {
    Batch part;
    part.size = static_cast<int>(members.size());
    part.src_len = batch.src_lengths[members.front()];
    to.clear();
    from.clear();
    for (int i = 0; i < part.size; ++i) {
      const int sentence = members[i];
      const int length = batch.src_lengths[sentence];
      const auto first = batch.src.begin() + int64_t(sentence) * batch.src_len;
      part.src.insert(part.src.end(), first, first + part.src_len);
      part.src_lengths.push_back(length);
      for (int t = 0; t < length; ++t) {
        to.push_back(sentence * batch.src_len + t);
        from.push_back(i * part.src_len + t);
      }
    }
    upload_batch(part);
    forward_encoder(false, DropoutContext{}, EncoderActivations::kOutputOnly);
    ensure_ids(backend_, s.group_rows_to, to);
    ensure_ids(backend_, s.group_rows_from, from);
    backend_.copy_rows(out, s.group_rows_to.ids, s.encoder_out, s.group_rows_from.ids,
                       static_cast<int>(to.size()), d);
  }
  upload_batch(batch);  // the whole batch's ids and lengths, which the decoder reads
  s.encoder_out = out;
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
  ensure_ids(backend_, s.prefix_ids, tgt_in);
  ensure_ids(backend_, s.prefix_lengths, prefix_lengths);
  s.tgt_in = s.prefix_ids.ids;
  s.tgt_lengths = s.prefix_lengths.ids;
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

std::vector<float> Transformer::attention_weights(AttentionKind kind, int layer) {
  State& s = *state_;
  const bool encoder = kind == AttentionKind::EncoderSelf;
  const std::vector<LayerActs>& acts = encoder ? s.encoder_acts : s.decoder_acts;
  THPC_CHECK(layer >= 0 && layer < static_cast<int>(acts.size()),
             "attention weights of " << (encoder ? "encoder" : "decoder") << " layer " << layer
                                     << " asked for, but the last forward pass kept those of "
                                     << acts.size() << " layers (encode() keeps none: "
                                     << "evaluate() keeps them all)");
  const Tensor saved = kind == AttentionKind::Cross ? acts[layer].cross_attention.saved
                                                    : acts[layer].self_attention.saved;
  const int query_len = encoder ? s.src_len : s.decoder_len;
  const int key_len = kind == AttentionKind::DecoderSelf ? s.decoder_len : s.src_len;
  THPC_CHECK(saved.numel == int64_t(s.batch_size) * config_.heads * query_len * key_len,
             "saved attention of " << saved.numel << " values for [" << s.batch_size << ", "
                                   << config_.heads << ", " << query_len << ", " << key_len
                                   << "]");
  return download_rows_f32(saved, s.batch_size * config_.heads * query_len, key_len);
}

std::vector<float> Transformer::download_rows_f32(Tensor rows, int count, int width) {
  std::vector<float> result;
  download_rows_f32(rows, count, width, result);
  return result;
}

void Transformer::download_rows_f32(Tensor rows, int count, int width,
                                    std::vector<float>& result) {
  THPC_CHECK(rows.numel >= int64_t(count) * width, "downloading " << count << " rows of "
                                                                  << width << " from "
                                                                  << rows.numel);
  download_as_f32(backend_, rows, int64_t(count) * width, result, &state_->widened_rows);
}

void model_detail::download_as_f32(Backend& backend, Tensor tensor, int64_t count,
                                   std::vector<float>& out, Tensor* widened) {
  THPC_CHECK(tensor.numel >= count, "downloading " << count << " elements of " << tensor.numel);
  out.resize(static_cast<size_t>(count));
  Tensor used = tensor.slice(0, count);
  if (used.dtype == DType::F64) {
    std::vector<double> host(out.size());
    backend.download(host.data(), used);
    std::copy(host.begin(), host.end(), out.begin());
  } else if (used.dtype == DType::BF16) {
    // Widen on the device (exact: every bf16 is an fp32), then download.
    THPC_CHECK(widened != nullptr, "a bf16 download without a buffer to widen it in");
    ensure_capacity(backend, *widened, DType::F32, used.numel, false);
    const Tensor wide = widened->slice(0, used.numel);
    backend.copy(wide, used);
    backend.download(out.data(), wide);
  } else {
    THPC_CHECK(used.dtype == DType::F32, "rows in " << dtype_name(used.dtype));
    backend.download(out.data(), used);
  }
}

}  // namespace thpc
