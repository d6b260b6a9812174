// OpenBLAS's kernel choice (see openblas_core.h).
#include "kernels/cpu/openblas_core.h"

#include <cblas.h>
#include <unistd.h>
#if defined(__x86_64__)
#include <cpuid.h>
#endif

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <cstring>

namespace thpc {

namespace {

std::string lowercase(std::string text) {
  std::transform(text.begin(), text.end(), text.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return text;
}

std::string environment(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr ? value : "";
}

// Whether this OpenBLAS picks its kernels as it loads (and so obeys OPENBLAS_CORETYPE).
bool openblas_dynamic_arch() {
  const char* config = openblas_get_config();
  return config != nullptr && std::strstr(config, "DYNAMIC_ARCH") != nullptr;
}

// "OpenBLAS 0.3.21" of openblas_get_config()'s "OpenBLAS 0.3.21 NO_LAPACKE DYNAMIC_ARCH ...".
std::string openblas_version() {
  const char* config = openblas_get_config();
  if (config == nullptr) return "OpenBLAS";
  const std::string text = config;
  const size_t second_space = text.find(' ', text.find(' ') + 1);
  return text.substr(0, second_space);
}

}  // namespace

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

CpuVectorUnits cpu_vector_units() {
  CpuVectorUnits units;
#if defined(__x86_64__)
  __builtin_cpu_init();
  units.avx2_fma = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  units.avx512 = cpu_runs_avx512_kernels();
#endif
  return units;
}

std::string cpu_identity() {
#if defined(__x86_64__)
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (__get_cpuid(0, &eax, &ebx, &ecx, &edx) == 0) return "an x86-64 CPU";
  char vendor[13] = {};
  std::memcpy(vendor, &ebx, 4);
  std::memcpy(vendor + 4, &edx, 4);
  std::memcpy(vendor + 8, &ecx, 4);
  if (__get_cpuid(1, &eax, &ebx, &ecx, &edx) == 0) return vendor;
  // The displayed family and model, as Intel's and AMD's manuals compose them.
  unsigned family = (eax >> 8) & 0xf;
  unsigned model = (eax >> 4) & 0xf;
  if (family == 0xf) family += (eax >> 20) & 0xff;
  if (family == 0x6 || family >= 0xf) model |= ((eax >> 16) & 0xf) << 4;
  return std::string(vendor) + " family " + std::to_string(family) + " model " +
         std::to_string(model);
#else
  return "this CPU";
#endif
}

bool core_predates_avx2(const std::string& core) {
  // OpenBLAS's x86 kernel sets without AVX2 (its corename table, older CPUs first; Steamroller
  // has FMA but not AVX2), and "Unknown", which it answers when it found none.
  static const char* const kOlder[] = {
      "unknown",  "katmai",   "coppermine",  "northwood",  "prescott",  "banias",
      "atom",     "core2",    "penryn",      "dunnington", "nehalem",   "athlon",
      "opteron",  "opteron_sse3", "barcelona", "nano",      "sandybridge", "bobcat",
      "bulldozer", "piledriver", "steamroller"};
  const std::string name = lowercase(core);
  return std::any_of(std::begin(kOlder), std::end(kOlder),
                     [&](const char* older) { return name == older; });
}

std::string openblas_core_to_choose(const std::string& core, bool dynamic_arch,
                                    bool variable_set, const CpuVectorUnits& cpu) {
  if (variable_set || !dynamic_arch || !core_predates_avx2(core)) return "";
  if (cpu.avx512) return "SkylakeX";
  return cpu.avx2_fma ? "Haswell" : "";
}

void run_with_openblas_kernels_for_this_cpu(char** argv) {
  // Set, even empty, is the user's; the mark says it is done once already.
  if (std::getenv("OPENBLAS_CORETYPE") != nullptr) return;
  if (std::getenv("THPC_OPENBLAS_FALLBACK") != nullptr) return;
  const std::string core = openblas_core();
  const std::string better =
      openblas_core_to_choose(core, openblas_dynamic_arch(), false, cpu_vector_units());
  if (better.empty()) return;
  // The executable by its own path, so that the process keeps its name (an exec of
  // /proc/self/exe would be named "exe" in ps and top); not when the dynamic loader ran
  // it (ld-linux.so PROGRAM: the link names the loader, which would take argv[1] for the
  // program). Where it cannot start again, the first line says what to set.
  char path[4096];
  const ssize_t length = ::readlink("/proc/self/exe", path, sizeof(path) - 1);
  if (length <= 0) return;
  path[length] = '\0';
  const char* name = std::strrchr(path, '/');
  if (std::strncmp(name != nullptr ? name + 1 : path, "ld-", 3) == 0) return;
  ::setenv("OPENBLAS_CORETYPE", better.c_str(), 1);
  ::setenv("THPC_OPENBLAS_FALLBACK", (core + ">" + better).c_str(), 1);
  ::execv(path, argv);
  ::unsetenv("OPENBLAS_CORETYPE");
  ::unsetenv("THPC_OPENBLAS_FALLBACK");
}

OpenBlasChoice openblas_choice() {
  OpenBlasChoice choice;
  choice.core = openblas_core();
  choice.variable_set = std::getenv("OPENBLAS_CORETYPE") != nullptr;
  choice.forced = environment("OPENBLAS_CORETYPE");
  // The mark "OLD>NEW" of run_with_openblas_kernels_for_this_cpu, when the variable is
  // still what it set.
  const std::string mark = environment("THPC_OPENBLAS_FALLBACK");
  const size_t arrow = mark.find('>');
  if (choice.variable_set && arrow != std::string::npos &&
      lowercase(mark.substr(arrow + 1)) == lowercase(choice.forced)) {
    choice.fallback = mark.substr(0, arrow);
  }
  choice.better = openblas_core_to_choose(choice.core, openblas_dynamic_arch(),
                                          choice.variable_set, cpu_vector_units());
  choice.cpu = cpu_identity();
  choice.library = openblas_version();
  choice.cpu_runs_avx512 = cpu_runs_avx512_kernels();
  choice.dynamic_arch = openblas_dynamic_arch();
  choice.threading = openblas_get_parallel();
  return choice;
}

namespace {

std::string kernels_description(const OpenBlasChoice& choice) {
  std::string description = "OpenBLAS " + choice.core + " kernels";
  if (!choice.better.empty()) {
    return description + ": " + choice.library + " does not know this CPU (" + choice.cpu +
           "); its " + choice.better + " kernels multiply several times faster here: run " +
           "with OPENBLAS_CORETYPE=" + choice.better;
  }
  if (!choice.variable_set) return description;
  if (!choice.fallback.empty()) {
    if (lowercase(choice.core) != lowercase(choice.forced)) {
      return description + ", though this program set OPENBLAS_CORETYPE=" + choice.forced +
             " (" + choice.library + " does not know this CPU, " + choice.cpu +
             ", and did not take that name)";
    }
    return description + ", set by this program as OPENBLAS_CORETYPE=" + choice.forced + ": " +
           choice.library + " does not know this CPU (" + choice.cpu + ") and chose its " +
           choice.fallback + " kernels (set OPENBLAS_CORETYPE to choose others)";
  }
  description += ", set by OPENBLAS_CORETYPE=" + choice.forced;
  if (lowercase(choice.core) != lowercase(choice.forced)) {
    // A library built for one CPU reads no variable.
    if (!choice.dynamic_arch) {
      return description + ", which " + choice.library + " ignores (built for one CPU, " +
             "not DYNAMIC_ARCH)";
    }
    // A name it does not have (another architecture's, as an x86-64 "Haswell" on an
    // aarch64 node; a misspelling; empty). OpenBLAS 0.3.21 on aarch64 then falls back to
    // its generic armv8 kernels instead of this CPU's; on x86-64 it picks by the CPU's
    // features, as without the variable (driver/others/dynamic*.c).
#if defined(__x86_64__)
    return description + ", a name " + choice.library + " does not take: it chose by this " +
           "CPU's features instead";
#else
    return description + ", a name " + choice.library + " does not take here: it fell back " +
           "to these kernels instead of choosing this CPU's; unset OPENBLAS_CORETYPE";
#endif
  }
  // The AVX2 kernels (OpenBLAS names Zen's after Haswell's) where AVX-512 ones would run.
  if (choice.cpu_runs_avx512 && (choice.core == "Haswell" || choice.core == "Zen")) {
    description += ": this CPU has AVX-512, unset OPENBLAS_CORETYPE for faster matrix products";
  }
  return description;
}

}  // namespace

std::string openblas_description(const OpenBlasChoice& choice) {
  if (choice.threading == 2) return kernels_description(choice);
  // Said of the library loaded, which may be the one the build found (CMakeLists.txt falls
  // back to any OpenBLAS) or another the loader took (LD_LIBRARY_PATH, a lost run path).
  return kernels_description(choice) + "; warning: this " + choice.library + " is not an " +
         "OpenMP build but " +
         (choice.threading == 1 ? "one with threads of its own (pthreads), which spin against "
                                  "the ops' OpenMP threads"
                                : "a sequential one, whose products use one core") +
         ": build and run with OpenBLAS's OpenMP build (Debian: libopenblas0-openmp; Spack: "
         "openblas threads=openmp), and check LD_LIBRARY_PATH";
}

std::string openblas_description() { return openblas_description(openblas_choice()); }

}  // namespace thpc
