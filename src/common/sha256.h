// SHA-256 (FIPS 180-4), used to fingerprint parameter buffers so that two runs can be
// compared exactly from their last log line.
#pragma once

#include <cstddef>
#include <string>

namespace thpc {

std::string sha256_hex(const void* data, size_t bytes);

}  // namespace thpc
