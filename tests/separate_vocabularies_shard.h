// A hand-made training shard of separate vocabularies (shard format 3) for the tests that
// train on one without a SentencePiece model: a source vocabulary of `source_vocab` (50)
// over the target's 30, `pairs` pairs of 3 to 8 ids, the source's spread over all of its
// non-special ids (most beyond the target's), no stored models. `source_vocab` 0: the
// same pairs' shard of one vocabulary of 30 (format 2), the source's ids within it.
#pragma once

#include <string>
#include <vector>

#include "data/shard_file.h"

namespace thpc {

inline constexpr int kSeparateSourceVocab = 50;
inline constexpr int kSeparateTargetVocab = 30;

inline void write_separate_vocabularies_shard(const std::string& path, int pairs = 96,
                                              int source_vocab = kSeparateSourceVocab) {
  ShardContents contents;
  contents.metadata.format_version =
      source_vocab > 0 ? kShardFormatVersion : kOneVocabularyShardFormatVersion;
  contents.metadata.vocab_size = kSeparateTargetVocab;
  contents.metadata.source_vocab_size = source_vocab;
  const int source_ids = source_vocab > 0 ? source_vocab : kSeparateTargetVocab;
  contents.metadata.source_lang = "xx";
  contents.metadata.target_lang = "yy";
  for (int pair = 0; pair < pairs; ++pair) {
    std::vector<int> source, target;
    for (int token = 0; token < 3 + pair % 6; ++token) {
      source.push_back(4 + (7 * pair + 3 * token) % (source_ids - 4));
      target.push_back(4 + (5 * pair + token) % (kSeparateTargetVocab - 4));
    }
    contents.source.append(source);
    contents.target.append(target);
  }
  write_shard(path, contents);
}

}  // namespace thpc
