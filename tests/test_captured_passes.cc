// Captured training passes (Backend::capture, CUDA graphs on a GPU with
// train.cuda_kernels step_graphs), tested without a GPU on the CPU's stand-in
// (kernels/capturing_backend.h): it records what a pass queues instead of running it and
// replays the recording, refusing what a graph cannot hold. Training through it must be
// training without it, bit for bit: what changes between steps is read from memory when
// the ops run (StepInputs), a shape's pass is captured again when memory it used has been
// freed, and a pass that cannot be captured runs uncaptured.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "captured_steps.h"
#include "common/error.h"
#include "decode/beam_search.h"
#include "decode/compute_type.h"
#include "kernels/capture_free_lock.h"
#include "kernels/capturing_backend.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/forwarding_backend.h"
#include "kernels/cpu/int8_backend.h"
#include "kernels/cpu/int8_matmul.h"
#include "model/capture_schedule.h"
#include "model/device_buffers.h"
#include "model/transformer.h"

namespace thpc {
namespace {

constexpr int kVocab = 23;

// Three shapes for six steps, then the same three with a batch of 40 sentences among
// them: its ids outgrow their buffer, which is replaced (a free), so every capture taken
// before is refused at its next replay and taken again.
std::vector<Batch> schedule(int vocab, int max_len) {
  std::vector<Batch> batches = test::batches_of_shapes(3, 12, vocab, max_len, 11);
  const Batch big = test::batches_of_shapes(1, 1, vocab, max_len, 13, 40)[0];
  std::vector<Batch> later = test::batches_of_shapes(3, 12, vocab, max_len, 12);
  later.insert(later.begin() + 1, big);
  batches.insert(batches.end(), later.begin(), later.end());
  return batches;
}

// (model.norm, train.loss_chunk_rows)
class CapturedPasses : public ::testing::TestWithParam<std::tuple<const char*, int>> {};

// Twelve steps of two micro-batches: each step's own masks (step and stream read from
// memory as the ops run: a replay drawing with its capture's step would give other
// losses), its own 1 / tokens, shapes captured at their second pass and replayed after,
// captured again after the arenas grew.
TEST_P(CapturedPasses, TrainingEqualsUncapturedTrainingBitForBit) {
  const char* const norm = std::get<0>(GetParam());
  const int chunk_rows = std::get<1>(GetParam());  // the lambda below captures it
  const ModelConfig config = test::small_model(norm);
  const std::vector<Batch> batches = schedule(kVocab, 12);
  auto plain_backend = make_cpu_backend(DType::F32);
  auto inner = make_cpu_backend(DType::F32);
  CapturingBackend capturing(*inner);
  const auto run = [&](Backend& backend) {
    return test::run_training_steps(backend, config, kVocab, batches, 12, 2, 3, 5, chunk_rows);
  };
  const test::StepsRun plain = run(*plain_backend);
  const test::StepsRun captured = run(capturing);
  test::expect_same_steps(captured, plain);
  EXPECT_GE(captured.counts.captures, 6) << "every shape captured, and again after growth";
  EXPECT_GT(captured.counts.replays, captured.counts.captures);
  EXPECT_EQ(captured.counts.refused, 0) << capturing.last_refusal();
  EXPECT_GT(capturing.refused_replays(), 0) << "the arenas' growth must end earlier captures";
  EXPECT_EQ(plain.counts.captures, 0);
  EXPECT_EQ(plain.counts.replays, 0);
}

INSTANTIATE_TEST_SUITE_P(NormsAndLossChunks, CapturedPasses,
                         ::testing::Values(std::make_tuple("post", 0), std::make_tuple("pre", 0),
                                           std::make_tuple("post", 5)));

// `steps` steps of `accumulate` micro-batches of the small post-norm model, the last
// micro-batch's gradient summed by the doubling stand-in (`capturable` or a host
// transport), on the CPU and through `capturing`, a stand-in for graphs.
struct SumsRuns {
  test::StepsRun plain, captured;
};
SumsRuns training_with_doubling_sums(CapturingBackend& capturing,
                                     const std::vector<Batch>& batches, int steps,
                                     int accumulate, bool capturable) {
  const ModelConfig config = test::small_model("post");
  auto plain_backend = make_cpu_backend(DType::F32);
  test::DoublingReducer plain_sums(*plain_backend, capturable);
  test::DoublingReducer captured_sums(capturing, capturable);
  SumsRuns runs;
  runs.plain = test::run_training_steps(*plain_backend, config, kVocab, batches, steps,
                                        accumulate, 3, 5, 0, &plain_sums);
  runs.captured = test::run_training_steps(capturing, config, kVocab, batches, steps, accumulate,
                                           3, 5, 0, &captured_sums);
  return runs;
}

// The sums over ranks inside the captured pass (GradientReducer::capturable: NCCL's on a
// GPU; here the doubling stand-in, its work all on the backend): one micro-batch a step,
// so every pass has the sums' listener; with a capturable transport the pass is captured
// with its buckets' sums and its finish queued at its end, and equals the uncaptured
// steps bit for bit (a replay that left the sums out would halve the gradient). With a
// transport that calls the host (MPI's), nothing is captured.
TEST(CapturedSums, ACapturableTransportsSumsAreCapturedWithThePass) {
  const std::vector<Batch> batches = schedule(kVocab, 12);
  for (bool capturable : {true, false}) {
    SCOPED_TRACE(capturable ? "capturable" : "host transport");
    auto inner = make_cpu_backend(DType::F32);
    CapturingBackend capturing(*inner);
    const SumsRuns runs = training_with_doubling_sums(capturing, batches, 12, 1, capturable);
    test::expect_same_steps(runs.captured, runs.plain);
    if (capturable) {
      EXPECT_GE(runs.captured.counts.captures, 3);
      EXPECT_GT(runs.captured.counts.replays, runs.captured.counts.captures);
    } else {
      EXPECT_EQ(runs.captured.counts.captures, 0);
      EXPECT_EQ(capturing.captures(), 0);
    }
  }
}

// Two micro-batches a step, all of one shape: the first runs without the sums, the last
// with them (a capturable transport's, the doubling stand-in's). The two are different
// passes of one shape and must never share a capture: the last replaying the first's
// would leave the sums out, the first replaying the last's would double a partial
// gradient. Equal to the uncaptured steps bit for bit.
TEST(CapturedSums, PassesWithAndWithoutTheSumsNeverShareACapture) {
  const std::vector<Batch> batches = test::batches_of_shapes(1, 12, kVocab, 12, 21);
  auto inner = make_cpu_backend(DType::F32);
  CapturingBackend capturing(*inner);
  const SumsRuns runs = training_with_doubling_sums(capturing, batches, 6, 2, true);
  test::expect_same_steps(runs.captured, runs.plain);
  EXPECT_EQ(runs.captured.counts.captures, 2) << "one for the passes without the sums, one with";
  EXPECT_EQ(runs.captured.counts.replays, 10) << "every pass after each kind's first";
  // transformer_data_stats' schedule keys them apart alike.
  CaptureSchedule schedule(Transformer::kMaxCapturedPasses);
  for (int pass = 0; pass < 12; ++pass) {
    const Batch& batch = batches[size_t(pass)];
    schedule.next(PassShape{batch.size, batch.src_len, batch.tgt_len, pass % 2 == 1});
  }
  EXPECT_EQ(schedule.tally().shapes, 2);
  EXPECT_EQ(schedule.tally().captured, runs.captured.counts.captures);
  EXPECT_EQ(schedule.tally().captured + schedule.tally().replayed, runs.captured.counts.replays);
}

// The stand-in refusing every capture at the pass's last op, the embedding's backward
// (it waits for the backend first, which a capture cannot hold): by then backward has
// started most of the sums inside the capture.
class RefusingAtTheEmbeddingBackend : public CapturingBackend {
 public:
  using CapturingBackend::CapturingBackend;
  void embedding_backward(ParamOut d_table, ParamOut d_positions, In d_out,
                          const int32_t* tokens, int rows, int length, int d, int vocab,
                          float scale) override {
    synchronize();
    CapturingBackend::embedding_backward(d_table, d_positions, d_out, tokens, rows, length, d,
                                         vocab, scale);
  }
};

// A capture refused after the sums began: what the listener's calls queued went with it,
// and the uncaptured run that follows must start the sums over (GradientListener::
// pass_discarded), or its buckets would be left unsummed. Equal to the steps without
// captures, bit for bit.
TEST(CapturedSums, ARefusedCaptureStartsTheSumsOver) {
  const std::vector<Batch> batches = test::batches_of_shapes(2, 12, kVocab, 12, 23);
  auto inner = make_cpu_backend(DType::F32);
  RefusingAtTheEmbeddingBackend refusing(*inner);
  const SumsRuns runs = training_with_doubling_sums(refusing, batches, 6, 1, true);
  test::expect_same_steps(runs.captured, runs.plain);
  EXPECT_EQ(runs.captured.counts.refused, 2) << "each shape's capture tried once";
  EXPECT_EQ(refusing.last_refusal(), "synchronize");
}

// The stand-in with a loss that misbehaves while its pass may be captured: waits for the
// backend (as the GPU's verified loss does, reading each micro-batch's sums back), or
// throws (a bad argument, say).
class MisbehavingLossBackend : public CapturingBackend {
 public:
  enum class Does { kNothing, kWait, kThrow };
  MisbehavingLossBackend(Backend& inner, Does what) : CapturingBackend(inner), does(what) {}
  Does does;
  void softmax_cross_entropy_add(Out d_logits, In logits, const int32_t* targets, int rows,
                                 int vocab, float eps, int pad_id, const StepInputs* inputs,
                                 ParamOut totals) override {
    if (does == Does::kWait) synchronize();
    THPC_CHECK(does != Does::kThrow, "the loss refused its arguments");
    CapturingBackend::softmax_cross_entropy_add(d_logits, logits, targets, rows, vocab, eps,
                                                pad_id, inputs, totals);
  }
};

// A loss that waits: no pass can be captured. Each shape's capture is tried once,
// refused, and its passes run uncaptured from then on: the same training.
TEST(CapturedPassesRefused, APassThatWaitsRunsUncapturedOnceRefused) {
  const ModelConfig config = test::small_model("post");
  const std::vector<Batch> batches = test::batches_of_shapes(3, 12, kVocab, 12, 11);
  auto plain_backend = make_cpu_backend(DType::F32);
  auto inner = make_cpu_backend(DType::F32);
  MisbehavingLossBackend waiting(*inner, MisbehavingLossBackend::Does::kWait);
  const test::StepsRun plain =
      test::run_training_steps(*plain_backend, config, kVocab, batches, 6, 2, 3, 5);
  const test::StepsRun refused =
      test::run_training_steps(waiting, config, kVocab, batches, 6, 2, 3, 5);
  test::expect_same_steps(refused, plain);
  EXPECT_EQ(refused.counts.captures, 0);
  EXPECT_EQ(refused.counts.refused, 3) << "each shape tried once";
  EXPECT_EQ(waiting.refused_captures(), 3);
  EXPECT_EQ(waiting.last_refusal(), "synchronize");
}

// A model trained on one small batch through `backend`, a micro-batch at a time (step 1,
// stream 0, the loss gradient scaled by 0.1), for the tests that watch single passes.
struct OneBatchTraining {
  explicit OneBatchTraining(Backend& backend)
      : model(test::small_model("post"), kVocab, SpecialIds{}, backend, 3),
        batch(test::batches_of_shapes(1, 1, kVocab, 12, 11)[0]), totals(backend),
        inputs(backend) {
    inputs.set(step_inputs_for(dropout, 0.1f));
  }
  void pass(GradientListener* listener = nullptr) {
    model.train_step(batch, dropout, inputs.in_backend(), totals.tensor(), listener);
  }

  Transformer model;
  Batch batch;
  DropoutContext dropout{5, 1, 0};
  StepTotalsBuffer totals;
  StepInputsBuffer inputs;
};

// An op that throws while its pass is captured (a bad argument, say) ends the capture,
// refused, and the uncaptured run that follows throws it to the caller: an error is
// never swallowed by the capture.
TEST(CapturedPassesRefused, AnErrorInACapturedPassReachesTheCaller) {
  auto inner = make_cpu_backend(DType::F32);
  MisbehavingLossBackend throwing(*inner, MisbehavingLossBackend::Does::kNothing);
  OneBatchTraining training(throwing);
  training.pass();  // the shape's first pass: uncaptured
  throwing.does = MisbehavingLossBackend::Does::kThrow;
  try {
    training.pass();  // captured: refused, then uncaptured: thrown
    ADD_FAILURE() << "the loss's error was swallowed";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("the loss refused its arguments"), std::string::npos);
  }
  EXPECT_EQ(throwing.refused_captures(), 1);
  EXPECT_EQ(throwing.last_refusal(), "the work threw");
}

// The dropout's seed is in the captured kernels' arguments: a pass with another seed is
// not a replay of the first seed's capture, and draws its own masks (the gradients equal
// those of the same passes uncaptured, bit for bit).
TEST(CapturedPasses, AnotherDropoutSeedIsAnotherCapture) {
  auto plain_backend = make_cpu_backend(DType::F32);
  auto inner = make_cpu_backend(DType::F32);
  CapturingBackend capturing(*inner);
  OneBatchTraining plain(*plain_backend), captured(capturing);
  const auto gradients = [](OneBatchTraining& training) {
    std::vector<float> host(static_cast<size_t>(training.model.params().buffer_numel()));
    training.model.backend().download(host.data(), training.model.params().grads());
    return host;
  };
  for (const uint64_t seed : {5, 5, 5, 6, 6}) {
    SCOPED_TRACE(seed);
    plain.dropout.seed = captured.dropout.seed = seed;
    plain.pass();
    captured.pass();
    EXPECT_EQ(gradients(captured), gradients(plain));
  }
  EXPECT_EQ(captured.model.capture_counts().captures, 2) << "one a seed, at its second pass";
}

// A capture holds its pass's chunking of the logits (train.loss_chunk_rows): a change
// drops the captures, and the next pass runs uncaptured in the new chunks.
TEST(CapturedPasses, ChangingTheLossChunksDropsTheCaptures) {
  auto inner = make_cpu_backend(DType::F32);
  CapturingBackend capturing(*inner);
  OneBatchTraining training(capturing);
  for (int i = 0; i < 3; ++i) training.pass();
  const Transformer::CaptureCounts before = training.model.capture_counts();
  EXPECT_EQ(before.captures, 1);
  training.model.set_loss_chunk_rows(5);
  training.pass();
  EXPECT_EQ(training.model.capture_counts().replays, before.replays) << "not a replay";
  training.pass();
  EXPECT_EQ(training.model.capture_counts().captures, before.captures + 1);
  training.model.set_loss_chunk_rows(5);  // unchanged: the capture stays
  training.pass();
  EXPECT_EQ(training.model.capture_counts().captures, before.captures + 1);
  EXPECT_EQ(training.model.capture_counts().replays, before.replays + 2);
}

// Backward whose listener calls host code (the transport of the sums over ranks by MPI)
// is never captured.
TEST(CapturedPassesRefused, PassesWithAHostListenerRunUncaptured) {
  auto inner = make_cpu_backend(DType::F32);
  CapturingBackend capturing(*inner);
  OneBatchTraining training(capturing);
  struct CountsCalls : GradientListener {
    void gradients_final_from(int64_t) override { ++calls; }
    int calls = 0;
  } listener;
  for (int i = 0; i < 4; ++i) training.pass(&listener);
  EXPECT_EQ(capturing.captures(), 0);
  EXPECT_EQ(training.model.capture_counts().captures, 0);
  EXPECT_GT(listener.calls, 4) << "every pass's backward told the listener";
}

// The schedule transformer_data_stats runs a corpus's shapes through
// (model/capture_schedule.h) counts what the model's captured passes do: five shapes met
// in an irregular order (one once, the others three or four times), the largest first so
// that no later batch outgrows the buffers (a free: its captures would be taken again,
// which the schedule leaves out), trained through the CPU's stand-in for graphs: as many
// captures, and as many replays, as the schedule says.
TEST(CaptureSchedule, CountsAreTheTransformers) {
  const std::vector<Batch> shapes = test::batches_of_shapes(5, 5, kVocab, 12, 17);
  std::vector<Batch> sequence;
  CaptureSchedule schedule(Transformer::kMaxCapturedPasses);
  for (int index : {4, 0, 1, 0, 2, 0, 1, 3, 3, 3, 1, 0, 4, 4}) {
    sequence.push_back(shapes[size_t(index)]);
    const Batch& batch = sequence.back();
    schedule.next(PassShape{batch.size, batch.src_len, batch.tgt_len});
  }
  auto inner = make_cpu_backend(DType::F32);
  CapturingBackend capturing(*inner);
  const test::StepsRun run =
      test::run_training_steps(capturing, test::small_model("post"), kVocab, sequence,
                               static_cast<int>(sequence.size()), 1, 3, 5);
  const CaptureSchedule::Tally& tally = schedule.tally();
  EXPECT_EQ(tally.shapes, 5);
  EXPECT_EQ(tally.uncaptured, 5);
  EXPECT_EQ(tally.captured, 4) << "every shape but 2 comes back";
  EXPECT_EQ(tally.replayed, 5);
  EXPECT_EQ(run.counts.captures, tally.captured);
  EXPECT_EQ(run.counts.replays, tally.captured + tally.replayed);
  EXPECT_EQ(run.counts.refused, 0);
}

// Past its capacity the schedule drops the least recently used shape, which starts again
// from an uncaptured pass, as Transformer::lru_entry does.
TEST(CaptureSchedule, TheLeastRecentlyUsedShapeIsDroppedAndStartsAgain) {
  CaptureSchedule schedule(2);
  using Run = CaptureSchedule::Run;
  const PassShape a{2, 3, 4}, b{2, 5, 4}, c{3, 3, 4};
  EXPECT_EQ(schedule.next(a), Run::kUncaptured);
  EXPECT_EQ(schedule.next(a), Run::kCaptured);
  EXPECT_EQ(schedule.next(b), Run::kUncaptured);
  EXPECT_EQ(schedule.next(a), Run::kReplayed);  // a is now the more recent
  EXPECT_EQ(schedule.next(c), Run::kUncaptured);  // drops b
  EXPECT_EQ(schedule.next(a), Run::kReplayed);
  EXPECT_EQ(schedule.next(b), Run::kUncaptured);  // b again from the start, drops c
  EXPECT_EQ(schedule.next(b), Run::kCaptured);
  EXPECT_EQ(schedule.next(c), Run::kUncaptured);  // drops a
  EXPECT_EQ(schedule.next(a), Run::kUncaptured);
  const CaptureSchedule::Tally& tally = schedule.tally();
  EXPECT_EQ(tally.shapes, 3);
  EXPECT_EQ(tally.evicted, 4);
  EXPECT_EQ(tally.passes(), 10);
  EXPECT_EQ(tally.replayed, 2);
  EXPECT_EQ(tally.captured, 2);
  EXPECT_EQ(tally.uncaptured, 6);
}

// On the CPU backend a key's step and stream in memory (DropoutKey::inputs) are read as
// the op runs: the masks of those values given as fields, and not of the fields beside.
TEST(StepInputsInMemory, DropoutKeysDrawWithTheStepAndStreamInMemory) {
  auto backend = make_cpu_backend(DType::F64);
  constexpr int64_t kN = 64;
  std::vector<double> ones(kN, 1.0);
  Tensor x = backend->alloc(DType::F64, kN), y = backend->alloc(DType::F64, kN),
         expected = backend->alloc(DType::F64, kN);
  backend->upload(x, ones.data());
  StepInputsBuffer inputs(*backend);
  StepInputs values;
  values.dropout_step = 9;
  values.dropout_stream = 4;
  inputs.set(values);
  DropoutKey fields{77, 9, 4, 3, nullptr};
  DropoutKey in_memory{77, 1, 0, 3, inputs.in_backend()};  // the fields say step 1
  backend->dropout_forward(expected, x, kN, 0.5f, fields);
  backend->dropout_forward(y, x, kN, 0.5f, in_memory);
  std::vector<double> a(kN), b(kN), stale(kN);
  backend->download(a.data(), expected);
  backend->download(b.data(), y);
  EXPECT_EQ(a, b);
  backend->dropout_forward(y, x, kN, 0.5f, DropoutKey{77, 1, 0, 3, nullptr});
  backend->download(stale.data(), y);
  EXPECT_NE(stale, b) << "the fields' step 1 draws other masks";
  // The same in attention: AttentionShape::dropout_key.
  AttentionShape shape;
  shape.batch = 1;
  shape.heads = 1;
  shape.query_len = shape.key_len = 8;
  shape.d_k = shape.d_v = 8;
  shape.dropout = 0.5f;
  shape.dropout_key = in_memory;
  Tensor out = backend->alloc(DType::F64, 64), out_fields = backend->alloc(DType::F64, 64);
  Tensor saved = backend->alloc(DType::F64, Backend::attention_saved_numel(shape));
  backend->attention_forward(out, saved, x, 8, x, 8, x, 8, shape);
  shape.dropout_key = fields;
  backend->attention_forward(out_fields, saved, x, 8, x, 8, x, 8, shape);
  std::vector<double> by_memory(64), by_fields(64);
  backend->download(by_memory.data(), out);
  backend->download(by_fields.data(), out_fields);
  EXPECT_EQ(by_memory, by_fields);
  for (Tensor* t : {&x, &y, &expected, &out, &out_fields, &saved}) backend->free(*t);
}

// Decoding steps captured (Transformer::decode_step): a beam search of 4 over five
// sentences, twice (the second search replays the first's captures where its shapes
// repeat), through the stand-in and without it: the same hypotheses with the same scores,
// bit for bit. Each step reads its position from the plan's upload in memory (a replay
// keyed by its capture's position would embed the wrong one), and the arena is put back
// where the captured step left it for the best tokens that follow.
ModelConfig decoding_model() {
  ModelConfig c;
  c.layers = 2;
  c.d_model = 16;
  c.d_ff = 32;
  c.heads = 4;
  c.max_positions = 32;
  return c;
}

TEST(CapturedDecodingSteps, BeamSearchEqualsUncapturedSearchBitForBit) {
  const ModelConfig c = decoding_model();
  auto plain_backend = make_cpu_backend(DType::F32);
  auto inner = make_cpu_backend(DType::F32);
  CapturingBackend capturing(*inner);
  Transformer::CaptureCounts plain_counts, captured_counts;
  const auto plain = test::run_two_beam_searches(*plain_backend, c, plain_counts);
  const auto captured = test::run_two_beam_searches(capturing, c, captured_counts);
  test::expect_same_hypotheses(captured, plain);
  EXPECT_GT(captured_counts.captures, 0);
  EXPECT_GT(captured_counts.replays, captured_counts.captures);
  EXPECT_EQ(captured_counts.refused, 0) << capturing.last_refusal();
  EXPECT_EQ(plain_counts.replays, 0);
}

// Int8 decoding steps captured: with the stand-in around the int8 backend, as a GPU's graph
// holds Int8CudaBackend's products (stream work of its inner backend), a step's int8
// products are recorded and replayed with its other ops, and the search equals the int8
// search uncaptured, bit for bit. The CPU's int8 backend itself refuses to capture: its
// products run on the host when called, so a recording by the backend beneath it would
// replay steps without them; over the stand-in it decodes uncaptured, the same again.
TEST(CapturedDecodingSteps, Int8ProductsAreCapturedWithTheirStep) {
  if (!cpu::int8_available()) GTEST_SKIP() << "no int8 products: " << cpu::int8_description();
  const ModelConfig c = decoding_model();
  const auto quantized_on = [](Backend& int8) {
    return [&int8](Transformer& model) {
      EXPECT_GT(quantize_model_weights(model, int8).quantized, 0);
    };
  };
  Int8CpuBackend plain(make_cpu_backend(DType::F32));
  Int8CpuBackend recorded(make_cpu_backend(DType::F32));
  CapturingBackend capturing(recorded);
  Transformer::CaptureCounts plain_counts, captured_counts, beneath_counts;
  const auto expected = test::run_two_beam_searches(plain, c, plain_counts, quantized_on(plain));
  const auto captured =
      test::run_two_beam_searches(capturing, c, captured_counts, quantized_on(recorded));
  test::expect_same_hypotheses(captured, expected);
  EXPECT_GT(captured_counts.captures, 0);
  EXPECT_GT(captured_counts.replays, captured_counts.captures);
  EXPECT_EQ(captured_counts.refused, 0) << capturing.last_refusal();

  auto float_backend = make_cpu_backend(DType::F32);
  auto stand_in = std::make_unique<CapturingBackend>(*float_backend);
  const CapturingBackend& beneath = *stand_in;
  Int8CpuBackend above(std::move(stand_in));
  const auto uncaptured =
      test::run_two_beam_searches(above, c, beneath_counts, quantized_on(above));
  test::expect_same_hypotheses(uncaptured, expected);
  EXPECT_EQ(beneath_counts.captures, 0);
  EXPECT_EQ(beneath.captures(), 0);
}

// Every weight matrix quantize_model_weights keeps in int8 is one that decoding multiplies
// in int8. A product op Int8ProductsBackend does not override (a new activation's fused
// linear_gelu_forward, say) passes its weights on to the float path, silently: int8
// decoding would be partly float with every other test passing (a helper's trial added
// GELU to the FFN so, 2026-12-06). Each way a model's sub-layers choose their ops.
TEST(CapturedDecodingSteps, EveryQuantizedMatrixIsMultipliedInInt8) {
  if (!cpu::int8_available()) GTEST_SKIP() << "no int8 products: " << cpu::int8_description();
  for (const char* fused_ops : {"on", "off"}) {
    for (const char* norm : {"post", "pre"}) {
      for (const bool attention_bias : {false, true}) {
        ModelConfig c = decoding_model();
        c.fused_ops = fused_ops;
        c.norm = norm;
        c.attention_bias = attention_bias;
        SCOPED_TRACE(std::string("fused_ops ") + fused_ops + ", norm " + norm +
                     ", attention_bias " + (attention_bias ? "true" : "false"));
        Int8CpuBackend int8(make_cpu_backend(DType::F32));
        Transformer::CaptureCounts counts;
        int quantized = 0;
        test::run_two_beam_searches(int8, c, counts, [&](Transformer& model) {
          quantized = quantize_model_weights(model, int8).quantized;
        });
        EXPECT_GT(quantized, 0);
        EXPECT_EQ(int8.quantized_matrices(), quantized);
        EXPECT_EQ(int8.matrices_multiplied(), int8.quantized_matrices())
            << "a weight matrix quantized for int8 decoding was multiplied in float";
      }
    }
  }
}

// The step padding of captured decoding (padded_step_rows): buckets of 1, 2, 3, 4, 6, 8,
// 12, 16, 24, ... sentences.
TEST(StepPadding, BucketsArePowersOfTwoAndThreeTimesThem) {
  const std::vector<int> expected = {1, 1, 2, 3, 4, 6, 6, 8, 8, 12, 12, 12, 12, 16};
  for (int count = 0; count < static_cast<int>(expected.size()); ++count) {
    EXPECT_EQ(step_bucket(count), expected[count]) << count;
  }
  EXPECT_EQ(step_bucket(17), 24);
  EXPECT_EQ(step_bucket(25), 32);
  EXPECT_EQ(step_bucket(33), 48);
}

// A step whose five unfinished sentences (two rows each) round up to six: the padding
// takes the first finished sentence that had rows in the previous step and gives it two
// rows (the step's fullest sentence's count), continuing its previous rows in turn (one
// row there: twice the same). With five sentences left of five, or four (a bucket of its
// own), nothing is added.
TEST(StepPadding, AFinishedSentenceFillsTheBucketWithoutGrowingASentence) {
  std::vector<int> padded, scratch;
  // The previous step: sentences 0..6, two rows each but sentence 4's one.
  const std::vector<int> previous = {0, 0, 1, 1, 2, 2, 3, 3, 4, 5, 5, 6, 6};
  const std::vector<int> parent = {0, 1, 2, 2, 4, 5, 6, 7, 11, 12};
  const std::vector<int> source_of = {0, 0, 1, 1, 2, 2, 3, 3, 6, 6};
  padded_step_rows(parent, source_of, previous, padded, scratch);
  std::vector<int> expected = parent;
  expected.insert(expected.end(), {8, 8});  // sentence 4's row, twice
  EXPECT_EQ(padded, expected);

  // Sentence 4 gone from the previous step too: sentence 5 (rows 8 and 9 there).
  const std::vector<int> previous_without_4 = {0, 0, 1, 1, 2, 2, 3, 3, 5, 5, 6, 6};
  const std::vector<int> parent_without_4 = {0, 1, 2, 2, 4, 5, 6, 7, 10, 11};
  padded_step_rows(parent_without_4, source_of, previous_without_4, padded, scratch);
  expected = parent_without_4;
  expected.insert(expected.end(), {8, 9});
  EXPECT_EQ(padded, expected);

  // Five sentences in the previous step, five unfinished: the bucket of 6 has no sixth.
  const std::vector<int> five = {0, 0, 1, 1, 2, 2, 3, 3, 4, 4};
  padded_step_rows({0, 1, 2, 3, 4, 5, 6, 7, 8, 9}, {0, 0, 1, 1, 2, 2, 3, 3, 4, 4}, five, padded,
                   scratch);
  EXPECT_EQ(padded.size(), 10u);
  padded_step_rows({0, 1, 2, 3, 4, 5, 6, 7}, {0, 0, 1, 1, 2, 2, 3, 3}, five, padded, scratch);
  EXPECT_EQ(padded.size(), 8u);  // four: a bucket
}

// Twelve sentences of lengths 1..12 searched twice, captured and not: the hypotheses
// are the unpadded, uncaptured search's, their tokens equal and their scores within
// rounding, whether the steps rank their best tokens on the backend (step_best) or hand
// whole rows to a filter (step). (Not bit for bit: a padded step multiplies more rows,
// and a BLAS may round a row by the product's row count: with OPENBLAS_CORETYPE=Haswell
// the last bit of a score moves; without it, none does.) With a filter
// that never allows eos, every sentence runs to its own length limit (3..14), so the
// hypothesis count falls by a beam at each step of the tail: unpadded, the two searches
// capture 13 shapes and replay them 15 times in all (measured); padded to the buckets,
// position 0 and 12, 8, 6, 4, 3, 2 and 1 sentences: 8 shapes, replayed 20 times. (The
// caches' pool grows at the first step of a new width, DecoderState::append_step_rows,
// before any capture at it: a later growth freed memory and re-captured 3 shapes.)
TEST(CapturedDecodingSteps, PaddedStepsTranslateAsUnpaddedInFewShapes) {
  const ModelConfig c = decoding_model();
  const test::NoEosFilter no_eos(12);
  for (const NextTokenFilter* filter : {static_cast<const NextTokenFilter*>(nullptr),
                                        static_cast<const NextTokenFilter*>(&no_eos)}) {
    SCOPED_TRACE(filter == nullptr ? "best tokens ranked on the backend" : "a filter, no eos");
    auto plain_backend = make_cpu_backend(DType::F32);
    auto inner = make_cpu_backend(DType::F32);
    CapturingBackend capturing(*inner);
    Transformer::CaptureCounts plain_counts, captured_counts;
    const auto plain =
        test::run_two_searches_ending_apart(*plain_backend, c, filter, plain_counts);
    const auto captured =
        test::run_two_searches_ending_apart(capturing, c, filter, captured_counts);
    // A score is a sum of at most 14 float log-probabilities, each within a few float
    // ulp (~1e-6 here) of the unpadded one: 1e-5 absolute, and 1e-6 of the score.
    test::expect_same_hypotheses_near(captured, plain, 1e-6);
    EXPECT_GT(captured_counts.captures, 0);
    EXPECT_LE(captured_counts.captures, 8);
    EXPECT_EQ(captured_counts.refused, 0) << capturing.last_refusal();
    if (filter != nullptr) {
      for (size_t s = 0; s < 12; ++s) {  // each ran to its limit: length + 2 tokens
        EXPECT_EQ(captured[s][0].tokens.size(), s + 3) << "sentence " << s;
      }
      EXPECT_GE(captured_counts.replays, 2 * captured_counts.captures);
      EXPECT_GE(captured_counts.replays - captured_counts.captures, 6);  // 12; unpadded 2
    }
  }
}

// Two batches of four sentences, lengths 9..12 and 10..13 (padded source lengths 13
// and 14, both in the bucket of 16; the caches' length, 32, in its own), searched in turn
// twice each: the second batch's steps have the first's shapes and replay its graphs,
// so the four searches capture no more than one batch's shapes (position 0, then 4, 3,
// 2 and 1 sentences of four hypotheses: 5; without the buckets 11, each batch its own),
// and each search finds the hypotheses the uncaptured one finds.
TEST(CapturedDecodingSteps, BatchesOfNearbyLengthsReplayEachOthersSteps) {
  const ModelConfig c = decoding_model();
  const test::NoEosFilter no_eos(12);
  std::vector<TokenSequence> first, second;
  for (int length = 9; length <= 12; ++length) {
    first.push_back(TokenSequence(static_cast<size_t>(length), 5));
    second.push_back(TokenSequence(static_cast<size_t>(length + 1), 6));
  }
  BeamOptions options;
  options.beam = 4;
  options.max_len_b = 2;  // limits |x| + 2: in each batch one sentence ends a step
  options.max_len_cap = c.max_positions - 1;
  options.filter = &no_eos;
  const auto four_searches = [&](Backend& backend, Transformer::CaptureCounts& counts) {
    Transformer model(c, 12, SpecialIds{}, backend, 5);
    CachedTransformerScorer scorer(model, SpecialIds{}, c.max_positions - 1);
    std::vector<std::vector<Hypothesis>> results;
    for (const auto* sources : {&first, &second, &first, &second}) {
      const auto found = beam_search(scorer, *sources, SpecialIds{}, options);
      results.insert(results.end(), found.begin(), found.end());
    }
    counts = model.capture_counts();
    return results;
  };
  auto plain_backend = make_cpu_backend(DType::F32);
  auto inner = make_cpu_backend(DType::F32);
  CapturingBackend capturing(*inner);
  Transformer::CaptureCounts plain_counts, captured_counts;
  const auto plain = four_searches(*plain_backend, plain_counts);
  const auto captured = four_searches(capturing, captured_counts);
  test::expect_same_hypotheses_near(captured, plain, 1e-6);
  EXPECT_GT(captured_counts.captures, 0);
  EXPECT_LE(captured_counts.captures, 5);
  EXPECT_EQ(captured_counts.refused, 0) << capturing.last_refusal();
}

// Where steps are captured, a step's best tokens are ranked inside its graph and read back
// with their values in one download (Transformer::decode_step_best_tokens): the device
// waits for the host once a step, where the uncaptured step downloads the values and the
// tokens apart. Counted by a backend beneath the stand-in over the same two searches: half
// the downloads, and the same hypotheses bit for bit.
class CountingDownloads final : public ForwardingBackend {
 public:
  using ForwardingBackend::ForwardingBackend;
  void download(void* host, Tensor src) override {
    ++downloads;
    inner().download(host, src);
  }
  void download_ids(int32_t* host, const int32_t* src, int64_t count) override {
    ++downloads;
    inner().download_ids(host, src, count);
  }
  int downloads = 0;
};

TEST(CapturedDecodingSteps, ACapturedStepReadsItsBestTokensBackInOneDownload) {
  const ModelConfig c = decoding_model();
  auto plain_cpu = make_cpu_backend(DType::F32);
  auto captured_cpu = make_cpu_backend(DType::F32);
  CountingDownloads plain(*plain_cpu), beneath(*captured_cpu);
  CapturingBackend capturing(beneath);
  Transformer::CaptureCounts plain_counts, captured_counts;
  const auto expected = test::run_two_beam_searches(plain, c, plain_counts);
  const auto captured = test::run_two_beam_searches(capturing, c, captured_counts);
  test::expect_same_hypotheses(captured, expected);
  EXPECT_GT(captured_counts.replays, captured_counts.captures);
  EXPECT_GT(beneath.downloads, 0);
  EXPECT_EQ(plain.downloads, 2 * beneath.downloads);
}

// A GPU's bf16 rows of log-probabilities, downloaded at each decoding step as fp32
// (Transformer::decode_step_log_probs, the path of a search with a filter), are widened
// in a buffer kept from step to step: widening through a tensor allocated and freed each
// time made every captured graph stale, so that on an H200 each bf16 step was captured
// again and none replayed (CudaCapturedDecoding.PaddedStepsTrackUnpaddedInFewShapes, then
// a CudaCandidateStepGraphs test, 2026-12-04). The CPU holds no bf16, so a stand-in
// widens the test's bf16 rows itself.
class WideningBackend : public ForwardingBackend {
 public:
  using ForwardingBackend::ForwardingBackend;
  void free(Tensor& tensor) override {
    ++frees;
    ForwardingBackend::free(tensor);
  }
  void copy(Tensor dst, Tensor src) override {
    if (src.dtype != DType::BF16) return ForwardingBackend::copy(dst, src);
    ASSERT_EQ(dst.dtype, DType::F32);
    ASSERT_EQ(dst.numel, src.numel);
    const auto* from = static_cast<const uint16_t*>(src.data);
    std::vector<float> wide(static_cast<size_t>(src.numel));
    for (size_t i = 0; i < wide.size(); ++i) {
      const uint32_t bits = uint32_t(from[i]) << 16;  // a bf16 is an fp32's top half
      std::memcpy(&wide[i], &bits, sizeof(float));
    }
    upload(dst, wide.data());
  }
  int frees = 0;
};

TEST(CapturedDecodingSteps, Bf16RowsAreWidenedForTheirDownloadWithoutAFreeAStep) {
  auto cpu = make_cpu_backend(DType::F32);
  WideningBackend backend(*cpu);
  // Rows of 7 bf16 values, random and never zero: bf16 of 0.37 * (i + 1) * (-1)^i.
  std::vector<uint16_t> bf16(5 * 7);
  std::vector<float> exact(bf16.size());
  for (size_t i = 0; i < bf16.size(); ++i) {
    const float value = 0.37f * float(i + 1) * (i % 2 ? -1.0f : 1.0f);
    uint32_t bits = 0;
    std::memcpy(&bits, &value, sizeof(float));
    bf16[i] = uint16_t(bits >> 16);  // truncated: the test needs a bf16, not its rounding
    bits = uint32_t(bf16[i]) << 16;
    std::memcpy(&exact[i], &bits, sizeof(float));
  }
  const Tensor rows{bf16.data(), DType::BF16, int64_t(bf16.size())};
  Tensor widened;
  std::vector<float> got;
  // A search's steps: 5, then 3 and 4 rows as hypotheses finish; then 5 again.
  for (const int count : {5, 3, 4, 5}) {
    model_detail::download_as_f32(backend, rows, int64_t(count) * 7, got, &widened);
    ASSERT_EQ(got.size(), size_t(count) * 7);
    for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i], exact[i]) << "element " << i;
  }
  EXPECT_EQ(backend.frees, 0) << "a download freed memory: each would make the graphs stale";
  EXPECT_THROW(model_detail::download_as_f32(backend, rows, 7, got, nullptr), Error);
  backend.free(widened);
}

// Decoding workers that capture at once (worker_graphs): another thread's free, which on a
// GPU synchronises the device and so would invalidate a capture under way, waits for the
// capture's end (kernels/capture_free_lock.h); the capturing thread's own free is kept for
// its scope's end (waiting, it would never return), and no free waits while no capture
// holds a scope (one worker, the trainer).
TEST(ConcurrentCaptures, AnotherThreadsFreeWaitsForTheCaptureAndItsOwnForItsEnd) {
  using namespace std::chrono_literals;
  use_capture_free_lock();  // as a Context made with worker_graphs does
  std::promise<void> opened, release;
  std::shared_future<void> released = release.get_future().share();
  std::atomic<bool> own_free_done{false}, own_free_kept{false}, kept_free_ran{false};
  std::thread capturing([&] {
    {
      const ConcurrentCaptureScope scope(/*active=*/true);
      EXPECT_TRUE(inside_concurrent_capture());
      { const FreeGate own; }  // returns: the capturing thread's own gate
      own_free_done = true;
      // Its own free is kept for the scope's end: run now, it would synchronise the
      // device under the other threads' captures too.
      own_free_kept = defer_free_while_capturing([&] { kept_free_ran = true; });
      EXPECT_FALSE(kept_free_ran);
      opened.set_value();
      released.wait_for(10s);
    }
    EXPECT_TRUE(kept_free_ran);  // at the scope's end
  });
  opened.get_future().wait();
  EXPECT_TRUE(own_free_done);
  EXPECT_TRUE(own_free_kept);
  EXPECT_FALSE(defer_free_while_capturing([] {})) << "kept on a thread that holds no scope";
  EXPECT_FALSE(inside_concurrent_capture());
  std::atomic<bool> freed{false};
  std::thread freeing([&] {
    const FreeGate gate;
    freed = true;
  });
  std::this_thread::sleep_for(200ms);
  EXPECT_FALSE(freed) << "a free ran while another thread's capture was under way";
  release.set_value();
  capturing.join();
  freeing.join();
  EXPECT_TRUE(freed);
  // A scope not active holds nothing: a free elsewhere goes at once.
  std::promise<void> inactive_opened, inactive_release;
  std::shared_future<void> inactive_released = inactive_release.get_future().share();
  std::thread not_concurrent([&] {
    const ConcurrentCaptureScope scope(/*active=*/false);
    EXPECT_FALSE(inside_concurrent_capture());
    inactive_opened.set_value();
    inactive_released.wait_for(10s);
  });
  inactive_opened.get_future().wait();
  auto free_done = std::async(std::launch::async, [] { const FreeGate gate; });
  EXPECT_EQ(free_done.wait_for(5s), std::future_status::ready);
  inactive_release.set_value();
  not_concurrent.join();
}

}  // namespace
}  // namespace thpc
