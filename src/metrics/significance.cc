#include "metrics/significance.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <random>
#include <string_view>

#include "common/error.h"
#include "metrics/numpy_random.h"

namespace thpc::metrics {
namespace {

// Python's arithmetic on PyNumbers under NumPy 2: float32 as soon as one side is a float32
// scalar (the Python float or int on the other side is first rounded to float32), double
// between Python floats.
PyNumber py(double value) { return {value, false}; }
PyNumber f32(float value) { return {value, true}; }
float as_float(PyNumber number) { return static_cast<float>(number.value); }
PyNumber operator+(PyNumber a, PyNumber b) {
  if (a.float32 || b.float32) return f32(as_float(a) + as_float(b));
  return py(a.value + b.value);
}
PyNumber operator*(PyNumber a, PyNumber b) {
  if (a.float32 || b.float32) return f32(as_float(a) * as_float(b));
  return py(a.value * b.value);
}
PyNumber operator/(PyNumber a, PyNumber b) {
  if (a.float32 || b.float32) return f32(as_float(a) / as_float(b));
  return py(a.value / b.value);
}

// sacreBLEU's my_log: a zero precision counts as log −9,999,999,999.
double log_or_floor(double precision) {
  return precision == 0.0 ? -9999999999.0 : std::log(precision);
}

// The statistics' signature text "nrefs:N|" + extra + the rest, from a scorer's signature,
// which starts with "nrefs:N|".
std::string with_extra(const std::string& signature, const std::string& extra) {
  const size_t bar = signature.find('|');
  THPC_CHECK(bar != std::string::npos, "signature without fields: " << signature);
  return signature.substr(0, bar + 1) + extra + signature.substr(bar + 1);
}

// BLEU's row: hyp_len, ref_len, the N clipped matches, the N hypothesis n-gram counts.
class TestedBleu : public TestedMetric {
 public:
  explicit TestedBleu(const BleuScorer& scorer) : scorer_(scorer) {}
  std::string name() const override { return "BLEU"; }
  std::string signature(const std::string& extra) const override {
    return with_extra(scorer_.signature(), extra);
  }
  StatisticsTable statistics(const std::vector<std::string>& hypotheses) const override {
    const size_t orders = static_cast<size_t>(scorer_.options().max_ngram_order);
    StatisticsTable table{2 + 2 * orders, {}};
    table.values.reserve(table.width * hypotheses.size());
    for (size_t i = 0; i < hypotheses.size(); ++i) {
      const BleuStatistics segment = scorer_.segment_statistics(i, hypotheses[i]);
      table.values.push_back(static_cast<double>(segment.hyp_len));
      table.values.push_back(static_cast<double>(segment.ref_len));
      for (int64_t m : segment.matches) table.values.push_back(static_cast<double>(m));
      for (int64_t t : segment.totals) table.values.push_back(static_cast<double>(t));
    }
    return table;
  }
  double score(const double* sums) const override {
    return compute_bleu(statistics_of(sums), scorer_.options()).score;
  }
  double randomized_score(const double* sums) const override {
    BleuOptions options = scorer_.options();
    // `correct[n - 1] += smooth_value` on a view of an int64 array keeps the integer part.
    if (options.smoothing == Smoothing::kAddK) {
      options.smooth_value = std::trunc(options.smooth_value.value_or(
          default_smooth_value(options.smoothing)));
    }
    return compute_bleu(statistics_of(sums), options).score;
  }
  // sacreBLEU's compute_bleu on a float32 array: the lengths go through int(), the
  // precisions are float32 (100. * correct[n] / total[n] with float32 operands), the
  // rest is Python's double arithmetic.
  PyNumber resampled_score(const float* sums) const override {
    const BleuOptions& options = scorer_.options();
    const int orders = options.max_ngram_order;
    const double smooth_value =
        options.smooth_value.value_or(default_smooth_value(options.smoothing));
    const auto sys_len = static_cast<int64_t>(sums[0]);
    const auto ref_len = static_cast<int64_t>(sums[1]);
    double brevity_penalty = 1.0;
    if (sys_len < ref_len) {
      brevity_penalty = sys_len > 0 ? std::exp(1.0 - static_cast<double>(ref_len) /
                                                         static_cast<double>(sys_len))
                                    : 0.0;
    }
    std::vector<PyNumber> correct, total;
    bool any_match = false;
    for (int n = 0; n < orders; ++n) {
      correct.push_back(f32(sums[2 + n]));
      total.push_back(f32(sums[2 + orders + n]));
      any_match = any_match || sums[2 + n] != 0.0f;
    }
    if (!any_match) return py(0.0);
    std::vector<PyNumber> precisions(orders, py(0.0));
    double smooth_mteval = 1.0;
    for (int n = 0; n < orders; ++n) {
      if (options.smoothing == Smoothing::kAddK && n > 0) {
        correct[n] = correct[n] + py(smooth_value);
        total[n] = total[n] + py(smooth_value);
      }
      if (total[n].value == 0.0) break;
      if (correct[n].value == 0.0) {
        if (options.smoothing == Smoothing::kExp) {
          smooth_mteval *= 2.0;
          precisions[n] = py(100.0) / (py(smooth_mteval) * total[n]);
        } else if (options.smoothing == Smoothing::kFloor) {
          precisions[n] = py(100.0 * smooth_value) / total[n];
        }
      } else {
        precisions[n] = py(100.0) * correct[n] / total[n];
      }
    }
    double log_sum = 0.0;
    for (const PyNumber& precision : precisions) log_sum += log_or_floor(precision.value);
    return py(brevity_penalty * std::exp(log_sum / orders));
  }

 private:
  BleuStatistics statistics_of(const double* sums) const {
    const int orders = scorer_.options().max_ngram_order;
    BleuStatistics statistics(orders);
    statistics.hyp_len = static_cast<int64_t>(sums[0]);
    statistics.ref_len = static_cast<int64_t>(sums[1]);
    for (int n = 0; n < orders; ++n) {
      statistics.matches[n] = static_cast<int64_t>(sums[2 + n]);
      statistics.totals[n] = static_cast<int64_t>(sums[2 + orders + n]);
    }
    return statistics;
  }
  const BleuScorer& scorer_;
};

// chrF's row: for each order, hypothesis n-grams, reference n-grams, matches (sacreBLEU's
// triplets).
class TestedChrf : public TestedMetric {
 public:
  explicit TestedChrf(const ChrfScorer& scorer) : scorer_(scorer) {}
  std::string name() const override { return scorer_.name(); }
  std::string signature(const std::string& extra) const override {
    return with_extra(scorer_.signature(), extra);
  }
  StatisticsTable statistics(const std::vector<std::string>& hypotheses) const override {
    const size_t orders = static_cast<size_t>(scorer_.options().orders());
    StatisticsTable table{3 * orders, {}};
    table.values.reserve(table.width * hypotheses.size());
    for (size_t i = 0; i < hypotheses.size(); ++i) {
      const ChrfStatistics segment = scorer_.segment_statistics(i, hypotheses[i]);
      for (size_t k = 0; k < orders; ++k) {
        table.values.push_back(static_cast<double>(segment.hypothesis[k]));
        table.values.push_back(static_cast<double>(segment.reference[k]));
        table.values.push_back(static_cast<double>(segment.matches[k]));
      }
    }
    return table;
  }
  double score(const double* sums) const override {
    const int orders = scorer_.options().orders();
    ChrfStatistics statistics(orders);
    for (int k = 0; k < orders; ++k) {
      statistics.hypothesis[k] = static_cast<int64_t>(sums[3 * k]);
      statistics.reference[k] = static_cast<int64_t>(sums[3 * k + 1]);
      statistics.matches[k] = static_cast<int64_t>(sums[3 * k + 2]);
    }
    return compute_chrf(statistics, scorer_.options());
  }
  // sacreBLEU's _compute_f_score on a float32 array, operation for operation: each
  // precision and recall is a float32, and so is every sum they enter.
  PyNumber resampled_score(const float* sums) const override {
    const ChrfOptions& options = scorer_.options();
    const int orders = options.orders();
    const PyNumber eps = py(1e-16);
    const PyNumber factor = py(static_cast<double>(options.beta) * options.beta);
    const PyNumber one = py(1.0);
    PyNumber score = py(0.0), average_precision = py(0.0), average_recall = py(0.0);
    int effective_orders = 0;
    for (int k = 0; k < orders; ++k) {
      const PyNumber hypothesis = f32(sums[3 * k]), reference = f32(sums[3 * k + 1]);
      const PyNumber matches = f32(sums[3 * k + 2]);
      const PyNumber precision = hypothesis.value > 0 ? matches / hypothesis : eps;
      const PyNumber recall = reference.value > 0 ? matches / reference : eps;
      const PyNumber denominator = factor * precision + recall;
      score = score + (denominator.value > 0
                           ? (one + factor) * precision * recall / denominator
                           : eps);
      if (hypothesis.value > 0 && reference.value > 0) {
        average_precision = average_precision + precision;
        average_recall = average_recall + recall;
        ++effective_orders;
      }
    }
    if (options.eps_smoothing) return py(100.0) * score / py(orders);
    if (effective_orders == 0) {
      average_precision = average_recall = py(0.0);
    } else {
      average_precision = average_precision / py(effective_orders);
      average_recall = average_recall / py(effective_orders);
    }
    if ((average_precision + average_recall).value == 0.0) return py(0.0);
    PyNumber f = (one + factor) * average_precision * average_recall;
    f = f / (factor * average_precision + average_recall);
    return py(100.0) * f;
  }

 private:
  const ChrfScorer& scorer_;
};

// TER's row: the fewest edits, the average reference length.
class TestedTer : public TestedMetric {
 public:
  explicit TestedTer(const TerScorer& scorer) : scorer_(scorer) {}
  std::string name() const override { return "TER"; }
  std::string signature(const std::string& extra) const override {
    return with_extra(scorer_.signature(), extra);
  }
  StatisticsTable statistics(const std::vector<std::string>& hypotheses) const override {
    StatisticsTable table{2, {}};
    table.values.reserve(2 * hypotheses.size());
    for (size_t i = 0; i < hypotheses.size(); ++i) {
      const TerStatistics segment = scorer_.segment_statistics(i, hypotheses[i]);
      table.values.push_back(static_cast<double>(segment.edits));
      table.values.push_back(segment.reference_length);
    }
    return table;
  }
  double score(const double* sums) const override {
    // A sum of edits is an integer; compute_ter's division is the same in double.
    TerStatistics statistics;
    statistics.edits = static_cast<int64_t>(sums[0]);
    statistics.reference_length = sums[1];
    return compute_ter(statistics);
  }
  PyNumber resampled_score(const float* sums) const override {
    const PyNumber edits = f32(sums[0]), length = f32(sums[1]);
    PyNumber rate = py(0.0);
    if (length.value > 0) {
      rate = edits / length;
    } else if (edits.value > 0) {
      rate = py(1.0);
    }
    return py(100.0) * rate;
  }

 private:
  const TerScorer& scorer_;
};

// The generator sacreBLEU makes: default_rng(seed), or default_rng(None) from the
// operating system's entropy (NumPy takes 128 bits of it).
NumpyGenerator make_generator(const std::optional<std::vector<uint32_t>>& seed) {
  if (seed) return NumpyGenerator(*seed);
  std::random_device device;
  std::vector<uint32_t> entropy(4);
  for (uint32_t& word : entropy) word = device();
  return NumpyGenerator(entropy);
}

// A bootstrap sample's statistics summed as NumPy sums `stats[idxs].sum(0)` in float32:
// row after row, in the order drawn.
void sum_rows(const std::vector<float>& rows, size_t width, const std::vector<int64_t>& drawn,
              std::vector<float>& sums) {
  std::fill(sums.begin(), sums.end(), 0.0f);
  for (int64_t index : drawn) {
    const float* row = rows.data() + static_cast<size_t>(index) * width;
    for (size_t k = 0; k < width; ++k) sums[k] += row[k];
  }
}

std::vector<float> as_float32(const StatisticsTable& table) {
  return std::vector<float>(table.values.begin(), table.values.end());
}

// The scores of `resamples` bootstrap samples drawn from `generator`, each as Python
// computed it.
std::vector<PyNumber> resampled_scores(const TestedMetric& metric, const StatisticsTable& table,
                                       int64_t resamples, NumpyGenerator& generator) {
  const std::vector<float> rows = as_float32(table);
  std::vector<float> sums(table.width);
  std::vector<PyNumber> scores;
  scores.reserve(static_cast<size_t>(resamples));
  for (int64_t r = 0; r < resamples; ++r) {
    // rng.choice(N, size=(R, N)) fills row after row; one row per call draws the same.
    const std::vector<int64_t> drawn =
        generator.choice(static_cast<int64_t>(table.segments()), table.segments());
    sum_rows(rows, table.width, drawn, sums);
    scores.push_back(metric.resampled_score(sums.data()));
  }
  return scores;
}

// np.array(scores): float32 when every score is a float32 scalar, else float64.
bool all_float32(const std::vector<PyNumber>& numbers) {
  return std::all_of(numbers.begin(), numbers.end(),
                     [](const PyNumber& number) { return number.float32; });
}

// sacreBLEU's significance.estimate_ci on np.array(scores): mean and half the 95% range,
// in the array's type (NumPy's pairwise mean).
Interval numpy_interval(const std::vector<PyNumber>& scores) {
  const size_t n = scores.size();
  const size_t lower = n / 40, upper = n - lower - 1;
  if (all_float32(scores)) {
    std::vector<float> values;
    for (const PyNumber& score : scores) values.push_back(as_float(score));
    // Sorted first: the mean's pairwise sum runs over the sorted array.
    std::sort(values.begin(), values.end());
    return {numpy_mean(values), static_cast<float>(0.5f * (values[upper] - values[lower]))};
  }
  std::vector<double> values;
  for (const PyNumber& score : scores) values.push_back(score.value);
  std::sort(values.begin(), values.end());
  return {numpy_mean(values), 0.5 * (values[upper] - values[lower])};
}

// _compute_p_value: (1 + the count of statistics above the actual difference) / (n + 1).
double p_value(int64_t above, size_t samples) {
  return static_cast<double>(above + 1) / static_cast<double>(samples + 1);
}

// One system against the baseline by paired bootstrap resampling (_paired_bs_test).
PairedResult paired_bootstrap(const TestedMetric& metric, const StatisticsTable& baseline,
                              double baseline_score, const StatisticsTable& system,
                              int64_t samples, const std::optional<std::vector<uint32_t>>& seed) {
  PairedResult result;
  result.score = corpus_score(metric, system);
  NumpyGenerator generator = make_generator(seed);
  const std::vector<float> baseline_rows = as_float32(baseline), system_rows = as_float32(system);
  std::vector<float> sums(system.width);
  std::vector<PyNumber> baseline_scores, system_scores;
  for (int64_t r = 0; r < samples; ++r) {
    const std::vector<int64_t> drawn =
        generator.choice(static_cast<int64_t>(system.segments()), system.segments());
    sum_rows(baseline_rows, baseline.width, drawn, sums);
    baseline_scores.push_back(metric.resampled_score(sums.data()));
    sum_rows(system_rows, system.width, drawn, sums);
    system_scores.push_back(metric.resampled_score(sums.data()));
  }
  result.interval = numpy_interval(system_scores);
  const double difference = std::abs(baseline_score - result.score);
  // sample_diffs = |sys − bl| in the arrays' common type (float64 unless both are float32);
  // stats = sample_diffs − mean; the actual difference, a Python float, compared in that
  // type.
  int64_t above = 0;
  if (all_float32(baseline_scores) && all_float32(system_scores)) {
    std::vector<float> differences;
    for (size_t r = 0; r < system_scores.size(); ++r) {
      differences.push_back(std::abs(as_float(system_scores[r]) - as_float(baseline_scores[r])));
    }
    const float mean = numpy_mean(differences);
    const auto threshold = static_cast<float>(difference);
    for (float d : differences) above += (d - mean) > threshold ? 1 : 0;
  } else {
    std::vector<double> differences;
    for (size_t r = 0; r < system_scores.size(); ++r) {
      differences.push_back(std::abs(system_scores[r].value - baseline_scores[r].value));
    }
    const double mean = numpy_mean(differences);
    for (double d : differences) above += (d - mean) > difference ? 1 : 0;
  }
  result.p_value = p_value(above, system_scores.size());
  return result;
}

// One system against the baseline by approximate randomization (_paired_ar_test): trial t
// takes segment i's statistics from the baseline where the coin shows true (pseudo-system
// a) and from the system otherwise; b is the other way round.
PairedResult paired_randomization(const TestedMetric& metric, const StatisticsTable& baseline,
                                  double baseline_score, const StatisticsTable& system,
                                  int64_t trials,
                                  const std::optional<std::vector<uint32_t>>& seed) {
  PairedResult result;
  result.score = corpus_score(metric, system);
  const double difference = std::abs(baseline_score - result.score);
  NumpyGenerator generator = make_generator(seed);
  const size_t segments = system.segments(), width = system.width;
  // pos_sel = rng.integers(2, size=(T, N), dtype=bool), drawn at once: its bits are one
  // stream that rows do not restart.
  const std::vector<bool> coins = generator.coin_flips(static_cast<size_t>(trials) * segments);
  // shuf_a = pos_sel @ bl_stats + neg_sel @ sys_stats: each product sums its rows in
  // segment order (zeros for the rows not taken add nothing), and the two sums are added
  // last, which for TER's fractional lengths is not the sum in segment order.
  std::vector<double> a(width), b(width), a_system(width), b_system(width);
  int64_t above = 0;
  for (int64_t t = 0; t < trials; ++t) {
    for (std::vector<double>* sums : {&a, &b, &a_system, &b_system}) {
      std::fill(sums->begin(), sums->end(), 0.0);
    }
    for (size_t i = 0; i < segments; ++i) {
      const bool from_baseline = coins[static_cast<size_t>(t) * segments + i];
      double* to_baseline = from_baseline ? a.data() : b.data();
      double* to_system = from_baseline ? b_system.data() : a_system.data();
      for (size_t k = 0; k < width; ++k) {
        to_baseline[k] += baseline.row(i)[k];
        to_system[k] += system.row(i)[k];
      }
    }
    for (size_t k = 0; k < width; ++k) {
      a[k] += a_system[k];
      b[k] += b_system[k];
    }
    const double trial_difference =
        std::abs(metric.randomized_score(a.data()) - metric.randomized_score(b.data()));
    above += trial_difference > difference ? 1 : 0;
  }
  result.p_value = p_value(above, static_cast<size_t>(trials));
  return result;
}

}  // namespace

double corpus_score(const TestedMetric& metric, const StatisticsTable& table) {
  std::vector<double> sums(table.width, 0.0);
  for (size_t i = 0; i < table.segments(); ++i) {
    for (size_t k = 0; k < table.width; ++k) sums[k] += table.row(i)[k];
  }
  return metric.score(sums.data());
}

std::unique_ptr<TestedMetric> tested_bleu(const BleuScorer& scorer) {
  return std::make_unique<TestedBleu>(scorer);
}
std::unique_ptr<TestedMetric> tested_chrf(const ChrfScorer& scorer) {
  return std::make_unique<TestedChrf>(scorer);
}
std::unique_ptr<TestedMetric> tested_ter(const TerScorer& scorer) {
  return std::make_unique<TestedTer>(scorer);
}

bool Seed::is_zero() const {
  return words && std::all_of(words->begin(), words->end(), [](uint32_t w) { return w == 0; });
}

Seed seed_from_environment() {
  const char* variable = std::getenv("SACREBLEU_SEED");
  Seed seed{std::vector<uint32_t>{12345}, "12345", "12345"};
  if (variable == nullptr) return seed;
  seed.text = variable;
  for (char& c : seed.text) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (seed.text == "none") {
    seed.words.reset();
    seed.integer = "none";
    return seed;
  }
  // Python's int(): surrounding whitespace, a '+', underscores between digits.
  const auto refuse = [&] {
    THPC_FAIL("SACREBLEU_SEED='" << variable << "' is not a seed: give a whole number from 0 "
              "(as Python's int() reads it), or none for a seed from the operating system");
  };
  std::string_view text = seed.text;
  const auto is_space = [](char c) { return c == ' ' || (c >= '\t' && c <= '\r'); };
  while (!text.empty() && is_space(text.front())) text.remove_prefix(1);
  while (!text.empty() && is_space(text.back())) text.remove_suffix(1);
  if (!text.empty() && text.front() == '+') text.remove_prefix(1);
  std::string digits;
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] >= '0' && text[i] <= '9') {
      digits += text[i];
    } else if (text[i] != '_' || i == 0 || i + 1 == text.size() || text[i + 1] == '_') {
      refuse();
    }
  }
  if (digits.empty()) refuse();
  // The decimal digits into 32-bit words: words = words · 10 + digit.
  std::vector<uint32_t> words = {0};
  for (const char digit : digits) {
    uint64_t carry = static_cast<uint64_t>(digit - '0');
    for (uint32_t& word : words) {
      const uint64_t value = static_cast<uint64_t>(word) * 10 + carry;
      word = static_cast<uint32_t>(value);
      carry = value >> 32;
    }
    if (carry != 0) words.push_back(static_cast<uint32_t>(carry));
  }
  seed.words = words;
  const size_t first = digits.find_first_not_of('0');
  seed.integer = first == std::string::npos ? "0" : digits.substr(first);
  return seed;
}

Interval bootstrap_interval(const TestedMetric& metric, const StatisticsTable& statistics,
                            int64_t resamples, const Seed& seed) {
  THPC_CHECK(resamples > 1 && statistics.segments() > 0,
             "bootstrap of " << resamples << " samples of " << statistics.segments()
                             << " segments");
  NumpyGenerator generator = make_generator(seed.words);
  std::vector<PyNumber> scores = resampled_scores(metric, statistics, resamples, generator);
  // Score.estimate_ci: sorted Python numbers, 0.5 * (upper − lower) in their type, and
  // statistics.mean: exact, rounded once to a double (to float32 for float32 scalars:
  // NumPy's float32 of Python's float of the exact fraction).
  std::vector<double> values;
  for (const PyNumber& score : scores) values.push_back(score.value);
  std::vector<double> sorted = values;
  std::sort(sorted.begin(), sorted.end());
  const size_t lower = sorted.size() / 40, upper = sorted.size() - lower - 1;
  if (all_float32(scores)) {
    const auto low = static_cast<float>(sorted[lower]), high = static_cast<float>(sorted[upper]);
    return {static_cast<float>(exact_mean(values)), 0.5f * (high - low)};
  }
  return {exact_mean(values), 0.5 * (sorted[upper] - sorted[lower])};
}

std::vector<std::vector<PairedResult>> paired_test(
    const std::vector<const TestedMetric*>& metrics,
    const std::vector<std::vector<std::string>>& systems, PairedTest test, int64_t samples,
    const Seed& seed) {
  THPC_CHECK(systems.size() >= 2 && samples >= 1,
             systems.size() << " systems, " << samples << " samples");
  // PairedTest: `seed if seed else None`: a seed of 0 leaves each pair's generator unseeded.
  std::optional<std::vector<uint32_t>> pair_seed;
  if (seed.words && !seed.is_zero()) pair_seed = seed.words;
  std::vector<std::vector<PairedResult>> results;
  for (const TestedMetric* metric : metrics) {
    std::vector<PairedResult>& row = results.emplace_back();
    const StatisticsTable baseline = metric->statistics(systems[0]);
    const double baseline_score = corpus_score(*metric, baseline);
    PairedResult baseline_result;
    baseline_result.score = baseline_score;
    if (test == PairedTest::kBootstrap) {
      // The baseline's interval from _bootstrap_resample, seeded from SACREBLEU_SEED as
      // read there (0 stays 0).
      NumpyGenerator generator = make_generator(seed.words);
      baseline_result.interval =
          numpy_interval(resampled_scores(*metric, baseline, samples, generator));
    }
    row.push_back(baseline_result);
    for (size_t s = 1; s < systems.size(); ++s) {
      const StatisticsTable system = metric->statistics(systems[s]);
      row.push_back(test == PairedTest::kBootstrap
                        ? paired_bootstrap(*metric, baseline, baseline_score, system, samples,
                                           pair_seed)
                        : paired_randomization(*metric, baseline, baseline_score, system,
                                               samples, pair_seed));
    }
  }
  return results;
}

// GCC's and Clang's 128-bit integer (-Wpedantic: not ISO C++).
__extension__ using Uint128 = unsigned __int128;

// The exact sum as an integer multiple of 2^-1074 (the smallest subnormal): every finite
// double is one. The limbs hold 2^-1074 up to 2^1026 with room for 2^40 values; then the
// division by n, and one rounding to nearest, ties to even.
double exact_mean(const std::vector<double>& values) {
  THPC_CHECK(!values.empty(), "mean of no values");
  constexpr int kLimbs = 35;  // 2,240 bits
  std::vector<uint64_t> limbs(kLimbs, 0);
  for (double value : values) {
    THPC_CHECK(value >= 0 && std::isfinite(value), "exact_mean of " << value);
    if (value == 0) continue;
    int exponent = 0;
    const double fraction = std::frexp(value, &exponent);  // value = fraction · 2^exponent
    // value = mantissa · 2^(exponent − 53), mantissa < 2^53; shifted to units of 2^-1074.
    auto mantissa = static_cast<uint64_t>(std::ldexp(fraction, 53));
    int shift = exponent - 53 + 1074;
    if (shift < 0) {  // a subnormal: its low bits are zero
      mantissa >>= -shift;
      shift = 0;
    }
    const size_t limb = static_cast<size_t>(shift) / 64;
    const int bit = shift % 64;
    Uint128 carry = static_cast<Uint128>(mantissa) << bit;
    for (size_t i = limb; carry != 0; ++i) {
      THPC_CHECK(i < limbs.size(), "exact_mean overflow");
      const Uint128 sum = static_cast<Uint128>(limbs[i]) +
                                    static_cast<uint64_t>(carry);
      limbs[i] = static_cast<uint64_t>(sum);
      carry = (carry >> 64) + (sum >> 64);
    }
  }
  // Long division by n, from the top limb.
  const uint64_t n = values.size();
  Uint128 remainder = 0;
  for (size_t i = limbs.size(); i-- > 0;) {
    const Uint128 current = (remainder << 64) | limbs[i];
    limbs[i] = static_cast<uint64_t>(current / n);
    remainder = current % n;
  }
  // The top 64 bits of the quotient, and whether anything below them is nonzero.
  size_t top = limbs.size();
  while (top > 0 && limbs[top - 1] == 0) --top;
  if (top == 0) return remainder == 0 ? 0.0 : std::ldexp(1.0, -1074);
  const int leading = __builtin_clzll(limbs[top - 1]);
  const int highest_bit = static_cast<int>(64 * (top - 1)) + 63 - leading;  // of the quotient
  uint64_t head = 0;
  bool sticky = remainder != 0;
  const auto bit_at = [&](int position) {
    return position >= 0 && (limbs[static_cast<size_t>(position) / 64] >> (position % 64)) & 1;
  };
  for (int position = highest_bit; position > highest_bit - 64; --position) {
    head = (head << 1) | (bit_at(position) ? 1 : 0);
  }
  for (int position = highest_bit - 64; position >= 0 && !sticky; --position) {
    sticky = bit_at(position);
  }
  // head holds bits highest_bit .. highest_bit − 63; keep 53 and round.
  uint64_t mantissa = head >> 11;
  const uint64_t rest = head & 0x7FF;
  if (rest > 0x400 || (rest == 0x400 && (sticky || (mantissa & 1)))) ++mantissa;
  return std::ldexp(static_cast<double>(mantissa), highest_bit - 52 - 1074);
}

}  // namespace thpc::metrics
