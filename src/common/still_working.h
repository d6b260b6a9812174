// Long work that one rank does while the others wait for it (a checkpoint read, copied,
// hashed or written; a corpus's shard summaries read at start-up; a model's
// initialisation) says between its pieces that it is still at it, so that a rank reading a
// large file from a slow file system is not taken for one that is stopped or hung (a
// piece must take well under dist.timeout_s): while this thread's collectives wait
// counting from the last sign of work (Communicator::WaitLimit with
// WaitFrom::kLastSignOfWork, which sets the sign), the sign goes to the other ranks. The
// library below src/distributed knows nothing of MPI: it calls show_still_working(), which
// on another thread, or outside such a wait, only counts.
#pragma once

#include <cstdint>
#include <functional>

namespace thpc {

// Gives this thread's sign of work, if one is set, and counts it (on any thread); cheap
// (the sign itself sends at most a message to each rank every 64th of dist.timeout_s).
void show_still_working();

// How many signs this process's threads have given so far: a thread waiting for another
// (the training thread for the checkpoint writer's) gives its own sign while the count
// moves, and none while the other makes no progress (a write held by a hung file system).
int64_t signs_of_work_given();

// While one lives, this thread's show_still_working() calls `sign`; the sign set before
// comes back when it ends.
class StillWorkingSign {
 public:
  explicit StillWorkingSign(std::function<void()> sign);
  ~StillWorkingSign();
  StillWorkingSign(const StillWorkingSign&) = delete;
  StillWorkingSign& operator=(const StillWorkingSign&) = delete;

 private:
  std::function<void()> previous_;
};

}  // namespace thpc
