// What every fuzz target of this folder shares: the input as text, and the rule that a
// reader given bad input either returns or throws thpc::Error (a one-line message for
// the user). Any other exception, a crash, a leak or a sanitizer report is a finding;
// so is a broken property, which `require` turns into an abort with its message.
#pragma once

#include <hdf5.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "common/error.h"

namespace thpc::fuzz {

inline std::string_view bytes_of(const uint8_t* data, size_t size) {
  return {reinterpret_cast<const char*>(data), size};
}

// Runs `read`; thpc::Error is the reader refusing the input, which is fine. With
// THPC_FUZZ_VERBOSE set (replaying one input: build-fuzz/fuzz_NAME FILE) the message is
// printed.
template <typename Read>
void refused_or_read(Read&& read) {
  try {
    read();
  } catch (const Error& error) {
    static const bool verbose = std::getenv("THPC_FUZZ_VERBOSE") != nullptr;
    if (verbose) std::fprintf(stderr, "refused: %s\n", error.what());
  }
}

// A property the readers promise; its failure is a finding like a crash.
inline void require(bool holds, const std::string& what) {
  if (holds) return;
  std::fprintf(stderr, "property broken: %s\n", what.c_str());
  std::abort();
}

// Every HDF5 identifier a reader opened is closed again, on refusal too: a leaked one
// would not show as a leak (HDF5's tables keep it reachable), so the targets count them.
inline void require_no_open_hdf5_objects() {
  require(H5Fget_obj_count(H5F_OBJ_ALL, H5F_OBJ_ALL) == 0, "HDF5 objects left open");
}

}  // namespace thpc::fuzz
