// Training steps as the trainer takes them (Trainer::compute_step and apply_update, one
// rank): micro-batches accumulated into one gradient, the step's inputs written before
// each, the totals and the norm read once, Adam. Shared by the captured passes' CPU test
// (test_captured_passes.cc, on the CPU's stand-in for CUDA graphs) and its GPU twin
// (test_cuda_training.cc, CudaCandidateStepGraphs.* and CudaCapturedDecoding.*), so that
// the CPU run rehearses the GPU test's own logic; and the beam searches their decoding
// tests compare.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "data/batch.h"
#include "decode/beam_search.h"
#include "distributed/gradient_reducer.h"
#include "kernels/ops.h"
#include "model/transformer.h"
#include "train/lr_schedule.h"
#include "train/optimizer.h"

namespace thpc::test {

// A model of 2 + 2 layers of width 8 (d_ff 12, 2 heads of d_k 3 and d_v 5: odd sizes),
// with dropout and label smoothing, post- or pre-norm (`norm`): small enough that a
// dozen steps take milliseconds.
inline ModelConfig small_model(const std::string& norm) {
  ModelConfig c;
  c.layers = 2;
  c.d_model = 8;
  c.d_ff = 12;
  c.heads = 2;
  c.d_k = 3;
  c.d_v = 5;
  c.dropout = 0.1f;
  c.attention_dropout = 0.1f;
  c.label_smoothing = 0.1f;
  c.max_positions = 16;
  c.norm = norm;
  return c;
}

// Micro-batches of tiny random sentences, `shapes` different (batch size, source length,
// target length) shapes cycling, ids in [4, vocab), lengths within max_len;
// `more_sentences` more sentences in each (a batch larger than the others).
inline std::vector<Batch> batches_of_shapes(int shapes, int count, int vocab, int max_len,
                                            uint32_t seed, int more_sentences = 0) {
  std::vector<Batch> batches;
  uint32_t state = seed;
  const auto next = [&state](uint32_t bound) {
    state = state * 1664525u + 1013904223u;  // an LCG: the same batches on every machine
    return (state >> 8) % bound;
  };
  for (int i = 0; i < count; ++i) {
    const int shape = i % shapes;
    const int sentences = 2 + shape + more_sentences;
    const int src_len = std::min(max_len, 3 + 2 * shape);
    const int tgt_len = std::min(max_len - 1, 2 + shape);
    std::vector<TokenSequence> sources, targets;
    for (int b = 0; b < sentences; ++b) {
      // The first sentence has the full lengths (the shape); the others may be shorter.
      const int s = b == 0 ? src_len : 1 + static_cast<int>(next(src_len));
      const int t = b == 0 ? tgt_len : 1 + static_cast<int>(next(tgt_len));
      TokenSequence source, target;
      for (int j = 0; j < s; ++j) source.push_back(4 + static_cast<int32_t>(next(vocab - 4)));
      for (int j = 0; j < t; ++j) target.push_back(4 + static_cast<int32_t>(next(vocab - 4)));
      sources.push_back(source);
      targets.push_back(target);
    }
    batches.push_back(make_batch(sources, targets, SpecialIds{}));
  }
  return batches;
}

// What GradientSums hands the last micro-batch (train/gradient_sums.h), for a transport
// alone: the buckets started as backward finishes them, the finish queued at the pass's
// end where the transport is capturable.
struct ReducerListener : GradientListener {
  explicit ReducerListener(GradientReducer* r) : reducer(r) {}
  void gradients_final_from(int64_t offset) override { reducer->ready_from(offset); }
  void pass_end() override {
    if (reducer->capturable()) reducer->queue_finish();
  }
  bool capturable() const override { return reducer->capturable(); }
  void pass_discarded() override { reducer->restart(); }
  GradientReducer* reducer;
};

struct StepsRun {
  std::vector<StepTotals> totals;  // each step's, as read
  std::vector<float> params;       // after the last update
  Transformer::CaptureCounts counts;
};

// `steps` steps of `accumulate` micro-batches each, taken from `batches` in order
// (cycling), the model initialised from `init_seed`, dropout keyed by `dropout_seed`,
// the logits made `loss_chunk_rows` rows at a time (0: whole).
// With `reducer`: the last micro-batch's backward starts its sums as GradientSums does
// for several ranks (train/gradient_sums.h), through a ReducerListener; the finish is
// awaited after.
inline StepsRun run_training_steps(Backend& backend, const ModelConfig& config, int vocab,
                                   const std::vector<Batch>& batches, int steps, int accumulate,
                                   uint64_t init_seed, uint64_t dropout_seed,
                                   int64_t loss_chunk_rows = 0,
                                   GradientReducer* reducer = nullptr) {
  Transformer model(config, vocab, SpecialIds{}, backend, init_seed);
  model.set_loss_chunk_rows(loss_chunk_rows);
  Adam adam(model.params(), backend, AdamSettings{});
  StepTotalsBuffer totals(backend);
  StepInputsBuffer inputs(backend);
  ReducerListener listener(reducer);
  StepsRun run;
  size_t next_batch = 0;
  for (int step = 1; step <= steps; ++step) {
    std::vector<const Batch*> micro;
    int64_t tokens = 0;
    for (int i = 0; i < accumulate; ++i) {
      micro.push_back(&batches[next_batch++ % batches.size()]);
      tokens += micro.back()->tgt_tokens();
    }
    backend.zero(model.params().grads());
    totals.zero();
    for (int i = 0; i < accumulate; ++i) {
      DropoutContext dropout;
      dropout.seed = dropout_seed;
      dropout.step = static_cast<uint32_t>(step);
      dropout.stream = static_cast<uint32_t>(i);
      inputs.set(step_inputs_for(dropout, 1.0f / static_cast<float>(tokens)));
      const bool summed = reducer != nullptr && i + 1 == accumulate;
      if (summed) reducer->begin(model.params().grads());
      model.train_step(*micro[i], dropout, inputs.in_backend(), totals.tensor(),
                       summed ? &listener : nullptr);
      if (summed) {
        if (reducer->capturable()) {
          reducer->await_finish();
        } else {
          reducer->finish();
        }
      }
    }
    const Tensor grads = model.params().grads();
    backend.sum_squares_into(totals.tensor(), grads, grads.numel);
    run.totals.push_back(totals.read(vocab));
    adam.update(static_cast<float>(learning_rate(step, config.d_model, 4000, 2.0)), step);
  }
  run.params = model.params().to_host_f32();
  run.counts = model.capture_counts();
  return run;
}

// A stand-in for the sums over two ranks that hold the same gradient: each bucket
// doubled in place on the backend (scale), as a sum of two equal halves would leave it.
// capturable: as NCCL's, its work all queued on the backend, none on the host.
class DoublingReducer final : public GradientReducer {
 public:
  DoublingReducer(Backend& backend, bool capturable)
      : GradientReducer(/*bucket_bytes=*/4096), backend_(backend), capturable_(capturable) {}
  bool capturable() const override { return capturable_; }

 protected:
  void start(Tensor bucket) override { backend_.scale(bucket, bucket.numel, 2.0f); }
  void await_complete() override {}

 private:
  Backend& backend_;
  bool capturable_;
};

// Two beam searches over `sources` with `options`, by one model made from `config`
// (vocabulary 12, initialised from seed 5) on `backend` and handed to `prepare` first
// (e.g. to quantize its weights): the first search's hypotheses, then the second's, and
// what the model's capturing did.
inline std::vector<std::vector<Hypothesis>> search_twice(
    Backend& backend, const ModelConfig& config, const std::vector<TokenSequence>& sources,
    const BeamOptions& options, Transformer::CaptureCounts& counts,
    const std::function<void(Transformer&)>& prepare = {}) {
  Transformer model(config, 12, SpecialIds{}, backend, 5);
  if (prepare) prepare(model);
  CachedTransformerScorer scorer(model, SpecialIds{}, config.max_positions - 1);
  auto results = beam_search(scorer, sources, SpecialIds{}, options);
  const auto again = beam_search(scorer, sources, SpecialIds{}, options);
  results.insert(results.end(), again.begin(), again.end());
  counts = model.capture_counts();
  return results;
}

// search_twice with a beam of 4 (two best each) over the same five sentences.
inline std::vector<std::vector<Hypothesis>> run_two_beam_searches(
    Backend& backend, const ModelConfig& config, Transformer::CaptureCounts& counts,
    const std::function<void(Transformer&)>& prepare = {}) {
  const std::vector<TokenSequence> sources = {{4, 5, 6}, {7}, {8, 9, 10, 11, 4}, {6, 6},
                                              {5, 9, 7}};
  BeamOptions options;
  options.beam = 4;
  options.max_len_b = 8;
  options.max_len_cap = config.max_positions - 1;
  options.nbest = 2;
  return search_twice(backend, config, sources, options, counts, prepare);
}

// A filter that never allows eos: every sentence then runs to its own length limit.
class NoEosFilter final : public NextTokenFilter {
 public:
  explicit NoEosFilter(int vocab) : vocab_(vocab) {}
  void allowed_next(int /*source*/, const TokenSequence& /*prefix*/, int /*max_len*/,
                    std::vector<char>& allowed) const override {
    allowed.assign(static_cast<size_t>(vocab_), 1);
    allowed[SpecialIds{}.eos] = 0;
  }

 private:
  int vocab_;
};

// search_twice with a beam of 4 (two best each) over twelve sentences of lengths 1..12
// whose length limits are 3..14 (max_len_b 2), with `filter` (or none): with NoEosFilter
// each sentence ends at its own limit, one a step in the search's tail, where the
// captured steps are padded (CachedTransformerScorer).
inline std::vector<std::vector<Hypothesis>> run_two_searches_ending_apart(
    Backend& backend, const ModelConfig& config, const NextTokenFilter* filter,
    Transformer::CaptureCounts& counts) {
  std::vector<TokenSequence> sources;
  for (int length = 1; length <= 12; ++length) {
    sources.push_back(TokenSequence(static_cast<size_t>(length), 4 + length % 8));
  }
  BeamOptions options;
  options.beam = 4;
  options.max_len_b = 2;
  options.max_len_cap = config.max_positions - 1;
  options.nbest = 2;
  options.filter = filter;
  return search_twice(backend, config, sources, options, counts);
}

// The same hypotheses with scores within `relative` of each other (plus 1e-5 absolute):
// for searches whose products had other row counts (padded steps), which a BLAS may round
// otherwise in the last bit.
inline void expect_same_hypotheses_near(const std::vector<std::vector<Hypothesis>>& a,
                                        const std::vector<std::vector<Hypothesis>>& b,
                                        double relative) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t s = 0; s < b.size(); ++s) {
    ASSERT_EQ(a[s].size(), b[s].size()) << "sentence " << s;
    for (size_t i = 0; i < b[s].size(); ++i) {
      EXPECT_EQ(a[s][i].tokens, b[s][i].tokens) << "sentence " << s << " best " << i;
      EXPECT_NEAR(a[s][i].log_prob, b[s][i].log_prob, 1e-5 + relative * std::abs(b[s][i].log_prob))
          << "sentence " << s;
      EXPECT_NEAR(a[s][i].score, b[s][i].score, 1e-5 + relative * std::abs(b[s][i].score))
          << "sentence " << s;
    }
  }
}

// Captured against uncaptured (or any two runs of the same ops on the same data): every
// step's totals and the final parameters equal bit for bit; on a difference, the largest
// one among the parameters.
inline void expect_same_steps(const StepsRun& captured, const StepsRun& plain) {
  ASSERT_EQ(captured.totals.size(), plain.totals.size());
  for (size_t step = 0; step < plain.totals.size(); ++step) {
    SCOPED_TRACE("step " + std::to_string(step + 1));
    EXPECT_EQ(captured.totals[step].loss, plain.totals[step].loss);
    EXPECT_EQ(captured.totals[step].nll, plain.totals[step].nll);
    EXPECT_EQ(captured.totals[step].tokens, plain.totals[step].tokens);
    EXPECT_EQ(captured.totals[step].grad_squares, plain.totals[step].grad_squares);
  }
  ASSERT_EQ(captured.params.size(), plain.params.size());
  double largest = 0.0;
  for (size_t i = 0; i < plain.params.size(); ++i) {
    largest = std::max(largest, std::abs(double(captured.params[i]) - plain.params[i]));
  }
  EXPECT_EQ(captured.params, plain.params) << "largest |difference| " << largest;
}

// The same hypotheses, best first, with the same scores, bit for bit.
inline void expect_same_hypotheses(const std::vector<std::vector<Hypothesis>>& captured,
                                   const std::vector<std::vector<Hypothesis>>& plain) {
  ASSERT_EQ(captured.size(), plain.size());
  for (size_t s = 0; s < plain.size(); ++s) {
    ASSERT_EQ(captured[s].size(), plain[s].size()) << "sentence " << s;
    for (size_t i = 0; i < plain[s].size(); ++i) {
      EXPECT_EQ(captured[s][i].tokens, plain[s][i].tokens) << "sentence " << s << " best " << i;
      EXPECT_EQ(captured[s][i].log_prob, plain[s][i].log_prob) << "sentence " << s;
      EXPECT_EQ(captured[s][i].score, plain[s][i].score) << "sentence " << s;
    }
  }
}

}  // namespace thpc::test
