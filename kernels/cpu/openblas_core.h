// Which of its kernels OpenBLAS runs for the CPU backend's matrix products, for the
// first line of a run, and the kernels chosen for a CPU that OpenBLAS does not know.
//
// OpenBLAS built for many CPUs (DYNAMIC_ARCH, as Debian's is) picks its kernels once, as
// the library loads, from the CPU, unless the environment variable OPENBLAS_CORETYPE
// names them. Two ways that goes wrong, both seen on this project's machines:
// - Some machines set OPENBLAS_CORETYPE=Haswell for every process: on an AVX-512 CPU that
//   runs the AVX2 kernels where OpenBLAS 0.3.21 would choose its AVX-512 ones. Measured on
//   a Zen 5 EPYC, 2 cores (bench/RESULTS.md, 2026-11-26): the base model's training step
//   at 1,000 + 1,000 tokens 1,430 ms with Haswell's kernels and 830 ms with OpenBLAS's own
//   choice (Cooperlake). A user's variable is obeyed, never changed; the first line of a
//   run says when the variable chose the kernels and, for AVX2 kernels on an AVX-512 CPU,
//   what to do.
// - A CPU newer than the library: OpenBLAS 0.3.21 (Debian 12's) does not know Intel's
//   family 6 model 207 (Xeon, Emerald Rapids) and falls back to its Prescott kernels
//   (SSE3): 2,048-square sgemm at 63 GFLOP/s on 2 cores where its SkylakeX kernels
//   reach 297, and the small preset's CPU step took 1,273 ms, PyTorch's (which brings its
//   own BLAS) 490 (bench/RESULTS.md, 2026-11-30). There
//   the programs that multiply on the CPU choose the AVX-512 (or AVX2) kernels this CPU
//   runs, by setting the variable and starting again (run_with_openblas_kernels_for_this_cpu),
//   and say so on the first line.
#pragma once

#include <string>

namespace thpc {

// The kernels OpenBLAS runs, as it names them ("Haswell", "SkylakeX", "Cooperlake", "Zen").
std::string openblas_core();

// Whether this CPU, and the operating system (which must save the AVX-512 registers),
// run OpenBLAS's AVX-512 kernels (SkylakeX's: AVX-512 F, CD, BW, DQ and VL).
bool cpu_runs_avx512_kernels();

// What of this CPU's vector units decides which OpenBLAS kernels it runs.
struct CpuVectorUnits {
  bool avx2_fma = false;  // Haswell's kernels
  bool avx512 = false;    // SkylakeX's (cpu_runs_avx512_kernels)
};
CpuVectorUnits cpu_vector_units();

// "GenuineIntel family 6 model 207": the CPU as OpenBLAS's detection sees it.
std::string cpu_identity();

// Whether `core` is one of OpenBLAS's x86-64 kernel sets older than AVX2 (Prescott, its
// fallback for a CPU it does not recognise, Core2, Nehalem, SandyBridge, ...).
bool core_predates_avx2(const std::string& core);

// The OPENBLAS_CORETYPE value to run with, or "" to keep OpenBLAS's choice: only when
// nobody set the variable (`variable_set` false; set but empty counts as set), the
// library picks its kernels at run time (`dynamic_arch`) and it chose kernels older than
// AVX2 on a CPU with AVX2 and FMA (it did not know the CPU): then SkylakeX (AVX-512) or
// Haswell (AVX2), the better of them that `cpu` runs. Not Cooperlake, OpenBLAS's own name
// for an AVX-512 CPU with bf16: its sgemm is SkylakeX's, and OpenBLAS 0.3.21 does not
// take the name from the variable ("Core not found: Cooperlake", then its choice by the
// CPU's features).
std::string openblas_core_to_choose(const std::string& core, bool dynamic_arch,
                                    bool variable_set, const CpuVectorUnits& cpu);

// Called first in main() by the programs that multiply on the CPU (transformer_hpc,
// transformer_decode, transformer_bench_step), before any thread or MPI starts. When
// openblas_core_to_choose names kernels, sets OPENBLAS_CORETYPE to them and
// THPC_OPENBLAS_FALLBACK to "OLD>NEW" (the kernels OpenBLAS had chosen, those it set), and
// runs the program again (execv of the executable /proc/self/exe links to, the same
// arguments and process): OpenBLAS reads the variable only as it loads, so this is the
// user's own remedy, applied for them. Returns when nothing is to be done, when it has
// been done (THPC_OPENBLAS_FALLBACK set: never twice) or when it cannot start again (the
// first line then says what to set).
void run_with_openblas_kernels_for_this_cpu(char** argv);

// What the first line says of OpenBLAS's kernels, gathered apart for testing.
struct OpenBlasChoice {
  std::string core;      // the kernels OpenBLAS runs (openblas_core)
  bool variable_set = false;  // OPENBLAS_CORETYPE is set (even empty)
  std::string forced;         // its value
  std::string fallback;  // OpenBLAS's own choice before this program set the variable to
                         // `forced` (THPC_OPENBLAS_FALLBACK), "" when it did not
  std::string better;    // openblas_core_to_choose's answer for this run
  std::string cpu;       // cpu_identity()
  std::string library;   // "OpenBLAS 0.3.21"
  bool cpu_runs_avx512 = false;
  bool dynamic_arch = true;  // the library picks its kernels as it loads (reads the variable)
  // openblas_get_parallel(): 2 the OpenMP build this program is built for (CMakeLists.txt),
  // 1 one with a thread pool of its own (pthreads), 0 a sequential one.
  int threading = 2;
};
OpenBlasChoice openblas_choice();

// "OpenBLAS Cooperlake kernels"; when OPENBLAS_CORETYPE chose them "OpenBLAS Haswell
// kernels, set by OPENBLAS_CORETYPE=Haswell", and when those are AVX2 kernels on a CPU
// that runs the AVX-512 ones, what to do about it; when this program set the variable
// for a CPU OpenBLAS did not know, that; and when kernels older than AVX2 run on a CPU
// that has it, what to set; and a loaded OpenBLAS that is not an OpenMP build (the build
// found no other, or the loader took another one: LD_LIBRARY_PATH, a lost run path), what
// that costs and what to do. A variable naming a core other than the one that runs is
// said too: a name the library does not have (another architecture's, a misspelling),
// or a library built for one CPU, which ignores it.
std::string openblas_description(const OpenBlasChoice& choice);
std::string openblas_description();  // of openblas_choice()

}  // namespace thpc
