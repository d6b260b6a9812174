#include "kernels/cpu/cpu_backend.h"

#include <cblas.h>
#include <omp.h>

#include <atomic>
#include <cstdlib>
#include <cstring>

#include "common/error.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/parallel.h"

namespace thpc {
namespace {

template <typename T>
constexpr DType dtype_of();
template <>
constexpr DType dtype_of<float>() { return DType::F32; }
template <>
constexpr DType dtype_of<double>() { return DType::F64; }

template <typename T>
class CpuBackend final : public Backend {
 public:
  std::string name() const override { return std::string("cpu-") + dtype_name(dtype_of<T>()); }
  bool host_memory() const override { return true; }
  // cpu::attention_forward's products run over the first key_lengths[b] keys only.
  bool attention_reads_masked_keys() const override { return false; }
  DType param_dtype() const override { return dtype_of<T>(); }
  DType compute_dtype() const override { return dtype_of<T>(); }

  Tensor alloc(DType dtype, int64_t numel) override {
    THPC_CHECK(dtype == dtype_of<T>(), "the " << name() << " backend holds no "
                                              << dtype_name(dtype) << " tensors");
    THPC_CHECK(numel >= 0, "negative size " << numel);
    Tensor t;
    t.dtype = dtype;
    t.numel = numel;
    // 64-byte alignment: a cache line, and what vectorised BLAS kernels prefer.
    const size_t bytes = ((static_cast<size_t>(numel) * sizeof(T) + 63) / 64) * 64;
    t.data = std::aligned_alloc(64, bytes > 0 ? bytes : 64);
    THPC_CHECK(t.data != nullptr, "out of host memory allocating " << bytes << " bytes");
    return t;
  }
  void free(Tensor& tensor) override {
    std::free(tensor.data);
    tensor = Tensor{};
  }
  int32_t* alloc_ids(int64_t count) override {
    auto* ids = static_cast<int32_t*>(std::malloc(sizeof(int32_t) * (count > 0 ? count : 1)));
    THPC_CHECK(ids != nullptr, "out of host memory for " << count << " ids");
    return ids;
  }
  void free_ids(int32_t*& ids) override {
    std::free(ids);
    ids = nullptr;
  }
  // An empty tensor may have a null pointer (an empty host vector's data() too), and
  // memcpy/memset with a null pointer are undefined even for zero bytes (UBSan's
  // nonnull check): zero-sized transfers return first, as cudaMemcpy's do nothing.
  void zero(Tensor t) override {
    if (t.numel > 0) std::memset(t.data, 0, t.numel * sizeof(T));
  }
  void copy(Tensor dst, Tensor src) override {
    THPC_CHECK(dst.numel == src.numel, "copy of " << src.numel << " into " << dst.numel);
    if (src.numel > 0) std::memmove(dst.data, src.data, src.numel * sizeof(T));
  }
  void upload(Tensor dst, const void* host) override {
    if (dst.numel > 0) std::memcpy(dst.data, host, dst.numel * sizeof(T));
  }
  void download(void* host, Tensor src) override {
    if (src.numel > 0) std::memcpy(host, src.data, src.numel * sizeof(T));
  }
  void upload_ids(int32_t* dst, const int32_t* host, int64_t count) override {
    if (count > 0) std::memcpy(dst, host, count * sizeof(int32_t));
  }
  void download_ids(int32_t* host, const int32_t* src, int64_t count) override {
    if (count > 0) std::memcpy(host, src, count * sizeof(int32_t));
  }
  void synchronize() override {}

  void embedding_forward(Tensor out, const int32_t* tokens, Tensor table, Tensor positions,
                         int rows, int length, int d, int vocab, float scale) override {
    cpu::embedding_forward<T>(p(out), tokens, p(table), p(positions), rows, length, d, vocab,
                              static_cast<T>(scale));
  }
  void embedding_backward(Tensor d_table, Tensor d_positions, Tensor d_out,
                          const int32_t* tokens, int rows, int length, int d, int vocab,
                          float scale) override {
    cpu::embedding_backward<T>(p(d_table), p(d_positions), p(d_out), tokens, rows, length, d,
                               vocab, static_cast<T>(scale));
  }
  void linear_forward(Tensor y, Tensor x, Tensor W, Tensor b, int M, int K, int N) override {
    cpu::linear_forward<T>(p(y), p(x), p(W), p(b), M, K, N);
  }
  void linear_backward(Tensor dx, Tensor dW, Tensor db, Tensor dy, Tensor x, Tensor W, int M,
                       int K, int N) override {
    cpu::linear_backward<T>(p(dx), p(dW), p(db), p(dy), p(x), p(W), M, K, N);
  }
  void output_projection_forward(Tensor logits, Tensor h, Tensor E, int M, int d,
                                 int vocab) override {
    cpu::output_projection_forward<T>(p(logits), p(h), p(E), M, d, vocab);
  }
  void output_projection_backward(Tensor dh, Tensor dE, Tensor d_logits, Tensor h, Tensor E,
                                  int M, int d, int vocab) override {
    cpu::output_projection_backward<T>(p(dh), p(dE), p(d_logits), p(h), p(E), M, d, vocab);
  }
  void layernorm_forward(Tensor y, Tensor mean, Tensor rstd, Tensor x, Tensor gamma,
                         Tensor beta, int rows, int d, float eps) override {
    cpu::layernorm_forward<T>(p(y), p(mean), p(rstd), p(x), p(gamma), p(beta), rows, d,
                              static_cast<T>(eps));
  }
  void layernorm_backward(Tensor dx, Tensor dgamma, Tensor dbeta, Tensor dy, Tensor x,
                          Tensor mean, Tensor rstd, Tensor gamma, int rows, int d) override {
    cpu::layernorm_backward<T>(p(dx), p(dgamma), p(dbeta), p(dy), p(x), p(mean), p(rstd),
                               p(gamma), rows, d);
  }
  int64_t attention_saved_numel(const AttentionShape& shape) const override {
    return cpu::attention_saved_numel(shape);
  }
  void attention_forward(Tensor out, Tensor saved, Tensor q, int ldq, Tensor k, int ldk,
                         Tensor v, int ldv, const AttentionShape& shape) override {
    cpu::attention_forward<T>(p(out), p(saved), p(q), ldq, p(k), ldk, p(v), ldv, shape);
  }
  void attention_backward(Tensor dq, Tensor dk, Tensor dv, Tensor d_out, Tensor saved,
                          Tensor q, int ldq, Tensor k, int ldk, Tensor v, int ldv,
                          const AttentionShape& shape) override {
    cpu::attention_backward<T>(p(dq), p(dk), p(dv), p(d_out), p(saved), p(q), ldq, p(k), ldk,
                               p(v), ldv, shape);
  }
  void relu_forward(Tensor y, Tensor x, int64_t n) override {
    cpu::relu_forward<T>(p(y), p(x), n);
  }
  void relu_backward(Tensor dx, Tensor dy, Tensor y, int64_t n) override {
    cpu::relu_backward<T>(p(dx), p(dy), p(y), n);
  }
  void dropout_forward(Tensor y, Tensor x, int64_t n, float prob, DropoutKey key) override {
    cpu::dropout_forward<T>(p(y), p(x), n, prob, key);
  }
  void dropout_backward(Tensor dx, Tensor dy, int64_t n, float prob, DropoutKey key) override {
    cpu::dropout_backward<T>(p(dx), p(dy), n, prob, key);
  }
  void residual_dropout_forward(Tensor y, Tensor x, Tensor sub, int64_t n, float prob,
                                DropoutKey key) override {
    cpu::residual_dropout_forward<T>(p(y), p(x), p(sub), n, prob, key);
  }
  void residual_dropout_backward(Tensor dx, Tensor d_sub, Tensor dy, int64_t n, float prob,
                                 DropoutKey key) override {
    cpu::residual_dropout_backward<T>(p(dx), p(d_sub), p(dy), n, prob, key);
  }
  void copy_rows(Tensor dst, const int32_t* dst_rows, Tensor src, const int32_t* src_rows,
                 int count, int width) override {
    cpu::copy_rows<T>(p(dst), dst_rows, p(src), src_rows, count, width);
  }
  LossSums softmax_cross_entropy(Tensor d_logits, Tensor logits, const int32_t* targets,
                                 int rows, int vocab, float eps, int pad_id,
                                 float grad_scale) override {
    return cpu::softmax_cross_entropy<T>(p(d_logits), p(logits), targets, rows, vocab, eps,
                                         pad_id, grad_scale);
  }
  void log_softmax(Tensor log_probs, Tensor logits, int rows, int vocab) override {
    cpu::log_softmax<T>(p(log_probs), p(logits), rows, vocab);
  }
  void row_top_k(Tensor values, int32_t* columns, Tensor x, int rows, int width, int k,
                 int skip_a, int skip_b) override {
    cpu::check_row_top_k(values, x, rows, width, k, skip_a, skip_b);
    cpu::row_top_k<T>(p(values), columns, p(x), rows, width, k, skip_a, skip_b);
  }
  void adam_update(Tensor params, Tensor grads, Tensor m, Tensor v, int64_t n, float lr,
                   float beta1, float beta2, float eps, int64_t step) override {
    cpu::adam_update<T>(p(params), p(grads), p(m), p(v), n, lr, beta1, beta2, eps, step);
  }
  double sum_squares(Tensor x, int64_t n) override {
    const T* values = p(x);
    double sum = 0.0;
    for (int64_t i = 0; i < n; ++i) sum += static_cast<double>(values[i]) * values[i];
    return sum;
  }
  void scale(Tensor x, int64_t n, float alpha) override {
    T* values = p(x);
    for (int64_t i = 0; i < n; ++i) values[i] *= static_cast<T>(alpha);
  }

 private:
  // The element pointer of a tensor of this backend (null stays null).
  static T* p(Tensor t) {
    if (!t) return nullptr;
    THPC_CHECK(t.dtype == dtype_of<T>(), "a " << dtype_name(t.dtype) << " tensor was passed to "
                                               << "the cpu-" << dtype_name(dtype_of<T>())
                                               << " backend");
    return static_cast<T*>(t.data);
  }
};

}  // namespace

namespace {
std::atomic<int> cpu_thread_count{0};  // 0: not set, OpenMP's default
}  // namespace

void set_cpu_threads(int threads) {
  THPC_CHECK(threads >= 1, "CPU threads must be at least 1, not " << threads);
  cpu_thread_count.store(threads);
  // The OpenMP build of OpenBLAS (CMakeLists.txt) runs its GEMMs on this many threads of
  // the same OpenMP pool the ops' loops use.
  openblas_set_num_threads(threads);
}

namespace cpu {
int cpu_threads() {
  const int threads = cpu_thread_count.load();
  return threads > 0 ? threads : omp_get_max_threads();
}
}  // namespace cpu

std::unique_ptr<Backend> make_cpu_backend(DType dtype) {
  switch (dtype) {
    case DType::F32: return std::make_unique<CpuBackend<float>>();
    case DType::F64: return std::make_unique<CpuBackend<double>>();
    default: THPC_FAIL("the CPU backend computes in fp32 or fp64, not " << dtype_name(dtype));
  }
}

}  // namespace thpc
