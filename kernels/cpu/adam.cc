// The Adam optimizer (Kingma & Ba 2015) with bias correction, as used in §5.3, on the CPU.
#include <cmath>
#include <cstdint>

#include "common/error.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/parallel.h"

namespace thpc::cpu {
namespace {

// adam_update's body, and with kDecay adamw_update's: the decay added to the step before
// the one subtraction (each operation rounded in T, in the GPU twin's order).
template <typename T, bool kDecay>
void adam_body(T* params, T* compute, const T* grads, T* m, T* v, int64_t n, float lr,
               float beta1, float beta2, float eps, float decay, int64_t step) {
  THPC_CHECK(step >= 1, "Adam step " << step << " (steps are 1-based)");
  const double steps = static_cast<double>(step);
  const T first_correction =
      static_cast<T>(1.0 - std::pow(static_cast<double>(beta1), steps));
  const T second_correction =
      static_cast<T>(1.0 - std::pow(static_cast<double>(beta2), steps));
  const T b1 = static_cast<T>(beta1), b2 = static_cast<T>(beta2);
  const T learning_rate = static_cast<T>(lr), epsilon = static_cast<T>(eps);
  const T decay_rate = static_cast<T>(decay);
#pragma omp parallel for schedule(static) num_threads(threads_for(n))
  for (int64_t i = 0; i < n; ++i) {
    const T g = grads[i];
    m[i] = b1 * m[i] + (T(1) - b1) * g;
    v[i] = b2 * v[i] + (T(1) - b2) * g * g;
    const T m_hat = m[i] / first_correction;
    const T v_hat = v[i] / second_correction;
    const T update = learning_rate * m_hat / (std::sqrt(v_hat) + epsilon);
    if constexpr (kDecay) {
      params[i] -= update + decay_rate * params[i];
    } else {
      params[i] -= update;
    }
  }
  if (compute == nullptr || compute == params) return;
#pragma omp parallel for schedule(static) num_threads(threads_for(n))
  for (int64_t i = 0; i < n; ++i) compute[i] = params[i];
}

}  // namespace

// For each parameter, with g its gradient and step the 1-based update count:
//   m = b1 m + (1 - b1) g,          v = b2 v + (1 - b2) g^2,
//   m_hat = m / (1 - b1^step),      v_hat = v / (1 - b2^step),
//   p -= lr * m_hat / (sqrt(v_hat) + eps)
// (PyTorch's form: eps is added to sqrt(v_hat), not to v_hat). The bias corrections
// 1 - b^step are computed in double once per call; the per-element arithmetic is in T.
// A compute copy other than the params (the CPU computes in its param type) is a copy.
template <typename T>
void adam_update(T* params, T* compute, const T* grads, T* m, T* v, int64_t n, float lr,
                 float beta1, float beta2, float eps, int64_t step) {
  adam_body<T, false>(params, compute, grads, m, v, n, lr, beta1, beta2, eps, 0.0f, step);
}

// The same with p -= (lr * m_hat / (sqrt(v_hat) + eps) + decay * p) (AdamW, op_list.h).
template <typename T>
void adamw_update(T* params, T* compute, const T* grads, T* m, T* v, int64_t n, float lr,
                  float beta1, float beta2, float eps, float decay, int64_t step) {
  adam_body<T, true>(params, compute, grads, m, v, n, lr, beta1, beta2, eps, decay, step);
}

THPC_CPU_TWIN(adam_update)
THPC_CPU_TWIN(adamw_update)

}  // namespace thpc::cpu
