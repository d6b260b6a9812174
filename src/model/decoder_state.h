// The decoder's memory during a search (incremental decoding): per layer, the keys and
// values of every position fed so far, and where each hypothesis finds its own.
//
// A search step hands over, for every new hypothesis, the hypothesis of the previous
// step it extends (its parent) and the token it appended. reorder(parents) brings the
// caches to the new hypotheses, as CTranslate2 gathers its decoder state by the beam's
// parent indices; Transformer::decode_step then feeds the tokens at the next position,
// reading and extending the caches (through the same decoder layer function training
// runs: model/layer.h). Transformer::begin_decoding starts a search from the last
// encode().
//
// Two layouts of the self-attention cache, by the backend:
//   shared prefixes (Backend::attention_gathers_keys(): the CPU and CUDA, whose gathered
//     attention kernel is the default since its H100 run of 2026-11-26): a pool of rows, where
//     each step appends one row per hypothesis after the last step's. A hypothesis
//     holds the row of each of its positions (its prefix's, written by its ancestors);
//     reorder hands each new hypothesis its parent's list, moving no key or value, and
//     the attention gathers the rows it lists (AttentionShape::key_rows). The beam's
//     hypotheses share most of their prefixes: one copy of each, read from the CPU's
//     cache by the hypotheses after the first.
//   rows (a backend whose attention cannot gather keys; none of ours now, the tests'
//     stand-in keeps it checked): cache row r holds a hypothesis' positions
//     0..max_len-1; reorder copies the rows of the continuations that cannot stay in
//     their parent's row.
//
// An ensemble (decode/ensemble.h) keeps one DecoderState per model and reorders all of
// them by the same parents; it reads each state's own row_of() when it adds the models'
// decode_step outputs, so states whose caches have different row counts (models of other
// sizes) need not keep one row order.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "kernels/ops.h"
#include "model/device_buffers.h"

namespace thpc {

class Transformer;

// One decoder layer's cache, which the layer reads and extends when it runs on a
// decoding step (model_detail::layer_forward).
struct LayerCache {
  // The self-attention's k|v of every position fed so far, [rows, h(dk + dv)]: shared
  // prefixes, the rows of position t at DecoderState's position_base_[t] + hypothesis;
  // rows layout, cache row r's position t at r * max_len + t. A position's q is used
  // once, when it is fed, and not kept.
  Tensor self_kv;
  // The cross-attention's k|v of each source sentence's encoder output:
  // [sentences * S, h(dk + dv)], computed once per search and read by every hypothesis
  // of the sentence; it never moves when the beam reorders.
  Tensor cross_kv;
};

class DecoderState {
 public:
  explicit DecoderState(Backend& backend) : backend_(backend) {}
  ~DecoderState();
  DecoderState(const DecoderState&) = delete;
  DecoderState& operator=(const DecoderState&) = delete;

  // The next step's hypothesis h extends hypothesis parent[h] of the last step (an index
  // into the last step's hypotheses; a parent may have several continuations, or none).
  // Moves only the positions fed so far, and in place whenever the caches have rows
  // for the new hypotheses (see decoder_state.cc).
  void reorder(const std::vector<int>& parent);

  int hypotheses() const { return hypotheses_; }
  int positions() const { return positions_; }  // fed so far: the next step's position
  int max_len() const { return max_len_; }
  // The source sentence (an index into the encoded batch) hypothesis h translates.
  int source_of(int hypothesis) const { return source_of_row_.at(row_of_.at(hypothesis)); }
  // Per hypothesis, its cache row. Transformer::decode_step's output rows are in cache-row
  // order: hypothesis h's is row_of()[h].
  const std::vector<int>& row_of() const { return row_of_; }
  bool rows_in_order() const;

 private:
  friend class Transformer;

  // Sizes the self-attention caches for `source_of.size()` hypotheses (hypothesis h
  // translating sentence source_of[h]) of up to `max_len` positions, keeping buffers that
  // are large enough (a new one is zeroed when `zero_new_caches`), for `sentences`
  // encoded sentences of padded length `source_len`; positions() becomes 0. The caller
  // (Transformer::begin_decoding) fills every cross_kv.
  void begin(int layers, const std::vector<int>& source_of, int max_len, int sentences,
             int source_len, const std::vector<int32_t>& source_lengths, int key_width,
             int value_width, DType dtype, bool zero_new_caches);
  // Uploads this step's index plan (the tokens in cache-row order, the key lengths, where
  // each row's new k|v go, each row's cross-attention slot); see decode_step.
  void plan_step(const std::vector<int32_t>& tokens);

  // Copies the positions fed so far of each (from, to) pair of cache rows, in every
  // layer, from the self-attention cache to itself or (into_spare) to its spare.
  void copy_cache_rows(bool into_spare, const std::vector<std::pair<int, int>>& moves);
  int64_t pool_rows() const;     // rows of k|v each layer's self-attention cache holds
  int64_t row_capacity() const;  // rows layout: the hypotheses it has rows for
  // Shared prefixes: reorder's host work, and plan_step's (the pools grown to hold this
  // step's rows; each hypothesis' list extended by its new row, uploaded as key_rows).
  void reorder_shared_prefixes(const std::vector<int>& parent);
  void plan_shared_prefix_rows();
  int kv_width() const { return key_width_ + value_width_; }

  Backend& backend_;
  std::vector<LayerCache> layers_;
  // Per layer, a second self-attention cache: when the hypotheses outnumber the cache's
  // rows (the beam widening in a batch larger than any before), reorder gathers every
  // hypothesis' parent row into it, and the two swap.
  std::vector<Tensor> self_spare_;
  // Shared prefixes: the first pool row of each position fed (and one past the last
  // step's), and per hypothesis the pool row of each of its positions, [H, max_len].
  bool shared_prefixes_ = false;
  std::vector<int32_t> position_base_;
  std::vector<int32_t> prefix_rows_, prefix_rows_scratch_;
  DType dtype_ = DType::F32;
  bool zero_new_caches_ = true;
  int key_width_ = 0, value_width_ = 0;  // h * dk, h * dv
  int hypotheses_ = 0, max_len_ = 0, positions_ = 0;
  int sentences_ = 0, source_len_ = 0;
  // Per cache row: the source sentence it reads.
  std::vector<int> source_of_row_;
  // Per hypothesis: its cache row. A reorder leaves every parent's first continuation in
  // the parent's row (when that row is below the new hypothesis count), so only the rows
  // of the other continuations are copied.
  std::vector<int> row_of_;

  // The current step's plan (plan_step), on the backend, and its host staging, kept from
  // step to step (a step allocates nothing once the largest batch has been seen).
  struct StepPlan {
    int slots = 0;  // the cross-attention's queries per sentence
    bool every_slot_filled = false;
    // tokens: this step's tokens in cache-row order; key_lengths: position + 1 per row;
    // append_to/append_from: the k|v chunks copied from the step's q|k|v rows into the
    // self-attention cache (copy_rows moves whole rows, so a q|k|v row is cut into chunks
    // of gcd(h dk, h dv) elements, its k|v being the last ones); cross_slots: per cache
    // row, its query's row in the per-sentence cross-attention.
    // key_rows (shared prefixes): each row's prefix_rows_, the attention's
    // AttentionShape::key_rows.
    // All six travel in one upload per step (`host_all` into `uploaded`; on a GPU each
    // upload is a copy and a wait), and these point into it.
    const int32_t *tokens = nullptr, *key_lengths = nullptr, *append_to = nullptr,
                  *append_from = nullptr, *cross_slots = nullptr, *key_rows = nullptr;
    model_detail::IdBuffer uploaded;
    std::vector<int32_t> host_tokens, host_key_lengths, host_to, host_from, host_slots, host_all;
    std::vector<int> filled_slots;
  } step_;
  model_detail::IdBuffer source_lengths_;   // [sentences]: the cross-attention's key lengths
  model_detail::IdBuffer moves_;  // reorder's copy_rows indices: destinations, then sources
  model_detail::IdBuffer best_columns_;     // row_top_k's output columns [H, k]
  // Host staging of the outputs in cache-row order, before they are put in hypothesis
  // order (kept: [H, vocab] floats every step, megabytes, would otherwise be new memory).
  std::vector<float> log_probs_by_row_, best_values_by_row_;
  std::vector<int32_t> best_columns_by_row_;
  std::vector<int32_t> moves_host_;
};

}  // namespace thpc
