// The FFN's path with the ReLU kept as a mask (Backend::relu_mask_words > 0: a GPU with the
// candidate relu_masks), run on the CPU through a stand-in backend that asks for masks:
// Sublayers::ffn_forward then keeps one per training pass (linear_relu_mask_forward) and
// ffn_backward takes linear_relu_backward and the first layer's bias gradient from
// linear_backward. The CPU's twins compose the same arithmetic as the fused ops
// (relu_bias_backward's d_pre and its column sums in row order), so training through the
// masked path must equal training through the fused ops bit for bit; the GPU's twins
// (CudaCandidateReluMasks.*) hold its epilogues to the CPU's.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "captured_steps.h"
#include "kernels/capturing_backend.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/forwarding_backend.h"
#include "model/transformer.h"

namespace thpc {
namespace {

constexpr int kVocab = 23;

// Asks for the GPU's mask size and counts the masked ops; the CPU's twins do the work.
class MaskKeepingBackend : public ForwardingBackend {
 public:
  using ForwardingBackend::ForwardingBackend;
  int64_t relu_mask_words(int rows, int n) const override {
    return (static_cast<int64_t>(n) + 127) / 128 * 4 * rows;
  }
  void linear_relu_mask_forward(Tensor y, uint32_t* mask, Tensor x, Tensor W, Tensor b, int M,
                                int K, int N) override {
    EXPECT_NE(mask, nullptr);
    ++masked_forwards;
    inner().linear_relu_mask_forward(y, mask, x, W, b, M, K, N);
  }
  void linear_relu_backward(Tensor d_pre, Tensor dW, Tensor db, Tensor dy, Tensor y,
                            const uint32_t* mask, Tensor W, int M, int K, int N) override {
    EXPECT_NE(mask, nullptr);
    ++masked_backwards;
    inner().linear_relu_backward(d_pre, dW, db, dy, y, mask, W, M, K, N);
  }
  void relu_bias_backward(Tensor d_pre, Tensor db, Tensor dy, Tensor y, int rows, int n,
                          GradStore store) override {
    ++fused_relu_backwards;
    inner().relu_bias_backward(d_pre, db, dy, y, rows, n, store);
  }
  int masked_forwards = 0, masked_backwards = 0, fused_relu_backwards = 0;
};

// Six steps of two micro-batches over three shapes, post- and pre-norm: every FFN of
// every pass through the masked ops (2 + 2 layers a pass, 2 passes a step), none through
// relu_bias_backward, and the same losses, norms and parameters as the fused ops give.
TEST(ReluMasks, TrainingThroughTheMaskedOpsIsTheFusedOpsBitForBit) {
  const std::vector<Batch> batches = test::batches_of_shapes(3, 12, kVocab, 10, 41);
  for (const char* norm : {"post", "pre"}) {
    SCOPED_TRACE(norm);
    const ModelConfig config = test::small_model(norm);
    auto plain = make_cpu_backend(DType::F32);
    auto inner = make_cpu_backend(DType::F32);
    MaskKeepingBackend masking(*inner);
    const test::StepsRun expected =
        test::run_training_steps(*plain, config, kVocab, batches, 6, 2, 3, 5);
    const test::StepsRun masked =
        test::run_training_steps(masking, config, kVocab, batches, 6, 2, 3, 5);
    test::expect_same_steps(masked, expected);
    EXPECT_EQ(masking.masked_forwards, 6 * 2 * (2 + 2));
    EXPECT_EQ(masking.masked_backwards, 6 * 2 * (2 + 2));
    EXPECT_EQ(masking.fused_relu_backwards, 0);
  }
}

// Nine steps of `config` over `batches` on the plain CPU backend (`expected`), and through
// a mask-keeping backend under the CPU's stand-in for graphs (`captured`), with the
// stand-ins' counts.
struct CapturedThroughMasks {
  test::StepsRun expected, captured;
  int masked_forwards = 0, masked_backwards = 0, fused_relu_backwards = 0;
  std::string last_refusal;
};
CapturedThroughMasks run_captured_through_masks(const ModelConfig& config,
                                                const std::vector<Batch>& batches) {
  auto plain = make_cpu_backend(DType::F32);
  auto inner = make_cpu_backend(DType::F32);
  MaskKeepingBackend masking(*inner);
  CapturingBackend capturing(masking);
  CapturedThroughMasks run;
  run.expected = test::run_training_steps(*plain, config, kVocab, batches, 9, 2, 3, 5);
  run.captured = test::run_training_steps(capturing, config, kVocab, batches, 9, 2, 3, 5);
  run.masked_forwards = masking.masked_forwards;
  run.masked_backwards = masking.masked_backwards;
  run.fused_relu_backwards = masking.fused_relu_backwards;
  run.last_refusal = capturing.last_refusal();
  return run;
}

// A captured pass holds the masked ops with their masks' addresses (in the pass's arena,
// as its other activations): through the CPU's stand-in for graphs, the same steps again.
TEST(ReluMasks, CapturedPassesKeepTheirMasks) {
  const CapturedThroughMasks run = run_captured_through_masks(
      test::small_model("post"), test::batches_of_shapes(3, 12, kVocab, 10, 42));
  test::expect_same_steps(run.captured, run.expected);
  EXPECT_GT(run.captured.counts.replays, 0);
  EXPECT_EQ(run.captured.counts.refused, 0) << run.last_refusal;
  EXPECT_GT(run.masked_backwards, 0);
}

// With model.activation_dropout the ReLU's mask is not kept (W2's input is the dropped
// hidden layer, whose gradient must pass through the dropout before the ReLU): a backend
// that keeps masks trains through relu_bias_backward, as the CPU does, bit for bit; and
// captured passes (the new dropout site's key read from the step's inputs, as the
// others') replay the same steps as uncaptured ones.
TEST(ReluMasks, ActivationDropoutTakesTheUnmaskedPathCapturedOrNot) {
  const std::vector<Batch> batches = test::batches_of_shapes(3, 12, kVocab, 10, 43);
  ModelConfig config = test::small_model("post");
  config.activation_dropout = 0.2f;
  const CapturedThroughMasks run = run_captured_through_masks(config, batches);
  test::expect_same_steps(run.captured, run.expected);
  EXPECT_GT(run.captured.counts.replays, 0);
  EXPECT_EQ(run.captured.counts.refused, 0) << run.last_refusal;
  EXPECT_EQ(run.masked_forwards, 0);
  EXPECT_EQ(run.masked_backwards, 0);
  EXPECT_GT(run.fused_relu_backwards, 0);
  // And the rate matters: the same steps without it train otherwise.
  config.activation_dropout = 0.0f;
  auto plain = make_cpu_backend(DType::F32);
  const test::StepsRun without =
      test::run_training_steps(*plain, config, kVocab, batches, 9, 2, 3, 5);
  EXPECT_NE(without.params, run.expected.params);
}

}  // namespace
}  // namespace thpc
