// The paper's tokenized BLEU (Moses tokenizer.perl, tensor2tensor's ##AT## compound
// splitting, multi-bleu.perl) against what the Perl scripts themselves print: the vectors
// of tests/moses_bleu/, written by tools/gen_moses_vectors.py from mosesdecoder's scripts
// (two versions, see metrics/moses_tokenize.h), line by line and byte by byte; the same
// on newstest2013/2014/2017 and the 16 WMT17 systems when THPC_DATA has them (only their
// expected hashes and scores are in the repository); a few rules spelled out; and
// transformer_score's --tokenize moses / moses-compound as a program.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "common/error.h"
#include "common/sha256.h"
#include "data_dir.h"
#include "expect_error.h"
#include "metrics/bleu.h"
#include "metrics/moses_tokenize.h"
#include "metrics/multi_bleu.h"
#include "program.h"

namespace {

using thpc::metrics::MosesBleuOptions;
using thpc::metrics::MosesLanguage;
using thpc::metrics::MosesTokenizerOptions;
using thpc::metrics::MosesVersion;

const std::string kVectors = std::string(THPC_SOURCE_DIR) + "/tests/moses_bleu";

std::vector<std::string> lines_of(const std::string& path) {
  return thpc::metrics::read_lines(path);
}

// The tab-separated rows of FILE, comment lines left out.
std::vector<std::vector<std::string>> rows_of(const std::string& path) {
  std::vector<std::vector<std::string>> rows;
  for (const std::string& line : lines_of(path)) {
    if (line.empty() || line[0] == '#') continue;
    std::vector<std::string> fields;
    size_t start = 0;
    for (size_t tab = line.find('\t'); tab != std::string::npos; tab = line.find('\t', start)) {
      fields.push_back(line.substr(start, tab - start));
      start = tab + 1;
    }
    fields.push_back(line.substr(start));
    rows.push_back(fields);
  }
  return rows;
}

std::vector<std::string> split_on(const std::string& text, char separator) {
  std::vector<std::string> parts;
  std::stringstream stream(text);
  for (std::string part; std::getline(stream, part, separator);) parts.push_back(part);
  return parts;
}

MosesTokenizerOptions tokenizer(const std::string& language, const std::string& version) {
  return {thpc::metrics::parse_moses_language(language),
          thpc::metrics::parse_moses_version(version)};
}

MosesBleuOptions bleu_options(const std::string& language, const std::string& version,
                              bool compound) {
  MosesBleuOptions options;
  options.tokenizer = tokenizer(language, version);
  options.split_compounds = compound;
  return options;
}

std::string tokenize(const std::string& line, const std::string& language = "de",
                     const std::string& version = "current") {
  return thpc::metrics::moses_tokenize_utf8(line, tokenizer(language, version));
}

// A line shown with its control characters visible, for failure messages.
std::string visible(const std::string& text) {
  std::string out;
  for (unsigned char c : text) {
    if (c < 0x20 || c == 0x7F) {
      char code[8];
      std::snprintf(code, sizeof code, "\\x%02X", c);
      out += code;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out;
}

// ---- the vectors ----

// tokenizer.perl -l LANG of every line of inputs.txt, for both languages and versions.
TEST(MosesTokenizer, PrintsWhatTokenizerPerlPrintsOnTheVectors) {
  const std::vector<std::string> inputs = lines_of(kVectors + "/inputs.txt");
  ASSERT_GT(inputs.size(), 300u);
  for (const std::string language : {"de", "fr"}) {
    for (const std::string version : {"current", "2017"}) {
      const std::vector<std::string> expected =
          lines_of(kVectors + "/tok." + language + "." + version + ".txt");
      ASSERT_EQ(expected.size(), inputs.size()) << language << " " << version;
      int differing = 0;
      for (size_t i = 0; i < inputs.size(); ++i) {
        const std::string ours = tokenize(inputs[i], language, version);
        if (ours != expected[i] && ++differing <= 5) {
          ADD_FAILURE() << language << " " << version << ", inputs.txt line " << i + 1
                        << ": " << visible(inputs[i]) << "\n  ours: " << visible(ours)
                        << "\n  perl: " << visible(expected[i]);
        }
      }
      EXPECT_EQ(differing, 0) << language << " " << version;
    }
  }
}

// perl -ple 's{(\S)-(\S)}{$1 ##AT##-##AT## $2}g' of the German tokenizer output.
TEST(MosesCompoundSplit, PrintsWhatPerlPrintsOnTheVectors) {
  for (const std::string version : {"current", "2017"}) {
    const std::vector<std::string> tokens = lines_of(kVectors + "/tok.de." + version + ".txt");
    const std::vector<std::string> expected = lines_of(kVectors + "/atat.de." + version + ".txt");
    ASSERT_EQ(expected.size(), tokens.size());
    for (size_t i = 0; i < tokens.size(); ++i) {
      EXPECT_EQ(thpc::metrics::split_compounds(tokens[i]), expected[i])
          << version << ", line " << i + 1 << ": " << visible(tokens[i]);
    }
  }
}

// The whole pipeline on the BLEU cases, in every configuration: multi-bleu.perl's line,
// digit for digit, or an error where it prints no score.
TEST(MultiBleu, PrintsWhatMultiBleuPerlPrintsOnTheVectors) {
  const std::vector<std::vector<std::string>> rows = rows_of(kVectors + "/bleu_expected.tsv");
  ASSERT_GE(rows.size(), 70u);
  for (const std::vector<std::string>& row : rows) {
    ASSERT_EQ(row.size(), 7u);
    const std::string& name = row[0];
    const std::vector<std::string> hypotheses = lines_of(kVectors + "/" + row[1]);
    std::vector<std::vector<std::string>> references;
    for (const std::string& file : split_on(row[2], ',')) {
      references.push_back(lines_of(kVectors + "/" + file));
    }
    const MosesBleuOptions options = bleu_options(row[3], row[4], row[5] == "yes");
    const std::string& expected = row[6];
    const std::string where = name + " " + row[3] + " " + row[4] + " compound " + row[5];
    if (expected.rfind("exit ", 0) == 0) {
      EXPECT_THROW(thpc::metrics::moses_bleu(hypotheses, references, options), thpc::Error)
          << where;
    } else {
      EXPECT_EQ(thpc::metrics::moses_bleu(hypotheses, references, options).line(), expected)
          << where;
    }
  }
}

// ---- the rules, spelled out ----

TEST(MosesTokenizer, SplitsPunctuationAndEscapesAsTokenizerPerl) {
  EXPECT_EQ(tokenize("Er sagte: \"Nein\" & ging."), "Er sagte : &quot; Nein &quot; &amp; ging .");
  EXPECT_EQ(tokenize("a|b [c] <d>"), "a &#124; b &#91; c &#93; &lt; d &gt;");
  EXPECT_EQ(tokenize("5,300 Euro, 3,14"), "5,300 Euro , 3,14");
  EXPECT_EQ(tokenize("Warte...ja"), "Warte ... ja");
  EXPECT_EQ(tokenize("rich-text format"), "rich-text format");  // hyphens stay
  // German splits every apostrophe; French glues it to the word before.
  EXPECT_EQ(tokenize("l'homme"), "l &apos; homme");
  EXPECT_EQ(tokenize("l'homme", "fr"), "l&apos; homme");
}

TEST(MosesTokenizer, PeriodsOfAbbreviationsStay) {
  EXPECT_EQ(tokenize("Das ist z.B. gut."), "Das ist z.B. gut .");
  EXPECT_EQ(tokenize("Am 5. Mai kam Dr. Müller."), "Am 5. Mai kam Dr. Müller .");
  EXPECT_EQ(tokenize("Er war 5. dann"), "Er war 5. dann");  // a lowercase word follows
  // The one difference of the two versions: the period after the last word.
  EXPECT_EQ(tokenize("iPhone 5.", "de", "current"), "iPhone 5 .");
  EXPECT_EQ(tokenize("iPhone 5.", "de", "2017"), "iPhone 5.");
  EXPECT_EQ(tokenize("Gut.", "de", "2017"), "Gut .");
}

TEST(MosesTokenizer, BlankLinesPassThroughUnchanged) {
  EXPECT_EQ(tokenize(""), "");
  EXPECT_EQ(tokenize(" \t"), " \t");
  EXPECT_EQ(tokenize("\xE3\x80\x80"), "\xE3\x80\x80");  // U+3000 is Perl whitespace
  EXPECT_EQ(tokenize("\x01"), "");  // a control character is not: removed, empty line
  EXPECT_THROW(tokenize("a \xC3\x28"), thpc::Error);
}

TEST(MosesCompoundSplit, SplitsAsPerlOnBytes) {
  using thpc::metrics::split_compounds;
  EXPECT_EQ(split_compounds("rich-text format"), "rich ##AT##-##AT## text format");
  // A match consumes the character after the hyphen: the second hyphen is left.
  EXPECT_EQ(split_compounds("a-b-c"), "a ##AT##-##AT## b-c");
  // Bytes, not characters: the match after "a-" takes only ü's first byte, so its
  // second byte starts the next match.
  EXPECT_EQ(split_compounds("a-\xC3\xBC-b"), "a ##AT##-##AT## \xC3\xBC ##AT##-##AT## b");
  EXPECT_EQ(split_compounds("a - b -x"), "a - b -x");
}

TEST(MultiBleu, SplitsOnAsciiWhitespaceOnly) {
  EXPECT_EQ(thpc::metrics::split_multi_bleu_tokens(" a\tb\x0B" "c\r"),
            (std::vector<std::string>{"a", "b", "c"}));
  // U+00A0 and U+3000 are token text to multi-bleu.perl, which reads bytes.
  EXPECT_EQ(thpc::metrics::split_multi_bleu_tokens("a\xC2\xA0 \xE3\x80\x80"),
            (std::vector<std::string>{"a\xC2\xA0", "\xE3\x80\x80"}));
}

TEST(MultiBleu, FormulaAndLine) {
  // 4 of 5 unigrams, 2 of 4 bigrams, 1 of 3 trigrams, 0 of 2 four-grams: BLEU 0 (no
  // smoothing); c = 5 < r = 6: BP = exp(1 - 6/5).
  const thpc::metrics::MultiBleuScore zero =
      thpc::metrics::multi_bleu({"a b c d x"}, {{"a b c y d e"}});
  EXPECT_EQ(zero.line(), "BLEU = 0.00, 80.0/50.0/33.3/0.0 (BP=0.819, ratio=0.833, "
                         "hyp_len=5, ref_len=6)");
  const thpc::metrics::MultiBleuScore some =
      thpc::metrics::multi_bleu({"a b c d e f", "g h"}, {{"a b c d e x", "g h"}});
  // p = 7/8, 5/6, 3/4, 2/3 → BLEU = (7/8 · 5/6 · 3/4 · 2/3)^(1/4); the bound allows the
  // few ulps between exp of a mean of logs and pow.
  EXPECT_NEAR(some.bleu, std::pow(7.0 / 8 * 5.0 / 6 * 3.0 / 4 * 2.0 / 3, 0.25), 1e-12);
  EXPECT_EQ(some.brevity_penalty, 1.0);
  thpc::expect_error([] { thpc::metrics::multi_bleu({"a"}, {{" "}}); }, {"every reference"});
  thpc::expect_error([] { thpc::metrics::multi_bleu({""}, {{"a"}}); }, {"division by zero"});
}

// ---- real text, when THPC_DATA has it ----

std::string tokenized_file(const std::string& path, const MosesBleuOptions& options) {
  std::string text;
  for (const std::string& line : lines_of(path)) {
    text += thpc::metrics::moses_bleu_tokens(line, options);
    text += '\n';
  }
  return text;
}

TEST(MosesBleuRealData, TokenizesNewstestReferencesAsTokenizerPerl) {
  THPC_REQUIRE_DATA("wmt14_test/newstest2014.de");
  THPC_REQUIRE_DATA("sacrebleu_tests/wmt17_en-de");
  int checked = 0;
  for (const std::vector<std::string>& row : rows_of(kVectors + "/real_data_expected.tsv")) {
    if (row[0] != "tok_sha256") continue;
    const std::string text =
        tokenized_file(thpc::data_path(row[1]), bleu_options("de", row[3], row[4] == "yes"));
    EXPECT_EQ(thpc::sha256_hex(text.data(), text.size()), row[5])
        << row[1] << " " << row[3] << " compound " << row[4]
        << " (tools/gen_moses_vectors.py MOSES --data DIR --check shows the lines)";
    ++checked;
  }
  EXPECT_EQ(checked, 12);
}

TEST(MosesBleuRealData, ScoresWmt17SystemsAsMultiBleuPerl) {
  THPC_REQUIRE_DATA("wmt14_test/newstest2014.de");
  THPC_REQUIRE_DATA("sacrebleu_tests/wmt17_en-de");
  // Each file is tokenized once per configuration (the references serve many rows).
  std::map<std::string, std::vector<std::string>> tokenized;
  auto tokens_of = [&](const std::string& file, const std::string& version,
                       const std::string& compound) -> const std::vector<std::string>& {
    std::vector<std::string>& tokens = tokenized[file + "|" + version + "|" + compound];
    if (!tokens.empty()) return tokens;
    std::vector<std::string> lines;
    const std::string shifted = "shifted:";
    if (file.rfind(shifted, 0) == 0) {  // line i against line i+1, the last the first
      const std::vector<std::string> reference =
          lines_of(thpc::data_path(file.substr(shifted.size())));
      lines.assign(reference.begin() + 1, reference.end());
      lines.push_back(reference.front());
    } else {
      lines = lines_of(thpc::data_path(file));
    }
    const MosesBleuOptions options = bleu_options("de", version, compound == "yes");
    for (const std::string& line : lines) {
      tokens.push_back(thpc::metrics::moses_bleu_tokens(line, options));
    }
    return tokens;
  };
  int checked = 0;
  for (const std::vector<std::string>& row : rows_of(kVectors + "/real_data_expected.tsv")) {
    if (row[0] != "bleu") continue;
    const std::vector<std::string>& hypothesis = tokens_of(row[1], row[3], row[4]);
    const std::vector<std::string>& reference = tokens_of(row[2], row[3], row[4]);
    EXPECT_EQ(thpc::metrics::multi_bleu(hypothesis, {reference}).line(), row[5])
        << row[1] << " " << row[3] << " compound " << row[4];
    ++checked;
  }
  EXPECT_EQ(checked, 68);  // 17 hypotheses x 2 versions x with and without compounds
}

// ---- the program ----

// transformer_score ARGUMENTS through the shell: exit code, and stdout and stderr together.
thpc::ProcessResult run_score(const std::string& arguments) {
  return thpc::run_process(thpc::binary_dir() + "/transformer_score " + arguments);
}

// The row of bleu_expected.tsv for CASE in the given configuration.
std::vector<std::string> vector_row(const std::string& name, const std::string& language,
                                    const std::string& version, const std::string& compound) {
  for (const std::vector<std::string>& row : rows_of(kVectors + "/bleu_expected.tsv")) {
    if (row[0] == name && row[3] == language && row[4] == version && row[5] == compound) {
      return row;
    }
  }
  ADD_FAILURE() << "no row " << name << " " << language << " " << version << " " << compound;
  return {};
}

std::string references_argument(const std::vector<std::string>& row) {
  std::string argument;
  for (const std::string& file : split_on(row[2], ',')) argument += " " + kVectors + "/" + file;
  return argument;
}

TEST(ScoreProgramMoses, PrintsMultiBleuPerlsLine) {
  const std::vector<std::string> row = vector_row("two_refs", "de", "current", "yes");
  ASSERT_FALSE(row.empty());
  thpc::ProcessResult run = run_score(references_argument(row) + " -i " + kVectors + "/" + row[1] +
                      " --tokenize moses-compound");
  EXPECT_EQ(run.exit_code, 0) << run.output;
  EXPECT_EQ(run.output, row[6] + "\n");
  // -b: the score alone, with multi-bleu.perl's two decimals unless -w says otherwise.
  run = run_score(references_argument(row) + " --tokenize moses-compound -b < " + kVectors +
                  "/" + row[1]);
  EXPECT_EQ(run.output, row[6].substr(7, row[6].find(',') - 7) + "\n");
  run = run_score(references_argument(row) + " --tokenize moses-compound -b -w 1 < " +
                  kVectors + "/" + row[1]);
  EXPECT_EQ(run.output.size(), row[6].find(',') - 7);  // one decimal fewer, and the newline

  const std::vector<std::string> french = vector_row("all", "fr", "2017", "no");
  ASSERT_FALSE(french.empty());
  run = run_score(references_argument(french) + " -i " + kVectors + "/" + french[1] +
                  " --tokenize moses --moses-lang fr --moses-version 2017");
  EXPECT_EQ(run.exit_code, 0) << run.output;
  EXPECT_EQ(run.output, french[6] + "\n");
}

TEST(ScoreProgramMoses, RefusesWhatMultiBleuPerlCannotDo) {
  const std::string files = kVectors + "/inputs.txt -i " + kVectors + "/inputs.txt";
  // A bad command line: exit 2 and one line naming the option.
  const std::vector<std::pair<std::string, std::string>> refused = {
      {" --tokenize moses -lc", "-lc is not an option of multi-bleu.perl"},
      {" --tokenize moses-compound -sl", "-sl is not an option of multi-bleu.perl"},
      {" --tokenize moses -s none", "-s is not an option of multi-bleu.perl"},
      {" --tokenize moses -m chrf", "scores BLEU only"},
      // (it was ignored: multi-bleu.perl's line has two decimals)
      {" --tokenize moses -w 4", "-w sets the decimals of the score alone (-b)"},
      {" --moses-lang de", "--moses-lang needs --tokenize moses"},
      {" --tokenize moses --moses-lang en", "unknown Moses tokenizer language 'en'"},
      {" --tokenize moses --moses-version 2019", "unknown Moses tokenizer version '2019'"},
  };
  for (const auto& [options, message] : refused) {
    const thpc::ProcessResult run = run_score(files + options);
    EXPECT_EQ(run.exit_code, 2) << options;
    EXPECT_NE(run.output.find(message), std::string::npos) << run.output;
  }

  const std::vector<std::string> empty = vector_row("empty_refs", "de", "current", "yes");
  ASSERT_FALSE(empty.empty());
  const thpc::ProcessResult run = run_score(references_argument(empty) + " -i " + kVectors +
                                            "/" + empty[1] + " --tokenize moses-compound");
  EXPECT_EQ(run.exit_code, 1);
  EXPECT_NE(run.output.find("every reference segment is empty"), std::string::npos) << run.output;
}

}  // namespace
