// The gradient all-reduce of data parallelism, in buckets that overlap backward.
//
// Backward finishes the parameters' gradients from the end of the flat buffer towards
// its start (decoder layers N-1..0, encoder layers N-1..0, then the shared embedding at
// offset 0; see add_transformer_parameters), so "every gradient at offset >= x is final"
// is a watermark that only falls. The reducer cuts the buffer into buckets of
// dist.bucket_mb from its end and starts a bucket's sum as soon as the watermark passes
// below it, while backward carries on with the layers beneath; finish() starts the
// remainder and completes everything. Bucket boundaries depend only on the buffer size
// and the bucket size, so every rank issues the same collectives in the same order.
//
// Three transports (dist.reducer): MPI_Iallreduce on host memory (the CPU backend); NCCL
// on the GPU (ncclAllReduce on a stream of its own, ordered after the compute stream by
// events); and MPI on the GPU, each bucket staged through pinned host memory, which lets
// several ranks share one GPU (NCCL refuses that).
//
// dist.reduce_dtype = bf16 halves the bytes on the wire: a bucket is rounded to bf16, summed
// as bf16 (each addition in fp32, rounded once), and widened back into the fp32 gradient;
// the optimizer and its fp32 master weights are untouched.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "distributed/communicator.h"
#include "kernels/ops.h"

namespace thpc {

// One pass's sums, timed (dist.log_buckets): milliseconds from begin(), where the last
// micro-batch's forward starts, by the host's clock, or on a GPU with NCCL by events on
// the streams that ran them (`device_clock`).
struct BucketTiming {
  int64_t offset = 0, elements = 0;  // the bucket's place in the gradient (-1: apart)
  double posted_ms = 0.0;            // its sum was posted (could start)
  double done_ms = 0.0;              // its sum was seen complete
};
struct ReductionTimings {
  bool device_clock = false;
  double backward_done_ms = 0.0;  // finish() was called: every gradient computed
  double sums_done_ms = 0.0;      // finish() returned: every sum complete
  std::vector<BucketTiming> buckets;  // in the order they were posted
};

class GradientReducer {
 public:
  explicit GradientReducer(int64_t bucket_bytes) : bucket_bytes_(bucket_bytes) {}
  virtual ~GradientReducer() = default;
  GradientReducer(const GradientReducer&) = delete;
  GradientReducer& operator=(const GradientReducer&) = delete;

  // A backward pass that will write `grads` begins; no sum is in flight.
  void begin(Tensor grads);
  // The sums started since begin() were queued into a CUDA graph the backend then refused
  // (a capture of the pass, capturable()): they never run. The pass starts over, as at
  // begin() with the same gradient, its sums to be started again.
  void restart();
  // grads[offset, end) are final: start the sums of the buckets that lie wholly there.
  void ready_from(int64_t offset);
  // The tied embedding's gradient summed per use (dist.embedding_sum = per_use): grads
  // [0, end) hold the output projection's share alone, final before the rest of backward
  // has run; their buckets (cut from `end` down, as the others) start now, and the
  // watermark's stop above `end`. Once a pass, before any other bucket can start.
  void start_early(int64_t end);
  // `extra` (host or backend memory as the gradient, not a slice of it: the embedding
  // lookups' rows) is summed with the rest: started by finish() after the gradient's last
  // bucket, complete when it returns. Every transport: the GPU's stage such a tensor
  // apart in buffers of its own (tensor_apart below).
  void sum_at_finish(Tensor extra);
  // Starts what is left and completes every sum: afterwards the backend's later ops (the
  // optimizer) see the summed gradients. queue_finish() then await_finish().
  void finish();
  // finish() in two halves, for a pass whose sums are captured with it (a CUDA graph of the
  // last micro-batch, Transformer::train_step): queue_finish() starts what is left and
  // queues the backend's wait for every sum (stream work only, where capturable(): the
  // captured pass ends with it); await_finish() waits for the sums on the host, with the
  // transport's timeout, once the pass has been queued or replayed.
  void queue_finish();
  void await_finish();
  // Whether begin()'s, ready_from()'s and queue_finish()'s work on the backend is stream
  // work a CUDA graph can hold, so that the pass whose backward starts the sums may be
  // captured with them: NCCL's launches, untimed (the timings read events on the host).
  // MPI's transports call the host: false.
  virtual bool capturable() const { return false; }
  // Buckets started in the current pass (for tests and the log).
  int buckets_started() const { return buckets_started_; }
  // Time every pass from now on (dist.log_buckets); timings() holds the last one's.
  void time_passes() { timing_ = true; }
  const ReductionTimings& timings() const { return timings_; }

 protected:
  virtual void start(Tensor bucket) = 0;
  // Called each time backward reports progress (once a layer): lets a transport that
  // advances only inside library calls move the started sums on.
  virtual void progress() {}
  // Every started sum complete: the backend's wait for them queued (queue_complete, may
  // be captured), then the host's (await_complete).
  virtual void queue_complete() {}
  virtual void await_complete() = 0;
  // The whole gradient of the current pass (the buckets are slices of it).
  Tensor gradients() const { return grads_; }
  // Where `bucket`, a slice of gradients(), starts in it, in elements: the place of its
  // copy in a transport's staging buffer as large as the gradient.
  int64_t offset_in_gradients(Tensor bucket) const {
    return (static_cast<const char*>(bucket.data) - static_cast<const char*>(grads_.data)) /
           static_cast<int64_t>(dtype_size(grads_.dtype));
  }
  // Which tensor apart `tensor` is in this pass (0, 1, ...: sum_at_finish's, in the order
  // given), or -1 when it is a bucket (a slice of gradients()): a transport that stages a
  // bucket at offset_in_gradients stages such a tensor in a buffer of its own.
  int tensor_apart(Tensor tensor) const;
  // Timing (time_passes()): whether this pass is timed; that bucket `index` (in the order
  // started) was seen complete now, by the host's clock (a bucket never reported is
  // complete when finish() returns).
  bool timing() const { return timing_; }
  void bucket_done(size_t index);
  // restart(): a capturable transport forgets what it queued for the discarded sums.
  virtual void discard_started() {}
  // A transport with a clock of its own: marks the pass's start (called by begin() when
  // timing), and replaces the pass's timings with its own after complete().
  virtual void begin_timing() {}
  virtual void finish_timings(ReductionTimings& /*timings*/) {}

 private:
  double host_ms() const;
  int64_t bucket_elements() const;
  void start_bucket(int64_t offset, int64_t elements);
  // Starts the sum of `bucket` (at `offset` in the gradient; -1: a tensor apart).
  void post(Tensor bucket, int64_t offset);

  int64_t bucket_bytes_;
  Tensor grads_;
  int64_t pending_end_ = 0;  // [floor_, pending_end_) not started yet
  int64_t floor_ = 0;        // [0, floor_) started early (start_early)
  std::vector<Tensor> extras_;  // sum_at_finish()
  int buckets_started_ = 0;
  bool timing_ = false;
  std::chrono::steady_clock::time_point pass_start_;
  ReductionTimings timings_;
};

// MPI_Iallreduce of host-memory buckets (the CPU backend; mpi_reducer.cc). comm must span
// more than one rank. With `bf16` (dist.reduce_dtype = bf16) the buckets travel and are
// summed as bf16, half the bytes, and come back into the fp32 gradient. A sum not
// complete after timeout_seconds (a rank stopped, hung or lost) ends the job there
// (MPI_Abort in wait_within, mpi_check.h; no exception).
std::unique_ptr<GradientReducer> make_mpi_gradient_reducer(const Communicator& comm,
                                                           int64_t bucket_bytes,
                                                           double timeout_seconds,
                                                           bool bf16 = false);

// MPI on the backend's GPU (dist.reducer = mpi; CUDA builds, staged_mpi_reducer.cc): a
// final bucket is copied to pinned host memory on a stream of its own, summed there as on
// the CPU (timeout_seconds as there), and copied back before the optimizer runs. Any
// number of ranks may share a GPU. Throws in a build without CUDA.
std::unique_ptr<GradientReducer> make_staged_mpi_gradient_reducer(const Communicator& comm,
                                                                  Backend& backend,
                                                                  int64_t bucket_bytes,
                                                                  double timeout_seconds,
                                                                  bool bf16 = false);

// NCCL on the backend's GPU (CUDA builds): rank 0 makes the unique id, MPI_Bcast hands it
// to the others, one communicator per job. A sum that has not completed after
// timeout_seconds (a lost or hung peer) aborts the communicator and throws, so the job
// ends instead of hanging. Ranks that share a GPU are refused before NCCL is asked (it
// would fail with "Duplicate GPU detected"). Throws in a build without CUDA.
std::unique_ptr<GradientReducer> make_nccl_gradient_reducer(const Communicator& comm,
                                                            Backend& backend,
                                                            int64_t bucket_bytes,
                                                            double timeout_seconds,
                                                            bool bf16 = false);

// One line of a pass's timings (dist.log_buckets), after "buckets at step N ": the clock,
// when backward was done, when the sums were, the difference (the sums' exposed time),
// then each bucket's MiB, posted and done, in posting order.
std::string timings_text(const ReductionTimings& timings, size_t element_bytes);

// The first two ranks whose places (one per rank, e.g. "host GPU-bus-id") are the same,
// or {-1, -1} when every rank has a place of its own.
std::pair<int, int> first_ranks_sharing_a_place(const std::vector<std::string>& places);

}  // namespace thpc
