#include "train/optimizer.h"

namespace thpc {

Adam::Adam(ParamStore& params, Backend& backend, const AdamSettings& settings)
    : params_(params), backend_(backend), settings_(settings) {
  m_ = backend_.alloc(backend_.param_dtype(), params_.buffer_numel());
  v_ = backend_.alloc(backend_.param_dtype(), params_.buffer_numel());
  backend_.zero(m_);
  backend_.zero(v_);
}

Adam::~Adam() {
  backend_.free(m_);
  backend_.free(v_);
}

void Adam::update(float lr, int64_t step) {
  // The alignment padding between parameters has zero gradient and stays zero. The
  // compute copy (bf16 on a GPU computing in it) is rewritten by the same op. With
  // weight decay, AdamW's update (the decay folded into it, kernels/op_list.h).
  if (settings_.weight_decay > 0.0f) {
    backend_.adamw_update(params_.params(), params_.separate_compute(), params_.grads(), m_, v_,
                          params_.buffer_numel(), lr, settings_.beta1, settings_.beta2,
                          settings_.eps,
                          static_cast<float>(static_cast<double>(lr) * settings_.weight_decay),
                          step);
    return;
  }
  backend_.adam_update(params_.params(), params_.separate_compute(), params_.grads(), m_, v_,
                       params_.buffer_numel(), lr, settings_.beta1, settings_.beta2,
                       settings_.eps, step);
}

}  // namespace thpc
