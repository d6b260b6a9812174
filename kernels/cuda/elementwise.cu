// PLACEHOLDER: the elementwise launchers are being written (see cuda_ops.h); each throws until then.
#include "common/error.h"
#include "kernels/cuda/cuda_ops.h"

namespace thpc::cuda {

void convert(void*, DType, const void*, DType, int64_t, cudaStream_t) { THPC_FAIL("cuda::convert not implemented yet"); }
template <typename T> void relu_forward(T*, const T*, int64_t, cudaStream_t) { THPC_FAIL("cuda::relu_forward not implemented yet"); }
template <typename T> void relu_backward(T*, const T*, const T*, int64_t, cudaStream_t) { THPC_FAIL("cuda::relu_backward not implemented yet"); }
template <typename T> void dropout_forward(T*, const T*, int64_t, float, DropoutKey, cudaStream_t) { THPC_FAIL("cuda::dropout_forward not implemented yet"); }
template <typename T> void dropout_backward(T*, const T*, int64_t, float, DropoutKey, cudaStream_t) { THPC_FAIL("cuda::dropout_backward not implemented yet"); }
template <typename T> void residual_dropout_forward(T*, const T*, const T*, int64_t, float, DropoutKey, cudaStream_t) { THPC_FAIL("not implemented yet"); }
template <typename T> void residual_dropout_backward(T*, T*, const T*, int64_t, float, DropoutKey, cudaStream_t) { THPC_FAIL("not implemented yet"); }
template <typename T> void copy_rows(T*, const int32_t*, const T*, const int32_t*, int, int, cudaStream_t) { THPC_FAIL("not implemented yet"); }
void scale(float*, int64_t, float, cudaStream_t) { THPC_FAIL("not implemented yet"); }
double sum_squares(Context&, const float*, int64_t) { THPC_FAIL("not implemented yet"); }
#define INSTANTIATE(T) \
  template void relu_forward<T>(T*, const T*, int64_t, cudaStream_t); \
  template void relu_backward<T>(T*, const T*, const T*, int64_t, cudaStream_t); \
  template void dropout_forward<T>(T*, const T*, int64_t, float, DropoutKey, cudaStream_t); \
  template void dropout_backward<T>(T*, const T*, int64_t, float, DropoutKey, cudaStream_t); \
  template void residual_dropout_forward<T>(T*, const T*, const T*, int64_t, float, DropoutKey, cudaStream_t); \
  template void residual_dropout_backward<T>(T*, T*, const T*, int64_t, float, DropoutKey, cudaStream_t); \
  template void copy_rows<T>(T*, const int32_t*, const T*, const int32_t*, int, int, cudaStream_t);
INSTANTIATE(float)
INSTANTIATE(bf16)

}  // namespace thpc::cuda
