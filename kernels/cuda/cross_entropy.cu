// Label-smoothed softmax cross-entropy (§5.4, "Label Smoothing") and log-softmax for
// decoding on the GPU, with the CPU twin kernels/cpu/cross_entropy.cc as specification.
// Per row r with target t != pad, lse = log sum_j exp(z_j) and q = (1-eps) onehot(t) + eps/V:
//   loss_r = lse - (1 - eps) z_t - (eps / V) sum_j z_j,   nll_r = lse - z_t,
//   d_logits[r, j] = grad_scale * (softmax(z)_j - q_j);   pad rows: d_logits = 0.
//
// Shape: the logits are the largest activation of the model ([tokens, 37000] T), and the
// op does ~5 FLOP per logit, so it is purely memory-bound: the floor is one read of the
// logits and one write of the gradient (4 bytes per logit in bf16). One block per row:
// pass 1 reads the row once for an online (running max, rescaled sum of exp) and the
// plain sum, reduced across the block in fp32; pass 2 reads it again (mostly from L2)
// and writes the gradient. Both passes stride the row with the whole block, so loads
// and stores are coalesced. The row statistics are complete (block barrier) before any
// element is written, so d_logits may alias logits. No fp32 copy of the logits exists.
//
// Determinism: per-thread partials combine in a fixed shuffle/shared-memory tree; the
// per-row loss, nll and token flags go to scratch and one single-block kernel sums them
// in double in a fixed order; no atomics. The result (and the first bad target, if any)
// comes back through one copy into pinned memory and a stream synchronisation.

#include <atomic>
#include <cmath>
#include <cstdint>
#include <vector>

#include "common/error.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/device_util.cuh"

namespace thpc::cuda {
namespace {

constexpr int kThreads = 256;  // per row block
// The vectorised rows' blocks (the former candidate loss_rows_from_l2, 2026-11-30; the
// default since the H200 window of 2026-12-04: the base step's loss 1.66 -> 1.49 ms,
// short of the ~0.4 ms hoped for below). Why: the
// H200's base profile gave the loss 1.68 ms for [25,000 x 37,000] bf16 logits, whose
// floor is one read and one write (3.7 GB: 0.77 ms at 4.8 TB/s). Pass 2 rereads each row
// "mostly from L2", but the verified kernel takes 32 registers a thread (ptxas, sm_90), so
// an SM holds eight blocks of 256 (its 2,048 threads), and 1,056 rows of 74 KB are in
// flight on 132 SMs: 78 MB, more than the 50 MB of L2, with the gradient written
// meanwhile (as many bytes as read) passing through it too: the second read goes to HBM
// again (5.55 GB: 1.16 ms at the full 4.8 TB/s, ~1.4 at what kernels reach). Blocks of
// 512 threads at 56 registers (__launch_bounds__(512, 2)), two an SM, keep 264 rows in
// flight (19.5 MB; four an SM, were the registers fewer, 39 MB), and pass 2's loads and
// stores are marked streaming (ld.global.cs, st.global.cs: evicted first), so that the
// gradient and the rows already done do not push the rows still to be reread out of L2.
// Expected, if L2 then serves the second read: ~0.4 ms less a base step at 25,000
// tokens. The arithmetic is the verified kernel's (whose PTX the change leaves as it
// was); the sums' tree merges 16 warps' partials instead of 8 (another fixed order).
constexpr int kWideThreads = 512;
constexpr int kSumThreads = 512;  // the single block of the final loss reduction

// Running softmax statistics: max m and sum_j exp(z_j - m), plus sum_j z_j.
struct Stats {
  float max;
  float sum_exp;
  float sum;
};

__device__ __forceinline__ Stats merge(Stats a, Stats b) {
  if (a.max < b.max) {
    const Stats t = a;
    a = b;
    b = t;
  }
  // a.max >= b.max; an empty side (max = -inf, sum_exp = 0) contributes nothing.
  const float rescaled = b.max == -INFINITY ? 0.0f : b.sum_exp * expf(b.max - a.max);
  return Stats{a.max, a.sum_exp + rescaled, a.sum + b.sum};
}

// Every thread's statistics merged over the block of `Threads`, returned to every thread.
template <int Threads>
__device__ Stats block_stats(Stats s) {
  constexpr int kWarps = Threads / kWarp;
  for (int offset = kWarp / 2; offset > 0; offset /= 2) {
    Stats other;
    other.max = __shfl_xor_sync(0xffffffffu, s.max, offset);
    other.sum_exp = __shfl_xor_sync(0xffffffffu, s.sum_exp, offset);
    other.sum = __shfl_xor_sync(0xffffffffu, s.sum, offset);
    s = merge(s, other);
  }
  __shared__ Stats partial[kWarps];
  __shared__ Stats total;
  if (threadIdx.x % kWarp == 0) partial[threadIdx.x / kWarp] = s;
  __syncthreads();
  if (threadIdx.x == 0) {
    Stats all = partial[0];
    for (int w = 1; w < kWarps; ++w) all = merge(all, partial[w]);
    total = all;
  }
  __syncthreads();  // every read of the row is done: the row may now be overwritten
  return total;
}

// The statistics of one row over the whole block, returned to every thread.
template <typename T, int Threads = kThreads>
__device__ Stats row_stats(const T* z, int vocab) {
  Stats s{-INFINITY, 0.0f, 0.0f};
  for (int j = threadIdx.x; j < vocab; j += Threads) {
    const float x = to_float(z[j]);
    if (x > s.max) {
      s.sum_exp = s.sum_exp * expf(s.max - x) + 1.0f;  // exp(-inf) = 0 on the first
      s.max = x;
    } else {
      s.sum_exp += expf(x - s.max);
    }
    s.sum += x;
  }
  return block_stats<Threads>(s);
}

// exp(x) of the vectorised rows, x = z - max <= 0: expf (the verified kernels), or with
// kFastExp (the candidate fast_loss_exp) device_util.cuh's exp_by_exp2, the hardware's
// exp2 of x log2(e) (two instructions where expf takes about eight). Why: counted
// in the SASS (sm_90, bf16), the vectorised rows took ~29 instructions a logit over both
// passes (12 a logit in pass 1, 17 in pass 2), ~27 G a base step at 25,000 tokens, about
// as long to issue on an H200 (~0.8 ms) as their bytes take to move (3.7 GB), and the loss
// took 1.49 ms; with it ~21 (8.6 and 12). ex2.approx errs by at most ~2^-22 relative (PTX
// ISA), the argument's rounding by |x log2 e| 2^-24: ~1e-6 where a row's logits span
// e^20, which a bf16 gradient (2^-8) and the fp32 row statistics' sum of 37,000 terms
// (~sqrt(V) 2^-24) do not see; results below 2^-126 flush to zero, where expf gives
// denormals that no sum of a row can hold.
template <bool kFastExp>
__device__ __forceinline__ float row_exp(float x) {
  if constexpr (kFastExp) {
    return exp_by_exp2(x);
  } else {
    return expf(x);
  }
}

// row_stats with 16-byte loads (vocab % kVector<T> == 0, z 16-byte aligned), two vectors
// in flight per thread, and one rescale of the running sum per vector instead of one
// exp per element that raises the maximum: pass 1 of cross_entropy_rows_from_l2.
template <typename T, int Threads, bool kFastExp = false>
__device__ Stats row_stats_vectorized(const T* z, int vocab) {
  constexpr int W = kVector<T>;
  const int vectors = vocab / W;
  Stats s{-INFINITY, 0.0f, 0.0f};
  auto add = [&s](const float (&x)[W]) {
    float vector_max = x[0], vector_sum = x[0];
#pragma unroll
    for (int k = 1; k < W; ++k) {
      vector_max = fmaxf(vector_max, x[k]);
      vector_sum += x[k];
    }
    const float new_max = fmaxf(s.max, vector_max);
    float sum_exp = s.max == -INFINITY ? 0.0f : s.sum_exp * row_exp<kFastExp>(s.max - new_max);
#pragma unroll
    for (int k = 0; k < W; ++k) sum_exp += row_exp<kFastExp>(x[k] - new_max);
    s = Stats{new_max, sum_exp, s.sum + vector_sum};
  };
  int i = threadIdx.x;
  for (; i + Threads < vectors; i += 2 * Threads) {
    float a[W], b[W];
    load16<T>(a, z + static_cast<int64_t>(i) * W);
    load16<T>(b, z + static_cast<int64_t>(i + Threads) * W);
    add(a);
    add(b);
  }
  if (i < vectors) {
    float a[W];
    load16<T>(a, z + static_cast<int64_t>(i) * W);
    add(a);
  }
  return block_stats<Threads>(s);
}

// Per-row status in the scratch: 1 = counted target, 0 = pad, -1 = target outside vocab.
//
// kVectorized: both passes on 16-byte vectors (row_stats_vectorized), the same results
// up to the order of the row sums; taken whenever vocab % kVector<T> == 0 and logits and
// d_logits are 16-byte aligned (the host checks), the scalar loops otherwise. Why: the
// scalar kernel's bf16 loads (64 bytes a warp) and one exp per element that raises the
// maximum took 4.54 ms of the base step on an H100 for ~1.9 ms of bytes ([25,000 x
// 37,000] bf16 read twice, mostly from L2 the second time, and written once); vectorised,
// 2.23 ms (2026-11-26, bench/RESULTS.md, where its twins and memcheck passed too).
// The body of a block of `Threads` (cross_entropy_rows, scalar, and with kStreaming the
// vectorised cross_entropy_rows_from_l2 below).
template <typename T, bool kVectorized, int Threads, bool kStreaming, bool kFastExp = false>
__device__ __forceinline__ void cross_entropy_row(T* d_logits, const T* logits,
                                                  const int32_t* __restrict__ targets,
                                                  int vocab, float eps, int pad_id,
                                                  float grad_scale,
                                                  const StepInputs* scale_from,
                                                  double* row_loss, double* row_nll,
                                                  int* row_status) {
  constexpr int W = kVector<T>;
  // softmax_cross_entropy_add's scale, read as the kernel runs (a captured pass's);
  // null: the argument's.
  if (scale_from != nullptr) grad_scale = scale_from->grad_scale;
  const int64_t r = blockIdx.x;
  const int32_t target = targets[r];
  T* dz = d_logits != nullptr ? d_logits + r * vocab : nullptr;
  if (target == pad_id) {
    if (dz != nullptr && kVectorized) {
      const float zeros[W] = {};
      for (int i = threadIdx.x; i < vocab / W; i += Threads) {
        store16<T, kStreaming>(dz + i * W, zeros);
      }
    } else if (dz != nullptr) {
      for (int j = threadIdx.x; j < vocab; j += Threads) dz[j] = from_float<T>(0.0f);
    }
    if (threadIdx.x == 0) {
      row_loss[r] = 0.0;
      row_nll[r] = 0.0;
      row_status[r] = 0;
    }
    return;
  }
  if (target < 0 || target >= vocab) {  // the host throws; d_logits is left as it was
    if (threadIdx.x == 0) {
      row_loss[r] = 0.0;
      row_nll[r] = 0.0;
      row_status[r] = -1;
    }
    return;
  }
  const T* z = logits + r * vocab;
  const float target_logit = to_float(z[target]);  // read before the barrier in row_stats
  const Stats s = kVectorized ? row_stats_vectorized<T, Threads, kFastExp>(z, vocab)
                              : row_stats<T, Threads>(z, vocab);
  const float lse = s.max + logf(s.sum_exp);
  if (threadIdx.x == 0) {
    const double smoothing = static_cast<double>(eps);
    row_loss[r] = static_cast<double>(lse) - (1.0 - smoothing) * target_logit -
                  smoothing / vocab * static_cast<double>(s.sum);
    row_nll[r] = static_cast<double>(lse) - target_logit;
    row_status[r] = 1;
  }
  if (dz == nullptr) return;
  const float uniform_mass = eps / static_cast<float>(vocab);
  if constexpr (kVectorized) {
    for (int i = threadIdx.x; i < vocab / W; i += Threads) {
      float x[W];
      load16<T, kStreaming>(x, z + i * W);
#pragma unroll
      for (int k = 0; k < W; ++k) {
        const float q = uniform_mass + (i * W + k == target ? 1.0f - eps : 0.0f);
        x[k] = grad_scale * (row_exp<kFastExp>(x[k] - lse) - q);
      }
      store16<T, kStreaming>(dz + i * W, x);
    }
  } else {
    for (int j = threadIdx.x; j < vocab; j += Threads) {
      const float p = expf(to_float(z[j]) - lse);
      const float q = uniform_mass + (j == target ? 1.0f - eps : 0.0f);
      dz[j] = from_float<T>(grad_scale * (p - q));
    }
  }
}

// Rows whose vocabulary or tensors do not allow 16-byte loads.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    cross_entropy_rows(T* d_logits, const T* logits, const int32_t* __restrict__ targets,
                       int vocab, float eps, int pad_id, float grad_scale,
                       const StepInputs* scale_from, double* row_loss, double* row_nll,
                       int* row_status) {
  cross_entropy_row<T, false, kThreads, false>(d_logits, logits, targets, vocab, eps,
                                               pad_id, grad_scale, scale_from, row_loss,
                                               row_nll, row_status);
}

// The vectorised rows (kWideThreads above, the former loss_rows_from_l2): blocks of
// 512 threads (at most four an SM by threads; two at its 56 registers), pass 2 streaming;
// kFastExp: the candidate fast_loss_exp (row_exp).
template <typename T, bool kFastExp = false>
__global__ void __launch_bounds__(kWideThreads, 2)
    cross_entropy_rows_from_l2(T* d_logits, const T* logits,
                               const int32_t* __restrict__ targets, int vocab, float eps,
                               int pad_id, float grad_scale, const StepInputs* scale_from,
                               double* row_loss, double* row_nll, int* row_status) {
  cross_entropy_row<T, true, kWideThreads, true, kFastExp>(d_logits, logits, targets, vocab, eps,
                                                           pad_id, grad_scale, scale_from,
                                                           row_loss, row_nll, row_status);
}

struct LossResult {
  double loss;
  double nll;
  long long tokens;
  int bad_row;  // first row whose target is outside [0, vocab), -1 if none
  int bad_target;
};

// One block: thread i sums rows i, i + kSumThreads, ... in double, in order; then a
// fixed tree over the threads. The first bad row is a minimum (order-free).
// kIntoTotals (softmax_cross_entropy_add): the sums are added into the step's
// StepTotals instead (one add per micro-batch, in stream order: the order a host adding
// the returned sums would take), a bad row counted there.
template <bool kIntoTotals>
__global__ void __launch_bounds__(kSumThreads)
    sum_rows(LossResult* result, StepTotals* totals, const double* row_loss,
             const double* row_nll, const int* row_status, const int32_t* targets, int rows) {
  __shared__ double loss[kSumThreads], nll[kSumThreads];
  __shared__ long long tokens[kSumThreads];
  __shared__ int bad[kSumThreads];
  double my_loss = 0.0, my_nll = 0.0;
  long long my_tokens = 0;
  int my_bad = rows;
  for (int r = threadIdx.x; r < rows; r += kSumThreads) {
    my_loss += row_loss[r];
    my_nll += row_nll[r];
    if (row_status[r] == 1) ++my_tokens;
    if (row_status[r] < 0 && r < my_bad) my_bad = r;
  }
  const int i = threadIdx.x;
  loss[i] = my_loss;
  nll[i] = my_nll;
  tokens[i] = my_tokens;
  bad[i] = my_bad;
  __syncthreads();
  for (int half = kSumThreads / 2; half > 0; half /= 2) {
    if (i < half) {
      loss[i] += loss[i + half];
      nll[i] += nll[i + half];
      tokens[i] += tokens[i + half];
      bad[i] = min(bad[i], bad[i + half]);
    }
    __syncthreads();
  }
  const int first_bad = bad[0];  // every thread reads it after the last barrier
  const bool any_bad = first_bad < rows;
  int bad_rows = 0;
  if constexpr (kIntoTotals) {
    // The count of bad rows, as the CPU twin keeps it: a second tree over `bad`, taken
    // only when there is one (the condition is the same for the whole block).
    if (any_bad) {
      int my_count = 0;
      for (int r = threadIdx.x; r < rows; r += kSumThreads) my_count += row_status[r] < 0;
      __syncthreads();  // every thread has read bad[0]
      bad[i] = my_count;
      __syncthreads();
      for (int half = kSumThreads / 2; half > 0; half /= 2) {
        if (i < half) bad[i] += bad[i + half];
        __syncthreads();
      }
      bad_rows = bad[0];
    }
  }
  if (i != 0) return;
  if constexpr (kIntoTotals) {
    totals->loss += loss[0];
    totals->nll += nll[0];
    totals->tokens += tokens[0];
    if (any_bad) {
      if (totals->bad_rows == 0) {
        totals->first_bad_row = first_bad;
        totals->first_bad_target = targets[first_bad];
      }
      totals->bad_rows += bad_rows;
    }
  } else {
    *result = LossResult{loss[0], nll[0], tokens[0], any_bad ? first_bad : -1,
                         any_bad ? targets[first_bad] : 0};
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    log_softmax_rows(T* log_probs, const T* logits, int vocab) {
  const int64_t r = blockIdx.x;
  const T* z = logits + r * vocab;
  T* out = log_probs + r * vocab;
  const Stats s = row_stats(z, vocab);
  const float lse = s.max + logf(s.sum_exp);
  for (int j = threadIdx.x; j < vocab; j += kThreads) {
    out[j] = from_float<T>(to_float(z[j]) - lse);
  }
}

size_t aligned(size_t bytes) { return (bytes + 255) / 256 * 256; }

// Launches of the vectorised rows' kernel in blocks of 512, for its twin tests.
std::atomic<int64_t> wide_loss_row_launch_count{0};

// Queues the row kernel and the sum over rows, per-row values in the context's scratch:
// the sums go to the returned LossResult (in scratch) or, kIntoTotals, are added into
// `totals`. rows > 0.
// With `rows_nll`, also says where the per-row nll are (rows doubles in the scratch, valid
// until the context's scratch is next taken).
template <typename T, bool kIntoTotals>
LossResult* queue_loss_sums(Context& context, T* d_logits, const T* logits,
                            const int32_t* targets, int rows, int vocab, float eps, int pad_id,
                            float grad_scale, StepTotals* totals,
                            const StepInputs* scale_from = nullptr,
                            const double** rows_nll = nullptr) {
  cudaStream_t stream = context.stream();
  // Scratch: per-row loss, nll (double), status (int), then the result.
  const size_t n = static_cast<size_t>(rows);
  const size_t loss_at = 0, nll_at = aligned(n * sizeof(double));
  const size_t status_at = nll_at + aligned(n * sizeof(double));
  const size_t result_at = status_at + aligned(n * sizeof(int));
  char* scratch = static_cast<char*>(context.scratch(result_at + sizeof(LossResult)));
  double* row_loss = reinterpret_cast<double*>(scratch + loss_at);
  double* row_nll = reinterpret_cast<double*>(scratch + nll_at);
  int* row_status = reinterpret_cast<int*>(scratch + status_at);
  LossResult* result = reinterpret_cast<LossResult*>(scratch + result_at);
  if (rows_nll != nullptr) *rows_nll = row_nll;

  const bool vectorized = vocab % kVector<T> == 0 && aligned16(logits) &&
                          (d_logits == nullptr || aligned16(d_logits));
  if (vectorized) {
    const auto rows_kernel = context.candidate_kernel(kFastLossExp)
                                 ? cross_entropy_rows_from_l2<T, true>
                                 : cross_entropy_rows_from_l2<T, false>;
    rows_kernel<<<rows, kWideThreads, 0, stream>>>(d_logits, logits, targets, vocab, eps, pad_id,
                                                   grad_scale, scale_from, row_loss, row_nll,
                                                   row_status);
    THPC_CUDA_CHECK_LAUNCH("cross_entropy_rows (blocks of 512)");
    ++wide_loss_row_launch_count;
  } else {
    cross_entropy_rows<T><<<rows, kThreads, 0, stream>>>(
        d_logits, logits, targets, vocab, eps, pad_id, grad_scale, scale_from, row_loss,
        row_nll, row_status);
    THPC_CUDA_CHECK_LAUNCH("cross_entropy_rows");
  }
  sum_rows<kIntoTotals><<<1, kSumThreads, 0, stream>>>(result, totals, row_loss, row_nll,
                                                       row_status, targets, rows);
  THPC_CUDA_CHECK_LAUNCH("sum_rows");
  return result;
}

}  // namespace

// Reads each row of logits once for its statistics and writes d_logits (may alias
// logits) without materialising fp32 logits; returns the sums (synchronises the
// stream). A target outside [0, vocab) that is not pad_id throws, naming the row.
template <typename T>
LossSums softmax_cross_entropy(Context& context, T* d_logits, const T* logits,
                               const int32_t* targets, int rows, int vocab, float eps,
                               int pad_id, float grad_scale) {
  THPC_CHECK(vocab > 0, "cross-entropy over a vocabulary of " << vocab);
  THPC_CHECK(rows >= 0, "cross-entropy over " << rows << " rows");
  if (rows == 0) return LossSums{};
  cudaStream_t stream = context.stream();
  const LossResult* result = queue_loss_sums<T, false>(context, d_logits, logits, targets, rows,
                                                       vocab, eps, pad_id, grad_scale, nullptr);
  auto* host = static_cast<LossResult*>(context.pinned(sizeof(LossResult)));
  THPC_CUDA_CHECK(
      cudaMemcpyAsync(host, result, sizeof(LossResult), cudaMemcpyDeviceToHost, stream));
  THPC_CUDA_CHECK(cudaStreamSynchronize(stream));
  const LossResult sums = *host;
  if (sums.bad_row >= 0) {
    THPC_FAIL("target id " << sums.bad_target << " at row " << sums.bad_row
                           << " is outside the vocabulary [0, " << vocab << ")");
  }
  LossSums out;
  out.loss = sums.loss;
  out.nll = sums.nll;
  out.tokens = static_cast<int64_t>(sums.tokens);
  return out;
}

// The same row kernel as softmax_cross_entropy's, then sum_rows adding into the step's
// totals on the device: no copy, no wait (the step reads its totals once, at its end).
// The gradient's scale is inputs->grad_scale, read by the row kernel as it runs (a
// captured pass replays with each step's scale). Until the H200 window of 2026-11-29
// passed its twins (the former candidate step_totals) the scale and the totals went
// through the host, three small waits a micro-batch.
template <typename T>
void softmax_cross_entropy_add(Context& context, T* d_logits, const T* logits,
                               const int32_t* targets, int rows, int vocab, float eps,
                               int pad_id, const StepInputs* inputs, float* totals) {
  THPC_CHECK(vocab > 0, "cross-entropy over a vocabulary of " << vocab);
  THPC_CHECK(rows >= 0, "cross-entropy over " << rows << " rows");
  THPC_CHECK(totals != nullptr, "softmax_cross_entropy_add without its totals");
  THPC_CHECK(inputs != nullptr, "softmax_cross_entropy_add without its step inputs");
  if (rows == 0) return;
  queue_loss_sums<T, true>(context, d_logits, logits, targets, rows, vocab, eps, pad_id, 0.0f,
                           reinterpret_cast<StepTotals*>(totals), inputs);
}

// softmax_cross_entropy's kernels as they are (no gradient, eps 0), then one copy of the
// result and of the rows' nll (the scratch's doubles) into pinned memory and one stream
// synchronisation: no kernel of its own.
template <typename T>
std::vector<double> softmax_nll_rows(Context& context, const T* logits, const int32_t* targets,
                                     int rows, int vocab, int pad_id) {
  THPC_CHECK(vocab > 0, "cross-entropy over a vocabulary of " << vocab);
  THPC_CHECK(rows >= 0, "cross-entropy over " << rows << " rows");
  if (rows == 0) return {};
  cudaStream_t stream = context.stream();
  const double* device_nll = nullptr;
  const LossResult* result =
      queue_loss_sums<T, false>(context, nullptr, logits, targets, rows, vocab, 0.0f, pad_id,
                                0.0f, nullptr, nullptr, &device_nll);
  const size_t nll_bytes = sizeof(double) * static_cast<size_t>(rows);
  char* host = static_cast<char*>(context.pinned(aligned(sizeof(LossResult)) + nll_bytes));
  double* host_nll = reinterpret_cast<double*>(host + aligned(sizeof(LossResult)));
  THPC_CUDA_CHECK(
      cudaMemcpyAsync(host, result, sizeof(LossResult), cudaMemcpyDeviceToHost, stream));
  THPC_CUDA_CHECK(
      cudaMemcpyAsync(host_nll, device_nll, nll_bytes, cudaMemcpyDeviceToHost, stream));
  THPC_CUDA_CHECK(cudaStreamSynchronize(stream));
  const LossResult sums = *reinterpret_cast<const LossResult*>(host);
  if (sums.bad_row >= 0) {
    THPC_FAIL("target id " << sums.bad_target << " at row " << sums.bad_row
                           << " is outside the vocabulary [0, " << vocab << ")");
  }
  return std::vector<double>(host_nll, host_nll + rows);
}

template <typename T>
void log_softmax(Context& context, T* log_probs, const T* logits, int rows, int vocab) {
  const cudaStream_t stream = context.stream();
  if (vocab <= 0 || rows <= 0) return;
  log_softmax_rows<T><<<rows, kThreads, 0, stream>>>(log_probs, logits, vocab);
  THPC_CUDA_CHECK_LAUNCH("log_softmax_rows");
}

THPC_CUDA_TWIN(softmax_cross_entropy)
THPC_CUDA_TWIN(softmax_cross_entropy_add)
THPC_CUDA_TWIN(softmax_nll_rows)
THPC_CUDA_TWIN(log_softmax)

}  // namespace thpc::cuda

int64_t thpc::cuda_loss_rows_from_l2_launches() {
  return thpc::cuda::wide_loss_row_launch_count.load();
}
