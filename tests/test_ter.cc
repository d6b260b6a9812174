// TER against sacreBLEU 2.x (its port of Tercom): sacreBLEU's own cases, Tercom's normalizer
// on text that gives each rule work, inputs where each of Tercom's limits changes the edits,
// the 16 WMT17 En→De systems against sacreBLEU's TER and Tercom's own ($THPC_DATA/
// sacrebleu_tests, SCORES.tsv), transformer_score -m ter as a program, and, when sacreBLEU is
// installed, `python -m sacrebleu -m ter` on the same files and on random text.
//
// The expected values were printed by sacreBLEU 2.6.0; where a limit is concerned, also with
// that limit raised in sacrebleu.metrics.lib_ter (the edits the comment gives).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
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
#include "metrics/ter.h"
#include "metrics/tokenize.h"
#include "sacrebleu_peer.h"
#include "scratch_directory.h"

namespace {

using thpc::metrics::TerOptions;
using thpc::metrics::TerScorer;

const std::string kData = thpc::data_root() + "/sacrebleu_tests";
const std::string kSmall = kData + "/small";
const std::string kWmt17 = kData + "/wmt17_en-de";
const std::string kWmt17Ref = kWmt17 + "/newstest2017-ende-ref.de";

using thpc::fixed;

double ter(const std::vector<std::string>& hypotheses,
           const std::vector<std::vector<std::string>>& references, TerOptions options = {}) {
  return thpc::metrics::corpus_ter(hypotheses, references, options);
}

// The words of a space-separated UTF-8 text.
std::vector<std::u32string> words(const std::string& text) {
  const std::u32string decoded = *thpc::metrics::decode_utf8(text);
  std::vector<std::u32string> out;
  for (std::u32string_view word : thpc::metrics::python_split(decoded)) out.emplace_back(word);
  return out;
}

int64_t edits(const std::string& hypothesis, const std::string& reference) {
  return thpc::metrics::translation_edit_rate(words(hypothesis), words(reference)).edits;
}

// "w{first} ... w{last - 1}"
std::string numbered_words(int first, int last) {
  std::string text;
  for (int i = first; i < last; ++i) text += (text.empty() ? "w" : " w") + std::to_string(i);
  return text;
}

// ---- by hand ----

// sacreBLEU's test_ter.py, each case its own corpus.
TEST(TerByHand, SacreBleusOwnCases) {
  EXPECT_EQ(ter({"aaaa bbbb cccc dddd"}, {{"aaaa bbbb cccc dddd"}}), 0.0);
  EXPECT_EQ(ter({"dddd eeee ffff"}, {{"aaaa bbbb cccc"}}), 100.0);  // 3 substitutions
  EXPECT_EQ(ter({""}, {{"a"}}), 100.0);  // an insertion
  EXPECT_EQ(ter({"a"}, {{""}}), 100.0);  // no reference words: 100 where there are edits
  EXPECT_EQ(ter({""}, {{""}}), 0.0);     // ... and 0 where there are none
  // One shift of "a b c" to the front fixes it: 1 edit in 8 words.
  EXPECT_EQ(edits("d e f g h a b c", "a b c d e f g h"), 1);
  EXPECT_EQ(ter({"d e f g h a b c"}, {{"a b c d e f g h"}}), 12.5);
  // Their "realistic example from WMT dev data (2019)": 17 edits in 125 words (10, 0, 2,
  // 5, 0 by segment), the double sacreBLEU prints.
  const std::vector<std::string> hypotheses = {
      "wählen Sie \" Bild neu berechnen , \" um beim Ändern der Bildgröße Pixel hinzuzufügen "
      "oder zu entfernen , damit das Bild ungefähr dieselbe Größe aufweist wie die andere "
      "Größe .",
      "wenn Sie alle Aufgaben im aktuellen Dokument aktualisieren möchten , wählen Sie im Menü "
      "des Aufgabenbedienfelds die Option \" Alle Aufgaben aktualisieren . \"",
      "klicken Sie auf der Registerkarte \" Optionen \" auf die Schaltfläche \" "
      "Benutzerdefiniert \" und geben Sie Werte für \" Fehlerkorrektur-Level \" und \" Y / "
      "X-Verhältnis \" ein .",
      "Sie können beispielsweise ein Dokument erstellen , das ein Auto über die Bühne "
      "enthält .",
      "wählen Sie im Dialogfeld \" Neu aus Vorlage \" eine Vorlage aus und klicken Sie auf \" "
      "Neu . \""};
  const std::vector<std::string> references = {
      "wählen Sie \" Bild neu berechnen , \" um beim Ändern der Bildgröße Pixel hinzuzufügen "
      "oder zu entfernen , damit die Darstellung des Bildes in einer anderen Größe beibehalten "
      "wird .",
      hypotheses[1],
      "klicken Sie auf der Registerkarte \" Optionen \" auf die Schaltfläche \" "
      "Benutzerdefiniert \" und geben Sie für \" Fehlerkorrektur-Level \" und \" Y / "
      "X-Verhältnis \" niedrigere Werte ein .",
      "Sie können beispielsweise ein Dokument erstellen , das ein Auto enthalt , das sich über "
      "die Bühne bewegt .",
      hypotheses[4]};
  const TerScorer scorer({references}, {});
  const thpc::metrics::TerStatistics statistics = scorer.corpus_statistics(hypotheses);
  EXPECT_EQ(statistics.edits, 17);
  EXPECT_EQ(statistics.reference_length, 125.0);
  EXPECT_EQ(fixed(scorer.corpus_score(hypotheses), 15), "13.600000000000001");
  const std::vector<int64_t> by_segment = {10, 0, 2, 5, 0};
  for (size_t i = 0; i < hypotheses.size(); ++i) {
    EXPECT_EQ(scorer.segment_statistics(i, hypotheses[i]).edits, by_segment[i]) << i;
  }
}

// Each of Tercom's limits (sacreBLEU's constants) changes the edits of one input: raising the
// limit in sacreBLEU gives the edits in the comment instead.
TEST(TerByHand, EachOfTercomsLimitsChangesTheEdits) {
  // A run of 11 words moved to the front: shifts move at most 10 words, so two shifts (1
  // with a limit of 11).
  EXPECT_EQ(edits(numbered_words(29, 40) + " " + numbered_words(0, 29), numbered_words(0, 40)),
            2);
  // Three words moved 50 positions take one shift; moved 51 they cannot (no run moves more
  // than 50), and the other 51 words move instead, in runs of 10 (6 edits; 1 with 51).
  EXPECT_EQ(edits(numbered_words(3, 53) + " " + numbered_words(0, 3), numbered_words(0, 53)),
            1);
  EXPECT_EQ(edits(numbered_words(3, 54) + " " + numbered_words(0, 3), numbered_words(0, 54)),
            6);
  // The same 50 positions the other way: the run ahead of where the reference has it.
  EXPECT_EQ(edits(numbered_words(0, 53), numbered_words(3, 53) + " " + numbered_words(0, 3)),
            1);
  // 3 words against 150 (ratio 50): the first row's beam of ±25 about column 50 misses w23
  // (column 24), 150 edits (149 with a beam of ±26).
  EXPECT_EQ(edits("w23 w99 w149", numbered_words(0, 150)), 150);
  // 2 words against 150 (ratio 75 > 2 · 25): the beam widens to ⌈75 / 2 + 25⌉ = 63, the
  // first row's columns 12..137, which reach w136 (150 edits with a beam of 62).
  EXPECT_EQ(edits("w136 w149", numbered_words(0, 150)), 149);
  // Repeated words give many shift candidates: the search stops after 1,000 (34 edits; 20
  // with no limit). 60 words of five kinds and a shuffle of them (Python's random, seed 5).
  const std::string reference =
      "e c c e a d b a b a c d b d e a e b a b d c b d b a b e e d b b a a b b b b c c b e b b "
      "b d c a c d b b c a c c e e a e";
  const std::string hypothesis =
      "a b a b c b c a d a c e a e d d b b b e c b b e a b e b a d b c e e b d b b e a c c e e "
      "c a a b d d b b c c b b a c d b";
  EXPECT_EQ(edits(hypothesis, reference), 34);
  // Here the 1,000th candidate is checked in the search for the fourth shift, which is then
  // dropped (10 edits; 9 with a limit of 1,001).
  EXPECT_EQ(edits("c a b a d b b b c d d a a b b a b d a b d c d a c d c c d a a c c d c b d c "
                  "b a b d",
                  "c d d b b c a d b c a a b b b c d a a c c d c d a d c d a b d a b d c b b c a "
                  "a b d"),
            10);
}

TEST(TerByHand, SeveralReferencesTakeTheFewestEditsAndTheMeanLength) {
  // 1 edit against "a b c d", 3 against "x"; the length is (4 + 1) / 2.
  EXPECT_EQ(ter({"a b c"}, {{"a b c d"}, {"x"}}), 40.0);
  const TerScorer scorer({{"a b c d"}, {"x"}}, {});
  EXPECT_EQ(scorer.segment_statistics(0, "a b c").reference_length, 2.5);
}

TEST(TerByHand, LowercasedUnlessCaseSensitive) {
  EXPECT_EQ(ter({"Das Haus"}, {{"das haus"}}), 0.0);
  TerOptions options;
  options.case_sensitive = true;
  EXPECT_EQ(ter({"Das Haus"}, {{"das haus"}}, options), 100.0);
}

// sacreBLEU tokenizes a reference twice (Metric._cache_references, then
// TER._extract_reference_info) and a hypothesis once; with --ter-normalized the second pass
// changes words: "jim's<TAB>car" -> "jim's car" -> "jim 's car". sacreBLEU 2.6.0's scores.
TEST(TerByHand, NormalizedReferencesAreTokenizedTwiceAsSacreBleuDoes) {
  TerOptions normalized;
  normalized.normalized = true;
  EXPECT_EQ(ter({"jim 's car"}, {{"jim's\tcar"}}, normalized), 0.0);
  EXPECT_EQ(ter({"it 's x"}, {{"it's\u00a0x"}}, normalized), 0.0);
  EXPECT_EQ(ter({". , 1 a"}, {{".,1 a"}}, normalized), 0.0);
  // A hypothesis is tokenized once: "jim's car" against "jim 's car", 2 edits in 3 words.
  EXPECT_EQ(fixed(ter({"jim's\tcar"}, {{"jim 's car"}}, normalized), 12), "66.666666666667");
  EXPECT_EQ(thpc::metrics::sentence_ter("jim 's car", {"jim's\tcar", "x"}, normalized), 0.0);
  // Not normalized, the second pass changes nothing: "jim's" is one word, "jim 's" two.
  EXPECT_EQ(ter({"jim 's car"}, {{"jim's\tcar"}}), 100.0);
}

// ---- Tercom's normalizer ----

TEST(TercomTokenizer, AsSacreBleusTercomTokenizer) {
  TerOptions normalized;
  normalized.normalized = true;
  TerOptions no_punct;
  no_punct.no_punct = true;
  TerOptions asian = normalized;
  asian.asian_support = true;
  TerOptions asian_no_punct = no_punct;
  asian_no_punct.asian_support = true;
  TerOptions mixed_case = normalized;
  mixed_case.case_sensitive = true;
  struct Case {
    std::string text;
    TerOptions options;
    std::string expected;
  };
  const std::vector<Case> cases = {
      // sacreBLEU's test_tokenizer_ter.py
      {"a b c d", {}, "a b c d"},
      {"", {}, ""},
      {"A B C D.", {}, "a b c d."},
      {"A ; B ) C : D.", no_punct, "a b c d"},
      {"a b (c) d.", normalized, "a b ( c ) d ."},
      {"Jim's car.", normalized, "jim 's car ."},
      {"4.2", normalized, "4.2"},
      {"美众院公布对特", asian, "美 众 院 公 布 对 特"},
      {"りの拳銃を持", asian, "りの 拳 銃 を 持"},
      // each rule at work
      {"It costs 3.14, or 1,5 &amp; &quot;more&quot; (1990-2000)!", normalized,
       "it costs 3.14 , or 1,5 & \" more \" ( 1990 - 2000 ) !"},
      {"It costs 3.14, or 1,5 &amp; &quot;more&quot; (1990-2000)!", no_punct,
       "it costs 314 or 15 &amp &quotmore&quot 1990-2000"},
      // the escapes undone once, in their order; the possessive after a split ';'
      {"&AMP;quot; 'S end's", normalized, "& quot ; 's end 's"},
      {"&AMP;quot; 'S end's", mixed_case, "& AMP ; quot ; 'S end 's"},
      {"a.b,c", normalized, "a . b , c"},
      {"US$5 {x} [y] <z> ~", normalized, "us $ 5 { x } [ y ] < z > ~"},
      {"東京、大阪。（ｘ）！", normalized, "東京、大阪。（ｘ）！"},
      {"東京、大阪。（ｘ）！", asian, "東 京 、 大 阪 。 （ ｘ ） ！"},
      {"東京、大阪。（ｘ）！", asian_no_punct, "東京大阪ｘ"},
      {"東京、大阪。（ｘ）！", no_punct, "東京、大阪。（ｘ）！"},
      // U+3231 (sacreBLEU's range U+3200..U+3F22) and U+337F (CJK compatibility)
      {"株式会社㈱abc㍿x", asian, "株 式 会 社 ㈱ abc ㍿ x"},
      // Python's str.lower(): İ becomes i and a combining dot, a final Σ ς
      {"İstanbul ΣΟΦΙΑΣ", {}, "i\u0307stanbul σοφιας"},
  };
  for (const Case& c : cases) {
    const std::u32string tokenized =
        thpc::metrics::tercom_tokenize(*thpc::metrics::decode_utf8(c.text), c.options);
    EXPECT_EQ(thpc::metrics::encode_utf8(tokenized), c.expected) << c.text;
  }
}

// ---- the scorer ----

TEST(TerScorerTest, SignatureAsSacreBleu) {
  EXPECT_EQ(TerScorer({{"a"}}, {}).signature(),
            "nrefs:1|case:lc|tok:tercom|norm:no|punct:yes|asian:no|version:2.x-compatible");
  TerOptions options;
  options.case_sensitive = options.normalized = options.no_punct = options.asian_support = true;
  EXPECT_EQ(TerScorer({{"a"}, {"b"}}, options).signature(),
            "nrefs:2|case:mixed|tok:tercom|norm:yes|punct:no|asian:yes|version:2.x-compatible");
}

TEST(TerScorerTest, BadInputIsAnErrorNamingIt) {
  thpc::expect_error([] { TerScorer({{"ok", "bad \xFF"}}, {}); }, {"reference 1, segment 2"});
  const TerScorer scorer({{"ok"}}, {});
  thpc::expect_error([&] { scorer.corpus_score({"a", "b"}); },
                     {"2 hypotheses for 1 reference segments"});
  thpc::expect_error([&] { scorer.corpus_score({"\xC3"}); }, {"hypothesis segment 1"});
}

// ---- WMT17 ----

TEST(TerWmt17, SixteenSystemsAsSacreBleuAndTercom) {
  THPC_REQUIRE_DATA("sacrebleu_tests/wmt17_en-de/SCORES.tsv");
  const auto rows = thpc::scores_tsv(kWmt17 + "/SCORES.tsv",
                                     {"sacrebleu_ter", "expected_tercom_ter(test.sh)"});
  ASSERT_EQ(rows.size(), 16u);
  const TerScorer scorer({thpc::metrics::read_segments(kWmt17Ref)}, {});
  for (const auto& [file, columns] : rows) {
    SCOPED_TRACE(file);
    const double score = scorer.corpus_score(thpc::metrics::read_segments(kWmt17 + "/" + file));
    // sacreBLEU's, six decimals: the same digits.
    EXPECT_EQ(fixed(score, 6), columns[0]);
    // Tercom's own (Java, test.sh), a rate with three decimals: within half a unit.
    ASSERT_FALSE(columns[1].empty());
    EXPECT_NEAR(score / 100, std::stod(columns[1]), 5e-4 + 1e-12);
  }
}

// ---- the program ----

using thpc::run_score;

const std::string kUedin = kWmt17 + "/newstest2017.uedin-nmt.4722.en-de";

TEST(TerProgram, TerLineAndScoreOnly) {
  THPC_REQUIRE_DATA("sacrebleu_tests/wmt17_en-de");
  const auto rows = thpc::scores_tsv(kWmt17 + "/SCORES.tsv", {"sacrebleu_ter"});
  const std::string expected = rows.at("newstest2017.uedin-nmt.4722.en-de")[0];
  thpc::ProcessResult result = run_score(kWmt17Ref + " -i " + kUedin + " -m ter -w 6");
  ASSERT_EQ(result.exit_code, 0) << result.output;
  EXPECT_EQ(result.output,
            "TER|nrefs:1|case:lc|tok:tercom|norm:no|punct:yes|asian:no|version:2.x-compatible = " +
                expected + "\n");
  result = run_score(kWmt17Ref + " -m ter -b -w 6 < " + kUedin);
  EXPECT_EQ(result.output, expected + "\n");
  result = run_score(kWmt17Ref + " -i " + kUedin +
                     " -m ter -b -w 6 --ter-normalized --ter-no-punct --ter-case-sensitive");
  EXPECT_EQ(result.exit_code, 0) << result.output;
  EXPECT_NE(result.output, expected + "\n");  // the options reach the scorer
}

TEST(TerProgram, ThreeMetricsAlignedAsSacreBleuPrintsThem) {
  THPC_REQUIRE_DATA("sacrebleu_tests/wmt17_en-de");
  const thpc::ProcessResult result =
      run_score(kWmt17Ref + " -i " + kUedin + " -m ter bleu chrf -w 2");
  ASSERT_EQ(result.exit_code, 0) << result.output;
  std::vector<std::string> lines;
  std::stringstream stream(result.output);
  for (std::string line; std::getline(stream, line);) lines.push_back(line);
  ASSERT_EQ(lines.size(), 3u) << result.output;
  // By name, as sacreBLEU: BLEU, chrF2, TER, their " = " in one column.
  EXPECT_EQ(lines[0].find("BLEU|"), lines[0].find_first_not_of(' '));
  EXPECT_NE(lines[1].find("chrF2|"), std::string::npos);
  EXPECT_EQ(lines[2].rfind("TER|", 0), 0u);
  EXPECT_EQ(lines[0].find(" = "), lines[2].find(" = "));
  EXPECT_EQ(lines[1].find(" = "), lines[2].find(" = "));
}

struct TerProgramFiles : thpc::ScratchDirectoryTest {
  std::string write(const std::string& name, const std::string& text) {
    std::ofstream(path(name), std::ios::binary) << text;
    return path(name);
  }
};

TEST_F(TerProgramFiles, SentenceLevelOneLinePerSegment) {
  const std::string files = write("ref.txt", "a b c\nx\n") + " -i " +
                            write("hyp.txt", "a b c\nx y\n");
  const thpc::ProcessResult result = run_score(files + " -m ter -sl -b -w 1");
  ASSERT_EQ(result.exit_code, 0) << result.output;
  EXPECT_EQ(result.output, "0.0\n100.0\n");
}

// ---- against Python's sacreBLEU, when it is installed ----

struct SacreBleuTer : thpc::SacreBleuPeer {
  SacreBleuTer() : SacreBleuPeer("the fixed expected values above still check TER") {}
};

// Lines that give TER's rules work: references whose words come back in the hypothesis in
// moved runs (shifts of every size, some over the limits), with words replaced, dropped and
// repeated; lines far shorter than their reference (the beam); Tercom's normalizer's
// material (possessives, HTML escapes, digits with . , -, ASCII symbols, CJK and full-width
// punctuation), case pairs, Python's lowercase, words apart by any of Python's whitespace;
// some lines empty.
struct RandomPairs {
  std::vector<std::string> hypotheses, references, second_references;
};
RandomPairs random_pairs(std::mt19937& random, int count) {
  const std::vector<std::string> pieces = {
      "Haus", "haus", "HAUS", "der", "die", "das", "Jim's", "'s", "it's", "&quot;", "&amp;",
      "&lt;x&gt;", "&QUOT;", "(hi)", "end.", ".", ",", "-", "1990-2000", "3.14", "1,5", "a.b",
      "x,y", "\"x\"", "日本語", "美众院", "りの拳銃を持", "、", "。", "！", "（ｘ）",
      "İstanbul", "ΣΟΦΙΑΣ", "😀", "?", ":", ";", "a", "b", "c", "d", "e", "Straße", "$5",
      "{y}", "[z]", "'"};
  const auto pick = [&] { return pieces[random() % pieces.size()]; };
  const auto line = [&](int words) {
    std::vector<std::string> out;
    for (int w = 0; w < words; ++w) out.push_back(pick());
    return out;
  };
  // Words apart by a space mostly, sometimes by Python's other whitespace (which the
  // normalizer's possessive rule, written with a space, does not take for one).
  const std::vector<std::string> spaces = {" ", " ", " ", "  ", "\t", "\u00a0", "\u3000"};
  const auto join = [&](const std::vector<std::string>& words) {
    std::string text;
    for (const std::string& word : words) {
      text += (text.empty() ? "" : spaces[random() % spaces.size()]) + word;
    }
    return text;
  };
  const auto between = [&](int low, int high) {
    return std::uniform_int_distribution<int>(low, high)(random);
  };
  RandomPairs pairs;
  for (int i = 0; i < count; ++i) {
    const int kind = between(0, 19);
    std::vector<std::string> reference = line(between(1, 30));
    std::vector<std::string> hypothesis;
    if (kind == 0) {
      reference.clear();
      hypothesis = line(3);
    } else if (kind == 1) {
      // hypothesis empty
    } else if (kind == 2) {
      reference = line(between(60, 120));
      hypothesis = line(between(1, 3));
    } else if (kind < 12) {
      hypothesis = reference;
      for (int moves = between(0, 4); moves > 0 && hypothesis.size() > 3; --moves) {
        const int start = between(0, static_cast<int>(hypothesis.size()) - 1);
        const int end = std::min<int>(hypothesis.size(), start + between(1, 12));
        std::vector<std::string> run(hypothesis.begin() + start, hypothesis.begin() + end);
        hypothesis.erase(hypothesis.begin() + start, hypothesis.begin() + end);
        const int to = between(0, static_cast<int>(hypothesis.size()));
        hypothesis.insert(hypothesis.begin() + to, run.begin(), run.end());
      }
      for (int changes = between(0, 3); changes > 0 && !hypothesis.empty(); --changes) {
        hypothesis[between(0, static_cast<int>(hypothesis.size()) - 1)] = pick();
      }
    } else {
      hypothesis = line(between(1, 25));
    }
    pairs.hypotheses.push_back(join(hypothesis));
    pairs.references.push_back(join(reference));
    pairs.second_references.push_back(join(line(between(0, 20))));
  }
  return pairs;
}

TEST_F(SacreBleuTer, SameLinesOnRandomText) {
  std::mt19937 random(53);
  const RandomPairs pairs = random_pairs(random, 200);
  const std::string hypothesis = write_lines("hyp.txt", pairs.hypotheses);
  const std::string reference1 = write_lines("ref1.txt", pairs.references);
  const std::string reference2 = write_lines("ref2.txt", pairs.second_references);
  const std::string one = reference1 + " -i " + hypothesis;
  const std::string two = reference1 + " " + reference2 + " -i " + hypothesis;
  // Twelve decimals: the same double, not merely the same rounding.
  for (const char* options : {" -m ter -w 12", " -m ter -w 12 --ter-case-sensitive",
                              " -m ter -w 12 --ter-normalized --ter-asian-support",
                              " -m ter -w 12 --ter-no-punct --ter-asian-support",
                              " -m bleu chrf ter -w 12 --ter-normalized --ter-no-punct"}) {
    expect_same_output(one + options);
  }
  expect_same_output(two + " -m ter -w 12 --ter-normalized");
  expect_same_output(two + " -m ter -w 12 -sl --ter-normalized --ter-case-sensitive");
}

TEST_F(SacreBleuTer, SameLinesOnTheTestVectors) {
  THPC_REQUIRE_DATA("sacrebleu_tests/small");
  THPC_REQUIRE_DATA("sacrebleu_tests/wmt17_en-de");
  expect_same_output(kWmt17Ref + " -i " + kWmt17 + "/newstest2017.online-A.0.en-de -m ter -w 12");
  expect_same_output(kSmall + "/readme_example.ref1 " + kSmall + "/readme_example.ref2 -i " +
                     kSmall + "/readme_example.hyp -m ter -w 12 -sl --ter-normalized");
}

}  // namespace
