// Frees that wait for other threads' graph captures on the device.
//
// cudaFree and cudaFreeHost synchronise the device, and a synchronisation of a device
// while any of its streams is being captured invalidates that capture (the CUDA
// programming guide, "Prohibited and unhandled operations"; measured on NVIDIA GPUs: a
// capture on one thread was invalidated by another thread's synchronisation of the same
// device). Decoding workers that each capture their steps (the candidate worker_graphs,
// kernels/ops.h) would then see each other's frees (a batch's state, id buffers, scratch
// growth) end their captures, and run those steps uncaptured.
//
// So a capture that other threads may meet holds a ConcurrentCaptureScope from before
// its cudaStreamBeginCapture to after its cudaStreamEndCapture, and every free of device
// or pinned memory goes through a FreeGate, which waits until no other thread holds a
// scope. On the capturing thread itself a free cannot wait (it would wait for itself) nor
// run (it would end the other threads' captures too): it is deferred to the scope's end
// (defer_free_while_capturing), and still counted, so that the backend drops that
// thread's own capture as before (Context::frees()) and runs the work uncaptured. Without
// any scope open (one worker, the trainer) a gate never waits and nothing is deferred;
// and until use_capture_free_lock() is called (a Context made with worker_graphs, before
// any worker starts) a gate does nothing at all, so that every other path runs as it did.
// Host code only: one lock for the process (one device per process: a rank, or a
// decoding program's workers).
#pragma once

#include <functional>

namespace thpc {

// From now on, for the process's life, FreeGates take the lock. Called before any thread
// that may capture concurrently starts (a gate that skipped the lock while a capture began
// would let its free run under that capture).
void use_capture_free_lock();

class ConcurrentCaptureScope {
 public:
  // `active` false: nothing held (a capture no other thread's free can meet).
  explicit ConcurrentCaptureScope(bool active);
  ~ConcurrentCaptureScope();
  ConcurrentCaptureScope(const ConcurrentCaptureScope&) = delete;
  ConcurrentCaptureScope& operator=(const ConcurrentCaptureScope&) = delete;

 private:
  bool held_ = false;
};

class FreeGate {
 public:
  FreeGate();
  ~FreeGate();
  FreeGate(const FreeGate&) = delete;
  FreeGate& operator=(const FreeGate&) = delete;

 private:
  bool exclusive_ = false;
};

// On a thread that holds a ConcurrentCaptureScope: keeps `free_call` to run when the scope
// ends (after its lock is released, behind a FreeGate) and returns true. Elsewhere returns
// false, `free_call` not kept: the caller frees now, behind a FreeGate.
bool defer_free_while_capturing(std::function<void()> free_call);

// Whether this thread holds a ConcurrentCaptureScope (tests).
bool inside_concurrent_capture();

}  // namespace thpc
