// One layer of Figure 1, written once forward and once backward for both stacks:
//
//   encoder layer:  x1 = LayerNorm(x  + Dropout(SelfAttention(x)))          (norm1)
//                   y  = LayerNorm(x1 + Dropout(FFN(x1)))                    (norm2)
//   decoder layer:  x1 = LayerNorm(x  + Dropout(MaskedSelfAttention(x)))    (norm1)
//                   x2 = LayerNorm(x1 + Dropout(CrossAttention(x1, memory))) (norm2)
//                   y  = LayerNorm(x2 + Dropout(FFN(x2)))                    (norm3)
//
// and with model.norm = pre (fairseq's normalize_before, tensor2tensor v2):
//
//   encoder layer:  x1 = x  + Dropout(SelfAttention(LayerNorm1(x)))
//                   y  = x1 + Dropout(FFN(LayerNorm2(x1)))
//   decoder layer:  x1 = x  + Dropout(MaskedSelfAttention(LayerNorm1(x)))
//                   x2 = x1 + Dropout(CrossAttention(LayerNorm2(x1), memory))
//                   y  = x2 + Dropout(FFN(LayerNorm3(x2)))
//
// each stack ending in a LayerNorm of its own (encoder.norm, decoder.norm). Both are the
// same chain of add & norm blocks (residual = x + Dropout(sub), out = LayerNorm(residual),
// Sublayers::add_norm_forward): pre-norm, a block's norm is the next sub-layer's
// (LayerNorm2 follows the self-attention's residual, the next layer's LayerNorm1 or the
// stack's final norm the FFN's) and the residual stream goes on from `residual`; the
// stack normalises x_0 for the first sub-layer (Sublayers::stack_input). So the top
// layer's last block computes the final norm, and a layer's output() is the stack's
// output in both orders.
//
// The stacks (transformer.cc) run the layers over a LayerPass, which says what the
// attentions read and which dropout masks the pass draws; a decoding step
// (Transformer::decode_step) runs the decoder's with a LayerCache per layer, which its
// attentions read and extend instead of attending over the pass's own rows. The order of
// the ops inside is the model's: training runs exactly these calls, in this order, and
// its golden numbers depend on it.
#pragma once

#include <vector>

#include "common/error.h"
#include "model/decoder_state.h"
#include "model/sublayers.h"

namespace thpc::model_detail {

// One pass of a stack over its layers: the rows, what the attentions attend to, the
// dropout. The decoder's pass has a memory (the encoder output) for its cross-attention;
// a decoding step's pass has rows = hypotheses, len 1, and the step's plan.
struct LayerPass {
  SitePart part = SitePart::Encoder;  // the stack: its dropout sites, and cross-attention
  DropoutContext dropout;             // which masks (training)
  float p_drop = 0.0f;                // residual dropout (§5.4)
  float p_attn = 0.0f;                // attention dropout
  float p_act = 0.0f;                 // activation dropout (the FFN's hidden layer)
  int batch = 0, len = 0;             // batch sentences of len positions, row b * len + t
  bool causal = false;                // the decoder's self-attention sees no later position
  const int32_t* lengths = nullptr;   // the self-attention's key lengths [batch]
  // false: attentions save no probabilities (no backward, no attention_weights()).
  bool keep_probabilities = true;
  // The decoder's cross-attention: the encoder output [batch * memory_len, d], its
  // lengths, and in backward the gradient it accumulates into.
  Tensor memory;
  int memory_len = 0;
  const int32_t* memory_lengths = nullptr;
  Tensor d_memory;
  // A decoding step: the self-attention's keys are the cache's max_len positions
  // (`lengths` of them written), the cross-attention's queries go per sentence.
  const DecodingStep* step = nullptr;

  bool has_cross_attention() const { return part == SitePart::Decoder; }
  int rows() const { return batch * len; }
  DropoutKey key(int layer, SiteSlot slot) const {
    return dropout_key(dropout, part, layer, slot);
  }
  AttentionShape self_shape(const ModelConfig& c, int layer) const {
    AttentionShape shape =
        attention_shape(c, batch, len, step != nullptr ? step->max_len : len, causal, lengths,
                        p_attn, key(layer, SiteSlot::SelfAttentionProbs));
    if (step != nullptr) shape.key_rows = step->key_rows;
    return shape;
  }
  AttentionShape cross_shape(const ModelConfig& c, int layer) const {
    return attention_shape(c, step != nullptr ? step->sentences : batch,
                           step != nullptr ? step->slots : len, memory_len, false,
                           memory_lengths, p_attn, key(layer, SiteSlot::CrossAttentionProbs));
  }
};

// The norm of each add & norm block of layer `p` (see above): post-norm the sub-layer's
// own; pre-norm the next sub-layer's, the FFN block's being `next` (the next layer's
// norm1, or the stack's final norm).
struct BlockNorms {
  const NormParams *self_attention, *cross_attention, *ffn;
};
inline BlockNorms block_norms(const Sublayers& sub, const LayerParams& p, bool cross,
                              const NormParams& next) {
  if (sub.pre_norm) return {&p.norm2, &p.norm3, &next};
  return {&p.norm1, &p.norm2, cross ? &p.norm3 : &p.norm2};
}

// The norm after layer `layer` of a stack (block_norms' `next`): the next layer's norm1,
// or the stack's final norm (empty post-norm, which reads neither) after the top layer.
inline const NormParams& norm_after(const std::vector<LayerParams>& layers,
                                    const NormParams& final_norm, int layer) {
  return layer + 1 < static_cast<int>(layers.size()) ? layers[layer + 1].norm1 : final_norm;
}

// The layer's forward from `in` into `a`; what the next layer reads is
// sub.after(a.last()), and a.output() its first sub-layer's input. `next` is the norm
// after the layer (pre-norm only; see block_norms). `cache` (a decoder layer's, on a
// decoding step's pass only) is read and extended.
inline void layer_forward(Sublayers& sub, LayerActs& a, Arena& arena, LayerInput in,
                          const LayerParams& p, const NormParams& next, const LayerPass& pass,
                          int layer, const LayerCache* cache = nullptr) {
  THPC_CHECK((cache != nullptr) == (pass.step != nullptr),
             "a decoding step's pass runs with the layer's cache, any other without");
  const int rows = pass.rows();
  const bool cross = pass.has_cross_attention();
  const BlockNorms norms = block_norms(sub, p, cross, next);
  a.x = in.normed;
  sub.self_attention_forward(a.self_attention, arena, a.x, p.self_attention,
                             pass.self_shape(sub.c, layer), pass.keep_probabilities,
                             cache != nullptr ? cache->self_kv : Tensor{}, pass.step);
  sub.add_norm_forward(a.norm1, arena, in.x, a.self_attention.out, *norms.self_attention, rows,
                       pass.p_drop, pass.key(layer, SiteSlot::SelfAttentionResidual));
  in = sub.after(a.norm1);
  if (cross) {
    sub.cross_attention_forward(a.cross_attention, arena, in.normed, pass.memory,
                                p.cross_attention, pass.cross_shape(sub.c, layer),
                                cache != nullptr ? cache->cross_kv : Tensor{}, pass.step);
    sub.add_norm_forward(a.norm2, arena, in.x, a.cross_attention.out, *norms.cross_attention,
                         rows, pass.p_drop, pass.key(layer, SiteSlot::CrossAttentionResidual));
    in = sub.after(a.norm2);
  }
  sub.ffn_forward(a.ffn, arena, in.normed, p.ffn, rows, pass.keep_probabilities, pass.p_act,
                  pass.key(layer, SiteSlot::FfnActivation));
  sub.add_norm_forward(cross ? a.norm3 : a.norm2, arena, in.x, a.ffn.out, *norms.ffn, rows,
                       pass.p_drop, pass.key(layer, SiteSlot::FfnResidual));
}

// The layer's backward: from d_y, the gradient of a.output(), into d_x (overwritten: the
// gradient of the layer's first sub-layer input, LayerInput::normed), the parameter
// gradients and pass.d_memory (both accumulated). Pre-norm, d_stream holds on entry the
// gradient of the residual stream after the layer (that of sub.after(a.last()).x, from
// the next layer's residuals; zero above the top) and on return that of the stream
// before it (in.x); post-norm it is unused (the stream is output(), d_y). Takes its
// temporaries from `scratch`, which it resets first.
inline void layer_backward(Sublayers& sub, Tensor d_x, Tensor d_y, Tensor d_stream,
                           const LayerActs& a, const LayerParams& p, const NormParams& next,
                           const LayerPass& pass, int layer, Arena& scratch) {
  const int rows = pass.rows();
  const int64_t n = int64_t(rows) * sub.d;
  const bool cross = pass.has_cross_attention();
  const BlockNorms norms = block_norms(sub, p, cross, next);
  // Each block's d_x: post-norm the gradient of its x, which is the previous
  // sub-layer's output y, so that sub-layer's input gradient buffer; pre-norm the stream's.
  const auto residual_gradient = [&](Tensor d_sublayer_input) {
    return sub.pre_norm ? d_stream : d_sublayer_input;
  };
  // No buffer is zeroed: each has a first writer that stores (GradStore::kWrite) and later
  // ones that add (Sublayers::add_norm_backward, input_store()).
  scratch.reset();
  const Tensor ffn_in = cross ? a.norm2.y : a.norm1.y;
  Tensor d_ffn_in = scratch.take(sub.act, n);
  Tensor d_ffn_out = scratch.take(sub.act, n);
  sub.add_norm_backward(residual_gradient(d_ffn_in), d_ffn_out, d_y, cross ? a.norm3 : a.norm2,
                        *norms.ffn, scratch, rows, pass.p_drop,
                        pass.key(layer, SiteSlot::FfnResidual));
  sub.ffn_backward(d_ffn_in, d_ffn_out, a.ffn, ffn_in, p.ffn, rows, scratch, pass.p_act,
                   pass.key(layer, SiteSlot::FfnActivation));
  Tensor d_norm1_y = d_ffn_in;
  if (cross) {
    d_norm1_y = scratch.take(sub.act, n);
    Tensor d_cross_out = scratch.take(sub.act, n);
    sub.add_norm_backward(residual_gradient(d_norm1_y), d_cross_out, d_ffn_in, a.norm2,
                          *norms.cross_attention, scratch, rows, pass.p_drop,
                          pass.key(layer, SiteSlot::CrossAttentionResidual));
    sub.cross_attention_backward(d_norm1_y, pass.d_memory, d_cross_out, a.cross_attention,
                                 a.norm1.y, pass.memory, p.cross_attention,
                                 pass.cross_shape(sub.c, layer), scratch);
  }
  Tensor d_self_out = scratch.take(sub.act, n);
  sub.add_norm_backward(residual_gradient(d_x), d_self_out, d_norm1_y, a.norm1,
                        *norms.self_attention, scratch, rows, pass.p_drop,
                        pass.key(layer, SiteSlot::SelfAttentionResidual));
  sub.self_attention_backward(d_x, d_self_out, a.self_attention, a.x, p.self_attention,
                              pass.self_shape(sub.c, layer), scratch);
}

}  // namespace thpc::model_detail
