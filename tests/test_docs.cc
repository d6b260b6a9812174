// The documents stay in step with the programs: every configuration key the README and
// the pages of docs/ (and the READMEs of tools/, input/, jobs/, bench/) name exists in
// the option table, every option their command examples give a transformer_* program is
// in that program's --help, and every relative link reaches its file and heading. A
// stale mention fails with its file:line. And the floors of docs/design.md ("The
// layers") hold in the code's includes (Layers.*).
//
// What is read where:
//  - configuration keys, `section.key` or `--section.key=value`, anywhere in the text
//    (prose too), and the `key = value` lines of ```ini blocks under their [section];
//  - program options in code (fenced blocks and `inline code`): the tokens that follow
//    `transformer_NAME` or `build/transformer_NAME` on its line (and the lines a
//    trailing `\` continues) up to the end of the command (`&&`, `;`, `#`, a pipe into
//    another program), leaving out a `$(...)` inside it; `--section.key` after
//    transformer_hpc is a configuration key;
//  - links `[text](path#anchor)` outside code: the file relative to the document, the
//    anchor among its headings as GitHub makes them (lower case, punctuation dropped,
//    spaces to hyphens, -1, -2 for repeats);
//  - test names, `Suite.Test` (or `Suite.*`, `Suite.Prefix*`) in inline code: a TEST of
//    tests/ or an add_test of tests/tests.cmake.
// The Python scripts' options are not checked (their --help needs their packages), nor
// an option written without its program (`--beam N` in prose).
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "config/config.h"
#include "program.h"

namespace thpc {
namespace {

namespace fs = std::filesystem;
const std::string kRoot = THPC_SOURCE_DIR;

struct Document {
  std::string name;  // as reported: the path from the repository root
  std::vector<std::string> lines;
};

Document read_document(const std::string& name) {
  std::ifstream file(kRoot + "/" + name);
  EXPECT_TRUE(file) << name;
  Document document{name, {}};
  std::string line;
  while (std::getline(file, line)) document.lines.push_back(line);
  return document;
}

// README.md and every .md file of docs/ and of the folders whose READMEs describe
// programs and configs. bench/RESULTS.md is a log of what was run when, with the
// commands of that day, and is left as it was written.
std::vector<std::string> document_names() {
  std::vector<std::string> names = {"README.md"};
  for (const char* folder : {"docs", "tools", "input", "jobs", "bench"}) {
    for (const auto& entry : fs::directory_iterator(kRoot + "/" + folder)) {
      const std::string name = std::string(folder) + "/" + entry.path().filename().string();
      if (entry.path().extension() == ".md" && name != "bench/RESULTS.md") names.push_back(name);
    }
  }
  std::sort(names.begin(), names.end());
  return names;
}

// A stale mention: where, and what.
struct Finding {
  std::string where;  // file:line
  std::string what;
};

void append(std::vector<Finding>& findings, std::vector<Finding> more) {
  for (Finding& finding : more) findings.push_back(std::move(finding));
}

std::string where(const Document& document, size_t index) {
  return document.name + ":" + std::to_string(index + 1);
}

// The code of a document, line by line: a fenced block's lines whole (with the block's
// language), and the `inline code` spans of every other line.
struct CodeLine {
  size_t index;      // line index in the document
  std::string text;  // the line, or one span
  std::string language;  // of the fenced block; "inline" for a span
  bool fenced;
};

// The `code` spans of a line (a run of N backticks ends at the next run of N): where
// each begins and ends (backticks included) and what it holds.
struct Span {
  size_t begin, end;
  std::string code;
};

std::vector<Span> code_spans(const std::string& line) {
  std::vector<Span> spans;
  size_t at = 0;
  while ((at = line.find('`', at)) != std::string::npos) {
    size_t ticks = 0;
    while (at + ticks < line.size() && line[at + ticks] == '`') ++ticks;
    const size_t end = line.find(std::string(ticks, '`'), at + ticks);
    if (end == std::string::npos) break;
    spans.push_back({at, end + ticks, line.substr(at + ticks, end - at - ticks)});
    at = end + ticks;
  }
  return spans;
}

// A line that opens or closes a fenced block (``` at its start or after the indent of a
// list item).
bool is_fence(const std::string& line) {
  const size_t first = line.find_first_not_of(' ');
  return first != std::string::npos && line.compare(first, 3, "```") == 0;
}

std::vector<CodeLine> code_lines(const Document& document) {
  std::vector<CodeLine> code;
  bool in_fence = false;
  std::string language;
  for (size_t i = 0; i < document.lines.size(); ++i) {
    const std::string& line = document.lines[i];
    if (is_fence(line)) {
      in_fence = !in_fence;
      language = in_fence ? line.substr(line.find('`') + 3) : "";
      continue;
    }
    if (in_fence) {
      code.push_back({i, line, language, true});
    } else {
      for (const Span& span : code_spans(line)) code.push_back({i, span.code, "inline", false});
    }
  }
  return code;
}

// The text of a line outside its code spans (where links are read).
std::string without_code(const std::string& line) {
  std::string text;
  size_t at = 0;
  for (const Span& span : code_spans(line)) {
    text += line.substr(at, span.begin - at) + " ";
    at = span.end;
  }
  return text + line.substr(at);
}

// ---- configuration keys ----

// section.key for every key of the option table, read from --help's table.
std::set<std::string> configuration_keys(const std::string& help) {
  std::set<std::string> keys;
  std::istringstream lines(help);
  std::string line, section;
  while (std::getline(lines, line)) {
    // "[decode]", or "[decode]  what the section holds" (not the usage's "[section] of")
    const size_t close = line.find(']');
    if (line.size() > 2 && line.front() == '[' && close != std::string::npos &&
        (close + 1 == line.size() || line.compare(close + 1, 2, "  ") == 0)) {
      section = line.substr(1, close - 1);
      continue;
    }
    if (section.empty() || line.rfind("  ", 0) != 0) continue;
    std::istringstream words(line);
    std::string key;
    words >> key;
    if (key != "key") keys.insert(section + "." + key);
  }
  return keys;
}

const std::set<std::string> kSections = {"model", "train", "data", "dist", "checkpoint",
                                         "decode"};
// What follows "model." or "train." in a file name (data.md, model.bin, train.en).
const std::set<std::string> kFileExtensions = {
    "md", "cc", "h", "cu", "bin", "h5", "ini", "sh", "py", "json", "jsonl", "txt",
    "prm", "yaml", "png", "hyp", "log", "en", "de", "fr"};

bool is_word_character(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) != 0 || c == '_';
}

// A key is known when the table has it; `train.divergence_*` when some key starts so.
bool known_key(const std::set<std::string>& keys, const std::string& name, bool prefix) {
  if (!prefix) return keys.count(name) > 0;
  const auto next = keys.lower_bound(name);
  return next != keys.end() && next->compare(0, name.size(), name) == 0;
}

// Every section.key mentioned in a line: preceded by a start, a space, punctuation or
// `--` (not by a path's `/` or a name's letters), a lower-case name after the dot.
std::vector<Finding> check_key_mentions(const Document& document, size_t index,
                                        const std::string& line,
                                        const std::set<std::string>& keys) {
  std::vector<Finding> findings;
  static const std::regex mention(
      R"((model|train|data|dist|checkpoint|decode)\.([a-z][a-z0-9_]*)(\*?))");
  for (auto it = std::sregex_iterator(line.begin(), line.end(), mention);
       it != std::sregex_iterator(); ++it) {
    const size_t start = static_cast<size_t>(it->position(0));
    if (start > 0) {
      const char before = line[start - 1];
      if (is_word_character(before) || before == '.' || before == '/' || before == '$') continue;
    }
    const std::string key = (*it)[2];
    if (kFileExtensions.count(key) > 0) continue;
    const std::string name = std::string((*it)[1]) + "." + key;
    if (name == "section.key") continue;
    if (!known_key(keys, name, (*it)[3].length() > 0)) {
      findings.push_back({where(document, index),
                          "'" + name + "' is not a configuration key (transformer_hpc --help)"});
    }
  }
  return findings;
}

// `key = value` lines of ```ini blocks, under their [section].
std::vector<Finding> check_ini_blocks(const Document& document,
                                      const std::set<std::string>& keys) {
  std::vector<Finding> findings;
  std::string section;
  static const std::regex section_line(R"(^\[([a-z_]+)\]\s*(#.*)?$)");
  static const std::regex key_line(R"(^([a-z_][a-z0-9_]*)\s*=)");
  for (const CodeLine& code : code_lines(document)) {
    if (!code.fenced || code.language != "ini") continue;
    std::smatch match;
    if (std::regex_search(code.text, match, section_line)) {
      section = match[1];
    } else if (std::regex_search(code.text, match, key_line)) {
      const std::string name = section + "." + std::string(match[1]);
      if (keys.count(name) == 0) {
        findings.push_back({where(document, code.index),
                            "'" + name + "' (ini block) is not a configuration key"});
      }
    }
  }
  return findings;
}

std::vector<Finding> check_configuration_keys(const Document& document,
                                              const std::set<std::string>& keys) {
  std::vector<Finding> findings = check_ini_blocks(document, keys);
  for (size_t i = 0; i < document.lines.size(); ++i) {
    append(findings, check_key_mentions(document, i, document.lines[i], keys));
  }
  return findings;
}

// ---- program options ----

// The --help text of each program, by name ("decode" for transformer_decode); a program
// that is not built has none.
class HelpTexts {
 public:
  const std::string* of(const std::string& program) {
    auto found = texts_.find(program);
    if (found == texts_.end()) {
      const std::string binary = thpc::binary_dir() + "/transformer_" + program;
      std::string text;
      bool exists = fs::exists(binary);
      if (exists) {
        const ProcessResult result = run_process("'" + binary + "' --help");
        EXPECT_EQ(result.exit_code, 0) << binary << " --help: " << result.output;
        text = result.output;
      }
      found = texts_.emplace(program, exists ? text : std::string("\x01")).first;
    }
    return found->second == "\x01" ? nullptr : &found->second;
  }

 private:
  std::map<std::string, std::string> texts_;
};

// Whether `option` (-x, --name) stands in `help` as a whole word.
bool help_lists(const std::string& help, const std::string& option) {
  const auto is_option_character = [](char c) { return is_word_character(c) || c == '-'; };
  for (size_t at = help.find(option); at != std::string::npos; at = help.find(option, at + 1)) {
    const bool starts = at == 0 || !is_option_character(help[at - 1]);
    const size_t end = at + option.size();
    const bool ends = end == help.size() || !is_option_character(help[end]);
    if (starts && ends) return true;
  }
  return false;
}

std::vector<std::string> split_words(const std::string& text) {
  std::vector<std::string> words;
  std::istringstream stream(text);
  std::string word;
  while (stream >> word) words.push_back(word);
  return words;
}

// The option a word of a command gives, or "": `[--beam` -> --beam, `--lenpen=1` ->
// --lenpen, `-tok` -> -tok; values, files and placeholders give none.
std::string option_of(std::string word) {
  while (!word.empty() && (word.front() == '[' || word.front() == '(' || word.front() == '\'' ||
                           word.front() == '"')) {
    word.erase(0, 1);
  }
  static const std::regex option(R"(^(--?[A-Za-z][A-Za-z0-9_.-]*))");
  std::smatch match;
  if (!std::regex_search(word, match, option)) return "";
  std::string name = match[1];
  while (!name.empty() && (name.back() == '.' || name.back() == '-')) name.pop_back();
  return name;
}

std::vector<Finding> check_program_options(const Document& document,
                                           const std::set<std::string>& keys,
                                           HelpTexts& helps) {
  std::vector<Finding> findings;
  const std::vector<CodeLine> code = code_lines(document);
  static const std::regex program(R"((^|[\s/$'"(])transformer_([a-z_]+)(?=\s|$))");
  for (size_t c = 0; c < code.size(); ++c) {
    if (code[c].language == "ini") continue;
    std::string text = code[c].text;
    // A fenced line ending in '\' goes on in the next one.
    for (size_t next = c + 1; code[c].fenced && next < code.size() && !text.empty() &&
                              text.back() == '\\' && code[next].index == code[next - 1].index + 1;
         ++next) {
      text.pop_back();
      text += " " + code[next].text;
    }
    for (auto it = std::sregex_iterator(text.begin(), text.end(), program);
         it != std::sregex_iterator(); ++it) {
      const std::string name = (*it)[2];
      const std::vector<std::string> words =
          split_words(text.substr(static_cast<size_t>(it->position(0) + it->length(0))));
      const std::string* help = helps.of(name);
      bool substituted = false;  // inside $(...), another program's words
      for (size_t w = 0; w < words.size(); ++w) {
        const std::string& word = words[w];
        if (word.rfind("$(", 0) == 0) substituted = true;
        if (substituted) {
          substituted = word.find(')') == std::string::npos;
          continue;
        }
        if (word == "&&" || word == "||" || word == ";" || word[0] == '#') break;
        if (word == "|" && (w + 1 == words.size() || words[w + 1][0] != '-')) break;
        if (word.find("transformer_") != std::string::npos) break;  // the next command's
        const std::string option = option_of(word);
        if (option.empty()) continue;
        const std::string place = where(document, code[c].index);
        if (help == nullptr) {
          findings.push_back({place, "transformer_" + name + " is not a program this build makes"});
          break;
        }
        if (name == "hpc" && option.find('.') != std::string::npos) {
          const std::string key = option.substr(2);
          if (key != "section.key" && keys.count(key) == 0) {
            findings.push_back({place, "transformer_hpc " + option +
                                           ": '" + key + "' is not a configuration key"});
          }
        } else if (!help_lists(*help, option)) {
          findings.push_back({place, "transformer_" + name + " " + option +
                                         ": not an option of its --help"});
        }
      }
    }
  }
  return findings;
}

// ---- links ----

// GitHub's anchor of a heading: lower case, every character but letters, digits,
// spaces, '-' and '_' dropped (non-ASCII letters kept), spaces to '-'.
std::string anchor_of(const std::string& heading) {
  std::string anchor;
  for (const char c : heading) {
    const auto byte = static_cast<unsigned char>(c);
    if (byte >= 0x80 || std::isalnum(byte) != 0 || c == '-' || c == '_') {
      anchor += static_cast<char>(std::tolower(byte));
    } else if (c == ' ') {
      anchor += '-';
    }
  }
  return anchor;
}

std::set<std::string> anchors_of(const Document& document) {
  std::set<std::string> anchors;
  std::map<std::string, int> seen;
  bool in_fence = false;
  for (const std::string& line : document.lines) {
    if (is_fence(line)) in_fence = !in_fence;
    if (in_fence || line.empty() || line[0] != '#') continue;
    const size_t text = line.find_first_not_of('#');
    if (text == std::string::npos || line[text] != ' ') continue;
    const std::string base = anchor_of(line.substr(text + 1));
    const int repeat = seen[base]++;
    anchors.insert(repeat == 0 ? base : base + "-" + std::to_string(repeat));
  }
  return anchors;
}

std::vector<Finding> check_links(const Document& document,
                                 std::map<std::string, Document>& documents) {
  std::vector<Finding> findings;
  static const std::regex link(R"(\]\(([^)\s]+)\))");
  const fs::path folder = fs::path(document.name).parent_path();
  bool in_fence = false;
  for (size_t i = 0; i < document.lines.size(); ++i) {
    const std::string& line = document.lines[i];
    if (is_fence(line)) in_fence = !in_fence;
    if (in_fence) continue;
    const std::string text = without_code(line);
    for (auto it = std::sregex_iterator(text.begin(), text.end(), link);
         it != std::sregex_iterator(); ++it) {
      const std::string target = (*it)[1];
      if (target.find("://") != std::string::npos || target.rfind("mailto:", 0) == 0) continue;
      const size_t hash = target.find('#');
      const std::string file = target.substr(0, hash);
      const std::string anchor = hash == std::string::npos ? "" : target.substr(hash + 1);
      if (file.empty()) {  // a heading of this document
        if (anchors_of(document).count(anchor) == 0) {
          findings.push_back({where(document, i), "link to " + target + ": no heading #" + anchor});
        }
        continue;
      }
      const std::string linked = (folder / file).lexically_normal().generic_string();
      if (!fs::exists(kRoot + "/" + linked)) {
        findings.push_back({where(document, i), "link to " + target + ": no file " + linked});
        continue;
      }
      if (anchor.empty()) continue;
      if (fs::path(linked).extension() != ".md") continue;
      auto found = documents.find(linked);
      if (found == documents.end()) found = documents.emplace(linked, read_document(linked)).first;
      if (anchors_of(found->second).count(anchor) == 0) {
        findings.push_back({where(document, i),
                            "link to " + target + ": " + linked + " has no heading #" + anchor});
      }
    }
  }
  return findings;
}

// ---- test names ----

// Suite.Test of every test: the TEST, TEST_F and TEST_P lines of tests/, and the
// add_test(NAME ...) of tests/tests.cmake (the script tests).
std::set<std::string> test_names() {
  std::set<std::string> names;
  static const std::regex gtest(R"(TEST(_F|_P)?\(\s*(\w+),\s*(\w+)\))");
  static const std::regex ctest(R"(add_test\(NAME\s+([\w.]+))");
  for (const auto& entry : fs::recursive_directory_iterator(kRoot + "/tests")) {
    const std::string extension = entry.path().extension().string();
    if (extension != ".cc" && entry.path().filename() != "tests.cmake") continue;
    std::ifstream file(entry.path());
    std::ostringstream text;
    text << file.rdbuf();
    const std::string source = text.str();
    for (auto it = std::sregex_iterator(source.begin(), source.end(), gtest);
         it != std::sregex_iterator(); ++it) {
      names.insert(std::string((*it)[2]) + "." + std::string((*it)[3]));
    }
    for (auto it = std::sregex_iterator(source.begin(), source.end(), ctest);
         it != std::sregex_iterator(); ++it) {
      names.insert((*it)[1]);
    }
  }
  return names;
}

// Every `Suite.Test` a document names in code (`Suite.*`, `Suite.Prefix*` and
// `Rehearsal.` before a twin's name as ctest lists them) is a test of tests/.
std::vector<Finding> check_test_names(const Document& document,
                                      const std::set<std::string>& tests) {
  std::vector<Finding> findings;
  static const std::regex name(R"(^([A-Z][A-Za-z0-9]*)\.([A-Z*][A-Za-z0-9_*]*)$)");
  for (const CodeLine& code : code_lines(document)) {
    if (code.fenced) continue;
    std::string text = code.text;
    if (text.rfind("Rehearsal.", 0) == 0) {
      text = text.substr(std::string("Rehearsal.").size());
      if (text.find('.') == std::string::npos) text += ".*";  // Rehearsal.Cuda*: suites
    }
    std::smatch match;
    if (!std::regex_match(text, match, name)) continue;
    if (text == "Suite.Case" || text == "Suite.Test") continue;  // the placeholders
    std::string pattern;  // the name as a regex: '*' any characters
    for (const char c : text) {
      pattern += c == '*' ? std::string(".*") : c == '.' ? std::string("\\.") : std::string(1, c);
    }
    const std::regex glob(pattern);
    if (std::none_of(tests.begin(), tests.end(),
                     [&](const std::string& test) { return std::regex_match(test, glob); })) {
      findings.push_back({where(document, code.index), code.text + " is not a test in tests/"});
    }
  }
  return findings;
}

// ---- the floors of docs/design.md ---------------------------------------------------

// docs/design.md's table of floors ("The layers"): each folder or file its rows name in
// their second column, with the row's floor. `tools/*.cc` stands for the folder tools/.
using Floors = std::vector<std::pair<std::string, int>>;

Floors floors_of(const Document& design) {
  static const std::regex row(R"(^\| (\d+) \| ([^|]+) \|)");
  static const std::regex path("`([^`]+)`");
  Floors floors;
  for (const std::string& line : design.lines) {
    std::smatch match;
    if (!std::regex_search(line, match, row)) continue;
    const int floor = std::stoi(match[1].str());
    const std::string cell = match[2].str();
    for (auto it = std::sregex_iterator(cell.begin(), cell.end(), path);
         it != std::sregex_iterator(); ++it) {
      std::string place = (*it)[1].str();
      const size_t star = place.find('*');
      if (star != std::string::npos) place.resize(star);  // tools/*.cc: tools/
      floors.emplace_back(place, floor);
    }
  }
  return floors;
}

// The floor of a file (a path from the repository root): the longest folder of the table
// it lies in, or the file itself; -1 outside the table (tests, generated code).
int floor_of(const Floors& floors, const std::string& file) {
  int floor = -1;
  size_t longest = 0;
  for (const auto& [place, number] : floors) {
    const bool folder = !place.empty() && place.back() == '/';
    const bool inside = folder ? file.compare(0, place.size(), place) == 0 : file == place;
    if (inside && place.size() > longest) {
      longest = place.size();
      floor = number;
    }
  }
  return floor;
}

// Where an `#include "name"` of `file` leads, as the build's include paths resolve it
// (src/, the repository root, then the file's own folder); "" when it is none of ours
// (generated code).
std::string included_file(const std::string& file, const std::string& name) {
  const std::string own_folder = fs::path(file).parent_path().string();
  for (const std::string& candidate :
       {"src/" + name, name, own_folder.empty() ? name : own_folder + "/" + name}) {
    if (fs::exists(kRoot + "/" + candidate)) return fs::path(candidate).lexically_normal().string();
  }
  return "";
}

// Every include of `files` (a path from the root and its lines) that reaches a higher floor
// than its file's: the arrows that run up.
std::vector<Finding> upward_includes(const Floors& floors, const std::vector<Document>& files) {
  static const std::regex include(R"re(^\s*#\s*include\s+"([^"]+)")re");
  std::vector<Finding> findings;
  for (const Document& file : files) {
    const int floor = floor_of(floors, file.name);
    if (floor < 0) continue;
    for (size_t index = 0; index < file.lines.size(); ++index) {
      std::smatch match;
      if (!std::regex_search(file.lines[index], match, include)) continue;
      const std::string target = included_file(file.name, match[1].str());
      const int target_floor = target.empty() ? -1 : floor_of(floors, target);
      if (target_floor > floor) {
        findings.push_back({where(file, index), "floor " + std::to_string(floor) +
                                                    " includes " + target + ", floor " +
                                                    std::to_string(target_floor)});
      }
    }
  }
  return findings;
}

// The sources the floors hold: every .h, .cc, .cu and .cuh under src/, kernels/, tools/.
std::vector<Document> source_files() {
  std::vector<Document> files;
  for (const char* folder : {"src", "kernels", "tools"}) {
    for (const auto& entry : fs::recursive_directory_iterator(kRoot + "/" + folder)) {
      const std::string extension = entry.path().extension().string();
      if (extension != ".h" && extension != ".cc" && extension != ".cu" && extension != ".cuh") {
        continue;
      }
      files.push_back(
          read_document(fs::relative(entry.path(), kRoot).lexically_normal().string()));
    }
  }
  return files;
}

// ---- the tests ----

void report(const std::vector<Finding>& findings) {
  for (const Finding& finding : findings) ADD_FAILURE() << finding.where << ": " << finding.what;
}

class Docs : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string* help = helps_.of("hpc");
    ASSERT_NE(help, nullptr) << "build transformer_hpc first";
    keys_ = configuration_keys(*help);
    ASSERT_GT(keys_.size(), 50u) << "no key table in transformer_hpc --help";
    for (const std::string& name : document_names()) documents_.emplace(name, read_document(name));
  }
  HelpTexts helps_;
  std::set<std::string> keys_;
  std::map<std::string, Document> documents_;
};

TEST_F(Docs, EveryConfigurationKeyMentionedExists) {
  for (const auto& [name, document] : documents_) {
    report(check_configuration_keys(document, keys_));
  }
}

TEST_F(Docs, EveryProgramOptionInTheExamplesIsInItsHelp) {
  int commands = 0;
  for (const auto& [name, document] : documents_) {
    report(check_program_options(document, keys_, helps_));
    for (const CodeLine& code : code_lines(document)) {
      commands += code.text.find("transformer_") != std::string::npos;
    }
  }
  EXPECT_GT(commands, 100) << "the documents' commands were not found";
}

TEST_F(Docs, EveryTestNamedExists) {
  const std::set<std::string> tests = test_names();
  ASSERT_GT(tests.size(), 300u) << "no TEST lines found in tests/";
  for (const auto& [name, document] : documents_) report(check_test_names(document, tests));
}

TEST_F(Docs, EveryRelativeLinkReachesItsFileAndHeading) {
  std::map<std::string, Document> linked = documents_;
  for (const auto& [name, document] : documents_) report(check_links(document, linked));
}

// docs/scaling.md holds what tools/scaling_model.py prints from bench/RESULTS.md's measured
// steps: a new measurement or a changed constant that was not carried into the document
// fails here, naming the line (issue 52: the document quotes only measured or labelled
// modelled numbers, and those are the tool's).
TEST(ScalingDocument, HoldsEveryLineTheScalingModelPrints) {
  const ProcessResult model =
      run_process("cd '" THPC_SOURCE_DIR "' && python3 tools/scaling_model.py");
  ASSERT_EQ(model.exit_code, 0) << model.output;
  std::ifstream file(THPC_SOURCE_DIR "/docs/scaling.md");
  const std::string document((std::istreambuf_iterator<char>(file)),
                             std::istreambuf_iterator<char>());
  std::istringstream lines(model.output);
  int table_rows = 0;
  for (std::string line; std::getline(lines, line);) {
    if (line.empty()) continue;
    table_rows += line.rfind("| ", 0) == 0;
    EXPECT_NE(document.find(line + "\n"), std::string::npos)
        << "docs/scaling.md lacks this line of tools/scaling_model.py (run it and paste its "
           "output into the document):\n"
        << line;
  }
  EXPECT_GT(table_rows, 20) << model.output;
}

// tools/scaling_model.py --buckets LOG: a measured bucket schedule (the last
// `buckets at step` line of a run with dist.log_buckets) in place of the 2/3 rule, a table
// row per GPU count and sum dtype; a log without such a line is refused, naming it.
TEST(ScalingDocument, TheModelTakesAMeasuredBucketSchedule) {
  const std::string log = ::testing::TempDir() + "thpc_scaling_buckets.log";
  const std::string empty_log = ::testing::TempDir() + "thpc_scaling_nothing.log";
  std::ofstream(log) << "step 60/60 | loss 1.0\n"
                     << "buckets at step 60 (ms from the last micro-batch's start, GPU events): "
                        "backward done 6.00, sums done 6.50, exposed 0.50; 3 buckets (MiB posted "
                        "done): | 25.000 2.00 3.00 | 25.000 4.00 5.00 | 10.000 6.00 6.50\n";
  std::ofstream(empty_log) << "step 60/60 | loss 1.0\n";
  const ProcessResult model = run_process(
      "cd '" THPC_SOURCE_DIR "' && python3 tools/scaling_model.py --buckets " + log);
  ASSERT_EQ(model.exit_code, 0) << model.output;
  const size_t table = model.output.find("### base with the measured bucket schedule of " + log);
  ASSERT_NE(table, std::string::npos) << model.output;
  EXPECT_NE(model.output.find("3 buckets posted at 0.33, 0.67, 1.00 of the pass's compute",
                              table),
            std::string::npos)
      << model.output;
  for (const char* row : {"| 8 | NVLink 4 | fp32 | ", "| 8 | NVLink 4 | bf16 | ",
                          "| 64 | NDR x8 per node | fp32 | ", "| 64 | NDR x8 per node | bf16 | "}) {
    EXPECT_NE(model.output.find(row, table), std::string::npos) << row;
  }
  const ProcessResult refused = run_process(
      "cd '" THPC_SOURCE_DIR "' && python3 tools/scaling_model.py --buckets " + empty_log);
  EXPECT_NE(refused.exit_code, 0);
  EXPECT_NE(refused.output.find("--buckets " + empty_log + ": no 'buckets at step' line"),
            std::string::npos)
      << refused.output;
  std::remove(log.c_str());
  std::remove(empty_log.c_str());
}

// The checks can fail: a document with stale mentions of each kind (a key, an ini key,
// two options, an override, two links, a renamed test) gives one finding each, at its
// line; the same lines spelt right give none.
TEST_F(Docs, TheChecksFindAStaleMentionOfEachKind) {
  const Document stale{"stale.md",
                       {"# Title",
                        "Set `train.max_stepz` to stop.",
                        "```ini",
                        "[model]",
                        "layerz = 2",
                        "```",
                        "```sh",
                        "build/transformer_decode --checkpoint a.h5 --beem 4 \\",
                        "    --lenpen 0.6 --nbestt 2",
                        "build/transformer_hpc input/tiny.ini --train.max_stepz=5",
                        "```",
                        "See [the title](#titel) and [data](docs/nowhere.md).",
                        "`Trainer.GoldenLossesOfTinyIni` pins the losses."}};
  const Document right{"right.md",
                       {"# Title",
                        "Set `train.max_steps` to stop; `train.divergence_*` and data.md.",
                        "```ini",
                        "[model]",
                        "layers = 2",
                        "```",
                        "```sh",
                        "build/transformer_decode --checkpoint a.h5 --beam 4 \\",
                        "    --lenpen 0.6 --nbest 2 | sort | head -n 2",
                        "build/transformer_hpc input/tiny.ini --train.max_steps=5 --dry-run",
                        "transformer_hpc $(spack location -i transformer-hpc)/tiny.ini --help",
                        "```",
                        "See [the title](#title) and [data](docs/data.md#real-data).",
                        "`RegressionPin.FirstLossesOfTinyIni`, `Docs.*`,",
                        "`Rehearsal.CudaRowTopK*`."}};
  std::map<std::string, Document> linked = documents_;
  const std::set<std::string> tests = test_names();
  const auto all_findings = [&](const Document& document) {
    std::vector<Finding> findings = check_configuration_keys(document, keys_);
    append(findings, check_program_options(document, keys_, helps_));
    append(findings, check_links(document, linked));
    append(findings, check_test_names(document, tests));
    return findings;
  };
  std::vector<std::string> places;
  for (const Finding& finding : all_findings(stale)) places.push_back(finding.where);
  std::sort(places.begin(), places.end());
  EXPECT_EQ(places, (std::vector<std::string>{"stale.md:10", "stale.md:10", "stale.md:12",
                                              "stale.md:12", "stale.md:13", "stale.md:2",
                                              "stale.md:5", "stale.md:8", "stale.md:8"}));
  report(all_findings(right));
}

// docs/design.md's floors hold in the code: no file of src/, kernels/ or tools/ includes
// one of a higher floor than its own (the table read from the document, so a folder moved
// to another floor there is checked here).
TEST(Layers, NoIncludeRunsUpTheFloorsOfTheDesign) {
  const Floors floors = floors_of(read_document("docs/design.md"));
  ASSERT_GE(floors.size(), 12u) << "the floors' table of docs/design.md was not found";
  const std::vector<Document> files = source_files();
  ASSERT_GT(files.size(), 150u);
  int placed = 0;
  for (const Document& file : files) placed += floor_of(floors, file.name) >= 0;
  EXPECT_EQ(placed, static_cast<int>(files.size())) << "a source file on no floor of the table";
  report(upward_includes(floors, files));
}

// The check can fail: a model file including the trainer is an arrow up, found at its line;
// including the op contract, its own floor's header or a generated one is not.
TEST(Layers, TheCheckFindsAnIncludeThatRunsUp) {
  const Floors floors = floors_of(read_document("docs/design.md"));
  const Document model{"src/model/made_up.cc",
                       {"#include \"model/transformer.h\"", "#include \"kernels/ops.h\"",
                        "#include \"tensorboard/event.pb.h\"", "#include \"train/trainer.h\""}};
  const std::vector<Finding> findings = upward_includes(floors, {model});
  ASSERT_EQ(findings.size(), 1u);
  EXPECT_EQ(findings[0].where, "src/model/made_up.cc:4");
  EXPECT_NE(findings[0].what.find("src/train/trainer.h, floor 7"), std::string::npos)
      << findings[0].what;
}

}  // namespace
}  // namespace thpc
