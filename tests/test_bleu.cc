// BLEU against sacreBLEU 2.x: the vectors of sacreBLEU's own unit tests
// ($THPC_DATA/sacrebleu_tests/small, see tests/data_dir.h), the 16 WMT17 En→De systems with sacreBLEU's
// n-gram counts (SCORES.tsv), the tokenizers rule by rule, and transformer_score run
// as a program, bad input included.
#include <gtest/gtest.h>
#include <sentencepiece_trainer.h>

#include <pwd.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "data_dir.h"
#include "program.h"
#include "common/error.h"
#include "common/still_working.h"
#include "expect_error.h"
#include "metrics/bleu.h"
#include "metrics/chrf.h"
#include "metrics/sentencepiece_tokenizer.h"
#include "metrics/tokenize.h"
#include "sacrebleu_peer.h"
#include "scoped_environment.h"

namespace {

using thpc::metrics::BleuOptions;
using thpc::metrics::BleuScore;
using thpc::metrics::BleuScorer;
using thpc::metrics::BleuStatistics;
using thpc::metrics::Smoothing;
using thpc::metrics::TokenizerKind;

const std::string kData = thpc::data_root() + "/sacrebleu_tests";
const std::string kSmall = kData + "/small";
const std::string kWmt17 = kData + "/wmt17_en-de";

std::vector<std::string> read(const std::string& path) {
  return thpc::metrics::read_segments(path);
}

std::string fixed(double value, int decimals) {
  char buffer[64];
  std::snprintf(buffer, sizeof(buffer), "%.*f", decimals, value);
  return buffer;
}

std::string tokenize(const std::string& text, TokenizerKind kind) {
  return thpc::metrics::tokenize_utf8(text, kind);
}

// ---- tokenizers ----

TEST(Tokenize13a, SplitsPunctuationButKeepsNumbersWhole) {
  EXPECT_EQ(tokenize("The dog bit the man.", TokenizerKind::k13a), "The dog bit the man .");
  EXPECT_EQ(tokenize("It wasn't surprising.", TokenizerKind::k13a), "It wasn't surprising .");
  EXPECT_EQ(tokenize("pi is 3.14, not 1,000.", TokenizerKind::k13a),
            "pi is 3.14 , not 1,000 .");
  EXPECT_EQ(tokenize("1990-2000 well-known", TokenizerKind::k13a), "1990 - 2000 well-known");
  EXPECT_EQ(tokenize("(a) [b] {c} \"d\" x/y a@b ~ ^ $5 #1 50% a&b;c:d?e!",
                     TokenizerKind::k13a),
            "( a ) [ b ] { c } \" d \" x / y a @ b ~ ^ $ 5 # 1 50 % a & b ; c : d ? e !");
  EXPECT_EQ(tokenize("end.", TokenizerKind::k13a), "end .");
  EXPECT_EQ(tokenize("1.", TokenizerKind::k13a), "1 .");  // the padding space splits it
  EXPECT_EQ(tokenize("a..b", TokenizerKind::k13a), "a . . b");
  // The ends of the symbol ranges split off inside a word too (sacreBLEU 2.6's
  // Tokenizer13a; a mutation audit's survivors: '+' and '~' kept in their words).
  EXPECT_EQ(tokenize("x a+b y", TokenizerKind::k13a), "x a + b y");
  EXPECT_EQ(tokenize("x a~b y", TokenizerKind::k13a), "x a ~ b y");
}

TEST(Tokenize13a, MtevalPreStepsSkippedTagsLineJoinsAndEscapes) {
  EXPECT_EQ(tokenize("a <skipped> b", TokenizerKind::k13a), "a b");
  EXPECT_EQ(tokenize("hyphen-\nated line\nbreak", TokenizerKind::k13a),
            "hyphenated line break");
  EXPECT_EQ(tokenize("&quot;x&quot; &amp; y &lt;z&gt;", TokenizerKind::k13a),
            "\" x \" & y < z >");
  // Replacements run in order, so &amp;lt; becomes &lt; and then <.
  EXPECT_EQ(tokenize("&amp;lt;", TokenizerKind::k13a), "<");
  EXPECT_EQ(tokenize("&apos;", TokenizerKind::k13a), "& apos ;");
}

TEST(Tokenize13a, PythonWhitespaceSeparatesAndByteOrderMarkDoesNot) {
  // U+00A0, U+3000 and U+2028 are whitespace for str.split(); U+FEFF and U+200B not.
  EXPECT_EQ(tokenize("a\u00a0b\u3000c\u2028d", TokenizerKind::k13a), "a b c d");
  EXPECT_EQ(tokenize("\ufeff28 x\u200by", TokenizerKind::k13a), "\ufeff28 x\u200by");
}

TEST(TokenizeIntl, UnicodePunctuationAndSymbols) {
  EXPECT_EQ(tokenize("«Hallo», sagte er — 3,5 €.", TokenizerKind::kIntl),
            "« Hallo » , sagte er — 3,5 € .");
  // mteval-v14's known quirk: a number's final period stays (no padding space).
  EXPECT_EQ(tokenize("im Jahr 2017.", TokenizerKind::kIntl), "im Jahr 2017.");
  EXPECT_EQ(tokenize("x+y=z", TokenizerKind::kIntl), "x + y = z");
  EXPECT_EQ(tokenize("它说：“好”。", TokenizerKind::kIntl), "它说 ： “ 好 ” 。");
}

// sacreBLEU compiles intl's \p{P}, \p{S} and \P{N} with the `regex` package, whose
// Unicode is newer than Python 3.11's unicodedata (14.0), which the tables came from:
// 1,516 code points unassigned there are punctuation, symbols or numbers in `regex`, and
// were left glued to their word (a helper's differential trial). Punctuation of Unicode
// 16 (U+1B4E), splitting off except between numbers; a currency sign of Unicode 17
// (U+20C1); a digit of Unicode 16 (U+10D40), after which a period stays.
TEST(TokenizeIntl, CharactersNewerThanPythonsUnicodeAsTheRegexPackageHasThem) {
  EXPECT_EQ(tokenize("a\u1B4Eb", TokenizerKind::kIntl), "a \u1B4E b");
  EXPECT_EQ(tokenize("1\u1B4E2", TokenizerKind::kIntl), "1\u1B4E2");
  EXPECT_EQ(tokenize("5\u20C1.", TokenizerKind::kIntl), "5 \u20C1 .");
  EXPECT_EQ(tokenize("x\U00010D40.", TokenizerKind::kIntl), "x\U00010D40.");
}

TEST(TokenizeCharAndNone, AsSacreBleu) {
  EXPECT_EQ(tokenize("ab c", TokenizerKind::kChar), "a b   c");
  EXPECT_EQ(tokenize("țară", TokenizerKind::kChar), "ț a r ă");
  EXPECT_EQ(tokenize("a.b  c", TokenizerKind::kNone), "a.b  c");
}

// sacreBLEU's zh: Chinese characters apart, then 13a's rules (no unescaping, no padding),
// the line stripped first; its ranges as Python compares them: U+2014 and U+20AC split
// (read into U+2001..U+2A6D), the supplementary ideograph U+20000 does not. sacreBLEU
// 2.6.0's tokenizer gave each of these.
TEST(TokenizeZh, AsSacreBleu) {
  const auto zh = [](const std::string& text) { return tokenize(text, TokenizerKind::kZh); };
  EXPECT_EQ(zh("我爱北京天安门。"),
            "我 爱 北 京 天 安 门 。");
  EXPECT_EQ(zh("价格 1,000.5 元—很贵!"),
            "价 格 1,000.5 元 — 很 贵 !");
  EXPECT_EQ(zh("𠀀abc"), "𠀀abc");
  EXPECT_EQ(zh("  .句子, 结束. "), ". 句 子 , 结 束 .");
  EXPECT_EQ(zh("1990-2000年 €5 &quot;x&quot;"),
            "1990 - 2000 年 € 5 & quot ; x & quot ;");
  EXPECT_EQ(zh("ａｂｃ１２３"),
            "ａ ｂ ｃ １ ２ ３");
  EXPECT_EQ(thpc::metrics::parse_tokenizer("zh"), TokenizerKind::kZh);
  EXPECT_EQ(thpc::metrics::tokenizer_name(TokenizerKind::kZh), "zh");
}

TEST(PythonText, LowerIncludingFinalSigmaAndDottedCapitalI) {
  auto lower = [](const std::string& text) {
    return thpc::metrics::encode_utf8(
        thpc::metrics::python_lower(*thpc::metrics::decode_utf8(text)));
  };
  EXPECT_EQ(lower("Producția ŢARĂ ÄÖÜ"), "producția ţară äöü");
  EXPECT_EQ(lower("ΟΔΟΣ ΟΔΟΣ."), "οδος οδος.");
  EXPECT_EQ(lower("Σ ΑΣΑ"), "σ ασα");
  EXPECT_EQ(lower("İ"), "i\u0307");
}

TEST(PythonText, StrictUtf8AsPythonsCodec) {
  size_t offset = 0;
  EXPECT_FALSE(thpc::metrics::decode_utf8("ab\xC3", &offset));
  EXPECT_EQ(offset, 2u);
  EXPECT_FALSE(thpc::metrics::decode_utf8("\xC0\xAF"));          // overlong '/'
  EXPECT_FALSE(thpc::metrics::decode_utf8("\xED\xA0\x80"));      // surrogate
  EXPECT_FALSE(thpc::metrics::decode_utf8("\xF4\x90\x80\x80"));  // above U+10FFFF
  EXPECT_FALSE(thpc::metrics::decode_utf8("\x80"));
  std::optional<std::u32string> text = thpc::metrics::decode_utf8("a\u00e9\u20ac\U0001F600");
  ASSERT_TRUE(text);
  EXPECT_EQ(*text, U"a\u00e9\u20ac\U0001F600");
  EXPECT_EQ(thpc::metrics::encode_utf8(*text), "a\u00e9\u20ac\U0001F600");
  EXPECT_EQ(thpc::expect_error([] { thpc::metrics::corpus_bleu({"ok", "bad \xFF"}, {{"ok", "fine"}}); },
                               {"hypothesis segment 2"}),
            "hypothesis segment 2: invalid UTF-8 at byte 5");
  EXPECT_THROW(thpc::metrics::corpus_bleu({"ok"}, {{"ok"}, {"\xC3"}}), thpc::Error);
}

// ---- corpus BLEU: sacreBLEU's README example, two references ----

struct ReadmeExample : ::testing::Test {
  void SetUp() override {
    THPC_REQUIRE_DATA("sacrebleu_tests/small");
    hypotheses = read(kSmall + "/readme_example.hyp");
    references = {read(kSmall + "/readme_example.ref1"), read(kSmall + "/readme_example.ref2")};
  }
  std::vector<std::string> hypotheses;
  std::vector<std::vector<std::string>> references;
};

TEST_F(ReadmeExample, Default13aExpSmoothing) {
  BleuScorer scorer(references, BleuOptions{});
  BleuScore score = scorer.corpus_score(hypotheses);
  EXPECT_NEAR(score.score, 48.530827, 1e-6);
  EXPECT_EQ(score.counts, (std::vector<double>{14, 7, 5, 3}));
  EXPECT_EQ(score.totals, (std::vector<double>{17, 14, 11, 8}));
  EXPECT_EQ(score.hyp_len, 17);
  EXPECT_EQ(score.ref_len, 18);
  EXPECT_EQ(score.verbose(),
            "82.4/50.0/45.5/37.5 (BP = 0.943 ratio = 0.944 hyp_len = 17 ref_len = 18)");
  EXPECT_EQ(scorer.signature(),
            "nrefs:2|case:mixed|eff:no|tok:13a|smooth:exp|version:2.x-compatible");
}

TEST_F(ReadmeExample, TokenizeNoneAndIntl) {
  struct Expected {
    TokenizerKind tokenizer;
    double score;
    std::vector<double> counts;  // empty: sacreBLEU's test states none
    std::vector<double> totals;
    int64_t hyp_len;
    int64_t ref_len;
  };
  const std::vector<Expected> settings = {
      {TokenizerKind::kNone, 49.1919566, {10, 6, 4, 2}, {14, 11, 8, 5}, 14, 15},
      {TokenizerKind::kIntl, 43.91623493, {}, {19, 16, 13, 10}, 19, 18},
  };
  for (const Expected& expected : settings) {
    BleuOptions options;
    options.tokenizer = expected.tokenizer;
    BleuScore score = thpc::metrics::corpus_bleu(hypotheses, references, options);
    const std::string name = thpc::metrics::tokenizer_name(expected.tokenizer);
    EXPECT_NEAR(score.score, expected.score, 1e-6) << name;
    if (!expected.counts.empty()) {
      EXPECT_EQ(score.counts, expected.counts) << name;
    }
    EXPECT_EQ(score.totals, expected.totals) << name;
    EXPECT_EQ(score.hyp_len, expected.hyp_len) << name;
    EXPECT_EQ(score.ref_len, expected.ref_len) << name;
  }
}

TEST_F(ReadmeExample, NoSmoothingNeedsNoneHere) {
  BleuOptions options;
  options.smoothing = Smoothing::kNone;
  EXPECT_NEAR(thpc::metrics::corpus_bleu(hypotheses, references, options).score, 48.530827,
              1e-6);
}

TEST_F(ReadmeExample, EmptyHypothesesScoreZero) {
  BleuScore score = thpc::metrics::corpus_bleu({"", "", ""}, references);
  EXPECT_EQ(score.score, 0.0);
  EXPECT_EQ(score.hyp_len, 0);
  EXPECT_EQ(score.brevity_penalty, 0.0);
}

TEST_F(ReadmeExample, MaxNgramOrderOneToSix) {
  const std::map<int, std::string> expected = {{1, "77.65"}, {2, "60.50"}, {3, "53.93"},
                                               {4, "48.53"}, {5, "46.14"}, {6, "43.28"}};
  for (const auto& [order, score] : expected) {
    BleuOptions options;
    options.max_ngram_order = order;
    BleuScore result = thpc::metrics::corpus_bleu(hypotheses, references, options);
    EXPECT_EQ(fixed(result.score, 2), score) << "max_ngram_order " << order;
    EXPECT_EQ(result.precisions.size(), static_cast<size_t>(order));
  }
}

TEST(ClosestReferenceLength, PrefersTheShorterOnTies) {
  // A 4-token hypothesis is 1 away from both 5 and 3 -> 3.
  BleuScorer scorer({{"a b c"}, {"a b c d e"}}, BleuOptions{});
  EXPECT_EQ(scorer.segment_statistics(0, "a b c d").ref_len, 3);
  EXPECT_EQ(scorer.segment_statistics(0, "a b c d e f").ref_len, 5);
  EXPECT_EQ(scorer.segment_statistics(0, "a").ref_len, 3);
  // The longer reference first: still the shorter. With the shorter first, a scorer that
  // keeps the first of two equally close references passes too (a mutation audit's did).
  BleuScorer longer_first({{"a b c d e"}, {"a b c"}}, BleuOptions{});
  EXPECT_EQ(longer_first.segment_statistics(0, "a b c d").ref_len, 3);
}

TEST(ClosestReferenceLength, EmptyReferenceHasLengthZero) {
  BleuScorer scorer({{""}, {"a b c"}}, BleuOptions{});
  EXPECT_EQ(scorer.segment_statistics(0, "a").ref_len, 0);
  EXPECT_EQ(scorer.segment_statistics(0, "a b").ref_len, 3);
  EXPECT_EQ(scorer.signature().rfind("nrefs:2|", 0), 0u);
}

// ---- BLEU from statistics and the raw cases of sacreBLEU's test_bleu.py ----

BleuOptions raw_floor(double value) {
  BleuOptions options;
  options.tokenizer = TokenizerKind::kNone;
  options.smoothing = Smoothing::kFloor;
  options.smooth_value = value;
  options.effective_order = true;
  return options;
}

TEST(RawCorpusBleu, SacreBleuInlineCases) {
  struct Case {
    std::vector<std::string> hypotheses;
    std::vector<std::string> references;
    double floor;
    double expected;  // fraction, as test_bleu.py states it
  };
  const std::vector<Case> cases = {
      {{"this is a test", "another test"}, {"ref1", "ref2"}, 0.01, 0.0},
      {{"this is a test"}, {"this is a test"}, 0.01, 1.0},
      {{"this is a fest"}, {"this is a test"}, 0.01, 0.223606797749979},
      {{"test"}, {"a test"}, 0.01, 0.3678794411714425},
      {{"a test"}, {"a test"}, 0.01, 1.0},
      {{"a little test"}, {"a test"}, 0.01, 0.03218297948685433},
      {{"am I am a character sequence"}, {"I am a symbol string sequence a a"}, 0.0, 0.0},
      {{"am I am a character sequence"}, {"I am a symbol string sequence a a"}, 0.1,
       0.1555722182},
  };
  for (const Case& c : cases) {
    BleuScore score = thpc::metrics::corpus_bleu(c.hypotheses, {c.references}, raw_floor(c.floor));
    EXPECT_NEAR(score.score / 100.0, c.expected, 1e-9) << c.hypotheses[0];
  }
  BleuScore sequence = thpc::metrics::corpus_bleu({"am I am a character sequence"},
                                                  {{"I am a symbol string sequence a a"}},
                                                  raw_floor(0.1));
  EXPECT_EQ(sequence.counts, (std::vector<double>{4, 2, 1, 0}));
  EXPECT_EQ(sequence.totals, (std::vector<double>{6, 5, 4, 3}));
}

// Values of sacreBLEU 2.6.0 (BLEU().corpus_score, its defaults: 13a, exp smoothing, no
// effective order), for what a mutation audit found unpinned.
TEST(CorpusBleu, DefaultsAndSeveralReferencesAsSacreBleu) {
  // Without effective order a corpus without a 4-gram scores 0, whatever it matches (with
  // it, 100).
  const BleuScore three = thpc::metrics::corpus_bleu({"a b c"}, {{"a b c"}});
  EXPECT_EQ(three.score, 0.0);
  EXPECT_EQ(three.counts, (std::vector<double>{3, 2, 1, 0}));
  BleuOptions effective;
  effective.effective_order = true;
  EXPECT_NEAR(thpc::metrics::corpus_bleu({"a b c"}, {{"a b c"}}, effective).score, 100.0, 1e-9);
  // Several references clip each n-gram at its largest count in any one of them, not
  // their sum: "the" counts once against "the cat" and "the dog" (15.97357760615681).
  const BleuScore clipped =
      thpc::metrics::corpus_bleu({"the the the the"}, {{"the cat"}, {"the dog"}});
  EXPECT_EQ(clipped.counts, (std::vector<double>{1, 0, 0, 0}));
  EXPECT_EQ(clipped.totals, (std::vector<double>{4, 3, 2, 1}));
  EXPECT_NEAR(clipped.score, 15.97357760615681, 1e-9);
}

BleuStatistics make_statistics(std::vector<int64_t> matches, std::vector<int64_t> totals,
                               int64_t hyp_len, int64_t ref_len) {
  BleuStatistics statistics;
  statistics.matches = std::move(matches);
  statistics.totals = std::move(totals);
  statistics.hyp_len = hyp_len;
  statistics.ref_len = ref_len;
  return statistics;
}

TEST(ComputeBleu, FromStatistics) {
  const BleuStatistics statistics = make_statistics({9, 7, 5, 3}, {10, 8, 6, 4}, 11, 11);
  BleuOptions options;
  options.smoothing = Smoothing::kNone;
  EXPECT_NEAR(thpc::metrics::compute_bleu(statistics, options).score / 100.0, 0.8375922397,
              1e-10);
}

TEST(ComputeBleu, DegenerateStatisticsWithFloorGiveExactlyZero) {
  const BleuStatistics zero = make_statistics({0, 0, 0, 0}, {6, 5, 4, 3}, 6, 6);
  for (double floor : {0.0, 0.1, 0.01}) {
    EXPECT_EQ(thpc::metrics::compute_bleu(zero, raw_floor(floor)).score, 0.0);
  }
  const BleuStatistics no_four_grams = make_statistics({6, 5, 4, 0}, {6, 5, 4, 3}, 6, 6);
  EXPECT_EQ(thpc::metrics::compute_bleu(no_four_grams, raw_floor(0.0)).score, 0.0);
}

TEST(ComputeBleu, BrevityPenaltyIsExpOneMinusRefOverHyp) {
  const BleuStatistics statistics = make_statistics({5, 4, 3, 2}, {5, 4, 3, 2}, 5, 8);
  BleuScore score = thpc::metrics::compute_bleu(statistics, BleuOptions{});
  EXPECT_DOUBLE_EQ(score.brevity_penalty, std::exp(1.0 - 8.0 / 5.0));
  EXPECT_DOUBLE_EQ(score.score, 100.0 * std::exp(1.0 - 8.0 / 5.0));
}

// ---- sentence BLEU (effective order) ----

struct SentenceRow {
  Smoothing smoothing;
  std::optional<double> value;
  TokenizerKind tokenizer;
  bool lowercase;
  double expected;
  double tolerance;
};

TEST(SentenceBleu, RomanianExampleEveryReadmeRow) {
  THPC_REQUIRE_DATA("sacrebleu_tests/small");
  const std::string hypothesis = read(kSmall + "/sentence_ro.hyp").at(0);
  const std::string reference = read(kSmall + "/sentence_ro.ref").at(0);
  const std::vector<SentenceRow> rows = {
      {Smoothing::kExp, std::nullopt, TokenizerKind::k13a, false, 8.493, 1e-3},
      {Smoothing::kNone, std::nullopt, TokenizerKind::k13a, false, 0.0, 1e-3},
      {Smoothing::kFloor, std::nullopt, TokenizerKind::k13a, false, 4.51688, 1e-3},
      {Smoothing::kFloor, 0.1, TokenizerKind::k13a, false, 4.51688, 1e-3},
      {Smoothing::kFloor, 0.5, TokenizerKind::k13a, false, 10.10, 1e-2},
      {Smoothing::kAddK, std::nullopt, TokenizerKind::k13a, false, 14.882, 1e-3},
      {Smoothing::kAddK, 1.0, TokenizerKind::k13a, false, 14.882, 1e-3},
      {Smoothing::kAddK, 2.0, TokenizerKind::k13a, false, 21.389, 1e-3},
      {Smoothing::kExp, std::nullopt, TokenizerKind::kNone, false, 7.347, 1e-3},
      {Smoothing::kExp, std::nullopt, TokenizerKind::kIntl, false, 8.493, 1e-3},
      {Smoothing::kExp, std::nullopt, TokenizerKind::kChar, false, 40.8759, 1e-3},
      {Smoothing::kExp, std::nullopt, TokenizerKind::kChar, true, 42.0267, 1e-3},
  };
  for (const SentenceRow& row : rows) {
    BleuOptions options;
    options.smoothing = row.smoothing;
    options.smooth_value = row.value;
    options.tokenizer = row.tokenizer;
    options.lowercase = row.lowercase;
    options.effective_order = true;
    BleuScore score = thpc::metrics::sentence_bleu(hypothesis, {reference}, options);
    EXPECT_NEAR(score.score, row.expected, row.tolerance)
        << thpc::metrics::smoothing_name(row.smoothing) << " "
        << thpc::metrics::tokenizer_name(row.tokenizer) << " lowercase " << row.lowercase;
  }
}

TEST(SentenceBleu, RomanianExampleStatistics) {
  THPC_REQUIRE_DATA("sacrebleu_tests/small");
  const std::string hypothesis = read(kSmall + "/sentence_ro.hyp").at(0);
  const std::string reference = read(kSmall + "/sentence_ro.ref").at(0);
  auto statistics = [&](TokenizerKind tokenizer) {
    BleuOptions options;
    options.tokenizer = tokenizer;
    options.effective_order = true;
    return BleuScorer({{reference}}, options).segment_statistics(0, hypothesis);
  };
  BleuStatistics tok13a = statistics(TokenizerKind::k13a);
  EXPECT_EQ(tok13a.matches, (std::vector<int64_t>{5, 2, 0, 0}));
  EXPECT_EQ(tok13a.totals, (std::vector<int64_t>{14, 13, 12, 11}));
  EXPECT_EQ(tok13a.hyp_len, 14);
  EXPECT_EQ(tok13a.ref_len, 10);
  BleuStatistics none = statistics(TokenizerKind::kNone);
  EXPECT_EQ(none.matches, (std::vector<int64_t>{4, 1, 0, 0}));
  EXPECT_EQ(none.totals, (std::vector<int64_t>{13, 12, 11, 10}));
  BleuStatistics characters = statistics(TokenizerKind::kChar);
  EXPECT_EQ(characters.matches, (std::vector<int64_t>{37, 30, 21, 15}));
  EXPECT_EQ(characters.totals, (std::vector<int64_t>{61, 60, 59, 58}));
}

TEST(SentenceBleu, ZeroMatchesScoreZeroWithEverySmoothing) {
  THPC_REQUIRE_DATA("sacrebleu_tests/small");
  const std::string hypothesis = read(kSmall + "/sentence_zero.hyp").at(0);
  const std::string reference = read(kSmall + "/sentence_zero.ref").at(0);
  const std::vector<std::pair<Smoothing, std::optional<double>>> settings = {
      {Smoothing::kExp, std::nullopt},  {Smoothing::kNone, std::nullopt},
      {Smoothing::kFloor, std::nullopt}, {Smoothing::kFloor, 0.1},
      {Smoothing::kAddK, std::nullopt},  {Smoothing::kAddK, 1.0}};
  for (const auto& [smoothing, value] : settings) {
    BleuOptions options;
    options.smoothing = smoothing;
    options.smooth_value = value;
    options.effective_order = true;
    BleuScore score = thpc::metrics::sentence_bleu(hypothesis, {reference}, options);
    EXPECT_EQ(score.score, 0.0) << thpc::metrics::smoothing_name(smoothing);
    EXPECT_EQ(score.counts, (std::vector<double>{0, 0, 0, 0}));
    EXPECT_EQ(score.totals, (std::vector<double>{4, 3, 2, 1}));
  }
}

// ---- WMT17 En→De: 16 systems against sacreBLEU's statistics ----

struct Wmt17Row {
  std::string file;
  double moses_bleu = 0.0;  // mteval-v13a.pl, two decimals
  double bleu = 0.0;        // sacreBLEU, six decimals
  std::vector<int64_t> matches;
  std::vector<int64_t> totals;
  int64_t sys_len = 0;
  int64_t ref_len = 0;
  double intl_bleu = 0.0;
};

std::vector<Wmt17Row> read_scores_tsv() {
  std::ifstream in(kWmt17 + "/SCORES.tsv");
  EXPECT_TRUE(in) << kWmt17 << "/SCORES.tsv";
  std::string line;
  std::getline(in, line);  // header
  std::vector<Wmt17Row> rows;
  while (std::getline(in, line)) {
    std::vector<std::string> fields;
    std::stringstream stream(line);
    std::string field;
    while (std::getline(stream, field, '\t')) fields.push_back(field);
    if (fields.size() < 19) continue;
    Wmt17Row row;
    row.file = fields[0];
    row.moses_bleu = std::stod(fields[1]);
    row.bleu = std::stod(fields[6]);
    for (int n = 0; n < 4; ++n) row.matches.push_back(std::stoll(fields[7 + n]));
    for (int n = 0; n < 4; ++n) row.totals.push_back(std::stoll(fields[11 + n]));
    row.sys_len = std::stoll(fields[15]);
    row.ref_len = std::stoll(fields[16]);
    row.intl_bleu = std::stod(fields[18]);
    rows.push_back(row);
  }
  return rows;
}

TEST(Wmt17, SixteenSystemsCountsAndBleuAsSacreBleu) {
  THPC_REQUIRE_DATA("sacrebleu_tests/wmt17_en-de/SCORES.tsv");
  const std::vector<Wmt17Row> rows = read_scores_tsv();
  ASSERT_EQ(rows.size(), 16u);
  const BleuScorer scorer({read(kWmt17 + "/newstest2017-ende-ref.de")}, BleuOptions{});
  for (const Wmt17Row& row : rows) {
    const BleuStatistics statistics = scorer.corpus_statistics(read(kWmt17 + "/" + row.file));
    EXPECT_EQ(statistics.matches, row.matches) << row.file;
    EXPECT_EQ(statistics.totals, row.totals) << row.file;
    EXPECT_EQ(statistics.hyp_len, row.sys_len) << row.file;
    EXPECT_EQ(statistics.ref_len, row.ref_len) << row.file;
    const double bleu = thpc::metrics::compute_bleu(statistics, scorer.options()).score;
    EXPECT_NEAR(bleu, row.bleu, 1e-5) << row.file;
    EXPECT_NEAR(bleu, row.moses_bleu, 0.01) << row.file << " vs mteval-v13a.pl";
  }
}

TEST(Wmt17, SixteenSystemsIntlTokenization) {
  THPC_REQUIRE_DATA("sacrebleu_tests/wmt17_en-de/SCORES.tsv");
  const std::vector<Wmt17Row> rows = read_scores_tsv();
  ASSERT_EQ(rows.size(), 16u);
  BleuOptions options;
  options.tokenizer = TokenizerKind::kIntl;
  const BleuScorer scorer({read(kWmt17 + "/newstest2017-ende-ref.de")}, options);
  for (const Wmt17Row& row : rows) {
    const double bleu = scorer.corpus_score(read(kWmt17 + "/" + row.file)).score;
    EXPECT_NEAR(bleu, row.intl_bleu, 1e-5) << row.file;
    if (row.file == "newstest2017.LIUM-NMT.4900.en-de") {
      EXPECT_NEAR(bleu, 26.89, 0.01) << "mteval-v14.pl --international-tokenization";
    }
  }
}

TEST(Wmt17, ByteOrderMarkStaysGluedToTheFirstToken) {
  THPC_REQUIRE_DATA("sacrebleu_tests/wmt17_en-de");
  const std::vector<std::string> online_a = read(kWmt17 + "/newstest2017.online-A.0.en-de");
  ASSERT_EQ(online_a.at(0).rfind("\xEF\xBB\xBF", 0), 0u);
  EXPECT_EQ(tokenize(online_a[0], TokenizerKind::k13a).rfind("\xEF\xBB\xBF" "28 ", 0), 0u);
}

// ---- the program ----

struct ProgramResult {
  int exit_code = -1;
  std::string out;
  std::string err;
};

// Runs `command` through the shell; its standard output, and its exit code in *exit_code.
std::string run_capture(const std::string& command, int* exit_code) {
  std::string out;
  FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) return out;
  char buffer[4096];
  size_t got;
  while ((got = std::fread(buffer, 1, sizeof(buffer), pipe)) > 0) out.append(buffer, got);
  const int status = ::pclose(pipe);
  *exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return out;
}

ProgramResult run_score(const std::string& arguments) {
  const std::filesystem::path err_path =
      std::filesystem::temp_directory_path() /
      ("test_bleu_stderr_" + std::to_string(::getpid()) + ".txt");
  const std::string command = thpc::binary_dir() + "/transformer_score " + arguments +
                              " 2>" + err_path.string();
  ProgramResult result;
  result.out = run_capture(command, &result.exit_code);
  std::ifstream err(err_path);
  std::stringstream text;
  text << err.rdbuf();
  result.err = text.str();
  std::filesystem::remove(err_path);
  return result;
}

struct ScoreProgram : ::testing::Test {
  std::filesystem::path dir;
  void SetUp() override {
    dir = std::filesystem::temp_directory_path() /
          ("test_bleu_" + std::to_string(::getpid()) + "_" +
           ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(dir);
  }
  void TearDown() override { std::filesystem::remove_all(dir); }
  std::string write(const std::string& name, const std::string& bytes) {
    const std::string path = (dir / name).string();
    std::ofstream(path, std::ios::binary) << bytes;
    return path;
  }
};

const std::string kUedin = kWmt17 + "/newstest2017.uedin-nmt.4722.en-de";
const std::string kWmt17Ref = kWmt17 + "/newstest2017-ende-ref.de";

void expect_one_line_error(const ProgramResult& result, int exit_code,
                           const std::vector<std::string>& mentions) {
  EXPECT_EQ(result.exit_code, exit_code) << result.err;
  EXPECT_TRUE(result.out.empty()) << result.out;
  EXPECT_EQ(std::count(result.err.begin(), result.err.end(), '\n'), 1) << result.err;
  for (const std::string& mention : mentions) {
    EXPECT_NE(result.err.find(mention), std::string::npos) << result.err;
  }
}

TEST_F(ScoreProgram, ScoreOnlyOnOneWmt17System) {
  THPC_REQUIRE_DATA("sacrebleu_tests/wmt17_en-de");
  ProgramResult result = run_score(kWmt17Ref + " -i " + kUedin + " -b");
  EXPECT_EQ(result.exit_code, 0) << result.err;
  EXPECT_EQ(result.out, "28.3\n");
  result = run_score(kWmt17Ref + " -b -w 2 < " + kUedin);  // hypothesis on stdin
  EXPECT_EQ(result.exit_code, 0) << result.err;
  EXPECT_EQ(result.out, "28.30\n");
  // "-" is standard input, as the other tools read it: the system's (-i -) or a
  // reference's (before: "-: no such file", exit 1), one of them only (exit 2).
  result = run_score(kWmt17Ref + " -i - -b -w 2 < " + kUedin);
  EXPECT_EQ(result.exit_code, 0) << result.err;
  EXPECT_EQ(result.out, "28.30\n");
  result = run_score("- -i " + kUedin + " -b -w 2 < " + kWmt17Ref);
  EXPECT_EQ(result.exit_code, 0) << result.err;
  EXPECT_EQ(result.out, "28.30\n");
  // Any width, as sacreBLEU's f"{score:.{width}f}": the double's exact decimal expansion,
  // then zeros (`python -m sacrebleu ... -b -w 60`). Widths over 17 were refused.
  result = run_score(kWmt17Ref + " -i " + kUedin + " -b -w 60");
  EXPECT_EQ(result.exit_code, 0) << result.err;
  EXPECT_EQ(result.out,
            "28.301225088283295860946964239701628684997558593750000000000000\n");
  expect_one_line_error(run_score(kWmt17Ref + " -i " + kUedin + " -b -w 10001"), 2,
                        {"-w/--width 10001 is not in [0, 10000]"});
  expect_one_line_error(run_score(kWmt17Ref + " -i " + kUedin + " -b -w -1"), 2,
                        {"-w/--width -1 is not in [0, 10000]"});
  expect_one_line_error(run_score("- < " + kUedin), 2,
                        {"standard input can be one file only"});
}

// Options of sacreBLEU that change nothing here are taken, so that its command lines run
// as they are: -nc (colours), -q (its log), --force (its warning that the input looks
// tokenized; before: "unrecognised option"), -j (the tests' processes).
TEST_F(ScoreProgram, SacreBleusOptionsWithoutEffectHereAreTaken) {
  THPC_REQUIRE_DATA("sacrebleu_tests/wmt17_en-de");
  const ProgramResult plain = run_score(kWmt17Ref + " -i " + kUedin + " -m bleu chrf");
  ASSERT_EQ(plain.exit_code, 0) << plain.err;
  for (const char* option : {"-nc", "-q", "--force", "-j 2", "--no-color --quiet"}) {
    const ProgramResult taken =
        run_score(kWmt17Ref + " -i " + kUedin + " -m bleu chrf " + option);
    EXPECT_EQ(taken.exit_code, 0) << option << ": " << taken.err;
    EXPECT_EQ(taken.out, plain.out) << option;
  }
}

TEST_F(ScoreProgram, FullLineWithSignature) {
  THPC_REQUIRE_DATA("sacrebleu_tests/small");
  ProgramResult result = run_score(kSmall + "/readme_example.ref1 " + kSmall +
                                   "/readme_example.ref2 -i " + kSmall + "/readme_example.hyp");
  EXPECT_EQ(result.exit_code, 0) << result.err;
  EXPECT_EQ(result.out,
            "BLEU|nrefs:2|case:mixed|eff:no|tok:13a|smooth:exp|version:2.x-compatible = 48.5 "
            "82.4/50.0/45.5/37.5 (BP = 0.943 ratio = 0.944 hyp_len = 17 ref_len = 18)\n");
}

TEST_F(ScoreProgram, SentenceLevelWithSmoothingAndLowercase) {
  THPC_REQUIRE_DATA("sacrebleu_tests/small");
  ProgramResult result = run_score(kSmall + "/sentence_ro.ref -i " + kSmall +
                                   "/sentence_ro.hyp --sentence-level -s add-k -sv 2 -w 3");
  EXPECT_EQ(result.exit_code, 0) << result.err;
  EXPECT_EQ(result.out.substr(0, result.out.find(" = ")),
            "BLEU|nrefs:1|case:mixed|eff:yes|tok:13a|smooth:add-k[2.00]|version:2.x-compatible");
  EXPECT_NE(result.out.find(" = 21.389 "), std::string::npos) << result.out;
  result = run_score(kSmall + "/sentence_ro.ref -i " + kSmall +
                     "/sentence_ro.hyp -sl --tokenize char -lc -b -w 4");
  EXPECT_EQ(result.out, "42.0268\n");
}

TEST_F(ScoreProgram, MissingFile) {
  THPC_REQUIRE_DATA("sacrebleu_tests/wmt17_en-de");
  const std::string missing = (dir / "no_such.ref").string();
  expect_one_line_error(run_score(missing + " -i " + kUedin), 1, {missing + ": no such file"});
  const std::string missing_hyp = (dir / "no_such.hyp").string();
  expect_one_line_error(run_score(kWmt17Ref + " -i " + missing_hyp), 1,
                        {missing_hyp + ": no such file"});
  expect_one_line_error(run_score(dir.string() + " -i " + kUedin), 1,
                        {dir.string() + ": is a directory, not a file"});
}

TEST_F(ScoreProgram, LineCountMismatch) {
  const std::string ref = write("ref.txt", "a b\nc d\n");
  const std::string hyp = write("hyp.txt", "a b\n");
  expect_one_line_error(run_score(ref + " -i " + hyp), 1,
                        {ref, "2 lines", hyp, "has 1", "one line per reference line"});
  EXPECT_EQ(run_score(ref + " -i " + hyp).err.find("carriage return"), std::string::npos);
  // Lines ended by a carriage return alone (classic Mac OS text) read as one line, as
  // sacreBLEU reads them: the count that differs says why, in transformer_decode's words
  // (before: "2 lines, but hyp has 1", and nothing of why; a helper's trial).
  const std::string mac = write("mac.txt", "a b\rc d\r");
  expect_one_line_error(run_score(ref + " -i " + mac), 1,
                        {ref + ": 2 lines, but " + mac + " has 1; " + mac +
                         ": its lines end in a carriage return alone (classic Mac OS text: "
                         "what reads as 1 line holds 1 carriage return before its end): "
                         "convert it to \\n line ends, e.g. tr '\\r' '\\n' < FILE > NEW"});
  expect_one_line_error(run_score(mac + " -i " + ref), 1,
                        {mac + ": 1 line, but " + ref + " has 2; " + mac + ": its lines end"});
}

// A byte-order mark is scored as part of the first word, as sacreBLEU reads it, and said
// (identical texts, one saved with a mark, scored 59.5 without a word: an error walk).
TEST_F(ScoreProgram, AByteOrderMarkIsScoredAsSacreBleuScoresItAndSaid) {
  const std::string ref = write("ref.txt", "a b c d\n");
  const std::string marked = write("marked.txt", "\xEF\xBB\xBF" "a b c d\n");
  const ProgramResult scored = run_score(ref + " -i " + marked + " -b");
  EXPECT_EQ(scored.exit_code, 0) << scored.err;
  EXPECT_EQ(scored.out, "59.5\n");
  EXPECT_NE(scored.err.find("note: " + marked + " begins with a byte-order mark"),
            std::string::npos)
      << scored.err;
  const ProgramResult plain = run_score(ref + " -i " + ref + " -b");
  EXPECT_EQ(plain.out, "100.0\n");
  EXPECT_EQ(plain.err.find("byte-order mark"), std::string::npos) << plain.err;
}

// Translations left in SentencePiece pieces (fairseq's habit) are scored as words, as
// sacreBLEU scores them, and said once for the file (a helper's walk: BLEU 0.1 without a
// hint); a text with the mark on a word or two is not.
TEST_F(ScoreProgram, TranslationsLeftInSentencePiecePiecesAreScoredAndSaid) {
  const std::string mark = "\u2581";
  const std::string ref = write("ref.txt", "a dog runs\nthe cat sleeps\n\n");
  const std::string pieces =
      write("pieces.txt", mark + "a " + mark + "dog " + mark + "run s\n" + mark + "the " + mark +
                              "cat " + mark + "sle eps\n\n");
  const ProgramResult scored = run_score(ref + " -i " + pieces + " -b");
  EXPECT_EQ(scored.exit_code, 0) << scored.err;
  EXPECT_NE(scored.err.find("note: " + pieces + " looks encoded into SentencePiece pieces (the "
                            "words of 2 of its 2 lines start with U+2581"),
            std::string::npos)
      << scored.err;
  const std::string text = write("text.txt", "a dog " + mark + "runs\nthe cat sleeps\n\n");
  const ProgramResult plain = run_score(ref + " -i " + text + " -b");
  EXPECT_EQ(plain.err.find("SentencePiece"), std::string::npos) << plain.err;
}

TEST_F(ScoreProgram, InvalidUtf8) {
  const std::string ref = write("ref.txt", "a b\nc d\n");
  const std::string hyp = write("hyp.txt", "a b\nc \xC3\x28\n");
  expect_one_line_error(run_score(ref + " -i " + hyp), 1,
                        {hyp, "line 2", "invalid UTF-8", "byte 3"});
}

TEST_F(ScoreProgram, EmptyReferenceLineIsAReferenceOfLengthZero) {
  // As sacreBLEU 2.6: no error; the whitespace-only line is an empty reference.
  const std::string ref = write("ref.txt", "a b c d\n  \r\n");
  const std::string hyp = write("hyp.txt", "a b c d\nc d\n");
  ProgramResult result = run_score(ref + " -i " + hyp + " -w 4");
  EXPECT_EQ(result.exit_code, 0) << result.err;
  // sacreBLEU 2.6.0 prints this line for the same two files.
  EXPECT_NE(result.out.find(" = 84.0896 66.7/75.0/100.0/100.0 (BP = 1.000 ratio = 1.500 "
                            "hyp_len = 6 ref_len = 4)"),
            std::string::npos)
      << result.out;
}

// sacreBLEU's way of scoring several systems, -i SYS1 SYS2: once SYS2 was read as a
// positional argument, a second reference, and SYS1 scored against both (exit 0, nrefs:2 in
// the signature the only hint). Now each system is scored against the one reference, in
// sacreBLEU's table; a reference after the one system (past another option) stays one.
TEST_F(ScoreProgram, SystemsAfterDashIAreSystemsNotReferences) {
  const std::string reference = write("ref.txt", "a small cat sat on the mat\n");
  const std::string first = write("sys1.txt", "a cat sat on the mat\n");
  const std::string second = write("sys2.txt", "the small cat is on a mat\n");
  ProgramResult result = run_score(reference + " -i " + first + " " + second + " -w 2");
  EXPECT_EQ(result.exit_code, 0) << result.err;
  // Each alone, as one system each.
  const ProgramResult alone_first = run_score(reference + " -i " + first + " -b -w 2");
  const ProgramResult alone_second = run_score(reference + " -i " + second + " -b -w 2");
  for (const auto& [name, alone] : std::vector<std::pair<std::string, ProgramResult>>{
           {first, alone_first}, {second, alone_second}}) {
    const std::string score = alone.out.substr(0, alone.out.find('\n'));
    const size_t row = result.out.find(name + " \u2502");
    ASSERT_NE(row, std::string::npos) << result.out;
    const std::string line = result.out.substr(row, result.out.find('\n', row) - row);
    EXPECT_NE(line.find(" " + score + " "), std::string::npos) << line;
  }
  EXPECT_NE(result.out.find(" - BLEU       nrefs:1|"), std::string::npos) << result.out;
  result = run_score("-i " + first + " -b " + reference + " " + second);
  EXPECT_EQ(result.exit_code, 0) << result.err;
}

TEST_F(ScoreProgram, BadCommandLine) {
  THPC_REQUIRE_DATA("sacrebleu_tests/wmt17_en-de");
  ProgramResult result = run_score(kWmt17Ref + " -i " + kUedin + " --tokenize ja-mecab");
  EXPECT_EQ(result.exit_code, 2);
  // Every tokenizer the tool takes is named (before: moses and moses-compound were not).
  EXPECT_NE(result.err.find("-tok (--tokenize): unknown tokenizer 'ja-mecab' (expected 13a | "
                            "intl | char | none | zh | flores101 | flores200 | spBLEU-1K, or "
                            "moses | moses-compound"),
            std::string::npos)
      << result.err;
  result = run_score("-i " + kUedin);
  EXPECT_EQ(result.exit_code, 2);
  EXPECT_NE(result.err.find("no reference file"), std::string::npos) << result.err;
  // A smoothing value that is not a finite number >= 0 (inf gave a nan BLEU, exit 0).
  for (const std::string value : {"inf", "nan", "-1"}) {
    result = run_score(kWmt17Ref + " -i " + kUedin + " -s add-k -sv " + value);
    EXPECT_EQ(result.exit_code, 2) << value;
    EXPECT_NE(result.err.find("-sv (--smooth-value) must be a finite number >= 0"),
              std::string::npos)
        << result.err;
  }
  // sacreBLEU's -sh read as -s h: "unknown smoothing method 'h'".
  result = run_score(kWmt17Ref + " -i " + kUedin + " -sh");
  EXPECT_EQ(result.exit_code, 2);
  EXPECT_NE(result.err.find("-sh (sacreBLEU's --short signature) is not an option here"),
            std::string::npos)
      << result.err;
  // sacreBLEU's -f text is this program's default: taken, the same line (scripts pass it;
  // it was refused, "unrecognised option"); -f json is sacreBLEU's JSON (test_score_json),
  // -f latex is its table of several systems (test_significance; one system: the text), and
  // another -f is refused, naming it.
  const ProgramResult plain = run_score(kWmt17Ref + " -i " + kUedin);
  result = run_score(kWmt17Ref + " -i " + kUedin + " -f text");
  EXPECT_EQ(result.exit_code, 0) << result.err;
  EXPECT_EQ(result.out, plain.out);
  result = run_score(kWmt17Ref + " -i " + kUedin + " -f latex");
  EXPECT_EQ(result.exit_code, 0) << result.err;
  EXPECT_EQ(result.out, plain.out);
  result = run_score(kWmt17Ref + " -i " + kUedin + " -f yaml");
  EXPECT_EQ(result.exit_code, 2);
  EXPECT_NE(result.err.find("-f yaml: unknown format (expected text | json | latex)"),
            std::string::npos)
      << result.err;
  // A huge -sv is printed whole in the signature (a 64-byte buffer cut it), as sacreBLEU's.
  result = run_score(kWmt17Ref + " -i " + kUedin + " -s add-k -sv 1e80");
  EXPECT_EQ(result.exit_code, 0) << result.err;
  EXPECT_NE(result.out.find("smooth:add-k[1000000000000000000266098647083672765374024011812"
                            "00809098131977453489758916313088.00]"),
            std::string::npos)
      << result.out;
}

// ---- cross-check against Python's sacreBLEU, when it is installed ----

// The interpreter to look for sacrebleu in (python_interpreter.h); when it was named it
// must have sacrebleu: the cross-check fails instead of skipping.
using thpc::Interpreter;
using thpc::python_interpreter;

// Everything after "SIGNATURE = " on each line: the scores, not the version tag.
std::string scores_only(const std::string& output) {
  std::stringstream lines(output);
  std::string line;
  std::string kept;
  while (std::getline(lines, line)) {
    const size_t equals = line.find(" = ");
    kept += (equals == std::string::npos ? line : line.substr(equals + 3)) + "\n";
  }
  return kept;
}

TEST(SacreBleuPython, SameOutputLinesWhenInstalled) {
  THPC_REQUIRE_DATA("sacrebleu_tests/small");
  THPC_REQUIRE_DATA("sacrebleu_tests/wmt17_en-de");
  const Interpreter interpreter = python_interpreter();
  const std::string& python = interpreter.path;
  int exit_code = -1;
  run_capture(python + " -c 'import sacrebleu' 2>/dev/null", &exit_code);
  if (exit_code != 0) {
    // Named, or installed by install_deps.sh (as in CI), the interpreter must have it:
    // the cross-check fails instead of skipping.
    ASSERT_FALSE(interpreter.named) << python << " cannot import sacrebleu";
    GTEST_SKIP() << "Python sacrebleu is not importable by '" << python
                 << "' (pip install sacrebleu, or set THPC_PYTHON); the fixed expected "
                    "values above still check everything";
  }
  const std::string ro = kSmall + "/sentence_ro.ref -i " + kSmall + "/sentence_ro.hyp";
  const std::string readme = kSmall + "/readme_example.ref1 " + kSmall +
                             "/readme_example.ref2 -i " + kSmall + "/readme_example.hyp";
  const std::string wmt = kWmt17Ref + " -i " + kWmt17 + "/newstest2017.online-A.0.en-de";
  const std::vector<std::string> arguments = {
      readme + " -w 6",
      readme + " -w 6 -tok intl -lc",
      readme + " -w 6 -tok zh",
      readme + " -w 6 -sl -s floor -sv 0.3 -tok char",
      ro + " -w 6 -sl -s add-k -sv 2 -lc",
      ro + " -w 6 -sl -tok intl",
      wmt + " -w 6 -lc -tok intl",
      wmt + " -w 6 -tok char",
      wmt + " -w 40 -m chrf bleu",
  };
  for (const std::string& argument : arguments) {
    int sacrebleu_exit = -1;
    const std::string expected = run_capture(
        python + " -m sacrebleu -q -f text " + argument + " 2>/dev/null", &sacrebleu_exit);
    ASSERT_EQ(sacrebleu_exit, 0) << argument;
    ProgramResult ours = run_score(argument);
    ASSERT_EQ(ours.exit_code, 0) << ours.err;
    EXPECT_EQ(scores_only(ours.out), scores_only(expected)) << argument;
  }
}

// Every code point of planes 0 to 3 and 14 through sacreBLEU's zh tokenizer and ours, in a
// line that puts it beside letters, digits, a period, a comma and a dash.
struct SacreBleuZh : thpc::SacreBleuPeer {
  SacreBleuZh() : SacreBleuPeer("TokenizeZh.AsSacreBleu still checks the tokenizer") {}
};

TEST_F(SacreBleuZh, EveryCodePointAsSacreBleusTokenizer) {
  std::vector<std::u32string> lines;
  const auto planes = {std::pair<char32_t, char32_t>{0x1, 0x3FFFF}, {0xE0000, 0xEFFFF}};
  for (const auto& [first, last] : planes) {
    for (char32_t c = first; c <= last; ++c) {
      if (c == U'\n' || (c >= 0xD800 && c <= 0xDFFF)) continue;
      lines.push_back(U" a" + std::u32string(1, c) + U"b." + std::u32string(1, c) + U"2-" +
                      std::u32string(1, c) + U",x ");
    }
  }
  {
    std::ofstream input(dir / "lines.txt", std::ios::binary);
    for (const std::u32string& line : lines) input << thpc::metrics::encode_utf8(line) << "\n";
    std::ofstream(dir / "zh.py")
        << "import sys\nfrom sacrebleu.tokenizers.tokenizer_zh import TokenizerZh\n"
           "tokenize = TokenizerZh()\n"
           "out = open(sys.argv[2], 'w', encoding='utf-8', newline='\\n')\n"
           "for line in open(sys.argv[1], encoding='utf-8', newline='\\n'):\n"
           "    out.write(tokenize(line[:-1]) + '\\n')\n";
  }
  int exit_code = -1;
  run_capture(python + " " + (dir / "zh.py").string() + " " + (dir / "lines.txt").string() +
                  " " + (dir / "expected.txt").string(),
              &exit_code);
  ASSERT_EQ(exit_code, 0);
  std::ifstream expected_file(dir / "expected.txt", std::ios::binary);
  std::string expected;
  int differences = 0;
  for (const std::u32string& line : lines) {
    ASSERT_TRUE(std::getline(expected_file, expected));
    const std::string ours = thpc::metrics::encode_utf8(
        thpc::metrics::tokenize(line, TokenizerKind::kZh));
    if (ours != expected && ++differences <= 5) {
      ADD_FAILURE() << "U+" << std::hex << static_cast<uint32_t>(line[2]) << ": ours '" << ours
                    << "', sacreBLEU '" << expected << "'";
    }
  }
  EXPECT_EQ(differences, 0);
}

// -tok flores101 | flores200 | spBLEU-1K (spm): spBLEU, a segment's SentencePiece pieces,
// with the model where sacreBLEU keeps it. Here a model trained on Multi30k German stands
// in for each (the real ones are downloads), in a folder named by SACREBLEU for both
// programs; the hypotheses hold whitespace that SentencePiece keeps inside a piece
// (U+001C..U+001F, U+0085: Python's split() separates there) and that it normalizes.
struct SacreBleuSentencePiece : thpc::SacreBleuPeer {
  SacreBleuSentencePiece()
      : SacreBleuPeer("SentencePieceTokenizer.* still check the model's path and errors") {}
};

TEST_F(SacreBleuSentencePiece, SpBleuAsSacreBleusWithItsModel) {
  THPC_REQUIRE_DATA("multi30k/test_2016_flickr.de");
  if (thpc::run_process(python + " -c 'import sentencepiece'").exit_code != 0) {
    GTEST_SKIP() << python << " cannot import sentencepiece, which sacreBLEU's spm "
                 << "tokenizers need (bash tools/install_deps.sh installs it)";
  }
  std::filesystem::create_directories(dir / "sacrebleu" / "models");
  const auto trained = sentencepiece::SentencePieceTrainer::Train(
      "--input=" + thpc::data_path("multi30k/test_2016_flickr.de") + " --model_prefix=" +
      (dir / "model").string() + " --vocab_size=800 --model_type=unigram --minloglevel=2");
  ASSERT_TRUE(trained.ok()) << trained.ToString();
  for (const char* name : {"sacrebleu_tokenizer_spm.model", "flores200sacrebleuspm",
                           "spbleu-1k_tokenizer_spm.model"}) {
    std::filesystem::copy_file(dir / "model.model", dir / "sacrebleu" / "models" / name);
  }
  std::vector<std::string> references, hypotheses, others;
  {
    std::ifstream text(thpc::data_path("multi30k/test_2016_flickr.de"));
    const std::vector<std::string> odd = {"\x1c", "\x1f", "\xc2\x85", "\xe3\x80\x80", "\t",
                                          "\xc2\xa0"};
    std::string line;
    for (int i = 0; i < 300 && std::getline(text, line); ++i) {
      references.push_back(line);
      std::string changed = line;
      if (const size_t space = changed.find(' '); space != std::string::npos) {
        changed.replace(space, 1, odd[i % odd.size()]);
      }
      // (cut at a space: a cut inside a UTF-8 sequence would be invalid text)
      if (const size_t cut = changed.rfind(' ', changed.size() / 2);
          i % 3 == 0 && cut != std::string::npos) {
        changed.resize(cut);
      }
      hypotheses.push_back(changed);
      others.push_back(i % 2 ? line : "Ein Hund läuft.");
    }
  }
  const std::string ref = write_lines("ref.de", references);
  const std::string hyp = write_lines("hyp.de", hypotheses);
  const std::string other = write_lines("other.de", others);
  const std::string environment = "SACREBLEU=" + (dir / "sacrebleu").string();
  for (const char* tokenizer : {"flores101", "flores200", "spBLEU-1K", "spm"}) {
    expect_same_lines(environment, ref + " -i " + hyp + " -m bleu -tok " + tokenizer);
  }
  expect_same_lines(environment, ref + " -i " + hyp + " -m bleu chrf -tok flores200 -lc -b");
  expect_same_lines(environment, ref + " -i " + hyp + " -m bleu -tok flores200 -sl");
  expect_same_lines(environment,
                    ref + " -i " + hyp + " " + other + " -m bleu -tok flores200 -pbs -pbsn 50");
}

// Where sacreBLEU would keep the model of `kind` with SACREBLEU and HOME as given (nullopt:
// unset) and put back after.
std::string model_path_with(const std::optional<std::string>& sacrebleu,
                            const std::optional<std::string>& home, TokenizerKind kind) {
  const thpc::ScopedEnvironment given_sacrebleu("SACREBLEU", sacrebleu);
  const thpc::ScopedEnvironment given_home("HOME", home);
  return thpc::metrics::sacrebleu_model_path(kind);
}

// Where sacreBLEU keeps its models: $SACREBLEU/models, else ~/.sacrebleu/models with ~ as
// Python's expanduser reads it ($HOME, trailing slashes dropped); os.path.join's rules.
TEST(SentencePieceTokenizer, TheModelIsWhereSacreBleuKeepsIt) {
  const std::string home = "/home/user";
  EXPECT_EQ(model_path_with("/data/sb", home, TokenizerKind::kFlores200),
            "/data/sb/models/flores200sacrebleuspm");
  EXPECT_EQ(model_path_with("/data/sb/", home, TokenizerKind::kFlores101),
            "/data/sb/models/sacrebleu_tokenizer_spm.model");
  EXPECT_EQ(model_path_with("", home, TokenizerKind::kSpBleu1K),
            "models/spbleu-1k_tokenizer_spm.model");
  EXPECT_EQ(model_path_with(std::nullopt, "/home/user//", TokenizerKind::kFlores200),
            "/home/user/.sacrebleu/models/flores200sacrebleuspm");
  EXPECT_EQ(model_path_with(std::nullopt, "/", TokenizerKind::kFlores200),
            "/.sacrebleu/models/flores200sacrebleuspm");
  EXPECT_EQ(thpc::metrics::parse_tokenizer("spm"), TokenizerKind::kFlores101);
  EXPECT_EQ(thpc::metrics::tokenizer_name(TokenizerKind::kSpBleu1K), "spBLEU-1K");
  EXPECT_THROW(thpc::metrics::tokenize(U"a b", TokenizerKind::kFlores200), thpc::Error);
}

// ~ as Python's os.path.expanduser reads it where $HOME does not say it: HOME unset is the
// password entry's home, HOME set but empty is "/" (not the password entry's: Python takes
// an empty HOME as set). Either way round, the model was looked for where sacreBLEU never
// put it (a mutation audit dropped each rule, and no test saw it).
TEST(SentencePieceTokenizer, AnUnsetOrEmptyHomeIsReadAsPythonReadsIt) {
  const passwd* entry = getpwuid(getuid());
  ASSERT_TRUE(entry && entry->pw_dir);
  std::string password_home = entry->pw_dir;
  while (!password_home.empty() && password_home.back() == '/') password_home.pop_back();
  EXPECT_EQ(model_path_with(std::nullopt, std::nullopt, TokenizerKind::kFlores200),
            password_home + "/.sacrebleu/models/flores200sacrebleuspm");
  EXPECT_EQ(model_path_with(std::nullopt, "", TokenizerKind::kFlores200),
            "/.sacrebleu/models/flores200sacrebleuspm");
}

// A missing model says where sacreBLEU would have put it and how to fetch it, exit 1,
// before any input is read; a file that is not a model is said so; without BLEU the
// tokenizer's model is not needed (as sacreBLEU).
TEST(SentencePieceTokenizer, AMissingModelSaysWhereToFetchIt) {
  const std::string dir = std::filesystem::temp_directory_path() /
                          ("thpc_spm_tokenizer_" + std::to_string(getpid()));
  std::filesystem::create_directories(dir + "/models");
  std::ofstream(dir + "/ref.txt") << "a b c\n";
  const thpc::ProcessResult missing = thpc::run_process(
      "SACREBLEU=" + dir + "/none " + thpc::binary_dir() + "/transformer_score " + dir +
      "/ref.txt -i /nonexistent -tok flores200");
  EXPECT_EQ(missing.exit_code, 1) << missing.output;
  EXPECT_NE(missing.output.find(
                "-tok flores200: sacreBLEU's SentencePiece model is not at " + dir +
                "/none/models/flores200sacrebleuspm (sacreBLEU downloads it there on first "
                "use; this program does not reach the network): fetch it with  curl -L "
                "--create-dirs -o " + dir + "/none/models/flores200sacrebleuspm "
                "https://tinyurl.com/flores200sacrebleuspm"),
            std::string::npos)
      << missing.output;
  EXPECT_EQ(missing.output.find("/nonexistent"), std::string::npos) << "read before";
  std::ofstream(dir + "/models/flores200sacrebleuspm") << "<html>Too many requests</html>\n";
  const thpc::ProcessResult garbage = thpc::run_process(
      "SACREBLEU=" + dir + " " + thpc::binary_dir() + "/transformer_score " + dir +
      "/ref.txt -i " + dir + "/ref.txt -tok flores200");
  EXPECT_EQ(garbage.exit_code, 1) << garbage.output;
  EXPECT_NE(garbage.output.find(dir + "/models/flores200sacrebleuspm is not a SentencePiece "
                                      "model (a download that failed part way?"),
            std::string::npos)
      << garbage.output;
  const thpc::ProcessResult chrf = thpc::run_process(
      "SACREBLEU=" + dir + "/none " + thpc::binary_dir() + "/transformer_score " + dir +
      "/ref.txt -i " + dir + "/ref.txt -tok flores200 -m chrf -b");
  EXPECT_EQ(chrf.exit_code, 0) << chrf.output;
  EXPECT_EQ(chrf.output, "100.0\n");
  std::filesystem::remove_all(dir);
}

// Rank 0 of a training job scores each validation's translations alone while the other
// ranks wait for the score, counting dist.timeout_s from the last sign of work: the
// scorers sign with each sentence they read or score (common/still_working.h), so that a
// large validation set on a busy node is not taken for a rank that hangs.
TEST(ScorersOfAValidationSet, GiveASignOfWorkWithEachSentence) {
  std::vector<std::string> references, hypotheses;
  for (int i = 0; i < 50; ++i) {
    references.push_back("the cat " + std::to_string(i) + " sat on the mat .");
    hypotheses.push_back("a cat " + std::to_string(i % 7) + " sat on a mat");
  }
  int64_t signs = 0;
  const thpc::StillWorkingSign sign([&] { ++signs; });
  const thpc::metrics::BleuScorer bleu({references}, BleuOptions{});
  EXPECT_GE(signs, 50) << "reading the references";
  signs = 0;
  EXPECT_GT(bleu.corpus_score(hypotheses).score, 0.0);
  EXPECT_GE(signs, 50) << "scoring the hypotheses";
  signs = 0;
  const thpc::metrics::ChrfScorer chrf({references}, thpc::metrics::ChrfOptions{});
  EXPECT_GE(signs, 50) << "reading the references";
  signs = 0;
  EXPECT_GT(chrf.corpus_score(hypotheses), 0.0);
  EXPECT_GE(signs, 50) << "scoring the hypotheses";
}

}  // namespace
