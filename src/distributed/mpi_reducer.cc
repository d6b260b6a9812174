// The MPI transport of the gradient all-reduce (see gradient_reducer.h), beside its NCCL
// twin nccl_reducer.cc.
#include <mpi.h>

#include <climits>
#include <memory>
#include <vector>

#include "common/error.h"
#include "distributed/gradient_reducer.h"
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

// The CPU backend's transport: each bucket's MPI_Iallreduce is posted when the bucket is
// final, all are awaited at the end of backward. Open MPI (without a progress thread)
// advances a non-blocking collective only inside MPI calls, so an MPI_Testall after each
// layer of backward moves the started sums on instead of leaving all of it to MPI_Waitall.
class MpiGradientReducer final : public GradientReducer {
 public:
  explicit MpiGradientReducer(int64_t bucket_bytes) : GradientReducer(bucket_bytes) {}

 protected:
  void start(Tensor bucket) override {
    THPC_CHECK(bucket.numel <= INT_MAX, "an MPI sum of " << bucket.numel << " elements");
    pending_.emplace_back();
    check_mpi(MPI_Iallreduce(MPI_IN_PLACE, bucket.data, static_cast<int>(bucket.numel),
                             mpi_type(bucket.dtype), MPI_SUM, MPI_COMM_WORLD, &pending_.back()),
              "MPI_Iallreduce");
  }
  void progress() override {
    if (pending_.empty()) return;
    int all_done = 0;
    check_mpi(MPI_Testall(static_cast<int>(pending_.size()), pending_.data(), &all_done,
                          MPI_STATUSES_IGNORE),
              "MPI_Testall");
  }
  void complete() override {
    const int status = MPI_Waitall(static_cast<int>(pending_.size()), pending_.data(),
                                   MPI_STATUSES_IGNORE);
    pending_.clear();
    check_mpi(status, "MPI_Waitall");
  }

 private:
  std::vector<MPI_Request> pending_;
};

}  // namespace

std::unique_ptr<GradientReducer> make_mpi_gradient_reducer(const Communicator& comm,
                                                           int64_t bucket_bytes) {
  THPC_CHECK(comm.size() > 1, "an MPI gradient sum over " << comm.size() << " rank");
  return std::make_unique<MpiGradientReducer>(bucket_bytes);
}

}  // namespace thpc
