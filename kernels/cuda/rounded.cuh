// fp32 arithmetic with each operation rounded to nearest on its own, for bodies that run
// on the GPU and on the host (vector_norm.cuh, fused_adam.cuh): on the device the
// explicitly rounded intrinsics (__fadd_rn, ...: never contracted into a fused
// multiply-add), on the host plain float operations, which the project compiles without
// contraction (-ffp-contract=off) and whose division and square root are IEEE's.
#pragma once

#include <cmath>

#include "common/philox.h"  // THPC_HOST_DEVICE

namespace thpc::rounded {

THPC_HOST_DEVICE float add_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
THPC_HOST_DEVICE float sub_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}
THPC_HOST_DEVICE float mul_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
THPC_HOST_DEVICE float div_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}
THPC_HOST_DEVICE float sqrt_rn(float a) {
#if defined(__CUDA_ARCH__)
  return __fsqrt_rn(a);
#else
  return std::sqrt(a);
#endif
}

}  // namespace thpc::rounded
