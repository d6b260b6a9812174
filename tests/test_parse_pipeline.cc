// The parsing mode end to end, as a user runs it: tools/run_parser.sh with
// input/parse_tiny.ini linearizes the WSJ sample, preprocesses it (bracket tokens kept
// whole), trains on the CPU, beam-searches dev and test sentences, turns the sequences
// back into trees (repaired where needed, and counted) and scores them with EVALB's
// COLLINS.prm beside the right-branching baseline.
//
// The run here is short (kSteps training steps, the first kEvalLimit dev and test
// sentences of at most kEvalMaxWords words) so that it checks the wiring of the five
// programs in about a minute: every sentence gets a tree, EVALB scores them without an
// error, and the baseline of those sentences scores what it scores by hand. Whether the
// tiny parser beats the baseline is a matter of training minutes the suite cannot spend
// on 2 cores (README "Constituency parsing" has the numbers).
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <iostream>
#include <regex>
#include <sstream>
#include <string>

#include "data_dir.h"
#include "program.h"

namespace {

namespace fs = std::filesystem;

constexpr int kSteps = 20;
constexpr int kEvalLimit = 20;
constexpr int kEvalMaxWords = 10;

// The right-branching baseline of the first 20 dev sentences of at most 10 words
// (deterministic: the words and the gold tags alone decide it), as transformer_evalb
// scores it with COLLINS.prm; the first 100 dev sentences give 14.51, all of dev 17.27.
constexpr double kBaselineF1 = 32.18;

TEST(ParsePipeline, ShortRunScoresEverySentenceBesideTheBaseline) {
  THPC_REQUIRE_DATA("ptb_sample/combined/wsj_0199.mrg");
  THPC_REQUIRE_DATA("evalb/COLLINS.prm");
  const fs::path work = fs::temp_directory_path() / ("thpc_parse_" + std::to_string(::getpid()));
  fs::remove_all(work);
  const std::string command =
      "THPC_DATA=" + thpc::data_root() + " BUILD=" + std::string(THPC_BINARY_DIR) +
      " WORK=" + work.string() + " EVAL_LIMIT=" + std::to_string(kEvalLimit) +
      " EVAL_MAX_WORDS=" + std::to_string(kEvalMaxWords) + " bash " +
      std::string(THPC_SOURCE_DIR) + "/tools/run_parser.sh input/parse_tiny.ini --data.dir=" +
      (work / "data").string() + " --checkpoint.dir=" + (work / "checkpoints").string() +
      " --train.max_steps=" + std::to_string(kSteps) + " --train.threads=1";
  const thpc::ProcessResult result = thpc::run_process(command);
  ASSERT_EQ(result.exit_code, 0) << result.output;

  for (const std::string split : {"dev", "test"}) {
    const std::regex line(split +
                          R"(: parser F1 ([0-9.]+) \| right-branching F1 ([0-9.]+) \| (\d+) sentences, )"
                          R"((\d+) well-formed, (\d+) repaired, (\d+) replaced)");
    std::smatch match;
    ASSERT_TRUE(std::regex_search(result.output, match, line)) << result.output;
    // dev has 27 sentences of at most 10 words, test 17.
    const int sentences = std::stoi(match[3]);
    EXPECT_EQ(sentences, split == "dev" ? kEvalLimit : 17) << split;
    // Constrained decoding (run_parser.sh's default): every sequence is a tree already.
    EXPECT_EQ(std::stoi(match[4]), sentences) << split;
    EXPECT_GE(std::stod(match[1]), 0.0);
    if (split == "dev") {
      EXPECT_NEAR(std::stod(match[2]), kBaselineF1, 0.005);
    }
    std::cout << match[0] << "\n";
    // Every decoded sentence became a tree over its own words, which EVALB accepted.
    const std::string report = thpc::read_file(work / (split + ".evalb"));
    EXPECT_NE(report.find("Number of Error sentence  =      0"), std::string::npos) << report;
    EXPECT_EQ(thpc::lines_of(thpc::read_file(work / (split + ".hyp.gold"))).size(),
              static_cast<size_t>(sentences));
  }
  // The decoded sentences are the short ones.
  for (const std::string& words : thpc::lines_of(thpc::read_file(work / "dev.eval.words"))) {
    std::istringstream in(words);
    int count = 0;
    for (std::string word; in >> word;) ++count;
    EXPECT_LE(count, kEvalMaxWords) << words;
  }
  fs::remove_all(work);
}

// Bad input stops the script before any work, with one line that says what to do.
TEST(ParsePipeline, MissingDataOrConfigIsAClearError) {
  const fs::path work = fs::temp_directory_path() / ("thpc_parse_bad_" + std::to_string(::getpid()));
  fs::remove_all(work);
  const std::string script = "bash " + std::string(THPC_SOURCE_DIR) + "/tools/run_parser.sh";
  thpc::ProcessResult result =
      thpc::run_process("THPC_DATA=" + work.string() + "/nothing WORK=" + work.string() + " " + script);
  EXPECT_EQ(result.exit_code, 1);
  EXPECT_NE(result.output.find("is not a folder"), std::string::npos) << result.output;
  EXPECT_NE(result.output.find("tools/fetch_data.sh ptb_sample DIR"), std::string::npos)
      << result.output;

  fs::create_directories(work / "data");
  result = thpc::run_process("THPC_DATA=" + (work / "data").string() + " WORK=" + work.string() +
                             " " + script);
  EXPECT_EQ(result.exit_code, 1);
  EXPECT_NE(result.output.find("ptb_sample/combined/wsj_0001.mrg is missing"), std::string::npos)
      << result.output;

  if (!thpc::data_root().empty()) {
    result = thpc::run_process("THPC_DATA=" + thpc::data_root() + " WORK=" + work.string() + " " +
                               script + " input/no_such.ini");
    EXPECT_EQ(result.exit_code, 1);
    EXPECT_NE(result.output.find("input/no_such.ini: no such config file"), std::string::npos)
        << result.output;
  }
  EXPECT_FALSE(fs::exists(work / "train.tree"));
  fs::remove_all(work);
}

}  // namespace
