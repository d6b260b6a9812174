#include "decode/compute_type.h"

#include "common/error.h"
#include "kernels/cpu/int8_backend.h"
#include "model/backends.h"
#include "model/transformer.h"

namespace thpc {

namespace {

constexpr const char* kNames = "default, float32, bfloat16 or int8";

}  // namespace

ComputeType parse_compute_type(const std::string& name) {
  if (name == "default") return ComputeType::kDefault;
  if (name == "float32") return ComputeType::kFloat32;
  if (name == "bfloat16") return ComputeType::kBfloat16;
  if (name == "int8") return ComputeType::kInt8;
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

std::unique_ptr<Backend> make_decoding_backend(const TrainConfig& checkpoint_train,
                                               ComputeType type) {
  TrainConfig train = checkpoint_train;
  if (type == ComputeType::kFloat32 || type == ComputeType::kInt8) train.precision = "fp32";
  if (type == ComputeType::kBfloat16) train.precision = "bf16";
  std::unique_ptr<Backend> backend = make_backend(train);
  if (type == ComputeType::kBfloat16 && backend->host_memory()) {
    THPC_FAIL("--compute-type bfloat16 needs a GPU, and this decode runs on the CPU ("
              << backend->name() << "): use float32 or int8 there");
  }
  if (type != ComputeType::kInt8) return backend;
  if (!backend->host_memory()) {
    THPC_FAIL("--compute-type int8 runs on the CPU only for now, and this decode found a GPU "
              "(the checkpoint's train.backend = " << checkpoint_train.backend << "): use "
              "bfloat16 on the GPU, or decode on the CPU with CUDA_VISIBLE_DEVICES= set empty");
  }
  if (!cpu::int8_available()) {
    THPC_FAIL("--compute-type int8: this transformer_decode has no int8 products: "
              << cpu::int8_description());
  }
  return std::make_unique<Int8CpuBackend>(std::move(backend));
}

int quantize_model_weights(Transformer& model, Backend& backend) {
  auto* int8 = dynamic_cast<Int8CpuBackend*>(&backend);
  if (int8 == nullptr) return 0;
  const ParamStore& params = model.params();
  int quantized = 0;
  for (const ProductWeight& weight : product_weights(params)) {
    const ParamEntry& entry = params.entry(weight.name);
    // A linear layer's W is [in, out]; the embedding E is [vocab, d]: d in, vocab out.
    const int inputs = static_cast<int>(weight.output_projection ? entry.cols : entry.rows);
    const int outputs = static_cast<int>(weight.output_projection ? entry.rows : entry.cols);
    int8->quantize(params.compute(weight.name), inputs, outputs,
                   weight.output_projection ? cpu::WeightLayout::kOutputsByInputs
                                            : cpu::WeightLayout::kInputsByOutputs);
    ++quantized;
  }
  return quantized;
}

}  // namespace thpc
