// Label-smoothed softmax cross-entropy (§5.4, "Label Smoothing") and log-softmax for
// decoding, on the CPU.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "common/error.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/row_max.h"

#if defined(THPC_HAVE_LIBMVEC)
#include <immintrin.h>
// glibc's vector math library (libmvec): expf of four floats, the x86-64 vector-function
// ABI name of the SSE variant (the baseline ISA, so no CPU check is needed; glibc's IFUNC
// picks its SSE4.1 code where the CPU has it). Accuracy: within 4 ulp of exp (glibc's
// manual), against ~1 ulp of the scalar expf.
extern "C" __m128 _ZGVbN4v_expf(__m128 x);
#endif

namespace thpc::cpu {
namespace {

// The statistics of one row of logits z that the loss needs, accumulated in double:
// log_sum_exp = log sum_j exp(z_j), computed stably as max + log sum_j exp(z_j - max).
struct RowStats {
  double max = 0.0;
  double log_sum_exp = 0.0;
  double sum_exp = 0.0;  // sum_j exp(z_j - max)
  double sum = 0.0;  // sum_j z_j, for the uniform eps / vocab part of the smoothed target
};

// With `exps` given (vocab entries), also keeps exp(z_j - max) there, so that the
// probabilities exp(z_j - max) / sum_exp need no second exponential per logit (the
// exponentials of the loss were the largest cost outside GEMM in a CPU step).
template <typename T>
RowStats row_stats(const T* logits, int vocab, double* exps = nullptr) {
  RowStats stats;
  stats.max = static_cast<double>(logits[0]);
  for (int j = 1; j < vocab; ++j) {
    const double z = static_cast<double>(logits[j]);
    if (z > stats.max) stats.max = z;
  }
  double sum_exp = 0.0;
  for (int j = 0; j < vocab; ++j) {
    const double z = static_cast<double>(logits[j]);
    const double e = std::exp(z - stats.max);
    if (exps != nullptr) exps[j] = e;
    sum_exp += e;
    stats.sum += z;
  }
  stats.sum_exp = sum_exp;
  stats.log_sum_exp = stats.max + std::log(sum_exp);
  return stats;
}

// The fp32 rows of training and decoding: the exponentials in float, four at a time
// (libmvec where the build found it), each kept in `exps` when given; the sums still in
// double, in four fixed lanes (so the bits do not depend on the thread count). Why: in
// double, one exp per logit and a serial sum were ~4% of a one-thread training step of
// the small preset (vocabulary 8000) and ~2.5% of beam-search decoding; float exps are
// what the GPU kernel computes too. The argument z_j - max is rounded to float (exact
// for z_j within a factor 2 of max, else one rounding, ~1e-7 relative): the probabilities
// move by a few float ulps, the loss by ~1e-7 (the golden losses hold to 1e-4).
RowStats row_stats_float(const float* logits, int vocab, float* exps) {
  const float max = row_max(logits, vocab);
  double sum_exp_lanes[4] = {0.0, 0.0, 0.0, 0.0};
  double sum_lanes[4] = {0.0, 0.0, 0.0, 0.0};
  int j = 0;
#if defined(THPC_HAVE_LIBMVEC)
  const __m128 shift = _mm_set1_ps(max);
  __m128d exp_low = _mm_setzero_pd(), exp_high = _mm_setzero_pd();
  __m128d z_low = _mm_setzero_pd(), z_high = _mm_setzero_pd();
  for (; j + 4 <= vocab; j += 4) {
    const __m128 z = _mm_loadu_ps(logits + j);
    const __m128 e = _ZGVbN4v_expf(_mm_sub_ps(z, shift));
    if (exps != nullptr) _mm_storeu_ps(exps + j, e);
    exp_low = _mm_add_pd(exp_low, _mm_cvtps_pd(e));  // lanes 0, 1
    exp_high = _mm_add_pd(exp_high, _mm_cvtps_pd(_mm_movehl_ps(e, e)));  // lanes 2, 3
    z_low = _mm_add_pd(z_low, _mm_cvtps_pd(z));
    z_high = _mm_add_pd(z_high, _mm_cvtps_pd(_mm_movehl_ps(z, z)));
  }
  _mm_storeu_pd(sum_exp_lanes, exp_low);
  _mm_storeu_pd(sum_exp_lanes + 2, exp_high);
  _mm_storeu_pd(sum_lanes, z_low);
  _mm_storeu_pd(sum_lanes + 2, z_high);
#endif
  for (; j < vocab; ++j) {  // the tail (and every logit without libmvec), lane j % 4
    const float e = std::exp(logits[j] - max);
    if (exps != nullptr) exps[j] = e;
    sum_exp_lanes[j % 4] += e;
    sum_lanes[j % 4] += logits[j];
  }
  RowStats stats;
  stats.max = max;
  stats.sum_exp = (sum_exp_lanes[0] + sum_exp_lanes[1]) + (sum_exp_lanes[2] + sum_exp_lanes[3]);
  stats.sum = (sum_lanes[0] + sum_lanes[1]) + (sum_lanes[2] + sum_lanes[3]);
  stats.log_sum_exp = stats.max + std::log(stats.sum_exp);
  return stats;
}

// One row of the loss: its statistics, and when dz is given the gradient
// grad_scale * (p - q) (see softmax_cross_entropy). The double instantiation keeps every
// step in double (the finite-difference tests' reference).
template <typename T>
RowStats loss_row(T* dz, const T* z, int vocab, int32_t target, double smoothing,
                  double uniform_mass, double scale) {
  if constexpr (std::is_same_v<T, float>) {
    thread_local std::vector<float> exps;  // exp(z_j - max), one buffer per thread
    if (dz != nullptr && static_cast<int>(exps.size()) < vocab) exps.resize(vocab);
    const RowStats stats = row_stats_float(z, vocab, dz != nullptr ? exps.data() : nullptr);
    if (dz == nullptr) return stats;
    // dz_j = scale * p_j - scale * eps / V = e_j * (scale / sum_exp) - scale * eps / V.
    const float probability_scale = static_cast<float>(scale / stats.sum_exp);
    const float uniform_part = static_cast<float>(scale * uniform_mass);
    for (int j = 0; j < vocab; ++j) dz[j] = exps[j] * probability_scale - uniform_part;
    dz[target] = static_cast<float>(
        scale * (exps[target] / stats.sum_exp - (uniform_mass + 1.0 - smoothing)));
    return stats;
  } else {
    thread_local std::vector<double> exps;
    if (dz != nullptr && static_cast<int>(exps.size()) < vocab) exps.resize(vocab);
    const RowStats stats = row_stats(z, vocab, dz != nullptr ? exps.data() : nullptr);
    if (dz == nullptr) return stats;
    for (int j = 0; j < vocab; ++j) {
      const double probability = exps[j] / stats.sum_exp;  // p_j = exp(z_j - lse)
      const double smoothed_target = uniform_mass + (j == target ? 1.0 - smoothing : 0.0);
      dz[j] = static_cast<T>(scale * (probability - smoothed_target));
    }
    return stats;
  }
}

// cross_entropy_rows' sums, and the rows it skipped for a target outside [0, vocab).
struct RowSums {
  LossSums sums;
  int32_t bad_rows = 0;
  int32_t first_bad_row = 0, first_bad_target = 0;  // when bad_rows > 0
  std::vector<double> row_nll;  // each row's nll (0 where skipped), with keep_row_nll
};

// The rows' loss, nll and gradient, and their sums in row order (the same bits with any
// number of threads). A row whose target is outside [0, vocab) is skipped: no sums, its
// d_logits row left as it was, counted in bad_rows. With keep_row_nll, each row's nll is
// also returned (softmax_nll_rows): a caller adding a run of them in order from 0 gets
// the bits softmax_cross_entropy returns for that run.
template <typename T>
RowSums cross_entropy_rows(T* d_logits, const T* logits, const int32_t* targets, int rows,
                           int vocab, float eps, int pad_id, float grad_scale,
                           bool keep_row_nll = false) {
  const auto counted = [&](int32_t target) {
    return target != pad_id && target >= 0 && target < vocab;
  };
  const double smoothing = static_cast<double>(eps);
  const double uniform_mass = smoothing / vocab;  // eps / V, the smoothed mass per class
  std::vector<double> row_loss(rows, 0.0), row_nll(rows, 0.0);
#pragma omp parallel for schedule(static) num_threads(threads_for(int64_t(rows) * vocab))
  for (int row = 0; row < rows; ++row) {
    const T* z = logits + static_cast<int64_t>(row) * vocab;
    T* dz = d_logits != nullptr ? d_logits + static_cast<int64_t>(row) * vocab : nullptr;
    const int32_t target = targets[row];
    if (target == pad_id) {
      if (dz != nullptr) {
        for (int j = 0; j < vocab; ++j) dz[j] = T(0);
      }
      continue;
    }
    if (!counted(target)) continue;
    // z_t is read before loss_row writes dz, which may alias z.
    const double target_logit = static_cast<double>(z[target]);
    const RowStats stats = loss_row(dz, z, vocab, target, smoothing, uniform_mass,
                                    static_cast<double>(grad_scale));
    row_loss[row] =
        stats.log_sum_exp - (1.0 - smoothing) * target_logit - uniform_mass * stats.sum;
    row_nll[row] = stats.log_sum_exp - target_logit;
  }
  RowSums result;
  for (int row = 0; row < rows; ++row) {
    const int32_t target = targets[row];
    if (!counted(target)) {
      if (target != pad_id && result.bad_rows++ == 0) {
        result.first_bad_row = row;
        result.first_bad_target = target;
      }
      continue;
    }
    result.sums.loss += row_loss[row];
    result.sums.nll += row_nll[row];
    result.sums.tokens += 1;
  }
  if (keep_row_nll) result.row_nll = std::move(row_nll);
  return result;
}

// Throws for the first target outside [0, vocab) that is not pad_id, naming its row.
void check_targets(const int32_t* targets, int rows, int vocab, int pad_id) {
  for (int row = 0; row < rows; ++row) {
    const int32_t target = targets[row];
    THPC_CHECK(target == pad_id || (target >= 0 && target < vocab),
               "target id " << target << " at row " << row << " is outside the vocabulary [0, "
                            << vocab << ")");
  }
}

}  // namespace

// With log p_j = z_j - lse and q = (1 - eps) onehot(t) + eps / V:
//   loss_r = -sum_j q_j log p_j = lse - (1 - eps) z_t - (eps / V) sum_j z_j,
//   nll_r  = lse - z_t,
//   d loss_r / d z_j = p_j - q_j   (because sum_j q_j = 1),
// so d_logits = grad_scale * (p - q) on non-pad rows and 0 on pad rows. d_logits is
// written, not accumulated: the loss is where backward starts. A row is read in full
// (max, log-sum-exp, sums, z_t) before any of it is written, so d_logits may alias
// logits; it may also be null when only the sums are wanted.
template <typename T>
LossSums softmax_cross_entropy(T* d_logits, const T* logits, const int32_t* targets, int rows,
                               int vocab, float eps, int pad_id, float grad_scale) {
  THPC_CHECK(vocab > 0, "cross-entropy over a vocabulary of " << vocab);
  check_targets(targets, rows, vocab, pad_id);  // before the parallel loop, which cannot throw
  return cross_entropy_rows(d_logits, logits, targets, rows, vocab, eps, pad_id, grad_scale).sums;
}

// The rows' nll as softmax_cross_entropy computes them (eps 0: nll_r does not depend on
// it), kept apart instead of summed.
template <typename T>
std::vector<double> softmax_nll_rows(const T* logits, const int32_t* targets, int rows,
                                     int vocab, int pad_id) {
  THPC_CHECK(vocab > 0, "cross-entropy over a vocabulary of " << vocab);
  THPC_CHECK(rows >= 0, "cross-entropy over " << rows << " rows");
  check_targets(targets, rows, vocab, pad_id);
  return cross_entropy_rows<T>(nullptr, logits, targets, rows, vocab, 0.0f, pad_id, 0.0f,
                               /*keep_row_nll=*/true)
      .row_nll;
}

// The sums are added in the order the micro-batches come, in double: the same bits as
// a caller adding softmax_cross_entropy's returned sums. `totals` holds a StepTotals'
// bytes (StepTotalsBuffer), copied in and out.
template <typename T>
void softmax_cross_entropy_add(T* d_logits, const T* logits, const int32_t* targets, int rows,
                               int vocab, float eps, int pad_id, const StepInputs* inputs,
                               T* totals) {
  THPC_CHECK(vocab > 0, "cross-entropy over a vocabulary of " << vocab);
  THPC_CHECK(totals != nullptr, "softmax_cross_entropy_add without its totals");
  THPC_CHECK(inputs != nullptr, "softmax_cross_entropy_add without its step inputs");
  const float grad_scale = inputs->grad_scale;
  StepTotals sum;
  std::memcpy(static_cast<void*>(&sum), totals, sizeof(sum));  // trivially copyable
  const RowSums added =
      cross_entropy_rows(d_logits, logits, targets, rows, vocab, eps, pad_id, grad_scale);
  sum.loss += added.sums.loss;
  sum.nll += added.sums.nll;
  sum.tokens += added.sums.tokens;
  if (added.bad_rows > 0 && sum.bad_rows == 0) {
    sum.first_bad_row = added.first_bad_row;
    sum.first_bad_target = added.first_bad_target;
  }
  sum.bad_rows += added.bad_rows;
  std::memcpy(totals, &sum, sizeof(sum));
}

// log_probs = z - log sum_j exp(z_j), the log-sum-exp taken stably about the row maximum.
// May alias logits: the row statistics are complete before the row is overwritten.
template <typename T>
void log_softmax(T* log_probs, const T* logits, int rows, int vocab) {
  if (vocab <= 0) return;
#pragma omp parallel for schedule(static) num_threads(threads_for(int64_t(rows) * vocab))
  for (int row = 0; row < rows; ++row) {
    const T* z = logits + static_cast<int64_t>(row) * vocab;
    T* out = log_probs + static_cast<int64_t>(row) * vocab;
    double log_sum_exp;
    if constexpr (std::is_same_v<T, float>) {
      log_sum_exp = row_stats_float(z, vocab, nullptr).log_sum_exp;
    } else {
      log_sum_exp = row_stats(z, vocab).log_sum_exp;
    }
    for (int j = 0; j < vocab; ++j) {
      out[j] = static_cast<T>(static_cast<double>(z[j]) - log_sum_exp);
    }
  }
}

THPC_CPU_TWIN(softmax_cross_entropy)
THPC_CPU_TWIN(softmax_cross_entropy_add)
THPC_CPU_TWIN(softmax_nll_rows)
THPC_CPU_TWIN(log_softmax)

}  // namespace thpc::cpu
