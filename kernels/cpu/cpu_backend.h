// The CPU backend: the reference ops of cpu_ops.h behind the Backend interface, on host
// memory. CpuBackend<float> is what the trainer runs on a machine without a GPU;
// CpuBackend<double> runs the whole model in double precision so that the model's
// gradient can be checked against finite differences tightly.
#pragma once

#include <memory>

#include "kernels/ops.h"

namespace thpc {

std::unique_ptr<Backend> make_cpu_backend(DType dtype = DType::F32);

// Threads the CPU ops' loops (OpenMP) and BLAS (OpenBLAS's OpenMP build) use, for the
// whole process; by default one per core. The ops' results do not depend on it, nor do
// oneDNN's products; OpenBLAS's do (THPC_CPU_GEMM=openblas, or a CPU where it leads:
// cpu::gemm_identity names the count then).
void set_cpu_threads(int threads);

}  // namespace thpc
