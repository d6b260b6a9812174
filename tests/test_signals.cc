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
#include "program.h"
#include "scratch_directory.h"

namespace thpc {
namespace {

namespace fs = std::filesystem;

const std::string kTrainer = std::string(THPC_BINARY_DIR) + "/transformer_hpc";
const std::string kTinyIni = std::string(THPC_SOURCE_DIR) + "/input/tiny.ini";

class Signals : public ScratchDirectoryTest {};

// A validation set of 3000 pairs takes the tiny model seconds to translate: a SIGTERM
// that comes meanwhile ends the translation at its next batch, the validation is not
// recorded (its BLEU would be of part of the set), and the run stops at that step with
// its checkpoint.
TEST_F(Signals, ASignalDuringValidationTranslationStopsAtThatStepWithoutRecordingIt) {
  const fs::path text = directory_ / "text";
  const ProcessResult corpus = run_process(
      "python3 " THPC_SOURCE_DIR "/tools/make_numbers_corpus.py --train 400 --valid 3000 "
      "--test 10 --seed 1 --out " + text.string() + " && " THPC_BINARY_DIR
      "/transformer_preprocess --source-lang en --target-lang de --trainpref " +
      (text / "train").string() + " --validpref " + (text / "valid").string() + " --destdir " +
      (directory_ / "data").string() + " --vocab-size 120 --model-type bpe --seed 1");
  ASSERT_EQ(corpus.exit_code, 0) << corpus.output;
  FILE* output = nullptr;
  const pid_t pid = start_process(
      {kTrainer, kTinyIni, "--model.layers=1", "--train.max_steps=50", "--train.log_every=2",
       "--train.valid_every=2", "--train.valid_bleu=true", "--train.valid_beam=4",
       "--data.dir=" + (directory_ / "data").string(),
       "--checkpoint.dir=" + (directory_ / "run" / "checkpoints").string()},
      &output);
  ASSERT_GT(pid, 0);
  std::string log;
  char line[4096];
  bool signalled = false;
  while (std::fgets(line, sizeof line, output) != nullptr) {
    log += line;
    // The progress line of step 2 is printed just before its validation starts.
    if (!signalled && std::string(line).rfind("step 2/50 ", 0) == 0) {
      ::kill(pid, SIGTERM);
      signalled = true;
    }
  }
  std::fclose(output);
  int status = 0;
  ::waitpid(pid, &status, 0);
  ASSERT_TRUE(signalled) << log;
  ASSERT_TRUE(WIFEXITED(status)) << log;
  EXPECT_EQ(WEXITSTATUS(status), 0) << log;
  EXPECT_NE(log.find("validation at step 2 interrupted by SIGTERM: not recorded"),
            std::string::npos)
      << log;
  EXPECT_EQ(log.find("valid step 2 |"), std::string::npos) << log;
  EXPECT_NE(log.find("stopped: SIGTERM received; step=2 checkpoint="), std::string::npos) << log;
  EXPECT_EQ(list_checkpoints((directory_ / "run" / "checkpoints").string()),
            std::vector<std::string>{(directory_ / "run" / "checkpoints" / "step_00000002.h5").string()});
}

}  // namespace
}  // namespace thpc
