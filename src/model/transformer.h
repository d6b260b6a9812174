// The encoder-decoder Transformer of Vaswani et al. (2017), written once over the op
// interface of kernels/ops.h, forward and backward.
//
//   x_0      = Dropout(E[tokens] * sqrt(d_model) + PE)                  (§3.4, §3.5, §5.4)
//   sublayer: x = LayerNorm(x + Dropout(Sublayer(x)))                    (§3.1, post-norm)
//             or, model.norm = pre, x = x + Dropout(Sublayer(LayerNorm(x))) and a
//             LayerNorm after each stack (model/layer.h)
//   encoder layer: self-attention, FFN;  decoder layer: masked self-attention,
//   encoder-decoder attention, FFN;  FFN(x) = max(0, x W1 + b1) W2 + b2    (§3.3)
//   logits  = h E^T (the embedding matrix is shared by both embeddings and the
//             pre-softmax projection, §3.4); loss: label-smoothed cross-entropy (§5.4).
//   With separate vocabularies (VocabularySizes::source > 0) the encoder looks its
//   tokens up in a table of its own, E_src [source vocab, d] ("src_embed.weight"), and
//   E stays shared by the target embedding and the projection (fairseq
//   --share-decoder-input-output-embed, Marian --tied-embeddings).
#pragma once

#include <algorithm>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "config/config.h"
#include "data/batch.h"
#include "kernels/ops.h"
#include "model/arena.h"
#include "model/decoder_state.h"
#include "model/gradient_listener.h"
#include "model/params.h"

namespace thpc {

// Which dropout masks a training micro-batch draws (see DropoutKey in kernels/ops.h).
struct DropoutContext {
  uint64_t seed = 0;
  uint32_t step = 0;
  uint32_t stream = 0;
  // DropoutKey::inputs of every key made from this (backend memory, or null): set by the
  // model itself for the passes it captures.
  const StepInputs* inputs = nullptr;
};

// What a micro-batch drawing `dropout`'s masks writes into its StepInputsBuffer before its
// train_step: the same step and stream, and the loss gradient's scale (1 / the step's
// target tokens).
inline StepInputs step_inputs_for(const DropoutContext& dropout, float grad_scale) {
  StepInputs inputs;
  inputs.dropout_step = dropout.step;
  inputs.dropout_stream = dropout.stream;
  inputs.grad_scale = grad_scale;
  return inputs;
}

// Adds the model's parameters (names, shapes, initialisation) to an empty store. Free
// of any backend, so the parameter count of a config can be had without allocating.
// source_vocab_size > 0: the encoder's own embedding table (separate vocabularies), laid
// out after E (and the learned positions).
void add_transformer_parameters(const ModelConfig& config, int vocab_size, ParamStore& store,
                                int source_vocab_size = 0);

// The vocabularies a model is built with: the target's (shared by both sides when source
// is 0, the paper's one vocabulary, §3.4) and, separate, the source's.
struct VocabularySizes {
  int target = 0;
  int source = 0;  // 0: the target's vocabulary and table serve the source too
  int source_or_shared() const { return source > 0 ? source : target; }
};

// The matrices the forward pass multiplies activations by, as add_transformer_parameters
// names them: each layer's projections and feed-forward layers (y = x W + b, W [in, out])
// and the shared embedding as the output projection (logits = h E^T, E [vocab, d], §3.4).
// What int8 decoding quantizes (decode/compute_type.h).
struct ProductWeight {
  std::string name;
  bool output_projection = false;  // E [vocab, d] rather than W [in, out]
};
std::vector<ProductWeight> product_weights(const ParamStore& store);
// The same by a parameter's name alone (a checkpoint's tensors): a weight matrix of a
// product, and whether it is the tied embedding. A separate source embedding
// (kSourceEmbeddingName) is looked up only: not a product's weight.
bool is_product_weight(const std::string& name);
bool is_output_projection(const std::string& name);
inline constexpr const char* kSourceEmbeddingName = "src_embed.weight";

class Transformer {
 public:
  // Builds the parameter table, allocates it on `backend` and initialises it from seed;
  // without a seed the parameters stay zero, for a caller that loads all of them next
  // (decoding: drawing 63M random numbers only to overwrite them costs a second).
  // ModelUse::kInference allocates no gradients (train_step then refuses to run).
  enum class ModelUse { kTraining, kInference };
  Transformer(const ModelConfig& config, VocabularySizes vocabularies, const SpecialIds& ids,
              Backend& backend, std::optional<uint64_t> init_seed,
              ModelUse use = ModelUse::kTraining);
  // One vocabulary for both sides (the paper's).
  Transformer(const ModelConfig& config, int vocab_size, const SpecialIds& ids,
              Backend& backend, std::optional<uint64_t> init_seed,
              ModelUse use = ModelUse::kTraining)
      : Transformer(config, VocabularySizes{vocab_size, 0}, ids, backend, init_seed, use) {}
  ~Transformer();

  const ModelConfig& config() const { return config_; }
  // The target vocabulary (the output projection's rows; both sides' when shared).
  int vocab_size() const { return vocab_; }
  VocabularySizes vocabularies() const { return {vocab_, source_vocab_}; }
  // The source ids' range: the source's own vocabulary, or the shared one.
  int source_vocab_size() const { return source_vocab_ > 0 ? source_vocab_ : vocab_; }
  bool separate_source_embedding() const { return source_vocab_ > 0; }
  ParamStore& params() { return params_; }
  const ParamStore& params() const { return params_; }
  Backend& backend() { return backend_; }

  // One training micro-batch: forward with dropout, loss, backward. Parameter gradients
  // ACCUMULATE into params().grads(); the loss sum is scaled by grad_scale (1 / target
  // tokens of the whole step) before differentiation. `listener` (null: none) is told
  // during backward what is final (model/gradient_listener.h): the micro-batch whose
  // backward finishes the step's gradients starts their sums over ranks with it.
  LossSums train_step(const Batch& batch, float grad_scale, const DropoutContext& dropout,
                      GradientListener* listener = nullptr);
  // The same micro-batch with the loss sums added into `totals` (StepTotalsBuffer) where
  // the backend keeps them, nothing read back: the training step's form, which reads its
  // totals once, at its end (StepTotalsBuffer::read). The loss gradient's scale is
  // inputs->grad_scale (StepInputsBuffer, set for this micro-batch with the dropout's
  // step and stream as `dropout` has them).
  //
  // Where the backend captures work (Backend::can_capture: CUDA graphs with
  // train.cuda_kernels step_graphs), the pass after the batch's upload is captured at the
  // second micro-batch of its shape (batch size, source and target length) and replayed
  // at the following ones, up to kMaxCapturedPasses shapes, the least recently used
  // dropped first: then the ops read the dropout's step and stream from `inputs`, and
  // the host queues one launch. A pass whose listener calls host code (the sums over
  // ranks by MPI), or with the embedding summed per use, runs uncaptured; NCCL's sums are
  // captured with it. A pass with a listener and one without never share a capture,
  // whatever their shape: a replay runs only what its capture queued. A replayed pass
  // leaves no attention_weights(). A listener must outlive the model's captured passes
  // (the trainer's GradientSums does): a capture is keyed by its address.
  void train_step(const Batch& batch, const DropoutContext& dropout, const StepInputs* inputs,
                  Tensor totals, GradientListener* listener = nullptr);
  static constexpr size_t kMaxCapturedPasses = 256;
  // What train_step's and the decoding steps' capturing has done so far (for the
  // benchmark's line and tests).
  struct CaptureCounts {
    int64_t captures = 0;  // passes or steps captured (each replayed at once)
    int64_t replays = 0;   // passes or steps run by replaying a capture, the capturing ones
    int64_t refused = 0;   // captures the backend refused: that shape runs uncaptured
    int64_t evicted = 0;   // captures dropped for kMaxCapturedPasses
  };
  const CaptureCounts& capture_counts() const { return capture_counts_; }
  // train.loss_chunk_rows: train_step makes the [rows, vocabulary] logits `rows` target
  // rows at a time (the projection, the loss and the projection's backward per chunk);
  // 0 (the default) all at once. The gradients are the same up to the summation order of
  // the embedding's share (a sum over chunks), the loss up to the order of its sum.
  // evaluate() takes the logits in the same chunks (forward only).
  // A change drops the captured passes (each holds its own chunking).
  void set_loss_chunk_rows(int64_t rows);

  // The tied embedding's gradient summed per use (dist.embedding_sum = per_use): with
  // `rows` non-empty (sorted, distinct: every id any rank's micro-batches of the step look
  // up in E: the targets' alone with a separate source table, whose gradient is dense)
  // the embedding lookups' gradient goes to a table of its own, zeroed here, instead
  // of the embedding's gradient, which then holds the output projection's share alone,
  // final as soon as that product's backward is done: the pass's listener is told then
  // (GradientListener::output_projection_final: the all-reduce starts its sum).
  // lookup_gradient_rows() gives the table's `rows` [rows, d], to be summed over ranks;
  // add_lookup_gradient_rows(summed) adds them to the embedding's gradient. Empty `rows`:
  // one gradient again.
  void sum_lookups_apart(const std::vector<int32_t>& rows);
  Tensor lookup_gradient_rows();
  void add_lookup_gradient_rows(Tensor summed);

  // Forward without dropout; the loss of a batch (validation), no gradients.
  LossSums evaluate(const Batch& batch);
  // The same forward pass (teacher-forced, no dropout, logits in train.loss_chunk_rows
  // chunks), and each sentence's log-likelihood of its target instead of the batch's loss:
  //   log P(y | x) = sum_t log p(y_t | y_<t, x)  over y_1 .. y_n, eos (tgt_out's non-pad
  // entries), with the plain softmax (no label smoothing): host [batch.size]. The score
  // beam search gives a hypothesis it found (Hypothesis::log_prob), up to the rounding of
  // a whole pass against its one position a step (transformer_decode --score-reference).
  // With `piece_log_probs`, also each sentence's log p(y_t | y_<t, x), t = 1 .. n + 1.
  // The rows' nll come back once a logit chunk (softmax_nll_rows).
  std::vector<double> target_log_probs(const Batch& batch,
                                       std::vector<std::vector<float>>* piece_log_probs = nullptr);

  // Decoding support (no dropout). encode() runs the encoder over a source batch (the
  // targets of `batch` are ignored) and keeps its output only (no attention_weights():
  // evaluate() keeps them); next_token_log_probs() runs
  // the decoder over target prefixes tgt_in [B, T] (bos first, pad-free up to each
  // sentence's `prefix_lengths[b]`) against it, recomputing every position, and
  // returns log p(next token | prefix) for each sentence: host [B, vocab].
  void encode(const Batch& batch);
  std::vector<float> next_token_log_probs(const std::vector<int32_t>& tgt_in,
                                          const std::vector<int32_t>& prefix_lengths, int T);

  // Incremental decoding against the last encode(), through a DecoderState
  // (model/decoder_state.h): the decoder self-attention keys/values of past positions are
  // cached per layer and the cross-attention keys/values of the encoder output computed
  // once, so a step costs one position, not the prefix. Between steps the search calls
  // state.reorder(parents).
  //   decoder_state()                     the model's own state, whose buffers are kept
  //                                       from one search to the next (and only grow)
  //   begin_decoding(state, source_of, max_len)
  //                                       hypothesis h translates row source_of[h] of the
  //                                       encoded batch, at most max_len positions
  //   decode_step(state, tokens)          feeds tokens[h] to hypothesis h at position
  //                                       state.positions() (0: bos): log p(next)
  //                                       [H, vocab] on the backend, row h for hypothesis
  //                                       h, valid until the model's next step (an
  //                                       ensemble combines them there)
  //   decode_step_log_probs(state, tokens, log_probs)
  //                                       the same in hypothesis order, in a host vector
  //                                       whose capacity is reused
  //   decode_step_best_tokens(state, tokens, k, values, best_tokens)
  //                                       the same step, but only each hypothesis' k best
  //                                       next tokens (pad and bos never), best first,
  //                                       ties to the smaller token: log p [H, k] and
  //                                       tokens [H, k]
  DecoderState& decoder_state() { return *decoder_state_; }
  void begin_decoding(DecoderState& state, const std::vector<int>& source_of, int max_len);
  Tensor decode_step(DecoderState& state, const std::vector<int32_t>& tokens);
  void decode_step_log_probs(DecoderState& state, const std::vector<int32_t>& tokens,
                             std::vector<float>& log_probs);
  void decode_step_best_tokens(DecoderState& state, const std::vector<int32_t>& tokens, int k,
                               std::vector<float>& values, std::vector<int32_t>& best_tokens);

  // The attention weights of the last full forward pass (train_step, evaluate, or
  // encode then next_token_log_probs; incremental decoding keeps none), for pictures
  // like the paper's Figures 3-5: the softmax probabilities each attention op saved for
  // backward (before attention dropout; masked entries, padding and future positions,
  // exactly 0), host [B, heads, Lq, Lk] of layer `layer`.
  enum class AttentionKind {
    EncoderSelf,  // Lq = Lk = the padded source length S
    DecoderSelf,  // Lq = Lk = the target length T (the prefix length when decoding)
    Cross,        // encoder-decoder attention: Lq = T, Lk = S
  };
  std::vector<float> attention_weights(AttentionKind kind, int layer);

 private:
  struct State;  // parameter views, activations, arenas (transformer_state.h)

  void upload_batch(const Batch& batch);
  std::vector<float> download_rows_f32(Tensor rows, int count, int width);
  // The same into `out` (resized; a vector kept from step to step allocates no memory).
  void download_rows_f32(Tensor rows, int count, int width, std::vector<float>& out);
  // kAll: every layer's activations stay until the next forward (backward reads them,
  // attention_weights() too); kOutputOnly: only encoder_out (decoding).
  enum class EncoderActivations { kAll, kOutputOnly };
  // Forward with dropout, then `loss` (which writes d_logits over the logits), then
  // backward: train_step's two forms.
  template <typename Loss>
  void train_pass(const Batch& batch, const DropoutContext& dropout, Loss&& loss);
  // train_pass after the upload: what a captured pass holds.
  template <typename Loss>
  void queue_train_pass(const DropoutContext& dropout, Loss&& loss);
  // A training pass's shape and the step buffers its ops read: what a capture is good for.
  struct CapturedPassKey {
    int batch_size, src_len, tgt_len;
    const StepInputs* inputs;
    const void* totals;
    // A capture holds its listener's stream work (the sums' launches): a pass without
    // one must not replay it, nor one with a listener replay a capture without.
    const GradientListener* listener;
    // The dropout's seed is in the captured kernels' arguments (its step and stream are
    // read from `inputs`): another seed is another pass.
    uint64_t dropout_seed;
    bool operator==(const CapturedPassKey& o) const {
      return batch_size == o.batch_size && src_len == o.src_len && tgt_len == o.tgt_len &&
             inputs == o.inputs && totals == o.totals && listener == o.listener &&
             dropout_seed == o.dropout_seed;
    }
  };
  // What a captured pass or decoding step keeps (Captured: with the `Key` it is good for).
  struct CaptureState {
    std::unique_ptr<CapturedWork> work;  // null: not captured (yet)
    int64_t uncaptured_runs = 0;
    bool refused = false;  // the backend refused its capture: runs uncaptured
    uint64_t last_use = 0;
  };
  template <typename Key>
  struct Captured : CaptureState {
    Key key{};
  };
  using CapturedPass = Captured<CapturedPassKey>;
  // A decoding step's shape and the decoder state whose buffers it reads.
  struct CapturedDecodeKey {
    const DecoderState* state;
    int hypotheses, slots, sentences, source_len, max_len;
    bool every_slot_filled;
    int best_k;  // the top-k queued with the step (decode_step_best_tokens), 0: none
    bool operator==(const CapturedDecodeKey& o) const {
      return state == o.state && hypotheses == o.hypotheses && slots == o.slots &&
             sentences == o.sentences && source_len == o.source_len && max_len == o.max_len &&
             every_slot_filled == o.every_slot_filled && best_k == o.best_k;
    }
  };
  // A decoding step's best tokens queued right after it (Backend::row_top_k), inside its
  // capture where it is captured: `k` of each row into `values` [H, k] and `columns`.
  struct StepBestTokens {
    int k = 0;
    Tensor values;
    int32_t* columns = nullptr;
  };
  struct CapturedDecodeStep : Captured<CapturedDecodeKey> {
    Tensor logits;           // where the captured step leaves its log-probabilities
    Arena::Mark arena_after;  // the step arena as the captured step left it
  };
  // The entry of `key` in `entries`, made if new (the least recently used one dropped
  // beyond kMaxCapturedPasses entries).
  template <typename Entry, typename Key>
  Entry& lru_entry(std::vector<Entry>& entries, const Key& key);
  // How run_capturable ran a pass or step.
  enum class CaptureRun { kReplayed, kCaptured, kUncaptured };
  // The one way a pass or a decoding step runs where the backend captures: its capture
  // replayed where there is one and no memory was freed since; uncaptured at its shape's
  // first run (arenas and scratch reach their size) or once its capture was refused;
  // else `settle` (what must free memory, outside the capture), then queue(true) captured
  // and replayed, or, refused, queue(false). queue(captured) queues the work.
  CaptureRun run_capturable(CaptureState& entry, const std::function<void()>& settle,
                            const std::function<void(bool captured)>& queue);
  void forget_pass_views();
  // decode_step's work after its plan's upload (position_from_plan: the position table's
  // row copied from the uploaded index, as a captured step must; with `best`, its best
  // tokens after it), and the same through a capture.
  Tensor queue_decode_step(DecoderState& state, int position, bool position_from_plan,
                           const StepBestTokens* best);
  Tensor captured_decode_step(DecoderState& state, int position, const StepBestTokens* best);
  // decode_step, and with `best` its best tokens queued after it (in its capture).
  Tensor run_decode_step(DecoderState& state, const std::vector<int32_t>& tokens,
                         const StepBestTokens* best);
  bool lookups_summed_apart() const;
  void forward_encoder(bool train, const DropoutContext& dropout,
                       EncoderActivations keep = EncoderActivations::kAll);
  // The rows of logits made at once for a pass of `rows` target rows (set_loss_chunk_rows).
  int64_t loss_chunk(int rows) const {
    return loss_chunk_rows_ > 0 ? std::min<int64_t>(loss_chunk_rows_, rows) : rows;
  }
  // train.loss_chunk_rows: the tied projection (§3.4) of the decoder output's `rows` rows,
  // `chunk` at a time into one [chunk, vocabulary] buffer of the gradient arena, then
  // body(first row, rows in the chunk, their logits, their decoder output) for each chunk.
  template <typename Body>
  void logits_in_chunks(int rows, int64_t chunk, Body&& body);
  // with_logits: also the vocabulary logits (s.logits) of every row.
  void forward_decoder(int batch_size, int T, bool train, const DropoutContext& dropout,
                       bool with_logits = true);
  // logits = h E^T [rows, vocab] from the decoder's output h, taken from `arena`.
  Tensor vocabulary_logits(Arena& arena, Tensor decoder_out, int rows);
  // Backward from the loss gradient (left in the logits) to the embeddings.
  // d_decoder_out: the gradient of the decoder's output when the output projection's
  // backward has run already (the loss in chunks); null: it runs here, from s.logits.
  void backward_decoder(const DropoutContext& dropout, Tensor d_decoder_out = Tensor{});
  void backward_encoder(const DropoutContext& dropout);

  ModelConfig config_;
  int vocab_;
  int source_vocab_;  // 0: shared with the target (vocab_)
  int64_t loss_chunk_rows_ = 0;  // set_loss_chunk_rows
  SpecialIds ids_;
  Backend& backend_;
  ParamStore params_;
  // The listener of the train_step running now (null: none, or no pass running).
  GradientListener* listener_ = nullptr;
  // Where the embedding lookups' backward adds: the embedding's gradient, or the table of
  // sum_lookups_apart().
  Tensor lookups_gradient() const;
  void gradients_final_from(int64_t offset) const {
    if (listener_ != nullptr) listener_->gradients_final_from(offset);
  }
  // Reports what is final once `stack`'s layer `layer` (-1: its lead-in norm, after
  // layer 0) is through backward.
  void layer_gradients_final(const char* stack, int layer) const;
  std::unique_ptr<State> state_;
  std::unique_ptr<DecoderState> decoder_state_;
  // Declared after state_: a graph goes before the memory it points into.
  std::vector<CapturedPass> captured_passes_;
  std::vector<CapturedDecodeStep> captured_decode_steps_;
  uint64_t capture_clock_ = 0;
  CaptureCounts capture_counts_;
};

}  // namespace thpc
