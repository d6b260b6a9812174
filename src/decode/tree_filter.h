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
  // pieces: the vocabulary's pieces by id (SentencePiece's IdToPiece). Opening brackets
  // are the pieces "▁(LABEL", the closing bracket "▁)", the word token "▁XX" (tags or
  // words as word tokens are not recognised). words_per_source: each source sentence's
  // word count. Throws when the vocabulary has no "▁)" or "▁XX" or no opening bracket.
  TreeTokenFilter(const std::vector<std::string>& pieces, int eos_id,
                  std::vector<int> words_per_source);

  void allowed_next(int source, const TokenSequence& prefix, int max_len,
                    std::vector<char>& allowed) const override;

 private:
  enum class Kind : char { kOther, kOpen, kClose, kWord, kEos };
  std::vector<Kind> kind_;
  std::vector<int> words_per_source_;
};

// The deepest nesting the filter lets a hypothesis open (the trees of the treebank
// sample nest at most 36 deep).
inline constexpr int kMaxDecodedTreeDepth = 100;

}  // namespace thpc
