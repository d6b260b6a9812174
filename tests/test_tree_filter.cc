// Constrained decoding for the parsing mode (decode/tree_filter.h): whatever the scores,
// every hypothesis the beam search finishes is a well-formed linearized tree over exactly
// the sentence's words, also at the tightest length limit; without the filter the same
// scores give malformed ones (so the first test can fail).
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "common/error.h"
#include "decode/beam_search.h"
#include "decode/tree_filter.h"
#include "parse/tree.h"

namespace thpc {
namespace {

const SpecialIds kIds;  // pad 0, unk 1, bos 2, eos 3
const std::vector<std::string> kPieces = {"<pad>", "<unk>", "<s>", "</s>", "\xe2\x96\x81(S",
                                          "\xe2\x96\x81(NP", "\xe2\x96\x81)", "\xe2\x96\x81XX",
                                          "\xe2\x96\x81the"};

// Pseudo-random log-probabilities per (source, prefix), as a model of a few minutes
// might give: nothing about them favours trees.
class RandomScorer final : public NextTokenScorer {
 public:
  int vocab_size() const override { return static_cast<int>(kPieces.size()); }
  void start(const std::vector<TokenSequence>& sources) override { sources_ = sources; }
  void log_probs(const std::vector<TokenSequence>& prefixes, const std::vector<int>& source_of,
                 std::vector<float>& out) override {
    out.clear();
    for (size_t i = 0; i < prefixes.size(); ++i) {
      TokenSequence key = sources_[source_of[i]];
      key.push_back(-1);
      key.insert(key.end(), prefixes[i].begin(), prefixes[i].end());
      std::seed_seq seed(key.begin(), key.end());
      std::mt19937 rng(seed);
      std::vector<double> logits(kPieces.size());
      double total = 0;
      for (size_t j = 0; j < logits.size(); ++j) {
        logits[j] = std::normal_distribution<double>(0.0, 2.0)(rng);
        if (static_cast<int>(j) != kIds.pad && static_cast<int>(j) != kIds.bos) {
          total += std::exp(logits[j]);
        }
      }
      for (size_t j = 0; j < logits.size(); ++j) {
        out.push_back(static_cast<float>(logits[j] - std::log(total)));
      }
    }
  }

 private:
  std::vector<TokenSequence> sources_;
};

// The decoded text, as transformer_decode writes it (SentencePiece's "▁" a space).
std::string text_of(const TokenSequence& tokens) {
  std::string text;
  for (const int32_t id : tokens) {
    text += (text.empty() ? "" : " ") + kPieces.at(id).substr(3);
  }
  return text;
}

struct Counted {
  int well_formed = 0, not_well_formed = 0;
};

// Searches sentences of 1..8 words and checks every hypothesis of every beam.
Counted search_and_count(bool filtered, int max_len_a, int max_len_b, bool require_trees) {
  std::vector<TokenSequence> sources;
  std::vector<int> words;
  for (int n = 1; n <= 8; ++n) {
    sources.push_back(TokenSequence(n, 8));  // n source tokens "▁the": n words
    words.push_back(n);
  }
  const TreeTokenFilter filter(kPieces, kIds.eos, words);
  BeamOptions options;
  options.beam = 4;
  options.nbest = 4;
  options.max_len_a = max_len_a;
  options.max_len_b = max_len_b;
  options.filter = filtered ? &filter : nullptr;
  RandomScorer scorer;
  const auto results = beam_search(scorer, sources, kIds, options);
  Counted counted;
  for (size_t s = 0; s < sources.size(); ++s) {
    EXPECT_FALSE(results[s].empty()) << "sentence " << s;
    const std::vector<std::string> sentence(words[s], "w"), tags(words[s], "NN");
    for (const Hypothesis& hypothesis : results[s]) {
      const std::string text = text_of(hypothesis.tokens);
      int placeholders = 0;
      for (const int32_t id : hypothesis.tokens) placeholders += id == 7;
      const bool tree = parse::delinearize(text, sentence, tags).how ==
                            parse::Reconstruction::kWellFormed &&
                        placeholders == words[s] && text.find("the") == std::string::npos;
      (tree ? counted.well_formed : counted.not_well_formed)++;
      if (require_trees) {
        EXPECT_TRUE(tree) << words[s] << " words: '" << text << "'";
      }
    }
  }
  return counted;
}

TEST(TreeTokenFilter, EveryFinishedHypothesisIsAWellFormedTreeOverTheWords) {
  // The parser configs' limit, 4 * |x| + 10 tokens.
  const Counted filtered = search_and_count(true, 4, 10, true);
  EXPECT_EQ(filtered.well_formed, 8 * 4);
  // The same scores unfiltered: (almost) nothing is a tree.
  const Counted free = search_and_count(false, 4, 10, false);
  EXPECT_GT(free.not_well_formed, 8 * 4 / 2);
}

TEST(TreeTokenFilter, TheTightestLengthLimitStillEndsInATree) {
  // |x| + 3 tokens: exactly one constituent's brackets, the words and eos fit, so a
  // second opening bracket must never be allowed.
  search_and_count(true, 1, 3, true);
}

TEST(TreeTokenFilter, AVocabularyWithoutTreeTokensIsRefused) {
  std::vector<std::string> no_placeholder = kPieces;
  no_placeholder[7] = "\xe2\x96\x81" "dog";
  try {
    TreeTokenFilter filter(no_placeholder, kIds.eos, {3});
    FAIL() << "a vocabulary without XX was accepted";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("XX"), std::string::npos) << error.what();
  }
}

}  // namespace
}  // namespace thpc
