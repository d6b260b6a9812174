// THPC_VECTOR_CLONES: a function the compiler builds three times, for the baseline
// x86-64 (SSE2), for AVX2 and for AVX-512, the program picking one per CPU when it loads
// (GCC's target_clones; nothing elsewhere). For the few loops CPU decoding spends its time
// in that vectorise well but run a quarter-width in SSE2: the gathered attention's
// scores and weighted values (attention.cc), int8's row quantization and dequantization
// (int8_matmul.cc). The clones do the same IEEE operations in the same order (explicit
// lanes, and this library has no contraction: -ffp-contract=off), so results do not
// depend on the clone. A helper a clone calls must be inlined into it
// ([[gnu::always_inline]]) to take the clone's vectors: GCC does not inline it by itself.
#pragma once

// Not under ThreadSanitizer (tools/sanitize.sh --threads): the clones' resolver runs while
// the program is relocated, before TSan's runtime is up, and its instrumented code crashed
// there; that build checks threads, not vector widths.
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && !defined(__SANITIZE_THREAD__)
#define THPC_VECTOR_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define THPC_VECTOR_CLONES
#endif
