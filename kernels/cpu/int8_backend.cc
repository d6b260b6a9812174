#include "kernels/cpu/int8_backend.h"

#include "common/error.h"

namespace thpc {

Int8CpuBackend::Int8CpuBackend(std::unique_ptr<Backend> float_backend)
    : ForwardingBackend(*float_backend), float_backend_(std::move(float_backend)) {
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
  matrices_[weights.data] = std::make_unique<cpu::QuantizedMatrix>(
      static_cast<const float*>(weights.data), inputs, outputs, layout);
}

void Int8CpuBackend::adopt(Tensor weights, const cpu::QuantizedWeights& quantized) {
  THPC_CHECK(weights.dtype == DType::F32 &&
                 weights.numel == static_cast<int64_t>(quantized.inputs) * quantized.outputs,
             "adopt: a " << dtype_name(weights.dtype) << " tensor of " << weights.numel
                         << " values for int8 weights of " << quantized.inputs << " x "
                         << quantized.outputs);
  matrices_[weights.data] = std::make_unique<cpu::QuantizedMatrix>(quantized);
}

int64_t Int8CpuBackend::quantized_values() const {
  int64_t values = 0;
  for (const auto& [address, matrix] : matrices_) {
    values += static_cast<int64_t>(matrix->inputs()) * matrix->outputs();
  }
  return values;
}

const cpu::QuantizedMatrix* Int8CpuBackend::find(const Tensor& weights, int inputs,
                                                 int outputs) const {
  const auto found = matrices_.find(weights.data);
  if (found == matrices_.end()) return nullptr;
  const cpu::QuantizedMatrix& matrix = *found->second;
  THPC_CHECK(matrix.inputs() == inputs && matrix.outputs() == outputs,
             "a product of " << inputs << " x " << outputs << " with weights quantized as "
                             << matrix.inputs() << " x " << matrix.outputs());
  return &matrix;
}

void Int8CpuBackend::linear_forward(Tensor y, Tensor x, Tensor W, Tensor b, int M, int K,
                                    int N) {
  if (const cpu::QuantizedMatrix* matrix = find(W, K, N)) {
    matrix->multiply(static_cast<float*>(y.data), static_cast<const float*>(x.data),
                     static_cast<const float*>(b.data), M, false);
  } else {
    inner().linear_forward(y, x, W, b, M, K, N);
  }
}

void Int8CpuBackend::linear_relu_forward(Tensor y, Tensor x, Tensor W, Tensor b, int M,
                                         int K, int N) {
  if (const cpu::QuantizedMatrix* matrix = find(W, K, N)) {
    matrix->multiply(static_cast<float*>(y.data), static_cast<const float*>(x.data),
                     static_cast<const float*>(b.data), M, true);
  } else {
    inner().linear_relu_forward(y, x, W, b, M, K, N);
  }
}

void Int8CpuBackend::output_projection_forward(Tensor logits, Tensor h, Tensor E, int M,
                                               int d, int vocab) {
  if (const cpu::QuantizedMatrix* matrix = find(E, d, vocab)) {
    matrix->multiply(static_cast<float*>(logits.data), static_cast<const float*>(h.data),
                     nullptr, M, false);
  } else {
    inner().output_projection_forward(logits, h, E, M, d, vocab);
  }
}

}  // namespace thpc
