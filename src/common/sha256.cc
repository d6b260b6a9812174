#include "common/sha256.h"

#include <openssl/evp.h>

#include <fstream>
#include <vector>

#include "common/error.h"
#include "common/still_working.h"

namespace thpc {
namespace {

std::string hex_of(const unsigned char* digest, unsigned int digest_size) {
  static const char* kHex = "0123456789abcdef";
  std::string hex;
  hex.reserve(2 * digest_size);
  for (unsigned int i = 0; i < digest_size; ++i) {
    hex += kHex[digest[i] >> 4];
    hex += kHex[digest[i] & 0xf];
  }
  return hex;
}

}  // namespace

// OpenSSL's libcrypto: it uses the CPU's SHA extensions where present (about 4x the
// portable code's speed), and hashing is most of the time spent verifying a checkpoint.
std::string sha256_hex(const void* data, size_t bytes) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int digest_size = 0;
  THPC_CHECK(EVP_Digest(data, bytes, digest, &digest_size, EVP_sha256(), nullptr) == 1 &&
                 digest_size == 32,
             "OpenSSL could not compute a SHA-256 of " << bytes << " bytes");
  return hex_of(digest, digest_size);
}

std::string sha256_hex_of_file(const std::string& path, uint64_t offset) {
  std::ifstream in(path, std::ios::binary);
  THPC_CHECK(in, "cannot open " << path << " to compute its sha256");
  in.seekg(static_cast<std::streamoff>(offset));
  THPC_CHECK(in, "cannot seek to byte " << offset << " of " << path);
  Sha256 hash;
  std::vector<char> block(size_t(1) << 22);
  while (in) {
    show_still_working();  // a large checkpoint's check keeps the other ranks waiting
    in.read(block.data(), static_cast<std::streamsize>(block.size()));
    const std::streamsize got = in.gcount();
    if (got > 0) hash.update(block.data(), static_cast<size_t>(got));
  }
  THPC_CHECK(in.eof() && !in.bad(), "cannot read " << path << " to compute its sha256");
  return hash.hex_digest();
}

Sha256::Sha256() : context_(EVP_MD_CTX_new(), EVP_MD_CTX_free) {
  THPC_CHECK(context_ && EVP_DigestInit_ex(context_.get(), EVP_sha256(), nullptr) == 1,
             "OpenSSL could not start a SHA-256");
}

void Sha256::update(const void* data, size_t bytes) {
  THPC_CHECK(EVP_DigestUpdate(context_.get(), data, bytes) == 1,
             "OpenSSL could not hash " << bytes << " bytes");
}

std::string Sha256::hex_digest() {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int digest_size = 0;
  THPC_CHECK(EVP_DigestFinal_ex(context_.get(), digest, &digest_size) == 1 && digest_size == 32,
             "OpenSSL could not finish a SHA-256");
  return hex_of(digest, digest_size);
}

}  // namespace thpc
