// How far a long piece of library work is (encoding a corpus, reading the checkpoints to
// average), told to whoever shows it. The library only counts and prints nothing: the
// programs of tools/ turn the counts into a progress line on a terminal
// (tools/progress.h), and every other caller passes nothing and gets ProgressListener::none().
#pragma once

#include <cstdint>
#include <string>

namespace thpc {

class ProgressListener {
 public:
  // The total of a stage whose size is not known in advance (the lines of a file being read).
  static constexpr int64_t kUnknownTotal = -1;

  virtual ~ProgressListener() = default;

  // A stage begins: `stage` names it ("train"; "" when the work has one stage), `unit`
  // says what is counted ("lines read"), `total` how many there will be, or kUnknownTotal.
  virtual void begin(const std::string& stage, const std::string& unit, int64_t total) = 0;
  // `count` more items of the current stage are done; safe to call from several threads.
  virtual void advance(int64_t count) = 0;
  // The current stage is complete.
  virtual void end() = 0;

  // A listener that ignores everything: the default of the functions that take one.
  static ProgressListener& none();

 private:
  class Ignored;
};

class ProgressListener::Ignored final : public ProgressListener {
 public:
  void begin(const std::string&, const std::string&, int64_t) override {}
  void advance(int64_t) override {}
  void end() override {}
};

inline ProgressListener& ProgressListener::none() {
  static Ignored ignored;
  return ignored;
}

}  // namespace thpc
