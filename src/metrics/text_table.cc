// sacreBLEU's multi-system tables: what tabulate 0.10.0 does with sacreBLEU's calls (see
// text_table.h), step by step, on Python strings (code points).
#include "metrics/text_table.h"

#include <locale.h>
#include <stdlib.h>

#include <algorithm>
#include <array>
#include <charconv>
#include <cmath>
#include <optional>
#include <string_view>

#include "common/error.h"
#include "metrics/tokenize.h"

namespace thpc::metrics {
namespace {

using Text = std::u32string;
using TextView = std::u32string_view;

// ---- Python strings from bytes and back ----------------------------------------------

// A byte that is not UTF-8 becomes U+DC00 + byte, as Python's surrogateescape makes it
// for the command-line arguments sacreBLEU takes its file names from: one character wide.
constexpr char32_t kEscapedByteBase = 0xDC00;

Text decode(std::string_view bytes) {
  Text out;
  while (!bytes.empty()) {
    size_t bad = 0;
    if (std::optional<Text> text = decode_utf8(bytes, &bad)) {
      out += *text;
      break;
    }
    out += *decode_utf8(bytes.substr(0, bad));  // valid up to the bad byte
    out += kEscapedByteBase + static_cast<unsigned char>(bytes[bad]);
    bytes.remove_prefix(bad + 1);
  }
  return out;
}

std::string encode(TextView text) {
  std::string out;
  for (const char32_t c : text) {
    if (c >= kEscapedByteBase + 0x80 && c <= kEscapedByteBase + 0xFF) {
      out += static_cast<char>(c - kEscapedByteBase);
    } else {
      out += encode_utf8(TextView(&c, 1));
    }
  }
  return out;
}

// str.strip(): whitespace as str.isspace() has it, both ends.
TextView strip(TextView text) {
  while (!text.empty() && is_python_whitespace(text.front())) text.remove_prefix(1);
  while (!text.empty() && is_python_whitespace(text.back())) text.remove_suffix(1);
  return text;
}

// str.splitlines(): the line boundaries Python knows, "\r\n" as one; no line after a
// final boundary, none at all for "".
bool is_line_boundary(char32_t c) {
  return c == U'\n' || c == U'\r' || c == 0x0B || c == 0x0C || c == 0x1C || c == 0x1D ||
         c == 0x1E || c == 0x85 || c == 0x2028 || c == 0x2029;
}

std::vector<Text> splitlines(TextView text) {
  std::vector<Text> lines;
  size_t start = 0;
  for (size_t i = 0; i < text.size(); ++i) {
    if (!is_line_boundary(text[i])) continue;
    lines.emplace_back(text.substr(start, i - start));
    if (text[i] == U'\r' && i + 1 < text.size() && text[i + 1] == U'\n') ++i;
    start = i + 1;
  }
  if (start < text.size()) lines.emplace_back(text.substr(start));
  return lines;
}

// re.split("[\r\n]", text): every "\r" and every "\n" splits, so "\r\n" leaves an empty
// piece between them; "" is one empty piece. How tabulate measures and splits headers.
std::vector<Text> split_cr_lf(TextView text) {
  std::vector<Text> pieces(1);
  for (const char32_t c : text) {
    if (c == U'\r' || c == U'\n') {
      pieces.emplace_back();
    } else {
      pieces.back() += c;
    }
  }
  return pieces;
}

// ---- Python's int() and float() of a string ------------------------------------------

// The code points whose Unicode decimal value (Python 3.11's unicodedata, Unicode 14.0.0)
// is 0; each is followed by the digits 1..9 and no other code point has a decimal value:
//   [c for c in range(0x110000) if unicodedata.decimal(chr(c), None) == 0]
constexpr std::array<char32_t, 66> kDecimalZeros = {
    0x30,    0x660,   0x6f0,   0x7c0,   0x966,   0x9e6,   0xa66,   0xae6,   0xb66,
    0xbe6,   0xc66,   0xce6,   0xd66,   0xde6,   0xe50,   0xed0,   0xf20,   0x1040,
    0x1090,  0x17e0,  0x1810,  0x1946,  0x19d0,  0x1a80,  0x1a90,  0x1b50,  0x1bb0,
    0x1c40,  0x1c50,  0xa620,  0xa8d0,  0xa900,  0xa9d0,  0xa9f0,  0xaa50,  0xabf0,
    0xff10,  0x104a0, 0x10d30, 0x11066, 0x110f0, 0x11136, 0x111d0, 0x112f0, 0x11450,
    0x114d0, 0x11650, 0x116c0, 0x11730, 0x118e0, 0x11950, 0x11c50, 0x11d50, 0x11da0,
    0x16a60, 0x16ac0, 0x16b50, 0x1d7ce, 0x1d7d8, 0x1d7e2, 0x1d7ec, 0x1d7f6, 0x1e140,
    0x1e2f0, 0x1e950, 0x1fbf0};

int decimal_value(char32_t c) {
  const auto after = std::upper_bound(kDecimalZeros.begin(), kDecimalZeros.end(), c);
  if (after == kDecimalZeros.begin()) return -1;
  const char32_t offset = c - *(after - 1);
  return offset < 10 ? static_cast<int>(offset) : -1;
}

bool is_ascii_space(char c) {  // Py_ISSPACE: what int() and float() strip
  return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r';
}

bool is_digit(char c) { return c >= '0' && c <= '9'; }

// What int() and float() read of a str: Unicode whitespace becomes a space and Unicode
// digits ASCII digits (ASCII stays as it is, "\x1c" included); any other character makes
// the number invalid (nullopt). Then ASCII whitespace is stripped from both ends.
std::optional<std::string> number_text(TextView text) {
  std::string ascii;
  for (const char32_t c : text) {
    if (c < 0x80) {
      ascii += static_cast<char>(c);
    } else if (is_python_whitespace(c)) {
      ascii += ' ';
    } else if (const int digit = decimal_value(c); digit >= 0) {
      ascii += static_cast<char>('0' + digit);
    } else {
      return std::nullopt;
    }
  }
  size_t begin = 0;
  size_t end = ascii.size();
  while (begin < end && is_ascii_space(ascii[begin])) ++begin;
  while (end > begin && is_ascii_space(ascii[end - 1])) --end;
  return ascii.substr(begin, end - begin);
}

// The most digits int() reads from a string (Python 3.11's default
// sys.get_int_max_str_digits()); a longer one raises ValueError.
constexpr size_t kMaxIntDigits = 4300;

// Whether int(text) succeeds: a sign, then digits with single underscores between them.
bool python_int_parses(TextView text) {
  const std::optional<std::string> ascii = number_text(text);
  if (!ascii) return false;
  std::string_view s = *ascii;
  if (!s.empty() && (s.front() == '+' || s.front() == '-')) s.remove_prefix(1);
  size_t digits = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    if (is_digit(s[i])) {
      ++digits;
    } else if (s[i] != '_' || i == 0 || !is_digit(s[i - 1]) || i + 1 == s.size() ||
               !is_digit(s[i + 1])) {
      return false;
    }
  }
  return digits > 0 && digits <= kMaxIntDigits;
}

bool equals_ignoring_ascii_case(std::string_view s, std::string_view lower) {
  if (s.size() != lower.size()) return false;
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i] >= 'A' && s[i] <= 'Z' ? static_cast<char>(s[i] - 'A' + 'a') : s[i];
    if (c != lower[i]) return false;
  }
  return true;
}

// float(text), or nullopt where it raises ValueError. Python reads a sign, then "inf",
// "infinity" or "nan" in any case, or a decimal with an optional exponent; an underscore
// only between two digits; no hexadecimal. Too large is inf, not an error.
std::optional<double> python_float(TextView text) {
  const std::optional<std::string> ascii = number_text(text);
  if (!ascii || ascii->empty()) return std::nullopt;
  std::string s;  // without its underscores
  for (size_t i = 0; i < ascii->size(); ++i) {
    const char c = (*ascii)[i];
    if (c != '_') {
      s += c;
    } else if (i == 0 || !is_digit((*ascii)[i - 1]) || i + 1 == ascii->size() ||
               !is_digit((*ascii)[i + 1])) {
      return std::nullopt;
    }
  }
  std::string_view body = s;
  const bool negative = body.front() == '-';
  if (body.front() == '+' || body.front() == '-') body.remove_prefix(1);
  if (equals_ignoring_ascii_case(body, "inf") || equals_ignoring_ascii_case(body, "infinity")) {
    return negative ? -HUGE_VAL : HUGE_VAL;
  }
  if (equals_ignoring_ascii_case(body, "nan")) return negative ? -NAN : NAN;
  // digits [. digits] | . digits, then [eE] [sign] digits
  size_t i = 0;
  size_t mantissa_digits = 0;
  while (i < body.size() && is_digit(body[i])) ++i, ++mantissa_digits;
  if (i < body.size() && body[i] == '.') {
    ++i;
    while (i < body.size() && is_digit(body[i])) ++i, ++mantissa_digits;
  }
  if (mantissa_digits == 0) return std::nullopt;
  if (i < body.size() && (body[i] == 'e' || body[i] == 'E')) {
    ++i;
    if (i < body.size() && (body[i] == '+' || body[i] == '-')) ++i;
    const size_t exponent_start = i;
    while (i < body.size() && is_digit(body[i])) ++i;
    if (i == exponent_start) return std::nullopt;
  }
  if (i != body.size()) return std::nullopt;
  // The grammar is checked; strtod in the C locale gives the correctly rounded value
  // (and HUGE_VAL where it overflows, as Python's float() does).
  static const locale_t c_locale = newlocale(LC_NUMERIC_MASK, "C", static_cast<locale_t>(0));
  return strtod_l(s.c_str(), nullptr, c_locale);
}

// tabulate's "1,000.5" numbers: re.match(r"^(([+-]?[0-9]{1,3})(?:,([0-9]{3}))*)?"
// r"(?(1)\.[0-9]*|\.[0-9]+)?$"). Python's $ also matches before one final "\n".
bool thousands_body_matches(TextView s) {
  size_t i = 0;
  if (i < s.size() && (s[i] == U'+' || s[i] == U'-')) ++i;
  size_t lead = 0;
  while (i < s.size() && s[i] >= U'0' && s[i] <= U'9') ++i, ++lead;
  if (lead == 0) {  // no integer part: nothing, or "." and at least one digit
    if (s.empty()) return true;
    if (s[0] != U'.' || s.size() < 2) return false;
    return std::all_of(s.begin() + 1, s.end(), [](char32_t c) { return c >= U'0' && c <= U'9'; });
  }
  if (lead > 3) return false;
  auto group_at = [&](size_t at) {  // ",ddd" at `at`, not followed by a further digit
    if (at + 4 > s.size() || s[at] != U',') return false;
    for (size_t k = 1; k <= 3; ++k) {
      if (s[at + k] < U'0' || s[at + k] > U'9') return false;
    }
    return true;
  };
  while (group_at(i)) i += 4;
  if (i == s.size()) return true;
  if (s[i] != U'.') return false;
  return std::all_of(s.begin() + static_cast<std::ptrdiff_t>(i) + 1, s.end(),
                     [](char32_t c) { return c >= U'0' && c <= U'9'; });
}

bool thousands_number(TextView s) {
  if (thousands_body_matches(s)) return true;
  return !s.empty() && s.back() == U'\n' && thousands_body_matches(s.substr(0, s.size() - 1));
}

// ---- Column types and cell formatting ------------------------------------------------

// tabulate's types from least to most generic; a column has the most generic type of its
// cells, starting from bool (so an all-empty column is bool: printed as text).
enum class CellType { kNone = 0, kBool = 1, kInt = 2, kFloat = 3, kString = 5 };

CellType cell_type(TextView cell) {
  if (cell.empty()) return CellType::kNone;
  if (cell == U"True" || cell == U"False") return CellType::kBool;
  const bool has_point = cell.find(U'.') != TextView::npos;
  if (python_int_parses(cell) || (thousands_number(cell) && !has_point)) return CellType::kInt;
  // A float() that is infinite or not a number counts only for these exact spellings
  // (what overflows, "Infinity", "+inf", " nan" is text).
  if (const std::optional<double> value = python_float(cell)) {
    if (std::isfinite(*value)) return CellType::kFloat;
    std::string spelled;
    for (const char32_t c : cell) spelled += c < 0x80 ? static_cast<char>(c) : '?';
    if (equals_ignoring_ascii_case(spelled, "inf") ||
        equals_ignoring_ascii_case(spelled, "-inf") ||
        equals_ignoring_ascii_case(spelled, "nan")) {
      return CellType::kFloat;
    }
  }
  if (thousands_number(cell)) return CellType::kFloat;
  return CellType::kString;
}

// format(value, f".{precision}f"): exact decimal expansion, rounded half to even on the
// binary value (as printf), "nan" whatever its sign, "inf" and "-inf".
Text format_fixed(double value, int precision) {
  if (std::isnan(value)) return U"nan";
  if (std::isinf(value)) return value < 0 ? U"-inf" : U"inf";
  std::string buffer(static_cast<size_t>(precision) + 400, '\0');  // 1e308 has 309 digits
  const std::to_chars_result result = std::to_chars(
      buffer.data(), buffer.data() + buffer.size(), value, std::chars_format::fixed, precision);
  return Text(buffer.data(), result.ptr);
}

// A float column's cell: thousands separators dropped, re-printed with the table's
// precision; what float() refuses ("True", "\n") stays as it was. Int and text columns
// keep every cell as it is (format(str, "") is the string).
Text format_float_cell(TextView cell, int precision) {
  if (cell.empty()) return Text();
  Text digits;
  for (const char32_t c : cell) {
    if (c != U',') digits += c;
  }
  const std::optional<double> value = python_float(digits);
  return value ? format_fixed(*value, precision) : Text(cell);
}

// ---- Alignment and the grid ----------------------------------------------------------

enum class Align { kRight, kCenter };

// str.format's "{:>N}" and "{:^N}" in code points: centring puts the odd space right.
Text pad(TextView text, size_t width, Align align) {
  if (text.size() >= width) return Text(text);
  const size_t fill = width - text.size();
  const size_t left = align == Align::kRight ? fill : fill / 2;
  return Text(left, U' ') + Text(text) + Text(fill - left, U' ');
}

// A cell's or header's width: its length, or in a multi-line table its longest piece
// between "\r" and "\n".
size_t text_width(TextView text, bool multiline) {
  if (!multiline) return text.size();
  size_t widest = 0;
  for (const Text& piece : split_cr_lf(text)) widest = std::max(widest, piece.size());
  return widest;
}

Text join_lines(const std::vector<Text>& lines) {
  Text out;
  for (size_t i = 0; i < lines.size(); ++i) {
    if (i > 0) out += U'\n';
    out += lines[i];
  }
  return out;
}

// One table cell laid out: its lines, each as wide as the column.
using CellLines = std::vector<Text>;

// A horizontal rule: begin, then per column width + 2 fill characters, separated.
Text rule(const std::vector<size_t>& widths, char32_t begin, char32_t fill, char32_t separator,
          char32_t end) {
  Text line(1, begin);
  for (size_t c = 0; c < widths.size(); ++c) {
    if (c > 0) line += separator;
    line += Text(widths[c] + 2, fill);
  }
  return line + end;
}

// One table row: as many lines as its tallest cell, the others filled with blank lines
// below; a space either side of each cell. A row whose cells all have no line (a
// multi-line table's empty cells) prints nothing.
void append_row(const std::vector<CellLines>& cells, const std::vector<size_t>& widths,
                std::vector<Text>* out) {
  size_t height = 0;
  for (const CellLines& cell : cells) height = std::max(height, cell.size());
  for (size_t line = 0; line < height; ++line) {
    Text text = U"│";
    for (size_t c = 0; c < cells.size(); ++c) {
      text += U' ';
      text += line < cells[c].size() ? cells[c][line] : Text(widths[c], U' ');
      text += U" │";
    }
    out->push_back(std::move(text));
  }
}

// ---- What both formats share: typed, formatted, stripped, padded cells ---------------

// The table before a format draws it: every header and cell padded to its column's width.
// In a single-line table each cell is one line; in a multi-line one, its lines.
struct AlignedTable {
  std::vector<size_t> widths;
  // The columns' alignments; none without rows (tabulate derives them from the columns,
  // and a table without rows has none).
  std::vector<Align> aligns;
  std::vector<CellLines> header;
  std::vector<std::vector<CellLines>> rows;
};

// What tabulate does before it draws: types each column, re-prints float columns with
// '.{width}f', strips the cells, aligns them (the first column right, the rest centred)
// and pads headers and cells to the column width. `multiline_format`: whether the format
// is one of tabulate's multiline_formats, which split cells at "\r" and "\n" (fancy_grid
// is; the LaTeX formats are not: there a line break is one more character of the cell).
AlignedTable align_table(const std::vector<std::string>& headers,
                         const std::vector<std::vector<std::string>>& columns, int width,
                         bool multiline_format) {
  THPC_CHECK(headers.size() == columns.size(),
             headers.size() << " headers for " << columns.size() << " columns");
  THPC_CHECK(width >= 0, "a negative number of decimals: " << width);
  const size_t num_columns = columns.size();
  size_t num_rows = 0;
  for (const auto& column : columns) num_rows = std::max(num_rows, column.size());

  std::vector<Text> header_text;
  std::vector<std::vector<Text>> cells(num_columns);
  for (size_t c = 0; c < num_columns; ++c) {
    header_text.push_back(decode(headers[c]));
    for (size_t r = 0; r < num_rows; ++r) {
      cells[c].push_back(r < columns[c].size() ? decode(columns[c][r]) : Text());
    }
  }
  // Multi-line: a multiline format and any "\r" or "\n" anywhere, before formatting.
  bool multiline = false;
  auto has_line_break = [](const Text& text) {
    return text.find_first_of(U"\r\n") != Text::npos;
  };
  for (size_t c = 0; c < num_columns && multiline_format; ++c) {
    multiline = multiline || has_line_break(header_text[c]) ||
                std::any_of(cells[c].begin(), cells[c].end(), has_line_break);
  }

  // Format each column by its type; strip; pad each cell's lines to the column width.
  AlignedTable table;
  table.widths.resize(num_columns);
  table.rows.assign(num_rows, std::vector<CellLines>(num_columns));
  for (size_t c = 0; c < num_columns; ++c) {
    CellType type = CellType::kBool;
    for (const Text& cell : cells[c]) type = std::max(type, cell_type(cell));
    // colalign=('right',) sets the first column; stralign and numalign centre the rest.
    // Without rows tabulate has no column alignments and centres every header.
    const Align align = c == 0 && num_rows > 0 ? Align::kRight : Align::kCenter;
    if (num_rows > 0) table.aligns.push_back(align);
    size_t column_width = text_width(header_text[c], multiline) + 2;  // MIN_PADDING
    std::vector<Text> stripped;
    for (const Text& cell : cells[c]) {
      const Text formatted = type == CellType::kFloat ? format_float_cell(cell, width) : cell;
      stripped.emplace_back(strip(formatted));
      column_width = std::max(column_width, text_width(stripped.back(), multiline));
    }
    for (size_t r = 0; r < num_rows; ++r) {
      if (!multiline) {
        table.rows[r][c] = {pad(stripped[r], column_width, align)};
        continue;
      }
      // Measured between "\r" and "\n" above, but split (and padded) with splitlines().
      std::vector<Text> lines = splitlines(stripped[r]);
      for (Text& line : lines) line = pad(line, column_width, align);
      table.rows[r][c] = splitlines(join_lines(lines));
    }
    table.widths[c] = column_width;

    // Headers keep their whitespace; in a multi-line table each piece between "\r" and
    // "\n" is padded, then the header is split again with splitlines().
    if (!multiline) {
      table.header.push_back({pad(header_text[c], column_width, align)});
      continue;
    }
    std::vector<Text> pieces = split_cr_lf(header_text[c]);
    for (Text& piece : pieces) piece = pad(piece, column_width, align);
    table.header.push_back(splitlines(join_lines(pieces)));
  }
  return table;
}

// ---- latex_booktabs ------------------------------------------------------------------

// tabulate's LATEX_ESCAPE_RULES: each character of a padded cell on its own, so a
// backslash becomes \textbackslash{} without its braces being escaped again.
Text latex_escape(TextView text) {
  Text out;
  for (const char32_t c : text) {
    switch (c) {
      case U'&': out += U"\\&"; break;
      case U'%': out += U"\\%"; break;
      case U'$': out += U"\\$"; break;
      case U'#': out += U"\\#"; break;
      case U'_': out += U"\\_"; break;
      case U'^': out += U"\\^{}"; break;
      case U'{': out += U"\\{"; break;
      case U'}': out += U"\\}"; break;
      case U'~': out += U"\\textasciitilde{}"; break;
      case U'\\': out += U"\\textbackslash{}"; break;
      case U'<': out += U"\\ensuremath{<}"; break;
      case U'>': out += U"\\ensuremath{>}"; break;
      default: out += c;
    }
  }
  return out;
}

// A LaTeX row (a single-line table: each cell is one line): each padded cell with a space
// either side, escaped, joined by "&", then "\\". (tabulate strips whitespace from the
// row's right end, which a row ending in "\\" never has.)
Text latex_row(const std::vector<CellLines>& cells) {
  Text row;
  for (size_t c = 0; c < cells.size(); ++c) {
    if (c > 0) row += U'&';
    row += latex_escape(U" " + cells[c].front() + U" ");
  }
  return row + U"\\\\";
}

}  // namespace

std::string fancy_grid_table(const std::vector<std::string>& headers,
                             const std::vector<std::vector<std::string>>& columns, int width) {
  const AlignedTable table = align_table(headers, columns, width, /*multiline_format=*/true);
  const std::vector<size_t>& widths = table.widths;
  std::vector<Text> lines;
  lines.push_back(rule(widths, U'╒', U'═', U'╤', U'╕'));
  append_row(table.header, widths, &lines);
  lines.push_back(rule(widths, U'╞', U'═', U'╪', U'╡'));
  for (size_t r = 0; r < table.rows.size(); ++r) {
    if (r > 0) lines.push_back(rule(widths, U'├', U'─', U'┼', U'┤'));
    append_row(table.rows[r], widths, &lines);
  }
  lines.push_back(rule(widths, U'╘', U'═', U'╧', U'╛'));
  return encode(join_lines(lines));
}

std::string latex_booktabs_table(const std::vector<std::string>& headers,
                                 const std::vector<std::vector<std::string>>& columns,
                                 int width) {
  const AlignedTable table = align_table(headers, columns, width, /*multiline_format=*/false);
  Text spec;  // one letter a column alignment: none without rows ("\begin{tabular}{}")
  for (const Align align : table.aligns) spec += align == Align::kRight ? U'r' : U'c';
  std::vector<Text> lines = {U"\\begin{tabular}{" + spec + U"}", U"\\toprule",
                             latex_row(table.header), U"\\midrule"};
  for (const std::vector<CellLines>& row : table.rows) lines.push_back(latex_row(row));
  lines.push_back(U"\\bottomrule");
  lines.push_back(U"\\end{tabular}");
  return encode(join_lines(lines));
}

}  // namespace thpc::metrics
