// Settings that do nothing in a run: a value given for a key that nothing of this run
// reads (train.precision on the CPU, dist.* on one rank, the validation's translation
// options without train.valid_bleu). Said at start-up and in a resume's note of changed
// settings, so that a value changing nothing is not taken for one that does: a helper's
// trial found twenty such values accepted without a word, and a resume's note said seven
// of them took effect "from this step on".
#pragma once

#include <string>
#include <vector>

#include "config/config.h"

namespace thpc {

// What of a run decides which keys it reads, beside the configuration.
struct RunShape {
  bool on_gpu = false;  // the backend computes on a GPU (not the CPU)
  int ranks = 1;
  // False where that is not known: --dry-run on a login node without the job's GPUs
  // (train.backend = auto), whose note then leaves the GPU's keys alone (it said the job's
  // train.precision did nothing; a review's finding).
  bool gpu_known = true;
};

// Why `key` ("dist.reduce_dtype") does nothing in a run of `config` shaped `run`, in the
// user's words ("one rank: there are no gradients to sum"), or "" when the run reads it.
std::string why_without_effect(const std::string& key, const Config& config,
                               const RunShape& run);

// "note: set, but without effect in this run: KEY = VALUE (why), ..." for every key whose
// value differs from its default and does nothing here, but those in `said_already` (a
// resume's note named them, with the checkpoint's value); "" when there is none.
std::string idle_settings_note(const Config& config, const RunShape& run,
                               const std::vector<std::string>& said_already = {});

}  // namespace thpc
