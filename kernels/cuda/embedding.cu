// Token embedding with positional encoding on the GPU (§3.4, §3.5):
//   forward:  out[r, :] = table[tokens[r], :] * sqrt(d_model) + PE[r % length, :]
//   backward: d_table[t, :] += scale * sum_{r: tokens[r] = t} d_out[r, :]
//             d_positions[p, :] += sum_{r: r % length = p} d_out[r, :] (learned positions)
// CPU twin: kernels/cpu/embedding.cc.
//
// Shape: the forward is a gather, 1 multiply-add per element and rows * d * (read table
// row + position row + write) bytes: memory-bound, one grid-stride pass with
// consecutive threads on consecutive columns (coalesced within each row).
// The backward is a scatter-add into d_table with repeated tokens (padding and frequent
// words occur many times per batch). Without floating-point atomics and with a fixed
// order it is done as: (1) radix-sort the (token, row) pairs by token with CUB's stable
// DeviceRadixSort (rows of one token stay in ascending row order; temp storage from the
// Context scratch); (2) one block per sorted position; the block at the start of a
// token's run sums that token's rows, column-parallel (coalesced), in row order, into
// the fp32 d_table row it alone owns. Each (token, column) is thus the same chain of
// fp32 roundings as the CPU's loop over rows: in fp32 mode d_table is bit-identical to
// the CPU's, and two calls always agree bitwise. The reads are rows * d * sizeof(T) plus
// one read-modify-write of each touched d_table row; the sort moves 8 bytes per row
// per radix pass, negligible next to d_out.
// Learned positions: one thread per (position, column) sums the rows r = p, p + length,
// ... (the sentences in order), again the CPU's order.
//
// Token ids outside [0, vocab) are an error on the CPU (it throws). The GPU cannot
// throw from a kernel without a synchronisation, so the forward writes NaN into such a
// row (the loss becomes NaN, which the trainer reports) and the backward skips it;
// neither reads or writes out of bounds.
#include <cub/device/device_radix_sort.cuh>

#include <algorithm>
#include <cstdint>

#include "common/error.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/device_util.cuh"

namespace thpc::cuda {
namespace {

template <typename T>
__global__ void embedding_forward_kernel(T* out, const int32_t* tokens, const T* table,
                                         const T* positions, int rows, int length, int d,
                                         int vocab, float scale) {
  const int64_t total = static_cast<int64_t>(rows) * d;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += stride) {
    const int64_t row = i / d;
    const int64_t col = i - row * d;
    const int32_t token = tokens[row];
    float value = __int_as_float(0x7fc00000);  // NaN: token outside the vocabulary
    if (token >= 0 && token < vocab) {
      // As the CPU: the scaled token vector is rounded (fp32), then the position added.
      value = __fmul_rn(to_float(table[static_cast<int64_t>(token) * d + col]), scale);
      if (positions != nullptr) {
        value = __fadd_rn(value, to_float(positions[(row % length) * d + col]));
      }
    }
    store(out, i, value);
  }
}

// Sort input: key = token (vocab for an invalid one, sorted last and skipped), value = row.
__global__ void sort_input_kernel(uint32_t* keys, int32_t* rows_of, const int32_t* tokens,
                                  int rows, int vocab) {
  const int stride = gridDim.x * blockDim.x;
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < rows; i += stride) {
    const int32_t token = tokens[i];
    keys[i] = (token >= 0 && token < vocab) ? static_cast<uint32_t>(token)
                                            : static_cast<uint32_t>(vocab);
    rows_of[i] = i;
  }
}

// Block b looks at sorted position b. If it starts a token's run, the block finds the
// run's end and adds scale * d_out[row, :] for the run's rows, in row order, to
// d_table[token, :]. Every branch before the column loop is uniform across the block.
template <typename T>
__global__ void embedding_table_backward_kernel(float* d_table, const uint32_t* keys,
                                                const int32_t* rows_of, const T* d_out,
                                                int rows, int d, int vocab, float scale) {
  const int start = blockIdx.x;
  const uint32_t token = keys[start];
  if (token >= static_cast<uint32_t>(vocab)) return;  // invalid token
  if (start > 0 && keys[start - 1] == token) return;   // inside a run, not its start
  // The run is a prefix of the positions from `start` on: count it a chunk at a time.
  int end = start;
  for (int chunk = start; chunk < rows; chunk += blockDim.x) {
    const int j = chunk + static_cast<int>(threadIdx.x);
    const int matches = __syncthreads_count(j < rows && keys[j] == token);
    end = chunk + matches;
    if (matches < static_cast<int>(blockDim.x)) break;
  }
  float* dst = d_table + static_cast<int64_t>(token) * d;
  for (int col = threadIdx.x; col < d; col += blockDim.x) {
    float acc = dst[col];
#pragma unroll 4
    for (int j = start; j < end; ++j) {
      const float g = to_float(d_out[static_cast<int64_t>(rows_of[j]) * d + col]);
      acc = __fadd_rn(acc, __fmul_rn(g, scale));
    }
    dst[col] = acc;
  }
}

// d_positions[p, col] += d_out[r, col] for r = p, p + length, ... < rows, in that order.
template <typename T>
__global__ void embedding_positions_backward_kernel(float* d_positions, const T* d_out,
                                                    int rows, int length, int d) {
  const int64_t total = static_cast<int64_t>(length < rows ? length : rows) * d;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += stride) {
    const int64_t position = i / d;
    const int64_t col = i - position * d;
    float acc = d_positions[i];
    for (int64_t row = position; row < rows; row += length) {
      acc = __fadd_rn(acc, to_float(d_out[row * d + col]));
    }
    d_positions[i] = acc;
  }
}

size_t align256(size_t bytes) { return (bytes + 255) / 256 * 256; }

// Radix-sort bits covering the keys 0..vocab (vocab marks invalid tokens).
int key_bits(int vocab) {
  int bits = 1;
  while (bits < 32 && (uint64_t{1} << bits) <= static_cast<uint64_t>(vocab)) ++bits;
  return bits;
}

}  // namespace

template <typename T>
void embedding_forward(Context& context, T* out, const int32_t* tokens, const T* table,
                       const T* positions, int rows, int length, int d, int vocab,
                       float scale) {
  const cudaStream_t stream = context.stream();
  THPC_CHECK(rows == 0 || length > 0, "embedding of " << rows << " rows with length " << length);
  if (rows <= 0 || d <= 0) return;
  embedding_forward_kernel<<<grid_blocks(static_cast<int64_t>(rows) * d), kGridThreads, 0, stream>>>(
      out, tokens, table, positions, rows, length, d, vocab, scale);
  THPC_CUDA_CHECK_LAUNCH("embedding_forward_kernel");
}

// d_table[tokens[r]] += d_out[r] * scale (and d_positions[r % length] += d_out[r] when
// d_positions is non-null), rows with the same token summed in row order.
template <typename T>
void embedding_backward(Context& context, float* d_table, float* d_positions, const T* d_out,
                        const int32_t* tokens, int rows, int length, int d, int vocab,
                        float scale) {
  THPC_CHECK(rows == 0 || length > 0, "embedding of " << rows << " rows with length " << length);
  if (rows <= 0 || d <= 0) return;
  const cudaStream_t stream = context.stream();

  if (d_table != nullptr) {
    const int end_bit = key_bits(vocab);
    size_t sort_bytes = 0;
    THPC_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(
        nullptr, sort_bytes, static_cast<const uint32_t*>(nullptr), static_cast<uint32_t*>(nullptr),
        static_cast<const int32_t*>(nullptr), static_cast<int32_t*>(nullptr), rows, 0, end_bit,
        stream));
    const size_t keys_bytes = align256(sizeof(uint32_t) * static_cast<size_t>(rows));
    const size_t rows_bytes = align256(sizeof(int32_t) * static_cast<size_t>(rows));
    char* scratch = static_cast<char*>(
        context.scratch(2 * keys_bytes + 2 * rows_bytes + align256(sort_bytes)));
    auto* keys_in = reinterpret_cast<uint32_t*>(scratch);
    auto* keys_out = reinterpret_cast<uint32_t*>(scratch + keys_bytes);
    auto* rows_in = reinterpret_cast<int32_t*>(scratch + 2 * keys_bytes);
    auto* rows_out = reinterpret_cast<int32_t*>(scratch + 2 * keys_bytes + rows_bytes);
    void* sort_temp = scratch + 2 * keys_bytes + 2 * rows_bytes;

    sort_input_kernel<<<grid_blocks(rows), kGridThreads, 0, stream>>>(keys_in, rows_in, tokens, rows,
                                                               vocab);
    THPC_CUDA_CHECK_LAUNCH("sort_input_kernel");
    THPC_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(sort_temp, sort_bytes, keys_in, keys_out,
                                                    rows_in, rows_out, rows, 0, end_bit,
                                                    stream));
    // A warp-multiple block covering d (up to 256 columns at a time).
    const int threads = std::min(256, (d + 31) / 32 * 32);
    embedding_table_backward_kernel<<<rows, threads, 0, stream>>>(d_table, keys_out, rows_out,
                                                                  d_out, rows, d, vocab, scale);
    THPC_CUDA_CHECK_LAUNCH("embedding_table_backward_kernel");
  }

  if (d_positions != nullptr) {
    const int64_t work = static_cast<int64_t>(std::min(length, rows)) * d;
    embedding_positions_backward_kernel<<<grid_blocks(work), kGridThreads, 0, stream>>>(
        d_positions, d_out, rows, length, d);
    THPC_CUDA_CHECK_LAUNCH("embedding_positions_backward_kernel");
  }
}

THPC_CUDA_TWIN(embedding_forward)
THPC_CUDA_TWIN(embedding_backward)

}  // namespace thpc::cuda
