// A row's largest value, for the fp32 cross-entropy and log-softmax rows
// (cross_entropy.cc): the plain loop `max = z_j > max ? z_j : max` is a chain of dependent
// maxima, a maxss's latency per logit, and was more than half of the loss's own time on an
// Intel Xeon (2026-11-30, the small preset's vocabulary of 8,000). On x86-64 sixteen lanes
// go at a time in four SSE vectors, then the lanes in order.
#pragma once

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace thpc::cpu {

// The plain loop's value: the maximum of the same numbers, a NaN skipped as the loop skips
// it (_mm_max_ps(z, m) gives m when z is NaN) unless it is z[0], which both keep. Only a
// maximum of zeros may differ, in its sign, where +0 and -0 both occur (the loop keeps the
// first seen, the lanes the first of their lane); z - max and exp(z - max) do not.
// `vocab` >= 1.
inline float row_max(const float* z, int vocab) {
  float max = z[0];
  int j = 1;
#if defined(__SSE2__)
  if (vocab >= 16) {
    __m128 m0 = _mm_set1_ps(z[0]), m1 = m0, m2 = m0, m3 = m0;
    for (j = 0; j + 16 <= vocab; j += 16) {
      m0 = _mm_max_ps(_mm_loadu_ps(z + j), m0);
      m1 = _mm_max_ps(_mm_loadu_ps(z + j + 4), m1);
      m2 = _mm_max_ps(_mm_loadu_ps(z + j + 8), m2);
      m3 = _mm_max_ps(_mm_loadu_ps(z + j + 12), m3);
    }
    alignas(16) float lanes[16];
    _mm_store_ps(lanes, m0);
    _mm_store_ps(lanes + 4, m1);
    _mm_store_ps(lanes + 8, m2);
    _mm_store_ps(lanes + 12, m3);
    for (const float lane : lanes) max = lane > max ? lane : max;
  }
#endif
  for (; j < vocab; ++j) max = z[j] > max ? z[j] : max;
  return max;
}

}  // namespace thpc::cpu
