// Adam's arithmetic per element (adam.cu's two kernels share it) and the one-pass
// kernel's body: one pass that moves 16 bytes of each fp32 array at a time and writes the
// compute copy beside the masters (the former candidate fused_adam, the default since its
// twins passed on an H200 on 2026-11-29; Adam 0.70 -> 0.48 ms in the base profile).
//
// Why: Adam is a fixed cost of every step whatever its batch: 63.0M parameters for base,
// 28 bytes each (read p, g, m, v; write p, m, v) = 1.76 GB, 0.37 ms at the H200's
// 4.8 TB/s, against 0.56 ms profiled (66% of the bandwidth, scalar loads); and in bf16 a
// second pass converts the masters into the compute copy (read 4 + write 2 bytes each,
// 0.38 GB). At 3,125 tokens a rank (issue 51's small batch, 6.68 ms a step) the two are
// ~10% of the step. Fused: 30 bytes a parameter in one pass of 16-byte moves, ~0.42 ms at
// 90% of the bandwidth, ~0.2 ms a step less.
//
// The same arithmetic as the scalar kernel element by element (the CPU's order, each
// operation rounded on its own) and the same conversion as the copy, so the results are
// the two-kernel path's bit for bit.
//
// One body, two executions (as vector_norm.cuh): written for a policy X (16-byte loads and
// stores of four floats, four compute values stored, one compute value rounded). On the
// GPU (adam.cu, VectorMoves) X is float4 and packed bf16 moves; in
// tests/kernels/adam_test.cc (FusedAdamOnTheHost.*) each thread of the grid is a call on
// the host, so the groups each thread takes, the tail and the stores run on the CPU
// against the CPU's Adam.
#pragma once

#include <cmath>
#include <cstdint>

#include "common/philox.h"  // THPC_HOST_DEVICE
#include "kernels/cuda/rounded.cuh"

#if defined(__CUDACC__)
#define THPC_FUSED_ADAM_BODY __device__ __forceinline__
#define THPC_FUSED_ADAM_UNROLL _Pragma("unroll")
#else
#define THPC_FUSED_ADAM_BODY inline
#define THPC_FUSED_ADAM_UNROLL
#endif

namespace thpc::fused_adam {

// The per-call constants, all fp32 as the CPU's float instantiation holds them (the bias
// corrections 1 - b^step computed in double on the host and rounded once).
struct Constants {
  float b1, b2, one_minus_b1, one_minus_b2, first_correction, second_correction, lr, eps;
};

// A call's constants, as kernels/cpu/adam.cc computes them for fp32 (step 1-based).
inline Constants constants_for(float lr, float beta1, float beta2, float eps, int64_t step) {
  const double steps = static_cast<double>(step);
  Constants c{};
  c.b1 = beta1;
  c.b2 = beta2;
  c.one_minus_b1 = 1.0f - beta1;
  c.one_minus_b2 = 1.0f - beta2;
  c.first_correction = static_cast<float>(1.0 - std::pow(static_cast<double>(beta1), steps));
  c.second_correction = static_cast<float>(1.0 - std::pow(static_cast<double>(beta2), steps));
  c.lr = lr;
  c.eps = eps;
  return c;
}

using rounded::add_rn;
using rounded::div_rn;
using rounded::mul_rn;
using rounded::sqrt_rn;
using rounded::sub_rn;

// One parameter's moments m, v for gradient g, and its step, in the CPU's order
// (kernels/cpu/adam.cc):
//   m = b1 m + (1 - b1) g,          v = b2 v + ((1 - b2) g) g,
//   step = (lr (m / (1 - b1^step))) / (sqrt(v / (1 - b2^step)) + eps).
THPC_HOST_DEVICE float moments_and_step(const Constants& c, float g, float& m, float& v) {
  m = add_rn(mul_rn(c.b1, m), mul_rn(c.one_minus_b1, g));
  v = add_rn(mul_rn(c.b2, v), mul_rn(mul_rn(c.one_minus_b2, g), g));
  const float m_hat = div_rn(m, c.first_correction);
  const float v_hat = div_rn(v, c.second_correction);
  return div_rn(mul_rn(c.lr, m_hat), add_rn(sqrt_rn(v_hat), c.eps));
}

// One parameter p updated: p -= step; with kDecay (adamw_update, the candidate
// weight_decay) p -= step + decay p, the sum then one subtraction, as the CPU's.
template <bool kDecay = false>
THPC_HOST_DEVICE void update(const Constants& c, float& p, float g, float& m, float& v,
                             float decay = 0.0f) {
  const float step = moments_and_step(c, g, m, v);
  if constexpr (kDecay) {
    p = sub_rn(p, add_rn(step, mul_rn(decay, p)));
  } else {
    p = sub_rn(p, step);
  }
}

constexpr int kGroup = 4;  // floats in 16 bytes

// Thread `thread` of `threads`: groups of four elements thread, thread + threads, ...
// (each array's group one 16-byte move), then the tail's elements (n % 4 of them) the
// same way, one at a time. compute (may be null) receives each updated parameter rounded
// to T. Every pointer 16-byte aligned, compute 4 * sizeof(T) (adam.cu checks). kDecay:
// AdamW's update with `decay` (update<true>).
template <typename T, class X, bool kDecay = false>
THPC_FUSED_ADAM_BODY void thread_body(const X& x, int64_t thread, int64_t threads,
                                      const Constants& c, float* params, T* compute,
                                      const float* grads, float* m, float* v, int64_t n,
                                      float decay = 0.0f) {
  const int64_t groups = n / kGroup;
  for (int64_t group = thread; group < groups; group += threads) {
    const int64_t first = group * kGroup;
    float p[kGroup], g[kGroup], mm[kGroup], vv[kGroup];
    x.load(p, params + first);
    x.load(g, grads + first);
    x.load(mm, m + first);
    x.load(vv, v + first);
    THPC_FUSED_ADAM_UNROLL
    for (int k = 0; k < kGroup; ++k) update<kDecay>(c, p[k], g[k], mm[k], vv[k], decay);
    x.store(params + first, p);
    x.store(m + first, mm);
    x.store(v + first, vv);
    if (compute != nullptr) x.store_compute(compute + first, p);
  }
  for (int64_t i = groups * kGroup + thread; i < n; i += threads) {
    float p = params[i], mi = m[i], vi = v[i];
    update<kDecay>(c, p, grads[i], mi, vi, decay);
    params[i] = p;
    m[i] = mi;
    v[i] = vi;
    if (compute != nullptr) compute[i] = x.template round<T>(p);
  }
}

}  // namespace thpc::fused_adam
