// transformer_preprocess: parallel text -> SentencePiece -> HDF5 shards for the trainer.
// The options are fairseq-preprocess's names (see --help); the work is in
// src/data/preprocess.cc. On a terminal it shows each split's lines read, then encoded,
// on stderr (tools/progress.h); its output lines are the same with or without one.
//
// Exit codes: 0 success, 1 bad input or a failure, 2 a bad command line (an input that
// the run would write over or remove in --destdir included).
#include <boost/program_options.hpp>

#include <cstdint>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>
#include <string>

#include "checkpoint/checkpoint.h"
#include "checkpoint/checkpoint_header.h"
#include "common/cores.h"
#include "common/error.h"
#include "common/whole_number.h"
#include "data/preprocess.h"
#include "io/atomic_file.h"
#include "io/run_file_names.h"
#include "train/run_directory.h"
#include "tools/progress.h"
#include "tools/tool_main.h"

namespace po = boost::program_options;

namespace {

struct Command {
  thpc::PreprocessOptions options;
  // As text, read here: Boost reads "-1" into an unsigned option as 2^64 - 1.
  std::string seed = "1";
  bool help = false;
};

// --seed's value: a whole number from 0 to 2^64 - 1, read and said as transformer_decode
// reads and says it.
uint64_t seed_of(const std::string& text) {
  const std::optional<uint64_t> seed = thpc::whole_number(text);
  if (!seed) THPC_FAIL("--seed '" << text << "': expected a whole number from 0 to 2^64-1");
  return *seed;
}

}  // namespace

int main(int argc, char** argv) {
  Command command;
  thpc::PreprocessOptions& options = command.options;
  po::options_description description(
      "usage: transformer_preprocess --source-lang en --target-lang de --trainpref P "
      "--validpref P [--testpref P] --destdir DIR [options]\n\n"
      "Reads P.en / P.de (one sentence per line), trains a shared SentencePiece model on "
      "the training text (or with --source-vocab-size one for each language, or loads "
      "--spm-model), and writes DIR/train.NNNNN.h5, DIR/valid.00000.h5, DIR/test.00000.h5 "
      "and DIR/spm.model (and DIR/spm.source.model). In a trainer config, "
      "[data] dir = DIR is then all that is needed.\n\noptions");
  description.add_options()("help,h", "print this text and exit")(
      "version", "print the git commit the program was built from and exit")(
      "source-lang", po::value(&options.source_lang)->required(), "source language suffix")(
      "target-lang", po::value(&options.target_lang)->required(), "target language suffix")(
      "trainpref", po::value(&options.train_prefix)->required(), "training text prefix")(
      "validpref", po::value(&options.valid_prefix)->required(), "validation text prefix")(
      "testpref", po::value(&options.test_prefix), "test text prefix (optional)")(
      "destdir", po::value(&options.dest_dir)->required(), "output directory")(
      "vocab-size", po::value(&options.vocab_size)->default_value(options.vocab_size),
      "shared vocabulary size (the paper's EN-DE BPE: 37000); with --source-vocab-size the "
      "target's")(
      "source-vocab-size",
      po::value(&options.source_vocab_size)->default_value(options.source_vocab_size),
      "separate vocabularies (fairseq's default dictionaries, Marian's two --vocabs): a "
      "SentencePiece model of this many pieces trained on the source text alone, written "
      "as spm.source.model, and --vocab-size's on the target text alone (spm.model); the "
      "model then gets the encoder an embedding table of its own, the target's tied to the "
      "output projection; 0 = one shared vocabulary (§5.1)")(
      "spm-model", po::value(&options.spm_model),
      "use this SentencePiece .model, no training (a checkpoint: the model it stores, both "
      "of separate vocabularies)")(
      "source-spm-model", po::value(&options.source_spm_model),
      "with --spm-model FILE (then the target's): the source's SentencePiece .model, no "
      "training, for separate vocabularies (an earlier run's spm.source.model)")(
      "model-type", po::value(&options.model_type)->default_value(options.model_type),
      "SentencePiece model: bpe | unigram")(
      "user-symbols", po::value(&options.user_symbols),
      "comma-separated tokens SentencePiece keeps whole, each as a word of its own (the "
      "parser's bracket tokens: '(S,(NP,),XX'); none with whitespace, none of the special "
      "pieces <pad> <unk> <s> </s>")(
      "shards", po::value(&options.shards)->default_value(options.shards),
      "number of training shards; the kept pairs are dealt to them in runs of 256, so that "
      "each holds pairs from the whole input")(
      "max-len", po::value(&options.max_len)->default_value(options.max_len),
      "drop training pairs with a side longer than this many subword tokens")(
      "valid-max-len", po::value(&options.valid_max_len)->default_value(options.valid_max_len),
      "drop validation and test pairs with a side longer than this many subword tokens "
      "(Marian's --valid-max-length: they are scored whole, not cut to --max-len; the "
      "trainer also leaves out those longer than model.max_positions - 1, and says so)")(
      "max-ratio", po::value(&options.max_ratio)->default_value(options.max_ratio),
      "drop training pairs whose longer side exceeds this many times the shorter")(
      "seed", po::value(&command.seed)->default_value(command.seed),
      "chooses the lines SentencePiece trains on when the training text has more than "
      "--spm-sentences")(
      "threads", po::value(&options.threads)->default_value(options.threads),
      "threads for training and encoding; 0 = every core this process may use")(
      "spm-sentences", po::value(&options.spm_sentences)->default_value(options.spm_sentences),
      "SentencePiece trains on at most this many lines of both languages, a sample drawn "
      "with --seed when there are more (it holds them in memory); 0 = every line");
  const auto parse = [&](int count, char** values) {
    // fairseq-preprocess's and Marian's names, as their users type them.
    thpc::tools::refuse_other_toolkits_options(
        description, count, values,
        {{"s", "here it is --source-lang"},
         {"t", "here it is --target-lang"},
         {"valid-max-length", "here it is --valid-max-len"},
         {"max-length", "here it is --max-len"},
         {"workers", "here it is --threads"},
         {"nwordssrc", "here it is --source-vocab-size (separate vocabularies)"},
         {"nwordstgt", "here it is --vocab-size (the target's, with --source-vocab-size)"},
         {"joined-dictionary", "the default here: one SentencePiece model for both "
                               "languages (--vocab-size); --source-vocab-size N makes two"},
         {"srcdict", "here it is --source-spm-model (with --spm-model, the target's), or "
                     "--spm-model alone: a .model shared by both languages, or a checkpoint"},
         {"tgtdict", "here it is --spm-model (the target's with --source-spm-model): a "
                     ".model, or a checkpoint, whose models are taken"},
         {"vocabs", "here it is --spm-model: a .model shared by both languages, or a "
                    "checkpoint, whose models (both, with separate vocabularies) are taken"}});
    const po::variables_map given = thpc::tools::parse_options(description, count, values);
    command.help = given.count("help") > 0;
    if (!command.help) {
      thpc::tools::refuse_empty_values(
          given, {"trainpref", "validpref", "testpref", "destdir", "spm-model",
                  "source-spm-model"});
      options.seed = seed_of(command.seed);
      thpc::check_preprocess_options(options);
      // The model's own: given beside --spm-model, they changed nothing, without a word.
      if (given.count("spm-model") > 0) {
        std::string unused;
        // (--source-vocab-size is refused beside it, check_preprocess_options)
        for (const char* name : {"vocab-size", "model-type", "user-symbols"}) {
          if (given.count(name) > 0 && !given[name].defaulted()) {
            unused += (unused.empty() ? "--" : ", --") + std::string(name);
          }
        }
        if (!unused.empty()) {
          std::cerr << "note: " << unused << " not used: the --spm-model " << options.spm_model
                    << " has its own" << std::endl;
        }
      }
      // As transformer_decode and the trainer say it (a helper's walk found it silent).
      if (const std::string note = thpc::more_threads_than_cores(
              options.threads, "--threads " + std::to_string(options.threads), "--threads ");
          !note.empty()) {
        std::cerr << "note: " << note << std::endl;
      }
    }
    return command;
  };
  // (by value: a --spm-model checkpoint's model goes into its options)
  const auto run = [](Command given) {
    // One run at a time in a --destdir: two wrote each other's scratch files and shards.
    // Held until the shards are renamed in; the options, --destdir's contents among them,
    // are checked again under it.
    thpc::LockedUse use;
    use.lock_name = thpc::kPreprocessLockName;
    use.holder = "transformer_preprocess";
    use.holders = "runs of transformer_preprocess";
    use.key = "--destdir";
    use.named = use.unwritable = "--destdir " + given.options.dest_dir;
    use.clash = "write each other's scratch files and shards: a corpus of both, or of neither.";
    use.found_now = "found now rather than after the encoding";
    std::unique_ptr<thpc::RunLock> lock;
    try {
      lock = std::make_unique<thpc::RunLock>(given.options.dest_dir, std::cerr, use);
    } catch (const thpc::Error& failure) {
      // A full disk is found here first: said as the other writers say it.
      const std::string advice =
          thpc::storage_advice(given.options.dest_dir, failure.what(), 0);
      // Else a --destdir that cannot be written or is in use by another run: the command
      // line's to mend, exit 2 as the other tools' output paths and the trainer's
      // checkpoint.dir (before: exit 1).
      if (advice.empty()) throw thpc::tools::Refusal(failure.what());
      THPC_FAIL(given.options.dest_dir << "/" << thpc::kPreprocessLockName
                                       << ": cannot write the lock of --destdir: " << advice
                                       << " (nothing was written)");
    }
    // Ctrl-C removes it with the .partial files (the next run would take it over, with a
    // note).
    const thpc::RemovedWhenInterrupted lock_interrupted(lock->path());
    // Said when a signal ends the run (commit_outputs clears it once the corpus is put in
    // place): a batch job stopped by scancel or its time limit left an empty log, this
    // program's lines all at its end (a helper's scale walk).
    thpc::say_when_interrupted(
        "transformer_preprocess: interrupted before the end: its partial files are removed "
        "and " + given.options.dest_dir + " holds what it held before this run (an earlier "
        "corpus there is untouched); run the command again to preprocess\n");
    thpc::tools::StageProgress progress("transformer_preprocess");
    // --spm-model naming a checkpoint: the SentencePiece model it stores.
    if (!given.options.spm_model.empty()) {
      std::ifstream head(given.options.spm_model, std::ios::binary);
      std::string magic(thpc::kHeaderMagic.size(), '\0');
      if (head.read(magic.data(), static_cast<std::streamsize>(magic.size())) &&
          magic == thpc::kHeaderMagic) {
        const thpc::Checkpoint stored =
            thpc::read_checkpoint(given.options.spm_model, thpc::CheckpointParts::ParamsOnly);
        given.options.spm_model_of_checkpoint = stored.spm_model;
        // Separate vocabularies: the source's model too, which encodes the source side:
        // the checkpoint's direction must be this text's (one vocabulary serves both,
        // two do not; a review's finding).
        given.options.source_spm_model_of_checkpoint = stored.source_spm_model;
        if (!given.options.source_spm_model.empty()) {
          throw thpc::tools::UsageError(
              "--source-spm-model " + given.options.source_spm_model + " goes with "
              "--spm-model FILE, the target's .model; the checkpoint " +
              given.options.spm_model + " given as --spm-model has its models");
        }
        const std::string direction =
            given.options.source_lang + "->" + given.options.target_lang;
        if (!stored.source_spm_model.empty() && !stored.direction.empty() &&
            stored.direction != direction) {
          throw thpc::tools::UsageError(
              "--spm-model " + given.options.spm_model + ": a model of separate "
              "vocabularies trained " + stored.direction + ", and this text is " + direction +
              ": its source model would encode the --source-lang side; give the checkpoint's "
              "languages as --source-lang and --target-lang");
        }
        if (given.options.spm_model_of_checkpoint.empty()) {
          THPC_FAIL("--spm-model " << given.options.spm_model << ": a checkpoint that stores "
                    << "no SentencePiece model (of a run on the synthetic task, or written "
                    << "before checkpoints stored one): give the .model file its run's data "
                    << "was preprocessed with");
        }
      }
    }
    try {
      thpc::preprocess(given.options, std::cout, progress);
    } catch (const thpc::Error& failure) {
      // Its files are written under .partial names, removed when it fails.
      const std::string advice =
          thpc::storage_advice(given.options.dest_dir, failure.what(), 0);
      if (advice.empty()) throw;
      THPC_FAIL(failure.what() << ": " << advice << " (no shard was written: the .partial "
                                  "files are removed)");
    }
    return 0;
  };
  return thpc::tools::tool_main("transformer_preprocess", thpc::tools::usage_text(description),
                                argc, argv, parse, run, "the shards and spm.model");
}
