// SIGTERM and SIGUSR1 (what Slurm sends before a time limit or a preemption) ask the
// training loop to stop: the handler only sets a flag, and the loop finishes the step it
// is in, writes a checkpoint and exits 0, so the job can be requeued and resumed.
#pragma once

namespace thpc {

// Installs the handlers for SIGTERM and SIGUSR1 while it lives, clearing any earlier
// request; the previous handlers come back when it is destroyed.
class StopSignalGuard {
 public:
  StopSignalGuard();
  ~StopSignalGuard();
  StopSignalGuard(const StopSignalGuard&) = delete;
  StopSignalGuard& operator=(const StopSignalGuard&) = delete;
};

// The signal number that asked to stop, or 0 if none has.
int stop_requested_by();

}  // namespace thpc
