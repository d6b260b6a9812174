// Constrained decoding for the parsing mode: only sequences that are well-formed
// linearized trees over exactly the input's words (src/parse/tree.h has the format).
//
// A model of a few CPU minutes writes plausible trees of the wrong size; the repair rule
// then attaches or drops words. With this filter every finished hypothesis is a tree the
// sentence fills: one root, every constituent holding at least one word, as many word
// tokens as input words, within the length limit. What the model chooses is only which
// well-formed tree.
#pragma once

#include <string>
#include <vector>

#include "decode/beam_search.h"

namespace thpc {

class TreeTokenFilter final : public NextTokenFilter {
 public:
  // Trees whose words are the placeholder (parse/tree.h's linearization): as many "▁XX"
  // tokens as the source sentence has words. pieces: the vocabulary's pieces by id
  // (SentencePiece's IdToPiece); opening brackets are the pieces "▁(LABEL", the closing
  // bracket "▁)". words_per_source: each source sentence's word count. Throws when the
  // vocabulary has no "▁)" or "▁XX" or no opening bracket.
  TreeTokenFilter(const std::vector<std::string>& pieces, int eos_id,
                  std::vector<int> words_per_source);

  // Trees whose words are the sentence's own words (`transformer_trees linearize
  // --leaves words`): the word pieces are exactly the source's pieces, in order (the
  // source and target share one SentencePiece model, and its pieces never span a space,
  // so a word has the same pieces on both sides); a bracket only before a piece that
  // begins a word ("▁...") or after the last. rescore() then scores the choice to place
  // the next word, not which word (see there). ids: eos ends a tree, pad and bos are
  // never words. Throws when the vocabulary has no "▁)" or no opening bracket, or a
  // source holds a bracket piece, pad, bos, eos or an id outside it (naming the sentence
  // by its 1-based number in the input: sentence_offset + its index + 1, the offset of a
  // caller that holds a part of the input at a time). `pieces_per_word`, where given, is
  // each source's words' piece counts (one entry per input word, the source split so),
  // an empty list for a source to split at the "▁" pieces: brackets go only between the
  // input's words, where SentencePiece would split one (a character NFKC makes a space)
  // or a "▁" piece fall inside it.
  TreeTokenFilter(const std::vector<std::string>& pieces, const SpecialIds& ids,
                  std::vector<TokenSequence> source_pieces, size_t sentence_offset = 0,
                  const std::vector<std::vector<int>>& pieces_per_word = {});

  void allowed_next(int source, const TokenSequence& prefix, int max_len,
                    std::vector<char>& allowed) const override;
  // Word mode only (placeholders are left as they are). Every finished tree holds the same
  // words, so what the search should rank is the brackets given the words, not how well
  // the model predicts the words. At a word boundary the next word's log-probability
  // becomes that of placing any word, log Σ_{w a word piece} p(w) (a generative parser's
  // "shift"); a piece inside a word is forced and costs 0. Without this, a model that
  // does not yet predict the words well puts off every word behind more brackets (dev
  // F1 4.1 instead of 30.2 on the WSJ sample after 600 CPU steps).
  void rescore(int source, const TokenSequence& prefix, float* log_probs) const override;

  // The tokens of the shortest tree over source `source`'s words, eos counted: the root's
  // two brackets, the word tokens (placeholders, or the source's pieces) and eos. A length
  // limit below it leaves only unfinished trees.
  int shortest_tree(int source) const;
  // Whether the trees' leaves are the words themselves (else placeholders).
  bool copies_words() const { return copy_words_; }

  // Word mode: a hypothesis `tokens` of source `source` as text, its words `words` (the
  // input line's, as the constructor's pieces_per_word split the source) and its brackets
  // the pieces' "(LABEL" and ")": the words exactly as given, where SentencePiece's text
  // has a character its vocabulary lacks as " ⁇ " (a word with "~" or "é" became two, and
  // the tree's words shifted) or a character normalised. "" when the source's words are
  // not `words.size()` (the caller writes SentencePiece's text).
  std::string text_with_words(int source, const TokenSequence& tokens,
                              const std::vector<std::string>& words) const;

 private:
  // kOther: in word mode a word piece; kNever: pad and bos (word mode).
  enum class Kind : char { kOther, kOpen, kClose, kWord, kEos, kNever };
  // Sets kind_ (brackets and eos; the placeholder when `placeholder`) and checks them.
  void classify(const std::vector<std::string>& pieces, int eos_id, bool placeholder);

  std::vector<Kind> kind_;
  std::vector<int> words_per_source_;          // placeholder mode
  std::vector<TokenSequence> source_pieces_;   // word mode (copy_words_)
  std::vector<std::vector<char>> word_starts_;  // word mode: per source piece, a word's first
  std::vector<std::string> bracket_text_;      // "(LABEL" or ")" by id, "" for the rest
  bool copy_words_ = false;
};

// Whether a SentencePiece piece begins with "▁": the first piece of a word (a model with
// the dummy prefix writes one before every word; without it, before every word but the
// line's first).
bool begins_word(const std::string& piece);

// A source's pieces cut into its words as the word-mode filter cuts them without
// pieces_per_word: a word begins at the first piece and at each that begins_word.
// `pieces`: the vocabulary's pieces by id, every id of `source` within them.
std::vector<TokenSequence> source_words(const TokenSequence& source,
                                        const std::vector<std::string>& pieces);

// The text of each word of a linearized tree's pieces (a hypothesis of the filter, or a
// parser's target), cut as source_words cuts: its pieces' text, the leading "▁" left out
// ("(NP", ")", "Dep" + "ending"). Ids outside `pieces` are skipped.
std::vector<std::string> tree_words(const TokenSequence& tokens,
                                    const std::vector<std::string>& pieces);

// Whether a tree_words word is a bracket: "(LABEL" or ")" (a label the vocabulary holds as
// one piece, or one it splits).
inline bool is_bracket_word(const std::string& word) {
  return !word.empty() && (word[0] == '(' || word[0] == ')');
}

// A hypothesis of the filter as the sequence parse::delinearize reads, its words left to
// the caller: each bracket word as its text, every other word as one XX (a slot the
// caller's words fill: the source's, whose pieces a word-mode hypothesis copies).
std::string sequence_with_word_slots(const TokenSequence& tokens,
                                     const std::vector<std::string>& pieces);

// The deepest nesting the filter lets a hypothesis open (the trees of the treebank
// sample nest at most 36 deep).
inline constexpr int kMaxDecodedTreeDepth = 100;

}  // namespace thpc
