// Sums over the rows of a [rows, n] matrix, per column, in fp32, deterministic without
// atomics (layernorm.cu's dgamma and dbeta, linear.cu's fused bias gradient): a 2-D grid
// of blocks, each thread owning one column of one chunk of rows, sums its chunk in row
// order into a partial ([chunks, n], Context scratch); column_sums_finish_kernel then adds
// each column's partials in chunk order into the output. Reads are coalesced across the
// columns; the chunking depends on the row count only, so the order of every sum is
// fixed for a shape.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

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

inline ColumnChunks column_chunks(int rows) {
  ColumnChunks c;
  if ((rows + c.rows_per_chunk - 1) / c.rows_per_chunk > kMaxChunks) {
    c.rows_per_chunk = (rows + kMaxChunks - 1) / kMaxChunks;
  }
  c.chunks = (rows + c.rows_per_chunk - 1) / c.rows_per_chunk;
  return c;
}

inline int column_blocks(int n) { return (n + kColumnThreads - 1) / kColumnThreads; }

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

}  // namespace

}  // namespace thpc::cuda
