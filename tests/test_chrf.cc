// chrF against sacreBLEU 2.x: small cases computed by hand (empty and one-character
// lines, Unicode, whitespace, case, several references, chrF++'s words, sacreBLEU's
// quirks), the 16 WMT17 En→De systems ($THPC_DATA/sacrebleu_tests, see tests/data_dir.h)
// against sacreBLEU's scores and n-gram counts, transformer_score -m chrf as a program,
// and, when sacreBLEU is installed, `python -m sacrebleu -m chrf` on the same files and
// on random text.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "common/error.h"
#include "data_dir.h"
#include "expect_error.h"
#include "metrics/bleu.h"
#include "metrics/chrf.h"
#include "program.h"
#include "sacrebleu_peer.h"

namespace {

using thpc::metrics::ChrfOptions;
using thpc::metrics::ChrfScorer;
using thpc::metrics::ChrfStatistics;

const std::string kData = thpc::data_root() + "/sacrebleu_tests";
const std::string kSmall = kData + "/small";
const std::string kWmt17 = kData + "/wmt17_en-de";
const std::string kWmt17Ref = kWmt17 + "/newstest2017-ende-ref.de";

using thpc::fixed;

double chrf(const std::vector<std::string>& hypotheses,
            const std::vector<std::vector<std::string>>& references, ChrfOptions options = {}) {
  return thpc::metrics::corpus_chrf(hypotheses, references, options);
}

ChrfOptions words_only() {
  ChrfOptions options;
  options.char_order = 0;
  options.word_order = 2;
  return options;
}

// ---- by hand: P_n = matches / hypothesis n-grams, R_n = matches / reference n-grams,
// P and R their averages over the orders both sides have n-grams of, chrF2 =
// 100 · 5PR / (4P + R) ----

TEST(ChrfByHand, IdenticalTextIsExactlyOneHundred) {
  // "ab": unigrams a, b and the bigram ab match; orders 3..6 have no n-grams on either
  // side and are not averaged. P = R = 1.
  EXPECT_EQ(chrf({"ab"}, {{"ab"}}), 100.0);
  EXPECT_EQ(chrf({"a"}, {{"a"}}), 100.0);  // one character: one order
  EXPECT_EQ(chrf({"Die Katze sitzt."}, {{"Die Katze sitzt."}}), 100.0);
}

TEST(ChrfByHand, OneCharacterLines) {
  EXPECT_EQ(chrf({"a"}, {{"b"}}), 0.0);  // P = R = 0
  // "a" against "ab": order 1 P = 1/1, R = 1/2; the hypothesis has no bigram, so order 2
  // is not effective. 5 · 1 · 0.5 / (4 + 0.5) = 5/9.
  EXPECT_DOUBLE_EQ(chrf({"a"}, {{"ab"}}), 500.0 / 9.0);
  // "ab" against "a": order 1 P = 1/2, R = 1; 5 · 0.5 / (2 + 1) = 5/6.
  EXPECT_DOUBLE_EQ(chrf({"ab"}, {{"a"}}), 500.0 / 6.0);
  // β = 1 weighs both alike: 2PR / (P + R) = 1 / 1.5; β = 0 is the precision.
  ChrfOptions beta;
  beta.beta = 1;
  EXPECT_DOUBLE_EQ(chrf({"a"}, {{"ab"}}, beta), 200.0 / 3.0);
  beta.beta = 0;
  EXPECT_EQ(chrf({"a"}, {{"ab"}}, beta), 100.0);
}

TEST(ChrfByHand, EmptyLinesScoreZeroAndCountInTheCorpus) {
  EXPECT_EQ(chrf({""}, {{"abc"}}), 0.0);  // no hypothesis n-gram: no effective order
  EXPECT_EQ(chrf({"abc"}, {{""}}), 0.0);  // nor with an empty reference
  EXPECT_EQ(chrf({""}, {{""}}), 0.0);
  EXPECT_EQ(chrf({" \t\u3000"}, {{"ab"}}), 0.0);  // only whitespace is empty too
  // An empty hypothesis still brings its reference's n-grams to the corpus sums:
  // order 1 [hyp 0+2, ref 2+2, matches 0+2], order 2 [0+1, 1+1, 0+1]:
  // P = (1 + 1)/2, R = (1/2 + 1/2)/2, chrF2 = 5 · 0.5 / 4.5.
  EXPECT_DOUBLE_EQ(chrf({"", "ab"}, {{"ab", "ab"}}), 500.0 / 9.0);
}

TEST(ChrfByHand, ReferenceShorterThanTheOrderHidesTheHypothesisNgrams) {
  // sacreBLEU counts no hypothesis n-grams of an order its reference has none of. Segment
  // 1 ("ab" / "a") has a reference without bigrams, so its hypothesis bigram is not
  // counted: order 1 [2+2, 1+2, 1+2], order 2 [0+1, 0+1, 0+1]. P = (3/4 + 1)/2 = 7/8,
  // R = 1, chrF2 = 5 · 7/8 / (4 · 7/8 + 1) = 35/36. Counting that bigram would give
  // order 2 [2, 1, 1], P = 5/8 and 25/28 instead.
  const ChrfScorer scorer({{"a", "cd"}}, ChrfOptions{});
  const ChrfStatistics statistics = scorer.corpus_statistics({"ab", "cd"});
  EXPECT_EQ(statistics.hypothesis, (std::vector<int64_t>{4, 1, 0, 0, 0, 0}));
  EXPECT_EQ(statistics.reference, (std::vector<int64_t>{3, 1, 0, 0, 0, 0}));
  EXPECT_EQ(statistics.matches, (std::vector<int64_t>{3, 1, 0, 0, 0, 0}));
  EXPECT_DOUBLE_EQ(thpc::metrics::compute_chrf(statistics, scorer.options()), 3500.0 / 36.0);
}

TEST(ChrfByHand, CharactersAreCodePoints) {
  // ţ (U+0163, cedilla) against ț (U+021B, comma below), as in sacreBLEU's Romanian test:
  // orders 1..4 match 3/4, 2/3, 1/2, 0/1 on both sides: P = R = (9 + 8 + 6 + 0)/12/4.
  EXPECT_DOUBLE_EQ(chrf({"ţară"}, {{"țară"}}), 2300.0 / 48.0);
  // One emoji (4 bytes in UTF-8) is one character: order 1 P = 2/2, R = 1/1 · ... as "ab"/"a".
  EXPECT_DOUBLE_EQ(chrf({"😀😀"}, {{"😀"}}), 500.0 / 6.0);
}

TEST(ChrfByHand, WhitespaceIsRemovedUnlessKept) {
  // Python's str.split() whitespace goes, U+00A0 and U+3000 included.
  EXPECT_EQ(chrf({"a b"}, {{"ab"}}), 100.0);
  EXPECT_EQ(chrf({"a\u00a0b\u3000c"}, {{"abc"}}), 100.0);
  // Kept: "a b" has unigrams a, ' ', b (2 of 3 match, R = 2/2) and bigrams "a ", " b"
  // (none match "ab"): P = (2/3 + 0)/2, R = (1 + 0)/2, chrF2 = 5/11.
  ChrfOptions whitespace;
  whitespace.whitespace = true;
  EXPECT_DOUBLE_EQ(chrf({"a b"}, {{"ab"}}, whitespace), 500.0 / 11.0);
}

TEST(ChrfByHand, LowercaseIsPythonsStrLower) {
  EXPECT_EQ(chrf({"AB"}, {{"ab"}}), 0.0);
  ChrfOptions lowercase;
  lowercase.lowercase = true;
  EXPECT_EQ(chrf({"AB"}, {{"ab"}}, lowercase), 100.0);
  // "İ".lower() is "i" + U+0307: two characters, as "ab" against "a".
  EXPECT_EQ(chrf({"İ"}, {{"i\u0307"}}, lowercase), 100.0);
  EXPECT_DOUBLE_EQ(chrf({"İ"}, {{"i"}}, lowercase), 500.0 / 6.0);
}

TEST(ChrfByHand, SeveralReferencesTakeTheBestSegmentScore) {
  EXPECT_EQ(chrf({"abc"}, {{"xyz"}, {"abc"}}), 100.0);
  // "ab" against "a" (5/6, see above) and "abbb" (lower): the statistics are "a"'s.
  const ChrfScorer scorer({{"a"}, {"abbb"}}, ChrfOptions{});
  EXPECT_EQ(scorer.segment_statistics(0, "ab").reference,
            (std::vector<int64_t>{1, 0, 0, 0, 0, 0}));
  EXPECT_EQ(scorer.signature().rfind("nrefs:2|", 0), 0u);
}

TEST(ChrfByHand, ChrfPlusPlusWordsSplitOffPunctuation) {
  // Words only (character order 0): [a b] against [a c]: unigrams 1 of 2, bigrams 0 of 1
  // on both sides: P = R = 1/4.
  EXPECT_DOUBLE_EQ(chrf({"a b"}, {{"a c"}}, words_only()), 25.0);
  // One punctuation mark comes off a word's end, else off its start: "(hi)" gives "(hi"
  // and ")", "there." gives "there" and ".", as the reference's "there ." does.
  EXPECT_EQ(chrf({"(hi) there."}, {{"(hi) there ."}}, words_only()), 100.0);
  // Python's string.punctuation to its ends, '!' and '~' (sacreBLEU: chrF2++ = 100.00 for
  // "hi~" against "hi ~"; a mutation audit's survivor kept '~' in its word).
  EXPECT_EQ(chrf({"hi~ oh!"}, {{"hi ~ oh !"}}, words_only()), 100.0);
  // Against "( hi ) there .": unigrams 3 of 4 / 5, bigrams 2 of 3 / 4.
  const double precision = (3.0 / 4 + 2.0 / 3) / 2;
  const double recall = (3.0 / 5 + 2.0 / 4) / 2;
  EXPECT_NEAR(chrf({"(hi) there."}, {{"( hi ) there ."}}, words_only()),
              100 * 5 * precision * recall / (4 * precision + recall), 1e-12);
}

TEST(ChrfByHand, EpsSmoothingAveragesEachOrdersF) {
  ChrfOptions eps;
  eps.eps_smoothing = true;
  // "ab" / "a": order 1 F = 5 · 0.5 · 1 / 3 = 5/6, orders 2..6 1e-16 each: (5/6) / 6.
  EXPECT_NEAR(chrf({"ab"}, {{"a"}}, eps), 100.0 * 5.0 / 36.0, 1e-12);
  // Nothing matches: every order's F is 1e-16, so the score is 1e-14 percent, not 0.
  EXPECT_NEAR(chrf({"a"}, {{"b"}}, eps), 1e-14, 1e-20);
  EXPECT_GT(chrf({"a"}, {{"b"}}, eps), 0.0);
}

TEST(ChrfScorerTest, NameAndSignatureAsSacreBleu) {
  const ChrfScorer chrf2({{"x"}}, ChrfOptions{});
  EXPECT_EQ(chrf2.name(), "chrF2");
  EXPECT_EQ(chrf2.signature(),
            "nrefs:1|case:mixed|eff:yes|nc:6|nw:0|space:no|version:2.x-compatible");
  ChrfOptions options;
  options.word_order = 2;
  options.beta = 3;
  options.lowercase = true;
  options.whitespace = true;
  options.eps_smoothing = true;
  const ChrfScorer other({{"x"}, {"y"}}, options);
  EXPECT_EQ(other.name(), "chrF3++");
  EXPECT_EQ(other.signature(),
            "nrefs:2|case:lc|eff:no|nc:6|nw:2|space:yes|version:2.x-compatible");
}

TEST(ChrfScorerTest, BadInputIsAnErrorNamingIt) {
  EXPECT_EQ(thpc::expect_error([] { chrf({"ok", "bad \xFF"}, {{"ok", "fine"}}); },
                               {"hypothesis segment 2"}),
            "hypothesis segment 2: invalid UTF-8 at byte 5");
  EXPECT_EQ(thpc::expect_error([] { chrf({"ok"}, {{"ok"}, {"\xC3"}}); }, {"reference 2"}),
            "reference 2, segment 1: invalid UTF-8 at byte 1");
  EXPECT_THROW(chrf({"a", "b"}, {{"a"}}), thpc::Error);        // 2 hypotheses, 1 segment
  EXPECT_THROW(chrf({"a"}, {{"a"}, {"a", "b"}}), thpc::Error);  // streams differ
  ChrfOptions nothing;
  nothing.char_order = 0;
  EXPECT_THROW(chrf({"a"}, {{"a"}}, nothing), thpc::Error);
  ChrfOptions negative;
  negative.beta = -1;
  EXPECT_THROW(chrf({"a"}, {{"a"}}, negative), thpc::Error);
}

// ---- WMT17 En→De: 16 systems, one reference ----

struct Wmt17Expected {
  std::string system;
  // sacreBLEU 2.6.0's default chrF2 (effective orders) and chrF2++ (-cw 2), printed with
  // -w 6 (computed for this test with `python -m sacrebleu -m chrf -w 6 [-cw 2]`).
  std::string chrf;
  std::string chrf_plus_plus;
};

const std::vector<Wmt17Expected> kWmt17Expected = {
    {"C-3MA.4959", "51.953280", "49.169752"},
    {"FBK.4870", "54.715188", "52.237990"},
    {"KIT.4950", "55.762879", "52.989259"},
    {"LIUM-NMT.4900", "55.928375", "53.235619"},
    {"LMU-nmt-reranked.4934", "56.390823", "53.579311"},
    {"LMU-nmt-single.4893", "55.921628", "53.085477"},
    {"PROMT-Rule-based.4735", "50.357341", "46.989525"},
    {"RWTH-nmt-ensemble.4921", "55.611564", "52.885622"},
    {"SYSTRAN.4847", "55.575791", "52.898428"},
    {"TALP-UPC.4834", "51.686032", "48.759803"},
    {"online-A.0", "52.002273", "49.046887"},
    {"online-B.0", "56.263348", "53.541573"},
    {"online-F.0", "49.258784", "45.712910"},
    {"online-G.0", "51.587089", "48.289297"},
    {"uedin-nmt.4722", "57.722703", "55.009688"},
    {"xmu.4910", "55.964183", "53.217427"},
};

// SCORES.tsv's chrF and chrF++ columns, by system file: sacreBLEU's with eps smoothing.
std::map<std::string, std::pair<double, double>> scores_tsv_eps_columns() {
  std::map<std::string, std::pair<double, double>> columns;
  for (const auto& [file, values] : thpc::scores_tsv(
           kWmt17 + "/SCORES.tsv", {"sacrebleu_chrF_eps", "sacrebleu_chrF++_eps"})) {
    if (values[0].empty() || values[1].empty()) continue;
    columns[file] = {std::stod(values[0]), std::stod(values[1])};
  }
  return columns;
}

// The first `orders` orders of `statistics`.
ChrfStatistics first_orders(const ChrfStatistics& statistics, int orders) {
  ChrfStatistics kept(orders);
  for (int k = 0; k < orders; ++k) {
    kept.hypothesis[k] = statistics.hypothesis[k];
    kept.reference[k] = statistics.reference[k];
    kept.matches[k] = statistics.matches[k];
  }
  return kept;
}

TEST(ChrfWmt17, SixteenSystemsAsSacreBleuWithAndWithoutEpsSmoothing) {
  THPC_REQUIRE_DATA("sacrebleu_tests/wmt17_en-de/SCORES.tsv");
  const std::map<std::string, std::pair<double, double>> eps_columns = scores_tsv_eps_columns();
  ASSERT_EQ(eps_columns.size(), 16u);
  ChrfOptions plus_plus;
  plus_plus.word_order = 2;
  const ChrfScorer scorer({thpc::metrics::read_segments(kWmt17Ref)}, plus_plus);
  for (const Wmt17Expected& expected : kWmt17Expected) {
    const std::string file = "newstest2017." + expected.system + ".en-de";
    SCOPED_TRACE(file);
    // chrF++'s statistics; with one reference (no choice between references) chrF's are
    // their six character orders.
    const ChrfStatistics statistics =
        scorer.corpus_statistics(thpc::metrics::read_segments(kWmt17 + "/" + file));
    const ChrfStatistics characters = first_orders(statistics, 6);
    ChrfOptions chrf2;
    EXPECT_EQ(fixed(thpc::metrics::compute_chrf(characters, chrf2), 6), expected.chrf);
    EXPECT_EQ(fixed(thpc::metrics::compute_chrf(statistics, plus_plus), 6),
              expected.chrf_plus_plus);
    // SCORES.tsv (sacreBLEU with eps smoothing, 6 decimals): within half a unit of the
    // last decimal, and a little for the decimal text.
    chrf2.eps_smoothing = true;
    plus_plus.eps_smoothing = true;
    EXPECT_NEAR(thpc::metrics::compute_chrf(characters, chrf2), eps_columns.at(file).first,
                5e-7 + 1e-12);
    EXPECT_NEAR(thpc::metrics::compute_chrf(statistics, plus_plus),
                eps_columns.at(file).second, 5e-7 + 1e-12);
    plus_plus.eps_smoothing = false;
    if (expected.system == "uedin-nmt.4722") {
      // sacreBLEU 2.6.0's sums of [hypothesis, reference, matches] for the six orders.
      EXPECT_EQ(characters.hypothesis,
                (std::vector<int64_t>{316428, 313424, 310420, 307416, 304412, 301408}));
      EXPECT_EQ(characters.reference,
                (std::vector<int64_t>{316770, 313766, 310762, 307758, 304754, 301750}));
      EXPECT_EQ(characters.matches,
                (std::vector<int64_t>{271943, 214506, 177278, 153876, 136299, 121535}));
    }
    // The chrF of sacreBLEU's own test.sh (chrF++.py, 4 decimals) for the two systems
    // it lists.
    if (expected.system == "C-3MA.4959") {
      EXPECT_EQ(fixed(thpc::metrics::compute_chrf(characters, chrf2), 4), "51.9533");
      plus_plus.eps_smoothing = true;
      EXPECT_EQ(fixed(thpc::metrics::compute_chrf(statistics, plus_plus), 4), "49.1683");
      plus_plus.eps_smoothing = false;
    }
  }
}

// ---- the program ----

using thpc::run_score;

const std::string kUedin = kWmt17 + "/newstest2017.uedin-nmt.4722.en-de";

// The hypotheses on a standard input that is closed, write-only or a directory are said so,
// exit 1 (before: "<stdin>: no segments", as if the text were empty); given with -i, a
// closed standard input is no matter.
TEST(ScoreProgram, AStandardInputThatCannotBeReadIsSaidSo) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("thpc_score_stdin_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string reference = (dir / "ref.txt").string();
  std::ofstream(reference) << "a small house\n";
  for (const auto& [redirect, why] : std::vector<std::pair<std::string, std::string>>{
           {" <&-", "closed"}, {" 0>/dev/null", "not open for reading"},
           {" < " + dir.string(), "a directory, not a text"}}) {
    const thpc::ProcessResult result = run_score(reference + redirect);
    EXPECT_EQ(result.exit_code, 1) << redirect << ": " << result.output;
    EXPECT_NE(result.output.find("transformer_score: error: standard input is " + why +
                                 ": give the hypotheses on it or with -i FILE"),
              std::string::npos)
        << redirect << ": " << result.output;
  }
  const thpc::ProcessResult given = run_score(reference + " -i " + reference + " <&-");
  EXPECT_EQ(given.exit_code, 0) << given.output;
  std::filesystem::remove_all(dir);
}

TEST(ChrfProgram, ChrfLineAndScoreOnly) {
  THPC_REQUIRE_DATA("sacrebleu_tests/wmt17_en-de");
  thpc::ProcessResult result = run_score(kWmt17Ref + " -i " + kUedin + " -m chrf");
  EXPECT_EQ(result.exit_code, 0) << result.output;
  EXPECT_EQ(result.output,
            "chrF2|nrefs:1|case:mixed|eff:yes|nc:6|nw:0|space:no|version:2.x-compatible = "
            "57.7\n");
  result = run_score(kWmt17Ref + " --metric chrf -b -w 6 < " + kUedin);
  EXPECT_EQ(result.output, "57.722703\n");
  result = run_score(kWmt17Ref + " -i " + kUedin + " -m chrf -cw 2 -b -w 6");
  EXPECT_EQ(result.output, "55.009688\n");
}

TEST(ChrfProgram, TwoMetricsAlignedAsSacreBleuPrintsThem) {
  THPC_REQUIRE_DATA("sacrebleu_tests/small");
  const std::string files = kSmall + "/readme_example.ref1 " + kSmall + "/readme_example.ref2 -i " +
                            kSmall + "/readme_example.hyp";
  // Printed in sacreBLEU's order (by name), each right-aligned at its " = ".
  const std::string expected =
      "    BLEU|nrefs:2|case:mixed|eff:no|tok:13a|smooth:exp|version:2.x-compatible = 48.530827 "
      "82.4/50.0/45.5/37.5 (BP = 0.943 ratio = 0.944 hyp_len = 17 ref_len = 18)\n"
      "chrF2++|nrefs:2|case:mixed|eff:yes|nc:6|nw:2|space:no|version:2.x-compatible = 59.153104\n";
  thpc::ProcessResult result = run_score(files + " -m chrf bleu -cw 2 -w 6");
  EXPECT_EQ(result.exit_code, 0) << result.output;
  EXPECT_EQ(result.output, expected);
  // -b: the scores alone, in the same order (sacreBLEU 2.6.0 prints these two).
  result = run_score(files + " -m chrf bleu -b -w 6");
  EXPECT_EQ(result.output, "48.530827\n59.727518\n");
}

TEST(ChrfProgram, SentenceLevelOneLinePerSegment) {
  THPC_REQUIRE_DATA("sacrebleu_tests/small");
  const thpc::ProcessResult result =
      run_score(kSmall + "/readme_example.ref1 " + kSmall + "/readme_example.ref2 -i " + kSmall +
                "/readme_example.hyp -m chrf -sl --chrf-eps-smoothing -w 6");
  EXPECT_EQ(result.exit_code, 0) << result.output;
  // sacreBLEU 2.6.0 prints these three scores for the same command.
  const std::string signature =
      "chrF2|nrefs:2|case:mixed|eff:no|nc:6|nw:0|space:no|version:2.x-compatible = ";
  EXPECT_EQ(result.output, signature + "100.000000\n" + signature + "35.346133\n" + signature +
                               "51.877265\n");
}

TEST(ChrfProgram, BadCommandLinesExitTwo) {
  THPC_REQUIRE_DATA("sacrebleu_tests/wmt17_en-de");
  const std::string files = kWmt17Ref + " -i " + kUedin;
  for (const auto& [arguments, fragment] : std::vector<std::pair<std::string, std::string>>{
           {" -m wer", "unknown metric 'wer' (expected bleu | chrf | ter)"},
           {" -m", "the required argument for option '--metrics' is missing"},
           {" -m bleu chrf -sl", "--sentence-level scores one metric, not 2"},
           {" -m chrf -cc -1", "chrF character order -1 < 0"},
           // Refused whatever the metric (before: taken with the default -m bleu, exit 0).
           {" -cw -1", "chrF word order -1 < 0"},
           {" -m bleu --chrf-beta -1", "chrF beta -1 < 0"},
           {" -m chrf -cc 0", "chrF needs a character or a word order above 0"},
           // Each line's statistics hold every order: -cc 100000000 took the machine's
           // memory until the out-of-memory killer ended the run.
           {" -m chrf -cc 100000000",
            "chrF character order 100000000 is above 100: every line's statistics hold each "
            "order (chrF uses 6 characters, chrF++ adds 2 words)"},
           {" -m chrf -cw 101", "chrF word order 101 is above 100: every line's statistics hold "
                                "each order (chrF uses 6 characters, chrF++ adds 2 words)"},
           {" -m bleu --max-ngram-order 99999",
            "--max-ngram-order 99999 is not in [1, 100] (BLEU uses 4; every line's statistics "
            "hold each order)"},
           // (Boost's own line was "the argument ('x') for option '--chrf-beta' is invalid")
           {" -m chrf --chrf-beta x", "--chrf-beta: 'x' is not a whole number"}}) {
    const thpc::ProcessResult result = run_score(files + arguments);
    EXPECT_EQ(result.exit_code, 2) << arguments << ": " << result.output;
    EXPECT_NE(result.output.find("transformer_score: " + fragment + " (see --help)"),
              std::string::npos)
        << arguments << ": " << result.output;
  }
}

// A file without line ends (/dev/zero, a crash's zeroed blocks) is refused at 256 MiB:
// it was read until the machine's memory ran out, then said as "read error".
TEST(ChrfProgram, ALineWithoutEndIsRefusedBeforeTheMemoryRunsOut) {
  THPC_REQUIRE_DATA("sacrebleu_tests/wmt17_en-de");
  if (!std::filesystem::exists("/dev/zero")) GTEST_SKIP() << "no /dev/zero here";
  const thpc::ProcessResult result = run_score("/dev/zero -i " + kUedin);
  EXPECT_EQ(result.exit_code, 1) << result.output;
  EXPECT_NE(result.output.find("transformer_score: error: /dev/zero: line 1 is longer than "
                               "256 MiB without a line end: not a text of lines"),
            std::string::npos)
      << result.output;
}

// ---- against Python's sacreBLEU, when it is installed ----

// Random lines that give chrF's rules work: words sharing pieces (so that n-grams of
// every order match and miss), case pairs, look-alike Unicode (ţ/ț), characters outside
// the BMP, chrF++'s punctuation, Python's rarer whitespace (U+00A0, U+3000, U+2028, \x1f,
// \x0b, a lone \r) and a byte-order mark; some lines empty, whitespace only or one
// character long.
std::vector<std::string> random_lines(std::mt19937& random, int count) {
  const std::vector<std::string> pieces = {
      "Haus",  "haus", "HAUS", "Häuser", "der", "die", "das", "Straße", "STRASSE", "ţară",
      "țară",  "İstanbul", "istanbul", "ΣΟΦΙΑ", "σοφία", "日本語", "日本", "😀", "😀😀",
      "(hi)",  "hi",  "end.", "end", ".", ",", "-", "'s", "\"x\"", "a", "b", "ab", "ba",
      "12",    "1,5", "x-y", "\ufeff28"};
  const std::vector<std::string> spaces = {" ", " ", " ", "  ", "\t", "\u00a0", "\u3000",
                                           "\u2028", "\x1f", "\x0b", "\r"};
  std::vector<std::string> lines;
  for (int i = 0; i < count; ++i) {
    const int kind = std::uniform_int_distribution<int>(0, 19)(random);
    std::string line;
    if (kind == 0) {
      line = "";
    } else if (kind == 1) {
      line = spaces[random() % spaces.size()];
    } else if (kind == 2) {
      line = std::string(1, static_cast<char>('a' + random() % 3));
    } else {
      const int words = std::uniform_int_distribution<int>(1, 12)(random);
      for (int w = 0; w < words; ++w) {
        if (w > 0) line += spaces[random() % spaces.size()];
        line += pieces[random() % pieces.size()];
      }
    }
    lines.push_back(line);
  }
  return lines;
}

// sacreBLEU's chrF and ours, line for line (sacrebleu_peer.h).
struct SacreBleuChrf : thpc::SacreBleuPeer {
  SacreBleuChrf() : SacreBleuPeer("the fixed expected values above still check chrF") {}
};

TEST_F(SacreBleuChrf, SameLinesOnRandomText) {
  std::mt19937 random(35);
  const int lines = 300;
  const std::string hypothesis = write_lines("hyp.txt", random_lines(random, lines));
  const std::string reference1 = write_lines("ref1.txt", random_lines(random, lines));
  const std::string reference2 = write_lines("ref2.txt", random_lines(random, lines));
  const std::string one = reference1 + " -i " + hypothesis;
  const std::string two = reference1 + " " + reference2 + " -i " + hypothesis;
  // Twelve decimals: the same double, not merely the same rounding.
  for (const char* options : {
           " -m chrf -w 12",
           " -m chrf -w 12 -cw 2",
           " -m chrf -w 12 --chrf-whitespace --chrf-lowercase",
           " -m chrf -w 12 --chrf-eps-smoothing --chrf-beta 1 -cc 4",
           " -m chrf -w 12 -cc 0 -cw 3 --chrf-beta 3",
           " -m bleu chrf -w 12 -cw 2"}) {
    expect_same_output(two + options);
  }
  for (const char* options :
       {" -m chrf -w 12 -sl", " -m chrf -w 12 -sl -cw 2 --chrf-eps-smoothing"}) {
    expect_same_output(one + options);
  }
}

TEST_F(SacreBleuChrf, SameLinesOnTheTestVectors) {
  THPC_REQUIRE_DATA("sacrebleu_tests/small");
  THPC_REQUIRE_DATA("sacrebleu_tests/wmt17_en-de");
  // online-A's first line starts with a byte-order mark.
  expect_same_output(kWmt17Ref + " -i " + kWmt17 + "/newstest2017.online-A.0.en-de -m chrf -w 12");
  expect_same_output(kSmall + "/sentence_ro.ref -i " + kSmall +
                     "/sentence_ro.hyp -m chrf -w 12 -sl --chrf-lowercase");
}

}  // namespace
