// transformer_evalb: bracketing scores of test trees against gold trees, as EVALB
// (Sekine & Collins) computes and prints them.
//
//   transformer_evalb [-p PARAM.prm] [-d] [-e N] [-c N] GOLD TEST
//
// GOLD and TEST hold one tree per line; one of them may be - (standard input). The report
// (per-sentence lines, then the summary for all sentences and for those of length <=
// CUTOFF_LEN) goes to standard output and EVALB's error lines ("LINE : Length unmatch
// (G|T)") to standard error.
// Exit codes: 0 scored, 1 an unreadable file, more than MAX_ERROR + 1 errors (EVALB
// stops there, without a summary), files of different line counts (EVALB scores the
// shorter's lines and exits 0), no tree in either or no sentence scored (all skipped or
// in error: EVALB prints nan), each after the report with one line naming the files; 2 a
// bad command line.
#include <algorithm>
#include <fstream>
#include <iostream>
#include <optional>
#include <string>

#include "checkpoint/output_file.h"
#include "common/error.h"
#include "common/input_file.h"
#include "parse/evalb.h"
#include "tools/tool_main.h"

namespace {

namespace po = boost::program_options;

constexpr const char* kUsageHead =
    "usage: transformer_evalb [-p PARAM.prm] [-d] [-e N] [-c N] GOLD TEST\n"
    "\n"
    "Scores the trees of TEST against those of GOLD (one tree per line; one of the two\n"
    "may be -, standard input) as EVALB does:\n"
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
      ("help,h", "print this text and exit")(
      "version", "print the git commit the program was built from and exit");
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
  thpc::tools::refuse_empty_values(values, {"-p"});
  // (EVALB takes a negative count as it is: -c -5 printed a second summary of no sentence
  // with an F-measure of -nan, -e -5 stopped at the first error.)
  if (values.count("-e")) {
    thpc::tools::require_at_least("-e", max_error, 0);
    command.max_error = max_error;
  }
  if (values.count("-c")) {
    thpc::tools::require_at_least("-c", cutoff_length, 0);
    command.cutoff_length = cutoff_length;
  }
  if (!command.help && command.test_path.empty()) THPC_FAIL("needs a gold file and a test file");
  if (command.gold_path == "-" && command.test_path == "-") {
    THPC_FAIL("the gold and the test file cannot both be standard input (-): give one a path");
  }
  // `>> gold.tree` appended the report to the gold trees, exit 0.
  if (const std::string input = thpc::input_standard_output_is(
          {command.gold_path, command.test_path, command.parameter_path});
      !input.empty()) {
    THPC_FAIL("standard output is the file of the input " << input << ": writing the report "
              "there would change it; redirect the output to another file");
  }
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
  // "-" is standard input, as in the other tools (`... | transformer_trees delinearize
  // ... --output - | transformer_evalb GOLD -`; before: "-: no such file").
  std::ifstream gold_file, test_file;
  if (command.gold_path != "-") {
    gold_file = thpc::open_text_file(command.gold_path, "the gold file");
  }
  if (command.test_path != "-") {
    test_file = thpc::open_text_file(command.test_path, "the test file");
  }
  std::istream& gold = command.gold_path == "-" ? std::cin : gold_file;
  std::istream& test = command.test_path == "-" ? std::cin : test_file;
  const thpc::parse::EvalbResult result =
      thpc::parse::run_evalb(parameters, gold, test, std::cout, std::cerr);
  // How the lines below name the files ("standard input" for -).
  const auto named = [](const std::string& path) {
    return path == "-" ? std::string("standard input") : path;
  };
  const std::string gold_name = named(command.gold_path), test_name = named(command.test_path);
  // EVALB's own lines say "LINE : MESSAGE" without a file, repeat "Reading sentence" up to
  // MAX_ERROR for a line that is not a tree, and score files of different lengths or
  // none at all with exit 0: one line naming the file and what to do, and exit 1.
  const std::string where = result.first_error_file == "gold"   ? gold_name
                            : result.first_error_file == "test" ? test_name
                                                                 : std::string();
  const std::string line = std::to_string(result.first_error_line);
  const std::string first =
      (where.empty() ? "line " + line + " of " + gold_name + " and " + test_name
                     : where + " line " + line) +
      ": " + result.first_error;
  if (result.stopped) {
    // Where the limit came from: -e, the parameter file's MAX_ERROR, or EVALB's default
    // (before: "-e 10" for a MAX_ERROR the user never gave as -e).
    const std::string limit =
        command.max_error                  ? "-e " + std::to_string(parameters.max_error)
        : command.parameter_path.empty()   ? "-e " + std::to_string(parameters.max_error) +
                                                 ", the default"
                                           : "MAX_ERROR " + std::to_string(parameters.max_error) +
                                                 " of " + command.parameter_path + "; -e N sets it";
    std::cerr << "transformer_evalb: error: stopped after " << result.errors << " errors ("
              << limit << "), without a summary; the first: " << first
              << (result.first_error.find("Reading sentence") != std::string::npos
                      ? " (a line that is not a bracketed tree)"
                      : "")
              // A treebank's own file spreads each tree over lines, which EVALB reads as
              // broken trees (a helper's trial gave wsj_0001.mrg and got no hint).
              << (result.first_error.find("racket") != std::string::npos
                      ? "; each line must hold one whole tree: for a treebank's .mrg files, "
                        "`transformer_trees linearize --output PREFIX FILE.mrg ...` writes "
                        "PREFIX.gold, one tree a line"
                      : "")
              << std::endl;
    return 1;
  }
  if (result.gold_lines != result.test_lines) {
    std::cerr << "transformer_evalb: error: " << gold_name << " has "
              << result.gold_lines << " lines and " << test_name << " "
              << result.test_lines << ": the summary covers the first "
              << std::min(result.gold_lines, result.test_lines)
              << " only; give the test trees of every gold line, one a line" << std::endl;
    return 1;
  }
  if (result.gold_lines == 0) {
    std::cerr << "transformer_evalb: error: " << gold_name << " and "
              << test_name << " hold no trees: nothing was scored" << std::endl;
    return 1;
  }
  // A raw treebank's gold "( (S ..." against TOP-rooted test trees scored 33.30 where the
  // same trees written alike scored 34.40, without a word (a parser user's walk): EVALB's
  // rule, kept, and said.
  if (result.unlabelled_root_against_labelled > 0) {
    std::cerr << "transformer_evalb: note: in " << result.unlabelled_root_against_labelled
              << " of the sentences (the first at line " << result.first_unlabelled_root_line
              << ") one file's outermost bracket has no label, or is ROOT, and the other's "
              << "is TOP: EVALB scores the unlabelled or ROOT bracket as a constituent and "
              << "deletes TOP, so "
              << "these score lower than trees written alike; `transformer_trees linearize` "
              << "writes gold trees as (TOP ...), as delinearize writes test trees" << std::endl;
  }
  // Every sentence skipped (a blank test line: a parser that gave no tree) or in error:
  // the summary's scores are EVALB's 0/0, printed as nan, not a score.
  if (result.all.valid_sentences() == 0) {
    const int skipped = result.all.skipped_sentences;
    const int in_error = result.all.error_sentences;
    std::cerr << "transformer_evalb: error: none of the " << result.all.sentences
              << " sentences of " << gold_name << " and " << test_name << " was scored ("
              << (skipped > 0 ? std::to_string(skipped) + " skipped, their lines of " +
                                    test_name + " without a tree"
                              : std::string())
              << (skipped > 0 && in_error > 0 ? "; " : "")
              << (in_error > 0 ? std::to_string(in_error) + " in error, as the lines above say"
                               : std::string())
              << "): the summary holds no score" << std::endl;
    return 1;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return thpc::tools::tool_main("transformer_evalb", usage(), argc, argv, parse_command_line, run);
}
