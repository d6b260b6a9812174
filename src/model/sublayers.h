// The sublayers of Figure 1, forward and backward side by side: add & norm
// (x = LayerNorm(x + Dropout(sublayer)); pre-norm, the residual stream goes on from
// x + Dropout(sublayer) and the norm is the next sub-layer's), multi-head self- and
// encoder-decoder attention, the position-wise feed-forward network. Transformer strings
// them into stacks.
// Every size argument is spelled out because the op interface takes explicit shapes.
#pragma once

#include "model/transformer_state.h"

namespace thpc::model_detail {

// One incremental decoding step's plan (DecoderState::plan_step), the same for every
// layer: rows are hypotheses, one new position each. The attentions
// then read their keys and values from the layer's cache (model/decoder_state.h).
struct DecodingStep {
  int rows = 0;     // hypotheses
  int max_len = 0;  // positions a hypothesis may have (its key_rows' width)
  // The copy_rows that appends this position's k|v to the self-attention cache: chunks
  // of `chunk` elements of the step's q|k|v rows (see DecoderState::StepPlan).
  const int32_t* append_to = nullptr;
  const int32_t* append_from = nullptr;
  int append_count = 0, chunk = 0;
  // The self-attention's AttentionShape::key_rows: per hypothesis, the pool rows of its
  // positions, [rows, max_len] (model/decoder_state.h).
  const int32_t* key_rows = nullptr;
  // The cross-attention runs per source sentence over its S keys: row r's query goes to
  // row cross_slots[r] of [sentences, slots] queries; slots no row fills are zero
  // queries (zeroed unless every_slot_filled) whose outputs nobody reads.
  int sentences = 0, slots = 0;
  const int32_t* cross_slots = nullptr;
  bool every_slot_filled = false;
};

// `ops` is the backend; activations come from the arena each call is given. With
// `fused` (model.fused_ops) add & norm and the FFN's bias + ReLU are one op each,
// forward and backward (kernels/op_list.h), computing what the separate ops compute;
// pre-norm's add & norm backward is the separate ops either way (add_norm_backward).
// `pre_norm`: model.norm = pre.
//
// Every choice the sub-layers make is derived here, from the backend and the model's
// settings, in the one constructor, and held const: a choice added as a const field (no
// default) must be initialised there or the build fails (a field filled by its place in a
// brace list was left false without a word when the list was not extended, and the model
// ran the other branch; a helper's changeability trial).
struct Sublayers {
  // model.fused_ops: on, off, or auto: what the backend takes by default
  // (Backend::fused_ops_by_default: yes on both backends since their twins passed).
  Sublayers(Backend& backend, const ModelConfig& config)
      : ops(backend),
        c(config),
        act(backend.compute_dtype()),
        stat(backend.param_dtype()),
        d(config.d_model),
        dk(config.head_dim_k()),
        dv(config.head_dim_v()),
        h(config.heads),
        fused(config.fused_ops == "on" ||
              (config.fused_ops == "auto" && backend.fused_ops_by_default())),
        pre_norm(config.norm == "pre") {}

  Backend& ops;
  const ModelConfig& c;
  const DType act;   // activation dtype
  const DType stat;  // per-row statistics dtype
  const int d, dk, dv, h;
  const bool fused;
  const bool pre_norm;

  // ---- add & norm: residual = x + Dropout(sub), y = LayerNorm(residual) ----
  // Post-norm, x is the previous block's y and the norm the sub-layer's own; pre-norm, x
  // is the previous block's residual (the stream) and the norm the next sub-layer's, so
  // that y is that sub-layer's input: one op, fused or not, serves both orders.
  void add_norm_forward(AddNormActs& a, Arena& arena, Tensor x, Tensor sub,
                        const NormParams& p, int rows, float p_drop, DropoutKey key) {
    a.residual = arena.take(act, int64_t(rows) * d);
    a.mean = arena.take(stat, rows);
    a.rstd = arena.take(stat, rows);
    a.y = arena.take(act, int64_t(rows) * d);
    if (fused) {
      ops.add_dropout_layernorm_forward(a.y, a.residual, a.mean, a.rstd, x, sub, p.gamma.value,
                                        p.beta.value, rows, d, c.layernorm_eps, p_drop, key);
      return;
    }
    ops.residual_dropout_forward(a.residual, x, sub, int64_t(rows) * d, p_drop, key);
    ops.layernorm_forward(a.y, a.mean, a.rstd, a.residual, p.gamma.value, p.beta.value, rows,
                          d, c.layernorm_eps);
  }
  // The block's backward from d_y, the gradient of y: d_sub (the gradient of sub) is
  // written. Post-norm d_x, the gradient of x, is written too: the block is its first
  // writer, and the sub-layer that read x adds its part after (input_store()). Pre-norm,
  // `residual` is also the next block's x, so on entry d_x holds the gradient the stream
  // brought down (the next block's d_x, the same tensor) and the residual's whole
  // gradient is d_x + LayerNorm'(d_y): it is added into d_x in place (x + Dropout(sub)
  // passes it to x unchanged) and d_sub takes its dropout. The fused backward op cannot
  // serve here: its d_sub is the dropout of LayerNorm'(d_y) alone (post-norm's whole
  // residual gradient), with no input for the stream's, which would cost a second pass
  // over d_x anyway (the separate ops' two).
  void add_norm_backward(Tensor d_x, Tensor d_sub, Tensor d_y, const AddNormActs& a,
                         const NormParams& p, Arena& scratch, int rows, float p_drop,
                         DropoutKey key) {
    if (pre_norm) {
      ops.layernorm_backward(d_x, p.gamma.grad, p.beta.grad, d_y, a.residual, a.mean, a.rstd,
                             p.gamma.value, rows, d, GradStore::kAdd);
      ops.dropout_backward(d_sub, d_x, int64_t(rows) * d, p_drop, key, GradStore::kWrite);
      return;
    }
    if (fused) {
      ops.add_dropout_layernorm_backward(d_x, d_sub, p.gamma.grad, p.beta.grad, d_y, a.residual,
                                         a.mean, a.rstd, p.gamma.value, rows, d, p_drop, key,
                                         GradStore::kWrite);
      return;
    }
    Tensor d_residual = scratch.take(act, int64_t(rows) * d);
    ops.layernorm_backward(d_residual, p.gamma.grad, p.beta.grad, d_y, a.residual, a.mean,
                           a.rstd, p.gamma.value, rows, d, GradStore::kWrite);
    ops.residual_dropout_backward(d_x, d_sub, d_residual, int64_t(rows) * d, p_drop, key,
                                  GradStore::kWrite);
  }
  // How a sub-layer's backward stores the gradient of its input (its last product's dx):
  // post-norm the input is the previous block's y, whose add_norm_backward has written
  // the residual's part of that gradient first, so the sub-layer adds; pre-norm the input
  // is a norm's output, which only the sub-layer reads: it writes.
  GradStore input_store() const { return pre_norm ? GradStore::kWrite : GradStore::kAdd; }
  // What the block after `a` reads (see LayerInput): post-norm y twice; pre-norm the
  // stream and its norm.
  LayerInput after(const AddNormActs& a) const {
    return pre_norm ? LayerInput{a.residual, a.y} : LayerInput{a.y, a.y};
  }

  // ---- a stack's input: x_0 (post-norm), or x_0 and LayerNorm(x_0) (pre-norm) ----
  // Pre-norm, the lead-in norm (`first`: layer 0's norm1) is a block of its own,
  // `lead`, with residual = x_0 (no copy).
  LayerInput stack_input(AddNormActs& lead, Arena& arena, Tensor x0, const NormParams& first,
                         int rows) {
    lead = AddNormActs{};
    if (!pre_norm) return LayerInput{x0, x0};
    lead.residual = x0;
    lead.mean = arena.take(stat, rows);
    lead.rstd = arena.take(stat, rows);
    lead.y = arena.take(act, int64_t(rows) * d);
    ops.layernorm_forward(lead.y, lead.mean, lead.rstd, x0, first.gamma.value, first.beta.value,
                          rows, d, c.layernorm_eps);
    return after(lead);
  }
  // Its backward, after layer 0's: d_normed, the gradient of layer 0's first sub-layer
  // input, is post-norm already x_0's (returned); pre-norm, x_0's is the stream's,
  // d_stream, plus LayerNorm'(d_normed), added into d_stream in place.
  Tensor stack_input_backward(Tensor d_stream, Tensor d_normed, const AddNormActs& lead,
                              const NormParams& first, int rows) {
    if (!pre_norm) return d_normed;
    ops.layernorm_backward(d_stream, first.gamma.grad, first.beta.grad, d_normed, lead.residual,
                           lead.mean, lead.rstd, first.gamma.value, rows, d, GradStore::kAdd);
    return d_stream;
  }

  // ---- self-attention: fused Q|K|V projection, attention, W^O ----
  int qkv_width() const { return h * (2 * dk + dv); }
  // keep_probabilities = false: the attention probabilities are not stored (no backward
  // and no attention_weights() will read them; the CPU then never materialises them).
  // With a decoding step, the rows' k|v are appended to `cache` ([rows * max_len, k|v],
  // see LayerCache) and the queries attend over it (shape: one query per row, max_len
  // keys, the written ones counted by its key lengths) instead of over their own rows.
  void self_attention_forward(AttentionActs& a, Arena& arena, Tensor x,
                              const AttentionParams& p, const AttentionShape& shape,
                              bool keep_probabilities = true, Tensor cache = {},
                              const DecodingStep* step = nullptr) {
    const int rows = shape.batch * shape.query_len;
    const int width = qkv_width();
    a.in = arena.take(act, int64_t(rows) * width);
    a.saved = keep_probabilities ? arena.take(act, ops.attention_saved_numel(shape)) : Tensor{};
    a.context = arena.take(act, int64_t(rows) * h * dv);
    a.out = arena.take(act, int64_t(rows) * d);
    ops.linear_forward(a.in, x, p.in_weight.value, p.in_bias.value, rows, d, width);
    if (step != nullptr) {
      ops.copy_rows(cache, step->append_to, a.in, step->append_from, step->append_count,
                    step->chunk);
      const int kv = h * (dk + dv);
      ops.attention_forward(a.context, a.saved, a.in, width, cache, kv,
                            cache.slice(h * dk, cache.numel - h * dk), kv, shape);
    } else {
      ops.attention_forward(a.context, a.saved, a.in, width,
                            a.in.slice(h * dk, a.in.numel - h * dk), width,
                            a.in.slice(2 * h * dk, a.in.numel - 2 * h * dk), width, shape);
    }
    ops.linear_forward(a.out, a.context, p.out_weight.value, p.out_bias.value, rows, h * dv, d);
  }
  void self_attention_backward(Tensor d_x, Tensor d_out, const AttentionActs& a, Tensor x,
                               const AttentionParams& p, const AttentionShape& shape,
                               Arena& scratch) {
    const int rows = shape.batch * shape.query_len;
    const int width = qkv_width();
    Tensor d_context = scratch.take(act, int64_t(rows) * h * dv);
    ops.linear_backward(d_context, p.out_weight.grad, p.out_bias.grad, d_out, a.context,
                        p.out_weight.value, rows, h * dv, d, GradStore::kWrite);
    // q|k|v's gradients: the three column blocks of d_in, each written whole.
    Tensor d_in = scratch.take(act, int64_t(rows) * width);
    const int64_t k_off = h * dk, v_off = 2 * h * dk;
    ops.attention_backward(d_in, d_in.slice(k_off, d_in.numel - k_off),
                           d_in.slice(v_off, d_in.numel - v_off), d_context, a.saved, a.in,
                           width, a.in.slice(k_off, a.in.numel - k_off), width,
                           a.in.slice(v_off, a.in.numel - v_off), width, shape,
                           GradStore::kWrite);
    ops.linear_backward(d_x, p.in_weight.grad, p.in_bias.grad, d_in, x, p.in_weight.value,
                        rows, d, width, input_store());
  }

  // ---- encoder-decoder attention: Q from the decoder, K|V from the encoder output ----
  // With a decoding step, the k|v are the sentences' `cache` ([sentences * S, k|v], see
  // LayerCache) and each row's query attends in its sentence's slot (shape: [sentences,
  // slots] queries over S keys); the step saves no probabilities.
  void cross_attention_forward(AttentionActs& a, Arena& arena, Tensor x, Tensor memory,
                               const AttentionParams& p, const AttentionShape& shape,
                               Tensor cache = {}, const DecodingStep* step = nullptr) {
    if (step != nullptr) {
      cached_cross_attention_forward(a, arena, x, p, shape, cache, *step);
      return;
    }
    const int rows = shape.batch * shape.query_len;
    const int memory_rows = shape.batch * shape.key_len;
    const int kv_width = h * (dk + dv);
    a.in = arena.take(act, int64_t(rows) * h * dk);
    a.kv = arena.take(act, int64_t(memory_rows) * kv_width);
    a.saved = arena.take(act, ops.attention_saved_numel(shape));
    a.context = arena.take(act, int64_t(rows) * h * dv);
    a.out = arena.take(act, int64_t(rows) * d);
    ops.linear_forward(a.in, x, p.in_weight.value, p.in_bias.value, rows, d, h * dk);
    ops.linear_forward(a.kv, memory, p.kv_weight.value, p.kv_bias.value, memory_rows, d,
                       kv_width);
    ops.attention_forward(a.context, a.saved, a.in, h * dk, a.kv, kv_width,
                          a.kv.slice(h * dk, a.kv.numel - h * dk), kv_width, shape);
    ops.linear_forward(a.out, a.context, p.out_weight.value, p.out_bias.value, rows, h * dv, d);
  }
  void cached_cross_attention_forward(AttentionActs& a, Arena& arena, Tensor x,
                                      const AttentionParams& p, const AttentionShape& shape,
                                      Tensor cache, const DecodingStep& step) {
    const int rows = step.rows;
    const int slot_rows = shape.batch * shape.query_len;
    const int kv_width = h * (dk + dv);
    a.in = arena.take(act, int64_t(rows) * h * dk);
    a.kv = Tensor{};
    a.saved = Tensor{};
    a.context = arena.take(act, int64_t(rows) * h * dv);
    a.out = arena.take(act, int64_t(rows) * d);
    ops.linear_forward(a.in, x, p.in_weight.value, p.in_bias.value, rows, d, h * dk);
    Tensor q_slots = arena.take(act, int64_t(slot_rows) * h * dk);
    if (!step.every_slot_filled) ops.zero(q_slots);
    ops.copy_rows(q_slots, step.cross_slots, a.in, nullptr, rows, h * dk);
    Tensor context_slots = arena.take(act, int64_t(slot_rows) * h * dv);
    ops.attention_forward(context_slots, Tensor{}, q_slots, h * dk, cache, kv_width,
                          cache.slice(h * dk, cache.numel - h * dk), kv_width, shape);
    ops.copy_rows(a.context, nullptr, context_slots, step.cross_slots, rows, h * dv);
    ops.linear_forward(a.out, a.context, p.out_weight.value, p.out_bias.value, rows, h * dv, d);
  }
  void cross_attention_backward(Tensor d_x, Tensor d_memory, Tensor d_out,
                                const AttentionActs& a, Tensor x, Tensor memory,
                                const AttentionParams& p, const AttentionShape& shape,
                                Arena& scratch) {
    const int rows = shape.batch * shape.query_len;
    const int memory_rows = shape.batch * shape.key_len;
    const int kv_width = h * (dk + dv);
    Tensor d_context = scratch.take(act, int64_t(rows) * h * dv);
    ops.linear_backward(d_context, p.out_weight.grad, p.out_bias.grad, d_out, a.context,
                        p.out_weight.value, rows, h * dv, d, GradStore::kWrite);
    Tensor d_q = scratch.take(act, int64_t(rows) * h * dk);
    Tensor d_kv = scratch.take(act, int64_t(memory_rows) * kv_width);
    const int64_t v_off = h * dk;
    ops.attention_backward(d_q, d_kv, d_kv.slice(v_off, d_kv.numel - v_off), d_context,
                           a.saved, a.in, h * dk, a.kv, kv_width,
                           a.kv.slice(v_off, a.kv.numel - v_off), kv_width, shape,
                           GradStore::kWrite);
    ops.linear_backward(d_x, p.in_weight.grad, p.in_bias.grad, d_q, x, p.in_weight.value, rows,
                        d, h * dk, input_store());
    // The encoder output's gradient gathers every decoder layer's (zeroed by the caller).
    ops.linear_backward(d_memory, p.kv_weight.grad, p.kv_bias.grad, d_kv, memory,
                        p.kv_weight.value, memory_rows, d, kv_width, GradStore::kAdd);
  }

  // ---- FFN(x) = max(0, x W1 + b1) W2 + b2 (§3.3) ----
  // With activation dropout p_act > 0 (model.activation_dropout, training only):
  // Dropout(max(0, x W1 + b1)) W2 + b2, the mask drawn from `key`, in place: a.hidden then
  // holds the dropped layer, W2's input, and the ReLU's backward reads its signs, which
  // are the undropped layer's wherever a gradient passes the dropout (a kept element is
  // scaled by 1 / (1 - p) > 0; a dropped one has no gradient). The ReLU's mask path,
  // whose backward folds the ReLU into W2's input-gradient product, is not taken.
  // `for_backward`: a pass whose backward follows (the ReLU's mask is kept where the
  // backend keeps one).
  void ffn_forward(FfnActs& a, Arena& arena, Tensor x, const FfnParams& p, int rows,
                   bool for_backward, float p_act = 0.0f, DropoutKey key = {}) {
    const int64_t n = int64_t(rows) * c.d_ff;
    a.hidden = arena.take(act, n);
    a.out = arena.take(act, int64_t(rows) * d);
    const int64_t mask_words =
        fused && for_backward && p_act == 0.0f ? ops.relu_mask_words(rows, c.d_ff) : 0;
    // 32-bit words in an fp32-typed block (the arena's unit; its bits are not floats).
    a.relu_mask = mask_words > 0 ? static_cast<uint32_t*>(arena.take(DType::F32, mask_words).data)
                                 : nullptr;
    if (a.relu_mask != nullptr) {
      ops.linear_relu_mask_forward(a.hidden, a.relu_mask, x, p.w1.value, p.b1.value, rows, d,
                                   c.d_ff);
    } else if (fused) {
      ops.linear_relu_forward(a.hidden, x, p.w1.value, p.b1.value, rows, d, c.d_ff);
    } else {
      ops.linear_forward(a.hidden, x, p.w1.value, p.b1.value, rows, d, c.d_ff);
      ops.relu_forward(a.hidden, a.hidden, n);  // in place
    }
    if (p_act > 0.0f) ops.dropout_forward(a.hidden, a.hidden, n, p_act, key);  // in place
    ops.linear_forward(a.out, a.hidden, p.w2.value, p.b2.value, rows, c.d_ff, d);
  }
  void ffn_backward(Tensor d_x, Tensor d_out, const FfnActs& a, Tensor x, const FfnParams& p,
                    int rows, Arena& scratch, float p_act = 0.0f, DropoutKey key = {}) {
    const int64_t n = int64_t(rows) * c.d_ff;
    if (a.relu_mask != nullptr) {  // the ReLU's backward inside W2's input-gradient GEMM
      Tensor d_pre = scratch.take(act, n);
      ops.linear_relu_backward(d_pre, p.w2.grad, p.b2.grad, d_out, a.hidden, a.relu_mask,
                               p.w2.value, rows, c.d_ff, d);
      ops.linear_backward(d_x, p.w1.grad, p.b1.grad, d_pre, x, p.w1.value, rows, d, c.d_ff,
                          input_store());
      return;
    }
    Tensor d_hidden = scratch.take(act, n);
    ops.linear_backward(d_hidden, p.w2.grad, p.b2.grad, d_out, a.hidden, p.w2.value, rows,
                        c.d_ff, d, GradStore::kWrite);
    if (p_act > 0.0f) {  // through the dropout, in place: the same mask, drawn again
      ops.dropout_backward(d_hidden, d_hidden, n, p_act, key, GradStore::kWrite);
    }
    Tensor d_pre = scratch.take(act, n);
    if (fused) {  // b1's gradient summed in the ReLU's pass
      ops.relu_bias_backward(d_pre, p.b1.grad, d_hidden, a.hidden, rows, c.d_ff,
                             GradStore::kWrite);
      ops.linear_backward(d_x, p.w1.grad, Tensor{}, d_pre, x, p.w1.value, rows, d, c.d_ff,
                          input_store());
      return;
    }
    ops.relu_backward(d_pre, d_hidden, a.hidden, n, GradStore::kWrite);
    ops.linear_backward(d_x, p.w1.grad, p.b1.grad, d_pre, x, p.w1.value, rows, d, c.d_ff,
                        input_store());
  }
};



inline AttentionShape attention_shape(const ModelConfig& c, int batch, int query_len,
                                      int key_len, bool causal, const int32_t* key_lengths,
                                      float dropout, DropoutKey key) {
  AttentionShape shape;
  shape.batch = batch;
  shape.heads = c.heads;
  shape.query_len = query_len;
  shape.key_len = key_len;
  shape.d_k = c.head_dim_k();
  shape.d_v = c.head_dim_v();
  shape.causal = causal;
  shape.key_lengths = key_lengths;
  shape.dropout = dropout;
  shape.dropout_key = key;
  return shape;
}


}  // namespace thpc::model_detail
