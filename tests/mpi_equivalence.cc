// Run under `mpirun -np 2` (ctest does): data parallelism trains exactly like one rank
// accumulating the same micro-batches.
//
// Two ranks with train.accumulate = 1 see batches 0, 1 (rank 0 the even ones, rank 1
// the odd ones) of the stream at each step and draw the dropout masks of streams 0, 1;
// one rank with train.accumulate = 2 sees the same two batches as its micro-batches with
// the same masks. After K steps:
// * the two ranks hold bitwise-identical parameters (same summed gradient, same update);
// * these equal the single rank's within 1e-6 relative: not bitwise, because the single
//   rank adds micro-batch 1's gradient into micro-batch 0's inside the GEMMs (beta = 1)
//   while the ranks sum two separately rounded gradients, a different rounding order;
// * the ranks' batches hold different numbers of target tokens, so the test also checks
//   that the loss is normalised by the global count, not each rank's own.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <set>

#include "config/config.h"
#include "distributed/communicator.h"
#include "distributed/mpi_sanitizer_options.h"
#include "train/trainer.h"

namespace thpc {
namespace {

constexpr int kSteps = 3;

Config tiny(const std::vector<std::string>& overrides) {
  return load_config(std::string(THPC_SOURCE_DIR) + "/input/tiny.ini", overrides);
}

TEST(DataParallel, TwoRanksEqualOneRankAccumulatingTwo) {
  const Communicator comm = Communicator::world();
  ASSERT_EQ(comm.size(), 2) << "run this test with mpirun -np 2";

  Trainer parallel(tiny({"train.tokens_per_step=400"}), comm);
  std::set<int64_t> unequal_steps;
  for (int step = 0; step < kSteps; ++step) {
    const StepStats stats = parallel.step();
    const std::vector<std::string> shares = comm.all_gather(std::to_string(stats.local_tgt_tokens));
    if (shares[0] != shares[1]) unequal_steps.insert(stats.step);
    EXPECT_EQ(stats.tgt_tokens, std::stoll(shares[0]) + std::stoll(shares[1]));
  }
  EXPECT_FALSE(unequal_steps.empty()) << "every step gave both ranks equal token counts: "
                                         "the normalisation check is vacuous";

  const std::string digest = parallel.model().params().sha256_hex();
  const std::vector<std::string> digests = comm.all_gather(digest);
  EXPECT_EQ(digests[0], digests[1]) << "ranks diverged";

  // The single-rank reference, computed on every rank (it is cheap) and compared.
  Trainer single(tiny({"train.tokens_per_step=400", "train.accumulate=2"}),
                 Communicator::single());
  for (int step = 0; step < kSteps; ++step) single.step();
  const std::vector<float> a = parallel.model().params().to_host_f32();
  const std::vector<float> b = single.model().params().to_host_f32();
  ASSERT_EQ(a.size(), b.size());
  double largest = 0.0, max_diff = 0.0;
  for (size_t i = 0; i < a.size(); ++i) {
    largest = std::max(largest, std::abs(double(b[i])));
    max_diff = std::max(max_diff, std::abs(double(a[i]) - double(b[i])));
  }
  std::printf("max abs difference %.3g, largest parameter %.3g\n", max_diff, largest);
  EXPECT_LE(max_diff, 1e-6 * largest) << "max |2 ranks - 1 rank x 2| = " << max_diff;
  // The runs trained (the comparison is not of two untouched initialisations).
  Trainer untouched(tiny({}), Communicator::single());
  const std::vector<float> init = untouched.model().params().to_host_f32();
  double moved = 0.0;
  for (size_t i = 0; i < a.size(); ++i) moved = std::max(moved, std::abs(double(a[i]) - init[i]));
  EXPECT_GT(moved, 1e-5);
}

// Buckets small enough that most of them start during backward (the overlap path) must
// not change the result: each element is still the sum of the same two values.
TEST(DataParallel, SmallBucketsOverlappingBackwardGiveTheSameParameters) {
  const Communicator comm = Communicator::world();
  ASSERT_EQ(comm.size(), 2) << "run this test with mpirun -np 2";
  Trainer one_bucket(tiny({"train.tokens_per_step=400", "dist.bucket_mb=1000"}), comm);
  Trainer many_buckets(tiny({"train.tokens_per_step=400", "dist.bucket_mb=0.01"}), comm);
  for (int step = 0; step < kSteps; ++step) {
    one_bucket.step();
    many_buckets.step();
  }
  EXPECT_EQ(one_bucket.model().params().sha256_hex(), many_buckets.model().params().sha256_hex());
}

}  // namespace
}  // namespace thpc

int main(int argc, char** argv) {
  thpc::MpiSession mpi(&argc, &argv);
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
