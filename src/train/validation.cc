#include "train/validation.h"

#include <algorithm>
#include <iostream>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <ostream>
#include <thread>
#include <utility>

#include "backend/factory.h"
#include "common/error.h"
#include "data/sentencepiece_vocabulary.h"
#include "decode/ensemble.h"
#include "distributed/rank_failures.h"
#include "model/checkpoint_params.h"
#include "train/rank_agreement.h"
#include "train/step_decision.h"
#include "train/stop_request.h"
#include "train/training_setup.h"

namespace thpc {

// Each rank's micro-batch: the step's budget divided over ranks and micro-batches. The
// validation batches are cut by the same budget, so that --eval batches (and hence
// rounds) exactly as the run that wrote the checkpoint did.
int64_t micro_batch_budget(int64_t tokens_per_step, int accumulate, int ranks) {
  return std::max<int64_t>(1, tokens_per_step / (static_cast<int64_t>(accumulate) * ranks));
}

int64_t micro_batch_budget(const Config& config, const Communicator& comm) {
  return micro_batch_budget(config.train.tokens_per_step, config.train.accumulate, comm.size());
}

namespace {

// The settings --eval reads that change the numbers it prints (the loss's smoothing, the
// validation translation and its score, the batches' rounding), where the configuration
// given differs from the checkpoint's run: "model.label_smoothing = 0.1 (was 0), ...", ""
// when none does. A sweep's base configuration gave each variant's --eval the base's label
// smoothing, and the losses compared were not those the runs logged (a helper's sweep).
std::string eval_settings_differing(const Config& config, const Checkpoint& checkpoint) {
  static const char* const kRead[] = {
      "model.label_smoothing", "train.tokens_per_step", "train.accumulate",
      "train.valid_bleu",      "train.valid_metric",    "train.valid_beam",
      "train.valid_bleu_tokenize", "decode.alpha",      "decode.max_len_a",
      "decode.max_len_b",      "decode.tree_leaves"};
  if (checkpoint.config_ini.empty()) return "";
  std::string listed;
  for (const ConfigDifference& difference :
       config_differences(config.to_ini(), checkpoint.config_ini)) {
    if (std::find(std::begin(kRead), std::end(kRead), difference.key) == std::end(kRead)) {
      continue;
    }
    listed += (listed.empty() ? "" : ", ") + difference.key + " = " + difference.value +
              " (was " + difference.reference + ")";
  }
  return listed;
}

}  // namespace

// A failure to read what BLEU needs from the validation shards is the data's, like the
// shards' other checks; a search the configuration makes impossible is its own.
std::unique_ptr<ValidationScorer> make_validation_scorer(const Config& config,
                                                     const Communicator& comm) {
  try {
    return std::make_unique<ValidationScorer>(config, comm);
  } catch (const DataError&) {
    throw;
  } catch (const ConfigurationError&) {
    throw;
  } catch (const Error& error) {
    throw DataError(error.what());
  }
}

// The score of the validation translations, into the field of its metric.
void score_translations(const ValidationScorer& scorer, Transformer& model, int64_t step,
                        ValidationStats& stats) {
  (scorer.metric() == "chrf" ? stats.chrf
   : scorer.metric() == "f1" ? stats.f1
                             : stats.bleu) = scorer.score(model, step);
}

namespace {

// Test hook (docs/reliability.md): THPC_TEST_VALIDATION_BATCH_DELAY_MS=RANK:MS holds that
// rank MS milliseconds after each batch of the validation loss: a rank whose share of the
// validation takes longer than dist.timeout_s, and still works.
void delay_validation_batch_for_tests(const Communicator& comm) {
  static const std::pair<int, long> rank_and_delay = [] {
    int rank = -1;
    long milliseconds = 0;
    const char* spec = std::getenv("THPC_TEST_VALIDATION_BATCH_DELAY_MS");
    if (spec == nullptr || std::sscanf(spec, "%d:%ld", &rank, &milliseconds) != 2) rank = -1;
    return std::pair<int, long>(rank, milliseconds);
  }();
  if (rank_and_delay.first == comm.rank()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(rank_and_delay.second));
  }
}

}  // namespace

// One pass over the validation shards, summed over all ranks.
ValidationStats validation_pass(Transformer& model, ShardReader& shards,
                                const Communicator& comm, int64_t budget) {
  shards.seek(DataPosition{});
  LossSums sums;
  // A stop signal ends the pass at the next batch: the caller then records nothing of it
  // (ValidationStats::interrupted), and the job stops without waiting for the whole set.
  while (stop_requested_by() == 0) {
    std::optional<Batch> batch = shards.next_in_epoch(budget);
    if (!batch) break;
    const LossSums batch_sums = model.evaluate(*batch);
    sums.loss += batch_sums.loss;
    sums.nll += batch_sums.nll;
    sums.tokens += batch_sums.tokens;
    delay_validation_batch_for_tests(comm);
    comm.show_working();  // the ranks done with their shares wait for this one
  }
  ValidationStats stats;
  stats.tgt_tokens = comm.sum(sums.tokens);
  stats.loss = comm.sum(sums.loss) / static_cast<double>(stats.tgt_tokens);
  stats.nll = comm.sum(sums.nll) / static_cast<double>(stats.tgt_tokens);
  return stats;
}

std::vector<LogField> validation_fields(const ValidationStats& valid) {
  std::vector<LogField> fields = {
      fixed_field("loss", "valid_loss", valid.loss, 4),
      fixed_field("ppl", "valid_ppl", std::exp(valid.nll), 2),
      fixed_field("target tokens", "valid_tgt_tokens", static_cast<double>(valid.tgt_tokens), 0)};
  // Only runs that translate have the field, so that the lines of the others stay as they were.
  if (!std::isnan(valid.bleu)) fields.push_back(fixed_field("bleu", "valid_bleu", valid.bleu, 2));
  if (!std::isnan(valid.chrf)) fields.push_back(fixed_field("chrf", "valid_chrf", valid.chrf, 2));
  if (!std::isnan(valid.f1)) fields.push_back(fixed_field("f1", "valid_f1", valid.f1, 2));
  return fields;
}

void evaluate_checkpoint(const Config& config, const std::string& path,
                         const Communicator& comm, std::ostream& log) {
  // The configuration's mistakes, the same on every rank: exit 2, as the others.
  if (config.data.dir.empty()) {
    throw AllRanksError(config.source_file + ": --eval scores the validation shards: set data.dir",
                        2);
  }
  if (config.data.valid.empty()) {
    throw AllRanksError(config.source_file + ": data.valid: must not be empty" +
                            config.on_command_line("data.valid"),
                        2);
  }
  // Each rank reads the shards and the checkpoint itself; a failure to (a path that is not
  // there, mostly on every rank) is one message and one exit code from every rank (before:
  // each rank aborted with its own copy).
  std::unique_ptr<Backend> backend;
  std::unique_ptr<ShardReader> shards;
  std::unique_ptr<Transformer> model;
  int64_t step = 0;  // the checkpoint's
  std::string settings_differing;  // eval_settings_differing's
  std::string averaged_from;       // an average's inputs (kAveragedFrom), "" for a step's
  // As training's start-up: a rank stopped or hung while it reads ends the job after
  // dist.timeout_s without a sign of work (the reads give one between their blocks).
  std::optional<Communicator::WaitLimit> reading;
  reading.emplace(comm, config.dist.timeout_s, "--eval of " + path,
                  Communicator::WaitFrom::kLastSignOfWork, "run the --eval again",
                  "a rank slower to read, as one reading a large checkpoint or corpus from "
                  "a slow file system, or on a busy node");
  // (an AllRanksError keeps its code: a model.vocab_size other than the shards' is a
  // configuration error, exit 2)
  on_every_rank(comm, [&] {
    const int device =
        std::max(0, select_device(comm.local_rank(), visible_cuda_devices(), config.dist.device));
    backend = make_backend(backend_request(config.train, device));
    shards = make_validation_source(config, comm.rank(), comm.size());
    // (before the checkpoint is read, as training says it before anything is built)
    const int vocab_size = resolve_vocab_size(config, *shards);
    if (const std::string search = validation_search_impossible(config, vocab_size);
        !search.empty()) {
      throw AllRanksError(search, 2);
    }
    // A pair longer than each micro-batch's budget, as training refuses it: it failed
    // later, every rank apart with its own message (exit 1; a helper's walk on 4 ranks).
    // The ranks set the budget: fewer of them fit longer pairs.
    if (const int64_t budget = micro_batch_budget(config, comm);
        shards->longest_padded_side() > budget) {
      throw AllRanksError(
          config.source_file + ": train.tokens_per_step " +
              std::to_string(config.train.tokens_per_step) +
              config.on_command_line("train.tokens_per_step") +
              budget_below_the_longest_pair(
                  config.train.accumulate, comm.size(), budget,
                  "validation shards (--eval reads them at that budget)",
                  shards->longest_padded_side(), shards->longest_pair_file(),
                  "train.tokens_per_step",
                  comm.size() > 1 ? "or run the --eval on fewer ranks"
                                  : "or preprocess with a smaller --valid-max-len"),
          2);
    }
    const Checkpoint checkpoint = read_checkpoint(path, CheckpointParts::ParamsOnly);
    // A model scores the pieces of its own vocabulary only.
    // Said as training says it (before: the shards named alone, without which piece
    // differs or what to do; a helper's walk), exit 2.
    if (!checkpoint.spm_model.empty() && checkpoint.spm_model != shards->metadata().spm_model) {
      const std::string difference = sentencepiece_vocabulary_difference(
          checkpoint.spm_model, "the checkpoint's", shards->metadata().spm_model,
          "the shards'");
      if (!difference.empty()) {
        throw ConfigurationError(
            "checkpoint " + path + ": trained on another SentencePiece vocabulary than the " +
            config.data.valid + " shards of data.dir " + config.data.dir + " (" + difference +
            "): --eval scores shards preprocessed with the checkpoint's own model "
            "(transformer_preprocess --spm-model); give the data.dir it was trained on, or "
            "preprocess the pairs to score again with it");
      }
    }
    // ... and in its own direction: one vocabulary serves both.
    if (!checkpoint.direction.empty() && checkpoint.direction != shards->direction()) {
      THPC_FAIL("checkpoint " << path << ": trained " << checkpoint.direction << ", but the "
                              << config.data.valid << " shards of " << config.data.dir
                              << " are " << shards->direction());
    }
    model = std::make_unique<Transformer>(
        config.model, VocabularySizes{vocab_size, shards->source_vocab_size()},
        shards->special_ids(), *backend, config.train.seed);
    load_parameters(checkpoint, path, *model);
    step = checkpoint.step;
    settings_differing = eval_settings_differing(config, checkpoint);
    averaged_from = ini_header_value(checkpoint.config_ini, kAveragedFrom);
    // Evaluated all the same (what it scores is the diagnosis), and said.
    if (checkpoint.state == CheckpointState::Diverged && comm.is_root()) {
      std::cerr << "note: " << path << " is marked diverged: its run judged its parameters "
                << "diverged" << std::endl;
    }
  });
  // Each rank read the shards and the file itself: the same paths can name different files
  // (working directories, node-local disks), and the numbers were a blend of both.
  check_every_rank_reads_the_same_data(comm, *shards, config.data.dir, "validation");
  check_every_rank_starts_from_the_same_parameters(comm, model->params().sha256_hex(),
                                                   "--eval " + path);
  // (a refusal, the same on every rank, is one message and one exit code from every rank;
  // rank 0 reads the references longer, within `reading`'s limit)
  std::unique_ptr<ValidationScorer> scorer;
  if (config.train.valid_bleu) {
    on_every_rank(comm, [&] { scorer = make_validation_scorer(config, comm); });
  }
  reading.reset();
  ValidationStats stats;
  int signal = 0;
  {
    // As a run's validation: a rank that stops showing work ends the job.
    const Communicator::WaitLimit bounded(comm, config.dist.timeout_s, "--eval of " + path,
                                          Communicator::WaitFrom::kLastSignOfWork,
                                          "run the --eval again");
    stats = validation_pass(*model, *shards, comm, micro_batch_budget(config, comm));
    if (scorer) score_translations(*scorer, *model, step, stats);
    // (within the bound: a rank stopped as its pass ended held the others here)
    signal = stop_signal_of_any_rank(comm);
  }
  // A stop signal cut the pass short on some rank: its numbers are not the checkpoint's.
  if (signal != 0) {
    if (comm.is_root()) {
      log << "stopped: " << stop_signal_name(signal) << " received during --eval of " << path
          << "; nothing evaluated" << std::endl;
    }
    return;
  }
  if (!comm.is_root()) return;
  if (!settings_differing.empty()) {
    log << "note: settings that --eval reads differ from those of the run that wrote " << path
        << ": " << settings_differing << "; the line below is this configuration's, not the "
        << "one that run logged (give its settings to compare with its log)" << std::endl;
  }
  // The parameters' digest, as the final: line of a run that ended with them prints it.
  log << "evaluated " << path << " (step " << step << ") on " << config.data.dir
      << "/" << config.data.valid << ".*.h5; params_sha256=" << model->params().sha256_hex()
      << std::endl;
  // What training says of the shards, the pairs left out included (a dev tree longer than
  // the position table changed the F1 without a word: a helper's walk).
  shards->print_notes(log, "data.valid");
  // An average's step is its newest input's: its line is no line its run logged (a
  // helper's sweep read the two as one).
  if (!averaged_from.empty()) {
    log << "note: " << path << " is an average (of " << averaged_from << "): step " << step
        << " is its newest input's, and the line below is the average's" << std::endl;
  }
  log << (scorer ? scorer->notes() : std::string())
      << log_line("valid step " + std::to_string(step), validation_fields(stats)) << std::endl;
}

}  // namespace thpc
