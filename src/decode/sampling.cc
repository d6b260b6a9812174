#include "decode/sampling.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>

#include "common/error.h"
#include "common/philox.h"
#include "common/whole_number.h"

namespace thpc {

SamplingOptions parse_sampling_options(const std::string& method,
                                       const std::optional<std::string>& temperature,
                                       const std::optional<std::string>& seed) {
  SamplingOptions options;
  const auto refuse = [&](const std::string& why) {
    THPC_FAIL("--sampling '" << method << "': " << why
                             << " (expected full, topk=K with K >= 1, or topp=P with 0 < P <= 1)");
  };
  // The whole text as a number, or nothing (strtod accepts a prefix; whole_number, in
  // common/whole_number.h, reads all of it).
  const auto real_number = [](const std::string& text) -> std::optional<double> {
    char* end = nullptr;
    const double value = std::strtod(text.c_str(), &end);
    if (text.empty() || end != text.c_str() + text.size() || !std::isfinite(value)) {
      return std::nullopt;
    }
    return value;
  };
  const size_t equals = method.find('=');
  const std::string name = method.substr(0, equals);
  const std::string value = equals == std::string::npos ? "" : method.substr(equals + 1);
  if (method == "full") {
    options.method = SamplingOptions::Method::kFull;
  } else if (name == "topk") {
    const std::optional<uint64_t> k = whole_number(value);
    if (!k || *k < 1 || *k > uint64_t{std::numeric_limits<int>::max()}) {
      refuse("K must be a whole number >= 1");
    }
    options.method = SamplingOptions::Method::kTopK;
    options.top_k = static_cast<int>(*k);
  } else if (name == "topp") {
    const std::optional<double> p = real_number(value);
    if (!p || !(*p > 0.0 && *p <= 1.0)) refuse("P must be a number in (0, 1]");
    // The nucleus of mass >= 1 is every token: plain sampling, drawn as full draws (the
    // same tokens for the same seed, not a sort of the whole vocabulary per draw).
    options.method = *p < 1.0 ? SamplingOptions::Method::kTopP : SamplingOptions::Method::kFull;
    options.top_p = *p;
  } else {
    refuse("not a sampling method");
  }
  if (temperature) {
    const std::optional<double> t = real_number(*temperature);
    if (!t || !(*t > 0)) {
      THPC_FAIL("--temperature '" << *temperature << "': expected a number > 0 (1: the "
                                  << "model's distribution, < 1 sharper, > 1 flatter)");
    }
    options.temperature = *t;
  }
  if (seed) {
    const std::optional<uint64_t> s = whole_number(*seed);
    if (!s) THPC_FAIL("--seed '" << *seed << "': expected a whole number from 0 to 2^64-1");
    options.seed = *s;
  }
  return options;
}

namespace sampling_detail {

double sampling_uniform(uint64_t seed, uint32_t sentence, uint32_t sample, uint32_t position) {
  // Lanes 0 and 1 of the block whose counter is (sample, site, position, sentence).
  const Philox4x32 block =
      philox_block(seed, kSamplingSite, position, sentence, uint64_t{sample} << 2);
  const uint64_t bits = (uint64_t{block.v[0] >> 5} << 26) | (block.v[1] >> 6);  // 27 + 26
  return static_cast<double>(bits) * (1.0 / 9007199254740992.0);                 // 2^-53
}

TokenSampler::TokenSampler(const SamplingOptions& options, const SpecialIds& ids)
    : options_(options), ids_(ids) {
  THPC_CHECK(options.temperature > 0 && std::isfinite(options.temperature),
             "sampling temperature " << options.temperature);
  THPC_CHECK(options.method != SamplingOptions::Method::kTopK || options.top_k >= 1,
             "top-k sampling with k = " << options.top_k);
  THPC_CHECK(options.method != SamplingOptions::Method::kTopP ||
                 (options.top_p > 0 && options.top_p < 1),
             "nucleus sampling with p = " << options.top_p);
}

namespace {

// A NaN log-probability (a broken model) ranks last and is never drawn.
float rank_key(float log_prob) {
  return std::isnan(log_prob) ? -std::numeric_limits<float>::infinity() : log_prob;
}

}  // namespace

void TokenSampler::keep_best(const float* row, int vocab) {
  kept_.clear();
  for (int32_t token = 0; token < vocab; ++token) {
    if (token == ids_.pad || token == ids_.bos) continue;  // never generated
    kept_.push_back({rank_key(row[token]), token});
  }
  THPC_CHECK(!kept_.empty(), "a vocabulary of " << vocab << " tokens has none to draw");
  const auto ranks_before = [](const Ranked& a, const Ranked& b) {
    return a.log_prob > b.log_prob || (a.log_prob == b.log_prob && a.token < b.token);
  };
  const size_t n = kept_.size();
  switch (options_.method) {
    case SamplingOptions::Method::kFull:
      return;  // every token, in token order
    case SamplingOptions::Method::kTopK: {
      const size_t k = std::min(n, static_cast<size_t>(options_.top_k));
      std::partial_sort(kept_.begin(), kept_.begin() + k, kept_.end(), ranks_before);
      kept_.resize(k);
      return;
    }
    case SamplingOptions::Method::kTopP: {
      // The nucleus under the tempered distribution: the mass of every drawable token
      // first, then the best ones in rank order until their share reaches P. The order
      // is total (ties by token), so sorting a longer prefix keeps the shorter one: the
      // nucleus, usually a few tokens, costs a partial sort, not a sort of the vocabulary.
      float best = kept_[0].log_prob;
      for (const Ranked& r : kept_) best = std::max(best, r.log_prob);
      double total = 0;
      for (const Ranked& r : kept_) total += std::exp((double(r.log_prob) - best) / options_.temperature);
      const double threshold = options_.top_p * total;
      double mass = 0;
      size_t sorted = 0;
      for (size_t k = std::min<size_t>(n, 64);; k = std::min(n, 4 * k)) {
        std::partial_sort(kept_.begin() + sorted, kept_.begin() + k, kept_.end(), ranks_before);
        for (size_t j = sorted; j < k; ++j) {
          mass += std::exp((double(kept_[j].log_prob) - best) / options_.temperature);
          if (mass >= threshold) {
            kept_.resize(j + 1);
            return;
          }
        }
        sorted = k;
        if (k == n) return;  // rounding left the sum short of P * total: every token
      }
    }
  }
}

std::pair<int32_t, float> TokenSampler::draw_kept(double u) {
  // q_j = w_j / sum w, w_j = exp((log p_j - best) / T): the softmax of log p / T over
  // the kept tokens, with the largest exponent 0 (no overflow, T -> 0 gives greedy).
  float best = kept_[0].log_prob;
  for (const Ranked& r : kept_) best = std::max(best, r.log_prob);
  weights_.resize(kept_.size());
  double total = 0;
  for (size_t j = 0; j < kept_.size(); ++j) {
    weights_[j] = std::exp((double(kept_[j].log_prob) - best) / options_.temperature);
    total += weights_[j];
  }
  // A model whose outputs are not finite (a diverged one): said in the user's words, not
  // as a failed internal check.
  if (!(total > 0 && std::isfinite(total))) {
    THPC_FAIL("no token to sample has a finite log-probability (the best is " << best
              << "): the model's outputs are not finite; decode a healthy checkpoint");
  }
  const double target = u * total;
  double mass = 0;
  size_t chosen = kept_.size();
  for (size_t j = 0; j < kept_.size(); ++j) {
    if (weights_[j] == 0) continue;
    chosen = j;
    mass += weights_[j];
    if (target < mass) break;  // else (u * total rounding up to the sum) the last one
  }
  return {kept_[chosen].token, kept_[chosen].log_prob};
}

std::pair<int32_t, float> TokenSampler::draw_from_row(const float* row, int vocab, double u) {
  keep_best(row, vocab);
  return draw_kept(u);
}

std::pair<int32_t, float> TokenSampler::draw_from_best(const float* values,
                                                       const int32_t* tokens, int count,
                                                       double u) {
  THPC_CHECK(options_.method == SamplingOptions::Method::kTopK && count >= 1 &&
                 count <= options_.top_k,
             "drawing from a row's best " << count << " tokens, not top-k sampling");
  kept_.clear();
  for (int i = 0; i < count; ++i) kept_.push_back({rank_key(values[i]), tokens[i]});
  return draw_kept(u);
}

}  // namespace sampling_detail

namespace {

struct Sample {
  TokenSequence tokens;
  double log_prob = 0;
  int sample = 0;  // which of the sentence's samples
  int index = -1;  // its index among the hypotheses of the step that scores it
};

}  // namespace

std::vector<std::vector<Hypothesis>> sample_search(NextTokenScorer& scorer,
                                                   const std::vector<TokenSequence>& sources,
                                                   const std::vector<uint32_t>& sentence_ids,
                                                   const SpecialIds& ids,
                                                   const BeamOptions& options,
                                                   const SamplingOptions& sampling) {
  THPC_CHECK(options.beam >= 1, "samples per sentence " << options.beam);
  THPC_CHECK(options.nbest >= 1 && options.nbest <= options.beam,
             "nbest " << options.nbest << " must be in [1, samples " << options.beam << "]");
  THPC_CHECK(options.filter == nullptr, "sampling with a token filter");
  THPC_CHECK(sentence_ids.size() == sources.size(),
             sentence_ids.size() << " sentence ids for " << sources.size() << " sources");
  const int vocab = scorer.vocab_size();
  int drawable = 0;
  for (int token = 0; token < vocab; ++token) drawable += token != ids.pad && token != ids.bos;
  THPC_CHECK(drawable > 0, "a vocabulary of " << vocab << " tokens has none to draw");
  // Top-k needs only each hypothesis' best k, which a scorer may rank where its
  // log-probabilities are (step_best, as beam search): the same draws as from whole rows.
  const int ranked_count = sampling.method == SamplingOptions::Method::kTopK
                               ? std::min(sampling.top_k, drawable)
                               : 0;

  struct SentenceState {
    std::vector<Sample> live;
    std::vector<std::pair<int, Hypothesis>> finished;  // (sample, hypothesis)
    int max_len = 0;
  };
  std::vector<SentenceState> states(sources.size());
  for (size_t s = 0; s < sources.size(); ++s) {
    states[s].max_len = beam_detail::output_length_limit(sources[s].size(), options);
    // Every sample is a hypothesis from position 0 on (the first step scores the empty
    // prefix once per sample, not once per sentence): the hypotheses only ever decrease,
    // so the decoder reorders its caches in place and a row's place in the step's
    // products is a function of the batch alone, not of the batches the model decoded
    // before (whose cache sizes decide how a growing beam is gathered). Those places
    // round a row's products differently in the last bits, which can move a draw.
    for (int sample = 0; sample < options.beam; ++sample) {
      Sample root;
      root.sample = sample;
      states[s].live.push_back(std::move(root));
    }
  }
  scorer.start(sources);
  sampling_detail::TokenSampler sampler(sampling, ids);
  std::vector<float> log_probs, best_values;
  std::vector<int32_t> best_tokens;
  BeamStep step;
  for (step.position = 0;; ++step.position) {
    step.clear_hypotheses();
    for (size_t s = 0; s < states.size(); ++s) {
      for (Sample& hypothesis : states[s].live) {
        // Its index is still its row in the last step: its parent's.
        hypothesis.index =
            step.add_hypothesis(static_cast<int>(s), hypothesis.tokens, hypothesis.index);
      }
    }
    if (step.size() == 0) break;
    const bool ranked = beam_detail::score_step(scorer, step, ranked_count, log_probs,
                                                best_values, best_tokens);
    const int generated = step.position + 1;  // tokens of each draw's sample, eos included
    for (size_t s = 0; s < states.size(); ++s) {
      SentenceState& state = states[s];
      std::vector<Sample> next_live;
      for (Sample& hypothesis : state.live) {
        const size_t row = static_cast<size_t>(hypothesis.index);
        const double u = sampling_detail::sampling_uniform(
            sampling.seed, sentence_ids[s], static_cast<uint32_t>(hypothesis.sample),
            static_cast<uint32_t>(step.position));
        const auto [token, log_prob] =
            ranked ? sampler.draw_from_best(best_values.data() + row * ranked_count,
                                            best_tokens.data() + row * ranked_count,
                                            ranked_count, u)
                   : sampler.draw_from_row(log_probs.data() + row * vocab, vocab, u);
        // The sample continues as the next step's hypothesis; its index stays its row in
        // this step (its parent), until the next step numbers it.
        hypothesis.log_prob += log_prob;
        if (token != ids.eos) hypothesis.tokens.push_back(token);
        if (token == ids.eos || generated >= state.max_len) {
          state.finished.emplace_back(
              hypothesis.sample,
              beam_detail::finished_hypothesis(std::move(hypothesis.tokens), hypothesis.log_prob,
                                               generated, options.alpha));
        } else {
          next_live.push_back(std::move(hypothesis));
        }
      }
      state.live = std::move(next_live);
    }
  }

  std::vector<std::vector<Hypothesis>> results;
  for (SentenceState& state : states) {
    // Best score first; equal scores in sample order (a sort that cannot depend on the
    // order in which samples finished).
    std::sort(state.finished.begin(), state.finished.end(), [](const auto& a, const auto& b) {
      return a.second.score > b.second.score ||
             (a.second.score == b.second.score && a.first < b.first);
    });
    std::vector<Hypothesis> best;
    for (auto& [sample, hypothesis] : state.finished) {
      if (static_cast<int>(best.size()) == options.nbest) break;
      best.push_back(std::move(hypothesis));
    }
    results.push_back(std::move(best));
  }
  return results;
}

}  // namespace thpc
