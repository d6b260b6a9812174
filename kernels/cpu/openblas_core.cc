// OpenBLAS's kernel choice (see openblas_core.h).
#include "kernels/cpu/openblas_core.h"

#include <cblas.h>

#include <cstdlib>

namespace thpc {

std::string openblas_core() {
  const char* core = openblas_get_corename();
  return core != nullptr ? core : "unknown";
}

bool cpu_runs_avx512_kernels() {
#if defined(__x86_64__)
  // The compiler's checks read CPUID and, for AVX-512, whether the operating system saves
  // the registers (XCR0), as OpenBLAS's own detection does.
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512cd") &&
         __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
         __builtin_cpu_supports("avx512vl");
#else
  return false;  // AVX-512 is x86-64's
#endif
}

std::string openblas_description(const std::string& core, const std::string& forced,
                                 bool cpu_runs_avx512) {
  std::string description = "OpenBLAS " + core + " kernels";
  if (forced.empty()) return description;
  description += ", set by OPENBLAS_CORETYPE=" + forced;
  // The AVX2 kernels (OpenBLAS names Zen's after Haswell's) where AVX-512 ones would run.
  if (cpu_runs_avx512 && (core == "Haswell" || core == "Zen")) {
    description += ": this CPU has AVX-512, unset OPENBLAS_CORETYPE for faster matrix products";
  }
  return description;
}

std::string openblas_description() {
  const char* forced = std::getenv("OPENBLAS_CORETYPE");
  return openblas_description(openblas_core(), forced != nullptr ? forced : "",
                              cpu_runs_avx512_kernels());
}

}  // namespace thpc
