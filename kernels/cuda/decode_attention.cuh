// A decoding step's self-attention over the shared-prefix cache, a warp per (hypothesis,
// head): written without a GPU (2026-11-30) behind train.cuda_kernels / --cuda-kernels
// decode_attention (issue 53: "attention over the cache as one kernel for all heads"); its
// twins and memcheck passed on an H200 on 2026-12-04, and it is the default since.
//
// What it computes is the gathered kernel's (attention.cu, gathered_attention_kernel;
// the CPU twin kernels/cpu/attention.cc is the specification), with the same roundings:
//   S_j = q . k_rows[j] / sqrt(d_k) (fp32) over the visible keys j,
//   P_j = exp(S_j - max S) / sum (fp32), rounded to T,  out = sum_j P_j v_rows[j] (fp32),
// rounded once; P saved when asked (zeros past the visible keys). No dropout (decoding
// has none), forward only.
//
// Why another kernel. The gathered kernel runs a block per (hypothesis, head) whose four
// warps take the keys in turn, a warp per key: each key's 64 products are summed by a
// five-step butterfly, so a warp's keys follow one another, each a trip to memory, and
// the values likewise, a pass over the keys per 32 columns. In the H200's decoding
// profile (2026-11-27, bench/RESULTS.md) attention was 17.2 of 96.0 ms a batch of 32
// sentences and 26.6 of 133.2 in 4,096-token batches, the largest class after the GEMMs.
// Here a lane takes a key: its 64 products in registers from eight 16-byte loads, the
// warp's 32 keys' loads all in flight at once, no butterfly per key; the row's max and
// sum are one butterfly each; then the lanes take the output's 64 columns 8 at a time and
// the keys in four groups, each lane four value rows' 16-byte loads in flight at a time,
// and the groups' sums meet in a two-step butterfly. A block holds four warps, four heads
// of one hypothesis, which share the hypothesis' list of cache rows.
//
// Limits (decode_attention_fits): gathered key rows (AttentionShape::key_rows), d_k =
// d_v = 64, no dropout, key and value rows and the output 16-byte aligned (pointers and
// strides), and the block's shared memory (rows and probabilities: ~20 bytes a key)
// within 48 KiB: ~2,400 keys.
//
// One body, two executions, as short_attention.cuh: the block's work is written once for
// an execution policy X. On the GPU (attention.cu, LaneWarps) each loop over lanes is
// shared among a warp's 32 lanes and warp_max / warp_sum are the fixed butterflies of
// device_util.cuh; in tests/kernels/attention_test.cc (DecodeAttentionOnTheHost.*) each
// of the block's 128 threads is a host thread and the shuffles are emulated, so every
// index, row gather, mask, rounding, butterfly and the shared-memory layout run on the
// CPU against the CPU's attention. What only a GPU can check: races under real timing,
// the vector loads, registers.
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/cuda/short_attention.cuh"  // THPC_SHORT_ATTENTION_HD / _BODY
#include "kernels/ops.h"

// Loops of constant trip count over register arrays are unrolled on the GPU (their
// indices must be constants there, and the loads then issue together); the host run
// takes them as they are.
#if defined(__CUDACC__)
#define THPC_DECODE_UNROLL _Pragma("unroll")
#else
#define THPC_DECODE_UNROLL
#endif

namespace thpc::decode_attention {

constexpr int kHeadWidth = 64;  // d_k = d_v taken
constexpr int kWarps = 4;       // heads a block
constexpr int kThreads = kWarps * 32;
constexpr int kSharedLimit = 48 * 1024;  // what a block may take without opting in

template <typename T>
struct Args {
  T* out;          // [B * Lq, heads * 64]
  T* saved;        // [B, heads, Lq, Lk] or null
  const T* q;      // row b * Lq + t, head h at q + row * ldq + h * 64
  const T* k;      // pool row r, head h at k + r * ldk + h * 64
  const T* v;
  int ldq, ldk, ldv;
  const int32_t* key_rows;     // [B, Lk]: the pool rows of sentence b's keys
  const int32_t* key_lengths;  // [B] or null (all Lk)
  int batch, heads, query_len, key_len;
  bool causal;
  float scale;  // 1 / sqrt(d_k)
};

// The arguments of one call (on the host, for the launch or the host run): the shape's
// fields and the scale 1 / sqrt(d_k).
template <typename T>
inline Args<T> args_of(T* out, T* saved, const T* q, int ldq, const T* k, int ldk, const T* v,
                       int ldv, const AttentionShape& shape) {
  return Args<T>{out, saved, q, k, v, ldq, ldk, ldv, shape.key_rows, shape.key_lengths,
                 shape.batch, shape.heads, shape.query_len, shape.key_len, shape.causal,
                 1.0f / std::sqrt(static_cast<float>(shape.d_k))};
}

// The rows list (Lk int32, rounded up to 4) and each warp's query (64 floats) and
// probabilities (Lk floats).
THPC_SHORT_ATTENTION_HD int shared_bytes(int key_len) {
  const int rows = (key_len + 3) / 4 * 4;
  return 4 * (rows + kWarps * kHeadWidth + kWarps * key_len);
}

// Blocks of a launch: one per (sentence b, query t, group of kWarps heads).
THPC_SHORT_ATTENTION_HD int head_groups(int heads) { return (heads + kWarps - 1) / kWarps; }
THPC_SHORT_ATTENTION_HD int64_t blocks(const AttentionShape& shape) {
  return static_cast<int64_t>(shape.batch) * shape.query_len * head_groups(shape.heads);
}

// Whether a call can take this kernel, besides the pointers'
// alignment, which the launcher checks: a decoding step's gathered keys, heads of 64, no
// dropout, strides that keep every key and value row 16-byte aligned (`element_bytes` the
// type's), and the shared memory within a block's limit (~2,400 keys).
THPC_SHORT_ATTENTION_HD bool fits(const AttentionShape& shape, int ldk, int ldv,
                                  int element_bytes) {
  return shape.key_rows != nullptr && shape.d_k == kHeadWidth && shape.d_v == kHeadWidth &&
         shape.dropout == 0.0f && shape.batch > 0 && shape.heads > 0 && shape.query_len > 0 &&
         shape.key_len > 0 && (static_cast<int64_t>(ldk) * element_bytes) % 16 == 0 &&
         (static_cast<int64_t>(ldv) * element_bytes) % 16 == 0 &&
         shared_bytes(shape.key_len) <= kSharedLimit;
}

// Block `block`'s work (see blocks()): for kWarps heads of query t of sentence b, the
// attention over the sentence's gathered key rows.
template <class X, typename T>
THPC_SHORT_ATTENTION_BODY void block(X& x, const Args<T>& a, int64_t block, char* shared) {
  const int groups = head_groups(a.heads);
  const int group = static_cast<int>(block % groups);
  const int64_t query_row = block / groups;  // b * Lq + t
  const int t = static_cast<int>(query_row % a.query_len);
  const int b = static_cast<int>(query_row / a.query_len);
  // Clamped to [0, Lk] as the batched path's row mask does: never a row past the list.
  int valid = a.key_len;
  if (a.key_lengths != nullptr) {
    const int length = a.key_lengths[b];
    valid = length < 0 ? 0 : (length > a.key_len ? a.key_len : length);
  }
  const int visible = a.causal && t + 1 < valid ? t + 1 : valid;

  int32_t* rows = reinterpret_cast<int32_t*>(shared);
  float* queries = reinterpret_cast<float*>(rows + (a.key_len + 3) / 4 * 4);  // [kWarps, 64]
  float* all_probs = queries + kWarps * kHeadWidth;                            // [kWarps, Lk]
  for (int j = x.first_thread(); j < visible; j += x.thread_step()) {
    rows[j] = a.key_rows[static_cast<int64_t>(b) * a.key_len + j];
  }
  x.sync();

  for (int w = x.first_warp(); w < kWarps; w += x.warp_step()) {
    const int head = group * kWarps + w;
    if (head >= a.heads) continue;  // the whole warp: no block barrier below
    float* query = queries + w * kHeadWidth;
    float* probs = all_probs + static_cast<int64_t>(w) * a.key_len;
    const T* q_row = a.q + query_row * a.ldq + static_cast<int64_t>(head) * kHeadWidth;
    for (int c = x.first_lane(); c < kHeadWidth; c += x.lane_step()) {
      query[c] = x.widen(q_row[c]);
    }
    x.warp_sync();

    // S_j, a lane a key: 64 products in order, from eight loads of 8 elements.
    float row_max = -INFINITY;
    for (int j = x.first_lane(); j < visible; j += x.lane_step()) {
      const T* key = a.k + static_cast<int64_t>(rows[j]) * a.ldk +
                     static_cast<int64_t>(head) * kHeadWidth;
      float values[8][8];
      THPC_DECODE_UNROLL
      for (int part = 0; part < 8; ++part) x.load8(values[part], key + 8 * part);
      float dot = 0.0f;
      THPC_DECODE_UNROLL
      for (int part = 0; part < 8; ++part) {
        THPC_DECODE_UNROLL
        for (int e = 0; e < 8; ++e) dot = x.fma(query[8 * part + e], values[part][e], dot);
      }
      const float score = dot * a.scale;
      probs[j] = score;
      row_max = score > row_max ? score : row_max;
    }
    row_max = x.warp_max(row_max);
    float sum = 0.0f;
    for (int j = x.first_lane(); j < visible; j += x.lane_step()) {
      const float e = x.exp(probs[j] - row_max);
      probs[j] = e;
      sum += e;
    }
    sum = x.warp_sum(sum);
    const float inverse = visible > 0 ? 1.0f / sum : 0.0f;
    for (int j = x.first_lane(); j < visible; j += x.lane_step()) {
      probs[j] = x.widen(x.round(probs[j] * inverse));  // P rounded to T before its product
    }
    if (a.saved != nullptr) {
      T* saved_row = a.saved + ((static_cast<int64_t>(b) * a.heads + head) * a.query_len + t) *
                                   a.key_len;
      for (int j = x.first_lane(); j < a.key_len; j += x.lane_step()) {
        saved_row[j] = x.round(j < visible ? probs[j] : 0.0f);
      }
    }
    x.warp_sync();

    // out = sum_j P_j v_j. Lane (g, c), g = lane / 8 and c = lane % 8, sums columns 8c ..
    // 8c + 7 over the keys j = g, g + 4, g + 8, ... in order, four value rows' 16-byte
    // loads at a time; the four groups' sums are then added by a two-step xor butterfly
    // (every lane ends with the same bits: a + b = b + a), and group 0 writes.
    const int lane = x.lane();
    const int key_group = lane / 8, columns = 8 * (lane % 8);
    const T* value_columns = a.v + static_cast<int64_t>(head) * kHeadWidth + columns;
    float acc[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
    int j = key_group;
    for (; j + 12 < visible; j += 16) {  // keys j, j + 4, j + 8, j + 12
      float values[4][8];
      THPC_DECODE_UNROLL
      for (int u = 0; u < 4; ++u) {
        x.load8(values[u], value_columns + static_cast<int64_t>(rows[j + 4 * u]) * a.ldv);
      }
      THPC_DECODE_UNROLL
      for (int u = 0; u < 4; ++u) {
        THPC_DECODE_UNROLL
        for (int e = 0; e < 8; ++e) acc[e] = x.fma(probs[j + 4 * u], values[u][e], acc[e]);
      }
    }
    for (; j < visible; j += 4) {
      float values[8];
      x.load8(values, value_columns + static_cast<int64_t>(rows[j]) * a.ldv);
      THPC_DECODE_UNROLL
      for (int e = 0; e < 8; ++e) acc[e] = x.fma(probs[j], values[e], acc[e]);
    }
    THPC_DECODE_UNROLL
    for (int e = 0; e < 8; ++e) {
      acc[e] += x.shfl_xor(acc[e], 8);
      acc[e] += x.shfl_xor(acc[e], 16);
    }
    if (key_group == 0) {
      x.store8(a.out + query_row * (static_cast<int64_t>(a.heads) * kHeadWidth) +
                   static_cast<int64_t>(head) * kHeadWidth + columns,
               acc);
    }
  }
}

}  // namespace thpc::decode_attention
