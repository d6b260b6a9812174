#include "common/sha256.h"

#include <openssl/evp.h>

#include "common/error.h"

namespace thpc {

// OpenSSL's libcrypto: it uses the CPU's SHA extensions where present (about 4x the
// portable code's speed), and hashing is most of the time spent verifying a checkpoint.
std::string sha256_hex(const void* data, size_t bytes) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int digest_size = 0;
  THPC_CHECK(EVP_Digest(data, bytes, digest, &digest_size, EVP_sha256(), nullptr) == 1 &&
                 digest_size == 32,
             "OpenSSL could not compute a SHA-256 of " << bytes << " bytes");
  static const char* kHex = "0123456789abcdef";
  std::string hex;
  hex.reserve(2 * digest_size);
  for (unsigned int i = 0; i < digest_size; ++i) {
    hex += kHex[digest[i] >> 4];
    hex += kHex[digest[i] & 0xf];
  }
  return hex;
}

}  // namespace thpc
