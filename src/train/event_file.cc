#include "train/event_file.h"

#include <sys/stat.h>
#include <unistd.h>

#include <boost/crc.hpp>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "common/error.h"
#include "io/run_file_names.h"
#include "proto/tensorboard/event.pb.h"

namespace thpc {

namespace {

// CRC-32C: polynomial 0x1EDC6F41, initial value and final xor all ones, reflected input
// and output (RFC 3720, B.4).
using Crc32c = boost::crc_optimal<32, 0x1EDC6F41, 0xFFFFFFFF, 0xFFFFFFFF, true, true>;

void append_little_endian(std::string& out, uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((value >> (8 * i)) & 0xFF));
}

// The host in the event file's name (TensorBoard's convention); "localhost" when unknown.
std::string event_file_host() {
  const std::string host = host_name();
  return host == "?" || host.empty() ? "localhost" : host;
}

}  // namespace

uint32_t crc32c(std::string_view data) {
  Crc32c crc;
  crc.process_bytes(data.data(), data.size());
  return crc.checksum();
}

uint32_t masked_crc32c(std::string_view data) {
  const uint32_t crc = crc32c(data);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

std::string tfrecord(std::string_view data) {
  std::string record;
  record.reserve(data.size() + 16);
  append_little_endian(record, data.size(), 8);
  append_little_endian(record, masked_crc32c(record), 4);
  record.append(data);
  append_little_endian(record, masked_crc32c(data), 4);
  return record;
}

bool event_file_records_no_value(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::error_code error;
  const uintmax_t size = std::filesystem::file_size(path, error);
  if (error) return false;
  // TFRecords: the length, its masked CRC (4 bytes), the data, the data's CRC (4 bytes).
  // The file_version record and session starts (a process's start) are no value; a
  // record that does not parse whole is taken for one.
  uintmax_t at = 0;
  int records = 0;
  while (at < size) {
    unsigned char length[8] = {0};
    if (!in.read(reinterpret_cast<char*>(length), sizeof length)) return false;
    uint64_t bytes = 0;
    for (int i = 7; i >= 0; --i) bytes = (bytes << 8) | length[i];  // little-endian
    if (bytes > size - at || 8 + 4 + bytes + 4 > size - at) return false;
    std::string data(bytes, '\0');
    in.ignore(4);
    if (!in.read(data.data(), static_cast<std::streamsize>(bytes))) return false;
    in.ignore(4);
    tensorboard::Event event;
    if (!event.ParseFromString(data) || event.has_summary()) return false;
    at += 8 + 4 + bytes + 4;
    ++records;
  }
  return records > 0;
}

FileAtPath file_at_path(const std::string& path) {
  struct stat status {};
  if (::stat(path.c_str(), &status) != 0) return {};
  return {static_cast<uint64_t>(status.st_dev), static_cast<uint64_t>(status.st_ino)};
}

EventFile::EventFile(const std::string& dir) {
  const double now = std::chrono::duration<double>(
                         std::chrono::system_clock::now().time_since_epoch())
                         .count();
  const std::string name = (std::filesystem::path(dir) /
                            (kEventFilePrefix + std::to_string(static_cast<int64_t>(now)) +
                             "." + event_file_host() + "." + std::to_string(::getpid())))
                               .string();
  // Never another's file: the name of a file this run made and someone replaced (by a
  // named pipe, whose open would wait for a reader for ever) is not opened again.
  const auto taken = [](const std::string& path) {
    std::error_code error;  // (one it cannot look at is left to the open to say)
    const auto type = std::filesystem::symlink_status(path, error).type();
    return type != std::filesystem::file_type::not_found && !error;
  };
  path_ = name;
  for (int suffix = 1; taken(path_); ++suffix) path_ = name + "." + std::to_string(suffix);
  // libsentencepiece exports a protobuf runtime of its own (3.14); a link that binds our
  // generated code to it would crash in the first serialization: this says why instead.
  GOOGLE_PROTOBUF_VERIFY_VERSION;
  file_.open(path_, std::ios::app | std::ios::binary);
  if (!file_) {
    THPC_FAIL("cannot open the TensorBoard event file " << path_ << " for appending ("
                                                        << std::strerror(errno) << ")");
  }
  opened_ = file_at_path(path_);
  tensorboard::Event event;
  event.set_wall_time(now);
  event.set_file_version("brain.Event:2");
  write_record(event.SerializeAsString());
}

void EventFile::write_scalars(int64_t step, double wall_time,
                              const std::vector<TaggedScalar>& scalars) {
  if (!file_.is_open()) return;
  tensorboard::Event event;
  event.set_wall_time(wall_time);
  event.set_step(step);
  tensorboard::Summary* summary = event.mutable_summary();
  for (const auto& [tag, value] : scalars) {
    if (!std::isfinite(value)) continue;
    tensorboard::Summary::Value* entry = summary->add_value();
    entry->set_tag(tag);
    entry->set_simple_value(static_cast<float>(value));
  }
  write_record(event.SerializeAsString());
}

void EventFile::write_session_start(int64_t step, double wall_time) {
  if (!file_.is_open()) return;
  tensorboard::Event event;
  event.set_wall_time(wall_time);
  event.set_step(step);
  event.mutable_session_log()->set_status(tensorboard::SessionLog::START);
  write_record(event.SerializeAsString());
}

void EventFile::write_record(const std::string& event_bytes) {
  errno = 0;
  file_ << tfrecord(event_bytes) << std::flush;
  if (!file_) {
    const int error = errno;  // the write's, which the stream keeps no record of
    THPC_FAIL("cannot write the TensorBoard event file " << path_ << " ("
              << (error != 0 ? std::strerror(error) : "an error of the stream") << ")");
  }
}

}  // namespace thpc
