// Validation BLEU or chrF (train.valid_bleu, train.valid_metric): the validation pairs'
// sources translated with the model's current parameters, as transformer_decode
// translates them (decode/translate.h: beam train.valid_beam, 1 = greedy; the [decode]
// length limits), detokenised with the shards' SentencePiece model and scored against
// the pairs' targets, detokenised the same way, with sacreBLEU-exact BLEU
// (metrics/bleu.h, sacreBLEU's defaults but for the tokenisation,
// train.valid_bleu_tokenize) or chrF2 (metrics/chrf.h, sacreBLEU's defaults).
//
// The references are the shards' target ids decoded back to text, as fairseq's
// --eval-bleu takes them from its binarized targets: the shards are all a run has, and
// for text that SentencePiece reproduces (no characters its normalisation changes, no
// unknown pieces) they are the reference file's lines, which is what makes the score
// equal `transformer_decode | transformer_score REFERENCE [-m chrf]` on a checkpoint of that
// step.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "config/config.h"
#include "decode/beam_search.h"
#include "distributed/communicator.h"
#include "metrics/bleu.h"
#include "metrics/chrf.h"
#include "model/transformer.h"

namespace sentencepiece {
class SentencePieceProcessor;
}

namespace thpc {

class ValidationBleu {
 public:
  // Reads the pairs of the data.valid shards that the loss pass scores too (both sides
  // within model.max_positions - 1 tokens), in file order; rank r of W keeps the sources
  // of pairs r, r + W, ... Rank 0 detokenises every target as the reference. Throws
  // naming the shards when they carry no SentencePiece model. `comm` must outlive it.
  ValidationBleu(const Config& config, const Communicator& comm);
  ~ValidationBleu();

  // BLEU or chrF (metric()) in percent of `model`'s translations, on every rank (rank 0
  // scores, then broadcasts). Every rank must call it: each translates its share, rank 0
  // gathers. `step`: the step whose parameters these are (for the test hooks alone). Rank
  // 0 signs its work while it scores (common/still_working.h): the caller's limit from the
  // last sign of work bounds the others' wait for the score.
  double score(Transformer& model, int64_t step) const;

  // train.valid_metric: "bleu" | "chrf".
  const std::string& metric() const { return metric_; }

  int64_t sentences() const { return pairs_; }

 private:
  const Communicator& comm_;  // the caller's: its wait limits hold for the gather
  BeamOptions options_;
  SpecialIds ids_;
  int64_t pairs_ = 0;
  std::vector<TokenSequence> sources_;  // this rank's share
  std::unique_ptr<sentencepiece::SentencePieceProcessor> spm_;  // rank 0
  std::string metric_;
  std::unique_ptr<metrics::BleuScorer> bleu_;  // rank 0, metric bleu
  std::unique_ptr<metrics::ChrfScorer> chrf_;  // rank 0, metric chrf
};

}  // namespace thpc
