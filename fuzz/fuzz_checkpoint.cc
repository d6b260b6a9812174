// The checkpoint reader (src/checkpoint): any bytes as an HDF5 checkpoint (float or
// quantized), opened from memory, read whole and parameters-only; the configuration a checkpoint that reads
// back carries is parsed as decoding parses it.
#include "checkpoint/checkpoint.h"
#include "fuzz_target.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace thpc;
  const std::string_view image = fuzz::bytes_of(data, size);
  for (const CheckpointParts parts : {CheckpointParts::All, CheckpointParts::ParamsOnly}) {
    fuzz::refused_or_read([&] {
      const Checkpoint checkpoint = read_checkpoint_image("fuzz.h5", image, parts);
      for (const auto* group : {&checkpoint.params, &checkpoint.adam_m, &checkpoint.adam_v}) {
        for (const NamedTensor& tensor : *group) {
          fuzz::require(static_cast<int64_t>(tensor.values.size()) == tensor.rows * tensor.cols,
                        "a tensor holds rows x cols values");
        }
      }
      for (const QuantizedTensor& tensor : checkpoint.quantized) {
        fuzz::require(static_cast<int64_t>(tensor.values.size()) == tensor.rows * tensor.cols &&
                          static_cast<int64_t>(tensor.scales.size()) == tensor.outputs(),
                      "a quantized tensor holds rows x cols values and a scale per output");
      }
      load_config_text(checkpoint.config_ini, "fuzz.h5");
    });
  }
  fuzz::require_no_open_hdf5_objects();
  return 0;
}
