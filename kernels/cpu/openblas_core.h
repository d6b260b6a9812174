// Which of its kernels OpenBLAS runs for the CPU backend's matrix products, for the
// first line of a run.
//
// OpenBLAS built for many CPUs (DYNAMIC_ARCH, as Debian's is) picks its kernels once, as
// the library loads, from the CPU, unless the environment variable OPENBLAS_CORETYPE
// names them. Some machines set OPENBLAS_CORETYPE=Haswell for every process (this
// project's development containers do): on an AVX-512 CPU that runs the AVX2 kernels
// where OpenBLAS 0.3.21 would choose its AVX-512 ones. Measured on a Zen 5 EPYC, 2 cores
// (bench/RESULTS.md, 2026-11-26): the base model's training step at 1,000 + 1,000 tokens
// 1,430 ms with Haswell's kernels and 830 ms with OpenBLAS's own choice (Cooperlake); the
// 40-line newstest2014 decode, one thread, 9.14 s and 6.12 s, translations byte for byte
// the same. The peers the benchmarks compare with (CTranslate2, PyTorch) bring their own
// BLAS, which the variable does not touch. A user's variable is obeyed, never changed;
// the first line of a run names the kernels, says when the variable chose them, and when
// those are the AVX2 kernels on an AVX-512 CPU, what to do.
#pragma once

#include <string>

namespace thpc {

// The kernels OpenBLAS runs, as it names them ("Haswell", "SkylakeX", "Cooperlake", "Zen").
std::string openblas_core();

// Whether this CPU, and the operating system (which must save the AVX-512 registers),
// run OpenBLAS's AVX-512 kernels (SkylakeX's: AVX-512 F, CD, BW, DQ and VL).
bool cpu_runs_avx512_kernels();

// "OpenBLAS Cooperlake kernels"; when OPENBLAS_CORETYPE chose them "OpenBLAS Haswell
// kernels, set by OPENBLAS_CORETYPE=Haswell", and when those are AVX2 kernels on a CPU
// that runs the AVX-512 ones, what to do about it.
std::string openblas_description();

// The description's advice, apart for testing: `core` chosen by OPENBLAS_CORETYPE=`forced`
// ("" when unset) on a CPU that does or does not run the AVX-512 kernels.
std::string openblas_description(const std::string& core, const std::string& forced,
                                 bool cpu_runs_avx512);

}  // namespace thpc
