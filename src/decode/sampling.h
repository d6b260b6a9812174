// Sampling instead of searching (transformer_decode --sampling full|topk=K|topp=P
// --temperature T --seed S), for back-translation (Edunov et al. 2018, "Understanding
// Back-Translation at Scale": sampled or top-k-sampled source sides train better than
// beam outputs), as fairseq's --sampling --sampling-topk/--sampling-topp --temperature
// and Marian's --output-sampling.
//
// At every step each hypothesis draws its next token from the scorer's distribution
// (one model, or an ensemble's product of experts, decode/ensemble.h), reshaped as
//   q(y) ∝ exp(log p(y) / T)        over every token but pad and bos (never generated),
//   full:   all of them;
//   topk=K: only the K most probable (fewer when the vocabulary has fewer);
//   topp=P: only the nucleus (Holtzman et al. 2020): the smallest set of most probable
//           tokens whose mass under q is >= P (topp=1 is full);
// renormalised over the tokens kept. Ranks are by log-probability, equal ones by the
// smaller token, so the set kept is a function of the row (ties handled
// deterministically). T and the truncation act on the draw only: a hypothesis' score is
// the scorer's own log P(Y | x) of what was drawn (length-normalised with the search's
// alpha, as beam search scores).
//
// A draw is a pure function of (--seed; the sentence's index in the whole input, the
// sample, the position): Philox4x32-10 (common/philox.h) with the seed as key and
// counter (sample, site 0x50000000, position, sentence), 53 bits of it as a uniform
// u in [0, 1), and the token is the first whose cumulative mass (in rank order, in token
// order for full) exceeds u. The uniforms do not depend on the batch, the batches'
// order or the workers; the log-probabilities they are compared with do, in their last
// bits: on the CPU a row's products round differently with the height of the GEMM and
// the row's place in it, and the model amplifies that through its layers, so a
// boundary between two tokens can move far enough to change a draw now and then (on a
// random-init base model, one line of 100 differed between two batchings). So a sample
// is reproduced by the same seed and the same batching: transformer_decode batches by
// --batch-tokens alone when sampling (not by --threads) and gives every worker one
// thread (OpenBLAS rounds otherwise with more), and here every sample is a
// hypothesis from position 0 on, so that the hypotheses only decrease and the decoder's
// caches reorder in place, each row's place a function of the batch alone, not of the
// cache sizes earlier batches left (which decide how a growing beam is gathered).
//
// Several samples per sentence (BeamOptions::beam = N, transformer_decode --beam N): N
// independent draws, as fairseq samples beam-many (there from one root at the first
// step; here each sample scores the empty prefix itself, the same row). The finished
// samples are returned best score first, options.nbest of them.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "decode/beam_search.h"

namespace thpc {

struct SamplingOptions {
  enum class Method { kFull, kTopK, kTopP };
  Method method = Method::kFull;
  int top_k = 0;             // kTopK: K >= 1
  double top_p = 1.0;        // kTopP: 0 < P < 1 (P = 1 is kFull)
  double temperature = 1.0;  // T > 0
  uint64_t seed = 1;
};

// transformer_decode's --sampling METHOD [--temperature T] [--seed S], as given (an
// absent option: its default, T = 1, S = 1). METHOD is "full", "topk=K" (K >= 1) or
// "topp=P" (0 < P <= 1; topp=1 is full); T a finite number > 0; S a whole number in
// [0, 2^64). Throws thpc::Error naming the option, the value and what it accepts.
SamplingOptions parse_sampling_options(const std::string& method,
                                       const std::optional<std::string>& temperature,
                                       const std::optional<std::string>& seed);

// For each source, the options.nbest best of options.beam samples, best score first.
// `sentence_ids[s]` numbers source s in the whole input (the draws' counter).
// options.filter must be null (constrained decoding searches).
std::vector<std::vector<Hypothesis>> sample_search(NextTokenScorer& scorer,
                                                   const std::vector<TokenSequence>& sources,
                                                   const std::vector<uint32_t>& sentence_ids,
                                                   const SpecialIds& ids,
                                                   const BeamOptions& options,
                                                   const SamplingOptions& sampling);

// One draw, exposed for its tests.
namespace sampling_detail {

// The Philox site of sampling's draws (docs/design-model.md, "Randomness").
constexpr uint32_t kSamplingSite = 0x50000000u;

// u in [0, 1) with 53 random bits, for draw (seed; sentence, sample, position).
double sampling_uniform(uint64_t seed, uint32_t sentence, uint32_t sample, uint32_t position);

// Draws tokens from rows of log-probabilities as `options` says, reusing its buffers.
class TokenSampler {
 public:
  TokenSampler(const SamplingOptions& options, const SpecialIds& ids);
  // From a whole row of `vocab` log-probabilities: the token for uniform u, and its
  // log-probability (the row's, untempered).
  std::pair<int32_t, float> draw_from_row(const float* row, int vocab, double u);
  // From a row's best `count` tokens, best first, ties to the smaller token (what
  // NextTokenScorer::step_best gives), for topk=K with count = min(K, the tokens that
  // can be drawn): the same draw as draw_from_row on the whole row.
  std::pair<int32_t, float> draw_from_best(const float* values, const int32_t* tokens,
                                           int count, double u);

 private:
  struct Ranked {
    float log_prob;
    int32_t token;
  };
  // Ranks the row's drawable tokens and keeps the top-k or nucleus in kept_ (rank order).
  void keep_best(const float* row, int vocab);
  // The draw from kept_ (rank order) with weights exp((log p - best) / T).
  std::pair<int32_t, float> draw_kept(double u);

  SamplingOptions options_;
  SpecialIds ids_;
  std::vector<Ranked> kept_;
  std::vector<double> weights_;
};

}  // namespace sampling_detail
}  // namespace thpc
