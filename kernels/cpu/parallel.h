// How the CPU ops spread their loops over OpenMP threads. Every parallel loop splits
// work whose pieces are independent (elements, rows, columns, (sentence, head) blocks)
// and keeps each sum in its sequential order, so the results are the same bits with
// any number of threads. Nothing inside a parallel loop may throw: checks run before it.
#pragma once

#include <omp.h>

#include <cstdint>

namespace thpc::cpu {

// The threads the CPU ops and BLAS use: set_cpu_threads's value, or OpenMP's default
// (one per core) until it is called.
int cpu_threads();

// A loop over fewer than this many elements' worth of work stays on the calling thread:
// waking a team costs microseconds, which a decoding step's few rows do not repay.
constexpr int64_t kParallelMinWork = int64_t(1) << 15;

// The team for a loop doing `work` elements' worth of arithmetic.
inline int threads_for(int64_t work) { return work >= kParallelMinWork ? cpu_threads() : 1; }

// Calls body(begin, end) once per thread with that thread's share [begin, end) of
// [0, count): for sums over rows into per-column totals, where each thread owns its
// columns and adds the rows in order, as one thread would.
template <typename Body>
void parallel_ranges(int count, int threads, Body&& body) {
#pragma omp parallel num_threads(threads)
  {
    const int64_t team = omp_get_num_threads(), member = omp_get_thread_num();
    body(static_cast<int>(count * member / team), static_cast<int>(count * (member + 1) / team));
  }
}

}  // namespace thpc::cpu
