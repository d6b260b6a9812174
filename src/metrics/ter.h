// TER, the translation edit rate (Snover et al., 2006), exactly as sacreBLEU 2.x computes
// it (its port of Tercom), so that a score printed here can be quoted next to a sacreBLEU
// TER. Lower is better:
//
//   TER = 100 · Σ_segments edits / Σ_segments (average reference length in words)
//
// A segment's edits are the fewest word insertions, deletions, substitutions and shifts
// (a run of up to 10 words moved elsewhere, one edit whatever its length) that turn the
// hypothesis into one of its references, Tercom's greedy way: while some shift lowers the
// word edit distance, take the one that lowers it most (then the longest, the earliest in
// the hypothesis, the earliest target); the edits are the shifts taken plus the edit
// distance left. The edit distance is computed in a beam of ±25 cells about the
// matrix's diagonal (scaled by the length ratio), shifts move at most 50 positions, and
// after 1,000 shift candidates a segment's search stops: those limits are part of the
// score, sacreBLEU's and Tercom's alike. A segment of several references takes the fewest
// edits over them and the mean of their lengths. An empty reference is 0 words (the
// hypothesis' words are its edits); with no reference words in the corpus TER is 100 if
// there are edits, else 0.
//
// Defaults are sacreBLEU's and Tercom's: lowercased, not normalized, punctuation kept, words
// split at Python's str.isspace() (metrics/tokenize.h). Text in and out is UTF-8.
// As in sacreBLEU, a reference is tokenized twice (tercom_tokenize on its own output), a
// hypothesis once: with `normalized` the second pass can split more ("jim's\tcar").
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace thpc::metrics {

struct TerOptions {
  bool normalized = false;      // sacreBLEU --ter-normalized: Tercom's tokenizer first
  bool no_punct = false;        // --ter-no-punct: . , ? : ; ! " ( ) removed
  bool asian_support = false;   // --ter-asian-support: CJK split into characters
  bool case_sensitive = false;  // --ter-case-sensitive: not lowercased
};

// A segment as Tercom's normalizer leaves it (sacreBLEU's TercomTokenizer): its words
// joined by single spaces.
std::u32string tercom_tokenize(std::u32string_view segment, const TerOptions& options);

// The edits that turn `hypothesis` into `reference` (words), shifts included, and the
// reference's length in words.
struct EditCount {
  int64_t edits = 0;
  int64_t reference_words = 0;
};
EditCount translation_edit_rate(const std::vector<std::u32string>& hypothesis,
                                const std::vector<std::u32string>& reference);

// The sufficient statistics of TER; corpus statistics are the sums over segments, in
// segment order (the double's sum is the one Python makes).
struct TerStatistics {
  int64_t edits = 0;
  double reference_length = 0.0;  // the average reference length, summed over segments

  void add(const TerStatistics& other);
};

// TER in percent, as sacreBLEU: 100 · edits / reference length.
double compute_ter(const TerStatistics& statistics);

// References read (and tokenized) once, then any number of hypotheses scored against them.
class TerScorer {
 public:
  // references[r][i] is segment i of reference stream r; all streams have the same length.
  TerScorer(const std::vector<std::vector<std::string>>& references, TerOptions options);

  size_t num_segments() const { return segments_.size(); }
  const TerOptions& options() const { return options_; }

  TerStatistics segment_statistics(size_t segment, std::string_view hypothesis) const;
  // hypotheses.size() must equal num_segments().
  TerStatistics corpus_statistics(const std::vector<std::string>& hypotheses) const;
  double corpus_score(const std::vector<std::string>& hypotheses) const;
  double sentence_score(size_t segment, std::string_view hypothesis) const;

  // "nrefs:1|case:lc|tok:tercom|norm:no|punct:yes|asian:no|version:2.x-compatible",
  // sacreBLEU's keys in its order.
  std::string signature() const;

 private:
  std::vector<std::u32string> words(std::string_view segment,
                                    std::optional<size_t> reference_stream,
                                    size_t index) const;

  TerOptions options_;
  // segments_[i][r]: the words of reference r of segment i.
  std::vector<std::vector<std::vector<std::u32string>>> segments_;
  int num_refs_ = 0;
};

// One-call forms of the above.
double corpus_ter(const std::vector<std::string>& hypotheses,
                  const std::vector<std::vector<std::string>>& references,
                  const TerOptions& options = {});
double sentence_ter(std::string_view hypothesis, const std::vector<std::string>& references,
                    const TerOptions& options = {});

}  // namespace thpc::metrics
