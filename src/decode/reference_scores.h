// Scoring given translations instead of searching for them (transformer_decode
// --score-reference, as Marian's marian-scorer and fairseq-generate --score-reference):
// for each pair of a source x and a reference y, the model's log-likelihood
//   log P(y | x) = sum_{t=1}^{n+1} log p(y_t | y_<t, x),  y_{n+1} = eos,
// what data filtering by cross-entropy (Junczys-Dowmunt 2018), n-best reranking and a test
// set's perplexity read. Each batch is one teacher-forced forward pass without dropout
// (Transformer::target_log_probs: validation's forward, as marian-scorer runs the
// training graph's), each layer's products over all of the batch's positions at once,
// rather than one decoding step a position through the search's caches.
//
// An ensemble scores as it searches (decode/ensemble.h): the weighted mean of its models'
// log-probabilities at every position, so of their sentence scores,
// sum_i w_i log P_i(y | x). A hypothesis beam search found, ended by eos, scores its
// Hypothesis::log_prob (with one model, up to the rounding of a whole pass against one
// position a step). The rows' nll come back once a logit chunk (softmax_nll_rows), not once
// a sentence (on a GPU ~100 stream synchronisations a 4,096-token batch before); not yet
// run on a GPU.
#pragma once

#include <cstddef>
#include <vector>

#include "data/batch.h"
#include "decode/translate.h"
#include "model/transformer.h"

namespace thpc {

// The pairs i with scored[i] set, sorted by the longer side (source + eos, reference +
// eos: both are padded to their batch's longest) into batches of at most `batch_tokens`
// padded tokens of that side and, when `batch_sentences` > 0, at most that many pairs.
// An empty source or reference is a pair too (x = eos alone, or y = eos alone). With
// several workers the budget shrinks so that each gets at least two batches where the
// input allows, as make_decode_batches does. With `cut_at_length_after` > 0 a batch that
// holds that many padded tokens also ends before a shorter pair: a batch that reached
// the cut holds pairs of one length, padded on their other side only; a smaller one
// still takes shorter pairs (kCpuScoringBatchCut).
std::vector<DecodeBatch> make_scoring_batches(const std::vector<TokenSequence>& sources,
                                              const std::vector<TokenSequence>& references,
                                              const std::vector<char>& scored, int batch_tokens,
                                              int workers, int batch_sentences = 0,
                                              int cut_at_length_after = 0);

// make_scoring_batches' cut_at_length_after on the CPU, whose products run as fast per
// row with a few hundred rows as with thousands: the padding saved is time saved. A
// random-init base-sized model on 2 cores of a Zen 5 EPYC, one thread, 400 newstest2014
// pairs in 4,096-token batches: 12.2 s wall without the cut, 9.0 s with it at 256 (9.2 to
// 9.9 s with the cuts tried at 128 to 512 tokens that also let a batch take pairs down to
// 90-97% of its length; 1,500 pairs: 34.2 and 31.7 s), the checkpoint's load (~0.8 s)
// included (bench/RESULTS.md, 2026-12-07). A GPU's batches keep the budget alone: its
// products want the rows (not measured).
constexpr int kCpuScoringBatchCut = 256;

// log P(reference | source) of each member of `batch` under `models` (one, or an ensemble
// sharing a vocabulary, weighted by `weights`, normalised as ensemble_weights does; empty:
// equally), written to scores[member]; with `piece_scores`, each of its pieces' and eos'
// log p (an ensemble's weighted mean) to (*piece_scores)[member].
void score_batch(const std::vector<Transformer*>& models, const std::vector<float>& weights,
                 const SpecialIds& ids, const std::vector<TokenSequence>& sources,
                 const std::vector<TokenSequence>& references, const DecodeBatch& batch,
                 std::vector<double>& scores,
                 std::vector<std::vector<float>>* piece_scores = nullptr);

}  // namespace thpc
