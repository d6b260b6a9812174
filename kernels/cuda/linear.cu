// PLACEHOLDER: the linear launchers are being written (see cuda_ops.h); each throws until then.
#include "common/error.h"
#include "kernels/cuda/cuda_ops.h"

namespace thpc::cuda {

template <typename T> void linear_forward(Context&, T*, const T*, const T*, const T*, int, int, int) { THPC_FAIL("not implemented yet"); }
template <typename T> void linear_backward(Context&, T*, float*, float*, const T*, const T*, const T*, int, int, int) { THPC_FAIL("not implemented yet"); }
template <typename T> void output_projection_forward(Context&, T*, const T*, const T*, int, int, int) { THPC_FAIL("not implemented yet"); }
template <typename T> void output_projection_backward(Context&, T*, float*, const T*, const T*, const T*, int, int, int) { THPC_FAIL("not implemented yet"); }
#define INSTANTIATE(T) \
  template void linear_forward<T>(Context&, T*, const T*, const T*, const T*, int, int, int); \
  template void linear_backward<T>(Context&, T*, float*, float*, const T*, const T*, const T*, int, int, int); \
  template void output_projection_forward<T>(Context&, T*, const T*, const T*, int, int, int); \
  template void output_projection_backward<T>(Context&, T*, float*, const T*, const T*, const T*, int, int, int);
INSTANTIATE(float)
INSTANTIATE(bf16)

}  // namespace thpc::cuda
