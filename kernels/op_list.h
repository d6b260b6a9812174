// The ops of the contract (kernels/ops.h), each declared once, here:
//
//   THPC_OP(return type, name, (parameters), (argument names))
//
// No include guard: this list is included wherever code is made from it, with THPC_OP
// defined to say what each entry becomes — class Backend's pure virtual functions and
// the OpId enum (kernels/ops.h), the CPU twins' declarations (kernels/cpu/cpu_ops.h),
// the CUDA twins' declarations (kernels/cuda/cuda_ops.h), and the two backends'
// overrides, each calling its twin (kernels/cpu/cpu_backend.cc, kernels/cuda/cuda_backend.cu,
// through kernels/twin_call.h). A wrapping Backend (timing every op, say) is one more
// such include. The conventions every op follows are at the top of kernels/ops.h.
//
// A tensor parameter is typed by its role, all four of them a Tensor in Backend:
//   In, Out             compute_dtype(): activations, the weights as the GEMMs read them
//   ParamIn, ParamOut   param_dtype(): parameter gradients, per-row statistics, optimizer
//                       state, the best values of row_top_k
// In and ParamIn are read; Out and ParamOut are written (forward) or accumulated into
// (backward). The role says what each twin's pointer is: the CPU twin of a
// CpuBackend<T> takes T* / const T* for all four; the CUDA twin of a CudaBackend<T>
// takes T* / const T* for In and Out and float* / const float* for ParamIn and ParamOut,
// after a cuda::Context&. Other parameters reach the twins as they are.
//
// Adding an op: an entry here, documented as the others are; its CPU twin in
// kernels/cpu/<family>.cc and its CUDA twin in kernels/cuda/<family>.cu, each with one
// instantiation line (THPC_CPU_TWIN / THPC_CUDA_TWIN); its test in
// tests/kernels/<family>_test.cc (docs/design-model.md, "Adding an op").

// ---- embedding ----------------------------------------------------------------------
// out[r, :] = table[tokens[r], :] * scale + positions[r % length, :]
//   tokens int32[rows], table [vocab, d], positions [>= length, d], out [rows, d].
// The model passes scale = sqrt(d_model) (§3.4) and the sinusoidal or learned table.
THPC_OP(void, embedding_forward,
        (Out out, const int32_t* tokens, In table, In positions, int rows, int length, int d,
         int vocab, float scale),
        (out, tokens, table, positions, rows, length, d, vocab, scale))
// d_table[tokens[r]] += d_out[r] * scale; d_positions[r % length] += d_out[r] (if
// d_positions is non-null: learned positions).
THPC_OP(void, embedding_backward,
        (ParamOut d_table, ParamOut d_positions, In d_out, const int32_t* tokens, int rows,
         int length, int d, int vocab, float scale),
        (d_table, d_positions, d_out, tokens, rows, length, d, vocab, scale))

// ---- linear: y = x W + b ------------------------------------------------------------
// x [M, K], W [K, N], b [N] or null, y [M, N].
THPC_OP(void, linear_forward, (Out y, In x, In W, In b, int M, int K, int N),
        (y, x, W, b, M, K, N))
// dx += dy W^T (dx = with kWrite); dW += x^T dy; db += column sums of dy. Any output may
// be null.
THPC_OP(void, linear_backward,
        (Out dx, ParamOut dW, ParamOut db, In dy, In x, In W, int M, int K, int N,
         GradStore store),
        (dx, dW, db, dy, x, W, M, K, N, store))

// ---- the FFN's bias + ReLU fused with its layer (§3.3: max(0, x W1 + b1)) -------------
// y = max(0, x W + b): linear_forward's product with the ReLU applied before y is stored
// (on the GPU as the GEMM's epilogue, so the [M, N] hidden layer is written once and not
// read back by a ReLU pass). Shapes as linear_forward; b may be null.
THPC_OP(void, linear_relu_forward, (Out y, In x, In W, In b, int M, int K, int N),
        (y, x, W, b, M, K, N))
// The ReLU's backward and the bias gradient of its layer in one pass over [rows, n]: with
// g = dy where y > 0 and 0 elsewhere (y the ReLU's output),
//   d_pre += g (d_pre = g with kWrite);  db += column sums of g.
// The layer's linear_backward then takes d_pre with db = null. Either output may be null.
THPC_OP(void, relu_bias_backward,
        (Out d_pre, ParamOut db, In dy, In y, int rows, int n, GradStore store),
        (d_pre, db, dy, y, rows, n, store))
// linear_relu_forward that also keeps the ReLU's bit-mask for the backward: `mask`,
// Backend::relu_mask_words(M, N) words in the backend's layout, marks where y > 0. Taken
// where relu_mask_words is not 0 (on a GPU, cuBLASLt's RELU_AUX_BIAS epilogue writes it
// with y); the CPU's twin writes y alone (its relu_mask_words is 0: no mask is read).
THPC_OP(void, linear_relu_mask_forward,
        (Out y, uint32_t* mask, In x, In W, In b, int M, int K, int N),
        (y, mask, x, W, b, M, K, N))
// The backward of out = y W + b where y = max(0, pre) [M, K] is the FFN's hidden layer,
// with the ReLU's: d_pre = (dy W^T) where y > 0, else 0 (written, GradStore::kWrite);
// dW += y^T dy; db += column sums of dy (db may be null). `mask`: what
// linear_relu_mask_forward wrote with y, or null (then y decides; a backend may read
// either: on a GPU the input-gradient GEMM's DRELU epilogue reads the mask). The first
// layer's linear_backward then takes d_pre with its bias gradient.
THPC_OP(void, linear_relu_backward,
        (Out d_pre, ParamOut dW, ParamOut db, In dy, In y, const uint32_t* mask, In W, int M,
         int K, int N),
        (d_pre, dW, db, dy, y, mask, W, M, K, N))

// ---- tied output projection: logits = h E^T -----------------------------------------
// h [M, d], E [vocab, d] (the shared embedding table), logits [M, vocab].
THPC_OP(void, output_projection_forward, (Out logits, In h, In E, int M, int d, int vocab),
        (logits, h, E, M, d, vocab))
// dh += d_logits E (dh = with kWrite); dE += d_logits^T h.
THPC_OP(void, output_projection_backward,
        (Out dh, ParamOut dE, In d_logits, In h, In E, int M, int d, int vocab,
         GradStore store),
        (dh, dE, d_logits, h, E, M, d, vocab, store))

// ---- layer norm ---------------------------------------------------------------------
// y = (x - mean) * rstd * gamma + beta per row, rstd = 1 / sqrt(var + eps) with the
// biased variance. Saves mean[rows] and rstd[rows] (param_dtype) for backward.
THPC_OP(void, layernorm_forward,
        (Out y, ParamOut mean, ParamOut rstd, In x, In gamma, In beta, int rows, int d,
         float eps),
        (y, mean, rstd, x, gamma, beta, rows, d, eps))
// dx += rstd * (g - mean(g) - xhat * mean(g * xhat)) per row, g = dy * gamma and
// xhat = (x - mean) * rstd (dx = with kWrite); dgamma += column sums of dy * xhat,
// dbeta += column sums of dy.
THPC_OP(void, layernorm_backward,
        (Out dx, ParamOut dgamma, ParamOut dbeta, In dy, In x, ParamIn mean, ParamIn rstd,
         In gamma, int rows, int d, GradStore store),
        (dx, dgamma, dbeta, dy, x, mean, rstd, gamma, rows, d, store))

// ---- residual + dropout + layer norm fused (§3.1, §5.4: LayerNorm(x + Dropout(sub))) -
// One pass over [rows, d]: residual = x + Dropout(sub), exactly as
// residual_dropout_forward(residual, x, sub, rows * d, p, key) computes it (the same
// draws), and y, mean, rstd exactly as layernorm_forward of that residual. residual is
// kept for backward (required); mean and rstd may be null.
THPC_OP(void, add_dropout_layernorm_forward,
        (Out y, Out residual, ParamOut mean, ParamOut rstd, In x, In sub, In gamma, In beta,
         int rows, int d, float eps, float p, DropoutKey key),
        (y, residual, mean, rstd, x, sub, gamma, beta, rows, d, eps, p, key))
// Its backward in one pass: with g the gradient layernorm_backward gives the residual
// (never stored), dx += g and d_sub += g * keep / (1 - p) (residual_dropout_backward's;
// both written with kWrite); dgamma, dbeta += as layernorm_backward. Any output may be
// null.
THPC_OP(void, add_dropout_layernorm_backward,
        (Out dx, Out d_sub, ParamOut dgamma, ParamOut dbeta, In dy, In residual,
         ParamIn mean, ParamIn rstd, In gamma, int rows, int d, float p, DropoutKey key,
         GradStore store),
        (dx, d_sub, dgamma, dbeta, dy, residual, mean, rstd, gamma, rows, d, p, key, store))

// ---- multi-head scaled dot-product attention (§3.2.1, §3.2.2) -----------------------
// For each sentence b and head i: out_i = Dropout(softmax(Q_i K_i^T / sqrt(d_k) +
// mask)) V_i. Q, K, V are column blocks of wider row-major matrices: head i of q is
// columns [i*d_k, (i+1)*d_k) of q with row stride ldq (likewise k with ldk, v with
// ldv and d_v), so a fused QKV projection is passed as three offset views.
// out [B*Lq, h*d_v] (row stride h*d_v), heads concatenated.
// `saved` holds what backward needs: the probabilities before attention dropout,
// P [B, h, Lq, Lk] contiguous, masked entries (padding, future positions) exactly 0;
// its size is Backend::attention_saved_numel(shape). The model also reads them back for
// attention pictures (Transformer::attention_weights). It may be null when no backward
// follows (incremental decoding).
THPC_OP(void, attention_forward,
        (Out out, Out saved, In q, int ldq, In k, int ldk, In v, int ldv,
         const AttentionShape& shape),
        (out, saved, q, ldq, k, ldk, v, ldv, shape))
// dq, dk, dv have the layouts (and strides) of q, k, v; the op adds into (kAdd) or writes
// (kWrite) their head columns only, every row of them (a padded key's gradient is 0).
THPC_OP(void, attention_backward,
        (Out dq, Out dk, Out dv, In d_out, In saved, In q, int ldq, In k, int ldk, In v,
         int ldv, const AttentionShape& shape, GradStore store),
        (dq, dk, dv, d_out, saved, q, ldq, k, ldk, v, ldv, shape, store))

// ---- elementwise --------------------------------------------------------------------
// y = max(0, x)
THPC_OP(void, relu_forward, (Out y, In x, int64_t n), (y, x, n))
// dx += dy * (y > 0) (dx = with kWrite)
THPC_OP(void, relu_backward, (Out dx, In dy, In y, int64_t n, GradStore store),
        (dx, dy, y, n, store))
// y = x * keep / (1 - p), keep ~ Bernoulli(1 - p) from key. p = 0 copies. y may alias x
// (the FFN's activation dropout runs in place).
THPC_OP(void, dropout_forward, (Out y, In x, int64_t n, float p, DropoutKey key),
        (y, x, n, p, key))
// dx += dy * keep / (1 - p) (dx = with kWrite), the mask drawn again from the key. dx may
// alias dy with kWrite.
THPC_OP(void, dropout_backward,
        (Out dx, In dy, int64_t n, float p, DropoutKey key, GradStore store),
        (dx, dy, n, p, key, store))
// The residual connection of §3.1 before its layer norm: y = x + Dropout(sub).
THPC_OP(void, residual_dropout_forward,
        (Out y, In x, In sub, int64_t n, float p, DropoutKey key), (y, x, sub, n, p, key))
// dx += dy; d_sub += dy * keep / (1 - p) (both written with kWrite).
THPC_OP(void, residual_dropout_backward,
        (Out dx, Out d_sub, In dy, int64_t n, float p, DropoutKey key, GradStore store),
        (dx, d_sub, dy, n, p, key, store))

// ---- row copies ---------------------------------------------------------------------
// dst[dst_rows[i], :] = src[src_rows[i], :] for i in [0, count), rows of `width`
// elements; a null index list means row i. Indices are int32 in backend memory. Used
// by incremental decoding to append to and reorder its key/value caches.
THPC_OP(void, copy_rows,
        (Out dst, const int32_t* dst_rows, In src, const int32_t* src_rows, int count,
         int width),
        (dst, dst_rows, src, src_rows, count, width))

// ---- label-smoothed cross-entropy (§5.4) --------------------------------------------
// Per row r with target t = targets[r] != pad_id, p = softmax(logits[r]) and the
// smoothed distribution q = (1 - eps) * onehot(t) + eps / vocab:
//   loss_r = -sum_j q_j log p_j,  nll_r = -log p_t.
// Rows whose target is pad_id contribute nothing. Writes the gradient of
// grad_scale * sum_r loss_r into d_logits (which may alias logits: the fused form
// overwrites the logits with their gradient) and returns the sums.
THPC_OP(LossSums, softmax_cross_entropy,
        (Out d_logits, In logits, const int32_t* targets, int rows, int vocab, float eps,
         int pad_id, float grad_scale),
        (d_logits, logits, targets, rows, vocab, eps, pad_id, grad_scale))
// The training step's form: the same loss, gradient and sums, but the sums are added
// into `totals` (a StepTotals in backend memory, StepTotalsBuffer) in micro-batch order
// instead of returned, so that nothing waits for them; StepTotalsBuffer::read reads them
// once a step. A row whose target is outside [0, vocab) is skipped (its d_logits row left as
// it was) and counted in totals.bad_rows, the first one's row and target kept: the read
// throws, before any update. The gradient's scale is inputs->grad_scale (a StepInputs in
// backend memory, StepInputsBuffer) as it is when the op runs, so that a captured pass
// scales each step's gradient by that step's 1 / tokens.
THPC_OP(void, softmax_cross_entropy_add,
        (Out d_logits, In logits, const int32_t* targets, int rows, int vocab, float eps,
         int pad_id, const StepInputs* inputs, ParamOut totals),
        (d_logits, logits, targets, rows, vocab, eps, pad_id, inputs, totals))
// Each row's nll_r = -log softmax(logits[r, :])[targets[r]] (softmax_cross_entropy's nll_r,
// its bits on the CPU; no gradient, no smoothing), 0 on a row whose target is pad_id,
// returned to the host in one read-back: scoring given translations
// (Transformer::target_log_probs) sums them by sentence, or keeps each piece's, where one
// softmax_cross_entropy call a sentence would read back once a sentence (on a GPU a
// stream synchronisation each). A target outside [0, vocab) that is not pad_id throws,
// naming the row.
THPC_OP(std::vector<double>, softmax_nll_rows,
        (In logits, const int32_t* targets, int rows, int vocab, int pad_id),
        (logits, targets, rows, vocab, pad_id))
// log_probs[r, :] = log softmax(logits[r, :]), for decoding. May alias logits.
THPC_OP(void, log_softmax, (Out log_probs, In logits, int rows, int vocab),
        (log_probs, logits, rows, vocab))

// ---- the best entries of each row (decoding) ----------------------------------------
// For each row r of x [rows, width]: its k best entries, best first, into
// values[r * k + i] (param_dtype, the entries' exact values) and columns[r * k + i]
// (int32, backend memory). "Best" is a total order: the larger number first, NaN after
// every number, and among equals the smaller column first. Columns skip_a and skip_b
// (-1: none) are never chosen (decoding never generates pad or bos). Requires
// 1 <= k <= the row's selectable columns (check_row_top_k, made before the twin runs).
// Beam search reads the best 2 * beam log-probabilities of each hypothesis through this
// instead of downloading [H, vocab].
THPC_OP(void, row_top_k,
        (ParamOut values, int32_t* columns, In x, int rows, int width, int k, int skip_a,
         int skip_b),
        (values, columns, x, rows, width, k, skip_a, skip_b))

// ---- optimizer ----------------------------------------------------------------------
// Adam (Kingma & Ba, with bias correction) as in §5.3, over n flat parameters:
//   m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2;
//   p -= lr * (m / (1 - b1^step)) / (sqrt(v / (1 - b2^step)) + eps).
// step is 1-based. grads are read, not changed. compute, when not null, then holds the
// updated params in the compute dtype (the weights the GEMMs read: ParamStore's compute
// copy, a conversion of each value as copy() does); null where the weights are the
// params themselves.
THPC_OP(void, adam_update,
        (ParamOut params, Out compute, ParamIn grads, ParamOut m, ParamOut v, int64_t n,
         float lr, float beta1, float beta2, float eps, int64_t step),
        (params, compute, grads, m, v, n, lr, beta1, beta2, eps, step))
// Adam with decoupled weight decay (Loshchilov & Hutter's AdamW; fairseq's Adam with
// --weight-decay), `decay` = lr x train.weight_decay, the decay folded into the update:
//   p -= lr * m_hat / (sqrt(v_hat) + eps) + decay * p
// (the step and the decay added, then one subtraction: a decay of ~1e-8 of a weight,
// below half its float step, still moves the rounding of the whole update, where a
// separate p -= decay * p, as fairseq's and PyTorch's, is rounded away below 2^-25).
// adam_update's arithmetic otherwise. On the GPU the candidate weight_decay (not yet run
// on one).
THPC_OP(void, adamw_update,
        (ParamOut params, Out compute, ParamIn grads, ParamOut m, ParamOut v, int64_t n,
         float lr, float beta1, float beta2, float eps, float decay, int64_t step),
        (params, compute, grads, m, v, n, lr, beta1, beta2, eps, decay, step))
// Sum of squares of a param_dtype tensor (gradient norms, checks), in double.
THPC_OP(double, sum_squares, (ParamIn x, int64_t n), (x, n))
// totals.grad_squares = sum_squares(x, n) (the same sum, bit for bit), left in backend
// memory for StepTotalsBuffer::read instead of returned.
THPC_OP(void, sum_squares_into, (ParamOut totals, ParamIn x, int64_t n), (totals, x, n))
// *inputs = values (inputs holds a StepInputs' 16 bytes): queued after the work before
// it and before the work after it, without a wait (StepInputsBuffer::set, before each
// micro-batch of a training step).
THPC_OP(void, write_step_inputs, (ParamOut inputs, StepInputs values), (inputs, values))
// x *= alpha
THPC_OP(void, scale, (ParamOut x, int64_t n, float alpha), (x, n, alpha))
