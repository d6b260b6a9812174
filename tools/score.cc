// transformer_score: corpus or sentence BLEU exactly as sacreBLEU 2.x computes it.
//
//   transformer_score REF [REF ...] [-i HYP] [--tokenize 13a|intl|char|none] [-lc]
//                     [-s none|floor|add-k|exp] [-sv VALUE] [--max-ngram-order N]
//                     [--sentence-level] [-b] [-w WIDTH]
//
// The options mean what they mean after `sacrebleu`; the output is sacreBLEU's text
// format (`sacrebleu -f text`). Exit codes: 0 success, 1 bad input files, 2 a bad
// command line.
#include <cstdlib>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "common/error.h"
#include "metrics/bleu.h"
#include "tools/tool_main.h"

namespace {

constexpr const char* kUsage =
    "usage: transformer_score REF [REF ...] [-i HYP] [options]\n"
    "\n"
    "Scores the hypothesis (HYP, or standard input) against one or more reference\n"
    "files, one segment per line, with BLEU exactly as sacreBLEU 2.x computes it.\n"
    "\n"
    "  -i, --input HYP            hypothesis file (default: standard input)\n"
    "  -tok, --tokenize NAME      13a (default) | intl | char | none\n"
    "  -lc, --lowercase           lowercase hypothesis and references first\n"
    "  -s, --smooth-method NAME   exp (default) | floor | add-k | none\n"
    "  -sv, --smooth-value V      floor value (default 0.1) or add-k's k (default 1)\n"
    "  --max-ngram-order N        highest n-gram order (default 4)\n"
    "  -sl, --sentence-level      one score per segment (with effective order)\n"
    "  -b, --score-only           print the score alone\n"
    "  -w, --width W              decimals of the score (default 1)\n"
    "  -h, --help                 print this text and exit\n";

struct CommandLine {
  std::vector<std::string> reference_paths;
  std::optional<std::string> hypothesis_path;  // nullopt: standard input
  thpc::metrics::BleuOptions options;
  bool sentence_level = false;
  bool score_only = false;
  int width = 1;
  bool help = false;
};

// The whole argument must be the number: "12x" or "" is an error, not 12 or 0.
template <typename Convert>
auto parse_number(const std::string& option, const std::string& text, Convert convert) {
  size_t used = 0;
  decltype(convert(text, &used)) value{};
  try {
    value = convert(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != text.size()) THPC_FAIL(option << ": '" << text << "' is not a number");
  return value;
}

int parse_int(const std::string& option, const std::string& text) {
  return parse_number(option, text,
                      [](const std::string& t, size_t* used) { return std::stoi(t, used); });
}

double parse_double(const std::string& option, const std::string& text) {
  return parse_number(option, text,
                      [](const std::string& t, size_t* used) { return std::stod(t, used); });
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
    } else if (arg == "-i" || arg == "--input") {
      command.hypothesis_path = value();
    } else if (arg == "-tok" || arg == "--tokenize") {
      command.options.tokenizer = thpc::metrics::parse_tokenizer(value());
    } else if (arg == "-lc" || arg == "--lowercase") {
      command.options.lowercase = true;
    } else if (arg == "-s" || arg == "--smooth-method") {
      command.options.smoothing = thpc::metrics::parse_smoothing(value());
    } else if (arg == "-sv" || arg == "--smooth-value") {
      command.options.smooth_value = parse_double(arg, value());
    } else if (arg == "--max-ngram-order") {
      command.options.max_ngram_order = parse_int(arg, value());
      if (command.options.max_ngram_order < 1) THPC_FAIL(arg << " must be at least 1");
    } else if (arg == "-sl" || arg == "--sentence-level") {
      command.sentence_level = true;
    } else if (arg == "-b" || arg == "--score-only") {
      command.score_only = true;
    } else if (arg == "-w" || arg == "--width") {
      command.width = parse_int(arg, value());
      if (command.width < 0 || command.width > 17) THPC_FAIL(arg << " must be in [0, 17]");
    } else if (arg.size() > 1 && arg[0] == '-') {
      THPC_FAIL("unknown option " << arg);
    } else {
      command.reference_paths.push_back(arg);
    }
  }
  if (!command.help && command.reference_paths.empty()) THPC_FAIL("no reference file given");
  // As sacreBLEU's command line: sentence BLEU averages only the orders a short
  // sentence has, or most sentences would score 0.
  if (command.sentence_level) command.options.effective_order = true;
  return command;
}

std::string format_score(double score, int width) {
  char buffer[64];
  std::snprintf(buffer, sizeof(buffer), "%.*f", width, score);
  return buffer;
}

void print_score(const thpc::metrics::BleuScore& score, const std::string& signature,
                 const CommandLine& command) {
  if (command.score_only) {
    std::cout << format_score(score.score, command.width) << "\n";
  } else {
    std::cout << "BLEU|" << signature << " = " << format_score(score.score, command.width)
              << " " << score.verbose() << "\n";
  }
}

int run(const CommandLine& command) {
  std::vector<std::vector<std::string>> references;
  for (const std::string& path : command.reference_paths) {
    references.push_back(thpc::metrics::read_segments(path));
  }
  const std::string hypothesis_source = command.hypothesis_path.value_or("<stdin>");
  const std::vector<std::string> hypotheses =
      command.hypothesis_path ? thpc::metrics::read_segments(*command.hypothesis_path)
                              : thpc::metrics::read_segments(std::cin, hypothesis_source);
  if (hypotheses.empty()) THPC_FAIL(hypothesis_source << ": no segments");
  for (size_t r = 0; r < references.size(); ++r) {
    if (references[r].size() != hypotheses.size()) {
      THPC_FAIL(command.reference_paths[r] << ": " << references[r].size() << " lines, but "
                                           << hypothesis_source << " has "
                                           << hypotheses.size());
    }
  }
  const thpc::metrics::BleuScorer scorer(references, command.options);
  const std::string signature = scorer.signature();
  if (command.sentence_level) {
    for (size_t i = 0; i < hypotheses.size(); ++i) {
      print_score(scorer.sentence_score(i, hypotheses[i]), signature, command);
    }
  } else {
    print_score(scorer.corpus_score(hypotheses), signature, command);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return thpc::tools::tool_main("transformer_score", kUsage, argc, argv, parse_command_line, run);
}
