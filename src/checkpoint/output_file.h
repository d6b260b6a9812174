// What every program that writes a file promises (transformer_decode --output and
// --dump-attention, transformer_average, transformer_preprocess, transformer_trees; the
// trainer's own checks are outputs_that_would_destroy_inputs, train/run_directory.h): it
// never writes over one of its own inputs, nor over a training run's files, however the
// path is spelt, and it writes through a temporary name and a rename, so that a failure
// leaves the old file or no file, never half of one.
#pragma once

#include <functional>
#include <iosfwd>
#include <string>
#include <utility>
#include <vector>

#include "common/error.h"
#include "io/atomic_file.h"  // same_file

namespace thpc {

// What a program writes at a path, which says what it may replace there.
enum class OutputKind {
  Text,           // a text file: may replace a text file only (not a model, shards, a dump)
  Checkpoint,     // a parameters-only checkpoint (an average): may replace an earlier one
  AttentionDump,  // transformer_decode --dump-attention: may replace an earlier dump
};

// A file of a training run that no tool may replace whatever the tool writes: a name a
// run writes (step_*.h5 and step_*.h5.corrupt, best.h5, metrics.jsonl,
// events.out.tfevents.*; average_last*.h5 beside step_*.h5 checkpoints) or, for an
// existing file, a checkpoint holding a training state (Adam moments). "" when `path` is
// none, else what it is ("named like the best-validation checkpoint best.h5 ...").
std::string training_run_file(const std::string& path);

// Throws thpc::Error "OPTION PATH: WHY; ..." when the program may not write `output`:
// it is one of `inputs` (or the temporary file of the write would be one; an input "-"
// is the file standard input is, and an output "-" the file standard output is), another
// of the program's outputs in `other_outputs`, a training run's file, a path that could
// not be written (ending in /, below a file, in a directory without write permission),
// or an existing file
// that `kind` may not replace (a text output over a binary file, an average over
// anything but an earlier average, a dump over anything but an earlier dump), or a
// directory. Checked before any work, so a refusal is a usage error (exit 2).
void check_output_path(const std::string& option, const std::string& output,
                       const std::vector<std::string>& inputs, OutputKind kind,
                       const std::vector<std::string>& other_outputs = {});

// The first of `inputs` ("-": standard input's file, named "standard input (-)") that
// standard output is (`>> F` where F is an input), or "" when it is none: what a program
// printing to standard output refuses before it prints (transformer_score and transformer_evalb appended their report
// to the reference, the trainer its log to its config file, exit 0; a helper's trial).
std::string input_standard_output_is(const std::vector<std::string>& inputs);

// What a checkpoint output (OutputKind::Checkpoint) would replace at `path`, for the line
// that says it was written: "the earlier parameters-only checkpoint of step N there, an
// average or a quantized model"; "" when nothing is there. Asked before the write:
// transformer_average and transformer_quantize replaced an earlier float average by
// an int8 model, or the reverse, without a word (a helper's trial).
std::string checkpoint_output_replaces(const std::string& path);

// Writes the text `write` produces to `path` all at once or not at all: a temporary file
// beside it (.NAME.tmp), locked while it is written, fsync'ed and renamed over `path`
// (write_atomically, io/atomic_file.h). A path that exists and is not a regular file
// (/dev/stdout, a pipe) is written directly. Throws thpc::Error naming `what` ("output
// file PATH") when the write fails, and OutputInUse when another program writes `path` now.
void write_text_atomically(const std::string& path, const std::string& what,
                           const std::function<void(std::ostream&)>& write);

// Writes several text files (path, contents) together: each to its temporary name first,
// then all renamed; a failure before the renames removes the temporary files and leaves
// every old file as it was. Throws thpc::Error naming the file that could not be written.
void write_texts_atomically(const std::vector<std::pair<std::string, std::string>>& files);

}  // namespace thpc
