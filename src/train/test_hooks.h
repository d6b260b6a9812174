// The test suite's hooks into a run, read from the environment: each fakes what a real
// run meets rarely and at no chosen moment (a rank failing, killed or stopped mid-step, a
// NaN loss, an exploding validation, a stop signal at an exact step, a slow checkpoint
// write), so that the tests of what the run does then can hold it to the step. In one
// file, so that a reader of the trainer sees each hook where it acts, and main can warn
// of those set (a shell that ran the tests keeps them). The environment is read at each
// call: a test process's second trainer sees its own settings.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "distributed/communicator.h"

namespace thpc {

// Where in a step (or before the first) a failure is injected.
enum class InjectionPoint {
  Configuration,
  StartUp,
  StepStart,
  SumsPrepared,
  Validation,
  Scoring,
  Validated,
  Exit
};

// THPC_FAIL_AT=RANK:STEP makes that rank throw at the start of that step, as a real fault
// (an out-of-memory, a bad file) would; THPC_KILL_AT=RANK:STEP makes it die there by
// SIGKILL, as a rank the kernel's OOM killer or a node failure takes, while the other
// ranks go on into the step's gradient sums; THPC_STOP_AT=RANK:STEP stops it there by
// SIGSTOP, as Ctrl-Z, a debugger or a hung file system would hold it, alive to MPI but
// never coming (RANK:STEP:gradients: after the step's collectives before its forward, so
// that the others wait in the gradient sum; RANK:STEP:validation: as the validation after
// step STEP starts; RANK:STEP:scoring: as that validation's translations are gathered,
// rank 0 about to score them, the others to wait for the score; RANK:STEP:validated: as
// the ranks come out of that validation, to agree on a stop signal that came during it;
// RANK:0:start-up: as the trainer starts, before the data is read; RANK:0:configuration:
// before the rank reads its configuration, the others then waiting to compare theirs;
// RANK:0:exit: as the program leaves, before MPI_Finalize).
void maybe_inject_failure(const Communicator& comm, int64_t step, InjectionPoint point);

// THPC_TEST_SLOW_START_UP=RANK:SECONDS: that rank's start-up takes SECONDS longer, spent
// as a slow read of a large checkpoint is, in pieces with a sign of work after each
// (show_still_working), so that tests see the other ranks wait for it past dist.timeout_s.
void slow_start_up_if_asked(const Communicator& comm);

// THPC_TEST_NAN_LOSS_AT=N: whether the N-th step this process computes (`computed`,
// 1-based, counting steps left out or repeated) reports a NaN loss on every rank, as a
// step whose batch overflowed would; RANK:N makes only that rank's share NaN, which the
// sum over ranks spreads.
bool poison_this_loss(const Communicator& comm, int64_t computed);

// THPC_TEST_VALID_NLL_AT=STEP:NLL: the NLL the validation at `step` reports on every rank
// (a validation whose perplexity exploded), for DivergenceHandling's tests; nothing for
// other steps.
std::optional<double> injected_validation_nll(int64_t step);

// THPC_TEST_STOP_AT_STEP=K: the step after which the process sends itself SIGTERM, so that
// tests interrupt a run at an exact step instead of racing a kill against the log; 0 when
// unset.
int64_t injected_stop_step();

// THPC_TEST_CHECKPOINT_WRITE_DELAY_MS=N: how long each background checkpoint write is held
// before it starts, so that tests see training go on beside it and a stop wait for it,
// whatever the speed of the machine (docs/checkpoints.md); held as a slow write is, with
// a sign of work every 50 ms (show_still_working). THPC_TEST_CHECKPOINT_WRITE_STALL_MS=N:
// held without any, as a write on a hung file system is. Read on the training thread.
struct InjectedWriteDelay {
  std::chrono::milliseconds slow{0};
  std::chrono::milliseconds stalled{0};
};
InjectedWriteDelay injected_checkpoint_write_delay();
// Holds the writer's thread as `delay` says.
void hold_checkpoint_write(const InjectedWriteDelay& delay);

// The hooks this environment sets, "NAME=VALUE" each (main warns of each: a run that
// inherits one from a shell that ran the tests was told of a divergence or a SIGTERM that
// never happened).
std::vector<std::string> test_hooks_set();

}  // namespace thpc
