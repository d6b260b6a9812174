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

}  // namespace thpc::cpu
