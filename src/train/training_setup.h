// What a run is built from, checked before anything is built: the training and
// validation data sources, the vocabulary the model takes, the configurations that this
// build, these data or this many ranks cannot train, and a checkpoint's vocabulary against
// the data's. The trainer and --dry-run (main.cc) check alike, so that a dry run refuses
// what training would.
#pragma once

#include <memory>
#include <string>

#include "checkpoint/checkpoint.h"
#include "common/error.h"
#include "config/config.h"
#include "data/batch_source.h"
#include "data/shard_reader.h"

namespace thpc {

// The training or validation shards are missing or invalid (found by the checks made
// before training): transformer_hpc exits 3 for it, which a job script can tell from a
// crash (exit 1) and need not retry.
class DataError : public Error {
 public:
  explicit DataError(const std::string& message) : Error(message) {}
};

// A configuration that contradicts the checkpoint a run resumes or starts from (another
// train.seed, another model): the user mends it in the configuration, so transformer_hpc
// exits 2 for it as for its other configuration errors (docs/running.md "Exit codes"; it
// was 1, as for a damaged file). Decoding and averaging, which share check_architecture
// and have no configuration of their own to blame, keep their exit codes.
class ConfigurationError : public Error {
 public:
  explicit ConfigurationError(const std::string& message) : Error(message) {}
};

// The training data the config names (data.dir's shards, else the synthetic task); rank
// `shard` of `shards` gets its share. Missing or invalid shards throw DataError.
std::unique_ptr<BatchSource> make_training_source(const Config& config, int shard = 0,
                                                  int shards = 1);

// The validation shards (data.dir/data.valid), in file order, rank `shard`'s share.
std::unique_ptr<ShardReader> make_validation_source(const Config& config, int shard = 0,
                                                    int shards = 1);

// The validation shards must have the training data's whole vocabulary: pieces, size and
// special ids (a valid shard whose bos_id differed was taken, and validated on other
// ids), and its direction (source and target languages). Throws DataError naming both
// otherwise. Training and --dry-run check alike.
void check_validation_vocabulary(const Config& config, const BatchSource& train,
                                 const ShardReader& valid);

// "warning: data.valid ... holds the same pairs as data.train ..." when the two corpora
// are one (their digests equal: data.valid = train, or --validpref the training text with
// one training shard; the same pairs in other shards have another digest),
// else "": validation then scores pairs the model trains on, and best.h5 and early
// stopping follow the training loss. Training and --dry-run say it alike.
std::string same_pairs_warning(const Config& config, const BatchSource& train,
                               const BatchSource& valid);

// The vocabulary the model is built with: model.vocab_size, which must match the
// data's when both are given, or the data's.
int resolve_vocab_size(const Config& config, const BatchSource& source);

// train.backend = cuda in a build without CUDA, or dist.reducer = nccl on the CPU: the
// same on every rank and machine, a configuration error ("" when there is none; a build
// with CUDA on a node without a GPU is the node's: make_backend's runtime error).
std::string backend_impossible(const Config& config);

// Why validation BLEU's search cannot run on a vocabulary of `vocab_size` ("" when it
// can, or when train.valid_bleu is off): a train.valid_beam wider than the tokens a search
// can choose, or a decode.alpha whose length penalty overflows at model.max_positions.
// Training (configuration_impossible) and --eval refuse both alike (exit 2): --eval ran a
// beam of 5,000 for minutes, gigabytes and a BLEU no search can mean.
std::string validation_search_impossible(const Config& config, int vocab_size);

// Why the [decode] defaults every checkpoint stores could not be decoded with, "" when
// they can (or the data is the synthetic task's, whose checkpoints hold no SentencePiece
// model): a decode.beam wider than the tokens a search can choose, or a decode.alpha whose
// length penalty overflows (transformer_decode refuses it at any beam but --greedy).
// transformer_decode refused the trained model's own defaults after the whole run (a
// helper's trial: decode.beam = 1000 over a vocabulary of 120 trained); refused at
// start-up instead, as train.valid_beam is.
std::string stored_decoding_impossible(const Config& config, int vocab_size);

// Why the configuration cannot train with this build, or on `source` with `ranks` ranks
// ("" when it can): train.backend = cuda in a build without CUDA, train.tokens_per_step
// too small to share among the ranks' micro-batches, a train.valid_beam wider than the
// vocabulary, or a micro-batch budget below the longest pair of the data or of the
// validation shards (`valid`, when the run validates: its first validation failed, after
// training up to it, with no checkpoint written). A configuration error (exit 2) that
// --dry-run finds as training does, before anything is built.
std::string configuration_impossible(const Config& config, const BatchSource& source, int ranks,
                                     const BatchSource* valid = nullptr);

// Throws unless `checkpoint` (read from `path`) was trained on the vocabulary of `data`,
// the training shards: the same SentencePiece pieces (a model of another vocabulary of
// the same size passed the architecture check, and its ids meant other pieces). Resume,
// checkpoint.init and --dry-run check alike; a checkpoint or data without a stored model
// (the synthetic task, older files) is not compared.
void check_checkpoint_vocabulary(const Checkpoint& checkpoint, const std::string& path,
                                 const BatchSource& data, const Config& config);

// Throws ConfigurationError unless `checkpoint` (read from `path`) holds the model
// `architecture` (architecture_text of the configuration's model and vocabulary): the
// message of check_architecture, which names the keys to give the file's values. Resume,
// checkpoint.init and --dry-run check alike.
void check_checkpoint_architecture(const Checkpoint& checkpoint, const std::string& path,
                                   const std::string& architecture);

// Throws unless this run can resume from `checkpoint` (read from `path`): it was written
// with this configuration's train.seed (the random stream of a step is keyed by (seed,
// step): another seed would continue some other run; ConfigurationError), and it holds the
// Adam moments (an average holds the parameters only). Training and --dry-run check alike.
void check_checkpoint_resumes_this_run(const Checkpoint& checkpoint, const std::string& path,
                                       const Config& config);

// What follows "SETTING VALUE" where that budget cannot hold the longest pair of `read`
// ("data", "validation shards (...)"), `longest` tokens a side with eos/bos, in `file`:
// " gives each of the A micro-batches on each of R ranks B tokens, less than the longest
// pair of the READ takes (...); raise SETTING to at least M, OTHERWISE". The trainer and
// transformer_data_stats say it alike.
std::string budget_below_the_longest_pair(int accumulate, int ranks, int64_t budget,
                                          const std::string& read, int64_t longest,
                                          const std::string& file, const std::string& setting,
                                          const std::string& otherwise);

}  // namespace thpc
