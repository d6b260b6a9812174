// bfloat16 on the host: the upper 16 bits of an fp32, rounded to nearest even. What the
// gradient sums of dist.reduce_dtype = bf16 travel as between ranks (the GPU's own
// conversion, __float2bfloat16_rn, rounds alike).
#pragma once

#include <cstdint>
#include <cstring>

namespace thpc {

inline uint16_t bf16_from_float(float value) {
  uint32_t bits = 0;
  std::memcpy(&bits, &value, sizeof bits);
  const bool nan = (bits & 0x7fffffffu) > 0x7f800000u;
  if (nan) return static_cast<uint16_t>((bits >> 16) | 0x40);  // stays a (quiet) NaN
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}

inline float float_from_bf16(uint16_t value) {
  const uint32_t bits = static_cast<uint32_t>(value) << 16;
  float result = 0.0f;
  std::memcpy(&result, &bits, sizeof result);
  return result;
}

}  // namespace thpc
