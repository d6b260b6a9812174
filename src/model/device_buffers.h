// Backend buffers that grow and never shrink: the device copies of a batch's ids, and
// the decoder's caches (model/decoder_state.h). Once the largest batch has been seen,
// keeping them allocates nothing. And the download of a backend tensor as fp32, which
// the model's and the decoding scorers' host-side results share.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "kernels/ops.h"

namespace thpc::model_detail {

// Device copies of ids (a batch's tokens and lengths, row indices), grown as batches grow.
struct IdBuffer {
  int32_t* ids = nullptr;
  int64_t capacity = 0;
};

// Grows `buffer` (never shrinking) to hold at least `count` ids, for an op to write.
inline void ensure_id_capacity(Backend& backend, IdBuffer& buffer, int64_t count) {
  if (count > buffer.capacity) {
    backend.free_ids(buffer.ids);
    buffer.capacity = std::max<int64_t>(count, 2 * buffer.capacity);
    buffer.ids = backend.alloc_ids(buffer.capacity);
  }
}

// Uploads `host` into `buffer`, growing it (never shrinking) when it is too small.
inline void ensure_ids(Backend& backend, IdBuffer& buffer,
                       const std::vector<int32_t>& host) {
  const int64_t count = static_cast<int64_t>(host.size());
  ensure_id_capacity(backend, buffer, count);
  backend.upload_ids(buffer.ids, host.data(), count);
}

// Makes `buffer` hold at least `numel` elements: kept when it does (what it holds stays),
// else replaced by a new buffer, zeroed when `zero_new`.
inline void ensure_capacity(Backend& backend, Tensor& buffer, DType dtype, int64_t numel,
                            bool zero_new) {
  if (buffer && buffer.numel >= numel) return;
  if (buffer) backend.free(buffer);
  buffer = backend.alloc(dtype, numel);
  if (zero_new) backend.zero(buffer);
}

// Downloads the first `count` elements of `tensor` (F32, F64 or BF16) into `out` as
// fp32 (resized; a vector kept from step to step allocates nothing). BF16 is widened on
// the backend first (exact: every bf16 is an fp32) into `widened`, an F32 buffer the
// caller keeps from call to call and this grows (ensure_capacity): a decoding step that
// allocated and freed its own made every captured CUDA graph stale, as a free does
// (CapturedWork::replay), so that each step was captured again. Null is allowed only
// for F32 and F64 tensors. F64 is rounded on the host.
void download_as_f32(Backend& backend, Tensor tensor, int64_t count, std::vector<float>& out,
                     Tensor* widened);

}  // namespace thpc::model_detail
