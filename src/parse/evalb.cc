#include "parse/evalb.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <optional>
#include <sstream>

#include "common/error.h"
#include "common/input_file.h"
#include "common/whole_number.h"

namespace thpc::parse {
namespace {

bool is_space(char c) { return std::isspace(static_cast<unsigned char>(c)) != 0; }
bool ends_token(char c) { return c == '\0' || is_space(c) || c == '(' || c == ')'; }

// The label of a tree line's outermost bracket ("" for "( (S ...)"), or nullopt for a
// line that does not begin with one (a blank line: a sentence the parser skipped).
std::optional<std::string> outer_label(const std::string& text) {
  const size_t open = text.find_first_not_of(" \t\r");
  if (open == std::string::npos || text[open] != '(') return std::nullopt;
  std::string label;
  for (const char* p = text.c_str() + open + 1; !ends_token(*p); ++p) label += *p;
  return label;
}

std::string format(const char* pattern, ...) {
  char buffer[512];
  va_list arguments;
  va_start(arguments, pattern);
  std::vsnprintf(buffer, sizeof(buffer), pattern, arguments);
  va_end(arguments);
  return buffer;
}

bool contains(const std::vector<std::string>& list, const std::string& item) {
  return std::find(list.begin(), list.end(), item) != list.end();
}

bool equal_under(const std::vector<std::pair<std::string, std::string>>& pairs,
                 const std::string& a, const std::string& b) {
  if (a == b) return true;
  for (const auto& [first, second] : pairs) {
    if ((a == first && b == second) || (a == second && b == first)) return true;
  }
  return false;
}

// Result codes of a word or bracket, as EVALB's tables print them.
constexpr int kUnmatched = 0;
constexpr int kMatched = 1;
constexpr int kDeleted = 5;
constexpr int kUndecided = 9;

struct Terminal {
  std::string word;
  std::string label;
  int result = kUndecided;
};

struct Bracket {
  int start = -1;
  int end = -1;
  std::string label;
  int result = kUndecided;
};

// A QUOTE_LABEL terminal ("'", "\"" or "/" as its word), remembered with where it stood
// so that it can be put back if one side deleted it and the other did not.
struct QuoteTerminal {
  Terminal terminal;
  int word_index = -1;              // words kept before it
  int next_bracket = -1;            // brackets opened before it
  std::vector<int> open_brackets;   // brackets enclosing it
};

struct Tree {
  std::vector<Terminal> words;
  std::vector<QuoteTerminal> quotes;
  std::vector<Bracket> brackets;
  int length = 0;      // words not in DELETE_LABEL_FOR_LENGTH
  int kept_brackets = 0;
};

class TooManyErrors {};

enum Status { kValid = 0, kError = 1, kSkipped = 2 };

class Evaluator {
 public:
  Evaluator(const EvalbParameters& parameters, std::ostream& report, std::ostream& errors)
      : parameters_(parameters), report_(report), errors_(errors) {}

  EvalbResult run(std::istream& gold, std::istream& test);

 private:
  void error(const std::string& message);
  Tree read_tree(const std::string& text);
  void score_sentence(Tree& gold, Tree& test);
  void reinsert_quotes(Tree& gold, Tree& test);
  void prepare_brackets(Tree& tree);
  void add_sentence(int words, int gold_brackets, int test_brackets, int matched, int crossings,
                    int correct_tags);
  void print_tables(const Tree& gold, const Tree& test) const;
  void print_summary(const EvalbTotals& totals, const std::string& title) const;
  bool is_delete_label(const std::string& label) const {
    return contains(parameters_.delete_labels, label);
  }

  const EvalbParameters& parameters_;
  std::ostream& report_;
  std::ostream& errors_;
  EvalbResult result_;
  int line_ = 0;
  const char* reading_ = "";  // the file of the tree being read: "gold", "test", or ""
  int status_ = kValid;
  int gold_length_ = 0;
  int gold_words_ = 0;  // shown in the Words column of an error or skipped sentence
};

void Evaluator::error(const std::string& message) {
  status_ = kError;
  errors_ << line_ << " : " << message << "\n";
  if (result_.first_error.empty()) {
    result_.first_error = message;
    result_.first_error_line = line_;
    result_.first_error_file = reading_;
  }
  // EVALB compares the count before incrementing it, so it stops at the error that
  // makes the count MAX_ERROR + 2.
  if (result_.errors++ > parameters_.max_error) throw TooManyErrors();
}

Tree Evaluator::read_tree(const std::string& text) {
  Tree tree;
  std::vector<int> open;
  const char* const begin = text.c_str();
  const char* p = begin;
  while (*p != '\0') {
    if (is_space(*p)) {
      ++p;
    } else if (*p == '(') {
      std::string label;
      for (++p; !ends_token(*p); ++p) label += *p;
      if (is_space(*p)) {
        const char* q = p;
        while (is_space(*q)) ++q;
        std::string word;
        for (; !ends_token(*q); ++q) word += *q;
        if (*q == ')') {
          if (!contains(parameters_.delete_labels_for_length, label)) ++tree.length;
          if (contains(parameters_.quote_labels, label) &&
              (word == "'" || word == "\"" || word == "/")) {
            tree.quotes.push_back({Terminal{word, label, kUndecided},
                                   static_cast<int>(tree.words.size()),
                                   static_cast<int>(tree.brackets.size()), open});
          }
          if (!is_delete_label(label)) tree.words.push_back({word, label, kUndecided});
          p = q + 1;
          continue;
        }
        if (*q != '(') error("More than two elements in a bracket");
      }
      Bracket bracket;
      bracket.start = static_cast<int>(tree.words.size());
      bracket.label = label;
      open.push_back(static_cast<int>(tree.brackets.size()));
      tree.brackets.push_back(bracket);
    } else if (*p == ')') {
      if (open.empty()) {
        error("Bracketing unbalance (too many close bracket)");
      } else {
        tree.brackets[open.back()].end = static_cast<int>(tree.words.size());
        open.pop_back();
      }
      ++p;
    } else {
      // EVALB does not advance past text outside a bracket: it repeats this error
      // until MAX_ERROR ends the run.
      for (;;) error("Reading sentence");
    }
  }
  if (!open.empty()) error("Bracketing is unbalanced (too many open bracket)");
  return tree;
}

// Ellis's fix: a quote one side deleted (e.g. (`` ") under DELETE_LABEL ``) and the
// other kept under another tag (e.g. (CD ")) is put back where it stood, its enclosing
// brackets widened and later ones shifted, so the word counts agree again.
void Evaluator::reinsert_quotes(Tree& gold, Tree& test) {
  auto reinsert = [](QuoteTerminal& quote, Tree& tree) {
    tree.words.insert(tree.words.begin() + std::min<size_t>(quote.word_index, tree.words.size()),
                      Terminal{quote.terminal.word, quote.terminal.label, kUndecided});
    for (size_t k = 0; k < tree.brackets.size(); ++k) {
      if (static_cast<int>(k) >= quote.next_bracket) {
        ++tree.brackets[k].start;
        ++tree.brackets[k].end;
      }
    }
    for (int enclosing : quote.open_brackets) ++tree.brackets[enclosing].end;
  };
  for (size_t i = 0; i < test.quotes.size(); ++i) {
    const int index = test.quotes[i].word_index;
    for (size_t j = 0; j < gold.quotes.size(); ++j) {
      if (gold.quotes[j].word_index != index ||
          gold.quotes[j].terminal.label == test.quotes[i].terminal.label) {
        continue;
      }
      const bool gold_deleted = is_delete_label(gold.quotes[j].terminal.label);
      const bool test_deleted = is_delete_label(test.quotes[i].terminal.label);
      if (gold_deleted && !test_deleted) {
        reinsert(gold.quotes[j], gold);
        for (size_t k = j; k < gold.quotes.size(); ++k) ++gold.quotes[k].word_index;
      } else if (test_deleted && !gold_deleted) {
        reinsert(test.quotes[i], test);
        for (size_t k = i; k < test.quotes.size(); ++k) ++test.quotes[k].word_index;
      }
    }
  }
}

void Evaluator::prepare_brackets(Tree& tree) {
  tree.kept_brackets = 0;
  for (Bracket& bracket : tree.brackets) {
    bracket.result = kUnmatched;
    if (bracket.start == bracket.end) {
      bracket.result = kDeleted;
      continue;
    }
    const size_t cut = bracket.label.find_first_of("-=");
    if (cut != std::string::npos) bracket.label.resize(cut);
    for (const std::string& deleted : parameters_.delete_labels) {
      if (equal_under(parameters_.equal_labels, bracket.label, deleted)) bracket.result = kDeleted;
    }
    if (bracket.result != kDeleted) ++tree.kept_brackets;
  }
}

void Evaluator::score_sentence(Tree& gold, Tree& test) {
  gold_words_ = static_cast<int>(gold.words.size());
  if (test.words.empty()) {
    status_ = kSkipped;
    add_sentence(0, 0, 0, 0, 0, 0);
    return;
  }
  if (gold.words.size() != test.words.size()) {
    reinsert_quotes(gold, test);
    gold_words_ = static_cast<int>(gold.words.size());
    if (gold.words.size() != test.words.size()) {
      error(format("Length unmatch (%d|%d)", static_cast<int>(gold.words.size()),
                   static_cast<int>(test.words.size())));
      add_sentence(0, 0, 0, 0, 0, 0);
      return;
    }
  }
  for (size_t i = 0; i < gold.words.size(); ++i) {
    if (!equal_under(parameters_.equal_words, gold.words[i].word, test.words[i].word)) {
      error("Words unmatch (" + gold.words[i].word + "|" + test.words[i].word + ")");
      add_sentence(0, 0, 0, 0, 0, 0);
      return;
    }
  }
  prepare_brackets(gold);
  prepare_brackets(test);

  int matched = 0;
  for (Bracket& g : gold.brackets) {
    if (g.result == kDeleted) continue;
    for (Bracket& t : test.brackets) {
      if (t.result != kUnmatched || g.start != t.start || g.end != t.end) continue;
      if (!parameters_.labeled || equal_under(parameters_.equal_labels, g.label, t.label)) {
        g.result = t.result = kMatched;
        ++matched;
        break;
      }
    }
  }
  // Crossing is counted over test brackets (Collins): one each that any gold bracket
  // overlaps without nesting.
  int crossings = 0;
  for (const Bracket& t : test.brackets) {
    if (t.result == kDeleted) continue;
    for (const Bracket& g : gold.brackets) {
      if (g.result == kDeleted) continue;
      if ((g.start < t.start && g.end > t.start && g.end < t.end) ||
          (g.start > t.start && g.start < t.end && g.end > t.end)) {
        ++crossings;
        break;
      }
    }
  }
  int correct_tags = 0;
  for (size_t i = 0; i < gold.words.size(); ++i) {
    const bool correct = equal_under(parameters_.equal_labels, gold.words[i].label,
                                     test.words[i].label);
    gold.words[i].result = test.words[i].result = correct ? kMatched : kUnmatched;
    if (correct) ++correct_tags;
  }
  add_sentence(static_cast<int>(gold.words.size()), gold.kept_brackets, test.kept_brackets,
               matched, crossings, correct_tags);
}

void Evaluator::add_sentence(int words, int gold_brackets, int test_brackets, int matched,
                             int crossings, int correct_tags) {
  auto add = [&](EvalbTotals& totals) {
    ++totals.sentences;
    if (status_ == kError) {
      ++totals.error_sentences;
    } else if (status_ == kSkipped) {
      ++totals.skipped_sentences;
    } else {
      totals.gold_brackets += gold_brackets;
      totals.test_brackets += test_brackets;
      totals.matched_brackets += matched;
      if (gold_brackets == test_brackets && test_brackets == matched) ++totals.complete_matches;
      totals.words += words;
      totals.crossings += crossings;
      if (crossings == 0) ++totals.no_crossing_sentences;
      if (crossings <= 2) ++totals.two_or_less_crossing_sentences;
      totals.correct_tags += correct_tags;
    }
  };
  add(result_.all);
  if (gold_length_ <= parameters_.cutoff_length) add(result_.within_cutoff);

  // An error or skipped sentence shows the gold word count, as sample.rsl does.
  const int shown_words = status_ == kValid ? words : gold_words_;
  report_ << format("%4d  %3d    %d  ", line_, gold_length_, status_)
          << format("%6.2f %6.2f   %3d    %3d  %3d    %3d",
                    gold_brackets == 0 ? 0.0 : 100.0 * matched / gold_brackets,
                    test_brackets == 0 ? 0.0 : 100.0 * matched / test_brackets,
                    matched, gold_brackets, test_brackets, crossings)
          << format("   %4d  %4d   %6.2f\n", shown_words, correct_tags,
                    shown_words == 0 ? 0.0 : 100.0 * correct_tags / shown_words);
}

void Evaluator::print_tables(const Tree& gold, const Tree& test) const {
  const int gold_words = static_cast<int>(gold.words.size());
  const int test_words = static_cast<int>(test.words.size());
  const int gold_brackets = static_cast<int>(gold.brackets.size());
  const int test_brackets = static_cast<int>(test.brackets.size());
  report_ << format("-<1>---(wn1=%3d, bn1=%3d)-           ", gold_words, gold_brackets)
          << format("-<2>---(wn2=%3d, bn2=%3d)-\n", test_words, test_brackets);
  for (int i = 0; i < std::max(gold_words, test_words); ++i) {
    if (i < gold_words && !gold.words[i].word.empty()) {
      const Terminal& w = gold.words[i];
      report_ << format("%3d : %d : %-6s  %-16s      ", i, w.result, w.label.c_str(),
                        w.word.c_str());
    } else {
      report_ << std::string(40, ' ');
    }
    if (i < test_words && !test.words[i].word.empty()) {
      const Terminal& w = test.words[i];
      report_ << format("%3d : %d : %-6s  %-16s\n", i, w.result, w.label.c_str(),
                        w.word.c_str());
    } else {
      report_ << "\n";
    }
  }
  report_ << "\n";
  for (int i = 0; i < std::max(gold_brackets, test_brackets); ++i) {
    if (i < gold_brackets) {
      const Bracket& b = gold.brackets[i];
      report_ << format("%3d : %d : %3d  %3d  %-6s      ", i, b.result, b.start, b.end,
                        b.label.c_str());
    } else {
      report_ << std::string(32, ' ');
    }
    if (i < test_brackets) {
      const Bracket& b = test.brackets[i];
      report_ << format("%3d : %d : %3d  %3d  %-6s\n", i, b.result, b.start, b.end,
                        b.label.c_str());
    } else {
      report_ << "\n";
    }
  }
  report_ << "\n========\n";
}

void Evaluator::print_summary(const EvalbTotals& totals, const std::string& title) const {
  const int valid = totals.valid_sentences();
  auto per_sentence = [&](double count, double scale) {
    return valid > 0 ? scale * count / valid : 0.0;
  };
  report_ << "\n-- " << title << " --\n"
          << format("Number of sentence        = %6d\n", totals.sentences)
          << format("Number of Error sentence  = %6d\n", totals.error_sentences)
          << format("Number of Skip  sentence  = %6d\n", totals.skipped_sentences)
          << format("Number of Valid sentence  = %6d\n", valid)
          << format("Bracketing Recall         = %6.2f\n", totals.recall())
          << format("Bracketing Precision      = %6.2f\n", totals.precision())
          << format("Bracketing FMeasure       = %6.2f\n", totals.f_measure())
          << format("Complete match            = %6.2f\n", per_sentence(totals.complete_matches, 100.0))
          << format("Average crossing          = %6.2f\n", per_sentence(totals.crossings, 1.0))
          << format("No crossing               = %6.2f\n",
                    per_sentence(totals.no_crossing_sentences, 100.0))
          << format("2 or less crossing        = %6.2f\n",
                    per_sentence(totals.two_or_less_crossing_sentences, 100.0))
          << format("Tagging accuracy          = %6.2f\n",
                    totals.words > 0 ? 100.0 * totals.correct_tags / totals.words : 0.0);
}

EvalbResult Evaluator::run(std::istream& gold_lines, std::istream& test_lines) {
  report_ << "  Sent.                        Matched  Bracket   Cross        Correct Tag\n"
          << " ID  Len.  Stat. Recal  Prec.  Bracket gold test Bracket Words  Tags Accracy\n"
          << "============================================================================\n";
  try {
    std::string gold_text;
    std::string test_text;
    // A byte order mark before a file's first tree (an editor on Windows) is skipped: EVALB
    // read it as the start of a tree that is not one ("Reading sentence" a dozen times).
    const auto without_mark = [](std::string& line) {
      if (line.rfind("\xEF\xBB\xBF", 0) == 0) line.erase(0, 3);
    };
    for (line_ = 1; std::getline(gold_lines, gold_text); ++line_) {
      if (line_ == 1) without_mark(gold_text);
      ++result_.gold_lines;
      status_ = kValid;
      reading_ = "gold";
      Tree gold = read_tree(gold_text);
      gold_length_ = gold.length;
      reading_ = "";
      if (!std::getline(test_lines, test_text)) {
        error("Number of lines unmatch (too many lines in gold file)");
        while (std::getline(gold_lines, gold_text)) ++result_.gold_lines;
        break;
      }
      ++result_.test_lines;
      if (line_ == 1) without_mark(test_text);
      reading_ = "test";
      Tree test = read_tree(test_text);
      reading_ = "";
      const std::optional<std::string> gold_root = outer_label(gold_text);
      const std::optional<std::string> test_root = outer_label(test_text);
      // (an unlabelled root, or the Stanford tools' ROOT, is a bracket EVALB counts; TOP,
      // as transformer_trees writes roots, one COLLINS.prm deletes)
      const auto counted = [](const std::string& label) {
        return label.empty() || label == "ROOT";
      };
      if (gold_root && test_root &&
          (gold_root->empty() != test_root->empty() ||
           (counted(*gold_root) && *test_root == "TOP") ||
           (*gold_root == "TOP" && counted(*test_root))) &&
          result_.unlabelled_root_against_labelled++ == 0) {
        result_.first_unlabelled_root_line = line_;
      }
      score_sentence(gold, test);
      if (parameters_.debug >= 1) print_tables(gold, test);
    }
    if (std::getline(test_lines, test_text)) {
      ++result_.test_lines;
      while (std::getline(test_lines, test_text)) ++result_.test_lines;
      error("Number of lines unmatch (too many lines in test file)");
    }
  } catch (const TooManyErrors&) {
    result_.stopped = true;
    return result_;
  }

  const EvalbTotals& all = result_.all;
  report_ << "============================================================================\n";
  if (all.gold_brackets > 0 && all.test_brackets > 0) {
    report_ << format("                %6.2f %6.2f %5d %5d %5d  %5d", all.recall(),
                      all.precision(), all.matched_brackets, all.gold_brackets,
                      all.test_brackets, all.no_crossing_sentences);
  }
  report_ << format("  %5d %5d   %6.2f\n", all.words, all.correct_tags,
                    all.words > 0 ? 100.0 * all.correct_tags / all.words : 0.0)
          << "=== Summary ===\n";
  print_summary(result_.all, "All");
  print_summary(result_.within_cutoff, "len<=" + std::to_string(parameters_.cutoff_length));
  return result_;
}

}  // namespace

EvalbParameters collins_parameters() {
  EvalbParameters parameters;  // LABELED 1, CUTOFF_LEN 40 and MAX_ERROR 10: the defaults
  parameters.delete_labels = {"TOP", "-NONE-", ",", ":", "``", "''", "."};
  parameters.delete_labels_for_length = {"-NONE-"};
  parameters.equal_labels = {{"ADVP", "PRT"}};
  return parameters;
}

double bracketing_f_measure(const EvalbParameters& parameters,
                            const std::vector<std::string>& gold,
                            const std::vector<std::string>& test, std::string* first_error) {
  EvalbParameters unstopped = parameters;
  unstopped.max_error = std::numeric_limits<int>::max() - 1;
  const auto joined = [](const std::vector<std::string>& lines) {
    std::string text;
    for (const std::string& line : lines) text += line + "\n";
    return text;
  };
  std::istringstream gold_in(joined(gold));
  std::istringstream test_in(joined(test));
  std::ostringstream report;
  std::ostringstream errors;
  const EvalbResult result = run_evalb(unstopped, gold_in, test_in, report, errors);
  if (first_error != nullptr) *first_error = result.first_error;
  const double f = result.all.f_measure();
  return std::isnan(f) ? 0.0 : f;
}

double EvalbTotals::recall() const {
  return gold_brackets > 0 ? 100.0 * matched_brackets / gold_brackets : 0.0;
}

double EvalbTotals::precision() const {
  return test_brackets > 0 ? 100.0 * matched_brackets / test_brackets : 0.0;
}

double EvalbTotals::f_measure() const {
  const double r = recall();
  const double p = precision();
  return 2 * p * r / (p + r);
}

EvalbParameters read_evalb_parameters(const std::string& path, std::ostream& warnings) {
  std::ifstream in = open_text_file(path, "the EVALB parameter file");
  EvalbParameters parameters;
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    while (!line.empty() && is_space(line.back())) line.pop_back();
    if (line.size() < 3 || line[0] == '#') continue;
    size_t key_end = 0;
    while (key_end < line.size() && !is_space(line[key_end])) ++key_end;
    size_t value_start = key_end;
    while (value_start < line.size() && is_space(line[value_start])) ++value_start;
    const std::string key = line.substr(0, key_end);
    const std::string value = line.substr(value_start);
    // EVALB's warnings, each naming the file and line (EVALB's named neither, or the line
    // alone: a user had no way to tell which file a word came from).
    const std::string where = path + ":" + std::to_string(number) + ": ";
    if (value.empty()) {
      warnings << where << "Empty value in parameter file (" << number << ")\n";
    }
    // EVALB reads its numbers with atoi: "-5" or "abc" became a cutoff of -5 or 0, which
    // the command line's -c refuses. A whole number >= 0, or the file is refused.
    auto number_of = [&](const char* what) {
      const std::optional<uint64_t> number_read = whole_number(value);
      if (!number_read || *number_read > static_cast<uint64_t>(std::numeric_limits<int>::max())) {
        THPC_FAIL(where << what << " " << quoted(value) << ": expected a whole number >= 0 "
                        << "(the EVALB parameter file)");
      }
      return static_cast<int>(*number_read);
    };
    auto pair_of = [&](const char* what) -> std::pair<std::string, std::string> {
      std::istringstream fields(value);
      std::string first, second, extra;
      if (!(fields >> first >> second) || (fields >> extra)) {
        warnings << where << what << " requires two values\n";
        return {};
      }
      return {first, second};
    };
    if (key == "DEBUG") {
      parameters.debug = number_of("DEBUG");
    } else if (key == "MAX_ERROR") {
      parameters.max_error = number_of("MAX_ERROR");
    } else if (key == "CUTOFF_LEN") {
      parameters.cutoff_length = number_of("CUTOFF_LEN");
    } else if (key == "LABELED") {
      parameters.labeled = number_of("LABELED") != 0;
    } else if (key == "DELETE_LABEL") {
      parameters.delete_labels.push_back(value);
    } else if (key == "DELETE_LABEL_FOR_LENGTH") {
      parameters.delete_labels_for_length.push_back(value);
    } else if (key == "QUOTE_LABEL") {
      parameters.quote_labels.push_back(value);
    } else if (key == "EQ_LABEL" || key == "EQ_WORD") {
      auto pair = pair_of(key.c_str());
      if (pair.first.empty()) continue;
      (key == "EQ_LABEL" ? parameters.equal_labels : parameters.equal_words).push_back(pair);
    } else {
      warnings << where << "Unknown keyword (" << line << ") in parameter file\n";
    }
  }
  return parameters;
}

EvalbResult run_evalb(const EvalbParameters& parameters, std::istream& gold, std::istream& test,
                      std::ostream& report, std::ostream& errors) {
  Evaluator evaluator(parameters, report, errors);
  return evaluator.run(gold, test);
}

}  // namespace thpc::parse
