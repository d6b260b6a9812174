#include "decode/tree_filter.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>

#include "common/error.h"
#include "parse/tree.h"

namespace thpc {

namespace {
const std::string kWordMarker = "\xe2\x96\x81";  // SentencePiece's "▁"
}  // namespace

bool begins_word(const std::string& piece) {
  return piece.compare(0, kWordMarker.size(), kWordMarker) == 0;
}

std::vector<std::string> tree_words(const TokenSequence& tokens,
                                    const std::vector<std::string>& pieces) {
  TokenSequence known;
  for (const int32_t id : tokens) {
    if (id >= 0 && static_cast<size_t>(id) < pieces.size()) known.push_back(id);
  }
  // Cut as source_words cuts (one rule for both); a word's text without the leading "▁".
  std::vector<std::string> words;
  for (const TokenSequence& word : source_words(known, pieces)) {
    std::string text;
    for (const int32_t id : word) text += pieces[id];
    words.push_back(begins_word(text) ? text.substr(kWordMarker.size()) : text);
  }
  return words;
}

std::string sequence_with_word_slots(const TokenSequence& tokens,
                                     const std::vector<std::string>& pieces) {
  std::string sequence;
  for (const std::string& word : tree_words(tokens, pieces)) {
    sequence += (sequence.empty() ? "" : " ") +
                (is_bracket_word(word) ? word : std::string(parse::kWordPlaceholder));
  }
  return sequence;
}

std::vector<TokenSequence> source_words(const TokenSequence& source,
                                        const std::vector<std::string>& pieces) {
  std::vector<TokenSequence> words;
  for (size_t k = 0; k < source.size(); ++k) {
    const int32_t id = source[k];
    THPC_CHECK(id >= 0 && static_cast<size_t>(id) < pieces.size(),
               "token " << id << " outside the vocabulary of " << pieces.size());
    if (k == 0 || begins_word(pieces[id])) words.emplace_back();
    words.back().push_back(id);
  }
  return words;
}

void TreeTokenFilter::classify(const std::vector<std::string>& pieces, int eos_id,
                               bool placeholder) {
  THPC_CHECK(eos_id >= 0 && eos_id < static_cast<int>(pieces.size()),
             "eos id " << eos_id << " outside the vocabulary of " << pieces.size());
  kind_.assign(pieces.size(), Kind::kOther);
  bracket_text_.assign(pieces.size(), std::string());
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
      bracket_text_[id] = ")";
    } else if (placeholder && piece == word_piece) {
      kind_[id] = Kind::kWord;
      word = true;
    } else if (piece.size() > open_prefix.size() &&
               piece.compare(0, open_prefix.size(), open_prefix) == 0) {
      kind_[id] = Kind::kOpen;
      open = true;
      bracket_text_[id] = piece.substr(kWordMarker.size());
    }
  }
  if (!open || !close || (placeholder && !word)) {
    const char* missing =
        !open ? "'▁(LABEL' opening bracket" : !close ? "'▁)' piece" : "'▁XX' piece";
    THPC_FAIL("the vocabulary has no " << missing
              << ": not a parser's (transformer_preprocess --user-symbols keeps the bracket "
              << (placeholder ? "tokens and XX whole)" : "tokens whole)"));
  }
}

TreeTokenFilter::TreeTokenFilter(const std::vector<std::string>& pieces, int eos_id,
                                 std::vector<int> words_per_source)
    : words_per_source_(std::move(words_per_source)) {
  classify(pieces, eos_id, /*placeholder=*/true);
}

TreeTokenFilter::TreeTokenFilter(const std::vector<std::string>& pieces, const SpecialIds& ids,
                                 std::vector<TokenSequence> source_pieces,
                                 size_t sentence_offset,
                                 const std::vector<std::vector<int>>& pieces_per_word)
    : source_pieces_(std::move(source_pieces)), copy_words_(true) {
  classify(pieces, ids.eos, /*placeholder=*/false);
  for (const int never : {ids.pad, ids.bos}) {
    THPC_CHECK(never >= 0 && never < static_cast<int>(pieces.size()),
               "special id " << never << " outside the vocabulary of " << pieces.size());
    kind_[never] = Kind::kNever;
  }
  THPC_CHECK(pieces_per_word.empty() || pieces_per_word.size() == source_pieces_.size(),
             pieces_per_word.size() << " word splits for " << source_pieces_.size()
                                    << " sources");
  word_starts_.resize(source_pieces_.size());
  for (size_t s = 0; s < source_pieces_.size(); ++s) {
    for (const int32_t id : source_pieces_[s]) {
      THPC_CHECK(id >= 0 && id < static_cast<int>(kind_.size()),
                 "source " << s << ": token " << id << " outside the vocabulary of "
                           << kind_.size());
      if (kind_[id] != Kind::kOther) {
        THPC_FAIL("sentence " << sentence_offset + s + 1 << " of the input holds the piece '"
                  << pieces[id]
                  << "' (a bracket, pad, bos or eos): its words cannot be the tree's words");
      }
    }
    std::vector<char>& starts = word_starts_[s];
    const TokenSequence& source = source_pieces_[s];
    if (!pieces_per_word.empty() && !pieces_per_word[s].empty()) {
      starts.assign(source.size(), 0);
      size_t at = 0;
      for (const int count : pieces_per_word[s]) {
        THPC_CHECK(count >= 1 && at + count <= source.size(),
                   "source " << s << ": its words' piece counts exceed its " << source.size()
                             << " pieces");
        starts[at] = 1;
        at += count;
      }
      THPC_CHECK(at == source.size(), "source " << s << ": its words' piece counts sum to "
                                                << at << ", not its " << source.size());
    } else {
      starts.resize(source.size());
      for (size_t k = 0; k < source.size(); ++k) {
        starts[k] = k == 0 || begins_word(pieces[source[k]]);
      }
    }
  }
}

void TreeTokenFilter::allowed_next(int source, const TokenSequence& prefix, int max_len,
                                   std::vector<char>& allowed) const {
  const int sources = static_cast<int>(copy_words_ ? source_pieces_.size()
                                                   : words_per_source_.size());
  THPC_CHECK(source >= 0 && source < sources, "source " << source << " of " << sources);
  // Word tokens to place: placeholders, or in word mode the source's pieces.
  const int words = copy_words_ ? static_cast<int>(source_pieces_[source].size())
                                : words_per_source_[source];
  // The prefix as a tree under construction: open constituents, and whether each holds a
  // word yet (a word token fills every open constituent at once, so those without one
  // are the innermost `empty` ones).
  int depth = 0, placed = 0, empty = 0;
  bool opened = false;
  for (const int32_t token : prefix) {
    const Kind kind = token >= 0 && token < static_cast<int>(kind_.size()) ? kind_[token]
                                                                           : Kind::kEos;
    switch (kind) {
      case Kind::kOpen: ++depth; ++empty; opened = true; break;
      case Kind::kClose: --depth; if (empty > 0) --empty; break;
      case Kind::kWord: case Kind::kOther: ++placed; empty = 0; break;
      default: break;  // eos, pad, bos: the filter never allows them inside a prefix
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
  // Brackets go between words: in word mode not inside a word's pieces.
  const bool at_word_boundary =
      !copy_words_ || placed == words || word_starts_[source][placed];
  // Tokens still needed after this one to finish: the words left, a close per open
  // constituent, eos. An opening bracket adds itself and its close.
  const int length = static_cast<int>(prefix.size());
  const int needed = (words - placed) + depth + 1;
  if (placed < words) {
    if (copy_words_) {
      allowed[source_pieces_[source][placed]] = 1;
    } else {
      allow(Kind::kWord);
    }
  }
  if (placed < words && at_word_boundary && depth < kMaxDecodedTreeDepth &&
      length + 1 + needed + 1 <= max_len) {
    allow(Kind::kOpen);
  }
  if (at_word_boundary && empty == 0 && !(depth == 1 && placed < words)) allow(Kind::kClose);
}

int TreeTokenFilter::shortest_tree(int source) const {
  const int sources = static_cast<int>(copy_words_ ? source_pieces_.size()
                                                   : words_per_source_.size());
  THPC_CHECK(source >= 0 && source < sources, "source " << source << " of " << sources);
  const int words = copy_words_ ? static_cast<int>(source_pieces_[source].size())
                                : words_per_source_[source];
  return words <= 0 ? 1 : words + 3;  // (nothing to parse: eos alone)
}

std::string TreeTokenFilter::text_with_words(int source, const TokenSequence& tokens,
                                             const std::vector<std::string>& words) const {
  THPC_CHECK(copy_words_, "text_with_words is for trees whose leaves are the words");
  THPC_CHECK(source >= 0 && source < static_cast<int>(source_pieces_.size()),
             "source " << source << " of " << source_pieces_.size());
  // The word of each source piece.
  const TokenSequence& pieces = source_pieces_[source];
  std::vector<int> word_of(pieces.size());
  int word = -1;
  for (size_t k = 0; k < pieces.size(); ++k) {
    word += word_starts_[source][k];
    word_of[k] = word;
  }
  if (word + 1 != static_cast<int>(words.size())) return "";
  std::string text;
  size_t placed = 0;  // the source pieces placed so far (the filter placed them in order)
  for (const int32_t id : tokens) {
    const bool known = id >= 0 && id < static_cast<int>(kind_.size());
    std::string item;
    if (known && (kind_[id] == Kind::kOpen || kind_[id] == Kind::kClose)) {
      item = bracket_text_[id];
    } else if (known && kind_[id] == Kind::kOther && placed < pieces.size() &&
               pieces[placed] == id) {
      // A word's first piece writes the whole word; its other pieces nothing.
      if (placed == 0 || word_of[placed] != word_of[placed - 1]) item = words[word_of[placed]];
      ++placed;
    } else {
      return "";  // not a hypothesis of this filter's (a search without it)
    }
    if (!item.empty()) text += (text.empty() ? "" : " ") + item;
  }
  return text;
}

void TreeTokenFilter::rescore(int source, const TokenSequence& prefix, float* log_probs) const {
  if (!copy_words_) return;
  int placed = 0;
  for (const int32_t token : prefix) {
    if (token >= 0 && token < static_cast<int>(kind_.size()) && kind_[token] == Kind::kOther) {
      ++placed;
    }
  }
  const TokenSequence& pieces = source_pieces_[source];
  if (placed >= static_cast<int>(pieces.size())) return;
  const int32_t next = pieces[placed];
  if (!word_starts_[source][placed]) {  // inside a word: the next piece is forced, free
    log_probs[next] = 0.0f;
    return;
  }
  // At a word boundary the choice is bracket, eos or "the next word": that last one's
  // probability is that of any word piece, whichever (the words are given, not chosen);
  // max-shifted log-sum-exp, in double.
  double top = -1e30;
  for (size_t id = 0; id < kind_.size(); ++id) {
    if (kind_[id] == Kind::kOther) top = std::max(top, static_cast<double>(log_probs[id]));
  }
  double sum = 0;
  for (size_t id = 0; id < kind_.size(); ++id) {
    if (kind_[id] == Kind::kOther) sum += std::exp(log_probs[id] - top);
  }
  log_probs[next] = static_cast<float>(std::min(0.0, top + std::log(sum)));
}

}  // namespace thpc
