// The run directory (run_directory.h): ownership of checkpoint.dir and the metrics
// file, and the lock that keeps a second trainer out.
#include "train/run_directory.h"

#include <fcntl.h>
#include <linux/magic.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <map>
#include <mutex>
#include <optional>
#include <ostream>
#include <sstream>
#include <thread>
#include <utility>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "checkpoint/output_file.h"
#include "common/error.h"
#include "data/shard_file.h"
#include "io/atomic_file.h"
#include "io/run_file_names.h"
#include "train/checkpoint_keeping.h"
#include "train/event_file.h"
#include "train/run_log.h"
#include "train/stop_request.h"

namespace thpc {

namespace {

// A job of jobs/ names its run directory THPC_JOB_RUN_DIR (in the launcher's environment),
// runs/THPC_RUN_NAME: when `dir` is in it, that run name (what to change: a second job
// given the same name, an array's tasks sharing one, a sweep's next run), else "" (a
// directory the options chose).
std::string job_run_name_of(const std::filesystem::path& dir) {
  namespace fs = std::filesystem;
  const char* job_dir = std::getenv("THPC_JOB_RUN_DIR");
  if (job_dir == nullptr || *job_dir == '\0') return "";
  std::error_code job_error, dir_error;
  const fs::path job = fs::weakly_canonical(fs::path(job_dir), job_error);
  const fs::path inside = fs::weakly_canonical(dir, dir_error);
  const auto mismatch = std::mismatch(job.begin(), job.end(), inside.begin(), inside.end());
  return !job_error && !dir_error && mismatch.first == job.end() ? job.filename().string()
                                                                 : "";
}


// Removes `path` from the run directory, saying "note: removed PATH (SIZE), WHY" on `log`,
// or, for the dry run (DirectoryChanges::OnlySay), keeps it and says "note: training would
// remove PATH (SIZE), WHY": one line for each, whichever of the run directory's rules
// removes it, with what the file held. False when it stays (`error` says why; clear when
// it was gone already).
bool remove_saying_why(const std::string& path, const std::string& why,
                       DirectoryChanges changes, std::ostream& log, std::error_code& error) {
  namespace fs = std::filesystem;
  std::error_code no_size;
  const uintmax_t bytes = fs::file_size(path, no_size);
  std::ostringstream size;  // "(4096 bytes)", "(1.4 MB)", "(757 MB)", "(2.3 GB)"
  if (!no_size) {
    size << " (" << std::fixed;
    if (bytes < 1000000) {
      size << bytes << " bytes)";
    } else if (bytes < 1000000000) {
      size << std::setprecision(bytes < 100000000 ? 1 : 0) << bytes / 1e6 << " MB)";
    } else {
      size << std::setprecision(1) << bytes / 1e9 << " GB)";
    }
  }
  if (changes == DirectoryChanges::OnlySay) {
    log << "note: training would remove " << path << size.str() << ", " << why << std::endl;
    return true;
  }
  if (!fs::remove(path, error)) return false;
  log << "note: removed " << path << size.str() << ", " << why << std::endl;
  return true;
}

// Whether the checkpoint file at `path` is of another run than `run_id`: it records
// another run's id. Those without one (averages, files older than ids) and unreadable ones
// are no other run's. A resumed run's judgement, and the metrics directory's.
bool checkpoint_of_another_run(const std::string& path, const std::string& run_id) {
  const std::optional<CheckpointSummary> summary = read_checkpoint_summary(path);
  return summary && !summary->run_id.empty() && summary->run_id != run_id;
}

// The first three of `paths`, comma-separated, and ", ..." when there are more: what a
// refusal names of the files it counts.
std::string first_three_of(const std::vector<std::string>& paths) {
  std::string listed;
  for (size_t i = 0; i < paths.size() && i < 3; ++i) listed += (i ? ", " : "") + paths[i];
  if (paths.size() > 3) listed += ", ...";
  return listed;
}

}  // namespace

std::string run_metrics_path(const Config& config, const std::string& run_id,
                             const std::string& resumed_from, std::ostream& log) {
  namespace fs = std::filesystem;
  const std::string metrics = metrics_path(config);
  if (!config.train.metrics_dir.empty() || resumed_from.empty() || fs::exists(metrics)) {
    return metrics;
  }
  const fs::path parent = fs::path(config.checkpoint.dir).lexically_normal().parent_path();
  const std::string beside =
      (parent.empty() ? fs::path(kMetricsFileName) : parent / kMetricsFileName).string();
  if (!fs::exists(beside) || MetricsFile::last_run_id(beside) != run_id) return metrics;
  log << "note: this run's metrics file is " << beside << ", beside checkpoint.dir, where "
      << "runs started before 2026-11-28 wrote it; it goes on there (new runs write theirs "
      << "into checkpoint.dir; train.metrics_dir chooses)" << std::endl;
  return beside;
}

std::string foreign_run_files(const Config& config, const std::string& run_id,
                              const std::string& resumed_from, const std::string& metrics,
                              std::ostream& log, DirectoryChanges changes) {
  namespace fs = std::filesystem;
  const CheckpointConfig& options = config.checkpoint;
  // resume=auto that found nothing to resume: the first submission of a job, or a requeue
  // of one that saved nothing; its checkpoint.dir is its own by the command line, and so is
  // its metrics file, unless that file's last run kept its checkpoints in another
  // directory: another run's, which appending would make unresumable (its file's last run
  // no longer its own) and whose curves it would mix with this one's. Its metrics
  // directory is then taken as a new run's.
  // A recorded directory that is not there any more is this one moved (a run directory
  // renamed, or mounted elsewhere in a container: refused as another run's, a review's
  // finding); no other run resumes from it. So is a directory recorded where a copy of
  // this one's would be: the metrics file in checkpoint.dir (the default) or in a folder
  // above it (RUN/metrics.jsonl for RUN/ck) and the recorded directory ending as
  // checkpoint.dir does below it: the run directory copied (cp -r run copy), whose refusal
  // named the original as the run to continue, and a run there would train in it.
  const std::string metrics_run_dir = MetricsFile::last_run_checkpoint_dir(metrics);
  std::error_code error;
  const fs::path metrics_dir =
      fs::path(metrics).has_parent_path() ? fs::path(metrics).parent_path() : fs::path(".");
  const bool recorded_as_a_copy_would_be = [&] {
    if (metrics_run_dir.empty()) return false;
    std::error_code unresolved;
    const fs::path below =
        fs::weakly_canonical(fs::absolute(options.dir, unresolved), unresolved)
            .lexically_relative(
                fs::weakly_canonical(fs::absolute(metrics_dir, unresolved), unresolved));
    if (unresolved || below.empty() || *below.begin() == "..") return false;
    // The recorded directory's last components are `below`'s ("." is none).
    fs::path recorded = fs::path(metrics_run_dir).lexically_normal();
    if (!recorded.has_filename()) recorded = recorded.parent_path();
    std::vector<fs::path> parts(below.begin(), below.end());
    for (auto part = parts.rbegin(); part != parts.rend(); ++part) {
      if (*part == "." || part->empty()) continue;
      if (recorded.filename() != *part) return false;
      recorded = recorded.parent_path();
    }
    return true;
  }();
  const bool metrics_of_another_directory =
      !recorded_as_a_copy_would_be && !metrics_run_dir.empty() &&
      fs::exists(metrics_run_dir, error) &&
      fs::absolute(options.dir, error).lexically_normal() != fs::path(metrics_run_dir) &&
      !fs::equivalent(options.dir, metrics_run_dir, error);
  const bool found_nothing = !options.resume.empty() && resumed_from.empty();
  // ... unless that file's last run wrote checkpoints, which are gone (a finished run's
  // directory cleaned of its .h5 files and used again): not a start that saved nothing,
  // and the new run's records appended to that run's (before: without a word, and the
  // plots drew the new run alone, a helper's sweep).
  // (Step checkpoints there, all damaged, are auto_or_fresh's choice to start over: moved
  // aside, not lost. A best.h5 or an average left there would be written over; a
  // step_*.h5.corrupt is evidence kept, not a checkpoint.)
  const bool step_files_there = [&] {
    std::error_code unreadable;
    for (const fs::directory_entry& entry : fs::directory_iterator(options.dir, unreadable)) {
      const std::string name = entry.path().filename().string();
      // (a step_*.h5.corrupt is no run's file to resume: a cleaned directory may keep it)
      if (is_step_checkpoint_name(name)) return true;
    }
    return false;
  }();
  int64_t lost_at_step = 0;
  const int64_t lost_checkpoints =
      found_nothing && !metrics_of_another_directory && !step_files_there
          ? MetricsFile::last_run_checkpoints_written(metrics, &lost_at_step)
          : 0;
  if (found_nothing && !metrics_of_another_directory && lost_checkpoints == 0) return "";
  const bool fresh = options.resume.empty() || found_nothing;
  std::vector<std::string> foreign;
  for (const fs::directory_entry& entry : fs::directory_iterator(options.dir, error)) {
    const std::string name = entry.path().filename().string();
    // (found nothing: what checkpoint.dir holds resume=auto has judged already; but for the
    // best files and averages a run whose checkpoints are gone left there, which a new run
    // would write over)
    if (!is_run_checkpoint_file(name) || (found_nothing && lost_checkpoints == 0)) continue;
    // A resumed run owns the files of its own id (and those written before ids were).
    if (fresh || checkpoint_of_another_run(entry.path().string(), run_id)) {
      foreign.push_back(entry.path().string());
    }
  }
  // Record files that hold no value: a "run" record and a file-version record.
  std::vector<std::string> without_values;
  bool has_records = false;
  const std::string metrics_run = MetricsFile::last_run_id(metrics, &has_records);
  bool metrics_foreign = false;
  if (fresh && has_records && MetricsFile::records_no_value(metrics)) {
    without_values.push_back(metrics);
  } else if (fresh ? has_records : (!metrics_run.empty() && metrics_run != run_id)) {
    foreign.push_back(metrics);
    metrics_foreign = true;
  }
  // TensorBoard's files carry no run id: a fresh run's directory has none, and beside
  // another run's metrics file they are that run's (a resumed run's refusal named the
  // metrics file alone, and checkpoint.overwrite left the events: TensorBoard drew both
  // runs; a helper's walk).
  if (fresh || metrics_foreign) {
    for (const fs::directory_entry& entry : fs::directory_iterator(metrics_dir, error)) {
      if (entry.path().filename().string().rfind(kEventFilePrefix, 0) != 0) continue;
      if (event_file_records_no_value(entry.path().string())) {
        without_values.push_back(entry.path().string());
      } else {
        foreign.push_back(entry.path().string());
      }
    }
  }
  // Alone, they are what a start that failed after opening them left (a full disk, the
  // first batch): nothing of a run, which must not make the next start fail; removed, said.
  // Beside another run's files they are that run's (killed before it logged a value, after
  // its checkpoints; its metrics file holds its id): kept, refused or deleted with them
  // (before: removed by the start that was then refused).
  if (foreign.empty()) {
    for (const std::string& path : without_values) {
      // Not removed: appended to (a metrics file), or left beside this run's (an event file).
      std::error_code kept;
      remove_saying_why(path, "left by a start that recorded no value", changes, log, kept);
    }
    return "";
  }
  foreign.insert(foreign.end(), without_values.begin(), without_values.end());
  std::sort(foreign.begin(), foreign.end());
  if (options.overwrite) {
    // A file that stays is refused as if overwrite were off (before: "removed", and the run
    // went on beside it).
    std::string kept;
    for (const std::string& path : foreign) {
      if (!remove_saying_why(path, "a file of an earlier run (checkpoint.overwrite = true)",
                             changes, log, error) &&
          error && kept.empty()) {  // (not there any more: nothing to delete)
        kept = path + " (" + error.message() + ")";
      }
    }
    if (kept.empty()) return "";
    return "checkpoint.overwrite = true could not delete " + kept + ", a file of an earlier "
           "run in checkpoint.dir " + options.dir + " or its metrics directory: delete it "
           "yourself, or give this run another checkpoint.dir";
  }
  std::ostringstream message;
  // In a job of jobs/ the run's name chooses its directories (a helper's sweep was told to
  // set checkpoint.dir, which the job's script sets).
  const std::string job = job_run_name_of(options.dir);
  const std::string another_directory =
      job.empty() ? "another checkpoint.dir (and train.metrics_dir)"
                  : "another THPC_RUN_NAME than " + job + " (a job of jobs/ trains in "
                    "runs/THPC_RUN_NAME)";
  if (lost_checkpoints > 0) {
    message << "checkpoint.resume = " << options.resume << " found nothing to resume in "
            << "checkpoint.dir " << options.dir << ", but its metrics file " << metrics
            << " records the " << lost_checkpoints << " checkpoint"
            << (lost_checkpoints > 1 ? "s" : "") << " of run "
            << MetricsFile::last_run_id(metrics) << " (its last summary at step " << lost_at_step
            << "), which are no longer there (deleted or moved): a new run would append its "
            << "records to that run's, and its plots would draw the new curves alone";
    const auto left = static_cast<size_t>(std::count_if(
        foreign.begin(), foreign.end(),
        [](const std::string& path) { return is_run_checkpoint_file(path); }));
    if (left > 0) {
      message << ", and write over the " << left << " file" << (left > 1 ? "s" : "")
              << " of that run left in checkpoint.dir (";
      size_t said = 0;
      for (const std::string& path : foreign) {
        if (!is_run_checkpoint_file(path) || said == 3) continue;
        message << (said++ ? ", " : "") << path;
      }
      message << (left > 3 ? ", ...)" : ")");
    }
    message << "; give this run " << another_directory << ", move " << metrics
            << " and its event files" << (left > 0 ? " and those files" : "")
            << " away, or set checkpoint.overwrite = true to delete them first";
    return message.str();
  }
  message << "checkpoint.dir " << options.dir << " and the directory of its metrics file "
          << metrics << " hold " << foreign.size() << " file" << (foreign.size() > 1 ? "s" : "")
          << " of another run";
  if (!fresh) message << " than the one resumed from " << resumed_from << " (run " << run_id << ")";
  message << " (";
  message << first_three_of(foreign);
  message << "): a " << (fresh ? "new" : "resumed") << " run there would prune or replace them "
          << "and mix its metrics with theirs"
          << (found_nothing ? " (checkpoint.resume = " + options.resume + " found nothing to "
                                  "resume in checkpoint.dir)"
                            : std::string())
          << "; ";
  // That run's own directory, when its metrics say it is another one (a shared
  // train.metrics_dir): resume=auto with this run's would find nothing there.
  if (metrics_of_another_directory) {
    message << "continue that run with --checkpoint.dir=" << metrics_run_dir
            << " --checkpoint.resume=auto, ";
  } else if (fresh && std::any_of(foreign.begin(), foreign.end(), [](const std::string& path) {
               return is_step_checkpoint_name(path);
             })) {
    // (only where a step checkpoint is left to continue from: after a cleaning, the advice
    // led to the refusal of a cleaned directory used again; a helper's sweep)
    message << "continue that run with --checkpoint.resume=auto, ";
  }
  message << "give this run " << another_directory << ", or set checkpoint.overwrite = true "
          << "to delete them first";
  return message.str();
}

namespace {

// The files a run reads, (what names it, path): the config file, checkpoint.init, the
// checkpoint resumed from, and data.dir's shards and spm.model. A checkpoint's name is not
// data's (a run's checkpoints in data.dir = checkpoint.dir are not read as data: they were
// refused as "a file of data.dir", a helper's finding), unless it is a shard's too
// (data.train = average_last_x). Its outputs must spare every one.
std::vector<std::pair<std::string, std::string>> files_the_run_reads(
    const Config& config, const std::string& resumed_from) {
  namespace fs = std::filesystem;
  std::vector<std::pair<std::string, std::string>> inputs = {
      {"the config file", config.source_file},
      {"checkpoint.init", config.checkpoint.init},
      {"the checkpoint resumed from", resumed_from}};
  std::error_code error;
  if (!config.data.dir.empty()) {
    for (const fs::directory_entry& entry : fs::directory_iterator(config.data.dir, error)) {
      const std::string name = entry.path().filename().string();
      const bool shard = is_shard_file_name(name, config.data.train) ||
                         is_shard_file_name(name, config.data.valid);
      if (name == "spm.model" ||
          (entry.path().extension() == ".h5" && (shard || !is_run_checkpoint_file(name)))) {
        inputs.emplace_back("a file of data.dir", entry.path().string());
      }
    }
  }
  return inputs;
}

}  // namespace

std::string standard_output_into_an_input(const Config& config) {
  namespace fs = std::filesystem;
  // (before the start is chosen: checkpoint.resume's file when it names one, and the
  // files of checkpoint.dir auto would choose among)
  const bool resume_names_a_file =
      config.checkpoint.resume != "auto" && config.checkpoint.resume != "auto_or_fresh";
  std::vector<std::string> inputs = {config.eval_checkpoint, metrics_path(config)};
  for (const auto& [what, path] :
       files_the_run_reads(config, resume_names_a_file ? config.checkpoint.resume : "")) {
    inputs.push_back(path);
  }
  std::error_code error;
  for (const fs::directory_entry& entry : fs::directory_iterator(config.checkpoint.dir, error)) {
    if (is_training_run_file(entry.path().string())) inputs.push_back(entry.path().string());
  }
  const std::string input = input_standard_output_is(inputs);
  if (input.empty()) return "";
  return "standard output is " + input + ", a file this run reads or keeps: its lines would "
         "be written into it; redirect the output to another file (> train.log)";
}

std::string outputs_that_would_destroy_inputs(const Config& config,
                                              const std::string& resumed_from,
                                              const std::string& metrics) {
  namespace fs = std::filesystem;
  const std::vector<std::pair<std::string, std::string>> inputs =
      files_the_run_reads(config, resumed_from);
  std::error_code error;
  for (const auto& [what, input] : inputs) {
    if (!input.empty() && same_file(metrics, input)) {
      return "the metrics file " + metrics + " is " + what + " " + input +
             " (the same file): the run would append its records to it; give "
             "train.metrics_dir another directory";
    }
  }
  // A metrics "file" that cannot be one (a directory, a named pipe, a socket, a link to
  // nothing): training failed when it opened it (exit 1), or waited on the pipe for ever,
  // deaf to signals. (/dev/null, a character device, takes the records and is let be.)
  if (const std::string what = MetricsFile::unfit_for_records(metrics); !what.empty()) {
    return "the metrics file " + metrics + " is " + what + ": move it, or give "
           "train.metrics_dir another directory";
  }
  if (!MetricsFile::is_metrics_file(metrics)) {
    return "the metrics file " + metrics + " exists and is not a run's metrics file (JSON "
           "lines starting {\"kind\": ...): the run would append to it; move it, or give "
           "train.metrics_dir another directory";
  }
  // checkpoint.overwrite deletes another run's files: never one this run reads.
  if (config.checkpoint.overwrite && config.checkpoint.resume.empty()) {
    for (const fs::directory_entry& entry : fs::directory_iterator(config.checkpoint.dir, error)) {
      if (!is_run_checkpoint_file(entry.path().string())) continue;
      for (const auto& [what, input] : inputs) {
        if (!input.empty() && same_file(entry.path().string(), input)) {
          // The input's own spelling only where it differs from the file's (a file of
          // data.dir is listed by its path: "X, which is a file of data.dir X" read garbled).
          const std::string spelt = input == entry.path().string() ? "" : " " + input;
          return "checkpoint.overwrite = true would delete " + entry.path().string() +
                 ", which is " + what + spelt + " of this run; copy it out of "
                 "checkpoint.dir " + config.checkpoint.dir + " first, or give this run another "
                 "checkpoint.dir";
        }
      }
    }
  }
  return "";
}


// ---- the lock ---------------------------------------------------------------------

namespace {

std::string environment(const char* name) {
  const char* value = std::getenv(name);
  return value ? value : "";
}

// What a lock file says of its holder: its KEY=VALUE lines.
struct LockHolder {
  std::map<std::string, std::string> fields;
  std::string first_line;  // the file's first line as found, for a lock that names no holder
  std::string field(const std::string& key) const {
    const auto found = fields.find(key);
    return found == fields.end() ? "" : found->second;
  }
  long long number(const std::string& key) const {
    const std::string text = field(key);
    char* end = nullptr;
    const long long value = std::strtoll(text.c_str(), &end, 10);
    return !text.empty() && end && *end == '\0' ? value : -1;
  }
  // The fields a lock of ours always has.
  bool complete() const { return !field("host").empty() && number("pid") > 0; }
  // "host H, pid P, started YYYY-MM-DD HH:MM:SS UTC[, Slurm job J]".
  std::string describe() const {
    if (!complete()) return "a holder it does not name";
    std::ostringstream text;
    text << "host " << field("host") << ", pid " << number("pid");
    const long long started = number("started");
    if (started > 0) {
      const std::time_t when = static_cast<std::time_t>(started);
      std::tm utc{};
      gmtime_r(&when, &utc);
      char stamp[32];
      std::strftime(stamp, sizeof stamp, "%Y-%m-%d %H:%M:%S UTC", &utc);
      text << ", started " << stamp;
    }
    if (!field("slurm_job").empty()) text << ", Slurm job " << field("slurm_job");
    return text.str();
  }
};

std::optional<LockHolder> read_holder(const std::string& path, std::string* text) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  LockHolder holder;
  std::string line;
  text->clear();
  // A lock is a few lines; a larger file is not one of ours (read no more of it).
  while (text->size() < 4096 && std::getline(in, line)) {
    if (text->empty()) holder.first_line = line;
    *text += line + "\n";
    const size_t equals = line.find('=');
    if (equals == std::string::npos) continue;
    holder.fields[line.substr(0, equals)] = line.substr(equals + 1);
  }
  return holder;
}

// Seconds since the lock was last refreshed (its modification time), or -1.
double seconds_since_refresh(const std::string& path) {
  struct stat status {};
  if (::stat(path.c_str(), &status) != 0) return -1;
  const double modified = static_cast<double>(status.st_mtim.tv_sec) +
                          1e-9 * static_cast<double>(status.st_mtim.tv_nsec);
  const double now = std::chrono::duration<double>(
                         std::chrono::system_clock::now().time_since_epoch()).count();
  return std::max(0.0, now - modified);
}

// The fields of /proc/PID/stat after the command (field 3, the state, first); nothing when
// the process is not there or the file cannot be read.
std::optional<std::vector<std::string>> process_stat_fields(long long pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string text;
  if (!std::getline(stat, text)) return std::nullopt;
  // Field 2, the command, is in parentheses and may hold spaces: count after its end.
  const size_t after_command = text.rfind(')');
  if (after_command == std::string::npos) return std::nullopt;
  std::istringstream stream(text.substr(after_command + 1));
  std::vector<std::string> fields;
  for (std::string field; stream >> field;) fields.push_back(field);
  return fields;
}

// When process `pid` of this host started, in seconds since the epoch (/proc/PID/stat's
// start time after boot, /proc/stat's boot time); nothing when it cannot be read.
std::optional<long long> process_start_epoch(long long pid) {
  const std::optional<std::vector<std::string>> fields = process_stat_fields(pid);
  constexpr size_t kStartTime = 22 - 3;  // field 22, starttime, in clock ticks after boot
  if (!fields || fields->size() <= kStartTime) return std::nullopt;
  const unsigned long long ticks_after_boot = std::strtoull((*fields)[kStartTime].c_str(),
                                                            nullptr, 10);
  std::ifstream system_stat("/proc/stat");
  long long boot = -1;
  for (std::string line; std::getline(system_stat, line);) {
    if (line.rfind("btime ", 0) == 0) boot = std::atoll(line.c_str() + 6);
  }
  const long ticks_per_second = ::sysconf(_SC_CLK_TCK);
  if (boot < 0 || ticks_per_second <= 0) return std::nullopt;
  return boot + static_cast<long long>(ticks_after_boot / ticks_per_second);
}

// Whether process `pid` of this host has ended and waits only to be collected by its
// parent (state Z, a zombie; X, dead): kill(pid, 0) still finds it, and a container whose
// first process collects none keeps it for ever.
bool process_has_ended(long long pid) {
  const std::optional<std::vector<std::string>> fields = process_stat_fields(pid);
  return fields && !fields->empty() && (fields->front() == "Z" || fields->front() == "X");
}

// This process's PID namespace ("pid:[4026531836]"), "" when /proc does not say: a
// container (Apptainer --containall, unshare --pid) on the same host numbers its processes
// apart, so a pid there is not one that kill() here can look for.
std::string pid_namespace() {
  char target[64];
  const ssize_t length = ::readlink("/proc/self/ns/pid", target, sizeof target - 1);
  return length > 0 ? std::string(target, static_cast<size_t>(length)) : std::string();
}

// Why the lock of `holder`, refreshed `age` seconds ago, may be taken over; "" when it
// is held.
std::string stale_reason(const LockHolder& holder, double age, const std::string& host) {
  if (!holder.complete()) {
    // An exclusive create and its write are not one step: a trainer taking the lock right
    // now has an empty file for a moment. One that stays so was left by a crash then.
    if (age > kRunLockRefreshSeconds) {
      return "it has named none for " + std::to_string(static_cast<long long>(age)) + " s";
    }
    return "";
  }
  const long long pid = holder.number("pid");
  // A holder in another PID namespace of this host is judged as another host's is (before:
  // its pid, absent from ours, read as a process gone, and a live trainer's lock was taken).
  const std::string namespace_here = pid_namespace();
  const bool same_namespace = holder.field("pidns").empty() || namespace_here.empty() ||
                              holder.field("pidns") == namespace_here;
  if (holder.field("host") == host && same_namespace) {
    if (::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) return "its process is gone";
    if (process_has_ended(pid)) {
      return "its process is gone (ended, not yet collected by its parent: a zombie)";
    }
    // Its process id belongs to a process of this host. One started after the lock was
    // taken is another that got the id since; the holder itself holds it however long it
    // has not refreshed it (a trainer suspended by Ctrl-Z, SIGSTOP or a debugger: its
    // refresh thread stops too, and taking its lock over let two trainers write here).
    const std::optional<long long> process_started = process_start_epoch(pid);
    const long long lock_started = holder.number("started");
    // (Only for a lock not refreshed for two periods: a clock stepped forward after the
    // lock was taken moves the boot time that the start time is counted from.)
    if (process_started && lock_started > 0 && *process_started > lock_started + 60 &&
        age > 2 * kRunLockRefreshSeconds) {
      return "its process is gone (process " + std::to_string(pid) + " of this host started "
             "after the lock was taken)";
    }
    return "";
  }
  // A requeued Slurm job keeps its id and counts its restarts: a lock of an earlier run of
  // this job was left by a process Slurm has ended (on whichever node it ran).
  const std::string job = environment("SLURM_JOB_ID");
  const long long restart = std::atoll(environment("SLURM_RESTART_COUNT").c_str());
  const long long holder_restart = holder.number("slurm_restart");
  if (!job.empty() && holder.field("slurm_job") == job && holder_restart < restart) {
    return "it was left by an earlier run (restart " + std::to_string(holder_restart) +
           ") of this Slurm job, which is at restart " + std::to_string(restart);
  }
  if (age > kRunLockStaleSeconds) {
    return "it was last refreshed " + std::to_string(static_cast<long long>(age)) +
           " s ago (a live holder refreshes it every " + std::to_string(kRunLockRefreshSeconds) +
           " s)";
  }
  return "";
}

// Creates `path` only if it does not exist, with `contents`, flushed to the disk.
// 0, or the errno of what failed (EEXIST: it exists).
int create_exclusively(const std::string& path, const std::string& contents) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) return errno;
  size_t written = 0;
  int failure = 0;
  while (written < contents.size()) {
    const ssize_t n = ::write(fd, contents.data() + written, contents.size() - written);
    if (n < 0) {
      if (errno == EINTR) continue;
      failure = errno;
      break;
    }
    written += static_cast<size_t>(n);
  }
  if (failure == 0 && ::fsync(fd) != 0) failure = errno;
  if (::close(fd) != 0 && failure == 0) failure = errno;
  if (failure != 0) ::unlink(path.c_str());
  return failure;
}

}  // namespace

namespace {

// The trainer's lock file in a directory it uses.

// The lock file `name` of directory `dir` ("" is the working directory).
std::string lock_path(const std::string& dir, const std::string& name) {
  return (std::filesystem::path(dir.empty() ? "." : dir) / name).string();
}

}  // namespace

std::string run_lock_path(const std::string& dir) { return lock_path(dir, kTrainerLockName); }

// Refreshes the lock's modification time every kRunLockRefreshSeconds until destroyed,
// while the lock is still this holder's (`contents`): one removed by hand or taken over
// (its holder looked gone) is not refreshed for another, and the run says once that it no
// longer holds its directory.
struct RunLock::Refresher {
  Refresher(std::string path, std::string contents, std::string holder)
      : thread([this, path = std::move(path), contents = std::move(contents),
                holder = std::move(holder)] {
          std::unique_lock<std::mutex> guard(mutex);
          while (!stopping) {
            wake.wait_for(guard, std::chrono::seconds(kRunLockRefreshSeconds),
                          [this] { return stopping; });
            if (stopping) break;
            std::string text;
            const bool read = read_holder(path, &text).has_value();
            if (read && text == contents) {
              ::utimensat(AT_FDCWD, path.c_str(), nullptr, 0);  // now
              continue;
            }
            // A read that failed for another reason than its absence (a shared
            // filesystem's passing error) is tried again at the next period.
            struct stat status {};
            if (!read && (::stat(path.c_str(), &status) == 0 || errno != ENOENT)) continue;
            keep_at_abrupt_stop(path);  // no longer ours: a second Ctrl-C leaves it
            std::cerr << "warning: the lock " << path << " is no longer this " << holder
                      << "'s (removed, or taken over by another " << holder << " that found "
                      << "it stale): another " << holder << " may now write in its "
                      << "directory; stop one of them" << std::endl;
            break;
          }
        }) {}
  ~Refresher() {
    {
      const std::lock_guard<std::mutex> guard(mutex);
      stopping = true;
    }
    wake.notify_all();
    thread.join();
  }
  std::mutex mutex;
  std::condition_variable wake;
  bool stopping = false;
  std::thread thread;  // last: started once the members it uses exist
};

namespace {

// The trainer's use of a directory: checkpoint.dir (the run directory) or another
// setting's (train.metrics_dir).
LockedUse trainer_use(const std::string& dir, const std::string& key) {
  const bool metrics_only = key != "checkpoint.dir";
  LockedUse use;
  use.lock_name = kTrainerLockName;
  use.holder = "trainer";
  use.holders = "trainers";
  use.key = key;
  use.named = metrics_only ? "the metrics directory " + dir + " (" + key + ")"
                           : "the run directory " + dir;
  use.unwritable = metrics_only ? use.named : use.named + " (" + key + ")";
  use.clash = metrics_only ? "interleave their metrics, and a new run would remove or "
                             "overwrite the other's files there."
                           : "interleave their metrics and overwrite each other's checkpoints.";
  use.found_now = "found now rather than at the first checkpoint";
  return use;
}

// Why `use` cannot take the lock at `path`: `holder` holds it, refreshed `age` seconds ago.
std::string in_use_refusal(const LockedUse& use, const LockHolder& holder,
                           const std::string& path, double age) {
  const std::string job = use.holder == "trainer"
                              ? job_run_name_of(std::filesystem::path(path).parent_path())
                              : std::string();
  const std::string in_a_job =
      job.empty() ? "" : " (in a job of jobs/: another THPC_RUN_NAME than " + job + ")";
  std::ostringstream message;
  if (!holder.complete()) {
    // Not a holder to wait for, most likely: a file written by hand or by another program,
    // or a trainer's lock that a crash cut short between its creation and its write.
    // (stale_reason takes it over once it is kRunLockRefreshSeconds old.)
    std::string found = holder.first_line.substr(0, 60);
    for (char& c : found) {
      if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) c = '?';
    }
    message << use.named << " has a lock, " << path << ", that names no " << use.holder
            << " (made or touched " << static_cast<long long>(age) << " s ago; "
            << (found.empty() ? std::string("it is empty")
                              : "it begins \"" + found + "\"")
            << "): a " << use.holder << " taking a lock writes its host and process into it "
            << "at once, so either one is starting there now or the file is no lock of ours. "
            << "Such a lock is taken over once it is " << kRunLockRefreshSeconds
            << " s old: start again in a minute, or give this run another " << use.key
            << in_a_job << "; remove " << path << " by hand if you know no " << use.holder
            << " uses the directory";
    return message.str();
  }
  message << use.named << " is in use by another " << use.holder << " (" << holder.describe()
          << "; its lock " << path << " was refreshed " << static_cast<long long>(age)
          << " s ago): two " << use.holders << " on one directory would " << use.clash
          << " Wait for it to end or stop it, or give this run another " << use.key << in_a_job
          << ". "
          << "A lock whose holder is gone is taken over when its process is missing on "
          << "this host, when it is an earlier run of this Slurm job on another node, or, "
          << "for another host's holder (or another PID namespace's: a container), "
          << kRunLockStaleSeconds / 60 << " minutes after its last refresh; remove " << path
          << " by hand only if you know its " << use.holder << " is gone";
  return message.str();
}

// Why `dir` cannot be the directory of `use`, before anything is made: it, or the nearest
// of its parents that exists (which it would be created in), is a file or cannot be
// written by this user. "" when it can.
// `dir`, or the nearest of its parents that exists: where it would be created.
std::filesystem::path nearest_existing(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code error;
  fs::path existing = dir.empty() ? fs::path(".") : fs::path(dir);
  // (symlink_status: a symbolic link to nothing is there, and creating the directory over
  // it fails)
  while (fs::symlink_status(existing, error).type() == fs::file_type::not_found) {
    const fs::path parent = existing.parent_path();
    if (parent == existing) break;  // the root
    existing = parent.empty() ? fs::path(".") : parent;  // a relative name: the working dir
  }
  return existing;
}

std::string directory_refusal(const std::string& dir, const LockedUse& use) {
  namespace fs = std::filesystem;
  const std::string cannot_write = use.unwritable + " cannot be written: ";
  std::error_code error;
  const fs::path wanted = dir.empty() ? fs::path(".") : fs::path(dir);
  const fs::path existing = nearest_existing(dir);
  const fs::file_type type = fs::status(existing, error).type();
  if (type != fs::file_type::directory) {
    // (there, by symlink_status: a link, when following it finds nothing)
    const std::string what = type == fs::file_type::not_found ? " is a symbolic link to nothing"
                             : error ? " cannot be followed (" + error.message() + ")"
                                     : " is no directory";
    return cannot_write + existing.string() + what + "; give " + use.key +
           " a directory this user can write";
  }
  // (the effective user's rights, as creating a file there uses)
  if (::faccessat(AT_FDCWD, existing.c_str(), W_OK | X_OK, AT_EACCESS) != 0) {
    const std::string reason = std::strerror(errno);  // before anything else can set errno
    return cannot_write +
           (existing != wanted
                ? "it would be created in " + existing.string() + ", which this user cannot write"
                : std::string("this user cannot write it")) +
           " (" + reason + "); make it writable or give " + use.key + " another directory";
  }
  // Root passes faccessat wherever the permissions are, and a kernel's file system then
  // refuses by itself: /proc and /sys take no directory (mkdir fails), a cgroup file
  // system takes one as a new cgroup and no files in it. The dry run passed such a
  // checkpoint.dir that training refused.
  struct statfs file_system {};
  if (::statfs(existing.c_str(), &file_system) == 0) {
    const auto magic = file_system.f_type;
    const char* kernel = magic == PROC_SUPER_MAGIC      ? "proc"
                         : magic == SYSFS_MAGIC         ? "sysfs"
                         : magic == CGROUP_SUPER_MAGIC  ? "cgroup"
                         : magic == CGROUP2_SUPER_MAGIC ? "cgroup2"
                                                        : nullptr;
    if (kernel != nullptr) {
      return cannot_write +
             (existing != wanted ? "it would be created in " + existing.string() + ", which"
                                 : existing.string()) +
             " is on the kernel's " + kernel + " file system and holds no files of a run; " +
             "give " + use.key + " a directory on a disk";
    }
  }
  return "";
}

// What taking the lock of `dir` for `use` would refuse, taking nothing and creating
// nothing: a directory that cannot be made or written, or a live holder; a stale lock
// that would be taken over is said on `notes`.
std::string lock_refusal_without_taking(const std::string& dir, const LockedUse& use,
                                        std::ostream& notes) {
  if (std::string refusal = directory_refusal(dir, use); !refusal.empty()) return refusal;
  const std::string path = lock_path(dir, use.lock_name);
  // No room for the lock, training's first file (not a block, or not an inode, left to
  // this user): training refuses the directory there, exit 2, as the dry run does now (it
  // passed such a checkpoint.dir: a helper's trial). Said as training says it.
  struct statvfs space {};
  const std::string existing = nearest_existing(dir).string();
  if (::statvfs(existing.c_str(), &space) == 0 && space.f_blocks > 0) {
    const bool root = ::geteuid() == 0;  // (who may use the blocks kept for root)
    const bool no_block = (root ? space.f_bfree : space.f_bavail) == 0;
    const bool no_inode = space.f_files > 0 && (root ? space.f_ffree : space.f_favail) == 0;
    if (no_block || no_inode) {
      return use.unwritable + " cannot be written: creating its lock " + path +
             " would fail (" + std::strerror(ENOSPC) + "): " +
             storage_advice(existing, "(errno 28)", 0) + " (give " + use.key +
             " another directory)";
    }
  }
  std::string text;
  const std::optional<LockHolder> holder = read_holder(path, &text);
  if (!holder) return "";
  const double age = seconds_since_refresh(path);
  const std::string reason = stale_reason(*holder, age, host_name());
  if (reason.empty()) return in_use_refusal(use, *holder, path, age);
  notes << "note: training would take over the lock " << path << " of " << holder->describe()
        << ": " << reason << std::endl;
  return "";
}

}  // namespace

RunLock::RunLock(const std::string& dir, std::ostream& log, const std::string& key)
    : RunLock(dir, log, trainer_use(dir, key)) {}

RunLock::RunLock(const std::string& dir, std::ostream& log, const LockedUse& use)
    : path_(lock_path(dir, use.lock_name)) {
  namespace fs = std::filesystem;
  const std::string& named = use.named;
  const std::string& key = use.key;
  const std::string host = host_name();
  std::ostringstream contents;
  contents << "host=" << host << "\npid=" << ::getpid() << "\nstarted="
           << std::chrono::duration_cast<std::chrono::seconds>(
                  std::chrono::system_clock::now().time_since_epoch()).count()
           << "\nslurm_job=" << environment("SLURM_JOB_ID")
           << "\nslurm_restart=" << std::atoll(environment("SLURM_RESTART_COUNT").c_str())
           << "\npidns=" << pid_namespace() << "\n";
  contents_ = contents.str();
  use_ = use;
  if (const std::string refusal = directory_refusal(dir, use); !refusal.empty()) {
    THPC_FAIL(refusal);
  }
  std::error_code error;
  for (fs::path missing = fs::path(path_).parent_path();
       !missing.empty() && !fs::exists(missing, error); missing = missing.parent_path()) {
    created_.push_back(missing.string());
  }
  fs::create_directories(fs::path(path_).parent_path(), error);
  const std::string cannot_write = use.unwritable + " cannot be written: ";
  if (error) {
    THPC_FAIL(cannot_write << "creating it failed (" << error.message() << "); give " << key
                           << " a directory this user can write");
  }
  // Taking a stale lock over renames it away first: of two holders doing so at once, one
  // rename succeeds, and the other finds the winner's fresh lock on its next attempt.
  for (int attempt = 0; attempt < 4; ++attempt) {
    const int failure = create_exclusively(path_, contents_);
    if (failure == 0) {
      hold();
      return;
    }
    if (failure != EEXIST) {
      // A full disk or quota, a read-only mount, a file-size limit: said as a checkpoint's
      // write says them (before: "a read-only filesystem? permissions?" for a full disk).
      const std::string storage =
          storage_advice(fs::path(path_).parent_path().string(),
                         "(errno " + std::to_string(failure) + ")", 0);
      THPC_FAIL(cannot_write << "creating its lock " << path_ << " failed ("
                             << std::strerror(failure) << "): " << use.found_now << "; "
                             << (storage.empty() ? "make it writable (a read-only filesystem? "
                                                   "permissions?) or give " + key +
                                                       " another directory"
                                                 : storage + " (give " + key +
                                                       " another directory)"));
    }
    std::string text;
    const std::optional<LockHolder> holder = read_holder(path_, &text);
    if (!holder) continue;  // removed meanwhile: try again
    const double age = seconds_since_refresh(path_);
    const std::string reason = stale_reason(*holder, age, host);
    if (reason.empty()) THPC_FAIL(in_use_refusal(use, *holder, path_, age));
    const std::string aside = path_ + ".stale." + std::to_string(::getpid());
    if (::rename(path_.c_str(), aside.c_str()) != 0) continue;  // another took it first
    ::unlink(aside.c_str());
    log << "note: taking over the lock " << path_ << " of " << holder->describe() << ": "
        << reason << std::endl;
  }
  THPC_FAIL("could not take the lock " << path_ << " of " << named
            << ": others kept taking it; is another " << use.holder << " starting there?");
}

void RunLock::hold() {
  refresher_.reset();  // joined: a refresher that found the lock gone has stopped
  refresher_ = std::make_unique<Refresher>(path_, contents_, use_.holder);
  keep_at_abrupt_stop(path_);  // one registration, however often the lock is taken
  remove_at_abrupt_stop(path_, contents_);
}

void RunLock::check_held(std::ostream& log) {
  namespace fs = std::filesystem;
  // A read that fails for another reason than the file's absence (a shared filesystem's
  // passing error) is tried again, and at last let pass, as the refresher lets it: a
  // checkpoint is no reason to end a run over one unreadable moment.
  int last_failure = 0;
  for (int attempt = 0; attempt < 3; ++attempt) {
    std::string text;
    const std::optional<LockHolder> holder = read_holder(path_, &text);
    if (holder && text == contents_) return;
    if (holder) {
      keep_at_abrupt_stop(path_);  // the other's now: a second Ctrl-C must not remove it
      THPC_FAIL("the lock " << path_ << " of " << use_.named << " is no longer this "
                << use_.holder << "'s: " << holder->describe() << " holds it (it took it "
                << "over while this one did not refresh it: suspended for "
                << kRunLockStaleSeconds / 60 << " minutes or more, or in another PID "
                << "namespace?). This " << use_.holder << " stops without writing there, so "
                << "as not to overwrite the other's files; once one " << use_.holder
                << " is left, resume it from the directory's newest checkpoint");
    }
    struct stat status {};
    const int unreadable = ::stat(path_.c_str(), &status) != 0 ? errno : EACCES;
    if (unreadable == ENOENT) {
      // Removed, or the whole directory deleted, while the run went on (by hand, a
      // cleaning script): made again, the directory too (its next file's write would make
      // it), and taken again if no one else has, so that a second trainer is kept out.
      std::error_code error;
      fs::create_directories(fs::path(path_).parent_path(), error);
      const int failure = create_exclusively(path_, contents_);
      if (failure == 0) {
        hold();
        log << "warning: the lock " << path_ << " had been removed (" << use_.named
            << " deleted or cleaned while this " << use_.holder << " ran?): taken again"
            << std::endl;
        return;
      }
      if (failure != EEXIST) {
        THPC_FAIL("the lock " << path_ << " of " << use_.named << " was removed and cannot be "
                  "made again (" << std::strerror(failure) << "): this " << use_.holder
                  << " stops without writing there");
      }
      continue;  // another made it meanwhile: read whose
    }
    last_failure = unreadable;
    std::this_thread::sleep_for(std::chrono::seconds(1));
  }
  log << "warning: the lock " << path_ << " could not be read (" << std::strerror(last_failure)
      << "): going on, as if it were still this " << use_.holder << "'s" << std::endl;
}

RunLock::~RunLock() {
  keep_at_abrupt_stop(path_);
  refresher_.reset();
  // Only our own lock: one taken over from us (we looked gone) is its new holder's.
  std::string text;
  if (read_holder(path_, &text) && text == contents_) ::unlink(path_.c_str());
  for (const std::string& dir : created_) {
    if (::rmdir(dir.c_str()) != 0) break;  // not empty: the run wrote there
  }
}

std::vector<std::unique_ptr<RunLock>> lock_run_directory(const Config& config,
                                                         const Communicator& comm,
                                                         std::ostream& log) {
  std::vector<std::unique_ptr<RunLock>> locks;
  std::string refusal;
  if (comm.is_root()) {
    try {
      locks.push_back(std::make_unique<RunLock>(config.checkpoint.dir, log));
      if (!config.train.metrics_dir.empty() &&
          !same_file(config.train.metrics_dir, config.checkpoint.dir)) {
        locks.push_back(std::make_unique<RunLock>(config.train.metrics_dir, log,
                                                  "train.metrics_dir"));
      }
    } catch (const Error& e) {
      refusal = e.what();
      locks.clear();
    }
  }
  // Every rank stops with rank 0's reason, before any checkpoint is read.
  refusal = comm.broadcast_from_root(refusal);
  if (!refusal.empty()) throw AllRanksError(refusal, 2);
  return locks;
}

// The temporary files of checkpoint writes (.NAME.tmp beside NAME, a run's checkpoint
// file) that a crash interrupted (SIGKILL, a node lost; any other ending removes its
// own): a base checkpoint's is 757 MB, and nothing else would ever remove it. Under the
// run directory's lock no write of them is under way.
void remove_interrupted_writes(const std::string& dir, std::ostream& log,
                               DirectoryChanges changes) {
  namespace fs = std::filesystem;
  std::error_code error;
  for (const fs::directory_entry& entry : fs::directory_iterator(dir, error)) {
    // The temporary of NAME is what temporary_path (io/atomic_file.h) makes of it.
    const std::string name = entry.path().filename().string();
    const std::string tmp = ".tmp";
    if (name.size() <= 1 + tmp.size()) continue;
    const std::string final_name = name.substr(1, name.size() - 1 - tmp.size());
    if (temporary_path(final_name) != name || !is_run_checkpoint_file(final_name)) continue;
    std::error_code kept;
    if (!entry.is_regular_file(kept)) continue;
    remove_saying_why(entry.path().string(), "a checkpoint's write that a crash interrupted",
                      changes, log, kept);
  }
}

namespace {

// A resume from a file outside checkpoint.dir into one that holds checkpoints of its run
// on another branch: "" or the refusal (claim_run_directory's account).
std::string another_branch_refusal(const Config& config, const std::string& run_id,
                                   const std::string& resumed_from, int64_t resumed_step,
                                   const std::vector<BranchStart>& resumed_lineage) {
  namespace fs = std::filesystem;
  const CheckpointConfig& options = config.checkpoint;
  // Nothing to train writes nothing (as a resume with no step left is not refused for
  // lowered keeping).
  if (resumed_from.empty() || options.overwrite || resumed_step >= config.train.max_steps) {
    return "";
  }
  // A file in checkpoint.dir or a folder of it (best_of_valid_HEX12/) is the run's own.
  std::error_code error;
  const fs::path beside =
      fs::weakly_canonical(fs::absolute(fs::path(resumed_from), error).parent_path(), error);
  const fs::path below =
      beside.lexically_relative(fs::weakly_canonical(fs::absolute(options.dir, error), error));
  if (!error && !below.empty() && *below.begin() != "..") return "";
  const std::vector<std::string> others =
      CheckpointKeeping(config).branch_changes(run_id, resumed_lineage, resumed_step).supersede;
  if (others.empty()) return "";
  std::ostringstream message;
  message << "checkpoint.dir " << options.dir << " holds " << others.size() << " checkpoint"
          << (others.size() > 1 ? "s" : "") << " of this run (" << run_id << ") that a resume "
          << "from " << resumed_from << " (step " << resumed_step << ") would abandon: ";
  message << first_three_of(others);
  message << " (trained there from that file before: a requeue of a job that resumes it, or "
          << "an earlier resume of it?); this one would mark them superseded (those of the "
          << "steps it reaches again moved into " << kAbandonedBranchesFolder << "/). Continue "
          << "them with "
          << "--checkpoint.resume=auto, give this resume another checkpoint.dir, or set "
          << "checkpoint.overwrite = true to abandon them (marked superseded, not deleted)";
  return message.str();
}

// train.metrics_dir set to another directory than checkpoint.dir that holds checkpoints
// of another run (typically that run's checkpoint.dir): "" or the refusal. A helper's
// walk: a second run given the first's checkpoint.dir as its metrics directory wrote its
// metrics.jsonl and TensorBoard events beside the first's step files, whose plots then
// drew the second run's curves as the first's. checkpoint.overwrite does not delete them:
// it is checkpoint.dir's, and they are another run's checkpoints.
std::string metrics_dir_of_another_runs_checkpoints(const Config& config,
                                                    const std::string& run_id,
                                                    const std::string& metrics) {
  namespace fs = std::filesystem;
  if (config.train.metrics_dir.empty()) return "";
  std::error_code error;
  const fs::path metrics_dir =
      fs::path(metrics).has_parent_path() ? fs::path(metrics).parent_path() : fs::path(".");
  if (!fs::is_directory(metrics_dir, error) ||
      fs::equivalent(metrics_dir, config.checkpoint.dir, error)) {
    return "";
  }
  std::vector<std::string> theirs;
  for (const fs::directory_entry& entry : fs::directory_iterator(metrics_dir, error)) {
    const std::string path = entry.path().string();
    // As a resumed run's files are judged: this run's averages left in its metrics
    // directory (no id) and damaged files are no other run's (a review's finding).
    if (is_run_checkpoint_file(path) && checkpoint_of_another_run(path, run_id)) {
      theirs.push_back(path);
    }
  }
  if (theirs.empty()) return "";
  std::sort(theirs.begin(), theirs.end());
  std::ostringstream message;
  message << "train.metrics_dir " << config.train.metrics_dir << " holds " << theirs.size()
          << " checkpoint file" << (theirs.size() > 1 ? "s" : "") << " of another run ("
          << first_three_of(theirs) << "): it is another run's checkpoint.dir, and this run's metrics file and "
          << "TensorBoard events there would be read as that run's; give train.metrics_dir "
          << "a directory of its own, or leave it out (the metrics then go into "
          << "checkpoint.dir " << config.checkpoint.dir << ")";
  return message.str();
}

// Rank 0's claim of the run directory, training's (DirectoryChanges::Make) or the dry
// run's (OnlySay): the metrics file (*metrics), the outputs that would destroy inputs,
// another run's files, another branch's checkpoints, a crash's interrupted writes. "" or
// the refusal.
std::string claim_refusal(const Config& config, const std::string& run_id,
                          const std::string& resumed_from, int64_t resumed_step,
                          const std::vector<BranchStart>& resumed_lineage, std::ostream& log,
                          DirectoryChanges changes, std::string* metrics) {
  *metrics = run_metrics_path(config, run_id, resumed_from, log);
  std::string refusal = outputs_that_would_destroy_inputs(config, resumed_from, *metrics);
  if (refusal.empty()) refusal = metrics_dir_of_another_runs_checkpoints(config, run_id, *metrics);
  if (refusal.empty()) {
    refusal = foreign_run_files(config, run_id, resumed_from, *metrics, log, changes);
  }
  if (refusal.empty()) {
    refusal =
        another_branch_refusal(config, run_id, resumed_from, resumed_step, resumed_lineage);
  }
  if (refusal.empty()) remove_interrupted_writes(config.checkpoint.dir, log, changes);
  return refusal;
}

}  // namespace

std::string claim_run_directory(const Config& config, const Communicator& comm,
                                const std::string& run_id, const std::string& resumed_from,
                                int64_t resumed_step,
                                const std::vector<BranchStart>& resumed_lineage,
                                std::ostream& log) {
  std::string metrics, refusal;
  if (comm.is_root()) {
    refusal = claim_refusal(config, run_id, resumed_from, resumed_step, resumed_lineage, log,
                            DirectoryChanges::Make, &metrics);
  }
  // Every rank stops with rank 0's reason, before anything is written.
  refusal = comm.broadcast_from_root(refusal);
  if (!refusal.empty()) throw AllRanksError(refusal, 2);
  return metrics;
}

std::string run_lock_refusal(const Config& config, std::ostream& notes) {
  std::string refusal = lock_refusal_without_taking(
      config.checkpoint.dir, trainer_use(config.checkpoint.dir, "checkpoint.dir"), notes);
  const std::string& metrics_dir = config.train.metrics_dir;
  // Training compares the two once checkpoint.dir is made: a link to it, made before it,
  // names it then (the link's target compared here).
  std::error_code error;
  std::filesystem::path target = metrics_dir;
  if (std::filesystem::is_symlink(metrics_dir, error)) {
    const std::filesystem::path link = std::filesystem::read_symlink(metrics_dir, error);
    target = link.is_absolute() ? link : std::filesystem::path(metrics_dir).parent_path() / link;
  }
  if (refusal.empty() && !metrics_dir.empty() && !same_file(metrics_dir, config.checkpoint.dir) &&
      !same_file(target.string(), config.checkpoint.dir)) {
    refusal = lock_refusal_without_taking(metrics_dir,
                                          trainer_use(metrics_dir, "train.metrics_dir"), notes);
  }
  return refusal;
}

std::string run_directory_refusal(const Config& config, const std::string& run_id,
                                  const std::string& resumed_from, int64_t resumed_step,
                                  const std::vector<BranchStart>& resumed_lineage,
                                  std::ostream& notes) {
  std::string metrics;
  return claim_refusal(config, run_id, resumed_from, resumed_step, resumed_lineage, notes,
                       DirectoryChanges::OnlySay, &metrics);
}

}  // namespace thpc
