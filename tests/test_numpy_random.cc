// metrics/numpy_random.h against NumPy itself: the tests' interpreter
// (python_interpreter.h) prints default_rng's draws and the means of random arrays, and
// every value here must equal NumPy's bit for bit. A test with pinned values checks the
// same code where NumPy is not installed.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cinttypes>
#include <cmath>
#include <cstring>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "metrics/numpy_random.h"
#include "program.h"
#include "python_interpreter.h"

namespace thpc {
namespace {

using metrics::NumpyGenerator;

// The Python side: for each seed, one generator through a fixed run of calls (so each
// call's leftover state, the kept half of a 64-bit output included, feeds the next),
// one line per call, "label: values"; then sacreBLEU's full-size draws as checksums; then
// the means, inputs and result as float.hex(). The C++ side replays the same run.
constexpr const char* kScript = R"PY(
import sys
import numpy as np

def ints(values):
    return " ".join(str(int(v)) for v in np.asarray(values).ravel())

def bits(values):
    return "".join("1" if v else "0" for v in np.asarray(values).ravel())

def checksum(values):
    flat = np.asarray(values).ravel().astype(np.uint64)
    weights = np.arange(1, flat.size + 1, dtype=np.uint64)
    return "%d %d %s %s" % (flat.size, int((flat * weights).sum()), ints(flat[:5]),
                            ints(flat[-5:]))

SEEDS = [0, 1, 12345, 2**32 + 7, 2**63 + 5, 2**64 - 1]
CHOICES = [(1, 7), (2, 2001), (3, 2001), (1000, 2001), (3004, 2003), (2**31 + 11, 1001),
           (2**32, 11), (2**32 + 1, 11), (2**33 + 3, 1001)]
for seed in SEEDS:
    g = np.random.default_rng(seed)
    print("raw %d: %s" % (seed, ints(g.bit_generator.random_raw(3))))
    for n, count in CHOICES:
        print("choice %d %d %d: %s" % (seed, n, count, ints(g.choice(n, size=count))))
    for flips, n, rows, cols in [(33, 3004, 3, 333), (1, 2**33 + 3, 1, 5), (65, 7, 1, 9),
                                 (32, 3004, 1, 1), (31, 5, 3, 3)]:
        print("flips %d %d: %s" % (seed, flips, bits(g.integers(2, size=flips, dtype=bool))))
        print("choice %d %d %d: %s" % (seed, n, rows * cols,
                                       ints(g.choice(n, size=(rows, cols), replace=True))))
    print("raw %d: %s" % (seed, ints(g.bit_generator.random_raw(2))))
for words in ([], [7], [1, 2, 3, 4], [0xFFFFFFFF, 0, 5, 0x80000000, 9, 0]):
    g = np.random.default_rng(np.random.SeedSequence(words))
    print("words %s: %s %s" % (ints(words), ints(g.bit_generator.random_raw(2)),
                               ints(g.choice(3004, size=5))))

# sacreBLEU's sizes: bootstrap resampling of 3004 segments, 1000 times; the approximate
# randomization test's mask (odd sizes, so a half-used 32-bit word carries over), then
# its bootstrap.
g = np.random.default_rng(12345)
print("big choice: %s" % checksum(g.choice(3004, size=(1000, 3004), replace=True)))
g = np.random.default_rng(12345)
print("big flips: %s" % checksum(g.integers(2, size=(999, 3003), dtype=bool)))
print("big choice after flips: %s" % checksum(g.choice(3003, size=(101, 3003),
                                                       replace=True)))

rng = np.random.default_rng(99)
for dtype, kind in ((np.float64, "d"), (np.float32, "f")):
    for n in list(range(1, 301)) + [1000, 8193, 10000, 65537]:
        # Magnitudes over 12 decades and both signs: the sum depends on the order.
        a = (rng.standard_normal(n) * 10.0 ** rng.uniform(-6, 6, n)).astype(dtype)
        print("mean %s %d %s: %s" % (kind, n, " ".join(float(x).hex() for x in a),
                                     float(a.mean()).hex()))
)PY";

std::string join(const std::vector<int64_t>& values) {
  std::string out;
  for (int64_t value : values) {
    if (!out.empty()) out += ' ';
    out += std::to_string(value);
  }
  return out;
}

std::string join(const std::vector<uint64_t>& values) {
  std::string out;
  for (uint64_t value : values) {
    if (!out.empty()) out += ' ';
    out += std::to_string(value);
  }
  return out;
}

std::string bits(const std::vector<bool>& values) {
  std::string out;
  for (bool value : values) out += value ? '1' : '0';
  return out;
}

std::vector<uint64_t> raw(NumpyGenerator& generator, int count) {
  std::vector<uint64_t> out;
  for (int i = 0; i < count; ++i) out.push_back(generator.next_uint64());
  return out;
}

// The Python checksum(): size, sum of value * (position + 1) modulo 2**64, the first
// and last 5 values.
template <typename Value>
std::string checksum(const std::vector<Value>& values) {
  uint64_t weighted = 0;
  for (size_t i = 0; i < values.size(); ++i) {
    weighted += static_cast<uint64_t>(values[i]) * static_cast<uint64_t>(i + 1);
  }
  std::string head, tail;
  for (size_t i = 0; i < 5; ++i) {
    head += (i ? " " : "") + std::to_string(static_cast<uint64_t>(values[i]));
    tail += (i ? " " : "") + std::to_string(static_cast<uint64_t>(values[values.size() - 5 + i]));
  }
  return std::to_string(values.size()) + " " + std::to_string(weighted) + " " + head + " " +
         tail;
}

std::string hex(double value) {
  char buffer[64];
  std::snprintf(buffer, sizeof buffer, "%a", value);
  return buffer;
}

// Python's float.hex() ("0x1.8p+1", "-0x0.0p+0") and C's %a ("0x1.8p+1", "-0x0p+0")
// spell some values differently: compare the values.
bool same_bits(const std::string& python_hex, double value) {
  const double parsed = std::strtod(python_hex.c_str(), nullptr);
  return std::memcmp(&parsed, &value, sizeof value) == 0;
}

// NumPy's printout: each line's label (up to ": ") and the rest, in order.
struct NumpyLines {
  std::vector<std::pair<std::string, std::string>> lines;
  std::string error;
};

NumpyLines numpy_lines() {
  NumpyLines result;
  const Interpreter python = python_interpreter();
  const ProcessResult probe = run_process("'" + python.path + "' -c 'import numpy'");
  if (probe.exit_code != 0) {
    result.error = python.named ? "FAIL" : "SKIP";
    result.error += ": " + python.path + " cannot import numpy: " + probe.output;
    return result;
  }
  const std::filesystem::path script = std::filesystem::temp_directory_path() /
                                       ("test_numpy_random_" + std::to_string(::getpid()) + ".py");
  std::ofstream(script) << kScript;
  const ProcessResult run = run_process("'" + python.path + "' '" + script.string() + "'");
  std::filesystem::remove(script);
  if (run.exit_code != 0) {
    result.error = "FAIL: the NumPy script failed: " + run.output.substr(0, 2000);
    return result;
  }
  std::istringstream in(run.output);
  for (std::string line; std::getline(in, line);) {
    const size_t colon = line.find(": ");
    if (colon == std::string::npos) continue;
    result.lines.emplace_back(line.substr(0, colon), line.substr(colon + 2));
  }
  return result;
}

// The script runs once for all the tests below (a few seconds).
const NumpyLines& numpy_output() {
  static const NumpyLines lines = numpy_lines();
  return lines;
}

#define REQUIRE_NUMPY()                                                     \
  do {                                                                      \
    const std::string& error = numpy_output().error;                        \
    if (error.rfind("SKIP", 0) == 0) GTEST_SKIP() << error;                 \
    ASSERT_TRUE(error.empty()) << error;                                    \
  } while (false)

// The lines whose label starts with `prefix`, in order.
std::vector<std::pair<std::string, std::string>> lines_starting(const std::string& prefix) {
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& line : numpy_output().lines) {
    if (line.first.rfind(prefix, 0) == 0) out.push_back(line);
  }
  return out;
}

TEST(NumpyRandom, SameDrawsAsNumpyForEachSeed) {
  REQUIRE_NUMPY();
  const std::vector<uint64_t> seeds = {0, 1, 12345, (1ULL << 32) + 7, (1ULL << 63) + 5,
                                       ~0ULL};
  // Ranges below 2**32 - 1 (Lemire on 32-bit draws, often rejecting for 2**31 + 11),
  // exactly 2**32 - 1 (a bare 32-bit draw), above (Lemire on 64-bit draws); n = 1 draws
  // nothing.
  const std::vector<std::pair<int64_t, size_t>> choices = {
      {1, 7}, {2, 2001}, {3, 2001}, {1000, 2001}, {3004, 2003}, {(1LL << 31) + 11, 1001},
      {1LL << 32, 11}, {(1LL << 32) + 1, 11}, {(1LL << 33) + 3, 1001}};
  struct FlipsThenChoice {
    size_t flips;
    int64_t n;
    size_t count;
  };
  const std::vector<FlipsThenChoice> mixed = {
      {33, 3004, 999}, {1, (1LL << 33) + 3, 5}, {65, 7, 9}, {32, 3004, 1}, {31, 5, 9}};
  std::vector<std::pair<std::string, std::string>> ours;
  for (uint64_t seed : seeds) {
    const std::string s = std::to_string(seed);
    NumpyGenerator generator(seed);
    ours.emplace_back("raw " + s, join(raw(generator, 3)));
    for (const auto& [n, count] : choices) {
      ours.emplace_back("choice " + s + " " + std::to_string(n) + " " + std::to_string(count),
                        join(generator.choice(n, count)));
    }
    for (const FlipsThenChoice& step : mixed) {
      ours.emplace_back("flips " + s + " " + std::to_string(step.flips),
                        bits(generator.coin_flips(step.flips)));
      ours.emplace_back(
          "choice " + s + " " + std::to_string(step.n) + " " + std::to_string(step.count),
          join(generator.choice(step.n, step.count)));
    }
    ours.emplace_back("raw " + s, join(raw(generator, 2)));
  }
  std::vector<std::pair<std::string, std::string>> numpy = lines_starting("raw ");
  for (const auto& line : lines_starting("choice ")) numpy.push_back(line);
  for (const auto& line : lines_starting("flips ")) numpy.push_back(line);
  std::map<std::string, std::vector<std::string>> expected;
  for (const auto& [label, values] : numpy) expected[label].push_back(values);
  // Labels repeat (a seed's two "raw" lines): match the k-th of ours with NumPy's k-th.
  std::map<std::string, size_t> seen;
  size_t compared = 0;
  for (const auto& [label, values] : ours) {
    const size_t k = seen[label]++;
    ASSERT_LT(k, expected[label].size()) << "NumPy printed no line " << label;
    EXPECT_EQ(values, expected[label][k]) << label;
    ++compared;
  }
  EXPECT_EQ(compared, numpy.size());
}

TEST(NumpyRandom, SameDrawsAsNumpyFromEntropyWords) {
  REQUIRE_NUMPY();
  const std::vector<std::vector<uint32_t>> lists = {
      {}, {7}, {1, 2, 3, 4}, {0xFFFFFFFF, 0, 5, 0x80000000, 9, 0}};
  const auto numpy = lines_starting("words ");
  ASSERT_EQ(numpy.size(), lists.size());
  for (size_t i = 0; i < lists.size(); ++i) {
    NumpyGenerator generator(lists[i]);
    const std::string first = join(raw(generator, 2));
    EXPECT_EQ(first + " " + join(generator.choice(3004, 5)), numpy[i].second) << numpy[i].first;
  }
}

TEST(NumpyRandom, SameDrawsAsNumpyAtSacrebleuSizes) {
  REQUIRE_NUMPY();
  std::map<std::string, std::string> numpy;
  for (const auto& [label, values] : lines_starting("big ")) numpy[label] = values;
  NumpyGenerator bootstrap(12345);
  EXPECT_EQ(checksum(bootstrap.choice(3004, 1000 * 3004)), numpy["big choice"]);
  NumpyGenerator randomization(12345);
  EXPECT_EQ(checksum(randomization.coin_flips(999 * 3003)), numpy["big flips"]);
  EXPECT_EQ(checksum(randomization.choice(3003, 101 * 3003)), numpy["big choice after flips"]);
}

TEST(NumpyRandom, SameMeansAsNumpy) {
  REQUIRE_NUMPY();
  const auto numpy = lines_starting("mean ");
  ASSERT_EQ(numpy.size(), 2u * (300 + 4));
  for (const auto& [label, values] : numpy) {
    std::istringstream in(label);
    std::string word, kind;
    size_t n = 0;
    in >> word >> kind >> n;
    std::vector<std::string> hexes;
    for (std::string hex_value; in >> hex_value;) hexes.push_back(hex_value);
    ASSERT_EQ(hexes.size(), n);
    double mean = 0;
    if (kind == "d") {
      std::vector<double> array;
      for (const std::string& h : hexes) array.push_back(std::strtod(h.c_str(), nullptr));
      mean = metrics::numpy_mean(array);
    } else {
      std::vector<float> array;
      for (const std::string& h : hexes) {
        array.push_back(static_cast<float>(std::strtod(h.c_str(), nullptr)));
      }
      mean = metrics::numpy_mean(array);
    }
    EXPECT_TRUE(same_bits(values, mean))
        << kind << " of length " << n << ": NumPy " << values << ", here " << hex(mean);
  }
}

// NumPy 2.4's values for default_rng(12345), pinned so that a machine without NumPy
// checks the generator too.
TEST(NumpyRandom, PinnedDrawsForSeed12345) {
  NumpyGenerator generator(12345);
  EXPECT_EQ(join(raw(generator, 3)),
            "4193609425186963869 5843160025838961886 14708796524633321433");
  EXPECT_EQ(join(generator.choice(3004, 10)), "1930 2031 2969 1174 2521 999 1704 1797 640 560");
  EXPECT_EQ(bits(generator.coin_flips(40)), "1011010001111001000101010101110011101110");
  EXPECT_EQ(join(generator.choice((1LL << 33) + 3, 3)), "8090025014 2132414452 8150827032");
  EXPECT_EQ(join(raw(generator, 1)), "12308358533736350677");
}

// NumPy 2.4's means of arrays whose sums depend on the order (left to right they would be
// 0x1.5a5a5a5a5a5a6p+0 and 0x1.a70fap-6).
TEST(NumpyRandom, PinnedMeans) {
  // 8 accumulators: 1e16 + 1 + 3 rounds to 1e16 + 4, then -1e16 + 1 + 3 cancels it; the
  // 17th value is added after the blocks.
  const std::vector<double> doubles = {1e16, 1, 1, 1, 1, 1, 1, 1, -1e16, 3, 3, 3, 3, 3, 3, 3, 2};
  EXPECT_EQ(hex(metrics::numpy_mean(doubles)), "0x1.c3c3c3c3c3c3cp+0");
  // 213 float32 values: above 128 the sum splits in two halves of 104 and 109 values.
  std::vector<float> floats = {1e8f};
  floats.insert(floats.end(), 200, 1.0f);
  floats.push_back(-1e8f);
  floats.insert(floats.end(), 11, 0.5f);
  EXPECT_EQ(hex(metrics::numpy_mean(floats)), "0x1.e0c04cp-1");
  EXPECT_TRUE(std::isnan(metrics::numpy_mean(std::vector<double>{})));
}

}  // namespace
}  // namespace thpc
