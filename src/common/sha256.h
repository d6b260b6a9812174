// SHA-256 (FIPS 180-4, computed by OpenSSL's libcrypto): the checksum of every checkpoint
// and shard dataset, and the fingerprint of parameter buffers that lets two runs be
// compared exactly from their last log line.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

struct evp_md_ctx_st;  // OpenSSL's EVP_MD_CTX

namespace thpc {

std::string sha256_hex(const void* data, size_t bytes);

// The sha256 of the bytes of the file `path` from `offset` to its end, read in blocks.
// Throws thpc::Error naming the file when it cannot be read.
std::string sha256_hex_of_file(const std::string& path, uint64_t offset);

// The sha256 of bytes given in pieces (a dataset written a block at a time): the same
// digest as sha256_hex of their concatenation.
class Sha256 {
 public:
  Sha256();
  void update(const void* data, size_t bytes);
  std::string hex_digest();  // once, after the last update

 private:
  std::unique_ptr<evp_md_ctx_st, void (*)(evp_md_ctx_st*)> context_;
};

}  // namespace thpc
