// Translating many sentences, as transformer_decode does: the sentences sorted by length
// into batches of at most a padded-token budget, each batch searched by beam_search with
// the KV-cached scorer of one model, or of an ensemble (decode/ensemble.h), or sampled
// (decode/sampling.h). Shared by transformer_decode (which spreads the batches over CPU
// workers) and the trainer's validation BLEU, so that both produce the same translations
// from the same parameters.
#pragma once

#include <cstddef>
#include <vector>

#include "config/config.h"
#include "decode/beam_search.h"
#include "decode/sampling.h"

namespace thpc {

// A batch: the sentences it translates (indices into the caller's list) and the longest
// output any of them may have.
struct DecodeBatch {
  std::vector<size_t> members;
  int max_output = 0;
};

// The non-empty sources, longest first (so that similar lengths share a batch and
// padding stays small), cut into batches of at most `batch_tokens` padded source tokens.
// With several workers the budget shrinks so that each gets at least two batches, as far
// as the input allows: the last batches then finish together instead of one worker
// translating half the input alone. Sentences are translated independently of their
// batch (attention reads only a sentence's own keys), so the output does not depend on it.
std::vector<DecodeBatch> make_decode_batches(const std::vector<TokenSequence>& sources,
                                             const BeamOptions& options, int batch_tokens,
                                             int workers);

// Translates `batch`: the options.nbest best hypotheses of each member, written to
// results[member] (results has one entry per source).
void translate_batch(Transformer& model, const SpecialIds& ids,
                     const std::vector<TokenSequence>& sources, const DecodeBatch& batch,
                     const BeamOptions& options,
                     std::vector<std::vector<Hypothesis>>& results);

// The same with the models that decode together: one (its scorer ranks each
// hypothesis' best tokens on the backend), or an ensemble of several sharing a backend
// and a vocabulary, weighted by `weights` (empty: equally; see EnsembleScorer). With
// `sampling` the batch is sampled (sample_search, options.beam samples per sentence,
// each drawn by its index in `sources`) instead of searched.
void translate_batch(const std::vector<Transformer*>& models, const std::vector<float>& weights,
                     const SpecialIds& ids, const std::vector<TokenSequence>& sources,
                     const DecodeBatch& batch, const BeamOptions& options,
                     const SamplingOptions* sampling,
                     std::vector<std::vector<Hypothesis>>& results);

// The search transformer_decode runs without options on a checkpoint of a run configured
// by `config` (its [decode] section and position table), but with `beam` hypotheses;
// beam 1 is greedy decoding without length penalty, as transformer_decode --greedy.
BeamOptions configured_beam_options(const Config& config, int beam);

}  // namespace thpc
