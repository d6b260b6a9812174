// Philox4x32-10 (src/common/philox.h), the counter-based generator every dropout mask
// is drawn from, on the CPU and the GPU alike: Random123's known answers, the keep rate.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>

#include "common/philox.h"
#include "cpu_reference.h"

namespace thpc::cpu_test {
namespace {

// Known-answer vectors of Random123 (kat_vectors, philox4x32_10).
TEST(Philox, MatchesRandom123KnownAnswers) {
  const Philox4x32 zeros = philox4x32_10(0, 0, 0, 0, 0, 0);
  EXPECT_EQ(zeros.v[0], 0x6627e8d5u);
  EXPECT_EQ(zeros.v[1], 0xe169c58du);
  EXPECT_EQ(zeros.v[2], 0xbc57ac4cu);
  EXPECT_EQ(zeros.v[3], 0x9b00dbd8u);

  const Philox4x32 ones = philox4x32_10(0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu,
                                        0xffffffffu, 0xffffffffu);
  EXPECT_EQ(ones.v[0], 0x408f276du);
  EXPECT_EQ(ones.v[1], 0x41c83b0eu);
  EXPECT_EQ(ones.v[2], 0xa20bc7c6u);
  EXPECT_EQ(ones.v[3], 0x6d5451fdu);

  const Philox4x32 pi = philox4x32_10(0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u,
                                      0xa4093822u, 0x299f31d0u);
  EXPECT_EQ(pi.v[0], 0xd16cfe09u);
  EXPECT_EQ(pi.v[1], 0x94fdccebu);
  EXPECT_EQ(pi.v[2], 0x5001e420u);
  EXPECT_EQ(pi.v[3], 0x24126ea1u);
}

// Keeps are Bernoulli(1 - p): over n draws the kept count is within 5 standard
// deviations sqrt(n p (1 - p)) of n (1 - p).
TEST(Philox, DropoutKeepRateIsOneMinusP) {
  const float p = 0.3f;
  const int64_t n = 1000000;
  int64_t kept = 0;
  for (int64_t i = 0; i < n; ++i) {
    kept += dropout_keep(kDropoutKey.seed, kDropoutKey.site, kDropoutKey.step,
                         kDropoutKey.stream, static_cast<uint64_t>(i), p);
  }
  const double expected = n * (1.0 - p);
  const double sigma = std::sqrt(n * static_cast<double>(p) * (1.0 - p));
  EXPECT_NEAR(static_cast<double>(kept), expected, 5.0 * sigma);
}

}  // namespace
}  // namespace thpc::cpu_test
