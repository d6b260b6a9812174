// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11),
// the counter-based generator behind every random draw of transformer_hpc: dropout
// masks, parameter initialisation and synthetic data. A draw is a pure function of
// (key, counter), so the CPU and the GPU (the same code compiles for both) draw the
// same numbers, in any order, and a resumed run draws what the uninterrupted run would.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define THPC_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define THPC_HOST_DEVICE inline
#endif

namespace thpc {

struct Philox4x32 {
  uint32_t v[4];
};

// Philox4x32-10's round multipliers and key increments (Salmon et al.), named once for
// every implementation of the rounds (here, and the CPU's SSE2, AVX2 and AVX-512 forms,
// four, eight and sixteen blocks at once, in kernels/cpu/dropout_mask.h).
constexpr uint32_t kPhiloxMul0 = 0xD2511F53u, kPhiloxMul1 = 0xCD9E8D57u;
constexpr uint32_t kPhiloxWeyl0 = 0x9E3779B9u, kPhiloxWeyl1 = 0xBB67AE85u;

// A draw's uniform: its top 24 bits (the draw shifted right by this), times 2^-24.
constexpr int kUniformShift = 8;
constexpr float kUniformUnit = 1.0f / 16777216.0f;

THPC_HOST_DEVICE void philox_mulhilo(uint32_t a, uint32_t b, uint32_t& hi, uint32_t& lo) {
  const uint64_t product = static_cast<uint64_t>(a) * b;
  hi = static_cast<uint32_t>(product >> 32);
  lo = static_cast<uint32_t>(product);
}

// Ten rounds of Philox4x32 on counter (c0..c3) with key (k0, k1).
THPC_HOST_DEVICE Philox4x32 philox4x32_10(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3,
                                           uint32_t k0, uint32_t k1) {
  for (int round = 0; round < 10; ++round) {
    uint32_t hi0, lo0, hi1, lo1;
    philox_mulhilo(kPhiloxMul0, c0, hi0, lo0);
    philox_mulhilo(kPhiloxMul1, c2, hi1, lo1);
    const uint32_t n0 = hi1 ^ c1 ^ k0, n1 = lo1, n2 = hi0 ^ c3 ^ k1, n3 = lo0;
    c0 = n0; c1 = n1; c2 = n2; c3 = n3;
    k0 += kPhiloxWeyl0;
    k1 += kPhiloxWeyl1;
  }
  return Philox4x32{{c0, c1, c2, c3}};
}

// A uniform float in [0, 1) from the top 24 bits of a 32-bit draw (exactly
// representable, identical on every device).
THPC_HOST_DEVICE float uniform_from_bits(uint32_t bits) {
  return static_cast<float>(bits >> kUniformShift) * kUniformUnit;
}

// The 32-bit draw for element `element` of the stream (seed; site, step, stream):
// counter = (element / 4, site, step, stream), key = seed, lane = element % 4.
// The block holding element `element`'s draw: its four lanes are the draws of elements
// 4 * (element / 4) .. + 3, so a loop over consecutive elements needs one per four.
THPC_HOST_DEVICE Philox4x32 philox_block(uint64_t seed, uint32_t site, uint32_t step,
                                         uint32_t stream, uint64_t element) {
  return philox4x32_10(static_cast<uint32_t>(element >> 2), site, step, stream,
                       static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
}

THPC_HOST_DEVICE uint32_t philox_bits(uint64_t seed, uint32_t site, uint32_t step,
                                      uint32_t stream, uint64_t element) {
  return philox_block(seed, site, step, stream, element).v[element & 3];
}

// Dropout keeps an element when its uniform draw is >= p, so P(keep) = 1 - p.
THPC_HOST_DEVICE bool dropout_keep(uint64_t seed, uint32_t site, uint32_t step,
                                   uint32_t stream, uint64_t element, float p) {
  return uniform_from_bits(philox_bits(seed, site, step, stream, element)) >= p;
}

}  // namespace thpc
