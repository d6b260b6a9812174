#include "distributed/communicator.h"

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <iostream>
#include <mutex>
#include <optional>
#include <sstream>
#include <thread>
#include <utility>

#include "common/error.h"
#include "common/sha256.h"
#include "distributed/leak_checks_paused.h"
#include "distributed/mpi_check.h"
#include "distributed/wait_clock.h"

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

namespace {

// The innermost live WaitLimit's `during` ("step 12"), `remedy` and `slow_rank`, for every
// bounded wait's message: the gradient sums' own waits (MpiBucketSums) run inside the
// step's limit too.
struct WaitContext {
  std::string during;
  std::string remedy = Communicator::WaitLimit::kResume;
  std::string slow_rank = Communicator::WaitLimit::kSlowBatches;
};
WaitContext& waiting_context() {
  static WaitContext context;
  return context;
}

}  // namespace

namespace {

// Several ranks failing at once write to one terminal or log: a line written in pieces
// (std::cerr writes each << at once) was interleaved with another rank's
// ("error on rank 0 on vmtransformer_hpc: error on rank 2 ..."). One write of the whole
// line keeps it whole.
void write_whole_line(const std::string& line) {
  std::cerr.write(line.data(), static_cast<std::streamsize>(line.size()));
  std::cerr.flush();
}

}  // namespace

namespace {

// The tags of the signs of work (Communicator::show_working): messages of no bytes on
// MPI_COMM_WORLD, where nothing else is sent point to point (and a collective never
// matches a point-to-point message). Each piece of work bounded from the last sign (a
// WaitLimit of kLastSignOfWork) has a tag of its own: the faster ranks' first signs of the
// next work (rank 0's checkpoint right after a validation) came while a slower rank still
// took the last of this one's, which counted them for this work and then waited for them
// in the next until dist.timeout_s (a two-rank job hung after its final line, now and
// then). Every rank makes the same sequence of such limits, so their numbers agree; a sign
// of a later work waits unreceived until its work begins here. 1024 tags in turn.
constexpr int kSignOfWorkTagBase = 7001;
constexpr int64_t kSignOfWorkTags = 1024;
int64_t works_begun = 0;   // the WaitLimits of kLastSignOfWork made so far
int64_t current_work = 0;  // the innermost live one's number
int sign_tag() { return kSignOfWorkTagBase + static_cast<int>(current_work % kSignOfWorkTags); }

// The signs of work this process sent (rounds of show_working, one message to each other
// rank a round) and received, in the innermost live WaitLimit of kLastSignOfWork: its end
// takes the signs still on their way (Communicator::WaitLimit::~WaitLimit). Process-wide,
// as the tags are: every Communicator speaks for MPI_COMM_WORLD, on the main thread alone.
int64_t signs_sent = 0;
int64_t signs_received = 0;

// Receives every sign of work that has come; whether there was one.
bool received_signs_of_work() {
  bool received = false;
  for (;;) {
    int pending = 0;
    MPI_Status status;
    check_mpi(MPI_Iprobe(MPI_ANY_SOURCE, sign_tag(), MPI_COMM_WORLD, &pending, &status),
              "MPI_Iprobe");
    if (!pending) return received;
    check_mpi(MPI_Recv(nullptr, 0, MPI_BYTE, status.MPI_SOURCE, sign_tag(), MPI_COMM_WORLD,
                       MPI_STATUS_IGNORE),
              "MPI_Recv");
    ++signs_received;
    received = true;
  }
}


// THPC_CHECK_BOUNDED_WAITS=1 (the test suite sets it for its jobs): a wait for the other
// ranks without a limit ends the job, naming it. dist.timeout_s is at least 1 s, so such a
// wait is a collective outside every WaitLimit, which waits for a stopped or hung rank
// until the job's time limit: three were found so (the comparison of the configurations,
// the agreements on a stop after a validation and after --eval's pass), where reading the
// code had missed them.
bool every_wait_must_be_bounded() {
  static const bool asked = [] {
    const char* value = std::getenv("THPC_CHECK_BOUNDED_WAITS");
    return value != nullptr && std::string(value) != "0";
  }();
  return asked;
}

void (*g_before_ending_the_job)() = nullptr;

// Ends the job from inside a wait (the line said already): the cleanup, then MPI_Abort.
[[noreturn]] void end_the_job_from_a_wait() {
  if (g_before_ending_the_job != nullptr) g_before_ending_the_job();
  MPI_Abort(MPI_COMM_WORLD, 1);
  std::_Exit(1);
}

}  // namespace

void before_a_wait_ends_the_job(void (*cleanup)()) { g_before_ending_the_job = cleanup; }

int launcher_rank() {
  for (const char* name :
       {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "MPIRUN_RANK", "PALS_RANKID"}) {
    if (const char* value = std::getenv(name); value != nullptr) return std::atoi(value);
  }
  return -1;
}

void wait_within(int count, MPI_Request* requests, double limit_seconds, const char* what,
                 bool from_last_sign) {
  if (limit_seconds <= 0) {
    if (every_wait_must_be_bounded()) {
      write_whole_line("transformer_hpc: error on " + process_identity() + ": " + what +
                       " waited without a limit (THPC_CHECK_BOUNDED_WAITS: every wait for the "
                       "other ranks is bounded by dist.timeout_s)\n");
      end_the_job_from_a_wait();
    }
    check_mpi(MPI_Waitall(count, requests, MPI_STATUSES_IGNORE), "MPI_Waitall");
    return;
  }
  const double started = steady_seconds();
  WaitClock clock;  // a stop of this process (a suspended job) is not a peer's delay
  for (;;) {
    int done = 0;
    check_mpi(MPI_Testall(count, requests, &done, MPI_STATUSES_IGNORE), "MPI_Testall");
    if (done) return;
    // A rank still at its share of the work: the wait counts afresh.
    if (from_last_sign && received_signs_of_work()) clock = WaitClock();
    if (clock.waited_longer_than(limit_seconds)) {
      // The job ends here, not by an exception: unwinding would free the buffers of
      // `requests`, into which the other ranks' transfers may still write.
      const std::string& during = waiting_context().during;
      std::ostringstream line;
      line << "transformer_hpc: error on " << process_identity() << ": " << during
           << (during.empty() ? "" : ": ") << "this rank waited " << limit_seconds
           << " s (dist.timeout_s) ";
      if (from_last_sign) {
        line << "in " << what << " without a sign of work from the other ranks";
      } else {
        line << "for the others in " << what;
      }
      line << ": a rank is stopped (SIGSTOP, a debugger), hung or lost, so the job is "
           << "ended; " << waiting_context().remedy << " ("
           << (from_last_sign ? waiting_context().slow_rank : "a rank that is only slow")
           << ": raise dist.timeout_s)\n";
      write_whole_line(line.str());
      end_the_job_from_a_wait();
    }
    // A second of polls without pause, as a blocking wait polls (Open MPI moves a
    // non-blocking collective on only inside its calls); a longer wait is for a
    // straggler, and a poll a millisecond leaves the core to the threads that compute.
    if (steady_seconds() - started > 1.0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
}

namespace {

// While one lives, a thread watches the clock: after `seconds` (WaitClock's, which leaves
// out this process's own stops) it ends the process, exit 1, with `line` (whole, with its
// newline), which says why.
class WaitWatch {
 public:
  WaitWatch(double seconds, std::string line)
      : line_(std::move(line)), watcher_([this, seconds] { watch(seconds); }) {}
  ~WaitWatch() {
    {
      const std::lock_guard<std::mutex> lock(mutex_);
      done_ = true;
    }
    wake_.notify_one();
    watcher_.join();
  }
  WaitWatch(const WaitWatch&) = delete;
  WaitWatch& operator=(const WaitWatch&) = delete;

 private:
  void watch(double seconds) {
    WaitClock clock;
    std::unique_lock<std::mutex> lock(mutex_);
    // Woken every 50 ms, so that the clock sees a SIGCONT between two of its polls.
    while (!wake_.wait_for(lock, std::chrono::milliseconds(50), [this] { return done_; })) {
      if (!clock.waited_longer_than(seconds)) continue;
      write_whole_line(line_);
      std::fflush(nullptr);
      std::_Exit(1);
    }
  }

  const std::string line_;
  std::mutex mutex_;
  std::condition_variable wake_;
  bool done_ = false;
  std::thread watcher_;  // last: started once the rest is made
};

}  // namespace

MpiSession::MpiSession(int* argc, char*** argv, double start_limit_seconds) {
  int provided = 0;
  if (const int rank = launcher_rank(); rank >= 0) set_process_rank(rank);
  // FUNNELED: only the main thread calls MPI (the CPU BLAS threads never do).
  {
    const LeakChecksPaused open_mpi_keeps_these_until_exit;
    std::optional<WaitWatch> watch;
    if (start_limit_seconds > 0) {
      std::ostringstream line;
      line << "transformer_hpc: error on " << process_identity() << ": this rank waited "
           << start_limit_seconds << " s (dist.timeout_s, at least 30 s in MPI's start-up) "
           << "for the others in MPI's start-up (MPI_Init): a rank did not start (stopped, "
           << "hung loading the program or on a file system, lost), so the job is ended; "
           << "start the job again (a rank that is only slow to start: raise "
           << "dist.timeout_s)\n";
      watch.emplace(start_limit_seconds, line.str());
    }
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
  if (!mpi_initialized()) return;
  int size = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  std::optional<WaitWatch> watch;
  if (size > 1 && finalize_limit_seconds_ > 0) {
    std::ostringstream line;
    line << "transformer_hpc: error on " << process_identity() << ": this rank waited "
         << finalize_limit_seconds_ << " s (dist.timeout_s) for the others at the job's end "
         << "(MPI_Finalize): a rank is stopped (SIGSTOP, a debugger), hung or lost, so this "
         << "one leaves without it; its own work is done and written (a rank that is only "
         << "slow to end: raise dist.timeout_s)\n";
    watch.emplace(finalize_limit_seconds_, line.str());
  }
  MPI_Finalize();
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

Communicator::WaitLimit::WaitLimit(const Communicator& comm, double seconds, std::string during,
                                   WaitFrom from, std::string remedy, std::string slow_rank)
    : comm_(comm),
      previous_seconds_(comm.wait_limit_seconds_),
      previous_from_(comm.wait_from_),
      previous_during_(std::move(waiting_context().during)),
      previous_remedy_(std::move(waiting_context().remedy)),
      previous_slow_rank_(std::move(waiting_context().slow_rank)),
      uncaught_at_start_(std::uncaught_exceptions()) {
  comm_.wait_limit_seconds_ = seconds;
  comm_.wait_from_ = from;
  comm_.last_sign_seconds_ = -1;  // the first batch's sign goes out at once
  waiting_context().during = std::move(during);
  waiting_context().remedy = std::move(remedy);
  waiting_context().slow_rank = std::move(slow_rank);
  if (from == WaitFrom::kLastSignOfWork) {
    sign_.emplace([&comm] { comm.show_working(); });
    // This work's own tag and counts; those of a work it is inside come back at its end.
    previous_work_ = std::exchange(current_work, ++works_begun);
    previous_signs_sent_ = std::exchange(signs_sent, 0);
    previous_signs_received_ = std::exchange(signs_received, 0);
  }
}

Communicator::WaitLimit::~WaitLimit() {
  if (comm_.mpi_ && comm_.wait_from_ == WaitFrom::kLastSignOfWork) {
    try {
      if (std::uncaught_exceptions() > uncaught_at_start_) {
        // Leaving on an error, perhaps on this rank alone: no collective here (the others
        // may never come); take what has come, the job is ending.
        received_signs_of_work();
        signs_sent = 0;
        signs_received = 0;
      } else {
        receive_every_sign_sent();
      }
    } catch (const Error&) {  // left for the next work's waits to take
    }
  }
  if (comm_.wait_from_ == WaitFrom::kLastSignOfWork) {
    current_work = previous_work_;
    signs_sent = previous_signs_sent_;
    signs_received = previous_signs_received_;
  }
  comm_.wait_limit_seconds_ = previous_seconds_;
  comm_.wait_from_ = previous_from_;
  waiting_context().during = std::move(previous_during_);
  waiting_context().remedy = std::move(previous_remedy_);
  waiting_context().slow_rank = std::move(previous_slow_rank_);
}

void Communicator::WaitLimit::receive_every_sign_sent() const {
  // The signs that came after the last wait are of this work, not the next, and a sign
  // still on its way must not be left unreceived at MPI_Finalize (the standard asks for
  // every message to be matched) or taken for a sign of the next work. Every rank ends
  // the work here (validation, --eval): one sum of the rounds of signs each sent says
  // how many each is owed, and they have all been sent, so the receives that remain end.
  if (comm_.size_ == 1 || comm_.wait_limit_seconds_ <= 0) return;
  int64_t rounds = signs_sent;
  MPI_Request request;
  check_mpi(MPI_Iallreduce(MPI_IN_PLACE, &rounds, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD,
                           &request),
            "MPI_Iallreduce");
  // (named as the user sees it: the ranks meet as the work ends)
  comm_.finish(&request, "the ranks' meeting at its end");
  const int64_t owed = rounds - signs_sent;  // a round of every other rank: one message here
  // Sent before the sum, so on their way: polled within the limit all the same, so that
  // counts that disagree (a sign's send that failed half-way) leave them rather than hang.
  WaitClock clock;
  while (signs_received < owed && clock.waited_seconds() <= comm_.wait_limit_seconds_) {
    if (!received_signs_of_work()) std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  signs_sent = 0;
  signs_received = 0;
}

void Communicator::show_working() const {
  if (!mpi_ || size_ == 1 || wait_limit_seconds_ <= 0 ||
      wait_from_ != WaitFrom::kLastSignOfWork) {
    return;
  }
  const double now = steady_seconds();
  // A 64th of the limit: a batch that ends inside it sends nothing, so the gap the others
  // see is up to a batch plus this (an eighth let a batch of 7/8 of the limit end a job).
  if (last_sign_seconds_ >= 0 && now - last_sign_seconds_ < wait_limit_seconds_ / 64) return;
  last_sign_seconds_ = now;
  ++signs_sent;
  for (int to = 0; to < size_; ++to) {
    if (to == rank_) continue;
    MPI_Request request;
    check_mpi(MPI_Isend(nullptr, 0, MPI_BYTE, to, sign_tag(), MPI_COMM_WORLD, &request),
              "MPI_Isend");
    // Nothing to wait for: the message has no bytes to keep, and the rank it goes to may
    // be stopped and never take it (MPI completes it all the same).
    check_mpi(MPI_Request_free(&request), "MPI_Request_free");
  }
}

void Communicator::finish(void* request, const char* what) const {
  wait_within(1, static_cast<MPI_Request*>(request), wait_limit_seconds_, what,
              wait_from_ == WaitFrom::kLastSignOfWork);
}

namespace {

// An in-place MPI_Iallreduce over every rank, posted.
MPI_Request post_all_reduce(void* values, int count, MPI_Datatype type, MPI_Op op) {
  MPI_Request request;
  check_mpi(MPI_Iallreduce(MPI_IN_PLACE, values, count, type, op, MPI_COMM_WORLD, &request),
            "MPI_Iallreduce");
  return request;
}

// The MPI type of a sum's elements.
MPI_Datatype mpi_type_of(const int64_t*) { return MPI_INT64_T; }
MPI_Datatype mpi_type_of(const double*) { return MPI_DOUBLE; }

}  // namespace

template <typename T>
std::vector<T> Communicator::sums(std::vector<T> values) const {
  if (!mpi_ || values.empty()) return values;
  MPI_Request request = post_all_reduce(values.data(), static_cast<int>(values.size()),
                                        mpi_type_of(values.data()), MPI_SUM);
  finish(&request, "a sum over the ranks");
  return values;
}
template std::vector<int64_t> Communicator::sums(std::vector<int64_t>) const;
template std::vector<double> Communicator::sums(std::vector<double>) const;

int64_t Communicator::sum(int64_t value) const { return sums(std::vector<int64_t>{value})[0]; }

double Communicator::sum(double value) const { return sums(std::vector<double>{value})[0]; }

std::vector<int64_t> Communicator::max(std::vector<int64_t> values) const {
  if (!mpi_ || values.empty()) return values;
  MPI_Request request =
      post_all_reduce(values.data(), static_cast<int>(values.size()), MPI_INT64_T, MPI_MAX);
  finish(&request, "the step's decision");
  return values;
}

void Communicator::wait_for_every_rank() const {
  if (!mpi_) return;
  MPI_Request request;
  check_mpi(MPI_Ibarrier(MPI_COMM_WORLD, &request), "MPI_Ibarrier");
  finish(&request, "the meeting after rank 0's files");
}

int64_t Communicator::broadcast_from_root(int64_t value) const {
  if (!mpi_) return value;
  broadcast_bytes_from_root(&value, static_cast<int>(sizeof value));
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
  MPI_Request request;
  check_mpi(MPI_Ibcast(data, bytes, MPI_BYTE, 0, MPI_COMM_WORLD, &request), "MPI_Ibcast");
  finish(&request, "a broadcast from rank 0");
}

std::vector<std::string> Communicator::all_gather(const std::string& value) const {
  if (!mpi_) return {value};
  int length = static_cast<int>(value.size());
  std::vector<int> lengths(size_);
  MPI_Request request;
  check_mpi(MPI_Iallgather(&length, 1, MPI_INT, lengths.data(), 1, MPI_INT, MPI_COMM_WORLD,
                           &request),
            "MPI_Iallgather");
  finish(&request, "a gather of the ranks' values");
  std::vector<int> offsets(size_, 0);
  for (int r = 1; r < size_; ++r) offsets[r] = offsets[r - 1] + lengths[r - 1];
  std::string joined(static_cast<size_t>(offsets.back() + lengths.back()), '\0');
  check_mpi(MPI_Iallgatherv(value.data(), length, MPI_CHAR, joined.data(), lengths.data(),
                            offsets.data(), MPI_CHAR, MPI_COMM_WORLD, &request),
            "MPI_Iallgatherv");
  finish(&request, "a gather of the ranks' values");
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
  write_whole_line(message + "\n");
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
