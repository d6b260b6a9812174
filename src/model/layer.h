// One layer of Figure 1, written once forward and once backward for both stacks:
//
//   encoder layer:  x1 = LayerNorm(x  + Dropout(SelfAttention(x)))          (norm1)
//                   y  = LayerNorm(x1 + Dropout(FFN(x1)))                    (norm2)
//   decoder layer:  x1 = LayerNorm(x  + Dropout(MaskedSelfAttention(x)))    (norm1)
//                   x2 = LayerNorm(x1 + Dropout(CrossAttention(x1, memory))) (norm2)
//                   y  = LayerNorm(x2 + Dropout(FFN(x2)))                    (norm3)
//
// The stacks (transformer.cc) run the layers over a LayerPass, which says what the
// attentions read and which dropout masks the pass draws; a decoding step
// (Transformer::decode_step) runs the decoder's with a LayerCache per layer, which its
// attentions read and extend instead of attending over the pass's own rows. The order of
// the ops inside is the model's: training runs exactly these calls, in this order, and
// its golden numbers depend on it.
//
// Where a variant of the layer goes (pre-norm, LayerNorm(x) before each sublayer and
// x + Dropout(Sublayer(.)) after): here and in Sublayers' add & norm, nowhere else.
#pragma once

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
    return attention_shape(c, batch, len, step != nullptr ? step->max_len : len, causal,
                           lengths, p_attn, key(layer, SiteSlot::SelfAttentionProbs));
  }
  AttentionShape cross_shape(const ModelConfig& c, int layer) const {
    return attention_shape(c, step != nullptr ? step->sentences : batch,
                           step != nullptr ? step->slots : len, memory_len, false,
                           memory_lengths, p_attn, key(layer, SiteSlot::CrossAttentionProbs));
  }
};

// The layer's forward from x (kept as a.x) into `a`; its output is a.output(). `cache`
// (a decoder layer's, on a decoding step's pass only) is read and extended.
inline void layer_forward(Sublayers& sub, LayerActs& a, Arena& arena, Tensor x,
                          const LayerParams& p, const LayerPass& pass, int layer,
                          const LayerCache* cache = nullptr) {
  THPC_CHECK((cache != nullptr) == (pass.step != nullptr),
             "a decoding step's pass runs with the layer's cache, any other without");
  const int rows = pass.rows();
  const bool cross = pass.has_cross_attention();
  a.x = x;
  sub.self_attention_forward(a.self_attention, arena, a.x, p.self_attention,
                             pass.self_shape(sub.c, layer), pass.keep_probabilities,
                             cache != nullptr ? cache->self_kv : Tensor{}, pass.step);
  sub.add_norm_forward(a.norm1, arena, a.x, a.self_attention.out, p.norm1, rows, pass.p_drop,
                       pass.key(layer, SiteSlot::SelfAttentionResidual));
  Tensor ffn_in = a.norm1.y;
  if (cross) {
    sub.cross_attention_forward(a.cross_attention, arena, a.norm1.y, pass.memory,
                                p.cross_attention, pass.cross_shape(sub.c, layer),
                                cache != nullptr ? cache->cross_kv : Tensor{}, pass.step);
    sub.add_norm_forward(a.norm2, arena, a.norm1.y, a.cross_attention.out, p.norm2, rows,
                         pass.p_drop, pass.key(layer, SiteSlot::CrossAttentionResidual));
    ffn_in = a.norm2.y;
  }
  sub.ffn_forward(a.ffn, arena, ffn_in, p.ffn, rows);
  sub.add_norm_forward(cross ? a.norm3 : a.norm2, arena, ffn_in, a.ffn.out,
                       cross ? p.norm3 : p.norm2, rows, pass.p_drop,
                       pass.key(layer, SiteSlot::FfnResidual));
}

// The layer's backward: from d_y, the gradient of its output, into d_x (overwritten: the
// layer's input gradient), the parameter gradients and pass.d_memory (both accumulated).
// Takes its temporaries from `scratch`, which it resets first.
inline void layer_backward(Sublayers& sub, Tensor d_x, Tensor d_y, const LayerActs& a,
                           const LayerParams& p, const LayerPass& pass, int layer,
                           Arena& scratch) {
  const int rows = pass.rows();
  const int64_t n = int64_t(rows) * sub.d;
  const bool cross = pass.has_cross_attention();
  scratch.reset();
  sub.ops.zero(d_x);
  const Tensor ffn_in = cross ? a.norm2.y : a.norm1.y;
  Tensor d_ffn_in = scratch.take_zeroed(sub.act, n);
  Tensor d_ffn_out = scratch.take_zeroed(sub.act, n);
  sub.add_norm_backward(d_ffn_in, d_ffn_out, d_y, cross ? a.norm3 : a.norm2,
                        cross ? p.norm3 : p.norm2, scratch, rows, pass.p_drop,
                        pass.key(layer, SiteSlot::FfnResidual));
  sub.ffn_backward(d_ffn_in, d_ffn_out, a.ffn, ffn_in, p.ffn, rows, scratch);
  Tensor d_norm1_y = d_ffn_in;
  if (cross) {
    d_norm1_y = scratch.take_zeroed(sub.act, n);
    Tensor d_cross_out = scratch.take_zeroed(sub.act, n);
    sub.add_norm_backward(d_norm1_y, d_cross_out, d_ffn_in, a.norm2, p.norm2, scratch, rows,
                          pass.p_drop, pass.key(layer, SiteSlot::CrossAttentionResidual));
    sub.cross_attention_backward(d_norm1_y, pass.d_memory, d_cross_out, a.cross_attention,
                                 a.norm1.y, pass.memory, p.cross_attention,
                                 pass.cross_shape(sub.c, layer), scratch);
  }
  Tensor d_self_out = scratch.take_zeroed(sub.act, n);
  sub.add_norm_backward(d_x, d_self_out, d_norm1_y, a.norm1, p.norm1, scratch, rows,
                        pass.p_drop, pass.key(layer, SiteSlot::SelfAttentionResidual));
  sub.self_attention_backward(d_x, d_self_out, a.self_attention, a.x, p.self_attention,
                              pass.self_shape(sub.c, layer), scratch);
}

}  // namespace thpc::model_detail
