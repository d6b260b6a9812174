#include "io/atomic_file.h"

#include <fcntl.h>
#include <poll.h>
#include <pwd.h>
#include <pthread.h>
#include <sys/resource.h>
#include <sys/statvfs.h>
#include <sys/stat.h>
#include <sys/file.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <csignal>
#include <mutex>
#include <cstring>
#include <exception>
#include <filesystem>
#include <iostream>
#include <iterator>
#include <optional>
#include <memory>
#include <vector>

#include "common/error.h"
#include "common/still_working.h"

namespace thpc {
namespace {

namespace fs = std::filesystem;

// `path` and each symbolic link's target after it, to the first that is no link (at
// most 40 links, as the kernel follows).
std::vector<fs::path> links_from(const std::string& path) {
  std::vector<fs::path> chain{fs::path(path)};
  std::error_code error;
  while (chain.size() <= 40 && fs::is_symlink(chain.back(), error)) {
    const fs::path target = fs::read_symlink(chain.back(), error);
    if (error) break;
    chain.push_back(target.is_absolute() ? target : chain.back().parent_path() / target);
  }
  return chain;
}

}  // namespace

std::string file_named_by(const std::string& path) {
  const std::vector<fs::path> chain = links_from(path);
  // A loop: the rename would replace the looping link with a file of its own.
  if (chain.size() > 40) THPC_FAIL(path << ": too many levels of symbolic links (a loop?)");
  return chain.back().string();
}

namespace {

// What `hop` (a path, absolute or not) names when it is a descriptor's: -1 for another
// process's (/proc/PID/fd/N), N for this process's (/dev/fd/N, /proc/self/fd/N,
// /proc/thread-self/fd/N, /proc/<this pid>/fd/N), nothing for any other path (through
// /proc too: /proc/self/cwd/out.txt is a file of the working directory).
std::optional<int> descriptor_of(const fs::path& hop) {
  std::error_code error;
  const fs::path where = fs::absolute(hop, error).lexically_normal();
  const std::vector<std::string> parts(where.begin(), where.end());  // "/", dev, fd, N
  const bool dev_fd = parts.size() == 4 && parts[1] == "dev" && parts[2] == "fd";
  const bool proc_fd = parts.size() == 5 && parts[1] == "proc" && parts[3] == "fd";
  if (!dev_fd && !proc_fd) return std::nullopt;
  const std::string& last = parts.back();
  const bool number = !last.empty() && last.size() <= 9 &&
                      last.find_first_not_of("0123456789") == std::string::npos;
  const bool own = dev_fd || parts[2] == "self" || parts[2] == "thread-self" ||
                   parts[2] == std::to_string(::getpid());
  return own && number ? std::stoi(last) : -1;
}

}  // namespace

bool names_an_open_descriptor(const std::string& path) {
  for (const fs::path& hop : links_from(path)) {
    if (descriptor_of(hop)) return true;
  }
  return false;
}

std::optional<int> own_descriptor_named(const std::string& path) {
  for (const fs::path& hop : links_from(path)) {
    const std::optional<int> descriptor = descriptor_of(hop);
    if (descriptor && *descriptor >= 0) return descriptor;
  }
  return std::nullopt;
}

void fsync_path(const std::string& path, const std::string& what) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0 || ::fsync(fd) != 0) {
    const int error = errno;
    if (fd >= 0) ::close(fd);
    THPC_FAIL("cannot write " << what << ": fsync of " << path << ": " << std::strerror(error));
  }
  ::close(fd);
}

void fail_writes_past_the_file_size_limit() { std::signal(SIGXFSZ, SIG_IGN); }

namespace {

constexpr int kInterruptSlots = 64;
constexpr size_t kInterruptPathBytes = 4096;
char g_interrupt_paths[kInterruptSlots][kInterruptPathBytes];
// 1 while a slot's path is complete and registered; only then does the handler read it.
// Set after the path is copied (release) and loaded before it is read (acquire): the
// handler may run on any thread, where a volatile sig_atomic_t orders nothing.
std::atomic<int> g_interrupt_used[kInterruptSlots];
std::mutex g_interrupt_slots;  // between threads that register (never in the handler)

// InterruptionsHeld: 1 while a section holds the signals, and the signal another thread's
// handler took then (the section's own thread has them blocked). Lock-free atomics: the
// handler may run on any thread.
std::atomic<int> g_interruptions_held{0};
std::atomic<int> g_held_signal{0};
static_assert(std::atomic<int>::is_always_lock_free);

// say_when_interrupted's line, written whole before its length is set (release), read
// after the handler loads the length (acquire): the handler may run on any thread.
char g_interruption_line[1024];
std::atomic<size_t> g_interruption_line_bytes{0};
static_assert(std::atomic<size_t>::is_always_lock_free);

extern "C" void remove_temporaries_and_end(int signal_number) {
  if (g_interruptions_held) {
    g_held_signal = signal_number;
    return;
  }
  const size_t line_bytes = g_interruption_line_bytes.load(std::memory_order_acquire);
  if (remove_registered_temporaries() > 0 && line_bytes > 0) {
    const ssize_t written = ::write(STDERR_FILENO, g_interruption_line, line_bytes);
    (void)written;  // nothing better to do in a handler about to end the process
  }
  std::signal(signal_number, SIG_DFL);
  std::raise(signal_number);
}

}  // namespace

namespace {

sigset_t interruptions() {
  sigset_t set;
  sigemptyset(&set);
  for (const int signal_number : {SIGINT, SIGTERM, SIGHUP}) sigaddset(&set, signal_number);
  return set;
}

// One of those signals pending for this thread (blocked here), 0 if none.
int pending_interruption() {
  sigset_t pending;
  sigemptyset(&pending);
  if (::sigpending(&pending) != 0) return 0;
  for (const int signal_number : {SIGINT, SIGTERM, SIGHUP}) {
    if (sigismember(&pending, signal_number) == 1) return signal_number;
  }
  return 0;
}

// The section's blocked signals and the mask it restores.
sigset_t g_mask_before;

}  // namespace

// Blocked, not only deferred by the handler: a signal that reached this thread would also
// interrupt the rename or unlink under way (EINTR on Lustre or FUSE), the section's
// stop halfway again.
InterruptionsHeld::InterruptionsHeld() {
  const sigset_t held = interruptions();
  ::pthread_sigmask(SIG_BLOCK, &held, &g_mask_before);
  g_interruptions_held = 1;
}

// Ended by an exception (a failed rename), the signals stay blocked: the error is said and
// the program exits 1, rather than the held signal ending it before a word. Otherwise the
// mask before is restored, and a pending signal ends the process as it would have.
InterruptionsHeld::~InterruptionsHeld() {
  g_interruptions_held = 0;
  if (std::uncaught_exceptions() > 0) return;
  if (const int signal_number = g_held_signal.exchange(0); signal_number != 0) {
    remove_temporaries_and_end(signal_number);
  }
  ::pthread_sigmask(SIG_SETMASK, &g_mask_before, nullptr);
}

int InterruptionsHeld::signal_received() {
  const int other_thread = g_held_signal;
  return other_thread != 0 ? other_thread : pending_interruption();
}

int remove_registered_temporaries() {
  int removed = 0;
  for (int slot = 0; slot < kInterruptSlots; ++slot) {
    // async-signal-safe
    if (g_interrupt_used[slot].load(std::memory_order_acquire) &&
        ::unlink(g_interrupt_paths[slot]) == 0) {
      ++removed;
    }
  }
  return removed;
}

void say_when_interrupted(const std::string& line) {
  g_interruption_line_bytes.store(0, std::memory_order_release);  // no half-copied line read
  if (line.empty()) return;
  // Cut to the buffer, ending in a newline whatever it held.
  const size_t bytes = std::min(line.size(), sizeof g_interruption_line);
  std::memcpy(g_interruption_line, line.data(), bytes);
  g_interruption_line[bytes - 1] = '\n';
  g_interruption_line_bytes.store(bytes, std::memory_order_release);
}

RemovedWhenInterrupted::RemovedWhenInterrupted(const std::string& path) {
  if (path.size() >= kInterruptPathBytes) return;
  const std::lock_guard<std::mutex> guard(g_interrupt_slots);
  for (int slot = 0; slot < kInterruptSlots; ++slot) {
    if (g_interrupt_used[slot].load(std::memory_order_relaxed)) continue;
    std::memcpy(g_interrupt_paths[slot], path.c_str(), path.size() + 1);
    g_interrupt_used[slot].store(1, std::memory_order_release);
    slot_ = slot;
    return;
  }
}

RemovedWhenInterrupted::~RemovedWhenInterrupted() {
  if (slot_ < 0) return;
  const std::lock_guard<std::mutex> guard(g_interrupt_slots);
  g_interrupt_used[slot_].store(0, std::memory_order_release);
}

void remove_temporaries_when_interrupted() {
  for (const int signal_number : {SIGINT, SIGTERM, SIGHUP}) {
    struct sigaction previous {};
    if (::sigaction(signal_number, nullptr, &previous) == 0 && previous.sa_handler == SIG_IGN) {
      continue;
    }
    struct sigaction action {};
    action.sa_handler = remove_temporaries_and_end;
    sigemptyset(&action.sa_mask);
    ::sigaction(signal_number, &action, nullptr);
  }
}

namespace {
bool g_stream_was_closed[3] = {false, false, false};
}  // namespace

void guard_standard_streams() {
  for (int stream = 0; stream < 3; ++stream) {
    if (::fcntl(stream, F_GETFD) != -1) continue;
    g_stream_was_closed[stream] = true;
    int opened = ::open(stream == 1 ? "/dev/full" : "/dev/null",
                        stream == 0 ? O_RDONLY : O_WRONLY);
    // Without /dev/full (a bare chroot), a descriptor no write can use takes the number.
    if (opened < 0) opened = ::open("/dev/null", O_RDONLY);
    if (opened >= 0 && opened != stream) {
      ::dup2(opened, stream);
      ::close(opened);
    }
  }
}

bool standard_input_was_closed() { return g_stream_was_closed[0]; }
bool standard_output_was_closed() { return g_stream_was_closed[1]; }

std::string why_no_file_can_be_made_at(const std::string& path) {
  struct stat named {};
  if (::lstat(path.c_str(), &named) != 0 || S_ISREG(named.st_mode)) return "";
  return S_ISLNK(named.st_mode) ? "is a symbolic link, whose target would be written: remove it"
                                : "is not a file (a directory, a pipe?): remove it";
}

std::string why_write_protected(const std::string& path) {
  struct stat status {};
  if (::stat(path.c_str(), &status) != 0 || !S_ISREG(status.st_mode)) return "";
  if (::access(path.c_str(), W_OK) == 0 || errno != EACCES) return "";
  char mode[8];
  std::snprintf(mode, sizeof mode, "%04o", static_cast<unsigned>(status.st_mode & 07777));
  if (status.st_uid == ::geteuid()) {
    return std::string("is write-protected (mode ") + mode + "): make it writable (chmod u+w " +
           path + ") or remove it to have it replaced";
  }
  std::string owner = std::to_string(status.st_uid);
  std::vector<char> buffer(16384);
  passwd entry {};
  passwd* found = nullptr;
  if (::getpwuid_r(status.st_uid, &entry, buffer.data(), buffer.size(), &found) == 0 &&
      found != nullptr) {
    owner = found->pw_name;
  }
  return "is " + owner + "'s (mode " + mode + "), not writable by this user: remove it, where "
         "its directory lets you, to have it replaced";
}

std::string standard_input_unreadable() {
  // Closed (`<&-`), or open for writing only (GNU nohup's for a terminal's).
  const int flags = ::fcntl(STDIN_FILENO, F_GETFL);
  if (flags == -1 || standard_input_was_closed()) return "closed";
  if ((flags & O_ACCMODE) == O_WRONLY) return "not open for reading";
  // `< DIR`: its reads fail (EISDIR), which read as the end of an empty input.
  struct stat status {};
  if (::fstat(STDIN_FILENO, &status) == 0 && S_ISDIR(status.st_mode)) {
    return "a directory, not a text";
  }
  return "";
}

namespace {

// Whether standard output is a pipe whose reader has gone: `transformer_hpc --help | head
// -1` read what it wanted and left, and the rest could not be written (EPIPE, SIGPIPE
// being ignored). A pipe's write end polls as an error once its reader is gone.
bool standard_output_reader_gone() {
  struct stat status {};
  if (::fstat(STDOUT_FILENO, &status) != 0 || !S_ISFIFO(status.st_mode)) return false;
  pollfd output{STDOUT_FILENO, POLLOUT, 0};
  return ::poll(&output, 1, 0) == 1 && (output.revents & POLLERR) != 0;
}

}  // namespace

std::string standard_output_failure() {
  errno = 0;
  std::cout.flush();
  const bool failed = !std::cout || std::fflush(stdout) != 0 || std::ferror(stdout) != 0;
  if (!failed) return "";
  const int error = errno;
  // A reader that left (`| head`) is no failure: it had what it wanted, as a program that
  // SIGPIPE ends says nothing either (before: "writing the standard output failed (Broken
  // pipe)", exit 1, as often as the reader left before the last write; a helper's trial).
  if (error == EPIPE || standard_output_reader_gone()) return "";
  // Closed (`>&-`): its writes failed with EBADF long before, which a guess at the
  // storage ("a full disk?") misnamed.
  if (standard_output_was_closed() || ::fcntl(STDOUT_FILENO, F_GETFL) == -1) {
    return "standard output is closed (>&-): what was to be written there is lost; give it "
           "a file (> FILE) or /dev/null";
  }
  // errno is the failed write's when the last flush failed; an earlier one's is gone.
  return std::string("writing the standard output failed (") +
         (error != 0 ? std::strerror(error) : "a full disk or a file-size limit?") +
         "): what it holds is cut short";
}

std::string storage_advice(const std::string& directory, const std::string& failure,
                           uintmax_t bytes_written) {
  // HDF5's failures say "(errno N)"; the project's own writers give the system's words
  // (std::strerror), which a quota or a full file system with 16 MiB left was not read
  // from (a review: "check its directory's permissions and space").
  const auto says = [&](const char* text) {
    if (failure.find(text) != std::string::npos) return true;
    int number = 0;
    return std::sscanf(text, "(errno %d)", &number) == 1 &&
           failure.find(std::string("(") + std::strerror(number) + ")") != std::string::npos;
  };
  rlimit limit{};
  const bool limited = ::getrlimit(RLIMIT_FSIZE, &limit) == 0 && limit.rlim_cur != RLIM_INFINITY;
  if (limited && (says("(errno 27)") || bytes_written + (1u << 20) >= limit.rlim_cur)) {
    return "the process's file-size limit (ulimit -f, or the batch system's) of " +
           std::to_string(static_cast<unsigned long long>(limit.rlim_cur)) +
           " bytes stopped it; raise the limit, or write it where none applies";
  }
  struct statvfs space {};
  const bool measured = ::statvfs(directory.c_str(), &space) == 0;
  const unsigned long long available =
      measured ? static_cast<unsigned long long>(space.f_bavail) * space.f_frsize : 0;
  // A file system that holds no files (sysfs, procfs: no blocks at all) or that is mounted
  // read-only was said "full (0 KiB left)" (a helper's trial, --destdir /sys/kernel).
  if (measured && space.f_blocks == 0) {
    return directory + " is on a file system that holds no files of its own (sysfs, procfs?): "
           "write elsewhere";
  }
  if (measured && (space.f_flag & ST_RDONLY) != 0) {
    return "the file system of " + directory + " is mounted read-only: write elsewhere";
  }
  // Little space left explains a failure that names no other cause (HDF5's may name none).
  const bool other_cause = says("(errno ") && !says("(errno 28)") && !says("(errno 122)");
  // Out of inodes (files) with space left: a scratch file system's quota of files.
  if ((says("(errno 28)") || says("(errno 122)")) && measured && space.f_files > 0 &&
      space.f_favail == 0 && available >= (16ull << 20)) {
    return "the file system (or this user's quota) of " + directory + " can hold no more "
           "files (no inodes left, " + std::to_string(available >> 20) + " MiB of space); "
           "remove files there, or write elsewhere";
  }
  if (says("(errno 28)") || says("(errno 122)") ||
      (!other_cause && measured && available < (16ull << 20))) {
    return "the file system (or this user's quota) of " + directory + " is full" +
           (measured ? " (" + std::to_string(available >> 10) + " KiB left)" : std::string()) +
           "; free space there, or write elsewhere";
  }
  if (says("(errno 5)")) {
    return "the storage of " + directory + " reported an I/O error (EIO): check the device "
           "or the file system's health before writing there again";
  }
  return "";
}

void keep_permissions_of(const std::string& replaced, const std::string& written) {
  struct stat before {}, now {};
  if (::stat(replaced.c_str(), &before) != 0 || !S_ISREG(before.st_mode) ||
      ::stat(written.c_str(), &now) != 0) {
    return;
  }
  if (now.st_gid != before.st_gid) {
    const int ignored = ::chown(written.c_str(), static_cast<uid_t>(-1), before.st_gid);
    (void)ignored;  // not a member of that group: the file keeps this user's
  }
  // The permission bits alone: no set-user-ID, set-group-ID or sticky bit is copied onto
  // an output.
  ::chmod(written.c_str(), before.st_mode & 0777);
  // The access ACL as the kernel stores it (its xattr; setting it sets the mode's group
  // bits to its mask). Same directory, same file system: it takes what the other had.
  std::vector<char> acl(65536);
  const ssize_t bytes = ::getxattr(replaced.c_str(), "system.posix_acl_access", acl.data(),
                                   acl.size());
  if (bytes > 0) {
    const int ignored = ::setxattr(written.c_str(), "system.posix_acl_access", acl.data(),
                                   static_cast<size_t>(bytes), 0);
    (void)ignored;  // a file system without ACLs had none to copy
  }
}

bool same_file(const std::string& a, const std::string& b) {
  std::error_code error_a, error_b;
  const bool a_exists = fs::exists(a, error_a), b_exists = fs::exists(b, error_b);
  if (a_exists && b_exists) {
    // st_dev and st_ino: hard links, symbolic links and any spelling of the path.
    return fs::equivalent(a, b, error_a) && !error_a;
  }
  // Not both exist (yet): the same path once made absolute and its symbolic links, "."
  // and ".." resolved (weakly_canonical leaves a relative path whose first component
  // does not exist relative, hence absolute first). One that exists is compared too:
  // "ck/sub/.." names "ck" once "sub" is made (a trainer took checkpoint.dir's lock,
  // then a second one for the train.metrics_dir spelt so, and was refused by its own).
  // A path below a file that is no directory names nothing, ever ("ck/sub/.." where sub is
  // a file: the system refuses it, though its letters resolve to ck).
  const auto below_a_file = [](const std::string& path) {
    std::error_code error;
    fs::path existing = fs::absolute(path, error).parent_path();
    while (!existing.empty() && !fs::exists(existing, error) &&
           existing != existing.parent_path()) {
      existing = existing.parent_path();
    }
    return fs::exists(existing, error) && !fs::is_directory(existing, error);
  };
  if ((!a_exists && below_a_file(a)) || (!b_exists && below_a_file(b))) return false;
  // ("ck/sub/.." comes out as "ck/": the trailing separator is no part of the name.)
  const auto resolved = [](const std::string& path, std::error_code& error) {
    const fs::path full = fs::weakly_canonical(fs::absolute(path, error), error);
    return full.has_filename() ? full : full.parent_path();
  };
  const fs::path canonical_a = resolved(a, error_a), canonical_b = resolved(b, error_b);
  return !error_a && !error_b && canonical_a == canonical_b;
}

std::string temporary_path(const std::string& path) {
  const fs::path final_path(file_named_by(path));
  std::string name = final_path.filename().string();
  // A name of 251 to 255 bytes, which a file may have (NAME_MAX), has no room for "." and
  // ".tmp" (its write failed with "File name too long"): its first 230 bytes and a digest
  // of the whole (FNV-1a, the same in every program and build) name the temporary file.
  constexpr size_t kLongestName = 255, kAdded = 5;
  if (name.size() + kAdded > kLongestName) {
    uint64_t digest = 14695981039346656037ull;
    for (const unsigned char byte : name) digest = (digest ^ byte) * 1099511628211ull;
    char hex[17];
    std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(digest));
    name = name.substr(0, 230) + "~" + hex;
  }
  return (final_path.parent_path() / ("." + name + ".tmp")).string();
}

OutputClaim::OutputClaim(const std::string& path, const std::string& what)
    : temporary_(temporary_path(path)) {
  const auto refuse = [&](const std::string& why) {
    THPC_FAIL("cannot write " << what << ": its temporary file " << temporary_ << " " << why);
  };
  const auto in_use = [&] {
    return OutputInUse("cannot write " + what + ": another program is writing " + path +
                       " now (its temporary file " + temporary_ + " is locked by it): wait " +
                       "for it to end, or give this one another output file");
  };
  // The file locked must still be the one of that name: another program's, renamed over
  // its output between this open and the lock, is taken again by its new name.
  for (int attempt = 0; attempt < 100; ++attempt) {
    // Not through a link (a .F.tmp that is one would have its target written), nor into a
    // FIFO (the open waited for a reader) or anything else that is no file.
    if (const std::string why = why_no_file_can_be_made_at(temporary_); !why.empty()) {
      refuse(why);
    }
    descriptor_ = ::open(temporary_.c_str(), O_WRONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    if (descriptor_ < 0 && errno == EACCES) {
      // A leftover this user may not write (read-only; before the claim, its failed write
      // removed it and the next run went on): locked by nobody, it is removed and made
      // anew; locked, another program writes it.
      const int reader = ::open(temporary_.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
      if (reader >= 0) {
        const bool locked = ::flock(reader, LOCK_EX | LOCK_NB) == 0;
        const bool held_elsewhere = !locked && errno == EWOULDBLOCK;
        const bool removed = locked && ::unlink(temporary_.c_str()) == 0;
        ::close(reader);
        if (held_elsewhere) throw in_use();
        if (removed) continue;
      }
      errno = EACCES;
    }
    made_file_ = descriptor_ < 0 && errno == ENOENT;
    if (made_file_) {
      descriptor_ =
          ::open(temporary_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0666);
      if (descriptor_ < 0 && errno == EEXIST) continue;  // another program's, just made
      // Made read-only by the umask (0222 made it 0444): the write, which opens it again by
      // name, was refused its own file. The owner may read and write it until the write
      // ends; then it gets the mode the umask gave it (restore_mode_made).
      struct stat made {};
      if (descriptor_ >= 0 && ::fstat(descriptor_, &made) == 0) {
        mode_made_ = made.st_mode & 07777;
        if ((mode_made_ & (S_IRUSR | S_IWUSR)) != (S_IRUSR | S_IWUSR)) {
          ::fchmod(descriptor_, mode_made_ | S_IRUSR | S_IWUSR);
        }
      }
      if (descriptor_ < 0 && errno == ENOENT) {
        made_file_ = false;  // its directory is not made yet: write_atomically claims again
        return;
      }
    }
    if (descriptor_ < 0 && made_file_) {
      // A full file system or inode quota, a read-only one: said as any failed write is.
      const int error = errno;
      const std::string failure = "cannot write " + what + ": cannot create its temporary "
                                  "file " + temporary_ + ": " + std::strerror(error) +
                                  " (errno " + std::to_string(error) + ")";
      const fs::path directory = fs::path(temporary_).parent_path();
      const std::string advice =
          storage_advice(directory.empty() ? "." : directory.string(), failure, 0);
      THPC_FAIL(failure << (advice.empty() ? "" : ": " + advice));
    }
    if (descriptor_ < 0) {
      // Another user's (EACCES), say: taken as unclaimed, its file was removed as this
      // write's leftover when the write then failed.
      const int error = errno;
      refuse("cannot be opened (" + std::string(std::strerror(error)) +
             "): another program may be writing " + path + "; if none is, remove it");
    }
    if (::flock(descriptor_, LOCK_EX | LOCK_NB) != 0 && errno == EWOULDBLOCK) {
      ::close(descriptor_);
      descriptor_ = -1;
      throw in_use();
    }
    if (is_still_named()) {
      // Ours now, made or taken over: removed by an interrupt until released.
      interrupted_ = std::make_unique<RemovedWhenInterrupted>(temporary_);
      return;
    }
    ::close(descriptor_);
    descriptor_ = -1;
  }
  refuse("was replaced 100 times while this program locked it: is another program writing " +
         path + "?");
}

bool OutputClaim::is_still_named() const {
  struct stat locked {}, named {};
  return ::fstat(descriptor_, &locked) == 0 && ::stat(temporary_.c_str(), &named) == 0 &&
         locked.st_dev == named.st_dev && locked.st_ino == named.st_ino;
}

void OutputClaim::restore_mode_made() {
  if (made_file_ && descriptor_ >= 0 && (mode_made_ & (S_IRUSR | S_IWUSR)) !=
                                            (S_IRUSR | S_IWUSR)) {
    ::fchmod(descriptor_, mode_made_);
  }
}

void OutputClaim::release() {
  interrupted_.reset();
  if (descriptor_ >= 0) ::close(descriptor_);
  descriptor_ = -1;
}

OutputClaim::~OutputClaim() {
  if (descriptor_ < 0) return;
  // Made by this claim and never handed to a write: an empty file of ours, still locked
  // (so no other program's), removed.
  if (made_file_ && !handed_over_ && is_still_named()) ::unlink(temporary_.c_str());
  ::close(descriptor_);
}

DirectoriesMade::DirectoriesMade(const std::string& directory, std::error_code& error) {
  error.clear();
  // A level at a time, each one made here recorded: the missing ones were guessed from
  // the path before, and "new/../out" took an existing out for one to remove.
  fs::path prefix;
  for (const fs::path& part : fs::path(directory)) {
    prefix /= part;
    if (part.empty() || part == "." || part == ".." || fs::is_directory(prefix, error)) {
      continue;
    }
    error.clear();
    if (fs::create_directory(prefix, error)) {
      made_.insert(made_.begin(), prefix.string());  // deepest first
      // Its owner may make the next level or the file in it, as `mkdir -p` makes its
      // parents (POSIX: u+wx whatever the umask): under umask 0222 it was 0555, and the
      // write was refused the directory it had just made.
      fs::permissions(prefix, fs::perms::owner_write | fs::perms::owner_exec,
                      fs::perm_options::add, error);
      error.clear();
    } else if (error) {
      return;
    } else if (!fs::is_directory(prefix, error)) {
      error = std::make_error_code(std::errc::not_a_directory);
      return;
    }
  }
  error.clear();
}

DirectoriesMade::~DirectoriesMade() {
  std::error_code error;
  for (const std::string& made : made_) {
    if (!fs::is_directory(made, error) || !fs::is_empty(made, error) ||
        !fs::remove(made, error)) {
      break;  // a file in it, or not ours to remove: it and its parents stay
    }
  }
}

void write_atomically(const std::string& path, const std::string& what,
                      const std::function<void(const std::string& temporary)>& write,
                      OutputClaim* claim) {
  // A descriptor is written through, never renamed over (write_text_atomically does so);
  // a whole file (a checkpoint, an HDF5 dump) cannot go there.
  if (names_an_open_descriptor(path)) {
    THPC_FAIL("cannot write " << what << ": " << path << " is an open descriptor of this "
                              << "process (a stream), not a file: give a file name");
  }
  const fs::path final_path(file_named_by(path));
  const fs::path directory = final_path.has_parent_path() ? final_path.parent_path() : ".";
  std::error_code error;
  DirectoriesMade made(directory.string(), error);
  if (error) {
    THPC_FAIL("cannot write " << what << ": cannot create directory " << directory << ": "
                              << error.message());
  }
  const std::string temporary = temporary_path(path);
  // The caller's claim (taken before its work) while it still locks the file of that
  // name; else this write's own.
  std::optional<OutputClaim> own_claim;
  if (claim == nullptr || !claim->held()) claim = &own_claim.emplace(path, what);
  claim->handed_over_ = true;  // the temporary file is this write's to remove now
  // Removes the temporary file after a failure: "" when it is gone, else why it stays (a
  // directory made read-only meanwhile), for the user to remove it. Only while this write
  // holds it: a file it does not lock is another program's.
  const auto kept_temporary = [&temporary, claim]() -> std::string {
    std::error_code kept;
    if (!claim->held() || fs::remove(temporary, kept) || !kept) return "";
    return temporary + " could not be removed (" + kept.message() + "): remove it yourself";
  };
  try {
    write(temporary);
    show_still_working();  // (a checkpoint's close and fsync are long single calls)
    claim->restore_mode_made();
    fsync_path(temporary, what);
    keep_permissions_of(final_path.string(), temporary);
    show_still_working();
  } catch (const Error& failure) {
    const uintmax_t written = fs::file_size(temporary, error);
    const std::string advice =
        storage_advice(directory.string(), failure.what(), error ? 0 : written);
    const std::string kept = kept_temporary();  // a partial file helps nobody
    if (advice.empty() && kept.empty()) throw;
    if (advice.empty()) THPC_FAIL(failure.what() << " (" << kept << ")");
    THPC_FAIL(failure.what() << ": " << advice << " (nothing was written: "
                             << (kept.empty() ? temporary + " is removed" : kept) << ")");
  } catch (...) {
    if (claim->held()) fs::remove(temporary, error);
    throw;
  }
  fs::rename(temporary, final_path, error);
  if (error) {
    const std::string reason = error.message();
    // Whole, but nothing will take it (a checkpoint's, 757 MB).
    const std::string kept = kept_temporary();
    THPC_FAIL("cannot write " << what << ": rename of " << temporary << " to " << final_path
                              << ": " << reason << " ("
                              << (kept.empty() ? temporary + " is removed" : kept) << ")");
  }
  made.keep();
  // The lock now holds the output itself, and the name .F.tmp may be another program's
  // next claim: released (and no longer removed by an interrupt) before the directory's
  // sync.
  claim->release();
  // The rename itself is durable only once the directory entry is on disk.
  fsync_path(directory.string(), what);
}

}  // namespace thpc
