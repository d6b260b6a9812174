// validate(): each key against the values its option-table entry allows, then the
// relations between keys (config.h). The policy of a configuration, beside the table that
// declares its keys (option_table.h) and the parser that reads them (config.cc).
#include <cctype>
#include <cmath>
#include <string>

#include "common/error.h"
#include "config/config.h"
#include "config/option_table.h"
#include "kernels/ops.h"

namespace thpc {
namespace {

// ---- validation helpers ----

// Whether `text` names `key` as a whole key: "checkpoint.keep_best" is not named by
// "checkpoint.keep_best_count".
bool names_key(const std::string& text, const std::string& key) {
  for (size_t at = text.find(key); at != std::string::npos; at = text.find(key, at + 1)) {
    const size_t end = at + key.size();
    const bool word_before = at > 0 && (std::isalnum(static_cast<unsigned char>(text[at - 1])) ||
                                        text[at - 1] == '_' || text[at - 1] == '.');
    const bool word_after = end < text.size() &&
                            (std::isalnum(static_cast<unsigned char>(text[end])) ||
                             text[end] == '_');
    if (!word_before && !word_after) return true;
  }
  return false;
}

class Checker {
 public:
  explicit Checker(const Config& config)
      : config_(config),
        where_(config.source_file.empty() ? std::string("config") : config.source_file) {}

  // Said of `key`, and of where it was given: a relation between keys broken by one on
  // the command line was blamed on the file alone. The note stands by the key, not after
  // the advice, which it would seem to be part of ("set checkpoint.keep_best = ppl (on
  // the command line)").
  // The other keys the problem names that the command line gave are said after it: a
  // rule broken by --train.valid_bleu=false blamed the file's checkpoint.keep_best alone.
  [[noreturn]] void fail(const char* key, const std::string& problem) const {
    std::string others;
    for (const std::string& other : config_.command_line_keys) {
      if (other != key && names_key(problem, other)) {
        others += (others.empty() ? "" : ", ") + other;
      }
    }
    THPC_FAIL(where_ << ": " << key << config_.on_command_line(key) << ": " << problem
                     << (others.empty() ? "" : " (" + others + " on the command line)"));
  }

 private:
  const Config& config_;
  std::string where_;
};

}  // namespace

void validate(const Config& config) {
  const Checker check(config);

  // Each key against the values its table entry allows.
  Config copy = config;  // the table's accessors take a mutable Config
  for (const Option& option : option_table()) {
    const std::string problem = option.allowed.problem(option.field(copy));
    if (!problem.empty()) check.fail(option.name().c_str(), problem);
  }

  // Relations between keys.
  const ModelConfig& model = config.model;
  // Without explicit head widths each head gets d_model / h (§3.2.2), which must be exact.
  const bool head_widths_given = model.d_k > 0 && model.d_v > 0;
  if (!head_widths_given && model.d_model % model.heads != 0) {
    check.fail("model.heads", "d_model " + std::to_string(model.d_model) +
                                  " is not divisible by heads " + std::to_string(model.heads) +
                                  " (or set both model.d_k and model.d_v)");
  }

  const TrainConfig& train = config.train;
  unsigned candidates = kNoCandidates;
  std::string candidates_error;
  if (!parse_candidate_kernels(train.cuda_kernels, candidates, candidates_error)) {
    check.fail("train.cuda_kernels", candidates_error);
  }
  // Each micro-batch gets tokens_per_step / accumulate (/ ranks) tokens: fewer than one
  // made every micro-batch a batch of its own budget's floor, 10^8 of them a step.
  if (train.accumulate > train.tokens_per_step) {
    check.fail("train.accumulate",
               std::to_string(train.accumulate) + " micro-batches cannot share "
               "train.tokens_per_step " + std::to_string(train.tokens_per_step) +
               " tokens (each needs at least one)");
  }
  // OpenMP creates them all at once: 10^5 threads ended in a segfault in the runtime.
  if (train.threads > kMaxCpuThreads) {
    check.fail("train.threads", std::to_string(train.threads) + " is more than the " +
                                    std::to_string(kMaxCpuThreads) +
                                    " a node can run (0 = OpenMP's default)");
  }
  // (--eval validates once, whatever train.valid_every says.)
  if (train.valid_bleu && train.valid_every == 0 && config.eval_checkpoint.empty()) {
    check.fail("train.valid_bleu", "translates at each validation: set train.valid_every > 0");
  }
  const DataConfig& data = config.data;
  if (train.valid_every > 0 && data.dir.empty()) {
    // --eval's validation reads them whatever train.valid_every says (its advice to set
    // train.valid_every = 0 led --eval to another refusal).
    if (config.eval_checkpoint.empty()) {
      check.fail("train.valid_every",
                 "validation reads shards: set data.dir (or train.valid_every = 0)");
    } else {
      check.fail("data.dir", "empty: --eval scores the validation shards; set it to their "
                             "directory");
    }
  }
  if (train.max_epochs > 0 && data.dir.empty()) {
    check.fail("train.max_epochs", "counts passes over shards: set data.dir (the synthetic task "
                                   "has no epochs), or train.max_epochs = 0");
  }
  if (!data.dir.empty() && data.train.empty()) {
    check.fail("data.train", "must name the training shards (e.g. train)");
  }
  if (train.valid_every > 0 && data.valid.empty()) {
    check.fail("data.valid", "must name the validation shards when train.valid_every > 0");
  }
  // The synthetic task's lengths matter only without shards (data.dir's help: "ignored").
  if (data.dir.empty() && data.synthetic_max_len < data.synthetic_min_len) {
    check.fail("data.synthetic_max_len",
               "must be ≥ data.synthetic_min_len " + std::to_string(data.synthetic_min_len) +
                   ", got " + std::to_string(data.synthetic_max_len));
  }
  // Each side of a pair takes one position more than its sentence: the source its eos, the
  // target's input its bos (the output, shifted, its eos): the shards' limit alike
  // (max_positions - 1 tokens a sentence). "+ 2" refused a length that fits.
  if (data.dir.empty() &&
      static_cast<std::int64_t>(data.synthetic_max_len) + 1 > model.max_positions) {
    check.fail("data.synthetic_max_len",
               std::to_string(data.synthetic_max_len) + " + 1 (eos, or bos) exceeds " +
                   "model.max_positions " + std::to_string(model.max_positions));
  }

  const CheckpointConfig& checkpoint = config.checkpoint;
  // Averaging reads the checkpoints the run kept: it cannot average more than that.
  if (checkpoint.average_last > checkpoint.keep) {
    check.fail("checkpoint.average_last",
               std::to_string(checkpoint.average_last) + " exceeds checkpoint.keep " +
                   std::to_string(checkpoint.keep) + " (the run keeps only that many)");
  }

  // keep_best and patience judge validations: they need validations, and BLEU, chrF or F1
  // the translation pass scored with that metric.
  if (checkpoint.keep_best != "none" && train.valid_every == 0) {
    check.fail("checkpoint.keep_best",
               checkpoint.keep_best + " compares validations: set train.valid_every > 0");
  }
  const bool keeps_translation_score =
      checkpoint.keep_best == "bleu" || checkpoint.keep_best == "chrf" ||
      checkpoint.keep_best == "f1";
  if (keeps_translation_score && !train.valid_bleu) {
    check.fail("checkpoint.keep_best", checkpoint.keep_best + " needs train.valid_bleu = true");
  }
  if (keeps_translation_score && checkpoint.keep_best != train.valid_metric) {
    check.fail("checkpoint.keep_best",
               checkpoint.keep_best + " needs train.valid_metric = " + checkpoint.keep_best +
                   " (the validations score " + train.valid_metric + ")");
  }
  // The k best are ranked by keep_best's metric; their average reads the ones kept.
  if (checkpoint.keep_best_count > 0 && checkpoint.keep_best == "none") {
    check.fail("checkpoint.keep_best_count",
               "ranks checkpoints by the checkpoint.keep_best metric: set checkpoint.keep_best "
               "= ppl, bleu, chrf or f1");
  }
  if (checkpoint.average_best > checkpoint.keep_best_count) {
    check.fail("checkpoint.average_best",
               std::to_string(checkpoint.average_best) + " exceeds checkpoint.keep_best_count " +
                   std::to_string(checkpoint.keep_best_count) +
                   " (the run keeps only that many best checkpoints)");
  }
  if (checkpoint.patience > 0 && checkpoint.keep_best == "none") {
    check.fail("checkpoint.patience",
               "counts validations without a better checkpoint.keep_best metric: set "
               "checkpoint.keep_best = ppl, bleu, chrf or f1");
  }
}

}  // namespace thpc
