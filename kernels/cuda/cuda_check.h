// Error checks for CUDA runtime, cuBLAS and NCCL calls. A failure throws thpc::Error
// naming the call, its error string, file:line, rank and host, so that one failing
// rank of a large job says exactly what failed where.
#pragma once

#include <cuda_runtime.h>

#include "common/error.h"

#define THPC_CUDA_CHECK(call)                                                        \
  do {                                                                               \
    const cudaError_t thpc_cuda_status_ = (call);                                    \
    if (thpc_cuda_status_ != cudaSuccess) {                                          \
      ::thpc::throw_check_failure(#call, __FILE__, __LINE__,                         \
                                  cudaGetErrorString(thpc_cuda_status_));            \
    }                                                                                \
  } while (0)
