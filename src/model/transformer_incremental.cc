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
       {&inc.self_cache, &inc.cross_kv, &inc.self_spare}) {
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
  inc.row_of.clear();
  for (int h = 0; h < H; ++h) {
    THPC_CHECK(source_of[h] >= 0 && source_of[h] < s.batch_size,
               "hypothesis " << h << " continues source " << source_of[h] << " of "
                             << s.batch_size);
    inc.row_of.push_back(h);
  }
  inc.cross_kv.resize(config_.layers);
  inc.self_cache.resize(config_.layers);
  for (int layer = 0; layer < config_.layers; ++layer) {
    const AttentionParams& p = s.decoder[layer].cross_attention;
    // The encoder's k|v once per source sentence, which all of its hypotheses read
    // (incremental_log_probs groups their queries by sentence).
    ensure_capacity(backend_, inc.cross_kv[layer], sub.act,
                    int64_t(s.batch_size) * S * kv_width, false);
    backend_.linear_forward(inc.cross_kv[layer], s.encoder_out, p.kv_weight.value,
                            p.kv_bias.value, s.batch_size * S, sub.d, kv_width);
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
  const int kv_width = sub.h * (sub.dk + sub.dv);
  for (int h = 0; h < H; ++h) {
    THPC_CHECK(parent[h] >= 0 && parent[h] < inc.hypotheses,
               "hypothesis " << h << " continues " << parent[h] << " of " << inc.hypotheses);
  }
  // Copies the positions written so far (0..filled-1, one k|v row each) of every
  // (from, to) pair of cache rows, from each layer's cache in `src` to the one in `dst`.
  auto copy_cache_rows = [&](std::vector<Tensor>& dst, const std::vector<Tensor>& src,
                             const std::vector<std::pair<int, int>>& moves) {
    std::vector<int32_t> to, from;
    for (const auto& [from_row, to_row] : moves) {
      for (int j = 0; j < inc.filled; ++j) {
        to.push_back(to_row * inc.max_len + j);
        from.push_back(from_row * inc.max_len + j);
      }
    }
    if (to.empty()) return;
    ensure_ids(backend_, inc.rows, to);
    ensure_ids(backend_, inc.from_rows, from);
    for (size_t layer = 0; layer < dst.size(); ++layer) {
      backend_.copy_rows(dst[layer], inc.rows.ids, src[layer], inc.from_rows.ids,
                         static_cast<int>(to.size()), kv_width);
    }
  };

  // In place whenever the cache has rows for H hypotheses (always, except when the beam
  // widens past what a batch used before): the new hypotheses take rows 0..H-1. Each
  // parent's first continuation keeps the parent's row when that row is among them;
  // every other continuation takes a row no one keeps. Copies read kept rows (never
  // written) or rows >= H (left behind), and write rows no one keeps: no copy reads
  // what another wrote. When sentences finish (H falls) only the rows of moved
  // hypotheses are copied, not every live row into a second cache, which would also be
  // fresh memory. (The encoder's k|v are per sentence and never move.)
  const int64_t self_rows_capacity =
      inc.self_cache.empty() ? 0 : inc.self_cache[0].numel / (int64_t(inc.max_len) * kv_width);
  if (H <= self_rows_capacity) {
    inc.source_of.resize(std::max(H, inc.hypotheses), -1);  // rows >= inc.hypotheses: empty
    std::vector<int> row_of(H, -1);
    std::vector<char> kept(H, 0);
    for (int h = 0; h < H; ++h) {
      const int row = inc.row_of[parent[h]];
      if (row < H && !kept[row]) {
        kept[row] = 1;
        row_of[h] = row;
      }
    }
    std::vector<std::pair<int, int>> moves;
    int free_row = 0;
    for (int h = 0; h < H; ++h) {
      if (row_of[h] >= 0) continue;
      const int from = inc.row_of[parent[h]];
      while (kept[free_row]) ++free_row;
      kept[free_row] = 1;
      row_of[h] = free_row;
      moves.push_back({from, free_row});
    }
    // A move's source row is kept or >= H, never a destination: source_of can be
    // updated in place.
    for (const auto& [from, to] : moves) inc.source_of[to] = inc.source_of[from];
    copy_cache_rows(inc.self_cache, inc.self_cache, moves);
    inc.source_of.resize(H);
    inc.hypotheses = H;
    inc.row_of = row_of;
    return;
  }

  // More hypotheses than the cache has rows for (the beam widens at the first step of a
  // batch larger than any before): gather every hypothesis' parent row into the spare
  // in hypothesis order, and swap the two.
  std::vector<std::pair<int, int>> moves;
  std::vector<int> source_of(H);
  for (int h = 0; h < H; ++h) {
    const int from = inc.row_of[parent[h]];
    moves.push_back({from, h});
    source_of[h] = inc.source_of[from];
  }
  inc.self_spare.resize(inc.self_cache.size());
  for (Tensor& spare : inc.self_spare) {
    ensure_capacity(backend_, spare, sub.act, int64_t(H) * inc.max_len * kv_width,
                    backend_.attention_reads_masked_keys());
  }
  copy_cache_rows(inc.self_spare, inc.self_cache, moves);
  std::swap(inc.self_cache, inc.self_spare);
  inc.source_of = source_of;
  inc.hypotheses = H;
  inc.row_of.resize(H);
  for (int h = 0; h < H; ++h) inc.row_of[h] = h;
}

Tensor Transformer::incremental_forward(const std::vector<int32_t>& tokens, int position) {
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
  for (int h = 0; h < H; ++h) row_tokens[inc.row_of[h]] = tokens[h];
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
  // Encoder-decoder attention runs per source sentence: cache row r's query goes to
  // slot (source_of[r], k), k counting that sentence's rows, so that each sentence's
  // queries [slots, h*dk] attend over its own S encoder k|v (kept once per sentence, not
  // once per hypothesis). Slots no row fills hold zero queries, whose outputs are unused.
  const int sources = s.batch_size, S = s.src_len;
  std::vector<int32_t> slot_of_row(H);
  std::vector<int> filled_slots(sources, 0);
  int slots = 1;
  for (int r = 0; r < H; ++r) slots = std::max(slots, ++filled_slots[inc.source_of[r]]);
  std::fill(filled_slots.begin(), filled_slots.end(), 0);
  for (int r = 0; r < H; ++r) {
    const int source = inc.source_of[r];
    slot_of_row[r] = source * slots + filled_slots[source]++;
  }
  ensure_ids(backend_, inc.cross_slots, slot_of_row);
  const bool every_slot_filled = H == sources * slots;
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

    // Encoder-decoder attention: each sentence's queries, in their slots, over its k|v.
    Tensor q = arena.take(sub.act, int64_t(H) * sub.h * sub.dk);
    backend_.linear_forward(q, a.norm1.y, p.cross_attention.in_weight.value,
                            p.cross_attention.in_bias.value, H, d, sub.h * sub.dk);
    Tensor q_slots = arena.take(sub.act, int64_t(sources) * slots * sub.h * sub.dk);
    if (!every_slot_filled) backend_.zero(q_slots);
    backend_.copy_rows(q_slots, inc.cross_slots.ids, q, nullptr, H, sub.h * sub.dk);
    AttentionShape cross_shape = attention_shape(config_, sources, slots, S, false,
                                                 s.src_lengths.ids, 0.0f, none);
    Tensor context_slots = arena.take(sub.act, int64_t(sources) * slots * sub.h * sub.dv);
    Tensor& kv = inc.cross_kv[layer];
    backend_.attention_forward(context_slots, Tensor{}, q_slots, sub.h * sub.dk, kv, kv_width,
                               kv.slice(v_off, kv.numel - v_off), kv_width, cross_shape);
    backend_.copy_rows(context, nullptr, context_slots, inc.cross_slots.ids, H,
                       sub.h * sub.dv);
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
  return logits;
}

void Transformer::incremental_log_probs(const std::vector<int32_t>& tokens, int position,
                                        std::vector<float>& log_probs) {
  State::Incremental& inc = state_->incremental;
  const Tensor rows = incremental_forward(tokens, position);
  const int H = inc.hypotheses;
  bool rows_in_order = true;
  for (int h = 0; h < H; ++h) rows_in_order = rows_in_order && inc.row_of[h] == h;
  if (rows_in_order) {
    download_rows_f32(rows, H, vocab_, log_probs);
    return;
  }
  std::vector<float>& by_row = inc.log_probs_by_row;
  download_rows_f32(rows, H, vocab_, by_row);
  log_probs.resize(by_row.size());
  for (int h = 0; h < H; ++h) {
    std::copy_n(by_row.begin() + int64_t(inc.row_of[h]) * vocab_, vocab_,
                log_probs.begin() + int64_t(h) * vocab_);
  }
}

void Transformer::incremental_best_tokens(const std::vector<int32_t>& tokens, int position,
                                          int k, std::vector<float>& values,
                                          std::vector<int32_t>& best_tokens) {
  State& s = *state_;
  State::Incremental& inc = s.incremental;
  const Tensor rows = incremental_forward(tokens, position);
  const int H = inc.hypotheses;
  // Ranked where the log-probabilities are (on the GPU: the device), so only [H, k]
  // values and columns come back instead of [H, vocab].
  const int64_t count = int64_t(H) * k;
  const Tensor best_values = s.step_arena.take(backend_.param_dtype(), count);
  ensure_id_capacity(backend_, inc.best_columns, count);
  backend_.row_top_k(best_values, inc.best_columns.ids, rows, H, vocab_, k, ids_.pad, ids_.bos);
  std::vector<float>& values_by_row = inc.best_values_by_row;
  download_rows_f32(best_values, H, k, values_by_row);
  std::vector<int32_t>& columns_by_row = inc.best_columns_by_row;
  columns_by_row.resize(static_cast<size_t>(count));
  backend_.download_ids(columns_by_row.data(), inc.best_columns.ids, count);
  values.resize(static_cast<size_t>(count));
  best_tokens.resize(static_cast<size_t>(count));
  for (int h = 0; h < H; ++h) {
    const int64_t from = int64_t(inc.row_of[h]) * k, to = int64_t(h) * k;
    std::copy_n(values_by_row.begin() + from, k, values.begin() + to);
    std::copy_n(columns_by_row.begin() + from, k, best_tokens.begin() + to);
  }
}

}  // namespace thpc
