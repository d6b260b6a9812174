// Settings that do nothing in a run (train/idle_settings.h): each rule says why, keys the
// run reads are never listed, and the trainer and its dry run say the same note. A
// helper's trial found twenty values accepted without a word (train.precision on the
// CPU, dist.* on one rank, the validation's translation options without valid_bleu), and
// a resume's note said seven of them took effect "from this step on".
#include <gtest/gtest.h>

#include <string>

#include "config/config.h"
#include "program.h"
#include "scratch_directory.h"
#include "train/idle_settings.h"

namespace thpc {
namespace {

const RunShape kCpuOneRank{/*on_gpu=*/false, /*ranks=*/1};
const RunShape kGpuTwoRanks{/*on_gpu=*/true, /*ranks=*/2};

TEST(IdleSettings, EachRuleSaysWhyAndKeysTheRunReadsAreLeftOut) {
  Config config;
  // The GPU's keys on the CPU, and only there.
  for (const char* key : {"train.precision", "train.cuda_kernels",
                          "train.short_attention_max_len", "dist.device"}) {
    EXPECT_NE(why_without_effect(key, config, kCpuOneRank), "") << key;
    EXPECT_EQ(why_without_effect(key, config, kGpuTwoRanks), "") << key;
  }
  // The gradient sums' keys on one rank; two ranks sum.
  for (const char* key : {"dist.reducer", "dist.reduce_dtype", "dist.bucket_mb",
                          "dist.embedding_sum", "dist.log_buckets"}) {
    EXPECT_EQ(why_without_effect(key, config, kCpuOneRank),
              "one rank: there are no gradients to sum")
        << key;
    EXPECT_EQ(why_without_effect(key, config, {false, 2}), "") << key;
  }
  // ... except where one GPU rank times NCCL's buckets (dist.log_buckets, reducer not mpi).
  config.dist.log_buckets = true;
  EXPECT_EQ(why_without_effect("dist.bucket_mb", config, {true, 1}), "");
  EXPECT_NE(why_without_effect("dist.bucket_mb", config, {false, 1}), "");
  config.dist.log_buckets = false;
  EXPECT_EQ(why_without_effect("dist.timeout_s", config, kCpuOneRank), "");

  // The data: shards or the synthetic task, never both.
  config.data.dir = "";
  for (const char* key : {"data.train", "data.valid", "data.memory_mb"}) {
    EXPECT_EQ(why_without_effect(key, config, kCpuOneRank),
              "data.dir is empty: the synthetic task")
        << key;
  }
  EXPECT_EQ(why_without_effect("data.synthetic_vocab", config, kCpuOneRank), "");
  config.data.dir = "data";
  EXPECT_EQ(why_without_effect("data.synthetic_vocab", config, kCpuOneRank),
            "data.dir is set: its shards, not the synthetic task");
  EXPECT_EQ(why_without_effect("data.memory_mb", config, kCpuOneRank), "");

  // The validation's translation.
  config.train.valid_bleu = false;
  for (const char* key : {"train.valid_metric", "train.valid_beam", "train.valid_bleu_tokenize"}) {
    EXPECT_NE(why_without_effect(key, config, kGpuTwoRanks), "") << key;
  }
  config.train.valid_bleu = true;
  config.train.valid_metric = "bleu";
  EXPECT_EQ(why_without_effect("train.valid_beam", config, kGpuTwoRanks), "");
  EXPECT_EQ(why_without_effect("train.valid_bleu_tokenize", config, kGpuTwoRanks), "");
  config.train.valid_metric = "chrf";
  EXPECT_EQ(why_without_effect("train.valid_bleu_tokenize", config, kGpuTwoRanks),
            "train.valid_metric = chrf scores characters, untokenized");

  // Divergence: what each policy reads.
  config.train.divergence = "stop";
  EXPECT_NE(why_without_effect("train.divergence_limit", config, kGpuTwoRanks), "");
  EXPECT_NE(why_without_effect("train.divergence_lr_factor", config, kGpuTwoRanks), "");
  config.train.divergence = "skip";
  EXPECT_EQ(why_without_effect("train.divergence_limit", config, kGpuTwoRanks), "");
  EXPECT_NE(why_without_effect("train.divergence_lr_factor", config, kGpuTwoRanks), "");
  config.train.divergence = "rollback";
  EXPECT_EQ(why_without_effect("train.divergence_lr_factor", config, kGpuTwoRanks), "");
  config.train.divergence_gnorm_factor = 0;
  EXPECT_NE(why_without_effect("train.divergence_warmup", config, kGpuTwoRanks), "");
  config.train.divergence_gnorm_factor = 5;
  EXPECT_EQ(why_without_effect("train.divergence_warmup", config, kGpuTwoRanks), "");

  // Keys every run reads are never listed.
  for (const char* key : {"model.layers", "train.lr_scale", "train.seed", "checkpoint.keep",
                          "decode.beam", "train.threads"}) {
    EXPECT_EQ(why_without_effect(key, config, kCpuOneRank), "") << key;
  }
}

// Where the GPU is not known (--dry-run on a login node, train.backend = auto), the GPU's
// keys are left alone: the job may run on its GPUs (a review's finding).
TEST(IdleSettings, WhereTheGpuIsNotKnownItsKeysAreLeftAlone) {
  Config config;
  RunShape login_node;
  login_node.gpu_known = false;
  for (const char* key : {"train.precision", "train.cuda_kernels", "dist.device"}) {
    EXPECT_EQ(why_without_effect(key, config, login_node), "") << key;
  }
  config.dist.log_buckets = true;  // one GPU rank may time NCCL's buckets
  EXPECT_EQ(why_without_effect("dist.bucket_mb", config, login_node), "");
  config.dist.log_buckets = false;
  EXPECT_NE(why_without_effect("dist.bucket_mb", config, login_node), "");
}

TEST(IdleSettings, TheNoteListsTheValuesGivenThatDoNothingAndOnlyThose) {
  Config config;
  EXPECT_EQ(idle_settings_note(config, kCpuOneRank), "");  // defaults: nothing was given
  config.train.precision = "fp32";
  config.train.lr_scale = 0.5;       // read: not listed
  config.dist.reduce_dtype = "bf16";
  EXPECT_EQ(idle_settings_note(config, kCpuOneRank),
            "note: set, but without effect in this run: train.precision = fp32 (the CPU "
            "computes in fp32 with its own kernels), dist.reduce_dtype = bf16 (one rank: "
            "there are no gradients to sum)");
  EXPECT_EQ(idle_settings_note(config, kGpuTwoRanks), "");
  // A resume's note named one already, with the checkpoint's value.
  EXPECT_EQ(idle_settings_note(config, kCpuOneRank, {"train.precision"}),
            "note: set, but without effect in this run: dist.reduce_dtype = bf16 (one rank: "
            "there are no gradients to sum)");
  EXPECT_EQ(idle_settings_note(config, kCpuOneRank, {"dist.reduce_dtype", "train.precision"}),
            "");
}

// The trainer says it after its first lines, and --dry-run as a comment line.
class IdleSettingsRun : public ScratchDirectoryTest {};

TEST_F(IdleSettingsRun, TheTrainerAndItsDryRunSayTheNote) {
  const std::string command = binary_dir() + "/transformer_hpc " THPC_SOURCE_DIR
                              "/input/tiny.ini --train.backend=cpu --model.layers=1 "
                              "--train.max_steps=1 --train.divergence_lr_factor=0.25 "
                              "--checkpoint.dir=" + path("run");
  const std::string note = "note: set, but without effect in this run: "
                           "train.divergence_lr_factor = 0.25 (only train.divergence = "
                           "rollback lowers the learning rate)\n";
  const ProcessResult dry = run_process(command + " --dry-run");
  ASSERT_EQ(dry.exit_code, 0) << dry.output;
  EXPECT_NE(dry.output.find("\n# " + note), std::string::npos) << dry.output;
  const ProcessResult run = run_process(command);
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_NE(run.output.find("\n" + note), std::string::npos) << run.output;
}

}  // namespace
}  // namespace thpc
