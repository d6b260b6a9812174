#include "kernels/capture_free_lock.h"

#include <shared_mutex>

namespace thpc {

namespace {

// Captures share it, frees take it alone.
std::shared_mutex& captures_and_frees() {
  static std::shared_mutex lock;
  return lock;
}

// This thread's scope is open (scopes do not nest: a capture is one stream's at a time).
thread_local bool capturing_here = false;

}  // namespace

ConcurrentCaptureScope::ConcurrentCaptureScope(bool active) {
  if (!active || capturing_here) return;
  captures_and_frees().lock_shared();
  capturing_here = true;
  held_ = true;
}

ConcurrentCaptureScope::~ConcurrentCaptureScope() {
  if (!held_) return;
  capturing_here = false;
  captures_and_frees().unlock_shared();
}

FreeGate::FreeGate() : exclusive_(!capturing_here) {
  if (exclusive_) captures_and_frees().lock();
}

FreeGate::~FreeGate() {
  if (exclusive_) captures_and_frees().unlock();
}

bool inside_concurrent_capture() { return capturing_here; }

}  // namespace thpc
