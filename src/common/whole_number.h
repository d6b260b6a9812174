// A command-line text read as a whole number >= 0, all of it or nothing: strtoull alone
// takes a prefix ("5x" is 5), a sign ("-1" is 2^64 - 1) and spaces. transformer_decode's
// and transformer_preprocess's --seed take 0..2^64-1 through it.
#pragma once

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string>

namespace thpc {

inline std::optional<uint64_t> whole_number(const std::string& text) {
  const bool digits_only = text.find_first_not_of("0123456789") == std::string::npos;
  if (text.empty() || text.size() > 20 || !digits_only) return std::nullopt;
  errno = 0;
  const unsigned long long value = std::strtoull(text.c_str(), nullptr, 10);
  if (errno == ERANGE) return std::nullopt;
  return value;
}

}  // namespace thpc
