#include "kernels/profiling_backend.h"

#include <algorithm>
#include <cstdio>
#include <utility>

#include "common/error.h"

namespace thpc {
namespace {

// Every op of kernels/op_list.h and its class: the one table of the mapping.
constexpr std::pair<OpId, OpClass> kOpClasses[] = {
    {OpId::embedding_forward, OpClass::Embedding},
    {OpId::embedding_backward, OpClass::Embedding},
    {OpId::linear_forward, OpClass::GemmForward},
    {OpId::linear_backward, OpClass::GemmBackward},
    // The FFN's first layer with its ReLU as the GEMM's epilogue: a GEMM.
    {OpId::linear_relu_forward, OpClass::GemmForward},
    {OpId::relu_bias_backward, OpClass::BiasRelu},
    // The same with the ReLU's bit-mask kept, and the second layer's backward with the
    // ReLU's in its input-gradient GEMM's epilogue: GEMMs.
    {OpId::linear_relu_mask_forward, OpClass::GemmForward},
    {OpId::linear_relu_backward, OpClass::GemmBackward},
    {OpId::output_projection_forward, OpClass::GemmForward},
    {OpId::output_projection_backward, OpClass::GemmBackward},
    {OpId::layernorm_forward, OpClass::AddNorm},
    {OpId::layernorm_backward, OpClass::AddNorm},
    {OpId::add_dropout_layernorm_forward, OpClass::AddNorm},
    {OpId::add_dropout_layernorm_backward, OpClass::AddNorm},
    {OpId::attention_forward, OpClass::Attention},
    {OpId::attention_backward, OpClass::Attention},
    {OpId::relu_forward, OpClass::BiasRelu},
    {OpId::relu_backward, OpClass::BiasRelu},
    // The model's only plain dropout is on the embedding sums (§5.4).
    {OpId::dropout_forward, OpClass::Embedding},
    {OpId::dropout_backward, OpClass::Embedding},
    {OpId::residual_dropout_forward, OpClass::AddNorm},
    {OpId::residual_dropout_backward, OpClass::AddNorm},
    {OpId::copy_rows, OpClass::Decoding},
    {OpId::softmax_cross_entropy, OpClass::CrossEntropy},
    {OpId::softmax_cross_entropy_add, OpClass::CrossEntropy},
    {OpId::softmax_nll_rows, OpClass::CrossEntropy},
    {OpId::log_softmax, OpClass::CrossEntropy},
    {OpId::row_top_k, OpClass::Decoding},
    {OpId::adam_update, OpClass::Adam},
    {OpId::adamw_update, OpClass::Adam},
    {OpId::sum_squares, OpClass::GradientNorm},
    {OpId::sum_squares_into, OpClass::GradientNorm},
    {OpId::scale, OpClass::GradientNorm},
    {OpId::write_step_inputs, OpClass::Memory},
};

constexpr int kOpCount = 0
#define THPC_OP(ret, name, params, args) +1
#include "kernels/op_list.h"
#undef THPC_OP
    ;

// The table names each op exactly once.
constexpr bool names_every_op_once() {
  for (int op = 0; op < kOpCount; ++op) {
    int found = 0;
    for (const auto& entry : kOpClasses) found += static_cast<int>(entry.first) == op;
    if (found != 1) return false;
  }
  return true;
}
static_assert(sizeof(kOpClasses) / sizeof(kOpClasses[0]) == kOpCount && names_every_op_once(),
              "kOpClasses must give every op of kernels/op_list.h its class, once");

// The ops classed as GEMMs or attention are those whose matrix FLOPs are counted.
constexpr bool products_are_counted() {
  for (const auto& [op, op_class] : kOpClasses) {
    const bool product = op_class == OpClass::GemmForward ||
                         op_class == OpClass::GemmBackward || op_class == OpClass::Attention;
    if (product != counts_matrix_flops(op)) return false;
  }
  return true;
}
static_assert(products_are_counted(),
              "an op classed as a GEMM or attention in kOpClasses must be one of "
              "counts_matrix_flops' (kernels/profiling_backend.h), with its branch in "
              "matrix_flops, and only those");

}  // namespace

const char* op_class_label(OpClass op_class) {
  switch (op_class) {
    case OpClass::GemmForward: return "GEMM forward";
    case OpClass::GemmBackward: return "GEMM backward";
    case OpClass::Attention: return "attention";
    case OpClass::AddNorm: return "residual+dropout+layer norm";
    case OpClass::BiasRelu: return "bias+ReLU";
    case OpClass::CrossEntropy: return "cross-entropy";
    case OpClass::Embedding: return "embedding (+ its dropout)";
    case OpClass::Adam: return "Adam";
    case OpClass::GradientNorm: return "gradient norm, scaling";
    case OpClass::Memory: return "zero, copy, transfers";
    case OpClass::Decoding: return "decoding (copy_rows, top-k)";
    case OpClass::Captured: return "captured passes (CUDA graphs)";
    case OpClass::kCount: break;
  }
  return "?";
}

OpClass op_class(OpId op) {
  for (const auto& entry : kOpClasses) {
    if (entry.first == op) return entry.second;
  }
  THPC_CHECK(false, "no class for op " << op_name(op));
  return OpClass::kCount;
}

double OpProfile::host_seconds() const {
  double in_ops = 0.0;
  for (const Row& row : rows) in_ops += row.seconds;
  return span_seconds - in_ops;
}

double union_length(std::vector<OpProfile::Interval> intervals) {
  std::sort(intervals.begin(), intervals.end());
  double length = 0.0;
  bool open = false;
  OpProfile::Interval current{0.0, 0.0};
  for (const OpProfile::Interval& interval : intervals) {
    if (open && interval.first <= current.second) {
      current.second = std::max(current.second, interval.second);
      continue;
    }
    if (open) length += current.second - current.first;
    current = interval;
    open = true;
  }
  if (open) length += current.second - current.first;
  return length;
}

double OpProfile::wall_seconds() const { return union_length(step_intervals); }

// The ops are in flight only inside the steps (marks are kept between begin_step and
// end_step), so the steps' union less the ops' union is the time inside the steps with
// none in flight.
double OpProfile::idle_seconds() const {
  return std::max(0.0, wall_seconds() - union_length(busy_intervals));
}

namespace {

void add_row(OpProfile::Row& into, const OpProfile::Row& row) {
  into.seconds += row.seconds;
  into.calls += row.calls;
  into.flops += row.flops;
}

}  // namespace

OpProfile& OpProfile::operator+=(const OpProfile& other) {
  for (int c = 0; c < kOpClassCount; ++c) add_row(rows[c], other.rows[c]);
  for (const auto& [op, row] : other.ops) add_row(ops[op], row);
  steps += other.steps;
  span_seconds += other.span_seconds;
  step_intervals.insert(step_intervals.end(), other.step_intervals.begin(),
                        other.step_intervals.end());
  busy_intervals.insert(busy_intervals.end(), other.busy_intervals.begin(),
                        other.busy_intervals.end());
  workers = std::max(workers, other.workers);
  return *this;
}

std::string format_profile(const OpProfile& profile, const std::string& backend_name,
                           double ceiling_tflops, const std::string& unit) {
  std::string text;
  char line[256];
  const double steps = profile.steps > 0 ? profile.steps : 1;
  const double step_ms = 1e3 * profile.span_seconds / steps;
  const char* per = unit.c_str();
  std::snprintf(line, sizeof line, "profile: %d %s%s on %s, %.3f ms per %s\n", profile.steps,
                per, profile.steps == 1 ? "" : (unit == "batch" ? "es" : "s"),
                backend_name.c_str(), step_ms, per);
  text += line;
  const std::string ms = "ms/" + unit, calls = "calls/" + unit, gflop = "GFLOP/" + unit;
  std::snprintf(line, sizeof line, "%-30s %10s %7s %11s %12s %9s\n", "op class", ms.c_str(),
                "share", calls.c_str(), gflop.c_str(), "TFLOP/s");
  text += line;
  const auto share = [&](double seconds) {
    return profile.span_seconds > 0 ? 100.0 * seconds / profile.span_seconds : 0.0;
  };
  for (int c = 0; c < kOpClassCount; ++c) {
    const OpProfile::Row& row = profile.rows[c];
    if (row.calls == 0) continue;
    const std::string label = op_class_label(static_cast<OpClass>(c));
    if (row.flops > 0) {
      std::snprintf(line, sizeof line, "%-30s %10.3f %6.1f%% %11.1f %12.2f %9.4g\n",
                    label.c_str(), 1e3 * row.seconds / steps, share(row.seconds),
                    row.calls / steps, 1e-9 * row.flops / steps,
                    row.seconds > 0 ? 1e-12 * row.flops / row.seconds : 0.0);
    } else {
      std::snprintf(line, sizeof line, "%-30s %10.3f %6.1f%% %11.1f\n", label.c_str(),
                    1e3 * row.seconds / steps, share(row.seconds), row.calls / steps);
    }
    text += line;
  }
  std::snprintf(line, sizeof line, "%-30s %10.3f %6.1f%%\n", "host time between kernels",
                1e3 * profile.host_seconds() / steps, share(profile.host_seconds()));
  text += line;
  const std::string total = "total (the " + unit + ")";
  std::snprintf(line, sizeof line, "%-30s %10.3f %6.1f%%\n", total.c_str(), step_ms,
                profile.span_seconds > 0 ? 100.0 : 0.0);
  text += line;
  // Workers sharing a device: each one's rows above count its own stream, whose gaps the
  // others' work may fill; what the device itself waited is the time none had an op in
  // flight, as a share of the time any worker was inside a batch.
  if (profile.workers > 1) {
    const double wall = profile.wall_seconds(), idle = profile.idle_seconds();
    const std::string label = "device idle, all " + std::to_string(profile.workers) + " workers";
    std::snprintf(line, sizeof line,
                  "%-30s %10.3f %6.1f%% of the %.3f s in which any worker ran a %s (the rows "
                  "above add up the workers' own streams)\n",
                  label.c_str(), 1e3 * idle / steps, wall > 0 ? 100.0 * idle / wall : 0.0,
                  wall, per);
    text += line;
  }
  const OpProfile::Row& forward = profile.rows[static_cast<int>(OpClass::GemmForward)];
  const OpProfile::Row& backward = profile.rows[static_cast<int>(OpClass::GemmBackward)];
  const double gemm_flops = forward.flops + backward.flops;
  const double gemm_seconds = forward.seconds + backward.seconds;
  if (gemm_seconds > 0 && ceiling_tflops > 0) {
    const double rate = 1e-12 * gemm_flops / gemm_seconds;
    std::snprintf(line, sizeof line,
                  "GEMMs (forward + backward): %.2f GFLOP per step at %.4g TFLOP/s, %.3f of the "
                  "measured ceiling %.4g TFLOP/s\n",
                  1e-9 * gemm_flops / steps, rate, rate / ceiling_tflops, ceiling_tflops);
    text += line;
  }
  // Each op, the longest first (equal times by name, so the order is fixed).
  std::vector<std::pair<std::string, OpProfile::Row>> ops(profile.ops.begin(),
                                                          profile.ops.end());
  std::stable_sort(ops.begin(), ops.end(), [](const auto& a, const auto& b) {
    return a.second.seconds > b.second.seconds;
  });
  if (!ops.empty()) {
    const std::string us = "us/call";
    std::snprintf(line, sizeof line, "by op: %-30s %10s %11s %9s %9s\n", "op", ms.c_str(),
                  calls.c_str(), us.c_str(), "TFLOP/s");
    text += line;
  }
  for (const auto& [op, row] : ops) {
    const double per_call_us = row.calls > 0 ? 1e6 * row.seconds / row.calls : 0.0;
    if (row.flops > 0) {
      std::snprintf(line, sizeof line, "by op: %-30s %10.3f %11.1f %9.1f %9.4g\n", op.c_str(),
                    1e3 * row.seconds / steps, row.calls / steps, per_call_us,
                    row.seconds > 0 ? 1e-12 * row.flops / row.seconds : 0.0);
    } else {
      std::snprintf(line, sizeof line, "by op: %-30s %10.3f %11.1f %9.1f\n", op.c_str(),
                    1e3 * row.seconds / steps, row.calls / steps, per_call_us);
    }
    text += line;
  }
  return text;
}

ProfilingBackend::ProfilingBackend(Backend& inner)
    : ForwardingBackend(inner), clock_(inner.make_work_clock()) {}

void ProfilingBackend::begin_step() {
  THPC_CHECK(!recording_, "begin_step() twice without end_step()");
  recording_ = true;
  step_start_ = clock_->mark();
}

void ProfilingBackend::end_step() {
  THPC_CHECK(recording_, "end_step() without begin_step()");
  steps_.emplace_back(step_start_, clock_->mark());
  recording_ = false;
}

OpProfile ProfilingBackend::take() {
  const OpProfile profile = collect();
  steps_.clear();
  calls_.clear();
  clock_->clear();
  return profile;
}

OpProfile ProfilingBackend::collect() {
  THPC_CHECK(!recording_, "collect() inside a step");
  OpProfile profile;
  profile.steps = static_cast<int>(steps_.size());
  for (const auto& [start, end] : steps_) {
    profile.span_seconds += clock_->seconds_between(start, end);
    profile.step_intervals.emplace_back(clock_->seconds_since_origin(start),
                                        clock_->seconds_since_origin(end));
  }
  std::vector<OpProfile::Interval>& busy = profile.busy_intervals;
  for (const Call& call : calls_) {
    const OpProfile::Row one{clock_->seconds_between(call.start, call.end), 1, call.flops};
    add_row(profile.rows[static_cast<int>(call.op_class)], one);
    add_row(profile.ops[call.op], one);
    // The calls come in the order they were queued: one that starts where the last
    // ended (on a GPU, queued before the last was done) extends its interval.
    const OpProfile::Interval interval{clock_->seconds_since_origin(call.start),
                                       clock_->seconds_since_origin(call.end)};
    if (!busy.empty() && interval.first <= busy.back().second) {
      busy.back().second = std::max(busy.back().second, interval.second);
    } else {
      busy.push_back(interval);
    }
  }
  return profile;
}

ProfilingBackend::Timed::Timed(ProfilingBackend& owner, OpClass op_class, const char* op,
                               double flops)
    : owner_(owner), op_class_(op_class), op_(op), flops_(flops) {
  if (owner_.capturing_) {
    owner_.captured_flops_ += flops;
    return;
  }
  if (owner_.recording_) start_ = owner_.clock_->mark();
}

// A capture of the inner backend whose replays are timed as one call of OpClass::Captured
// with the captured ops' FLOPs.
class ProfilingBackend::TimedReplay final : public CapturedWork {
 public:
  TimedReplay(ProfilingBackend& owner, std::unique_ptr<CapturedWork> work, double flops)
      : owner_(owner), work_(std::move(work)), flops_(flops) {}
  bool replay() override {
    const Timed timed(owner_, OpClass::Captured, "captured_pass", flops_);
    return work_->replay();
  }

 private:
  ProfilingBackend& owner_;
  std::unique_ptr<CapturedWork> work_;
  double flops_;
};

std::unique_ptr<CapturedWork> ProfilingBackend::capture(const std::function<void()>& queue_work) {
  THPC_CHECK(!capturing_, "a capture inside a capture");
  capturing_ = true;
  captured_flops_ = 0.0;
  std::unique_ptr<CapturedWork> work;
  try {
    work = inner().capture(queue_work);
  } catch (...) {
    capturing_ = false;
    throw;
  }
  capturing_ = false;
  if (work == nullptr) return nullptr;
  return std::make_unique<TimedReplay>(*this, std::move(work), captured_flops_);
}

ProfilingBackend::Timed::~Timed() {
  if (start_ < 0) return;
  // No throw from a destructor: a clock that fails here loses this call's time.
  try {
    const int end = owner_.clock_->mark();
    owner_.calls_.push_back(Call{op_class_, op_, start_, end, flops_});
  } catch (...) {
  }
}

void ProfilingBackend::zero(Tensor tensor) {
  const Timed timed(*this, OpClass::Memory, "zero", 0.0);
  inner().zero(tensor);
}
void ProfilingBackend::copy(Tensor dst, Tensor src) {
  const Timed timed(*this, OpClass::Memory, "copy", 0.0);
  inner().copy(dst, src);
}
void ProfilingBackend::upload(Tensor dst, const void* host) {
  const Timed timed(*this, OpClass::Memory, "upload", 0.0);
  inner().upload(dst, host);
}
void ProfilingBackend::download(void* host, Tensor src) {
  const Timed timed(*this, OpClass::Memory, "download", 0.0);
  inner().download(host, src);
}
void ProfilingBackend::upload_ids(int32_t* dst, const int32_t* host, int64_t count) {
  const Timed timed(*this, OpClass::Memory, "upload_ids", 0.0);
  inner().upload_ids(dst, host, count);
}
void ProfilingBackend::download_ids(int32_t* host, const int32_t* src, int64_t count) {
  const Timed timed(*this, OpClass::Memory, "download_ids", 0.0);
  inner().download_ids(host, src, count);
}

}  // namespace thpc
