// All trainable parameters in one contiguous buffer, their gradients in a second of the
// same layout, and a table mapping each name to its slice. All-reduce, Adam,
// checkpointing and averaging each walk one flat array; the model asks for views by
// name once, at construction.
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "kernels/ops.h"

namespace thpc {

enum class ParamInit {
  Zeros,
  Ones,
  XavierUniform,  // U(-a, a), a = sqrt(6 / (fan_in + fan_out)) (Glorot & Bengio 2010)
  EmbeddingNormal,  // N(0, d^-1/2): with the sqrt(d) scale of §3.4 the embedded
                    // tokens start at unit variance
};

struct ParamEntry {
  std::string name;
  int64_t rows = 0, cols = 0;  // a vector has rows = 1
  ParamInit init = ParamInit::Zeros;
  // Xavier fans. A fused projection (Q|K|V side by side) is initialised as its separate
  // matrices would be, so fan_out is the width of one block, not of the fused matrix.
  int64_t fan_in = 0, fan_out = 0;
  int64_t offset = 0;  // into the flat buffer, in elements
  int64_t numel() const { return rows * cols; }
};

class ParamStore {
 public:
  // Offsets are aligned to this many elements (256 bytes in fp32), so each tensor
  // starts where vectorised GPU loads want it.
  static constexpr int64_t kAlignment = 64;

  void add(const std::string& name, int64_t rows, int64_t cols, ParamInit init,
           int64_t fan_in = 0, int64_t fan_out = 0);
  // Lays out the buffer and allocates parameters, and gradients unless `gradients` is
  // false (a model that only decodes: 4 bytes a parameter it would zero for nothing).
  void allocate(Backend& backend, bool gradients = true);
  ~ParamStore();

  // Fills every parameter from Philox keyed by seed and the parameter's index.
  void initialize(uint64_t seed);

  const std::vector<ParamEntry>& entries() const { return entries_; }
  const ParamEntry& entry(const std::string& name) const;
  bool has(const std::string& name) const;
  Tensor param(const std::string& name) const;
  Tensor grad(const std::string& name) const;  // null without gradients
  // The weights as the ops read them, in the backend's compute dtype: the fp32 master
  // parameters themselves when the dtypes agree (CPU, GPU fp32), else a bf16 copy of
  // the same layout that refresh_compute() (and each optimizer step, adam_update)
  // rewrites from the masters.
  Tensor compute(const std::string& name) const;
  Tensor params() const { return params_; }  // the flat buffers, padding included
  Tensor grads() const { return grads_; }  // null when allocated without gradients
  // The compute copy when it is one (bf16 on a GPU computing in it), else null: what
  // Backend::adam_update rewrites beside the masters.
  Tensor separate_compute() const { return compute_.data != params_.data ? compute_ : Tensor{}; }
  // Brings the compute copy up to date after the master parameters changed (the
  // optimizer step, a checkpoint load, initialisation). A no-op without a copy.
  void refresh_compute();
  int64_t buffer_numel() const { return buffer_numel_; }
  // Number of trainable values (padding excluded).
  int64_t count() const;

  // The parameters as packed host values in table order, converted to fp32.
  std::vector<float> to_host_f32() const;
  // sha256 of to_host_f32()'s bytes: two runs that end in identical parameters print
  // identical digests.
  std::string sha256_hex() const;

 private:
  std::vector<ParamEntry> entries_;
  // Each name's place in entries_: a model of many layers has tens of thousands of
  // tensors, and a linear search per add() made laying out 10^4 layers take minutes.
  std::unordered_map<std::string, size_t> index_;
  int64_t buffer_numel_ = 0;
  Backend* backend_ = nullptr;
  Tensor params_, grads_;
  Tensor compute_;  // == params_ when param and compute dtypes agree
};

}  // namespace thpc
