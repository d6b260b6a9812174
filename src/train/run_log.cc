#include "train/run_log.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <iomanip>
#include <sstream>

#include "common/error.h"

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
          : std::filesystem::path(config.checkpoint.dir).lexically_normal().parent_path();
  return (dir.empty() ? std::filesystem::path("metrics.jsonl") : dir / "metrics.jsonl")
      .string();
}

MetricsFile::MetricsFile(const std::string& path) : path_(path) {
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  std::error_code error;
  if (!parent.empty()) std::filesystem::create_directories(parent, error);
  file_.open(path, std::ios::app);
  if (!file_) {
    THPC_FAIL("cannot open the metrics file " << path << " for appending ("
                                              << (error ? error.message() : std::strerror(errno))
                                              << "; train.metrics_dir chooses its directory)");
  }
  events_ = EventFile(parent.empty() ? "." : parent.string());
}

void MetricsFile::write(const std::string& kind, int64_t step, double wall_s,
                        const std::vector<LogField>& fields) {
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
  record << "}\n";
  file_ << record.str() << std::flush;
  if (!file_) THPC_FAIL("cannot write the metrics file " << path_ << " (disk full?)");

  std::vector<TaggedScalar> scalars = {{kind + "/wall_s", wall_s}};
  for (const LogField& field : fields) scalars.emplace_back(kind + "/" + field.key, field.value);
  events_.write_scalars(step, now, scalars);
}

}  // namespace thpc
