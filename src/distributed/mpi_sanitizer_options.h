// AddressSanitizer's defaults for a program that starts MPI (include it in the file that
// holds main(), once per program; it defines nothing in a build without ASan).
//
// Open MPI keeps what it allocates at start-up and in its progress thread until exit, in
// components it has unloaded by then: LeakSanitizer can only tell those allocations
// apart by the Open MPI functions on their full stacks (.ci/lsan.supp), and ASan's fast
// unwinder stops at the first library built without frame pointers. So these programs
// record full stacks (slow unwinding at every malloc). Every other program and test keeps
// the fast unwinder: with the slow one, sacreBLEU's tokenisation over 16 systems
// (Wmt17.*) took 221 s instead of 9. ASAN_OPTIONS from the environment still overrides
// this default.
#pragma once

#include "common/address_sanitizer.h"

#ifdef THPC_ADDRESS_SANITIZER
extern "C" const char* __asan_default_options() { return "fast_unwind_on_malloc=0"; }
#endif
