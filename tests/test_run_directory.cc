// A run owns its directory: checkpoint.dir holds its checkpoints, metrics.jsonl and event
// file (train.metrics_dir puts the last two elsewhere). A new run (no checkpoint.resume)
// in a checkpoint directory or metrics file that holds another run's files stops before
// it writes anything (exit 2)
// unless checkpoint.overwrite says to delete them; a resumed run appends to its own
// metrics only, each process's records start with a "run" record naming the run, and a
// partial last line left by a crash is removed before anything is appended.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <iomanip>
#include <sstream>

#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "checkpoint/checkpoint_directory.h"
#include "common/error.h"
#include "program.h"
#include "scoped_environment.h"
#include "train/checkpoint_keeping.h"
#include "train/run_directory.h"
#include "scratch_directory.h"

namespace thpc {
namespace {

namespace fs = std::filesystem;

const std::string kTrainer = thpc::binary_dir() + "/transformer_hpc " +
                             THPC_SOURCE_DIR + "/input/tiny.ini --model.layers=1 "
                             "--train.log_every=1 --checkpoint.minutes=0 ";

class RunDirectory : public ScratchDirectoryTest {
 protected:
  // The trainer with checkpoints (and metrics) in RUN/checkpoints and `args`.
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
                               "metrics file " + (directory_ / "run" / "checkpoints" / "metrics.jsonl").string() +
                               " hold 3 files of another run ("),
            std::string::npos)
      << second.output;
  EXPECT_NE(second.output.find(checkpoints + "/step_00000003.h5"), std::string::npos);
  EXPECT_NE(second.output.find("set checkpoint.overwrite = true"), std::string::npos);
  EXPECT_EQ(second.output.find("step 1/"), std::string::npos) << second.output;
  EXPECT_EQ(contents(directory_), before);
  // One line, no source location: the user's mistake, not the program's.
  EXPECT_EQ(second.output.find("check failed"), std::string::npos);

  // Its directory as another run's train.metrics_dir is refused too, as another run's
  // checkpoint.dir (AnotherRunsCheckpointDirectoryIsNoMetricsDirectory; a metrics file of
  // another run alone: NothingToResumeIsANewRunInAnotherRunsMetricsDirectory).
  const ProcessResult elsewhere = train(
      "other", "--train.max_steps=2 --train.metrics_dir=" + (directory_ / "run" / "checkpoints").string());
  EXPECT_EQ(elsewhere.exit_code, 2) << elsewhere.output;
  EXPECT_NE(elsewhere.output.find("holds 1 checkpoint file of another run (" + checkpoints +
                                  "/step_00000003.h5)"),
            std::string::npos)
      << elsewhere.output;
  EXPECT_EQ(contents(directory_), before);
}

// Another run's checkpoint.dir as train.metrics_dir, where that run kept its metrics
// elsewhere (a helper's walk: accepted, and the second run's metrics.jsonl and events sat
// beside the first's step files, plotted as the first's): refused before anything is
// written, with or without checkpoint.overwrite, which deletes nothing of it.
TEST_F(RunDirectory, AnotherRunsCheckpointDirectoryIsNoMetricsDirectory) {
  const fs::path first = directory_ / "first" / "checkpoints";
  ASSERT_EQ(train("first", "--train.max_steps=2 --train.metrics_dir=" +
                               (directory_ / "first_metrics").string())
                .exit_code,
            0);
  const std::map<std::string, std::string> before = contents(first);
  for (const std::string overwrite : {"", " --checkpoint.overwrite=true"}) {
    SCOPED_TRACE(overwrite);
    const ProcessResult second =
        train("second", "--train.max_steps=2 --train.metrics_dir=" + first.string() + overwrite);
    EXPECT_EQ(second.exit_code, 2) << second.output;
    EXPECT_NE(second.output.find("train.metrics_dir " + first.string() + " holds 1 checkpoint "
                                 "file of another run (" + (first / "step_00000002.h5").string() +
                                 "): it is another run's checkpoint.dir"),
              std::string::npos)
        << second.output;
    EXPECT_NE(second.output.find("holds 1 checkpoint file of another run (" +
                                 (first / "step_00000002.h5").string() + "): it is another "
                                 "run's checkpoint.dir, and this run's metrics file and "
                                 "TensorBoard events there would be read as that run's; give "
                                 "train.metrics_dir a directory of its own, or leave it out (the "
                                 "metrics then go into checkpoint.dir " +
                                 (directory_ / "second" / "checkpoints").string() + ")\n"),
              std::string::npos)
        << second.output;  // one line
    EXPECT_EQ(contents(first), before);
  }
  // Its own checkpoint.dir as its metrics directory stays a run's choice.
  const ProcessResult own = train("first", "--train.max_steps=3 --checkpoint.resume=auto "
                                           "--train.metrics_dir=" + first.string());
  EXPECT_EQ(own.output.find("holds 1 checkpoint file of another run"), std::string::npos)
      << own.output;
  // An average (of no run) or a damaged file there is no other run's (a review's finding:
  // a run's own averages beside its metrics were refused so).
  const fs::path kept = directory_ / "kept";
  fs::create_directories(kept);
  const ProcessResult averaged = run_process(
      thpc::binary_dir() + "/transformer_average --inputs " + (first / "step_00000003.h5").string() +
      " --output " + (kept / "average_last1.h5").string());
  ASSERT_EQ(averaged.exit_code, 0) << averaged.output;
  std::ofstream(kept / "step_00000001.h5.corrupt") << "damaged";
  const ProcessResult beside = train("third", "--train.max_steps=1 --train.metrics_dir=" +
                                                  kept.string());
  EXPECT_EQ(beside.exit_code, 0) << beside.output;
}

TEST_F(RunDirectory, OverwriteDeletesTheEarlierRunsFilesFirst) {
  ASSERT_EQ(train("run", "--train.max_steps=4 --checkpoint.every_steps=2").exit_code, 0);
  const fs::path earlier = directory_ / "run" / "checkpoints" / "step_00000004.h5";
  const double megabytes = fs::file_size(earlier) / 1e6;
  ASSERT_GT(megabytes, 1.0);
  ASSERT_LT(megabytes, 100.0);
  std::ostringstream size;
  size << std::fixed << std::setprecision(1) << megabytes;
  const ProcessResult second =
      train("run", "--train.max_steps=3 --train.seed=2 --checkpoint.overwrite=true");
  ASSERT_EQ(second.exit_code, 0) << second.output;
  // With what the file held, and as a note as the other removals (before: "removed PATH").
  EXPECT_NE(second.output.find("note: removed " + earlier.string() + " (" + size.str() +
                               " MB), a file of an earlier run (checkpoint.overwrite = true)"),
            std::string::npos)
      << second.output;
  const std::string checkpoints = (directory_ / "run" / "checkpoints").string();
  EXPECT_EQ(list_checkpoints(checkpoints),
            std::vector<std::string>{checkpoints + "/step_00000003.h5"});
  // The metrics hold the new run only: one run record, the new checkpoint's run.
  const std::vector<std::string> runs = run_records(directory_ / "run" / "checkpoints" / "metrics.jsonl");
  ASSERT_EQ(runs.size(), 1u);
  EXPECT_EQ(runs[0], read_checkpoint(checkpoints + "/step_00000003.h5").run_id);
  // A file that cannot be deleted (here a folder under a checkpoint's name, not empty) is
  // refused as without overwrite (before: "removed", and the run went on beside it).
  fs::create_directories(directory_ / "run" / "checkpoints" / "step_00000009.h5" / "inside");
  const ProcessResult third =
      train("run", "--train.max_steps=3 --train.seed=3 --checkpoint.overwrite=true");
  EXPECT_EQ(third.exit_code, 2) << third.output;
  EXPECT_NE(third.output.find("checkpoint.overwrite = true could not delete " + checkpoints +
                              "/step_00000009.h5 ("),
            std::string::npos)
      << third.output;
  EXPECT_EQ(third.output.find("removed " + checkpoints + "/step_00000009.h5"), std::string::npos)
      << third.output;
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
  // b's TensorBoard events among them, beside its metrics file (before: the metrics file
  // alone was named, and checkpoint.overwrite left the events, which TensorBoard then drew
  // with a's; a helper's walk).
  EXPECT_NE(mixed.output.find("hold 3 files of another run"), std::string::npos) << mixed.output;
  EXPECT_NE(mixed.output.find((directory_ / "b" / "checkpoints").string() + "/events.out.tfevents."),
            std::string::npos)
      << mixed.output;
  // Its own directory, however it is named: resume=auto, and resume=PATH.
  const ProcessResult resumed = train("a", "--train.max_steps=5 --checkpoint.resume=auto");
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  const ProcessResult again = train(
      "a", "--train.max_steps=6 --checkpoint.resume=" +
               (directory_ / "a" / "checkpoints" / "step_00000005.h5").string());
  ASSERT_EQ(again.exit_code, 0) << again.output;
  const std::vector<std::string> runs = run_records(directory_ / "a" / "checkpoints" / "metrics.jsonl");
  ASSERT_EQ(runs.size(), 3u);
  EXPECT_EQ(runs[0], runs[1]);
  EXPECT_EQ(runs[1], runs[2]);
  EXPECT_NE(runs[0], run_records(directory_ / "b" / "checkpoints" / "metrics.jsonl").at(0));
}

// Side-by-side runs, runs/a and runs/b (what `tensorboard --logdir runs` expects): each
// directory holds its own metrics and events, so the second run starts (it was refused,
// both metrics files defaulting to runs/), and checkpoint.overwrite on one deletes nothing
// of the other (it deleted a's metrics and event file).
TEST_F(RunDirectory, SiblingRunsShareNoFileAndOverwriteTouchesOnlyItsOwn) {
  const auto sibling = [&](const std::string& name, const std::string& args) {
    return run_process(kTrainer + "--checkpoint.dir=" + (directory_ / "runs" / name).string() +
                       " " + args);
  };
  const ProcessResult a = sibling("a", "--train.max_steps=2");
  ASSERT_EQ(a.exit_code, 0) << a.output;
  const std::map<std::string, std::string> a_files = contents(directory_ / "runs" / "a");
  ASSERT_EQ(a_files.count((directory_ / "runs" / "a" / "metrics.jsonl").string()), 1u);
  const ProcessResult b = sibling("b", "--train.max_steps=2 --train.seed=2");
  ASSERT_EQ(b.exit_code, 0) << b.output;
  const ProcessResult b_again =
      sibling("b", "--train.max_steps=3 --train.seed=3 --checkpoint.overwrite=true");
  ASSERT_EQ(b_again.exit_code, 0) << b_again.output;
  EXPECT_EQ(b_again.output.find("/runs/a/"), std::string::npos) << b_again.output;
  EXPECT_EQ(contents(directory_ / "runs" / "a"), a_files);
  EXPECT_EQ(run_records(directory_ / "runs" / "b" / "metrics.jsonl").size(), 1u);
  // Nothing of either run sits in runs/ itself.
  for (const fs::directory_entry& entry : fs::directory_iterator(directory_ / "runs")) {
    EXPECT_TRUE(entry.is_directory()) << entry.path();
  }
}

// A shared train.metrics_dir: a run with checkpoint.resume = auto that finds nothing to
// resume (a new job's first start) appended to another run's metrics file there, which
// that run then could not resume with (its file's last run no longer its own; a helper's
// finding). Refused now, naming that run's checkpoint.dir; a start of the same
// checkpoint.dir that saved nothing (a job requeued before its first checkpoint) is
// still its own and appended to.
TEST_F(RunDirectory, NothingToResumeIsANewRunInAnotherRunsMetricsDirectory) {
  const std::string shared = " --train.metrics_dir=" + (directory_ / "metrics").string();
  const fs::path metrics = directory_ / "metrics" / "metrics.jsonl";
  const ProcessResult a = train("a", "--train.max_steps=2" + shared);
  ASSERT_EQ(a.exit_code, 0) << a.output;
  const std::map<std::string, std::string> before = contents(directory_ / "metrics");
  const ProcessResult b = train("b", "--train.max_steps=2 --checkpoint.resume=auto" + shared);
  EXPECT_EQ(b.exit_code, 2) << b.output;
  EXPECT_NE(b.output.find("(checkpoint.resume = auto found nothing to resume in checkpoint.dir); "
                          "continue that run with --checkpoint.dir=" +
                          (directory_ / "a" / "checkpoints").string() +
                          " --checkpoint.resume=auto"),
            std::string::npos)
      << b.output;
  EXPECT_EQ(contents(directory_ / "metrics"), before);
  const ProcessResult a_again =
      train("a", "--train.max_steps=3 --checkpoint.resume=auto" + shared);
  EXPECT_EQ(a_again.exit_code, 0) << a_again.output;
  EXPECT_EQ(run_records(metrics).size(), 2u);

  // The same checkpoint.dir's earlier start, which saved nothing (killed at its second
  // step, before its first checkpoint): its records are this run's to continue (a
  // requeued job's).
  const std::string own_metrics = " --train.metrics_dir=" + (directory_ / "own").string();
  const fs::path own = directory_ / "own" / "metrics.jsonl";
  const auto killed_before_saving = [&](const std::string& run) {
    const ScopedEnvironment kill("THPC_KILL_AT", "0:2");
    const ProcessResult killed =
        train(run, "--train.max_steps=4 --checkpoint.resume=auto" + own_metrics);
    ASSERT_NE(killed.exit_code, 0) << killed.output;
  };
  killed_before_saving("c");
  killed_before_saving("c");  // a requeue killed as early: appended
  EXPECT_EQ(run_records(own).size(), 2u);
  // ... also after its run directory was moved (the directory its records name is gone:
  // no other run resumes from there; it was refused as another run's).
  fs::rename(directory_ / "c", directory_ / "c_moved");
  const ProcessResult moved = train(
      "c_moved", "--train.max_steps=2 --checkpoint.average_last=1 --checkpoint.resume=auto" +
                     own_metrics);
  EXPECT_EQ(moved.exit_code, 0) << moved.output;
  EXPECT_EQ(run_records(own).size(), 3u);

  // A finished run's directory cleaned of its checkpoints and used again: its metrics file
  // records the checkpoints it wrote, which are gone; not a start that saved nothing, and
  // a new run is refused, its records untouched (before: appended to that run's, and the
  // plots drew the new run alone; a helper's sweep). checkpoint.overwrite deletes them.
  // Its average is left, which a new run would write over: named, and deleted with them.
  const fs::path average = directory_ / "c_moved" / "checkpoints" / "average_last1.h5";
  ASSERT_TRUE(fs::exists(average)) << moved.output;
  for (const fs::directory_entry& entry :
       fs::directory_iterator(directory_ / "c_moved" / "checkpoints")) {
    if (entry.path().filename().string().rfind("step_", 0) == 0) fs::remove(entry.path());
  }
  const std::map<std::string, std::string> finished = contents(directory_ / "own");
  const ProcessResult reused =
      train("c_moved", "--train.max_steps=2 --checkpoint.resume=auto" + own_metrics);
  EXPECT_EQ(reused.exit_code, 2) << reused.output;
  EXPECT_NE(reused.output.find("checkpoint.resume = auto found nothing to resume in "
                               "checkpoint.dir " +
                               (directory_ / "c_moved" / "checkpoints").string() +
                               ", but its metrics file " + own.string() + " records the 1 "
                               "checkpoint of run "),
            std::string::npos)
      << reused.output;
  EXPECT_NE(reused.output.find("(its last summary at step 2), which are no longer there"),
            std::string::npos)
      << reused.output;
  // (refused: no "starting from step 0" before it, as there was)
  EXPECT_EQ(reused.output.find("starting from step 0"), std::string::npos) << reused.output;
  EXPECT_NE(reused.output.find("; give this run another checkpoint.dir (and "
                               "train.metrics_dir), move "),
            std::string::npos)
      << reused.output;
  // In a job of jobs/, the run's name is what to change (the job's script sets the rest).
  const ProcessResult in_a_job = run_process(
      "THPC_JOB_RUN_DIR=" + (directory_ / "c_moved").string() + " " + kTrainer +
      "--checkpoint.dir=" + (directory_ / "c_moved" / "checkpoints").string() +
      " --train.max_steps=2 --checkpoint.resume=auto" + own_metrics);
  EXPECT_EQ(in_a_job.exit_code, 2) << in_a_job.output;
  EXPECT_NE(in_a_job.output.find("; give this run another THPC_RUN_NAME than c_moved (a job of "
                                 "jobs/ trains in runs/THPC_RUN_NAME), move "),
            std::string::npos)
      << in_a_job.output;
  EXPECT_NE(reused.output.find("and write over the 1 file of that run left in checkpoint.dir (" +
                               average.string() + ")"),
            std::string::npos)
      << reused.output;
  EXPECT_EQ(contents(directory_ / "own"), finished);
  EXPECT_TRUE(fs::exists(average));
  const ProcessResult overwritten = train(
      "c_moved",
      "--train.max_steps=2 --checkpoint.resume=auto --checkpoint.overwrite=true" + own_metrics);
  EXPECT_EQ(overwritten.exit_code, 0) << overwritten.output;
  EXPECT_EQ(run_records(own).size(), 1u);
  EXPECT_NE(overwritten.output.find("note: removed " + average.string()), std::string::npos)
      << overwritten.output;
}

// A run directory copied (cp -r base copy): its metrics file records the original's
// checkpoint.dir, and a new run in the copy was refused naming the original as the run to
// continue (a run there would have trained in it; a helper's trial). The copy is its own:
// the refusals name it alone.
TEST_F(RunDirectory, ACopiedRunDirectoryIsARunOfItsOwn) {
  ASSERT_EQ(train("base", "--train.max_steps=2").exit_code, 0);
  fs::copy(directory_ / "base", directory_ / "copy", fs::copy_options::recursive);
  const ProcessResult fresh = train("copy", "--train.max_steps=2");
  EXPECT_EQ(fresh.exit_code, 2) << fresh.output;
  EXPECT_NE(fresh.output.find("continue that run with --checkpoint.resume=auto, give this run "
                              "another checkpoint.dir"),
            std::string::npos)
      << fresh.output;
  EXPECT_EQ(fresh.output.find("/base/"), std::string::npos) << fresh.output;
  for (const fs::directory_entry& entry :
       fs::directory_iterator(directory_ / "copy" / "checkpoints")) {
    if (entry.path().extension() == ".h5") fs::remove(entry.path());
  }
  // With its checkpoints deleted, resume=auto finds nothing, and the copy's records name
  // the checkpoint the original wrote: refused as a cleaned directory used again, naming
  // the copy's files alone.
  const ProcessResult again = train("copy", "--train.max_steps=2 --checkpoint.resume=auto");
  EXPECT_EQ(again.exit_code, 2) << again.output;
  EXPECT_NE(again.output.find("found nothing to resume in checkpoint.dir " +
                              (directory_ / "copy" / "checkpoints").string() +
                              ", but its metrics file " +
                              (directory_ / "copy" / "checkpoints" / "metrics.jsonl").string() +
                              " records the 1 checkpoint of run "),
            std::string::npos)
      << again.output;
  EXPECT_EQ(again.output.find("/base/"), std::string::npos) << again.output;
  EXPECT_EQ(run_records(directory_ / "copy" / "checkpoints" / "metrics.jsonl").size(), 1u);
  // So with the metrics file above checkpoint.dir (RUN/metrics.jsonl for RUN/checkpoints).
  const auto beside = [&](const std::string& run) {
    return " --train.metrics_dir=" + (directory_ / run).string();
  };
  ASSERT_EQ(train("up", "--train.max_steps=2" + beside("up")).exit_code, 0);
  fs::copy(directory_ / "up", directory_ / "up_copy", fs::copy_options::recursive);
  const ProcessResult up_copy = train("up_copy", "--train.max_steps=2" + beside("up_copy"));
  EXPECT_EQ(up_copy.exit_code, 2) << up_copy.output;
  EXPECT_NE(up_copy.output.find("continue that run with --checkpoint.resume=auto, give this "
                                "run another checkpoint.dir"),
            std::string::npos)
      << up_copy.output;
  EXPECT_EQ(up_copy.output.find("/up/"), std::string::npos) << up_copy.output;
}

// A run started when the metrics went beside checkpoint.dir (RUN/metrics.jsonl for
// RUN/checkpoints) and resumed now goes on appending there, saying so, rather than
// splitting its curves between two files.
TEST_F(RunDirectory, ARunResumedFromTheOldLayoutKeepsItsMetricsBesideTheCheckpoints) {
  const fs::path beside = directory_ / "run" / "metrics.jsonl";
  ASSERT_EQ(train("run", "--train.max_steps=2 --train.metrics_dir=" +
                             (directory_ / "run").string()).exit_code, 0);
  ASSERT_EQ(run_records(beside).size(), 1u);
  const ProcessResult resumed = train("run", "--train.max_steps=3 --checkpoint.resume=auto");
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("note: this run's metrics file is " + beside.string() +
                                ", beside checkpoint.dir"),
            std::string::npos)
      << resumed.output;
  EXPECT_EQ(run_records(beside).size(), 2u);
  EXPECT_FALSE(fs::exists(directory_ / "run" / "checkpoints" / "metrics.jsonl"));
  // A new run there is a run of its own: its file goes into checkpoint.dir.
  ASSERT_EQ(train("fresh", "--train.max_steps=1").exit_code, 0);
  EXPECT_TRUE(fs::exists(directory_ / "fresh" / "checkpoints" / "metrics.jsonl"));
}

TEST_F(RunDirectory, APartialLastMetricsLineIsRemovedBeforeAppending) {
  ASSERT_EQ(train("run", "--train.max_steps=2").exit_code, 0);
  const fs::path metrics = directory_ / "run" / "checkpoints" / "metrics.jsonl";
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


// ---- one trainer per run directory (issue 54: two resumed trainers on one directory
// both exited 0, their records interleaved and each pruned the other's checkpoints) ----

std::string host_name() {
  char host[HOST_NAME_MAX + 1] = {0};
  gethostname(host, sizeof(host) - 1);
  return host;
}

// A lock file as a trainer writes it, with its modification time `age_s` in the past.
// A lock of `host`'s process `pid`, taken at `started` (seconds since the epoch; the
// default is 2026-09-21, before any process of this test), refreshed `age_s` ago.
void write_lock(const fs::path& dir, const std::string& host, long long pid,
                const std::string& slurm_job = "", int slurm_restart = 0, int age_s = 0,
                long long started = 1790000000) {
  fs::create_directories(dir);
  const fs::path lock = run_lock_path(dir.string());
  std::ofstream(lock) << "host=" << host << "\npid=" << pid << "\nstarted=" << started
                      << "\nslurm_job=" << slurm_job << "\nslurm_restart=" << slurm_restart
                      << "\n";
  if (age_s > 0) {
    timespec times[2];
    times[0].tv_sec = times[1].tv_sec = ::time(nullptr) - age_s;
    times[0].tv_nsec = times[1].tv_nsec = 0;
    ASSERT_EQ(::utimensat(AT_FDCWD, lock.c_str(), times, 0), 0);
  }
}

// A process id that no process has: a child that has exited and been reaped.
pid_t gone_pid() {
  const pid_t child = fork();
  if (child == 0) _exit(0);
  int status = 0;
  waitpid(child, &status, 0);
  return child;
}

TEST_F(RunDirectory, ASecondTrainerOnARunningRunsDirectoryIsRefusedNamingTheFirst) {
  const fs::path checkpoints = directory_ / "run" / "checkpoints";
  FILE* output = nullptr;
  const pid_t first = start_process(
      {thpc::binary_dir() + "/transformer_hpc", THPC_SOURCE_DIR "/input/tiny.ini",
       "--model.layers=1", "--train.log_every=1", "--train.max_steps=1000000",
       "--checkpoint.every_steps=1", "--checkpoint.dir=" + checkpoints.string()},
      &output);
  ASSERT_GT(first, 0);
  std::string first_log;
  char line[4096];
  while (std::fgets(line, sizeof line, output) != nullptr) {
    first_log += line;
    if (std::string(line).rfind("step 2/", 0) == 0) break;
  }
  ASSERT_TRUE(fs::exists(run_lock_path(checkpoints.string()))) << first_log;
  // A requeue or a manual restart while it runs: resume=auto would read and prune its files.
  const ProcessResult second = train("run", "--train.max_steps=5 --checkpoint.resume=auto");
  ::kill(first, SIGTERM);
  int status = 0;
  first_log += finish_process(first, output, &status);
  EXPECT_EQ(second.exit_code, 2) << second.output;
  EXPECT_NE(second.output.find("the run directory " + checkpoints.string() +
                               " is in use by another trainer (host " + host_name() +
                               ", pid " + std::to_string(first) + ", started "),
            std::string::npos)
      << second.output;
  EXPECT_EQ(second.output.find("step 1/"), std::string::npos) << second.output;
  ASSERT_TRUE(WIFEXITED(status)) << first_log;
  EXPECT_EQ(WEXITSTATUS(status), 0) << first_log;
  // The first trainer's records alone, and its lock gone with it.
  EXPECT_EQ(run_records(directory_ / "run" / "checkpoints" / "metrics.jsonl").size(), 1u);
  EXPECT_FALSE(fs::exists(run_lock_path(checkpoints.string())));
  // Now the directory is free: the resume goes ahead.
  const ProcessResult third = train("run", "--train.max_steps=1 --checkpoint.resume=auto");
  EXPECT_EQ(third.exit_code, 0) << third.output;
}

// Two runs of their own directories sharing a train.metrics_dir: before the first one's
// first logged value its metrics file and event file record none, as a failed start's
// do, and a second start used to remove them ("left by a start that recorded no value")
// or, with checkpoint.overwrite, delete them as an earlier run's, while the first ran on
// and lost its records. The metrics directory has the run directory's lock.
TEST_F(RunDirectory, ASecondTrainerOnALiveRunsMetricsDirectoryIsRefusedAndRemovesNothing) {
  const fs::path metrics_dir = directory_ / "shared_metrics";
  FILE* output = nullptr;
  const pid_t first = start_process(
      {thpc::binary_dir() + "/transformer_hpc", THPC_SOURCE_DIR "/input/tiny.ini",
       "--model.layers=1", "--train.log_every=1000000", "--train.max_steps=1000000",
       "--checkpoint.minutes=0", "--checkpoint.dir=" + (directory_ / "a").string(),
       "--train.metrics_dir=" + metrics_dir.string()},
      &output);
  ASSERT_GT(first, 0);
  // Past its start-up: its metrics file begun, its run record (and nothing more) written.
  for (int waited_ms = 0; waited_ms < 60000 && run_records(metrics_dir / "metrics.jsonl").empty();
       waited_ms += 20) {
    ::usleep(20000);
  }
  const std::map<std::string, std::string> first_metrics = contents(metrics_dir);
  std::vector<ProcessResult> seconds;
  for (const std::string overwrite : {"false", "true"}) {
    seconds.push_back(train("b", "--train.max_steps=2 --checkpoint.overwrite=" + overwrite +
                                     " --train.metrics_dir=" + metrics_dir.string()));
  }
  const std::map<std::string, std::string> metrics_meanwhile = contents(metrics_dir);
  ::kill(first, SIGTERM);
  int status = 0;
  const std::string first_log = finish_process(first, output, &status);
  EXPECT_EQ(first_metrics.count((metrics_dir / "metrics.jsonl").string()), 1u) << first_log;
  for (const ProcessResult& second : seconds) {
    EXPECT_EQ(second.exit_code, 2) << second.output;
    EXPECT_NE(second.output.find("the metrics directory " + metrics_dir.string() +
                                 " (train.metrics_dir) is in use by another trainer (host " +
                                 host_name() + ", pid " + std::to_string(first) + ", started "),
              std::string::npos)
        << second.output;
    EXPECT_EQ(second.output.find("removed"), std::string::npos) << second.output;
    EXPECT_EQ(second.output.find("step 1/"), std::string::npos) << second.output;
  }
  EXPECT_EQ(metrics_meanwhile, first_metrics);
  ASSERT_TRUE(WIFEXITED(status)) << first_log;
  EXPECT_EQ(WEXITSTATUS(status), 0) << first_log;
  // The first run's records alone, and both its locks gone with it.
  EXPECT_EQ(run_records(metrics_dir / "metrics.jsonl").size(), 1u);
  EXPECT_FALSE(fs::exists(run_lock_path(metrics_dir.string())));
  EXPECT_FALSE(fs::exists(run_lock_path((directory_ / "a").string())));
}

// A checkpoint's write that a crash interrupted (SIGKILL, a node lost) leaves its
// temporary file, a base checkpoint's 757 MB, which nothing removed (a helper's trial
// found one per kill). The next start in the directory, holding its lock, removes such
// files and says so; other hidden files stay.
TEST_F(RunDirectory, ACheckpointWriteACrashInterruptedIsRemovedAtTheNextStart) {
  ASSERT_EQ(train("run", "--train.max_steps=2").exit_code, 0);
  const fs::path checkpoints = directory_ / "run" / "checkpoints";
  std::ofstream(checkpoints / ".step_00000003.h5.tmp") << std::string(4096, 'x');
  std::ofstream(checkpoints / ".best.h5.tmp") << "x";
  std::ofstream(checkpoints / ".notes.txt.tmp") << "someone else's";
  const ProcessResult resumed = train("run", "--train.max_steps=3 --checkpoint.resume=auto");
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  const std::string interrupted = (checkpoints / ".step_00000003.h5.tmp").string();
  EXPECT_NE(resumed.output.find("note: removed " + interrupted +
                                " (4096 bytes), a checkpoint's write that a crash interrupted"),
            std::string::npos)
      << resumed.output;
  EXPECT_FALSE(fs::exists(checkpoints / ".step_00000003.h5.tmp"));
  EXPECT_FALSE(fs::exists(checkpoints / ".best.h5.tmp"));
  EXPECT_TRUE(fs::exists(checkpoints / ".notes.txt.tmp"));
  EXPECT_TRUE(fs::exists(checkpoints / "step_00000003.h5"));
}

// A child that has exited and is not collected yet (a zombie, which kill(pid, 0) still
// finds), once it has: its parent collects it with waitpid.
pid_t zombie_pid() {
  const pid_t child = fork();
  if (child == 0) _exit(0);
  siginfo_t info{};
  // WNOWAIT: seen ended, left uncollected.
  waitid(P_PID, static_cast<id_t>(child), &info, WEXITED | WNOWAIT);
  return child;
}

TEST_F(RunDirectory, ALockWhoseHolderIsGoneIsTakenOverWithANote) {
  const pid_t zombie = zombie_pid();
  struct Case {
    std::string what, host;
    long long pid;
    std::string job;
    int restart, age_s;
    std::string reason;
  };
  const std::vector<Case> cases = {
      {"its process ended on this host", host_name(), gone_pid(), "", 0, 0, "its process is gone"},
      // (before: a live holder, and the directory refused until the zombie was collected)
      {"its process ended and is not collected yet", host_name(), zombie, "", 0, 0,
       "its process is gone (ended, not yet collected by its parent: a zombie)"},
      {"another host's, not refreshed for 11 minutes", "elsewhere", 1, "", 0, 660,
       "it was last refreshed 66"},
      {"an earlier run of this Slurm job on another node", "elsewhere", 1, "4242", 0, 0,
       "it was left by an earlier run (restart 0) of this Slurm job, which is at restart 1"},
      {"its process id now another process's, started after the lock, not refreshed for 11 "
       "minutes", host_name(), ::getppid(), "", 0, 660,
       "its process is gone (process " + std::to_string(::getppid()) + " of this host started "
       "after the lock was taken)"},
  };
  const ScopedEnvironment job("SLURM_JOB_ID", "4242");
  const ScopedEnvironment restart("SLURM_RESTART_COUNT", "1");
  for (const Case& c : cases) {
    const fs::path dir = directory_ / ("stale_" + std::to_string(&c - cases.data()));
    write_lock(dir, c.host, c.pid, c.job, c.restart, c.age_s);
    std::ostringstream log;
    {
      const RunLock lock(dir.string(), log);
      const std::string text = read_file(lock.path());
      EXPECT_NE(text.find("pid=" + std::to_string(::getpid()) + "\n"), std::string::npos) << c.what;
      EXPECT_NE(text.find("slurm_job=4242\nslurm_restart=1\n"), std::string::npos) << c.what;
    }
    EXPECT_NE(log.str().find("note: taking over the lock " + run_lock_path(dir.string()) + " of host " +
                             c.host + ", pid " + std::to_string(c.pid) + ", started 2026-09-21 "),
              std::string::npos)
        << c.what << ": " << log.str();
    EXPECT_NE(log.str().find(c.reason), std::string::npos) << c.what << ": " << log.str();
    EXPECT_FALSE(fs::exists(run_lock_path(dir.string()))) << c.what << ": released at the end";
  }
  int status = 0;
  waitpid(zombie, &status, 0);
}

// A trainer checks its lock before each checkpoint (RunLock::check_held). Taken over by
// another (it looked gone: suspended past the staleness, say), it stops without writing:
// before, both trainers wrote and pruned in one directory and exited 0. Removed (the run
// directory deleted or cleaned by hand), it is taken again with a warning.
// The run directory deleted (rm -rf, a cleaning script) while a checkpoint was written:
// the write failed on its vanished temporary file and the run ended, exit 1, its state
// unsaved (a helper's trial; between writes the lock's check makes the directory again).
// Now the write is tried once more. Tried by hand with the directory deleted every 20 ms
// through 300 one-step checkpoints of tiny.ini: exit 0, 67 writes tried again (before:
// exit 1 at the first checkpoint).
TEST_F(RunDirectory, ACheckpointWriteWhoseDirectoryIsRemovedIsWrittenOnceMore) {
  const fs::path dir = directory_ / "removed" / "checkpoints";
  const fs::path file = dir / "step_00000001.h5";
  const std::string no_such_file = std::strerror(ENOENT);
  int writes = 0;
  // Its first write finds the directory gone; the second makes it, as write_atomically does.
  const auto write = [&] {
    if (++writes == 1) {
      fs::remove_all(dir);
      THPC_FAIL("cannot write checkpoint " << file.string() << ": gone");
    }
    fs::create_directories(dir);
    std::ofstream(file) << "written";
  };
  std::ostringstream notes;
  thpc::write_made_again_if_removed(dir.string(), write, notes);
  EXPECT_EQ(writes, 2);
  EXPECT_EQ(read_file(file), "written");
  EXPECT_EQ(notes.str().rfind("warning: checkpoint.dir " + dir.string() + " was removed while "
                              "a checkpoint was written (deleted or cleaned while the run "
                              "ran?): the checkpoint written once more (the write said: ",
                              0),
            0u)
      << notes.str();

  // Its files removed, the directory still there (an rm -rf half done): the write said ENOENT.
  writes = 0;
  notes.str("");
  const auto file_gone = [&] {
    if (++writes == 1) THPC_FAIL("cannot open " << file.string() << " (" << no_such_file << ")");
  };
  thpc::write_made_again_if_removed(dir.string(), file_gone, notes);
  EXPECT_EQ(writes, 2);
  EXPECT_NE(notes.str().find("'s files were removed while a checkpoint was written"),
            std::string::npos)
      << notes.str();

  // Any other failure (a full disk) is the run's, as before: not written twice.
  writes = 0;
  notes.str("");
  const auto full = [&] {
    ++writes;
    THPC_FAIL("cannot write " << file.string() << " (No space left on device)");
  };
  EXPECT_THROW(thpc::write_made_again_if_removed(dir.string(), full, notes), thpc::Error);
  EXPECT_EQ(writes, 1);
  EXPECT_EQ(notes.str(), "");

  // Nor into a directory another trainer took since: its lock is there (a review's
  // finding: the retry wrote and pruned in the new trainer's directory).
  writes = 0;
  notes.str("");
  const auto taken_meanwhile = [&] {
    ++writes;
    fs::remove_all(dir);
    fs::create_directories(dir);
    std::ofstream(thpc::run_lock_path(dir.string())) << "host=other\npid=1\n";
    THPC_FAIL("cannot write " << file.string() << " (" << no_such_file << ")");
  };
  EXPECT_THROW(thpc::write_made_again_if_removed(dir.string(), taken_meanwhile, notes),
               thpc::Error);
  EXPECT_EQ(writes, 1);
  EXPECT_EQ(notes.str(), "");
  fs::remove_all(dir);

  // Nor more than once, the first failure said with the second.
  writes = 0;
  const auto always_removed = [&] {
    ++writes;
    fs::remove_all(dir);
    THPC_FAIL("cannot write " << file.string() << ": gone");
  };
  try {
    thpc::write_made_again_if_removed(dir.string(), always_removed, notes);
    ADD_FAILURE() << "the second failure was not thrown";
  } catch (const thpc::Error& error) {
    EXPECT_NE(std::string(error.what()).find("(the checkpoint written once more, after: "),
              std::string::npos)
        << error.what();
  }
  EXPECT_EQ(writes, 2);
}

TEST_F(RunDirectory, ATrainerWhoseLockIsAnothersNowStopsWithoutWriting) {
  const fs::path dir = directory_ / "run";
  std::ostringstream log;
  {
    RunLock lock(dir.string(), log);
    const std::string ours = read_file(lock.path());
    lock.check_held(log);
    EXPECT_EQ(log.str(), "");
    fs::remove(lock.path());
    lock.check_held(log);
    EXPECT_EQ(read_file(lock.path()), ours);
    EXPECT_NE(log.str().find("warning: the lock " + lock.path() + " had been removed (the run "
                             "directory " + dir.string() + " deleted or cleaned while this "
                             "trainer ran?): taken again"),
              std::string::npos)
        << log.str();
    // The whole directory deleted: made again with the lock (the next checkpoint's write
    // would make it), not a reason to stop.
    fs::remove_all(dir);
    lock.check_held(log);
    EXPECT_EQ(read_file(lock.path()), ours);
    write_lock(dir, "node2", 4321, "", 0, 0);
    try {
      lock.check_held(log);
      ADD_FAILURE() << "a lock taken over passed";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("the lock " + lock.path() + " of the run directory " +
                                           dir.string() + " is no longer this trainer's: host "
                                           "node2, pid 4321, started "),
                std::string::npos)
          << e.what();
      EXPECT_NE(std::string(e.what()).find("stops without writing there"), std::string::npos)
          << e.what();
    }
  }
  // Its end leaves the lock to its new holder.
  EXPECT_NE(read_file(run_lock_path(dir.string())).find("host=node2"), std::string::npos);
}

// A lock taken in another PID namespace of this host (a container: Apptainer
// --containall, unshare --pid) names a pid that this namespace cannot see: it is judged as
// another host's (by its refresh), not as a process gone (before: a live trainer's lock was
// taken over, and two trained in one directory).
TEST_F(RunDirectory, ALockFromAnotherPidNamespaceIsNotTakenForAProcessGone) {
  const fs::path dir = directory_ / "contained";
  write_lock(dir, host_name(), 99999999);
  std::ofstream(run_lock_path(dir.string()), std::ios::app) << "pidns=pid:[1]\n";
  std::ostringstream log;
  try {
    const RunLock lock(dir.string(), log);
    ADD_FAILURE() << "the lock was taken over: " << log.str();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("is in use by another trainer"), std::string::npos)
        << e.what();
  }
  // In this namespace (or written before locks recorded one) the pid is looked for here.
  write_lock(dir, host_name(), 99999999);
  {
    const RunLock lock(dir.string(), log);
    EXPECT_NE(read_file(lock.path()).find("\npidns=pid:["), std::string::npos);
  }
  EXPECT_NE(log.str().find("its process is gone"), std::string::npos) << log.str();
}

TEST_F(RunDirectory, ALiveLockIsKeptAndNamesItsHolder) {
  // Another host's trainer, refreshed 2 minutes ago; a live process of this host; a
  // concurrent run of this very Slurm job on another node (the same restart count); a
  // live process of this host that took the lock and has not refreshed it for 11 minutes
  // (suspended: Ctrl-Z, SIGSTOP, a debugger; before, it was taken over and two trainers
  // wrote in one directory).
  const ScopedEnvironment job("SLURM_JOB_ID", "4242");
  const ScopedEnvironment restart("SLURM_RESTART_COUNT", "0");
  const long long now = ::time(nullptr);
  write_lock(directory_ / "a", "elsewhere", 1, "", 0, 120);
  write_lock(directory_ / "b", host_name(), ::getppid(), "", 0, 0, now);
  write_lock(directory_ / "c", "elsewhere", 1, "4242", 0, 0);
  write_lock(directory_ / "d", host_name(), ::getppid(), "", 0, 660, now);
  for (const std::string dir : {"a", "b", "c", "d"}) {
    const std::string before = read_file(run_lock_path((directory_ / dir).string()));
    std::ostringstream log;
    try {
      const RunLock lock((directory_ / dir).string(), log);
      ADD_FAILURE() << dir << ": a live lock was taken";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("is in use by another trainer (host "),
                std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("remove " + run_lock_path((directory_ / dir).string()) +
                                           " by hand only if you know its trainer is gone"),
                std::string::npos) << e.what();
    }
    EXPECT_EQ(read_file(run_lock_path((directory_ / dir).string())), before) << dir;
  }
}

// A lock that names no holder (empty: a crash between its creation and its write; or a
// file of another program's) is no trainer to wait for the ten minutes another host's
// is given. Fresh, it may be a trainer taking it this moment: refused, saying so and
// when it will be taken (before: "in use by another trainer (a holder it does not name)"
// and the ten minutes); a minute old, it is taken over with a note.
TEST_F(RunDirectory, ALockThatNamesNoHolderIsTakenOverAfterAMinute) {
  for (const std::string& contents : {std::string(), std::string("garbage\t%%% junk\nmore\n")}) {
    const fs::path dir = directory_ / (contents.empty() ? "empty" : "garbage");
    fs::create_directories(dir);
    const std::string lock = run_lock_path(dir.string());
    std::ofstream(lock) << contents;
    std::ostringstream log;
    try {
      const RunLock taken(dir.string(), log);
      ADD_FAILURE() << "a lock made a moment ago was taken: " << log.str();
    } catch (const Error& e) {
      const std::string message = e.what();
      EXPECT_NE(message.find("has a lock, " + lock + ", that names no trainer (made or touched "),
                std::string::npos) << message;
      EXPECT_NE(message.find(contents.empty() ? "; it is empty)"
                                              : "; it begins \"garbage?%%% junk\")"),
                std::string::npos) << message;
      EXPECT_NE(message.find("taken over once it is 60 s old"), std::string::npos) << message;
      EXPECT_EQ(message.find("10 minutes"), std::string::npos) << message;
    }
    EXPECT_EQ(read_file(lock), contents);
    timespec times[2];
    times[0].tv_sec = times[1].tv_sec = ::time(nullptr) - 90;
    times[0].tv_nsec = times[1].tv_nsec = 0;
    ASSERT_EQ(::utimensat(AT_FDCWD, lock.c_str(), times, 0), 0);
    {
      const RunLock taken(dir.string(), log);
      EXPECT_NE(read_file(lock).find("pid=" + std::to_string(::getpid()) + "\n"),
                std::string::npos);
    }
    EXPECT_NE(log.str().find("note: taking over the lock " + lock + " of a holder it does not "
                             "name: it has named none for 9"),
              std::string::npos) << log.str();
  }
}

// A failed start leaves nothing that makes the next start fail (issue 54: a start that
// failed on a full disk left an event file, and the next run was refused as "another
// run"): a failure before the first step (here injected at step 1) leaves a "run" record
// and an event file without a value, which the next fresh start removes, saying so; and
// one before anything was written leaves no directory it made for its lock.
TEST_F(RunDirectory, AFailedStartLeavesNothingThatMakesTheNextStartFail) {
  const fs::path metrics = directory_ / "run" / "checkpoints" / "metrics.jsonl";
  const ProcessResult failed = run_process("THPC_FAIL_AT=0:1 " + kTrainer +
                                           "--train.max_steps=2 --checkpoint.dir=" +
                                           metrics.parent_path().string());
  EXPECT_EQ(failed.exit_code, 1) << failed.output;
  // One rank: its failure is every rank's, said without "on rank 0 on HOST".
  EXPECT_NE(failed.output.find("transformer_hpc: error: failure injected by THPC_FAIL_AT=0:1"),
            std::string::npos)
      << failed.output;
  ASSERT_TRUE(fs::exists(metrics)) << failed.output;
  const std::string bytes = std::to_string(fs::file_size(metrics));
  const ProcessResult again = train("run", "--train.max_steps=2");
  ASSERT_EQ(again.exit_code, 0) << again.output;
  EXPECT_NE(again.output.find("note: removed " + metrics.string() + " (" + bytes +
                              " bytes), left by a start that recorded no value"),
            std::string::npos)
      << again.output;
  EXPECT_NE(again.output.find("events.out.tfevents."), std::string::npos) << again.output;
  // A run killed after its checkpoints and before it logged a value (train.log_every past
  // its steps) left record files without a value beside them: they are that run's, and a
  // new start, refused, keeps them (before: it removed them, the metrics file with the
  // run's id, and then refused; a helper's finding).
  const fs::path killed = directory_ / "killed";
  const ProcessResult kill = run_process(
      "THPC_KILL_AT=0:4 " + thpc::binary_dir() + "/transformer_hpc " + THPC_SOURCE_DIR +
      "/input/tiny.ini --model.layers=1 --checkpoint.minutes=0 --train.max_steps=5 "
      "--train.log_every=100 --checkpoint.every_steps=1 --checkpoint.dir=" + killed.string());
  ASSERT_TRUE(fs::exists(killed / "step_00000001.h5")) << kill.output;
  ASSERT_TRUE(fs::exists(killed / "metrics.jsonl")) << kill.output;
  const auto sorted_listing = [](const fs::path& dir) {  // the killed run's lock aside
    std::vector<std::string> names;
    for (const fs::directory_entry& entry : fs::directory_iterator(dir)) {
      if (entry.path().filename() == "trainer.lock") continue;
      names.push_back(entry.path().filename().string() + " " +
                      std::to_string(entry.is_regular_file() ? entry.file_size() : 0));
    }
    std::sort(names.begin(), names.end());
    return names;
  };
  const std::vector<std::string> files = sorted_listing(killed);
  for (const char* dry_run : {" --dry-run", ""}) {
    const ProcessResult refused =
        run_process(kTrainer + "--train.max_steps=2 --checkpoint.dir=" + killed.string() + dry_run);
    EXPECT_EQ(refused.exit_code, 2) << refused.output;
    EXPECT_EQ(refused.output.find("removed"), std::string::npos) << refused.output;
    EXPECT_NE(refused.output.find(" files of another run ("), std::string::npos) << refused.output;
    EXPECT_EQ(sorted_listing(killed), files) << refused.output;
  }
  // Before anything is written: the directories the lock made go with it.
  const ProcessResult no_init = run_process(
      kTrainer + "--checkpoint.init=" + (directory_ / "none.h5").string() + " --checkpoint.dir=" +
      (directory_ / "new" / "deeper").string());
  EXPECT_EQ(no_init.exit_code, 1) << no_init.output;
  EXPECT_FALSE(fs::exists(directory_ / "new")) << no_init.output;
}

// An unwritable run directory is found at start-up, not at the first checkpoint after
// the steps before it are lost.
TEST_F(RunDirectory, AnUnwritableRunDirectoryIsRefusedBeforeTheFirstStep) {
  std::ofstream(directory_ / "a_file") << "not a directory\n";
  const ProcessResult run = run_process(kTrainer + "--train.max_steps=3 --checkpoint.dir=" +
                                        (directory_ / "a_file" / "checkpoints").string());
  EXPECT_EQ(run.exit_code, 2) << run.output;
  EXPECT_NE(run.output.find("the run directory " + (directory_ / "a_file" / "checkpoints").string() +
                            " (checkpoint.dir) cannot be written: " +
                            (directory_ / "a_file").string() + " is no directory"),
            std::string::npos)
      << run.output;
  EXPECT_EQ(run.output.find("step 1/"), std::string::npos) << run.output;
  // Under /proc, which root passes by its rights and the kernel then refuses: the dry run
  // refused it as training does (it passed; a helper's finding). Not root: the rights.
  for (const std::string& mode : {std::string(" --dry-run"), std::string()}) {
    const ProcessResult proc = run_process(kTrainer + "--train.max_steps=3" + mode +
                                           " --checkpoint.dir=/proc/thpc_checkpoints");
    EXPECT_EQ(proc.exit_code, 2) << mode << proc.output;
    EXPECT_NE(proc.output.find("the run directory /proc/thpc_checkpoints (checkpoint.dir) "
                               "cannot be written: it would be created in /proc"),
              std::string::npos)
        << proc.output;
  }
}

}  // namespace
}  // namespace thpc
