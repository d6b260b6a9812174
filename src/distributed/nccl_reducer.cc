// The NCCL transport of the gradient all-reduce (see gradient_reducer.h).
//
// Bootstrap as nccl-tests does it: rank 0 calls ncclGetUniqueId, MPI_Bcast hands the id
// to every rank, each rank calls ncclCommInitRank on its own GPU (already selected by the
// backend: local rank modulo the visible devices). One communicator per job.
//
// Overlap: a bucket's ncclAllReduce runs on the reducer's own stream. When backward
// declares a bucket final, an event is recorded on the compute stream and the NCCL
// stream waits for it, so the sum starts as soon as the GPU has written the bucket while
// the compute stream carries on with the layers beneath. finish() makes the compute
// stream wait for the NCCL stream (the optimizer then reads summed gradients) and polls
// for completion with ncclCommGetAsyncError and a timeout: a peer that died or hangs
// ends this rank with an error instead of a silent hang. The timer starts when the
// step's first bucket is launched, so dist.timeout_s bounds the sums themselves.
//
// Captured (train.cuda_kernels step_graphs, untimed): the pass's launches, the events
// between the streams and the compute stream's wait are all stream work, so the last
// micro-batch's graph holds its sums too. The host always waits for an event recorded on
// the compute stream after the pass (a graph's done_ is one of its nodes, which the host
// cannot query); after a replay its clock starts at the wait.
//
// dist.reduce_dtype = bf16: a final bucket is first rounded into a bf16 copy on the compute
// stream (the backend's conversion, the one that makes the bf16 weights each step), NCCL
// sums the copies as ncclBfloat16, and the sums are widened back into the fp32 gradient on
// the compute stream once the NCCL stream is done.
//
// Ranks that share a GPU are refused before NCCL is asked: each rank's host and PCI bus id
// are gathered, and a repeat ends every rank with a message naming dist.reducer = mpi.
//
// The communicator is non-blocking (ncclConfig_t::blocking = 0): creating it with a peer
// that never arrives would otherwise hang in ncclCommInitRankConfig forever; here it is
// polled with the same dist.timeout_s. On a non-blocking communicator any call may
// return ncclInProgress, and the next call must wait until ncclCommGetAsyncError says
// ncclSuccess (wait_ready).
#include "distributed/gradient_reducer.h"

#include "common/error.h"

#if THPC_HAVE_CUDA
#include <cuda_runtime.h>
#include <nccl.h>

#include <chrono>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "distributed/wait_clock.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/nccl_check.h"
#endif

namespace thpc {

#if THPC_HAVE_CUDA
namespace {

ncclDataType_t nccl_type(DType dtype) {
  switch (dtype) {
    case DType::F32: return ncclFloat32;
    case DType::BF16: return ncclBfloat16;
    default: THPC_FAIL("NCCL sums of " << dtype_name(dtype) << " gradients are not supported");
  }
}

class NcclGradientReducer final : public GradientReducer {
 public:
  NcclGradientReducer(const Communicator& comm, Backend& backend, int64_t bucket_bytes,
                      double timeout_seconds, bool bf16)
      : GradientReducer(bucket_bytes),
        backend_(backend),
        timeout_seconds_(timeout_seconds),
        bf16_(bf16) {
    THPC_CHECK(!backend.host_memory() && backend.native_stream() != nullptr,
               "NCCL sums need a GPU backend, not " << backend.name());
    compute_stream_ = static_cast<cudaStream_t>(backend.native_stream());
    THPC_CUDA_CHECK(cudaSetDevice(backend.device()));
    refuse_ranks_sharing_a_gpu(comm, backend.device());
    ncclUniqueId id{};
    if (comm.is_root()) THPC_NCCL_CHECK(ncclGetUniqueId(&id));
    comm.broadcast_bytes_from_root(&id, static_cast<int>(sizeof(id)));
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    WaitClock creating;
    accept_in_progress(ncclCommInitRankConfig(&nccl_, comm.size(), id, comm.rank(), &config),
                       "creating the communicator");
    wait_ready("creating the communicator", creating);
    THPC_CUDA_CHECK(cudaStreamCreateWithFlags(&nccl_stream_, cudaStreamNonBlocking));
    THPC_CUDA_CHECK(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming));
  }

  ~NcclGradientReducer() override {
    if (staging_) backend_.free(staging_);
    for (Tensor& staging : apart_staging_) backend_.free(staging);
    for (cudaEvent_t event : ready_events_) cudaEventDestroy(event);
    for (cudaEvent_t event : timing_events_) cudaEventDestroy(event);
    if (done_) cudaEventDestroy(done_);
    if (after_sums_) cudaEventDestroy(after_sums_);
    if (nccl_stream_) cudaStreamDestroy(nccl_stream_);
    if (nccl_) ncclCommDestroy(nccl_);
  }

 protected:
  void start(Tensor bucket) override {
    // One event per bucket of the pass, created once and reused every step.
    if (next_event_ == ready_events_.size()) {
      cudaEvent_t event = nullptr;
      THPC_CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
      ready_events_.push_back(event);
    }
    if (next_event_ == 0) pass_clock_ = WaitClock();  // the pass's sums wait from here
    Tensor summed = bucket;
    if (bf16_) {
      summed = bf16_copy_of(bucket);
      backend_.copy(summed, bucket);  // rounds to bf16 on the compute stream
      widen_after_sum_.emplace_back(bucket, summed);
    }
    const size_t index = next_event_;
    cudaEvent_t ready = ready_events_[next_event_++];
    THPC_CUDA_CHECK(cudaEventRecord(ready, compute_stream_));
    THPC_CUDA_CHECK(cudaStreamWaitEvent(nccl_stream_, ready, 0));
    if (timing()) THPC_CUDA_CHECK(cudaEventRecord(timing_event(2 + 2 * index), nccl_stream_));
    accept_in_progress(
        ncclAllReduce(summed.data, summed.data, static_cast<size_t>(summed.numel),
                      nccl_type(summed.dtype), ncclSum, nccl_, nccl_stream_),
        "launching a gradient sum");
    if (timing()) THPC_CUDA_CHECK(cudaEventRecord(timing_event(3 + 2 * index), nccl_stream_));
    wait_ready("launching a gradient sum", pass_clock_);
  }

  // The discarded capture's launches never run: its bf16 widenings are not owed, and the
  // buckets' events are recorded afresh from the first.
  void discard_started() override {
    widen_after_sum_.clear();
    next_event_ = 0;
  }

  // dist.log_buckets: the pass timed by events, from one on the compute stream at begin().
  void begin_timing() override {
    THPC_CUDA_CHECK(cudaEventRecord(timing_event(0), compute_stream_));
  }

  void finish_timings(ReductionTimings& timings) override {
    const auto since_start = [&](size_t event) {
      float ms = 0.0f;
      THPC_CUDA_CHECK(cudaEventElapsedTime(&ms, timing_events_[0], timing_events_[event]));
      return static_cast<double>(ms);
    };
    timings.device_clock = true;
    timings.backward_done_ms = since_start(1);
    for (size_t b = 0; b < timings.buckets.size(); ++b) {
      timings.buckets[b].posted_ms = since_start(2 + 2 * b);
      timings.buckets[b].done_ms = since_start(3 + 2 * b);
    }
    timings.sums_done_ms = timings.buckets.empty() ? timings.backward_done_ms
                                                   : timings.buckets.back().done_ms;
  }

  // Untimed: the launches, their events and the wait are stream work a graph can hold.
  bool capturable() const override { return !timing(); }
  void queue_complete() override {
    awaited_clock_ = next_event_ > 0 ? pass_clock_ : WaitClock();
    if (timing()) THPC_CUDA_CHECK(cudaEventRecord(timing_event(1), compute_stream_));
    next_event_ = 0;
    THPC_CUDA_CHECK(cudaEventRecord(done_, nccl_stream_));
    THPC_CUDA_CHECK(cudaStreamWaitEvent(compute_stream_, done_, 0));
    for (const auto& [bucket, summed] : widen_after_sum_) backend_.copy(bucket, summed);
    widen_after_sum_.clear();
    // Captured, these launches run at each replay, whose host code queues nothing here:
    // the clock then starts at the wait.
    cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
    THPC_CUDA_CHECK(cudaStreamIsCapturing(compute_stream_, &capturing));
    clock_from_first_launch_ = capturing == cudaStreamCaptureStatusNone;
  }
  // The host waits for an event recorded on the compute stream now, after the pass's wait
  // for the sums (queue_complete's, or the one inside a replayed graph, where done_ is a
  // graph node the host cannot query).
  void await_complete() override {
    if (after_sums_ == nullptr) {
      THPC_CUDA_CHECK(cudaEventCreateWithFlags(&after_sums_, cudaEventDisableTiming));
    }
    THPC_CUDA_CHECK(cudaEventRecord(after_sums_, compute_stream_));
    WaitClock clock = clock_from_first_launch_ ? awaited_clock_ : WaitClock();
    clock_from_first_launch_ = false;  // a replay's pass queues nothing here
    // Poll instead of blocking in cudaEventSynchronize, so that an asynchronous NCCL
    // error or a peer that never arrives is noticed.
    for (;;) {
      const cudaError_t state = cudaEventQuery(after_sums_);
      if (state == cudaSuccess) return;
      if (state != cudaErrorNotReady) THPC_CUDA_CHECK(state);
      fail_if_broken_or_late("gradient all-reduce", async_state(), clock);
    }
  }

 private:
  // Timing event `index` (0: the pass's start, 1: backward done, 2 + 2b and 3 + 2b:
  // bucket b's sum posted and done), created with timing on first use and kept.
  cudaEvent_t timing_event(size_t index) {
    while (timing_events_.size() <= index) {
      cudaEvent_t event = nullptr;
      THPC_CUDA_CHECK(cudaEventCreate(&event));
      timing_events_.push_back(event);
    }
    return timing_events_[index];
  }

  // The bf16 twin of `bucket` in a staging buffer as large as the whole gradient,
  // allocated on first use and kept.
  Tensor bf16_copy_of(Tensor bucket) {
    THPC_CHECK(bucket.dtype == DType::F32,
               "a bf16 sum of a " << dtype_name(bucket.dtype) << " gradient");
    const int apart = tensor_apart(bucket);
    if (apart >= 0) {  // a tensor apart (the lookups' rows): a bf16 buffer of its own
      if (apart_staging_.size() <= static_cast<size_t>(apart)) apart_staging_.resize(apart + 1);
      Tensor& staging = apart_staging_[apart];
      if (staging.numel < bucket.numel) {
        if (staging) backend_.free(staging);
        staging = backend_.alloc(DType::BF16, bucket.numel);
      }
      return staging.slice(0, bucket.numel);
    }
    if (staging_.numel < gradients().numel) {
      if (staging_) backend_.free(staging_);
      staging_ = backend_.alloc(DType::BF16, gradients().numel);
    }
    return staging_.slice(offset_in_gradients(bucket), bucket.numel);
  }

  // NCCL's topology search needs one GPU per rank ("Duplicate GPU detected"): say so in
  // the user's words, on every rank, before NCCL is asked.
  static void refuse_ranks_sharing_a_gpu(const Communicator& comm, int device) {
    char bus_id[64] = {};
    THPC_CUDA_CHECK(cudaDeviceGetPCIBusId(bus_id, static_cast<int>(sizeof bus_id), device));
    const std::string place = host_name() + " GPU " + bus_id;
    const std::vector<std::string> places = comm.all_gather(place);
    const auto [first, second] = first_ranks_sharing_a_place(places);
    if (first < 0) return;
    throw AllRanksError(
        "ranks " + std::to_string(first) + " and " + std::to_string(second) + " drive the same " +
            places[first] + ": NCCL cannot sum gradients between ranks on one GPU. Start "
            "as many ranks per node as it has GPUs (or give each rank its own with "
            "dist.device or CUDA_VISIBLE_DEVICES), or set dist.reducer = mpi, which sums "
            "through host memory and lets ranks share a GPU",
        2);
  }

  // A call on the non-blocking communicator: ncclInProgress is not an error.
  void accept_in_progress(ncclResult_t result, const char* what) {
    if (result == ncclSuccess || result == ncclInProgress) return;
    abort_and_fail(what, nccl_reason(result));
  }

  // Polls until the communicator has finished its last call; fails after dist.timeout_s
  // counted on `clock` (for a pass's launches, the pass's one clock from its first
  // launch: a stop during backward, between two waits, is found at the next poll and
  // left out once).
  void wait_ready(const char* what, WaitClock& clock) {
    for (;;) {
      const ncclResult_t state = async_state();
      if (state == ncclSuccess) return;
      fail_if_broken_or_late(what, state, clock);
    }
  }

  // The communicator's asynchronous state: ncclSuccess, ncclInProgress or an error
  // (ncclInProgress while ncclCommInitRankConfig has not yet given a communicator).
  ncclResult_t async_state() {
    if (nccl_ == nullptr) return ncclInProgress;
    ncclResult_t state = ncclInProgress;
    const ncclResult_t queried = ncclCommGetAsyncError(nccl_, &state);
    return queried != ncclSuccess ? queried : state;
  }

  // One poll of a wait: ends the job when `state` is an error or the wait's clock
  // (which leaves out this process's own pauses: a suspended job) passes dist.timeout_s,
  // else sleeps a moment.
  void fail_if_broken_or_late(const char* what, ncclResult_t state, WaitClock& clock) {
    if (state != ncclSuccess && state != ncclInProgress) abort_and_fail(what, nccl_reason(state));
    if (clock.waited_longer_than(timeout_seconds_)) {
      std::ostringstream reason;
      reason << "not done within dist.timeout_s = " << timeout_seconds_
             << " s: a peer rank is lost or stuck";
      abort_and_fail(what, reason.str());
    }
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }

  std::string nccl_reason(ncclResult_t result) const {
    return std::string(ncclGetErrorString(result)) + " (" + ncclGetLastError(nccl_) + ")";
  }

  [[noreturn]] void abort_and_fail(const char* what, const std::string& reason) {
    if (nccl_ != nullptr) ncclCommAbort(nccl_);
    nccl_ = nullptr;
    THPC_FAIL("NCCL " << what << " failed on " << process_identity() << ": " << reason);
  }

  Backend& backend_;
  double timeout_seconds_;
  bool bf16_;
  Tensor staging_;  // bf16: the gradient's bf16 copy that NCCL sums
  std::vector<Tensor> apart_staging_;  // bf16: the tensors apart's copies
  std::vector<std::pair<Tensor, Tensor>> widen_after_sum_;  // (fp32 bucket, its bf16 sum)
  WaitClock pass_clock_;  // made at a pass's first launch: its sums' dist.timeout_s
  ncclComm_t nccl_ = nullptr;
  cudaStream_t compute_stream_ = nullptr, nccl_stream_ = nullptr;
  cudaEvent_t done_ = nullptr;
  // queue_complete's: the pass's dist.timeout_s clock, and whether the host queued the
  // sums itself (false once they were captured: a replay starts a clock at the wait).
  WaitClock awaited_clock_;
  bool clock_from_first_launch_ = false;
  cudaEvent_t after_sums_ = nullptr;  // await_complete's, on the compute stream
  std::vector<cudaEvent_t> ready_events_;
  std::vector<cudaEvent_t> timing_events_;  // dist.log_buckets
  size_t next_event_ = 0;
};

}  // namespace
#endif  // THPC_HAVE_CUDA

std::unique_ptr<GradientReducer> make_nccl_gradient_reducer(const Communicator& comm,
                                                            Backend& backend,
                                                            int64_t bucket_bytes,
                                                            double timeout_seconds,
                                                            bool bf16) {
#if THPC_HAVE_CUDA
  return std::make_unique<NcclGradientReducer>(comm, backend, bucket_bytes, timeout_seconds,
                                               bf16);
#else
  (void)bf16;
  (void)comm;
  (void)backend;
  (void)bucket_bytes;
  (void)timeout_seconds;
  THPC_FAIL("NCCL gradient sums need a CUDA build (this one is CPU-only)");
#endif
}

}  // namespace thpc
