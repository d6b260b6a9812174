// Opening a file a user named as an input, with the reason in the user's words when it
// cannot be read. On Linux a directory opens like a file and then reads as empty: tools
// that took `std::ifstream(path)` alone scored a directory given as EVALB's parameter
// file with the defaults and exit 0, and read one given as a SentencePiece model into
// libstdc++'s "basic_filebuf::underflow error reading the file: Is a directory".
#pragma once

#include <fstream>
#include <string>

namespace thpc {

// Why `path` cannot be read as a file, "" when it can: "no such file", "is a directory,
// not a file", or the system's reason ("Permission denied").
std::string unreadable_file_reason(const std::string& path);

// `path` opened for reading (binary), or thpc::Error "PATH: WHY (WHAT)", e.g.
// "ev: is a directory, not a file (the EVALB parameter file)". `what` may be empty.
std::ifstream open_input_file(const std::string& path, const std::string& what);

// The whole file's bytes, failing as open_input_file does (and on a read error).
std::string read_input_file(const std::string& path, const std::string& what);

}  // namespace thpc
