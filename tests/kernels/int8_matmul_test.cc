// Int8 products for decoding (kernels/cpu/int8_matmul.h) and the backend that routes
// products to them (kernels/cpu/int8_backend.h).
//
// oneDNN's int8 product is held to an exact integer reference: given the same quantized
// operands, sum_k xq Wq is an exact int32 and the dequantization is one formula
// (dequantize()), so the results must be bit for bit the reference's. The quantization
// itself is held to its rounding bounds, and the product to the float product within the
// error the quantization allows, per element (x row m, W column n, K inputs):
//   |y_int8 - y| <= s_m/2 sum_k |W_kn| + s_n/2 sum_k |x_mk| + K s_m s_n / 4   (*)
// (each x within s_m/2 of its quantized value, each W within s_n/2), plus the float
// rounding of the reference and the dequantization: 2^-21 (16 fp32 eps) of the sum of
// the magnitudes the result is made of, a margin over the few roundings involved.
//
// The same tests run once more as Avx2.* with DNNL_MAX_CPU_ISA=AVX2 (tests/tests.cmake):
// oneDNN then multiplies with AVX2's saturating vpmaddubsw, and the weights' 7-bit limit
// is what keeps the exact-reference test exact there.
//
// Inputs are random, uniform in [-1, 1] (never zero), apart from the tests of zero rows.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "common/error.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/int8_backend.h"
#include "kernels/cpu/int8_matmul.h"

namespace thpc::cpu_test {
namespace {

using cpu::QuantizedMatrix;
using cpu::WeightLayout;

#define SKIP_WITHOUT_INT8()                                                               \
  if (!cpu::int8_available()) GTEST_SKIP() << "no int8 products: " << cpu::int8_description()

std::vector<float> random_floats(size_t count, std::mt19937& rng) {
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  std::vector<float> values(count);
  for (float& value : values) value = uniform(rng);
  return values;
}

// W [K, N] stored as the layout says.
std::vector<float> stored(const std::vector<float>& W, int K, int N, WeightLayout layout) {
  if (layout == WeightLayout::kInputsByOutputs) return W;
  std::vector<float> transposed(W.size());
  for (int k = 0; k < K; ++k) {
    for (int n = 0; n < N; ++n) transposed[static_cast<size_t>(n) * K + k] = W[k * N + n];
  }
  return transposed;
}

// The product from the quantized operands, in exact integers, dequantized as the kernel
// does: what oneDNN's result must equal bit for bit.
std::vector<float> exact_integer_reference(const QuantizedMatrix& matrix,
                                           const std::vector<float>& x, const float* b,
                                           int M, bool relu) {
  const int K = matrix.inputs(), N = matrix.outputs();
  std::vector<float> y(static_cast<size_t>(M) * N);
  std::vector<uint8_t> xq(K);
  const std::vector<int8_t> Wq = matrix.quantized_values();
  for (int m = 0; m < M; ++m) {
    const float row_scale = cpu::quantize_row(x.data() + static_cast<size_t>(m) * K, K, xq.data());
    for (int n = 0; n < N; ++n) {
      int64_t acc = 0;
      for (int k = 0; k < K; ++k) acc += int64_t(xq[k]) * Wq[static_cast<size_t>(k) * N + n];
      const float value = cpu::dequantize(static_cast<int32_t>(acc), matrix.column_sums()[n],
                                          row_scale, matrix.scales()[n],
                                          b != nullptr ? b[n] : 0.0f);
      y[static_cast<size_t>(m) * N + n] = relu ? (value > 0.0f ? value : 0.0f) : value;
    }
  }
  return y;
}

struct Shape {
  int M, K, N;
};
// Odd sizes, a K below one VNNI group of 4, and M beyond one chunk of 512 rows.
const Shape kShapes[] = {{1, 5, 3}, {3, 64, 17}, {37, 300, 130}, {600, 96, 40}, {8, 512, 1000}};

// x [M, K], W [K, N] and b [N] of a shape.
struct Operands {
  std::vector<float> x, W, b;
};
Operands random_operands(const Shape& s, std::mt19937& rng) {
  Operands operands;
  operands.x = random_floats(static_cast<size_t>(s.M) * s.K, rng);
  operands.W = random_floats(static_cast<size_t>(s.K) * s.N, rng);
  operands.b = random_floats(s.N, rng);
  return operands;
}

TEST(Int8Matmul, ActivationsQuantizePerRowWithinHalfAStep) {
  std::mt19937 rng(1);
  const std::vector<float> x = random_floats(300, rng);
  std::vector<uint8_t> xq(x.size());
  const float scale = cpu::quantize_row(x.data(), static_cast<int>(x.size()), xq.data());
  float largest = 0.0f;
  for (float v : x) largest = std::max(largest, std::fabs(v));
  EXPECT_FLOAT_EQ(scale, largest / 127.0f);
  bool reaches_the_end = false;
  for (size_t k = 0; k < x.size(); ++k) {
    ASSERT_GE(xq[k], 1);
    reaches_the_end |= xq[k] == 1 || xq[k] == 255;  // the largest |x| maps to +-127
    // Half a step, and the float rounding of x / s (|x / s| <= 127: 2^-17 of a step).
    EXPECT_LE(std::fabs(x[k] - scale * (float(xq[k]) - 128.0f)), scale * (0.5f + 1e-4f))
        << "element " << k;
  }
  EXPECT_TRUE(reaches_the_end);
  std::vector<float> zeros(8, 0.0f);
  EXPECT_EQ(cpu::quantize_row(zeros.data(), 8, xq.data()), 0.0f);
  for (int k = 0; k < 8; ++k) EXPECT_EQ(xq[k], 128);
}

TEST(Int8Matmul, WeightsQuantizePerOutputChannelInEitherLayout) {
  SKIP_WITHOUT_INT8();
  const int limit = cpu::int8_weight_limit();
  if (const char* isa = std::getenv("DNNL_MAX_CPU_ISA"); isa && std::string(isa) == "AVX2") {
    EXPECT_EQ(limit, 63) << "AVX2 adds u8 x s8 pairs into a saturating int16: 7-bit weights";
  }
  std::mt19937 rng(2);
  const int K = 70, N = 33;
  const std::vector<float> W = random_floats(K * N, rng);
  for (const WeightLayout layout : {WeightLayout::kInputsByOutputs, WeightLayout::kOutputsByInputs}) {
    const std::vector<float> weights = stored(W, K, N, layout);
    const QuantizedMatrix matrix(weights.data(), K, N, layout);
    const std::vector<int8_t> Wq = matrix.quantized_values();
    for (int n = 0; n < N; ++n) {
      float largest = 0.0f;
      int largest_q = 0, sum = 0;
      for (int k = 0; k < K; ++k) largest = std::max(largest, std::fabs(W[k * N + n]));
      const float scale = matrix.scales()[n];
      EXPECT_FLOAT_EQ(scale, largest / static_cast<float>(limit)) << "column " << n;
      for (int k = 0; k < K; ++k) {
        const int q = Wq[k * N + n];
        largest_q = std::max(largest_q, std::abs(q));
        sum += q;
        EXPECT_LE(std::fabs(W[k * N + n] - scale * static_cast<float>(q)), scale * (0.5f + 1e-4f))
            << "W[" << k << ", " << n << "]";
      }
      EXPECT_EQ(largest_q, limit) << "column " << n << ": its largest weight maps to the limit";
      EXPECT_EQ(matrix.column_sums()[n], sum) << "column " << n;
    }
  }
}

TEST(Int8Matmul, ProductEqualsTheExactIntegerReference) {
  SKIP_WITHOUT_INT8();
  std::mt19937 rng(3);
  for (const Shape& s : kShapes) {
    const auto [x, W, b] = random_operands(s, rng);
    for (const WeightLayout layout : {WeightLayout::kInputsByOutputs, WeightLayout::kOutputsByInputs}) {
      const std::vector<float> weights = stored(W, s.K, s.N, layout);
      const QuantizedMatrix matrix(weights.data(), s.K, s.N, layout);
      for (const bool relu : {false, true}) {
        for (const float* bias : {b.data(), static_cast<const float*>(nullptr)}) {
          std::vector<float> y(static_cast<size_t>(s.M) * s.N, 99.0f);  // overwritten
          matrix.multiply(y.data(), x.data(), bias, s.M, relu);
          const std::vector<float> expected = exact_integer_reference(matrix, x, bias, s.M, relu);
          ASSERT_EQ(0, std::memcmp(y.data(), expected.data(), y.size() * sizeof(float)))
              << s.M << " x " << s.K << " x " << s.N << " layout "
              << static_cast<int>(layout) << " relu " << relu << " bias " << (bias != nullptr);
        }
      }
    }
  }
}

// Weights quantized once and stored (a quantized checkpoint, transformer_quantize) are
// the matrix that quantizing the floats at load makes: the same values, scales and
// column sums, and products equal bit for bit. Values beyond this CPU's limit (8-bit
// weights where the kernel takes 7) are refused rather than saturated.
TEST(Int8Matmul, StoredWeightsMultiplyAsWeightsQuantizedAtLoad) {
  SKIP_WITHOUT_INT8();
  std::mt19937 rng(7);
  const Shape s{9, 96, 40};
  const auto [x, W, b] = random_operands(s, rng);
  for (const WeightLayout layout : {WeightLayout::kInputsByOutputs, WeightLayout::kOutputsByInputs}) {
    const std::vector<float> weights = stored(W, s.K, s.N, layout);
    const QuantizedMatrix at_load(weights.data(), s.K, s.N, layout);
    const cpu::QuantizedWeights plain =
        cpu::quantize_weights(weights.data(), s.K, s.N, layout, cpu::int8_weight_limit());
    EXPECT_EQ(plain.values, at_load.quantized_values());
    EXPECT_EQ(plain.scales, at_load.scales());
    const QuantizedMatrix from_store(plain);
    EXPECT_EQ(from_store.column_sums(), at_load.column_sums());
    std::vector<float> expected(static_cast<size_t>(s.M) * s.N), y(expected.size());
    at_load.multiply(expected.data(), x.data(), b.data(), s.M, true);
    from_store.multiply(y.data(), x.data(), b.data(), s.M, true);
    EXPECT_EQ(0, std::memcmp(y.data(), expected.data(), y.size() * sizeof(float)));
  }
  if (cpu::int8_weight_limit() < 127) {
    const cpu::QuantizedWeights eight_bit =
        cpu::quantize_weights(W.data(), s.K, s.N, WeightLayout::kInputsByOutputs, 127);
    EXPECT_THROW(QuantizedMatrix{eight_bit}, thpc::Error);
  }
}

TEST(Int8Matmul, ProductStaysWithinTheQuantizationBoundOfTheFloatProduct) {
  SKIP_WITHOUT_INT8();
  std::mt19937 rng(4);
  for (const Shape& s : kShapes) {
    const auto [x, W, b] = random_operands(s, rng);
    const QuantizedMatrix matrix(W.data(), s.K, s.N, WeightLayout::kInputsByOutputs);
    std::vector<float> y(static_cast<size_t>(s.M) * s.N);
    matrix.multiply(y.data(), x.data(), b.data(), s.M, false);
    double worst_share = 0.0;  // of the bound, to see that (*) is not loose by far
    for (int m = 0; m < s.M; ++m) {
      double largest_x = 0.0;
      for (int k = 0; k < s.K; ++k) largest_x = std::max(largest_x, std::fabs(double(x[m * s.K + k])));
      const double row_scale = largest_x / 127.0;
      for (int n = 0; n < s.N; ++n) {
        double exact = b[n], magnitude = std::fabs(b[n]), sum_abs_w = 0.0, sum_abs_x = 0.0;
        for (int k = 0; k < s.K; ++k) {
          const double xv = x[m * s.K + k], wv = W[static_cast<size_t>(k) * s.N + n];
          exact += xv * wv;
          magnitude += std::fabs(xv * wv);
          sum_abs_w += std::fabs(wv);
          sum_abs_x += std::fabs(xv);
        }
        const double col_scale = matrix.scales()[n];
        const double bound = row_scale / 2 * sum_abs_w + col_scale / 2 * sum_abs_x +
                             s.K * row_scale * col_scale / 4;
        const double error = std::fabs(y[m * s.N + n] - exact);
        ASSERT_LE(error, bound + std::ldexp(magnitude + bound, -21))
            << "y[" << m << ", " << n << "] of " << s.M << " x " << s.K << " x " << s.N;
        worst_share = std::max(worst_share, error / bound);
      }
    }
    // Random errors of K terms add up like sqrt(K): far below the worst case, but not 0.
    EXPECT_GT(worst_share, 0.0) << "an int8 product equal to the float one: not quantized?";
  }
}

TEST(Int8Matmul, ZeroRowsAndColumnsGiveTheBiasExactly) {
  SKIP_WITHOUT_INT8();
  std::mt19937 rng(5);
  const int M = 4, K = 40, N = 9;
  std::vector<float> x = random_floats(M * K, rng), W = random_floats(K * N, rng);
  const std::vector<float> b = random_floats(N, rng);
  std::fill(x.begin() + K, x.begin() + 2 * K, 0.0f);  // row 1
  for (int k = 0; k < K; ++k) W[k * N + 3] = 0.0f;   // column 3
  const QuantizedMatrix matrix(W.data(), K, N, WeightLayout::kInputsByOutputs);
  std::vector<float> y(M * N);
  matrix.multiply(y.data(), x.data(), b.data(), M, false);
  for (int n = 0; n < N; ++n) EXPECT_EQ(y[1 * N + n], b[n]) << "row of zeros, column " << n;
  for (int m = 0; m < M; ++m) EXPECT_EQ(y[m * N + 3], b[3]) << "column of zeros, row " << m;
}

// A diverged model's NaN or infinite activation gives NaN outputs in its row, as the
// float product would (not a finite row computed from the zero point), and leaves the
// other rows alone.
TEST(Int8Matmul, NonFiniteActivationsGiveNaNRows) {
  SKIP_WITHOUT_INT8();
  std::mt19937 rng(7);
  const int M = 3, K = 40, N = 5;
  std::vector<float> x = random_floats(M * K, rng);
  const std::vector<float> W = random_floats(K * N, rng), b = random_floats(N, rng);
  const QuantizedMatrix matrix(W.data(), K, N, WeightLayout::kInputsByOutputs);
  std::vector<float> clean(M * N);
  matrix.multiply(clean.data(), x.data(), b.data(), M, false);
  for (const float bad : {std::numeric_limits<float>::quiet_NaN(),
                          std::numeric_limits<float>::infinity(),
                          -std::numeric_limits<float>::infinity()}) {
    for (const int at : {K + 3, K + 33}) {  // in the lanes, and in the tail after them
      std::vector<float> poisoned = x;
      poisoned[at] = bad;
      std::vector<float> y(M * N);
      matrix.multiply(y.data(), poisoned.data(), b.data(), M, false);
      for (int n = 0; n < N; ++n) {
        EXPECT_TRUE(std::isnan(y[N + n])) << bad << " at " << at << ", column " << n;
        EXPECT_EQ(y[n], clean[n]);
        EXPECT_EQ(y[2 * N + n], clean[2 * N + n]);
      }
    }
  }
}

// The backend: quantized weights go through the int8 product, every other product and
// op is the float CPU backend's, bit for bit.
TEST(Int8Backend, MultipliesQuantizedWeightsInInt8AndPassesTheRestOn) {
  SKIP_WITHOUT_INT8();
  std::mt19937 rng(6);
  const int M = 6, K = 24, N = 10, vocab = 50;
  auto float_backend = make_cpu_backend(DType::F32);
  Int8CpuBackend int8(make_cpu_backend(DType::F32));
  EXPECT_EQ(int8.name(), float_backend->name() + "+int8");
  // Every tensor made here, freed at the end (the sanitized suite checks for leaks).
  std::vector<std::pair<Backend*, Tensor>> made;
  const auto make = [&](Backend& backend, int64_t numel) {
    made.emplace_back(&backend, backend.alloc(DType::F32, numel));
    return made.back().second;
  };
  const auto put = [&](Backend& backend, const std::vector<float>& values) {
    Tensor t = make(backend, static_cast<int64_t>(values.size()));
    backend.upload(t, values.data());
    return t;
  };
  const auto values_of = [](Backend& backend, Tensor t) {
    std::vector<float> values(t.numel);
    backend.download(values.data(), t);
    return values;
  };
  const std::vector<float> x = random_floats(M * K, rng), W = random_floats(K * N, rng),
                           b = random_floats(N, rng), E = random_floats(vocab * K, rng),
                           other = random_floats(K * N, rng);
  const Tensor x8 = put(int8, x), W8 = put(int8, W), b8 = put(int8, b), E8 = put(int8, E),
               other8 = put(int8, other);
  int8.quantize(W8, K, N, WeightLayout::kInputsByOutputs);
  int8.quantize(E8, K, vocab, WeightLayout::kOutputsByInputs);
  EXPECT_EQ(int8.quantized_matrices(), 2);
  EXPECT_EQ(int8.quantized_values(), int64_t(K) * N + int64_t(K) * vocab);

  const QuantizedMatrix W_int8(W.data(), K, N, WeightLayout::kInputsByOutputs);
  const QuantizedMatrix E_int8(E.data(), K, vocab, WeightLayout::kOutputsByInputs);
  std::vector<float> expected(M * N), logits_expected(M * vocab);
  Tensor y8 = make(int8, M * N), logits8 = make(int8, M * vocab);
  for (const bool relu : {false, true}) {
    if (relu) {
      int8.linear_relu_forward(y8, x8, W8, b8, M, K, N);
    } else {
      int8.linear_forward(y8, x8, W8, b8, M, K, N);
    }
    W_int8.multiply(expected.data(), x.data(), b.data(), M, relu);
    EXPECT_EQ(values_of(int8, y8), expected) << "relu " << relu;
  }
  int8.output_projection_forward(logits8, x8, E8, M, K, vocab);
  E_int8.multiply(logits_expected.data(), x.data(), nullptr, M, false);
  EXPECT_EQ(values_of(int8, logits8), logits_expected);

  // Weights never quantized: the float backend's product.
  const Tensor xf = put(*float_backend, x), otherf = put(*float_backend, other),
               bf = put(*float_backend, b);
  Tensor yf = make(*float_backend, M * N);
  float_backend->linear_forward(yf, xf, otherf, bf, M, K, N);
  int8.linear_forward(y8, x8, other8, b8, M, K, N);
  EXPECT_EQ(values_of(int8, y8), values_of(*float_backend, yf));

  // The quantized weights with other sizes: a caller's error, named.
  EXPECT_THROW(int8.linear_forward(y8, x8, W8, b8, M, N, K), std::exception);
  for (auto& [backend, tensor] : made) backend->free(tensor);
}

}  // namespace
}  // namespace thpc::cpu_test

namespace thpc::cpu_test {
namespace {

// The GPU's int8 products (kernels/cuda/int8_cuda_backend.h) quantize activations to
// signed integers, as its tensor cores multiply them; the CPU's to u8 with zero point
// 128. Both are the same integers: round(x * 127 / max) is xq - 128, and the CPU's
// acc - 128 c[n] is the signed sum. This reference, which the GPU twin below is held to,
// is therefore the CPU's arithmetic: it gives oneDNN's products bit for bit.
std::vector<float> signed_integer_reference(const cpu::QuantizedWeights& weights,
                                            const std::vector<float>& x, const float* b,
                                            int M, bool relu) {
  const int K = weights.inputs, N = weights.outputs;
  std::vector<float> y(static_cast<size_t>(M) * N);
  std::vector<uint8_t> xq(K);
  for (int m = 0; m < M; ++m) {
    const float row_scale = cpu::quantize_row(x.data() + static_cast<size_t>(m) * K, K, xq.data());
    for (int n = 0; n < N; ++n) {
      int64_t acc = 0;
      for (int k = 0; k < K; ++k) {
        acc += (int64_t(xq[k]) - 128) * weights.values[static_cast<size_t>(k) * N + n];
      }
      const float value = cpu::dequantize(static_cast<int32_t>(acc), 0, row_scale,
                                          weights.scales[n], b != nullptr ? b[n] : 0.0f);
      y[static_cast<size_t>(m) * N + n] = relu ? (value > 0.0f ? value : 0.0f) : value;
    }
  }
  return y;
}

TEST(Int8Matmul, SignedActivationsGiveTheUnsignedProductsBitForBit) {
  SKIP_WITHOUT_INT8();
  std::mt19937 rng(11);
  for (const Shape& s : kShapes) {
    SCOPED_TRACE(std::to_string(s.M) + " x " + std::to_string(s.K) + " x " + std::to_string(s.N));
    const Operands operands = random_operands(s, rng);
    const cpu::QuantizedWeights weights = cpu::quantize_weights(
        operands.W.data(), s.K, s.N, WeightLayout::kInputsByOutputs, cpu::int8_weight_limit());
    const QuantizedMatrix matrix(weights);
    for (const bool relu : {false, true}) {
      std::vector<float> y(static_cast<size_t>(s.M) * s.N);
      matrix.multiply(y.data(), operands.x.data(), operands.b.data(), s.M, relu);
      EXPECT_EQ(signed_integer_reference(weights, operands.x, operands.b.data(), s.M, relu), y)
          << "relu " << relu;
    }
  }
}

}  // namespace
}  // namespace thpc::cpu_test

#if THPC_HAVE_CUDA
#include <functional>
#include <memory>

#include "backend/factory.h"
#include "cuda_twin.h"
#include "kernels/cuda/int8_cuda_backend.h"

namespace thpc::test {
namespace {

using cpu_test::signed_integer_reference;

// Int8CudaBackend's products (the former candidate int8_products, passed on an H200 on
// 2026-11-29) against the CPU's int8
// arithmetic (signed_integer_reference) on the same x, in fp32 and bf16 rows. The
// integers are exact on both sides; the epilogue float(acc) * (s_m * s_n) + b rounds
// three times on each, in the same order, but the CPU's compiler may fuse the last two:
// 4 fp32 eps of the largest |result| bound that. bf16 rows round y once more: eps_of(bf16)
// relative.
// The backend under test and how it takes int8 weights: the GPU's int8 products, or in the
// rehearsal (THPC_TWIN_REHEARSAL=1, tests/cuda_twin.h) the CPU's, whose arithmetic the
// reference is: the test's own logic (shapes, the NaN row, the tolerances) then runs on
// the CPU against it.
struct Int8UnderTest {
  std::unique_ptr<Backend> backend;
  std::function<void(Tensor, const cpu::QuantizedWeights&)> adopt;
};
Int8UnderTest int8_under_test(DType dtype) {
  Int8UnderTest under_test;
  if (twin_rehearsal()) {
    auto cpu = std::make_unique<Int8CpuBackend>(make_cpu_backend(DType::F32));
    Int8CpuBackend* products = cpu.get();
    under_test.adopt = [products](Tensor weights, const cpu::QuantizedWeights& quantized) {
      products->adopt(weights, quantized);
    };
    under_test.backend = std::move(cpu);
    return under_test;
  }
  auto gpu = std::make_unique<Int8CudaBackend>(
      make_backend(BackendRequest{"cuda", dtype == DType::BF16 ? "bf16" : "fp32", 0, 0, {}}));
  Int8CudaBackend* products = gpu.get();
  under_test.adopt = [products](Tensor weights, const cpu::QuantizedWeights& quantized) {
    EXPECT_TRUE(products->adopt(weights, quantized));
  };
  under_test.backend = std::move(gpu);
  return under_test;
}

TEST(CudaInt8Products, ProductsMatchTheCpuInt8Arithmetic) {
  THPC_REQUIRE_GPU();
  if (twin_rehearsal() && (!cpu::int8_available() || cpu::int8_weight_limit() != 127)) {
    GTEST_SKIP() << "the rehearsal needs the CPU's 8-bit int8 products: " << cpu::int8_description();
  }
  std::mt19937 rng(12);
  struct Case {
    int M, K, N;
  };
  // Two rows (one the NaN row); batch 32 x beam 4 rows of the base model's products; an
  // odd row count; the output projection's vocabulary.
  const Case cases[] = {{2, 64, 4}, {128, 512, 2048}, {128, 2048, 512}, {37, 512, 1000},
                        {128, 512, 37000}};
  for (DType dtype : gpu_compute_dtypes()) {
    Int8UnderTest under_test = int8_under_test(dtype);
    Backend& int8 = *under_test.backend;
    Scope scope(int8);
    for (const Case& c : cases) {
      SCOPED_TRACE(std::string(dtype_name(dtype)) + " " + std::to_string(c.M) + " x " +
                   std::to_string(c.K) + " x " + std::to_string(c.N));
      std::vector<float> x = representable(random_values(size_t(c.M) * c.K, rng), dtype);
      x[3 % x.size()] = NAN;  // row 0 holds a NaN: NaN out, 0 after the ReLU
      const std::vector<float> b = representable(random_values(size_t(c.N), rng), dtype);
      const std::vector<float> W = random_values(size_t(c.K) * c.N, rng);
      const bool projection = c.N == 37000;  // E [vocab, d] as the model holds it
      const cpu::QuantizedWeights weights = cpu::quantize_weights(
          W.data(), c.K, c.N,
          projection ? cpu::WeightLayout::kOutputsByInputs : cpu::WeightLayout::kInputsByOutputs,
          127);
      const Tensor key = scope.put(dtype, W);  // the model's compute tensor: its address
      under_test.adopt(key, weights);
      const Tensor xt = scope.put(dtype, x), bt = scope.put(dtype, b);
      const Tensor y = scope.alloc(dtype, int64_t(c.M) * c.N);
      for (const bool relu : {false, true}) {
        if (projection && relu) continue;
        if (projection) {
          int8.output_projection_forward(y, xt, key, c.M, c.K, c.N);
        } else if (relu) {
          int8.linear_relu_forward(y, xt, key, bt, c.M, c.K, c.N);
        } else {
          int8.linear_forward(y, xt, key, bt, c.M, c.K, c.N);
        }
        std::vector<float> expected =
            signed_integer_reference(weights, x, projection ? nullptr : b.data(), c.M, relu);
        std::vector<float> actual = scope.get(y);
        for (int n = 0; n < c.N; ++n) {  // row 0: NaN, or 0 through the ReLU, on both
          ASSERT_TRUE(relu ? actual[n] == 0.0f : std::isnan(actual[n])) << "row 0 column " << n;
          ASSERT_TRUE(relu ? expected[n] == 0.0f : std::isnan(expected[n])) << "reference " << n;
          actual[n] = expected[n] = 0.0f;
        }
        double largest = 0.0;
        for (size_t i = size_t(c.N); i < expected.size(); ++i) {
          largest = std::max(largest, std::abs(static_cast<double>(expected[i])));
        }
        EXPECT_TRUE(all_close(actual, expected, 4 * eps_of(DType::F32) * largest,
                              rounding_rel(dtype)))
            << (relu ? "linear_relu_forward" : projection ? "output_projection_forward"
                                                          : "linear_forward");
      }
    }
  }
}

// A weight matrix it was not handed (or one it keeps in float: N not a multiple of 4)
// takes the inner backend's float product, bit for bit.
TEST(CudaInt8Products, OtherWeightsTakeTheFloatProduct) {
  THPC_REQUIRE_REAL_GPU();
  const CudaKernelChoice kernels;
  std::mt19937 rng(13);
  auto inner = make_backend(BackendRequest{"cuda", "bf16", 0, 0, kernels});
  Backend& plain = *inner;
  Int8CudaBackend int8(make_backend(BackendRequest{"cuda", "bf16", 0, 0, kernels}));
  const int M = 16, K = 64, N = 30;  // N % 4 != 0: kept in float
  const std::vector<float> x = representable(random_values(size_t(M) * K, rng), DType::BF16);
  const std::vector<float> W = representable(random_values(size_t(K) * N, rng), DType::BF16);
  Scope on_int8(int8), on_plain(plain);
  const Tensor key = on_int8.put(DType::BF16, W);
  int8.adopt(key, cpu::quantize_weights(W.data(), K, N, cpu::WeightLayout::kInputsByOutputs, 127));
  EXPECT_EQ(int8.quantized_matrices(), 0);
  const Tensor y8 = on_int8.alloc(DType::BF16, int64_t(M) * N);
  int8.linear_forward(y8, on_int8.put(DType::BF16, x), key, Tensor{}, M, K, N);
  const Tensor y = on_plain.alloc(DType::BF16, int64_t(M) * N);
  plain.linear_forward(y, on_plain.put(DType::BF16, x), on_plain.put(DType::BF16, W), Tensor{},
                       M, K, N);
  EXPECT_TRUE(same_bits(on_int8.get(y8), on_plain.get(y)));
}

}  // namespace
}  // namespace thpc::test
#endif
