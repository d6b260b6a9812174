// Batched beam search (§6.1: beam 4, length penalty alpha 0.6, maximum output length
// = input length + 50, early termination when possible).
//
// The search is written against a NextTokenScorer, so the same code runs over the
// model (CachedTransformerScorer: one position per step through the decoder's caches;
// the tests' TransformerScorer, tests/decode_oracles.h: the decoder over each
// hypothesis' prefix) and over a hand-built score table in the tests. Hypotheses of all sentences are scored together in one call
// per step, which hands the scorer what the search holds: each hypothesis' parent in the
// previous step and the token it appended (a cached scorer reorders its caches by the
// parents and feeds the tokens), and a view of its whole prefix.
//
// Scores: a hypothesis Y has the raw score log P(Y | x) = sum of its tokens' log
// probabilities (eos included), and is ranked, once finished, by the GNMT length
// normalisation (Wu et al. 2016) score(Y) = log P(Y | x) / lp(Y), with
// lp(Y) = ((5 + |Y|) / 6)^alpha and |Y| the number of generated tokens, eos included.
#pragma once

#include <cmath>
#include <vector>

#include "data/batch.h"
#include "model/transformer.h"

namespace thpc {

// The hypotheses of one search step, as the search holds them. Each has generated
// `position` tokens: at position 0 every sentence has one hypothesis, the empty one (the
// decoder reads bos), and every later hypothesis extends one of the previous step's by
// one token. The vectors have one entry per hypothesis (parent and token none at
// position 0); the search keeps them from step to step.
struct BeamStep {
  int position = 0;
  std::vector<int> source_of;  // its sentence: an index into start()'s sources
  std::vector<int> parent;     // the previous step's hypothesis it extends (its index there)
  std::vector<int32_t> token;  // the token it appended to its parent: the one to feed
  // Its tokens (without bos, `position` of them): the search's own, valid during the
  // call; for scorers that read whole prefixes (the reference, the tests' tables).
  std::vector<const TokenSequence*> prefix;
  int size() const { return static_cast<int>(source_of.size()); }
  // Appends a hypothesis of sentence `source` whose tokens are `tokens` (kept by the
  // caller, valid during the step), extending the previous step's hypothesis
  // `parent_index` by its last token (unused at position 0); returns its index here.
  int add_hypothesis(int source, const TokenSequence& tokens, int parent_index) {
    if (position > 0) {
      parent.push_back(parent_index);
      token.push_back(tokens.back());
    }
    source_of.push_back(source);
    prefix.push_back(&tokens);
    return size() - 1;
  }
  // Empties the hypotheses (keeping the vectors' capacity), not the position.
  void clear_hypotheses() {
    source_of.clear();
    parent.clear();
    token.clear();
    prefix.clear();
  }
};

// Gives log p(next token | source, prefix) for a set of hypotheses.
class NextTokenScorer {
 public:
  virtual ~NextTokenScorer() = default;
  virtual int vocab_size() const = 0;
  // Called once per search with the source sentences.
  virtual void start(const std::vector<TokenSequence>& sources) = 0;
  // Scores the step's hypotheses: puts the host log-probabilities [step.size(), vocab] in
  // `log_probs` (resized: the search passes the same vector every step, so a scorer that
  // reuses its capacity allocates nothing). Steps come in order, one per position.
  virtual void step(const BeamStep& step, std::vector<float>& log_probs) = 0;
  // The same step, but only each hypothesis' `count` best next tokens (pad and bos
  // never), best first, equal log-probabilities in increasing token order: values and
  // tokens [step.size(), count]. A scorer that ranks where its log-probabilities are (the
  // model on a GPU) saves moving [hypotheses, vocab] to the host. Returns false, having
  // done nothing, when the scorer cannot (the default): the search then calls step().
  virtual bool step_best(const BeamStep& step, int count, std::vector<float>& values,
                         std::vector<int32_t>& tokens) {
    return false;
  }
};

// The model as a scorer with incremental decoding: the sources are encoded once, the
// decoder keeps its keys and values in the model's DecoderState (model/decoder_state.h),
// and each step reorders them by the step's parents and feeds only the newest tokens.
//
// Where the model's decoding steps are captured (Backend::can_capture: CUDA graphs with
// transformer_decode's --cuda-graphs on, or train.cuda_kernels step_graphs) each new step
// shape costs a capture, and a batch's hypotheses fall by a beam every time one of its
// sentences finishes: most steps of a batch's tail would be a shape captured once and
// replayed once or never. There the
// scorer pads each step (padded_step_rows): the last hypotheses of finished sentences
// are fed on, their results dropped, until the unfinished sentences fit the next smaller
// bucket of 1, 2, 3, 4, 6, 8, 12, 16, 24, ... sentences, so that a batch of 32 meets ten
// shapes at most; and it rounds the batch's source length and its cache's length up to
// the same buckets, so that the next batches of similar lengths replay those shapes'
// graphs instead of capturing their own. The search sees its own hypotheses only.
class CachedTransformerScorer final : public NextTokenScorer {
 public:
  // At most max_len generated tokens per hypothesis.
  CachedTransformerScorer(Transformer& model, const SpecialIds& ids, int max_len)
      : model_(model), ids_(ids), max_len_(max_len) {}
  int vocab_size() const override { return model_.vocab_size(); }
  void start(const std::vector<TokenSequence>& sources) override;
  void step(const BeamStep& step, std::vector<float>& log_probs) override;
  bool step_best(const BeamStep& step, int count, std::vector<float>& values,
                 std::vector<int32_t>& tokens) override;

  // The same step, left on the backend for a caller that combines several models'
  // (decode/ensemble.h): Transformer::decode_step's log-probabilities [H, vocab], row h
  // hypothesis h's, valid until the model's next step.
  Tensor step_on_backend(const BeamStep& step);
  Transformer& model() { return model_; }

 private:
  // Brings the decoder state to this step's hypotheses (begins it at position 0, else
  // reorders it by the parents) and returns the tokens to feed: the step's, and where
  // `may_pad` and the steps are captured, the padding's after them.
  const std::vector<int32_t>& prepare_step(const BeamStep& step, bool may_pad);

  Transformer& model_;
  SpecialIds ids_;
  int max_len_;
  std::vector<int32_t> bos_;  // the first step's tokens
  // A padded step's parents and tokens (the step's own first) and the padding's scratch.
  std::vector<int> padded_parent_, previous_source_, sentence_rows_;
  std::vector<int32_t> padded_token_;
};

// The step padding of CachedTransformerScorer, exposed for its test. A step of the
// search's hypotheses (`parent`, their parents among the previous step's rows, and
// `source_of`, their sentences) after a step whose rows translated
// `previous_source_of`: the parents of the padding, appended to `padded_parent` after the
// step's own. The unfinished sentences (those of `source_of`) are rounded up to the
// smallest bucket of 1, 2, 3, 4, 6, 8, 12, 16, 24, ... that holds them, at most the
// sentences the previous step had rows of; each sentence added is a finished one that had
// rows in the previous step (in their order there), and gets as many rows as the
// step's fullest sentence has, each continuing one of its previous rows (in turn), so
// that a sentence's slots never grow. `sentence_rows` is scratch.
void padded_step_rows(const std::vector<int>& parent, const std::vector<int>& source_of,
                      const std::vector<int>& previous_source_of, std::vector<int>& padded_parent,
                      std::vector<int>& sentence_rows);
// The smallest of 1, 2, 3, 4, 6, 8, 12, 16, 24, ... (2^k and 3 * 2^k) that is >= count.
int step_bucket(int count);

// Which tokens may extend a hypothesis (constrained decoding, e.g. the parser's
// well-formed trees: decode/tree_filter.h). `source` indexes the search's sources,
// `max_len` is that sentence's length limit (eos counted); `allowed` gets one entry per
// vocabulary token, eos included. Disallowed tokens are never candidates.
class NextTokenFilter {
 public:
  virtual ~NextTokenFilter() = default;
  virtual void allowed_next(int source, const TokenSequence& prefix, int max_len,
                            std::vector<char>& allowed) const = 0;
  // May rewrite the hypothesis' next-token log-probabilities (`vocab` of them) before the
  // search ranks the allowed ones; each must stay <= 0. The default leaves them.
  virtual void rescore(int source, const TokenSequence& prefix, float* log_probs) const {}
};

struct BeamOptions {
  int beam = 4;
  float alpha = 0.6f;    // length penalty exponent; 0 ranks by raw log-probability
  double max_len_a = 1;  // output length limit: max_len_a * |x| + max_len_b tokens
  int max_len_b = 50;
  int max_len_cap = 0;   // > 0: never longer than this (the model's position table)
  int nbest = 1;         // hypotheses returned per sentence, best first (<= beam)
  const NextTokenFilter* filter = nullptr;  // none: every token but pad and bos
};

struct Hypothesis {
  TokenSequence tokens;  // without bos and eos
  double log_prob = 0;   // raw score, eos included
  double score = 0;      // log_prob / lp(|tokens| + 1)
};

// lp(Y) = ((5 + length) / 6)^alpha.
double length_penalty(int length, float alpha);

// Whether lp of an output of `longest` tokens overflows a double for `alpha`: every score
// would be -0, their order, the early stop and the n-best arbitrary (--lenpen 1e30).
// transformer_decode refuses such an alpha, and so does training for its validation BLEU.
inline bool length_penalty_overflows(int longest, float alpha) {
  return !std::isfinite(length_penalty(longest, alpha));
}

// The tokens a search can choose from a vocabulary of `vocab_size`: all but pad and bos.
// A beam wider than this cannot be filled (nor --nbest lines written).
inline int selectable_tokens(int vocab_size) { return vocab_size - 2; }

// For each source, its nbest hypotheses, best first.
std::vector<std::vector<Hypothesis>> beam_search(NextTokenScorer& scorer,
                                                 const std::vector<TokenSequence>& sources,
                                                 const SpecialIds& ids,
                                                 const BeamOptions& options);

// One step's candidate selection, exposed for its test, and what the sampler
// (decode/sampling.h) shares with the search.
namespace beam_detail {

// A sentence's output length limit in generated tokens (eos counted):
// max_len_a * source_length + max_len_b rounded down (fairseq's int(a * |x| + b): a is a
// ratio, 1.2 say), at most max_len_cap when that is set, at least 1.
int output_length_limit(size_t source_length, const BeamOptions& options);

// Scores one step: each hypothesis' best `ranked_count` tokens into best_values and
// best_tokens [H, ranked_count] when ranked_count > 0 and the scorer ranks them itself
// (NextTokenScorer::step_best), else whole rows into log_probs [H, vocab]. Returns
// whether it ranked; checks the sizes the scorer gave.
bool score_step(NextTokenScorer& scorer, const BeamStep& step, int ranked_count,
                std::vector<float>& log_probs, std::vector<float>& best_values,
                std::vector<int32_t>& best_tokens);

// A hypothesis that ends after `generated` tokens (eos included; or cut at the length
// limit, which counts eos): its tokens (without eos), its raw score log P(Y | x) and its
// score, normalised by the GNMT length penalty lp(generated).
Hypothesis finished_hypothesis(TokenSequence tokens, double log_prob, int generated, float alpha);

// A live hypothesis (`parent`, its index in the sentence's live list) extended by `token`.
struct Candidate {
  double log_prob;
  int parent;
  int token;
};

// The search's ranking: higher log-probability first, then the smaller parent, then the
// smaller token (so equal scores never make the result depend on the sort).
bool ranks_before(const Candidate& a, const Candidate& b);

// The best `keep` of a sentence's candidates, best first in the order of ranks_before,
// into `best`: `candidates` holds its hypotheses' extensions, hypothesis by hypothesis,
// hypothesis h's ending before row_ends[h]. Each hypothesis' run is taken as it comes
// when ranks_before orders it already (add_best_extensions' runs, and a scorer's ranked
// tokens almost always: see the definition), else sorted in place; the runs are then
// merged, `keep` steps of a scan over the hypotheses' heads, instead of a partial sort of
// them all (the search's host time between two GPU steps, issue 53). The result is a
// partial sort's: ranks_before is a strict total order on a sentence's candidates.
void best_candidates(std::vector<Candidate>& candidates, const std::vector<size_t>& row_ends,
                     size_t keep, std::vector<Candidate>& best);

// Appends to `candidates` the best `count` extensions of one live hypothesis (in the
// order of ranks_before): parent_log_prob + row[token] for every token but pad and bos
// (and, when `allowed` is not null, those with allowed[token] true). A sentence's best
// `count` candidates are always among its hypotheses' best `count` each.
void add_best_extensions(const float* row, int vocab, double parent_log_prob, int parent,
                         const char* allowed, const SpecialIds& ids, size_t count,
                         std::vector<Candidate>& candidates);

}  // namespace beam_detail
}  // namespace thpc
