// SHA-256 (FIPS 180-4, computed by OpenSSL's libcrypto): the checksum of every checkpoint
// and shard dataset, and the fingerprint of parameter buffers that lets two runs be
// compared exactly from their last log line.
#pragma once

#include <cstddef>
#include <string>

namespace thpc {

std::string sha256_hex(const void* data, size_t bytes);

}  // namespace thpc
