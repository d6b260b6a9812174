// Error checks for CUDA runtime, cuBLAS/cuBLASLt and kernel launches. A failure throws
// thpc::Error naming the call, its error string, file:line, rank and host (see
// common/error.h), so that one failing rank of a large job says exactly what failed
// where. NCCL's check lives in nccl_check.h (only the distributed layer includes nccl.h).
#pragma once

#include <cublas_api.h>
#include <cuda_runtime.h>

#include <string>

#include "common/error.h"

namespace thpc {

// "CUBLAS_STATUS_... (n)" for a cuBLAS or cuBLASLt status (they share cublasStatus_t).
std::string cublas_status_text(cublasStatus_t status);

}  // namespace thpc

#define THPC_CUDA_CHECK(call)                                                        \
  do {                                                                               \
    const cudaError_t thpc_cuda_status_ = (call);                                    \
    if (thpc_cuda_status_ != cudaSuccess) {                                          \
      ::thpc::throw_check_failure(#call, __FILE__, __LINE__,                         \
                                  cudaGetErrorString(thpc_cuda_status_));            \
    }                                                                                \
  } while (0)

#define THPC_CUBLAS_CHECK(call)                                                      \
  do {                                                                               \
    const cublasStatus_t thpc_cublas_status_ = (call);                               \
    if (thpc_cublas_status_ != CUBLAS_STATUS_SUCCESS) {                              \
      ::thpc::throw_check_failure(#call, __FILE__, __LINE__,                         \
                                  ::thpc::cublas_status_text(thpc_cublas_status_));  \
    }                                                                                \
  } while (0)

// After a <<<...>>> launch: a bad configuration (too many threads, too much shared
// memory) is reported by cudaGetLastError, not by the launch itself.
#define THPC_CUDA_CHECK_LAUNCH(kernel_name)                                          \
  do {                                                                               \
    const cudaError_t thpc_launch_status_ = cudaGetLastError();                      \
    if (thpc_launch_status_ != cudaSuccess) {                                        \
      ::thpc::throw_check_failure("launch of " kernel_name, __FILE__, __LINE__,      \
                                  cudaGetErrorString(thpc_launch_status_));          \
    }                                                                                \
  } while (0)
