// The progress line of the long tools (transformer_decode, _preprocess, _average) on a
// terminal: "NAME: 120/500 sentences (24%), 12.3 s", or "NAME: 5000 lines read, 0.4 s"
// when the total is not known, rewritten in place on stderr at most ten times a second,
// and a last version with a newline at the end. Nothing at all when stderr is not a
// terminal: batch logs and pipes get no carriage returns.
#pragma once

#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <mutex>
#include <optional>
#include <string>

#include "common/progress.h"

namespace thpc::tools {

class Progress {
 public:
  // `total`: the items there will be, or ProgressListener::kUnknownTotal.
  // `out` null: stderr, shown only if it is a terminal. Tests pass a file. `shown` false:
  // nothing at all (the program writes its results to that terminal as it goes).
  Progress(std::string name, std::string unit, int64_t total, std::FILE* out = nullptr,
           bool shown = true)
      : name_(std::move(name)),
        unit_(std::move(unit)),
        total_(total),
        out_(!shown ? nullptr
                    : out != nullptr ? out : (isatty(fileno(stderr)) ? stderr : nullptr)),
        start_(std::chrono::steady_clock::now()) {}

  // Work that ends by an exception leaves a line shown but not finished: end it, so that
  // the error message starts a line of its own.
  ~Progress() {
    if (shown_ && !finished_) {
      std::fputc('\n', out_);
      std::fflush(out_);
    }
  }

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
    if (out_ == nullptr || finished_) return;
    show();
    std::fputc('\n', out_);
    std::fflush(out_);
    finished_ = true;
  }

 private:
  // "\rNAME: DONE/TOTAL UNIT (P%), S s" (or "\rNAME: DONE UNIT, S s" without a total): the
  // carriage return rewrites the line in place.
  void show() {
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    if (total_ == ProgressListener::kUnknownTotal) {
      std::fprintf(out_, "\r%s: %lld %s, %.1f s", name_.c_str(), static_cast<long long>(done_),
                   unit_.c_str(), seconds);
    } else {
      const double percent = total_ > 0 ? 100.0 * static_cast<double>(done_) / total_ : 100.0;
      std::fprintf(out_, "\r%s: %lld/%lld %s (%.0f%%), %.1f s", name_.c_str(),
                   static_cast<long long>(done_), static_cast<long long>(total_), unit_.c_str(),
                   percent, seconds);
    }
    std::fflush(out_);
    shown_ = true;
  }

  std::string name_, unit_;
  int64_t total_ = 0, done_ = 0;
  std::FILE* out_ = nullptr;
  std::chrono::steady_clock::time_point start_, last_shown_{};
  bool shown_ = false, finished_ = false;
  std::mutex mutex_;
};

// What library work reports through a ProgressListener (common/progress.h), shown as one
// Progress line per stage: "NAME: STAGE: DONE/TOTAL UNIT (P%), S s" ("NAME: ..." for a
// stage without a name), each ended with its newline when the next one begins.
class StageProgress final : public ProgressListener {
 public:
  explicit StageProgress(std::string name, std::FILE* out = nullptr)
      : name_(std::move(name)), out_(out) {}

  void begin(const std::string& stage, const std::string& unit, int64_t total) override {
    end();
    current_.emplace(stage.empty() ? name_ : name_ + ": " + stage, unit, total, out_);
  }
  void advance(int64_t count) override {
    if (current_) current_->advance(count);
  }
  void end() override {
    if (!current_) return;
    current_->finish();
    current_.reset();
  }

 private:
  std::string name_;
  std::FILE* out_ = nullptr;
  std::optional<Progress> current_;
};

}  // namespace thpc::tools
