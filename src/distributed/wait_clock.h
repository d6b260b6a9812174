// The clock of a bounded wait (dist.timeout_s) that does not count the time this process
// itself was paused. A job suspended as a whole (Slurm's `scontrol suspend`, which sends
// SIGSTOP to every process of the job, then SIGCONT at `scontrol resume`; a debugger
// holding a rank) finds its ranks inside their waits when it goes on: counted by the wall
// clock, each would have waited longer than dist.timeout_s and ended the job at once,
// though no peer was lost. The poll loops of the waits call waited_seconds() at every
// poll, a millisecond or less apart, so a gap between two polls of more than
// kPausedAfterSeconds means that this process did not run. The gap is left out.
#pragma once

#include <chrono>

namespace thpc {

class WaitClock {
 public:
  using Clock = std::chrono::steady_clock;

  // Half a second: a runnable process is not left off the cores that long even when
  // oversubscribed (two 4-rank jobs of input/tiny.ini on 2 cores, 2026-12-01: polls at
  // most 29 ms apart), while a pause by a signal or a debugger lasts seconds.
  static constexpr double kPausedAfterSeconds = 0.5;

  // `started`: when the wait began (a wait bounded from an earlier event, such as a
  // collective's launch, passes that); gaps are looked for from now on.
  explicit WaitClock(Clock::time_point started = Clock::now())
      : started_(started), last_poll_(Clock::now()) {}

  // Seconds since `started`, less every gap between polls longer than
  // kPausedAfterSeconds.
  double waited_seconds() { return waited_seconds_at(Clock::now()); }

  // As waited_seconds(), at `now` (the tests give the times).
  double waited_seconds_at(Clock::time_point now) {
    const double gap = std::chrono::duration<double>(now - last_poll_).count();
    if (gap > kPausedAfterSeconds) paused_seconds_ += gap;
    last_poll_ = now;
    return std::chrono::duration<double>(now - started_).count() - paused_seconds_;
  }

  // The seconds left out as pauses so far.
  double paused_seconds() const { return paused_seconds_; }

 private:
  Clock::time_point started_;
  Clock::time_point last_poll_;
  double paused_seconds_ = 0;
};

}  // namespace thpc
