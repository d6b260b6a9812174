// Batched beam search (§6.1: beam 4, length penalty alpha 0.6, maximum output length
// = input length + 50, early termination when possible).
//
// The search is written against a NextTokenScorer, so the same code runs over the
// model (TransformerScorer: the decoder over each hypothesis' prefix) and over a
// hand-built score table in the tests. Hypotheses of all sentences are scored together
// in one call per step.
//
// Scores: a hypothesis Y has the raw score log P(Y | x) = sum of its tokens' log
// probabilities (eos included), and is ranked, once finished, by the GNMT length
// normalisation (Wu et al. 2016) score(Y) = log P(Y | x) / lp(Y), with
// lp(Y) = ((5 + |Y|) / 6)^alpha and |Y| the number of generated tokens, eos included.
#pragma once

#include <map>
#include <utility>
#include <vector>

#include "data/batch.h"
#include "model/transformer.h"

namespace thpc {

// Gives log p(next token | source, prefix) for a set of hypotheses.
class NextTokenScorer {
 public:
  virtual ~NextTokenScorer() = default;
  virtual int vocab_size() const = 0;
  // Called once per search with the source sentences.
  virtual void start(const std::vector<TokenSequence>& sources) = 0;
  // prefixes[i] (without bos) extends source sources[source_of[i]]; puts the host
  // log-probabilities [prefixes.size(), vocab] in `out` (resized: the search passes the
  // same vector every step, so a scorer that reuses its capacity allocates nothing).
  virtual void log_probs(const std::vector<TokenSequence>& prefixes,
                         const std::vector<int>& source_of, std::vector<float>& out) = 0;
  // The same step, but only each prefix's `count` best next tokens (pad and bos never),
  // best first, equal log-probabilities in increasing token order: values and tokens
  // [prefixes.size(), count]. A scorer that ranks where its log-probabilities are (the
  // model on a GPU) saves moving [prefixes, vocab] to the host. Returns false when the
  // scorer cannot (the default): the search then asks log_probs().
  virtual bool best_next_tokens(const std::vector<TokenSequence>& prefixes,
                                const std::vector<int>& source_of, int count,
                                std::vector<float>& values, std::vector<int32_t>& tokens) {
    return false;
  }
};

// The model as a scorer: encodes each hypothesis' source and runs the decoder over its
// whole prefix (no cache: the reference that incremental decoding must agree with).
class TransformerScorer final : public NextTokenScorer {
 public:
  TransformerScorer(Transformer& model, const SpecialIds& ids) : model_(model), ids_(ids) {}
  int vocab_size() const override { return model_.vocab_size(); }
  void start(const std::vector<TokenSequence>& sources) override;
  void log_probs(const std::vector<TokenSequence>& prefixes, const std::vector<int>& source_of,
                 std::vector<float>& out) override;

 private:
  Transformer& model_;
  SpecialIds ids_;
  std::vector<TokenSequence> sources_;
  std::vector<int> encoded_source_of_;  // the sources of the rows last encoded
};

// The model as a scorer with incremental decoding: each source is encoded once, the
// decoder keeps its self-attention keys/values per hypothesis and each step feeds only
// the newest token. The beam search hands over whole prefixes; this scorer finds each
// one's parent among the previous step's prefixes and reorders the caches to match.
class CachedTransformerScorer final : public NextTokenScorer {
 public:
  CachedTransformerScorer(Transformer& model, const SpecialIds& ids, int max_len)
      : model_(model), ids_(ids), max_len_(max_len) {}
  int vocab_size() const override { return model_.vocab_size(); }
  void start(const std::vector<TokenSequence>& sources) override;
  void log_probs(const std::vector<TokenSequence>& prefixes, const std::vector<int>& source_of,
                 std::vector<float>& out) override;
  bool best_next_tokens(const std::vector<TokenSequence>& prefixes,
                        const std::vector<int>& source_of, int count,
                        std::vector<float>& values, std::vector<int32_t>& tokens) override;

 private:
  // Brings the caches to this step's hypotheses (begins at position 0, else reorders to
  // each prefix's parent) and returns the tokens to feed; `position` gets the step's.
  std::vector<int32_t> prepare_step(const std::vector<TokenSequence>& prefixes,
                                    const std::vector<int>& source_of, int& position);

  Transformer& model_;
  SpecialIds ids_;
  int max_len_;
  // The previous step's hypotheses: (source, prefix) -> row in the caches.
  std::map<std::pair<int, TokenSequence>, int> previous_rows_;
};

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
  int max_len_a = 1;     // output length limit: max_len_a * |x| + max_len_b tokens
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

// For each source, its nbest hypotheses, best first.
std::vector<std::vector<Hypothesis>> beam_search(NextTokenScorer& scorer,
                                                 const std::vector<TokenSequence>& sources,
                                                 const SpecialIds& ids,
                                                 const BeamOptions& options);

// One step's candidate selection, exposed for its test.
namespace beam_detail {

// A live hypothesis (`parent`, its index in the sentence's live list) extended by `token`.
struct Candidate {
  double log_prob;
  int parent;
  int token;
};

// The search's ranking: higher log-probability first, then the smaller parent, then the
// smaller token (so equal scores never make the result depend on the sort).
bool ranks_before(const Candidate& a, const Candidate& b);

// Appends to `candidates` the best `count` extensions of one live hypothesis (in the
// order of ranks_before): parent_log_prob + row[token] for every token but pad and bos
// (and, when `allowed` is not null, those with allowed[token] true). A sentence's best
// `count` candidates are always among its hypotheses' best `count` each.
void add_best_extensions(const float* row, int vocab, double parent_log_prob, int parent,
                         const char* allowed, const SpecialIds& ids, size_t count,
                         std::vector<Candidate>& candidates);

}  // namespace beam_detail
}  // namespace thpc
