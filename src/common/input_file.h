// Opening a file a user named as an input, with the reason in the user's words when it
// cannot be read. On Linux a directory opens like a file and then reads as empty: tools
// that took `std::ifstream(path)` alone scored a directory given as EVALB's parameter
// file with the defaults and exit 0, and read one given as a SentencePiece model into
// libstdc++'s "basic_filebuf::underflow error reading the file: Is a directory".
#pragma once

#include <cstdint>
#include <fstream>
#include <string>

namespace thpc {

// Why `path` cannot be read as a file, "" when it can: "no such file", "is a directory,
// not a file", or the system's reason ("Permission denied").
std::string unreadable_file_reason(const std::string& path);

// `path` opened for reading (binary), or thpc::Error "PATH: WHY (WHAT)", e.g.
// "ev: is a directory, not a file (the EVALB parameter file)". `what` may be empty.
std::ifstream open_input_file(const std::string& path, const std::string& what);

// open_input_file for a file of text lines (sentences, trees, a parameter file): a regular
// file in a binary format that text tools are given by mistake is refused, saying what it
// is and what to do: "PATH: is gzip-compressed, not text (WHAT): decompress it first
// (gunzip -k PATH)"; also bzip2, xz, zstd, zip, a checkpoint, HDF5 (a data shard?) and
// UTF-16 text.
// Before: its first byte past ASCII read as "invalid UTF-8 ... iconv -f LATIN1", which
// would not help. (Pipes and devices are not looked into: what was read would be lost.)
std::ifstream open_text_file(const std::string& path, const std::string& what);

// Whether `head`, a file's first bytes, holds HDF5's signature where HDF5 puts it.
bool begins_as_hdf5(const std::string& head);

// How a checkpoint's file header begins (checkpoint/checkpoint_header.h: "thpc-checkpoint-
// file 1\n"), whatever its version: what tells a checkpoint from a data shard (both HDF5)
// before HDF5 reads a byte.
inline constexpr const char* kCheckpointHeaderStart = "thpc-checkpoint-file ";
bool begins_as_checkpoint(const std::string& head);

// What known binary format `head`, a file's first bytes, begins with, in the words of
// open_text_file's refusal ("is gzip-compressed, not text"), with what to do for `path`;
// "" for none.
std::string binary_format_problem(const std::string& head, const std::string& path);

// The whole file's bytes, failing as open_input_file does (and on a read error).
std::string read_input_file(const std::string& path, const std::string& what);

// What makes lines read from `path` no text of sentences, in the words of every program
// that refuses them (transformer_preprocess, transformer_decode), each adding what to do:
// - "PATH:LINE: a NUL byte at byte N of the line: text holds none (a file damaged by a
//   crash, whose blocks read as zeros, or not a text file?)" for the first NUL of `line`
//   (line `line_number`), "" when it has none;
std::string nul_byte_problem(const std::string& path, int64_t line_number,
                             const std::string& line);
// - "PATH: its lines end in a carriage return alone (classic Mac OS text: what reads as
//   L lines hold C carriage returns before their ends)" when `carriage_returns` inside
//   the lines (a line's last, taken for a CRLF's, not counted) outnumber
//   the `lines` (one inside a line of ordinary text is kept: web-crawled corpora have
//   them), or when one line holds any, else "". Such a file reads as one line: its
//   sentences translated as one.
std::string carriage_return_lines_problem(const std::string& path, int64_t carriage_returns,
                                          int64_t lines);
// What a program that meets such a file adds after carriage_return_lines_problem's words
// (transformer_decode refuses its input so, transformer_score says it of a line count that
// differs; transformer_preprocess names both languages' files instead).
inline constexpr const char* kCarriageReturnAdvice =
    ": convert it to \\n line ends, e.g. tr '\\r' '\\n' < FILE > NEW, and give NEW";

// What every program that refuses a line of invalid UTF-8 adds after "PATH: line N:
// invalid UTF-8 at byte B of the line": what to do (a helper's finding: the NUL byte's and
// carriage return's messages said it, this one did not).
inline constexpr const char* kNotUtf8Advice =
    ": the text is not UTF-8; convert the file first (Latin-1 text: iconv -f LATIN1 -t UTF-8)";

}  // namespace thpc
