// THPC_ADDRESS_SANITIZER is defined where this translation unit is compiled with
// AddressSanitizer: g++ says so with __SANITIZE_ADDRESS__, clang with
// __has_feature(address_sanitizer). For the code that talks to the sanitizer's runtime
// (src/distributed/mpi_sanitizer_options.h, leak_checks_paused.h).
#pragma once

#if defined(__SANITIZE_ADDRESS__)
#define THPC_ADDRESS_SANITIZER 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define THPC_ADDRESS_SANITIZER 1
#endif
#endif
