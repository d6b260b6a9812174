// No program writes over one of its inputs or over a training run's files, however the
// path is spelt (./, ../, a symbolic link, a hard link), and each writes through a
// temporary name and a rename: transformer_decode --output and --dump-attention,
// transformer_average, transformer_preprocess, transformer_trees. A refusal is a
// command-line mistake: exit 2, one line naming the option, the path and why, and every
// file as it was. And when the storage stops a write (the file-size limit, a full disk),
// each says so in one message with what to do, and leaves no partial file and no crash.
#include <gtest/gtest.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "io/atomic_file.h"
#include "program.h"
#include "scratch_directory.h"

namespace thpc {
namespace {

namespace fs = std::filesystem;

const std::string kBin = thpc::binary_dir();

class ToolOutputs : public ScratchDirectoryTest {
 protected:
  void SetUp() override {
    ScratchDirectoryTest::SetUp();
    ::chdir(directory_.c_str());  // the tests spell paths relative to it
  }
  void TearDown() override {
    ::chdir(THPC_SOURCE_DIR);
    ScratchDirectoryTest::TearDown();
  }

  // A corpus of numbers, its shards (data/) and a 2-step checkpoint of them (run/ck/),
  // copied to model.h5; the validation sources as source.en.
  void train_a_model() {
    const ProcessResult made = run_process(
        "python3 " THPC_SOURCE_DIR "/tools/make_numbers_corpus.py --train 200 --valid 8 "
        "--test 2 --seed 1 --out text > /dev/null && " + kBin +
        "/transformer_preprocess --source-lang en --target-lang de --trainpref text/train "
        "--validpref text/valid --destdir data --vocab-size 100 --model-type bpe --seed 1 && " +
        kBin + "/transformer_hpc " THPC_SOURCE_DIR "/input/tiny.ini --model.layers=1 "
        "--data.dir=data --train.max_steps=2 --checkpoint.dir=run/ck");
    ASSERT_EQ(made.exit_code, 0) << made.output;
    fs::copy_file("run/ck/step_00000002.h5", "model.h5");
    fs::copy_file("text/valid.en", "source.en");
  }

  // The prefix that runs a program as a user who is not root, in *prefix: "" when this is
  // none, else setpriv's to run as nobody, the scratch directory opened to all (root may
  // write any file, and a check of permissions needs another user). False when as root
  // without /usr/bin/setpriv (util-linux): the test skips with kNoOtherUser.
  bool as_another_user(std::string* prefix) {
    prefix->clear();
    if (::geteuid() != 0) return true;
    if (::access("/usr/bin/setpriv", X_OK) != 0) return false;
    *prefix = "/usr/bin/setpriv --reuid=65534 --regid=65534 --clear-groups ";
    fs::permissions(directory_, fs::perms::all);
    return true;
  }
  static constexpr const char* kNoOtherUser =
      "run as root without /usr/bin/setpriv (util-linux) to run as nobody";

  // Every file under the directory with its bytes: what a refusal must leave as it was.
  static std::map<std::string, std::string> everything() {
    std::map<std::string, std::string> files;
    for (const fs::directory_entry& entry : fs::recursive_directory_iterator(".")) {
      if (entry.is_regular_file()) files[entry.path().string()] = read_file(entry.path());
    }
    return files;
  }

  // Runs `command` (a program of the build and its arguments), which must be refused:
  // exit 2, one line with `why` (the only error line), nothing changed.
  void expect_refused(const std::string& command, const std::string& why) {
    SCOPED_TRACE(command);
    const std::map<std::string, std::string> before = everything();
    const ProcessResult run = run_process(kBin + "/" + command);
    EXPECT_EQ(run.exit_code, 2) << run.output;
    EXPECT_NE(run.output.find(why), std::string::npos) << run.output;
    // The tools print that line alone; the trainer its start-up lines before it.
    std::vector<std::string> errors = lines_of(run.output);
    if (command.rfind("transformer_hpc", 0) == 0) {
      errors.erase(std::remove_if(errors.begin(), errors.end(),
                                  [](const std::string& line) {
                                    return line.find("error") == std::string::npos;
                                  }),
                   errors.end());
    }
    EXPECT_EQ(errors.size(), 1u) << run.output;
    EXPECT_EQ(changed_since(before), std::vector<std::string>{});
  }

  // Runs `arguments` (a program of the build and its arguments) with each rename of its
  // outputs into place 300 ms late (THPC_TEST_RENAME_DELAY_MS), sends it SIGTERM once it
  // says it is renaming (a line to wait for, not a time: the section has more to do when
  // the signal comes), and returns what it printed; `status` its wait status ("" and -1
  // when it never said so).
  static std::string interrupted_while_renaming(const std::vector<std::string>& arguments,
                                                int* status) {
    std::vector<std::string> command = {"/usr/bin/env", "THPC_TEST_RENAME_DELAY_MS=300",
                                        kBin + "/" + arguments.front()};
    command.insert(command.end(), arguments.begin() + 1, arguments.end());
    FILE* output = nullptr;
    const pid_t pid = start_process(command, &output);
    *status = -1;
    if (pid <= 0) return "";
    std::string said;
    char line[4096];
    while (said.find("test hook: renaming into place") == std::string::npos &&
           std::fgets(line, sizeof line, output) != nullptr) {
      said += line;
    }
    if (said.find("test hook: renaming into place") != std::string::npos) ::kill(pid, SIGTERM);
    return said + finish_process(pid, output, status);
  }

  // The files created, removed or changed since `before` (names only: a failure would
  // otherwise print every byte of a checkpoint).
  static std::vector<std::string> changed_since(const std::map<std::string, std::string>& before) {
    const std::map<std::string, std::string> now = everything();
    std::vector<std::string> changed;
    for (const auto& [path, bytes] : now) {
      const auto old = before.find(path);
      if (old == before.end() || old->second != bytes) changed.push_back(path);
    }
    for (const auto& [path, bytes] : before) {
      if (now.count(path) == 0) changed.push_back(path + " (removed)");
    }
    return changed;
  }
};

// same_file, which every never-write-over-an-input check compares with: one path that
// exists and one spelt through a directory not made yet and ".." name the same file
// (before: "not the same" whenever one did not exist, and a trainer given
// train.metrics_dir = CK/sub/.. took CK's lock, then a second one, and refused itself).
TEST_F(ToolOutputs, APathSpeltThroughADirectoryNotMadeYetIsTheSameFile) {
  fs::create_directories(directory_ / "ck");
  EXPECT_TRUE(same_file((directory_ / "ck").string(), (directory_ / "ck/sub/..").string()));
  EXPECT_TRUE(same_file((directory_ / "ck/sub/..").string(), (directory_ / "ck").string()));
  EXPECT_TRUE(same_file((directory_ / "ck/a.h5").string(), (directory_ / "ck/new/../a.h5").string()));
  EXPECT_FALSE(same_file((directory_ / "ck").string(), (directory_ / "ck/sub").string()));
  EXPECT_FALSE(same_file((directory_ / "ck").string(), (directory_ / "other").string()));
  // Below a file, a path names nothing, whatever its letters resolve to.
  std::ofstream(directory_ / "ck/file") << "not a directory\n";
  EXPECT_FALSE(same_file((directory_ / "ck").string(), (directory_ / "ck/file/..").string()));
  EXPECT_FALSE(same_file((directory_ / "ck/file/x/..").string(), (directory_ / "ck/file").string()));
  const ProcessResult run = run_process(
      thpc::binary_dir() + "/transformer_hpc " THPC_SOURCE_DIR "/input/tiny.ini "
      "--train.max_steps=1 --train.valid_every=0 --checkpoint.dir=" + (directory_ / "run").string() +
      " --train.metrics_dir=" + (directory_ / "run/sub/..").string());
  EXPECT_EQ(run.exit_code, 0) << run.output;
  EXPECT_TRUE(fs::exists(directory_ / "run/metrics.jsonl")) << run.output;
}

TEST_F(ToolOutputs, DecodeNeverWritesOverItsInputsHoweverTheyAreSpelt) {
  train_a_model();
  fs::create_symlink("model.h5", "link.h5");
  fs::create_hard_link("source.en", "hard.en");
  const std::string decode = "transformer_decode --greedy --checkpoint model.h5 --input source.en ";
  const std::vector<std::string> spellings = {
      "model.h5", "./model.h5", "../" + directory_.filename().string() + "/model.h5",
      directory_.string() + "/model.h5", "link.h5"};
  for (const std::string& spelling : spellings) {
    expect_refused(decode + "--output " + spelling, "is the input model.h5 (the same file)");
    expect_refused(decode + "--dump-lines 1 --dump-attention " + spelling,
                   "is the input model.h5 (the same file)");
  }
  expect_refused(decode + "--output hard.en", "is the input source.en (the same file)");
  expect_refused(decode + "--output ./source.en", "is the input source.en");
  expect_refused(decode + "--output out.txt --dump-lines 1 --dump-attention ./out.txt",
                 "is also the path of another output");
  // The SentencePiece model given on the command line is an input too.
  expect_refused(decode + "--spm-model data/spm.model --output data/../data/spm.model",
                 "is the input data/spm.model");
  // The temporary file of the write must not be an input either.
  fs::copy_file("source.en", ".out.txt.tmp");
  expect_refused("transformer_decode --greedy --checkpoint model.h5 --input .out.txt.tmp "
                 "--output out.txt",
                 "its temporary file .out.txt.tmp is the input .out.txt.tmp");
  // What it may write: a new file, then the same file again (a text over a text), through
  // a temporary file that does not stay behind.
  for (int i = 0; i < 2; ++i) {
    const ProcessResult ok = run_process(kBin + "/" + decode + "--output out.txt");
    ASSERT_EQ(ok.exit_code, 0) << ok.output;
    EXPECT_EQ(lines_of(read_file("out.txt")).size(), 8u);
    EXPECT_FALSE(fs::exists(".out.txt.tmp.tmp"));
  }
  EXPECT_EQ(read_file("model.h5"), read_file("run/ck/step_00000002.h5"));
}

// The standard streams are files too (issue 34's second probe: `--output x.en < x.en`
// replaced the source it had read, exit 0), and an output that cannot be written is
// refused before any work: found at the end, it cost the whole translation, and with two
// outputs left the first one written beside an error.
TEST_F(ToolOutputs, NoToolWritesOverAStandardStreamsFileOrWhereItCannotWrite) {
  train_a_model();
  fs::create_hard_link("source.en", "hard.en");
  std::ofstream("words.txt") << "a b\n";
  std::ofstream("tags.txt") << "X Y\n";
  std::ofstream("seq.txt") << "(S XX XX )\n";
  const std::string decode = "transformer_decode --greedy --checkpoint model.h5 ";
  expect_refused(decode + "--output source.en < source.en",
                 "--output source.en: is the file given as standard input");
  expect_refused(decode + "--output ./hard.en < source.en", "is the file given as standard input");
  expect_refused("transformer_trees delinearize --words words.txt --tags tags.txt "
                 "--output seq.txt < seq.txt",
                 "--output seq.txt: is the file given as standard input");
  // Standard output appended to the input: the shell opens it before the program runs.
  const std::map<std::string, std::string> before = everything();
  const ProcessResult appended = run_process("sh -c '" + kBin + "/" + decode +
                                             "--input source.en >> source.en'");
  EXPECT_EQ(appended.exit_code, 2) << appended.output;
  EXPECT_NE(appended.output.find("standard output is the file of the input source.en"),
            std::string::npos)
      << appended.output;
  EXPECT_EQ(changed_since(before), std::vector<std::string>{});
  // So for the programs that print their results, refused before a line: transformer_score
  // and transformer_evalb appended their report to the reference or gold file, the
  // trainer its log to its config file or a shard, exit 0.
  fs::copy_file("source.en", "hyp.en");
  std::ofstream("gold.tree") << "(S (X a) (Y b))\n";
  std::ofstream("test.tree") << "(S (X a) (Y b))\n";
  fs::copy_file(THPC_SOURCE_DIR "/input/tiny.ini", "tiny.ini");
  const std::string train = "transformer_hpc tiny.ini --model.layers=1 --train.max_steps=1 ";
  for (const auto& [command, input] : std::vector<std::pair<std::string, std::string>>{
           {"transformer_score source.en -i hyp.en >> hyp.en", "hyp.en"},
           {"transformer_score source.en < hyp.en >> source.en", "source.en"},
           {"transformer_score source.en < hyp.en >> hyp.en", "standard input (-)"},
           {"transformer_evalb gold.tree test.tree >> gold.tree", "gold.tree"},
           {"transformer_evalb gold.tree - < test.tree >> test.tree", "standard input (-)"}}) {
    SCOPED_TRACE(command);
    const std::map<std::string, std::string> unchanged = everything();
    const ProcessResult printed = run_process("sh -c '" + kBin + "/" + command + "'");
    EXPECT_EQ(printed.exit_code, 2) << printed.output;
    EXPECT_NE(printed.output.find("standard output is the file of the input " + input +
                                  ": writing the "),
              std::string::npos)
        << printed.output;
    EXPECT_EQ(changed_since(unchanged), std::vector<std::string>{});
  }
  for (const auto& [redirect, input] : std::vector<std::pair<std::string, std::string>>{
           {"--dry-run >> tiny.ini", "tiny.ini"},
           {"--data.dir=data --checkpoint.dir=ck >> data/train.00000.h5", "data/train.00000.h5"},
           {"--data.dir=data --checkpoint.dir=run/ck --checkpoint.resume=auto "
            ">> run/ck/step_00000002.h5",
            "run/ck/step_00000002.h5"},
           {"--checkpoint.init=model.h5 --checkpoint.dir=ck --data.dir=data >> model.h5",
            "model.h5"}}) {
    SCOPED_TRACE(redirect);
    const std::map<std::string, std::string> unchanged = everything();
    const ProcessResult printed = run_process("sh -c '" + kBin + "/" + train + redirect + "'");
    EXPECT_EQ(printed.exit_code, 2) << printed.output;
    EXPECT_NE(printed.output.find("transformer_hpc: standard output is " + input +
                                  ", a file this run reads or keeps: its lines would be "
                                  "written into it; redirect the output to another file"),
              std::string::npos)
        << printed.output;
    EXPECT_EQ(changed_since(unchanged), std::vector<std::string>{});
  }
  // Standard output closed (>&-), as "-" or as /dev/stdout: said before the work (it was
  // "the write failed (disk full?)", after the translation).
  for (const char* output : {"-", "/dev/stdout"}) {
    const ProcessResult closed = run_process("sh -c '" + kBin + "/" + decode +
                                             "--input source.en --output " + output + " >&-'");
    EXPECT_EQ(closed.exit_code, 2) << closed.output;
    EXPECT_NE(closed.output.find("closed (>&-): what would be written there is lost; give it a "
                                 "file (> FILE), or give --output a file name"),
              std::string::npos)
        << output << "\n" << closed.output;
  }
  // The trainer, whose log is all it prints there, trains on and says the log is lost.
  const ProcessResult unlogged =
      run_process("sh -c '" + kBin + "/" + train + "--checkpoint.dir=unlogged >&-'");
  EXPECT_EQ(unlogged.exit_code, 0) << unlogged.output;
  EXPECT_NE(unlogged.output.find("transformer_hpc: warning: standard output is closed (>&-): "
                                 "this run's log (its progress lines and summary) is lost"),
            std::string::npos)
      << unlogged.output;
  EXPECT_TRUE(fs::exists("unlogged/step_00000001.h5"));
  // A log kept beside the checkpoints is no file of the run's.
  const ProcessResult logged = run_process("sh -c '" + kBin + "/" + train +
                                           "--checkpoint.dir=ck2 > ck2.log && mkdir -p ck3 && " +
                                           kBin + "/" + train + "--checkpoint.dir=ck3 > " +
                                           "ck3/train.log'");
  EXPECT_EQ(logged.exit_code, 0) << logged.output;
  EXPECT_NE(read_file("ck3/train.log").find("final: step=1"), std::string::npos);
  // Paths that cannot be written: an empty name, a name ending in /, a directory below a
  // file; for the second output too, so that the first is not left behind.
  expect_refused(decode + "--input source.en --output ''", "--output is empty");
  expect_refused(decode + "--input source.en --output out.txt/", "names a directory");
  expect_refused(decode + "--input source.en --output source.en/out.txt",
                 "is not a directory");
  expect_refused(decode + "--input source.en --output out.txt --dump-lines 1 "
                          "--dump-attention model.h5/attention.h5",
                 "is not a directory");
  expect_refused(decode + "--input source.en --output .attention.h5.tmp --dump-lines 1 "
                          "--dump-attention attention.h5",
                 "is the temporary file of another output (attention.h5)");
  expect_refused("transformer_average --inputs model.h5 --output avg.h5/",
                 "names a directory");
  expect_refused("transformer_average --inputs model.h5 --output ''", "--output is empty");
  expect_refused("transformer_trees linearize --output source.en/x words.txt",
                 "is not a directory");
  // "-", standard output, takes no HDF5 file (before: a file named "-" in the working
  // directory, exit 0).
  for (const std::string& command :
       {std::string("transformer_average --inputs model.h5 --output -"),
        std::string("transformer_quantize --checkpoint model.h5 --output -"),
        decode + "--input source.en --output out.txt --dump-lines 1 --dump-attention -"}) {
    expect_refused(command, "-: is an HDF5 file, written whole and renamed into place, not a "
                            "stream: give a file name");
  }
  EXPECT_FALSE(fs::exists(directory_ / "-"));
}

// An HDF5 output (an average, a quantized model, an attention dump) that another program
// writes now, its temporary file locked, is refused and that file left as it was: a
// transformer_average whose create of .F.tmp failed on the other's lock removed the
// other's file as its own leftover, and both failed with HDF5's "unable to lock file". A
// pipe or a device is refused too, before any work: the whole file was renamed over it
// (as root, --output /dev/null replaced the system's /dev/null with a checkpoint).
TEST_F(ToolOutputs, AnHdf5OutputAnotherProgramWritesOrThatIsNoFileIsRefused) {
  train_a_model();
  const std::string dump =
      "transformer_decode --greedy --checkpoint model.h5 --input source.en --output out.txt "
      "--dump-lines 1 --dump-attention ";
  const std::pair<std::string, std::string> writers[] = {
      {"transformer_average --inputs model.h5 --output ", "avg.h5"},
      {"transformer_quantize --checkpoint model.h5 --output ", "int8.h5"},
      {dump, "attention.h5"}};
  for (const auto& [command, output] : writers) {
    const std::string temporary = "." + output + ".tmp";
    std::ofstream(temporary) << "the other program's file\n";
    const int held = ::open(temporary.c_str(), O_RDONLY | O_CLOEXEC);
    ASSERT_GE(held, 0);
    ASSERT_EQ(::flock(held, LOCK_EX | LOCK_NB), 0);
    expect_refused(command + output, "another program is writing " + output + " now (its "
                                     "temporary file " + temporary + " is locked by it)");
    ::close(held);
    const ProcessResult after = run_process(kBin + "/" + command + output);
    EXPECT_EQ(after.exit_code, 0) << after.output;
    EXPECT_TRUE(fs::exists(output)) << command;
    EXPECT_FALSE(fs::exists(temporary)) << command;
    fs::remove("out.txt");
  }
  // The dump's temporary file, claimed before the translations, goes with a failure.
  std::ofstream("bad.en", std::ios::binary) << "a \xff b\n";
  const ProcessResult failed = run_process(
      kBin + "/transformer_decode --greedy --checkpoint model.h5 --input bad.en --output "
      "out.txt --dump-lines 1 --dump-attention fresh.h5");
  EXPECT_EQ(failed.exit_code, 1) << failed.output;
  EXPECT_FALSE(fs::exists(".fresh.h5.tmp"));
  EXPECT_FALSE(fs::exists(".out.txt.tmp"));
  // A site's HDF5_USE_FILE_LOCKING=TRUE overrode the property that turns HDF5's own lock
  // off, which then collided with the claim's: every HDF5 output failed.
  const ProcessResult site = run_process(
      "HDF5_USE_FILE_LOCKING=TRUE " + kBin + "/transformer_quantize --checkpoint model.h5 "
      "--output site.h5");
  EXPECT_EQ(site.exit_code, 0) << site.output;
  // A temporary name that is no file is refused, not waited on (a FIFO's open waited for a
  // reader) nor written through.
  ASSERT_EQ(::mkfifo(".fifo.h5.tmp", 0600), 0);
  fs::create_directory(".folder.h5.tmp");
  for (const char* output : {"fifo.h5", "folder.h5"}) {
    const ProcessResult odd = run_process(
        "timeout 60 " + kBin + "/transformer_quantize --checkpoint model.h5 --output " + output);
    EXPECT_EQ(odd.exit_code, 1) << odd.output;
    EXPECT_NE(odd.output.find("is not a file (a directory, a pipe?): remove it"),
              std::string::npos)
        << odd.output;
  }
  EXPECT_TRUE(fs::is_fifo(".fifo.h5.tmp"));
  ASSERT_EQ(::mkfifo("pipe.h5", 0600), 0);
  const bool device = ::mknod("device.h5", S_IFCHR | 0666, makedev(1, 3)) == 0;  // as root
  for (const auto& [command, output] : writers) {
    expect_refused(command + "pipe.h5", "pipe.h5: is a pipe (FIFO), not a file: this output "
                                        "is a whole HDF5 file");
    EXPECT_TRUE(fs::is_fifo("pipe.h5"));
    if (device) {
      expect_refused(command + "device.h5", "device.h5: is a device or other special file");
      EXPECT_TRUE(fs::is_character_file("device.h5"));
    }
  }
}

// An output that is a symbolic link writes the file the link names, and the link stays
// (the write replaced the link with a file of its own); /dev/stdout and its kin are the
// process's open descriptors, written through: a pipe hung the program, which read its
// own output looking for a checkpoint's header, and a file redirected with `>` was left
// empty while the rename replaced the link (as root, the system's /dev/stdout).
TEST_F(ToolOutputs, AnOutputThroughALinkOrAStandardStreamWritesWhatItNames) {
  train_a_model();
  const std::string decode =
      kBin + "/transformer_decode --greedy --checkpoint model.h5 --input source.en ";
  std::ofstream("real.txt") << "old\n";
  fs::create_symlink("real.txt", "out.lnk");
  ProcessResult run = run_process(decode + "--output out.lnk");
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_TRUE(fs::is_symlink("out.lnk"));
  EXPECT_EQ(lines_of(read_file("real.txt")).size(), 8u);
  const std::string translations = read_file("real.txt");
  // A link to a file not yet there, in another folder, relative to the link's folder.
  fs::create_directories("models");
  fs::create_directories("links");
  fs::create_symlink("../models/avg.h5", "links/avg.lnk");
  run = run_process(kBin + "/transformer_average --inputs model.h5 --output links/avg.lnk");
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_TRUE(fs::is_symlink("links/avg.lnk"));
  EXPECT_EQ(read_checkpoint("models/avg.h5", CheckpointParts::ParamsOnly).params.size(),
            read_checkpoint("model.h5", CheckpointParts::ParamsOnly).params.size());
  std::ofstream("tree.mrg") << "(S (X a) (Y b))\n";
  fs::create_symlink("kept.words", "out.words");
  run = run_process(kBin + "/transformer_trees linearize --output out tree.mrg");
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_TRUE(fs::is_symlink("out.words"));
  EXPECT_EQ(read_file("kept.words"), "a b\n");
  // The standard output as a path: into a file (`>`, `>>`) and into a pipe. A link of
  // the test's own stands for /dev/stdout (the same link into /proc), which a build with
  // the defect would replace.
  fs::create_symlink("/proc/self/fd/1", "stdout.lnk");
  for (const std::string stream : {"stdout.lnk", "/dev/fd/1"}) {
    SCOPED_TRACE(stream);
    run = run_process("sh -c '" + decode + "--output " + stream + " > redirected.txt'");
    ASSERT_EQ(run.exit_code, 0) << run.output;
    EXPECT_EQ(read_file("redirected.txt"), translations);
    std::ofstream("appended.txt") << "first\n";
    run = run_process("sh -c '" + decode + "--output " + stream + " >> appended.txt'");
    ASSERT_EQ(run.exit_code, 0) << run.output;
    EXPECT_EQ(read_file("appended.txt"), "first\n" + translations);
    run = run_process("timeout 120 sh -c '" + decode + "--output " + stream +
                      " | cat > piped.txt'");
    ASSERT_EQ(run.exit_code, 0) << run.output;
    EXPECT_EQ(read_file("piped.txt"), translations);
    // Between the shell's own writes to one redirected file: written through the shell's
    // descriptor, at its offset (opened again and appended to, the shell's "last" went
    // over the translations' first bytes; a helper's trial).
    run = run_process("sh -c '(echo first; " + decode + "--output " + stream +
                      "; echo last) > shared.txt'");
    ASSERT_EQ(run.exit_code, 0) << run.output;
    EXPECT_EQ(read_file("shared.txt"), "first\n" + translations + "last\n");
  }
  EXPECT_TRUE(fs::is_symlink("stdout.lnk"));
  // The checks are of the file the link names: a harmless name for a run's checkpoint is
  // refused as the checkpoint is; a loop of links is refused (the rename replaced it).
  fs::create_symlink("run/ck/step_00000002.h5", "harmless.lnk");
  expect_refused("transformer_average --inputs model.h5 --output harmless.lnk",
                 "named like a training checkpoint");
  fs::create_symlink("loop.lnk", "loop.lnk");  // (expect_refused's listing cannot pass it)
  run = run_process(decode + "--output loop.lnk");
  EXPECT_EQ(run.exit_code, 2) << run.output;
  EXPECT_NE(run.output.find("--output loop.lnk: is a loop of symbolic links"), std::string::npos)
      << run.output;
  EXPECT_TRUE(fs::is_symlink("loop.lnk"));
  fs::remove("loop.lnk");
  // A whole HDF5 file cannot go to a stream; the other text writer writes through it.
  expect_refused("transformer_average --inputs model.h5 --output stdout.lnk",
                 "is an open descriptor of this process");
  std::ofstream("words.txt") << "a b\n";
  std::ofstream("tags.txt") << "X Y\n";
  run = run_process("timeout 60 sh -c '" + kBin + "/transformer_trees baseline --words "
                    "words.txt --tags tags.txt --output stdout.lnk | cat > trees.txt'");
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_EQ(read_file("trees.txt"), "(TOP (S (X a) (Y b)))\n");
  // A descriptor open for reading only: the failed write's own reason, however much was
  // buffered (past 64 KiB it said "disk full?": the error was cleared before it was read).
  {
    std::ofstream many_words("many_words.txt"), many_tags("many_tags.txt");
    for (int line = 0; line < 3000; ++line) {
      many_words << "alpha beta gamma delta epsilon\n";
      many_tags << "A B C D E\n";
    }
  }
  for (const char* input : {"words.txt --tags tags.txt", "many_words.txt --tags many_tags.txt"}) {
    run = run_process("timeout 60 sh -c '" + kBin + "/transformer_trees baseline --words " +
                      input + " --output /dev/fd/1 1< /dev/null'");
    EXPECT_NE(run.exit_code, 0) << input << "\n" << run.output;
    EXPECT_NE(run.output.find("the write failed (Bad file descriptor)"), std::string::npos)
        << input << "\n" << run.output;
  }
  // A path through /proc that is no descriptor is a file, replaced as any other.
  for (int i = 0; i < 2; ++i) {
    run = run_process(decode + "--output /proc/self/cwd/cwd.txt");
    ASSERT_EQ(run.exit_code, 0) << run.output;
  }
  EXPECT_EQ(read_file("cwd.txt"), translations);
}

TEST_F(ToolOutputs, NoToolWritesOverATrainingRunsFiles) {
  train_a_model();
  const std::string decode = "transformer_decode --greedy --checkpoint model.h5 --input source.en ";
  const std::string average = "transformer_average --inputs model.h5 ";
  fs::copy_file("model.h5", "run/ck/best.h5");
  // By name: what resume=auto, pruning and keep_best act on, the metrics a run appends to.
  // A run's lock and a corpus's (renamed over, a running trainer took its replaced lock
  // for another holder's and stopped without its last checkpoint).
  for (const std::string output : {"run/ck/step_00000002.h5", "run/ck/step_00000009.h5",
                                    "run/ck/best.h5", "elsewhere/best.h5", "run/metrics.jsonl",
                                    "run/ck/trainer.lock", "data/preprocess.lock"}) {
    expect_refused(decode + "--output " + output, "no tool writes over a training run's files");
    expect_refused(average + "--output " + output, "no tool writes over a training run's files");
  }
  // By contents: a checkpoint with its Adam moments under any name, a binary file under
  // a text output (shards, the vocabulary), anything but an average under an average.
  fs::copy_file("model.h5", "renamed.h5");
  expect_refused(decode + "--output renamed.h5", "a checkpoint holding a training state (step 2");
  expect_refused(average + "--output renamed.h5", "a checkpoint holding a training state");
  expect_refused(decode + "--output data/train.00000.h5", "exists and is a binary file");
  expect_refused(decode + "--output data/spm.model", "exists and is a binary file");
  expect_refused(average + "--output data/train.00000.h5", "is not a parameters-only checkpoint");
  expect_refused(average + "--output source.en", "is not a parameters-only checkpoint");
  expect_refused(decode + "--dump-lines 1 --dump-attention data/train.00000.h5",
                 "is not an earlier attention dump");
  // An average may replace an earlier average, a dump an earlier dump.
  for (int i = 0; i < 2; ++i) {
    const ProcessResult averaged = run_process(kBin + "/" + average + "--output average.h5");
    EXPECT_EQ(averaged.exit_code, 0) << averaged.output;
    const ProcessResult dumped =
        run_process(kBin + "/" + decode + "--output out.txt --dump-lines 1 --dump-attention d.h5");
    EXPECT_EQ(dumped.exit_code, 0) << dumped.output;
  }
  EXPECT_EQ(read_checkpoint("average.h5", CheckpointParts::ParamsOnly).step, 2);
  // A run's final average is its file beside its checkpoints; the name elsewhere is not
  // (tools/evaluate.sh writes DIR/eval/average_lastN.h5).
  expect_refused(average + "--output run/ck/average_last2.h5",
                 "the final average of the training run whose checkpoints are beside it");
  const ProcessResult elsewhere = run_process(kBin + "/" + average + "--output eval/average_last2.h5");
  EXPECT_EQ(elsewhere.exit_code, 0) << elsewhere.output;
}

TEST_F(ToolOutputs, PreprocessNeverRemovesOrRewritesItsInputs) {
  const ProcessResult made = run_process(
      "python3 " THPC_SOURCE_DIR "/tools/make_numbers_corpus.py --train 200 --valid 8 "
      "--test 2 --seed 1 --out text > /dev/null");
  ASSERT_EQ(made.exit_code, 0) << made.output;
  const std::string preprocess = "transformer_preprocess --source-lang en --target-lang de "
                                 "--vocab-size 100 --validpref text/valid ";
  ASSERT_EQ(run_process(kBin + "/" + preprocess + "--trainpref text/train --destdir data")
                .exit_code,
            0);
  // The model of the destination is rewritten by the run: not an input it may take.
  expect_refused(preprocess + "--trainpref text/train --destdir data --spm-model data/spm.model",
                 "--spm-model: data/spm.model is a file this run writes or removes in --destdir data");
  // An input that is (a link to) a shard name the run removes or writes, however spelt.
  fs::create_hard_link("text/train.en", "data/test.00007.h5");
  expect_refused(preprocess + "--trainpref text/train --destdir data",
                 "--trainpref: text/train.en is a file this run writes or removes");
  fs::remove("data/test.00007.h5");
  fs::create_directories("other");
  fs::create_symlink("../text/train.de", "other/train.de");
  fs::copy_file("text/train.en", "other/train.en");
  fs::create_symlink("../other/train.de", "data/valid.00009.h5");
  expect_refused(preprocess + "--trainpref other/train --destdir ./data/",
                 "--trainpref: other/train.de is a file this run writes or removes");
  fs::remove("data/valid.00009.h5");
  // A file under a shard's name (or spm.model) that is none: the run would delete or
  // replace it unread (before: a checkpoint copied in as train.00007.h5 went, exit 0).
  fs::rename("data/spm.model", "spm.model.kept");
  for (const auto& [name, why] : std::vector<std::pair<std::string, std::string>>{
           {"train.00007.h5", "which this run would remove or replace but is not a shard ("},
           {"spm.model", "which this run would replace but is not a SentencePiece model"}}) {
    fs::copy_file("text/train.en", "data/" + name);
    expect_refused(preprocess + "--trainpref text/train --destdir data",
                   "--destdir data holds data/" + name + ", " + why);
    fs::remove("data/" + name);
  }
  fs::rename("spm.model.kept", "data/spm.model");
  // A training run's directory is refused (before: the shards went in beside step_*.h5,
  // where checkpoint.overwrite may delete them).
  fs::create_directories("run");
  std::ofstream("run/step_00000005.h5") << "a checkpoint";
  expect_refused(preprocess + "--trainpref text/train --destdir run",
                 "--destdir run is a training run's directory (it holds step_00000005.h5): "
                 "give the corpus a directory of its own");
  // ... by any file a run writes, as the checkpoints' own rule names them (before: a list
  // of its own, without the averages of the best nor the damaged checkpoints moved aside).
  fs::remove("run/step_00000005.h5");
  for (const std::string name : {"average_best3.h5", "step_00000005.h5.corrupt", "trainer.lock"}) {
    std::ofstream("run/" + name) << "a run's";
    expect_refused(preprocess + "--trainpref text/train --destdir run",
                   "--destdir run is a training run's directory (it holds " + name + ")");
    fs::remove("run/" + name);
  }
  // An earlier run's shards are removed, and the run says so.
  const ProcessResult again = run_process(kBin + "/" + preprocess +
                                          "--trainpref text/train --destdir data --shards 2");
  EXPECT_EQ(again.exit_code, 0) << again.output;
  EXPECT_NE(again.output.find("removed the 2 shards an earlier run left in data "
                              "(train.00000.h5 ... valid.00000.h5): this run writes its own"),
            std::string::npos)
      << again.output;
  // A link at a name the run writes under first (a shard's, spm.model's or a scratch
  // file's .partial) is refused, its target untouched: planted in a shared directory, its
  // target outside --destdir was written over, exit 0 (a helper's finding). A hard link
  // there is another name of the victim's: the run writes a file of its own instead.
  std::ofstream("victim.txt") << "kept\n";
  for (const std::string name : {"train.00000.h5.partial", "valid.00000.h5.partial",
                                 "train.src.tokens.partial", "spm.model.partial"}) {
    SCOPED_TRACE(name);
    fs::create_symlink("../victim.txt", "data/" + name);
    const ProcessResult linked =
        run_process(kBin + "/" + preprocess + "--trainpref text/train --destdir data");
    EXPECT_EQ(linked.exit_code, 1) << linked.output;
    EXPECT_NE(linked.output.find("cannot write data/" + name + ": it is a symbolic link, "
                                 "whose target would be written: remove it"),
              std::string::npos)
        << linked.output;
    EXPECT_EQ(read_file("victim.txt"), "kept\n");
    fs::remove("data/" + name);
  }
  fs::create_hard_link("victim.txt", "data/train.00000.h5.partial");
  EXPECT_EQ(run_process(kBin + "/" + preprocess + "--trainpref text/train --destdir data")
                .exit_code,
            0);
  EXPECT_EQ(read_file("victim.txt"), "kept\n");
  // Text beside the shards, under names the run never writes, is fine.
  fs::create_directories("data/text");
  fs::copy_file("text/train.en", "data/text/train.en");
  fs::copy_file("text/train.de", "data/text/train.de");
  EXPECT_EQ(run_process(kBin + "/" + preprocess + "--trainpref data/text/train --destdir data")
                .exit_code,
            0);
}

TEST_F(ToolOutputs, TreesNeverWritesOverItsInputs) {
  std::ofstream("words.txt") << "a b\n";
  std::ofstream("tags.txt") << "X Y\n";
  std::ofstream("seq.txt") << "(S XX XX )\n";
  std::ofstream("tree.mrg") << "(S (X a) (Y b))\n";
  std::ofstream("old.gold") << "(S (X a) (Y b))\n";
  const std::string trees = "transformer_trees ";
  expect_refused(trees + "delinearize --words words.txt --tags tags.txt --input seq.txt "
                         "--output ./seq.txt",
                 "--output ./seq.txt: is the input seq.txt");
  expect_refused(trees + "baseline --words words.txt --tags tags.txt --output words.txt",
                 "is the input words.txt");
  // linearize writes PREFIX.words, .tree, .tags and .gold: old.gold is one of them.
  expect_refused(trees + "linearize --output old tree.mrg old.gold",
                 "--output old.gold: is the input old.gold");
  expect_refused(trees + "baseline --words words.txt --tags tags.txt --output run/best.h5",
                 "no tool writes over a training run's files");
  // A prefix that names a directory wrote hidden files there (out/.words).
  fs::create_directory("out");
  expect_refused(trees + "linearize --output out/ tree.mrg",
                 "--output out/: linearize's output is a prefix of four files (PREFIX.words, "
                 ".tree, .tags, .gold), not a directory: give e.g. out/wsj");
  expect_refused(trees + "linearize --output out tree.mrg", "not a directory: give e.g. out/wsj");
  fs::remove("out");
  const ProcessResult ok = run_process(kBin + "/" + trees + "linearize --output out tree.mrg");
  EXPECT_EQ(ok.exit_code, 0) << ok.output;
  EXPECT_EQ(read_file("out.words"), "a b\n");
}

// A name of 251 to 255 bytes is a file's name like any other: its temporary file's name
// (".NAME.tmp", 5 bytes more) was too long, and the write failed with "File name too
// long", telling the user to remove a temporary file that never was.
TEST_F(ToolOutputs, AnOutputWhoseNameIsAsLongAsAFileNameMayBeIsWritten) {
  const std::string longest = std::string(251, 'b') + ".txt";
  EXPECT_LE(fs::path(temporary_path(longest)).filename().string().size(), 255u);
  EXPECT_NE(temporary_path(longest), temporary_path(std::string(251, 'b') + ".tx2"));
  std::ofstream("words.txt") << "a b\n";
  std::ofstream("tags.txt") << "X Y\n";
  const ProcessResult written = run_process(
      kBin + "/transformer_trees baseline --words words.txt --tags tags.txt --output " + longest);
  EXPECT_EQ(written.exit_code, 0) << written.output;
  EXPECT_EQ(lines_of(read_file(longest)).size(), 1u);
  EXPECT_EQ(std::distance(fs::directory_iterator("."), fs::directory_iterator()), 3);
}

// A user whose umask makes new files read-only (0222) gets their outputs, read-only as
// that umask asks: the claim made the temporary file 0444 before the write opened it
// again by name, and every text and HDF5 output failed with "Permission denied". Root may
// write any file, so as root the programs run as nobody (setpriv), as another user would.
TEST_F(ToolOutputs, AnOutputIsWrittenUnderAUmaskThatMakesNewFilesReadOnly) {
  train_a_model();
  std::string as_a_user;
  if (!as_another_user(&as_a_user)) GTEST_SKIP() << kNoOtherUser;
  std::ofstream("words.txt") << "a b\n";
  std::ofstream("tags.txt") << "X Y\n";
  std::ofstream("tree.mrg") << "(S (X a) (Y b))\n";
  const std::vector<std::pair<std::string, std::string>> writes = {
      {"transformer_trees baseline --words words.txt --tags tags.txt --output out.txt",
       "out.txt"},
      {"transformer_trees linearize --output set tree.mrg", "set.tree"},
      // into directories it makes, which its owner may write as `mkdir -p`'s parents
      {"transformer_trees linearize --output new/sub/set tree.mrg", "new/sub/set.tree"},
      {"transformer_decode --checkpoint model.h5 --input source.en --output out.de "
       "--max-len-b 5",
       "out.de"},
      {"transformer_quantize --checkpoint model.h5 --output quantized.h5", "quantized.h5"}};
  for (const auto& [command, output] : writes) {
    SCOPED_TRACE(command);
    const ProcessResult run =
        run_process("umask 0222 && " + as_a_user + kBin + "/" + command);
    EXPECT_EQ(run.exit_code, 0) << run.output;
    struct stat written {};
    ASSERT_EQ(::stat(output.c_str(), &written), 0) << output;
    EXPECT_EQ(written.st_mode & 0777, 0444u) << output;  // the mode that umask asks for
  }
  EXPECT_TRUE(fs::exists("set.words"));
  EXPECT_FALSE(fs::exists(temporary_path("out.txt")));
}

// An output this user may not write (chmod a-w, or another user's) is refused, as `cp` and
// the shell's `>` refuse it: a rename replaced it whatever its permissions, and a
// protected translation, average or corpus was gone, exit 0. One that is replaced keeps
// its permissions: a private 0600 output came back 0644 (a helper's trial). Root may
// write any file, so as root the refusals run as nobody (setpriv), as another user would.
TEST_F(ToolOutputs, AWriteProtectedOutputIsRefusedAndAReplacedOneKeepsItsPermissions) {
  train_a_model();
  const std::string decode =
      "transformer_decode --greedy --max-len-b 5 --checkpoint model.h5 --input source.en ";
  const std::vector<std::pair<std::string, std::string>> writes = {
      {decode + "--output out.de", "out.de"},
      {"transformer_quantize --checkpoint model.h5 --output quantized.h5", "quantized.h5"},
      {"transformer_average --inputs model.h5 --output average.h5", "average.h5"}};
  std::ofstream("tree.mrg") << "(S (X a) (Y b))\n";
  const std::string preprocess =
      "transformer_preprocess --source-lang en --target-lang de --trainpref text/train "
      "--validpref text/valid --destdir data --vocab-size 100 --model-type bpe --seed 1";
  // Each writer: write_atomically's, write_texts_atomically's (linearize's four files),
  // and the corpus's renames.
  std::vector<std::pair<std::string, std::string>> replacing = writes;
  replacing.emplace_back("transformer_trees linearize --output lin tree.mrg", "lin.tags");
  replacing.emplace_back(preprocess, "data/train.00000.h5");
  replacing.emplace_back(preprocess, "data/spm.model");
  const auto mode_of = [](const std::string& path) {
    struct stat written {};
    EXPECT_EQ(::stat(path.c_str(), &written), 0) << path;
    return written.st_mode & 0777;
  };
  for (const auto& [command, output] : replacing) {
    SCOPED_TRACE(command);
    const ProcessResult first = run_process(kBin + "/" + command);
    ASSERT_EQ(first.exit_code, 0) << first.output;
    for (const fs::perms mode : {fs::perms(0600), fs::perms(0664)}) {
      fs::permissions(output, mode);
      const ProcessResult run = run_process(kBin + "/" + command);
      ASSERT_EQ(run.exit_code, 0) << run.output;
      EXPECT_EQ(mode_of(output), static_cast<unsigned>(mode)) << output;
    }
  }
  // A named user's entry of an access ACL is kept, and the group's bits are not widened
  // to the ACL's mask (the mode's group bits).
  if (::access("/usr/bin/setfacl", X_OK) == 0 &&
      run_process("chmod 640 out.de && setfacl -m u:65534:rw out.de").exit_code == 0) {
    const ProcessResult run = run_process(kBin + "/" + writes[0].first);
    ASSERT_EQ(run.exit_code, 0) << run.output;
    const ProcessResult acl = run_process("getfacl -c out.de");
    EXPECT_NE(acl.output.find("user:nobody:rw-"), std::string::npos) << acl.output;
    EXPECT_NE(acl.output.find("group::r--"), std::string::npos) << acl.output;
  }
  std::string as_a_user;
  if (!as_another_user(&as_a_user)) GTEST_SKIP() << kNoOtherUser;
  for (const char* made : {"data", "run", "run/ck", "text"}) {
    fs::permissions(made, fs::perms::all);
  }
  // A write-only file of this user's own is replaced (its sync opened it to read: the
  // whole translation done, then exit 1).
  if (!as_a_user.empty()) {
    std::ofstream("write_only.de") << "old\n";
    ASSERT_EQ(::chown("write_only.de", 65534, 65534), 0);
    fs::permissions("write_only.de", fs::perms(0200));
    const ProcessResult written =
        run_process(as_a_user + kBin + "/" + decode + "--output write_only.de");
    EXPECT_EQ(written.exit_code, 0) << written.output;
    EXPECT_EQ(mode_of("write_only.de"), 0200u);
  }
  for (const auto& [command, output] : writes) {
    SCOPED_TRACE(command);
    fs::permissions(output, fs::perms(0444));
    const std::string before = read_file(output);
    const ProcessResult refused = run_process(as_a_user + kBin + "/" + command);
    EXPECT_EQ(refused.exit_code, 2) << refused.output;
    // (root's file to nobody; as another user, this user's own, write-protected)
    EXPECT_NE(refused.output.find(
                  output + (as_a_user.empty()
                                ? ": is write-protected (mode 0444): make it writable (chmod u+w " +
                                      output + ") or remove it to have it replaced; or give "
                                      "another output file"
                                : ": is root's (mode 0444), not writable by this user: remove "
                                  "it, where its directory lets you, to have it replaced; or "
                                  "give another output file")),
              std::string::npos)
        << refused.output;
    EXPECT_EQ(read_file(output), before);
  }
  // A corpus protected so is not removed and written anew by another preprocess run.
  for (const fs::directory_entry& file : fs::directory_iterator("data")) {
    fs::permissions(file.path(), fs::perms(0666));
  }
  fs::permissions("data/train.00000.h5", fs::perms(0444));
  const std::string shard = read_file("data/train.00000.h5");
  const ProcessResult corpus = run_process(
      as_a_user + kBin + "/transformer_preprocess --source-lang en --target-lang de "
      "--trainpref text/train --validpref text/valid --destdir data --vocab-size 100 "
      "--model-type bpe --seed 1");
  EXPECT_NE(corpus.exit_code, 0) << corpus.output;
  EXPECT_NE(corpus.output.find("--destdir data holds data/train.00000.h5, which this run would "
                               "remove or replace, but it is "),
            std::string::npos)
      << corpus.output;
  EXPECT_EQ(read_file("data/train.00000.h5"), shard);
}

// linearize's four files are renamed into place as one section that an interrupt waits
// for: a SIGTERM between two renames left the new .words beside the old .tree, .tags and
// .gold (a helper's finding), which a parser trained on them would have taken as one set.
TEST_F(ToolOutputs, AnInterruptWhileTreesRenamesItsFilesLeavesOneWholeSet) {
  std::ofstream("old.mrg") << "(S (X a) (Y b))\n";
  std::ofstream("new.mrg") << "(S (X c) (Y d))\n(S (X e) (Y f))\n";
  const ProcessResult old_set =
      run_process(kBin + "/transformer_trees linearize --output set old.mrg");
  ASSERT_EQ(old_set.exit_code, 0) << old_set.output;
  int status = 0;
  const std::string log = interrupted_while_renaming(
      {"transformer_trees", "linearize", "--output", "set", "new.mrg"}, &status);
  ASSERT_NE(log.find("test hook: renaming into place"), std::string::npos) << log;
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGTERM) << status << "\n" << log;
  for (const char* part : {".words", ".tree", ".tags", ".gold"}) {
    EXPECT_EQ(lines_of(read_file(std::string("set") + part)).size(), 2u) << part;
    EXPECT_FALSE(fs::exists(std::string(".set") + part + ".tmp")) << part;
  }
  // Another run writing the set now (a temporary file locked) is refused, and the set
  // left as it is (two runs renamed each other's files away, or left a mixed set).
  std::ofstream(".set.tree.tmp") << "the other run's\n";
  const int held = ::open(".set.tree.tmp", O_RDONLY | O_CLOEXEC);
  ASSERT_GE(held, 0);
  ASSERT_EQ(::flock(held, LOCK_EX | LOCK_NB), 0);
  expect_refused("transformer_trees linearize --output set old.mrg",
                 "another program is writing set.tree now");
  ::close(held);
}

TEST_F(ToolOutputs, TrainerNeverWritesOverItsInputs) {
  // The synthetic task of tiny.ini (no data files), one layer, two steps: a second each.
  const std::string config = "config.ini";
  fs::copy_file(THPC_SOURCE_DIR "/input/tiny.ini", config);
  const std::string train = "transformer_hpc " + config +
                            " --model.layers=1 --train.max_steps=2 --checkpoint.every_steps=1 ";
  ASSERT_EQ(run_process(kBin + "/" + train + "--checkpoint.dir=first/ck").exit_code, 0);
  // The metrics file it appends to is its config file (a link), or a checkpoint, or any
  // file that is not a run's metrics file: refused before the first write.
  // (The metrics file of checkpoint.dir DIR is DIR/metrics.jsonl.)
  fs::create_directories("a/ck");
  fs::create_symlink("../../" + config, "a/ck/metrics.jsonl");
  expect_refused(train + "--checkpoint.dir=a/ck",
                 "the metrics file a/ck/metrics.jsonl is the config file config.ini (the same file)");
  fs::create_directories("b/ck");
  fs::create_hard_link("first/ck/step_00000002.h5", "b/ck/metrics.jsonl");
  expect_refused(train + "--checkpoint.dir=b/ck --checkpoint.init=first/ck/step_00000002.h5",
                 "is checkpoint.init first/ck/step_00000002.h5 (the same file)");
  fs::create_directories("c/ck");
  std::ofstream("c/ck/metrics.jsonl") << "my notes\n";
  expect_refused(train + "--checkpoint.dir=c/ck", "exists and is not a run's metrics file");
  // checkpoint.overwrite deletes an earlier run's files, never one this run reads.
  expect_refused(train + "--checkpoint.dir=first/ck --checkpoint.overwrite=true "
                         "--checkpoint.init=./first/ck/../ck/step_00000001.h5",
                 "checkpoint.overwrite = true would delete first/ck/step_00000001.h5, which is "
                 "checkpoint.init");
  // A corpus copied into the run's directory.
  ASSERT_EQ(run_process("python3 " THPC_SOURCE_DIR "/tools/make_numbers_corpus.py --train 100 "
                        "--valid 8 --test 2 --seed 1 --out text > /dev/null && " + kBin +
                        "/transformer_preprocess --source-lang en --target-lang de "
                        "--vocab-size 100 --trainpref text/train --validpref text/valid "
                        "--destdir corpus > /dev/null")
                .exit_code,
            0);
  for (const char* name : {"train.00000.h5", "valid.00000.h5", "spm.model"}) {
    fs::copy_file(fs::path("corpus") / name, fs::path("first/ck") / name);
  }
  // Beside its inputs, under names of its own, it trains.
  const ProcessResult ok = run_process(kBin + "/" + train + "--checkpoint.dir=d/ck "
                                       "--checkpoint.init=first/ck/step_00000002.h5");
  EXPECT_EQ(ok.exit_code, 0) << ok.output;
  // An earlier run's checkpoints beside the corpus (data.dir = checkpoint.dir) are not
  // data: overwrite deletes them and trains on the corpus, which stays (before: refused,
  // calling the earlier run's checkpoint "a file of data.dir"; a helper's finding).
  const std::string corpus_before = read_file("first/ck/train.00000.h5");
  const ProcessResult beside = run_process(kBin + "/" + train + "--checkpoint.dir=first/ck "
                                           "--checkpoint.overwrite=true --data.dir=first/ck");
  EXPECT_EQ(beside.exit_code, 0) << beside.output;
  EXPECT_NE(beside.output.find("first/ck/step_00000001.h5"), std::string::npos) << beside.output;
  EXPECT_EQ(read_file("first/ck/train.00000.h5"), corpus_before);
  EXPECT_TRUE(fs::exists("first/ck/spm.model"));
  EXPECT_TRUE(fs::exists("first/ck/step_00000002.h5")) << "this run's own";
  // A shard whose split's name makes it look like a checkpoint's (average_last*.h5) is
  // still data: never deleted by overwrite.
  fs::copy_file("first/ck/train.00000.h5", "first/ck/average_last_x.00000.h5");
  expect_refused(train + "--checkpoint.dir=first/ck --checkpoint.overwrite=true "
                         "--data.dir=first/ck --data.train=average_last_x",
                 "checkpoint.overwrite = true would delete first/ck/average_last_x.00000.h5, "
                 "which is a file of data.dir of this run");
}


// ---- the storage stops a write ----

// Runs `command` (a program of the build and its arguments) under `shell_setup` (a ulimit),
// which must fail on its write: exit 1 (no signal: SIGXFSZ killed the trainer, exit 153,
// and HDF5 crashed at exit after a failed write, 139), an error saying it cannot write,
// naming `file` and holding `advice`, and no temporary or partial file nor lock anywhere
// below `dir`.
void expect_storage_failure(const std::string& shell_setup, const std::string& command,
                            const std::string& file, const std::string& advice,
                            const std::string& dir = ".") {
  SCOPED_TRACE(command);
  const ProcessResult run =
      run_process("bash -c '" + shell_setup + "; exec " + kBin + "/" + command + "'");
  EXPECT_EQ(run.exit_code, 1) << run.output;
  EXPECT_NE(run.output.find("error"), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("cannot write"), std::string::npos) << run.output;
  EXPECT_NE(run.output.find(file), std::string::npos) << run.output;
  EXPECT_NE(run.output.find(advice), std::string::npos) << run.output;
  EXPECT_EQ(run.output.find("Segmentation"), std::string::npos) << run.output;
  EXPECT_EQ(run.output.find("HDF5-DIAG"), std::string::npos) << run.output;
  for (const fs::directory_entry& entry : fs::recursive_directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    const bool partial = name.size() > 4 && (name.compare(name.size() - 4, 4, ".tmp") == 0 ||
                                             name.find(".partial") != std::string::npos);
    EXPECT_FALSE(partial) << entry.path();
    EXPECT_NE(name, "trainer.lock") << entry.path();
  }
}

TEST_F(ToolOutputs, AFileSizeLimitStopsEveryWriterWithOneMessageAndNoPartialFile) {
  train_a_model();
  const std::string limit = "the process's file-size limit (ulimit -f, or the batch system's) of ";
  expect_storage_failure("ulimit -f 1",
                         "transformer_decode --greedy --checkpoint model.h5 --input text/train.en "
                         "--output out.de",
                         "output file out.de", limit + "1024 bytes stopped it");
  EXPECT_FALSE(fs::exists("out.de"));
  expect_storage_failure("ulimit -f 100", "transformer_average --inputs model.h5 --output avg.h5",
                         "checkpoint avg.h5", limit + "102400 bytes stopped it");
  EXPECT_FALSE(fs::exists("avg.h5"));
  expect_storage_failure("ulimit -f 8",
                         "transformer_preprocess --source-lang en --target-lang de --trainpref "
                         "text/train --validpref text/valid --destdir data2 --vocab-size 100 "
                         "--model-type bpe --seed 1",
                         "shard data2/train.00000.h5", limit + "8192 bytes stopped it");
  // transformer_trees' four files (it guessed "disk full?").
  {
    std::ofstream trees("many.mrg");
    for (int i = 0; i < 200; ++i) trees << "(S (X a) (Y b))\n";
  }
  expect_storage_failure("ulimit -f 1", "transformer_trees linearize --output lim many.mrg",
                         "cannot write lim.", limit + "1024 bytes stopped it");
  EXPECT_FALSE(fs::exists("lim.tree"));
  // The trainer's checkpoint (MPI's own files need a few MB: a model whose checkpoint is
  // larger than the 10 MB allowed).
  expect_storage_failure("ulimit -f 10000",
                         "transformer_hpc " THPC_SOURCE_DIR "/input/tiny.ini --model.layers=2 "
                         "--model.d_model=256 --model.d_ff=1024 --train.max_steps=3 "
                         "--checkpoint.every_steps=2 --checkpoint.dir=big",
                         "checkpoint big/step_00000002.h5", limit + "10240000 bytes stopped it");
  // A limit under which MPI cannot start is said before it tries (before: fifteen lines of
  // PMIx's "OUT-OF-RESOURCE", nothing naming the limit).
  const ProcessResult too_small = run_process(
      "bash -c 'ulimit -f 4000; exec " + kBin + "/transformer_hpc " THPC_SOURCE_DIR
      "/input/tiny.ini --dry-run'");
  EXPECT_EQ(too_small.exit_code, 2) << too_small.output;
  EXPECT_EQ(too_small.output, "transformer_hpc: error: the process's file-size limit (ulimit "
                              "-f, or the batch system's) is 4000 KiB: MPI's start-up writes "
                              "a file of 4 MiB and fails under it; raise it (ulimit -f "
                              "unlimited, or enough for the checkpoints)\n");
  // One at which it starts is taken (a tiny model's checkpoints are smaller).
  const ProcessResult enough = run_process(
      "bash -c 'ulimit -f 5000; exec " + kBin + "/transformer_hpc " THPC_SOURCE_DIR
      "/input/tiny.ini --dry-run'");
  EXPECT_EQ(enough.exit_code, 0) << enough.output;
}

// A small tmpfs (the test skips where it may not mount one) filled by the writers.
TEST_F(ToolOutputs, AFullDiskStopsEveryWriterWithOneMessageAndNoPartialFile) {
  fs::create_directories("full");
  if (::mount("tmpfs", "full", "tmpfs", 0, "size=1m") != 0) {
    GTEST_SKIP() << "cannot mount a 1 MiB tmpfs here (" << std::strerror(errno)
                 << "): the full-disk case needs one (root, or a user namespace)";
  }
  struct Unmount {
    ~Unmount() { ::umount2((fs::current_path() / "full").c_str(), MNT_DETACH); }
  } unmount;
  train_a_model();
  const std::string full = "the file system (or this user's quota) of ";
  // The 1.8 MB checkpoint does not fit; its lock and metrics do.
  expect_storage_failure("true",
                         "transformer_hpc " THPC_SOURCE_DIR "/input/tiny.ini --model.layers=1 "
                         "--data.dir=data --train.max_steps=2 --checkpoint.dir=full/ck",
                         "checkpoint full/ck/step_00000002.h5", full + "full/ck is full", "full");
  // Then nothing fits.
  std::ofstream("full/filler") << std::string(1 << 20, 'x');
  // The trainer's lock, its first file: the full disk said so (before: "make it writable
  // (a read-only filesystem? permissions?)"), exit 2 before the first step.
  const ProcessResult locked = run_process(kBin + "/transformer_hpc " THPC_SOURCE_DIR
                                           "/input/tiny.ini --checkpoint.dir=full/ck2");
  EXPECT_EQ(locked.exit_code, 2) << locked.output;
  EXPECT_NE(locked.output.find("creating its lock full/ck2/trainer.lock failed (No space left "
                               "on device): found now rather than at the first checkpoint; " +
                               full + "full/ck2 is full"),
            std::string::npos)
      << locked.output;
  EXPECT_EQ(locked.output.find("permissions"), std::string::npos) << locked.output;
  // The dry run refuses it as training does (before: it passed, exit 0, a helper's trial).
  const ProcessResult dry = run_process(kBin + "/transformer_hpc " THPC_SOURCE_DIR
                                        "/input/tiny.ini --checkpoint.dir=full/ck3 --dry-run");
  EXPECT_EQ(dry.exit_code, 2) << dry.output;
  EXPECT_NE(dry.output.find("cannot be written: creating its lock full/ck3/trainer.lock would "
                            "fail (No space left on device): " + full + "full is full"),
            std::string::npos)
      << dry.output;
  EXPECT_FALSE(fs::exists("full/ck3"));
  expect_storage_failure("true", "transformer_average --inputs model.h5 --output full/avg.h5",
                         "checkpoint full/avg.h5", full + "full is full", "full");
  expect_storage_failure("true",
                         "transformer_decode --greedy --checkpoint model.h5 --input text/train.en "
                         "--output full/out.de",
                         "output file full/out.de", full + "full is full", "full");
  expect_storage_failure("true",
                         "transformer_preprocess --source-lang en --target-lang de --trainpref "
                         "text/train --validpref text/valid --destdir full/data --vocab-size 100 "
                         "--model-type bpe --seed 1",
                         "full/data/", full + "full/data is full", "full");
  // A file system mounted read-only is said so (before: "full (0 KiB left)", as was sysfs,
  // which holds no files: a helper's trial, --destdir /sys/kernel).
  fs::create_directories("ro");
  if (::mount("tmpfs", "ro", "tmpfs", MS_RDONLY, "size=1m") == 0) {
    struct UnmountReadOnly {
      ~UnmountReadOnly() { ::umount2((fs::current_path() / "ro").c_str(), MNT_DETACH); }
    } unmount_read_only;
    const ProcessResult run = run_process(
        kBin + "/transformer_preprocess --source-lang en --target-lang de --trainpref "
        "text/train --validpref text/valid --destdir ro --vocab-size 100");
    EXPECT_EQ(run.exit_code, 1) << run.output;
    EXPECT_NE(run.output.find("the file system of ro is mounted read-only: write elsewhere"),
              std::string::npos)
        << run.output;
  }
  // Out of inodes (a scratch file system's quota of files): the temporary file cannot be
  // made, which the claim said as "another program may be writing" it.
  fs::create_directories("inodes");
  if (::mount("tmpfs", "inodes", "tmpfs", 0, "size=32m,nr_inodes=2") != 0) return;
  struct UnmountInodes {
    ~UnmountInodes() { ::umount2((fs::current_path() / "inodes").c_str(), MNT_DETACH); }
  } unmount_inodes;
  std::ofstream("inodes/filler") << "x";
  expect_storage_failure("true", "transformer_quantize --checkpoint model.h5 --output "
                                 "inodes/int8.h5",
                         "cannot create its temporary file inodes/.int8.h5.tmp: No space left "
                         "on device (errno 28)",
                         full + "inodes can hold no more files (no inodes left", "inodes");
}


// Ctrl-C (or the scheduler's SIGTERM, or a closed terminal's SIGHUP) while preprocessing
// left its .partial scratch files beside the data (issue 54): the tools remove their
// temporary files and end as the signal would have. SIGINT is tested where this process
// does not ignore it (a background job's children inherit it ignored, and keep it so).
TEST_F(ToolOutputs, AnInterruptedToolLeavesNoPartialFile) {
  const ProcessResult corpus = run_process(
      "python3 " THPC_SOURCE_DIR "/tools/make_numbers_corpus.py --train 100000 --valid 8 "
      "--test 2 --seed 1 --out text > /dev/null");
  ASSERT_EQ(corpus.exit_code, 0) << corpus.output;
  std::vector<int> signals = {SIGTERM};
  struct sigaction current {};
  if (::sigaction(SIGINT, nullptr, &current) == 0 && current.sa_handler != SIG_IGN) {
    signals.push_back(SIGINT);
  }
  for (const int signal_number : signals) {
    SCOPED_TRACE(strsignal(signal_number));
    const std::string destdir = "data_" + std::to_string(signal_number);
    FILE* output = nullptr;
    const pid_t pid = start_process(
        {kBin + "/transformer_preprocess", "--source-lang", "en", "--target-lang", "de",
         "--trainpref", "text/train", "--validpref", "text/valid", "--destdir", destdir,
         "--vocab-size", "100", "--model-type", "bpe", "--seed", "1", "--spm-sentences", "2000"},
        &output);
    ASSERT_GT(pid, 0);
    // Once its scratch files exist (the text is being encoded).
    const auto partial_files = [&] {
      int count = 0;
      std::error_code error;
      for (const fs::directory_entry& entry : fs::directory_iterator(destdir, error)) {
        count += entry.path().filename().string().find(".partial") != std::string::npos;
      }
      return count;
    };
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (partial_files() == 0 && std::chrono::steady_clock::now() < deadline) ::usleep(2000);
    ASSERT_GT(partial_files(), 0) << "no scratch file appeared";
    ::kill(pid, signal_number);
    int status = 0;
    const std::string log = finish_process(pid, output, &status);
    EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == signal_number) << status << "\n" << log;
    // Said, for a batch job's log that holds nothing else (the summary comes at the end).
    EXPECT_NE(log.find("transformer_preprocess: interrupted before the end: its partial "
                       "files are removed and " + destdir + " holds what it held before "
                       "this run (an earlier corpus there is untouched); run the command "
                       "again to preprocess\n"),
              std::string::npos)
        << log;
    EXPECT_EQ(partial_files(), 0);
    for (const fs::directory_entry& entry : fs::directory_iterator(destdir)) {
      ADD_FAILURE() << "left behind: " << entry.path();
    }
  }
}

// A decode to --output FILE that a signal ends: the file appears only whole, so its
// temporary one is removed and the translations made so far are gone, which the program
// now says, with the way to keep them (before: it ended without a word, a long
// back-translation lost; a helper's finding). Standard output keeps what was written.
TEST_F(ToolOutputs, AnInterruptedDecodeToAFileSaysTheTranslationsAreGoneAndHowToKeepThem) {
  train_a_model();
  {
    std::ofstream many("many.en");
    const std::string lines = read_file("source.en");
    for (int i = 0; i < 2000; ++i) many << lines;
  }
  FILE* output = nullptr;
  const pid_t pid =
      start_process({kBin + "/transformer_decode", "--greedy", "--checkpoint", "model.h5",
                     "--input", "many.en", "--output", "out.de", "--buffer-sentences", "100"},
                    &output);
  ASSERT_GT(pid, 0);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (!fs::exists(".out.de.tmp") && std::chrono::steady_clock::now() < deadline) {
    ::usleep(2000);
  }
  ASSERT_TRUE(fs::exists(".out.de.tmp")) << "no temporary output appeared";
  // Past its registration for removal, microseconds after the file is made (the decode of
  // the 16,000 lines takes seconds).
  ::usleep(50000);
  ::kill(pid, SIGTERM);
  int status = 0;
  const std::string log = finish_process(pid, output, &status);
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGTERM) << status << "\n" << log;
  EXPECT_NE(log.find("transformer_decode: interrupted: out.de is not written (--output FILE "
                     "appears only whole, at the end)"),
            std::string::npos)
      << log;
  EXPECT_NE(log.find("write to standard output instead: > out.de\n"), std::string::npos) << log;
  EXPECT_FALSE(fs::exists(".out.de.tmp"));
  EXPECT_FALSE(fs::exists("out.de"));
}

// An interrupt while a corpus takes the place of an earlier one in --destdir: the earlier
// shards were removed before the new ones were renamed into place, and an interrupt
// between (the syncs of a large corpus took seconds) left neither corpus, spm.model alone
// (a helper's finding). Now the renames and the removal of what they do not replace wait
// for no signal: the new corpus is whole, the earlier one's extra shard gone, and the tool
// then ends as the signal would have, saying so.
TEST_F(ToolOutputs, AnInterruptWhileACorpusReplacesAnotherLeavesAWholeOne) {
  const ProcessResult corpus = run_process(
      "python3 " THPC_SOURCE_DIR "/tools/make_numbers_corpus.py --train 2000 --valid 8 "
      "--test 2 --seed 1 --out text > /dev/null");
  ASSERT_EQ(corpus.exit_code, 0) << corpus.output;
  const std::string preprocess = kBin + "/transformer_preprocess --source-lang en "
                                 "--target-lang de --trainpref text/train --validpref "
                                 "text/valid --destdir data --vocab-size 100 --model-type bpe "
                                 "--seed 1";
  // The earlier corpus: 3 training shards and a test split the next run lacks.
  const ProcessResult earlier =
      run_process(preprocess + " --testpref text/test --shards 3 > /dev/null");
  ASSERT_EQ(earlier.exit_code, 0) << earlier.output;
  ASSERT_TRUE(fs::exists("data/test.00000.h5"));
  int status = 0;
  const std::string log = interrupted_while_renaming(
      {"transformer_preprocess", "--source-lang", "en", "--target-lang", "de", "--trainpref",
       "text/train", "--validpref", "text/valid", "--destdir", "data", "--vocab-size", "100",
       "--model-type", "bpe", "--seed", "2", "--shards", "2"},
      &status);
  ASSERT_NE(log.find("test hook: renaming into place"), std::string::npos) << log;
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGTERM) << status << "\n" << log;
  EXPECT_NE(log.find("came while the corpus was put in place: it is complete in data; "
                     "stopping now"),
            std::string::npos)
      << log;
  // Not also the line of a run stopped before its corpus was in place.
  EXPECT_EQ(log.find("holds what it held before this run"), std::string::npos) << log;
  std::set<std::string> names;
  for (const fs::directory_entry& entry : fs::directory_iterator("data")) {
    names.insert(entry.path().filename().string());
  }
  EXPECT_EQ(names, (std::set<std::string>{"spm.model", "train.00000.h5", "train.00001.h5",
                                          "valid.00000.h5"}));
  // ... and the trainer's reader takes it as one corpus.
  const ProcessResult again = run_process(kBin + "/transformer_data_stats data");
  EXPECT_EQ(again.exit_code, 0) << again.output;
}

// A failure in the system's words (the project's own writers: std::strerror) is read as
// one in HDF5's "(errno N)": a full file system or quota with 16 MiB or more left was
// "check its directory's permissions and space" (a review of the metrics file's start).
TEST(StorageAdvice, ReadsTheSystemsWordsAsItReadsErrnoNumbers) {
  const std::string dir = fs::temp_directory_path().string();
  for (const int error : {ENOSPC, EDQUOT}) {
    const std::string failure =
        "cannot write the metrics file m.jsonl (" + std::string(std::strerror(error)) + ")";
    const std::string advice = storage_advice(dir, failure, 0);
    EXPECT_NE(advice.find("the file system (or this user's quota) of " + dir), std::string::npos)
        << failure << ": " << advice;
  }
  EXPECT_EQ(storage_advice(dir, "cannot write m.jsonl (Permission denied)", 0), "");
}

}  // namespace
}  // namespace thpc
