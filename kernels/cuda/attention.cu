// PLACEHOLDER: the attention launchers are being written (see cuda_ops.h); each throws until then.
#include "common/error.h"
#include "kernels/cuda/cuda_ops.h"

namespace thpc::cuda {

int64_t attention_saved_numel(const AttentionShape& shape) { return static_cast<int64_t>(shape.batch) * shape.heads * shape.query_len * shape.key_len; }
template <typename T> void attention_forward(Context&, T*, T*, const T*, int, const T*, int, const T*, int, const AttentionShape&) { THPC_FAIL("not implemented yet"); }
template <typename T> void attention_backward(Context&, T*, T*, T*, const T*, const T*, const T*, int, const T*, int, const T*, int, const AttentionShape&) { THPC_FAIL("not implemented yet"); }
#define INSTANTIATE(T) \
  template void attention_forward<T>(Context&, T*, T*, const T*, int, const T*, int, const T*, int, const AttentionShape&); \
  template void attention_backward<T>(Context&, T*, T*, T*, const T*, const T*, const T*, int, const T*, int, const T*, int, const AttentionShape&);
INSTANTIATE(float)
INSTANTIATE(bf16)

}  // namespace thpc::cuda
