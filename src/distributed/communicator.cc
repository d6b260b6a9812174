#include "distributed/communicator.h"

#include <mpi.h>

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <iostream>
#include <sstream>

#include "common/error.h"
#include "common/sha256.h"
#include "distributed/leak_checks_paused.h"
#include "distributed/mpi_check.h"

namespace thpc {
namespace {

bool mpi_initialized() {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  return initialized && !finalized;
}

}  // namespace

void check_mpi(int status, const char* call) {
  if (status == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING] = {0};
  int length = 0;
  MPI_Error_string(status, text, &length);
  THPC_FAIL(call << " failed: " << text << " (" << process_identity() << ")");
}

MpiSession::MpiSession(int* argc, char*** argv) {
  int provided = 0;
  // FUNNELED: only the main thread calls MPI (the CPU BLAS threads never do).
  {
    const LeakChecksPaused open_mpi_keeps_these_until_exit;
    check_mpi(MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided), "MPI_Init_thread");
  }
  // Errors come back as codes, so they become thpc::Error with the call named.
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  set_process_rank(rank);
}

MpiSession::~MpiSession() {
  const LeakChecksPaused open_mpi_keeps_these_until_exit;
  if (mpi_initialized()) MPI_Finalize();
}

Communicator Communicator::single() {
  Communicator comm;
  comm.host_ = host_name();
  return comm;
}

Communicator Communicator::world() {
  Communicator comm = single();
  if (!mpi_initialized()) return comm;
  comm.mpi_ = true;
  check_mpi(MPI_Comm_rank(MPI_COMM_WORLD, &comm.rank_), "MPI_Comm_rank");
  check_mpi(MPI_Comm_size(MPI_COMM_WORLD, &comm.size_), "MPI_Comm_size");
  MPI_Comm node;
  check_mpi(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, comm.rank_,
                                MPI_INFO_NULL, &node),
            "MPI_Comm_split_type");
  MPI_Comm_rank(node, &comm.local_rank_);
  MPI_Comm_size(node, &comm.local_size_);
  MPI_Comm_free(&node);
  return comm;
}

namespace {

template <typename T>
T sum_over_ranks(T value, MPI_Datatype type) {
  T total{};
  check_mpi(MPI_Allreduce(&value, &total, 1, type, MPI_SUM, MPI_COMM_WORLD), "MPI_Allreduce");
  return total;
}

}  // namespace

int64_t Communicator::sum(int64_t value) const {
  return mpi_ ? sum_over_ranks(value, MPI_INT64_T) : value;
}

double Communicator::sum(double value) const {
  return mpi_ ? sum_over_ranks(value, MPI_DOUBLE) : value;
}

std::vector<int64_t> Communicator::max(std::vector<int64_t> values) const {
  if (!mpi_ || values.empty()) return values;
  check_mpi(MPI_Allreduce(MPI_IN_PLACE, values.data(), static_cast<int>(values.size()),
                          MPI_INT64_T, MPI_MAX, MPI_COMM_WORLD),
            "MPI_Allreduce");
  return values;
}

int64_t Communicator::broadcast_from_root(int64_t value) const {
  if (!mpi_) return value;
  check_mpi(MPI_Bcast(&value, 1, MPI_INT64_T, 0, MPI_COMM_WORLD), "MPI_Bcast");
  return value;
}

std::string Communicator::broadcast_from_root(const std::string& value) const {
  if (!mpi_) return value;
  const int64_t length = broadcast_from_root(static_cast<int64_t>(value.size()));
  THPC_CHECK(length <= INT_MAX, "a broadcast of " << length << " bytes");
  std::string copy = value;
  copy.resize(static_cast<size_t>(length));
  broadcast_bytes_from_root(copy.data(), static_cast<int>(length));
  return copy;
}

void Communicator::broadcast_bytes_from_root(void* data, int bytes) const {
  if (!mpi_) return;
  check_mpi(MPI_Bcast(data, bytes, MPI_BYTE, 0, MPI_COMM_WORLD), "MPI_Bcast");
}

std::vector<std::string> Communicator::all_gather(const std::string& value) const {
  if (!mpi_) return {value};
  const int length = static_cast<int>(value.size());
  std::vector<int> lengths(size_);
  check_mpi(MPI_Allgather(&length, 1, MPI_INT, lengths.data(), 1, MPI_INT, MPI_COMM_WORLD),
            "MPI_Allgather");
  std::vector<int> offsets(size_, 0);
  for (int r = 1; r < size_; ++r) offsets[r] = offsets[r - 1] + lengths[r - 1];
  std::string joined(static_cast<size_t>(offsets.back() + lengths.back()), '\0');
  check_mpi(MPI_Allgatherv(value.data(), length, MPI_CHAR, joined.data(), lengths.data(),
                           offsets.data(), MPI_CHAR, MPI_COMM_WORLD),
            "MPI_Allgatherv");
  std::vector<std::string> values;
  for (int r = 0; r < size_; ++r) values.push_back(joined.substr(offsets[r], lengths[r]));
  return values;
}

std::vector<std::string> Communicator::all_gather_if_different(const std::string& value) const {
  if (!mpi_) return {};
  const std::vector<std::string> digests = all_gather(sha256_hex(value.data(), value.size()));
  for (const std::string& digest : digests) {
    if (digest != digests.front()) return all_gather(value);
  }
  return {};
}

void Communicator::abort(const std::string& message, int code) const {
  std::cerr << message << std::endl;
  if (mpi_ && size_ > 1) MPI_Abort(MPI_COMM_WORLD, code);
  std::exit(code);
}

int select_device(int local_rank, int visible_devices, int forced) {
  if (visible_devices <= 0) return -1;
  if (forced >= 0) {
    THPC_CHECK(forced < visible_devices, "dist.device = " << forced << " but only "
                                         << visible_devices << " devices are visible");
    return forced;
  }
  return local_rank % visible_devices;
}

std::string startup_line(const Communicator& comm, const std::string& device_description) {
  std::ostringstream line;
  line << "rank " << comm.rank() << "/" << comm.size() << " local " << comm.local_rank()
       << "/" << comm.local_size() << " on " << comm.host() << ": " << device_description;
  if (const char* visible = std::getenv("CUDA_VISIBLE_DEVICES")) {
    line << " (CUDA_VISIBLE_DEVICES=" << visible << ")";
  }
  return line.str();
}

}  // namespace thpc
