// Greedy decoding by full recomputation: at each step the decoder runs over the whole
// prefix and the most probable next token is appended. It is the reference that
// beam_search (decode/beam_search.h) with beam 1 and alpha 0 must equal
// (BeamSearch.BeamOneWithoutLengthPenaltyIsGreedyOnTheModel); the KV-cached
// CachedTransformerScorer is checked against the full-recomputation TransformerScorer
// there. The learning test uses it to check that a trained model really transduces.
#pragma once

#include <vector>

#include "data/batch.h"
#include "model/transformer.h"

namespace thpc {

// Output length limit, as the paper's decoding: max_len_a * |x| + max_len_b (§6.1:
// input length + 50), and never beyond the model's position table.
struct GreedyOptions {
  int max_len_a = 1;
  int max_len_b = 50;
};

// Translates `sources` (token ids without eos); returns each hypothesis without bos/eos.
std::vector<TokenSequence> greedy_decode(Transformer& model,
                                         const std::vector<TokenSequence>& sources,
                                         const SpecialIds& ids, const GreedyOptions& options = {});

}  // namespace thpc
