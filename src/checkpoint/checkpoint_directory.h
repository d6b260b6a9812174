// The checkpoints of a directory, as a whole: listed in step order, the newest healthy
// and the newest that reads back valid, the best ranked and changed by a validation,
// pruned, moved aside when corrupt, averaged. The policies over many files; the format of
// one file (its HDF5 layout, header, checksums) is checkpoint.h's.
#pragma once

#include <iosfwd>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "common/progress.h"

namespace thpc {

// The step_*.h5 files of `dir` with their headers, in the order of the step stored in
// them (the file name's step for older headers; the name breaks ties), oldest first: what
// resume=auto, pruning and averaging act on (a missing dir has none). A file whose header
// does not parse is listed with the step of its name, healthy: reading it is what finds it
// invalid.
std::vector<CheckpointSummary> checkpoint_summaries(const std::string& dir);
// Their paths, in that order.
std::vector<std::string> list_checkpoints(const std::string& dir);
// The paths of the newest `count` healthy checkpoints of `dir`, oldest first (fewer if
// fewer exist): what averaging the last N of a run takes. With `every_steps` > 0, those
// of that schedule only: its multiples, and `last_step` (the run's end).
std::vector<std::string> newest_healthy_checkpoints(const std::string& dir, int count,
                                                    int64_t every_steps = 0,
                                                    int64_t last_step = -1);

// The best_step_*.h5 files of `dir` whose header holds a validation score, ranked best
// first by rank_best_checkpoints(). Files of every metric are listed; a caller that ranks
// one metric's keeps those (checkpoint.keep_best never changes within a run unless a
// resume changes it).
std::vector<CheckpointSummary> best_checkpoint_summaries(const std::string& dir);

// Sorts checkpoints of one metric best first: the better value (lower perplexity, higher
// BLEU, chrF or F1), then, for equal values, the earlier step (a later equal value is no
// improvement, as for best.h5), then the path. Every summary must have a validation.
void rank_best_checkpoints(std::vector<CheckpointSummary>& summaries);

// What one validation does to a run's k best checkpoints (checkpoint.keep_best_count =
// `count`): `kept` are the best checkpoints of the run's metric on disk (any order), the
// validation at `step` scored `score`. A kept file of the same step is the same step
// validated again (a resumed run, or one rolled back, repeating it): it gives way to the
// new score. The new checkpoint is admitted when it ranks among the `count` best (a
// score that is not finite never is); the files that no longer rank there are removed.
struct BestSetChange {
  bool admitted = false;  // write best_checkpoint_file_name(step)
  int rank = 0;           // its rank when admitted, 1 = the best
  std::vector<CheckpointSummary> removed;  // to delete, worst first
};
BestSetChange change_best_set(std::vector<CheckpointSummary> kept, const ValidationScore& score,
                              int64_t step, int count);

// The paths of the `count` best checkpoints of `dir` (best_checkpoint_summaries()),
// oldest step first: what averaging the N best of a run takes. Throws thpc::Error naming
// `dir` when its best checkpoints were kept for different metrics; `metric` receives
// theirs ("" when there are none). Fewer when fewer exist. With `only_metric` (a run that
// keeps the best by it) those kept for another metric, an earlier setting's, are passed
// over, as its ranking passes over them.
std::vector<std::string> best_checkpoints(const std::string& dir, int count, std::string* metric,
                                          const std::string& only_metric = "");

// The newest healthy checkpoint of `dir` (by stored step) that reads back valid, or "" if
// none does; each invalid file skipped on the way gets a warning line on `warnings`, and its
// path and the reason (thpc::Error's line) are appended to `invalid` when given; each
// newer one that is diverged or superseded gets a note line. `loaded` receives its contents.
// A checkpoint of a later version (CheckpointOfANewerVersion) is not skipped: its error
// goes to the caller.
struct InvalidCheckpoint {
  std::string path;
  std::string reason;
};
std::string newest_valid_checkpoint(const std::string& dir, std::ostream& warnings,
                                    Checkpoint* loaded,
                                    std::vector<InvalidCheckpoint>* invalid = nullptr);

// Renames an invalid checkpoint to PATH.corrupt (PATH.corrupt.1, ... if taken): out of the
// way of list_checkpoints() and of the run, which would otherwise write the same step's
// file over it, and kept as evidence. Returns the new path; throws thpc::Error naming both.
std::string move_aside_corrupt(const std::string& path);

// Deletes step_*.h5 files of `dir` until `keep` remain: first the diverged and superseded
// ones, oldest first, then the oldest healthy ones (with `every_steps` > 0, a schedule by
// steps alone, those off the schedule before those on it: a stop checkpoint of a requeued
// job, which the averaged window passes over, goes before a step of that window; two
// requeues in one window pruned one of its steps); never `protected_path` (the one just
// written), never the newest healthy one, and never the newest healthy one older than
// `protected_path`: the next step's loss judges the parameters just written, and may
// mark them diverged, so the one before them is the run's last checkpoint known good (with
// keep = 1 two files stay). A run that diverges keeps a checkpoint to resume from. An
// off-schedule one that stays for those reasons is not counted in `keep`: the schedule's
// last `keep` stay beside it. Returns the deleted paths.
// `last_step` (the run's train.max_steps): on the schedule too, as its average takes it.
std::vector<std::string> prune_checkpoints(const std::string& dir, int keep,
                                           const std::string& protected_path,
                                           int64_t every_steps = 0, int64_t last_step = 0);

// The parameters of `paths`, averaged element-wise in double precision; the result is
// parameters-only, carries the newest input's step, seed, config, world size and
// SentencePiece model. Refuses (thpc::Error naming the files) inputs whose
// architectures, tensors or SentencePiece models differ. `progress` is told of one stage,
// the checkpoints read and added to the sum.
Checkpoint average_checkpoints(const std::vector<std::string>& paths,
                               ProgressListener& progress = ProgressListener::none());

}  // namespace thpc
