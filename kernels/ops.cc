#include "kernels/ops.h"

#include <algorithm>
#include <chrono>
#include <memory>
#include <sstream>
#include <vector>

#include "common/error.h"
#include "common/still_working.h"
#include "kernels/twin_call.h"

namespace thpc {

size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::F32: return 4;
    case DType::F64: return 8;
    case DType::BF16: return 2;
  }
  return 0;
}

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::F32: return "fp32";
    case DType::F64: return "fp64";
    case DType::BF16: return "bf16";
  }
  return "?";
}

void check_attention_shape(const AttentionShape& shape, int ldq, int ldk, int ldv) {
  THPC_CHECK(shape.batch >= 0 && shape.heads >= 0 && shape.query_len >= 0 &&
                 shape.key_len >= 0,
             "attention shape B=" << shape.batch << " h=" << shape.heads
                                  << " Lq=" << shape.query_len << " Lk=" << shape.key_len);
  THPC_CHECK(shape.d_k > 0 && shape.d_v > 0,
             "attention head widths d_k=" << shape.d_k << " d_v=" << shape.d_v);
  THPC_CHECK(ldq >= shape.heads * shape.d_k && ldk >= shape.heads * shape.d_k &&
                 ldv >= shape.heads * shape.d_v,
             "attention row strides ldq=" << ldq << " ldk=" << ldk << " ldv=" << ldv
                                          << " narrower than h*d_k=" << shape.heads * shape.d_k
                                          << " / h*d_v=" << shape.heads * shape.d_v);
  THPC_CHECK(shape.dropout >= 0.0f && shape.dropout < 1.0f,
             "attention dropout " << shape.dropout << " outside [0, 1)");
}

int row_top_k_selectable(int width, int skip_a, int skip_b) {
  int skipped = 0;
  if (skip_a >= 0 && skip_a < width) ++skipped;
  if (skip_b >= 0 && skip_b < width && skip_b != skip_a) ++skipped;
  return width - skipped;
}

void check_row_top_k(int rows, int width, int k, int skip_a, int skip_b) {
  THPC_CHECK(rows >= 0 && width >= 0, "row_top_k over " << rows << " rows of " << width);
  const int selectable = row_top_k_selectable(width, skip_a, skip_b);
  THPC_CHECK(k >= 1 && k <= selectable, "row_top_k asked for the best " << k << " of "
                                            << selectable << " selectable entries per row ("
                                            << width << " columns, skipping " << skip_a
                                            << " and " << skip_b << ")");
}

bool parse_candidate_kernels(const std::string& setting, unsigned& candidates,
                             std::string& error) {
  // The candidates by name (kernels/ops.h's THPC_CANDIDATE_KERNELS).
  static const std::vector<std::pair<std::string, unsigned>> kNames = {
#define THPC_CANDIDATE_NAME(enumerator, bit, name) {name, enumerator},
      THPC_CANDIDATE_KERNELS(THPC_CANDIDATE_NAME)
#undef THPC_CANDIDATE_NAME
  };
  // Former candidates, the default since their GPU run: a configuration or checkpoint
  // that names them (one trained with them before that) still loads, naming nothing.
  static const std::vector<std::string> kRetired = {
      "write_gradients", "short_attention", "gathered_attention", "async_upload",
      "step_totals",     "int8_products",   "fused_adam",         "vector_norms",
      "loss_rows_from_l2", "pinned_snapshot", "kept_ones",         "decode_attention"};
  std::string allowed = "verified, candidate";
  if (!kNames.empty()) {
    allowed += ", or some of ";
    for (size_t i = 0; i < kNames.size(); ++i) allowed += (i ? "," : "") + kNames[i].first;
    allowed += " (comma-separated)";
  } else {
    allowed += " (no kernel waits for a GPU run at present)";
  }
  candidates = kNoCandidates;
  if (setting == "verified") return true;
  if (setting == "candidate") {
    candidates = kAllCandidates;
    return true;
  }
  if (setting.empty() || setting.back() == ',') {
    error = "expected " + allowed;
    return false;
  }
  std::stringstream items(setting);
  std::string item;
  while (std::getline(items, item, ',')) {
    unsigned bit = 0;
    for (const auto& [name, value] : kNames) {
      if (item == name) bit = value;
    }
    if (std::find(kRetired.begin(), kRetired.end(), item) != kRetired.end()) continue;
    if (bit == 0) {
      error = "'" + item + "' is not a candidate kernel: give " + allowed;
      candidates = kNoCandidates;
      return false;
    }
    candidates |= bit;
  }
  return true;
}

void check_row_top_k(const Tensor& values, const int32_t* /*columns*/, const Tensor& x,
                     int rows, int width, int k, int skip_a, int skip_b) {
  check_row_top_k(rows, width, k, skip_a, skip_b);
  THPC_CHECK(values.numel >= int64_t(rows) * k && x.numel >= int64_t(rows) * width,
             "row_top_k: " << values.numel << " values for " << rows << " x " << k << ", or "
                           << x.numel << " entries for " << rows << " x " << width);
}

namespace {

// The WorkClock of a synchronous backend: the host's steady clock at each mark.
class SteadyWorkClock final : public WorkClock {
 public:
  int mark() override {
    marks_.push_back(std::chrono::steady_clock::now());
    return static_cast<int>(marks_.size()) - 1;
  }
  double seconds_between(int from, int to) override {
    THPC_CHECK(from >= 0 && to >= 0 && from < static_cast<int>(marks_.size()) &&
                   to < static_cast<int>(marks_.size()),
               "marks " << from << " and " << to << " of " << marks_.size());
    return std::chrono::duration<double>(marks_[to] - marks_[from]).count();
  }
  double seconds_since_origin(int mark) override {
    THPC_CHECK(mark >= 0 && mark < static_cast<int>(marks_.size()),
               "mark " << mark << " of " << marks_.size());
    // The process's first use of any such clock's origin: one for every thread.
    static const std::chrono::steady_clock::time_point origin = std::chrono::steady_clock::now();
    return std::chrono::duration<double>(marks_[mark] - origin).count();
  }
  void clear() override { marks_.clear(); }

 private:
  std::vector<std::chrono::steady_clock::time_point> marks_;
};

// The HostStaging of a backend that copies to the host synchronously (the default).
// Its memory is left uninitialised (each copy writes it): zeroing the 1.9 GB of a large
// model's state took 2.4 s more of rank 0's checkpoint, which the other ranks wait for; the
// copy goes in pieces of 64 MiB with a sign of work between (common/still_working.h).
class DownloadingHostStaging final : public HostStaging {
 public:
  DownloadingHostStaging(Backend& backend, int64_t floats)
      : backend_(backend), floats_(new float[static_cast<size_t>(floats)]), count_(floats) {}
  int64_t floats() const override { return count_; }
  void queue_download(int64_t offset, Tensor src) override {
    check_copy(offset, src);
    constexpr int64_t kPiece = int64_t{1} << 24;  // floats
    for (int64_t done = 0; done < src.numel; done += kPiece) {
      show_still_working();
      const int64_t piece = std::min(kPiece, src.numel - done);
      backend_.download(floats_.get() + offset + done, src.slice(done, piece));
    }
  }
  const float* wait() override { return floats_.get(); }

 private:
  Backend& backend_;
  std::unique_ptr<float[]> floats_;
  int64_t count_;
};

}  // namespace

void HostStaging::check_copy(int64_t offset, const Tensor& src) const {
  THPC_CHECK(src.dtype == DType::F32, "a staged copy of a " << dtype_name(src.dtype)
                                                              << " tensor (fp32 only)");
  THPC_CHECK(offset >= 0 && offset + src.numel <= floats(),
             "a staged copy of " << src.numel << " floats at " << offset << " into "
                                 << floats());
}

std::unique_ptr<HostStaging> Backend::make_host_staging(int64_t floats) {
  THPC_CHECK(floats >= 0, "host staging of " << floats << " floats");
  return std::make_unique<DownloadingHostStaging>(*this, floats);
}

std::unique_ptr<WorkClock> Backend::make_work_clock() {
  return std::make_unique<SteadyWorkClock>();
}

int64_t Backend::attention_saved_numel(const AttentionShape& shape) {
  return static_cast<int64_t>(shape.batch) * shape.heads * shape.query_len * shape.key_len;
}

const char* op_name(OpId op) {
  switch (op) {
#define THPC_OP(ret, name, params, args) \
  case OpId::name: return #name;
#include "kernels/op_list.h"
#undef THPC_OP
  }
  return "?";
}

namespace {

// A zeroed param_dtype tensor of `bytes` (a struct's, which ops see as that struct).
Tensor zeroed_struct_bytes(Backend& backend, size_t bytes, const char* what) {
  const size_t element = dtype_size(backend.param_dtype());
  THPC_CHECK(bytes % element == 0, "a " << what << " is not a whole number of "
                                        << dtype_name(backend.param_dtype()) << " elements");
  Tensor tensor = backend.alloc(backend.param_dtype(), static_cast<int64_t>(bytes / element));
  backend.zero(tensor);
  return tensor;
}

}  // namespace

StepTotalsBuffer::StepTotalsBuffer(Backend& backend)
    : backend_(backend),
      tensor_(zeroed_struct_bytes(backend, sizeof(StepTotals), "StepTotals")) {}

StepTotalsBuffer::~StepTotalsBuffer() { backend_.free(tensor_); }

StepTotals StepTotalsBuffer::read(int vocab) {
  StepTotals host;
  backend_.download(&host, tensor_);
  if (host.bad_rows > 0) {
    THPC_FAIL("target id " << host.first_bad_target << " at row " << host.first_bad_row
                           << " is outside the vocabulary [0, " << vocab << ")");
  }
  return host;
}

StepInputsBuffer::StepInputsBuffer(Backend& backend)
    : backend_(backend),
      tensor_(zeroed_struct_bytes(backend, sizeof(StepInputs), "StepInputs")) {}

StepInputsBuffer::~StepInputsBuffer() { backend_.free(tensor_); }

void StepInputsBuffer::set(const StepInputs& inputs) { backend_.write_step_inputs(tensor_, inputs); }

std::unique_ptr<CapturedWork> Backend::capture(const std::function<void()>&) { return nullptr; }

void TwinTensor::wrong_dtype(DType expected) const {
  std::ostringstream detail;
  detail << op_name(op_) << ": argument " << position_ << " is a " << dtype_name(tensor_.dtype)
         << " tensor where the " << backend_.name() << " backend takes " << dtype_name(expected);
  throw_check_failure("tensor.dtype == dtype_of<Element>()", __FILE__, __LINE__, detail.str());
}

Tensor Tensor::slice(int64_t offset, int64_t count) const {
  THPC_CHECK(offset >= 0 && count >= 0 && offset + count <= numel,
             "slice [" << offset << ", " << offset + count << ") of a tensor of " << numel);
  Tensor view = *this;
  view.data = static_cast<char*>(data) + offset * static_cast<int64_t>(dtype_size(dtype));
  view.numel = count;
  return view;
}

}  // namespace thpc
