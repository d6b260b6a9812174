// The ranks' start-up agreement: before the first step every rank must read the same
// data, the same checkpoint and so hold the same parameters, or the job stops on every
// rank with one message naming the ranks that differ (a rank that trained apart never
// agrees again, and one that read other data leaves the others waiting at an epoch's end).
// Each check is a collective: every rank calls it.
#pragma once

#include <string>

#include "checkpoint/checkpoint.h"
#include "data/batch_source.h"
#include "distributed/communicator.h"
#include "distributed/rank_failures.h"

namespace thpc {

// Every rank reads the same vocabulary (size, special ids, SentencePiece model), the
// same number of pairs and the same pairs (their digest, BatchSource::corpus_sha256);
// else AllRanksError (exit 3) naming what each read from `data_dir`. `split` says which
// ("training", or "validation": ranks that validated on different shards logged a loss
// of both sets and scored one rank's translations against another's references).
void check_every_rank_reads_the_same_data(const Communicator& comm, const BatchSource& source,
                                          const std::string& data_dir,
                                          const std::string& split = "training");

// What a failure `error` of this rank means for the job, for throw_if_any_rank_failed:
// training's exit code for it (docs/running.md "Exit codes": 3 for the data, 2 for a
// ConfigurationError, an AllRanksError's own, else 1) and its message; an AllRanksError
// speaks for every rank (its own `where`), the others for this one.
RankFailure failure_of(const std::exception& error);

// Runs `phase` on this rank, then gathers every rank's failure (failure_of): the first is
// thrown on every rank (an AllRanksError naming its rank unless every rank failed alike),
// so that the next collective finds every rank there instead of a rank gone.
template <typename Phase>
void on_every_rank(const Communicator& comm, Phase&& phase) {
  RankFailure failure;
  try {
    phase();
  } catch (const AllRanksError& error) {
    // One of exit 0 (a stop signal at start-up, StoppedDuringStartUp) is no failure to
    // gather, which would take it for none: every rank raised it together, as such errors
    // are raised.
    if (error.exit_code() == 0) throw;
    failure = failure_of(error);
  } catch (const std::exception& error) {
    failure = failure_of(error);
  }
  throw_if_any_rank_failed(comm, failure);
}

// Every rank reads `path`, which rank 0 chose and has read into *checkpoint already (the
// others read it into theirs); all succeed at rank 0's step or all throw AllRanksError
// naming the ranks that could not (a shared filesystem that has not caught up).
void read_the_checkpoint_rank_zero_chose(const Communicator& comm, const std::string& path,
                                         Checkpoint* checkpoint);

// Every rank holds rank 0's parameters (`digest`: their sha256) after starting from
// `source` ("checkpoint PATH", "checkpoint.init PATH" or "train.seed"); else AllRanksError
// (exit 1) naming the ranks and the source.
void check_every_rank_starts_from_the_same_parameters(const Communicator& comm,
                                                      const std::string& digest,
                                                      const std::string& source);

}  // namespace thpc
