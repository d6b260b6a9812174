// A file appears whole or not at all: what every program that writes one promises
// (checkpoints, attention dumps, averages, text outputs; checkpoint/output_file.h says
// the rest of the promise).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <system_error>
#include <vector>

#include "common/error.h"

namespace thpc {

// Writes `path` all at once or not at all: `write` creates the whole file at the
// temporary path it is given (.NAME.tmp in the same directory, which is created if
// missing), which is then fsync'ed and renamed over `path`, and the directory fsync'ed so
// that the rename is durable. The temporary file is locked (flock) from before `write`
// until after the rename: another program writing `path` now is an OutputInUse (below).
// When anything fails the temporary file and the directories made for it are removed, and
// thpc::Error says "cannot write WHAT: ..." (WHAT names the file, e.g. "checkpoint PATH").
// A symbolic link `path` stays: the file it names is the one replaced (file_named_by).
class OutputClaim;
void write_atomically(const std::string& path, const std::string& what,
                      const std::function<void(const std::string& temporary)>& write,
                      OutputClaim* claim = nullptr);

// Another program writes the output now (its temporary file locked): the output named is
// in use, which a tool says as a refusal of its command line (exit 2, tools/tool_main.h),
// as an input directory or a run directory in use is.
class OutputInUse : public Error {
 public:
  using Error::Error;
};

class RemovedWhenInterrupted;

// The lock (flock) on `path`'s temporary file that write_atomically holds from before its
// write until after its rename. Two programs given one output shared the name .F.tmp: two
// transformer_decode --output F both wrote into one file, and the first to finish renamed
// the mixture over F and exited 0; a transformer_average whose HDF5 create of .F.tmp
// failed on the other's lock removed the other's file as its own leftover, and both
// failed. Now the second is refused (OutputInUse) while the first writes; one that starts
// after the rename writes a file of its own; a leftover temporary file (of a program
// killed) is locked by nobody, and is taken. A temporary file that is a symbolic link,
// no file (a FIFO, whose open waited for a reader) or one this program cannot open
// (another user's) is refused: taken for unclaimed, another user's was removed as this
// write's leftover. Where its directory is not made yet nothing is held (write_atomically
// makes it and claims again); where the file system does not honour flock (Lustre mounted
// without it, NFS with local_lock), the lock holds only on this host. Until it is
// released, after the rename (it would lock the output itself), an interrupt removes the
// file (RemovedWhenInterrupted). A program that writes an output
// only at the end of long work (transformer_decode's --dump-attention, after the
// translations) takes the claim before the work and hands it to write_atomically, so that
// an output in use is said at once; a temporary file it made and never handed over is
// removed with it. HDF5's own lock of the file it creates would collide with this one:
// every program turns it off first (hdf5::use_our_locks_not_hdf5s, io/hdf5.h).
class OutputClaim {
 public:
  OutputClaim(const std::string& path, const std::string& what);
  ~OutputClaim();
  OutputClaim(const OutputClaim&) = delete;
  OutputClaim& operator=(const OutputClaim&) = delete;
  // Whether it locks the file of the temporary name now (one removed or replaced since,
  // or never opened: not).
  bool held() const { return descriptor_ >= 0 && is_still_named(); }
  // Unlocks it: after the rename, the lock would hold the output itself.
  void release();
  // The file it made is given the mode the umask gave it (0444 under umask 0222): it
  // stays readable and writable by its owner while it is written. Called once the write
  // ends, before the rename.
  void restore_mode_made();

 private:
  friend void write_atomically(const std::string&, const std::string&,
                               const std::function<void(const std::string&)>&, OutputClaim*);
  bool is_still_named() const;  // the file locked is the one named temporary_

  std::string temporary_;
  int descriptor_ = -1;
  bool made_file_ = false;    // this claim created the temporary file
  mode_t mode_made_ = 0;      // its mode as made (umask applied)
  bool handed_over_ = false;  // given to write_atomically, which removes it when it fails
  std::unique_ptr<RemovedWhenInterrupted> interrupted_;
};

// When a rename of `written` will replace the file `replaced`, `written` takes its
// permissions: its mode's permission bits, its access ACL (whose mask the mode's group bits
// are: copied alone they widened a named user's entry to the whole group), and its group
// where this user may give it. A private 0600 output came back 0644, a group's 0664 one
// 0644 (a helper's trial). Called after the written file's last write and fsync (a
// write-only 0200 file could not be opened again to sync), before the rename; nothing
// when `replaced` is no file.
void keep_permissions_of(const std::string& replaced, const std::string& written);

// Whether `a` and `b` name the same file: the same inode when both exist (hard links,
// symbolic links, "./" and "../" spellings), else the same path once symbolic links,
// "." and ".." are resolved (an output that does not exist yet). What every check that a
// program never writes over its own inputs compares with (checkpoint/output_file.h).
bool same_file(const std::string& a, const std::string& b);

// The file a write of `path` replaces: `path`, or when it is a symbolic link the file
// at the end of its links (a relative target read from the link's folder). A link to a
// model or a text kept elsewhere stays a link, and the file it names is written.
std::string file_named_by(const std::string& path);

// Whether `path`, or a symbolic link on its way, is /dev/fd/N or /proc/*/fd/N: an open
// descriptor of this process (/dev/stdout), written through in place, never replaced by
// a rename (that replaced the link /dev/stdout itself, or left the shell's `>> file`
// pointing at a removed file). Any other path through /proc is a file.
bool names_an_open_descriptor(const std::string& path);
// The descriptor N of this process that `path` names (/dev/stdout, /dev/fd/N,
// /proc/self/fd/N, /proc/<this pid>/fd/N), when it names one: written through itself (a
// dup of it: the same open file and offset), not opened again. Opened again, a file the
// shell redirected with `>` was written at its own end while the shell's offset stayed,
// and the shell's next write (`(echo a; decode --output /dev/stdout; echo b) > f`) went
// over the translations (a helper's trial).
std::optional<int> own_descriptor_named(const std::string& path);

// The temporary name write_atomically writes `path` under first: .NAME.tmp beside the
// file `path` names (file_named_by).
std::string temporary_path(const std::string& path);

// The directories a write makes for its file: those of `directory` and its parents
// that this makes, removed again (deepest first, each only while empty) when this is
// destroyed before keep(). A write that fails leaves no empty folders behind
// (transformer_decode --output new/dir/out.txt stopped by a bad input line).
class DirectoriesMade {
 public:
  // Makes them, a level at a time; `error` says why one could not be made.
  DirectoriesMade(const std::string& directory, std::error_code& error);
  ~DirectoriesMade();
  DirectoriesMade(const DirectoriesMade&) = delete;
  DirectoriesMade& operator=(const DirectoriesMade&) = delete;
  // The write succeeded: its directories stay.
  void keep() { made_.clear(); }

 private:
  std::vector<std::string> made_;  // deepest first
};

// fsync of the file or directory `path`; thpc::Error "cannot write WHAT: ..." when it fails.
void fsync_path(const std::string& path, const std::string& what);

// A write past the file-size limit (ulimit -f, a batch system's) fails with EFBIG, as one
// on a full disk fails with ENOSPC, instead of SIGXFSZ killing the process (exit 153)
// with the temporary file left behind: every program calls this first, and its writers
// then report the failure as any other (one message naming the file, the temporary file
// removed). SIGXFSZ is ignored.
void fail_writes_past_the_file_size_limit();

// A temporary file removed if SIGINT, SIGTERM or SIGHUP ends the process while this
// lives (after remove_temporaries_when_interrupted()): Ctrl-C during preprocessing or
// averaging left its .partial and .tmp files beside the data. The handler unlinks the
// registered paths (unlink is async-signal-safe) and ends the process as the signal
// would have. Up to 64 at once; more are not registered (they are still removed on the
// normal paths).
class RemovedWhenInterrupted {
 public:
  explicit RemovedWhenInterrupted(const std::string& path);
  ~RemovedWhenInterrupted();
  RemovedWhenInterrupted(const RemovedWhenInterrupted&) = delete;
  RemovedWhenInterrupted& operator=(const RemovedWhenInterrupted&) = delete;

 private:
  int slot_ = -1;
};

// Unlinks the temporary files registered now (RemovedWhenInterrupted), async-signal-safe:
// for a handler that ends the process otherwise (the trainer's second Ctrl-C, which left
// a checkpoint's .NAME.tmp, as large as the checkpoint, for the next start to remove).
// Returns how many it unlinked.
int remove_registered_temporaries();

// While one lives, SIGINT, SIGTERM and SIGHUP (as remove_temporaries_when_interrupted
// handles them) wait for the end of a section that must not stop halfway: a corpus put
// in place of another, its shards renamed over the earlier ones and those left over
// removed (a Ctrl-C between them left neither corpus; a helper's finding). Such a section
// is renames and unlinks, milliseconds. The signals are blocked in the section's thread
// (and deferred by the handler in any other), and one that came meanwhile ends the process
// as it would have (temporaries removed, its default action) when the section ends; one
// that ends in an exception keeps them blocked, so that its error is said (exit 1).
// One section at a time (the mask it restores is kept in one place).
class InterruptionsHeld {
 public:
  InterruptionsHeld();
  ~InterruptionsHeld();
  InterruptionsHeld(const InterruptionsHeld&) = delete;
  InterruptionsHeld& operator=(const InterruptionsHeld&) = delete;
  // The signal that came while held (0: none), for the caller to say what it finished.
  static int signal_received();
};

// A line the handler writes to standard error when a signal removed a temporary file
// (at most 1 KiB, ending in a newline; the last call's; "" says none): what was lost and
// how not to lose it next time, e.g.
// transformer_decode's --output, which appears only whole at the end (a helper's finding:
// a Ctrl-C ended a long decode without a word, its translations gone).
void say_when_interrupted(const std::string& line);

// Installs that handler for SIGINT, SIGTERM and SIGHUP, except where a signal is ignored
// (a background job, nohup): the tools call it first (tools/tool_main.h). The trainer
// does not: it stops at those signals with a checkpoint (train/stop_request.h).
void remove_temporaries_when_interrupted();

// Flushes standard output (std::cout and C's stdout) and says why what was written there
// did not all reach it, "" when it did: a full disk or a file-size limit under
// `> scores.txt` cut the text short while the program exited 0 (a truncated score taken
// for a success). Every program checks it before it exits 0. A pipe whose reader left
// (`| head -1`) is not said: the reader had what it wanted.
std::string standard_output_failure();

// Standard input, output and error that the program was started without (`<&-`, `>&-`,
// `2>&-`) opened on /dev/null, /dev/full and /dev/null: the first files the program
// opened took their numbers, and what it printed went into them (a summary line into a
// shard being written), or a closed output was misnamed as a full disk. Every program
// calls it first; a closed standard output then fails its first write, said as closed.
void guard_standard_streams();
bool standard_input_was_closed();
bool standard_output_was_closed();

// Why a temporary or scratch file cannot be made at `path`: "is a symbolic link, whose
// target would be written: remove it", "is not a file (a directory, a pipe?): remove it";
// "" when nothing or a file is there. OutputClaim and transformer_preprocess's files refuse
// what it names.
std::string why_no_file_can_be_made_at(const std::string& path);
// Why this user may not write the existing file `path`, with what to do, else "": "is
// write-protected (mode 0444): make it writable (chmod u+w PATH) or remove it to have it
// replaced", or for another user's file "is ann's (mode 0644), not writable by this user:
// remove it, where its directory lets you, to have it replaced". A write replaces its
// output by a rename, which only the directory's permissions allow or refuse: a file
// protected with chmod a-w (a corpus, an average, a translation kept) was replaced without
// a word, where `cp` and the shell's `>` refuse it (a helper's trial). Every check of an
// output asks this first.
std::string why_write_protected(const std::string& path);

// Why standard input cannot be read as a text ("closed", "not open for reading", "a
// directory, not a text"), or "" when it can: each read as an empty input, exit 0.
std::string standard_input_unreadable();

// What stopped a write into `directory` that failed with `failure` (its message: HDF5's
// failures say "(errno N)", io/hdf5.h) after `bytes_written` bytes of its file, when the
// storage did: the file-size limit (EFBIG, or a file at the limit), a full file system or
// quota (ENOSPC, EDQUOT, or less than 16 MiB left), or an I/O error (EIO); in the user's
// words with what to do. "" when none of these explains it.
std::string storage_advice(const std::string& directory, const std::string& failure,
                           uintmax_t bytes_written);

}  // namespace thpc
