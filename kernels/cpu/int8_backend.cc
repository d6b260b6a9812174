#include "kernels/cpu/int8_backend.h"

#include "common/error.h"

namespace thpc {

Int8CpuBackend::Int8CpuBackend(std::unique_ptr<Backend> float_backend)
    : Int8ProductsBackend(*float_backend), float_backend_(std::move(float_backend)) {
  THPC_CHECK(float_backend_->host_memory() && float_backend_->compute_dtype() == DType::F32,
             "int8 products need the fp32 CPU backend underneath, not "
                 << float_backend_->name());
  THPC_CHECK(cpu::int8_available(), "int8 products: " << cpu::int8_description());
}

Int8CpuBackend::~Int8CpuBackend() = default;

void Int8CpuBackend::quantize(Tensor weights, int inputs, int outputs,
                              cpu::WeightLayout layout) {
  THPC_CHECK(weights.dtype == DType::F32 &&
                 weights.numel == static_cast<int64_t>(inputs) * outputs,
             "quantize: a " << dtype_name(weights.dtype) << " tensor of " << weights.numel
                            << " values is not a " << inputs << " x " << outputs
                            << " fp32 matrix");
  keep(weights, std::make_unique<cpu::QuantizedMatrix>(static_cast<const float*>(weights.data),
                                                      inputs, outputs, layout));
}

void Int8CpuBackend::adopt(Tensor weights, const cpu::QuantizedWeights& quantized) {
  THPC_CHECK(weights.dtype == DType::F32 &&
                 weights.numel == static_cast<int64_t>(quantized.inputs) * quantized.outputs,
             "adopt: a " << dtype_name(weights.dtype) << " tensor of " << weights.numel
                         << " values for int8 weights of " << quantized.inputs << " x "
                         << quantized.outputs);
  keep(weights, std::make_unique<cpu::QuantizedMatrix>(quantized));
}

int64_t Int8CpuBackend::quantized_values() const {
  int64_t values = 0;
  for (const auto& [address, matrix] : matrices()) {
    values += static_cast<int64_t>(matrix->inputs()) * matrix->outputs();
  }
  return values;
}

void Int8CpuBackend::multiply(Tensor y, Tensor x, const cpu::QuantizedMatrix& matrix, Tensor b,
                              int M, bool relu) {
  matrix.multiply(static_cast<float*>(y.data), static_cast<const float*>(x.data),
                  static_cast<const float*>(b.data), M, relu);
}

}  // namespace thpc
