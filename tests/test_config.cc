// The configuration system: the paper's values in input/base.ini and input/big.ini, the
// override order, the round trip through to_ini(), the help text, and that every kind
// of mistake fails with one line naming the key and the file.
#include "config/config.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "backend/factory.h"
#include "common/error.h"
#include "config/option_table.h"
#include "expect_error.h"
#include "kernels/ops.h"

namespace thpc {
namespace {

const std::string kInputDir = std::string(THPC_SOURCE_DIR) + "/input/";
const std::string kBaseIni = kInputDir + "base.ini";
const std::string kBigIni = kInputDir + "big.ini";
const std::string kTinyIni = kInputDir + "tiny.ini";

// Every key the table must know, section.key, as the fields of config.h.
const std::vector<std::string> kAllKeys = {
    "model.layers",          "model.d_model",         "model.d_ff",
    "model.heads",           "model.d_k",             "model.d_v",
    "model.dropout",         "model.attention_dropout", "model.activation_dropout",
    "model.label_smoothing",
    "model.positions",       "model.max_positions",   "model.vocab_size",
    "model.attention_bias",  "model.layernorm_eps",   "model.norm",
    "model.fused_ops",
    "train.backend",
    "train.precision",       "train.cuda_kernels",   "train.short_attention_max_len",
    "train.seed",            "train.max_steps",       "train.max_minutes",
    "train.max_epochs",      "train.tokens_per_step",
    "train.accumulate",      "train.loss_chunk_rows", "train.warmup_steps",
    "train.lr_scale",
    "train.adam_beta1",      "train.adam_beta2",      "train.adam_eps",
    "train.log_every",       "train.threads",         "train.valid_every",
    "train.clip_norm",       "train.weight_decay",    "train.metrics_dir",
    "train.valid_bleu",
    "train.valid_beam",      "train.valid_bleu_tokenize", "train.valid_metric",
    "train.divergence",      "train.divergence_loss_factor", "train.divergence_gnorm_factor",
    "train.divergence_warmup", "train.divergence_limit", "train.divergence_lr_factor",
    "data.dir",              "data.train",            "data.valid",
    "data.memory_mb",        "data.synthetic",
    "data.synthetic_vocab",  "data.synthetic_min_len", "data.synthetic_max_len",
    "dist.bucket_mb",        "dist.device",           "dist.timeout_s",
    "dist.reducer",          "dist.reduce_dtype",     "dist.log_buckets",
    "dist.embedding_sum",
    "checkpoint.dir",        "checkpoint.minutes",    "checkpoint.every_steps",
    "checkpoint.keep",       "checkpoint.background_write", "checkpoint.resume",
    "checkpoint.init",
    "checkpoint.average_last", "checkpoint.keep_best", "checkpoint.patience",
    "checkpoint.overwrite",  "checkpoint.keep_best_count", "checkpoint.average_best",
    "decode.beam",           "decode.alpha",          "decode.max_len_a",
    "decode.max_len_b",
    "decode.tree_leaves",
};

// Every key of the table equal in both, each said by its name where it differs: read
// through the option table, so that no key is left out (a hand-kept list of fields here
// had missed 8 of 80 as keys were added; a helper's changeability trial). The values are
// compared as to_ini() writes them, which reads back exactly (floats in their fewest
// exact digits).
void expect_same_config(const Config& actual, const Config& expected) {
  Config left = actual, right = expected;
  for (const Option& option : option_table()) {
    EXPECT_EQ(format_value(option.field(left)), format_value(option.field(right)))
        << option.name();
  }
}

// parse_command_line over a list of words, argv[0] included.
bool run_command_line(const std::vector<std::string>& words, Config& config) {
  std::vector<const char*> argv;
  for (const std::string& word : words) argv.push_back(word.c_str());
  return parse_command_line(static_cast<int>(argv.size()), argv.data(), config);
}

// A scratch directory for ini files with mistakes in them.
class ConfigFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    directory_ = std::filesystem::temp_directory_path() /
                 ("thpc_test_config_" + std::to_string(::getpid()));
    std::filesystem::create_directories(directory_);
  }
  void TearDown() override { std::filesystem::remove_all(directory_); }

  std::string write_ini(const std::string& name, const std::string& text) const {
    const std::string path = (directory_ / name).string();
    std::ofstream(path) << text;
    return path;
  }

  std::filesystem::path directory_;
};

// `--data.dir=` gives the key its empty value (the synthetic task), as `dir =` in the
// file would: Boost refused it ("the argument ... should follow immediately after the
// equal sign"), so base.ini could not be run on the synthetic task from the command line.
TEST(Config, AnEmptyValueOnTheCommandLineIsTheEmptyString) {
  Config config;
  ASSERT_TRUE(run_command_line({"transformer_hpc", kBaseIni, "--data.dir=",
                                "--train.valid_every=0", "--checkpoint.resume="},
                               config));
  EXPECT_EQ(config.data.dir, "");
  EXPECT_EQ(config.checkpoint.resume, "");
  const Config overridden = load_config(kBaseIni, {"data.dir=", "train.valid_every=0"});
  EXPECT_EQ(overridden.data.dir, "");
  // A key whose type has no empty value says so, naming it.
  Config numbers;
  expect_error(
      [&] { run_command_line({"transformer_hpc", kBaseIni, "--model.layers="}, numbers); },
      {"model.layers: '' is not an integer (on the command line)"});
}

// ---- the paper's configurations ----

TEST(Config, BaseIniHasThePapersValues) {
  const Config config = load_config(kBaseIni);
  EXPECT_EQ(config.model.layers, 6);
  EXPECT_EQ(config.model.d_model, 512);
  EXPECT_EQ(config.model.d_ff, 2048);
  EXPECT_EQ(config.model.heads, 8);
  EXPECT_EQ(config.model.d_k, 64);
  EXPECT_EQ(config.model.d_v, 64);
  EXPECT_EQ(config.model.head_dim_k(), 64);
  EXPECT_EQ(config.model.head_dim_v(), 64);
  EXPECT_EQ(config.model.dropout, 0.1f);
  EXPECT_EQ(config.model.attention_dropout, 0.0f);
  EXPECT_EQ(config.model.label_smoothing, 0.1f);
  EXPECT_EQ(config.model.positions, "sinusoidal");
  EXPECT_EQ(config.model.vocab_size, 37000);
  EXPECT_FALSE(config.model.attention_bias);
  EXPECT_EQ(config.train.max_steps, 100000);
  EXPECT_EQ(config.train.tokens_per_step, 25000);
  EXPECT_EQ(config.train.warmup_steps, 4000);
  EXPECT_EQ(config.train.lr_scale, 1.0f);
  EXPECT_EQ(config.train.adam_beta1, 0.9f);
  EXPECT_EQ(config.train.adam_beta2, 0.98f);
  EXPECT_EQ(config.train.adam_eps, 1e-9f);
  EXPECT_EQ(config.checkpoint.minutes, 10.0f);  // every 10 minutes (§5.2)
  EXPECT_EQ(config.checkpoint.average_last, 5);  // the last 5 averaged (§6.1)
  EXPECT_GE(config.checkpoint.keep, config.checkpoint.average_last);
  EXPECT_EQ(config.source_file, kBaseIni);
  EXPECT_FALSE(config.dry_run);
}

// input/base_prenorm.ini is base.ini but for what its comment says differs: the norm
// order and transformer_base_v2's schedule (twice the learning rate, 8000 warm-up steps).
TEST(Config, BasePrenormIniIsBaseWithPreNormAndTheV2Schedule) {
  const Config prenorm = load_config(kInputDir + "base_prenorm.ini");
  EXPECT_EQ(load_config(kBaseIni).model.norm, "post");
  expect_same_config(prenorm, load_config(kBaseIni, {"model.norm=pre", "train.lr_scale=2",
                                                     "train.warmup_steps=8000"}));
}

// input/multi30k_cpu.ini is multi30k.ini's model with the schedule its header gives for
// 2 CPU cores and 50 minutes, and nothing else changed.
TEST(Config, Multi30kCpuIniIsMulti30kWithACpuSchedule) {
  const Config cpu = load_config(kInputDir + "multi30k_cpu.ini");
  const Config expected = load_config(
      kInputDir + "multi30k.ini",
      {"train.max_minutes=50", "train.tokens_per_step=4000", "train.warmup_steps=1000",
       "train.lr_scale=0.5", "train.threads=2", "train.log_every=50", "train.valid_every=150",
       "train.valid_bleu=true", "checkpoint.minutes=0", "checkpoint.every_steps=150",
       "checkpoint.keep_best=bleu", "checkpoint.patience=4",
       "checkpoint.dir=build/multi30k/cpu_checkpoints"});
  expect_same_config(cpu, expected);
}

TEST(Config, BigIniHasThePapersValues) {
  const Config config = load_config(kBigIni);
  EXPECT_EQ(config.model.layers, 6);
  EXPECT_EQ(config.model.d_model, 1024);
  EXPECT_EQ(config.model.d_ff, 4096);
  EXPECT_EQ(config.model.heads, 16);
  EXPECT_EQ(config.model.d_k, 64);
  EXPECT_EQ(config.model.d_v, 64);
  EXPECT_EQ(config.model.head_dim_k(), 64);
  EXPECT_EQ(config.model.head_dim_v(), 64);
  EXPECT_EQ(config.model.dropout, 0.3f);
  EXPECT_EQ(config.model.attention_dropout, 0.0f);
  EXPECT_EQ(config.model.label_smoothing, 0.1f);
  EXPECT_EQ(config.model.positions, "sinusoidal");
  EXPECT_EQ(config.model.vocab_size, 37000);
  EXPECT_FALSE(config.model.attention_bias);
  EXPECT_EQ(config.train.max_steps, 300000);
  EXPECT_EQ(config.train.tokens_per_step, 25000);
  EXPECT_EQ(config.train.warmup_steps, 4000);
  EXPECT_EQ(config.train.lr_scale, 1.0f);
  EXPECT_EQ(config.train.adam_beta1, 0.9f);
  EXPECT_EQ(config.train.adam_beta2, 0.98f);
  EXPECT_EQ(config.train.adam_eps, 1e-9f);
  EXPECT_EQ(config.checkpoint.minutes, 10.0f);    // every 10 minutes (§5.2)
  EXPECT_EQ(config.checkpoint.average_last, 20);  // the last 20 averaged (§6.1)
  EXPECT_GE(config.checkpoint.keep, config.checkpoint.average_last);
}

TEST(Config, TinyIniIsASmallReversalModel) {
  // What tiny.ini is for (the learning test pins how well it learns): the reversal task
  // on a model far smaller than base, taking its vocabulary from the data, with the
  // paper's regularization kept.
  const Config config = load_config(kTinyIni);
  EXPECT_EQ(config.data.synthetic, "reverse");
  EXPECT_EQ(config.model.vocab_size, 0);
  EXPECT_LE(config.model.d_model, 128);
  EXPECT_LE(config.model.layers, 3);
  EXPECT_FLOAT_EQ(config.model.dropout, 0.1f);
  EXPECT_FLOAT_EQ(config.model.label_smoothing, 0.1f);
  EXPECT_GE(config.model.max_positions, config.data.synthetic_max_len + 1);
  EXPECT_LE(config.train.tokens_per_step, 5000);
}

// §6.3: "a 4-layer transformer with d_model = 1024", "a vocabulary of 16K tokens for the
// WSJ only setting", attention and residual dropout, beam 21, alpha 0.3, maximum output
// length = input length + 300; single models, no checkpoint averaging; the rest as base.
TEST(Config, ParseWsjIniHasThePapersParserValues) {
  const Config config = load_config(kInputDir + "parse_wsj.ini");
  EXPECT_EQ(config.model.layers, 4);
  EXPECT_EQ(config.model.d_model, 1024);
  // "all other parameters remained unchanged from the base translation model" (§6.3).
  EXPECT_EQ(config.model.d_ff, 2048);
  EXPECT_EQ(config.model.heads, 8);
  EXPECT_EQ(config.model.vocab_size, 16000);
  EXPECT_GT(config.model.dropout, 0.0f);
  EXPECT_GT(config.model.attention_dropout, 0.0f);
  EXPECT_EQ(config.model.label_smoothing, 0.1f);
  EXPECT_EQ(config.train.warmup_steps, 4000);
  EXPECT_EQ(config.decode.beam, 21);
  EXPECT_EQ(config.decode.alpha, 0.3f);
  EXPECT_EQ(config.decode.max_len_a, 1);
  EXPECT_EQ(config.decode.max_len_b, 300);
  EXPECT_EQ(config.decode.tree_leaves, "words");
  EXPECT_EQ(config.checkpoint.average_last, 0);
  // A tree is about 2.5 target tokens a word: the positions hold input + 300 for the
  // sample's longest sentences.
  EXPECT_GE(config.model.max_positions, 300 + 250);
}

// parse_tiny.ini is parse_wsj.ini's recipe, smaller: the same regularization and length
// penalty, no averaging, a model the CPU trains in minutes, and an output bound that
// still holds every training tree (at most 3.3 tree tokens a word + 10 in the sample).
TEST(Config, ParseTinyIniIsTheParserShrunk) {
  const Config tiny = load_config(kInputDir + "parse_tiny.ini");
  const Config wsj = load_config(kInputDir + "parse_wsj.ini");
  EXPECT_LE(tiny.model.d_model, 256);
  EXPECT_LE(tiny.model.layers, wsj.model.layers);
  EXPECT_GT(tiny.model.vocab_size, 0);
  EXPECT_GT(tiny.model.attention_dropout, 0.0f);
  EXPECT_EQ(tiny.model.label_smoothing, wsj.model.label_smoothing);
  EXPECT_EQ(tiny.decode.alpha, wsj.decode.alpha);
  EXPECT_EQ(tiny.decode.tree_leaves, wsj.decode.tree_leaves);
  EXPECT_GE(tiny.decode.max_len_a, 4);
  EXPECT_GE(tiny.decode.max_len_b, 10);
  EXPECT_EQ(tiny.checkpoint.average_last, 0);
  EXPECT_LE(tiny.train.max_steps, 1000);
}

TEST(Config, DefaultsAreValid) { EXPECT_NO_THROW(validate(Config{})); }

// ---- overrides ----

TEST(Config, OverridesBeatTheFile) {
  const Config config =
      load_config(kTinyIni, {"model.layers=3", "train.max_steps=7", "data.synthetic=sort"});
  EXPECT_EQ(config.model.layers, 3);
  EXPECT_EQ(config.train.max_steps, 7);
  EXPECT_EQ(config.data.synthetic, "sort");
  EXPECT_EQ(config.model.d_model, 64);  // untouched keys keep the file's value
}

TEST(Config, CommandLineBeatsTheFile) {
  Config config;
  ASSERT_TRUE(run_command_line(
      {"transformer_hpc", kTinyIni, "--model.layers=3", "--train.seed", "42"}, config));
  EXPECT_EQ(config.model.layers, 3);
  EXPECT_EQ(config.train.seed, 42u);
  EXPECT_EQ(config.model.d_model, 64);
  EXPECT_EQ(config.source_file, kTinyIni);
  EXPECT_FALSE(config.dry_run);
}

TEST(Config, OptionsMayComeBeforeTheFile) {
  Config config;
  ASSERT_TRUE(run_command_line({"transformer_hpc", "--dry-run", "--model.layers=1", kTinyIni},
                               config));
  EXPECT_TRUE(config.dry_run);
  EXPECT_EQ(config.model.layers, 1);
}

TEST(Config, HelpPrintsTheTableAndReturnsFalse) {
  Config config;
  ::testing::internal::CaptureStdout();
  const bool go_on = run_command_line({"transformer_hpc", "--help"}, config);
  const std::string printed = ::testing::internal::GetCapturedStdout();
  EXPECT_FALSE(go_on);
  EXPECT_EQ(printed, help_text());
}

TEST(Config, BooleansAcceptTrueFalseOneZero) {
  EXPECT_TRUE(load_config(kTinyIni, {"model.attention_bias=true"}).model.attention_bias);
  EXPECT_TRUE(load_config(kTinyIni, {"model.attention_bias=1"}).model.attention_bias);
  EXPECT_FALSE(load_config(kTinyIni, {"model.attention_bias=false"}).model.attention_bias);
  EXPECT_FALSE(load_config(kTinyIni, {"model.attention_bias=0"}).model.attention_bias);
}

TEST(Config, SeedIsAFullUint64) {
  const std::uint64_t largest = std::numeric_limits<std::uint64_t>::max();
  const Config config = load_config(kTinyIni, {"train.seed=" + std::to_string(largest)});
  EXPECT_EQ(config.train.seed, largest);
}

TEST(Config, StepsAreInt64) {
  const Config config = load_config(kTinyIni, {"train.max_steps=10000000000",
                                               "train.tokens_per_step=5000000000"});
  EXPECT_EQ(config.train.max_steps, std::int64_t{10000000000});
  EXPECT_EQ(config.train.tokens_per_step, std::int64_t{5000000000});
}

// Every candidate of kernels/ops.h's list is in "candidate", is taken by its name alone,
// and is named in train.cuda_kernels' help (--help and docs/configuration.md), which is
// written by hand: a candidate left out of it was there to be found by reading ops.h.
TEST(Config, EveryCandidateKernelIsTakenByNameAndNamedInTheHelp) {
  const Option* option = find_option("train.cuda_kernels");
  ASSERT_NE(option, nullptr);
  const std::string help = option->help;
  unsigned all = 0;
  int count = 0;
#define THPC_CHECK_CANDIDATE(enumerator, bit, name)                                       \
  {                                                                                       \
    ++count;                                                                              \
    all |= enumerator;                                                                    \
    EXPECT_NE(help.find(name), std::string::npos) << name << " is not in the help: " << help; \
    unsigned named = 0;                                                                   \
    std::string error;                                                                    \
    EXPECT_TRUE(parse_candidate_kernels(name, named, error)) << error;                    \
    EXPECT_EQ(named, static_cast<unsigned>(enumerator)) << name;                          \
  }
  THPC_CANDIDATE_KERNELS(THPC_CHECK_CANDIDATE)
#undef THPC_CHECK_CANDIDATE
  EXPECT_EQ(all, static_cast<unsigned>(kAllCandidates));
  EXPECT_EQ(__builtin_popcount(all), count) << "each candidate its own bit";
}

// train.cuda_kernels names a set of candidate kernels (kernels/ops.h): none, all, or some
// by name (a GPU session whose twins fail for one candidate can measure the others); the
// former candidates, the default since their GPU run (2026-11-26/27 on an H100,
// 2026-11-29 and 2026-12-04 on an H200), still load (a checkpoint trained with them names
// them) and name nothing; fused_attention, step_graphs, relu_masks, weight_grads_beside,
// fuller_column_sums and worker_graphs are the candidates now.
TEST(Config, CudaKernelsNameASetOfCandidates) {
  const std::vector<std::pair<std::string, unsigned>> settings = {
      {"verified", kNoCandidates},
      {"candidate", kAllCandidates},
      {"gathered_attention", kNoCandidates},
      {"short_attention", kNoCandidates},
      {"write_gradients,short_attention", kNoCandidates},
      {"short_attention,gathered_attention", kNoCandidates},
      {"async_upload", kNoCandidates},
      {"step_totals,int8_products,fused_adam", kNoCandidates},
      {"fused_attention", kFusedAttention},
      {"fused_attention,step_totals", kFusedAttention},
      {"step_graphs", kStepGraphs},
      {"step_graphs,async_upload", kStepGraphs},
      {"vector_norms", kNoCandidates},
      {"fused_adam,vector_norms,relu_masks", kReluMasks},
      {"relu_masks", kReluMasks},
      {"pinned_snapshot,kept_ones,decode_attention", kNoCandidates},
      {"loss_rows_from_l2,weight_grads_beside", kWeightGradsBeside},
      {"weight_grads_beside,kept_ones,step_graphs", kWeightGradsBeside | kStepGraphs},
      {"fuller_column_sums,vector_norms", kFullerColumnSums},
      {"worker_graphs", kWorkerGraphs},
      {"step_graphs,worker_graphs", kStepGraphs | kWorkerGraphs},
      {"fused_norm_grads,vector_norms", kFusedNormGrads},
      {"fast_loss_exp,loss_rows_from_l2", kFastLossExp},
      {"bias_grads_in_gemm,kept_ones", kBiasGradsInGemm},
      {"weight_decay", kWeightDecay},
      {"fused_attention,step_graphs,relu_masks,weight_grads_beside,fuller_column_sums,"
       "worker_graphs,fused_norm_grads,fast_loss_exp,bias_grads_in_gemm,weight_decay",
       kAllCandidates}};
  for (const auto& [setting, bits] : settings) {
    const Config config = load_config(kTinyIni, {"train.cuda_kernels=" + setting});
    EXPECT_EQ(backend_request(config.train, 0).cuda_kernels.candidates, bits) << setting;
  }
  for (const std::string bad : {"fast", "gathered_attention,", "verified,",
                                "gathered_attention,,verified"}) {
    SCOPED_TRACE(bad);
    expect_error([&] { load_config(kTinyIni, {"train.cuda_kernels=" + bad}); },
                 {"tiny.ini", "train.cuda_kernels", "verified, candidate",
                  "or some of fused_attention,step_graphs,relu_masks,weight_grads_beside,"
                  "fuller_column_sums,worker_graphs,fused_norm_grads,fast_loss_exp,"
                  "bias_grads_in_gemm"});
  }
}

// train.short_attention_max_len reaches the CUDA backend's kernel choice; its default
// is the length measured on the H100 (kernels/ops.h), and the kernels' limit bounds it.
TEST(Config, ShortAttentionMaxLengthReachesTheBackendWithinTheKernelsLimit) {
  EXPECT_EQ(TrainConfig{}.short_attention_max_len, kShortAttentionDefaultMaxLength);
  EXPECT_EQ(CudaKernelChoice{}.short_attention_max_len, kShortAttentionDefaultMaxLength);
  EXPECT_EQ(backend_request(load_config(kTinyIni, {}).train, 0)
                .cuda_kernels.short_attention_max_len,
            kShortAttentionDefaultMaxLength);
  for (const int length : {0, 64, kShortAttentionLongest}) {
    const Config config = load_config(
        kTinyIni, {"train.short_attention_max_len=" + std::to_string(length)});
    EXPECT_EQ(backend_request(config.train, 0).cuda_kernels.short_attention_max_len, length);
  }
  for (const std::string bad : {"129", "-1", "forty"}) {
    SCOPED_TRACE(bad);
    expect_error(
        [&] { load_config(kTinyIni, {"train.short_attention_max_len=" + bad}); },
        {"train.short_attention_max_len"});
  }
}

TEST(Config, ExplicitHeadWidthsAllowIndivisibleHeads) {
  const Config config = load_config(kTinyIni, {"model.heads=3", "model.d_k=16", "model.d_v=16"});
  EXPECT_EQ(config.model.head_dim_k(), 16);
  EXPECT_EQ(config.model.head_dim_v(), 16);
}

// ---- to_ini and help ----

// Values that differ from every default and every file, so a key that to_ini() forgot
// would come back wrong.
const std::vector<std::string> kUnusualValues = {
    "model.layers=3",          "model.d_model=96",       "model.d_ff=200",
    "model.heads=6",           "model.d_k=20",           "model.d_v=24",
    "model.dropout=0.15",      "model.attention_dropout=0.05", "model.activation_dropout=0.07",
    "model.label_smoothing=0.2",
    "model.positions=learned", "model.max_positions=40", "model.vocab_size=123",
    "model.attention_bias=true", "model.layernorm_eps=1e-6", "model.norm=pre", "model.fused_ops=off",
    "train.backend=cpu",
    "train.precision=fp32",    "train.cuda_kernels=candidate",
    "train.short_attention_max_len=33",
    "train.seed=18446744073709551615", "train.max_steps=12345678901",
    "train.max_minutes=2.5",   "train.max_epochs=7",
    "train.tokens_per_step=777", "train.accumulate=3", "train.loss_chunk_rows=96",
    "train.warmup_steps=17",
    "train.lr_scale=0.3",      "train.adam_beta1=0.85",  "train.adam_beta2=0.995",
    "train.adam_eps=3e-8",     "train.log_every=9",      "train.threads=2",
    "train.valid_every=5",     "train.clip_norm=1.5",    "train.weight_decay=0.03",
    "train.metrics_dir=runs/m",
    "train.valid_bleu=true",   "train.valid_beam=3",     "train.valid_bleu_tokenize=char",
    "train.valid_metric=chrf",
    "train.divergence=rollback", "train.divergence_loss_factor=2.5",
    "train.divergence_gnorm_factor=7", "train.divergence_warmup=12",
    "train.divergence_limit=5", "train.divergence_lr_factor=0.25",
    "data.dir=corpus/wmt",    "data.train=tr",
    "data.valid=dev",          "data.memory_mb=77",
    "data.synthetic=copy",     "data.synthetic_vocab=11", "data.synthetic_min_len=2",
    "data.synthetic_max_len=7", "dist.bucket_mb=3.5",   "dist.device=2",
    "dist.timeout_s=42.5",     "dist.reducer=mpi",       "dist.reduce_dtype=bf16",
    "dist.log_buckets=true", "dist.embedding_sum=at_end",
    "checkpoint.dir=runs/x/ckpt", "checkpoint.minutes=0.25",
    "checkpoint.every_steps=500", "checkpoint.keep=7", "checkpoint.background_write=false",
    "checkpoint.resume=auto",
    "checkpoint.init=runs/x/average.h5", "checkpoint.average_last=6",
    "checkpoint.keep_best=chrf", "checkpoint.patience=3", "checkpoint.overwrite=true",
    "checkpoint.keep_best_count=8", "checkpoint.average_best=4",
    "decode.beam=21",          "decode.alpha=0.3",       "decode.max_len_a=2",
    "decode.max_len_b=300",    "decode.tree_leaves=words",
};

TEST_F(ConfigFiles, ToIniRoundTrips) {
  ASSERT_EQ(kUnusualValues.size(), kAllKeys.size());
  for (const std::vector<std::string>& overrides :
       {std::vector<std::string>{}, kUnusualValues}) {
    for (const std::string& source : {kBaseIni, kBigIni, kTinyIni}) {
      SCOPED_TRACE(source + (overrides.empty() ? "" : " with unusual values"));
      const Config original = load_config(source, overrides);
      const Config reloaded = load_config(write_ini("resolved.ini", original.to_ini()));
      expect_same_config(reloaded, original);
      // The text names the file it came from; everything after that line must agree.
      const auto body = [](const std::string& ini) { return ini.substr(ini.find('\n')); };
      EXPECT_EQ(body(reloaded.to_ini()), body(original.to_ini()));
    }
  }
}

TEST(Config, ToIniHoldsEveryKeyUnderItsSection) {
  const std::string ini = Config{}.to_ini();
  for (const std::string& name : kAllKeys) {
    const std::string section = name.substr(0, name.find('.'));
    const std::string key = name.substr(name.find('.') + 1);
    const auto section_at = ini.find("\n[" + section + "]\n");
    ASSERT_NE(section_at, std::string::npos) << section;
    const auto key_at = ini.find("\n" + key + " = ", section_at);
    ASSERT_NE(key_at, std::string::npos) << name;
    const auto next_section = ini.find("\n[", section_at + 1);
    EXPECT_LT(key_at, next_section) << name << " is not under [" << section << "]";
  }
}

// One key's line of the --help table (docs/configuration.md has a copy).
struct KeyRow {
  std::string name, type, default_value, range, meaning;  // name: section.key
};

// The key rows of a help text: each "[section]" line is followed by a header line
// "  key  type  default  range  meaning" whose words mark where the columns start (in
// characters, not bytes: a range may hold "≥"), then one line per key.
std::vector<KeyRow> parse_key_table(const std::string& text) {
  std::vector<KeyRow> rows;
  std::istringstream lines(text);
  std::string line, section;
  std::vector<size_t> starts;  // of key, type, default, range, meaning
  while (std::getline(lines, line)) {
    // "[decode]", or "[decode]  what the section holds" (not the usage's "[section] of")
    const size_t close = line.find(']');
    if (line.size() > 2 && line.front() == '[' && close != std::string::npos &&
        (close + 1 == line.size() || line.compare(close + 1, 2, "  ") == 0)) {
      section = line.substr(1, close - 1);
      starts.clear();
      continue;
    }
    if (section.empty() || line.empty()) continue;
    if (starts.empty()) {
      for (const char* word : {"key", "type", "default", "range", "meaning"}) {
        const size_t at = line.find(std::string(" ") + word);
        EXPECT_NE(at, std::string::npos) << "no column '" << word << "' in: " << line;
        starts.push_back(at == std::string::npos ? 0 : at + 1);
      }
      continue;
    }
    std::vector<std::string> characters;  // UTF-8 sequences, one per character
    for (const char byte : line) {
      if ((static_cast<unsigned char>(byte) & 0xC0) == 0x80 && !characters.empty()) {
        characters.back() += byte;
      } else {
        characters.emplace_back(1, byte);
      }
    }
    const auto column = [&](size_t index) {
      const size_t end = index + 1 < starts.size() ? starts[index + 1] : characters.size();
      std::string cell;
      for (size_t at = starts[index]; at < std::min(end, characters.size()); ++at) {
        cell += characters[at];
      }
      const size_t first = cell.find_first_not_of(' ');
      if (first == std::string::npos) return std::string();
      return cell.substr(first, cell.find_last_not_of(' ') + 1 - first);
    };
    rows.push_back({section + "." + column(0), column(1), column(2), column(3), column(4)});
  }
  return rows;
}

TEST(Config, HelpMentionsEveryKey) {
  const std::string help = help_text();
  for (const std::string& name : kAllKeys) {
    const std::string section = name.substr(0, name.find('.'));
    const std::string key = name.substr(name.find('.') + 1);
    EXPECT_NE(help.find("[" + section + "]"), std::string::npos) << section;
    EXPECT_NE(help.find("  " + key + " "), std::string::npos) << name;
  }
  // Every key of the table, not only those listed here: read them back from to_ini().
  std::istringstream ini(Config{}.to_ini());
  std::string line;
  int keys_in_ini = 0;
  while (std::getline(ini, line)) {
    const auto equals = line.find(" = ");
    if (equals == std::string::npos || line.front() == '#') continue;
    ++keys_in_ini;
    EXPECT_NE(help.find("  " + line.substr(0, equals) + " "), std::string::npos) << line;
  }
  EXPECT_EQ(keys_in_ini, static_cast<int>(kAllKeys.size()));
  EXPECT_NE(help.find("--dry-run"), std::string::npos);
  EXPECT_NE(help.find("sinusoidal | learned"), std::string::npos);
}

// docs/configuration.md is the --help text (tools/update_config_reference.sh writes it
// there): the same keys in the same order, with the same types, defaults, ranges and
// meanings, and then the same text, byte for byte.
TEST(Config, ConfigurationReferenceIsTheHelpText) {
  const std::string path = std::string(THPC_SOURCE_DIR) + "/docs/configuration.md";
  std::ifstream file(path);
  ASSERT_TRUE(file) << path;
  std::ostringstream bytes;
  bytes << file.rdbuf();
  const std::string reference = bytes.str();
  ASSERT_EQ(reference.rfind("# Configuration reference\n", 0), 0u) << path << ": its title";
  const size_t block = reference.find("\n```\n");
  ASSERT_NE(block, std::string::npos) << path << ": no ``` block";
  const size_t block_end = reference.find("\n```\n", block + 1);
  ASSERT_NE(block_end, std::string::npos) << path << ": the ``` block does not end";
  const std::string documented_text = reference.substr(block + 5, block_end + 1 - block - 5);
  const std::vector<KeyRow> documented = parse_key_table(documented_text);
  const std::vector<KeyRow> printed = parse_key_table(help_text());
  ASSERT_EQ(printed.size(), kAllKeys.size());
  const std::string remedy = " (bash tools/update_config_reference.sh writes --help there)";

  std::vector<std::string> documented_names, printed_names;
  for (const KeyRow& row : documented) documented_names.push_back(row.name);
  for (const KeyRow& row : printed) printed_names.push_back(row.name);
  EXPECT_EQ(documented_names, printed_names)
      << "docs/configuration.md lists other keys than --help" << remedy;
  for (const KeyRow& row : printed) {
    const auto match = std::find_if(documented.begin(), documented.end(),
                                    [&](const KeyRow& other) { return other.name == row.name; });
    if (match == documented.end()) continue;  // reported above
    EXPECT_EQ(match->type, row.type) << row.name << ": type in docs/configuration.md vs --help";
    EXPECT_EQ(match->default_value, row.default_value)
        << row.name << ": default in docs/configuration.md vs --help";
    EXPECT_EQ(match->range, row.range) << row.name << ": range in docs/configuration.md vs --help";
    EXPECT_EQ(match->meaning, row.meaning)
        << row.name << ": meaning in docs/configuration.md vs --help";
  }
  EXPECT_EQ(documented_text, help_text())
      << "docs/configuration.md's block is not --help" << remedy;
}

// Every numeric range --help prints is the one validate() enforces: a value just outside
// it stops the program with one line naming the file, the key, the value and the range.
TEST(Config, EveryRangeInTheHelpIsEnforced) {
  int numeric_ranges = 0;
  for (const KeyRow& row : parse_key_table(help_text())) {
    SCOPED_TRACE(row.name + " " + row.range);
    std::string outside, got;
    const std::string at_least = "≥ ";
    if (row.range.rfind(at_least, 0) == 0 || row.range.rfind("0 or " + at_least, 0) == 0) {
      const size_t number = row.range.find(at_least) + at_least.size();
      const long long minimum = std::stoll(row.range.substr(number));
      outside = got = std::to_string(minimum - 1);
    } else if (row.range.rfind("> ", 0) == 0) {
      outside = got = row.range.substr(2);
    } else if (row.range == "[0, 1)") {
      outside = got = "1";
    } else {
      continue;  // no range, a set of values, or "not empty" (a file's business)
    }
    ++numeric_ranges;
    expect_error([&] { load_config(kTinyIni, {row.name + "=" + outside}); },
                 {"tiny.ini: " + row.name + ": must be ", row.range, "got " + got});
  }
  EXPECT_GE(numeric_ranges, 30);
}

// ---- mistakes in the file ----

TEST_F(ConfigFiles, UnknownKeyNamesKeyAndFile) {
  const std::string path = write_ini("unknown_key.ini", "[model]\nlayers = 2\nfoo = 1\n");
  expect_error([&] { load_config(path); }, {"unknown_key.ini:3: unknown key 'model.foo'"});
}

// Every unknown key of a file is said at once, each with its line and what was most likely
// meant (a user with three typos learnt of one a run, and of no line); so are a command
// line's unknown options; a checkpoint's stored configuration names no lines.
TEST_F(ConfigFiles, EveryUnknownKeyIsSaidAtOnceWithItsLine) {
  const std::string path =
      write_ini("typos.ini",
                "[model]\nlayers = 2\nd_modle = 64\n# a comment\n\n[train]\n"
                "warmup_step = 10\n  foo = 1 # trailing\n[model]\nd_modle = 32\n");
  expect_error(
      [&] { load_config(path); },
      {"typos.ini: 4 unknown keys: line 3 'model.d_modle' (did you mean model.d_model?); "
       "line 7 'train.warmup_step' (did you mean train.warmup_steps?); line 8 'train.foo' "
       "(transformer_hpc --help lists the keys of [train]); line 10 'model.d_modle' (did you "
       "mean model.d_model?)"});
  // A section whose name ends in '.' names its keys without a second one (Boost's rule).
  const std::string dotted = write_ini("dotted.ini", "[model.]\nfoo = 1\nbar = 2\n");
  expect_error([&] { load_config(dotted); },
               {"dotted.ini: 2 unknown keys: line 2 'model.foo'", "; line 3 'model.bar'"});
  // A known key's value is not looked at before the unknown keys are said.
  expect_error([&] { load_config_text("[model]\nlayerz = 2\nheads = x\nqq = 1\n", "stored"); },
               {"stored: 2 unknown keys: 'model.layerz' (did you mean model.layers?); "
                "'model.qq' (transformer_hpc --help lists the keys of [model])"});
  expect_error([&] { load_config_text("[model]\nlayerz = 2\n", "stored"); },
               {"stored: unknown key 'model.layerz' (did you mean model.layers?)"});
  Config config;
  expect_error(
      [&] {
        run_command_line({"transformer_hpc", kTinyIni, "--train.max_stepz=3", "--model.layers=2",
                          "--foo=2"},
                         config);
      },
      {"tiny.ini: 2 unknown command-line options: '--train.max_stepz=3' (did you mean "
       "train.max_steps?); '--foo=2' (see --help)"});
}

TEST_F(ConfigFiles, UnknownSectionNamesKeyAndFile) {
  const std::string path = write_ini("unknown_section.ini", "[optimizer]\nlr = 1\n");
  expect_error([&] { load_config(path); },
               {"unknown_section.ini", "optimizer.lr", "no such section"});
}

TEST_F(ConfigFiles, KeyOutsideAnySectionIsUnknown) {
  const std::string path = write_ini("no_section.ini", "layers = 2\n");
  expect_error([&] { load_config(path); }, {"no_section.ini", "unknown key 'layers'"});
}

TEST_F(ConfigFiles, WrongTypesNameKeyAndFile) {
  const std::vector<std::pair<std::string, std::vector<std::string>>> cases = {
      {"[model]\nheads = abc\n", {"model.heads: 'abc' is not an integer"}},
      {"[model]\nheads = 2.5\n", {"model.heads: '2.5' is not an integer"}},
      // Past the type: said with the key's own range on that side, or without one the
      // type's ("must be ≥ 1, got '99999999999'" was said of a number that is).
      {"[model]\nheads = 99999999999\n",
       {"model.heads: '99999999999' is beyond the largest whole number the key holds "
        "(2147483647)"}},
      {"[model]\nheads = -99999999999\n", {"model.heads: must be ≥ 1, got '-99999999999'"}},
      {"[train]\nshort_attention_max_len = 99999999999\n",
       {"train.short_attention_max_len: must be in [0, 128], got '99999999999'"}},
      {"[train]\nseed = 99999999999999999999\n",
       {"train.seed: '99999999999999999999' is beyond the largest whole number the key holds "
        "(18446744073709551615)"}},
      {"[model]\nheads =\n", {"model.heads: '' is not an integer"}},
      {"[model]\ndropout = high\n", {"model.dropout: 'high' is not a number"}},
      {"[model]\ndropout = nan\n", {"model.dropout", "not a finite number"}},
      {"[model]\ndropout = 1e-50\n",
       {"model.dropout: '1e-50' is too close to 0 for a float (give 0)"}},
      {"[model]\ndropout = 1e50\n", {"model.dropout: '1e50' is out of the range of a float"}},
      {"[model]\nattention_bias = yes\n", {"model.attention_bias: 'yes' is not a boolean"}},
      {"[train]\nseed = -1\n", {"train.seed: '-1' is not a non-negative integer"}},
      {"[train]\nmax_steps = ten\n", {"train.max_steps: 'ten' is not an integer"}},
  };
  for (const auto& [text, fragments] : cases) {
    SCOPED_TRACE(text);
    const std::string path = write_ini("wrong_type.ini", text);
    std::vector<std::string> expected = fragments;
    expected.push_back("wrong_type.ini: ");
    expect_error([&] { load_config(path); }, expected);
  }
}

// Every key's bad value is said at once, in the table's order, the command line's marked
// (a user with two learnt of one a run); a constraint between keys is judged only once
// every value reads.
TEST_F(ConfigFiles, EveryBadValueIsSaidAtOnce) {
  const std::string path = write_ini("bad_values.ini",
                                     "[model]\nheads = abc\ndropout = high\n[train]\n"
                                     "max_steps = ten\n");
  expect_error([&] { load_config(path, {"train.seed=-1"}); },
               {"bad_values.ini: 4 bad values: model.heads: 'abc' is not an integer; "
                "model.dropout: 'high' is not a number; train.seed: '-1' is not a "
                "non-negative integer (on the command line); train.max_steps: 'ten' is not "
                "an integer"});
  // One alone is said as before.
  expect_error([&] { load_config(path, {"model.heads=4", "model.dropout=0.1"}); },
               {"bad_values.ini: train.max_steps: 'ten' is not an integer"});
}

TEST_F(ConfigFiles, RepeatedKeyNamesKeyAndFile) {
  const std::string path = write_ini("repeated.ini", "[model]\nlayers = 2\nlayers = 3\n");
  expect_error([&] { load_config(path); },
               {"repeated.ini: model.layers: given more than once (lines 2 and 3); keep the "
                "one you mean"});
  // In two sections of the same name, three times (a helper's walk: no line was said).
  const std::string sections = write_ini(
      "sections.ini", "[model]\nd_model = 64\n[train]\nseed = 2\n[model]\nd_model = 32\n"
                      "d_model = 16\n");
  expect_error([&] { load_config(sections); },
               {"sections.ini: model.d_model: given more than once (lines 2, 6 and 7)"});
}

TEST_F(ConfigFiles, InvalidLineNamesFile) {
  const std::string path = write_ini("bad_line.ini", "[model]\nlayers 2\n");
  expect_error([&] { load_config(path); }, {"bad_line.ini:2: invalid line 'layers 2'"});
  // A section's header left open, or with words after it, named by its line too (Boost's
  // refusal named none); one closed, with a comment after it, is a header.
  for (const auto& [text, said] :
       std::vector<std::pair<std::string, std::string>>{
           {"[model]\nlayers = 2\n[train\n", "bad_line.ini:3: invalid line '[train'"},
           {"[model] x\nlayers = 2\n", "bad_line.ini:1: invalid line '[model] x'"},
           {"[model # ]\nlayers = 2\n", "bad_line.ini:1: invalid line '[model # ]'"}}) {
    SCOPED_TRACE(text);
    // A copy: C++17 lets no lambda capture a structured binding (clang refuses).
    const std::string written = text;
    expect_error([&] { load_config(write_ini("bad_line.ini", written)); }, {said, "'[name]'"});
  }
  EXPECT_EQ(load_config(write_ini("good.ini", "[model]  # the model\nlayers = 2\n")).model.layers,
            2);
  // Spaces inside the brackets named a section " model ", each of its keys then refused
  // as unknown (' model .layers'): the header is refused, with the way to write it.
  for (const char* header : {"[ model ]", "[model ]", "[\tmodel]"}) {
    SCOPED_TRACE(header);
    expect_error(
        [&] { load_config(write_ini("spaced.ini", std::string(header) + "\nlayers = 2\n")); },
        {"spaced.ini:1: the section '" + std::string(header) + "' has spaces inside its "
         "brackets: write '[model]'"});
  }
  expect_error([&] { load_config(write_ini("spaced.ini", "[ ]\nlayers = 2\n")); },
               {"spaced.ini:1: the section '[ ]' has no name"});
  // '[]' and a line with no key before its '=' were refused as unknown keys ('.layers',
  // 'model.'), naming no line (a helper's bad-input walk).
  expect_error([&] { load_config(write_ini("spaced.ini", "[]\nlayers = 2\n")); },
               {"spaced.ini:1: the section '[]' has no name"});
  expect_error([&] { load_config(write_ini("bad_line.ini", "[model]\n  = 2\n")); },
               {"bad_line.ini:2: invalid line '= 2' (no key before '=': expected 'key = "
                "value')"});
  expect_error([&] { load_config(write_ini("spaced.ini", "[model] ]\nlayers = 2\n")); },
               {"spaced.ini:1: invalid line", "its name without brackets"});
}

// A line starting with ';' is a comment, as most ini readers (and the job scripts' own)
// take it, and so is a ';' after a section's ']': both were refused as invalid lines.
TEST_F(ConfigFiles, ASemicolonLineIsAComment) {
  const std::string path = write_ini(
      "semicolon.ini", "; my experiment\r\n[model] ; the model\n  ; layers = 9\nlayers = 2\n");
  EXPECT_EQ(load_config(path).model.layers, 2);
}

// Characters that show as a space or as nothing are named, not shown: a no-break space
// pasted from a web page looked like the space the message had trimmed.
TEST_F(ConfigFiles, AnInvisibleCharacterInAKeyOrValueIsNamed) {
  const std::string key = write_ini("no_break_key.ini", "[model]\nlayers\xC2\xA0= 2\n");
  expect_error([&] { load_config(key); }, {"unknown key 'model.layers\\u00a0'"});
  const std::string value = write_ini("no_break_value.ini", "[model]\nlayers = 2\xC2\xA0\n");
  expect_error([&] { load_config(value); }, {"model.layers: '2\\u00a0' is not an integer"});
  EXPECT_EQ(quoted("a\xEF\xBB\xBF[train]\xE2\x80\x8B"), "'a\\ufeff[train]\\u200b'");
}

// In a file, the advice is the command line's double quotes (no shell reads the file).
TEST_F(ConfigFiles, APathInShellSyntaxNamesTheFile) {
  const std::string path =
      write_ini("env_path.ini", "[model]\nlayers = 2\n[data]\ndir = $THPC_UNSET_NAME/d\n");
  expect_error([&] { load_config(path); },
               {"env_path.ini: data.dir: '$THPC_UNSET_NAME/d' names the environment variable",
                "or give the key on the command line in double quotes"});
}

TEST_F(ConfigFiles, BadValueInFileNamesKeyAndFile) {
  const std::string path = write_ini("bad_value.ini", "[train]\nwarmup_steps = 0\n");
  expect_error([&] { load_config(path); },
               {"bad_value.ini: train.warmup_steps: must be ≥ 1, got 0"});
}

TEST_F(ConfigFiles, NegativeClipNormIsRefused) {
  const std::string path = write_ini("clip.ini", "[train]\nclip_norm = -1\n");
  expect_error([&] { load_config(path); },
               {"clip.ini: train.clip_norm: must be ≥ 0, got -1"});
  EXPECT_EQ(load_config(kTinyIni).train.clip_norm, 0.0f);  // off unless asked for
}

TEST_F(ConfigFiles, ALeadingByteOrderMarkIsSkipped) {
  const std::string path = write_ini("bom.ini", "\xEF\xBB\xBF[model]\nlayers = 2\n");
  EXPECT_EQ(load_config(path).model.layers, 2);
}

TEST_F(ConfigFiles, AConfigWithoutKeysIsRefused) {
  for (const std::string& text : {std::string(), std::string("# only a comment\n[model]\n")}) {
    const std::string path = write_ini("no_keys.ini", text);
    expect_error([&] { load_config(path); }, {"no_keys.ini: holds no keys at all"});
  }
}

// Values from a binary or huge file come back escaped and cut, on one short line.
TEST_F(ConfigFiles, ValuesInErrorsAreEscapedAndCut) {
  const std::string binary = write_ini("binary.ini", std::string("[model]\nlayers = ") + "\x01\xff\x7f" + "\n");
  expect_error([&] { load_config(binary); }, {"model.layers: '\\x01\\xff\\x7f' is not an integer"});
  const std::string huge = write_ini("huge.ini", "[model]\nlayers = " + std::string(100000, 'z') + "\n");
  const std::string message = expect_error(
      [&] { load_config(huge); },
      {"'" + std::string(80, 'z') + "\u2026' (100000 bytes) is not an integer"});
  EXPECT_LT(message.size(), 250u) << message;
  // A text key's value, which no check of its own cuts, is refused for its length (before:
  // a checkpoint.dir of 100,000 bytes came back twice in a 200 KB line).
  const std::string long_path = write_ini(
      "long_path.ini", "[checkpoint]\ndir = " + std::string(100000, 'z') + "\n");
  const std::string path_message = expect_error(
      [&] { load_config(long_path); },
      {"checkpoint.dir: '" + std::string(80, 'z') + "\u2026' (100000 bytes) is longer than "
       "any value of a text key (4096 bytes, the longest path)"});
  EXPECT_LT(path_message.size(), 250u) << path_message;
  // UTF-8 stays readable.
  EXPECT_EQ(quoted("Gr\xC3\xBC\xC3\x9F" "e"), "'Gr\xC3\xBC\xC3\x9F" "e'");
  EXPECT_EQ(quoted("\xC3(x"), "'\\xc3(x'");
}

TEST(Config, MissingFileIsNamed) {
  // With why (before: nothing after the name).
  expect_error([] { load_config("no/such/file.ini"); },
               {"cannot open config file 'no/such/file.ini': no such file"});
  Config config;
  expect_error([&] { run_command_line({"transformer_hpc", "missing.ini"}, config); },
               {"cannot open config file 'missing.ini': no such file"});
}

// A checkpoint, a data shard or another binary file given as the config is named so
// (before: "a '#' inside the value of '\x00\x00...'", the file read as lines of text).
TEST(Config, ABinaryFileIsNotAConfig) {
  const std::string dir = testing::TempDir() + "thpc_binary_config_" + std::to_string(getpid());
  std::filesystem::create_directories(dir);
  const auto file = [&](const std::string& name, const std::string& bytes) {
    std::ofstream(dir + "/" + name, std::ios::binary) << bytes;
    return dir + "/" + name;
  };
  const std::string zeros(600, '\0');
  const std::string hdf5("\x89HDF\r\n\x1a\n", 8);
  // (a checkpoint's header, 512 bytes, before HDF5's signature, a shard's at byte 0)
  const std::string header = "thpc-checkpoint-file 1\n" + std::string(512 - 23, '\0');
  for (const auto& [path, what] : std::vector<std::pair<std::string, std::string>>{
           // (as large as a real one: the size's refusal comes after)
           {file("step.h5", header + hdf5 + std::string(2 << 20, '\0')),
            "an HDF5 file (a checkpoint or a data shard?)"},
           {file("train.h5", hdf5 + zeros), "an HDF5 file (a checkpoint or a data shard?)"},
           {file("bytes.bin", "[model]\nlayers = 2" + zeros), "a binary file"}}) {
    const std::string config_path = path;  // no lambda captures a structured binding (C++17)
    expect_error([&] { load_config(config_path); },
                 {"config file '" + path + "' is not text but " + what + ": give the ini file"});
  }
  std::filesystem::remove_all(dir);
}

TEST(Config, DirectoryIsNotAConfigFile) {
  expect_error([] { load_config(kInputDir); }, {"cannot open config file", "directory"});
}

// /dev/zero as the config file was read until the kernel killed the process at 22 GB
// (issue 54): a config is read up to 1 MiB.
TEST(Config, AConfigFileIsReadUpToOneMegabyte) {
  expect_error([] { load_config("/dev/zero"); },
               {"config file '/dev/zero' is not text but a binary file"});
  const std::string big = testing::TempDir() + "thpc_big_config_" + std::to_string(getpid());
  std::ofstream(big) << std::string(2 << 20, '#');
  expect_error([&] { load_config(big); },
               {"config file '" + big + "' is larger than 1 MiB", "is it the right file?"});
  std::filesystem::remove(big);
}

// ---- mistakes on the command line ----

TEST(Config, NoFileGiven) {
  Config config;
  expect_error([&] { run_command_line({"transformer_hpc"}, config); }, {"no config file given"});
  expect_error([&] { run_command_line({"transformer_hpc", "--model.layers=2"}, config); },
               {"no config file given"});
}

TEST(Config, TwoFilesGiven) {
  Config config;
  expect_error([&] { run_command_line({"transformer_hpc", kTinyIni, kBaseIni}, config); },
               {"more than one config file"});
  // A value typed after a space ("--train.max_steps= 5") reads as a second file: said
  // (before: "more than one config file given: '...tiny.ini' and '5'" alone).
  expect_error(
      [&] {
        run_command_line({"transformer_hpc", kTinyIni, "--train.max_steps=", "5"}, config);
      },
      {"and '5' (a space after '--train.max_steps='? that key got an empty value: write "
       "--train.max_steps=5)"});
}

// A relation between keys broken by a command-line value says so by the key (before: the
// file alone was named, "tiny.ini: checkpoint.keep_best_count: ...", a key it did not
// hold); one the file breaks is the file's alone.
TEST(Config, HeadsNotDividingDModelOnTheCommandLine) {
  expect_error([] { load_config_text("[checkpoint]\nkeep_best_count = 3\n", "run.ini"); },
               {"run.ini: checkpoint.keep_best_count: ranks checkpoints by the "
                "checkpoint.keep_best metric"});
  Config config;
  expect_error([&] { run_command_line({"transformer_hpc", kTinyIni, "--model.heads=3"}, config); },
               {"tiny.ini", "model.heads (on the command line): d_model 64 is not divisible by "
                            "heads 3"});
  // A rule between a file's key and one the command line changed names the latter too
  // (before: the file's key alone, which the user had not touched).
  const std::string ini =
      testing::TempDir() + "thpc_keep_best_" + std::to_string(getpid()) + ".ini";
  std::ofstream(ini) << "[train]\nvalid_every = 10\nvalid_bleu = true\n[data]\ndir = d\n"
                        "[checkpoint]\nkeep_best = bleu\nkeep_best_count = 2\n";
  expect_error([&] { load_config(ini, {"train.valid_bleu=false"}); },
               {ini + ": checkpoint.keep_best: bleu needs train.valid_bleu = true "
                      "(train.valid_bleu on the command line)"});
  expect_error([&] { load_config(ini, {"checkpoint.keep_best=none"}); },
               {ini + ": checkpoint.keep_best_count: ranks checkpoints by the "
                      "checkpoint.keep_best metric: set checkpoint.keep_best = ppl, bleu, "
                      "chrf or f1 (checkpoint.keep_best on the command line)"});
  // A key the problem names only as the start of another (keep_best in keep_best_count)
  // is not taken for it.
  const std::string message = expect_error(
      [&] { load_config(ini, {"checkpoint.keep_best=ppl", "checkpoint.average_best=3"}); },
      {"checkpoint.average_best (on the command line): 3 exceeds checkpoint.keep_best_count "
       "2 (the run keeps only that many best checkpoints)"});
  EXPECT_EQ(message.find("keep_best on the command line"), std::string::npos) << message;
  std::filesystem::remove(ini);
}

// A range error of a command-line value was blamed on the file ("tiny.ini:
// train.max_steps: must be ≥ 1, got -5"), which says nothing of the kind.
TEST(Config, OutOfRangeOnTheCommandLineSaysSo) {
  Config config;
  expect_error(
      [&] { run_command_line({"transformer_hpc", kTinyIni, "--train.max_steps=-5"}, config); },
      {"train.max_steps: must be ≥ 1, got -5 (on the command line)"});
}

// A path in shell syntax reaches no shell from a config file or after --key=: "dir =
// ~/runs/x" trained into ./~/runs/x. Refused, saying the path meant; a checkpoint's stored
// configuration (written before the check) still reads.
TEST(Config, APathInShellSyntaxIsRefusedSayingThePathMeant) {
  const char* home = std::getenv("HOME");
  const std::string home_before = home != nullptr ? home : "";
  setenv("THPC_TEST_SCRATCH", "/scratch/u", 1);
  setenv("HOME", "/home/u", 1);
  expect_error([&] { load_config(kTinyIni, {"checkpoint.dir=~/runs/x"}); },
               {"checkpoint.dir: '~/runs/x' begins with '~'", "'/home/u/runs/x' here",
                "(on the command line)"});
  expect_error([&] { load_config(kTinyIni, {"data.dir=~bob/d"}); },
               {"a directory '~bob' in the working directory"});
  expect_error([&] { load_config(kTinyIni, {"checkpoint.init=${THPC_TEST_SCRATCH}/a.h5"}); },
               {"checkpoint.init: '${THPC_TEST_SCRATCH}/a.h5' names the environment variable "
                "$THPC_TEST_SCRATCH", "'/scratch/u/a.h5' here", "double quotes, not single"});
  expect_error([&] { load_config(kTinyIni, {"train.metrics_dir=$THPC_UNSET_NAME/m"}); },
               {"($THPC_UNSET_NAME is not set here)"});
  expect_error([&] { load_config(kTinyIni, {"checkpoint.resume=\"step_00000002.h5\""}); },
               {"checkpoint.resume: '\"step_00000002.h5\"' is in quotes"});
  // Not shell syntax: a '$' before no name, a '~' inside, a path key left empty.
  EXPECT_EQ(load_config(kTinyIni, {"checkpoint.dir=runs/$5/a~b"}).checkpoint.dir,
            "runs/$5/a~b");
  EXPECT_EQ(load_config(kTinyIni, {"data.dir="}).data.dir, "");
  EXPECT_EQ(load_config_text("[checkpoint]\ndir = ~/old\n", "stored").checkpoint.dir, "~/old");
  if (home != nullptr) setenv("HOME", home_before.c_str(), 1);
}

TEST(Config, WrongTypeOnTheCommandLine) {
  Config config;
  expect_error(
      [&] { run_command_line({"transformer_hpc", kTinyIni, "--train.max_steps=ten"}, config); },
      {"tiny.ini", "train.max_steps: 'ten' is not an integer", "command line"});
  expect_error([&] { load_config(kTinyIni, {"model.attention_bias=maybe"}); },
               {"tiny.ini", "model.attention_bias", "not a boolean"});
}

TEST(Config, UnknownCommandLineOption) {
  Config config;
  expect_error([&] { run_command_line({"transformer_hpc", kTinyIni, "--model.foo=1"}, config); },
               {"tiny.ini", "unknown command-line option '--model.foo=1'"});
  expect_error(
      [&] { run_command_line({"transformer_hpc", kTinyIni, "--optimizer.lr=1"}, config); },
      {"tiny.ini", "optimizer.lr", "no such section"});
  expect_error([&] { load_config(kTinyIni, {"optimizer.lr=1"}); },
               {"tiny.ini", "optimizer.lr", "no such section"});
  // No guessing: a prefix of a key is not that key.
  expect_error([&] { load_config(kTinyIni, {"model.head=4"}); }, {"tiny.ini", "model.head"});
}

// An unknown key says what was most likely meant: a key a typo or two away, the same key
// in another section, or the key doing what another toolkit's name does (a fairseq
// user's --train.lr was "unknown" with nothing more; a helper's trial). Far from every
// key, it says where the keys are listed.
TEST(Config, AnUnknownKeySaysTheKeyMostLikelyMeant) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"train.warmup_step", " (did you mean train.warmup_steps?)"},
      {"model.layer", " (did you mean model.layers?)"},
      {"model.d_f", " (did you mean model.d_ff, model.d_k or model.d_v?)"},
      {"train.dropout", " (did you mean model.dropout?)"},
      // A key of the section written that holds the word, and the same key elsewhere:
      // the validation's beam, or transformer_decode's.
      {"train.beam", " (did you mean train.valid_beam or decode.beam?)"},
      {"beam", "; did you mean decode.beam?)"},
      {"training.max_steps", "; did you mean train.max_steps?)"},
      {"layers", "every key belongs to a section: [model] [train] [data] [dist] [checkpoint] "
                 "[decode]; did you mean model.layers?)"},
      {"train.lr", " (a name from other toolkits: here it is train.lr_scale, a factor on the "
                   "paper's schedule"},
      {"optimizer.learning_rate", "; a name from other toolkits: here it is train.lr_scale"},
      {"train.update_freq", "here it is train.accumulate, micro-batches that share "
                            "train.tokens_per_step (fairseq's --update-freq multiplies"},
      {"model.relu_dropout", "here it is model.activation_dropout (tensor2tensor's name)"},
      // fairseq's IWSLT recipe, as a user's walk wrote it.
      {"train.lr_scheduler", "the schedule is always the paper's, fairseq's inverse_sqrt"},
      {"encoder-layers", "here it is model.layers, the encoder's and the decoder's alike"},
      {"model.decoder_ffn_embed_dim", "here it is model.d_ff"},
      {"share-decoder-input-output-embed", "the data decides here: shards of one vocabulary"},
      {"eval_bleu", "here it is train.valid_bleu"},
      {"best_checkpoint_metric", "here it is checkpoint.keep_best"},
      {"model.arch", "the architecture is set key by key"},
      {"optimizer", "the optimizer is Adam"},
      {"transformer-dropout-ffn", "here it is model.activation_dropout (Marian's name)"},
      // Marian's, as a Marian user's walk typed them: --overwrite must not lead to
      // checkpoint.overwrite (which deletes another run's files), and a name Marian gives
      // a different meaning says how it differs.
      {"overwrite", "Marian's --overwrite (no model.iterN copies) is checkpoint.keep = 1 "
                    "here (the newest two stay); checkpoint.overwrite = true is another "
                    "thing: it deletes"},
      {"type", "the model is always the paper's encoder-decoder Transformer"},
      {"valid-freq", "here it is train.valid_every, in steps"},
      {"train.valid-freq", "here it is train.valid_every"},
      {"early-stopping", "here it is checkpoint.patience"},
      {"learn-rate", "here it is train.lr_scale, a factor on the paper's schedule"},
      {"lr-decay-inv-sqrt", "here it is train.warmup_steps, which is also where"},
      {"dec-depth", "here it is model.layers, the encoder's and the decoder's alike"},
      {"normalize", "not Marian's |Y|^alpha"},
      {"mini-batch-words", "here it is train.tokens_per_step: padded tokens a side"},
      {"workspace", "batches are fixed in tokens here"},
      {"exponential-smoothing", "not offered: average checkpoints instead"},
      {"tied-embeddings-all", "the data decides here: shards of one vocabulary"},
      {"save-freq", "here it is checkpoint.every_steps"},
      {"devices", "one GPU per MPI rank here"},
      // fairseq's spelling, with '-'; and its name where its section is not the key's
      // ([decode] has no step to size: fairseq-generate's --max-tokens is a batch).
      {"train.max-tokens", "here it is train.tokens_per_step"},
      {"decode.max_tokens", " (transformer_hpc --help lists the keys of [decode])"},
      {"model.foo", " (transformer_hpc --help lists the keys of [model])"},
      {"model.qq", " (transformer_hpc --help lists the keys of [model])"},
  };
  for (const auto& [name, hint] : cases) {
    EXPECT_NE(unknown_key_hint(name).find(hint), std::string::npos)
        << name << ": " << unknown_key_hint(name);
  }
  // In a file as on the command line, and an option without a section (fairseq's --lr).
  expect_error([&] { load_config(kTinyIni, {"train.warmup_step=10"}); },
               {"tiny.ini", "'--train.warmup_step=10' (did you mean train.warmup_steps?)"});
  expect_error([&] { load_config(kTinyIni, {"lr=0.5"}); },
               {"tiny.ini", "'--lr=0.5' (a name from other toolkits: here it is train.lr_scale"});
  expect_error([&] { load_config(kTinyIni, {"bogus=1"}); }, {"'--bogus=1' (see --help)"});
}

TEST(Config, OptionWithoutValue) {
  expect_error([&] { load_config(kTinyIni, {"model.heads"}); },
               {"tiny.ini", "model.heads", "missing value"});
  Config config;
  expect_error([&] { run_command_line({"transformer_hpc", kTinyIni, "--model.heads"}, config); },
               {"tiny.ini", "model.heads", "missing value"});
}

// Boost would take the next option as the value: `--model.layers --dry-run`.
TEST(Config, TheNextOptionIsNotAValue) {
  Config config;
  expect_error(
      [&] { run_command_line({"transformer_hpc", kTinyIni, "--model.layers", "--dry-run"}, config); },
      {"tiny.ini", "model.layers: missing value on the command line",
       "'--dry-run' was taken for it", "--model.layers=VALUE"});
}

TEST(Config, OptionGivenTwiceOnTheCommandLine) {
  expect_error([&] { load_config(kTinyIni, {"model.layers=2", "model.layers=3"}); },
               {"tiny.ini", "model.layers", "more than once"});
}

// ---- validate(): every range and relation, each naming its key and the file ----

TEST(Config, BadValuesNameKeyAndFile) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"model.layers=0"}, "model.layers: must be ≥ 1, got 0"},
      {{"model.d_model=0"}, "model.d_model"},
      {{"model.d_model=1"}, "model.d_model: must be ≥ 2, got 1"},
      {{"model.heads=0"}, "model.heads"},
      {{"model.heads=3"}, "model.heads (on the command line): d_model 64 is not divisible by "
                          "heads 3"},
      {{"model.heads=3", "model.d_k=16"}, "model.heads (on the command line): d_model 64 is not "
                                          "divisible"},
      {{"model.d_k=-1"}, "model.d_k"},
      {{"model.d_v=-1"}, "model.d_v"},
      {{"model.d_ff=0"}, "model.d_ff"},
      {{"model.dropout=-0.1"}, "model.dropout: must be in [0, 1), got -0.1"},
      {{"model.dropout=1.0"}, "model.dropout: must be in [0, 1), got 1"},
      // Written with more digits than a float holds: the text written is said beside the
      // float it became (a helper's finding: "got 1" for 0.99999999).
      {{"model.dropout=0.99999999"},
       "model.dropout: must be in [0, 1), got 1 (the float nearest '0.99999999': float keys "
       "hold about 7 significant digits)"},
      {{"model.attention_dropout=1"}, "model.attention_dropout"},
      {{"model.attention_dropout=-0.5"}, "model.attention_dropout"},
      {{"model.activation_dropout=1"}, "model.activation_dropout: must be in [0, 1), got 1"},
      {{"model.label_smoothing=1"}, "model.label_smoothing"},
      {{"model.label_smoothing=-0.1"}, "model.label_smoothing"},
      {{"model.positions=absolute"},
       "model.positions: 'absolute' is not one of sinusoidal, learned"},
      {{"model.max_positions=0"}, "model.max_positions"},
      {{"model.vocab_size=-1"}, "model.vocab_size"},
      {{"model.vocab_size=3"}, "model.vocab_size: must be 0 or ≥ 5, got 3"},
      {{"model.layernorm_eps=0"}, "model.layernorm_eps: must be in (0, 1), got 0"},
      {{"train.backend=gpu"}, "train.backend: 'gpu' is not one of auto, cuda, cpu"},
      {{"train.precision=fp16"}, "train.precision: 'fp16' is not one of bf16, fp32"},
      {{"train.max_steps=0"}, "train.max_steps"},
      {{"train.tokens_per_step=0"}, "train.tokens_per_step"},
      {{"train.accumulate=0"}, "train.accumulate"},
      {{"train.warmup_steps=0"}, "train.warmup_steps: must be ≥ 1, got 0"},
      {{"train.lr_scale=0"}, "train.lr_scale"},
      {{"train.lr_scale=-1"}, "train.lr_scale"},
      {{"train.adam_beta1=1"}, "train.adam_beta1"},
      {{"train.adam_beta2=-0.1"}, "train.adam_beta2"},
      {{"train.adam_eps=0"}, "train.adam_eps"},
      {{"train.log_every=0"}, "train.log_every"},
      {{"train.threads=-1"}, "train.threads"},
      {{"dist.bucket_mb=0"}, "dist.bucket_mb"},
      {{"dist.bucket_mb=3e-6"}, "dist.bucket_mb: must be ≥ 0.001, got 3e-06"},
      {{"dist.timeout_s=0"}, "dist.timeout_s"},
      {{"dist.timeout_s=0.5"}, "dist.timeout_s: must be ≥ 1, got 0.5"},
      {{"model.layernorm_eps=1e30"}, "model.layernorm_eps"},
      {{"dist.device=-2"}, "dist.device"},
      {{"data.synthetic=shuffle"}, "data.synthetic: 'shuffle' is not one of reverse, copy, sort"},
      {{"data.synthetic_vocab=4"}, "data.synthetic_vocab: must be ≥ 5, got 4"},
      {{"data.synthetic_min_len=0"}, "data.synthetic_min_len"},
      {{"data.synthetic_min_len=13"}, "data.synthetic_max_len"},
      // A side is its sentence and one token (the shards' limit alike): 63 fits 64, 12 fits 13.
      {{"data.synthetic_max_len=64"}, "data.synthetic_max_len (on the command line): 64 + 1 "
                                      "(eos, or bos) exceeds"},
      {{"model.max_positions=12"}, "data.synthetic_max_len"},
      {{"checkpoint.minutes=-1"}, "checkpoint.minutes: must be ≥ 0, got -1"},
      {{"checkpoint.every_steps=-1"}, "checkpoint.every_steps"},
      {{"checkpoint.keep=0"}, "checkpoint.keep: must be ≥ 1, got 0"},
      {{"checkpoint.average_last=-1"}, "checkpoint.average_last"},
      {{"checkpoint.average_last=6"}, "checkpoint.average_last (on the command line): 6 exceeds "
                                      "checkpoint.keep 5"},
      {{"decode.beam=0"}, "decode.beam: must be ≥ 1, got 0"},
      {{"decode.alpha=-0.5"}, "decode.alpha: must be ≥ 0, got -0.5"},
      {{"decode.max_len_b=-1"}, "decode.max_len_b: must be ≥ 0, got -1"},
      {{"decode.tree_leaves=tags"}, "decode.tree_leaves: 'tags' is not one of XX, words"},
      {{"train.valid_every=-1", "data.dir=d"}, "train.valid_every: must be ≥ 0"},
      {{"train.valid_every=10"}, "train.valid_every (on the command line): validation reads "
                                 "shards: set data.dir"},
      {{"train.max_epochs=-1", "data.dir=d"}, "train.max_epochs: must be ≥ 0"},
      {{"train.max_epochs=2"},
       "train.max_epochs (on the command line): counts passes over shards: set data.dir (the "
       "synthetic task has no epochs)"},
      {{"data.memory_mb=0"}, "data.memory_mb: must be ≥ 1, got 0"},
      {{"train.valid_beam=0"}, "train.valid_beam: must be ≥ 1, got 0"},
      {{"train.valid_bleu=true"}, "train.valid_bleu (on the command line): translates at each "
                                  "validation: set train.valid_every > 0"},
      {{"train.valid_bleu_tokenize=ja-mecab"},
       "train.valid_bleu_tokenize: 'ja-mecab' is not one of"},
      {{"checkpoint.keep_best=loss"},
       "checkpoint.keep_best: 'loss' is not one of none, ppl, bleu, chrf"},
      {{"train.valid_metric=ter"}, "train.valid_metric: 'ter' is not one of bleu, chrf"},
      {{"checkpoint.keep_best=ppl"}, "checkpoint.keep_best (on the command line): ppl compares "
                                     "validations: set train.valid_every > 0"},
      {{"checkpoint.keep_best=bleu", "train.valid_every=10", "data.dir=d"},
       "checkpoint.keep_best (on the command line): bleu needs train.valid_bleu = true"},
      {{"checkpoint.keep_best=chrf", "train.valid_metric=chrf", "train.valid_every=10",
        "data.dir=d"},
       "checkpoint.keep_best (on the command line): chrf needs train.valid_bleu = true"},
      {{"checkpoint.keep_best=chrf", "train.valid_bleu=true", "train.valid_every=10",
        "data.dir=d"},
       "checkpoint.keep_best (on the command line): chrf needs train.valid_metric = chrf (the "
       "validations score bleu)"},
      {{"checkpoint.keep_best=bleu", "train.valid_metric=chrf", "train.valid_bleu=true",
        "train.valid_every=10", "data.dir=d"},
       "checkpoint.keep_best (on the command line): bleu needs train.valid_metric = bleu (the "
       "validations score chrf)"},
      {{"checkpoint.patience=-1"}, "checkpoint.patience: must be ≥ 0, got -1"},
      {{"checkpoint.patience=2"}, "checkpoint.patience (on the command line): counts "
                                  "validations without a better checkpoint.keep_best metric"},
      {{"checkpoint.keep_best_count=-1"}, "checkpoint.keep_best_count: must be ≥ 0, got -1"},
      {{"checkpoint.keep_best_count=3"},
       "checkpoint.keep_best_count (on the command line): ranks checkpoints by the "
       "checkpoint.keep_best metric: set checkpoint.keep_best = ppl, bleu, chrf or f1"},
      {{"checkpoint.average_best=-1"}, "checkpoint.average_best: must be ≥ 0, got -1"},
      {{"checkpoint.keep_best=ppl", "train.valid_every=10", "data.dir=d",
        "checkpoint.keep_best_count=2", "checkpoint.average_best=3"},
       "checkpoint.average_best (on the command line): 3 exceeds checkpoint.keep_best_count 2 "
       "(the run keeps only that many best checkpoints)"},
  };
  for (const auto& [overrides, fragment] : cases) {
    SCOPED_TRACE(overrides.front());
    const auto& given = overrides;  // no lambda captures a structured binding (C++17)
    expect_error([&] { load_config(kTinyIni, given); }, {"tiny.ini: ", fragment});
  }
  // The boundaries themselves are legal (a mutation audit: max_positions 14 let '+ 2' for
  // '+ 1' pass; accumulate = tokens_per_step and 1,024 threads were not tried).
  EXPECT_NO_THROW(load_config(kTinyIni, {"model.dropout=0", "data.synthetic_vocab=5",
                                         "data.synthetic_min_len=12", "model.max_positions=13"}));
  EXPECT_NO_THROW(load_config(kTinyIni, {"train.tokens_per_step=4", "train.accumulate=4"}));
  EXPECT_NO_THROW(load_config(kTinyIni, {"train.threads=1024"}));
  expect_error([&] { load_config(kTinyIni, {"train.tokens_per_step=4", "train.accumulate=5"}); },
               {"tiny.ini: ", "train.accumulate (on the command line): 5 micro-batches cannot "
                              "share train.tokens_per_step 4 tokens"});
  expect_error([&] { load_config(kTinyIni, {"train.threads=1025"}); },
               {"tiny.ini: ", "train.threads (on the command line): 1025 is more than the 1024"});
  // With shards the synthetic task's lengths are ignored, as data.dir's help says (before:
  // a short model.max_positions was refused for data.synthetic_max_len).
  EXPECT_NO_THROW(load_config(kTinyIni, {"data.dir=corpus", "model.max_positions=10"}));
  EXPECT_NO_THROW(load_config(kTinyIni, {"data.dir=corpus", "data.synthetic_min_len=13"}));
}

// Empty values cannot be written on the command line, so these go through validate().
TEST(Config, ShardPrefixesMustNotBeEmpty) {
  Config config = load_config(kTinyIni, {"data.dir=corpus", "train.valid_every=10"});
  EXPECT_NO_THROW(validate(config));
  config.data.valid.clear();
  expect_error([&] { validate(config); }, {"tiny.ini: data.valid: must name"});
  config.data.train.clear();
  expect_error([&] { validate(config); }, {"tiny.ini: data.train: must name"});
}

TEST(Config, ValidateNamesTheSourceFile) {
  Config config = load_config(kTinyIni);
  config.train.warmup_steps = 0;
  expect_error([&] { validate(config); }, {"tiny.ini: train.warmup_steps"});
}

TEST_F(ConfigFiles, EmptyCheckpointDirIsRefused) {
  // The command line cannot give an empty value; a file can.
  const std::string path = write_ini("empty_dir.ini", "[checkpoint]\ndir =\n");
  expect_error([&] { load_config(path); }, {"empty_dir.ini: checkpoint.dir: must not be empty"});
}

}  // namespace
}  // namespace thpc

namespace thpc {
namespace {

TEST(ConfigText, StoredTextLoadsLikeItsFileAndNamesItsSourceInErrors) {
  const Config original = load_config(std::string(THPC_SOURCE_DIR) + "/input/base.ini");
  const Config again = load_config_text(original.to_ini(), "ckpt.h5 (stored configuration)");
  EXPECT_EQ(again.to_ini().substr(again.to_ini().find('\n')),
            original.to_ini().substr(original.to_ini().find('\n')));
  expect_error([] { load_config_text("[model]\nheads = 3\n", "ckpt.h5 (stored configuration)"); },
               {"ckpt.h5 (stored configuration): model.heads"});
}

}  // namespace
}  // namespace thpc

namespace thpc {
namespace {

// What ran a configuration heads the text a checkpoint stores, as comment lines after the
// text's own first line (and after lines added before: an average's after its run's), so
// that the versions before them, which pass over comments, read the text as before; the
// command line's settings as they would be given again.
TEST(ConfigText, HeaderLinesHeadTheTextAndAreReadBackByTheirLabel) {
  Config config = load_config_text("[train]\nlr_scale = 2\n", "first.ini");
  config.train.seed = 7;
  config.command_line_keys = {"train.seed", "checkpoint.dir"};
  config.checkpoint.dir = "runs/it's here";
  EXPECT_EQ(config.command_line_text(), "--train.seed=7 --checkpoint.dir='runs/it'\\''s here'");
  const std::string text = config.to_ini({header_line(kWrittenBy, "transformer_hpc git x"),
                                          header_line(kComputedBy, "cpu-fp32, OpenBLAS")});
  const std::string plain = config.to_ini();
  const size_t first_line = plain.find('\n') + 1;
  EXPECT_EQ(text, plain.substr(0, first_line) +
                      "# written by: transformer_hpc git x\n# computed by: cpu-fp32, OpenBLAS\n" +
                      plain.substr(first_line));
  const std::string averaged = with_header_lines(text, {header_line(kAveragedFrom, "a.h5")});
  EXPECT_NE(averaged.find("# computed by: cpu-fp32, OpenBLAS\n# averaged from: a.h5\n\n[model]"),
            std::string::npos)
      << averaged;
  EXPECT_EQ(ini_header_value(averaged, kWrittenBy), "transformer_hpc git x");
  EXPECT_EQ(ini_header_value(averaged, kAveragedFrom), "a.h5");
  EXPECT_EQ(ini_header_value(averaged, kCommandLine), "");
  EXPECT_EQ(ini_header_value(plain, kWrittenBy), "");
  // (a comment below the first section is not the head's)
  EXPECT_EQ(ini_header_value("[train]\n# written by: someone\n", kWrittenBy), "");
  EXPECT_TRUE(config_differences(averaged, plain).empty());
  EXPECT_EQ(load_config_text(averaged, "stored").train.lr_scale, 2.0);
  // An average of averages: its own line after its input's, which the label reads.
  const std::string twice = with_header_lines(averaged, {header_line(kAveragedFrom, "b.h5")});
  EXPECT_EQ(ini_header_value(twice, kAveragedFrom), "b.h5");
  // A path with a line break (a file name may hold one) stays one comment line: the text
  // stays an ini file (it was read as "invalid line", and a name could add settings).
  const std::string broken =
      with_header_lines(plain, {header_line(kAveragedFrom, "x\n[model]\nlayers = 7.h5")});
  EXPECT_EQ(ini_header_value(broken, kAveragedFrom), "x\\n[model]\\nlayers = 7.h5");
  EXPECT_EQ(load_config_text(broken, "stored").model.layers, config.model.layers);
  Config named = config;
  named.source_file = "a\nb.ini";
  EXPECT_NE(named.to_ini().find("resolved from a\\nb.ini (file and"), std::string::npos);
  EXPECT_NO_THROW(load_config_text(named.to_ini(), "stored"));
}

// A key of a closed set of values (model.norm, train.divergence, dist.reducer, ...) is
// read in the code by comparing its string: a value misspelt there ("rolback"), or one
// the table no longer holds, compiles and takes the other branch without a word (a
// helper's changeability trial). Every `.KEY == "VALUE"` or `.KEY != "VALUE"` in the
// sources, where KEY names such a key (also `.value_or(x.KEY) == "VALUE"`), and every
// comparison of a name a file binds to such a key (`const std::string& policy =
// config_.train.divergence;`, a member initialised `metric_(config.train.valid_metric)`),
// must compare with one of its values.
TEST(ConfigSources, EveryValueComparedWithAKeyOfAClosedSetIsOneOfItsValues) {
  std::map<std::string, std::set<std::string>> values_of;  // "norm" -> {"post", "pre"}
  for (const Option& option : option_table()) {
    if (option.allowed.values.empty()) continue;
    std::set<std::string>& values = values_of[option.key];
    values.insert(option.allowed.values.begin(), option.allowed.values.end());
  }
  ASSERT_GE(values_of.size(), 10u);
  const std::regex comparison(R"(\.([a-z_]+)\)?\s*[!=]=\s*"([^"\\]*)\")");
  const std::string section = R"([\w.>-]*\.(?:model|train|data|dist|checkpoint|decode)\.)";
  const std::regex binding(R"(\b([A-Za-z_]\w*)\s*(?:=\s*|\(\s*))" + section +
                           R"(([a-z_]+)\s*[;)])");
  const std::regex bound_comparison(R"(\b([A-Za-z_]\w*)\s*[!=]=\s*"([^"\\]*)\")");
  int files = 0, compared = 0, bound_compared = 0;
  for (const char* tree : {"src", "tools", "kernels"}) {
    for (const auto& entry : std::filesystem::recursive_directory_iterator(
             std::string(THPC_SOURCE_DIR) + "/" + tree)) {
      const std::string extension = entry.path().extension().string();
      if (extension != ".cc" && extension != ".h" && extension != ".cu" && extension != ".cuh") {
        continue;
      }
      ++files;
      std::ifstream in(entry.path());
      std::vector<std::string> lines;
      for (std::string line; std::getline(in, line);) lines.push_back(line);
      std::map<std::string, std::string> bound_to;  // "policy" -> "divergence"
      for (const std::string& line : lines) {
        for (auto match = std::sregex_iterator(line.begin(), line.end(), binding);
             match != std::sregex_iterator(); ++match) {
          if (values_of.count((*match)[2].str()) > 0) bound_to[(*match)[1]] = (*match)[2];
        }
      }
      for (int number = 1; number <= static_cast<int>(lines.size()); ++number) {
        const std::string& line = lines[number - 1];
        for (auto match = std::sregex_iterator(line.begin(), line.end(), bound_comparison);
             match != std::sregex_iterator(); ++match) {
          const auto key = bound_to.find((*match)[1].str());
          if (key == bound_to.end()) continue;
          ++bound_compared;
          EXPECT_EQ(values_of[key->second].count((*match)[2].str()), 1u)
              << entry.path().string() << ":" << number << ": " << key->first << " (bound to ."
              << key->second << ") compared with \"" << (*match)[2].str()
              << "\", which no key named " << key->second << " takes\n  " << line;
        }
        for (auto match = std::sregex_iterator(line.begin(), line.end(), comparison);
             match != std::sregex_iterator(); ++match) {
          const auto values = values_of.find((*match)[1].str());
          if (values == values_of.end()) continue;
          ++compared;
          EXPECT_EQ(values->second.count((*match)[2].str()), 1u)
              << entry.path().string() << ":" << number << ": ." << (*match)[1].str()
              << " compared with \"" << (*match)[2].str() << "\", which no key named "
              << (*match)[1].str() << " takes\n  " << line;
        }
      }
    }
  }
  EXPECT_GT(files, 100);
  EXPECT_GT(compared, 20) << "the comparisons are found";
  EXPECT_GT(bound_compared, 4) << "the comparisons of bound names are found";
}

}  // namespace
}  // namespace thpc
