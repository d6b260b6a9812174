// PLACEHOLDER: the embedding launchers are being written (see cuda_ops.h); each throws until then.
#include "common/error.h"
#include "kernels/cuda/cuda_ops.h"

namespace thpc::cuda {

template <typename T> void embedding_forward(T*, const int32_t*, const T*, const T*, int, int, int, int, float, cudaStream_t) { THPC_FAIL("not implemented yet"); }
template <typename T> void embedding_backward(Context&, float*, float*, const T*, const int32_t*, int, int, int, int, float) { THPC_FAIL("not implemented yet"); }
#define INSTANTIATE(T) \
  template void embedding_forward<T>(T*, const int32_t*, const T*, const T*, int, int, int, int, float, cudaStream_t); \
  template void embedding_backward<T>(Context&, float*, float*, const T*, const int32_t*, int, int, int, int, float);
INSTANTIATE(float)
INSTANTIATE(bf16)

}  // namespace thpc::cuda
