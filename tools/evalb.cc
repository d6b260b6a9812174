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

namespace po = boost::program_options;

constexpr const char* kUsageHead =
    "usage: transformer_evalb [-p PARAM.prm] [-d] [-e N] [-c N] GOLD TEST\n"
    "\n"
    "Scores the trees of TEST against those of GOLD (one tree per line) as EVALB does:\n"
    "labelled bracketing recall, precision, F-measure, complete match, crossing\n"
    "brackets and tagging accuracy, for all sentences and those of length <= CUTOFF_LEN.\n"
    "The options are EVALB's";

struct CommandLine {
  std::string parameter_path;
  std::string gold_path;
  std::string test_path;
  bool debug = false;
  std::optional<int> max_error;
  std::optional<int> cutoff_length;
  bool help = false;
};

// The options --help shows, and with `with_files` the positional GOLD and TEST too.
po::options_description describe(CommandLine& command, int& max_error, int& cutoff_length,
                                 bool with_files) {
  po::options_description options(kUsageHead);
  options.add_options()
      (",p", po::value(&command.parameter_path)->value_name("PARAM.prm"),
       "parameter file (default: EVALB's built-in defaults)")
      (",d", po::bool_switch(&command.debug), "debug: the word and bracket tables of every sentence")
      (",e", po::value(&max_error)->value_name("N"),
       "stop after more than N + 1 errors (overrides MAX_ERROR)")
      (",c", po::value(&cutoff_length)->value_name("N"),
       "cut-off length of the second summary (overrides CUTOFF_LEN)")
      ("help,h", "print this text and exit");
  if (with_files) {
    options.add_options()("gold", po::value(&command.gold_path))(
        "test", po::value(&command.test_path));
  }
  return options;
}

std::string usage() {
  CommandLine command;
  int max_error = 0, cutoff_length = 0;
  return thpc::tools::usage_text(describe(command, max_error, cutoff_length, false));
}

CommandLine parse_command_line(int argc, char** argv) {
  CommandLine command;
  int max_error = 0, cutoff_length = 0;
  po::positional_options_description files;
  files.add("gold", 1).add("test", 1);
  const po::variables_map values = thpc::tools::parse_options(
      describe(command, max_error, cutoff_length, true), argc, argv, files);
  command.help = values.count("help") > 0;
  if (values.count("-e")) command.max_error = max_error;
  if (values.count("-c")) command.cutoff_length = cutoff_length;
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
  return thpc::tools::tool_main("transformer_evalb", usage(), argc, argv, parse_command_line, run);
}
