// What a resume means beyond loading the state: where the data continues when the
// checkpoint's run cut its micro-batches otherwise, and the notes that tell the reader
// what differs from the run that wrote it (ranks, settings, best values). The trainer's
// resume (Trainer::resume_from) calls these; they read and write no file.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <optional>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "config/config.h"
#include "data/batch_source.h"
#include "train/run_schedule.h"

namespace thpc {

// Where the reader continues from `checkpoint`: its position counts the micro-batches of
// an epoch planned at its run's micro-batch budget (train.tokens_per_step over ranks x
// train.accumulate). Another budget plans other batches, so an index taken as it is
// would skip or repeat part of the epoch (four ranks' index 120 of 250 is beyond one
// rank's 62 batches): it continues at the same share of the same shard instead
// (BatchSource::index_at_budget; the shard's batches are others, so some of its pairs
// may come twice and others not at all), and `note` says so. The epoch is kept. A
// checkpoint whose budget cannot be told keeps its index, with a warning.
DataPosition position_at_this_budget(const Checkpoint& checkpoint, const std::string& source,
                                     BatchSource& data, int64_t budget, int ranks,
                                     const TrainConfig& train, std::string& note);

// Where train.max_epochs ends a run that has completed `completed` steps with `data` at
// its position: end_of_epochs with this run's batches, micro-batches of `budget` tokens,
// `ranks` x train.accumulate of them a step. Training's end (Trainer::end_with_the_epochs)
// and the dry run's account of it.
EpochsEnd end_of_epochs_from(BatchSource& data, int64_t budget, int ranks,
                             const TrainConfig& train, int64_t completed);

// The configuration `checkpoint` stores, read once for a resume's notes
// (log_resume_notes) and checks (CheckpointKeeping::lowered_keeping_refusal), which each
// read it apart before. Empty where this version cannot read it (a key it does not know):
// those notes and checks then pass over what they would compare. An empty text (a
// checkpoint written before configurations were stored) reads as the defaults.
std::optional<Config> stored_configuration(const Checkpoint& checkpoint);

// The lines after "resumed from PATH at step N": another number of ranks than the
// checkpoint's (and whether each step still takes the same micro-batches), the settings
// that differ from its run's from this step on (and apart, those without effect here:
// GPU-only keys when `on_gpu` is false), `data_position_note`
// (position_at_this_budget's), best validation values the checkpoint lacks, and the
// learning rate's jump where the schedule's settings changed (`written`: the checkpoint's
// stored_configuration, the notes comparing with it left out when it is empty).
struct ResumeNotes {
  // The keys named as without effect here, which the start-up's idle_settings_note then
  // leaves out (it named them twice, the second time without the checkpoint's value).
  std::vector<std::string> idle_keys;
  // What changed from the checkpoint's run, "key = value (was value), ...": the number of
  // ranks ("ranks = 2 (was 1)"), the settings that take effect from here, then those
  // without effect here ("key = value (was value; why)"); "" for none.
  std::string changed;
};
ResumeNotes log_resume_notes(const Checkpoint& checkpoint, const std::string& path,
                             const std::optional<Config>& written, const Config& config,
                             int ranks, bool on_gpu, const std::string& data_position_note,
                             std::ostream& log);

// A note when `checkpoint` was computed otherwise than this run computes (`computed_by`,
// compute_identity's: the backend, the matrix products' library and kernels, the GPU),
// as its stored configuration's header says (kComputedBy): its losses may then
// differ from an uninterrupted run's in the last bits (a helper's walk: a requeue without
// OPENBLAS_CORETYPE, on a node of another kind, differed without a word). Nothing for a
// checkpoint that does not say (written before 2026-12-07).
void note_other_arithmetic(const Checkpoint& checkpoint, const std::string& computed_by,
                           std::ostream& log);

}  // namespace thpc
