// The model's side of a checkpoint (checkpoint/checkpoint.h, the file format below it):
// the parameters, and the Adam moments of the same layout, to and from the checkpoint's
// named tensors, and the check that a checkpoint's parameters are this model's.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "kernels/ops.h"
#include "model/params.h"
#include "model/transformer.h"

namespace thpc {

// The model's architecture_text(): its settings and vocabularies (the source's too, when
// separate), what its checkpoints record and are checked against.
std::string architecture_text(const Transformer& model);

// Throws thpc::Error naming `source` when the checkpoint's architecture_text() is not
// the model's: its parameters would not fit, or would mean something else.
void check_architecture(const Checkpoint& checkpoint, const Transformer& model,
                        const std::string& source);

// The digest ParamStore::sha256_hex() gives once `checkpoint`'s parameters are loaded into
// a model of `model`'s settings (their fp32 values in the model's table order): what the
// final: line of the run that ended with them prints, without building the model (a file's
// own bytes differ between identical runs, which write their ids and paths into it).
// Throws thpc::Error naming `source` when a parameter of the table is missing or another
// size (a checkpoint of another architecture).
std::string parameters_sha256(const Checkpoint& checkpoint, const ModelConfig& model,
                              const std::string& source);
// The same for the model the checkpoint's stored configuration describes (what a tool
// holding only the file has); also throws when that configuration cannot be read.
std::string parameters_sha256(const Checkpoint& checkpoint, const std::string& source);

// Loads the parameters of any checkpoint (a step or an average) into `model`, after
// checking the architecture: what decoding and checkpoint.init start from.
void load_parameters(const std::string& path, Transformer& model);
// The same from a checkpoint already read (`source` names it in errors): a caller that
// needed its metadata first reads and verifies the file once, not twice.
void load_parameters(const Checkpoint& checkpoint, const std::string& source,
                     Transformer& model);

// The values of a parameter-layout buffer (parameters, or an Adam moment) by name, and
// back. `buffer` has the layout of `store` and the dtype of `backend`'s parameters.
std::vector<NamedTensor> gather_named(const ParamStore& store, Backend& backend, Tensor buffer);
// Throws thpc::Error naming `source` when a tensor is missing or shaped differently.
void scatter_named(const std::vector<NamedTensor>& tensors, const ParamStore& store,
                   Backend& backend, Tensor buffer, const std::string& source);

// Parameter-layout buffers (the parameters, the Adam moments) on their way to the host
// through a HostStaging: the copies are queued at construction, without waiting for the
// backend, and named() unpacks them, on whichever thread writes the checkpoint. What
// gather_named gives, bit for bit, but the thread that queues pays only for queuing
// (Trainer::save_completed_step with checkpoint.background_write).
class StagedNamedBuffers {
 public:
  // Queues the copies of `buffers` (fp32, each of `store`'s layout) one after another into
  // `staging`, which holds at least buffers.size() * store.buffer_numel() floats and must
  // not be queued into again before the last named() call has returned.
  StagedNamedBuffers(const ParamStore& store, std::shared_ptr<HostStaging> staging,
                     const std::vector<Tensor>& buffers);
  // Waits for the copies to land; then buffer `index`'s values by name.
  std::vector<NamedTensor> named(int index) const;

 private:
  std::vector<ParamEntry> entries_;  // a copy: the store may be gone by the time of named()
  int64_t buffer_numel_ = 0;
  int buffers_ = 0;
  std::shared_ptr<HostStaging> staging_;
};

}  // namespace thpc
