// The dropout draws of the CPU ops, sixteen, thirty-two or sixty-four at a time. The
// stream is defined element by element (common/philox.h: element e is lane e % 4 of the
// Philox block at counter e / 4), and one Philox4x32-10 evaluation yields the whole
// block, so a loop over consecutive elements evaluates it once per four elements instead
// of once per element;
// on x86-64 four blocks are evaluated together in SSE2 vectors (keep_four_blocks), which
// the compiler does not do by itself (it leaves the 32 x 32 -> 64-bit multiplies scalar),
// on a CPU with AVX-512 sixteen blocks in one (keep_sixteen_blocks: the draws were 4.5% of
// the small preset's CPU step on an Intel Xeon, 2026-11-30), and on one with AVX2 alone
// eight (keep_eight_blocks). The draws are the same bits as dropout_keep's, in any order;
// only the work differs.
#pragma once

#if defined(__SSE2__)
#include <emmintrin.h>
#endif
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define THPC_DROPOUT_WIDE_VECTORS 1
#endif

#include <cstdint>

#include "common/error.h"
#include "common/philox.h"
#include "kernels/ops.h"

namespace thpc::cpu {

inline void check_probability(float p) {
  THPC_CHECK(p >= 0.0f && p < 1.0f, "dropout probability " << p << " outside [0, 1)");
}

// Inverted dropout: kept elements are scaled by 1 / (1 - p) so the expectation of the
// output equals the input and inference needs no rescaling.
template <typename T>
T keep_scale(float p) {
  return T(1) / (T(1) - static_cast<T>(p));
}

// kept[e] = dropout_keep(key, 4 * block + e, p) for e = 0 .. 15: the draws of the four
// Philox blocks at counters block .. block + 3 (wrapping as philox_block's 32-bit counter
// does), word w of block l being element 4 l + w.
inline void keep_four_blocks(const DropoutKey& key, uint32_t block, float p, bool kept[16]) {
#if defined(__SSE2__)
  // Lane l of each vector is block + l's Philox state (c0 .. c3), ten rounds of
  // philox4x32_10 on all four at once. _mm_mul_epu32 multiplies the even 32-bit lanes
  // into 64-bit products, so the odd lanes are shifted down for a second multiply and
  // the products' high and low words put back in lane order.
  const __m128i mul0 = _mm_set1_epi32(static_cast<int>(kPhiloxMul0));
  const __m128i mul1 = _mm_set1_epi32(static_cast<int>(kPhiloxMul1));
  const __m128i low_words = _mm_set_epi32(0, -1, 0, -1);
  __m128i c0 = _mm_add_epi32(_mm_set1_epi32(static_cast<int>(block)), _mm_set_epi32(3, 2, 1, 0));
  __m128i c1 = _mm_set1_epi32(static_cast<int>(key.site));
  __m128i c2 = _mm_set1_epi32(static_cast<int>(key.step));
  __m128i c3 = _mm_set1_epi32(static_cast<int>(key.stream));
  uint32_t k0 = static_cast<uint32_t>(key.seed), k1 = static_cast<uint32_t>(key.seed >> 32);
  for (int round = 0; round < 10; ++round) {
    const __m128i even0 = _mm_mul_epu32(c0, mul0);
    const __m128i odd0 = _mm_mul_epu32(_mm_srli_epi64(c0, 32), mul0);
    const __m128i even1 = _mm_mul_epu32(c2, mul1);
    const __m128i odd1 = _mm_mul_epu32(_mm_srli_epi64(c2, 32), mul1);
    const __m128i lo0 = _mm_or_si128(_mm_and_si128(even0, low_words), _mm_slli_epi64(odd0, 32));
    const __m128i hi0 = _mm_or_si128(_mm_srli_epi64(even0, 32), _mm_andnot_si128(low_words, odd0));
    const __m128i lo1 = _mm_or_si128(_mm_and_si128(even1, low_words), _mm_slli_epi64(odd1, 32));
    const __m128i hi1 = _mm_or_si128(_mm_srli_epi64(even1, 32), _mm_andnot_si128(low_words, odd1));
    c0 = _mm_xor_si128(_mm_xor_si128(hi1, c1), _mm_set1_epi32(static_cast<int>(k0)));
    c1 = lo1;
    c2 = _mm_xor_si128(_mm_xor_si128(hi0, c3), _mm_set1_epi32(static_cast<int>(k1)));
    c3 = lo0;
    k0 += kPhiloxWeyl0;
    k1 += kPhiloxWeyl1;
  }
  // uniform_from_bits (the top 24 bits, exactly as a float in [0, 1)) >= p, per word.
  const __m128 unit = _mm_set1_ps(kUniformUnit), threshold = _mm_set1_ps(p);
  const __m128i words[4] = {c0, c1, c2, c3};
  alignas(16) int32_t keep[4][4];
  for (int w = 0; w < 4; ++w) {
    const __m128 uniform =
        _mm_mul_ps(_mm_cvtepi32_ps(_mm_srli_epi32(words[w], kUniformShift)), unit);
    _mm_store_si128(reinterpret_cast<__m128i*>(keep[w]),
                    _mm_castps_si128(_mm_cmpge_ps(uniform, threshold)));
  }
  for (int l = 0; l < 4; ++l) {
    for (int w = 0; w < 4; ++w) kept[4 * l + w] = keep[w][l] != 0;
  }
#else
  for (uint32_t l = 0; l < 4; ++l) {
    const uint64_t element = static_cast<uint64_t>(static_cast<uint32_t>(block + l)) << 2;
    const Philox4x32 drawn = philox_block(key.seed, key.site, key.step, key.stream, element);
    for (int w = 0; w < 4; ++w) kept[4 * l + w] = uniform_from_bits(drawn.v[w]) >= p;
  }
#endif
}

#if defined(THPC_DROPOUT_WIDE_VECTORS)
// kept[e] = dropout_keep(key, 4 * block + e, p) for e = 0 .. 63: keep_four_blocks' rounds on
// the sixteen blocks at counters block .. block + 15 in one AVX-512 vector each word. For
// a CPU with AVX-512 F only (cpu_has_avx512f); the program's other code stays baseline.
// (GCC 12 reports its own AVX-512 shift and multiply intrinsics as reading an
// uninitialized value, its bug 105593: silenced here, not in the rest of the program.)
#if !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
[[gnu::target("avx512f")]] inline void keep_sixteen_blocks(const DropoutKey& key,
                                                            uint32_t block, float p,
                                                            bool kept[64]) {
  // As keep_four_blocks: _mm512_mul_epu32 multiplies the even lanes into 64-bit products,
  // the odd lanes shifted down for a second one; the blends put the products' low and
  // high words back in lane order (mask 0xAAAA: the odd lanes from the second operand).
  const __m512i mul0 = _mm512_set1_epi32(static_cast<int>(kPhiloxMul0));
  const __m512i mul1 = _mm512_set1_epi32(static_cast<int>(kPhiloxMul1));
  constexpr __mmask16 odd_lanes = 0xAAAA;
  __m512i c0 = _mm512_add_epi32(_mm512_set1_epi32(static_cast<int>(block)),
                                _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13,
                                                  14, 15));
  __m512i c1 = _mm512_set1_epi32(static_cast<int>(key.site));
  __m512i c2 = _mm512_set1_epi32(static_cast<int>(key.step));
  __m512i c3 = _mm512_set1_epi32(static_cast<int>(key.stream));
  uint32_t k0 = static_cast<uint32_t>(key.seed), k1 = static_cast<uint32_t>(key.seed >> 32);
  for (int round = 0; round < 10; ++round) {
    const __m512i even0 = _mm512_mul_epu32(c0, mul0);
    const __m512i odd0 = _mm512_mul_epu32(_mm512_srli_epi64(c0, 32), mul0);
    const __m512i even1 = _mm512_mul_epu32(c2, mul1);
    const __m512i odd1 = _mm512_mul_epu32(_mm512_srli_epi64(c2, 32), mul1);
    const __m512i lo0 = _mm512_mask_blend_epi32(odd_lanes, even0, _mm512_slli_epi64(odd0, 32));
    const __m512i hi0 = _mm512_mask_blend_epi32(odd_lanes, _mm512_srli_epi64(even0, 32), odd0);
    const __m512i lo1 = _mm512_mask_blend_epi32(odd_lanes, even1, _mm512_slli_epi64(odd1, 32));
    const __m512i hi1 = _mm512_mask_blend_epi32(odd_lanes, _mm512_srli_epi64(even1, 32), odd1);
    c0 = _mm512_xor_si512(_mm512_xor_si512(hi1, c1), _mm512_set1_epi32(static_cast<int>(k0)));
    c1 = lo1;
    c2 = _mm512_xor_si512(_mm512_xor_si512(hi0, c3), _mm512_set1_epi32(static_cast<int>(k1)));
    c3 = lo0;
    k0 += kPhiloxWeyl0;
    k1 += kPhiloxWeyl1;
  }
  // uniform_from_bits(word) >= p, as keep_four_blocks compares it; bit l of word w's mask
  // is block + l's.
  const __m512 unit = _mm512_set1_ps(kUniformUnit), threshold = _mm512_set1_ps(p);
  const __m512i words[4] = {c0, c1, c2, c3};
  for (int w = 0; w < 4; ++w) {
    const __m512 uniform =
        _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_srli_epi32(words[w], kUniformShift)), unit);
    const __mmask16 keep = _mm512_cmp_ps_mask(uniform, threshold, _CMP_GE_OQ);
    for (int l = 0; l < 16; ++l) kept[4 * l + w] = ((keep >> l) & 1) != 0;
  }
}
#if !defined(__clang__)
#pragma GCC diagnostic pop
#endif

// kept[e] = dropout_keep(key, 4 * block + e, p) for e = 0 .. 31: keep_four_blocks' rounds on
// the eight blocks at counters block .. block + 7 in one AVX2 vector each word. For a CPU
// with AVX2 but not AVX-512 (AMD's Zen 1-3, Intel's client cores): 1.4 ns a draw against
// 3-4.6 in SSE2 on a Zen 3, 8-14 ms of the small preset's CPU step (2026-12-01,
// bench/RESULTS.md).
[[gnu::target("avx2")]] inline void keep_eight_blocks(const DropoutKey& key, uint32_t block,
                                                       float p, uint8_t kept[32]) {
  // As keep_four_blocks, twice as wide: _mm256_mul_epu32 multiplies the even lanes, the
  // odd lanes shifted down for a second multiply; the blends (0xAA: the odd lanes from
  // the second operand) put the products' low and high words back in lane order.
  const __m256i mul0 = _mm256_set1_epi32(static_cast<int>(kPhiloxMul0));
  const __m256i mul1 = _mm256_set1_epi32(static_cast<int>(kPhiloxMul1));
  __m256i c0 = _mm256_add_epi32(_mm256_set1_epi32(static_cast<int>(block)),
                                _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  __m256i c1 = _mm256_set1_epi32(static_cast<int>(key.site));
  __m256i c2 = _mm256_set1_epi32(static_cast<int>(key.step));
  __m256i c3 = _mm256_set1_epi32(static_cast<int>(key.stream));
  uint32_t k0 = static_cast<uint32_t>(key.seed), k1 = static_cast<uint32_t>(key.seed >> 32);
  for (int round = 0; round < 10; ++round) {
    const __m256i even0 = _mm256_mul_epu32(c0, mul0);
    const __m256i odd0 = _mm256_mul_epu32(_mm256_srli_epi64(c0, 32), mul0);
    const __m256i even1 = _mm256_mul_epu32(c2, mul1);
    const __m256i odd1 = _mm256_mul_epu32(_mm256_srli_epi64(c2, 32), mul1);
    const __m256i lo0 = _mm256_blend_epi32(even0, _mm256_slli_epi64(odd0, 32), 0xAA);
    const __m256i hi0 = _mm256_blend_epi32(_mm256_srli_epi64(even0, 32), odd0, 0xAA);
    const __m256i lo1 = _mm256_blend_epi32(even1, _mm256_slli_epi64(odd1, 32), 0xAA);
    const __m256i hi1 = _mm256_blend_epi32(_mm256_srli_epi64(even1, 32), odd1, 0xAA);
    c0 = _mm256_xor_si256(_mm256_xor_si256(hi1, c1), _mm256_set1_epi32(static_cast<int>(k0)));
    c1 = lo1;
    c2 = _mm256_xor_si256(_mm256_xor_si256(hi0, c3), _mm256_set1_epi32(static_cast<int>(k1)));
    c3 = lo0;
    k0 += kPhiloxWeyl0;
    k1 += kPhiloxWeyl1;
  }
  // uniform_from_bits(word) >= p, as keep_four_blocks compares it: lane l of keep[w] is
  // all ones where element 4 (block + l) + w is kept.
  const __m256 unit = _mm256_set1_ps(kUniformUnit), threshold = _mm256_set1_ps(p);
  const __m256i words[4] = {c0, c1, c2, c3};
  __m256i keep[4];
  for (int w = 0; w < 4; ++w) {
    const __m256 uniform =
        _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(words[w], kUniformShift)), unit);
    keep[w] = _mm256_castps_si256(_mm256_cmp_ps(uniform, threshold, _CMP_GE_OQ));
  }
  // To bytes in element order, without a store per element (which cost as much as the
  // rounds): the packs narrow the four words to bytes, each 128-bit half holding lanes
  // 0-3 (the low) or 4-7 (the high) word-major (byte 4 w + l); the shuffle transposes each
  // half's 4 x 4 to lane-major (byte 4 l + w), which is element order.
  const __m256i words01 = _mm256_packs_epi32(keep[0], keep[1]);
  const __m256i words23 = _mm256_packs_epi32(keep[2], keep[3]);
  const __m256i word_major = _mm256_packs_epi16(words01, words23);
  const __m256i transpose = _mm256_setr_epi8(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15,
                                             0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  const __m256i flags = _mm256_and_si256(_mm256_shuffle_epi8(word_major, transpose),
                                         _mm256_set1_epi8(1));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(kept), flags);
}

// Whether this CPU runs keep_eight_blocks (asked once).
inline bool cpu_has_avx2() {
  static const bool has = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") != 0;
  }();
  return has;
}

// Whether this CPU runs keep_sixteen_blocks (asked once).
inline bool cpu_has_avx512f() {
  static const bool has = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") != 0;
  }();
  return has;
}
#endif

// Calls visit(j, keep) for j = 0 .. count - 1, in order, where keep is
// dropout_keep(key, first + j, p).
template <typename Visit>
void for_each_dropout_draw(const DropoutKey& key, int64_t first, int64_t count, float p,
                           Visit&& visit) {
  int64_t j = 0;
  // One block's lanes from element first + j's lane to 3, or fewer at the end.
  auto one_block = [&] {
    const uint64_t element = static_cast<uint64_t>(first + j);
    const Philox4x32 block = philox_block(key.seed, key.site, key.step, key.stream, element);
    for (uint32_t lane = element & 3; lane < 4 && j < count; ++lane, ++j) {
      visit(j, uniform_from_bits(block.v[lane]) >= p);
    }
  };
  if (count > 0 && (first & 3) != 0) one_block();  // up to the first whole block
#if defined(THPC_DROPOUT_WIDE_VECTORS)
  if (count - j >= 64 && cpu_has_avx512f()) {
    bool kept[64];
    for (; count - j >= 64; j += 64) {
      keep_sixteen_blocks(key, static_cast<uint32_t>(static_cast<uint64_t>(first + j) >> 2), p,
                          kept);
      for (int e = 0; e < 64; ++e) visit(j + e, kept[e]);
    }
  }
  if (count - j >= 32 && cpu_has_avx2()) {
    uint8_t kept[32];
    for (; count - j >= 32; j += 32) {
      keep_eight_blocks(key, static_cast<uint32_t>(static_cast<uint64_t>(first + j) >> 2), p,
                        kept);
      for (int e = 0; e < 32; ++e) visit(j + e, kept[e] != 0);
    }
  }
#endif
  bool kept[16];
  for (; count - j >= 16; j += 16) {
    keep_four_blocks(key, static_cast<uint32_t>(static_cast<uint64_t>(first + j) >> 2), p, kept);
    for (int e = 0; e < 16; ++e) visit(j + e, kept[e]);
  }
  while (j < count) one_block();
}

// keep[j] = dropout_keep(key, first + j, p) for j in [0, count), as 0 or 1: a row's mask
// drawn at once, so that the loop applying it is a select per element, which the compiler
// vectorises. (Applied draw by draw, with a branch per element, the mask cost more than
// its draws in the fused layer norm's backward: 2.2 of 3.4 ms for [2000, 256].)
inline void dropout_keep_mask(const DropoutKey& key, int64_t first, int64_t count, float p,
                              uint8_t* keep) {
  int64_t j = 0;
#if defined(THPC_DROPOUT_WIDE_VECTORS)
  // On a CPU with AVX2 alone, whole runs of 32 straight into `keep` from the first whole
  // block on: the copy of keep_eight_blocks' flags draw by draw was a third of the mask's
  // time (2026-12-01). AVX-512 CPUs take for_each_dropout_draw's sixty-fours.
  const int64_t head = (4 - (first & 3)) & 3;  // up to the first whole block
  if (count - head >= 32 && cpu_has_avx2() && !cpu_has_avx512f()) {
    for_each_dropout_draw(key, first, head, p, [&](int64_t i, bool kept) { keep[i] = kept; });
    for (j = head; count - j >= 32; j += 32) {
      keep_eight_blocks(key, static_cast<uint32_t>(static_cast<uint64_t>(first + j) >> 2), p,
                        keep + j);
    }
  }
#endif
  uint8_t* rest = keep + j;
  for_each_dropout_draw(key, first + j, count - j, p,
                        [&](int64_t i, bool kept) { rest[i] = kept; });
}

}  // namespace thpc::cpu
