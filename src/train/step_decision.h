// What every rank does after a step's gradients are summed, decided once for all ranks.
//
// Rank 0 decides from its own clock and its judgement of the step (checkpoint due, time
// limit reached, divergence); any rank may have received the stop signal (Slurm signals
// every task, but a user's `kill` may reach one rank only). One collective agrees on the
// whole decision: an element-wise maximum over the ranks, to which the ranks other than 0
// contribute their stop signal only. Every rank then saves, stops, skips or rolls back
// at the same step, and none consults its own clock.
#pragma once

#include <cstdint>

#include "distributed/communicator.h"
#include "train/divergence.h"

namespace thpc {

struct StepDecision {
  int stop_signal = 0;           // a stop signal (stop_request.h) some rank received; 0 = none
  bool checkpoint_due = false;   // rank 0: checkpoint_due() on its clock
  bool out_of_time = false;      // rank 0: train.max_minutes reached on its clock
  DivergenceKind divergence = DivergenceKind::None;  // rank 0's judgement of the step

  // The decision of every rank, from this rank's `mine` (rank 0's fields other than the
  // signal are taken from rank 0 alone). One MPI_Iallreduce (MPI_MAX, Communicator::max),
  // waited for within dist.timeout_s while the step's WaitLimit lives; the identity on one
  // rank.
  static StepDecision agree(const Communicator& comm, const StepDecision& mine);
};

// The stop signal any rank has received (0 if none), agreed by every rank: for the points
// between steps where the job can stop together (start-up, after a validation).
int stop_signal_of_any_rank(const Communicator& comm);

}  // namespace thpc
