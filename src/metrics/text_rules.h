// The rewriting rules that sacreBLEU's tokenizers are made of, each the Python it stands
// for: mteval-v13a's (tokenize.cc) and Tercom's normalizer (ter.cc) share them.
#pragma once

#include <string>
#include <string_view>

#include "metrics/tokenize.h"

namespace thpc::metrics::text_rules {

inline bool is_ascii_digit(char32_t c) { return c >= U'0' && c <= U'9'; }

// The first rule of mteval-v13a: [{-~[-` -&(-+:-@/], i.e. ASCII punctuation and
// symbols except ' - . , which the later rules (or nothing) handle.
inline bool is_13a_split_character(char32_t c) {
  return (c >= U'{' && c <= U'~') || (c >= U'[' && c <= U'`') || (c >= U' ' && c <= U'&') ||
         (c >= U'(' && c <= U'+') || (c >= U':' && c <= U'@') || c == U'/';
}

// Python's str.replace(from, to): left to right, non-overlapping.
inline std::u32string replace_all(std::u32string_view text, std::u32string_view from,
                                  std::u32string_view to) {
  std::u32string out;
  out.reserve(text.size());
  size_t position = 0;
  while (true) {
    size_t found = text.find(from, position);
    if (found == std::u32string_view::npos) break;
    out.append(text.substr(position, found - position));
    out.append(to);
    position = found + from.size();
  }
  out.append(text.substr(position));
  return out;
}

// re.sub(r'(X)', r' \1 ', text): every X gets a space either side.
template <typename Predicate>
std::u32string pad_each(std::u32string_view text, Predicate matches) {
  std::u32string out;
  out.reserve(text.size() * 2);
  for (char32_t c : text) {
    if (matches(c)) {
      out += U' ';
      out += c;
      out += U' ';
    } else {
      out += c;
    }
  }
  return out;
}

// Which side of the matched pair the replacement adds spaces to:
//   kAfterFirst:  (A)(B) -> "\1 \2 "     kBeforeFirst: (A)(B) -> " \1 \2"
enum class PairSpacing { kAfterFirst, kBeforeFirst };

// re.sub on a two-character pattern (A)(B): scanning left to right, a match consumes
// both characters, so the second one cannot start the next match.
template <typename FirstPredicate, typename SecondPredicate>
std::u32string split_pairs(std::u32string_view text, FirstPredicate first_matches,
                           SecondPredicate second_matches, PairSpacing spacing) {
  std::u32string out;
  out.reserve(text.size() * 2);
  size_t i = 0;
  while (i < text.size()) {
    if (i + 1 < text.size() && first_matches(text[i]) && second_matches(text[i + 1])) {
      if (spacing == PairSpacing::kAfterFirst) {
        out += text[i];
        out += U' ';
        out += text[i + 1];
        out += U' ';
      } else {
        out += U' ';
        out += text[i];
        out += U' ';
        out += text[i + 1];
      }
      i += 2;
    } else {
      out += text[i];
      i += 1;
    }
  }
  return out;
}

// ' '.join(text.split()): single spaces between tokens, none at the ends.
inline std::u32string join_tokens(std::u32string_view text) {
  std::u32string out;
  for (std::u32string_view token : python_split(text)) {
    if (!out.empty()) out += U' ';
    out.append(token);
  }
  return out;
}

inline bool is_period_or_comma(char32_t c) { return c == U'.' || c == U','; }
inline bool is_not_ascii_digit(char32_t c) { return !is_ascii_digit(c); }

}  // namespace thpc::metrics::text_rules
