// Adam over the flat parameter buffer (§5.3: beta1 0.9, beta2 0.98, eps 1e-9): the
// moments are two more buffers of the parameter layout, so one op call updates every
// parameter.
#pragma once

#include <cstdint>

#include "kernels/ops.h"
#include "model/params.h"

namespace thpc {

struct AdamSettings {
  float beta1 = 0.9f;
  float beta2 = 0.98f;
  float eps = 1e-9f;
  // Decoupled weight decay (Loshchilov & Hutter, "Decoupled Weight Decay Regularization",
  // AdamW; fairseq's Adam): p -= update + lr * weight_decay * p, one subtraction with
  // the update, both of the old p (fairseq and PyTorch subtract it apart, which fp32
  // rounds away for small decays: docs/design-training.md). 0: none.
  float weight_decay = 0.0f;
};

class Adam {
 public:
  Adam(ParamStore& params, Backend& backend, const AdamSettings& settings);
  ~Adam();
  Adam(const Adam&) = delete;
  Adam& operator=(const Adam&) = delete;

  // One update with learning rate lr (and the weight decay with it); `step` is the
  // 1-based optimizer step (bias correction uses it).
  void update(float lr, int64_t step);

  Tensor first_moment() const { return m_; }
  Tensor second_moment() const { return v_; }

 private:
  ParamStore& params_;
  Backend& backend_;
  AdamSettings settings_;
  Tensor m_, v_;
};

}  // namespace thpc
