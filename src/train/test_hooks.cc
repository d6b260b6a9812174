#include "train/test_hooks.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <string_view>
#include <thread>
#include <utility>

#include "common/error.h"
#include "common/still_working.h"

namespace thpc {

void maybe_inject_failure(const Communicator& comm, int64_t step, InjectionPoint point) {
  const auto names_this = [&](const char* spec) {
    int rank = -1;
    long long at_step = -1;
    char where[32] = {0};
    const int fields = spec == nullptr ? 0 : std::sscanf(spec, "%d:%lld:%31s", &rank, &at_step,
                                                         where);
    // RANK:STEP alone is the step's start; a third field names another point.
    static constexpr std::pair<std::string_view, InjectionPoint> kNamedPoints[] = {
        {"gradients", InjectionPoint::SumsPrepared}, {"validation", InjectionPoint::Validation},
        {"start-up", InjectionPoint::StartUp},       {"scoring", InjectionPoint::Scoring},
        {"validated", InjectionPoint::Validated},    {"exit", InjectionPoint::Exit},
        {"configuration", InjectionPoint::Configuration}};
    InjectionPoint named = InjectionPoint::StepStart;
    for (const auto& [name, named_point] : kNamedPoints) {
      if (fields == 3 && where == name) named = named_point;
    }
    return fields >= 2 && rank == comm.rank() && at_step == step && named == point;
  };
  if (names_this(std::getenv("THPC_KILL_AT"))) std::raise(SIGKILL);
  if (names_this(std::getenv("THPC_STOP_AT"))) std::raise(SIGSTOP);
  if (const char* fail = std::getenv("THPC_FAIL_AT"); names_this(fail)) {
    THPC_FAIL("failure injected by THPC_FAIL_AT=" << fail << " at step " << step);
  }
}

void slow_start_up_if_asked(const Communicator& comm) {
  const char* spec = std::getenv("THPC_TEST_SLOW_START_UP");
  int rank = -1;
  double seconds = 0;
  if (spec == nullptr || std::sscanf(spec, "%d:%lf", &rank, &seconds) != 2 ||
      rank != comm.rank()) {
    return;
  }
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));  // a block read
    show_still_working();
  }
}

bool poison_this_loss(const Communicator& comm, int64_t computed) {
  const char* spec = std::getenv("THPC_TEST_NAN_LOSS_AT");
  if (spec == nullptr) return false;
  int rank = -1;
  long long at = -1;
  if (std::sscanf(spec, "%d:%lld", &rank, &at) == 2) return rank == comm.rank() && at == computed;
  return std::sscanf(spec, "%lld", &at) == 1 && at == computed;
}

std::optional<double> injected_validation_nll(int64_t step) {
  const char* spec = std::getenv("THPC_TEST_VALID_NLL_AT");
  long long at = -1;
  double nll = 0;
  if (spec == nullptr || std::sscanf(spec, "%lld:%lf", &at, &nll) != 2 || at != step) {
    return std::nullopt;
  }
  return nll;
}

int64_t injected_stop_step() {
  const char* value = std::getenv("THPC_TEST_STOP_AT_STEP");
  return value ? std::strtoll(value, nullptr, 10) : 0;
}

InjectedWriteDelay injected_checkpoint_write_delay() {
  const auto milliseconds = [](const char* name) {
    const char* value = std::getenv(name);
    return std::chrono::milliseconds(value != nullptr ? std::strtol(value, nullptr, 10) : 0L);
  };
  return {milliseconds("THPC_TEST_CHECKPOINT_WRITE_DELAY_MS"),
          milliseconds("THPC_TEST_CHECKPOINT_WRITE_STALL_MS")};
}

void hold_checkpoint_write(const InjectedWriteDelay& delay) {
  const auto until = std::chrono::steady_clock::now() + delay.slow;
  while (std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::min<std::chrono::steady_clock::duration>(
        std::chrono::milliseconds(50), until - std::chrono::steady_clock::now()));
    show_still_working();  // a dataset written
  }
  std::this_thread::sleep_for(delay.stalled);
}

std::vector<std::string> test_hooks_set() {
  std::vector<std::string> hooks;
  for (char** entry = environ; entry != nullptr && *entry != nullptr; ++entry) {
    const std::string text = *entry;
    const std::string name = text.substr(0, text.find('='));
    if (name.rfind("THPC_TEST_", 0) == 0 || name == "THPC_FAIL_AT" || name == "THPC_KILL_AT" ||
        name == "THPC_STOP_AT") {
      hooks.push_back(text);
    }
  }
  return hooks;
}

}  // namespace thpc
