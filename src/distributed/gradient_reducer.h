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
// Two transports: MPI_Iallreduce on host memory (the CPU backend) and NCCL on the GPU
// (ncclAllReduce on a stream of its own, ordered after the compute stream by events).
#pragma once

#include <cstdint>
#include <memory>

#include "distributed/communicator.h"
#include "kernels/ops.h"

namespace thpc {

class GradientReducer {
 public:
  explicit GradientReducer(int64_t bucket_bytes) : bucket_bytes_(bucket_bytes) {}
  virtual ~GradientReducer() = default;
  GradientReducer(const GradientReducer&) = delete;
  GradientReducer& operator=(const GradientReducer&) = delete;

  // A backward pass that will write `grads` begins; no sum is in flight.
  void begin(Tensor grads);
  // grads[offset, end) are final: start the sums of the buckets that lie wholly there.
  void ready_from(int64_t offset);
  // Starts what is left and completes every sum: afterwards the backend's later ops (the
  // optimizer) see the summed gradients.
  void finish();
  // Buckets started in the current pass (for tests and the log).
  int buckets_started() const { return buckets_started_; }

 protected:
  virtual void start(Tensor bucket) = 0;
  // Called each time backward reports progress (once a layer): lets a transport that
  // advances only inside library calls move the started sums on.
  virtual void progress() {}
  virtual void complete() = 0;

 private:
  int64_t bucket_bytes_;
  Tensor grads_;
  int64_t pending_end_ = 0;  // [0, pending_end_) not started yet
  int buckets_started_ = 0;
};

// MPI_Iallreduce of host-memory buckets (the CPU backend; mpi_reducer.cc). comm must span
// more than one rank.
std::unique_ptr<GradientReducer> make_mpi_gradient_reducer(const Communicator& comm,
                                                           int64_t bucket_bytes);

// NCCL on the backend's GPU (CUDA builds): rank 0 makes the unique id, MPI_Bcast hands it
// to the others, one communicator per job. A sum that has not completed after
// timeout_seconds (a lost or hung peer) aborts the communicator and throws, so the job
// ends instead of hanging. Throws in a build without CUDA.
std::unique_ptr<GradientReducer> make_nccl_gradient_reducer(const Communicator& comm,
                                                            Backend& backend,
                                                            int64_t bucket_bytes,
                                                            double timeout_seconds);

}  // namespace thpc
