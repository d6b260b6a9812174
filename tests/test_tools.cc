// The harness every program beside the trainer shares (tools/tool_main.h), run as a user
// runs the programs: --help exits 0 and shows the defaults, a bad command line exits 2
// with one line "NAME: PROBLEM (see --help)", a runtime failure exits 1 with one line
// "NAME: error: PROBLEM".
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <functional>
#include <fstream>
#include <regex>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "common/source_version.h"
#include "data/shard_file.h"
#include "data/shard_reader.h"
#include "program.h"
#include "tools/progress.h"

namespace thpc {
namespace {

namespace fs = std::filesystem;

struct Tool {
  std::string name;
  // --help must show these: the usage line and each option default there is.
  std::vector<std::string> help_mentions;
  // Arguments that make the program fail at run time (a file that does not exist).
  std::string failing_arguments;
  // An option that takes a value, as the user spells it, and how the error names it.
  std::string option_with_value, option_named = option_with_value;
};

const std::vector<Tool>& tools() {
  static const std::vector<Tool> all = {
      {"transformer_preprocess",
       {"usage: transformer_preprocess", "--vocab-size arg (=37000)", "--model-type arg (=bpe)",
        "--shards arg (=1)", "--max-len arg (=250)", "--valid-max-len arg (=1024)",
        "--max-ratio arg (=9)", "--seed arg (=1)",
        "--threads arg (=0)", "--spm-sentences arg (=10000000)"},
       "--source-lang en --target-lang de --trainpref /nonexistent/train "
       "--validpref /nonexistent/valid --destdir /nonexistent/out", "--vocab-size"},
      {"transformer_decode",
       {"usage: transformer_decode", "--input arg (=-)", "--output arg (=-)",
        "--batch-tokens arg (=4096)", "--nbest arg (=1)",
        // Boost wraps the descriptions: fragments within one line.
        "(default: the checkpoint's decode.beam", "decode.alpha", "decode.max_len_a/b",
        "one stored in the checkpoint;", "(default: the checkpoint's train.threads)"},
       "--checkpoint /nonexistent.h5 --spm-model /nonexistent.model < /dev/null", "--beam"},
      {"transformer_average",
       {"usage: transformer_average", "--inputs", "--last", "--output"},
       // The output in a writable place: an unwritable one is refused before (exit 2).
       "--inputs /nonexistent.h5 --output /tmp/thpc_never_written/average.h5", "--output"},
      {"transformer_quantize",
       {"usage: transformer_quantize", "--checkpoint", "--output", "--type arg (=int8)"},
       // The output in a writable place: an unwritable one is refused before (exit 2).
       "--checkpoint /nonexistent.h5 --output /tmp/thpc_never_written/quantized.h5", "--output"},
      {"transformer_data_stats",
       {"usage: transformer_data_stats", "--prefix arg (=train)",
        "--tokens-per-step arg (=25000)", "--ranks arg (=1)", "--accumulate arg (=1)",
        "--epochs arg (=1)", "--memory-mb arg (=4096)"},
       "/nonexistent", "--prefix"},
      {"transformer_bench_step",
       {"usage: transformer_bench_step", "--spec-tflops arg (=989.4)",
        "--config arg (=input/base.ini)",
        "--tokens arg (=25000)", "--steps arg (=60)", "--warmup-steps arg (=15)",
        "--vocab arg (=37000)", "--backend arg (=auto)", "--precision arg (=bf16)",
        "--peak-tflops arg (=790)"},
       // (a missing --config is a usage error, as the trainer's: OutOfRange... below)
       "--backend cpu --config " THPC_SOURCE_DIR
       "/input/tiny.ini --program-batches --set data.dir=/nonexistent",
       "--steps"},
      {"transformer_score",
       {"usage: transformer_score", "(default, or -: standard input)", "13a (default)",
        "exp (default)", "(default 0.1)", "(default 4)", "(default 1)"},
       "/nonexistent.ref -i /nonexistent.hyp", "-tok", "--tokenize"},
      {"transformer_evalb",
       {"usage: transformer_evalb", "(default: EVALB's built-in defaults)"},
       "/nonexistent.gold /nonexistent.test", "-e"},
      {"transformer_trees",
       {"usage: transformer_trees", "SEQ, or standard input", "--leaves XX|words (=XX)",
        "--input SEQ"},
       "linearize --output /tmp/thpc_never_written/out /nonexistent.mrg", "--output"},
  };
  return all;
}

std::string program(const Tool& tool) { return thpc::binary_dir() + "/" + tool.name; }

// Runs of spaces and line ends as one space: where --help wraps a description depends on
// the longest option's name.
std::string one_line(const std::string& text) {
  std::string line;
  for (const char c : text) {
    const bool space = c == ' ' || c == '\n';
    if (!space || line.empty() || line.back() != ' ') line += space ? ' ' : c;
  }
  return line;
}

// A reader that leaves before the text is written (`--help | head -1`) is no failure:
// the trainer, which ignores SIGPIPE (a log's reader gone must not end a run), said
// "writing the standard output failed", exit 1, as often as head left first (a helper's
// trial). `| true` leaves before the program has started. (The tools keep SIGPIPE's
// default: they end silently, 141, as any program in a pipe does.)
TEST(Tools, HelpIntoAPipeWhoseReaderLeftExitsZeroWithoutAWord) {
  const ProcessResult result = run_process("bash -c 'set -o pipefail; " + thpc::binary_dir() +
                                           "/transformer_hpc --help | true'");
  EXPECT_EQ(result.exit_code, 0) << result.output;
  EXPECT_EQ(result.output, "");
}

TEST(Tools, HelpExitsZeroAndShowsTheDefaults) {
  for (const Tool& tool : tools()) {
    SCOPED_TRACE(tool.name);
    const ProcessResult result = run_process(program(tool) + " --help");
    EXPECT_EQ(result.exit_code, 0) << result.output;
    for (const std::string& mention : tool.help_mentions) {
      EXPECT_NE(one_line(result.output).find(one_line(mention)), std::string::npos)
          << "--help lacks '" << mention << "':\n"
          << result.output;
    }
  }
}

// -h is --help in every program, as in fairseq's, Marian's and sacreBLEU's (six of them
// said "unrecognised option '-h'").
TEST(Tools, DashHIsHelp) {
  std::vector<Tool> programs = tools();
  programs.push_back(Tool{"transformer_hpc", {}, "", ""});
  for (const Tool& tool : programs) {
    SCOPED_TRACE(tool.name);
    const ProcessResult dash_h = run_process(program(tool) + " -h");
    const ProcessResult help = run_process(program(tool) + " --help");
    EXPECT_EQ(dash_h.exit_code, 0) << dash_h.output;
    EXPECT_EQ(dash_h.output, help.output);
  }
}

// --version names the program and the commit it was built from, one line, exit 0, as a
// user's report or an HPC centre's module needs (no program had it; a helper's trial), and
// answers alone wherever it stands among other arguments; --help lists it.
TEST(Tools, VersionNamesTheCommitTheProgramWasBuiltFrom) {
  const std::string version = source_version();
  EXPECT_TRUE(version == "unknown" ||
              std::regex_match(version, std::regex("git [0-9a-f]{12}(-dirty)? of "
                                                   "[0-9]{4}-[0-9]{2}-[0-9]{2}")))
      << version;
  std::vector<Tool> programs = tools();
  programs.push_back(Tool{"transformer_hpc", {}, "", ""});
  for (const Tool& tool : programs) {
    SCOPED_TRACE(tool.name);
    const ProcessResult result = run_process(program(tool) + " --version");
    EXPECT_EQ(result.exit_code, 0) << result.output;
    EXPECT_EQ(result.output, tool.name + " " + version + "\n");
    EXPECT_NE(run_process(program(tool) + " --help").output.find("--version"), std::string::npos);
    if (tool.name != "transformer_hpc") {
      const ProcessResult among = run_process(program(tool) + " --bogus 1 --version");
      EXPECT_EQ(among.exit_code, 0) << among.output;
      EXPECT_EQ(among.output, result.output);
    }
  }
}

// The program run with `arguments` exits `exit_code` after one line that begins with
// `start` and holds each of `mentions`.
void expect_one_line_failure(const Tool& tool, const std::string& arguments, int exit_code,
                             const std::string& start, const std::vector<std::string>& mentions) {
  SCOPED_TRACE(tool.name);
  const ProcessResult result = run_process(program(tool) + " " + arguments);
  EXPECT_EQ(result.exit_code, exit_code) << result.output;
  EXPECT_EQ(lines_of(result.output).size(), 1u) << result.output;
  EXPECT_EQ(result.output.rfind(start, 0), 0u) << result.output;
  for (const std::string& mention : mentions) {
    EXPECT_NE(result.output.find(mention), std::string::npos) << result.output;
  }
}

TEST(Tools, BadCommandLineExitsTwoWithOneLineNamingTheProgram) {
  for (const Tool& tool : tools()) {
    expect_one_line_failure(tool, "--no-such-option", 2, tool.name + ": ",
                            {"--no-such-option", "(see --help)"});
  }
}

// An option given last without its value: a bad command line whose one line names the
// option as the tool spells it (-e, not Boost's "--e" for a short-only option).
TEST(Tools, MissingValueExitsTwoNamingTheOption) {
  for (const Tool& tool : tools()) {
    expect_one_line_failure(tool, tool.option_with_value, 2, tool.name + ": ",
                            {"'" + tool.option_named + "'", "(see --help)"});
  }
}

TEST(Tools, RuntimeFailureExitsOneWithOneLineNamingTheProgram) {
  for (const Tool& tool : tools()) {
    expect_one_line_failure(tool, tool.failing_arguments, 1, tool.name + ": error: ",
                            {"/nonexistent"});
  }
}

// A text input that is a compressed file or an HDF5 file (a checkpoint, a shard) is said
// as such by every program that reads text, naming the file and what to do (before: its
// first byte past ASCII read as invalid UTF-8, with advice to convert it from Latin-1;
// transformer_evalb and transformer_trees read the bytes as trees). transformer_decode's
// case is in test_decode.cc. A line of text that begins as bzip2's magic does is text.
TEST(Tools, ACompressedOrHdf5TextInputIsSaidAsSuch) {
  const fs::path dir = fs::temp_directory_path() / ("thpc_binary_text_" +
                                                    std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string gz = (dir / "text.en").string(), xz = (dir / "text.de").string();
  std::ofstream(gz, std::ios::binary) << std::string("\x1f\x8b\x08\x00\x00\x00", 6);
  std::ofstream(xz, std::ios::binary) << std::string("\xfd" "7zXZ\0\0\x04", 8);
  const std::string h5 = (dir / "shard.h5").string();
  // HDF5's signature past a user block, as a checkpoint's header of 512 bytes puts it.
  std::ofstream(h5, std::ios::binary) << std::string(512, 'c')
                                      << std::string("\x89HDF\r\n\x1a\n", 8)
                                      << std::string(100, '\0');
  const std::string utf16 = (dir / "windows.txt").string();
  std::ofstream(utf16, std::ios::binary) << std::string("\xff\xfe" "a\0 \0b\0\n\0", 10);
  const std::string text = (dir / "plain.txt").string();
  std::ofstream(text) << "BZh is how this sentence begins .\n";
  const std::string bin = binary_dir() + "/";
  struct Case {
    std::string command, file, is;
  };
  const std::string gzip_is = "is gzip-compressed, not text: decompress it first (gunzip -k " +
                              gz + ")";
  const std::string hdf5_is = "is an HDF5 file (a checkpoint or a data shard?), not text";
  const std::vector<Case> cases = {
      {bin + "transformer_score " + text + " -i " + gz, gz, gzip_is},
      {bin + "transformer_score " + h5 + " -i " + text, h5, hdf5_is},
      {bin + "transformer_score " + text + " -i " + xz, xz,
       "is xz-compressed, not text: decompress it first (unxz -k " + xz + ")"},
      {bin + "transformer_score " + utf16 + " -i " + text, utf16,
       "is UTF-16 text (its byte-order mark), not UTF-8: convert it first (iconv -f UTF-16 -t "
       "UTF-8 " + utf16 + " > NEW)"},
      {bin + "transformer_evalb " + gz + " " + text, gz,
       "is gzip-compressed, not text (the gold file): decompress it first (gunzip -k " + gz +
           ")"},
      {bin + "transformer_evalb -p " + h5 + " " + text + " " + text, h5,
       "is an HDF5 file (a checkpoint or a data shard?), not text (the EVALB parameter file)"},
      {bin + "transformer_trees linearize --output " + (dir / "o").string() + " " + h5, h5,
       hdf5_is},
      {bin + "transformer_preprocess --source-lang en --target-lang de --trainpref " +
           (dir / "text").string() + " --validpref " + (dir / "text").string() +
           " --destdir " + (dir / "out").string(),
       gz, gzip_is},
  };
  for (const Case& c : cases) {
    const ProcessResult result = run_process(c.command);
    EXPECT_EQ(result.exit_code, 1) << c.command << "\n" << result.output;
    EXPECT_NE(result.output.find(c.file + ": " + c.is), std::string::npos)
        << c.command << "\n" << result.output;
    EXPECT_EQ(result.output.find("LATIN1"), std::string::npos) << result.output;
  }
  const ProcessResult plain = run_process(bin + "transformer_score " + text + " -i " + text);
  EXPECT_EQ(plain.exit_code, 0) << plain.output;
  fs::remove_all(dir);
}

// A number out of its option's range is a usage error whose line names that option and
// the value given, as transformer_preprocess's do (test_data.cc), not every option that
// has a range: "--beam must be >= 1, got 0".
TEST(Tools, OutOfRangeNamesTheOptionAndTheValueGiven) {
  const std::string decode = "--checkpoint /nonexistent.h5 < /dev/null ";
  const std::string base = std::string(THPC_SOURCE_DIR) + "/input/base.ini";
  for (const auto& [name, arguments, message] :
       std::vector<std::tuple<std::string, std::string, std::string>>{
           {"transformer_decode", decode + "--beam 0", "--beam must be >= 1, got 0"},
           {"transformer_decode", decode + "--nbest 0", "--nbest must be >= 1, got 0"},
           {"transformer_decode", decode + "--batch-tokens -3",
            "--batch-tokens must be >= 1, got -3"},
           {"transformer_decode", decode + "--batch-sentences -1",
            "--batch-sentences must be >= 0 (0: no limit), got -1"},
           {"transformer_decode", decode + "--gpu-workers 0", "--gpu-workers must be >= 1, got 0"},
           {"transformer_decode", decode + "--max-len-a -1", "--max-len-a must be >= 0, got -1"},
           {"transformer_decode", decode + "--max-len-a inf", "--max-len-a must be finite, got inf"},
           {"transformer_decode", decode + "--max-len-b -5", "--max-len-b must be >= 0, got -5"},
           {"transformer_decode", decode + "--lenpen -0.5",
            "--lenpen must be >= 0 (§6.1: 0.6), got -0.5"},
           {"transformer_decode", decode + "--lenpen nan",
            "--lenpen must be >= 0 (§6.1: 0.6), got nan"},
           {"transformer_decode", decode + "--lenpen inf",
            "--lenpen must be finite (an infinite alpha makes every score -0), got inf"},
           {"transformer_decode", decode + "--threads -2",
            "--threads must be >= 0 (0: one per core), got -2"},
           // A negative number in a list ends the list and is read as an option's name
           // (before: "unrecognised option '-1'", and nothing of --weights).
           {"transformer_decode", decode + "--weights 1 -1",
            "--weights: '-1' after it is read as an option's name, not as one of its "
            "values: a value of --weights cannot begin with '-'"},
           {"transformer_decode", decode + "--threads 1 -1", "unrecognised option '-1'"},
           // Several unknown options are said together (Boost stops at the first: a user
           // with two learnt of one a run), with their values or without; one alone as
           // before; a number among them is left to its own message.
           {"transformer_decode", decode + "--foo 1 --bar",
            "2 unrecognised options: '--foo', '--bar'"},
           {"transformer_preprocess", "--foo=2 -q", "2 unrecognised options: '--foo', '-q'"},
           {"transformer_average", "--zz --yy=3", "2 unrecognised options: '--zz', '--yy'"},
           {"transformer_decode", decode + "--foo 1", "unrecognised option '--foo'"},
           {"transformer_decode", decode + "--foo --threads 1 -1", "unrecognised option '--foo'"},
           // Marian's and fairseq's names say what to write here (a Marian user's walk:
           // "unrecognised option" and nothing more), -n its different length penalty.
           {"transformer_decode", decode + "-b 4",
            "unrecognised option '-b' (a name from other toolkits: here it is --beam)"},
           {"transformer_decode", decode + "--mini-batch=16",
            "unrecognised option '--mini-batch' (a name from other toolkits: here it is "
            "--batch-sentences)"},
           {"transformer_decode", decode + "-n 0.6",
            "unrecognised option '-n' (a name from other toolkits: the length penalty is "
            "--lenpen, GNMT's ((5+|Y|)/6)^alpha, not Marian's |Y|^alpha: neither ranks as "
            "the other)"},
           {"transformer_decode", decode + "--normalize",
            "--normalize goes with --score-reference FILE (it divides each given line's score "
            "by its length); a translation's length penalty is --lenpen, GNMT's "
            "((5+|Y|)/6)^alpha, not Marian's |Y|^alpha"},
           {"transformer_preprocess", "-s en -t de",
            "unrecognised option '-s' (a name from other toolkits: here it is --source-lang)"},
           {"transformer_preprocess", "--valid-max-length 100",
            "unrecognised option '--valid-max-length' (a name from other toolkits: here it "
            "is --valid-max-len)"},
           // The list's option as typed (a short name), and a switch between the list and
           // the number is no list's (transformer_score's -lc, a one-dash long name).
           {"transformer_score", "/nonexistent -m bleu chrf -1",
            "-m: '-1' after it is read as an option's name, not as one of its values: a "
            "value of -m cannot begin with '-'"},
           {"transformer_score", "/nonexistent --metrics bleu -lc -1",
            "unrecognised option '-1'"},
           {"transformer_data_stats", "/nonexistent --accumulate 0",
            "--accumulate must be >= 1, got 0"},
           // DIR left out (before: "the option '--dir' is required but missing", where
           // the usage line shows DIR).
           {"transformer_data_stats", "", "DIR is missing: give it as the first argument (or "
                                          "as --dir)"},
           {"transformer_trees", "",
            "the first argument is missing: linearize, delinearize or baseline"},
           // DIR given both ways (before: "option '--dir' cannot be specified more than
           // once", which the user had typed once).
           {"transformer_data_stats", "/nonexistent --dir /nonexistent",
            "--dir is given twice: as an argument without an option and as --dir; give it "
            "once"},
           {"transformer_bench_step", "--tokens 0", "--tokens must be >= 1, got 0"},
           {"transformer_bench_step", "--warmup-steps -1", "--warmup-steps must be >= 0, got -1"},
           {"transformer_bench_step", "--vocab 4",
            "--vocab must be >= 5 (4 special ids + 1), got 4"},
           {"transformer_bench_step", "--spec-tflops 0", "--spec-tflops must be > 0, got 0"},
           {"transformer_bench_step", "--gemm-sweep -1", "--gemm-sweep must be >= 0, got -1"},
           // Its config, read as the trainer reads it, is part of the command line: a bad
           // --set or --config is a usage error, exit 2 (before: exit 1, after --help's
           // checks had passed).
           {"transformer_bench_step", "--config " + base + " --set model.layers=abc",
            base + ": model.layers: 'abc' is not an integer (on the command line)"},
           // What the tool passes on to the configuration is said as the user typed it
           // (before: "train.backend: 'gpu' ..." and "unknown command-line option
           // '--model.layerz=2'", words the command line never held).
           {"transformer_bench_step", "--backend gpu",
            "--backend: 'gpu' is not one of auto, cuda, cpu"},
           {"transformer_bench_step", "--precision fp16",
            "--precision: 'fp16' is not one of bf16, fp32"},
           {"transformer_bench_step", "--set layers=2",
            "--set 'layers=2': write --set SECTION.KEY=VALUE, e.g. --set model.layers=2"},
           {"transformer_bench_step", "--config /nonexistent.ini",
            "cannot open config file '/nonexistent.ini': no such file"},
           // (before: -1 read as 2^64 - 1, a seed like any other)
           {"transformer_preprocess",
            "--source-lang en --target-lang de --trainpref a --validpref b --destdir c "
            "--seed -1",
            "--seed '-1': expected a whole number from 0 to 2^64-1"},
           // A value that is not of the option's kind says which kind (before: Boost's
           // "the argument ('two') for option '--shards' is invalid").
           {"transformer_preprocess",
            "--source-lang en --target-lang de --trainpref a --validpref b --destdir c "
            "--shards two",
            "--shards: 'two' is not a whole number"},
           {"transformer_preprocess",
            "--source-lang en --target-lang de --trainpref a --validpref b --destdir c "
            "--shards 99999999999",
            "--shards: '99999999999' is too large"},
           {"transformer_preprocess",
            "--source-lang en --target-lang de --trainpref a --validpref b --destdir c "
            "--shards ''",
            "--shards: '' is not a whole number"},
           {"transformer_preprocess",
            "--source-lang en --target-lang de --trainpref a --validpref b --destdir c "
            "--seed 99999999999999999999",
            "--seed '99999999999999999999': expected a whole number from 0 to 2^64-1"},
           {"transformer_evalb", "-e two a b", "-e: 'two' is not a whole number"},
           {"transformer_evalb", "-c -5 a b", "-c must be >= 0, got -5"},
           {"transformer_evalb", "-e -1 a b", "-e must be >= 0, got -1"},
           // A short option typed with two dashes (before: "unrecognised option '-e'", the
           // option that exists, as if it were unknown).
           {"transformer_evalb", "--e 3 a b",
            "unrecognised option '--e': the option is -e, with one dash"},
           {"transformer_decode", decode + "--weights 1,-1",
            "--weights: '1,-1' is not a number (several are separate arguments: --weights "
            "1 0.5)"},
           {"transformer_decode", decode + "--lenpen abc", "--lenpen: 'abc' is not a number"},
           // A number past a float's range is one (before: "'1e39' is not a number").
           {"transformer_decode", decode + "--lenpen 1e39",
            "--lenpen: '1e39' is too large (a float holds 3.40282e+38 at most)"},
           // A path option given an empty value (a shell variable left unset) is refused
           // (before: evalb -p '' scored with EVALB's defaults, --testpref '' wrote no test
           // split, trees --input '' read the terminal).
           {"transformer_evalb", "-p '' a b",
            "-p is given an empty value (a variable left unset?): give a path, or leave the "
            "option out"},
           {"transformer_preprocess",
            "--source-lang en --target-lang de --trainpref a --validpref b --destdir c "
            "--testpref ''",
            "--testpref is given an empty value (a variable left unset?): give a path, or "
            "leave the option out"},
           {"transformer_trees", "delinearize --words w --tags t --input '' --output o",
            "--input is given an empty value (a variable left unset?): give a path, or "
            "leave the option out"},
           {"transformer_decode", decode + "--spm-model ''",
            "--spm-model is given an empty value (a variable left unset?): give a path, or "
            "leave the option out"}}) {
    SCOPED_TRACE(arguments);
    const Tool tool{name, {}, "", ""};
    expect_one_line_failure(tool, arguments, 2, name + ": " + message + " (see --help)", {});
  }
  // The keys --set takes are the trainer's, listed by its --help, not this tool's (before:
  // "see --help", whose text has none), and the mistake is said as typed (before:
  // "unknown command-line option '--model.bogus=3'", an option the user never gave).
  const Tool bench{"transformer_bench_step", {}, "", ""};
  expect_one_line_failure(bench, "--config " + base + " --set model.bogus=3", 2,
                          "transformer_bench_step: --set 'model.bogus=3': the configuration "
                          "has no key model.bogus (transformer_hpc --help lists the keys of "
                          "[model])\n",
                          {});
}

// An argument that no option and no positional slot takes is named, with how values are
// written (Boost's own line, "too many positional options have been specified", named
// none): transformer_quantize takes no bare argument, transformer_data_stats one.
TEST(Tools, AnArgumentNoOptionTakesIsNamed) {
  const Tool quantize{"transformer_quantize", {}, "", ""};
  expect_one_line_failure(quantize, "--output /nonexistent/q.h5 /nonexistent/model.h5", 2,
                          "transformer_quantize: unexpected argument '/nonexistent/model.h5': "
                          "every value follows its option's name (--name VALUE) (see --help)",
                          {});
  const Tool stats{"transformer_data_stats", {}, "", ""};
  expect_one_line_failure(stats, "/nonexistent/a --ranks 2 /nonexistent/b", 2,
                          "transformer_data_stats: unexpected argument '/nonexistent/b': the "
                          "command line takes 1 argument without an option's name",
                          {"(see --help)"});
}

// Sizes of transformer_data_stats out of range (issue 34's second probe: --ranks 0 was
// an internal check, --accumulate 0 a division by zero, SIGFPE) are usage errors.
TEST(Tools, DataStatsSizesOutOfRangeAreUsageErrors) {
  const Tool stats{"transformer_data_stats", {}, "", ""};
  for (const std::string arguments :
       {"/nonexistent --ranks 0", "/nonexistent --accumulate 0", "/nonexistent --tokens-per-step 0",
        "/nonexistent --tokens-per-step -5", "/nonexistent --epochs -1",
        // (read for minutes, its memory growing, before: a helper's trial)
        "/nonexistent --epochs 1000000000",
        "/nonexistent --memory-mb 0", "/nonexistent --tokens-per-step 3 --ranks 2 --accumulate 2",
        "/nonexistent --max-positions 1"}) {
    expect_one_line_failure(stats, arguments, 2, "transformer_data_stats: ", {"(see --help)"});
  }
}

// transformer_data_stats's CUDA-graph line on a corpus of sentences of many lengths read
// four epochs: the batches keep their sentences from epoch to epoch (only their order
// changes), so each shape's first pass runs uncaptured, its second is captured and the
// rest replay: of P passes over S shapes, P - 2S replay (model/capture_schedule.h).
// A shard `file` of `pairs` pairs of a vocabulary of 50, pair i of the lengths lengths(i)
// (source, target).
void write_pairs_shard(const fs::path& file, int pairs,
                       const std::function<std::pair<int, int>(int)>& lengths) {
  ShardContents contents;
  contents.metadata.vocab_size = 50;
  contents.metadata.source_lang = "en";
  contents.metadata.target_lang = "de";
  for (int i = 0; i < pairs; ++i) {
    const auto [source_length, target_length] = lengths(i);
    contents.source.append(std::vector<int>(size_t(source_length), 4 + i % 40));
    contents.target.append(std::vector<int>(size_t(target_length), 5 + i % 40));
  }
  write_shard(file.string(), contents);
}

// A directory `name` (made afresh) holding one training shard, train.00000.h5, of
// write_pairs_shard's pairs.
fs::path one_shard_corpus(const std::string& name, int pairs,
                          const std::function<std::pair<int, int>(int)>& lengths) {
  const fs::path dir = fs::temp_directory_path() / (name + "_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  write_pairs_shard(dir / "train.00000.h5", pairs, lengths);
  return dir;
}

TEST(Tools, DataStatsSaysHowManyPassesGraphsWouldReplay) {
  const fs::path dir = one_shard_corpus("thpc_data_stats", 400, [](int i) {
    return std::pair{1 + i % 37, 1 + (i * 7) % 29};
  });
  const ProcessResult result =
      run_process(thpc::binary_dir() + "/transformer_data_stats " + dir.string() +
                  " --tokens-per-step 300 --epochs 4");
  const ProcessResult one_epoch =
      run_process(thpc::binary_dir() + "/transformer_data_stats " + dir.string() +
                  " --tokens-per-step 300 --epochs 1");
  // The padding is the share of padded tokens, as the reader's own batches count it (a
  // mutation audit's share of the real tokens passed).
  ShardReaderSpec spec;
  spec.files = find_shards(dir.string(), "train", "the test's corpus");
  ShardReader reader(spec);
  int64_t padded = 0, real = 0;
  reader.seek(DataPosition{0, 0});
  while (std::optional<Batch> batch = reader.next_in_epoch(300)) {
    padded += static_cast<int64_t>(batch->src.size() + batch->tgt_in.size());
    real += batch->src_tokens() + batch->tgt_tokens();
  }
  char both[64];
  std::snprintf(both, sizeof both, "%.2f%% of padded tokens",
                100.0 * static_cast<double>(padded - real) / static_cast<double>(padded));
  EXPECT_NE(one_epoch.output.find(std::string("both ") + both), std::string::npos)
      << both << "\n" << one_epoch.output;
  fs::remove_all(dir);
  ASSERT_EQ(result.exit_code, 0) << result.output;
  // The fill and the padding are an epoch's, however many epochs are read (a mutation
  // audit's fill over one epoch's batches for four epochs' passes said 4x, and passed).
  for (const char* what : {"fill \\(rank 0's batches\\): [^\n]*",
                           "padding \\(rank 0's batches\\): [^\n]*"}) {
    std::smatch four, one;
    ASSERT_TRUE(std::regex_search(result.output, four, std::regex(what))) << result.output;
    ASSERT_TRUE(std::regex_search(one_epoch.output, one, std::regex(what))) << one_epoch.output;
    EXPECT_EQ(four.str(), one.str());
  }
  std::smatch found;
  const std::regex line(
      "CUDA graphs \\(step_graphs, rank 0's passes, 256 shapes kept\\): ([0-9]+) shapes in "
      "([0-9]+) passes; ([0-9.]+)% replay a graph, ([0-9.]+)% capture one, ([0-9.]+)% run "
      "uncaptured");
  ASSERT_TRUE(std::regex_search(result.output, found, line)) << result.output;
  const double shapes = std::stod(found[1]), passes = std::stod(found[2]);
  EXPECT_GT(shapes, 5) << "sentences of many lengths: many shapes";
  EXPECT_NEAR(std::stod(found[3]), 100.0 * (passes - 2 * shapes) / passes, 0.05);
  EXPECT_NEAR(std::stod(found[4]), 100.0 * shapes / passes, 0.05);
  EXPECT_NEAR(std::stod(found[5]), 100.0 * shapes / passes, 0.05);
}

// On several ranks a step's last micro-batch also starts the sums over the ranks, so its
// graph is another than the same shape's in an earlier micro-batch: the tool counts the
// shapes as the trainer's captures key them, (batch, lengths, summed), rank 0's share
// read at the per-rank budget (an audit's survivor: the flag was untested).
TEST(Tools, DataStatsKeysAStepsLastMicroBatchApartOnSeveralRanks) {
  // Three lengths: shapes recur, in earlier micro-batches and in last ones alike.
  const fs::path dir = one_shard_corpus("thpc_data_stats_ranks", 400, [](int i) {
    return std::pair{4 + 4 * (i % 3), 5 + 4 * (i % 3)};
  });
  // (ranks, accumulate) -> the shapes the tool says, and the distinct keys of rank 0's
  // batches counted here.
  for (const auto& [ranks, accumulate] : std::vector<std::pair<int, int>>{{1, 3}, {2, 3}}) {
    SCOPED_TRACE(std::to_string(ranks) + " ranks x " + std::to_string(accumulate));
    const int64_t tokens_per_step = 600;
    const ProcessResult stats = run_process(
        thpc::binary_dir() + "/transformer_data_stats " + dir.string() + " --tokens-per-step " +
        std::to_string(tokens_per_step) + " --ranks " + std::to_string(ranks) +
        " --accumulate " + std::to_string(accumulate));
    ASSERT_EQ(stats.exit_code, 0) << stats.output;
    ShardReaderSpec spec;
    spec.files = find_shards(dir.string(), "train", "the test's corpus");
    spec.ranks = ranks;
    ShardReader reader(spec);
    std::set<std::tuple<int, int, int, bool>> keys;
    int64_t passes = 0;
    reader.seek(DataPosition{0, 0});
    const int64_t budget = tokens_per_step / (int64_t{ranks} * accumulate);
    while (std::optional<Batch> batch = reader.next_in_epoch(budget)) {
      const bool summed = ranks > 1 && passes % accumulate == accumulate - 1;
      keys.emplace(batch->size, batch->src_len, batch->tgt_len, summed);
      ++passes;
    }
    ASSERT_LT(keys.size(), 256u) << "every shape kept: the count is the distinct keys";
    ASSERT_LT(keys.size() * 2, static_cast<size_t>(passes)) << "shapes recur";
    EXPECT_NE(stats.output.find(std::to_string(keys.size()) + " shapes in " +
                                std::to_string(passes) + " passes;"),
              std::string::npos)
        << keys.size() << " keys in " << passes << " passes\n" << stats.output;
  }
  fs::remove_all(dir);
}

// transformer_data_stats drops the pairs model.max_positions (--max-positions) leaves out,
// as the trainer does, and says how many: a corpus with one pair longer than both the
// positions and the budget was refused here ("does not fit a batch") and trained on (a
// helper's finding).
TEST(Tools, DataStatsDropsThePairsThePositionsLeaveOutAsTheTrainerDoes) {
  const fs::path dir = one_shard_corpus("thpc_data_stats_long", 40, [](int i) {
    const int length = i == 7 ? 60 : 1 + i % 9;
    return std::pair{length, length};
  });
  const std::string stats = thpc::binary_dir() + "/transformer_data_stats " + dir.string() +
                            " --tokens-per-step 40";
  const ProcessResult within = run_process(stats + " --max-positions 32");
  const ProcessResult without = run_process(stats);
  fs::remove_all(dir);
  EXPECT_EQ(within.exit_code, 0) << within.output;
  // (Said with this tool's option, not the trainer's key it stands for.)
  EXPECT_NE(within.output.find(": 1 of 40 pairs dropped: a side longer than 31 tokens does not "
                               "fit --max-positions"),
            std::string::npos)
      << within.output;
  EXPECT_NE(within.output.find(": 39 pairs, vocabulary 50"), std::string::npos) << within.output;
  // The trainer's default positions (1024) keep it: the budget is what refuses it then.
  EXPECT_EQ(without.exit_code, 1) << without.output;
  // ... and the advice names this tool's option, not the trainer's key it stands for,
  // with the least value that holds the pair, as the trainer says it (before: the pair's
  // tokens less eos/bos, "does not fit a batch of 40", and no value to give).
  for (const char* said : {"--tokens-per-step 40 gives each of the 1 micro-batches on each of "
                           "1 ranks 40 tokens, less than the longest pair of the data takes (",
                           " tokens a side with eos/bos, in ",
                           "); raise --tokens-per-step to at least "}) {
    EXPECT_NE(without.output.find(said), std::string::npos) << said << "\n" << without.output;
  }
}

// The trainer refuses a budget below the validation shards' longest pair too (it reads
// them at that budget at each validation): transformer_data_stats warns of it, and goes
// on (a run without validation reads no validation shards). Before, it passed a budget the
// trainer then refused at start-up.
TEST(Tools, DataStatsWarnsOfABudgetBelowTheValidationShardsLongestPair) {
  const fs::path dir = one_shard_corpus("thpc_data_stats_valid", 40, [](int i) {
    return std::pair{1 + i % 9, 1 + i % 9};
  });
  write_pairs_shard(dir / "valid.00000.h5", 3, [](int i) {
    const int length = std::vector<int>{5, 30, 7}[size_t(i)];
    return std::pair{length, length};
  });
  const std::string stats = thpc::binary_dir() + "/transformer_data_stats " + dir.string();
  const ProcessResult below = run_process(stats + " --tokens-per-step 20");
  const ProcessResult above = run_process(stats + " --tokens-per-step 40");
  const ProcessResult of_valid = run_process(stats + " --tokens-per-step 40 --prefix valid");
  // Validation shards the trainer would refuse for another reason (every pair over the
  // positions, 5, 30 and 7 tokens over 4): a warning too, the training shards' numbers
  // printed (they were an error).
  const ProcessResult refused = run_process(stats + " --tokens-per-step 40 --max-positions 5");
  // Whatever the training shards are called (the trainer reads data.valid all the same).
  fs::rename(dir / "train.00000.h5", dir / "mytrain.00000.h5");
  const ProcessResult renamed = run_process(stats + " --tokens-per-step 20 --prefix mytrain");
  fs::remove_all(dir);
  EXPECT_EQ(refused.exit_code, 0) << refused.output;
  EXPECT_NE(refused.output.find("transformer_data_stats: warning: the validation shards (valid) "
                                "would be refused by a run with train.valid_every > 0: "),
            std::string::npos)
      << refused.output;
  EXPECT_NE(refused.output.find("/train: 20 pairs, vocabulary 50"), std::string::npos)
      << refused.output;
  EXPECT_EQ(renamed.exit_code, 0) << renamed.output;
  EXPECT_NE(renamed.output.find("longest pair of the validation shards (valid, "),
            std::string::npos)
      << renamed.output;
  EXPECT_EQ(below.exit_code, 0) << below.output;
  // 30 tokens and eos/bos: 31 a side, in the one validation shard.
  for (const char* said : {"transformer_data_stats: warning: --tokens-per-step 20 gives each of "
                           "the 1 micro-batches on each of 1 ranks 20 tokens, less than the "
                           "longest pair of the validation shards (valid, ",
                           " takes (31 tokens a side with eos/bos, in ",
                           "valid.00000.h5); raise --tokens-per-step to at least 31, "}) {
    EXPECT_NE(below.output.find(said), std::string::npos) << said << "\n" << below.output;
  }
  EXPECT_NE(below.output.find(": 40 pairs, vocabulary 50"), std::string::npos) << below.output;
  EXPECT_EQ(above.exit_code, 0) << above.output;
  EXPECT_EQ(above.output.find("warning"), std::string::npos) << above.output;
  EXPECT_EQ(of_valid.exit_code, 0) << of_valid.output;
  EXPECT_EQ(of_valid.output.find("warning"), std::string::npos) << of_valid.output;
}

// Everything written to `file` (from its start), which is then closed.
std::string text_and_close(std::FILE* file) {
  std::rewind(file);
  std::string text;
  for (int c = std::fgetc(file); c != EOF; c = std::fgetc(file)) text.push_back(static_cast<char>(c));
  std::fclose(file);
  return text;
}

// The progress line the long tools show on a terminal: counts, share and time, rewritten
// in place with carriage returns, ended by a newline.
TEST(Tools, ProgressLineCountsTheItemsDone) {
  std::FILE* file = std::tmpfile();
  ASSERT_NE(file, nullptr);
  {
    tools::Progress progress("transformer_decode", "sentences", 10, file);
    progress.advance(3);  // the first call always shows (no line shown before)
    progress.advance(7);  // within 100 ms of the first: not shown until finish()
    progress.finish();
  }
  const std::string text = text_and_close(file);
  EXPECT_NE(text.find("\rtransformer_decode: 3/10 sentences (30%), "), std::string::npos) << text;
  EXPECT_NE(text.find("\rtransformer_decode: 10/10 sentences (100%), "), std::string::npos)
      << text;
  EXPECT_EQ(text.back(), '\n') << text;
}

// Off a terminal (here: the test's pipe) the tools print no progress at all, so batch
// logs hold no carriage returns.
TEST(Tools, NoProgressLineWhenStderrIsNotATerminal) {
  if (isatty(fileno(stderr))) GTEST_SKIP() << "stderr is a terminal here: run under ctest";
  tools::Progress progress("transformer_decode", "sentences", 10);
  testing::internal::CaptureStderr();
  progress.advance(10);
  progress.finish();
  EXPECT_EQ(testing::internal::GetCapturedStderr(), "");
}

// Library work in stages (common/progress.h): a line per stage, named after the tool and
// the stage, without a share when the total is unknown; each ended by a newline, also
// when the work fails half-way (the error message then starts a line of its own).
TEST(Tools, StageProgressShowsEachStageOnALineOfItsOwn) {
  std::FILE* file = std::tmpfile();
  ASSERT_NE(file, nullptr);
  {
    tools::StageProgress progress("transformer_preprocess", file);
    progress.begin("train", "lines read", ProgressListener::kUnknownTotal);
    progress.advance(4096);
    progress.begin("train", "lines encoded", 8192);  // ends the stage before
    progress.advance(4096);
    progress.end();
    progress.begin("", "checkpoints read", 2);
    progress.advance(1);  // shown, then the work "fails": no end()
  }
  const std::string text = text_and_close(file);
  EXPECT_EQ(text.back(), '\n') << text;
  const std::vector<std::string> lines = lines_of(text);
  ASSERT_EQ(lines.size(), 3u) << text;
  EXPECT_EQ(lines[0].rfind("\rtransformer_preprocess: train: 4096 lines read, ", 0), 0u)
      << lines[0];
  EXPECT_EQ(lines[0].find('%'), std::string::npos) << lines[0];
  EXPECT_EQ(lines[1].rfind("\rtransformer_preprocess: train: 4096/8192 lines encoded (50%), ", 0),
            0u)
      << lines[1];
  EXPECT_EQ(lines[2].rfind("\rtransformer_preprocess: 1/2 checkpoints read (50%), ", 0), 0u)
      << lines[2];
}

// A scratch directory for one test, removed at its end.
class ScratchDirectory {
 public:
  ScratchDirectory() {
    const auto* test = ::testing::UnitTest::GetInstance()->current_test_info();
    path_ = fs::temp_directory_path() /
            ("thpc_test_tools_" + std::to_string(::getpid()) + "_" + test->name());
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~ScratchDirectory() { fs::remove_all(path_); }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

// transformer_bench_step --program-batches times the steps transformer_hpc trains: the
// same batches (its training source at the same budget), the same dropout, schedule and
// optimizer, so after the warm-up's 2 and 4 timed steps its last loss is the trainer's at
// step 6 (printed to 4 decimals). What bench/program_vs_bench.sh relies on to compare
// the two programs' steps.
TEST(Tools, BenchStepWithTheProgramsBatchesTrainsAsTheTrainerDoes) {
  const ScratchDirectory scratch;
  const ProcessResult bench = run_process(
      thpc::binary_dir() + "/transformer_bench_step --config " THPC_SOURCE_DIR
      "/input/tiny.ini --backend cpu --precision fp32 --program-batches --tokens 1000 "
      "--steps 4 --warmup-steps 2");
  ASSERT_EQ(bench.exit_code, 0) << bench.output;
  const ProcessResult trainer = run_process(
      thpc::binary_dir() + "/transformer_hpc " THPC_SOURCE_DIR "/input/tiny.ini "
      "--train.max_steps=6 --checkpoint.dir=" + (scratch.path() / "checkpoints").string());
  ASSERT_EQ(trainer.exit_code, 0) << trainer.output;
  double bench_loss = 0.0, trainer_loss = 0.0;
  const size_t at = bench.output.find("\"final_loss\": ");
  ASSERT_NE(at, std::string::npos) << bench.output;
  ASSERT_EQ(std::sscanf(bench.output.c_str() + at, "\"final_loss\": %lf", &bench_loss), 1);
  const size_t final_line = trainer.output.find("final: step=6 loss=");
  ASSERT_NE(final_line, std::string::npos) << trainer.output;
  ASSERT_EQ(std::sscanf(trainer.output.c_str() + final_line, "final: step=6 loss=%lf",
                        &trainer_loss),
            1);
  EXPECT_NEAR(bench_loss, trainer_loss, 5.1e-5);  // the bench's 4 decimals
}

// --gemm-sweep times cuBLASLt's offers: on the CPU backend there are none, and the run
// says so after its JSON line instead of printing no sweep (or an empty total).
TEST(Tools, BenchStepSaysTheCpuHasNoGemmOffersToSweep) {
  const ProcessResult bench = run_process(
      thpc::binary_dir() + "/transformer_bench_step --config " THPC_SOURCE_DIR
      "/input/tiny.ini --backend cpu --precision fp32 --tokens 200 --steps 1 "
      "--warmup-steps 0 --set model.max_positions=96 --vocab 300 --gemm-sweep 4");
  ASSERT_EQ(bench.exit_code, 0) << bench.output;
  const size_t json = bench.output.find("{\"system\": \"transformer_hpc\"");
  const size_t skipped = bench.output.find(
      "gemm_sweep: skipped (the CPU backend: its products are a BLAS's, no cuBLASLt offers)");
  ASSERT_NE(json, std::string::npos) << bench.output;
  EXPECT_NE(skipped, std::string::npos) << bench.output;
  EXPECT_GT(skipped, json) << bench.output;
  EXPECT_EQ(bench.output.find("gemm_sweep_total"), std::string::npos) << bench.output;
}

// transformer_bench_step's own batches reach 96 positions a side: a config whose
// model.max_positions is shorter is refused naming the key and the --set that mends it
// (it ended in the model's internal check, "check failed: batch.src_len <= ...").
TEST(Tools, BenchStepRefusesPositionsShorterThanItsBatchesWithTheSetThatMendsIt) {
  const std::string bench = thpc::binary_dir() + "/transformer_bench_step --config "
                            THPC_SOURCE_DIR "/input/tiny.ini --backend cpu --tokens 40 "
                            "--steps 1 --warmup-steps 0";
  ProcessResult run = run_process(bench);
  EXPECT_EQ(run.exit_code, 1) << run.output;
  EXPECT_NE(run.output.find("model.max_positions = 64 is shorter than the benchmark's longest "
                            "batches (96 positions a side): add --set model.max_positions=96"),
            std::string::npos)
      << run.output;
  EXPECT_EQ(run.output.find("check failed"), std::string::npos) << run.output;
  run = run_process(bench + " --set model.max_positions=96");
  EXPECT_EQ(run.exit_code, 0) << run.output;
}

// transformer_preprocess on a terminal shows each split's lines read and encoded; in a
// pipe it shows nothing of them, and its own lines are the same either way.
TEST(Tools, PreprocessShowsItsProgressOnATerminalOnly) {
  const ScratchDirectory scratch;
  const std::string text = (scratch.path() / "text").string();
  const ProcessResult corpus = run_process(
      "python3 " THPC_SOURCE_DIR "/tools/make_numbers_corpus.py --train 400 --valid 60 "
      "--test 10 --seed 1 --out " + text);
  ASSERT_EQ(corpus.exit_code, 0) << corpus.output;
  const std::string command = thpc::binary_dir() +
                              "/transformer_preprocess --source-lang en --target-lang de "
                              "--trainpref " + text + "/train --validpref " + text +
                              "/valid --testpref " + text + "/test --vocab-size 120 --destdir ";
  const ProcessResult terminal = run_on_terminal(command + (scratch.path() / "a").string());
  const ProcessResult pipe = run_process(command + (scratch.path() / "b").string());
  ASSERT_EQ(terminal.exit_code, 0) << terminal.output;
  ASSERT_EQ(pipe.exit_code, 0) << pipe.output;
  // Both languages' lines: 2 x 400 training pairs, 2 x 60 validation, 2 x 10 test.
  for (const char* progress :
       {"\rtransformer_preprocess: train: 800 lines read, ",
        "\rtransformer_preprocess: valid: 120 lines read, ",
        "\rtransformer_preprocess: test: 20 lines read, ",
        "\rtransformer_preprocess: train: 800/800 lines encoded (100%), ",
        "\rtransformer_preprocess: valid: 120/120 lines encoded (100%), ",
        "\rtransformer_preprocess: test: 20/20 lines encoded (100%), "}) {
    EXPECT_NE(terminal.output.find(progress), std::string::npos) << progress << terminal.output;
  }
  EXPECT_EQ(pipe.output.find('\r'), std::string::npos) << pipe.output;
  EXPECT_EQ(pipe.output.find("lines read"), std::string::npos) << pipe.output;
  for (const char* line :
       {"\ntrain: 400 read, 400 kept, 0 dropped (0 empty, 0 too long, 0 over ratio)\n",
        "\nvalid: 60 read, 60 kept, 0 dropped (0 empty, 0 too long, 0 over ratio)\n",
        "\ntest: 10 read, 10 kept, 0 dropped (0 empty, 0 too long, 0 over ratio)\n",
        "\nwrote 1 train shard, valid, test and spm.model to ",
        // the total counts the test pairs too: 400 + 60 + 10 (A mutation audit's survivor.)
        ", 470 pairs (of 470 read) in "}) {
    EXPECT_NE(terminal.output.find(line), std::string::npos) << line << terminal.output;
    EXPECT_NE(pipe.output.find(line), std::string::npos) << line << pipe.output;
  }
}

// transformer_average on a terminal shows the checkpoints read; in a pipe it prints its
// two lines only.
TEST(Tools, AverageShowsItsProgressOnATerminalOnly) {
  const ScratchDirectory scratch;
  std::string inputs;
  for (int step = 1; step <= 3; ++step) {
    Checkpoint checkpoint;
    checkpoint.step = step;
    checkpoint.architecture = "one 2x2 tensor";
    checkpoint.config_ini = "[model]\n";
    checkpoint.params.push_back({"w", 2, 2, std::vector<float>(4, static_cast<float>(step))});
    const std::string path = (scratch.path() / checkpoint_file_name(step)).string();
    write_checkpoint(path, checkpoint);
    inputs += " " + path;
  }
  const std::string average = (scratch.path() / "average.h5").string();
  const std::string command = thpc::binary_dir() + "/transformer_average --inputs" +
                              inputs + " --output " + average;
  const std::string lines =
      "averaged 3 checkpoints:" + inputs + "\nwrote " + average + " (step 3, one 2x2 tensor)\n";
  const ProcessResult terminal = run_on_terminal(command);
  ASSERT_EQ(terminal.exit_code, 0) << terminal.output;
  EXPECT_EQ(terminal.output.rfind("\rtransformer_average: ", 0), 0u) << terminal.output;
  const size_t last = terminal.output.find("\rtransformer_average: 3/3 checkpoints read (100%), ");
  ASSERT_NE(last, std::string::npos) << terminal.output;
  EXPECT_EQ(terminal.output.substr(terminal.output.find('\n', last) + 1), lines);
  // (the second run replaces the first one's average, and says so)
  const ProcessResult pipe = run_process(command);
  ASSERT_EQ(pipe.exit_code, 0) << pipe.output;
  EXPECT_EQ(pipe.output, lines.substr(0, lines.size() - 2) +
                             "; replacing the earlier parameters-only checkpoint of step 3 "
                             "there, an average or a quantized model)\n");
}


// What a tool prints is its output: a score, a tree file or the resolved configuration
// written to a full disk (`> bleu.txt`) ends with exit 1 and one line saying so (before:
// exit 0, the file cut short or empty; transformer_decode alone said so).
TEST(Tools, AnOutputCutShortByAFullDiskExitsOne) {
  if (!fs::exists("/dev/full")) GTEST_SKIP() << "no /dev/full on this machine";
  const ScratchDirectory scratch;
  const std::string text = (scratch.path() / "text").string();
  std::ofstream(text) << "a small cat sat on the mat\nthe dog ran\n";
  const std::string failed = "error: writing the standard output failed (";
  for (const Tool& tool : tools()) {
    // (In a subshell: run_process sends standard error where standard output goes.)
    const ProcessResult help = run_process("(" + program(tool) + " --help > /dev/full)");
    EXPECT_EQ(help.exit_code, 1) << tool.name << ": " << help.output;
    EXPECT_NE(help.output.find(tool.name + ": " + failed), std::string::npos) << help.output;
  }
  const Tool score{"transformer_score", {}, "", ""};
  const ProcessResult scored = run_process("(" + program(score) + " " + text + " -i " + text +
                                           " > /dev/full)");
  EXPECT_EQ(scored.exit_code, 1) << scored.output;
  EXPECT_NE(scored.output.find("transformer_score: " + failed), std::string::npos)
      << scored.output;
  // transformer_trees says it before its summary, which named standard output as where
  // the trees went.
  const std::string words = (scratch.path() / "w").string(), tags = (scratch.path() / "t").string();
  std::ofstream(words) << "a b\n";
  std::ofstream(tags) << "X Y\n";
  const ProcessResult trees = run_process(
      "(" + program(Tool{"transformer_trees", {}, "", ""}) + " baseline --words " + words +
      " --tags " + tags + " --output - > /dev/full)");
  EXPECT_EQ(trees.exit_code, 1) << trees.output;
  EXPECT_NE(trees.output.find("transformer_trees: " + failed), std::string::npos) << trees.output;
  EXPECT_EQ(trees.output.find("-> standard output"), std::string::npos) << trees.output;
  // Closed, it is said so (it was guessed "a full disk or a file-size limit?").
  const ProcessResult closed =
      run_process("(" + program(score) + " " + text + " -i " + text + " >&-)");
  EXPECT_EQ(closed.exit_code, 1) << closed.output;
  EXPECT_NE(closed.output.find("transformer_score: error: standard output is closed (>&-)"),
            std::string::npos)
      << closed.output;
  // A tool whose standard output is a report of the files it wrote says they are whole
  // (the failure read as if the preprocessing had failed; a helper's finding).
  const std::string corpus = (scratch.path() / "corpus").string();
  std::ofstream(scratch.path() / "pair.en") << "a small cat sat\nthe dog ran\na cat\n";
  std::ofstream(scratch.path() / "pair.de") << "eine kleine Katze\nder Hund lief\neine Katze\n";
  const auto preprocess = [&](const std::string& destdir, const std::string& redirect) {
    return run_process("(" + program(Tool{"transformer_preprocess", {}, "", ""}) +
                       " --source-lang en --target-lang de --trainpref " +
                       (scratch.path() / "pair").string() + " --validpref " +
                       (scratch.path() / "pair").string() + " --destdir " + destdir +
                       " --vocab-size 30 " + redirect + ")");
  };
  const ProcessResult preprocessed = preprocess(corpus, "> /dev/full");
  EXPECT_EQ(preprocessed.exit_code, 1) << preprocessed.output;
  EXPECT_NE(preprocessed.output.find("transformer_preprocess: " + failed), std::string::npos)
      << preprocessed.output;
  // (Said of any tool's files: "the --output checkpoint it wrote are whole" read wrong.)
  const std::string whole = "(a report only: it wrote the shards and spm.model whole)";
  EXPECT_NE(preprocessed.output.find(whole), std::string::npos) << preprocessed.output;
  EXPECT_TRUE(fs::exists(corpus + "/train.00000.h5")) << preprocessed.output;
  // Started with standard output closed, the report is said lost as closed (it was
  // guessed a full disk), and no file it writes can take standard output's number.
  const ProcessResult closed_report = preprocess(corpus + "_closed", ">&-");
  EXPECT_EQ(closed_report.exit_code, 1) << closed_report.output;
  EXPECT_NE(closed_report.output.find("transformer_preprocess: error: standard output is "
                                      "closed (>&-)"),
            std::string::npos)
      << closed_report.output;
  EXPECT_NE(closed_report.output.find(whole), std::string::npos) << closed_report.output;
  const std::string trainer = program(Tool{"transformer_hpc", {}, "", ""});
  for (const std::string& arguments :
       {" " + std::string(THPC_SOURCE_DIR) + "/input/tiny.ini --dry-run", std::string(" --help")}) {
    const ProcessResult printed = run_process("(" + trainer + arguments + " > /dev/full)");
    EXPECT_EQ(printed.exit_code, 1) << arguments << ": " << printed.output;
    EXPECT_NE(printed.output.find("transformer_hpc: " + failed), std::string::npos)
        << printed.output;
  }
}

// The trainer's log into a full disk (`> train.log` past a quota): the log is lost, which
// is said once on standard error with the step and why, and training goes on to its end,
// exit 0, its checkpoints written (a helper's walk: the whole log, summary included, was
// lost without a word).
TEST(Tools, ATrainingLogIntoAFullDiskIsSaidLostOnceAndTrainingGoesOn) {
  if (!fs::exists("/dev/full")) GTEST_SKIP() << "no /dev/full on this machine";
  const ScratchDirectory scratch;
  const std::string run = (scratch.path() / "run").string();
  // (In a subshell: run_process sends standard error where standard output goes.)
  const ProcessResult trained = run_process(
      "(" + program(Tool{"transformer_hpc", {}, "", ""}) + " " THPC_SOURCE_DIR
      "/input/tiny.ini --train.backend=cpu --train.max_steps=4 --train.log_every=2 "
      "--checkpoint.every_steps=4 --checkpoint.dir=" + run + " > /dev/full)");
  EXPECT_EQ(trained.exit_code, 0) << trained.output;
  const std::string said = "transformer_hpc: warning: the log: writing the standard output "
                           "failed (";
  const size_t at = trained.output.find(said);
  ASSERT_NE(at, std::string::npos) << trained.output;
  EXPECT_EQ(trained.output.find(said, at + 1), std::string::npos) << "said once: "
                                                                     << trained.output;
  EXPECT_NE(trained.output.find("(noticed at step 2); training goes on, and its checkpoints "
                                "and metrics file are written\n"),
            std::string::npos)
      << trained.output;
  EXPECT_TRUE(fs::exists(fs::path(run) / "step_00000004.h5")) << trained.output;
}

// More threads than the cores the process may use (a cpuset, taskset, mpirun's binding)
// share them, each a fraction as fast: the trainer and the preprocessor say so, as
// transformer_decode did (a helper's walk: 8 threads on one core ran a tiny step 20 times
// slower, without a word).
TEST(Tools, MoreThreadsThanTheCoresItMayUseAreSaid) {
  if (run_process("taskset -c 0 true").exit_code != 0) GTEST_SKIP() << "no taskset here";
  const ScratchDirectory scratch;
  const ProcessResult trained = run_process(
      "taskset -c 0 " + program(Tool{"transformer_hpc", {}, "", ""}) + " " THPC_SOURCE_DIR
      "/input/tiny.ini --train.backend=cpu --train.max_steps=1 --train.threads=3 "
      "--checkpoint.dir=" + (scratch.path() / "run").string());
  EXPECT_EQ(trained.exit_code, 0) << trained.output;
  EXPECT_NE(trained.output.find("\nnote: train.threads = 3 is more than the 1 core this "
                                "process may use (its CPU affinity: "),
            std::string::npos)
      << trained.output;
  const ProcessResult fitting = run_process(
      "taskset -c 0 " + program(Tool{"transformer_hpc", {}, "", ""}) + " " THPC_SOURCE_DIR
      "/input/tiny.ini --train.backend=cpu --train.max_steps=1 --train.threads=1 "
      "--checkpoint.dir=" + (scratch.path() / "run1").string());
  EXPECT_EQ(fitting.exit_code, 0) << fitting.output;
  EXPECT_EQ(fitting.output.find("train.threads = "), std::string::npos) << fitting.output;
  std::ofstream(scratch.path() / "pair.en") << "a small cat sat\nthe dog ran\na cat\n";
  std::ofstream(scratch.path() / "pair.de") << "eine kleine Katze\nder Hund lief\neine Katze\n";
  const ProcessResult preprocessed = run_process(
      "taskset -c 0 " + program(Tool{"transformer_preprocess", {}, "", ""}) +
      " --source-lang en --target-lang de --trainpref " + (scratch.path() / "pair").string() +
      " --validpref " + (scratch.path() / "pair").string() + " --destdir " +
      (scratch.path() / "corpus").string() + " --vocab-size 30 --threads 2");
  EXPECT_EQ(preprocessed.exit_code, 0) << preprocessed.output;
  EXPECT_NE(preprocessed.output.find("note: --threads 2 is more than the 1 core this process "
                                     "may use (its CPU affinity: a batch system's cpuset, "
                                     "taskset, mpirun's binding): the threads share it, each "
                                     "a fraction as fast; give --threads 1 or fewer\n"),
            std::string::npos)
      << preprocessed.output;
}

// --help and --version of a process no launcher started answer before MPI's start-up,
// which fails where the program runs alone inside an `srun --pty bash` step or with an
// unusable TMPDIR (a helper's walk: both exited 1 with Open MPI's page of text). An
// unusable TMPDIR stops a run before MPI's start-up, in one line naming it, exit 2.
// (Under mpirun --help stays a mode the ranks agree on: test_distributed.)
TEST(Tools, TheTrainersHelpAndVersionAnswerWhereMpiCannotStart) {
  const ScratchDirectory scratch;
  const std::string file = (scratch.path() / "a_file").string();
  std::ofstream(file) << "not a directory";
  const std::string trainer = program(Tool{"transformer_hpc", {}, "", ""});
  // (-u: the suite may itself run in a launcher's step)
  const std::string alone = "env -u OMPI_COMM_WORLD_RANK -u PMIX_RANK -u PMI_RANK ";
  for (const std::string& environment :
       {"TMPDIR=" + file, std::string("SLURM_STEP_ID=0 SLURM_NODELIST=localhost")}) {
    SCOPED_TRACE(environment);
    const ProcessResult version = run_process(alone + environment + " " + trainer +
                                              " --version");
    EXPECT_EQ(version.exit_code, 0) << version.output;
    EXPECT_EQ(version.output, std::string("transformer_hpc ") + source_version() + "\n");
    const ProcessResult help = run_process(alone + environment + " " + trainer + " -h");
    EXPECT_EQ(help.exit_code, 0) << help.output;
    EXPECT_EQ(help.output.rfind("usage: transformer_hpc CONFIG.ini", 0), 0u) << help.output;
  }
  // --version needs no other rank: answered before MPI's start-up under a launcher's
  // variables too (an `srun --pty bash` step under PMI-2 passes PMI_RANK to its shell).
  const ProcessResult launched = run_process("env PMI_RANK=0 SLURM_STEP_ID=0 "
                                             "SLURM_NODELIST=localhost " +
                                             trainer + " --version");
  EXPECT_EQ(launched.exit_code, 0) << launched.output;
  EXPECT_EQ(launched.output, std::string("transformer_hpc ") + source_version() + "\n");
  const ProcessResult run = run_process(alone + "TMPDIR=" + file + " " + trainer +
                                        " " THPC_SOURCE_DIR "/input/tiny.ini --dry-run");
  EXPECT_EQ(run.exit_code, 2) << run.output;
  EXPECT_EQ(run.output, "transformer_hpc: error: TMPDIR=" + file + " is not a directory: "
                        "MPI's start-up keeps its session files there and would fail; set "
                        "TMPDIR to a directory this process can write (export TMPDIR=/tmp), "
                        "or unset it\n");
  // One that cannot be made (root may write anywhere but there), with the system's reason.
  const ProcessResult unmade = run_process(alone + "TMPDIR=" + file + "/tmp " + trainer +
                                           " " THPC_SOURCE_DIR "/input/tiny.ini --dry-run");
  EXPECT_EQ(unmade.exit_code, 2) << unmade.output;
  EXPECT_EQ(unmade.output.rfind("transformer_hpc: error: TMPDIR=" + file + "/tmp does not "
                                "exist and cannot be made (",
                                0),
            0u)
      << unmade.output;
  // One in which nothing can be made, which access() calls writable for root (/proc), is
  // tried as MPI uses it (a review's finding).
  if (fs::is_directory("/proc/self")) {
    const ProcessResult proc = run_process(alone + "TMPDIR=/proc " + trainer +
                                           " " THPC_SOURCE_DIR "/input/tiny.ini --dry-run");
    EXPECT_EQ(proc.exit_code, 2) << proc.output;
    EXPECT_EQ(proc.output.rfind("transformer_hpc: error: TMPDIR=/proc is a directory in which "
                                "this process cannot make one (",
                                0),
              0u)
        << proc.output;
  }
  // One still to be made is made, as MPI would, and the run goes on.
  const std::string to_make = (scratch.path() / "made" / "tmp").string();
  const ProcessResult made = run_process(alone + "TMPDIR=" + to_make + " " + trainer +
                                         " " THPC_SOURCE_DIR "/input/tiny.ini --dry-run");
  EXPECT_EQ(made.exit_code, 0) << made.output;
  EXPECT_TRUE(fs::is_directory(scratch.path() / "made" / "tmp"));
}

// tools/run_default_job.sh does not evaluate a training stopped by a signal (the trainer
// exits 0 after its checkpoint): before, it averaged, decoded and scored the few steps and
// exited 0. THPC_TEST_STOP_AT_STEP stops the trainer as a SIGTERM would. Run again with
// --checkpoint.resume=auto, as the stop line advises, it continues that run (it removed
// the checkpoints first and trained from step 0, exit 0: a helper's trial); a
// --checkpoint.dir of the user's, relative to the caller's directory and in either
// spelling, is used once (the job added its own, and the trainer refused the pair as
// "given more than once" after the whole preprocessing); --data.dir is refused at once.
TEST(Tools, TheDefaultJobDoesNotEvaluateAStoppedTrainingAndContinuesItWhenAsked) {
  // BUILD: the programs, through links, and the job's files beside them.
  // (terminated/: a run of its own, whose metrics are not the other runs')
  const ScratchDirectory scratch;
  const fs::path terminated_dir = scratch.path() / "terminated";
  fs::create_directories(terminated_dir);
  for (const fs::path& directory : {scratch.path(), terminated_dir}) {
    for (const char* name : {"transformer_hpc", "transformer_preprocess", "transformer_average",
                             "transformer_decode", "transformer_score"}) {
      fs::create_symlink(thpc::binary_dir() + "/" + name, directory / name);
    }
  }
  const std::string job = "cd " + scratch.path().string() + " && BUILD=. bash " +
                          std::string(THPC_SOURCE_DIR) +
                          "/tools/run_default_job.sh --model.layers=1 --model.d_model=32 "
                          "--model.d_ff=64 --model.heads=2 ";
  const ProcessResult stopped = run_process("export THPC_TEST_STOP_AT_STEP=2; " + job +
                                            "--train.max_steps=50 --checkpoint.dir mine");
  EXPECT_EQ(stopped.exit_code, 1) << stopped.output;
  EXPECT_NE(stopped.output.find("run_default_job.sh: the training was stopped before its end"),
            std::string::npos)
      << stopped.output;
  EXPECT_EQ(stopped.output.find("translations exact"), std::string::npos) << stopped.output;
  EXPECT_FALSE(fs::exists(scratch.path() / "numbers" / "eval" / "test.hyp"));
  EXPECT_TRUE(fs::exists(scratch.path() / "mine" / "step_00000002.h5")) << stopped.output;

  // A real SIGTERM to the script's whole process group (timeout's, the scheduler's): the
  // script waits for the trainer's checkpoint and says what to do, exit 1 (before: it
  // ended at once, exit 143, without a word; a helper's finding).
  const ProcessResult terminated = run_process(
      "cd " + terminated_dir.string() + " && (BUILD=. setsid bash " +
      std::string(THPC_SOURCE_DIR) + "/tools/run_default_job.sh --model.layers=1 "
      "--model.d_model=32 --model.d_ff=64 --model.heads=2 --train.max_steps=1000000 "
      "--train.max_minutes=3 --checkpoint.dir=term > term.txt 2>&1 & pid=$!; "
      "for i in $(seq 1200); do grep -qs '^step ' numbers/train.log && break; sleep 0.1; "
      "done; env kill -TERM -- -$pid; wait $pid; echo \"exit=$?\"; cat term.txt)");
  EXPECT_NE(terminated.output.find("exit=1"), std::string::npos) << terminated.output;
  EXPECT_NE(terminated.output.find("stopped: SIGTERM received"), std::string::npos)
      << terminated.output;
  EXPECT_NE(
      terminated.output.find("run_default_job.sh: the training was stopped before its end"),
      std::string::npos)
      << terminated.output;

  const ProcessResult continued =
      run_process(job + "--train.max_steps=4 --checkpoint.dir=mine --checkpoint.resume=auto");
  EXPECT_EQ(continued.exit_code, 0) << continued.output;
  EXPECT_NE(continued.output.find("summary: steps 2 (2 to 4)"), std::string::npos)
      << continued.output;
  EXPECT_NE(continued.output.find("translations exact (beam 4, average of the last 2"),
            std::string::npos)
      << continued.output;

  const ProcessResult other_data = run_process(job + "--data.dir=shards");
  EXPECT_EQ(other_data.exit_code, 2) << other_data.output;
  EXPECT_NE(other_data.output.find("--data.dir=shards: this job trains on the numbers corpus"),
            std::string::npos)
      << other_data.output;
}

}  // namespace
}  // namespace thpc
