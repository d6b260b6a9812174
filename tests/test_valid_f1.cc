// A parser's validation bracket F1 during training (train.valid_metric = f1): how a
// translation and a target become trees (tree_words, sequence_with_word_slots,
// gold_tree_sequence), and on the WSJ sample's shards a run that logs it, keeps its best
// checkpoint by it and refuses what would make it meaningless. That the F1 logged equals
// tools/run_parser.sh's for the same checkpoint is test_parse_pipeline's (a 300-step run).
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <regex>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "data_dir.h"
#include "decode/tree_filter.h"
#include "program.h"
#include "train/validation_scorer.h"

namespace thpc {
namespace {

namespace fs = std::filesystem;

const SpecialIds kIds;  // pad 0, unk 1, bos 2, eos 3
enum : int32_t { kS = 4, kNP = 5, kClose = 6, kThe = 7, kCa = 8, kT = 9, kSpace = 10, kX = 11,
                 kAdjp = 12, kXX = 13 };
// "▁(S" "▁(NP" "▁)" "▁the" "▁ca" "t" "▁" "X" "ADJP" "▁XX": "(X" is not a piece, and a
// label written "▁" "(" "ADJP" has "(" unknown.
const std::vector<std::string> kPieces = {
    "<pad>", "<unk>", "<s>", "</s>", "\xe2\x96\x81(S", "\xe2\x96\x81(NP", "\xe2\x96\x81)",
    "\xe2\x96\x81the", "\xe2\x96\x81" "ca", "t", "\xe2\x96\x81", "X", "ADJP", "\xe2\x96\x81XX"};

TEST(ValidF1, TreeWordsJoinAWordsPiecesAndReadBracketsByTheirText) {
  // (S (NP the cat ) the )
  const TokenSequence tree = {kS, kNP, kThe, kCa, kT, kClose, kThe, kClose};
  EXPECT_EQ(tree_words(tree, kPieces),
            (std::vector<std::string>{"(S", "(NP", "the", "cat", ")", "the", ")"}));
  EXPECT_EQ(sequence_with_word_slots(tree, kPieces), "(S (NP XX XX ) XX )");
  // A label split into pieces is still a bracket; ids outside the vocabulary are skipped.
  EXPECT_EQ(sequence_with_word_slots({kS, 99, kSpace, kX, kThe, kClose}, kPieces), "(S XX XX )");
  EXPECT_EQ(tree_words({kS, kSpace, kX, kThe, kClose}, kPieces),
            (std::vector<std::string>{"(S", "X", "the", ")"}));
  // Placeholders are words like any other.
  EXPECT_EQ(sequence_with_word_slots({kS, kXX, kXX, kClose}, kPieces), "(S XX XX )");
  // The words of a source, as the filter cuts them.
  EXPECT_EQ(source_words({kThe, kCa, kT, kThe}, kPieces),
            (std::vector<TokenSequence>{{kThe}, {kCa, kT}, {kThe}}));
}

TEST(ValidF1, AnUnknownOpeningBracketIsReadAsOneWhereThatGivesTheTree) {
  // (S (ADJP the cat ) ) with "(" unknown: "▁" "<unk>" "ADJP".
  const TokenSequence tree = {kS, kSpace, kIds.unk, kAdjp, kThe, kCa, kT, kClose, kClose};
  EXPECT_EQ(gold_tree_sequence(tree, kPieces, kIds.unk, 2), "(S (ADJP XX XX ) )");
  // Read as a bracket the tree would be unbalanced (one ")" only), or hold 3 words where
  // the source has 2: a word with an unknown character.
  const TokenSequence word = {kS, kSpace, kIds.unk, kAdjp, kThe, kCa, kT, kClose};
  EXPECT_EQ(gold_tree_sequence(word, kPieces, kIds.unk, 3), "(S XX XX XX )");
  EXPECT_EQ(gold_tree_sequence(tree, kPieces, kIds.unk, 3), "(S XX XX XX ) )");
  // Without unknown pieces: sequence_with_word_slots'.
  const TokenSequence plain = {kS, kNP, kThe, kCa, kT, kClose, kThe, kClose};
  EXPECT_EQ(gold_tree_sequence(plain, kPieces, kIds.unk, 3),
            sequence_with_word_slots(plain, kPieces));
}

// The WSJ sample's shards (tools/run_parser.sh PREPARE_ONLY=1, the words as leaves),
// prepared once for the tests below.
class ValidF1Run : public ::testing::Test {
 protected:
  void SetUp() override {
    THPC_REQUIRE_DATA("ptb_sample/combined/wsj_0199.mrg");
    root_ = fs::temp_directory_path() / ("thpc_valid_f1_" + std::to_string(::getpid()));
    fs::remove_all(root_);
    const ProcessResult prepared = run_process(
        "THPC_DATA=" + data_root() + " BUILD=" + binary_dir() + " OUT=" + root_.string() +
        " PREPARE_ONLY=1 bash " THPC_SOURCE_DIR "/tools/run_parser.sh");
    ASSERT_EQ(prepared.exit_code, 0) << prepared.output;
  }
  void TearDown() override {
    if (!root_.empty()) fs::remove_all(root_);
  }
  // transformer_hpc input/parse_tiny.ini on the shards (DIR/`data`), checkpoints in
  // DIR/`run`.
  ProcessResult train(const std::string& run, const std::string& options,
                      const std::string& data = "data") const {
    return run_process("cd " THPC_SOURCE_DIR " && " + binary_dir() +
                       "/transformer_hpc input/parse_tiny.ini --data.dir=" +
                       (root_ / data).string() + " --checkpoint.dir=" +
                       (root_ / run / "checkpoints").string() + " --train.threads=1 " + options);
  }
  fs::path root_;
};

const std::string kValidF1 =
    " --train.valid_bleu=true --train.valid_metric=f1 --train.valid_every=10";

// The line "valid step STEP | ... | f1 X": X, or -1.
double logged_f1(const std::string& output, int step) {
  const std::regex line("valid step " + std::to_string(step) + R"( \|.*\| f1 ([0-9.]+))");
  std::smatch match;
  return std::regex_search(output, match, line) ? std::stod(match[1]) : -1.0;
}

TEST_F(ValidF1Run, ARunLogsItKeepsTheBestByItAndEvalScoresTheSame) {
  const ProcessResult run =
      train("run", kValidF1 + " --train.max_steps=20 --checkpoint.keep_best=f1 "
                              "--checkpoint.every_steps=10 --checkpoint.keep=2");
  ASSERT_EQ(run.exit_code, 0) << run.output;
  const double first = logged_f1(run.output, 10), second = logged_f1(run.output, 20);
  ASSERT_GE(first, 0.0) << run.output;
  ASSERT_GE(second, 0.0) << run.output;
  EXPECT_LE(second, 100.0);
  char best_line[64];
  std::snprintf(best_line, sizeof best_line, "best valid f1 %.2f (step %d)",
                std::max(first, second), second > first ? 20 : 10);
  EXPECT_NE(run.output.find(best_line), std::string::npos) << run.output;
  const std::string metrics = read_file(root_ / "run" / "checkpoints" / "metrics.jsonl");
  EXPECT_NE(metrics.find("\"valid_f1\":"), std::string::npos) << metrics;
  EXPECT_NE(metrics.find("\"best_valid_f1\":"), std::string::npos) << metrics;
  // best.h5 holds the better validation's step and its F1.
  const Checkpoint best =
      read_checkpoint((root_ / "run" / "checkpoints" / "best.h5").string(),
                      CheckpointParts::ParamsOnly);
  ASSERT_TRUE(best.validation.has_value());
  EXPECT_EQ(best.validation->metric, "f1");
  EXPECT_NEAR(best.validation->value, std::max(first, second), 0.005);
  EXPECT_EQ(best.step, second > first ? 20 : 10);
  // --eval of the step-20 checkpoint: the same F1.
  const ProcessResult evaluated =
      train("eval", kValidF1 + " --eval " +
                        (root_ / "run" / "checkpoints" / "step_00000020.h5").string());
  ASSERT_EQ(evaluated.exit_code, 0) << evaluated.output;
  EXPECT_EQ(logged_f1(evaluated.output, 20), second) << evaluated.output;
  // A length limit that leaves trees unfinished is said (it cut the F1 without a word).
  const ProcessResult limited =
      train("eval", kValidF1 + " --decode.max_len_a=1 --decode.max_len_b=3 --eval " +
                        (root_ / "run" / "checkpoints" / "step_00000020.h5").string());
  ASSERT_EQ(limited.exit_code, 0) << limited.output;
  EXPECT_NE(limited.output.find("note: 273 of the 273 validation trees are longer than the "
                                "validation search's length limit (decode.max_len_a 1 x "
                                "source tokens + decode.max_len_b 3, at most "
                                "model.max_positions - 1 = 511 with the end)"),
            std::string::npos)
      << limited.output;
  EXPECT_EQ(evaluated.output.find("validation trees are longer"), std::string::npos)
      << evaluated.output;
}

// tools/choose_average.sh on a run that averaged its best checkpoints by F1 (it read the
// metric of "by valid f1" as "f" and stopped; a helper's walk).
TEST_F(ValidF1Run, ChooseAverageNamesTheCandidateWithTheBetterF1) {
  const ProcessResult run = train(
      "averaged", kValidF1 + " --train.max_steps=30 --checkpoint.keep_best=f1 "
                             "--checkpoint.keep_best_count=2 --checkpoint.average_best=2 "
                             "--checkpoint.every_steps=10 --checkpoint.keep=2 "
                             "--checkpoint.average_last=2");
  ASSERT_EQ(run.exit_code, 0) << run.output;
  ASSERT_NE(run.output.find("best checkpoints by valid f1"), std::string::npos) << run.output;
  const fs::path log = root_ / "averaged.log";
  { std::ofstream(log) << run.output; }
  const ProcessResult chosen = run_process(
      "cd " THPC_SOURCE_DIR " && bash tools/choose_average.sh parse " + log.string() + " " +
      binary_dir() + "/transformer_hpc input/parse_tiny.ini --data.dir=" +
      (root_ / "data").string() + " --train.threads=1" + kValidF1);
  ASSERT_EQ(chosen.exit_code, 0) << chosen.output;
  EXPECT_NE(chosen.output.find("parse: the better validation f1 is "), std::string::npos)
      << chosen.output;
}

// A validation pair longer than the position table is left out of the validation, its F1
// included: training said so, --eval and --dry-run did not (a helper's walk: a dev tree of
// 479 words moved the F1 from 49.03 to 58.17 without a word).
TEST_F(ValidF1Run, EvalAndTheDryRunSayWhichValidationPairsAreLeftOut) {
  {
    std::ofstream words(root_ / "long.words"), trees(root_ / "long.tree");
    words << read_file(root_ / "work" / "dev.words");
    trees << read_file(root_ / "work" / "dev.tree");
    std::string sentence;
    for (int i = 0; i < 300; ++i) sentence += (i ? " " : "") + std::string("word");
    words << sentence << "\n";
    trees << "(S " << sentence << " )\n";
  }
  const ProcessResult shards = run_process(
      binary_dir() + "/transformer_preprocess --source-lang words --target-lang tree "
      "--trainpref " + (root_ / "work" / "train").string() + " --validpref " +
      (root_ / "long").string() + " --destdir " + (root_ / "long_data").string() +
      " --spm-model " + (root_ / "data" / "spm.model").string() +
      " --max-len 200 --valid-max-len 100000");
  ASSERT_EQ(shards.exit_code, 0) << shards.output;
  const std::string left_out =
      "data.valid: 1 of 274 pairs dropped: a side longer than 511 tokens does not fit "
      "model.max_positions";
  ProcessResult run = train("long", kValidF1 + " --train.max_steps=1", "long_data");
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_NE(run.output.find(left_out), std::string::npos) << run.output;
  run = train("long_eval",
              kValidF1 + " --eval " +
                  (root_ / "long" / "checkpoints" / "step_00000001.h5").string(),
              "long_data");
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_NE(run.output.find(left_out), std::string::npos) << run.output;
  run = train("long_dry", kValidF1 + " --dry-run", "long_data");
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_NE(run.output.find("# " + left_out), std::string::npos) << run.output;
}

TEST_F(ValidF1Run, WhatWouldMakeItMeaninglessIsRefusedBeforeTraining) {
  // Trees of words decoded as trees of XX.
  ProcessResult run = train("xx", kValidF1 + " --decode.tree_leaves=XX --train.max_steps=10");
  EXPECT_EQ(run.exit_code, 2) << run.output;
  EXPECT_NE(run.output.find("its tree's leaves are the words, and decode.tree_leaves = XX"),
            std::string::npos)
      << run.output;
  EXPECT_NE(run.output.find("set decode.tree_leaves = words"), std::string::npos) << run.output;
  // A length limit shorter than a tree over a validation sentence's words.
  run = train("short", kValidF1 + " --decode.max_len_a=1 --decode.max_len_b=0 "
                                  "--train.max_steps=10");
  EXPECT_EQ(run.exit_code, 2) << run.output;
  EXPECT_NE(run.output.find("valid.00000.h5: validation pair 1 needs"), std::string::npos)
      << run.output;
  EXPECT_NE(run.output.find("raise decode.max_len_a or decode.max_len_b"), std::string::npos)
      << run.output;
  EXPECT_FALSE(fs::exists(root_ / "short" / "checkpoints" / "step_00000010.h5"));
  // A dry run refuses them as training does (it passed them).
  run = train("dry", kValidF1 + " --decode.tree_leaves=XX --dry-run");
  EXPECT_EQ(run.exit_code, 2) << run.output;
  EXPECT_NE(run.output.find("decode.tree_leaves = XX"), std::string::npos) << run.output;
  run = train("dry", kValidF1 + " --decode.max_len_b=0 --decode.max_len_a=1 --dry-run");
  EXPECT_EQ(run.exit_code, 2) << run.output;
  EXPECT_NE(run.output.find("raise decode.max_len_a or decode.max_len_b"), std::string::npos)
      << run.output;
  run = train("dry", kValidF1 + " --dry-run");
  EXPECT_EQ(run.exit_code, 0) << run.output;
  // ... and says what training would note at its start.
  run = train("dry", kValidF1 + " --decode.max_len_a=1 --decode.max_len_b=3 --dry-run");
  EXPECT_EQ(run.exit_code, 0) << run.output;
  EXPECT_NE(run.output.find("# note: 273 of the 273 validation trees are longer than"),
            std::string::npos)
      << run.output;
}

// A sentence holding a bracket as a word (a treebank without -LRB-/-RRB-): its tree could
// not be told from the words, and the shards are to be made again (exit 3, the data's).
TEST(ValidF1, ASentenceHoldingABracketWordIsTheDatas) {
  const fs::path root =
      fs::temp_directory_path() / ("thpc_valid_f1_bracket_" + std::to_string(::getpid()));
  fs::remove_all(root);
  fs::create_directories(root);
  {
    std::ofstream words(root / "train.words"), trees(root / "train.tree");
    for (int i = 0; i < 30; ++i) {
      words << "the cat sat on the mat\n";
      trees << "(S (NP the cat ) (VP sat (PP on (NP the mat ) ) ) )\n";
    }
    std::ofstream(root / "valid.words") << "the ) cat sat\n";
    std::ofstream(root / "valid.tree") << "(S (NP the ) ) (VP cat sat ) )\n";
  }
  const ProcessResult shards = run_process(
      binary_dir() + "/transformer_preprocess --source-lang words --target-lang tree "
      "--trainpref " + (root / "train").string() + " --validpref " + (root / "valid").string() +
      " --destdir " + (root / "data").string() + " --vocab-size 30 --user-symbols "
      "'(S,(NP,(VP,(PP,)' --seed 1");
  ASSERT_EQ(shards.exit_code, 0) << shards.output;
  const ProcessResult run = run_process(
      "cd " THPC_SOURCE_DIR " && " + binary_dir() + "/transformer_hpc input/parse_tiny.ini "
      "--model.vocab_size=0 --data.dir=" + (root / "data").string() + " --checkpoint.dir=" +
      (root / "checkpoints").string() + kValidF1 + " --train.max_steps=10");
  EXPECT_EQ(run.exit_code, 3) << run.output;
  EXPECT_NE(run.output.find("valid.00000.h5: validation pair 1: its sentence holds the word "
                            "')', which a linearized tree reads as a bracket"),
            std::string::npos)
      << run.output;
  fs::remove_all(root);
}

// A translation corpus has no trees to score.
TEST(ValidF1, ATranslationCorpusIsRefused) {
  const fs::path root =
      fs::temp_directory_path() / ("thpc_valid_f1_numbers_" + std::to_string(::getpid()));
  fs::remove_all(root);
  const ProcessResult corpus = run_process(small_numbers_corpus_command(root));
  ASSERT_EQ(corpus.exit_code, 0) << corpus.output;
  const ProcessResult run = run_process(
      "cd " THPC_SOURCE_DIR " && " + binary_dir() + "/transformer_hpc input/numbers.ini "
      "--data.dir=" + (root / "data").string() + " --checkpoint.dir=" +
      (root / "checkpoints").string() + kValidF1 + " --train.max_steps=10");
  EXPECT_EQ(run.exit_code, 2) << run.output;
  const ProcessResult dry = run_process(
      "cd " THPC_SOURCE_DIR " && " + binary_dir() + "/transformer_hpc input/numbers.ini "
      "--data.dir=" + (root / "data").string() + kValidF1 + " --dry-run");
  EXPECT_EQ(dry.exit_code, 2) << dry.output;
  EXPECT_NE(dry.output.find("data.valid's shards cannot hold one"), std::string::npos)
      << dry.output;
  EXPECT_NE(run.output.find("train.valid_metric = f1 scores the trees of a parser, but "
                            "data.valid's shards cannot hold one"),
            std::string::npos)
      << run.output;
  EXPECT_NE(run.output.find("score translations with bleu or chrf"), std::string::npos)
      << run.output;
  fs::remove_all(root);
}

}  // namespace
}  // namespace thpc
