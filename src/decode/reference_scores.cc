#include "decode/reference_scores.h"

#include <algorithm>

#include "common/error.h"
#include "decode/ensemble.h"

namespace thpc {
namespace {

// A pair's padded length: the longer of its sides, each with its eos.
size_t pair_length(const TokenSequence& source, const TokenSequence& reference) {
  return std::max(source.size(), reference.size()) + 1;
}

}  // namespace

std::vector<DecodeBatch> make_scoring_batches(const std::vector<TokenSequence>& sources,
                                              const std::vector<TokenSequence>& references,
                                              const std::vector<char>& scored, int batch_tokens,
                                              int workers, int batch_sentences,
                                              int cut_at_length_after) {
  THPC_CHECK(sources.size() == references.size() && scored.size() == sources.size(),
             sources.size() << " sources, " << references.size() << " references, "
                            << scored.size() << " flags");
  std::vector<size_t> lengths(sources.size(), 0);  // 0: not scored, in no batch
  for (size_t i = 0; i < sources.size(); ++i) {
    if (scored[i]) lengths[i] = pair_length(sources[i], references[i]);
  }
  return batches_by_length(lengths, batch_tokens, workers, batch_sentences, cut_at_length_after);
}

void score_batch(const std::vector<Transformer*>& models, const std::vector<float>& weights,
                 const SpecialIds& ids, const std::vector<TokenSequence>& sources,
                 const std::vector<TokenSequence>& references, const DecodeBatch& batch,
                 std::vector<double>& scores, std::vector<std::vector<float>>* piece_scores) {
  THPC_CHECK(!models.empty(), "scoring with no model");
  std::vector<TokenSequence> batch_sources, batch_references;
  for (const size_t i : batch.members) {
    batch_sources.push_back(sources[i]);
    batch_references.push_back(references[i]);
  }
  const Batch pairs = make_batch(batch_sources, batch_references, ids);
  std::vector<std::vector<float>> pieces, model_pieces;
  const auto into = [&](std::vector<std::vector<float>>& kept) {
    return piece_scores != nullptr ? &kept : nullptr;
  };
  // One model's scores as they are (an ensemble of one would multiply them by 1.0f).
  std::vector<double> combined;
  if (models.size() == 1) {
    combined = models[0]->target_log_probs(pairs, into(pieces));
  } else {
    const std::vector<float> w =
        ensemble_weights(models.size(), std::vector<double>(weights.begin(), weights.end()));
    combined.assign(batch.members.size(), 0.0);
    if (piece_scores != nullptr) pieces.assign(batch.members.size(), {});
    for (size_t m = 0; m < models.size(); ++m) {
      const std::vector<double> one = models[m]->target_log_probs(pairs, into(model_pieces));
      for (size_t k = 0; k < one.size(); ++k) {
        combined[k] += double(w[m]) * one[k];
        if (piece_scores == nullptr) continue;
        pieces[k].resize(model_pieces[k].size(), 0.0f);
        for (size_t t = 0; t < model_pieces[k].size(); ++t) pieces[k][t] += w[m] * model_pieces[k][t];
      }
    }
  }
  for (size_t k = 0; k < batch.members.size(); ++k) {
    scores[batch.members[k]] = combined[k];
    if (piece_scores != nullptr) (*piece_scores)[batch.members[k]] = std::move(pieces[k]);
  }
}

}  // namespace thpc
