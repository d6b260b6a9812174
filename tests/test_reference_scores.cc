// Scoring given references (decode/reference_scores.h, transformer_decode
// --score-reference): a pass over whole references gives each the log-probability the
// oracle gives one prefix at a time and the search gives the hypotheses it finds; a
// batch's padding, the logits in chunks and the batching change nothing beyond rounding;
// an ensemble scores the weighted mean of its models'; the batches keep their budget.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "decode/beam_search.h"
#include "decode/reference_scores.h"
#include "decode/translate.h"
#include "decode_oracles.h"
#include "decode_steps.h"
#include "kernels/cpu/cpu_backend.h"

namespace thpc {
namespace {

const SpecialIds kIds;

// The tolerance of a sentence's score against another way of computing it (a whole pass
// against one position a step, another batch's padding, other GEMM shapes): each of at
// most ~12 fp32 log-probabilities (|log p| < 5 for this random 12-token model) differs by
// a few ulps of the values it is computed from, ~1e-6, so a sum by ~1e-5; 1e-4 leaves a
// factor of ten (the largest difference seen is between 2e-6 and 1e-5).
constexpr double kSentenceTolerance = 1e-4;

// Every pair in one batch (with `pieces`, each piece's score too).
std::vector<double> score_all(const std::vector<Transformer*>& models,
                              const std::vector<float>& weights,
                              const std::vector<TokenSequence>& sources,
                              const std::vector<TokenSequence>& references,
                              std::vector<std::vector<float>>* pieces = nullptr) {
  DecodeBatch all;
  for (size_t i = 0; i < sources.size(); ++i) all.members.push_back(i);
  std::vector<double> scores(sources.size(), 0.0);
  if (pieces != nullptr) pieces->assign(sources.size(), {});
  score_batch(models, weights, kIds, sources, references, all, scores, pieces);
  return scores;
}

// Pairs of unequal lengths (padding on both sides), an empty source and an empty
// reference, and references the model would not write (tokens of any rank).
const std::vector<TokenSequence> kSources = {{4, 5, 6}, {7}, {8, 9, 10, 11, 4}, {}, {6, 6}};
const std::vector<TokenSequence> kReferences = {
    {9, 9, 4, 11}, {5}, {10, 3, 7}, {8, 4}, {}};

TEST(ReferenceScores, EqualTheOracleOnePrefixAtATime) {
  auto backend = make_cpu_backend(DType::F32);
  for (const char* norm : {"post", "pre"}) {
    Transformer model = small_model(*backend, false, norm, 9);
    const std::vector<double> scores = score_all({&model}, {}, kSources, kReferences);
    for (size_t i = 0; i < kSources.size(); ++i) {
      const double oracle =
          oracle_sequence_log_prob(model, kIds, kSources[i], kReferences[i], true);
      EXPECT_LT(oracle, 0) << norm << " pair " << i;
      EXPECT_NEAR(scores[i], oracle, kSentenceTolerance) << norm << " pair " << i;
    }
  }
}

// Each piece's score is the oracle's log p of that piece (eos last) given the prefix
// before it, they sum to the pair's score, and asking for them changes no score: alone
// and in an ensemble (the weighted mean of the models' own, piece by piece).
TEST(ReferenceScores, PieceScoresAreTheOraclesNextTokenLogProbabilities) {
  auto backend = make_cpu_backend(DType::F32);
  Transformer a = small_model(*backend, false, "post", 9);
  Transformer b = small_model(*backend, true, "pre", 31);
  for (const std::vector<Transformer*>& models :
       {std::vector<Transformer*>{&a}, std::vector<Transformer*>{&a, &b}}) {
    std::vector<std::vector<float>> pieces;
    const std::vector<double> scores =
        score_all(models, {1.0f, 3.0f}, kSources, kReferences, &pieces);
    const std::vector<double> without = score_all(models, {1.0f, 3.0f}, kSources, kReferences);
    const std::vector<float> w = models.size() == 1 ? std::vector<float>{1.0f}
                                                     : std::vector<float>{0.25f, 0.75f};
    for (size_t i = 0; i < kSources.size(); ++i) {
      ASSERT_EQ(pieces[i].size(), kReferences[i].size() + 1) << "pair " << i;
      double sum = 0;
      for (size_t t = 0; t < pieces[i].size(); ++t) {
        const TokenSequence prefix(kReferences[i].begin(),
                                   kReferences[i].begin() + static_cast<ptrdiff_t>(t));
        const int32_t token = t < kReferences[i].size() ? kReferences[i][t] : kIds.eos;
        double expected = 0;
        for (size_t m = 0; m < models.size(); ++m) {
          expected += w[m] * oracle_next_log_probs(*models[m], kIds, kSources[i], prefix)[token];
        }
        EXPECT_NEAR(pieces[i][t], expected, 1e-5) << "pair " << i << " piece " << t;
        sum += pieces[i][t];
      }
      EXPECT_NEAR(sum, scores[i], 1e-5) << "pair " << i;
      EXPECT_NEAR(without[i], scores[i], 1e-9) << "pair " << i;
    }
  }
}

// Each hypothesis the search returns scores its raw log-probability, eos included: the
// score a filter or reranker reads for a translation is the one decoding ranked it by.
// (A random model's hypotheses are cut at the length limit, without the eos a reference
// ends in: theirs is the search's plus the oracle's log p(eos) after them.)
TEST(ReferenceScores, AHypothesisScoresTheLogProbabilityTheSearchGaveIt) {
  auto backend = make_cpu_backend(DType::F32);
  Transformer model = small_model(*backend, true, "post", 23);
  const std::vector<TokenSequence> sources = {{4, 5, 6}, {7}, {8, 9, 10, 11, 4}, {6, 6}};
  BeamOptions options;
  options.beam = 4;
  options.nbest = 4;
  options.max_len_b = 8;
  options.max_len_cap = 31;
  DecodeBatch batch;
  for (size_t i = 0; i < sources.size(); ++i) batch.members.push_back(i);
  batch.max_output = 5 + 8;
  std::vector<std::vector<Hypothesis>> found(sources.size());
  translate_batch(model, kIds, sources, batch, options, found);
  std::vector<TokenSequence> pair_sources, references;
  std::vector<double> expected;
  for (size_t s = 0; s < sources.size(); ++s) {
    for (const Hypothesis& h : found[s]) {
      const bool cut = h.tokens.size() >= sources[s].size() + 8;
      pair_sources.push_back(sources[s]);
      references.push_back(h.tokens);
      const double eos =
          cut ? oracle_next_log_probs(model, kIds, sources[s], h.tokens)[kIds.eos] : 0.0;
      expected.push_back(h.log_prob + eos);
    }
  }
  ASSERT_EQ(references.size(), 16u);
  const std::vector<double> scores = score_all({&model}, {}, pair_sources, references);
  for (size_t i = 0; i < references.size(); ++i) {
    EXPECT_NEAR(scores[i], expected[i], kSentenceTolerance) << "hypothesis " << i;
  }
}

// The logits in chunks of 3 rows (chunks that split sentences, sentences of one row),
// each pair alone, and the batches make_scoring_batches cuts: the same scores (and, for
// the chunks, the same piece scores).
TEST(ReferenceScores, PaddingChunksAndBatchingChangeOnlyRounding) {
  auto backend = make_cpu_backend(DType::F32);
  Transformer model = small_model(*backend, false, "post", 9);
  const std::vector<double> whole = score_all({&model}, {}, kSources, kReferences);
  for (size_t i = 0; i < kSources.size(); ++i) {
    const double alone = score_all({&model}, {}, {kSources[i]}, {kReferences[i]})[0];
    EXPECT_NEAR(alone, whole[i], kSentenceTolerance) << "pair " << i;
  }
  std::vector<double> batched(kSources.size(), 1.0);
  const std::vector<char> scored(kSources.size(), 1);
  for (const DecodeBatch& batch :
       make_scoring_batches(kSources, kReferences, scored, 12, 1)) {
    score_batch({&model}, {}, kIds, kSources, kReferences, batch, batched);
  }
  std::vector<std::vector<float>> whole_pieces;
  score_all({&model}, {}, kSources, kReferences, &whole_pieces);
  for (const int chunk_rows : {3, 1}) {
    model.set_loss_chunk_rows(chunk_rows);
    // And each piece's score, whichever chunk holds its row (a chunk's rows are the
    // pieces of the sentences it splits, in order).
    std::vector<std::vector<float>> pieces;
    const std::vector<double> chunked =
        score_all({&model}, {}, kSources, kReferences, &pieces);
    for (size_t i = 0; i < kSources.size(); ++i) {
      EXPECT_NEAR(chunked[i], whole[i], kSentenceTolerance) << "chunks of " << chunk_rows
                                                            << ", pair " << i;
      ASSERT_EQ(pieces[i].size(), whole_pieces[i].size()) << "pair " << i;
      for (size_t t = 0; t < pieces[i].size(); ++t) {
        EXPECT_NEAR(pieces[i][t], whole_pieces[i][t], 1e-5)
            << "chunks of " << chunk_rows << ", pair " << i << " piece " << t;
      }
    }
  }
  for (size_t i = 0; i < kSources.size(); ++i) {
    EXPECT_NEAR(batched[i], whole[i], kSentenceTolerance) << "pair " << i;
  }
}

// The scores of a batch sum to its plain negative log-likelihood as validation computes
// it (Transformer::evaluate's nll, the same pass summed over the whole batch at once).
TEST(ReferenceScores, SumToTheValidationLossesLogLikelihood) {
  auto backend = make_cpu_backend(DType::F32);
  Transformer model = small_model(*backend, true, "pre", 5);
  const std::vector<double> scores = score_all({&model}, {}, kSources, kReferences);
  double sum = 0;
  for (const double score : scores) sum += score;
  const LossSums sums = model.evaluate(make_batch(kSources, kReferences, kIds));
  int64_t tokens = 0;
  for (const TokenSequence& reference : kReferences) tokens += reference.size() + 1;
  EXPECT_EQ(sums.tokens, tokens);
  EXPECT_NEAR(sum, -sums.nll, kSentenceTolerance * kSources.size());
}

// An ensemble: the weighted mean of each model's own scores (weights normalised), as its
// search scores every step.
TEST(ReferenceScores, AnEnsembleScoresTheWeightedMeanOfItsModels) {
  auto backend = make_cpu_backend(DType::F32);
  Transformer a = small_model(*backend, false, "post", 9);
  Transformer b = small_model(*backend, true, "pre", 31);
  const std::vector<double> alone_a = score_all({&a}, {}, kSources, kReferences);
  const std::vector<double> alone_b = score_all({&b}, {}, kSources, kReferences);
  const std::vector<double> mixed = score_all({&a, &b}, {1.0f, 3.0f}, kSources, kReferences);
  bool differ = false;
  for (size_t i = 0; i < kSources.size(); ++i) {
    differ = differ || std::abs(alone_a[i] - alone_b[i]) > 0.1;
    EXPECT_NEAR(mixed[i], 0.25 * alone_a[i] + 0.75 * alone_b[i], 1e-6) << "pair " << i;
  }
  EXPECT_TRUE(differ) << "the two models must not agree, or the test shows nothing";
}

// Every pair flagged is in one batch, none other; each batch holds at most the budget of
// padded tokens of its longer side (or one pair), longest pairs first.
TEST(ReferenceScores, BatchesHoldTheBudgetOfTheLongerSideAndSkipUnflaggedPairs) {
  const std::vector<TokenSequence> sources = {{1, 2}, {}, {3, 4, 5, 6, 7, 8}, {9}, {1, 1, 1}, {2}};
  const std::vector<TokenSequence> references = {{}, {5, 5, 5, 5}, {1}, {7}, {3, 3, 3}, {}};
  const std::vector<char> scored = {1, 1, 1, 1, 1, 0};
  for (const int budget : {1, 8, 10, 100}) {
    const auto batches = make_scoring_batches(sources, references, scored, budget, 1);
    std::vector<int> seen(sources.size(), 0);
    size_t previous_longest = 1000;
    for (const DecodeBatch& batch : batches) {
      ASSERT_FALSE(batch.members.empty());
      size_t longest = 0;
      for (const size_t i : batch.members) {
        ++seen[i];
        longest = std::max({longest, sources[i].size() + 1, references[i].size() + 1});
      }
      EXPECT_LE(longest, previous_longest) << "budget " << budget;
      previous_longest = longest;
      if (batch.members.size() > 1) {
        EXPECT_LE(longest * batch.members.size(), static_cast<size_t>(budget)) << "budget " << budget;
      }
    }
    for (size_t i = 0; i < sources.size(); ++i) {
      EXPECT_EQ(seen[i], scored[i] ? 1 : 0) << "budget " << budget << " pair " << i;
    }
  }
  EXPECT_EQ(make_scoring_batches(sources, references, scored, 100, 1).size(), 1u);
}

// With a cut at 8 padded tokens a batch that holds 8 ends before a shorter pair (longer
// sides with eos: 7, 7 | 5, 5 | 3, 2, 2, which held 3 and 6 before its second 2 | 1);
// without one, or with one the batch never reaches, the budget alone (one batch).
TEST(ReferenceScores, ACutBatchEndsBeforeAShorterPairOnceItHoldsEnoughTokens) {
  const std::vector<TokenSequence> sources = {{1, 1, 1, 1, 1, 1}, {1}, {1, 1, 1, 1}, {1, 1},
                                              {1}, {1}, {}, {}};
  const std::vector<TokenSequence> references = {{}, {2, 2, 2, 2, 2, 2}, {2}, {2, 2, 2, 2},
                                                 {2}, {}, {}, {2, 2}};
  const std::vector<char> scored(sources.size(), 1);
  const auto lengths = [&](int cut) {
    std::vector<std::vector<size_t>> result;
    for (const DecodeBatch& batch :
         make_scoring_batches(sources, references, scored, 100, 1, 0, cut)) {
      result.emplace_back();
      for (const size_t i : batch.members) {
        result.back().push_back(std::max(sources[i].size(), references[i].size()) + 1);
      }
    }
    return result;
  };
  using Lengths = std::vector<std::vector<size_t>>;
  EXPECT_EQ(lengths(8), (Lengths{{7, 7}, {5, 5}, {3, 2, 2}, {1}}));
  EXPECT_EQ(lengths(0), (Lengths{{7, 7, 5, 5, 3, 2, 2, 1}}));
  EXPECT_EQ(lengths(1000), lengths(0));
}

}  // namespace
}  // namespace thpc
