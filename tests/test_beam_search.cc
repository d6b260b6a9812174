// Beam search against exhaustive search over a score table, its early termination, the
// length penalty, and beam 1 against greedy decoding on the model.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <random>
#include <string>
#include <utility>

#include "decode/beam_search.h"
#include "decode_oracles.h"
#include "decode_steps.h"
#include "kernels/cpu/cpu_backend.h"

namespace thpc {
namespace {

const SpecialIds kIds;  // pad 0, unk 1, bos 2, eos 3
constexpr int kVocab = 6;  // and symbols 4, 5

// log p(next | source, prefix) from a fixed pseudo-random table: each (source, prefix)
// gets its own distribution over the vocabulary (pad and bos get probability 0). It
// checks what the search hands over: every hypothesis is its parent's prefix (the
// previous step's hypothesis it names) followed by its token, in its parent's sentence.
class TableScorer final : public NextTokenScorer {
 public:
  explicit TableScorer(double eos_bias = 0.0) : eos_bias_(eos_bias) {}
  int vocab_size() const override { return kVocab; }
  void start(const std::vector<TokenSequence>& sources) override {
    sources_ = sources;
    previous_.clear();
  }
  void step(const BeamStep& step, std::vector<float>& out) override {
    ++calls;
    check_parents(step);
    out.clear();
    for (int i = 0; i < step.size(); ++i) {
      const std::vector<double> row = distribution(sources_[step.source_of[i]], *step.prefix[i]);
      out.insert(out.end(), row.begin(), row.end());
    }
  }
  std::vector<double> distribution(const TokenSequence& source,
                                   const TokenSequence& prefix) const {
    TokenSequence key = source;
    key.push_back(-1);
    key.insert(key.end(), prefix.begin(), prefix.end());
    std::seed_seq seed(key.begin(), key.end());
    std::mt19937 rng(seed);
    std::vector<double> logits(kVocab);
    for (double& z : logits) z = std::normal_distribution<double>(0.0, 1.5)(rng);
    logits[kIds.eos] += eos_bias_;
    double total = 0;
    for (int j = 0; j < kVocab; ++j) {
      if (j != kIds.pad && j != kIds.bos) total += std::exp(logits[j]);
    }
    std::vector<double> log_probs(kVocab, -1e30);
    for (int j = 0; j < kVocab; ++j) {
      if (j != kIds.pad && j != kIds.bos) log_probs[j] = logits[j] - std::log(total);
    }
    return log_probs;
  }
  int calls = 0;

 private:
  void check_parents(const BeamStep& step) {
    const size_t hypotheses = static_cast<size_t>(step.size());
    ASSERT_EQ(step.prefix.size(), hypotheses);
    ASSERT_EQ(step.parent.size(), step.position == 0 ? 0 : hypotheses);
    ASSERT_EQ(step.token.size(), step.parent.size());
    std::vector<std::pair<int, TokenSequence>> current;
    for (size_t i = 0; i < hypotheses; ++i) {
      const TokenSequence& prefix = *step.prefix[i];
      ASSERT_EQ(prefix.size(), static_cast<size_t>(step.position));
      if (step.position > 0) {
        ASSERT_GE(step.parent[i], 0);
        ASSERT_LT(static_cast<size_t>(step.parent[i]), previous_.size());
        const auto& [parent_source, parent_prefix] = previous_[step.parent[i]];
        EXPECT_EQ(parent_source, step.source_of[i]);
        TokenSequence extended = parent_prefix;
        extended.push_back(step.token[i]);
        EXPECT_EQ(extended, prefix) << "hypothesis " << i << " at " << step.position;
      }
      current.push_back({step.source_of[i], prefix});
    }
    previous_ = std::move(current);
  }

  double eos_bias_;
  std::vector<TokenSequence> sources_;
  std::vector<std::pair<int, TokenSequence>> previous_;  // the last step's hypotheses
};

// Every output the search could produce, scored: sequences over {unk, 4, 5} ended by
// eos within max_len generated tokens, or cut at max_len without eos.
std::vector<Hypothesis> exhaustive(const TableScorer& table, const TokenSequence& source,
                                   int max_len, float alpha) {
  std::vector<Hypothesis> all;
  std::function<void(TokenSequence, double)> grow = [&](TokenSequence prefix, double log_prob) {
    const std::vector<double> lp = table.distribution(source, prefix);
    const int generated = static_cast<int>(prefix.size()) + 1;
    for (int token : {kIds.unk, kIds.eos, 4, 5}) {
      const double extended = log_prob + lp[token];
      if (token == kIds.eos || generated == max_len) {
        Hypothesis h;
        h.tokens = prefix;
        if (token != kIds.eos) h.tokens.push_back(token);
        h.log_prob = extended;
        h.score = extended / length_penalty(generated, alpha);
        all.push_back(h);
      } else {
        TokenSequence next = prefix;
        next.push_back(token);
        grow(next, extended);
      }
    }
  };
  grow({}, 0.0);
  std::stable_sort(all.begin(), all.end(),
                   [](const Hypothesis& a, const Hypothesis& b) { return a.score > b.score; });
  return all;
}

TEST(LengthPenalty, IsTheGnmtForm) {
  // lp(Y) = ((5 + |Y|) / 6)^alpha
  EXPECT_DOUBLE_EQ(length_penalty(1, 0.6f), 1.0);
  EXPECT_NEAR(length_penalty(7, 0.6f), std::pow(2.0, 0.6f), 1e-12);
  EXPECT_NEAR(length_penalty(25, 0.6f), std::pow(5.0, double(0.6f)), 1e-12);
  EXPECT_DOUBLE_EQ(length_penalty(40, 0.0f), 1.0);
}

TEST(BeamSearch, WideBeamFindsTheExhaustiveOptimumAndNBest) {
  const std::vector<TokenSequence> sources = {{4, 5}, {5}, {4, 4, 5}};
  for (float alpha : {0.0f, 0.6f, 1.0f}) {
    TableScorer table;
    BeamOptions options;
    options.beam = 64;  // wider than the 3^3 live prefixes: the search is exhaustive
    options.alpha = alpha;
    options.max_len_a = 0;
    options.max_len_b = 4;
    options.nbest = 5;
    const auto results = beam_search(table, sources, kIds, options);
    ASSERT_EQ(results.size(), sources.size());
    for (size_t s = 0; s < sources.size(); ++s) {
      const std::vector<Hypothesis> truth = exhaustive(table, sources[s], 4, alpha);
      ASSERT_EQ(results[s].size(), 5u);
      for (int k = 0; k < 5; ++k) {
        EXPECT_EQ(results[s][k].tokens, truth[k].tokens) << "alpha " << alpha << " rank " << k;
        EXPECT_NEAR(results[s][k].score, truth[k].score, 1e-5);
        EXPECT_NEAR(results[s][k].log_prob, truth[k].log_prob, 1e-5);
      }
    }
  }
}

// The search keeps each live hypothesis' best 2 * beam extensions and ranks their union:
// the same candidates, in the same order, as ranking every (hypothesis, token) pair,
// here with many exact ties (log-probabilities from four values, parents of equal
// log-probability) and with and without a filter; best_candidates, which merges the
// hypotheses' runs, takes them as a full sort orders them.
TEST(BeamSearch, EachHypothesisBestExtensionsHoldTheSentenceBest) {
  using beam_detail::Candidate;
  std::mt19937 rng(12345);
  constexpr int kRowVocab = 50;
  for (int trial = 0; trial < 300; ++trial) {
    const int parents = 1 + trial % 5;
    const size_t count = 1 + trial % 10;
    const bool filtered = trial % 3 == 0;
    std::vector<float> rows(static_cast<size_t>(parents) * kRowVocab);
    for (float& value : rows) value = -0.5f * static_cast<float>(rng() % 4);
    std::vector<double> parent_log_probs(parents);
    for (double& value : parent_log_probs) value = -0.5 * static_cast<double>(rng() % 3);
    std::vector<char> allowed(kRowVocab);
    for (char& a : allowed) a = rng() % 4 != 0;

    std::vector<Candidate> all, kept;
    std::vector<size_t> row_ends;  // where each hypothesis' kept extensions end
    for (int h = 0; h < parents; ++h) {
      const float* row = rows.data() + static_cast<size_t>(h) * kRowVocab;
      const size_t before = kept.size();
      beam_detail::add_best_extensions(row, kRowVocab, parent_log_probs[h], h,
                                       filtered ? allowed.data() : nullptr, kIds, count, kept);
      size_t allowed_here = 0;
      for (int token = 0; token < kRowVocab; ++token) {
        if (token == kIds.pad || token == kIds.bos || (filtered && !allowed[token])) continue;
        all.push_back({parent_log_probs[h] + row[token], h, token});
        ++allowed_here;
      }
      ASSERT_EQ(kept.size() - before, std::min(count, allowed_here)) << "trial " << trial;
      ASSERT_TRUE(std::is_sorted(kept.begin() + before, kept.end(), beam_detail::ranks_before))
          << "trial " << trial;
      row_ends.push_back(kept.size());
    }
    std::sort(all.begin(), all.end(), beam_detail::ranks_before);
    const size_t keep = std::min(all.size(), count);
    ASSERT_GE(kept.size(), keep);
    std::vector<Candidate> best;
    beam_detail::best_candidates(kept, row_ends, count, best);
    ASSERT_EQ(best.size(), keep) << "trial " << trial;
    for (size_t c = 0; c < keep; ++c) {
      EXPECT_EQ(best[c].log_prob, all[c].log_prob) << "trial " << trial << " rank " << c;
      EXPECT_EQ(best[c].parent, all[c].parent) << "trial " << trial << " rank " << c;
      EXPECT_EQ(best[c].token, all[c].token) << "trial " << trial << " rank " << c;
    }
  }
}

// A scorer's ranked row comes best value first, equal values in token order; adding the
// parent's log-probability in double can round two different values to one sum, and
// then ranks_before puts the smaller token first, which came later in the row.
// best_candidates sorts such a run before merging: the sentence's best are still those
// of a full sort, in its order (here the parent's -1e10 has a double ulp of ~2e-6, which
// swallows the values' 1.2e-7 difference).
TEST(BeamSearch, BestCandidatesSortARankedRunThatTheParentsScoreReordered) {
  using beam_detail::Candidate;
  const double parent = -1e10;
  const float higher = -1.0f, lower = std::nextafter(-1.0f, -2.0f);
  ASSERT_GT(higher, lower);
  ASSERT_EQ(parent + higher, parent + lower);
  // Hypothesis 0's ranked row: token 9 (the higher value) before token 5; hypothesis 1's:
  // token 3 at -0.5, far better, then token 4 at -3.
  std::vector<Candidate> candidates = {{parent + higher, 0, 9},
                                       {parent + lower, 0, 5},
                                       {-0.5, 1, 3},
                                       {-3.0, 1, 4}};
  std::vector<Candidate> sorted = candidates;
  std::sort(sorted.begin(), sorted.end(), beam_detail::ranks_before);
  for (size_t keep = 1; keep <= 5; ++keep) {
    std::vector<Candidate> runs = candidates, best;
    beam_detail::best_candidates(runs, {2, 4}, keep, best);
    ASSERT_EQ(best.size(), std::min<size_t>(keep, 4)) << keep;
    for (size_t c = 0; c < best.size(); ++c) {
      EXPECT_EQ(best[c].parent, sorted[c].parent) << "keep " << keep << " rank " << c;
      EXPECT_EQ(best[c].token, sorted[c].token) << "keep " << keep << " rank " << c;
    }
  }
  // The order found: hypothesis 1's -0.5 and -3, then the tie, token 5 first.
  EXPECT_EQ(sorted[2].token, 5);
  EXPECT_EQ(sorted[3].token, 9);
}

// Every continuation equally likely: unk, eos, 4 and 5 at 1/4 each after any prefix.
class UniformScorer final : public NextTokenScorer {
 public:
  int vocab_size() const override { return kVocab; }
  void start(const std::vector<TokenSequence>&) override {}
  void step(const BeamStep& step, std::vector<float>& out) override {
    out.assign(static_cast<size_t>(step.size()) * kVocab, -1e30f);
    for (int i = 0; i < step.size(); ++i) {
      for (const int token : {kIds.unk, kIds.eos, 4, 5}) {
        out[static_cast<size_t>(i) * kVocab + token] = std::log(0.25f);
      }
    }
  }
};

// Equal scores rank by the parent's rank, then by the smaller token (ranks_before), so
// that an n-best list of ties is the same on every run and machine (a mutation audit's
// survivor: the parents' order reversed made the second translation [4]). With four
// equally likely tokens at every step, the rule gives [] and then [unk].
TEST(BeamSearch, TiesGoToTheBetterRankedParentThenTheSmallerToken) {
  using beam_detail::Candidate;
  EXPECT_TRUE(beam_detail::ranks_before(Candidate{-1.0, 0, 5}, Candidate{-1.0, 1, 1}));
  EXPECT_FALSE(beam_detail::ranks_before(Candidate{-1.0, 1, 1}, Candidate{-1.0, 0, 5}));
  EXPECT_TRUE(beam_detail::ranks_before(Candidate{-1.0, 1, 1}, Candidate{-1.0, 1, 4}));
  EXPECT_TRUE(beam_detail::ranks_before(Candidate{-0.5, 1, 4}, Candidate{-1.0, 0, 1}));
  UniformScorer uniform;
  BeamOptions options;
  options.beam = 2;
  options.nbest = 2;
  options.max_len_a = 0;
  options.max_len_b = 3;
  const auto results = beam_search(uniform, {TokenSequence{4}}, kIds, options);
  ASSERT_EQ(results.size(), 1u);
  ASSERT_EQ(results[0].size(), 2u);
  EXPECT_EQ(results[0][0].tokens, TokenSequence{});
  EXPECT_EQ(results[0][1].tokens, TokenSequence{kIds.unk});
}

TEST(BeamSearch, AWiderBeamFindsWhatGreedyMisses) {
  // Over many table sentences, beam 1 must sometimes end below the optimum that beam 4
  // reaches, and beam 4 must never be worse than beam 1 when it reaches the optimum.
  TableScorer table;
  std::vector<TokenSequence> sources;
  for (int i = 0; i < 40; ++i) sources.push_back({4 + i % 2, 4 + (i / 2) % 2, 4 + i % 3 % 2, i});
  BeamOptions narrow, wide;
  narrow.beam = 1;
  wide.beam = 4;
  for (BeamOptions* o : {&narrow, &wide}) {
    o->alpha = 0.0f;
    o->max_len_a = 0;
    o->max_len_b = 5;
  }
  const auto greedy = beam_search(table, sources, kIds, narrow);
  const auto beamed = beam_search(table, sources, kIds, wide);
  // The scorer hands out fp32 log-probabilities; the exhaustive search sums doubles.
  const double rounding = 1e-5;
  int improved = 0;
  for (size_t s = 0; s < sources.size(); ++s) {
    const double optimum = exhaustive(table, sources[s], 5, 0.0f)[0].score;
    EXPECT_LE(greedy[s][0].score, optimum + rounding);
    EXPECT_LE(beamed[s][0].score, optimum + rounding);
    if (beamed[s][0].score > greedy[s][0].score + rounding) ++improved;
  }
  EXPECT_GT(improved, 0) << "beam 4 never beat beam 1: the table is too easy to test search";
}

TEST(BeamSearch, StopsEarlyWhenNoLiveHypothesisCanWin) {
  // eos is very likely everywhere: after a few steps every live hypothesis has fallen so
  // far that even the most generous length normalisation (lp at max_len) cannot lift it
  // above the finished ones, so the search stops long before max_len = 60.
  TableScorer table(/*eos_bias=*/8.0);
  BeamOptions options;
  options.max_len_a = 0;
  options.max_len_b = 60;
  const auto results = beam_search(table, {{4, 5, 4}}, kIds, options);
  ASSERT_EQ(results[0].size(), 1u);
  EXPECT_LE(table.calls, 8) << "no early termination";
  // Stopping early lost nothing: the optimum among outputs of up to 6 tokens (the bound
  // proves no longer one can win) is what the search returned.
  EXPECT_EQ(results[0][0].tokens, exhaustive(table, {4, 5, 4}, 6, 0.6f)[0].tokens);
}

// The search as BeamOptions states it, with none of beam_search's economies (each row's
// best extensions only, the early stop): every extension of every live hypothesis ranked
// (higher log-probability, then the earlier parent, then the smaller token), taken in that
// order until `beam` continue, one ending by eos or at the length limit finished (the best
// `beam` kept), until no hypothesis is live.
std::vector<Hypothesis> plain_beam_search(const TableScorer& table, const TokenSequence& source,
                                          const BeamOptions& options) {
  struct Live {
    TokenSequence tokens;
    double log_prob;
  };
  struct Extension {
    double log_prob;
    int parent, token;
  };
  const int max_len = beam_detail::output_length_limit(source.size(), options);
  std::vector<Live> live = {{{}, 0.0}};
  std::vector<Hypothesis> finished;
  for (int generated = 1; !live.empty(); ++generated) {
    std::vector<Extension> extensions;
    for (size_t parent = 0; parent < live.size(); ++parent) {
      const std::vector<double> row = table.distribution(source, live[parent].tokens);
      for (int token = 0; token < kVocab; ++token) {
        if (token == kIds.pad || token == kIds.bos) continue;
        // The scorer hands the search floats.
        extensions.push_back({live[parent].log_prob + static_cast<float>(row[token]),
                              static_cast<int>(parent), token});
      }
    }
    std::sort(extensions.begin(), extensions.end(), [](const Extension& a, const Extension& b) {
      return a.log_prob != b.log_prob ? a.log_prob > b.log_prob
                                      : a.parent != b.parent ? a.parent < b.parent
                                                             : a.token < b.token;
    });
    std::vector<Live> next;
    for (const Extension& extension : extensions) {
      if (static_cast<int>(next.size()) == options.beam) break;
      TokenSequence tokens = live[extension.parent].tokens;
      if (extension.token != kIds.eos) tokens.push_back(extension.token);
      if (extension.token == kIds.eos || generated >= max_len) {
        finished.push_back({tokens, extension.log_prob,
                            extension.log_prob / length_penalty(generated, options.alpha)});
        std::stable_sort(
            finished.begin(), finished.end(),
            [](const Hypothesis& a, const Hypothesis& b) { return a.score > b.score; });
        if (static_cast<int>(finished.size()) > options.beam) finished.resize(options.beam);
      } else {
        next.push_back({tokens, extension.log_prob});
      }
    }
    live = std::move(next);
  }
  if (static_cast<int>(finished.size()) > options.nbest) finished.resize(options.nbest);
  return finished;
}

// The early stop loses nothing: on many tables, beams, length penalties and eos biases, the
// search returns what the plain search above does, which never stops before no hypothesis
// is live. A mutation audit's stop that compared a live hypothesis' raw log-probability
// with the finished ones' normalised scores (dropping lp(max_len)) ended searches a longer
// output would have won, and StopsEarlyWhenNoLiveHypothesisCanWin (eos near certain)
// could not tell; this fails on it.
TEST(BeamSearch, StoppingEarlyReturnsWhatTheSearchRunToTheEndReturns) {
  int compared = 0, stopped_early = 0;
  for (const double eos_bias : {-1.0, 0.0, 1.5}) {
    TableScorer table(eos_bias);
    for (const float alpha : {0.0f, 0.6f, 1.0f, 2.0f}) {
      for (const int beam : {1, 2, 4}) {
        BeamOptions options;
        options.beam = beam;
        options.alpha = alpha;
        options.nbest = beam;
        options.max_len_a = 0;
        options.max_len_b = 12;
        for (int source = 0; source < 12; ++source) {
          const TokenSequence sentence = {4 + source % 2, 5, 4 + source / 2 % 3, source};
          SCOPED_TRACE("eos bias " + std::to_string(eos_bias) + ", alpha " +
                       std::to_string(alpha) + ", beam " + std::to_string(beam) +
                       ", source " + std::to_string(source));
          table.calls = 0;
          const std::vector<Hypothesis> searched =
              beam_search(table, {sentence}, kIds, options).front();
          const std::vector<Hypothesis> expected = plain_beam_search(table, sentence, options);
          ASSERT_EQ(searched.size(), expected.size());
          for (size_t i = 0; i < expected.size(); ++i) {
            EXPECT_EQ(searched[i].tokens, expected[i].tokens) << "hypothesis " << i;
            EXPECT_EQ(searched[i].score, expected[i].score) << "hypothesis " << i;
          }
          ++compared;
          // Every step scores one batch: fewer steps than the longest output's is an early stop.
          stopped_early += table.calls < 12;
        }
      }
    }
  }
  EXPECT_EQ(compared, 3 * 4 * 3 * 12);
  // The comparison is of searches that did stop early, many of them.
  EXPECT_GT(stopped_early, compared / 4);
}

TEST(BeamSearch, RespectsTheLengthLimitAndIsDeterministic) {
  TableScorer table(/*eos_bias=*/-30.0);  // eos never wins: every output hits the limit
  BeamOptions options;
  options.max_len_a = 1;
  options.max_len_b = 2;
  const std::vector<TokenSequence> sources = {{4}, {4, 5, 4, 5}};
  const auto first = beam_search(table, sources, kIds, options);
  EXPECT_EQ(first[0][0].tokens.size(), 3u);  // 1 * 1 + 2
  EXPECT_EQ(first[1][0].tokens.size(), 6u);  // 1 * 4 + 2
  const auto second = beam_search(table, sources, kIds, options);
  for (size_t s = 0; s < sources.size(); ++s) EXPECT_EQ(first[s][0].tokens, second[s][0].tokens);
}

// max_len_a is a ratio, as fairseq's --max-len-a: the limit is int(a * |x| + b) computed
// in double (0.7 * 10 is 7, not the 6 a float 0.7 would give), bounded by the cap, at
// least 1, and no a overflows it.
TEST(BeamSearch, TheLengthLimitTakesARatioRoundedDown) {
  const auto limit = [](size_t length, double a, int b, int cap = 0) {
    BeamOptions options;
    options.max_len_a = a;
    options.max_len_b = b;
    options.max_len_cap = cap;
    return beam_detail::output_length_limit(length, options);
  };
  EXPECT_EQ(limit(10, 0.7, 0), 7);
  EXPECT_EQ(limit(3, 1.5, 0), 4);  // 4.5
  EXPECT_EQ(limit(10, 1.2, 10), 22);
  EXPECT_EQ(limit(0, 1.2, 0), 1);
  EXPECT_EQ(limit(40, 1e300, 5, 255), 255);
  EXPECT_EQ(limit(40, 1e300, 5), std::numeric_limits<int>::max());
  TableScorer table(/*eos_bias=*/-30.0);  // eos never wins: every output hits the limit
  BeamOptions options;
  options.max_len_a = 1.5;
  options.max_len_b = 0;
  const auto results = beam_search(table, {{4, 5, 4}}, kIds, options);
  EXPECT_EQ(results[0][0].tokens.size(), 4u);  // int(1.5 * 3), as RespectsTheLengthLimit counts
}

TEST(BeamSearch, BeamOneWithoutLengthPenaltyIsGreedyOnTheModel) {
  // Beam 1 with alpha = 0 keeps the single best extension, and stops when the best
  // extension is eos (a live hypothesis ranked below a finished one can never beat it
  // without length normalisation): exactly greedy decoding. With alpha > 0 a longer
  // hypothesis may still overtake, so beam 1 may search on where greedy stops.
  auto backend = make_cpu_backend(DType::F32);
  ModelConfig c;
  c.layers = 2;
  c.d_model = 16;
  c.d_ff = 32;
  c.heads = 4;
  c.max_positions = 32;
  Transformer model(c, 12, kIds, *backend, 5);
  const std::vector<TokenSequence> sources = {{4, 5, 6}, {7}, {8, 9, 10, 11, 4}, {6, 6}};
  GreedyOptions greedy_options;
  greedy_options.max_len_b = 8;
  const auto greedy = greedy_decode(model, sources, kIds, greedy_options);
  TransformerScorer scorer(model, kIds);
  BeamOptions options;
  options.beam = 1;
  options.alpha = 0.0f;
  options.max_len_b = 8;
  options.max_len_cap = c.max_positions - 1;
  const auto beamed = beam_search(scorer, sources, kIds, options);
  for (size_t s = 0; s < sources.size(); ++s) EXPECT_EQ(beamed[s][0].tokens, greedy[s]) << s;
}

// Every layer norm's gamma and beta of `model` drawn at random (seeded by `seed`): a fresh
// model's are all 1 and 0, so that a step taking one norm for another (the encoder's final
// norm for the decoder's) computes the same.
void draw_the_norms(Transformer& model, uint32_t seed) {
  std::mt19937 rng(seed);
  ParamStore& params = model.params();
  for (const ParamEntry& entry : params.entries()) {
    if (entry.name.find("norm") == std::string::npos) continue;
    std::vector<float> values(static_cast<size_t>(entry.numel()));
    for (float& value : values) value = std::uniform_real_distribution<float>(-1.5f, 1.5f)(rng);
    model.backend().upload(params.param(entry.name), values.data());
  }
  params.refresh_compute();
}

TEST(IncrementalDecoding, CachedStepsEqualFullRecomputation) {
  // The same hypotheses, reordered and dropped between steps as a beam search does, scored
  // by the KV-cached decoder and by recomputing every prefix: log-probabilities agree to
  // fp32 rounding of two different summation orders (1e-5). Pre-norm too: each step
  // normalises x_0 for the first layer and ends in the decoder's final norm. The norms are
  // drawn at random: a mutation audit's cached step took the encoder's final norm for the
  // decoder's, the same 1 and 0 in a fresh model, and passed.
  for (const auto& [learned, norm] : {std::pair{false, "post"}, std::pair{true, "post"},
                                      std::pair{false, "pre"}, std::pair{true, "pre"}}) {
    auto backend = make_cpu_backend(DType::F32);
    Transformer model = small_model(*backend, learned, norm);
    draw_the_norms(model, 17);
    const std::vector<TokenSequence>& sources = kReorderingSources;
    CachedTransformerScorer cached(model, kIds, 10);
    auto full_backend = make_cpu_backend(DType::F32);
    Transformer twin = small_model(*full_backend, learned, norm);
    draw_the_norms(twin, 17);
    TransformerScorer full(twin, kIds);
    cached.start(sources);
    full.start(sources);
    const std::vector<BeamStep> steps = as_beam_steps(reordering_steps());
    std::vector<float> a, b;  // kept across steps, as the search keeps its vector
    for (size_t step = 0; step < steps.size(); ++step) {
      cached.step(steps[step], a);
      full.step(steps[step], b);
      ASSERT_EQ(a.size(), b.size());
      for (size_t i = 0; i < a.size(); ++i) {
        ASSERT_NEAR(a[i], b[i], 1e-5)
            << norm << "-norm, learned " << learned << " step " << step << " i " << i;
      }
    }
  }
}

// Two scorers' 3-best beam searches over four sources, outputs up to 6 tokens past the
// source: the same hypotheses, the scores within 1e-4 (summation orders).
void expect_same_beam_search_outputs(NextTokenScorer& a_scorer, NextTokenScorer& b_scorer) {
  const std::vector<TokenSequence> sources = {{4, 5, 6}, {7}, {8, 9, 10, 11, 4}, {6, 6}};
  BeamOptions options;
  options.max_len_b = 6;
  options.nbest = 3;
  options.max_len_cap = 31;
  const auto a = beam_search(a_scorer, sources, kIds, options);
  const auto b = beam_search(b_scorer, sources, kIds, options);
  for (size_t s = 0; s < sources.size(); ++s) {
    ASSERT_EQ(a[s].size(), b[s].size());
    for (size_t k = 0; k < a[s].size(); ++k) {
      EXPECT_EQ(a[s][k].tokens, b[s][k].tokens) << s << " " << k;
      EXPECT_NEAR(a[s][k].score, b[s][k].score, 1e-4);
    }
  }
}

TEST(IncrementalDecoding, BeamSearchGivesTheSameOutputsCachedOrNot) {
  for (const char* norm : {"post", "pre"}) {
    SCOPED_TRACE(std::string(norm) + "-norm");
    auto backend = make_cpu_backend(DType::F32);
    Transformer model = small_model(*backend, false, norm);
    TransformerScorer full(model, kIds);
    CachedTransformerScorer cached(model, kIds, 5 + 6);
    expect_same_beam_search_outputs(full, cached);
  }
}

TEST(IncrementalDecoding, RankedBestTokensAreTheFullRowsBest) {
  // The same steps (hypotheses reordered, split and dropped, rows out of hypothesis
  // order) through step_best and through step on twin models: each
  // hypothesis' k best are the full row's k best by value, ties to the smaller token,
  // never pad or bos, with the row's very values.
  auto backend = make_cpu_backend(DType::F32), twin_backend = make_cpu_backend(DType::F32);
  Transformer model = wide_vocabulary_model(*backend);
  Transformer twin = wide_vocabulary_model(*twin_backend);
  CachedTransformerScorer ranked(model, kIds, 10), full(twin, kIds, 10);
  const std::vector<TokenSequence>& sources = kReorderingSources;
  ranked.start(sources);
  full.start(sources);
  const std::vector<BeamStep> steps = as_beam_steps(reordering_steps());
  const int vocab = model.vocab_size();
  for (const int k : {1, 8}) {
    for (size_t step = 0; step < steps.size(); ++step) {
      const size_t hypotheses = static_cast<size_t>(steps[step].size());
      std::vector<float> values, rows;
      std::vector<int32_t> tokens;
      ASSERT_TRUE(ranked.step_best(steps[step], k, values, tokens));
      full.step(steps[step], rows);
      ASSERT_EQ(values.size(), hypotheses * k);
      for (size_t h = 0; h < hypotheses; ++h) {
        const float* row = rows.data() + h * vocab;
        std::vector<int> order;
        for (int token = 0; token < vocab; ++token) {
          if (token != kIds.pad && token != kIds.bos) order.push_back(token);
        }
        std::stable_sort(order.begin(), order.end(),
                         [&](int a, int b) { return row[a] > row[b]; });
        for (int i = 0; i < k; ++i) {
          EXPECT_EQ(tokens[h * k + i], order[i]) << "k " << k << " step " << step << " h " << h;
          EXPECT_EQ(values[h * k + i], row[order[i]]) << "k " << k << " step " << step;
        }
      }
    }
  }
}

TEST(IncrementalDecoding, BeamSearchRankingOnTheModelEqualsRankingWholeRows) {
  // The search with the scorer ranking (no filter) and reading whole rows (a filter that
  // allows everything): the same hypotheses with the same scores, beam 4 and greedy.
  // Each search runs on a fresh twin model: a model's kept caches decide where a
  // hypothesis' row lands in the next search, and OpenBLAS rounds a row's products
  // differently at another position of a GEMM or in one of another height (by an ulp:
  // measured on this machine's OpenBLAS, 54 of 78 placements of one row in 1..12-row
  // sgemms differ from the 1-row result).
  const std::vector<TokenSequence> sources = {
      {4, 5, 6}, {7}, {8, 9, 10, 11, 4}, {6, 6}, {100, 200, 300, 12, 13, 14}};
  for (const int beam : {4, 1}) {
    BeamOptions options;
    options.beam = beam;
    options.nbest = beam;
    options.max_len_b = 8;
    options.max_len_cap = 39;
    auto backend = make_cpu_backend(DType::F32), twin_backend = make_cpu_backend(DType::F32);
    Transformer model = wide_vocabulary_model(*backend);
    Transformer twin = wide_vocabulary_model(*twin_backend);
    CachedTransformerScorer ranking(model, kIds, 6 + 8);
    const auto ranked = beam_search(ranking, sources, kIds, options);
    const AllowEveryToken everything(twin.vocab_size());
    options.filter = &everything;
    CachedTransformerScorer whole_rows(twin, kIds, 6 + 8);
    const auto full = beam_search(whole_rows, sources, kIds, options);
    for (size_t s = 0; s < sources.size(); ++s) {
      ASSERT_EQ(ranked[s].size(), full[s].size()) << "beam " << beam;
      for (size_t k = 0; k < full[s].size(); ++k) {
        EXPECT_EQ(ranked[s][k].tokens, full[s][k].tokens) << "beam " << beam << " " << s;
        EXPECT_EQ(ranked[s][k].score, full[s][k].score) << "beam " << beam << " " << s;
        EXPECT_EQ(ranked[s][k].log_prob, full[s][k].log_prob) << "beam " << beam << " " << s;
      }
    }
  }
}

}  // namespace
}  // namespace thpc
