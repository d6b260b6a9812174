// The test oracles of decoding, written for plainness and not used by the programs: each
// recomputes the decoder over a whole prefix at every step, with no cache, so that what
// the programs run (the KV-cached CachedTransformerScorer, beam_search) is checked
// against the model's own full forward pass (test_beam_search, test_ensemble,
// test_sampling, test_model, test_learning, test_checkpoint).
#pragma once

#include <algorithm>
#include <vector>

#include "data/batch.h"
#include "decode/beam_search.h"
#include "model/transformer.h"

namespace thpc {

// Output length limit, as the paper's decoding: max_len_a * |x| + max_len_b (§6.1:
// input length + 50), and never beyond the model's position table.
struct GreedyOptions {
  int max_len_a = 1;
  int max_len_b = 50;
};

// Greedy decoding by full recomputation: at each step the decoder runs over the whole
// prefix and the most probable next token is appended. It is the reference that
// beam_search with beam 1 and alpha 0 must equal
// (BeamSearch.BeamOneWithoutLengthPenaltyIsGreedyOnTheModel); the learning test uses it
// to check that a trained model really transduces. Translates `sources` (token ids
// without eos); returns each hypothesis without bos/eos.
inline std::vector<TokenSequence> greedy_decode(Transformer& model,
                                                const std::vector<TokenSequence>& sources,
                                                const SpecialIds& ids,
                                                const GreedyOptions& options = {}) {
  const int B = static_cast<int>(sources.size());
  if (B == 0) return {};
  const int vocab = model.vocab_size();
  // The encoder needs only sources; make_batch wants targets, so give empty ones.
  const Batch batch = make_batch(sources, std::vector<TokenSequence>(B), ids);
  model.encode(batch);

  std::vector<int> limit(B);
  int longest_limit = 0;
  for (int b = 0; b < B; ++b) {
    // +1: the decoder input also holds bos.
    limit[b] = std::min(options.max_len_a * static_cast<int>(sources[b].size()) +
                            options.max_len_b,
                        model.config().max_positions - 1);
    longest_limit = std::max(longest_limit, limit[b]);
  }

  std::vector<TokenSequence> hypotheses(B);
  std::vector<bool> finished(B, false);
  for (int t = 0; t < longest_limit; ++t) {
    // Prefix matrix [B, t+1]: bos then the tokens chosen so far. Finished sentences
    // keep being fed (their output is ignored) so that every row has t+1 real tokens.
    const int T = t + 1;
    std::vector<int32_t> prefixes(static_cast<size_t>(B) * T, ids.pad);
    std::vector<int32_t> lengths(B, T);
    for (int b = 0; b < B; ++b) {
      prefixes[static_cast<size_t>(b) * T] = ids.bos;
      for (int i = 0; i < t; ++i) {
        const bool have = i < static_cast<int>(hypotheses[b].size());
        prefixes[static_cast<size_t>(b) * T + 1 + i] = have ? hypotheses[b][i] : ids.eos;
      }
    }
    const std::vector<float> log_probs = model.next_token_log_probs(prefixes, lengths, T);
    bool all_finished = true;
    for (int b = 0; b < B; ++b) {
      if (finished[b]) continue;
      const float* row = log_probs.data() + static_cast<size_t>(b) * vocab;
      // pad and bos are never generated (as in beam search).
      int best = -1;
      for (int token = 0; token < vocab; ++token) {
        if (token == ids.pad || token == ids.bos) continue;
        if (best < 0 || row[token] > row[best]) best = token;
      }
      if (best == ids.eos || t + 1 >= limit[b]) {
        finished[b] = true;
        if (best != ids.eos) hypotheses[b].push_back(best);
      } else {
        hypotheses[b].push_back(best);
        all_finished = false;
      }
    }
    if (all_finished) break;
  }
  return hypotheses;
}

// The model as a scorer: encodes each hypothesis' source and runs the decoder over its
// whole prefix (no cache: the reference that incremental decoding must agree with).
class TransformerScorer final : public NextTokenScorer {
 public:
  TransformerScorer(Transformer& model, const SpecialIds& ids) : model_(model), ids_(ids) {}
  int vocab_size() const override { return model_.vocab_size(); }

  void start(const std::vector<TokenSequence>& sources) override {
    sources_ = sources;
    encoded_source_of_.clear();
  }

  void step(const BeamStep& step, std::vector<float>& log_probs) override {
    // The encoder runs once per distinct row layout: rows are re-encoded only when the
    // set of hypotheses per source changes (sentences finishing, the first step).
    if (step.source_of != encoded_source_of_) {
      std::vector<TokenSequence> rows;
      for (int s : step.source_of) rows.push_back(sources_.at(s));
      model_.encode(make_batch(rows, std::vector<TokenSequence>(rows.size()), ids_));
      encoded_source_of_ = step.source_of;
    }
    int T = 0;
    for (const TokenSequence* p : step.prefix) T = std::max(T, static_cast<int>(p->size()) + 1);
    std::vector<int32_t> tgt_in(step.prefix.size() * static_cast<size_t>(T), ids_.pad);
    std::vector<int32_t> lengths;
    for (size_t i = 0; i < step.prefix.size(); ++i) {
      tgt_in[i * T] = ids_.bos;
      std::copy(step.prefix[i]->begin(), step.prefix[i]->end(), tgt_in.begin() + i * T + 1);
      lengths.push_back(static_cast<int32_t>(step.prefix[i]->size()) + 1);
    }
    log_probs = model_.next_token_log_probs(tgt_in, lengths, T);
  }

 private:
  Transformer& model_;
  SpecialIds ids_;
  std::vector<TokenSequence> sources_;
  std::vector<int> encoded_source_of_;  // the sources of the rows last encoded
};

// The oracle's log p(next | source, prefix), the whole vocabulary's row.
inline std::vector<float> oracle_next_log_probs(Transformer& model, const SpecialIds& ids,
                                                const TokenSequence& source,
                                                const TokenSequence& prefix) {
  TransformerScorer scorer(model, ids);
  scorer.start({source});
  BeamStep step;
  step.position = static_cast<int>(prefix.size());
  step.source_of = {0};
  step.prefix = {&prefix};
  std::vector<float> row;
  scorer.step(step, row);
  return row;
}

// The oracle's log P(tokens [, eos] | source): one prefix at a time, nothing cached or
// batched.
inline double oracle_sequence_log_prob(Transformer& model, const SpecialIds& ids,
                                       const TokenSequence& source, const TokenSequence& tokens,
                                       bool with_eos) {
  double total = 0;
  for (size_t t = 0; t < tokens.size() + (with_eos ? 1 : 0); ++t) {
    const TokenSequence prefix(tokens.begin(), tokens.begin() + static_cast<ptrdiff_t>(t));
    total += oracle_next_log_probs(model, ids, source, prefix)[t < tokens.size() ? tokens[t]
                                                                                 : ids.eos];
  }
  return total;
}

}  // namespace thpc
