// The oneDNN this build links, for the first line of a run: it runs the CPU's fp32
// matrix products (blas.cc) and decoding's int8 ones (int8_matmul.cc).
#pragma once

#include <string>

namespace thpc::cpu {

// Whether this build has oneDNN (found at configure time: Debian's libdnnl-dev, Spack's
// onednn).
bool onednn_built();

// "oneDNN 2.6.3, avx512_core_bf16": its version and the instruction set its kernels use on
// this CPU (DNNL_MAX_CPU_ISA in the environment can lower it); "" without oneDNN.
std::string onednn_version_and_isa();

// Whether oneDNN's kernels on this CPU are AVX-512 ones or newer (avx512_core and up, as
// DNNL_MAX_CPU_ISA leaves them): where its fp32 GEMM leads OpenBLAS's (blas.h). false
// without oneDNN.
bool onednn_runs_avx512();

// Whether oneDNN's fp32 GEMM kernels keep the stack register a stack while they run:
// before 3.11.2 (Debian 12's 2.6.3 among them) jit_avx512_common_gemm_f32 and
// jit_avx_gemm_f32 point it into the heap, so that a signal handled on a thread running
// one writes its frame there and corrupts the heap (oneDNN issue 4845, fixed in 3.11.2
// and 3.12). false without oneDNN.
bool onednn_gemm_is_signal_safe();

}  // namespace thpc::cpu
