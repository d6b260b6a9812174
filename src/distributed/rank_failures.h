// Each rank's failure at a step that every rank takes together (reading the data at
// start-up, the checkpoint rank 0 chose, --dry-run, --eval's model), gathered so that the
// job ends with one message and one exit code from every rank, instead of each rank
// aborting with its own copy of the message and Open MPI's report of the abort.
// Collectives: every rank calls them.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "distributed/communicator.h"

namespace thpc {

// One rank's outcome: `exit_code` 0 when it did not fail; else the program's exit code for
// the failure (docs/running.md "Exit codes") and its message, in the user's words.
// `where` names the rank in the job's message ("rank R on HOST", process_identity()), or
// is "" for a failure that speaks for the whole job (one every rank raised together).
struct RankFailure {
  int exit_code = 0;
  std::string message;
  std::string where;

  static RankFailure none() { return {}; }
  // This rank's own failure: `where` is this process.
  static RankFailure here(int exit_code, const std::string& message);
  // A failure every rank raised together (an AllRanksError).
  static RankFailure for_the_job(int exit_code, const std::string& message);
};

// What the job reports when some rank failed.
struct JobFailure {
  int exit_code = 0;            // the first failing rank's
  std::string message;          // the first failing rank's
  std::string where;            // its `where`; "" when every rank failed with that message
  std::vector<int> ranks;       // the failing ranks, ascending
  std::vector<std::string> messages;  // their messages, in the order of `ranks`
};

// The first failure among the ranks' (`mine`, this rank's), or nothing when none failed.
std::optional<JobFailure> gather_failures(const Communicator& comm, const RankFailure& mine);

// Throws AllRanksError (the first failure's message, exit code and place) on every rank
// when any rank failed; returns on every rank when none did.
void throw_if_any_rank_failed(const Communicator& comm, const RankFailure& mine);

}  // namespace thpc
