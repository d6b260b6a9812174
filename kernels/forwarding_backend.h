// A Backend that passes every call on to another: the base of backends that change a
// few calls and leave the rest (ProfilingBackend times every op; Int8CpuBackend,
// kernels/cpu/int8_backend.h, multiplies some weights in int8). A derived class
// overrides what it changes and calls inner() for the rest.
#pragma once

#include <memory>
#include <string>

#include "kernels/ops.h"

namespace thpc {

class ForwardingBackend : public Backend {
 public:
  explicit ForwardingBackend(Backend& inner) : inner_(inner) {}

  std::string name() const override { return inner_.name(); }
  bool host_memory() const override { return inner_.host_memory(); }
  DType param_dtype() const override { return inner_.param_dtype(); }
  DType compute_dtype() const override { return inner_.compute_dtype(); }
  Tensor alloc(DType dtype, int64_t numel) override { return inner_.alloc(dtype, numel); }
  void free(Tensor& tensor) override { inner_.free(tensor); }
  int32_t* alloc_ids(int64_t count) override { return inner_.alloc_ids(count); }
  void free_ids(int32_t*& ids) override { inner_.free_ids(ids); }
  void zero(Tensor tensor) override { inner_.zero(tensor); }
  void copy(Tensor dst, Tensor src) override { inner_.copy(dst, src); }
  void upload(Tensor dst, const void* host) override { inner_.upload(dst, host); }
  void download(void* host, Tensor src) override { inner_.download(host, src); }
  void upload_ids(int32_t* dst, const int32_t* host, int64_t count) override {
    inner_.upload_ids(dst, host, count);
  }
  void download_ids(int32_t* host, const int32_t* src, int64_t count) override {
    inner_.download_ids(host, src, count);
  }
  void synchronize() override { inner_.synchronize(); }
  void* native_stream() const override { return inner_.native_stream(); }
  int device() const override { return inner_.device(); }
  void use_on_this_thread() override { inner_.use_on_this_thread(); }
  int64_t peak_memory_bytes() const override { return inner_.peak_memory_bytes(); }
  std::unique_ptr<WorkClock> make_work_clock() override { return inner_.make_work_clock(); }
  std::unique_ptr<HostStaging> make_host_staging(int64_t floats) override {
    return inner_.make_host_staging(floats);
  }
  bool fused_ops_by_default() const override { return inner_.fused_ops_by_default(); }
  int64_t relu_mask_words(int rows, int n) const override {
    return inner_.relu_mask_words(rows, n);
  }
  int encoder_group_cost_rows() const override { return inner_.encoder_group_cost_rows(); }
  // The work queued through this backend reaches the inner one, which captures it.
  bool can_capture(CaptureUse use) const override { return inner_.can_capture(use); }
  std::unique_ptr<CapturedWork> capture(const std::function<void()>& queue_work) override {
    return inner_.capture(queue_work);
  }

#define THPC_OP(ret, name, params, args) \
  ret name params override { return inner_.name args; }
#include "kernels/op_list.h"
#undef THPC_OP

 protected:
  Backend& inner() const { return inner_; }

 private:
  Backend& inner_;
};

}  // namespace thpc
