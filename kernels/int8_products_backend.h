// What the two int8 decoding backends share (Int8CpuBackend, kernels/cpu/int8_backend.h;
// Int8CudaBackend, kernels/cuda/int8_cuda_backend.h): a ForwardingBackend whose three
// forward products (linear, linear + ReLU, the tied output projection) take the int8
// path when their weight tensor has an int8 copy, found by the tensor's address, and the
// inner backend's float path otherwise. Each backend says how it keeps a copy (Matrix,
// with inputs() and outputs()) and how it multiplies with one (multiply).
//
// Only for decoding: the products' backward stays float, and quantized weights that change
// afterwards would not be seen (nothing changes a decoding model's weights).
#pragma once

#include <memory>
#include <string>
#include <unordered_map>
#include <unordered_set>

#include "common/error.h"
#include "kernels/forwarding_backend.h"

namespace thpc {

template <class Matrix>
class Int8ProductsBackend : public ForwardingBackend {
 public:
  using ForwardingBackend::ForwardingBackend;

  std::string name() const override { return inner().name() + "+int8"; }
  // Capturing is each backend's to say (Backend::capture): the GPU's products are stream
  // work that its inner backend's graphs hold; the CPU's run on the host as they are
  // called, so it refuses.
  // How many matrices have an int8 copy.
  int quantized_matrices() const { return static_cast<int>(matrices_.size()); }
  // How many of them a product has taken in int8 since they were kept: all of them once
  // the model has scored a step. A product op this class does not override passes its
  // weights on in float, silently; a matrix only such an op multiplies stays out of this
  // count (CapturedDecodingSteps.EveryQuantizedMatrixIsMultipliedInInt8 decodes to see).
  int matrices_multiplied() const { return static_cast<int>(multiplied_.size()); }

  void linear_forward(Tensor y, Tensor x, Tensor W, Tensor b, int M, int K, int N) override {
    if (const Matrix* matrix = find(W, K, N)) return multiply(y, x, *matrix, b, M, false);
    inner().linear_forward(y, x, W, b, M, K, N);
  }
  void linear_relu_forward(Tensor y, Tensor x, Tensor W, Tensor b, int M, int K,
                           int N) override {
    if (const Matrix* matrix = find(W, K, N)) return multiply(y, x, *matrix, b, M, true);
    inner().linear_relu_forward(y, x, W, b, M, K, N);
  }
  // logits = h E^T with E [vocab, d]: its int8 copy is that of a d x vocab product,
  // quantized per vocabulary row (the output channel).
  void output_projection_forward(Tensor logits, Tensor h, Tensor E, int M, int d,
                                 int vocab) override {
    if (const Matrix* matrix = find(E, d, vocab)) {
      return multiply(logits, h, *matrix, Tensor{}, M, false);
    }
    inner().output_projection_forward(logits, h, E, M, d, vocab);
  }

 protected:
  // y [M, outputs] = x [M, inputs] times `matrix`, + b when b is not null, max(0, .) with
  // relu.
  virtual void multiply(Tensor y, Tensor x, const Matrix& matrix, Tensor b, int M,
                        bool relu) = 0;
  // From now on, products with `weights` take `matrix`.
  void keep(const Tensor& weights, std::unique_ptr<Matrix> matrix) {
    matrices_[weights.data] = std::move(matrix);
    multiplied_.erase(weights.data);
  }
  const std::unordered_map<const void*, std::unique_ptr<Matrix>>& matrices() const {
    return matrices_;
  }
  void forget_matrices() {
    matrices_.clear();
    multiplied_.clear();
  }

 private:
  // The int8 copy of `weights` when it has one; null otherwise. A copy of other sizes is
  // a caller's error (a view of a quantized matrix with other shapes).
  const Matrix* find(const Tensor& weights, int inputs, int outputs) const {
    const auto found = matrices_.find(weights.data);
    if (found == matrices_.end()) return nullptr;
    const Matrix& matrix = *found->second;
    THPC_CHECK(matrix.inputs() == inputs && matrix.outputs() == outputs,
               "a product of " << inputs << " x " << outputs << " with int8 weights of "
                               << matrix.inputs() << " x " << matrix.outputs());
    multiplied_.insert(weights.data);
    return &matrix;
  }

  std::unordered_map<const void*, std::unique_ptr<Matrix>> matrices_;
  // The matrices find() has handed to a product (a backend is one thread's).
  mutable std::unordered_set<const void*> multiplied_;
};

}  // namespace thpc
