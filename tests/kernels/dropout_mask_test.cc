// The CPU ops draw dropout four elements per Philox evaluation (kernels/cpu/dropout_mask.h);
// the draws must be exactly dropout_keep's, element by element, from any first element
// (attention rows start anywhere in the [B, h, Lq, Lk] stream) and for any count.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "common/philox.h"
#include "kernels/cpu/dropout_mask.h"

namespace thpc {
namespace {

TEST(DropoutMask, FourDrawsPerPhiloxBlockAreTheDrawsOfEachElement) {
  const DropoutKey key{0x0123456789abcdefull, 7, 3, 11};
  const float p = 0.4f;
  int64_t kept = 0, drawn = 0;
  // Every alignment of the first element within its block, counts that end inside a
  // block, span several blocks or are empty.
  for (int64_t first : {0, 1, 2, 3, 4, 5, 1021, 1 << 20}) {
    for (int64_t count : {0, 1, 2, 3, 4, 5, 7, 9, 64, 101, 200}) {
      std::vector<int> seen(count, 0);
      cpu::for_each_dropout_draw(key, first, count, p, [&](int64_t j, bool keep) {
        ASSERT_GE(j, 0);
        ASSERT_LT(j, count);
        seen[j] += 1;
        EXPECT_EQ(keep, dropout_keep(key.seed, key.site, key.step, key.stream,
                                     static_cast<uint64_t>(first + j), p))
            << "first " << first << " j " << j;
        kept += keep ? 1 : 0;
        drawn += 1;
      });
      for (int64_t j = 0; j < count; ++j) EXPECT_EQ(seen[j], 1) << "first " << first << " j " << j;
    }
  }
  // Both outcomes occur, so the comparison above could have failed either way.
  EXPECT_GT(kept, 0);
  EXPECT_LT(kept, drawn);
}

// Checks that `draw(key, block, p, kept)`, the draws of `Blocks` Philox blocks at once,
// are the scalar draws, for every word of every block, at counters that wrap around 2^32
// too, and at probabilities from 0 (all kept) to just below 1, where the comparison of the
// 24-bit uniform is tightest.
template <int Blocks, typename Draw, typename Flag = bool>
void expect_blocks_are_the_scalar_draws(Draw draw) {
  const DropoutKey keys[] = {{0x0123456789abcdefull, 7, 3, 11}, {0, 0, 0, 0},
                             {0xffffffffffffffffull, 0xffffffffu, 0xffffffffu, 0xffffffffu}};
  const uint32_t blocks[] = {0u, 1u, 5u, 12345u, 0x7ffffff8u, 0xfffffff3u, 0xfffffffdu,
                             0xffffffffu};
  const float probabilities[] = {0.0f, 1e-7f, 0.1f, 0.5f, 0.9f, 0.99999994f};
  int64_t kept = 0, drawn = 0;
  for (const DropoutKey& key : keys) {
    for (uint32_t block : blocks) {
      for (float p : probabilities) {
        Flag words[4 * Blocks];
        draw(key, block, p, words);
        for (uint32_t e = 0; e < 4 * Blocks; ++e) {
          const uint64_t element =
              (static_cast<uint64_t>(static_cast<uint32_t>(block + e / 4)) << 2) + e % 4;
          // Flags of bytes are 0 or 1, nothing else.
          EXPECT_LE(static_cast<int>(words[e]), 1);
          EXPECT_EQ(words[e] != 0,
                    dropout_keep(key.seed, key.site, key.step, key.stream, element, p))
              << Blocks << " blocks from " << block << ", word " << e << ", p " << p;
          kept += words[e] ? 1 : 0;
          drawn += 1;
        }
      }
    }
  }
  EXPECT_GT(kept, 0);
  EXPECT_LT(kept, drawn);
}

// The four blocks evaluated together (SSE2 on x86-64).
TEST(DropoutMask, FourBlocksAtOnceAreTheDrawsOfEachElement) {
  expect_blocks_are_the_scalar_draws<4>(cpu::keep_four_blocks);
}

#if defined(THPC_DROPOUT_WIDE_VECTORS)
// The sixteen blocks in one AVX-512 vector each word.
TEST(DropoutMask, SixteenBlocksAtOnceAreTheDrawsOfEachElement) {
  if (!cpu::cpu_has_avx512f()) GTEST_SKIP() << "this CPU has no AVX-512";
  expect_blocks_are_the_scalar_draws<16>(cpu::keep_sixteen_blocks);
}

// The eight blocks in one AVX2 vector each word.
TEST(DropoutMask, EightBlocksAtOnceAreTheDrawsOfEachElement) {
  if (!cpu::cpu_has_avx2()) GTEST_SKIP() << "this CPU has no AVX2";
  expect_blocks_are_the_scalar_draws<8, decltype(&cpu::keep_eight_blocks), uint8_t>(
      cpu::keep_eight_blocks);
}
#endif

// dropout_keep_mask, a range's mask at once (sixteen, thirty-two or sixty-four draws at a time
// inside), gives each element's own draw from any first element, whole blocks and partial
// ones at both ends.
TEST(DropoutMask, RangeMaskIsTheDrawOfEachElement) {
  const DropoutKey key{0x0fedcba987654321ull, 2, 9, 4};
  const float p = 0.3f;
  for (int64_t first : {int64_t(0), int64_t(1), int64_t(3), int64_t(4), int64_t(15), int64_t(16),
                        int64_t(17), int64_t(1023), int64_t(1) << 34}) {
    // 64 and more: sixty-four draws at a time first where the CPU has AVX-512; 32 and
    // more: thirty-two where it has AVX2 (after the sixty-fours, or alone).
    for (int64_t count : {int64_t(1), int64_t(5), int64_t(100), int64_t(64), int64_t(67),
                          int64_t(300), int64_t(32), int64_t(50), int64_t(127)}) {
      std::vector<uint8_t> keep(static_cast<size_t>(count), 7);
      cpu::dropout_keep_mask(key, first, count, p, keep.data());
      for (int64_t j = 0; j < count; ++j) {
        EXPECT_EQ(keep[j] != 0, dropout_keep(key.seed, key.site, key.step, key.stream,
                                             static_cast<uint64_t>(first + j), p))
            << "first " << first << " count " << count << " j " << j;
        EXPECT_LE(keep[j], 1) << "first " << first << " count " << count << " j " << j;
      }
    }
  }
}

}  // namespace
}  // namespace thpc
