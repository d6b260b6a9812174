// transformer_evalb: bracketing scores of test trees against gold trees, as EVALB
// (Sekine & Collins) computes and prints them.
//
//   transformer_evalb [-p PARAM.prm] [-d] [-e N] [-c N] GOLD TEST
//
// GOLD and TEST hold one tree per line. The report (per-sentence lines, then the
// summary for all sentences and for those of length <= CUTOFF_LEN) goes to standard
// output and EVALB's error lines ("LINE : Length unmatch (G|T)") to standard error.
// Exit codes: 0 scored, 1 an unreadable file or more than MAX_ERROR + 1 errors (EVALB
// stops there, without a summary), 2 a bad command line.
#include <fstream>
#include <iostream>
#include <optional>
#include <string>

#include "common/error.h"
#include "parse/evalb.h"
#include "tools/tool_main.h"

namespace {

constexpr const char* kUsage =
    "usage: transformer_evalb [-p PARAM.prm] [-d] [-e N] [-c N] GOLD TEST\n"
    "\n"
    "Scores the trees of TEST against those of GOLD (one tree per line) as EVALB does:\n"
    "labelled bracketing recall, precision, F-measure, complete match, crossing\n"
    "brackets and tagging accuracy, for all sentences and those of length <= CUTOFF_LEN.\n"
    "\n"
    "  -p PARAM.prm   EVALB parameter file (default: EVALB's built-in defaults)\n"
    "  -d             debug: the word and bracket tables of every sentence\n"
    "  -e N           stop after more than N + 1 errors (overrides MAX_ERROR)\n"
    "  -c N           cut-off length of the second summary (overrides CUTOFF_LEN)\n"
    "  -h, --help     print this text and exit\n";

struct CommandLine {
  std::string parameter_path;
  std::string gold_path;
  std::string test_path;
  bool debug = false;
  std::optional<int> max_error;
  std::optional<int> cutoff_length;
  bool help = false;
};

int parse_count(const std::string& option, const std::string& text) {
  size_t used = 0;
  int value = 0;
  try {
    value = std::stoi(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != text.size()) THPC_FAIL(option << ": '" << text << "' is not a number");
  return value;
}

CommandLine parse_command_line(int argc, char** argv) {
  CommandLine command;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) THPC_FAIL(arg << " needs a value");
      return argv[++i];
    };
    if (arg == "-h" || arg == "--help") {
      command.help = true;
    } else if (arg == "-p") {
      command.parameter_path = value();
    } else if (arg == "-d") {
      command.debug = true;
    } else if (arg == "-e") {
      command.max_error = parse_count(arg, value());
    } else if (arg == "-c") {
      command.cutoff_length = parse_count(arg, value());
    } else if (arg.size() > 1 && arg[0] == '-') {
      THPC_FAIL("unknown option " << arg);
    } else if (command.gold_path.empty()) {
      command.gold_path = arg;
    } else if (command.test_path.empty()) {
      command.test_path = arg;
    } else {
      THPC_FAIL("one gold and one test file, not '" << arg << "' besides");
    }
  }
  if (!command.help && command.test_path.empty()) THPC_FAIL("needs a gold file and a test file");
  return command;
}

int run(const CommandLine& command) {
  thpc::parse::EvalbParameters parameters;
  if (!command.parameter_path.empty()) {
    parameters = thpc::parse::read_evalb_parameters(command.parameter_path, std::cerr);
  }
  if (command.debug) parameters.debug = 1;
  if (command.max_error) parameters.max_error = *command.max_error;
  if (command.cutoff_length) parameters.cutoff_length = *command.cutoff_length;
  std::ifstream gold(command.gold_path);
  if (!gold) THPC_FAIL(command.gold_path << ": cannot open the gold file");
  std::ifstream test(command.test_path);
  if (!test) THPC_FAIL(command.test_path << ": cannot open the test file");
  const thpc::parse::EvalbResult result =
      thpc::parse::run_evalb(parameters, gold, test, std::cout, std::cerr);
  return result.stopped ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  return thpc::tools::tool_main("transformer_evalb", kUsage, argc, argv, parse_command_line, run);
}
