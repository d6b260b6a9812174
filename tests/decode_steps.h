// What the decoding tests hand a scorer: beam-search steps over fixed sources whose
// hypotheses swap places, split and vanish between steps as a beam search's do, and a
// small model to score them (test_beam_search, test_ensemble, test_sampling).
#pragma once

#include <gtest/gtest.h>

#include <utility>
#include <vector>

#include "decode/beam_search.h"
#include "model/transformer.h"

namespace thpc {

// Incremental decoding steps over the sources {4 5 6}, {7}, {8 9 10 11 4}: (prefixes,
// the source of each), hypotheses swapping places, splitting and vanishing between
// steps as a beam search's do.
using DecodeSteps = std::vector<std::pair<std::vector<TokenSequence>, std::vector<int>>>;
inline const std::vector<TokenSequence> kReorderingSources = {{4, 5, 6}, {7}, {8, 9, 10, 11, 4}};
inline const DecodeSteps& reordering_steps() {
  static const DecodeSteps steps = {
      {{{}, {}, {}}, {0, 1, 2}},
      {{{5}, {6}, {7}, {9}}, {0, 0, 1, 2}},
      {{{7, 4}, {6, 8}, {5, 11}, {5, 4}}, {1, 0, 0, 0}},
      {{{5, 4, 10}, {7, 4, 6}}, {0, 1}},
      {{{7, 4, 6, 6}, {7, 4, 6, 5}, {5, 4, 10, 9}}, {1, 1, 0}},
      // As many hypotheses as before: the cache moves in place, the decoder's rows
      // become a permutation of the hypotheses (a row changes sentence here) ...
      {{{5, 4, 10, 9, 4}, {7, 4, 6, 5, 8}, {5, 4, 10, 9, 7}}, {0, 1, 0}},
      // ... and stay one across a further in-place step.
      {{{7, 4, 6, 5, 8, 8}, {5, 4, 10, 9, 7, 5}, {5, 4, 10, 9, 4, 6}}, {1, 0, 0}},
      {{{5, 4, 10, 9, 4, 6, 9}, {7, 4, 6, 5, 8, 8, 11}}, {0, 1}},
  };
  return steps;
}

// The steps as the search hands them over: each hypothesis' parent is the previous
// step's hypothesis of its sentence whose prefix is its own without the last token.
inline std::vector<BeamStep> as_beam_steps(const DecodeSteps& steps) {
  std::vector<BeamStep> result;
  for (size_t t = 0; t < steps.size(); ++t) {
    const auto& [prefixes, source_of] = steps[t];
    BeamStep step;
    step.position = static_cast<int>(t);
    step.source_of = source_of;
    for (size_t i = 0; i < prefixes.size(); ++i) {
      step.prefix.push_back(&prefixes[i]);
      if (t == 0) continue;
      const auto& [previous, previous_source_of] = steps[t - 1];
      const TokenSequence stem(prefixes[i].begin(), prefixes[i].end() - 1);
      int parent = -1;
      for (size_t j = 0; j < previous.size(); ++j) {
        if (previous_source_of[j] == source_of[i] && previous[j] == stem) parent = static_cast<int>(j);
      }
      if (parent < 0) ADD_FAILURE() << "step " << t << " hypothesis " << i << " has no parent";
      step.parent.push_back(parent);
      step.token.push_back(prefixes[i].back());
    }
    result.push_back(std::move(step));
  }
  return result;
}

// A 2-layer model of vocabulary 12 (d_k 3 and d_v 5: the caches' chunking is exercised),
// post- or pre-norm (`norm`), randomly initialised from `seed`.
inline Transformer small_model(Backend& backend, bool learned_positions,
                               const char* norm = "post", uint64_t seed = 9) {
  ModelConfig c;
  c.norm = norm;
  c.layers = 2;
  c.d_model = 16;
  c.d_ff = 32;
  c.heads = 4;
  c.d_k = 3;
  c.d_v = 5;
  c.max_positions = 32;
  c.positions = learned_positions ? "learned" : "sinusoidal";
  c.attention_bias = learned_positions;
  return Transformer(c, 12, SpecialIds{}, backend, seed);
}

// Lets every token through. A search with a filter reads whole rows of log-probabilities
// (NextTokenScorer::step), so this makes the model-backed scorers take that path
// instead of ranking each hypothesis' best tokens themselves (step_best).
class AllowEveryToken final : public NextTokenFilter {
 public:
  explicit AllowEveryToken(int vocab) : vocab_(vocab) {}
  void allowed_next(int, const TokenSequence&, int, std::vector<char>& allowed) const override {
    allowed.assign(static_cast<size_t>(vocab_), 1);
  }

 private:
  int vocab_;
};

// A 2-layer model of vocabulary 301: rows wide enough that ranking each one's best few
// tokens differs from reading it whole.
inline ModelConfig wide_vocabulary_config() {
  ModelConfig c;
  c.layers = 2;
  c.d_model = 16;
  c.d_ff = 32;
  c.heads = 4;
  c.d_k = 4;
  c.d_v = 4;
  c.max_positions = 40;
  return c;
}
inline Transformer wide_vocabulary_model(Backend& backend, uint64_t seed = 17) {
  return Transformer(wide_vocabulary_config(), 301, SpecialIds{}, backend, seed);
}

}  // namespace thpc
