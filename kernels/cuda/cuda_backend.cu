// The CUDA backend (see cuda_backend.h): memory, transfers, and each op's dispatch to
// its twin in kernels/cuda with the dtypes checked.
#include "kernels/cuda/cuda_backend.h"

#include <algorithm>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/error.h"
#include "kernels/capture_free_lock.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/twin_call.h"

namespace thpc {
namespace {

// The origin of every EventWorkClock on `device` (WorkClock::seconds_since_origin): one
// event per device, recorded on the first such clock's stream and waited for before any
// mark can be compared with it. Kept for the process's life (destroying events at exit
// can meet a driver already shut down).
cudaEvent_t device_origin_event(int device, cudaStream_t stream) {
  static std::mutex mutex;
  static std::map<int, cudaEvent_t>* origins = new std::map<int, cudaEvent_t>();
  const std::lock_guard<std::mutex> lock(mutex);
  const auto found = origins->find(device);
  if (found != origins->end()) return found->second;
  cudaEvent_t origin = nullptr;
  THPC_CUDA_CHECK(cudaEventCreate(&origin));
  THPC_CUDA_CHECK(cudaEventRecord(origin, stream));
  THPC_CUDA_CHECK(cudaEventSynchronize(origin));
  origins->emplace(device, origin);
  return origin;
}

// The WorkClock of a CUDA backend: each mark is an event recorded on the backend's
// stream, so marking adds no synchronisation; reading a time waits for its events.
// Events are created as marks need them and kept for reuse after clear().
class EventWorkClock final : public WorkClock {
 public:
  EventWorkClock(cudaStream_t stream, int device)
      : stream_(stream), origin_(device_origin_event(device, stream)) {}
  ~EventWorkClock() override {
    for (cudaEvent_t event : events_) cudaEventDestroy(event);  // no throw in a destructor
  }
  int mark() override {
    if (used_ == events_.size()) {
      cudaEvent_t event = nullptr;
      THPC_CUDA_CHECK(cudaEventCreate(&event));
      events_.push_back(event);
    }
    THPC_CUDA_CHECK(cudaEventRecord(events_[used_], stream_));
    return static_cast<int>(used_++);
  }
  double seconds_between(int from, int to) override {
    THPC_CHECK(from >= 0 && to >= 0 && static_cast<size_t>(from) < used_ &&
                   static_cast<size_t>(to) < used_,
               "marks " << from << " and " << to << " of " << used_);
    THPC_CUDA_CHECK(cudaEventSynchronize(events_[to]));
    THPC_CUDA_CHECK(cudaEventSynchronize(events_[from]));
    float milliseconds = 0.0f;
    THPC_CUDA_CHECK(cudaEventElapsedTime(&milliseconds, events_[from], events_[to]));
    return 1e-3 * milliseconds;
  }
  // Events on two streams of one device compare (cudaEventElapsedTime takes any two of
  // its events). The time comes as float milliseconds: to ~1 us at 10 s from the origin.
  double seconds_since_origin(int mark) override {
    THPC_CHECK(mark >= 0 && static_cast<size_t>(mark) < used_, "mark " << mark << " of " << used_);
    THPC_CUDA_CHECK(cudaEventSynchronize(events_[mark]));
    float milliseconds = 0.0f;
    THPC_CUDA_CHECK(cudaEventElapsedTime(&milliseconds, origin_, events_[mark]));
    return 1e-3 * milliseconds;
  }
  void clear() override { used_ = 0; }

 private:
  cudaStream_t stream_;
  cudaEvent_t origin_;
  std::vector<cudaEvent_t> events_;
  size_t used_ = 0;
};

// A CUDA graph of work captured on a backend's stream (Backend::capture), replayed there
// while no device memory has been freed since its capture (cuda::Context::frees).
class CudaGraphWork final : public CapturedWork {
 public:
  CudaGraphWork(cudaGraphExec_t graph, cudaStream_t stream, const cuda::Context& context)
      : graph_(graph), stream_(stream), context_(context), frees_at_capture_(context.frees()) {}
  ~CudaGraphWork() override { cudaGraphExecDestroy(graph_); }  // no throw in a destructor
  bool replay() override {
    if (context_.frees() != frees_at_capture_) return false;
    THPC_CUDA_CHECK(cudaGraphLaunch(graph_, stream_));
    return true;
  }

 private:
  cudaGraphExec_t graph_;
  cudaStream_t stream_;
  const cuda::Context& context_;
  uint64_t frees_at_capture_;
};

// The GPU's HostStaging (the former candidate pinned_snapshot): page-locked host memory, so
// that a copy from the device is a DMA queued on the backend's stream, not a host copy
// through the driver's bounce buffers, and the host does not wait for it. On the backend's
// own stream, each copy holds its tensor as the work queued before it left it, and the work
// queued after it (the next step's optimizer among it) cannot change the tensor first: no
// second stream, no fence to forget. The device spends the DMA's time on it: ~15 ms for a
// base snapshot (757 MB at PCIe 5's ~50 GB/s), half a step, every checkpoint.minutes. An
// event after the last copy tells the reader, on any thread, when all have landed.
class PinnedHostStaging final : public HostStaging {
 public:
  // Null when the pinned memory cannot be had (the node's limit on locked memory): the
  // caller then stages through pageable memory.
  static std::unique_ptr<PinnedHostStaging> make(cudaStream_t stream, int device,
                                                 int64_t floats) {
    void* host = nullptr;
    const size_t bytes = sizeof(float) * static_cast<size_t>(floats > 0 ? floats : 1);
    if (cuda::allocate_pinned_memory(&host, bytes) != cudaSuccess) {
      cudaGetLastError();  // not the next call's error
      return nullptr;
    }
    cudaEvent_t copied = nullptr;
    if (cudaEventCreateWithFlags(&copied, cudaEventDisableTiming) != cudaSuccess) {
      cudaGetLastError();
      cuda::free_pinned_memory(host);
      return nullptr;
    }
    return std::unique_ptr<PinnedHostStaging>(
        new PinnedHostStaging(stream, device, static_cast<float*>(host), floats, copied));
  }
  ~PinnedHostStaging() override {  // no throw in a destructor
    cudaEventSynchronize(copied_);  // no DMA into freed memory
    cudaEventDestroy(copied_);
    cuda::free_pinned_memory(host_);
  }
  int64_t floats() const override { return floats_; }
  void queue_download(int64_t offset, Tensor src) override {
    check_copy(offset, src);
    THPC_CUDA_CHECK(cudaMemcpyAsync(host_ + offset, src.data,
                                    sizeof(float) * static_cast<size_t>(src.numel),
                                    cudaMemcpyDeviceToHost, stream_));
    THPC_CUDA_CHECK(cudaEventRecord(copied_, stream_));
  }
  const float* wait() override {
    THPC_CUDA_CHECK(cudaSetDevice(device_));  // the writer's thread starts on device 0
    THPC_CUDA_CHECK(cudaEventSynchronize(copied_));
    return host_;
  }

 private:
  PinnedHostStaging(cudaStream_t stream, int device, float* host, int64_t floats,
                    cudaEvent_t copied)
      : stream_(stream), device_(device), host_(host), floats_(floats), copied_(copied) {}

  cudaStream_t stream_;
  int device_;
  float* host_;
  int64_t floats_;
  cudaEvent_t copied_;  // recorded after each queued copy: the last one's landing
};

// T: the activation (compute) type, float or bf16. Parameters are always fp32.
// The ops that also move rows of fp32 (parameter-dtype) tensors in the bf16 backend: the
// tied embedding's lookup rows summed apart (dist.embedding_sum = per_use, model/
// transformer.h) are gathered from an fp32 table by copy_rows and, summed over ranks,
// added back by embedding_backward with fp32 rows as d_out.
constexpr bool takes_param_dtype_rows(OpId op) {
  return op == OpId::copy_rows || op == OpId::embedding_backward;
}

// Whether this call of such an op moves fp32 rows: copy_rows' destination, or
// embedding_backward's d_out (its third argument), is fp32.
template <OpId op, typename... Args>
bool rows_in_param_dtype(const Args&... args) {
  const auto arguments = std::forward_as_tuple(args...);
  if constexpr (op == OpId::copy_rows) {
    return std::get<0>(arguments).dtype == DType::F32;
  } else if constexpr (op == OpId::embedding_backward) {
    return std::get<2>(arguments).dtype == DType::F32;
  } else {
    return false;
  }
}

template <typename T>
class CudaBackend final : public Backend {
 public:
  CudaBackend(int device, const CudaKernelChoice& kernels) : context_(device, kernels) {
    cudaDeviceProp prop{};
    THPC_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
    device_name_ = prop.name;
  }
  ~CudaBackend() override {
    if (staged_copy_done_ != nullptr) {
      cudaEventSynchronize(staged_copy_done_);
      cudaEventDestroy(staged_copy_done_);
    }
    if (staging_ != nullptr) cuda::free_pinned_memory(staging_);
  }

  std::string name() const override {
    return std::string("cuda-") + dtype_name(dtype_of<T>()) + " (" + device_name_ + ")";
  }
  bool host_memory() const override { return false; }
  DType param_dtype() const override { return DType::F32; }
  DType compute_dtype() const override { return dtype_of<T>(); }

  // ---- memory ----
  Tensor alloc(DType dtype, int64_t numel) override {
    THPC_CHECK(dtype == DType::F32 || dtype == DType::BF16,
               "the CUDA backend holds fp32 and bf16 tensors, not " << dtype_name(dtype));
    THPC_CHECK(numel >= 0, "negative size " << numel);
    Tensor t;
    t.dtype = dtype;
    t.numel = numel;
    const size_t bytes = static_cast<size_t>(numel > 0 ? numel : 1) * dtype_size(dtype);
    const cudaError_t status = cudaMalloc(&t.data, bytes);
    if (status == cudaSuccess) count_allocation(t.data, bytes);
    if (status != cudaSuccess) {
      cudaGetLastError();
      size_t free_bytes = 0, total_bytes = 0;
      cudaMemGetInfo(&free_bytes, &total_bytes);
      THPC_FAIL(out_of_memory_message(
          "cannot allocate " + std::to_string(bytes) + " bytes of GPU memory on " +
          device_name_ + " (" + std::to_string(free_bytes >> 20) + " MiB of " +
          std::to_string(total_bytes >> 20) + " MiB free)"));
    }
    return t;
  }
  void free(Tensor& tensor) override {
    if (tensor.data) {
      // No throw: used on cleanup paths. A failure's error is cleared, or the next
      // launch's check on this thread would report it as that kernel's.
      if (cuda::free_device_memory(tensor.data) != cudaSuccess) cudaGetLastError();
      count_free(tensor.data);
    }
    tensor = Tensor{};
  }
  int32_t* alloc_ids(int64_t count) override {
    void* ids = nullptr;
    const size_t bytes = sizeof(int32_t) * static_cast<size_t>(count > 0 ? count : 1);
    THPC_CUDA_CHECK(cudaMalloc(&ids, bytes));
    count_allocation(ids, bytes);
    return static_cast<int32_t*>(ids);
  }
  void free_ids(int32_t*& ids) override {
    if (ids) {
      if (cuda::free_device_memory(ids) != cudaSuccess) cudaGetLastError();  // as free()'s
      count_free(ids);
    }
    ids = nullptr;
  }
  int64_t peak_memory_bytes() const override { return context_.peak_allocated_bytes(); }
  std::unique_ptr<WorkClock> make_work_clock() override {
    return std::make_unique<EventWorkClock>(stream(), context_.device());
  }
  // Pinned memory, copied into on the stream (PinnedHostStaging; the former candidate
  // pinned_snapshot, the default since the H200 window of 2026-12-04: a base checkpoint's
  // copy 0.09 -> 0.00 s); where pinned memory is refused, the synchronous downloads of
  // every backend.
  std::unique_ptr<HostStaging> make_host_staging(int64_t floats) override {
    if (auto pinned = PinnedHostStaging::make(stream(), context_.device(), floats)) {
      return pinned;
    }
    return Backend::make_host_staging(floats);
  }
  void zero(Tensor t) override {
    THPC_CUDA_CHECK(cudaMemsetAsync(t.data, 0, bytes(t), stream()));
  }
  void copy(Tensor dst, Tensor src) override {
    THPC_CHECK(dst.numel == src.numel, "copy of " << src.numel << " into " << dst.numel);
    cuda::convert(dst.data, dst.dtype, src.data, src.dtype, src.numel, stream());
  }
  // Host buffers are pageable: the copies are synchronous with respect to the host, which
  // is what a caller that reuses its buffer right away expects.
  void upload(Tensor dst, const void* host) override {
    THPC_CUDA_CHECK(cudaMemcpyAsync(dst.data, host, bytes(dst), cudaMemcpyHostToDevice, stream()));
    THPC_CUDA_CHECK(cudaStreamSynchronize(stream()));
  }
  void download(void* host, Tensor src) override {
    THPC_CUDA_CHECK(cudaMemcpyAsync(host, src.data, bytes(src), cudaMemcpyDeviceToHost, stream()));
    THPC_CUDA_CHECK(cudaStreamSynchronize(stream()));
  }
  // Ids are uploaded at each step (a training batch, a decoding step's tokens). From
  // pageable memory the copy would be a copy and a wait for the stream: one host gap a
  // step (issue 51 measured 0.41 ms of them at every batch size). So the ids go through a
  // pinned staging buffer and the copy is queued without a wait: the caller may reuse
  // `host` at once (it was copied into the staging buffer), and the staging buffer is
  // reused only after the previous copy from it has run (an event, long passed by the
  // next upload). The former candidate async_upload, default since the H200 window of
  // 2026-11-29.
  void upload_ids(int32_t* dst, const int32_t* host, int64_t count) override {
    const size_t size = sizeof(int32_t) * static_cast<size_t>(count);
    if (staged_copy_done_ == nullptr) {
      THPC_CUDA_CHECK(cudaEventCreateWithFlags(&staged_copy_done_, cudaEventDisableTiming));
    } else {
      THPC_CUDA_CHECK(cudaEventSynchronize(staged_copy_done_));
    }
    if (staging_bytes_ < size) {
      if (staging_ != nullptr) THPC_CUDA_CHECK(cuda::free_pinned_memory(staging_));
      staging_ = nullptr;
      staging_bytes_ = std::max(size, 2 * staging_bytes_);
      THPC_CUDA_CHECK(cuda::allocate_pinned_memory(&staging_, staging_bytes_));
    }
    std::memcpy(staging_, host, size);
    THPC_CUDA_CHECK(cudaMemcpyAsync(dst, staging_, size, cudaMemcpyHostToDevice, stream()));
    THPC_CUDA_CHECK(cudaEventRecord(staged_copy_done_, stream()));
  }
  void download_ids(int32_t* host, const int32_t* src, int64_t count) override {
    THPC_CUDA_CHECK(cudaMemcpyAsync(host, src, sizeof(int32_t) * static_cast<size_t>(count),
                                    cudaMemcpyDeviceToHost, stream()));
    THPC_CUDA_CHECK(cudaStreamSynchronize(stream()));
  }
  void synchronize() override { THPC_CUDA_CHECK(cudaStreamSynchronize(stream())); }
  void* native_stream() const override { return stream(); }
  // Yes since 2026-11-26: on an H100 the fused kernels' twins (CudaAddNorm.*,
  // CudaLinearRelu.*, CudaReluBiasBackward.*, fp32 and bf16), the whole-model check
  // (CudaTraining.Fp32ThreeStepsWithFusedOpsMatchTheCpu) and compute-sanitizer memcheck
  // of the twins passed, and the base step took 42.4 ms instead of 57.8 (bench/RESULTS.md).
  bool fused_ops_by_default() const override { return true; }
  // With the candidate relu_masks: the FFN keeps cuBLASLt's ReLU bit-mask (linear.cu).
  int64_t relu_mask_words(int rows, int n) const override {
    return context_.candidate_kernel(kReluMasks) ? cuda::relu_mask_words(rows, n) : 0;
  }
  int device() const override { return context_.device(); }
  void use_on_this_thread() override { THPC_CUDA_CHECK(cudaSetDevice(context_.device())); }
  cuda::Context& context() { return context_; }

  // Training passes with the candidate step_graphs; decoding steps with it or with
  // CudaKernelChoice::capture_decoding_steps (their half of it, run on a GPU). Relaxed
  // mode: an arena that grows inside the work may cudaMalloc (the block outlives the
  // graph's replays: only a free ends them). Anything that waits or frees inside the work
  // fails it (its CUDA error, or the count of frees moved): the capture is ended and
  // dropped, and the caller queues the work uncaptured. With the candidate worker_graphs
  // (several decoding workers capturing at once) the capture holds a
  // ConcurrentCaptureScope, so that another worker's free, which synchronises the device,
  // waits for its end instead of invalidating it (kernels/capture_free_lock.h).
  bool can_capture(CaptureUse use) const override {
    return context_.candidate_kernel(kStepGraphs) ||
           (use == CaptureUse::kDecodingStep && context_.captures_decoding_steps());
  }
  std::unique_ptr<CapturedWork> capture(const std::function<void()>& queue_work) override {
    if (!can_capture(CaptureUse::kTrainingPass) && !can_capture(CaptureUse::kDecodingStep)) {
      return nullptr;
    }
    const uint64_t frees_before = context_.frees();
    const ConcurrentCaptureScope others_frees_wait(context_.candidate_kernel(kWorkerGraphs));
    THPC_CUDA_CHECK(cudaStreamBeginCapture(stream(), cudaStreamCaptureModeRelaxed));
    bool queued = true;
    try {
      queue_work();
    } catch (...) {
      // The capture is ended below whatever was thrown (the stream must leave capture
      // mode); the uncaptured run that follows meets the same error, if it is lasting.
      queued = false;
    }
    cudaGraph_t graph = nullptr;
    const cudaError_t ended = cudaStreamEndCapture(stream(), &graph);
    cudaGraphExec_t exec = nullptr;
    const bool captured = queued && ended == cudaSuccess && graph != nullptr &&
                          context_.frees() == frees_before &&
                          cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess;
    if (graph != nullptr) cudaGraphDestroy(graph);
    if (!captured) {
      cudaGetLastError();  // a failed capture's error is not the next call's
      return nullptr;
    }
    return std::make_unique<CudaGraphWork>(exec, stream(), context_);
  }

  // ---- ops: each entry of kernels/op_list.h calls its twin cuda::NAME<T> with the
  // Context first, on this backend's tensors, their dtypes checked (kernels/twin_call.h).
  // Two ops also move rows of parameter-dtype (fp32) tensors in the bf16 backend
  // (rows_in_param_dtype): their fp32 twins, which the fp32 backend runs, do that.
#define THPC_OP(ret, name, params, args)                                                     \
  ret name params override {                                                                \
    if constexpr (std::is_same_v<T, cuda::bf16> && takes_param_dtype_rows(OpId::name)) {     \
      if (rows_in_param_dtype<OpId::name>(THPC_UNPAREN args)) {                              \
        return call_twin<OpId::name>(*this, with_context(cuda::name<float>), THPC_UNPAREN args); \
      }                                                                                     \
    }                                                                                       \
    return call_twin<OpId::name>(*this, with_context(cuda::name<T>), THPC_UNPAREN args);      \
  }
#include "kernels/op_list.h"
#undef THPC_OP

 private:
  cudaStream_t stream() const { return context_.stream(); }
  static size_t bytes(const Tensor& t) {
    return static_cast<size_t>(t.numel) * dtype_size(t.dtype);
  }
  // A twin with this backend's Context bound as its first argument.
  template <typename Twin>
  auto with_context(Twin& twin) {
    return [this, &twin](auto&&... args) -> decltype(auto) {
      return twin(context_, std::forward<decltype(args)>(args)...);
    };
  }

  // Host bookkeeping of the device memory this backend holds (peak_memory_bytes): each
  // allocation's size by its pointer, so that a free knows what it returns.
  void count_allocation(void* pointer, size_t bytes) {
    allocation_bytes_[pointer] = bytes;
    context_.count_allocation(bytes);
  }
  void count_free(void* pointer) {
    const auto found = allocation_bytes_.find(pointer);
    if (found == allocation_bytes_.end()) return;
    context_.count_free(found->second);
    allocation_bytes_.erase(found);
  }

  cuda::Context context_;
  std::string device_name_;
  std::unordered_map<const void*, size_t> allocation_bytes_;
  // upload_ids's pinned staging buffer and the event of the last copy from it.
  void* staging_ = nullptr;
  size_t staging_bytes_ = 0;
  cudaEvent_t staged_copy_done_ = nullptr;
};

}  // namespace

namespace cuda {

Context* context_of(Backend& backend) {
  if (auto* fp32 = dynamic_cast<CudaBackend<float>*>(&backend)) return &fp32->context();
  if (auto* half = dynamic_cast<CudaBackend<bf16>*>(&backend)) return &half->context();
  return nullptr;
}

}  // namespace cuda

std::unique_ptr<Backend> make_cuda_backend(int device, DType compute_dtype,
                                           const CudaKernelChoice& kernels) {
  switch (compute_dtype) {
    case DType::F32: return std::make_unique<CudaBackend<float>>(device, kernels);
    case DType::BF16: return std::make_unique<CudaBackend<cuda::bf16>>(device, kernels);
    default:
      THPC_FAIL("the CUDA backend computes in bf16 or fp32, not " << dtype_name(compute_dtype));
  }
}

}  // namespace thpc
