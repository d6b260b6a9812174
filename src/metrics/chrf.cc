#include "metrics/chrf.h"

#include <algorithm>
#include <sstream>
#include <utility>

#include "common/error.h"
#include "common/still_working.h"
#include "metrics/tokenize.h"

namespace thpc::metrics {

// The n-grams of one segment. The n-grams are views of `characters` and `words`, so the
// object is never copied or moved once counted (the scorer holds it by pointer).
struct SegmentNgrams {
  // The distinct n-grams of one order in increasing order, each with its count: two
  // segments' matches are one merge of their lists, with no hashing or allocation per
  // n-gram (chrF has several times more n-grams than BLEU).
  using Counts = std::vector<std::pair<std::u32string_view, int64_t>>;

  std::u32string characters;   // the segment, its whitespace removed unless kept
  std::u32string words;        // the words of chrF++'s split, joined by one space
  std::vector<Counts> counts;  // per order: character orders, then word orders
  std::vector<int64_t> totals;  // n-grams per order

  SegmentNgrams() = default;
  SegmentNgrams(const SegmentNgrams&) = delete;
  SegmentNgrams& operator=(const SegmentNgrams&) = delete;
};

namespace {

// Python's string.punctuation, which sacreBLEU's chrF++ word split separates.
bool is_ascii_punctuation(char32_t c) {
  return (c >= U'!' && c <= U'/') || (c >= U':' && c <= U'@') || (c >= U'[' && c <= U'`') ||
         (c >= U'{' && c <= U'~');
}

// chrF++'s words (sacreBLEU after m-popovic/chrF): the whitespace-separated words with one
// punctuation character split off the end of a word, or else off its start; a word of
// one character stays whole. "(hi)" becomes "(hi" and ")", as in sacreBLEU (its #124).
std::vector<std::u32string_view> chrf_words(std::u32string_view text) {
  std::vector<std::u32string_view> words;
  for (std::u32string_view word : python_split(text)) {
    if (word.size() > 1 && is_ascii_punctuation(word.back())) {
      words.push_back(word.substr(0, word.size() - 1));
      words.push_back(word.substr(word.size() - 1));
    } else if (word.size() > 1 && is_ascii_punctuation(word.front())) {
      words.push_back(word.substr(0, 1));
      words.push_back(word.substr(1));
    } else {
      words.push_back(word);
    }
  }
  return words;
}

// Counts the character n-grams of `text`, n = 1..max_order, into counts[n - 1]. One sort
// serves every order: the positions sorted by the max_order characters from each list
// the n-grams of every order n in order too (truncating keeps the order), equal n-grams
// next to each other; two neighbours are the same n-gram when they share n characters.
void count_characters(std::u32string_view text, int max_order, SegmentNgrams& ngrams) {
  const size_t length = text.size();
  const size_t longest = static_cast<size_t>(max_order);
  std::vector<size_t> sorted(length);
  for (size_t i = 0; i < length; ++i) sorted[i] = i;
  std::sort(sorted.begin(), sorted.end(), [&](size_t a, size_t b) {
    return text.substr(a, longest) < text.substr(b, longest);
  });
  // shared[j]: the characters sorted[j - 1] and sorted[j] begin with alike, ≤ max_order.
  std::vector<size_t> shared(length, 0);
  for (size_t j = 1; j < length; ++j) {
    const std::u32string_view a = text.substr(sorted[j - 1], longest);
    const std::u32string_view b = text.substr(sorted[j], longest);
    size_t same = 0;
    while (same < a.size() && same < b.size() && a[same] == b[same]) ++same;
    shared[j] = same;
  }
  for (size_t n = 1; n <= longest; ++n) {
    SegmentNgrams::Counts& counts = ngrams.counts[n - 1];
    for (size_t j = 0; j < length; ++j) {
      if (length - sorted[j] < n) continue;  // too near the end for an n-gram
      // A neighbour shorter than n shares fewer than n characters, so shared[j] ≥ n
      // means sorted[j - 1] began the same n-gram, the last one counted.
      if (j > 0 && shared[j] >= n) {
        ++counts.back().second;
      } else {
        counts.emplace_back(text.substr(sorted[j], n), 1);
      }
    }
    ngrams.totals[n - 1] = length >= n ? static_cast<int64_t>(length - n + 1) : 0;
  }
}

// Counts the word n-grams, n = 1..max_order, into counts[first + n - 1]: `words` is the
// words joined by single spaces, word i spanning starts[i] to ends[i] (exclusive), so
// the n-gram from word i is the span from starts[i] to ends[i + n - 1].
void count_words(std::u32string_view words, const std::vector<size_t>& starts,
                 const std::vector<size_t>& ends, int max_order, size_t first,
                 SegmentNgrams& ngrams) {
  const int units = static_cast<int>(starts.size());
  std::vector<std::u32string_view> all;
  for (int n = 1; n <= max_order; ++n) {
    all.clear();
    for (int start = 0; start + n <= units; ++start) {
      all.push_back(words.substr(starts[start], ends[start + n - 1] - starts[start]));
    }
    std::sort(all.begin(), all.end());
    SegmentNgrams::Counts& counts = ngrams.counts[first + n - 1];
    for (const std::u32string_view ngram : all) {
      if (counts.empty() || counts.back().first != ngram) counts.emplace_back(ngram, 0);
      ++counts.back().second;
    }
    ngrams.totals[first + n - 1] = static_cast<int64_t>(all.size());
  }
}

std::unique_ptr<SegmentNgrams> extract_ngrams(std::u32string text, const ChrfOptions& options) {
  if (options.lowercase) text = python_lower(text);
  auto ngrams = std::make_unique<SegmentNgrams>();
  ngrams->counts.resize(options.orders());
  ngrams->totals.assign(options.orders(), 0);

  // Character n-grams of ''.join(text.split()), or of the text itself with whitespace.
  if (options.whitespace) {
    ngrams->characters = text;
  } else {
    for (std::u32string_view word : python_split(text)) ngrams->characters += word;
  }
  count_characters(ngrams->characters, options.char_order, *ngrams);

  if (options.word_order > 0) {
    std::vector<size_t> starts;
    std::vector<size_t> ends;
    for (std::u32string_view word : chrf_words(text)) {
      if (!ngrams->words.empty()) ngrams->words += U' ';
      starts.push_back(ngrams->words.size());
      ngrams->words += word;
      ends.push_back(ngrams->words.size());
    }
    count_words(ngrams->words, starts, ends, options.word_order,
                static_cast<size_t>(options.char_order), *ngrams);
  }
  return ngrams;
}

// The statistics of a hypothesis against one reference.
ChrfStatistics match(const SegmentNgrams& hypothesis, const SegmentNgrams& reference) {
  const int orders = static_cast<int>(hypothesis.counts.size());
  ChrfStatistics statistics(orders);
  for (int k = 0; k < orders; ++k) {
    const SegmentNgrams::Counts& mine = hypothesis.counts[k];
    const SegmentNgrams::Counts& theirs = reference.counts[k];
    // An n-gram matches as often as both sides have it: merge the two sorted lists.
    int64_t matches = 0;
    for (auto h = mine.begin(), r = theirs.begin(); h != mine.end() && r != theirs.end();) {
      const int order = h->first.compare(r->first);
      if (order == 0) matches += std::min(h->second, r->second);
      if (order <= 0) ++h;
      if (order >= 0) ++r;
    }
    // sacreBLEU counts no hypothesis n-grams of an order the reference has none of.
    statistics.hypothesis[k] = theirs.empty() ? 0 : hypothesis.totals[k];
    statistics.reference[k] = reference.totals[k];
    statistics.matches[k] = matches;
  }
  return statistics;
}

}  // namespace

void check_chrf_options(const ChrfOptions& options) {
  if (options.char_order < 0) THPC_FAIL("chrF character order " << options.char_order << " < 0");
  if (options.word_order < 0) THPC_FAIL("chrF word order " << options.word_order << " < 0");
  for (const auto& [order, name] : {std::pair{options.char_order, "character"},
                                    std::pair{options.word_order, "word"}}) {
    if (order > kHighestNgramOrder) {
      THPC_FAIL("chrF " << name << " order " << order << " is above " << kHighestNgramOrder
                        << ": every line's statistics hold each order (chrF uses 6 "
                        << "characters, chrF++ adds 2 words)");
    }
  }
  if (options.orders() == 0) THPC_FAIL("chrF needs a character or a word order above 0");
  if (options.beta < 0) THPC_FAIL("chrF beta " << options.beta << " < 0");
}

void ChrfStatistics::add(const ChrfStatistics& other) {
  THPC_CHECK(other.matches.size() == matches.size(), "chrF orders differ");
  for (size_t k = 0; k < matches.size(); ++k) {
    hypothesis[k] += other.hypothesis[k];
    reference[k] += other.reference[k];
    matches[k] += other.matches[k];
  }
}

double compute_chrf(const ChrfStatistics& statistics, const ChrfOptions& options) {
  const int orders = options.orders();
  THPC_CHECK(static_cast<int>(statistics.matches.size()) == orders,
             "statistics have " << statistics.matches.size() << " orders, options " << orders);
  // sacreBLEU's stand-in for a precision or recall without n-grams, and for the F of an
  // order whose precision and recall are both 0 (only eps_smoothing's average uses it).
  constexpr double kEps = 1e-16;
  const double factor = static_cast<double>(options.beta) * options.beta;  // β², exact
  double f_sum = 0.0;
  double precision_sum = 0.0;
  double recall_sum = 0.0;
  int effective_orders = 0;
  for (int k = 0; k < orders; ++k) {
    const int64_t hypothesis = statistics.hypothesis[k];
    const int64_t reference = statistics.reference[k];
    const double matches = static_cast<double>(statistics.matches[k]);
    const double precision = hypothesis > 0 ? matches / static_cast<double>(hypothesis) : kEps;
    const double recall = reference > 0 ? matches / static_cast<double>(reference) : kEps;
    // F_β of the order, as chrF++.py: (1 + β²) P R / (β² P + R).
    const double denominator = factor * precision + recall;
    f_sum += denominator > 0.0 ? (1.0 + factor) * precision * recall / denominator : kEps;
    if (hypothesis > 0 && reference > 0) {
      precision_sum += precision;
      recall_sum += recall;
      ++effective_orders;
    }
  }
  if (options.eps_smoothing) return 100.0 * f_sum / orders;

  // F_β of the average precision and recall over the effective orders.
  const double precision = effective_orders > 0 ? precision_sum / effective_orders : 0.0;
  const double recall = effective_orders > 0 ? recall_sum / effective_orders : 0.0;
  if (precision + recall == 0.0) return 0.0;
  double score = (1.0 + factor) * precision * recall;
  score /= factor * precision + recall;
  return 100.0 * score;
}

ChrfScorer::ChrfScorer(const std::vector<std::vector<std::string>>& references,
                       ChrfOptions options)
    : options_(options) {
  check_chrf_options(options_);
  const size_t num_segments = reference_segments(references);
  segments_.resize(num_segments);
  for (size_t i = 0; i < num_segments; ++i) {
    for (size_t r = 0; r < references.size(); ++r) {
      // sacreBLEU reads no whitespace away here: its command line rstrip()s each line
      // (read_segments does too), its library takes the strings as they are.
      segments_[i].push_back(extract_ngrams(decode_segment(references[r][i], r, i), options_));
    }
    show_still_working();  // a rank's validation set, which the other ranks wait for
  }
  num_refs_ = static_cast<int>(references.size());
}

ChrfScorer::~ChrfScorer() = default;
ChrfScorer::ChrfScorer(ChrfScorer&&) noexcept = default;
ChrfScorer& ChrfScorer::operator=(ChrfScorer&&) noexcept = default;

ChrfStatistics ChrfScorer::segment_statistics(size_t segment, std::string_view hypothesis) const {
  THPC_CHECK(segment < segments_.size(), "segment " << segment << " of " << segments_.size());
  const std::unique_ptr<SegmentNgrams> ngrams =
      extract_ngrams(decode_segment(hypothesis, std::nullopt, segment), options_);
  // The reference whose segment chrF is highest; the first of equals.
  std::optional<ChrfStatistics> best;
  double best_score = -1.0;
  for (const std::unique_ptr<const SegmentNgrams>& reference : segments_[segment]) {
    ChrfStatistics statistics = match(*ngrams, *reference);
    const double score = compute_chrf(statistics, options_);
    if (score > best_score) {
      best_score = score;
      best = std::move(statistics);
    }
  }
  return best.value_or(ChrfStatistics(options_.orders()));
}

ChrfStatistics ChrfScorer::corpus_statistics(const std::vector<std::string>& hypotheses) const {
  if (hypotheses.size() != segments_.size()) {
    THPC_FAIL(hypotheses.size() << " hypotheses for " << segments_.size()
                                << " reference segments");
  }
  ChrfStatistics total(options_.orders());
  for (size_t i = 0; i < hypotheses.size(); ++i) {
    total.add(segment_statistics(i, hypotheses[i]));
    show_still_working();  // rank 0 scores a validation alone while the others wait
  }
  return total;
}

double ChrfScorer::corpus_score(const std::vector<std::string>& hypotheses) const {
  return compute_chrf(corpus_statistics(hypotheses), options_);
}

double ChrfScorer::sentence_score(size_t segment, std::string_view hypothesis) const {
  return compute_chrf(segment_statistics(segment, hypothesis), options_);
}

std::string ChrfScorer::name() const {
  return "chrF" + std::to_string(options_.beta) + std::string(options_.word_order, '+');
}

std::string ChrfScorer::signature() const {
  std::ostringstream out;
  out << "nrefs:" << num_refs_ << "|case:" << (options_.lowercase ? "lc" : "mixed")
      << "|eff:" << (options_.eps_smoothing ? "no" : "yes") << "|nc:" << options_.char_order
      << "|nw:" << options_.word_order << "|space:" << (options_.whitespace ? "yes" : "no")
      << "|version:2.x-compatible";
  return out.str();
}

double corpus_chrf(const std::vector<std::string>& hypotheses,
                   const std::vector<std::vector<std::string>>& references,
                   const ChrfOptions& options) {
  return ChrfScorer(references, options).corpus_score(hypotheses);
}

double sentence_chrf(std::string_view hypothesis, const std::vector<std::string>& references,
                     const ChrfOptions& options) {
  return ChrfScorer(single_segment_streams(references), options).sentence_score(0, hypothesis);
}

}  // namespace thpc::metrics
