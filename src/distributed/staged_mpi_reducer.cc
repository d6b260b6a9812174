// The MPI transport on the GPU (dist.reducer = mpi; see gradient_reducer.h): several ranks
// can share one GPU, which NCCL refuses, so a single-GPU machine runs every part of a
// multi-rank job but NCCL's own transport.
//
// A bucket's way: when backward declares it final, an event is recorded on the compute
// stream; the reducer's copy stream waits for it and copies the bucket into a pinned host
// mirror of the gradient (cudaMemcpyAsync, so the compute stream carries on with the
// layers beneath). Each time backward reports progress the buckets whose copies have
// landed are posted to MPI in bucket order (every rank posts the same sums in the same
// order), and the posted sums are moved on. At the end of backward the remaining copies
// are awaited and posted, every sum is awaited, and the sums are copied back on the
// compute stream, where the optimizer reads them after.
//
// The pinned mirror is reused every step: the next step's copy into it is ordered after
// this step's copies back (the copy stream waits for an event of the compute stream
// recorded later).
#include "distributed/gradient_reducer.h"

#include "common/error.h"

#if THPC_HAVE_CUDA
#include <cuda_runtime.h>

#include <deque>
#include <vector>

#include "distributed/mpi_bucket_sums.h"
#include "kernels/cuda/cuda_check.h"
#endif

namespace thpc {

#if THPC_HAVE_CUDA
namespace {

class StagedMpiGradientReducer final : public GradientReducer {
 public:
  StagedMpiGradientReducer(Backend& backend, int64_t bucket_bytes, double timeout_seconds,
                           bool bf16)
      : GradientReducer(bucket_bytes), sums_(bf16, timeout_seconds) {
    THPC_CHECK(!backend.host_memory() && backend.native_stream() != nullptr,
               "a staged MPI sum needs a GPU backend, not " << backend.name());
    compute_stream_ = static_cast<cudaStream_t>(backend.native_stream());
    THPC_CUDA_CHECK(cudaSetDevice(backend.device()));
    THPC_CUDA_CHECK(cudaStreamCreateWithFlags(&copy_stream_, cudaStreamNonBlocking));
  }

  ~StagedMpiGradientReducer() override {
    for (cudaEvent_t event : events_) cudaEventDestroy(event);
    if (copy_stream_) cudaStreamDestroy(copy_stream_);
    if (mirror_) cudaFreeHost(mirror_);
    for (const PinnedBuffer& buffer : apart_mirrors_) cudaFreeHost(buffer.data);
  }

 protected:
  void start(Tensor bucket) override {
    THPC_CHECK(bucket.dtype == DType::F32,
               "a staged MPI sum of a " << dtype_name(bucket.dtype) << " gradient");
    const int64_t elements = gradients().numel;
    if (mirror_elements_ < elements) {
      if (mirror_) THPC_CUDA_CHECK(cudaFreeHost(mirror_));
      mirror_ = nullptr;
      THPC_CUDA_CHECK(cudaMallocHost(&mirror_, sizeof(float) * static_cast<size_t>(elements)));
      mirror_elements_ = elements;
    }
    const int apart = tensor_apart(bucket);
    float* host = apart < 0 ? static_cast<float*>(mirror_) + offset_in_gradients(bucket)
                            : apart_mirror(apart, bucket.numel);
    Staged staged{bucket, Tensor{host, DType::F32, bucket.numel}, next_event(), next_event()};
    THPC_CUDA_CHECK(cudaEventRecord(staged.final_on_device, compute_stream_));
    THPC_CUDA_CHECK(cudaStreamWaitEvent(copy_stream_, staged.final_on_device, 0));
    THPC_CUDA_CHECK(cudaMemcpyAsync(staged.host.data, bucket.data, bytes(bucket),
                                    cudaMemcpyDeviceToHost, copy_stream_));
    THPC_CUDA_CHECK(cudaEventRecord(staged.on_host, copy_stream_));
    copying_.push_back(staged);
  }

  void progress() override {
    while (!copying_.empty()) {
      const cudaError_t state = cudaEventQuery(copying_.front().on_host);
      if (state == cudaErrorNotReady) break;
      THPC_CUDA_CHECK(state);
      post(copying_.front());
    }
    // Sums are posted in the buckets' order: a sum's place is its bucket's.
    for (const int index : sums_.progress()) bucket_done(static_cast<size_t>(index));
  }

  void await_complete() override {
    while (!copying_.empty()) {
      THPC_CUDA_CHECK(cudaEventSynchronize(copying_.front().on_host));
      post(copying_.front());
    }
    sums_.complete();
    for (const Staged& staged : summing_) {
      THPC_CUDA_CHECK(cudaMemcpyAsync(staged.device.data, staged.host.data, bytes(staged.device),
                                      cudaMemcpyHostToDevice, compute_stream_));
    }
    summing_.clear();
    next_event_ = 0;
  }

 private:
  struct Staged {
    Tensor device;                  // the bucket in the GPU's gradient
    Tensor host;                    // its place in the pinned mirror
    cudaEvent_t final_on_device;    // recorded on the compute stream when it is final
    cudaEvent_t on_host;            // recorded on the copy stream when the copy landed
  };

  static size_t bytes(Tensor tensor) { return sizeof(float) * static_cast<size_t>(tensor.numel); }

  // The pinned host copy of tensor apart `index` (the embedding lookups' rows, summed
  // after the gradient): one buffer per index, grown when a pass's tensor is larger, kept.
  // (Only between passes: a buffer in flight is never the one grown.)
  float* apart_mirror(int index, int64_t elements) {
    if (apart_mirrors_.size() <= static_cast<size_t>(index)) apart_mirrors_.resize(index + 1);
    PinnedBuffer& buffer = apart_mirrors_[index];
    if (buffer.elements < elements) {
      if (buffer.data) THPC_CUDA_CHECK(cudaFreeHost(buffer.data));
      buffer.data = nullptr;
      THPC_CUDA_CHECK(cudaMallocHost(&buffer.data, sizeof(float) * static_cast<size_t>(elements)));
      buffer.elements = elements;
    }
    return static_cast<float*>(buffer.data);
  }
  struct PinnedBuffer {
    void* data = nullptr;
    int64_t elements = 0;
  };

  // Events are created once and reused every step (two per bucket).
  cudaEvent_t next_event() {
    if (next_event_ == events_.size()) {
      cudaEvent_t event = nullptr;
      THPC_CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
      events_.push_back(event);
    }
    return events_[next_event_++];
  }

  void post(const Staged& staged) {
    sums_.start(staged.host);
    summing_.push_back(staged);
    copying_.pop_front();
  }

  MpiBucketSums sums_;
  cudaStream_t compute_stream_ = nullptr, copy_stream_ = nullptr;
  void* mirror_ = nullptr;
  int64_t mirror_elements_ = 0;
  std::vector<PinnedBuffer> apart_mirrors_;  // the tensors apart's pinned copies
  std::deque<Staged> copying_;   // copies to the host not yet seen to have landed
  std::vector<Staged> summing_;  // posted to MPI
  std::vector<cudaEvent_t> events_;
  size_t next_event_ = 0;
};

}  // namespace
#endif  // THPC_HAVE_CUDA

std::unique_ptr<GradientReducer> make_staged_mpi_gradient_reducer(const Communicator& comm,
                                                                  Backend& backend,
                                                                  int64_t bucket_bytes,
                                                                  double timeout_seconds,
                                                                  bool bf16) {
  THPC_CHECK(comm.size() > 1, "an MPI gradient sum over " << comm.size() << " rank");
#if THPC_HAVE_CUDA
  return std::make_unique<StagedMpiGradientReducer>(backend, bucket_bytes, timeout_seconds,
                                                    bf16);
#else
  (void)backend;
  (void)bucket_bytes;
  (void)timeout_seconds;
  (void)bf16;
  THPC_FAIL("staged MPI gradient sums on a GPU need a CUDA build (this one is CPU-only)");
#endif
}

}  // namespace thpc
