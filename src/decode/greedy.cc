#include "decode/greedy.h"

#include <algorithm>

namespace thpc {

std::vector<TokenSequence> greedy_decode(Transformer& model,
                                         const std::vector<TokenSequence>& sources,
                                         const SpecialIds& ids, const GreedyOptions& options) {
  const int B = static_cast<int>(sources.size());
  if (B == 0) return {};
  const int vocab = model.vocab_size();
  // The encoder needs only sources; make_batch wants targets, so give empty ones.
  const Batch batch = make_batch(sources, std::vector<TokenSequence>(B), ids);
  model.encode(batch);

  std::vector<int> limit(B);
  int longest_limit = 0;
  for (int b = 0; b < B; ++b) {
    // +1: the decoder input also holds bos.
    limit[b] = std::min(options.max_len_a * static_cast<int>(sources[b].size()) +
                            options.max_len_b,
                        model.config().max_positions - 1);
    longest_limit = std::max(longest_limit, limit[b]);
  }

  std::vector<TokenSequence> hypotheses(B);
  std::vector<bool> finished(B, false);
  for (int t = 0; t < longest_limit; ++t) {
    // Prefix matrix [B, t+1]: bos then the tokens chosen so far. Finished sentences
    // keep being fed (their output is ignored) so that every row has t+1 real tokens.
    const int T = t + 1;
    std::vector<int32_t> prefixes(static_cast<size_t>(B) * T, ids.pad);
    std::vector<int32_t> lengths(B, T);
    for (int b = 0; b < B; ++b) {
      prefixes[static_cast<size_t>(b) * T] = ids.bos;
      for (int i = 0; i < t; ++i) {
        const bool have = i < static_cast<int>(hypotheses[b].size());
        prefixes[static_cast<size_t>(b) * T + 1 + i] = have ? hypotheses[b][i] : ids.eos;
      }
    }
    const std::vector<float> log_probs = model.next_token_log_probs(prefixes, lengths, T);
    bool all_finished = true;
    for (int b = 0; b < B; ++b) {
      if (finished[b]) continue;
      const float* row = log_probs.data() + static_cast<size_t>(b) * vocab;
      // pad and bos are never generated (as in beam search).
      int best = -1;
      for (int token = 0; token < vocab; ++token) {
        if (token == ids.pad || token == ids.bos) continue;
        if (best < 0 || row[token] > row[best]) best = token;
      }
      if (best == ids.eos || t + 1 >= limit[b]) {
        finished[b] = true;
        if (best != ids.eos) hypotheses[b].push_back(best);
      } else {
        hypotheses[b].push_back(best);
        all_finished = false;
      }
    }
    if (all_finished) break;
  }
  return hypotheses;
}

}  // namespace thpc
