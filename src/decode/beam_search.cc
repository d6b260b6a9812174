#include "decode/beam_search.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <utility>
#include <vector>

#include "common/error.h"

namespace thpc {

double length_penalty(int length, float alpha) {
  return std::pow((5.0 + length) / 6.0, static_cast<double>(alpha));
}

namespace {

// Whether `model`'s decoding steps are captured into CUDA graphs (Backend::can_capture):
// then the scorer pads its steps and lengths to few shapes.
bool captures_steps(Transformer& model) {
  return model.backend().can_capture(CaptureUse::kDecodingStep);
}

}  // namespace

// Where the steps are captured, the batch's padded source length goes up to its bucket
// (step_bucket, at most model.max_positions) as the cache's length does in prepare_step:
// both are part of a captured step's shape, so that a batch of other sentences replays
// the graphs of the batches before it whose lengths fell into the same buckets. The pad
// positions are masked out of every attention over the source.
void CachedTransformerScorer::start(const std::vector<TokenSequence>& sources) {
  Batch batch = make_batch(sources, std::vector<TokenSequence>(sources.size()), ids_);
  const int bucketed = std::min(step_bucket(batch.src_len), model_.config().max_positions);
  if (captures_steps(model_) && bucketed > batch.src_len) {
    std::vector<int32_t> wider(static_cast<size_t>(batch.size) * bucketed, ids_.pad);
    for (int b = 0; b < batch.size; ++b) {
      std::copy_n(batch.src.begin() + static_cast<ptrdiff_t>(b) * batch.src_len, batch.src_len,
                  wider.begin() + static_cast<ptrdiff_t>(b) * bucketed);
    }
    batch.src.swap(wider);
    batch.src_len = bucketed;
  }
  model_.encode(batch);
}

int step_bucket(int count) {
  int bucket = 1;
  while (bucket < count) {
    // 1 -> 2; a power of two >= 2 grows by half (4 -> 6); 3 * 2^k -> 4 * 2^k (6 -> 8).
    if (bucket == 1) {
      bucket = 2;
    } else if ((bucket & (bucket - 1)) == 0) {
      bucket += bucket / 2;
    } else {
      bucket = bucket / 3 * 4;
    }
  }
  return bucket;
}

void padded_step_rows(const std::vector<int>& parent, const std::vector<int>& source_of,
                      const std::vector<int>& previous_source_of, std::vector<int>& padded_parent,
                      std::vector<int>& sentence_rows) {
  padded_parent.assign(parent.begin(), parent.end());
  int sentences = 0;
  for (const int source : previous_source_of) sentences = std::max(sentences, source + 1);
  for (const int source : source_of) sentences = std::max(sentences, source + 1);
  // This step's rows per sentence; below, -1 marks a sentence the padding took.
  sentence_rows.assign(static_cast<size_t>(sentences), 0);
  int unfinished = 0, slots = 0;
  for (const int source : source_of) {
    unfinished += sentence_rows[source]++ == 0;
    slots = std::max(slots, sentence_rows[source]);
  }
  // The previous step's sentences: those rows can continue.
  std::vector<char> had_rows(static_cast<size_t>(sentences), 0);
  int previous = 0;
  for (const int source : previous_source_of) {
    previous += had_rows[source] == 0;
    had_rows[source] = 1;
  }
  const int target = std::min(step_bucket(unfinished), previous);
  int added = 0;
  for (size_t h = 0; h < previous_source_of.size() && unfinished + added < target; ++h) {
    const int source = previous_source_of[h];
    if (sentence_rows[source] != 0) continue;  // unfinished, or taken already
    sentence_rows[source] = -1;
    std::vector<int> rows;  // its previous rows (h is its first), continued in turn
    for (size_t r = h; r < previous_source_of.size(); ++r) {
      if (previous_source_of[r] == source) rows.push_back(static_cast<int>(r));
    }
    for (int k = 0; k < slots; ++k) padded_parent.push_back(rows[k % rows.size()]);
    ++added;
  }
}

const std::vector<int32_t>& CachedTransformerScorer::prepare_step(const BeamStep& step,
                                                                  bool may_pad) {
  const int H = step.size();
  THPC_CHECK(H > 0, "no hypotheses to score");
  DecoderState& state = model_.decoder_state();
  if (step.position == 0) {
    const int max_positions = model_.config().max_positions;
    int cache_len = std::min(max_len_ + 1, max_positions);
    if (captures_steps(model_)) cache_len = std::min(step_bucket(cache_len), max_positions);
    model_.begin_decoding(state, step.source_of, cache_len);
    bos_.assign(H, ids_.bos);
    return bos_;
  }
  THPC_CHECK(static_cast<int>(step.parent.size()) == H &&
                 static_cast<int>(step.token.size()) == H,
             step.parent.size() << " parents and " << step.token.size() << " tokens for "
                                << H << " hypotheses");
  THPC_CHECK(state.positions() == step.position,
             "a step at position " << step.position << " after " << state.positions()
                                   << " fed");
  const std::vector<int>* parents = &step.parent;
  const std::vector<int32_t>* tokens = &step.token;
  if (may_pad && captures_steps(model_)) {
    previous_source_.resize(static_cast<size_t>(state.hypotheses()));
    for (int h = 0; h < state.hypotheses(); ++h) previous_source_[h] = state.source_of(h);
    padded_step_rows(step.parent, step.source_of, previous_source_, padded_parent_,
                     sentence_rows_);
    if (padded_parent_.size() > step.parent.size()) {
      // The padding's rows feed eos: any token would do, their results are dropped.
      padded_token_.assign(step.token.begin(), step.token.end());
      padded_token_.resize(padded_parent_.size(), ids_.eos);
      parents = &padded_parent_;
      tokens = &padded_token_;
    }
  }
  state.reorder(*parents);
  for (int h = 0; h < H; ++h) {
    THPC_CHECK(state.source_of(h) == step.source_of[h],
               "hypothesis " << h << " of sentence " << step.source_of[h]
                             << " extends one of sentence " << state.source_of(h));
  }
  return *tokens;
}

// A padded step's extra rows come after the step's own: dropping them is a resize.
void CachedTransformerScorer::step(const BeamStep& step, std::vector<float>& log_probs) {
  const std::vector<int32_t>& tokens = prepare_step(step, true);
  model_.decode_step_log_probs(model_.decoder_state(), tokens, log_probs);
  log_probs.resize(static_cast<size_t>(step.size()) * model_.vocab_size());
}

// An ensemble (decode/ensemble.h) combines the models' rows on the backend: unpadded.
Tensor CachedTransformerScorer::step_on_backend(const BeamStep& step) {
  const std::vector<int32_t>& fed = prepare_step(step, false);
  return model_.decode_step(model_.decoder_state(), fed);
}

bool CachedTransformerScorer::step_best(const BeamStep& step, int count,
                                        std::vector<float>& values,
                                        std::vector<int32_t>& tokens) {
  const std::vector<int32_t>& fed = prepare_step(step, true);
  model_.decode_step_best_tokens(model_.decoder_state(), fed, count, values, tokens);
  values.resize(static_cast<size_t>(step.size()) * count);
  tokens.resize(static_cast<size_t>(step.size()) * count);
  return true;
}

namespace {

struct Live {
  TokenSequence tokens;
  double log_prob = 0;
  int parent = -1;  // its parent's index among the previous step's hypotheses
  int index = -1;   // its own among the hypotheses of the step that scores it
};

struct SentenceState {
  std::vector<Live> live;
  std::vector<Hypothesis> finished;  // sorted best first, at most `beam`
  int max_len = 0;
  bool done = false;
};

void add_finished(SentenceState& state, Hypothesis hypothesis, int beam) {
  state.finished.push_back(std::move(hypothesis));
  std::stable_sort(state.finished.begin(), state.finished.end(),
                   [](const Hypothesis& a, const Hypothesis& b) { return a.score > b.score; });
  if (static_cast<int>(state.finished.size()) > beam) state.finished.resize(beam);
}

// Early termination: with `beam` finished hypotheses, stop when no live one can end
// better than the worst of them. A live hypothesis' raw score only falls as it grows
// (log-probabilities are <= 0), and its length penalty is at most lp(max_len), so its
// best possible final score is raw / lp(max_len) (raw < 0 shrinks in magnitude as lp
// grows).
bool cannot_improve(const SentenceState& state, int beam, float alpha) {
  if (static_cast<int>(state.finished.size()) < beam) return false;
  const double worst_finished = state.finished.back().score;
  const double best_penalty = length_penalty(state.max_len, alpha);
  for (const Live& hypothesis : state.live) {
    if (hypothesis.log_prob / best_penalty > worst_finished) return false;
  }
  return true;
}

}  // namespace

namespace beam_detail {

bool ranks_before(const Candidate& a, const Candidate& b) {
  return a.log_prob > b.log_prob ||
         (a.log_prob == b.log_prob &&
          (a.parent < b.parent || (a.parent == b.parent && a.token < b.token)));
}

// A candidate with k better ones in its sentence has at most k better ones among its own
// parent's, so keeping each row's best `count` loses none of the sentence's best
// `count`; and a sorted list of `count` replaces beam * vocab candidates to sort.
void add_best_extensions(const float* row, int vocab, double parent_log_prob, int parent,
                         const char* allowed, const SpecialIds& ids, size_t count,
                         std::vector<Candidate>& candidates) {
  if (count == 0) return;
  const size_t row_begin = candidates.size();
  for (int token = 0; token < vocab; ++token) {
    if (token == ids.pad || token == ids.bos) continue;  // never generated
    if (allowed != nullptr && !allowed[token]) continue;
    const double log_prob = parent_log_prob + row[token];
    if (candidates.size() - row_begin == count) {
      // Full: a tie with the worst kept loses to that one's smaller token.
      if (!(log_prob > candidates.back().log_prob)) continue;
      candidates.pop_back();
    }
    // After every kept one at least as good (tokens come in increasing order).
    auto at = candidates.end();
    while (static_cast<size_t>(at - candidates.begin()) > row_begin &&
           (at - 1)->log_prob < log_prob) {
      --at;
    }
    candidates.insert(at, {log_prob, parent, token});
  }
}

// A ranked row (NextTokenScorer::step_best) comes best value first, equal values in
// token order, which is ranks_before's order of its candidates except where adding the
// parent's log-probability in double rounds two values to one sum: then the smaller
// token goes first, which may be the later one. So each run is checked (keep - 1
// comparisons when it is ordered) and sorted only when it is not.
void best_candidates(std::vector<Candidate>& candidates, const std::vector<size_t>& row_ends,
                     size_t keep, std::vector<Candidate>& best) {
  const auto before = [](const Candidate& a, const Candidate& b) { return ranks_before(a, b); };
  best.clear();
  // heads[h]: hypothesis h's best candidate not yet taken; its run ends at row_ends[h].
  thread_local std::vector<size_t> heads;
  heads.clear();
  size_t begin = 0;
  for (const size_t end : row_ends) {
    if (!std::is_sorted(candidates.begin() + begin, candidates.begin() + end, before)) {
      std::sort(candidates.begin() + begin, candidates.begin() + end, before);
    }
    heads.push_back(begin);
    begin = end;
  }
  THPC_CHECK(begin == candidates.size(),
             "runs ending at " << begin << " of " << candidates.size() << " candidates");
  keep = std::min(keep, candidates.size());
  while (best.size() < keep) {
    size_t from = row_ends.size();  // the run whose head ranks first
    for (size_t h = 0; h < row_ends.size(); ++h) {
      if (heads[h] == row_ends[h]) continue;
      if (from == row_ends.size() || before(candidates[heads[h]], candidates[heads[from]])) {
        from = h;
      }
    }
    best.push_back(candidates[heads[from]++]);
  }
}

Hypothesis finished_hypothesis(TokenSequence tokens, double log_prob, int generated,
                               float alpha) {
  Hypothesis done;
  done.tokens = std::move(tokens);
  done.log_prob = log_prob;
  done.score = log_prob / length_penalty(generated, alpha);
  return done;
}

int output_length_limit(size_t source_length, const BeamOptions& options) {
  // In double, bounded before the conversion: no a or b overflows an int.
  double limit = options.max_len_a * static_cast<double>(source_length) + options.max_len_b;
  if (options.max_len_cap > 0) limit = std::min(limit, static_cast<double>(options.max_len_cap));
  limit = std::min(limit, static_cast<double>(std::numeric_limits<int>::max()));
  return std::max(1, static_cast<int>(limit));
}

bool score_step(NextTokenScorer& scorer, const BeamStep& step, int ranked_count,
                std::vector<float>& log_probs, std::vector<float>& best_values,
                std::vector<int32_t>& best_tokens) {
  const size_t hypotheses = static_cast<size_t>(step.size());
  if (ranked_count > 0 && scorer.step_best(step, ranked_count, best_values, best_tokens)) {
    const size_t expected = hypotheses * static_cast<size_t>(ranked_count);
    THPC_CHECK(best_values.size() == expected && best_tokens.size() == expected,
               "the scorer ranked " << best_values.size() << " values and "
                                    << best_tokens.size() << " tokens for " << hypotheses
                                    << " hypotheses of " << ranked_count << " each");
    return true;
  }
  scorer.step(step, log_probs);
  const int vocab = scorer.vocab_size();
  THPC_CHECK(log_probs.size() == hypotheses * static_cast<size_t>(vocab),
             "the scorer gave " << log_probs.size() << " log-probabilities for " << hypotheses
                                << " hypotheses of " << vocab << " tokens");
  return false;
}

}  // namespace beam_detail

std::vector<std::vector<Hypothesis>> beam_search(NextTokenScorer& scorer,
                                                 const std::vector<TokenSequence>& sources,
                                                 const SpecialIds& ids,
                                                 const BeamOptions& options) {
  THPC_CHECK(options.beam >= 1, "beam size " << options.beam);
  THPC_CHECK(options.nbest >= 1 && options.nbest <= options.beam,
             "nbest " << options.nbest << " must be in [1, beam " << options.beam << "]");
  const int vocab = scorer.vocab_size();
  const int beam = options.beam;
  std::vector<SentenceState> states(sources.size());
  for (size_t s = 0; s < sources.size(); ++s) {
    states[s].max_len = beam_detail::output_length_limit(sources[s].size(), options);
    states[s].live.push_back(Live{});
  }
  scorer.start(sources);
  std::vector<char> allowed;  // the filter's answer for one hypothesis
  std::vector<float> log_probs;  // [hypotheses, vocab], the same vector every step
  using beam_detail::Candidate;
  std::vector<Candidate> candidates;  // one sentence's, the same vector every step
  // The best 2 * beam candidates of a sentence suffice: at most `beam` of them end in
  // eos, so at least `beam` continue.
  const size_t best_count = static_cast<size_t>(2 * beam);
  // Without a filter each hypothesis contributes only its best extensions, which the
  // scorer may rank itself (step_best: on a GPU, where the log-probabilities are); with
  // one, the filter reads and rewrites whole rows. Selecting on the token's
  // log-probability picks what selecting on parent + log-probability picks, except where
  // adding the parent's score in double rounds two different float log-probabilities to
  // one sum at the k-th place (a tie the full path breaks by the smaller token).
  int selectable = 0;
  for (int token = 0; token < vocab; ++token) selectable += token != ids.pad && token != ids.bos;
  const int ranked_count = static_cast<int>(std::min<size_t>(best_count, selectable));
  std::vector<float> best_values;   // [hypotheses, ranked_count] when the scorer ranks
  std::vector<int32_t> best_tokens;

  BeamStep step;  // the vectors are kept from step to step
  std::vector<int> continuations;  // per live hypothesis of a sentence: its chosen children
  std::vector<size_t> chosen;      // a sentence's chosen candidates (indices into best)
  std::vector<size_t> row_ends;    // where each live hypothesis' candidates end
  std::vector<Candidate> best;     // a sentence's best 2 * beam candidates, best first
  std::vector<Live> next_live;     // a sentence's next live hypotheses (swapped in)
  for (step.position = 0;; ++step.position) {
    // All live hypotheses of unfinished sentences, scored in one call: the scorer gets
    // each one's parent, last token and a view of its prefix, nothing copied.
    step.clear_hypotheses();
    for (size_t s = 0; s < states.size(); ++s) {
      if (states[s].done) continue;
      for (Live& hypothesis : states[s].live) {
        hypothesis.index =
            step.add_hypothesis(static_cast<int>(s), hypothesis.tokens, hypothesis.parent);
      }
    }
    if (step.size() == 0) break;
    const bool ranked = beam_detail::score_step(
        scorer, step, options.filter == nullptr ? ranked_count : 0, log_probs, best_values,
        best_tokens);

    size_t row = 0;
    for (size_t s = 0; s < states.size(); ++s) {
      SentenceState& state = states[s];
      if (state.done) continue;
      // Candidates: live hypotheses extended by one token, each hypothesis' best
      // 2 * beam only (see add_best_extensions), then the sentence's best of those.
      candidates.clear();
      row_ends.clear();
      for (size_t h = 0; h < state.live.size(); ++h, ++row) {
        if (ranked) {
          // Each field written in place: a candidate built aside and copied in (two
          // 8-byte stores read back as one 16-byte load) stalled on store forwarding.
          const size_t first = candidates.size();
          candidates.resize(first + static_cast<size_t>(ranked_count));
          Candidate* extension = candidates.data() + first;
          const double parent_log_prob = state.live[h].log_prob;
          for (int i = 0; i < ranked_count; ++i, ++extension) {
            const size_t at = row * static_cast<size_t>(ranked_count) + i;
            const int token = best_tokens[at];
            THPC_CHECK(token >= 0 && token < vocab && token != ids.pad && token != ids.bos,
                       "the scorer ranked token " << token << " (vocabulary " << vocab << ")");
            extension->log_prob = parent_log_prob + best_values[at];
            extension->parent = static_cast<int>(h);
            extension->token = token;
          }
          row_ends.push_back(candidates.size());
          continue;
        }
        if (options.filter != nullptr) {
          options.filter->allowed_next(static_cast<int>(s), state.live[h].tokens,
                                       state.max_len, allowed);
          THPC_CHECK(static_cast<int>(allowed.size()) == vocab,
                     "the token filter answered for " << allowed.size() << " tokens, not "
                                                      << vocab);
          options.filter->rescore(static_cast<int>(s), state.live[h].tokens,
                                  log_probs.data() + row * static_cast<size_t>(vocab));
        }
        beam_detail::add_best_extensions(
            log_probs.data() + row * static_cast<size_t>(vocab), vocab,
            state.live[h].log_prob, static_cast<int>(h),
            options.filter != nullptr ? allowed.data() : nullptr, ids, best_count, candidates);
        row_ends.push_back(candidates.size());
      }
      beam_detail::best_candidates(candidates, row_ends, best_count, best);
      const size_t keep = best.size();
      // The sentence takes its best candidates until `beam` of them continue; one that
      // ends (by eos, or forced at the length limit, which counts eos) is finished.
      const int generated = step.position + 1;  // tokens of each candidate, eos included
      auto ends = [&](const Candidate& c) {
        return c.token == ids.eos || generated >= state.max_len;
      };
      chosen.clear();
      continuations.assign(state.live.size(), 0);
      int continuing = 0;
      for (size_t c = 0; c < keep && continuing < beam; ++c) {
        chosen.push_back(c);
        ++continuations[best[c].parent];
        continuing += !ends(best[c]);
      }
      // A parent's tokens are copied for each chosen candidate but its last, which takes
      // them: a hypothesis' prefix is copied only where the beam branches.
      next_live.clear();
      for (const size_t c : chosen) {
        const Candidate& candidate = best[c];
        Live& parent = state.live[candidate.parent];
        TokenSequence tokens;
        if (--continuations[candidate.parent] == 0) {
          tokens = std::move(parent.tokens);
        } else {
          tokens = parent.tokens;
        }
        if (candidate.token != ids.eos) tokens.push_back(candidate.token);
        if (ends(candidate)) {
          add_finished(state,
                       beam_detail::finished_hypothesis(std::move(tokens), candidate.log_prob,
                                                        generated, options.alpha),
                       beam);
        } else {
          next_live.push_back(Live{std::move(tokens), candidate.log_prob, parent.index});
        }
      }
      state.live.swap(next_live);  // next_live's vector (and capacity) serves the next one
      state.done = state.live.empty() || cannot_improve(state, beam, options.alpha);
    }
  }

  std::vector<std::vector<Hypothesis>> results;
  for (SentenceState& state : states) {
    if (static_cast<int>(state.finished.size()) > options.nbest) {
      state.finished.resize(options.nbest);
    }
    results.push_back(std::move(state.finished));
  }
  return results;
}

}  // namespace thpc
