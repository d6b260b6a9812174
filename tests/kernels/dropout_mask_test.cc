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
    for (int64_t count : {0, 1, 2, 3, 4, 5, 7, 9, 64, 101}) {
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

}  // namespace
}  // namespace thpc
