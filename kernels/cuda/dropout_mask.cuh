// The dropout masks of the CUDA kernels (elementwise.cu, layernorm.cu): element e of a
// call is kept iff dropout_keep(seed, site, step, stream, e, p) (common/philox.h), the
// CPU's draw, so the GPU drops exactly the elements the CPU twin drops. A Philox4x32-10
// call (~60 integer instructions) yields the words of four consecutive elements (counter
// e / 4, lane e % 4), so kernels take elements in groups of four and call it once per
// group. The draws are host code too (THPC_HOST_DEVICE), so that a kernel body run on
// the host in a test (vector_norm.cuh's) draws the same masks.
#pragma once

#include <cstdint>

#include "common/error.h"
#include "common/philox.h"
#include "kernels/ops.h"

// Unrolled in the device pass (nvcc's host pass and g++ know no such pragma).
#if defined(__CUDA_ARCH__)
#define THPC_MASK_UNROLL _Pragma("unroll")
#else
#define THPC_MASK_UNROLL
#endif

namespace thpc::cuda {

// The mask of one call. draw == false (p == 0, or no output needs the mask) keeps
// everything without drawing.
// inputs: DropoutKey::inputs (a captured pass's step and stream, read as the kernel runs),
// or null: step and stream as given.
struct DropMask {
  uint64_t seed;
  uint32_t site, step, stream;
  float p;
  bool draw;
  const StepInputs* inputs;
};

inline DropMask make_mask(const DropoutKey& key, float p, bool needed) {
  return DropMask{key.seed, key.site, key.step, key.stream, p, needed && p > 0.0f, key.inputs};
}

// The step and stream a key draws with as the kernel runs (DropoutKey::inputs).
THPC_HOST_DEVICE uint32_t step_as_it_runs(uint32_t step, const StepInputs* inputs) {
  return inputs != nullptr ? inputs->dropout_step : step;
}
THPC_HOST_DEVICE uint32_t stream_as_it_runs(uint32_t stream, const StepInputs* inputs) {
  return inputs != nullptr ? inputs->dropout_stream : stream;
}

inline void check_probability(float p) {
  THPC_CHECK(p >= 0.0f && p < 1.0f, "dropout probability " << p << " outside [0, 1)");
}

// Inverted dropout's 1 / (1 - p), computed in fp32 exactly as the CPU's keep_scale<float>.
inline float keep_scale(float p) { return 1.0f / (1.0f - p); }

// Bit k set: element 4 * group + k is kept. One Philox call gives the 4 words that
// philox_bits() returns for these 4 elements (counter element >> 2, lane element & 3).
THPC_HOST_DEVICE unsigned keep_bits(const DropMask& mask, int64_t group) {
  if (!mask.draw) return 0xfu;
  const Philox4x32 r =
      philox4x32_10(static_cast<uint32_t>(group), mask.site,
                    step_as_it_runs(mask.step, mask.inputs),
                    stream_as_it_runs(mask.stream, mask.inputs),
                    static_cast<uint32_t>(mask.seed), static_cast<uint32_t>(mask.seed >> 32));
  unsigned bits = 0;
  THPC_MASK_UNROLL
  for (int k = 0; k < 4; ++k) bits |= (uniform_from_bits(r.v[k]) >= mask.p ? 1u : 0u) << k;
  return bits;
}

// Bit k set: element first + k is kept, for k < count <= 4. One Philox call when the
// elements are one group (first a multiple of 4: rows of d % 4 == 0 elements, as the
// model's are), one per element otherwise.
THPC_HOST_DEVICE unsigned keep_bits_at(const DropMask& mask, int64_t first, int count) {
  if (!mask.draw) return 0xfu;
  if ((first & 3) == 0) return keep_bits(mask, first >> 2);
  unsigned bits = 0;
  for (int k = 0; k < count; ++k) {
    const int64_t element = first + k;
    bits |= ((keep_bits(mask, element >> 2) >> (element & 3)) & 1u) << k;
  }
  return bits;
}

}  // namespace thpc::cuda
