// The job's ranks and the collectives the trainer needs, over MPI.
//
// One MPI rank per GPU (or per CPU process): MPI starts the ranks, the node-local rank
// (MPI_Comm_split_type with MPI_COMM_TYPE_SHARED) picks the device. On the CPU backend
// gradients are summed with MPI_Iallreduce (waited for within dist.timeout_s); the CUDA
// backend sums with NCCL (or, with dist.reducer = mpi, through pinned host memory), whose
// communicator is bootstrapped over this one (rank 0 makes the unique id, MPI_Bcast).
//
// A program that never initialised MPI (the unit tests, a plain run without mpirun)
// gets a communicator of one rank whose collectives are the identity.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/error.h"
#include "common/still_working.h"

namespace thpc {

// A failure that every rank has agreed on over MPI and raises together (for example a
// checkpoint that some rank cannot read): rank 0 reports it once and every rank exits
// normally with the code, instead of one rank ending the others with MPI_Abort.
// `exit_code` is the program's (docs/running.md "Exit codes"): 1 for a runtime failure, 2 for
// ranks that were given different configurations.
// `where` names the rank whose failure it is ("rank R on HOST"), "" for the job's own.
class AllRanksError : public Error {
 public:
  explicit AllRanksError(const std::string& message, int exit_code = 1,
                         const std::string& where = "")
      : Error(message), exit_code_(exit_code), where_(where) {}
  int exit_code() const { return exit_code_; }
  const std::string& where() const { return where_; }

 private:
  int exit_code_;
  std::string where_;
};

// MPI_Init_thread on construction, MPI_Finalize on destruction; owned by main().
// The rank a launcher gave this process, read before MPI starts from the variables it
// sets (inherited ones too: the shell of an `srun --pty bash` step under PMI); -1 when no
// launcher started it: Open MPI's mpirun (OMPI_COMM_WORLD_RANK, PMIX_RANK), srun with PMIx
// or PMI-2 and MPICH's Hydra (PMIX_RANK, PMI_RANK), MVAPICH's mpirun_rsh (MPIRUN_RANK),
// Cray's PALS (PALS_RANKID). For the messages written before MPI_Comm_rank can say the
// rank, and for what the trainer does before MPI starts.
int launcher_rank();

class MpiSession {
 public:
  // MPI_Init, whose wait for the other ranks of the job (Open MPI's start-up exchange)
  // is bounded by `start_limit_seconds` (0: none): a rank that never reaches it (stopped,
  // hung loading the program or reading a file system, lost) held the others there
  // without limit, past dist.timeout_s (a helper's walk: over ten minutes). After that
  // long without them (this process's own stops left out) this rank says so and leaves,
  // exit 1, and the launcher ends the rest.
  MpiSession(int* argc, char*** argv, double start_limit_seconds = 0);
  ~MpiSession();
  MpiSession(const MpiSession&) = delete;
  MpiSession& operator=(const MpiSession&) = delete;

  // Bounds the wait in MPI_Finalize (Open MPI's waits for every rank to come): a rank
  // stopped or hung at its exit (Ctrl-Z, a debugger, a device that does not let go) held
  // the others there without limit, their work done, until the job's time limit. After
  // `seconds` without the others (a stop of this process left out), this rank says so and
  // leaves, exit 1, and mpirun ends the rest. 0: no bound (before the configuration is
  // read).
  void bound_finalize(double seconds) { finalize_limit_seconds_ = seconds; }

 private:
  double finalize_limit_seconds_ = 0;
};

class Communicator {
 public:
  // MPI_COMM_WORLD when MPI is initialised, otherwise a single rank.
  static Communicator world();
  static Communicator single();

  int rank() const { return rank_; }
  int size() const { return size_; }
  int local_rank() const { return local_rank_; }  // rank among the ranks of this node
  int local_size() const { return local_size_; }
  const std::string& host() const { return host_; }
  bool is_root() const { return rank_ == 0; }

  // In-place sums over all ranks.
  int64_t sum(int64_t value) const;
  double sum(double value) const;
  // Element-wise sums of every rank's `values` (all of one length), in one collective: a
  // step's counts, or its loss and likelihood, sum together rather than one wait each.
  // T: int64_t or double (instantiated in communicator.cc).
  template <typename T>
  std::vector<T> sums(std::vector<T> values) const;
  // The element-wise maximum of every rank's `values` (all of one length), on every rank:
  // a decision rank 0 fills in with the flags any rank may raise (a stop signal).
  std::vector<int64_t> max(std::vector<int64_t> values) const;
  // Returns on every rank once every rank has called it (MPI_Ibarrier): where the other
  // ranks wait for rank 0's work alone (a checkpoint), so that the next step's
  // collectives, whose wait is bounded, start together.
  void wait_for_every_rank() const;
  // Rank 0's value, on every rank (decisions that all ranks must take together).
  int64_t broadcast_from_root(int64_t value) const;
  // Rank 0's string, on every rank (a path rank 0 chose).
  std::string broadcast_from_root(const std::string& value) const;
  // Rank 0's `bytes` bytes at `data`, on every rank (the NCCL unique id).
  void broadcast_bytes_from_root(void* data, int bytes) const;

  // Every rank's string, in rank order (for checks such as identical parameters).
  std::vector<std::string> all_gather(const std::string& value) const;
  // Nothing when every rank's `value` is rank 0's (compared by sha256: one gather of 64
  // bytes per rank), else every rank's string in rank order, on every rank: for the
  // start-up checks that the ranks were given the same run.
  std::vector<std::string> all_gather_if_different(const std::string& value) const;
  // Ends every rank of the job with `code` (MPI_Abort) after printing `message`.
  [[noreturn]] void abort(const std::string& message, int code) const;

  // Where a bounded wait counts from.
  enum class WaitFrom {
    // The collective's start: the ranks do the same work and come together (a step).
    kStart,
    // The last sign of work (show_working) from any rank: the ranks' shares of the work
    // may differ by minutes (validation, whose translations are longer on one rank than
    // on another), and a rank that is still working says so between its batches.
    kLastSignOfWork,
  };

  // While one lives, each collective of `comm` that waits more than `seconds` for the
  // other ranks (counted from `from`) ends the job (MPI_Abort) with a message led by
  // `during` ("step 12"), instead of waiting for a rank that will not come: the training
  // step holds one with dist.timeout_s, as the gradient sums do; validation, start-up and
  // rank 0's work alone (its checkpoints, the averages at the end) one from the last sign
  // of work. How long the
  // calls wait is not part of what the communicator is, so a const one takes a limit.
  // `remedy` ends the message: what the user does next; `slow_rank`, for a limit from the
  // last sign of work, the rank that is only slow ("a rank whose batches take longer than
  // that"), told to raise dist.timeout_s. A limit from the last sign of work is a
  // collective when it ends (every rank must end it, unless it leaves on an exception):
  // the ranks sum the signs they sent, and each receives those still on their way, so
  // that no sign is left unmatched. While it lives, this thread's show_still_working()
  // (common/still_working.h: a checkpoint's checksum, a shard read) is show_working().
  class WaitLimit {
   public:
    static constexpr const char* kResume = "resume it from its last checkpoint";
    static constexpr const char* kSlowBatches = "a rank whose batches take longer than that";
    WaitLimit(const Communicator& comm, double seconds, std::string during,
              WaitFrom from = WaitFrom::kStart, std::string remedy = kResume,
              std::string slow_rank = kSlowBatches);
    ~WaitLimit();
    WaitLimit(const WaitLimit&) = delete;
    WaitLimit& operator=(const WaitLimit&) = delete;

   private:
    // At the end of kLastSignOfWork's work, on every rank: receives the signs the other
    // ranks sent that have not come yet.
    void receive_every_sign_sent() const;

    const Communicator& comm_;
    double previous_seconds_;
    WaitFrom previous_from_;
    std::string previous_during_;
    std::string previous_remedy_;
    std::string previous_slow_rank_;
    int uncaught_at_start_;  // std::uncaught_exceptions() when it began
    // The work (and its counts of signs) this one is inside, for kLastSignOfWork.
    int64_t previous_work_ = 0, previous_signs_sent_ = 0, previous_signs_received_ = 0;
    std::optional<StillWorkingSign> sign_;  // from the last sign of work only
  };

  // A sign to the other ranks that this one is still at the work a WaitLimit of
  // kLastSignOfWork bounds (a batch of validation done): their waits count afresh. One
  // message to each rank at most every 64th of the limit, so that the others wait up to
  // a batch and that 64th between signs; nothing outside such a limit, or in a job of
  // one rank.
  void show_working() const;

 private:
  // One collective's request, waited for within wait_limit_seconds_ (if > 0); `what`
  // names the collective in a timeout's message.
  void finish(void* request, const char* what) const;

  mutable double wait_limit_seconds_ = 0;
  mutable WaitFrom wait_from_ = WaitFrom::kStart;
  mutable double last_sign_seconds_ = -1;  // when show_working last sent (steady_seconds)
  bool mpi_ = false;
  int rank_ = 0, size_ = 1, local_rank_ = 0, local_size_ = 1;
  std::string host_;
};

// The device a rank drives: its local rank (among the ranks of its node) modulo the
// devices it sees, or `forced` (>= 0, dist.device); -1 when it sees none (CPU backend).
// The devices a rank sees are those CUDA_VISIBLE_DEVICES leaves it, which is how Slurm
// binds GPUs (--gpus-per-task, --gpu-bind): a rank that sees exactly one takes device 0.
// The local rank is MPI's (MPI_COMM_TYPE_SHARED), not SLURM_LOCALID: under srun they
// agree, but ranks started by mpirun inside a batch job all inherit the batch step's
// SLURM_LOCALID=0.
int select_device(int local_rank, int visible_devices, int forced);

// The start-up line of a rank: host, rank, local rank, and the device (name and PCI
// bus id) or "cpu", and CUDA_VISIBLE_DEVICES when it is set (what the rank was given).
std::string startup_line(const Communicator& comm, const std::string& device_description);

}  // namespace thpc
