// The trainer as an MPI job, run through mpirun as a user would: every rank announces
// itself, the ranks finish with identical parameters, and a failure on one rank ends the
// whole job quickly with a message naming the rank, host and cause.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <string>

namespace {

struct JobResult {
  int exit_code = -1;
  std::string output;
  double seconds = 0;
};

// Runs `env mpirun -np 2 transformer_hpc input/tiny.ini args` and captures stdout+stderr.
// `timeout` bounds a hang so that a broken abort fails the test instead of CI.
JobResult mpirun_trainer(const std::string& env, const std::string& args) {
  const std::string command = "cd " THPC_SOURCE_DIR " && " + env +
                              " OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1"
                              " timeout 120 " THPC_MPIEXEC " -np 2 --oversubscribe " THPC_BINARY_DIR
                              "/transformer_hpc input/tiny.ini " + args + " 2>&1";
  const auto start = std::chrono::steady_clock::now();
  JobResult run;
  FILE* pipe = popen(command.c_str(), "r");
  EXPECT_NE(pipe, nullptr) << command;
  if (pipe == nullptr) return run;
  char buffer[4096];
  size_t n;
  while ((n = fread(buffer, 1, sizeof(buffer), pipe)) > 0) run.output.append(buffer, n);
  const int status = pclose(pipe);
  run.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  run.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return run;
}

TEST(Distributed, TwoRanksTrainAndAnnounceThemselves) {
  const JobResult run = mpirun_trainer("", "--train.max_steps=4 --train.log_every=2");
  EXPECT_EQ(run.exit_code, 0) << run.output;
  EXPECT_NE(run.output.find("rank 0/2 local 0/2 on "), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("rank 1/2 local 1/2 on "), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("on 2 ranks"), std::string::npos) << run.output;
  // Only rank 0 logs progress, and the job ends with one final line (the ranks' digests
  // were compared before it was printed).
  size_t finals = 0;
  for (size_t at = run.output.find("final: step=4"); at != std::string::npos;
       at = run.output.find("final: step=4", at + 1)) {
    ++finals;
  }
  EXPECT_EQ(finals, 1u) << run.output;
}

TEST(Distributed, AFailingRankEndsTheJobWithinThirtySeconds) {
  const JobResult run = mpirun_trainer("THPC_FAIL_AT=1:3", "--train.max_steps=50 --train.log_every=1");
  EXPECT_NE(run.exit_code, 0) << run.output;
  EXPECT_NE(run.exit_code, 124) << "the job hung until timeout killed it:\n" << run.output;
  EXPECT_LT(run.seconds, 30.0) << run.output;
  EXPECT_NE(run.output.find("error on rank 1 on "), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("THPC_FAIL_AT=1:3 at step 3"), std::string::npos) << run.output;
  EXPECT_EQ(run.output.find("final:"), std::string::npos) << run.output;
}

TEST(Distributed, ABadConfigFailsEveryRankWithOneMessage) {
  const JobResult run = mpirun_trainer("", "--model.heads=3");
  EXPECT_EQ(run.exit_code, 2) << run.output;
  const std::string needle = "model.heads: d_model 64 is not divisible by heads 3";
  const size_t first = run.output.find(needle);
  EXPECT_NE(first, std::string::npos) << run.output;
  EXPECT_EQ(run.output.find(needle, first + 1), std::string::npos) << run.output;
}

}  // namespace
