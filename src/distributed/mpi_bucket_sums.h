// Sums of host-memory gradient buckets over every rank, as MPI_Iallreduce: posted one by
// one as buckets become final, moved on by progress(), awaited together by complete().
// The transport of the MPI reducer, on the CPU's gradient itself and on the GPU through
// pinned staging copies (dist.reducer = mpi; see gradient_reducer.h).
#pragma once

#include <mpi.h>

#include <cstdint>
#include <vector>

#include "kernels/ops.h"

namespace thpc {

class MpiBucketSums {
 public:
  // bf16: each bucket travels and is summed as bf16 (dist.reduce_dtype = bf16).
  // timeout_seconds: complete() ends the job (MPI_Abort, wait_within) when the sums take
  // longer (dist.timeout_s).
  MpiBucketSums(bool bf16, double timeout_seconds);
  ~MpiBucketSums();
  MpiBucketSums(const MpiBucketSums&) = delete;
  MpiBucketSums& operator=(const MpiBucketSums&) = delete;

  // Posts the sum of `bucket` (host memory, fp32 or the CPU's fp64 without bf16; left
  // alone until complete()).
  void start(Tensor bucket);
  // Open MPI without a progress thread advances a non-blocking collective only inside MPI
  // calls: an MPI_Testsome now and then moves the posted sums on. Returns the sums seen
  // complete by this call, by their place in the order posted.
  std::vector<int> progress();
  // Waits for every posted sum; afterwards each bucket holds the sum over the ranks.
  // Ends the job after timeout_seconds without them (a rank stopped, hung or lost): MPI_Abort
  // in wait_within (mpi_check.h), not an exception, since unwinding would free buffers into
  // which the other ranks' transfers may still write.
  void complete();

 private:
  bool bf16_;
  double timeout_seconds_;
  MPI_Op sum_bf16_op_ = MPI_OP_NULL;
  std::vector<MPI_Request> pending_;
  // bf16: each started bucket's staging copy (growing this vector moves the copies, whose
  // buffers, in flight, stay where they are) and the fp32 bucket it returns to.
  std::vector<std::vector<uint16_t>> staged_;
  std::vector<Tensor> staged_buckets_;
};

}  // namespace thpc
