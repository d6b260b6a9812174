#include "distributed/wait_clock.h"

#include <atomic>
#include <csignal>
#include <mutex>

namespace thpc {
namespace {

std::atomic<uint64_t> continue_signals{0};
struct sigaction handler_before{};

// Counts the signal and hands it on to the handler installed before, if any (SIGCONT's
// own action, continuing the process, happens whatever the handler).
void count_continue_signal(int signal, siginfo_t* info, void* context) {
  continue_signals.fetch_add(1, std::memory_order_relaxed);
  if ((handler_before.sa_flags & SA_SIGINFO) != 0) {
    if (handler_before.sa_sigaction != nullptr) handler_before.sa_sigaction(signal, info, context);
  } else if (handler_before.sa_handler != SIG_DFL && handler_before.sa_handler != SIG_IGN &&
             handler_before.sa_handler != nullptr) {
    handler_before.sa_handler(signal);
  }
}

void install_continue_counter() {
  struct sigaction action {};
  action.sa_sigaction = count_continue_signal;
  // SA_RESTART: a read or wait of another thread that the signal lands in goes on.
  action.sa_flags = SA_SIGINFO | SA_RESTART;
  sigemptyset(&action.sa_mask);
  sigaction(SIGCONT, &action, &handler_before);
}

}  // namespace

uint64_t continue_signals_seen() {
  static std::once_flag installed;
  std::call_once(installed, install_continue_counter);
  return continue_signals.load(std::memory_order_relaxed);
}

}  // namespace thpc
