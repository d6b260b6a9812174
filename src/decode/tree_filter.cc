#include "decode/tree_filter.h"

#include <string>
#include <utility>

#include "common/error.h"
#include "parse/tree.h"

namespace thpc {

namespace {
const std::string kWordMarker = "\xe2\x96\x81";  // SentencePiece's "▁"
}  // namespace

TreeTokenFilter::TreeTokenFilter(const std::vector<std::string>& pieces, int eos_id,
                                 std::vector<int> words_per_source)
    : kind_(pieces.size(), Kind::kOther), words_per_source_(std::move(words_per_source)) {
  THPC_CHECK(eos_id >= 0 && eos_id < static_cast<int>(pieces.size()),
             "eos id " << eos_id << " outside the vocabulary of " << pieces.size());
  const std::string word_piece = kWordMarker + parse::kWordPlaceholder;
  const std::string close_piece = kWordMarker + ")";
  const std::string open_prefix = kWordMarker + "(";  // followed by the label
  bool open = false, close = false, word = false;
  for (size_t id = 0; id < pieces.size(); ++id) {
    const std::string& piece = pieces[id];
    if (static_cast<int>(id) == eos_id) {
      kind_[id] = Kind::kEos;
    } else if (piece == close_piece) {
      kind_[id] = Kind::kClose;
      close = true;
    } else if (piece == word_piece) {
      kind_[id] = Kind::kWord;
      word = true;
    } else if (piece.size() > open_prefix.size() &&
               piece.compare(0, open_prefix.size(), open_prefix) == 0) {
      kind_[id] = Kind::kOpen;
      open = true;
    }
  }
  if (!open || !close || !word) {
    const char* missing =
        !open ? "'▁(LABEL' opening bracket" : !close ? "'▁)' piece" : "'▁XX' piece";
    THPC_FAIL("the vocabulary has no " << missing
              << ": not a parser's (transformer_preprocess --user-symbols keeps the bracket "
                 "tokens and XX whole)");
  }
}

void TreeTokenFilter::allowed_next(int source, const TokenSequence& prefix, int max_len,
                                   std::vector<char>& allowed) const {
  THPC_CHECK(source >= 0 && source < static_cast<int>(words_per_source_.size()),
             "source " << source << " of " << words_per_source_.size());
  const int words = words_per_source_[source];
  // The prefix as a tree under construction: open constituents, and whether each holds a
  // word yet (a word token fills every open constituent at once, so those without one
  // are the innermost `empty` ones).
  int depth = 0, placed = 0, empty = 0;
  bool opened = false;
  for (const int32_t token : prefix) {
    switch (token >= 0 && token < static_cast<int>(kind_.size()) ? kind_[token] : Kind::kOther) {
      case Kind::kOpen: ++depth; ++empty; opened = true; break;
      case Kind::kClose: --depth; if (empty > 0) --empty; break;
      case Kind::kWord: ++placed; empty = 0; break;
      default: break;  // the filter never allows these; a prefix has none
    }
  }
  allowed.assign(kind_.size(), 0);
  auto allow = [&](Kind kind) {
    for (size_t id = 0; id < kind_.size(); ++id) {
      if (kind_[id] == kind) allowed[id] = 1;
    }
  };
  if (words <= 0) {  // nothing to parse: end at once
    allow(Kind::kEos);
    return;
  }
  if (depth == 0) {
    allow(opened ? Kind::kEos : Kind::kOpen);  // one root, then the end
    return;
  }
  // Tokens still needed after this one to finish: the words left, a close per open
  // constituent, eos. An opening bracket adds itself and its close.
  const int length = static_cast<int>(prefix.size());
  const int needed = (words - placed) + depth + 1;
  if (placed < words) allow(Kind::kWord);
  if (placed < words && depth < kMaxDecodedTreeDepth && length + 1 + needed + 1 <= max_len) {
    allow(Kind::kOpen);
  }
  if (empty == 0 && !(depth == 1 && placed < words)) allow(Kind::kClose);
}

}  // namespace thpc
