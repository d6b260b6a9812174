// The TensorBoard event file writer (src/train/event_file.h) byte for byte: CRC-32C
// against its published check values, and one record against the bytes TensorBoard's
// own Python writer produces for the same Event. That a whole run's file reads back with
// TensorBoard's reader is RunOutputs.EventFileHoldsEveryMetricsValue (test_run_outputs).
#include <gtest/gtest.h>
#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <regex>
#include <string>
#include <vector>

#include "expect_error.h"
#include "program.h"
#include "train/event_file.h"

namespace thpc {
namespace {

namespace fs = std::filesystem;

std::string from_hex(const std::string& hex) {
  std::string bytes;
  for (size_t i = 0; i + 1 < hex.size(); i += 2) {
    bytes.push_back(static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16)));
  }
  return bytes;
}

// Event{wall_time: 1.5, step: 7, summary {value {tag: "train/loss" simple_value: 2.5}}}
// serialized and framed by TensorBoard 2.21's Python code (tensorboard.compat.proto.
// event_pb2 and tensorboard.summary.writer.record_writer.RecordWriter, whose CRC-32C is
// TensorBoard's own): an answer independent of protoc, Boost.CRC and our framing.
const std::string kLossEvent =
    from_hex("09000000000000f83f10072a130a110a0a747261696e2f6c6f73731500002040");
const std::string kLossRecord = from_hex(
    "200000000000000029eda950"
    "09000000000000f83f10072a130a110a0a747261696e2f6c6f73731500002040"
    "2508fb34");

TEST(Crc32c, PublishedCheckValues) {
  // The catalogue's check value (CRC-32/ISCSI) and RFC 3720 B.4's vectors.
  EXPECT_EQ(crc32c("123456789"), 0xE3069283u);
  EXPECT_EQ(crc32c(std::string(32, '\0')), 0x8A9136AAu);
  EXPECT_EQ(crc32c(std::string(32, '\xff')), 0x62A8AB43u);
  EXPECT_EQ(crc32c(""), 0u);
}

TEST(TfRecord, FramesOneEventAsTensorBoardDoes) {
  EXPECT_EQ(tfrecord(kLossEvent), kLossRecord);
  // The mask: CRC rotated right by 15 bits plus 0xa282ead8.
  EXPECT_EQ(masked_crc32c("123456789"), ((0xE3069283u >> 15) | (0xE3069283u << 17)) + 0xa282ead8u);
}

// The records of a TFRecord file, each checked: the stored CRCs match.
std::vector<std::string> records_of(const std::string& file) {
  std::vector<std::string> records;
  size_t at = 0;
  while (at < file.size()) {
    EXPECT_GE(file.size() - at, 16u) << "a truncated record at byte " << at;
    if (file.size() - at < 16) break;
    uint64_t length = 0;
    for (int i = 7; i >= 0; --i) length = length << 8 | static_cast<unsigned char>(file[at + i]);
    const std::string record = file.substr(at, 16 + length);
    EXPECT_EQ(tfrecord(record.substr(12, length)), record) << "bad CRC at byte " << at;
    records.push_back(record.substr(12, length));
    at += 16 + length;
  }
  return records;
}

class EventFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("thpc_test_event_file_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

TEST_F(EventFileTest, AFileVersionRecordThenOneEventPerCall) {
  std::string path;
  {
    EventFile events(dir_.string());
    path = events.path();
    // The NaN (a value shown as n/a) is left out: the Event equals kLossEvent.
    events.write_scalars(7, 1.5, {{"train/loss", 2.5}, {"train/peak_mem_mib", NAN}});
    // Flushed at once: the bytes are in the file while it is still open.
    const std::vector<std::string> records = records_of(read_file(path));
    ASSERT_EQ(records.size(), 2u);
    EXPECT_NE(records[0].find("brain.Event:2"), std::string::npos);
    EXPECT_EQ(records[1], kLossEvent);
  }
  EXPECT_TRUE(std::regex_match(fs::path(path).filename().string(),
                               std::regex(R"(events\.out\.tfevents\.[0-9]{10}\.[^/]+\.)" +
                                          std::to_string(getpid()))))
      << path;
}

// A file of the file-version record alone holds no value (a start that failed before its
// first record: removed at the next start); one with an Event after it does, and is
// another run's file to keep (a mutation audit's `>=` for `==` took it for none: a fresh
// start deleted another run's curves without a word).
TEST_F(EventFileTest, OnlyAFileOfItsVersionRecordAloneHoldsNoValue) {
  std::string path;
  {
    EventFile events(dir_.string());
    path = events.path();
    EXPECT_TRUE(event_file_records_no_value(path));
    events.write_scalars(7, 1.5, {{"train/loss", 2.5}});
  }
  EXPECT_FALSE(event_file_records_no_value(path));
  // Cut inside the first record: no TFRecord of a version alone either.
  const std::string bytes = read_file(path);
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes.substr(0, 10);
  EXPECT_FALSE(event_file_records_no_value(path));
}

TEST_F(EventFileTest, AMissingDirectoryIsAOneLineErrorNamingTheFile) {
  const std::string missing = (dir_ / "no_such_dir").string();
  expect_error([&] { EventFile events(missing); },
               {"cannot open the TensorBoard event file " + missing + "/events.out.tfevents."});
}

// Debian's libsentencepiece exports a protobuf runtime of its own (3.14); linked after the
// system's (CMakeLists.txt), both work in one process: SentencePiece trains and encodes
// with its copy, the event file serializes with the system's.
TEST_F(EventFileTest, WorksInAProcessThatUsesSentencePiece) {
  std::ofstream text(dir_ / "text.txt");
  for (int i = 0; i < 200; ++i) text << "seven hundred " << i % 17 << " and forty two\n";
  text.close();
  std::string model;
  const auto status = sentencepiece::SentencePieceTrainer::Train(
      "--input=" + (dir_ / "text.txt").string() +
          " --vocab_size=40 --hard_vocab_limit=false --minloglevel=2",
      nullptr, &model);
  ASSERT_TRUE(status.ok()) << status.ToString();
  sentencepiece::SentencePieceProcessor processor;
  ASSERT_TRUE(processor.LoadFromSerializedProto(model).ok());
  std::vector<std::string> pieces;
  ASSERT_TRUE(processor.Encode("seven hundred", &pieces).ok());
  EXPECT_FALSE(pieces.empty());

  EventFile events(dir_.string());
  events.write_scalars(7, 1.5, {{"train/loss", 2.5}});
  const std::vector<std::string> records = records_of(read_file(events.path()));
  ASSERT_EQ(records.size(), 2u);
  EXPECT_EQ(records[1], kLossEvent);
}

}  // namespace
}  // namespace thpc
