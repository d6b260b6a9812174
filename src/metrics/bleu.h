// BLEU (Papineni et al., 2002) exactly as sacreBLEU 2.x computes it, so that a score
// printed here can be quoted next to a sacreBLEU score:
//
//   BLEU = BP · exp( (1/N) Σ_{n=1..N} log p_n ),   BP = min(1, exp(1 − r/c))
//
// with p_n the clipped n-gram precision over the whole corpus (matches are clipped by
// the largest count of that n-gram in any one reference of the segment), c the
// hypothesis length in tokens and r the effective reference length: the sum over
// segments of the reference length closest to the hypothesis length, the shorter one
// on ties. Scores are in percent, as sacreBLEU prints them.
//
// Defaults are sacreBLEU's: 13a tokenisation, case-sensitive, N = 4, exponential
// smoothing (mteval-v13a's: the k-th order with zero matches counts as 1/2^k
// matches). Text in and out is UTF-8.
#pragma once

#include <cstdint>
#include <istream>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "metrics/tokenize.h"

namespace sentencepiece {
class SentencePieceProcessor;
}

namespace thpc::metrics {

// Chen & Cherry (2014) smoothing, as sacreBLEU names them:
//   none  — zero matches make the score 0;
//   floor — zero matches count as smooth_value (default 0.1) matches;
//   add-k — for n > 1, smooth_value (default 1) is added to matches and totals;
//   exp   — the k-th zero-match order counts as 1/2^k matches (mteval-v13a).
enum class Smoothing { kNone, kFloor, kAddK, kExp };

Smoothing parse_smoothing(const std::string& name);  // throws thpc::Error if unknown
std::string smoothing_name(Smoothing smoothing);
// floor 0.1, add-k 1; none and exp take no value (0).
double default_smooth_value(Smoothing smoothing);

struct BleuOptions {
  TokenizerKind tokenizer = TokenizerKind::k13a;
  // A SentencePiece tokenizer's model (load_sacrebleu_model), set exactly when
  // `tokenizer` is one.
  std::shared_ptr<const sentencepiece::SentencePieceProcessor> sentencepiece;
  bool lowercase = false;                // Python str.lower() before tokenising
  Smoothing smoothing = Smoothing::kExp;
  std::optional<double> smooth_value;    // nullopt: the method's default
  int max_ngram_order = 4;               // N
  // Average over the orders up to the highest one with any hypothesis n-gram
  // instead of always over N: what sentence-level BLEU needs for short sentences.
  bool effective_order = false;
};

// The sufficient statistics of BLEU; corpus statistics are the sums over segments.
struct BleuStatistics {
  int64_t hyp_len = 0;
  int64_t ref_len = 0;               // closest reference length
  std::vector<int64_t> matches;      // clipped matches, n = 1..N
  std::vector<int64_t> totals;       // hypothesis n-grams, n = 1..N

  explicit BleuStatistics(int max_ngram_order = 4)
      : matches(max_ngram_order, 0), totals(max_ngram_order, 0) {}
  void add(const BleuStatistics& other);
};

// The reference side of one segment, for clipping: each n-gram's largest count in any
// one reference, and each reference's length. Shared by BleuScorer and multi-bleu.perl's
// BLEU (metrics/multi_bleu.h), which clip alike and differ only in tokens and formula.
struct ReferenceNgrams {
  std::unordered_map<std::string, int64_t> max_counts;  // n-gram (tokens joined by ' ')
  std::vector<int64_t> lengths;                         // tokens in each reference
  // One more reference of the segment, already split into tokens (without whitespace).
  void add_reference(const std::vector<std::string>& tokens, int max_ngram_order);
};

// Adds the hypothesis' n-grams to statistics.totals and their counts clipped by
// `references` to statistics.matches (orders 1..statistics.matches.size()); lengths
// are left to the caller, whose closest-length rules differ.
void add_clipped_matches(const std::vector<std::string>& hypothesis_tokens,
                         const ReferenceNgrams& references, BleuStatistics& statistics);

struct BleuScore {
  double score = 0.0;               // percent
  std::vector<double> counts;       // matches, after add-k smoothing where used
  std::vector<double> totals;       // hypothesis n-grams, after add-k where used
  std::vector<double> precisions;   // percent, smoothed
  double brevity_penalty = 0.0;
  int64_t hyp_len = 0;
  int64_t ref_len = 0;
  double ratio = 0.0;               // hyp_len / ref_len (0 when ref_len is 0)

  // sacreBLEU's verbose part:
  // "82.4/50.0/45.5/37.5 (BP = 0.943 ratio = 0.944 hyp_len = 17 ref_len = 18)".
  std::string verbose() const;
};

// BLEU from statistics, with sacreBLEU's smoothing and effective-order rules.
BleuScore compute_bleu(const BleuStatistics& statistics, const BleuOptions& options);

// References tokenised once, then any number of hypotheses scored against them.
class BleuScorer {
 public:
  // references[r][i] is segment i of reference stream r; all streams have the same
  // length. An empty reference segment counts, as in sacreBLEU 2.6: length 0, no
  // n-grams (it can still be the closest length to a short hypothesis).
  BleuScorer(const std::vector<std::vector<std::string>>& references, BleuOptions options);

  size_t num_segments() const { return segments_.size(); }
  const BleuOptions& options() const { return options_; }

  BleuStatistics segment_statistics(size_t segment, std::string_view hypothesis) const;
  // hypotheses.size() must equal num_segments().
  BleuStatistics corpus_statistics(const std::vector<std::string>& hypotheses) const;
  BleuScore corpus_score(const std::vector<std::string>& hypotheses) const;
  BleuScore sentence_score(size_t segment, std::string_view hypothesis) const;

  // "nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.x-compatible", in
  // sacreBLEU's key order; "|order:N" before version when N is not 4.
  std::string signature() const;

 private:
  // Lowercase (if asked), rstrip, tokenize, split: sacreBLEU's _preprocess_segment.
  // reference_stream (nullopt for a hypothesis) and index only name the segment in
  // the error for invalid UTF-8.
  std::vector<std::string> preprocess(std::string_view segment,
                                      std::optional<size_t> reference_stream,
                                      size_t index) const;

  BleuOptions options_;
  std::vector<ReferenceNgrams> segments_;
  int num_refs_ = 0;
};

// One-call forms of the above.
BleuScore corpus_bleu(const std::vector<std::string>& hypotheses,
                      const std::vector<std::vector<std::string>>& references,
                      const BleuOptions& options = {});
BleuScore sentence_bleu(std::string_view hypothesis, const std::vector<std::string>& references,
                        const BleuOptions& options);

// The longest line a text may have (a line of a file without line ends grew until the
// machine's memory ran out): 256 MiB, a few thousand times a long document's.
inline constexpr size_t kLongestLineBytes = size_t{256} << 20;

// Reads segments the way sacreBLEU's command line reads a file: one per line (lines
// end at \n), trailing whitespace removed (str.rstrip()).
// Throws thpc::Error naming `source` and the line on invalid UTF-8, and naming the
// file when it cannot be read.
std::vector<std::string> read_segments(std::istream& in, const std::string& source);
std::vector<std::string> read_segments(const std::string& path);

// The next line of `in` as read_segments gives it, for a reader that keeps only some
// lines at a time: false at the end of `in`. `number` (1-based) is the line's in
// `source`, for an error's message; the same errors as read_segments.
bool read_segment(std::istream& in, const std::string& source, int64_t number,
                  std::string* segment);

// The lines of a file as they are: split at \n only (a \r stays in its line), nothing
// removed, each checked to be UTF-8; what Perl's line reading gives the Moses scripts
// (metrics/multi_bleu.h). The same errors as read_segments.
std::vector<std::string> read_lines(std::istream& in, const std::string& source);
std::vector<std::string> read_lines(const std::string& path);

}  // namespace thpc::metrics
