// Validation BLEU, chrF or bracket F1 (train.valid_bleu, train.valid_metric): the validation pairs'
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
//
// Parsing (train.valid_metric = f1, the shards of tools/run_parser.sh): the search is
// constrained to well-formed trees over each source's words (decode/tree_filter.h, as
// transformer_decode --tree-constraints), each translation and each target is read back
// as a tree over the source's words (parse/tree.h's delinearize) and the F1 is EVALB's
// with COLLINS.prm (parse/evalb.h), as tools/run_parser.sh scores a checkpoint, but for
// the words' tags, which the shards do not hold: punctuation_tags' (what COLLINS.prm
// deletes is told by the tag; on the WSJ sample they are the treebank's for all but 1 of
// 10,729 punctuation words), and the words are the sources' pieces decoded word by word.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "config/config.h"
#include "decode/beam_search.h"
#include "decode/tree_filter.h"
#include "distributed/communicator.h"
#include "metrics/bleu.h"
#include "metrics/chrf.h"
#include "model/transformer.h"

namespace sentencepiece {
class SentencePieceProcessor;
}

namespace thpc {

class ValidationScorer {
 public:
  // Reads the pairs of the data.valid shards that the loss pass scores too (both sides
  // within model.max_positions - 1 tokens), in file order; rank r of W keeps the sources
  // of pairs r, r + W, ... Rank 0 detokenises every target as the reference. Throws
  // naming the shards when they carry no SentencePiece model. `comm` must outlive it.
  ValidationScorer(const Config& config, const Communicator& comm);
  ~ValidationScorer();

  // BLEU, chrF or bracket F1 (metric()) in percent of `model`'s translations, on every rank (rank 0
  // scores, then broadcasts). Every rank must call it: each translates its share, rank 0
  // gathers. `step`: the step whose parameters these are (for the test hooks alone). Rank
  // 0 signs its work while it scores (common/still_working.h): the caller's limit from the
  // last sign of work bounds the others' wait for the score.
  double score(Transformer& model, int64_t step) const;

  // train.valid_metric: "bleu" | "chrf" | "f1".
  const std::string& metric() const { return metric_; }

  int64_t sentences() const { return pairs_; }

  // Rank 0: "note: ..." lines (each ending in a newline) of what makes the score less than
  // the model's own, for the start of the run: with metric f1, validation trees longer
  // than the search's length limit, targets that are no well-formed tree. "" when none.
  const std::string& notes() const { return notes_; }

 private:
  // Metric f1, rank 0: the F1 of the trees `sequences` (sequence_with_word_slots', pair
  // by pair) describe over the pairs' words against the gold trees.
  double tree_f1(const std::vector<std::string>& sequences) const;

  const Communicator& comm_;  // the caller's: its wait limits hold for the gather
  BeamOptions options_;
  SpecialIds ids_;
  int64_t pairs_ = 0;
  std::vector<TokenSequence> sources_;  // this rank's share
  std::unique_ptr<sentencepiece::SentencePieceProcessor> spm_;  // rank 0
  std::string metric_;
  std::unique_ptr<metrics::BleuScorer> bleu_;  // rank 0, metric bleu
  std::unique_ptr<metrics::ChrfScorer> chrf_;  // rank 0, metric chrf
  // Metric f1: the search's filter over this rank's sources; rank 0's gold trees
  // (to_evalb_line's lines), each pair's words and their tags, and the vocabulary's
  // pieces, which tell a translation's brackets and words.
  std::unique_ptr<TreeTokenFilter> trees_;
  std::vector<std::string> gold_trees_;
  std::vector<std::vector<std::string>> words_, tags_;
  std::vector<std::string> pieces_;
  std::string notes_;
};

// Metric f1: a validation target as the sequence parse::delinearize reads
// (sequence_with_word_slots' form), `words` being its source's count. A label only the
// validation trees have may have no piece for its '(' (the vocabulary holds the training
// trees' brackets whole, and '(' occurs nowhere else: WHADJP in the WSJ sample's dev
// split): that word reads as the unknown piece (`unk`), then the label, which could also
// be a word with a character the vocabulary lacks. They are read as brackets where that
// gives a tree (as many opening brackets as closing ones, `words` words), as words
// otherwise.
std::string gold_tree_sequence(const TokenSequence& target,
                               const std::vector<std::string>& pieces, int unk, size_t words);

}  // namespace thpc
