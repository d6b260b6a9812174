// Ensemble decoding (transformer_decode --checkpoint A B C, as fairseq's --path a:b:c and
// Marian's --models): several models that share a vocabulary score every step together,
// and the search (beam search, greedy, sampling) runs on their combined scores.
//
// The combination is the weighted mean of the models' log-probabilities,
//   score(y | x, prefix) = sum_i w_i log p_i(y | x, prefix),   w_i > 0, sum_i w_i = 1
// (default w_i = 1/N; --weights gives others, normalised to sum 1), Marian's ensemble
// (it sums w_i log p_i with the --weights as given, by default all 1, which ranks
// hypotheses identically: a common factor scales every score, the length-normalised ones
// and the early-termination bound alike). A hypothesis' score is then the weighted mean
// of the models' own log P(Y | x): a product of experts (Hinton 2002), not normalised
// per step (sum_y exp(score) <= 1 by the inequality of weighted means; sampling
// renormalises, decode/sampling.h). fairseq instead averages probabilities, log(1/N
// sum_i p_i) = logsumexp_i(log p_i) - log N, a mixture. The mean of log-probabilities was
// chosen because it is elementwise linear: the models' [H, vocab] rows are combined on
// the backend by an existing op, so the search keeps ranking each hypothesis' best
// 2 * beam tokens where the scores are (Backend::row_top_k) and downloads those alone,
// as for one model. A mixture needs exp and log per element (a new kernel, or every
// model's [H, vocab] on the host each step), and its best tokens cannot be read off the
// members' best tokens. And the identities a user checks hold exactly: an ensemble of
// one model, or of two copies of it, gives that model's scores bit for bit.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "config/config.h"
#include "decode/beam_search.h"
#include "model/device_buffers.h"

namespace thpc {

// Each model decodes incrementally through its own DecoderState (its own caches), all of
// them reordered by the same parents every step.
class EnsembleScorer final : public NextTokenScorer {
 public:
  // `models` share one backend and one vocabulary (their architectures may differ);
  // `weights` has one positive entry per model and is normalised to sum 1. At most
  // max_len generated tokens per hypothesis.
  EnsembleScorer(const std::vector<Transformer*>& models, const std::vector<float>& weights,
                 const SpecialIds& ids, int max_len);
  ~EnsembleScorer() override;
  EnsembleScorer(const EnsembleScorer&) = delete;
  EnsembleScorer& operator=(const EnsembleScorer&) = delete;

  int vocab_size() const override { return vocab_; }
  void start(const std::vector<TokenSequence>& sources) override;
  void step(const BeamStep& step, std::vector<float>& log_probs) override;
  bool step_best(const BeamStep& step, int count, std::vector<float>& values,
                 std::vector<int32_t>& tokens) override;

  const std::vector<float>& weights() const { return weights_; }

 private:
  // Runs every model's step and leaves sum_i w_i log p_i, [H, vocab] in the backend's
  // param_dtype (fp32), in hypothesis order, in combined_.
  void combine(const BeamStep& step);

  Backend& backend_;
  std::vector<CachedTransformerScorer> members_;
  std::vector<float> weights_;
  SpecialIds ids_;
  int vocab_;
  Tensor combined_;      // [H, vocab], param_dtype
  Tensor ranked_input_;  // combined_ in compute_dtype, when the two differ (GPU bf16)
  Tensor best_values_;   // row_top_k's values [H, k], param_dtype
  // 0..N-1 (N: the most hypotheses so far) on the backend, combine's row indices, and on
  // the host.
  model_detail::IdBuffer each_row_, best_columns_;
  std::vector<int32_t> each_row_host_;
};

// The weights of an ensemble of `models` models: `given` (one per model, each finite and
// > 0, read as double: 1e-300 was 0 and 1e308 "not a number" in float) or, when empty,
// 1/N each; normalised to sum 1. Throws thpc::Error naming --weights when they are not,
// or when one is too small beside the others to be more than 0 in float.
std::vector<float> ensemble_weights(size_t models, const std::vector<double>& given);

// The checkpoints transformer_decode translates with: one model, or the members of an
// ensemble, read (parameters only) and verified once, before anything is translated.
struct DecodingCheckpoints {
  std::vector<std::string> paths;
  std::vector<Checkpoint> checkpoints;
  std::vector<ModelConfig> models;  // each one's stored [model]: members may differ in size
  // The first checkpoint's whole stored configuration: its [decode] settings are the
  // defaults and its [train] the backend and threads, as fairseq and Marian take one
  // command line for all models.
  Config config;
  int vocab_size = 0;     // the first's (embed.weight's rows)
  // Separate vocabularies: the first's source vocabulary (src_embed.weight's rows); 0 when
  // one serves both sides.
  int source_vocab_size = 0;
  int max_positions = 0;  // the smallest position table: it bounds sources and outputs

  // "model.max_positions = N", and in an ensemble whose members' tables differ, whose it
  // is: "model.max_positions = 32 of B.h5, the smallest of the ensemble's" (a warning of
  // lines cut to 31 tokens named the first model's table of 64 no more than B's).
  std::string max_positions_said() const;

  // One worker's copies of the models, each built by its own [model] for inference (no
  // random initialisation, no gradients) on `backend`, with its checkpoint's parameters.
  std::vector<std::unique_ptr<Transformer>> build_models(const SpecialIds& ids,
                                                         Backend& backend) const;
};

// Reads and verifies `paths` (at least one). Throws thpc::Error naming the file that
// cannot be read or holds no embedding.
DecodingCheckpoints read_decoding_checkpoints(const std::vector<std::string>& paths);

// Why the checkpoints cannot decode together, in one line naming the two files; empty
// when they can. Their vocabularies must be one: the same size and, for every two that
// store their SentencePiece model, the same vocabulary in it (the same pieces with the
// same scores and types, and the same pad/unk/bos/eos ids; the model bytes may differ
// elsewhere, e.g. in the training file names SentencePiece records). A checkpoint that
// stores none beside one that does is accepted only with --spm-model
// (`spm_model_given`): the user names the common vocabulary. Their directions ("en->de")
// must be one where they record it.
std::string ensemble_vocabulary_mismatch(const DecodingCheckpoints& members,
                                         bool spm_model_given);


}  // namespace thpc
