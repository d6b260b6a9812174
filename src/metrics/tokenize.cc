#include "metrics/tokenize.h"

#include <algorithm>
#include <sstream>

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
  text = U" " + text + U" ";

  text = pad_each(text, is_13a_split_character);
  // Period and comma split off unless between digits (3.14, 1,000 stay whole).
  text = split_pairs(text, is_not_ascii_digit, is_period_or_comma, PairSpacing::kAfterFirst);
  text = split_pairs(text, is_period_or_comma, is_not_ascii_digit, PairSpacing::kBeforeFirst);
  // A dash after a digit splits off (ranges such as 1990-2000).
  text = split_pairs(text, is_ascii_digit, [](char32_t c) { return c == U'-'; },
                     PairSpacing::kAfterFirst);
  return join_tokens(text);
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
  THPC_FAIL("unknown tokenizer '" << name << "' (expected 13a | intl | char | none)");
}

std::string tokenizer_name(TokenizerKind kind) {
  switch (kind) {
    case TokenizerKind::k13a: return "13a";
    case TokenizerKind::kIntl: return "intl";
    case TokenizerKind::kChar: return "char";
    case TokenizerKind::kNone: return "none";
  }
  return "?";
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
