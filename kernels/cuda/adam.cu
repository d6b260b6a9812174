// The Adam optimizer (Kingma & Ba 2015) with bias correction, as in §5.3 (beta1 = 0.9,
// beta2 = 0.98, eps = 1e-9 in the paper), over the flat fp32 parameter buffer:
//   m = b1 m + (1 - b1) g,          v = b2 v + (1 - b2) g^2,
//   m_hat = m / (1 - b1^step),      v_hat = v / (1 - b2^step),
//   p -= lr * m_hat / (sqrt(v_hat) + eps)
// CPU twin: kernels/cpu/adam.cc.
//
// Shape: one fused grid-stride pass, ~12 flops per parameter against 28 bytes moved
// (read p, g, m, v; write p, m, v, all fp32): memory-bound, so the only aim is a single
// coalesced pass. The bias corrections are computed once on the host in double, exactly
// as on the CPU, and the per-element arithmetic uses the CPU's operation order with
// explicitly rounded fp32 intrinsics (no FMA contraction, IEEE division and square
// root), so the GPU's results equal the CPU's bit for bit.
#include <cmath>
#include <cstdint>

#include "common/error.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/device_util.cuh"

namespace thpc::cuda {
namespace {

// The per-call constants, all fp32 as the CPU's float instantiation holds them.
struct AdamConstants {
  float b1, b2, one_minus_b1, one_minus_b2, first_correction, second_correction, lr, eps;
};

__global__ void adam_kernel(float* params, const float* grads, float* m, float* v, int64_t n,
                            AdamConstants c) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) {
    const float g = grads[i];
    // m = b1 * m + (1 - b1) * g
    const float mi = __fadd_rn(__fmul_rn(c.b1, m[i]), __fmul_rn(c.one_minus_b1, g));
    // v = b2 * v + ((1 - b2) * g) * g   (the CPU's left-to-right product)
    const float vi =
        __fadd_rn(__fmul_rn(c.b2, v[i]), __fmul_rn(__fmul_rn(c.one_minus_b2, g), g));
    m[i] = mi;
    v[i] = vi;
    const float m_hat = __fdiv_rn(mi, c.first_correction);
    const float v_hat = __fdiv_rn(vi, c.second_correction);
    // p -= (lr * m_hat) / (sqrt(v_hat) + eps)
    const float step = __fdiv_rn(__fmul_rn(c.lr, m_hat), __fadd_rn(__fsqrt_rn(v_hat), c.eps));
    params[i] = __fsub_rn(params[i], step);
  }
}

}  // namespace

// One fused pass over the flat fp32 buffers (§5.3, with bias correction); T, the
// backend's activation type, plays no part.
template <typename T>
void adam_update(Context& context, float* params, const float* grads, float* m, float* v,
                 int64_t n, float lr, float beta1, float beta2, float eps, int64_t step) {
  const cudaStream_t stream = context.stream();
  THPC_CHECK(step >= 1, "Adam step " << step << " (steps are 1-based)");
  if (n <= 0) return;
  // As kernels/cpu/adam.cc: 1 - b^step in double, rounded once to fp32.
  const double steps = static_cast<double>(step);
  AdamConstants c{};
  c.b1 = beta1;
  c.b2 = beta2;
  c.one_minus_b1 = 1.0f - beta1;
  c.one_minus_b2 = 1.0f - beta2;
  c.first_correction = static_cast<float>(1.0 - std::pow(static_cast<double>(beta1), steps));
  c.second_correction = static_cast<float>(1.0 - std::pow(static_cast<double>(beta2), steps));
  c.lr = lr;
  c.eps = eps;
  adam_kernel<<<grid_blocks(n), kGridThreads, 0, stream>>>(params, grads, m, v, n, c);
  THPC_CUDA_CHECK_LAUNCH("adam_kernel");
}

THPC_CUDA_TWIN(adam_update)

}  // namespace thpc::cuda
