// While one of these lives, LeakSanitizer ignores what the calling thread allocates
// (nothing in a build without ASan). For Open MPI's start and end: it keeps what
// MPI_Init_thread and MPI_Finalize allocate until exit (3,357 blocks in 52 stacks for a
// transformer_hpc run that stops at its configuration), and matching
// each of those against .ci/lsan.supp at exit made LeakSanitizer read /proc/self/maps again
// for every frame in a component Open MPI had unloaded by then: 3 s at the end of every
// sanitized MPI program, the heaviest tests of the sanitized suite being such programs.
// The pause is this thread's alone: what Open MPI's progress thread allocates is still
// matched there (leak:event_base_loop); every other allocation is checked as before.
#pragma once

#include "common/address_sanitizer.h"

#ifdef THPC_ADDRESS_SANITIZER
#include <sanitizer/lsan_interface.h>
#endif

namespace thpc {

// The sanitizer runtime's own guard where there is one (its constructor calls
// __lsan_disable, its destructor __lsan_enable).
#ifdef THPC_ADDRESS_SANITIZER
using LeakChecksPaused = __lsan::ScopedDisabler;
#else
class LeakChecksPaused {
 public:
  // Provided, not defaulted: a guard whose type is trivial reads as an unused variable.
  LeakChecksPaused() {}
  LeakChecksPaused(const LeakChecksPaused&) = delete;
  LeakChecksPaused& operator=(const LeakChecksPaused&) = delete;
};
#endif

}  // namespace thpc
