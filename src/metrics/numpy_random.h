// NumPy's random generator and float means, bit for bit, for the draws sacreBLEU's
// significance tests make (sacrebleu/significance.py): --confidence bootstraps with
// rng.choice(n, size=(samples, n)) on numpy.random.default_rng(seed), the paired
// approximate randomization test draws rng.integers(2, size=(trials, n), dtype=bool) and
// then (for its intervals) rng.choice from the same generator, and the results are
// averaged with ndarray.mean(). Drawing the same numbers lets transformer_score print
// sacreBLEU's intervals and p-values, not merely close ones.
//
// What is reproduced (NumPy >= 1.17 Generator; checked against NumPy 2.4 by
// tests/test_numpy_random.cc):
//  - default_rng(seed) = Generator(PCG64(SeedSequence(seed))). SeedSequence (O'Neill's
//    seed_seq hash, as NumPy's bit_generator.pyx does it) splits the int seed into 32-bit
//    little-endian words, mixes them into a pool of 4 words, and generate_state(4, uint64)
//    gives PCG64 its 128-bit state seed and stream (increment) seed.
//  - PCG64 (pcg_setseq_128_xsl_rr_64): a 128-bit LCG step, then the XSL-RR output of the
//    new state. A 32-bit draw uses the low half of a 64-bit output and keeps the high half
//    for the next 32-bit draw (the bit generator's has_uint32/uinteger buffer).
//  - Generator.integers / choice(replace=True, p=None) for int64: Lemire's nearly
//    divisionless bounded method, on 32-bit draws when the range n-1 fits in 32 bits, on
//    64-bit draws otherwise (NumPy's random_bounded_uint64_fill, use_masked=False).
//  - integers(2, dtype=bool): one 32-bit draw per 32 booleans, least significant bit
//    first; the unused bits of the last draw are dropped when the call returns.
//  - mean(): add.reduce's pairwise summation, then one division by the count in the
//    array's own precision.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace thpc::metrics {

// numpy.random.default_rng(seed): a SeedSequence, then PCG64 (NumPy >= 1.17).
class NumpyGenerator {
 public:
  // default_rng(seed) for a non-negative int seed (any value below 2**64).
  explicit NumpyGenerator(uint64_t seed);
  // default_rng(SeedSequence(entropy)) for a list of 32-bit words, as NumPy takes a list:
  // word by word, trailing zero words kept. (default_rng(None) seeds with 128 bits from
  // the OS as an int, whose high zero words NumPy drops: 4 random words here are the same
  // kind of draw.)
  explicit NumpyGenerator(const std::vector<uint32_t>& entropy);

  // rng.choice(n, size=count, replace=True) for an int n >= 1: count indices in [0, n),
  // in C order (a size=(rows, cols) call is the same numbers, row after row).
  std::vector<int64_t> choice(int64_t n, size_t count);
  // rng.integers(2, size=count, dtype=bool), flattened in C order.
  std::vector<bool> coin_flips(size_t count);

  // The raw PCG64 outputs (bit_generator.random_raw()) and NumPy's buffered 32-bit draw.
  uint64_t next_uint64();
  uint32_t next_uint32();

 private:
  void seed_pcg64(const std::vector<uint32_t>& entropy);

  uint64_t state_high_ = 0, state_low_ = 0;          // the 128-bit LCG state
  uint64_t increment_high_ = 0, increment_low_ = 0;  // the stream: odd 128-bit increment
  bool has_uint32_ = false;                          // a kept high half for next_uint32
  uint32_t uinteger_ = 0;
};

// ndarray.mean() of a 1-D contiguous array, as NumPy computes it (pairwise summation,
// then division by the length); NaN for an empty array, as NumPy's.
double numpy_mean(const std::vector<double>& values);
float numpy_mean(const std::vector<float>& values);

}  // namespace thpc::metrics
