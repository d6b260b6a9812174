// CUDA twins of the dense-layer, output-projection and layer-norm ops (kernels/cuda/
// linear.cu, layernorm.cu) against the CPU reference backend, in fp32 and bf16.
//
// Inputs are random and non-zero; the CPU gets the inputs as the GPU tensors hold them
// (`representable`), so only the GPU op's own arithmetic and output rounding differ.
// Gradient outputs are pre-filled with random values, checking the += rule.
//
// Tolerances, per element, relative to the magnitude the result is made of:
// * GEMMs: |gpu - cpu| <= (u_out + L * 2^-23) * (|prefill| + sum_l |a_il| |b_lj|), L the
//   reduction length. L * 2^-23 bounds the difference of two fp32 summation orders
//   (cuBLAS vs OpenBLAS: each is within ~L*eps of the exact sum in the worst case, the
//   typical error ~ sqrt(L)*eps is far smaller); u_out is the rounding of the stored
//   result: 0 for fp32 outputs, 2^-8 (half a bf16 ulp, relative) for bf16 outputs.
//   Products of bf16 inputs are exact in fp32, so bf16 inputs add nothing else.
// * Layer norm: the row statistics are fp32 sums over d (32 lanes of d/32 sequential
//   terms, then a 5-level tree) vs double on the CPU: bounded by (d/32 + 8) * 2^-23
//   relative to the sum of magnitudes; y, dx get that times a small constant for the
//   normalised values (|xhat| < 4 here, rstd < 2) plus u_out relative; dgamma, dbeta are
//   sums over rows in fp32 (chunks of 64 rows in order): (rows + 8) * 2^-23 relative to
//   the sum of magnitudes.
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <random>
#include <vector>

#include "cuda_twin.h"

namespace thpc::test {
namespace {

constexpr double kEps32 = 1.0 / (1 << 23);

// Half a ulp of the output type, relative: the rounding of a stored result.
double output_rounding(DType dtype) { return dtype == DType::BF16 ? eps_of(dtype) / 2 : 0.0; }

// Every |actual - expected| <= factor * scale[i] (+ a floor of 1e-30 for scale 0).
::testing::AssertionResult within_scaled(const std::vector<float>& actual,
                                         const std::vector<float>& expected,
                                         const std::vector<double>& scale, double factor) {
  if (actual.size() != expected.size() || actual.size() != scale.size()) {
    return ::testing::AssertionFailure() << "sizes differ: " << actual.size() << ", "
                                         << expected.size() << ", " << scale.size();
  }
  size_t failures = 0, worst = 0;
  double worst_ratio = 0.0;
  for (size_t i = 0; i < actual.size(); ++i) {
    const double diff = std::abs(static_cast<double>(actual[i]) - expected[i]);
    const double allowed = factor * scale[i] + 1e-30;
    if (!(diff <= allowed)) {
      ++failures;
      const double ratio = std::isnan(diff) ? INFINITY : diff / allowed;
      if (failures == 1 || ratio > worst_ratio) {
        worst_ratio = ratio;
        worst = i;
      }
    }
  }
  if (failures == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << failures << " of " << actual.size() << " elements outside " << factor
         << " * scale; worst at " << worst << ": got " << actual[worst] << ", expected "
         << expected[worst] << ", scale " << scale[worst] << " (" << worst_ratio
         << " times the tolerance)";
}

// scale[i*N + j] = |prefill[i*N + j]| + sum_l |a(i, l)| |b(l, j)| with a(i, l) =
// a[i*a_row + l*a_col] and b(l, j) = b[l*b_row + j*b_col]: the magnitude of C += A B.
std::vector<double> product_scale(int rows, int cols, int inner, const std::vector<float>& a,
                                  int64_t a_row, int64_t a_col, const std::vector<float>& b,
                                  int64_t b_row, int64_t b_col,
                                  const std::vector<float>* prefill) {
  std::vector<double> scale(static_cast<size_t>(rows) * cols, 0.0);
  for (int i = 0; i < rows; ++i) {
    for (int j = 0; j < cols; ++j) {
      double sum = prefill != nullptr ? std::abs((*prefill)[static_cast<size_t>(i) * cols + j])
                                      : 0.0;
      for (int l = 0; l < inner; ++l) {
        sum += std::abs(static_cast<double>(a[i * a_row + l * a_col])) *
               std::abs(static_cast<double>(b[l * b_row + j * b_col]));
      }
      scale[static_cast<size_t>(i) * cols + j] = sum;
    }
  }
  return scale;
}

// Tolerance factor of a GEMM with reduction length `inner` and output dtype `out`.
double gemm_factor(int inner, DType out) {
  return output_rounding(out) + (inner + 1) * kEps32;
}

// Sets THPC_GEMM_FALLBACK=1 (cublasGemmEx instead of cuBLASLt) for its lifetime.
class ForceGemmFallback {
 public:
  ForceGemmFallback() { setenv("THPC_GEMM_FALLBACK", "1", 1); }
  ~ForceGemmFallback() { unsetenv("THPC_GEMM_FALLBACK"); }
  ForceGemmFallback(const ForceGemmFallback&) = delete;
  ForceGemmFallback& operator=(const ForceGemmFallback&) = delete;
};

struct LinearShape {
  int M, K, N;
};

// Odd sizes, M = 1, N not a multiple of 8, a K = 0 (empty product: y = b), a larger one.
const std::vector<LinearShape> kLinearShapes = {
    {1, 37, 61}, {5, 129, 7}, {17, 64, 100}, {3, 0, 5}, {33, 512, 129}, {128, 256, 512}};

// bias_offset > 0 places the bias that many elements into its buffer: a slice of the
// flat parameter buffer that is not 16-byte aligned.
void check_linear_forward(DType dtype, const LinearShape& s, bool bias, uint32_t seed,
                          int bias_offset = 0) {
  SCOPED_TRACE(::testing::Message() << dtype_name(dtype) << " M=" << s.M << " K=" << s.K
                                    << " N=" << s.N << (bias ? " bias" : " no bias")
                                    << " bias offset " << bias_offset);
  std::mt19937 rng(seed);
  const auto x = representable(random_values(static_cast<size_t>(s.M) * s.K, rng), dtype);
  const auto W = representable(random_values(static_cast<size_t>(s.K) * s.N, rng), dtype);
  const auto padded_b =
      representable(random_values(static_cast<size_t>(s.N + bias_offset), rng), dtype);
  const std::vector<float> b(padded_b.begin() + bias_offset, padded_b.end());
  Twins twins(dtype);
  Scope cpu(*twins.cpu), gpu(*twins.gpu);
  Tensor y_cpu = cpu.alloc(DType::F32, static_cast<int64_t>(s.M) * s.N);
  Tensor y_gpu = gpu.alloc(dtype, static_cast<int64_t>(s.M) * s.N);
  twins.cpu->linear_forward(
      y_cpu, cpu.put(DType::F32, x), cpu.put(DType::F32, W),
      bias ? cpu.put(DType::F32, padded_b).slice(bias_offset, s.N) : Tensor{}, s.M, s.K, s.N);
  twins.gpu->linear_forward(
      y_gpu, gpu.put(dtype, x), gpu.put(dtype, W),
      bias ? gpu.put(dtype, padded_b).slice(bias_offset, s.N) : Tensor{}, s.M, s.K, s.N);
  auto scale = product_scale(s.M, s.N, s.K, x, s.K, 1, W, s.N, 1, nullptr);
  if (bias) {
    for (int i = 0; i < s.M; ++i) {
      for (int j = 0; j < s.N; ++j) scale[static_cast<size_t>(i) * s.N + j] += std::abs(b[j]);
    }
  }
  EXPECT_TRUE(within_scaled(gpu.get(y_gpu), cpu.get(y_cpu), scale, gemm_factor(s.K, dtype)));
}

TEST(CudaLinear, ForwardMatchesCpu) {
  THPC_REQUIRE_GPU();
  uint32_t seed = 1;
  for (DType dtype : gpu_compute_dtypes()) {
    for (const LinearShape& shape : kLinearShapes) {
      for (bool bias : {true, false}) check_linear_forward(dtype, shape, bias, seed++);
    }
  }
}

TEST(CudaLinear, ForwardThroughGemmExFallbackMatchesCpu) {
  THPC_REQUIRE_GPU();
  ForceGemmFallback fallback;
  uint32_t seed = 100;
  for (DType dtype : gpu_compute_dtypes()) {
    for (const LinearShape& shape : kLinearShapes) {
      for (bool bias : {true, false}) check_linear_forward(dtype, shape, bias, seed++);
    }
  }
}

// A bias 1 or 3 elements into its buffer (2 to 12 bytes off 16-byte alignment) takes the
// cublasGemmEx path and must give the same result as an aligned one.
TEST(CudaLinear, ForwardWithAMisalignedBiasMatchesCpu) {
  THPC_REQUIRE_GPU();
  uint32_t seed = 200;
  for (DType dtype : gpu_compute_dtypes()) {
    for (const LinearShape& shape : kLinearShapes) {
      for (int offset : {1, 3}) check_linear_forward(dtype, shape, true, seed++, offset);
    }
  }
}

// Which gradients a backward call asks for.
struct Wanted {
  bool dx, dW, db;
};

void check_linear_backward(DType dtype, const LinearShape& s, Wanted wanted, uint32_t seed) {
  SCOPED_TRACE(::testing::Message() << dtype_name(dtype) << " M=" << s.M << " K=" << s.K
                                    << " N=" << s.N << " dx=" << wanted.dx << " dW="
                                    << wanted.dW << " db=" << wanted.db);
  std::mt19937 rng(seed);
  const size_t MK = static_cast<size_t>(s.M) * s.K, KN = static_cast<size_t>(s.K) * s.N,
               MN = static_cast<size_t>(s.M) * s.N;
  const auto x = representable(random_values(MK, rng), dtype);
  const auto W = representable(random_values(KN, rng), dtype);
  const auto dy = representable(random_values(MN, rng), dtype);
  const auto dx0 = representable(random_values(MK, rng), dtype);  // activation-side: T
  const auto dW0 = random_values(KN, rng);                         // parameter-side: fp32
  const auto db0 = random_values(static_cast<size_t>(s.N), rng);
  Twins twins(dtype);
  Scope cpu(*twins.cpu), gpu(*twins.gpu);
  Tensor dx_cpu = wanted.dx ? cpu.put(DType::F32, dx0) : Tensor{};
  Tensor dW_cpu = wanted.dW ? cpu.put(DType::F32, dW0) : Tensor{};
  Tensor db_cpu = wanted.db ? cpu.put(DType::F32, db0) : Tensor{};
  Tensor dx_gpu = wanted.dx ? gpu.put(dtype, dx0) : Tensor{};
  Tensor dW_gpu = wanted.dW ? gpu.put(DType::F32, dW0) : Tensor{};
  Tensor db_gpu = wanted.db ? gpu.put(DType::F32, db0) : Tensor{};
  twins.cpu->linear_backward(dx_cpu, dW_cpu, db_cpu, cpu.put(DType::F32, dy),
                             cpu.put(DType::F32, x), cpu.put(DType::F32, W), s.M, s.K, s.N);
  twins.gpu->linear_backward(dx_gpu, dW_gpu, db_gpu, gpu.put(dtype, dy), gpu.put(dtype, x),
                             gpu.put(dtype, W), s.M, s.K, s.N);
  if (wanted.dx) {  // dx [M, K] += dy [M, N] W^T: W^T(l, j) = W[j*N + l]
    const auto scale = product_scale(s.M, s.K, s.N, dy, s.N, 1, W, 1, s.N, &dx0);
    EXPECT_TRUE(within_scaled(gpu.get(dx_gpu), cpu.get(dx_cpu), scale, gemm_factor(s.N, dtype)))
        << "dx";
  }
  if (wanted.dW) {  // dW [K, N] += x^T [K, M] dy [M, N]: x^T(i, l) = x[l*K + i]
    const auto scale = product_scale(s.K, s.N, s.M, x, 1, s.K, dy, s.N, 1, &dW0);
    EXPECT_TRUE(within_scaled(gpu.get(dW_gpu), cpu.get(dW_cpu), scale,
                              gemm_factor(s.M, DType::F32)))
        << "dW";
  }
  if (wanted.db) {  // db [1, N] += ones [1, M] dy [M, N]
    const std::vector<float> ones(static_cast<size_t>(s.M), 1.0f);
    const auto scale = product_scale(1, s.N, s.M, ones, 0, 1, dy, s.N, 1, &db0);
    EXPECT_TRUE(within_scaled(gpu.get(db_gpu), cpu.get(db_cpu), scale,
                              gemm_factor(s.M, DType::F32)))
        << "db";
  }
}

TEST(CudaLinear, BackwardMatchesCpu) {
  THPC_REQUIRE_GPU();
  uint32_t seed = 200;
  for (DType dtype : gpu_compute_dtypes()) {
    for (const LinearShape& shape : kLinearShapes) {
      check_linear_backward(dtype, shape, {true, true, true}, seed++);
    }
  }
}

TEST(CudaLinear, BackwardWithNullOutputsMatchesCpu) {
  THPC_REQUIRE_GPU();
  uint32_t seed = 300;
  for (DType dtype : gpu_compute_dtypes()) {
    for (const Wanted wanted : {Wanted{true, false, false}, Wanted{false, true, false},
                                Wanted{false, false, true}, Wanted{false, false, false}}) {
      check_linear_backward(dtype, {17, 37, 61}, wanted, seed++);
    }
  }
}

TEST(CudaLinear, BackwardThroughGemmExFallbackMatchesCpu) {
  THPC_REQUIRE_GPU();
  ForceGemmFallback fallback;
  uint32_t seed = 400;
  for (DType dtype : gpu_compute_dtypes()) {
    for (const LinearShape& shape : kLinearShapes) {
      check_linear_backward(dtype, shape, {true, true, true}, seed++);
    }
  }
}

// Two identical backward calls from the same pre-filled gradients: bit-identical.
TEST(CudaLinear, BackwardIsDeterministic) {
  THPC_REQUIRE_GPU();
  for (DType dtype : gpu_compute_dtypes()) {
    SCOPED_TRACE(dtype_name(dtype));
    const int M = 1000, K = 129, N = 257;
    std::mt19937 rng(500);
    const auto x = random_values(static_cast<size_t>(M) * K, rng);
    const auto W = random_values(static_cast<size_t>(K) * N, rng);
    const auto dy = random_values(static_cast<size_t>(M) * N, rng);
    const auto dx0 = random_values(static_cast<size_t>(M) * K, rng);
    const auto dW0 = random_values(static_cast<size_t>(K) * N, rng);
    const auto db0 = random_values(static_cast<size_t>(N), rng);
    Twins twins(dtype);
    Scope gpu(*twins.gpu);
    const Tensor x_t = gpu.put(dtype, x), W_t = gpu.put(dtype, W), dy_t = gpu.put(dtype, dy);
    std::vector<float> first[3];
    for (int run = 0; run < 2; ++run) {
      Tensor dx = gpu.put(dtype, dx0), dW = gpu.put(DType::F32, dW0),
             db = gpu.put(DType::F32, db0);
      twins.gpu->linear_backward(dx, dW, db, dy_t, x_t, W_t, M, K, N);
      const std::vector<float> got[3] = {gpu.get(dx), gpu.get(dW), gpu.get(db)};
      for (int i = 0; i < 3; ++i) {
        if (run == 0) first[i] = got[i];
        else EXPECT_TRUE(got[i] == first[i]) << "output " << i << " differs between runs";
      }
    }
  }
}

// ---- tied output projection -----------------------------------------------------------

struct ProjectionShape {
  int M, d, vocab;
};

const std::vector<ProjectionShape> kProjectionShapes = {
    {1, 37, 61}, {9, 64, 1001}, {33, 129, 517}, {64, 512, 4099}};

TEST(CudaOutputProjection, ForwardMatchesCpu) {
  THPC_REQUIRE_GPU();
  uint32_t seed = 600;
  for (DType dtype : gpu_compute_dtypes()) {
    for (const ProjectionShape& s : kProjectionShapes) {
      SCOPED_TRACE(::testing::Message() << dtype_name(dtype) << " M=" << s.M << " d=" << s.d
                                        << " vocab=" << s.vocab);
      std::mt19937 rng(seed++);
      const auto h = representable(random_values(static_cast<size_t>(s.M) * s.d, rng), dtype);
      const auto E =
          representable(random_values(static_cast<size_t>(s.vocab) * s.d, rng), dtype);
      Twins twins(dtype);
      Scope cpu(*twins.cpu), gpu(*twins.gpu);
      const int64_t count = static_cast<int64_t>(s.M) * s.vocab;
      Tensor logits_cpu = cpu.alloc(DType::F32, count), logits_gpu = gpu.alloc(dtype, count);
      twins.cpu->output_projection_forward(logits_cpu, cpu.put(DType::F32, h),
                                           cpu.put(DType::F32, E), s.M, s.d, s.vocab);
      twins.gpu->output_projection_forward(logits_gpu, gpu.put(dtype, h), gpu.put(dtype, E),
                                           s.M, s.d, s.vocab);
      // logits [M, V] = h [M, d] E^T: E^T(l, j) = E[j*d + l]
      const auto scale = product_scale(s.M, s.vocab, s.d, h, s.d, 1, E, 1, s.d, nullptr);
      EXPECT_TRUE(within_scaled(gpu.get(logits_gpu), cpu.get(logits_cpu), scale,
                                gemm_factor(s.d, dtype)));
    }
  }
}

TEST(CudaOutputProjection, BackwardMatchesCpu) {
  THPC_REQUIRE_GPU();
  uint32_t seed = 700;
  for (DType dtype : gpu_compute_dtypes()) {
    for (const ProjectionShape& s : kProjectionShapes) {
      for (int nulls = 0; nulls < 3; ++nulls) {  // 0: both, 1: dh only, 2: dE only
        const bool want_dh = nulls != 2, want_dE = nulls != 1;
        SCOPED_TRACE(::testing::Message() << dtype_name(dtype) << " M=" << s.M << " d=" << s.d
                                          << " vocab=" << s.vocab << " dh=" << want_dh
                                          << " dE=" << want_dE);
        std::mt19937 rng(seed++);
        const size_t Md = static_cast<size_t>(s.M) * s.d, Vd = static_cast<size_t>(s.vocab) * s.d,
                     MV = static_cast<size_t>(s.M) * s.vocab;
        const auto h = representable(random_values(Md, rng), dtype);
        const auto E = representable(random_values(Vd, rng), dtype);
        const auto dl = representable(random_values(MV, rng), dtype);
        const auto dh0 = representable(random_values(Md, rng), dtype);
        const auto dE0 = random_values(Vd, rng);
        Twins twins(dtype);
        Scope cpu(*twins.cpu), gpu(*twins.gpu);
        Tensor dh_cpu = want_dh ? cpu.put(DType::F32, dh0) : Tensor{};
        Tensor dE_cpu = want_dE ? cpu.put(DType::F32, dE0) : Tensor{};
        Tensor dh_gpu = want_dh ? gpu.put(dtype, dh0) : Tensor{};
        Tensor dE_gpu = want_dE ? gpu.put(DType::F32, dE0) : Tensor{};
        twins.cpu->output_projection_backward(dh_cpu, dE_cpu, cpu.put(DType::F32, dl),
                                              cpu.put(DType::F32, h), cpu.put(DType::F32, E),
                                              s.M, s.d, s.vocab);
        twins.gpu->output_projection_backward(dh_gpu, dE_gpu, gpu.put(dtype, dl),
                                              gpu.put(dtype, h), gpu.put(dtype, E), s.M, s.d,
                                              s.vocab);
        if (want_dh) {  // dh [M, d] += dl [M, V] E [V, d]
          const auto scale = product_scale(s.M, s.d, s.vocab, dl, s.vocab, 1, E, s.d, 1, &dh0);
          EXPECT_TRUE(within_scaled(gpu.get(dh_gpu), cpu.get(dh_cpu), scale,
                                    gemm_factor(s.vocab, dtype)))
              << "dh";
        }
        if (want_dE) {  // dE [V, d] += dl^T [V, M] h [M, d]: dl^T(i, l) = dl[l*V + i]
          const auto scale = product_scale(s.vocab, s.d, s.M, dl, 1, s.vocab, h, s.d, 1, &dE0);
          EXPECT_TRUE(within_scaled(gpu.get(dE_gpu), cpu.get(dE_cpu), scale,
                                    gemm_factor(s.M, DType::F32)))
              << "dE";
        }
      }
    }
  }
}

// ---- layer norm -------------------------------------------------------------------------

struct NormShape {
  int rows, d;
};

// M = 1, odd widths, several 64-row chunks with a partial last one, wide rows.
const std::vector<NormShape> kNormShapes = {{1, 37},    {7, 61},    {129, 512}, {1000, 129},
                                            {200, 1024}, {33, 4096}, {3, 1}};

// Error factor of an fp32 sum of `terms` values as the kernels order it.
double sum_factor(int terms) { return (terms / 32 + 8) * kEps32; }

TEST(CudaLayerNorm, ForwardMatchesCpu) {
  THPC_REQUIRE_GPU();
  uint32_t seed = 800;
  for (DType dtype : gpu_compute_dtypes()) {
    for (const NormShape& s : kNormShapes) {
      SCOPED_TRACE(::testing::Message() << dtype_name(dtype) << " rows=" << s.rows
                                        << " d=" << s.d);
      std::mt19937 rng(seed++);
      const size_t n = static_cast<size_t>(s.rows) * s.d;
      const auto x = representable(random_values(n, rng), dtype);
      const auto gamma = representable(random_values(static_cast<size_t>(s.d), rng), dtype);
      const auto beta = representable(random_values(static_cast<size_t>(s.d), rng), dtype);
      const float eps = 1e-6f;
      Twins twins(dtype);
      Scope cpu(*twins.cpu), gpu(*twins.gpu);
      Tensor y_cpu = cpu.alloc(DType::F32, static_cast<int64_t>(n));
      Tensor mean_cpu = cpu.alloc(DType::F32, s.rows), rstd_cpu = cpu.alloc(DType::F32, s.rows);
      Tensor y_gpu = gpu.alloc(dtype, static_cast<int64_t>(n));
      Tensor mean_gpu = gpu.alloc(DType::F32, s.rows), rstd_gpu = gpu.alloc(DType::F32, s.rows);
      twins.cpu->layernorm_forward(y_cpu, mean_cpu, rstd_cpu, cpu.put(DType::F32, x),
                                   cpu.put(DType::F32, gamma), cpu.put(DType::F32, beta),
                                   s.rows, s.d, eps);
      twins.gpu->layernorm_forward(y_gpu, mean_gpu, rstd_gpu, gpu.put(dtype, x),
                                   gpu.put(dtype, gamma), gpu.put(dtype, beta), s.rows, s.d,
                                   eps);
      // mean: |x| <= 1, so the sum's error is sum_factor * d and the mean's sum_factor.
      EXPECT_TRUE(all_close(gpu.get(mean_gpu), cpu.get(mean_cpu), sum_factor(s.d), 0.0))
          << "mean";
      // rstd: var's relative error a few sum_factors (the mean's error enters squared).
      const double rstd_rel = 4 * sum_factor(s.d);
      EXPECT_TRUE(all_close(gpu.get(rstd_gpu), cpu.get(rstd_cpu), 0.0, rstd_rel)) << "rstd";
      // y = xhat * gamma + beta, |xhat| < 4 (uniform rows; sqrt(3) at most for d > 1,
      // except d = 1 where xhat = 0), |gamma|, |beta| <= 1: absolute error from the
      // statistics plus the output rounding relative to y.
      EXPECT_TRUE(all_close(gpu.get(y_gpu), cpu.get(y_cpu), 16 * sum_factor(s.d),
                            output_rounding(dtype) + 4 * kEps32))
          << "y";
    }
  }
}

void check_layernorm_backward(DType dtype, const NormShape& s, bool want_dx, bool want_dgamma,
                              bool want_dbeta, uint32_t seed) {
  SCOPED_TRACE(::testing::Message() << dtype_name(dtype) << " rows=" << s.rows << " d=" << s.d
                                    << " dx=" << want_dx << " dgamma=" << want_dgamma
                                    << " dbeta=" << want_dbeta);
  std::mt19937 rng(seed);
  const size_t n = static_cast<size_t>(s.rows) * s.d;
  const auto x = representable(random_values(n, rng), dtype);
  const auto gamma = representable(random_values(static_cast<size_t>(s.d), rng), dtype);
  const auto beta = representable(random_values(static_cast<size_t>(s.d), rng), dtype);
  const auto dy = representable(random_values(n, rng), dtype);
  const auto dx0 = representable(random_values(n, rng), dtype);
  const auto dgamma0 = random_values(static_cast<size_t>(s.d), rng);
  const auto dbeta0 = random_values(static_cast<size_t>(s.d), rng);
  Twins twins(dtype);
  Scope cpu(*twins.cpu), gpu(*twins.gpu);
  // Statistics from the CPU forward, given to both backward passes (fp32 on both).
  Tensor y_cpu = cpu.alloc(DType::F32, static_cast<int64_t>(n));
  Tensor mean_cpu = cpu.alloc(DType::F32, s.rows), rstd_cpu = cpu.alloc(DType::F32, s.rows);
  const Tensor x_cpu = cpu.put(DType::F32, x), gamma_cpu = cpu.put(DType::F32, gamma);
  twins.cpu->layernorm_forward(y_cpu, mean_cpu, rstd_cpu, x_cpu, gamma_cpu,
                               cpu.put(DType::F32, beta), s.rows, s.d, 1e-6f);
  const std::vector<float> mean = cpu.get(mean_cpu), rstd = cpu.get(rstd_cpu);
  Tensor dx_cpu = want_dx ? cpu.put(DType::F32, dx0) : Tensor{};
  Tensor dgamma_cpu = want_dgamma ? cpu.put(DType::F32, dgamma0) : Tensor{};
  Tensor dbeta_cpu = want_dbeta ? cpu.put(DType::F32, dbeta0) : Tensor{};
  Tensor dx_gpu = want_dx ? gpu.put(dtype, dx0) : Tensor{};
  Tensor dgamma_gpu = want_dgamma ? gpu.put(DType::F32, dgamma0) : Tensor{};
  Tensor dbeta_gpu = want_dbeta ? gpu.put(DType::F32, dbeta0) : Tensor{};
  twins.cpu->layernorm_backward(dx_cpu, dgamma_cpu, dbeta_cpu, cpu.put(DType::F32, dy), x_cpu,
                                mean_cpu, rstd_cpu, gamma_cpu, s.rows, s.d);
  twins.gpu->layernorm_backward(dx_gpu, dgamma_gpu, dbeta_gpu, gpu.put(dtype, dy),
                                gpu.put(dtype, x), gpu.put(DType::F32, mean),
                                gpu.put(DType::F32, rstd), gpu.put(dtype, gamma), s.rows, s.d);
  if (want_dx) {
    // rstd * (g - mean(g) - xhat mean(g xhat)) with |g| <= 1, |xhat| < 4, rstd < 2: the two
    // row means carry sum_factor(d) * 4 each; plus the rounding of the stored dx.
    EXPECT_TRUE(all_close(gpu.get(dx_gpu), cpu.get(dx_cpu), 64 * sum_factor(s.d),
                          output_rounding(dtype) + 8 * kEps32))
        << "dx";
  }
  // Column sums over rows: relative to the sum of magnitudes (plus the prefill's).
  std::vector<double> gamma_scale(static_cast<size_t>(s.d)), beta_scale(static_cast<size_t>(s.d));
  for (int col = 0; col < s.d; ++col) {
    gamma_scale[col] = std::abs(dgamma0[col]);
    beta_scale[col] = std::abs(dbeta0[col]);
    for (int row = 0; row < s.rows; ++row) {
      const size_t i = static_cast<size_t>(row) * s.d + col;
      const double xhat = (static_cast<double>(x[i]) - mean[row]) * rstd[row];
      gamma_scale[col] += std::abs(dy[i] * xhat);
      beta_scale[col] += std::abs(dy[i]);
    }
  }
  // xhat itself differs by a few eps (fp32 vs double), hence + 8.
  const double column_factor = (s.rows + 8) * kEps32;
  if (want_dgamma) {
    EXPECT_TRUE(within_scaled(gpu.get(dgamma_gpu), cpu.get(dgamma_cpu), gamma_scale,
                              column_factor))
        << "dgamma";
  }
  if (want_dbeta) {
    EXPECT_TRUE(within_scaled(gpu.get(dbeta_gpu), cpu.get(dbeta_cpu), beta_scale,
                              column_factor))
        << "dbeta";
  }
}

TEST(CudaLayerNorm, BackwardMatchesCpu) {
  THPC_REQUIRE_GPU();
  uint32_t seed = 900;
  for (DType dtype : gpu_compute_dtypes()) {
    for (const NormShape& s : kNormShapes) {
      check_layernorm_backward(dtype, s, true, true, true, seed++);
    }
  }
}

TEST(CudaLayerNorm, BackwardWithNullOutputsMatchesCpu) {
  THPC_REQUIRE_GPU();
  uint32_t seed = 1000;
  for (DType dtype : gpu_compute_dtypes()) {
    check_layernorm_backward(dtype, {130, 61}, true, false, false, seed++);
    check_layernorm_backward(dtype, {130, 61}, false, true, false, seed++);
    check_layernorm_backward(dtype, {130, 61}, false, false, true, seed++);
    check_layernorm_backward(dtype, {130, 61}, false, false, false, seed++);
  }
}

// Two identical backward calls from the same pre-filled gradients: bit-identical.
TEST(CudaLayerNorm, BackwardIsDeterministic) {
  THPC_REQUIRE_GPU();
  for (DType dtype : gpu_compute_dtypes()) {
    SCOPED_TRACE(dtype_name(dtype));
    const int rows = 3000, d = 1024;
    const size_t n = static_cast<size_t>(rows) * d;
    std::mt19937 rng(1100);
    const auto x = random_values(n, rng), dy = random_values(n, rng), dx0 = random_values(n, rng);
    const auto gamma = random_values(d, rng), beta = random_values(d, rng);
    const auto dgamma0 = random_values(d, rng), dbeta0 = random_values(d, rng);
    Twins twins(dtype);
    Scope gpu(*twins.gpu);
    const Tensor x_t = gpu.put(dtype, x), dy_t = gpu.put(dtype, dy),
                 gamma_t = gpu.put(dtype, gamma);
    Tensor y = gpu.alloc(dtype, static_cast<int64_t>(n));
    Tensor mean = gpu.alloc(DType::F32, rows), rstd = gpu.alloc(DType::F32, rows);
    twins.gpu->layernorm_forward(y, mean, rstd, x_t, gamma_t, gpu.put(dtype, beta), rows, d,
                                 1e-6f);
    std::vector<float> first[3];
    for (int run = 0; run < 2; ++run) {
      Tensor dx = gpu.put(dtype, dx0), dgamma = gpu.put(DType::F32, dgamma0),
             dbeta = gpu.put(DType::F32, dbeta0);
      twins.gpu->layernorm_backward(dx, dgamma, dbeta, dy_t, x_t, mean, rstd, gamma_t, rows, d);
      const std::vector<float> got[3] = {gpu.get(dx), gpu.get(dgamma), gpu.get(dbeta)};
      for (int i = 0; i < 3; ++i) {
        if (run == 0) first[i] = got[i];
        else EXPECT_TRUE(got[i] == first[i]) << "output " << i << " differs between runs";
      }
    }
  }
}

}  // namespace
}  // namespace thpc::test
