// The Transformer's internals shared by its source files (transformer.cc: the stacks,
// forward and backward; decoder_state.cc: KV-cache decoding; layer.h and sublayers.h:
// the layer they share): the parameter views of each layer, the activations backward
// reads, and Transformer::State.
// Not part of the model's interface; only src/model includes it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/arena.h"
#include "model/device_buffers.h"
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
  FfnActivation = 7,  // model.activation_dropout, on the FFN's hidden layer
};

inline DropoutKey dropout_key(const DropoutContext& ctx, SitePart part, int layer,
                              SiteSlot slot) {
  DropoutKey key;
  key.seed = ctx.seed;
  key.step = ctx.step;
  key.stream = ctx.stream;
  key.inputs = ctx.inputs;
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
  // The layer norms of the self-attention, cross-attention (decoder) and FFN sub-layers:
  // post-norm, each after its sub-layer's residual; pre-norm, each before its sub-layer.
  NormParams norm1, norm2, norm3;
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
// One add & norm block. Post-norm: its LayerNorm is the sub-layer's own, y the next
// sub-layer's input and the next residual's. Pre-norm: its LayerNorm is the next
// sub-layer's (or the stack's final norm), y that sub-layer's input, and the residual
// stream goes on from `residual`. A stack's lead-in norm (pre-norm: LayerNorm(x_0) for
// the first sub-layer) is one with residual = x_0.
struct AddNormActs {
  Tensor residual;  // x + Dropout(sublayer) [R, d]
  Tensor mean, rstd;  // [R]
  Tensor y;         // LayerNorm(residual) [R, d]
};
// What a layer reads: x, the residual its first sub-layer's output is added to, and
// normed, the first sub-layer's input. Post-norm both are the previous layer's output;
// pre-norm, x is the residual stream and normed its LayerNorm with the layer's norm1.
struct LayerInput {
  Tensor x, normed;
};
struct FfnActs {
  Tensor hidden;  // max(0, x W1 + b1) [R, d_ff], dropped out with activation dropout
  Tensor out;     // hidden W2 + b2 [R, d]
  // The ReLU's bit-mask, Backend::relu_mask_words(R, d_ff) words, where the backend keeps
  // one for the backward (a GPU with the candidate relu_masks); null elsewhere.
  uint32_t* relu_mask = nullptr;
};
// norm1, norm2, norm3: the add & norm blocks after the self-attention, the
// cross-attention (decoder) and the FFN (norm2 in the encoder).
struct LayerActs {
  Tensor x;  // the self-attention's input (LayerInput::normed)
  AttentionActs self_attention, cross_attention;
  AddNormActs norm1, norm2, norm3;
  FfnActs ffn;
  const AddNormActs& last() const { return norm3.y ? norm3 : norm2; }
  // The last block's y: the layer's output (post-norm) or, pre-norm, the next layer's
  // first sub-layer input (the top layer's: the stack's final LayerNorm, its output).
  Tensor output() const { return last().y; }
};

// A source batch's sentences (their lengths, eos included) split into groups to encode
// one at a time, each padded to its own longest: the partition of the sentences sorted
// by length (longest first, ties in batch order) into runs that minimises the rows
// computed, sum over groups of (sentences x longest + group_cost_rows), where
// group_cost_rows prices a group's fixed cost (its launches, BLAS packing each weight
// matrix once) in rows. Each group lists batch indices, longest first; one group holds
// the whole batch when splitting saves nothing.
std::vector<std::vector<int>> encoder_length_groups(const std::vector<int32_t>& lengths,
                                                    int group_cost_rows);

}  // namespace thpc::model_detail

namespace thpc {

struct Transformer::State {
  explicit State(Backend& backend)
      : encoder_arena(backend), decoder_arena(backend), grad_arena(backend),
        scratch_arena(backend), step_arena(backend) {}

  // Parameters.
  model_detail::Param embedding;  // E [vocab, d], shared (§3.4)
  // E_src [source vocab, d] with separate vocabularies; else empty (E serves the source).
  model_detail::Param source_embedding;
  model_detail::Param positions;  // learned [max_positions, d], or empty
  Tensor sinusoid;                // §3.5 table [max_positions, d] when sinusoidal
  std::vector<model_detail::LayerParams> encoder, decoder;
  // Pre-norm: the LayerNorm after each stack (encoder.norm, decoder.norm); empty post-norm.
  model_detail::NormParams encoder_norm, decoder_norm;

  // The current batch on the backend: its ids and lengths in one buffer that one upload
  // fills (on a GPU each upload is a copy and a wait: five a step were five of the six
  // synchronisations that left the H200 idle 0.41 ms a step, bench/RESULTS.md), each at a
  // 64-id boundary: src [B, S], src_lengths [B], tgt_in [B, T], tgt_out [B, T],
  // tgt_lengths [B]. The pointers below are into it, or, while decoding, tgt_in and
  // tgt_lengths into the prefixes' own buffers (next_token_log_probs).
  model_detail::IdBuffer batch_ids, prefix_ids, prefix_lengths;
  std::vector<int32_t> batch_host;  // the upload's host side, kept from batch to batch
  const int32_t* src = nullptr;
  const int32_t* src_lengths = nullptr;
  const int32_t* tgt_in = nullptr;
  const int32_t* tgt_out = nullptr;
  const int32_t* tgt_lengths = nullptr;
  int batch_size = 0, src_len = 0, tgt_len = 0;
  int decoder_len = 0;  // T of the last forward_decoder (a prefix length when decoding)

  // Activations.
  Arena encoder_arena, decoder_arena, grad_arena, scratch_arena;
  Tensor src_embedded, tgt_embedded;  // before the embedding dropout
  std::vector<model_detail::LayerActs> encoder_acts, decoder_acts;
  // Pre-norm: the stacks' lead-in norms, LayerNorm(x_0) with layer 0's norm1.
  model_detail::AddNormActs encoder_lead, decoder_lead;
  Tensor encoder_out, decoder_out, logits;
  Tensor d_encoder_out;  // filled by backward_decoder, read by backward_encoder
  std::vector<int32_t> src_lengths_host;
  // encode() in length groups: the batch's encoder output [B * S, d] put together from
  // the groups' (pad rows zero), and the row indices of the copies.
  Tensor grouped_encoder_out;
  model_detail::IdBuffer group_rows_to, group_rows_from;

  Arena step_arena;  // one decoding step's activations (decode_step)
  // bf16 rows widened to fp32 for their download (download_rows_f32), kept and grown.
  Tensor widened_rows;

  // sum_lookups_apart(): the lookups' gradient [vocab, d] (zero but for this step's
  // rows), the rows looked up on any rank and their gathered gradient [rows, d].
  Tensor lookup_grad, lookup_rows_grad;
  model_detail::IdBuffer lookup_rows;
  int lookup_row_count = 0;
};

}  // namespace thpc
