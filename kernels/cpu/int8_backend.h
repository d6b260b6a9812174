// The CPU backend with some weight matrices multiplied in int8 (kernels/cpu/int8_matmul.h):
// transformer_decode --compute-type int8. Every op passes on to the float CPU backend it
// owns, except the three forward products, which take the int8 path when their weight
// tensor was handed to quantize() (or adopt()) and the float path otherwise
// (Int8ProductsBackend, shared with the GPU's). The weights stay in the model in float (the
// embedding lookup reads them); quantize() keeps an int8 copy beside them, so the model
// and its ops are those of the float decode.
#pragma once

#include <functional>
#include <memory>

#include "kernels/cpu/int8_matmul.h"
#include "kernels/int8_products_backend.h"

namespace thpc {

class Int8CpuBackend final : public Int8ProductsBackend<cpu::QuantizedMatrix> {
 public:
  // `float_backend`: a CPU backend computing in fp32 (make_cpu_backend()).
  explicit Int8CpuBackend(std::unique_ptr<Backend> float_backend);
  ~Int8CpuBackend() override;

  // From now on, products with `weights` (a [inputs, outputs] or [outputs, inputs] matrix
  // as `layout` says, in this backend's memory) run in int8.
  void quantize(Tensor weights, int inputs, int outputs, cpu::WeightLayout layout);
  // The same with weights quantized before (a quantized checkpoint's), for products with
  // `weights` (their dequantized values in the model, which the embedding lookup reads).
  void adopt(Tensor weights, const cpu::QuantizedWeights& quantized);
  // How many values quantize() has taken.
  int64_t quantized_values() const;
  // Its products run on the host when they are called, outside anything the inner
  // backend records: a capture by the inner one would replay the step without them.
  // (CapturedDecodingSteps.* wraps this backend in the stand-in instead: the products are
  // then recorded with the step's other ops.)
  bool can_capture(CaptureUse /*use*/) const override { return false; }
  std::unique_ptr<CapturedWork> capture(const std::function<void()>&) override { return nullptr; }

 protected:
  void multiply(Tensor y, Tensor x, const cpu::QuantizedMatrix& matrix, Tensor b, int M,
                bool relu) override;

 private:
  std::unique_ptr<Backend> float_backend_;
};

}  // namespace thpc
