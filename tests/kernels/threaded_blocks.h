// Kernel bodies run on the host as the GPU runs them (tests/kernels: the short and fused
// attention's bodies, attention_test.cc; the register-held add & norm's, layernorm_test.cc):
// each thread of a block a host thread, meeting at blocking barriers (with more threads
// than cores, spinning ones took the cores from the threads they waited for).
#pragma once

#include <algorithm>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

namespace thpc::test {

class ThreadBarrier {  // C++17 has no std::barrier
 public:
  explicit ThreadBarrier(int count) : count_(count) {}
  void wait() {
    std::unique_lock<std::mutex> lock(mutex_);
    const int generation = generation_;
    if (++waiting_ == count_) {
      waiting_ = 0;
      ++generation_;
      released_.notify_all();
    } else {
      released_.wait(lock, [&] { return generation_ != generation; });
    }
  }

 private:
  std::mutex mutex_;
  std::condition_variable released_;
  const int count_;
  int waiting_ = 0, generation_ = 0;
};

// The blocks of a launch one after another, each by a team of kThreads host threads, each
// thread an execution policy `Lane` (.thread, .team, .sync()) of one Team: the block's
// shared memory NaN-filled first (as SequentialBlocks does), then body(x, block, shared).
// The short kernels' threaded run and the fused kernels' run alike.
template <class Lane, class Team, class Body>
void run_threaded_blocks(int threads_per_block, int blocks, int bytes, const Body& body) {
  std::vector<char> shared(static_cast<size_t>(bytes));
  Team team;
  std::vector<std::thread> threads;
  for (int thread = 0; thread < threads_per_block; ++thread) {
    threads.emplace_back([&, thread] {
      Lane x;
      x.thread = thread;
      x.team = &team;
      for (int block = 0; block < blocks; ++block) {
        if (thread == 0) std::fill(shared.begin(), shared.end(), static_cast<char>(0xff));
        x.sync();
        body(x, block, shared.data());
        x.sync();  // the block is done before the next one's fill
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
}

// Lane `lane`'s value after the device's xor butterfly over a warp's 32 `values`
// (x = op(x, shfl_xor(x, offset)) for offset 16, 8, 4, 2, 1: every lane ends with the
// same bits, in the device's order).
template <class Op>
float warp_butterfly(const float (&posted)[32], int lane, Op op) {
  float values[32];
  std::copy(posted, posted + 32, values);
  for (int offset = 16; offset > 0; offset /= 2) {
    float next[32];
    for (int l = 0; l < 32; ++l) next[l] = op(values[l], values[l ^ offset]);
    std::copy(next, next + 32, values);
  }
  return values[lane];
}

}  // namespace thpc::test
