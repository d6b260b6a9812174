// Where a training step's time goes, op class by op class: a Backend that runs every
// call on another backend and times it (transformer_bench_step --profile).
//
// ProfilingBackend is made from the op list (kernels/op_list.h: one more include of it):
// each op override takes a mark of the inner backend's WorkClock before and after
// passing the call on, so an op's time is what the backend spent on it — on the CPU the
// steady clock around a synchronous call, on a GPU the time between two events recorded
// on the backend's stream around the op's kernels (no synchronisation is added inside a
// step; the marks are read back by collect()). The memory calls (zero, copy, the
// transfers) are timed the same way; allocation and synchronize() pass through untimed.
//
// Between begin_step() and end_step() the marks are kept; outside (warm-up) calls pass
// through untimed. A step's time is the span of its two step marks on the same clock, so
// the rows add up to it by construction: "host time between kernels" is the step's span
// minus its ops' time — on a GPU the time the device waited for the host (launch gaps,
// host code, read-backs), on the CPU the model's own host code between ops.
//
// Each op belongs to one OpClass (op_class(), one table in profiling_backend.cc that
// names every op of the list), and the matrix products count their model FLOPs
// (2 * M * K * N per product; attention's two batched products forward and four
// backward), so that the GEMM classes' rates can be set against the machine's ceiling.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "kernels/forwarding_backend.h"
#include "kernels/ops.h"

namespace thpc {

// The rows of the profile, in the order they are printed.
enum class OpClass {
  GemmForward,    // linear_forward, linear_relu_forward (and _mask_), output_projection_forward
  GemmBackward,   // linear_backward (its bias sums too), linear_relu_backward,
                  // output_projection_backward
  Attention,      // attention_forward, attention_backward
  AddNorm,        // residual + dropout, layer norm; fused: add_dropout_layernorm_*
  BiasRelu,       // ReLU's backward (fused: relu_bias_backward, b1's gradient with it)
                  // and the unfused ReLU forward
  CrossEntropy,   // softmax_cross_entropy(_add) (the loss and its gradient), log_softmax,
                  // softmax_nll_rows
  Embedding,      // embedding forward and backward, the embeddings' dropout
  Adam,           // adam_update, adamw_update (train.weight_decay)
  GradientNorm,   // sum_squares(_into), scale: the gradient's norm and clipping
  Memory,         // zero, copy (the bf16 weight refresh), uploads and downloads,
                  // write_step_inputs
  Decoding,       // copy_rows, row_top_k
  Captured,       // replays of passes captured into CUDA graphs (Backend::capture): their
                  // ops are timed as one, their matrix FLOPs counted with them
  kCount
};
constexpr int kOpClassCount = static_cast<int>(OpClass::kCount);

// "GEMM forward" for OpClass::GemmForward.
const char* op_class_label(OpClass op_class);
// The class an op's time is counted in.
OpClass op_class(OpId op);

// The model FLOPs of one call of `op`: its matrix products' 2 * M * K * N, 0 for ops
// without any. `args` are the call's arguments, as the op list names them.
template <OpId op, typename Args>
double matrix_flops(const Args& args);

// What collect() returns: per class, the time and calls of the recorded steps and their
// matrix FLOPs; steps and their span on the backend's clock.
struct OpProfile {
  struct Row {
    double seconds = 0.0;
    int64_t calls = 0;
    double flops = 0.0;
  };
  std::array<Row, kOpClassCount> rows{};
  // The same calls by op (op_name: "attention_backward"; the memory calls by their
  // function's name, "upload_ids"; a captured pass's replay "captured_pass"): which op of
  // a class takes its time, and each call's mean (a kernel's latency shows at a small
  // batch: the one-rank step's ReLU backward, 42 us a call for ~10 us of bytes).
  std::map<std::string, Row> ops;
  int steps = 0;
  double span_seconds = 0.0;  // the recorded steps, each from its begin to its end mark
  // The steps' span less every op's time: on a GPU the device waiting for the host.
  double host_seconds() const;

  // The same steps and ops on the time line their device's clocks share
  // (WorkClock::seconds_since_origin), [begin, end] in seconds: each step's span, and the
  // time the ops were in flight (queued and not yet done), ops that follow each other
  // without a gap merged into one interval.
  using Interval = std::pair<double, double>;
  std::vector<Interval> step_intervals, busy_intervals;
  // How many workers' profiles, on one device, were added into this one (their owner
  // says so: transformer_decode --gpu-workers); the rows above are then their sums.
  int workers = 1;
  // The time within the steps (the union of step_intervals) in which no op was in flight
  // (the union of busy_intervals): with several workers' profiles added, the device
  // waiting for every worker's host at once; with one, host_seconds() on the time line.
  double idle_seconds() const;
  double wall_seconds() const;  // the union of step_intervals' length
  // Adds another profile's steps, spans, rows and intervals (profiles collected in
  // turns, or the profiles of workers sharing a device).
  OpProfile& operator+=(const OpProfile& other);
};

// The length of the union of `intervals` (each [begin, end], in any order, overlapping
// or not).
double union_length(std::vector<OpProfile::Interval> intervals);

// The profile as a table, one line per class that was called plus the host time and
// the total, per step; then the GEMMs' FLOP-weighted rate against `ceiling_tflops`
// (the machine's measured matrix-product rate; <= 0: not printed); then each op, the
// longest first, a line "by op: NAME ms/step calls/step us/call [TFLOP/s]". `unit`
// names what a step is ("step": a training step; transformer_decode --profile: "batch").
std::string format_profile(const OpProfile& profile, const std::string& backend_name,
                           double ceiling_tflops, const std::string& unit = "step");

// Not final: a test derives from it to change what the inner backend offers (the CPU's
// decoding with the GPU's cache layout, IncrementalDecoding.RowsLayout*).
class ProfilingBackend : public ForwardingBackend {
 public:
  explicit ProfilingBackend(Backend& inner);

  // Everything the backend does between these two calls counts as one step.
  void begin_step();
  void end_step();
  // Reads back every mark of the recorded steps (waiting for the backend's work) and
  // sums them per class.
  OpProfile collect();
  // collect(), then forgets the recorded steps and reuses their marks: a long run takes
  // its profile in turns, so that its marks (on a GPU, events) stay few.
  OpProfile take();

  // Captured work (CUDA graphs) is timed as one item a replay (OpClass::Captured): the
  // ops queued while capturing are not timed one by one (their marks would be graph
  // nodes), but their matrix FLOPs are summed into the replay's. So a profile of captured
  // passes still says how much of the step the device was idle ("host time between
  // kernels", issue 51's host_gap_share).
  bool can_capture(CaptureUse use) const override { return inner().can_capture(use); }
  std::unique_ptr<CapturedWork> capture(const std::function<void()>& queue_work) override;

  // The memory calls, timed (allocation and synchronize() pass through untimed).
  void zero(Tensor tensor) override;
  void copy(Tensor dst, Tensor src) override;
  void upload(Tensor dst, const void* host) override;
  void download(void* host, Tensor src) override;
  void upload_ids(int32_t* dst, const int32_t* host, int64_t count) override;
  void download_ids(int32_t* host, const int32_t* src, int64_t count) override;

  // The ops: each entry of kernels/op_list.h passed on to the inner backend between two
  // marks, counted in its class with its matrix FLOPs.
#define THPC_OP(ret, name, params, args)                                                   \
  ret name params override {                                                              \
    const Timed timed(*this, op_class(OpId::name), #name,                                 \
                      matrix_flops<OpId::name>(std::forward_as_tuple args));               \
    return inner().name args;                                                             \
  }
#include "kernels/op_list.h"
#undef THPC_OP

 private:
  // One timed call: marks the clock at construction and destruction while a step is
  // being recorded.
  class Timed {
   public:
    // `op`: a string literal (the op's or the memory call's name), kept by pointer.
    Timed(ProfilingBackend& owner, OpClass op_class, const char* op, double flops);
    ~Timed();
    Timed(const Timed&) = delete;
    Timed& operator=(const Timed&) = delete;

   private:
    ProfilingBackend& owner_;
    OpClass op_class_;
    const char* op_;
    double flops_;
    int start_ = -1;
  };
  struct Call {
    OpClass op_class;
    const char* op;
    int start, end;  // marks
    double flops;
  };

  class TimedReplay;

  std::unique_ptr<WorkClock> clock_;
  bool recording_ = false;
  bool capturing_ = false;      // inside capture(): the ops' marks are left out
  double captured_flops_ = 0.0;  // their matrix FLOPs, for the replays'
  int step_start_ = -1;
  std::vector<Call> calls_;
  std::vector<std::pair<int, int>> steps_;  // begin and end marks
};

// ---- matrix FLOPs of the ops that multiply matrices ----------------------------------

// The ops whose matrix FLOPs matrix_flops counts, a branch each: every op classed as a GEMM
// or attention (kOpClasses, profiling_backend.cc, asserts it), so that a new product op is
// not counted as none, its MFU and TFLOP/s wrong without a word (a helper's trial adding
// an op).
constexpr bool counts_matrix_flops(OpId op) {
  switch (op) {
    case OpId::linear_forward:
    case OpId::linear_relu_forward:
    case OpId::linear_relu_mask_forward:
    case OpId::linear_backward:
    case OpId::linear_relu_backward:
    case OpId::output_projection_forward:
    case OpId::output_projection_backward:
    case OpId::attention_forward:
    case OpId::attention_backward:
      return true;
    default:
      return false;
  }
}

template <OpId op, typename Args>
double matrix_flops(const Args& args) {
  // Each branch unpacks the op's arguments under the op list's names (a change of the
  // list's arity fails to compile here).
  const auto count = [](bool present) { return present ? 1.0 : 0.0; };
  if constexpr (op == OpId::linear_forward || op == OpId::linear_relu_forward) {
    [[maybe_unused]] const auto& [y, x, W, b, M, K, N] = args;
    return 2.0 * M * K * N;
  } else if constexpr (op == OpId::linear_relu_mask_forward) {
    [[maybe_unused]] const auto& [y, mask, x, W, b, M, K, N] = args;
    return 2.0 * M * K * N;
  } else if constexpr (op == OpId::linear_backward) {
    [[maybe_unused]] const auto& [dx, dW, db, dy, x, W, M, K, N, store] = args;
    return 2.0 * M * K * N * (count(static_cast<bool>(dx)) + count(static_cast<bool>(dW)));
  } else if constexpr (op == OpId::linear_relu_backward) {
    [[maybe_unused]] const auto& [d_pre, dW, db, dy, y, mask, W, M, K, N] = args;
    return 2.0 * M * K * N * (count(static_cast<bool>(d_pre)) + count(static_cast<bool>(dW)));
  } else if constexpr (op == OpId::output_projection_forward) {
    [[maybe_unused]] const auto& [logits, h, E, M, d, vocab] = args;
    return 2.0 * M * d * vocab;
  } else if constexpr (op == OpId::output_projection_backward) {
    [[maybe_unused]] const auto& [dh, dE, d_logits, h, E, M, d, vocab, store] = args;
    return 2.0 * M * d * vocab * (count(static_cast<bool>(dh)) + count(static_cast<bool>(dE)));
  } else if constexpr (op == OpId::attention_forward) {
    // Q K^T and P V for every (sentence, head): 2 Lq Lk (d_k + d_v), masked or not.
    [[maybe_unused]] const auto& [out, saved, q, ldq, k, ldk, v, ldv, shape] = args;
    return 2.0 * shape.batch * shape.heads * shape.query_len * shape.key_len *
           (shape.d_k + shape.d_v);
  } else if constexpr (op == OpId::attention_backward) {
    // dV = P^T dO, dP = dO V^T, dQ = dS K, dK = dS^T Q: twice the forward's.
    [[maybe_unused]] const auto& [dq, dk, dv, d_out, saved, q, ldq, k, ldk, v, ldv, shape,
                                  store] = args;
    return 4.0 * shape.batch * shape.heads * shape.query_len * shape.key_len *
           (shape.d_k + shape.d_v);
  } else {
    static_assert(!counts_matrix_flops(op), "counts_matrix_flops names an op without a branch");
    return 0.0;
  }
}

}  // namespace thpc
