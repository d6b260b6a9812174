// transformer_score: corpus or sentence BLEU, chrF and TER exactly as sacreBLEU 2.x
// computes them, or (--tokenize moses | moses-compound) the paper's tokenized BLEU, exactly as
// Moses' tokenizer.perl and multi-bleu.perl compute it (metrics/multi_bleu.h).
//
//   transformer_score REF [REF ...] [-i HYP] [-m bleu|chrf|ter ...]
//                     [--tokenize 13a|intl|char|none] [-lc]
//                     [-s none|floor|add-k|exp] [-sv VALUE] [--max-ngram-order N]
//                     [-cc N] [-cw N] [--chrf-beta N] [--chrf-whitespace]
//                     [--chrf-lowercase] [--chrf-eps-smoothing]
//                     [--ter-case-sensitive] [--ter-normalized] [--ter-no-punct]
//                     [--ter-asian-support]
//                     [--sentence-level] [-b] [-w WIDTH]
//   transformer_score REF [REF ...] [-i HYP] --tokenize moses|moses-compound
//                     [--moses-lang de|fr] [--moses-version current|2017] [-b] [-w WIDTH]
//
// The options mean what they mean after `sacrebleu`; the output is sacreBLEU's text
// format (`sacrebleu -f text`), or multi-bleu.perl's line. Exit codes: 0 success, 1 bad
// input files, 2 a bad command line.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "checkpoint/output_file.h"
#include "common/error.h"
#include "common/input_file.h"
#include "metrics/bleu.h"
#include "metrics/chrf.h"
#include "metrics/multi_bleu.h"
#include "metrics/ter.h"
#include "tools/tool_main.h"

namespace {

namespace po = boost::program_options;

// The most decimals -w prints (see where it is checked).
constexpr int kWidestScore = 10000;

constexpr const char* kUsageHead =
    "usage: transformer_score REF [REF ...] [-i HYP] [options]\n"
    "\n"
    "Scores the hypothesis (HYP, or standard input) against one or more reference\n"
    "files, one segment per line, with BLEU, chrF and TER exactly as sacreBLEU 2.x\n"
    "computes them, or with the paper's tokenized BLEU (--tokenize moses-compound). A file\n"
    "named - is standard input (HYP or one REF); a gzip-compressed file, which\n"
    "sacreBLEU opens itself, is refused (give it as - : zcat F.gz | ...). Options\n"
    "are sacreBLEU's, spelt as after `sacrebleu` (-tok, -lc, -sv, -cc ... or their\n"
    "long names)";

struct CommandLine {
  std::vector<std::string> reference_paths;
  std::optional<std::string> hypothesis_path;  // nullopt: standard input
  thpc::metrics::BleuOptions options;
  // -m: sacreBLEU's metric names, each once, in sacreBLEU's order of printing (by name).
  std::vector<std::string> metrics = {"bleu"};
  thpc::metrics::ChrfOptions chrf;
  thpc::metrics::TerOptions ter;
  bool sentence_level = false;
  bool score_only = false;
  std::optional<int> width;  // nullopt: 1, or multi-bleu.perl's 2 with a moses tokenizer
  bool help = false;
  // --tokenize moses | moses-compound: multi-bleu.perl instead of sacreBLEU's BLEU.
  std::optional<thpc::metrics::MosesBleuOptions> moses;
};

// The command line as Boost reads it, before it is checked and turned into a CommandLine.
struct Given {
  std::vector<std::string> references;
  std::string input;
  std::vector<std::string> metrics = {"bleu"};
  std::string tokenize = "13a";
  std::string moses_lang = "de";
  std::string moses_version = "current";
  std::string smooth_method = "exp";
  std::string format = "text";
  double smooth_value = 0;
  int width = 1;
  CommandLine command;  // the switches and chrF's numbers are bound here directly
};

// The options --help shows, and with `with_references` the positional REF too.
po::options_description describe(Given& given, bool with_references) {
  CommandLine& command = given.command;
  po::options_description general(kUsageHead);
  general.add_options()
      ("input,i", po::value(&given.input), "hypothesis file (default, or -: standard input)")
      ("metrics,metric,m", po::value(&given.metrics)->multitoken(),
       "bleu (default) | chrf | ter, one line each: the names up to the next option")
      ("sentence-level,sl", po::bool_switch(&command.sentence_level),
       "(also -sl) one score per segment (with effective order)")
      ("score-only,b", po::bool_switch(&command.score_only), "print the score alone")
      ("width,w", po::value(&given.width), "decimals of the score (default 1; moses: 2)")
      ("format,f", po::value(&given.format),
       "text, the only one: sacreBLEU's -f text, taken so that its command lines run here")
      ("help,h", "print this text and exit")(
      "version", "print the git commit the program was built from and exit");
  po::options_description bleu("BLEU");
  bleu.add_options()
      ("tokenize,tok", po::value(&given.tokenize),
       "(also -tok) 13a (default) | intl | char | none, or the paper's tokenized BLEU: moses (Moses "
       "tokenizer.perl, then multi-bleu.perl) | moses-compound (the same with "
       "tensor2tensor's ##AT## compound splitting: the BLEU of the paper's EN-DE 27.3, "
       "get_ende_bleu.sh)")
      ("moses-lang", po::value(&given.moses_lang), "tokenizer.perl -l LANG: de (default) | fr")
      ("moses-version", po::value(&given.moses_version),
       "current (default: mosesdecoder since 2018-11) | 2017 (before: a final abbreviation "
       "keeps its period)")
      ("lowercase,lc", po::bool_switch(&command.options.lowercase),
       "(also -lc) lowercase hypothesis and references first")
      ("smooth-method,s", po::value(&given.smooth_method), "exp (default) | floor | add-k | none")
      ("smooth-value,sv", po::value(&given.smooth_value),
       "(also -sv) floor value (default 0.1) or add-k's k (default 1)")
      ("max-ngram-order", po::value(&command.options.max_ngram_order),
       "highest n-gram order (default 4)");
  po::options_description chrf(
      "chrF (default chrF2: character n-grams up to 6, no word n-grams, beta 2)");
  chrf.add_options()
      ("chrf-char-order,cc", po::value(&command.chrf.char_order),
       "(also -cc) highest character n-gram order (default 6)")
      ("chrf-word-order,cw", po::value(&command.chrf.word_order),
       "(also -cw) highest word n-gram order (default 0; 2 = chrF++)")
      ("chrf-beta", po::value(&command.chrf.beta), "weight of recall against precision (default 2)")
      ("chrf-whitespace", po::bool_switch(&command.chrf.whitespace),
       "keep whitespace in character n-grams")
      ("chrf-lowercase", po::bool_switch(&command.chrf.lowercase),
       "lowercase hypothesis and references first")
      ("chrf-eps-smoothing", po::bool_switch(&command.chrf.eps_smoothing),
       "average each order's F (chrF++.py) instead of averaging precision and recall over "
       "effective orders");
  po::options_description ter(
      "TER (Tercom's defaults: lowercased, not normalized, punctuation kept; lower is "
      "better)");
  ter.add_options()
      ("ter-case-sensitive", po::bool_switch(&command.ter.case_sensitive),
       "do not lowercase hypothesis and references")
      ("ter-normalized", po::bool_switch(&command.ter.normalized),
       "Tercom's normalization first: punctuation split off, possessives, HTML escapes")
      ("ter-no-punct", po::bool_switch(&command.ter.no_punct),
       "remove the punctuation . , ? : ; ! \" ( )")
      ("ter-asian-support", po::bool_switch(&command.ter.asian_support),
       "with --ter-normalized, CJK split into characters; with --ter-no-punct, CJK and "
       "full-width punctuation removed too");
  po::options_description all;
  all.add(general).add(bleu).add(chrf).add(ter);
  if (with_references) all.add_options()("references", po::value(&given.references));
  return all;
}

std::string usage() {
  Given given;
  std::string text = thpc::tools::usage_text(describe(given, /*with_references=*/false));
  // The groups' unnamed parent prints an empty caption line first; the other tools start
  // with their usage line.
  if (!text.empty() && text.front() == '\n') text.erase(text.begin());
  return text;
}

CommandLine parse_command_line(int argc, char** argv) {
  // sacreBLEU's -sh (--short) would read as -s h, "unknown smoothing method 'h'".
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) == "-sh") {
      THPC_FAIL("-sh (sacreBLEU's --short signature) is not an option here: the signature "
                "is always printed whole");
    }
  }
  Given given;
  po::positional_options_description positional;
  positional.add("references", -1);
  const po::variables_map values = thpc::tools::parse_options(
      describe(given, /*with_references=*/true), argc, argv, positional, thpc::tools::kSingleDashLongNames);
  CommandLine command = given.command;
  command.help = values.count("help") > 0;
  if (command.help) return command;
  const auto given_option = [&](const char* name) {
    return values.count(name) > 0 && !values[name].defaulted();
  };
  command.reference_paths = given.references;
  if (command.reference_paths.empty()) THPC_FAIL("no reference file given");
  // sacreBLEU's -i takes several systems (nargs='+') and scores each; here the second was a
  // positional argument, a reference, and SYS1 scored against the reference and SYS2
  // (59.0 for two systems of 28.3 and 26.7, exit 0).
  for (int i = 1; i + 2 < argc; ++i) {
    const std::string option = argv[i], after = argv[i + 2];
    if ((option == "-i" || option == "--input") && !after.empty() && after[0] != '-') {
      THPC_FAIL("-i takes one system here: " << after << ", after -i " << argv[i + 1]
                << ", would be read as a reference (sacreBLEU scores every system after -i; "
                << "run transformer_score once per system, references before -i)");
    }
  }
  // "-" is standard input, as decode, evalb and trees read it (sacreBLEU takes a file of
  // that name: "-: no such file" here before); one of the files only.
  if (given_option("input") && given.input != "-") command.hypothesis_path = given.input;
  const auto standard_inputs = std::count(command.reference_paths.begin(),
                                          command.reference_paths.end(), std::string("-")) +
                               (command.hypothesis_path ? 0 : 1);
  if (standard_inputs > 1) {
    THPC_FAIL("standard input can be one file only: the system's (no -i, or -i -) or one "
              "reference's (-, with -i FILE)");
  }
  // `>> ref.txt` appended the score to the reference, exit 0; the next scoring failed.
  std::vector<std::string> inputs = command.reference_paths;
  inputs.push_back(command.hypothesis_path.value_or("-"));
  if (const std::string input = thpc::input_standard_output_is(inputs); !input.empty()) {
    THPC_FAIL("standard output is the file of the input " << input << ": writing the score "
              "there would change it; redirect the output to another file");
  }
  // sacreBLEU's -m takes one name or more (nargs='+'); each is printed once, by name.
  command.metrics = given.metrics;
  for (const std::string& name : command.metrics) {
    if (name != "bleu" && name != "chrf" && name != "ter") {
      THPC_FAIL("unknown metric '" << name << "' (expected bleu | chrf | ter)");
    }
  }
  std::sort(command.metrics.begin(), command.metrics.end());
  command.metrics.erase(std::unique(command.metrics.begin(), command.metrics.end()),
                        command.metrics.end());
  if (given_option("width")) {
    // sacreBLEU formats with Python's f"{score:.{width}f}", which takes any width and
    // writes the double's exact decimal expansion, as glibc's printf does. Past 1,074
    // decimals (the longest expansion a double has) only zeros follow; the cap keeps a
    // mistyped width from asking for gigabytes.
    if (given.width < 0 || given.width > kWidestScore) {
      THPC_FAIL("-w/--width " << given.width << " is not in [0, " << kWidestScore
                << "] (the number of decimals of the score)");
    }
    command.width = given.width;
  }
  if (command.options.max_ngram_order < 1 ||
      command.options.max_ngram_order > thpc::metrics::kHighestNgramOrder) {
    THPC_FAIL("--max-ngram-order " << command.options.max_ngram_order << " is not in [1, "
              << thpc::metrics::kHighestNgramOrder
              << "] (BLEU uses 4; every line's statistics hold each order)");
  }
  // sacreBLEU's JSON (its default) is not written here: its text is (-f text).
  if (given.format != "text") {
    THPC_FAIL("-f " << given.format << ": this program writes sacreBLEU's text format alone "
              "(-f text); drop -f, or score with sacrebleu for " << given.format);
  }
  command.options.smoothing = thpc::metrics::parse_smoothing(given.smooth_method);
  if (given_option("smooth-value")) {
    // inf or nan made every BLEU nan, with exit 0.
    if (!std::isfinite(given.smooth_value) || given.smooth_value < 0) {
      THPC_FAIL("-sv (--smooth-value) must be a finite number >= 0 (the floor value, or "
                "add-k's k), not " << given.smooth_value);
    }
    command.options.smooth_value = given.smooth_value;
  }

  if (given.tokenize == "moses" || given.tokenize == "moses-compound") {
    // multi-bleu.perl has none of sacreBLEU's BLEU options: refuse them, by sacreBLEU's
    // spelling, rather than print a score they did not change.
    for (const auto& [name, spelling] : std::vector<std::pair<const char*, const char*>>{
             {"lowercase", "-lc"}, {"smooth-method", "-s"}, {"smooth-value", "-sv"},
             {"max-ngram-order", "--max-ngram-order"}, {"sentence-level", "-sl"}}) {
      if (given_option(name)) {
        THPC_FAIL(spelling
                  << " is not an option of multi-bleu.perl (--tokenize moses or moses-compound)");
      }
    }
    if (command.metrics != std::vector<std::string>{"bleu"}) {
      THPC_FAIL("-m: multi-bleu.perl (--tokenize moses or moses-compound) scores BLEU only");
    }
    // Its line is multi-bleu.perl's own, two decimals: -w changed nothing there.
    if (given_option("width") && !command.score_only) {
      THPC_FAIL("-w sets the decimals of the score alone (-b) with --tokenize moses or "
                "moses-compound: multi-bleu.perl's line has two; give -b -w N");
    }
    thpc::metrics::MosesBleuOptions& moses = command.moses.emplace();
    moses.split_compounds = given.tokenize == "moses-compound";
    moses.tokenizer.language = thpc::metrics::parse_moses_language(given.moses_lang);
    moses.tokenizer.version = thpc::metrics::parse_moses_version(given.moses_version);
  } else {
    // parse_tokenizer's message names sacreBLEU's four; this tool also takes the two
    // multi-bleu.perl ones above.
    try {
      command.options.tokenizer = thpc::metrics::parse_tokenizer(given.tokenize);
    } catch (const thpc::Error&) {
      THPC_FAIL("-tok (--tokenize): unknown tokenizer '"
                << given.tokenize << "' (expected 13a | intl | char | none, or moses | "
                << "moses-compound for the paper's tokenized BLEU)");
    }
    for (const char* name : {"moses-lang", "moses-version"}) {
      if (given_option(name)) THPC_FAIL("--" << name << " needs --tokenize moses or moses-compound");
    }
  }
  // As sacreBLEU's command line: sentence BLEU averages only the orders a short
  // sentence has, or most sentences would score 0.
  if (command.sentence_level) command.options.effective_order = true;
  if (command.sentence_level && command.metrics.size() > 1) {
    THPC_FAIL("--sentence-level scores one metric, not " << command.metrics.size());
  }
  // Whatever the metric: -cw -1 was refused with -m chrf and taken with the default -m
  // bleu, exit 0 (a helper's trial).
  thpc::metrics::check_chrf_options(command.chrf);
  return command;
}

std::string format_score(double score, int width) {
  std::string text(std::snprintf(nullptr, 0, "%.*f", width, score) + 1, '\0');
  text.resize(std::snprintf(text.data(), text.size(), "%.*f", width, score));
  return text;
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

// Why `segments`, read from `source`, may number fewer lines than were meant: lines ended
// by a carriage return alone (classic Mac OS text) read as one line, as sacreBLEU reads
// them. Said after a count that differs, in the words transformer_decode and
// transformer_preprocess refuse such a file in; "" for none.
std::string carriage_return_hint(const std::string& source,
                                 const std::vector<std::string>& segments) {
  int64_t carriage_returns = 0;
  for (const std::string& segment : segments) {
    carriage_returns += std::count(segment.begin(), segment.end(), '\r');
  }
  const std::string problem = thpc::carriage_return_lines_problem(
      source, carriage_returns, static_cast<int64_t>(segments.size()));
  return problem.empty() ? std::string() : "; " + problem + thpc::kCarriageReturnAdvice;
}

int run(const CommandLine& command) {
  // A closed standard input read as an empty one ("<stdin>: no segments", a helper's trial).
  const bool reads_standard_input =
      !command.hypothesis_path ||
      std::count(command.reference_paths.begin(), command.reference_paths.end(), "-") > 0;
  if (const std::string why = thpc::standard_input_unreadable();
      reads_standard_input && !why.empty()) {
    THPC_FAIL("standard input is " << why << ": give the hypotheses on it or with -i FILE");
  }
  std::vector<std::vector<std::string>> references;
  for (const std::string& path : command.reference_paths) {
    references.push_back(path == "-" ? read_text(command, std::cin, "<stdin>")
                                     : read_text(command, path));
  }
  const std::string hypothesis_source = command.hypothesis_path.value_or("<stdin>");
  const std::vector<std::string> hypotheses =
      command.hypothesis_path ? read_text(command, *command.hypothesis_path)
                              : read_text(command, std::cin, hypothesis_source);
  if (hypotheses.empty()) THPC_FAIL(hypothesis_source << ": no segments");
  for (size_t r = 0; r < references.size(); ++r) {
    if (references[r].size() != hypotheses.size()) {
      THPC_FAIL(command.reference_paths[r] << ": " << references[r].size()
                                           << (references[r].size() == 1 ? " line" : " lines")
                                           << ", but "
                                           << hypothesis_source << " has "
                                           << hypotheses.size()
                                           << carriage_return_hint(command.reference_paths[r],
                                                                   references[r])
                                           << carriage_return_hint(hypothesis_source,
                                                                   hypotheses));
    }
  }
  if (command.moses) {
    print_multi_bleu(hypotheses, references, command);
    return 0;
  }
  std::optional<thpc::metrics::BleuScorer> bleu;
  std::optional<thpc::metrics::ChrfScorer> chrf;
  std::optional<thpc::metrics::TerScorer> ter;
  for (const std::string& metric : command.metrics) {
    if (metric == "bleu") bleu.emplace(references, command.options);
    if (metric == "chrf") chrf.emplace(references, command.chrf);
    if (metric == "ter") ter.emplace(references, command.ter);
  }
  // The line of one metric for segment `segment`, or for the corpus (nullopt).
  const auto line = [&](const std::string& metric, std::optional<size_t> segment) {
    if (metric == "bleu") {
      const thpc::metrics::BleuScore score =
          segment ? bleu->sentence_score(*segment, hypotheses[*segment])
                  : bleu->corpus_score(hypotheses);
      return score_line("BLEU", bleu->signature(), score.score, score.verbose(), command);
    }
    if (metric == "ter") {
      const double score = segment ? ter->sentence_score(*segment, hypotheses[*segment])
                                   : ter->corpus_score(hypotheses);
      return score_line("TER", ter->signature(), score, "", command);
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
  return thpc::tools::tool_main("transformer_score", usage(), argc, argv, parse_command_line, run);
}
