// Incremental (KV-cache) decoding: the DecoderState (the caches, their reorder, each
// step's index plan) and the Transformer's steps through it, the decoder one position at
// a time for a beam of hypotheses (see docs/design-decoding.md, "Decoding").
#include "model/decoder_state.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
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
  for (IdBuffer* b : {&step_.uploaded, &source_lengths_, &best_columns_, &best_packed_}) {
    backend_.free_ids(b->ids);
  }
}

int64_t DecoderState::pool_rows() const {
  if (layers_.empty() || !layers_[0].self_kv) return 0;
  return layers_[0].self_kv.numel / kv_width();
}

void DecoderState::begin(int layers, const std::vector<int>& source_of, int max_len,
                         int sentences, int source_len,
                         const std::vector<int32_t>& source_lengths, int key_width,
                         int value_width, DType dtype) {
  const int H = static_cast<int>(source_of.size());
  THPC_CHECK(static_cast<int>(source_lengths.size()) == sentences,
             source_lengths.size() << " source lengths for " << sentences << " sentences");
  for (int h = 0; h < H; ++h) {
    THPC_CHECK(source_of[h] >= 0 && source_of[h] < sentences,
               "hypothesis " << h << " continues source " << source_of[h] << " of "
                             << sentences);
  }
  dtype_ = dtype;
  key_width_ = key_width;
  value_width_ = value_width;
  hypotheses_ = H;
  max_len_ = max_len;
  positions_ = 0;
  sentences_ = sentences;
  source_len_ = source_len;
  source_of_ = source_of;
  ensure_ids(backend_, source_lengths_, source_lengths);
  layers_.resize(layers);
  position_base_.assign(1, 0);
  prefix_rows_.assign(static_cast<size_t>(H) * max_len, 0);
  // Room for every position at this width; a kept pool of an earlier search serves as
  // it is. Never zeroed: the attention reads the rows each hypothesis lists, up to its
  // key length, and every one of those was written by a step (zeroing gigabytes of
  // cache, 400 hypotheses x 150 positions x 6 layers, cost the CPU a tenth of a short
  // decode in page clearing).
  for (LayerCache& cache : layers_) {
    ensure_capacity(backend_, cache.self_kv, dtype, int64_t(H) * max_len * kv_width(), false);
  }
}

void DecoderState::reorder(const std::vector<int>& parent) {
  const int H = static_cast<int>(parent.size());
  for (int h = 0; h < H; ++h) {
    THPC_CHECK(parent[h] >= 0 && parent[h] < hypotheses_,
               "hypothesis " << h << " continues " << parent[h] << " of " << hypotheses_);
  }
  // Nothing moves on the backend: each new hypothesis takes its parent's list of rows.
  prefix_rows_scratch_.resize(static_cast<size_t>(H) * max_len_);
  source_of_scratch_.resize(H);
  for (int h = 0; h < H; ++h) {
    std::copy_n(prefix_rows_.begin() + int64_t(parent[h]) * max_len_, positions_,
                prefix_rows_scratch_.begin() + int64_t(h) * max_len_);
    source_of_scratch_[h] = source_of_[parent[h]];
  }
  prefix_rows_.swap(prefix_rows_scratch_);
  source_of_.swap(source_of_scratch_);
  hypotheses_ = H;
}

void DecoderState::append_step_rows() {
  const int H = hypotheses_;
  const int position = positions_;
  const int64_t first = position_base_[position], end = first + H;
  // The pools hold the rows of every position so far; grown (rarely: the beam widening in
  // a batch larger than any before) to what the remaining positions need at this width,
  // the rows written so far copied over. Grown as soon as the remaining positions would
  // not fit, not when the next row would not: the first step at a new width, so that
  // the steps captured after it (Backend::capture) are not invalidated by a later growth.
  const int64_t rows = end + int64_t(H) * (max_len_ - position - 1);
  if (rows > pool_rows()) {
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
  plan.host_key_lengths.assign(H, position + 1);

  // Chunk c of hypothesis h's k|v: chunk q_chunks + c of q|k|v row h -> chunk c of pool
  // row position_base_[position] + h.
  const int chunk = std::gcd(key_width_, value_width_);
  const int q_chunks = key_width_ / chunk, kv_chunks = kv_width() / chunk;
  // The copies and the attention index rows and chunks in int32.
  const int64_t cache_rows = int64_t(position_base_[position]) + H;
  THPC_CHECK(cache_rows * kv_chunks <= INT32_MAX,
             "a decoding cache of " << cache_rows << " rows of " << kv_chunks
                                    << " chunks is more than int32 indices reach; decode in "
                                       "smaller batches (transformer_decode --batch-tokens)");
  append_step_rows();
  plan.host_to.clear();
  plan.host_from.clear();
  for (int h = 0; h < H; ++h) {
    const int64_t cache_row = position_base_[position] + h;
    for (int c = 0; c < kv_chunks; ++c) {
      plan.host_to.push_back(static_cast<int32_t>(cache_row * kv_chunks + c));
      plan.host_from.push_back(h * (q_chunks + kv_chunks) + q_chunks + c);
    }
  }

  // Encoder-decoder attention runs per source sentence: hypothesis h's query goes to
  // slot (source_of_[h], k), k counting that sentence's hypotheses, so that each
  // sentence's queries [slots, h*dk] attend over its own S encoder k|v (kept once per
  // sentence, not once per hypothesis).
  plan.filled_slots.assign(sentences_, 0);
  int slots = 1;
  for (int h = 0; h < H; ++h) slots = std::max(slots, ++plan.filled_slots[source_of_[h]]);
  std::fill(plan.filled_slots.begin(), plan.filled_slots.end(), 0);
  plan.host_slots.resize(H);
  for (int h = 0; h < H; ++h) {
    const int source = source_of_[h];
    plan.host_slots[h] = source * slots + plan.filled_slots[source]++;
  }
  plan.slots = slots;
  plan.every_slot_filled = H == sentences_ * slots;

  // One upload: the seven lists end to end, each then a pointer into the buffer.
  std::vector<int32_t>& all = plan.host_all;
  all.clear();
  const std::vector<int32_t> position_row = {position};
  const std::array<const std::vector<int32_t>*, 7> parts = {
      &tokens,           &plan.host_key_lengths, &plan.host_to, &plan.host_from,
      &plan.host_slots,  &prefix_rows_,          &position_row};
  std::array<size_t, 7> offsets{};
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
  plan.key_rows = base + offsets[5];
  plan.position = base + offsets[6];
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
  Sublayers sub(backend_, config_);
  const int kv_width = sub.h * (sub.dk + sub.dv);
  state.begin(config_.layers, source_of, max_len, s.batch_size, s.src_len, s.src_lengths_host,
              sub.h * sub.dk, sub.h * sub.dv, sub.act);
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
  return run_decode_step(state, tokens, nullptr);
}

Tensor Transformer::run_decode_step(DecoderState& state, const std::vector<int32_t>& tokens,
                                    const StepBestTokens* best) {
  State& s = *state_;
  const int position = state.positions();
  state.plan_step(tokens);
  s.step_arena.reset();
  Tensor logits;
  if (!backend_.can_capture(CaptureUse::kDecodingStep)) {
    logits = queue_decode_step(state, position, false, best);
  } else {
    logits = captured_decode_step(state, position, best);
  }
  state.positions_ = position + 1;
  return logits;
}

// Where the backend captures work (Backend::can_capture): the step run as train_step's
// pass is (run_capturable: the shape's first step uncaptured, its second captured, the
// later ones replayed). A step's work depends on its position only through
// the position table's row, which a captured step copies from the row the plan uploaded;
// everything else it reads is in the plan's upload, the caches or the arena, the same
// places for every step of a shape. After a replay the arena is put back where the
// captured step left it: what follows (row_top_k's outputs) takes from there.
Tensor Transformer::captured_decode_step(DecoderState& state, int position,
                                         const StepBestTokens* best) {
  State& s = *state_;
  const DecoderState::StepPlan& plan = state.step_;
  CapturedDecodeStep& step = lru_entry(
      captured_decode_steps_,
      CapturedDecodeKey{&state, state.hypotheses(), plan.slots, state.sentences_,
                        state.source_len_, state.max_len(), plan.every_slot_filled,
                        best != nullptr ? best->k : 0});
  Tensor logits;
  const CaptureRun run = run_capturable(
      step, [] {},  // the step arena was reset before: nothing to give back
      [&](bool captured) {
        // An uncaptured run after a refused capture starts from the arena's start again.
        if (!captured) s.step_arena.reset();
        logits = queue_decode_step(state, position, captured, best);
      });
  switch (run) {
    case CaptureRun::kReplayed:
      s.step_arena.restore(step.arena_after);
      return step.logits;
    case CaptureRun::kCaptured:
      step.logits = logits;
      step.arena_after = s.step_arena.mark();
      return logits;
    case CaptureRun::kUncaptured:
      break;
  }
  return logits;
}

// The decoder at `position` over the plan the step uploaded. position_from_plan: the
// position table's row copied from the plan's `position` index (a captured step, whose
// work must not depend on the host's position); else read at its offset. With `best`,
// the best tokens of each row after it (in a captured step's graph: one launch a step
// less).
Tensor Transformer::queue_decode_step(DecoderState& state, int position, bool position_from_plan,
                                      const StepBestTokens* best) {
  State& s = *state_;
  Sublayers sub(backend_, config_);
  const int H = state.hypotheses();
  const int d = config_.d_model;
  const DecoderState::StepPlan& plan = state.step_;
  Arena& arena = s.step_arena;

  // The token embedding at this position: the position table's row `position`.
  Tensor table = s.positions.value ? s.positions.value : s.sinusoid;
  Tensor position_row = table.slice(int64_t(position) * d, d);
  if (position_from_plan) {
    position_row = arena.take(table.dtype, d);
    backend_.copy_rows(position_row, nullptr, table, plan.position, 1, d);
  }
  Tensor x0 = arena.take(sub.act, int64_t(H) * d);
  backend_.embedding_forward(x0, plan.tokens, s.embedding.value, position_row, H, 1, d, vocab_,
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
  step.key_rows = plan.key_rows;
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
  Tensor logits = vocabulary_logits(arena, in.normed, H);
  backend_.log_softmax(logits, logits, H, vocab_);
  if (best != nullptr) {
    backend_.row_top_k(best->values, best->columns, logits, H, vocab_, best->k, ids_.pad,
                       ids_.bos);
  }
  return logits;
}

void Transformer::decode_step_log_probs(DecoderState& state, const std::vector<int32_t>& tokens,
                                        std::vector<float>& log_probs) {
  const Tensor rows = decode_step(state, tokens);
  download_rows_f32(rows, state.hypotheses(), vocab_, log_probs);
}

void Transformer::decode_step_best_tokens(DecoderState& state,
                                          const std::vector<int32_t>& tokens, int k,
                                          std::vector<float>& values,
                                          std::vector<int32_t>& best_tokens) {
  State& s = *state_;
  if (backend_.can_capture(CaptureUse::kDecodingStep) &&
      backend_.param_dtype() == DType::F32) {
    // Where steps are captured (a GPU's CUDA graphs): the top-k in the step's graph,
    // its values and columns in one buffer (the columns from a 256-byte boundary), read
    // back by one download: the device waits for the host once a step, not twice. The
    // buffer is sized before the step, so a replay finds it where its capture left it.
    const int64_t count = int64_t(tokens.size()) * k;
    const int64_t columns_at = (count + 63) / 64 * 64;
    ensure_id_capacity(backend_, state.best_packed_, columns_at + count);
    StepBestTokens best;
    best.k = k;
    best.values.data = state.best_packed_.ids;
    best.values.dtype = DType::F32;
    best.values.numel = count;
    best.columns = state.best_packed_.ids + columns_at;
    run_decode_step(state, tokens, &best);
    state.best_host_.resize(static_cast<size_t>(columns_at + count));
    backend_.download_ids(state.best_host_.data(), state.best_packed_.ids, columns_at + count);
    values.resize(static_cast<size_t>(count));
    std::memcpy(values.data(), state.best_host_.data(), sizeof(float) * values.size());
    best_tokens.assign(state.best_host_.begin() + columns_at,
                       state.best_host_.begin() + columns_at + count);
    return;
  }
  const Tensor rows = decode_step(state, tokens);
  const int H = state.hypotheses();
  // Ranked where the log-probabilities are (on the GPU: the device), so only [H, k]
  // values and columns come back instead of [H, vocab].
  const int64_t count = int64_t(H) * k;
  const Tensor best_values = s.step_arena.take(backend_.param_dtype(), count);
  ensure_id_capacity(backend_, state.best_columns_, count);
  backend_.row_top_k(best_values, state.best_columns_.ids, rows, H, vocab_, k, ids_.pad,
                     ids_.bos);
  download_rows_f32(best_values, H, k, values);
  best_tokens.resize(static_cast<size_t>(count));
  backend_.download_ids(best_tokens.data(), state.best_columns_.ids, count);
}

}  // namespace thpc
