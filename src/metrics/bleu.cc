#include "metrics/bleu.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <ios>
#include <iostream>
#include <sstream>
#include <string>
#include <utility>

#include "common/error.h"
#include "common/input_file.h"
#include "common/still_working.h"
#include "metrics/sentencepiece_tokenizer.h"

namespace thpc::metrics {
namespace {

// sacreBLEU's my_log: log 0 is a large negative number, not -inf, so that an
// unsmoothed zero precision drives exp(...) to exactly 0 without NaNs.
double log_or_floor(double value) { return value == 0.0 ? -9999999999.0 : std::log(value); }

// Whole, however large: -sv 1e300 is printed in the signature (a fixed buffer cut it).
std::string format_fixed(double value, int decimals) {
  const int length = std::snprintf(nullptr, 0, "%.*f", decimals, value);
  std::string text(static_cast<size_t>(std::max(length, 0)), '\0');
  std::snprintf(text.data(), text.size() + 1, "%.*f", decimals, value);
  return text;
}

// Every n-gram of order 1..max_order of `tokens`, keyed by its tokens joined with a
// space (tokens never contain whitespace, so the key is unambiguous).
std::unordered_map<std::string, int64_t> count_ngrams(const std::vector<std::string>& tokens,
                                                      int max_order) {
  std::unordered_map<std::string, int64_t> counts;
  const int length = static_cast<int>(tokens.size());
  for (int n = 1; n <= max_order; ++n) {
    for (int start = 0; start + n <= length; ++start) {
      std::string key = tokens[start];
      for (int k = 1; k < n; ++k) {
        key += ' ';
        key += tokens[start + k];
      }
      ++counts[key];
    }
  }
  return counts;
}

int ngram_order(const std::string& key) {
  return 1 + static_cast<int>(std::count(key.begin(), key.end(), ' '));
}

// The reference length closest to the hypothesis length, the shorter on ties.
int64_t closest_reference_length(int64_t hyp_len, const std::vector<int64_t>& ref_lens) {
  int64_t best_len = -1;
  int64_t best_diff = -1;
  for (int64_t ref_len : ref_lens) {
    const int64_t diff = std::llabs(hyp_len - ref_len);
    if (best_diff < 0 || diff < best_diff || (diff == best_diff && ref_len < best_len)) {
      best_diff = diff;
      best_len = ref_len;
    }
  }
  return best_len;
}

}  // namespace

Smoothing parse_smoothing(const std::string& name) {
  if (name == "none") return Smoothing::kNone;
  if (name == "floor") return Smoothing::kFloor;
  if (name == "add-k") return Smoothing::kAddK;
  if (name == "exp") return Smoothing::kExp;
  THPC_FAIL("unknown smoothing method '" << name << "' (expected none | floor | add-k | exp)");
}

std::string smoothing_name(Smoothing smoothing) {
  switch (smoothing) {
    case Smoothing::kNone: return "none";
    case Smoothing::kFloor: return "floor";
    case Smoothing::kAddK: return "add-k";
    case Smoothing::kExp: return "exp";
  }
  return "?";
}

double default_smooth_value(Smoothing smoothing) {
  // Chen & Cherry (2014)'s values, which sacreBLEU adopted.
  switch (smoothing) {
    case Smoothing::kFloor: return 0.1;
    case Smoothing::kAddK: return 1.0;
    default: return 0.0;
  }
}

void BleuStatistics::add(const BleuStatistics& other) {
  THPC_CHECK(other.matches.size() == matches.size(), "n-gram orders differ");
  hyp_len += other.hyp_len;
  ref_len += other.ref_len;
  for (size_t n = 0; n < matches.size(); ++n) {
    matches[n] += other.matches[n];
    totals[n] += other.totals[n];
  }
}

void ReferenceNgrams::add_reference(const std::vector<std::string>& tokens,
                                    int max_ngram_order) {
  lengths.push_back(static_cast<int64_t>(tokens.size()));
  for (const auto& [ngram, count] : count_ngrams(tokens, max_ngram_order)) {
    int64_t& limit = max_counts[ngram];
    limit = std::max(limit, count);
  }
}

void add_clipped_matches(const std::vector<std::string>& hypothesis_tokens,
                         const ReferenceNgrams& references, BleuStatistics& statistics) {
  const int max_order = static_cast<int>(statistics.matches.size());
  for (const auto& [ngram, count] : count_ngrams(hypothesis_tokens, max_order)) {
    const int n = ngram_order(ngram);
    statistics.totals[n - 1] += count;
    auto limit = references.max_counts.find(ngram);
    if (limit != references.max_counts.end()) {
      statistics.matches[n - 1] += std::min(count, limit->second);
    }
  }
}

std::string BleuScore::verbose() const {
  std::string text;
  for (size_t n = 0; n < precisions.size(); ++n) {
    if (n > 0) text += '/';
    text += format_fixed(precisions[n], 1);
  }
  text += " (BP = " + format_fixed(brevity_penalty, 3) + " ratio = " + format_fixed(ratio, 3) +
          " hyp_len = " + std::to_string(hyp_len) + " ref_len = " + std::to_string(ref_len) +
          ")";
  return text;
}

BleuScore compute_bleu(const BleuStatistics& statistics, const BleuOptions& options) {
  const int max_order = options.max_ngram_order;
  THPC_CHECK(static_cast<int>(statistics.matches.size()) == max_order,
             "statistics have " << statistics.matches.size() << " orders, options "
                                << max_order);
  const double smooth_value = options.smooth_value.value_or(
      default_smooth_value(options.smoothing));

  BleuScore result;
  result.hyp_len = statistics.hyp_len;
  result.ref_len = statistics.ref_len;
  result.ratio = statistics.ref_len > 0
                     ? static_cast<double>(statistics.hyp_len) / statistics.ref_len
                     : 0.0;
  result.counts.assign(statistics.matches.begin(), statistics.matches.end());
  result.totals.assign(statistics.totals.begin(), statistics.totals.end());
  result.precisions.assign(max_order, 0.0);

  // BP = min(1, exp(1 − r/c)); an empty hypothesis side (c = 0) gets 0.
  const double c = static_cast<double>(statistics.hyp_len);
  const double r = static_cast<double>(statistics.ref_len);
  if (statistics.hyp_len < statistics.ref_len) {
    result.brevity_penalty = statistics.hyp_len > 0 ? std::exp(1.0 - r / c) : 0.0;
  } else {
    result.brevity_penalty = 1.0;
  }

  // No match at any order: the score is 0 whatever the smoothing.
  bool any_match = false;
  for (int64_t m : statistics.matches) any_match = any_match || m != 0;
  if (!any_match) return result;

  // The orders averaged: all N, or with effective_order only those the hypothesis
  // has n-grams of (stopping at the first order with no n-grams at all).
  int orders_used = max_order;
  double exp_smoothing_divisor = 1.0;
  for (int n = 1; n <= max_order; ++n) {
    double& matches = result.counts[n - 1];
    double& totals = result.totals[n - 1];
    if (options.smoothing == Smoothing::kAddK && n > 1) {
      matches += smooth_value;
      totals += smooth_value;
    }
    if (totals == 0.0) break;
    if (options.effective_order) orders_used = n;

    double& precision = result.precisions[n - 1];
    if (matches == 0.0) {
      if (options.smoothing == Smoothing::kExp) {
        exp_smoothing_divisor *= 2.0;
        precision = 100.0 / (exp_smoothing_divisor * totals);
      } else if (options.smoothing == Smoothing::kFloor) {
        precision = 100.0 * smooth_value / totals;
      }
    } else {
      precision = 100.0 * matches / totals;
    }
  }

  // BLEU = BP · exp((1/N) Σ log p_n), in percent because p_n is.
  double log_sum = 0.0;
  for (int n = 0; n < orders_used; ++n) log_sum += log_or_floor(result.precisions[n]);
  result.score = result.brevity_penalty * std::exp(log_sum / orders_used);
  return result;
}

BleuScorer::BleuScorer(const std::vector<std::vector<std::string>>& references,
                       BleuOptions options)
    : options_(std::move(options)) {
  THPC_CHECK(options_.max_ngram_order >= 1,
             "max n-gram order " << options_.max_ngram_order << " < 1");
  THPC_CHECK(is_sentencepiece_tokenizer(options_.tokenizer) == (options_.sentencepiece != nullptr),
             "the tokenizer " << tokenizer_name(options_.tokenizer)
                              << (options_.sentencepiece ? " with" : " without")
                              << " a SentencePiece model");
  const size_t num_segments = reference_segments(references);
  segments_.resize(num_segments);
  for (size_t i = 0; i < num_segments; ++i) {
    for (size_t r = 0; r < references.size(); ++r) {
      // An empty reference stays a reference: length 0, no n-grams (sacreBLEU 2.6).
      segments_[i].add_reference(preprocess(references[r][i], r, i), options_.max_ngram_order);
    }
    show_still_working();  // a rank's validation set, which the other ranks wait for
  }
  num_refs_ = static_cast<int>(references.size());
}

std::vector<std::string> BleuScorer::preprocess(std::string_view segment,
                                                std::optional<size_t> reference_stream,
                                                size_t index) const {
  std::u32string text = decode_segment(segment, reference_stream, index);
  if (options_.lowercase) text = python_lower(text);
  const std::u32string tokenized =
      options_.sentencepiece ? sentencepiece_tokenize(*options_.sentencepiece, python_rstrip(text))
                             : tokenize(python_rstrip(text), options_.tokenizer);
  std::vector<std::string> tokens;
  for (std::u32string_view token : python_split(tokenized)) tokens.push_back(encode_utf8(token));
  return tokens;
}

BleuStatistics BleuScorer::segment_statistics(size_t segment,
                                              std::string_view hypothesis) const {
  THPC_CHECK(segment < segments_.size(),
             "segment " << segment << " of " << segments_.size());
  const ReferenceNgrams& reference = segments_[segment];
  const std::vector<std::string> tokens = preprocess(hypothesis, std::nullopt, segment);

  BleuStatistics statistics(options_.max_ngram_order);
  statistics.hyp_len = static_cast<int64_t>(tokens.size());
  statistics.ref_len = closest_reference_length(statistics.hyp_len, reference.lengths);
  add_clipped_matches(tokens, reference, statistics);
  return statistics;
}

BleuStatistics BleuScorer::corpus_statistics(const std::vector<std::string>& hypotheses) const {
  if (hypotheses.size() != segments_.size()) {
    THPC_FAIL(hypotheses.size() << " hypotheses for " << segments_.size()
                                << " reference segments");
  }
  BleuStatistics total(options_.max_ngram_order);
  for (size_t i = 0; i < hypotheses.size(); ++i) {
    total.add(segment_statistics(i, hypotheses[i]));
    show_still_working();  // rank 0 scores a validation alone while the others wait
  }
  return total;
}

BleuScore BleuScorer::corpus_score(const std::vector<std::string>& hypotheses) const {
  return compute_bleu(corpus_statistics(hypotheses), options_);
}

BleuScore BleuScorer::sentence_score(size_t segment, std::string_view hypothesis) const {
  return compute_bleu(segment_statistics(segment, hypothesis), options_);
}

std::string BleuScorer::signature() const {
  std::string smooth = smoothing_name(options_.smoothing);
  if (options_.smoothing == Smoothing::kFloor || options_.smoothing == Smoothing::kAddK) {
    smooth += "[" +
              format_fixed(options_.smooth_value.value_or(
                               default_smooth_value(options_.smoothing)),
                           2) +
              "]";
  }
  std::ostringstream out;
  out << "nrefs:" << num_refs_
      << "|case:" << (options_.lowercase ? "lc" : "mixed")
      << "|eff:" << (options_.effective_order ? "yes" : "no")
      << "|tok:" << tokenizer_name(options_.tokenizer) << "|smooth:" << smooth;
  if (options_.max_ngram_order != 4) out << "|order:" << options_.max_ngram_order;
  out << "|version:2.x-compatible";
  return out.str();
}

BleuScore corpus_bleu(const std::vector<std::string>& hypotheses,
                      const std::vector<std::vector<std::string>>& references,
                      const BleuOptions& options) {
  return BleuScorer(references, options).corpus_score(hypotheses);
}

BleuScore sentence_bleu(std::string_view hypothesis, const std::vector<std::string>& references,
                        const BleuOptions& options) {
  return BleuScorer(single_segment_streams(references), options).sentence_score(0, hypothesis);
}

namespace {

// The next line of `in`, split at \n alone (a \r stays in its line; a last line without
// one is a line), into `line`: false at the end of `in`. Refused past kLongestLineBytes
// (a file without line ends, /dev/zero or a crash's zeroed blocks, was read into memory
// until it ran out, then said as "read error"), and a read error said with its cause.
bool next_line(std::istream& in, const std::string& source, int64_t number, std::string* line) {
  line->clear();
  // Not past its end (as getline: a terminal named by path read again after Ctrl-D).
  if (!in.good()) {
    in.setstate(std::ios::failbit);
    return false;
  }
  std::streambuf* buffer = in.rdbuf();
  bool any = false;
  try {
    for (;;) {
      const int c = buffer->sbumpc();
      if (c == std::char_traits<char>::eof()) {
        // std::cin reads through C's stdin, whose read errors end it as its end would:
        // only ferror tells them apart (score and decode took a failed read for the end).
        if (&in == &std::cin && std::ferror(stdin)) {
          THPC_FAIL(source << ": read error after line " << number - 1
                           << ": the input was not read to its end");
        }
        in.setstate(any ? std::ios::eofbit : std::ios::eofbit | std::ios::failbit);
        return any;
      }
      any = true;
      if (c == '\n') return true;
      line->push_back(static_cast<char>(c));
      if (line->size() > kLongestLineBytes) {
        THPC_FAIL(source << ": line " << number << " is longer than "
                         << (kLongestLineBytes >> 20) << " MiB without a line end: not a text "
                         << "of lines (a binary file, or zeroed blocks?)");
      }
    }
  } catch (const std::ios_base::failure& failure) {
    THPC_FAIL(source << ": read error after line " << number - 1 << " ("
                     << failure.code().message() << ")");
  }
}

}  // namespace

std::vector<std::string> read_lines(std::istream& in, const std::string& source) {
  std::vector<std::string> lines;
  for (std::string line; next_line(in, source, static_cast<int64_t>(lines.size()) + 1, &line);) {
    size_t bad_offset = 0;
    if (!decode_utf8(line, &bad_offset)) {
      THPC_FAIL(source << ": line " << lines.size() + 1 << ": invalid UTF-8 at byte "
                       << bad_offset + 1 << " of the line" << kNotUtf8Advice);
    }
    lines.push_back(std::move(line));
  }
  if (in.bad()) THPC_FAIL(source << ": read error");
  return lines;
}

std::vector<std::string> read_lines(const std::string& path) {
  // A directory opens like a file on Linux and then reads as empty: open_input_file says
  // what it is, in the words the other tools use.
  std::ifstream in = open_text_file(path, "");
  return read_lines(in, path);
}

namespace {

// Lines end at \n only: sacreBLEU opens files with newline="\n", so a lone \r is part of
// the line (whitespace to the tokenizers) and a \r before \n is trailing whitespace
// that rstrip removes.
std::vector<std::string> rstripped(std::vector<std::string> lines) {
  for (std::string& line : lines) {
    line = encode_utf8(python_rstrip(*decode_utf8(line)));
  }
  return lines;
}

}  // namespace

std::vector<std::string> read_segments(std::istream& in, const std::string& source) {
  return rstripped(read_lines(in, source));
}

std::vector<std::string> read_segments(const std::string& path) {
  return rstripped(read_lines(path));
}

bool read_segment(std::istream& in, const std::string& source, int64_t number,
                  std::string* segment) {
  // Split at \n alone, as read_lines splits its bytes (a last line without one is a line).
  if (!next_line(in, source, number, segment)) {
    if (in.bad()) THPC_FAIL(source << ": read error");
    return false;
  }
  size_t bad_offset = 0;
  const std::optional<std::u32string> text = decode_utf8(*segment, &bad_offset);
  if (!text) {
    THPC_FAIL(source << ": line " << number << ": invalid UTF-8 at byte " << bad_offset + 1
                     << " of the line" << kNotUtf8Advice);
  }
  *segment = encode_utf8(python_rstrip(*text));
  return true;
}

}  // namespace thpc::metrics
