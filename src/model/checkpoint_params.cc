#include "model/checkpoint_params.h"

#include <algorithm>
#include <map>
#include <utility>

#include "common/error.h"
#include "common/sha256.h"
#include "common/still_working.h"

namespace thpc {

std::string architecture_text(const Transformer& model) {
  const VocabularySizes sizes = model.vocabularies();
  return architecture_text(model.config(), sizes.target, sizes.source);
}

void check_architecture(const Checkpoint& checkpoint, const Transformer& model,
                        const std::string& source) {
  check_architecture(checkpoint, architecture_text(model), source);
}

void load_parameters(const std::string& path, Transformer& model) {
  load_parameters(read_checkpoint(path, CheckpointParts::ParamsOnly), path, model);
}

std::string parameters_sha256(const Checkpoint& checkpoint, const ModelConfig& model,
                              const std::string& source) {
  const int64_t vocab = embedding_rows(checkpoint);
  if (vocab <= 0) THPC_FAIL(source << ": holds no embed.weight, the parameters of a model");
  ParamStore table;
  add_transformer_parameters(model, static_cast<int>(vocab), table,
                             static_cast<int>(source_embedding_rows(checkpoint)));
  std::map<std::string, const NamedTensor*> by_name;
  for (const NamedTensor& tensor : checkpoint.params) by_name[tensor.name] = &tensor;
  Sha256 digest;
  for (const ParamEntry& entry : table.entries()) {
    const auto found = by_name.find(entry.name);
    if (found == by_name.end() ||
        static_cast<int64_t>(found->second->values.size()) != entry.numel()) {
      THPC_FAIL(source << ": parameter " << entry.name << " is "
                       << (found == by_name.end() ? "missing" : "of another size")
                       << " for the model its configuration describes");
    }
    show_still_working();
    digest.update(found->second->values.data(), found->second->values.size() * sizeof(float));
  }
  return digest.hex_digest();
}

std::string parameters_sha256(const Checkpoint& checkpoint, const std::string& source) {
  const Config stored = load_config_text(checkpoint.config_ini, source + " (stored configuration)");
  return parameters_sha256(checkpoint, stored.model, source);
}

void load_parameters(const Checkpoint& checkpoint, const std::string& source,
                     Transformer& model) {
  check_architecture(checkpoint, model, source);
  ParamStore& params = model.params();
  scatter_named(checkpoint.params, params, model.backend(), params.params(),
                "checkpoint " + source);
  params.refresh_compute();
}

namespace {

// A parameter's tensor in a checkpoint: its name and shape, its values not yet filled.
NamedTensor named_like(const ParamEntry& entry) {
  NamedTensor tensor;
  tensor.name = entry.name;
  tensor.rows = entry.rows;
  tensor.cols = entry.cols;
  return tensor;
}

}  // namespace

std::vector<NamedTensor> gather_named(const ParamStore& store, Backend& backend, Tensor buffer) {
  THPC_CHECK(buffer.numel == store.buffer_numel(),
             "buffer of " << buffer.numel << " elements, layout of " << store.buffer_numel());
  THPC_CHECK(buffer.dtype == DType::F64 || buffer.dtype == DType::F32,
             "parameters are fp32 or fp64");
  std::vector<NamedTensor> named;
  named.reserve(store.entries().size());
  std::vector<double> wide;  // an fp64 backend's values, narrowed to the file's fp32
  for (const ParamEntry& entry : store.entries()) {
    show_still_working();  // rank 0's copy of a large model, which the others wait for
    NamedTensor tensor = named_like(entry);
    tensor.values.resize(entry.numel());
    // Each parameter straight into its own tensor: one copy of the state, not two (the
    // snapshot is what every rank waits for while rank 0 saves).
    const Tensor part = buffer.slice(entry.offset, entry.numel());
    if (buffer.dtype == DType::F64) {
      wide.resize(entry.numel());
      backend.download(wide.data(), part);
      std::copy(wide.begin(), wide.end(), tensor.values.begin());
    } else {
      backend.download(tensor.values.data(), part);
    }
    named.push_back(std::move(tensor));
  }
  return named;
}

StagedNamedBuffers::StagedNamedBuffers(const ParamStore& store,
                                       std::shared_ptr<HostStaging> staging,
                                       const std::vector<Tensor>& buffers)
    : entries_(store.entries()),
      buffer_numel_(store.buffer_numel()),
      buffers_(static_cast<int>(buffers.size())),
      staging_(std::move(staging)) {
  THPC_CHECK(staging_ != nullptr && staging_->floats() >= buffers_ * buffer_numel_,
             "staging for " << buffers_ << " buffers of " << buffer_numel_ << " floats");
  for (int i = 0; i < buffers_; ++i) {
    THPC_CHECK(buffers[i].numel == buffer_numel_ && buffers[i].dtype == DType::F32,
               "buffer " << i << ": " << buffers[i].numel << " " << dtype_name(buffers[i].dtype)
                         << " elements, layout of " << buffer_numel_ << " fp32");
    staging_->queue_download(i * buffer_numel_, buffers[i]);
  }
}

std::vector<NamedTensor> StagedNamedBuffers::named(int index) const {
  THPC_CHECK(index >= 0 && index < buffers_, "buffer " << index << " of " << buffers_);
  const float* buffer = staging_->wait() + index * buffer_numel_;
  std::vector<NamedTensor> named;
  named.reserve(entries_.size());
  for (const ParamEntry& entry : entries_) {
    show_still_working();  // (the writer's progress, which the training thread signs)
    NamedTensor tensor = named_like(entry);
    tensor.values.assign(buffer + entry.offset, buffer + entry.offset + entry.numel());
    named.push_back(std::move(tensor));
  }
  return named;
}

void scatter_named(const std::vector<NamedTensor>& tensors, const ParamStore& store,
                   Backend& backend, Tensor buffer, const std::string& source) {
  THPC_CHECK(buffer.numel == store.buffer_numel(),
             "buffer of " << buffer.numel << " elements, layout of " << store.buffer_numel());
  std::map<std::string, const NamedTensor*> by_name;
  for (const NamedTensor& tensor : tensors) by_name[tensor.name] = &tensor;
  if (by_name.size() != store.entries().size()) {
    THPC_FAIL(source << ": holds " << by_name.size() << " tensors, the model has "
                     << store.entries().size() << " parameters");
  }
  // Every parameter is checked before any is written: a mismatched checkpoint leaves
  // the buffer as it was.
  std::vector<const NamedTensor*> in_order;
  for (const ParamEntry& entry : store.entries()) {
    const auto found = by_name.find(entry.name);
    if (found == by_name.end()) THPC_FAIL(source << ": missing parameter " << entry.name);
    const NamedTensor& tensor = *found->second;
    if (tensor.rows != entry.rows || tensor.cols != entry.cols) {
      THPC_FAIL(source << ": parameter " << entry.name << " is " << tensor.rows << "x"
                       << tensor.cols << ", the model's is " << entry.rows << "x"
                       << entry.cols);
    }
    in_order.push_back(&tensor);
  }
  // Each parameter at its offset in `values`, a host array of the buffer's layout.
  auto place = [&](auto* values) {
    for (size_t i = 0; i < in_order.size(); ++i) {
      std::copy(in_order[i]->values.begin(), in_order[i]->values.end(),
                values + store.entries()[i].offset);
    }
  };
  if (backend.host_memory() && buffer.dtype == DType::F32) {
    // Straight into the buffer: a host-side copy of the whole model would be as many
    // fresh pages again (a base model's 190 MB, a tenth of a short CPU decode's page
    // faults). The padding between parameters stays zero, as allocate() left it.
    place(static_cast<float*>(buffer.data));
    return;
  }
  // Assembled on the host in the buffer's own type (one copy of the model, not a double
  // one and a float one: a base model is 250 MB in fp32), padding zero, then uploaded.
  auto assemble = [&](auto zero) {
    std::vector<decltype(zero)> host(store.buffer_numel(), zero);
    place(host.data());
    backend.upload(buffer, host.data());
  };
  if (buffer.dtype == DType::F64) {
    assemble(0.0);
  } else {
    THPC_CHECK(buffer.dtype == DType::F32, "parameters are fp32 or fp64");
    assemble(0.0f);
  }
}

}  // namespace thpc
