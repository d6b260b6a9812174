// The option table: every configuration key once, with its field, the values it accepts
// and its help text (config.cc's header comment says what it drives). Here with the
// conversions between a field's value and its text that the ini parser, --help,
// Config::to_ini() and validate() share.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <variant>
#include <vector>

#include "config/config.h"

namespace thpc {

// Where a key's value lives in a Config; the alternative also tells the key's type.
using FieldPointer =
    std::variant<int*, std::int64_t*, std::uint64_t*, float*, double*, bool*, std::string*>;

// The values a key accepts beyond those of its type: any, a closed set, a text that is
// not empty, or a numeric range, optionally with 0 besides (a key whose 0 means "off"
// or "from elsewhere"). --help prints range_text(), validate() asks problem().
struct Allowed {
  std::vector<std::string> values;  // a closed set; empty: no set
  bool non_empty = false;
  double min = -std::numeric_limits<double>::infinity();
  bool min_open = false;  // min itself excluded: > instead of ≥
  double max = std::numeric_limits<double>::infinity();
  bool max_open = false;  // max itself excluded: < instead of ≤
  bool zero_too = false;
  // A file or directory: a value in shell syntax (~, $VAR, quotes) is refused where the
  // user gave it (shell_syntax_in_path()), since nothing here expands it.
  bool path = false;

  bool bounded() const { return std::isfinite(min) || std::isfinite(max); }
  std::string range_text() const;
  // "" when the field's value is allowed, else why not ("must be ≥ 1, got 0").
  std::string problem(const FieldPointer& field) const;
  // "must be ≥ 1, got VALUE": the range said for a value outside it (`value` as shown).
  std::string outside(const std::string& value) const;
};

struct Option {
  const char* section;
  const char* key;
  FieldPointer (*field)(Config&);
  Allowed allowed;
  const char* help;

  std::string name() const { return std::string(section) + "." + key; }
};

// "" when `value` of a path key (Allowed::path) is a path as written, else why it is
// shell syntax that no shell has expanded: a leading '~' (a directory named '~' would be
// made), a $NAME or ${NAME}, or the whole value in quotes (the quotes would be part of
// the path). What this process's environment would have made of it is said.
std::string shell_syntax_in_path(const std::string& value, bool on_command_line);

// Every key of the configuration, in the order of --help and of docs/configuration.md.
const std::vector<Option>& option_table();

// What a section ("decode") holds, as --help says it beside the section's name.
std::string section_purpose(const std::string& section);

// The key called `name` ("model.layers"), nullptr when the table has none.
const Option* find_option(const std::string& name);
// The sections as an ini file heads them: "[model] [train] ...".
std::string known_sections();
// What follows a message about a key the table lacks: whether its section exists, and
// where the keys are listed (" (transformer_hpc --help lists the keys of [model])").
std::string unknown_key_hint(const std::string& name);
// " (did you mean model.layers?)" or another toolkit's name's key for a command-line
// option without a section (--lr, --layers), "" when nothing is close.
std::string likely_meant_hint(const std::string& name);

// The type of a field as --help names it: int, int64, uint64, float, bool, string.
const char* type_name(const FieldPointer& field);
// The field's value as an ini file writes it (floats with the fewest digits that read
// back exactly).
std::string format_value(const FieldPointer& field);
// The value of the key in a default Config, as text.
std::string default_value_text(const Option& option);
// `text` without leading and trailing white space.
std::string trim(const std::string& text);
// Each parse_value returns "" on success, else why the text is not a value of the type.
std::string parse_value(const std::string& text, int* value);
std::string parse_value(const std::string& text, std::int64_t* value);
std::string parse_value(const std::string& text, std::uint64_t* value);
std::string parse_value(const std::string& text, float* value);
std::string parse_value(const std::string& text, double* value);
std::string parse_value(const std::string& text, bool* value);
std::string parse_value(const std::string& text, std::string* value);

}  // namespace thpc
