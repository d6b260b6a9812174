#include "train/training_setup.h"

#include <filesystem>
#include <sstream>

#include "backend/factory.h"
#include "common/error.h"
#include "common/sha256.h"
#include "data/sentencepiece_vocabulary.h"
#include "data/synthetic.h"
#include "decode/beam_search.h"
#include "decode/ensemble.h"
#include "distributed/communicator.h"

namespace thpc {

namespace {

// `prefix_setting`: the key that names `prefix` (data.train, data.valid), for messages.
std::unique_ptr<ShardReader> make_shard_reader(const Config& config, const std::string& prefix,
                                               const std::string& prefix_setting,
                                               bool shuffle, int shard, int shards) {
  // The shards are found and checked here: a failure is the data's, and says so.
  try {
    ShardReaderSpec spec;
    spec.files = find_shards(config.data.dir, prefix, prefix_setting + " = " + prefix,
                             "data.dir = " + config.data.dir);
    spec.seed = config.train.seed;
    spec.shuffle = shuffle;
    spec.rank = shard;
    spec.ranks = shards;
    spec.memory_budget_bytes = static_cast<int64_t>(config.data.memory_mb) << 20;
    // make_batch adds eos to the source and bos to the target: one position each.
    spec.max_sentence_tokens = config.model.max_positions - 1;
    return std::make_unique<ShardReader>(spec);
  } catch (const DataError&) {
    throw;
  } catch (const Error& error) {
    throw DataError(error.what());
  }
}

}  // namespace

std::unique_ptr<ShardReader> make_validation_source(const Config& config, int shard,
                                                    int shards) {
  return make_shard_reader(config, config.data.valid, "data.valid", /*shuffle=*/false, shard,
                           shards);
}

std::unique_ptr<BatchSource> make_training_source(const Config& config, int shard,
                                                  int shards) {
  if (!config.data.dir.empty()) {
    return make_shard_reader(config, config.data.train, "data.train", /*shuffle=*/true, shard,
                             shards);
  }
  SyntheticSpec spec;
  spec.task = parse_synthetic_task(config.data.synthetic);
  spec.vocab = config.data.synthetic_vocab;
  spec.min_len = config.data.synthetic_min_len;
  spec.max_len = config.data.synthetic_max_len;
  spec.seed = config.train.seed;
  spec.split = SyntheticSplit::Train;
  spec.shard = shard;
  spec.shards = shards;
  return std::make_unique<SyntheticSource>(spec);
}

void check_validation_vocabulary(const Config& config, const BatchSource& train,
                                 const ShardReader& valid_source) {
  // Both come from data.dir (validate() requires it), so the training source has a corpus.
  THPC_CHECK(train.spm_model(), "validation without a training corpus");
  const ShardMetadata& valid = valid_source.metadata();
  // The direction too (one vocabulary serves both: de->en validation of an en->de model
  // was taken).
  if (valid_source.direction() != train.direction()) {
    throw DataError(config.data.dir + ": the " + config.data.valid + " shards are " +
                    valid_source.direction() + ", the " + config.data.train + " shards " +
                    train.direction() + ": preprocess both in one transformer_preprocess run");
  }
  // The training source's vocabularies as a shard's metadata holds them.
  ShardMetadata training;
  training.vocab_size = train.vocab_size();
  training.ids = train.special_ids();
  training.spm_model = *train.spm_model();
  training.source_vocab_size = train.source_vocab_size();
  if (const std::string* model = train.source_spm_model()) training.source_spm_model = *model;
  if (same_vocabularies(valid, training)) return;
  const auto vocabulary = [](int size, const SpecialIds& ids, const std::string& model) {
    return "vocab_size " + std::to_string(size) + ", pad/unk/bos/eos " + special_ids_text(ids) +
           ", SentencePiece model sha256 " + sha256_hex(model.data(), model.size()).substr(0, 12) +
           "...";
  };
  const auto vocabularies = [&](const ShardMetadata& meta) {
    return vocabulary(meta.vocab_size, meta.ids, meta.spm_model) +
           (meta.separate_vocabularies()
                ? ", a source vocabulary of its own: " +
                      vocabulary(meta.source_vocab_size, meta.ids, meta.source_spm_model)
                : std::string());
  };
  throw DataError(config.data.dir + ": the " + config.data.valid + " shards have another " +
                  "vocabulary than the " + config.data.train + " shards (" + config.data.valid +
                  ": " + vocabularies(valid) + "; " + config.data.train + ": " +
                  vocabularies(training) + "): preprocess both in one transformer_preprocess run");
}

std::string same_pairs_warning(const Config& config, const BatchSource& train,
                               const BatchSource& valid) {
  if (train.corpus_sha256().empty() || train.corpus_sha256() != valid.corpus_sha256()) return "";
  return "warning: data.valid (" + config.data.valid + ") holds the same pairs as data.train (" +
         config.data.train + "): validation scores what the model trains on, and best.h5 and "
         "early stopping follow the training loss; preprocess a held-out set (--validpref)";
}

int resolve_vocab_size(const Config& config, const BatchSource& source) {
  const int data_vocab = source.vocab_size();
  if (config.model.vocab_size > 0 && config.model.vocab_size != data_vocab) {
    // A configuration error every rank finds alike (they read the same data, checked
    // before): exit 2, one message.
    throw AllRanksError(config.source_file + ": model.vocab_size is " +
                            std::to_string(config.model.vocab_size) +
                            config.on_command_line("model.vocab_size") +
                            " but the training data has a vocabulary of " +
                            std::to_string(data_vocab) + " (set 0 to take the data's)",
                        2);
  }
  return data_vocab;
}

std::string backend_impossible(const Config& config) {
  if (config.train.backend == "cuda" && !built_with_cuda()) {
    return config.source_file + ": train.backend = cuda" +
           config.on_command_line("train.backend") + ", but " + cuda_unavailable_reason() +
           "; set train.backend = cpu or auto";
  }
  const auto on_the_cpu = [&] {
    return config.train.backend == "cpu" ||
           (config.train.backend == "auto" && !cuda_unavailable_reason().empty());
  };
  if (config.dist.reducer == "nccl" && on_the_cpu()) {
    return config.source_file + ": dist.reducer = nccl" +
           config.on_command_line("dist.reducer") + " sums on GPUs, and this run trains on " +
           "the CPU (train.backend = " + config.train.backend + "); set dist.reducer = mpi " +
           "or auto";
  }
  // The weight decay's GPU kernel has not yet run on a GPU: it runs only when asked for.
  if (config.train.weight_decay > 0.0f && !on_the_cpu() &&
      (backend_request(config.train, 0).cuda_kernels.candidates & kWeightDecay) == 0) {
    std::ostringstream why;
    why << config.source_file << ": train.weight_decay = " << config.train.weight_decay
        << config.on_command_line("train.weight_decay")
        << " decays the weights on the GPU with a kernel that has not yet run on one (the "
        << "candidate weight_decay): add weight_decay to train.cuda_kernels to run it anyway "
        << "(train.cuda_kernels = weight_decay, or comma-separated with others), or set "
        << "train.backend = cpu, or train.weight_decay = 0";
    return why.str();
  }
  return "";
}

std::string validation_search_impossible(const Config& config, int vocab_size) {
  const TrainConfig& train = config.train;
  std::ostringstream why;
  if (!train.valid_bleu) return "";
  if (train.valid_beam > 1 &&
      length_penalty_overflows(config.model.max_positions, config.decode.alpha)) {
    // As transformer_decode refuses it (a greedy validation, valid_beam = 1, has none).
    why << config.source_file << ": decode.alpha " << config.decode.alpha
        << config.on_command_line("decode.alpha")
        << " makes the validation search's length penalty ((5 + |Y|)/6)^alpha overflow for "
        << "outputs of " << config.model.max_positions << " tokens (model.max_positions): "
        << "every score would be -0; give a smaller alpha (§6.1: 0.6)";
  } else if (train.valid_beam > selectable_tokens(vocab_size)) {
    // As transformer_decode refuses a beam wider than the tokens a search can choose:
    // valid_beam = 10^9 asked for 26 GB at the first validation, after training up to it.
    why << config.source_file << ": train.valid_beam " << train.valid_beam
        << config.on_command_line("train.valid_beam")
        << " is wider than the " << selectable_tokens(vocab_size)
        << " tokens a search can choose (the vocabulary of " << vocab_size
        << " less pad and bos): give at most " << selectable_tokens(vocab_size);
  }
  return why.str();
}

std::string stored_decoding_impossible(const Config& config, int vocab_size) {
  const DecodeConfig& decode = config.decode;
  std::ostringstream why;
  // (The synthetic task's checkpoints hold no SentencePiece model to decode text with:
  // data.synthetic_vocab = 5, its range's least, was refused for decode.beam 4.)
  if (config.data.dir.empty()) return "";
  const std::string stored =
      ": every checkpoint stores it as transformer_decode's default, which would refuse it";
  if (decode.beam > selectable_tokens(vocab_size)) {
    why << config.source_file << ": decode.beam " << decode.beam
        << config.on_command_line("decode.beam") << " is wider than the "
        << selectable_tokens(vocab_size) << " tokens a search can choose (the vocabulary of "
        << vocab_size << " less pad and bos)" << stored << "; give at most "
        << selectable_tokens(vocab_size);
  } else if (length_penalty_overflows(config.model.max_positions, decode.alpha)) {
    // (at any beam: transformer_decode refuses it but with --greedy)
    why << config.source_file << ": decode.alpha " << decode.alpha
        << config.on_command_line("decode.alpha")
        << " makes the length penalty ((5 + |Y|)/6)^alpha overflow for outputs of "
        << config.model.max_positions << " tokens (model.max_positions)" << stored
        << "; give a smaller alpha (§6.1: 0.6)";
  }
  return why.str();
}

std::string configuration_impossible(const Config& config, const BatchSource& source, int ranks,
                                     const BatchSource* valid) {
  const TrainConfig& train = config.train;
  std::ostringstream why;
  if (const std::string backend = backend_impossible(config); !backend.empty()) {
    why << backend;
  } else if (train.tokens_per_step < static_cast<int64_t>(train.accumulate) * ranks) {
    why << config.source_file << ": train.tokens_per_step " << train.tokens_per_step
        << config.on_command_line("train.tokens_per_step")
        << " cannot be shared by " << train.accumulate << " micro-batches on each of " << ranks
        << " ranks (each needs at least one token)";
  } else if (const std::string search = validation_search_impossible(config, source.vocab_size());
             !search.empty()) {
    why << search;
  } else if (const std::string stored = stored_decoding_impossible(config, source.vocab_size());
             !stored.empty()) {
    why << stored;
  } else {
    const int64_t budget = train.tokens_per_step / (static_cast<int64_t>(train.accumulate) * ranks);
    // Validation reads its batches at the same budget.
    const bool valid_longer =
        valid != nullptr && valid->longest_padded_side() > source.longest_padded_side();
    const BatchSource& longest = valid_longer ? *valid : source;
    if (longest.longest_padded_side() > budget) {
      // The file is named (a user with many shards looks for the long pair in one), and
      // validation's budget is said by its key: it is read at every validation, which on a
      // resumed run is not "from step valid_every".
      const std::string file = longest.longest_pair_file();
      why << config.source_file << ": train.tokens_per_step " << train.tokens_per_step
          << config.on_command_line("train.tokens_per_step")
          << budget_below_the_longest_pair(
                 train.accumulate, ranks, budget,
                 valid_longer ? "validation shards (read at that budget at each validation, "
                                "every train.valid_every = " +
                                    std::to_string(train.valid_every) + " steps)"
                              : std::string("data"),
                 longest.longest_padded_side(), file, "train.tokens_per_step",
                 longest.spm_model() == nullptr ? "or give a smaller data.synthetic_max_len"
                 : valid_longer ? "or preprocess with a smaller --valid-max-len"
                                : "or preprocess with a smaller --max-len");
    }
  }
  return why.str();
}

void check_checkpoint_vocabulary(const Checkpoint& checkpoint, const std::string& path,
                                 const BatchSource& data, const Config& config) {
  // With separate vocabularies the source's model too (whether both have one is the
  // architecture's check: source_vocab_size).
  if (const std::string* source = data.source_spm_model();
      source != nullptr && !checkpoint.source_spm_model.empty() &&
      *source != checkpoint.source_spm_model) {
    const std::string difference = sentencepiece_vocabulary_difference(
        checkpoint.source_spm_model, "the checkpoint's source", *source, "the shards' source");
    if (!difference.empty()) {
      throw ConfigurationError("checkpoint " + path + ": trained on another source "
                               "SentencePiece vocabulary than the shards of data.dir " +
                               config.data.dir + " (" + difference + "): start afresh, or "
                               "give the corpus it was trained on");
    }
  }
  const std::string* shards = data.spm_model();
  if (checkpoint.spm_model.empty() || shards == nullptr || *shards == checkpoint.spm_model) return;
  const std::string difference = sentencepiece_vocabulary_difference(
      checkpoint.spm_model, "the checkpoint's", *shards, "the shards'");
  // Models that differ as bytes but not as vocabularies (a retrained model with the same
  // pieces) give the ids the same meaning.
  if (difference.empty()) return;
  // Of another size, it is data.dir that changed (preprocessed again?), not the model:
  // named as such, before the architecture's check would ask for the checkpoint's
  // model.vocab_size, which the shards then refuse.
  const bool same_size = embedding_rows(checkpoint) == data.vocab_size();
  // The user mends it in the configuration (data.dir, or which checkpoint): exit 2, as for
  // another architecture (it was 1, as for a damaged file; a helper's walk).
  std::ostringstream message;
  message << "checkpoint " << path << ": trained on another SentencePiece vocabulary than the "
          << "shards of data.dir " << config.data.dir << " (" << difference << ")"
          << (same_size ? ", of the same size: its ids would mean other pieces"
                        : ": data.dir holds another corpus than the one it was trained on "
                          "(preprocessed again?)")
          << ". Preprocess the data with the checkpoint's model (transformer_preprocess "
          << "--spm-model " << path << " reads it from the checkpoint), or start afresh";
  throw ConfigurationError(message.str());
}

void check_checkpoint_architecture(const Checkpoint& checkpoint, const std::string& path,
                                   const std::string& architecture) {
  try {
    check_architecture(checkpoint, architecture, path);
  } catch (const Error& mismatch) {  // (it throws for a mismatch alone)
    throw ConfigurationError(mismatch.what());
  }
}

void check_checkpoint_resumes_this_run(const Checkpoint& checkpoint, const std::string& path,
                                       const Config& config) {
  if (checkpoint.seed != config.train.seed) {
    // Named where the user gave it: "tiny.ini has train.seed 7" for --train.seed=7 sent
    // them to a file that holds none.
    const bool typed = !config.on_command_line("train.seed").empty();
    std::ostringstream message;
    message << "checkpoint " << path << ": written with train.seed " << checkpoint.seed << ", "
            << (typed ? "the command line gives" : config.source_file + " has") << " train.seed "
            << config.train.seed << " (a resumed run keeps its seed): give train.seed = "
            << checkpoint.seed << " to resume it, or start a run of seed " << config.train.seed
            << " from its parameters with checkpoint.init = " << path
            << " and another checkpoint.dir";
    throw ConfigurationError(message.str());
  }
  if (checkpoint.adam_m.empty() || checkpoint.adam_v.empty()) {
    THPC_FAIL("checkpoint " << path << ": holds parameters only (an average?); resume needs "
                            << "the Adam moments, use checkpoint.init to start from it");
  }
}

std::string budget_below_the_longest_pair(int accumulate, int ranks, int64_t budget,
                                          const std::string& read, int64_t longest,
                                          const std::string& file, const std::string& setting,
                                          const std::string& otherwise) {
  std::ostringstream why;
  why << " gives each of the " << accumulate << " micro-batches on each of " << ranks
      << " ranks " << budget << " tokens, less than the longest pair of the " << read
      << " takes (" << longest << " tokens a side with eos/bos"
      << (file.empty() ? "" : ", in " + file) << "); raise " << setting << " to at least "
      << longest * accumulate * ranks << ", ";
  // Where the micro-batches are what made the budget small (train.accumulate = 1000 was
  // told only to raise the tokens; a helper's trial), fewer of them fit.
  const int64_t fitting = budget * accumulate / std::max<int64_t>(1, longest);
  if (accumulate > 1 && fitting >= 1) {
    why << "lower " << (setting.rfind("--", 0) == 0 ? "--accumulate" : "train.accumulate")
        << " to at most " << fitting << ", ";
  }
  why << otherwise;
  return why.str();
}

}  // namespace thpc
