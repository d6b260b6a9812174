// Raw parallel text -> SentencePiece -> HDF5 shards: what transformer_preprocess does.
//
// Reads PREFIX.SRC / PREFIX.TGT (one sentence per line) for the train, valid and
// optional test splits, trains a shared SentencePiece model on the training text (or
// loads one), encodes every line, drops pairs that are empty, too long or (train only)
// over the length ratio, and writes DEST/train.NNNNN.h5, DEST/valid.00000.h5,
// DEST/test.00000.h5 and DEST/spm.model. Everything is written under temporary names
// and renamed at the end, so a failed run leaves nothing that looks valid. The same
// input and seed give byte-identical output.
//
// Memory does not grow with the corpus: the text is read three times (counted and
// checked; sampled for SentencePiece; encoded), a block of pairs at a time, and the kept
// pairs' ids wait on disk (DEST/SPLIT.{src,tgt}.{lengths,tokens}.partial) until the
// split's count, and so where its shards begin and end, is known; each shard is then
// written from them a block at a time. What remains is SentencePiece's training, which
// holds the lines it trains on: at most `spm_sentences`.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <string>

#include "common/progress.h"

namespace thpc {

// The source's SentencePiece model beside spm.model with separate vocabularies.
inline constexpr const char* kSourceSpmModelFile = "spm.source.model";

struct PreprocessOptions {
  std::string source_lang, target_lang;
  std::string train_prefix, valid_prefix, test_prefix;  // test optional ("")
  std::string dest_dir;
  int vocab_size = 37000;    // the paper's shared EN-DE BPE vocabulary (§5.1)
  std::string spm_model;     // an existing SentencePiece model instead of training one
  // When spm_model names a checkpoint: the model it stores, which the caller reads (a
  // checkpoint is a floor above the data's), used instead of the file's bytes.
  std::string spm_model_of_checkpoint;
  // Separate vocabularies (fairseq's dictionaries apart, Marian's two --vocabs): > 0, a
  // SentencePiece model of this many pieces trained on the source text alone, and
  // vocab_size's on the target text alone; the shards are then of format 3 and the source
  // model is written as DEST/spm.source.model beside spm.model (the target's). 0: one
  // model over both languages (§5.1).
  int source_vocab_size = 0;
  // When spm_model names a checkpoint of separate vocabularies: its source model.
  std::string source_spm_model_of_checkpoint;
  // Separate vocabularies from existing files: the source's SentencePiece .model, with
  // spm_model the target's (DIR/spm.source.model and DIR/spm.model of a run of
  // --source-vocab-size, or spm_train's). Empty: none.
  std::string source_spm_model;
  std::string model_type = "bpe";  // bpe | unigram
  // Comma-separated tokens never split nor merged with a neighbour: each becomes one
  // piece when it stands as a word (the parser's "(NP", ")", "XX"). Empty: none.
  std::string user_symbols;
  int shards = 1;            // of the training split
  int max_len = 250;         // subword tokens per side of a training pair, eos excluded
  // The same for the validation and test pairs (Marian's --valid-max-length): they are
  // scored whole, as fairseq and Marian score them, not cut to the training pairs' limit
  // (--max-len 20 left validation 415 of Multi30k's 1,014 pairs, and its BLEU was that
  // subset's, where transformer_score of the whole set said otherwise; a helper's trial).
  // The trainer drops those longer than its model.max_positions - 1, and says so.
  int valid_max_len = 1024;
  double max_ratio = 9.0;    // longer side / shorter side, training pairs only
  uint64_t seed = 1;
  int threads = 0;           // 0 = all cores
  // SentencePiece trains on at most this many lines of both languages (0: all). A
  // corpus with more is sampled: exactly this many lines, drawn with `seed`.
  int64_t spm_sentences = 10000000;
  // Pairs read, encoded and written at a time, and the most text a block reads (both
  // sides: 32,768 pairs of 25 KB lines held 1.6 GB at once): what bounds the memory of
  // everything but SentencePiece's training (about 1 KB a pair of WMT-like text, 32 MB).
  // Not options of the tool; the output does not depend on them (tests make them small).
  int64_t pairs_per_block = 32768;
  int64_t bytes_per_block = int64_t{64} << 20;
  // The training split's kept pairs go to the shards in runs of this many, run k to
  // shard k mod --shards, so that each shard holds pairs from the whole input (a corpus
  // concatenated from sub-corpora gave each shard one sub-corpus); what is left after
  // the last full round is cut into --shards consecutive slices, so that shards differ
  // by at most one pair. Not an option of the tool (tests make it small); one shard
  // holds every pair in the input's order.
  int64_t pairs_dealt_together = 256;
};

struct SplitCounts {
  int64_t read = 0, kept = 0, empty = 0, too_long = 0, over_ratio = 0;
};

struct PreprocessSummary {
  SplitCounts train, valid, test;
  int vocab_size = 0;
  int source_vocab_size = 0;  // separate vocabularies: the source's; else 0
  // Lines of both languages of the training text, and how many SentencePiece was given
  // to train on (0 with --spm-model), and how many of its sample (every line where the
  // text is small) were left out as longer than it trains on (64 KiB).
  int64_t training_lines = 0, spm_lines = 0, spm_lines_too_long = 0;
  double seconds = 0.0;
};

// Throws thpc::Error naming the file and the problem (missing or empty file, different
// line counts, invalid UTF-8, a SentencePiece failure). `progress` is told of two stages
// per split, named after it ("train"): its lines read (both languages, total unknown
// until the end), then its lines encoded (of a known total).
// Runs check_preprocess_options first: the tool runs it at parse time too (for its exit
// code 2), and this second pass is the one under its --destdir lock.
PreprocessSummary preprocess(const PreprocessOptions& options, std::ostream& log,
                             ProgressListener& progress = ProgressListener::none());

// Throws thpc::Error naming the option and its value when the command cannot be run as
// given: a value out of range (a model type other than bpe/unigram, no shards, more than
// 1024 threads, a vocabulary of fewer than the 4 specials + 1, a max length or ratio that
// would drop everything, a SentencePiece sample of 1 to 100 lines, which SentencePiece
// refuses), one language suffix for both sides, an input the run would write over in
// --destdir, a --destdir that is a training run's or holds a file under a shard's or
// spm.model's name that is not one (these read the files there). A usage error: nothing
// of the text is read.
void check_preprocess_options(const PreprocessOptions& options);

// "train: 29000 read, 28990 kept, 10 dropped (0 empty, 2 too long, 8 over ratio)"
std::string describe(const std::string& split, const SplitCounts& counts);

}  // namespace thpc
