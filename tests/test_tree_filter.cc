// Constrained decoding for the parsing mode (decode/tree_filter.h): whatever the scores,
// every hypothesis the beam search finishes is a well-formed linearized tree over exactly
// the sentence's words (placeholders, or the words' own pieces), also at the tightest
// length limit; without the filter the same scores give malformed ones (so the tests can
// fail). With words as leaves the filter also rescores: the exact numbers are checked.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
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
  void step(const BeamStep& step, std::vector<float>& out) override {
    out.clear();
    for (int i = 0; i < step.size(); ++i) {
      TokenSequence key = sources_[step.source_of[i]];
      key.push_back(-1);
      key.insert(key.end(), step.prefix[i]->begin(), step.prefix[i]->end());
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
    TreeTokenFilter filter(no_placeholder, kIds.eos, std::vector<int>{3});
    FAIL() << "a vocabulary without XX was accepted";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("XX"), std::string::npos) << error.what();
  }
}

// Word leaves (transformer_trees linearize --leaves words): the words are the source's
// own pieces. The vocabulary adds a word of two pieces, "▁ca" + "t" ("cat").
const std::vector<std::string> kWordPieces = {
    "<pad>", "<unk>", "<s>", "</s>", "\xe2\x96\x81(S", "\xe2\x96\x81(NP", "\xe2\x96\x81)",
    "\xe2\x96\x81the", "\xe2\x96\x81" "ca", "t", "\xe2\x96\x81" "dog"};
constexpr int kOpenS = 4, kClose = 6, kThe = 7, kCa = 8, kT = 9, kDog = 10;

// RandomScorer's log-probabilities over kWordPieces (the first kPieces.size() tokens
// from RandomScorer, the rest a fixed small share: still nothing favours trees).
class RandomWordScorer final : public NextTokenScorer {
 public:
  int vocab_size() const override { return static_cast<int>(kWordPieces.size()); }
  void start(const std::vector<TokenSequence>& sources) override { inner_.start(sources); }
  void step(const BeamStep& step, std::vector<float>& out) override {
    std::vector<float> inner;
    inner_.step(step, inner);
    out.clear();
    const size_t n = kPieces.size(), extra = kWordPieces.size() - n;
    for (int i = 0; i < step.size(); ++i) {
      for (size_t j = 0; j < n; ++j) out.push_back(inner[i * n + j] + std::log(0.5f));
      for (size_t j = 0; j < extra; ++j) out.push_back(std::log(0.5f / extra));
    }
  }

 private:
  RandomScorer inner_;
};

TEST(TreeTokenFilter, WordLeavesCopyTheSourceAndBracketOnlyBetweenWords) {
  // Sentences of 1..6 words drawn from "the", "cat" (two pieces) and "dog".
  std::vector<TokenSequence> sources;
  std::vector<std::vector<std::string>> sentences;
  std::mt19937 rng(7);
  for (int n = 1; n <= 6; ++n) {
    TokenSequence pieces;
    std::vector<std::string> words;
    for (int w = 0; w < n; ++w) {
      switch (std::uniform_int_distribution<int>(0, 2)(rng)) {
        case 0: pieces.push_back(kThe); words.push_back("the"); break;
        case 1: pieces.push_back(kCa); pieces.push_back(kT); words.push_back("cat"); break;
        default: pieces.push_back(kDog); words.push_back("dog"); break;
      }
    }
    sources.push_back(pieces);
    sentences.push_back(words);
  }
  const TreeTokenFilter filter(kWordPieces, kIds, sources);
  for (const bool filtered : {true, false}) {
    BeamOptions options;
    options.beam = 4;
    options.nbest = 4;
    options.max_len_a = 4;
    options.max_len_b = 10;
    options.filter = filtered ? &filter : nullptr;
    RandomWordScorer scorer;
    const auto results = beam_search(scorer, sources, kIds, options);
    int trees = 0, hypotheses = 0;
    for (size_t s = 0; s < sources.size(); ++s) {
      for (const Hypothesis& hypothesis : results[s]) {
        ++hypotheses;
        // The text transformer_decode writes: a piece with "▁" starts a new token.
        std::string text;
        TokenSequence words;
        bool bracket_inside_a_word = false;
        for (size_t k = 0; k < hypothesis.tokens.size(); ++k) {
          const int32_t id = hypothesis.tokens[k];
          const std::string& piece = kWordPieces.at(id);
          const bool starts = piece.rfind("\xe2\x96\x81", 0) == 0;
          text += starts ? (text.empty() ? "" : " ") + piece.substr(3) : piece;
          if (id >= kThe) words.push_back(id);
          if (id < kThe && k + 1 < hypothesis.tokens.size() && hypothesis.tokens[k + 1] == kT) {
            bracket_inside_a_word = true;
          }
        }
        const std::vector<std::string> tags(sentences[s].size(), "NN");
        const parse::Delinearized tree = parse::delinearize(text, sentences[s], tags);
        const bool good = tree.how == parse::Reconstruction::kWellFormed &&
                          words == sources[s] && !bracket_inside_a_word &&
                          parse::words_of(tree.tree) == sentences[s];
        if (filtered) {
          EXPECT_TRUE(good) << "sentence " << s << ": '" << text << "'";
        }
        trees += good;
      }
    }
    if (filtered) {
      EXPECT_EQ(hypotheses, 6 * 4);
    } else {
      EXPECT_LT(trees, hypotheses / 2) << "unfiltered, the scores alone make trees";
    }
  }
}

TEST(TreeTokenFilter, WordLeavesScoreTheChoiceToPlaceAWordNotWhichWord) {
  // Source "the cat": pieces ▁the ▁ca t.
  const TreeTokenFilter filter(kWordPieces, kIds, std::vector<TokenSequence>{{kThe, kCa, kT}});
  std::vector<float> row(kWordPieces.size());
  for (size_t id = 0; id < row.size(); ++id) row[id] = -0.5f - 0.25f * static_cast<float>(id);
  // At a word boundary (after "(S the"): the next word's log-probability becomes that of
  // any word piece, log(sum exp) over <unk>, ▁the, ▁ca, t, ▁dog (not pad or bos, never
  // generated); brackets and eos keep theirs.
  std::vector<float> rescored = row;
  filter.rescore(0, {kOpenS, kThe}, rescored.data());
  double words = 0;
  for (const int id : {kIds.unk, kThe, kCa, kT, kDog}) words += std::exp(static_cast<double>(row[id]));
  // float log-probabilities: a few ulps of the result (|log| < 1 here).
  EXPECT_NEAR(rescored[kCa], std::log(words), 4 * std::numeric_limits<float>::epsilon());
  for (size_t id = 0; id < row.size(); ++id) {
    if (static_cast<int>(id) != kCa) {
      EXPECT_EQ(rescored[id], row[id]) << "token " << id;
    }
  }
  // Inside "cat" (after ▁ca) the piece "t" is forced: it costs nothing.
  rescored = row;
  filter.rescore(0, {kOpenS, kThe, kCa}, rescored.data());
  EXPECT_EQ(rescored[kT], 0.0f);
  // Every word placed: only brackets and eos are left to choose, unchanged.
  rescored = row;
  filter.rescore(0, {kOpenS, kThe, kCa, kT}, rescored.data());
  EXPECT_EQ(rescored, row);
  // The placeholder mode never rescores.
  const TreeTokenFilter placeholders(kPieces, kIds.eos, std::vector<int>{2});
  std::vector<float> short_row(row.begin(), row.begin() + kPieces.size());
  const std::vector<float> before = short_row;
  placeholders.rescore(0, {kOpenS}, short_row.data());
  EXPECT_EQ(short_row, before);
}

TEST(TreeTokenFilter, WordLeavesRefuseASourceHoldingABracket) {
  try {
    TreeTokenFilter filter(kWordPieces, kIds, std::vector<TokenSequence>{{kThe, kClose}});
    FAIL() << "a source with a bracket piece was accepted";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("bracket"), std::string::npos) << error.what();
  }
}

}  // namespace
}  // namespace thpc
