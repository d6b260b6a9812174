// Sums over the rows of a [rows, n] matrix, per column, in fp32, deterministic without
// atomics (layernorm.cu's dgamma and dbeta, linear.cu's fused bias gradient): a 2-D grid
// of blocks, each thread owning one column of one chunk of rows, sums its chunk in row
// order into a partial ([chunks, n], Context scratch); column_sums_finish_kernel then adds
// each column's partials in chunk order into the output. Reads are coalesced across the
// columns; the chunking depends on the row count only (with the candidate
// fuller_column_sums on the shape, the element type and the device's SM count), so the
// order of every sum is fixed for a shape on a device.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/cuda_ops.h"

namespace thpc::cuda {

constexpr int kColumnThreads = 256;    // columns per block
constexpr int kMinRowsPerChunk = 64;   // rows one thread sums for a partial
constexpr int kMaxChunks = 65535;      // gridDim.y limit

struct ColumnChunks {
  int rows_per_chunk = kMinRowsPerChunk;
  int chunks = 0;
  // The grid of the partial-sum kernels over n columns.
  dim3 grid(int n) const { return dim3((n + kColumnThreads - 1) / kColumnThreads, chunks); }
};

constexpr int kFewestRowsPerChunk = 8;  // fuller_column_sums' shortest chunk

// The chunks of `rows`, kMinRowsPerChunk rows each; with fill_blocks > 0 (the candidate
// fuller_column_sums) shorter ones, down to kFewestRowsPerChunk rows, until a grid of
// blocks_a_chunk blocks a chunk has fill_blocks blocks. Why: at one rank's batch of
// 3,125 tokens the FFN's [~3,200, 2,048] bf16 ReLU backward had 50 chunks, a block each:
// 50 of an H200's 132 SMs busy, 42 us a call where its ~40 MB take ~10 (bench/RESULTS.md,
// 2026-12-04, the eighth window; the 25,000-token batch's 391 chunks fill the device).
inline ColumnChunks column_chunks(int rows, int blocks_a_chunk = 1, int fill_blocks = 0) {
  ColumnChunks c;
  if (fill_blocks > 0 && blocks_a_chunk > 0) {
    const int wanted_chunks = (fill_blocks + blocks_a_chunk - 1) / blocks_a_chunk;
    const int rows_each = (rows + wanted_chunks - 1) / wanted_chunks;
    c.rows_per_chunk =
        rows_each < kFewestRowsPerChunk
            ? kFewestRowsPerChunk
            : (rows_each > kMinRowsPerChunk ? kMinRowsPerChunk : rows_each);
  }
  if ((rows + c.rows_per_chunk - 1) / c.rows_per_chunk > kMaxChunks) {
    c.rows_per_chunk = (rows + kMaxChunks - 1) / kMaxChunks;
  }
  c.chunks = (rows + c.rows_per_chunk - 1) / c.rows_per_chunk;
  return c;
}

inline int column_blocks(int n) { return (n + kColumnThreads - 1) / kColumnThreads; }

// column_chunks' fill_blocks on `context`: with the candidate fuller_column_sums, three
// blocks an SM (the partial-sum kernels' occupancy: ~70 registers a thread, 256 threads a
// block), once over the device; 0 (64-row chunks whatever the grid) without it.
inline int column_fill_blocks(const Context& context) {
  return context.candidate_kernel(kFullerColumnSums) ? 3 * context.multiprocessors() : 0;
}

// fuller_column_sums' finish: kFinishLanes threads a column, 32 columns a block.
constexpr int kFinishLanes = kColumnThreads / 32;
constexpr int kFinishColumns = kColumnThreads / kFinishLanes;
inline int finish_lane_blocks(int n) { return (n + kFinishColumns - 1) / kFinishColumns; }

// Internal linkage: each .cu file that includes this has its own copy of the kernel.
namespace {

// out_a[col] += sum over chunks (in order) of partial_a[chunk, col]; likewise out_b.
// Either output (and its partials) may be null.
__global__ void column_sums_finish_kernel(float* out_a, float* out_b, const float* partial_a,
                                          const float* partial_b, int chunks, int n) {
  const int col = blockIdx.x * kColumnThreads + threadIdx.x;
  if (col >= n) return;
  float sum_a = 0.0f, sum_b = 0.0f;
  for (int chunk = 0; chunk < chunks; ++chunk) {
    const int64_t index = static_cast<int64_t>(chunk) * n + col;
    if (out_a != nullptr) sum_a += partial_a[index];
    if (out_b != nullptr) sum_b += partial_b[index];
  }
  if (out_a != nullptr) out_a[col] += sum_a;
  if (out_b != nullptr) out_b[col] += sum_b;
}

// column_sums_finish_kernel with kFinishLanes threads a column (the candidate
// fuller_column_sums, whose chunks may be eight times as many): lane l adds chunks l,
// l + kFinishLanes, l + 2 kFinishLanes, ... in order, then one thread adds the lanes'
// sums in lane order: an order fixed for a shape, as the one-thread kernel's is. A warp
// is 32 adjacent columns of one lane: each load a warp's 128 contiguous bytes. Why: one
// thread a column walks its chunks one dependent add at a time, and n / 256 blocks (8 for
// the FFN's 2,048 columns) leave the device nearly idle while they do.
__global__ void __launch_bounds__(kColumnThreads)
    column_sums_finish_lanes_kernel(float* out_a, float* out_b, const float* partial_a,
                                    const float* partial_b, int chunks, int n) {
  __shared__ float lane_sums[2][kFinishLanes][kFinishColumns];
  const int column_in_block = threadIdx.x % kFinishColumns;
  const int lane = threadIdx.x / kFinishColumns;
  const int col = blockIdx.x * kFinishColumns + column_in_block;
  float sum_a = 0.0f, sum_b = 0.0f;
  if (col < n) {
    // Eight chunks' loads in flight a lane (the compiler unrolled four by itself: at one
    // rank's ~400 partial rows a lane's ~50 loads took ~12 round trips to memory).
#pragma unroll 8
    for (int chunk = lane; chunk < chunks; chunk += kFinishLanes) {
      const int64_t index = static_cast<int64_t>(chunk) * n + col;
      if (out_a != nullptr) sum_a += partial_a[index];
      if (out_b != nullptr) sum_b += partial_b[index];
    }
  }
  lane_sums[0][lane][column_in_block] = sum_a;
  lane_sums[1][lane][column_in_block] = sum_b;
  __syncthreads();
  if (lane != 0 || col >= n) return;
  float total_a = 0.0f, total_b = 0.0f;
#pragma unroll
  for (int l = 0; l < kFinishLanes; ++l) {
    total_a += lane_sums[0][l][column_in_block];
    total_b += lane_sums[1][l][column_in_block];
  }
  if (out_a != nullptr) out_a[col] += total_a;
  if (out_b != nullptr) out_b[col] += total_b;
}

// The finish of either kind, on `stream`: with `lanes` (fuller_column_sums) the lanes'.
inline void finish_column_sums(float* out_a, float* out_b, const float* partial_a,
                               const float* partial_b, int chunks, int n, bool lanes,
                               cudaStream_t stream) {
  if (lanes) {
    column_sums_finish_lanes_kernel<<<finish_lane_blocks(n), kColumnThreads, 0, stream>>>(
        out_a, out_b, partial_a, partial_b, chunks, n);
  } else {
    column_sums_finish_kernel<<<column_blocks(n), kColumnThreads, 0, stream>>>(
        out_a, out_b, partial_a, partial_b, chunks, n);
  }
}

}  // namespace

}  // namespace thpc::cuda
