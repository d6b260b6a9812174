// Which source a program was built from, for --version and for a user's report: the git
// commit of the checkout it was built in (cmake/SourceVersion.cmake writes the definition
// at every build), with "-dirty" where the working tree had changes, and that commit's date.
#pragma once

#include <string>

namespace thpc {

// "git 5dc6626a1b2c of 2026-12-06" (or "git 5dc6626a1b2c-dirty of ..."); "unknown" when
// the build had no git checkout to ask (a source tarball).
const char* source_version();

// What `program --version` prints: "transformer_decode git 5dc6626a1b2c of 2026-12-06".
inline std::string version_line(const std::string& program) {
  return program + " " + source_version();
}

}  // namespace thpc
