// Incremental (KV-cache) decoding: the decoder one position at a time for a beam of
// hypotheses, each layer's past keys/values kept per hypothesis and reordered as the
// beam search reorders hypotheses (see docs/design.md, "Decoding").
#include <cmath>

#include "common/error.h"
#include "model/sublayers.h"
#include "model/transformer.h"
#include "model/transformer_state.h"

namespace thpc {

using namespace model_detail;

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

