// The MPI error check and the bounded wait shared by the files of src/distributed that
// call MPI (communicator.cc, mpi_reducer.cc); not for use outside src/distributed.
#pragma once

#include <mpi.h>

namespace thpc {

// Throws thpc::Error naming the call, MPI's error string and this process (rank, host)
// unless status is MPI_SUCCESS. Errors come back as codes: MpiSession sets
// MPI_ERRORS_RETURN on MPI_COMM_WORLD.
void check_mpi(int status, const char* call);

// What the process does before a wait below ends the job at once, without unwinding: the
// trainer removes its run directory's locks and a checkpoint's temporary file, which
// unwinding removes on every other way out (a helper's walk: rank 0's trainer.lock stayed
// behind a wait past dist.timeout_s). Set once, before the first wait; nullptr: nothing.
void before_a_wait_ends_the_job(void (*cleanup)());

// Waits for `count` requests. With limit_seconds > 0 a wait longer than that ends the
// job (MPI_Abort, exit 1) with one line naming the innermost Communicator::WaitLimit's
// `during`, `what` (the collective, in the user's words: "the gradient sum"),
// dist.timeout_s and the limit's `remedy` (what to do next): MPI notices a rank that
// died (mpirun ends the job), but not one that is stopped (SIGSTOP, Ctrl-Z, a debugger)
// or hung (a stalled file system, a device that no longer answers), and a blocking wait
// for it would hold the whole job until its time limit. limit_seconds <= 0: MPI_Waitall.
// `from_last_sign`: the limit counts from the last sign of work any rank sent
// (Communicator::show_working) instead of from the start.
void wait_within(int count, MPI_Request* requests, double limit_seconds, const char* what,
                 bool from_last_sign = false);

}  // namespace thpc
