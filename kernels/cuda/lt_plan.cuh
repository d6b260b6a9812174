// A cuBLASLt plan: the descriptors of one product's shape and the algorithm the
// heuristic chose for them, made once per shape and kept (linear.cu's GEMMs,
// int8_cuda_backend.cu's int8 products).
#pragma once

#include <cublasLt.h>

#include "kernels/cuda/cuda_check.h"

namespace thpc::cuda {

struct LtPlan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
  bool usable = false;  // false: cuBLASLt offered no algorithm (the caller's fallback)

  // Host-side objects only (a matmul already enqueued does not need them); errors are
  // ignored, as at exit.
  void destroy() {
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (c) cublasLtMatrixLayoutDestroy(c);
    if (desc) cublasLtMatmulDescDestroy(desc);
    *this = LtPlan{};
  }

  // Asks the heuristic for its best algorithm for desc, a, b and c (C and D alike) under
  // `preference`, which it destroys: usable when there is one; "none for this case"
  // leaves the plan unusable, any other failure throws, unless `optional` (a product
  // asked for with an epilogue the caller can do without, such as BGRADA's sums: which
  // status cuBLASLt gives for an epilogue it cannot do, e.g. with k = 1 before 12.3.4,
  // is not documented, so any refusal leaves it unusable and the caller falls back).
  void choose_algorithm(cublasLtHandle_t lt, cublasLtMatmulPreference_t preference,
                        bool optional = false) {
    cublasLtMatmulHeuristicResult_t result{};
    int returned = 0;
    const cublasStatus_t status =
        cublasLtMatmulAlgoGetHeuristic(lt, desc, a, b, c, c, preference, 1, &result, &returned);
    cublasLtMatmulPreferenceDestroy(preference);
    if (status == CUBLAS_STATUS_SUCCESS && returned > 0 && result.state == CUBLAS_STATUS_SUCCESS) {
      algo = result.algo;
      usable = true;
    } else if (!optional && status != CUBLAS_STATUS_SUCCESS &&
               status != CUBLAS_STATUS_NOT_SUPPORTED) {
      THPC_CUBLAS_CHECK(status);  // a real error, not "no algorithm for this case"
    }
  }
};

}  // namespace thpc::cuda
