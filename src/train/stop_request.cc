#include "train/stop_request.h"

#include <fcntl.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <string>

#include "io/atomic_file.h"

namespace thpc {
namespace {

// Written by the handler, read by the loop: a lock-free atomic is what a handler may touch.
// Not volatile sig_atomic_t, which is only for a handler on the thread it interrupted: a
// process-directed signal goes to any thread that does not block it, Open MPI's progress
// thread for one (ThreadSanitizer's finding, tools/sanitize.sh --threads: the handler's
// write on that thread raced with the training loop's read).
std::atomic<int> g_stop_signal{0};
static_assert(std::atomic<int>::is_always_lock_free);
// Whether a SIGINT came already (a second one ends the process). Set after
// g_first_interrupt_ns (sequentially consistent): a handler that sees it set sees the time.
std::atomic<int> g_interrupted{0};

// When the first SIGINT came (CLOCK_MONOTONIC, ns). Only the handler touches it. An atomic
// too: the two SIGINTs of `timeout -s INT` (below) can run their handlers at once on two
// threads, each taking itself for the first, and a struct written by both could tear.
std::atomic<long long> g_first_interrupt_ns{0};
static_assert(std::atomic<long long>::is_always_lock_free);
// A SIGINT this soon after the first is the same request delivered twice, not a second
// Ctrl-C: `timeout -s INT` signals its child and then its own process group, which holds
// the child, microseconds apart (and so ended the run without its checkpoint). Nobody
// presses Ctrl-C twice within 50 ms; a held key repeats after ~250 ms.
constexpr long long kSameInterruptNs = 50'000'000;

// clock_gettime is async-signal-safe.
long long monotonic_ns() {
  struct timespec now {};
  clock_gettime(CLOCK_MONOTONIC, &now);
  return static_cast<long long>(now.tv_sec) * 1'000'000'000LL + now.tv_nsec;
}

// Whether this process says on stderr what a Ctrl-C does (announce_interrupts: the rank
// that speaks for the job), and whether stderr is a terminal, where the line goes below
// the ^C the terminal echoed.
std::atomic<int> g_announce{0};
std::atomic<int> g_on_terminal{0};

// write() is async-signal-safe, and the lengths are known: nothing else is called.
template <size_t N>
void say(const char (&line)[N]) {
  if (g_on_terminal) (void)!write(STDERR_FILENO, "\n", 1);
  (void)!write(STDERR_FILENO, line, N - 1);
}

// SIGHUP: the terminal or ssh session the run was started from closed. Its default
// action kills the process without a checkpoint; a run started with it ignored (nohup)
// keeps it ignored, as a background job keeps SIGINT ignored.
constexpr int kStopSignals[] = {SIGTERM, SIGUSR1, SIGINT, SIGHUP};
struct sigaction g_previous[sizeof kStopSignals / sizeof kStopSignals[0]];
// Guards alive now; only the outermost installs and restores (the process is
// single-threaded where guards are made: main and the trainer's run()).
int g_live_guards = 0;
// SIGPIPE, ignored while a guard lives: a log piped to tee or head whose reader is gone (a
// Ctrl-C reaches tee too, a closed ssh session ends it) killed the process at its next
// write, the "stopping cleanly" notice itself, without the checkpoint (exit 141). Ignored,
// that write fails (EPIPE), the stream stops printing and the run stops as asked.
struct sigaction g_previous_pipe;

// The lock files a second Ctrl-C removes before the process ends (RunLock's: the next
// start found them and took them over, with a note, or the user removed them by hand),
// each with the text it holds while it is this process's. Fixed buffers: a handler may
// not allocate.
constexpr int kAbruptSlots = 4;
char g_abrupt_paths[kAbruptSlots][4096];
char g_abrupt_contents[kAbruptSlots][1024];
size_t g_abrupt_content_bytes[kAbruptSlots];
std::atomic<bool> g_abrupt_used[kAbruptSlots];

// Whether `path` holds exactly `contents` now: open, read and close are async-signal-safe.
bool still_holds(const char* path, const char* contents, size_t bytes) {
  const int file = ::open(path, O_RDONLY | O_CLOEXEC);
  if (file < 0) return false;
  char found[sizeof g_abrupt_contents[0] + 1];
  size_t got = 0;
  for (ssize_t read_now = 1; read_now > 0 && got < sizeof found; got += read_now) {
    read_now = ::read(file, found + got, sizeof found - got);
    if (read_now < 0) break;
  }
  ::close(file);
  return got == bytes && std::memcmp(found, contents, bytes) == 0;
}

extern "C" void record_stop_signal(int signal_number) {
  // A second Ctrl-C is the user not wanting to wait for the step and its checkpoint: the
  // default action, as if no handler were there (sigaction and raise are async-signal-safe).
  if (signal_number == SIGINT && g_interrupted) {
    if (monotonic_ns() - g_first_interrupt_ns < kSameInterruptNs) return;  // the same one
    if (g_announce) {
      say("Ctrl-C again: stopping now, without a checkpoint (one being written is lost "
          "too)\n");
    }
    remove_files_at_abrupt_stop();
    struct sigaction default_action {};
    default_action.sa_handler = SIG_DFL;
    sigemptyset(&default_action.sa_mask);
    sigaction(SIGINT, &default_action, nullptr);
    raise(SIGINT);
    return;
  }
  if (signal_number == SIGINT) {
    g_first_interrupt_ns = monotonic_ns();
    g_interrupted = 1;
    if (g_announce && g_stop_signal.load() != 0) {
      // A scheduler's or the user's stop came first (before: the line said it began
      // stopping now, and came after the run's own "stopped:" line when the run was done).
      say("Ctrl-C: already stopping, as a signal before it asked; Ctrl-C again stops at "
          "once, without a checkpoint, and loses one being written\n");
    } else if (g_announce) {
      say("Ctrl-C: stopping cleanly (a step in progress finishes and is saved in a "
          "checkpoint); Ctrl-C again stops at once, without one, and loses one being "
          "written\n");
    }
  }
  // The strongest request stays (SIGTERM over SIGUSR1 over SIGINT over SIGHUP, as the
  // ranks agree by the maximum): a later Ctrl-C does not turn a scheduler's stop into an
  // interactive one.
  // A compare-and-swap (lock-free: async-signal-safe): two threads' handlers may race.
  int strongest = g_stop_signal.load();
  while (signal_number > strongest &&
         !g_stop_signal.compare_exchange_weak(strongest, signal_number)) {
  }
}

}  // namespace

StopSignalGuard::StopSignalGuard() {
  if (g_live_guards++ > 0) return;
  g_stop_signal = 0;
  g_interrupted = 0;
  struct sigaction action {};
  action.sa_handler = record_stop_signal;
  sigemptyset(&action.sa_mask);
  // Restart interrupted system calls: a write in progress must not fail with EINTR.
  action.sa_flags = SA_RESTART;
  struct sigaction ignore {};
  ignore.sa_handler = SIG_IGN;
  sigemptyset(&ignore.sa_mask);
  sigaction(SIGPIPE, &ignore, &g_previous_pipe);
  for (size_t i = 0; i < sizeof kStopSignals / sizeof kStopSignals[0]; ++i) {
    sigaction(kStopSignals[i], &action, &g_previous[i]);
    // A shell starts background jobs with SIGINT ignored, so that a Ctrl-C meant for the
    // foreground does not reach them, and nohup starts its command with SIGHUP ignored, so
    // that closing the terminal does not stop it: keep them so.
    if ((kStopSignals[i] == SIGINT || kStopSignals[i] == SIGHUP) &&
        g_previous[i].sa_handler == SIG_IGN) {
      sigaction(kStopSignals[i], &g_previous[i], nullptr);
    }
  }
}

StopSignalGuard::~StopSignalGuard() {
  if (--g_live_guards > 0) return;
  for (size_t i = 0; i < sizeof kStopSignals / sizeof kStopSignals[0]; ++i) {
    sigaction(kStopSignals[i], &g_previous[i], nullptr);
  }
  sigaction(SIGPIPE, &g_previous_pipe, nullptr);
}

void announce_interrupts() {
  g_on_terminal = isatty(STDERR_FILENO) ? 1 : 0;
  g_announce = 1;
}

int stop_requested_by() { return g_stop_signal; }

void remove_at_abrupt_stop(const std::string& path, const std::string& while_it_holds) {
  // Too long to keep: left as before, for the next start to take over.
  if (path.size() >= sizeof g_abrupt_paths[0]) return;
  if (while_it_holds.size() > sizeof g_abrupt_contents[0]) return;
  for (int slot = 0; slot < kAbruptSlots; ++slot) {
    if (g_abrupt_used[slot].load()) continue;
    std::memcpy(g_abrupt_paths[slot], path.c_str(), path.size() + 1);
    std::memcpy(g_abrupt_contents[slot], while_it_holds.data(), while_it_holds.size());
    g_abrupt_content_bytes[slot] = while_it_holds.size();
    g_abrupt_used[slot].store(true);
    return;
  }
}

void remove_files_at_abrupt_stop() {
  for (int slot = 0; slot < kAbruptSlots; ++slot) {
    // Only while it is still this process's: after a suspension past the lock's staleness
    // another trainer may have taken it over before this one's refresher noticed (before,
    // the second Ctrl-C then removed the other's lock, letting a third in beside it).
    if (g_abrupt_used[slot].load() &&
        still_holds(g_abrupt_paths[slot], g_abrupt_contents[slot],
                    g_abrupt_content_bytes[slot])) {
      ::unlink(g_abrupt_paths[slot]);  // async-signal-safe
    }
  }
  remove_registered_temporaries();  // a checkpoint being written: its .NAME.tmp
}

void keep_at_abrupt_stop(const std::string& path) {
  for (int slot = 0; slot < kAbruptSlots; ++slot) {
    if (g_abrupt_used[slot].load() && path == g_abrupt_paths[slot]) {
      g_abrupt_used[slot].store(false);
    }
  }
}

void record_stop_before_training(int signal_number) {
  const char* path = std::getenv(kStartUpStopFileVariable);
  if (path == nullptr || *path == '\0') return;
  std::ofstream file(path, std::ios::trunc);
  file << stop_signal_name(signal_number) << "\n";
  file.close();
  if (!file) {
    std::cerr << "warning: could not write " << path << " (" << kStartUpStopFileVariable
              << "), where the job script looks for a stop during start-up" << std::endl;
  }
}

const char* stop_signal_name(int signal_number) {
  if (signal_number == SIGTERM) return "SIGTERM";
  if (signal_number == SIGUSR1) return "SIGUSR1";
  if (signal_number == SIGINT) return "SIGINT";
  if (signal_number == SIGHUP) return "SIGHUP";
  return "a signal";
}

}  // namespace thpc
