// Checkpoint keeping: what a run saves, keeps, prunes, averages, marks and names to resume
// from, in checkpoint.dir (after fairseq's checkpoint_utils beside its trainer). The
// training loop decides when; this says what happens to the files. Rank 0's business: the
// trainer calls it on rank 0 and agrees the outcome with the other ranks.
#pragma once

#include <cstdint>
#include <functional>
#include <future>
#include <iosfwd>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "checkpoint/checkpoint_directory.h"
#include "config/config.h"
#include "train/run_log.h"

namespace thpc {

// `key` = `path` (checkpoint.resume, checkpoint.init) naming no file: the refusal, saying
// where a relative path was looked for (the working directory, not checkpoint.dir) and a
// file of that name in checkpoint.dir (`dir`) when there is one; "" when the file exists.
std::string checkpoint_file_missing(const std::string& key, const std::string& path,
                                    const std::string& dir);

// checkpoint.init's parameters, read as training and the dry run read them; a missing file
// refused by checkpoint_file_missing's message.
Checkpoint read_init_checkpoint(const CheckpointConfig& options);

// Runs `write` (a step checkpoint's into `dir`) and, when it fails because `dir` is gone
// (the run directory deleted or cleaned while the file was written: by hand, a cleaning
// script), runs it once more, its write making `dir` again, with a warning on `notes`.
// Between writes the lock's check makes the directory again (RunLock::check_held); in the
// middle of one the run ended, exit 1, with its state unsaved. Not when DIR holds a
// trainer.lock again (another trainer took the directory since: its files are not this
// run's to write or prune). Another failure, or a second, is thrown.
void write_made_again_if_removed(const std::string& dir, const std::function<void()>& write,
                                 std::ostream& notes);

// The folders a resume sets another branch's best files aside in: PREFIX + its step.
inline constexpr const char* kBranchFolderPrefix = "best_of_branch_left_at_";
// The folder of checkpoint.dir that keeps another branch's step checkpoints (marked
// superseded or diverged) which this branch's checkpoints of the same steps would have
// written over (CheckpointKeeping::save).
inline constexpr const char* kAbandonedBranchesFolder = "abandoned_branches";

class CheckpointKeeping {
 public:
  // `config` must outlive this (the trainer's own copy).
  explicit CheckpointKeeping(const Config& config) : config_(config) {}

  // Writes DIR/step_NNNNNNNN.h5 holding `state` (of step state.step), says so with its
  // size and the copy's and the write's seconds (`copy_seconds`: the snapshot's), and
  // prunes to checkpoint.keep (prune_checkpoints: diverged ones first, never the newest
  // healthy one nor the last one known good). Returns the path. A checkpoint of another
  // branch at that name (superseded or diverged) is moved into DIR/abandoned_branches/
  // first, not written over.
  //
  // When writes_in_background(), the write (hashing, HDF5, fsync, rename) and the pruning
  // run on a thread of their own and save() returns at once, `state` in the thread's
  // hands: training goes on while the file is written (a 757 MB base checkpoint: 2-3 s
  // of the step here). Its line is logged, or its failure thrown, by the next
  // report_finished_write() or finish_write(). One write at a time: a save waits for the
  // one before it, and so does every other member that reads checkpoint.dir's step files.
  //
  // `fill_state`, when given, completes `state` before it is written (the parameters and
  // moments of a staged snapshot, Trainer::staged_snapshot), on the writing thread.
  std::string save(Checkpoint state, double copy_seconds, std::ostream& log,
                   std::function<void(Checkpoint&)> fill_state = nullptr);

  // The end of a background write, when it has ended: logs its lines, or throws its
  // failure as a save in the step would have. Never waits.
  void report_finished_write(std::ostream& log);
  // Waits for the background write under way, if any, then reports it as above: before
  // a run says a checkpoint is on disk (a stop, the end), and before it reads the files.
  void finish_write(std::ostream& log);
  // checkpoint.background_write, on an HDF5 built thread-safe (the training thread may
  // read shards while the writer writes). Without one, `note` (when given) receives why
  // the checkpoints are written in the step.
  bool writes_in_background(std::string* note = nullptr) const;

  // After a validation of the checkpoint.keep_best metric scored `value` (its field as
  // logged) at `step`: writes DIR/best.h5 when it `improved` on the run's best, and, with
  // checkpoint.keep_best_count, updates the k best DIR/best_step_NNNNNNNN.h5
  // (change_best_set). Each holds `state_of_step()` (asked for once, when a file is due),
  // written atomically like the others, with the score inside; none is a step_*.h5, so the
  // rotation of checkpoint.keep and resume=auto leave them alone.
  void keep_best(const std::string& metric, const LogField& value, bool improved, int64_t step,
                 const std::function<Checkpoint()>& state_of_step, std::ostream& log) const;

  // A resume (from the checkpoint read from `path`, whose stored configuration is `then`)
  // whose checkpoint.keep or checkpoint.keep_best_count is lower than those of the run
  // that wrote it and would so delete files that run kept: the next checkpoint pruning
  // step_*.h5 to the new keep, the next validation best_step_*.h5 to the new count.
  // Refused (the message), unless the lowered value was given on the command line: a
  // resume given the config file without the first run's --checkpoint.keep=10 deleted
  // five of its checkpoints, with only a note among the settings that differ (a helper's
  // trial). "" when nothing would be deleted. (A stored configuration that cannot be read
  // is not asked: the caller passes over it.)
  // Asked only of a resume that has steps left to train (one at train.max_steps writes
  // and prunes nothing: a job's requeue re-runs such a phase, jobs/common.sh).
  std::string lowered_keeping_refusal(const Config& then, const std::string& path) const;

  // At the end of training (step `step`): DIR/average_lastN.h5 (checkpoint.average_last,
  // `best` false) of the newest healthy checkpoints, or DIR/average_bestN.h5
  // (checkpoint.average_best, `best` true) of the kept best ones. A failure costs the
  // average, said on `log`, not the run.
  void write_average(bool best, int64_t step, std::ostream& log);

  // The healthy checkpoints of run `run_id` (and those written before ids were stored):
  // with `newer_than` < 0 the one of `step` is marked diverged (its parameters produced
  // the divergent loss of step + 1); with `newer_than` >= 0 every one of a later step is
  // marked superseded (the branch that `how`, a rollback or a resume, to `newer_than`
  // abandons).
  void mark_abandoned(const std::string& run_id, int64_t step, int64_t newer_than,
                      std::ostream& log, const std::string& how = "rollback");
  // What a resume from the checkpoint at `step` with lineage `lineage` (Checkpoint::lineage)
  // changes among run `run_id`'s checkpoints of checkpoint.dir: the healthy ones it was not
  // trained through are another branch's (a later step, or a branch it abandoned before,
  // now left in turn: before, resuming an abandoned branch left the other's checkpoints
  // healthy, and averaging mixed the two), and the superseded ones it was trained through
  // (itself included) are on the branch it continues. Without lineages (older files) a
  // later step alone is another branch's. Changes nothing.
  struct BranchChanges {
    std::vector<std::string> supersede, restore;
  };
  BranchChanges branch_changes(const std::string& run_id,
                               const std::vector<BranchStart>& lineage, int64_t step) const;
  // Makes them: each marked, a line each on `log`; then bring_back_set_aside_steps.
  void follow_resumed_branch(const std::string& run_id, const std::vector<BranchStart>& lineage,
                             int64_t step, std::ostream& log);
  // The checkpoints of DIR/abandoned_branches/ that the resumed one (at `step`, of lineage
  // `lineage`) was trained through come back to their names in DIR, marked healthy, a line
  // each; where the branch now left has a file of that name (marked superseded), it goes
  // into the folder in turn. Before, a return to a branch left its steps that the other
  // branch had saved over aside, and average_last missed them (a review's finding).
  void bring_back_set_aside_steps(const std::string& run_id,
                                  const std::vector<BranchStart>& lineage, int64_t step,
                                  std::ostream& log) const;
  // The lineage of the checkpoints a run writes after restoring `from` (read from
  // `from_path`): its own when it is the newest checkpoint of its line of run `run_id` in
  // checkpoint.dir and beside `from_path` (the line goes on), else its own and a new line
  // from its step named `new_id` (the oldest forgotten past kLineageKept). A checkpoint
  // without a lineage (an older file) gives a lineage of that new line alone.
  std::vector<BranchStart> continued_lineage(const Checkpoint& from, const std::string& from_path,
                                             const std::string& run_id,
                                             const std::string& new_id) const;
  // The healthy checkpoints of run `run_id` (or of no run: written before ids were) after
  // `step`: the branch that a rollback or a resume to `step` abandons. Changes nothing.
  std::vector<std::string> branch_after(const std::string& run_id, int64_t step) const;
  // Every healthy checkpoint of run `run_id` after step `last_passed`, the last validation
  // the model passed, marked diverged (a validation after it exploded).
  void mark_after_failed_validation(const std::string& run_id, int64_t last_passed,
                                    std::ostream& log);

  // Where a run starts, rank 0's choice as checkpoint.resume says, read into `checkpoint`
  // (`path` "" for step 0, or checkpoint.init's parameters), or why the run must not start
  // (`refusal`, for every rank to stop with). checkpoint.resume = PATH: that file (refused
  // when missing or unreadable, saying where a relative path was looked for). auto or
  // auto_or_fresh: the newest valid checkpoint of checkpoint.dir; with auto, refused when
  // checkpoints exist but none is valid (starting over would write new files over the
  // damaged ones, the evidence) or every one is marked diverged or superseded (starting over
  // would prune the run's whole history). The invalid ones passed over (`invalid`) are for
  // move_invalid_aside: a run resumed from an older checkpoint would overwrite newer damaged
  // ones too. Changes nothing on disk: training and --dry-run both choose here.
  struct StartChoice {
    std::string path;
    std::string refusal;
    std::vector<InvalidCheckpoint> invalid;
  };
  StartChoice choose_start(Checkpoint* checkpoint, std::ostream& log) const;
  // Renames the choice's invalid checkpoints *.corrupt, a line each on `log`; none when the
  // run was refused (they are the evidence).
  void move_invalid_aside(const StartChoice& choice, std::ostream& log) const;

  // These two wait for a background write (and keep its lines for the next report).
  // The checkpoint of run `run_id` at `step` once marked diverged, or "".
  std::string diverged_parameters_file(const std::string& run_id, int64_t step) const;
  // "PATH (step S, loss L)": the newest healthy checkpoint of checkpoint.dir, the one to
  // resume from; "" when there is none.
  std::string resume_point() const;
  // resume_point(), or "none (no healthy checkpoint in DIR)".
  std::string resume_point_text() const;

  // After a resume onto other validation shards than the checkpoint's run scored: DIR/best.h5
  // and DIR/best_step_*.h5, whose scores were of those (`earlier_valid_sha256`), are moved
  // into DIR/best_of_valid_HEX12/ (".2", ".3", ... when that is taken), a line each on `log`:
  // out of the run's ranking, its average_best and the next best.h5's way (before: the new
  // set's scores were ranked against the old set's, and best.h5 replaced). Moves nothing
  // when there are none.
  void set_aside_best_of_earlier_validation(const std::string& earlier_valid_sha256,
                                            std::ostream& log) const;

  // After a resume from `step` (lineage `lineage`, of run `run_id`) that starts another
  // branch: DIR/best.h5 and DIR/best_step_*.h5 of the branch it leaves (those the resumed
  // checkpoint was not trained through, branch_changes' rule) move into
  // DIR/best_of_branch_left_at_STEP/ (".2", ... when taken), a line each on `log`. The run's
  // best values are the checkpoint's: the next validation that beat them wrote best.h5
  // over the abandoned branch's better one, and average_best mixed the two branches (a
  // note left by the fine-tuning walk). A return to a branch left so brings its files
  // back from those folders (best_of_this_branch_set_aside: those the checkpoint was
  // trained through; of several best.h5 the newest step's), where their names are free.
  // best_of_other_branches and best_of_this_branch_set_aside list them (the dry run).
  std::vector<std::string> best_of_other_branches(const std::string& run_id,
                                                  const std::vector<BranchStart>& lineage,
                                                  int64_t step) const;
  std::vector<std::string> best_of_this_branch_set_aside(const std::string& run_id,
                                                         const std::vector<BranchStart>& lineage,
                                                         int64_t step) const;
  void set_aside_best_of_other_branches(const std::string& run_id,
                                        const std::vector<BranchStart>& lineage, int64_t step,
                                        std::ostream& log) const;

  // After a resume: a DIR/best.h5 that does not verify is moved aside (best.h5.corrupt)
  // with a warning; true when it was (the caller drops the run's best value with it). A
  // later version's best.h5 is no damaged one: left as it is, with a note.
  bool move_aside_a_damaged_best(std::ostream& log) const;

  // Blocks until the background write under way (if any) has ended; its outcome stays
  // for the next report. A run that fails waits so before it gives its lock back: the
  // writer writes and prunes in the run directory. While the writer makes progress (a
  // dataset written), this thread shows its work (show_still_working) to the ranks that
  // wait for it; a write that makes none (a hung file system) shows nothing, and they
  // end the job after dist.timeout_s.
  void wait_for_write() const;

 private:

  const Config& config_;
  // The background write under way or ended but not yet reported: its log lines, or its
  // failure. Invalid when there is none.
  std::future<std::string> write_;
};

}  // namespace thpc
