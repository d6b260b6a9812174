// The op profile of transformer_bench_step --profile (kernels/profiling_backend.h): a
// training step on a ProfilingBackend over the CPU backend computes what it computes
// without it, its rows add up to the step as the host measured it, every op class the
// model calls has its row, and the GEMM rows count the model's matrix-product FLOPs.
#include <gtest/gtest.h>

#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "data/batch.h"
#include "kernels/capturing_backend.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/profiling_backend.h"
#include "model/transformer.h"
#include "program.h"
#include "train/optimizer.h"

namespace thpc {
namespace {

ModelConfig profiled_model() {
  ModelConfig c;
  c.layers = 2;
  c.d_model = 32;
  c.d_ff = 64;
  c.heads = 4;
  c.dropout = 0.1f;
  c.max_positions = 32;
  return c;
}
constexpr int kVocab = 50;

Batch profiled_batch() {
  // Source length 7, target length 5 (padding on both sides).
  const std::vector<TokenSequence> sources = {{4, 5, 6, 7, 8, 9}, {10, 11}, {12, 13, 14}};
  const std::vector<TokenSequence> targets = {{5, 6, 7}, {8, 9, 10, 11}, {12}};
  return make_batch(sources, targets, SpecialIds{});
}

// The losses of `steps` training steps (forward, loss, backward, Adam) on `ops`; with a
// profiler, each step between its begin_step() and end_step(), whose host wall time
// is added to *wall.
std::vector<double> train(Backend& ops, int steps, ProfilingBackend* profiler = nullptr,
                          double* wall = nullptr) {
  Transformer model(profiled_model(), kVocab, SpecialIds{}, ops, 11);
  Adam adam(model.params(), ops, AdamSettings{});
  const Batch batch = profiled_batch();
  std::vector<double> losses;
  for (int step = 1; step <= steps; ++step) {
    const auto start = std::chrono::steady_clock::now();
    if (profiler != nullptr && step > 1) profiler->begin_step();  // step 1: warm-up
    ops.zero(model.params().grads());
    DropoutContext dropout;
    dropout.seed = 3;
    dropout.step = static_cast<uint32_t>(step);
    const LossSums sums = model.train_step(batch, 1.0f / batch.tgt_tokens(), dropout);
    adam.update(1e-3f, step);
    if (profiler != nullptr && step > 1) {
      profiler->end_step();
      *wall += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    }
    losses.push_back(sums.loss);
  }
  return losses;
}

// The forward matrix products of one step on profiled_batch(), by hand: per layer the
// encoder's Q|K|V, W^O and FFN, the decoder's Q|K|V, W^O, cross Q, cross K|V, cross W^O
// and FFN, then the output projection; 2 * M * K * N each.
double forward_gemm_flops(const ModelConfig& c, int src_rows, int tgt_rows) {
  const double d = c.d_model, f = c.d_ff, s = src_rows, t = tgt_rows;
  const double encoder = s * (3 * d * d + d * d + 2 * d * f);
  const double decoder = t * (3 * d * d + d * d + d * d + d * d + 2 * d * f) + s * 2 * d * d;
  return 2.0 * (c.layers * (encoder + decoder) + t * d * kVocab);
}

// Each name a profile's calls go by, with its class: the op list's ops, the memory
// calls and a captured pass's replay.
std::map<std::string, OpClass> op_classes_by_name() {
  std::map<std::string, OpClass> classes;
#define THPC_OP(ret, name, params, args) classes[#name] = op_class(OpId::name);
#include "kernels/op_list.h"
#undef THPC_OP
  for (const char* memory : {"zero", "copy", "upload", "download", "upload_ids", "download_ids"}) {
    classes[memory] = OpClass::Memory;
  }
  classes["captured_pass"] = OpClass::Captured;
  return classes;
}

TEST(Profile, RowsAddUpToTheStepAndNameEveryClassTheModelCalls) {
  auto cpu = make_cpu_backend(DType::F32);
  const std::vector<double> plain = train(*cpu, 4);

  ProfilingBackend profiler(*cpu);
  double wall = 0.0;
  const std::vector<double> profiled = train(profiler, 4, &profiler, &wall);
  // The profiler only passes calls on: the same losses, bit for bit.
  EXPECT_EQ(profiled, plain);

  const OpProfile profile = profiler.collect();
  EXPECT_EQ(profile.steps, 3);
  // The rows add up to the step's span by construction; what is checked is that the span
  // is the step the host measured (within 2% and 0.5 ms per step: the clock reads and
  // this loop's own statements lie between the two), that no op's time overlaps
  // another's (the host time between them is not negative), and that the ops are most
  // of the step (the model's host code between ops is small on the CPU).
  EXPECT_NEAR(profile.span_seconds, wall, 0.02 * wall + 0.5e-3 * profile.steps);
  EXPECT_GE(profile.host_seconds(), 0.0);
  EXPECT_LT(profile.host_seconds(), 0.5 * profile.span_seconds);
  double sum = profile.host_seconds();
  for (const OpProfile::Row& row : profile.rows) sum += row.seconds;
  EXPECT_NEAR(sum, profile.span_seconds, 1e-12 * profile.steps);

  // Every class a training step calls, with its calls per step: the two stacks'
  // layers (2 each) and the loss.
  const auto row = [&](OpClass c) { return profile.rows[static_cast<int>(c)]; };
  for (OpClass c : {OpClass::GemmForward, OpClass::GemmBackward, OpClass::Attention,
                    OpClass::AddNorm, OpClass::BiasRelu, OpClass::CrossEntropy,
                    OpClass::Embedding, OpClass::Adam, OpClass::Memory}) {
    SCOPED_TRACE(op_class_label(c));
    EXPECT_GT(row(c).calls, 0);
    EXPECT_GE(row(c).seconds, 0.0);
  }
  EXPECT_EQ(row(OpClass::Adam).calls, 3);
  EXPECT_EQ(row(OpClass::CrossEntropy).calls, 3);
  // Self-attention in every layer of both stacks, cross-attention in the decoder's:
  // 6 forward and 6 backward per step.
  EXPECT_EQ(row(OpClass::Attention).calls, 3 * 12);
  EXPECT_EQ(row(OpClass::Decoding).calls, 0);

  // FLOPs: the forward GEMMs exactly as counted by hand; backward twice the forward
  // (dx and dW for each product; the embedding's products have no dx to skip).
  const Batch batch = profiled_batch();
  const double forward =
      forward_gemm_flops(profiled_model(), batch.size * batch.src_len, batch.size * batch.tgt_len);
  EXPECT_DOUBLE_EQ(row(OpClass::GemmForward).flops, 3 * forward);
  EXPECT_DOUBLE_EQ(row(OpClass::GemmBackward).flops, 3 * 2 * forward);
  EXPECT_GT(row(OpClass::Attention).flops, 0.0);

  const std::string table = format_profile(profile, cpu->name(), 0.1);
  for (const char* line : {"GEMM forward", "residual+dropout+layer norm", "bias+ReLU",
                           "host time between kernels", "total (the step)",
                           "of the measured ceiling"}) {
    EXPECT_NE(table.find(line), std::string::npos) << line << " missing from\n" << table;
  }
  EXPECT_EQ(table.find("decoding"), std::string::npos) << "a class never called is not a row";

  // The same calls by op: each class's ops add up to its row (attention's forward and
  // backward, 6 each a step), and the table lists every op once, the longest first.
  std::array<OpProfile::Row, kOpClassCount> by_class{};
  const std::map<std::string, OpClass> classes = op_classes_by_name();
  for (const auto& [op, op_row] : profile.ops) {
    const auto named = classes.find(op);
    ASSERT_NE(named, classes.end()) << "an op of no known class: " << op;
    OpProfile::Row& class_sum = by_class[static_cast<int>(named->second)];
    class_sum.seconds += op_row.seconds;
    class_sum.calls += op_row.calls;
    class_sum.flops += op_row.flops;
  }
  for (int c = 0; c < kOpClassCount; ++c) {
    SCOPED_TRACE(op_class_label(static_cast<OpClass>(c)));
    EXPECT_EQ(by_class[c].calls, profile.rows[c].calls);
    EXPECT_NEAR(by_class[c].seconds, profile.rows[c].seconds, 1e-12 * profile.steps);
    EXPECT_DOUBLE_EQ(by_class[c].flops, profile.rows[c].flops);
  }
  EXPECT_EQ(profile.ops.at("attention_forward").calls, 3 * 6);
  EXPECT_EQ(profile.ops.at("attention_backward").calls, 3 * 6);
  double previous_ms = 1e30;
  size_t listed = 0;
  for (size_t at = table.find("by op: "); at != std::string::npos;
       at = table.find("by op: ", at + 1)) {
    char name[64] = {0};
    double ms = 0.0;
    if (std::sscanf(table.c_str() + at, "by op: %63s %lf", name, &ms) != 2) continue;  // header
    EXPECT_EQ(profile.ops.count(name), 1u) << name;
    EXPECT_LE(ms, previous_ms) << name << " listed after a shorter op";
    previous_ms = ms;
    ++listed;
  }
  EXPECT_EQ(listed, profile.ops.size()) << table;
}

// A batch's ids and lengths reach the backend in one upload: on a GPU each upload is a
// copy and a wait, and the five of the step (source, its lengths, target in and out,
// their lengths) were five of the six synchronisations that left an H200 idle 0.41 ms a
// step at 3,125 tokens (bench/RESULTS.md, 2026-11-28). The step's results are unchanged
// (the golden and resume pins hold them).
TEST(Profile, ATrainingStepUploadsItsBatchOnce) {
  class CountingUploads final : public ProfilingBackend {
   public:
    using ProfilingBackend::ProfilingBackend;
    void upload_ids(int32_t* dst, const int32_t* host, int64_t count) override {
      ++uploads;
      ProfilingBackend::upload_ids(dst, host, count);
    }
    int uploads = 0;
  };
  auto cpu = make_cpu_backend(DType::F32);
  CountingUploads counting(*cpu);
  Transformer model(profiled_model(), kVocab, SpecialIds{}, counting, 11);
  const Batch batch = profiled_batch();
  counting.uploads = 0;
  DropoutContext dropout;
  dropout.seed = 3;
  dropout.step = 1;
  model.train_step(batch, 1.0f / batch.tgt_tokens(), dropout);
  EXPECT_EQ(counting.uploads, 1);
  counting.uploads = 0;
  model.evaluate(batch);
  EXPECT_EQ(counting.uploads, 1);
}

// transformer_bench_step --profile also breaks the steps down by bucket length (a kernel
// that pays at one length and not at another shows there): one line per length of its
// nine, each step's total at least its attention and GEMMs, the attention its forward and
// backward (each called), and the lengths' totals averaging to the table's per-step total
// (each length has the same number of steps).
TEST(Profile, BenchStepBreaksTheStepsDownByBucketLength) {
  const ProcessResult run = run_process(
      thpc::binary_dir() + "/transformer_bench_step --config " + THPC_SOURCE_DIR +
      "/input/tiny.ini --set model.max_positions=128 --tokens 300 --steps 18 "
      "--warmup-steps 2 --vocab 64 --profile");
  ASSERT_EQ(run.exit_code, 0) << run.output;
  std::istringstream lines(run.output);
  std::string line;
  std::vector<int> lengths;
  double sum_of_steps = 0.0, table_step = -1.0;
  while (std::getline(lines, line)) {
    int length = 0;
    double step = 0, attention = 0, gemms = 0, forward = 0, backward = 0;
    if (std::sscanf(line.c_str(), "by bucket length: %d %lf %lf %lf %lf %lf", &length, &step,
                    &attention, &gemms, &forward, &backward) == 6) {
      lengths.push_back(length);
      sum_of_steps += step;
      EXPECT_GT(attention, 0.0) << line;
      EXPECT_GE(step, attention + gemms) << line;
      EXPECT_GT(forward, 0.0) << line;
      EXPECT_GT(backward, 0.0) << line;
      // Each printed to 0.001 ms: the three roundings apart at most.
      EXPECT_NEAR(forward + backward, attention, 0.0015) << line;
    }
    double total = 0;
    if (std::sscanf(line.c_str(), "total (the step) %lf", &total) == 1) table_step = total;
  }
  EXPECT_EQ(lengths, (std::vector<int>{12, 18, 24, 28, 32, 40, 48, 64, 96})) << run.output;
  ASSERT_GT(table_step, 0.0) << run.output;
  EXPECT_NEAR(sum_of_steps / 9.0, table_step, 0.01 * table_step + 0.01) << run.output;
}

// transformer_bench_step's JSON line gives each whole round of its nine lengths in the
// warm-up, the mean ms a step (the first: every shape's first pass; with step_graphs the
// second: every shape's capture), what a capture costs against a replay: 20 warm-up
// steps are two rounds and two steps, 8 none.
TEST(Profile, BenchStepTimesEachWarmUpRoundOfTheLengths) {
  const auto rounds_of = [](int warmup) {
    const ProcessResult run = run_process(
        thpc::binary_dir() + "/transformer_bench_step --config " + THPC_SOURCE_DIR +
        "/input/tiny.ini --set model.max_positions=128 --tokens 300 --steps 2 "
        "--warmup-steps " + std::to_string(warmup) + " --vocab 64");
    EXPECT_EQ(run.exit_code, 0) << run.output;
    const size_t at = run.output.find("\"warmup_rounds_ms\": [");
    EXPECT_NE(at, std::string::npos) << run.output;
    std::vector<double> rounds;
    if (at == std::string::npos) return rounds;
    std::istringstream values(run.output.substr(at + 21, run.output.find(']', at) - at - 21));
    for (std::string value; std::getline(values, value, ',');) rounds.push_back(std::stod(value));
    return rounds;
  };
  const std::vector<double> two = rounds_of(20);
  ASSERT_EQ(two.size(), 2u);
  EXPECT_GT(two[0], 0.0);
  EXPECT_GT(two[1], 0.0);
  EXPECT_TRUE(rounds_of(8).empty());
}

// Steps in the trainer's form (the loss into the step's totals, the step inputs written
// before the pass), each step between the profiler's begin_step() and end_step() from
// step 2 on: through a backend that captures, step 1 runs the pass uncaptured, step 2
// captures and replays it, the later ones replay it.
OpProfile profile_of_trainer_steps(ProfilingBackend& profiler, int steps) {
  Transformer model(profiled_model(), kVocab, SpecialIds{}, profiler, 11);
  StepTotalsBuffer totals(profiler);
  StepInputsBuffer inputs(profiler);
  const Batch batch = profiled_batch();
  for (int step = 1; step <= steps; ++step) {
    if (step > 1) profiler.begin_step();
    profiler.zero(model.params().grads());
    totals.zero();
    DropoutContext dropout;
    dropout.seed = 3;
    dropout.step = static_cast<uint32_t>(step);
    inputs.set(step_inputs_for(dropout, 1.0f / static_cast<float>(batch.tgt_tokens())));
    model.train_step(batch, dropout, inputs.in_backend(), totals.tensor());
    totals.read(kVocab);
    if (step > 1) profiler.end_step();
  }
  return profiler.collect();
}

// A captured pass (Backend::capture; on the CPU the stand-in of tests) is timed as one
// call a replay, in the row "captured passes", with the matrix FLOPs of the ops it holds:
// the profile of four replayed steps has that row's four calls and the FLOPs the same
// steps' ops have uncaptured, and no GEMM of its own; the rows still add up to the step.
TEST(Profile, ACapturedPassIsOneCallWithItsOpsFlops) {
  auto cpu = make_cpu_backend(DType::F32);
  ProfilingBackend plain(*cpu);
  const OpProfile uncaptured = profile_of_trainer_steps(plain, 5);
  auto inner = make_cpu_backend(DType::F32);
  CapturingBackend capturing(*inner);
  ProfilingBackend profiler(capturing);
  const OpProfile captured = profile_of_trainer_steps(profiler, 5);
  const auto row = [](const OpProfile& p, OpClass c) { return p.rows[static_cast<int>(c)]; };
  EXPECT_EQ(row(uncaptured, OpClass::Captured).calls, 0);
  EXPECT_EQ(row(captured, OpClass::Captured).calls, 4);
  EXPECT_EQ(row(captured, OpClass::GemmForward).calls, 0);
  EXPECT_EQ(row(captured, OpClass::Attention).calls, 0);
  double pass_flops = 0.0;
  for (OpClass c : {OpClass::GemmForward, OpClass::GemmBackward, OpClass::Attention}) {
    pass_flops += row(uncaptured, c).flops;
  }
  EXPECT_GT(pass_flops, 0.0);
  EXPECT_DOUBLE_EQ(row(captured, OpClass::Captured).flops, pass_flops);
  double sum = captured.host_seconds();
  for (const OpProfile::Row& r : captured.rows) sum += r.seconds;
  EXPECT_NEAR(sum, captured.span_seconds, 1e-12 * captured.steps);
  EXPECT_GE(captured.host_seconds(), 0.0);
  EXPECT_NE(format_profile(captured, cpu->name(), 0.1).find("captured passes (CUDA graphs)"),
            std::string::npos);
}

// The device's idle time (OpProfile::idle_seconds): the steps' union less the union of
// the time ops were in flight, overlaps counted once. Two workers' profiles by hand, on
// one time line: worker A's batch [0, 10] s with ops in flight [0, 4] and [6, 10];
// worker B's batch [1, 9] with ops [4.5, 5.5]. A's own stream waited 2 s, B's 7 s; the
// device had no op in flight for 1 s, [4, 4.5] and [5.5, 6], of the 10 in which either
// worker was inside a batch.
TEST(Profile, WorkersSharingADeviceLeaveItIdleOnlyWhenNoneHasAnOpInFlight) {
  EXPECT_DOUBLE_EQ(union_length({}), 0.0);
  EXPECT_DOUBLE_EQ(union_length({{3, 4}, {0, 1}, {0.5, 2}, {3.5, 3.6}}), 3.0);
  EXPECT_DOUBLE_EQ(union_length({{0, 1}, {1, 2}}), 2.0);  // touching: one interval

  OpProfile a, b;
  a.steps = 1;
  a.span_seconds = 10;
  a.rows[static_cast<int>(OpClass::GemmForward)] = {8.0, 2, 0.0};
  a.step_intervals = {{0, 10}};
  a.busy_intervals = {{0, 4}, {6, 10}};
  b.steps = 1;
  b.span_seconds = 8;
  b.rows[static_cast<int>(OpClass::Attention)] = {1.0, 1, 0.0};
  b.step_intervals = {{1, 9}};
  b.busy_intervals = {{4.5, 5.5}};
  EXPECT_DOUBLE_EQ(a.idle_seconds(), a.host_seconds());  // one worker: its own gaps, 2 s
  EXPECT_DOUBLE_EQ(b.idle_seconds(), 7.0);
  OpProfile both = a;
  both += b;
  both.workers = 2;
  EXPECT_DOUBLE_EQ(both.host_seconds(), 9.0);  // the two streams' gaps, summed
  EXPECT_DOUBLE_EQ(both.wall_seconds(), 10.0);
  EXPECT_DOUBLE_EQ(both.idle_seconds(), 1.0);
  const std::string table = format_profile(both, "cuda-bf16", 0.0, "batch");
  const size_t line = table.find("device idle, all 2 workers");
  ASSERT_NE(line, std::string::npos) << table;
  // 1 s over 2 batches, 10% of the 10 s in which a worker ran a batch.
  EXPECT_NE(table.find("500.000   10.0% of the 10.000 s in which any worker ran a batch", line),
            std::string::npos)
      << table;
  EXPECT_EQ(format_profile(a, "cuda-bf16", 0.0, "batch").find("device idle"), std::string::npos);
}

// One worker's profile, taken by the ProfilingBackend from its clock: the time line's
// idle time is the host time between its ops, as the span less the ops' time gives it.
TEST(Profile, OneWorkersIdleTimeOnTheTimeLineIsItsHostTime) {
  auto cpu = make_cpu_backend(DType::F32);
  ProfilingBackend profiler(*cpu);
  const OpProfile profile = profile_of_trainer_steps(profiler, 3);
  ASSERT_EQ(profile.step_intervals.size(), 2u);  // the two recorded steps
  EXPECT_FALSE(profile.busy_intervals.empty());
  EXPECT_NEAR(profile.wall_seconds(), profile.span_seconds, 1e-9);
  EXPECT_GT(profile.host_seconds(), 0.0);
  EXPECT_NEAR(profile.idle_seconds(), profile.host_seconds(), 1e-9);
}

}  // namespace
}  // namespace thpc
