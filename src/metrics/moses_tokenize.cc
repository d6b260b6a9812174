#include "metrics/moses_tokenize.h"

#include <algorithm>
#include <optional>
#include <string>
#include <unordered_map>

#include "common/error.h"
#include "metrics/moses_tables.h"
#include "metrics/tokenize.h"
#include "metrics/unicode_tables.h"

// Each step below is one substitution of tokenizer.perl's `tokenize` (mosesdecoder
// scripts/tokenizer/tokenizer.perl), in the script's order, with the Perl it reproduces
// in the comment. Perl's s/PATTERN/REPLACEMENT/g scans left to right, takes the leftmost
// match and goes on after it: a character a match consumed cannot start or take part in
// the next match. substitute_all does exactly that, so every rule is written as "does a
// match start here, and where does it end".
namespace thpc::metrics {
namespace {

using unicode::in_ranges;

bool is_perl_space(char32_t c) { return in_ranges(c, moses::kPerlSpace, moses::kPerlSpace_size); }
bool is_alnum(char32_t c) { return in_ranges(c, moses::kPerlAlnum, moses::kPerlAlnum_size); }
bool is_alpha(char32_t c) { return in_ranges(c, moses::kPerlAlpha, moses::kPerlAlpha_size); }
bool is_lower(char32_t c) { return in_ranges(c, moses::kPerlLower, moses::kPerlLower_size); }
// \p{IsN}: the general category N, which unicode::kNumber holds (the generator of
// moses_tables.cc checks that Perl agrees).
bool is_number(char32_t c) { return in_ranges(c, unicode::kNumber, unicode::kNumber_size); }
bool is_ascii_digit(char32_t c) { return c >= U'0' && c <= U'9'; }

// s/PATTERN/REPLACEMENT/g for a pattern that never matches the empty string:
// match(text, i, out) returns the end of the match starting at i, having appended its
// replacement to out, or i when none starts there (then text[i] is copied).
template <typename Match>
std::u32string substitute_all(std::u32string_view text, Match match) {
  std::u32string out;
  out.reserve(text.size() + text.size() / 2 + 8);
  size_t i = 0;
  while (i < text.size()) {
    const size_t end = match(text, i, out);
    if (end > i) {
      i = end;
    } else {
      out += text[i];
      ++i;
    }
  }
  return out;
}

// s/LITERAL/REPLACEMENT/g.
std::u32string replace_literal(std::u32string_view text, std::u32string_view literal,
                               std::u32string_view replacement) {
  return substitute_all(text, [&](std::u32string_view t, size_t i, std::u32string& out) {
    if (t.substr(i, literal.size()) != literal) return i;
    out.append(replacement);
    return i + literal.size();
  });
}

bool contains(std::u32string_view text, std::u32string_view literal) {
  return text.find(literal) != std::u32string_view::npos;
}

// s/ +/ /g; s/^ //g; s/ $//g: runs of spaces become one, then one space goes from
// each end (there is at most one left there).
std::u32string squeeze_spaces(std::u32string_view text) {
  std::u32string out = substitute_all(text, [](std::u32string_view t, size_t i,
                                               std::u32string& o) {
    if (t[i] != U' ' || i + 1 >= t.size() || t[i + 1] != U' ') return i;
    size_t end = i;
    while (end < t.size() && t[end] == U' ') ++end;
    o += U' ';
    return end;
  });
  if (!out.empty() && out.front() == U' ') out.erase(0, 1);
  if (!out.empty() && out.back() == U' ') out.pop_back();
  return out;
}

// s/(X)/ $1 /g for a one-character class X: every X gets a space either side.
template <typename Predicate>
std::u32string pad_each(std::u32string_view text, Predicate matches) {
  return substitute_all(text, [&](std::u32string_view t, size_t i, std::u32string& out) {
    if (!matches(t[i])) return i;
    out += U' ';
    out += t[i];
    out += U' ';
    return i + 1;
  });
}

// The French contraction rules, s/(A)[']([B])/$1 ' $2/g or, with glue_left,
// s/(A)[']([B])/$1' $2/g: three characters, all consumed.
template <typename First, typename Second>
std::u32string split_apostrophes(std::u32string_view text, First first, Second second,
                                 bool glue_left) {
  return substitute_all(text, [&](std::u32string_view t, size_t i, std::u32string& out) {
    if (i + 2 >= t.size() || t[i + 1] != U'\'' || !first(t[i]) || !second(t[i + 2])) return i;
    out += t[i];
    out += glue_left ? U"' " : U" ' ";
    out += t[i + 2];
    return i + 3;
  });
}

// split(/\s/, $text): every whitespace character separates two fields, so neighbouring
// separators leave empty fields; a leading empty field is kept, trailing empty fields
// are dropped (Perl's split), so the last field is never empty.
std::vector<std::u32string_view> perl_split_fields(std::u32string_view text) {
  std::vector<std::u32string_view> fields;
  size_t start = 0;
  for (size_t i = 0; i <= text.size(); ++i) {
    if (i == text.size() || is_perl_space(text[i])) {
      fields.push_back(text.substr(start, i - start));
      start = i + 1;
    }
  }
  while (!fields.empty() && fields.back().empty()) fields.pop_back();
  return fields;
}

// tokenizer.perl's %NONBREAKING_PREFIX for a language: prefix -> 1 or 2.
const std::unordered_map<std::string, int>& nonbreaking_prefixes(MosesLanguage language) {
  auto build = [](const moses::NonbreakingPrefix* table, size_t size) {
    std::unordered_map<std::string, int> prefixes;
    for (size_t i = 0; i < size; ++i) prefixes[table[i].prefix] = table[i].kind;
    return prefixes;
  };
  static const auto german = build(moses::kGermanPrefixes, moses::kGermanPrefixes_size);
  static const auto french = build(moses::kFrenchPrefixes, moses::kFrenchPrefixes_size);
  return language == MosesLanguage::kGerman ? german : french;
}

int prefix_kind(std::u32string_view word, MosesLanguage language) {
  const auto& prefixes = nonbreaking_prefixes(language);
  const auto found = prefixes.find(encode_utf8(word));
  return found == prefixes.end() ? 0 : found->second;
}

// The "word token method": a field WORD. (one or more characters, then a period, then
// the end) has its period split off as " ." unless the period is an abbreviation's.
std::u32string split_final_periods(std::u32string_view text, const MosesTokenizerOptions& options) {
  const std::vector<std::u32string_view> words = perl_split_fields(text);
  std::u32string out;
  for (size_t i = 0; i < words.size(); ++i) {
    const std::u32string_view word = words[i];
    const bool last = i + 1 == words.size();
    bool split = false;
    if (word.size() >= 2 && word.back() == U'.') {  // /^(\S+)\.$/
      const std::u32string_view pre = word.substr(0, word.size() - 1);
      const int kind = prefix_kind(pre, options.language);
      bool has_period = false;
      bool has_alpha = false;
      for (char32_t c : pre) {
        has_period = has_period || c == U'.';
        has_alpha = has_alpha || is_alpha(c);
      }
      // The next field may be empty (two separators in a row): then it starts with
      // neither a lowercase letter nor a digit.
      const bool next_lower = !last && !words[i + 1].empty() && is_lower(words[i + 1][0]);
      const bool next_digit = !last && !words[i + 1].empty() && is_ascii_digit(words[i + 1][0]);
      if (last && options.version == MosesVersion::kCurrent) {
        split = true;  // since 9fc964d: the last word's period always goes
      } else if ((has_period && has_alpha) || kind == 1 || next_lower) {
        split = false;  // z.B. / a prefix / a lowercase word follows: not a sentence end
      } else if (kind == 2 && next_digit) {
        split = false;  // #NUMERIC_ONLY# prefix before a number
      } else {
        split = true;
      }
    }
    if (split) {
      out.append(word.substr(0, word.size() - 1));
      out += U" .";
    } else {
      out.append(word);
    }
    out += U' ';
  }
  return out;
}

// #escape special chars: s/\&/\&amp;/g first, then | < > ' " [ ] (none of whose
// replacements holds a character a later rule replaces, so one pass per character does
// the same).
std::u32string escape_special_characters(std::u32string_view text) {
  std::u32string out;
  out.reserve(text.size() + 16);
  for (char32_t c : text) {
    switch (c) {
      case U'&': out += U"&amp;"; break;
      case U'|': out += U"&#124;"; break;
      case U'<': out += U"&lt;"; break;
      case U'>': out += U"&gt;"; break;
      case U'\'': out += U"&apos;"; break;
      case U'"': out += U"&quot;"; break;
      case U'[': out += U"&#91;"; break;
      case U']': out += U"&#93;"; break;
      default: out += c;
    }
  }
  return out;
}

}  // namespace

MosesLanguage parse_moses_language(const std::string& code) {
  if (code == "de") return MosesLanguage::kGerman;
  if (code == "fr") return MosesLanguage::kFrench;
  THPC_FAIL("unknown Moses tokenizer language '" << code << "' (expected de | fr)");
}

MosesVersion parse_moses_version(const std::string& name) {
  if (name == "current") return MosesVersion::kCurrent;
  if (name == "2017") return MosesVersion::k2017;
  THPC_FAIL("unknown Moses tokenizer version '" << name << "' (expected current | 2017)");
}

std::u32string moses_tokenize(std::u32string_view line, const MosesTokenizerOptions& options) {
  // The main loop prints a line matching /^\s*$/ as it is.
  bool blank = true;
  for (char32_t c : line) blank = blank && is_perl_space(c);
  if (blank) return std::u32string(line);

  // $text = " $text "; s/\s+/ /g; s/[\000-\037]//g; then the spaces squeezed.
  std::u32string text = U" ";
  text.append(line);
  text += U' ';
  text = substitute_all(text, [](std::u32string_view t, size_t i, std::u32string& out) {
    if (!is_perl_space(t[i])) return i;
    size_t end = i;
    while (end < t.size() && is_perl_space(t[end])) ++end;
    out += U' ';
    return end;
  });
  text.erase(std::remove_if(text.begin(), text.end(), [](char32_t c) { return c < 0x20; }),
             text.end());
  text = squeeze_spaces(text);

  // s/([^\p{IsAlnum}\s\.\'\`\,\-])/ $1 /g: everything but letters, digits, whitespace
  // and . ' ` , - stands alone.
  text = pad_each(text, [](char32_t c) {
    return !is_alnum(c) && !is_perl_space(c) && c != U'.' && c != U'\'' && c != U'`' &&
           c != U',' && c != U'-';
  });

  // Multi-dots stay together. s/\.([\.]+)/ DOTMULTI$1/g: a run of two or more periods
  // becomes " DOTMULTI" and the run less its first period ...
  text = substitute_all(text, [](std::u32string_view t, size_t i, std::u32string& out) {
    if (t[i] != U'.' || i + 1 >= t.size() || t[i + 1] != U'.') return i;
    size_t end = i + 1;
    while (end < t.size() && t[end] == U'.') ++end;
    out += U" DOTMULTI";
    out.append(t.substr(i + 1, end - i - 1));
    return end;
  });
  // ... then, while /DOTMULTI\./ matches: s/DOTMULTI\.([^\.])/DOTDOTMULTI $1/g and
  // s/DOTMULTI\./DOTDOTMULTI/g, each period turning into one more DOT.
  while (contains(text, U"DOTMULTI.")) {
    text = substitute_all(text, [](std::u32string_view t, size_t i, std::u32string& out) {
      constexpr std::u32string_view kMarked = U"DOTMULTI.";
      if (t.substr(i, kMarked.size()) != kMarked || i + kMarked.size() >= t.size() ||
          t[i + kMarked.size()] == U'.') {
        return i;
      }
      out += U"DOTDOTMULTI ";
      out += t[i + kMarked.size()];
      return i + kMarked.size() + 1;
    });
    text = replace_literal(text, U"DOTMULTI.", U"DOTDOTMULTI");
  }

  // Commas, except inside numbers (5,300): s/([^\p{IsN}])[,]/$1 , /g, then
  // s/[,]([^\p{IsN}])/ , $1/g, then s/([\p{IsN}])[,]$/$1 ,/g.
  text = substitute_all(text, [](std::u32string_view t, size_t i, std::u32string& out) {
    if (i + 1 >= t.size() || t[i + 1] != U',' || is_number(t[i])) return i;
    out += t[i];
    out += U" , ";
    return i + 2;
  });
  text = substitute_all(text, [](std::u32string_view t, size_t i, std::u32string& out) {
    if (t[i] != U',' || i + 1 >= t.size() || is_number(t[i + 1])) return i;
    out += U" , ";
    out += t[i + 1];
    return i + 2;
  });
  if (text.size() >= 2 && text.back() == U',' && is_number(text[text.size() - 2])) {
    text.insert(text.size() - 1, 1, U' ');
  }

  // Apostrophes.
  if (options.language == MosesLanguage::kFrench) {
    // "split contractions left": l'homme -> l' homme.
    const auto alpha = [](char32_t c) { return is_alpha(c); };
    const auto not_alpha = [](char32_t c) { return !is_alpha(c); };
    text = split_apostrophes(text, not_alpha, not_alpha, false);
    text = split_apostrophes(text, not_alpha, alpha, false);
    text = split_apostrophes(text, alpha, not_alpha, false);
    text = split_apostrophes(text, alpha, alpha, true);
  } else {
    text = pad_each(text, [](char32_t c) { return c == U'\''; });  // s/\'/ \' /g
  }

  text = squeeze_spaces(split_final_periods(text, options));

  // s/\.\' ?$/ . ' /: a period and apostrophe ending the line (after the squeeze there
  // is no space to match).
  if (text.size() >= 2 && text[text.size() - 2] == U'.' && text.back() == U'\'') {
    text.erase(text.size() - 2);
    text += U" . ' ";
  }

  // Restore multi-dots: s/DOTDOTMULTI/DOTMULTI./g while /DOTDOTMULTI/ matches, then
  // s/DOTMULTI/./g.
  while (contains(text, U"DOTDOTMULTI")) text = replace_literal(text, U"DOTDOTMULTI", U"DOTMULTI.");
  text = replace_literal(text, U"DOTMULTI", U".");

  return escape_special_characters(text);
}

std::string moses_tokenize_utf8(std::string_view line, const MosesTokenizerOptions& options) {
  size_t bad_offset = 0;
  const std::optional<std::u32string> text = decode_utf8(line, &bad_offset);
  if (!text) THPC_FAIL("invalid UTF-8 at byte " << bad_offset + 1 << " of the line");
  return encode_utf8(moses_tokenize(*text, options));
}

namespace {

// \s of Perl on a byte string (no unicode_strings): the six ASCII whitespace bytes.
bool is_ascii_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r';
}

}  // namespace

std::string split_compounds(std::string_view tokenized_line) {
  std::string out;
  out.reserve(tokenized_line.size() + 32);
  size_t i = 0;
  while (i < tokenized_line.size()) {
    if (i + 2 < tokenized_line.size() && tokenized_line[i + 1] == '-' &&
        !is_ascii_space(tokenized_line[i]) && !is_ascii_space(tokenized_line[i + 2])) {
      out += tokenized_line[i];
      out += " ##AT##-##AT## ";
      out += tokenized_line[i + 2];
      i += 3;
    } else {
      out += tokenized_line[i];
      ++i;
    }
  }
  return out;
}

std::vector<std::string> split_multi_bleu_tokens(std::string_view line) {
  std::vector<std::string> tokens;
  size_t i = 0;
  while (i < line.size()) {
    while (i < line.size() && is_ascii_space(line[i])) ++i;
    size_t end = i;
    while (end < line.size() && !is_ascii_space(line[end])) ++end;
    if (end > i) tokens.emplace_back(line.substr(i, end - i));
    i = end;
  }
  return tokens;
}

}  // namespace thpc::metrics
