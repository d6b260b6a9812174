// BLEU's and chrF's text handling (src/metrics/tokenize, src/metrics/chrf): any bytes as
// a line of a hypothesis or reference file. Strict UTF-8 decoding must reject exactly what
// tokenize_utf8 rejects and give back the bytes it accepted; every tokenizer must take
// every decoded line; a line scored against itself is BLEU in [0, 100] and chrF exactly
// 100 (0 when the line has no character that chrF counts).
#include "fuzz_target.h"
#include "metrics/bleu.h"
#include "metrics/chrf.h"
#include "metrics/tokenize.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace thpc;
  using namespace thpc::metrics;
  const std::string_view bytes = fuzz::bytes_of(data, size);
  size_t error_offset = 0;
  const std::optional<std::u32string> text = decode_utf8(bytes, &error_offset);
  if (!text) {
    fuzz::require(error_offset < size, "the bad sequence's offset lies in the input");
    bool refused = false;
    try {
      tokenize_utf8(bytes, TokenizerKind::k13a);
    } catch (const Error&) {
      refused = true;
    }
    fuzz::require(refused, "tokenize_utf8 accepts what decode_utf8 rejects");
    return 0;
  }
  fuzz::require(encode_utf8(*text) == bytes, "encode_utf8(decode_utf8(x)) == x");
  for (const std::u32string_view word : python_split(*text)) {
    fuzz::require(!word.empty(), "str.split() gives no empty tokens");
    for (const char32_t c : word) fuzz::require(!is_python_whitespace(c), "no space in a token");
  }
  const std::u32string lower = python_lower(*text);
  python_rstrip(lower);
  for (const TokenizerKind kind : {TokenizerKind::k13a, TokenizerKind::kIntl,
                                   TokenizerKind::kChar, TokenizerKind::kNone}) {
    tokenize(*text, kind);
  }
  // zh: tokens joined by single spaces, none at either end (' '.join(line.split())).
  const std::u32string zh = tokenize(*text, TokenizerKind::kZh);
  fuzz::require(zh.empty() || (zh.front() != U' ' && zh.back() != U' ' &&
                               zh.find(U"  ") == std::u32string::npos),
                "zh's tokens are joined by single spaces");
  // The line scored against itself, as transformer_score would.
  const std::string line(bytes);
  const BleuScore score = sentence_bleu(line, {line}, BleuOptions{});
  fuzz::require(score.score >= 0.0 && score.score <= 100.0 + 1e-9, "BLEU within [0, 100]");
  // chrF, chrF++ with whitespace kept and lowercased: every order a line has n-grams of
  // matches in full (P = R = 1), so the score is exactly 100; no characters, exactly 0.
  bool has_non_space = false;
  for (const char32_t c : *text) has_non_space = has_non_space || !is_python_whitespace(c);
  fuzz::require(sentence_chrf(line, {line}) == (has_non_space ? 100.0 : 0.0),
                "chrF of a line against itself is 100 (0 when it is all whitespace)");
  ChrfOptions options;
  options.word_order = 2;
  options.whitespace = true;
  options.lowercase = true;
  fuzz::require(sentence_chrf(line, {line}, options) == (text->empty() ? 0.0 : 100.0),
                "chrF++ keeping whitespace, of a line against itself, is 100 (0 when empty)");
  // Against the empty line, the line reversed and its first half: within [0, 100].
  const std::string reversed = encode_utf8(std::u32string(text->rbegin(), text->rend()));
  const std::string half = encode_utf8(std::u32string_view(*text).substr(0, text->size() / 2));
  for (const std::string& other : {std::string(), reversed}) {
    const double chrf = sentence_chrf(line, {other, half}, options);
    fuzz::require(chrf >= 0.0 && chrf <= 100.0, "chrF within [0, 100]");
  }
  return 0;
}
