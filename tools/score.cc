// transformer_score: corpus or sentence BLEU, chrF and TER exactly as sacreBLEU 2.x
// computes them, or (--tokenize moses | moses-compound) the paper's tokenized BLEU, exactly as
// Moses' tokenizer.perl and multi-bleu.perl compute it (metrics/multi_bleu.h).
//
//   transformer_score REF [REF ...] [-i HYP] [-m bleu|chrf|ter ...]
//                     [--tokenize 13a|intl|char|none|zh|flores101|flores200|spBLEU-1K]
//                     [-lc]
//                     [-s none|floor|add-k|exp] [-sv VALUE] [--max-ngram-order N]
//                     [-cc N] [-cw N] [--chrf-beta N] [--chrf-whitespace]
//                     [--chrf-lowercase] [--chrf-eps-smoothing]
//                     [--ter-case-sensitive] [--ter-normalized] [--ter-no-punct]
//                     [--ter-asian-support]
//                     [--sentence-level] [-b] [-w WIDTH] [--confidence [--confidence-n N]]
//   transformer_score REF [REF ...] -i SYS1 SYS2 [SYS ...] [metric options]
//                     [--paired-bs [--paired-bs-n N] | --paired-ar [--paired-ar-n N]]
//   transformer_score REF [REF ...] [-i HYP] --tokenize moses|moses-compound
//                     [--moses-lang de|fr] [--moses-version current|2017] [-b] [-w WIDTH]
//
// The options mean what they mean after `sacrebleu`; the output is sacreBLEU's text
// format (`sacrebleu -f text`: for several systems its table), or multi-bleu.perl's line.
// Intervals and paired tests draw NumPy's samples as sacreBLEU does
// (metrics/significance.h). Exit codes: 0 success, 1 bad input files, 2 a bad command line.
#include <algorithm>
#include <cmath>
#include <cctype>
#include <cstdlib>
#include <iostream>
#include <iterator>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "checkpoint/output_file.h"
#include "common/error.h"
#include "common/input_file.h"
#include "data/sentencepiece_vocabulary.h"
#include "metrics/bleu.h"
#include "metrics/chrf.h"
#include "metrics/json_text.h"
#include "metrics/multi_bleu.h"
#include "metrics/sentencepiece_tokenizer.h"
#include "metrics/significance.h"
#include "metrics/ter.h"
#include "metrics/text_table.h"
#include "tools/tool_main.h"

namespace {

namespace po = boost::program_options;

// The most decimals -w prints (see where it is checked).
constexpr int kWidestScore = 10000;
// The most bootstrap samples or randomization trials: each is a pass over the corpus, and
// a million trials of a 3,000-line test set hold 375 MB of coin flips.
constexpr int64_t kMostSamples = 1000000;

constexpr const char* kUsageHead =
    "usage: transformer_score REF [REF ...] [-i HYP] [options]\n"
    "\n"
    "Scores the hypothesis (HYP, or standard input) against one or more reference\n"
    "files, one segment per line, with BLEU, chrF and TER exactly as sacreBLEU 2.x\n"
    "computes them, or with the paper's tokenized BLEU (--tokenize moses-compound).\n"
    "Several systems after -i (or without -i, standard input's tab-separated columns)\n"
    "are scored in one table, and --paired-bs or --paired-ar compares them with the\n"
    "first (the baseline), with sacreBLEU's samples. A file\n"
    "named - is standard input (HYP or one REF); a gzip-compressed file, which\n"
    "sacreBLEU opens itself, is refused (give it as - : zcat F.gz | ...). Options\n"
    "are sacreBLEU's, spelt as after `sacrebleu` (-tok, -lc, -sv, -cc ... or their\n"
    "long names)";

struct CommandLine {
  std::vector<std::string> reference_paths;
  std::optional<std::string> hypothesis_path;  // nullopt: standard input
  // -i SYS1 SYS2 ...: every system after the first (the one hypothesis_path names), each
  // once; "-" is standard input.
  std::vector<std::string> more_systems;
  // No -i: standard input's lines, each line's tab-separated fields a system each
  // (sacreBLEU's way of giving several systems without files).
  bool systems_in_columns = false;
  thpc::metrics::BleuOptions options;
  // -m: sacreBLEU's metric names, each once, in sacreBLEU's order of printing (by name).
  std::vector<std::string> metrics = {"bleu"};
  // ... and in the order given (first mention): the columns of a paired test's table.
  std::vector<std::string> metrics_as_given = {"bleu"};
  thpc::metrics::ChrfOptions chrf;
  thpc::metrics::TerOptions ter;
  bool sentence_level = false;
  bool score_only = false;
  bool json = false;   // -f json: sacreBLEU's JSON instead of its text
  bool latex = false;  // -f latex: several systems' table as LaTeX (one system: text)
  std::optional<int> width;  // nullopt: 1, or multi-bleu.perl's 2 with a moses tokenizer
  bool help = false;
  bool quiet = false;  // -q: no note on standard error (sacreBLEU's -q logs nothing)
  // --tokenize moses | moses-compound: multi-bleu.perl instead of sacreBLEU's BLEU.
  std::optional<thpc::metrics::MosesBleuOptions> moses;
  bool confidence = false;  // --confidence given, whatever --confidence-n
  // --confidence: bootstrap samples of one system's interval (1: none, as sacreBLEU).
  std::optional<int64_t> confidence_samples;
  std::optional<thpc::metrics::PairedTest> paired_test;
  int64_t paired_samples = 0;  // --paired-bs-n or --paired-ar-n (0 or less: the default)
  int64_t paired_samples_given = 0;  // as given: the heading above the table says it
};

// The command line as Boost reads it, before it is checked and turned into a CommandLine.
struct Given {
  std::vector<std::string> references;
  std::vector<std::string> inputs;
  std::vector<std::string> metrics = {"bleu"};
  std::string tokenize = "13a";
  std::string moses_lang = "de";
  std::string moses_version = "current";
  std::string smooth_method = "exp";
  std::string format = "text";
  double smooth_value = 0;
  int width = 1;
  bool confidence = false;
  int64_t confidence_n = 1000;
  bool paired_bs = false;
  bool paired_ar = false;
  int64_t paired_bs_n = 1000;
  int64_t paired_ar_n = 10000;
  int paired_jobs = 1;
  CommandLine command;  // the switches and chrF's numbers are bound here directly
};

// The options --help shows, and with `with_references` the positional REF too.
po::options_description describe(Given& given, bool with_references) {
  CommandLine& command = given.command;
  po::options_description general(kUsageHead);
  general.add_options()
      ("input,i", po::value(&given.inputs)->multitoken(),
       "hypothesis file (default, or -: standard input); several: one table of systems")
      ("metrics,metric,m", po::value(&given.metrics)->multitoken(),
       "bleu (default) | chrf | ter, one line each: the names up to the next option")
      ("sentence-level,sl", po::bool_switch(&command.sentence_level),
       "(also -sl) one score per segment (with effective order)")
      ("score-only,b", po::bool_switch(&command.score_only), "print the score alone")
      ("width,w", po::value(&given.width), "decimals of the score (default 1; moses: 2)")
      ("format,f", po::value(&given.format),
       "text (default; sacreBLEU's -f text) | json (sacreBLEU's default) | latex (several "
       "systems' table for a paper; one system: text); SACREBLEU_FORMAT, when set, decides "
       "as it does for sacreBLEU")
      ("help,h", "print this text and exit")(
      "version", "print the git commit the program was built from and exit");
  po::options_description bleu("BLEU");
  bleu.add_options()
      ("tokenize,tok", po::value(&given.tokenize),
       "(also -tok) 13a (default) | intl | char | none | zh (Chinese characters apart) | "
       "flores101 (spm) | flores200 | spBLEU-1K (spBLEU: sacreBLEU's SentencePiece models, "
       "read from $SACREBLEU/models, else ~/.sacrebleu/models), or "
       "the paper's tokenized BLEU: moses (Moses "
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
  po::options_description tests(
      "Intervals and paired tests (sacreBLEU's: NumPy's samples, seed SACREBLEU_SEED or 12345)");
  tests.add_options()
      ("confidence,ci", po::bool_switch(&given.confidence),
       "(also -ci) one system's 95% confidence interval by bootstrap resampling")
      ("confidence-n,cin", po::value(&given.confidence_n),
       "(also -cin) bootstrap samples of --confidence (default 1000)")
      ("paired-bs,pbs", po::bool_switch(&given.paired_bs),
       "(also -pbs) several systems: each against the first by paired bootstrap resampling, "
       "with intervals")
      ("paired-bs-n,pbsn", po::value(&given.paired_bs_n),
       "(also -pbsn) samples of --paired-bs (default 1000)")
      ("paired-ar,par", po::bool_switch(&given.paired_ar),
       "(also -par) several systems: each against the first by approximate randomization")
      ("paired-ar-n,parn", po::value(&given.paired_ar_n),
       "(also -parn) trials of --paired-ar (default 10000)")
      ("paired-jobs,j", po::value(&given.paired_jobs),
       "taken for sacreBLEU's command lines; the tests run in this process (same results)")
      ("no-color,nc", "(also -nc) taken for sacreBLEU's command lines: nothing is coloured here")
      ("quiet,q", "(also -q) no note on standard error (a byte-order mark scored as text)")
      ("force", "taken for sacreBLEU's command lines: it silences sacreBLEU's warning that the "
                "input looks tokenized, which is not printed here");
  po::options_description all;
  all.add(general).add(bleu).add(chrf).add(ter).add(tests);
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

// What `systems` systems cannot be given with the rest of `command`, in sacreBLEU's words
// ("" for nothing).
std::string system_count_problem(const CommandLine& command, size_t systems) {
  if (systems > 1 && command.moses) {
    return "multi-bleu.perl (--tokenize moses or moses-compound) scores one system";
  }
  if (systems > 1 && command.sentence_level) {
    return "only one system can be evaluated in sentence-level mode (-sl)";
  }
  if (command.paired_test && systems == 1) {
    return "paired tests require several systems: after -i, the baseline first (-i BASELINE "
           "SYSTEM), or as tab-separated columns of standard input";
  }
  if (systems > 1 && command.confidence) {
    return "--confidence is for one system: for several, use a paired test (--paired-bs "
           "gives each system's interval too)";
  }
  return "";
}

// --confidence and the paired tests, refused where sacreBLEU refuses them (in its order,
// in its words), then kept in `command`.
void check_tests(const Given& given, CommandLine& command) {
  const size_t systems = 1 + command.more_systems.size();
  const bool paired = given.paired_bs || given.paired_ar;
  if (given.paired_bs && given.paired_ar) {
    THPC_FAIL("--paired-bs and --paired-ar: one paired test at a time");
  }
  // As sacreBLEU: --confidence-n 1 or less is no interval, a paired test's count of 0 or
  // less its default (1,000 or 10,000); only the cap is ours.
  for (const auto& [option, count] : std::vector<std::pair<const char*, int64_t>>{
           {"--confidence-n", given.confidence_n}, {"--paired-bs-n", given.paired_bs_n},
           {"--paired-ar-n", given.paired_ar_n}}) {
    if (count > kMostSamples) {
      THPC_FAIL(option << " " << count << " is above " << kMostSamples
                << " (the number of samples or trials)");
    }
  }
  if (given.paired_jobs < 0) {
    THPC_FAIL("--paired-jobs " << given.paired_jobs << " is below 0");
  }
  if (command.moses && (given.confidence || paired)) {
    THPC_FAIL("multi-bleu.perl (--tokenize moses or moses-compound) scores one system, "
              "without intervals or paired tests");
  }
  if (command.sentence_level && (given.confidence || paired)) {
    THPC_FAIL("statistical tests (--confidence, --paired-bs, --paired-ar) are unavailable "
              "in sentence-level mode (-sl)");
  }
  command.confidence = given.confidence;
  // sacreBLEU bootstraps only above one sample: -cin 1 prints no interval.
  if (given.confidence && given.confidence_n > 1) command.confidence_samples = given.confidence_n;
  if (given.paired_bs) {
    command.paired_test = thpc::metrics::PairedTest::kBootstrap;
    command.paired_samples = given.paired_bs_n < 1 ? 1000 : given.paired_bs_n;
    command.paired_samples_given = given.paired_bs_n;
  } else if (given.paired_ar) {
    command.paired_test = thpc::metrics::PairedTest::kApproximateRandomization;
    command.paired_samples = given.paired_ar_n < 1 ? 10000 : given.paired_ar_n;
    command.paired_samples_given = given.paired_ar_n;
  }
  // Standard input's columns are counted once it is read (run()).
  if (!command.systems_in_columns) {
    const std::string problem = system_count_problem(command, systems);
    if (!problem.empty()) THPC_FAIL(problem);
  }
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
  command.quiet = values.count("quiet") > 0;
  const auto given_option = [&](const char* name) {
    return values.count(name) > 0 && !values[name].defaulted();
  };
  command.reference_paths = given.references;
  if (command.reference_paths.empty()) THPC_FAIL("no reference file given");
  // -i SYS1 SYS2 ... (sacreBLEU's nargs='+'): each system once, by its name; with a
  // paired test a repetition of the baseline is dropped, as sacreBLEU drops it.
  const bool paired = given.paired_bs || given.paired_ar;
  std::vector<std::string> systems;
  for (const std::string& name : given.inputs) {
    if (std::find(systems.begin(), systems.end(), name) != systems.end()) {
      if (paired && name == systems.front()) continue;
      THPC_FAIL("-i: " << name << " is given twice: each system once (sacreBLEU names a "
                "system by its file)");
    }
    systems.push_back(name);
  }
  // "-" is standard input, as decode, evalb and trees read it (sacreBLEU takes a file of
  // that name: "-: no such file" here before); one of the files only.
  if (!systems.empty() && systems.front() != "-") command.hypothesis_path = systems.front();
  command.systems_in_columns = systems.empty();
  if (systems.size() > 1) command.more_systems.assign(systems.begin() + 1, systems.end());
  const auto standard_inputs = std::count(command.reference_paths.begin(),
                                          command.reference_paths.end(), std::string("-")) +
                               std::count(command.more_systems.begin(),
                                          command.more_systems.end(), std::string("-")) +
                               (command.hypothesis_path ? 0 : 1);
  if (standard_inputs > 1) {
    THPC_FAIL("standard input can be one file only: the system's (no -i, or -i -) or one "
              "reference's (-, with -i FILE)");
  }
  // `>> ref.txt` appended the score to the reference, exit 0; the next scoring failed.
  std::vector<std::string> inputs = command.reference_paths;
  inputs.push_back(command.hypothesis_path.value_or("-"));
  inputs.insert(inputs.end(), command.more_systems.begin(), command.more_systems.end());
  if (const std::string input = thpc::input_standard_output_is(inputs); !input.empty()) {
    THPC_FAIL("standard output is the file of the input " << input << ": writing the score "
              "there would change it; redirect the output to another file");
  }
  // sacreBLEU's -m takes one name or more (nargs='+'); each is printed once, by name.
  command.metrics = given.metrics;
  command.metrics_as_given.clear();
  for (const std::string& name : command.metrics) {
    if (name != "bleu" && name != "chrf" && name != "ter") {
      THPC_FAIL("unknown metric '" << name << "' (expected bleu | chrf | ter)");
    }
    if (std::find(command.metrics_as_given.begin(), command.metrics_as_given.end(), name) ==
        command.metrics_as_given.end()) {
      command.metrics_as_given.push_back(name);
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
  // sacreBLEU's text (-f text) by default here, its JSON with -f json; as in sacreBLEU,
  // SACREBLEU_FORMAT overrides -f when it names a format.
  std::string format = given.format;
  if (const char* variable = std::getenv("SACREBLEU_FORMAT")) {
    std::string named = variable;
    for (char& c : named) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    if (named == "text" || named == "json" || named == "latex") format = named;
  }
  if (format != "text" && format != "json" && format != "latex") {
    THPC_FAIL("-f " << format << ": unknown format (expected text | json | latex)");
  }
  command.json = format == "json";
  command.latex = format == "latex";
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
    if (command.json && !command.score_only) {
      THPC_FAIL("-f json: multi-bleu.perl's line (--tokenize moses or moses-compound) has no "
                "JSON form; give -b for the score alone");
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
                << given.tokenize << "' (expected 13a | intl | char | none | zh | flores101 | "
                << "flores200 | spBLEU-1K, or moses | moses-compound for the paper's "
                << "tokenized BLEU)");
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
  check_tests(given, command);
  return command;
}

std::string format_score(double score, int width) {
  std::string text(std::snprintf(nullptr, 0, "%.*f", width, score) + 1, '\0');
  text.resize(std::snprintf(text.data(), text.size(), "%.*f", width, score));
  return text;
}

// The byte offset of code point `count` of UTF-8 `text` (its size when it has fewer).
size_t code_point_offset(const std::string& text, size_t count) {
  size_t offset = 0;
  for (size_t seen = 0; offset < text.size(); ++offset) {
    if ((static_cast<unsigned char>(text[offset]) & 0xC0) == 0x80) continue;
    if (seen++ == count) return offset;
  }
  return offset;
}
size_t code_points(const std::string& text) {
  return static_cast<size_t>(std::count_if(text.begin(), text.end(), [](char c) {
    return (static_cast<unsigned char>(c) & 0xC0) != 0x80;
  }));
}

// The lines of several metrics, as sacreBLEU's print_single_results prints them: a line
// without '=' (a -b score without its interval) at once; then the lines with one,
// right-aligned at one code point before their first '='. One departure: sacreBLEU pairs
// the alignments with the lines from the first (zip(lens, results)), so that with -b -ci a
// metric whose μ is 0 (no interval, no '=') is printed twice and the last metric never;
// here each line is printed once.
void print_lines(const std::vector<std::string>& lines) {
  std::vector<std::pair<const std::string*, size_t>> aligned;  // code points before '=', − 1
  for (const std::string& line : lines) {
    const size_t equals = line.find('=');
    if (equals == std::string::npos || equals == 0) {
      std::cout << line << "\n";
    } else {
      aligned.emplace_back(&line, code_points(line.substr(0, equals)) - 1);
    }
  }
  size_t width = 0;
  for (const auto& [line, length] : aligned) width = std::max(width, length);
  for (const auto& [line, length] : aligned) {
    const size_t split = code_point_offset(*line, length);
    std::cout << std::string(width - length, ' ') << line->substr(0, split)
              << line->substr(split) << "\n";
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

// Standard input as sacreBLEU reads it without -i: universal newlines (\r\n, \r and \n
// end a line), each line's trailing whitespace removed, and its tab-separated fields the
// systems' segments, each field's trailing whitespace removed too but on the first line
// (sacreBLEU strips those only with the line). One column is one system, as before.
std::vector<std::vector<std::string>> read_columns(std::istream& in) {
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::string lines_text;
  lines_text.reserve(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] != '\r') {
      lines_text += text[i];
      continue;
    }
    lines_text += '\n';
    if (i + 1 < text.size() && text[i + 1] == '\n') ++i;
  }
  std::istringstream stream(lines_text);
  const std::vector<std::string> lines = thpc::metrics::read_segments(stream, "<stdin>");
  std::vector<std::vector<std::string>> columns;
  for (size_t l = 0; l < lines.size(); ++l) {
    std::vector<std::string> fields;
    std::stringstream line(lines[l]);
    for (std::string field; std::getline(line, field, '\t');) fields.push_back(field);
    if (lines[l].empty() || lines[l].back() == '\t') fields.emplace_back();
    if (l == 0) columns.resize(fields.size());
    if (fields.size() != columns.size()) {
      THPC_FAIL("<stdin>: line " << l + 1 << " has " << fields.size()
                << " tab-separated fields, line 1 has " << columns.size()
                << ": without -i each line holds one segment of every system, apart by tabs "
                   "(give the systems as files after -i otherwise)");
    }
    for (size_t s = 0; s < fields.size(); ++s) {
      columns[s].push_back(l == 0 ? fields[s]
                                  : thpc::metrics::encode_utf8(thpc::metrics::python_rstrip(
                                        *thpc::metrics::decode_utf8(fields[s]))));
    }
  }
  return columns;
}

// The systems' names as sacreBLEU's table shows them (the file names as given), and the
// source each is read from in messages ("<stdin>" for -).
std::vector<std::string> system_names(const CommandLine& command) {
  std::vector<std::string> names = {command.hypothesis_path.value_or("-")};
  names.insert(names.end(), command.more_systems.begin(), command.more_systems.end());
  return names;
}
std::string source_of(const std::string& name) { return name == "-" ? "<stdin>" : name; }

// The metrics' scorers, built once from the references.
struct Scorers {
  std::optional<thpc::metrics::BleuScorer> bleu;
  std::optional<thpc::metrics::ChrfScorer> chrf;
  std::optional<thpc::metrics::TerScorer> ter;

  // The metric as sacreBLEU's tests take it.
  std::unique_ptr<thpc::metrics::TestedMetric> tested(const std::string& metric) const {
    if (metric == "bleu") return thpc::metrics::tested_bleu(*bleu);
    if (metric == "chrf") return thpc::metrics::tested_chrf(*chrf);
    return thpc::metrics::tested_ter(*ter);
  }
};

// One metric's corpus score as sacreBLEU's Score holds it.
struct ScoreLine {
  std::string name, signature, verbose;
  double score = 0;
  std::optional<thpc::metrics::Interval> interval;  // --confidence
};

// "μ = MEAN ± HALF", shown by sacreBLEU's Score.format when the bootstrap mean is above 0.
std::optional<std::string> interval_text(const ScoreLine& line, int width) {
  if (!line.interval || !(line.interval->mean > 0)) return std::nullopt;
  return "\u03bc = " + format_score(line.interval->mean, width) + " \u00b1 " +
         format_score(line.interval->half_width, width);
}

// The score as Score.format shows it: with its interval after it, if any.
std::string shown_score(const ScoreLine& line, int width) {
  const std::optional<std::string> interval = interval_text(line, width);
  return format_score(line.score, width) + (interval ? " (" + *interval + ")" : "");
}

// Score.format's JSON (json.dumps(..., indent=1, ensure_ascii=False)): the name, the score
// as float(f"{score:.{width}f}"), the signature, the interval, the verbose part, then the
// signature's fields one by one.
std::string json_score(const ScoreLine& line, int width) {
  using thpc::metrics::json_string;
  // float(f"{value:.{width}f}"): the printed decimals read back, then repr'd.
  const auto printed = [width](double value) {
    return thpc::metrics::python_float_repr(
        std::strtod(format_score(value, width).c_str(), nullptr));
  };
  std::vector<std::pair<std::string, std::string>> fields = {
      {"name", json_string(line.name, false)},
      {"score", printed(line.score)},
      {"signature", json_string(line.signature, false)}};
  if (const std::optional<std::string> interval = interval_text(line, width)) {
    for (const auto& [key, value] : {std::pair{"confidence_mean", line.interval->mean},
                                     std::pair{"confidence_var", line.interval->half_width}}) {
      fields.emplace_back(key, printed(value));
    }
    fields.emplace_back("confidence", json_string(*interval, false));
  }
  if (!line.verbose.empty()) fields.emplace_back("verbose_score", json_string(line.verbose, false));
  std::stringstream signature(line.signature);
  for (std::string field; std::getline(signature, field, '|');) {
    const size_t colon = field.find(':');
    fields.emplace_back(field.substr(0, colon), json_string(field.substr(colon + 1), false));
  }
  std::string text = "{";
  for (size_t i = 0; i < fields.size(); ++i) {
    text += std::string(i == 0 ? "" : ",") + "\n " + json_string(fields[i].first, false) + ": " +
            fields[i].second;
  }
  return text + "\n}";
}

// One system, one line per metric (or per segment with -sl), as before; with --confidence
// each line also carries its interval and its signature the samples and the seed.
void print_one_system(const CommandLine& command, const Scorers& scorers,
                      const std::vector<std::string>& hypotheses) {
  const int width = command.width.value_or(1);
  std::optional<thpc::metrics::Seed> seed;
  if (command.confidence_samples) seed = thpc::metrics::seed_from_environment();
  // One metric's score for segment `segment`, or for the corpus (nullopt).
  const auto score_of = [&](const std::string& metric, std::optional<size_t> segment) {
    ScoreLine line;
    if (metric == "bleu") {
      const thpc::metrics::BleuScore bleu =
          segment ? scorers.bleu->sentence_score(*segment, hypotheses[*segment])
                  : scorers.bleu->corpus_score(hypotheses);
      line.name = "BLEU", line.signature = scorers.bleu->signature(), line.score = bleu.score;
      line.verbose = bleu.verbose();
    } else if (metric == "ter") {
      line.name = "TER", line.signature = scorers.ter->signature();
      line.score = segment ? scorers.ter->sentence_score(*segment, hypotheses[*segment])
                           : scorers.ter->corpus_score(hypotheses);
    } else {
      line.name = scorers.chrf->name(), line.signature = scorers.chrf->signature();
      line.score = segment ? scorers.chrf->sentence_score(*segment, hypotheses[*segment])
                           : scorers.chrf->corpus_score(hypotheses);
    }
    if (!segment && seed) {
      // The signature's "bs:N|seed:S|" after nrefs, and the interval.
      const auto tested = scorers.tested(metric);
      line.signature = tested->signature("bs:" + std::to_string(*command.confidence_samples) +
                                         "|seed:" + seed->text + "|");
      line.interval = thpc::metrics::bootstrap_interval(
          *tested, tested->statistics(hypotheses), *command.confidence_samples, *seed);
    }
    return line;
  };
  // Score.format's text: "NAME|SIGNATURE = SCORE[ VERBOSE]", or with -b the score alone.
  const auto text = [&](const ScoreLine& line) {
    if (command.score_only) return shown_score(line, width);
    std::string shown = line.name + "|" + line.signature + " = " + shown_score(line, width);
    return line.verbose.empty() ? shown : shown + " " + line.verbose;
  };
  if (command.sentence_level) {
    // One metric (parse_command_line checked): one line per segment, text even with -f json
    // (as sacreBLEU).
    for (size_t i = 0; i < hypotheses.size(); ++i) {
      std::cout << text(score_of(command.metrics.front(), i)) << "\n";
    }
    return;
  }
  std::vector<std::string> lines;
  for (const std::string& metric : command.metrics) {
    const ScoreLine line = score_of(metric, std::nullopt);
    lines.push_back(command.json && !command.score_only ? json_score(line, width) : text(line));
  }
  if (!command.json) {
    print_lines(lines);
  } else if (lines.size() == 1) {
    std::cout << lines.front() << "\n";
  } else {
    // print_single_results: the metrics' texts (JSON objects, or -b's scores) in a list.
    std::cout << "[\n";
    for (size_t i = 0; i < lines.size(); ++i) std::cout << (i ? ",\n" : "") << lines[i];
    std::cout << "\n]\n";
  }
}

// What sacreBLEU prints under a paired test's table (colours off).
void print_paired_test_explanation(const CommandLine& command, const std::string& baseline) {
  const bool bootstrap = command.paired_test == thpc::metrics::PairedTest::kBootstrap;
  const std::string heading = std::string("Paired ") +
                              (bootstrap ? "bootstrap resampling" : "approximate randomization") +
                              " test with " + std::to_string(command.paired_samples_given) +
                              (bootstrap ? " resampling trials" : " trials");
  const std::string rule(heading.size(), '-');
  std::cout << rule << "\n" << heading << "\n" << rule << "\n"
            << " - Each system is pairwise compared to " << baseline << ".\n"
            << (bootstrap ? "   Actual system score / bootstrap estimated true mean / 95% CI "
                            "are provided for each metric.\n"
                          : "   Actual system score is provided for each metric.\n")
            << "\n"
            << " - Null hypothesis: the system and the baseline translations are essentially\n"
            << "   generated by the same underlying process. For a given system and the "
               "baseline,\n"
            << "   the p-value is roughly the probability of the absolute score difference "
               "(delta)\n"
            << "   or higher occurring due to chance, under the assumption that the null "
               "hypothesis is correct.\n"
            << "\n"
            << " - Assuming a significance threshold of 0.05, the null hypothesis can be "
               "rejected\n"
            << "   for p-values < 0.05 (marked with \"*\"). This means that the delta is "
               "unlikely to be attributed\n"
            << "   to chance, hence the system is significantly \"different\" than the "
               "baseline.\n"
            << "   Otherwise, the p-values are highlighted in red.\n"
            << "\n"
            << " - NOTE: Significance does not tell whether a system is \"better\" than the "
               "baseline but rather\n"
            << "   emphasizes the \"difference\" of the systems in terms of the "
               "replicability of the delta.\n"
            << "\n";
}

// Several systems: sacreBLEU's table (a column per metric, a row per system), with a
// paired test's intervals and p-values, then the metrics' signatures.
void print_systems_table(const CommandLine& command, const Scorers& scorers,
                         const std::vector<std::vector<std::string>>& systems,
                         std::vector<std::string> names) {
  const int width = command.width.value_or(1);
  std::vector<std::string> headers = {"System"};
  std::vector<std::vector<std::string>> columns;
  std::vector<std::pair<std::string, std::string>> signatures;  // name, signature
  // -f json: each metric's name and its value for each system, as JSON text.
  std::vector<std::pair<std::string, std::vector<std::string>>> json_columns;
  if (!command.paired_test) {
    for (const std::string& metric : command.metrics) {
      const auto tested = scorers.tested(metric);
      headers.push_back(tested->name());
      std::vector<std::string>& column = columns.emplace_back();
      for (const std::vector<std::string>& system : systems) {
        column.push_back(format_score(
            thpc::metrics::corpus_score(*tested, tested->statistics(system)), width));
      }
      signatures.emplace_back(tested->name(), tested->signature(""));
      auto& [json_name, json_values] = json_columns.emplace_back(tested->name(), column);
      for (std::string& value : json_values) value = thpc::metrics::json_string(value, true);
    }
  } else {
    const bool bootstrap = command.paired_test == thpc::metrics::PairedTest::kBootstrap;
    const thpc::metrics::Seed seed = thpc::metrics::seed_from_environment();
    // PairedTest's signature: the seed as an integer, "none" without one.
    const std::string& seed_text = seed.integer;
    std::vector<std::unique_ptr<thpc::metrics::TestedMetric>> owned;
    std::vector<const thpc::metrics::TestedMetric*> metrics;
    for (const std::string& metric : command.metrics_as_given) {
      owned.push_back(scorers.tested(metric));
      metrics.push_back(owned.back().get());
    }
    const auto results = thpc::metrics::paired_test(metrics, systems, *command.paired_test,
                                                    command.paired_samples, seed);
    for (size_t m = 0; m < metrics.size(); ++m) {
      headers.push_back(metrics[m]->name() + (bootstrap ? " (\u03bc \u00b1 95% CI)" : ""));
      std::vector<std::string>& column = columns.emplace_back();
      std::vector<std::string>& json_values = json_columns.emplace_back(metrics[m]->name(),
                                                                        std::vector<std::string>{})
                                                  .second;
      for (const thpc::metrics::PairedResult& result : results[m]) {
        // Result.__dict__: its score, p-value, mean and half-width as repr(float), or null.
        const auto number = [](std::optional<double> value) {
          return value ? thpc::metrics::python_float_repr(*value) : std::string("null");
        };
        const std::string indent(12, ' ');
        json_values.push_back(
            "{\n" + indent + "\"score\": " + number(result.score) + ",\n" + indent +
            "\"p_value\": " + number(result.p_value) + ",\n" + indent + "\"mean\": " +
            number(result.interval ? std::optional(result.interval->mean) : std::nullopt) +
            ",\n" + indent + "\"ci\": " +
            number(result.interval ? std::optional(result.interval->half_width) : std::nullopt) +
            "\n        }");
        std::string cell = format_score(result.score, width);
        if (result.interval) {
          cell += " (" + format_score(result.interval->mean, width) + " \u00b1 " +
                  format_score(result.interval->half_width, width) + ")";
        }
        if (result.p_value) {
          // sacreBLEU stars a p-value of at most 0.05 and colours the others red.
          // On a line of its own in the grid, after a space in LaTeX (one line a row).
          cell += std::string(command.latex ? " " : "\n") + "(p = " +
                  format_score(*result.p_value, 4) + ")" + (*result.p_value > 0.05 ? "" : "*");
        }
        column.push_back(cell);
      }
      signatures.emplace_back(
          metrics[m]->name(),
          metrics[m]->signature(std::string(bootstrap ? "bs:" : "ar:") +
                                std::to_string(command.paired_samples) + "|seed:" +
                                seed_text + "|"));
    }
  }
  if (command.json) {
    // print_results_table's JSON (indent 4, ASCII): a dict per system, no signatures.
    std::cout << "[";
    for (size_t s = 0; s < names.size(); ++s) {
      std::cout << (s ? "," : "") << "\n    {\n        \"system\": "
                << thpc::metrics::json_string(names[s], true);
      for (const auto& [name, values] : json_columns) {
        std::cout << ",\n        " << thpc::metrics::json_string(name, true) << ": " << values[s];
      }
      std::cout << "\n    }";
    }
    std::cout << "\n]\n";
    return;
  }
  columns.insert(columns.begin(), names);
  std::cout << (command.latex ? thpc::metrics::latex_booktabs_table(headers, columns, width)
                              : thpc::metrics::fancy_grid_table(headers, columns, width))
            << "\n\n";
  // sacreBLEU names the baseline here only when its name starts "Baseline:" (a file's;
  // standard input's columns say "compared to .").
  if (command.paired_test) {
    print_paired_test_explanation(
        command, names.front().rfind("Baseline:", 0) == 0 ? names.front() : std::string());
  }
  std::cout << "-----------------\nMetric signatures\n-----------------\n";
  for (const auto& [name, signature] : signatures) {
    std::string padded = name;
    if (padded.size() < 10) padded.resize(10, ' ');
    std::cout << " - " << padded << " " << signature << "\n";
  }
}

int run(const CommandLine& command) {
  // A SentencePiece tokenizer's model, before any input is read (a missing one is the
  // machine's problem, exit 1, not the command line's); only where BLEU is scored, as
  // sacreBLEU loads it.
  thpc::metrics::BleuOptions bleu_options = command.options;
  if (thpc::metrics::is_sentencepiece_tokenizer(bleu_options.tokenizer) &&
      std::count(command.metrics.begin(), command.metrics.end(), "bleu") > 0) {
    bleu_options.sentencepiece = thpc::metrics::load_sacrebleu_model(bleu_options.tokenizer);
  }
  // A closed standard input read as an empty one ("<stdin>: no segments", a helper's trial).
  const std::vector<std::string> names = system_names(command);
  const bool reads_standard_input =
      std::count(names.begin(), names.end(), "-") > 0 ||
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
  std::vector<std::vector<std::string>> systems;
  // The names the table shows: the files (the first "Baseline: FILE" with a paired test),
  // or for standard input's columns sacreBLEU's "System 1", "System 2" ... ("Baseline",
  // "System 1" ... with a paired test).
  std::vector<std::string> shown_names = names;
  if (command.systems_in_columns && !command.moses) {
    systems = read_columns(std::cin);
    const std::string problem = system_count_problem(command, systems.size());
    if (!problem.empty()) throw thpc::tools::UsageError(problem);
    shown_names.clear();
    for (size_t s = 0; s < systems.size(); ++s) {
      shown_names.push_back(command.paired_test && s == 0
                                ? "Baseline"
                                : "System " + std::to_string(command.paired_test ? s : s + 1));
    }
  } else {
    for (const std::string& name : names) {
      systems.push_back(name == "-" ? read_text(command, std::cin, source_of(name))
                                    : read_text(command, name));
    }
    if (command.paired_test) shown_names.front() = "Baseline: " + shown_names.front();
  }
  for (size_t s = 0; s < systems.size(); ++s) {
    const std::string source = s < names.size() ? source_of(names[s]) : "<stdin>";
    const std::vector<std::string>& hypotheses = systems[s];
    if (hypotheses.empty()) THPC_FAIL(source << ": no segments");
    for (size_t r = 0; r < references.size(); ++r) {
      if (references[r].size() != hypotheses.size()) {
        THPC_FAIL(command.reference_paths[r]
                  << ": " << references[r].size()
                  << (references[r].size() == 1 ? " line" : " lines") << ", but " << source
                  << " has " << hypotheses.size()
                  << carriage_return_hint(command.reference_paths[r], references[r])
                  << carriage_return_hint(source, hypotheses)
                  << " (a hypothesis is scored against the reference line of its number: "
                  << "one line per reference line, an empty line for an empty translation)");
      }
    }
  }
  // A byte-order mark is part of the first word, as sacreBLEU reads it (kept: its scores),
  // but said: identical texts, one saved with a mark, scored 59.5 (an error walk).
  const auto say_mark = [&](const std::string& source, const std::vector<std::string>& text) {
    if (!command.quiet && !text.empty() && text.front().rfind("\xEF\xBB\xBF", 0) == 0) {
      std::cerr << "transformer_score: note: " << source << " begins with a byte-order mark "
                << "(U+FEFF), scored as part of its first word as sacreBLEU scores it; remove "
                << "it (sed -i '1s/^\\xEF\\xBB\\xBF//' FILE) unless the text holds one\n";
    }
  };
  // Pieces, spm_encode's output, are scored as words, as sacreBLEU scores them, but said:
  // fairseq's habit leaves translations in pieces, which scored BLEU 0.1 here without a
  // hint (a helper's walk).
  const auto say_pieces = [&](const std::string& source, const std::vector<std::string>& text) {
    size_t lines = 0, encoded = 0;
    for (const std::string& line : text) {
      if (line.find_first_not_of(" \t") == std::string::npos) continue;
      ++lines;
      if (thpc::looks_encoded_into_pieces(line)) ++encoded;
    }
    if (!command.quiet && 2 * encoded > lines) {
      std::cerr << "transformer_score: note: " << source << " looks encoded into SentencePiece "
                << "pieces (the words of " << encoded << " of its " << lines << " lines start "
                << "with U+2581, '\xE2\x96\x81'), scored as words as sacreBLEU scores them; "
                << "metrics are meant on text: spm_decode it first\n";
    }
  };
  for (size_t r = 0; r < references.size(); ++r) {
    say_mark(command.reference_paths[r], references[r]);
    say_pieces(command.reference_paths[r], references[r]);
  }
  for (size_t s = 0; s < systems.size(); ++s) {
    say_mark(s < names.size() ? source_of(names[s]) : "<stdin>", systems[s]);
    say_pieces(s < names.size() ? source_of(names[s]) : "<stdin>", systems[s]);
  }
  if (command.moses) {
    print_multi_bleu(systems.front(), references, command);
    return 0;
  }
  Scorers scorers;
  for (const std::string& metric : command.metrics) {
    if (metric == "bleu") scorers.bleu.emplace(references, bleu_options);
    if (metric == "chrf") scorers.chrf.emplace(references, command.chrf);
    if (metric == "ter") scorers.ter.emplace(references, command.ter);
  }
  if (systems.size() == 1) {
    print_one_system(command, scorers, systems.front());
  } else {
    print_systems_table(command, scorers, systems, shown_names);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return thpc::tools::tool_main("transformer_score", usage(), argc, argv, parse_command_line, run);
}
