// Int8 matrix products for decoding on the CPU (transformer_decode --compute-type int8),
// after CTranslate2's int8 path: weights quantized once per output channel, activations
// per row at run time, the product in integers by oneDNN, dequantized in one pass with
// the bias (and the FFN's ReLU) on the way out.
//
// For y = x W + b with x [M, K] and W [K, N]:
//   weights     s_n = max_k |W[k, n]| / L,  Wq[k, n] = round(W[k, n] / s_n) in [-L, L]
//   activations s_m = max_k |x[m, k]| / 127, xq[m, k] = round(x[m, k] / s_m) + 128
//               in [1, 255] (unsigned: the u8 x s8 products VNNI's vpdpbusd multiplies)
//   product     acc[m, n] = sum_k xq[m, k] Wq[k, n] (int32, exact: oneDNN's matmul)
//   result      y[m, n] = (acc[m, n] - 128 c[n]) * (s_m * s_n) + b[n],
//               c[n] = sum_k Wq[k, n] (the zero point's share, computed once)
// and max(0, y) for the FFN's first layer. A row or column of zeros has scale 0 and gives
// y = b exactly; a row holding a NaN or an infinity gives NaN (the ReLU: 0), as fp32
// does, rather than a finite wrong row.
//
// L is 127 where the CPU multiplies u8 x s8 into int32 directly (AVX-512 VNNI, AVX-VNNI,
// AMX) and 63 elsewhere: AVX2's and plain AVX-512's vpmaddubsw add two u8 x s8 products
// into a saturating int16, and 255 * 127 * 2 exceeds 32,767 while 255 * 63 * 2 does not
// (oneDNN's documentation of int8 computations asks for 7-bit weights there). Which of the
// two a machine does is asked of oneDNN's kernel once, with a product that saturates
// only in int16 (int8_matmul.cc, products_reach_int32_exactly). The error
// of one element is then at most s_m/2 sum_k |W| + s_n/2 sum_k |x| + K s_m s_n / 4 (plus
// the float rounding of the dequantization): tests/kernels/int8_matmul_test.cc checks it.
//
// oneDNN chooses the weights' memory layout for its kernels (blocked for brgemm on
// AVX-512); they are reordered into it once, at quantization. DNNL_MAX_CPU_ISA=AVX2 in
// the environment makes oneDNN (and L) behave as on an AVX2 machine.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace thpc::cpu {

// Whether this build has the int8 products (oneDNN found at configure time).
bool int8_available();
// "oneDNN 2.6.3, avx512_core_vnni, 8-bit weights" (or why there are none): for the
// start-up line of a quantized decode.
std::string int8_description();
// L above: 127 or 63.
int int8_weight_limit();

// How the float weights of y = x W lie in memory.
enum class WeightLayout {
  kInputsByOutputs,  // W [K, N] row-major: the linear layers' weights
  kOutputsByInputs,  // W^T [N, K] row-major: the tied embedding table E [vocab, d] of
                     // logits = h E^T (§3.4)
};

// Weights quantized as QuantizedMatrix quantizes them (the formulas above, with limit
// L), in plain memory: what a quantized checkpoint stores (transformer_quantize). Needs
// no oneDNN.
struct QuantizedWeights {
  int inputs = 0, outputs = 0;  // K and N
  std::vector<int8_t> values;   // Wq [K, N] row-major, in [-L, L]
  std::vector<float> scales;    // s_n [N]: W[k, n] ~ Wq[k, n] * s_n
};
QuantizedWeights quantize_weights(const float* weights, int inputs, int outputs,
                                  WeightLayout layout, int limit);

// One weight matrix in int8 with its per-output-channel scales, ready to multiply.
// Each instance keeps its oneDNN primitives, one per row count, made on first use: use
// one from one thread at a time (decoding's workers each have their own model). The
// scratch of the products (quantized rows, int32 results) is per thread, shared by the
// matrices a thread multiplies.
class QuantizedMatrix {
 public:
  QuantizedMatrix(const float* weights, int inputs, int outputs, WeightLayout layout);
  // Weights quantized before (a quantized checkpoint's), taken as they are: their values
  // must lie within +-int8_weight_limit() (an Error otherwise: 8-bit weights on a CPU
  // whose kernel saturates them).
  explicit QuantizedMatrix(const QuantizedWeights& weights);
  ~QuantizedMatrix();
  QuantizedMatrix(const QuantizedMatrix&) = delete;
  QuantizedMatrix& operator=(const QuantizedMatrix&) = delete;

  // y [rows, N] = x [rows, K] W + b (b [N] or null), then max(0, .) with relu.
  void multiply(float* y, const float* x, const float* b, int rows, bool relu) const;

  int inputs() const { return inputs_; }
  int outputs() const { return outputs_; }
  // s_n per output column, and c[n].
  const std::vector<float>& scales() const { return scales_; }
  const std::vector<int32_t>& column_sums() const { return column_sums_; }
  // Wq [K, N] row-major, read back from oneDNN's layout (for tests and the reference:
  // the matrix keeps only that layout, not a second plain copy).
  std::vector<int8_t> quantized_values() const;

 private:
  struct Kernel;  // oneDNN's objects
  int inputs_, outputs_;
  std::vector<float> scales_;
  std::vector<int32_t> column_sums_;
  std::unique_ptr<Kernel> kernel_;
};

// The activations' quantization of one row, as multiply() does it: xq[k] in [1, 255],
// returns s_m (0 for a row of zeros, whose xq are all 128; NaN for a row holding a NaN
// or an infinity, whose products are then NaN, as in fp32).
float quantize_row(const float* x, int count, uint8_t* xq);

// The dequantization of one product, as multiply() does it.
inline float dequantize(int32_t acc, int32_t column_sum, float row_scale, float column_scale,
                        float bias) {
  return static_cast<float>(acc - 128 * column_sum) * (row_scale * column_scale) + bias;
}

}  // namespace thpc::cpu
