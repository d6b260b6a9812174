// The MPI error check shared by the files of src/distributed that call MPI (communicator.cc,
// mpi_reducer.cc); not for use outside src/distributed.
#pragma once

namespace thpc {

// Throws thpc::Error naming the call, MPI's error string and this process (rank, host)
// unless status is MPI_SUCCESS. Errors come back as codes: MpiSession sets
// MPI_ERRORS_RETURN on MPI_COMM_WORLD.
void check_mpi(int status, const char* call);

}  // namespace thpc
