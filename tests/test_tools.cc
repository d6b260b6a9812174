// The harness every program beside the trainer shares (tools/tool_main.h), run as a user
// runs the programs: --help exits 0 and shows the defaults, a bad command line exits 2
// with one line "NAME: PROBLEM (see --help)", a runtime failure exits 1 with one line
// "NAME: error: PROBLEM".
#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

#include "program.h"
#include "tools/progress.h"

namespace thpc {
namespace {

struct Tool {
  std::string name;
  // --help must show these: the usage line and each option default there is.
  std::vector<std::string> help_mentions;
  // Arguments that make the program fail at run time (a file that does not exist).
  std::string failing_arguments;
};

const std::vector<Tool>& tools() {
  static const std::vector<Tool> all = {
      {"transformer_preprocess",
       {"usage: transformer_preprocess", "--vocab-size arg (=37000)", "--model-type arg (=bpe)",
        "--shards arg (=1)", "--max-len arg (=250)", "--max-ratio arg (=9)", "--seed arg (=1)",
        "--threads arg (=0)", "--spm-sentences arg (=10000000)"},
       "--source-lang en --target-lang de --trainpref /nonexistent/train "
       "--validpref /nonexistent/valid --destdir /nonexistent/out"},
      {"transformer_decode",
       {"usage: transformer_decode", "--input arg (=-)", "--output arg (=-)",
        "--batch-tokens arg (=4096)", "--nbest arg (=1)",
        // Boost wraps the descriptions: fragments within one line.
        "(default: the checkpoint's decode.beam", "decode.alpha", "decode.max_len_a/b",
        "one stored in the checkpoint)", "(default: the checkpoint's train.threads)"},
       "--checkpoint /nonexistent.h5 --spm-model /nonexistent.model < /dev/null"},
      {"transformer_average",
       {"usage: transformer_average", "--inputs", "--last", "--output"},
       "--inputs /nonexistent.h5 --output /nonexistent/average.h5"},
      {"transformer_data_stats",
       {"usage: transformer_data_stats", "--prefix arg (=train)",
        "--tokens-per-step arg (=25000)", "--ranks arg (=1)", "--accumulate arg (=1)",
        "--epochs arg (=1)", "--memory-mb arg (=4096)"},
       "/nonexistent"},
      {"transformer_bench_step",
       {"transformer_bench_step options", "--config arg (=input/base.ini)",
        "--tokens arg (=25000)", "--steps arg (=60)", "--warmup-steps arg (=15)",
        "--vocab arg (=37000)", "--backend arg (=auto)", "--precision arg (=bf16)",
        "--peak-tflops arg (=790)"},
       "--config /nonexistent.ini"},
      {"transformer_score",
       {"usage: transformer_score", "(default: standard input)", "13a (default)",
        "exp (default)", "(default 0.1)", "(default 4)", "(default 1)"},
       "/nonexistent.ref -i /nonexistent.hyp"},
      {"transformer_evalb",
       {"usage: transformer_evalb", "(default: EVALB's built-in defaults)"},
       "/nonexistent.gold /nonexistent.test"},
      {"transformer_trees",
       {"usage: transformer_trees", "SEQ or standard input"},
       "linearize --output /nonexistent/out /nonexistent.mrg"},
  };
  return all;
}

std::string program(const Tool& tool) { return std::string(THPC_BINARY_DIR) + "/" + tool.name; }

TEST(Tools, HelpExitsZeroAndShowsTheDefaults) {
  for (const Tool& tool : tools()) {
    SCOPED_TRACE(tool.name);
    const ProcessResult result = run_process(program(tool) + " --help");
    EXPECT_EQ(result.exit_code, 0) << result.output;
    for (const std::string& mention : tool.help_mentions) {
      EXPECT_NE(result.output.find(mention), std::string::npos)
          << "--help lacks '" << mention << "':\n"
          << result.output;
    }
  }
}

TEST(Tools, BadCommandLineExitsTwoWithOneLineNamingTheProgram) {
  for (const Tool& tool : tools()) {
    SCOPED_TRACE(tool.name);
    const ProcessResult result = run_process(program(tool) + " --no-such-option");
    EXPECT_EQ(result.exit_code, 2) << result.output;
    EXPECT_EQ(lines_of(result.output).size(), 1u) << result.output;
    EXPECT_EQ(result.output.rfind(tool.name + ": ", 0), 0u) << result.output;
    EXPECT_NE(result.output.find("--no-such-option"), std::string::npos) << result.output;
    EXPECT_NE(result.output.find("(see --help)"), std::string::npos) << result.output;
  }
}

TEST(Tools, RuntimeFailureExitsOneWithOneLineNamingTheProgram) {
  for (const Tool& tool : tools()) {
    SCOPED_TRACE(tool.name);
    const ProcessResult result = run_process(program(tool) + " " + tool.failing_arguments);
    EXPECT_EQ(result.exit_code, 1) << result.output;
    EXPECT_EQ(lines_of(result.output).size(), 1u) << result.output;
    EXPECT_EQ(result.output.rfind(tool.name + ": error: ", 0), 0u) << result.output;
    EXPECT_NE(result.output.find("/nonexistent"), std::string::npos) << result.output;
  }
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
  std::rewind(file);
  std::string text;
  for (int c = std::fgetc(file); c != EOF; c = std::fgetc(file)) text.push_back(static_cast<char>(c));
  std::fclose(file);
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

}  // namespace
}  // namespace thpc
