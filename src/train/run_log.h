// What the trainer logs, from one list of values: the text line a user reads ("step
// 100/1200 | loss 2.9517 | ppl 11.82 | ..."), a JSON object per line in RUN/metrics.jsonl
// for plots and scripts, and the same scalars in a TensorBoard event file beside it.
// Building all from the same LogField list is what keeps the files holding exactly the
// values the log shows.
#pragma once

#include <cstdint>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "config/config.h"
#include "train/event_file.h"

namespace thpc {

// One scalar of a log line: "label text" in the line, "key": value in metrics.jsonl.
// A value that is not available (peak memory where the backend cannot tell) is NaN: text
// "n/a", JSON null.
struct LogField {
  std::string label;  // "loss", "tgt tokens/s"
  std::string key;    // "loss", "tgt_tokens_per_s"
  double value = 0.0;
  std::string text;   // the value as the line prints it, with its unit
};

// Fields printed with `digits` decimals (fixed), as d.ddde±xx (scientific, `digits`
// decimals) or with `digits` significant digits (general, like printf %g); `unit`
// follows the number ("s", " MiB").
LogField fixed_field(const std::string& label, const std::string& key, double value,
                     int digits, const std::string& unit = "");
LogField scientific_field(const std::string& label, const std::string& key, double value,
                          int digits);
LogField general_field(const std::string& label, const std::string& key, double value,
                       int digits);

// "head | label text | label text ..."; without a head, "label text | ...".
std::string log_line(const std::string& head, const std::vector<LogField>& fields);

// DIR/metrics.jsonl: DIR is train.metrics_dir, else checkpoint.dir itself, so that two
// runs with different checkpoint directories never share a metrics or event file (the
// jobs of jobs/ set train.metrics_dir to their run directory, runs/NAME/, which holds
// their checkpoints/). A run resumed from before this default keeps its file where it
// is (run_metrics_path, train/run_directory.h).
std::string metrics_path(const Config& config);

// Appends one JSON object per record to metrics.jsonl and the same record as one Event to
// a TensorBoard event file in the same directory (event_file.h), both flushed at once so
// that a killed job keeps what it logged. A default-constructed file writes nothing
// (ranks other than 0).
class MetricsFile {
 public:
  MetricsFile() = default;
  // Creates the directory, opens `path` for appending (a resumed run continues the file)
  // and starts a new event file beside it; a failure throws naming the file and
  // train.metrics_dir. A last line without its newline (a write cut short by a crash) is
  // removed first, so that the next record starts a line of its own: repair_note() says so.
  explicit MetricsFile(const std::string& path);

  // "" or "removed a partial last line of N bytes from PATH (a write cut short)".
  const std::string& repair_note() const { return repair_note_; }

  // The record a process writes when it starts training: {"kind": "run", "step": STEP,
  // "wall_s": 0, "time": ..., "run": "ID", "resumed_from": "PATH" or null,
  // "checkpoint_dir": "ABSOLUTE PATH", "lineage": "STEP:ID ...", ...}. It marks where a
  // process's records begin, and says whose file it is (last_run_id), where that run's
  // checkpoints are (last_run_checkpoint_dir) and which line of training its records are
  // on (the last of its lineage, Checkpoint::lineage: a reader keeps the records of the
  // final record's lineage, tools/plot_metrics.py). Its Event is a session start at step +
  // 1, so that TensorBoard drops the values earlier processes logged past `step`. Then
  // those of RunStart's fields below that are known: what the run's curves were trained
  // with, readable when its checkpoints are deleted (a helper's sweep: the settings were
  // in the checkpoints alone, and a resume's changed ones in its log's notes).
  struct RunStart {
    int64_t step = 0;
    std::string run_id, resumed_from, checkpoint_dir, lineage;
    // checkpoint.init's parameters began a new run: its curves are a fine-tuning's, not a
    // run from scratch.
    std::string init;
    // The validation pairs' digest (BatchSource::corpus_sha256), whose change between
    // processes says that the validation values before and after are of two sets; and
    // the training data's.
    std::string valid_sha256, corpus_sha256;
    std::string version;      // source_version(): the program's
    std::string computed_by;  // compute_identity(): the backend, the products' kernels
    // The config file (absolute), the settings given on the command line over it
    // (Config::command_line_text) and the resolved configuration (Config::to_ini()).
    std::string config_file, command_line, config;
  };
  void write_run_start(const RunStart& start);
  // A rollback to the checkpoint of `step` (its line `lineage`): {"kind": "branch", "step":
  // STEP, "wall_s": ..., "time": ..., "lineage": "..."}, the records after it on that line,
  // and a session start at step + 1.
  void write_branch(int64_t step, double wall_s, const std::string& lineage);

  // The "run" of the last run record of the metrics file at `path`, "" when it has none
  // (or the file is missing); *has_records says whether it holds any record at all.
  static std::string last_run_id(const std::string& path, bool* has_records = nullptr);
  // The "checkpoint_dir" of that record, "" when it has none (written before 2026-12-02).
  static std::string last_run_checkpoint_dir(const std::string& path);
  // The checkpoints the last run of the metrics file at `path` says it wrote: the sum of
  // "checkpoints" over the summaries of that run's processes, and in *last_summary_step
  // the step of the last summary that counted some (0 and unset when none did).
  static int64_t last_run_checkpoints_written(const std::string& path,
                                              int64_t* last_summary_step);

  // Whether `path` may be appended to as a metrics file: it is absent, empty, or its
  // first line is a record ({"kind": ...). Anything else (a symbolic link to a model, a
  // text the user keeps under that name) is not ours to append to, nor to cut.
  static bool is_metrics_file(const std::string& path);
  // What `path` is when a run's records cannot go into it: "a directory", "a named pipe"
  // (whose open would wait for a reader for ever), "a socket", "a symbolic link to
  // nothing"; "" when nothing is there, or a file or a device is (/dev/null takes them).
  static std::string unfit_for_records(const std::string& path);
  // True when `path` holds records and every one is a "run" record: a start that failed
  // before its first step.
  static bool records_no_value(const std::string& path);

  // metrics.jsonl: {"kind": KIND, "step": STEP, "wall_s": WALL, "time": unix seconds,
  // key: value, ...}. Event file: an Event at STEP with wall_time = the same Unix time
  // and the scalars KIND/wall_s and KIND/key (e.g. "train/loss", "valid/valid_ppl");
  // a null (not finite) value is left out. `texts` follow the values as "key": "text"
  // (a summary's "ended"), in metrics.jsonl only: TensorBoard's scalars are numbers.
  // A record that cannot be written (the file's or the event file's write fails) ends the
  // records: both files are closed, and a warning goes to warn_on's stream. A file removed
  // while the run goes on (its directory deleted) is made again, with a warning: the
  // records went into the unlinked file before, and were lost with it. So is one replaced
  // by another file under its name (moved away and made again): the records go on into
  // the file the name holds, a metrics file, or a new event file; a metrics file replaced
  // by what is not one (a named pipe, someone's text) ends the records, with a warning.
  void write(const std::string& kind, int64_t step, double wall_s,
             const std::vector<LogField>& fields,
             const std::vector<std::pair<std::string, std::string>>& texts = {});
  // Where write() says that it stopped recording (the run's log).
  void warn_on(std::ostream& log) { warnings_ = &log; }

 private:
  void append(const std::string& record);
  // Ends the records with a warning: what stopped them, and `advice` (else the storage's,
  // io/atomic_file.h's storage_advice).
  void give_up(const std::string& what, int64_t step, std::string advice = "");
  void reopen_if_replaced(int64_t step);

  std::string path_;
  std::ofstream file_;
  FileAtPath opened_;  // the metrics file file_ holds open
  EventFile events_;
  std::string repair_note_;
  std::ostream* warnings_ = nullptr;
};

}  // namespace thpc
