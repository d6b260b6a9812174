// A batch of sentence pairs as the model consumes it: right-padded token matrices plus
// per-sentence lengths, on the host. The model uploads it to its backend.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace thpc {

// The special token ids. Shards of the data issue carry their own; the synthetic tasks
// use these defaults (SentencePiece is trained with the same assignment).
struct SpecialIds {
  int pad = 0;
  int unk = 1;
  int bos = 2;
  int eos = 3;
};
inline bool operator==(const SpecialIds& a, const SpecialIds& b) {
  return a.pad == b.pad && a.unk == b.unk && a.bos == b.bos && a.eos == b.eos;
}
inline bool operator!=(const SpecialIds& a, const SpecialIds& b) { return !(a == b); }
// "0/1/2/3": pad/unk/bos/eos, as the messages that compare two vocabularies show them.
inline std::string special_ids_text(const SpecialIds& ids) {
  return std::to_string(ids.pad) + "/" + std::to_string(ids.unk) + "/" +
         std::to_string(ids.bos) + "/" + std::to_string(ids.eos);
}

using TokenSequence = std::vector<int32_t>;

struct Batch {
  int size = 0;     // sentences, B
  int src_len = 0;  // padded source length S (including the final eos)
  int tgt_len = 0;  // padded target length T (tgt_in: bos + y; tgt_out: y + eos)
  std::vector<int32_t> src;          // [B, S]: x, eos, pad...
  std::vector<int32_t> tgt_in;       // [B, T]: bos, y, pad...  (decoder input)
  std::vector<int32_t> tgt_out;      // [B, T]: y, eos, pad...  (what is predicted)
  std::vector<int32_t> src_lengths;  // |x| + 1
  std::vector<int32_t> tgt_lengths;  // |y| + 1

  int64_t src_tokens() const;  // non-pad source tokens
  int64_t tgt_tokens() const;  // non-pad target tokens (the loss is normalised by these)
};

// Pads a list of (source, target) pairs into a Batch: eos ends every source and every
// target, bos starts every decoder input.
Batch make_batch(const std::vector<TokenSequence>& sources,
                 const std::vector<TokenSequence>& targets, const SpecialIds& ids);

}  // namespace thpc
