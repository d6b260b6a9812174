#include "checkpoint/checkpoint_header.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>

#include "common/error.h"
#include "common/sha256.h"

namespace thpc {
namespace {

namespace fs = std::filesystem;

std::string loss_text(double loss) {
  if (std::isnan(loss)) return "nan";
  char buffer[40];
  std::snprintf(buffer, sizeof buffer, "%.17g", loss);
  return buffer;
}

// Whether `text` is a word a later version could have written: 1 to 32 lowercase letters,
// digits and underscores, beginning with a letter. A damaged byte rarely leaves one.
bool a_word(std::string_view text) {
  return !text.empty() && text.size() <= 32 && text.front() >= 'a' && text.front() <= 'z' &&
         text.find_first_not_of("abcdefghijklmnopqrstuvwxyz0123456789_") == std::string::npos;
}

// Whether a header line's value is printable ASCII, as every value written is.
bool printable(std::string_view text) {
  return std::all_of(text.begin(), text.end(), [](char c) { return c >= ' ' && c <= '~'; });
}

// The fields of a header's lines after "sha256 HEX\n" (`rest`, up to the first NUL and
// zeros after it), or the reason they do not parse; `*later_version` set when the reason
// is a well-formed line this version does not know (a key, a state word, a metric). The
// reasons never quote the header's bytes but for such a word: a damaged one may hold
// anything.
std::string parse_header_fields(std::string_view rest, HeaderFields* fields,
                                bool* later_version) {
  std::set<std::string> seen;
  while (!rest.empty() && rest.front() != '\0') {
    const size_t end = rest.find('\n');
    if (end == std::string_view::npos) return "an unterminated line";
    const std::string_view line = rest.substr(0, end);
    rest.remove_prefix(end + 1);
    const size_t space = line.find(' ');
    if (space == std::string_view::npos) return "a line without a value";
    const std::string key(line.substr(0, space));
    const std::string value(line.substr(space + 1));
    if (!seen.insert(key).second) return "the '" + key.substr(0, 16) + "' line twice";
    const bool digits = !value.empty() && value.size() <= 18 &&
                        value.find_first_not_of("0123456789") == std::string::npos;
    if (key == "step") {
      if (!digits) return "its step is not a decimal count";
      fields->step = std::stoll(value);
    } else if (key == "loss") {
      char* parsed_end = nullptr;
      const double loss = std::strtod(value.c_str(), &parsed_end);
      if (value.empty() || parsed_end != value.c_str() + value.size()) return "its loss is not a number";
      fields->loss = loss;
    } else if (key == "state") {
      const auto* found = std::find(std::begin(kCheckpointStateNames), std::end(kCheckpointStateNames), value);
      if (found == std::end(kCheckpointStateNames)) {
        *later_version = a_word(value);
        if (*later_version) return "its state is '" + value + "', which this version does not know";
        return "its state is not healthy, diverged or superseded";
      }
      fields->state = static_cast<CheckpointState>(found - std::begin(kCheckpointStateNames));
    } else if (key == "run") {
      if (value.size() != 16 || value.find_first_not_of("0123456789abcdef") != std::string::npos) {
        return "its run is not 16 hex digits";
      }
      fields->run_id = value;
    } else if (key == "contents") {
      if (value != "full" && value != "params") return "its contents are not full or params";
      fields->parameters_only = value == "params";
    } else if (key == "valid") {
      const size_t gap = value.find(' ');
      const std::string metric = value.substr(0, gap);
      const bool known_metric =
          std::find(std::begin(kValidationMetrics), std::end(kValidationMetrics), metric) !=
          std::end(kValidationMetrics);
      // "valid ppl" is a metric this version knows without its score: damage, not a
      // later version's metric (it was said to be one, "use the version that wrote it").
      if (known_metric && gap == std::string::npos) return "its valid line has no score";
      if (!known_metric) {
        *later_version = a_word(metric) && printable(value);
        if (*later_version) {
          return "its valid line names the metric '" + metric +
                 "', which this version does not know";
        }
        return "its valid line names no metric ppl, bleu, chrf or f1";
      }
      const std::string number = value.substr(gap + 1);
      char* parsed_end = nullptr;
      const double score = std::strtod(number.c_str(), &parsed_end);
      if (number.empty() || parsed_end != number.c_str() + number.size()) {
        return "its valid score is not a number";
      }
      fields->validation = ValidationScore{metric, score};
    } else if (key == "branch") {
      std::vector<BranchStart> one;
      if (!parse_lineage(value, &one).empty() || one.size() != 1) {
        return "its branch is not STEP:ID (a step and 16 hex digits)";
      }
      fields->branch = one.front();
    } else {
      *later_version = a_word(key) && printable(value);
      if (*later_version) return "a '" + key + "' line, which this version does not know";
      return "an unknown line";
    }
  }
  if (rest.find_first_not_of('\0') != std::string_view::npos) return "bytes after its lines";
  return "";
}


}  // namespace

void write_header_block(const std::string& path, const std::string& header,
                        const std::string& doing) {
  // Plain file I/O: the message says what the operating system said, no HDF5 reason.
  const auto fail = [&](const std::string& what) {
    THPC_FAIL("checkpoint " << path << ": cannot " << doing << ": " << what);
  };
  const int fd = ::open(path.c_str(), O_WRONLY);
  if (fd < 0) fail("cannot open it for writing (" + std::string(std::strerror(errno)) + ")");
  const ssize_t written = ::pwrite(fd, header.data(), header.size(), 0);
  const int write_errno = errno;
  const bool synced = written == static_cast<ssize_t>(header.size()) && ::fsync(fd) == 0;
  const int sync_errno = errno;
  ::close(fd);
  if (written != static_cast<ssize_t>(header.size())) {
    fail("the write failed (" + std::string(std::strerror(write_errno)) + ")");
  }
  if (!synced) fail("fsync failed (" + std::string(std::strerror(sync_errno)) + ")");
}

std::string header_block(uint64_t size, const std::string& digest, const HeaderFields& fields) {
  std::string header = std::string(kHeaderMagic) + "bytes " + std::to_string(size) +
                       "\nsha256 " + digest + "\n";
  if (fields.step) header += "step " + std::to_string(*fields.step) + "\n";
  header += "loss " + loss_text(fields.loss) + "\n";
  header += std::string("state ") + checkpoint_state_name(fields.state) + "\n";
  if (!fields.run_id.empty()) header += "run " + fields.run_id + "\n";
  if (fields.parameters_only) {
    header += std::string("contents ") + (*fields.parameters_only ? "params" : "full") + "\n";
  }
  if (fields.validation) {
    header += "valid " + fields.validation->metric + " " + loss_text(fields.validation->value) + "\n";
  }
  if (fields.branch) header += "branch " + lineage_text({*fields.branch}) + "\n";
  THPC_CHECK(header.size() <= kHeaderBytes, "a header of " << header.size() << " bytes");
  header.resize(kHeaderBytes, '\0');
  return header;
}


ParsedHeader parse_header(std::string_view head) {
  ParsedHeader parsed;
  if (head.substr(0, kHdf5Signature.size()) == kHdf5Signature) {
    parsed.hdf5_without_header = true;
    parsed.problem = "no header";
    return parsed;
  }
  // "thpc-checkpoint-file N\n" with N > 1: a later version's header.
  const std::string_view start = kCheckpointHeaderStart;
  if (head.substr(0, start.size()) == start &&
      head.substr(0, kHeaderMagic.size()) != kHeaderMagic) {
    const std::string_view after = head.substr(start.size());
    const size_t end = after.find('\n');
    const std::string_view number = after.substr(0, end);
    if (end != std::string_view::npos && !number.empty() && number.size() <= 9 &&
        number.find_first_not_of("0123456789") == std::string_view::npos &&
        std::stoll(std::string(number)) > 1) {
      parsed.later_version = true;
      parsed.problem = "its header is of version " + std::string(number) +
                       " (this version reads version 1)";
      return parsed;
    }
  }
  if (head.substr(0, kHeaderMagic.size()) != kHeaderMagic) {
    parsed.not_a_checkpoint = true;
    parsed.problem = "no header";
    return parsed;
  }
  if (head.size() < kHeaderBytes) {
    parsed.short_file = true;
    parsed.problem = "short";
    return parsed;
  }
  std::string_view rest = head.substr(kHeaderMagic.size(), kHeaderBytes - kHeaderMagic.size());
  auto field = [&](std::string_view key, std::string* value) {
    if (rest.substr(0, key.size()) != key) return "no '" + std::string(key) + "' line";
    rest.remove_prefix(key.size());
    const size_t end = rest.find('\n');
    if (end == std::string_view::npos) return "unterminated '" + std::string(key) + "' line";
    *value = std::string(rest.substr(0, end));
    rest.remove_prefix(end + 1);
    return std::string();
  };
  parsed.problem = field("bytes ", &parsed.size);
  if (parsed.problem.empty()) parsed.problem = field("sha256 ", &parsed.digest);
  if (!parsed.problem.empty()) return parsed;
  if (parsed.size.empty() || parsed.size.size() > 19 ||
      parsed.size.find_first_not_of("0123456789") != std::string::npos) {
    parsed.problem = "its size is not a decimal byte count";
  } else if (parsed.digest.size() != 64 ||
             parsed.digest.find_first_not_of("0123456789abcdef") != std::string::npos) {
    parsed.problem = "its sha256 is not 64 lowercase hex digits";
  } else {
    parsed.problem = parse_header_fields(rest, &parsed.fields, &parsed.later_version);
  }
  return parsed;
}

bool read_head(const std::string& path, std::string* head) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  head->assign(kHeaderBytes, '\0');
  in.read(head->data(), static_cast<std::streamsize>(head->size()));
  head->resize(static_cast<size_t>(in.gcount()));
  return true;
}


void stamp_header(const std::string& path, const HeaderFields& fields) {
  std::error_code error;
  const uint64_t size = fs::file_size(path, error);
  if (error) {
    THPC_FAIL("checkpoint " << path << ": cannot stamp the file header: cannot read its size ("
                            << error.message() << ")");
  }
  write_header_block(path, header_block(size, sha256_hex_of_file(path, kHeaderBytes), fields),
                     "stamp the file header");
}


}  // namespace thpc
