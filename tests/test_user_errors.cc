// Every failure a user can cause reads as a user-facing message (issue 34, item 6): sizes
// that overflow or cannot be allocated are refused from the configuration before anything
// is allocated, with --dry-run as in training (exit 2, one line naming the keys), and an
// allocation that still fails says which sizes to lower instead of "check failed ... at
// file:line" or "std::bad_alloc". Before: d_model = 10^9 passed --dry-run and ended in
// "check failed: t.data != nullptr at ../kernels/cpu/cpu_backend.cc:44"; max_positions =
// 2·10^9 in "std::bad_alloc"; 10^6 layers laid out its parameter table for minutes (a
// linear search per tensor) before failing; train.threads = 100000 segfaulted in OpenMP;
// train.accumulate = 10^8 ran 10^8 one-token micro-batches a step.
#include <gtest/gtest.h>

#include <new>
#include <string>
#include <vector>

#include "common/error.h"
#include "config/config.h"
#include "program.h"
#include "train/footprint.h"

namespace thpc {
namespace {

const std::string kTrainer = THPC_BINARY_DIR "/transformer_hpc " THPC_SOURCE_DIR "/input/tiny.ini "
                             "--train.max_steps=1 --checkpoint.dir=/nonexistent/never/written ";

// The command must stop with exit 2 and an error line holding `why`, in the user's words.
void expect_configuration_error(const std::string& arguments, const std::string& why) {
  for (const char* mode : {"--dry-run", ""}) {
    SCOPED_TRACE(arguments + " " + mode);
    const ProcessResult run = run_process(kTrainer + arguments + " " + mode);
    EXPECT_EQ(run.exit_code, 2) << run.output;
    EXPECT_NE(run.output.find(why), std::string::npos) << run.output;
    EXPECT_EQ(run.output.find("check failed"), std::string::npos) << run.output;
    EXPECT_EQ(run.output.find("bad_alloc"), std::string::npos) << run.output;
  }
}

TEST(UserErrors, SizesThatCannotBeAllocatedAreRefusedFromTheConfiguration) {
  expect_configuration_error("--model.d_model=1000000000 --model.heads=1",
                             "the model is too large to train here: model.layers = 2, d_model = "
                             "1000000000");
  expect_configuration_error("--model.layers=1000000", "model.layers = 1000000");
  expect_configuration_error("--model.d_k=2000000000 --model.d_v=2000000000",
                             "the model is too large to train here");
  expect_configuration_error("--model.max_positions=2000000000",
                             "model.max_positions = 2000000000 rows");
}

TEST(UserErrors, ImpossibleValuesThatPassedTheDryRunAreRefused) {
  expect_configuration_error("--train.threads=100000", "train.threads: 100000 is more than");
  expect_configuration_error("--train.tokens_per_step=100 --train.accumulate=1000",
                             "train.accumulate: 1000 micro-batches cannot share");
}

TEST(UserErrors, TheFootprintIsComputedWithoutOverflowAndBoundsTheParameterTable) {
  Config config;
  config.model.d_model = 2147483647;
  config.model.d_ff = 2147483647;
  config.model.heads = 1;
  config.model.layers = 2147483647;
  const TrainingFootprint huge = training_footprint(config.model, 2147483647, config.train);
  EXPECT_GT(huge.bytes, 1e29L);  // about 10^11 times what an int64 holds
  // The paper's base model on its 37000-piece vocabulary: at least the matrices' weights.
  Config base;
  base.model.layers = 6;
  base.model.d_model = 512;
  base.model.d_ff = 2048;
  base.model.heads = 8;
  const TrainingFootprint paper = training_footprint(base.model, 37000, base.train);
  EXPECT_LE(paper.parameters, 63045632.0L);  // the exact count of input/base.ini
  EXPECT_GT(paper.parameters, 0.99L * 63045632.0L);  // biases and norms are the rest
  EXPECT_TRUE(training_does_not_fit(base, 37000, 8e9L).empty());
  EXPECT_FALSE(training_does_not_fit(base, 37000, 1e8L).empty());
}

TEST(UserErrors, AFailedAllocationSaysWhichSizesToLower) {
  const std::bad_alloc failure;
  const std::string message = failure_message(failure);
  EXPECT_NE(message.find("out of memory"), std::string::npos) << message;
  EXPECT_NE(message.find("train.tokens_per_step"), std::string::npos) << message;
  EXPECT_EQ(failure_message(Error("a plain message")), "a plain message");
}

}  // namespace
}  // namespace thpc
