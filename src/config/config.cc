// The run configuration's ini and command-line parser. One option table (option_table.h)
// names every key once, with the values it accepts: it drives the Boost.Program_options
// descriptions for the ini file and the command line, the conversion of each value to its
// field, the --help text (docs/configuration.md is a copy, checked by test_config), the
// per-key checks of validate() (config_validation.cc), and Config::to_ini(). Adding a key
// means adding a field to config.h and one THPC_OPTION line to option_table.cc; only a
// constraint between keys needs code in validate().
//
// Every value is registered with Boost as plain text and converted here, so that a bad
// value yields one line naming the file and the key ("input/x.ini: model.heads: 'abc' is
// not an integer") rather than Boost's generic wording.
#include "config/config.h"

#include <boost/program_options.hpp>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <limits>
#include <map>
#include <set>
#include <sstream>
#include <type_traits>
#include <utility>
#include <variant>

#include "common/error.h"
#include "common/source_version.h"
#include "common/input_file.h"
#include "config/option_table.h"
#include "kernels/ops.h"

namespace thpc {
namespace {

namespace po = boost::program_options;

// ---- Boost.Program_options plumbing ----

// The table's keys as Boost options, all taken as text and converted by parse_value.
// One lasting instance: Boost's parsed_options keep a pointer to their description.
const po::options_description& table_description() {
  static const po::options_description description = [] {
    po::options_description keys;
    for (const Option& option : option_table()) {
      keys.add_options()(option.name().c_str(), po::value<std::string>(), option.help);
    }
    return keys;
  }();
  return description;
}

// Boost prints option names with the prefix of their origin ("--model.heads"); the
// messages here name keys as the ini file does ("model.heads").
std::string key_name(const po::error_with_option_name& error) {
  std::string name = error.get_option_name();
  while (!name.empty() && name.front() == '-') name.erase(name.begin());
  return name;
}

// Rethrows a Boost error from the command line or the overrides as one thpc::Error line.
[[noreturn]] void fail_command_line(const std::string& file_label, const po::error& error) {
  if (const auto* repeated = dynamic_cast<const po::multiple_occurrences*>(&error)) {
    THPC_FAIL(file_label << ": " << key_name(*repeated)
                         << ": given more than once on the command line");
  }
  if (const auto* syntax = dynamic_cast<const po::invalid_command_line_syntax*>(&error)) {
    if (syntax->kind() == po::invalid_syntax::missing_parameter) {
      // The program's own option, not a key of the file.
      if (key_name(*syntax) == "eval") {
        THPC_FAIL("--eval: needs a checkpoint file (--eval FILE)");
      }
      THPC_FAIL(file_label << ": " << key_name(*syntax) << ": missing value on the command line"
                           << " (write --" << key_name(*syntax) << "=VALUE)");
    }
  }
  THPC_FAIL(file_label << ": bad command line: " << error.what());
}

// "WHAT: a; b; c": several mistakes of a kind in one message, on one line as every message
// a user can trigger ("tiny.ini: 2 unknown keys: ...").
std::string listed_on_one_line(const std::string& what, const std::vector<std::string>& items) {
  std::string listed = std::to_string(items.size()) + " " + what + ":";
  for (size_t i = 0; i < items.size(); ++i) listed += (i == 0 ? " " : "; ") + items[i];
  return listed;
}

// Rejects command-line tokens that name no option (collected rather than thrown by
// Boost, so that the message can name the config file given on the same line), all of
// them in one message (a user with three typos learnt of one a run), and a key whose
// value is the next option: Boost takes `--model.layers --dry-run` as layers =
// "--dry-run". No value of the table starts with "--".
void reject_unknown_options(const std::string& file_label, const po::parsed_options& parsed) {
  std::vector<std::string> unknown;  // each: 'token' and what was most likely meant
  for (const po::option& option : parsed.options) {
    if (!option.unregistered && find_option(option.string_key) != nullptr &&
        !option.value.empty() && option.value.front().rfind("--", 0) == 0) {
      THPC_FAIL(file_label << ": " << option.string_key << ": missing value on the command "
                           << "line (the next argument " << quoted(option.value.front())
                           << " was taken for it; write --" << option.string_key << "=VALUE)");
    }
    if (!option.unregistered) continue;
    const std::string token =
        option.original_tokens.empty() ? option.string_key : option.original_tokens.front();
    // A file whose name starts with '-' (-x.ini) is an option to any parser: said how to
    // give it (a helper's walk).
    std::error_code ignored;
    if (std::filesystem::is_regular_file(token, ignored)) {
      THPC_FAIL("unknown command-line option " << quoted(token) << ": to give the file of "
                << "that name, write ./" << token);
    }
    const bool names_a_key = option.string_key.find('.') != std::string::npos;
    const std::string meant = names_a_key ? "" : likely_meant_hint(option.string_key);
    unknown.push_back(quoted(token) + (names_a_key       ? unknown_key_hint(option.string_key)
                                       : !meant.empty() ? meant
                                                        : std::string(" (see --help)")));
  }
  if (unknown.size() == 1) {
    THPC_FAIL(file_label << ": unknown command-line option " << unknown.front());
  }
  if (!unknown.empty()) {
    THPC_FAIL(file_label << ": " << listed_on_one_line("unknown command-line options", unknown));
  }
}

// The line numbers of each key of ini `text`, by the name Boost gives it (section.key, or
// the key alone before any section), in the file's order.
std::map<std::string, std::deque<int>> key_lines(const std::string& text) {
  std::map<std::string, std::deque<int>> lines;
  std::istringstream stream(text);
  std::string section;
  int number = 0;
  for (std::string line; std::getline(stream, line);) {
    ++number;
    const std::string content = trim(line.substr(0, line.find('#')));
    if (content.empty()) continue;
    if (content.front() == '[' && content.back() == ']') {
      section = trim(content.substr(1, content.size() - 2));
      continue;
    }
    const size_t equals = content.find('=');
    if (equals == std::string::npos) continue;
    const std::string key = trim(content.substr(0, equals));
    // (Boost adds no '.' after a section whose name ends in one: '[model.]')
    const bool dotted = !section.empty() && section.back() == '.';
    lines[section.empty() ? key : section + (dotted ? "" : ".") + key].push_back(number);
  }
  return lines;
}

// Refuses the keys of a config that name no option, all of them in one message, each
// with the line it is on (`with_lines`: a user's file; a checkpoint's stored
// configuration has no lines a user can open) and what was most likely meant.
void reject_unknown_keys(const std::string& ini_path, const std::string& text,
                         const std::vector<std::string>& unknown, bool with_lines) {
  if (unknown.empty()) return;
  std::map<std::string, std::deque<int>> lines = key_lines(text);
  auto line_of = [&](const std::string& name) {  // 0: not said
    std::deque<int>& at = lines[name];
    if (!with_lines || at.empty()) return 0;
    const int number = at.front();
    at.pop_front();
    return number;
  };
  if (unknown.size() == 1) {
    const int line = line_of(unknown.front());
    const std::string where = line > 0 ? ":" + std::to_string(line) : std::string();
    THPC_FAIL(ini_path << where << ": unknown key " << quoted(unknown.front())
                       << unknown_key_hint(unknown.front()));
  }
  std::vector<std::string> said;
  for (const std::string& name : unknown) {
    const int line = line_of(name);
    said.push_back((line > 0 ? "line " + std::to_string(line) + " " : std::string()) +
                   quoted(name) + unknown_key_hint(name));
  }
  THPC_FAIL(ini_path << ": " << listed_on_one_line("unknown keys", said));
}

constexpr int kCommandLineStyle =
    // Exact names only: a misspelt key must fail, not silently match a longer one.
    po::command_line_style::unix_style & ~po::command_line_style::allow_guessing;

// `--section.key=` (an empty value: data.dir's synthetic task, checkpoint.resume's none)
// as two tokens, `--section.key` and "", which Boost reads as the empty value it refuses
// adjacent ("should follow immediately after the equal sign").
std::vector<std::string> with_empty_values_apart(std::vector<std::string> tokens) {
  std::vector<std::string> apart;
  for (std::string& token : tokens) {
    // A key (section.key), not a flag: `--dry-run=` stays Boost's to refuse.
    if (token.size() > 3 && token.rfind("--", 0) == 0 && token.back() == '=' &&
        token.find('=') == token.size() - 1 && token.find('.') != std::string::npos) {
      apart.push_back(token.substr(0, token.size() - 1));
      apart.emplace_back();
    } else {
      apart.push_back(std::move(token));
    }
  }
  return apart;
}

// Reads ini text from `stream` (named `ini_path` in messages) into `values`, which
// already holds the command line's values (Boost keeps the first value stored, so the
// command line wins), converts every value into a Config and validates it.
// `require_keys`: the user's own file and command line, not a checkpoint's stored
// configuration: a file with no key at all is refused (an empty or wrong file would
// otherwise train the full base model on the defaults), and so is a path in shell syntax
// (shell_syntax_in_path(); a checkpoint written before that check still reads).
// `eval_checkpoint`: --eval's, which the validation of the keys takes into account.
Config resolve(const std::string& ini_path, std::istream& stream, po::variables_map& values,
               bool require_keys, const std::string& eval_checkpoint = "") {
  std::set<std::string> from_command_line;
  for (const auto& [name, value] : values) {
    if (find_option(name) != nullptr) from_command_line.insert(name);
  }

  // Kept for the line numbers of unknown keys.
  const std::string ini_text((std::istreambuf_iterator<char>(stream)),
                             std::istreambuf_iterator<char>());
  try {
    // Unknown keys collected, not thrown at the first, so that all are said at once.
    const bool allow_unregistered = true;
    std::istringstream lines(ini_text);
    const po::parsed_options parsed =
        po::parse_config_file(lines, table_description(), allow_unregistered);
    if (require_keys && parsed.options.empty()) {
      THPC_FAIL(ini_path << ": holds no keys at all (an empty config would train the "
                         << "defaults, the base model; write at least one 'key = value' "
                         << "under a [section])");
    }
    std::vector<std::string> unknown;
    for (const po::option& option : parsed.options) {
      if (option.unregistered) unknown.push_back(option.string_key);
    }
    reject_unknown_keys(ini_path, ini_text, unknown, /*with_lines=*/require_keys);
    po::store(parsed, values);  // (which skips unregistered options)
  } catch (const Error&) {
    throw;
  } catch (const po::multiple_occurrences& error) {
    // Where, as an unknown key is said (a helper's walk: two [model] sections each with
    // d_model, and no line to look at).
    const std::string key = key_name(error);
    const std::deque<int> at = key_lines(ini_text)[key];
    std::string where;
    for (size_t i = 0; require_keys && at.size() > 1 && i < at.size(); ++i) {
      where += (i == 0 ? " (lines " : i + 1 == at.size() ? " and " : ", ") + std::to_string(at[i]);
    }
    if (!where.empty()) where += ")";
    THPC_FAIL(ini_path << ": " << key << ": given more than once" << where
                       << "; keep the one you mean");
  } catch (const po::invalid_config_file_syntax& error) {
    THPC_FAIL(ini_path << ": invalid line " << quoted(error.tokens())
                       << " (expected 'key = value' or '[section]')");
  } catch (const po::error& error) {
    THPC_FAIL(ini_path << ": " << error.what());
  }

  Config config;
  config.source_file = ini_path;
  config.command_line_keys = from_command_line;
  config.eval_checkpoint = eval_checkpoint;
  // Each key's problem, "KEY: what" (all said at once, as the unknown keys are: a user
  // with two bad values learnt of one a run); the file's name is said once before them.
  std::vector<std::string> bad_values;
  for (const Option& option : option_table()) {
    const std::string name = option.name();
    const auto found = values.find(name);
    if (found == values.end()) continue;
    const std::string text = trim(found->second.as<std::string>());
    // What the configuration stored in each checkpoint cannot hold and read back as it was
    // (a '#' would start a comment there, a line break a line of its own: decoding such a
    // checkpoint failed), nor a file say: a command-line value with one is refused.
    // (" ;" too: a file's value refuses it, so the resolved configuration would not read
    // back as a file.)
    if (from_command_line.count(name) &&
        (text.find_first_of(std::string("#\n\r\0", 4)) != std::string::npos ||
         text.find(" ;") != std::string::npos || text.find("\t;") != std::string::npos)) {
      bad_values.push_back(name + ": " + quoted(text) +
                           " holds a '#', a ' ;', a line break or a NUL byte, which an ini "
                           "file cannot hold in a value ('#' starts a comment): the "
                           "configuration stored in every checkpoint would not read back; "
                           "give a value without them (on the command line)");
      continue;
    }
    // No text key takes more than a path can hold (Linux's PATH_MAX): a longer value was
    // repeated whole by a later message (a checkpoint.dir of 100,000 bytes: a 200 KB line).
    constexpr size_t kLongestText = 4096;
    if (std::holds_alternative<std::string*>(option.field(config)) &&
        text.size() > kLongestText) {
      bad_values.push_back(name + ": " + quoted(text) + " is longer than any value of a " +
                           "text key (" + std::to_string(kLongestText) + " bytes, the longest " +
                           "path)" + (from_command_line.count(name) ? " (on the command line)"
                                                                     : ""));
      continue;
    }
    std::string problem = std::visit(
        [&](auto* field) { return parse_value(text, field); }, option.field(config));
    // A whole number past its type, for a key with a range of its own on that side, is
    // said with that range: the type's limit read as the key's ("holds (2147483647)" for
    // one of [0, 128]). On the open side the type's limit is the one there is: "must be ≥
    // 1, got '99999999999'" said of a number that is.
    const bool beyond_largest = problem.find(" beyond the largest whole number the key holds ") !=
                                std::string::npos;
    const bool below_smallest = problem.find(" below the smallest whole number the key holds ") !=
                                std::string::npos;
    if ((beyond_largest && std::isfinite(option.allowed.max)) ||
        (below_smallest && std::isfinite(option.allowed.min))) {
      problem = option.allowed.outside(quoted(text));
    }
    // A float key's value written with more digits than a float holds can be inside the
    // key's range and the float nearest it outside: refused by validate() as "got 1" for
    // "0.99999999", the text written not said. Said here, beside the float it became.
    if (problem.empty() && std::holds_alternative<float*>(option.field(config))) {
      double as_written = 0;
      const std::string range_problem = option.allowed.problem(option.field(config));
      if (!range_problem.empty() && parse_value(text, &as_written).empty() &&
          option.allowed.problem(FieldPointer(&as_written)).empty()) {
        problem = range_problem + " (the float nearest " + quoted(text) +
                  ": float keys hold about 7 significant digits)";
      }
    }
    if (problem.empty() && require_keys && option.allowed.path) {
      problem = shell_syntax_in_path(text, from_command_line.count(name) > 0);
    }
    // A command-line value outside the key's range is said as the command line's here:
    // validate() below names only the file ("tiny.ini: train.max_steps: must be ≥ 1" for
    // --train.max_steps=-5, which the file did not say).
    if (problem.empty() && from_command_line.count(name)) {
      problem = option.allowed.problem(option.field(config));
    }
    if (!problem.empty()) {
      bad_values.push_back(name + ": " + problem +
                           (from_command_line.count(name) ? " (on the command line)" : ""));
    }
  }
  if (bad_values.size() == 1) THPC_FAIL(ini_path << ": " << bad_values.front());
  if (!bad_values.empty()) {
    THPC_FAIL(ini_path << ": " << listed_on_one_line("bad values", bad_values));
  }
  validate(config);
  return config;
}

// The ini format takes '#' for the start of a comment wherever it stands: "dir =
// runs/exp#1" gave runs/exp without a word. A '#' right after a value's text (no space
// before it) is taken for part of the value the user meant, and refused naming the line;
// "value   # comment" is a comment, as the shipped configs write them. A " ;" comment,
// which other ini readers take (Python's configparser with inline_comment_prefixes, git's
// config), is no comment here: "dir = runs/a ; scratch" wrote checkpoints to the folder
// "runs/a ; scratch". Refused naming the line too.
void refuse_a_hash_inside_a_value(const std::string& ini_path, const std::string& text) {
  std::istringstream lines(text);
  int number = 0;
  for (std::string line; std::getline(lines, line);) {
    ++number;
    const size_t equals = line.find('='), hash = line.find('#');
    if (equals == std::string::npos) continue;
    const size_t semicolon = std::min(line.find(" ;", equals), line.find("\t;", equals));
    if (semicolon != std::string::npos && semicolon < hash) {
      THPC_FAIL(ini_path << ":" << number << ": a ';' after a space in the value of "
                         << quoted(trim(line.substr(0, equals))) << ": it would be part of "
                         << "the value, not a comment; write a comment after ' #' (or give "
                         << "a value without ';')");
    }
    if (hash == std::string::npos || hash < equals) continue;
    const size_t value = line.find_first_not_of(" \t", equals + 1);
    if (value != hash && line[hash - 1] != ' ' && line[hash - 1] != '\t') {
      THPC_FAIL(ini_path << ":" << number << ": a '#' inside the value of "
                         << quoted(trim(line.substr(0, equals))) << ": the ini format starts "
                         << "a comment there, so the value would end before it; give a value "
                         << "without '#' (a comment after a value needs a space before '#')");
    }
  }
}

// Each line of a config file is a key = value, a [section], a comment or blank; a line
// that is none is refused naming its number (Boost's own refusal named no line). A line
// whose first character is ';' is a comment, as most ini readers take it (Python's
// configparser, Windows', the job scripts' reader): it was refused as an invalid line. So
// is a ';' after a section's ']'. Those comments are blanked here, numbering kept.
std::string with_semicolon_comments_blanked(const std::string& ini_path,
                                            const std::string& text) {
  std::istringstream lines(text);
  std::string kept;
  int number = 0;
  for (std::string line; std::getline(lines, line);) {
    ++number;
    const bool crlf = !line.empty() && line.back() == '\r';
    const std::string content = trim(crlf ? line.substr(0, line.size() - 1) : line);
    if (!content.empty() && content[0] == ';') {
      line.clear();
    } else if (!content.empty() && content[0] == '[') {
      const size_t close = content.find(']');
      const std::string after =
          close == std::string::npos ? std::string() : trim(content.substr(close + 1));
      std::string header = content;
      if (close != std::string::npos && !after.empty() && after[0] == ';') {
        header = line = content.substr(0, close + 1);
      }
      // '[train' or '[train] x': Boost's refusal of it named no line (a '#' comment is
      // cut first, as Boost cuts it; a line with '=' is a key's, said as one).
      header = trim(header.substr(0, header.find('#')));
      if (header.back() != ']' && header.find('=') == std::string::npos) {
        THPC_FAIL(ini_path << ":" << number << ": invalid line " << quoted(content)
                           << " (a section is '[name]', alone on its line but for a "
                           << "comment after '#' or ';')");
      }
      // '[ model ]' named the section " model ", whose keys were each refused as unknown
      // (' model .layers'; a helper's finding).
      if (header.back() == ']') {
        const std::string name = header.substr(1, header.size() - 2);
        if (name.find_first_of("[]") != std::string::npos) {
          THPC_FAIL(ini_path << ":" << number << ": invalid line " << quoted(content)
                             << " (a section is '[name]', its name without brackets)");
        }
        // ('[]' too: its keys were refused as unknown, '.layers', with no line named)
        if (trim(name).empty()) {
          THPC_FAIL(ini_path << ":" << number << ": the section '" << header
                             << "' has no name (a section is '[name]')");
        }
        if (trim(name) != name) {
          THPC_FAIL(ini_path << ":" << number << ": the section '" << header
                             << "' has spaces inside its brackets: write '[" << trim(name)
                             << "]'");
        }
      }
    } else if (!content.empty() && content[0] == '=') {
      // (Boost took it for the key "", refused as the unknown key 'model.', no line named)
      THPC_FAIL(ini_path << ":" << number << ": invalid line " << quoted(content)
                         << " (no key before '=': expected 'key = value')");
    } else if (!content.empty() && content[0] != '#' && content.find('=') == std::string::npos) {
      THPC_FAIL(ini_path << ":" << number << ": invalid line " << quoted(content)
                         << " (expected 'key = value', '[section]', or a comment after "
                         << "'#' or ';')");
    }
    kept += line + "\n";
  }
  return kept;
}

// resolve() over the file at `ini_path`.
Config resolve_file(const std::string& ini_path, po::variables_map& values,
                    const std::string& eval_checkpoint = "") {
  std::error_code ignored;
  if (std::filesystem::is_directory(ini_path, ignored)) {
    THPC_FAIL("cannot open config file '" << ini_path << "': it is a directory");
  }
  // Opened, a named pipe without a writer held the program in open() for good, out of
  // reach of its stop signals (a helper's trial: timeout's SIGTERM did not end it).
  if (std::filesystem::is_fifo(ini_path, ignored) ||
      std::filesystem::is_socket(ini_path, ignored)) {
    THPC_FAIL("cannot read config file '" << ini_path << "': it is a named pipe or socket, "
              "not a file (give the config's file)");
  }
  std::ifstream file(ini_path, std::ios::binary);
  if (!file) {
    THPC_FAIL("cannot open config file '" << ini_path << "': "
                                          << unreadable_file_reason(ini_path));
  }
  // A config is a few KB of text; a device such as /dev/zero, or a data file named by
  // mistake, would otherwise be read until memory runs out.
  constexpr std::streamsize kMaxConfigBytes = 1 << 20;
  std::string text(kMaxConfigBytes + 1, '\0');
  file.read(text.data(), static_cast<std::streamsize>(text.size()));
  text.resize(static_cast<size_t>(file.gcount()));
  // A checkpoint or a data shard given for the config (the first argument, by habit of
  // transformer_decode's) read as lines of binary: "a '#' inside the value of '\x00...'".
  // Before the size's refusal: a real one is larger than 1 MiB.
  if (text.find('\0') != std::string::npos) {
    const bool hdf5 = begins_as_hdf5(text);
    THPC_FAIL("config file '" << ini_path << "' is not text but "
              << (hdf5 ? "an HDF5 file (a checkpoint or a data shard?)" : "a binary file")
              << ": give the ini file of [section] and key = value lines (a checkpoint is "
              << "resumed with --checkpoint.resume=FILE beside its config)");
  }
  if (static_cast<std::streamsize>(text.size()) > kMaxConfigBytes) {
    THPC_FAIL("config file '" << ini_path << "' is larger than 1 MiB: a config is a few KB "
              "of [section] and key = value lines; is it the right file?");
  }
  // Editors on Windows start UTF-8 files with a byte order mark; it is not part of the
  // first line.
  if (text.rfind("\xEF\xBB\xBF", 0) == 0) text.erase(0, 3);
  text = with_semicolon_comments_blanked(ini_path, text);
  refuse_a_hash_inside_a_value(ini_path, text);
  std::istringstream stream(text);
  return resolve(ini_path, stream, values, /*require_keys=*/true, eval_checkpoint);
}

}  // namespace

// ---- public API ----


std::string Config::on_command_line(const std::string& key) const {
  return command_line_keys.count(key) > 0 ? " (on the command line)" : "";
}

namespace {

// `text` on one line: a line break written \n (\r).
std::string on_one_line(const std::string& text) {
  std::string line;
  for (const char c : text) {
    line += c == '\n' ? std::string("\\n") : c == '\r' ? std::string("\\r") : std::string(1, c);
  }
  return line;
}

}  // namespace

std::string header_line(const char* label, const std::string& value) {
  return std::string(label) + ": " + on_one_line(value);
}

std::string Config::to_ini() const {
  Config copy = *this;  // the table's accessors take a mutable Config
  std::ostringstream ini;
  // (A config file's name with a line break would end the comment: one line.)
  ini << "# transformer_hpc configuration, resolved"
      << (source_file.empty() ? std::string() : " from " + on_one_line(source_file))
      << " (file and command-line overrides applied)\n";
  std::string current_section;
  for (const Option& option : option_table()) {
    if (option.section != current_section) {
      current_section = option.section;
      ini << "\n[" << current_section << "]\n";
    }
    ini << option.key << " = " << format_value(option.field(copy)) << "\n";
  }
  return ini.str();
}

std::string Config::to_ini(const std::vector<std::string>& header) const {
  return with_header_lines(to_ini(), header);
}

std::string with_header_lines(const std::string& ini, const std::vector<std::string>& lines) {
  // The end of the head: past each leading comment line.
  size_t end = 0;
  while (end < ini.size() && ini[end] == '#') {
    const size_t line_end = ini.find('\n', end);
    end = line_end == std::string::npos ? ini.size() : line_end + 1;
  }
  std::string added;
  for (const std::string& line : lines) added += "# " + line + "\n";
  return ini.substr(0, end) + added + ini.substr(end);
}

std::string Config::value_text(const std::string& key) const {
  Config copy = *this;  // the table's accessors take a mutable Config
  for (const Option& option : option_table()) {
    if (option.name() == key) return format_value(option.field(copy));
  }
  THPC_FAIL("no configuration key " << key);
}

std::string Config::command_line_text() const {
  std::string text;
  for (const Option& option : option_table()) {
    if (command_line_keys.count(option.name()) == 0) continue;
    std::string value = value_text(option.name());
    // Quoted as a shell takes it back where it holds more than a path's characters.
    const bool plain = !value.empty() && std::all_of(value.begin(), value.end(), [](char c) {
      return std::isalnum(static_cast<unsigned char>(c)) || std::strchr("_./:,+-=@%", c);
    });
    if (!plain) {
      std::string quoted = "'";
      for (const char c : value) quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
      value = quoted + "'";
    }
    text += (text.empty() ? "--" : " --") + option.name() + "=" + value;
  }
  return text;
}

std::vector<std::string> ini_header_values(const std::string& ini, const char* label) {
  std::istringstream lines(ini);
  const std::string prefix = "# " + std::string(label) + ": ";
  std::vector<std::string> values;
  for (std::string line; std::getline(lines, line);) {
    if (!line.empty() && line[0] == '[') break;
    if (line.rfind(prefix, 0) == 0) values.push_back(line.substr(prefix.size()));
  }
  return values;
}

std::string ini_header_value(const std::string& ini, const char* label) {
  const std::vector<std::string> values = ini_header_values(ini, label);
  return values.empty() ? std::string() : values.back();
}

std::string help_text() {
  // Widths in characters, not bytes: a range may hold "≥".
  const auto width = [](const std::string& text) {
    return static_cast<std::size_t>(std::count_if(text.begin(), text.end(), [](char c) {
      return (static_cast<unsigned char>(c) & 0xC0) != 0x80;  // not a UTF-8 continuation
    }));
  };
  std::size_t key_width = 0;
  std::size_t type_width = 0;
  std::size_t default_width = 0;
  std::size_t range_width = std::string("range").size();
  Config defaults;
  for (const Option& option : option_table()) {
    key_width = std::max(key_width, width(option.key));
    type_width = std::max(type_width, width(type_name(option.field(defaults))));
    default_width = std::max(default_width, width(default_value_text(option)));
    range_width = std::max(range_width, width(option.allowed.range_text()));
  }
  const auto pad = [&](const std::string& text, std::size_t column_width) {
    const std::size_t used = width(text);
    return text + std::string(column_width > used ? column_width - used : 0, ' ');
  };

  std::ostringstream help;
  help << "usage: transformer_hpc CONFIG.ini [--section.key=value ...] [--dry-run | --eval "
          "CHECKPOINT] [--help] [--version]\n"
       << "       transformer_hpc --show-checkpoint CHECKPOINT\n"
       << "\n"
       << "Trains the Transformer configured by CONFIG.ini. Every key below belongs to a\n"
       << "[section] of the file; --section.key=value on the command line overrides it.\n"
       << "A value outside its key's range stops the program before any work.\n"
       << "\n"
       << "  -h, --help print this text and exit\n"
       << "  --dry-run  check what training checks at start-up (the configuration, the\n"
       << "             data, the checkpoint it would start from, the run directory),\n"
       << "             print the resolved configuration, and stop; writes nothing\n"
       << "  --eval CHECKPOINT\n"
       << "             print the validation loss and perplexity (and BLEU, chrF or\n"
       << "             F1, with train.valid_bleu) of CHECKPOINT on the data.valid shards\n"
       << "             of data.dir, as a 'valid step N' line; trains and writes nothing\n"
       << "  --show-checkpoint CHECKPOINT\n"
       << "             print what CHECKPOINT records of its run (step, run, data digests,\n"
       << "             params_sha256) as comments, then its stored configuration, headed\n"
       << "             by the version, matrix products and command line that ran it: an\n"
       << "             ini file that trains a run of one process again (the run's own\n"
       << "             directories commented out), and that diff sets beside another's\n";
  std::string current_section;
  for (const Option& option : option_table()) {
    if (option.section != current_section) {
      current_section = option.section;
      const std::string purpose = section_purpose(current_section);
      help << "\n[" << current_section << "]" << (purpose.empty() ? "" : "  " + purpose) << "\n"
           << "  " << pad("key", key_width) << "  " << pad("type", type_width) << "  "
           << pad("default", default_width) << "  " << pad("range", range_width)
           << "  meaning\n";
    }
    help << "  " << pad(option.key, key_width) << "  "
         << pad(type_name(option.field(defaults)), type_width) << "  "
         << pad(default_value_text(option), default_width) << "  "
         << pad(option.allowed.range_text(), range_width) << "  " << option.help << "\n";
  }
  return help.str();
}

namespace {

// "section.key" -> value of each "key = value" line of a to_ini() text, in order.
std::vector<std::pair<std::string, std::string>> ini_values(const std::string& ini) {
  std::vector<std::pair<std::string, std::string>> values;
  std::istringstream lines(ini);
  std::string line, section;
  while (std::getline(lines, line)) {
    if (line.empty() || line.front() == '#') continue;
    if (line.front() == '[' && line.back() == ']') {
      section = line.substr(1, line.size() - 2);
      continue;
    }
    const size_t equals = line.find(" = ");
    if (equals == std::string::npos) continue;
    values.emplace_back(section + "." + line.substr(0, equals), line.substr(equals + 3));
  }
  return values;
}

}  // namespace

std::vector<ConfigDifference> config_differences(const std::string& ini,
                                                 const std::string& reference_ini) {
  const auto values = ini_values(ini);
  const auto references = ini_values(reference_ini);
  const auto find = [](const std::vector<std::pair<std::string, std::string>>& in,
                       const std::string& key) -> std::string {
    for (const auto& [name, value] : in) {
      if (name == key) return value;
    }
    return "(absent)";
  };
  std::vector<ConfigDifference> differences;
  for (const auto& [key, value] : values) {
    const std::string reference = find(references, key);
    if (reference != value) differences.push_back({key, value, reference});
  }
  for (const auto& [key, reference] : references) {
    if (find(values, key) == "(absent)") differences.push_back({key, "(absent)", reference});
  }
  return differences;
}

Config load_config(const std::string& ini_path, const std::vector<std::string>& overrides) {
  // An override is a command-line option without its dashes: same parser, same rules.
  std::vector<std::string> tokens;
  for (const std::string& override_text : overrides) {
    tokens.push_back(override_text.rfind("--", 0) == 0 ? override_text : "--" + override_text);
  }
  po::variables_map values;
  try {
    const po::parsed_options parsed = po::command_line_parser(with_empty_values_apart(tokens))
                                          .options(table_description())
                                          .style(kCommandLineStyle)
                                          .allow_unregistered()
                                          .run();
    reject_unknown_options(ini_path, parsed);
    po::store(parsed, values);
  } catch (const po::error& error) {
    fail_command_line(ini_path, error);
  }
  return resolve_file(ini_path, values);
}

Config load_config_text(const std::string& ini_text, const std::string& source_name) {
  std::istringstream stream(ini_text);
  po::variables_map values;
  return resolve(source_name, stream, values, /*require_keys=*/false);
}

bool parse_command_line(int argc, const char* const* argv, Config& config) {
  po::options_description flags;
  flags.add_options()("help,h", "print the help text and exit")(
      "version", "print the git commit the program was built from and exit")(
      "dry-run", "check the configuration and stop")(
      "eval", po::value<std::string>(), "score a checkpoint on the validation shards")(
      "config", po::value<std::vector<std::string>>(), "the ini file");
  po::options_description all_options;
  all_options.add(flags).add(table_description());
  po::positional_options_description positional;
  positional.add("config", -1);  // any count, so that extra files get a clear message

  po::variables_map values;
  std::vector<std::string> config_files;
  std::string file_label = "command line";
  try {
    const po::parsed_options parsed =
        po::command_line_parser(with_empty_values_apart(std::vector<std::string>(argv + 1,
                                                                                argv + argc)))
                                          .options(all_options)
                                          .positional(positional)
                                          .style(kCommandLineStyle)
                                          .allow_unregistered()
                                          .run();
    // Find the file first so that every later message can name it.
    for (const po::option& option : parsed.options) {
      if (option.string_key == "config") {
        config_files.insert(config_files.end(), option.value.begin(), option.value.end());
      }
    }
    if (!config_files.empty()) file_label = config_files.front();
    for (const po::option& option : parsed.options) {
      if (option.string_key == "help") {
        std::cout << help_text();
        return false;
      }
      if (option.string_key == "version") {
        std::cout << version_line("transformer_hpc") << "\n";
        return false;
      }
    }
    reject_unknown_options(file_label, parsed);
    po::store(parsed, values);
  } catch (const po::error& error) {
    // Boost stopped before the positional file was known: name the first argument that
    // is a file, which is what the user meant as CONFIG.ini.
    for (int index = 1; index < argc && config_files.empty(); ++index) {
      std::error_code ignored;
      if (argv[index][0] != '-' && std::filesystem::is_regular_file(argv[index], ignored)) {
        file_label = argv[index];
        break;
      }
    }
    fail_command_line(file_label, error);
  }

  if (config_files.empty()) {
    THPC_FAIL("no config file given (usage: transformer_hpc CONFIG.ini "
              "[--section.key=value ...] [--dry-run | --eval CHECKPOINT]; --help lists the "
              "keys)");
  }
  if (config_files.size() > 1) {
    // "model.layers=3" without its dashes is taken for a file name.
    const std::string& second = config_files[1];
    const size_t equals = second.find('=');
    const bool a_setting = equals != std::string::npos &&
                           second.substr(0, equals).find('.') != std::string::npos &&
                           second.find('/') == std::string::npos;
    // "--train.max_steps= 5": the empty value is taken, and the value for a file name.
    std::string spaced_value;
    for (int i = 2; i < argc; ++i) {
      const std::string before = argv[i - 1];
      if (argv[i] == second && before.size() > 3 && before.rfind("--", 0) == 0 &&
          before.back() == '=' && before.find('.') != std::string::npos &&
          before.find('=') == before.size() - 1) {
        spaced_value = " (a space after '" + before + "'? that key got an empty value: write " +
                       before + second + ")";
        break;
      }
    }
    THPC_FAIL("more than one config file given: '"
              << config_files[0] << "' and '" << second << "'"
              << (a_setting ? " (a setting is written --" + second + ")" : spaced_value));
  }
  values.erase("config");
  values.erase("help");
  const bool dry_run = values.count("dry-run") > 0;
  values.erase("dry-run");
  std::string eval_checkpoint;
  if (values.count("eval")) {
    eval_checkpoint = values["eval"].as<std::string>();
    values.erase("eval");
    if (eval_checkpoint.empty()) THPC_FAIL("--eval: needs a checkpoint file (--eval=FILE)");
    // `--eval --dry-run` took the option for the file ("checkpoint --dry-run: no such
    // file", exit 1), as the table's keys are kept from doing.
    if (eval_checkpoint.rfind("--", 0) == 0) {
      THPC_FAIL("--eval: needs a checkpoint file, and the next argument "
                << thpc::quoted(eval_checkpoint) << " is an option (write --eval=FILE)");
    }
    if (dry_run) THPC_FAIL("--eval and --dry-run: give one of them");
  }

  config = resolve_file(config_files.front(), values, eval_checkpoint);
  config.dry_run = dry_run;
  config.eval_checkpoint = eval_checkpoint;
  return true;
}

}  // namespace thpc
