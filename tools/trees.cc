// transformer_trees: Penn Treebank trees to and from the sequences the parser learns.
//
//   transformer_trees linearize [--leaves XX|words] --output PREFIX FILE.mrg [FILE.mrg ...]
//       (a FILE.mrg of - is standard input)
//       writes PREFIX.words (the sentence), PREFIX.tree (the linearized tree, the
//       target: its words the placeholder XX, the default, or the words themselves),
//       PREFIX.tags (the part-of-speech tags) and PREFIX.gold (the normalised
//       tree for EVALB), one sentence per line, in file order
//   transformer_trees delinearize --words W --tags T [--input SEQ] --output OUT
//       the trees the decoded sequences SEQ (default or -: standard input) describe over
//       the words W, repaired where needed (src/parse/tree.h has the rule), in EVALB's
//       form; OUT - is standard output
//   transformer_trees baseline --words W --tags T --output OUT
//       the right-branching tree of every sentence, in EVALB's form (OUT - as above)
//
// Outputs are written under temporary names and renamed when complete, so a failure
// leaves no half-written file, and never over an input, another output or a training
// run's file (exit 2 before any work). Exit codes: 0 success, 1 bad input (one line naming the
// file and line), 2 a bad command line.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "checkpoint/output_file.h"
#include "common/error.h"
#include "common/input_file.h"
#include "parse/tree.h"
#include "tools/tool_main.h"

namespace {

namespace fs = std::filesystem;
using thpc::parse::TreeNode;

namespace po = boost::program_options;

constexpr const char* kUsageHead =
    "usage: transformer_trees linearize [--leaves XX|words] --output PREFIX FILE.mrg ...\n"
    "       transformer_trees delinearize --words W [--tags T] [--input SEQ] --output OUT\n"
    "       transformer_trees baseline --words W [--tags T] --output OUT\n"
    "\n"
    "linearize    Penn Treebank .mrg trees -> PREFIX.words (sentences), PREFIX.tree\n"
    "             (targets such as '(S (NP XX XX ) (VP XX ) XX )', or with --leaves words\n"
    "             '(S (NP The cat ) (VP sat ) . )'), PREFIX.tags and PREFIX.gold\n"
    "             (normalised trees, one per line, for transformer_evalb)\n"
    "delinearize  decoded sequences (SEQ, or standard input without --input or with -)\n"
    "             + the sentences' words and tags -> trees for transformer_evalb (OUT -:\n"
    "             standard output); bad sequences are repaired, or replaced by the\n"
    "             right-branching tree when they hold no constituent\n"
    "baseline     the right-branching tree of every sentence (OUT - as above)\n"
    "\n"
    "options";

struct CommandLine {
  std::string command;
  std::string output;
  std::string words_path;
  std::string tags_path;
  std::string input_path;  // "" = standard input
  std::vector<std::string> files;
  thpc::parse::TreeLeaves leaves = thpc::parse::TreeLeaves::kPlaceholder;
  bool help = false;
};

// The options --help shows, bound to `command` (--leaves to `leaves`, its name), and with
// `with_positionals` the subcommand and the .mrg files too.
po::options_description describe(CommandLine& command, std::string& leaves,
                                 bool with_positionals) {
  po::options_description options(kUsageHead);
  options.add_options()
      ("help,h", "print this text and exit")(
      "version", "print the git commit the program was built from and exit")
      ("output", po::value(&command.output)->value_name("PREFIX|OUT"),
       "linearize: the prefix of the four files it writes; delinearize, baseline: the file "
       "of the trees (required)")
      ("leaves", po::value(&leaves)->value_name("XX|words")->default_value(leaves),
       "linearize: the trees' word tokens, the placeholder XX or the words themselves")
      ("words", po::value(&command.words_path)->value_name("W"),
       "delinearize, baseline: the sentences' words, one sentence per line (PREFIX.words; "
       "required)")
      ("tags", po::value(&command.tags_path)->value_name("T"),
       "delinearize, baseline: their part-of-speech tags, one sentence per line "
       "(PREFIX.tags); without it every word is tagged XX: trees of new text, which no "
       "tagger has tagged (transformer_evalb's scores need the gold tags: COLLINS.prm's "
       "punctuation rule reads them)")
      ("input", po::value(&command.input_path)->value_name("SEQ"),
       "delinearize: the decoded sequences, one per line (default: standard input)");
  if (with_positionals) {
    options.add_options()("command", po::value(&command.command))(
        "files", po::value(&command.files));
  }
  return options;
}

std::string usage() {
  CommandLine command;
  std::string leaves = "XX";
  return thpc::tools::usage_text(describe(command, leaves, /*with_positionals=*/false));
}

// The files a command writes: PREFIX.{words,tree,tags,gold} for linearize, OUT otherwise.
std::vector<std::string> output_paths(const CommandLine& command) {
  if (command.command != "linearize") return {command.output};
  std::vector<std::string> paths;
  for (const char* part : {".words", ".tree", ".tags", ".gold"}) paths.push_back(command.output + part);
  return paths;
}

CommandLine parse_command_line(int argc, char** argv) {
  CommandLine command;
  std::string leaves = "XX";
  po::positional_options_description positionals;
  positionals.add("command", 1).add("files", -1);
  const po::variables_map values = thpc::tools::parse_options(
      describe(command, leaves, /*with_positionals=*/true), argc, argv, positionals);
  command.help = values.count("help") > 0;
  if (command.help) return command;
  thpc::tools::refuse_empty_values(values, {"input", "words", "tags", "output"});
  if (command.command != "linearize" && command.command != "delinearize" &&
      command.command != "baseline") {
    if (command.command.empty()) {  // (was said "..., not ''")
      THPC_FAIL("the first argument is missing: linearize, delinearize or baseline");
    }
    THPC_FAIL("the first argument must be linearize, delinearize or baseline, not '"
              << command.command << "'");
  }
  if (command.output.empty()) THPC_FAIL(command.command << " needs --output");
  // "-" is a standard stream where one file is: delinearize's and baseline's --output,
  // delinearize's --input (before: a file named "-", written in the working directory
  // while the output check took it for standard output).
  if (command.command == "linearize" && command.output == "-") {
    THPC_FAIL("linearize --output is the prefix of four files (PREFIX.words, .tree, .tags, "
              ".gold), not -: give a path");
  }
  for (const auto& [option, path] : {std::pair{"--words", &command.words_path},
                                     std::pair{"--tags", &command.tags_path}}) {
    if (*path == "-") {
      THPC_FAIL(option << " -: standard input is delinearize's --input alone: give a file");
    }
  }
  if (command.input_path == "-") command.input_path.clear();  // standard input
  // An option of another command was read by none (before: accepted, exit 0, as --leaves
  // was not: `baseline --input P.tree` ran as if it were not there).
  const bool linearizes = command.command == "linearize";
  const bool delinearizes = command.command == "delinearize";
  for (const auto& [option, belongs, commands] :
       {std::tuple<const char*, bool, const char*>{"leaves", linearizes, "linearize"},
        {"words", !linearizes, "delinearize and baseline"},
        {"tags", !linearizes, "delinearize and baseline"},
        {"input", delinearizes, "delinearize"}}) {
    // (given, not a default: --leaves has one)
    if (values.count(option) > 0 && !values[option].defaulted() && !belongs) {
      THPC_FAIL("--" << option << " belongs to " << commands << ", not " << command.command);
    }
  }
  if (command.command == "linearize") {
    if (command.files.empty()) THPC_FAIL("linearize needs at least one .mrg file");
    if (std::count(command.files.begin(), command.files.end(), "-") > 1) {
      THPC_FAIL("linearize reads standard input (-) once: give it once");
    }
    try {
      command.leaves = thpc::parse::tree_leaves_from_name(leaves);
    } catch (const thpc::Error& error) {
      THPC_FAIL("--leaves: " << error.what());
    }
  } else {
    if (command.words_path.empty()) THPC_FAIL(command.command << " needs --words");
    if (!command.files.empty()) THPC_FAIL("unexpected argument '" << command.files.front() << "'");
  }
  // linearize's --output is a prefix of four files: one that names a directory wrote its
  // hidden files .words, .tree, .tags and .gold there.
  std::error_code error;
  if (command.command == "linearize" &&
      (command.output.back() == '/' || std::filesystem::is_directory(command.output, error))) {
    THPC_FAIL("--output " << command.output << ": linearize's output is a prefix of four "
              << "files (PREFIX.words, .tree, .tags, .gold), not a directory: give e.g. "
              << (std::filesystem::path(command.output) / "wsj").string());
  }
  // No output over an input (or another output, or a training run's file), however spelt.
  const std::vector<std::string> outputs = output_paths(command);
  std::vector<std::string> inputs = command.files;
  for (const std::string* input : {&command.words_path, &command.tags_path, &command.input_path}) {
    if (!input->empty()) inputs.push_back(*input);
  }
  // delinearize reads standard input without --input: its file is an input too.
  if (command.command == "delinearize" && command.input_path.empty()) inputs.push_back("-");
  for (size_t i = 0; i < outputs.size(); ++i) {
    std::vector<std::string> others = outputs;
    others.erase(others.begin() + static_cast<std::ptrdiff_t>(i));
    thpc::check_output_path("--output", outputs[i], inputs, thpc::OutputKind::Text, others);
  }
  return command;
}

// `text` to --output: standard output for "-", else a file written whole or not at all.
void write_output(const std::string& output, const std::string& text) {
  if (output == "-") {
    std::cout << text;
    // Said now, before the summary line that says the trees went there.
    if (const std::string failure = thpc::standard_output_failure(); !failure.empty()) {
      THPC_FAIL(failure);
    }
  } else {
    thpc::write_texts_atomically({{output, text}});
  }
}

// How the summary line names --output.
std::string output_name(const std::string& output) {
  return output == "-" ? "standard output" : output;
}

std::string joined(const std::vector<std::string>& items) {
  std::string line;
  for (size_t i = 0; i < items.size(); ++i) line += (i > 0 ? " " : "") + items[i];
  return line;
}

std::vector<std::vector<std::string>> read_token_lines(const std::string& path) {
  std::ifstream in = thpc::open_text_file(path, "");
  std::vector<std::vector<std::string>> lines;
  std::string line;
  while (std::getline(in, line)) {
    // (text holds none: a file damaged by a crash, or not text; as transformer_preprocess
    // and transformer_decode refuse it)
    const std::string nul = thpc::nul_byte_problem(path, lines.size() + 1, line);
    if (!nul.empty()) THPC_FAIL(nul);
    std::istringstream fields(line);
    std::vector<std::string> tokens;
    std::string token;
    while (fields >> token) tokens.push_back(token);
    if (tokens.empty()) THPC_FAIL(path << ":" << lines.size() + 1 << ": empty sentence");
    lines.push_back(std::move(tokens));
  }
  return lines;
}

int linearize_files(const CommandLine& command) {
  std::string words, tree, tags, gold;
  size_t trees = 0;
  size_t empty = 0;
  for (const std::string& path : command.files) {
    // "-" is standard input, as in the other tools (before: "-: no such file").
    std::ifstream file;
    if (path != "-") file = thpc::open_text_file(path, "");
    std::istream& in = path == "-" ? std::cin : file;
    for (const TreeNode& raw :
         thpc::parse::read_ptb_trees(in, path == "-" ? "<stdin>" : path)) {
      TreeNode normalized;
      if (!thpc::parse::normalize_tree(raw, &normalized)) {
        ++empty;
        continue;
      }
      words += joined(thpc::parse::words_of(normalized)) + "\n";
      tags += joined(thpc::parse::tags_of(normalized)) + "\n";
      tree += thpc::parse::linearize(normalized, command.leaves) + "\n";
      gold += thpc::parse::to_evalb_line(normalized) + "\n";
      ++trees;
    }
  }
  // Four empty outputs would train and score nothing, found only later (an empty file, a
  // file of another format that holds no tree).
  if (trees == 0) {
    THPC_FAIL("linearize: no tree in " << command.files.front()
              << (command.files.size() > 1 ? " and the other files" : "")
              << (empty > 0 ? " but trees of empty elements only" : "")
              << ": give Penn Treebank .mrg files ((S (NP ...) ...) trees)");
  }
  const std::string& prefix = command.output;
  thpc::write_texts_atomically({{prefix + ".words", words},
                          {prefix + ".tree", tree},
                          {prefix + ".tags", tags},
                          {prefix + ".gold", gold}});
  std::cerr << "linearize: " << trees << (trees == 1 ? " tree from " : " trees from ")
            << command.files.size() << (command.files.size() == 1 ? " file" : " files")
            << " (" << empty << " of empty elements only, left out) -> " << prefix
            << ".{words,tree,tags,gold}\n";
  return 0;
}

int reconstruct(const CommandLine& command) {
  const auto words = read_token_lines(command.words_path);
  // Without --tags, the placeholder tag for every word (a parser user's walk: trees of new
  // text needed a tags file made up by hand).
  const std::vector<std::vector<std::string>> tags = [&] {
    if (!command.tags_path.empty()) return read_token_lines(command.tags_path);
    std::vector<std::vector<std::string>> placeholders;
    for (const std::vector<std::string>& sentence : words) {
      placeholders.emplace_back(sentence.size(), thpc::parse::kWordPlaceholder);
    }
    return placeholders;
  }();
  if (tags.size() != words.size()) {
    THPC_FAIL(command.tags_path << ": " << tags.size() << " lines, but " << command.words_path
                                << " has " << words.size());
  }
  for (size_t i = 0; i < words.size(); ++i) {
    if (tags[i].size() != words[i].size()) {
      THPC_FAIL(command.tags_path << ":" << i + 1 << ": " << tags[i].size() << " tags for "
                                  << words[i].size() << " words");
    }
    // A bracket in a leaf opens or closes a constituent of the tree written: "a ( c" gave
    // (NN () and an unbalanced tree, counted well-formed, that EVALB then refused.
    for (const auto& [path, leaves] : {std::pair{&command.words_path, &words[i]},
                                       std::pair{&command.tags_path, &tags[i]}}) {
      for (size_t k = 0; k < leaves->size(); ++k) {
        if ((*leaves)[k].find_first_of("()") != std::string::npos) {
          THPC_FAIL(*path << ":" << i + 1 << ": item " << k + 1 << " is '" << (*leaves)[k]
                    << "': a bracket cannot be a tree's word or tag; write ( and ) as the "
                    << "Penn Treebank does, -LRB- and -RRB- (sed -e 's/(/-LRB-/g' -e "
                    << "'s/)/-RRB-/g')");
        }
      }
    }
  }
  std::string out;
  if (command.command == "baseline") {
    for (size_t i = 0; i < words.size(); ++i) {
      out += thpc::parse::to_evalb_line(thpc::parse::right_branching_tree(words[i], tags[i])) + "\n";
    }
    write_output(command.output, out);
    std::cerr << "baseline: " << words.size()
              << (words.size() == 1 ? " right-branching tree -> " : " right-branching trees -> ")
              << output_name(command.output) << "\n";
    return 0;
  }
  std::ifstream file;
  if (!command.input_path.empty()) {
    file = thpc::open_text_file(command.input_path, "");
  }
  std::istream& in = command.input_path.empty() ? std::cin : file;
  const std::string input_name = command.input_path.empty() ? "<stdin>" : command.input_path;
  std::vector<std::string> sequences;
  for (std::string line; std::getline(in, line);) {
    const std::string nul = thpc::nul_byte_problem(input_name, sequences.size() + 1, line);
    if (!nul.empty()) THPC_FAIL(nul);
    sequences.push_back(line);
  }
  if (sequences.size() != words.size()) {
    THPC_FAIL(input_name << ": " << sequences.size() << " lines, but " << command.words_path
                         << " has " << words.size());
  }
  size_t counts[3] = {0, 0, 0};
  size_t other_words = 0;
  for (size_t i = 0; i < words.size(); ++i) {
    const thpc::parse::Delinearized result =
        thpc::parse::delinearize(sequences[i], words[i], tags[i]);
    ++counts[static_cast<int>(result.how)];
    other_words += result.other_words;
    out += thpc::parse::to_evalb_line(result.tree) + "\n";
  }
  write_output(command.output, out);
  std::cerr << "delinearize: " << words.size() << (words.size() == 1 ? " tree: " : " trees: ")
            << counts[0] << " well-formed, "
            << counts[1] << " repaired, " << counts[2]
            << " replaced by the right-branching baseline -> " << output_name(command.output)
            << "\n";
  // Trees of words (not placeholders) whose words a decoder changed: "well-formed" said
  // nothing of it (a helper's walk: "dog" in place of "cat", counted well-formed).
  if (other_words > 0) {
    std::cerr << "delinearize: note: " << other_words << " of them held words other than "
              << command.words_path << "'s (decoded without --tree-constraints?): their "
              << "trees hold " << command.words_path << "'s words in those slots\n";
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return thpc::tools::tool_main("transformer_trees", usage(), argc, argv, parse_command_line,
                                [](const CommandLine& command) {
                                  return command.command == "linearize"
                                             ? linearize_files(command)
                                             : reconstruct(command);
                                });
}
