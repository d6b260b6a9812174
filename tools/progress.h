// The progress line of the long tools (transformer_decode, transformer_average) on a
// terminal: "NAME: 120/500 sentences (24%), 12.3 s", rewritten in place on stderr at most
// ten times a second, and a last version with a newline at the end. Nothing at all when
// stderr is not a terminal: batch logs and pipes get no carriage returns.
#pragma once

#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <mutex>
#include <string>

namespace thpc::tools {

class Progress {
 public:
  // `out` null: stderr, shown only if it is a terminal. Tests pass a file.
  Progress(std::string name, std::string unit, int64_t total, std::FILE* out = nullptr)
      : name_(std::move(name)),
        unit_(std::move(unit)),
        total_(total),
        out_(out != nullptr ? out : (isatty(fileno(stderr)) ? stderr : nullptr)),
        start_(std::chrono::steady_clock::now()) {}

  // Adds `count` done items; safe to call from several threads.
  void advance(int64_t count) {
    std::lock_guard<std::mutex> lock(mutex_);
    done_ += count;
    const auto now = std::chrono::steady_clock::now();
    if (out_ == nullptr || now - last_shown_ < std::chrono::milliseconds(100)) return;
    last_shown_ = now;
    show();
  }

  // The final count, with a newline (once the work is done).
  void finish() {
    std::lock_guard<std::mutex> lock(mutex_);
    if (out_ == nullptr) return;
    show();
    std::fputc('\n', out_);
    std::fflush(out_);
  }

 private:
  // "\rNAME: DONE/TOTAL UNIT (P%), S s": the carriage return rewrites the line in place.
  void show() {
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    const double percent = total_ > 0 ? 100.0 * static_cast<double>(done_) / total_ : 100.0;
    std::fprintf(out_, "\r%s: %lld/%lld %s (%.0f%%), %.1f s", name_.c_str(),
                 static_cast<long long>(done_), static_cast<long long>(total_), unit_.c_str(),
                 percent, seconds);
    std::fflush(out_);
  }

  std::string name_, unit_;
  int64_t total_ = 0, done_ = 0;
  std::FILE* out_ = nullptr;
  std::chrono::steady_clock::time_point start_, last_shown_{};
  std::mutex mutex_;
};

}  // namespace thpc::tools
