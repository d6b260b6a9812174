// TensorBoard event files: what `tensorboard --logdir RUN` reads. A file is a sequence of
// TFRecords, each holding one serialized Event (proto/tensorboard/event.proto, compiled
// by protoc): first a file_version record, then one Event per metrics.jsonl record with
// its scalars as Summary values, and a session start where training goes on from an
// earlier step (write_session_start).
#pragma once

#include <cstdint>
#include <fstream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace thpc {

// CRC-32C (Castagnoli), the checksum of TFRecord framing; from Boost.CRC.
uint32_t crc32c(std::string_view data);

// The CRC a TFRecord stores: CRC-32C rotated right by 15 bits plus 0xa282ead8 (TFRecord
// masks it so that a CRC of data holding CRCs stays a good check).
uint32_t masked_crc32c(std::string_view data);

// One TFRecord: the data's length (uint64), the masked CRC-32C of those 8 bytes (uint32),
// the data, the masked CRC-32C of the data (uint32); integers little-endian.
std::string tfrecord(std::string_view data);

// A scalar as TensorBoard shows it: tag (e.g. "train/loss") and value.
using TaggedScalar = std::pair<std::string, double>;

// Appends Events to DIR/events.out.tfevents.<unix seconds>.<host>.<pid> (TensorFlow's
// names hold the pid too: a resume in the same second appended to the run's file before),
// each record flushed at once so that a live TensorBoard, and a job killed mid-run, see
// every value written.
// A default-constructed file writes nothing (ranks other than 0).
// True when the event file `path` holds its file-version record and nothing after it but
// session starts (each process's start writes one): a run that recorded no value (false
// when it cannot be read).
bool event_file_records_no_value(const std::string& path);

// Which file `path` names now, by device and inode ({0, 0} when it names none): a file
// moved away or deleted and made again under the same name is another file, which a
// writer holding the first open must not take for its own.
struct FileAtPath {
  uint64_t device = 0;
  uint64_t inode = 0;
  bool operator==(const FileAtPath& other) const {
    return device == other.device && inode == other.inode;
  }
  bool operator!=(const FileAtPath& other) const { return !(*this == other); }
};
FileAtPath file_at_path(const std::string& path);

class EventFile {
 public:
  EventFile() = default;
  // Opens the file in the existing directory `dir` for appending and writes the
  // file_version record; a failure throws naming the file. Its name is new: when it is
  // taken (a file made again within the second of the first, whose name is the same), a
  // suffix .1, .2, ... follows.
  explicit EventFile(const std::string& dir);

  const std::string& path() const { return path_; }
  // The file it opened (file_at_path of path() then).
  const FileAtPath& opened() const { return opened_; }

  // One Event at `step` and `wall_time` (Unix seconds) with a Summary value per scalar.
  // TensorBoard stores a scalar as a 32-bit float, so each value is rounded to float; a
  // value that is not finite (shown as n/a) is left out.
  void write_scalars(int64_t step, double wall_time, const std::vector<TaggedScalar>& scalars);
  // A SessionLog START at `step`: TensorBoard's readers drop the values of every earlier
  // event at `step` and after it (in this file and the run directory's others), as
  // PyTorch's SummaryWriter(purge_step=...) asks. Written where training goes on from
  // step - 1: a resume, a rollback.
  void write_session_start(int64_t step, double wall_time);

 private:
  void write_record(const std::string& event_bytes);

  std::string path_;
  std::ofstream file_;
  FileAtPath opened_;
};

}  // namespace thpc
