#include "checkpoint/output_file.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>
#include <ostream>
#include <streambuf>
#include <thread>

#include "checkpoint/checkpoint.h"
#include "common/error.h"
#include "io/atomic_file.h"
#include "io/run_file_names.h"
#include "io/hdf5.h"

namespace thpc {
namespace {

namespace fs = std::filesystem;

// The first `count` bytes of `path` (fewer for a shorter file).
std::string head_of(const std::string& path, size_t count) {
  std::ifstream in(path, std::ios::binary);
  std::string head(count, '\0');
  in.read(head.data(), static_cast<std::streamsize>(count));
  head.resize(static_cast<size_t>(in.gcount()));
  return head;
}

// An attention dump of transformer_decode (decode/attention_dump.h): an HDF5 file whose
// root has the attributes layers, heads and checkpoint. A checkpoint (its header first)
// or a shard is none.
bool is_attention_dump(const std::string& path) {
  if (read_checkpoint_summary(path) || !hdf5::is_hdf5(path)) return false;
  const hdf5::Handle file = hdf5::open_read_only(path);
  bool is_dump = file.valid();
  for (const char* attribute : {"layers", "heads", "checkpoint"}) {
    is_dump = is_dump && H5Aexists(file.get(), attribute) > 0;
  }
  H5Eclear2(H5E_DEFAULT);
  return is_dump;
}

// Whether `directory` holds a training run's checkpoints (step_*.h5).
bool holds_training_checkpoints(const fs::path& directory) {
  std::error_code error;
  for (const fs::directory_entry& entry :
       fs::directory_iterator(directory.empty() ? fs::path(".") : directory, error)) {
    if (is_step_checkpoint_name(entry.path().string())) return true;
  }
  return false;
}

// The file a standard stream is, when it is a regular file (`< in.txt`, `>> out.txt`):
// its st_dev and st_ino. A terminal, a pipe or a device (/dev/null) is nobody's input.
std::optional<std::pair<dev_t, ino_t>> stream_file(int descriptor) {
  struct stat status {};
  if (fstat(descriptor, &status) != 0 || !S_ISREG(status.st_mode)) return std::nullopt;
  return std::make_pair(status.st_dev, status.st_ino);
}

// Whether `path` ("-": the standard stream `descriptor`) is the file `stream` is.
bool is_stream_file(const std::string& path, int descriptor,
                    const std::optional<std::pair<dev_t, ino_t>>& stream) {
  if (!stream) return false;
  if (path == "-") return stream_file(descriptor) == stream;
  struct stat status {};
  return stat(path.c_str(), &status) == 0 && std::make_pair(status.st_dev, status.st_ino) == *stream;
}

// Why `output` could not be written at all, found before any work ("" when it can): the
// nearest existing directory on its path (write_atomically creates the missing ones) must
// be a directory this process may create files in. Otherwise the work is done first and
// lost at the end, or one output of several is written and the next one fails.
std::string why_not_writable(const std::string& output) {
  if (fs::path(output).filename().empty()) {
    return "names a directory (it ends with /); give a file name";
  }
  std::error_code error;
  fs::path directory = fs::absolute(output, error).parent_path();
  while (!directory.empty() && !fs::exists(directory, error) &&
         directory != directory.parent_path()) {
    directory = directory.parent_path();
  }
  if (!fs::is_directory(directory, error)) {
    return "cannot be created: " + directory.string() + " is not a directory";
  }
  if (access(directory.c_str(), W_OK | X_OK) != 0) {
    const std::string reason = std::strerror(errno);  // before anything else can set errno
    return "cannot be created: this user cannot write in " + directory.string() + " (" +
           reason + "); give a path in a writable directory";
  }
  return "";
}

}  // namespace

std::string training_run_file(const std::string& path) {
  const std::string name = fs::path(path).filename().string();
  if (name == "best.h5") {
    return "named like the best-validation checkpoint best.h5 (checkpoint.keep_best)";
  }
  if (is_best_checkpoint_name(name)) {
    return "named like a kept best checkpoint (best_step_*.h5, checkpoint.keep_best_count, "
           "which averaging the best acts on)";
  }
  const bool average = name.rfind("average_last", 0) == 0 || name.rfind("average_best", 0) == 0;
  if (is_run_checkpoint_file(name) && !average) {
    return "named like a training checkpoint (step_*.h5, which resume=auto, pruning and "
           "averaging act on)";
  }
  // A run's final average beside its checkpoints (checkpoint.average_last, average_best);
  // the name elsewhere is anyone's (tools/evaluate.sh writes DIR/eval/average_lastN.h5).
  if (average && is_run_checkpoint_file(name) && holds_training_checkpoints(fs::path(path).parent_path())) {
    return "the final average of the training run whose checkpoints are beside it "
           "(checkpoint.average_last, average_best)";
  }
  if (name == kMetricsFileName) return "named like a training run's metrics file";
  // A lock replaced by a rename is no longer the file its holder locked: a running trainer
  // took that for another holder and stopped without its last checkpoint (a helper's
  // trial, transformer_decode --output ck/trainer.lock).
  if (name == kTrainerLockName) {
    return "named like a training run's lock (trainer.lock, which the running trainer holds)";
  }
  if (name == kPreprocessLockName) {
    return "named like transformer_preprocess's lock of its --destdir";
  }
  if (name.rfind(kEventFilePrefix, 0) == 0) {
    return "named like a training run's TensorBoard event file";
  }
  // The header says what a checkpoint holds without reading it; one without the contents
  // line (written before it existed) is taken for a training state. Only a file is read:
  // a pipe (/dev/stdout into `| cat`) would hold the read until the program's own output.
  std::error_code error;
  if (!fs::is_regular_file(path, error)) return "";
  if (const std::optional<CheckpointSummary> summary = read_checkpoint_summary(path)) {
    if (!summary->parameters_only) {
      return "a checkpoint holding a training state (step " + std::to_string(summary->step) +
             ", Adam moments included)";
    }
  }
  return "";
}

std::string input_standard_output_is(const std::vector<std::string>& inputs) {
  const std::optional<std::pair<dev_t, ino_t>> standard_output = stream_file(STDOUT_FILENO);
  for (const std::string& input : inputs) {
    if (!input.empty() && is_stream_file(input, STDIN_FILENO, standard_output)) {
      return input == "-" ? "standard input (-)" : input;
    }
  }
  return "";
}

void check_output_path(const std::string& option, const std::string& output,
                       const std::vector<std::string>& inputs, OutputKind kind,
                       const std::vector<std::string>& other_outputs) {
  const auto refuse = [&](const std::string& why) {
    THPC_FAIL(option << " " << output << ": " << why);
  };
  // The standard streams are files too: `--output x.en < x.en` replaced the source it
  // read, and `>> x.en` with `--input x.en` writes into it (as cat refuses "input file is
  // output file").
  const std::optional<std::pair<dev_t, ino_t>> standard_input = stream_file(STDIN_FILENO);
  if (output == "-") {
    // A whole HDF5 file is written under a temporary name and renamed: "-" was a file of
    // that name in the working directory, with exit 0 (transformer_average --output -).
    if (kind != OutputKind::Text) {
      refuse("is an HDF5 file, written whole and renamed into place, not a stream: give a "
             "file name");
    }
    if (const std::string input = input_standard_output_is(inputs); !input.empty()) {
      refuse("standard output is the file of the input " + input +
             ": writing it would destroy it; redirect the output to another file");
    }
    // Said before the work, not after it (its result lost at the end).
    if (standard_output_was_closed()) {
      refuse("standard output is closed (>&-): what would be written there is lost; give "
             "it a file (> FILE), or give " + option + " a file name");
    }
    return;
  }
  if (output.empty()) return;  // no such output
  for (const std::string& input : inputs) {
    if (input == "-" && is_stream_file(output, STDOUT_FILENO, standard_input)) {
      refuse("is the file given as standard input: writing it would destroy it; give "
             "another output file");
    }
  }
  std::error_code error;
  if (fs::is_directory(output, error)) refuse("is a directory; give a file name");
  // The file the write replaces, which the checks below are of: a symbolic link's target
  // (write_atomically writes there; checked here, a link named the run's best_step_*.h5
  // in a harmless name), or the descriptor itself (/dev/stdout, written through).
  const bool descriptor = names_an_open_descriptor(output);
  // (/dev/stdout after >&- is the /dev/full guard_standard_streams put there: its failure
  // was said as "the write failed (disk full?)", after the work.)
  if (descriptor && own_descriptor_named(output) == STDOUT_FILENO &&
      standard_output_was_closed()) {
    refuse("is standard output, which is closed (>&-): what would be written there is lost; "
           "give it a file (> FILE), or give " + option + " a file name");
  }
  if (descriptor && kind != OutputKind::Text) {
    refuse("is an open descriptor of this process (a stream), not a file: this output is a "
           "whole HDF5 file; give a file name");
  }
  std::string target = output;
  if (!descriptor) {
    try {
      target = file_named_by(output);
    } catch (const Error&) {
      refuse("is a loop of symbolic links; give a file name");
    }
  }
  for (const std::string& input : inputs) {
    if (input.empty() || input == "-") continue;
    if (same_file(output, input)) {
      refuse("is the input " + input + " (the same file): writing it would destroy it; give "
             "another output file");
    }
    if (same_file(temporary_path(output), input)) {
      refuse("its temporary file " + temporary_path(output) + " is the input " + input +
             "; give another output file");
    }
  }
  for (const std::string& other : other_outputs) {
    if (!other.empty() && other != "-" && same_file(output, other)) {
      refuse("is also the path of another output (" + other + "); give each its own file");
    }
    if (!other.empty() && other != "-" && same_file(output, temporary_path(other))) {
      refuse("is the temporary file of another output (" + other + "), written under that "
             "name first; give another file");
    }
  }
  const std::string run_file = training_run_file(target);
  if (!run_file.empty()) {
    refuse((target == output ? "is " : "names " + target + ", ") + run_file +
           ": no tool writes over a training run's files; give another output file");
  }
  if (!descriptor) {
    if (const std::string why = why_not_writable(target); !why.empty()) refuse(why);
    if (const std::string why = why_write_protected(target); !why.empty()) {
      refuse(why + "; or give another output file");
    }
  }
  // A device or a pipe takes a text output as it comes (write_text_atomically writes
  // into it); a whole HDF5 file would be renamed over it, and the device be gone
  // (transformer_average --output /dev/null, as root, replaced the system's /dev/null).
  if (kind != OutputKind::Text && fs::exists(target, error) &&
      !fs::is_regular_file(target, error)) {
    refuse(std::string("is ") +
           (fs::is_fifo(target, error) ? "a pipe (FIFO)" : "a device or other special file") +
           ", not a file: this output is a whole HDF5 file, written under a temporary name "
           "and renamed over it; give a file name");
  }
  if (!fs::exists(target, error) || !fs::is_regular_file(target, error) ||
      fs::file_size(target, error) == 0) {
    return;  // nothing there to lose (or a device or pipe, for a text)
  }
  switch (kind) {
    case OutputKind::Text: {
      const std::string head = head_of(target, 4096);
      if (head.find('\0') != std::string::npos) {
        refuse("exists and is a binary file (a model, a checkpoint, shards?); a text output "
               "replaces only a text file: give another output file");
      }
      break;
    }
    case OutputKind::Checkpoint: {
      const std::optional<CheckpointSummary> summary = read_checkpoint_summary(target);
      if (!summary || !summary->parameters_only) {
        // transformer_average's and transformer_quantize's outputs alike.
        refuse("exists and is not a parameters-only checkpoint (an earlier average or "
               "quantized model), the one kind of file this output replaces: give another "
               "output file");
      }
      break;
    }
    case OutputKind::AttentionDump:
      if (!is_attention_dump(target)) {
        refuse("exists and is not an earlier attention dump, the one kind of file a dump "
               "replaces: give another output file");
      }
      break;
  }
}

std::string checkpoint_output_replaces(const std::string& path) {
  std::error_code error;
  if (!fs::is_regular_file(path, error) || fs::file_size(path, error) == 0) return "";
  const std::optional<CheckpointSummary> summary = read_checkpoint_summary(path);
  return "the earlier parameters-only checkpoint" +
         (summary ? " of step " + std::to_string(summary->step) : std::string()) +
         " there, an average or a quantized model";
}

namespace {

// Whether `path` is written in place, not through a temporary file and a rename: an open
// descriptor of this process (/dev/stdout: renamed over, the link itself was replaced, or
// the shell's `>> file` left on a removed file), a device or a pipe.
bool written_in_place(const std::string& path) {
  std::error_code error;
  return names_an_open_descriptor(path) ||
         (fs::exists(path, error) && !fs::is_regular_file(path, error));
}

// Opens `target` (truncated, or appended to) and lets `write` fill it; "cannot write WHAT:
// ..." with the system's reason when it cannot.
void write_file(const std::string& target, const std::string& what, std::ios::openmode mode,
                const std::function<void(std::ostream&)>& write) {
  errno = 0;
  std::ofstream file(target, std::ios::binary | mode);
  if (!file) {
    const int error = errno;
    THPC_FAIL("cannot write " << what << ": cannot open " << target
                              << (error != 0 ? std::string(": ") + std::strerror(error) +
                                                   " (errno " + std::to_string(error) + ")"
                                             : std::string()));
  }
  write(file);
  file.close();
  if (!file) THPC_FAIL("cannot write " << what << ": the write failed (disk full?)");
}

// A stream writing through a descriptor of this process: a dup of it, the same open file
// and offset as the shell's `> file` (or a pipe) that it names.
class DescriptorBuffer final : public std::streambuf {
 public:
  explicit DescriptorBuffer(int descriptor) : descriptor_(::dup(descriptor)) {
    setp(buffer_, buffer_ + sizeof buffer_);
  }
  ~DescriptorBuffer() override {
    if (error_ == 0) sync();  // (after a failure, not again: bytes written twice)
    if (descriptor_ >= 0) ::close(descriptor_);
  }
  bool opened() const { return descriptor_ >= 0; }
  // The failed write's errno, 0 while none failed (the stream keeps no record of it, and
  // flushing a bad stream does nothing: "disk full?" was said of a closed descriptor).
  int error() const { return error_; }

 protected:
  int_type overflow(int_type next) override {
    if (sync() != 0) return traits_type::eof();
    if (!traits_type::eq_int_type(next, traits_type::eof())) {
      *pptr() = traits_type::to_char_type(next);
      pbump(1);
    }
    return traits_type::not_eof(next);
  }
  int sync() override {
    if (error_ != 0) return -1;
    const char* next = pbase();
    while (next < pptr()) {
      const ssize_t written = ::write(descriptor_, next, static_cast<size_t>(pptr() - next));
      if (written < 0 && errno == EINTR) continue;
      if (written <= 0) {
        error_ = written < 0 ? errno : EIO;
        return -1;
      }
      next += written;
    }
    setp(buffer_, buffer_ + sizeof buffer_);
    return 0;
  }

 private:
  int descriptor_;
  int error_ = 0;
  char buffer_[1 << 16];
};

// In place: one of this process's descriptors written through itself (whoever opened it
// chose to truncate it, `>`, or not, `>>`; opened again, `(echo a; ...; echo b) > f` had
// the shell's `b` written over the output), another process's appended to, a device or a
// pipe truncated.
void write_in_place(const std::string& path, const std::string& what,
                    const std::function<void(std::ostream&)>& write) {
  if (const std::optional<int> descriptor = own_descriptor_named(path)) {
    std::cout.flush();  // what this process wrote there before goes first
    DescriptorBuffer buffer(*descriptor);
    if (!buffer.opened()) {
      THPC_FAIL("cannot write " << what << ": " << path << " names descriptor " << *descriptor
                                << ", which this process has not open (" << std::strerror(errno)
                                << ")");
    }
    std::ostream out(&buffer);
    write(out);
    out.flush();
    if (!out) {
      THPC_FAIL("cannot write " << what << ": the write failed ("
                                << (buffer.error() != 0 ? std::strerror(buffer.error())
                                                        : "disk full?")
                                << ")");
    }
    return;
  }
  write_file(path, what, names_an_open_descriptor(path) ? std::ios::app : std::ios::trunc,
             write);
}


}  // namespace

void write_text_atomically(const std::string& path, const std::string& what,
                           const std::function<void(std::ostream&)>& write) {
  if (written_in_place(path)) {
    write_in_place(path, what, write);
    return;
  }
  write_atomically(path, what, [&](const std::string& temporary) {
    write_file(temporary, what, std::ios::trunc, write);
  });
}

void write_texts_atomically(const std::vector<std::pair<std::string, std::string>>& files) {
  std::vector<std::string> written;
  std::error_code error;
  const auto text_of = [](const std::string& text) {
    return [&text](std::ostream& out) { out << text; };
  };
  // Asked once a file (each question looks at the file system): written in place, or the
  // file replaced (a link stays; the file it names is written).
  std::vector<bool> in_place;
  std::vector<std::string> targets;
  for (const auto& [given, text] : files) {
    in_place.push_back(written_in_place(given));
    targets.push_back(in_place.back() ? given : file_named_by(given));
  }
  // Removed by a Ctrl-C of the tool too (write_atomically's are): until the renames. Each
  // temporary file claimed (OutputClaim), as write_atomically's: two linearize runs of
  // one prefix renamed each other's files away, or left a mixed set.
  // (claims[k] and written[k] are the k-th file not written in place's; a claim removes
  // its file at an interrupt until it is released.)
  std::vector<std::unique_ptr<DirectoriesMade>> directories;
  std::vector<std::unique_ptr<OutputClaim>> claims;
  // Only those this write holds: one that is no longer (replaced) is another program's.
  const auto remove_written = [&] {
    for (size_t k = 0; k < written.size(); ++k) {
      if (claims[k]->held()) fs::remove(written[k], error);
    }
  };
  try {
    for (size_t i = 0; i < files.size(); ++i) {
      if (in_place[i]) continue;  // after the others, below
      const std::string& path = targets[i];
      const std::string temporary = temporary_path(path);
      if (fs::path(path).has_parent_path()) {
        const std::string directory = fs::path(path).parent_path().string();
        directories.push_back(std::make_unique<DirectoriesMade>(directory, error));
        if (error) {
          THPC_FAIL("cannot write " << path << ": cannot create directory " << directory
                                    << ": " << error.message());
        }
      }
      claims.push_back(std::make_unique<OutputClaim>(path, "output file " + path));
      written.push_back(temporary);
      write_file(temporary, path, std::ios::trunc, text_of(files[i].second));
      claims.back()->restore_mode_made();
      fsync_path(temporary, path);
      keep_permissions_of(path, temporary);
    }
  } catch (const OutputInUse&) {
    remove_written();
    throw;
  } catch (const Error& failure) {
    // What stopped it, said as write_atomically says it (transformer_trees under a
    // `ulimit -f` guessed "disk full?").
    const fs::path failed(written.empty() ? "." : written.back());
    std::error_code unknown;
    const uintmax_t bytes = written.empty() ? 0 : fs::file_size(failed, unknown);
    const std::string advice =
        storage_advice(failed.has_parent_path() ? failed.parent_path().string() : ".",
                       failure.what(), unknown ? 0 : bytes);
    remove_written();
    if (advice.empty()) throw;
    THPC_FAIL(failure.what() << ": " << advice
                             << " (nothing was written: the temporary files are removed)");
  } catch (...) {
    remove_written();
    throw;
  }
  // Every file is complete on disk before the first rename: a failure up to here left
  // every old file as it was. The renames are one section that an interrupt waits for:
  // a Ctrl-C between two of them left transformer_trees linearize's new .words beside
  // the old .tree, .tags and .gold.
  // (THPC_TEST_RENAME_DELAY_MS=N: "test hook: renaming into place" on standard error and
  // N ms before each rename, as transformer_preprocess's: the tests' way into the section.)
  {
    const InterruptionsHeld held;
    const char* delay = std::getenv("THPC_TEST_RENAME_DELAY_MS");
    if (delay != nullptr) std::cerr << "test hook: renaming into place" << std::endl;
    for (size_t i = 0, k = 0; i < files.size(); ++i) {
      if (in_place[i]) continue;
      const std::string& path = targets[i];
      if (delay != nullptr) {
        std::this_thread::sleep_for(std::chrono::milliseconds(std::strtol(delay, nullptr, 10)));
      }
      fs::rename(temporary_path(path), path, error);
      if (!error) {
        // Its name may be another program's next temporary file now: no longer ours to
        // remove at an interrupt (one that came meanwhile acts when the section ends).
        claims[k]->release();
        ++k;
      }
      if (error) {
        const std::string reason = error.message();
        // This one's and those not renamed yet: nothing will take them. Said whether they went.
        std::string kept;
        for (size_t j = i; j < files.size(); ++j) {
          if (in_place[j]) continue;
          const std::string temporary = temporary_path(targets[j]);
          std::error_code not_removed;
          if (!fs::remove(temporary, not_removed) && not_removed && kept.empty()) {
            kept = temporary + " could not be removed (" + not_removed.message() +
                   "): remove it yourself";
          }
        }
        THPC_FAIL("cannot write " << path << ": rename of " << temporary_path(path) << ": "
                                  << reason << " ("
                                  << (kept.empty() ? "the temporary files are removed" : kept)
                                  << ")");
      }
      const fs::path directory = fs::path(path).parent_path();
      fsync_path(directory.empty() ? "." : directory.string(), path);
    }
  }
  for (const auto& made : directories) made->keep();
  for (size_t i = 0; i < files.size(); ++i) {
    if (in_place[i]) write_in_place(targets[i], targets[i], text_of(files[i].second));
  }
}

}  // namespace thpc
