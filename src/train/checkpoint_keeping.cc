// Checkpoint keeping (checkpoint_keeping.h): the files of checkpoint.dir.
#include "train/checkpoint_keeping.h"

#include <algorithm>
#include <chrono>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <future>
#include <iomanip>
#include <optional>
#include <ostream>
#include <set>
#include <sstream>
#include <string_view>
#include <thread>
#include <vector>

#include "checkpoint/checkpoint_directory.h"
#include "common/error.h"
#include "common/still_working.h"
#include "io/hdf5.h"
#include "io/run_file_names.h"
#include "train/run_directory.h"
#include "train/stop_request.h"
#include "train/test_hooks.h"

namespace thpc {

std::string checkpoint_file_missing(const std::string& key, const std::string& path,
                                    const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code no_file;
  if (fs::exists(path, no_file)) return "";
  const std::string beside = (fs::path(dir) / path).string();
  const bool relative = fs::path(path).is_relative();
  std::ostringstream message;
  message << key << " = " << path << ": no such file";
  if (relative) {
    message << " (a path is found from the working directory, "
            << fs::current_path(no_file).string() << ", not from checkpoint.dir)";
  }
  if (relative && fs::exists(beside, no_file)) {
    message << "; checkpoint.dir holds " << beside << ": give that";
  }
  return message.str();
}

void write_made_again_if_removed(const std::string& dir, const std::function<void()>& write,
                                 std::ostream& notes) {
  std::string first;
  try {
    write();
    return;
  } catch (const Error& error) {
    // The directory gone, or a file the write had made in it (its temporary file, removed
    // by an rm -rf that had not reached the directory yet): the write says ENOENT.
    std::error_code unknown;
    const bool gone = !std::filesystem::exists(dir, unknown) && !unknown;
    const bool file_removed =
        std::string_view(error.what()).find(std::strerror(ENOENT)) != std::string_view::npos;
    if (!gone && !file_removed) throw;
    // Never into another trainer's directory: the removal took this run's lock with it, so
    // a lock there now is one a trainer took since (or this run's own, made again by its
    // check before the next checkpoint, on the training thread: then the write fails as it
    // did before the retry). A review's finding: the retry wrote and pruned in the
    // directory of a trainer started there meanwhile.
    std::error_code lock_unknown;
    if (std::filesystem::exists(run_lock_path(dir), lock_unknown) || lock_unknown) throw;
    first = error.what();
    notes << "warning: checkpoint.dir " << dir << (gone ? " was removed" : "'s files were removed")
          << " while a checkpoint was written (deleted or cleaned while the run ran?): the "
          << "checkpoint written once more (the write said: " << first << ")\n";
  }
  try {
    write();
  } catch (const Error& again) {
    THPC_FAIL(again.what() << " (the checkpoint written once more, after: " << first << ")");
  }
}

std::string CheckpointKeeping::lowered_keeping_refusal(const Config& then,
                                                       const std::string& path) const {
  const CheckpointConfig& now = config_.checkpoint;
  // `doomed` of the `count` files of `what` in checkpoint.dir deleted (`order`: which
  // first) when `key` is lowered from `was` to `value`: the refusal.
  const auto refusal = [&](const std::string& key, int value, int was, size_t count,
                           const std::string& doomed, const std::string& what,
                           const std::string& when, const std::string& order) {
    std::ostringstream message;
    message << key << " = " << value << " (not given on the command line) is lower than the "
            << was << " of the run that wrote " << path << ": " << when << " would delete "
            << doomed << " of the " << count << " " << what << " in " << now.dir << " ("
            << order << "); give --" << key << "=" << value << " on the command line to "
            << "delete them, or --" << key << "=" << was << " to keep the run's setting";
    return message.str();
  };
  if (now.keep < then.checkpoint.keep && config_.command_line_keys.count("checkpoint.keep") == 0) {
    const std::vector<std::string> files = list_checkpoints(now.dir);
    // The next checkpoint is one of the `keep` that stay: the oldest go first (pruning
    // may spare one more, the last known good).
    const size_t stay = static_cast<size_t>(now.keep) - 1;
    if (files.size() > stay) {
      return refusal("checkpoint.keep", now.keep, then.checkpoint.keep, files.size(),
                     "up to " + std::to_string(files.size() - stay), "checkpoints",
                     "its next checkpoint",
                     "diverged and superseded ones first, then the oldest");
    }
  }
  if (now.keep_best_count > 0 && now.keep_best_count < then.checkpoint.keep_best_count &&
      config_.command_line_keys.count("checkpoint.keep_best_count") == 0) {
    size_t kept = 0;
    for (const CheckpointSummary& summary : best_checkpoint_summaries(now.dir)) {
      kept += summary.validation->metric == now.keep_best ? 1 : 0;
    }
    const size_t stay = static_cast<size_t>(now.keep_best_count);
    if (kept > stay) {
      return refusal("checkpoint.keep_best_count", now.keep_best_count,
                     then.checkpoint.keep_best_count, kept,
                     "at least " + std::to_string(kept - stay),
                     "best_step_*.h5 of " + now.keep_best, "its next validation",
                     "the worst first");
    }
  }
  return "";
}

Checkpoint read_init_checkpoint(const CheckpointConfig& options) {
  const std::string missing = checkpoint_file_missing("checkpoint.init", options.init,
                                                      options.dir);
  if (!missing.empty()) throw Error(missing);
  return read_checkpoint(options.init, CheckpointParts::ParamsOnly);
}

namespace {

// (checkpoint.resume: "auto", "latest" or a bare name in checkpoint.dir read "checkpoint
// Auto: no such file", and its refusal says what to give for the newest)
std::string resume_file_missing(const CheckpointConfig& options) {
  const std::string missing = checkpoint_file_missing("checkpoint.resume", options.resume,
                                                      options.dir);
  if (missing.empty()) return "";
  return missing + "; for the newest valid checkpoint of checkpoint.dir give auto";
}

// checkpoint.resume=auto's refusal when `dir` holds checkpoints and every one is marked
// diverged or superseded: starting from step 0 would prune them, the run's whole history,
// with exit 0 ("" when there are none, or some is healthy).
std::string only_unhealthy_checkpoints(const std::string& dir) {
  const std::vector<CheckpointSummary> summaries = checkpoint_summaries(dir);
  if (summaries.empty()) return "";
  for (const CheckpointSummary& summary : summaries) {
    if (summary.state == CheckpointState::Healthy) return "";
  }
  const CheckpointSummary& newest = summaries.back();
  std::ostringstream message;
  message << "checkpoint.resume=auto: every one of the " << summaries.size()
          << " checkpoints in " << dir << " is marked diverged or superseded (the newest, "
          << newest.path << ", step " << newest.step << ", is "
          << checkpoint_state_name(newest.state) << "), and starting from step 0 would prune "
          << "them: resume from one by name (checkpoint.resume=PATH continues from a marked "
          << "checkpoint) with a smaller train.lr_scale or train.clip_norm, or move them out of "
          << dir << " to start afresh";
  return message.str();
}

// A checkpoint marked superseded or diverged where this step's is to be written (`path`):
// another branch's, marked by a resume or a rollback to an earlier step, at a step the new
// branch reaches again (or this run's own, marked diverged by a validation that failed
// after a resume, and saved again) (every checkpoint.every_steps steps, both branches save the same
// steps). It moves into DIR/abandoned_branches/ (NAME.2.h5, ... when taken) instead of
// being written over: before, a resume from an earlier checkpoint of the directory lost
// the abandoned branch's later checkpoints one by one as it reached their steps, though
// the refusal of such a resume from elsewhere called them "marked superseded, not deleted"
// (a helper's walk). There they are kept: pruning (checkpoint.keep) reads the directory
// alone, and checkpoint.resume=PATH continues one. Returns the line to log, or a warning
// when the move fails (then the file is written over, as before: the run goes on).
// Healthy files and files of no checkpoint are left to the write, as before.
std::string move_abandoned_checkpoint_aside(const std::string& path, const std::string& dir,
                                            const std::string& because) {
  namespace fs = std::filesystem;
  std::error_code error;
  if (!fs::is_regular_file(path, error)) return "";
  const std::optional<CheckpointSummary> summary = read_checkpoint_summary(path);
  if (!summary || summary->state == CheckpointState::Healthy) return "";
  const fs::path folder = fs::path(dir) / kAbandonedBranchesFolder;
  fs::create_directories(folder, error);
  const fs::path name = fs::path(path).filename();
  fs::path to = folder / name;
  for (int next = 2; !error && fs::exists(to, error); ++next) {
    to = folder / (name.stem().string() + "." + std::to_string(next) + name.extension().string());
  }
  if (!error) fs::rename(path, to, error);
  std::ostringstream line;
  if (error) {
    line << "warning: cannot move " << path << " (marked "
         << checkpoint_state_name(summary->state) << ") into " << folder.string() << " ("
         << error.message() << "): this step's checkpoint is written over it\n";
  } else {
    // (Not always another branch's: a resumed checkpoint whose interrupted validation
    // diverged is marked so, and saved again at its step.)
    line << "moved " << path << " (marked " << checkpoint_state_name(summary->state)
         << ") into " << to.string() << ": " << because << " (kept there; checkpoint.keep "
         << "prunes " << dir << " alone)\n";
  }
  return line.str();
}

// Completes `state` (`fill_state`, when given: a staged snapshot's parameters and
// moments), writes it to `path` and prunes checkpoint.dir to `keep`; returns what to log:
// the checkpoint's line (its size, the copy's and the write's seconds) and each removal.
// `in_background`: on the writer's thread, held `delay` first (the test hook's).
std::string write_and_prune(const std::string& path, Checkpoint& state,
                            const std::function<void(Checkpoint&)>& fill_state,
                            double copy_seconds, const std::string& dir, int keep,
                            int64_t schedule, int64_t last_step, bool in_background,
                            InjectedWriteDelay delay = {}) {
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  // The test hook's delay comes before the staged state is read, as a slow writer's
  // would: the next snapshot must not reuse the staging before this write is done.
  if (in_background) hold_checkpoint_write(delay);
  if (fill_state) fill_state(state);
  std::ostringstream lines;
  write_made_again_if_removed(dir, [&] { write_checkpoint(path, state); }, lines);
  const double write_seconds = std::chrono::duration<double>(Clock::now() - start).count();
  std::error_code error;
  const auto bytes = std::filesystem::file_size(path, error);
  lines << "checkpoint " << path << " (" << std::fixed << std::setprecision(1)
        << (error ? 0.0 : static_cast<double>(bytes) / 1e6) << " MB; copy "
        << std::setprecision(2) << copy_seconds << " s, write " << write_seconds << " s"
        << (in_background ? " beside training" : "") << ")\n";
  for (const std::string& deleted : prune_checkpoints(dir, keep, path, schedule, last_step)) {
    lines << "removed old checkpoint " << deleted << " (checkpoint.keep = " << keep << ")\n";
  }
  return lines.str();
}

}  // namespace

bool CheckpointKeeping::writes_in_background(std::string* note) const {
  if (!config_.checkpoint.background_write) return false;
  if (hdf5::library_is_threadsafe()) return true;
  if (note != nullptr) {
    *note = "checkpoint.background_write = true needs an HDF5 library built thread-safe "
            "(Spack: hdf5 +threadsafe; Debian's is), and this one is not: each checkpoint is "
            "written in the step that saves it, training waiting for it";
  }
  return false;
}

std::string CheckpointKeeping::save(Checkpoint state, double copy_seconds, std::ostream& log,
                                    std::function<void(Checkpoint&)> fill_state) {
  finish_write(log);  // one write at a time: the snapshot of each in memory, not more
  const std::string path =
      (std::filesystem::path(config_.checkpoint.dir) / checkpoint_file_name(state.step)).string();
  const std::string dir = config_.checkpoint.dir;
  const int keep = config_.checkpoint.keep;
  // A schedule by steps alone: pruning passes over its steps first (prune_checkpoints).
  const int64_t schedule =
      config_.checkpoint.minutes == 0 ? config_.checkpoint.every_steps : 0;
  const int64_t last_step = config_.train.max_steps;
  // On this thread, before a background write starts: the file is read and moved at once.
  log << move_abandoned_checkpoint_aside(
             path, dir, "this run writes its step " + std::to_string(state.step) + " anew")
      << std::flush;
  if (!writes_in_background()) {
    log << write_and_prune(path, state, fill_state, copy_seconds, dir, keep, schedule,
                           last_step, false)
        << std::flush;
    return path;
  }
  // The thread owns what it writes; the training thread goes on with its own state.
  write_ = std::async(std::launch::async, [path, dir, keep, schedule, last_step, copy_seconds,
                                           delay = injected_checkpoint_write_delay(),
                                           state = std::move(state),
                                           fill_state = std::move(fill_state)]() mutable {
    return write_and_prune(path, state, fill_state, copy_seconds, dir, keep, schedule, last_step,
                           true,
                           delay);
  });
  return path;
}

void CheckpointKeeping::report_finished_write(std::ostream& log) {
  if (!write_.valid() ||
      write_.wait_for(std::chrono::seconds(0)) != std::future_status::ready) {
    return;
  }
  log << write_.get() << std::flush;  // get() rethrows the write's failure
}

void CheckpointKeeping::finish_write(std::ostream& log) {
  wait_for_write();
  report_finished_write(log);
}

void CheckpointKeeping::wait_for_write() const {
  if (!write_.valid()) return;
  int64_t seen = signs_of_work_given();
  while (write_.wait_for(std::chrono::milliseconds(100)) != std::future_status::ready) {
    if (signs_of_work_given() == seen) continue;  // no progress since the last look
    show_still_working();
    seen = signs_of_work_given();  // (this thread's own sign is no progress of the writer)
  }
}

void CheckpointKeeping::write_average(bool best, int64_t step, std::ostream& log) {
  finish_write(log);
  const CheckpointConfig& options = config_.checkpoint;
  const int wanted = best ? options.average_best : options.average_last;
  std::vector<std::string> paths;
  std::string metric;
  if (best) {
    // The ranking is the one the run kept (the score inside each best_step_*.h5).
    try {
      // This run's metric's (a resume that changed keep_best leaves the other's alone).
      paths = best_checkpoints(options.dir, wanted, &metric, options.keep_best);
    } catch (const Error& error) {
      log << "warning: no average of the best written: " << error.what() << std::endl;
      return;
    }
    if (paths.empty()) {
      log << "warning: no average of the best written: no best checkpoint in " << options.dir
          << " (no validation of " << options.keep_best << " gave a finite value: "
          << "train.valid_every = " << config_.train.valid_every << ", the run ended at step "
          << step << ")" << std::endl;
      return;
    }
  } else {
    // Healthy ones only: a diverged checkpoint would poison the average. With a schedule
    // by steps alone (checkpoint.every_steps, checkpoint.minutes = 0), those of the
    // schedule only (its multiples and this last step): one a stop signal wrote between
    // them (a requeued job's) is no point of the window the run was set to average
    // (jobs/common.sh's thpc_train_averaged: the paper's last 5, which took the stop's step
    // in place of the oldest). Timed checkpoints are the schedule's too otherwise.
    const int64_t schedule = options.minutes == 0 ? options.every_steps : 0;
    paths = newest_healthy_checkpoints(options.dir, wanted, schedule, step);
    if (paths.empty()) {
      log << "warning: no average written: no healthy checkpoint in " << options.dir
          << std::endl;
      return;
    }
  }
  const std::string name = best ? "average_best" : "average_last";
  const std::string output =
      (std::filesystem::path(options.dir) / (name + std::to_string(wanted) + ".h5")).string();
  // Reading N checkpoints takes a while (20 base-model ones: a minute): a stop signal
  // meanwhile ends the averaging at the next file, the run as finished.
  class StopOnSignal final : public ProgressListener {
   public:
    void begin(const std::string&, const std::string&, int64_t) override {}
    void advance(int64_t) override {
      if (const int signal = stop_requested_by()) {
        THPC_FAIL(stop_signal_name(signal) << " received while averaging");
      }
    }
    void end() override {}
  } stop_on_signal;
  // The training itself succeeded: a bad old checkpoint costs the average, not the run
  // (a failing exit would make the batch system requeue a finished job).
  try {
    write_checkpoint(output, average_checkpoints(paths, stop_on_signal));
  } catch (const Error& error) {
    // What makes it: the run resumed (it has nothing left to train and averages again),
    // or the averaging program on the same checkpoints, into a file of another folder
    // (this name beside the checkpoints is the run's own, which it refuses).
    log << "warning: no average written: " << error.what() << " (checkpoint.resume=auto "
        << "writes it, or transformer_average --inputs " << options.dir
        << (best ? " --best " : " --last ") << wanted << " --output FILE outside "
        << options.dir << ")" << std::endl;
    return;
  }
  const bool fewer = static_cast<int>(paths.size()) < wanted;
  if (best) {
    // Fewer best checkpoints than asked for (fewer validations ran): the average of those
    // there are, said so, like the last N of a short run.
    log << (fewer ? "warning: " : "") << "average of the " << paths.size()
        << (paths.size() == 1 ? " best checkpoint" : " best checkpoints")
        << " by valid " << metric
        << (fewer ? " (fewer than checkpoint.average_best = " + std::to_string(wanted) +
                        ": only that many validations ran)"
                  : "")
        << " written to " << output << std::endl;
  } else {
    // The file keeps the configured name, which a job's next step looks for; the line
    // says what it holds, as a warning like the best's. Fewer for the schedule's sake (a
    // resume that changed checkpoint.every_steps, a stop signal's checkpoint) is said so:
    // "only that many healthy ones exist" was read beside a directory holding more.
    std::string why = "only that many healthy ones exist";
    const int64_t schedule = options.minutes == 0 ? options.every_steps : 0;
    if (fewer && schedule > 0 &&
        newest_healthy_checkpoints(options.dir, wanted, 0, step).size() > paths.size()) {
      why = "only that many healthy ones are of the schedule, at multiples of "
            "checkpoint.every_steps = " + std::to_string(schedule) + " or the last step; "
            "the others (another every_steps's, a stop signal's) are left out";
    }
    log << (fewer ? "warning: " : "") << "average of the last " << paths.size()
        << (paths.size() == 1 ? " checkpoint" : " checkpoints")
        << (fewer ? " (fewer than checkpoint.average_last = " + std::to_string(wanted) +
                        ": " + why + ")"
                  : "")
        << " written to " << output << std::endl;
  }
}

void CheckpointKeeping::keep_best(const std::string& metric, const LogField& value,
                                  bool improved, int64_t step,
                                  const std::function<Checkpoint()>& state_of_step,
                                  std::ostream& log) const {
  namespace fs = std::filesystem;
  const CheckpointConfig& options = config_.checkpoint;
  const ValidationScore score{metric, value.value};
  // The state is copied out once for best.h5 and the step's best_step file.
  std::optional<Checkpoint> state;
  const auto state_of_this_step = [&]() -> const Checkpoint& {
    if (!state) {
      state = state_of_step();
      state->validation = score;
    }
    return *state;
  };
  if (improved) {
    const std::string path = (fs::path(options.dir) / "best.h5").string();
    write_checkpoint(path, state_of_this_step());
    log << "best checkpoint " << path << " (step " << step << ", valid " << metric
        << " " << value.text << ")" << std::endl;
  }
  if (options.keep_best_count == 0) return;
  // The set is the files on disk (their headers hold the scores), so that a resumed or
  // rolled-back run continues it as it stands.
  std::vector<CheckpointSummary> kept;
  for (CheckpointSummary& summary : best_checkpoint_summaries(options.dir)) {
    if (summary.validation->metric == metric) kept.push_back(std::move(summary));
  }
  const BestSetChange change =
      change_best_set(std::move(kept), score, step, options.keep_best_count);
  if (change.admitted) {
    const std::string path =
        (fs::path(options.dir) / best_checkpoint_file_name(step)).string();
    write_checkpoint(path, state_of_this_step());
    log << "kept best checkpoint " << path << " (step " << step << ", valid "
        << metric << " " << value.text << ": rank " << change.rank << " of the "
        << options.keep_best_count << " best, checkpoint.keep_best_count)" << std::endl;
  }
  for (const CheckpointSummary& removed : change.removed) {
    std::error_code error;
    fs::remove(removed.path, error);
    if (error) {
      log << "warning: cannot remove " << removed.path << " (" << error.message()
          << "): it stays among the best checkpoints" << std::endl;
      continue;
    }
    std::ostringstream text;
    text << std::fixed << std::setprecision(2) << removed.validation->value;
    log << "removed best checkpoint " << removed.path << " (step " << removed.step << ", valid "
        << metric << " " << text.str()
        << (removed.step == step ? ": this step's score, validated again, is not "
                                               "among the best"
                                             : ": no longer among the best")
        << ")" << std::endl;
  }
}

namespace {

// Marks a checkpoint and says so ("marked checkpoint PATH STATE: why"; healthy "again"),
// or says why it could not: a file that cannot be marked (its header damaged, maybe why
// the branch is left; read-only) is no reason to end the run, nor to turn a divergence's
// stop (exit 4, naming what to resume from) into a failure's.
void mark_saying_why(const std::string& path, CheckpointState state, std::ostream& log,
                     const std::string& why) {
  try {
    mark_checkpoint(path, state);
  } catch (const Error& e) {
    log << "warning: " << e.what() << " (" << why << ": move it out of the run directory)"
        << std::endl;
    return;
  }
  log << "marked checkpoint " << path << " " << checkpoint_state_name(state)
      << (state == CheckpointState::Healthy ? " again" : "") << ": " << why << std::endl;
}

}  // namespace

void CheckpointKeeping::mark_abandoned(const std::string& run_id, int64_t step,
                                       int64_t newer_than, std::ostream& log,
                                       const std::string& how) {
  finish_write(log);
  if (newer_than >= 0) {
    const std::string why =
        "the " + how + " to step " + std::to_string(newer_than) + " abandons its branch";
    for (const std::string& path : branch_after(run_id, newer_than)) {
      mark_saying_why(path, CheckpointState::Superseded, log, why);
    }
    return;
  }
  for (const CheckpointSummary& summary : checkpoint_summaries(config_.checkpoint.dir)) {
    // Files of this run only (those of a run before ids were stored have none).
    if (summary.state == CheckpointState::Healthy && summary.step == step &&
        (summary.run_id.empty() || summary.run_id == run_id)) {
      const std::string why = "its parameters produced the divergent loss of step " +
                              std::to_string(step + 1);
      mark_saying_why(summary.path, CheckpointState::Diverged, log, why);
    }
  }
}

namespace {

// Whether a file at `file_step`, `on` the line a resume to `step` continues as
// where_on_lineage says, is of another branch: not trained through, or, where the
// lineages cannot tell (older files), of a later step. branch_changes' rule for step
// checkpoints, best_of_other_branches' for best files.
bool on_another_branch(OnLineage on, int64_t file_step, int64_t step) {
  return on == OnLineage::No || (on == OnLineage::Unknown && file_step > step);
}

}  // namespace

CheckpointKeeping::BranchChanges CheckpointKeeping::branch_changes(
    const std::string& run_id, const std::vector<BranchStart>& lineage, int64_t step) const {
  wait_for_write();
  BranchChanges changes;
  for (const CheckpointSummary& summary : checkpoint_summaries(config_.checkpoint.dir)) {
    if (!summary.run_id.empty() && summary.run_id != run_id) continue;
    const OnLineage on =
        where_on_lineage(summary.branch, summary.run_id, summary.step, lineage, step);
    const bool trained_through = on == OnLineage::Yes;
    const bool another_branch = on_another_branch(on, summary.step, step);
    if (summary.state == CheckpointState::Healthy && another_branch) {
      changes.supersede.push_back(summary.path);
    } else if (summary.state == CheckpointState::Superseded && trained_through) {
      changes.restore.push_back(summary.path);
    }
  }
  return changes;
}

void CheckpointKeeping::follow_resumed_branch(const std::string& run_id,
                                              const std::vector<BranchStart>& lineage,
                                              int64_t step, std::ostream& log) {
  finish_write(log);
  const BranchChanges changes = branch_changes(run_id, lineage, step);
  const std::string why = "the resume to step " + std::to_string(step) + " abandons its branch";
  for (const std::string& path : changes.supersede) {
    mark_saying_why(path, CheckpointState::Superseded, log, why);
  }
  const std::string back = "the resume to step " + std::to_string(step) + " continues its branch";
  for (const std::string& path : changes.restore) {
    mark_saying_why(path, CheckpointState::Healthy, log, back);
  }
  bring_back_set_aside_steps(run_id, lineage, step, log);
}

void CheckpointKeeping::bring_back_set_aside_steps(const std::string& run_id,
                                                   const std::vector<BranchStart>& lineage,
                                                   int64_t step, std::ostream& log) const {
  namespace fs = std::filesystem;
  const std::string dir = config_.checkpoint.dir;
  const fs::path folder = fs::path(dir) / kAbandonedBranchesFolder;
  std::error_code error;
  if (!fs::is_directory(folder, error)) return;
  std::vector<std::string> set_aside;
  for (const fs::directory_entry& entry : fs::directory_iterator(folder, error)) {
    if (entry.is_regular_file(error)) set_aside.push_back(entry.path().string());
  }
  std::sort(set_aside.begin(), set_aside.end());
  const std::string why = "the resume to step " + std::to_string(step) + " continues its branch";
  const auto cannot_bring_back = [&](const std::string& path) {
    log << "warning: cannot move " << path << " back into " << dir << " (" << error.message()
        << "): it stays in " << folder.string() << ", out of the run's checkpoints" << std::endl;
  };
  for (const std::string& path : set_aside) {
    const std::optional<CheckpointSummary> summary = read_checkpoint_summary(path);
    if (!summary || (!summary->run_id.empty() && summary->run_id != run_id) ||
        where_on_lineage(summary->branch, summary->run_id, summary->step, lineage, step) !=
            OnLineage::Yes) {
      continue;
    }
    const std::string home = (fs::path(dir) / checkpoint_file_name(summary->step)).string();
    std::string from = path;
    if (fs::exists(home, error)) {
      // The branch left now has a file of that step (just marked superseded): it goes aside
      // in turn, under this one's name, which this one leaves first (NAME.returning, still
      // in the folder should the run stop in between). Any other file there (this branch's
      // own, an unreadable one) stays, and so does this one.
      const std::optional<CheckpointSummary> there = read_checkpoint_summary(home);
      if (!there || there->state != CheckpointState::Superseded) continue;
      from = path + ".returning";
      fs::rename(path, from, error);
      if (error) {
        cannot_bring_back(path);
        continue;
      }
      log << move_abandoned_checkpoint_aside(home, dir, why + ", whose own step " +
                                                            std::to_string(summary->step) +
                                                            " comes back");
      if (fs::exists(home, error)) {  // (could not be moved: said)
        fs::rename(from, path, error);
        continue;
      }
    }
    fs::rename(from, home, error);
    if (error) {
      cannot_bring_back(from);
      continue;
    }
    log << "moved " << path << " back to " << home << ": " << why << std::endl;
    mark_saying_why(home, CheckpointState::Healthy, log, why);
  }
}

std::vector<BranchStart> CheckpointKeeping::continued_lineage(const Checkpoint& from,
                                                              const std::string& from_path,
                                                              const std::string& run_id,
                                                              const std::string& new_id) const {
  namespace fs = std::filesystem;
  std::vector<BranchStart> lineage = from.lineage;
  // A checkpoint older than lineages begins one: its files carry a branch line, which the
  // versions before lineages do not read (said in docs/checkpoints.md).
  if (!lineage.empty()) {
    bool newest_of_its_line = true;
    std::error_code error;
    const fs::path beside = fs::path(from_path).parent_path();
    std::vector<std::string> dirs = {config_.checkpoint.dir};
    if (!fs::equivalent(beside.empty() ? fs::path(".") : beside, config_.checkpoint.dir,
                        error)) {
      dirs.push_back(beside.empty() ? "." : beside.string());
    }
    wait_for_write();
    for (const std::string& dir : dirs) {
      for (const CheckpointSummary& summary : checkpoint_summaries(dir)) {
        const BranchStart line = summary.branch.value_or(BranchStart{0, summary.run_id});
        if (summary.run_id == run_id && line == lineage.back() && summary.step > from.step) {
          newest_of_its_line = false;
        }
      }
    }
    if (newest_of_its_line) return lineage;
  }
  lineage.push_back(BranchStart{from.step, new_id});
  if (lineage.size() > kLineageKept) {  // the first stays: the run's start, most often
    lineage.erase(lineage.begin() + 1,
                  lineage.end() - static_cast<std::ptrdiff_t>(kLineageKept - 1));
  }
  return lineage;
}

std::vector<std::string> CheckpointKeeping::branch_after(const std::string& run_id,
                                                         int64_t step) const {
  wait_for_write();
  std::vector<std::string> branch;
  for (const CheckpointSummary& summary : checkpoint_summaries(config_.checkpoint.dir)) {
    if (summary.state == CheckpointState::Healthy && summary.step > step &&
        (summary.run_id.empty() || summary.run_id == run_id)) {
      branch.push_back(summary.path);
    }
  }
  return branch;
}

void CheckpointKeeping::mark_after_failed_validation(const std::string& run_id,
                                                     int64_t last_passed,
                                                     std::ostream& log) {
  finish_write(log);
  for (const CheckpointSummary& summary : checkpoint_summaries(config_.checkpoint.dir)) {
    if (summary.state == CheckpointState::Healthy && summary.step > last_passed &&
        (summary.run_id.empty() || summary.run_id == run_id)) {
      const std::string why = "its step is past the last validation the model passed (step " +
                              std::to_string(last_passed) + ")";
      mark_saying_why(summary.path, CheckpointState::Diverged, log, why);
    }
  }
}

CheckpointKeeping::StartChoice CheckpointKeeping::choose_start(Checkpoint* checkpoint,
                                                               std::ostream& log) const {
  wait_for_write();
  const std::string& mode = config_.checkpoint.resume;
  const std::string& dir = config_.checkpoint.dir;
  StartChoice choice;
  if (mode.empty()) return choice;
  if (mode != "auto" && mode != "auto_or_fresh") {
    choice.refusal = resume_file_missing(config_.checkpoint);
    if (!choice.refusal.empty()) return choice;
    try {
      *checkpoint = read_checkpoint(mode);
      choice.path = mode;
    } catch (const Error& error) {
      choice.refusal = error.what();
    }
    return choice;
  }
  try {
    choice.path = newest_valid_checkpoint(dir, log, checkpoint, &choice.invalid);
  } catch (const CheckpointOfANewerVersion& error) {
    choice.refusal = error.what();  // the newest that is not damaged: nothing is passed over
    choice.invalid.clear();
    return choice;
  }
  if (choice.path.empty() && mode == "auto") {
    if (!choice.invalid.empty()) {
      // Only an explicit auto_or_fresh starts over, with the damaged ones moved aside.
      std::ostringstream reasons;
      for (const InvalidCheckpoint& file : choice.invalid) reasons << "; " << file.reason;
      std::ostringstream message;
      message << "checkpoint.resume=auto: none of the " << choice.invalid.size()
              << " checkpoints in "
              << dir << " is valid (fix or move them, or set "
              << "checkpoint.resume=auto_or_fresh to start from step 0 with them renamed "
              << "*.corrupt)" << reasons.str();
      choice.refusal = message.str();
    } else {
      choice.refusal = only_unhealthy_checkpoints(dir);
    }
  }
  return choice;
}

void CheckpointKeeping::move_invalid_aside(const StartChoice& choice, std::ostream& log) const {
  if (!choice.refusal.empty()) return;
  for (const InvalidCheckpoint& file : choice.invalid) {
    log << "moved invalid checkpoint " << file.path << " aside to "
        << move_aside_corrupt(file.path) << std::endl;
  }
}

std::string CheckpointKeeping::diverged_parameters_file(const std::string& run_id,
                                                       int64_t step) const {
  wait_for_write();
  for (const CheckpointSummary& summary : checkpoint_summaries(config_.checkpoint.dir)) {
    if (summary.step == step && summary.state == CheckpointState::Diverged &&
        (summary.run_id.empty() || summary.run_id == run_id)) {
      return summary.path;
    }
  }
  return "";
}

std::string CheckpointKeeping::resume_point() const {
  wait_for_write();
  const std::vector<CheckpointSummary> summaries = checkpoint_summaries(config_.checkpoint.dir);
  for (auto summary = summaries.rbegin(); summary != summaries.rend(); ++summary) {
    if (summary->state != CheckpointState::Healthy) continue;
    std::ostringstream text;
    text << summary->path << " (step " << summary->step;
    if (!std::isnan(summary->loss)) {
      text << ", loss " << std::fixed << std::setprecision(4) << summary->loss;
    }
    text << ")";
    return text.str();
  }
  return "";
}

std::string CheckpointKeeping::resume_point_text() const {
  const std::string point = resume_point();
  return point.empty() ? "none (no healthy checkpoint in " + config_.checkpoint.dir + ")" : point;
}

namespace {

// Moves `paths` (best files of checkpoint.dir `dir`) into the new folder DIR/BASE (".2",
// ".3", ... when that is taken), saying each on `log` with `why`; a folder that cannot be
// made, or a file that cannot be moved, stays where it is, with a warning.
void move_best_files_into_a_folder(const std::filesystem::path& dir, const std::string& base,
                                   std::vector<std::filesystem::path> paths,
                                   const std::string& why, std::ostream& log) {
  namespace fs = std::filesystem;
  if (paths.empty()) return;
  std::sort(paths.begin(), paths.end());
  std::error_code error;
  fs::path folder = dir / base;
  for (int next = 2; fs::exists(folder, error); ++next) {
    folder = dir / (base + "." + std::to_string(next));
  }
  fs::create_directory(folder, error);
  if (error) {
    log << "warning: cannot make " << folder.string() << " (" << error.message() << "): the "
        << "best checkpoints " << why << " stay in " << dir.string() << ", ranked with this "
        << "run's" << std::endl;
    return;
  }
  for (const fs::path& path : paths) {
    fs::rename(path, folder / path.filename(), error);
    if (error) {
      log << "warning: cannot move " << path.string() << " into " << folder.string() << " ("
          << error.message() << "): it stays, ranked with this run's" << std::endl;
      continue;
    }
    log << "moved " << path.string() << " into " << folder.string() << ": " << why
        << ", it ranks with neither this run's best nor its average_best" << std::endl;
  }
}

}  // namespace

void CheckpointKeeping::set_aside_best_of_earlier_validation(
    const std::string& earlier_valid_sha256, std::ostream& log) const {
  namespace fs = std::filesystem;
  const fs::path dir = config_.checkpoint.dir;
  std::vector<fs::path> best;
  std::error_code error;
  for (const fs::directory_entry& entry : fs::directory_iterator(dir, error)) {
    const std::string name = entry.path().filename().string();
    if (name == "best.h5" || is_best_checkpoint_name(name)) best.push_back(entry.path());
  }
  move_best_files_into_a_folder(dir, "best_of_valid_" + earlier_valid_sha256.substr(0, 12),
                                best, "scored on the earlier validation shards", log);
}

std::vector<std::string> CheckpointKeeping::best_of_other_branches(
    const std::string& run_id, const std::vector<BranchStart>& lineage, int64_t step) const {
  namespace fs = std::filesystem;
  std::vector<std::string> other;
  std::error_code error;
  for (const fs::directory_entry& entry :
       fs::directory_iterator(config_.checkpoint.dir, error)) {
    const std::string name = entry.path().filename().string();
    if (name != "best.h5" && !is_best_checkpoint_name(name)) continue;
    const std::optional<CheckpointSummary> summary =
        read_checkpoint_summary(entry.path().string());
    if (!summary || (!summary->run_id.empty() && summary->run_id != run_id)) continue;
    const OnLineage on =
        where_on_lineage(summary->branch, summary->run_id, summary->step, lineage, step);
    if (on_another_branch(on, summary->step, step)) {
      other.push_back(entry.path().string());
    }
  }
  std::sort(other.begin(), other.end());
  return other;
}

std::vector<std::string> CheckpointKeeping::best_of_this_branch_set_aside(
    const std::string& run_id, const std::vector<BranchStart>& lineage, int64_t step) const {
  namespace fs = std::filesystem;
  const fs::path dir = config_.checkpoint.dir;
  std::vector<std::pair<int64_t, std::string>> found;  // (step, path)
  std::error_code error;
  for (const fs::directory_entry& folder : fs::directory_iterator(dir, error)) {
    if (!folder.is_directory(error) ||
        folder.path().filename().string().rfind(kBranchFolderPrefix, 0) != 0) {
      continue;
    }
    for (const fs::directory_entry& entry : fs::directory_iterator(folder.path(), error)) {
      const std::string name = entry.path().filename().string();
      if (name != "best.h5" && !is_best_checkpoint_name(name)) continue;
      const std::optional<CheckpointSummary> summary =
          read_checkpoint_summary(entry.path().string());
      if (!summary || (!summary->run_id.empty() && summary->run_id != run_id)) continue;
      if (where_on_lineage(summary->branch, summary->run_id, summary->step, lineage, step) ==
          OnLineage::Yes) {
        found.emplace_back(summary->step, entry.path().string());
      }
    }
  }
  // Each name once: of several best.h5 (set aside at several resumes), the newest step's,
  // the line's best up to then (best.h5 is replaced at each improvement).
  std::sort(found.begin(), found.end(), std::greater<>());
  std::vector<std::string> back;
  std::set<std::string> names;
  for (const auto& [file_step, path] : found) {
    if (names.insert(fs::path(path).filename().string()).second) back.push_back(path);
  }
  std::sort(back.begin(), back.end());
  return back;
}

void CheckpointKeeping::set_aside_best_of_other_branches(const std::string& run_id,
                                                         const std::vector<BranchStart>& lineage,
                                                         int64_t step, std::ostream& log) const {
  namespace fs = std::filesystem;
  const std::vector<std::string> other = best_of_other_branches(run_id, lineage, step);
  move_best_files_into_a_folder(config_.checkpoint.dir,
                                kBranchFolderPrefix + std::to_string(step),
                                {other.begin(), other.end()},
                                "of the branch the resume to step " + std::to_string(step) +
                                    " leaves",
                                log);
  // A return to a branch left before: its best files come back (the run had no best.h5,
  // and average_best left out its best; a helper's sweep), where their names are free.
  for (const std::string& path : best_of_this_branch_set_aside(run_id, lineage, step)) {
    const fs::path to = fs::path(config_.checkpoint.dir) / fs::path(path).filename();
    std::error_code error;
    if (fs::exists(to, error)) {
      log << "note: " << path << " stays where it is: " << to.string() << " is there"
          << std::endl;
      continue;
    }
    fs::rename(path, to, error);
    if (error) {
      log << "warning: cannot move " << path << " back into " << config_.checkpoint.dir << " ("
          << error.message() << "): it stays out of the run's best" << std::endl;
      continue;
    }
    log << "moved " << path << " back into " << config_.checkpoint.dir << ": of the branch "
        << "the resume to step " << step << " continues" << std::endl;
    fs::remove(fs::path(path).parent_path(), error);  // (only when it is empty now)
  }
}

bool CheckpointKeeping::move_aside_a_damaged_best(std::ostream& log) const {
  const CheckpointConfig& options = config_.checkpoint;
  if (options.keep_best == "none") return false;
  const std::string path = (std::filesystem::path(options.dir) / "best.h5").string();
  if (!std::filesystem::exists(path)) return false;
  try {
    read_checkpoint(path);  // every dataset's sha256 verified
    return false;
  } catch (const CheckpointOfANewerVersion& error) {
    // Not damage (a later version validated, then the job was requeued under this one):
    // kept, and replaced as any best.h5 is when a validation beats the run's best value.
    log << "note: " << error.what() << "; " << path << " is left as it is" << std::endl;
    return false;
  } catch (const Error& error) {
    const std::string aside = move_aside_corrupt(path);
    log << "warning: " << path << " is damaged (" << error.what() << "); moved aside to "
        << aside << ". The run's best valid " << options.keep_best << " so far is dropped "
        << "with it: the next validation writes best.h5 again" << std::endl;
    return true;
  }
}

}  // namespace thpc
