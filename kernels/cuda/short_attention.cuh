// Attention of short sentences in one launch: bf16 attention whose query and key lengths
// are both at most train.short_attention_max_len (48 by default: the lengths at which
// it beats the batched GEMMs on the H100). Written without a GPU behind
// train.cuda_kernels = candidate; on 2026-11-26 its twins passed on an H100 (memcheck
// and racecheck clean) and it became the default (bench/RESULTS.md, fourth GPU window).
//
// What it computes is attention.cu's (the CPU twin kernels/cpu/attention.cc is the
// specification): per (sentence b, head) pair
//   S = Q K^T / sqrt(d_k)  (fp32),  P = softmax over the visible keys (masked: exactly 0),
//   P' = P * M / (1 - p),  out = P' V,
// and backward dV = P'^T dO, dP = (dO V^T) * M / (1 - p), dS = P * (dP - rowsum(dP * P)),
// dQ = dS K / sqrt(d_k), dK = dS^T Q / sqrt(d_k), with the same roundings: S, dP and
// the row statistics in fp32, P, P' and dS rounded to bf16 before their products, the
// products accumulated in fp32 and rounded once (plus the old gradient in fp32 when
// added into).
//
// Why a kernel of its own. The batched path runs cuBLAS batched GEMMs over all B*h
// pairs with a row kernel between them: for the training buckets (L = 12..96) the pairs'
// matrices are tiny (L x L x 64), so those GEMMs run far below the tensor cores' rate,
// the fp32 scores (and score gradients) make a round trip through memory, and a layer
// costs 4 launches forward and 7 backward. The H100 profile of 2026-11-26 put attention
// at 9.2 ms of the 39 ms base step (~12 TFLOP/s). Here one thread block holds one pair's
// Q, K, V (and dO) in shared memory -- at most 128 rows of 64, so the whole score matrix
// fits too -- and does both products, the softmax and the dropout of a layer's pair in
// one pass: the inputs are read once, only P (saved for backward) and the output are
// written, one launch per op. Backward needs no reduction across blocks (a block sees
// all of its pair's queries), so it stays free of atomics and bit-reproducible.
// Products run on the tensor cores as 16x16x16 tiles (bf16 in, fp32 accumulation).
//
// Limits (short_attention_fits): bf16, d_k = d_v = 64, 1 <= Lq, Lk <= 128, row strides
// and head views 16-byte aligned. Anything else takes the batched path.
//
// One body, two executions. The block's work is written once (forward_block,
// backward_block), for an execution policy X. Each phase is one loop whose iterations
// are shared among the block's threads (first_thread/thread_step), its warps (each
// iteration a 16x16 tile the whole warp computes) or a warp's lanes, and phases are
// separated by x.sync(); a warp combines its lanes' values with x.warp_sum / warp_max
// (every lane gets the result). In attention.cu, X is the block on the GPU (threadIdx, nvcuda::
// wmma); in tests/kernels/attention_test.cc (ShortAttentionOnTheHost.*) X emulates one
// block sequentially (first = 0, step = 1; tiles multiplied in fp32, bf16 rounded to
// nearest even), so every index, mask, padding rule and epilogue of the kernel runs on
// the CPU against the CPU attention. What the host run cannot check is what only a GPU
// has: the wmma fragments themselves, shared-memory races and limits. The GPU twin
// (CudaAttention.ShortSentencesMatchCpu, under compute-sanitizer's racecheck too) checks
// those.
#pragma once

#include <cmath>
#include <cstdint>

#include "common/philox.h"
#include "kernels/cuda/dropout_mask.cuh"
#include "kernels/ops.h"

#if defined(__CUDACC__)
#define THPC_SHORT_ATTENTION_HD __host__ __device__ __forceinline__
#define THPC_SHORT_ATTENTION_BODY __device__ __forceinline__
#else
#define THPC_SHORT_ATTENTION_HD inline
#define THPC_SHORT_ATTENTION_BODY inline
#endif

namespace thpc::short_attention {

constexpr int kTile = 16;        // tensor-core tile edge (m = n = k = 16)
constexpr int kHeadWidth = 64;   // d_k = d_v taken
constexpr int kHeadTiles = kHeadWidth / kTile;
constexpr int kMaxLength = kShortAttentionLongest;  // the score matrix fits on chip (128)
constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
// Row strides in shared memory. 16-bit rows of 64 + 8 elements (144 bytes): a multiple of
// 8 elements (wmma's rule for 16-bit types), 16-byte aligned for the vector copies, and
// consecutive rows start 4 banks apart. fp32 score rows: Lk rounded up to a tile, + 4
// (wmma's rule for float: a multiple of 4). bf16 probability rows: + 8.
constexpr int kLdHead = kHeadWidth + 8;
constexpr int kStageFloats = kTile * kTile;  // one warp's output tile on its way to memory

// Whether an attention call can take these kernels (besides bf16 and the configured
// longest length, which the launcher checks): head widths 64, both lengths in [1, 128], and
// row strides a multiple of 8 elements (16-byte rows; the pointers' own 16-byte
// alignment is checked by the launcher).
THPC_SHORT_ATTENTION_HD bool short_attention_fits(int d_k, int d_v, int query_len, int key_len,
                                                  int ldq, int ldk, int ldv) {
  return d_k == kHeadWidth && d_v == kHeadWidth && query_len >= 1 &&
         query_len <= kMaxLength && key_len >= 1 && key_len <= kMaxLength && ldq % 8 == 0 &&
         ldk % 8 == 0 && ldv % 8 == 0;
}

// One pair's shared memory: byte offsets of its regions (each 128-byte aligned, wmma
// needs 32) and row strides.
struct Layout {
  int rows_q, rows_k;     // Lq, Lk rounded up to whole tiles (the extra rows are zeros)
  int tiles_q, tiles_k;
  int ld_scores;          // fp32 S (forward) or dO V^T (backward), [rows_q, ld_scores]
  int ld_probs;           // bf16 P' (then dS in backward), [rows_q, ld_probs]
  int q, k, v, d_out;     // bf16 [rows, kLdHead] each; backward: d_out, then q there
  int scores, probs;
  int row_a, row_b;       // fp32 [rows_q]: row max and 1/sum (forward), rowsum(dP*P) (backward)
  int stages;             // fp32 [kWarps, kStageFloats]
  int bytes;
};

THPC_SHORT_ATTENTION_HD int round_up(int value, int multiple) {
  return (value + multiple - 1) / multiple * multiple;
}

THPC_SHORT_ATTENTION_HD Layout layout(int query_len, int key_len, bool backward) {
  Layout l{};
  l.rows_q = round_up(query_len, kTile);
  l.rows_k = round_up(key_len, kTile);
  l.tiles_q = l.rows_q / kTile;
  l.tiles_k = l.rows_k / kTile;
  l.ld_scores = l.rows_k + 4;
  l.ld_probs = l.rows_k + 8;
  int at = 0;
  auto take = [&at](int bytes) {
    const int start = at;
    at = round_up(at + bytes, 128);
    return start;
  };
  const int head_bytes = kLdHead * 2;
  // Backward reads dO only for dP' and dV, and Q only for dK, after them: Q is loaded
  // where dO was (one [rows_q, 64] array fewer: two blocks per SM up to L = 96).
  l.q = take(l.rows_q * head_bytes);
  l.d_out = backward ? l.q : -1;
  l.k = take(l.rows_k * head_bytes);
  l.v = take(l.rows_k * head_bytes);
  l.scores = take(l.rows_q * l.ld_scores * 4);
  l.probs = take(l.rows_q * l.ld_probs * 2);
  l.row_a = take(l.rows_q * 4);
  l.row_b = take(l.rows_q * 4);
  l.stages = take(kWarps * kStageFloats * 4);
  l.bytes = at;
  return l;
}

// Everything a block needs; T is the element type (bf16), pointers are to the pair's
// tensors as the op receives them (q, k, v, dq, dk, dv: head views with row strides
// ldq/ldk/ldv; out and d_out: [B, Lq, h*64] contiguous; saved: [B, h, Lq, Lk]).
template <typename T>
struct Args {
  T* out = nullptr;
  T* saved = nullptr;  // forward: written (may be null); backward: read
  const T* q = nullptr;
  const T* k = nullptr;
  const T* v = nullptr;
  int ldq = 0, ldk = 0, ldv = 0;
  const T* d_out = nullptr;
  T* dq = nullptr;  // null: not wanted
  T* dk = nullptr;
  T* dv = nullptr;
  bool write_dq = false, write_dk = false, write_dv = false;  // GradStore::kWrite: no add
  int heads = 0, query_len = 0, key_len = 0;
  bool causal = false;
  const int32_t* key_lengths = nullptr;  // [B] or null: every key valid
  float dropout = 0.0f, keep_scale = 1.0f;
  uint64_t seed = 0;
  uint32_t site = 0, step = 0, stream = 0;
  const StepInputs* inputs = nullptr;  // DropoutKey::inputs: step and stream as it runs
};

// The arguments forward and backward share, from the op's (host code: the launchers in
// attention.cu and the host run of the tests).
template <typename T>
inline Args<T> args_of(const T* q, int ldq, const T* k, int ldk, const T* v, int ldv,
                       const AttentionShape& shape) {
  Args<T> args;
  args.q = q;
  args.k = k;
  args.v = v;
  args.ldq = ldq;
  args.ldk = ldk;
  args.ldv = ldv;
  args.heads = shape.heads;
  args.query_len = shape.query_len;
  args.key_len = shape.key_len;
  args.causal = shape.causal;
  args.key_lengths = shape.key_lengths;
  args.dropout = shape.dropout;
  args.keep_scale = 1.0f / (1.0f - shape.dropout);
  args.seed = shape.dropout_key.seed;
  args.site = shape.dropout_key.site;
  args.step = shape.dropout_key.step;
  args.stream = shape.dropout_key.stream;
  args.inputs = shape.dropout_key.inputs;
  return args;
}

// The sentence's non-pad keys (a length outside [0, Lk] clamped, as attention.cu does).
template <typename T>
THPC_SHORT_ATTENTION_BODY int valid_keys(const Args<T>& a, int b) {
  if (a.key_lengths == nullptr) return a.key_len;
  const int length = a.key_lengths[b];
  return length < 0 ? 0 : length > a.key_len ? a.key_len : length;
}

// Keys [0, visible) of query t (causal: t + 1 at most).
template <typename T>
THPC_SHORT_ATTENTION_BODY int visible_keys(const Args<T>& a, int valid, int t) {
  return a.causal && t + 1 < valid ? t + 1 : valid;
}

// Keys that some query of query tile i sees: the key tiles past them are all masked.
template <typename T>
THPC_SHORT_ATTENTION_BODY int tile_keys(const Args<T>& a, int valid, int i) {
  const int last = (i + 1) * kTile;
  return a.causal && last < valid ? last : valid;
}

// M / (1 - p) of flat element `element` of P (the CPU's draws, common/philox.h).
template <typename T>
THPC_SHORT_ATTENTION_BODY float dropout_factor(const Args<T>& a, uint64_t element) {
  if (a.dropout == 0.0f) return 1.0f;
  return dropout_keep(a.seed, a.site, cuda::step_as_it_runs(a.step, a.inputs),
                      cuda::stream_as_it_runs(a.stream, a.inputs), element, a.dropout)
             ? a.keep_scale
             : 0.0f;
}

// Thread loop: rows [0, rows) of `to` ([rows, kLdHead]) from `from` (row stride ld),
// 8 elements (16 bytes) at a time; rows from `present` on are zeros.
template <class X, typename T>
THPC_SHORT_ATTENTION_BODY void load_rows(X& x, T* to, const T* from, int ld, int present,
                                         int rows) {
  for (int c = x.first_thread(); c < rows * kHeadTiles * 2; c += x.thread_step()) {
    const int r = c / (kHeadTiles * 2), part = c % (kHeadTiles * 2);
    T* row = to + r * kLdHead + part * 8;
    if (r < present) {
      x.copy16(row, from + static_cast<int64_t>(r) * ld + part * 8);
    } else {
      x.zero16(row);
    }
  }
}

// Lane loop: a warp's 16x16 fp32 tile (in its stage) to rows [0, present) of `to` (row
// stride ld), times `scale`, added to what `to` holds unless `write`; 8 elements a lane.
template <class X, typename T>
THPC_SHORT_ATTENTION_BODY void store_tile(X& x, T* to, int ld, int present, const float* stage,
                                          float scale, bool write) {
  for (int c = x.first_lane(); c < 2 * kTile; c += x.lane_step()) {
    const int r = c / 2, column = (c % 2) * 8;
    if (r >= present) continue;
    T* at = to + static_cast<int64_t>(r) * ld + column;
    float values[8];
    if (write) {
      for (int e = 0; e < 8; ++e) values[e] = 0.0f;
    } else {
      x.load8(values, at);
    }
    for (int e = 0; e < 8; ++e) values[e] += stage[r * kTile + column + e] * scale;
    x.store8(at, values);
  }
}

// Warp work: fp32 tile (i, j) of R = A B^T over the head width, times `scale`, into the
// [rows, ld] matrix `to` (S = Q K^T / 8 forward, dP' = dO V^T backward); A and B are
// [rows, kLdHead] head arrays.
template <class X, typename T>
THPC_SHORT_ATTENTION_BODY void head_products_tile(X& x, const T* a, int i, const T* b, int j,
                                                  float scale, float* to, int ld) {
  typename X::Accumulator acc;
  x.zero(acc);
  for (int kk = 0; kk < kHeadTiles; ++kk) {
    x.template mma<false, true>(acc, a + i * kTile * kLdHead + kk * kTile, kLdHead,
                                b + j * kTile * kLdHead + kk * kTile, kLdHead);
  }
  x.scale(acc, scale);
  x.store(to + i * kTile * ld + j * kTile, acc, ld);
}

// Warp work: a finished 16x16 tile to rows [0, present) of `to` through the warp's
// stage, as store_tile writes it.
template <class X, typename T>
THPC_SHORT_ATTENTION_BODY void store_through_stage(X& x, const typename X::Accumulator& acc,
                                                   float* stage, T* to, int ld, int present,
                                                   float scale, bool write) {
  x.store(stage, acc, kTile);
  x.warp_sync();
  store_tile(x, to, ld, present, stage, scale, write);
  x.warp_sync();  // the stage is the warp's next tile's
}

// Warp work: output tile (i, n) of R = A H, A = probs (bf16 [rows_q, ld_probs]: P' or
// dS), H = head (bf16 [rows_k, kLdHead]: V or K), over A's first key_tiles column tiles
// (the rest are zeros), into rows [0, present) of `to` as store_tile does.
template <class X, typename T>
THPC_SHORT_ATTENTION_BODY void rows_times_head(X& x, const T* probs, int ld_probs, int i,
                                               int key_tiles, const T* head, int n, float* stage,
                                               T* to, int ld, int present, float scale,
                                               bool write) {
  typename X::Accumulator acc;
  x.zero(acc);
  for (int kk = 0; kk < key_tiles; ++kk) {
    x.template mma<false, false>(acc, probs + i * kTile * ld_probs + kk * kTile, ld_probs,
                                 head + kk * kTile * kLdHead + n * kTile, kLdHead);
  }
  store_through_stage(x, acc, stage, to, ld, present, scale, write);
}

// Warp work: output tile (m, n) of R = A^T H, A = probs ([rows_q, ld_probs]: P' or dS),
// H = head ([rows_q, kLdHead]: dO or Q), over A's row tiles [first_tile, tiles_q) (the
// ones before are zeros), into rows [0, present) of `to`.
template <class X, typename T>
THPC_SHORT_ATTENTION_BODY void columns_times_head(X& x, const T* probs, int ld_probs, int m,
                                                  int first_tile, int tiles_q, const T* head,
                                                  int n, float* stage, T* to, int ld,
                                                  int present, float scale, bool write) {
  typename X::Accumulator acc;
  x.zero(acc);
  for (int kk = first_tile; kk < tiles_q; ++kk) {
    x.template mma<true, false>(acc, probs + kk * kTile * ld_probs + m * kTile, ld_probs,
                                head + kk * kTile * kLdHead + n * kTile, kLdHead);
  }
  store_through_stage(x, acc, stage, to, ld, present, scale, write);
}

// One (sentence, head) pair forward: out (and saved, if any) of pair `pair` = b*h + head.
template <class X, typename T>
THPC_SHORT_ATTENTION_BODY void forward_block(X& x, const Args<T>& a, int pair, char* shared) {
  const int Lq = a.query_len, Lk = a.key_len, b = pair / a.heads, head = pair % a.heads;
  const int ld_out = a.heads * kHeadWidth;
  const Layout l = layout(Lq, Lk, false);
  T* qs = reinterpret_cast<T*>(shared + l.q);
  T* ks = reinterpret_cast<T*>(shared + l.k);
  T* vs = reinterpret_cast<T*>(shared + l.v);
  float* scores = reinterpret_cast<float*>(shared + l.scores);
  T* probs = reinterpret_cast<T*>(shared + l.probs);
  float* row_max = reinterpret_cast<float*>(shared + l.row_a);
  float* row_scale = reinterpret_cast<float*>(shared + l.row_b);
  float* stage = reinterpret_cast<float*>(shared + l.stages) + x.warp_slot() * kStageFloats;
  const int valid = valid_keys(a, b);
  const int64_t column = static_cast<int64_t>(head) * kHeadWidth;

  // 1. The pair's Q, K, V into shared memory; keys past the sentence's length (never
  //    visible) are loaded as zeros, so a pad row's content cannot reach the output.
  load_rows(x, qs, a.q + static_cast<int64_t>(b) * Lq * a.ldq + column, a.ldq, Lq, l.rows_q);
  load_rows(x, ks, a.k + static_cast<int64_t>(b) * Lk * a.ldk + column, a.ldk, valid, l.rows_k);
  load_rows(x, vs, a.v + static_cast<int64_t>(b) * Lk * a.ldv + column, a.ldv, valid, l.rows_k);
  x.sync();

  // 2. S = Q K^T / sqrt(64) (the scale 1/8 is exact), the tiles some query can see.
  for (int t = x.first_warp(); t < l.tiles_q * l.tiles_k; t += x.warp_step()) {
    const int i = t / l.tiles_k, j = t % l.tiles_k;
    if (j * kTile >= tile_keys(a, valid, i)) continue;
    head_products_tile(x, qs, i, ks, j, 0.125f, scores, l.ld_scores);
  }
  x.sync();

  // 3. Each query's max and 1/sum over its visible keys: a warp per row, lanes striding
  //    the keys (consecutive words: no bank conflicts), combined by warp_max / warp_sum.
  for (int t = x.first_warp(); t < Lq; t += x.warp_step()) {
    const int visible = visible_keys(a, valid, t);
    const float* s = scores + t * l.ld_scores;
    float largest = -INFINITY;
    for (int j = x.first_lane(); j < visible; j += x.lane_step()) largest = fmaxf(largest, s[j]);
    largest = x.warp_max(largest);
    float sum = 0.0f;
    for (int j = x.first_lane(); j < visible; j += x.lane_step()) sum += x.exp(s[j] - largest);
    sum = x.warp_sum(sum);
    if (x.first_lane() == 0) {
      row_max[t] = visible > 0 ? largest : 0.0f;
      row_scale[t] = visible > 0 ? 1.0f / sum : 0.0f;
    }
  }
  x.sync();

  // 4. P (saved, contiguous) and P' (shared, the product's A) for every element: a
  //    thread per element, so that the saved rows are written coalesced. P' is computed
  //    from the rounded P, as the batched path (and backward) does.
  const int64_t first_row = static_cast<int64_t>(pair) * Lq;  // P[b, head, t, j]: (first_row + t) * Lk + j
  for (int e = x.first_thread(); e < l.rows_q * l.rows_k; e += x.thread_step()) {
    const int t = e / l.rows_k, j = e % l.rows_k;
    T weight = x.round(0.0f);
    if (t < Lq && j < Lk) {
      const float value = j < visible_keys(a, valid, t)
                              ? x.exp(scores[t * l.ld_scores + j] - row_max[t]) * row_scale[t]
                              : 0.0f;
      const T p = x.round(value);
      const int64_t element = (first_row + t) * Lk + j;
      if (a.saved != nullptr) a.saved[element] = p;
      weight = a.dropout == 0.0f ? p : x.round(x.widen(p) * dropout_factor(a, element));
    }
    probs[t * l.ld_probs + j] = weight;
  }
  x.sync();

  // 5. out = P' V, a warp per 16x16 output tile; key tiles past tile_keys hold only zeros
  //    of P' and are skipped (the same sum).
  T* out = a.out + static_cast<int64_t>(b) * Lq * ld_out + column;
  for (int t = x.first_warp(); t < l.tiles_q * kHeadTiles; t += x.warp_step()) {
    const int i = t / kHeadTiles, n = t % kHeadTiles;
    const int key_tiles = (tile_keys(a, valid, i) + kTile - 1) / kTile;
    rows_times_head(x, probs, l.ld_probs, i, key_tiles, vs, n, stage,
                    out + static_cast<int64_t>(i) * kTile * ld_out + n * kTile, ld_out,
                    Lq - i * kTile, 1.0f, true);
  }
}

// One pair backward: its head columns of dq, dk, dv (those not null), from d_out and the
// saved P.
template <class X, typename T>
THPC_SHORT_ATTENTION_BODY void backward_block(X& x, const Args<T>& a, int pair, char* shared) {
  const int Lq = a.query_len, Lk = a.key_len, b = pair / a.heads, head = pair % a.heads;
  const int ld_out = a.heads * kHeadWidth;
  const Layout l = layout(Lq, Lk, true);
  T* ks = reinterpret_cast<T*>(shared + l.k);
  T* vs = reinterpret_cast<T*>(shared + l.v);
  T* dos = reinterpret_cast<T*>(shared + l.d_out);
  T* qs = reinterpret_cast<T*>(shared + l.q);  // = dos: Q replaces dO after step 3
  float* d_dropped = reinterpret_cast<float*>(shared + l.scores);  // dO V^T
  T* probs = reinterpret_cast<T*>(shared + l.probs);               // P', then dS
  float* row_dot = reinterpret_cast<float*>(shared + l.row_a);
  float* stage = reinterpret_cast<float*>(shared + l.stages) + x.warp_slot() * kStageFloats;
  const int valid = valid_keys(a, b);
  const int64_t column = static_cast<int64_t>(head) * kHeadWidth;
  const int64_t first_row = static_cast<int64_t>(pair) * Lq;
  const bool need_scores = a.dq != nullptr || a.dk != nullptr;

  // 1. K, V, dO into shared memory (keys past the length as zeros, as forward).
  load_rows(x, ks, a.k + static_cast<int64_t>(b) * Lk * a.ldk + column, a.ldk, valid, l.rows_k);
  load_rows(x, vs, a.v + static_cast<int64_t>(b) * Lk * a.ldv + column, a.ldv, valid, l.rows_k);
  load_rows(x, dos, a.d_out + static_cast<int64_t>(b) * Lq * ld_out + column, ld_out, Lq,
            l.rows_q);
  // 2. P' = P M / (1 - p) from the saved P, for dV alone; zeros outside [Lq, Lk].
  for (int e = x.first_thread(); a.dv != nullptr && e < l.rows_q * l.rows_k;
       e += x.thread_step()) {
    const int t = e / l.rows_k, j = e % l.rows_k;
    T weight = x.round(0.0f);
    if (t < Lq && j < Lk) {
      const int64_t element = (first_row + t) * Lk + j;
      const T p = a.saved[element];
      weight = a.dropout == 0.0f ? p : x.round(x.widen(p) * dropout_factor(a, element));
    }
    probs[t * l.ld_probs + j] = weight;
  }
  x.sync();

  // 3. dP' = dO V^T (fp32, the tiles some query sees) and dV = P'^T dO: independent,
  //    one warp loop over both. Causal: P' of key tile m is zero for query tiles < m.
  const int score_tasks = need_scores ? l.tiles_q * l.tiles_k : 0;
  const int value_tasks = a.dv != nullptr ? l.tiles_k * kHeadTiles : 0;
  for (int t = x.first_warp(); t < score_tasks + value_tasks; t += x.warp_step()) {
    if (t < score_tasks) {
      const int i = t / l.tiles_k, j = t % l.tiles_k;
      if (j * kTile >= tile_keys(a, valid, i)) continue;
      head_products_tile(x, dos, i, vs, j, 1.0f, d_dropped, l.ld_scores);
    } else {
      const int m = (t - score_tasks) / kHeadTiles, n = (t - score_tasks) % kHeadTiles;
      columns_times_head(x, probs, l.ld_probs, m, a.causal ? m : 0, l.tiles_q, dos, n, stage,
                         a.dv + (static_cast<int64_t>(b) * Lk + m * kTile) * a.ldv + column +
                             n * kTile,
                         a.ldv, Lk - m * kTile, 1.0f, a.write_dv);
    }
  }
  if (!need_scores) return;  // uniform across the block
  x.sync();

  // 4. Q into dO's place, and rowsum(dP * P) per query over its visible keys (P is 0
  //    past them), dP = dP' M/(1-p): a warp per row, lanes striding the keys (the saved
  //    row read coalesced).
  load_rows(x, qs, a.q + static_cast<int64_t>(b) * Lq * a.ldq + column, a.ldq, Lq, l.rows_q);
  for (int t = x.first_warp(); t < Lq; t += x.warp_step()) {
    const int visible = visible_keys(a, valid, t);
    const float* g = d_dropped + t * l.ld_scores;
    const T* p = a.saved + (first_row + t) * Lk;
    float dot = 0.0f;
    for (int j = x.first_lane(); j < visible; j += x.lane_step()) {
      dot += g[j] * dropout_factor(a, static_cast<uint64_t>((first_row + t) * Lk + j)) *
             x.widen(p[j]);
    }
    dot = x.warp_sum(dot);
    if (x.first_lane() == 0) row_dot[t] = dot;
  }
  x.sync();

  // 5. dS = P (dP - rowsum) in place of P' (dV, its last reader, is done): a thread per
  //    element; masked and padding elements 0.
  for (int e = x.first_thread(); e < l.rows_q * l.rows_k; e += x.thread_step()) {
    const int t = e / l.rows_k, j = e % l.rows_k;
    T d_score = x.round(0.0f);
    if (t < Lq && j < visible_keys(a, valid, t)) {
      const int64_t element = (first_row + t) * Lk + j;
      const float dp = d_dropped[t * l.ld_scores + j] * dropout_factor(a, element);
      d_score = x.round(x.widen(a.saved[element]) * (dp - row_dot[t]));
    }
    probs[t * l.ld_probs + j] = d_score;
  }
  x.sync();

  // 6. dQ = dS K / 8 and dK = dS^T Q / 8, one warp loop over both.
  const int query_tasks = a.dq != nullptr ? l.tiles_q * kHeadTiles : 0;
  const int key_tasks = a.dk != nullptr ? l.tiles_k * kHeadTiles : 0;
  for (int t = x.first_warp(); t < query_tasks + key_tasks; t += x.warp_step()) {
    if (t < query_tasks) {
      const int i = t / kHeadTiles, n = t % kHeadTiles;
      const int key_tiles = (tile_keys(a, valid, i) + kTile - 1) / kTile;
      rows_times_head(x, probs, l.ld_probs, i, key_tiles, ks, n, stage,
                      a.dq + (static_cast<int64_t>(b) * Lq + i * kTile) * a.ldq + column +
                          n * kTile,
                      a.ldq, Lq - i * kTile, 0.125f, a.write_dq);
    } else {
      const int m = (t - query_tasks) / kHeadTiles, n = (t - query_tasks) % kHeadTiles;
      columns_times_head(x, probs, l.ld_probs, m, a.causal ? m : 0, l.tiles_q, qs, n, stage,
                         a.dk + (static_cast<int64_t>(b) * Lk + m * kTile) * a.ldk + column +
                             n * kTile,
                         a.ldk, Lk - m * kTile, 0.125f, a.write_dk);
    }
  }
}

}  // namespace thpc::short_attention
