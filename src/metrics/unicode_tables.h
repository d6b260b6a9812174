// Unicode data for the BLEU tokenizers, generated from Python by
// tools/gen_unicode_tables.py (see there for how each table is derived) so that our
// tokenisation matches sacreBLEU's, which runs on Python's string functions.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

namespace thpc::metrics::unicode {

struct CodePointRange {
  char32_t first;  // inclusive
  char32_t last;   // inclusive
};

// str.lower() of one code point: one or two code points (second is 0 when one).
struct LowercaseMapping {
  char32_t code_point;
  char32_t lower_first;
  char32_t lower_second;
};

extern const char kUnicodeVersion[];

// Sorted, disjoint ranges.
extern const CodePointRange kNumber[];         // general category N* (Moses' \p{IsN})
extern const std::size_t kNumber_size;
// The intl tokenizer's \p{P}, \p{S} and \p{N} as sacreBLEU compiles them, with the
// `regex` package, whose Unicode is newer than Python 3.11's: characters added since
// Unicode 14.0 (U+16FE2, U+1FAE0, ...) are punctuation or symbols here, unassigned to
// Python's unicodedata (from which they were taken before: left glued to their word).
extern const char kIntlRegexVersion[];
extern const CodePointRange kIntlPunctuation[];
extern const std::size_t kIntlPunctuation_size;
extern const CodePointRange kIntlSymbol[];
extern const std::size_t kIntlSymbol_size;
extern const CodePointRange kIntlNumber[];
extern const std::size_t kIntlNumber_size;
extern const CodePointRange kWhitespace[];     // Python str.isspace()
extern const std::size_t kWhitespace_size;
extern const CodePointRange kCased[];          // Unicode Cased
extern const std::size_t kCased_size;
extern const CodePointRange kCaseIgnorable[];  // Unicode Case_Ignorable
extern const std::size_t kCaseIgnorable_size;

// Sorted by code point; only code points that str.lower() changes.
extern const LowercaseMapping kLowercase[];
extern const std::size_t kLowercase_size;

// Whether c lies in one of `size` sorted, disjoint ranges.
inline bool in_ranges(char32_t c, const CodePointRange* table, std::size_t size) {
  const CodePointRange* end = table + size;
  // The first range starting after c; c can only lie in the one before it.
  const CodePointRange* after =
      std::upper_bound(table, end, c, [](char32_t value, const CodePointRange& range) {
        return value < range.first;
      });
  return after != table && c <= (after - 1)->last;
}

}  // namespace thpc::metrics::unicode
