#include "metrics/ter.h"

#include <algorithm>
#include <cmath>
#include <sstream>
#include <unordered_map>
#include <utility>

#include "common/error.h"
#include "common/still_working.h"
#include "metrics/text_rules.h"
#include "metrics/tokenize.h"

namespace thpc::metrics {
namespace {

using text_rules::is_13a_split_character;
using text_rules::is_ascii_digit;
using text_rules::is_not_ascii_digit;
using text_rules::is_period_or_comma;
using text_rules::join_tokens;
using text_rules::pad_each;
using text_rules::PairSpacing;
using text_rules::replace_all;
using text_rules::split_pairs;

// ---- Tercom's normalizer (sacreBLEU's TercomTokenizer) ----

// Tercom's general and Western rules: mteval-v13a's (tokenize.cc) with its possessive rule
// added and its <skipped> rule left out; the line-break rule joins "\n-" where 13a joins
// "-\n" (neither occurs within one line of a file).
std::u32string normalize_general_and_western(std::u32string_view segment) {
  std::u32string text = replace_all(segment, U"\n-", U"");
  text = replace_all(text, U"\n", U" ");
  text = replace_all(text, U"&quot;", U"\"");
  text = replace_all(text, U"&amp;", U"&");
  text = replace_all(text, U"&lt;", U"<");
  text = replace_all(text, U"&gt;", U">");
  text = U" " + text + U" ";
  text = pad_each(text, is_13a_split_character);
  // Possessives: "jim's car" -> "jim 's car" (re.sub(r"'s ", " 's ")). sacreBLEU's rule for
  // "'s" at the very end never matches: the text ends with the padding space.
  text = replace_all(text, U"'s ", U" 's ");
  text = split_pairs(text, is_not_ascii_digit, is_period_or_comma, PairSpacing::kAfterFirst);
  text = split_pairs(text, is_period_or_comma, is_not_ascii_digit, PairSpacing::kBeforeFirst);
  text = split_pairs(text, is_ascii_digit, [](char32_t c) { return c == U'-'; },
                     PairSpacing::kAfterFirst);
  return text;
}

bool in_range(char32_t c, char32_t first, char32_t last) { return c >= first && c <= last; }

// sacreBLEU's ASIAN_PUNCT and FULL_WIDTH_PUNCT: split off (normalized) or removed (no_punct).
bool is_asian_punctuation(char32_t c) {
  return c == U'\u3001' || c == U'\u3002' || in_range(c, U'\u3008', U'\u3011') ||
         in_range(c, U'\u3014', U'\u301f') || in_range(c, U'\uff61', U'\uff65') ||
         c == U'\u30fb';
}
bool is_full_width_punctuation(char32_t c) {
  return c == U'\uff0e' || c == U'\uff0c' || c == U'\uff1f' || c == U'\uff1a' ||
         c == U'\uff1b' || c == U'\uff01' || c == U'\uff02' || c == U'\uff08' ||
         c == U'\uff09';
}

// The characters Tercom's Asian rules put spaces around: CJK ideographs (and extension A),
// strokes, radicals, compatibility blocks, U+3200..U+3F22 (sacreBLEU's range, wider than
// the enclosed letters it names), and the punctuation above. sacreBLEU applies them one
// class after another; the spaces differ from one pass with their union only in number,
// which the final split removes. Its Hiragana, Katakana and phonetic-extension rules are
// anchored at the start of a text the padding starts with a space: they change nothing
// (sacreBLEU's own test keeps "りの" whole), and are left out.
bool is_split_asian_character(char32_t c) {
  return in_range(c, U'\u4e00', U'\u9fff') || in_range(c, U'\u3400', U'\u4dbf') ||
         in_range(c, U'\u31c0', U'\u31ef') || in_range(c, U'\u2e80', U'\u2eff') ||
         in_range(c, U'\u3300', U'\u33ff') || in_range(c, U'\uf900', U'\ufaff') ||
         in_range(c, U'\ufe30', U'\ufe4f') || in_range(c, U'\u3200', U'\u3f22') ||
         is_asian_punctuation(c) || is_full_width_punctuation(c);
}

bool is_removed_punctuation(char32_t c) {
  return c == U'.' || c == U',' || c == U'?' || c == U':' || c == U';' || c == U'!' ||
         c == U'"' || c == U'(' || c == U')';
}

// ---- the edit distance ----

// A cell of the edit-distance matrix: the cost, and the operation that reached it
// (' ' match, 's' substitution, 'i' insertion, 'd' deletion, 'x' outside the beam).
struct Cell {
  int64_t cost;
  char operation;
};

// sacreBLEU's stand-in for a cell outside the beam (int(1e16)); one step more never wins.
constexpr int64_t kOutsideBeam = 10'000'000'000'000'000;
// Tercom's limits (sacreBLEU's _MAX_SHIFT_SIZE, _MAX_SHIFT_DIST, _BEAM_WIDTH) and
// sacreBLEU's own: each changes the score where it bites, so they are the same here.
constexpr int kMaxShiftSize = 10;
constexpr int kMaxShiftDistance = 50;
constexpr int kBeamWidth = 25;
constexpr int kMaxShiftCandidates = 1000;
// The rows kept for prefixes already seen (sacreBLEU's _MAX_CACHE_SIZE), and here at most
// 2^22 cells (64 MiB) of them: they save time only, the edits are the same without them.
constexpr size_t kMaxCachedRows = 10000;
constexpr size_t kMaxCachedCells = size_t{1} << 22;

// Words as numbers: equal words, equal numbers, within one hypothesis-reference pair.
using Words = std::vector<int32_t>;

// One row of the edit-distance matrix: the cells of its beam, columns first..first +
// cells.size() - 1; every other cell is outside the beam (sacreBLEU keeps whole rows of
// them: a row here is the beam's ~50 cells, not the reference's length).
struct BeamRow {
  int64_t first = 0;
  std::vector<Cell> cells;

  Cell at(int64_t column) const {
    const int64_t k = column - first;
    return k >= 0 && k < static_cast<int64_t>(cells.size()) ? cells[k]
                                                            : Cell{kOutsideBeam, 'x'};
  }
};

// The word edit distance from a hypothesis to one reference (the reference's words cost
// an insertion each, the hypothesis' a deletion), over the beam about the diagonal, with
// the operations' trace. Every hypothesis it is given is a shift of the same one (so of one
// length: the beam depends on it): the matrix rows of a prefix seen before are kept in a
// trie and a new hypothesis starts after its longest known prefix.
class BeamEditDistance {
 public:
  explicit BeamEditDistance(const Words& reference) : reference_(reference) {
    BeamRow first_row;
    for (size_t j = 0; j <= reference.size(); ++j) {
      first_row.cells.push_back({static_cast<int64_t>(j), 'i'});
    }
    nodes_.push_back({std::move(first_row)});
  }

  // The distance, and in *trace the operations from the first words to the last.
  int64_t operator()(const Words& hypothesis, std::string* trace) {
    const size_t length = hypothesis.size();
    const auto width = static_cast<int64_t>(reference_.size() + 1);
    // rows[i]: the matrix row after the hypothesis' first i words.
    std::vector<const BeamRow*> rows = {&nodes_[0].row};
    int32_t node = 0;
    for (int32_t word : hypothesis) {
      const auto child = children_.find(key(node, word));
      if (child == children_.end()) break;
      node = child->second;
      rows.push_back(&nodes_[node].row);
    }
    const size_t known = rows.size() - 1;
    std::vector<BeamRow> fresh(length - known);
    const double length_ratio =
        length > 0 ? static_cast<double>(reference_.size()) / static_cast<double>(length) : 1.0;
    // A very uneven pair widens the beam, or rows would not overlap.
    const int64_t beam_width = kBeamWidth < length_ratio / 2
                                   ? static_cast<int64_t>(std::ceil(length_ratio / 2 + kBeamWidth))
                                   : kBeamWidth;
    for (size_t i = known + 1; i <= length; ++i) {
      const BeamRow& previous = *rows[i - 1];
      BeamRow& row = fresh[i - known - 1];
      const auto diagonal =
          static_cast<int64_t>(std::floor(static_cast<double>(i) * length_ratio));
      row.first = std::max<int64_t>(0, diagonal - beam_width);
      const int64_t end =
          i == length ? width : std::min<int64_t>(width, diagonal + beam_width);
      row.cells.assign(std::max<int64_t>(0, end - row.first), Cell{kOutsideBeam, 'x'});
      for (int64_t j = row.first; j < end; ++j) {
        Cell& cell = row.cells[j - row.first];
        if (j == 0) {
          cell = {previous.at(0).cost + 1, 'd'};
          continue;
        }
        const bool same = hypothesis[i - 1] == reference_[j - 1];
        // Tercom prefers a match or substitution, then an insertion, then a deletion; the
        // trace is read the other way round (shifts rewrite the reference into the
        // hypothesis), so deletion comes before insertion here, as in sacreBLEU.
        const Cell options[] = {{previous.at(j - 1).cost + (same ? 0 : 1), same ? ' ' : 's'},
                                {previous.at(j).cost + 1, 'd'},
                                {row.at(j - 1).cost + 1, 'i'}};
        for (const Cell& option : options) {
          if (cell.cost > option.cost) cell = option;
        }
      }
      rows.push_back(&row);
    }
    // The trace, from the last cell back to the first.
    trace->clear();
    size_t i = length;
    int64_t j = width - 1;
    while (i > 0 || j > 0) {
      const char operation = rows[i]->at(j).operation;
      trace->push_back(operation);
      if (operation == ' ' || operation == 's') {
        --i;
        --j;
      } else if (operation == 'i') {
        --j;
      } else if (operation == 'd') {
        --i;
      } else {
        THPC_FAIL("TER: the edit distance's path left its beam at row " << i << ", column "
                  << j << " (sacreBLEU stops there too)");
      }
    }
    std::reverse(trace->begin(), trace->end());
    const int64_t distance = rows[length]->at(width - 1).cost;
    remember(hypothesis, known, node, std::move(fresh));
    return distance;
  }

 private:
  struct Node {
    BeamRow row;
  };

  static uint64_t key(int32_t node, int32_t word) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(node)) << 32) |
           static_cast<uint32_t>(word);
  }

  // Keeps the rows after the prefix of `known` words (at `node`), unless the trie is full.
  void remember(const Words& hypothesis, size_t known, int32_t node,
                std::vector<BeamRow> fresh) {
    if (nodes_.size() - 1 >= kMaxCachedRows || cached_cells_ >= kMaxCachedCells) return;
    for (size_t k = 0; k < fresh.size(); ++k) {
      cached_cells_ += fresh[k].cells.size();
      const auto child = static_cast<int32_t>(nodes_.size());
      nodes_.push_back({std::move(fresh[k])});
      children_.emplace(key(node, hypothesis[known + k]), child);
      node = child;
    }
  }

  const Words& reference_;
  std::vector<Node> nodes_;  // nodes_[0]: the empty prefix, the first row
  std::unordered_map<uint64_t, int32_t> children_;
  size_t cached_cells_ = 0;
};

// Python's words[first:last], indices clamped to the list.
void append_slice(const Words& words, int64_t first, int64_t last, Words* out) {
  const auto size = static_cast<int64_t>(words.size());
  first = std::clamp<int64_t>(first, 0, size);
  last = std::clamp<int64_t>(last, 0, size);
  if (first < last) out->insert(out->end(), words.begin() + first, words.begin() + last);
}

// The words with words[start:start+length] moved to before position `target` (sacreBLEU's
// _perform_shift, its three cases as written, Python's slices).
Words perform_shift(const Words& words, int64_t start, int64_t length, int64_t target) {
  Words out;
  out.reserve(words.size());
  const auto size = static_cast<int64_t>(words.size());
  if (target < start) {
    append_slice(words, 0, target, &out);
    append_slice(words, start, start + length, &out);
    append_slice(words, target, start, &out);
    append_slice(words, start + length, size, &out);
  } else if (target > start + length) {
    append_slice(words, 0, start, &out);
    append_slice(words, start + length, target, &out);
    append_slice(words, start, start + length, &out);
    append_slice(words, target, size, &out);
  } else {
    append_slice(words, 0, start, &out);
    append_slice(words, start + length, length + target, &out);
    append_slice(words, start, start + length, &out);
    append_slice(words, length + target, size, &out);
  }
  return out;
}

// The shift that lowers the edit distance most (sacreBLEU's _shift): its gain (0 and the
// words unchanged for none) and the shifted words. `checked` counts every candidate
// evaluated over the segment's search.
std::pair<int64_t, Words> best_shift(const Words& hypothesis, const Words& reference,
                                     BeamEditDistance& edit_distance, int* checked) {
  std::string trace;
  const int64_t before = edit_distance(hypothesis, &trace);
  // The trace rewrites the hypothesis into the reference; the alignment reads it the other
  // way: insertions and deletions swap.
  const auto hypothesis_size = static_cast<int64_t>(hypothesis.size());
  const auto reference_size = static_cast<int64_t>(reference.size());
  std::vector<int64_t> aligned(reference.size(), -1);  // reference position -> hypothesis
  std::vector<char> reference_wrong, hypothesis_wrong;
  int64_t hypothesis_at = -1, reference_at = -1;
  for (char operation : trace) {
    if (operation == ' ' || operation == 's') {
      aligned[++reference_at] = ++hypothesis_at;
      const char wrong = operation == 's';
      hypothesis_wrong.push_back(wrong);
      reference_wrong.push_back(wrong);
    } else if (operation == 'd') {  // an insertion into the hypothesis, read backwards
      ++hypothesis_at;
      hypothesis_wrong.push_back(1);
    } else {  // 'i': a deletion, read backwards
      aligned[++reference_at] = hypothesis_at;
      reference_wrong.push_back(1);
    }
  }
  // (The runs below lie within both sides: no bound to clamp, unlike Python's slices.)
  const auto any_wrong = [](const std::vector<char>& wrong, int64_t first, int64_t length) {
    return std::any_of(wrong.begin() + first, wrong.begin() + first + length,
                       [](char w) { return w; });
  };

  struct Candidate {
    int64_t gain = 0;
    int64_t length = 0;
    int64_t start = 0;
    int64_t target = 0;
    Words words;
    // Tercom's ranking: the largest gain, then the longest run, the earliest start, the
    // earliest target.
    bool beats(const Candidate& other) const {
      if (gain != other.gain) return gain > other.gain;
      if (length != other.length) return length > other.length;
      if (start != other.start) return start < other.start;
      return target < other.target;
    }
  };
  std::optional<Candidate> best;
  for (int64_t start = 0; start < hypothesis_size; ++start) {
    // The reference positions within kMaxShiftDistance, in sacreBLEU's order (it visits
    // every position and skips the others: quadratic in the length).
    const int64_t last_reference_start =
        std::min(reference_size - 1, start + kMaxShiftDistance);
    for (int64_t reference_start = std::max<int64_t>(0, start - kMaxShiftDistance);
         reference_start <= last_reference_start; ++reference_start) {
      // Every run of 1..kMaxShiftSize words that starts here on both sides and matches.
      for (int64_t length = 1;
           length <= kMaxShiftSize && start + length <= hypothesis_size &&
           reference_start + length <= reference_size &&
           hypothesis[start + length - 1] == reference[reference_start + length - 1];
           ++length) {
        // Only a run wrong where it stands and whose reference side is wrong too, and not
        // onto itself.
        if (!any_wrong(hypothesis_wrong, start, length)) continue;
        if (!any_wrong(reference_wrong, reference_start, length)) continue;
        if (start <= aligned[reference_start] && aligned[reference_start] < start + length) {
          continue;
        }
        int64_t previous_target = -1;
        for (int64_t offset = -1; offset < length; ++offset) {
          // Before the hypothesis word aligned with the reference word, or the start.
          const int64_t target =
              reference_start + offset == -1 ? 0 : aligned[reference_start + offset] + 1;
          if (target == previous_target) continue;
          previous_target = target;
          Candidate candidate;
          candidate.words = perform_shift(hypothesis, start, length, target);
          candidate.gain = before - edit_distance(candidate.words, &trace);
          candidate.length = length;
          candidate.start = start;
          candidate.target = target;
          ++*checked;
          if (!best || candidate.beats(*best)) best = std::move(candidate);
        }
        if (*checked >= kMaxShiftCandidates) break;
      }
      if (*checked >= kMaxShiftCandidates) break;
    }
    if (*checked >= kMaxShiftCandidates) break;
  }
  if (!best) return {0, hypothesis};
  return {best->gain, std::move(best->words)};
}

}  // namespace

std::u32string tercom_tokenize(std::u32string_view segment, const TerOptions& options) {
  std::u32string text(python_rstrip(segment));
  if (text.empty()) return text;
  if (!options.case_sensitive) text = python_lower(text);
  if (options.normalized) {
    text = normalize_general_and_western(text);
    if (options.asian_support) text = pad_each(text, is_split_asian_character);
  }
  if (options.no_punct) {
    text.erase(std::remove_if(text.begin(), text.end(),
                              [&](char32_t c) {
                                return is_removed_punctuation(c) ||
                                       (options.asian_support &&
                                        (is_asian_punctuation(c) || is_full_width_punctuation(c)));
                              }),
               text.end());
  }
  return join_tokens(text);
}

EditCount translation_edit_rate(const std::vector<std::u32string>& hypothesis,
                                const std::vector<std::u32string>& reference) {
  const auto reference_words = static_cast<int64_t>(reference.size());
  // An empty reference: every hypothesis word is an edit, and it adds no length.
  if (reference.empty()) return {static_cast<int64_t>(hypothesis.size()), 0};
  std::unordered_map<std::u32string_view, int32_t> numbers;
  const auto number = [&](const std::u32string& word) {
    return numbers.emplace(word, static_cast<int32_t>(numbers.size())).first->second;
  };
  Words reference_numbers, hypothesis_numbers;
  for (const std::u32string& word : reference) reference_numbers.push_back(number(word));
  for (const std::u32string& word : hypothesis) hypothesis_numbers.push_back(number(word));

  BeamEditDistance edit_distance(reference_numbers);
  int64_t shifts = 0;
  int checked = 0;
  Words words = std::move(hypothesis_numbers);
  while (true) {
    auto [gain, shifted] = best_shift(words, reference_numbers, edit_distance, &checked);
    // sacreBLEU drops the shift found when the candidates ran out while finding it.
    if (checked >= kMaxShiftCandidates || gain <= 0) break;
    ++shifts;
    words = std::move(shifted);
  }
  std::string trace;
  return {shifts + edit_distance(words, &trace), reference_words};
}

void TerStatistics::add(const TerStatistics& other) {
  edits += other.edits;
  reference_length += other.reference_length;
}

double compute_ter(const TerStatistics& statistics) {
  double rate = 0.0;
  if (statistics.reference_length > 0) {
    rate = static_cast<double>(statistics.edits) / statistics.reference_length;
  } else if (statistics.edits > 0) {
    rate = 1.0;  // empty references and a hypothesis with words
  }
  return 100 * rate;
}

TerScorer::TerScorer(const std::vector<std::vector<std::string>>& references,
                     TerOptions options)
    : options_(options) {
  const size_t num_segments = reference_segments(references);
  segments_.resize(num_segments);
  for (size_t i = 0; i < num_segments; ++i) {
    for (size_t r = 0; r < references.size(); ++r) {
      segments_[i].push_back(words(references[r][i], r, i));
    }
    show_still_working();  // a rank's validation set, which the other ranks wait for
  }
  num_refs_ = static_cast<int>(references.size());
}

std::vector<std::u32string> TerScorer::words(std::string_view segment,
                                              std::optional<size_t> reference_stream,
                                              size_t index) const {
  std::u32string text =
      tercom_tokenize(decode_segment(segment, reference_stream, index), options_);
  // sacreBLEU's TER tokenizes a reference twice (Metric._cache_references, then again in
  // TER._extract_reference_info), a hypothesis once. With --ter-normalized the second pass
  // changes the words: "it's<TAB>x" -> "it's x" -> "it 's x", ".,1" -> ". ,1" -> ". , 1".
  if (reference_stream) text = tercom_tokenize(text, options_);
  std::vector<std::u32string> out;
  for (std::u32string_view word : python_split(text)) out.emplace_back(word);
  return out;
}

TerStatistics TerScorer::segment_statistics(size_t segment, std::string_view hypothesis) const {
  THPC_CHECK(segment < segments_.size(), "segment " << segment << " of " << segments_.size());
  const std::vector<std::u32string> hypothesis_words = words(hypothesis, std::nullopt, segment);
  // The fewest edits over the references, and their mean length.
  int64_t fewest_edits = kOutsideBeam;
  int64_t reference_words = 0;
  for (const std::vector<std::u32string>& reference : segments_[segment]) {
    const EditCount count = translation_edit_rate(hypothesis_words, reference);
    reference_words += count.reference_words;
    fewest_edits = std::min(fewest_edits, count.edits);
  }
  TerStatistics statistics;
  statistics.edits = fewest_edits;
  statistics.reference_length = static_cast<double>(reference_words) /
                                static_cast<double>(segments_[segment].size());
  return statistics;
}

TerStatistics TerScorer::corpus_statistics(const std::vector<std::string>& hypotheses) const {
  if (hypotheses.size() != segments_.size()) {
    THPC_FAIL(hypotheses.size() << " hypotheses for " << segments_.size()
                                << " reference segments");
  }
  TerStatistics total;
  for (size_t i = 0; i < hypotheses.size(); ++i) {
    total.add(segment_statistics(i, hypotheses[i]));
    show_still_working();
  }
  return total;
}

double TerScorer::corpus_score(const std::vector<std::string>& hypotheses) const {
  return compute_ter(corpus_statistics(hypotheses));
}

double TerScorer::sentence_score(size_t segment, std::string_view hypothesis) const {
  return compute_ter(segment_statistics(segment, hypothesis));
}

std::string TerScorer::signature() const {
  const auto yes_no = [](bool value) { return value ? "yes" : "no"; };
  std::ostringstream out;
  out << "nrefs:" << num_refs_ << "|case:" << (options_.case_sensitive ? "mixed" : "lc")
      << "|tok:tercom|norm:" << yes_no(options_.normalized)
      << "|punct:" << yes_no(!options_.no_punct) << "|asian:" << yes_no(options_.asian_support)
      << "|version:2.x-compatible";
  return out.str();
}

double corpus_ter(const std::vector<std::string>& hypotheses,
                  const std::vector<std::vector<std::string>>& references,
                  const TerOptions& options) {
  return TerScorer(references, options).corpus_score(hypotheses);
}

double sentence_ter(std::string_view hypothesis, const std::vector<std::string>& references,
                    const TerOptions& options) {
  return TerScorer(single_segment_streams(references), options).sentence_score(0, hypothesis);
}

}  // namespace thpc::metrics
