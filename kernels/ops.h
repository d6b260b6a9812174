// The op interface: the contract every backend (kernels/cpu, kernels/cuda) fulfils.
//
// The model (src/model) is written once as a sequence of calls on a Backend. A backend
// owns its memory (host memory for the CPU, device memory for CUDA) and implements each
// op with the shapes, layouts and saved state documented here. The CPU backend is the
// specification; a CUDA op is correct when it matches its CPU twin.
//
// Conventions for every op:
// * Matrices are row-major. Activations are [rows, features] with rows = batch * length,
//   sentence b's position t at row b * length + t. Padding is on the right.
// * Forward ops overwrite their outputs.
// * Backward ops ACCUMULATE (+=) into every gradient output, activations and parameters
//   alike, so residual branches, the shared embedding and gradient accumulation need no
//   extra adds. The caller zeroes gradient buffers before a backward pass. A null
//   gradient output means "not needed".
// * A Tensor's dtype is the backend's: Backend::param_dtype() for parameters, their
//   gradients and optimizer state; Backend::compute_dtype() for activations and the
//   weights as the GEMMs read them. Per-row statistics (layer norm mean/rstd, losses)
//   are always in param_dtype. So on the bf16 GPU backend an op reads bf16 weights (the
//   model's compute copy, ParamStore::compute) and bf16 activations, writes bf16
//   activation gradients, and accumulates weight gradients (dW, db, dgamma, dbeta,
//   d_table) into fp32. On the CPU both dtypes are the same.
// * Token ids and lengths are int32 in the backend's memory.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace thpc {

enum class DType { F32, F64, BF16 };
size_t dtype_size(DType dtype);
const char* dtype_name(DType dtype);

// A view of backend memory: a pointer, its element type and its element count.
// Shapes are passed to ops as explicit sizes; numel lets a backend check them.
struct Tensor {
  void* data = nullptr;
  DType dtype = DType::F32;
  int64_t numel = 0;

  explicit operator bool() const { return data != nullptr; }
  // The elements [offset, offset + count) of this tensor.
  Tensor slice(int64_t offset, int64_t count) const;
};

// Which dropout mask to draw. Masks come from Philox4x32-10 (common/philox.h) keyed by
// seed; the counter is (element / 4, site, step, stream), so every (step, site,
// element) has its own draw, the CPU and the GPU draw the same bits, and a resumed run
// draws what the uninterrupted one would have drawn.
struct DropoutKey {
  uint64_t seed = 0;
  uint32_t step = 0;    // optimizer step
  uint32_t stream = 0;  // distinguishes ranks and accumulation micro-batches
  uint32_t site = 0;    // distinguishes the dropout sites inside the model
};

// The per-batch description of attention masking.
struct AttentionShape {
  int batch = 0;       // B
  int heads = 0;       // h
  int query_len = 0;   // Lq: rows per sentence of q
  int key_len = 0;     // Lk: rows per sentence of k and v
  int d_k = 0;         // per-head query/key width
  int d_v = 0;         // per-head value width
  bool causal = false; // query t may see keys 0..t only (decoder self-attention)
  // Valid (non-pad) key count per sentence, int32[B] in backend memory. Keys at
  // positions >= key_lengths[b] are masked out.
  const int32_t* key_lengths = nullptr;
  float dropout = 0.0f;  // attention dropout on the probabilities
  DropoutKey dropout_key;
};

// Sums produced by the loss op, read back to the host after each micro-batch.
struct LossSums {
  double loss = 0.0;      // label-smoothed cross-entropy, summed over non-pad targets
  double nll = 0.0;       // plain negative log-likelihood, summed (for perplexity)
  int64_t tokens = 0;     // non-pad targets
};

// Throws unless the sizes, head widths, row strides and attention dropout of `shape` are
// valid: the check both backends' attention ops make first.
void check_attention_shape(const AttentionShape& shape, int ldq, int ldk, int ldv);

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  // True when tensors live in host memory (the CPU backend): host-side collectives such
  // as MPI_Allreduce may then work on them directly.
  virtual bool host_memory() const = 0;
  virtual DType param_dtype() const = 0;
  virtual DType compute_dtype() const = 0;

  // ---- memory -------------------------------------------------------------------
  virtual Tensor alloc(DType dtype, int64_t numel) = 0;  // contents unspecified
  virtual void free(Tensor& tensor) = 0;
  virtual int32_t* alloc_ids(int64_t count) = 0;
  virtual void free_ids(int32_t*& ids) = 0;
  virtual void zero(Tensor tensor) = 0;
  virtual void copy(Tensor dst, Tensor src) = 0;  // same numel; converts dtypes
  // Host <-> backend transfers; host data is in the tensor's dtype.
  virtual void upload(Tensor dst, const void* host) = 0;
  virtual void download(void* host, Tensor src) = 0;
  virtual void upload_ids(int32_t* dst, const int32_t* host, int64_t count) = 0;
  virtual void download_ids(int32_t* host, const int32_t* src, int64_t count) = 0;
  virtual void synchronize() = 0;
  // The cudaStream_t every op is queued on (CUDA backend; null on the CPU), so that the
  // gradient all-reduce can order its own stream after the ops that wrote a bucket.
  virtual void* native_stream() const { return nullptr; }
  // The CUDA device index of a GPU backend; -1 on the CPU.
  virtual int device() const { return -1; }

  // ---- embedding ----------------------------------------------------------------
  // out[r, :] = table[tokens[r], :] * scale + positions[r % length, :]
  //   tokens int32[rows], table [vocab, d], positions [>= length, d], out [rows, d].
  // The model passes scale = sqrt(d_model) (§3.4) and the sinusoidal or learned table.
  virtual void embedding_forward(Tensor out, const int32_t* tokens, Tensor table,
                                 Tensor positions, int rows, int length, int d, int vocab,
                                 float scale) = 0;
  // d_table[tokens[r]] += d_out[r] * scale; d_positions[r % length] += d_out[r] (if
  // d_positions is non-null: learned positions).
  virtual void embedding_backward(Tensor d_table, Tensor d_positions, Tensor d_out,
                                  const int32_t* tokens, int rows, int length, int d,
                                  int vocab, float scale) = 0;

  // ---- linear: y = x W + b ------------------------------------------------------
  // x [M, K], W [K, N], b [N] or null, y [M, N].
  virtual void linear_forward(Tensor y, Tensor x, Tensor W, Tensor b, int M, int K,
                              int N) = 0;
  // dx += dy W^T; dW += x^T dy; db += column sums of dy. Any output may be null.
  virtual void linear_backward(Tensor dx, Tensor dW, Tensor db, Tensor dy, Tensor x,
                               Tensor W, int M, int K, int N) = 0;

  // ---- tied output projection: logits = h E^T -----------------------------------
  // h [M, d], E [vocab, d] (the shared embedding table), logits [M, vocab].
  virtual void output_projection_forward(Tensor logits, Tensor h, Tensor E, int M, int d,
                                         int vocab) = 0;
  // dh += d_logits E; dE += d_logits^T h.
  virtual void output_projection_backward(Tensor dh, Tensor dE, Tensor d_logits, Tensor h,
                                          Tensor E, int M, int d, int vocab) = 0;

  // ---- layer norm ---------------------------------------------------------------
  // y = (x - mean) * rstd * gamma + beta per row, rstd = 1 / sqrt(var + eps) with the
  // biased variance. Saves mean[rows] and rstd[rows] (param_dtype) for backward.
  virtual void layernorm_forward(Tensor y, Tensor mean, Tensor rstd, Tensor x,
                                 Tensor gamma, Tensor beta, int rows, int d,
                                 float eps) = 0;
  virtual void layernorm_backward(Tensor dx, Tensor dgamma, Tensor dbeta, Tensor dy,
                                  Tensor x, Tensor mean, Tensor rstd, Tensor gamma,
                                  int rows, int d) = 0;

  // ---- multi-head scaled dot-product attention (§3.2.1, §3.2.2) -----------------
  // For each sentence b and head i: out_i = Dropout(softmax(Q_i K_i^T / sqrt(d_k) +
  // mask)) V_i. Q, K, V are column blocks of wider row-major matrices: head i of q is
  // columns [i*d_k, (i+1)*d_k) of q with row stride ldq (likewise k with ldk, v with
  // ldv and d_v), so a fused QKV projection is passed as three offset views.
  // out [B*Lq, h*d_v] (row stride h*d_v), heads concatenated.
  // `saved` holds what backward needs: the probabilities before attention dropout,
  // P [B, h, Lq, Lk] contiguous, masked entries (padding, future positions) exactly 0;
  // its size is attention_saved_numel(shape). The model also reads them back for
  // attention pictures (Transformer::attention_weights). It may be null when no backward
  // follows (incremental decoding).
  virtual int64_t attention_saved_numel(const AttentionShape& shape) const = 0;
  virtual void attention_forward(Tensor out, Tensor saved, Tensor q, int ldq, Tensor k,
                                 int ldk, Tensor v, int ldv,
                                 const AttentionShape& shape) = 0;
  // Whether attention_forward reads the keys and values past key_lengths[b] (and
  // multiplies them by probability 0, so that NaN there would spread): true unless a
  // backend says otherwise. Incremental decoding zeroes a new key/value cache only when
  // it does (the CPU's reads the valid keys alone; CUDA's batched GEMMs read all).
  virtual bool attention_reads_masked_keys() const { return true; }
  // dq, dk, dv have the layouts (and strides) of q, k, v.
  virtual void attention_backward(Tensor dq, Tensor dk, Tensor dv, Tensor d_out,
                                  Tensor saved, Tensor q, int ldq, Tensor k, int ldk,
                                  Tensor v, int ldv, const AttentionShape& shape) = 0;

  // ---- elementwise --------------------------------------------------------------
  // y = max(0, x)
  virtual void relu_forward(Tensor y, Tensor x, int64_t n) = 0;
  // dx += dy * (y > 0)
  virtual void relu_backward(Tensor dx, Tensor dy, Tensor y, int64_t n) = 0;
  // y = x * keep / (1 - p), keep ~ Bernoulli(1 - p) from key. p = 0 copies.
  virtual void dropout_forward(Tensor y, Tensor x, int64_t n, float p, DropoutKey key) = 0;
  virtual void dropout_backward(Tensor dx, Tensor dy, int64_t n, float p,
                                DropoutKey key) = 0;
  // The residual connection of §3.1 before its layer norm: y = x + Dropout(sub).
  virtual void residual_dropout_forward(Tensor y, Tensor x, Tensor sub, int64_t n, float p,
                                        DropoutKey key) = 0;
  // dx += dy; d_sub += dy * keep / (1 - p).
  virtual void residual_dropout_backward(Tensor dx, Tensor d_sub, Tensor dy, int64_t n,
                                         float p, DropoutKey key) = 0;

  // ---- row copies ---------------------------------------------------------------
  // dst[dst_rows[i], :] = src[src_rows[i], :] for i in [0, count), rows of `width`
  // elements; a null index list means row i. Indices are int32 in backend memory. Used
  // by incremental decoding to append to and reorder its key/value caches.
  virtual void copy_rows(Tensor dst, const int32_t* dst_rows, Tensor src,
                         const int32_t* src_rows, int count, int width) = 0;

  // ---- label-smoothed cross-entropy (§5.4) --------------------------------------
  // Per row r with target t = targets[r] != pad_id, p = softmax(logits[r]) and the
  // smoothed distribution q = (1 - eps) * onehot(t) + eps / vocab:
  //   loss_r = -sum_j q_j log p_j,  nll_r = -log p_t.
  // Rows whose target is pad_id contribute nothing. Writes the gradient of
  // grad_scale * sum_r loss_r into d_logits (which may alias logits: the fused form
  // overwrites the logits with their gradient) and returns the sums.
  virtual LossSums softmax_cross_entropy(Tensor d_logits, Tensor logits,
                                         const int32_t* targets, int rows, int vocab,
                                         float eps, int pad_id, float grad_scale) = 0;
  // log_probs[r, :] = log softmax(logits[r, :]), for decoding. May alias logits.
  virtual void log_softmax(Tensor log_probs, Tensor logits, int rows, int vocab) = 0;

  // ---- the best entries of each row (decoding) -------------------------------------
  // For each row r of x [rows, width]: its k best entries, best first, into
  // values[r * k + i] (param_dtype, the entries' exact values) and columns[r * k + i]
  // (int32, backend memory). "Best" is a total order: the larger number first, NaN after
  // every number, and among equals the smaller column first. Columns skip_a and skip_b
  // (-1: none) are never chosen (decoding never generates pad or bos). Requires
  // 1 <= k <= the row's selectable columns. Beam search reads the best 2 * beam
  // log-probabilities of each hypothesis through this instead of downloading [H, vocab].
  virtual void row_top_k(Tensor values, int32_t* columns, Tensor x, int rows, int width,
                         int k, int skip_a, int skip_b) = 0;

  // ---- optimizer ----------------------------------------------------------------
  // Adam (Kingma & Ba, with bias correction) as in §5.3, over n flat parameters:
  //   m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2;
  //   p -= lr * (m / (1 - b1^step)) / (sqrt(v / (1 - b2^step)) + eps).
  // step is 1-based. grads are read, not changed.
  virtual void adam_update(Tensor params, Tensor grads, Tensor m, Tensor v, int64_t n,
                           float lr, float beta1, float beta2, float eps, int64_t step) = 0;
  // Sum of squares of a param_dtype tensor (gradient norms, checks).
  virtual double sum_squares(Tensor x, int64_t n) = 0;
  // x *= alpha
  virtual void scale(Tensor x, int64_t n, float alpha) = 0;
};

}  // namespace thpc
