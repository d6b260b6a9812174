// NumPy's default_rng draws and float means, bit for bit (see numpy_random.h for why).
// Written from the published algorithms (O'Neill's PCG and seed_seq hash, Lemire's
// bounded integers, pairwise summation) with NumPy's constants, and checked against
// NumPy's output by tests/test_numpy_random.cc.
#include "metrics/numpy_random.h"

#include <cmath>
#include <limits>

namespace thpc::metrics {
namespace {

// GCC and Clang's 128-bit integer: PCG64's state and Lemire's 64x64 -> 128 product.
__extension__ typedef unsigned __int128 Uint128;

Uint128 make128(uint64_t high, uint64_t low) {
  return (static_cast<Uint128>(high) << 64) | low;
}

// SeedSequence's hash constants (NumPy's bit_generator.pyx, after O'Neill's seed_seq
// from the PCG C++ library): the pool is 4 uint32 words; XSHIFT is half a word's bits.
constexpr uint32_t kInitA = 0x43b0d7e5;
constexpr uint32_t kMultA = 0x931e8875;
constexpr uint32_t kInitB = 0x8b51f9dd;
constexpr uint32_t kMultB = 0x58f38ded;
constexpr uint32_t kMixMultL = 0xca01f9dd;
constexpr uint32_t kMixMultR = 0x4973f715;
constexpr int kXShift = 16;
constexpr size_t kPoolSize = 4;

// hashmix: xor with the running hash constant, which is then advanced by a multiplication;
// multiply by it; fold the high half down. All arithmetic is modulo 2**32.
uint32_t hashmix(uint32_t value, uint32_t& hash_constant) {
  value ^= hash_constant;
  hash_constant *= kMultA;
  value *= hash_constant;
  value ^= value >> kXShift;
  return value;
}

uint32_t mix(uint32_t x, uint32_t y) {
  uint32_t result = kMixMultL * x - kMixMultR * y;
  result ^= result >> kXShift;
  return result;
}

// SeedSequence(entropy).generate_state(n32, uint32): the pool is filled from the
// entropy words (zeros where fewer than 4), every pool word is mixed into every other,
// words past the fourth are mixed into all 4; the output cycles over the pool, hashing
// each word with a second running constant.
std::vector<uint32_t> seed_sequence_state(const std::vector<uint32_t>& entropy, size_t n32) {
  uint32_t pool[kPoolSize];
  uint32_t hash_constant = kInitA;
  for (size_t i = 0; i < kPoolSize; ++i) {
    pool[i] = hashmix(i < entropy.size() ? entropy[i] : 0u, hash_constant);
  }
  for (size_t source = 0; source < kPoolSize; ++source) {
    for (size_t target = 0; target < kPoolSize; ++target) {
      if (source != target) pool[target] = mix(pool[target], hashmix(pool[source], hash_constant));
    }
  }
  for (size_t source = kPoolSize; source < entropy.size(); ++source) {
    for (size_t target = 0; target < kPoolSize; ++target) {
      pool[target] = mix(pool[target], hashmix(entropy[source], hash_constant));
    }
  }
  std::vector<uint32_t> state(n32);
  uint32_t output_constant = kInitB;
  for (size_t i = 0; i < n32; ++i) {
    uint32_t value = pool[i % kPoolSize] ^ output_constant;
    output_constant *= kMultB;
    value *= output_constant;
    value ^= value >> kXShift;
    state[i] = value;
  }
  return state;
}

// PCG64's multiplier (PCG_DEFAULT_MULTIPLIER_128).
const Uint128 kPcgMultiplier = make128(0x2360ed051fc65da4ULL, 0x4385df649fccf645ULL);

// Pairwise summation as NumPy's add.reduce does it on a contiguous run (the
// pairwise_sum of its loops_utils.h): under 8 values, a plain left-to-right sum from 0;
// up to 128 (PW_BLOCKSIZE), 8 accumulators started with the first 8 values, each taking
// every 8th value, combined as ((r0+r1)+(r2+r3))+((r4+r5)+(r6+r7)), then the leftover
// values (fewer than 8) added in order; above 128, split at half the length rounded down
// to a multiple of 8 and add the two halves' sums.
template <typename Float>
Float pairwise_sum(const Float* a, size_t n) {
  if (n < 8) {
    Float sum = 0;
    for (size_t i = 0; i < n; ++i) sum += a[i];
    return sum;
  }
  if (n <= 128) {
    Float r[8];
    for (size_t j = 0; j < 8; ++j) r[j] = a[j];
    size_t i = 8;
    for (; i < n - n % 8; i += 8) {
      for (size_t j = 0; j < 8; ++j) r[j] += a[i + j];
    }
    Float sum = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
    for (; i < n; ++i) sum += a[i];
    return sum;
  }
  size_t half = n / 2;
  half -= half % 8;
  return pairwise_sum(a, half) + pairwise_sum(a + half, n - half);
}

}  // namespace

NumpyGenerator::NumpyGenerator(uint64_t seed) {
  // SeedSequence takes an int as its 32-bit words, least significant first, as many as it
  // needs (one for 0).
  std::vector<uint32_t> entropy{static_cast<uint32_t>(seed)};
  if ((seed >> 32) != 0) entropy.push_back(static_cast<uint32_t>(seed >> 32));
  seed_pcg64(entropy);
}

NumpyGenerator::NumpyGenerator(const std::vector<uint32_t>& entropy) {
  // Without a spawn key NumPy neither pads nor trims the words (an empty list hashes as
  // zeros, as a short one is padded in the pool).
  seed_pcg64(entropy);
}

void NumpyGenerator::seed_pcg64(const std::vector<uint32_t>& entropy) {
  // generate_state(4, uint64): 8 uint32 words read as 4 little-endian uint64 words;
  // PCG64 takes (w0 << 64 | w1) as its state seed and (w2 << 64 | w3) as its stream.
  const std::vector<uint32_t> words = seed_sequence_state(entropy, 8);
  uint64_t w[4];
  for (size_t i = 0; i < 4; ++i) {
    w[i] = static_cast<uint64_t>(words[2 * i]) | static_cast<uint64_t>(words[2 * i + 1]) << 32;
  }
  // pcg_setseq_128_srandom_r: state 0, increment (stream << 1) | 1, one step, add the
  // state seed, one more step.
  const Uint128 increment = (make128(w[2], w[3]) << 1) | 1u;
  Uint128 state = 0;
  state = state * kPcgMultiplier + increment;
  state += make128(w[0], w[1]);
  state = state * kPcgMultiplier + increment;
  state_high_ = static_cast<uint64_t>(state >> 64);
  state_low_ = static_cast<uint64_t>(state);
  increment_high_ = static_cast<uint64_t>(increment >> 64);
  increment_low_ = static_cast<uint64_t>(increment);
  has_uint32_ = false;
  uinteger_ = 0;
}

uint64_t NumpyGenerator::next_uint64() {
  // Step the LCG, then XSL-RR of the new state: the xor of its halves, rotated right by
  // its top 6 bits.
  const Uint128 state =
      make128(state_high_, state_low_) * kPcgMultiplier + make128(increment_high_, increment_low_);
  state_high_ = static_cast<uint64_t>(state >> 64);
  state_low_ = static_cast<uint64_t>(state);
  const uint64_t folded = state_high_ ^ state_low_;
  const unsigned rotation = static_cast<unsigned>(state_high_ >> 58);
  return (folded >> rotation) | (folded << ((64 - rotation) & 63));
}

uint32_t NumpyGenerator::next_uint32() {
  // PCG64's next_uint32: the low half of a fresh 64-bit output now, its high half on the
  // next call. next_uint64 leaves a kept half where it is.
  if (has_uint32_) {
    has_uint32_ = false;
    return uinteger_;
  }
  const uint64_t value = next_uint64();
  has_uint32_ = true;
  uinteger_ = static_cast<uint32_t>(value >> 32);
  return static_cast<uint32_t>(value);
}

std::vector<int64_t> NumpyGenerator::choice(int64_t n, size_t count) {
  // choice(n, size, replace=True) without p is integers(0, n, size, dtype=int64), whose
  // fill draws each value in [0, range] (range = n - 1) by Lemire's method: multiply a
  // uniform word by range + 1 and keep the high word, redrawing while the low word is
  // below (2**w - range - 1) mod (range + 1), the modulo computed only when the low word
  // is below range + 1. 32-bit words (next_uint32) when range < 2**32 - 1, a bare 32-bit
  // word when range == 2**32 - 1, 64-bit words above.
  std::vector<int64_t> out(count, 0);
  if (n <= 1) return out;  // range 0: NumPy fills with 0 and draws nothing
  const uint64_t range = static_cast<uint64_t>(n) - 1;
  if (range == 0xFFFFFFFFull) {
    for (int64_t& value : out) value = next_uint32();
  } else if (range < 0xFFFFFFFFull) {
    const uint32_t range32 = static_cast<uint32_t>(range);
    const uint32_t exclusive = range32 + 1;
    for (int64_t& value : out) {
      uint64_t product = static_cast<uint64_t>(next_uint32()) * exclusive;
      uint32_t leftover = static_cast<uint32_t>(product);
      if (leftover < exclusive) {
        const uint32_t threshold = (std::numeric_limits<uint32_t>::max() - range32) % exclusive;
        while (leftover < threshold) {
          product = static_cast<uint64_t>(next_uint32()) * exclusive;
          leftover = static_cast<uint32_t>(product);
        }
      }
      value = static_cast<int64_t>(product >> 32);
    }
  } else {
    const uint64_t exclusive = range + 1;  // n <= 2**63 - 1, so no overflow
    for (int64_t& value : out) {
      Uint128 product = static_cast<Uint128>(next_uint64()) * exclusive;
      uint64_t leftover = static_cast<uint64_t>(product);
      if (leftover < exclusive) {
        const uint64_t threshold = (std::numeric_limits<uint64_t>::max() - range) % exclusive;
        while (leftover < threshold) {
          product = static_cast<Uint128>(next_uint64()) * exclusive;
          leftover = static_cast<uint64_t>(product);
        }
      }
      value = static_cast<int64_t>(product >> 64);
    }
  }
  return out;
}

std::vector<bool> NumpyGenerator::coin_flips(size_t count) {
  // integers(2, dtype=bool) fills with NumPy's buffered bounded bool: a next_uint32 word
  // gives 32 values, its lowest bit first, shifting right for each next one; the word is
  // local to the call, so a new call starts with a fresh next_uint32 (which may be the
  // kept high half of an earlier 64-bit output).
  std::vector<bool> out(count);
  uint32_t buffer = 0;
  int bits_left = 0;
  for (size_t i = 0; i < count; ++i) {
    if (bits_left == 0) {
      buffer = next_uint32();
      bits_left = 31;
    } else {
      buffer >>= 1;
      --bits_left;
    }
    out[i] = (buffer & 1u) != 0;
  }
  return out;
}

double numpy_mean(const std::vector<double>& values) {
  if (values.empty()) return std::numeric_limits<double>::quiet_NaN();
  // add.reduce starts from the identity 0.0; the contiguous array is one inner run.
  const double sum = 0.0 + pairwise_sum(values.data(), values.size());
  return sum / static_cast<double>(values.size());
}

float numpy_mean(const std::vector<float>& values) {
  if (values.empty()) return std::numeric_limits<float>::quiet_NaN();
  // The sum is in float32; _mean then divides the float32 sum by the count as an intp,
  // which promotes to float64, and casts the quotient back to float32.
  const float sum = 0.0f + pairwise_sum(values.data(), values.size());
  return static_cast<float>(static_cast<double>(sum) / static_cast<double>(values.size()));
}

}  // namespace thpc::metrics
