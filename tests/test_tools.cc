// The harness every program beside the trainer shares (tools/tool_main.h), run as a user
// runs the programs: --help exits 0 and shows the defaults, a bad command line exits 2
// with one line "NAME: PROBLEM (see --help)", a runtime failure exits 1 with one line
// "NAME: error: PROBLEM".
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "program.h"

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

}  // namespace
}  // namespace thpc
