// The file header of a checkpoint (docs/checkpoints.md, "File header"): the 512-byte
// HDF5 user block in front of every checkpoint, which says what the file is before HDF5
// reads a byte of it. Written and checked by checkpoint.cc; its state line revised in
// place by mark_checkpoint.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "checkpoint/checkpoint.h"
#include "common/input_file.h"

namespace thpc {

// The file header (docs/checkpoints.md, "File header"): the first 512 bytes of a
// checkpoint are an HDF5 user block, which HDF5 and every HDF5 tool skip, holding
//   thpc-checkpoint-file 1\n  bytes N\n  sha256 HEX\n
// and zeros to the end: N is the file's size, HEX the sha256 of its bytes 512 to N. A
// reader checks both before HDF5 parses anything: HDF5 1.10 crashes on some damaged
// files (fuzz_checkpoint found a segfault in its metadata reads), so a damaged checkpoint
// must not reach it. Files without the header (written before it existed, HDF5's
// signature at byte 0) are refused for the same reason.
inline constexpr size_t kHeaderBytes = 512;
inline constexpr std::string_view kHeaderMagic = "thpc-checkpoint-file 1\n";
static_assert(kHeaderMagic.substr(0, 21) == kCheckpointHeaderStart,
              "common/input_file.h tells a checkpoint by how its header begins");
inline constexpr std::string_view kHdf5Signature("\x89HDF\r\n\x1a\n", 8);

// The lines a header may hold after "sha256 HEX" (docs/checkpoints.md, "File header"),
// each optional (headers written before they existed have none):
//   step N            the step stored in the file (checked against /'s attribute on reading)
//   loss X            the loss of that step (%.17g, nan when unknown)
//   state WORD        healthy | diverged | superseded (CheckpointState; revised in place)
//   run ID            the run that wrote it (16 hex digits)
//   contents WORD     full (parameters and Adam moments) | params (an average)
//   valid METRIC X    a best checkpoint's score (ValidationScore: ppl, bleu, chrf, f1; %.17g)
//   branch STEP:ID    its line of training (BranchStart) when not the run's start
// They are outside the whole-file checksum, which is what lets a run revise the state
// without rewriting the file; what they say of the file is checked against it on reading.
struct HeaderFields {
  std::optional<int64_t> step;
  double loss = NAN;
  CheckpointState state = CheckpointState::Healthy;
  std::string run_id;
  std::optional<bool> parameters_only;
  std::optional<ValidationScore> validation;
  std::optional<BranchStart> branch;
};


// The metrics a validation score may be of (ValidationScore::metric).
inline constexpr const char* kValidationMetrics[] = {"ppl", "bleu", "chrf", "f1"};

// The state words of the header's state line, in CheckpointState's order.
inline constexpr const char* kCheckpointStateNames[] = {"healthy", "diverged", "superseded"};

// The parts of a header (`head`, its first 512 bytes or fewer): the recorded size and
// digest and the fields, or the reason it is not one ("" and a filled `fields` when it is).
struct ParsedHeader {
  std::string problem;  // "" when it parses
  // What the problem is when the header is well formed but this version does not know
  // it: a later header version, a line of a key it does not know, a state word or a
  // metric it does not know. Not damage: a later version's (CheckpointOfANewerVersion).
  bool later_version = false;
  bool hdf5_without_header = false;
  bool not_a_checkpoint = false;
  bool short_file = false;
  std::string size, digest;
  HeaderFields fields;
};

// The 512 bytes of a header: magic, size, digest, the fields that are known, zeros.
std::string header_block(uint64_t size, const std::string& digest, const HeaderFields& fields);
ParsedHeader parse_header(std::string_view head);
// The first 512 bytes of `path` (fewer for a shorter file); false when it cannot be read.
bool read_head(const std::string& path, std::string* head);
// Writes the 512 bytes of `header` over the start of `path` and fsyncs them; throws
// saying it cannot `doing` (e.g. "mark it diverged").
void write_header_block(const std::string& path, const std::string& header,
                        const std::string& doing);
// Rewrites the header of the checkpoint `path` with `fields` (its size and digest as the
// file is), in place and fsync'ed; throws naming the file.
void stamp_header(const std::string& path, const HeaderFields& fields);

}  // namespace thpc
