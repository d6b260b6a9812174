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
#include <optional>
#include <thread>

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

  // A wait that begins now. Here and at each poll the count of SIGCONT is read before the
  // time: a stop between the two reads then lies in a gap that the count's change (or
  // waited_longer_than's second look) leaves out; read after the time, the SIGCONT was
  // taken for one before the gap, and the stop counted (a suspended job ended at its
  // resume, about 1 time in 100).
  WaitClock() : WaitClock(continue_signals_seen(), std::nullopt) {}
  // `started`: when the wait began, for one bounded from an earlier event (a collective's
  // launch). Stops are looked for from here on, so such a wait makes its clock at that
  // event and keeps it (the NCCL reducer: one clock a pass, made at its first launch).
  explicit WaitClock(Clock::time_point started) : WaitClock(continue_signals_seen(), started) {}

  // Seconds since `started`, less every gap between polls in which a SIGCONT came.
  double waited_seconds() {
    const uint64_t continues = continue_signals_seen();
    return waited_seconds_at(Clock::now(), continues);
  }

  // Whether more than `limit` seconds were waited (a poll, as waited_seconds()). A wait
  // that is over its limit only through the gap since the last poll, with no SIGCONT
  // counted yet, looks again for a moment (kSignalGrace) before it says so: the SIGCONT's
  // handler runs on whichever thread the kernel picks, and this one may continue and poll
  // before it has run (a suspended two-rank job was ended so at its resume, 1 time in 12
  // with 2 ms steps). Only a wait about to end the job pays for the look.
  bool waited_longer_than(double limit) {
    uint64_t continues = continue_signals_seen();
    const Clock::time_point now = Clock::now();
    if (continues == continues_ && waited_seconds_if_stopped_since_last_poll(now) <= limit &&
        seconds_between(started_, now) - paused_seconds_ > limit) {
      const Clock::time_point until = Clock::now() + kSignalGrace;
      while (continues == continues_ && Clock::now() < until) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
        continues = continue_signals_seen();
      }
    }
    return waited_seconds_at(now, continues) > limit;
  }

  // As waited_seconds(), at `now` with `continues` SIGCONT seen so far (the tests give
  // both).
  double waited_seconds_at(Clock::time_point now, uint64_t continues) {
    if (continues != continues_) {
      paused_seconds_ += seconds_between(last_poll_, now);
      continues_ = continues;
    }
    last_poll_ = now;
    return seconds_between(started_, now) - paused_seconds_;
  }

  // The seconds left out as stops so far.
  double paused_seconds() const { return paused_seconds_; }

  // How long waited_longer_than waits for a SIGCONT's handler to run elsewhere.
  static constexpr std::chrono::milliseconds kSignalGrace{100};

 private:
  static double seconds_between(Clock::time_point from, Clock::time_point to) {
    return std::chrono::duration<double>(to - from).count();
  }
  // What waited_seconds_at(now, ...) would say if a SIGCONT marked the gap since the last
  // poll as a stop.
  double waited_seconds_if_stopped_since_last_poll(Clock::time_point now) const {
    return seconds_between(started_, now) - paused_seconds_ - seconds_between(last_poll_, now);
  }

  WaitClock(uint64_t continues, std::optional<Clock::time_point> started)
      : continues_(continues), last_poll_(Clock::now()), started_(started.value_or(last_poll_)) {}

  // (in this order: the count, then the times, as the constructor reads them)
  uint64_t continues_;
  Clock::time_point last_poll_;
  Clock::time_point started_;
  double paused_seconds_ = 0;
};

}  // namespace thpc
