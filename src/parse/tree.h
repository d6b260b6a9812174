// Constituency trees for the parsing mode (§6.3): Penn Treebank .mrg files in, the
// linearized target sequence the Transformer learns, and back.
//
// Normalisation (what the gold trees and the round trip are exact after):
//   - `-NONE-` empty elements are removed, and with them every constituent left empty;
//   - a constituent label keeps its first alternative and loses function tags and
//     indices: `PRT|ADVP` → `PRT`, `NP-SBJ-1` → `NP`, `S=2` → `S` (a label that starts
//     with '-' or '|' is kept whole: cut, nothing would be left); part-of-speech tags
//     (`-LRB-`, `PRP$`, `-NONE-`) are never changed;
//   - the outer unlabeled bracket `( (S ...) )` is dropped: the tree is its one child; so
//     is an outer `(ROOT ...)` or `(TOP ...)` holding one child (the Stanford tools' root,
//     which every parse would otherwise match; the .gold files' own, a bracket the model
//     would learn to no use: COLLINS.prm deletes TOP).
//
// Linearization: a constituent is `(LABEL`, its children, then `)` (closing brackets
// carry no label); every word, with its tag, is a leaf token, either
//   - the placeholder `XX` (TreeLeaves::kPlaceholder, Vinyals et al. 2015): the sequence
//     says nothing the input sentence does not and the word count equals the number of
//     `XX`. `(S (NP (DT The) (NN cat)) (VP (VBD sat)) (. .))` ↔ `(S (NP XX XX ) (VP XX ) XX )`;
//   - or the word itself (TreeLeaves::kWords): `(S (NP The cat ) (VP sat ) . )`. The
//     decoder then reads the words it has placed, so each bracket is chosen knowing the
//     words before it (a generative parser's view, as in Choe & Charniak 2016), instead
//     of the cross-attention having to count which input word the n-th `XX` is; with
//     constrained decoding (decode/tree_filter.h) the words are copied exactly. On the
//     WSJ sample after 600 CPU steps: dev F1 13.7 with `XX`, 30.2 with words (docs/parsing.md).
// A Penn Treebank word never starts with '(' or is ')' (the .mrg format cannot hold
// one: brackets are -LRB- and -RRB-), so a word never reads as a bracket.
// Together with the input words (and their tags) the sequence gives back the tree.
//
// Repair rule of delinearize (deterministic, applied to whatever the decoder wrote):
//   0. a token is cut before each '(' or ')' after its first character (`(S(NP`, `XX)`,
//      `(NP)`: a label or word never holds a bracket, and EVALB could not read it);
//   1. tokens are read left to right: `(LABEL` opens (an empty label becomes `X`),
//      `)` (or `)LABEL`, the label ignored) closes the innermost open constituent and is
//      dropped when none is open; every other token is a word slot and takes the next
//      input word, slots beyond the last word are dropped;
//   2. constituents still open at the end are closed there;
//   3. input words left without a slot are attached, in order, as the last children of
//      the root;
//   4. constituents that hold no word are removed;
//   5. the result is the single top-level constituent when there is exactly one; any
//      other top level (several constituents, or bare words) is put under one `S`.
//   A sequence without any `(LABEL` is not repaired but replaced by the right-branching
//   baseline tree of the sentence (both cases are counted by the tools), except one slot
//   for a one-word sentence: what linearize writes for a tree whose root is a
//   pre-terminal, read back as that tree.
//   An `(LABEL` that would open a constituent deeper than kMaxTreeDepth is dropped with
//   the `)` that closes it (repaired).
//
// Trees are at most kMaxTreeDepth constituents deep: the functions below recurse once per
// level, and a file of a million '(' must be an error, not a stack overflow. The Penn
// Treebank's deepest trees have a few dozen levels.
#pragma once

#include <istream>
#include <string>
#include <vector>

namespace thpc::parse {

// A constituent (label and children) or, when it has no children, a pre-terminal: the
// tag in `label` and the word in `word`.
struct TreeNode {
  std::string label;
  std::string word;
  std::vector<TreeNode> children;

  bool is_preterminal() const { return children.empty(); }
};

inline constexpr int kMaxTreeDepth = 1000;

// The placeholder a word becomes in the linearized sequence (TreeLeaves::kPlaceholder).
inline constexpr const char* kWordPlaceholder = "XX";

// What a word becomes in the linearized sequence (see above).
enum class TreeLeaves { kPlaceholder, kWords };

// "XX" → kPlaceholder, "words" → kWords; throws thpc::Error naming the text otherwise.
TreeLeaves tree_leaves_from_name(const std::string& name);

// Reads every tree of a .mrg file (trees span several lines). Throws thpc::Error
// "SOURCE:LINE: what is wrong" for an unbalanced tree, an empty one, text between
// trees, more than a word inside a pre-terminal or a tree deeper than kMaxTreeDepth.
std::vector<TreeNode> read_ptb_trees(std::istream& in, const std::string& source_name);

// `NP-SBJ-1` → `NP`, `PRT|ADVP` → `PRT`, `-LRB-` and `|P` unchanged.
std::string canonical_label(const std::string& label);

// The tree after the normalisation above; false when nothing is left (a tree of
// empty elements only).
bool normalize_tree(const TreeNode& tree, TreeNode* normalized);

std::vector<std::string> words_of(const TreeNode& tree);
std::vector<std::string> tags_of(const TreeNode& tree);

// One line, `(TOP (S (NP (DT The) (NN cat)) ...))`: the form EVALB reads (TOP is a
// DELETE_LABEL of COLLINS.prm).
std::string to_evalb_line(const TreeNode& tree);

// `(S (NP XX XX ) (VP XX ) XX )`, or with kWords `(S (NP The cat ) (VP sat ) . )`.
std::string linearize(const TreeNode& tree, TreeLeaves leaves = TreeLeaves::kPlaceholder);

enum class Reconstruction { kWellFormed, kRepaired, kBaseline };

struct Delinearized {
  TreeNode tree;
  Reconstruction how = Reconstruction::kWellFormed;
  // A word slot held a word other than the input word it took (neither it nor the
  // placeholder): a decoder that wrote the words changed some. The tree holds the input's.
  bool other_words = false;
};

// The tree a decoded sequence describes over `words` (tagged with `tags`, the same
// length), repaired by the rule above. Never throws on a bad sequence; needs >= 1 word.
Delinearized delinearize(const std::string& sequence, const std::vector<std::string>& words,
                         const std::vector<std::string>& tags);

// The part-of-speech tags the Penn Treebank gives a sentence's punctuation words whose
// tags COLLINS.prm deletes, the others tagged XX: `,` → `,`; `.` `?` `!` → `.`; `:` `;`
// `--` `-` `...` → `:`; `` ` `` and ` `` ` → ` `` `; `''` → `''`; and `'` → `''` where it
// closes a quote (after an unclosed `` ` ``, after one of those punctuation words, or
// before `''` or ”), else XX (a possessive: `investors '`, POS). Other scripts' quotes
// („ “ ” « » ‹ › ‘ ‚ ", and ’ as '), stops (。 as `.`, 、 as `,`) and dashes (— – as `:`) as a
// treebank converted to PTB tags has them. For scoring trees of words
// without their tags (training's validation F1): EVALB drops what it deletes by tag. On
// the WSJ sample it gives the treebank's tag to all but 1 of the 10,729 words tagged one
// of those five (a `Wa` tagged `,`), and tags no other word so.
std::vector<std::string> punctuation_tags(const std::vector<std::string>& words);

// The right-branching baseline: (S w1 (VP w2 (VP w3 ... (VP w_n-1 w_n)))), every word a
// pre-terminal with its tag. VP is the label that scores best on the dev split (labelled
// F1 17.3 against 12.9 with NP), so the parser is compared with the stronger baseline.
TreeNode right_branching_tree(const std::vector<std::string>& words,
                              const std::vector<std::string>& tags);

}  // namespace thpc::parse
