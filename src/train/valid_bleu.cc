#include "train/valid_bleu.h"

#include <sentencepiece_processor.h>

#include <cmath>
#include <cstdint>
#include <cstring>

#include "common/error.h"
#include "common/still_working.h"
#include "data/shard_file.h"
#include "data/shard_reader.h"
#include "decode/translate.h"
#include "train/stop_request.h"
#include "train/test_hooks.h"

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
  const std::vector<std::string> files =
      find_shards(config.data.dir, config.data.valid, "data.valid = " + config.data.valid,
                  "data.dir = " + config.data.dir);
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
      if (comm_.is_root()) references.push_back(detokenize(*spm_, shard.target.sentence(i)));
      show_still_working();  // at start-up, which the other ranks wait for
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

namespace {

// A rank's best translations as int32s, each sentence's length then its ids (none for a
// sentence a stop left untranslated), for all_gather, which carries bytes.
std::string packed_ids(const std::vector<std::vector<Hypothesis>>& results) {
  std::vector<int32_t> values;
  for (const std::vector<Hypothesis>& found : results) {
    const TokenSequence none;
    const TokenSequence& tokens = found.empty() ? none : found.front().tokens;
    values.push_back(static_cast<int32_t>(tokens.size()));
    values.insert(values.end(), tokens.begin(), tokens.end());
  }
  return std::string(reinterpret_cast<const char*>(values.data()),
                     values.size() * sizeof(int32_t));
}

// packed_ids' sentences again, from rank `rank`'s bytes.
std::vector<TokenSequence> unpacked_ids(const std::string& bytes, size_t rank) {
  THPC_CHECK(bytes.size() % sizeof(int32_t) == 0,
             "rank " << rank << " sent " << bytes.size() << " bytes of translations");
  std::vector<int32_t> values(bytes.size() / sizeof(int32_t));
  std::memcpy(values.data(), bytes.data(), bytes.size());
  std::vector<TokenSequence> sentences;
  for (size_t at = 0; at < values.size();) {
    const size_t length = static_cast<size_t>(values[at++]);
    THPC_CHECK(length <= values.size() - at,
               "rank " << rank << "'s translations end inside a sentence");
    sentences.emplace_back(values.begin() + at, values.begin() + at + length);
    at += length;
  }
  return sentences;
}

}  // namespace

double ValidationBleu::score(Transformer& model, int64_t step) const {
  std::vector<std::vector<Hypothesis>> results(sources_.size());
  for (const DecodeBatch& batch :
       make_decode_batches(sources_, options_, kBatchTokens, /*workers=*/1)) {
    // A stop signal ends the translation at the next batch (the trainer then records
    // nothing of this validation: ValidationStats::interrupted).
    if (stop_requested_by() != 0) break;
    translate_batch(model, ids_, sources_, batch, options_, results);
    comm_.show_working();  // the ranks done with their shares wait for this one
  }
  const std::vector<std::string> shares = comm_.all_gather(packed_ids(results));
  maybe_inject_failure(comm_, step, InjectionPoint::Scoring);
  double score = NAN;
  if (comm_.is_root()) {
    // Pair k was translated by rank k mod W as its (k / W)-th sentence.
    std::vector<std::string> hypotheses(pairs_);
    for (size_t rank = 0; rank < shares.size(); ++rank) {
      size_t k = rank;
      for (const TokenSequence& tokens : unpacked_ids(shares[rank], rank)) {
        THPC_CHECK(k < hypotheses.size(), "rank " << rank << " sent more translations than pairs");
        hypotheses[k] = detokenize(*spm_, tokens);
        show_still_working();  // the other ranks wait for the score
        k += shares.size();
      }
    }
    score = chrf_ ? chrf_->corpus_score(hypotheses) : bleu_->corpus_score(hypotheses).score;
  }
  // Rank 0 scores alone (seconds for a large set) and signs its work between sentences,
  // so the caller's limit from the last sign of work holds here too: a rank 0 stopped or
  // hung while it scores ends the job after dist.timeout_s (before: the others waited for
  // its score without limit).
  comm_.broadcast_bytes_from_root(&score, sizeof score);
  return score;
}

}  // namespace thpc
