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
// The self-attention cache is one pool of rows per layer, shared by a beam's
// hypotheses: each step appends one row per hypothesis after the last step's, and a
// hypothesis holds the pool row of each of its positions (its prefix's, written by its
// ancestors). reorder hands each new hypothesis its parent's list, moving no key or
// value, and the attention gathers the rows each one lists (AttentionShape::key_rows,
// which every backend's attention_forward takes). The beam's hypotheses share most of
// their prefixes: one copy of each, read from the CPU's cache or the GPU's L2 by the
// hypotheses after the first. (Until 2026-11-26 the GPU kept a cache row per hypothesis
// instead, copied at every reorder: bench/RESULTS.md has the comparison.)
//
// Rows are in hypothesis order throughout: a step's tokens, its outputs and the caches'
// new rows all index hypotheses directly.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/ops.h"
#include "model/device_buffers.h"

namespace thpc {

class Transformer;

// One decoder layer's cache, which the layer reads and extends when it runs on a
// decoding step (model_detail::layer_forward).
struct LayerCache {
  // The self-attention's k|v of every position fed so far, [rows, h(dk + dv)]: the rows
  // of position t from DecoderState's position_base_[t], one per hypothesis. A
  // position's q is used once, when it is fed, and not kept.
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
  // Host work only: each new hypothesis takes its parent's list of cache rows.
  void reorder(const std::vector<int>& parent);

  int hypotheses() const { return hypotheses_; }
  int positions() const { return positions_; }  // fed so far: the next step's position
  int max_len() const { return max_len_; }
  // The source sentence (an index into the encoded batch) hypothesis h translates.
  int source_of(int hypothesis) const { return source_of_.at(hypothesis); }

 private:
  friend class Transformer;

  // Starts a search of `source_of.size()` hypotheses (hypothesis h translating sentence
  // source_of[h]) of up to `max_len` positions, keeping the pools of an earlier search,
  // for `sentences` encoded sentences of padded length `source_len`; positions() becomes
  // 0. The caller (Transformer::begin_decoding) fills every cross_kv.
  void begin(int layers, const std::vector<int>& source_of, int max_len, int sentences,
             int source_len, const std::vector<int32_t>& source_lengths, int key_width,
             int value_width, DType dtype);
  // Uploads this step's index plan (the tokens, the key lengths, where each hypothesis'
  // new k|v go, each one's cross-attention slot, the rows each one's attention reads);
  // see decode_step.
  void plan_step(const std::vector<int32_t>& tokens);
  // plan_step's part for the pools: grown, when the rows of the remaining positions at this
  // step's width would not fit (the first step of a new width), to hold them all; and each
  // hypothesis' list extended by its new row.
  void append_step_rows();
  int64_t pool_rows() const;  // rows of k|v each layer's self-attention cache holds
  int kv_width() const { return key_width_ + value_width_; }

  Backend& backend_;
  std::vector<LayerCache> layers_;
  // The first pool row of each position fed (and one past the last step's), and per
  // hypothesis the pool row of each of its positions, [H, max_len] (its scratch twin
  // receives reorder's copies).
  std::vector<int32_t> position_base_;
  std::vector<int32_t> prefix_rows_, prefix_rows_scratch_;
  DType dtype_ = DType::F32;
  int key_width_ = 0, value_width_ = 0;  // h * dk, h * dv
  int hypotheses_ = 0, max_len_ = 0, positions_ = 0;
  int sentences_ = 0, source_len_ = 0;
  // Per hypothesis: the source sentence it translates (and reorder's scratch).
  std::vector<int> source_of_, source_of_scratch_;

  // The current step's plan (plan_step), on the backend, and its host staging, kept from
  // step to step (a step allocates nothing once the largest batch has been seen).
  struct StepPlan {
    int slots = 0;  // the cross-attention's queries per sentence
    bool every_slot_filled = false;
    // tokens: this step's tokens; key_lengths: position + 1 per hypothesis;
    // append_to/append_from: the k|v chunks copied from the step's q|k|v rows into the
    // self-attention cache (copy_rows moves whole rows, so a q|k|v row is cut into chunks
    // of gcd(h dk, h dv) elements, its k|v being the last ones); cross_slots: per
    // hypothesis, its query's row in the per-sentence cross-attention; key_rows: each
    // hypothesis' prefix_rows_, the attention's AttentionShape::key_rows; position: the
    // step's position, one index, the position table's row a captured step copies
    // (Transformer::decode_step).
    // All seven travel in one upload per step (`host_all` into `uploaded`; on a GPU each
    // upload is a copy and a wait), and these point into it.
    const int32_t *tokens = nullptr, *key_lengths = nullptr, *append_to = nullptr,
                  *append_from = nullptr, *cross_slots = nullptr, *key_rows = nullptr,
                  *position = nullptr;
    model_detail::IdBuffer uploaded;
    std::vector<int32_t> host_key_lengths, host_to, host_from, host_slots, host_all;
    std::vector<int> filled_slots;
  } step_;
  model_detail::IdBuffer source_lengths_;   // [sentences]: the cross-attention's key lengths
  model_detail::IdBuffer best_columns_;     // row_top_k's output columns [H, k]
  // Where steps are captured: row_top_k's values (as floats) and columns in one buffer,
  // and its host copy (Transformer::decode_step_best_tokens).
  model_detail::IdBuffer best_packed_;
  std::vector<int32_t> best_host_;
};

}  // namespace thpc
