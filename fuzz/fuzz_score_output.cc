// transformer_score's output pieces (src/metrics/json_text, src/metrics/text_table): the
// first 8 bytes as a double, the rest as a string and as the cells of a several-systems
// table. Properties:
// repr(float) reads back as the same double (its sign included); json.dumps of a UTF-8
// string decodes back to it, with and without ensure_ascii, and with ensure_ascii is
// ASCII; tabulate's fancy_grid of cells without line-breaking controls other than \n is
// a rectangle: every line the same number of code points.
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "fuzz_target.h"
#include "metrics/json_text.h"
#include "metrics/text_table.h"
#include "metrics/tokenize.h"

namespace {

// The JSON string literal `json` decoded back to UTF-8 (what json.loads gives).
std::string decode_json_string(const std::string& json) {
  using thpc::fuzz::require;
  require(json.size() >= 2 && json.front() == '"' && json.back() == '"', "a quoted string");
  std::u32string text;
  const std::optional<std::u32string> body =
      thpc::metrics::decode_utf8(std::string_view(json).substr(1, json.size() - 2));
  require(body.has_value(), "the JSON text is UTF-8");
  const std::u32string& chars = *body;
  for (size_t i = 0; i < chars.size(); ++i) {
    if (chars[i] != U'\\') {
      require(chars[i] >= 0x20 && chars[i] != U'"', "controls and quotes are escaped");
      text += chars[i];
      continue;
    }
    require(i + 1 < chars.size(), "an escape is complete");
    const char32_t kind = chars[++i];
    switch (kind) {
      case U'"': text += U'"'; break;
      case U'\\': text += U'\\'; break;
      case U'n': text += U'\n'; break;
      case U'r': text += U'\r'; break;
      case U't': text += U'\t'; break;
      case U'b': text += U'\b'; break;
      case U'f': text += U'\f'; break;
      case U'u': {
        require(i + 4 < chars.size(), "\\u has four hex digits");
        const std::string digits = thpc::metrics::encode_utf8(chars.substr(i + 1, 4));
        char32_t code = static_cast<char32_t>(std::strtoul(digits.c_str(), nullptr, 16));
        i += 4;
        if (code >= 0xD800 && code <= 0xDBFF) {
          require(i + 6 < chars.size() && chars[i + 1] == U'\\' && chars[i + 2] == U'u',
                  "a high surrogate is followed by a low one");
          const std::string low = thpc::metrics::encode_utf8(chars.substr(i + 3, 4));
          const auto second = static_cast<char32_t>(std::strtoul(low.c_str(), nullptr, 16));
          require(second >= 0xDC00 && second <= 0xDFFF, "the pair's second is a low surrogate");
          code = 0x10000 + ((code - 0xD800) << 10) + (second - 0xDC00);
          i += 6;
        }
        text += code;
        break;
      }
      default: require(false, "a known escape");
    }
  }
  return thpc::metrics::encode_utf8(text);
}

size_t code_points(const std::string& line) {
  size_t count = 0;
  for (const char c : line) count += (static_cast<unsigned char>(c) & 0xC0) != 0x80 ? 1 : 0;
  return count;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace thpc::metrics;
  using thpc::fuzz::require;
  if (size >= 8) {
    double value = 0;
    std::memcpy(&value, data, 8);
    if (std::isfinite(value)) {
      const std::string repr = python_float_repr(value);
      const double back = std::strtod(repr.c_str(), nullptr);
      require(std::memcmp(&back, &value, 8) == 0, "repr(float) reads back as the same double");
    }
  }
  // The bytes after the double's are the text (all of them in a shorter input).
  const std::string_view bytes = thpc::fuzz::bytes_of(data, size).substr(size >= 8 ? 8 : 0);
  const std::optional<std::u32string> text = decode_utf8(bytes);
  if (!text) return 0;  // the scorer reads UTF-8 only (fuzz_bleu_tokenize checks that)
  const std::string utf8(bytes);
  for (const bool ensure_ascii : {false, true}) {
    const std::string json = json_string(utf8, ensure_ascii);
    if (ensure_ascii) {
      for (const char c : json) require(static_cast<unsigned char>(c) < 0x80, "ASCII JSON");
    }
    require(decode_json_string(json) == utf8, "json.loads(json.dumps(s)) == s");
  }
  // Cells: the text cut at U+001F (unit separator) into up to 12, laid out as 3 columns
  // of up to 4 rows; the first its header row.
  std::vector<std::string> cells;
  std::u32string cell;
  for (const char32_t c : *text) {
    if (c == 0x1F && cells.size() < 11) {
      cells.push_back(encode_utf8(cell));
      cell.clear();
    } else {
      cell += c;
    }
  }
  cells.push_back(encode_utf8(cell));
  std::vector<std::string> headers;
  std::vector<std::vector<std::string>> columns(3);
  for (size_t i = 0; i < cells.size(); ++i) {
    if (i < 3) {
      headers.push_back(cells[i]);
    } else {
      columns[i % 3].push_back(cells[i]);
    }
  }
  headers.resize(3);
  const std::string table = fancy_grid_table(headers, columns, static_cast<int>(size % 7));
  // LaTeX's escapes widen the lines they fall in (tabulate pads before escaping): taken,
  // not measured.
  latex_booktabs_table(headers, columns, static_cast<int>(size % 7));
  bool plain = true;  // no control that splitlines() breaks at but the width ignores
  for (const char32_t c : *text) {
    plain = plain && (c == U'\n' || c == 0x1F || (c >= 0x20 && c != 0x7F && c != 0x85 &&
                                                  c != 0x2028 && c != 0x2029));
  }
  if (plain) {
    size_t width = 0, start = 0;
    for (size_t end; (end = table.find('\n', start)) != std::string::npos || start < table.size();
         start = end + 1) {
      if (end == std::string::npos) end = table.size();
      const size_t line = code_points(table.substr(start, end - start));
      if (width == 0) width = line;
      require(line == width, "every line of the table is as wide as the first");
    }
  }
  return 0;
}
