// The Transformer's internals shared by its two source files (transformer.cc: the
// stacks, forward and backward; transformer_incremental.cc: KV-cache decoding): the
// parameter views of each layer, the activations backward reads, and Transformer::State.
// Not part of the model's interface; only src/model includes it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/arena.h"
#include "model/transformer.h"

namespace thpc::model_detail {


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

inline DropoutKey dropout_key(const DropoutContext& ctx, SitePart part, int layer,
                              SiteSlot slot) {
  DropoutKey key;
  key.seed = ctx.seed;
  key.step = ctx.step;
  key.stream = ctx.stream;
  key.site = (static_cast<uint32_t>(part) << 16) | (static_cast<uint32_t>(layer) << 4) |
             static_cast<uint32_t>(slot);
  return key;
}

inline std::string layer_prefix(const char* stack, int layer) {
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


// Grows `buffer` (never shrinking) to hold at least `count` ids, for an op to write.
inline void ensure_id_capacity(Backend& backend, IdBuffer& buffer, int64_t count) {
  if (count > buffer.capacity) {
    backend.free_ids(buffer.ids);
    buffer.capacity = std::max<int64_t>(count, 2 * buffer.capacity);
    buffer.ids = backend.alloc_ids(buffer.capacity);
  }
}

// Uploads `host` into `buffer`, growing it (never shrinking) when it is too small.
inline void ensure_ids(Backend& backend, IdBuffer& buffer,
                       const std::vector<int32_t>& host) {
  const int64_t count = static_cast<int64_t>(host.size());
  ensure_id_capacity(backend, buffer, count);
  backend.upload_ids(buffer.ids, host.data(), count);
}

}  // namespace thpc::model_detail

namespace thpc {

struct Transformer::State {
  explicit State(Backend& backend)
      : encoder_arena(backend), decoder_arena(backend), grad_arena(backend),
        scratch_arena(backend), step_arena(backend) {}

  // Parameters.
  model_detail::Param embedding;  // E [vocab, d], shared (§3.4)
  model_detail::Param positions;  // learned [max_positions, d], or empty
  Tensor sinusoid;                // §3.5 table [max_positions, d] when sinusoidal
  std::vector<model_detail::LayerParams> encoder, decoder;

  // The current batch on the backend.
  model_detail::IdBuffer src, tgt_in, tgt_out, src_lengths, tgt_lengths;
  int batch_size = 0, src_len = 0, tgt_len = 0;
  int decoder_len = 0;  // T of the last forward_decoder (a prefix length when decoding)

  // Activations.
  Arena encoder_arena, decoder_arena, grad_arena, scratch_arena;
  Tensor src_embedded, tgt_embedded;  // before the embedding dropout
  std::vector<model_detail::LayerActs> encoder_acts, decoder_acts;
  Tensor encoder_out, decoder_out, logits;
  Tensor d_encoder_out;  // filled by backward_decoder, read by backward_encoder
  std::vector<int32_t> src_lengths_host;

  // Incremental decoding: per decoder layer, the self-attention k|v rows of every past
  // position of every cache row [rows * max_len, h(dk+dv)] (a position's q is used once,
  // when it is computed, and not kept) and the encoder's k|v rows of every source
  // sentence [sources * S, h(dk+dv)], which all of the sentence's hypotheses read.
  struct Incremental {
    int hypotheses = 0, max_len = 0;
    int filled = 0;  // cache positions written so far (0..filled-1)
    // Per layer: the live caches, and the self-attention cache's spare, which a reorder
    // gathers into before the two swap when there are more hypotheses than the cache has
    // rows (the beam widening in a batch larger than any before). Buffers are kept from
    // one batch to the next and grow only, so decoding allocates a cache rarely (and
    // zeroes one only for a backend whose attention reads unwritten rows).
    std::vector<Tensor> self_cache, cross_kv, self_spare;
    // Per cache row (the rows the decoder's products run over, in this order): the
    // source sentence it reads.
    std::vector<int> source_of;
    // Per hypothesis: its cache row. A reorder leaves every parent's first continuation
    // in the parent's row (when that row is below the new hypothesis count), so only the
    // rows of the other continuations are copied (see reorder_incremental).
    std::vector<int> row_of;
    // cross_slots: per cache row, its query's row in the per-sentence cross-attention.
    // best_columns: row_top_k's output columns [H, k].
    model_detail::IdBuffer self_lengths, rows, from_rows, cross_slots, best_columns;
    // The log-probabilities in cache-row order, before they are put in hypothesis order
    // (kept: [H, vocab] floats every step, megabytes, would otherwise be new memory).
    std::vector<float> log_probs_by_row;
    // incremental_best_tokens' [H, k] in cache-row order, downloaded as fp32.
    std::vector<float> best_values_by_row;
    std::vector<int32_t> best_columns_by_row;
  } incremental;
  Arena step_arena;  // one incremental step's activations
};

}  // namespace thpc
