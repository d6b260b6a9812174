// Dense layers and the tied output projection on the CPU: every matrix product is one
// BLAS GEMM (sgemm for float, dgemm for double); and the FFN's bias + ReLU (§3.3) fused
// with its layer, forward and backward.
#include <algorithm>
#include <cstdint>

#include "kernels/cpu/blas.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/parallel.h"

namespace thpc::cpu {
namespace {

// Below this many multiply-adds a product is not worth a team of two.
constexpr int64_t kSideBySideMinWork = int64_t(1) << 20;

// The two products of a backward (dx and dW, or dh and dE) cost the same 2·M·K·N FLOPs
// and write different outputs. On two threads they run side by side, one single-threaded
// GEMM per core (inside an OpenMP team the OpenMP build of OpenBLAS runs a GEMM on the
// calling thread alone), instead of one after the other, each split over both cores:
// no synchronisation inside a GEMM and each core packs its own panels. The bits are
// those of the same GEMMs run one after the other. With more threads the products run
// one after the other on all of them.
template <typename First, typename Second>
void run_side_by_side(int64_t multiply_adds_each, First&& first, Second&& second) {
  if (cpu_threads() == 2 && multiply_adds_each >= kSideBySideMinWork) {
#pragma omp parallel sections num_threads(2)
    {
#pragma omp section
      first();
#pragma omp section
      second();
    }
  } else {
    first();
    second();
  }
}

}  // namespace

// y = x W + b (x [M, K], W [K, N], b [N] or null): the bias is broadcast into y first
// and the GEMM adds x W on top (beta = 1), so y is written once per element.
template <typename T>
void linear_forward(T* y, const T* x, const T* W, const T* b, int M, int K, int N) {
  if (M == 0 || N == 0) return;
#pragma omp parallel for schedule(static) num_threads(threads_for(int64_t(M) * N))
  for (int row = 0; row < M; ++row) {
    T* y_row = y + static_cast<int64_t>(row) * N;
    for (int col = 0; col < N; ++col) y_row[col] = (b != nullptr) ? b[col] : T(0);
  }
  if (K == 0) return;  // an empty product adds nothing (and BLAS rejects lda = 0)
  gemm(CblasNoTrans, CblasNoTrans, M, N, K, T(1), x, K, W, N, T(1), y, N);
}

// y = max(0, x W + b), the FFN's first layer (§3.3). BLAS takes no epilogue, so the
// product is linear_forward's (bias in C, beta = 1: the bits of the unfused layer, which
// adding the bias after the product would not give once OpenBLAS splits K) and the ReLU
// relu_forward's pass over y in place right after it (NaN and -0 give +0); the fused op's
// gain on the CPU is in its backward, relu_bias_backward. (On the GPU the ReLU is the
// GEMM's epilogue.)
template <typename T>
void linear_relu_forward(T* y, const T* x, const T* W, const T* b, int M, int K, int N) {
  linear_forward(y, x, W, b, M, K, N);
  relu_forward(y, y, int64_t(M) * N);
}

// dx += dy W^T [M, K] (kWrite: beta = 0);  dW += x^T dy [K, N];  db += column sums of
// dy [N].
template <typename T>
void linear_backward(T* dx, T* dW, T* db, const T* dy, const T* x, const T* W, int M, int K,
                     int N, GradStore store) {
  // With an empty dimension the products are empty or zero: nothing to add (and BLAS
  // rejects a leading dimension of 0), a zero gradient to write.
  const bool has_product = M > 0 && N > 0 && K > 0;
  if (!has_product && dx != nullptr && store == GradStore::kWrite) {
    std::fill(dx, dx + int64_t(M) * K, T(0));
  }
  run_side_by_side(
      dx != nullptr && dW != nullptr ? int64_t(M) * K * N : 0,
      [&] {
        if (has_product && dx != nullptr) {
          gemm(CblasNoTrans, CblasTrans, M, K, N, T(1), dy, N, W, N, gradient_beta<T>(store), dx,
               K);
        }
      },
      [&] {
        if (has_product && dW != nullptr) {
          gemm(CblasTrans, CblasNoTrans, K, N, M, T(1), x, K, dy, N, T(1), dW, N);
        }
      });
  if (db != nullptr) {
    // Column sums: each thread owns a range of columns and adds the rows in order.
    parallel_ranges(N, threads_for(int64_t(M) * N), [&](int col_begin, int col_end) {
      for (int row = 0; row < M; ++row) {
        const T* dy_row = dy + static_cast<int64_t>(row) * N;
        for (int col = col_begin; col < col_end; ++col) db[col] += dy_row[col];
      }
    });
  }
}

// The ReLU's backward and the bias gradient of the layer before it, in one pass over
// [rows, n] instead of two (relu_backward's, then linear_backward's column sums): with
// g = dy where y > 0, else 0, d_pre += g (kWrite: d_pre = 0 + g, kAdd's value in a zeroed
// buffer) and db += column sums of g. Each thread owns a range of columns and walks the
// rows in order, so each column's sum runs in row order as linear_backward's does: the
// bits of the two unfused ops.
template <typename T>
void relu_bias_backward(T* d_pre, T* db, const T* dy, const T* y, int rows, int n,
                        GradStore store) {
  if (d_pre == nullptr && db == nullptr) return;
  const bool write = store == GradStore::kWrite;
  parallel_ranges(n, threads_for(int64_t(rows) * n), [&](int col_begin, int col_end) {
    for (int row = 0; row < rows; ++row) {
      const int64_t offset = static_cast<int64_t>(row) * n;
      const T* dy_row = dy + offset;
      const T* y_row = y + offset;
      // kWrite zeroes the row's slice of d_pre just before adding into it, while it is in
      // the cache: a loop storing 0 + g without reading d_pre (vectorised, a select per
      // element) ran at a third of the adding loop's speed on the AMD EPYC of 2026-11-26
      // (3.2 vs 1.1 ms for [2000, 1024], one thread: 4% of a step), zero-then-add at 1.9.
      if (d_pre != nullptr && write) {
        std::fill(d_pre + offset + col_begin, d_pre + offset + col_end, T(0));
      }
      if (d_pre != nullptr && db != nullptr) {
        T* d_pre_row = d_pre + offset;
        // Written without a branch (a select the compiler vectorises): y's sign is a coin
        // toss per element, which a branch would mispredict half the time. dy is loaded
        // unconditionally: `y > 0 ? dy[col] : 0` is a conditional load, which GCC will not
        // turn into a select, and the scalar loop ran 3x slower (2026-11-26, SSE2).
        for (int col = col_begin; col < col_end; ++col) {
          const T dy_value = dy_row[col];
          const T g = y_row[col] > T(0) ? dy_value : T(0);
          d_pre_row[col] += g;
          db[col] += g;
        }
      } else if (d_pre != nullptr) {
        T* d_pre_row = d_pre + offset;
        for (int col = col_begin; col < col_end; ++col) {
          const T dy_value = dy_row[col];
          d_pre_row[col] += y_row[col] > T(0) ? dy_value : T(0);
        }
      } else {
        for (int col = col_begin; col < col_end; ++col) {
          const T dy_value = dy_row[col];
          db[col] += y_row[col] > T(0) ? dy_value : T(0);
        }
      }
    }
  });
}

// linear_relu_forward, keeping no mask: the CPU's relu_mask_words is 0, so its
// linear_relu_backward reads y (a GPU's mask is cuBLASLt's layout, written by its GEMM).
template <typename T>
void linear_relu_mask_forward(T* y, uint32_t* /*mask*/, const T* x, const T* W, const T* b,
                              int M, int K, int N) {
  linear_relu_forward(y, x, W, b, M, K, N);
}

// The FFN's second layer's backward with the ReLU's, as the unfused ops compose it:
// d_pre = dy W^T written (linear_backward, kWrite), then the ReLU's backward in place
// (relu_backward's select: 0 where y <= 0, so NaN and -0 give 0), dW and db as
// linear_backward's. The mask is not read (y decides).
template <typename T>
void linear_relu_backward(T* d_pre, T* dW, T* db, const T* dy, const T* y,
                          const uint32_t* /*mask*/, const T* W, int M, int K, int N) {
  linear_backward(d_pre, dW, db, dy, y, W, M, K, N, GradStore::kWrite);
  if (d_pre == nullptr) return;
  relu_backward(d_pre, d_pre, y, int64_t(M) * K, GradStore::kWrite);
}

// logits = h E^T (h [M, d], E [vocab, d]): the pre-softmax linear transformation shares
// its weights with the embeddings (§3.4), so E is read transposed in place.
template <typename T>
void output_projection_forward(T* logits, const T* h, const T* E, int M, int d, int vocab) {
  if (M == 0 || vocab == 0) return;
  if (d == 0) {
    for (int64_t i = 0; i < static_cast<int64_t>(M) * vocab; ++i) logits[i] = T(0);
    return;
  }
  gemm(CblasNoTrans, CblasTrans, M, vocab, d, T(1), h, d, E, d, T(0), logits, vocab);
}

// dh += d_logits E [M, d] (kWrite: beta = 0);  dE += d_logits^T h [vocab, d].
template <typename T>
void output_projection_backward(T* dh, T* dE, const T* d_logits, const T* h, const T* E,
                                int M, int d, int vocab, GradStore store) {
  if (M == 0 || d == 0 || vocab == 0) {
    if (dh != nullptr && store == GradStore::kWrite) std::fill(dh, dh + int64_t(M) * d, T(0));
    return;
  }
  run_side_by_side(
      dh != nullptr && dE != nullptr ? int64_t(M) * d * vocab : 0,
      [&] {
        if (dh != nullptr) {
          gemm(CblasNoTrans, CblasNoTrans, M, d, vocab, T(1), d_logits, vocab, E, d,
               gradient_beta<T>(store), dh, d);
        }
      },
      [&] {
        if (dE != nullptr) {
          gemm(CblasTrans, CblasNoTrans, vocab, d, M, T(1), d_logits, vocab, h, d, T(1), dE,
               d);
        }
      });
}

THPC_CPU_TWIN(linear_forward)
THPC_CPU_TWIN(linear_backward)
THPC_CPU_TWIN(linear_relu_forward)
THPC_CPU_TWIN(relu_bias_backward)
THPC_CPU_TWIN(linear_relu_mask_forward)
THPC_CPU_TWIN(linear_relu_backward)
THPC_CPU_TWIN(output_projection_forward)
THPC_CPU_TWIN(output_projection_backward)

}  // namespace thpc::cpu
