// CUDA twins of the elementwise, embedding and Adam ops (kernels/cuda/elementwise.cu,
// embedding.cu, adam.cu) against the CPU reference backend, on random non-zero inputs,
// in both GPU precisions (fp32 and bf16). Without a GPU every test reports SKIPPED.
//
// Tolerances. These kernels perform the CPU's IEEE fp32 operations in the CPU's order
// (explicitly rounded intrinsics, no FMA contraction; reductions in the CPU's row
// order), on the same bf16-representable inputs. So:
// * fp32 mode: results are bit-identical to the CPU's (tolerance 0). Any difference is a
//   changed operation order or a contraction, which is worth a failure.
// * bf16 mode: an activation output is the CPU's fp32 result rounded once to bf16, at
//   most half an ulp = 2^-8 |x| away; we allow eps_of(bf16) = 2^-7 relative.
//   fp32 outputs (d_table, d_positions) see the same fp32 chain as the CPU: exact.
// * Adam: exact by construction; 2 ulp of slack (few-ulp agreement is what matters).
// * sum_squares: the squares are exact in double; the sums run in another order, so
//   the relative error is <= n * 2^-53 in the worst case (1.1e-10 at 1e6 elements,
//   typically sqrt(n) * 2^-53): we allow 1e-10. A dropped or doubled element would move
//   the sum by ~1/n relative, >= 1e-6 at our sizes.
// Dropout masks must agree exactly: the zero patterns of outputs and of gradients
// accumulated into zeros are compared position by position.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "cuda_twin.h"

namespace thpc::test {
namespace {

// Sizes: tiny, odd, not multiples of 4 (the GPU draws dropout masks 4 elements at a
// time), of 32, 128 or 256 (threads per block), and one over a million elements.
const std::vector<int64_t> kSizes = {1, 3, 37, 1027, 65539, 1000003};

// Relative tolerance of an activation output (see the header).
double rounding_rel(DType dtype) { return dtype == DType::F32 ? 0.0 : eps_of(dtype); }

// The same tensor on each backend.
struct Pair {
  Tensor cpu, gpu;
};

// Tensors on the CPU twin and on the GPU, freed at scope end. Activations are in the
// GPU's compute dtype on the GPU and hold the same (representable) values in fp32 on
// the CPU; parameter-side tensors are fp32 on both.
class Both {
 public:
  explicit Both(Twins& twins)
      : dtype_(twins.compute), cpu_(*twins.cpu), gpu_(*twins.gpu) {}
  Backend& cpu() { return cpu_.backend(); }
  Backend& gpu() { return gpu_.backend(); }
  DType dtype() const { return dtype_; }

  Pair act(const std::vector<float>& host) {
    return {cpu_.put(DType::F32, representable(host, dtype_)), gpu_.put(dtype_, host)};
  }
  Pair param(const std::vector<float>& host) {
    return {cpu_.put(DType::F32, host), gpu_.put(DType::F32, host)};
  }
  // Filled with NaN, so an element the op does not write fails the comparison.
  Pair act_poisoned(int64_t n) { return act(std::vector<float>(static_cast<size_t>(n), NAN)); }
  Pair act_zeros(int64_t n) { return {cpu_.zeros(DType::F32, n), gpu_.zeros(dtype_, n)}; }
  std::pair<int32_t*, int32_t*> ids(const std::vector<int32_t>& host) {
    return {cpu_.put_ids(host), gpu_.put_ids(host)};
  }
  std::vector<float> cpu_values(const Pair& t) { return cpu_.get(t.cpu); }
  std::vector<float> gpu_values(const Pair& t) { return gpu_.get(t.gpu); }

 private:
  DType dtype_;
  Scope cpu_, gpu_;
};

std::string describe(DType dtype, int64_t n, float p = 0.0f) {
  std::ostringstream out;
  out << dtype_name(dtype) << " n=" << n << " p=" << p;
  return out.str();
}

// Same positions of exact zeros (the dropped elements): the dropout masks agree.
::testing::AssertionResult same_zeros(const std::vector<float>& actual,
                                      const std::vector<float>& expected) {
  if (actual.size() != expected.size()) return ::testing::AssertionFailure() << "sizes differ";
  size_t mismatches = 0, first = 0, zeros = 0;
  for (size_t i = 0; i < actual.size(); ++i) {
    zeros += expected[i] == 0.0f;
    if ((actual[i] == 0.0f) != (expected[i] == 0.0f)) {
      if (mismatches++ == 0) first = i;
    }
  }
  if (mismatches == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << mismatches << " of " << actual.size()
                                       << " mask positions differ (CPU drops " << zeros
                                       << "); first at " << first << ": got " << actual[first]
                                       << ", expected " << expected[first];
}

// Bitwise equality of two float vectors (determinism).
bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// A key with every field non-zero, high seed bits included.
DropoutKey test_key(int64_t n) {
  return DropoutKey{0xfedcba9876543210ull ^ static_cast<uint64_t>(n), 1234u, 7u, 5u};
}

// ---- conversion ---------------------------------------------------------------------

TEST(CudaElementwise, ConvertRoundsToNearestEvenAndCopies) {
  THPC_REQUIRE_GPU();
  Twins twins(DType::BF16);
  Scope gpu(*twins.gpu);
  std::mt19937 rng(1);
  for (int64_t n : kSizes) {
    SCOPED_TRACE(describe(DType::BF16, n));
    std::vector<float> host = random_values(static_cast<size_t>(n), rng, -1000.0f, 1000.0f);
    // Exact ties between two bf16 values (low 16 bits 0x8000): round to even.
    std::uniform_int_distribution<uint32_t> high(0x0080u, 0x7f00u);
    for (size_t i = 0; i < host.size(); i += 3) {
      const uint32_t bits = (high(rng) << 16) | 0x8000u | (i % 2 ? 0x80000000u : 0u);
      std::memcpy(&host[i], &bits, 4);
    }
    Tensor f32 = gpu.put(DType::F32, host);
    Tensor bf = gpu.alloc(DType::BF16, n);
    twins.gpu->copy(bf, f32);  // F32 -> BF16
    EXPECT_TRUE(all_close(gpu.get(bf), representable(host, DType::BF16), 0.0, 0.0));
    Tensor f32_copy = gpu.alloc(DType::F32, n);
    twins.gpu->copy(f32_copy, f32);  // F32 -> F32
    EXPECT_TRUE(all_close(gpu.get(f32_copy), host, 0.0, 0.0));
    Tensor bf_copy = gpu.alloc(DType::BF16, n);
    twins.gpu->copy(bf_copy, bf);  // BF16 -> BF16, then BF16 -> F32 inside get()
    EXPECT_TRUE(all_close(gpu.get(bf_copy), representable(host, DType::BF16), 0.0, 0.0));
  }
}

// ---- ReLU -----------------------------------------------------------------------------

TEST(CudaElementwise, ReluForwardBackwardMatchCpu) {
  THPC_REQUIRE_GPU();
  std::mt19937 rng(2);
  for (DType dtype : gpu_compute_dtypes()) {
    Twins twins(dtype);
    for (int64_t n : kSizes) {
      SCOPED_TRACE(describe(dtype, n));
      const size_t count = static_cast<size_t>(n);
      Both both(twins);
      Pair x = both.act(random_values(count, rng));
      Pair y = both.act_poisoned(n);
      both.cpu().relu_forward(y.cpu, x.cpu, n);
      both.gpu().relu_forward(y.gpu, x.gpu, n);
      // A selection, no arithmetic: exact in both precisions.
      EXPECT_TRUE(all_close(both.gpu_values(y), both.cpu_values(y), 0.0, 0.0));

      Pair dy = both.act(random_values(count, rng));
      Pair dx = both.act(random_values(count, rng));  // accumulated into
      both.cpu().relu_backward(dx.cpu, dy.cpu, y.cpu, n);
      both.gpu().relu_backward(dx.gpu, dy.gpu, y.gpu, n);
      EXPECT_TRUE(all_close(both.gpu_values(dx), both.cpu_values(dx), 0.0, rounding_rel(dtype)));
    }
  }
}

// ---- dropout --------------------------------------------------------------------------

// Runs check(both, n, p, key, rel) for every precision, p in {0, 0.1, 0.3} and size;
// rel is the precision's tolerance, key_offset varies the key between tests.
template <typename Check>
void for_each_dropout_case(int64_t key_offset, const Check& check) {
  for (DType dtype : gpu_compute_dtypes()) {
    Twins twins(dtype);
    for (float p : {0.0f, 0.1f, 0.3f}) {
      for (int64_t n : kSizes) {
        SCOPED_TRACE(describe(dtype, n, p));
        Both both(twins);
        check(both, n, p, test_key(n + key_offset), rounding_rel(dtype));
      }
    }
  }
}

TEST(CudaElementwise, DropoutMatchesCpuMaskExactly) {
  THPC_REQUIRE_GPU();
  std::mt19937 rng(3);
  for_each_dropout_case(0, [&](Both& both, int64_t n, float p, const DropoutKey& key,
                               double rel) {
    const size_t count = static_cast<size_t>(n);
    Pair x = both.act(random_values(count, rng));
    Pair y = both.act_poisoned(n);
    both.cpu().dropout_forward(y.cpu, x.cpu, n, p, key);
    both.gpu().dropout_forward(y.gpu, x.gpu, n, p, key);
    const std::vector<float> y_cpu = both.cpu_values(y), y_gpu = both.gpu_values(y);
    EXPECT_TRUE(same_zeros(y_gpu, y_cpu));
    EXPECT_TRUE(all_close(y_gpu, y_cpu, 0.0, rel));

    // Into zeros: the kept positions are exactly the non-zero gradients.
    Pair dy = both.act(random_values(count, rng));
    Pair dx0 = both.act_zeros(n);
    both.cpu().dropout_backward(dx0.cpu, dy.cpu, n, p, key);
    both.gpu().dropout_backward(dx0.gpu, dy.gpu, n, p, key);
    EXPECT_TRUE(same_zeros(both.gpu_values(dx0), both.cpu_values(dx0)));

    // Into random values: accumulation.
    Pair dx = both.act(random_values(count, rng));
    both.cpu().dropout_backward(dx.cpu, dy.cpu, n, p, key);
    both.gpu().dropout_backward(dx.gpu, dy.gpu, n, p, key);
    EXPECT_TRUE(all_close(both.gpu_values(dx), both.cpu_values(dx), 0.0, rel));
  });
}

TEST(CudaElementwise, ResidualDropoutMatchesCpu) {
  THPC_REQUIRE_GPU();
  std::mt19937 rng(4);
  for_each_dropout_case(1, [&](Both& both, int64_t n, float p, const DropoutKey& key,
                               double rel) {
    const size_t count = static_cast<size_t>(n);
    Pair x = both.act(random_values(count, rng));
    Pair sub = both.act(random_values(count, rng));
    Pair y = both.act_poisoned(n);
    both.cpu().residual_dropout_forward(y.cpu, x.cpu, sub.cpu, n, p, key);
    both.gpu().residual_dropout_forward(y.gpu, x.gpu, sub.gpu, n, p, key);
    EXPECT_TRUE(all_close(both.gpu_values(y), both.cpu_values(y), 0.0, rel));

    // d_sub into zeros: the mask, position by position.
    Pair dy = both.act(random_values(count, rng));
    Pair d_sub0 = both.act_zeros(n);
    both.cpu().residual_dropout_backward(Tensor{}, d_sub0.cpu, dy.cpu, n, p, key);
    both.gpu().residual_dropout_backward(Tensor{}, d_sub0.gpu, dy.gpu, n, p, key);
    EXPECT_TRUE(same_zeros(both.gpu_values(d_sub0), both.cpu_values(d_sub0)));

    // Both gradients, accumulated into random values.
    Pair dx = both.act(random_values(count, rng));
    Pair d_sub = both.act(random_values(count, rng));
    both.cpu().residual_dropout_backward(dx.cpu, d_sub.cpu, dy.cpu, n, p, key);
    both.gpu().residual_dropout_backward(dx.gpu, d_sub.gpu, dy.gpu, n, p, key);
    EXPECT_TRUE(all_close(both.gpu_values(dx), both.cpu_values(dx), 0.0, rel));
    EXPECT_TRUE(all_close(both.gpu_values(d_sub), both.cpu_values(d_sub), 0.0, rel));

    // dx only (d_sub not needed).
    Pair dx_only = both.act(random_values(count, rng));
    both.cpu().residual_dropout_backward(dx_only.cpu, Tensor{}, dy.cpu, n, p, key);
    both.gpu().residual_dropout_backward(dx_only.gpu, Tensor{}, dy.gpu, n, p, key);
    EXPECT_TRUE(all_close(both.gpu_values(dx_only), both.cpu_values(dx_only), 0.0, rel));
  });
}

TEST(CudaElementwise, DropoutRejectsBadProbabilityAndHandlesEmpty) {
  THPC_REQUIRE_GPU();
  for (DType dtype : gpu_compute_dtypes()) {
    Twins twins(dtype);
    Scope gpu(*twins.gpu);
    Tensor a = gpu.put(dtype, {0.5f, -0.25f}), b = gpu.put(dtype, {1.0f, 2.0f});
    const DropoutKey key = test_key(2);
    EXPECT_ANY_THROW(twins.gpu->dropout_forward(b, a, 2, 1.0f, key));
    EXPECT_ANY_THROW(twins.gpu->dropout_backward(b, a, 2, -0.1f, key));
    EXPECT_ANY_THROW(twins.gpu->residual_dropout_forward(b, a, a, 2, 1.5f, key));
    // Zero sizes launch nothing (and do not throw).
    twins.gpu->relu_forward(b, a, 0);
    twins.gpu->relu_backward(b, a, a, 0);
    twins.gpu->dropout_forward(b, a, 0, 0.1f, key);
    twins.gpu->dropout_backward(b, a, 0, 0.1f, key);
    twins.gpu->residual_dropout_forward(b, a, a, 0, 0.1f, key);
    twins.gpu->residual_dropout_backward(b, b, a, 0, 0.1f, key);
    twins.gpu->copy_rows(b, nullptr, a, nullptr, 0, 1);
    twins.gpu->synchronize();
    EXPECT_TRUE(all_close(gpu.get(b), representable({1.0f, 2.0f}, dtype), 0.0, 0.0));
  }
}

// ---- row copies -----------------------------------------------------------------------

TEST(CudaElementwise, CopyRowsMatchesCpu) {
  THPC_REQUIRE_GPU();
  std::mt19937 rng(5);
  const int src_rows_count = 11, dst_rows_count = 13, count = 9;
  for (DType dtype : gpu_compute_dtypes()) {
    Twins twins(dtype);
    for (int width : {1, 37, 512, 1025}) {
      SCOPED_TRACE(describe(dtype, width));
      // Destination rows: distinct (a scatter into a cache); sources: with repeats.
      std::vector<int32_t> dst_rows(dst_rows_count);
      std::iota(dst_rows.begin(), dst_rows.end(), 0);
      std::shuffle(dst_rows.begin(), dst_rows.end(), rng);
      dst_rows.resize(count);
      std::uniform_int_distribution<int32_t> pick(0, src_rows_count - 1);
      std::vector<int32_t> src_rows(count);
      for (int32_t& row : src_rows) row = pick(rng);
      for (int variant = 0; variant < 4; ++variant) {
        SCOPED_TRACE(variant);
        Both both(twins);
        auto [dst_ids_cpu, dst_ids_gpu] = both.ids(dst_rows);
        auto [src_ids_cpu, src_ids_gpu] = both.ids(src_rows);
        const bool use_dst = (variant & 1) != 0, use_src = (variant & 2) != 0;
        Pair src = both.act(random_values(static_cast<size_t>(src_rows_count) * width, rng));
        Pair dst = both.act(random_values(static_cast<size_t>(dst_rows_count) * width, rng));
        both.cpu().copy_rows(dst.cpu, use_dst ? dst_ids_cpu : nullptr, src.cpu,
                             use_src ? src_ids_cpu : nullptr, count, width);
        both.gpu().copy_rows(dst.gpu, use_dst ? dst_ids_gpu : nullptr, src.gpu,
                             use_src ? src_ids_gpu : nullptr, count, width);
        EXPECT_TRUE(all_close(both.gpu_values(dst), both.cpu_values(dst), 0.0, 0.0));
      }
    }
  }
}

// ---- fp32 parameter-side ops: scale, sum_squares, Adam ------------------------------

TEST(CudaElementwise, ScaleAndSumSquaresMatchCpu) {
  THPC_REQUIRE_GPU();
  std::mt19937 rng(6);
  Twins twins(DType::F32);  // parameter-side ops are fp32 in both GPU precisions
  for (int64_t n : {int64_t{1}, int64_t{255}, int64_t{257}, int64_t{65539}, int64_t{1000003}}) {
    SCOPED_TRACE(describe(DType::F32, n));
    Both both(twins);
    Pair x = both.param(random_values(static_cast<size_t>(n), rng, -3.0f, 3.0f));
    both.cpu().scale(x.cpu, n, 0.37f);
    both.gpu().scale(x.gpu, n, 0.37f);
    EXPECT_TRUE(all_close(both.gpu_values(x), both.cpu_values(x), 0.0, 0.0));

    const double expected = both.cpu().sum_squares(x.cpu, n);
    const double first = both.gpu().sum_squares(x.gpu, n);
    const double second = both.gpu().sum_squares(x.gpu, n);
    EXPECT_NEAR(first, expected, 1e-10 * expected);
    EXPECT_EQ(std::memcmp(&first, &second, sizeof(double)), 0) << "not deterministic";
  }
  Scope gpu(*twins.gpu);
  EXPECT_EQ(twins.gpu->sum_squares(gpu.put(DType::F32, {2.0f}), 0), 0.0);
}

TEST(CudaAdam, UpdateMatchesCpu) {
  THPC_REQUIRE_GPU();
  std::mt19937 rng(7);
  Twins twins(DType::F32);  // Adam works on the fp32 master weights in both precisions
  const float lr = 1e-3f, beta1 = 0.9f, beta2 = 0.98f, eps = 1e-9f;
  // Exact by construction; 2 ulp of slack.
  const double rel = 2.0 * eps_of(DType::F32);
  for (int64_t n : {int64_t{1}, int64_t{1027}, int64_t{1000003}}) {
    for (int64_t first_step : {int64_t{1}, int64_t{1000}}) {
      SCOPED_TRACE(describe(DType::F32, n) + " step " + std::to_string(first_step));
      const size_t count = static_cast<size_t>(n);
      Both both(twins);
      Pair params = both.param(random_values(count, rng));
      Pair m = both.param(random_values(count, rng, -0.01f, 0.01f));
      std::vector<float> v_host = random_values(count, rng, 1e-3f, 1e-2f);
      Pair v = both.param(v_host);
      // Three consecutive steps, each reading the state the previous one left.
      for (int64_t step = first_step; step < first_step + 3; ++step) {
        Pair grads = both.param(random_values(count, rng, -0.1f, 0.1f));
        both.cpu().adam_update(params.cpu, grads.cpu, m.cpu, v.cpu, n, lr, beta1, beta2, eps, step);
        both.gpu().adam_update(params.gpu, grads.gpu, m.gpu, v.gpu, n, lr, beta1, beta2, eps, step);
      }
      EXPECT_TRUE(all_close(both.gpu_values(m), both.cpu_values(m), 0.0, rel));
      EXPECT_TRUE(all_close(both.gpu_values(v), both.cpu_values(v), 0.0, rel));
      EXPECT_TRUE(all_close(both.gpu_values(params), both.cpu_values(params), 0.0, rel));
    }
  }
  Both both(twins);
  Pair p = both.param({1.0f});
  EXPECT_ANY_THROW(both.gpu().adam_update(p.gpu, p.gpu, p.gpu, p.gpu, 1, lr, beta1, beta2, eps, 0));
}

// ---- embedding ------------------------------------------------------------------------

struct EmbeddingShape {
  int batch, length, max_len, d, vocab;
};
// Odd widths, d over 256 (two column passes per block), one long sequence, and a tiny
// vocabulary whose tokens repeat over a thousand times (runs longer than a block).
const std::vector<EmbeddingShape> kEmbeddingShapes = {
    {3, 7, 9, 37, 50}, {2, 129, 130, 512, 1000}, {1, 1000, 1000, 64, 33},
    {4, 33, 40, 300, 5}, {8, 600, 600, 40, 3},   {5, 1, 1, 1, 2}};

// Token ids with repeats: about a third are the pad id 0, the rest uniform.
std::vector<int32_t> random_tokens(int rows, int vocab, std::mt19937& rng) {
  std::uniform_int_distribution<int32_t> token(0, vocab - 1);
  std::bernoulli_distribution pad(0.3);
  std::vector<int32_t> tokens(static_cast<size_t>(rows));
  for (int32_t& t : tokens) t = pad(rng) ? 0 : token(rng);
  return tokens;
}

std::string describe(DType dtype, const EmbeddingShape& s, bool learned) {
  std::ostringstream out;
  out << dtype_name(dtype) << " B=" << s.batch << " L=" << s.length << " d=" << s.d
      << " vocab=" << s.vocab << (learned ? " learned" : " sinusoidal/none");
  return out.str();
}

// Runs check(both, shape, positions on/off, rows, scale, CPU tokens, GPU tokens) for
// every precision, shape and positions setting, on fresh random tokens.
template <typename Check>
void for_each_embedding_case(std::mt19937& rng, const Check& check) {
  for (DType dtype : gpu_compute_dtypes()) {
    Twins twins(dtype);
    for (const EmbeddingShape& s : kEmbeddingShapes) {
      for (bool with_positions : {true, false}) {
        SCOPED_TRACE(describe(dtype, s, with_positions));
        const int rows = s.batch * s.length;
        const float scale = std::sqrt(static_cast<float>(s.d));
        Both both(twins);
        auto [tokens_cpu, tokens_gpu] = both.ids(random_tokens(rows, s.vocab, rng));
        check(both, s, with_positions, rows, scale, tokens_cpu, tokens_gpu);
      }
    }
  }
}

TEST(CudaEmbedding, ForwardMatchesCpu) {
  THPC_REQUIRE_GPU();
  std::mt19937 rng(8);
  for_each_embedding_case(rng, [&](Both& both, const EmbeddingShape& s, bool with_positions,
                                   int rows, float scale, const int32_t* tokens_cpu,
                                   const int32_t* tokens_gpu) {
    Pair table = both.act(random_values(static_cast<size_t>(s.vocab) * s.d, rng));
    Pair positions = with_positions
                         ? both.act(random_values(static_cast<size_t>(s.max_len) * s.d, rng))
                         : Pair{};
    Pair out = both.act_poisoned(static_cast<int64_t>(rows) * s.d);
    both.cpu().embedding_forward(out.cpu, tokens_cpu, table.cpu, positions.cpu, rows,
                                 s.length, s.d, s.vocab, scale);
    both.gpu().embedding_forward(out.gpu, tokens_gpu, table.gpu, positions.gpu, rows,
                                 s.length, s.d, s.vocab, scale);
    EXPECT_TRUE(all_close(both.gpu_values(out), both.cpu_values(out), 0.0,
                          rounding_rel(both.dtype())));
  });
}

TEST(CudaEmbedding, BackwardMatchesCpuWithRepeatedTokens) {
  THPC_REQUIRE_GPU();
  std::mt19937 rng(9);
  for_each_embedding_case(rng, [&](Both& both, const EmbeddingShape& s, bool learned, int rows,
                                   float scale, const int32_t* tokens_cpu,
                                   const int32_t* tokens_gpu) {
    Pair d_out = both.act(random_values(static_cast<size_t>(rows) * s.d, rng));
    // fp32 gradients, pre-filled: the op accumulates.
    Pair d_table = both.param(random_values(static_cast<size_t>(s.vocab) * s.d, rng));
    Pair d_positions =
        learned ? both.param(random_values(static_cast<size_t>(s.max_len) * s.d, rng))
                : Pair{};
    both.cpu().embedding_backward(d_table.cpu, d_positions.cpu, d_out.cpu, tokens_cpu, rows,
                                  s.length, s.d, s.vocab, scale);
    both.gpu().embedding_backward(d_table.gpu, d_positions.gpu, d_out.gpu, tokens_gpu, rows,
                                  s.length, s.d, s.vocab, scale);
    // The CPU's per-(token, column) chain of fp32 roundings, in row order: exact, in
    // both precisions (the bf16 d_out values are the CPU's inputs too).
    EXPECT_TRUE(all_close(both.gpu_values(d_table), both.cpu_values(d_table), 0.0, 0.0));
    if (learned) {
      EXPECT_TRUE(
          all_close(both.gpu_values(d_positions), both.cpu_values(d_positions), 0.0, 0.0));
    }
  });
}

TEST(CudaEmbedding, BackwardIsDeterministic) {
  THPC_REQUIRE_GPU();
  std::mt19937 rng(10);
  const int batch = 64, length = 256, d = 512, vocab = 100;  // ~16k rows, long token runs
  const int rows = batch * length;
  for (DType dtype : gpu_compute_dtypes()) {
    SCOPED_TRACE(dtype_name(dtype));
    Twins twins(dtype);
    Scope gpu(*twins.gpu);
    int32_t* tokens = gpu.put_ids(random_tokens(rows, vocab, rng));
    Tensor d_out = gpu.put(dtype, random_values(static_cast<size_t>(rows) * d, rng));
    const std::vector<float> table_init = random_values(static_cast<size_t>(vocab) * d, rng);
    const std::vector<float> positions_init = random_values(static_cast<size_t>(length) * d, rng);
    std::vector<std::vector<float>> tables, positions;
    for (int run = 0; run < 2; ++run) {
      Tensor d_table = gpu.put(DType::F32, table_init);
      Tensor d_positions = gpu.put(DType::F32, positions_init);
      twins.gpu->embedding_backward(d_table, d_positions, d_out, tokens, rows, length, d, vocab,
                                    std::sqrt(static_cast<float>(d)));
      tables.push_back(gpu.get(d_table));
      positions.push_back(gpu.get(d_positions));
    }
    EXPECT_TRUE(same_bits(tables[0], tables[1])) << "d_table differs between identical calls";
    EXPECT_TRUE(same_bits(positions[0], positions[1]))
        << "d_positions differs between identical calls";
  }
}

// The GPU cannot throw from a kernel: an out-of-vocabulary token gives a NaN row in the
// forward (visible in the loss) and is skipped by the backward; nothing is out of bounds.
TEST(CudaEmbedding, OutOfVocabularyTokensArePoisonedNotReadOutOfBounds) {
  THPC_REQUIRE_GPU();
  std::mt19937 rng(11);
  const int d = 5, vocab = 4, length = 4, rows = 4;
  const std::vector<int32_t> tokens = {1, -1, vocab, 2};
  Twins twins(DType::F32);
  Scope gpu(*twins.gpu);
  int32_t* ids = gpu.put_ids(tokens);
  const std::vector<float> table_host = random_values(static_cast<size_t>(vocab) * d, rng);
  Tensor table = gpu.put(DType::F32, table_host);
  Tensor out = gpu.put(DType::F32, std::vector<float>(static_cast<size_t>(rows) * d, 0.0f));
  twins.gpu->embedding_forward(out, ids, table, Tensor{}, rows, length, d, vocab, 2.0f);
  const std::vector<float> got = gpu.get(out);
  for (int r = 0; r < rows; ++r) {
    for (int c = 0; c < d; ++c) {
      const float value = got[static_cast<size_t>(r) * d + c];
      if (r == 1 || r == 2) {
        EXPECT_TRUE(std::isnan(value)) << "row " << r;
      } else {
        EXPECT_EQ(value, table_host[static_cast<size_t>(tokens[r]) * d + c] * 2.0f) << "row " << r;
      }
    }
  }
  const std::vector<float> d_out_host = random_values(static_cast<size_t>(rows) * d, rng);
  Tensor d_out = gpu.put(DType::F32, d_out_host);
  Tensor d_table = gpu.put(DType::F32, table_host);
  twins.gpu->embedding_backward(d_table, Tensor{}, d_out, ids, rows, length, d, vocab, 2.0f);
  std::vector<float> expected = table_host;
  for (int r : {0, 3}) {
    for (int c = 0; c < d; ++c) {
      expected[static_cast<size_t>(tokens[r]) * d + c] += d_out_host[static_cast<size_t>(r) * d + c] * 2.0f;
    }
  }
  EXPECT_TRUE(all_close(gpu.get(d_table), expected, 0.0, 0.0));
}

}  // namespace
}  // namespace thpc::test
