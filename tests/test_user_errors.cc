// Every failure a user can cause reads as a user-facing message (issue 34, item 6): sizes
// that overflow or cannot be allocated are refused from the configuration before anything
// is allocated, with --dry-run as in training (exit 2, one line naming the keys), and an
// allocation that still fails says which sizes to lower instead of "check failed ... at
// file:line" or "std::bad_alloc". Before: d_model = 10^9 passed --dry-run and ended in
// "check failed: t.data != nullptr at ../kernels/cpu/cpu_backend.cc:44"; max_positions =
// 2·10^9 in "std::bad_alloc"; 10^6 layers laid out its parameter table for minutes (a
// linear search per tensor) before failing; train.threads = 100000 segfaulted in OpenMP;
// train.accumulate = 10^8 ran 10^8 one-token micro-batches a step.
#include <gtest/gtest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <new>
#include <string>
#include <vector>

#include "backend/factory.h"
#include "common/error.h"
#include "config/config.h"
#include "program.h"
#include "train/footprint.h"

namespace thpc {
namespace {

// Every run of it is refused or a dry run, so its checkpoint.dir stays empty; one per test
// process, so that a run that trained (a test checked without its fix) leaves no files
// that later runs would be refused for (the dry run too looks at the run directory).
const std::string kTrainer = thpc::binary_dir() +
                             "/transformer_hpc " THPC_SOURCE_DIR "/input/tiny.ini "
                             "--train.max_steps=1 --checkpoint.dir=/tmp/thpc_user_errors_never_"
                             "written_" + std::to_string(getpid()) + " ";

// The command must stop with exit `code` (2: the configuration) and an error line
// holding `why`, in the user's words, with --dry-run as in training.
void expect_configuration_error(const std::string& arguments, const std::string& why,
                                int code = 2) {
  for (const char* mode : {"--dry-run", ""}) {
    SCOPED_TRACE(arguments + " " + mode);
    const ProcessResult run = run_process(kTrainer + arguments + " " + mode);
    EXPECT_EQ(run.exit_code, code) << run.output;
    EXPECT_NE(run.output.find(why), std::string::npos) << run.output;
    EXPECT_EQ(run.output.find("check failed"), std::string::npos) << run.output;
    EXPECT_EQ(run.output.find("bad_alloc"), std::string::npos) << run.output;
  }
}

TEST(UserErrors, SizesThatCannotBeAllocatedAreRefusedFromTheConfiguration) {
  expect_configuration_error("--model.d_model=1000000000 --model.heads=1",
                             "the model is too large to train here: model.layers = 2, d_model = "
                             "1000000000");
  expect_configuration_error("--model.layers=1000000", "model.layers = 1000000");
  expect_configuration_error("--model.d_k=2000000000 --model.d_v=2000000000",
                             "the model is too large to train here");
  expect_configuration_error("--model.max_positions=2000000000",
                             "model.max_positions = 2000000000 rows");
}

// An empty data.dir (`--data.dir=$DATA` with DATA unset) trains the synthetic task, as
// documented; the run says so on its own line, with the key that names a corpus (before,
// a job meant for a corpus trained the toy task to exit 0 without a word).
TEST(UserErrors, AnEmptyDataDirSaysThatTheRunTrainsTheSyntheticTask) {
  const std::string directory = "/tmp/thpc_user_errors_synthetic_" + std::to_string(getpid());
  for (const char* mode : {"", "--dry-run"}) {
    SCOPED_TRACE(mode);
    const ProcessResult run = run_process(
        thpc::binary_dir() + "/transformer_hpc " THPC_SOURCE_DIR "/input/tiny.ini "
        "--train.max_steps=1 --data.dir= --checkpoint.dir=" + directory + " " + mode);
    std::filesystem::remove_all(directory);
    EXPECT_EQ(run.exit_code, 0) << run.output;
    EXPECT_NE(run.output.find("data.train: the synthetic task, as data.dir is empty: reverse "
                              "sequences of 3-12 tokens, vocabulary 32 (data.synthetic); to "
                              "train on a corpus, set data.dir to transformer_preprocess's "
                              "--destdir\n"),
              std::string::npos)
        << run.output;
  }
}

// A command-line mistake's line points at --help once (before: a message that said
// "(see --help)" itself got a second line of it), and a setting without its dashes,
// taken for a second config file, is shown how it is written.
TEST(UserErrors, CommandLineMistakesPointAtTheHelpOnceAndShowTheSpelling) {
  for (const auto& [arguments, why] : std::vector<std::pair<std::string, std::string>>{
           {"--set x", "unknown command-line option '--set' (see --help)"},
           {"model.layers=3", "and 'model.layers=3' (a setting is written --model.layers=3)"}}) {
    SCOPED_TRACE(arguments);
    const ProcessResult run = run_process(kTrainer + arguments);
    EXPECT_EQ(run.exit_code, 2) << run.output;
    EXPECT_NE(run.output.find(why), std::string::npos) << run.output;
    size_t pointers = 0;
    for (size_t at = run.output.find("see --help"); at != std::string::npos;
         at = run.output.find("see --help", at + 1)) {
      ++pointers;
    }
    EXPECT_EQ(pointers, 1u) << run.output;
    // ... on the message's own line: one line in all (before: "(see --help)" a second).
    EXPECT_EQ(std::count(run.output.begin(), run.output.end(), '\n'), 1) << run.output;
  }
}

// A config file whose name starts with '-' is an option to the parser: said how to give
// it (a helper's walk: "unknown command-line option '-x.ini'" alone).
TEST(UserErrors, AConfigFileNamedLikeAnOptionIsShownHowToBeGiven) {
  const std::string directory = "/tmp/thpc_user_errors_dash_" + std::to_string(getpid());
  std::filesystem::create_directories(directory);
  std::filesystem::copy_file(THPC_SOURCE_DIR "/input/tiny.ini", directory + "/-x.ini");
  const ProcessResult run =
      run_process("cd " + directory + " && " + thpc::binary_dir() + "/transformer_hpc -x.ini");
  const ProcessResult dotted = run_process("cd " + directory + " && " + thpc::binary_dir() +
                                           "/transformer_hpc ./-x.ini --dry-run");
  std::filesystem::remove_all(directory);
  EXPECT_EQ(run.exit_code, 2) << run.output;
  EXPECT_NE(run.output.find("unknown command-line option '-x.ini': to give the file of that "
                            "name, write ./-x.ini"),
            std::string::npos)
      << run.output;
  EXPECT_EQ(dotted.exit_code, 0) << dotted.output;
}

TEST(UserErrors, ImpossibleValuesThatPassedTheDryRunAreRefused) {
  expect_configuration_error("--train.threads=100000",
                             "train.threads (on the command line): 100000 is more than");
  expect_configuration_error("--train.tokens_per_step=100 --train.accumulate=1000",
                             "train.accumulate (on the command line): 1000 micro-batches "
                             "cannot share");
}

// A helper's trial of the configuration: values an ini file cannot hold ('#' starts a
// comment, a line break a line: "dir = runs/exp#1" gave runs/exp, and a checkpoint whose
// stored configuration held either could not be decoded), --eval taking the next option
// for its file, a named pipe as the config (held the program in open(), out of reach of
// SIGTERM), the dry run's notes breaking its ini output, and a synthetic task's
// micro-batch smaller than its longest sentence (passed; shards' are refused).
TEST(UserErrors, WhatAnIniFileCannotHoldOrReadBackIsRefused) {
  expect_configuration_error("--train.metrics_dir=#m",
                             "train.metrics_dir: '#m' holds a '#', a ' ;', a line break or a "
                             "NUL byte");
  expect_configuration_error("--train.metrics_dir='m ; scratch'",
                             "train.metrics_dir: 'm ; scratch' holds a '#', a ' ;'");
  expect_configuration_error("--train.metrics_dir=\"$(printf 'm\\n[model]\\nlayers = 9')\"",
                             "holds a '#', a ' ;', a line break or a NUL byte");
  expect_configuration_error("--train.tokens_per_step=5",
                             "train.tokens_per_step 5 (on the command line) gives each of the 1 "
                             "micro-batches on each of 1 ranks 5 tokens, less than the longest "
                             "pair of the data takes "
                             "(13 tokens a side with eos/bos); raise train.tokens_per_step to at "
                             "least 13, or give a smaller data.synthetic_max_len");
  // Where the micro-batches made the budget small, fewer of them is the other way (it was
  // told only to raise the tokens; a helper's trial): 1000 / 76 = 13 tokens fit.
  expect_configuration_error("--train.accumulate=1000",
                             "raise train.tokens_per_step to at least 13000, lower "
                             "train.accumulate to at most 76, or give a smaller "
                             "data.synthetic_max_len");
  const std::string dir = ::testing::TempDir() + "thpc_ini_" + std::to_string(::getpid());
  std::filesystem::create_directories(dir);
  {
    std::ofstream(dir + "/hash.ini") << "[model]\nlayers = 2   # a comment\n[checkpoint]\n"
                                        "dir = runs/exp#1\n";
  }
  ProcessResult run = run_process(thpc::binary_dir() + "/transformer_hpc " + dir +
                                  "/hash.ini --dry-run");
  EXPECT_EQ(run.exit_code, 2) << run.output;
  EXPECT_NE(run.output.find(dir + "/hash.ini:4: a '#' inside the value of 'dir'"),
            std::string::npos)
      << run.output;
  // A " ;" comment, as other ini readers take it, is refused too (before: part of the
  // value: checkpoints written to the folder "runs/a ; scratch"; a helper's finding).
  std::ofstream(dir + "/semicolon.ini") << "[model]\nlayers = 2   # a comment; fine\n"
                                           "[checkpoint]\ndir = runs/a ; scratch\n";
  run = run_process(thpc::binary_dir() + "/transformer_hpc " + dir + "/semicolon.ini --dry-run");
  EXPECT_EQ(run.exit_code, 2) << run.output;
  EXPECT_NE(run.output.find(dir + "/semicolon.ini:4: a ';' after a space in the value of 'dir': "
                                  "it would be part of the value, not a comment"),
            std::string::npos)
      << run.output;
  run = run_process(kTrainer + "--eval --dry-run");
  EXPECT_EQ(run.exit_code, 2) << run.output;
  EXPECT_NE(run.output.find("--eval: needs a checkpoint file, and the next argument "
                            "'--dry-run' is an option"),
            std::string::npos)
      << run.output;
  ASSERT_EQ(::mkfifo((dir + "/fifo.ini").c_str(), 0600), 0);
  run = run_process("timeout 20 " + thpc::binary_dir() + "/transformer_hpc " + dir +
                    "/fifo.ini --dry-run");
  EXPECT_EQ(run.exit_code, 2) << run.output;
  EXPECT_NE(run.output.find("it is a named pipe or socket, not a file"), std::string::npos)
      << run.output;
  // The dry run's output, notes and all, is an ini file that reads back.
  run = run_process(thpc::binary_dir() + "/transformer_hpc " THPC_SOURCE_DIR
                    "/input/tiny.ini --dry-run > " + dir + "/resolved.ini");
  ASSERT_EQ(run.exit_code, 0) << run.output;
  run = run_process(thpc::binary_dir() + "/transformer_hpc " + dir + "/resolved.ini --dry-run");
  EXPECT_EQ(run.exit_code, 0) << run.output;
  EXPECT_NE(run.output.find("# data.train: the synthetic task"), std::string::npos)
      << run.output;
  std::filesystem::remove_all(dir);
}

// What the dry run's machine cannot check is said in its output, not passed in silence: a
// login node may lack the job's data (a configured vocabulary needs none) and its GPUs.
// Comment lines: the output stays an ini file.
TEST(UserErrors, TheDryRunNotesWhatThisMachineCannotCheck) {
  ProcessResult run = run_process(kTrainer + "--data.dir=/nonexistent/data "
                                  "--model.vocab_size=32 --dry-run");
  EXPECT_EQ(run.exit_code, 0) << run.output;
  EXPECT_NE(run.output.find("# note: data.dir /nonexistent/data is no directory here: its data "
                            "was not read (training stops without it, exit 3)"),
            std::string::npos)
      << run.output;
  if (built_with_cuda() && visible_cuda_devices() == 0) {
    run = run_process(kTrainer + "--train.backend=cuda --dry-run");
    EXPECT_EQ(run.exit_code, 0) << run.output;
    EXPECT_NE(run.output.find("# note: train.backend = cuda, but here no CUDA device visible"),
              std::string::npos)
        << run.output;
  }
  run = run_process(kTrainer + "--dry-run");
  EXPECT_EQ(run.output.find("# note:"), std::string::npos) << run.output;
}

// Values that the dry run passed and training refused only later, or with the exit code of
// a crash (issue 34's second probe): the dry run now refuses them as training does, with
// training's code. A model.vocab_size other than the data's and train.backend = cuda in a
// build without CUDA were exit 1; a micro-batch smaller than the longest pair was found
// at the first batch (exit 1), a validation beam wider than the vocabulary asked for
// 26 GB at the first validation; missing validation shards, a checkpoint.init that is no
// checkpoint or of another architecture passed the dry run.
TEST(UserErrors, TheDryRunRefusesWhatTrainingRefusesWithTheSameExitCode) {
  expect_configuration_error("--model.vocab_size=10",
                             "model.vocab_size is 10 (on the command line) but the training data "
                             "has a vocabulary of 32");
  if (!built_with_cuda()) {
    expect_configuration_error("--train.backend=cuda",
                               "train.backend = cuda (on the command line), but built "
                               "without CUDA");
  }
  expect_configuration_error("--train.backend=cpu --dist.reducer=nccl",
                             "dist.reducer = nccl (on the command line) sums on GPUs, and this "
                             "run trains on the CPU");
  // train.weight_decay's GPU kernel has not yet run on a GPU: asked for by name only.
  if (built_with_cuda()) {
    expect_configuration_error("--train.backend=cuda --train.weight_decay=0.01",
                               "train.weight_decay = 0.01 (on the command line) decays the "
                               "weights on the GPU with a kernel that has not yet run on one");
  }
  expect_configuration_error("--checkpoint.init=/nonexistent.h5",
                             "checkpoint.init = /nonexistent.h5: no such file\n", 1);
  // A corpus of numbers (60 pairs, a vocabulary of 60) and a one-step model of it.
  const std::filesystem::path root =
      std::filesystem::temp_directory_path() / ("thpc_user_errors_" + std::to_string(getpid()));
  std::filesystem::remove_all(root);
  const std::string data = (root / "data").string();
  const ProcessResult made = run_process(
      "python3 " THPC_SOURCE_DIR "/tools/make_numbers_corpus.py --train 60 --valid 8 --test 2 "
      "--seed 1 --out " + (root / "text").string() + " > /dev/null && " + thpc::binary_dir() +
      "/transformer_preprocess --source-lang en --target-lang de --trainpref " +
      (root / "text/train").string() + " --validpref " + (root / "text/valid").string() +
      " --destdir " + data + " --vocab-size 60 --model-type bpe --seed 1 > /dev/null && " +
      thpc::binary_dir() + "/transformer_hpc " THPC_SOURCE_DIR
      "/input/tiny.ini --train.max_steps=1 --model.layers=1 --data.dir=" + data +
      " --checkpoint.dir=" + (root / "ck").string() +
      " > /dev/null");
  ASSERT_EQ(made.exit_code, 0) << made.output;
  expect_configuration_error("--data.dir=" + data + " --train.tokens_per_step=3",
                             "less than the longest pair of the data takes");
  // Validation on the training pairs (data.valid = train) is said, by the dry run and by
  // training alike (it went without a word; a helper's finding).
  const std::string training = " --train.max_steps=1 --checkpoint.dir=" +
                               (root / "same_pairs").string();
  for (const std::string& mode : {std::string(" --dry-run"), training}) {
    const ProcessResult same = run_process(
        thpc::binary_dir() + "/transformer_hpc " THPC_SOURCE_DIR "/input/tiny.ini "
        "--model.layers=1 --data.dir=" + data + " --data.valid=train --train.valid_every=5" +
        mode);
    EXPECT_EQ(same.exit_code, 0) << same.output;
    EXPECT_NE(same.output.find("warning: data.valid (train) holds the same pairs as data.train "
                               "(train): validation scores what the model trains on"),
              std::string::npos)
        << same.output;
  }
  // Validation shards whose longest pair a micro-batch cannot hold (short training pairs,
  // long validation ones): refused at start-up, as the training data's (before: training
  // ran to its first validation and failed there, exit 1, no checkpoint written; a helper's
  // finding).
  const std::string lopsided = (root / "lopsided").string();
  const ProcessResult lopsided_made = run_process(
      "cd " + (root).string() + " && python3 " THPC_SOURCE_DIR "/tools/make_numbers_corpus.py "
      "--train 2000 --valid 50 --test 2 --seed 1 --out lop > /dev/null && "
      "paste lop/train.en lop/train.de | awk -F'\t' 'split($1, a, \" \") <= 2' > lop/t.tsv && "
      "cut -f1 lop/t.tsv > lop/short.en && cut -f2 lop/t.tsv > lop/short.de && "
      "paste lop/valid.en lop/valid.de | awk -F'\t' 'split($1, a, \" \") >= 6' > lop/v.tsv && "
      "cut -f1 lop/v.tsv > lop/long.en && cut -f2 lop/v.tsv > lop/long.de && " +
      thpc::binary_dir() + "/transformer_preprocess --source-lang en --target-lang de "
      "--trainpref lop/short --validpref lop/long --destdir " + lopsided +
      " --vocab-size 120 --seed 1 > /dev/null 2>&1");
  ASSERT_EQ(lopsided_made.exit_code, 0) << lopsided_made.output;
  expect_configuration_error("--data.dir=" + lopsided + " --train.tokens_per_step=12 "
                             "--train.valid_every=2",
                             "less than the longest pair of the validation shards (read at that "
                             "budget at each validation, every train.valid_every = 2 steps) "
                             "takes (");
  // The file that holds that pair is named (a preprocess writes one validation shard).
  expect_configuration_error("--data.dir=" + lopsided + " --train.tokens_per_step=12 "
                             "--train.valid_every=2",
                             "eos/bos, in " + lopsided + "/valid.00000.h5); raise");
  expect_configuration_error("--data.dir=" + data + " --train.valid_every=1 "
                             "--train.valid_bleu=true --train.valid_beam=100000",
                             "train.valid_beam 100000 (on the command line) is wider than the 58 "
                             "tokens a search can choose (the vocabulary of 60 less pad and "
                             "bos): give at most 58");
  // An alpha whose penalty overflows, as transformer_decode refuses it (a review's finding:
  // every validation score was -0).
  expect_configuration_error("--data.dir=" + data + " --train.valid_every=5 "
                             "--train.valid_bleu=true --train.valid_beam=4 --decode.alpha=1e30",
                             "decode.alpha 1e+30 (on the command line) makes the validation "
                             "search's length penalty "
                             "((5 + |Y|)/6)^alpha overflow for outputs of 64 tokens");
  // The [decode] defaults every checkpoint stores, as transformer_decode would refuse them
  // (a helper's trial: decode.beam = 1000 trained, and the model's own default was refused).
  expect_configuration_error("--data.dir=" + data + " --decode.beam=1000",
                             "decode.beam 1000 (on the command line) is wider than the 58 tokens "
                             "a search can choose (the vocabulary of 60 less pad and bos): every "
                             "checkpoint stores it as transformer_decode's default, which would "
                             "refuse it; give at most 58");
  expect_configuration_error("--data.dir=" + data + " --decode.beam=1 --decode.alpha=1e30",
                             "decode.alpha 1e+30 (on the command line) makes the length penalty");
  expect_configuration_error("--data.dir=" + data + " --decode.alpha=1e30",
                             "decode.alpha 1e+30 (on the command line) makes the length penalty "
                             "((5 + |Y|)/6)^alpha overflow for outputs of 64 tokens "
                             "(model.max_positions): every checkpoint stores it");
  expect_configuration_error("--data.dir=" + data + " --train.valid_every=5 --data.valid=nothere",
                             "no shards nothere.00000.h5", 3);
  expect_configuration_error("--model.layers=2 --data.dir=" + data + " --checkpoint.init=" +
                                 (root / "ck/step_00000001.h5").string(),
                             "architecture mismatch", 2);
  // --eval alike: a model.vocab_size other than the shards' is the configuration's mistake
  // (exit 2; it was 1 for a while, the failure gathered over the ranks as a runtime one).
  const ProcessResult eval = run_process(
      thpc::binary_dir() + "/transformer_hpc " THPC_SOURCE_DIR "/input/tiny.ini --model.layers=1 "
      "--model.vocab_size=10 --data.dir=" + data +
      " --eval=" + (root / "ck/step_00000001.h5").string());
  EXPECT_EQ(eval.exit_code, 2) << eval.output;
  EXPECT_NE(eval.output.find("model.vocab_size is 10"), std::string::npos) << eval.output;
  // An average (parameters only) is what checkpoint.init takes, and --dry-run refused it
  // ("resuming needs the Adam moments") while training started from it (issue 54): both
  // read it as training does now. checkpoint.resume of it is refused by both.
  const std::string average = (root / "average.h5").string();
  ASSERT_EQ(run_process(thpc::binary_dir() + "/transformer_average --inputs " +
                        (root / "ck/step_00000001.h5").string() + " --output " + average)
                .exit_code,
            0);
  for (const char* mode : {"--dry-run", ""}) {
    const ProcessResult init = run_process(
        thpc::binary_dir() + "/transformer_hpc " THPC_SOURCE_DIR
        "/input/tiny.ini --train.max_steps=1 --model.layers=1 --data.dir=" + data +
        " --checkpoint.dir=" +
        (root / "from_average").string() + " --checkpoint.init=" + average + " " + mode);
    EXPECT_EQ(init.exit_code, 0) << mode << "\n" << init.output;
  }
  expect_configuration_error("--model.layers=1 --data.dir=" + data + " --checkpoint.resume=" +
                                 average,
                             "resuming needs the Adam moments", 1);
  // Shards of the same text and vocabulary size by another SentencePiece model (unigram):
  // the checkpoint's ids would mean other pieces. Resuming or starting from it on them was
  // accepted silently (issue 54; --eval refused the same pair).
  const std::string other = (root / "other").string();
  ASSERT_EQ(run_process(thpc::binary_dir() + "/transformer_preprocess --source-lang en "
                        "--target-lang de --trainpref " + (root / "text/train").string() +
                        " --validpref " + (root / "text/valid").string() + " --destdir " + other +
                        " --vocab-size 60 --model-type unigram --seed 1 > /dev/null 2>&1")
                .exit_code,
            0);
  for (const std::string option : {"--checkpoint.init=", "--checkpoint.resume="}) {
    expect_configuration_error("--model.layers=1 --data.dir=" + other + " " + option +
                                   (root / "ck/step_00000001.h5").string(),
                               "trained on another SentencePiece vocabulary than the shards of "
                               "data.dir " + other + " (piece ", 2);
  }
  // --eval says it as training does, which piece and what to do, exit 2 (it named the
  // shards alone, exit 1; a helper's walk).
  const ProcessResult other_eval = run_process(
      thpc::binary_dir() + "/transformer_hpc " THPC_SOURCE_DIR "/input/tiny.ini --model.layers=1 "
      "--data.dir=" + other + " --eval=" + (root / "ck/step_00000001.h5").string());
  EXPECT_EQ(other_eval.exit_code, 2) << other_eval.output;
  EXPECT_NE(other_eval.output.find("trained on another SentencePiece vocabulary than the valid "
                                   "shards of data.dir " + other + " (piece "),
            std::string::npos)
      << other_eval.output;
  EXPECT_NE(other_eval.output.find("transformer_preprocess --spm-model"), std::string::npos)
      << other_eval.output;
  // Of another size: data.dir holds another corpus, said so (the architecture's check came
  // first and asked for the checkpoint's model.vocab_size, which the shards then refused).
  const std::string resized = (root / "resized").string();
  ASSERT_EQ(run_process(thpc::binary_dir() + "/transformer_preprocess --source-lang en "
                        "--target-lang de --trainpref " + (root / "text/train").string() +
                        " --validpref " + (root / "text/valid").string() + " --destdir " +
                        resized + " --vocab-size 50 --seed 1 > /dev/null 2>&1")
                .exit_code,
            0);
  expect_configuration_error("--model.layers=1 --data.dir=" + resized + " --checkpoint.resume=" +
                                 (root / "ck/step_00000001.h5").string(),
                             "(60 pieces in the checkpoint's, 50 in the shards'): data.dir holds "
                             "another corpus than the one it was trained on (preprocessed "
                             "again?)", 2);
  // transformer_decode alike: a beam wider than the vocabulary is a usage error; so is
  // one of the whole vocabulary, which pad and bos never fill (it wrote 58 n-best lines
  // where --nbest 60 asked for 60; a helper's finding).
  const auto decode_one_line = [&](const std::string& options) {
    return run_process("echo 1 2 3 | " + thpc::binary_dir() + "/transformer_decode --checkpoint " +
                       (root / "ck/step_00000001.h5").string() + " " + options);
  };
  for (const std::string beam : {"100000", "60 --nbest 60"}) {
    const ProcessResult wide = decode_one_line("--beam " + beam);
    EXPECT_EQ(wide.exit_code, 2) << wide.output;
    EXPECT_NE(wide.output.find("is wider than the 58 tokens a search can choose (the vocabulary "
                               "of 60 less pad and bos): give at most 58"),
              std::string::npos)
        << wide.output;
  }
  // An alpha whose length penalty overflows a double makes every score -0: refused (it
  // passed, being finite).
  const ProcessResult overflowing = decode_one_line("--lenpen 1e30");
  EXPECT_EQ(overflowing.exit_code, 2) << overflowing.output;
  EXPECT_NE(overflowing.output.find("the length penalty's alpha 1e+30 (--lenpen, or the "
                                    "checkpoint's decode.alpha) makes ((5 + |Y|)/6)^alpha "
                                    "overflow for outputs of "),
            std::string::npos)
      << overflowing.output;
  const ProcessResult large_but_fine = decode_one_line("--lenpen 50 --max-len-b 2");
  EXPECT_EQ(large_but_fine.exit_code, 0) << large_but_fine.output;
  std::filesystem::remove_all(root);
}

// The dry run looks at the run directory as training does before writing there, and
// changes nothing (before: it passed a job that training refused at once, exit 2, with
// another run's files in checkpoint.dir, a checkpoint.dir that is a file, or a trainer
// running there; it refused a checkpoint.init missing where resume=auto would resume and
// training never reads it).
TEST(UserErrors, TheDryRunLooksAtTheRunDirectoryAsTrainingDoesAndChangesNothing) {
  namespace fs = std::filesystem;
  const fs::path root =
      fs::temp_directory_path() / ("thpc_dry_run_directory_" + std::to_string(getpid()));
  fs::remove_all(root);
  fs::create_directories(root);
  const std::string run = (root / "run").string();
  // (Every run below but the first and the last is refused or a dry run: none trains.)
  const std::string trainer = thpc::binary_dir() + "/transformer_hpc " THPC_SOURCE_DIR
                              "/input/tiny.ini --train.valid_every=0 ";
  ASSERT_EQ(run_process(trainer + "--train.max_steps=1 --checkpoint.dir=" + run + " > /dev/null")
                .exit_code,
            0);
  const auto listing = [](const fs::path& dir) {
    std::vector<std::string> names;
    for (const auto& entry : fs::directory_iterator(dir)) {
      names.push_back(entry.path().filename().string());
    }
    std::sort(names.begin(), names.end());
    return names;
  };
  const std::vector<std::string> files = listing(run);
  // Each refused alike by training and by the dry run, with training's exit code.
  const auto both_refuse = [&](const std::string& arguments, int code, const std::string& why) {
    for (const char* mode : {"--dry-run", ""}) {
      SCOPED_TRACE(arguments + " " + mode);
      const ProcessResult result = run_process(trainer + arguments + " " + mode);
      EXPECT_EQ(result.exit_code, code) << result.output;
      EXPECT_NE(result.output.find(why), std::string::npos) << result.output;
    }
  };
  both_refuse("--checkpoint.dir=" + run, 2, "hold 3 files of another run");
  both_refuse("--checkpoint.dir=" + run + "/step_00000001.h5", 2,
              run + "/step_00000001.h5 is no directory");
  // The seed is named where it was given (before: "tiny.ini has train.seed 7"). A seed or
  // a model that contradicts the run's checkpoint is the configuration's error, exit 2 as
  // the others (before: 1, as for a damaged checkpoint).
  both_refuse("--checkpoint.dir=" + run + " --checkpoint.resume=auto --train.seed=7", 2,
              ", the command line gives train.seed 7 (a resumed run keeps its seed): give "
              "train.seed = 1 to resume it, or start a run of seed 7 from its parameters with "
              "checkpoint.init = ");
  both_refuse("--checkpoint.dir=" + run + " --checkpoint.resume=auto --model.d_ff=64", 2,
              "architecture mismatch: model.d_ff is ");
  // A symbolic link to nothing as the directory, a directory as the metrics file (before:
  // the dry run passed both; training refused the first, exit 2, and failed at the second
  // when it opened it, exit 1).
  fs::create_symlink(root / "nowhere", root / "link");
  both_refuse("--checkpoint.dir=" + (root / "link/run").string(), 2,
              (root / "link").string() + " is a symbolic link to nothing");
  fs::create_symlink(run + "/step_00000001.h5", root / "link_to_a_file");
  both_refuse("--checkpoint.dir=" + (root / "link_to_a_file").string(), 2,
              (root / "link_to_a_file").string() + " is no directory");
  fs::create_directories(root / "odd/metrics.jsonl");
  both_refuse("--checkpoint.dir=" + (root / "odd").string(), 2,
              "the metrics file " + (root / "odd/metrics.jsonl").string() + " is a directory");
  // Another host's trainer, its lock refreshed just now: in use; left 20 minutes ago: taken
  // over, which the dry run says it would do.
  const std::string lock = run + "/trainer.lock";
  std::ofstream(lock) << "host=thpc-another-host\npid=12345\nstarted=1\n";
  both_refuse("--checkpoint.dir=" + run + " --checkpoint.resume=auto", 2,
              "the run directory " + run + " is in use by another trainer (host "
              "thpc-another-host, pid 12345");
  ASSERT_EQ(run_process("touch -d '20 minutes ago' " + lock).exit_code, 0);
  ProcessResult dry = run_process(trainer + "--checkpoint.dir=" + run +
                                  " --checkpoint.resume=auto --dry-run");
  EXPECT_EQ(dry.exit_code, 0) << dry.output;
  EXPECT_NE(dry.output.find("# note: training would take over the lock " + lock), std::string::npos)
      << dry.output;
  EXPECT_TRUE(fs::exists(lock));
  fs::remove(lock);
  // Resumed, checkpoint.init is not read: a file gone since the first run passes both.
  dry = run_process(trainer + "--checkpoint.dir=" + run + " --checkpoint.resume=auto "
                    "--checkpoint.init=/nonexistent/first.h5 --dry-run");
  EXPECT_EQ(dry.exit_code, 0) << dry.output;
  EXPECT_NE(dry.output.find("# training would resume from " + run + "/step_00000001.h5 (step 1)"),
            std::string::npos)
      << dry.output;
  // What checkpoint.overwrite would delete is said, and kept.
  dry = run_process(trainer + "--checkpoint.dir=" + run + " --checkpoint.overwrite=true --dry-run");
  EXPECT_EQ(dry.exit_code, 0) << dry.output;
  // With what the file holds: the line says what would be lost.
  const std::string bytes = std::to_string(fs::file_size(run + "/metrics.jsonl"));
  EXPECT_NE(dry.output.find("# note: training would remove " + run + "/metrics.jsonl (" + bytes +
                            " bytes), a file of an earlier run (checkpoint.overwrite = true)"),
            std::string::npos)
      << dry.output;
  EXPECT_NE(dry.output.find("# note: training would remove " + run + "/step_00000001.h5 ("),
            std::string::npos)
      << dry.output;
  EXPECT_EQ(listing(run), files);
  // A resume from an older step than the run's newest: training marks the later ones
  // superseded, and removes a crash's interrupted write: both said, neither done.
  const std::string second = (root / "second").string();
  ASSERT_EQ(run_process(trainer + "--train.max_steps=2 --checkpoint.every_steps=1 "
                        "--checkpoint.dir=" + second + " > /dev/null").exit_code,
            0);
  std::ofstream(second + "/.step_00000003.h5.tmp") << "cut short\n";
  const std::vector<std::string> second_files = listing(second);
  dry = run_process(trainer + "--checkpoint.dir=" + second + " --checkpoint.resume=" + second +
                    "/step_00000001.h5 --dry-run");
  EXPECT_EQ(dry.exit_code, 0) << dry.output;
  EXPECT_NE(dry.output.find("# note: training would mark " + second + "/step_00000002.h5 "
                            "superseded (the resume to step 1 abandons its branch)"),
            std::string::npos)
      << dry.output;
  EXPECT_NE(dry.output.find("# note: training would remove " + second + "/.step_00000003.h5.tmp"),
            std::string::npos)
      << dry.output;
  EXPECT_EQ(listing(second), second_files);
  // A directory that does not exist yet is not made by the dry run.
  dry = run_process(trainer + "--checkpoint.dir=" + (root / "new/run").string() + " --dry-run");
  EXPECT_EQ(dry.exit_code, 0) << dry.output;
  EXPECT_FALSE(fs::exists(root / "new"));
  // Training itself, resumed with the missing checkpoint.init, goes on from step 1.
  const ProcessResult resumed = run_process(trainer + "--checkpoint.dir=" + run +
                                            " --checkpoint.resume=auto --train.max_steps=2 "
                                            "--checkpoint.init=/nonexistent/first.h5");
  EXPECT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("resumed from " + run + "/step_00000001.h5 at step 1"),
            std::string::npos)
      << resumed.output;
  fs::remove_all(root);
}

TEST(UserErrors, TheFootprintIsComputedWithoutOverflowAndBoundsTheParameterTable) {
  Config config;
  config.model.d_model = 2147483647;
  config.model.d_ff = 2147483647;
  config.model.heads = 1;
  config.model.layers = 2147483647;
  const TrainingFootprint huge = training_footprint(config.model, 2147483647, config.train);
  EXPECT_GT(huge.bytes, 1e29L);  // about 10^11 times what an int64 holds
  // The paper's base model on its 37000-piece vocabulary: at least the matrices' weights.
  Config base;
  base.model.layers = 6;
  base.model.d_model = 512;
  base.model.d_ff = 2048;
  base.model.heads = 8;
  const TrainingFootprint paper = training_footprint(base.model, 37000, base.train);
  EXPECT_LE(paper.parameters, 63045632.0L);  // the exact count of input/base.ini
  EXPECT_GT(paper.parameters, 0.99L * 63045632.0L);  // biases and norms are the rest
  // On the GPU the parameters' buffers alone count toward host memory.
  base.train.backend = "cuda";
  EXPECT_TRUE(training_does_not_fit(base, 37000, 8e9L).empty());
  EXPECT_FALSE(training_does_not_fit(base, 37000, 1e8L).empty());
  // On the CPU the activations share it: model.layers = 10000 of input/tiny.ini was read
  // into 22 GB before the kernel killed it (issue 54). At least 4 bytes a token for each
  // of the encoder's 4 d + d_ff and the decoder's 6 d + d_ff per layer, and the logits.
  Config tiny;
  tiny.train.backend = "cpu";
  tiny.train.tokens_per_step = 1000;
  tiny.model.layers = 10000;
  tiny.model.d_model = 64;
  tiny.model.d_ff = 256;
  tiny.model.heads = 4;
  const TrainingFootprint deep = training_footprint(tiny.model, 32, tiny.train);
  EXPECT_EQ(deep.activation_bytes, 4.0L * 1000 * (10000.0L * (4 * 64 + 256 + 6 * 64 + 256) + 32));
  const std::string refused = training_does_not_fit(tiny, 32, 24e9L);
  EXPECT_NE(refused.find("and the activations backward reads, for a micro-batch of 1000 tokens "
                         "a side (train.tokens_per_step = 1000 / (train.accumulate = 1 x 1 "
                         "rank)), at least 46.1 GB"),
            std::string::npos)
      << refused;
  // The logits are not worth naming here (128 kB of 46 GB)...
  EXPECT_EQ(refused.find("train.loss_chunk_rows"), std::string::npos) << refused;
  // ...but with one layer and a vocabulary of 37,000 they are most of the activations
  // (148 MB of 153 MB): the message says how to make them a chunk at a time, and in
  // chunks they take a chunk's rows and the message no longer suggests it.
  Config wide = tiny;
  wide.model.layers = 1;
  const std::string wide_refused = training_does_not_fit(wide, 37000, 1e8L);
  EXPECT_NE(wide_refused.find("or make the vocabulary's logits in chunks "
                              "(train.loss_chunk_rows = 1024: they take 148.0 MB of it whole)"),
            std::string::npos)
      << wide_refused;
  wide.train.loss_chunk_rows = 10;
  EXPECT_EQ(training_footprint(wide.model, 37000, wide.train).logit_bytes, 4.0L * 10 * 37000);
  EXPECT_EQ(training_does_not_fit(wide, 37000, 1e8L).find("train.loss_chunk_rows"),
            std::string::npos);
  // Heads wider than d_model / h make wider projections: model.d_k = d_v = 1024 with 4
  // heads keeps 4 x 1024 x 4 values a token in each encoder layer's Q|K|V and context, not
  // 4 x 64: the bound counted d_model's widths whatever the heads' were.
  Config wide_heads = wide;
  wide_heads.train.loss_chunk_rows = 0;
  wide_heads.model.d_k = 1024;
  wide_heads.model.d_v = 1024;
  EXPECT_EQ(training_footprint(wide_heads.model, 32, wide_heads.train).activation_bytes,
            4.0L * 1000 * ((4 * 3 * 1024 + 4 * 1024 + 256) + (4 * 6 * 1024 + 256) + 32));
  // Two ranks and two micro-batches share the step's tokens: a quarter each.
  tiny.train.accumulate = 2;
  EXPECT_EQ(training_footprint(tiny.model, 32, tiny.train, 2).tokens_per_micro_batch, 250);
}

// In the program's words: the trainer's keys, a tool's options, or none (transformer_score
// advised lowering train.tokens_per_step).
TEST(UserErrors, AFailedAllocationSaysWhichSizesToLower) {
  const std::bad_alloc failure;
  const std::string before = out_of_memory_advice();
  set_out_of_memory_advice("");
  EXPECT_EQ(failure_message(failure), "out of memory: an allocation failed: the sizes asked "
                                      "for need more memory than this machine has");
  set_out_of_memory_advice(kTrainingMemoryAdvice);
  const std::string message = failure_message(failure);
  EXPECT_NE(message.find("out of memory"), std::string::npos) << message;
  EXPECT_NE(message.find("has; lower train.tokens_per_step"), std::string::npos) << message;
  set_out_of_memory_advice(before);
  EXPECT_EQ(failure_message(Error("a plain message")), "a plain message");
}

}  // namespace
}  // namespace thpc
