// How many cores this process may run on: what "as many threads as cores" means.
#pragma once

#include <string>

namespace thpc {

// The cores this process may run on: its CPU affinity (a Slurm job's cpuset, taskset,
// numactl), not the machine's. std::thread::hardware_concurrency counts every core
// online: `--threads 0` in a 4-core Slurm allocation of a 128-core node ran 128 decoding
// workers on 4 cores. At least 1; the machine's count where the affinity cannot be read.
int cores_this_process_may_use();

// The note for `threads` above cores_this_process_may_use(), "" when they fit: "SETTING is
// more than the N cores this process may use (its CPU affinity: ...): the threads share
// them, each a fraction as fast; give FIX N or fewer" and `or_else` (", or 0 for ...").
// `setting` names the value as the user gave it ("train.threads = 8", "--threads 8"), `fix`
// how to give another ("train.threads = ", "--threads "). One sentence for the trainer,
// transformer_decode and transformer_preprocess, which said it three ways: more threads
// than cores share them without a word otherwise (8 on one core ran a tiny training step
// 20 times slower than 1; a helper's walk).
std::string more_threads_than_cores(int threads, const std::string& setting,
                                    const std::string& fix, const std::string& or_else = "");

}  // namespace thpc
