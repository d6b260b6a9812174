#include "train/run_log.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <iomanip>
#include <sstream>
#include <string_view>

#include "common/error.h"
#include "io/atomic_file.h"
#include "io/run_file_names.h"
#include "metrics/tokenize.h"

namespace thpc {

namespace {

LogField make_field(const std::string& label, const std::string& key, double value,
                    const char* format, int digits, const std::string& unit) {
  LogField field{label, key, value, "n/a"};
  if (std::isfinite(value)) {
    char buffer[64];
    std::snprintf(buffer, sizeof buffer, format, digits, value);
    field.text = buffer + unit;
  }
  return field;
}

// Enough digits to read back the same double: the file keeps full precision, the line
// rounds.
std::string json_number(double value) {
  if (!std::isfinite(value)) return "null";
  char buffer[32];
  std::snprintf(buffer, sizeof buffer, "%.17g", value);
  return buffer;
}

}  // namespace

LogField fixed_field(const std::string& label, const std::string& key, double value,
                     int digits, const std::string& unit) {
  return make_field(label, key, value, "%.*f", digits, unit);
}

LogField scientific_field(const std::string& label, const std::string& key, double value,
                          int digits) {
  return make_field(label, key, value, "%.*e", digits, "");
}

LogField general_field(const std::string& label, const std::string& key, double value,
                       int digits) {
  return make_field(label, key, value, "%.*g", digits, "");
}

std::string log_line(const std::string& head, const std::vector<LogField>& fields) {
  std::string line = head;
  for (const LogField& field : fields) {
    line += (line.empty() ? "" : " | ") + field.label + " " + field.text;
  }
  return line;
}

std::string metrics_path(const Config& config) {
  const std::filesystem::path dir =
      !config.train.metrics_dir.empty()
          ? std::filesystem::path(config.train.metrics_dir)
          : std::filesystem::path(config.checkpoint.dir).lexically_normal();
  return (dir.empty() ? std::filesystem::path(kMetricsFileName) : dir / kMetricsFileName)
      .string();
}

namespace {

// The bytes of `path` ("" when it cannot be read).
std::string file_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// A JSON string literal: the run id and a path (which may hold quotes or backslashes, and
// bytes that are not UTF-8: a path is bytes). Such a byte XX is written \udcXX, as
// Python's surrogateescape decodes it (os.fsdecode): the file stays valid UTF-8 JSON, and
// os.fsencode of the value gives the path's bytes back (written raw, Python's json and
// tools/plot_metrics.py failed on the file with a UnicodeDecodeError).
std::string json_string(const std::string& text) {
  std::string quoted = "\"";
  const auto escape = [&](const char* format, unsigned char byte) {
    char escaped[8];
    std::snprintf(escaped, sizeof escaped, format, byte);
    quoted += escaped;
  };
  std::string_view rest = text;
  while (!rest.empty()) {
    size_t invalid_at = rest.size();
    if (metrics::decode_utf8(rest, &invalid_at)) invalid_at = rest.size();
    for (const char c : rest.substr(0, invalid_at)) {
      if (c == '"' || c == '\\') {
        quoted += '\\';
        quoted += c;
      } else if (c == '\n') {
        quoted += "\\n";  // as json.dumps writes it: a stored configuration's lines
      } else if (static_cast<unsigned char>(c) < 0x20) {
        escape("\\u%04x", static_cast<unsigned char>(c));
      } else {
        quoted += c;
      }
    }
    if (invalid_at == rest.size()) break;
    escape("\\udc%02x", static_cast<unsigned char>(rest[invalid_at]));
    rest.remove_prefix(invalid_at + 1);
  }
  return quoted + "\"";
}

}  // namespace

namespace {

// The string value of `key` in the last run record of `text` ("" when there is none, or the
// record has no such key). The trainer writes the record, so its form is known: no
// escaped quote is in an id; a path's are undone.
std::string last_run_record_string(const std::string& text, const std::string& key) {
  const std::string marker = "{\"kind\": \"run\", ";
  const size_t at = text.rfind(marker);
  if (at == std::string::npos) return "";
  const std::string quoted_key = "\"" + key + "\": \"";
  const size_t found = text.find(quoted_key, at);
  const size_t line_end = text.find('\n', at);
  if (found == std::string::npos || (line_end != std::string::npos && found > line_end)) {
    return "";
  }
  // Read back as json_string writes: \" and \\, \n, \u00XX for another control character
  // and \udcXX for a byte that is not UTF-8 (the low byte is the character in both).
  std::string value;
  for (size_t i = found + quoted_key.size(); i < text.size() && text[i] != '"'; ++i) {
    if (text[i] == '\\' && i + 1 < text.size()) {
      ++i;
      if (text[i] == 'n') {
        value += '\n';
        continue;
      }
      if (text[i] == 'u' && i + 4 < text.size()) {
        value += static_cast<char>(std::strtol(text.substr(i + 1, 4).c_str(), nullptr, 16) &
                                   0xff);
        i += 4;
        continue;
      }
    }
    value += text[i];
  }
  return value;
}

}  // namespace

std::string MetricsFile::last_run_id(const std::string& path, bool* has_records) {
  const std::string text = file_text(path);
  if (has_records) *has_records = text.find_first_not_of(" \t\r\n") != std::string::npos;
  return last_run_record_string(text, "run");
}

std::string MetricsFile::last_run_checkpoint_dir(const std::string& path) {
  return last_run_record_string(file_text(path), "checkpoint_dir");
}

int64_t MetricsFile::last_run_checkpoints_written(const std::string& path,
                                                  int64_t* last_summary_step) {
  const std::string text = file_text(path);
  const std::string last_run = last_run_record_string(text, "run");
  if (last_run.empty()) return 0;
  const std::string run_record = "{\"kind\": \"run\", ";
  const std::string summary = "{\"kind\": \"summary\", \"step\": ";
  const std::string count_key = "\"checkpoints\": ";
  std::istringstream lines(text);
  std::string line, run;
  int64_t written = 0;
  while (std::getline(lines, line)) {
    if (line.rfind(run_record, 0) == 0) {
      run = last_run_record_string(line, "run");
    } else if (run == last_run && line.rfind(summary, 0) == 0) {
      const size_t count_at = line.find(count_key);
      if (count_at == std::string::npos) continue;
      const int64_t count = std::strtoll(line.c_str() + count_at + count_key.size(), nullptr, 10);
      if (count <= 0) continue;
      written += count;
      if (last_summary_step) {
        *last_summary_step = std::strtoll(line.c_str() + summary.size(), nullptr, 10);
      }
    }
  }
  return written;
}

bool MetricsFile::records_no_value(const std::string& path) {
  std::istringstream lines(file_text(path));
  std::string line;
  bool any = false;
  while (std::getline(lines, line)) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    if (line.rfind("{\"kind\": \"run\", ", 0) != 0) return false;
    any = true;
  }
  return any;
}

std::string MetricsFile::unfit_for_records(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code error;
  if (fs::symlink_status(path, error).type() == fs::file_type::not_found) return "";
  const fs::file_type type = fs::status(path, error).type();
  return type == fs::file_type::directory   ? "a directory"
         : type == fs::file_type::fifo      ? "a named pipe"
         : type == fs::file_type::socket    ? "a socket"
         : type == fs::file_type::not_found ? "a symbolic link to nothing"
                                            : "";
}

bool MetricsFile::is_metrics_file(const std::string& path) {
  std::error_code error;
  if (!std::filesystem::exists(path, error)) return true;
  std::ifstream in(path, std::ios::binary);
  std::string head(10, '\0');
  in.read(head.data(), static_cast<std::streamsize>(head.size()));
  head.resize(static_cast<size_t>(in.gcount()));
  return head.empty() || head == "{\"kind\": \"";
}

MetricsFile::MetricsFile(const std::string& path) : path_(path) {
  if (!is_metrics_file(path)) {
    THPC_FAIL("the metrics file " << path << " exists and is not a run's metrics file (JSON "
                                  << "lines starting {\"kind\": ...); move it, or give "
                                  << "train.metrics_dir another directory");
  }
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  std::error_code error;
  if (!parent.empty()) std::filesystem::create_directories(parent, error);
  // A crash in the middle of a write leaves a last line without its newline; appending
  // after it would glue the next record to it, and both would be lost to a reader.
  const std::string existing = file_text(path);
  if (!existing.empty() && existing.back() != '\n') {
    const size_t kept = existing.rfind('\n') == std::string::npos ? 0 : existing.rfind('\n') + 1;
    std::filesystem::resize_file(path, kept, error);
    if (error) {
      THPC_FAIL("the metrics file " << path << " ends with a partial line (a write cut short) "
                                    << "that cannot be removed (" << error.message()
                                    << "); remove it by hand or set train.metrics_dir");
    }
    repair_note_ = "removed a partial last line of " + std::to_string(existing.size() - kept) +
                   " bytes from " + path + " (a write cut short)";
  }
  file_.open(path, std::ios::app);
  if (!file_) {
    THPC_FAIL("cannot open the metrics file " << path << " for appending ("
                                              << (error ? error.message() : std::strerror(errno))
                                              << "; train.metrics_dir chooses its directory)");
  }
  opened_ = file_at_path(path);
  events_ = EventFile(parent.empty() ? "." : parent.string());
}

void MetricsFile::write(const std::string& kind, int64_t step, double wall_s,
                        const std::vector<LogField>& fields,
                        const std::vector<std::pair<std::string, std::string>>& texts) {
  if (!file_.is_open()) return;
  const double now = std::chrono::duration<double>(
                         std::chrono::system_clock::now().time_since_epoch())
                         .count();
  std::ostringstream record;
  record << "{\"kind\": \"" << kind << "\", \"step\": " << step
         << ", \"wall_s\": " << json_number(wall_s) << ", \"time\": " << std::fixed
         << std::setprecision(3) << now;
  for (const LogField& field : fields) {
    record << ", \"" << field.key << "\": " << json_number(field.value);
  }
  for (const auto& [key, text] : texts) record << ", \"" << key << "\": " << json_string(text);
  record << "}\n";
  reopen_if_replaced(step);
  if (!file_.is_open()) return;
  // A record that cannot be written (a full disk or quota, a permission taken away) costs
  // the records, not the run: the run said "(disk full?)" and ended, without a checkpoint
  // of the steps since the last.
  try {
    append(record.str());
    std::vector<TaggedScalar> scalars = {{kind + "/wall_s", wall_s}};
    for (const LogField& field : fields) scalars.emplace_back(kind + "/" + field.key, field.value);
    events_.write_scalars(step, now, scalars);
  } catch (const Error& e) {
    give_up(e.what(), step);
  }
}

}  // namespace thpc

namespace thpc {

void MetricsFile::append(const std::string& record) {
  errno = 0;
  file_ << record << std::flush;
  if (!file_) {
    const int error = errno;  // the write's, which the stream keeps no record of
    THPC_FAIL("cannot write the metrics file " << path_ << " ("
              << (error != 0 ? std::strerror(error) : "an error of the stream") << ")");
  }
}

void MetricsFile::reopen_if_replaced(int64_t step) {
  namespace fs = std::filesystem;
  // What each name holds now: nothing (removed: its directory deleted or cleaned), the
  // file this run opened, or another (moved away and made again, replaced by a rename).
  enum class Now { Same, Removed, Replaced };
  const auto now_at = [](const std::string& path, const FileAtPath& opened) {
    std::error_code error;
    const auto type = fs::symlink_status(path, error).type();
    if (type == fs::file_type::not_found) return Now::Removed;  // (error set, or not)
    if (error) return Now::Same;  // (a name it cannot look at: the write says what fails)
    return file_at_path(path) == opened ? Now::Same : Now::Replaced;
  };
  const Now metrics = now_at(path_, opened_);
  const Now events = events_.path().empty() ? Now::Same : now_at(events_.path(), events_.opened());
  if (metrics == Now::Same && events == Now::Same) return;
  if (metrics == Now::Replaced) {
    // Appended to only when it is a file a run's records may go into (open would wait on a
    // named pipe for a reader for ever, and someone's text is not ours to append to).
    std::error_code error;
    std::string what = unfit_for_records(path_);
    if (what.empty() && fs::is_regular_file(path_, error) && !is_metrics_file(path_)) {
      what = "a file that is not a run's metrics file";
    }
    if (!what.empty()) {
      give_up("the metrics file " + path_ + " was replaced by " + what + " while the run "
              "wrote it", step, "move it away");
      return;
    }
  }
  const fs::path parent = fs::path(path_).parent_path();
  const std::string old_events = events_.path();
  try {
    std::error_code error;
    if (!parent.empty()) fs::create_directories(parent, error);
    if (metrics != Now::Same) {
      file_.close();
      file_.open(path_, std::ios::app);
      if (!file_) {
        THPC_FAIL("cannot open the metrics file " << path_ << " again ("
                                                  << std::strerror(errno) << ")");
      }
      opened_ = file_at_path(path_);
    }
    if (events != Now::Same) events_ = EventFile(parent.empty() ? "." : parent.string());
  } catch (const Error& e) {
    give_up(e.what(), step);
    return;
  }
  if (warnings_ == nullptr) return;
  const std::string removed = " had been removed (the run's directory deleted or cleaned while "
                              "it ran?): ";
  const std::string replaced = " had been replaced by another file (moved away or deleted, "
                               "and made again, while the run wrote it?): ";
  if (metrics == Now::Removed) {
    *warnings_ << "warning: the metrics file " << path_ << removed << "made again from step "
               << step << " on; its records before are lost" << std::endl;
  } else if (metrics == Now::Replaced) {
    *warnings_ << "warning: the metrics file " << path_ << replaced << "the records from step "
               << step << " on are appended to that file; those before are not in it"
               << std::endl;
  }
  // (the old event file's name is gone with it, or another's now: the new one's is said)
  if (events == Now::Removed) {
    *warnings_ << "warning: the TensorBoard event file" << removed << events_.path()
               << " holds the records from step " << step << " on" << std::endl;
  } else if (events == Now::Replaced) {
    *warnings_ << "warning: the TensorBoard event file " << old_events << replaced
               << events_.path() << " holds the records from step " << step << " on"
               << std::endl;
  }
}

void MetricsFile::give_up(const std::string& what, int64_t step, std::string advice) {
  file_.close();
  events_ = EventFile();
  if (warnings_ == nullptr) return;
  // What stopped it, as every writer of the project says it (io/atomic_file.h): the
  // file-size limit, a full file system or quota, an I/O error; else what to check.
  if (advice.empty()) {
    const std::filesystem::path parent = std::filesystem::path(path_).parent_path();
    std::error_code error;
    const uintmax_t written = std::filesystem::file_size(path_, error);
    advice = storage_advice(parent.empty() ? "." : parent.string(), what, error ? 0 : written);
  }
  if (advice.empty()) advice = "check its directory's permissions and space";
  *warnings_ << "warning: " << what << ": " << advice << "; training goes on without its "
             << "records from step " << step << " on (the checkpoints and this log keep the "
             << "run; resume to record again)" << std::endl;
}

void MetricsFile::write_run_start(const RunStart& start) {
  if (!file_.is_open()) return;
  const double now = std::chrono::duration<double>(
                         std::chrono::system_clock::now().time_since_epoch())
                         .count();
  std::ostringstream record;
  record << "{\"kind\": \"run\", \"step\": " << start.step << ", \"wall_s\": 0, \"time\": "
         << std::fixed << std::setprecision(3) << now << ", \"run\": " << json_string(start.run_id)
         << ", \"resumed_from\": "
         << (start.resumed_from.empty() ? "null" : json_string(start.resumed_from))
         << ", \"checkpoint_dir\": " << json_string(start.checkpoint_dir)
         << ", \"lineage\": " << json_string(start.lineage);
  for (const auto& [key, value] : std::vector<std::pair<const char*, const std::string*>>{
           {"init", &start.init},
           {"valid_sha256", &start.valid_sha256},
           {"corpus_sha256", &start.corpus_sha256},
           {"version", &start.version},
           {"computed_by", &start.computed_by},
           {"config_file", &start.config_file},
           {"command_line", &start.command_line},
           {"config", &start.config}}) {
    if (!value->empty()) record << ", \"" << key << "\": " << json_string(*value);
  }
  record << "}\n";
  append(record.str());
  // (Its failure is said as the first record's: the file was just opened.)
  events_.write_session_start(start.step + 1, now);
}

void MetricsFile::write_branch(int64_t step, double wall_s, const std::string& lineage) {
  write("branch", step, wall_s, {}, {{"lineage", lineage}});
  if (!file_.is_open()) return;
  try {
    events_.write_session_start(
        step + 1,
        std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch())
            .count());
  } catch (const Error& e) {
    give_up(e.what(), step);
  }
}

}  // namespace thpc
