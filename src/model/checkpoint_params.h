// The model's side of a checkpoint (checkpoint/checkpoint.h, the file format below it):
// the parameters, and the Adam moments of the same layout, to and from the checkpoint's
// named tensors, and the check that a checkpoint's parameters are this model's.
#pragma once

#include <string>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "kernels/ops.h"
#include "model/params.h"
#include "model/transformer.h"

namespace thpc {

// Throws thpc::Error naming `source` when the checkpoint's architecture_text() is not
// the model's: its parameters would not fit, or would mean something else.
void check_architecture(const Checkpoint& checkpoint, const Transformer& model,
                        const std::string& source);

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

}  // namespace thpc
