// The per-backend CUDA context: stream, cuBLAS/cuBLASLt handles, workspaces.
#include "kernels/capture_free_lock.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_ops.h"

namespace thpc {

std::string cublas_status_text(cublasStatus_t status) {
  return std::string(cublasGetStatusName(status)) + " (" + cublasGetStatusString(status) + ")";
}

namespace cuda {

Context::Context(int device, const CudaKernelChoice& kernels)
    : device_(device), kernels_(kernels) {
  // Decoding workers that capture at once: from now on every free waits for the others'
  // captures (kernels/capture_free_lock.h), set before this Context's thread frees or
  // captures anything.
  if (candidate_kernel(kWorkerGraphs)) use_capture_free_lock();
  THPC_CUDA_CHECK(cudaSetDevice(device));
  THPC_CUDA_CHECK(
      cudaDeviceGetAttribute(&multiprocessors_, cudaDevAttrMultiProcessorCount, device));
  THPC_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  THPC_CUBLAS_CHECK(cublasCreate(&blas_));
  THPC_CUBLAS_CHECK(cublasSetStream(blas_, stream_));
  THPC_CUBLAS_CHECK(cublasLtCreate(&lt_));
  THPC_CUDA_CHECK(cudaMalloc(&lt_workspace_, kLtWorkspaceBytes));
  count_allocation(kLtWorkspaceBytes);
  // cuBLAS keeps its own workspace per stream; give it the same one so that the
  // legacy API (batched attention GEMMs) allocates nothing during a step.
  THPC_CUBLAS_CHECK(cublasSetWorkspace(blas_, lt_workspace_, kLtWorkspaceBytes));
  if (candidate_kernel(kWeightGradsBeside)) {
    THPC_CUDA_CHECK(cudaStreamCreateWithFlags(&side_stream_, cudaStreamNonBlocking));
    THPC_CUDA_CHECK(cudaEventCreateWithFlags(&fork_event_, cudaEventDisableTiming));
    THPC_CUDA_CHECK(cudaEventCreateWithFlags(&join_event_, cudaEventDisableTiming));
    THPC_CUDA_CHECK(cudaMalloc(&side_lt_workspace_, kLtWorkspaceBytes));
    count_allocation(kLtWorkspaceBytes);
  }
}

Context::~Context() {
  // Destructors must not throw: errors here (a dead device) are ignored.
  if (stream_) cudaStreamSynchronize(stream_);
  if (side_stream_) cudaStreamSynchronize(side_stream_);
  if (side_lt_workspace_) free_device_memory(side_lt_workspace_);
  if (side_sums_) free_device_memory(side_sums_);
  if (join_event_) cudaEventDestroy(join_event_);
  if (fork_event_) cudaEventDestroy(fork_event_);
  if (side_stream_) cudaStreamDestroy(side_stream_);
  if (pinned_) free_pinned_memory(pinned_);
  for (void* kept : kept_) {
    if (kept) free_device_memory(kept);
  }
  if (scratch_) free_device_memory(scratch_);
  if (lt_workspace_) free_device_memory(lt_workspace_);
  if (lt_) cublasLtDestroy(lt_);
  if (blas_) cublasDestroy(blas_);
  if (stream_) cudaStreamDestroy(stream_);
}

namespace {

// `release` (cudaFree, cudaFreeHost) of `pointer` behind a FreeGate; on a thread capturing
// with worker_graphs it waits for the capture's end (defer_free_while_capturing), and its
// error then has no caller to go to and is cleared.
cudaError_t free_behind_gate(cudaError_t (*release)(void*), void* pointer) {
  const auto deferred = [release, pointer] {
    if (release(pointer) != cudaSuccess) cudaGetLastError();
  };
  if (defer_free_while_capturing(deferred)) return cudaSuccess;
  const FreeGate gate;
  return release(pointer);
}

}  // namespace

cudaError_t free_device_memory(void* pointer) { return free_behind_gate(cudaFree, pointer); }

cudaError_t free_pinned_memory(void* pointer) { return free_behind_gate(cudaFreeHost, pointer); }

cudaError_t allocate_pinned_memory(void** pointer, size_t bytes) {
  const FreeGate gate;
  return cudaMallocHost(pointer, bytes);
}

void Context::reallocate(void** buffer, size_t* buffer_bytes, size_t bytes) {
  // Ops queued earlier may still read the old buffer; cudaFree waits for the device.
  if (*buffer != nullptr) {
    THPC_CUDA_CHECK(free_device_memory(*buffer));
    count_free(*buffer_bytes);
  }
  *buffer = nullptr;
  *buffer_bytes = 0;
  const size_t grown = (bytes + bytes / 4 + 255) / 256 * 256;  // +25%: fewer regrowths
  THPC_CUDA_CHECK(cudaMalloc(buffer, grown));
  count_allocation(grown);
  *buffer_bytes = grown;
}

void* Context::scratch(size_t bytes) {
  if (bytes > scratch_bytes_) reallocate(&scratch_, &scratch_bytes_, bytes);
  return scratch_;
}

void Context::count_allocation(size_t bytes) {
  allocated_bytes_ += static_cast<int64_t>(bytes);
  if (allocated_bytes_ > peak_allocated_bytes_) peak_allocated_bytes_ = allocated_bytes_;
}

void Context::count_free(size_t bytes) {
  allocated_bytes_ -= static_cast<int64_t>(bytes);
  ++frees_;
}

void* Context::kept_vector(size_t count, size_t element_bytes, size_t& to_fill) {
  THPC_CHECK(element_bytes == 2 || element_bytes == 4,
             "a kept vector of " << element_bytes << "-byte elements");
  const int which = element_bytes == 2 ? 0 : 1;
  to_fill = 0;
  const bool fits = count <= kept_count_[which] && kept_[which] != nullptr;
  if (fits && kept_filled_[which]) return kept_[which];
  cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
  THPC_CUDA_CHECK(cudaStreamIsCapturing(stream_, &capturing));
  if (capturing != cudaStreamCaptureStatusNone) return nullptr;
  if (fits) {  // made, but its fill never queued (an error came between): fill it now
    to_fill = kept_count_[which];
    return kept_[which];
  }
  if (kept_[which] != nullptr) {
    THPC_CUDA_CHECK(free_device_memory(kept_[which]));  // waits for the ops that read it
    count_free(kept_count_[which] * element_bytes);
  }
  kept_[which] = nullptr;
  kept_count_[which] = 0;
  const size_t grown = count + count / 4 + 64;  // +25%: fewer regrowths
  THPC_CUDA_CHECK(cudaMalloc(&kept_[which], grown * element_bytes));
  count_allocation(grown * element_bytes);
  kept_count_[which] = grown;
  kept_filled_[which] = false;
  to_fill = grown;
  return kept_[which];
}

void Context::kept_vector_filled(size_t element_bytes) {
  kept_filled_[element_bytes == 2 ? 0 : 1] = true;
}

float* Context::side_sums(size_t count) {
  const size_t bytes = sizeof(float) * count;
  if (bytes > side_sums_bytes_ || side_sums_ == nullptr) {
    cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
    THPC_CUDA_CHECK(cudaStreamIsCapturing(stream_, &capturing));
    if (capturing != cudaStreamCaptureStatusNone) return nullptr;
    reallocate(&side_sums_, &side_sums_bytes_, bytes);  // (the free waits for its reads)
  }
  return static_cast<float*>(side_sums_);
}

void Context::fork_side() {
  THPC_CHECK(has_side(), "fork_side without the side stream (candidate weight_grads_beside)");
  // Inside a capture of stream() the wait draws the side stream into the same capture: its
  // work becomes a branch of the graph, joined back by join_side().
  THPC_CUDA_CHECK(cudaEventRecord(fork_event_, stream_));
  THPC_CUDA_CHECK(cudaStreamWaitEvent(side_stream_, fork_event_, 0));
}

void Context::join_side() {
  THPC_CHECK(has_side(), "join_side without the side stream (candidate weight_grads_beside)");
  THPC_CUDA_CHECK(cudaEventRecord(join_event_, side_stream_));
  THPC_CUDA_CHECK(cudaStreamWaitEvent(stream_, join_event_, 0));
}

void Context::join_side_unchecked() noexcept {
  if (!has_side()) return;
  cudaEventRecord(join_event_, side_stream_);
  cudaStreamWaitEvent(stream_, join_event_, 0);
  cudaGetLastError();  // a sticky error stays for the next checked call to report
}

void* Context::pinned(size_t bytes) {
  if (bytes > pinned_bytes_) {
    THPC_CUDA_CHECK(cudaStreamSynchronize(stream_));
    if (pinned_) THPC_CUDA_CHECK(free_pinned_memory(pinned_));
    pinned_ = nullptr;
    THPC_CUDA_CHECK(allocate_pinned_memory(&pinned_, bytes));
    pinned_bytes_ = bytes;
  }
  return pinned_;
}

}  // namespace cuda
}  // namespace thpc
