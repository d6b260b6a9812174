// Progress and the summary of one Trainer::run(): where rank 0 writes (the log and the
// metrics file), the clocks of the progress lines, of checkpoint.minutes and of
// train.max_minutes, and the counts behind the "step N/M" lines and the "summary:" line.
#pragma once

#include <chrono>
#include <cstdint>
#include <iosfwd>
#include <string>

#include "checkpoint/checkpoint.h"
#include "config/config.h"
#include "train/divergence.h"
#include "train/run_log.h"
#include "train/step_stats.h"

namespace thpc {

class RunProgress {
 public:
  using Clock = std::chrono::steady_clock;

  // `log`: the log on rank 0, a silent stream on the others.
  explicit RunProgress(std::ostream& log) : out(log) {}

  // Training begins after `first_step` (0, or the step resumed from), at `clock_now` on
  // the trainer's checkpoint clock; `divergence` is the detector's count so far.
  void begin(int64_t first_step, double clock_now, const DivergenceState& divergence);
  double seconds_since_start() const;
  // An applied step, counted into the progress interval and the summary.
  void count(const StepStats& stats);
  // The progress interval restarts after `step` at `now`: after a progress line, or when
  // the steps after `step` are trained again (a rollback).
  void restart_interval_at(int64_t step, Clock::time_point now = Clock::now());
  // The "step N/M | loss ..." line of the last counted step, and its metrics record;
  // `peak_memory_bytes` < 0 when the backend does not know.
  void log_step(int64_t max_steps, int64_t peak_memory_bytes);
  // log_step() when steps were counted since the last line: the step a run ends at before
  // train.max_steps (a stop signal, checkpoint.patience, train.max_minutes), which the
  // schedule's train.log_every did not log (metrics.jsonl and the event file lacked it).
  void log_step_unless_logged(int64_t max_steps, int64_t peak_memory_bytes);
  // The "summary:" line and record: what this run() trained up to `completed_step`, the
  // best validation values, the checkpoints it wrote, the divergences it met (`divergence`
  // now against the count at begin()), and a stop by checkpoint.patience. The record also
  // says how the run `ended` ("finished", "time_limit", "patience", "stopped",
  // "diverged") and, when stopped, by which `stop_signal` ("stop_signal": "SIGUSR1"): what
  // a job script reads to tell a stop its ranks were sent (srun's steps; the batch shell
  // heard nothing) from the end of training. The record alone holds each best value's
  // step ("best_valid_ppl_step", the line prints it in brackets) and, at the end of
  // training, the final parameters' `params_sha256` (the `final:` line's): a sweep's runs
  // are compared from their files, not their logs (a helper's sweep).
  void log_summary(int64_t completed_step, const ValidationRecord& best, const Config& config,
                   int checkpoints_written, const DivergenceState& divergence,
                   const std::string& ended, int stop_signal = 0,
                   const std::string& params_sha256 = "");

  // When the log is standard output and what was written there did not all reach it (a
  // full disk or a file-size limit under `> train.log`): one warning on standard error,
  // naming the step and why; nothing more after it. Training goes on: its checkpoints and
  // metrics file are written (a helper's walk: `> /dev/full` lost the whole log, summary
  // included, without a word, exit 0). Closed standard output is said at start-up instead.
  // Called after each progress line and as run() ends.
  void say_if_the_log_is_lost();

  std::ostream& out;         // the log on rank 0, a silent stream on the others
  MetricsFile metrics;       // rank 0's metrics.jsonl and event file; none on the others
  int64_t stop_at_step = 0;  // the test hook's step (THPC_TEST_STOP_AT_STEP), or 0
  int64_t first_step = 0;    // the completed step training began from
  int64_t last_saved_step = -1;  // the step of the newest checkpoint on disk; -1 none
  double last_save = 0.0;        // the checkpoint clock at the last checkpoint (or the start)
  double training_start = 0.0;   // the checkpoint clock when training began
  int64_t steps_trained = 0;     // updates this process applied (a rollback repeats steps)
  bool stopped_by_patience = false;
  StepStats last;  // the last step applied

 private:
  Clock::time_point start_;           // the wall clock of the progress lines and summary
  Clock::time_point interval_start_;  // the wall clock at the last progress line
  int64_t interval_first_step_ = 0;   // the step before the interval's first
  int64_t interval_tgt_tokens_ = 0, total_tgt_tokens_ = 0;
  DivergenceState divergence_at_start_;  // the summary gives this run()'s share
  bool lost_log_said_ = false;
};

}  // namespace thpc
