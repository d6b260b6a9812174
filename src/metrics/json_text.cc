#include "metrics/json_text.h"

#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "common/error.h"

namespace thpc::metrics {

std::string python_float_repr(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value < 0 ? "-Infinity" : "Infinity";
  // std::to_chars' shortest round-trip form, in scientific notation: "d.ddde+XX".
  char buffer[64];
  const std::to_chars_result result =
      std::to_chars(buffer, buffer + sizeof buffer, value, std::chars_format::scientific);
  THPC_CHECK(result.ec == std::errc(), "to_chars failed");
  const std::string text(buffer, result.ptr);
  std::string sign, digits;
  size_t at = 0;
  if (text[at] == '-') sign = "-", ++at;
  const size_t e = text.find('e');
  for (size_t i = at; i < e; ++i) {
    if (text[i] != '.') digits += text[i];
  }
  const int exponent = std::atoi(text.c_str() + e + 1);  // of the first digit
  // Python's float_repr_style 'short' with repr's mode 'r': positional for 1e-4 <= |x| < 1e16.
  if (exponent >= -4 && exponent < 16) {
    std::string out;
    if (exponent < 0) {
      out = "0." + std::string(static_cast<size_t>(-exponent - 1), '0') + digits;
    } else if (static_cast<int>(digits.size()) <= exponent + 1) {
      out = digits + std::string(static_cast<size_t>(exponent + 1) - digits.size(), '0') + ".0";
    } else {
      out = digits.substr(0, static_cast<size_t>(exponent) + 1) + "." +
            digits.substr(static_cast<size_t>(exponent) + 1);
    }
    return sign + out;
  }
  std::string mantissa = digits.substr(0, 1);
  if (digits.size() > 1) mantissa += "." + digits.substr(1);
  char exponent_text[16];
  std::snprintf(exponent_text, sizeof exponent_text, "e%c%02d", exponent < 0 ? '-' : '+',
                std::abs(exponent));
  return sign + mantissa + exponent_text;
}

namespace {

// A byte that is not part of well-formed UTF-8 comes back as U+DC00 + byte: the lone
// surrogate Python's surrogateescape makes of it (sacreBLEU's file names come from its
// command line so), which strict UTF-8 never yields.
constexpr char32_t kEscapedByteBase = 0xDC00;

// The next code point of UTF-8 `text` at `at` (advanced past it). Well-formed as Python's
// decoder has it: no overlong forms, no surrogates, nothing past U+10FFFF; else the one
// byte at `at`, escaped as above.
char32_t next_code_point(std::string_view text, size_t& at) {
  const auto byte = [&](size_t i) { return static_cast<unsigned char>(text[i]); };
  const unsigned char lead = byte(at);
  const int length = lead < 0x80 ? 1 : (lead >> 5) == 0x6 ? 2 : (lead >> 4) == 0xE ? 3
                                      : (lead >> 3) == 0x1E ? 4 : 0;
  const auto bad_byte = [&] { return kEscapedByteBase + byte(at++); };
  if (length == 0 || at + static_cast<size_t>(length) > text.size()) return bad_byte();
  char32_t code = length == 1 ? lead : lead & (0x7F >> length);
  for (int k = 1; k < length; ++k) {
    if ((byte(at + static_cast<size_t>(k)) & 0xC0) != 0x80) return bad_byte();
    code = (code << 6) | (byte(at + static_cast<size_t>(k)) & 0x3F);
  }
  constexpr char32_t kLeast[] = {0, 0, 0x80, 0x800, 0x10000};
  if (code < kLeast[length] || (code >= 0xD800 && code <= 0xDFFF) || code > 0x10FFFF) {
    return bad_byte();
  }
  at += static_cast<size_t>(length);
  return code;
}

// `code_unit`: one UTF-16 code unit, so the escape is \uXXXX, four hex digits.
void append_escape(std::string& out, uint16_t code_unit) {
  constexpr char kHexDigits[] = "0123456789abcdef";  // lower case, as json.dumps
  out += "\\u";
  for (int shift = 12; shift >= 0; shift -= 4) out += kHexDigits[(code_unit >> shift) & 0xF];
}

}  // namespace

std::string json_string(std::string_view text, bool ensure_ascii) {
  std::string out = "\"";
  for (size_t at = 0; at < text.size();) {
    const size_t start = at;
    const char32_t c = next_code_point(text, at);
    switch (c) {
      case U'"': out += "\\\""; continue;
      case U'\\': out += "\\\\"; continue;
      case U'\n': out += "\\n"; continue;
      case U'\r': out += "\\r"; continue;
      case U'\t': out += "\\t"; continue;
      case U'\b': out += "\\b"; continue;
      case U'\f': out += "\\f"; continue;
      default: break;
    }
    if (c < 0x20) {
      append_escape(out, static_cast<uint16_t>(c));
    } else if (c < 0x7F || !ensure_ascii) {  // json.dumps escapes DEL too
      if (c >= kEscapedByteBase + 0x80 && c <= kEscapedByteBase + 0xFF) {
        out += "\xEF\xBF\xBD";
      } else {
        out.append(text.substr(start, at - start));
      }
    } else if (c > 0xFFFF) {
      const char32_t offset = c - 0x10000;
      append_escape(out, static_cast<uint16_t>(0xD800 + (offset >> 10)));
      append_escape(out, static_cast<uint16_t>(0xDC00 + (offset & 0x3FF)));
    } else {
      append_escape(out, static_cast<uint16_t>(c));
    }
  }
  return out + "\"";
}

}  // namespace thpc::metrics
