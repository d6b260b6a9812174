// The CPU backend with some weight matrices multiplied in int8 (kernels/cpu/int8_matmul.h):
// transformer_decode --compute-type int8. Every op passes on to the float CPU backend it
// owns, except the three forward products, which take the int8 path when their weight
// tensor was handed to quantize() and the float path otherwise. The weights stay in the
// model in float (the embedding lookup reads them); quantize() keeps an int8 copy beside
// them, found by the tensor's address, so the model and its ops are those of the float
// decode.
//
// Only for decoding: the products' backward stays float, and quantized weights that
// change afterwards would not be seen (nothing changes a decoding model's weights).
#pragma once

#include <memory>
#include <string>
#include <unordered_map>

#include "kernels/cpu/int8_matmul.h"
#include "kernels/forwarding_backend.h"

namespace thpc {

class Int8CpuBackend final : public ForwardingBackend {
 public:
  // `float_backend`: a CPU backend computing in fp32 (make_cpu_backend()).
  explicit Int8CpuBackend(std::unique_ptr<Backend> float_backend);
  ~Int8CpuBackend() override;

  std::string name() const override { return inner().name() + "+int8"; }

  // From now on, products with `weights` (a [inputs, outputs] or [outputs, inputs] matrix
  // as `layout` says, in this backend's memory) run in int8.
  void quantize(Tensor weights, int inputs, int outputs, cpu::WeightLayout layout);
  // The same with weights quantized before (a quantized checkpoint's), for products with
  // `weights` (their dequantized values in the model, which the embedding lookup reads).
  void adopt(Tensor weights, const cpu::QuantizedWeights& quantized);
  // How many matrices and values quantize() has taken.
  int quantized_matrices() const { return static_cast<int>(matrices_.size()); }
  int64_t quantized_values() const;

  void linear_forward(Tensor y, Tensor x, Tensor W, Tensor b, int M, int K, int N) override;
  void linear_relu_forward(Tensor y, Tensor x, Tensor W, Tensor b, int M, int K,
                           int N) override;
  void output_projection_forward(Tensor logits, Tensor h, Tensor E, int M, int d,
                                 int vocab) override;

 private:
  // The int8 copy of `weights` when it has one for these sizes; null otherwise. A copy
  // of other sizes is a caller's error (a view of a quantized matrix with other shapes).
  const cpu::QuantizedMatrix* find(const Tensor& weights, int inputs, int outputs) const;

  std::unique_ptr<Backend> float_backend_;
  std::unordered_map<const void*, std::unique_ptr<cpu::QuantizedMatrix>> matrices_;
};

}  // namespace thpc
