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

Tensor Tensor::slice(int64_t offset, int64_t count) const {
  THPC_CHECK(offset >= 0 && count >= 0 && offset + count <= numel,
             "slice [" << offset << ", " << offset + count << ") of a tensor of " << numel);
  Tensor view = *this;
  view.data = static_cast<char*>(data) + offset * static_cast<int64_t>(dtype_size(dtype));
  view.numel = count;
  return view;
}

}  // namespace thpc
