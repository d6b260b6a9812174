// Numbers and strings as Python's json.dumps writes them, for transformer_score's -f json
// (sacreBLEU's default output): a float is repr(float), the shortest decimal that reads
// back as the same double, and a string is escaped as json.dumps escapes it.
#pragma once

#include <string>
#include <string_view>

namespace thpc::metrics {

// repr(value) as Python 3 writes it (and json.dumps, but for NaN and Infinity): the
// shortest round-trip digits, in positional notation when the decimal exponent is in
// [-4, 16) ("28.3", "100.0", "0.0001"), else scientific ("1e-05", "1.5e+16").
std::string python_float_repr(double value);

// json.dumps(text): quoted, with \" \\ \n \r \t \b \f and \u00XX for the other control
// characters; with `ensure_ascii` every character past U+007F as \uXXXX (lowercase hex, a
// surrogate pair past U+FFFF). `text` is UTF-8; a byte that is not is written as U+FFFD.
std::string json_string(std::string_view text, bool ensure_ascii);

}  // namespace thpc::metrics
