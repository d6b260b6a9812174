#include "common/cores.h"

#include <sched.h>

#include <algorithm>
#include <string>
#include <thread>

namespace thpc {

int cores_this_process_may_use() {
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  if (::sched_getaffinity(0, sizeof allowed, &allowed) == 0 && CPU_COUNT(&allowed) > 0) {
    return CPU_COUNT(&allowed);
  }
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

std::string more_threads_than_cores(int threads, const std::string& setting,
                                    const std::string& fix, const std::string& or_else) {
  const int usable = cores_this_process_may_use();
  if (threads <= usable) return "";
  const bool one = usable == 1;
  return setting + " is more than the " + std::to_string(usable) + (one ? " core" : " cores") +
         " this process may use (its CPU affinity: a batch system's cpuset, taskset, mpirun's "
         "binding): the threads share " + (one ? "it" : "them") + ", each a fraction as fast; "
         "give " + fix + std::to_string(usable) + " or fewer" + or_else;
}

}  // namespace thpc
