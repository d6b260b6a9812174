// chrF (Popović, 2015) and chrF++ (Popović, 2017) exactly as sacreBLEU 2.x computes them,
// so that a score printed here can be quoted next to a sacreBLEU chrF score.
//
// For each order n, character n-grams (n = 1..char_order, of the segment with its
// whitespace removed) and then word n-grams (n = 1..word_order, chrF++) give a precision
// P_n = matches / hypothesis n-grams and a recall R_n = matches / reference n-grams, a
// hypothesis n-gram matching at most as often as the reference has it. With β the
// weight of recall,
//
//   chrF_β = 100 · (1 + β²) · P · R / (β² · P + R)
//
// where P and R are the averages of P_n and R_n over the effective orders: those where
// both hypothesis and reference have n-grams (sacreBLEU's default since 2.0, signature
// eff:yes; no effective order at all scores 0). With eps_smoothing (chrF++.py's, Moses'
// and NLTK's way, eff:no) the score is instead the average over all orders of each
// order's F_β, an order without n-grams counting as precision or recall 1e-16.
//
// The counts are sums over the corpus before any division. For several references the
// segment's counts are those of the reference with the highest segment chrF (the first
// of equals). One quirk is kept because sacreBLEU has it: where the reference has no
// n-gram of an order (it is shorter than n characters), the hypothesis' n-grams of that
// order are not counted either.
//
// Defaults are sacreBLEU's: chrF2 (β = 2), character order 6, word order 0,
// case-sensitive, whitespace removed, effective orders. Characters are Unicode code
// points and whitespace is Python's str.isspace() set (metrics/tokenize.h). Text in and
// out is UTF-8.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace thpc::metrics {

struct ChrfOptions {
  int char_order = 6;          // sacreBLEU --chrf-char-order (-cc)
  int word_order = 0;          // --chrf-word-order (-cw): 2 = chrF++
  int beta = 2;                // --chrf-beta
  bool lowercase = false;      // --chrf-lowercase: Python str.lower() first
  bool whitespace = false;     // --chrf-whitespace: character n-grams keep whitespace
  bool eps_smoothing = false;  // --chrf-eps-smoothing: average F over all orders

  int orders() const { return char_order + word_order; }
};

// The highest n-gram order a score takes (BLEU's, chrF's character and word orders):
// each line's statistics hold every order, and `-cc 100000000` grew them until the
// machine's out-of-memory killer ended the run (BLEU uses 4, chrF 6 and 2).
inline constexpr int kHighestNgramOrder = 100;

// Throws thpc::Error unless the orders are ≥ 0 and at most kHighestNgramOrder with at
// least one above 0, and β ≥ 0.
void check_chrf_options(const ChrfOptions& options);

// The sufficient statistics of chrF: for each order (the character orders 1..char_order,
// then the word orders 1..word_order) the hypothesis n-grams, the reference n-grams and
// the matches. Corpus statistics are the sums over segments.
struct ChrfStatistics {
  std::vector<int64_t> hypothesis;  // 0 where the reference has no n-gram of the order
  std::vector<int64_t> reference;
  std::vector<int64_t> matches;

  explicit ChrfStatistics(int orders = 6)
      : hypothesis(orders, 0), reference(orders, 0), matches(orders, 0) {}
  void add(const ChrfStatistics& other);
};

// chrF in percent from statistics, each operation in sacreBLEU's order so that the
// double is the one Python computes.
double compute_chrf(const ChrfStatistics& statistics, const ChrfOptions& options);

// The character n-grams and word n-grams of one segment, counted per order.
struct SegmentNgrams;

// References read once, then any number of hypotheses scored against them.
class ChrfScorer {
 public:
  // references[r][i] is segment i of reference stream r; all streams have the same
  // length. An empty reference segment is a reference with no n-grams.
  ChrfScorer(const std::vector<std::vector<std::string>>& references, ChrfOptions options);
  ~ChrfScorer();
  ChrfScorer(ChrfScorer&&) noexcept;
  ChrfScorer& operator=(ChrfScorer&&) noexcept;

  size_t num_segments() const { return segments_.size(); }
  const ChrfOptions& options() const { return options_; }

  ChrfStatistics segment_statistics(size_t segment, std::string_view hypothesis) const;
  // hypotheses.size() must equal num_segments().
  ChrfStatistics corpus_statistics(const std::vector<std::string>& hypotheses) const;
  double corpus_score(const std::vector<std::string>& hypotheses) const;
  double sentence_score(size_t segment, std::string_view hypothesis) const;

  // sacreBLEU's name of the score: "chrF2", "chrF2++" with word order 2.
  std::string name() const;
  // "nrefs:1|case:mixed|eff:yes|nc:6|nw:0|space:no|version:2.x-compatible", sacreBLEU's
  // keys in its order (the name carries β).
  std::string signature() const;

 private:
  ChrfOptions options_;
  // segments_[i][r]: reference r of segment i.
  std::vector<std::vector<std::unique_ptr<const SegmentNgrams>>> segments_;
  int num_refs_ = 0;
};

// One-call forms of the above.
double corpus_chrf(const std::vector<std::string>& hypotheses,
                   const std::vector<std::vector<std::string>>& references,
                   const ChrfOptions& options = {});
double sentence_chrf(std::string_view hypothesis, const std::vector<std::string>& references,
                     const ChrfOptions& options = {});

}  // namespace thpc::metrics
