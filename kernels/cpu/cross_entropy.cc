// Label-smoothed softmax cross-entropy (§5.4, "Label Smoothing") and log-softmax for
// decoding, on the CPU.
#include <cmath>
#include <cstdint>
#include <vector>

#include "common/error.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/parallel.h"

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
  for (int row = 0; row < rows; ++row) {  // before the parallel loop, which cannot throw
    const int32_t target = targets[row];
    THPC_CHECK(target == pad_id || (target >= 0 && target < vocab),
               "target id " << target << " at row " << row << " is outside the vocabulary [0, "
                            << vocab << ")");
  }
  const double smoothing = static_cast<double>(eps);
  const double uniform_mass = smoothing / vocab;  // eps / V, the smoothed mass per class
  // Each row's loss and nll, summed afterwards in row order (the same bits with any
  // number of threads).
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
    // exp(z_j - max) of this row, one buffer per thread, grown once.
    thread_local std::vector<double> exps;
    if (dz != nullptr && static_cast<int>(exps.size()) < vocab) exps.resize(vocab);
    const RowStats stats = row_stats(z, vocab, dz != nullptr ? exps.data() : nullptr);
    const double target_logit = static_cast<double>(z[target]);
    row_loss[row] =
        stats.log_sum_exp - (1.0 - smoothing) * target_logit - uniform_mass * stats.sum;
    row_nll[row] = stats.log_sum_exp - target_logit;
    if (dz == nullptr) continue;
    const double scale = static_cast<double>(grad_scale);
    for (int j = 0; j < vocab; ++j) {
      const double probability = exps[j] / stats.sum_exp;  // p_j = exp(z_j - lse)
      const double smoothed_target = uniform_mass + (j == target ? 1.0 - smoothing : 0.0);
      dz[j] = static_cast<T>(scale * (probability - smoothed_target));
    }
  }
  LossSums sums;
  for (int row = 0; row < rows; ++row) {
    if (targets[row] == pad_id) continue;
    sums.loss += row_loss[row];
    sums.nll += row_nll[row];
    sums.tokens += 1;
  }
  return sums;
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
    const double log_sum_exp = row_stats(z, vocab).log_sum_exp;
    for (int j = 0; j < vocab; ++j) {
      out[j] = static_cast<T>(static_cast<double>(z[j]) - log_sum_exp);
    }
  }
}

template LossSums softmax_cross_entropy<float>(float*, const float*, const int32_t*, int, int,
                                               float, int, float);
template LossSums softmax_cross_entropy<double>(double*, const double*, const int32_t*, int, int,
                                                float, int, float);
template void log_softmax<float>(float*, const float*, int, int);
template void log_softmax<double>(double*, const double*, int, int);

}  // namespace thpc::cpu
