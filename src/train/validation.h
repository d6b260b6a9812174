// Validation (Marian's validator, here beside the training loop that calls it): one pass
// over the validation shards, summed over the ranks, with the BLEU, chrF or (a parser's)
// F1 of their translations under train.valid_bleu; its log line; and --eval, which scores a
// checkpoint the same way without training.
#pragma once

#include <cmath>
#include <cstdint>
#include <iosfwd>
#include <memory>
#include <string>
#include <vector>

#include "config/config.h"
#include "data/shard_reader.h"
#include "distributed/communicator.h"
#include "model/transformer.h"
#include "train/run_log.h"
#include "train/validation_scorer.h"

namespace thpc {

// One pass over the validation shards, summed over all ranks.
struct ValidationStats {
  double loss = 0.0;  // label-smoothed cross-entropy per target token
  double nll = 0.0;   // per target token; perplexity = exp(nll)
  int64_t tgt_tokens = 0;
  // The score of the translations, with train.valid_bleu (validation_scorer.h): in the field of
  // train.valid_metric; the other, and both without valid_bleu, NaN.
  double bleu = NAN;
  double chrf = NAN;
  double f1 = NAN;  // a parser's bracketing F1
  // A stop signal reached this rank before the pass ended: the pass may have been cut
  // short (it stops at the next batch), and the values are not the validation set's.
  bool interrupted = false;
};

// The fields of a "valid step N | loss ... | ppl ... | target tokens ... [| bleu ...]" line
// ("| chrf ..." or "| f1 ..." with train.valid_metric = chrf or f1).
std::vector<LogField> validation_fields(const ValidationStats& stats);

// transformer_hpc CONFIG --eval CHECKPOINT: the validation loss and perplexity of the
// checkpoint's parameters on the config's validation shards, printed by rank 0 as the
// "valid step N" line of a training run (N = the checkpoint's step). Trains nothing and
// writes no file.
void evaluate_checkpoint(const Config& config, const std::string& path,
                         const Communicator& comm, std::ostream& log);

// Each rank's micro-batch: train.tokens_per_step divided over ranks and micro-batches.
// The validation batches are cut by the same budget, so that --eval batches (and hence
// rounds) exactly as the run that wrote the checkpoint did. At least 1.
int64_t micro_batch_budget(int64_t tokens_per_step, int accumulate, int ranks);
int64_t micro_batch_budget(const Config& config, const Communicator& comm);

// One pass over `shards` from their start in batches of `budget` tokens a side, the loss
// summed over all ranks; a stop signal ends it at the next batch.
ValidationStats validation_pass(Transformer& model, ShardReader& shards,
                                const Communicator& comm, int64_t budget);

// The BLEU, chrF or F1 scorer of the validation translations (train.valid_bleu); a failure
// to read what it needs from the validation shards is the data's (DataError), a search
// the configuration makes impossible its own (ConfigurationError).
std::unique_ptr<ValidationScorer> make_validation_scorer(const Config& config,
                                                     const Communicator& comm);

// The score of the validation translations of the parameters of `step`, into the field of
// its metric.
void score_translations(const ValidationScorer& scorer, Transformer& model, int64_t step,
                        ValidationStats& stats);

}  // namespace thpc
