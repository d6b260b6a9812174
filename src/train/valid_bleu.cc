#include "train/valid_bleu.h"

#include <sentencepiece_processor.h>

#include <cmath>
#include <sstream>

#include "common/error.h"
#include "data/shard_file.h"
#include "data/shard_reader.h"
#include "decode/translate.h"
#include "train/stop_request.h"

namespace thpc {

namespace {

// Padded source tokens per translation batch. The translations do not depend on it
// (decode/translate.h), only time and memory do: the decoding arenas grow with the batch
// and stay allocated beside the training's, so the batch is a quarter of
// transformer_decode's default, which on the default job's validation set was slower
// and held more memory (bench/RESULTS.md, "validation BLEU's decoding batch").
constexpr int kBatchTokens = 1024;

// The search of train.valid_beam hypotheses, greedy (no length penalty) when that is 1,
// otherwise with the run's [decode] length penalty and limits.
BeamOptions validation_search(const Config& config) {
  SearchOverrides overrides;
  overrides.beam = config.train.valid_beam;
  overrides.greedy = config.train.valid_beam == 1;
  return configured_beam_options(config.decode, config.model.max_positions, overrides);
}

}  // namespace

ValidationBleu::ValidationBleu(const Config& config, const Communicator& comm)
    : comm_(comm),
      options_(validation_search(config)),
      metric_(config.train.valid_metric) {
  const std::vector<std::string> files = find_shards(config.data.dir, config.data.valid);
  // The pairs the validation loss reads (ShardReader drops those a position table cannot
  // hold with bos/eos).
  const int64_t longest = config.model.max_positions - 1;
  std::vector<std::string> references;
  for (const std::string& file : files) {
    const ShardContents shard = read_shard(file);
    if (!spm_ && comm_.is_root()) {
      if (shard.metadata.spm_model.empty()) {
        THPC_FAIL(file << ": holds no SentencePiece model, which train.valid_bleu needs to "
                       << "detokenise translations and references (shards of "
                       << "transformer_preprocess carry one)");
      }
      spm_ = std::make_unique<sentencepiece::SentencePieceProcessor>();
      const auto status = spm_->LoadFromSerializedProto(shard.metadata.spm_model);
      if (!status.ok()) {
        THPC_FAIL(file << ": cannot load its SentencePiece model: " << status.ToString());
      }
    }
    ids_ = shard.metadata.ids;
    for (int64_t i = 0; i < shard.source.sentences(); ++i) {
      if (shard.source.length(i) > longest || shard.target.length(i) > longest) continue;
      if (pairs_++ % comm_.size() == comm_.rank()) sources_.push_back(shard.source.sentence(i));
      if (comm_.is_root()) references.push_back(detokenise(*spm_, shard.target.sentence(i)));
    }
  }
  if (comm_.is_root()) {
    const std::vector<std::vector<std::string>> streams = {references};
    if (metric_ == "chrf") {
      chrf_ = std::make_unique<metrics::ChrfScorer>(streams, metrics::ChrfOptions{});
    } else {
      THPC_CHECK(metric_ == "bleu", "train.valid_metric " << metric_);
      metrics::BleuOptions options;  // sacreBLEU's defaults but for the tokenisation
      options.tokenizer = metrics::parse_tokenizer(config.train.valid_bleu_tokenize);
      bleu_ = std::make_unique<metrics::BleuScorer>(streams, options);
    }
  }
}

ValidationBleu::~ValidationBleu() = default;

double ValidationBleu::score(Transformer& model) const {
  std::vector<std::vector<Hypothesis>> results(sources_.size());
  for (const DecodeBatch& batch :
       make_decode_batches(sources_, options_, kBatchTokens, /*workers=*/1)) {
    // A stop signal ends the translation at the next batch (the trainer then records
    // nothing of this validation: ValidationStats::interrupted).
    if (stop_requested_by() != 0) break;
    translate_batch(model, ids_, sources_, batch, options_, results);
  }
  // Each rank's translations as ids, one line each, for rank 0 to detokenise.
  std::ostringstream mine;
  for (const std::vector<Hypothesis>& found : results) {
    if (!found.empty()) {
      for (const int token : found.front().tokens) mine << token << ' ';
    }
    mine << '\n';
  }
  const std::vector<std::string> shares = comm_.all_gather(mine.str());
  double score = NAN;
  if (comm_.is_root()) {
    // Pair k was translated by rank k mod W as its (k / W)-th sentence.
    std::vector<std::string> hypotheses(pairs_);
    for (size_t rank = 0; rank < shares.size(); ++rank) {
      std::istringstream lines(shares[rank]);
      std::string line;
      for (size_t k = rank; std::getline(lines, line); k += shares.size()) {
        THPC_CHECK(k < hypotheses.size(), "rank " << rank << " sent more translations than pairs");
        std::istringstream numbers(line);
        TokenSequence tokens;
        for (int token; numbers >> token;) tokens.push_back(token);
        hypotheses[k] = detokenise(*spm_, tokens);
      }
    }
    score = chrf_ ? chrf_->corpus_score(hypotheses) : bleu_->corpus_score(hypotheses).score;
  }
  comm_.broadcast_bytes_from_root(&score, sizeof score);
  return score;
}

}  // namespace thpc
