// Attention in registers: bf16 attention with d_k = d_v = 64 and query and key lengths up
// to 128 (every training bucket of the configs), on the tensor cores' warp-level
// mma.sync m16n8k16 with the scores, probabilities and products held in registers.
// Written without a GPU (2026-11-29) behind train.cuda_kernels = fused_attention (issue
// 51: attention ran at 16.7 TFLOP/s in the H200's base step; goal 100).
//
// What it computes is attention.cu's (the CPU twin kernels/cpu/attention.cc is the
// specification), with the same roundings as the short kernels (short_attention.cuh):
//   S = Q K^T / sqrt(d_k) (fp32),  P = softmax over the visible keys (masked: exactly 0),
//   P' = P * M / (1 - p),  out = P' V;
//   dV = P'^T dO,  dP = (dO V^T) * M / (1 - p),  dS = P * (dP - rowsum(dP * P)),
//   dQ = dS K / sqrt(d_k),  dK = dS^T Q / sqrt(d_k);
// S, dP and the row statistics in fp32, P, P' and dS rounded to bf16 before their
// products, products accumulated in fp32 and rounded once (plus the old gradient in fp32
// when added into). P is saved [B, h, Lq, Lk] as every path saves it, so any backward
// can follow any forward.
//
// Why a third kernel. The short kernels (one block per (sentence, head), the whole score
// matrix in shared memory, wmma tiles stored and reloaded between phases) halve
// attention up to 32 pieces and lose from 64 (bench/RESULTS.md, fourth GPU window): a
// block of 4 warps walks L^2 scores through shared memory alone, and at 96 pieces an SM
// holds 2 of them. Here:
// * Forward: a warp owns 16 queries of one pair, K and V of the pair in its group's shared
//   memory. S for the call's keys sits in its registers as mma accumulators (8 floats a
//   thread per 16 keys), the row's max and sum are combined across the 4 lanes that share
//   a row by two shuffles, P is rounded once, written to `saved`, and its accumulator
//   layout IS the A operand layout of the next product (two 16x8 accumulator tiles = one
//   16x16 A tile), so out = P' V needs no trip through memory. No block barrier after
//   the loads.
// * Backward in two launches, deterministic (no atomics): query blocks, dP' = dO V^T in
//   registers, rowsum and dS, dQ = dS K / 8 from the same registers, dS written to
//   scratch ([B, h, Lq, Lk] bf16, when dK is wanted); then key blocks (a warp per 16
//   keys), dV = P'^T dO and dK = dS^T Q / 8 with P' and dS read back transposed by
//   ldmatrix.trans.
// * Second design (2026-12-04, after the first ran at 9 TFLOP/s on the H200, slower than
//   the kernels it would replace at every length): the forward and the query blocks are
//   instantiated per key-step count KS (16 keys each, with_key_steps), so that registers
//   and unrolled loops are the call's keys, not 128 (the first: 116 and 138 registers,
//   ~15,000 PTX instructions a kernel, every score loop over 128 keys at 12 pieces); a
//   block packs up to four pairs when a pair's rows fill fewer than four warps (Packing;
//   a block a pair left three of its four warps idle at 12 pieces); dropout's draws are
//   out of line and one Philox block a pair of elements (kept_pair; the base model has
//   no attention dropout, and the inlined draws were most of the code it jumped over).
// FLOPs are the GEMMs' (4 Lq Lk 64 forward, 8 Lq Lk 64 backward); bytes are the inputs
// once per group, P written and read once, dS written and read once.
//
// Limits (fused_attention_fits): bf16, d_k = d_v = 64, 1 <= Lq, Lk <= 128, row strides a
// multiple of 8 elements and pointers 16-byte aligned (the launcher checks those).
//
// One body, two executions, as short_attention.cuh: the block's work is written once for
// an execution policy X, per thread, SIMT-style. On the GPU (attention.cu, MmaWarps) X
// issues ldmatrix and mma.sync and __shfl_xor_sync. In tests/kernels/attention_test.cc
// (FusedAttentionOnTheHost.*) each of the block's 128 threads is a host thread, and X
// emulates the warp collectives from the PTX ISA's fragment layouts (which lane holds
// which elements of A, B, C and of an ldmatrix tile): so every index, fragment
// assignment, mask, dropout draw and epilogue of this file runs on the CPU against the
// CPU attention. What only a GPU can check: that the hardware's layouts are the PTX
// ISA's as the emulation reads them, shared-memory races under real timing, registers.
//
// Fragments (m16n8k16, bf16 in, fp32 out; g = lane / 4, c = lane % 4):
//   A 16x16 (4 words of 2 bf16): word 0 (g, 2c..2c+1), 1 (g+8, 2c..), 2 (g, 8+2c..),
//     3 (g+8, 8+2c..); the lower column in the word's low half.
//   B 16x8 (2 words): word 0 (k = 2c..2c+1, n = g), word 1 (k = 8+2c.., n = g).
//   C 16x8 (4 floats): (g, 2c), (g, 2c+1), (g+8, 2c), (g+8, 2c+1).
//   ldmatrix.x4: lanes 8i..8i+7 give the row addresses of 8x8 tile i; lane l receives
//     word i = tile i's (row g, columns 2c..2c+1), or with .trans (rows 2c..2c+1,
//     column g).
#pragma once

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "kernels/cuda/short_attention.cuh"

// Loops over fragment arrays are unrolled on the GPU (register arrays need constant
// indices); the host run takes them as they are.
#if defined(__CUDACC__)
#define THPC_UNROLL _Pragma("unroll")
#else
#define THPC_UNROLL
#endif

namespace thpc::fused_attention {

using short_attention::kHeadWidth;  // 64
using short_attention::kLdHead;     // 72: shared rows of 144 bytes (ldmatrix: no bank conflicts)
constexpr int kMaxLength = kShortAttentionLongest;  // 128: S of 16 rows fits in registers
constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kWarpRows = 16;                   // queries (keys, backward) a warp owns
constexpr int kBlockRows = kWarps * kWarpRows;  // 64: a block's rows when one pair fills it
constexpr int kMaxKeySteps = kMaxLength / 16;   // 8: key steps (16 keys) a warp holds at most
constexpr int kHeadTiles = kHeadWidth / 8;      // n-tiles of an output row: 8

// Everything a block needs: the short kernels' arguments (same fields, same meaning) and
// the backward's dS scratch ([B, h, Lq, Lk], written by the query blocks, read by the key
// blocks; null when dK is not wanted).
template <typename T>
struct Args : short_attention::Args<T> {
  T* d_scores = nullptr;
};

THPC_SHORT_ATTENTION_HD bool fused_attention_fits(int d_k, int d_v, int query_len,
                                                  int key_len, int ldq, int ldk, int ldv) {
  return short_attention::short_attention_fits(d_k, d_v, query_len, key_len, ldq, ldk, ldv);
}

// ---- which kernel, and which block and warp works on what ----

// The key steps (16 keys each) of a call: the forward and the query blocks are
// instantiated for each count (with_key_steps), so that a warp's registers hold and its
// unrolled loops walk its call's keys, not always 128 (the first design's one
// instantiation: 116 and 138 registers, ~15,000 PTX instructions a kernel, and at 12
// pieces every score loop ran over 128 keys).
THPC_SHORT_ATTENTION_HD int key_steps_of(int key_len) { return (key_len + 15) / 16; }

// f(std::integral_constant<int, steps>{}) for steps in [1, kMaxKeySteps]: the host's
// choice of instantiation (the launcher's and the host run's in the tests).
template <class F>
inline void with_key_steps(int steps, F&& f) {
  switch (steps) {
    case 1: return f(std::integral_constant<int, 1>{});
    case 2: return f(std::integral_constant<int, 2>{});
    case 3: return f(std::integral_constant<int, 3>{});
    case 4: return f(std::integral_constant<int, 4>{});
    case 5: return f(std::integral_constant<int, 5>{});
    case 6: return f(std::integral_constant<int, 6>{});
    case 7: return f(std::integral_constant<int, 7>{});
    default: return f(std::integral_constant<int, kMaxKeySteps>{});
  }
}
static_assert(kMaxKeySteps == 8, "with_key_steps' cases");

// Shared memory a block may take: the first design's largest (a query block of 64 rows
// with K and V of 128 keys, under the 48 KB every device gives without opting in; a key
// block of Q, dO, P' and dS of 128 queries, opted in as the short kernels are).
constexpr int kQueryBlockBytes = (kBlockRows + 2 * kMaxLength) * kLdHead * 2;  // 46,080
constexpr int kKeyBlockBytes = 4 * kMaxLength * kLdHead * 2;                   // 73,728

// How a launch's blocks and warps cover its (sentence, head) pairs. A warp owns 16 rows
// (queries in the forward and the backward's query blocks, keys in its key blocks); the
// warps on one pair's rows are a group, with shared arrays of its own, and a block holds
// up to kWarps / warps_per_pair groups, so that short sentences keep a block's four warps
// busy (a block a pair left three of four idle at 12 pieces: 19.4 ms a base step against
// the short kernels' 5.1 on the H200, 2026-12-04). Past 64 rows a pair takes more blocks.
struct Packing {
  int warps_per_pair = kWarps;  // 1, 2 or 4: a pair's rows / 16, rounded up to one of them
  int pairs_per_block = 1;      // kWarps / warps_per_pair, fewer where shared memory caps it
  int blocks_per_pair = 1;      // blocks on one pair's rows: > 1 only past 64 rows
  int pairs = 0;                // the launch's (batch x heads)
  int group_bytes = 0;          // one group's shared arrays
  THPC_SHORT_ATTENTION_HD int group_rows() const { return warps_per_pair * kWarpRows; }
  THPC_SHORT_ATTENTION_HD int blocks() const {
    return (pairs + pairs_per_block - 1) / pairs_per_block * blocks_per_pair;
  }
  THPC_SHORT_ATTENTION_HD int bytes() const { return pairs_per_block * group_bytes; }
  // Of block `block`: its first pair, and the first row of its groups' rows.
  THPC_SHORT_ATTENTION_HD int first_pair(int block) const {
    return block / blocks_per_pair * pairs_per_block;
  }
  THPC_SHORT_ATTENTION_HD int first_row(int block) const {
    return block % blocks_per_pair * group_rows();
  }
};

THPC_SHORT_ATTENTION_HD int warps_per_pair_of(int rows) {
  const int warps = (rows + kWarpRows - 1) / kWarpRows;
  return warps <= 1 ? 1 : warps <= 2 ? 2 : kWarps;
}

// `rows` a pair (queries or keys), groups of `group_bytes` each, blocks of at most `cap`.
THPC_SHORT_ATTENTION_HD Packing packed(int rows, int pairs, int group_bytes, int cap) {
  Packing p;
  p.warps_per_pair = warps_per_pair_of(rows);
  p.pairs_per_block = kWarps / p.warps_per_pair;
  while (p.pairs_per_block > 1 && p.pairs_per_block * group_bytes > cap) --p.pairs_per_block;
  p.blocks_per_pair = (rows + p.group_rows() - 1) / p.group_rows();
  p.pairs = pairs;
  p.group_bytes = group_bytes;
  return p;
}

// The forward's and the backward's query blocks: a group holds its rows of Q (forward) or
// dO (backward), and K and V of every key ([rows, kLdHead] bf16 arrays).
THPC_SHORT_ATTENTION_HD Packing query_packing(int query_len, int key_len, int pairs) {
  const int group_bytes =
      (warps_per_pair_of(query_len) * kWarpRows + 2 * short_attention::round_up(key_len, 16)) *
      kLdHead * 2;
  return packed(query_len, pairs, group_bytes, kQueryBlockBytes);
}

// The backward's key blocks: a group holds dO and Q of every query, and its keys' columns
// of P' and dS for every query.
THPC_SHORT_ATTENTION_HD Packing key_packing(int query_len, int key_len, int pairs) {
  return packed(key_len, pairs, 4 * short_attention::round_up(query_len, 16) * kLdHead * 2,
                kKeyBlockBytes);
}

// ---- dropout's draws, out of line ----

// Bit e set: element `element + e` (e = 0, 1) of the call's P is kept, the draws of
// short_attention::dropout_factor, from dropout_mask.cuh's keep_bits: one Philox block for
// both unless `element` is the last of its four (the fused bodies ask for pairs whose
// first element is even when Lk is). Out of line on the GPU: a draw inlined at each of a
// warp's 64 pairs was most of the first design's ~15,000 instructions a kernel, jumped
// over where there is no dropout (the base model has none, attention_dropout = 0).
#if defined(__CUDACC__)
#define THPC_FUSED_ATTENTION_COLD static __device__ __noinline__
#else
#define THPC_FUSED_ATTENTION_COLD static inline
#endif
THPC_FUSED_ATTENTION_COLD unsigned kept_pair(uint64_t seed, uint32_t site, uint32_t step,
                                             uint32_t stream, const StepInputs* inputs,
                                             float p, int64_t element) {
  const cuda::DropMask mask{seed, site, step, stream, p, true, inputs};
  const int lane = static_cast<int>(element & 3);
  if (lane < 3) return (cuda::keep_bits(mask, element >> 2) >> lane) & 3u;
  return cuda::keep_bits_at(mask, element, 2);
}

// The dropout factors (keep_scale or 0) of elements `element` and `element + 1`.
template <typename T>
THPC_SHORT_ATTENTION_BODY void pair_factors(const Args<T>& a, int64_t element, float (&f)[2]) {
  const unsigned kept = kept_pair(a.seed, a.site, a.step, a.stream, a.inputs, a.dropout, element);
  f[0] = (kept & 1u) != 0 ? a.keep_scale : 0.0f;
  f[1] = (kept & 2u) != 0 ? a.keep_scale : 0.0f;
}

// ---- what a lane does with its fragments ----

// Four lanes (a quad: lanes 4g..4g+3) hold one accumulator row between them; their values
// combined by two xor shuffles (every lane of the quad gets the same bits).
template <class X>
THPC_SHORT_ATTENTION_BODY float quad_max(X& x, float value) {
  value = fmaxf(value, x.shfl_xor(value, 1));
  return fmaxf(value, x.shfl_xor(value, 2));
}
template <class X>
THPC_SHORT_ATTENTION_BODY float quad_sum(X& x, float value) {
  value += x.shfl_xor(value, 1);
  return value + x.shfl_xor(value, 2);
}

// Accumulators set to zero (an unrolled loop: register arrays need constant indices).
template <int kTiles>
THPC_SHORT_ATTENTION_BODY void zero_accumulators(float (&acc)[kTiles][4]) {
  THPC_UNROLL
  for (int n = 0; n < kTiles; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;
}

// A fragments of the 16 rows a warp owns, from a [rows, kLdHead] shared array whose row
// `first_row` is the warp's first: the 4 k-steps of the head width.
template <class X, typename T>
THPC_SHORT_ATTENTION_BODY void load_row_fragments(X& x, uint32_t (&a)[4][4], const T* rows,
                                                  int first_row) {
  const int lane = x.lane();
  THPC_UNROLL
  for (int kk = 0; kk < 4; ++kk) {
    // Tiles (rows 0-7, cols 0-7), (rows 8-15, cols 0-7), (rows 0-7, 8-15), (8-15, 8-15).
    x.ldmatrix_x4(a[kk], rows + (first_row + (lane & 15)) * kLdHead + kk * 16 + (lane >> 4) * 8);
  }
}

// acc[n] += A B_n over the head width for the n-tiles n < 2 KS (8 columns each) whose
// keys some row sees (`keys`): B_n^T is rows [8n, 8n + 8) of the shared [rows, kLdHead]
// array `heads` (K for S = Q K^T, V for dP' = dO V^T).
template <int KS, class X, typename T>
THPC_SHORT_ATTENTION_BODY void rows_times_heads(X& x, float (&acc)[2 * KS][4],
                                                const uint32_t (&a)[4][4], const T* heads,
                                                int keys) {
  const int lane = x.lane(), tile = lane >> 3, row = lane & 7;
  THPC_UNROLL
  for (int pair = 0; pair < KS; ++pair) {
    if (pair * 16 >= keys) break;  // warp-uniform
    THPC_UNROLL
    for (int kk = 0; kk < 4; ++kk) {
      // Tiles (keys 0-7, cols 0-7), (keys 0-7, cols 8-15), (keys 8-15, 0-7), (8-15, 8-15):
      // words 0, 1 are n-tile 2 pair's B, words 2, 3 n-tile 2 pair + 1's.
      uint32_t b[4];
      x.ldmatrix_x4(b, heads + (pair * 16 + (tile >> 1) * 8 + row) * kLdHead + kk * 16 +
                           (tile & 1) * 8);
      x.mma(acc[2 * pair], a[kk], b[0], b[1]);
      x.mma(acc[2 * pair + 1], a[kk], b[2], b[3]);
    }
  }
}

// out[n] += A B_kk for the 8 n-tiles of the head width: A one probability fragment (P'
// or dS of key step kk; backward's key blocks: P'^T or dS^T of query step kk), B_kk rows
// [16 kk, +16) of the shared [rows, kLdHead] array `heads` (V for out, K for dQ; dO for
// dV, Q for dK), read transposed.
template <class X, typename T>
THPC_SHORT_ATTENTION_BODY void probability_step_times_heads(X& x, float (&out)[kHeadTiles][4],
                                                            const uint32_t (&a)[4],
                                                            const T* heads, int kk) {
  const int lane = x.lane(), tile = lane >> 3, row = lane & 7;
  THPC_UNROLL
  for (int pair = 0; pair < kHeadTiles / 2; ++pair) {
    // Tiles (keys 0-7, cols 0-7), (keys 8-15, cols 0-7), (keys 0-7, 8-15), (8-15, 8-15),
    // transposed: words 0, 1 are n-tile 2 pair's B, words 2, 3 n-tile 2 pair + 1's.
    uint32_t b[4];
    x.ldmatrix_x4_trans(b, heads + (kk * 16 + (tile & 1) * 8 + row) * kLdHead + pair * 16 +
                               (tile >> 1) * 8);
    x.mma(out[2 * pair], a, b[0], b[1]);
    x.mma(out[2 * pair + 1], a, b[2], b[3]);
  }
}

// The same over the key steps kk < steps (the fragments past them are zeros).
template <int KS, class X, typename T>
THPC_SHORT_ATTENTION_BODY void probabilities_times_heads(X& x, float (&out)[kHeadTiles][4],
                                                         const uint32_t (&a)[KS][4],
                                                         const T* heads, int steps) {
  THPC_UNROLL
  for (int kk = 0; kk < KS; ++kk) {
    if (kk >= steps) break;  // warp-uniform
    probability_step_times_heads(x, out, a[kk], heads, kk);
  }
}

// The warp's 16 x 64 product (accumulators out) to rows [first, first + 16) of `to` (row
// stride ld; rows from `rows` on are not written), times `scale`, added to what `to`
// holds unless `write`.
template <class X, typename T>
THPC_SHORT_ATTENTION_BODY void store_rows(X& x, const float (&out)[kHeadTiles][4], T* to,
                                          int64_t ld, int first, int rows, float scale,
                                          bool write) {
  const int lane = x.lane(), g = lane >> 2, c = lane & 3;
  THPC_UNROLL
  for (int half = 0; half < 2; ++half) {
    const int r = first + g + 8 * half;
    if (r >= rows) continue;
    T* row = to + static_cast<int64_t>(r) * ld;
    THPC_UNROLL
    for (int n = 0; n < kHeadTiles; ++n) {
      const int column = n * 8 + 2 * c;
      float v0 = out[n][2 * half] * scale, v1 = out[n][2 * half + 1] * scale;
      if (!write) {
        v0 += x.widen(row[column]);
        v1 += x.widen(row[column + 1]);
      }
      x.store_pair(row + column, v0, v1);
    }
  }
}

// Elements `element` and `element + 1` of a [.., Lk] row-major matrix (saved P, dS): the
// columns j, j + 1 (j even) a thread's accumulator pair holds, those below Lk. When Lk is
// even, `element` is even too, and the pair moves as one 4-byte access (half the
// instructions, twice the bytes a memory transaction carries); else one at a time.
template <class X, typename T>
THPC_SHORT_ATTENTION_BODY void store_pair_below(X& x, T* matrix, int64_t element, int j,
                                                int Lk, T first, T second) {
  if ((Lk & 1) == 0 && j + 1 < Lk) return x.store_raw_pair(matrix + element, first, second);
  if (j < Lk) matrix[element] = first;
  if (j + 1 < Lk) matrix[element + 1] = second;
}
template <class X, typename T>
THPC_SHORT_ATTENTION_BODY void load_pair_below(X& x, const T* matrix, int64_t element, int j,
                                               int Lk, T (&pair)[2]) {
  pair[0] = pair[1] = x.round(0.0f);
  if ((Lk & 1) == 0 && j + 1 < Lk) return x.load_raw_pair(matrix + element, pair);
  if (j < Lk) pair[0] = matrix[element];
  if (j + 1 < Lk) pair[1] = matrix[element + 1];
}

// ---- the query blocks' common part (forward, and backward's first launch) ----

// What a warp of a query block works on: its pair (`none`: no pair, or no query of it),
// the pair's sentence b and head columns, its first query, the keys its queries see, the
// thread's two queries (rows g and g + 8 of the warp's) and their visible keys, and its
// group's shared arrays with the warp's first row in them.
template <typename T>
struct QueryWarp {
  bool none;
  int pair;
  int b;
  int64_t column;     // the head's first column
  int first;          // the warp's first query
  int warp_keys;      // keys some of the warp's queries see
  int t_row[2];       // the thread's queries
  int visible[2];     // and their visible keys
  const T* rows;      // shared: the group's rows of Q (forward) or dO (backward)
  int row_in_group;   // the warp's first row in `rows`
  const T* ks;        // shared: K and V of the keys the group's queries see (zeros past)
  const T* vs;
};

// A query block's group `group`: its rows of Q or dO, then K and V of up to `key_capacity`
// keys, each [rows, kLdHead].
template <typename T>
struct QueryGroup {
  T* rows;
  T* ks;
  T* vs;
};
template <typename T>
THPC_SHORT_ATTENTION_BODY QueryGroup<T> query_group(char* shared, const Packing& p, int group,
                                                    int key_capacity) {
  QueryGroup<T> arrays;
  arrays.rows = reinterpret_cast<T*>(shared + group * p.group_bytes);
  arrays.ks = arrays.rows + p.group_rows() * kLdHead;
  arrays.vs = arrays.ks + key_capacity * kLdHead;
  return arrays;
}

// Loads a query block's shared arrays (each group's rows of `from`, row stride ld, zeros
// past Lq; K and V of the keys some query of the group sees, zeros past them, so that a
// pad row's content cannot reach a result as 0 x NaN), passes the block's last barrier,
// and says what the calling thread's warp works on.
template <class X, typename T>
THPC_SHORT_ATTENTION_BODY QueryWarp<T> query_warp(X& x, const Args<T>& a, const Packing& p,
                                                  int block, const T* from, int64_t ld,
                                                  char* shared) {
  const int Lq = a.query_len, Lk = a.key_len;
  const int group_rows = p.group_rows(), first_pair = p.first_pair(block);
  const int first_query = p.first_row(block);
  const int queries = Lq - first_query < group_rows ? Lq - first_query : group_rows;
  const int key_capacity = short_attention::round_up(Lk, 16);
  for (int group = 0; group < p.pairs_per_block && first_pair + group < p.pairs; ++group) {
    const int pair = first_pair + group, b = pair / a.heads;
    const int64_t column = static_cast<int64_t>(pair % a.heads) * kHeadWidth;
    const int valid = short_attention::valid_keys(a, b);  // the sentence's non-pad keys
    const int group_keys =
        a.causal && first_query + queries < valid ? first_query + queries : valid;
    const int key_rows = short_attention::round_up(group_keys, 16);
    const QueryGroup<T> arrays = query_group<T>(shared, p, group, key_capacity);
    short_attention::load_rows(
        x, arrays.rows, from + (static_cast<int64_t>(b) * Lq + first_query) * ld + column, ld,
        queries, group_rows);
    short_attention::load_rows(x, arrays.ks,
                               a.k + static_cast<int64_t>(b) * Lk * a.ldk + column, a.ldk,
                               group_keys, key_rows);
    short_attention::load_rows(x, arrays.vs,
                               a.v + static_cast<int64_t>(b) * Lk * a.ldv + column, a.ldv,
                               group_keys, key_rows);
  }
  x.sync();  // the last block barrier: a warp without work may leave after it

  QueryWarp<T> w;
  const int group = x.warp() / p.warps_per_pair;
  w.pair = first_pair + group;
  w.row_in_group = x.warp() % p.warps_per_pair * kWarpRows;
  w.first = first_query + w.row_in_group;
  w.none = group >= p.pairs_per_block || w.pair >= p.pairs || w.first >= Lq;
  if (w.none) return w;
  w.b = w.pair / a.heads;
  w.column = static_cast<int64_t>(w.pair % a.heads) * kHeadWidth;
  const QueryGroup<T> arrays = query_group<T>(shared, p, group, key_capacity);
  w.rows = arrays.rows;
  w.ks = arrays.ks;
  w.vs = arrays.vs;
  const int valid = short_attention::valid_keys(a, w.b);
  w.warp_keys = a.causal && w.first + kWarpRows < valid ? w.first + kWarpRows : valid;
  const int g = x.lane() >> 2;
  for (int h = 0; h < 2; ++h) {
    w.t_row[h] = w.first + g + 8 * h;
    w.visible[h] = short_attention::visible_keys(a, valid, w.t_row[h]);
  }
  return w;
}

// ---- forward: a warp per 16 queries of a pair, KS key steps in its registers ----

template <int KS, class X, typename T>
THPC_SHORT_ATTENTION_BODY void forward_block(X& x, const Args<T>& a, const Packing& packing,
                                             int block, char* shared) {
  const int Lq = a.query_len, Lk = a.key_len;
  const int64_t ld_out = static_cast<int64_t>(a.heads) * kHeadWidth;
  const QueryWarp<T> w = query_warp(x, a, packing, block, a.q, a.ldq, shared);
  if (w.none) return;
  const int c = x.lane() & 3;

  // S = Q K^T (fp32 accumulators), then / sqrt(64) = 1/8 (exact).
  uint32_t qa[4][4];
  load_row_fragments(x, qa, w.rows, w.row_in_group);
  float s[2 * KS][4];
  zero_accumulators(s);
  rows_times_heads<KS>(x, s, qa, w.ks, w.warp_keys);

  const int(&t_row)[2] = w.t_row;
  const int(&visible)[2] = w.visible;
  float row_max[2] = {-INFINITY, -INFINITY};
  THPC_UNROLL
  for (int n = 0; n < 2 * KS; ++n) {
    THPC_UNROLL
    for (int e = 0; e < 4; ++e) {
      s[n][e] *= 0.125f;
      const int h = e >> 1;
      if (n * 8 + 2 * c + (e & 1) < visible[h]) row_max[h] = fmaxf(row_max[h], s[n][e]);
    }
  }
  // exp(S - max) in place over the visible keys (0 past them), and the row sums.
  float row_scale[2];
  THPC_UNROLL
  for (int h = 0; h < 2; ++h) {
    row_max[h] = quad_max(x, row_max[h]);
    float sum = 0.0f;
    THPC_UNROLL
    for (int n = 0; n < 2 * KS; ++n) {
      THPC_UNROLL
      for (int e = 0; e < 2; ++e) {
        float& value = s[n][2 * h + e];
        value = n * 8 + 2 * c + e < visible[h] ? x.exp(value - row_max[h]) : 0.0f;
        sum += value;
      }
    }
    sum = quad_sum(x, sum);
    row_scale[h] = visible[h] > 0 ? 1.0f / sum : 0.0f;
  }

  // P (rounded once; saved where asked, every key < Lk of the thread's rows < Lq), and P'
  // (from the rounded P, as every path computes it) packed as the A fragments of P' V:
  // n-tiles 2kk and 2kk + 1 of the accumulators are A tile kk.
  const int64_t first_row = static_cast<int64_t>(w.pair) * Lq;  // saved row of query 0
  uint32_t pa[KS][4];
  THPC_UNROLL
  for (int n = 0; n < 2 * KS; ++n) {
    THPC_UNROLL
    for (int h = 0; h < 2; ++h) {
      const int j0 = n * 8 + 2 * c;
      T weight[2];
      THPC_UNROLL
      for (int e = 0; e < 2; ++e) weight[e] = x.round(s[n][2 * h + e] * row_scale[h]);
      const int64_t element0 = (first_row + t_row[h]) * Lk + j0;
      if (a.saved != nullptr && t_row[h] < Lq) {
        store_pair_below(x, a.saved, element0, j0, Lk, weight[0], weight[1]);
      }
      if (a.dropout != 0.0f && j0 < visible[h]) {
        float factor[2];
        pair_factors(a, element0, factor);
        THPC_UNROLL
        for (int e = 0; e < 2; ++e) {
          if (j0 + e < visible[h]) weight[e] = x.round(x.widen(weight[e]) * factor[e]);
        }
      }
      pa[n >> 1][(n & 1) * 2 + h] = x.pack(weight[0], weight[1]);
    }
  }

  // out = P' V over the key steps some of the warp's queries see (P' is 0 past them).
  float o[kHeadTiles][4];
  zero_accumulators(o);
  probabilities_times_heads<KS>(x, o, pa, w.vs, (w.warp_keys + 15) / 16);
  store_rows(x, o, a.out + static_cast<int64_t>(w.b) * Lq * ld_out + w.column, ld_out, w.first,
             Lq, 1.0f, true);
}

// ---- backward, launch 1: query blocks: dS (to scratch) and dQ ----

template <int KS, class X, typename T>
THPC_SHORT_ATTENTION_BODY void query_block_backward(X& x, const Args<T>& a,
                                                    const Packing& packing, int block,
                                                    char* shared) {
  const int Lq = a.query_len, Lk = a.key_len;
  const int64_t ld_out = static_cast<int64_t>(a.heads) * kHeadWidth;
  const QueryWarp<T> w = query_warp(x, a, packing, block, a.d_out, ld_out, shared);
  if (w.none) return;
  const int c = x.lane() & 3;

  // dP' = dO V^T (fp32), then dP = dP' M / (1 - p) in place over the visible keys.
  uint32_t da[4][4];
  load_row_fragments(x, da, w.rows, w.row_in_group);
  float dp[2 * KS][4];
  zero_accumulators(dp);
  rows_times_heads<KS>(x, dp, da, w.vs, w.warp_keys);

  const int(&t_row)[2] = w.t_row;
  const int(&visible)[2] = w.visible;
  const int64_t first_row = static_cast<int64_t>(w.pair) * Lq;
  // rowsum(dP * P) over the visible keys (P read from `saved`; rows past Lq have none).
  float dot[2] = {0.0f, 0.0f};
  THPC_UNROLL
  for (int n = 0; n < 2 * KS; ++n) {
    THPC_UNROLL
    for (int h = 0; h < 2; ++h) {
      const int j0 = n * 8 + 2 * c;
      if (j0 >= visible[h] || t_row[h] >= Lq) continue;
      const int64_t element0 = (first_row + t_row[h]) * Lk + j0;
      T p[2];
      load_pair_below(x, static_cast<const T*>(a.saved), element0, j0, Lk, p);
      float factor[2] = {1.0f, 1.0f};
      if (a.dropout != 0.0f) pair_factors(a, element0, factor);
      THPC_UNROLL
      for (int e = 0; e < 2; ++e) {
        if (j0 + e >= visible[h]) continue;
        float& d = dp[n][2 * h + e];
        if (a.dropout != 0.0f) d *= factor[e];
        dot[h] += d * x.widen(p[e]);
      }
    }
  }
  dot[0] = quad_sum(x, dot[0]);
  dot[1] = quad_sum(x, dot[1]);

  // dS = P (dP - rowsum), 0 where masked: to scratch (every key < Lk of rows < Lq, for the
  // key blocks' dK) and, a key step at a time, packed as the A fragment of that step of
  // dQ = dS K (one fragment live, not KS: registers).
  float dq[kHeadTiles][4];
  zero_accumulators(dq);
  const int steps = a.dq != nullptr ? (w.warp_keys + 15) / 16 : 0;
  THPC_UNROLL
  for (int kk = 0; kk < KS; ++kk) {
    if (kk * 16 >= Lk) break;  // warp-uniform
    uint32_t dsa[4];
    THPC_UNROLL
    for (int half = 0; half < 2; ++half) {
      const int n = 2 * kk + half;
      THPC_UNROLL
      for (int h = 0; h < 2; ++h) {
        const int j0 = n * 8 + 2 * c;
        const int64_t element0 = (first_row + t_row[h]) * Lk + j0;
        T p[2] = {x.round(0.0f), x.round(0.0f)}, d_score[2];  // P where seen, read below
        if (j0 < visible[h] && t_row[h] < Lq) {
          load_pair_below(x, static_cast<const T*>(a.saved), element0, j0, Lk, p);
        }
        THPC_UNROLL
        for (int e = 0; e < 2; ++e) {
          const bool seen = j0 + e < visible[h] && t_row[h] < Lq;
          d_score[e] = x.round(seen ? x.widen(p[e]) * (dp[n][2 * h + e] - dot[h]) : 0.0f);
        }
        if (a.d_scores != nullptr && t_row[h] < Lq) {
          store_pair_below(x, a.d_scores, element0, j0, Lk, d_score[0], d_score[1]);
        }
        dsa[half * 2 + h] = x.pack(d_score[0], d_score[1]);
      }
    }
    if (kk < steps) probability_step_times_heads(x, dq, dsa, w.ks, kk);
  }
  if (a.dq == nullptr) return;
  store_rows(x, dq, a.dq + static_cast<int64_t>(w.b) * Lq * a.ldq + w.column, a.ldq, w.first, Lq,
             0.125f, a.write_dq);
}

// ---- backward, launch 2: key blocks: dV and dK ----

// Thread loop: `columns` key columns from `first_key` of a [Lq, Lk] matrix (P' from
// `saved` with the dropout factor applied when `drop`, or dS from the scratch) into
// [rows, kLdHead], zeros past Lq and past Lk; two columns a thread (one access, one draw).
template <class X, typename T>
THPC_SHORT_ATTENTION_BODY void load_key_columns(X& x, T* to, const Args<T>& a, const T* from,
                                                int64_t first_row, int first_key, int columns,
                                                int rows, bool drop) {
  const int Lq = a.query_len, Lk = a.key_len, pairs_a_row = columns / 2;
  for (int e = x.first_thread(); e < rows * pairs_a_row; e += x.thread_step()) {
    const int t = e / pairs_a_row, column = 2 * (e % pairs_a_row), j0 = first_key + column;
    T pair[2] = {x.round(0.0f), x.round(0.0f)};
    if (t < Lq && j0 < Lk) {
      const int64_t element0 = (first_row + t) * Lk + j0;
      load_pair_below(x, from, element0, j0, Lk, pair);
      if (drop) {
        float factor[2];
        pair_factors(a, element0, factor);
        for (int i = 0; i < 2; ++i) pair[i] = x.round(x.widen(pair[i]) * factor[i]);
      }
    }
    to[t * kLdHead + column] = pair[0];
    to[t * kLdHead + column + 1] = pair[1];
  }
}

// acc += A^T H over the query steps [first_step, steps): A^T are the warp's 16 key
// columns of `columns` ([queries, kLdHead]: P' or dS), read transposed; H rows of the
// shared [queries, kLdHead] array `heads` (dO or Q), read transposed.
template <class X, typename T>
THPC_SHORT_ATTENTION_BODY void columns_times_heads(X& x, float (&acc)[kHeadTiles][4],
                                                   const T* columns, int warp_column,
                                                   const T* heads, int first_step, int steps) {
  const int lane = x.lane(), tile = lane >> 3, row = lane & 7;
  for (int kk = first_step; kk < steps; ++kk) {
    // A = columns^T (keys x queries): tiles (keys 0-7, queries 0-7), (keys 8-15, q 0-7),
    // (keys 0-7, q 8-15), (keys 8-15, q 8-15) are the stored (queries, keys) tiles
    // transposed.
    uint32_t at[4];
    x.ldmatrix_x4_trans(at, columns + (kk * 16 + (tile >> 1) * 8 + row) * kLdHead +
                                warp_column + (tile & 1) * 8);
    // H's rows [16 kk, +16) are B as V's are in out = P' V.
    probability_step_times_heads(x, acc, at, heads, kk);
  }
}

template <class X, typename T>
THPC_SHORT_ATTENTION_BODY void key_block_backward(X& x, const Args<T>& a, const Packing& p,
                                                  int block, char* shared) {
  const int Lq = a.query_len, Lk = a.key_len;
  const int64_t ld_out = static_cast<int64_t>(a.heads) * kHeadWidth;
  const int group_rows = p.group_rows(), first_pair = p.first_pair(block);
  const int first_key = p.first_row(block);
  const int query_rows = short_attention::round_up(Lq, 16);
  const bool want_dk = a.dk != nullptr;
  // A group's arrays, each [query_rows, kLdHead]: dO, Q, and its keys' columns of P', dS.
  enum GroupArray { kDOut, kQ, kPColumns, kDsColumns };
  auto group_array = [&](int group, GroupArray which) {
    return reinterpret_cast<T*>(shared + group * p.group_bytes) + which * query_rows * kLdHead;
  };
  for (int group = 0; group < p.pairs_per_block && first_pair + group < p.pairs; ++group) {
    const int pair = first_pair + group, b = pair / a.heads;
    const int64_t column = static_cast<int64_t>(pair % a.heads) * kHeadWidth;
    const int64_t first_row = static_cast<int64_t>(pair) * Lq;
    if (a.dv != nullptr) {
      short_attention::load_rows(x, group_array(group, kDOut),
                                 a.d_out + static_cast<int64_t>(b) * Lq * ld_out + column,
                                 ld_out, Lq, query_rows);
      load_key_columns(x, group_array(group, kPColumns), a, static_cast<const T*>(a.saved),
                       first_row, first_key, group_rows, query_rows, a.dropout != 0.0f);
    }
    if (want_dk) {
      short_attention::load_rows(x, group_array(group, kQ),
                                 a.q + static_cast<int64_t>(b) * Lq * a.ldq + column, a.ldq,
                                 Lq, query_rows);
      load_key_columns(x, group_array(group, kDsColumns), a, static_cast<const T*>(a.d_scores),
                       first_row, first_key, group_rows, query_rows, false);
    }
  }
  x.sync();

  const int group = x.warp() / p.warps_per_pair, pair = first_pair + group;
  const int warp_column = x.warp() % p.warps_per_pair * kWarpRows;
  const int first = first_key + warp_column;  // the warp's first key
  if (group >= p.pairs_per_block || pair >= p.pairs || first >= Lk) return;
  const int b = pair / a.heads;
  const int64_t column = static_cast<int64_t>(pair % a.heads) * kHeadWidth;
  // Causal: queries before the warp's first key see none of its keys (P' = dS = 0).
  const int first_step = a.causal ? first / 16 : 0;
  const int steps = query_rows / 16;
  float acc[kHeadTiles][4];
  if (a.dv != nullptr) {
    zero_accumulators(acc);
    columns_times_heads(x, acc, group_array(group, kPColumns), warp_column,
                        group_array(group, kDOut), first_step, steps);
    store_rows(x, acc, a.dv + static_cast<int64_t>(b) * Lk * a.ldv + column, a.ldv, first, Lk,
               1.0f, a.write_dv);
  }
  if (want_dk) {
    zero_accumulators(acc);
    columns_times_heads(x, acc, group_array(group, kDsColumns), warp_column,
                        group_array(group, kQ), first_step, steps);
    store_rows(x, acc, a.dk + static_cast<int64_t>(b) * Lk * a.ldk + column, a.ldk, first, Lk,
               0.125f, a.write_dk);
  }
}

// ---- the fragments' layout, probed ----

// One warp's ldmatrix and mma.sync on known values, as the kernels above use them: the
// 16x16 tile T(r, c) = 16 r + c (exact in bf16) in shared memory ([16, kLdHead]); each
// lane's 4 words of ldmatrix_x4 at the A-fragment addresses of load_row_fragments
// (`words`, [32, 4]) and of ldmatrix_x4_trans at the same addresses (`trans_words`), and
// its 4 accumulators of A B with A = the tile's A fragment and B loaded as
// rows_times_heads loads K (keys = the tile's rows 0-7 and 8-15, so `products` [32, 8]
// holds the two n-tiles of T T^T's first 16 columns). The GPU's results against the
// host run's (CudaCandidateFusedAttention.FragmentsAreThoseTheHostRunAssumes) say
// whether the hardware's layouts are those the host emulation takes from the PTX ISA,
// and which one is not. Warp 0 only.
template <class X, typename T>
THPC_SHORT_ATTENTION_BODY void fragment_probe(X& x, T* tile, uint32_t* words,
                                              uint32_t* trans_words, float* products) {
  if (x.warp() != 0) return;
  const int lane = x.lane();
  for (int e = lane; e < 16 * 16; e += 32) {
    tile[(e / 16) * kLdHead + e % 16] = x.round(static_cast<float>(e));
  }
  x.warp_sync();
  uint32_t a[4], at[4], b[4];
  const T* address = tile + (lane & 15) * kLdHead + (lane >> 4) * 8;
  x.ldmatrix_x4(a, address);
  x.ldmatrix_x4_trans(at, address);
  const int which = lane >> 3, row = lane & 7;
  x.ldmatrix_x4(b, tile + ((which >> 1) * 8 + row) * kLdHead + (which & 1) * 8);
  float c0[4] = {0.0f, 0.0f, 0.0f, 0.0f}, c1[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  x.mma(c0, a, b[0], b[1]);
  x.mma(c1, a, b[2], b[3]);
  for (int i = 0; i < 4; ++i) {
    words[lane * 4 + i] = a[i];
    trans_words[lane * 4 + i] = at[i];
    products[lane * 8 + i] = c0[i];
    products[lane * 8 + 4 + i] = c1[i];
  }
}

}  // namespace thpc::fused_attention
