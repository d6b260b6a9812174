// The names of the files a training run writes in its directories, in one place: the
// trainer writes them, and what must never be written over or mixed with them knows them
// by these (checkpoint.overwrite's check of a run directory, every tool's output check,
// transformer_preprocess's --destdir).
#pragma once

#include <cstdint>
#include <string>

namespace thpc {

constexpr const char* kTrainerLockName = "trainer.lock";  // checkpoint.dir's (RunLock)
// transformer_preprocess's lock of its --destdir, which no tool writes over either.
constexpr const char* kPreprocessLockName = "preprocess.lock";
constexpr const char* kMetricsFileName = "metrics.jsonl";
constexpr const char* kEventFilePrefix = "events.out.tfevents.";  // TensorBoard's

// The canonical file name of a step: "step_00001234.h5".
std::string checkpoint_file_name(int64_t step);
// The step of "step_00001234.h5", or -1 for any other name.
int64_t step_of_file_name(const std::string& name);

// The name of a kept best checkpoint of a step (checkpoint.keep_best_count):
// "best_step_00001234.h5". Not a step_*.h5: the rotation of checkpoint.keep, resume=auto
// and averaging the last N never see it.
std::string best_checkpoint_file_name(int64_t step);
bool is_best_checkpoint_name(const std::string& path);

// Whether the last component of `path` is a training checkpoint's name (step_*.h5 with
// digits): the files list_checkpoints(), resume=auto and pruning act on.
bool is_step_checkpoint_name(const std::string& path);

// Whether the last component of `path` names a file a training run writes in its
// checkpoint directory: its checkpoints, the damaged ones it moved aside
// (step_*.h5.corrupt), best.h5, the kept best (best_step_*.h5) and the averages
// (average_last*.h5, average_best*.h5). What a new run refuses to find there
// (checkpoint.overwrite) and what no tool writes over.
bool is_run_checkpoint_file(const std::string& path);

// Whether the last component of `path` names any file of a training run: one of
// is_run_checkpoint_file's, the run's lock, its metrics file or an event file.
bool is_training_run_file(const std::string& path);

}  // namespace thpc
