#include "kernels/ops.h"

#include "common/error.h"

namespace thpc {

size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::F32: return 4;
    case DType::F64: return 8;
    case DType::BF16: return 2;
  }
  return 0;
}

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::F32: return "fp32";
    case DType::F64: return "fp64";
    case DType::BF16: return "bf16";
  }
  return "?";
}

void check_attention_shape(const AttentionShape& shape, int ldq, int ldk, int ldv) {
  THPC_CHECK(shape.batch >= 0 && shape.heads >= 0 && shape.query_len >= 0 &&
                 shape.key_len >= 0,
             "attention shape B=" << shape.batch << " h=" << shape.heads
                                  << " Lq=" << shape.query_len << " Lk=" << shape.key_len);
  THPC_CHECK(shape.d_k > 0 && shape.d_v > 0,
             "attention head widths d_k=" << shape.d_k << " d_v=" << shape.d_v);
  THPC_CHECK(ldq >= shape.heads * shape.d_k && ldk >= shape.heads * shape.d_k &&
                 ldv >= shape.heads * shape.d_v,
             "attention row strides ldq=" << ldq << " ldk=" << ldk << " ldv=" << ldv
                                          << " narrower than h*d_k=" << shape.heads * shape.d_k
                                          << " / h*d_v=" << shape.heads * shape.d_v);
  THPC_CHECK(shape.dropout >= 0.0f && shape.dropout < 1.0f,
             "attention dropout " << shape.dropout << " outside [0, 1)");
}

Tensor Tensor::slice(int64_t offset, int64_t count) const {
  THPC_CHECK(offset >= 0 && count >= 0 && offset + count <= numel,
             "slice [" << offset << ", " << offset + count << ") of a tensor of " << numel);
  Tensor view = *this;
  view.data = static_cast<char*>(data) + offset * static_cast<int64_t>(dtype_size(dtype));
  view.numel = count;
  return view;
}

}  // namespace thpc
