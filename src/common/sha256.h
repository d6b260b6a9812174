// SHA-256 (FIPS 180-4, computed by OpenSSL's libcrypto): the checksum of every checkpoint
// and shard dataset, and the fingerprint of parameter buffers that lets two runs be
// compared exactly from their last log line.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace thpc {

std::string sha256_hex(const void* data, size_t bytes);

// The sha256 of the bytes of the file `path` from `offset` to its end, read in blocks.
// Throws thpc::Error naming the file when it cannot be read.
std::string sha256_hex_of_file(const std::string& path, uint64_t offset);

}  // namespace thpc
