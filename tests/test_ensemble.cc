// Ensemble decoding (decode/ensemble.h): an ensemble of one model, or of two copies of
// it, is that model bit for bit (step by step and through the whole search); two
// different models (different sizes too) score every step with the weighted mean of
// their log-probabilities, which the test recomputes from each model alone; a search's
// scores are the mean of the models' own sequence log-probabilities; weights and
// vocabularies are checked with messages naming what is wrong.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "data/sentencepiece_vocabulary.h"
#include "decode/beam_search.h"
#include "decode/ensemble.h"
#include "decode_oracles.h"
#include "decode_steps.h"
#include "expect_error.h"
#include "kernels/cpu/cpu_backend.h"
#include "spm_model.h"

namespace thpc {
namespace {

const SpecialIds kIds;

// A post-norm model of another shape than small_model's (one layer, d_model 24; the
// tests make small_model pre-norm beside it) over the same 12-token vocabulary: an
// ensemble's members need only share the vocabulary.
Transformer other_model(Backend& backend, uint64_t seed) {
  ModelConfig c;
  c.layers = 1;
  c.d_model = 24;
  c.d_ff = 40;
  c.heads = 4;
  c.max_positions = 32;
  return Transformer(c, 12, kIds, backend, seed);
}

// Each of the reordering steps through `scorer` (step, or step_best with k best), the
// rows kept per step.
std::vector<std::vector<float>> rows_of_steps(NextTokenScorer& scorer) {
  scorer.start(kReorderingSources);
  std::vector<std::vector<float>> rows;
  for (const BeamStep& step : as_beam_steps(reordering_steps())) {
    rows.emplace_back();
    scorer.step(step, rows.back());
  }
  return rows;
}

struct Ranked {
  std::vector<std::vector<float>> values;
  std::vector<std::vector<int32_t>> tokens;
};
Ranked best_of_steps(NextTokenScorer& scorer, int k) {
  scorer.start(kReorderingSources);
  Ranked ranked;
  for (const BeamStep& step : as_beam_steps(reordering_steps())) {
    ranked.values.emplace_back();
    ranked.tokens.emplace_back();
    EXPECT_TRUE(scorer.step_best(step, k, ranked.values.back(), ranked.tokens.back()));
  }
  return ranked;
}

void expect_same_results(const std::vector<std::vector<Hypothesis>>& a,
                         const std::vector<std::vector<Hypothesis>>& b, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t s = 0; s < a.size(); ++s) {
    ASSERT_EQ(a[s].size(), b[s].size()) << what << " sentence " << s;
    for (size_t k = 0; k < a[s].size(); ++k) {
      EXPECT_EQ(a[s][k].tokens, b[s][k].tokens) << what << " sentence " << s << " #" << k;
      EXPECT_EQ(a[s][k].log_prob, b[s][k].log_prob) << what << " sentence " << s << " #" << k;
      EXPECT_EQ(a[s][k].score, b[s][k].score) << what << " sentence " << s << " #" << k;
    }
  }
}

const std::vector<TokenSequence> kSearchSources = {
    {4, 5, 6}, {7}, {8, 9, 10, 11, 4}, {6, 6}, {100, 200, 300, 12, 13, 14}};

BeamOptions search_options(int beam) {
  BeamOptions options;
  options.beam = beam;
  options.nbest = beam;
  options.alpha = beam == 1 ? 0.0f : 0.6f;
  options.max_len_b = 8;
  options.max_len_cap = 39;
  return options;
}

// An ensemble of one model and one of two copies of it against the model alone: the same
// log-probabilities bit for bit at every step (whole rows and each row's best), and the
// same search results, beam 4 and greedy, whole rows and ranked. Every scorer has its own
// fresh model (the same parameters): a model's kept caches decide where the next search's
// rows land, and OpenBLAS may round a row differently elsewhere in a GEMM (see
// test_beam_search's BeamSearchRankingOnTheModelEqualsRankingWholeRows).
TEST(Ensemble, OfOneModelOrTwoCopiesIsTheModelBitForBit) {
  for (const int copies : {1, 2}) {
    const std::string what = std::to_string(copies) + " copies";
    auto make = [&] {
      std::vector<std::unique_ptr<Backend>> backends;
      std::vector<std::unique_ptr<Transformer>> models;
      backends.push_back(make_cpu_backend(DType::F32));
      for (int i = 0; i < copies; ++i) {
        models.push_back(std::make_unique<Transformer>(wide_vocabulary_config(), 301, kIds,
                                                       *backends[0], 17));
      }
      return std::pair(std::move(backends), std::move(models));
    };
    auto pointers = [](const std::vector<std::unique_ptr<Transformer>>& models) {
      std::vector<Transformer*> result;
      for (const auto& model : models) result.push_back(model.get());
      return result;
    };
    {
      auto [backends, models] = make();
      auto [alone_backends, alone] = make();
      EnsembleScorer ensemble(pointers(models), {}, kIds, 10);
      CachedTransformerScorer model(*alone[0], kIds, 10);
      EXPECT_EQ(rows_of_steps(ensemble), rows_of_steps(model)) << what;
      const Ranked a = best_of_steps(ensemble, 8), b = best_of_steps(model, 8);
      EXPECT_EQ(a.values, b.values) << what;
      EXPECT_EQ(a.tokens, b.tokens) << what;
    }
    for (const int beam : {4, 1}) {
      for (const bool whole_rows : {false, true}) {
        auto [backends, models] = make();
        auto [alone_backends, alone] = make();
        BeamOptions options = search_options(beam);
        const AllowEveryToken everything(alone[0]->vocab_size());
        if (whole_rows) options.filter = &everything;
        EnsembleScorer ensemble(pointers(models), {}, kIds, 6 + 8);
        CachedTransformerScorer model(*alone[0], kIds, 6 + 8);
        expect_same_results(beam_search(ensemble, kSearchSources, kIds, options),
                            beam_search(model, kSearchSources, kIds, options),
                            what + " beam " + std::to_string(beam) +
                                (whole_rows ? " whole rows" : " ranked"));
      }
    }
  }
}

// Two different models (other sizes, other parameters), reordered by the same parents:
// at every step the ensemble's row is w_a log p_a + w_b log p_b of the two models' own
// rows, exactly as the ensemble sums in fp32 (0 + w_a a, then + w_b b), and within fp32
// rounding of the reference scorer's recomputation of each prefix (1e-5, the tolerance
// of CachedStepsEqualFullRecomputation). Equal weights and 1:3 (normalised to 1/4, 3/4).
TEST(Ensemble, ScoresEachStepWithTheWeightedMeanOfTheModelsLogProbabilities) {
  for (const std::vector<float>& given : {std::vector<float>{}, std::vector<float>{1, 3}}) {
    const float w_a = given.empty() ? 0.5f : 0.25f, w_b = given.empty() ? 0.5f : 0.75f;
    auto backend = make_cpu_backend(DType::F32);
    Transformer a = small_model(*backend, false, "pre", 9);
    Transformer b = other_model(*backend, 31);
    EnsembleScorer ensemble({&a, &b}, given, kIds, 10);
    EXPECT_EQ(ensemble.weights(), (std::vector<float>{w_a, w_b}));
    auto alone_backend = make_cpu_backend(DType::F32);
    Transformer a_alone = small_model(*alone_backend, false, "pre", 9);
    Transformer b_alone = other_model(*alone_backend, 31);
    CachedTransformerScorer a_cached(a_alone, kIds, 10), b_cached(b_alone, kIds, 10);
    TransformerScorer a_full(a_alone, kIds), b_full(b_alone, kIds);
    const auto mixed = rows_of_steps(ensemble);
    const auto rows_a = rows_of_steps(a_cached), rows_b = rows_of_steps(b_cached);
    const auto full_a = rows_of_steps(a_full), full_b = rows_of_steps(b_full);
    ASSERT_EQ(mixed.size(), rows_a.size());
    bool models_differ = false;
    for (size_t t = 0; t < mixed.size(); ++t) {
      ASSERT_EQ(mixed[t].size(), rows_a[t].size());
      for (size_t i = 0; i < mixed[t].size(); ++i) {
        float by_hand = 0.0f;
        by_hand += rows_a[t][i] * w_a;
        by_hand += rows_b[t][i] * w_b;
        ASSERT_EQ(mixed[t][i], by_hand) << "step " << t << " element " << i;
        ASSERT_NEAR(mixed[t][i], w_a * full_a[t][i] + w_b * full_b[t][i], 1e-5)
            << "step " << t << " element " << i;
        models_differ |= std::abs(rows_a[t][i] - rows_b[t][i]) > 0.1f;
      }
    }
    EXPECT_TRUE(models_differ) << "the two models must not agree, or the test shows nothing";
    // Each row's best tokens are the mixed row's (the search ranks them on the backend).
    const Ranked best = best_of_steps(ensemble, 3);
    for (size_t t = 0; t < mixed.size(); ++t) {
      const size_t hypotheses = best.values[t].size() / 3;
      for (size_t h = 0; h < hypotheses; ++h) {
        const float* row = mixed[t].data() + h * 12;
        std::vector<int> order;
        for (int token = 0; token < 12; ++token) {
          if (token != kIds.pad && token != kIds.bos) order.push_back(token);
        }
        std::stable_sort(order.begin(), order.end(), [&](int x, int y) { return row[x] > row[y]; });
        for (int i = 0; i < 3; ++i) {
          EXPECT_EQ(best.tokens[t][h * 3 + i], order[i]) << "step " << t << " h " << h;
          EXPECT_EQ(best.values[t][h * 3 + i], row[order[i]]) << "step " << t << " h " << h;
        }
      }
    }
  }
}

// A whole search with two different models: every hypothesis it returns scores the mean
// of what each model alone gives the same output (its eos included), to fp32 rounding
// summed over up to 9 steps (1e-4).
TEST(Ensemble, SearchScoresAreTheMeanOfEachModelsSequenceLogProbability) {
  auto backend = make_cpu_backend(DType::F32);
  Transformer a = small_model(*backend, false, "pre", 9);
  Transformer b = other_model(*backend, 31);
  const std::vector<TokenSequence> sources = {{4, 5, 6}, {7}, {8, 9, 10, 11, 4}, {6, 6}};
  for (const int beam : {4, 1}) {
    BeamOptions options = search_options(beam);
    options.max_len_cap = 31;
    EnsembleScorer ensemble({&a, &b}, {}, kIds, 5 + 8);
    const auto found = beam_search(ensemble, sources, kIds, options);
    for (size_t s = 0; s < sources.size(); ++s) {
      ASSERT_FALSE(found[s].empty());
      for (const Hypothesis& h : found[s]) {
        // A hypothesis cut at the length limit has no eos to score.
        const int max_len = options.max_len_a * static_cast<int>(sources[s].size()) + options.max_len_b;
        const bool with_eos = static_cast<int>(h.tokens.size()) < max_len;
        const double mean =
            0.5 * oracle_sequence_log_prob(a, kIds, sources[s], h.tokens, with_eos) +
            0.5 * oracle_sequence_log_prob(b, kIds, sources[s], h.tokens, with_eos);
        EXPECT_NEAR(h.log_prob, mean, 1e-4) << "beam " << beam << " sentence " << s;
      }
    }
  }
}

TEST(Ensemble, WeightsArePositiveOnePerModelAndNormalized) {
  EXPECT_EQ(ensemble_weights(3, {}), (std::vector<float>(3, static_cast<float>(1.0 / 3))));
  EXPECT_EQ(ensemble_weights(2, {2, 6}), (std::vector<float>{0.25f, 0.75f}));
  EXPECT_EQ(ensemble_weights(1, {7}), (std::vector<float>{1.0f}));
  expect_error([] { ensemble_weights(2, {1}); },
               {"--weights", "1 weights for 2 checkpoints"});
  expect_error([] { ensemble_weights(2, {1, 0}); }, {"--weights", "0 is not a weight"});
  expect_error([] { ensemble_weights(2, {1, -1}); }, {"--weights", "-1 is not a weight"});
  // Read as double: 1e308 twice summed to inf in float (every weight 0), 1e-300 was 0.
  EXPECT_EQ(ensemble_weights(2, {1e308, 1e308}), (std::vector<float>{0.5f, 0.5f}));
  EXPECT_EQ(ensemble_weights(2, {1e-300, 3e-300}), (std::vector<float>{0.25f, 0.75f}));
  expect_error([] { ensemble_weights(2, {1e-300, 1}); },
               {"--weights", "1e-300 is too small beside the largest, 1,"});
}

// Checkpoints as transformer_decode reads them, reduced to what the vocabulary check
// reads: the embedding's rows and the stored SentencePiece model.
DecodingCheckpoints members(const std::vector<std::pair<int, std::string>>& vocab_and_spm) {
  DecodingCheckpoints read;
  for (size_t i = 0; i < vocab_and_spm.size(); ++i) {
    read.paths.push_back("m" + std::to_string(i) + ".h5");
    Checkpoint checkpoint;
    NamedTensor embedding;
    embedding.name = "embed.weight";
    embedding.rows = vocab_and_spm[i].first;
    embedding.cols = 1;
    checkpoint.params.push_back(embedding);
    checkpoint.spm_model = vocab_and_spm[i].second;
    read.checkpoints.push_back(checkpoint);
  }
  read.vocab_size = vocab_and_spm.at(0).first;
  return read;
}

std::string file_bytes(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// The position table that bounds an ensemble's sources and outputs is its smallest
// member's, and the warnings of lines it cuts say whose it is when the members' differ (a
// warning named model.max_positions = 32 in an ensemble whose first model has 64; a
// helper's trial).
TEST(Ensemble, ThePositionTableSaidIsTheSmallestMembersAndNamedWhenTheyDiffer) {
  DecodingCheckpoints ensemble;
  ensemble.paths = {"big.h5", "small.h5", "small_too.h5"};
  ensemble.models.resize(3);
  ensemble.models[0].max_positions = 64;
  ensemble.models[1].max_positions = 32;
  ensemble.models[2].max_positions = 32;
  ensemble.max_positions = 32;
  EXPECT_EQ(ensemble.max_positions_said(),
            "model.max_positions = 32 of small.h5, the smallest of the ensemble's");
  ensemble.models[0].max_positions = 32;
  EXPECT_EQ(ensemble.max_positions_said(), "model.max_positions = 32");
  ensemble.paths.resize(1);
  ensemble.models.resize(1);
  EXPECT_EQ(ensemble.max_positions_said(), "model.max_positions = 32");
}

TEST(Ensemble, VocabulariesMustBeOneAndTheMessageNamesBothFiles) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("thpc_ensemble_" + std::to_string(getpid()));
  fs::create_directories(dir);
  // Two SentencePiece models of one text (trained from copies under two names: the model
  // bytes record the file name, the vocabulary is the same), and one of another text.
  std::string text, other_text;
  for (int i = 0; i < 200; ++i) {
    text += "the dog runs in the park number " + std::to_string(i % 17) + "\n";
    other_text += "ein Hund läuft im Garten Nummer " + std::to_string(i % 13) + "\n";
  }
  std::ofstream(dir / "a.txt") << text;
  std::ofstream(dir / "a_copy.txt") << text;
  std::ofstream(dir / "b.txt") << other_text;
  for (const char* name : {"a", "a_copy", "b"}) {
    ASSERT_TRUE(train_test_spm_model((dir / (std::string(name) + ".txt")).string(),
                                     (dir / name).string(), 40)
                    .ok());
  }
  const std::string spm_a = file_bytes(dir / "a.model"), spm_a_copy = file_bytes(dir / "a_copy.model"),
                    spm_b = file_bytes(dir / "b.model");
  fs::remove_all(dir);
  ASSERT_NE(spm_a, spm_a_copy) << "the test needs two files of one vocabulary";

  EXPECT_EQ(ensemble_vocabulary_mismatch(members({{40, spm_a}}), false), "");
  EXPECT_EQ(ensemble_vocabulary_mismatch(members({{40, spm_a}, {40, spm_a}, {40, spm_a_copy}}), false), "");
  EXPECT_EQ(ensemble_vocabulary_mismatch(members({{40, ""}, {40, ""}}), false), "");
  EXPECT_EQ(ensemble_vocabulary_mismatch(members({{40, spm_a}, {40, ""}}), true), "");

  std::string why = ensemble_vocabulary_mismatch(members({{40, spm_a}, {40, spm_a}, {41, spm_a}}), false);
  EXPECT_NE(why.find("m0.h5 has a vocabulary of 40 tokens, m2.h5 of 41"), std::string::npos) << why;
  why = ensemble_vocabulary_mismatch(members({{40, spm_a}, {40, spm_b}}), false);
  EXPECT_NE(why.find("m0.h5 and m1.h5 store different SentencePiece models (piece "), std::string::npos)
      << why;
  EXPECT_NE(why.find("must share one vocabulary"), std::string::npos) << why;
  why = ensemble_vocabulary_mismatch(members({{40, ""}, {40, spm_a}}), false);
  EXPECT_NE(why.find("m1.h5 stores its SentencePiece model, m0.h5 does not: give --spm-model"),
            std::string::npos)
      << why;
  // One vocabulary serves both directions: models of two are refused, wherever they stand
  // (those that record none, older files, fit any).
  DecodingCheckpoints directions = members({{40, spm_a}, {40, spm_a}, {40, spm_a}});
  directions.checkpoints[1].direction = "en->de";
  directions.checkpoints[2].direction = "en->de";
  EXPECT_EQ(ensemble_vocabulary_mismatch(directions, false), "");
  directions.checkpoints[2].direction = "de->en";
  EXPECT_EQ(ensemble_vocabulary_mismatch(directions, false),
            "m1.h5 was trained en->de, m2.h5 de->en: the models of an ensemble must translate "
            "one direction");
  EXPECT_EQ(sentencepiece_vocabulary_difference(spm_a, "A", spm_a_copy, "B"), "");
  EXPECT_NE(sentencepiece_vocabulary_difference(spm_a, "A", "not a model", "B").find("cannot load B's"),
            std::string::npos);
}

}  // namespace
}  // namespace thpc
