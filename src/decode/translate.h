// Translating many sentences, as transformer_decode does: the sentences sorted by length
// into batches of at most a padded-token budget, each batch searched by beam_search with
// the KV-cached scorer of one model, or of an ensemble (decode/ensemble.h), or sampled
// (decode/sampling.h). Shared by transformer_decode (which spreads the batches over CPU
// workers) and the trainer's validation BLEU, so that both produce the same translations
// from the same parameters.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "config/config.h"
#include "decode/beam_search.h"
#include "decode/sampling.h"

namespace sentencepiece {
class SentencePieceProcessor;
}

namespace thpc {

// A batch: the sentences it translates (indices into the caller's list) and the longest
// output any of them may have.
struct DecodeBatch {
  std::vector<size_t> members;
  int max_output = 0;
  // The number in the whole input of the caller's list's first sentence, where the caller
  // holds a part of the input at a time (transformer_decode --buffer-sentences): sampling
  // numbers a sentence's draws by sentence_offset + its index in the list.
  size_t sentence_offset = 0;
};

// Items i of lengths[i] > 0 (0: left out), longest first, cut into batches of at most
// `batch_tokens` padded tokens (each item padded to its batch's first, longest) and, when
// `batch_sentences` > 0, at most that many items; with several workers the budget shrinks
// so that each gets at least two batches where the items allow. With
// `cut_at_length_after` > 0 a batch that holds that many padded tokens also ends before a
// shorter item. make_decode_batches' and make_scoring_batches' (decode/reference_scores.h)
// batching.
std::vector<DecodeBatch> batches_by_length(const std::vector<size_t>& lengths, int batch_tokens,
                                           int workers, int batch_sentences = 0,
                                           int cut_at_length_after = 0);

// The non-empty sources, longest first (so that similar lengths share a batch and
// padding stays small), cut into batches of at most `batch_tokens` padded source tokens
// and, when `batch_sentences` > 0, at most that many sentences (fairseq's --batch-size,
// CTranslate2's batch_type "examples": a bound on a batch's hypotheses, whatever their
// length). With several workers the token budget shrinks so that each gets at least two
// batches, as far as the input allows: the last batches then finish together instead of
// one worker translating half the input alone. Sentences are translated independently of
// their batch (attention reads only a sentence's own keys), so the output does not depend
// on it.
std::vector<DecodeBatch> make_decode_batches(const std::vector<TokenSequence>& sources,
                                             const BeamOptions& options, int batch_tokens,
                                             int workers, int batch_sentences = 0);

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

// What a command line may change of the search a [decode] section configures
// (transformer_decode's --beam, --lenpen, --max-len-a, --max-len-b, --greedy, --nbest);
// an unset value is the section's own.
struct SearchOverrides {
  std::optional<int> beam;
  std::optional<float> alpha;
  std::optional<double> max_len_a;
  std::optional<int> max_len_b;
  bool greedy = false;  // beam 1 without length penalty, whatever beam and alpha say
  int nbest = 1;        // hypotheses per sentence; at most the beam
};

// The search a run's [decode] section (`decode`) configures, with `overrides` applied,
// for models whose position table holds `max_positions` (bos and the output take them:
// outputs are capped at max_positions - 1 tokens). transformer_decode and the trainer's
// validation BLEU (beam train.valid_beam, greedy when it is 1) both build theirs here.
BeamOptions configured_beam_options(const DecodeConfig& decode, int max_positions,
                                    const SearchOverrides& overrides);

// A translation as text: its pieces decoded by `spm` (joined, SentencePiece's
// normalisation undone), as transformer_decode writes it and the validation BLEU scores it.
// A line feed, carriage return or NUL that byte pieces make (a byte_fallback model's
// <0x0A>) is written as a space: each translation stays one line of text, line n of the
// output the translation of line n of the input.
std::string detokenize(const sentencepiece::SentencePieceProcessor& spm,
                       const TokenSequence& tokens);

}  // namespace thpc
