// sacreBLEU 2.x's statistical tests, exactly, so that an interval or a p-value printed here
// can stand next to sacreBLEU's:
//
//  - a system's 95% confidence interval by bootstrap resampling (Koehn, 2004; sacreBLEU's
//    --confidence): the corpus is resampled with replacement R times (default 1,000) and
//    the metric recomputed on each sample; "μ ± h" is the mean of the R scores and half the
//    distance between the ⌊R/40⌋-th lowest and highest (2.5% on each side);
//  - paired bootstrap resampling (Koehn, 2004, as Moses'
//    bootstrap-hypothesis-difference-significance.pl; --paired-bs): baseline and system
//    scored on the same R samples; with d_r = |score_sys,r − score_base,r| and d the actual
//    difference, p = (1 + #{r : d_r − mean(d) > d}) / (R + 1);
//  - paired approximate randomization (Riezler & Maxwell, 2005, as MultEval; --paired-ar):
//    in each of T trials (default 10,000) every segment's statistics are swapped between
//    baseline and system with probability 1/2; p = (1 + #{t : |score_a,t − score_b,t| > d})
//    / (T + 1).
//
// "Exactly" means the same samples and the same arithmetic: the samples are NumPy's
// (default_rng(seed), seed 12345 unless SACREBLEU_SEED says otherwise;
// metrics/numpy_random.h), and a resample's statistics are summed in float32 and scored
// the way sacreBLEU's Python code computes on NumPy 2's float32 scalars (a precision of
// BLEU, every step of chrF and TER, is then rounded to float32). Approximate randomization
// sums TER's (non-integer) reference lengths as pos_sel @ bl_stats + neg_sel @ sys_stats:
// each product in segment order (as OpenBLAS's kernels add, checked on 3,004 segments),
// then the two. A BLAS library that splits a product's additions otherwise could change a
// pseudo-system's length in the last bit, and with it a tied trial.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "metrics/bleu.h"
#include "metrics/chrf.h"
#include "metrics/ter.h"

namespace thpc::metrics {

// A number as sacreBLEU's Python holds it on NumPy 2: a float32 scalar or a Python float.
// Python's floats meeting a float32 become float32 (NEP 50), so which one a score is
// decides both its rounding and how its intervals are averaged.
struct PyNumber {
  double value = 0.0;    // a float32's value when float32
  bool float32 = false;
};

// Each segment's sufficient statistics of one metric, one row of `width` numbers per
// segment (integers, and TER's average reference length).
struct StatisticsTable {
  size_t width = 0;
  std::vector<double> values;  // segment-major
  size_t segments() const { return width == 0 ? 0 : values.size() / width; }
  const double* row(size_t segment) const { return values.data() + segment * width; }
};

// One metric as sacreBLEU's tests see it: statistics per segment, and the score of their
// sums, from Python's integer sums or from NumPy's float32 sums.
class TestedMetric {
 public:
  virtual ~TestedMetric() = default;
  // sacreBLEU's name of the score: BLEU, chrF2, chrF2++, TER.
  virtual std::string name() const = 0;
  // sacreBLEU's signature, with `extra` (e.g. "bs:1000|seed:12345|") after nrefs.
  virtual std::string signature(const std::string& extra) const = 0;
  virtual StatisticsTable statistics(const std::vector<std::string>& hypotheses) const = 0;
  // The score of statistics summed exactly (Python's integers; TER's lengths as doubles).
  virtual double score(const double* sums) const = 0;
  // The score of a pseudo-system of approximate randomization, whose sums NumPy holds in
  // an int64 or float64 array (BLEU's add-k then adds an integer k: the array truncates).
  virtual double randomized_score(const double* sums) const { return score(sums); }
  // The score of float32 sums (a bootstrap sample), computed as Python does on them.
  virtual PyNumber resampled_score(const float* sums) const = 0;
};

// The actual score of a system: its statistics summed in segment order, as Python's
// sum_of_lists does, then scored.
double corpus_score(const TestedMetric& metric, const StatisticsTable& table);

std::unique_ptr<TestedMetric> tested_bleu(const BleuScorer& scorer);
std::unique_ptr<TestedMetric> tested_chrf(const ChrfScorer& scorer);
std::unique_ptr<TestedMetric> tested_ter(const TerScorer& scorer);

// The generator's seed as sacreBLEU reads SACREBLEU_SEED: a non-negative integer as
// Python's int() reads it (default 12345; any size, as NumPy's SeedSequence takes it), or
// "none" (any case) for one drawn from the operating system.
struct Seed {
  // The integer's 32-bit words, least significant first, as SeedSequence splits an int;
  // nullopt: from the operating system.
  std::optional<std::vector<uint32_t>> words;
  std::string text;     // the variable as given, lowercased: --confidence's signature
  std::string integer;  // str(int(text)), or "none": the paired tests' signature
  bool is_zero() const;
};
// Reads SACREBLEU_SEED; throws thpc::Error naming it when it is neither.
Seed seed_from_environment();

// "μ = mean ± half_width" or "(mean ± half_width)".
struct Interval {
  double mean = 0.0;
  double half_width = 0.0;
};

// --confidence for one system: the interval of `resamples` bootstrap samples, averaged as
// sacreBLEU's Score.estimate_ci does (Python's exact statistics.mean). sacreBLEU prints
// it only when the mean is above 0.
Interval bootstrap_interval(const TestedMetric& metric, const StatisticsTable& statistics,
                            int64_t resamples, const Seed& seed);

// One system's cell of a paired test: its actual score, and the interval (bootstrap) and
// p-value against the baseline (none for the baseline itself).
struct PairedResult {
  double score = 0.0;
  std::optional<Interval> interval;
  std::optional<double> p_value;
};

enum class PairedTest { kBootstrap, kApproximateRandomization };

// sacreBLEU's PairedTest: results[m][s] for metric m and system s, the baseline first
// (systems[0]). Each system is compared with the baseline on its own generator seeded
// alike (so every pair sees the same samples); SACREBLEU_SEED=0 leaves them unseeded, as
// in sacreBLEU. Bootstrap also gives the baseline's interval; approximate randomization
// gives no intervals.
std::vector<std::vector<PairedResult>> paired_test(
    const std::vector<const TestedMetric*>& metrics,
    const std::vector<std::vector<std::string>>& systems, PairedTest test, int64_t samples,
    const Seed& seed);

// The correctly rounded mean of non-negative doubles, as Python's statistics.mean.
double exact_mean(const std::vector<double>& values);

}  // namespace thpc::metrics
