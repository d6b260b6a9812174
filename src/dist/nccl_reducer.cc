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
// ends this rank with an error instead of a silent hang.
#include "dist/gradient_reducer.h"

#include "common/error.h"

#if THPC_HAVE_CUDA
#include <cuda_runtime.h>
#include <nccl.h>

#include <chrono>
#include <thread>
#include <vector>

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
                      double timeout_seconds)
      : GradientReducer(bucket_bytes), timeout_seconds_(timeout_seconds) {
    THPC_CHECK(!backend.host_memory() && backend.native_stream() != nullptr,
               "NCCL sums need a GPU backend, not " << backend.name());
    compute_stream_ = static_cast<cudaStream_t>(backend.native_stream());
    THPC_CUDA_CHECK(cudaSetDevice(backend.device()));
    ncclUniqueId id{};
    if (comm.is_root()) THPC_NCCL_CHECK(ncclGetUniqueId(&id));
    comm.broadcast_bytes_from_root(&id, static_cast<int>(sizeof(id)));
    THPC_NCCL_CHECK(ncclCommInitRank(&nccl_, comm.size(), id, comm.rank()));
    THPC_CUDA_CHECK(cudaStreamCreateWithFlags(&nccl_stream_, cudaStreamNonBlocking));
    THPC_CUDA_CHECK(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming));
  }

  ~NcclGradientReducer() override {
    for (cudaEvent_t event : ready_events_) cudaEventDestroy(event);
    if (done_) cudaEventDestroy(done_);
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
    cudaEvent_t ready = ready_events_[next_event_++];
    THPC_CUDA_CHECK(cudaEventRecord(ready, compute_stream_));
    THPC_CUDA_CHECK(cudaStreamWaitEvent(nccl_stream_, ready, 0));
    THPC_NCCL_CHECK(ncclAllReduce(bucket.data, bucket.data, static_cast<size_t>(bucket.numel),
                                  nccl_type(bucket.dtype), ncclSum, nccl_, nccl_stream_));
  }

  void complete() override {
    next_event_ = 0;
    THPC_CUDA_CHECK(cudaEventRecord(done_, nccl_stream_));
    THPC_CUDA_CHECK(cudaStreamWaitEvent(compute_stream_, done_, 0));
    // Poll instead of blocking in cudaEventSynchronize, so that an asynchronous NCCL
    // error or a peer that never arrives is noticed.
    const auto started = std::chrono::steady_clock::now();
    for (;;) {
      const cudaError_t state = cudaEventQuery(done_);
      if (state == cudaSuccess) return;
      if (state != cudaErrorNotReady) THPC_CUDA_CHECK(state);
      ncclResult_t async = ncclSuccess;
      THPC_NCCL_CHECK(ncclCommGetAsyncError(nccl_, &async));
      if (async != ncclSuccess && async != ncclInProgress) {
        ncclCommAbort(nccl_);
        nccl_ = nullptr;
        THPC_FAIL("NCCL gradient all-reduce failed on " << process_identity() << ": "
                  << ncclGetErrorString(async) << " (" << ncclGetLastError(nullptr) << ")");
      }
      const double waited = std::chrono::duration<double>(
          std::chrono::steady_clock::now() - started).count();
      if (waited > timeout_seconds_) {
        ncclCommAbort(nccl_);
        nccl_ = nullptr;
        THPC_FAIL("NCCL gradient all-reduce on " << process_identity()
                  << " did not complete within dist.timeout_s = " << timeout_seconds_
                  << " s: a peer rank is lost or stuck");
      }
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

 private:
  double timeout_seconds_;
  ncclComm_t nccl_ = nullptr;
  cudaStream_t compute_stream_ = nullptr, nccl_stream_ = nullptr;
  cudaEvent_t done_ = nullptr;
  std::vector<cudaEvent_t> ready_events_;
  size_t next_event_ = 0;
};

}  // namespace
#endif  // THPC_HAVE_CUDA

std::unique_ptr<GradientReducer> make_nccl_gradient_reducer(const Communicator& comm,
                                                            Backend& backend,
                                                            int64_t bucket_bytes,
                                                            double timeout_seconds) {
#if THPC_HAVE_CUDA
  return std::make_unique<NcclGradientReducer>(comm, backend, bucket_bytes, timeout_seconds);
#else
  (void)comm;
  (void)backend;
  (void)bucket_bytes;
  (void)timeout_seconds;
  THPC_FAIL("NCCL gradient sums need a CUDA build (this one is CPU-only)");
#endif
}

}  // namespace thpc
