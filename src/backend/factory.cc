#include "backend/factory.h"

#include <optional>

#include "common/error.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/blas.h"
#if THPC_HAVE_CUDA
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/device_info.h"
#endif

namespace thpc {

std::string cuda_unavailable_reason() {
#if THPC_HAVE_CUDA
  if (cuda_devices().empty()) {
    return "no CUDA device visible (no driver, no GPU, or CUDA_VISIBLE_DEVICES empty)";
  }
  return "";
#else
  return "built without CUDA (no nvcc at configure time, or -DTRANSFORMER_CUDA=OFF)";
#endif
}

// The CUDA backend's counters, which the GPU tests read to see that a kernel ran (each
// declared in factory.h); zero in a build without CUDA, where nothing launches.
#if THPC_HAVE_CUDA
#define THPC_CUDA_COUNTER(name) \
  int64_t name() { return cuda_##name(); }
#else
#define THPC_CUDA_COUNTER(name) \
  int64_t name() { return 0; }
#endif
THPC_CUDA_COUNTER(short_attention_launches)
THPC_CUDA_COUNTER(fused_attention_launches)
THPC_CUDA_COUNTER(decode_attention_launches)
THPC_CUDA_COUNTER(vector_norm_launches)
THPC_CUDA_COUNTER(fused_adam_launches)
THPC_CUDA_COUNTER(loss_rows_from_l2_launches)
THPC_CUDA_COUNTER(kept_ones_bias_gradients)
THPC_CUDA_COUNTER(weight_grads_beside)
THPC_CUDA_COUNTER(relu_mask_products)
THPC_CUDA_COUNTER(bias_grads_in_gemm)
#undef THPC_CUDA_COUNTER

void count_gemm_uses() {
#if THPC_HAVE_CUDA
  cuda_count_gemm_uses();
#endif
}

bool sweep_gemm_algorithms(int max_algorithms, std::vector<GemmSweepRow>& rows) {
#if THPC_HAVE_CUDA
  rows = cuda_sweep_gemm_algorithms(max_algorithms);
  return true;
#else
  (void)max_algorithms;
  (void)rows;
  return false;
#endif
}

bool fused_attention_fragment_probe(std::vector<uint32_t>& words,
                                    std::vector<uint32_t>& trans_words,
                                    std::vector<float>& products) {
#if THPC_HAVE_CUDA
  cuda_fused_attention_fragment_probe(words, trans_words, products);
  return true;
#else
  (void)words;
  (void)trans_words;
  (void)products;
  return false;
#endif
}

bool built_with_cuda() {
#if THPC_HAVE_CUDA
  return true;
#else
  return false;
#endif
}

int visible_cuda_devices() {
#if THPC_HAVE_CUDA
  return static_cast<int>(cuda_devices().size());
#else
  return 0;
#endif
}

#if THPC_HAVE_CUDA
namespace {

// The CUDA device `backend` computes on (`device`), or none for a host backend.
std::optional<CudaDeviceInfo> device_info(const Backend& backend, int device) {
  if (backend.host_memory()) return std::nullopt;
  for (const CudaDeviceInfo& info : cuda_devices()) {
    if (info.index == device) return info;
  }
  return std::nullopt;
}

}  // namespace
#endif

std::string device_description(const Backend& backend, int device) {
#if THPC_HAVE_CUDA
  if (const std::optional<CudaDeviceInfo> info = device_info(backend, device)) {
    return "GPU " + std::to_string(device) + " " + info->name + ", PCI " + info->pci_bus_id +
           " (" + backend.name() + ")";
  }
#endif
  // The library of the matrix products shows in the first line of a run, and OpenBLAS's
  // kernels where it is OpenBLAS: OPENBLAS_CORETYPE=Haswell on an AVX-512 CPU makes them
  // ~1.5x slower (kernels/cpu/blas.h, openblas_core.h).
  return "cpu (" + backend.name() + ", " + cpu::gemm_library_description() + ")";
}

std::string compute_identity(const Backend& backend, int device) {
#if THPC_HAVE_CUDA
  if (const std::optional<CudaDeviceInfo> info = device_info(backend, device)) {
    return backend.name() + " on " + info->name;
  }
#endif
  static_cast<void>(device);
  return backend.name() + ", " + cpu::gemm_identity();
}

std::unique_ptr<Backend> make_backend(const BackendRequest& request) {
  const bool want_cuda = request.backend == "cuda" || request.backend == "auto";
  THPC_CHECK(request.backend == "cuda" || request.backend == "cpu" || request.backend == "auto",
             "unknown backend '" << request.backend << "'");
  THPC_CHECK(request.precision == "bf16" || request.precision == "fp32",
             "unknown precision '" << request.precision << "'");
  if (want_cuda) {
    const std::string reason = cuda_unavailable_reason();
    if (reason.empty()) {
#if THPC_HAVE_CUDA
      return make_cuda_backend(request.device,
                               request.precision == "fp32" ? DType::F32 : DType::BF16,
                               request.cuda_kernels);
#endif
    } else if (request.backend == "cuda") {
      THPC_FAIL("train.backend = cuda, but " << reason);
    }
  }
  if (request.cpu_threads > 0) set_cpu_threads(request.cpu_threads);
  return make_cpu_backend(DType::F32);
}

BackendRequest backend_request(const TrainConfig& train, int device) {
  BackendRequest request;
  request.backend = train.backend;
  request.precision = train.precision;
  request.cpu_threads = train.threads;
  std::string error;
  THPC_CHECK(parse_candidate_kernels(train.cuda_kernels, request.cuda_kernels.candidates, error),
             "train.cuda_kernels: " << error);
  request.cuda_kernels.short_attention_max_len = train.short_attention_max_len;
  request.device = device;
  return request;
}

std::unique_ptr<Backend> make_backend(const TrainConfig& train) {
  return make_backend(backend_request(train, 0));
}

}  // namespace thpc
