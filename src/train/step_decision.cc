#include "train/step_decision.h"

#include <vector>

#include "train/stop_request.h"

namespace thpc {

StepDecision StepDecision::agree(const Communicator& comm, const StepDecision& mine) {
  const bool root = comm.is_root();
  // The order of the fields in the collective; the signal numbers are positive, so the
  // maximum of two signals is one of them (SIGTERM over SIGUSR1 when both came).
  const std::vector<int64_t> agreed = comm.max({
      static_cast<int64_t>(mine.stop_signal),
      root && mine.checkpoint_due ? 1 : 0,
      root && mine.out_of_time ? 1 : 0,
      root ? static_cast<int64_t>(mine.divergence) : 0,
  });
  StepDecision decision;
  decision.stop_signal = static_cast<int>(agreed[0]);
  decision.checkpoint_due = agreed[1] != 0;
  decision.out_of_time = agreed[2] != 0;
  decision.divergence = static_cast<DivergenceKind>(agreed[3]);
  return decision;
}

int stop_signal_of_any_rank(const Communicator& comm) {
  return static_cast<int>(comm.max({static_cast<int64_t>(stop_requested_by())})[0]);
}

}  // namespace thpc
