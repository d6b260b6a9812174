// transformer_score: corpus or sentence BLEU and chrF exactly as sacreBLEU 2.x computes
// them, or (--tokenize moses | moses-compound) the paper's tokenized BLEU, exactly as
// Moses' tokenizer.perl and multi-bleu.perl compute it (metrics/multi_bleu.h).
//
//   transformer_score REF [REF ...] [-i HYP] [-m bleu|chrf ...]
//                     [--tokenize 13a|intl|char|none] [-lc]
//                     [-s none|floor|add-k|exp] [-sv VALUE] [--max-ngram-order N]
//                     [-cc N] [-cw N] [--chrf-beta N] [--chrf-whitespace]
//                     [--chrf-lowercase] [--chrf-eps-smoothing]
//                     [--sentence-level] [-b] [-w WIDTH]
//   transformer_score REF [REF ...] [-i HYP] --tokenize moses|moses-compound
//                     [--moses-lang de|fr] [--moses-version current|2017] [-b] [-w WIDTH]
//
// The options mean what they mean after `sacrebleu`; the output is sacreBLEU's text
// format (`sacrebleu -f text`), or multi-bleu.perl's line. Exit codes: 0 success, 1 bad
// input files, 2 a bad command line.
#include <algorithm>
#include <cstdlib>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "common/error.h"
#include "metrics/bleu.h"
#include "metrics/chrf.h"
#include "metrics/multi_bleu.h"
#include "tools/tool_main.h"

namespace {

constexpr const char* kUsage =
    "usage: transformer_score REF [REF ...] [-i HYP] [options]\n"
    "\n"
    "Scores the hypothesis (HYP, or standard input) against one or more reference\n"
    "files, one segment per line, with BLEU and chrF exactly as sacreBLEU 2.x computes\n"
    "them.\n"
    "\n"
    "  -i, --input HYP            hypothesis file (default: standard input)\n"
    "  -m, --metrics NAME ...     bleu (default) | chrf, one line each\n"
    "\n"
    "BLEU:\n"
    "  -tok, --tokenize NAME      13a (default) | intl | char | none, or the paper's\n"
    "                             tokenized BLEU: moses (Moses tokenizer.perl, then\n"
    "                             multi-bleu.perl) | moses-compound (the same with\n"
    "                             tensor2tensor's ##AT## compound splitting: the BLEU of\n"
    "                             the paper's EN-DE 27.3, get_ende_bleu.sh)\n"
    "  --moses-lang LANG          tokenizer.perl -l LANG: de (default) | fr\n"
    "  --moses-version V          current (default: mosesdecoder since 2018-11) | 2017\n"
    "                             (before: a final abbreviation keeps its period)\n"
    "  -lc, --lowercase           lowercase hypothesis and references first\n"
    "  -s, --smooth-method NAME   exp (default) | floor | add-k | none\n"
    "  -sv, --smooth-value V      floor value (default 0.1) or add-k's k (default 1)\n"
    "  --max-ngram-order N        highest n-gram order (default 4)\n"
    "\n"
    "chrF (default chrF2: character n-grams up to 6, no word n-grams, beta 2):\n"
    "  -cc, --chrf-char-order N   highest character n-gram order (default 6)\n"
    "  -cw, --chrf-word-order N   highest word n-gram order (default 0; 2 = chrF++)\n"
    "  --chrf-beta N              weight of recall against precision (default 2)\n"
    "  --chrf-whitespace          keep whitespace in character n-grams\n"
    "  --chrf-lowercase           lowercase hypothesis and references first\n"
    "  --chrf-eps-smoothing       average each order's F (chrF++.py) instead of\n"
    "                             averaging precision and recall over effective orders\n"
    "\n"
    "  -sl, --sentence-level      one score per segment (with effective order)\n"
    "  -b, --score-only           print the score alone\n"
    "  -w, --width W              decimals of the score (default 1; moses: 2)\n"
    "  -h, --help                 print this text and exit\n";

struct CommandLine {
  std::vector<std::string> reference_paths;
  std::optional<std::string> hypothesis_path;  // nullopt: standard input
  thpc::metrics::BleuOptions options;
  // -m: sacreBLEU's metric names, each once, in sacreBLEU's order of printing (by name).
  std::vector<std::string> metrics = {"bleu"};
  thpc::metrics::ChrfOptions chrf;
  bool sentence_level = false;
  bool score_only = false;
  std::optional<int> width;  // nullopt: 1, or multi-bleu.perl's 2 with a moses tokenizer
  bool help = false;
  // --tokenize moses | moses-compound: multi-bleu.perl instead of sacreBLEU's BLEU.
  std::optional<thpc::metrics::MosesBleuOptions> moses;
  std::vector<std::string> sacrebleu_only;  // options given that multi-bleu.perl lacks
  std::vector<std::string> moses_only;      // --moses-* options given
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
  thpc::metrics::MosesTokenizerOptions moses_tokenizer;
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
    } else if (arg == "-m" || arg == "--metrics" || arg == "--metric") {
      // One name or more, up to the next option (sacreBLEU's nargs='+').
      command.metrics.clear();
      while (i + 1 < argc && argv[i + 1][0] != '-') {
        const std::string name = argv[++i];
        if (name != "bleu" && name != "chrf") {
          THPC_FAIL("unknown metric '" << name << "' (expected bleu | chrf)");
        }
        command.metrics.push_back(name);
      }
      if (command.metrics.empty()) THPC_FAIL(arg << " needs a metric name (bleu | chrf)");
      std::sort(command.metrics.begin(), command.metrics.end());
      command.metrics.erase(std::unique(command.metrics.begin(), command.metrics.end()),
                            command.metrics.end());
    } else if (arg == "-cc" || arg == "--chrf-char-order") {
      command.chrf.char_order = parse_int(arg, value());
    } else if (arg == "-cw" || arg == "--chrf-word-order") {
      command.chrf.word_order = parse_int(arg, value());
    } else if (arg == "--chrf-beta") {
      command.chrf.beta = parse_int(arg, value());
    } else if (arg == "--chrf-whitespace") {
      command.chrf.whitespace = true;
    } else if (arg == "--chrf-lowercase") {
      command.chrf.lowercase = true;
    } else if (arg == "--chrf-eps-smoothing") {
      command.chrf.eps_smoothing = true;
    } else if (arg == "-tok" || arg == "--tokenize") {
      const std::string name = value();
      if (name == "moses" || name == "moses-compound") {
        command.moses.emplace().split_compounds = name == "moses-compound";
      } else {
        command.options.tokenizer = thpc::metrics::parse_tokenizer(name);
        command.moses.reset();
      }
    } else if (arg == "--moses-lang") {
      moses_tokenizer.language = thpc::metrics::parse_moses_language(value());
      command.moses_only.push_back(arg);
    } else if (arg == "--moses-version") {
      moses_tokenizer.version = thpc::metrics::parse_moses_version(value());
      command.moses_only.push_back(arg);
    } else if (arg == "-lc" || arg == "--lowercase") {
      command.options.lowercase = true;
      command.sacrebleu_only.push_back(arg);
    } else if (arg == "-s" || arg == "--smooth-method") {
      command.options.smoothing = thpc::metrics::parse_smoothing(value());
      command.sacrebleu_only.push_back(arg);
    } else if (arg == "-sv" || arg == "--smooth-value") {
      command.options.smooth_value = parse_double(arg, value());
      command.sacrebleu_only.push_back(arg);
    } else if (arg == "--max-ngram-order") {
      command.options.max_ngram_order = parse_int(arg, value());
      if (command.options.max_ngram_order < 1) THPC_FAIL(arg << " must be at least 1");
      command.sacrebleu_only.push_back(arg);
    } else if (arg == "-sl" || arg == "--sentence-level") {
      command.sentence_level = true;
      command.sacrebleu_only.push_back(arg);
    } else if (arg == "-b" || arg == "--score-only") {
      command.score_only = true;
    } else if (arg == "-w" || arg == "--width") {
      command.width = parse_int(arg, value());
      if (*command.width < 0 || *command.width > 17) THPC_FAIL(arg << " must be in [0, 17]");
    } else if (arg.size() > 1 && arg[0] == '-') {
      THPC_FAIL("unknown option " << arg);
    } else {
      command.reference_paths.push_back(arg);
    }
  }
  if (!command.help && command.reference_paths.empty()) THPC_FAIL("no reference file given");
  if (command.moses) {
    command.moses->tokenizer = moses_tokenizer;
    if (!command.sacrebleu_only.empty()) {
      THPC_FAIL(command.sacrebleu_only.front()
                << " is not an option of multi-bleu.perl (--tokenize moses or moses-compound)");
    }
    if (command.metrics != std::vector<std::string>{"bleu"}) {
      THPC_FAIL("-m: multi-bleu.perl (--tokenize moses or moses-compound) scores BLEU only");
    }
  } else if (!command.moses_only.empty()) {
    THPC_FAIL(command.moses_only.front() << " needs --tokenize moses or moses-compound");
  }
  // As sacreBLEU's command line: sentence BLEU averages only the orders a short
  // sentence has, or most sentences would score 0.
  if (command.sentence_level) command.options.effective_order = true;
  if (command.sentence_level && command.metrics.size() > 1) {
    THPC_FAIL("--sentence-level scores one metric, not " << command.metrics.size());
  }
  if (std::count(command.metrics.begin(), command.metrics.end(), "chrf") > 0) {
    thpc::metrics::check_chrf_options(command.chrf);
  }
  return command;
}

std::string format_score(double score, int width) {
  char buffer[64];
  std::snprintf(buffer, sizeof(buffer), "%.*f", width, score);
  return buffer;
}

// One line of sacreBLEU's text output: "NAME|SIGNATURE = SCORE[ VERBOSE]", or with -b the
// score alone.
std::string score_line(const std::string& name, const std::string& signature, double score,
                       const std::string& verbose, const CommandLine& command) {
  const int width = command.width.value_or(1);
  if (command.score_only) return format_score(score, width);
  std::string line = name + "|" + signature + " = " + format_score(score, width);
  if (!verbose.empty()) line += " " + verbose;
  return line;
}

// The lines of several metrics, as sacreBLEU prints them: right-aligned at their " = "
// (a -b score has none and is printed as it is).
void print_lines(const std::vector<std::string>& lines) {
  size_t width = 0;
  for (const std::string& line : lines) {
    const size_t equals = line.find(" = ");
    if (equals != std::string::npos) width = std::max(width, equals);
  }
  for (const std::string& line : lines) {
    const size_t equals = line.find(" = ");
    const size_t pad = equals == std::string::npos ? 0 : width - equals;
    std::cout << std::string(pad, ' ') << line << "\n";
  }
}

// The segments of a file as the chosen scorer reads them: as sacreBLEU does (trailing
// whitespace removed), or for multi-bleu.perl (--tokenize moses...) as Perl does, the
// lines as they are.
std::vector<std::string> read_text(const CommandLine& command, const std::string& path) {
  return command.moses ? thpc::metrics::read_lines(path) : thpc::metrics::read_segments(path);
}
std::vector<std::string> read_text(const CommandLine& command, std::istream& in,
                                   const std::string& source) {
  return command.moses ? thpc::metrics::read_lines(in, source)
                       : thpc::metrics::read_segments(in, source);
}

// --tokenize moses or moses-compound: multi-bleu.perl's line.
void print_multi_bleu(const std::vector<std::string>& hypotheses,
                      const std::vector<std::vector<std::string>>& references,
                      const CommandLine& command) {
  const thpc::metrics::MultiBleuScore score =
      thpc::metrics::moses_bleu(hypotheses, references, *command.moses);
  if (command.score_only) {
    std::cout << format_score(score.score(), command.width.value_or(2)) << "\n";
  } else {
    std::cout << score.line() << "\n";
  }
}

int run(const CommandLine& command) {
  std::vector<std::vector<std::string>> references;
  for (const std::string& path : command.reference_paths) {
    references.push_back(read_text(command, path));
  }
  const std::string hypothesis_source = command.hypothesis_path.value_or("<stdin>");
  const std::vector<std::string> hypotheses =
      command.hypothesis_path ? read_text(command, *command.hypothesis_path)
                              : read_text(command, std::cin, hypothesis_source);
  if (hypotheses.empty()) THPC_FAIL(hypothesis_source << ": no segments");
  for (size_t r = 0; r < references.size(); ++r) {
    if (references[r].size() != hypotheses.size()) {
      THPC_FAIL(command.reference_paths[r] << ": " << references[r].size() << " lines, but "
                                           << hypothesis_source << " has "
                                           << hypotheses.size());
    }
  }
  if (command.moses) {
    print_multi_bleu(hypotheses, references, command);
    return 0;
  }
  std::optional<thpc::metrics::BleuScorer> bleu;
  std::optional<thpc::metrics::ChrfScorer> chrf;
  for (const std::string& metric : command.metrics) {
    if (metric == "bleu") bleu.emplace(references, command.options);
    if (metric == "chrf") chrf.emplace(references, command.chrf);
  }
  // The line of one metric for segment `segment`, or for the corpus (nullopt).
  const auto line = [&](const std::string& metric, std::optional<size_t> segment) {
    if (metric == "bleu") {
      const thpc::metrics::BleuScore score =
          segment ? bleu->sentence_score(*segment, hypotheses[*segment])
                  : bleu->corpus_score(hypotheses);
      return score_line("BLEU", bleu->signature(), score.score, score.verbose(), command);
    }
    const double score = segment ? chrf->sentence_score(*segment, hypotheses[*segment])
                                 : chrf->corpus_score(hypotheses);
    return score_line(chrf->name(), chrf->signature(), score, "", command);
  };
  if (command.sentence_level) {
    // One metric (parse_command_line checked): one line per segment.
    for (size_t i = 0; i < hypotheses.size(); ++i) {
      std::cout << line(command.metrics.front(), i) << "\n";
    }
  } else {
    std::vector<std::string> lines;
    for (const std::string& metric : command.metrics) lines.push_back(line(metric, std::nullopt));
    print_lines(lines);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return thpc::tools::tool_main("transformer_score", kUsage, argc, argv, parse_command_line, run);
}
