// TER's search (src/metrics/ter): any bytes as a line of a hypothesis or reference file,
// under four of TER's sixteen option sets (each option in two of them; the search is
// slow beside the other targets' work, so fewer sets mean more inputs). Properties: a line
// against itself scores 0 where tokenizing twice changes nothing (sacreBLEU normalizes a
// reference twice, a hypothesis once: --ter-normalized may not); against the empty line
// every word is an edit (100, or 0 without words); against its reverse and its first half,
// no more edits than the longer side has words (a shift is taken only when it lowers the
// edit distance by one at least, and a path of that many edits lies within the beam), and
// the reference's length is its words.
#include <algorithm>

#include "fuzz_target.h"
#include "metrics/ter.h"
#include "metrics/tokenize.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace thpc::metrics;
  const std::string_view bytes = thpc::fuzz::bytes_of(data, size);
  const std::optional<std::u32string> text = decode_utf8(bytes);
  if (!text) return 0;  // fuzz_bleu_tokenize checks the decoding
  const std::string line(bytes);
  const std::string reversed = encode_utf8(std::u32string(text->rbegin(), text->rend()));
  const std::string half = encode_utf8(std::u32string_view(*text).substr(0, text->size() / 2));
  for (const int bits : {0b0000, 0b0101, 0b0110, 0b1011}) {
    TerOptions ter;
    ter.normalized = (bits & 1) != 0;
    ter.no_punct = (bits & 2) != 0;
    ter.asian_support = (bits & 4) != 0;
    ter.case_sensitive = (bits & 8) != 0;
    const auto word_count = [&](std::u32string_view segment) {
      return static_cast<int64_t>(python_split(tercom_tokenize(segment, ter)).size());
    };
    const int64_t words = word_count(*text);
    if (!ter.normalized) {
      thpc::fuzz::require(sentence_ter(line, {line}, ter) == 0.0,
                          "TER of a line against itself is 0");
    }
    thpc::fuzz::require(sentence_ter(line, {std::string()}, ter) == (words > 0 ? 100.0 : 0.0),
                        "TER against an empty reference is 100 (0 for an empty line)");
    for (const std::string& other : {reversed, half}) {
      const TerStatistics statistics = TerScorer({{other}}, ter).segment_statistics(0, line);
      // The reference's words after its two passes of the tokenizer.
      const int64_t reference_words = word_count(tercom_tokenize(*decode_utf8(other), ter));
      thpc::fuzz::require(
          statistics.edits >= 0 && statistics.edits <= std::max(words, reference_words),
          "TER's edits are at most the longer side's words");
      thpc::fuzz::require(statistics.reference_length == static_cast<double>(reference_words),
                          "TER's reference length is its words");
    }
  }
  return 0;
}
