// Checkpoint keeping: what a run saves, keeps, prunes, averages, marks and names to resume
// from, in checkpoint.dir (after fairseq's checkpoint_utils beside its trainer). The
// training loop decides when; this says what happens to the files. Rank 0's business: the
// trainer calls it on rank 0 and agrees the outcome with the other ranks.
#pragma once

#include <cstdint>
#include <functional>
#include <iosfwd>
#include <string>

#include "checkpoint/checkpoint.h"
#include "config/config.h"
#include "train/run_log.h"

namespace thpc {

class CheckpointKeeping {
 public:
  // `config` must outlive this (the trainer's own copy).
  explicit CheckpointKeeping(const Config& config) : config_(config) {}

  // Writes DIR/step_NNNNNNNN.h5 holding `state` (of step state.step), says so with its
  // size and the copy's and the write's seconds (`copy_seconds`: the snapshot's), and
  // prunes to checkpoint.keep (prune_checkpoints: diverged ones first, never the newest
  // healthy one nor the last one known good). Returns the path.
  std::string save(const Checkpoint& state, double copy_seconds, std::ostream& log) const;

  // After a validation of the checkpoint.keep_best metric scored `value` (its field as
  // logged) at `step`: writes DIR/best.h5 when it `improved` on the run's best, and, with
  // checkpoint.keep_best_count, updates the k best DIR/best_step_NNNNNNNN.h5
  // (change_best_set). Each holds `state_of_step()` (asked for once, when a file is due),
  // written atomically like the others, with the score inside; none is a step_*.h5, so the
  // rotation of checkpoint.keep and resume=auto leave them alone.
  void keep_best(const std::string& metric, const LogField& value, bool improved, int64_t step,
                 const std::function<Checkpoint()>& state_of_step, std::ostream& log) const;

  // At the end of training (step `step`): DIR/average_lastN.h5 (checkpoint.average_last,
  // `best` false) of the newest healthy checkpoints, or DIR/average_bestN.h5
  // (checkpoint.average_best, `best` true) of the kept best ones. A failure costs the
  // average, said on `log`, not the run.
  void write_average(bool best, int64_t step, std::ostream& log) const;

  // The healthy checkpoints of run `run_id` (and those written before ids were stored):
  // with `newer_than` < 0 the one of `step` is marked diverged (its parameters produced
  // the divergent loss of step + 1); with `newer_than` >= 0 every one of a later step is
  // marked superseded (the branch a rollback to `newer_than` abandons).
  void mark_abandoned(const std::string& run_id, int64_t step, int64_t newer_than,
                      std::ostream& log) const;
  // Every healthy checkpoint of run `run_id` after step `last_passed`, the last validation
  // the model passed, marked diverged (a validation after it exploded).
  void mark_after_failed_validation(const std::string& run_id, int64_t last_passed,
                                    std::ostream& log) const;

  // The checkpoint of run `run_id` at `step` once marked diverged, or "".
  std::string diverged_parameters_file(const std::string& run_id, int64_t step) const;
  // "PATH (step S, loss L)": the newest healthy checkpoint of checkpoint.dir, the one to
  // resume from; "none (...)" when there is none.
  std::string resume_point() const;

  // After a resume: a DIR/best.h5 that does not verify is moved aside (best.h5.corrupt)
  // with a warning; true when it was (the caller drops the run's best value with it).
  bool move_aside_a_damaged_best(std::ostream& log) const;

 private:
  const Config& config_;
};

}  // namespace thpc
