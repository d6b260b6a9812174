// What a training run leaves for its user besides the log: RUN/metrics.jsonl, which must
// hold exactly the values the log lines show, and the checkpoint that --eval scores
// again. The corpus is the default job's (tools/make_numbers_corpus.py), small, so
// nothing is downloaded.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <regex>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "config/config.h"
#include "data/batch.h"
#include "data/shard_file.h"
#include "data/shard_reader.h"
#include "kernels/cpu/cpu_backend.h"
#include "model/transformer.h"
#include "program.h"

namespace thpc {
namespace {

namespace fs = std::filesystem;

const std::string kBuild = THPC_BINARY_DIR "/";

class RunOutputs : public ::testing::Test {
 protected:
  // One corpus and one 4-step run (validation and a checkpoint every 2 steps) for all tests.
  static void SetUpTestSuite() {
    root_ = fs::temp_directory_path() / ("thpc_test_run_outputs_" + std::to_string(::getpid()));
    fs::create_directories(root_);
    const ProcessResult corpus = run_process(
        "python3 " THPC_SOURCE_DIR "/tools/make_numbers_corpus.py --train 400 --valid 60 "
        "--test 10 --seed 1 --out " + (root_ / "text").string() + " && " + kBuild +
        "transformer_preprocess --source-lang en --target-lang de --trainpref " +
        (root_ / "text/train").string() + " --validpref " + (root_ / "text/valid").string() +
        " --destdir " + (root_ / "data").string() + " --vocab-size 120 --model-type bpe --seed 1");
    ASSERT_EQ(corpus.exit_code, 0) << corpus.output;
    run_ = run_process(trainer_command() +
                       " --train.max_steps=4 --train.log_every=2 --train.valid_every=2"
                       " --checkpoint.every_steps=2 --checkpoint.dir=" +
                       (root_ / "run/checkpoints").string());
  }
  static void TearDownTestSuite() { fs::remove_all(root_); }

  static std::string trainer_command() {
    return "cd " THPC_SOURCE_DIR " && " + kBuild + "transformer_hpc input/numbers.ini --data.dir=" +
           (root_ / "data").string();
  }

  static inline fs::path root_;
  static inline ProcessResult run_;
};

// The JSON key of each label the log lines print (README "Watching a run").
const std::map<std::string, std::string> kKeyOfLabel = {
    {"loss", "loss"},           {"ppl", "ppl"},
    {"epoch", "epoch"},         {"lr", "lr"},
    {"gnorm", "grad_norm"},     {"tgt tokens/s", "tgt_tokens_per_s"},
    {"ms/step", "ms_per_step"}, {"peak mem", "peak_mem_mib"},
    {"elapsed", "elapsed_s"},   {"eta", "eta_s"},
    {"steps", "steps"},         {"wall", "train_wall_s"},
    {"best valid ppl", "best_valid_ppl"},
    {"checkpoints", "checkpoints"}, {"target tokens", "valid_tgt_tokens"}};

// The flat JSON object of one metrics.jsonl line: key -> value text.
std::map<std::string, std::string> parse_record(const std::string& line) {
  std::map<std::string, std::string> record;
  const std::regex pair(R"re("(\w+)": (null|"[^"]*"|[-+0-9.eE]+))re");
  for (auto it = std::sregex_iterator(line.begin(), line.end(), pair);
       it != std::sregex_iterator(); ++it) {
    record[(*it)[1]] = (*it)[2];
  }
  return record;
}

// `value` printed as the number at the start of `text` is printed: the same notation
// and decimals (fixed, scientific; %g output is one of the two).
std::string print_like(double value, const std::string& text) {
  std::smatch number;
  if (!std::regex_search(text, number, std::regex(R"(^-?[0-9]+(\.([0-9]+))?(e[-+][0-9]+)?)"))) {
    return "not a number: " + text;
  }
  const int decimals = static_cast<int>(number[2].length());
  char buffer[64];
  std::snprintf(buffer, sizeof buffer, number[3].matched ? "%.*e" : "%.*f", decimals, value);
  return buffer;
}

TEST_F(RunOutputs, MetricsFileHoldsExactlyTheLoggedValues) {
  ASSERT_EQ(run_.exit_code, 0) << run_.output;
  // checkpoint.dir is run/checkpoints and train.metrics_dir is unset: the file is run/'s.
  const std::vector<std::string> records = lines_of(read_file(root_ / "run/metrics.jsonl"));
  size_t next = 0;
  int train_lines = 0, valid_lines = 0, summary_lines = 0;
  const std::regex logged(R"(^(step (\d+)/\d+|valid step (\d+)|summary:) (.*)$)");
  for (const std::string& line : lines_of(run_.output)) {
    std::smatch parts;
    if (!std::regex_match(line, parts, logged)) continue;
    SCOPED_TRACE(line);
    ASSERT_LT(next, records.size()) << "no record for the line";
    const std::map<std::string, std::string> record = parse_record(records[next++]);
    const std::string kind = parts[2].matched ? "train" : parts[3].matched ? "valid" : "summary";
    (kind == "train" ? train_lines : kind == "valid" ? valid_lines : summary_lines) += 1;
    EXPECT_EQ(record.at("kind"), "\"" + kind + "\"");
    if (kind != "summary") EXPECT_EQ(record.at("step"), parts[kind == "train" ? 2 : 3].str());
    // Every "label text" of the line, and nothing else besides kind, step, wall_s, time.
    std::string rest = parts[4];
    if (kind == "summary") rest = "| " + rest;
    size_t fields = 0;
    const std::regex field(R"(\| ([a-z/ ]+?) (n/a|-?[0-9][^|]*?)(?= \||$))");
    for (auto it = std::sregex_iterator(rest.begin(), rest.end(), field);
         it != std::sregex_iterator(); ++it, ++fields) {
      const std::string label = (*it)[1], text = (*it)[2];
      ASSERT_EQ(kKeyOfLabel.count(label), 1u) << "unknown label " << label;
      std::string key = kKeyOfLabel.at(label);
      if (kind == "valid" && key != "valid_tgt_tokens") key = "valid_" + key;
      ASSERT_EQ(record.count(key), 1u) << key << " missing in " << records[next - 1];
      if (text == "n/a") {
        EXPECT_EQ(record.at(key), "null") << key;
      } else {
        EXPECT_EQ(print_like(std::stod(record.at(key)), text), text.substr(0, text.find_first_of(" sM")))
            << key << " = " << record.at(key);
      }
    }
    EXPECT_EQ(record.size(), fields + 4) << records[next - 1];
  }
  EXPECT_EQ(next, records.size()) << "records without a line";
  EXPECT_EQ(train_lines, 2);
  EXPECT_EQ(valid_lines, 2);
  EXPECT_EQ(summary_lines, 1);
}

TEST_F(RunOutputs, AMetricsDirThatCannotBeCreatedIsAOneLineError) {
  const fs::path blocker = root_ / "a_file";
  std::ofstream(blocker) << "not a directory\n";
  const ProcessResult result = run_process(
      trainer_command() + " --train.max_steps=1 --checkpoint.dir=" +
      (root_ / "blocked/checkpoints").string() + " --train.metrics_dir=" + (blocker / "sub").string());
  EXPECT_NE(result.exit_code, 0) << result.output;
  EXPECT_NE(result.output.find("cannot open the metrics file " + (blocker / "sub/metrics.jsonl").string()),
            std::string::npos)
      << result.output;
  EXPECT_NE(result.output.find("train.metrics_dir"), std::string::npos) << result.output;
}

// The files under `dir` with their sizes: what --eval must leave as it found.
std::map<std::string, uintmax_t> listing(const fs::path& dir) {
  std::map<std::string, uintmax_t> files;
  for (const auto& entry : fs::recursive_directory_iterator(dir)) {
    files[entry.path().string()] = entry.is_regular_file() ? entry.file_size() : 0;
  }
  return files;
}

TEST_F(RunOutputs, EvalReproducesTheValidLineOfTheRunThatWroteTheCheckpoint) {
  ASSERT_EQ(run_.exit_code, 0) << run_.output;
  const auto before = listing(root_);
  for (const std::string step : {"2", "4"}) {
    SCOPED_TRACE("step " + step);
    const std::string checkpoint =
        (root_ / "run/checkpoints" / ("step_0000000" + step + ".h5")).string();
    // --eval runs with the training's config (here, the defaults of numbers.ini).
    const ProcessResult eval = run_process(trainer_command() + " --eval " + checkpoint);
    ASSERT_EQ(eval.exit_code, 0) << eval.output;
    const std::string valid = "valid step " + step + " | ";
    const auto in_run = run_.output.find(valid), in_eval = eval.output.find(valid);
    ASSERT_NE(in_run, std::string::npos) << run_.output;
    ASSERT_NE(in_eval, std::string::npos) << eval.output;
    EXPECT_EQ(eval.output.substr(in_eval, eval.output.find('\n', in_eval) - in_eval),
              run_.output.substr(in_run, run_.output.find('\n', in_run) - in_run));
    EXPECT_EQ(eval.output.find("step 1/"), std::string::npos) << "it trained: " << eval.output;
  }
  EXPECT_EQ(listing(root_), before) << "--eval wrote or changed a file";
}

// The validation line's numbers recomputed without the trainer's validation pass (its
// reader, batching, sums over ranks and formatting): the checkpoint's parameters in a
// model of their own, the validation shards read directly, every pair a batch of its
// own, the sums in double here. metrics.jsonl holds the line's values at full precision.
TEST_F(RunOutputs, ValidationLossAndPerplexityEqualAnIndependentPairByPairComputation) {
  ASSERT_EQ(run_.exit_code, 0) << run_.output;
  std::map<std::string, std::map<std::string, std::string>> logged;  // step -> record
  for (const std::string& line : lines_of(read_file(root_ / "run/metrics.jsonl"))) {
    const auto record = parse_record(line);
    if (record.at("kind") == "\"valid\"") logged[record.at("step")] = record;
  }
  ASSERT_EQ(logged.size(), 2u);
  std::vector<ShardContents> shards;
  for (const std::string& file : find_shards((root_ / "data").string(), "valid")) {
    shards.push_back(read_shard(file));
  }
  for (const std::string step : {"2", "4"}) {
    SCOPED_TRACE("step " + step);
    const Checkpoint checkpoint = read_checkpoint(
        (root_ / "run/checkpoints" / ("step_0000000" + step + ".h5")).string(),
        CheckpointParts::ParamsOnly);
    const Config config = load_config_text(checkpoint.config_ini, "checkpoint");
    const ShardMetadata& metadata = shards.front().metadata;
    auto backend = make_cpu_backend(DType::F32);
    Transformer model(config.model, metadata.vocab_size, metadata.ids, *backend, std::nullopt);
    load_parameters(checkpoint, "checkpoint", model);
    double loss = 0.0, nll = 0.0;
    int64_t tokens = 0, pairs = 0;
    for (const ShardContents& shard : shards) {
      for (int64_t i = 0; i < shard.source.sentences(); ++i) {
        // The reader drops pairs the positions cannot hold (none in this corpus).
        ASSERT_LT(std::max(shard.source.length(i), shard.target.length(i)),
                  config.model.max_positions);
        const LossSums sums = model.evaluate(
            make_batch({shard.source.sentence(i)}, {shard.target.sentence(i)}, metadata.ids));
        loss += sums.loss;
        nll += sums.nll;
        tokens += sums.tokens;
        ++pairs;
      }
    }
    ASSERT_GT(pairs, 50);
    const auto& record = logged.at(step);
    EXPECT_EQ(std::stoll(record.at("valid_tgt_tokens")), tokens);
    // fp32 forward passes over other batch shapes round differently: 1e-9 relative
    // measured, 1e-6 allowed; a wrong normalisation or a lost batch is off by far more.
    EXPECT_NEAR(std::stod(record.at("valid_loss")), loss / tokens, 1e-6 * loss / tokens);
    EXPECT_NEAR(std::stod(record.at("valid_ppl")), std::exp(nll / tokens),
                1e-6 * std::exp(nll / tokens));
  }
}

TEST_F(RunOutputs, EvalOfAMissingCheckpointOrWithoutAFileIsAOneLineError) {
  const std::string missing = (root_ / "no_such.h5").string();
  const ProcessResult result = run_process(trainer_command() + " --eval " + missing);
  EXPECT_NE(result.exit_code, 0) << result.output;
  EXPECT_NE(result.output.find(missing), std::string::npos) << result.output;
  EXPECT_EQ(lines_of(result.output).size(), 1u) << result.output;

  const ProcessResult no_file = run_process(trainer_command() + " --eval");
  EXPECT_EQ(no_file.exit_code, 2) << no_file.output;
  EXPECT_NE(no_file.output.find("eval"), std::string::npos) << no_file.output;
}

}  // namespace
}  // namespace thpc
