#include "decode/compute_type.h"

#include <algorithm>

#include "backend/factory.h"
#include "common/error.h"
#include "kernels/cpu/int8_backend.h"
#include "model/transformer.h"

#if THPC_HAVE_CUDA
#include "kernels/cuda/int8_cuda_backend.h"
#endif

namespace thpc {

namespace {

constexpr const char* kNames = "default, float32, bfloat16 or int8";

}  // namespace

ComputeType parse_compute_type(const std::string& name) {
  if (name == "default") return ComputeType::kDefault;
  if (name == "float32") return ComputeType::kFloat32;
  if (name == "bfloat16") return ComputeType::kBfloat16;
  if (name == "int8") return ComputeType::kInt8;
  // CTranslate2's int8 variants name the arithmetic beside the int8 products; ours is
  // the device's (fp32 on the CPU, bf16 on a GPU): said, not guessed.
  if (name.rfind("int8_", 0) == 0) {
    THPC_FAIL("--compute-type '" << name << "': expected " << kNames << " (int8 computes "
              << "the rest in float32 on the CPU, as CTranslate2's int8_float32, and in "
              << "bfloat16 on a GPU, as its int8_bfloat16)");
  }
  THPC_FAIL("--compute-type '" << name << "': expected " << kNames);
}

const char* compute_type_name(ComputeType type) {
  switch (type) {
    case ComputeType::kDefault: return "default";
    case ComputeType::kFloat32: return "float32";
    case ComputeType::kBfloat16: return "bfloat16";
    case ComputeType::kInt8: return "int8";
  }
  return "?";
}

namespace {

// make_backend's choice: a GPU unless train.backend = cpu or none is usable.
bool decodes_on_a_gpu(const TrainConfig& train) {
  return train.backend != "cpu" && cuda_unavailable_reason().empty();
}

}  // namespace

void check_compute_type_runs_here(const TrainConfig& train, ComputeType type) {
  if (decodes_on_a_gpu(train)) return;
  if (type == ComputeType::kBfloat16) {
    THPC_FAIL("--compute-type bfloat16 needs a GPU, and this decode runs on the CPU: use "
              "float32 or int8 there");
  }
  if (type == ComputeType::kInt8 && !cpu::int8_available()) {
    THPC_FAIL("--compute-type int8: this transformer_decode has no int8 products: "
              << cpu::int8_description());
  }
}

std::unique_ptr<Backend> make_decoding_backend(const TrainConfig& checkpoint_train,
                                               ComputeType type, bool capture_steps) {
  TrainConfig train = checkpoint_train;
  const bool on_gpu = decodes_on_a_gpu(train);
  if (type == ComputeType::kFloat32) train.precision = "fp32";
  if (type == ComputeType::kBfloat16) train.precision = "bf16";
  // int8: the products' rows in fp32 on the CPU; on a GPU the other ops in bf16, as
  // CTranslate2's int8_float16 keeps them in fp16.
  if (type == ComputeType::kInt8) train.precision = on_gpu ? "bf16" : "fp32";
  BackendRequest request = backend_request(train, 0);
  // capture_steps alone says whether a decoding worker captures its steps: the candidate
  // step_graphs would capture them too, also where they must not be (several workers'
  // concurrent captures have not run on a GPU; --cuda-graphs off), and what it adds
  // beyond them is the training passes, which a decoder has none of.
  request.cuda_kernels.candidates &= ~static_cast<unsigned>(kStepGraphs);
  request.cuda_kernels.capture_decoding_steps = capture_steps;
  std::unique_ptr<Backend> backend = make_backend(request);
  if (type == ComputeType::kBfloat16 && backend->host_memory()) {
    THPC_FAIL("--compute-type bfloat16 needs a GPU, and this decode runs on the CPU ("
              << backend->name() << "): use float32 or int8 there");
  }
  if (type != ComputeType::kInt8) return backend;
  if (!backend->host_memory()) {
#if THPC_HAVE_CUDA
    return std::make_unique<Int8CudaBackend>(std::move(backend));
#else
    THPC_FAIL("a GPU backend in a build without CUDA");
#endif
  }
  if (!cpu::int8_available()) {
    THPC_FAIL("--compute-type int8: this transformer_decode has no int8 products: "
              << cpu::int8_description());
  }
  return std::make_unique<Int8CpuBackend>(std::move(backend));
}

namespace {

// The [cols, rows] transpose of `values` [rows, cols], row-major.
std::vector<int8_t> transposed(const std::vector<int8_t>& values, int64_t rows, int64_t cols) {
  std::vector<int8_t> result(values.size());
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) result[c * rows + r] = values[r * cols + c];
  }
  return result;
}

// A stored int8 parameter as the products take it: Wq [K, N] with s_n. A linear layer's
// W [in, out] is stored as it lies; the embedding E [vocab, d] (output_axis 0) is its
// transpose.
cpu::QuantizedWeights as_product_weights(const QuantizedTensor& tensor) {
  cpu::QuantizedWeights weights;
  weights.scales = tensor.scales;
  if (tensor.output_axis == 1) {
    weights.inputs = static_cast<int>(tensor.rows);
    weights.outputs = static_cast<int>(tensor.cols);
    weights.values = tensor.values;
    return weights;
  }
  weights.inputs = static_cast<int>(tensor.cols);
  weights.outputs = static_cast<int>(tensor.rows);
  weights.values = transposed(tensor.values, tensor.rows, tensor.cols);
  return weights;
}

// A weight matrix as the products see it: K inputs, N outputs, and how it lies. A linear
// layer's W is [in, out]; the embedding E is [vocab, d]: d in, vocab out.
struct ProductShape {
  int inputs, outputs;
  cpu::WeightLayout layout;
};
ProductShape product_shape(bool output_projection, int64_t rows, int64_t cols) {
  if (output_projection) {
    return {static_cast<int>(cols), static_cast<int>(rows), cpu::WeightLayout::kOutputsByInputs};
  }
  return {static_cast<int>(rows), static_cast<int>(cols), cpu::WeightLayout::kInputsByOutputs};
}

// What a quantized checkpoint stores: 8-bit weights (+-127), what a CPU with VNNI
// multiplies; one without quantizes them to 7 bits again at load.
constexpr int kStoredWeightLimit = 127;

// Whether every value of `weights` lies within +-limit.
bool within(const cpu::QuantizedWeights& weights, int limit) {
  for (const int8_t value : weights.values) {
    if (value < -limit || value > limit) return false;
  }
  return true;
}

}  // namespace

namespace {

// The stored int8 tensor of `weight` (a quantized checkpoint's), checked against the
// model's parameter; null when the checkpoint stores none for it.
const QuantizedTensor* stored_for(const std::vector<QuantizedTensor>& stored,
                                  const ProductWeight& weight, const ParamEntry& entry) {
  const auto found = std::find_if(stored.begin(), stored.end(), [&](const QuantizedTensor& t) {
    return t.name == weight.name;
  });
  if (found == stored.end()) return nullptr;
  THPC_CHECK(found->rows == entry.rows && found->cols == entry.cols &&
                 found->output_axis == (weight.output_projection ? 0 : 1),
             "stored int8 " << weight.name << " is not shaped as the model's parameter");
  return &*found;
}

#if THPC_HAVE_CUDA
// quantize_model_weights on a GPU: every weight matrix in 8 bits (cuBLASLt's int8
// kernels multiply +-127 as they are), stored ones as the checkpoint has them, the others
// quantized on the host from the fp32 parameters.
QuantizedCount quantize_for_the_gpu(const ParamStore& params, Backend& backend,
                                    Int8CudaBackend& int8,
                                    const std::vector<QuantizedTensor>& stored) {
  QuantizedCount count;
  for (const ProductWeight& weight : product_weights(params)) {
    const ParamEntry& entry = params.entry(weight.name);
    if (const QuantizedTensor* found = stored_for(stored, weight, entry)) {
      if (int8.adopt(params.compute(weight.name), as_product_weights(*found))) {
        ++count.stored;
      } else {
        ++count.kept_in_float;
      }
      continue;
    }
    const Tensor master = params.param(weight.name);
    std::vector<float> values(static_cast<size_t>(master.numel));
    backend.download(values.data(), master);
    const ProductShape shape = product_shape(weight.output_projection, entry.rows, entry.cols);
    if (int8.adopt(params.compute(weight.name),
                   cpu::quantize_weights(values.data(), shape.inputs, shape.outputs,
                                         shape.layout, kStoredWeightLimit))) {
      ++count.quantized;
    } else {
      ++count.kept_in_float;
    }
  }
  return count;
}
#endif

}  // namespace

QuantizedCount quantize_model_weights(Transformer& model, Backend& backend,
                                      const std::vector<QuantizedTensor>& stored) {
  QuantizedCount count;
#if THPC_HAVE_CUDA
  if (auto* gpu = dynamic_cast<Int8CudaBackend*>(&backend)) {
    return quantize_for_the_gpu(model.params(), backend, *gpu, stored);
  }
#endif
  auto* int8 = dynamic_cast<Int8CpuBackend*>(&backend);
  if (int8 == nullptr) return count;
  const ParamStore& params = model.params();
  for (const ProductWeight& weight : product_weights(params)) {
    const ParamEntry& entry = params.entry(weight.name);
    if (const QuantizedTensor* found = stored_for(stored, weight, entry)) {
      cpu::QuantizedWeights quantized = as_product_weights(*found);
      if (within(quantized, cpu::int8_weight_limit())) {
        int8->adopt(params.compute(weight.name), quantized);
        ++count.stored;
        continue;
      }
      ++count.requantized;  // from the dequantized values the model holds
    }
    const ProductShape shape = product_shape(weight.output_projection, entry.rows, entry.cols);
    int8->quantize(params.compute(weight.name), shape.inputs, shape.outputs, shape.layout);
    ++count.quantized;
  }
  return count;
}

std::string int8_products_description(const Backend& backend) {
  if (backend.host_memory()) return cpu::int8_description();
  return "cuBLASLt's int8 GEMMs on " + backend.name() + ", 8-bit weights";
}

Checkpoint quantize_checkpoint(const Checkpoint& source) {
  THPC_CHECK(source.quantized.empty(), "the checkpoint is quantized already");
  Checkpoint quantized = derived_checkpoint_of(source);
  quantized.params = source.params;
  // The weight matrices by name: what product_weights() takes from a model's table.
  for (NamedTensor& param : quantized.params) {
    if (!is_product_weight(param.name)) continue;
    const bool output_projection = is_output_projection(param.name);
    const ProductShape shape = product_shape(output_projection, param.rows, param.cols);
    const cpu::QuantizedWeights weights = cpu::quantize_weights(
        param.values.data(), shape.inputs, shape.outputs, shape.layout, kStoredWeightLimit);
    QuantizedTensor tensor;
    tensor.name = param.name;
    tensor.rows = param.rows;
    tensor.cols = param.cols;
    tensor.output_axis = output_projection ? 0 : 1;
    tensor.scales = weights.scales;
    // Wq [K, N]; E's [vocab, d] is its transpose.
    tensor.values = output_projection ? transposed(weights.values, shape.inputs, shape.outputs)
                                      : weights.values;
    param.values = dequantize(tensor);
    quantized.quantized.push_back(std::move(tensor));
  }
  THPC_CHECK(!quantized.quantized.empty(), "the checkpoint holds no weight matrix to quantize");
  return quantized;
}

}  // namespace thpc
