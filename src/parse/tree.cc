#include "parse/tree.h"

#include <cctype>
#include <sstream>
#include <utility>

#include "common/error.h"

namespace thpc::parse {
namespace {

struct Token {
  enum Kind { kOpen, kClose, kAtom, kEnd } kind = kEnd;
  std::string text;
  int line = 0;
};

class Tokenizer {
 public:
  Tokenizer(std::istream& in, const std::string& source) : in_(in), source_(source) {}

  Token next() {
    int c = in_.get();
    while (c != EOF && std::isspace(c)) {
      if (c == '\n') ++line_;
      c = in_.get();
    }
    Token token;
    token.line = line_;
    if (c == EOF) return token;
    if (c == '(') {
      token.kind = Token::kOpen;
    } else if (c == ')') {
      token.kind = Token::kClose;
    } else {
      token.kind = Token::kAtom;
      while (c != EOF && !std::isspace(c) && c != '(' && c != ')') {
        token.text += static_cast<char>(c);
        c = in_.get();
      }
      if (c != EOF) in_.unget();
    }
    return token;
  }

  const std::string& source() const { return source_; }

 private:
  std::istream& in_;
  std::string source_;
  int line_ = 1;
};

// After the '(' of a constituent: its label (possibly empty at the top), then a word or
// children. `tree_line` is where the tree began, which errors name; `depth` counts the
// brackets open around this one (0 at the top).
TreeNode read_constituent(Tokenizer& tokens, int tree_line, bool is_top, int depth = 0) {
  if (depth > kMaxTreeDepth) {
    THPC_FAIL(tokens.source() << ":" << tree_line << ": tree nested deeper than "
                              << kMaxTreeDepth << " levels");
  }
  TreeNode node;
  Token token = tokens.next();
  if (token.kind == Token::kAtom) {
    node.label = token.text;
    token = tokens.next();
  } else if (!is_top) {
    // PTB files start every tree with an unlabelled bracket: one below the top means
    // the previous tree was never closed.
    THPC_FAIL(tokens.source() << ":" << tree_line << ": unbalanced tree: still open at line "
                              << token.line << ", where an unlabelled bracket starts the next");
  }
  bool has_word = false;
  for (;; token = tokens.next()) {
    switch (token.kind) {
      case Token::kEnd:
        THPC_FAIL(tokens.source() << ":" << tree_line
                                  << ": unbalanced tree: still open at the end of the file");
      case Token::kClose:
        if (!has_word && node.children.empty()) {
          THPC_FAIL(tokens.source() << ":" << token.line << ": empty constituent '("
                                    << node.label << ")'");
        }
        return node;
      case Token::kAtom:
        if (has_word || !node.children.empty() || node.label.empty()) {
          THPC_FAIL(tokens.source() << ":" << token.line << ": stray text " << quoted(token.text)
                                    << " inside constituent " << quoted("(" + node.label));
        }
        node.word = token.text;
        has_word = true;
        break;
      case Token::kOpen:
        if (has_word) {
          THPC_FAIL(tokens.source() << ":" << token.line << ": pre-terminal '(" << node.label
                                    << " " << node.word << "' has a constituent inside");
        }
        node.children.push_back(read_constituent(tokens, tree_line, false, depth + 1));
        break;
    }
  }
}

TreeNode make_preterminal(const std::string& tag, const std::string& word) {
  TreeNode leaf;
  leaf.label = tag;
  leaf.word = word;
  return leaf;
}

void collect(const TreeNode& node, bool want_words, std::vector<std::string>& out) {
  if (node.is_preterminal()) {
    out.push_back(want_words ? node.word : node.label);
    return;
  }
  for (const TreeNode& child : node.children) collect(child, want_words, out);
}

void write_bracketed(const TreeNode& node, std::string& out) {
  out += "(" + node.label + " ";
  if (node.is_preterminal()) {
    out += node.word;
  } else {
    for (size_t i = 0; i < node.children.size(); ++i) {
      if (i > 0) out += " ";
      write_bracketed(node.children[i], out);
    }
  }
  out += ")";
}

void write_linearized(const TreeNode& node, TreeLeaves leaves, std::string& out) {
  if (node.is_preterminal()) {
    out += leaves == TreeLeaves::kWords ? node.word : std::string(kWordPlaceholder);
    return;
  }
  out += "(" + node.label;
  for (const TreeNode& child : node.children) {
    out += " ";
    write_linearized(child, leaves, out);
  }
  out += " )";
}

// A constituent under construction by delinearize: children are built bottom-up and an
// empty one (no word inside) is dropped when it closes. False when it was dropped.
bool close_into(std::vector<TreeNode>& stack) {
  TreeNode done = std::move(stack.back());
  stack.pop_back();
  if (done.children.empty()) return false;
  stack.back().children.push_back(std::move(done));
  return true;
}

}  // namespace

std::vector<TreeNode> read_ptb_trees(std::istream& in, const std::string& source_name) {
  // A byte order mark (an editor on Windows) is no text between trees: it was refused as
  // "stray text '\xEF\xBB\xBF'", which prints as nothing. Skipped, as SentencePiece's
  // inputs and the config's skip it.
  if (in.peek() == 0xEF) {
    char mark[3] = {};
    in.read(mark, 3);
    const std::streamsize got = in.gcount();
    if (got != 3 || std::string(mark, 3) != "\xEF\xBB\xBF") {
      in.clear();  // (a short read set failbit, under which putback does nothing)
      for (std::streamsize i = got; i > 0; --i) in.putback(mark[i - 1]);
    }
  }
  Tokenizer tokens(in, source_name);
  std::vector<TreeNode> trees;
  for (Token token = tokens.next(); token.kind != Token::kEnd; token = tokens.next()) {
    if (token.kind == Token::kAtom) {
      // (quoted: bytes that are no text, a damaged mark say, as \xNN rather than raw)
      THPC_FAIL(source_name << ":" << token.line << ": stray text " << quoted(token.text)
                            << " between trees");
    }
    if (token.kind == Token::kClose) {
      THPC_FAIL(source_name << ":" << token.line << ": unbalanced tree: ')' without '('");
    }
    TreeNode outer = read_constituent(tokens, token.line, true);
    // A root labelled ROOT (the Stanford tools' trees) or TOP (the .gold files' own) over
    // one child is the PTB's unlabelled outer bracket by another name: a ROOT kept was a
    // bracket every parse matched (a treebank of them scored 63.33 where 58.17 was right),
    // a TOP one the model learned to no use (COLLINS.prm deletes TOP).
    const bool named_outer = (outer.label == "ROOT" || outer.label == "TOP") &&
                             outer.children.size() == 1;
    if (!outer.label.empty() && !named_outer) {
      trees.push_back(std::move(outer));
    } else if (outer.children.size() == 1) {
      trees.push_back(std::move(outer.children.front()));
    } else {
      THPC_FAIL(source_name << ":" << token.line << ": the outer bracket holds "
                            << outer.children.size() << " constituents; expected one");
    }
  }
  return trees;
}

std::string canonical_label(const std::string& label) {
  // Cut at a leading '-' or '|' the label would be empty, and linearize would write an
  // unlabeled bracket that delinearize reads back as X: such a label is kept whole.
  if (label.empty() || label[0] == '-' || label[0] == '|') return label;
  std::string result = label.substr(0, label.find('|'));
  const size_t cut = result.find_first_of("-=");
  if (cut != std::string::npos && cut > 0) result.resize(cut);
  return result;
}

bool normalize_tree(const TreeNode& tree, TreeNode* normalized) {
  if (tree.is_preterminal()) {
    if (tree.label == "-NONE-") return false;
    *normalized = tree;
    return true;
  }
  TreeNode result;
  result.label = canonical_label(tree.label);
  for (const TreeNode& child : tree.children) {
    TreeNode kept;
    if (normalize_tree(child, &kept)) result.children.push_back(std::move(kept));
  }
  if (result.children.empty()) return false;
  *normalized = std::move(result);
  return true;
}

std::vector<std::string> words_of(const TreeNode& tree) {
  std::vector<std::string> words;
  collect(tree, true, words);
  return words;
}

std::vector<std::string> tags_of(const TreeNode& tree) {
  std::vector<std::string> tags;
  collect(tree, false, tags);
  return tags;
}

std::string to_evalb_line(const TreeNode& tree) {
  std::string out = "(TOP ";
  write_bracketed(tree, out);
  out += ")";
  return out;
}

std::vector<std::string> punctuation_tags(const std::vector<std::string>& words) {
  // The PTB's spellings, then other scripts' quotes and stops as a treebank converted to
  // its tags writes them (whichever quote tag: COLLINS.prm deletes both; full-width forms
  // and "…" are NFKC's ASCII ones already in a SentencePiece model's text).
  static const std::pair<const char*, const char*> kTags[] = {
      {",", ","},  {".", "."},   {"?", "."},    {"!", "."},     {":", ":"},   {";", ":"},
      {"--", ":"}, {"-", ":"},   {"...", ":"},  {"``", "``"},   {"`", "``"},  {"''", "''"},
      {"\u201e", "``"}, {"\u201c", "``"}, {"\u201d", "''"}, {"\u00ab", "``"},
      {"\u00bb", "''"}, {"\u2039", "``"}, {"\u203a", "''"}, {"\u2018", "``"},
      {"\u3002", "."},  {"\u3001", ","},  {"\u2014", ":"},  {"\u2013", ":"},
      {"\u201a", "``"}, {"\"", "''"}};
  std::vector<std::string> tags(words.size(), kWordPlaceholder);
  for (size_t i = 0; i < words.size(); ++i) {
    for (const auto& [punctuation, tag] : kTags) {
      if (words[i] == punctuation) tags[i] = tag;
    }
  }
  bool single_quote_open = false;  // a ` (or ‘) not yet closed
  for (size_t i = 0; i < words.size(); ++i) {
    if (words[i] == "`" || words[i] == "\u2018") single_quote_open = true;
    if (words[i] != "'" && words[i] != "\u2019") continue;  // ' or ’
    const bool after_punctuation = i > 0 && tags[i - 1] != kWordPlaceholder;
    const bool before_double_quote =
        i + 1 < words.size() && (words[i + 1] == "''" || words[i + 1] == "\u201d");
    if (single_quote_open || after_punctuation || before_double_quote) {
      tags[i] = "''";
      single_quote_open = false;
    }
  }
  return tags;
}

TreeLeaves tree_leaves_from_name(const std::string& name) {
  if (name == kWordPlaceholder) return TreeLeaves::kPlaceholder;
  if (name == "words") return TreeLeaves::kWords;
  THPC_FAIL("tree leaves '" << name << "': expected " << kWordPlaceholder << " or words");
}

std::string linearize(const TreeNode& tree, TreeLeaves leaves) {
  std::string out;
  write_linearized(tree, leaves, out);
  return out;
}

namespace {

// The sequence's tokens: split at whitespace, and each cut again before every '(' or ')'
// after its first character (`(S(NP` -> `(S` `(NP`, `XX)` -> `XX` `)`), so that no
// bracket is read as part of a label or a word; `*cut` says whether any was.
std::vector<std::string> bracket_tokens(const std::string& sequence, bool* cut) {
  std::vector<std::string> tokens;
  std::istringstream words(sequence);
  std::string word;
  while (words >> word) {
    size_t start = 0;
    for (size_t i = 1; i < word.size(); ++i) {
      if (word[i] == '(' || word[i] == ')') {
        tokens.push_back(word.substr(start, i - start));
        start = i;
        *cut = true;
      }
    }
    tokens.push_back(word.substr(start));
  }
  return tokens;
}

}  // namespace

Delinearized delinearize(const std::string& sequence, const std::vector<std::string>& words,
                         const std::vector<std::string>& tags) {
  THPC_CHECK(!words.empty() && words.size() == tags.size(),
             "delinearize needs words and as many tags: " << words.size() << " words, "
                                                          << tags.size() << " tags");
  Delinearized result;
  bool repaired = false;
  bool opened_any = false;
  // stack[0] is a virtual root that collects the top level.
  std::vector<TreeNode> stack(1);
  int dropped_open = 0;  // opened beyond kMaxTreeDepth and not yet closed
  size_t next_word = 0;
  for (const std::string& token : bracket_tokens(sequence, &repaired)) {
    if (token[0] == '(' && (dropped_open > 0 || stack.size() > kMaxTreeDepth)) {
      ++dropped_open;
      repaired = true;
    } else if (token[0] == ')' && dropped_open > 0) {
      --dropped_open;
    } else if (token[0] == '(') {
      TreeNode opened;
      opened.label = token.size() > 1 ? token.substr(1) : "X";
      if (token.size() == 1) repaired = true;
      stack.push_back(std::move(opened));
      opened_any = true;
    } else if (token[0] == ')') {
      if (stack.size() > 1) {
        if (!close_into(stack)) repaired = true;
      } else {
        repaired = true;
      }
    } else if (next_word < words.size()) {
      if (token != kWordPlaceholder && token != words[next_word]) result.other_words = true;
      stack.back().children.push_back(make_preterminal(tags[next_word], words[next_word]));
      ++next_word;
    } else {
      repaired = true;
    }
  }
  // One word and one slot, no bracket: what linearize writes for a tree whose root is a
  // pre-terminal ("(TOP (NN Yes))" -> "XX"), the one tree without a constituent. Read
  // back as that tree (before: the baseline's (S (NN Yes)), a bracket the gold lacks).
  if (!opened_any && !repaired && words.size() == 1 && next_word == 1) {
    result.tree = stack.front().children.front();
    return result;
  }
  if (!opened_any) {
    result.tree = right_branching_tree(words, tags);
    result.how = Reconstruction::kBaseline;
    return result;
  }
  if (stack.size() > 1) repaired = true;
  while (stack.size() > 1) close_into(stack);  // rules 2 and 3
  std::vector<TreeNode>& top = stack.front().children;
  if (next_word < words.size()) {
    repaired = true;
    // Rule 4: leftover words become the last children of the root.
    std::vector<TreeNode>* root_children = &top;
    if (top.size() == 1 && !top.front().is_preterminal()) root_children = &top.front().children;
    for (; next_word < words.size(); ++next_word) {
      root_children->push_back(make_preterminal(tags[next_word], words[next_word]));
    }
  }
  if (top.size() == 1 && !top.front().is_preterminal()) {
    result.tree = std::move(top.front());
  } else {
    repaired = true;
    result.tree.label = "S";
    result.tree.children = std::move(top);
  }
  result.how = repaired ? Reconstruction::kRepaired : Reconstruction::kWellFormed;
  return result;
}

TreeNode right_branching_tree(const std::vector<std::string>& words,
                              const std::vector<std::string>& tags) {
  THPC_CHECK(!words.empty() && words.size() == tags.size(),
             "right_branching_tree needs words and as many tags");
  // Built from the right: the last two words share the innermost constituent.
  const size_t n = words.size();
  TreeNode inner;
  inner.label = "VP";
  inner.children.push_back(make_preterminal(tags[n - 1], words[n - 1]));
  for (size_t i = n - 1; i-- > 0;) {
    TreeNode outer;
    outer.label = i == 0 ? "S" : "VP";
    outer.children.push_back(make_preterminal(tags[i], words[i]));
    if (i == n - 2) {
      outer.children.push_back(std::move(inner.children.front()));
    } else {
      outer.children.push_back(std::move(inner));
    }
    inner = std::move(outer);
  }
  if (n == 1) inner.label = "S";
  return inner;
}

}  // namespace thpc::parse
