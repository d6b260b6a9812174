// The Adam optimizer (Kingma & Ba 2015) with bias correction, as in §5.3 (beta1 = 0.9,
// beta2 = 0.98, eps = 1e-9 in the paper), over the flat fp32 parameter buffer:
//   m = b1 m + (1 - b1) g,          v = b2 v + (1 - b2) g^2,
//   m_hat = m / (1 - b1^step),      v_hat = v / (1 - b2^step),
//   p -= lr * m_hat / (sqrt(v_hat) + eps)
// CPU twin: kernels/cpu/adam.cc.
//
// Shape: one fused grid-stride pass, ~12 flops per parameter against 28 bytes moved
// (read p, g, m, v; write p, m, v, all fp32), and with a bf16 compute copy a conversion
// pass after it (read 4, write 2): memory-bound, so the aim is coalesced passes, and where
// the buffers are aligned one pass of 16-byte moves (fused_adam.cuh). The bias
// corrections are computed once on the host in double, exactly as on the CPU, and the
// per-element arithmetic uses the CPU's operation order with explicitly rounded fp32
// intrinsics (no FMA contraction, IEEE division and square root), so the GPU's results
// equal the CPU's bit for bit.
#include <atomic>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "common/error.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/fused_adam.cuh"

namespace thpc::cuda {
namespace {

std::atomic<int64_t> fused_adam_launch_count{0};

template <bool kDecay = false>
__global__ void adam_kernel(float* params, const float* grads, float* m, float* v, int64_t n,
                            fused_adam::Constants c, float decay = 0.0f) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) {
    float p = params[i], mi = m[i], vi = v[i];
    fused_adam::update<kDecay>(c, p, grads[i], mi, vi, decay);
    m[i] = mi;
    v[i] = vi;
    params[i] = p;
  }
}

// fused_adam.cuh's policy on the GPU: four floats a 16-byte move (device_util.cuh's),
// four compute values one move of 4 * sizeof(T) bytes, rounded as the copy's conversion
// rounds.
struct VectorMoves {
  __device__ __forceinline__ void load(float (&out)[4], const float* p) const {
    load16<float>(out, p);
  }
  __device__ __forceinline__ void store(float* p, const float (&in)[4]) const {
    store16<float>(p, in);
  }
  template <typename T>
  __device__ __forceinline__ T round(float value) const {
    return from_float<T>(value);
  }
  template <typename T>
  __device__ __forceinline__ void store_compute(T* p, const float (&in)[4]) const {
    if constexpr (sizeof(T) == 4) {
      store16<float>(reinterpret_cast<float*>(p), in);
    } else {
      T items[4];
#pragma unroll
      for (int k = 0; k < 4; ++k) items[k] = from_float<T>(in[k]);
      uint2 bits;
      memcpy(&bits, items, sizeof(bits));
      *reinterpret_cast<uint2*>(p) = bits;
    }
  }
};

template <typename T, bool kDecay = false>
__global__ void fused_adam_kernel(float* params, T* compute, const float* grads, float* m,
                                  float* v, int64_t n, fused_adam::Constants c,
                                  float decay = 0.0f) {
  fused_adam::thread_body<T, VectorMoves, kDecay>(VectorMoves{}, first_index(), grid_stride(),
                                                  c, params, compute, grads, m, v, n, decay);
}

bool aligned_to(const void* p, size_t bytes) {
  return reinterpret_cast<uintptr_t>(p) % bytes == 0;
}

// adam_update's launches, and with kDecay adamw_update's (the same kernels' AdamW form).
template <typename T, bool kDecay>
void launch_adam(Context& context, float* params, T* compute, const float* grads, float* m,
                 float* v, int64_t n, float lr, float beta1, float beta2, float eps,
                 float decay, int64_t step) {
  const cudaStream_t stream = context.stream();
  THPC_CHECK(step >= 1, "Adam step " << step << " (steps are 1-based)");
  if (n <= 0) return;
  if (static_cast<void*>(compute) == static_cast<void*>(params)) compute = nullptr;
  const fused_adam::Constants c = fused_adam::constants_for(lr, beta1, beta2, eps, step);
  const bool fused_fits = aligned16(params) && aligned16(grads) && aligned16(m) &&
                          aligned16(v) &&
                          (compute == nullptr || aligned_to(compute, 4 * sizeof(T)));
  if (fused_fits) {
    const int64_t groups = (n + fused_adam::kGroup - 1) / fused_adam::kGroup;
    fused_adam_kernel<T, kDecay><<<grid_blocks(groups), kGridThreads, 0, stream>>>(
        params, compute, grads, m, v, n, c, decay);
    THPC_CUDA_CHECK_LAUNCH("fused_adam_kernel");
    ++fused_adam_launch_count;
    return;
  }
  adam_kernel<kDecay><<<grid_blocks(n), kGridThreads, 0, stream>>>(params, grads, m, v, n, c,
                                                                   decay);
  THPC_CUDA_CHECK_LAUNCH("adam_kernel");
  if (compute != nullptr) {
    convert(compute, std::is_same_v<T, float> ? DType::F32 : DType::BF16, params, DType::F32, n,
            stream);
  }
}

}  // namespace

// Adam over the flat fp32 buffers (§5.3, with bias correction) and the compute copy
// converted from the masters (as copy() converts) when there is one, both in one pass of
// 16-byte moves (fused_adam.cuh) where every pointer is aligned for it (the flat buffers
// are; the former candidate fused_adam, default since the H200 window of 2026-11-29);
// otherwise (views one element into a buffer) Adam's scalar kernel, then the conversion:
// the same arithmetic, bit for bit (CudaAdam.FusedPassEqualsTheSeparateKernelsBitForBit).
template <typename T>
void adam_update(Context& context, float* params, T* compute, const float* grads, float* m,
                 float* v, int64_t n, float lr, float beta1, float beta2, float eps,
                 int64_t step) {
  launch_adam<T, false>(context, params, compute, grads, m, v, n, lr, beta1, beta2, eps, 0.0f,
                        step);
}

// The candidate weight_decay (2026-12-07, not yet run on a GPU): the same kernels with
// AdamW's update, p -= step + decay p (fused_adam.cuh's update<true>), the CPU's bits.
// Only train.weight_decay > 0 calls it, which the trainer refuses on a GPU without the
// candidate; the launcher asks too.
template <typename T>
void adamw_update(Context& context, float* params, T* compute, const float* grads, float* m,
                  float* v, int64_t n, float lr, float beta1, float beta2, float eps,
                  float decay, int64_t step) {
  THPC_CHECK(context.candidate_kernel(kWeightDecay),
             "adamw_update runs on a GPU only with the candidate weight_decay "
             "(train.cuda_kernels): its kernels have not yet run on one");
  launch_adam<T, true>(context, params, compute, grads, m, v, n, lr, beta1, beta2, eps, decay,
                       step);
}

THPC_CUDA_TWIN(adam_update)
THPC_CUDA_TWIN(adamw_update)

}  // namespace thpc::cuda

int64_t thpc::cuda_fused_adam_launches() { return thpc::cuda::fused_adam_launch_count.load(); }
