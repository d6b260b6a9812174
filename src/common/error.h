// Error reporting shared by every part of transformer_hpc.
//
// A failed check throws transformer_hpc::Error whose message carries the failed
// expression, file:line, and the process identity (rank and host), so that a message
// from one rank of a large job says where it came from. main() turns an Error into a
// one-line message on stderr and a non-zero exit code.
#pragma once

#include <sstream>
#include <exception>
#include <stdexcept>
#include <string>

namespace thpc {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

// "rank R on HOST" for this process. The rank is -1 until the distributed layer sets
// it (single-process runs say "rank 0").
std::string process_identity();
void set_process_rank(int rank);
// This machine's host name, "?" when it cannot be read.
std::string host_name();

// `text` in single quotes for a one-line message about user input: control bytes and
// bytes that are not part of well-formed UTF-8 as \xNN (a binary file must not put raw
// bytes, newlines included, on the terminal), characters that show as a space or as
// nothing (a no-break space, a zero-width space, a byte-order mark) as \uXXXX, and
// anything past `max_bytes` cut, with the full size said: "'aaaa…' (100000 bytes)".
std::string quoted(const std::string& text, size_t max_bytes = 80);

[[noreturn]] void throw_check_failure(const char* expression, const char* file, int line,
                                      const std::string& detail);

// What a failure says to the user: its message, except for an allocation that failed
// (std::bad_alloc, whose what() is "std::bad_alloc"), which says which sizes to lower:
// the program's own (set_out_of_memory_advice).
std::string failure_message(const std::exception& failure);

// Which of the program's sizes to lower when memory runs out, in its user's words: the
// trainer's config keys, transformer_decode's options ("lower --batch-tokens, ..."),
// set once at the start of main(). Empty (the default): no advice, only that the sizes
// asked for need more memory than the machine has. (The trainer's advice was given by
// every program: lowering train.tokens_per_step while scoring BLEU.)
void set_out_of_memory_advice(std::string advice);
const std::string& out_of_memory_advice();

// "out of memory: WHAT; ADVICE" ("; " and the advice only where the program set one).
std::string out_of_memory_message(const std::string& what);

}  // namespace thpc

// THPC_CHECK(cond, "detail " << value): throws thpc::Error naming the expression,
// file:line, rank and host when cond is false.
#define THPC_CHECK(cond, detail)                                                  \
  do {                                                                            \
    if (!(cond)) {                                                                \
      std::ostringstream thpc_check_stream_;                                      \
      thpc_check_stream_ << detail;                                               \
      ::thpc::throw_check_failure(#cond, __FILE__, __LINE__,                      \
                                  thpc_check_stream_.str());                      \
    }                                                                             \
  } while (0)

// User-facing failure (bad config, bad file): a plain message without source
// location, since it is the input and not the code that is wrong.
#define THPC_FAIL(detail)                                                         \
  do {                                                                            \
    std::ostringstream thpc_fail_stream_;                                         \
    thpc_fail_stream_ << detail;                                                  \
    throw ::thpc::Error(thpc_fail_stream_.str());                                 \
  } while (0)
