// The dropout draws of the CPU ops, four at a time. The stream is defined element by
// element (common/philox.h: element e is lane e % 4 of the Philox block at counter e / 4),
// and one Philox4x32-10 evaluation yields the whole block, so a loop over consecutive
// elements evaluates it once per four elements instead of once per element. The draws
// are the same bits as dropout_keep's, in any order; only the work differs.
#pragma once

#include <cstdint>

#include "common/philox.h"
#include "kernels/ops.h"

namespace thpc::cpu {

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

}  // namespace thpc::cpu
