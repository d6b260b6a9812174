// The dropout draws of the CPU ops, four at a time. The stream is defined element by
// element (common/philox.h: element e is lane e % 4 of the Philox block at counter e / 4),
// and one Philox4x32-10 evaluation yields the whole block, so a loop over consecutive
// elements evaluates it once per four elements instead of once per element. The draws
// are the same bits as dropout_keep's, in any order; only the work differs.
#pragma once

#include <cstdint>

#include "common/error.h"
#include "common/philox.h"
#include "kernels/ops.h"

namespace thpc::cpu {

inline void check_probability(float p) {
  THPC_CHECK(p >= 0.0f && p < 1.0f, "dropout probability " << p << " outside [0, 1)");
}

// Inverted dropout: kept elements are scaled by 1 / (1 - p) so the expectation of the
// output equals the input and inference needs no rescaling.
template <typename T>
T keep_scale(float p) {
  return T(1) / (T(1) - static_cast<T>(p));
}

// Calls visit(j, keep) for j = 0 .. count - 1, where keep is dropout_keep(key, first + j, p).
template <typename Visit>
void for_each_dropout_draw(const DropoutKey& key, int64_t first, int64_t count, float p,
                           Visit&& visit) {
  int64_t j = 0;
  while (j < count) {
    const uint64_t element = static_cast<uint64_t>(first + j);
    const Philox4x32 block = philox_block(key.seed, key.site, key.step, key.stream, element);
    // The lanes of this block from element's lane to 3, or fewer at the end.
    for (uint32_t lane = element & 3; lane < 4 && j < count; ++lane, ++j) {
      visit(j, uniform_from_bits(block.v[lane]) >= p);
    }
  }
}

// The same draws one element at a time, for a loop that visits consecutive elements in
// order: next() is dropout_keep(key, first + i, p) at its i-th call, one Philox block
// evaluated per four elements.
class DropoutDraws {
 public:
  DropoutDraws(const DropoutKey& key, int64_t first, float p)
      : key_(key), element_(static_cast<uint64_t>(first)), p_(p) {}
  bool next() {
    const uint32_t lane = element_ & 3;
    if (lane == 0 || !loaded_) {
      block_ = philox_block(key_.seed, key_.site, key_.step, key_.stream, element_);
      loaded_ = true;
    }
    ++element_;
    return uniform_from_bits(block_.v[lane]) >= p_;
  }

 private:
  DropoutKey key_;
  uint64_t element_;
  float p_;
  Philox4x32 block_{};
  bool loaded_ = false;
};

}  // namespace thpc::cpu
