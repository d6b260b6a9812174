// What a training run leaves for its user besides the log: DIR/metrics.jsonl (DIR its
// checkpoint.dir), which must
// hold exactly the values the log lines show, the TensorBoard event file beside it, which
// must hold the same values as TensorBoard reads them, and the checkpoint that --eval
// scores again. The corpus is the default job's (tools/make_numbers_corpus.py), small, so
// nothing is downloaded.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "common/source_version.h"
#include "config/config.h"
#include "data/batch.h"
#include "data/shard_file.h"
#include "data/shard_reader.h"
#include "kernels/cpu/cpu_backend.h"
#include "model/checkpoint_params.h"
#include "model/transformer.h"
#include "program.h"
#include "metrics/tokenize.h"
#include "train/run_log.h"

namespace thpc {
namespace {

namespace fs = std::filesystem;

const std::string kBuild = thpc::binary_dir() + "/";

class RunOutputs : public ::testing::Test {
 protected:
  // One corpus and one 4-step run (validation and a checkpoint every 2 steps) for all tests.
  static void SetUpTestSuite() {
    root_ = fs::temp_directory_path() / ("thpc_test_run_outputs_" + std::to_string(::getpid()));
    fs::create_directories(root_);
    const ProcessResult corpus = run_process(small_numbers_corpus_command(root_));
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

// The JSON key of each label the log lines print (docs/running.md "Watching a run").
const std::map<std::string, std::string> kKeyOfLabel = {
    {"loss", "loss"},           {"ppl", "ppl"},
    {"epoch", "epoch"},         {"lr", "lr"},
    {"gnorm", "grad_norm"},     {"tgt tokens/s", "tgt_tokens_per_s"},
    {"ms/step", "ms_per_step"}, {"peak mem", "peak_mem_mib"},
    {"elapsed", "elapsed_s"},   {"eta", "eta_s"},
    {"steps", "steps"},         {"wall", "train_wall_s"},
    {"best valid ppl", "best_valid_ppl"}, {"best valid bleu", "best_valid_bleu"},
    {"bleu", "bleu"},
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
  // checkpoint.dir is run/checkpoints and train.metrics_dir is unset: the file is in it.
  const std::vector<std::string> records = lines_of(read_file(root_ / "run/checkpoints/metrics.jsonl"));
  // The process's records start with the record of its run (no line shows it): the run's
  // id, the step it started from, the checkpoint it resumed from (none here), its
  // checkpoint.dir, absolute, its lineage (a fresh run's: 0:RUN_ID) and its validation
  // pairs' digest.
  ASSERT_FALSE(records.empty());
  EXPECT_TRUE(std::regex_search(
      records[0],
      std::regex(R"re(^\{"kind": "run", "step": 0, "wall_s": 0, "time": [0-9.]+, "run": "[0-9a-f]{16}", "resumed_from": null, "checkpoint_dir": ")re")))
      << records[0];
  // (the path compared as text: a temporary directory's name may hold a regex's characters)
  const std::string run_id = records[0].substr(records[0].find("\"run\": \"") + 8, 16);
  const std::string directory_field =
      "\"checkpoint_dir\": \"" + (root_ / "run/checkpoints").lexically_normal().string() +
      "\", \"lineage\": \"0:" + run_id + "\", \"valid_sha256\": \"";
  EXPECT_NE(records[0].find(directory_field), std::string::npos) << records[0];
  EXPECT_TRUE(std::regex_search(records[0], std::regex(R"re("valid_sha256": "[0-9a-f]{64}", )re")))
      << records[0];
  // Then what the curves were trained with, readable when the checkpoints are deleted: the
  // training data, the program, what computed the steps, the config file, the command
  // line's settings over it and the resolved configuration.
  const std::string record_text = records[0];
  const std::regex corpus(R"re("corpus_sha256": "[0-9a-f]{64}", )re");
  EXPECT_TRUE(std::regex_search(record_text, corpus)) << record_text;
  // The digests transformer_data_stats prints of the shards: a reviewer tells by them that
  // shards at hand are the ones a run read.
  for (const auto& [prefix, key] : {std::pair{"train", "corpus_sha256"},
                                    std::pair{"valid", "valid_sha256"}}) {
    const ProcessResult stats =
        run_process(kBuild + "transformer_data_stats " + (root_ / "data").string() +
                    " --prefix " + prefix);
    ASSERT_EQ(stats.exit_code, 0) << stats.output;
    std::smatch digest;
    ASSERT_TRUE(std::regex_search(stats.output, digest, std::regex("\npairs sha256 (\\w{64})\n")))
        << stats.output;
    EXPECT_NE(record_text.find("\"" + std::string(key) + "\": \"" + digest[1].str() + "\""),
              std::string::npos)
        << prefix << ": " << stats.output << record_text;
  }
  EXPECT_NE(record_text.find(", \"version\": \"" + std::string(source_version()) + "\", "),
            std::string::npos)
      << record_text;
  EXPECT_NE(record_text.find(", \"computed_by\": \"cpu-fp32, "), std::string::npos) << record_text;
  EXPECT_NE(record_text.find(", \"config_file\": \"" THPC_SOURCE_DIR "/input/numbers.ini\", "),
            std::string::npos)
      << record_text;
  EXPECT_NE(record_text.find(", \"command_line\": \"--train.max_steps=4 --train.log_every=2 "),
            std::string::npos)
      << record_text;
  EXPECT_NE(record_text.find(", \"config\": \"# transformer_hpc configuration, resolved from "),
            std::string::npos)
      << record_text;
  EXPECT_NE(record_text.find("\\nmax_steps = 4\\n"), std::string::npos) << record_text;
  EXPECT_EQ(record_text.substr(record_text.size() - 4), "\\n\"}") << record_text;
  EXPECT_EQ(records[0].find("\"init\""), std::string::npos) << records[0];  // none here
  size_t next = 1;
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
    if (kind != "summary") {
      EXPECT_EQ(record.at("step"), parts[kind == "train" ? 2 : 3].str());
    }
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
    // The summary says how the run ended (no line shows it: its "final:" line does).
    if (kind == "summary") {
      EXPECT_EQ(record.at("ended"), "\"finished\"");
      ++fields;
      // Each best value's step, which the line gives in brackets (null without a value),
      // and the final parameters' digest, which the final: line gives.
      for (const std::string metric : {"ppl", "bleu"}) {
        std::smatch best;
        const std::string key = "best_valid_" + metric + "_step";
        ASSERT_EQ(record.count(key), 1u) << key << " missing in " << records[next - 1];
        if (std::regex_search(line, best, std::regex("best valid " + metric +
                                                     R"( [0-9.]+ \(step ([0-9]+)\))"))) {
          EXPECT_EQ(record.at(key), best[1].str());
        } else {
          EXPECT_EQ(record.at(key), "null") << line;
        }
        ++fields;
      }
      std::smatch final;
      ASSERT_TRUE(std::regex_search(run_.output, final,
                                    std::regex("final: step=4 loss=\\S+ params_sha256=(\\w+)")));
      EXPECT_EQ(record.at("params_sha256"), "\"" + final[1].str() + "\"");
      ++fields;
    }
    EXPECT_EQ(record.size(), fields + 4) << records[next - 1];
  }
  EXPECT_EQ(next, records.size()) << "records without a line";
  EXPECT_EQ(train_lines, 2);
  EXPECT_EQ(valid_lines, 2);
  EXPECT_EQ(summary_lines, 1);
}

// The Python interpreter (program.h) when it can import `module` (tensorboard's reader,
// matplotlib); else "" and `why_not` is the reason to skip.
std::string python_with(const std::string& module, std::string* why_not) {
  const std::string python = python_interpreter().path;
  if (run_process(python + " -c 'import " + module + "'").exit_code == 0) return python;
  *why_not = "'" + python + "' cannot import " + module +
             " (bash tools/install_deps.sh puts it into its virtual environment, or set "
             "THPC_PYTHON)";
  return "";
}

TEST_F(RunOutputs, EventFileHoldsEveryMetricsValue) {
  ASSERT_EQ(run_.exit_code, 0) << run_.output;
  std::string why_not;
  const std::string python = python_with("tensorboard", &why_not);
  if (python.empty()) GTEST_SKIP() << why_not;
  int event_files = 0;
  for (const auto& entry : fs::directory_iterator(root_ / "run/checkpoints")) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("events.out.tfevents.", 0) == 0) ++event_files;
  }
  EXPECT_EQ(event_files, 1) << "one run, one event file";
  // (tag, step) -> the scalar as TensorBoard's EventAccumulator reads it.
  const ProcessResult read = run_process(python + " " THPC_SOURCE_DIR
                                         "/tests/tensorboard_scalars.py " + (root_ / "run/checkpoints").string());
  ASSERT_EQ(read.exit_code, 0) << read.output;
  std::map<std::pair<std::string, std::string>, std::map<std::string, std::string>> scalars;
  for (const std::string& line : lines_of(read.output)) {
    std::map<std::string, std::string> scalar = parse_record(line);
    ASSERT_EQ(scalar.size(), 4u) << line;
    const std::string tag = scalar.at("tag").substr(1, scalar.at("tag").size() - 2);
    ASSERT_TRUE(scalars.emplace(std::make_pair(tag, scalar.at("step")), scalar).second)
        << "twice: " << line;
  }
  size_t expected = 0;
  std::set<std::string> kinds;
  for (const std::string& line : lines_of(read_file(root_ / "run/checkpoints/metrics.jsonl"))) {
    SCOPED_TRACE(line);
    const std::map<std::string, std::string> record = parse_record(line);
    const std::string kind = record.at("kind").substr(1, record.at("kind").size() - 2);
    if (kind == "run") continue;  // where a process's records start: no scalars
    kinds.insert(kind);
    for (const auto& [key, value] : record) {
      if (key == "kind" || key == "step" || key == "time") continue;
      if (value.front() == '"') continue;  // a text (the summary's "ended"): no scalar
      const auto found = scalars.find({kind + "/" + key, record.at("step")});
      if (value == "null") {  // n/a: no point in the curve
        EXPECT_EQ(found, scalars.end()) << kind << "/" << key << " written although null";
        continue;
      }
      ++expected;
      ASSERT_NE(found, scalars.end()) << kind << "/" << key << " missing";
      // TensorBoard keeps a scalar as a 32-bit float: the writer rounds the double to the
      // nearest float, and so does this cast of the JSON value (which reads back the
      // exact double), so the two must be equal: a tolerance of float32's rounding,
      // half an ulp (2^-24 relative), and no more.
      EXPECT_EQ(std::stod(found->second.at("value")),
                static_cast<double>(static_cast<float>(std::stod(value))))
          << kind << "/" << key << " = " << value;
      // The Event's wall_time is the record's Unix time, which the JSON rounds to ms.
      EXPECT_NEAR(std::stod(found->second.at("wall_time")), std::stod(record.at("time")), 5e-4 + 1e-6)
          << kind << "/" << key;
    }
  }
  EXPECT_EQ(kinds, (std::set<std::string>{"train", "valid", "summary"}));
  EXPECT_EQ(scalars.size(), expected) << "scalars that are not in metrics.jsonl";
}

// What is wrong with `bytes` as a PNG image of width x height pixels; empty when nothing:
// the signature, an IHDR chunk first (width and height, big-endian), an IEND chunk last.
std::string png_problem(const std::string& bytes, uint32_t width, uint32_t height) {
  const std::string signature = "\x89PNG\r\n\x1a\n";
  if (bytes.compare(0, signature.size(), signature) != 0) return "no PNG signature";
  if (bytes.size() < 33 || bytes.compare(12, 4, "IHDR") != 0) return "no IHDR chunk first";
  const auto big_endian = [&](size_t at) {
    uint32_t value = 0;
    for (size_t i = 0; i < 4; ++i) value = value << 8 | static_cast<unsigned char>(bytes[at + i]);
    return value;
  };
  if (big_endian(16) != width || big_endian(20) != height) {
    return std::to_string(big_endian(16)) + "x" + std::to_string(big_endian(20)) + " pixels";
  }
  // The last chunk: length 0, "IEND", its CRC.
  if (bytes.compare(bytes.size() - 12, 8, std::string("\0\0\0\0IEND", 8)) != 0) {
    return "no IEND chunk at the end (truncated?)";
  }
  return "";
}

TEST_F(RunOutputs, PlotsArePngsOfTheStatedSize) {
  ASSERT_EQ(run_.exit_code, 0) << run_.output;
  std::string why_not;
  const std::string python = python_with("matplotlib", &why_not);
  if (python.empty()) GTEST_SKIP() << why_not;
  // A second run to overlay: the same records under another name.
  fs::create_directories(root_ / "other");
  fs::copy_file(root_ / "run/checkpoints/metrics.jsonl", root_ / "other/metrics.jsonl",
                fs::copy_options::overwrite_existing);
  const fs::path out = root_ / "plots";
  const ProcessResult plot = run_process(
      python + " " THPC_SOURCE_DIR "/tools/plot_metrics.py " + (root_ / "run/checkpoints").string() + " " +
      (root_ / "other/metrics.jsonl").string() + " --out " + out.string() + " --size 640x480");
  ASSERT_EQ(plot.exit_code, 0) << plot.output;
  std::set<std::string> expected;
  for (const char* curve : {"loss", "ppl", "lr", "grad_norm", "tokens_per_s"}) {
    for (const char* axis : {"_step.png", "_time.png"}) expected.insert(curve + std::string(axis));
  }
  // BLEU curves only when validation BLEU was logged.
  if (read_file(root_ / "run/checkpoints/metrics.jsonl").find("\"valid_bleu\"") != std::string::npos) {
    expected.insert({"bleu_step.png", "bleu_time.png"});
  }
  std::set<std::string> written;
  for (const auto& entry : fs::directory_iterator(out)) {
    const std::string name = entry.path().filename().string();
    written.insert(name);
    const std::string bytes = read_file(entry.path());
    // A blank 640x480 RGBA canvas compresses to about 2 KB; axes, labels and curves add more.
    EXPECT_GT(bytes.size(), 10000u) << name;
    EXPECT_EQ(png_problem(bytes, 640, 480), "") << name;
    EXPECT_NE(plot.output.find(entry.path().string()), std::string::npos)
        << name << " written but not listed: " << plot.output;
  }
  EXPECT_EQ(written, expected);
}

// A sweep's runs compared from their files (a helper's sweep read the summary lines of
// their logs by eye): plot_metrics.py --table gives each run's steps, how it ended, its
// best validation values with their steps, and the settings in which the runs differ,
// without matplotlib.
TEST_F(RunOutputs, PlotsTableComparesRunsByTheirBestValuesAndTheSettingsThatDiffer) {
  ASSERT_EQ(run_.exit_code, 0) << run_.output;
  const fs::path other = root_ / "lr_half";
  const ProcessResult half = run_process(
      trainer_command() + " --train.max_steps=4 --train.log_every=2 --train.valid_every=2" +
      " --train.lr_scale=0.5" +
      " --checkpoint.every_steps=2 --checkpoint.dir=" + other.string());
  ASSERT_EQ(half.exit_code, 0) << half.output;
  const ProcessResult table = run_process(
      python_interpreter().path + " " THPC_SOURCE_DIR "/tools/plot_metrics.py " +
      (root_ / "run/checkpoints").string() + " " + other.string() + " --table");
  ASSERT_EQ(table.exit_code, 0) << table.output;
  const std::vector<std::string> lines = lines_of(table.output);
  ASSERT_EQ(lines.size(), 3u) << table.output;
  const std::regex header(
      R"(run +steps +ended +best valid ppl \(step\) +best valid bleu \(step\) +train.lr_scale)");
  EXPECT_TRUE(std::regex_match(lines[0], header)) << table.output;
  // Each run's best values as its summary line gives them, and its lr_scale.
  for (const auto& [line, log, lr_scale] :
       {std::tuple{lines[1], run_.output, "1"}, std::tuple{lines[2], half.output, "0.5"}}) {
    std::smatch best;
    const std::regex summary(R"(best valid ppl ([0-9.]+ \(step [0-9]+\)))");
    ASSERT_TRUE(std::regex_search(log, best, summary)) << log;
    const std::string in_table = std::regex_replace(best[1].str(), std::regex("step "), "");
    EXPECT_NE(line.find("  4      finished  " + in_table), std::string::npos) << table.output;
    const std::string last_column = "  " + std::string(lr_scale);
    EXPECT_TRUE(line.size() > last_column.size() &&
                line.substr(line.size() - last_column.size()) == last_column)
        << table.output;
  }
  // A run whose last process wrote no summary (killed, or still training) is "running",
  // not the end of the process before it.
  fs::create_directories(root_ / "resumed_and_killed");
  const std::string records = read_file(other / "metrics.jsonl");
  std::string resumed = records.substr(0, records.find('\n') + 1);  // its run record ...
  resumed.replace(resumed.find("\"step\": 0,"), 10, "\"step\": 4,");  // ... at step 4
  std::ofstream(root_ / "resumed_and_killed" / "metrics.jsonl") << records << resumed;
  const ProcessResult killed = run_process(
      python_interpreter().path + " " THPC_SOURCE_DIR "/tools/plot_metrics.py " +
      (root_ / "resumed_and_killed").string() + " --table");
  ASSERT_EQ(killed.exit_code, 0) << killed.output;
  EXPECT_NE(killed.output.find("\nresumed_and_killed  4      running"), std::string::npos)
      << killed.output;
  // A setting a resume changed shows each value in turn: the run is no clean variant.
  const ProcessResult at_another_rate = run_process(
      trainer_command() + " --train.max_steps=6 --train.log_every=2 --train.valid_every=2" +
      " --train.lr_scale=1 --checkpoint.every_steps=2 --checkpoint.resume=auto" +
      " --checkpoint.dir=" + other.string());
  ASSERT_EQ(at_another_rate.exit_code, 0) << at_another_rate.output;
  // ... and so do its checkpoints, whose stored configuration is the last process's alone
  // (a sweep walk read it as a clean run at rate 1): a line at the head says from when.
  const std::string resumed_config = read_checkpoint((other / "step_00000006.h5").string())
                                         .config_ini;
  EXPECT_NE(resumed_config.find("\n# settings changed: at step 4: train.max_steps = 6 (was 4), "
                                "train.lr_scale = 1 (was 0.5)\n"),
            std::string::npos)
      << resumed_config;
  const ProcessResult shown = run_process(kBuild + "transformer_hpc --show-checkpoint " +
                                          (other / "step_00000006.h5").string());
  EXPECT_NE(shown.output.find("and resumes of its run changed some (the \"settings changed\" "
                              "lines below say which, from which step)"),
            std::string::npos)
      << shown.output;
  const ProcessResult changed = run_process(
      python_interpreter().path + " " THPC_SOURCE_DIR "/tools/plot_metrics.py " +
      (root_ / "run/checkpoints").string() + " " + other.string() + " --table");
  ASSERT_EQ(changed.exit_code, 0) << changed.output;
  const std::vector<std::string> after = lines_of(changed.output);
  ASSERT_EQ(after.size(), 3u) << changed.output;
  EXPECT_NE(after[0].find("train.lr_scale"), std::string::npos) << changed.output;
  EXPECT_EQ(after[2].rfind("lr_half      6      finished  ", 0), 0u) << changed.output;
  EXPECT_NE(after[2].find("  0.5->1"), std::string::npos) << changed.output;
  // A shell pattern that also catches a file of notes: the runs' lines stay, the file is
  // named as left out, and the exit status says something was.
  std::ofstream(root_ / "notes.txt") << "lr 0.5 looked better\n";
  const ProcessResult with_notes = run_process(
      python_interpreter().path + " " THPC_SOURCE_DIR "/tools/plot_metrics.py " +
      (root_ / "run/checkpoints").string() + " " + (root_ / "notes.txt").string() + " " +
      other.string() + " --table");
  EXPECT_EQ(with_notes.exit_code, 1) << with_notes.output;
  EXPECT_EQ(lines_of(with_notes.output).size(), 4u) << with_notes.output;
  EXPECT_NE(with_notes.output.find("notes.txt: line 1: not a metrics record"), std::string::npos)
      << with_notes.output;
  EXPECT_NE(with_notes.output.find("lr_half      6      finished  "), std::string::npos)
      << with_notes.output;
  // A later resume keeps the earlier change's line and adds its own.
  const ProcessResult longer = run_process(
      trainer_command() + " --train.max_steps=8 --train.log_every=2 --train.valid_every=2" +
      " --checkpoint.every_steps=2 --checkpoint.resume=auto --checkpoint.dir=" + other.string());
  ASSERT_EQ(longer.exit_code, 0) << longer.output;
  EXPECT_EQ(ini_header_values(read_checkpoint((other / "step_00000008.h5").string()).config_ini,
                              kSettingsChanged),
            (std::vector<std::string>{
                "at step 4: train.max_steps = 6 (was 4), train.lr_scale = 1 (was 0.5)",
                "at step 6: train.max_steps = 8 (was 6)"}));
}

// The validation perplexity tools/plot_metrics.py reads from the metrics file `file`, as
// Python prints its [(step, seconds, value), ...].
ProcessResult valid_ppl_as_plotted(const std::string& python, const fs::path& file) {
  return run_process(python + " -c \"import sys; sys.path.insert(0, '" THPC_SOURCE_DIR
                              "/tools'); import plot_metrics; print(plot_metrics.read_run('" +
                     file.string() + "')[('valid', 'valid_ppl')])\"");
}

// A run resumed from an older checkpoint (steps 40-60 left, marked superseded): the
// curves kept the left branch's points past the steps the new process reached (its valid
// ppl at step 60 ended the curve, and the time axis ran back), a helper's finding. A
// process's "run" record drops what earlier ones recorded past its step; a last line cut
// short (a live run's record being written) is passed over.
TEST_F(RunOutputs, PlotsOfARunResumedFromAnOlderStepLeaveOutTheBranchItLeft) {
  std::string why_not;
  const std::string python = python_with("matplotlib", &why_not);
  if (python.empty()) GTEST_SKIP() << why_not;
  std::ostringstream records;
  records << "{\"kind\": \"run\", \"step\": 0, \"wall_s\": 0, \"run\": \"a\"}\n";
  for (int step = 20; step <= 60; step += 20) {
    records << "{\"kind\": \"valid\", \"step\": " << step << ", \"wall_s\": " << step / 10
            << ", \"valid_ppl\": " << 200 - step << "}\n";
  }
  records << "{\"kind\": \"run\", \"step\": 30, \"wall_s\": 0, \"run\": \"a\"}\n";
  for (int step = 40; step <= 50; step += 10) {
    records << "{\"kind\": \"valid\", \"step\": " << step << ", \"wall_s\": "
            << (step - 30) / 10 << ", \"valid_ppl\": " << 300 - step << "}\n";
  }
  records << "{\"kind\": \"tra";  // being written
  const fs::path file = root_ / "resumed_older.jsonl";
  std::ofstream(file) << records.str();
  const ProcessResult read = valid_ppl_as_plotted(python, file);
  ASSERT_EQ(read.exit_code, 0) << read.output;
  EXPECT_EQ(read.output, "[(20, 2.0, 180), (40, 3.0, 260), (50, 4.0, 250)]\n");
}

// Records with lineages (each process's "run" record, a rollback's "branch" record): the
// curves are the line the run ended on. A return to a branch left before showed the other
// branch's step and dropped the returned branch's later ones (a helper's walk: the run
// record said nothing of the line).
TEST_F(RunOutputs, PlotsFollowTheLineOfTrainingTheRunEndedOn) {
  std::string why_not;
  const std::string python = python_with("matplotlib", &why_not);
  if (python.empty()) GTEST_SKIP() << why_not;
  const std::string a = "0:aaaaaaaaaaaaaaaa", b = "20:bbbbbbbbbbbbbbbb",
                    c = "50:cccccccccccccccc";
  const auto valid = [](int step, double wall, int ppl) {
    return "{\"kind\": \"valid\", \"step\": " + std::to_string(step) + ", \"wall_s\": " +
           std::to_string(wall) + ", \"valid_ppl\": " + std::to_string(ppl) + "}\n";
  };
  const auto start = [](const std::string& kind, int step, const std::string& lineage) {
    return "{\"kind\": \"" + kind + "\", \"step\": " + std::to_string(step) +
           ", \"wall_s\": 0, \"run\": \"a\", \"lineage\": \"" + lineage + "\"}\n";
  };
  std::string records = start("run", 0, a);
  for (int step = 10; step <= 40; step += 10) records += valid(step, step / 10.0, 100 - step);
  records += start("run", 20, a + " " + b) + valid(25, 0.5, 500);  // a branch from 20
  records += start("run", 40, a) + valid(50, 1, 50) + valid(55, 2, 45);  // back to a's 40
  // A rollback to step 50: a "branch" record (wall_s goes on), then the new line's 55.
  records += "{\"kind\": \"branch\", \"step\": 50, \"wall_s\": 2.5, \"lineage\": \"" + a +
             " " + c + "\"}\n" + valid(55, 3, 40);
  const fs::path file = root_ / "lines.jsonl";
  std::ofstream(file) << records;
  const ProcessResult read = valid_ppl_as_plotted(python, file);
  ASSERT_EQ(read.exit_code, 0) << read.output;
  EXPECT_EQ(read.output, "[(10, 1.0, 90), (20, 2.0, 80), (30, 3.0, 70), (40, 4.0, 60), "
                         "(50, 5.0, 50), (55, 7.0, 40)]\n");
}

// Validation values of two sets (a run record's valid_sha256 changes: a fine-tuning on new
// data) are not one curve: a NaN between them breaks the line (a helper's walk: one curve
// ran across both sets).
TEST_F(RunOutputs, PlotsBreakTheValidationCurveWhereTheValidationSetChanges) {
  std::string why_not;
  const std::string python = python_with("matplotlib", &why_not);
  if (python.empty()) GTEST_SKIP() << why_not;
  const auto valid = [](int step, int ppl) {
    return "{\"kind\": \"valid\", \"step\": " + std::to_string(step) + ", \"wall_s\": " +
           std::to_string(step / 10) + ", \"valid_ppl\": " + std::to_string(ppl) + "}\n";
  };
  const auto start = [](int step, const std::string& set) {
    return "{\"kind\": \"run\", \"step\": " + std::to_string(step) +
           ", \"wall_s\": 0, \"run\": \"a\", \"lineage\": \"0:aaaaaaaaaaaaaaaa\", "
           "\"valid_sha256\": \"" + set + "\"}\n";
  };
  const fs::path file = root_ / "two_sets.jsonl";
  std::ofstream(file) << start(0, "x") + valid(10, 90) + valid(20, 80) + start(20, "x") +
                             valid(30, 70) + start(30, "y") + valid(40, 160);
  const ProcessResult read = valid_ppl_as_plotted(python, file);
  ASSERT_EQ(read.exit_code, 0) << read.output;
  EXPECT_EQ(read.output, "[(10, 1.0, 90), (20, 2.0, 80), (30, 5.0, 70), (40, 9.0, nan), "
                         "(40, 9.0, 160)]\n");
}

// TensorBoard shows one line too: each process's start, and a rollback, write a session
// start at the step after the one it went on from, and TensorBoard's reader drops what was
// logged from there (a helper's walk: steps ..., 5, 6, 3, 4, a zig-zag, as PyTorch's
// SummaryWriter without purge_step gives).
TEST_F(RunOutputs, TensorBoardDropsTheStepsOfTheBranchAResumeLeft) {
  std::string why_not;
  const std::string python = python_with("tensorboard", &why_not);
  if (python.empty()) GTEST_SKIP() << why_not;
  const fs::path dir = root_ / "tensorboard_branch";
  const std::string train = trainer_command() + " --train.log_every=1 --train.valid_every=0 "
                            "--train.valid_bleu=false --checkpoint.every_steps=2 "
                            "--checkpoint.dir=" + dir.string();
  const ProcessResult first = run_process(train + " --train.max_steps=6");
  ASSERT_EQ(first.exit_code, 0) << first.output;
  const ProcessResult resumed = run_process(
      train + " --train.max_steps=4 --train.lr_scale=0.5 --checkpoint.resume=" +
      (dir / "step_00000002.h5").string());
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  const ProcessResult read =
      run_process(python + " " THPC_SOURCE_DIR "/tests/tensorboard_scalars.py " + dir.string());
  ASSERT_EQ(read.exit_code, 0) << read.output;
  std::vector<std::string> lr_steps;
  for (const std::string& line : lines_of(read.output)) {
    if (line.rfind("{", 0) != 0) continue;  // TensorBoard's own log lines
    const std::map<std::string, std::string> scalar = parse_record(line);
    if (scalar.at("tag") == "\"train/lr\"") lr_steps.push_back(scalar.at("step"));
  }
  EXPECT_EQ(lr_steps, (std::vector<std::string>{"1", "2", "3", "4"})) << read.output;
}

TEST_F(RunOutputs, PlotsOfAMissingOrMalformedMetricsFileAreAOneLineError) {
  std::string why_not;
  const std::string python = python_with("matplotlib", &why_not);
  if (python.empty()) GTEST_SKIP() << why_not;
  const std::string plot = python + " " THPC_SOURCE_DIR "/tools/plot_metrics.py --out " +
                           (root_ / "bad_plots").string() + " ";
  const std::string missing = (root_ / "no_such_run").string();
  ProcessResult result = run_process(plot + missing);
  EXPECT_EQ(result.exit_code, 1) << result.output;
  EXPECT_NE(result.output.find(missing + ": no such run directory"), std::string::npos)
      << result.output;
  EXPECT_EQ(lines_of(result.output).size(), 1u) << result.output;

  const fs::path malformed = root_ / "malformed.jsonl";
  std::ofstream(malformed) << "{\"kind\": \"train\", \"step\": 1, \"wall_s\": 0.5}\n{\"kind\": \"tr\n";
  result = run_process(plot + malformed.string());
  EXPECT_EQ(result.exit_code, 1) << result.output;
  EXPECT_NE(result.output.find(malformed.string() + ": line 2:"), std::string::npos) << result.output;
  EXPECT_EQ(lines_of(result.output).size(), 1u) << result.output;

  result = run_process(plot + malformed.string() + " --size 640");
  EXPECT_EQ(result.exit_code, 2) << result.output;
  EXPECT_NE(result.output.find("--size"), std::string::npos) << result.output;
  EXPECT_FALSE(fs::exists(root_ / "bad_plots")) << "a failed call wrote plots";
}

TEST_F(RunOutputs, AMetricsDirThatCannotBeCreatedIsAOneLineError) {
  const fs::path blocker = root_ / "a_file";
  std::ofstream(blocker) << "not a directory\n";
  const ProcessResult result = run_process(
      trainer_command() + " --train.max_steps=1 --checkpoint.dir=" +
      (root_ / "blocked/checkpoints").string() + " --train.metrics_dir=" + (blocker / "sub").string());
  // Found at start-up, where its lock is taken, as an unwritable checkpoint.dir is: exit 2
  // (before: exit 1 when the metrics file was opened, "cannot open the metrics file").
  EXPECT_EQ(result.exit_code, 2) << result.output;
  EXPECT_NE(result.output.find("the metrics directory " + (blocker / "sub").string() +
                               " (train.metrics_dir) cannot be written: " + blocker.string() +
                               " is no directory"),
            std::string::npos)
      << result.output;
  EXPECT_EQ(result.output.find("step 1/"), std::string::npos) << result.output;
}

// The files under `dir` with their sizes: what --eval must leave as it found.
std::map<std::string, uintmax_t> listing(const fs::path& dir) {
  std::map<std::string, uintmax_t> files;
  for (const auto& entry : fs::recursive_directory_iterator(dir)) {
    files[entry.path().string()] = entry.is_regular_file() ? entry.file_size() : 0;
  }
  return files;
}

// A record that cannot be written (here the file-size limit, as a full disk or quota, or
// a permission taken away) costs the records, not the run: one warning naming the file,
// the system's reason and the step, and no more writes (before: "(disk full?)", a guess,
// and the run ended without a checkpoint of its steps since the last; a helper's trial).
TEST_F(RunOutputs, AMetricsRecordThatCannotBeWrittenStopsTheRecordsNotTheRun) {
  const fs::path dir = root_ / "limited";
  fs::create_directories(dir);
  MetricsFile metrics((dir / "metrics.jsonl").string());
  std::ostringstream log;
  metrics.warn_on(log);
  const std::vector<LogField> fields = {{"loss", "loss", 2.5, "2.5"}};
  metrics.write("train", 1, 0.5, fields);
  const uintmax_t written = fs::file_size(dir / "metrics.jsonl");
  rlimit before{};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &before), 0);
  void (*const previous)(int) = std::signal(SIGXFSZ, SIG_IGN);  // EFBIG, not the signal
  rlimit limited = before;
  limited.rlim_cur = written + 40;  // the next record does not fit
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &limited), 0);
  for (int step = 2; step <= 5; ++step) EXPECT_NO_THROW(metrics.write("train", step, 1.0, fields));
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &before), 0);
  std::signal(SIGXFSZ, previous);
  EXPECT_NE(log.str().find("warning: cannot write the metrics file " +
                           (dir / "metrics.jsonl").string() + " (File too large): the "
                           "process's file-size limit (ulimit -f, or the batch system's) of "),
            std::string::npos)
      << log.str();
  EXPECT_NE(log.str().find("; training goes on without its records from step 2 on"),
            std::string::npos)
      << log.str();
  EXPECT_EQ(lines_of(log.str()).size(), 1u) << log.str();
  EXPECT_LE(fs::file_size(dir / "metrics.jsonl"), written + 40);
}

// The first record not written (here a resume's, a file-size limit reached by the metrics
// file before it): the start stops, exit 2, saying why and what to do (before: exit 1 with
// the system's reason alone, a helper's walk with a full metrics directory), and trains
// no step.
TEST_F(RunOutputs, AMetricsFileThatCannotTakeItsFirstRecordStopsTheStart) {
  const fs::path dir = root_ / "first_record";
  const std::string command = trainer_command() + " --checkpoint.every_steps=2" +
                              " --checkpoint.dir=" + dir.string();
  const ProcessResult first = run_process(command + " --train.max_steps=2");
  ASSERT_EQ(first.exit_code, 0) << first.output;
  // Blank lines (which readers pass over) up to 1 KiB short of an 8 MiB limit (MPI's start
  // needs 4 MiB): the run record, with the configuration, does not fit.
  const uintmax_t limit = 8u << 20;
  std::ofstream(dir / "metrics.jsonl", std::ios::app)
      << std::string(limit - fs::file_size(dir / "metrics.jsonl") - 1024, '\n');
  const ProcessResult refused =
      run_process("bash -c 'ulimit -f " + std::to_string(limit >> 10) + "; " + command +
                  " --train.max_steps=4 --checkpoint.resume=auto'");
  EXPECT_EQ(refused.exit_code, 2) << refused.output;
  EXPECT_NE(refused.output.find("error: cannot write the metrics file " +
                                (dir / "metrics.jsonl").string() + " (File too large): the "
                                "process's file-size limit (ulimit -f, or the batch system's)"),
            std::string::npos)
      << refused.output;
  EXPECT_NE(refused.output.find("(train.metrics_dir chooses where it goes)"), std::string::npos)
      << refused.output;
  EXPECT_FALSE(fs::exists(dir / "step_00000004.h5"));
}

// The run's directory deleted while it runs (by hand, a cleaning script): the records went
// on into the unlinked files and were lost with them (the checkpoints' lock check makes
// the directory again). Both files are made again, with a warning each.
TEST_F(RunOutputs, AMetricsFileRemovedDuringTheRunIsMadeAgain) {
  const fs::path dir = root_ / "removed" / "run";
  fs::create_directories(dir);
  MetricsFile metrics((dir / "metrics.jsonl").string());
  std::ostringstream log;
  metrics.warn_on(log);
  const std::vector<LogField> fields = {{"loss", "loss", 2.5, "2.5"}};
  metrics.write("train", 1, 0.5, fields);
  fs::remove_all(root_ / "removed");
  metrics.write("train", 2, 1.0, fields);
  metrics.write("train", 3, 1.5, fields);
  const std::vector<std::string> records = lines_of(read_file(dir / "metrics.jsonl"));
  ASSERT_EQ(records.size(), 2u);
  EXPECT_NE(records[0].find("\"step\": 2,"), std::string::npos) << records[0];
  const std::vector<std::string> warnings = lines_of(log.str());
  ASSERT_EQ(warnings.size(), 2u) << log.str();
  EXPECT_EQ(warnings[0], "warning: the metrics file " + (dir / "metrics.jsonl").string() +
                             " had been removed (the run's directory deleted or cleaned while "
                             "it ran?): made again from step 2 on; its records before are lost");
  EXPECT_EQ(warnings[1].rfind("warning: the TensorBoard event file had been removed", 0), 0u)
      << warnings[1];
  int event_files = 0;
  for (const auto& entry : fs::directory_iterator(dir)) {
    event_files += entry.path().filename().string().rfind("events.out.tfevents.", 0) == 0;
  }
  EXPECT_EQ(event_files, 1);
}

// The files replaced under their names while the run writes them (moved away and made
// again: a log rotation, a copy put back): the records went on into the files moved away,
// or unlinked and lost, without a word (the check looked at the names, not the files; a
// helper's trial). The names' new files take the records, with a warning each; a named
// pipe put there (whose open waits for a reader for ever) ends the records instead.
TEST_F(RunOutputs, AMetricsFileReplacedDuringTheRunIsTakenForAnother) {
  const fs::path dir = root_ / "replaced";
  fs::create_directories(dir);
  const fs::path metrics_path = dir / "metrics.jsonl";
  MetricsFile metrics(metrics_path.string());
  std::ostringstream log;
  metrics.warn_on(log);
  const std::vector<LogField> fields = {{"loss", "loss", 2.5, "2.5"}};
  metrics.write("train", 1, 0.5, fields);
  std::string events_path;
  for (const auto& entry : fs::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("events.out.tfevents.", 0) == 0) events_path = entry.path().string();
  }
  ASSERT_FALSE(events_path.empty());
  fs::rename(metrics_path, dir / "rotated.jsonl");
  std::ofstream(metrics_path).close();  // an empty file: a run's records may go in
  fs::rename(events_path, dir / "rotated.tfevents");
  std::ofstream(events_path) << "someone's";
  metrics.write("train", 2, 1.0, fields);
  std::vector<std::string> records = lines_of(read_file(metrics_path));
  ASSERT_EQ(records.size(), 1u) << log.str();
  EXPECT_NE(records[0].find("\"step\": 2,"), std::string::npos) << records[0];
  EXPECT_EQ(lines_of(read_file(dir / "rotated.jsonl")).size(), 1u);
  EXPECT_EQ(read_file(events_path), "someone's");
  std::vector<std::string> warnings = lines_of(log.str());
  ASSERT_EQ(warnings.size(), 2u) << log.str();
  EXPECT_EQ(warnings[0], "warning: the metrics file " + metrics_path.string() +
                             " had been replaced by another file (moved away or deleted, and "
                             "made again, while the run wrote it?): the records from step 2 "
                             "on are appended to that file; those before are not in it");
  EXPECT_EQ(warnings[1].rfind("warning: the TensorBoard event file " + events_path +
                                  " had been replaced by another file",
                              0),
            0u)
      << warnings[1];
  int event_files = 0;
  for (const auto& entry : fs::directory_iterator(dir)) {
    event_files += entry.path().filename().string().rfind("events.out.tfevents.", 0) == 0;
  }
  EXPECT_EQ(event_files, 2);  // someone's, and the run's new one

  // A named pipe in the metrics file's place: the records end (before: the next record's
  // open would have waited on it for ever).
  fs::remove(metrics_path);
  ASSERT_EQ(mkfifo(metrics_path.c_str(), 0644), 0);
  metrics.write("train", 3, 1.5, fields);
  metrics.write("train", 4, 2.0, fields);
  warnings = lines_of(log.str());
  ASSERT_EQ(warnings.size(), 3u) << log.str();
  EXPECT_EQ(warnings[2], "warning: the metrics file " + metrics_path.string() +
                             " was replaced by a named pipe while the run wrote it: move it "
                             "away; training goes on without its records from step 3 on (the "
                             "checkpoints and this log keep the run; resume to record again)");
}

// The summary record says how the run ended, which no number in it tells: a job script
// (jobs/common.sh) reads "stopped" to requeue a job whose ranks Slurm signalled without
// its batch shell hearing of it (srun's steps), which ended COMPLETED, unfinished.
TEST_F(RunOutputs, TheSummaryRecordSaysHowTheRunEnded) {
  struct Ending {
    std::string name, hooks, options, ended, signal;
  };
  const std::vector<Ending> endings = {
      {"signal", "THPC_TEST_STOP_AT_STEP=2", "", "stopped", "SIGTERM"},
      // The validation of step 2 worse than step 1's by far: patience 1 ends the run there.
      {"patience", "THPC_TEST_VALID_NLL_AT=2:50",
       " --train.valid_every=1 --checkpoint.keep_best=ppl --checkpoint.patience=1", "patience",
       ""},
      // 6 ms: the first step ends after it.
      {"time", "", " --train.max_minutes=0.0001", "time_limit", ""},
      // (at 3: the first step is always logged)
      {"divergence", "THPC_TEST_NAN_LOSS_AT=3", " --train.divergence=stop", "diverged", ""}};
  for (const Ending& ending : endings) {
    SCOPED_TRACE(ending.name);
    const fs::path dir = root_ / ("ended_" + ending.name);
    // (exported: the command starts with a cd)
    const ProcessResult run = run_process(
        (ending.hooks.empty() ? "" : "export " + ending.hooks + "; ") + trainer_command() +
        " --train.max_steps=4 --train.log_every=1000 --train.valid_bleu=false" +
        " --checkpoint.dir=" + dir.string() + ending.options);
    EXPECT_EQ(run.exit_code, ending.ended == "diverged" ? 4 : 0) << run.output;
    const std::vector<std::string> records = lines_of(read_file(dir / "metrics.jsonl"));
    ASSERT_FALSE(records.empty()) << run.output;
    const std::map<std::string, std::string> summary = parse_record(records.back());
    ASSERT_EQ(summary.at("kind"), "\"summary\"") << records.back();
    EXPECT_EQ(summary.at("ended"), "\"" + ending.ended + "\"") << records.back();
    const auto signal = summary.find("stop_signal");
    EXPECT_EQ(signal == summary.end() ? "" : signal->second,
              ending.signal.empty() ? "" : "\"" + ending.signal + "\"")
        << records.back();
    EXPECT_LT(std::stoi(summary.at("step")), 4) << records.back();
    // The last step trained has its train record (and progress line) however the run
    // ended, between two log_every steps (before: not when it diverged).
    ASSERT_GE(records.size(), 2u) << run.output;
    const std::map<std::string, std::string> last = parse_record(records[records.size() - 2]);
    EXPECT_EQ(last.at("kind"), "\"train\"") << records[records.size() - 2];
    EXPECT_EQ(last.at("step"), summary.at("step")) << records[records.size() - 2];
    EXPECT_NE(run.output.find("step " + summary.at("step") + "/4 | loss "), std::string::npos)
        << run.output;
    // ... once: a step logged at log_every and again at the stop was printed and recorded
    // twice (a mutation audit's `>=` for `>` passed every test).
    const std::string line = "step " + summary.at("step") + "/4 | loss ";
    EXPECT_EQ(run.output.find(line), run.output.rfind(line)) << run.output;
    int64_t previous = -1;
    for (const std::string& record : records) {
      const std::map<std::string, std::string> fields = parse_record(record);
      if (fields.at("kind") != "\"train\"") continue;
      EXPECT_GT(std::stoll(fields.at("step")), previous) << record;
      previous = std::stoll(fields.at("step"));
    }
  }
}

// The progress records' numbers agree with each other as docs/running.md defines them:
// ppl = exp(the loss without label smoothing: the loss itself at eps_ls = 0), each
// interval's ms/step its share of the elapsed time, eta the elapsed time per step so far
// times the steps left (0 at the end),
// the summary's tokens/s every interval's tokens over the training's wall time. Only
// their format was checked: a mutation audit's ppl of the smoothed loss, ms/step over one
// step more, eta never reaching 0 and a summary of the last interval's tokens all passed.
TEST_F(RunOutputs, TheProgressNumbersAgreeWithEachOther) {
  for (const char* smoothing : {"0", "0.1"}) {
    SCOPED_TRACE(smoothing);
    const fs::path dir = root_ / (std::string("numbers_") + smoothing);
    const ProcessResult run = run_process(
        trainer_command() + " --train.max_steps=6 --train.log_every=2 --train.valid_every=0"
        " --train.valid_bleu=false --model.label_smoothing=" + smoothing +
        " --checkpoint.dir=" + dir.string());
    ASSERT_EQ(run.exit_code, 0) << run.output;
    std::vector<std::map<std::string, double>> train;
    std::map<std::string, double> summary;
    for (const std::string& line : lines_of(read_file(dir / "metrics.jsonl"))) {
      std::map<std::string, double> numbers;
      const std::map<std::string, std::string> record = parse_record(line);
      for (const auto& [key, text] : record) {
        if (key != "kind" && text != "null" && text.front() != '"') numbers[key] = std::stod(text);
      }
      if (record.at("kind") == "\"train\"") train.push_back(numbers);
      if (record.at("kind") == "\"summary\"") summary = numbers;
    }
    ASSERT_EQ(train.size(), 3u) << run.output;
    double previous_elapsed = 0, tokens = 0;
    int64_t previous_step = 0;
    for (const std::map<std::string, double>& at : train) {
      const double step = at.at("step"), elapsed = at.at("elapsed_s");
      if (std::string(smoothing) == "0") {
        EXPECT_NEAR(at.at("ppl"), std::exp(at.at("loss")), 1e-9 * at.at("ppl"));
      } else {
        // The loss is smoothed, the perplexity not: they part.
        EXPECT_GT(std::abs(at.at("ppl") - std::exp(at.at("loss"))), 1e-6 * at.at("ppl"));
      }
      const double interval_s = elapsed - previous_elapsed;
      EXPECT_NEAR(at.at("ms_per_step"), 1000 * interval_s / (step - previous_step),
                  1e-6 * at.at("ms_per_step") + 1e-6);
      EXPECT_NEAR(at.at("eta_s"), elapsed / step * (6 - step), 1e-6 * elapsed + 1e-9);
      tokens += at.at("tgt_tokens_per_s") * interval_s;
      previous_elapsed = elapsed;
      previous_step = static_cast<int64_t>(step);
    }
    EXPECT_EQ(train.back().at("eta_s"), 0);
    EXPECT_GT(summary.at("tgt_tokens_per_s"), 0);
    EXPECT_NEAR(summary.at("tgt_tokens_per_s") * summary.at("train_wall_s"), tokens,
                1e-3 * tokens);
  }
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
    EXPECT_EQ(eval.output.find("note: settings that --eval reads"), std::string::npos)
        << eval.output;
    // The parameters' digest: the final: line's, for the last step's checkpoint.
    std::smatch digest;
    const std::regex evaluated(R"(\(step )" + step + R"(\) on .*; params_sha256=(\w{64})\n)");
    ASSERT_TRUE(std::regex_search(eval.output, digest, evaluated)) << eval.output;
    if (step == "4") {
      EXPECT_NE(run_.output.find("final: step=4 loss="), std::string::npos) << run_.output;
      EXPECT_NE(run_.output.find(" params_sha256=" + digest[1].str() + "\n"), std::string::npos)
          << run_.output;
    }
  }
  // Given another label smoothing than the run's (a sweep's base config), the loss is not
  // the one the run logged: said, naming the setting.
  const std::string checkpoint = (root_ / "run/checkpoints/step_00000004.h5").string();
  const ProcessResult other =
      run_process(trainer_command() + " --model.label_smoothing=0 --eval " + checkpoint);
  ASSERT_EQ(other.exit_code, 0) << other.output;
  EXPECT_NE(other.output.find("note: settings that --eval reads differ from those of the run "
                              "that wrote " + checkpoint + ": model.label_smoothing = 0 (was "
                              "0.1); the line below is this configuration's"),
            std::string::npos)
      << other.output;
  EXPECT_EQ(other.output.find("is an average"), std::string::npos) << other.output;
  EXPECT_EQ(listing(root_), before) << "--eval wrote or changed a file";
  // An average's step is its newest input's: said, so that its line is not read as the
  // one the run logged at that step.
  const fs::path average = root_ / "average_of_2_and_4.h5";
  const std::string two = (root_ / "run/checkpoints/step_00000002.h5").string();
  ASSERT_EQ(run_process(kBuild + "transformer_average --inputs " + two + " " + checkpoint +
                        " --output " + average.string())
                .exit_code,
            0);
  const ProcessResult averaged = run_process(trainer_command() + " --eval " + average.string());
  ASSERT_EQ(averaged.exit_code, 0) << averaged.output;
  EXPECT_NE(averaged.output.find("note: " + average.string() + " is an average (of " + two +
                                 " (step 2, run "),
            std::string::npos)
      << averaged.output;
  EXPECT_NE(averaged.output.find("): step 4 is its newest input's, and the line below is the "
                                 "average's\nvalid step 4 | "),
            std::string::npos)
      << averaged.output;
  fs::remove(average);
}

// transformer_hpc --show-checkpoint: what a checkpoint records of its run, without h5py
// (a helper's walks found the settings in HDF5 attributes alone, and no way to check a
// file against a log's params_sha256): comment lines, then the stored configuration
// headed by what ran it, an ini file that trains the run again.
TEST_F(RunOutputs, ShowCheckpointPrintsWhatItRecordsAsAnIniFileThatTrainsItAgain) {
  ASSERT_EQ(run_.exit_code, 0) << run_.output;
  const std::string checkpoint = (root_ / "run/checkpoints/step_00000004.h5").string();
  const ProcessResult shown =
      run_process(kBuild + "transformer_hpc --show-checkpoint " + checkpoint);
  ASSERT_EQ(shown.exit_code, 0) << shown.output;
  const std::vector<std::string> lines = lines_of(shown.output);
  ASSERT_GT(lines.size(), 10u) << shown.output;
  EXPECT_EQ(lines[0].rfind("# checkpoint " + checkpoint + ": step 4, healthy, loss ", 0), 0u)
      << shown.output;
  EXPECT_EQ(lines[1].rfind("# architecture layers=2 d_model=64 ", 0), 0u) << shown.output;
  const std::regex run_line(R"(\n# run [0-9a-f]{16}, lineage 0:[0-9a-f]{16}, 1 rank, seed 1, )"
                            R"(data epoch \d+ \(index \d+\)\n)");
  EXPECT_TRUE(std::regex_search(shown.output, run_line)) << shown.output;
  // The digest the run's final: line printed.
  std::smatch final;
  ASSERT_TRUE(std::regex_search(run_.output, final, std::regex("params_sha256=(\\w{64})")));
  EXPECT_NE(shown.output.find("\n# params_sha256=" + final[1].str() + "\n"), std::string::npos)
      << shown.output;
  EXPECT_NE(shown.output.find("\n# written by: transformer_hpc " +
                              std::string(source_version()) + "\n# computed by: cpu-fp32, "),
            std::string::npos)
      << shown.output;
  EXPECT_NE(shown.output.find("\n# command line: --train.max_steps=4 --train.log_every=2 "),
            std::string::npos)
      << shown.output;
  // An ini file: read as a configuration, it is the one the checkpoint stores, but for the
  // keys that name the run's own files, commented out (a run from it in someone else's
  // directory resumed their run, or deleted it with checkpoint.overwrite).
  EXPECT_NE(shown.output.find("\n# dir = " + (root_ / "run/checkpoints").string() +
                              "  (the run's own)\n"),
            std::string::npos)
      << shown.output;
  const fs::path ini = root_ / "shown.ini";
  std::ofstream(ini) << shown.output;
  const Config config = load_config(ini.string());
  std::set<std::string> differing;
  for (const ConfigDifference& difference :
       config_differences(config.to_ini(), read_checkpoint(checkpoint).config_ini)) {
    differing.insert(difference.key);
  }
  EXPECT_EQ(differing, std::set<std::string>{"checkpoint.dir"});
  // ... which trains the run again, in the working directory it names: the same digest.
  const ProcessResult again =
      run_process("cd " THPC_SOURCE_DIR " && " + kBuild + "transformer_hpc " + ini.string() +
                  " --checkpoint.dir=" + (root_ / "again").string());
  ASSERT_EQ(again.exit_code, 0) << again.output;
  EXPECT_NE(again.output.find("final: step=4 loss="), std::string::npos) << again.output;
  EXPECT_NE(again.output.find(" params_sha256=" + final[1].str() + "\n"), std::string::npos)
      << again.output;
  // An int8 copy names its float source, by path and parameters, at the head of its
  // configuration, and says it is quantized.
  const fs::path int8 = root_ / "int8.h5";
  ASSERT_EQ(run_process(kBuild + "transformer_quantize --checkpoint " + checkpoint +
                        " --output " + int8.string())
                .exit_code,
            0);
  const ProcessResult shown_int8 =
      run_process(kBuild + "transformer_hpc --show-checkpoint " + int8.string());
  ASSERT_EQ(shown_int8.exit_code, 0) << shown_int8.output;
  EXPECT_NE(shown_int8.output.find(": step 4, healthy, quantized\n"), std::string::npos)
      << shown_int8.output;
  EXPECT_NE(shown_int8.output.find("\n# quantized from: " + checkpoint + " (step 4, " +
                                   "params_sha256 " + final[1].str() + ")\n"),
            std::string::npos)
      << shown_int8.output;
  // Wrongly used: one line, and no other output.
  const ProcessResult missing =
      run_process(kBuild + "transformer_hpc --show-checkpoint " + (root_ / "none.h5").string());
  EXPECT_EQ(missing.exit_code, 1) << missing.output;
  EXPECT_EQ(lines_of(missing.output).size(), 1u) << missing.output;
  EXPECT_NE(missing.output.find("none.h5: no such file"), std::string::npos) << missing.output;
  const ProcessResult more =
      run_process(kBuild + "transformer_hpc --show-checkpoint " + checkpoint + " extra.ini");
  EXPECT_EQ(more.exit_code, 2) << more.output;
  EXPECT_NE(more.output.find("--show-checkpoint takes one checkpoint file and nothing else"),
            std::string::npos)
      << more.output;
}

// A model's recipient has the checkpoint alone, no .model file: transformer_preprocess
// --spm-model takes the model a checkpoint stores, and the shards it writes are ones the
// checkpoint scores and fine-tunes on (the refusal's advice, "preprocess with the
// checkpoint's model", could not be followed: "not a SentencePiece model"; a helper's walk).
TEST_F(RunOutputs, PreprocessTakesTheSentencePieceModelACheckpointStores) {
  ASSERT_EQ(run_.exit_code, 0) << run_.output;
  const std::string checkpoint = (root_ / "run/checkpoints/step_00000004.h5").string();
  const fs::path again = root_ / "with_its_model";
  const std::string text = (root_ / "text").string();
  const ProcessResult preprocessed = run_process(
      kBuild + "transformer_preprocess --source-lang en --target-lang de --trainpref " + text +
      "/train --validpref " + text + "/valid --destdir " + again.string() + " --spm-model " +
      checkpoint);
  ASSERT_EQ(preprocessed.exit_code, 0) << preprocessed.output;
  EXPECT_NE(preprocessed.output.find("note: --spm-model " + checkpoint + ": the SentencePiece "
                                     "model stored in the checkpoint"),
            std::string::npos)
      << preprocessed.output;
  EXPECT_EQ(read_file(again / "spm.model"), read_checkpoint(checkpoint).spm_model);
  const ProcessResult eval = run_process(kBuild + "transformer_hpc " THPC_SOURCE_DIR
                                         "/input/numbers.ini --data.dir=" + again.string() +
                                         " --eval " + checkpoint);
  EXPECT_EQ(eval.exit_code, 0) << eval.output;
  // A checkpoint without one (the synthetic task's) is refused, saying what to give.
  const fs::path synthetic = root_ / "synthetic";
  ASSERT_EQ(run_process(kBuild + "transformer_hpc " THPC_SOURCE_DIR "/input/tiny.ini "
                        "--train.max_steps=1 --checkpoint.dir=" + synthetic.string())
                .exit_code,
            0);
  const ProcessResult without = run_process(
      kBuild + "transformer_preprocess --source-lang en --target-lang de --trainpref " + text +
      "/train --validpref " + text + "/valid --destdir " + (root_ / "none").string() +
      " --spm-model " +
      (synthetic / "step_00000001.h5").string());
  EXPECT_EQ(without.exit_code, 1) << without.output;
  EXPECT_NE(without.output.find("a checkpoint that stores no SentencePiece model"),
            std::string::npos)
      << without.output;
}

// A fine-tuning's checkpoints name the model it began from (checkpoint.init's path alone
// was kept, as given: a helper's walk as a model's recipient), and its resumes' too.
TEST_F(RunOutputs, AFineTuningsCheckpointsNameTheModelItBeganFrom) {
  ASSERT_EQ(run_.exit_code, 0) << run_.output;
  const std::string base = (root_ / "run/checkpoints/step_00000004.h5").string();
  const fs::path tuned = root_ / "tuned";
  const std::string tune = trainer_command() + " --checkpoint.init=" + base +
                           " --checkpoint.every_steps=1 --checkpoint.dir=" + tuned.string();
  ASSERT_EQ(run_process(tune + " --train.max_steps=1").exit_code, 0);
  const ProcessResult resumed = run_process(tune + " --train.max_steps=2 --checkpoint.resume=auto");
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  std::smatch final;
  ASSERT_TRUE(std::regex_search(run_.output, final, std::regex("params_sha256=(\\w{64})")));
  const std::string run_id = read_checkpoint(base).run_id;
  for (const char* step : {"step_00000001.h5", "step_00000002.h5"}) {
    EXPECT_EQ(ini_header_value(read_checkpoint((tuned / step).string()).config_ini,
                               kInitialisedFrom),
              base + " (step 4, run " + run_id + ", params_sha256 " + final[1].str() + ")")
        << step;
  }
}

// The dry run of a resume says what the resume will say of what changed: the settings
// that differ from the checkpoint's run, and the learning rate's jump (it said none, and
// a sweep's changed resume looked like its run's continuation: a helper's sweep).
TEST_F(RunOutputs, TheDryRunOfAResumeNamesTheSettingsThatDiffer) {
  ASSERT_EQ(run_.exit_code, 0) << run_.output;
  const auto before = listing(root_);
  const ProcessResult dry = run_process(
      trainer_command() + " --train.max_steps=6 --train.log_every=2 --train.valid_every=2" +
      " --checkpoint.every_steps=2 --train.lr_scale=0.5 --checkpoint.resume=auto" +
      " --checkpoint.dir=" + (root_ / "run/checkpoints").string() + " --dry-run");
  ASSERT_EQ(dry.exit_code, 0) << dry.output;
  EXPECT_NE(dry.output.find("\n# note: 2 settings differ from the run that wrote the "
                            "checkpoint, from this step on: train.max_steps = 6 (was 4), "
                            "train.lr_scale = 0.5 (was 1)\n"),
            std::string::npos)
      << dry.output;
  EXPECT_NE(dry.output.find("\n# note: the learning rate of step 5 is "), std::string::npos)
      << dry.output;
  EXPECT_EQ(listing(root_), before) << "the dry run wrote or changed a file";
}

// A checkpoint records the direction of its shards (one vocabulary serves both, so the
// vocabulary does not tell them apart), and --eval on validation shards of the other
// direction, made with the same SentencePiece model, is refused naming both (before: it
// scored an en->de model on de->en pairs, exit 0).
TEST_F(RunOutputs, CheckpointsRecordTheirDirectionAndEvalRefusesShardsOfTheOther) {
  ASSERT_EQ(run_.exit_code, 0) << run_.output;
  const std::string checkpoint = (root_ / "run/checkpoints/step_00000004.h5").string();
  EXPECT_EQ(read_checkpoint(checkpoint, CheckpointParts::ParamsOnly).direction, "en->de");
  const fs::path reversed = root_ / "data_deen";
  const ProcessResult made = run_process(
      kBuild + "transformer_preprocess --source-lang de --target-lang en --trainpref " +
      (root_ / "text/train").string() + " --validpref " + (root_ / "text/valid").string() +
      " --spm-model " + (root_ / "data/spm.model").string() + " --destdir " +
      reversed.string());
  ASSERT_EQ(made.exit_code, 0) << made.output;
  const ProcessResult eval = run_process("cd " THPC_SOURCE_DIR " && " + kBuild +
                                         "transformer_hpc input/numbers.ini --data.dir=" +
                                         reversed.string() + " --eval " + checkpoint);
  EXPECT_EQ(eval.exit_code, 1) << eval.output;
  EXPECT_NE(eval.output.find("checkpoint " + checkpoint + ": trained en->de, but the valid "
                             "shards of " + reversed.string() + " are de->en"),
            std::string::npos)
      << eval.output;
  fs::remove_all(reversed);
}

// The validation line's numbers recomputed without the trainer's validation pass (its
// reader, batching, sums over ranks and formatting): the checkpoint's parameters in a
// model of their own, the validation shards read directly, every pair a batch of its
// own, the sums in double here. metrics.jsonl holds the line's values at full precision.
TEST_F(RunOutputs, ValidationLossAndPerplexityEqualAnIndependentPairByPairComputation) {
  ASSERT_EQ(run_.exit_code, 0) << run_.output;
  std::map<std::string, std::map<std::string, std::string>> logged;  // step -> record
  for (const std::string& line : lines_of(read_file(root_ / "run/checkpoints/metrics.jsonl"))) {
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

// A checkpoint.dir whose name is not UTF-8 (a path is bytes): its record's path had the
// raw byte, so metrics.jsonl was not UTF-8 and Python's json (tools/plot_metrics.py)
// failed on it (a helper's trial). The byte is written \udcXX (Python's surrogateescape)
// and read back as the byte: the run resumes in that directory with its metrics file.
TEST_F(RunOutputs, ARunDirectoryNamedInBytesThatAreNotUtf8KeepsItsMetricsFileUtf8) {
  const fs::path directory = root_ / "latin1_\xe9t\xe9";
  const std::string train = trainer_command() + " --train.valid_every=2 --checkpoint.dir='" +
                            directory.string() + "' --checkpoint.every_steps=2";
  const ProcessResult first = run_process(train + " --train.max_steps=2");
  ASSERT_EQ(first.exit_code, 0) << first.output;
  const ProcessResult resumed =
      run_process(train + " --train.max_steps=4 --checkpoint.resume=auto");
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("summary: steps 2 (2 to 4)"), std::string::npos)
      << resumed.output;
  const std::string text = read_file(directory / "metrics.jsonl");
  EXPECT_TRUE(metrics::decode_utf8(text).has_value()) << text;
  EXPECT_NE(text.find("latin1_\\udce9t\\udce9\""), std::string::npos) << text;
  EXPECT_EQ(MetricsFile::last_run_checkpoint_dir((directory / "metrics.jsonl").string()),
            directory.lexically_normal().string());
  // Plotted too: the directory's name is the legend's, its byte drawn as U+FFFD
  // (matplotlib failed on the surrogate Python's os.fsdecode made of it).
  std::string why_not;
  const std::string python = python_with("matplotlib", &why_not);
  if (python.empty()) GTEST_SKIP() << why_not;
  const ProcessResult plot =
      run_process(python + " " THPC_SOURCE_DIR "/tools/plot_metrics.py '" + directory.string() +
                  "' --out " + (root_ / "latin1_plots").string() + " --size 320x240");
  EXPECT_EQ(plot.exit_code, 0) << plot.output;
  EXPECT_TRUE(fs::exists(root_ / "latin1_plots" / "loss_step.png")) << plot.output;
}

// A run directory named with a tab and an escape byte 0x1b (a newline is refused: an ini value
// cannot hold it): every metrics.jsonl line is one JSON
// object that Python's json reads, and the recorded directory comes back whole (a
// mutation audit's escape of only the bytes below 0x0a wrote the tab raw and passed).
TEST_F(RunOutputs, ARunDirectoryNamedWithControlCharactersKeepsEveryRecordJson) {
  const fs::path directory = root_ / "tab\tand\x1bone";
  const ProcessResult run = run_process(trainer_command() + " --train.max_steps=1 "
                                        "--train.valid_every=0 --train.valid_bleu=false "
                                        "--checkpoint.dir='" +
                                        directory.string() + "'");
  ASSERT_EQ(run.exit_code, 0) << run.output;
  const std::string metrics = (directory / "metrics.jsonl").string();
  const ProcessResult parsed = run_process(
      python_interpreter().path + " -c 'import json, sys\n"
      "for line in open(sys.argv[1], encoding=\"utf-8\"):\n"
      "    record = json.loads(line)\n"
      "    if record[\"kind\"] == \"run\": print(repr(record[\"checkpoint_dir\"]))' '" +
      metrics + "'");
  EXPECT_EQ(parsed.exit_code, 0) << parsed.output;
  EXPECT_NE(parsed.output.find("tab\\tand\\x1bone'"), std::string::npos) << parsed.output;
  EXPECT_EQ(MetricsFile::last_run_checkpoint_dir(metrics), directory.lexically_normal().string());
}

// Validation shards replaced between a run and its resume (re-preprocessed, another
// data.valid): the checkpoint names the ones its best values were scored on, and the
// resume starts the best values, best.h5 and checkpoint.patience afresh, saying so. Before,
// the new set's scores were ranked against the old set's best, and patience stopped the
// run without a word (a helper's trial).
TEST_F(RunOutputs, OtherValidationShardsAtAResumeStartTheBestValuesAfresh) {
  const fs::path data = root_ / "data_other_valid";
  fs::remove_all(data);
  fs::copy(root_ / "data", data);
  const std::string text = (root_ / "text").string();
  const ProcessResult other = run_process(
      "head -n 30 " + text + "/valid.en > " + text + "/half.en && head -n 30 " + text +
      "/valid.de > " + text + "/half.de && " + kBuild + "transformer_preprocess --source-lang en "
      "--target-lang de --trainpref " + text + "/train --validpref " + text + "/half --destdir " +
      (root_ / "half").string() + " --spm-model " + (root_ / "data/spm.model").string() +
      " --seed 1 && cp " + (root_ / "half/valid.00000.h5").string() + " " + data.string());
  ASSERT_EQ(other.exit_code, 0) << other.output;
  const std::string train =
      "cd " THPC_SOURCE_DIR " && " + kBuild + "transformer_hpc input/numbers.ini "
      "--train.valid_every=2 --checkpoint.keep_best=ppl --checkpoint.every_steps=2 "
      "--checkpoint.keep_best_count=2 --checkpoint.average_best=2 --checkpoint.dir=" +
      (root_ / "other_valid").string();
  const ProcessResult first =
      run_process(train + " --data.dir=" + (root_ / "data").string() + " --train.max_steps=2");
  ASSERT_EQ(first.exit_code, 0) << first.output;
  const ProcessResult same = run_process(train + " --data.dir=" + (root_ / "data").string() +
                                         " --train.max_steps=4 --checkpoint.resume=auto");
  ASSERT_EQ(same.exit_code, 0) << same.output;
  EXPECT_EQ(same.output.find("validation shards under data.dir are not"), std::string::npos)
      << same.output;
  const ProcessResult resumed = run_process(train + " --data.dir=" + data.string() +
                                            " --train.max_steps=6 --checkpoint.resume=auto");
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("warning: the validation shards under data.dir are not those "
                                "the checkpoint's run scored"),
            std::string::npos)
      << resumed.output;
  // The new set's first validation is the best one, whatever its score beside the old.
  EXPECT_NE(resumed.output.find("best checkpoint "), std::string::npos) << resumed.output;
  EXPECT_NE(resumed.output.find("best valid ppl"), std::string::npos) << resumed.output;
  EXPECT_NE(resumed.output.find("(step 6)"), std::string::npos) << resumed.output;
  // The kept best of the old set (steps 2 and 4) and its best.h5 went aside, kept whole:
  // before, the new set's scores were ranked against theirs (a worse set never got in, and
  // average_best2 averaged the old set's steps while best.h5 named a new one), and best.h5
  // was replaced.
  const fs::path run = root_ / "other_valid";
  std::vector<std::string> aside;
  for (const fs::directory_entry& entry : fs::directory_iterator(run)) {
    if (entry.path().filename().string().rfind("best_of_valid_", 0) != 0) continue;
    for (const fs::directory_entry& file : fs::directory_iterator(entry.path())) {
      aside.push_back(file.path().filename().string());
    }
  }
  std::sort(aside.begin(), aside.end());
  EXPECT_EQ(aside, (std::vector<std::string>{"best.h5", "best_step_00000002.h5",
                                            "best_step_00000004.h5"}))
      << resumed.output;
  EXPECT_TRUE(fs::exists(run / "best_step_00000006.h5")) << resumed.output;
  EXPECT_TRUE(fs::exists(run / "best.h5")) << resumed.output;
  // The average of the best is this set's alone: step 6, the one validation of the new set.
  EXPECT_NE(resumed.output.find("warning: average of the 1 best checkpoint by valid ppl (fewer "
                                "than checkpoint.average_best = 2"),
            std::string::npos)
      << resumed.output;
  EXPECT_NE(resumed.output.find("moved "), std::string::npos) << resumed.output;
}

TEST_F(RunOutputs, EvalOfAMissingCheckpointWithoutAFileOrAWideBeamIsAOneLineError) {
  const std::string missing = (root_ / "no_such.h5").string();
  const ProcessResult result = run_process(trainer_command() + " --eval " + missing);
  EXPECT_NE(result.exit_code, 0) << result.output;
  EXPECT_NE(result.output.find(missing), std::string::npos) << result.output;
  EXPECT_EQ(lines_of(result.output).size(), 1u) << result.output;

  // Named as the program's option (it read "CONFIG: eval: missing value", as for a key).
  const ProcessResult no_file = run_process(trainer_command() + " --eval");
  EXPECT_EQ(no_file.exit_code, 2) << no_file.output;
  EXPECT_NE(no_file.output.find("transformer_hpc: --eval: needs a checkpoint file (--eval FILE)"),
            std::string::npos)
      << no_file.output;
  // Without data.dir: the configuration's mistake, exit 2 (it was 1, a runtime failure).
  const ProcessResult no_data = run_process(thpc::binary_dir() +
                                            "/transformer_hpc " THPC_SOURCE_DIR
                                            "/input/tiny.ini --eval " + missing);
  EXPECT_EQ(no_data.exit_code, 2) << no_data.output;
  EXPECT_NE(no_data.output.find("--eval scores the validation shards: set data.dir"),
            std::string::npos)
      << no_data.output;
  // A config that validates says so too, not "(or train.valid_every = 0)", which --eval
  // refused again (a helper's trial).
  const ProcessResult validating =
      run_process("cd " THPC_SOURCE_DIR " && " + kBuild +
                  "transformer_hpc input/numbers.ini --data.dir= --eval " + missing);
  EXPECT_EQ(validating.exit_code, 2) << validating.output;
  EXPECT_NE(validating.output.find("data.dir (on the command line): empty: --eval scores the "
                                   "validation shards"),
            std::string::npos)
      << validating.output;
  EXPECT_EQ(validating.output.find("valid_every"), std::string::npos) << validating.output;
  // A validation search training refuses, refused alike, before the checkpoint is read:
  // --eval ran a beam of 5,000 for minutes and gigabytes, exit 0 (a helper's trial).
  const ProcessResult wide_beam = run_process(trainer_command() + " --eval " + missing +
                                              " --train.valid_bleu=true "
                                              "--train.valid_beam=100000");
  EXPECT_EQ(wide_beam.exit_code, 2) << wide_beam.output;
  EXPECT_NE(wide_beam.output.find("train.valid_beam 100000 (on the command line) is wider "
                                  "than the "),
            std::string::npos)
      << wide_beam.output;
  EXPECT_EQ(lines_of(wide_beam.output).size(), 1u) << wide_beam.output;
}

}  // namespace
}  // namespace thpc
