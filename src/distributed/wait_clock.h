// The clock of a bounded wait (dist.timeout_s) that does not count the time this process
// itself was stopped. A job suspended as a whole (Slurm's `scontrol suspend`, which sends
// SIGSTOP to every process of the job, then SIGCONT at `scontrol resume`; Ctrl-Z and `fg`
// where job control reaches the ranks; a debugger holding a rank) finds its ranks inside
// their waits when it goes on: counted by the wall clock, each would have waited longer
// than dist.timeout_s and ended the job at once, though no peer was lost.
//
// The evidence of a stop is a SIGCONT, which every way of continuing a stopped process
// sends: a handler (installed by the first clock, chained to any handler before it)
// counts them. A poll that finds the count changed since the previous poll leaves the
// time between the two out; every other gap counts, however long (a rank whose polls
// are slow, paging or descheduled, is not stopped, and its peers may well be lost).
#pragma once

#include <chrono>
#include <cstdint>

namespace thpc {

// How many SIGCONT this process has received since the first call (which installs the
// counting handler; async-signal-safe, chained to a handler installed before it).
uint64_t continue_signals_seen();

// Seconds on the monotonic clock (std::chrono::steady_clock, WaitClock's), from an
// arbitrary origin: the trainer's checkpoint and time-limit clock, and the waits' pacing.
inline double steady_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

class WaitClock {
 public:
  using Clock = std::chrono::steady_clock;

  // `started`: when the wait began (a wait bounded from an earlier event, such as a
  // collective's launch, passes that). Stops are looked for from here on, so a wait
  // bounded from an earlier event makes its clock at that event and keeps it (the NCCL
  // reducer: one clock a pass, made at its first launch).
  explicit WaitClock(Clock::time_point started = Clock::now())
      : started_(started), last_poll_(Clock::now()), continues_(continue_signals_seen()) {}

  // Seconds since `started`, less every gap between polls in which a SIGCONT came.
  double waited_seconds() { return waited_seconds_at(Clock::now(), continue_signals_seen()); }

  // As waited_seconds(), at `now` with `continues` SIGCONT seen so far (the tests give
  // both).
  double waited_seconds_at(Clock::time_point now, uint64_t continues) {
    if (continues != continues_) {
      paused_seconds_ += std::chrono::duration<double>(now - last_poll_).count();
      continues_ = continues;
    }
    last_poll_ = now;
    return std::chrono::duration<double>(now - started_).count() - paused_seconds_;
  }

  // The seconds left out as stops so far.
  double paused_seconds() const { return paused_seconds_; }

 private:
  Clock::time_point started_;
  Clock::time_point last_poll_;
  uint64_t continues_;
  double paused_seconds_ = 0;
};

}  // namespace thpc
