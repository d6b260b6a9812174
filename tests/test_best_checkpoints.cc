// The k best checkpoints by the validation metric (checkpoint.keep_best_count) and their
// average (checkpoint.average_best, transformer_average --best N): the set over a sequence
// of validations (a better score replaces the worst, equal scores keep the earlier step,
// lower perplexity but higher BLEU is better), the score stored inside each file and
// checked against its header, the files surviving the rotation of checkpoint.keep and a
// resume, the run's average bit for bit that of transformer_average on the same files,
// and the errors a user can make with transformer_average (the configuration's are in
// test_config).
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "checkpoint/checkpoint_directory.h"
#include "train/stop_request.h"
#include "common/error.h"
#include "config/config.h"
#include "train/trainer.h"
#include "expect_error.h"
#include "file_bytes.h"
#include "program.h"
#include "scoped_environment.h"
#include "scratch_directory.h"

namespace thpc {
namespace {

namespace fs = std::filesystem;

const std::string kAverager = thpc::binary_dir() + "/transformer_average";

// ---- the set, over a sequence of validations ----

// The steps of the best set after each validation of `scores` (the i-th at step 10 * (i +
// 1)), best first, when every change_best_set() is carried out on an in-memory "disk".
std::vector<std::vector<int64_t>> best_sets_over(const std::vector<double>& scores,
                                                 const std::string& metric, int count) {
  std::vector<CheckpointSummary> disk;
  std::vector<std::vector<int64_t>> sets;
  for (size_t i = 0; i < scores.size(); ++i) {
    const int64_t step = 10 * static_cast<int64_t>(i + 1);
    const BestSetChange change = change_best_set(disk, {metric, scores[i]}, step, count);
    for (const CheckpointSummary& removed : change.removed) {
      disk.erase(std::remove_if(disk.begin(), disk.end(),
                                [&](const CheckpointSummary& s) { return s.path == removed.path; }),
                 disk.end());
    }
    if (change.admitted) {
      CheckpointSummary written;
      written.path = best_checkpoint_file_name(step);
      written.step = step;
      written.validation = ValidationScore{metric, scores[i]};
      disk.push_back(written);
    }
    EXPECT_LE(static_cast<int>(disk.size()), count);
    rank_best_checkpoints(disk);
    std::vector<int64_t> steps;
    for (const CheckpointSummary& summary : disk) steps.push_back(summary.step);
    if (change.admitted) {
      EXPECT_EQ(steps[change.rank - 1], step) << "the rank it was admitted at";
    }
    sets.push_back(steps);
  }
  return sets;
}

TEST(BestSet, AHigherBleuReplacesTheWorstOfTheK) {
  const std::vector<std::vector<int64_t>> sets =
      best_sets_over({10, 20, 15, 5, 25, 18, 30}, "bleu", 3);
  const std::vector<std::vector<int64_t>> expected = {
      {10}, {20, 10}, {20, 30, 10},
      {20, 30, 10},   // 5 is worse than all three: not kept
      {50, 20, 30},   // 25 replaces 10 (step 10)
      {50, 20, 60},   // 18 replaces 15 (step 30)
      {70, 50, 20}};  // 30 replaces 18
  EXPECT_EQ(sets, expected);
}

// chrF ranks as BLEU does, higher the better (a mutation audit made it lower-is-better:
// keep_best = chrf with keep_best_count > 1 kept, and averaged, the worst, and every test
// passed; none ranked chrF).
TEST(BestSet, AHigherChrfReplacesTheWorstOfTheKAsBleuDoes) {
  EXPECT_EQ(best_sets_over({10, 20, 15, 5, 25, 18, 30}, "chrf", 3),
            best_sets_over({10, 20, 15, 5, 25, 18, 30}, "bleu", 3));
  EXPECT_TRUE(lower_is_better("ppl"));
  EXPECT_FALSE(lower_is_better("bleu"));
  EXPECT_FALSE(lower_is_better("chrf"));
}

TEST(BestSet, ALowerPerplexityIsTheBetterOne) {
  // The same numbers as perplexities: the order turns round.
  const std::vector<std::vector<int64_t>> sets =
      best_sets_over({10, 20, 15, 5, 25, 18, 30}, "ppl", 3);
  const std::vector<std::vector<int64_t>> expected = {
      {10}, {10, 20}, {10, 30, 20}, {40, 10, 30}, {40, 10, 30}, {40, 10, 30}, {40, 10, 30}};
  EXPECT_EQ(sets, expected);
}

TEST(BestSet, EqualScoresKeepTheEarlierStep) {
  // A later equal score is no improvement (as for best.h5): it enters only while there
  // is room, ranks after the earlier one, and never pushes an equal one out.
  const std::vector<std::vector<int64_t>> sets = best_sets_over({7, 7, 7, 8, 7}, "bleu", 2);
  const std::vector<std::vector<int64_t>> expected = {
      {10}, {10, 20}, {10, 20}, {40, 10}, {40, 10}};
  EXPECT_EQ(sets, expected);
  // Perplexity: the same rule.
  EXPECT_EQ(best_sets_over({3, 3, 2}, "ppl", 2),
            (std::vector<std::vector<int64_t>>{{10}, {10, 20}, {30, 10}}));
}

TEST(BestSet, ScoresThatAreNotFiniteAreNeverKept) {
  EXPECT_EQ(best_sets_over({NAN, INFINITY, 4}, "ppl", 2),
            (std::vector<std::vector<int64_t>>{{}, {}, {30}}));
}

TEST(BestSet, AStepValidatedAgainReplacesItsOwnEntry) {
  // A resumed (or rolled-back) run validates a step the set already holds: the new score
  // stands for that step, whether better or worse.
  std::vector<CheckpointSummary> disk;
  for (const auto& [step, value] : std::vector<std::pair<int64_t, double>>{{10, 5}, {20, 9}}) {
    CheckpointSummary summary;
    summary.path = best_checkpoint_file_name(step);
    summary.step = step;
    summary.validation = ValidationScore{"bleu", value};
    disk.push_back(summary);
  }
  BestSetChange change = change_best_set(disk, {"bleu", 4}, 20, 2);
  EXPECT_TRUE(change.admitted);  // written over the old step-20 file
  EXPECT_EQ(change.rank, 2);
  EXPECT_TRUE(change.removed.empty());
  // With no room left (a smaller keep_best_count after a resume), the worst goes, and an
  // old entry of the step that does not make it is removed rather than left stale.
  change = change_best_set(disk, {"bleu", 4}, 20, 1);
  EXPECT_FALSE(change.admitted);
  ASSERT_EQ(change.removed.size(), 1u);
  EXPECT_EQ(change.removed[0].step, 20);
  // A new step that does not make it changes nothing but the set's size: step 20's 9
  // stays, step 10's 5 is no longer among the 1 best.
  change = change_best_set(disk, {"bleu", 1}, 30, 1);
  EXPECT_FALSE(change.admitted);
  ASSERT_EQ(change.removed.size(), 1u);
  EXPECT_EQ(change.removed[0].step, 10);
}

// ---- the files ----

class BestCheckpointFiles : public ScratchDirectoryTest {};

// A checkpoint of two tensors, every value `value`, kept for `score` of `metric`.
Checkpoint scored_checkpoint(float value, int64_t step, const std::string& metric, double score) {
  Checkpoint checkpoint;
  checkpoint.step = step;
  checkpoint.architecture = "layers=1 test";
  checkpoint.config_ini = "[model]\n";
  checkpoint.params.push_back({"a.weight", 3, 4, std::vector<float>(12, value)});
  checkpoint.params.push_back({"b.bias", 1, 5, std::vector<float>(5, value)});
  checkpoint.adam_m = checkpoint.adam_v = checkpoint.params;
  checkpoint.validation = ValidationScore{metric, score};
  return checkpoint;
}

std::string file_name_of(const std::string& path) { return fs::path(path).filename().string(); }

TEST_F(BestCheckpointFiles, TheScoreIsStoredInsideAndCheckedAgainstTheHeader) {
  const std::string file = path(best_checkpoint_file_name(40));
  write_checkpoint(file, scored_checkpoint(1.0f, 40, "bleu", 24.314159265358979));
  const Checkpoint read = read_checkpoint(file);
  ASSERT_TRUE(read.validation.has_value());
  EXPECT_EQ(read.validation->metric, "bleu");
  EXPECT_EQ(read.validation->value, 24.314159265358979);  // bit for bit, both copies
  const std::optional<CheckpointSummary> summary = read_checkpoint_summary(file);
  ASSERT_TRUE(summary && summary->validation);
  EXPECT_EQ(summary->validation->value, 24.314159265358979);
  EXPECT_EQ(file_name_of(file), "best_step_00000040.h5");
  EXPECT_TRUE(is_best_checkpoint_name(file));
  EXPECT_FALSE(is_step_checkpoint_name(file));  // outside the rotation and resume=auto
  EXPECT_TRUE(is_run_checkpoint_file(file));     // a run's own file (checkpoint.overwrite)
  EXPECT_TRUE(is_run_checkpoint_file(path("average_best3.h5")));

  // The header is outside the checksum: a header whose score is not the file's is damage.
  std::fstream bytes(file, std::ios::in | std::ios::out | std::ios::binary);
  std::string head(512, '\0');
  bytes.read(head.data(), 512);
  const size_t at = head.find("valid bleu 24.");
  ASSERT_NE(at, std::string::npos) << head;
  head[at + 11] = '9';  // 94.31...: would rank it first
  bytes.seekp(0);
  bytes.write(head.data(), 512);
  bytes.close();
  expect_error([&] { read_checkpoint(file); },
               {"checkpoint " + file, "damaged file header", "validation score"});
  // Averages are of no validation.
  write_checkpoint(path("b.h5"), scored_checkpoint(3.0f, 50, "bleu", 20.0));
  EXPECT_FALSE(average_checkpoints({path("b.h5")}).validation.has_value());
}

TEST_F(BestCheckpointFiles, TheBestAreRankedByTheScoreInsideNotByName) {
  // Steps (names) in one order, scores in another.
  const std::vector<std::pair<int64_t, double>> kept = {{10, 3.5}, {20, 2.5}, {30, 4.0}, {40, 3.0}};
  for (const auto& [step, ppl] : kept) {
    write_checkpoint(path("run/" + best_checkpoint_file_name(step)),
                     scored_checkpoint(static_cast<float>(step), step, "ppl", ppl));
  }
  // Neither a step checkpoint nor best.h5 counts.
  write_checkpoint(path("run/step_00000050.h5"), scored_checkpoint(0.0f, 50, "ppl", 1.0));
  write_checkpoint(path("run/best.h5"), scored_checkpoint(0.0f, 50, "ppl", 1.0));
  std::vector<int64_t> ranked;
  for (const CheckpointSummary& summary : best_checkpoint_summaries(path("run"))) {
    ranked.push_back(summary.step);
  }
  EXPECT_EQ(ranked, (std::vector<int64_t>{20, 40, 10, 30}));

  // The 3 best, oldest step first (the order every average of them sums in).
  std::string metric;
  const std::vector<std::string> best3 = best_checkpoints(path("run"), 3, &metric);
  EXPECT_EQ(metric, "ppl");
  ASSERT_EQ(best3.size(), 3u);
  EXPECT_EQ(file_name_of(best3[0]), "best_step_00000010.h5");
  EXPECT_EQ(file_name_of(best3[1]), "best_step_00000020.h5");
  EXPECT_EQ(file_name_of(best3[2]), "best_step_00000040.h5");

  const ProcessResult best = run_process(kAverager + " --inputs " + path("run") +
                                         " --best 3 --output " + path("best3.h5"));
  ASSERT_EQ(best.exit_code, 0) << best.output;
  EXPECT_NE(best.output.find("averaged 3 best (by valid ppl) checkpoints"), std::string::npos)
      << best.output;
  const Checkpoint average = read_checkpoint(path("best3.h5"), CheckpointParts::ParamsOnly);
  for (const NamedTensor& tensor : average.params) {
    for (const float value : tensor.values) {
      EXPECT_EQ(value, static_cast<float>((10.0 + 20.0 + 40.0) / 3.0)) << tensor.name;
    }
  }
  EXPECT_EQ(average.step, 40);
}

TEST_F(BestCheckpointFiles, AveragingTheBestRefusesWhatItCannotDoInOneLine) {
  for (const auto& [step, bleu] : std::vector<std::pair<int64_t, double>>{{10, 3.0}, {20, 5.0}}) {
    write_checkpoint(path("run/" + best_checkpoint_file_name(step)),
                     scored_checkpoint(1.0f, step, "bleu", bleu));
  }
  const auto refused = [&](const std::string& arguments, const std::vector<std::string>& fragments) {
    const ProcessResult result = run_process(kAverager + " " + arguments + " 2>&1");
    EXPECT_EQ(result.exit_code, 2) << arguments << "\n" << result.output;
    EXPECT_EQ(lines_of(result.output).size(), 1u) << result.output;
    for (const std::string& fragment : fragments) {
      EXPECT_NE(result.output.find(fragment), std::string::npos) << fragment << "\n" << result.output;
    }
  };
  refused("--inputs " + path("run") + " --best 3 --output " + path("out.h5"),
          {path("run"), "holds 2 best checkpoints", "--best asks for 3", "smaller N"});
  // A run that kept none is told so, not to ask for fewer (before: "holds 0 best
  // checkpoints ...: give a smaller N").
  std::filesystem::create_directories(path("kept_none"));
  refused("--inputs " + path("kept_none") + " --best 5 --output " + path("out.h5"),
          {path("kept_none") + " holds no best checkpoints", "the run kept none",
           "checkpoint.keep_best = ppl, bleu, chrf or f1", "--last N instead"});
  refused("--inputs " + path("run") + " --best 2 --last 2 --output " + path("out.h5"),
          {"--last and --best", "give one"});
  refused("--inputs " + path("run/best_step_00000010.h5") + " --best 1 --output " + path("out.h5"),
          {"--best selects from a directory, and --inputs", "is a file"});
  // Said as it is (both were told to "give --inputs DIR", which they had).
  refused("--inputs " + path("nothere") + " --last 2 --output " + path("out.h5"),
          {"--inputs " + path("nothere") + ": no such directory"});
  refused("--inputs " + path("run") + " " + path("run") + " --last 1 --output " + path("out.h5"),
          {"--last selects from one directory, and --inputs gives 2 paths"});
  refused("--inputs " + path("run") + " --best 1 --output " + path("run/best_step_00000030.h5"),
          {"best_step_*.h5"});
  // Two metrics in one directory cannot be ranked together.
  write_checkpoint(path("run/" + best_checkpoint_file_name(30)),
                   scored_checkpoint(1.0f, 30, "ppl", 3.0));
  refused("--inputs " + path("run") + " --best 1 --output " + path("out.h5"),
          {"different metrics", "valid bleu", "valid ppl"});
  // A run that keeps the best by one of them (a resume that changed checkpoint.keep_best)
  // averages its metric's and passes over the other's, as its ranking does (before: no
  // average of the best at all, a warning).
  std::string metric;
  EXPECT_EQ(best_checkpoints(path("run"), 2, &metric, "ppl"),
            std::vector<std::string>{path("run/" + best_checkpoint_file_name(30))});
  EXPECT_EQ(metric, "ppl");
  EXPECT_EQ(best_checkpoints(path("run"), 5, &metric, "bleu").size(), 2u);
  EXPECT_EQ(metric, "bleu");
}

// ---- training ----

// The default job's corpus at a small size (tests/program.h), shared by the suite.
class BestCheckpointsTraining : public ScratchDirectoryTest {
 protected:
  static void SetUpTestSuite() {
    corpus_ = fs::temp_directory_path() / ("thpc_test_best_corpus_" + std::to_string(::getpid()));
    fs::create_directories(corpus_);
    const ProcessResult corpus = run_process(small_numbers_corpus_command(corpus_));
    ASSERT_EQ(corpus.exit_code, 0) << corpus.output;
  }
  static void TearDownTestSuite() { fs::remove_all(corpus_); }

  // input/numbers.ini shrunk to one layer per stack, validating every 2 steps, saving
  // every 3 and keeping only the newest (so that the rotation passes over the best), the 3
  // best kept and averaged. A high learning rate makes the perplexity go down and up
  // again, so that the best are not the last.
  // `changes` ("key=value") replace these settings or add to them.
  Config config(const std::string& run, const std::vector<std::string>& changes = {}) const {
    std::map<std::string, std::string> settings = {
        {"data.dir", (corpus_ / "data").string()}, {"model.layers", "1"},
        {"train.max_steps", "16"}, {"train.warmup_steps", "4"}, {"train.lr_scale", "4"},
        {"train.valid_every", "2"}, {"train.valid_bleu", "false"}, {"train.log_every", "4"},
        {"checkpoint.every_steps", "3"}, {"checkpoint.keep", "1"},
        {"checkpoint.keep_best", "ppl"}, {"checkpoint.keep_best_count", "3"},
        {"checkpoint.average_best", "3"}, {"checkpoint.dir", path(run)},
        {"train.metrics_dir", path(run)}};
    for (const std::string& change : changes) {
      const size_t equals = change.find('=');
      settings[change.substr(0, equals)] = change.substr(equals + 1);
    }
    std::vector<std::string> overrides;
    for (const auto& [key, value] : settings) overrides.push_back(key + "=" + value);
    return load_config(std::string(THPC_SOURCE_DIR) + "/input/numbers.ini", overrides);
  }

  // valid_METRIC of each "valid" record of RUN/metrics.jsonl (full precision), by step.
  std::map<int64_t, double> logged(const std::string& run, const std::string& metric) const {
    std::map<int64_t, double> scores;
    const std::regex record(R"re("kind": "valid", "step": (\d+),.*"valid_)re" + metric +
                            R"re(": ([-+0-9.eE]+))re");
    for (const std::string& line : lines_of(read_file(path(run + "/metrics.jsonl")))) {
      std::smatch match;
      if (std::regex_search(line, match, record)) scores[std::stoll(match[1])] = std::stod(match[2]);
    }
    return scores;
  }

  // The steps of the best_step_*.h5 files of RUN, in step order.
  std::vector<int64_t> kept_steps(const std::string& run) const {
    std::vector<int64_t> steps;
    for (const CheckpointSummary& s : best_checkpoint_summaries(path(run))) steps.push_back(s.step);
    std::sort(steps.begin(), steps.end());
    return steps;
  }

  static inline fs::path corpus_;
};

// The `count` best steps of `scores`, computed here from the log: lower perplexity or
// higher BLEU first, the earlier step for equal scores; in step order.
std::vector<int64_t> best_steps_of(const std::map<int64_t, double>& scores, bool lower_better,
                                   size_t count) {
  std::vector<std::pair<int64_t, double>> all(scores.begin(), scores.end());
  std::stable_sort(all.begin(), all.end(), [&](const auto& a, const auto& b) {
    return lower_better ? a.second < b.second : a.second > b.second;
  });
  std::vector<int64_t> steps;
  for (size_t i = 0; i < all.size() && i < count; ++i) steps.push_back(all[i].first);
  std::sort(steps.begin(), steps.end());
  return steps;
}

void expect_same_tensors(const std::vector<NamedTensor>& a, const std::vector<NamedTensor>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t t = 0; t < a.size(); ++t) {
    EXPECT_EQ(a[t].name, b[t].name);
    ASSERT_EQ(a[t].values.size(), b[t].values.size());
    EXPECT_EQ(std::memcmp(a[t].values.data(), b[t].values.data(), a[t].values.size() * 4), 0)
        << a[t].name;
  }
}

// A validation whose loss is not finite (parameters gone NaN under a huge learning rate,
// divergence = skip) is a divergence whatever train.divergence_loss_factor (0 judges only
// a non-finite loss), and no best: its BLEU of 0 made best.h5 and best_step_*.h5 of NaN
// parameters, best.h5 marked healthy (a helper's trial).
TEST_F(BestCheckpointsTraining, AValidationWhoseLossIsNotFiniteIsNoBest) {
  std::ostringstream log;
  Trainer trainer(config("nan", {"train.max_steps=4", "train.lr_scale=3e38",
                                 "train.divergence=skip", "train.divergence_limit=2",
                                 "train.valid_every=1", "train.valid_bleu=true",
                                 "checkpoint.keep_best=bleu", "checkpoint.keep_best_count=1",
                                 "checkpoint.average_best=1", "train.divergence_loss_factor=0",
                                 "train.warmup_steps=1"}));
  trainer.run(log);
  EXPECT_NE(log.str().find("warning: the validation at step 1 has a loss that is not finite "
                           "(nan): the checkpoints after step 0 are marked diverged"),
            std::string::npos)
      << log.str();
  EXPECT_FALSE(fs::exists(path("nan/best.h5"))) << log.str();
  EXPECT_EQ(kept_steps("nan"), std::vector<int64_t>{}) << log.str();
  EXPECT_NE(log.str().find("best valid bleu n/a"), std::string::npos) << log.str();
  // A run whose every validation was not finite ends without an average of the best, and
  // says why (average_best's warning said "no validation of ppl ran" of ones that ran).
  const ScopedEnvironment nan_validation("THPC_TEST_VALID_NLL_AT", "2:nan");
  std::ostringstream ended;
  Trainer to_the_end(config("nan_end", {"train.max_steps=2", "checkpoint.keep_best_count=1",
                                        "checkpoint.average_best=1"}));
  EXPECT_EQ(to_the_end.run(ended), RunEnd::Finished) << ended.str();
  EXPECT_NE(ended.str().find("warning: no average of the best written: no best checkpoint in " +
                             path("nan_end") + " (no validation of ppl gave a finite value: "),
            std::string::npos)
      << ended.str();
}

// A best.h5 damaged while the run was stopped stayed, and the resumed run's summary went
// on reporting its score (issue 54): it is moved aside with a warning, the best value
// dropped with it, and the next validation writes best.h5 again.
TEST_F(BestCheckpointsTraining, ADamagedBestCheckpointIsMovedAsideOnResumeAndWrittenAgain) {
  std::ostringstream first_log;
  Trainer(config("run", {"train.max_steps=8"})).run(first_log);
  const std::string best = path("run/best.h5");
  ASSERT_TRUE(fs::exists(best)) << first_log.str();
  fs::resize_file(best, fs::file_size(best) / 2);
  std::ostringstream log;
  Trainer(config("run", {"train.max_steps=12", "checkpoint.resume=auto"})).run(log);
  EXPECT_NE(log.str().find("warning: " + best + " is damaged ("), std::string::npos) << log.str();
  EXPECT_NE(log.str().find("moved aside to " + best + ".corrupt. The run's best valid ppl so far "
                           "is dropped with it"),
            std::string::npos)
      << log.str();
  const Checkpoint rewritten = read_checkpoint(best);  // whole again
  EXPECT_GT(rewritten.step, 8) << log.str();
  EXPECT_TRUE(fs::exists(best + ".corrupt"));
}

// A best.h5 a later version wrote (a validation of it, then the job requeued under this
// one) is not damaged: left as it is with a note, the run's best value kept (before: moved
// aside as best.h5.corrupt, and the best value dropped; a review's reproduction). Its
// header holds a line of a key this version does not know.
TEST_F(BestCheckpointsTraining, ALaterVersionsBestCheckpointIsLeftAsItIsOnResume) {
  std::ostringstream first_log;
  Trainer(config("run", {"train.max_steps=8"})).run(first_log);
  const std::string best = path("run/best.h5");
  ASSERT_TRUE(fs::exists(best)) << first_log.str();
  edit_header(best, [](std::string& header) {
    header.replace(header.find('\0'), 11, "ema 0.9999\n");
  });
  std::ostringstream log;
  Trainer(config("run", {"train.max_steps=9", "checkpoint.resume=auto"})).run(log);
  EXPECT_NE(log.str().find("note: checkpoint " + best + ": its file header holds what this "
                           "version does not know (a later version's header?): a 'ema' line"),
            std::string::npos)
      << log.str();
  EXPECT_NE(log.str().find("; " + best + " is left as it is\n"), std::string::npos) << log.str();
  EXPECT_EQ(log.str().find(best + " is damaged ("), std::string::npos) << log.str();
  EXPECT_FALSE(fs::exists(best + ".corrupt"));
  EXPECT_TRUE(fs::exists(best));
}

// A validation whose perplexity exploded (its log more than train.divergence_loss_factor
// times the best's) while the training loss had not yet crossed the detector's line: the
// checkpoints from after the last passed validation are marked diverged, so that the one
// named to resume from, and the one pruning keeps, is not one of them (issue 54: with
// keep = 2 a run named a checkpoint of valid ppl 5e8 where the pruned one had 121).
TEST_F(BestCheckpointsTraining, AValidationThatExplodedMarksTheCheckpointsSinceTheLastPassedOne) {
  ::setenv("THPC_TEST_VALID_NLL_AT", "8:50", 1);  // the validation at step 8: ppl e^50
  std::ostringstream log;
  Trainer(config("run", {"train.max_steps=8", "checkpoint.every_steps=2", "checkpoint.keep=2",
                         "checkpoint.keep_best_count=0", "checkpoint.average_best=0"}))
      .run(log);
  ::unsetenv("THPC_TEST_VALID_NLL_AT");
  EXPECT_NE(log.str().find("warning: the validation at step 8 has a perplexity of 5.185e+21, "
                           "its log more than train.divergence_loss_factor = 4 times the best's"),
            std::string::npos)
      << log.str();
  std::map<int64_t, CheckpointState> states;
  for (const CheckpointSummary& summary : checkpoint_summaries(path("run"))) {
    states[summary.step] = summary.state;
  }
  const std::map<int64_t, CheckpointState> expected = {{6, CheckpointState::Healthy},
                                                       {8, CheckpointState::Diverged}};
  EXPECT_EQ(states, expected) << log.str();
  EXPECT_NE(log.str().find("checkpoint to resume from: " + path("run/step_00000006.h5")),
            std::string::npos)
      << log.str();
  // The run ends at its last step, but said not to end with a model to use (its end was
  // read as a good one).
  EXPECT_NE(log.str().find("warning: the run's last validation failed: its checkpoints after "
                           "step 6 (the last validation it passed) are marked diverged"),
            std::string::npos)
      << log.str();
  // --eval scores a diverged checkpoint all the same (its score is the diagnosis) and
  // says that it is marked so; a healthy one without the note.
  for (const std::string step : {"6", "8"}) {
    const std::string checkpoint = path("run/step_0000000" + step + ".h5");
    const ProcessResult eval = run_process(
        thpc::binary_dir() + "/transformer_hpc " THPC_SOURCE_DIR "/input/numbers.ini --data.dir=" +
        (corpus_ / "data").string() + " --model.layers=1 --eval " + checkpoint);
    EXPECT_EQ(eval.exit_code, 0) << eval.output;
    EXPECT_NE(eval.output.find("evaluated " + checkpoint + " (step " + step + ") on "),
              std::string::npos)
        << eval.output;
    EXPECT_NE(eval.output.find("\nvalid step " + step + " | loss "), std::string::npos)
        << eval.output;
    const std::string note = "note: " + checkpoint + " is marked diverged: its run judged its "
                             "parameters diverged";
    EXPECT_EQ(eval.output.find(note) != std::string::npos, step == "8") << eval.output;
  }
}

// A resume whose checkpoint.keep_best_count, from the config file, is lower than the run's:
// refused (exit 2), as its next validation would delete the best checkpoints beyond it;
// the same value given on the command line deletes them (CheckpointTest's
// AResumeWhoseKeepIsLowerThanTheRunsDeletesNothingUnlessToldOnTheCommandLine for
// checkpoint.keep).
TEST_F(BestCheckpointsTraining, AResumeWhoseKeepBestCountIsLowerDeletesNothingUnlessTold) {
  {
    std::ofstream ini(path("two_best.ini"));
    ini << read_file(THPC_SOURCE_DIR "/input/numbers.ini") << "keep_best_count = 2\n";
  }
  const std::string run = path("run");
  const std::string start =
      thpc::binary_dir() + "/transformer_hpc " + path("two_best.ini") + " --data.dir=" +
      (corpus_ / "data").string() + " --model.layers=1 --checkpoint.dir=" + run +
      " --train.metrics_dir=" + run + " --train.valid_every=2 --train.warmup_steps=4 " +
      "--checkpoint.every_steps=2 --checkpoint.keep_best=ppl --train.valid_bleu=false";
  // Lowered from 3 to 2 where 2 are kept: nothing to delete, not refused.
  const ProcessResult two =
      run_process(start + " --train.max_steps=4 --checkpoint.keep_best_count=3");
  ASSERT_EQ(two.exit_code, 0) << two.output;
  ASSERT_EQ(best_checkpoint_summaries(run).size(), 2u) << two.output;
  const ProcessResult kept_two =
      run_process(start + " --train.max_steps=5 --checkpoint.resume=auto");
  EXPECT_EQ(kept_two.exit_code, 0) << kept_two.output;
  // Three kept by a run of 3: the file's 2 would delete one.
  const ProcessResult three = run_process(start + " --train.max_steps=8 --checkpoint.resume=auto " +
                                          "--checkpoint.keep_best_count=3");
  ASSERT_EQ(three.exit_code, 0) << three.output;
  ASSERT_EQ(best_checkpoint_summaries(run).size(), 3u) << three.output;
  const ProcessResult refused =
      run_process(start + " --train.max_steps=10 --checkpoint.resume=auto");
  EXPECT_EQ(refused.exit_code, 2) << refused.output;
  EXPECT_NE(refused.output.find("checkpoint.keep_best_count = 2 (not given on the command line) "
                                "is lower than the 3 of the run that wrote "),
            std::string::npos)
      << refused.output;
  EXPECT_NE(refused.output.find(": its next validation would delete at least 1 of the 3 "
                                "best_step_*.h5 of ppl in " + run + " (the worst first); give "
                                "--checkpoint.keep_best_count=2 on the command line"),
            std::string::npos)
      << refused.output;
  EXPECT_EQ(best_checkpoint_summaries(run).size(), 3u);
  const ProcessResult told = run_process(start + " --train.max_steps=10 --checkpoint.resume=auto "
                                         "--checkpoint.keep_best_count=2");
  EXPECT_EQ(told.exit_code, 0) << told.output;
  EXPECT_EQ(best_checkpoint_summaries(run).size(), 2u) << told.output;
}

TEST_F(BestCheckpointsTraining, TheRunKeepsTheKBestApartFromTheLastAndAveragesExactlyThose) {
  std::ostringstream log;
  Trainer(config("run")).run(log);
  const std::map<int64_t, double> ppl = logged("run", "ppl");
  ASSERT_EQ(ppl.size(), 8u) << log.str();
  const std::vector<int64_t> best = best_steps_of(ppl, true, 3);
  EXPECT_EQ(kept_steps("run"), best) << log.str();
  // Not trivially the last three: the comparison says something.
  EXPECT_NE(best, (std::vector<int64_t>{12, 14, 16})) << log.str();
  // The rotation (checkpoint.keep = 1) kept the newest step checkpoint and the last known
  // good one before it (prune_checkpoints), and no best one was lost.
  EXPECT_EQ(list_checkpoints(path("run")).size(), 2u);
  for (const CheckpointSummary& s : best_checkpoint_summaries(path("run"))) {
    const Checkpoint file = read_checkpoint(s.path);  // the whole state, verified
    ASSERT_TRUE(file.validation.has_value());
    EXPECT_EQ(file.validation->metric, "ppl");
    EXPECT_EQ(file.validation->value, ppl.at(s.step));  // the logged value, bit for bit
    EXPECT_EQ(file.adam_m.size(), file.params.size());
  }
  EXPECT_NE(log.str().find("removed best checkpoint "), std::string::npos) << log.str();
  EXPECT_NE(log.str().find("average of the 3 best checkpoints by valid ppl written to " +
                           path("run/average_best3.h5")),
            std::string::npos)
      << log.str();

  // The run's average is transformer_average's on the same files, bit for bit, whether
  // it chooses them (--best 3) or is given them.
  const Checkpoint run_average = read_checkpoint(path("run/average_best3.h5"), CheckpointParts::ParamsOnly);
  std::string files;
  for (const int64_t step : best) files += " " + path("run/" + best_checkpoint_file_name(step));
  for (const std::string& arguments : {"--inputs " + path("run") + " --best 3", "--inputs" + files}) {
    const std::string output = path("tool_" + std::to_string(arguments.size()) + ".h5");
    const ProcessResult tool = run_process(kAverager + " " + arguments + " --output " + output);
    ASSERT_EQ(tool.exit_code, 0) << tool.output;
    expect_same_tensors(read_checkpoint(output, CheckpointParts::ParamsOnly).params,
                        run_average.params);
  }
}

TEST_F(BestCheckpointsTraining, AResumedRunContinuesTheSetFromTheFiles) {
  std::ostringstream whole;
  Trainer(config("whole")).run(whole);
  // Stopped at step 11 (after the validation of step 10, before step 12's, with 3 best
  // files on disk and others removed), then resumed from step 11's checkpoint: the second
  // process knows the set only from the files it finds.
  // Each part under a guard of its own, which clears the stop request of the part before
  // (a process resumes with none).
  std::ostringstream first, second;
  {
    const StopSignalGuard signals;
    ::setenv("THPC_TEST_STOP_AT_STEP", "11", 1);
    Trainer(config("split")).run(first);
    ::unsetenv("THPC_TEST_STOP_AT_STEP");
  }
  ASSERT_NE(first.str().find("stopped: SIGTERM received; step=11"), std::string::npos) << first.str();
  {
    const StopSignalGuard signals;
    Trainer(config("split", {"checkpoint.resume=auto"})).run(second);
  }
  ASSERT_NE(second.str().find("resumed from "), std::string::npos) << second.str();
  EXPECT_EQ(kept_steps("split"), kept_steps("whole")) << whole.str() << second.str();
  for (const int64_t step : kept_steps("whole")) {
    const std::string name = best_checkpoint_file_name(step);
    const Checkpoint a = read_checkpoint(path("whole/" + name));
    const Checkpoint b = read_checkpoint(path("split/" + name));
    expect_same_tensors(a.params, b.params);
    expect_same_tensors(a.adam_m, b.adam_m);
    EXPECT_EQ(a.validation->value, b.validation->value);
  }
  expect_same_tensors(read_checkpoint(path("split/average_best3.h5"), CheckpointParts::ParamsOnly).params,
                      read_checkpoint(path("whole/average_best3.h5"), CheckpointParts::ParamsOnly).params);
}

// A resume from an older checkpoint starts another branch with the checkpoint's best
// values: the best files of the branch it leaves (later steps) move into
// best_of_branch_left_at_STEP/, where the next best.h5 cannot write over a better one of
// theirs and average_best cannot mix them with the new branch's (a note of the fine-tuning
// walk); those of steps the checkpoint was trained through stay.
TEST_F(BestCheckpointsTraining, AResumeFromAnOlderCheckpointSetsTheLeftBranchsBestFilesAside) {
  std::ostringstream first;
  Trainer(config("run", {"train.max_steps=12", "checkpoint.keep=6"})).run(first);
  const std::vector<int64_t> before = kept_steps("run");
  ASSERT_FALSE(before.empty()) << first.str();
  const int64_t best_h5_step = read_checkpoint(path("run/best.h5")).step;
  // (the branch to leave holds best files: else this tests nothing)
  ASSERT_TRUE(before.back() > 6 || best_h5_step > 6) << first.str();
  const std::string from = path("run/step_00000006.h5");
  ASSERT_TRUE(fs::exists(from)) << first.str();
  // (the dry run says what training will move)
  const ProcessResult dry = run_process(
      thpc::binary_dir() + "/transformer_hpc " THPC_SOURCE_DIR "/input/numbers.ini" +
      " --data.dir=" + (corpus_ / "data").string() + " --model.layers=1 --train.max_steps=8" +
      " --train.warmup_steps=4 --train.lr_scale=4 --train.valid_every=2 --train.valid_bleu=false" +
      " --checkpoint.every_steps=3 --checkpoint.keep=6 --checkpoint.keep_best=ppl" +
      " --checkpoint.keep_best_count=3 --checkpoint.average_best=3 --checkpoint.dir=" +
      path("run") + " --train.metrics_dir=" + path("run") + " --checkpoint.resume=" + from +
      " --dry-run");
  ASSERT_EQ(dry.exit_code, 0) << dry.output;
  std::ostringstream second;
  Trainer(config("run", {"train.max_steps=8", "checkpoint.keep=6",
                         "checkpoint.resume=" + from})).run(second);
  const fs::path aside = path("run/best_of_branch_left_at_6");
  for (const int64_t step : before) {
    const std::string name = best_checkpoint_file_name(step);
    SCOPED_TRACE(name);
    EXPECT_EQ(fs::exists(aside / name), step > 6) << second.str();
    if (step > 6) {
      EXPECT_NE(second.str().find("moved " + path("run/" + name) + " into " + aside.string() +
                                  ": of the branch the resume to step 6 leaves"),
                std::string::npos)
          << second.str();
      EXPECT_NE(dry.output.find("# note: training would move " + path("run/" + name) + " into " +
                                path("run") + "/best_of_branch_left_at_6/"),
                std::string::npos)
          << dry.output;
    }
  }
  EXPECT_EQ(fs::exists(aside / "best.h5"), best_h5_step > 6) << second.str();
  // The set in the run directory is the new branch's (its line begins at step 6) and its
  // ancestors' (the run's first line): none of the branch left.
  for (const CheckpointSummary& kept : best_checkpoint_summaries(path("run"))) {
    if (kept.step > 6) {
      EXPECT_TRUE(kept.branch && kept.branch->step == 6) << kept.path;
    } else {
      EXPECT_FALSE(kept.branch.has_value()) << kept.path;
    }
  }
  const std::optional<CheckpointSummary> best = read_checkpoint_summary(path("run/best.h5"));
  if (best && best->step > 6) {
    EXPECT_TRUE(best->branch && best->branch->step == 6);
  }

  // Back to the branch left, from its step 12: its best files come back (the run had no
  // best.h5 there, and average_best left out its best: a helper's sweep), and the branch
  // of steps 7-8 goes aside in its turn.
  std::ostringstream third;
  // (one step to train, without a validation: the files are the ones that came back)
  Trainer(config("run", {"train.max_steps=13", "checkpoint.keep=6",
                         "checkpoint.resume=" + path("run/step_00000012.h5")}))
      .run(third);
  for (const int64_t step : before) {
    if (step <= 6) continue;
    const std::string name = best_checkpoint_file_name(step);
    EXPECT_TRUE(fs::exists(path("run/" + name))) << name << "\n" << third.str();
    EXPECT_NE(third.str().find("moved " + (aside / name).string() + " back into " + path("run") +
                               ": of the branch the resume to step 12 continues"),
              std::string::npos)
        << third.str();
  }
  const std::optional<CheckpointSummary> back = read_checkpoint_summary(path("run/best.h5"));
  ASSERT_TRUE(back.has_value()) << third.str();
  EXPECT_EQ(back->step, best_h5_step) << third.str();
  EXPECT_FALSE(back->branch.has_value()) << third.str();
  for (const CheckpointSummary& kept : best_checkpoint_summaries(path("run"))) {
    EXPECT_FALSE(kept.branch.has_value()) << kept.path << " of the branch left at 6";
  }
}

TEST_F(BestCheckpointsTraining, BleuKeepsTheHighestAndFewerValidationsAverageWhatExists) {
  std::ostringstream log;
  Trainer(config("bleu", {"train.valid_bleu=true", "train.valid_bleu_tokenize=char",
                          "checkpoint.keep_best=bleu", "train.max_steps=12",
                          "checkpoint.keep_best_count=4", "checkpoint.average_best=4"}))
      .run(log);
  const std::map<int64_t, double> bleu = logged("bleu", "bleu");
  ASSERT_EQ(bleu.size(), 6u) << log.str();
  EXPECT_EQ(kept_steps("bleu"), best_steps_of(bleu, false, 4)) << log.str();

  // Fewer validations than asked for: the average of those there are, with a warning.
  std::ostringstream short_log;
  Trainer(config("short", {"train.max_steps=4", "checkpoint.keep_best_count=5",
                           "checkpoint.average_best=5"}))
      .run(short_log);
  EXPECT_EQ(kept_steps("short"), (std::vector<int64_t>{2, 4})) << short_log.str();
  EXPECT_NE(short_log.str().find("warning: average of the 2 best checkpoints by valid ppl (fewer "
                                 "than checkpoint.average_best = 5: only that many validations "
                                 "ran) written to " + path("short/average_best5.h5")),
            std::string::npos)
      << short_log.str();
}

// tools/choose_average.sh (what tools/run_multi30k.sh ends with) scores both averages of
// a run and its best checkpoint with --eval and names the one with the better score of
// the run's metric.
TEST_F(BestCheckpointsTraining, ChooseAverageNamesTheCandidateWithTheBetterValidationScore) {
  std::ostringstream log;
  Trainer(config("both", {"checkpoint.every_steps=2", "checkpoint.keep=3",
                          "checkpoint.average_last=3"}))
      .run(log);
  { std::ofstream(path("both.log")) << log.str(); }
  const std::string trainer = thpc::binary_dir() + "/transformer_hpc";
  const ProcessResult chosen = run_process(
      "bash " THPC_SOURCE_DIR "/tools/choose_average.sh numbers " + path("both.log") + " " +
      trainer + " " THPC_SOURCE_DIR "/input/numbers.ini --data.dir=" + (corpus_ / "data").string() +
      " --model.layers=1");
  ASSERT_EQ(chosen.exit_code, 0) << chosen.output;
  const std::vector<std::string> lines = lines_of(chosen.output);
  ASSERT_EQ(lines.size(), 4u) << chosen.output;
  // The --eval perplexities, as printed; the lowest one's file is named.
  std::map<std::string, double> ppl;
  for (const std::string name : {"average_last3.h5", "average_best3.h5", "best.h5"}) {
    std::smatch match;
    const std::regex line("/" + name + R"(: valid step [0-9]+ \|.*\| ppl ([0-9.]+) )");
    ASSERT_TRUE(std::regex_search(chosen.output, match, line)) << name << "\n" << chosen.output;
    ppl[name] = std::stod(match[1]);
  }
  ASSERT_NE(ppl["average_last3.h5"], ppl["average_best3.h5"]) << chosen.output;
  std::string better = "average_last3.h5";  // of equal scores the first candidate
  for (const std::string name : {"average_best3.h5", "best.h5"}) {
    if (ppl[name] < ppl[better]) better = name;
  }
  EXPECT_EQ(lines[3].rfind("numbers: the better validation ppl is " + better + "'s (", 0), 0u)
      << chosen.output;
  EXPECT_EQ(lines[3].substr(lines[3].rfind(": ") + 2), path("both/" + better)) << chosen.output;
  // A file that is not what the log's run wrote (here best.h5 replaced by another step's:
  // as a relative path of the log, seen from another directory, named another run's
  // files, and the script scored and chose them; a helper's trial): refused, naming both
  // steps.
  const int64_t best_step = read_checkpoint_summary(path("both/best.h5"))->step;
  std::string other;
  for (const std::string& file : list_checkpoints(path("both"))) {
    if (fs::path(file).filename() != checkpoint_file_name(best_step)) other = file;
  }
  ASSERT_FALSE(other.empty()) << log.str();
  fs::copy_file(other, path("both/best.h5"), fs::copy_options::overwrite_existing);
  const ProcessResult replaced = run_process(
      "bash " THPC_SOURCE_DIR "/tools/choose_average.sh numbers " + path("both.log") + " " +
      trainer + " " THPC_SOURCE_DIR "/input/numbers.ini --data.dir=" + (corpus_ / "data").string() +
      " --model.layers=1");
  EXPECT_EQ(replaced.exit_code, 1) << replaced.output;
  EXPECT_NE(replaced.output.find(path("both/best.h5") + " holds step "), std::string::npos)
      << replaced.output;
  EXPECT_NE(replaced.output.find("but the log's run wrote it at step " +
                                 std::to_string(best_step)),
            std::string::npos)
      << replaced.output;
}

// Under a decimal comma's locale Debian's awk (mawk) read "13.90" + 0 as 13: scores that
// differ after the point tied, and the first candidate was named whichever was better (a
// helper's walk). A stand-in for `transformer_hpc --eval` scores each file; the locale is
// made here with localedef (the test skips where it cannot be).
class ChooseAverageLocale : public ScratchDirectoryTest {};
TEST_F(ChooseAverageLocale, ADecimalCommaLocaleStillNamesTheBetterScore) {
  const fs::path locales = directory_ / "locales";
  fs::create_directories(locales);
  if (run_process("localedef -i de_DE -f UTF-8 " + (locales / "de_DE.UTF-8").string()).exit_code !=
      0) {
    GTEST_SKIP() << "cannot make the de_DE.UTF-8 locale here (localedef, Debian's locales)";
  }
  std::ofstream(directory_ / "eval.sh")
      << "#!/bin/bash\nfor a; do f=$a; done\n"
         "case $f in *last5*) p=13.90;; *) p=13.02;; esac\n"
         "echo \"valid step 20 | loss 2.6 | ppl $p | target tokens 100\"\n";
  fs::permissions(directory_ / "eval.sh", fs::perms::owner_all);
  std::ofstream(directory_ / "train.log")
      << "average of the last 5 checkpoints written to average_last5.h5\n"
         "average of the 5 best checkpoints by valid ppl written to average_best5.h5\n"
         "final: step=20 loss=2.6\n";
  std::ofstream(directory_ / "average_last5.h5") << "";
  std::ofstream(directory_ / "average_best5.h5") << "";
  const ProcessResult chosen = run_process(
      "cd " + directory_.string() + " && LOCPATH=" + locales.string() +
      " LC_ALL=de_DE.UTF-8 bash " THPC_SOURCE_DIR "/tools/choose_average.sh run train.log "
      "./eval.sh config.ini");
  EXPECT_EQ(chosen.exit_code, 0) << chosen.output;
  EXPECT_NE(chosen.output.find("run: the better validation ppl is average_best5.h5's (13.02; "
                               "average_last5.h5: 13.90): average_best5.h5\n"),
            std::string::npos)
      << chosen.output;
}

// Several files dropping out at once are removed, and logged, worst first, as change_best_set's
// comment says: bleu 5 > 4 > 3, so 30 (3) goes first. (A mutation audit's survivor.)
TEST(BestSet, SeveralRemovedAtOnceGoWorstFirst) {
  std::vector<CheckpointSummary> disk;
  for (const auto& [step, value] :
       std::vector<std::pair<int64_t, double>>{{10, 5}, {20, 4}, {30, 3}}) {
    CheckpointSummary summary;
    summary.path = best_checkpoint_file_name(step);
    summary.step = step;
    summary.validation = ValidationScore{"bleu", value};
    disk.push_back(summary);
  }
  const BestSetChange change = change_best_set(disk, {"bleu", 6}, 40, 1);
  EXPECT_TRUE(change.admitted);
  ASSERT_EQ(change.removed.size(), 3u);
  EXPECT_EQ(change.removed[0].step, 30);
  EXPECT_EQ(change.removed[1].step, 20);
  EXPECT_EQ(change.removed[2].step, 10);
}

// A file whose stored score is not finite ranks after every finite one (rank_best_checkpoints'
// rule): --best 1 takes the finite one. (A mutation audit's survivor.)
TEST_F(BestCheckpointFiles, AScoreThatIsNotFiniteRanksLast) {
  write_checkpoint(path("run/" + best_checkpoint_file_name(10)),
                   scored_checkpoint(1.0f, 10, "ppl", std::nan("")));
  write_checkpoint(path("run/" + best_checkpoint_file_name(20)),
                   scored_checkpoint(2.0f, 20, "ppl", 5.0));
  std::vector<int64_t> ranked;
  for (const CheckpointSummary& summary : best_checkpoint_summaries(path("run"))) {
    ranked.push_back(summary.step);
  }
  EXPECT_EQ(ranked, (std::vector<int64_t>{20, 10}));
}

// A damaged file --best chose is named with the way on, as --last's is. (A mutation audit's
// survivor.)
TEST_F(BestCheckpointFiles, ADamagedFileTheBestChoseIsNamedWithTheWayOn) {
  for (const int64_t step : {10, 20}) {
    write_checkpoint(path("run/" + best_checkpoint_file_name(step)),
                     scored_checkpoint(static_cast<float>(step), step, "ppl", 3.0 + step));
  }
  const std::string damaged = path("run/" + best_checkpoint_file_name(20));
  fs::resize_file(damaged, fs::file_size(damaged) - 100);
  ASSERT_EQ(best_checkpoint_summaries(path("run")).size(), 2u) << "the header still reads";
  const ProcessResult result = run_process(kAverager + " --inputs " + path("run") +
                                           " --best 2 --output " + path("avg.h5"));
  EXPECT_EQ(result.exit_code, 1) << result.output;
  EXPECT_NE(result.output.find("(--best chose it from " + path("run")), std::string::npos)
      << result.output;
}

// --every-steps belongs to --last: with --best (or named files) it is a command-line mistake,
// exit 2, not ignored. (A mutation audit's survivor.)
TEST_F(BestCheckpointFiles, EveryStepsWithoutLastIsRefused) {
  write_checkpoint(path("run/" + best_checkpoint_file_name(10)),
                   scored_checkpoint(1.0f, 10, "ppl", 3.0));
  const ProcessResult result = run_process(kAverager + " --inputs " + path("run") +
                                           " --best 1 --every-steps 2 --output " +
                                           path("avg.h5"));
  EXPECT_EQ(result.exit_code, 2) << result.output;
  EXPECT_NE(result.output.find("--every-steps chooses among a directory's newest checkpoints: "
                               "give --last N"),
            std::string::npos)
      << result.output;
  EXPECT_FALSE(fs::exists(path("avg.h5")));
}

}  // namespace
}  // namespace thpc
