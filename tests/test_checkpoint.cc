// Checkpoints: the HDF5 round trip is bitwise, a run stopped by SIGTERM and resumed
// logs the same losses and ends with the same parameters as an uninterrupted run, the
// time and step schedules, keep-last-K pruning, averaging (exact on known values,
// refusing mismatched architectures), and corruption (truncation, a flipped byte)
// detected by path and skipped by checkpoint.resume=auto.
#include "checkpoint/checkpoint.h"
#include "checkpoint/checkpoint_header.h"
#include "decode/compute_type.h"
#include "decode/ensemble.h"
#include "checkpoint/checkpoint_directory.h"

#include <gtest/gtest.h>
#include <hdf5.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <functional>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "common/error.h"
#include "common/sha256.h"
#include "common/source_version.h"
#include "common/still_working.h"
#include "config/config.h"
#include "config/option_table.h"
#include "data/synthetic.h"
#include "io/atomic_file.h"
#include "backend/factory.h"
#include "kernels/cpu/cpu_backend.h"
#include "model/checkpoint_params.h"
#include "scoped_environment.h"
#include "separate_vocabularies_shard.h"
#include "train/stop_request.h"
#include "train/trainer.h"
#include "decode_oracles.h"
#include "expect_error.h"
#include "file_bytes.h"
#include "program.h"
#include "scratch_directory.h"
#include "spm_model.h"

namespace thpc {
namespace {

namespace fs = std::filesystem;

const std::string kTinyIni = std::string(THPC_SOURCE_DIR) + "/input/tiny.ini";
const std::string kTrainer = thpc::binary_dir() + "/transformer_hpc";
const std::string kAverager = thpc::binary_dir() + "/transformer_average";

// "step 17/40 | loss 3.1234 | ..." lines by step: the loss text of each.
std::map<int64_t, std::string> losses_by_step(const std::string& log) {
  std::map<int64_t, std::string> losses;
  std::istringstream lines(log);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.rfind("step ", 0) != 0) continue;
    const int64_t step = std::stoll(line.substr(5));
    const auto at = line.find("| loss ");
    if (at == std::string::npos) continue;
    losses[step] = line.substr(at + 7, line.find(' ', at + 7) - (at + 7));
  }
  return losses;
}

std::string final_line(const std::string& log) {
  const auto at = log.find("final: ");
  if (at == std::string::npos) return "";
  return log.substr(at, log.find('\n', at) - at);
}

class CheckpointTest : public ScratchDirectoryTest {
 protected:
  // input/tiny.ini shrunk to one layer per stack, checkpoints and metrics into `dir` (a
  // run owns its directory: the runs of a test each have their own).
  Config small_config(const std::string& dir, std::vector<std::string> overrides = {}) const {
    overrides.insert(overrides.begin(),
                     {"model.layers=1", "checkpoint.dir=" + dir, "train.metrics_dir=" + dir});
    return load_config(kTinyIni, overrides);
  }
};

void expect_same_tensors(const std::vector<NamedTensor>& a, const std::vector<NamedTensor>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t t = 0; t < a.size(); ++t) {
    EXPECT_EQ(a[t].name, b[t].name);
    EXPECT_EQ(a[t].rows, b[t].rows);
    EXPECT_EQ(a[t].cols, b[t].cols);
    ASSERT_EQ(a[t].values.size(), b[t].values.size());
    EXPECT_EQ(std::memcmp(a[t].values.data(), b[t].values.data(), a[t].values.size() * 4), 0)
        << a[t].name;
  }
}

// A checkpoint of two tensors, every value `value`.
Checkpoint constant_checkpoint(float value, int64_t step, const std::string& architecture) {
  Checkpoint checkpoint;
  checkpoint.step = step;
  checkpoint.architecture = architecture;
  checkpoint.config_ini = "[model]\n";
  checkpoint.params.push_back({"a.weight", 3, 4, std::vector<float>(12, value)});
  checkpoint.params.push_back({"b.bias", 1, 5, std::vector<float>(5, value)});
  return checkpoint;
}

// What differs between two checkpoints' whole states ("" when nothing does): both written
// again (PREFIXa.h5 and PREFIXb.h5), with `runs_own_parts_aside` `b` with `a`'s run id,
// lineage and settings (two runs' own, which differ by design), and the two files' bytes
// compared, so that every part the writer stores is compared without a line here for
// it. Tests that compared a list of fields (losses, the parameters, the moments) left out
// what does not feed back into training: a resume that dropped a new field (an EMA of the
// parameters in a helper's trial) passed them.
std::string state_difference(const Checkpoint& a, Checkpoint b, const std::string& prefix,
                             bool runs_own_parts_aside) {
  if (runs_own_parts_aside) {
    b.run_id = a.run_id;
    b.lineage = a.lineage;
    b.config_ini = a.config_ini;
  }
  const std::string a_file = prefix + "a.h5", b_file = prefix + "b.h5";
  write_checkpoint(a_file, a);
  write_checkpoint(b_file, b);
  const auto bytes = [](const std::string& file) {
    std::ifstream in(file, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  if (bytes(a_file) == bytes(b_file)) return "";
  std::ostringstream said;
  said << "the checkpoints' states differ in a part the writer stores";
  if (a.step != b.step) said << "; step " << a.step << " vs " << b.step;
  if (a.data_position.epoch != b.data_position.epoch ||
      a.data_position.index != b.data_position.index) {
    said << "; data_position";
  }
  if (a.divergence.has_value() != b.divergence.has_value() ||
      (a.divergence && (a.divergence->healthy_steps != b.divergence->healthy_steps ||
                        a.divergence->skipped_steps != b.divergence->skipped_steps ||
                        a.divergence->rollbacks != b.divergence->rollbacks))) {
    said << "; divergence";
  }
  if (a.best_valid.has_value() != b.best_valid.has_value()) said << "; best_valid";
  if (a.validation_pending != b.validation_pending) said << "; validation_pending";
  for (const auto& [name, x, y] : {std::tuple{"params", &a.params, &b.params},
                                   std::tuple{"adam_m", &a.adam_m, &b.adam_m},
                                   std::tuple{"adam_v", &a.adam_v, &b.adam_v}}) {
    for (size_t t = 0; t < std::min(x->size(), y->size()); ++t) {
      if ((*x)[t].values != (*y)[t].values) said << "; " << name << "/" << (*x)[t].name;
    }
  }
  return said.str();
}

// ---- the file ----

TEST_F(CheckpointTest, RoundTripIsBitwise) {
  const Config config = small_config(path("run"));
  Trainer trainer(config);
  trainer.step();
  trainer.step();
  Checkpoint saved = trainer.snapshot();
  // A trainer that has not validated yet has no best values (NaN), which read back as such.
  ASSERT_TRUE(saved.best_valid.has_value());
  EXPECT_TRUE(std::isnan(saved.best_valid->ppl.value));
  saved.best_valid->ppl = {3.25, 2, 0};
  const std::string file = path("run/" + checkpoint_file_name(saved.step));
  write_checkpoint(file, saved);
  EXPECT_EQ(fs::path(file).filename(), "step_00000002.h5");
  EXPECT_FALSE(fs::exists(path("run/.step_00000002.h5.tmp")));  // renamed into place

  // The same checkpoint written a second later is the same bytes (HDF5's object times are
  // off): equal averages and quantizations can be told by their sha256.
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));
  write_checkpoint(path("run/again.h5"), saved);
  EXPECT_EQ(sha256_hex_of_file(path("run/again.h5"), 0), sha256_hex_of_file(file, 0));
  fs::remove(path("run/again.h5"));

  const Checkpoint loaded = read_checkpoint(file);
  EXPECT_EQ(loaded.step, 2);
  EXPECT_EQ(loaded.seed, config.train.seed);
  EXPECT_EQ(loaded.world_size, 1);
  EXPECT_EQ(loaded.data_position.epoch, saved.data_position.epoch);
  EXPECT_EQ(loaded.data_position.index, saved.data_position.index);
  EXPECT_GT(loaded.data_position.index, 0);
  EXPECT_EQ(loaded.architecture, saved.architecture);
  // The configuration, headed by what ran it: comment lines that every reader of ini
  // text (the versions before them included) passes over.
  EXPECT_TRUE(config_differences(loaded.config_ini, config.to_ini()).empty());
  const std::string computed_by = compute_identity(*make_cpu_backend(), -1);
  EXPECT_EQ(ini_header_value(loaded.config_ini, kWrittenBy), version_line("transformer_hpc"));
  EXPECT_EQ(ini_header_value(loaded.config_ini, kComputedBy), computed_by);
  EXPECT_EQ(ini_header_value(loaded.config_ini, kCommandLine), config.command_line_text());
  EXPECT_EQ(config.command_line_text(),
            "--model.layers=1 --train.metrics_dir=" + path("run") + " --checkpoint.dir=" +
                path("run"));
  EXPECT_EQ(loaded.config_ini,
            config.to_ini({header_line(kWrittenBy, version_line("transformer_hpc")),
                           header_line(kComputedBy, computed_by),
                           header_line(kCommandLine, config.command_line_text())}));
  ASSERT_TRUE(loaded.best_valid.has_value());
  EXPECT_EQ(loaded.best_valid->ppl.value, 3.25);
  EXPECT_TRUE(std::isnan(loaded.best_valid->bleu.value));
  // Datasets come back in HDF5's name order; compare by the table's order.
  std::map<std::string, NamedTensor> by_name;
  for (const NamedTensor& tensor : loaded.params) by_name[tensor.name] = tensor;
  std::vector<NamedTensor> reordered;
  for (const NamedTensor& tensor : saved.params) reordered.push_back(by_name[tensor.name]);
  expect_same_tensors(reordered, saved.params);

  // Restored into a fresh trainer, the state is the saved one, to the bit.
  Trainer restored(config);
  restored.restore(loaded, file);
  EXPECT_EQ(restored.completed_steps(), 2);
  EXPECT_EQ(restored.model().params().sha256_hex(), trainer.model().params().sha256_hex());
  const Checkpoint again = restored.snapshot();
  expect_same_tensors(again.params, saved.params);
  expect_same_tensors(again.adam_m, saved.adam_m);
  expect_same_tensors(again.adam_v, saved.adam_v);
  ASSERT_TRUE(again.best_valid.has_value());
  EXPECT_EQ(again.best_valid->ppl.value, 3.25);
  EXPECT_EQ(again.best_valid->ppl.step, 2);
  // And it continues as the original does.
  EXPECT_EQ(restored.step().loss, trainer.step().loss);
}

// With activation dropout and weight decay (fairseq's --activation-dropout and
// --weight-decay) a resumed run is the uninterrupted one too: the new dropout site's masks
// are keyed by the step as the others', and the decay reads nothing but the step's lr.
// (A user's walk resumed such a run with a binary built between the run and its resume,
// and saw it differ: checkpoints record which build wrote them, and it showed.)
TEST_F(CheckpointTest, ARegularisedRunResumesBitIdentically) {
  const Config config = small_config(
      path("regularised"), {"model.activation_dropout=0.2", "train.weight_decay=0.05"});
  Trainer trainer(config);
  trainer.step();
  trainer.step();
  const std::string file = path("regularised/" + checkpoint_file_name(2));
  write_checkpoint(file, trainer.snapshot());
  Trainer restored(config);
  restored.restore(read_checkpoint(file), file);
  for (int step = 3; step <= 5; ++step) {
    EXPECT_EQ(restored.step().loss, trainer.step().loss) << "step " << step;
  }
  EXPECT_EQ(restored.model().params().sha256_hex(), trainer.model().params().sha256_hex());
  // And neither setting is idle: without them the same steps train otherwise.
  Trainer plain(small_config(path("plain")));
  for (int step = 1; step <= 5; ++step) plain.step();
  EXPECT_NE(plain.model().params().sha256_hex(), trainer.model().params().sha256_hex());
}

// Separate vocabularies (fairseq's dictionaries apart, Marian's --tied-embeddings): a run
// on shards of format 3 builds the encoder's own table, its checkpoints say so in their
// architecture and hold it, a resume is the uninterrupted run, an average keeps it, and
// a checkpoint of one vocabulary is no start for them. (Hand-made shards: a source
// vocabulary of 50 over the target's 30, without stored models.)
TEST_F(CheckpointTest, SeparateVocabulariesTrainSaveResumeAndAverage) {
  const auto corpus = [&](const std::string& name, int source_vocab) {
    const std::string dir = path(name);
    std::filesystem::create_directories(dir);
    write_separate_vocabularies_shard(dir + "/train.00000.h5", 64, source_vocab);
    return dir;
  };
  const std::string separate = corpus("separate_data", 50);
  const auto config_of = [&](const std::string& run, const std::string& data) {
    return small_config(path(run), {"data.dir=" + data, "train.valid_every=0",
                                    "train.tokens_per_step=200", "train.max_epochs=0"});
  };
  Trainer trainer(config_of("separate", separate));
  EXPECT_EQ(trainer.model().vocab_size(), 30);
  EXPECT_EQ(trainer.model().source_vocab_size(), 50);
  trainer.step();
  trainer.step();
  const std::string file = path("separate/" + checkpoint_file_name(2));
  write_checkpoint(file, trainer.snapshot());
  const Checkpoint saved = read_checkpoint(file);
  EXPECT_NE(saved.architecture.find(" vocab_size=30 source_vocab_size=50 "), std::string::npos)
      << saved.architecture;
  EXPECT_EQ(embedding_rows(saved), 30);
  EXPECT_EQ(source_embedding_rows(saved), 50);
  Trainer restored(config_of("separate", separate));
  restored.restore(saved, file);
  for (int step = 3; step <= 4; ++step) {
    EXPECT_EQ(restored.step().loss, trainer.step().loss) << "step " << step;
  }
  EXPECT_EQ(restored.model().params().sha256_hex(), trainer.model().params().sha256_hex());
  const std::string later = path("separate/" + checkpoint_file_name(4));
  write_checkpoint(later, trainer.snapshot());
  const Checkpoint average = average_checkpoints({file, later});
  EXPECT_EQ(average.architecture, saved.architecture);
  EXPECT_EQ(source_embedding_rows(average), 50);
  // Decoding reads the source's size beside the target's (test_valid_bleu decodes one).
  EXPECT_EQ(read_decoding_checkpoints({file}).source_vocab_size, 50);
  // A checkpoint of one vocabulary (of the same target size) starts no such run: its
  // architecture names the difference.
  const std::string shared = corpus("shared_data", 0);
  Trainer one(config_of("one", shared));
  const std::string one_file = path("one/" + checkpoint_file_name(0));
  write_checkpoint(one_file, one.snapshot());
  Trainer other(config_of("other", separate));
  expect_error([&] { other.restore(read_checkpoint(one_file), one_file); },
               {"the source vocabulary (the shards') is absent in"});
}

// The work the other ranks of a job may wait through (rank 0's checkpoint, a resume's read,
// a model's initialisation, the parameters' digest the ranks compare) gives a sign of work
// with each piece (common/still_working.h): a trial with dist.timeout_s = 1 and a 1.9 GB
// checkpoint ended healthy jobs in the stretches that gave none (the state's copy, the
// hashes, the initialisation, the digest). On the thread that set a sign it is called; on
// another (the background writer, the hashing helpers) only the count moves, which the
// training thread waiting for the writer signs in its stead.
TEST_F(CheckpointTest, WorkOtherRanksWaitForGivesASignOfWorkWithEachPiece) {
  const Config config = small_config(path("run"));
  int64_t signs_here = 0;
  const StillWorkingSign sign([&] { ++signs_here; });
  Trainer trainer(config);
  const int64_t tensors = static_cast<int64_t>(trainer.model().params().entries().size());
  ASSERT_GT(tensors, 4);
  // The signs `work` gives, on any thread.
  const auto signs_of = [](const std::function<void()>& work) {
    const int64_t given = signs_of_work_given();
    work();
    return signs_of_work_given() - given;
  };
  Checkpoint saved;
  const int64_t here = signs_here;
  EXPECT_GE(signs_of([&] { saved = trainer.snapshot(); }), 3 * tensors);
  EXPECT_GE(signs_here - here, 3 * tensors) << "the snapshot's signs, on this thread";
  // Hashed (a sign per dataset, on whichever thread hashed it) and written.
  EXPECT_GE(signs_of([&] { write_checkpoint(path("run/step_00000000.h5"), saved); }),
            6 * tensors);
  EXPECT_GE(signs_of([&] { read_checkpoint(path("run/step_00000000.h5")); }), 6 * tensors);
  EXPECT_GE(signs_of([&] { trainer.model().params().sha256_hex(); }), tensors);
  // (A trainer's own start-up sets its sign, the communicator's, while it is built.)
  EXPECT_GE(signs_of([&] { Trainer another(config); }), tensors);
  // Another thread's work moves the count without calling this thread's sign.
  const int64_t before = signs_of_work_given(), here_before = signs_here;
  std::thread([] { show_still_working(); }).join();
  EXPECT_EQ(signs_of_work_given(), before + 1);
  EXPECT_EQ(signs_here, here_before);
}

TEST_F(CheckpointTest, ArchitectureMismatchIsRefusedOnLoad) {
  Trainer one_layer(small_config(path("run")));
  const std::string file = path("one_layer.h5");
  write_checkpoint(file, one_layer.snapshot());
  Trainer two_layers(load_config(kTinyIni, {"checkpoint.dir=" + path("run")}));
  expect_error([&] { two_layers.restore(read_checkpoint(file), file); },
               {file, "architecture mismatch: model.layers is 1 in the file and 2 in the "
                      "configuration; to use this checkpoint, give the configuration the "
                      "file's values"});
  expect_error([&] { load_parameters(file, two_layers.model()); },
               {file, "architecture mismatch"});
}

// model.norm is architecture: the file records it (architecture_text's norm=), and a
// checkpoint of the other order is refused, for resume, checkpoint.init and decoding
// (load_parameters) and averaging, by one message naming the file and both values.
// A checkpoint written before the record existed reads as post-norm.
TEST_F(CheckpointTest, TheLayerNormOrderIsRecordedAndTheOtherOrderIsRefusedByName) {
  Trainer post(small_config(path("post")));
  Trainer pre(small_config(path("pre"), {"model.norm=pre"}));
  const std::string post_file = path("post.h5"), pre_file = path("pre.h5");
  Checkpoint post_state = post.snapshot();
  write_checkpoint(post_file, post_state);
  write_checkpoint(pre_file, pre.snapshot());
  EXPECT_NE(read_checkpoint(post_file).architecture.find(" norm=post"), std::string::npos);
  EXPECT_NE(read_checkpoint(pre_file).architecture.find(" norm=pre"), std::string::npos);

  // Not structured bindings: C++17 lets no lambda capture one (clang refuses).
  for (const auto& file_and_trainer :
       {std::tuple{post_file, "post", &pre, "pre"}, std::tuple{pre_file, "pre", &post, "post"}}) {
    const std::string& file = std::get<0>(file_and_trainer);
    const char* const file_norm = std::get<1>(file_and_trainer);
    Trainer* const trainer = std::get<2>(file_and_trainer);
    const char* const model_norm = std::get<3>(file_and_trainer);
    const std::vector<std::string> naming = {
        file, std::string("holds a model.norm = ") + file_norm + " model",
        std::string("the configuration has model.norm = ") + model_norm};
    expect_error([&] { trainer->restore(read_checkpoint(file), file); }, naming);
    expect_error([&] { load_parameters(file, trainer->model()); }, naming);
  }
  expect_error([&] { average_checkpoints({post_file, pre_file}); },
               {"different layer-norm orders", post_file + " has model.norm = post",
                pre_file + " has model.norm = pre"});

  // The trainer program resuming a post-norm run with model.norm = pre: refused, exit 2
  // (the configuration's error).
  write_checkpoint(path("post/" + checkpoint_file_name(post_state.step)), post_state);
  const ProcessResult resumed =
      run_process(kTrainer + " " + kTinyIni + " --model.layers=1 --model.norm=pre "
                  "--checkpoint.dir=" + path("post") + " --checkpoint.resume=auto");
  EXPECT_EQ(resumed.exit_code, 2) << resumed.output;
  EXPECT_NE(resumed.output.find("holds a model.norm = post model, the configuration has "
                                "model.norm = pre"),
            std::string::npos)
      << resumed.output;

  // Before model.norm: no norm= in the text, a post-norm model.
  Checkpoint old = post_state;
  old.architecture.erase(old.architecture.find(" norm=post"));
  const std::string old_file = path("old.h5");
  write_checkpoint(old_file, old);
  ASSERT_EQ(read_checkpoint(old_file).architecture.find("norm="), std::string::npos);
  Trainer resumed_post(small_config(path("post2")));
  resumed_post.restore(read_checkpoint(old_file), old_file);
  EXPECT_EQ(resumed_post.model().params().sha256_hex(), post.model().params().sha256_hex());
  expect_error([&] { pre.restore(read_checkpoint(old_file), old_file); },
               {old_file, "holds a model.norm = post model"});
  EXPECT_EQ(average_checkpoints({old_file, post_file}).params.size(), post_state.params.size());
}

// ---- resume ----

// The step at which `output`'s progress lines first show epoch 2, or -1.
int64_t first_step_of_epoch_two(const std::string& output) {
  std::istringstream lines(output);
  for (std::string line; std::getline(lines, line);) {
    long long step = 0, total = 0;
    if (std::sscanf(line.c_str(), "step %lld/%lld |", &step, &total) == 2 &&
        line.find("| epoch 2 |") != std::string::npos) {
      return step;
    }
  }
  return -1;
}

// A resume with another micro-batch budget (train.accumulate 1 -> 4 here; as well other
// ranks or train.tokens_per_step) plans other batches: the checkpoint's index, 10 of the
// 15 batches of a 300-token epoch, continues as 66.7% through the 75-token plan's 57
// batches, so that epoch 2 begins where the uninterrupted run's does (step 16). Taken as
// it was, index 10 of 57 (four a step) turned the epoch at step 22, six steps of data
// read twice; from four ranks to one it skipped most of an epoch.
TEST_F(CheckpointTest, AResumeWithAnotherMicroBatchBudgetContinuesAtTheSameShareOfTheEpoch) {
  const ProcessResult corpus = run_process(small_numbers_corpus_command(path("corpus")));
  ASSERT_EQ(corpus.exit_code, 0) << corpus.output;
  const std::string common = kTrainer + " " + kTinyIni + " --model.layers=1 --data.dir=" +
                             path("corpus/data") + " --train.tokens_per_step=300 "
                             "--train.max_steps=24 --train.log_every=1 --train.valid_every=0 "
                             "--checkpoint.dir=";
  const ProcessResult whole = run_process(common + path("whole"));
  ASSERT_EQ(whole.exit_code, 0) << whole.output;
  ASSERT_EQ(first_step_of_epoch_two(whole.output), 16) << whole.output;
  const ProcessResult stopped =
      run_process("THPC_TEST_STOP_AT_STEP=10 " + common + path("interrupted"));
  ASSERT_EQ(stopped.exit_code, 0) << stopped.output;
  // A test hook in the environment is said so: a real run that inherits one from a shell
  // that ran tests was told of a SIGTERM that never came.
  EXPECT_NE(stopped.output.find("warning: the test suite's hook THPC_TEST_STOP_AT_STEP=10 is "
                                "set: it fakes what its name says (unset it for a real run)"),
            std::string::npos)
      << stopped.output;
  const ProcessResult resumed =
      run_process("THPC_TEST_STOP_AT_STEP=20 " + common + path("interrupted") +
                  " --checkpoint.resume=auto --train.accumulate=4");
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("note: the checkpoint's run cut each micro-batch to 300 tokens "
                                "(train.tokens_per_step 300 over 1 rank x 1), this one to 75 "
                                "(300 over 1 rank x 4): the epoch's 57 batches are not its 15, "
                                "so the data continues 66.7% through epoch 1 (batch 38 of 57, "
                                "where the checkpoint had 10 of 15: the same share of the same "
                                "shard)"),
            std::string::npos)
      << resumed.output;
  EXPECT_EQ(first_step_of_epoch_two(resumed.output), 16) << resumed.output;
  // The setting changed is named (the resume key, which says how the run started, not).
  EXPECT_NE(resumed.output.find("note: 1 setting differs from the run that wrote the "
                                "checkpoint, from this step on: train.accumulate = 4 (was 1)\n"),
            std::string::npos)
      << resumed.output;
  // The same budget (accumulate as it was) takes the index as it is, and says nothing.
  const ProcessResult again =
      run_process(common + path("interrupted") + " --checkpoint.resume=auto "
                  "--train.accumulate=4 --train.metrics_dir=" + path("interrupted"));
  ASSERT_EQ(again.exit_code, 0) << again.output;
  // An empty value is said so ("(was )" read as a typo).
  EXPECT_NE(again.output.find("train.metrics_dir = " + path("interrupted") + " (was empty)"),
            std::string::npos)
      << again.output;
  EXPECT_NE(again.output.find("at step 20"), std::string::npos) << again.output;
  EXPECT_EQ(again.output.find("micro-batch to"), std::string::npos) << again.output;
  // One directory written another way is not a change (a job script's $PWD/ck for the
  // ini's ck was listed as one); another directory still is.
  const ProcessResult written_otherwise = run_process(
      common + path("interrupted") + "/../interrupted/ --checkpoint.resume=auto "
      "--train.accumulate=4 --train.metrics_dir=" + path("elsewhere") + " "
      "--train.clip_norm=2");
  ASSERT_EQ(written_otherwise.exit_code, 0) << written_otherwise.output;
  EXPECT_NE(written_otherwise.output.find("note: 2 settings differ from the run that wrote the "
                                          "checkpoint, from this step on: "),
            std::string::npos)
      << written_otherwise.output;
  EXPECT_NE(written_otherwise.output.find("train.clip_norm = 2 (was 0)"), std::string::npos)
      << written_otherwise.output;
  EXPECT_NE(written_otherwise.output.find("train.metrics_dir = " + path("elsewhere") + " (was " +
                                          path("interrupted") + ")"),
            std::string::npos)
      << written_otherwise.output;
  EXPECT_EQ(written_otherwise.output.find("checkpoint.dir ="), std::string::npos)
      << written_otherwise.output;
  // Nor are relative paths resumed from another working directory: the checkpoint's
  // "data" and "ck" are resolved against the directory its run worked in (which it
  // records), not against this run's (both were listed as changes before).
  const std::string in_corpus = "cd " + path("corpus") + " && " + kTrainer + " " + kTinyIni +
                                " --model.layers=1 --train.tokens_per_step=300 "
                                "--train.log_every=1 --train.valid_every=0 --data.dir=data ";
  const ProcessResult relative = run_process(in_corpus + "--train.max_steps=2 --checkpoint.dir=ck");
  ASSERT_EQ(relative.exit_code, 0) << relative.output;
  const ProcessResult elsewhere = run_process(
      "cd " + path("corpus") + "/.. && " + kTrainer + " " + kTinyIni + " --model.layers=1 "
      "--train.tokens_per_step=300 --train.log_every=1 --train.valid_every=0 --data.dir=" +
      path("corpus/data") + " --train.max_steps=4 --checkpoint.dir=" + path("corpus/ck") +
      " --checkpoint.resume=auto");
  ASSERT_EQ(elsewhere.exit_code, 0) << elsewhere.output;
  EXPECT_NE(elsewhere.output.find("at step 2"), std::string::npos) << elsewhere.output;
  EXPECT_NE(elsewhere.output.find("note: 1 setting differs from the run that wrote the "
                                  "checkpoint, from this step on: train.max_steps = 4 (was 2)\n"),
            std::string::npos)
      << elsewhere.output;
  // A setting that does nothing in a resumed run is said apart, with why (checkpoint.init
  // was said to take effect "from this step on").
  const auto resumed_with_idle_values = [&](int max_steps) {
    return run_process(
        "cd " + path("corpus") + "/.. && " + kTrainer + " " + kTinyIni + " --model.layers=1 "
        "--train.tokens_per_step=300 --train.log_every=1 --train.valid_every=0 --data.dir=" +
        path("corpus/data") + " --train.max_steps=" + std::to_string(max_steps) +
        " --checkpoint.dir=" + path("corpus/ck") + " --checkpoint.resume=auto "
        "--checkpoint.init=" + path("corpus/ck/step_00000002.h5") +
        " --data.synthetic_vocab=40 --train.precision=fp32");
  };
  const ProcessResult idle = resumed_with_idle_values(5);
  ASSERT_EQ(idle.exit_code, 0) << idle.output;
  for (const std::string& line :
       {std::string("note: 1 setting differs from the run that wrote the checkpoint, from this "
                    "step on: train.max_steps = 5 (was 4)\n"),
        std::string("note: 3 settings differ from the run that wrote the checkpoint but have "
                    "no effect in this run: "),
        "checkpoint.init = " + path("corpus/ck/step_00000002.h5") +
            " (was empty; a resumed run's parameters are the checkpoint's)",
        std::string("data.synthetic_vocab = 40 (was 32; data.dir is set: its shards, not the "
                    "synthetic task)"),
        std::string("train.precision = fp32 (was bf16; the CPU computes in fp32 with its own "
                    "kernels)")}) {
    EXPECT_NE(idle.output.find(line), std::string::npos) << line << "\n" << idle.output;
  }
  // ... and not a second time at start-up, where every value given that does nothing here
  // is named, but those the resume's note named (they were listed twice) ...
  const std::string start_up_note = "note: set, but without effect in this run: ";
  EXPECT_EQ(idle.output.find(start_up_note), std::string::npos) << idle.output;
  // ... which names those the checkpoint's run had too.
  const ProcessResult idle_again = resumed_with_idle_values(6);
  ASSERT_EQ(idle_again.exit_code, 0) << idle_again.output;
  EXPECT_NE(idle_again.output.find(start_up_note + "train.precision = fp32 (the CPU computes in "
                                   "fp32 with its own kernels), data.synthetic_vocab = 40 "
                                   "(data.dir is set: its shards, not the synthetic task)\n"),
            std::string::npos)
      << idle_again.output;
  EXPECT_EQ(idle_again.output.find("no effect in this run: train.precision"), std::string::npos)
      << idle_again.output;
  // The relative checkpoint.dir resumed from the wrong directory names the folder it
  // looked in (before: "no valid checkpoint in ck", a fresh start in another folder).
  const ProcessResult astray = run_process(
      "cd " + path("corpus") + "/.. && " + kTrainer + " " + kTinyIni + " --model.layers=1 "
      "--train.tokens_per_step=300 --train.valid_every=0 --data.dir=" + path("corpus/data") +
      " --train.max_steps=1 --checkpoint.dir=ck --checkpoint.resume=auto_or_fresh");
  ASSERT_EQ(astray.exit_code, 0) << astray.output;
  EXPECT_NE(astray.output.find("no valid checkpoint in ck (" + path("ck") + "), starting from "
                               "step 0"),
            std::string::npos)
      << astray.output;
  // A checkpoint named as checkpoint.dir's file, not as a path: said what to give.
  const ProcessResult by_name = run_process(
      in_corpus + "--train.max_steps=4 --checkpoint.dir=ck --checkpoint.resume=step_00000002.h5");
  EXPECT_EQ(by_name.exit_code, 1) << by_name.output;
  EXPECT_NE(by_name.output.find("checkpoint.resume = step_00000002.h5: no such file (a path is "
                                "found from the working directory, " + path("corpus") +
                                ", not from checkpoint.dir); checkpoint.dir holds "
                                "ck/step_00000002.h5: give that; for the newest valid "
                                "checkpoint of checkpoint.dir give auto"),
            std::string::npos)
      << by_name.output;
  // So is checkpoint.init's, in training and in the dry run alike (before: "checkpoint
  // step_00000002.h5: no such file", neither the key nor where it was looked for).
  for (const char* dry : {"", " --dry-run"}) {
    const ProcessResult init_by_name = run_process(
        in_corpus + "--train.max_steps=4 --checkpoint.dir=fresh_ck "
        "--checkpoint.init=step_00000002.h5" + std::string(dry));
    EXPECT_EQ(init_by_name.exit_code, 1) << init_by_name.output;
    EXPECT_NE(init_by_name.output.find("checkpoint.init = step_00000002.h5: no such file (a path "
                                       "is found from the working directory, " + path("corpus") +
                                       ", not from checkpoint.dir)\n"),
              std::string::npos)
        << dry << "\n" << init_by_name.output;
  }
}

// train.max_epochs = E ends the run at the step that reads epoch E's last micro-batch:
// 15 micro-batches an epoch at 300 tokens, one a step, so epoch 2 ends at step 30; with
// train.accumulate = 4 an epoch is 57 batches, four a step, and epoch 1 ends at step 15,
// whose last three batches are epoch 2's first (the checkpoint's position says so). A
// resume ends at the same step as the run that was not stopped, with its parameters; one
// resumed after the last epoch trains nothing; a larger limit trains on.
TEST_F(CheckpointTest, MaxEpochsEndsTheRunAtTheStepThatReadsTheEpochsLastBatch) {
  const ProcessResult corpus = run_process(small_numbers_corpus_command(path("corpus")));
  ASSERT_EQ(corpus.exit_code, 0) << corpus.output;
  const std::string common = kTrainer + " " + kTinyIni + " --model.layers=1 --data.dir=" +
                             path("corpus/data") + " --train.tokens_per_step=300 "
                             "--train.log_every=1 --train.valid_every=0 --checkpoint.dir=";
  // The dry run says where training will end, as training reckons it.
  const ProcessResult dry_whole =
      run_process(common + path("whole") + " --train.max_epochs=2 --dry-run");
  ASSERT_EQ(dry_whole.exit_code, 0) << dry_whole.output;
  EXPECT_NE(dry_whole.output.find("\n# training would end at step 30, where train.max_epochs = "
                                  "2 ends\n"),
            std::string::npos)
      << dry_whole.output;
  const ProcessResult whole = run_process(common + path("whole") + " --train.max_epochs=2");
  ASSERT_EQ(whole.exit_code, 0) << whole.output;
  EXPECT_NE(whole.output.find("train.max_epochs = 2: the run ends at step 30, which reads the "
                              "last batch of epoch 2 (15 micro-batches an epoch, 1 a step)"),
            std::string::npos)
      << whole.output;
  EXPECT_NE(whole.output.find("step 30/30 |"), std::string::npos) << whole.output;
  EXPECT_NE(whole.output.find("final: step=30 "), std::string::npos) << whole.output;
  const Checkpoint last = read_checkpoint(path("whole") + "/step_00000030.h5");
  EXPECT_EQ(last.data_position.epoch, 2);
  EXPECT_EQ(last.data_position.index, 0);

  const ProcessResult accumulated =
      run_process(common + path("accumulated") + " --train.max_epochs=1 --train.accumulate=4");
  ASSERT_EQ(accumulated.exit_code, 0) << accumulated.output;
  EXPECT_NE(accumulated.output.find("the run ends at step 15, which reads the last batch of "
                                    "epoch 1 (57 micro-batches an epoch, 4 a step)"),
            std::string::npos)
      << accumulated.output;
  const Checkpoint crossed = read_checkpoint(path("accumulated") + "/step_00000015.h5");
  EXPECT_EQ(crossed.data_position.epoch, 1);
  EXPECT_EQ(crossed.data_position.index, 3);

  const ProcessResult stopped = run_process("THPC_TEST_STOP_AT_STEP=10 " + common +
                                            path("interrupted") + " --train.max_epochs=2");
  ASSERT_EQ(stopped.exit_code, 0) << stopped.output;
  const ProcessResult dry_resumed = run_process(
      common + path("interrupted") + " --train.max_epochs=2 --checkpoint.resume=auto --dry-run");
  ASSERT_EQ(dry_resumed.exit_code, 0) << dry_resumed.output;
  EXPECT_NE(dry_resumed.output.find("# training would end at step 30, where"), std::string::npos)
      << dry_resumed.output;
  const ProcessResult resumed = run_process(common + path("interrupted") +
                                            " --train.max_epochs=2 --checkpoint.resume=auto");
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("the run ends at step 30, which reads"), std::string::npos)
      << resumed.output;
  // The final line's parameter digest is the uninterrupted run's.
  const auto final_line = [](const std::string& output) {
    const size_t at = output.find("final: step=");
    return at == std::string::npos ? std::string() : output.substr(at, output.find('\n', at) - at);
  };
  EXPECT_FALSE(final_line(whole.output).empty()) << whole.output;
  EXPECT_EQ(final_line(resumed.output), final_line(whole.output)) << resumed.output;

  const ProcessResult nothing_left = run_process(common + path("whole") +
                                                 " --train.max_epochs=2 --checkpoint.resume=auto");
  ASSERT_EQ(nothing_left.exit_code, 0) << nothing_left.output;
  EXPECT_NE(nothing_left.output.find("train.max_epochs = 2: the data is past epoch 2's last "
                                     "batch (the next to read is batch 1 of epoch 3): nothing "
                                     "left to train (raise train.max_epochs to train on)"),
            std::string::npos)
      << nothing_left.output;
  EXPECT_NE(nothing_left.output.find("final: step=30 "), std::string::npos) << nothing_left.output;
  const ProcessResult one_more = run_process(common + path("whole") +
                                             " --train.max_epochs=3 --checkpoint.resume=auto");
  ASSERT_EQ(one_more.exit_code, 0) << one_more.output;
  EXPECT_NE(one_more.output.find("step 45/45 |"), std::string::npos) << one_more.output;
  // Named by path, step 30 with nothing left to train starts no branch: step 45 is not
  // marked superseded (it was, and resume=auto then trained epoch 3 again; a trial). The
  // dry run says so too (it said training would mark it, reckoning with train.max_steps).
  const std::string step_30 = path("whole") + "/step_00000030.h5";
  const ProcessResult dry_named = run_process(common + path("whole") + " --train.max_epochs=2 "
                                              "--checkpoint.resume=" + step_30 + " --dry-run");
  ASSERT_EQ(dry_named.exit_code, 0) << dry_named.output;
  EXPECT_EQ(dry_named.output.find("superseded"), std::string::npos) << dry_named.output;
  EXPECT_NE(dry_named.output.find("# training would end at step 30, where train.max_epochs = 2 "
                                  "ends (no step is left to train)"),
            std::string::npos)
      << dry_named.output;
  const ProcessResult named = run_process(common + path("whole") + " --train.max_epochs=2 "
                                          "--checkpoint.resume=" + path("whole") +
                                          "/step_00000030.h5");
  ASSERT_EQ(named.exit_code, 0) << named.output;
  EXPECT_EQ(named.output.find("superseded"), std::string::npos) << named.output;
  EXPECT_EQ(read_checkpoint(path("whole") + "/step_00000045.h5").state,
            CheckpointState::Healthy);
  // A skipped step reads its batches: one that read epoch 1's last ends the run at the
  // next step, a healthy one (it ended at the skip, its checkpoint marked diverged, which
  // resume=auto then refused; a trial); one earlier in the epoch brings the end a step
  // nearer, and says so.
  const ProcessResult skipped_last =
      run_process("THPC_TEST_NAN_LOSS_AT=15 " + common + path("skipped_last") +
                  " --train.max_epochs=1 --train.accumulate=4 --train.divergence=skip");
  ASSERT_EQ(skipped_last.exit_code, 0) << skipped_last.output;
  EXPECT_NE(skipped_last.output.find("skipped step 15"), std::string::npos) << skipped_last.output;
  EXPECT_NE(skipped_last.output.find("final: step=15 "), std::string::npos) << skipped_last.output;
  EXPECT_EQ(read_checkpoint(path("skipped_last") + "/step_00000015.h5").state,
            CheckpointState::Healthy);
  const ProcessResult skipped_early =
      run_process("THPC_TEST_NAN_LOSS_AT=10 " + common + path("skipped_early") +
                  " --train.max_epochs=2 --train.divergence=skip");
  ASSERT_EQ(skipped_early.exit_code, 0) << skipped_early.output;
  EXPECT_NE(skipped_early.output.find("train.max_epochs = 2: after the skipped step, the run "
                                      "ends at step 29, which reads the last batch of epoch 2"),
            std::string::npos)
      << skipped_early.output;
  EXPECT_NE(skipped_early.output.find("final: step=29 "), std::string::npos)
      << skipped_early.output;
  // A rollback goes back to a checkpoint's data position too: the end stays at epoch 2's
  // last batch, said once at the start (tried by hand only before).
  const ProcessResult rolled_back =
      run_process("THPC_TEST_NAN_LOSS_AT=10 " + common + path("rolled_back") +
                  " --train.max_epochs=2 --train.divergence=rollback "
                  "--checkpoint.every_steps=4");
  ASSERT_EQ(rolled_back.exit_code, 0) << rolled_back.output;
  EXPECT_NE(rolled_back.output.find("rolled back to " + path("rolled_back") +
                                    "/step_00000008.h5 (step 8) after step 10 diverged"),
            std::string::npos)
      << rolled_back.output;
  EXPECT_EQ(rolled_back.output.find("after the rollback"), std::string::npos)
      << rolled_back.output;
  EXPECT_NE(rolled_back.output.find("final: step=30 "), std::string::npos) << rolled_back.output;
  const Checkpoint after_rollback = read_checkpoint(path("rolled_back") + "/step_00000030.h5");
  EXPECT_EQ(after_rollback.data_position.epoch, 2);
  EXPECT_EQ(after_rollback.data_position.index, 0);
  // train.max_steps before the epochs' end ends the run, and says so.
  const ProcessResult capped = run_process(common + path("capped") +
                                           " --train.max_epochs=1 --train.max_steps=10");
  ASSERT_EQ(capped.exit_code, 0) << capped.output;
  EXPECT_NE(capped.output.find("train.max_epochs = 1: train.max_steps = 10 ends the run first "
                               "(epoch 1 would end at step 15)"),
            std::string::npos)
      << capped.output;
  EXPECT_NE(capped.output.find("final: step=10 "), std::string::npos) << capped.output;
  // A limit whose batches no int64 counts is no limit (it overflowed, and ended the run
  // at once as "nothing left to train"; a trial).
  const ProcessResult endless = run_process(common + path("endless") +
                                            " --train.max_epochs=1000000000000000000 "
                                            "--train.max_steps=3");
  ASSERT_EQ(endless.exit_code, 0) << endless.output;
  EXPECT_NE(endless.output.find("train.max_steps = 3 ends the run first (epoch "
                                "1000000000000000000 lies beyond any step a run can count)"),
            std::string::npos)
      << endless.output;
  EXPECT_NE(endless.output.find("final: step=3 "), std::string::npos) << endless.output;
}

// A resume whose data.dir now holds other pairs under the same vocabulary (the corpus
// preprocessed again, other sentences): the checkpoint's position counts batches of a
// corpus that is gone, so the run says so and reads the new data from its next epoch.
// Before, the old index was taken in the new data (a trial: epoch 2 skipped at once).
TEST_F(CheckpointTest, AResumeOverOtherDataSaysSoAndStartsItsNextEpoch) {
  const ProcessResult corpus = run_process(small_numbers_corpus_command(path("corpus")));
  ASSERT_EQ(corpus.exit_code, 0) << corpus.output;
  const std::string other = path("other");
  const ProcessResult remade = run_process(
      "python3 " THPC_SOURCE_DIR "/tools/make_numbers_corpus.py --train 400 --valid 60 "
      "--test 10 --seed 2 --out " + other + "/text && " + thpc::binary_dir() +
      "/transformer_preprocess --source-lang en --target-lang de --trainpref " + other +
      "/text/train --validpref " + other + "/text/valid --destdir " + other + "/data "
      "--spm-model " + path("corpus/data/spm.model"));
  ASSERT_EQ(remade.exit_code, 0) << remade.output;
  const std::string common = kTrainer + " " + kTinyIni + " --model.layers=1 " +
                             "--train.tokens_per_step=300 --train.max_steps=14 "
                             "--train.log_every=1 --train.valid_every=0 --checkpoint.dir=" +
                             path("run");
  const ProcessResult stopped = run_process("THPC_TEST_STOP_AT_STEP=10 " + common +
                                            " --data.dir=" + path("corpus/data"));
  ASSERT_EQ(stopped.exit_code, 0) << stopped.output;
  const ProcessResult resumed = run_process(common + " --checkpoint.resume=auto --data.dir=" +
                                            other + "/data");
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("warning: the data under data.dir is not what the "
                                "checkpoint's run read (training pairs sha256 "),
            std::string::npos)
      << resumed.output;
  EXPECT_NE(resumed.output.find("so this run reads the new data from the start of epoch 2"),
            std::string::npos)
      << resumed.output;
  EXPECT_NE(resumed.output.find("step 11/14 | loss"), std::string::npos) << resumed.output;
  EXPECT_NE(resumed.output.find("| epoch 2 |"), std::string::npos) << resumed.output;
  EXPECT_EQ(resumed.output.find("| epoch 1 |"), std::string::npos) << resumed.output;
  EXPECT_EQ(resumed.output.find("| epoch 3 |"), std::string::npos) << resumed.output;
}

TEST_F(CheckpointTest, ResumeAfterSigtermIsIdenticalToTheUninterruptedRun) {
  // Each run with its own metrics (a run owns its directory): train.metrics_dir = the
  // checkpoint directory.
  const std::string common = kTrainer + " " + kTinyIni +
                             " --train.max_steps=40 --train.log_every=1 --checkpoint.dir=";
  const auto run_in = [](const std::string& dir) {
    return dir + " --train.metrics_dir=" + dir;
  };
  const ProcessResult whole = run_process(common + run_in(path("whole")));
  ASSERT_EQ(whole.exit_code, 0) << whole.output;

  // The test hook raises SIGTERM on the process itself once step 15 is complete.
  const ProcessResult stopped =
      run_process("THPC_TEST_STOP_AT_STEP=15 " + common + run_in(path("interrupted")));
  ASSERT_EQ(stopped.exit_code, 0) << stopped.output;
  EXPECT_NE(stopped.output.find("stopped: SIGTERM received; step=15"), std::string::npos)
      << stopped.output;
  EXPECT_EQ(final_line(stopped.output), "");
  ASSERT_TRUE(fs::exists(path("interrupted/step_00000015.h5")));
  EXPECT_EQ(losses_by_step(stopped.output).rbegin()->first, 15);

  const ProcessResult resumed =
      run_process(common + run_in(path("interrupted")) + " --checkpoint.resume=auto");
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("resumed from " + path("interrupted/step_00000015.h5") +
                                " at step 15"),
            std::string::npos)
      << resumed.output;
  EXPECT_EQ(resumed.output.find("from the run that wrote the checkpoint"), std::string::npos)
      << resumed.output;

  const auto expected = losses_by_step(whole.output);
  const auto actual = losses_by_step(resumed.output);
  ASSERT_EQ(expected.size(), 40u);
  ASSERT_EQ(actual.size(), 25u);  // steps 16..40
  for (const auto& [step, loss] : actual) {
    EXPECT_EQ(loss, expected.at(step)) << "step " << step;
  }
  ASSERT_NE(final_line(whole.output), "");
  EXPECT_EQ(final_line(resumed.output), final_line(whole.output));
  // And the state the two runs end in, every part of it (not only what the losses and the
  // parameters' hash above see): the run id and the checkpoint directory's settings aside.
  const Checkpoint interrupted = read_checkpoint(path("interrupted/step_00000040.h5"));
  EXPECT_EQ(state_difference(read_checkpoint(path("whole/step_00000040.h5")), interrupted,
                             path("final_state_"), true),
            "");
  // A resume from the newest checkpoint (a requeue's) goes on with the run's line: its
  // files need no header branch line, which an older version would not read.
  EXPECT_EQ(interrupted.lineage, (std::vector<BranchStart>{{0, interrupted.run_id}}));
}

// `file` as a later version might write it: with a dataset /ema and an attribute ema_decay
// at its root, which this version does not know.
void add_parts_of_a_later_version(const std::string& file) {
  const hid_t h5 = H5Fopen(file.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  ASSERT_GE(h5, 0);
  const hsize_t count = 4;
  const hid_t space = H5Screate_simple(1, &count, nullptr);
  const hid_t dataset =
      H5Dcreate2(h5, "ema", H5T_NATIVE_FLOAT, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  const float values[4] = {0.5f, 1.5f, 2.5f, 3.5f};
  EXPECT_GE(H5Dwrite(dataset, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, values), 0);
  const hid_t scalar = H5Screate(H5S_SCALAR);
  const hid_t attribute =
      H5Acreate2(h5, "ema_decay", H5T_NATIVE_DOUBLE, scalar, H5P_DEFAULT, H5P_DEFAULT);
  const double decay = 0.9999;
  EXPECT_GE(H5Awrite(attribute, H5T_NATIVE_DOUBLE, &decay), 0);
  H5Aclose(attribute);
  H5Sclose(scalar);
  H5Dclose(dataset);
  H5Sclose(space);
  H5Fclose(h5);
  stamp_checkpoint_header(file);  // edited in place: past the whole-file checksum
}

// The ways a later version's checkpoint can differ from this version's that the reader
// tells from damage, each made of `file`: parts at its root, a format_version, a header
// line, a header version.
const std::vector<std::string> kLaterVersionKinds = {"root parts", "format_version 3",
                                                     "header line", "header version 2"};
void make_it_a_later_versions(const std::string& file, const std::string& kind) {
  if (kind == "root parts") return add_parts_of_a_later_version(file);
  if (kind == "format_version 3") {
    const hid_t h5 = H5Fopen(file.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
    const hid_t attribute = H5Aopen(h5, "format_version", H5P_DEFAULT);
    const int64_t later = 3;
    EXPECT_GE(H5Awrite(attribute, H5T_NATIVE_INT64, &later), 0);
    H5Aclose(attribute);
    H5Fclose(h5);
    return stamp_checkpoint_header(file);
  }
  edit_header(file, [&](std::string& header) {
    if (kind == "header version 2") {
      header.replace(0, 22, "thpc-checkpoint-file 2");
    } else {
      header.replace(header.find('\0'), 11, "ema 0.9999\n");
    }
  });
}

// A checkpoint of a later version: parts at its root this version does not know refuse a
// read of every part (a resume would go on without them; a helper's trial added an EMA of
// the parameters, which older programs dropped without a word) and not a read of the
// parameters (decoding, averaging, checkpoint.init); a later format_version refuses both.
// Either is CheckpointOfANewerVersion, which a resume does not take for damage.
TEST_F(CheckpointTest, ACheckpointOfALaterVersionIsNotResumedAndItsParametersAreRead) {
  Trainer trainer(small_config(path("run")));
  trainer.step();
  const std::string file = path("later.h5");
  write_checkpoint(file, trainer.snapshot());
  add_parts_of_a_later_version(file);
  try {
    read_checkpoint(file);
    ADD_FAILURE() << "read whole";
  } catch (const CheckpointOfANewerVersion& error) {
    const std::string said = error.what();
    EXPECT_NE(said.find(file + ": holds /ema, attribute ema_decay, which this version of the "
                               "program does not know (the checkpoint of a later version?): a "
                               "run resumed from it would go on without them; resume with the "
                               "version that wrote it, or start a new run (another "
                               "checkpoint.dir) from its parameters with checkpoint.init"),
              std::string::npos)
        << said;
  }
  EXPECT_EQ(read_checkpoint(file, CheckpointParts::ParamsOnly).params.size(),
            trainer.snapshot().params.size());

  make_it_a_later_versions(file, "format_version 3");
  for (const CheckpointParts parts : {CheckpointParts::All, CheckpointParts::ParamsOnly}) {
    EXPECT_THROW(read_checkpoint(file, parts), CheckpointOfANewerVersion);
  }
  expect_error([&] { read_checkpoint(file, CheckpointParts::ParamsOnly); },
               {file + ": format_version 3, written by a later version of this program (this "
                       "one reads versions 1 and 2): use the version that wrote it"});

  // Its file header: a line of a key, a state or a metric this version does not know, or a
  // later header version, each a well-formed word; the same with bytes no version writes
  // is damage, as before.
  const struct {
    const char* name;
    std::function<void(std::string&)> change;
    const char* said;
    bool later;
  } headers[] = {
      {"line.h5", [](std::string& h) { h.replace(h.find('\0'), 11, "ema 0.9999\n"); },
       "its file header holds what this version does not know (a later version's header?): a "
       "'ema' line, which this version does not know; "
       "use the version that wrote it", true},
      {"state.h5", [](std::string& h) { h.replace(h.find("state healthy"), 13, "state retired"); },
       "its state is 'retired', which this version does not know", true},
      {"version.h5", [](std::string& h) { h.replace(0, 22, "thpc-checkpoint-file 7"); },
       "its header is of version 7 (this version reads version 1)", true},
      {"garbage.h5", [](std::string& h) { h.replace(h.find('\0'), 6, "E\x01" "a 1\n"); },
       "damaged file header (an unknown line): the file is corrupt", false},
  };
  for (const auto& header : headers) {
    SCOPED_TRACE(header.name);
    const std::string edited = path(header.name);
    write_checkpoint(edited, trainer.snapshot());
    edit_header(edited, header.change);
    for (const CheckpointParts parts : {CheckpointParts::All, CheckpointParts::ParamsOnly}) {
      try {
        read_checkpoint(edited, parts);
        ADD_FAILURE() << "read";
      } catch (const CheckpointOfANewerVersion& error) {
        EXPECT_TRUE(header.later) << error.what();
        EXPECT_NE(std::string(error.what()).find(header.said), std::string::npos) << error.what();
      } catch (const Error& error) {
        EXPECT_FALSE(header.later) << error.what();
        EXPECT_NE(std::string(error.what()).find(header.said), std::string::npos) << error.what();
      }
    }
  }
}

// checkpoint.resume = auto with a checkpoint of a later version the newest (a job requeued
// under an older module): the run stops, naming it, and leaves it where it is. Before, it
// was passed over as invalid, the older one resumed and it moved aside as *.corrupt.
TEST_F(CheckpointTest, AResumeStopsAtACheckpointOfALaterVersionAndMovesNothingAside) {
  for (size_t k = 0; k < kLaterVersionKinds.size(); ++k) {
    const std::string& kind = kLaterVersionKinds[k];
    SCOPED_TRACE(kind);
    const std::string dir = path("run_" + std::to_string(k));
    const std::string run = kTrainer + " " + kTinyIni +
                            " --train.log_every=1 --checkpoint.every_steps=2 --checkpoint.dir=" +
                            dir + " --train.metrics_dir=" + dir;
    const ProcessResult first = run_process(run + " --train.max_steps=4");
    ASSERT_EQ(first.exit_code, 0) << first.output;
    const std::string newest = dir + "/step_00000004.h5";
    make_it_a_later_versions(newest, kind);
    for (const char* resume : {"auto", "auto_or_fresh"}) {
      const ProcessResult resumed = run_process(run + " --train.max_steps=6 --checkpoint.resume=" +
                                                resume);
      EXPECT_EQ(resumed.exit_code, 1) << resumed.output;
      EXPECT_NE(resumed.output.find("error: checkpoint " + newest + ": "), std::string::npos)
          << resumed.output;
      EXPECT_NE(resumed.output.find("the version that wrote it"), std::string::npos)
          << resumed.output;
      EXPECT_EQ(resumed.output.find("resumed from " + dir), std::string::npos) << resumed.output;
      EXPECT_EQ(resumed.output.find("skipping invalid"), std::string::npos) << resumed.output;
      EXPECT_TRUE(fs::exists(newest));
      for (const auto& entry : fs::directory_iterator(dir)) {
        EXPECT_EQ(entry.path().string().find(".corrupt"), std::string::npos) << entry.path();
      }
    }
  }
}

// Every part at a checkpoint's root that this version knows is in docs/checkpoints.md's
// layout (a part added to the writer and the reader's lists, and not to the page, fails).
TEST(CheckpointLayout, TheLayoutNamesEveryPartAtTheRoot) {
  std::ifstream in(std::string(THPC_SOURCE_DIR) + "/docs/checkpoints.md");
  const std::string page((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t begin = page.find("## Layout (format_version 1)");
  const size_t end = page.find("\n## ", begin + 1);
  ASSERT_NE(begin, std::string::npos);
  const std::string layout = page.substr(begin, end - begin);
  for (const std::string& attribute : checkpoint_root_attributes()) {
    EXPECT_TRUE(std::regex_search(layout, std::regex("\\n {10,}" + attribute + " ")))
        << "attribute " << attribute << " is not in docs/checkpoints.md's layout";
  }
  for (const std::string& member : checkpoint_root_members()) {
    EXPECT_NE(layout.find("\n/" + member), std::string::npos)
        << "/" << member << " is not in docs/checkpoints.md's layout";
  }
}

// checkpoint.background_write: the thread writes what the step would have written, while
// the next steps run.
TEST_F(CheckpointTest, ABackgroundWriteHoldsWhatTheStepWouldHaveWritten) {
  const std::string common = kTrainer + " " + kTinyIni +
                             " --train.max_steps=6 --train.log_every=1 "
                             "--checkpoint.every_steps=2 --checkpoint.dir=";
  const auto run_in = [](const std::string& dir) {
    return dir + " --train.metrics_dir=" + dir;
  };
  // Each background write held 500 ms (many steps of the tiny model, even sanitized).
  const ProcessResult beside = run_process("THPC_TEST_CHECKPOINT_WRITE_DELAY_MS=500 " +
                                           common + run_in(path("beside")));
  const ProcessResult in_step =
      run_process(common + run_in(path("in_step")) + " --checkpoint.background_write=false");
  ASSERT_EQ(beside.exit_code, 0) << beside.output;
  ASSERT_EQ(in_step.exit_code, 0) << in_step.output;
  const auto line_of = [](const std::string& output, const std::string& start) {
    const size_t at = output.find("\n" + start);
    EXPECT_NE(at, std::string::npos) << start << " in\n" << output;
    return at;
  };
  // Step 3 ran while step 2's checkpoint was being written, and the line says so; the
  // step writes it before step 3 without the thread.
  const std::string second = "checkpoint " + path("beside/step_00000002.h5");
  EXPECT_LT(line_of(beside.output, "step 3/6"), line_of(beside.output, second)) << beside.output;
  EXPECT_NE(beside.output.find(second + " ("), std::string::npos);
  EXPECT_NE(beside.output.find("s beside training)"), std::string::npos) << beside.output;
  EXPECT_LT(line_of(in_step.output, "checkpoint " + path("in_step/step_00000002.h5")),
            line_of(in_step.output, "step 3/6"));
  EXPECT_EQ(in_step.output.find("beside training"), std::string::npos) << in_step.output;
  // Every step's loss and the result alike; every checkpoint, its whole state alike.
  EXPECT_EQ(losses_by_step(beside.output), losses_by_step(in_step.output));
  ASSERT_NE(final_line(beside.output), "");
  EXPECT_EQ(final_line(beside.output), final_line(in_step.output));
  for (const int64_t step : {2, 4, 6}) {
    SCOPED_TRACE("step " + std::to_string(step));
    const Checkpoint written = read_checkpoint(path("beside/" + checkpoint_file_name(step)));
    const Checkpoint expected = read_checkpoint(path("in_step/" + checkpoint_file_name(step)));
    EXPECT_EQ(written.step, step);
    // Every part (the two runs' ids and directories aside).
    EXPECT_EQ(state_difference(expected, written, path("state_"), true), "");
  }
}

// A HostStaging whose copies land only when waited for, as a GPU's DMA does after the
// host has queued it: before wait(), its memory holds NaN; each copy holds its tensor as
// it was when queued (the backend's order), whatever happens to the tensor after.
class LandingOnWaitStaging final : public HostStaging {
 public:
  LandingOnWaitStaging(Backend& backend, int64_t floats)
      : backend_(backend), queued_(floats, NAN), visible_(floats, NAN) {}
  int64_t floats() const override { return static_cast<int64_t>(visible_.size()); }
  void queue_download(int64_t offset, Tensor src) override {
    ASSERT_LE(offset + src.numel, floats());
    backend_.download(queued_.data() + offset, src);
    ++queued_copies_;
  }
  const float* wait() override {
    visible_ = queued_;
    ++waits_;
    return visible_.data();
  }
  int queued_copies_ = 0;
  int waits_ = 0;

 private:
  Backend& backend_;
  std::vector<float> queued_, visible_;
};

// StagedNamedBuffers (Trainer::staged_snapshot's state, with checkpoint.background_write)
// gives what gather_named gives at the moment of queuing, bit for bit, though the tensors
// change before it is read and the copies land only when waited for; the staging is
// checked for room and the buffers for their layout.
TEST(StagedSnapshot, NamesTheValuesTheBuffersHeldWhenQueued) {
  auto backend = make_cpu_backend(DType::F32);
  ParamStore store;
  store.add("embed.weight", 7, 5, ParamInit::EmbeddingNormal);
  store.add("layer.qkv.weight", 5, 15, ParamInit::XavierUniform, 5, 5);
  store.add("layer.qkv.bias", 1, 15, ParamInit::Zeros);
  store.add("norm.gamma", 1, 5, ParamInit::Ones);
  store.allocate(*backend);
  store.initialize(11);
  Tensor moment = backend->alloc(DType::F32, store.buffer_numel());
  std::vector<float> moment_values(store.buffer_numel());
  for (size_t i = 0; i < moment_values.size(); ++i) moment_values[i] = 0.25f + 1e-3f * i;
  backend->upload(moment, moment_values.data());
  const std::vector<NamedTensor> params_then = gather_named(store, *backend, store.params());
  const std::vector<NamedTensor> moment_then = gather_named(store, *backend, moment);

  auto staging = std::make_shared<LandingOnWaitStaging>(*backend, 2 * store.buffer_numel());
  const StagedNamedBuffers staged(store, staging, {store.params(), moment});
  EXPECT_EQ(staging->queued_copies_, 2);
  EXPECT_EQ(staging->waits_, 0);  // queuing waits for nothing
  backend->zero(store.params());  // the next step's update, after the copies in order
  backend->zero(moment);
  expect_same_tensors(staged.named(0), params_then);
  expect_same_tensors(staged.named(1), moment_then);
  EXPECT_GE(staging->waits_, 1);
  EXPECT_EQ(gather_named(store, *backend, moment)[0].values[0], 0.0f);  // it did change

  const auto small = std::make_shared<LandingOnWaitStaging>(*backend, store.buffer_numel());
  expect_error([&] { StagedNamedBuffers(store, small, {store.params(), moment}); },
               {"staging for 2 buffers"});
  Tensor shorter = backend->alloc(DType::F32, store.buffer_numel() - 1);
  expect_error([&] { StagedNamedBuffers(store, staging, {shorter}); }, {"layout of"});
  // The default staging (every backend's but the CUDA one's, which pins its memory):
  // downloads at once, refuses what does not fit.
  const std::shared_ptr<HostStaging> downloading =
      backend->make_host_staging(store.buffer_numel());
  backend->upload(moment, moment_values.data());
  const StagedNamedBuffers copied(store, downloading, {moment});
  expect_same_tensors(copied.named(0), moment_then);
  expect_error([&] { downloading->queue_download(1, moment); }, {"floats at 1 into"});
  backend->free(shorter);
  backend->free(moment);
}

// A stop (SIGTERM, Slurm's warning) that comes while a checkpoint is being written waits
// for it, then writes its own: the job says it is saved only once both are on disk.
TEST_F(CheckpointTest, AStopWaitsForTheBackgroundWriteUnderWay) {
  const ProcessResult stopped = run_process(
      "THPC_TEST_CHECKPOINT_WRITE_DELAY_MS=500 THPC_TEST_STOP_AT_STEP=3 " + kTrainer + " " +
      kTinyIni + " --train.max_steps=10 --train.log_every=1 --checkpoint.every_steps=2 "
      "--checkpoint.dir=" + path("run"));
  ASSERT_EQ(stopped.exit_code, 0) << stopped.output;
  const size_t stop = stopped.output.find("stopped: SIGTERM received; step=3");
  ASSERT_NE(stop, std::string::npos) << stopped.output;
  for (const int64_t step : {2, 3}) {
    const std::string file = path("run/" + checkpoint_file_name(step));
    const size_t line = stopped.output.find("checkpoint " + file + " (");
    EXPECT_LT(line, stop) << stopped.output;
    EXPECT_EQ(read_checkpoint(file).step, step);  // whole, every digest verified
  }
}

struct SignalledRun {
  std::string log;
  int status = 0;  // as waitpid gives it
  bool signalled = false;
};

// Runs `argv` and sends it SIGTERM as soon as it prints a line starting with `prefix`.
SignalledRun run_and_signal_at(const std::vector<std::string>& argv, const std::string& prefix) {
  SignalledRun run;
  FILE* output = nullptr;
  const pid_t pid = start_process(argv, &output);
  if (pid <= 0 || output == nullptr) return run;
  char line[4096];
  while (!run.signalled && std::fgets(line, sizeof line, output) != nullptr) {
    run.log += line;
    if (std::string(line).rfind(prefix, 0) == 0) {
      ::kill(pid, SIGTERM);
      run.signalled = true;
    }
  }
  run.log += finish_process(pid, output, &run.status);
  return run;
}

TEST_F(CheckpointTest, SigtermFromOutsideStopsCleanlyAndTheRunResumesExactly) {
  // What Slurm does: the signal arrives from another process, at whatever point of a
  // step the trainer is in.
  const std::vector<std::string> command = {kTrainer, kTinyIni, "--model.layers=1",
                                            "--train.max_steps=60", "--train.log_every=1"};
  std::vector<std::string> interrupted = command;
  interrupted.push_back("--checkpoint.dir=" + path("interrupted"));
  interrupted.push_back("--train.metrics_dir=" + path("interrupted"));
  const SignalledRun run = run_and_signal_at(interrupted, "step 5/60 ");
  const std::string& log = run.log;
  ASSERT_TRUE(run.signalled) << log;
  ASSERT_TRUE(WIFEXITED(run.status)) << log;  // not killed by the signal
  EXPECT_EQ(WEXITSTATUS(run.status), 0) << log;
  ASSERT_NE(log.find("stopped: SIGTERM received"), std::string::npos) << log;
  const std::vector<std::string> saved = list_checkpoints(path("interrupted"));
  ASSERT_EQ(saved.size(), 1u) << log;

  std::string resume_command;
  for (const std::string& arg : interrupted) resume_command += arg + " ";
  const ProcessResult resumed = run_process(resume_command + "--checkpoint.resume=auto");
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  std::string whole_command;
  for (const std::string& arg : command) whole_command += arg + " ";
  const ProcessResult whole = run_process(whole_command + "--checkpoint.dir=" + path("whole") +
                                          " --train.metrics_dir=" + path("whole"));
  ASSERT_EQ(whole.exit_code, 0) << whole.output;
  ASSERT_NE(final_line(whole.output), "");
  EXPECT_EQ(final_line(resumed.output), final_line(whole.output));
}

// The text of the file at `path` ("" when there is none).
std::string text_of(const std::string& path) {
  std::ifstream file(path);
  std::stringstream text;
  text << file.rdbuf();
  return text.str();
}

// The children of `pid` (Open MPI's singleton start-up forks its daemon, orted).
bool has_children(pid_t pid) {
  std::ifstream children("/proc/" + std::to_string(pid) + "/task/" + std::to_string(pid) +
                         "/children");
  std::string first;
  return static_cast<bool>(children >> first);
}

// Slurm's signal can come before the first step: while MPI starts, the shards are
// checked, the model is built or a checkpoint is read. main() installs the handler before
// MPI starts, so such a signal stops the run cleanly, with nothing to save, instead of
// killing it (exit 143, no message).
TEST_F(CheckpointTest, SigtermDuringStartUpStopsBeforeTrainingWithExitZero) {
  // 44M parameters: building the model takes about 2 s on the development machine, so
  // the signal, sent as soon as the handler is in, lands inside the start-up.
  // (The file in which a job script learns of the stop: such a run writes no summary.)
  const ScopedEnvironment stop_file(kStartUpStopFileVariable, path("startup_stop.txt"));
  FILE* output = nullptr;
  const pid_t pid = start_process(
      {kTrainer, kTinyIni, "--model.layers=6", "--model.d_model=512", "--model.d_ff=2048",
       "--model.heads=8", "--train.max_steps=5", "--checkpoint.dir=" + path("startup")},
      &output);
  ASSERT_GT(pid, 0);
  ASSERT_NE(output, nullptr);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (!catches_sigterm(pid) && std::chrono::steady_clock::now() < deadline) {
    ::usleep(200);
  }
  // The handler is there before MPI_Init (half a second, in which Open MPI forks its
  // daemon): the signal lands inside MPI's start-up, which used to end the process.
  const bool before_mpi = !has_children(pid);
  ::kill(pid, SIGTERM);
  int status = 0;
  const std::string log = finish_process(pid, output, &status);
  EXPECT_TRUE(before_mpi) << "the stop handler came after MPI started its daemon";
  ASSERT_TRUE(WIFEXITED(status)) << "killed by signal " << WTERMSIG(status) << "\n" << log;
  EXPECT_EQ(WEXITSTATUS(status), 0) << log;
  EXPECT_NE(log.find("stopped before training: SIGTERM received during start-up; step=0, "
                     "nothing to save"),
            std::string::npos)
      << log;
  EXPECT_TRUE(losses_by_step(log).empty()) << log;
  EXPECT_TRUE(list_checkpoints(path("startup")).empty()) << log;
  EXPECT_EQ(text_of(path("startup_stop.txt")), "SIGTERM\n") << log;
}

TEST_F(CheckpointTest, SigtermWhileReadingTheCheckpointStopsWithoutANewOne) {
  // 11M parameters: a 133 MB checkpoint, about a second to read and verify here.
  const std::vector<std::string> command = {
      kTrainer, kTinyIni, "--model.layers=6", "--model.d_model=256", "--model.d_ff=1024",
      "--checkpoint.dir=" + path("resume"), "--checkpoint.resume=auto"};
  std::string first_run;
  for (const std::string& arg : command) first_run += arg + " ";
  const ProcessResult first = run_process(first_run + "--train.max_steps=1");
  ASSERT_EQ(first.exit_code, 0) << first.output;
  ASSERT_EQ(list_checkpoints(path("resume")).size(), 1u) << first.output;

  std::vector<std::string> resumed = command;
  resumed.push_back("--train.max_steps=3");
  const ScopedEnvironment stop_file(kStartUpStopFileVariable, path("reading_stop.txt"));
  // The "training ..." line comes just before the checkpoint is read.
  const SignalledRun run = run_and_signal_at(resumed, "training ");
  const std::string& log = run.log;
  ASSERT_TRUE(run.signalled) << log;
  ASSERT_TRUE(WIFEXITED(run.status)) << "killed by signal " << WTERMSIG(run.status) << "\n" << log;
  EXPECT_EQ(WEXITSTATUS(run.status), 0) << log;
  EXPECT_NE(log.find("stopped before training: SIGTERM received during start-up"),
            std::string::npos)
      << log;
  EXPECT_TRUE(losses_by_step(log).empty()) << log;
  // The state is the checkpoint's: nothing new was written.
  EXPECT_EQ(list_checkpoints(path("resume")),
            std::vector<std::string>{path("resume/step_00000001.h5")})
      << log;
  EXPECT_EQ(text_of(path("reading_stop.txt")), "SIGTERM\n") << log;
}

TEST(StopSignal, SigusrOneAsksToStopAndTheOldHandlerComesBack) {
  static volatile std::sig_atomic_t previous_handler_calls = 0;
  std::signal(SIGUSR1, [](int) { previous_handler_calls = previous_handler_calls + 1; });
  {
    const StopSignalGuard guard;
    EXPECT_EQ(stop_requested_by(), 0);
    std::raise(SIGUSR1);
    EXPECT_EQ(stop_requested_by(), SIGUSR1);
    EXPECT_EQ(previous_handler_calls, 0);
  }
  std::raise(SIGUSR1);
  EXPECT_EQ(previous_handler_calls, 1);
  std::signal(SIGUSR1, SIG_DFL);
}

// Ctrl-C asks to stop like SIGTERM (issue 34's second probe: SIGINT to one rank killed it,
// and the job, without a checkpoint), once: a second SIGINT ends the process as Ctrl-C
// does; a SIGINT ignored on entry (a shell's background job) stays ignored.
TEST(StopSignal, SigintAsksToStopOnceASecondOneEndsTheProcessAndAnIgnoredOneStaysIgnored) {
  // The test may itself run with SIGINT ignored (started in the background).
  const auto original = std::signal(SIGINT, SIG_DFL);
  {
    const StopSignalGuard guard;
    std::raise(SIGINT);
    EXPECT_EQ(stop_requested_by(), SIGINT);
    EXPECT_STREQ(stop_signal_name(SIGINT), "SIGINT");
    std::raise(SIGTERM);  // the scheduler's stop outranks an interactive one
    EXPECT_EQ(stop_requested_by(), SIGTERM);
  }
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    const StopSignalGuard guard;
    std::raise(SIGINT);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    std::raise(SIGINT);  // ends the child by SIGINT
    _exit(stop_requested_by() == SIGINT ? 3 : 4);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGINT) << status;
  // The same SIGINT delivered twice at once (`timeout -s INT` signals the child and its
  // process group): one request, the process stays to write its checkpoint.
  const pid_t twice = fork();
  ASSERT_GE(twice, 0);
  if (twice == 0) {
    const StopSignalGuard guard;
    std::raise(SIGINT);
    std::raise(SIGINT);
    _exit(stop_requested_by() == SIGINT ? 3 : 4);
  }
  ASSERT_EQ(waitpid(twice, &status, 0), twice);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 3) << status;
  std::signal(SIGINT, SIG_IGN);
  {
    const StopSignalGuard guard;
    std::raise(SIGINT);
    EXPECT_EQ(stop_requested_by(), 0);
  }
  std::signal(SIGINT, original);
}

// What a forked child running `body` wrote on its standard error, and how it ended
// (waitpid's status): `body` raises the signals under test, and ends the child itself.
std::pair<std::string, int> child_standard_error(const std::function<void()>& body) {
  int pipe_ends[2];
  if (pipe(pipe_ends) != 0) return {"pipe failed", -1};
  const pid_t child = fork();
  if (child == 0) {
    dup2(pipe_ends[1], STDERR_FILENO);
    close(pipe_ends[0]);
    body();
    _exit(3);
  }
  close(pipe_ends[1]);
  std::string said;
  char buffer[256];
  for (ssize_t got; (got = read(pipe_ends[0], buffer, sizeof buffer)) > 0;) {
    said.append(buffer, static_cast<size_t>(got));
  }
  close(pipe_ends[0]);
  int status = -1;
  if (child < 0 || waitpid(child, &status, 0) != child) return {said + "(no child)", -1};
  return {said, status};
}

// Where the process announces interrupts (rank 0 of transformer_hpc), a first Ctrl-C
// says at once on stderr that the run stops cleanly, and a second that it stops now
// without a checkpoint: before, the first seemed to do nothing for as long as a step and
// its checkpoint took.
TEST(StopSignal, AnnouncedCtrlCSaysWhatItDoes) {
  const auto original = std::signal(SIGINT, SIG_DFL);
  // The run directory's lock goes with the process (before: left for the next start).
  const std::string lock =
      (fs::temp_directory_path() / ("thpc_ctrl_c_lock_" + std::to_string(getpid()))).string();
  std::ofstream(lock) << "host=here\n";
  // A lock another trainer took over while this one was suspended (past the lock's
  // staleness) holds the other's text: it stays, the other's.
  const std::string taken_over = lock + "_taken_over";
  std::ofstream(taken_over) << "host=there\n";
  // So does a checkpoint's write under way, its temporary file (write_atomically's): before,
  // it stayed, as large as the checkpoint, until the next start removed it.
  const std::string temporary = (fs::temp_directory_path() /
                                 (".thpc_ctrl_c_" + std::to_string(getpid()) + ".h5.tmp"))
                                    .string();
  std::ofstream(temporary) << "half a checkpoint";
  const auto [said, status] = child_standard_error([&] {
    const StopSignalGuard guard;
    remove_at_abrupt_stop(lock, "host=here\n");
    remove_at_abrupt_stop(taken_over, "host=here\n");
    const RemovedWhenInterrupted being_written(temporary);
    announce_interrupts();
    std::raise(SIGINT);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    std::raise(SIGINT);  // ends the child by SIGINT, after its line
  });
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGINT) << status;
  EXPECT_EQ(said,
            "Ctrl-C: stopping cleanly (a step in progress finishes and is saved in a checkpoint); "
            "Ctrl-C again stops at once, without one, and loses one being written\n"
            "Ctrl-C again: stopping now, without a checkpoint (one being written is lost too)\n");
  EXPECT_FALSE(fs::exists(lock));
  EXPECT_TRUE(fs::exists(taken_over));
  EXPECT_FALSE(fs::exists(temporary));
  fs::remove(temporary);
  fs::remove(lock);
  fs::remove(taken_over);
  std::signal(SIGINT, original);
}

// A Ctrl-C after another stop signal (a scheduler's SIGTERM) says the run is already
// stopping (before: that it began stopping then, and, the run being done, after the run's
// own "stopped:" line; a helper's trial).
TEST(StopSignal, ACtrlCAfterAnotherStopSaysTheRunIsAlreadyStopping) {
  const auto [said, status] = child_standard_error([] {
    const StopSignalGuard guard;
    announce_interrupts();
    std::raise(SIGTERM);
    std::raise(SIGINT);
    _exit(stop_requested_by() == SIGTERM ? 0 : 4);  // the stronger request stays
  });
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  EXPECT_EQ(said, "Ctrl-C: already stopping, as a signal before it asked; Ctrl-C again stops "
                  "at once, without a checkpoint, and loses one being written\n");
}

// A closed terminal or ssh session (SIGHUP) asks to stop like SIGTERM: before, it killed
// the trainer with no checkpoint and no message. Started with it ignored (nohup), the run
// keeps ignoring it.
TEST(StopSignal, SighupAsksToStopUnlessItWasIgnoredOnEntry) {
  const auto original = std::signal(SIGHUP, SIG_DFL);
  {
    const StopSignalGuard guard;
    std::raise(SIGHUP);
    EXPECT_EQ(stop_requested_by(), SIGHUP);
    EXPECT_STREQ(stop_signal_name(SIGHUP), "SIGHUP");
    std::raise(SIGINT);  // any other stop request outranks a hang-up
    EXPECT_EQ(stop_requested_by(), SIGINT);
  }
  std::signal(SIGHUP, SIG_IGN);
  {
    const StopSignalGuard guard;
    std::raise(SIGHUP);
    EXPECT_EQ(stop_requested_by(), 0);
  }
  std::signal(SIGHUP, original);
}

// A log piped to a reader that is gone (`| head`, or `| tee` that the same Ctrl-C or
// closed ssh session ended): the next write killed the trainer by SIGPIPE, exit 141,
// without its checkpoint, its lock left behind. SIGPIPE is ignored: the run prints no
// more and ends as it would have.
TEST_F(CheckpointTest, ALogPipedToAReaderThatIsGoneCostsTheRunNothing) {
  const ProcessResult run = run_process(
      "bash -c '" + kTrainer + " " + kTinyIni + " --train.max_steps=3 --train.log_every=1 "
      "--train.valid_every=0 --checkpoint.dir=" + path("run") + " 2>&1 | head -c 1 > "
      "/dev/null; echo \"trainer exit ${PIPESTATUS[0]}\"'");
  EXPECT_NE(run.output.find("trainer exit 0"), std::string::npos) << run.output;
  EXPECT_TRUE(fs::exists(path("run/step_00000003.h5"))) << run.output;
  EXPECT_FALSE(fs::exists(path("run/trainer.lock"))) << run.output;
}

// ---- when checkpoints are written, and how many stay ----

TEST_F(CheckpointTest, MinutesSaveOnTheClockDuringTheRunAndZeroDoesNot) {
  // An injected clock on which every step takes 10 s: with checkpoint.minutes = 0.5 a
  // checkpoint falls due every third step, whatever the machine's speed.
  std::ostringstream log;
  Trainer timed(small_config(path("timed"), {"train.max_steps=20", "checkpoint.minutes=0.5",
                                             "checkpoint.keep=100"}));
  timed.set_checkpoint_clock([](int64_t steps) { return 10.0 * static_cast<double>(steps); });
  timed.run(log);
  std::vector<std::string> names;
  for (const std::string& file : list_checkpoints(path("timed"))) {
    names.push_back(fs::path(file).filename().string());
  }
  EXPECT_EQ(names, (std::vector<std::string>{"step_00000003.h5", "step_00000006.h5",
                                             "step_00000009.h5", "step_00000012.h5",
                                             "step_00000015.h5", "step_00000018.h5",
                                             "step_00000020.h5"}))
      << log.str();

  std::ostringstream quiet_log;
  Trainer(small_config(path("untimed"), {"train.max_steps=20", "checkpoint.minutes=0"}))
      .run(quiet_log);
  const std::vector<std::string> only_final = list_checkpoints(path("untimed"));
  ASSERT_EQ(only_final.size(), 1u) << quiet_log.str();
  EXPECT_EQ(fs::path(only_final[0]).filename(), "step_00000020.h5");
}

TEST_F(CheckpointTest, MaxMinutesEndsTheRunLikeMaxStepsAndAResumeCountsAfresh) {
  // The injected clock again (10 s a step): train.max_minutes = 0.5 ends the run after
  // step 3, the first to end 30 s into training, with the final checkpoint a finished
  // run writes; a resume has 30 s of its own and ends at step 6, with the parameters of
  // a 6-step run that was never stopped.
  const std::vector<std::string> limited = {"train.max_steps=20", "train.max_minutes=0.5",
                                            "checkpoint.minutes=0"};
  std::ostringstream log;
  Trainer first(small_config(path("limited"), limited));
  first.set_checkpoint_clock([](int64_t steps) { return 10.0 * static_cast<double>(steps); });
  EXPECT_EQ(first.run(log), RunEnd::Finished);
  EXPECT_EQ(first.completed_steps(), 3) << log.str();
  EXPECT_NE(log.str().find("stopping at step 3: train.max_minutes = 0.5"), std::string::npos)
      << log.str();
  // Its last step has a progress line (train.log_every = 100 logs none before), before the
  // stop's note: metrics.jsonl and the event file lacked the last step of such a run.
  const size_t step_line = log.str().find("step 3/20 | loss ");
  EXPECT_NE(step_line, std::string::npos) << log.str();
  EXPECT_LT(step_line, log.str().find("stopping at step 3")) << log.str();
  EXPECT_EQ(log.str().find("step 2/20 | loss "), std::string::npos) << log.str();
  const std::vector<std::string> saved = list_checkpoints(path("limited"));
  ASSERT_EQ(saved.size(), 1u) << log.str();
  EXPECT_EQ(fs::path(saved[0]).filename(), "step_00000003.h5");

  std::vector<std::string> resume = limited;
  resume.push_back("checkpoint.resume=auto");
  Trainer second(small_config(path("limited"), resume));
  second.set_checkpoint_clock([](int64_t steps) { return 10.0 * static_cast<double>(steps); });
  EXPECT_EQ(second.run(log), RunEnd::Finished);
  EXPECT_EQ(second.completed_steps(), 6) << log.str();

  Trainer whole(small_config(path("whole"), {"train.max_steps=6", "checkpoint.minutes=0"}));
  whole.run(log);
  EXPECT_EQ(second.model().params().sha256_hex(), whole.model().params().sha256_hex());
}

TEST_F(CheckpointTest, KeepsTheLastKAndAveragesTheLastN) {
  std::ostringstream log;
  Trainer(small_config(path("run"), {"train.max_steps=10", "checkpoint.every_steps=2",
                                     "checkpoint.keep=3", "checkpoint.average_last=3"}))
      .run(log);
  std::vector<std::string> names;
  for (const std::string& file : list_checkpoints(path("run"))) {
    names.push_back(fs::path(file).filename().string());
  }
  // ASSERT: the mean below reads three of them (a wrong count crashed the test instead).
  ASSERT_EQ(names, (std::vector<std::string>{"step_00000006.h5", "step_00000008.h5",
                                             "step_00000010.h5"}))
      << log.str();

  // The run's own average is the element-wise mean of the three it kept.
  const Checkpoint average = read_checkpoint(path("run/average_last3.h5"),
                                             CheckpointParts::ParamsOnly);
  EXPECT_EQ(average.step, 10);
  std::vector<Checkpoint> kept;
  for (const std::string& name : names) kept.push_back(read_checkpoint(path("run/" + name)));
  for (size_t t = 0; t < average.params.size(); ++t) {
    for (size_t i = 0; i < average.params[t].values.size(); i += 97) {
      const double mean = (static_cast<double>(kept[0].params[t].values[i]) +
                           kept[1].params[t].values[i] + kept[2].params[t].values[i]) /
                          3.0;
      EXPECT_EQ(average.params[t].values[i], static_cast<float>(mean));
    }
  }

  // Fewer checkpoints of the schedule than average_last, where more healthy ones exist (a
  // resume that changed every_steps), are said so: "only that many healthy ones exist"
  // was read beside a directory holding four.
  {
    const std::string dir = path("schedule_changed");
    Trainer(small_config(dir, {"train.max_steps=6", "checkpoint.every_steps=2",
                               "checkpoint.minutes=0", "checkpoint.keep=5",
                               "checkpoint.average_last=0"}))
        .run(log);
    std::ostringstream resumed_log;
    Trainer(small_config(dir, {"train.max_steps=7", "checkpoint.every_steps=5",
                               "checkpoint.minutes=0", "checkpoint.keep=5",
                               "checkpoint.average_last=3", "checkpoint.resume=auto"}))
        .run(resumed_log);
    EXPECT_NE(resumed_log.str().find(
                  "warning: average of the last 1 checkpoint (fewer than "
                  "checkpoint.average_last = 3: only that many healthy ones are of the "
                  "schedule, at multiples of checkpoint.every_steps = 5 or the last step;"),
              std::string::npos)
        << resumed_log.str();
  }

  // A checkpoint off a schedule by steps alone (a stop signal's at step 9, resumed to the
  // end, as a requeued job's) is no point of the window: steps 6, 8 and 10 are averaged
  // (before: 8, 9 and 10, and jobs/common.sh's paper window held the stop's step). With
  // checkpoints by time too, any is one of the schedule: 8, 9 and 10. checkpoint.keep =
  // average_last is enough: the stop's checkpoint, kept as the last known good, is not
  // counted (before, step 6 was pruned and the window held 8 and 10 alone).
  for (const char* minutes : {"checkpoint.minutes=0", "checkpoint.minutes=10"}) {
    const std::string dir = path(std::string("stopped_") + (minutes[19] == '0' ? "0" : "10"));
    Trainer(small_config(dir, {"train.max_steps=9", "checkpoint.every_steps=2", minutes,
                               "checkpoint.keep=3", "checkpoint.average_last=0"}))
        .run(log);
    ASSERT_TRUE(fs::exists(dir + "/step_00000009.h5")) << log.str();
    Trainer(small_config(dir, {"train.max_steps=10", "checkpoint.every_steps=2", minutes,
                               "checkpoint.keep=3", "checkpoint.average_last=3",
                               "checkpoint.resume=auto"}))
        .run(log);
    std::vector<std::string> kept_files;
    for (const std::string& file : list_checkpoints(dir)) {
      kept_files.push_back(fs::path(file).filename().string());
    }
    EXPECT_EQ(kept_files, minutes[19] == '0'
                              ? (std::vector<std::string>{"step_00000006.h5", "step_00000008.h5",
                                                          "step_00000009.h5", "step_00000010.h5"})
                              : (std::vector<std::string>{"step_00000008.h5", "step_00000009.h5",
                                                          "step_00000010.h5"}))
        << minutes;
    const Checkpoint window =
        read_checkpoint(dir + "/average_last3.h5", CheckpointParts::ParamsOnly);
    const bool by_steps = minutes[19] == '0';
    const Checkpoint expected = average_checkpoints(
        {dir + (by_steps ? "/step_00000006.h5" : "/step_00000008.h5"),
         dir + (by_steps ? "/step_00000008.h5" : "/step_00000009.h5"),
         dir + "/step_00000010.h5"});
    ASSERT_EQ(window.params.size(), expected.params.size());
    for (size_t t = 0; t < window.params.size(); ++t) {
      EXPECT_EQ(window.params[t].values, expected.params[t].values)
          << minutes << ": " << window.params[t].name;
    }
    // transformer_average chooses as the trainer does when told the schedule
    // (--every-steps): 6, 8 and 10 (before: only the newest N, 8, 9 and 10, which
    // --last alone still takes).
    if (!by_steps) continue;
    for (const bool schedule : {true, false}) {
      const std::string output = dir + (schedule ? "/by_tool.h5" : "/newest.h5");
      const ProcessResult tool = run_process(kAverager + " --inputs " + dir + " --last 3" +
                                             (schedule ? " --every-steps 2" : "") +
                                             " --output " + output);
      ASSERT_EQ(tool.exit_code, 0) << tool.output;
      EXPECT_NE(tool.output.find(schedule ? "step_00000006.h5 " + dir + "/step_00000008.h5 "
                                          : "step_00000008.h5 " + dir + "/step_00000009.h5 "),
                std::string::npos)
          << tool.output;
      if (schedule) {
        const Checkpoint by_tool = read_checkpoint(output, CheckpointParts::ParamsOnly);
        for (size_t t = 0; t < window.params.size(); ++t) {
          EXPECT_EQ(by_tool.params[t].values, window.params[t].values) << by_tool.params[t].name;
        }
      }
    }
    const ProcessResult too_many = run_process(kAverager + " --inputs " + dir +
                                               " --last 4 --every-steps 2 --output " + dir +
                                               "/four.h5");
    EXPECT_EQ(too_many.exit_code, 2) << too_many.output;
    EXPECT_NE(too_many.output.find(" holds 3 healthy step_*.h5 checkpoints of a schedule every "
                                   "2 steps (multiples of it, and the newest), --last asks "
                                   "for 4"),
              std::string::npos)
        << too_many.output;
    // 0 was taken as the option left out, with no word said.
    const ProcessResult zero = run_process(kAverager + " --inputs " + dir +
                                           " --last 2 --every-steps 0 --output " + dir +
                                           "/zero.h5");
    EXPECT_EQ(zero.exit_code, 2) << zero.output;
    EXPECT_NE(zero.output.find("--every-steps 0: give the run's checkpoint.every_steps"),
              std::string::npos)
        << zero.output;
  }
}

TEST_F(CheckpointTest, PruningNeverDeletesTheOneJustWritten) {
  const Checkpoint checkpoint = constant_checkpoint(1.0f, 5, "arch");
  for (int64_t step : {5, 7, 9}) write_checkpoint(path(checkpoint_file_name(step)), checkpoint);
  // A stale newer file (a run resumed from an older checkpoint) must not push out the
  // checkpoint that was just written.
  const std::vector<std::string> deleted =
      prune_checkpoints(directory_.string(), 1, path(checkpoint_file_name(5)));
  EXPECT_EQ(deleted, std::vector<std::string>{path(checkpoint_file_name(7))});
  EXPECT_TRUE(fs::exists(path(checkpoint_file_name(5))));
  EXPECT_TRUE(fs::exists(path(checkpoint_file_name(9))));
}

// A resume whose checkpoint.keep, from the config file (or its default), is lower than the
// run's (its first start had --checkpoint.keep=7): refused before anything is written,
// exit 2, naming the files its next checkpoint would delete and both ways on; given on
// the command line it prunes them (a helper's trial: a resume given the config file alone
// deleted three of the run's checkpoints, with only a note among the settings that differ).
TEST_F(CheckpointTest, AResumeWhoseKeepIsLowerThanTheRunsDeletesNothingUnlessToldOnTheCommandLine) {
  const std::string dir = path("run");
  const std::string start = kTrainer + " " + kTinyIni + " --model.layers=1 " +
                            "--checkpoint.every_steps=1 --checkpoint.dir=" + dir;
  // Lowered where nothing is deleted (4 files, and the next makes 5): not refused.
  const ProcessResult four = run_process(start + " --train.max_steps=4 --checkpoint.keep=7");
  ASSERT_EQ(four.exit_code, 0) << four.output;
  const ProcessResult five = run_process(start + " --train.max_steps=5 --checkpoint.resume=auto");
  ASSERT_EQ(five.exit_code, 0) << five.output;
  EXPECT_EQ(list_checkpoints(dir).size(), 5u);
  const ProcessResult first = run_process(start + " --train.max_steps=6 --checkpoint.keep=7 "
                                          "--checkpoint.resume=auto");
  ASSERT_EQ(first.exit_code, 0) << first.output;
  const std::vector<std::string> kept = list_checkpoints(dir);
  ASSERT_EQ(kept.size(), 6u);
  const ProcessResult refused =
      run_process(start + " --train.max_steps=8 --checkpoint.resume=auto");
  EXPECT_EQ(refused.exit_code, 2) << refused.output;
  EXPECT_NE(refused.output.find("checkpoint.keep = 5 (not given on the command line) is lower "
                                "than the 7 of the run that wrote " + dir +
                                "/step_00000006.h5: its next checkpoint would delete up to 2 of "
                                "the 6 checkpoints in " + dir + " (diverged and superseded "
                                "ones first, then the oldest); give --checkpoint.keep=5 on the "
                                "command line to delete them, or --checkpoint.keep=7 to keep "
                                "the run's setting"),
            std::string::npos)
      << refused.output;
  EXPECT_EQ(refused.output.find("step 7/"), std::string::npos) << refused.output;
  EXPECT_EQ(list_checkpoints(dir), kept);
  // A resume with no step left writes and prunes nothing: not refused (a requeued job
  // re-runs its finished first phase so, jobs/common.sh; a review found it refused).
  const ProcessResult at_the_end =
      run_process(start + " --train.max_steps=6 --checkpoint.resume=auto");
  EXPECT_EQ(at_the_end.exit_code, 0) << at_the_end.output;
  EXPECT_EQ(list_checkpoints(dir), kept);
  // The run's own keep, or a value at least as large: nothing to refuse.
  const ProcessResult same =
      run_process(start + " --train.max_steps=7 --checkpoint.resume=auto --checkpoint.keep=7");
  EXPECT_EQ(same.exit_code, 0) << same.output;
  EXPECT_EQ(list_checkpoints(dir).size(), 7u);
  // Told on the command line: pruned to it.
  const ProcessResult told =
      run_process(start + " --train.max_steps=8 --checkpoint.resume=auto --checkpoint.keep=5");
  EXPECT_EQ(told.exit_code, 0) << told.output;
  EXPECT_EQ(list_checkpoints(dir).size(), 5u);
  EXPECT_NE(told.output.find("removed old checkpoint " + dir + "/step_00000001.h5 "
                             "(checkpoint.keep = 5)"),
            std::string::npos)
      << told.output;
}

// A schedule by steps alone (every 20): the stop checkpoints of two requeues inside the
// averaged window (45, 65) go before a step of the schedule, so that the window's steps
// stay (jobs/common.sh's phase 2; before, the oldest went first and the second requeue
// pruned one of them). The newest and the one before it stay as always; that one, 85, is
// off the schedule and not counted in keep (before, keep = 5 held 4 of the schedule's).
TEST_F(CheckpointTest, PruningBySchedulePassesOverStopCheckpointsFirst) {
  for (int64_t step : {20, 40, 45, 60, 65, 80, 85, 100}) {
    write_checkpoint(path(checkpoint_file_name(step)), constant_checkpoint(1.0f, step, "arch"));
  }
  std::vector<std::string> deleted =
      prune_checkpoints(directory_.string(), 5, path(checkpoint_file_name(100)), 20);
  EXPECT_EQ(deleted, (std::vector<std::string>{path(checkpoint_file_name(45)),
                                               path(checkpoint_file_name(65))}));
  // The schedule's last five, 20 to 100, kept, with 85 (the one before the newest).
  for (int64_t step : {20, 40, 60, 80, 85, 100}) {
    EXPECT_TRUE(fs::exists(path(checkpoint_file_name(step)))) << step;
  }
  // Once a step of the schedule follows it, 85 goes first, then the schedule's oldest.
  write_checkpoint(path(checkpoint_file_name(120)), constant_checkpoint(1.0f, 120, "arch"));
  deleted = prune_checkpoints(directory_.string(), 5, path(checkpoint_file_name(120)), 20);
  EXPECT_EQ(deleted, (std::vector<std::string>{path(checkpoint_file_name(85)),
                                               path(checkpoint_file_name(20))}));
  // The run's last step is the schedule's too (train.max_steps 125, off the multiples):
  // its checkpoint counts, as its average takes it (uncounted, keep 5 kept 6; a review's
  // finding).
  write_checkpoint(path(checkpoint_file_name(125)), constant_checkpoint(1.0f, 125, "arch"));
  deleted = prune_checkpoints(directory_.string(), 5, path(checkpoint_file_name(125)), 20, 125);
  EXPECT_EQ(deleted, (std::vector<std::string>{path(checkpoint_file_name(40))}));
  fs::remove(path(checkpoint_file_name(125)));
  // Without a schedule, oldest first, each counted, as before.
  write_checkpoint(path(checkpoint_file_name(125)), constant_checkpoint(1.0f, 125, "arch"));
  deleted = prune_checkpoints(directory_.string(), 3, path(checkpoint_file_name(125)));
  EXPECT_EQ(deleted, (std::vector<std::string>{path(checkpoint_file_name(60)),
                                               path(checkpoint_file_name(80))}));
}

TEST_F(CheckpointTest, AFailedWriteLeavesNoFileBehind) {
  Checkpoint twice = constant_checkpoint(1.0f, 3, "arch");
  twice.params.push_back(twice.params.front());  // HDF5 refuses a second dataset of one name
  const std::string file = path(checkpoint_file_name(3));
  expect_error([&] { write_checkpoint(file, twice); },
               {"cannot write checkpoint " + file, "dataset /params/a.weight"});
  EXPECT_TRUE(fs::is_empty(directory_));  // neither the checkpoint nor its .tmp
  // A write whose last step, the rename, fails (here a directory holds the name): the
  // whole temporary was left behind (a base checkpoint's 757 MB, which nothing removes
  // outside a run directory).
  fs::create_directories(fs::path(file) / "inside");
  expect_error([&] { write_checkpoint(file, constant_checkpoint(1.0f, 3, "arch")); },
               {"cannot write checkpoint " + file, "rename of",
                "(" + temporary_path(file) + " is removed)"});
  EXPECT_FALSE(fs::exists(temporary_path(file)));
}

// ---- averaging ----

TEST_F(CheckpointTest, AveragingKnownValuesIsExact) {
  const std::string architecture = "layers=1 test";
  write_checkpoint(path("ckpt/step_00000010.h5"), constant_checkpoint(1.0f, 10, architecture));
  write_checkpoint(path("ckpt/step_00000020.h5"), constant_checkpoint(2.0f, 20, architecture));
  write_checkpoint(path("ckpt/step_00000030.h5"), constant_checkpoint(6.0f, 30, architecture));

  const Checkpoint average = average_checkpoints(list_checkpoints(path("ckpt")));
  EXPECT_EQ(average.step, 30);
  EXPECT_TRUE(average.adam_m.empty());
  for (const NamedTensor& tensor : average.params) {
    for (float value : tensor.values) EXPECT_EQ(value, 3.0f) << tensor.name;
  }

  // The program: --inputs DIR --last N, and a list of files.
  const ProcessResult by_dir = run_process(kAverager + " --inputs " + path("ckpt") +
                                           " --last 2 --output " + path("last2.h5"));
  ASSERT_EQ(by_dir.exit_code, 0) << by_dir.output;
  for (const NamedTensor& tensor : read_checkpoint(path("last2.h5"), CheckpointParts::ParamsOnly)
                                       .params) {
    for (float value : tensor.values) EXPECT_EQ(value, 4.0f) << tensor.name;  // (2 + 6) / 2
  }
  const ProcessResult by_files =
      run_process(kAverager + " --inputs " + path("ckpt/step_00000010.h5") + " " +
                  path("ckpt/step_00000030.h5") + " --output " + path("pair.h5"));
  ASSERT_EQ(by_files.exit_code, 0) << by_files.output;
  for (const NamedTensor& tensor : read_checkpoint(path("pair.h5"), CheckpointParts::ParamsOnly)
                                       .params) {
    for (float value : tensor.values) EXPECT_EQ(value, 3.5f) << tensor.name;  // (1 + 6) / 2
  }
  // Which files it averaged, at the head of its configuration (the file kept no trace).
  EXPECT_EQ(ini_header_value(read_checkpoint(path("pair.h5"), CheckpointParts::ParamsOnly)
                                 .config_ini,
                             kAveragedFrom),
            path("ckpt/step_00000010.h5") + " (step 10), " + path("ckpt/step_00000030.h5") +
                " (step 30)");
  EXPECT_EQ(ini_header_value(average.config_ini, kAveragedFrom),
            path("ckpt/step_00000010.h5") + " (step 10), " + path("ckpt/step_00000020.h5") +
                " (step 20), " + path("ckpt/step_00000030.h5") + " (step 30)");
}

// An average and an int8 copy (derived_checkpoint_of) keep the model and where its
// parameters stand, and none of the state of the run at that step, which no run resumes
// from them: before, an average kept its newest input's corpus, validation-set and
// directory records and a pending validation, which transformer_quantize's copy dropped.
// (An average names the data its inputs agree on: average_checkpoints.)
TEST_F(CheckpointTest, ADerivedCheckpointKeepsTheModelAndNoneOfTheRunsState) {
  Trainer trainer(small_config(path("run")));
  trainer.step();
  Checkpoint source = trainer.snapshot();
  source.spm_model = "a SentencePiece model";
  source.direction = "en->de";
  source.best_valid->ppl = {3.25, 1, 0};
  source.run_id = "0123456789abcdef";
  source.corpus_sha256 = std::string(64, 'c');
  source.valid_sha256 = std::string(64, 'v');
  source.loss = 2.5;
  source.validation_pending = true;
  ASSERT_FALSE(source.working_directory.empty());
  ASSERT_TRUE(source.divergence.has_value());
  ASSERT_FALSE(source.adam_m.empty());
  Checkpoint with_score = source;
  with_score.state = CheckpointState::Superseded;
  with_score.validation = ValidationScore{"bleu", 30.0};

  const Checkpoint derived = derived_checkpoint_of(with_score);
  EXPECT_EQ(derived.step, source.step);
  EXPECT_EQ(derived.seed, source.seed);
  EXPECT_EQ(derived.world_size, source.world_size);
  EXPECT_EQ(derived.data_position.index, source.data_position.index);
  EXPECT_EQ(derived.architecture, source.architecture);
  EXPECT_EQ(derived.config_ini, source.config_ini);
  EXPECT_EQ(derived.spm_model, source.spm_model);
  EXPECT_EQ(derived.direction, source.direction);
  EXPECT_TRUE(derived.params.empty() && derived.quantized.empty());  // the caller's
  EXPECT_TRUE(derived.adam_m.empty() && derived.adam_v.empty());
  EXPECT_FALSE(derived.best_valid || derived.divergence || derived.validation);
  EXPECT_EQ(derived.run_id + derived.working_directory + derived.corpus_sha256 +
                derived.valid_sha256,
            "");
  EXPECT_TRUE(std::isnan(derived.loss));
  EXPECT_EQ(derived.state, CheckpointState::Healthy);
  EXPECT_FALSE(derived.validation_pending);

  // The average of a file alone, and its int8 copy: the same parts, and its parameters;
  // the average's configuration names the file it averaged at its head.
  write_checkpoint(path("source.h5"), source);
  for (const Checkpoint& made :
       {average_checkpoints({path("source.h5")}), quantize_checkpoint(source)}) {
    EXPECT_EQ(made.params.size(), source.params.size());
    Checkpoint expected = derived_checkpoint_of(source);
    expected.params = made.params;
    expected.quantized = made.quantized;
    if (made.quantized.empty()) {
      expected.config_ini = with_header_lines(
          expected.config_ini,
          {header_line(kAveragedFrom, path("source.h5") + " (step 1, run 0123456789abcdef)")});
      // (the data its inputs agree on)
      expected.corpus_sha256 = source.corpus_sha256;
      expected.valid_sha256 = source.valid_sha256;
    }
    EXPECT_EQ(state_difference(expected, made, path("made_"), false), "");
  }
}

// A damaged checkpoint among those --last chose is refused, naming it, with the way on:
// moved aside, --last takes the next older one (before: "cannot be opened, the file is
// truncated or damaged", and nothing of what to do; a helper's trial). A damaged file
// named by hand gets no such advice: there was no choice.
TEST_F(CheckpointTest, ADamagedCheckpointAmongTheLastIsNamedWithTheWayOn) {
  const std::string architecture = "layers=1 test";
  write_checkpoint(path("ckpt/step_00000010.h5"), constant_checkpoint(1.0f, 10, architecture));
  write_checkpoint(path("ckpt/step_00000020.h5"), constant_checkpoint(2.0f, 20, architecture));
  write_checkpoint(path("ckpt/step_00000030.h5"), constant_checkpoint(6.0f, 30, architecture));
  const std::string damaged = path("ckpt/step_00000030.h5");
  fs::resize_file(damaged, fs::file_size(damaged) - 100);
  const std::string average = kAverager + " --inputs " + path("ckpt") + " --last 2 --output " +
                              path("last2.h5");
  const ProcessResult refused = run_process(average);
  EXPECT_EQ(refused.exit_code, 1) << refused.output;
  for (const std::string& said :
       {damaged + ": cannot be opened, the file is truncated or damaged",
        "(--last chose it from " + path("ckpt") + "; to average without it, move it out of " +
            path("ckpt") + " and run again, and --last takes the next older one, or name the "
            "checkpoints to average: --inputs FILE FILE ...)"}) {
    EXPECT_NE(refused.output.find(said), std::string::npos) << said << "\n" << refused.output;
  }
  EXPECT_FALSE(fs::exists(path("last2.h5")));
  const ProcessResult named = run_process(kAverager + " --inputs " + damaged + " " +
                                          path("ckpt/step_00000020.h5") + " --output " +
                                          path("named.h5"));
  EXPECT_EQ(named.exit_code, 1) << named.output;
  EXPECT_EQ(named.output.find("chose it"), std::string::npos) << named.output;
  fs::rename(damaged, path("damaged.h5"));
  const ProcessResult again = run_process(average);
  ASSERT_EQ(again.exit_code, 0) << again.output;
  for (const NamedTensor& tensor : read_checkpoint(path("last2.h5"), CheckpointParts::ParamsOnly)
                                       .params) {
    for (float value : tensor.values) EXPECT_EQ(value, 1.5f) << tensor.name;  // (1 + 2) / 2
  }
  // Two files that do not go together name both, and no one of them to move.
  write_checkpoint(path("ckpt/step_00000040.h5"), constant_checkpoint(4.0f, 40, "layers=2 x"));
  const ProcessResult mismatched = run_process(average);
  EXPECT_EQ(mismatched.exit_code, 1) << mismatched.output;
  EXPECT_NE(mismatched.output.find("cannot average checkpoints of different architectures"),
            std::string::npos)
      << mismatched.output;
  EXPECT_EQ(mismatched.output.find("chose it"), std::string::npos) << mismatched.output;
}

TEST_F(CheckpointTest, AveragingRefusesMismatchedArchitectures) {
  write_checkpoint(path("a.h5"), constant_checkpoint(1.0f, 1, "layers=1 d_model=64"));
  write_checkpoint(path("b.h5"), constant_checkpoint(2.0f, 2, "layers=2 d_model=64"));
  expect_error([&] { average_checkpoints({path("a.h5"), path("b.h5")}); },
               {"different architectures: model.layers is 1 in " + path("a.h5") + " and 2 in " +
                path("b.h5")});
  const ProcessResult refused = run_process(kAverager + " --inputs " + path("a.h5") + " " +
                                            path("b.h5") + " --output " + path("out.h5"));
  EXPECT_EQ(refused.exit_code, 1);
  EXPECT_NE(refused.output.find("different architectures"), std::string::npos) << refused.output;
  EXPECT_FALSE(fs::exists(path("out.h5")));
}

// A field only one of two texts records is a difference too, whichever text it is in
// (walked from the second's fields alone, one only the first held fell back to both whole
// texts; a helper's trial).
TEST(ArchitectureText, DifferencesNameAFieldOnlyOneTextRecords) {
  EXPECT_EQ(architecture_differences("layers=1 activation=gelu", "a.h5", "layers=1", "b.h5"),
            "model.activation is gelu in a.h5 and absent in b.h5");
  EXPECT_EQ(architecture_differences("layers=1", "a.h5", "layers=1 activation=gelu", "b.h5"),
            "model.activation is absent in a.h5 and gelu in b.h5");
  EXPECT_EQ(architecture_differences("layers=1 d_ff=8", "a.h5", "layers=2", "b.h5"),
            "model.layers is 1 in a.h5 and 2 in b.h5; model.d_ff is 8 in a.h5 and absent in "
            "b.h5");
}

// Every model.* key either shapes or interprets the parameters, and is then recorded in
// the architecture text (a resume, an average, a checkpoint.init and decoding compare
// it), or is named here as one that does not, with why. A key added to [model] must be
// put in one or the other: one that changes what the parameters compute, left out of the
// text, let a run resume or an average mix models of both kinds (a helper's trial
// adding model.activation: a gelu checkpoint resumed as relu with a note alone).
TEST(ArchitectureText, EveryModelKeyIsRecordedOrNamedAsNotShapingTheParameters) {
  const std::map<std::string, std::string> not_recorded = {
      {"dropout", "regularisation of training: the same parameters, any rate"},
      {"attention_dropout", "regularisation of training"},
      {"activation_dropout", "regularisation of training"},
      {"label_smoothing", "the training loss, not the model"},
      {"layernorm_eps", "a numerical guard: another eps computes nearly the same function"},
      {"fused_ops", "which kernels compute the same function"},
  };
  const std::string text = architecture_text(ModelConfig{}, 100);
  int recorded = 0;
  for (const Option& option : option_table()) {
    if (std::string(option.section) != "model") continue;
    const bool in_text = (" " + text).find(" " + std::string(option.key) + "=") !=
                         std::string::npos;
    EXPECT_NE(in_text, not_recorded.count(option.key) > 0)
        << "model." << option.key << (in_text ? " is recorded in the architecture text and "
                                                "named as not shaping the parameters"
                                              : " is neither in the architecture text ('" +
                                                    text + "') nor named as not shaping the "
                                                    "parameters");
    recorded += in_text;
  }
  EXPECT_GE(recorded, 10);
}

TEST_F(CheckpointTest, AveragingNeverOverwritesAnInputOrATrainingCheckpoint) {
  // Full training states (with Adam moments), as a run writes them.
  const auto training_state = [](float value, int64_t step) {
    Checkpoint checkpoint = constant_checkpoint(value, step, "layers=1 test");
    checkpoint.adam_m = checkpoint.params;
    checkpoint.adam_v = checkpoint.params;
    return checkpoint;
  };
  const std::string older = path("ck/step_00000015.h5");
  const std::string newer = path("ck/step_00000020.h5");
  write_checkpoint(older, training_state(1.0f, 15));
  write_checkpoint(newer, training_state(2.0f, 20));
  const std::string newer_bytes = read_file(newer);

  const ProcessResult onto_input =
      run_process(kAverager + " --inputs " + older + " " + newer + " --output " + newer);
  EXPECT_EQ(onto_input.exit_code, 2) << onto_input.output;
  EXPECT_NE(onto_input.output.find("--output " + newer), std::string::npos) << onto_input.output;
  EXPECT_EQ(read_file(newer), newer_bytes);  // the Adam moments are still there
  EXPECT_EQ(read_checkpoint(newer).adam_m.size(), 2u);

  // The same file under another name (a hard link) is still an input.
  fs::create_hard_link(newer, path("link.h5"));
  const ProcessResult onto_link =
      run_process(kAverager + " --inputs " + older + " " + newer + " --output " + path("link.h5"));
  EXPECT_EQ(onto_link.exit_code, 2) << onto_link.output;
  EXPECT_NE(onto_link.output.find("is the input " + newer), std::string::npos) << onto_link.output;
  EXPECT_EQ(read_file(newer), newer_bytes);

  // A new step_*.h5 would pass for a training checkpoint with resume=auto and pruning.
  const std::string fake_step = path("ck/step_00000099.h5");
  const ProcessResult as_step =
      run_process(kAverager + " --inputs " + path("ck") + " --last 2 --output " + fake_step);
  EXPECT_EQ(as_step.exit_code, 2) << as_step.output;
  EXPECT_NE(as_step.output.find("step_*.h5"), std::string::npos) << as_step.output;
  EXPECT_FALSE(fs::exists(fake_step));

  const ProcessResult elsewhere = run_process(kAverager + " --inputs " + path("ck") +
                                              " --last 2 --output " + path("ck/average.h5"));
  EXPECT_EQ(elsewhere.exit_code, 0) << elsewhere.output;
  EXPECT_EQ(elsewhere.output.find("replacing"), std::string::npos) << elsewhere.output;
  // An earlier average is replaced, and the line that says the file was written says
  // what was there (it was replaced without a word, an int8 model by a float one or the
  // reverse; a helper's trial).
  const ProcessResult again = run_process(kAverager + " --inputs " + older + " --output " +
                                          path("ck/average.h5"));
  EXPECT_EQ(again.exit_code, 0) << again.output;
  EXPECT_NE(again.output.find("; replacing the earlier parameters-only checkpoint of step 20 "
                              "there, an average or a quantized model)"),
            std::string::npos)
      << again.output;
}

TEST_F(CheckpointTest, ParametersOnlyCheckpointServesDecodingAndInit) {
  Trainer source(small_config(path("run")));
  source.step();
  Checkpoint params_only = source.snapshot();
  params_only.adam_m.clear();
  params_only.adam_v.clear();
  write_checkpoint(path("average.h5"), params_only);

  // Decoding: a fresh model loaded from the file decodes as the model that wrote it.
  Trainer fresh(small_config(path("run2")));
  load_parameters(path("average.h5"), fresh.model());
  EXPECT_EQ(fresh.model().params().sha256_hex(), source.model().params().sha256_hex());
  std::vector<TokenSequence> sentences;
  SyntheticSource sentence_source(SyntheticSpec{});
  for (int i = 0; i < 4; ++i) sentences.push_back(sentence_source.next_source());
  EXPECT_EQ(greedy_decode(fresh.model(), sentences, SpecialIds{}),
            greedy_decode(source.model(), sentences, SpecialIds{}));

  // Training: checkpoint.init takes the parameters and starts at step 0.
  std::ostringstream log;
  Trainer started(small_config(path("run3"), {"train.max_steps=1",
                                              "checkpoint.init=" + path("average.h5")}));
  started.run(log);
  EXPECT_NE(log.str().find("parameters initialised from " + path("average.h5")),
            std::string::npos)
      << log.str();
  EXPECT_NE(log.str().find("final: step=1 "), std::string::npos) << log.str();
  // The metrics say so too: the run record names checkpoint.init's file (its curves are a
  // fine-tuning's, not a run from scratch; a helper's walk).
  {
    std::ifstream metrics(path("run3") + "/metrics.jsonl");
    std::string first;
    std::getline(metrics, first);
    EXPECT_NE(first.find("\"init\": \"" + path("average.h5") + "\""), std::string::npos)
        << first;
  }
  // What starts afresh is said, as a fairseq user's --reset-* flags would say it.
  EXPECT_NE(log.str().find("note: checkpoint.init starts a new run from those parameters "
                           "alone: Adam's moments are zero, and the step, the learning-rate "
                           "schedule"),
            std::string::npos)
      << log.str();
  // A quantized one is said as one, as transformer_average says it (before: nothing).
  write_checkpoint(path("int8.h5"), quantize_checkpoint(params_only));
  std::ostringstream int8_log;
  Trainer from_int8(small_config(path("run5"), {"train.max_steps=1",
                                                "checkpoint.init=" + path("int8.h5")}));
  from_int8.run(int8_log);
  EXPECT_NE(int8_log.str().find("parameters initialised from " + path("int8.h5") +
                                ", a quantized checkpoint (transformer_quantize): its int8 "
                                "parameters dequantized, their rounding included\n"),
            std::string::npos)
      << int8_log.str();

  // Resuming needs the moments: a parameters-only file is refused by name.
  expect_error([&] { read_checkpoint(path("average.h5")); },
               {path("average.h5"), "holds parameters only"});
  Trainer resuming(small_config(path("run4")));
  expect_error(
      [&] {
        resuming.restore(read_checkpoint(path("average.h5"), CheckpointParts::ParamsOnly),
                         path("average.h5"));
      },
      {path("average.h5"), "parameters only"});
}

TEST_F(CheckpointTest, SentencePieceModelIsStoredCheckedAndAveraged) {
  // A serialized model is binary: NULs and high bytes must come back as they went in.
  const std::string spm("\x0a\x00piece\x00\xff\x80 model", 16);
  const std::string architecture = "layers=1 test";
  Checkpoint with_spm = constant_checkpoint(1.0f, 10, architecture);
  with_spm.spm_model = spm;
  write_checkpoint(path("ckpt/step_00000010.h5"), with_spm);
  EXPECT_EQ(read_checkpoint(path("ckpt/step_00000010.h5"), CheckpointParts::ParamsOnly).spm_model,
            spm);
  // A checkpoint without one (a synthetic run, or one written before models were
  // stored) has no /spm_model dataset and loads with an empty model.
  write_checkpoint(path("ckpt/step_00000020.h5"), constant_checkpoint(2.0f, 20, architecture));
  const hid_t old_style = H5Fopen(path("ckpt/step_00000020.h5").c_str(), H5F_ACC_RDONLY,
                                  H5P_DEFAULT);
  EXPECT_EQ(H5Lexists(old_style, "spm_model", H5P_DEFAULT), 0);
  H5Fclose(old_style);
  EXPECT_EQ(read_checkpoint(path("ckpt/step_00000020.h5"), CheckpointParts::ParamsOnly).spm_model,
            "");
  write_checkpoint(path("ckpt/step_00000030.h5"), with_spm);

  // Averaging carries it over, also when the newest input is one without it; the program
  // writes it.
  EXPECT_EQ(average_checkpoints(list_checkpoints(path("ckpt"))).spm_model, spm);
  EXPECT_EQ(average_checkpoints({path("ckpt/step_00000030.h5"), path("ckpt/step_00000020.h5")})
                .spm_model,
            spm);
  const ProcessResult averaged = run_process(kAverager + " --inputs " + path("ckpt") +
                                             " --last 3 --output " + path("average.h5"));
  ASSERT_EQ(averaged.exit_code, 0) << averaged.output;
  EXPECT_EQ(read_checkpoint(path("average.h5"), CheckpointParts::ParamsOnly).spm_model, spm);

  // Checkpoints of other vocabularies are not averaged.
  Checkpoint other = with_spm;
  other.spm_model[3] = 'P';
  write_checkpoint(path("other.h5"), other);
  expect_error([&] { average_checkpoints({path("ckpt/step_00000010.h5"), path("other.h5")}); },
               {"different SentencePiece vocabularies", path("ckpt/step_00000010.h5"),
                path("other.h5")});
  // Judged as vocabularies, as a resume's shards are: two models of one text (trained from
  // copies under two names, their bytes other) are averaged; another text's refused, its
  // difference said (a review's finding: byte for byte, a run resumed on a retrained model
  // could not average across its resume).
  std::string text, other_text;
  for (int i = 0; i < 200; ++i) {
    text += "the dog runs in the park number " + std::to_string(i % 17) + "\n";
    other_text += "ein Hund läuft im Garten Nummer " + std::to_string(i % 13) + "\n";
  }
  std::ofstream(path("a.txt")) << text;
  std::ofstream(path("a_copy.txt")) << text;
  std::ofstream(path("b.txt")) << other_text;
  for (const std::string name : {"a", "a_copy", "b"}) {
    ASSERT_TRUE(train_test_spm_model(path(name + ".txt"), path(name), 40).ok());
  }
  Checkpoint of_a = with_spm, of_a_copy = with_spm, of_b = with_spm;
  of_a.spm_model = read_file(path("a.model"));
  of_a_copy.spm_model = read_file(path("a_copy.model"));
  of_b.spm_model = read_file(path("b.model"));
  ASSERT_NE(of_a.spm_model, of_a_copy.spm_model);
  write_checkpoint(path("of_a.h5"), of_a);
  write_checkpoint(path("of_a_copy.h5"), of_a_copy);
  write_checkpoint(path("of_b.h5"), of_b);
  EXPECT_EQ(average_checkpoints({path("of_a.h5"), path("of_a_copy.h5")}).spm_model, of_a.spm_model);
  expect_error([&] { average_checkpoints({path("of_a.h5"), path("of_b.h5")}); },
               {"cannot average checkpoints of different SentencePiece vocabularies: " +
                    path("of_a.h5") + " and " + path("of_b.h5") + " (",
                "); average checkpoints of runs on one preprocessed corpus (data.dir)"});
  // Nor those of two directions, which one vocabulary serves (a checkpoint that records
  // none fits any); the average records the inputs' direction.
  Checkpoint en_de = with_spm, de_en = with_spm;
  en_de.direction = "en->de";
  de_en.direction = "de->en";
  write_checkpoint(path("en_de.h5"), en_de);
  write_checkpoint(path("de_en.h5"), de_en);
  EXPECT_EQ(read_checkpoint(path("en_de.h5"), CheckpointParts::ParamsOnly).direction, "en->de");
  EXPECT_EQ(average_checkpoints({path("ckpt/step_00000010.h5"), path("en_de.h5")}).direction,
            "en->de");
  expect_error([&] { average_checkpoints({path("en_de.h5"), path("ckpt/step_00000010.h5"),
                                          path("de_en.h5")}); },
               {"cannot average checkpoints of two translation directions: " + path("en_de.h5") +
                " was trained en->de, " + path("de_en.h5") + " de->en"});
  // Nor one of the synthetic task (data.dir empty: no model, ids of no corpus), in either
  // order (before: the average took the other's model without a word).
  Checkpoint synthetic = with_spm;
  synthetic.spm_model.clear();
  synthetic.config_ini = "[model]\nlayers = 1\n\n[data]\ndir = \ntrain = train\n";
  write_checkpoint(path("synthetic.h5"), synthetic);
  for (const bool synthetic_first : {false, true}) {
    std::vector<std::string> inputs = {path("ckpt/step_00000010.h5"), path("synthetic.h5")};
    if (synthetic_first) std::swap(inputs[0], inputs[1]);
    expect_error([&] { average_checkpoints(inputs); },
                 {"cannot average " + path("ckpt/step_00000010.h5") + ", which stores the "
                  "SentencePiece model of its corpus, with " + path("synthetic.h5") +
                  ", a synthetic task's (data.dir empty)"});
  }

  // Its sha256 is checked like every other dataset's (the file header re-stamped after
  // the flip, as a program editing the file in place would, so that the flip gets past
  // the whole-file checksum to the dataset's own).
  const std::string flipped = path("ckpt/step_00000030.h5");
  flip_bits(flipped, dataset_offset(flipped, "/spm_model") + 5, 0x10);
  stamp_checkpoint_header(flipped);
  expect_error([&] { read_checkpoint(flipped, CheckpointParts::ParamsOnly); },
               {flipped, "bad checksum for dataset /spm_model"});
}

TEST_F(CheckpointTest, BestValidationValuesAreStoredCheckedAndLeftOutOfAverages) {
  // A run's record (trainer.h): the best perplexity at step 8 and one validation since,
  // no BLEU measured (NaN), the best chrF at step 6 and two validations since, the best
  // F1 at step 9 and none since.
  const std::string architecture = "layers=1 test";
  Checkpoint with_record = constant_checkpoint(1.0f, 10, architecture);
  with_record.best_valid = ValidationRecord{{2.5, 8, 1}, {}, {41.25, 6, 2}, {88.5, 9, 0}};
  const std::string file = path("ckpt/step_00000010.h5");
  write_checkpoint(file, with_record);
  const Checkpoint loaded = read_checkpoint(file, CheckpointParts::ParamsOnly);
  ASSERT_TRUE(loaded.best_valid.has_value());
  EXPECT_EQ(loaded.best_valid->ppl.value, 2.5);
  EXPECT_EQ(loaded.best_valid->ppl.step, 8);
  EXPECT_EQ(loaded.best_valid->ppl.validations_since, 1);
  EXPECT_TRUE(std::isnan(loaded.best_valid->bleu.value));
  EXPECT_EQ(loaded.best_valid->bleu.step, 0);
  EXPECT_EQ(loaded.best_valid->bleu.validations_since, 0);
  EXPECT_EQ(loaded.best_valid->chrf.value, 41.25);
  EXPECT_EQ(loaded.best_valid->chrf.step, 6);
  EXPECT_EQ(loaded.best_valid->chrf.validations_since, 2);
  EXPECT_EQ(loaded.best_valid->f1.value, 88.5);
  EXPECT_EQ(loaded.best_valid->f1.step, 9);
  EXPECT_EQ(loaded.best_valid->f1.validations_since, 0);

  // A checkpoint written before chrF and F1 were validation metrics has no
  // /best_valid/chrf nor /best_valid/f1: the other values load, chrF and F1 have none yet.
  const std::string before_chrf = path("before_chrf.h5");
  write_checkpoint(before_chrf, with_record);
  const hid_t h5 = H5Fopen(before_chrf.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  ASSERT_GE(H5Ldelete(h5, "/best_valid/chrf", H5P_DEFAULT), 0);
  ASSERT_GE(H5Ldelete(h5, "/best_valid/f1", H5P_DEFAULT), 0);
  H5Fclose(h5);
  stamp_checkpoint_header(before_chrf);  // edited in place: past the whole-file checksum
  const Checkpoint older = read_checkpoint(before_chrf, CheckpointParts::ParamsOnly);
  ASSERT_TRUE(older.best_valid.has_value());
  EXPECT_EQ(older.best_valid->ppl.value, 2.5);
  EXPECT_TRUE(std::isnan(older.best_valid->chrf.value));
  EXPECT_EQ(older.best_valid->chrf.step, 0);
  EXPECT_TRUE(std::isnan(older.best_valid->f1.value));
  EXPECT_EQ(older.best_valid->f1.step, 0);

  // A checkpoint written before the record was stored has no /best_valid: none.
  write_checkpoint(path("ckpt/step_00000020.h5"), constant_checkpoint(2.0f, 20, architecture));
  EXPECT_FALSE(read_checkpoint(path("ckpt/step_00000020.h5"), CheckpointParts::ParamsOnly)
                   .best_valid.has_value());
  // An average is no step of the run: it carries none, whatever its inputs hold.
  write_checkpoint(path("ckpt/step_00000030.h5"), with_record);
  EXPECT_FALSE(average_checkpoints(list_checkpoints(path("ckpt"))).best_valid.has_value());

  // A step after the checkpoint's own is no step the run had reached.
  Checkpoint beyond = with_record;
  beyond.best_valid->bleu = {30.0, 11, 0};
  write_checkpoint(path("beyond.h5"), beyond);
  expect_error([&] { read_checkpoint(path("beyond.h5"), CheckpointParts::ParamsOnly); },
               {path("beyond.h5"), "/best_valid/bleu", "its step up to 10"});

  // The values' sha256 is checked like every other dataset's (2.5's third byte is 0: the
  // flip leaves a plausible number; the header re-stamped, as above).
  flip_bits(file, dataset_offset(file, "/best_valid/ppl") + 2, 0x10);
  stamp_checkpoint_header(file);
  expect_error([&] { read_checkpoint(file, CheckpointParts::ParamsOnly); },
               {file, "bad checksum for dataset /best_valid/ppl"});
}

// Format version 2 (transformer_quantize): int8 weight matrices in /quantized, each
// stored once and read back as written, and among the parameters as its dequantized
// values, in a float checkpoint's name order; its datasets verified like every other;
// never a training state.
TEST_F(CheckpointTest, AQuantizedCheckpointReadsBackAsWrittenAndIsCheckedLikeAnyOther) {
  Checkpoint checkpoint = constant_checkpoint(1.0f, 7, "arch");
  // A linear layer's W [3, 4] (a scale per column) and a tied embedding E [5, 2] (a scale
  // per row), with values over the whole range, zero scales included.
  const QuantizedTensor linear{"a.weight", 3, 4, 1,
                               {127, -127, 0, 5, -1, 64, -64, 100, 3, -3, 2, 1},
                               {0.5f, 0.25f, 0.0f, 1.5e-3f}};
  const QuantizedTensor embedding{"embed.weight", 5, 2, 0,
                                  {1, -2, 3, -4, 5, -6, 7, -8, 127, -127},
                                  {0.125f, 2.0f, 1e-4f, 0.0f, 0.75f}};
  checkpoint.params[0].values = dequantize(linear);
  checkpoint.params.push_back({"embed.weight", 5, 2, dequantize(embedding)});
  checkpoint.quantized = {linear, embedding};
  EXPECT_EQ(checkpoint.params[0].values[3], 5 * 1.5e-3f);   // row 0, column 3
  EXPECT_EQ(checkpoint.params[2].values[8], 127 * 0.75f);   // row 4 of E
  const std::string file = path("quantized.h5");
  write_checkpoint(file, checkpoint);

  const Checkpoint read = read_checkpoint(file, CheckpointParts::ParamsOnly);
  ASSERT_EQ(read.quantized.size(), 2u);
  for (size_t t = 0; t < 2; ++t) {
    const QuantizedTensor& expected = checkpoint.quantized[t];
    EXPECT_EQ(read.quantized[t].name, expected.name);
    EXPECT_EQ(read.quantized[t].rows, expected.rows);
    EXPECT_EQ(read.quantized[t].cols, expected.cols);
    EXPECT_EQ(read.quantized[t].output_axis, expected.output_axis);
    EXPECT_EQ(read.quantized[t].values, expected.values);
    EXPECT_EQ(read.quantized[t].scales, expected.scales);
  }
  ASSERT_EQ(read.params.size(), 3u);
  for (size_t t = 0; t < 3; ++t) {
    EXPECT_EQ(read.params[t].name, checkpoint.params[t].name);
    EXPECT_EQ(read.params[t].values, checkpoint.params[t].values) << read.params[t].name;
  }
  {
    const hid_t h5 = H5Fopen(file.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
    ASSERT_GE(h5, 0);
    int64_t version = 0;
    const hid_t attribute = H5Aopen(h5, "format_version", H5P_DEFAULT);
    H5Aread(attribute, H5T_NATIVE_INT64, &version);
    H5Aclose(attribute);
    EXPECT_EQ(version, 2);
    EXPECT_EQ(H5Lexists(h5, "/params/b.bias", H5P_DEFAULT), 1);
    EXPECT_EQ(H5Lexists(h5, "/params/a.weight", H5P_DEFAULT), 0);  // stored once, in int8
    H5Fclose(h5);
  }
  expect_error([&] { read_checkpoint(file); },
               {file, "is a quantized checkpoint", "training cannot resume from it"});

  // Each dataset's sha256 is checked (the header re-stamped after the flip, as above).
  const std::string flipped = path("flipped.h5");
  write_checkpoint(flipped, checkpoint);
  flip_bits(flipped, dataset_offset(flipped, "/quantized/embed.weight/values") + 3, 0x10);
  stamp_checkpoint_header(flipped);
  expect_error([&] { read_checkpoint(flipped, CheckpointParts::ParamsOnly); },
               {flipped, "bad checksum for dataset /quantized/embed.weight/values"});

  // Values and scales that no quantization writes are refused, naming the dataset.
  Checkpoint bad = checkpoint;
  bad.quantized[0].values[4] = -128;
  write_checkpoint(path("bad_value.h5"), bad);
  expect_error([&] { read_checkpoint(path("bad_value.h5"), CheckpointParts::ParamsOnly); },
               {"/quantized/a.weight/values holds -128"});
  bad = checkpoint;
  bad.quantized[1].scales[2] = -1.0f;
  write_checkpoint(path("bad_scale.h5"), bad);
  expect_error([&] { read_checkpoint(path("bad_scale.h5"), CheckpointParts::ParamsOnly); },
               {"/quantized/embed.weight/scales holds a scale that is negative or not finite"});
}

// Averaging reads a quantized checkpoint's parameters dequantized, as every reader does,
// and writes a float checkpoint of their mean: the average held the int8 matrices of its
// newest input in place of the mean (transformer_average, found by a session's attack).
TEST_F(CheckpointTest, AnAverageWithAQuantizedInputIsTheMeanOfItsDequantizedValues) {
  Checkpoint quantized = constant_checkpoint(1.0f, 20, "arch");
  const QuantizedTensor linear{"a.weight", 3, 4, 1,
                               {127, -127, 0, 5, -1, 64, -64, 100, 3, -3, 2, 1},
                               {0.5f, 0.25f, 0.125f, 1.5e-3f}};
  quantized.params[0].values = dequantize(linear);
  quantized.quantized = {linear};
  write_checkpoint(path("quantized.h5"), quantized);
  write_checkpoint(path("float.h5"), constant_checkpoint(3.0f, 10, "arch"));
  for (const std::vector<std::string>& order :
       {std::vector<std::string>{path("quantized.h5"), path("float.h5")},
        std::vector<std::string>{path("float.h5"), path("quantized.h5")}}) {
    write_checkpoint(path("average.h5"), average_checkpoints(order));
    const Checkpoint average = read_checkpoint(path("average.h5"), CheckpointParts::ParamsOnly);
    EXPECT_TRUE(average.quantized.empty());
    ASSERT_EQ(average.params.size(), 2u);
    for (size_t i = 0; i < 12; ++i) {
      EXPECT_EQ(average.params[0].values[i],
                static_cast<float>((double{quantized.params[0].values[i]} + 3.0) / 2))
          << "a.weight[" << i << "]";
    }
    EXPECT_EQ(average.params[1].values, std::vector<float>(5, 2.0f));
  }
}

// ---- corruption ----

// Found by fuzz_checkpoint: a damaged header stating a huge shape made the reader
// allocate for it (std::length_error, or a product of dimensions that wraps around)
// instead of refusing the file. The shape is checked against the bytes the file holds.
TEST_F(CheckpointTest, AShapeTheFileDoesNotHoldIsRefusedBeforeAllocating) {
  for (const auto& [rows, cols] : {std::pair<hsize_t, hsize_t>{1 << 20, 1 << 20},
                                   std::pair<hsize_t, hsize_t>{hsize_t{1} << 40, 1 << 30}}) {
    const std::string file = path("huge.h5");
    write_checkpoint(file, constant_checkpoint(1.0f, 5, "arch"));
    // A dataset whose header states rows x cols floats that were never written.
    const hid_t h5 = H5Fopen(file.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
    const hsize_t dims[2] = {rows, cols};
    const hid_t space = H5Screate_simple(2, dims, nullptr);
    const hid_t dataset = H5Dcreate2(h5, "/params/c.weight", H5T_NATIVE_FLOAT, space,
                                     H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    ASSERT_GE(dataset, 0);
    H5Dclose(dataset);
    H5Sclose(space);
    H5Fclose(h5);
    stamp_checkpoint_header(file);  // edited in place: past the whole-file checksum
    expect_error([&] { read_checkpoint(file, CheckpointParts::ParamsOnly); },
                 {file, "/params/c.weight", rows == cols ? "that the file does not hold"
                                                         : "impossible shape"});
  }
}

TEST_F(CheckpointTest, TruncationAndFlippedBytesAreDetected) {
  std::ostringstream log;
  Trainer(small_config(path("run"), {"train.max_steps=4", "checkpoint.every_steps=2"})).run(log);
  const std::string good = path("run/step_00000002.h5");
  const std::string newest = path("run/step_00000004.h5");
  ASSERT_TRUE(fs::exists(good) && fs::exists(newest)) << log.str();

  const std::string truncated = path("truncated.h5");
  fs::copy_file(newest, truncated);
  fs::resize_file(truncated, fs::file_size(truncated) / 2);
  expect_error([&] { read_checkpoint(truncated); }, {truncated, "truncated"});

  const std::string flipped = path("flipped.h5");
  fs::copy_file(newest, flipped);
  const std::string dataset = "/params/encoder.0.ffn.fc1.weight";
  flip_bits(flipped, dataset_offset(flipped, dataset) + 123, 0x10);
  expect_error([&] { read_checkpoint(flipped); }, {flipped, "bad checksum for the file"});
  // The same checks on the bytes in memory (the fuzzer's entry point).
  const Checkpoint from_image = read_checkpoint_image("image.h5", read_file(good));
  EXPECT_EQ(from_image.params.front().values, read_checkpoint(good).params.front().values);
  expect_error([&] { read_checkpoint_image("image.h5", read_file(truncated)); },
               {"image.h5", "truncated"});
  expect_error([&] { read_checkpoint_image("image.h5", read_file(flipped)); },
               {"image.h5", "bad checksum for the file"});

  // auto skips a bad newest checkpoint, says so, and resumes from the previous one.
  fs::copy_file(flipped, newest, fs::copy_options::overwrite_existing);
  std::ostringstream resume_log;
  Trainer resumed(small_config(path("run"), {"train.max_steps=4", "checkpoint.resume=auto"}));
  resumed.run(resume_log);
  EXPECT_NE(resume_log.str().find("warning: skipping invalid checkpoint " + newest),
            std::string::npos)
      << resume_log.str();
  EXPECT_NE(resume_log.str().find("resumed from " + good + " at step 2"), std::string::npos)
      << resume_log.str();

  // By path, the program refuses it: exit code 1, one line naming the file.
  fs::copy_file(flipped, newest, fs::copy_options::overwrite_existing);
  const ProcessResult refused = run_process(kTrainer + " " + kTinyIni +
                                            " --model.layers=1 --checkpoint.dir=" + path("run") +
                                            " --checkpoint.resume=" + newest);
  EXPECT_EQ(refused.exit_code, 1);
  EXPECT_NE(refused.output.find(newest + ": bad checksum for the file"),
            std::string::npos)
      << refused.output;
}

// The file header (docs/checkpoints.md) is checked before HDF5 reads anything: HDF5
// crashed (SIGSEGV) opening a damaged file fuzz_checkpoint made. Any byte changed after
// the header, a damaged header, a wrong size or a file without the header is refused
// with one line; HDF5 itself reads the file as usual (the header is its user block).
// stamp_checkpoint_header is plain file I/O: a failure says what the system said, with
// the file's name, and nothing about HDF5.
TEST_F(CheckpointTest, StampingAMissingFileSaysWhyWithoutHdf5) {
  const std::string missing = path("never_written.h5");
  const std::string message =
      expect_error([&] { stamp_checkpoint_header(missing); },
                   {missing, "cannot stamp the file header", "No such file"});
  EXPECT_EQ(message.find("HDF5"), std::string::npos) << message;
  EXPECT_FALSE(std::filesystem::exists(missing));
}

TEST_F(CheckpointTest, TheFileHeaderIsVerifiedBeforeHdf5ReadsTheFile) {
  const std::string good = path("good.h5");
  write_checkpoint(good, constant_checkpoint(1.5f, 7, "arch"));
  const std::string bytes = read_file(good);
  ASSERT_EQ(bytes.rfind("thpc-checkpoint-file 1\nbytes " + std::to_string(bytes.size()) +
                            "\nsha256 ",
                        0),
            0u)
      << bytes.substr(0, 80);
  const hid_t h5 = H5Fopen(good.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  EXPECT_GE(h5, 0);
  H5Fclose(h5);
  EXPECT_EQ(read_checkpoint(good, CheckpointParts::ParamsOnly).step, 7);

  auto damaged = [&](const std::string& name, auto&& change) {
    std::string copy = bytes;
    change(copy);
    const std::string file = path(name);
    std::ofstream(file, std::ios::binary) << copy;
    return file;
  };
  const struct {
    const char* name;
    std::function<void(std::string&)> change;
    const char* expected;
  } cases[] = {
      // A byte of HDF5's superblock, right after the header.
      {"superblock.h5", [](std::string& b) { b[512 + 9] ^= 0x40; }, "bad checksum for the file"},
      // The last byte of the file.
      {"last.h5", [](std::string& b) { b.back() ^= 0x01; }, "bad checksum for the file"},
      // A digit of the recorded sha256 (still hex).
      {"digest.h5",
       [](std::string& b) {
         const size_t at = b.find("sha256 ") + 7;
         b[at] = b[at] == '0' ? '1' : '0';
       },
       "bad checksum for the file"},
      {"not_hex.h5", [](std::string& b) { b[b.find("sha256 ") + 7] = 'g'; },
       "damaged file header (its sha256 is not"},
      {"size.h5", [](std::string& b) { b[b.find("bytes ") + 6] = 'x'; },
       "damaged file header (its size is not"},
      {"tail.h5", [](std::string& b) { b[400] = 'z'; }, "damaged file header (bytes after"},
      {"longer.h5", [](std::string& b) { b += '\0'; }, "truncated or damaged (its header records"},
      {"shorter.h5", [](std::string& b) { b.resize(b.size() - 1000); },
       "truncated or damaged (its header records"},
      {"header_only.h5", [](std::string& b) { b.resize(300); }, "shorter than its 512-byte header"},
      // HDF5's signature where the header belongs: a file without one.
      {"no_header.h5", [](std::string& b) { b.replace(0, 8, "\x89HDF\r\n\x1a\n", 8); },
       "an HDF5 file without a checkpoint header"},
      {"other.h5", [](std::string& b) { b[0] = 'T'; }, "not an HDF5 file"},
  };
  for (const auto& c : cases) {
    const std::string file = damaged(c.name, c.change);
    expect_error([&] { read_checkpoint(file, CheckpointParts::ParamsOnly); }, {file, c.expected});
    expect_error(
        [&] { read_checkpoint_image("image.h5", read_file(file), CheckpointParts::ParamsOnly); },
                 {"image.h5", c.expected});
  }
}

// When every checkpoint is damaged, auto refuses (the run's progress and the evidence
// would be lost: a fresh run writes the same step names over them); auto_or_fresh starts
// over only after moving the damaged files aside.
TEST_F(CheckpointTest, AllCheckpointsInvalidIsRefusedUnlessAutoOrFreshWhichKeepsThem) {
  std::ostringstream log;
  Trainer(small_config(path("run"), {"train.max_steps=4", "checkpoint.every_steps=2"})).run(log);
  const std::string truncated = path("run/step_00000002.h5");
  const std::string flipped = path("run/step_00000004.h5");
  fs::resize_file(truncated, fs::file_size(truncated) / 2);
  flip_bits(flipped, dataset_offset(flipped, "/params/encoder.0.ffn.fc1.weight") + 7, 0x10);
  const std::string truncated_bytes = read_file(truncated);
  const std::string flipped_bytes = read_file(flipped);

  const std::string command = kTrainer + " " + kTinyIni + " --model.layers=1 " +
                              "--train.max_steps=4 --checkpoint.every_steps=2 " +
                              "--checkpoint.dir=" + path("run") + " --checkpoint.resume=";
  const ProcessResult refused = run_process(command + "auto");
  EXPECT_EQ(refused.exit_code, 1) << refused.output;
  EXPECT_NE(refused.output.find("checkpoint.resume=auto: none of the 2 checkpoints in " +
                                path("run") + " is valid"),
            std::string::npos)
      << refused.output;
  EXPECT_NE(refused.output.find(truncated + ": cannot be opened, the file is truncated"),
            std::string::npos)
      << refused.output;
  EXPECT_NE(refused.output.find(flipped + ": bad checksum"), std::string::npos) << refused.output;
  EXPECT_EQ(refused.output.find("starting from step 0"), std::string::npos) << refused.output;
  EXPECT_EQ(read_file(truncated), truncated_bytes);
  EXPECT_EQ(read_file(flipped), flipped_bytes);

  // A copy of the run directory (cp -a to scratch, its checkpoints cut short) is a run of
  // its own (RunDirectory.ACopiedRunDirectoryIsARunOfItsOwn): auto_or_fresh starts it
  // afresh as it would the original, its damaged checkpoints moved aside, and the
  // original's files are left as they are. (It was refused as another run's, whose
  // checkpoint.dir, the original, its refusal told the user to continue in.)
  fs::copy(path("run"), path("copy"), fs::copy_options::recursive);
  const std::string copy_command = kTrainer + " " + kTinyIni + " --model.layers=1 " +
                                   "--train.max_steps=4 --checkpoint.every_steps=2 " +
                                   "--checkpoint.dir=" + path("copy") +
                                   " --checkpoint.resume=auto_or_fresh";
  const ProcessResult copied = run_process(copy_command);
  EXPECT_EQ(copied.exit_code, 0) << copied.output;
  EXPECT_NE(copied.output.find("starting from step 0"), std::string::npos) << copied.output;
  EXPECT_EQ(read_file(path("copy/step_00000004.h5.corrupt")), flipped_bytes);
  EXPECT_EQ(read_file(path("run/step_00000002.h5")), truncated_bytes);
  EXPECT_EQ(read_file(path("run/step_00000004.h5")), flipped_bytes);

  const ProcessResult fresh = run_process(command + "auto_or_fresh");
  EXPECT_EQ(fresh.exit_code, 0) << fresh.output;
  EXPECT_NE(fresh.output.find("moved invalid checkpoint " + flipped + " aside to " + flipped +
                              ".corrupt"),
            std::string::npos)
      << fresh.output;
  EXPECT_NE(fresh.output.find("no valid checkpoint in " + path("run") + ", starting from step 0"),
            std::string::npos)
      << fresh.output;
  EXPECT_EQ(read_file(truncated + ".corrupt"), truncated_bytes);
  EXPECT_EQ(read_file(flipped + ".corrupt"), flipped_bytes);
  EXPECT_EQ(read_checkpoint(flipped).step, 4);  // the new run's own step 4
}

// The average carries the newest input's step, whatever the order the inputs are named in. (A
// mutation audit's survivor.)
TEST_F(CheckpointTest, AnAverageTakesTheNewestInputsStepInAnyOrder) {
  write_checkpoint(path("twenty.h5"), constant_checkpoint(1.0f, 20, "arch"));
  write_checkpoint(path("ten.h5"), constant_checkpoint(3.0f, 10, "arch"));
  EXPECT_EQ(average_checkpoints({path("twenty.h5"), path("ten.h5")}).step, 20);
  EXPECT_EQ(average_checkpoints({path("ten.h5"), path("twenty.h5")}).step, 20);
  const ProcessResult tool = run_process(kAverager + " --inputs " + path("twenty.h5") + " " +
                                         path("ten.h5") + " --output " + path("avg.h5"));
  ASSERT_EQ(tool.exit_code, 0) << tool.output;
  EXPECT_NE(tool.output.find("(step 20, "), std::string::npos) << tool.output;
}

// --last N --every-steps K: the multiples of K and the newest healthy checkpoint (the run's end,
// off the schedule here), never a diverged newer one's step nor the oldest's. (A mutation audit's
// survivor.)
TEST_F(CheckpointTest, EveryStepsKeepsTheNewestHealthyOffScheduleCheckpoint) {
  fs::create_directories(path("ck"));
  for (const int64_t step : {2, 4, 6, 7}) {
    write_checkpoint(path("ck/" + checkpoint_file_name(step)),
                     constant_checkpoint(static_cast<float>(step), step, "arch"));
  }
  Checkpoint diverged = constant_checkpoint(9.0f, 9, "arch");
  diverged.state = CheckpointState::Diverged;
  write_checkpoint(path("ck/" + checkpoint_file_name(9)), diverged);
  const ProcessResult tool = run_process(kAverager + " --inputs " + path("ck") +
                                         " --last 3 --every-steps 2 --output " + path("avg.h5"));
  ASSERT_EQ(tool.exit_code, 0) << tool.output;
  EXPECT_NE(tool.output.find("averaged 3 checkpoints: " + path("ck/step_00000004.h5") + " " +
                             path("ck/step_00000006.h5") + " " + path("ck/step_00000007.h5")),
            std::string::npos)
      << tool.output;
}

// The header's lines parsed one by one, at the bounds of what each may hold: a header is
// outside the whole-file checksum, so these checks are all that stand between a damaged
// line and a field the run believes (a state, a step, a run id), and between damage and a
// "use the version that wrote it" that sends the user after a version that never was.
// Each case changes one line of a good header; a mutation audit found every bound below
// untested (a 33-letter word taken as a later version's, a run id of 15 digits taken, a
// line given twice taken, a step or a size too long for an integer thrown as
// std::out_of_range instead of said to be damage).
TEST(CheckpointHeaderLines, EachLineIsCheckedAtItsBoundsAndALaterVersionsWordIsToldFromDamage) {
  HeaderFields fields;
  fields.step = 7;
  fields.loss = 2.5;
  fields.run_id = "0123456789abcdef";
  fields.parameters_only = false;
  const std::string digest(64, 'a');
  const std::string good = header_block(4096, digest, fields);
  {
    const ParsedHeader parsed = parse_header(good);
    ASSERT_EQ(parsed.problem, "");
    EXPECT_EQ(parsed.size, "4096");
    EXPECT_EQ(parsed.fields.step, 7);
    EXPECT_EQ(parsed.fields.run_id, "0123456789abcdef");
    ASSERT_TRUE(parsed.fields.parameters_only.has_value());
    EXPECT_FALSE(*parsed.fields.parameters_only);  // "contents full"
  }
  // `good` with the line beginning `key` replaced by `line` (or `line` added before the
  // zeros when no line begins so), padded back to 512 bytes.
  const auto with_line = [&](const std::string& key, const std::string& line) {
    std::string text = good.substr(0, good.find('\0'));
    const size_t at = text.find("\n" + key);
    if (at == std::string::npos) {
      text += line + "\n";
    } else {
      const size_t end = text.find('\n', at + 1);
      text.replace(at + 1, end - at, line + "\n");
    }
    text.resize(kHeaderBytes, '\0');
    return text;
  };
  const std::string word32(32, 'w');
  const struct {
    const char* name;
    std::string header;
    std::string problem;  // "" when it parses
    bool later;
  } cases[] = {
      {"params", with_line("contents ", "contents params"), "", false},
      // A state word of 32 letters is a word a later version could write; 33 are damage.
      {"state of 32 letters", with_line("state ", "state " + word32),
       "its state is '" + word32 + "', which this version does not know", true},
      {"state of 33 letters", with_line("state ", "state " + word32 + "w"),
       "its state is not healthy, diverged or superseded", false},
      // '~' is the last printable byte; a byte past it (DEL) is damage.
      {"valid value ending in ~", with_line("valid ", "valid newer 1~"),
       "its valid line names the metric 'newer', which this version does not know", true},
      {"valid value with a DEL", with_line("valid ", "valid newer 1\x7f"),
       "its valid line names no metric ppl, bleu, chrf or f1", false},
      {"step twice", with_line("valid ", "step 8"), "the 'step' line twice", false},
      // 18 digits are a step; 19 could overflow int64 and are damage, not an exception.
      {"step of 18 digits", with_line("step ", "step " + std::string(18, '9')), "", false},
      {"step of 19 digits", with_line("step ", "step " + std::string(19, '9')),
       "its step is not a decimal count", false},
      {"loss with a letter after it", with_line("loss ", "loss 2.5x"),
       "its loss is not a number", false},
      {"run of 15 digits", with_line("run ", "run 0123456789abcde"),
       "its run is not 16 hex digits", false},
      {"run of 17 digits", with_line("run ", "run 0123456789abcdef0"),
       "its run is not 16 hex digits", false},
      // A branch line is a step and a line id of 16 hex digits, one of them.
      {"branch", with_line("branch ", "branch 40:00112233445566ff"), "", false},
      {"branch of 15 digits", with_line("branch ", "branch 40:00112233445566f"),
       "its branch is not STEP:ID (a step and 16 hex digits)", false},
      {"branch without a step", with_line("branch ", "branch :00112233445566ff"),
       "its branch is not STEP:ID (a step and 16 hex digits)", false},
      {"two branches", with_line("branch ", "branch 4:00112233445566ff 5:00112233445566ff"),
       "its branch is not STEP:ID (a step and 16 hex digits)", false},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    ASSERT_EQ(c.header.size(), kHeaderBytes);
    ParsedHeader parsed;
    ASSERT_NO_THROW(parsed = parse_header(c.header));
    EXPECT_EQ(parsed.problem, c.problem);
    EXPECT_EQ(parsed.later_version, c.later);
  }
  EXPECT_TRUE(*parse_header(cases[0].header).fields.parameters_only);
  EXPECT_EQ(parse_header(cases[6].header).fields.step, 999999999999999999LL);
  EXPECT_EQ(parse_header(cases[11].header).fields.branch,
            (BranchStart{40, "00112233445566ff"}));

  // The size and the digest: 19 digits at most (a uint64), 64 lowercase hex digits exactly.
  const auto with_size_and_digest = [&](const std::string& size, const std::string& hex) {
    std::string text = good;
    text.replace(text.find("bytes 4096"), 10, "bytes " + size);
    text.replace(text.find(digest), 64, hex);
    text.resize(kHeaderBytes, '\0');
    return text;
  };
  ParsedHeader parsed;
  ASSERT_NO_THROW(parsed = parse_header(with_size_and_digest(std::string(20, '9'), digest)));
  EXPECT_EQ(parsed.problem, "its size is not a decimal byte count");
  ASSERT_NO_THROW(parsed = parse_header(with_size_and_digest("4096", digest + "a")));
  EXPECT_EQ(parsed.problem, "its sha256 is not 64 lowercase hex digits");
  ASSERT_NO_THROW(parsed = parse_header(with_size_and_digest("4096", digest.substr(1))));
  EXPECT_EQ(parsed.problem, "its sha256 is not 64 lowercase hex digits");

  // Version 2, the first after this one, is a later version's header (7 was the only one
  // tried, and "> 2" for "> 1" passed), not "no header".
  std::string version_2 = good;
  version_2.replace(0, kHeaderMagic.size(), "thpc-checkpoint-file 2\n");
  parsed = parse_header(version_2);
  EXPECT_TRUE(parsed.later_version);
  EXPECT_FALSE(parsed.not_a_checkpoint);
  EXPECT_EQ(parsed.problem, "its header is of version 2 (this version reads version 1)");
}

// The divergence state a resume continues with is checked for what each value can be: a
// learning-rate factor of 0 would resume a run that trains nothing, every step "healthy"
// (a mutation audit found (0, 1]'s open end untested: ">= 0" for "> 0" passed); 1, the
// factor of a run that never rolled back, is its closed end.
TEST_F(CheckpointTest, ADivergenceStateOutsideItsRangesIsRefused) {
  const auto with_state = [&](const std::string& name, double lr_factor, int64_t rollbacks) {
    Checkpoint checkpoint = constant_checkpoint(1.0f, 5, "arch");
    DivergenceState state;
    state.lr_factor = lr_factor;
    state.rollbacks = rollbacks;
    checkpoint.divergence = state;
    const std::string file = path(name);
    write_checkpoint(file, checkpoint);
    return file;
  };
  const Checkpoint never =
      read_checkpoint(with_state("one.h5", 1.0, 0), CheckpointParts::ParamsOnly);
  ASSERT_TRUE(never.divergence.has_value());
  EXPECT_EQ(never.divergence->lr_factor, 1.0);
  const Checkpoint rolled =
      read_checkpoint(with_state("quarter.h5", 0.25, 2), CheckpointParts::ParamsOnly);
  ASSERT_TRUE(rolled.divergence.has_value());
  EXPECT_EQ(rolled.divergence->lr_factor, 0.25);
  EXPECT_EQ(rolled.divergence->rollbacks, 2);
  for (const auto& [name, factor] : {std::pair{"zero.h5", 0.0}, std::pair{"above.h5", 1.5},
                                     std::pair{"negative.h5", -0.5}}) {
    SCOPED_TRACE(name);
    const std::string file = with_state(name, factor, 1);
    expect_error([&] { read_checkpoint(file, CheckpointParts::ParamsOnly); },
                 {file, "dataset /divergence is not", "learning-rate factor in (0, 1]"});
  }
  const std::string negative = with_state("negative_rollbacks.h5", 0.5, -1);
  expect_error([&] { read_checkpoint(negative, CheckpointParts::ParamsOnly); },
               {negative, "dataset /divergence is not"});
}

// A valid line that names a metric this version knows but lost its score ("valid ppl",
// its space damaged into a newline) is damage: it was said to name "the metric 'ppl',
// which this version does not know", a later version's header, and a resume stopped
// telling the user to find the version that wrote it.
// Which of a run's checkpoints a lineage was trained through: its lines' steps up to the
// next line's start (the checkpoint a resume began from included), none of another line,
// and Unknown where the lineage does not reach (a file without one, lines forgotten).
TEST(CheckpointLineage, ACheckpointIsOnALineageUpToWhereItsNextLineBegan) {
  const std::string run = "000000000000000a";
  const BranchStart back{20, "000000000000000b"};
  const std::vector<BranchStart> lineage = {{0, run}, back};
  const std::optional<BranchStart> start;  // no branch line: the run's start
  EXPECT_EQ(where_on_lineage(start, run, 10, lineage, 35), OnLineage::Yes);
  EXPECT_EQ(where_on_lineage(start, run, 20, lineage, 35), OnLineage::Yes);  // resumed from
  EXPECT_EQ(where_on_lineage(start, run, 25, lineage, 35), OnLineage::No);   // left at 20
  EXPECT_EQ(where_on_lineage(back, run, 35, lineage, 35), OnLineage::Yes);
  EXPECT_EQ(where_on_lineage(back, run, 40, lineage, 35), OnLineage::No);  // after it
  const BranchStart other{20, "000000000000000c"};
  EXPECT_EQ(where_on_lineage(other, run, 30, lineage, 35), OnLineage::No);
  EXPECT_EQ(where_on_lineage(other, run, 10, lineage, 35), OnLineage::No);
  EXPECT_EQ(where_on_lineage(BranchStart{25, back.id}, run, 30, lineage, 35), OnLineage::No);
  EXPECT_EQ(where_on_lineage(start, run, 10, {}, 35), OnLineage::Unknown);  // an older file
  // A lineage begun at an older file (step 6): a file without a line at or before it may
  // be the one it began from; after it, another branch's. One with a line is another's.
  const std::vector<BranchStart> from_older = {{6, "000000000000000d"}};
  EXPECT_EQ(where_on_lineage(start, run, 6, from_older, 35), OnLineage::Unknown);
  EXPECT_EQ(where_on_lineage(start, run, 8, from_older, 35), OnLineage::No);
  EXPECT_EQ(where_on_lineage(other, run, 6, from_older, 35), OnLineage::No);
  // Lines forgotten past kLineageKept (the first kept): Unknown up to the oldest kept.
  std::vector<BranchStart> long_lineage = {{0, run}};
  for (size_t i = 1; i < kLineageKept; ++i) {
    long_lineage.push_back({static_cast<int64_t>(1000 + i), "00000000000" + std::to_string(
                                                                 10000 + i)});
  }
  EXPECT_EQ(where_on_lineage(other, run, 30, long_lineage, 5000), OnLineage::Unknown);
  EXPECT_EQ(where_on_lineage(other, run, 3000, long_lineage, 5000), OnLineage::No);
  std::vector<BranchStart> parsed;
  EXPECT_EQ(parse_lineage(lineage_text(lineage), &parsed), "");
  EXPECT_EQ(parsed, lineage);
  EXPECT_NE(parse_lineage("20:000000000000000b 0:000000000000000a", &parsed), "");
  EXPECT_NE(parse_lineage("20:000000000000000B", &parsed), "");
}

TEST(CheckpointHeaderLines, AValidLineOfAKnownMetricWithoutItsScoreIsDamage) {
  HeaderFields fields;
  fields.validation = ValidationScore{"ppl", 3.5};
  std::string header = header_block(4096, std::string(64, 'a'), fields);
  header.replace(header.find("valid ppl 3.5\n"), 14, "valid ppl\n3.5\n");
  ParsedHeader parsed = parse_header(header);
  EXPECT_FALSE(parsed.later_version);
  EXPECT_EQ(parsed.problem, "its valid line has no score");
  // A metric this version does not know, with or without a score, is still a later
  // version's.
  header = header_block(4096, std::string(64, 'a'), fields);
  header.replace(header.find("valid ppl 3.5\n"), 14, "valid newer\n\0\0", 14);
  parsed = parse_header(header);
  EXPECT_TRUE(parsed.later_version);
  EXPECT_EQ(parsed.problem,
            "its valid line names the metric 'newer', which this version does not know");
}

}  // namespace
}  // namespace thpc
