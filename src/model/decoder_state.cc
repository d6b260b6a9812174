// Incremental (KV-cache) decoding: the DecoderState (the caches, their reorder, each
// step's index plan) and the Transformer's steps through it, the decoder one position at
// a time for a beam of hypotheses (see docs/design.md, "Decoding").
#include "model/decoder_state.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <numeric>
#include <utility>

#include "common/error.h"
#include "model/layer.h"
#include "model/transformer.h"
#include "model/transformer_state.h"

namespace thpc {

using namespace model_detail;

// ---------------------------------------------------------------------------------
// DecoderState

DecoderState::~DecoderState() {
  for (LayerCache& cache : layers_) {
    backend_.free(cache.self_kv);
    backend_.free(cache.cross_kv);
  }
  for (Tensor& spare : self_spare_) backend_.free(spare);
  for (IdBuffer* b : {&step_.uploaded, &source_lengths_, &moves_, &best_columns_}) {
    backend_.free_ids(b->ids);
  }
}

bool DecoderState::rows_in_order() const {
  for (int h = 0; h < hypotheses_; ++h) {
    if (row_of_[h] != h) return false;
  }
  return true;
}

int64_t DecoderState::pool_rows() const {
  if (layers_.empty() || !layers_[0].self_kv) return 0;
  return layers_[0].self_kv.numel / kv_width();
}

int64_t DecoderState::row_capacity() const { return pool_rows() / max_len_; }

void DecoderState::begin(int layers, const std::vector<int>& source_of, int max_len,
                         int sentences, int source_len,
                         const std::vector<int32_t>& source_lengths, int key_width,
                         int value_width, DType dtype, bool zero_new_caches) {
  const int H = static_cast<int>(source_of.size());
  THPC_CHECK(static_cast<int>(source_lengths.size()) == sentences,
             source_lengths.size() << " source lengths for " << sentences << " sentences");
  dtype_ = dtype;
  zero_new_caches_ = zero_new_caches;
  key_width_ = key_width;
  value_width_ = value_width;
  hypotheses_ = H;
  max_len_ = max_len;
  positions_ = 0;
  sentences_ = sentences;
  source_len_ = source_len;
  row_of_.clear();
  for (int h = 0; h < H; ++h) {
    THPC_CHECK(source_of[h] >= 0 && source_of[h] < sentences,
               "hypothesis " << h << " continues source " << source_of[h] << " of "
                             << sentences);
    row_of_.push_back(h);
  }
  source_of_row_ = source_of;
  ensure_ids(backend_, source_lengths_, source_lengths);
  layers_.resize(layers);
  shared_prefixes_ = backend_.attention_gathers_keys();
  position_base_.assign(1, 0);
  prefix_rows_.assign(static_cast<size_t>(H) * max_len, 0);
  for (LayerCache& cache : layers_) {
    // A backend whose attention reads the cache rows not yet written multiplies them by
    // probability 0, and 0 times uninitialised memory could be NaN: there a new cache is
    // zeroed once (a kept one holds finite values of an earlier batch, as good). The
    // CPU's reads only the rows written, and zeroing gigabytes of cache (400 hypotheses
    // x 150 positions x 6 layers) cost it a tenth of a short decode in page clearing.
    ensure_capacity(backend_, cache.self_kv, dtype, int64_t(H) * max_len * kv_width(),
                    zero_new_caches);
  }
}

void DecoderState::copy_cache_rows(bool into_spare,
                                   const std::vector<std::pair<int, int>>& moves) {
  // One upload: the destination rows, then the source rows.
  moves_host_.clear();
  for (const auto& [from_row, to_row] : moves) {
    for (int j = 0; j < positions_; ++j) moves_host_.push_back(to_row * max_len_ + j);
  }
  const size_t count = moves_host_.size();
  if (count == 0) return;
  for (const auto& [from_row, to_row] : moves) {
    for (int j = 0; j < positions_; ++j) moves_host_.push_back(from_row * max_len_ + j);
  }
  ensure_ids(backend_, moves_, moves_host_);
  for (size_t layer = 0; layer < layers_.size(); ++layer) {
    Tensor dst = into_spare ? self_spare_[layer] : layers_[layer].self_kv;
    backend_.copy_rows(dst, moves_.ids, layers_[layer].self_kv, moves_.ids + count,
                       static_cast<int>(count), kv_width());
  }
}

void DecoderState::reorder_shared_prefixes(const std::vector<int>& parent) {
  const int H = static_cast<int>(parent.size());
  prefix_rows_scratch_.resize(static_cast<size_t>(H) * max_len_);
  std::vector<int> source_of_row(H);
  for (int h = 0; h < H; ++h) {
    std::copy_n(prefix_rows_.begin() + int64_t(parent[h]) * max_len_, positions_,
                prefix_rows_scratch_.begin() + int64_t(h) * max_len_);
    source_of_row[h] = source_of_row_[parent[h]];
  }
  prefix_rows_.swap(prefix_rows_scratch_);
  source_of_row_ = source_of_row;
  hypotheses_ = H;
  row_of_.resize(H);
  for (int h = 0; h < H; ++h) row_of_[h] = h;
}

void DecoderState::reorder(const std::vector<int>& parent) {
  const int H = static_cast<int>(parent.size());
  for (int h = 0; h < H; ++h) {
    THPC_CHECK(parent[h] >= 0 && parent[h] < hypotheses_,
               "hypothesis " << h << " continues " << parent[h] << " of " << hypotheses_);
  }
  if (shared_prefixes_) {  // nothing moves: each takes its parent's list of rows
    reorder_shared_prefixes(parent);
    return;
  }
  // In place whenever the cache has rows for H hypotheses (always, except when the beam
  // widens past what a batch used before): the new hypotheses take rows 0..H-1. Each
  // parent's first continuation keeps the parent's row when that row is among them;
  // every other continuation takes a row no one keeps. Copies read kept rows (never
  // written) or rows >= H (left behind), and write rows no one keeps: no copy reads
  // what another wrote. When sentences finish (H falls) only the rows of moved
  // hypotheses are copied, not every live row into a second cache, which would also be
  // fresh memory. (The encoder's k|v are per sentence and never move.)
  if (H <= row_capacity()) {
    source_of_row_.resize(std::max(H, hypotheses_), -1);  // rows >= hypotheses_: empty
    std::vector<int> row_of(H, -1);
    std::vector<char> kept(H, 0);
    for (int h = 0; h < H; ++h) {
      const int row = row_of_[parent[h]];
      if (row < H && !kept[row]) {
        kept[row] = 1;
        row_of[h] = row;
      }
    }
    std::vector<std::pair<int, int>> moves;
    int free_row = 0;
    for (int h = 0; h < H; ++h) {
      if (row_of[h] >= 0) continue;
      const int from = row_of_[parent[h]];
      while (kept[free_row]) ++free_row;
      kept[free_row] = 1;
      row_of[h] = free_row;
      moves.push_back({from, free_row});
    }
    // A move's source row is kept or >= H, never a destination: source_of_row_ can be
    // updated in place.
    for (const auto& [from, to] : moves) source_of_row_[to] = source_of_row_[from];
    copy_cache_rows(/*into_spare=*/false, moves);
    source_of_row_.resize(H);
    hypotheses_ = H;
    row_of_ = row_of;
    return;
  }

  // More hypotheses than the cache has rows for (the beam widens at the first step of a
  // batch larger than any before): gather every hypothesis' parent row into the spare
  // in hypothesis order, and swap the two.
  std::vector<std::pair<int, int>> moves;
  std::vector<int> source_of_row(H);
  for (int h = 0; h < H; ++h) {
    const int from = row_of_[parent[h]];
    moves.push_back({from, h});
    source_of_row[h] = source_of_row_[from];
  }
  self_spare_.resize(layers_.size());
  for (Tensor& spare : self_spare_) {
    ensure_capacity(backend_, spare, dtype_, int64_t(H) * max_len_ * kv_width(),
                    zero_new_caches_);
  }
  copy_cache_rows(/*into_spare=*/true, moves);
  for (size_t layer = 0; layer < layers_.size(); ++layer) {
    std::swap(layers_[layer].self_kv, self_spare_[layer]);
  }
  source_of_row_ = source_of_row;
  hypotheses_ = H;
  row_of_.resize(H);
  for (int h = 0; h < H; ++h) row_of_[h] = h;
}

void DecoderState::plan_shared_prefix_rows() {
  const int H = hypotheses_;
  const int position = positions_;
  const int64_t first = position_base_[position], end = first + H;
  // The pools hold the rows of every position so far; grown (rarely: the beam widening in
  // a batch larger than any before) to what the remaining positions need at this width,
  // the rows written so far copied over.
  if (end > pool_rows()) {
    const int64_t rows = end + int64_t(H) * (max_len_ - position - 1);
    for (LayerCache& cache : layers_) {
      Tensor grown = backend_.alloc(dtype_, rows * kv_width());
      if (first > 0) {
        backend_.copy_rows(grown, nullptr, cache.self_kv, nullptr, static_cast<int>(first),
                           kv_width());
      }
      backend_.free(cache.self_kv);
      cache.self_kv = grown;
    }
  }
  for (int h = 0; h < H; ++h) {
    prefix_rows_[int64_t(h) * max_len_ + position] = static_cast<int32_t>(first + h);
  }
  position_base_.resize(position + 2);
  position_base_[position + 1] = static_cast<int32_t>(end);
}

void DecoderState::plan_step(const std::vector<int32_t>& tokens) {
  const int H = hypotheses_;
  const int position = positions_;
  THPC_CHECK(static_cast<int>(tokens.size()) == H,
             tokens.size() << " tokens for " << H << " hypotheses");
  THPC_CHECK(position < max_len_,
             "position " << position << " outside the cache of " << max_len_);
  StepPlan& plan = step_;
  // The decoder runs over cache rows; tokens and outputs are per hypothesis.
  plan.host_tokens.resize(H);
  for (int h = 0; h < H; ++h) plan.host_tokens[row_of_[h]] = tokens[h];
  plan.host_key_lengths.assign(H, position + 1);

  // Chunk c of row r's k|v: chunk q_chunks + c of q|k|v row r -> chunk c of its cache
  // row: shared prefixes, pool row position_base_[position] + r; rows, (r, position).
  const int chunk = std::gcd(key_width_, value_width_);
  const int q_chunks = key_width_ / chunk, kv_chunks = kv_width() / chunk;
  // The copies and the attention index rows and chunks in int32 (either layout).
  const int64_t cache_rows =
      shared_prefixes_ ? int64_t(position_base_[position]) + H : int64_t(H) * max_len_;
  THPC_CHECK(cache_rows * kv_chunks <= INT32_MAX,
             "a decoding cache of " << cache_rows << " rows of " << kv_chunks
                                    << " chunks is more than int32 indices reach; decode in "
                                       "smaller batches (transformer_decode --batch-tokens)");
  if (shared_prefixes_) plan_shared_prefix_rows();
  plan.host_to.clear();
  plan.host_from.clear();
  for (int r = 0; r < H; ++r) {
    const int64_t cache_row = shared_prefixes_ ? position_base_[position] + r
                                               : int64_t(r) * max_len_ + position;
    for (int c = 0; c < kv_chunks; ++c) {
      plan.host_to.push_back(static_cast<int32_t>(cache_row * kv_chunks + c));
      plan.host_from.push_back(r * (q_chunks + kv_chunks) + q_chunks + c);
    }
  }

  // Encoder-decoder attention runs per source sentence: cache row r's query goes to
  // slot (source_of_row_[r], k), k counting that sentence's rows, so that each
  // sentence's queries [slots, h*dk] attend over its own S encoder k|v (kept once per
  // sentence, not once per hypothesis).
  plan.filled_slots.assign(sentences_, 0);
  int slots = 1;
  for (int r = 0; r < H; ++r) slots = std::max(slots, ++plan.filled_slots[source_of_row_[r]]);
  std::fill(plan.filled_slots.begin(), plan.filled_slots.end(), 0);
  plan.host_slots.resize(H);
  for (int r = 0; r < H; ++r) {
    const int source = source_of_row_[r];
    plan.host_slots[r] = source * slots + plan.filled_slots[source]++;
  }
  plan.slots = slots;
  plan.every_slot_filled = H == sentences_ * slots;

  // One upload: the six lists end to end, each then a pointer into the buffer.
  std::vector<int32_t>& all = plan.host_all;
  all.clear();
  const std::vector<int32_t> none;
  const std::array<const std::vector<int32_t>*, 6> parts = {
      &plan.host_tokens, &plan.host_key_lengths, &plan.host_to,
      &plan.host_from,   &plan.host_slots,       shared_prefixes_ ? &prefix_rows_ : &none};
  std::array<size_t, 6> offsets{};
  for (size_t i = 0; i < parts.size(); ++i) {
    offsets[i] = all.size();
    all.insert(all.end(), parts[i]->begin(), parts[i]->end());
  }
  ensure_ids(backend_, plan.uploaded, all);
  const int32_t* base = plan.uploaded.ids;
  plan.tokens = base + offsets[0];
  plan.key_lengths = base + offsets[1];
  plan.append_to = base + offsets[2];
  plan.append_from = base + offsets[3];
  plan.cross_slots = base + offsets[4];
  plan.key_rows = shared_prefixes_ ? base + offsets[5] : nullptr;
}

// ---------------------------------------------------------------------------------
// The Transformer's decoding steps

void Transformer::begin_decoding(DecoderState& state, const std::vector<int>& source_of,
                                 int max_len) {
  State& s = *state_;
  THPC_CHECK(s.encoder_out, "begin_decoding() before encode()");
  THPC_CHECK(max_len >= 1 && max_len <= config_.max_positions,
             "incremental decoding of " << max_len << " positions (model.max_positions = "
                                        << config_.max_positions << ")");
  Sublayers sub = sublayers_for(backend_, config_);
  const int kv_width = sub.h * (sub.dk + sub.dv);
  state.begin(config_.layers, source_of, max_len, s.batch_size, s.src_len, s.src_lengths_host,
              sub.h * sub.dk, sub.h * sub.dv, sub.act, backend_.attention_reads_masked_keys());
  for (int layer = 0; layer < config_.layers; ++layer) {
    const AttentionParams& p = s.decoder[layer].cross_attention;
    // The encoder's k|v once per source sentence, which all of its hypotheses read
    // (each step groups their queries by sentence).
    Tensor& kv = state.layers_[layer].cross_kv;
    ensure_capacity(backend_, kv, sub.act, int64_t(s.batch_size) * s.src_len * kv_width, false);
    backend_.linear_forward(kv, s.encoder_out, p.kv_weight.value, p.kv_bias.value,
                            s.batch_size * s.src_len, sub.d, kv_width);
  }
}

Tensor Transformer::decode_step(DecoderState& state, const std::vector<int32_t>& tokens) {
  State& s = *state_;
  Sublayers sub = sublayers_for(backend_, config_);
  const int H = state.hypotheses();
  const int d = config_.d_model;
  const int position = state.positions();
  state.plan_step(tokens);
  const DecoderState::StepPlan& plan = state.step_;
  Arena& arena = s.step_arena;
  arena.reset();

  // The token embedding at this position: the position table's row `position`.
  Tensor table = s.positions.value ? s.positions.value : s.sinusoid;
  Tensor x0 = arena.take(sub.act, int64_t(H) * d);
  backend_.embedding_forward(x0, plan.tokens, s.embedding.value,
                             table.slice(int64_t(position) * d, d), H, 1, d, vocab_,
                             std::sqrt(static_cast<float>(d)));

  DecodingStep step;
  step.rows = H;
  step.max_len = state.max_len();
  step.chunk = std::gcd(state.key_width_, state.value_width_);
  step.append_to = plan.append_to;
  step.append_from = plan.append_from;
  step.append_count = static_cast<int>(plan.host_to.size());
  step.sentences = state.sentences_;
  step.slots = plan.slots;
  step.cross_slots = plan.cross_slots;
  step.every_slot_filled = plan.every_slot_filled;
  step.key_rows = plan.key_rows;  // null without shared prefixes (plan_step)
  // One position per hypothesis, no dropout; the self-attention attends over the cache
  // (positions 0..position, the rows beyond masked by the key lengths).
  LayerPass pass;
  pass.part = SitePart::Decoder;
  pass.batch = H;
  pass.len = 1;
  pass.lengths = plan.key_lengths;
  pass.keep_probabilities = false;
  pass.memory_len = state.source_len_;
  pass.memory_lengths = state.source_lengths_.ids;
  pass.step = &step;
  AddNormActs lead;
  LayerInput in = sub.stack_input(lead, arena, x0, s.decoder[0].norm1, H);
  for (int layer = 0; layer < config_.layers; ++layer) {
    LayerActs a;
    layer_forward(sub, a, arena, in, s.decoder[layer], norm_after(s.decoder, s.decoder_norm, layer),
                  pass, layer, &state.layers_[layer]);
    in = sub.after(a.last());
  }
  state.positions_ = position + 1;
  Tensor logits = vocabulary_logits(arena, in.normed, H);
  backend_.log_softmax(logits, logits, H, vocab_);
  return logits;
}

void Transformer::decode_step_log_probs(DecoderState& state, const std::vector<int32_t>& tokens,
                                        std::vector<float>& log_probs) {
  const Tensor rows = decode_step(state, tokens);
  const int H = state.hypotheses();
  if (state.rows_in_order()) {
    download_rows_f32(rows, H, vocab_, log_probs);
    return;
  }
  std::vector<float>& by_row = state.log_probs_by_row_;
  download_rows_f32(rows, H, vocab_, by_row);
  log_probs.resize(by_row.size());
  for (int h = 0; h < H; ++h) {
    std::copy_n(by_row.begin() + int64_t(state.row_of_[h]) * vocab_, vocab_,
                log_probs.begin() + int64_t(h) * vocab_);
  }
}

void Transformer::decode_step_best_tokens(DecoderState& state,
                                          const std::vector<int32_t>& tokens, int k,
                                          std::vector<float>& values,
                                          std::vector<int32_t>& best_tokens) {
  State& s = *state_;
  const Tensor rows = decode_step(state, tokens);
  const int H = state.hypotheses();
  // Ranked where the log-probabilities are (on the GPU: the device), so only [H, k]
  // values and columns come back instead of [H, vocab].
  const int64_t count = int64_t(H) * k;
  const Tensor best_values = s.step_arena.take(backend_.param_dtype(), count);
  ensure_id_capacity(backend_, state.best_columns_, count);
  backend_.row_top_k(best_values, state.best_columns_.ids, rows, H, vocab_, k, ids_.pad,
                     ids_.bos);
  std::vector<float>& values_by_row = state.best_values_by_row_;
  download_rows_f32(best_values, H, k, values_by_row);
  std::vector<int32_t>& columns_by_row = state.best_columns_by_row_;
  columns_by_row.resize(static_cast<size_t>(count));
  backend_.download_ids(columns_by_row.data(), state.best_columns_.ids, count);
  values.resize(static_cast<size_t>(count));
  best_tokens.resize(static_cast<size_t>(count));
  for (int h = 0; h < H; ++h) {
    const int64_t from = int64_t(state.row_of_[h]) * k, to = int64_t(h) * k;
    std::copy_n(values_by_row.begin() + from, k, values.begin() + to);
    std::copy_n(columns_by_row.begin() + from, k, best_tokens.begin() + to);
  }
}

}  // namespace thpc
