#include "train/resume.h"

#include <cmath>
#include <filesystem>
#include <iomanip>
#include <optional>
#include <ostream>
#include <set>
#include <sstream>

#include "common/error.h"
#include "train/idle_settings.h"
#include "train/lr_schedule.h"
#include "train/validation.h"

namespace thpc {

namespace {

// Whether `difference` is one file or directory written two ways ("ck" and "/runs/ck"):
// the keys that name a path, this run's value resolved against this run's working
// directory and the checkpoint's against `written_in`, the working directory of the run
// that wrote it (this run's too when the checkpoint does not record one).
bool same_path_written_otherwise(const ConfigDifference& difference,
                                 const std::string& written_in) {
  static const std::set<std::string> path_keys = {"data.dir", "checkpoint.dir",
                                                  "checkpoint.init", "train.metrics_dir"};
  if (path_keys.count(difference.key) == 0 || difference.value.empty() ||
      difference.reference.empty()) {
    return false;
  }
  bool failed = false;
  const auto resolved = [&failed](const std::string& path) {
    std::error_code error;
    std::filesystem::path full = std::filesystem::weakly_canonical(path, error);
    failed = failed || static_cast<bool>(error);
    return full.has_filename() ? full : full.parent_path();  // "ck/" is "ck"
  };
  const std::filesystem::path value = resolved(difference.value);
  const std::filesystem::path reference =
      resolved((std::filesystem::path(written_in) / difference.reference).string());
  return !failed && value == reference;
}

// A note when this run's schedule gives the next step another learning rate than the
// checkpoint's run would have (a changed train.warmup_steps or train.lr_scale, or any
// later key of scheduled_learning_rate's): the settings' note names the keys, this one the
// jump a reader would otherwise find in the progress lines' lr (warmup_steps 4000 -> 8000
// at step 6000 cuts it to 0.65x at once). Compared by value, not by key name, so a schedule's new
// key needs no entry here. `then`: the checkpoint's run's configuration.
void note_learning_rate_jump(const Checkpoint& checkpoint, const Config& then,
                             const Config& config, std::ostream& log) {
  const int64_t next = checkpoint.step + 1;
  // A rollback's reduction (kept in the checkpoint) multiplies both alike.
  const double factor = checkpoint.divergence ? checkpoint.divergence->lr_factor : 1.0;
  const double now = scheduled_learning_rate(next, config) * factor;
  const double before = scheduled_learning_rate(next, then) * factor;
  // Equal settings give the same bits; a relative 1e-9 only spares a rewritten value.
  if (std::abs(now - before) <= 1e-9 * std::abs(before)) return;
  std::ostringstream line;
  line << std::scientific << std::setprecision(3) << "note: the learning rate of step " << next
       << " is " << now << " where the checkpoint's run would have given " << before << " ("
       << std::fixed << std::setprecision(2) << now / before
       << "x): the schedule's settings changed, and the rate jumps there" << std::endl;
  log << line.str();
}

// A note naming the settings in which this run differs from the one that wrote the
// checkpoint (a raised train.max_steps, a lowered train.lr_scale): they take effect from
// here, and the log should say so rather than leave it to the reader to compare files.
// checkpoint.resume, which says how this run started, is left out, and so is a
// path written another way (same_path_written_otherwise). Those that change nothing in
// this run are said apart, with why.
ResumeNotes note_changed_settings(const Checkpoint& checkpoint,
                                  const std::optional<Config>& written, const Config& config,
                                  const RunShape& run, std::ostream& log) {
  ResumeNotes notes;
  std::vector<std::string>& idle_keys = notes.idle_keys;
  if (checkpoint.config_ini.empty()) return notes;
  std::ostringstream changed, idle;
  int count = 0, idle_count = 0;
  for (const ConfigDifference& difference :
       config_differences(config.to_ini(), checkpoint.config_ini)) {
    if (difference.key == "checkpoint.resume" ||
        same_path_written_otherwise(difference, checkpoint.working_directory)) {
      continue;
    }
    const auto shown = [](const std::string& value) {
      return value.empty() ? std::string("empty") : value;
    };
    // (checkpoint.init: read by a fresh run alone)
    const std::string why = difference.key == "checkpoint.init"
                                ? "a resumed run's parameters are the checkpoint's"
                                : why_without_effect(difference.key, config, run);
    std::ostringstream& list = why.empty() ? changed : idle;
    int& listed = why.empty() ? count : idle_count;
    if (!why.empty()) idle_keys.push_back(difference.key);
    list << (listed++ == 0 ? "" : ", ") << difference.key << " = " << shown(difference.value)
         << " (was " << shown(difference.reference) << (why.empty() ? "" : "; " + why) << ")";
  }
  if (count > 0) {
    log << "note: " << count << (count == 1 ? " setting differs" : " settings differ")
        << " from the run that wrote the checkpoint, from this step on: " << changed.str()
        << std::endl;
  }
  // Recorded with those that change nothing here and why (kSettingsChanged): a key idle on
  // one rank that a later resume on two makes count changed nothing in that later
  // resume's comparison, so its line alone never said (a review's finding).
  notes.changed = changed.str() + (count > 0 && idle_count > 0 ? ", " : "") + idle.str();
  if (idle_count > 0) {
    log << "note: " << idle_count << (idle_count == 1 ? " setting differs" : " settings differ")
        << " from the run that wrote the checkpoint but " << (idle_count == 1 ? "has" : "have")
        << " no effect in this run: " << idle.str() << std::endl;
  }
  if (written) note_learning_rate_jump(checkpoint, *written, config, log);
  return notes;
}

// A note when the checkpoint resumed from was written by another number of ranks. A step
// takes ranks x train.accumulate micro-batches from one stream: with that product and
// train.tokens_per_step unchanged (3 ranks x 2 resumed as 2 x 3 or 1 x 6) every step takes
// the same micro-batches, and the losses are the original run's up to the order of the
// sums (the note said otherwise, as for any other change).
void note_world_size_change(const Checkpoint& checkpoint, const std::optional<Config>& written,
                            int ranks, const TrainConfig& train, std::ostream& log) {
  if (checkpoint.world_size == ranks) return;
  log << "note: the checkpoint was written by " << checkpoint.world_size << " rank"
      << (checkpoint.world_size == 1 ? "" : "s") << ", this run has " << ranks
      << ": parameters, moments, step and schedule continue";
  // (a checkpoint without readable settings: the general note)
  const bool same_micro_batches =
      written && !checkpoint.config_ini.empty() &&
      written->train.tokens_per_step == train.tokens_per_step &&
      checkpoint.world_size * written->train.accumulate == int64_t{ranks} * train.accumulate;
  if (same_micro_batches) {
    log << ", and each step takes the same micro-batches (ranks x train.accumulate is "
        << int64_t{ranks} * train.accumulate << " as before), so the losses are the "
        << "original run's up to the order of the sums" << std::endl;
  } else {
    log << ", but each rank's share of the batches differs from here on, so the losses are "
        << "not those of the original run" << std::endl;
  }
}

// A warning line when a run that validates resumes from a checkpoint without best
// validation values: best.h5 and checkpoint.patience start afresh.
void note_missing_best_valid(const Checkpoint& checkpoint, const std::string& source,
                             const TrainConfig& train, std::ostream& log) {
  if (checkpoint.best_valid || train.valid_every == 0) return;
  log << "warning: checkpoint " << source << " holds no best validation values (written "
      << "before checkpoints stored them): the best valid ppl and bleu, best.h5 and the "
      << "checkpoint.patience count start afresh at this run's first validation" << std::endl;
}

}  // namespace

std::optional<Config> stored_configuration(const Checkpoint& checkpoint) {
  try {
    return load_config_text(checkpoint.config_ini, "the checkpoint's configuration");
  } catch (const Error&) {
    return std::nullopt;
  }
}

DataPosition position_at_this_budget(const Checkpoint& checkpoint, const std::string& source,
                                     BatchSource& data, int64_t budget, int ranks,
                                     const TrainConfig& train, std::string& note) {
  note.clear();
  DataPosition position = checkpoint.data_position;
  if (!checkpoint.corpus_sha256.empty() && checkpoint.corpus_sha256 != data.corpus_sha256()) {
    // Other data (re-preprocessed, another data.dir): the index counts batches of a
    // corpus that is not this one. Its next epoch starts afresh.
    note = "warning: the data under data.dir is not what the checkpoint's run read "
           "(training pairs sha256 " + data.corpus_sha256().substr(0, 12) + "... now, " +
           checkpoint.corpus_sha256.substr(0, 12) + "... then): its position in that data " +
           "cannot be carried over, so this run reads the new data from the start of " +
           "epoch " + std::to_string(position.epoch + 2);
    return DataPosition{position.epoch + 1, 0};
  }
  if (checkpoint.config_ini.empty() || data.batches_per_epoch(budget) == 0) return position;
  int64_t written_budget = 0;
  int64_t written_tokens = 0, written_accumulate = 0;
  try {
    THPC_CHECK(checkpoint.world_size >= 1, "a world size of " << checkpoint.world_size);
    const Config written =
        load_config_text(checkpoint.config_ini, source + " (its configuration)");
    written_tokens = written.train.tokens_per_step;
    written_accumulate = written.train.accumulate;
    written_budget = micro_batch_budget(written_tokens, static_cast<int>(written_accumulate),
                                        static_cast<int>(checkpoint.world_size));
  } catch (const Error& error) {
    note = "warning: the micro-batch budget of the checkpoint's run cannot be told (" +
           std::string(error.what()) + "): the data continues at its index as it stands, " +
           "which skips or repeats part of the epoch if that budget was not this run's";
    return position;
  }
  if (written_budget == budget) return position;
  int64_t then = 0;
  try {
    then = data.batches_per_epoch(written_budget);
    position.index = data.index_at_budget(checkpoint.data_position, written_budget, budget);
  } catch (const Error& error) {
    // A pair that the written budget cannot hold: data.dir holds other data than the
    // checkpoint's run read. (A failed plan leaves none: the next call plans again.)
    data.batches_per_epoch(budget);
    note = "warning: the data under data.dir cannot be cut at the checkpoint's run's " +
           std::to_string(written_budget) + " tokens a micro-batch (" + error.what() +
           "): it is not the data that run read, and continues at the checkpoint's index " +
           "as it stands";
    return checkpoint.data_position;
  }
  const int64_t now = data.batches_per_epoch(budget);
  std::ostringstream text;
  text << "note: the checkpoint's run cut each micro-batch to " << written_budget
       << " tokens (train.tokens_per_step " << written_tokens << " over "
       << checkpoint.world_size << " rank" << (checkpoint.world_size == 1 ? "" : "s") << " x "
       << written_accumulate << "), this one to " << budget << " (" << train.tokens_per_step
       << " over " << ranks << " rank" << (ranks == 1 ? "" : "s") << " x " << train.accumulate
       << "): the epoch's " << now << " batches are not its " << then
       << ", so the data continues " << std::fixed << std::setprecision(1)
       << 100.0 * static_cast<double>(checkpoint.data_position.index) /
              static_cast<double>(then)
       << "% through epoch " << position.epoch + 1 << " (batch " << position.index << " of "
       << now << ", where the checkpoint had " << checkpoint.data_position.index << " of "
       << then << ": the same share of the same shard)";
  note = text.str();
  return position;
}


EpochsEnd end_of_epochs_from(BatchSource& data, int64_t budget, int ranks,
                             const TrainConfig& train, int64_t completed) {
  // Every step reads ranks x accumulate micro-batches of the one stream that all ranks
  // deal from (BatchSource::next), epoch after epoch, each epoch cut alike at this budget.
  const int64_t per_epoch = data.batches_per_epoch(budget);
  const int64_t per_step = static_cast<int64_t>(train.accumulate) * ranks;
  const DataPosition at = data.position();
  const int64_t read = at.epoch * per_epoch + at.index;  // real data: far from the limit
  return end_of_epochs(train.max_epochs, per_epoch, per_step, read, completed);
}

void note_other_arithmetic(const Checkpoint& checkpoint, const std::string& computed_by,
                           std::ostream& log) {
  const std::string then = ini_header_value(checkpoint.config_ini, kComputedBy);
  if (then.empty() || then == computed_by) return;
  log << "note: the checkpoint's steps were computed by " << then << "; this run's are by "
      << computed_by << ": training goes on, but its losses may differ from those of a run "
      << "computed by one of them throughout in the last bits (matrix products and sums "
      << "taken in another order round otherwise)" << std::endl;
}

ResumeNotes log_resume_notes(const Checkpoint& checkpoint, const std::string& path,
                             const std::optional<Config>& written, const Config& config,
                             int ranks, bool on_gpu, const std::string& data_position_note,
                             std::ostream& log) {
  note_world_size_change(checkpoint, written, ranks, config.train, log);
  ResumeNotes notes =
      note_changed_settings(checkpoint, written, config, RunShape{on_gpu, ranks}, log);
  // The number of ranks is no setting, but changes what settings do (dist.*, the batches
  // each rank takes): recorded beside them.
  if (checkpoint.world_size > 0 && checkpoint.world_size != ranks) {
    notes.changed = "ranks = " + std::to_string(ranks) + " (was " +
                    std::to_string(checkpoint.world_size) + ")" +
                    (notes.changed.empty() ? "" : ", ") + notes.changed;
  }
  if (!data_position_note.empty()) log << data_position_note << std::endl;
  note_missing_best_valid(checkpoint, path, config.train, log);
  return notes;
}

}  // namespace thpc
