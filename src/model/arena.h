// A bump allocator for activations on a backend: a pass takes its tensors from the
// arena in order, and reset() hands all of them back at once. When a pass needs more
// than the arena holds, the extra comes from new blocks; the next reset() replaces all
// blocks by one large enough for the biggest pass seen (on the host, with headroom), so
// once the longest batch has gone through, a pass makes no allocation at all.
#pragma once

#include <algorithm>
#include <vector>

#include "common/error.h"
#include "kernels/ops.h"

namespace thpc {

class Arena {
 public:
  explicit Arena(Backend& backend)
      : backend_(backend), block_dtype_(backend.param_dtype()),
        headroom_eighths_(backend.host_memory() ? 1 : 0) {}
  ~Arena() { release(); }
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;

  // A tensor of `numel` elements of `dtype`, contents unspecified.
  Tensor take(DType dtype, int64_t numel) {
    // 256-byte alignment for every tensor, as for the parameter buffer.
    const int64_t bytes = (numel * static_cast<int64_t>(dtype_size(dtype)) + 255) / 256 * 256;
    used_ += bytes;
    if (blocks_.empty() || fill_ + bytes > block_bytes(blocks_.back())) {
      blocks_.push_back(alloc_bytes(std::max<int64_t>(bytes, 1 << 20)));
      fill_ = 0;
    }
    Tensor t;
    t.data = static_cast<char*>(blocks_.back().data) + fill_;
    t.dtype = dtype;
    t.numel = numel;
    fill_ += bytes;
    return t;
  }
  // take() then zero: gradient buffers, which backward ops accumulate into.
  Tensor take_zeroed(DType dtype, int64_t numel) {
    Tensor t = take(dtype, numel);
    backend_.zero(t);
    return t;
  }

  // Where the next take() would start: a replayed pass (Backend::capture) takes nothing
  // itself, so the arena is put back where the captured one left it, for what follows.
  struct Mark {
    size_t blocks = 0;
    int64_t fill = 0, used = 0;
  };
  Mark mark() const { return Mark{blocks_.size(), fill_, used_}; }
  void restore(const Mark& at) {
    THPC_CHECK(at.blocks == blocks_.size(), "an arena mark of " << at.blocks << " blocks restored "
                                            "in an arena of " << blocks_.size());
    fill_ = at.fill;
    used_ = at.used;
  }

  void reset() {
    peak_ = std::max(peak_, used_);
    if (blocks_.size() > 1) {
      release();
      blocks_.push_back(alloc_bytes(peak_ + peak_ / 8 * headroom_eighths_));
    }
    used_ = 0;
    fill_ = 0;
  }

 private:
  Tensor alloc_bytes(int64_t bytes) {
    const int64_t element = static_cast<int64_t>(dtype_size(block_dtype_));
    return backend_.alloc(block_dtype_, (bytes + element - 1) / element);
  }
  int64_t block_bytes(const Tensor& block) const {
    return block.numel * static_cast<int64_t>(dtype_size(block_dtype_));
  }
  void release() {
    for (Tensor& block : blocks_) backend_.free(block);
    blocks_.clear();
  }

  Backend& backend_;
  DType block_dtype_;
  // The new block's headroom over the biggest pass, in eighths of it: 1 in host memory,
  // where every page of a new block is faulted in afresh when first written. Passes of
  // different length buckets differ by a few percent (the CPU small preset's 160 MB
  // decoder arena: 1-4%), so an exact fit grew at most new buckets, each time faulting in
  // the whole arena again: 200,000 page faults (800 MB) in the benchmark's steps 3-10,
  // none with the headroom. 0 in device memory, which has no such cost and is scarcer.
  int headroom_eighths_;
  std::vector<Tensor> blocks_;
  int64_t fill_ = 0;  // bytes used of the last block
  int64_t used_ = 0;  // bytes taken since the last reset
  int64_t peak_ = 0;
};

}  // namespace thpc
