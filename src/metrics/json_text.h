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
// characters; with `ensure_ascii` DEL and every character past it as \uXXXX (lowercase hex,
// a surrogate pair past U+FFFF). A byte that is not well-formed UTF-8 (Python's strict
// decoder: overlong forms, surrogates and code points past U+10FFFF are not) is the lone
// surrogate \udcXX with `ensure_ascii`, as Python's surrogateescape makes of a file name on
// sacreBLEU's command line; without it (no file name goes there), U+FFFD.
std::string json_string(std::string_view text, bool ensure_ascii);

}  // namespace thpc::metrics
