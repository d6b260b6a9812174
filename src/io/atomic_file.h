// A file appears whole or not at all: what every program that writes one promises
// (checkpoints, attention dumps, averages, text outputs; checkpoint/output_file.h says
// the rest of the promise).
#pragma once

#include <functional>
#include <string>

namespace thpc {

// Writes `path` all at once or not at all: `write` creates the whole file at the
// temporary path it is given (.NAME.tmp in the same directory, which is created if
// missing), which is then fsync'ed and renamed over `path`, and the directory fsync'ed so
// that the rename is durable. When anything fails the temporary file is removed and
// thpc::Error says "cannot write WHAT: ..." (WHAT names the file, e.g. "checkpoint PATH").
void write_atomically(const std::string& path, const std::string& what,
                      const std::function<void(const std::string& temporary)>& write);

// The temporary name write_atomically writes `path` under first: .NAME.tmp beside it.
std::string temporary_path(const std::string& path);

// fsync of the file or directory `path`; thpc::Error "cannot write WHAT: ..." when it fails.
void fsync_path(const std::string& path, const std::string& what);

}  // namespace thpc
