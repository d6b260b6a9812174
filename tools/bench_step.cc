// transformer_bench_step: the training step time of transformer_hpc on the shapes of
// the PyTorch peer torch_reference.py, printed as the same JSON fields, so that
// bench/step_vs_torch.sh can print the ratio of the two in one run.
//
//   transformer_bench_step [--config input/base.ini] [--tokens 25000] [--steps 60]
//                          [--warmup-steps 15] [--vocab 37000] [--backend auto]
//                          [--precision bf16] [--peak-tflops 790] [--spec-tflops 989.4]
//                          [--profile] [--gemm-sweep 8] [--set KEY=VALUE ...]
//
// Batches: for L in 12 18 24 28 32 40 48 64 96 (cycled), tokens / L sentences of source
// length L and target length L + 1 (decoder input and output L each), random ids in
// [4, vocab): the reference's length-bucketed synthetic batches. A step is the whole
// training step: forward, label-smoothed loss, backward, Adam with the §5.3 schedule.
// The JSON line's median_step_ms is the timed steps'; warmup_rounds_ms the mean step of
// each whole round of the nine lengths in the warm-up (the first: every shape's first
// pass; with train.cuda_kernels step_graphs the second: every shape's capture).
// Model FLOPs are counted as the reference counts them (matrix products, 3x forward).
// On the CPU, MFU is taken against the fp32 GEMM ceiling measured in the same run (the
// best of a few 2048^3 sgemm by the step's library and threads, kernels/cpu/blas.h): the
// step is almost all matrix products, so that rate bounds any trainer's tokens/s on the
// machine. On the GPU, `mfu` divides by --peak-tflops (bench/step_vs_torch.sh passes the
// cuBLAS rate it measured in the same call) and `mfu_spec` by --spec-tflops, the
// datasheet's dense bf16 rate that public MFU figures (PaLM, llm.c, MLPerf) divide by:
// 989.4 for an H100/H200 SXM.
// peak_mem_gib is Backend::peak_memory_bytes: the process's peak resident set on the CPU,
// on a GPU the peak of the device memory the backend allocated (what
// torch.cuda.max_memory_allocated is for the peer, plus our cuBLASLt workspace and
// scratch, which PyTorch's caching allocator does not count there).
//
// --profile runs the model on a ProfilingBackend (kernels/profiling_backend.h) and
// prints, before the JSON line, the timed steps' time per op class (GEMMs, attention,
// residual + dropout + layer norm, bias + ReLU, loss, embedding, Adam, ... and the host
// time between kernels) as a table whose rows add up to the step, and the GEMMs'
// FLOP-weighted rate against the ceiling (the measured one on the CPU, --peak-tflops on
// the GPU), then one line per bucket length: its steps' time, attention and GEMMs, and
// attention's forward and backward (a kernel that pays at one length and not at another
// shows there). Timing each op costs
// two clock marks (two events on the GPU), so the JSON line of a profiled run is not the
// benchmark's number.
//
// --gemm-sweep N (the GPU): after the JSON line, each cuBLASLt product shape of the timed
// steps with its uses a step, the heuristic's first offer (what the step ran) timed against
// its next N - 1 on random operands of the same shape, alignments and epilogue, and a total:
// the GEMM milliseconds a step the fastest offers would save (kernels/gemm_sweep.h).
// Run it with the verified kernels: with step_graphs the timed steps replay graphs and
// call no product.
#include <boost/program_options.hpp>

#include <algorithm>
#include <cmath>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "backend/factory.h"
#include "common/error.h"
#include "config/config.h"
#include "config/option_table.h"
#include "kernels/cpu/blas.h"
#include "kernels/cpu/openblas_core.h"
#include "kernels/profiling_backend.h"
#include "data/batch.h"
#include "io/hdf5.h"
#include "model/transformer.h"
#include "train/footprint.h"
#include "train/lr_schedule.h"
#include "train/optimizer.h"
#include "train/trainer.h"
#include "train/training_setup.h"
#include "tools/tool_main.h"

namespace {

namespace po = boost::program_options;

const int kLengths[] = {12, 18, 24, 28, 32, 40, 48, 64, 96};

struct Arguments {
  std::string config_path = "input/base.ini", backend = "auto", precision = "bf16";
  int tokens = 25000, steps = 60, warmup_steps = 15, vocab = 37000;
  double peak_tflops = 790.0;
  double spec_tflops = 989.4;  // H100/H200 SXM dense bf16, without sparsity
  std::vector<std::string> overrides;  // SECTION.KEY=VALUE, as the trainer's --SECTION.KEY
  bool profile = false;
  bool program_batches = false;  // the trainer's batches instead of kLengths' (--program-batches)
  int gemm_sweep = 0;  // --gemm-sweep N: the heuristic's first N offers per GEMM shape
  bool help = false;
  // Loaded while the command line is read, so that a bad --config, --set, --backend or
  // --precision is a usage error (exit 2), as the trainer's own config mistakes are.
  thpc::Config config;
};

// --backend, --precision and each --set said in the words the user typed: passed on to the
// configuration unchecked, a mistake came back in the trainer's ("train.backend: 'gpu'
// ...", "unknown command-line option '--model.layerz=2'"), naming what they never wrote.
// The values of the keys --set names are the configuration's to check, with their types.
void check_passed_on_options(const Arguments& args) {
  const auto check_choice = [](const char* flag, const char* key, const std::string& value) {
    const thpc::Option* option = thpc::find_option(key);
    THPC_CHECK(option != nullptr, key);
    thpc::Config values;
    *std::get<std::string*>(option->field(values)) = value;
    if (const std::string problem = option->allowed.problem(option->field(values));
        !problem.empty()) {
      THPC_FAIL(flag << ": " << problem);
    }
  };
  check_choice("--backend", "train.backend", args.backend);
  check_choice("--precision", "train.precision", args.precision);
  for (const std::string& text : args.overrides) {
    const size_t dashes = text.rfind("--", 0) == 0 ? 2 : 0;  // --set --model.layers=2 too
    const size_t equals = text.find('=');
    const std::string key = text.substr(dashes, equals - std::min(equals, dashes));
    if (equals == std::string::npos || key.find('.') == std::string::npos) {
      THPC_FAIL("--set '" << text << "': write --set SECTION.KEY=VALUE, e.g. --set "
                << "model.layers=2");
    }
    if (thpc::find_option(key) == nullptr) {
      THPC_FAIL("--set '" << text << "': the configuration has no key " << key
                << thpc::unknown_key_hint(key));
    }
  }
}

// --gemm-sweep: one line per product shape, the most time a step first, then the total.
void print_gemm_sweep(int algorithms, int steps, bool on_cpu) {
  std::vector<thpc::GemmSweepRow> rows;
  if (on_cpu || !thpc::sweep_gemm_algorithms(algorithms, rows)) {
    std::printf("gemm_sweep: skipped (%s)\n",
                on_cpu ? "the CPU backend: its products are a BLAS's, no cuBLASLt offers"
                       : "built without CUDA");
    return;
  }
  if (rows.empty()) {
    std::printf("gemm_sweep: no cuBLASLt product ran in the timed steps (with train.cuda_kernels "
                "step_graphs they replay graphs: sweep the verified kernels)\n");
  }
  std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) {
    return a.uses * a.heuristic_us > b.uses * b.heuristic_us;
  });
  double heuristic_ms = 0.0, best_ms = 0.0, worst_difference = 0.0;
  int unheld_timings = 0;
  for (const thpc::GemmSweepRow& row : rows) {
    unheld_timings += row.unheld_timings;
    const double per_step = static_cast<double>(row.uses) / steps;
    heuristic_ms += per_step * row.heuristic_us / 1e3;
    best_ms += per_step * row.best_us / 1e3;
    worst_difference = std::max(worst_difference, row.max_relative_difference);
    std::printf("gemm_sweep: %s uses_per_step=%.2f heuristic_us=%.2f heuristic_tflops=%.1f "
                "best_us=%.2f best=%d/%d gain=%.3f max_relative_difference=%.2e "
                "unheld_timings=%d\n",
                row.product.c_str(), per_step, row.heuristic_us,
                row.heuristic_us > 0 ? row.flops / row.heuristic_us / 1e6 : 0.0, row.best_us,
                row.best, row.algorithms,
                row.best_us > 0 ? row.heuristic_us / row.best_us : 0.0,
                row.max_relative_difference, row.unheld_timings);
  }
  std::printf("gemm_sweep_total: shapes=%zu offers=%d heuristic_ms_per_step=%.3f "
              "best_ms_per_step=%.3f saving_ms_per_step=%.3f max_relative_difference=%.2e "
              "unheld_timings=%d\n",
              rows.size(), algorithms, heuristic_ms, best_ms, heuristic_ms - best_ms,
              worst_difference, unheld_timings);
}

thpc::Batch random_batch(int length, int tokens, int vocab, std::mt19937& rng) {
  std::uniform_int_distribution<int32_t> id(4, vocab - 1);
  thpc::Batch batch;
  batch.size = std::max(1, tokens / length);
  batch.src_len = length;
  batch.tgt_len = length;
  for (int b = 0; b < batch.size; ++b) {
    for (int t = 0; t < length; ++t) batch.src.push_back(id(rng));
    std::vector<int32_t> target(length + 1);
    for (int32_t& token : target) token = id(rng);
    batch.tgt_in.insert(batch.tgt_in.end(), target.begin(), target.end() - 1);
    batch.tgt_out.insert(batch.tgt_out.end(), target.begin() + 1, target.end());
    batch.src_lengths.push_back(length);
    batch.tgt_lengths.push_back(length);
  }
  return batch;
}

// The reference's train_flops_per_step: matrix-product FLOPs of forward, times 3.
double train_flops(const thpc::ModelConfig& m, int vocab, double src_tokens, double tgt_tokens,
                   int length) {
  const double d = m.d_model, f = m.d_ff, n = m.layers;
  const double encoder = n * (4 * d * d + 2 * d * f);
  const double decoder = n * (8 * d * d + 2 * d * f);
  double forward = 2 * (src_tokens * encoder + tgt_tokens * (decoder + vocab * d));
  forward += 2 * 2 * n * d * length * (src_tokens + 2 * tgt_tokens);
  return 3 * forward;
}

// The machine's fp32 matrix-product rate in TFLOP/s: the best of five 2048^3 sgemm on
// random operands, with the BLAS threads the step uses (set by make_backend).
double measure_cpu_gemm_ceiling() {
  constexpr int n = 2048;
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> value(-1.0f, 1.0f);
  std::vector<float> a(size_t(n) * n), b(size_t(n) * n), c(size_t(n) * n, 0.0f);
  for (float& x : a) x = value(rng);
  for (float& x : b) x = value(rng);
  double best = 1e30;
  for (int repeat = 0; repeat < 5; ++repeat) {
    const auto start = std::chrono::steady_clock::now();
    thpc::cpu::gemm(CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f,
                    c.data(), n);
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
                              .count());
  }
  return 2.0 * n * n * n / best / 1e12;
}

int run(const Arguments& args) {
  const thpc::Config& config = args.config;
  const int longest = *std::max_element(std::begin(kLengths), std::end(kLengths));
  if (!args.program_batches && config.model.max_positions < longest) {
    THPC_FAIL(args.config_path << ": model.max_positions = " << config.model.max_positions
                          << " is shorter than the benchmark's longest batches (" << longest
                          << " positions a side): add --set model.max_positions=" << longest
                          << " or more");
  }
  auto backend = thpc::make_backend(config.train);
  // The defaults are the GPU's benchmark; run bare on a machine without one (a login node)
  // it filled 17 GB of a 23-GB machine and kept going. Said before the work, not refused:
  // it is a measurement someone may want.
  const Arguments defaults;
  if (backend->name().rfind("cpu", 0) == 0 && args.config_path == defaults.config_path &&
      args.tokens == defaults.tokens) {
    std::cerr << "transformer_bench_step: note: on the CPU, the GPU's benchmark ("
              << args.config_path << ", " << args.tokens
              << " tokens a side) needs tens of GB and about a minute "
              << "a step; bench/cpu_step_vs_torch.sh small runs the CPU's (2,000 tokens, "
              << "--set model.layers=2 ...), or give --tokens" << std::endl;
  }
  // With --profile every call goes through the profiler, which times the timed steps.
  std::optional<thpc::ProfilingBackend> profiler;
  if (args.profile) profiler.emplace(*backend);
  thpc::Backend& ops = profiler ? static_cast<thpc::Backend&>(*profiler) : *backend;
  // The batches: one of each length of kLengths, random ids of --vocab, cycled; or with
  // --program-batches those transformer_hpc's training source gives for this config (its
  // data.dir shards or synthetic task) at --tokens per micro-batch, the warm-up's first,
  // then the timed steps': the trainer's steps 1, 2, ... as bench/program_vs_bench.sh
  // compares them, with the data's vocabulary.
  std::mt19937 rng(1);
  std::vector<thpc::Batch> batches;
  int vocab = args.vocab;
  int source_vocab = 0;  // --program-batches of separate vocabularies: the source's
  if (args.program_batches) {
    const std::unique_ptr<thpc::BatchSource> source = thpc::make_training_source(config);
    vocab = thpc::resolve_vocab_size(config, *source);
    source_vocab = source->source_vocab_size();
    for (int i = 0; i < args.warmup_steps + args.steps; ++i) {
      batches.push_back(source->next(args.tokens));
    }
  } else {
    for (int length : kLengths) batches.push_back(random_batch(length, args.tokens, vocab, rng));
  }
  thpc::Transformer model(config.model, thpc::VocabularySizes{vocab, source_vocab},
                          thpc::SpecialIds{}, ops, config.train.seed);
  model.set_loss_chunk_rows(config.train.loss_chunk_rows);  // --set train.loss_chunk_rows=N
  thpc::AdamSettings settings;
  settings.beta1 = config.train.adam_beta1;
  settings.beta2 = config.train.adam_beta2;
  settings.eps = config.train.adam_eps;
  settings.weight_decay = config.train.weight_decay;  // --set train.weight_decay=D: AdamW's
  thpc::Adam adam(model.params(), ops, settings);

  int64_t step = 0;
  double loss = 0.0;
  // The program's step (Trainer::compute_step) on one rank: the loss and the gradient's
  // norm summed where they are computed and read back once, before the update.
  thpc::StepTotalsBuffer totals(ops);
  thpc::StepInputsBuffer inputs(ops);
  auto train = [&](const thpc::Batch& batch) {
    ++step;
    ops.zero(model.params().grads());
    totals.zero();
    thpc::DropoutContext dropout;
    dropout.seed = config.train.seed;
    dropout.step = static_cast<uint32_t>(step);
    inputs.set(thpc::step_inputs_for(dropout, 1.0f / static_cast<float>(batch.tgt_tokens())));
    model.train_step(batch, dropout, inputs.in_backend(), totals.tensor());
    const thpc::Tensor grads = model.params().grads();
    ops.sum_squares_into(totals.tensor(), grads, grads.numel);
    const thpc::StepTotals sums = totals.read(vocab);
    adam.update(static_cast<float>(thpc::scheduled_learning_rate(step, config)), step);
    loss = sums.loss / static_cast<double>(sums.tokens);
  };
  // With the training pass captured (train.cuda_kernels step_graphs: a shape's second pass
  // is captured into a CUDA graph, the later ones replay it) the warm-up is at least two
  // passes over the lengths, as torch_reference.py's is for its compiled peers: the timed
  // steps replay, as nearly all of a long run's passes do, and time no capture (a warm-up
  // of 15 left three of the nine shapes' captures among 60 timed steps, ~2% of their time
  // at base's 25,000 tokens).
  const int warmup_steps =
      ops.can_capture(thpc::CaptureUse::kTrainingPass) && !args.program_batches
          ? std::max(args.warmup_steps, 2 * static_cast<int>(batches.size()))
          : args.warmup_steps;
  // Each warm-up step timed (the totals' read-back ends it), and each whole round of the
  // lengths averaged: the first round is every shape's first pass (uncaptured, its
  // buffers growing), the second with step_graphs every shape's capture, so that what a
  // capture costs against the replays after it is measured, not guessed (how many of a
  // corpus's passes replay: transformer_data_stats).
  std::vector<double> warmup_rounds_ms;
  double round_seconds = 0.0;
  auto warm = std::chrono::steady_clock::now();
  for (int i = 0; i < warmup_steps; ++i) {
    train(batches[i % batches.size()]);
    const auto now = std::chrono::steady_clock::now();
    round_seconds += std::chrono::duration<double>(now - warm).count();
    warm = now;
    if (!args.program_batches && (i + 1) % batches.size() == 0) {
      warmup_rounds_ms.push_back(1e3 * round_seconds / static_cast<double>(batches.size()));
      round_seconds = 0.0;
    }
  }
  std::string rounds_json = "[";
  for (size_t r = 0; r < warmup_rounds_ms.size(); ++r) {
    char value[32];
    std::snprintf(value, sizeof value, "%s%.3f", r ? ", " : "", warmup_rounds_ms[r]);
    rounds_json += value;
  }
  rounds_json += "]";
  // The timed steps: kLengths' cycle from its start (as every measurement before), or the
  // trainer's steps after the warm-up's.
  const size_t first_timed = args.program_batches ? static_cast<size_t>(args.warmup_steps) : 0;
  ops.synchronize();
  if (args.gemm_sweep > 0) thpc::count_gemm_uses();

  std::vector<double> step_seconds;
  double tokens = 0.0, flops = 0.0;
  // --profile: each step collected after it (outside its host time), summed over all
  // steps and per bucket length, so that a kernel's gain or loss shows per length.
  thpc::OpProfile profile;
  std::map<int, thpc::OpProfile> profile_by_length;
  const auto begin = std::chrono::steady_clock::now();
  auto last = begin;
  for (int i = 0; i < args.steps; ++i) {
    const thpc::Batch& batch = batches[(first_timed + i) % batches.size()];
    if (profiler) profiler->begin_step();
    train(batch);  // the totals' read-back synchronises each step
    if (profiler) profiler->end_step();
    const auto now = std::chrono::steady_clock::now();
    step_seconds.push_back(std::chrono::duration<double>(now - last).count());
    tokens += static_cast<double>(batch.src_tokens() + batch.tgt_tokens());
    flops += train_flops(config.model, vocab, static_cast<double>(batch.src_tokens()),
                         static_cast<double>(batch.tgt_tokens()), batch.src_len);
    if (profiler) {
      const thpc::OpProfile collected = profiler->take();
      profile += collected;
      profile_by_length[batch.src_len] += collected;
    }
    last = std::chrono::steady_clock::now();
  }
  ops.synchronize();
  const double total =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
  std::sort(step_seconds.begin(), step_seconds.end());
  const double median = step_seconds.empty() ? 0.0 : step_seconds[step_seconds.size() / 2];
  const bool on_cpu = backend->name().rfind("cpu", 0) == 0;
  const double peak_tflops = on_cpu ? measure_cpu_gemm_ceiling() : args.peak_tflops;
  const double model_tflops = flops / total / 1e12;
  if (profiler) {
    std::printf("%s", thpc::format_profile(profile, backend->name(), peak_tflops).c_str());
    std::printf("(host clock: %.3f ms per step, profiling included)\n", 1e3 * total / args.steps);
    // Attention also as its forward and backward (the two ops of its class): which of a
    // candidate's kernels gains or loses at which length.
    std::printf("by bucket length (ms per step):     L   step  attention   GEMMs  "
                "attention fwd  bwd\n");
    // Not structured bindings: C++17 lets no lambda capture one (clang refuses).
    for (const auto& length_and_part : profile_by_length) {
      const int length = length_and_part.first;
      const auto& part = length_and_part.second;
      const double steps = part.steps > 0 ? part.steps : 1;
      const auto ms = [&](thpc::OpClass c) {
        return 1e3 * part.rows[static_cast<int>(c)].seconds / steps;
      };
      const auto op_ms = [&](const char* name) {
        const auto found = part.ops.find(name);
        return found == part.ops.end() ? 0.0 : 1e3 * found->second.seconds / steps;
      };
      std::printf("by bucket length:                 %3d %7.3f %9.3f %9.3f %9.3f %8.3f\n",
                  length, 1e3 * part.span_seconds / steps, ms(thpc::OpClass::Attention),
                  ms(thpc::OpClass::GemmForward) + ms(thpc::OpClass::GemmBackward),
                  op_ms("attention_forward"), op_ms("attention_backward"));
    }
  }
  // The datasheet's rate is a GPU's; on the CPU there is none to quote.
  const std::string mfu_spec =
      on_cpu ? "null" : std::to_string(std::round(1e3 * model_tflops / args.spec_tflops) / 1e3);
  // The library of the CPU's fp32 products (kernels/cpu/blas.h), for the benchmarks' lines.
  const std::string cpu_gemm =
      !on_cpu ? "null"
              : (thpc::cpu::gemm_library() == thpc::cpu::GemmLibrary::kOneDnn ? "\"onednn\""
                                                                               : "\"openblas\"");
  const int64_t peak_bytes = backend->peak_memory_bytes();
  const std::string peak_mem_gib =
      peak_bytes < 0 ? "null" : std::to_string(static_cast<double>(peak_bytes) / (1 << 30));
  std::printf("{\"system\": \"transformer_hpc\", \"backend\": \"%s\", \"config\": \"%s\", "
              "\"tokens_per_step\": %d, \"median_step_ms\": %.3f, \"tokens_per_s\": %.0f, "
              "\"model_tflops\": %.4f, \"gemm_ceiling_tflops\": %.4f, \"mfu\": %.3f, "
              "\"mfu_spec\": %s, \"peak_mem_gib\": %s, \"final_loss\": %.4f, "
              "\"captured_passes\": %lld, \"replayed_passes\": %lld, \"refused_captures\": %lld, "
              "\"warmup_steps\": %d, \"warmup_rounds_ms\": %s, \"cpu_gemm\": %s}\n",
              backend->name().c_str(), args.config_path.c_str(), 2 * args.tokens, 1e3 * median,
              tokens / total, model_tflops, peak_tflops, model_tflops / peak_tflops,
              mfu_spec.c_str(), peak_mem_gib.c_str(), loss,
              static_cast<long long>(model.capture_counts().captures),
              static_cast<long long>(model.capture_counts().replays),
              static_cast<long long>(model.capture_counts().refused), warmup_steps,
              rounds_json.c_str(), cpu_gemm.c_str());
  if (args.gemm_sweep > 0) print_gemm_sweep(args.gemm_sweep, args.steps, on_cpu);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  thpc::run_with_openblas_kernels_for_this_cpu(argv);  // first: it may start us again
  thpc::set_out_of_memory_advice(thpc::kTrainingMemoryAdvice);
  thpc::hdf5::use_our_locks_not_hdf5s();
  Arguments args;
  po::options_description options(
      "usage: transformer_bench_step [--config FILE] [--tokens N] [--steps N] [--profile]\n"
      "                              [--set KEY=VALUE ...]\n\n"
      "Times the training step of --config's model on random batches (one JSON line);\n"
      "bench/step_vs_torch.sh runs it beside the PyTorch peer.\n\noptions");
  options.add_options()
      ("help,h", "this help")
      ("version", "print the git commit the program was built from and exit")
      ("config", po::value(&args.config_path)->default_value(args.config_path),
       "model and optimizer config")
      ("tokens", po::value(&args.tokens)->default_value(args.tokens),
       "source tokens per step (target alike), as torch_reference.py --tokens; the "
       "defaults are the GPU's benchmark (on the CPU: tens of GB, a minute a step)")
      ("steps", po::value(&args.steps)->default_value(args.steps), "timed steps")
      ("warmup-steps", po::value(&args.warmup_steps)->default_value(args.warmup_steps),
       "untimed steps first (with the pass captured into CUDA graphs: at least two "
       "passes over the nine lengths)")
      ("vocab", po::value(&args.vocab)->default_value(args.vocab), "vocabulary size")
      ("backend", po::value(&args.backend)->default_value(args.backend), "auto | cuda | cpu")
      ("precision", po::value(&args.precision)->default_value(args.precision), "bf16 | fp32 (GPU)")
      ("peak-tflops", po::value(&args.peak_tflops)->default_value(args.peak_tflops),
       "the GPU's bf16 GEMM ceiling, for MFU (on the CPU it is measured instead)")
      ("spec-tflops", po::value(&args.spec_tflops)->default_value(args.spec_tflops, "989.4"),
       "the GPU's datasheet dense bf16 rate, for mfu_spec (989.4: H100/H200 SXM)")
      ("profile", po::bool_switch(&args.profile),
       "print the timed steps' time per op class before the JSON line")
      ("gemm-sweep", po::value(&args.gemm_sweep)->default_value(args.gemm_sweep),
       "after the timed steps, time the cuBLASLt heuristic's first N offers for each GEMM "
       "shape they ran against its first (the GPU; 0: not)")
      ("program-batches", po::bool_switch(&args.program_batches),
       "the batches transformer_hpc would train on with this config (data.dir or the "
       "synthetic task, --tokens per step), its vocabulary instead of --vocab")
      ("set", po::value(&args.overrides)->composing(),
       "SECTION.KEY=VALUE config override (repeatable), e.g. --set model.max_positions=128; "
       "the keys, their kinds and ranges: transformer_hpc --help");
  const auto parse = [&](int count, char** values) {
    args.help = thpc::tools::parse_options(options, count, values).count("help") > 0;
    if (args.help) return args;
    using thpc::tools::require_at_least;
    require_at_least("--tokens", args.tokens, 1);
    require_at_least("--steps", args.steps, 1);
    require_at_least("--warmup-steps", args.warmup_steps, 0);
    require_at_least("--gemm-sweep", args.gemm_sweep, 0);
    require_at_least("--vocab", args.vocab, 5, "4 special ids + 1");
    if (!(args.peak_tflops > 0)) THPC_FAIL("--peak-tflops must be > 0, got " << args.peak_tflops);
    if (!(args.spec_tflops > 0)) THPC_FAIL("--spec-tflops must be > 0, got " << args.spec_tflops);
    check_passed_on_options(args);
    std::vector<std::string> overrides = {"train.backend=" + args.backend,
                                          "train.precision=" + args.precision};
    overrides.insert(overrides.end(), args.overrides.begin(), args.overrides.end());
    args.config = thpc::load_config(args.config_path, overrides);
    return args;
  };
  return thpc::tools::tool_main("transformer_bench_step", thpc::tools::usage_text(options), argc,
                                argv, parse, run);
}
