// The run directory: what a training run owns (checkpoint.dir, its metrics file and
// TensorBoard events), the lock that keeps a second trainer out of it, and the refusals
// made before anything is written there. Rank 0's business: lock_run_directory and
// claim_run_directory broadcast rank 0's refusal so that every rank stops together.
#pragma once

#include <iosfwd>
#include <memory>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "config/config.h"
#include "distributed/communicator.h"

namespace thpc {

// The metrics file run `run_id` appends to: metrics_path(config), except for a run
// resumed (from `resumed_from`) from the time the default was the directory holding
// checkpoint.dir: when train.metrics_dir is not set, checkpoint.dir has no metrics file
// and the one beside it is this run's, the run goes on appending there, with a note on
// `log`, rather than splitting its curves.
std::string run_metrics_path(const Config& config, const std::string& run_id,
                             const std::string& resumed_from, std::ostream& log);

// "" unless standard output is a file the run reads or keeps (`transformer_hpc m.ini
// --dry-run >> m.ini`): the config file, checkpoint.init, checkpoint.resume's or --eval's
// checkpoint, data.dir's shards and spm.model, a training run's files in checkpoint.dir
// (its checkpoints, lock, metrics file) or its metrics file. Else the refusal, said before
// anything is printed: the log went into the config (which then failed: "given more than
// once") or a shard, exit 0 (a helper's trial). A log kept beside the checkpoints
// (`> ck/train.log`) is no such file.
std::string standard_output_into_an_input(const Config& config);

// "" when the run's outputs spare its inputs (the config file, checkpoint.init, the
// checkpoint resumed from, the data's shards and spm.model) whatever the path spelling:
// the metrics file it appends to is none of them and is a metrics file (or absent), and
// checkpoint.overwrite would delete none of them. Else the refusal.
std::string outputs_that_would_destroy_inputs(const Config& config,
                                              const std::string& resumed_from,
                                              const std::string& metrics);

// Whether a look at the run directory makes the changes it finds due (training) or only
// says them (--dry-run: "training would remove ...").
enum class DirectoryChanges { Make, OnlySay };

// "" when checkpoint.dir and the directory of the metrics file `metrics` hold only this
// run's files (run `run_id`, resumed from `resumed_from`, "" for a fresh run) — after
// deleting the others' files, with a line each on `log`, when checkpoint.overwrite is
// set. Else the refusal, naming the files and what to do.
std::string foreign_run_files(const Config& config, const std::string& run_id,
                              const std::string& resumed_from, const std::string& metrics,
                              std::ostream& log,
                              DirectoryChanges changes = DirectoryChanges::Make);

// How long a lock's holder may go without refreshing it before another trainer takes it
// over: the holder refreshes it every kRunLockRefreshSeconds from a thread of its own, so
// only a holder that is gone (its host crashed or lost the filesystem) leaves it this old.
// Ten times the refresh period: room for a shared filesystem's attribute caching (NFS
// caches them up to a minute by default) and for clocks that differ between hosts.
inline constexpr int kRunLockRefreshSeconds = 60;
inline constexpr int kRunLockStaleSeconds = 600;

// One trainer per run directory: DIR/trainer.lock, made with an exclusive create (which
// NFS from version 3 and Lustre honour, where flock may not be), holding the holder's
// host, process id, start time and Slurm job. Removed when the holder is destroyed; a
// thread refreshes its modification time meanwhile.
//
// An existing lock is taken over, with a line on the log saying whose it was, when it is
// stale: its process is gone on this host (or its id is now a process started after the
// lock), it was left by an earlier run of this same Slurm job (a requeue on another node
// keeps the job id), or another host's holder did not refresh it for
// kRunLockStaleSeconds. A holder alive on this host keeps it however old (a suspended
// trainer does not refresh). Otherwise the trainer is refused with a message naming the
// holder.
//
// The same lock keeps a train.metrics_dir apart from checkpoint.dir to one trainer: a
// fresh run there removes a metrics file and event files that record no value yet (a
// failed start's), which a live run's are before its first logged step.
//
// Other programs that must have a directory to themselves take the same kind of lock
// under a name of their own (LockedUse): transformer_preprocess its --destdir's.
struct LockedUse {
  std::string lock_name;  // the lock file's name in the directory
  std::string holder;     // what holds it, in the messages: "trainer"
  std::string holders;    // two of them: "trainers"
  std::string key;        // the setting that named the directory: "checkpoint.dir"
  std::string named;      // the directory in the messages: "the run directory DIR"
  std::string unwritable; // the same, where it cannot be written: "... DIR (checkpoint.dir)"
  std::string clash;      // what two holders at once would do: "overwrite ... checkpoints."
  std::string found_now;  // why an unwritable directory is refused at the start
};

class RunLock {
 public:
  // Takes the lock of `dir` (created if absent), or throws Error saying why it cannot:
  // another trainer holds it, or the directory cannot be written (read-only, no
  // permission), found now rather than at the first checkpoint. `key` is the setting that
  // named `dir`, for the messages: checkpoint.dir (the run directory) or train.metrics_dir.
  RunLock(const std::string& dir, std::ostream& log,
          const std::string& key = "checkpoint.dir");
  // The lock of another program (`use`).
  RunLock(const std::string& dir, std::ostream& log, const LockedUse& use);
  ~RunLock();
  RunLock(const RunLock&) = delete;
  RunLock& operator=(const RunLock&) = delete;

  const std::string& path() const { return path_; }

  // Before writing into the directory (each checkpoint): returns when the lock is still
  // this holder's; makes it (and the directory) again, with a warning on `log`, when it
  // was removed (the directory deleted or cleaned by hand); throws Error when another
  // holder has it (taken over from a holder that looked gone: suspended for
  // kRunLockStaleSeconds, say), so that two never write in one directory. A lock that
  // stays unreadable for another reason is let pass, with a warning.
  void check_held(std::ostream& log);

 private:
  struct Refresher;
  std::string path_;
  LockedUse use_;
  std::string contents_;  // what this holder wrote: removed at the end only if still there
  // The directories taking the lock created, deepest first: removed at the end when still
  // empty, so that a start that failed leaves no trace (the first checkpoint's write
  // would have made them).
  std::vector<std::string> created_;
  std::unique_ptr<Refresher> refresher_;
  // The lock just made is this holder's: refreshed from now on, and removed by a second
  // Ctrl-C (taken again after its removal, it was refreshed but no longer removed).
  void hold();
};

// The lock file of run directory `dir`: DIR/trainer.lock.
std::string run_lock_path(const std::string& dir);

// One trainer per run directory: rank 0 takes checkpoint.dir's lock, which also finds an
// unwritable directory now, and train.metrics_dir's when it is set to another directory,
// and holds them through the returned objects (none on the other ranks). Throws
// AllRanksError (exit 2) on every rank, with rank 0's reason, when it cannot, before any
// checkpoint is read.
std::vector<std::unique_ptr<RunLock>> lock_run_directory(const Config& config,
                                                         const Communicator& comm,
                                                         std::ostream& log);

// A run owns its directory: a fresh run (`resumed_from` empty) refuses a checkpoint.dir or
// metrics file that holds another run's files, a resumed one those of another run id;
// with checkpoint.overwrite rank 0 deletes them instead. A run resumed from a file outside
// checkpoint.dir (at `resumed_step`, of lineage `resumed_lineage`) refuses one that holds
// checkpoints of its run on another branch (CheckpointKeeping::branch_changes: an earlier
// resume of the same file, trained on there, as a second fine-tuning into the first one's
// directory, whose checkpoints it marked superseded and wrote over); checkpoint.overwrite
// lets it mark them. No output may destroy an input. Rank 0 then removes, with a note
// each, the temporary files of checkpoint writes that a crash interrupted. Returns rank
// 0's metrics file (run_metrics_path; "" on the other ranks), or throws AllRanksError
// (exit 2) on every rank before anything is written.
std::string claim_run_directory(const Config& config, const Communicator& comm,
                                const std::string& run_id, const std::string& resumed_from,
                                int64_t resumed_step,
                                const std::vector<BranchStart>& resumed_lineage,
                                std::ostream& log);

// --dry-run's look at the run directory, taking no lock and changing nothing there: what
// lock_run_directory would refuse (a checkpoint.dir or train.metrics_dir that cannot be
// made or written, another trainer's live lock), and what claim_run_directory would
// refuse for the run `run_id` resumed from `resumed_from` ("" for a fresh run). What
// training would change (a stale lock taken over, files deleted) is said on `notes`.
std::string run_lock_refusal(const Config& config, std::ostream& notes);
std::string run_directory_refusal(const Config& config, const std::string& run_id,
                                  const std::string& resumed_from, int64_t resumed_step,
                                  const std::vector<BranchStart>& resumed_lineage,
                                  std::ostream& notes);

}  // namespace thpc
