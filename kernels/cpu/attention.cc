// Multi-head scaled dot-product attention (§3.2.1, §3.2.2) on the CPU.
//
// For each sentence b and head i the three products are one BLAS GEMM each on strided
// views of q, k, v (no copies): S = Q_i K_i^T / sqrt(d_k), the masked softmax and the
// dropout are plain loops over S, and out_i = P' V_i. Backward regenerates the dropout
// mask from the DropoutKey, so only the probabilities P are saved. Keys gathered from
// scattered rows (AttentionShape::key_rows, a decoding step's shared-prefix cache) take
// plain loops for both products instead (gathered_attention_forward).

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "common/error.h"
#include "kernels/cpu/blas.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/dropout_mask.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/vector_clones.h"

namespace thpc::cpu {
namespace {

// How many keys sentence b may attend to: key_lengths[b] (all Lk when no lengths given).
int valid_keys(const AttentionShape& shape, int b) {
  if (shape.key_lengths == nullptr) return shape.key_len;
  const int length = shape.key_lengths[b];
  THPC_CHECK(length >= 0 && length <= shape.key_len,
             "key length " << length << " of sentence " << b << " outside [0, "
                           << shape.key_len << "]");
  return length;
}

// Keys [0, visible) are visible to query t: the non-pad keys and, when causal, only
// those at positions <= t (§3.2.3: "prevent leftward information flow").
int visible_keys(const AttentionShape& shape, int valid, int t) {
  return shape.causal && t + 1 < valid ? t + 1 : valid;
}

// The flat index of P[b, head, t, 0] in [B, h, Lq, Lk]: the saved layout and the element
// index of the attention dropout draws.
int64_t probability_offset(const AttentionShape& shape, int b, int head, int t) {
  return ((static_cast<int64_t>(b) * shape.heads + head) * shape.query_len + t) *
         shape.key_len;
}

// The dropout factors M / (1 - p) of `count` consecutive probabilities whose first has
// flat index first_element in [B, h, Lq, Lk] (the element index of the draw): 1 / (1 - p)
// where kept, 0 where dropped. p = 0 gives all ones without drawing.
template <typename T>
void dropout_factors(T* factors, int64_t count, int64_t first_element,
                     const AttentionShape& shape) {
  const float p = shape.dropout;
  if (p == 0.0f) {
    for (int64_t j = 0; j < count; ++j) factors[j] = T(1);
    return;
  }
  const DropoutKey& key = shape.dropout_key;
  const T keep_scale = T(1) / (T(1) - static_cast<T>(p));
  for_each_dropout_draw(key, first_element, count, p, [&](int64_t j, bool keep) {
    factors[j] = keep ? keep_scale : T(0);
  });
}

// One row of scores S[t, :] in place to the probabilities P (numerically stable masked
// softmax over the first `visible` keys: subtract the row maximum; the rest exactly 0; a
// row with no visible key, a pad sentence's, all zeros), copied to `saved_row` when not
// null, and to `dropped_row` as P' = Dropout(P) over the first `valid` keys. `offset` is
// the flat index of P[b, head, t, 0] in [B, h, Lq, Lk]: draw j is element offset + j
// whatever the count, so drawing only the visible ones gives the same mask.
template <typename T>
void probabilities_row(T* row, T* dropped_row, T* saved_row, T* factors, int Lk, int visible,
                       int valid, int64_t offset, const AttentionShape& shape) {
  T row_max = visible > 0 ? row[0] : T(0);
  for (int j = 1; j < visible; ++j) row_max = row[j] > row_max ? row[j] : row_max;
  double sum = 0.0;
  for (int j = 0; j < visible; ++j) {
    row[j] = std::exp(row[j] - row_max);
    sum += static_cast<double>(row[j]);
  }
  const T inverse_sum = visible > 0 ? static_cast<T>(1.0 / sum) : T(0);
  for (int j = 0; j < visible; ++j) row[j] *= inverse_sum;
  for (int j = visible; j < Lk; ++j) row[j] = T(0);  // masked: exactly 0
  if (saved_row != nullptr) {
    for (int j = 0; j < Lk; ++j) saved_row[j] = row[j];
  }
  dropout_factors(factors, visible, offset, shape);
  for (int j = 0; j < visible; ++j) dropped_row[j] = row[j] * factors[j];
  for (int j = visible; j < valid; ++j) dropped_row[j] = T(0);
}

// a . b of n elements in eight interleaved partial sums added pairwise in a fixed order:
// vectorised, and the same bits on every target (the CPU kernels are built without FMA
// contraction). kWidth > 0 is n known when compiling (the usual d_k = 64: unrolled,
// measured a third faster than the loop over a run-time n).
// Always inlined: into gathered_scores' AVX2 and AVX-512 clones it then takes their
// vectors (GCC does not inline it there by itself, and an SSE2 call per dot cost a third
// of the step's attention).
template <int kWidth, typename T>
[[gnu::always_inline]] inline T dot(const T* a, const T* b, int n) {
  if constexpr (kWidth > 0) n = kWidth;
  constexpr int kLanes = 8;
  T lane[kLanes] = {};
  int i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int l = 0; l < kLanes; ++l) lane[l] += a[i + l] * b[i + l];
  }
  T sum = ((lane[0] + lane[4]) + (lane[1] + lane[5])) + ((lane[2] + lane[6]) + (lane[3] + lane[7]));
  for (; i < n; ++i) sum += a[i] * b[i];
  return sum;
}

// Asks the memory for the `bytes` from p on, a row the loop reads a few keys later: the
// gathered rows are scattered over the cache (a position's rows of all hypotheses lie
// together), so no hardware prefetcher can guess them.
inline void prefetch_row(const void* p, int64_t bytes) {
  const char* at = static_cast<const char*>(p);
  for (int64_t offset = 0; offset < bytes; offset += 64) __builtin_prefetch(at + offset);
}
constexpr int kPrefetchKeysAhead = 4;

// S[head, t, j] = scale (q_t,head . k_j,head) over a sentence's gathered key rows
// (rows[j], j < valid) for every head and query, in [heads, Lq, Lk]: each key row read
// once, whole. With gathered_values below, most of a CPU decoding step's attention: both
// in vector clones (vector_clones.h).
template <int kWidth, typename T>
THPC_VECTOR_CLONES void gathered_scores(T* scores, const T* q, int ldq, const T* k, int ldk,
                                        const int32_t* rows, int valid,
                                        const AttentionShape& shape, T scale) {
  const int Lq = shape.query_len, Lk = shape.key_len, d_k = shape.d_k;
  for (int j = 0; j < valid; ++j) {
    if (j + kPrefetchKeysAhead < valid) {
      prefetch_row(k + static_cast<int64_t>(rows[j + kPrefetchKeysAhead]) * ldk,
                   int64_t(shape.heads) * d_k * sizeof(T));
    }
    const T* key = k + static_cast<int64_t>(rows[j]) * ldk;
    for (int head = 0; head < shape.heads; ++head) {
      for (int t = 0; t < Lq; ++t) {
        scores[(static_cast<int64_t>(head) * Lq + t) * Lk + j] =
            scale * dot<kWidth>(q + static_cast<int64_t>(t) * ldq + head * d_k, key + head * d_k, d_k);
      }
    }
  }
}

// out[t, head] = the sum over j < valid, in order, of P'[head, t, j] v_j,head, over a
// sentence's gathered value rows (rows[j]); P' is [heads, Lq, Lk], out [Lq, heads d_v].
template <typename T>
THPC_VECTOR_CLONES void gathered_values(T* out, const T* dropped, const T* v, int ldv,
                                        const int32_t* rows, int valid,
                                        const AttentionShape& shape) {
  const int Lq = shape.query_len, Lk = shape.key_len, heads = shape.heads, d_v = shape.d_v;
  const int ld_out = heads * d_v;
  for (int t = 0; t < Lq; ++t) std::fill_n(out + static_cast<int64_t>(t) * ld_out, ld_out, T(0));
  for (int j = 0; j < valid; ++j) {
    if (j + kPrefetchKeysAhead < valid) {
      prefetch_row(v + static_cast<int64_t>(rows[j + kPrefetchKeysAhead]) * ldv,
                   int64_t(ld_out) * sizeof(T));
    }
    const T* value_row = v + static_cast<int64_t>(rows[j]) * ldv;
    for (int head = 0; head < heads; ++head) {
      const T* value = value_row + head * d_v;
      for (int t = 0; t < Lq; ++t) {
        const T weight = dropped[(static_cast<size_t>(head) * Lq + t) * Lk + j];
        T* row = out + static_cast<int64_t>(t) * ld_out + head * d_v;
        for (int c = 0; c < d_v; ++c) row[c] += weight * value[c];
      }
    }
  }
}

// The attention of a few queries per sentence over gathered key and value rows
// (AttentionShape::key_rows): a decoding step's one query per hypothesis over its
// prefix's rows of the shared-prefix cache. Plain loops, not BLAS: the rows are not
// evenly spaced, and with one query a BLAS call's fixed cost was most of its time
// (OpenBLAS's sgemv: 1.2-1.5 us for 41 keys of d_k = 64). A block is a sentence with
// every head, so each key and value row is read once, whole; a beam's hypotheses share
// most of their rows and follow one another, so the rows come from the CPU's cache after
// the first (bench/RESULTS.md: 41% of the rows read are distinct within a sentence).
template <typename T>
void gathered_attention_forward(T* out, T* saved, const T* q, int ldq, const T* k, int ldk,
                                const T* v, int ldv, const AttentionShape& shape) {
  const int Lq = shape.query_len, Lk = shape.key_len, heads = shape.heads;
  const int d_k = shape.d_k, d_v = shape.d_v, ld_out = heads * d_v;
  const T scale = T(1) / std::sqrt(static_cast<T>(d_k));
  for (int b = 0; b < shape.batch; ++b) valid_keys(shape, b);  // throws here, not in a thread
  if (Lq == 0) return;
#pragma omp parallel num_threads(threads_for(int64_t(shape.batch) * heads * Lq * Lk * (d_k + d_v)))
  {
    // S, then P in place, and P' = Dropout(P): [heads, Lq, Lk] each.
    std::vector<T> scores(static_cast<size_t>(heads) * Lq * Lk);
    std::vector<T> dropped(static_cast<size_t>(heads) * Lq * Lk);
    std::vector<T> factors(static_cast<size_t>(Lk));
#pragma omp for schedule(dynamic)
    for (int b = 0; b < shape.batch; ++b) {
      const int valid = valid_keys(shape, b);
      const int32_t* rows = shape.key_rows + static_cast<int64_t>(b) * Lk;
      const T* q_b = q + static_cast<int64_t>(b) * Lq * ldq;
      T* out_b = out + static_cast<int64_t>(b) * Lq * ld_out;
      if (d_k == 64) {
        gathered_scores<64>(scores.data(), q_b, ldq, k, ldk, rows, valid, shape, scale);
      } else {
        gathered_scores<0>(scores.data(), q_b, ldq, k, ldk, rows, valid, shape, scale);
      }
      for (int head = 0; head < heads; ++head) {
        for (int t = 0; t < Lq; ++t) {
          const size_t at = (static_cast<size_t>(head) * Lq + t) * Lk;
          const int64_t offset = probability_offset(shape, b, head, t);
          probabilities_row(scores.data() + at, dropped.data() + at,
                            saved != nullptr ? saved + offset : nullptr, factors.data(), Lk,
                            visible_keys(shape, valid, t), valid, offset, shape);
        }
      }
      gathered_values(out_b, dropped.data(), v, ldv, rows, valid, shape);
    }
  }
}

// Columns [0, width) of `rows` rows with row stride ld set to 0 (out may be null).
template <typename T>
void zero_columns(T* out, int64_t rows, int width, int ld) {
  if (out == nullptr) return;
  for (int64_t row = 0; row < rows; ++row) std::fill(out + row * ld, out + row * ld + width, T(0));
}

}  // namespace

// out_i = Dropout(softmax(Q_i K_i^T / sqrt(d_k) + mask)) V_i, heads concatenated.
// saved (may be null when no backward follows) receives the probabilities before
// dropout, masked entries exactly 0.
template <typename T>
void attention_forward(T* out, T* saved, const T* q, int ldq, const T* k, int ldk,
                       const T* v, int ldv, const AttentionShape& shape) {
  check_attention_shape(shape, ldq, ldk, ldv);
  if (shape.key_rows != nullptr) {
    gathered_attention_forward(out, saved, q, ldq, k, ldk, v, ldv, shape);
    return;
  }
  const int Lq = shape.query_len, Lk = shape.key_len, d_k = shape.d_k, d_v = shape.d_v;
  const int ld_out = shape.heads * d_v;
  const T scale = T(1) / std::sqrt(static_cast<T>(d_k));
  // The (sentence, head) blocks are independent: they are spread over the threads, each
  // with its own scratch, and a GEMM inside runs on the thread that calls it.
  for (int b = 0; b < shape.batch; ++b) valid_keys(shape, b);  // throws here, not in a thread
  const int blocks = shape.batch * shape.heads;
#pragma omp parallel num_threads(threads_for(int64_t(blocks) * Lq * Lk * (d_k + d_v)))
  {
    std::vector<T> scores(static_cast<size_t>(Lq) * Lk);   // S, then P in place
    std::vector<T> dropped(static_cast<size_t>(Lq) * Lk);  // P' = Dropout(P)
    std::vector<T> factors(static_cast<size_t>(Lk));       // one row's M / (1 - p)
#pragma omp for schedule(dynamic)
    for (int block = 0; block < blocks; ++block) {
      const int b = block / shape.heads, head = block % shape.heads;
      const int valid = valid_keys(shape, b);
      const T* q_head = q + static_cast<int64_t>(b) * Lq * ldq + head * d_k;
      const T* k_head = k + static_cast<int64_t>(b) * Lk * ldk + head * d_k;
      const T* v_head = v + static_cast<int64_t>(b) * Lk * ldv + head * d_v;
      T* out_head = out + static_cast<int64_t>(b) * Lq * ld_out + head * d_v;
      if (Lq == 0) continue;
      if (valid == 0) {  // nothing to attend to: the weighted sum is empty
        for (int t = 0; t < Lq; ++t) {
          for (int c = 0; c < d_v; ++c) out_head[static_cast<int64_t>(t) * ld_out + c] = T(0);
          if (saved != nullptr) {
            T* saved_row = saved + probability_offset(shape, b, head, t);
            for (int j = 0; j < Lk; ++j) saved_row[j] = T(0);
          }
        }
        continue;
      }
      // Only the first `valid` keys can have a nonzero probability, so both products run
      // over them alone: a decoding cache of max_len rows holding `position + 1`, or a
      // short sentence padded to the batch's length, costs what it holds.
      // S = Q K^T / sqrt(d_k)  [Lq, valid]; one query (an incremental decoding step) is
      // S^T = K q, a GEMV.
      if (Lq == 1) {
        gemv(CblasNoTrans, valid, d_k, scale, k_head, ldk, q_head, T(0), scores.data());
      } else {
        gemm(CblasNoTrans, CblasTrans, Lq, valid, d_k, scale, q_head, ldq, k_head, ldk, T(0),
             scores.data(), Lk);
      }
      for (int t = 0; t < Lq; ++t) {
        const size_t at = static_cast<size_t>(t) * Lk;
        const int64_t offset = probability_offset(shape, b, head, t);
        probabilities_row(scores.data() + at, dropped.data() + at,
                          saved != nullptr ? saved + offset : nullptr, factors.data(), Lk,
                          visible_keys(shape, valid, t), valid, offset, shape);
      }
      // out_i = P' V  [Lq, d_v], summed over the valid keys; for one query
      // out_i^T = V^T p'.
      if (Lq == 1) {
        gemv(CblasTrans, valid, d_v, T(1), v_head, ldv, dropped.data(), T(0), out_head);
      } else {
        gemm(CblasNoTrans, CblasNoTrans, Lq, d_v, valid, T(1), dropped.data(), Lk, v_head,
             ldv, T(0), out_head, ld_out);
      }
    }
  }
}

// With P the saved probabilities, M the regenerated keep mask and P' = P * M / (1 - p):
//   dV += P'^T dO,  dP' = dO V^T,  dP = dP' * M / (1 - p),
//   dS = P * (dP - rowsum(dP * P))   (the softmax Jacobian),
//   dQ += dS K / sqrt(d_k),  dK += dS^T Q / sqrt(d_k).
// Masked entries have P = 0, hence dS = 0: the mask needs no separate treatment. kWrite:
// the three products with beta = 0 (each covers every row of its head's columns).
template <typename T>
void attention_backward(T* dq, T* dk, T* dv, const T* d_out, const T* saved, const T* q,
                        int ldq, const T* k, int ldk, const T* v, int ldv,
                        const AttentionShape& shape, GradStore store) {
  check_attention_shape(shape, ldq, ldk, ldv);
  THPC_CHECK(shape.key_rows == nullptr, "attention backward over gathered key rows");
  THPC_CHECK(saved != nullptr, "attention backward needs the probabilities saved by forward");
  const int Lq = shape.query_len, Lk = shape.key_len, d_k = shape.d_k, d_v = shape.d_v;
  if (Lq == 0 || Lk == 0) {  // no products: a zero gradient (to write, not to add)
    if (store == GradStore::kWrite) {
      const int64_t q_rows = int64_t(shape.batch) * Lq, k_rows = int64_t(shape.batch) * Lk;
      zero_columns(dq, q_rows, shape.heads * d_k, ldq);
      zero_columns(dk, k_rows, shape.heads * d_k, ldk);
      zero_columns(dv, k_rows, shape.heads * d_v, ldv);
    }
    return;
  }
  const T beta = gradient_beta<T>(store);
  const int ld_out = shape.heads * d_v;
  const T scale = T(1) / std::sqrt(static_cast<T>(d_k));
  const int blocks = shape.batch * shape.heads;  // independent, as in forward
#pragma omp parallel num_threads(threads_for(int64_t(blocks) * Lq * Lk * (d_k + 2 * d_v)))
  {
    std::vector<T> factors(static_cast<size_t>(Lq) * Lk);   // M / (1 - p), regenerated
    std::vector<T> dropped(static_cast<size_t>(Lq) * Lk);   // P' = P * M / (1 - p)
    std::vector<T> d_scores(static_cast<size_t>(Lq) * Lk);  // dP', then dP, then dS in place
#pragma omp for schedule(dynamic)
    for (int block = 0; block < blocks; ++block) {
      const int b = block / shape.heads, head = block % shape.heads;
      const int64_t head_offset = probability_offset(shape, b, head, 0);
      const T* probabilities = saved + head_offset;
      const T* q_head = q + static_cast<int64_t>(b) * Lq * ldq + head * d_k;
      const T* k_head = k + static_cast<int64_t>(b) * Lk * ldk + head * d_k;
      const T* v_head = v + static_cast<int64_t>(b) * Lk * ldv + head * d_v;
      const T* d_out_head = d_out + static_cast<int64_t>(b) * Lq * ld_out + head * d_v;
      // The mask of this (b, head) block is the draws [head_offset, head_offset + Lq*Lk),
      // exactly those forward made.
      dropout_factors(factors.data(), static_cast<int64_t>(Lq) * Lk, head_offset, shape);
      for (size_t e = 0; e < dropped.size(); ++e) dropped[e] = probabilities[e] * factors[e];
      // dV += P'^T dO  [Lk, d_v]
      if (dv != nullptr) {
        T* dv_head = dv + static_cast<int64_t>(b) * Lk * ldv + head * d_v;
        gemm(CblasTrans, CblasNoTrans, Lk, d_v, Lq, T(1), dropped.data(), Lk, d_out_head,
             ld_out, beta, dv_head, ldv);
      }
      if (dq == nullptr && dk == nullptr) continue;
      // dP' = dO V^T  [Lq, Lk]
      gemm(CblasNoTrans, CblasTrans, Lq, Lk, d_v, T(1), d_out_head, ld_out, v_head, ldv, T(0),
           d_scores.data(), Lk);
      for (int t = 0; t < Lq; ++t) {
        T* row = d_scores.data() + static_cast<size_t>(t) * Lk;
        const T* p_row = probabilities + static_cast<int64_t>(t) * Lk;
        const T* factor_row = factors.data() + static_cast<size_t>(t) * Lk;
        for (int j = 0; j < Lk; ++j) row[j] *= factor_row[j];  // dP = dP' * M / (1 - p)
        double row_dot = 0.0;  // rowsum(dP * P)
        for (int j = 0; j < Lk; ++j) row_dot += static_cast<double>(row[j]) * p_row[j];
        const T dot = static_cast<T>(row_dot);
        for (int j = 0; j < Lk; ++j) row[j] = p_row[j] * (row[j] - dot);  // dS
      }
      // dQ += dS K / sqrt(d_k)  [Lq, d_k]
      if (dq != nullptr) {
        T* dq_head = dq + static_cast<int64_t>(b) * Lq * ldq + head * d_k;
        gemm(CblasNoTrans, CblasNoTrans, Lq, d_k, Lk, scale, d_scores.data(), Lk, k_head, ldk,
             beta, dq_head, ldq);
      }
      // dK += dS^T Q / sqrt(d_k)  [Lk, d_k]
      if (dk != nullptr) {
        T* dk_head = dk + static_cast<int64_t>(b) * Lk * ldk + head * d_k;
        gemm(CblasTrans, CblasNoTrans, Lk, d_k, Lq, scale, d_scores.data(), Lk, q_head, ldq,
             beta, dk_head, ldk);
      }
    }
  }
}

THPC_CPU_TWIN(attention_forward)
THPC_CPU_TWIN(attention_backward)

}  // namespace thpc::cpu
