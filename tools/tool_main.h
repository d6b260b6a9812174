// The main() of every tool (transformer_preprocess, _decode, _average, _data_stats,
// _bench_step, _score, _evalb, _trees): one place that maps a bad command line to exit 2
// with one line "NAME: PROBLEM (see --help)", --help to the usage text and exit 0 (1 when
// standard output does not take it), a refusal (Refusal, OutputInUse) to exit 2 with
// its one line, and any other runtime failure to exit 1 with one line "NAME: error:
// PROBLEM".
//
// A tool declares a Boost.Program_options description whose values are bound to its
// variables (po::value(&field)->default_value(field), so that --help shows every
// default) and parses it with parse_options() below; transformer_score passes
// kSingleDashLongNames to take sacreBLEU's spellings (-tok, -lc, -sv), and
// transformer_trees takes its subcommand as the first positional argument.
#pragma once

#include <boost/program_options.hpp>

#include <cctype>
#include <cmath>
#include <cstdlib>
#include <exception>
#include <initializer_list>
#include <iostream>
#include <limits>
#include <stdexcept>
#include <sstream>
#include <string>
#include <string_view>
#include <typeinfo>
#include <vector>

#include "common/error.h"
#include "common/source_version.h"
#include "io/atomic_file.h"
#include "io/hdf5.h"

namespace thpc::tools {

// A command-line mistake found only once the tool runs (transformer_decode --dump-lines
// naming a line its input lacks): exit 2 with the usage line, like those found parsing.
class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A command line that is well formed but names what cannot be used now (transformer_
// preprocess's --destdir in use by another run, or that this user cannot write): exit 2,
// as the trainer's checkpoint.dir refusals, with its one line, which says what to do itself
// (no " (see --help)").
class Refusal : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// " (see --help)" after a usage error's message, unless the message points there itself
// (a config key's, read through --set: "transformer_hpc --help lists the keys of [model]").
inline std::string see_help(const std::string& message) {
  return message.find("--help") == std::string::npos ? " (see --help)" : "";
}

// `parse(argc, argv)` returns the command line (with a bool `help`) or throws
// thpc::Error for a usage error; `run(command)` returns the exit code. `files_written`,
// for a tool whose standard output is a report of files it wrote ("the shards and
// spm.model"), says after a standard output cut short that those are whole: the failure
// read as if the run had failed (a helper's finding).
template <typename Parse, typename Run>
int tool_main(const char* name, const std::string& usage, int argc, char** argv, Parse parse,
              Run run, const std::string& files_written = "") {
  thpc::guard_standard_streams();
  thpc::fail_writes_past_the_file_size_limit();
  thpc::hdf5::use_our_locks_not_hdf5s();
  thpc::remove_temporaries_when_interrupted();
  // --version anywhere answers alone, before the rest is read (as GNU tools do).
  for (int i = 1; i < argc; ++i) {
    if (std::string_view(argv[i]) == "--version") {
      std::cout << thpc::version_line(name) << "\n";
      return thpc::standard_output_failure().empty() ? 0 : 1;
    }
  }
  decltype(parse(argc, argv)) command;
  try {
    command = parse(argc, argv);
  } catch (const thpc::Error& e) {
    std::cerr << name << ": " << e.what() << see_help(e.what()) << "\n";
    return 2;
  }
  int code = 0;
  if (command.help) {
    std::cout << usage;
  } else {
    try {
      code = run(command);
    } catch (const UsageError& e) {
      std::cerr << name << ": " << e.what() << see_help(e.what()) << "\n";
      return 2;
    } catch (const Refusal& e) {
      std::cerr << name << ": " << e.what() << "\n";
      return 2;
    } catch (const thpc::OutputInUse& e) {  // another program writes the output now
      std::cerr << name << ": " << e.what() << "\n";
      return 2;
    } catch (const std::exception& e) {
      std::cerr << name << ": error: " << thpc::failure_message(e) << "\n";
      return 1;
    }
  }
  // A score or a tree file printed to a full disk is a failure, not exit 0.
  if (const std::string failure = thpc::standard_output_failure(); !failure.empty()) {
    std::cerr << name << ": error: " << failure
              << (code == 0 && !command.help && !files_written.empty()
                      ? " (a report only: it wrote " + files_written + " whole)"
                      : std::string())
              << "\n";
    return code == 0 ? 1 : code;
  }
  return code;
}

// The --help text of a description: Boost writes each option's default after its name
// ("--beam arg (=4)") when the option was declared with default_value.
inline std::string usage_text(const boost::program_options::options_description& options) {
  std::ostringstream text;
  text << options << "\n";
  return text.str();
}

// Boost's default style, plus long names after one dash (sacreBLEU's -tok, -lc, -sv, -cc
// are long names) and without prefix guessing (where -s could be any of four options).
constexpr int kSingleDashLongNames =
    (boost::program_options::command_line_style::default_style |
     boost::program_options::command_line_style::allow_long_disguise) &
    ~boost::program_options::command_line_style::allow_guessing;

// Why `value` is not a value of `option`, in words ("" for a string or a type not
// listed): "is not a whole number", "is not a whole number >= 0", "is not a number", or,
// for digits past what the type holds, "is too large" / "is too small" (the type's own
// range is not the option's, which its check after parsing names).
inline std::string why_not_a_value(const boost::program_options::option_description& option,
                                   const std::string& value) {
  const auto* typed =
      dynamic_cast<const boost::program_options::typed_value_base*>(option.semantic().get());
  if (typed == nullptr) return "";
  const std::type_info& type = typed->value_type();
  const bool digits = value.find_first_of("0123456789") != std::string::npos &&
                      value.find_first_not_of("0123456789", value[0] == '-' ? 1 : 0) ==
                          std::string::npos;
  const auto whole = [&](bool is_unsigned) -> std::string {
    const bool negative = !value.empty() && value[0] == '-';
    if (digits && !(negative && is_unsigned)) return negative ? "is too small" : "is too large";
    return is_unsigned ? "is not a whole number >= 0" : "is not a whole number";
  };
  if (type == typeid(int) || type == typeid(long) || type == typeid(long long)) {
    return whole(false);
  }
  if (type == typeid(unsigned) || type == typeid(unsigned long) ||
      type == typeid(unsigned long long)) {
    return whole(true);
  }
  if (type == typeid(float) || type == typeid(double)) {
    // A number past what the type holds ("--lenpen 1e39", a float) is one: said so, not
    // "is not a number".
    char* end = nullptr;
    const double parsed = std::strtod(value.c_str(), &end);
    const bool number = !value.empty() && end == value.c_str() + value.size();
    const double largest = type == typeid(float) ? std::numeric_limits<float>::max()
                                                 : std::numeric_limits<double>::max();
    if (number && std::fabs(parsed) > largest) {
      std::ostringstream why;
      why << (parsed < 0 ? "is too small" : "is too large") << " (a "
          << (type == typeid(float) ? "float" : "double") << " holds " << largest
          << " at most)";
      return why.str();
    }
    return "is not a number";
  }
  // An option of several values takes each as an argument of its own ("1,-1" is one).
  const std::string name = option.long_name().empty() ? option.format_name()
                                                      : "--" + option.long_name();
  if (type == typeid(std::vector<float>) || type == typeid(std::vector<double>)) {
    return "is not a number (several are separate arguments: " + name + " 1 0.5)";
  }
  if (type == typeid(std::vector<int>)) {
    return "is not a whole number (several are separate arguments: " + name + " 1 2)";
  }
  return "";
}

// Boost's message for a bad command line, naming an option that has only a short name
// (transformer_evalb's -e) as the user spells it: Boost writes it with two dashes, as if
// it were a long name ("option '--e'"), which the tool does not take. A value of the
// wrong kind says what the option takes: Boost's "the argument ('two') for option
// '--shards' is invalid" said neither that nor why ("1,-1" for --weights).
// Boost's name of the option an error is about without its dashes ("--dir" -> "dir"); ""
// for none.
inline std::string option_name_without_dashes(
    const boost::program_options::error_with_option_name& error) {
  const std::string named = error.get_option_name();
  const size_t from = named.find_first_not_of('-');
  return from == std::string::npos ? "" : named.substr(from);
}

inline std::string message_naming_option(
    const boost::program_options::error_with_option_name& error,
    const boost::program_options::options_description& options) {
  std::string message = error.what();
  const std::string named = error.get_option_name();
  if (dynamic_cast<const boost::program_options::invalid_option_value*>(&error) != nullptr &&
      !option_name_without_dashes(error).empty()) {
    // "the argument ('two') for option ..."; an empty value has no "('...')".
    const size_t value_from = message.find("('");
    const size_t value_to = message.rfind("')");
    const bool quoted_value = value_from != std::string::npos && value_to > value_from;
    const std::string bare = option_name_without_dashes(error);
    const auto* option = options.find_nothrow(bare, false);
    if (option == nullptr) option = options.find_nothrow("-" + bare, false);  // -e
    if (option != nullptr) {
      const std::string value =
          quoted_value ? message.substr(value_from + 2, value_to - value_from - 2) : "";
      const std::string why = why_not_a_value(*option, value);
      const std::string spelt = option->long_name().empty() ? "-" + bare : "--" + bare;
      if (!why.empty()) return spelt + ": '" + value + "' " + why;
    }
  }
  const bool short_only = named.size() == 3 && named.compare(0, 2, "--") == 0 &&
                          options.find_nothrow(named.substr(1), false) != nullptr &&
                          options.find_nothrow(named.substr(2), false) == nullptr;
  if (short_only && dynamic_cast<const boost::program_options::unknown_option*>(&error)) {
    // What the user typed, two dashes, is unknown; the option has one.
    return "unrecognised option '" + named + "': the option is " + named.substr(1) +
           ", with one dash";
  }
  const std::string quoted = "'" + named + "'";
  const size_t at = message.find(quoted);
  if (short_only && at != std::string::npos) {
    message.replace(at, quoted.size(), "'" + named.substr(1) + "'");
  }
  return message;
}

// argv parsed against `options` without positional slots, keeping what no option takes:
// unknown options as unregistered ones, bare arguments in their order. Throws Boost's
// error where even that does not parse.
inline boost::program_options::parsed_options parsed_letting_unknown_through(
    const boost::program_options::options_description& options, int argc, char** argv,
    int style) {
  return boost::program_options::command_line_parser(argc, argv)
      .options(options)
      .style(style)
      .allow_unregistered()
      .run();
}

// Boost's "too many positional options have been specified" names no argument, and says
// "options" of what the user wrote as a value. This names the first argument that no
// option and no positional slot takes ("--checkpoint a.h5 b.h5": 'b.h5') and says how
// values are written. Parsed again to find it, without the slots and keeping what no
// option takes: the bare arguments come back in their order.
inline std::string message_naming_extra_argument(
    const boost::program_options::options_description& options, int argc, char** argv,
    const boost::program_options::positional_options_description& positional, int style) {
  namespace po = boost::program_options;
  const unsigned slots = positional.max_total_count();
  std::string extra;
  try {
    const po::parsed_options parsed = parsed_letting_unknown_through(options, argc, argv, style);
    const std::vector<std::string> bare =
        po::collect_unrecognized(parsed.options, po::include_positional);
    if (bare.size() > slots) extra = bare[slots];
  } catch (const po::error&) {
    // Cannot happen after the first parse got this far; the message goes without the name.
  }
  std::ostringstream message;
  message << "unexpected argument" << (extra.empty() ? "" : " '" + extra + "'") << ": ";
  if (slots == 0) {
    message << "every value follows its option's name (--name VALUE)";
  } else {
    message << "the command line takes " << slots << " argument" << (slots == 1 ? "" : "s")
            << " without an option's name, and every other value follows its option's name "
               "(--name VALUE)";
  }
  return message.str();
}

// Another toolkit's name for what an option of a tool does (Marian's, fairseq's), and
// what to write instead: said where a user types that name, which the tool does not have.
struct OtherToolkitsOption {
  const char* name;     // without dashes: "beam-size", "b"
  const char* instead;  // "here it is --beam"
};

// The first argument naming an option the tool lacks but `names` knows (as -x, --name or
// --name=value), said with what to write instead; nothing when there is none.
inline void refuse_other_toolkits_options(
    const boost::program_options::options_description& options, int argc, char** argv,
    std::initializer_list<OtherToolkitsOption> names) {
  for (int i = 1; i < argc; ++i) {
    const std::string token = argv[i];
    if (token.size() < 2 || token[0] != '-' || token == "--") continue;
    const size_t dashes = token[1] == '-' ? 2 : 1;
    const std::string name = token.substr(dashes, token.find('=') - dashes);
    // A one-letter name is another toolkit's as -x; --x is Boost's to read (a prefix of a
    // long name: --i for --input).
    if (name.size() == 1 && dashes == 2) continue;
    const bool known = options.find_nothrow(name, false) != nullptr ||
                       (dashes == 1 && options.find_nothrow("-" + name, false) != nullptr);
    if (known) continue;
    for (const OtherToolkitsOption& other : names) {
      if (name == other.name) {
        THPC_FAIL("unrecognised option '" << token.substr(0, token.find('='))
                                          << "' (a name from other toolkits: " << other.instead
                                          << ")");
      }
    }
  }
}

// Parses argv against `options` (and `positional`, if any) in `style`. Without --help, stores the
// values into the variables they are bound to and checks required options; Boost's
// errors (an unknown option, a missing or malformed value) become thpc::Error, which
// tool_main reports as a bad command line. The returned map says what was given.
// Whether an option's name as typed is a negative number ("-1", "-.5"): a value that
// Boost read as a name, which its own message says of the list it ended.
inline bool names_a_negative_number(const std::string& typed) {
  return typed.size() > 1 && typed[0] == '-' &&
         (std::isdigit(static_cast<unsigned char>(typed[1])) != 0 ||
          (typed[1] == '.' && typed.size() > 2));
}

// The options of argv that `options` does not know, as typed ("--foo", "-x"), when there
// are two or more: Boost stops at the first, and a user with several learnt of one a run.
// Parsed without the positional slots, so that a bare value (an unknown option's, "--foo
// 1") is no error here; a name that is a number ("--weights 1 -1") is left to the parse's
// own message. Empty when fewer than two, or when the command line does not parse so.
inline std::vector<std::string> unknown_options(
    const boost::program_options::options_description& options, int argc, char** argv,
    int style) {
  namespace po = boost::program_options;
  std::vector<std::string> unknown;
  try {
    const po::parsed_options parsed = parsed_letting_unknown_through(options, argc, argv, style);
    for (const po::option& option : parsed.options) {
      if (!option.unregistered || option.string_key.empty() || option.original_tokens.empty()) {
        continue;
      }
      const std::string token = option.original_tokens.front();
      const std::string name = token.substr(0, token.find('='));
      if (!names_a_negative_number(name)) unknown.push_back(name);
    }
  } catch (const po::error&) {
    return {};
  }
  return unknown.size() >= 2 ? unknown : std::vector<std::string>{};
}

inline boost::program_options::variables_map parse_options(
    const boost::program_options::options_description& options, int argc, char** argv,
    const boost::program_options::positional_options_description& positional = {},
    int style = boost::program_options::command_line_style::default_style) {
  namespace po = boost::program_options;
  const std::vector<std::string> unknown = unknown_options(options, argc, argv, style);
  if (!unknown.empty()) {
    std::string listed;
    for (const std::string& name : unknown) listed += (listed.empty() ? "'" : ", '") + name + "'";
    THPC_FAIL(unknown.size() << " unrecognised options: " << listed << " (see --help)");
  }
  po::variables_map values;
  try {
    po::store(po::command_line_parser(argc, argv)
                  .options(options)
                  .positional(positional)
                  .style(style)
                  .run(),
              values);
    if (!values.count("help")) po::notify(values);
  } catch (const po::multiple_occurrences& error) {
    // An option that is also a positional argument, given both ways (transformer_data_stats
    // DIR --dir DIR): Boost's "option '--dir' cannot be specified more than once" said the
    // user had typed it twice.
    const std::string bare = option_name_without_dashes(error);
    int typed = 0;  // how often the option itself is on the command line
    for (int i = 1; i < argc; ++i) {
      const std::string token = argv[i];
      typed += token == "--" + bare || token.rfind("--" + bare + "=", 0) == 0;
    }
    for (unsigned position = 0; typed == 1 && position < positional.max_total_count() &&
                                position < 8;
         ++position) {
      if (positional.name_for_position(position) == bare) {
        THPC_FAIL("--" << bare << " is given twice: as an argument without an option and as --"
                       << bare << "; give it once");
      }
    }
    THPC_FAIL(message_naming_option(error, options));
  } catch (const po::required_option& error) {
    // A positional argument left out was said as an option ("the option '--dir' is
    // required but missing", where the usage line shows DIR).
    const std::string bare = option_name_without_dashes(error);
    if (positional.max_total_count() > 0 && positional.name_for_position(0) == bare) {
      std::string upper = bare;
      for (char& c : upper) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
      THPC_FAIL(upper << " is missing: give it as the first argument (or as --" << bare
                      << ")");
    }
    THPC_FAIL(message_naming_option(error, options));
  } catch (const po::unknown_option& error) {
    // A negative number in an option's list of values ("--weights 1 -1") ends the list and
    // is read as an option's name: "unrecognised option '-1'" said nothing of the list (a
    // helper's trial). Said of the list's option, the nearest before it.
    const std::string named = error.get_option_name();
    const bool a_number = names_a_negative_number(named);
    for (int i = argc - 1; a_number && i > 1; --i) {
      if (argv[i] != named) continue;
      // The nearest option before it, as typed (--metrics, -m, or a one-dash long name
      // such as transformer_score's -lc): a list only if that option takes several values.
      int j = i - 1;
      while (j >= 1 && argv[j][0] != '-') --j;
      if (j < 1) break;
      const std::string token = argv[j];
      const bool two_dashes = token.rfind("--", 0) == 0;
      const auto* list = two_dashes ? options.find_nothrow(token.substr(2), false)
                                    : options.find_nothrow(token, false);  // -m
      if (list == nullptr && !two_dashes) list = options.find_nothrow(token.substr(1), false);
      if (list == nullptr || list->semantic()->max_tokens() <= 1) break;
      THPC_FAIL(token << ": '" << named << "' after it is read as an option's name, not as "
                      << "one of its values: a value of " << token << " cannot begin with '-'");
    }
    THPC_FAIL(message_naming_option(error, options));
  } catch (const po::error_with_option_name& error) {
    THPC_FAIL(message_naming_option(error, options));
  } catch (const po::too_many_positional_options_error&) {
    THPC_FAIL(message_naming_extra_argument(options, argc, argv, positional, style));
  } catch (const po::error& error) {
    THPC_FAIL(error.what());
  }
  return values;
}

// Refuses each of `names` given with an empty value (a shell variable left unset):
// `transformer_evalb -p $PRM` scored with EVALB's defaults, `--testpref $TEST` wrote no
// test split, `transformer_trees --input $SEQ` read the terminal, each without a word.
// A name is as the variables map holds it ("spm-model", or "-p" for a short-only one).
inline void refuse_empty_values(const boost::program_options::variables_map& values,
                                std::initializer_list<const char*> names) {
  for (const char* name : names) {
    if (values.count(name) == 0 || values[name].defaulted()) continue;
    const boost::any& value = values[name].value();
    bool empty = false;
    if (const auto* text = boost::any_cast<std::string>(&value)) {
      empty = text->empty();
    } else if (const auto* texts = boost::any_cast<std::vector<std::string>>(&value)) {
      for (const std::string& one : *texts) empty = empty || one.empty();
    }
    if (empty) {
      const std::string spelt = name[0] == '-' ? name : "--" + std::string(name);
      THPC_FAIL(spelt << " is given an empty value (a variable left unset?): give a path, or "
                      << "leave the option out");
    }
  }
}

// A numeric option's lower bound, checked one option at a time so that the message names
// the option given and its value, as transformer_preprocess's do: "--beam must be >= 1,
// got 0". `what` (may be empty) says what the option counts or what 0 means.
template <typename T, typename Least>
void require_at_least(const char* option, T value, Least least, const char* what = "") {
  if (value >= static_cast<T>(least)) return;  // false for NaN as well
  THPC_FAIL(option << " must be >= " << least << (*what != '\0' ? " (" : "") << what
                   << (*what != '\0' ? ")" : "") << ", got " << value);
}

}  // namespace thpc::tools
