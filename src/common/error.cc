#include "common/error.h"

#include <unistd.h>

#include <climits>
#include <cstdint>
#include <new>
#include <string>
#include <utility>

namespace thpc {
namespace {
int g_rank = 0;
}

void set_process_rank(int rank) { g_rank = rank; }

std::string host_name() {
  char host[HOST_NAME_MAX + 1] = {0};
  if (gethostname(host, sizeof(host) - 1) != 0) return "?";
  return host;
}

std::string process_identity() {
  std::ostringstream out;
  out << "rank " << g_rank << " on " << host_name();
  return out.str();
}

namespace {

// The length of the well-formed UTF-8 sequence at `at` (2-4 bytes), or 0 if there is none.
size_t utf8_sequence_length(const std::string& text, size_t at) {
  const auto byte = [&](size_t i) { return static_cast<unsigned char>(text[i]); };
  const unsigned char lead = byte(at);
  size_t length = 0;
  if (lead >= 0xC2 && lead <= 0xDF) length = 2;
  if (lead >= 0xE0 && lead <= 0xEF) length = 3;
  if (lead >= 0xF0 && lead <= 0xF4) length = 4;
  if (length == 0 || at + length > text.size()) return 0;
  for (size_t i = 1; i < length; ++i) {
    if ((byte(at + i) & 0xC0) != 0x80) return 0;
  }
  // Overlong forms and surrogates: the second byte's range narrows for these leads.
  const unsigned char second = byte(at + 1);
  if ((lead == 0xE0 && second < 0xA0) || (lead == 0xED && second > 0x9F) ||
      (lead == 0xF0 && second < 0x90) || (lead == 0xF4 && second > 0x8F)) {
    return 0;
  }
  return length;
}

// The code point of the well-formed UTF-8 sequence of `length` bytes at `at`.
uint32_t code_point(const std::string& text, size_t at, size_t length) {
  static const unsigned char kLeadMask[] = {0, 0x7F, 0x1F, 0x0F, 0x07};
  uint32_t point = static_cast<unsigned char>(text[at]) & kLeadMask[length];
  for (size_t i = 1; i < length; ++i) {
    point = (point << 6) | (static_cast<unsigned char>(text[at + i]) & 0x3F);
  }
  return point;
}

// Characters a terminal shows as a space or as nothing: no-break spaces, the soft
// hyphen, zero-width characters and the byte-order mark (one in the middle of files
// joined with cat).
bool is_invisible(uint32_t point) {
  return point == 0x00A0 || point == 0x00AD || point == 0x2007 || point == 0x202F ||
         (point >= 0x200B && point <= 0x200F) || point == 0x2060 || point == 0xFEFF;
}

}  // namespace

std::string quoted(const std::string& text, size_t max_bytes) {
  static const char* const kHex = "0123456789abcdef";
  std::string out = "'";
  size_t at = 0;
  while (at < text.size() && at < max_bytes) {
    const unsigned char byte = static_cast<unsigned char>(text[at]);
    const size_t sequence = byte >= 0x80 ? utf8_sequence_length(text, at) : 0;
    if (sequence > 0 && is_invisible(code_point(text, at, sequence))) {
      // A no-break space pasted from a web page looked like the space the message had
      // already trimmed ("'5 ' is not an integer"): written as \u00a0.
      const uint32_t point = code_point(text, at, sequence);
      out += "\\u";
      for (int shift = 12; shift >= 0; shift -= 4) out += kHex[(point >> shift) & 15];
      at += sequence;
    } else if (sequence > 0) {
      out.append(text, at, sequence);
      at += sequence;
    } else if (byte < 0x20 || byte >= 0x7F) {
      out += "\\x";
      out += kHex[byte >> 4];
      out += kHex[byte & 15];
      ++at;
    } else {
      out += static_cast<char>(byte);
      ++at;
    }
  }
  if (at < text.size()) {
    return out + "\u2026' (" + std::to_string(text.size()) + " bytes)";
  }
  return out + "'";
}

void throw_check_failure(const char* expression, const char* file, int line,
                         const std::string& detail) {
  std::ostringstream out;
  out << "check failed: " << expression << " at " << file << ":" << line << " ("
      << process_identity() << ")";
  if (!detail.empty()) out << ": " << detail;
  throw Error(out.str());
}

namespace {
std::string& advice_when_out_of_memory() {
  static std::string advice;
  return advice;
}
}  // namespace

void set_out_of_memory_advice(std::string advice) {
  advice_when_out_of_memory() = std::move(advice);
}

const std::string& out_of_memory_advice() { return advice_when_out_of_memory(); }

std::string out_of_memory_message(const std::string& what) {
  const std::string& advice = out_of_memory_advice();
  return "out of memory: " + what + (advice.empty() ? std::string() : "; " + advice);
}

std::string failure_message(const std::exception& failure) {
  if (dynamic_cast<const std::bad_alloc*>(&failure) != nullptr) {
    return out_of_memory_message("an allocation failed: the sizes asked for need more memory "
                                 "than this machine has");
  }
  return failure.what();
}

}  // namespace thpc
