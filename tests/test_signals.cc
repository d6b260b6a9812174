// Stop signals are heard whenever they come: during the long work a configuration can
// make long (here the validation translation), as from the first instruction of main()
// (CheckpointTest.SigtermDuringStartUpStopsBeforeTrainingWithExitZero) and on any one
// rank of a job (Distributed.ASigtermToOneRankStopsTheWholeJob). A stop is exit 0 with
// a line saying what was saved, never a process killed without a word (exit 143).
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "checkpoint/checkpoint_directory.h"
#include "program.h"
#include "scratch_directory.h"

namespace thpc {
namespace {

namespace fs = std::filesystem;

const std::string kTrainer = thpc::binary_dir() + "/transformer_hpc";
const std::string kTinyIni = std::string(THPC_SOURCE_DIR) + "/input/tiny.ini";

class Signals : public ScratchDirectoryTest {};

// What a trainer started with `argv` printed, and how it ended, when `signal_number` was
// sent to it as soon as it printed a line starting with `line_start`.
struct SignalledRun {
  std::string log;
  int status = 0;
  bool signalled = false;
};
SignalledRun run_and_signal(const std::vector<std::string>& argv, const std::string& line_start,
                            int signal_number) {
  SignalledRun run;
  FILE* output = nullptr;
  const pid_t pid = start_process(argv, &output);
  if (pid <= 0) return run;
  char line[4096];
  while (std::fgets(line, sizeof line, output) != nullptr) {
    run.log += line;
    if (!run.signalled && std::string(line).rfind(line_start, 0) == 0) {
      ::kill(pid, signal_number);
      run.signalled = true;
    }
  }
  std::fclose(output);
  ::waitpid(pid, &run.status, 0);
  return run;
}

// A validation set of 3000 pairs takes the tiny model seconds to translate: a SIGTERM
// that comes meanwhile ends the translation at its next batch, the validation is not
// recorded (its BLEU would be of part of the set), and the run stops at that step with
// its checkpoint.
TEST_F(Signals, ASignalDuringValidationTranslationStopsAtThatStepWithoutRecordingIt) {
  const ProcessResult corpus = run_process(small_numbers_corpus_command(directory_, 3000));
  ASSERT_EQ(corpus.exit_code, 0) << corpus.output;
  // The progress line of step 2 is printed just before its validation starts.
  const SignalledRun run = run_and_signal(
      {kTrainer, kTinyIni, "--model.layers=1", "--train.max_steps=50", "--train.log_every=2",
       "--train.valid_every=2", "--train.valid_bleu=true", "--train.valid_beam=4",
       "--data.dir=" + (directory_ / "data").string(),
       "--checkpoint.dir=" + (directory_ / "run" / "checkpoints").string()},
      "step 2/50 ", SIGTERM);
  const std::string& log = run.log;
  ASSERT_TRUE(run.signalled) << log;
  ASSERT_TRUE(WIFEXITED(run.status)) << log;
  EXPECT_EQ(WEXITSTATUS(run.status), 0) << log;
  EXPECT_NE(log.find("validation at step 2 interrupted by SIGTERM: not recorded"),
            std::string::npos)
      << log;
  EXPECT_EQ(log.find("valid step 2 |"), std::string::npos) << log;
  EXPECT_NE(log.find("stopped: SIGTERM received; step=2 checkpoint="), std::string::npos) << log;
  EXPECT_EQ(list_checkpoints((directory_ / "run" / "checkpoints").string()),
            std::vector<std::string>{(directory_ / "run" / "checkpoints" / "step_00000002.h5").string()});
  // The checkpoint says so, and the resumed run validates step 2 first, as the
  // uninterrupted run did (before: it went on to step 3, and its best.h5 and patience
  // could differ from the uninterrupted run's; a helper's trial). Without BLEU here, to
  // be quick: the validation's loss and perplexity.
  EXPECT_TRUE(
      read_checkpoint((directory_ / "run" / "checkpoints" / "step_00000002.h5").string())
          .validation_pending);
  const auto resume_to = [&](int max_steps) {
    return run_process(kTrainer + " " + kTinyIni + " --model.layers=1 --train.max_steps=" +
                       std::to_string(max_steps) + " --train.log_every=1 --train.valid_every=2 "
                       "--train.valid_bleu=false --data.dir=" + (directory_ / "data").string() +
                       " --checkpoint.dir=" + (directory_ / "run" / "checkpoints").string() +
                       " --checkpoint.resume=auto");
  };
  // --show-checkpoint says so (only the file's dataset did, a helper's walk).
  const ProcessResult shown = run_process(
      kTrainer + " --show-checkpoint " +
      (directory_ / "run" / "checkpoints" / "step_00000002.h5").string());
  EXPECT_NE(shown.output.find(", its validation pending (cut short by a stop)"),
            std::string::npos)
      << shown.output;
  // A resume whose train.valid_every validates no such step says that it is not done (it
  // was dropped without a word), in a copy of the run.
  fs::copy(directory_ / "run", directory_ / "other_every", fs::copy_options::recursive);
  const ProcessResult other_every = run_process(
      kTrainer + " " + kTinyIni + " --model.layers=1 --train.max_steps=4 --train.valid_every=3 "
      "--train.valid_bleu=false --data.dir=" + (directory_ / "data").string() +
      " --checkpoint.dir=" + (directory_ / "other_every" / "checkpoints").string() +
      " --checkpoint.resume=auto");
  EXPECT_EQ(other_every.exit_code, 0) << other_every.output;
  EXPECT_NE(other_every.output.find("note: step 2's validation, cut short by the stop that "
                                    "saved the checkpoint, is not done: train.valid_every = 3 "
                                    "(on the command line) validates no step 2"),
            std::string::npos)
      << other_every.output;
  // No step left to train: the validation all the same, and the step's checkpoint written
  // again with it (it no longer says pending, and holds the validation's values).
  const ProcessResult validated = resume_to(2);
  ASSERT_EQ(validated.exit_code, 0) << validated.output;
  EXPECT_NE(validated.output.find("validating step 2 first"), std::string::npos)
      << validated.output;
  EXPECT_NE(validated.output.find("valid step 2 |"), std::string::npos) << validated.output;
  const Checkpoint step_2 =
      read_checkpoint((directory_ / "run" / "checkpoints" / "step_00000002.h5").string());
  EXPECT_FALSE(step_2.validation_pending);
  ASSERT_TRUE(step_2.best_valid.has_value());
  EXPECT_EQ(step_2.best_valid->ppl.step, 2);
  // Once validated, a later resume does not validate the step again.
  const ProcessResult resumed = resume_to(3);
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_EQ(resumed.output.find("validating step 2 first"), std::string::npos) << resumed.output;
  EXPECT_NE(resumed.output.find("step 3/3"), std::string::npos) << resumed.output;
}

// The terminal a run was started from closes: SIGHUP stops it like SIGTERM, with a
// checkpoint of the step it was in and exit 0 (it used to die without either).
TEST_F(Signals, AHangUpStopsTheRunWithACheckpoint) {
  const fs::path checkpoints = directory_ / "run" / "checkpoints";
  const SignalledRun run = run_and_signal(
      {kTrainer, kTinyIni, "--model.layers=1", "--train.max_steps=100000", "--train.log_every=2",
       "--checkpoint.dir=" + checkpoints.string()},
      "step 2/100000 ", SIGHUP);
  const std::string& log = run.log;
  ASSERT_TRUE(run.signalled) << log;
  ASSERT_TRUE(WIFEXITED(run.status)) << "killed by signal " << WTERMSIG(run.status) << "\n" << log;
  EXPECT_EQ(WEXITSTATUS(run.status), 0) << log;
  EXPECT_NE(log.find("stopped: SIGHUP received; step="), std::string::npos) << log;
  EXPECT_EQ(list_checkpoints(checkpoints.string()).size(), 1u) << log;
}

}  // namespace
}  // namespace thpc
