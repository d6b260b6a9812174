// Trees for the parsing mode: reading PTB .mrg files, normalising, linearizing and back
// (the whole NLTK WSJ sample), the repair rule, the baseline and malformed input.
#include <gtest/gtest.h>
#include <sentencepiece_processor.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "common/error.h"
#include "data/preprocess.h"
#include "data_dir.h"
#include "expect_error.h"
#include "parse/evalb.h"
#include "parse/tree.h"
#include "program.h"

namespace {

namespace fs = std::filesystem;
using namespace thpc::parse;
using thpc::lines_of;
using thpc::read_file;
using thpc::run_process;

const std::string kTrees = thpc::binary_dir() + "/transformer_trees";

fs::path fresh_directory(const std::string& name) {
  const fs::path dir = fs::temp_directory_path() / (name + "_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

TreeNode parse_one(const std::string& text) {
  std::istringstream in(text);
  const std::vector<TreeNode> trees = read_ptb_trees(in, "test.mrg");
  EXPECT_EQ(trees.size(), 1u);
  return trees.empty() ? TreeNode{} : trees.front();
}

std::vector<std::string> split(const std::string& line) {
  std::istringstream in(line);
  std::vector<std::string> tokens;
  for (std::string token; in >> token;) tokens.push_back(token);
  return tokens;
}

TEST(Trees, CanonicalLabels) {
  EXPECT_EQ(canonical_label("NP-SBJ-1"), "NP");
  EXPECT_EQ(canonical_label("S=2"), "S");
  EXPECT_EQ(canonical_label("PRT|ADVP"), "PRT");
  EXPECT_EQ(canonical_label("ADVP|PRT-CLR"), "ADVP");
  EXPECT_EQ(canonical_label("-NONE-"), "-NONE-");
  EXPECT_EQ(canonical_label("-LRB-"), "-LRB-");
  EXPECT_EQ(canonical_label("WHNP"), "WHNP");
}

// A label whose first alternative is empty (`|P`, found by fuzz_ptb_trees) lost its whole
// label and linearized as `( XX )`, which comes back as X: it is kept whole instead.
TEST(Trees, ALabelStartingWithABarSurvivesTheRoundTrip) {
  EXPECT_EQ(canonical_label("|P"), "|P");
  EXPECT_EQ(canonical_label("|"), "|");
  TreeNode normalized;
  ASSERT_TRUE(normalize_tree(parse_one("( (NP (NP (NN Junk)) (|P (DT a) (NN rumor))) )"),
                             &normalized));
  const std::string sequence = linearize(normalized);
  EXPECT_EQ(sequence, "(NP (NP XX ) (|P XX XX ) )");
  const Delinearized back = delinearize(sequence, words_of(normalized), tags_of(normalized));
  EXPECT_EQ(static_cast<int>(back.how), static_cast<int>(Reconstruction::kWellFormed));
  EXPECT_EQ(to_evalb_line(back.tree), to_evalb_line(normalized));
}

// Empty elements go, and so does every constituent they leave empty; function tags and
// indices go; tags stay as they are.
TEST(Trees, NormalizationRemovesEmptyElementsAndFunctionTags) {
  const TreeNode raw = parse_one(
      "( (S (NP-SBJ-1 (PRP He)) (VP (VBD said) (SBAR (-NONE- 0) (S (-NONE- *T*-1))))"
      " (-LRB- -LRB-) (. .)) )");
  TreeNode normalized;
  ASSERT_TRUE(normalize_tree(raw, &normalized));
  EXPECT_EQ(to_evalb_line(normalized),
            "(TOP (S (NP (PRP He)) (VP (VBD said)) (-LRB- -LRB-) (. .)))");
  EXPECT_EQ(linearize(normalized), "(S (NP XX ) (VP XX ) XX XX )");
  EXPECT_EQ(linearize(normalized, TreeLeaves::kWords), "(S (NP He ) (VP said ) -LRB- . )");
  TreeNode nothing;
  EXPECT_FALSE(normalize_tree(parse_one("( (S (-NONE- *)) )"), &nothing));
}

// An outer ROOT (the Stanford tools' trees) or TOP (our .gold files) over one child is the
// unlabelled outer bracket by another name: kept, it was a bracket every parse matched.
TEST(Trees, AnOuterRootOrTopOverOneChildIsTheUnlabelledBracket) {
  const std::string inner = "(S (NP (DT The) (NN cat)) (VP (VBD sat)) (. .))";
  const std::string expected = linearize(parse_one("( " + inner + " )"), TreeLeaves::kWords);
  EXPECT_EQ(expected, "(S (NP The cat ) (VP sat ) . )");
  for (const std::string root : {"ROOT", "TOP"}) {
    EXPECT_EQ(linearize(parse_one("(" + root + " " + inner + ")"), TreeLeaves::kWords), expected)
        << root;
  }
  // A one-word tree under ROOT is its pre-terminal, as under the unlabelled bracket.
  EXPECT_EQ(to_evalb_line(parse_one("(ROOT (UH Yes))")), "(TOP (UH Yes))");
  // Another label, or a ROOT over two constituents, is a constituent of the tree.
  EXPECT_EQ(linearize(parse_one("(SENT " + inner + ")"), TreeLeaves::kWords),
            "(SENT " + expected + " )");
  EXPECT_EQ(linearize(parse_one("(ROOT " + inner + " " + inner + ")"), TreeLeaves::kWords),
            "(ROOT " + expected + " " + expected + " )");
  // A .gold line read back linearizes as the tree it was written from.
  EXPECT_EQ(linearize(parse_one(to_evalb_line(parse_one("( " + inner + " )"))),
                      TreeLeaves::kWords),
            expected);
}

TEST(Trees, DelinearizeRepairsByTheDocumentedRule) {
  const std::vector<std::string> words = {"He", "said", "it", "."};
  const std::vector<std::string> tags = {"PRP", "VBD", "PRP", "."};
  auto tree = [&](const std::string& sequence, Reconstruction expected_how) {
    const Delinearized result = delinearize(sequence, words, tags);
    EXPECT_EQ(static_cast<int>(result.how), static_cast<int>(expected_how)) << sequence;
    return to_evalb_line(result.tree);
  };
  const std::string exact = "(TOP (S (NP (PRP He)) (VP (VBD said) (NP (PRP it))) (. .)))";
  EXPECT_EQ(tree("(S (NP XX ) (VP XX (NP XX ) ) XX )", Reconstruction::kWellFormed), exact);
  // Labelled closing brackets are read as plain ones.
  EXPECT_EQ(tree("(S (NP XX )NP (VP XX (NP XX )NP )VP XX )S", Reconstruction::kWellFormed), exact);
  // Missing closing brackets are closed at the end (rule 2), the word without a slot
  // goes to the root (rule 4).
  EXPECT_EQ(tree("(S (NP XX ) (VP XX (NP XX", Reconstruction::kRepaired), exact);
  // Every word in its slot and only the last ')' missing: repaired too, not well formed (a
  // mutation audit's change counted it well formed, rule 4 not marking this case).
  EXPECT_EQ(tree("(S (NP XX ) (VP XX (NP XX ) ) XX", Reconstruction::kRepaired), exact);
  // A ')' with nothing open is dropped; the second top-level constituent and the
  // leftover words go under one S (rules 1, 4, 5).
  EXPECT_EQ(tree("(NP XX ) ) (VP XX )", Reconstruction::kRepaired),
            "(TOP (S (NP (PRP He)) (VP (VBD said)) (PRP it) (. .)))");
  // Slots beyond the last word are dropped, and constituents left empty removed (rule 3).
  EXPECT_EQ(tree("(S (NP XX XX XX XX XX ) (VP ) )", Reconstruction::kRepaired),
            "(TOP (S (NP (PRP He) (VBD said) (PRP it) (. .))))");
  // Too few slots: the rest attach to the root (rule 4).
  EXPECT_EQ(tree("(S (NP XX ) )", Reconstruction::kRepaired),
            "(TOP (S (NP (PRP He)) (VBD said) (PRP it) (. .)))");
  // Brackets inside a token are cut apart (rule 0), not copied into a label (before:
  // `(TOP (S(NP ...`, a line EVALB counts as an error and leaves out of F1).
  EXPECT_EQ(tree("(S(NP XX) (VP XX (NP XX))XX )", Reconstruction::kRepaired), exact);
  EXPECT_EQ(tree("(S (NP XX )(VP XX (NP)(NP XX ) ) XX )", Reconstruction::kRepaired), exact);
  // No constituent at all: the right-branching baseline.
  const std::string baseline = "(TOP (S (PRP He) (VP (VBD said) (VP (PRP it) (. .)))))";
  EXPECT_EQ(tree("XX XX XX XX", Reconstruction::kBaseline), baseline);
  EXPECT_EQ(tree("", Reconstruction::kBaseline), baseline);
  EXPECT_EQ(to_evalb_line(right_branching_tree(words, tags)), baseline);
  EXPECT_EQ(to_evalb_line(right_branching_tree({"Hi"}, {"UH"})), "(TOP (S (UH Hi)))");
}

// A tree whose root is a pre-terminal ("(TOP (UH Yes))", a one-word sentence without a
// constituent) linearizes to one slot and comes back whole (before: as the baseline's
// (S (UH Yes)), a bracket its gold lacks); more slots than its one word do not.
TEST(Trees, AOneWordTreeWithoutAConstituentSurvivesTheRoundTrip) {
  TreeNode normalized;
  ASSERT_TRUE(normalize_tree(parse_one("( (UH Yes) )"), &normalized));
  for (const TreeLeaves leaves : {TreeLeaves::kPlaceholder, TreeLeaves::kWords}) {
    const std::string sequence = linearize(normalized, leaves);
    EXPECT_EQ(sequence, leaves == TreeLeaves::kWords ? "Yes" : "XX");
    const Delinearized back = delinearize(sequence, {"Yes"}, {"UH"});
    EXPECT_EQ(static_cast<int>(back.how), static_cast<int>(Reconstruction::kWellFormed));
    EXPECT_EQ(to_evalb_line(back.tree), "(TOP (UH Yes))");
  }
  const Delinearized two_slots = delinearize("XX XX", {"Yes"}, {"UH"});
  EXPECT_EQ(static_cast<int>(two_slots.how), static_cast<int>(Reconstruction::kBaseline));
  EXPECT_EQ(to_evalb_line(two_slots.tree), "(TOP (S (UH Yes)))");
}

TEST(Trees, MalformedTreesNameFileAndLine) {
  auto parse = [](const std::string& text) {
    return [text] {
      std::istringstream in(text);
      read_ptb_trees(in, "bad.mrg");
    };
  };
  thpc::expect_error(parse("( (S (NP (NN a)) )\n\n( (S (NN b)) )\n"),
                     {"bad.mrg:1:", "unbalanced tree: still open at line 3"});
  thpc::expect_error(parse("( (S (NN a)) )\n( (S (NP (NN b))\n"),
                     {"bad.mrg:2:", "unbalanced tree: still open at the end of the file"});
  thpc::expect_error(parse("( (S (NN a)) ))\n"), {"bad.mrg:1:", "')' without '('"});
  thpc::expect_error(parse("( (S (NN a)) )\nstray\n( (S (NN b)) )\n"),
                     {"bad.mrg:2:", "stray text 'stray' between trees"});
  thpc::expect_error(parse("( (S (NN a b)) )\n"), {"bad.mrg:1:", "stray text 'b'"});
  thpc::expect_error(parse("\n( )\n"), {"bad.mrg:2:", "empty"});
  thpc::expect_error(parse("( (S (NP)) )\n"), {"bad.mrg:1:", "empty constituent '(NP)'"});
  // A byte order mark is no stray text (before: "stray text '\xEF\xBB\xBF'", printed as
  // nothing); a file that merely starts with its first byte still is.
  std::istringstream marked("\xEF\xBB\xBF( (S (NN a)) )\n");
  EXPECT_EQ(read_ptb_trees(marked, "marked.mrg").size(), 1u);
  thpc::expect_error(parse("\xEFx ( (S (NN a)) )\n"), {"bad.mrg:1:", "stray text"});
  thpc::expect_error(parse("\xEF\xBB"), {"bad.mrg:1:", "stray text '\\xef\\xbb'"});
}

// Found beside fuzz_ptb_trees: every function here recursed once per bracket, so a file
// (or a decoded sequence) of 200,000 nested brackets overflowed the stack. Reading now
// refuses trees deeper than kMaxTreeDepth; delinearize drops the brackets beyond it.
TEST(Trees, DeepNestingIsAnErrorOrRepairedNotAStackOverflow) {
  auto nested = [](int depth, const std::string& open, const std::string& inside,
                   const std::string& close) {
    std::string text;
    for (int i = 0; i < depth; ++i) text += open;
    text += inside;
    for (int i = 0; i < depth; ++i) text += close;
    return text;
  };
  const std::string deep = nested(200000, "(A ", "(NN a)", ")");
  thpc::expect_error(
      [&] {
        std::istringstream in("( " + deep + " )\n");
        read_ptb_trees(in, "deep.mrg");
      },
      {"deep.mrg:1:", "nested deeper than 1000 levels"});
  std::istringstream deepest("( " + nested(kMaxTreeDepth - 1, "(A ", "(NN a)", ")") + " )\n");
  EXPECT_EQ(read_ptb_trees(deepest, "deepest.mrg").size(), 1u);

  const Delinearized repaired =
      delinearize(nested(200000, "(A ", "XX", " )") + " (B XX )", {"a", "b"}, {"NN", "NN"});
  EXPECT_EQ(static_cast<int>(repaired.how), static_cast<int>(Reconstruction::kRepaired));
  // The kMaxTreeDepth outer constituents kept, the word inside them, B beside them.
  EXPECT_EQ(words_of(repaired.tree), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(to_evalb_line(repaired.tree),
            "(TOP (S " + nested(kMaxTreeDepth, "(A ", "(NN a)", ")") + " (B (NN b))))");
}

// The program on a malformed file: one line naming file and line, exit 1, and none of
// the four outputs (nor a partial one) left behind.
TEST(Trees, MalformedFileLeavesNoOutput) {
  const fs::path dir = fresh_directory("thpc_trees_bad");
  {
    std::ofstream good(dir / "good.mrg");
    good << "( (S (NP (NN a)) (VP (VBZ is))) )\n";
    std::ofstream bad(dir / "bad.mrg");
    bad << "( (S (NP (NN a)) (VP (VBZ is))) )\n\n( (S (NP (NN b))\n";
  }
  const auto result = run_process(kTrees + " linearize --output " + (dir / "out").string() + " " +
                                  (dir / "good.mrg").string() + " " + (dir / "bad.mrg").string());
  EXPECT_EQ(result.exit_code, 1);
  EXPECT_EQ(lines_of(result.output).size(), 1u) << result.output;
  EXPECT_NE(result.output.find("bad.mrg:3: unbalanced tree: still open at the end of the file"),
            std::string::npos)
      << result.output;
  for (const auto& entry : fs::directory_iterator(dir)) {
    EXPECT_EQ(entry.path().filename().string().rfind("out", 0), std::string::npos)
        << "left behind: " << entry.path();
  }
  // A file without a tree (empty, or of another format) gave four empty outputs, exit 0.
  std::ofstream(dir / "empty.mrg").close();
  const auto empty = run_process(kTrees + " linearize --output " + (dir / "out").string() +
                                 " " + (dir / "empty.mrg").string());
  EXPECT_EQ(empty.exit_code, 1) << empty.output;
  EXPECT_NE(empty.output.find("linearize: no tree in " + (dir / "empty.mrg").string()),
            std::string::npos)
      << empty.output;
  EXPECT_FALSE(fs::exists(dir / "out.tree"));
  EXPECT_EQ(run_process(kTrees + " frobnicate --output x a.mrg").exit_code, 2);
  EXPECT_EQ(run_process(kTrees + " linearize a.mrg").exit_code, 2);
  fs::remove_all(dir);
}

// The command line is Boost's, as every other tool's (tools/tool_main.h): --name=value
// works as --name value, --help lists every option with its default, and a missing value
// is a bad command line naming the option.
// delinearize's report counts each way a tree came: well-formed, repaired, replaced by the
// baseline (a mutation audit's swap of the last two passed every test); tags that are not
// one per word are said with the file and line, in delinearize and baseline alike.
TEST(Trees, DelinearizeCountsEachWayATreeCameAndNamesALineOfOtherTags) {
  const fs::path dir = fresh_directory("thpc_trees_counts");
  const auto write = [&](const std::string& name, const std::string& text) {
    std::ofstream(dir / name) << text;
    return (dir / name).string();
  };
  const std::string words = write("w", "a b\na b\na b\na b\n");
  const std::string tags = write("t", "DT NN\nDT NN\nDT NN\nDT NN\n");
  // well-formed; missing its last ')': repaired twice; no constituent at all: replaced
  const std::string sequences = write("s", "(S XX XX )\n(S XX XX\n(S XX )\nXX XX\n");
  const auto counted = run_process(kTrees + " delinearize --words " + words + " --tags " + tags +
                                   " --input " + sequences + " --output /dev/null");
  EXPECT_EQ(counted.exit_code, 0) << counted.output;
  EXPECT_NE(counted.output.find("delinearize: 4 trees: 1 well-formed, 2 repaired, 1 replaced by "
                                "the right-branching baseline"),
            std::string::npos)
      << counted.output;
  EXPECT_EQ(counted.output.find("held words other than"), std::string::npos) << counted.output;
  // Trees of the words themselves, one with a word the decoder changed ("c" for "b"):
  // well-formed, and said (before: counted well-formed without a word, a helper's walk).
  const std::string of_words = write("s2", "(S a b )\n(S a c )\n(S (NP a ) b )\n(S a XX )\n");
  const auto changed = run_process(kTrees + " delinearize --words " + words + " --tags " + tags +
                                   " --input " + of_words + " --output /dev/null");
  EXPECT_EQ(changed.exit_code, 0) << changed.output;
  EXPECT_NE(changed.output.find("4 well-formed, 0 repaired, 0 replaced"), std::string::npos)
      << changed.output;
  EXPECT_NE(changed.output.find("note: 1 of them held words other than " + words + "'s"),
            std::string::npos)
      << changed.output;
  // New text has no tags: without --tags every word is tagged XX.
  const auto untagged = run_process(kTrees + " delinearize --words " + words + " --input " +
                                    of_words + " --output -");
  EXPECT_EQ(untagged.exit_code, 0) << untagged.output;
  EXPECT_NE(untagged.output.find("(TOP (S (XX a) (XX b)))\n(TOP (S (XX a) (XX b)))\n(TOP (S (NP (XX a)) (XX b)))"),
            std::string::npos)
      << untagged.output;
  for (const std::string& other : {std::string("DT NN VB\n"), std::string("DT\n")}) {
    const std::string other_tags = write("t1", other);
    const std::string two_words = write("w1", "a b\n");
    const std::string count = other == "DT\n" ? "1" : "3";
    for (const std::string& tool :
         {"baseline --words " + two_words + " --tags " + other_tags + " --output -",
          "delinearize --words " + two_words + " --tags " + other_tags + " --input " +
              write("s1", "(S XX XX )\n") + " --output -"}) {
      const auto refused = run_process(kTrees + " " + tool);
      EXPECT_EQ(refused.exit_code, 1) << refused.output;
      EXPECT_NE(refused.output.find("transformer_trees: error: " + other_tags + ":1: " +
                                    count + " tags for 2 words"),
                std::string::npos)
          << tool << "\n" << refused.output;
    }
  }
}

TEST(Trees, CommandLineTakesTheOtherToolsForms) {
  const fs::path dir = fresh_directory("thpc_trees_command_line");
  const std::string mrg = (dir / "one.mrg").string();
  {
    std::ofstream one(mrg);
    one << "( (S (NP (DT The) (NN cat)) (VP (VBD sat)) (. .)) )\n";
  }
  const std::string prefix = (dir / "one").string();
  const auto linearized =
      run_process(kTrees + " linearize --leaves=words --output=" + prefix + " " + mrg);
  ASSERT_EQ(linearized.exit_code, 0) << linearized.output;
  EXPECT_EQ(read_file(prefix + ".tree"), "(S (NP The cat ) (VP sat ) . )\n");

  const auto help = run_process(kTrees + " -h");
  EXPECT_EQ(help.exit_code, 0) << help.output;
  for (const char* option : {"--output PREFIX|OUT", "--leaves XX|words (=XX)", "--words W",
                             "--tags T", "--input SEQ"}) {
    EXPECT_NE(help.output.find(option), std::string::npos) << option << "\n" << help.output;
  }

  const auto missing = run_process(kTrees + " linearize " + mrg + " --output");
  EXPECT_EQ(missing.exit_code, 2) << missing.output;
  EXPECT_EQ(lines_of(missing.output).size(), 1u) << missing.output;
  EXPECT_NE(missing.output.find("'--output'"), std::string::npos) << missing.output;

  const auto leaves = run_process(kTrees + " linearize --leaves tags --output " + prefix + " " + mrg);
  EXPECT_EQ(leaves.exit_code, 2) << leaves.output;
  EXPECT_NE(leaves.output.find("transformer_trees: --leaves: tree leaves 'tags': expected XX or "
                               "words (see --help)"),
            std::string::npos)
      << leaves.output;
  // An option of another command is refused naming the commands it belongs to (before:
  // `baseline --input` and `linearize --words` ran as if it were not there, exit 0).
  for (const auto& [arguments, said] : std::vector<std::pair<std::string, std::string>>{
           {" linearize --words " + mrg + " --output " + prefix + " " + mrg,
            "--words belongs to delinearize and baseline, not linearize"},
           {" baseline --words " + mrg + " --tags " + mrg + " --input " + mrg + " --output " +
                prefix + ".gold",
            "--input belongs to delinearize, not baseline"},
           {" delinearize --leaves XX --words " + mrg + " --tags " + mrg + " --output " + prefix,
            "--leaves belongs to linearize, not delinearize"}}) {
    const auto elsewhere = run_process(kTrees + arguments);
    EXPECT_EQ(elsewhere.exit_code, 2) << elsewhere.output;
    EXPECT_NE(elsewhere.output.find("transformer_trees: " + said + " (see --help)"),
              std::string::npos)
        << elsewhere.output;
  }

  // "-" is a standard stream, as in the other tools: delinearize reads its sequences from
  // --input - and writes --output - to standard output (before: both a file named "-",
  // the output one left in the working directory, exit 0 with nothing printed).
  const std::string words_tags = " --words " + prefix + ".words --tags " + prefix + ".tags ";
  // (Standard error apart: run_process takes both.)
  const auto piped = run_process("(cd " + dir.string() + " && " + kTrees + " delinearize" +
                                 words_tags + "--input - --output - < " + prefix +
                                 ".tree 2> /dev/null)");
  ASSERT_EQ(piped.exit_code, 0) << piped.output;
  EXPECT_EQ(piped.output, read_file(prefix + ".gold"));
  const auto baseline = run_process("(cd " + dir.string() + " && " + kTrees + " baseline" +
                                    words_tags + "--output - 2> /dev/null)");
  ASSERT_EQ(baseline.exit_code, 0) << baseline.output;
  EXPECT_EQ(baseline.output, "(TOP (S (DT The) (VP (NN cat) (VP (VBD sat) (. .)))))\n");
  EXPECT_FALSE(fs::exists(dir / "-"));
  // A NUL byte in the words or the sequences is refused naming the file and line, as the
  // other tools refuse it (before: written into the trees).
  const std::string nul_words = (dir / "nul.words").string();
  std::ofstream(nul_words, std::ios::binary) << std::string("The c\0at sat .\n", 15);
  const auto nul = run_process(kTrees + " baseline --words " + nul_words + " --tags " + prefix +
                               ".tags --output " + (dir / "nul.gold").string());
  EXPECT_EQ(nul.exit_code, 1) << nul.output;
  EXPECT_NE(nul.output.find(nul_words + ":1: a NUL byte at byte 6 of the line"),
            std::string::npos)
      << nul.output;
  // A bracket as a word or a tag is refused naming the file, line and item (before: the
  // tree (NN () written, unbalanced, and counted well-formed; EVALB then refused it).
  const std::string bracket_words = (dir / "bracket.words").string();
  std::ofstream(bracket_words) << "The ( sat .\n";
  const auto bracket = run_process(kTrees + " baseline --words " + bracket_words + " --tags " +
                                   prefix + ".tags --output " + (dir / "b.gold").string());
  EXPECT_EQ(bracket.exit_code, 1) << bracket.output;
  EXPECT_NE(bracket.output.find(bracket_words + ":1: item 2 is '(': a bracket cannot be a "
                                "tree's word or tag; write ( and ) as the Penn Treebank does, "
                                "-LRB- and -RRB-"),
            std::string::npos)
      << bracket.output;
  EXPECT_FALSE(fs::exists(dir / "b.gold"));
  // A .mrg file of "-" is standard input (before: "-: no such file").
  const std::string from_stdin = (dir / "stdin").string();
  const auto read_stdin = run_process(kTrees + " linearize --leaves=words --output " +
                                      from_stdin + " - < " + mrg);
  ASSERT_EQ(read_stdin.exit_code, 0) << read_stdin.output;
  EXPECT_EQ(read_file(from_stdin + ".tree"), read_file(prefix + ".tree"));
  EXPECT_EQ(run_process(kTrees + " linearize --output " + from_stdin + " - - < " + mrg).exit_code,
            2);
  const auto prefix_dash = run_process(kTrees + " linearize --output - " + mrg);
  EXPECT_EQ(prefix_dash.exit_code, 2) << prefix_dash.output;
  EXPECT_NE(prefix_dash.output.find("linearize --output is the prefix of four files"),
            std::string::npos)
      << prefix_dash.output;
  fs::remove_all(dir);
}

// delinearize of PREFIX.tree (the whole sample, linearized) over PREFIX.words gives
// PREFIX.gold back byte for byte (into PREFIX.back), every sequence well-formed.
void expect_whole_sample_comes_back(const std::string& prefix) {
  const auto back = run_process(kTrees + " delinearize --words " + prefix + ".words --tags " +
                                prefix + ".tags --input " + prefix + ".tree --output " + prefix +
                                ".back");
  ASSERT_EQ(back.exit_code, 0) << back.output;
  EXPECT_NE(back.output.find("3914 well-formed, 0 repaired, 0 replaced"), std::string::npos)
      << back.output;
  EXPECT_EQ(read_file(prefix + ".back"), read_file(prefix + ".gold"));
}

// All 3,914 trees of the NLTK WSJ sample: linearize -> delinearize gives the normalised
// trees back exactly, and what is written agrees with counts taken from the raw files.
TEST(Trees, RoundTripOfTheWholeSample) {
  THPC_REQUIRE_DATA("ptb_sample/combined/wsj_0001.mrg");
  const fs::path dir = fresh_directory("thpc_trees_roundtrip");
  const std::string combined = thpc::data_path("ptb_sample/combined");
  const std::string prefix = (dir / "all").string();
  const auto linearized =
      run_process(kTrees + " linearize --output " + prefix + " " + combined + "/wsj_*.mrg");
  ASSERT_EQ(linearized.exit_code, 0) << linearized.output;
  expect_whole_sample_comes_back(prefix);
  const std::string gold = read_file(prefix + ".gold");

  const auto gold_lines = lines_of(gold);
  const auto word_lines = lines_of(read_file(prefix + ".words"));
  const auto tree_lines = lines_of(read_file(prefix + ".tree"));
  ASSERT_EQ(gold_lines.size(), 3914u);
  ASSERT_EQ(word_lines.size(), 3914u);
  ASSERT_EQ(tree_lines.size(), 3914u);
  // The first tree of wsj_0001.mrg, normalised by hand.
  EXPECT_EQ(gold_lines.front(),
            "(TOP (S (NP (NP (NNP Pierre) (NNP Vinken)) (, ,) (ADJP (NP (CD 61) (NNS years)) "
            "(JJ old)) (, ,)) (VP (MD will) (VP (VB join) (NP (DT the) (NN board)) (PP (IN as) "
            "(NP (DT a) (JJ nonexecutive) (NN director))) (NP (NNP Nov.) (CD 29)))) (. .)))");
  EXPECT_EQ(word_lines.front(), "Pierre Vinken , 61 years old , will join the board as a "
                                "nonexecutive director Nov. 29 .");

  // Words: every (TAG word) of the raw files except the -NONE- ones, counted here with a
  // regular expression rather than the tree reader.
  size_t raw_words = 0;
  const std::regex preterminal(R"(\(([^()\s]+)\s+([^()\s]+)\))");
  for (const auto& entry : fs::directory_iterator(combined)) {
    if (entry.path().extension() != ".mrg") continue;
    const std::string text = read_file(entry.path());
    for (auto it = std::sregex_iterator(text.begin(), text.end(), preterminal);
         it != std::sregex_iterator(); ++it) {
      if ((*it)[1] != "-NONE-") ++raw_words;
    }
  }
  size_t written_words = 0;
  for (size_t i = 0; i < tree_lines.size(); ++i) {
    const auto sentence = split(word_lines[i]);
    size_t slots = 0;
    int depth = 0;
    for (const std::string& token : split(tree_lines[i])) {
      if (token == kWordPlaceholder) ++slots;
      if (token[0] == '(') {
        ++depth;
        EXPECT_EQ(token.find_first_of("-=|", 1), std::string::npos) << "line " << i + 1;
      }
      if (token == ")") --depth;
    }
    EXPECT_EQ(slots, sentence.size()) << "line " << i + 1;
    EXPECT_EQ(depth, 0) << "line " << i + 1;
    written_words += sentence.size();
  }
  EXPECT_EQ(written_words, raw_words);
  EXPECT_EQ(raw_words, 94084u);
  EXPECT_EQ(gold.find("-NONE-"), std::string::npos);

  // EVALB scores the round trip 100.
  const EvalbParameters collins = [] {
    EvalbParameters parameters;
    parameters.delete_labels = {"TOP", "-NONE-", ",", ":", "``", "''", "."};
    parameters.delete_labels_for_length = {"-NONE-"};
    parameters.equal_labels = {{"ADVP", "PRT"}};
    parameters.max_error = 0;
    return parameters;
  }();
  std::istringstream gold_in(gold), back_in(read_file(prefix + ".back"));
  std::ostringstream report, errors;
  const EvalbResult same = run_evalb(collins, gold_in, back_in, report, errors);
  EXPECT_EQ(same.errors, 0) << errors.str();
  EXPECT_DOUBLE_EQ(same.all.f_measure(), 100.0);
  fs::remove_all(dir);
}

// --leaves words: the words themselves in the tree, in the sentence's order, and the
// round trip as exact as with XX.
TEST(Trees, RoundTripWithWordsAsLeaves) {
  THPC_REQUIRE_DATA("ptb_sample/combined/wsj_0001.mrg");
  const fs::path dir = fresh_directory("thpc_trees_words");
  const std::string combined = thpc::data_path("ptb_sample/combined");
  const std::string prefix = (dir / "all").string();
  const auto linearized = run_process(kTrees + " linearize --leaves words --output " + prefix +
                                      " " + combined + "/wsj_*.mrg");
  ASSERT_EQ(linearized.exit_code, 0) << linearized.output;
  const auto word_lines = lines_of(read_file(prefix + ".words"));
  const auto tree_lines = lines_of(read_file(prefix + ".tree"));
  ASSERT_EQ(tree_lines.size(), 3914u);
  ASSERT_EQ(word_lines.size(), 3914u);
  EXPECT_EQ(tree_lines.front(),
            "(S (NP (NP Pierre Vinken ) , (ADJP (NP 61 years ) old ) , ) (VP will (VP join "
            "(NP the board ) (PP as (NP a nonexecutive director ) ) (NP Nov. 29 ) ) ) . )");
  for (size_t i = 0; i < tree_lines.size(); ++i) {
    std::vector<std::string> leaves;
    for (const std::string& token : split(tree_lines[i])) {
      if (token[0] != '(' && token != ")") leaves.push_back(token);
    }
    EXPECT_EQ(leaves, split(word_lines[i])) << "line " << i + 1;
  }
  expect_whole_sample_comes_back(prefix);

  const auto bad = run_process(kTrees + " linearize --leaves tags --output " + prefix + " " +
                               combined + "/wsj_0001.mrg");
  EXPECT_EQ(bad.exit_code, 2) << bad.output;
  EXPECT_NE(bad.output.find("tree leaves 'tags': expected XX or words"), std::string::npos)
      << bad.output;
  fs::remove_all(dir);
}

// transformer_preprocess --user-symbols keeps the bracket tokens whole: every piece of
// an encoded tree is one token of the tree, while without the option BPE cuts them.
TEST(Trees, PreprocessKeepsUserSymbolsWhole) {
  const fs::path dir = fresh_directory("thpc_trees_spm");
  {
    std::ofstream words(dir / "train.words");
    std::ofstream trees(dir / "train.tree");
    const char* sentences[] = {"the cat sat", "a dog ran home", "NPs see XX", "it rained"};
    const char* linearized[] = {"(S (NP XX XX ) (VP XX ) )", "(S (NP XX XX ) (VP XX (NP XX ) ) )",
                                "(S (NP XX ) (VP XX (NP XX ) ) )", "(S (NP XX ) (VP XX ) )"};
    for (int copy = 0; copy < 50; ++copy) {
      for (int i = 0; i < 4; ++i) {
        words << sentences[i] << "\n";
        trees << linearized[i] << "\n";
      }
    }
  }
  auto pieces_of = [&](const std::string& symbols, const std::string& text) {
    thpc::PreprocessOptions options;
    options.source_lang = "words";
    options.target_lang = "tree";
    options.train_prefix = options.valid_prefix = (dir / "train").string();
    options.dest_dir = (dir / ("out" + std::to_string(symbols.size()))).string();
    options.vocab_size = 60;
    options.user_symbols = symbols;
    options.threads = 1;
    std::ostringstream log;
    thpc::preprocess(options, log);
    sentencepiece::SentencePieceProcessor processor;
    EXPECT_TRUE(processor.Load(options.dest_dir + "/spm.model").ok());
    std::vector<std::string> pieces;
    processor.Encode(text, &pieces);
    return pieces;
  };
  const std::string tree = "(S (NP XX XX ) (VP XX (NP XX ) ) )";
  const std::vector<std::string> whole = pieces_of("(S,(NP,(VP,),XX", tree);
  std::vector<std::string> expected;
  for (const std::string& token : split(tree)) expected.push_back("\xe2\x96\x81" + token);
  EXPECT_EQ(whole, expected);
  // A word XX of a sentence is the symbol too: the placeholder must not be a real word.
  EXPECT_EQ(pieces_of("(S,(NP,(VP,),XX", "NPs XX").back(), "\xe2\x96\x81XX");
  EXPECT_NE(pieces_of("", tree).size(), expected.size());
  fs::remove_all(dir);
}

// Training's validation F1 tags the words by punctuation_tags (the shards hold no tags):
// EVALB's COLLINS.prm deletes the words tagged , : `` '' and . and nothing else, so those
// tags must be the treebank's.
TEST(Trees, PunctuationTagsAreTheTreebanksWhereCollinsPrmDeletes) {
  EXPECT_EQ(punctuation_tags(split("`` Yes , '' he said ; `` buy -- now ! ''")),
            split("`` XX , '' XX XX : `` XX : XX . ''"));
  // ' closes a quote after an open `, after punctuation, or before ''; else a possessive.
  EXPECT_EQ(punctuation_tags(split("take ` Cosby ' across the investors ' plan")),
            split("XX `` XX '' XX XX XX XX XX"));
  EXPECT_EQ(punctuation_tags(split("stupid , ' '' but ? ... : -")),
            split("XX , '' '' XX . : : :"));
  EXPECT_EQ(punctuation_tags({}), std::vector<std::string>{});
  // Other scripts' quotes, stops and dashes, as a treebank converted to PTB tags has them;
  // ’ as ': a possessive unless it closes a quote.
  EXPECT_EQ(punctuation_tags(split("\u201e Ja \u201c , \u00ab oui \u00bb \u2014 "
                                   "\u3002 \u3001 \u2013 \u2039 x \u203a")),
            split("`` XX `` , `` XX '' : . , : `` XX ''"));
  EXPECT_EQ(punctuation_tags(split("\u2018 Cosby \u2019 and the investors \u2019 plan")),
            split("`` XX '' XX XX XX XX XX"));
  EXPECT_EQ(punctuation_tags(split("\u201c no \u2019 \u201d \u201a ja \" x")),
            split("`` XX '' '' `` XX '' XX"));

  THPC_REQUIRE_DATA("ptb_sample/combined/wsj_0001.mrg");
  const fs::path dir = fresh_directory("thpc_trees_punctuation");
  const std::string prefix = (dir / "all").string();
  const auto linearized = run_process(kTrees + " linearize --output " + prefix + " " +
                                      thpc::data_path("ptb_sample/combined") + "/wsj_*.mrg");
  ASSERT_EQ(linearized.exit_code, 0) << linearized.output;
  const auto word_lines = lines_of(read_file(prefix + ".words"));
  const auto tag_lines = lines_of(read_file(prefix + ".tags"));
  ASSERT_EQ(word_lines.size(), tag_lines.size());
  const std::vector<std::string> deleted = {",", ":", "``", "''", "."};
  const auto is_deleted = [&](const std::string& tag) {
    return std::find(deleted.begin(), deleted.end(), tag) != deleted.end();
  };
  int punctuation = 0;  // words the treebank tags with a deleted tag
  std::vector<std::string> missed;  // ... that punctuation_tags tags otherwise
  int other = 0;        // words it tags with a deleted tag that the treebank does not
  for (size_t line = 0; line < word_lines.size(); ++line) {
    const std::vector<std::string> words = split(word_lines[line]);
    const std::vector<std::string> gold = split(tag_lines[line]);
    const std::vector<std::string> ours = punctuation_tags(words);
    ASSERT_EQ(ours.size(), words.size());
    for (size_t i = 0; i < words.size(); ++i) {
      if (is_deleted(gold[i])) {
        ++punctuation;
        if (ours[i] != gold[i]) missed.push_back(words[i] + "/" + gold[i]);
      } else {
        other += is_deleted(ours[i]);
      }
    }
  }
  EXPECT_EQ(punctuation, 10729);
  // A "Wa" tagged "," (an annotation slip: it is NNP twice elsewhere).
  EXPECT_EQ(missed, (std::vector<std::string>{"Wa/,"}));
  EXPECT_EQ(other, 0);
  fs::remove_all(dir);
}

}  // namespace
