#include "metrics/tokenize.h"

#include <algorithm>
#include <iterator>
#include <sstream>
#include <utility>

#include "common/error.h"
#include "metrics/text_rules.h"
#include "metrics/unicode_tables.h"

namespace thpc::metrics {
namespace {

using unicode::in_ranges;
using text_rules::is_13a_split_character;
using text_rules::is_ascii_digit;
using text_rules::is_not_ascii_digit;
using text_rules::is_period_or_comma;
using text_rules::join_tokens;
using text_rules::pad_each;
using text_rules::PairSpacing;
using text_rules::replace_all;
using text_rules::split_pairs;

// The intl tokenizer's classes: the `regex` package's, as sacreBLEU's (unicode_tables.h).
bool is_punctuation(char32_t c) {
  return in_ranges(c, unicode::kIntlPunctuation, unicode::kIntlPunctuation_size);
}
bool is_symbol(char32_t c) {
  return in_ranges(c, unicode::kIntlSymbol, unicode::kIntlSymbol_size);
}
bool is_number(char32_t c) {
  return in_ranges(c, unicode::kIntlNumber, unicode::kIntlNumber_size);
}
bool is_cased(char32_t c) { return in_ranges(c, unicode::kCased, unicode::kCased_size); }
bool is_case_ignorable(char32_t c) {
  return in_ranges(c, unicode::kCaseIgnorable, unicode::kCaseIgnorable_size);
}

// The rules 13a and zh share (sacreBLEU's TokenizerRegexp): ASCII punctuation split off,
// period and comma split off unless between digits, a dash after a digit split off.
std::u32string apply_13a_rules(std::u32string_view line) {
  std::u32string text = pad_each(line, is_13a_split_character);
  // Period and comma split off unless between digits (3.14, 1,000 stay whole).
  text = split_pairs(text, is_not_ascii_digit, is_period_or_comma, PairSpacing::kAfterFirst);
  text = split_pairs(text, is_period_or_comma, is_not_ascii_digit, PairSpacing::kBeforeFirst);
  // A dash after a digit splits off (ranges such as 1990-2000).
  text = split_pairs(text, is_ascii_digit, [](char32_t c) { return c == U'-'; },
                     PairSpacing::kAfterFirst);
  return join_tokens(text);
}

std::u32string tokenize_13a(std::u32string_view line) {
  // mteval-v13a's language-independent part: drop <skipped>, join hyphenated line
  // breaks, undo the four HTML escapes that WMT's SGML carries.
  std::u32string text = replace_all(line, U"<skipped>", U"");
  text = replace_all(text, U"-\n", U"");
  text = replace_all(text, U"\n", U" ");
  text = replace_all(text, U"&quot;", U"\"");
  text = replace_all(text, U"&amp;", U"&");
  text = replace_all(text, U"&lt;", U"<");
  text = replace_all(text, U"&gt;", U">");
  // The padding spaces let the period/comma rules see a neighbour at both ends.
  return apply_13a_rules(U" " + text + U" ");
}

// What sacreBLEU's zh tokenizer takes for a Chinese character (_UCODE_RANGES), as its
// comparisons really read: two of its ranges are written '\u20000'..'\u2a6d6' and
// '\u2f800'..'\u2fa1d', which Python reads as two-character strings, so that one
// character compares in them as U+2001..U+2A6D (general punctuation, currency, arrows,
// mathematical and technical symbols among them) and U+2F81..U+2FA1, and the supplementary
// ideographs (U+20000 on) are no Chinese characters at all.
bool is_sacrebleu_chinese(char32_t c) {
  static constexpr std::pair<char32_t, char32_t> kRanges[] = {
      {0x3400, 0x4DB5}, {0x4E00, 0x9FA5}, {0x9FA6, 0x9FBB}, {0xF900, 0xFA2D},
      {0xFA30, 0xFA6A}, {0xFA70, 0xFAD9}, {0x2001, 0x2A6D}, {0x2F81, 0x2FA1},
      {0xFF00, 0xFFEF}, {0x2E80, 0x2EFF}, {0x3000, 0x303F}, {0x31C0, 0x31EF},
      {0x2F00, 0x2FDF}, {0x2FF0, 0x2FFF}, {0x3100, 0x312F}, {0x31A0, 0x31BF},
      {0xFE10, 0xFE1F}, {0xFE30, 0xFE4F}, {0x2600, 0x26FF}, {0x2700, 0x27BF},
      {0x3200, 0x32FF}, {0x3300, 0x33FF}};
  return std::any_of(std::begin(kRanges), std::end(kRanges),
                     [c](const auto& range) { return range.first <= c && c <= range.second; });
}

// sacreBLEU's zh (Shujian Huang's): the line stripped, each Chinese character made a
// token, then 13a's rules without 13a's unescaping and without its padding spaces.
std::u32string tokenize_zh(std::u32string_view line) {
  std::u32string_view stripped = python_rstrip(line);
  while (!stripped.empty() && is_python_whitespace(stripped.front())) stripped.remove_prefix(1);
  std::u32string text;
  text.reserve(stripped.size() * 2);
  for (const char32_t c : stripped) {
    if (is_sacrebleu_chinese(c)) {
      text += U' ';
      text += c;
      text += U' ';
    } else {
      text += c;
    }
  }
  return apply_13a_rules(text);
}

std::u32string tokenize_intl(std::u32string_view line) {
  // mteval-v14 --international-tokenization: Unicode punctuation splits off unless
  // a number is on the relevant side; every symbol splits off.
  auto is_not_number = [](char32_t c) { return !is_number(c); };
  std::u32string text =
      split_pairs(line, is_not_number, is_punctuation, PairSpacing::kAfterFirst);
  text = split_pairs(text, is_punctuation, is_not_number, PairSpacing::kBeforeFirst);
  text = pad_each(text, is_symbol);
  return join_tokens(text);
}

std::u32string tokenize_char(std::u32string_view line) {
  // " ".join(line): every code point its own token (whitespace vanishes on split).
  std::u32string out;
  out.reserve(line.size() * 2);
  for (size_t i = 0; i < line.size(); ++i) {
    if (i > 0) out += U' ';
    out += line[i];
  }
  return out;
}

// CPython's Final_Sigma test: capital sigma lowercases to final sigma when a cased
// letter precedes it and none follows, case-ignorable characters skipped both ways.
bool is_final_sigma(std::u32string_view text, size_t position) {
  size_t j = position;
  while (j > 0 && is_case_ignorable(text[j - 1])) --j;
  if (j == 0 || !is_cased(text[j - 1])) return false;
  size_t k = position + 1;
  while (k < text.size() && is_case_ignorable(text[k])) ++k;
  return k == text.size() || !is_cased(text[k]);
}

}  // namespace

TokenizerKind parse_tokenizer(const std::string& name) {
  if (name == "13a") return TokenizerKind::k13a;
  if (name == "intl") return TokenizerKind::kIntl;
  if (name == "char") return TokenizerKind::kChar;
  if (name == "none") return TokenizerKind::kNone;
  if (name == "zh") return TokenizerKind::kZh;
  if (name == "flores101" || name == "spm") return TokenizerKind::kFlores101;
  if (name == "flores200") return TokenizerKind::kFlores200;
  if (name == "spBLEU-1K") return TokenizerKind::kSpBleu1K;
  THPC_FAIL("unknown tokenizer '" << name << "' (expected 13a | intl | char | none | zh | "
                                  << "flores101 | flores200 | spBLEU-1K)");
}

std::string tokenizer_name(TokenizerKind kind) {
  switch (kind) {
    case TokenizerKind::k13a: return "13a";
    case TokenizerKind::kIntl: return "intl";
    case TokenizerKind::kChar: return "char";
    case TokenizerKind::kNone: return "none";
    case TokenizerKind::kZh: return "zh";
    case TokenizerKind::kFlores101: return "flores101";
    case TokenizerKind::kFlores200: return "flores200";
    case TokenizerKind::kSpBleu1K: return "spBLEU-1K";
  }
  return "?";
}

bool is_sentencepiece_tokenizer(TokenizerKind kind) {
  return kind == TokenizerKind::kFlores101 || kind == TokenizerKind::kFlores200 ||
         kind == TokenizerKind::kSpBleu1K;
}

std::optional<std::u32string> decode_utf8(std::string_view bytes, size_t* error_offset) {
  std::u32string out;
  out.reserve(bytes.size());
  size_t i = 0;
  auto fail = [&](size_t at) -> std::optional<std::u32string> {
    if (error_offset != nullptr) *error_offset = at;
    return std::nullopt;
  };
  while (i < bytes.size()) {
    const unsigned char lead = static_cast<unsigned char>(bytes[i]);
    if (lead < 0x80) {
      out += static_cast<char32_t>(lead);
      ++i;
      continue;
    }
    size_t length;
    char32_t value;
    char32_t smallest;  // below this the encoding is overlong
    if (lead >= 0xC2 && lead <= 0xDF) {
      length = 2, value = lead & 0x1F, smallest = 0x80;
    } else if (lead >= 0xE0 && lead <= 0xEF) {
      length = 3, value = lead & 0x0F, smallest = 0x800;
    } else if (lead >= 0xF0 && lead <= 0xF4) {
      length = 4, value = lead & 0x07, smallest = 0x10000;
    } else {
      return fail(i);
    }
    if (i + length > bytes.size()) return fail(i);
    for (size_t k = 1; k < length; ++k) {
      const unsigned char next = static_cast<unsigned char>(bytes[i + k]);
      if ((next & 0xC0) != 0x80) return fail(i);
      value = (value << 6) | (next & 0x3F);
    }
    if (value < smallest || value > 0x10FFFF || (value >= 0xD800 && value <= 0xDFFF)) {
      return fail(i);
    }
    out += value;
    i += length;
  }
  return out;
}

std::string encode_utf8(std::u32string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char32_t c : text) {
    if (c < 0x80) {
      out += static_cast<char>(c);
    } else if (c < 0x800) {
      out += static_cast<char>(0xC0 | (c >> 6));
      out += static_cast<char>(0x80 | (c & 0x3F));
    } else if (c < 0x10000) {
      out += static_cast<char>(0xE0 | (c >> 12));
      out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (c & 0x3F));
    } else {
      out += static_cast<char>(0xF0 | (c >> 18));
      out += static_cast<char>(0x80 | ((c >> 12) & 0x3F));
      out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (c & 0x3F));
    }
  }
  return out;
}

bool is_python_whitespace(char32_t c) {
  return in_ranges(c, unicode::kWhitespace, unicode::kWhitespace_size);
}

std::u32string python_lower(std::u32string_view text) {
  std::u32string out;
  out.reserve(text.size());
  const unicode::LowercaseMapping* begin = unicode::kLowercase;
  const unicode::LowercaseMapping* end = begin + unicode::kLowercase_size;
  for (size_t i = 0; i < text.size(); ++i) {
    const char32_t c = text[i];
    if (c == U'\u03A3') {
      out += is_final_sigma(text, i) ? U'\u03C2' : U'\u03C3';
      continue;
    }
    const unicode::LowercaseMapping* found = std::lower_bound(
        begin, end, c, [](const unicode::LowercaseMapping& mapping, char32_t value) {
          return mapping.code_point < value;
        });
    if (found == end || found->code_point != c) {
      out += c;
      continue;
    }
    out += found->lower_first;
    if (found->lower_second != 0) out += found->lower_second;
  }
  return out;
}

std::u32string_view python_rstrip(std::u32string_view text) {
  size_t end = text.size();
  while (end > 0 && is_python_whitespace(text[end - 1])) --end;
  return text.substr(0, end);
}

std::vector<std::u32string_view> python_split(std::u32string_view text) {
  std::vector<std::u32string_view> tokens;
  size_t i = 0;
  while (i < text.size()) {
    while (i < text.size() && is_python_whitespace(text[i])) ++i;
    size_t start = i;
    while (i < text.size() && !is_python_whitespace(text[i])) ++i;
    if (i > start) tokens.push_back(text.substr(start, i - start));
  }
  return tokens;
}

std::u32string tokenize(std::u32string_view line, TokenizerKind kind) {
  switch (kind) {
    case TokenizerKind::k13a: return tokenize_13a(line);
    case TokenizerKind::kIntl: return tokenize_intl(line);
    case TokenizerKind::kChar: return tokenize_char(line);
    case TokenizerKind::kNone: return std::u32string(line);
    case TokenizerKind::kZh: return tokenize_zh(line);
    case TokenizerKind::kFlores101:
    case TokenizerKind::kFlores200:
    case TokenizerKind::kSpBleu1K:
      THPC_FAIL("the tokenizer " << tokenizer_name(kind) << " needs its SentencePiece model "
                                 << "(metrics/sentencepiece_tokenizer.h)");
  }
  return std::u32string(line);
}

std::u32string decode_segment(std::string_view segment, std::optional<size_t> reference_stream,
                              size_t index) {
  size_t bad_offset = 0;
  std::optional<std::u32string> text = decode_utf8(segment, &bad_offset);
  if (!text) {
    std::ostringstream where;
    if (reference_stream) {
      where << "reference " << *reference_stream + 1 << ", segment " << index + 1;
    } else {
      where << "hypothesis segment " << index + 1;
    }
    THPC_FAIL(where.str() << ": invalid UTF-8 at byte " << bad_offset + 1);
  }
  return std::move(*text);
}

size_t reference_segments(const std::vector<std::vector<std::string>>& references) {
  if (references.empty()) THPC_FAIL("no reference streams given");
  const size_t num_segments = references[0].size();
  for (size_t r = 1; r < references.size(); ++r) {
    if (references[r].size() != num_segments) {
      THPC_FAIL("reference stream " << r + 1 << " has " << references[r].size()
                                    << " segments, stream 1 has " << num_segments);
    }
  }
  return num_segments;
}

std::vector<std::vector<std::string>> single_segment_streams(
    const std::vector<std::string>& references) {
  std::vector<std::vector<std::string>> streams;
  for (const std::string& reference : references) streams.push_back({reference});
  return streams;
}

std::string tokenize_utf8(std::string_view line, TokenizerKind kind) {
  size_t bad_offset = 0;
  std::optional<std::u32string> decoded = decode_utf8(line, &bad_offset);
  if (!decoded) THPC_FAIL("invalid UTF-8 at byte " << bad_offset);
  return encode_utf8(tokenize(*decoded, kind));
}

}  // namespace thpc::metrics
