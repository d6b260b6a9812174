// transformer_score's intervals and paired tests (--confidence, --paired-bs, --paired-ar)
// against sacreBLEU's own: the same NumPy samples and the same float32 arithmetic, so every
// printed digit agrees, at widths that show a float32's or a double's last bit.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "common/error.h"
#include "data_dir.h"
#include "metrics/significance.h"
#include "sacrebleu_peer.h"

namespace {

using thpc::run_process;
using thpc::run_score;

const std::string kWmt17 = thpc::data_path("sacrebleu_tests/wmt17_en-de");
const std::string kWmt17Ref = kWmt17 + "/newstest2017-ende-ref.de";

// Python 3.11's statistics.mean of each list (float.hex()): the exact mean rounded once,
// where the sum rounded at each step and then divided gives another double for all but one.
TEST(ExactMean, AsPythonsStatisticsMean) {
  const std::vector<std::pair<std::vector<double>, double>> cases = {
      {{0.1, 0.2, 0.3}, 0x1.999999999999ap-3},
      {{1e16, 1.0, 1.0}, 0x1.7af4c4a80aaacp+51},
      {{28.3, 28.4, 28.35, 28.31}, 0x1.c570a3d70a3d7p+4},
      {{1e-300, 3e-300}, 0x1.56e1fc2f8f359p-996},
      {{0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1}, 0x1.999999999999ap-4},
      {{100.0, 0.1, 1e-10, 5.5, 33.333333333333336}, 0x1.bc962fc9645c7p+4},
      {{0.0, 0.0}, 0.0},
  };
  for (const auto& [values, expected] : cases) {
    EXPECT_EQ(thpc::metrics::exact_mean(values), expected) << values.size() << " values";
  }
}

// A mean of many values whose exact value lies just off a rounding tie: one rounding of the
// exact sum, not of a sum rounded on the way.
TEST(ExactMean, ManyValuesRoundedOnce) {
  std::vector<double> values(1001, 1.0);
  values.push_back(std::ldexp(1.0, -60));  // exact mean: 1001/1002 + 2^-60/1002
  const double mean = thpc::metrics::exact_mean(values);
  // 1001/1002 correctly rounded; the tiny addend is far below half an ulp.
  EXPECT_EQ(mean, 1001.0 / 1002.0);
  values.assign(3, std::ldexp(1.0, 52));
  values.push_back(1.0);  // (3·2^52 + 1)/4 = 0.75·2^52 + 0.25: a double exactly
  EXPECT_EQ(thpc::metrics::exact_mean(values), 0.75 * std::ldexp(1.0, 52) + 0.25);
}

struct SeedVariable : ::testing::Test {
  void TearDown() override { ::unsetenv("SACREBLEU_SEED"); }
};

TEST_F(SeedVariable, ReadAsSacreBleuReadsIt) {
  using Words = std::vector<uint32_t>;
  ::unsetenv("SACREBLEU_SEED");
  thpc::metrics::Seed seed = thpc::metrics::seed_from_environment();
  EXPECT_EQ(seed.words, Words{12345});
  EXPECT_EQ(seed.text, "12345");
  ::setenv("SACREBLEU_SEED", "NoNe", 1);
  seed = thpc::metrics::seed_from_environment();
  EXPECT_FALSE(seed.words);
  EXPECT_EQ(seed.text, "none");
  EXPECT_EQ(seed.integer, "none");
  // --confidence's signature shows the variable as written, the paired tests its integer.
  ::setenv("SACREBLEU_SEED", "007", 1);
  seed = thpc::metrics::seed_from_environment();
  EXPECT_EQ(seed.words, Words{7});
  EXPECT_EQ(seed.text, "007");
  EXPECT_EQ(seed.integer, "7");
  // Python's int(): whitespace, '+', underscores; any size (SeedSequence's 32-bit words).
  ::setenv("SACREBLEU_SEED", " +1_000 ", 1);
  seed = thpc::metrics::seed_from_environment();
  EXPECT_EQ(seed.words, Words{1000});
  EXPECT_EQ(seed.integer, "1000");
  ::setenv("SACREBLEU_SEED", "340282366920938463463374607431768211457", 1);  // 2^128 + 1
  seed = thpc::metrics::seed_from_environment();
  EXPECT_EQ(seed.words, (Words{1, 0, 0, 0, 1}));
  ::setenv("SACREBLEU_SEED", "0_0", 1);
  EXPECT_TRUE(thpc::metrics::seed_from_environment().is_zero());
  for (const char* bad : {"", "-1", "1.5", "seven", "_1", "1_", "1__0", "+", "0x10"}) {
    ::setenv("SACREBLEU_SEED", bad, 1);
    EXPECT_THROW(thpc::metrics::seed_from_environment(), thpc::Error) << bad;
  }
}

// ---- the program, without Python: sacreBLEU 2.6.0's lines, pinned ----

TEST(SignificanceProgram, ConfidenceLinesAsSacreBleuPrintedThem) {
  THPC_REQUIRE_DATA("sacrebleu_tests/wmt17_en-de");
  const thpc::ProcessResult result =
      run_score(kWmt17Ref + " -i " + kWmt17 + "/newstest2017.uedin-nmt.4722.en-de" +
                " -m bleu chrf -ci -w 3 2>&1");
  ASSERT_EQ(result.exit_code, 0) << result.output;
  EXPECT_EQ(thpc::without_version(result.output),
            "  BLEU|nrefs:1|bs:1000|seed:12345|case:mixed|eff:no|tok:13a|smooth:exp|version:* = "
            "28.301 (\u03bc = 28.308 \u00b1 0.682) 59.9/34.0/21.8/14.4 (BP = 1.000 ratio = "
            "1.026 hyp_len = 62873 ref_len = 61287)\n"
            "chrF2|nrefs:1|bs:1000|seed:12345|case:mixed|eff:yes|nc:6|nw:0|space:no|version:* "
            "= 57.723 (\u03bc = 57.731 \u00b1 0.456)\n");
}

// ---- against Python's sacreBLEU, when it is installed ----

struct SacreBleuSignificance : thpc::SacreBleuPeer {
  SacreBleuSignificance()
      : SacreBleuPeer("the pinned lines above still check the intervals") {}

  void expect_same(const std::string& environment, const std::string& arguments) {
    expect_same_lines(environment, arguments);
  }
};

TEST_F(SacreBleuSignificance, Wmt17ConfidenceOfEachMetric) {
  THPC_REQUIRE_DATA("sacrebleu_tests/wmt17_en-de");
  // Ten decimals: chrF's and TER's samples are float32, so this is their every bit; BLEU's
  // mean is Python's exact mean.
  expect_same("", kWmt17Ref + " -i " + kWmt17 + "/newstest2017.online-B.0.en-de" +
                      " -m bleu chrf ter -ci -w 10");
}

TEST_F(SacreBleuSignificance, Wmt17PairedBootstrapOfThreeSystems) {
  THPC_REQUIRE_DATA("sacrebleu_tests/wmt17_en-de");
  // The metrics' columns in the order given (a paired table's), not sorted.
  expect_same("", kWmt17Ref + " -i " + kWmt17 + "/newstest2017.uedin-nmt.4722.en-de " +
                      kWmt17 + "/newstest2017.LMU-nmt-reranked.4934.en-de " + kWmt17 +
                      "/newstest2017.xmu.4910.en-de -m ter bleu chrf -pbs -w 4");
}

TEST_F(SacreBleuSignificance, Wmt17PairedRandomizationAndAPlainTable) {
  THPC_REQUIRE_DATA("sacrebleu_tests/wmt17_en-de");
  const std::string systems = kWmt17 + "/newstest2017.LMU-nmt-reranked.4934.en-de " + kWmt17 +
                              "/newstest2017.LMU-nmt-single.4893.en-de";
  expect_same("", kWmt17Ref + " -i " + systems + " -m chrf bleu -par -parn 1000 -w 3");
  expect_same("", kWmt17Ref + " -i " + systems + " " + kWmt17 +
                      "/newstest2017.online-F.0.en-de -m ter chrf bleu -w 2");
}

// A reference of random words and systems made from it by dropping, replacing and moving
// words, each system by its own amounts: scores that differ by little or by much, lines
// empty now and then.
std::vector<std::vector<std::string>> random_corpus(std::mt19937& random, int lines,
                                                    int systems) {
  const auto between = [&](int low, int high) {
    return std::uniform_int_distribution<int>(low, high)(random);
  };
  const auto word = [&] {
    static const std::vector<std::string> words = {
        "the", "a", "house", "Haus", "is", "was", "big", "small", "green", ".", ",", "dog",
        "Hund", "runs", "läuft", "über", "die", "Straße", "!", "?", "1990", "3.5", "and",
        "und", "cat", "Katze", "it's", "&quot;", "日本", "。"};
    return words[static_cast<size_t>(between(0, static_cast<int>(words.size()) - 1))];
  };
  std::vector<std::vector<std::string>> corpus(systems + 1);  // [0]: the reference
  std::vector<double> change(systems);
  for (double& amount : change) amount = std::uniform_real_distribution<double>(0.05, 0.6)(random);
  for (int i = 0; i < lines; ++i) {
    std::vector<std::string> reference;
    for (int w = between(0, 20) == 0 ? 0 : between(1, 25); w > 0; --w) reference.push_back(word());
    const auto join = [](const std::vector<std::string>& words) {
      std::string text;
      for (const std::string& w : words) text += (text.empty() ? "" : " ") + w;
      return text;
    };
    corpus[0].push_back(join(reference));
    for (int s = 0; s < systems; ++s) {
      std::vector<std::string> hypothesis;
      for (const std::string& w : reference) {
        const double roll = std::uniform_real_distribution<double>(0, 1)(random);
        if (roll < change[s] / 3) continue;  // dropped
        hypothesis.push_back(roll < 2 * change[s] / 3 ? word() : w);
        if (roll > 1 - change[s] / 4) hypothesis.push_back(word());  // inserted
      }
      if (hypothesis.size() > 3 && between(0, 2) == 0) {
        std::swap(hypothesis.front(), hypothesis.back());  // moved
      }
      corpus[static_cast<size_t>(s) + 1].push_back(join(hypothesis));
    }
  }
  return corpus;
}

TEST_F(SacreBleuSignificance, SameOutputOnRandomCorpora) {
  std::mt19937 random(2026);
  struct Case {
    const char* environment;
    int lines, systems;
    const char* options;
  };
  // Widths that print float32 samples whole (chrF, TER) and doubles to their last digits
  // (BLEU); every smoothing (add-k with a fractional k, which approximate randomization
  // truncates as NumPy's int64 arrays do), chrF++ and eps smoothing, TER's options, seeds.
  const std::vector<Case> cases = {
      {"", 60, 1, "-m bleu chrf ter -ci -w 10"},
      {"SACREBLEU_SEED=18446744073709551617", 30, 2, "-m bleu chrf -pbs -pbsn 200 -w 8"},
      {"SACREBLEU_SEED=' +4_2'", 30, 1, "-m chrf -ci -cin 100 -w 8"},
      {"SACREBLEU_SEED=7", 40, 1, "-m bleu -ci -cin 333 -w 14 -s floor -sv 0.3"},
      {"SACREBLEU_SEED=0042", 80, 1, "-m chrf ter -ci -cin 41 -w 9 -cw 2 --chrf-eps-smoothing"},
      {"", 1, 1, "-m bleu chrf ter -ci -cin 50 -w 6"},
      {"", 50, 3, "-m bleu chrf ter -pbs -pbsn 300 -w 8"},
      {"SACREBLEU_SEED=99", 70, 2, "-m ter chrf -pbs -w 9 --ter-normalized -cw 2"},
      {"", 45, 3, "-m bleu ter -par -parn 500 -w 5 -s add-k -sv 0.5"},
      {"SACREBLEU_SEED=1", 30, 2, "-m chrf bleu -par -parn 777 -w 12 -s none -lc"},
      {"", 55, 2, "-m bleu -pbs -w 3 -s add-k -sv 0.5 -lc"},
      {"", 35, 4, "-m chrf ter bleu -w 4 -tok char"},
  };
  for (const Case& c : cases) {
    const auto corpus = random_corpus(random, c.lines, c.systems);
    std::string arguments = write_lines("ref.txt", corpus[0]) + " -i";
    for (int s = 1; s <= c.systems; ++s) {
      arguments += " " + write_lines("system" + std::to_string(s) + ".txt", corpus[s]);
    }
    expect_same(c.environment, arguments + " " + c.options);
  }
}

// -b with -ci prints as sacreBLEU's print_single_results: a score whose μ is 0 carries no
// interval and no '=' and is printed first, the others aligned at their '='. Where
// sacreBLEU then prints that score twice and TER never (it zips the alignments with the
// lines from the first), each line is printed once here: pinned, not compared.
TEST_F(SacreBleuSignificance, ScoreOnlyWithIntervals) {
  const std::string arguments =
      write_lines("ref.txt", {"abcdef ghijkl", "mnopqr stuvwx yz"}) + " -i " +
      write_lines("system.txt", {"abcdeg ghijkm", "mnopqs stuvwy zz"});
  const thpc::ProcessResult ours = run_score(arguments + " -m bleu chrf ter -ci -cin 30 -b");
  ASSERT_EQ(ours.exit_code, 0) << ours.output;
  // sacreBLEU 2.6.0 prints "0.0", "     0.0", "45.4 (μ = 45.7 ± 2.0)" and no TER.
  EXPECT_EQ(ours.output,
            "0.0\n 45.4 (\u03bc = 45.7 \u00b1 2.0)\n100.0 (\u03bc = 100.0 \u00b1 0.0)\n");
  expect_same("", arguments + " -m ter chrf -ci -cin 30 -b -w 4");
  expect_same("", arguments + " -m chrf ter bleu -ci -cin 1 -b");
}

// Corners the random corpora above miss: a system equal to the baseline (every sample's
// difference 0, a tie that > does not count), add-k with a k float32 cannot hold (NumPy
// rounds k to float32 before adding), short lines where approximate randomization's
// add-k (k truncated in int64 arrays) decides between a smoothed precision and none,
// three references (TER's lengths in thirds, summed in float32 per sample), chrF orders
// that only the hypotheses have, eps smoothing, and TER on an empty reference.
TEST_F(SacreBleuSignificance, SamplingCorners) {
  std::mt19937 random(31);
  const auto corpus = random_corpus(random, 50, 4);
  const std::string references = write_lines("ref.txt", corpus[0]) + " " +
                                 write_lines("ref2.txt", corpus[3]) + " " +
                                 write_lines("ref3.txt", corpus[4]);
  const std::string system = write_lines("system1.txt", corpus[1]);
  expect_same("", references + " -i " + system + " " + write_lines("same.txt", corpus[1]) +
                      " " + write_lines("system2.txt", corpus[2]) + " -m ter bleu chrf -pbs -w 10");
  expect_same("", references + " -i " + system + " -m ter chrf -ci -w 10");
  expect_same("", references + " -i " + system + " -m chrf -ci -w 12 --chrf-eps-smoothing");
  expect_same("", write_lines("ref.txt", corpus[0]) + " -i " + system +
                      " -m bleu -ci -w 16 -s add-k -sv 0.01");
  expect_same("", write_lines("ref.txt", corpus[0]) + " -i " + system + " " +
                      write_lines("system2.txt", corpus[2]) +
                      " -m bleu -pbs -w 16 -s add-k -sv 0.01");
  const std::vector<std::string> reference = {"a b c d e", "f g h", "i j k l", "m n"};
  expect_same("", write_lines("short.txt", reference) + " -i " +
                      write_lines("short1.txt", {"a b c d x", "f g h", "i j x l", "m"}) + " " +
                      write_lines("short2.txt", {"a b x d e", "f x h", "i j k l", "m n"}) +
                      " -m bleu -par -parn 300 -s add-k -sv 0.5 -w 6");
  // References shorter than the hypotheses: orders with hypothesis n-grams and no
  // reference ones, which chrF's effective orders leave out.
  expect_same("", write_lines("tiny.txt", {"ab", "cd e"}) + " -i " +
                      write_lines("long.txt", {"abcdefg", "c"}) + " -m chrf -ci -cin 20 -w 10");
  // An empty reference: samples of it alone score TER 100 * 1.0, a Python float, and
  // NumPy's arrays of the samples' scores are float64, not float32.
  expect_same("", write_lines("gaps.txt", {"", "a b c"}) + " -i " +
                      write_lines("gaps1.txt", {"x y", "a x c"}) + " " +
                      write_lines("gaps2.txt", {"z", "a c"}) + " -m ter -pbs -pbsn 100 -w 12");
}

// Counts sacreBLEU takes below 1: -cin 0 or 1 is no interval, -pbsn and -parn of 0 or less
// their defaults (the signature says which).
TEST_F(SacreBleuSignificance, CountsBelowOne) {
  std::mt19937 random(5);
  const auto corpus = random_corpus(random, 12, 2);
  const std::string one = write_lines("ref.txt", corpus[0]) + " -i " +
                          write_lines("system1.txt", corpus[1]);
  const std::string two = one + " " + write_lines("system2.txt", corpus[2]);
  expect_same("", one + " -m bleu chrf -ci -cin 0");
  expect_same("", one + " -m ter -ci -cin -3 -w 3");
  expect_same("", two + " -m bleu -pbs -pbsn 0");
  expect_same("", two + " -m chrf -par -parn -1");
}

// Approximate randomization with three references: TER's average reference lengths are
// thirds, and sacreBLEU sums a pseudo-system's as pos_sel @ bl_stats + neg_sel @
// sys_stats, the baseline's rows and the system's each in segment order, then the two sums:
// not the sum in segment order. Systems that differ in a few lines make many trials' |a −
// b| equal to the actual difference, where the last bit decides the p-value.
TEST_F(SacreBleuSignificance, RandomizedTerWithFractionalLengths) {
  std::mt19937 random(17);
  const auto corpus = random_corpus(random, 80, 4);
  std::vector<std::string> close = corpus[1];
  for (size_t i = 0; i < close.size(); i += 16) close[i] = corpus[2][i];
  const std::string arguments =
      write_lines("ref.txt", corpus[0]) + " " + write_lines("ref2.txt", corpus[3]) + " " +
      write_lines("ref3.txt", corpus[4]) + " -i " +
      write_lines("system1.txt", corpus[1]) + " " + write_lines("close.txt", close) + " " +
      write_lines("system2.txt", corpus[2]);
  expect_same("", arguments + " -m ter -par -parn 2000 -w 6");
  expect_same("", arguments + " -m ter bleu -par -parn 500 -w 6 --ter-normalized");
}

// Without -i, standard input's tab-separated columns are the systems, as sacreBLEU reads
// them: "System 1", "System 2" (with a paired test "Baseline", "System 1", and the heading's
// "compared to ."), universal newlines, the first line's fields not stripped.
TEST_F(SacreBleuSignificance, StandardInputColumnsAreSystems) {
  std::mt19937 random(5);
  const auto corpus = random_corpus(random, 40, 3);
  // (An empty last field would be stripped away with the line, in sacreBLEU too.)
  const auto field = [](const std::string& text) { return text.empty() ? "x" : text; };
  std::vector<std::string> rows;
  for (size_t i = 0; i < corpus[0].size(); ++i) {
    rows.push_back(field(corpus[1][i]) + (i == 0 ? " \t" : "\t") + field(corpus[2][i]) + "\t" +
                   field(corpus[3][i]) + (i % 7 == 3 ? " " : ""));
  }
  const std::string reference = write_lines("ref.txt", corpus[0]);
  const std::string columns = write_lines("columns.txt", rows);
  expect_same("", reference + " -m bleu chrf --chrf-whitespace -w 6 < " + columns);
  expect_same("", reference + " -m ter bleu -pbs -pbsn 100 -w 3 < " + columns);
  expect_same("", reference + " -m bleu -par -parn 100 -f json < " + columns);
  // One column, its lines ended by \r, \r\n and \n: one system, as a file of them.
  std::string mixed;
  for (size_t i = 0; i < corpus[1].size(); ++i) {
    mixed += corpus[1][i] + (i % 3 == 0 ? "\r" : i % 3 == 1 ? "\r\n" : "\n");
  }
  std::ofstream(dir / "mixed.txt", std::ios::binary) << mixed;
  expect_same("", reference + " -m bleu chrf -w 6 < " + (dir / "mixed.txt").string());
  // Lines of other field counts: refused, the line named (sacreBLEU exits 17).
  std::ofstream(dir / "ragged.txt") << "a b\tc d\ne f\n";
  const thpc::ProcessResult ragged = run_score(
      write_lines("two.txt", {"a b", "e f"}) + " < " + (dir / "ragged.txt").string() + " 2>&1");
  EXPECT_EQ(ragged.exit_code, 1) << ragged.output;
  EXPECT_NE(ragged.output.find("<stdin>: line 2 has 1 tab-separated fields, line 1 has 2"),
            std::string::npos)
      << ragged.output;
  // What several systems cannot do, said once they are counted (exit 2, a usage error).
  const thpc::ProcessResult confidence =
      run_score(reference + " -ci < " + columns + " 2>&1");
  EXPECT_EQ(confidence.exit_code, 2) << confidence.output;
  EXPECT_NE(confidence.output.find("--confidence is for one system"), std::string::npos)
      << confidence.output;
}

// -f latex: tabulate's latex_booktabs of the same table (a p-value after its score on the
// row's one line, LaTeX's specials escaped in the names and headers); one system: the text.
TEST_F(SacreBleuSignificance, LatexTablesAsSacreBleu) {
  std::mt19937 random(11);
  const auto corpus = random_corpus(random, 50, 3);
  const std::string arguments = write_lines("ref.txt", corpus[0]) + " -i " +
                                write_lines("sys_1#x~y.txt", corpus[1]) + " " +
                                write_lines("system{2}^.txt", corpus[2]) + " " +
                                write_lines("3.txt", corpus[3]);
  expect_same("", arguments + " -m bleu chrf ter -w 2 -f latex");
  expect_same("", arguments + " -m chrf bleu -pbs -pbsn 100 -f latex");
  expect_same("", arguments + " -m ter -par -parn 100 -w 3 -f latex");
  expect_same("", write_lines("one.txt", corpus[0]) + " -i " +
                      write_lines("hyp.txt", corpus[1]) + " -m bleu chrf -ci -cin 50 -f latex");
}

// Where sacreBLEU refuses, so does transformer_score (exit 2, a line that says why).
TEST(SignificanceProgram, RefusedCombinations) {
  THPC_REQUIRE_DATA("sacrebleu_tests/wmt17_en-de");
  const std::string one = kWmt17Ref + " -i " + kWmt17 + "/newstest2017.xmu.4910.en-de";
  const std::string two = one + " " + kWmt17 + "/newstest2017.KIT.4950.en-de";
  const std::vector<std::pair<std::string, std::string>> refused = {
      {one + " -pbs", "paired tests require several systems"},
      {two + " -ci", "--confidence is for one system"},
      {two + " -sl", "only one system can be evaluated in sentence-level mode"},
      {one + " -sl -ci", "statistical tests"},
      {two + " -pbs -par", "one paired test at a time"},
      {one + " -ci -cin 1000001", "--confidence-n 1000001 is above 1000000"},
      {two + " -par -parn 2000000", "--paired-ar-n 2000000 is above"},
      {two + " --tokenize moses", "multi-bleu.perl"},
      {one + " " + kWmt17 + "/newstest2017.xmu.4910.en-de", "is given twice"},
  };
  for (const auto& [arguments, message] : refused) {
    const thpc::ProcessResult result = run_score(arguments + " 2>&1");
    EXPECT_EQ(result.exit_code, 2) << arguments << "\n" << result.output;
    EXPECT_NE(result.output.find(message), std::string::npos) << arguments << "\n"
                                                              << result.output;
  }
  // A paired test drops the baseline named again, as sacreBLEU does.
  const thpc::ProcessResult again =
      run_score(two + " " + kWmt17 + "/newstest2017.xmu.4910.en-de -pbs -pbsn 10 2>&1");
  EXPECT_EQ(again.exit_code, 0) << again.output;
  ::setenv("SACREBLEU_SEED", "x", 1);
  const thpc::ProcessResult bad_seed = run_score(one + " -ci 2>&1");
  ::unsetenv("SACREBLEU_SEED");
  EXPECT_NE(bad_seed.exit_code, 0);
  EXPECT_NE(bad_seed.output.find("SACREBLEU_SEED='x' is not a seed"), std::string::npos)
      << bad_seed.output;
}

}  // namespace
