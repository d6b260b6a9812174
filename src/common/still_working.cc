#include "common/still_working.h"

#include <atomic>
#include <utility>

namespace thpc {
namespace {

// Per thread: only the thread that calls MPI (MPI_THREAD_FUNNELED) may send the sign; a
// background checkpoint writer's checksum, on its own thread, finds none.
std::function<void()>& this_threads_sign() {
  thread_local std::function<void()> sign;
  return sign;
}

std::atomic<int64_t> signs_given{0};

}  // namespace

void show_still_working() {
  signs_given.fetch_add(1, std::memory_order_relaxed);
  if (const std::function<void()>& sign = this_threads_sign()) sign();
}

int64_t signs_of_work_given() { return signs_given.load(std::memory_order_relaxed); }

StillWorkingSign::StillWorkingSign(std::function<void()> sign)
    : previous_(std::exchange(this_threads_sign(), std::move(sign))) {}

StillWorkingSign::~StillWorkingSign() { this_threads_sign() = std::move(previous_); }

}  // namespace thpc
