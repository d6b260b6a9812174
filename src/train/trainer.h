// The training loop (one process): batches from a BatchSource, forward/backward over
// `train.accumulate` micro-batches, loss normalised by the step's target tokens, Adam
// with the §5.3 schedule, a progress line every `train.log_every` steps, and a final
// line with the sha256 of the parameters so that two runs can be compared exactly.
// Checkpoints (checkpoint/checkpoint.h) are written by the loop: on a schedule, at the
// end, and when SIGTERM/SIGUSR1 ask it to stop; a run can resume from one exactly.
#pragma once

#include <chrono>
#include <cmath>
#include <functional>
#include <iosfwd>
#include <memory>
#include <optional>
#include <vector>

#include "backend/factory.h"
#include "checkpoint/checkpoint.h"
#include "config/config.h"
#include "data/batch_source.h"
#include "data/shard_reader.h"
#include "distributed/communicator.h"
#include "distributed/wait_clock.h"
#include "kernels/ops.h"
#include "model/checkpoint_params.h"
#include "model/transformer.h"
#include "train/checkpoint_keeping.h"
#include "train/divergence.h"
#include "train/gradient_sums.h"
#include "train/optimizer.h"
#include "train/run_directory.h"
#include "train/run_log.h"
#include "train/run_schedule.h"
#include "train/step_decision.h"
#include "train/step_stats.h"
#include "train/training_setup.h"
#include "train/validation_scorer.h"
#include "train/validation.h"

namespace thpc {

class RunProgress;

// A stop signal (SIGTERM, SIGUSR1) that reached some rank during start-up, while the
// data was read or the model built: every rank raises it at the same point (an agreed
// check), and main() ends the job with exit 0 after rank 0's "stopped before training"
// line, as the batch system expects of a stop.
class StoppedDuringStartUp : public AllRanksError {
 public:
  explicit StoppedDuringStartUp(int signal_number);
  int signal_number() const { return signal_number_; }

 private:
  int signal_number_;
};

// Throws StoppedDuringStartUp when some rank has received a stop signal (a collective:
// every rank calls it at the same point of start-up).
void stop_if_signalled_during_start_up(const Communicator& comm);

// How run() ended: all train.max_steps done (or ended early like it by train.max_epochs,
// checkpoint.patience or train.max_minutes), or stopped early by SIGTERM/SIGUSR1 after
// writing a checkpoint, or before the first step when the signal came during start-up
// (all are a success for the batch system: exit code 0); or a divergence stopped it
// (train.divergence; exit code 4), after naming the checkpoint to resume from.
enum class RunEnd { Finished, Stopped, Diverged };

// The exit code of transformer_hpc for a run that diverged (docs/running.md "Exit codes").
constexpr int kDivergedExitCode = 4;

// Data-parallel over the ranks of `comm`: each rank trains on its own share of every
// step's batches, the loss is normalised by the step's target tokens summed over all
// ranks, and the gradients are summed over ranks before the (identical) Adam update, so
// N ranks x B tokens train exactly as 1 rank x N*B tokens (or B tokens x N accumulated
// micro-batches). Rank 0 logs.
class Trainer {
 public:
  explicit Trainer(const Config& config, Communicator comm = Communicator::single());
  ~Trainer();

  // One optimizer step over train.accumulate micro-batches, for the tests and benchmarks
  // that drive steps themselves (run() is the training loop). A step that diverges
  // (train/divergence.h) is not applied and throws thpc::Error saying why, whatever
  // train.divergence says: skipping, rolling back or stopping is DivergenceHandling's, in
  // run() (before: a skip rule of its own here, which logged and recorded nothing).
  StepStats step();
  // The loss on the validation shards, and with train.valid_bleu the BLEU, chrF or F1 of
  // their translation (every rank must call it: the sums are global).
  ValidationStats validate();
  // Applies checkpoint.resume / checkpoint.init, then steps until train.max_steps (or the
  // step train.max_epochs ends at),
  // logging to `log` (a validation line every train.valid_every steps) and writing
  // checkpoints; ends with the "final:" line (or, when a signal stopped it, with the
  // "stopped:" line).
  RunEnd run(std::ostream& log);

  // The whole training state (parameters, Adam moments, step, seed, data position, the
  // best validation values so far, the run's id, the last step's loss, whether the run is
  // diverging, the divergence detector's state).
  Checkpoint snapshot() const;
  // Continues from `checkpoint` (read from `source`), which must be of this model and seed.
  // One without best validation values (written before they were stored) starts their
  // comparison afresh.
  void restore(const Checkpoint& checkpoint, const std::string& source);

  // The clock of checkpoint.minutes and train.max_minutes, in seconds (steady_seconds()
  // unless replaced), asked with the steps completed when it is read (the step being
  // decided counts as completed): a test drives it to get checkpoints and the time limit
  // at exact steps instead of depending on wall time.
  void set_checkpoint_clock(std::function<double(int64_t completed_steps)> seconds) {
    checkpoint_clock_ = std::move(seconds);
  }

  Transformer& model() { return *model_; }
  Backend& backend() { return *backend_; }
  // "GPU i NAME, PCI BUS" or "cpu (...)": for the start-up line of this rank.
  std::string device_description() const { return thpc::device_description(*backend_, device_); }
  int64_t completed_steps() const { return completed_steps_; }
  const Communicator& comm() const { return comm_; }
  const DivergenceState& divergence_state() const { return detector_->state(); }
  const std::string& run_id() const { return run_id_; }

 private:
  Config config_;
  Communicator comm_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<GradientSums> sums_;  // the step's gradient sums over the ranks
  int device_ = 0;  // the CUDA device of this rank (unused on the CPU)
  std::unique_ptr<BatchSource> source_;
  // restore()'s note when the data position was carried over to another micro-batch
  // budget (empty when it was taken as it was).
  std::string data_position_note_;
  std::string valid_change_note_;  // the validation shards differ from the checkpoint's
  std::string earlier_valid_sha256_;  // then, the checkpoint's: its best files go aside
  std::unique_ptr<ShardReader> valid_source_;  // when train.valid_every > 0
  std::unique_ptr<ValidationScorer> validation_scorer_;  // when train.valid_bleu
  std::unique_ptr<Transformer> model_;
  std::unique_ptr<Adam> adam_;
  std::unique_ptr<StepTotalsBuffer> step_totals_;  // the step's loss sums and norm, read once
  std::unique_ptr<StepInputsBuffer> step_inputs_;  // a micro-batch's step, stream and scale
  std::unique_ptr<DivergenceDetector> detector_;
  std::unique_ptr<DivergenceHandling> divergence_handling_;  // train.divergence's policy
  RunSchedule schedule_{config_};  // when run() logs, validates, saves and stops
  CheckpointKeeping keeping_{config_};  // the files of checkpoint.dir
  // Rank 0's host copy of the parameters and moments for a checkpoint written beside
  // training (12 bytes a parameter), made at the first and reused (staged_snapshot).
  std::shared_ptr<HostStaging> checkpoint_staging_;
  // Rank 0's locks (checkpoint.dir's, and train.metrics_dir's when it is another
  // directory), from start_up() to the end of run().
  std::vector<std::unique_ptr<RunLock>> run_locks_;
  // Rank 0's choice of where to start, whose invalid checkpoints are moved aside once the
  // run directory is claimed: a refused start touches nothing (auto_or_fresh renamed every
  // damaged checkpoint of a copied run directory, then refused it as another run's).
  CheckpointKeeping::StartChoice start_choice_;
  // checkpoint.resume's "found nothing, starting from step 0", said once the directory is
  // claimed: before, it preceded the refusal of a directory whose checkpoints are gone.
  std::string nothing_to_resume_note_;

  // run()'s phases follow, in the order it takes them; RunProgress (run_progress.h) is
  // the state they share between steps: clocks, counts, rank 0's log and metrics file.
  // What run() does after a divergent step: the next step, the end of training (as at
  // train.max_steps), or a return with RunEnd::Stopped or RunEnd::Diverged.
  enum class AfterStep { NextStep, EndTraining, Stopped, Diverged };
  // Start-up: the opening lines, checkpoint.resume / checkpoint.init, the run directory's
  // claim. False (after a "stopped before training" line) when a stop signal came first.
  bool start_up(std::ostream& out);
  // Starts the clocks and counts of `run` at the completed step, and rank 0's metrics file.
  void begin_training(RunProgress& run);
  // train.max_epochs: schedule_ ends the run at the step that reads the last batch of
  // that epoch, reckoned from the data position after the completed step: at the start
  // (said on `log`), and again after a skipped step, which read its batches, or a
  // rollback (said only when the end moves).
  void end_with_the_epochs(std::ostream& log, bool at_start);
  // What every rank does with the step compute_step() returned, agreed before its update
  // (a divergent step is not applied): rank 0's `divergence` and clock, any rank's signal.
  StepDecision decide_step(const StepStats& stats, DivergenceKind divergence,
                           const RunProgress& run);
  // Under train.divergence: skips the step, rolls back, or ends the run; a stop signal or
  // the time limit agreed for the step still ends it.
  AfterStep after_divergent_step(StepStats& stats, const DivergenceVerdict& verdict,
                                 const StepDecision& decision, RunProgress& run);
  // A stop signal that came during the step's validation or after the decision is agreed
  // into `decision` (a collective after a validation or the test hook's signal), and an
  // interrupted validation is dropped: the job stops at this step rather than the next.
  void agree_on_late_stop_signal(bool validation_due, StepDecision& decision,
                                 std::optional<ValidationStats>& valid, RunProgress& run);
  // The "valid step N" line, the best values, checkpoint.keep_best's files and
  // checkpoint.patience.
  void record_validation(const ValidationStats& valid, RunProgress& run);
  // The step's validation when `due`, a stop signal that came meanwhile agreed into
  // `decision` (agree_on_late_stop_signal), and its record written before the ranks go on.
  void validate_and_record(bool due, StepDecision& decision, RunProgress& run);
  // Saves the completed step (rank 0 writes, and returns the path; every rank took part
  // in the decision that got here) and restarts checkpoint.minutes' clock.
  std::string save_completed_step(RunProgress& run);
  // Every rank meets after rank 0's work alone between steps (a checkpoint, best.h5),
  // inside a rank_zeros_work_limit.
  void wait_for_rank_zeros_files();
  // The bound of rank 0's work alone (`what`: "the checkpoint of step 12") and of every
  // rank's wait for it, on every rank: from the last sign of work, which rank 0 gives as
  // it writes (each dataset, its wait for the writer while that makes progress).
  Communicator::WaitLimit rank_zeros_work_limit(const std::string& what) const;
  // snapshot()'s state but for the parameters and Adam moments, whose copies are queued
  // into checkpoint_staging_ (HostStaging: on a GPU pinned memory, copied into without
  // waiting) and put into the checkpoint by `fill_state`, called by the thread
  // that writes it. The write before must have finished (the staging is reused).
  Checkpoint staged_snapshot(std::function<void(Checkpoint&)>& fill_state);
  // Everything snapshot() holds but the parameters and moments.
  Checkpoint snapshot_without_state() const;
  // Saves, prints the summary and the "stopped:" line: the end of a run stopped by `signal`.
  RunEnd stop_by_signal(int signal, RunProgress& run);
  // True when checkpoint.patience or train.max_minutes ends training at this step (the
  // time limit's "stopping at step" line printed), which then ends like a finished run.
  bool ends_training_early(const StepDecision& decision, RunProgress& run);
  // The end of training: final checkpoint, averages, the check that every rank holds the
  // same parameters, the summary and the "final:" line.
  RunEnd finish_training(RunProgress& run);

  // The forward and backward passes of the next step, its gradients summed over the
  // ranks, its loss and gradient norm: everything but the update (completed_steps_ is
  // unchanged).
  StepStats compute_step();
  // Clips (train.clip_norm) and applies the Adam update of the step compute_step()
  // returned; the step is then complete.
  void apply_update(StepStats& stats);
  // checkpoint.resume, else checkpoint.init (the first run of a job has nothing to resume).
  void apply_start_options(std::ostream& log);
  // Every rank: loads `path` (rank 0's `checkpoint`, read since `start`, shared with the
  // others), restores the run from it and says so, with what changed since it was written.
  void resume_from(const std::string& path, Checkpoint& checkpoint,
                   std::chrono::steady_clock::time_point start, std::ostream& log);

  int64_t completed_steps_ = 0;
  // The run's id (Checkpoint::run_id): new for a fresh start, the checkpoint's on resume.
  std::string run_id_;
  // This process's working directory at the start (Checkpoint::working_directory).
  std::string working_directory_;
  // What computes this process's steps (compute_identity), and the comment lines that
  // head the configuration its checkpoints store (Config::to_ini(header)): the program's
  // version, computed_by_, the command line's settings.
  std::string computed_by_;
  std::vector<std::string> provenance_;
  // Replaces provenance_'s lines of `label` by one line per value.
  void set_provenance(const char* label, const std::vector<std::string>& values);
  // Sets provenance_'s kInitialisedFrom line to `model` (a fine-tuning's origin).
  void record_initialised_from(const std::string& model);
  // Sets provenance_'s kSettingsChanged lines to the resumed checkpoint's and, when this
  // resume changed settings (`now`: ResumeNotes::changed), one more at its step.
  void record_settings_changed(const Checkpoint& checkpoint, const std::string& now);

  std::string resumed_from_;  // the checkpoint this process resumed from, or "".
  std::vector<BranchStart> resumed_lineage_;  // its lineage (Checkpoint::lineage)
  // The lineage of the checkpoints rank 0 writes: the run's start, or the restored
  // checkpoint's continued (CheckpointKeeping::continued_lineage).
  std::vector<BranchStart> lineage_;
  // The keys the resume's note named as without effect in this run (log_resume_notes).
  std::vector<std::string> idle_keys_said_at_resume_;
  std::string metrics_path_;  // rank 0's metrics file (run_metrics_path), once claimed
  // The loss of the last step judged (applied or left out), which a checkpoint records.
  double checkpoint_loss_ = NAN;
  // The best validation values of the run, resumed runs before this one included.
  ValidationRecord best_valid_;
  // The step whose due validation a stop signal cut short (not recorded), -1 when none:
  // its checkpoint says so, and a run resumed from it validates that step first.
  int64_t validation_pending_step_ = -1;
  int checkpoints_written_ = 0;  // by this run() (the summary line counts them)
  int64_t steps_computed_ = 0;   // compute_step() calls of this process (a test hook counts them)
  int64_t micro_budget_ = 1;  // padded tokens per side of one rank's micro-batch
  std::function<double(int64_t)> checkpoint_clock_ = [](int64_t) { return steady_seconds(); };
};

}  // namespace thpc
