// The CPU ops spread their loops over OpenMP threads (kernels/cpu/parallel.h) and share
// that team with BLAS. The ops' loops give the same bits with any number of threads.
// The matrix products' libraries do not promise that (OpenBLAS and oneDNN cut a product
// into other blocks for another thread count, which moves the last bits), so the
// comparison holds the products at one thread.
#include <gtest/gtest.h>

#include <cblas.h>

#include <cstdint>
#include <random>
#include <vector>

#include "data/batch.h"
#include "kernels/cpu/blas.h"
#include "kernels/cpu/cpu_backend.h"
#include "model/transformer.h"

namespace thpc {
namespace {

// Large enough that every op's loop clears kParallelMinWork (rows x width >= 2^15):
// 24 sentences of 40 tokens, d_model 64, vocabulary 500.
ModelConfig threaded_model() {
  ModelConfig c;
  c.layers = 2;
  c.d_model = 64;
  c.d_ff = 128;
  c.heads = 4;
  c.d_k = 16;
  c.d_v = 16;
  c.dropout = 0.1f;
  c.attention_dropout = 0.1f;
  c.label_smoothing = 0.1f;
  c.max_positions = 64;
  return c;
}

Batch random_batch(int vocab) {
  std::mt19937 rng(11);
  std::uniform_int_distribution<int32_t> id(4, vocab - 1), length(20, 40);
  std::vector<TokenSequence> sources, targets;
  for (int s = 0; s < 24; ++s) {
    TokenSequence source(length(rng)), target(length(rng));
    for (int32_t& t : source) t = id(rng);
    for (int32_t& t : target) t = id(rng);
    sources.push_back(source);
    targets.push_back(target);
  }
  return make_batch(sources, targets, SpecialIds{});
}

struct StepResult {
  LossSums sums;
  std::vector<float> grads;
};

StepResult train_step_with_op_threads(int threads) {
  set_cpu_threads(threads);
  cpu::set_gemm_threads(1);  // only the ops' loops vary
  constexpr int kVocab = 500;
  auto backend = make_cpu_backend(DType::F32);
  Transformer model(threaded_model(), kVocab, SpecialIds{}, *backend, 5);
  backend->zero(model.params().grads());
  DropoutContext dropout;
  dropout.seed = 9;
  dropout.step = 1;
  StepResult result;
  result.sums = model.train_step(random_batch(kVocab), 1.0f / 500.0f, dropout);
  result.grads.resize(model.params().grads().numel);
  backend->download(result.grads.data(), model.params().grads());
  return result;
}

TEST(CpuThreads, OpenBlasIsTheOpenMpBuild) {
  // 2 = OpenMP (0 sequential, 1 pthreads): the build links OpenBLAS's OpenMP variant so
  // that BLAS and the ops share one team (CMakeLists.txt).
  EXPECT_EQ(openblas_get_parallel(), 2) << "linked against the wrong OpenBLAS variant";
}

TEST(CpuThreads, ATrainingStepIsTheSameBitsWhateverTheOpsThreads) {
  const StepResult one = train_step_with_op_threads(1);
  const StepResult two = train_step_with_op_threads(2);
  const StepResult three = train_step_with_op_threads(3);  // more threads than cores here
  set_cpu_threads(1);
  ASSERT_GT(one.sums.tokens, 0);
  EXPECT_EQ(one.sums.loss, two.sums.loss);
  EXPECT_EQ(one.sums.nll, two.sums.nll);
  EXPECT_EQ(one.sums.loss, three.sums.loss);
  ASSERT_EQ(one.grads.size(), two.grads.size());
  int64_t nonzero = 0, differing_two = 0, differing_three = 0;
  for (size_t i = 0; i < one.grads.size(); ++i) {
    nonzero += one.grads[i] != 0.0f ? 1 : 0;
    differing_two += one.grads[i] != two.grads[i] ? 1 : 0;
    differing_three += one.grads[i] != three.grads[i] ? 1 : 0;
  }
  EXPECT_GT(nonzero, static_cast<int64_t>(one.grads.size() / 2));  // a real gradient
  EXPECT_EQ(differing_two, 0);
  EXPECT_EQ(differing_three, 0);
}

}  // namespace
}  // namespace thpc
