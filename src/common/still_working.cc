#include "common/still_working.h"

#include <utility>

namespace thpc {
namespace {

// Per thread: only the thread that calls MPI (MPI_THREAD_FUNNELED) may send the sign; a
// background checkpoint writer's checksum, on its own thread, finds none.
std::function<void()>& this_threads_sign() {
  thread_local std::function<void()> sign;
  return sign;
}

}  // namespace

void show_still_working() {
  if (const std::function<void()>& sign = this_threads_sign()) sign();
}

StillWorkingSign::StillWorkingSign(std::function<void()> sign)
    : previous_(std::exchange(this_threads_sign(), std::move(sign))) {}

StillWorkingSign::~StillWorkingSign() { this_threads_sign() = std::move(previous_); }

}  // namespace thpc
