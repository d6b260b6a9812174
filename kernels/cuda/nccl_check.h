// Error check for NCCL calls: throws thpc::Error with the call, NCCL's error string and
// its last error message, file:line, rank and host.
#pragma once

#include <nccl.h>

#include <string>

#include "common/error.h"

#define THPC_NCCL_CHECK(call)                                                        \
  do {                                                                               \
    const ncclResult_t thpc_nccl_status_ = (call);                                   \
    if (thpc_nccl_status_ != ncclSuccess) {                                          \
      ::thpc::throw_check_failure(#call, __FILE__, __LINE__,                         \
                                  std::string(ncclGetErrorString(thpc_nccl_status_))); \
    }                                                                                \
  } while (0)
