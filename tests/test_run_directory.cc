// A run owns its directory: a new run (no checkpoint.resume) in a checkpoint directory or
// metrics file that holds another run's files stops before it writes anything (exit 2)
// unless checkpoint.overwrite says to delete them; a resumed run appends to its own
// metrics only, each process's records start with a "run" record naming the run, and a
// partial last line left by a crash is removed before anything is appended.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "program.h"
#include "scratch_directory.h"

namespace thpc {
namespace {

namespace fs = std::filesystem;

const std::string kTrainer = std::string(THPC_BINARY_DIR) + "/transformer_hpc " +
                             THPC_SOURCE_DIR + "/input/tiny.ini --model.layers=1 "
                             "--train.log_every=1 --checkpoint.minutes=0 ";

class RunDirectory : public ScratchDirectoryTest {
 protected:
  // The trainer with checkpoints in RUN/checkpoints (metrics in RUN) and `args`.
  ProcessResult train(const std::string& run, const std::string& args) const {
    return run_process(kTrainer + "--checkpoint.dir=" + (directory_ / run / "checkpoints").string() +
                       " " + args);
  }

  // Every file under `dir` with its bytes.
  static std::map<std::string, std::string> contents(const fs::path& dir) {
    std::map<std::string, std::string> files;
    for (const fs::directory_entry& entry : fs::recursive_directory_iterator(dir)) {
      if (entry.is_regular_file()) files[entry.path().string()] = read_file(entry.path());
    }
    return files;
  }

  // The "run" values of the metrics file's run records, in order.
  static std::vector<std::string> run_records(const fs::path& metrics) {
    std::vector<std::string> runs;
    const std::regex record(R"re(^\{"kind": "run", "step": \d+, .*"run": "([0-9a-f]{16})")re");
    for (const std::string& line : lines_of(read_file(metrics))) {
      std::smatch match;
      if (std::regex_search(line, match, record)) runs.push_back(match[1]);
    }
    return runs;
  }

};

TEST_F(RunDirectory, ANewRunInAUsedDirectoryStopsAndTouchesNothing) {
  const ProcessResult first = train("run", "--train.max_steps=3");
  ASSERT_EQ(first.exit_code, 0) << first.output;
  const std::map<std::string, std::string> before = contents(directory_);
  ASSERT_GE(before.size(), 3u);  // the checkpoint, metrics.jsonl, the event file

  // The same command again: a new run of its own, not a continuation.
  const ProcessResult second = train("run", "--train.max_steps=5 --train.seed=2");
  EXPECT_EQ(second.exit_code, 2) << second.output;
  const std::string checkpoints = (directory_ / "run" / "checkpoints").string();
  EXPECT_NE(second.output.find("checkpoint.dir " + checkpoints + " and the directory of its "
                               "metrics file " + (directory_ / "run" / "metrics.jsonl").string() +
                               " hold 3 files of another run ("),
            std::string::npos)
      << second.output;
  EXPECT_NE(second.output.find(checkpoints + "/step_00000003.h5"), std::string::npos);
  EXPECT_NE(second.output.find("set checkpoint.overwrite = true"), std::string::npos);
  EXPECT_EQ(second.output.find("step 1/"), std::string::npos) << second.output;
  EXPECT_EQ(contents(directory_), before);
  // One line, no source location: the user's mistake, not the program's.
  EXPECT_EQ(second.output.find("check failed"), std::string::npos);

  // A metrics file of another run alone is refused too (a shared train.metrics_dir).
  const ProcessResult elsewhere =
      train("other", "--train.max_steps=2 --train.metrics_dir=" + (directory_ / "run").string());
  EXPECT_EQ(elsewhere.exit_code, 2) << elsewhere.output;
  EXPECT_NE(elsewhere.output.find((directory_ / "run" / "metrics.jsonl").string()), std::string::npos)
      << elsewhere.output;
}

TEST_F(RunDirectory, OverwriteDeletesTheEarlierRunsFilesFirst) {
  ASSERT_EQ(train("run", "--train.max_steps=4 --checkpoint.every_steps=2").exit_code, 0);
  const ProcessResult second =
      train("run", "--train.max_steps=3 --train.seed=2 --checkpoint.overwrite=true");
  ASSERT_EQ(second.exit_code, 0) << second.output;
  EXPECT_NE(second.output.find("step_00000004.h5, a file of an earlier run "
                               "(checkpoint.overwrite = true)"),
            std::string::npos)
      << second.output;
  const std::string checkpoints = (directory_ / "run" / "checkpoints").string();
  EXPECT_EQ(list_checkpoints(checkpoints),
            std::vector<std::string>{checkpoints + "/step_00000003.h5"});
  // The metrics hold the new run only: one run record, the new checkpoint's run.
  const std::vector<std::string> runs = run_records(directory_ / "run" / "metrics.jsonl");
  ASSERT_EQ(runs.size(), 1u);
  EXPECT_EQ(runs[0], read_checkpoint(checkpoints + "/step_00000003.h5").run_id);
}

TEST_F(RunDirectory, AResumedRunAppendsToItsOwnFilesAndRefusesAnotherRuns) {
  ASSERT_EQ(train("a", "--train.max_steps=3").exit_code, 0);
  ASSERT_EQ(train("b", "--train.max_steps=3 --train.seed=2").exit_code, 0);
  // Resuming a's checkpoint into b's directory would prune b's and mix the metrics.
  const std::string a_checkpoint = (directory_ / "a" / "checkpoints" / "step_00000003.h5").string();
  const ProcessResult mixed = train(
      "b", "--train.max_steps=5 --checkpoint.resume=" + a_checkpoint);
  EXPECT_EQ(mixed.exit_code, 2) << mixed.output;
  EXPECT_NE(mixed.output.find("of another run than the one resumed from " + a_checkpoint),
            std::string::npos)
      << mixed.output;
  // Its own directory, however it is named: resume=auto, and resume=PATH.
  const ProcessResult resumed = train("a", "--train.max_steps=5 --checkpoint.resume=auto");
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  const ProcessResult again = train(
      "a", "--train.max_steps=6 --checkpoint.resume=" +
               (directory_ / "a" / "checkpoints" / "step_00000005.h5").string());
  ASSERT_EQ(again.exit_code, 0) << again.output;
  const std::vector<std::string> runs = run_records(directory_ / "a" / "metrics.jsonl");
  ASSERT_EQ(runs.size(), 3u);
  EXPECT_EQ(runs[0], runs[1]);
  EXPECT_EQ(runs[1], runs[2]);
  EXPECT_NE(runs[0], run_records(directory_ / "b" / "metrics.jsonl").at(0));
}

TEST_F(RunDirectory, APartialLastMetricsLineIsRemovedBeforeAppending) {
  ASSERT_EQ(train("run", "--train.max_steps=2").exit_code, 0);
  const fs::path metrics = directory_ / "run" / "metrics.jsonl";
  const std::string whole = read_file(metrics);
  // What a crash in the middle of a write leaves.
  std::ofstream(metrics, std::ios::app) << "{\"kind\": \"train\", \"step\": 3, \"wall";
  const ProcessResult resumed = train("run", "--train.max_steps=3 --checkpoint.resume=auto");
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("note: removed a partial last line of 34 bytes from " +
                                metrics.string() + " (a write cut short)"),
            std::string::npos)
      << resumed.output;
  const std::string text = read_file(metrics);
  EXPECT_EQ(text.rfind(whole, 0), 0u);  // what was whole stays
  for (const std::string& line : lines_of(text)) {
    EXPECT_EQ(line.front(), '{') << line;
    EXPECT_EQ(line.back(), '}') << line;
  }
}

}  // namespace
}  // namespace thpc
