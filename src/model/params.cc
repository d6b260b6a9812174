#include "model/params.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "common/error.h"
#include "common/philox.h"
#include "common/sha256.h"
#include "common/still_working.h"

namespace thpc {
namespace {

// Philox site for initialisation draws: the parameter's index in the table, above the
// range the dropout sites use, so no init draw ever equals a dropout draw.
constexpr uint32_t kInitSiteBase = 0x40000000u;

double uniform01(uint64_t seed, uint32_t site, uint64_t element) {
  // 53-bit resolution is not needed: 24 bits are what dropout uses too; the +0.5 keeps
  // the value strictly inside (0, 1) so that log() below is finite.
  return (static_cast<double>(philox_bits(seed, site, 0, 0, element) >> 8) + 0.5) /
         16777216.0;
}

// A standard normal from two uniforms (Box-Muller).
double standard_normal(uint64_t seed, uint32_t site, uint64_t element) {
  const double u1 = uniform01(seed, site, 2 * element);
  const double u2 = uniform01(seed, site, 2 * element + 1);
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
}

}  // namespace

void ParamStore::add(const std::string& name, int64_t rows, int64_t cols, ParamInit init,
                     int64_t fan_in, int64_t fan_out) {
  THPC_CHECK(backend_ == nullptr, "parameter " << name << " added after allocation");
  THPC_CHECK(!has(name), "parameter " << name << " added twice");
  THPC_CHECK(rows > 0 && cols > 0, "parameter " << name << " has shape " << rows << "x" << cols);
  ParamEntry entry;
  entry.name = name;
  entry.rows = rows;
  entry.cols = cols;
  entry.init = init;
  entry.fan_in = fan_in > 0 ? fan_in : rows;
  entry.fan_out = fan_out > 0 ? fan_out : cols;
  entry.offset = buffer_numel_;
  buffer_numel_ += (entry.numel() + kAlignment - 1) / kAlignment * kAlignment;
  index_.emplace(name, entries_.size());
  entries_.push_back(entry);
}

void ParamStore::allocate(Backend& backend, bool gradients) {
  THPC_CHECK(backend_ == nullptr, "parameters allocated twice");
  backend_ = &backend;
  params_ = backend.alloc(backend.param_dtype(), buffer_numel_);
  backend.zero(params_);
  if (gradients) {
    grads_ = backend.alloc(backend.param_dtype(), buffer_numel_);
    backend.zero(grads_);
  }
  if (backend.compute_dtype() == backend.param_dtype()) {
    compute_ = params_;
  } else {
    compute_ = backend.alloc(backend.compute_dtype(), buffer_numel_);
    backend.zero(compute_);
  }
}

void ParamStore::refresh_compute() {
  THPC_CHECK(backend_ != nullptr, "refresh_compute() before allocate()");
  if (compute_.data != params_.data) backend_->copy(compute_, params_);
}

ParamStore::~ParamStore() {
  if (backend_) {
    if (compute_.data != params_.data) backend_->free(compute_);
    backend_->free(params_);
    if (grads_) backend_->free(grads_);
  }
}

void ParamStore::initialize(uint64_t seed) {
  THPC_CHECK(backend_ != nullptr, "initialize() before allocate()");
  std::vector<double> host(buffer_numel_, 0.0);
  for (size_t index = 0; index < entries_.size(); ++index) {
    show_still_working();  // seconds for a large model, on a rank the others may wait for
    const ParamEntry& e = entries_[index];
    const uint32_t site = kInitSiteBase + static_cast<uint32_t>(index);
    double* values = host.data() + e.offset;
    switch (e.init) {
      case ParamInit::Zeros: break;
      case ParamInit::Ones:
        for (int64_t i = 0; i < e.numel(); ++i) values[i] = 1.0;
        break;
      case ParamInit::XavierUniform: {
        const double limit = std::sqrt(6.0 / static_cast<double>(e.fan_in + e.fan_out));
        for (int64_t i = 0; i < e.numel(); ++i) {
          values[i] = (2.0 * uniform01(seed, site, i) - 1.0) * limit;
        }
        break;
      }
      case ParamInit::EmbeddingNormal: {
        const double stddev = 1.0 / std::sqrt(static_cast<double>(e.cols));
        for (int64_t i = 0; i < e.numel(); ++i) values[i] = stddev * standard_normal(seed, site, i);
        break;
      }
    }
  }
  // Convert to the backend's parameter type on the host, then upload once.
  if (backend_->param_dtype() == DType::F64) {
    backend_->upload(params_, host.data());
  } else {
    THPC_CHECK(backend_->param_dtype() == DType::F32, "parameters are fp32 or fp64");
    std::vector<float> single(host.begin(), host.end());
    backend_->upload(params_, single.data());
  }
  refresh_compute();
}

bool ParamStore::has(const std::string& name) const { return index_.count(name) > 0; }

const ParamEntry& ParamStore::entry(const std::string& name) const {
  const auto found = index_.find(name);
  if (found == index_.end()) THPC_FAIL("no parameter named '" << name << "'");
  return entries_[found->second];
}

Tensor ParamStore::param(const std::string& name) const {
  const ParamEntry& e = entry(name);
  return params_.slice(e.offset, e.numel());
}

Tensor ParamStore::compute(const std::string& name) const {
  const ParamEntry& e = entry(name);
  return compute_.slice(e.offset, e.numel());
}

Tensor ParamStore::grad(const std::string& name) const {
  const ParamEntry& e = entry(name);
  if (!grads_) return Tensor{};
  return grads_.slice(e.offset, e.numel());
}

int64_t ParamStore::count() const {
  int64_t total = 0;
  for (const auto& e : entries_) total += e.numel();
  return total;
}

std::vector<float> ParamStore::to_host_f32() const {
  THPC_CHECK(backend_ != nullptr, "parameters not allocated");
  std::vector<float> packed;
  packed.reserve(count());
  if (backend_->param_dtype() == DType::F64) {
    std::vector<double> host(buffer_numel_);
    backend_->download(host.data(), params_);
    for (const auto& e : entries_) {
      show_still_working();
      packed.insert(packed.end(), host.begin() + e.offset, host.begin() + e.offset + e.numel());
    }
  } else {
    std::vector<float> host(buffer_numel_);
    backend_->download(host.data(), params_);
    for (const auto& e : entries_) {
      show_still_working();
      packed.insert(packed.end(), host.begin() + e.offset, host.begin() + e.offset + e.numel());
    }
  }
  return packed;
}

std::string ParamStore::sha256_hex() const {
  const std::vector<float> packed = to_host_f32();
  // In pieces of 64 MiB with a sign of work between: a large model's digest takes a
  // second, which a rank that came to the ranks' comparison first waits through.
  Sha256 digest;
  const size_t bytes = packed.size() * sizeof(float);
  const auto* data = reinterpret_cast<const unsigned char*>(packed.data());
  for (size_t done = 0; done < bytes; done += size_t{1} << 26) {
    show_still_working();
    digest.update(data + done, std::min(bytes - done, size_t{1} << 26));
  }
  return digest.hex_digest();
}

}  // namespace thpc
