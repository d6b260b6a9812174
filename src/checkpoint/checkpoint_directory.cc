#include "checkpoint/checkpoint_directory.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <iterator>
#include <ostream>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <utility>

#include "common/error.h"
#include "config/config.h"
#include "data/sentencepiece_vocabulary.h"

namespace thpc {

namespace fs = std::filesystem;

std::vector<CheckpointSummary> checkpoint_summaries(const std::string& dir) {
  std::vector<CheckpointSummary> found;
  std::error_code error;
  if (!fs::is_directory(dir, error)) return {};
  for (const fs::directory_entry& entry : fs::directory_iterator(dir, error)) {
    const std::string path = entry.path().string();
    const int64_t named_step = step_of_file_name(entry.path().filename().string());
    if (named_step < 0 || !entry.is_regular_file(error)) continue;
    std::optional<CheckpointSummary> summary = read_checkpoint_summary(path);
    if (!summary) {
      summary = CheckpointSummary{};
      summary->path = path;
      summary->step = named_step;
    }
    found.push_back(std::move(*summary));
  }
  std::sort(found.begin(), found.end(), [](const CheckpointSummary& a, const CheckpointSummary& b) {
    return std::tie(a.step, a.path) < std::tie(b.step, b.path);
  });
  return found;
}

std::vector<std::string> list_checkpoints(const std::string& dir) {
  std::vector<std::string> paths;
  for (const CheckpointSummary& summary : checkpoint_summaries(dir)) paths.push_back(summary.path);
  return paths;
}

std::vector<std::string> newest_healthy_checkpoints(const std::string& dir, int count,
                                                    int64_t every_steps, int64_t last_step) {
  std::vector<std::string> paths;
  const std::vector<CheckpointSummary> summaries = checkpoint_summaries(dir);
  for (auto summary = summaries.rbegin();
       summary != summaries.rend() && static_cast<int>(paths.size()) < count; ++summary) {
    if (summary->state != CheckpointState::Healthy) continue;
    if (every_steps > 0 && summary->step % every_steps != 0 && summary->step != last_step) {
      continue;
    }
    paths.insert(paths.begin(), summary->path);
  }
  return paths;
}

std::vector<CheckpointSummary> best_checkpoint_summaries(const std::string& dir) {
  std::vector<CheckpointSummary> found;
  std::error_code error;
  if (!fs::is_directory(dir, error)) return {};
  for (const fs::directory_entry& entry : fs::directory_iterator(dir, error)) {
    if (!is_best_checkpoint_name(entry.path().string()) || !entry.is_regular_file(error)) continue;
    // A file whose header does not parse, or holds no score, cannot be ranked: it is left
    // alone (reading it is what would say what is wrong with it).
    std::optional<CheckpointSummary> summary = read_checkpoint_summary(entry.path().string());
    if (summary && summary->validation) found.push_back(std::move(*summary));
  }
  // By metric first, so that each metric's files are ranked together.
  std::sort(found.begin(), found.end(), [](const CheckpointSummary& a, const CheckpointSummary& b) {
    return a.validation->metric < b.validation->metric;
  });
  auto begin = found.begin();
  while (begin != found.end()) {
    const auto end = std::find_if(begin, found.end(), [&](const CheckpointSummary& s) {
      return s.validation->metric != begin->validation->metric;
    });
    std::vector<CheckpointSummary> one_metric(begin, end);
    rank_best_checkpoints(one_metric);
    std::move(one_metric.begin(), one_metric.end(), begin);
    begin = end;
  }
  return found;
}

void rank_best_checkpoints(std::vector<CheckpointSummary>& summaries) {
  std::stable_sort(summaries.begin(), summaries.end(),
                   [](const CheckpointSummary& a, const CheckpointSummary& b) {
                     const double x = a.validation->value, y = b.validation->value;
                     // A score that is not finite ranks after every finite one.
                     if (std::isfinite(x) != std::isfinite(y)) return std::isfinite(x);
                     if (std::isfinite(x) && x != y) {
                       return lower_is_better(a.validation->metric) ? x < y : x > y;
                     }
                     return std::tie(a.step, a.path) < std::tie(b.step, b.path);
                   });
}

BestSetChange change_best_set(std::vector<CheckpointSummary> kept, const ValidationScore& score,
                              int64_t step, int count) {
  BestSetChange change;
  // The same step validated again: its old file is replaced by the new one, or removed.
  std::vector<CheckpointSummary> same_step;
  for (auto summary = kept.begin(); summary != kept.end();) {
    if (summary->step == step) {
      same_step.push_back(*summary);
      summary = kept.erase(summary);
    } else {
      ++summary;
    }
  }
  CheckpointSummary candidate;
  candidate.path = best_checkpoint_file_name(step);  // a name, for the tie rule only
  candidate.step = step;
  candidate.validation = score;
  const bool finite = std::isfinite(score.value);
  if (finite) kept.push_back(candidate);
  rank_best_checkpoints(kept);
  for (size_t rank = 0; rank < kept.size(); ++rank) {
    const bool is_candidate = finite && kept[rank].step == step;
    if (is_candidate) {
      change.admitted = static_cast<int>(rank) < count;
      if (change.admitted) change.rank = static_cast<int>(rank) + 1;
    } else if (static_cast<int>(rank) >= count) {
      change.removed.push_back(kept[rank]);
    }
  }
  // Worst first: the order in which they drop out of the set.
  std::reverse(change.removed.begin(), change.removed.end());
  // Written over when admitted (the same name); otherwise a score of this step that the
  // new one says is stale.
  if (!change.admitted) {
    change.removed.insert(change.removed.end(), same_step.begin(), same_step.end());
  }
  return change;
}

std::vector<std::string> best_checkpoints(const std::string& dir, int count, std::string* metric,
                                          const std::string& only_metric) {
  std::vector<CheckpointSummary> ranked = best_checkpoint_summaries(dir);
  if (!only_metric.empty()) {
    ranked.erase(std::remove_if(ranked.begin(), ranked.end(),
                                [&](const CheckpointSummary& summary) {
                                  return summary.validation->metric != only_metric;
                                }),
                 ranked.end());
  }
  metric->clear();
  if (ranked.empty()) return {};
  *metric = ranked.front().validation->metric;
  for (const CheckpointSummary& summary : ranked) {
    if (summary.validation->metric != *metric) {
      THPC_FAIL(dir << " holds best checkpoints kept for different metrics ("
                    << ranked.front().path << ": valid " << *metric << ", " << summary.path
                    << ": valid " << summary.validation->metric
                    << "): average one metric's files, given by name");
    }
  }
  std::vector<CheckpointSummary> chosen(
      ranked.begin(), ranked.begin() + std::min<size_t>(ranked.size(), static_cast<size_t>(count)));
  std::sort(chosen.begin(), chosen.end(), [](const CheckpointSummary& a, const CheckpointSummary& b) {
    return std::tie(a.step, a.path) < std::tie(b.step, b.path);
  });
  std::vector<std::string> paths;
  for (const CheckpointSummary& summary : chosen) paths.push_back(summary.path);
  return paths;
}

std::string newest_valid_checkpoint(const std::string& dir, std::ostream& warnings,
                                    Checkpoint* loaded, std::vector<InvalidCheckpoint>* invalid) {
  const std::vector<CheckpointSummary> summaries = checkpoint_summaries(dir);
  for (auto summary = summaries.rbegin(); summary != summaries.rend(); ++summary) {
    if (summary->state != CheckpointState::Healthy) {
      warnings << "note: passing over checkpoint " << summary->path << " (step " << summary->step
               << ", " << checkpoint_state_name(summary->state) << ")" << std::endl;
      continue;
    }
    try {
      Checkpoint checkpoint = read_checkpoint(summary->path);
      if (loaded) *loaded = std::move(checkpoint);
      return summary->path;
    } catch (const CheckpointOfANewerVersion&) {
      // Not damage: passed over, an older checkpoint would be resumed and this one moved
      // aside as corrupt, the progress since lost (a job requeued under an older module).
      throw;
    } catch (const Error& error) {
      warnings << "warning: skipping invalid " << error.what() << std::endl;
      if (invalid) invalid->push_back({summary->path, error.what()});
    }
  }
  return "";
}

std::string move_aside_corrupt(const std::string& path) {
  std::string aside = path + ".corrupt";
  std::error_code error;
  for (int n = 1; fs::exists(aside, error) || fs::is_symlink(aside, error); ++n) {
    aside = path + ".corrupt." + std::to_string(n);
  }
  fs::rename(path, aside, error);
  if (error) {
    THPC_FAIL("cannot move invalid checkpoint " << path << " aside to " << aside << ": "
                                                << error.message());
  }
  return aside;
}

std::vector<std::string> prune_checkpoints(const std::string& dir, int keep,
                                           const std::string& protected_path,
                                           int64_t every_steps, int64_t last_step) {
  THPC_CHECK(keep >= 1, "keep " << keep);
  const std::vector<CheckpointSummary> summaries = checkpoint_summaries(dir);
  std::error_code error;
  // The newest healthy one stays whatever `keep` says: it is what a diverged run resumes
  // from. So does the newest healthy one before the one just written, whose parameters
  // the next step has not judged yet (it marks them diverged if their loss is).
  const auto is_protected = [&](const CheckpointSummary& summary) {
    return fs::equivalent(summary.path, protected_path, error);
  };
  const auto newest_healthy =
      std::find_if(summaries.rbegin(), summaries.rend(), [](const CheckpointSummary& summary) {
        return summary.state == CheckpointState::Healthy;
      });
  const auto protected_at =
      std::find_if(summaries.rbegin(), summaries.rend(), is_protected);
  const auto known_good =
      std::find_if(protected_at == summaries.rend() ? summaries.rbegin() : std::next(protected_at),
                   summaries.rend(), [](const CheckpointSummary& summary) {
                     return summary.state == CheckpointState::Healthy;
                   });
  const auto must_stay = [&](const CheckpointSummary& summary) {
    const auto is = [&](auto found) { return found != summaries.rend() && &summary == &*found; };
    return is(newest_healthy) || is(known_good) || is_protected(summary);
  };
  // Deletion order: diverged and superseded, oldest first, then healthy, oldest first, of
  // these those off a schedule by steps before those on it.
  // (The run's last step is the schedule's: its final checkpoint, off the multiples when
  // train.max_steps is, counted as a stop's was not, kept keep + 1 files; a review's find.)
  const auto rank = [&](const CheckpointSummary& summary) {
    if (summary.state != CheckpointState::Healthy) return 0;
    const bool off = every_steps > 0 && summary.step % every_steps != 0 &&
                     !(last_step > 0 && summary.step == last_step);
    return off ? 1 : 2;
  };
  std::vector<const CheckpointSummary*> candidates;
  for (const int wanted : {0, 1, 2}) {
    for (const CheckpointSummary& summary : summaries) {
      if (rank(summary) != wanted) continue;
      if (!must_stay(summary)) candidates.push_back(&summary);
    }
  }
  // A checkpoint off a schedule by steps (a stop signal's) that has to stay, the newest or
  // the last known good, is not one of the schedule's `keep`: counted, it pushed the
  // averaged window's oldest step out when keep = average_last (a requeued job's stop
  // inside the window of the run's last N: average_lastN.h5 averaged N - 1). Once a newer
  // step stands in for it, it goes first.
  const auto counts_against_keep = [&](const CheckpointSummary& summary) {
    return !(rank(summary) == 1 && must_stay(summary));
  };
  std::vector<std::string> deleted;
  size_t remaining = static_cast<size_t>(
      std::count_if(summaries.begin(), summaries.end(), counts_against_keep));
  for (const CheckpointSummary* candidate : candidates) {
    if (remaining <= static_cast<size_t>(keep)) break;
    if (fs::remove(candidate->path, error)) {
      deleted.push_back(candidate->path);
      --remaining;
    }
  }
  return deleted;
}

namespace {

// Whether the configuration `checkpoint` stores has an empty data.dir (the synthetic
// task's), read from its text as Config::to_ini() writes it ("[data]", then "dir = ...").
// False when it stores none (an older average), or no data.dir line: not
// load_config_text, which gives a key the text lacks its default, an empty data.dir.
bool trained_on_the_synthetic_task(const Checkpoint& checkpoint) {
  std::istringstream lines(checkpoint.config_ini);
  std::string line;
  bool in_data = false;
  while (std::getline(lines, line)) {
    if (!line.empty() && line[0] == '[') {
      in_data = line.rfind("[data]", 0) == 0;
    } else if (in_data && line.rfind("dir =", 0) == 0) {
      return line.find_first_not_of(' ', 5) == std::string::npos ||
             line[line.find_first_not_of(' ', 5)] == '#';
    }
  }
  return false;
}

}  // namespace

Checkpoint average_checkpoints(const std::vector<std::string>& paths,
                               ProgressListener& progress) {
  THPC_CHECK(!paths.empty(), "no checkpoints to average");
  progress.begin("", "checkpoints read", static_cast<int64_t>(paths.size()));
  std::vector<std::vector<double>> sums;
  Checkpoint first;
  Checkpoint newest;
  std::string spm_model, spm_model_source;  // the inputs' SentencePiece model, if any has one
  std::string without_model_source;         // an input that stores none
  OneDirection direction;                   // the inputs' languages, if any records them
  std::string inputs;                       // "PATH (step S, run R), ...": kAveragedFrom's
  // The inputs' training and validation data, kept where every input names the same.
  std::set<std::string> corpora, validation_sets;
  for (size_t index = 0; index < paths.size(); ++index) {
    Checkpoint current = read_checkpoint(paths[index], CheckpointParts::ParamsOnly);
    corpora.insert(current.corpus_sha256);
    validation_sets.insert(current.valid_sha256);
    inputs += (index == 0 ? "" : ", ") +
              std::filesystem::absolute(paths[index]).lexically_normal().string() + " (step " +
              std::to_string(current.step) +
              (current.run_id.empty() ? std::string() : ", run " + current.run_id) + ")";
    // One vocabulary serves both directions: an en->de model averaged with a de->en one
    // was garbage, exit 0 (a helper's trial).
    if (const std::string other = direction.add(paths[index], current.direction);
        !other.empty()) {
      THPC_FAIL("cannot average checkpoints of two translation directions: " << other);
    }
    // Equal architectures with other vocabularies would average unrelated embeddings. A
    // checkpoint without a model written before models were stored (of the same corpus,
    // a run that straddled the change) fits any; a synthetic task's, whose ids are no
    // pieces of any model, beside one with a model is refused (an average took the other's
    // model without a word; a helper's finding).
    if (!current.spm_model.empty()) {
      if (spm_model.empty()) {
        spm_model = current.spm_model;
        spm_model_source = paths[index];
      } else if (const std::string difference = sentencepiece_vocabulary_difference(
                     spm_model, spm_model_source, current.spm_model, paths[index]);
                 !difference.empty()) {
        // As vocabularies, as the trainer judges a resume's shards: a model retrained to
        // the same pieces (its bytes other) is one vocabulary (a review's finding: such a
        // run's checkpoints before and after its resume were refused).
        THPC_FAIL("cannot average checkpoints of different SentencePiece vocabularies: "
                  << spm_model_source << " and " << paths[index] << " (" << difference
                  << "); average checkpoints of runs on one preprocessed corpus (data.dir)");
      }
    } else if (without_model_source.empty() && trained_on_the_synthetic_task(current)) {
      without_model_source = paths[index];
    }
    if (!spm_model.empty() && !without_model_source.empty()) {
      THPC_FAIL("cannot average " << spm_model_source << ", which stores the SentencePiece "
                << "model of its corpus, with " << without_model_source << ", a synthetic "
                << "task's (data.dir empty), whose token ids are no pieces of it; average "
                << "checkpoints of one run");
    }
    if (index == 0) {
      for (const NamedTensor& tensor : current.params) {
        sums.emplace_back(tensor.values.begin(), tensor.values.end());
      }
      first = current;
    } else {
      // Separate vocabularies: the source's model must be one too (the architecture's
      // source_vocab_size alone would take two models of one size).
      if (current.source_spm_model != first.source_spm_model) {
        THPC_FAIL("cannot average checkpoints of different source SentencePiece models: "
                  << paths.front() << " and " << paths[index]);
      }
      if (recorded_norm(current.architecture) != recorded_norm(first.architecture)) {
        THPC_FAIL("cannot average checkpoints of different layer-norm orders: "
                  << paths.front() << " has model.norm = " << recorded_norm(first.architecture)
                  << " but " << paths[index] << " has model.norm = "
                  << recorded_norm(current.architecture));
      }
      const std::string first_recorded = with_norm_recorded(first.architecture);
      const std::string current_recorded = with_norm_recorded(current.architecture);
      if (current_recorded != first_recorded) {
        THPC_FAIL("cannot average checkpoints of different architectures: "
                  << architecture_differences(first_recorded, paths.front(), current_recorded,
                                              paths[index]));
      }
      if (current.params.size() != first.params.size()) {
        THPC_FAIL("cannot average " << paths.front() << " and " << paths[index] << ": they hold "
                                    << first.params.size() << " and " << current.params.size()
                                    << " parameters");
      }
      for (size_t t = 0; t < current.params.size(); ++t) {
        const NamedTensor& a = first.params[t];
        const NamedTensor& b = current.params[t];
        if (a.name != b.name || a.rows != b.rows || a.cols != b.cols) {
          THPC_FAIL("cannot average " << paths.front() << " and " << paths[index] << ": "
                                      << a.name << " " << a.rows << "x" << a.cols << " vs "
                                      << b.name << " " << b.rows << "x" << b.cols);
        }
        for (size_t i = 0; i < b.values.size(); ++i) sums[t][i] += b.values[i];
      }
    }
    if (index == 0 || current.step >= newest.step) {
      current.params.clear();  // only the metadata of the newest is kept
      newest = std::move(current);
    }
    progress.advance(1);
  }
  progress.end();
  // The newest input's step and settings; not its run's state (its validations, loss,
  // divergence state), which is no state of the average's, nor its int8 copies: a
  // quantized input's parameters were averaged as read, dequantized, and the average is
  // a float checkpoint (transformer_quantize makes an int8 one of it).
  Checkpoint average = derived_checkpoint_of(newest);
  // Which files it averages, in the head of its configuration (where the run's own lines
  // say what trained them): the file kept no trace of them (a helper's walk).
  average.config_ini = with_header_lines(average.config_ini,
                                         {header_line(kAveragedFrom, inputs)});
  // ... and the data they were trained on, where they agree (a model handed on as its
  // average said nothing of its data; a helper's walk).
  if (corpora.size() == 1) average.corpus_sha256 = *corpora.begin();
  if (validation_sets.size() == 1) average.valid_sha256 = *validation_sets.begin();
  average.params = std::move(first.params);
  average.spm_model = std::move(spm_model);
  average.source_spm_model = first.source_spm_model;
  average.direction = direction.direction();
  const double count = static_cast<double>(paths.size());
  for (size_t t = 0; t < average.params.size(); ++t) {
    std::vector<float>& values = average.params[t].values;
    for (size_t i = 0; i < values.size(); ++i) {
      values[i] = static_cast<float>(sums[t][i] / count);
    }
  }
  return average;
}

}  // namespace thpc
