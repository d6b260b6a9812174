// transformer_decode --compute-type: the arithmetic a decode runs in, named as
// CTranslate2 names its compute types where they mean the same.
//
//   default   the checkpoint's train.precision (bf16 on a GPU; the CPU computes in fp32)
//   float32   fp32 everywhere
//   bfloat16  bf16 activations and weights (a GPU's)
//   int8      the CPU: every weight matrix (the layers' projections and feed-forward
//             layers, and the tied embedding as the output projection) in int8 with a
//             scale per output channel, activations quantized per row at run time,
//             products by oneDNN (kernels/cpu/int8_matmul.h); attention, layer norms,
//             the softmax and top-k in fp32. CTranslate2's int8 (its int8_float32).
//             On a GPU: the same weights through cuBLASLt's int8 GEMMs, the other ops in
//             bf16 (kernels/cuda/int8_cuda_backend.h; CTranslate2's int8_float16 with
//             bf16), checked on an H200 on 2026-11-29.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "config/config.h"
#include "kernels/ops.h"

namespace thpc {

class Transformer;

enum class ComputeType { kDefault, kFloat32, kBfloat16, kInt8 };

// The type a name gives; an unknown name is an Error listing the names.
ComputeType parse_compute_type(const std::string& name);
const char* compute_type_name(ComputeType type);

// The backend of one decoding worker for `type`, from the checkpoint's [train] settings
// (train.backend, train.threads; train.precision unless the type says otherwise). A type
// the device cannot run is an Error saying what to do instead. capture_steps: on a GPU,
// the decoding steps captured into CUDA graphs (CudaKernelChoice::capture_decoding_steps),
// whatever train.cuda_kernels says of step_graphs (its training half).
std::unique_ptr<Backend> make_decoding_backend(const TrainConfig& train, ComputeType type,
                                               bool capture_steps = false);

// The Error make_decoding_backend would give for a `type` this machine cannot run
// (bfloat16 on the CPU, int8 without int8 products), before anything is read or said:
// a quantized checkpoint's note on the compute type came before the refusal of it.
void check_compute_type_runs_here(const TrainConfig& train, ComputeType type);

// int8: hands the model's weight matrices (product_weights()) to its int8 backend, once,
// after the checkpoint is loaded: those `stored` in int8 (a quantized checkpoint's) as
// they are, where this CPU's products take 8-bit weights, the others quantized now.
// `backend` is what make_decoding_backend made; other backends are left alone (nothing
// counted).
struct QuantizedCount {
  int quantized = 0;  // quantized at load
  int stored = 0;     // taken from the checkpoint
  // Stored in 8 bits where this CPU's products take 7: quantized again from their
  // dequantized values (counted in `quantized`).
  int requantized = 0;
  // On a GPU: matrices whose sizes cuBLAS's int8 kernels cannot take (K or N not a
  // multiple of 4), multiplied in the backend's float type instead (not in the others).
  int kept_in_float = 0;
};
QuantizedCount quantize_model_weights(Transformer& model, Backend& backend,
                                      const std::vector<QuantizedTensor>& stored = {});

// What multiplies in int8 on `backend` (make_decoding_backend's), for the start-up line:
// "oneDNN 2.6.3, avx512_core_vnni, 8-bit weights" on the CPU, cuBLASLt's on a GPU.
std::string int8_products_description(const Backend& backend);

// A quantized checkpoint of `source` (transformer_quantize): every weight matrix of
// product_weights() in int8 with a scale per output channel (8-bit: +-127, what a CPU
// with VNNI multiplies; one without quantizes them to 7 bits again at load), the other
// parameters (biases, norms, learned positions) in fp32, parameters only. Its `params`
// hold the dequantized values. `source` must hold a float model.
Checkpoint quantize_checkpoint(const Checkpoint& source);

}  // namespace thpc
