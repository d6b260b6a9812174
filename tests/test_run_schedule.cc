// When the training loop logs, validates, saves and stops (src/train/run_schedule.h):
// each trigger on its own, its 0 meaning off, and the last step logged and validated
// whatever the intervals say. How the loop acts on the answers (every rank saving at the
// same step, the time limit and patience ending a run) is tested through whole runs in
// test_checkpoint.cc and test_best_checkpoints.cc.
#include <gtest/gtest.h>

#include <sstream>
#include <string>

#include "checkpoint/checkpoint.h"
#include "config/config.h"
#include "train/resume.h"
#include "train/run_schedule.h"

namespace thpc {
namespace {

Config ten_steps() {
  Config config;
  config.train.max_steps = 10;
  config.train.log_every = 4;
  config.train.valid_every = 3;
  config.train.max_minutes = 0.0f;
  config.checkpoint.minutes = 0.0f;
  config.checkpoint.every_steps = 0;
  config.checkpoint.patience = 0;
  return config;
}

TEST(RunSchedule, LogsEveryIntervalAndTheLastStep) {
  const RunSchedule schedule(ten_steps());
  for (int64_t step = 1; step <= 10; ++step) {
    EXPECT_EQ(schedule.log_due(step), step == 4 || step == 8 || step == 10) << step;
  }
  EXPECT_TRUE(schedule.is_last_step(10));
  EXPECT_FALSE(schedule.is_last_step(9));
  EXPECT_EQ(schedule.max_steps(), 10);
}

TEST(RunSchedule, ValidatesEveryIntervalAndTheLastStepOnlyWhenItValidates) {
  Config config = ten_steps();
  const RunSchedule validating(config);
  for (int64_t step = 1; step <= 10; ++step) {
    EXPECT_EQ(validating.validation_due(step), step % 3 == 0 || step == 10) << step;
  }
  config.train.valid_every = 0;
  const RunSchedule not_validating(config);
  for (int64_t step = 1; step <= 10; ++step) EXPECT_FALSE(not_validating.validation_due(step));
}

TEST(RunSchedule, CheckpointsByStepsAndByTime) {
  Config config = ten_steps();
  config.checkpoint.minutes = 0.5f;
  EXPECT_FALSE(RunSchedule(config).checkpoint_due(7, 29.9));
  EXPECT_TRUE(RunSchedule(config).checkpoint_due(7, 30.0));
  config.checkpoint.every_steps = 4;
  EXPECT_TRUE(RunSchedule(config).checkpoint_due(8, 0.0));
  EXPECT_FALSE(RunSchedule(config).checkpoint_due(9, 0.0));
  config.checkpoint.minutes = 0.0f;  // by time off
  EXPECT_FALSE(RunSchedule(config).checkpoint_due(9, 1e9));
  config.checkpoint.every_steps = 0;  // both off: only the run's end and signals save
  for (int64_t step = 1; step <= 10; ++step) {
    EXPECT_FALSE(RunSchedule(config).checkpoint_due(step, 1e9));
  }
}

TEST(RunSchedule, TheTimeLimitCountsTrainingSeconds) {
  Config config = ten_steps();
  EXPECT_FALSE(RunSchedule(config).out_of_time(1e12)) << "0 minutes: no limit";
  config.train.max_minutes = 1.5f;
  EXPECT_FALSE(RunSchedule(config).out_of_time(89.9));
  EXPECT_TRUE(RunSchedule(config).out_of_time(90.0));
}

TEST(RunSchedule, PatienceCountsValidationsSinceTheBest) {
  Config config = ten_steps();
  EXPECT_FALSE(RunSchedule(config).patience_exhausted(1000)) << "0: never";
  config.checkpoint.patience = 3;
  EXPECT_FALSE(RunSchedule(config).patience_exhausted(2));
  EXPECT_TRUE(RunSchedule(config).patience_exhausted(3));
}

// train.max_epochs' last step: the step that reads the last micro-batch of the last
// epoch, counted from where the data stands (a resume reads on from its position), a
// step's ranks x accumulate micro-batches at a time; none left, the step already done;
// and a limit whose batches int64 cannot count is no limit rather than an overflow.
TEST(RunSchedule, TheEpochsEndAtTheStepThatReadsTheirLastBatch) {
  // 2 epochs of 10 micro-batches, 4 a step: 20 batches, steps 1-5 (the 5th reads 17-20).
  EpochsEnd end = end_of_epochs(2, 10, 4, 0, 0);
  EXPECT_EQ(end.left, 20);
  EXPECT_EQ(end.last_step, 5);
  // Resumed after step 3 (12 batches read): 8 left, two more steps.
  end = end_of_epochs(2, 10, 4, 12, 3);
  EXPECT_EQ(end.left, 8);
  EXPECT_EQ(end.last_step, 5);
  // 9 left of 4 a step: the third step reads the last one (and 3 of the next epoch).
  end = end_of_epochs(2, 10, 4, 11, 3);
  EXPECT_EQ(end.last_step, 6);
  // Past the last batch (a run resumed with fewer epochs): nothing left, no step more.
  end = end_of_epochs(1, 10, 4, 12, 3);
  EXPECT_EQ(end.left, 0);
  EXPECT_EQ(end.last_step, 3);
  // 10^18 epochs of 100 batches: beyond int64, no limit.
  end = end_of_epochs(1000000000000000000, 100, 4, 0, 0);
  EXPECT_EQ(end.left, INT64_MAX);
  EXPECT_EQ(end.last_step, INT64_MAX);
  // Steps left that the completed count cannot add: no limit either.
  end = end_of_epochs(4, INT64_MAX / 4, 1, 0, 10);
  EXPECT_EQ(end.last_step, INT64_MAX);
}


// A resume whose schedule gives the next step another learning rate says so, with both
// rates and their ratio (rollbacks' factor in both); a resume changing other keys, or
// whose stored configuration this version cannot read, says nothing of it.
namespace lr_jump {

std::string resume_notes(const Config& then, const Config& now) {
  Checkpoint checkpoint;
  checkpoint.step = 5999;
  checkpoint.config_ini = then.to_ini();
  DivergenceState rolled_back;
  rolled_back.lr_factor = 0.5;
  checkpoint.divergence = rolled_back;
  std::ostringstream log;
  log_resume_notes(checkpoint, "ck/step_00005999.h5", stored_configuration(checkpoint), now, 1,
                   false, "", log);
  return log.str();
}

TEST(ResumeNotes, AChangedScheduleSaysTheLearningRatesJump) {
  const Config then;  // d_model 512, warmup 4000: the paper's
  Config longer_warmup = then;
  longer_warmup.train.warmup_steps = 8000;
  // 512^-0.5 x 6000 x 8000^-1.5 x 0.5 against 512^-0.5 x 6000^-0.5 x 0.5
  EXPECT_NE(resume_notes(then, longer_warmup)
                .find("note: the learning rate of step 6000 is 1.853e-04 where the "
                      "checkpoint's run would have given 2.853e-04 (0.65x): the schedule's "
                      "settings changed, and the rate jumps there\n"),
            std::string::npos)
      << resume_notes(then, longer_warmup);
  Config scaled = then;
  scaled.train.lr_scale = 2.0;
  EXPECT_NE(resume_notes(then, scaled).find("is 5.705e-04 where the checkpoint's run would "
                                            "have given 2.853e-04 (2.00x)"),
            std::string::npos)
      << resume_notes(then, scaled);
  Config more_steps = then;
  more_steps.train.max_steps = 200000;
  EXPECT_EQ(resume_notes(then, more_steps).find("note: the learning rate"), std::string::npos)
      << resume_notes(then, more_steps);
  Checkpoint unreadable;
  unreadable.step = 10;
  unreadable.config_ini = "[train]\nno_such_key = 1\n";
  std::ostringstream log;
  log_resume_notes(unreadable, "ck.h5", stored_configuration(unreadable), longer_warmup, 1, false,
                   "", log);
  EXPECT_EQ(log.str().find("note: the learning rate"), std::string::npos) << log.str();
}

}  // namespace lr_jump

// What a resume records as changed (kSettingsChanged's line): the settings that take effect,
// those without effect here with why (a key idle on one rank that a later resume on two
// made count was never recorded: a review's finding), and the number of ranks.
TEST(ResumeNotes, TheChangesRecordedNameTheRanksAndTheKeysWithoutEffect) {
  Config then;
  then.train.max_steps = 4;
  Config now = then;
  now.train.max_steps = 6;
  now.dist.reduce_dtype = "bf16";  // no effect on one rank
  Checkpoint checkpoint;
  checkpoint.step = 4;
  checkpoint.world_size = 2;
  checkpoint.config_ini = then.to_ini();
  std::ostringstream log;
  const ResumeNotes notes = log_resume_notes(checkpoint, "ck.h5", stored_configuration(checkpoint),
                                             now, 1, false, "", log);
  EXPECT_EQ(notes.changed.rfind("ranks = 1 (was 2), train.max_steps = 6 (was 4), "
                                "dist.reduce_dtype = bf16 (was fp32; ",
                                0),
            0u)
      << notes.changed;
  EXPECT_EQ(notes.idle_keys, std::vector<std::string>{"dist.reduce_dtype"});
  checkpoint.world_size = 1;
  checkpoint.config_ini = now.to_ini();
  EXPECT_EQ(log_resume_notes(checkpoint, "ck.h5", stored_configuration(checkpoint), now, 1,
                             false, "", log)
                .changed,
            "");
}

// A resume computed otherwise than the checkpoint's steps (another matrix-product library
// or kernels, another GPU, another backend) says so, naming both: its losses may then
// differ from an uninterrupted run's in the last bits. The same identity, or a checkpoint
// that records none (written before it was stored), says nothing.
TEST(ResumeNotes, AResumeComputedOtherwiseSaysItsLossesMayDiffer) {
  const Config config;
  Checkpoint checkpoint;
  checkpoint.config_ini =
      config.to_ini({header_line(kComputedBy, "cpu-fp32, OpenBLAS 0.3.21 Haswell kernels")});
  const auto note = [&](const std::string& now) {
    std::ostringstream log;
    note_other_arithmetic(checkpoint, now, log);
    return log.str();
  };
  EXPECT_EQ(note("cpu-fp32, OpenBLAS 0.3.21 SkylakeX kernels"),
            "note: the checkpoint's steps were computed by cpu-fp32, OpenBLAS 0.3.21 Haswell "
            "kernels; this run's are by cpu-fp32, OpenBLAS 0.3.21 SkylakeX kernels: training "
            "goes on, but its losses may differ from those of a run computed by one of them "
            "throughout in the last bits (matrix products and sums taken in another order "
            "round otherwise)\n");
  EXPECT_EQ(note("cpu-fp32, OpenBLAS 0.3.21 Haswell kernels"), "");
  checkpoint.config_ini = config.to_ini();
  EXPECT_EQ(note("cpu-fp32, OpenBLAS 0.3.21 SkylakeX kernels"), "");
}

}  // namespace
}  // namespace thpc
