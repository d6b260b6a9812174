// A CUDA backend with the decoder's weight matrices multiplied in int8 by cuBLASLt:
// transformer_decode --compute-type int8 on a GPU, CTranslate2's int8_bfloat16 (its
// int8_float16 with bf16 for fp16). Its twins (CudaInt8Products.*) passed on an H200 on
// 2026-11-29 (issue 53), when it stopped being the candidate int8_products.
//
// The arithmetic is the CPU's int8 path (kernels/cpu/int8_matmul.h) with signed
// activations, which the GPU's int8 tensor cores multiply directly: for y = x W + b with
// x [M, K] and W [K, N],
//   weights     s_n = max_k |W[k, n]| / 127, Wq[k, n] = round(W[k, n] / s_n) (quantized
//               once, on the host: cpu::quantize_weights, or a quantized checkpoint's)
//   activations s_m = max_k |x[m, k]| / 127, xq[m, k] = round(x[m, k] * (127 / max)) in
//               [-127, 127], rounded to nearest even (a kernel per product)
//   product     acc[m, n] = sum_k xq[m, k] Wq[k, n] (int32, exact: cuBLASLt, int8 in,
//               int32 out; cublasGemmEx where its heuristic offers no kernel)
//   result      y[m, n] = float(acc) * (s_m * s_n) + b[n], max(0, .) for the FFN's first
//               layer, stored in the backend's compute type.
// The CPU's u8 activations with zero point 128 give the same integers (acc - 128 c[n]),
// so on the same x the CPU path and this one agree up to the rounding of the float
// epilogue (and bf16's rounding of the stored y): what the twin tests hold them to. A
// row holding a NaN or an infinity gives NaN (the ReLU: 0), as on the CPU.
//
// Every other op (attention, layer norms, the softmax and top-k, the embedding lookup)
// is the inner CUDA backend's, in its compute type; the weights stay in the model too
// (the embedding lookup reads them). Only for decoding, as Int8CpuBackend.
//
// Captured decoding steps (candidate step_graphs, Transformer::decode_step): the products
// are stream work like the other ops (the row quantization, cuBLASLt's or cublasGemmEx's
// product with the handle's fixed workspace, the dequantization), so the inner backend's
// graph of a step holds them. What a replay reads stays put or is noticed: the int8
// matrices live until the backend ends and free through Context::count_free, and the
// products' buffers are the Context's scratch, whose growth is a counted free, so a graph
// taken before it is refused (Context::frees). A shape's first step runs uncaptured and
// makes its cuBLASLt plan (host objects) before any capture.
//
// Why cuBLASLt: it is the library with Hopper's int8 tensor-core kernels (the IMMA
// "TN" case: both operands K-major, which is why Wq is kept as [N, K]), maintained with
// the toolkit; the project already plans its bf16 GEMMs with it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "kernels/cpu/int8_matmul.h"
#include "kernels/int8_products_backend.h"

namespace thpc {

namespace cuda {
class Context;
}

// Wq [N, K] and s_n [N] of one weight matrix in the device memory of the backend's Context
// (counted in its peak), freed with it (kernels/cuda/int8_cuda_backend.cu).
struct Int8CudaMatrix {
  int input_count = 0, output_count = 0;  // K, N
  int8_t* values = nullptr;
  float* scales = nullptr;
  cuda::Context* context = nullptr;
  size_t bytes = 0;
  int inputs() const { return input_count; }
  int outputs() const { return output_count; }
  Int8CudaMatrix() = default;
  Int8CudaMatrix(const Int8CudaMatrix&) = delete;
  Int8CudaMatrix& operator=(const Int8CudaMatrix&) = delete;
  ~Int8CudaMatrix();
};

class Int8CudaBackend final : public Int8ProductsBackend<Int8CudaMatrix> {
 public:
  // `cuda_backend`: what make_cuda_backend made (bf16 or fp32 compute).
  explicit Int8CudaBackend(std::unique_ptr<Backend> cuda_backend);
  ~Int8CudaBackend() override;

  // From now on, products with `weights` (the model's compute tensor of a weight matrix:
  // what the product ops are handed, found by its address) run in int8 with `quantized`
  // (K inputs, N outputs, values within +-127). False, and the float product kept, when
  // K or N is not a multiple of 4 (what cuBLAS's int8 kernels take: a vocabulary of
  // another size).
  bool adopt(Tensor weights, const cpu::QuantizedWeights& quantized);

 protected:
  void multiply(Tensor y, Tensor x, const Int8CudaMatrix& matrix, Tensor b, int M,
                bool relu) override;

 private:
  std::unique_ptr<Backend> cuda_backend_;
};

}  // namespace thpc
