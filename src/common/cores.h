// How many cores this process may run on: what "as many threads as cores" means.
#pragma once

namespace thpc {

// The cores this process may run on: its CPU affinity (a Slurm job's cpuset, taskset,
// numactl), not the machine's. std::thread::hardware_concurrency counts every core
// online: `--threads 0` in a 4-core Slurm allocation of a 128-core node ran 128 decoding
// workers on 4 cores. At least 1; the machine's count where the affinity cannot be read.
int cores_this_process_may_use();

}  // namespace thpc
