// The MPI transport of the gradient all-reduce (see gradient_reducer.h), and the sums of
// host buckets it shares with the GPU's staged reducer (mpi_bucket_sums.h).
#include <mpi.h>

#include <climits>
#include <cstdint>
#include <memory>
#include <vector>

#include "common/bf16.h"
#include "common/error.h"
#include "distributed/gradient_reducer.h"
#include "distributed/mpi_bucket_sums.h"
#include "distributed/mpi_check.h"

namespace thpc {
namespace {

MPI_Datatype mpi_type(DType dtype) {
  switch (dtype) {
    case DType::F32: return MPI_FLOAT;
    case DType::F64: return MPI_DOUBLE;
    default: THPC_FAIL("MPI sums of " << dtype_name(dtype) << " buffers are not supported");
  }
}

// MPI_SUM of bf16 values (MPI has no bf16 type: they travel as MPI_UINT16_T): each pair
// added in fp32, the sum rounded to bf16 once, as NCCL sums bf16 buffers.
extern "C" void sum_bf16(void* in, void* inout, int* count, MPI_Datatype*) {
  const auto* a = static_cast<const uint16_t*>(in);
  auto* b = static_cast<uint16_t*>(inout);
  for (int i = 0; i < *count; ++i) {
    b[i] = bf16_from_float(float_from_bf16(a[i]) + float_from_bf16(b[i]));
  }
}

}  // namespace

MpiBucketSums::MpiBucketSums(bool bf16, double timeout_seconds)
    : bf16_(bf16), timeout_seconds_(timeout_seconds) {
  if (bf16_) check_mpi(MPI_Op_create(sum_bf16, /*commute=*/1, &sum_bf16_op_), "MPI_Op_create");
}

MpiBucketSums::~MpiBucketSums() {
  if (bf16_) MPI_Op_free(&sum_bf16_op_);
}

// With bf16 a bucket travels as bf16 (half the bytes): rounded into a staging copy,
// summed with sum_bf16, and widened back into the fp32 bucket when the sum completes (the
// optimizer and its fp32 master weights see fp32 as before).
void MpiBucketSums::start(Tensor bucket) {
  THPC_CHECK(bucket.numel <= INT_MAX, "an MPI sum of " << bucket.numel << " elements");
  pending_.emplace_back();
  if (!bf16_) {
    check_mpi(MPI_Iallreduce(MPI_IN_PLACE, bucket.data, static_cast<int>(bucket.numel),
                             mpi_type(bucket.dtype), MPI_SUM, MPI_COMM_WORLD, &pending_.back()),
              "MPI_Iallreduce");
    return;
  }
  THPC_CHECK(bucket.dtype == DType::F32, "a bf16 sum of a " << dtype_name(bucket.dtype)
                                                             << " gradient bucket");
  const auto* values = static_cast<const float*>(bucket.data);
  std::vector<uint16_t>& staged = staged_.emplace_back(static_cast<size_t>(bucket.numel));
  for (int64_t i = 0; i < bucket.numel; ++i) staged[i] = bf16_from_float(values[i]);
  staged_buckets_.push_back(bucket);
  check_mpi(MPI_Iallreduce(MPI_IN_PLACE, staged.data(), static_cast<int>(bucket.numel),
                           MPI_UINT16_T, sum_bf16_op_, MPI_COMM_WORLD, &pending_.back()),
            "MPI_Iallreduce");
}

std::vector<int> MpiBucketSums::progress() {
  std::vector<int> done(pending_.size());
  int count = 0;
  if (!pending_.empty()) {
    // Completed requests become MPI_REQUEST_NULL, which later calls pass over.
    check_mpi(MPI_Testsome(static_cast<int>(pending_.size()), pending_.data(), &count,
                           done.data(), MPI_STATUSES_IGNORE),
              "MPI_Testsome");
  }
  done.resize(count == MPI_UNDEFINED ? 0 : static_cast<size_t>(count));
  return done;
}

void MpiBucketSums::complete() {
  wait_within(static_cast<int>(pending_.size()), pending_.data(), timeout_seconds_,
              "the gradient sum");
  pending_.clear();
  for (size_t b = 0; b < staged_buckets_.size(); ++b) {
    auto* values = static_cast<float*>(staged_buckets_[b].data);
    const std::vector<uint16_t>& summed = staged_[b];
    for (size_t i = 0; i < summed.size(); ++i) values[i] = float_from_bf16(summed[i]);
  }
  staged_.clear();
  staged_buckets_.clear();
}

namespace {

// The CPU backend's reducer: each bucket's sum is posted when the bucket is final, moved
// on after each layer of backward, and all are awaited at the end of backward.
class MpiGradientReducer final : public GradientReducer {
 public:
  MpiGradientReducer(int64_t bucket_bytes, double timeout_seconds, bool bf16)
      : GradientReducer(bucket_bytes), sums_(bf16, timeout_seconds) {}

 protected:
  void start(Tensor bucket) override { sums_.start(bucket); }
  void progress() override {
    for (const int index : sums_.progress()) bucket_done(static_cast<size_t>(index));
  }
  void await_complete() override { sums_.complete(); }

 private:
  MpiBucketSums sums_;
};

}  // namespace

std::unique_ptr<GradientReducer> make_mpi_gradient_reducer(const Communicator& comm,
                                                           int64_t bucket_bytes,
                                                           double timeout_seconds, bool bf16) {
  THPC_CHECK(comm.size() > 1, "an MPI gradient sum over " << comm.size() << " rank");
  return std::make_unique<MpiGradientReducer>(bucket_bytes, timeout_seconds, bf16);
}

}  // namespace thpc
