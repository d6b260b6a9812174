// Incremental (KV-cache) decoding: the decoder one position at a time for a beam of
// hypotheses, each layer's past keys/values kept per hypothesis and reordered as the
// beam search reorders hypotheses (see docs/design.md, "Decoding").
#include <algorithm>
#include <cmath>
#include <numeric>
#include <utility>

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
  inc.filled = 0;
  inc.row_of.clear();
}

namespace {

// Makes `buffer` hold at least `numel` elements: kept when it does (what it holds stays),
// else replaced by a new buffer, zeroed when `zero_new`.
void ensure_capacity(Backend& backend, Tensor& buffer, DType dtype, int64_t numel,
                     bool zero_new) {
  if (buffer && buffer.numel >= numel) return;
  if (buffer) backend.free(buffer);
  buffer = backend.alloc(dtype, numel);
  if (zero_new) backend.zero(buffer);
}

}  // namespace

void Transformer::begin_incremental(const std::vector<int>& source_of, int max_len) {
  State& s = *state_;
  State::Incremental& inc = s.incremental;
  THPC_CHECK(s.encoder_out, "begin_incremental() before encode()");
  THPC_CHECK(max_len >= 1 && max_len <= config_.max_positions,
             "incremental decoding of " << max_len << " positions (model.max_positions = "
                                        << config_.max_positions << ")");
  Sublayers sub = sublayers_for(backend_, config_);
  const int H = static_cast<int>(source_of.size());
  const int S = s.src_len;
  const int kv_width = sub.h * (sub.dk + sub.dv);
  inc.hypotheses = H;
  inc.max_len = max_len;
  inc.filled = 0;
  // Which encoder rows each hypothesis reads: hypothesis h, key j <- row source*S + j.
  std::vector<int32_t> rows;
  inc.cross_lengths_host.clear();
  inc.row_of.clear();
  for (int h = 0; h < H; ++h) {
    THPC_CHECK(source_of[h] >= 0 && source_of[h] < s.batch_size,
               "hypothesis " << h << " continues source " << source_of[h] << " of "
                             << s.batch_size);
    for (int j = 0; j < S; ++j) rows.push_back(source_of[h] * S + j);
    inc.cross_lengths_host.push_back(s.src_lengths_host[source_of[h]]);
    inc.row_of.push_back(h);
  }
  ensure_ids(backend_, inc.rows, rows);
  ensure_ids(backend_, inc.cross_lengths, inc.cross_lengths_host);
  Arena& arena = s.step_arena;
  arena.reset();
  inc.cross_kv.resize(config_.layers);
  inc.self_cache.resize(config_.layers);
  for (int layer = 0; layer < config_.layers; ++layer) {
    const AttentionParams& p = s.decoder[layer].cross_attention;
    // The encoder's k|v once per source, then one copy per hypothesis.
    Tensor per_source = arena.take(sub.act, int64_t(s.batch_size) * S * kv_width);
    backend_.linear_forward(per_source, s.encoder_out, p.kv_weight.value, p.kv_bias.value,
                            s.batch_size * S, sub.d, kv_width);
    ensure_capacity(backend_, inc.cross_kv[layer], sub.act, int64_t(H) * S * kv_width, false);
    backend_.copy_rows(inc.cross_kv[layer], nullptr, per_source, inc.rows.ids, H * S, kv_width);
    // A backend whose attention reads the cache rows not yet written multiplies them by
    // probability 0, and 0 times uninitialised memory could be NaN: there a new cache is
    // zeroed once (a kept one holds finite values of an earlier batch, as good). The
    // CPU's reads only the rows written, and zeroing gigabytes of cache (400 hypotheses
    // x 150 positions x 6 layers) cost it a tenth of a short decode in page clearing.
    ensure_capacity(backend_, inc.self_cache[layer], sub.act, int64_t(H) * max_len * kv_width,
                    backend_.attention_reads_masked_keys());
  }
  inc.source_of = source_of;
}

void Transformer::reorder_incremental(const std::vector<int>& parent) {
  State& s = *state_;
  State::Incremental& inc = s.incremental;
  Sublayers sub = sublayers_for(backend_, config_);
  const int H = static_cast<int>(parent.size());
  const int S = s.src_len;
  const int kv_width = sub.h * (sub.dk + sub.dv);
  for (int h = 0; h < H; ++h) {
    THPC_CHECK(parent[h] >= 0 && parent[h] < inc.hypotheses,
               "hypothesis " << h << " continues " << parent[h] << " of " << inc.hypotheses);
  }
  const int self_width = kv_width;  // the self-attention cache keeps k|v, not q
  const int self_rows_used = inc.filled;  // positions 0..filled-1 of each row are read
  // Copies rows_used rows of every (from, to) cache-row pair within each layer's buffers.
  auto copy_blocks = [&](std::vector<Tensor>& dst, const std::vector<Tensor>& src,
                         const std::vector<std::pair<int, int>>& moves, int rows_per_row,
                         int rows_used, int width) {
    std::vector<int32_t> to, from;
    for (const auto& [from_row, to_row] : moves) {
      for (int j = 0; j < rows_used; ++j) {
        to.push_back(to_row * rows_per_row + j);
        from.push_back(from_row * rows_per_row + j);
      }
    }
    if (to.empty()) return;
    ensure_ids(backend_, inc.rows, to);
    ensure_ids(backend_, inc.from_rows, from);
    for (size_t layer = 0; layer < dst.size(); ++layer) {
      backend_.copy_rows(dst[layer], inc.rows.ids, src[layer], inc.from_rows.ids,
                         static_cast<int>(to.size()), width);
    }
  };

  // In place whenever the caches have rows for H hypotheses (always, except when the
  // beam widens past what a batch used before): the new hypotheses take rows 0..H-1.
  // Each parent's first continuation keeps the parent's row when that row is among
  // them; every other continuation takes a row no one keeps, of the same sentence when
  // there is one (its encoder k|v then stay too). Copies read kept rows (never written)
  // or rows >= H (left behind), and write rows no one keeps: no copy reads what another
  // wrote. When sentences finish (H falls) only the rows of moved hypotheses are copied,
  // not every live row into a second cache, which would also be fresh memory.
  const int64_t self_rows_capacity = inc.self_cache.empty()
                                         ? 0 : inc.self_cache[0].numel / (int64_t(inc.max_len) * self_width);
  const int64_t cross_rows_capacity = inc.cross_kv.empty()
                                          ? 0 : inc.cross_kv[0].numel / (int64_t(S) * kv_width);
  if (H <= self_rows_capacity && H <= cross_rows_capacity) {
    const int rows = std::max(H, inc.hypotheses);  // rows >= inc.hypotheses hold nothing
    inc.source_of.resize(rows, -1);
    inc.cross_lengths_host.resize(rows, 0);
    std::vector<int> row_of(H, -1);
    std::vector<char> kept(H, 0);
    for (int h = 0; h < H; ++h) {
      const int row = inc.row_of[parent[h]];
      if (row < H && !kept[row]) {
        kept[row] = 1;
        row_of[h] = row;
      }
    }
    std::vector<std::pair<int, int>> self_moves, cross_moves;
    for (int h = 0; h < H; ++h) {
      if (row_of[h] >= 0) continue;
      const int from = inc.row_of[parent[h]];
      int to = -1;
      for (int row = 0; row < H && to < 0; ++row) {
        if (!kept[row] && inc.source_of[row] == inc.source_of[from]) to = row;
      }
      for (int row = 0; row < H && to < 0; ++row) {
        if (!kept[row]) to = row;
      }
      kept[to] = 1;
      row_of[h] = to;
      self_moves.push_back({from, to});
      if (inc.source_of[to] != inc.source_of[from]) {
        cross_moves.push_back({from, to});
        inc.source_of[to] = inc.source_of[from];
        inc.cross_lengths_host[to] = inc.cross_lengths_host[from];
      }
    }
    copy_blocks(inc.self_cache, inc.self_cache, self_moves, inc.max_len, self_rows_used,
                self_width);
    copy_blocks(inc.cross_kv, inc.cross_kv, cross_moves, S, S, kv_width);
    const bool shrinks = H < inc.hypotheses;
    inc.source_of.resize(H);
    inc.cross_lengths_host.resize(H);
    if (!cross_moves.empty() || shrinks) ensure_ids(backend_, inc.cross_lengths, inc.cross_lengths_host);
    inc.hypotheses = H;
    inc.row_of = row_of;
    return;
  }

  // More hypotheses than the caches have rows for (the beam widens at the first step of
  // a batch larger than any before): gather every hypothesis' parent rows, self and encoder k|v, into the
  // spares in hypothesis order, and swap the two.
  std::vector<std::pair<int, int>> moves;
  std::vector<int> source_of(H);
  std::vector<int32_t> lengths(H);
  for (int h = 0; h < H; ++h) {
    const int from = inc.row_of[parent[h]];
    moves.push_back({from, h});
    source_of[h] = inc.source_of[from];
    lengths[h] = inc.cross_lengths_host[from];
  }
  auto gather = [&](std::vector<Tensor>& caches, std::vector<Tensor>& spares,
                    int rows_per_row, int rows_used, int width, bool zero_new) {
    spares.resize(caches.size());
    for (Tensor& spare : spares) {
      ensure_capacity(backend_, spare, sub.act, int64_t(H) * rows_per_row * width, zero_new);
    }
    copy_blocks(spares, caches, moves, rows_per_row, rows_used, width);
    std::swap(caches, spares);
  };
  gather(inc.self_cache, inc.self_spare, inc.max_len, self_rows_used, self_width,
         backend_.attention_reads_masked_keys());
  // Every row of the encoder's k|v is rewritten (S rows each), so a new spare needs no zeroing.
  gather(inc.cross_kv, inc.cross_spare, S, S, kv_width, false);
  inc.cross_lengths_host = lengths;
  ensure_ids(backend_, inc.cross_lengths, inc.cross_lengths_host);
  inc.source_of = source_of;
  inc.hypotheses = H;
  inc.row_of.resize(H);
  for (int h = 0; h < H; ++h) inc.row_of[h] = h;
}

void Transformer::incremental_log_probs(const std::vector<int32_t>& tokens, int position,
                                        std::vector<float>& log_probs) {
  State& s = *state_;
  State::Incremental& inc = s.incremental;
  Sublayers sub = sublayers_for(backend_, config_);
  const int H = inc.hypotheses;
  const int d = config_.d_model;
  const int width = sub.qkv_width();
  const int kv_width = sub.h * (sub.dk + sub.dv);
  // The cache keeps each position's k|v (kv_width), not its q: a third less memory to
  // fill and to move when the beam reorders. copy_rows copies whole rows, so a q|k|v row
  // is cut into chunks of `chunk` elements, its k|v being the last kv_chunks of them.
  const int chunk = std::gcd(sub.h * sub.dk, sub.h * sub.dv);
  const int q_chunks = sub.h * sub.dk / chunk, kv_chunks = kv_width / chunk;
  THPC_CHECK(static_cast<int>(tokens.size()) == H,
             tokens.size() << " tokens for " << H << " hypotheses");
  THPC_CHECK(position >= 0 && position < inc.max_len,
             "position " << position << " outside the cache of " << inc.max_len);
  Arena& arena = s.step_arena;
  arena.reset();
  // The decoder runs over cache rows; tokens and log-probabilities are per hypothesis.
  std::vector<int32_t> row_tokens(H);
  bool rows_in_order = true;
  for (int h = 0; h < H; ++h) {
    row_tokens[inc.row_of[h]] = tokens[h];
    rows_in_order = rows_in_order && inc.row_of[h] == h;
  }
  ensure_ids(backend_, s.tgt_in, row_tokens);
  ensure_ids(backend_, inc.self_lengths, std::vector<int32_t>(H, position + 1));

  // The token embedding at this position: the position table's row `position`.
  Tensor table = s.positions.value ? s.positions.value : s.sinusoid;
  Tensor x = arena.take(sub.act, int64_t(H) * d);
  backend_.embedding_forward(x, s.tgt_in.ids, s.embedding.value,
                             table.slice(int64_t(position) * d, d), H, 1, d, vocab_,
                             std::sqrt(static_cast<float>(d)));
  // Chunk c of row h's k|v: chunk q_chunks + c of qkv row h -> chunk c of cache row
  // (h, position).
  std::vector<int32_t> append_to, append_from;
  for (int h = 0; h < H; ++h) {
    for (int c = 0; c < kv_chunks; ++c) {
      append_to.push_back((h * inc.max_len + position) * kv_chunks + c);
      append_from.push_back(h * (q_chunks + kv_chunks) + q_chunks + c);
    }
  }
  ensure_ids(backend_, inc.rows, append_to);
  ensure_ids(backend_, inc.from_rows, append_from);
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
    backend_.copy_rows(cache, inc.rows.ids, qkv, inc.from_rows.ids, H * kv_chunks, chunk);
    AttentionShape self_shape = attention_shape(config_, H, 1, inc.max_len, false,
                                                inc.self_lengths.ids, 0.0f, none);
    Tensor context = arena.take(sub.act, int64_t(H) * sub.h * sub.dv);
    const int64_t v_off = int64_t(sub.h) * sub.dk;  // v's offset in a k|v row
    backend_.attention_forward(context, Tensor{}, qkv, width, cache, kv_width,
                               cache.slice(v_off, cache.numel - v_off), kv_width, self_shape);
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
                               kv.slice(v_off, kv.numel - v_off), kv_width, cross_shape);
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
  if (rows_in_order) {
    download_rows_f32(logits, H, vocab_, log_probs);
    return;
  }
  std::vector<float>& by_row = inc.log_probs_by_row;
  download_rows_f32(logits, H, vocab_, by_row);
  log_probs.resize(by_row.size());
  for (int h = 0; h < H; ++h) {
    std::copy_n(by_row.begin() + int64_t(inc.row_of[h]) * vocab_, vocab_,
                log_probs.begin() + int64_t(h) * vocab_);
  }
}

}  // namespace thpc

