// SIGTERM and SIGUSR1 (what Slurm sends before a time limit or a preemption) ask the
// training loop to stop: the handler only sets a flag, and the loop finishes the step it
// is in, writes a checkpoint and exits 0, so the job can be requeued and resumed.
// SIGINT (Ctrl-C) asks the same, once: a second SIGINT ends the process at once, as
// Ctrl-C would have (one within 50 ms of the first is the same one delivered twice, as
// `timeout -s INT` does: ignored); a SIGINT that was ignored when the guard came (a
// background job of a shell, nohup) stays ignored. SIGHUP (the terminal or ssh session
// closed) asks the same as SIGTERM, unless it was ignored when the guard came (nohup),
// when it stays ignored.
#pragma once

#include <string>

namespace thpc {

// Installs the handlers for SIGTERM, SIGUSR1, SIGINT and SIGHUP while it lives, clearing
// any earlier request, and ignores SIGPIPE (a piped log's reader gone: the write fails,
// the run goes on); the previous handlers come back when it is destroyed.
//
// main() makes one before MPI starts, so that a signal during start-up (MPI's own, checking
// the shards, reading a checkpoint) is recorded instead of killing the process; the
// trainer makes its own for callers other than main. A guard made while another lives
// changes nothing: the outer one's handlers stay, and so does a request already made.
class StopSignalGuard {
 public:
  StopSignalGuard();
  ~StopSignalGuard();
  StopSignalGuard(const StopSignalGuard&) = delete;
  StopSignalGuard& operator=(const StopSignalGuard&) = delete;
};

// From now on a SIGINT says at once on stderr what it does: the first that the step in
// progress finishes and a checkpoint is written (a step of a big model, and its
// checkpoint, can take a while, in which Ctrl-C seemed to do nothing), the second that
// the process ends now without one. main() calls it on rank 0, which speaks for the job.
void announce_interrupts();

// The signal number that asked to stop, or 0 if none has.
int stop_requested_by();

// A file the process removes when a second Ctrl-C ends it at once (a run directory's lock:
// before, it stayed for the next start to take over), until keep_at_abrupt_stop, and only
// while it holds exactly `while_it_holds` (at most 1 KiB): a lock another process took
// over is the other's.
void remove_at_abrupt_stop(const std::string& path, const std::string& while_it_holds);
void keep_at_abrupt_stop(const std::string& path);
// Removes those files, and a checkpoint's temporary file being written: what a process
// that ends at once (a second Ctrl-C; a wait for the other ranks past dist.timeout_s,
// which ends the job without unwinding) would otherwise leave. Async-signal-safe.
void remove_files_at_abrupt_stop();

// "SIGTERM", "SIGUSR1", "SIGINT", "SIGHUP" (for log lines).
const char* stop_signal_name(int signal_number);

// The environment variable naming the file in which rank 0 of a run stopped during its
// start-up writes the signal's name ("SIGUSR1"): jobs/common.sh sets it. Such a run
// writes no summary record in metrics.jsonl, and under srun a stop sent to the ranks and
// not to the batch shell left the job COMPLETED, unfinished, without a word: the file is
// how the job script knows that its ranks exited 0 for a stop, not having trained.
inline constexpr const char* kStartUpStopFileVariable = "THPC_STARTUP_STOP_FILE";

// Writes stop_signal_name(signal_number) to the file kStartUpStopFileVariable names, if
// set; a file that cannot be written is said on stderr (the stop itself stands).
void record_stop_before_training(int signal_number);

}  // namespace thpc
