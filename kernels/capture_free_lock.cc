#include "kernels/capture_free_lock.h"

#include <atomic>
#include <shared_mutex>
#include <utility>
#include <vector>

namespace thpc {

namespace {

// Captures share it, frees take it alone.
std::shared_mutex& captures_and_frees() {
  static std::shared_mutex lock;
  return lock;
}

// use_capture_free_lock() was called.
std::atomic<bool> gates_lock{false};

// This thread's scope is open (scopes do not nest: a capture is one stream's at a time).
thread_local bool capturing_here = false;
// The frees this thread's open scope keeps for its end.
thread_local std::vector<std::function<void()>> deferred_frees;

}  // namespace

void use_capture_free_lock() { gates_lock = true; }

ConcurrentCaptureScope::ConcurrentCaptureScope(bool active) {
  if (!active || capturing_here) return;
  use_capture_free_lock();  // (the Context made with worker_graphs has called it already)
  captures_and_frees().lock_shared();
  capturing_here = true;
  held_ = true;
}

ConcurrentCaptureScope::~ConcurrentCaptureScope() {
  if (!held_) return;
  capturing_here = false;
  captures_and_frees().unlock_shared();
  std::vector<std::function<void()>> frees;
  frees.swap(deferred_frees);
  for (const std::function<void()>& free_call : frees) {
    const FreeGate gate;
    free_call();
  }
}

bool defer_free_while_capturing(std::function<void()> free_call) {
  if (!capturing_here) return false;
  deferred_frees.push_back(std::move(free_call));
  return true;
}

FreeGate::FreeGate() : exclusive_(gates_lock && !capturing_here) {
  if (exclusive_) captures_and_frees().lock();
}

FreeGate::~FreeGate() {
  if (exclusive_) captures_and_frees().unlock();
}

bool inside_concurrent_capture() { return capturing_here; }

}  // namespace thpc
