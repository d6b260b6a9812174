// build/transformer_decode end to end: a SentencePiece model trained on Multi30k
// English, a (randomly initialised) model saved as a checkpoint, and the program run as
// a user runs it. Translation quality needs a trained model (the data issue's Multi30k
// run); here: one output line per input line in input order, empty lines, over-long
// lines truncated with a warning, determinism, --greedy = --beam 1 --lenpen 0, n-best,
// the SentencePiece model taken from the checkpoint when --spm-model is not given.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <fcntl.h>
#include <sched.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <future>
#include <map>
#include <sstream>
#include <regex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "config/config.h"
#include "cuda_twin.h"
#include "data_dir.h"
#include "decode/translate.h"
#include "kernels/cpu/cpu_backend.h"
#include "model/checkpoint_params.h"
#include "model/transformer.h"
#include "program.h"
#include "spm_model.h"

namespace thpc {
namespace {

namespace fs = std::filesystem;

class DecodeProgram : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (data_path("multi30k/train.en").empty()) return;  // every test skips in SetUp
    dir_ = fs::temp_directory_path() / ("thpc_decode_" + std::to_string(getpid()));
    fs::create_directories(dir_);
    // A small SentencePiece model on the first 3000 Multi30k English sentences, with the
    // project's special ids.
    const auto status = train_multi30k_spm_model(dir_.string(), 300);
    ASSERT_TRUE(status.ok()) << status.ToString();

    // A small model of that vocabulary, saved as a parameters-only checkpoint.
    Config config = load_config(std::string(THPC_SOURCE_DIR) + "/input/tiny.ini",
                                {"model.layers=1", "model.d_model=32", "model.d_ff=64",
                                 "model.max_positions=40"});
    auto backend = make_cpu_backend(DType::F32);
    Transformer model(config.model, 300, SpecialIds{}, *backend, 3);
    Checkpoint checkpoint;
    checkpoint.seed = config.train.seed;
    checkpoint.architecture = architecture_text(config.model, 300);
    checkpoint.config_ini = config.to_ini();
    checkpoint.params = gather_named(model.params(), *backend, model.params().params());
    write_checkpoint((dir_ / "model.h5").string(), checkpoint);
    // The same, carrying its SentencePiece model as the trainer stores it.
    checkpoint.spm_model = read_file(dir_ / "spm.model");
    write_checkpoint((dir_ / "model_spm.h5").string(), checkpoint);
    // The same model to decode on a GPU (its [train] backend cuda), for the tests that
    // need one.
    {
      Checkpoint on_gpu = checkpoint;
      on_gpu.config_ini = load_config(std::string(THPC_SOURCE_DIR) + "/input/tiny.ini",
                                      {"model.layers=1", "model.d_model=32", "model.d_ff=64",
                                       "model.max_positions=40", "train.backend=cuda"})
                              .to_ini();
      write_checkpoint((dir_ / "model_cuda.h5").string(), on_gpu);
    }

    // For ensembles: another model of the same vocabulary (other parameters, other
    // size), one of another vocabulary size, and one storing another SentencePiece model
    // of the same size (trained on German).
    {
      Config other = load_config(std::string(THPC_SOURCE_DIR) + "/input/tiny.ini",
                                 {"model.layers=2", "model.d_model=16", "model.d_ff=32",
                                  "model.max_positions=40"});
      Transformer second(other.model, 300, SpecialIds{}, *backend, 5);
      Checkpoint ensemble_member = checkpoint;
      ensemble_member.architecture = architecture_text(other.model, 300);
      ensemble_member.config_ini = other.to_ini();
      ensemble_member.params = gather_named(second.params(), *backend, second.params().params());
      write_checkpoint((dir_ / "model2.h5").string(), ensemble_member);
      Transformer small_vocabulary(config.model, 200, SpecialIds{}, *backend, 3);
      Checkpoint other_size = checkpoint;
      other_size.spm_model.clear();
      other_size.architecture = architecture_text(config.model, 200);
      other_size.params =
          gather_named(small_vocabulary.params(), *backend, small_vocabulary.params().params());
      write_checkpoint((dir_ / "model_200.h5").string(), other_size);
      std::ifstream german(data_path("multi30k/train.de"));
      std::ofstream german_sample(dir_ / "sample.de");
      std::string line;
      for (int i = 0; i < 3000 && std::getline(german, line); ++i) german_sample << line << "\n";
      german_sample.close();
      const auto german_status =
          train_test_spm_model((dir_ / "sample.de").string(), (dir_ / "spm_de").string(), 300);
      ASSERT_TRUE(german_status.ok()) << german_status.ToString();
      Checkpoint other_vocabulary = checkpoint;
      other_vocabulary.spm_model = read_file(dir_ / "spm_de.model");
      write_checkpoint((dir_ / "model_de_spm.h5").string(), other_vocabulary);
    }

    // A model of a SentencePiece model trained with spm_train's defaults (no pad: it is
    // id 300, after the 300 pieces), storing it as the trainer does.
    {
      const auto default_status = train_test_spm_model(
          (dir_ / "sample.en").string(), (dir_ / "spm_default").string(), 300, "");
      ASSERT_TRUE(default_status.ok()) << default_status.ToString();
      const Transformer default_ids_model = default_ids_transformer(*backend);
      Checkpoint without_pad = checkpoint;
      without_pad.spm_model = read_file(dir_ / "spm_default.model");
      without_pad.architecture = architecture_text(config.model, 301);
      without_pad.params = gather_named(default_ids_model.params(), *backend,
                                        default_ids_model.params().params());
      write_checkpoint((dir_ / "model_default_spm.h5").string(), without_pad);
      without_pad.spm_model.clear();  // as a run without a stored model writes it
      write_checkpoint((dir_ / "model_default_no_spm.h5").string(), without_pad);
      // The same pieces with bos and eos swapped (spm_train's --bos_piece and --eos_piece):
      // bos 2, eos 1.
      const auto swapped_status = train_test_spm_model(
          (dir_ / "sample.en").string(), (dir_ / "spm_swapped").string(), 300,
          "--bos_id=2 --eos_id=1 --bos_piece=</s> --eos_piece=<s>");
      ASSERT_TRUE(swapped_status.ok()) << swapped_status.ToString();
    }

    std::ofstream input(dir_ / "input.en");
    input << "A man is riding a bike.\n\nTwo dogs play in the snow.\n";
    for (int i = 0; i < 1000; ++i) input << "dog ";
    input << "\n";
  }
  static void TearDownTestSuite() {
    if (!dir_.empty()) fs::remove_all(dir_);
  }
  void SetUp() override { THPC_REQUIRE_DATA("multi30k/train.en"); }

  // The tests' small model, tiny.ini's with `overrides` applied.
  static Config small_model_config() {
    return load_config(std::string(THPC_SOURCE_DIR) + "/input/tiny.ini",
                       {"model.layers=1", "model.d_model=32", "model.d_ff=64",
                        "model.max_positions=40"});
  }
  // The special ids of spm_default.model's vocabulary: unk 0, bos 1, eos 2, pad 300.
  static SpecialIds default_ids() { return SpecialIds{300, 0, 1, 2}; }
  // model_default_spm.h5's model: its 300 pieces and pad.
  static Transformer default_ids_transformer(Backend& backend) {
    return Transformer(small_model_config().model, 301, default_ids(), backend, 7);
  }

  // Runs the program on `checkpoint` (with --spm-model unless `spm_model` is false);
  // returns its exit code, stdout in `out`, stderr in `err`.
  int decode(const std::string& options, std::string& out, std::string& err,
             const std::string& checkpoint = "model.h5", bool spm_model = true,
             const std::string& input = "input.en") {
    const fs::path out_file = dir_ / "out.txt", err_file = dir_ / "err.txt";
    const std::string command =
        thpc::binary_dir() + "/transformer_decode --checkpoint " +
        (dir_ / checkpoint).string() +
        (spm_model ? " --spm-model " + (dir_ / "spm.model").string() : std::string()) +
        " --input " + (dir_ / input).string() + " " + options + " > " + out_file.string() +
        " 2> " + err_file.string();
    const int status = std::system(command.c_str());
    out = read_file(out_file);
    err = read_file(err_file);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }

  static fs::path dir_;
};

fs::path DecodeProgram::dir_;

// Input that spm_encode made already (fairseq's habit: encode, then translate the
// pieces) is translated as asked, with a warning at its first such line and their count
// (a helper's walk: pieces encoded again, translated as noise without a word); raw text,
// a word mark or two in it, is not warned of.
TEST_F(DecodeProgram, InputEncodedIntoPiecesAlreadyIsWarnedOf) {
  {
    const std::string mark = "\u2581";  // SentencePiece's word mark
    std::ofstream encoded(dir_ / "encoded.en");
    encoded << "A man rides a bike.\n"
            << mark << "A " << mark << "man " << mark << "rides " << mark << "a " << mark
            << "bi ke .\n"
            << mark << "Two " << mark << "dogs\n"
            << "the " << mark << " mark in raw text\n";
  }
  std::string out, err;
  ASSERT_EQ(decode("--max-len-b 2 --greedy", out, err, "model.h5", true, "encoded.en"), 0) << err;
  EXPECT_EQ(lines_of(out).size(), 4u) << out;
  EXPECT_NE(err.find("transformer_decode: warning: line 2 of " + (dir_ / "encoded.en").string() +
                     " looks encoded into SentencePiece pieces already"),
            std::string::npos)
      << err;
  EXPECT_EQ(err.find("line 3 of"), std::string::npos) << err;
  EXPECT_NE(err.find("warning: 2 lines of " + (dir_ / "encoded.en").string() + " in all looked "
                     "encoded"),
            std::string::npos)
      << err;
  ASSERT_EQ(decode("--max-len-b 2 --greedy", out, err), 0) << err;
  EXPECT_EQ(err.find("looks encoded"), std::string::npos) << err;
}

TEST_F(DecodeProgram, OneLinePerInputLineInOrderDeterministic) {
  std::string out, err, out_again, err_again;
  ASSERT_EQ(decode("--max-len-b 5", out, err), 0) << err;
  const std::vector<std::string> lines = lines_of(out);
  ASSERT_EQ(lines.size(), 4u) << out;
  EXPECT_EQ(lines[1], "") << "an empty input line gives an empty output line";
  EXPECT_NE(err.find("warning: line 4 has"), std::string::npos) << err;
  EXPECT_NE(err.find("truncated to 39"), std::string::npos) << err;
  ASSERT_EQ(decode("--max-len-b 5", out_again, err_again), 0);
  EXPECT_EQ(out, out_again);
  // A different batching must not change any translation (order is restored).
  ASSERT_EQ(decode("--max-len-b 5 --batch-tokens 8", out_again, err_again), 0);
  EXPECT_EQ(out, out_again);
  // Many truncated lines: the first 5 said a line each, then their count (a test set
  // through a short position table printed a warning line for each).
  {
    std::ofstream many(dir_ / "many_long.en");
    std::string words;
    for (int w = 0; w < 80; ++w) words += "A man rides a bike. ";
    for (int line = 0; line < 8; ++line) many << words << "\n";
  }
  std::string many_out, many_err;
  ASSERT_EQ(decode("--max-len-b 1 --greedy", many_out, many_err, "model.h5", true, "many_long.en"),
            0)
      << many_err;
  EXPECT_EQ(lines_of(many_out).size(), 8u);
  EXPECT_NE(many_err.find("warning: line 5 has"), std::string::npos) << many_err;
  EXPECT_EQ(many_err.find("warning: line 6 has"), std::string::npos) << many_err;
  EXPECT_NE(many_err.find("warning: 8 lines of " + (dir_ / "many_long.en").string() +
                          " in all were truncated to 39 tokens (the first 5 said above)"),
            std::string::npos)
      << many_err;
  // A length limit beyond the position table: the translations that reached the table's
  // end are counted (they were cut at 39 tokens without a word, a helper's trial); none
  // where the limit is below it.
  ASSERT_EQ(decode("--max-len-a 0 --max-len-b 5 --greedy", many_out, many_err, "model.h5",
                   true, "many_long.en"),
            0)
      << many_err;
  EXPECT_EQ(many_err.find("stopped at the model's position table"), std::string::npos)
      << many_err;
  ASSERT_EQ(decode("--max-len-a 0 --max-len-b 1000 --greedy", many_out, many_err, "model.h5",
                   true, "many_long.en"),
            0)
      << many_err;
  const std::regex stopped("warning: ([0-9]+) translations? stopped at the model's position "
                           "table \\(39 tokens, model.max_positions = 40\\), short of the length "
                           "limit asked for");
  std::smatch count;
  ASSERT_TRUE(std::regex_search(many_err, count, stopped)) << many_err;
  int at_the_end = 0;  // translations of 39 tokens: none ended by eos
  for (const std::string& line : lines_of(many_out)) at_the_end += line.size() > 0;
  EXPECT_GE(std::stoi(count[1]), 1) << many_out;
  EXPECT_LE(std::stoi(count[1]), at_the_end) << many_out;
}

// --batch-sentences N: at most N sentences a batch (fairseq's --batch-size, CTranslate2's
// "examples" batches), with --batch-tokens still in force; the translations are the
// default batching's.
TEST_F(DecodeProgram, SentenceLimitedBatchesChangeNoTranslation) {
  std::string plain, limited, err;
  ASSERT_EQ(decode("--max-len-b 6", plain, err), 0) << err;
  for (const char* sentences : {"1", "2", "0"}) {
    ASSERT_EQ(decode(std::string("--max-len-b 6 --batch-sentences ") + sentences, limited, err), 0)
        << err;
    EXPECT_EQ(limited, plain) << "--batch-sentences " << sentences;
  }
  EXPECT_EQ(decode("--batch-sentences -1", limited, err), 2) << err;
  EXPECT_NE(err.find("--batch-sentences"), std::string::npos) << err;
}

// --threads N: N workers sharing the batches, each with its own model copy, or, for an
// input of fewer than 2N batches, as many workers as get two whole batches each sharing
// the N threads evenly. The output is the single thread's, line for line, whatever the
// plan (--profile names it).
TEST_F(DecodeProgram, WorkersShareTheBatchesWithoutChangingAnyTranslation) {
  const std::string sentences[] = {"A man is riding a bike.", "Two dogs play in the snow.",
                                   "A woman sings on a stage.", "Children run in a park."};
  {
    std::ofstream input(dir_ / "twelve.en");
    for (int i = 0; i < 12; ++i) input << sentences[i % 4] << (i < 4 ? "" : " Again.") << "\n";
  }
  // --batch-tokens 8: a sentence a batch, 3 of input.en and 12 of twelve.en.
  const std::pair<const char*, std::vector<std::pair<const char*, const char*>>> cases[] = {
      {"input.en",
       {{"2", "1 worker of 2 threads"}, {"3", "1 worker of 3 threads"},
        {"8", "1 worker of 8 threads"}}},
      {"twelve.en",
       {{"2", "2 workers of 1 thread each"}, {"3", "3 workers of 1 thread each"},
        {"8", "4 workers of 2 threads each"}}}};
  for (const auto& [input, plans] : cases) {
    std::string one, err;
    const std::string options = "--max-len-b 8 --batch-tokens 8 --profile --threads ";
    ASSERT_EQ(decode(options + "1", one, err, "model.h5", true, input), 0) << err;
    ASSERT_EQ(lines_of(one).size(), input == std::string("input.en") ? 4u : 12u) << one;
    for (const auto& [threads, plan] : plans) {
      std::string several;
      ASSERT_EQ(decode(options + threads, several, err, "model.h5", true, input), 0) << err;
      EXPECT_EQ(several, one) << input << ", --threads " << threads;
      EXPECT_NE(err.find(std::string(" batches, ") + plan + "\n"), std::string::npos)
          << input << ", --threads " << threads << ": " << err;
      // More threads than the cores this process may use are said (and honoured: the
      // plan above).
      cpu_set_t allowed;
      CPU_ZERO(&allowed);
      ASSERT_EQ(::sched_getaffinity(0, sizeof allowed, &allowed), 0);
      const int cores = CPU_COUNT(&allowed);
      EXPECT_EQ(err.find(std::string("note: --threads ") + threads + " is more than the " +
                         std::to_string(cores) + " cores this process may use") !=
                    std::string::npos,
                std::stoi(threads) > cores)
          << err;
    }
  }
}

// --buffer-sentences N: the input read, translated and written N lines at a time (memory
// a buffer's, translations out as they are done) with every translation, n-best index,
// sample and warning as the whole input at once gives them; with N = 1 a line's
// translation is written before the next line is read, as a pipe from a program sending
// a line at a time needs (fairseq-interactive's --buffer-size).
// Lines typed on a terminal, translated a line at a time into a pipe: no progress line
// on that terminal, where it ran into what was typed ("0 sentences, 0.0 stwo dogs"; a
// helper's walk). Standard input and error on a pseudo-terminal (Python's pty module),
// the translations into a file.
TEST_F(DecodeProgram, LinesTypedOnATerminalGetNoProgressLineBesideThem) {
  const fs::path script = dir_ / "typed.py", translations = dir_ / "typed.de";
  std::ofstream(script) << R"(import os, pty, sys
pid, fd = pty.fork()
if pid == 0:
    out = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.dup2(out, 1)
    os.execv(sys.argv[2], sys.argv[2:])
os.write(fd, b"A man.\nTwo dogs.\n")
os.write(fd, b"\x04")
seen = b""
while True:
    try:
        chunk = os.read(fd, 4096)
    except OSError:
        break
    if not chunk:
        break
    seen += chunk
os.waitpid(pid, 0)
sys.stdout.write(seen.decode("utf-8", "replace"))
)";
  const ProcessResult typed = run_process(
      "python3 " + script.string() + " " + translations.string() + " " + thpc::binary_dir() +
      "/transformer_decode --checkpoint " + (dir_ / "model.h5").string() + " --spm-model " +
      (dir_ / "spm.model").string() + " --max-len-b 4 --buffer-sentences 1");
  EXPECT_EQ(typed.exit_code, 0) << typed.output;
  EXPECT_EQ(lines_of(read_file(translations)).size(), 2u) << typed.output;
  EXPECT_EQ(typed.output.find("sentences"), std::string::npos) << typed.output;
  EXPECT_NE(typed.output.find("Two dogs."), std::string::npos) << "the terminal's echo: "
                                                               << typed.output;
}

TEST_F(DecodeProgram, TheInputIsTranslatedABufferAtATimeWithoutChangingAnyTranslation) {
  {
    std::ofstream input(dir_ / "buffered.en");
    input << read_file(dir_ / "input.en");  // an empty line 2 and a long line 4
    const char* more[] = {"A woman sings on a stage.", "Children run in a park.",
                          "Two men are fishing.", "", "A cat sleeps on a chair."};
    for (const char* line : more) input << line << "\n";
  }
  for (const std::string options :
       {"--max-len-b 6", "--max-len-b 6 --nbest 2 --beam 2",
        "--max-len-b 6 --sampling topk=5 --seed 3", "--max-len-b 6 --threads 2"}) {
    std::string whole, err;
    ASSERT_EQ(decode(options + " --buffer-sentences 0", whole, err, "model.h5", true,
                     "buffered.en"),
              0)
        << err;
    ASSERT_NE(err.find("warning: line 4 has"), std::string::npos) << err;
    for (const char* lines : {"1", "2", "5", "9", "100000"}) {
      std::string buffered;
      ASSERT_EQ(decode(options + " --buffer-sentences " + lines, buffered, err, "model.h5", true,
                       "buffered.en"),
                0)
          << err;
      EXPECT_EQ(buffered, whole) << options << " --buffer-sentences " << lines;
      EXPECT_NE(err.find("warning: line 4 has"), std::string::npos) << err;
    }
  }
  // A handshake, not a timing: the second line is sent only once the first one's
  // translation is out; a decoder that waits for the end of its input never gets it (the
  // sender gives up after 60 s, and the test fails on the missing line).
  const fs::path out = dir_ / "piped.de";
  const std::string command =
      "(echo 'A man is riding a bike.'; for wait in \\$(seq 600); do if [ -s " + out.string() +
      " ]; then echo 'Two dogs play in the snow.'; break; fi; sleep 0.1; done) | timeout 120 " +
      thpc::binary_dir() +
      "/transformer_decode --checkpoint " + (dir_ / "model.h5").string() + " --spm-model " +
      (dir_ / "spm.model").string() + " --max-len-b 4 --buffer-sentences 1 > " + out.string();
  const ProcessResult piped = run_process("bash -c \"" + command + "\"");
  EXPECT_EQ(piped.exit_code, 0) << piped.output;
  EXPECT_EQ(lines_of(read_file(out)).size(), 2u) << read_file(out);
  std::string refused, err;
  EXPECT_EQ(decode("--buffer-sentences -1", refused, err), 2) << err;
  EXPECT_NE(err.find("--buffer-sentences"), std::string::npos) << err;
  // The whole input's carriage returns are judged, not a buffer's: three stray ones in its
  // first line, in seven lines, are kept by any buffer (a buffer of 2 refused them).
  {
    std::ofstream stray(dir_ / "stray_cr.en", std::ios::binary);
    stray << "A man\ris\rriding\ra bike.\nTwo dogs.\nA cat.\nA dog.\nA man.\nA boy.\nA girl.\n";
  }
  std::string whole, buffered;
  ASSERT_EQ(decode("--max-len-b 4 --buffer-sentences 0", whole, err, "model.h5", true,
                   "stray_cr.en"),
            0)
      << err;
  EXPECT_EQ(decode("--max-len-b 4 --buffer-sentences 2", buffered, err, "model.h5", true,
                   "stray_cr.en"),
            0)
      << err;
  EXPECT_EQ(buffered, whole);
  // A later buffer's bad line is said as such, not as a failure to write the output
  // (which the output file's storage diagnosis took it for: "the process's file-size
  // limit ... stopped it" under a ulimit -f), and the output is not left behind, nor the
  // directories made for it (they were, empty).
  {
    std::ofstream bad(dir_ / "late_bad.en", std::ios::binary);
    bad << "A man.\nTwo dogs.\nA cat.\n\xff\xfe a dog.\nA boy.\n";
  }
  const fs::path late_out = dir_ / "made" / "for it" / "late_bad.de";
  const ProcessResult late = run_process(
      "bash -c 'ulimit -f 100000; " + thpc::binary_dir() + "/transformer_decode --checkpoint " +
      (dir_ / "model.h5").string() + " --spm-model " + (dir_ / "spm.model").string() +
      " --input " + (dir_ / "late_bad.en").string() + " --max-len-b 4 --buffer-sentences 2" +
      " --output \"" + late_out.string() + "\"'");
  EXPECT_EQ(late.exit_code, 1) << late.output;
  EXPECT_NE(late.output.find("late_bad.en: line 4: invalid UTF-8 at byte 1 of the line"),
            std::string::npos)
      << late.output;
  EXPECT_EQ(late.output.find("limit"), std::string::npos) << late.output;
  EXPECT_FALSE(fs::exists(dir_ / "made"));
  // From a pipe, checked a buffer at a time: the first buffer's two translations were made,
  // and into --output FILE they are lost with the rest, which the message now says (it
  // named the bad line alone; a helper's walk).
  const ProcessResult late_piped = run_process(
      "cat " + (dir_ / "late_bad.en").string() + " | " + thpc::binary_dir() +
      "/transformer_decode --checkpoint " + (dir_ / "model.h5").string() + " --spm-model " +
      (dir_ / "spm.model").string() + " --max-len-b 4 --buffer-sentences 2 --output " +
      (dir_ / "late_piped.de").string());
  EXPECT_EQ(late_piped.exit_code, 1) << late_piped.output;
  EXPECT_NE(late_piped.output.find("<stdin>: line 4: invalid UTF-8 at byte 1 of the line"),
            std::string::npos)
      << late_piped.output;
  EXPECT_NE(late_piped.output.find("; the 2 lines translated before it are not written "
                                   "either (--output FILE appears only whole): mend the "
                                   "input, or write to standard output (> " +
                                   (dir_ / "late_piped.de").string() +
                                   ") to keep the translations made before a failure"),
            std::string::npos)
      << late_piped.output;
  EXPECT_FALSE(fs::exists(dir_ / "late_piped.de"));
  // A file's every line is checked before anything is translated, given as --input or on
  // standard input: the long line 4 is never encoded (its warning never said), where the
  // buffers before the bad line were translated, and with --output their translations
  // lost (a helper's trial: 1,000 of them, to a bad byte on line 1,001).
  {
    std::ofstream bad(dir_ / "long_then_bad.en", std::ios::binary);
    bad << read_file(dir_ / "input.en") << "A boy.\nA girl.\n\xff a dog.\n";
  }
  ASSERT_EQ(lines_of(read_file(dir_ / "long_then_bad.en")).size(), 7u);
  for (const std::string& input : {"--input " + (dir_ / "long_then_bad.en").string(),
                                  std::string("< ") + (dir_ / "long_then_bad.en").string()}) {
    const ProcessResult checked_first = run_process(
        thpc::binary_dir() + "/transformer_decode --checkpoint " + (dir_ / "model.h5").string() +
        " --spm-model " + (dir_ / "spm.model").string() + " --max-len-b 4 --buffer-sentences 2 " +
        "--output " + (dir_ / "checked_first.de").string() + " " + input);
    EXPECT_EQ(checked_first.exit_code, 1) << checked_first.output;
    EXPECT_NE(checked_first.output.find(": line 7: invalid UTF-8 at byte 1 of the line"),
              std::string::npos)
        << checked_first.output;
    EXPECT_EQ(checked_first.output.find("warning: line 4 has"), std::string::npos)
        << checked_first.output;
    EXPECT_FALSE(fs::exists(dir_ / "checked_first.de"));
  }
  // Standard input's file is checked from where its descriptor stands: a line its caller
  // read before is not the program's input (a header, read by the shell; reopening
  // /dev/stdin checked it, and refused the input for its bad byte).
  {
    std::ofstream headed(dir_ / "headed.en", std::ios::binary);
    headed << "HEADER \xff\nA man.\nTwo dogs.\nA cat.\n";
  }
  const ProcessResult after_header = run_process(
      "bash -c '{ IFS= read -r header; " + thpc::binary_dir() +
      "/transformer_decode --checkpoint " + (dir_ / "model.h5").string() + " --spm-model " + (dir_ / "spm.model").string() +
      " --max-len-b 4 --buffer-sentences 2; } < " + (dir_ / "headed.en").string() + "'");
  EXPECT_EQ(after_header.exit_code, 0) << after_header.output;
  EXPECT_EQ(lines_of(after_header.output).size(), 3u) << after_header.output;
  // Only those it made: "fresh/../kept" took the existing, empty kept for one of them.
  fs::create_directory(dir_ / "kept");
  const ProcessResult dotted = run_process(
      thpc::binary_dir() + "/transformer_decode --checkpoint " + (dir_ / "model.h5").string() +
      " --spm-model " + (dir_ / "spm.model").string() + " --input " +
      (dir_ / "late_bad.en").string() + " --max-len-b 4 --buffer-sentences 2 --output " +
      (dir_ / "fresh" / ".." / "kept" / "late_bad.de").string());
  EXPECT_EQ(dotted.exit_code, 1) << dotted.output;
  EXPECT_TRUE(fs::is_directory(dir_ / "kept"));
  EXPECT_FALSE(fs::exists(dir_ / "fresh"));
  // Another decoding writing the same --output now (its temporary file locked, as this
  // test holds it) is not written into: before, both wrote one .F.tmp and the first to end
  // renamed the mixture over F, exit 0. A leftover one, locked by nobody, is taken.
  const fs::path shared_out = dir_ / "shared.de", shared_tmp = dir_ / ".shared.de.tmp";
  std::ofstream(shared_tmp) << "the other program's text\n";
  const int held = ::open(shared_tmp.c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(held, 0);
  ASSERT_EQ(::flock(held, LOCK_EX | LOCK_NB), 0);
  std::string shared;
  EXPECT_EQ(decode("--max-len-b 4 --output " + shared_out.string(), shared, err), 2) << err;
  EXPECT_NE(err.find("another program is writing " + shared_out.string() + " now (its "
                     "temporary file " + shared_tmp.string() + " is locked by it)"),
            std::string::npos)
      << err;
  EXPECT_EQ(read_file(shared_tmp), "the other program's text\n");
  EXPECT_FALSE(fs::exists(shared_out));
  ::close(held);
  EXPECT_EQ(decode("--max-len-b 4 --output " + shared_out.string(), shared, err), 0) << err;
  EXPECT_EQ(lines_of(read_file(shared_out)).size(), 4u);
  EXPECT_FALSE(fs::exists(shared_tmp));
  // A temporary file that is a symbolic link is refused (its target was written over).
  std::ofstream(dir_ / "victim.txt") << "kept\n";
  fs::create_symlink(dir_ / "victim.txt", shared_tmp);
  EXPECT_EQ(decode("--max-len-b 4 --output " + shared_out.string(), shared, err), 1) << err;
  EXPECT_NE(err.find("is a symbolic link, whose target would be written"), std::string::npos)
      << err;
  EXPECT_EQ(read_file(dir_ / "victim.txt"), "kept\n");
  fs::remove(shared_tmp);
  // A file that ends with a buffer is one buffer, judged whole before anything is written:
  // two lines with three stray carriage returns, a classic Mac OS file joined to one of
  // \n line ends, refused at once with --buffer-sentences 2 as with 0 (before: both lines
  // translated, then refused).
  {
    std::ofstream mac(dir_ / "mac_two.en", std::ios::binary);
    mac << "A\rman\ris\rhere.\nA dog.\n";
  }
  for (const char* lines : {"0", "2"}) {
    std::string translated;
    EXPECT_EQ(decode(std::string("--max-len-b 4 --buffer-sentences ") + lines, translated, err,
                     "model.h5", true, "mac_two.en"),
              1)
        << err;
    EXPECT_EQ(translated, "") << "--buffer-sentences " << lines;
    EXPECT_NE(err.find("(its 2 lines hold 3 carriage returns before their ends: "),
              std::string::npos)
        << err;
  }
  // Standard input open for writing only (GNU nohup's for a terminal's) is said, not read
  // as an empty input.
  const ProcessResult unreadable = run_process(
      thpc::binary_dir() + "/transformer_decode --checkpoint " + (dir_ / "model.h5").string() +
      " --spm-model " + (dir_ / "spm.model").string() + " 0>/dev/null");
  EXPECT_EQ(unreadable.exit_code, 1) << unreadable.output;
  EXPECT_NE(unreadable.output.find("standard input is not open for reading"), std::string::npos)
      << unreadable.output;
  // A directory as standard input: its reads fail, which read as an empty input, and the
  // output was replaced by an empty file, exit 0.
  const fs::path kept = dir_ / "kept.de";
  std::ofstream(kept) << "an earlier translation\n";
  const ProcessResult directory = run_process(
      thpc::binary_dir() + "/transformer_decode --checkpoint " + (dir_ / "model.h5").string() +
      " --spm-model " + (dir_ / "spm.model").string() + " --output " + kept.string() + " < " +
      dir_.string());
  EXPECT_EQ(directory.exit_code, 1) << directory.output;
  EXPECT_NE(directory.output.find("standard input is a directory, not a text"),
            std::string::npos)
      << directory.output;
  EXPECT_EQ(read_file(kept), "an earlier translation\n");
}

// --output FIFO is opened before the input is read, as Marian's and CTranslate2's outputs
// are: a program that opens the FIFO to read the translations and then sends the input
// (one thread, in that order) waited for ever, the decoder waiting first for the end of
// its input. Here the test is that program; a decoder that has not opened the FIFO after
// 30 s fails it, and is then sent its input so that it ends (no hang).
TEST_F(DecodeProgram, AFifoOutputIsOpenedBeforeTheInputIsRead) {
  const fs::path fifo = dir_ / "translations.fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const std::string input = "A man is riding a bike.\nTwo dogs play in the snow.\n";
  std::ofstream(dir_ / "fifo_input.en") << input;
  int to_decoder[2];
  ASSERT_EQ(::pipe(to_decoder), 0);
  const std::string program = thpc::binary_dir() + "/transformer_decode";
  const std::string model = (dir_ / "model.h5").string(), spm = (dir_ / "spm.model").string();
  const pid_t decoder = ::fork();
  ASSERT_GE(decoder, 0);
  if (decoder == 0) {
    ::dup2(to_decoder[0], STDIN_FILENO);
    ::close(to_decoder[0]);
    ::close(to_decoder[1]);
    ::execl(program.c_str(), program.c_str(), "--checkpoint", model.c_str(), "--spm-model",
            spm.c_str(), "--max-len-b", "4", "--output", fifo.c_str(), nullptr);
    ::_exit(127);
  }
  ::close(to_decoder[0]);
  std::future<int> opened =
      std::async(std::launch::async, [&] { return ::open(fifo.c_str(), O_RDONLY); });
  const bool opened_first = opened.wait_for(std::chrono::seconds(30)) == std::future_status::ready;
  EXPECT_TRUE(opened_first) << "the decoder had not opened --output after 30 s";
  // (SIGPIPE ignored meanwhile: a decoder that died would have it end this test binary.)
  const auto previous = std::signal(SIGPIPE, SIG_IGN);
  const ssize_t sent = ::write(to_decoder[1], input.data(), input.size());
  ::close(to_decoder[1]);
  std::signal(SIGPIPE, previous);
  EXPECT_EQ(sent, static_cast<ssize_t>(input.size()));
  // A decoder that never opens its output (one that died) leaves the open waiting for a
  // writer: this test's own ends it, so that a failure cannot hang the run.
  if (opened.wait_for(std::chrono::seconds(60)) != std::future_status::ready) {
    const int writer = ::open(fifo.c_str(), O_WRONLY | O_NONBLOCK);
    if (writer >= 0) ::close(writer);
  }
  const int translations = opened.get();
  ASSERT_GE(translations, 0);
  std::string got;
  char block[4096];
  for (ssize_t n; (n = ::read(translations, block, sizeof block)) > 0;) got.append(block, n);
  ::close(translations);
  int status = 0;
  pid_t ended = 0;
  for (int wait = 0; wait < 600 && (ended = ::waitpid(decoder, &status, WNOHANG)) == 0; ++wait) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  if (ended == 0) {
    ::kill(decoder, SIGKILL);
    ::waitpid(decoder, &status, 0);
    ADD_FAILURE() << "the decoder had not ended 60 s after its input";
  }
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  std::string direct, err;
  ASSERT_EQ(decode("--max-len-b 4", direct, err, "model.h5", true, "fifo_input.en"), 0) << err;
  EXPECT_EQ(got, direct);
  EXPECT_EQ(lines_of(direct).size(), 2u) << direct;
  // --dump-lines reads the whole input before the output is opened: a line the input
  // lacks is said at once, not after a reader opens the FIFO.
  const ProcessResult beyond = run_process(
      "timeout 60 " + program + " --checkpoint " + model + " --spm-model " + spm +
      " --input " + (dir_ / "fifo_input.en").string() + " --dump-lines 9 --dump-attention " +
      (dir_ / "dump.h5").string() + " --output " + fifo.string());
  EXPECT_EQ(beyond.exit_code, 2) << beyond.output;
  EXPECT_NE(beyond.output.find("--dump-lines: line 9 is beyond the 2 lines"), std::string::npos)
      << beyond.output;
}

// --gpu-workers N decoding on the CPU: a bad command line (exit 2) that names --threads,
// CPU decoding's workers; 0 workers is one too, and 1 (the default) is accepted.
TEST_F(DecodeProgram, GpuWorkersOnTheCpuAreABadCommandLine) {
  std::string out, err;
  EXPECT_EQ(decode("--max-len-b 6 --gpu-workers 0", out, err), 2);
  EXPECT_NE(err.find("--gpu-workers must be >= 1, got 0"), std::string::npos) << err;
  EXPECT_EQ(decode("--max-len-b 6 --gpu-workers 2", out, err), 2);
  EXPECT_NE(err.find("--gpu-workers 2: this decoding runs on the CPU (cpu-"), std::string::npos)
      << err;
  EXPECT_NE(err.find("--threads N runs N workers"), std::string::npos) << err;
  ASSERT_EQ(decode("--max-len-b 6 --gpu-workers 1", out, err), 0) << err;
}

// The programs' tests above run with the GPUs hidden (tests/tests.cmake: only suites
// named Cuda* see them); these decode model_cuda.h5 (train.backend = cuda) on the GPU.
class CudaDecodeProgram : public DecodeProgram {};

// --gpu-workers N: N workers sharing the GPU, each with its own copy of the model on its
// own CUDA stream. With one sentence a batch (--batch-sentences 1) every batch has the
// shape it has with one worker whatever the split, so the translations are one
// worker's, line for line; --profile adds the time the device had no worker's op in
// flight. Several workers launch their steps one by one (without the candidate
// worker_graphs), so the one worker here does too (--cuda-graphs off): one worker's
// captured steps pad the source and the cache, whose products cuBLAS may round
// otherwise.
TEST_F(CudaDecodeProgram, GpuWorkersShareTheDeviceWithoutChangingAnyTranslation) {
  THPC_REQUIRE_REAL_GPU();
  std::string one, several, err;
  const std::string gpu = "--max-len-b 8 --batch-sentences 1 --gpu-workers ";
  ASSERT_EQ(decode(gpu + "1 --cuda-graphs off", one, err, "model_cuda.h5"), 0) << err;
  ASSERT_EQ(lines_of(one).size(), 4u) << one;
  for (const char* workers : {"2", "3"}) {
    ASSERT_EQ(decode(gpu + workers, several, err, "model_cuda.h5"), 0) << err;
    EXPECT_EQ(several, one) << "--gpu-workers " << workers;
  }
  ASSERT_EQ(decode(gpu + "2 --profile", several, err, "model_cuda.h5"), 0) << err;
  EXPECT_EQ(several, one);
  EXPECT_NE(err.find("profile: 3 batches on cuda"), std::string::npos) << err;
  EXPECT_NE(err.find("device idle, all 2 workers"), std::string::npos) << err;
}

// --score-reference on a GPU: the CPU's scores to bf16's rounding, and two workers of one
// sentence a batch the same. 0.3 a line is a first bound, not yet seen on a GPU: bf16
// rounds every activation of the pass (2^-8 relative), and this small random model's
// log-probabilities (~-5.7 a piece over up to ~12 pieces) move by a few hundredths each
// in the whole-model checks' experience; revisit it after the first GPU run.
TEST_F(CudaDecodeProgram, ScoreReferenceGivesTheCpusScoresToBf16Rounding) {
  THPC_REQUIRE_REAL_GPU();
  {
    std::ofstream references(dir_ / "references_gpu.en");
    references << "A man rides a bike.\n\nDogs are playing in the snow.\nA dog.\n";
  }
  const std::string scoring = "--score-reference " + (dir_ / "references_gpu.en").string();
  std::string cpu, gpu, two, err;
  ASSERT_EQ(decode(scoring, cpu, err), 0) << err;
  ASSERT_EQ(decode(scoring, gpu, err, "model_cuda.h5"), 0) << err;
  ASSERT_EQ(decode(scoring + " --gpu-workers 2 --batch-sentences 1", two, err, "model_cuda.h5"), 0)
      << err;
  const std::vector<std::string> cpu_lines = lines_of(cpu), gpu_lines = lines_of(gpu),
                                 two_lines = lines_of(two);
  ASSERT_EQ(cpu_lines.size(), 4u) << cpu;
  ASSERT_EQ(gpu_lines.size(), 4u) << gpu;
  ASSERT_EQ(two_lines.size(), 4u) << two;
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_NEAR(std::stod(gpu_lines[i]), std::stod(cpu_lines[i]), 0.3) << "line " << i + 1;
    EXPECT_NEAR(std::stod(two_lines[i]), std::stod(gpu_lines[i]), 0.3) << "line " << i + 1;
  }
  EXPECT_EQ(gpu_lines[3], "-inf");
}

// --cuda-graphs (on by default): one GPU worker's decoding steps are captured into CUDA
// graphs and replayed (the profile's "captured passes" row); --cuda-graphs off launches
// them one by one (no such row), as several workers do (unless --cuda-kernels names
// worker_graphs, and then not with --cuda-graphs off): with one sentence a batch their
// translations are the same. (The captured search pads
// the source and the cache to buckets, so its products have more rows, which cuBLAS may
// round otherwise, and this untrained model's near-ties may go either way: only the
// lines are counted here; CudaCapturedDecoding.* hold the captured steps to the
// uncaptured ones, bit for bit where nothing is padded.)
TEST_F(CudaDecodeProgram, OneWorkerCapturesItsStepsAndOffLaunchesThemOneByOne) {
  THPC_REQUIRE_REAL_GPU();
  std::string launched, captured, several, err;
  const std::string gpu = "--max-len-b 8 --batch-sentences 1 --profile ";
  ASSERT_EQ(decode(gpu + "--cuda-graphs off", launched, err, "model_cuda.h5"), 0) << err;
  EXPECT_EQ(err.find("captured passes"), std::string::npos) << err;
  ASSERT_EQ(decode(gpu, captured, err, "model_cuda.h5"), 0) << err;
  EXPECT_NE(err.find("captured passes (CUDA graphs)"), std::string::npos) << err;
  EXPECT_NE(err.find("captured decoding steps (1 worker): "), std::string::npos) << err;
  EXPECT_NE(err.find(" 0 refused, "), std::string::npos) << err;
  EXPECT_EQ(lines_of(captured).size(), lines_of(launched).size()) << captured;
  for (const char* several_launched :
       {"--gpu-workers 2 --cuda-kernels verified",
        "--gpu-workers 2 --cuda-kernels worker_graphs --cuda-graphs off"}) {
    ASSERT_EQ(decode(gpu + several_launched, several, err, "model_cuda.h5"), 0) << err;
    EXPECT_EQ(err.find("captured passes"), std::string::npos) << several_launched << "\n"
                                                              << err;
    EXPECT_EQ(several, launched) << several_launched;
  }
}

// The candidate worker_graphs (kernels/ops.h): every one of several GPU workers captures
// its own steps, concurrently on one device (relaxed capture mode: one worker's frees and
// allocations while another captures end no capture), and replays them on its own stream
// while another's host picks the beam's tokens. With one sentence a batch each batch has
// the shape, padding and graphs it has with one captured worker, whichever worker takes
// it: the translations are one captured worker's, line for line, and every worker's
// profile has the captured row. (A candidate's twin: bench/gpu_session.sh runs the
// CudaCandidate* suites first, and decodes with the candidates whose twins passed.)
class CudaCandidateWorkerGraphs : public DecodeProgram {};

TEST_F(CudaCandidateWorkerGraphs, EveryWorkerCapturesItsStepsWithoutChangingAnyTranslation) {
  THPC_REQUIRE_REAL_GPU();
  std::string one, several, err;
  const std::string gpu = "--max-len-b 8 --batch-sentences 1 --profile --gpu-workers ";
  ASSERT_EQ(decode(gpu + "1", one, err, "model_cuda.h5"), 0) << err;
  EXPECT_NE(err.find("captured passes (CUDA graphs)"), std::string::npos) << err;
  ASSERT_EQ(lines_of(one).size(), 4u) << one;
  for (const char* workers : {"2", "3"}) {
    ASSERT_EQ(decode(gpu + workers + " --cuda-kernels worker_graphs", several, err,
                     "model_cuda.h5"),
              0)
        << err;
    EXPECT_EQ(several, one) << "--gpu-workers " << workers;
    EXPECT_NE(err.find("captured passes (CUDA graphs)"), std::string::npos) << err;
    EXPECT_NE(err.find(std::string("device idle, all ") + workers + " workers"),
              std::string::npos)
        << err;
    // No worker's calls (a download's wait, a buffer freed) refused another's capture.
    EXPECT_NE(err.find(std::string("captured decoding steps (") + workers + " workers)"),
              std::string::npos)
        << err;
    EXPECT_NE(err.find(" 0 refused, "), std::string::npos) << err;
  }
}

// --cuda-graphs takes on or off (a bad command line, exit 2, otherwise); the CPU, which
// captures nothing, translates the same either way.
TEST_F(DecodeProgram, CudaGraphsOptionIsCheckedAndTheCpuIgnoresIt) {
  std::string plain, chosen, err;
  ASSERT_EQ(decode("--max-len-b 6 --threads 1", plain, err), 0) << err;
  for (const char* graphs : {"on", "off"}) {
    ASSERT_EQ(decode(std::string("--max-len-b 6 --threads 1 --cuda-graphs ") + graphs, chosen,
                     err),
              0)
        << err;
    EXPECT_EQ(chosen, plain) << graphs;
  }
  EXPECT_EQ(decode("--max-len-b 6 --threads 1 --cuda-graphs yes", chosen, err), 2);
  EXPECT_NE(err.find("--cuda-graphs: expected on or off, got 'yes'"), std::string::npos) << err;
}

// --profile: the same translations, and on standard error a table of where the time
// went per batch, one row per op class the decoding called, the rows and the host time
// between ops adding up to the batch's total. (--batch-tokens 8: each non-empty line is
// a batch of its own, the long one truncated to 39 pieces.)
TEST_F(DecodeProgram, ProfileTellsWhereTheTimeWentAndChangesNoTranslation) {
  std::string plain, profiled, err;
  ASSERT_EQ(decode("--max-len-b 6 --threads 1 --batch-tokens 8", plain, err), 0) << err;
  ASSERT_EQ(decode("--max-len-b 6 --threads 1 --batch-tokens 8 --profile", profiled, err), 0)
      << err;
  EXPECT_EQ(profiled, plain);
  // The CPU captures nothing, so it says nothing of captured steps (none tried, none
  // refused).
  EXPECT_EQ(err.find("captured decoding steps"), std::string::npos) << err;
  const size_t header = err.find("profile: ");
  ASSERT_NE(header, std::string::npos) << err;
  int batches = 0;
  double per_batch = 0.0;
  ASSERT_EQ(std::sscanf(err.c_str() + header, "profile: %d batches on cpu-fp32, %lf ms per batch",
                        &batches, &per_batch),
            2)
      << err.substr(header);
  EXPECT_EQ(batches, 3) << err;  // the three non-empty lines
  EXPECT_GT(per_batch, 0.0);
  double rows = 0.0;
  for (const char* row : {"GEMM forward", "attention", "residual+dropout+layer norm",
                          "cross-entropy", "decoding (copy_rows, top-k)",
                          "host time between kernels"}) {
    const size_t at = err.find(row, header);
    ASSERT_NE(at, std::string::npos) << row << " missing from\n" << err.substr(header);
    rows += std::atof(err.c_str() + at + 30);  // the table's first column after the label
  }
  const size_t total = err.find("total (the batch)", header);
  ASSERT_NE(total, std::string::npos) << err.substr(header);
  EXPECT_NEAR(std::atof(err.c_str() + total + 30), per_batch, 1e-3 * per_batch + 1e-3);
  EXPECT_LE(rows, per_batch * 1.001 + 1e-3) << err.substr(header);
}

// --cuda-kernels picks the GPU kernels as train.cuda_kernels does (the CPU ignores it: the
// same translations), and a name that is no candidate is a bad command line (exit 2)
// saying which names there are.
TEST_F(DecodeProgram, CudaKernelsOptionIsCheckedAndTheCpuIgnoresIt) {
  std::string plain, chosen, err;
  ASSERT_EQ(decode("--max-len-b 6 --threads 1", plain, err), 0) << err;
  for (const char* kernels : {"verified", "candidate", "gathered_attention"}) {
    ASSERT_EQ(decode(std::string("--max-len-b 6 --threads 1 --cuda-kernels ") + kernels, chosen,
                     err),
              0)
        << err;
    EXPECT_EQ(chosen, plain) << kernels;
  }
  EXPECT_EQ(decode("--max-len-b 6 --cuda-kernels fastest", chosen, err), 2);
  EXPECT_NE(err.find("--cuda-kernels: 'fastest' is not a candidate kernel"), std::string::npos)
      << err;
  EXPECT_NE(err.find("verified, candidate"), std::string::npos) << err;
}

// --compute-type: float32 is the CPU's default path, bit for bit; int8 quantizes every
// weight matrix of the model (1 layer each side: encoder qkv, out, fc1, fc2; decoder qkv,
// out, cross q, cross kv, cross out, fc1, fc2; the embedding as the output projection:
// 12) and, its rows quantized one by one with exact integer products, translates
// alike however the batches are shared among workers; a type the CPU cannot run, and a
// name that is no type, are bad command lines (exit 2) that say what to give instead.
TEST_F(DecodeProgram, ComputeTypeChoosesTheArithmetic) {
  std::string plain, chosen, err;
  ASSERT_EQ(decode("--max-len-b 8 --threads 1", plain, err), 0) << err;
  ASSERT_EQ(decode("--max-len-b 8 --threads 1 --compute-type float32", chosen, err), 0) << err;
  EXPECT_EQ(chosen, plain);
  ASSERT_EQ(decode("--max-len-b 8 --threads 1 --compute-type default", chosen, err), 0) << err;
  EXPECT_EQ(chosen, plain);

  EXPECT_EQ(decode("--max-len-b 8 --compute-type bfloat16", chosen, err), 2);
  EXPECT_NE(err.find("--compute-type bfloat16 needs a GPU"), std::string::npos) << err;
  EXPECT_EQ(decode("--max-len-b 8 --compute-type int4", chosen, err), 2);
  EXPECT_NE(err.find("--compute-type 'int4': expected default, float32, bfloat16 or int8"),
            std::string::npos)
      << err;

  const int int8_exit = decode("--max-len-b 8 --threads 1 --compute-type int8", chosen, err);
  if (err.find("built without oneDNN") != std::string::npos) {
    EXPECT_EQ(int8_exit, 2) << err;
    GTEST_SKIP() << "this build has no oneDNN: " << err;
  }
  ASSERT_EQ(int8_exit, 0) << err;
  EXPECT_NE(err.find("transformer_decode: int8: 12 weight matrices quantized in "), std::string::npos)
      << err;
  EXPECT_EQ(lines_of(chosen).size(), lines_of(plain).size()) << chosen;
  for (const char* threads : {"2", "3"}) {
    std::string several;
    ASSERT_EQ(decode(std::string("--max-len-b 8 --compute-type int8 --threads ") + threads,
                     several, err),
              0)
        << err;
    EXPECT_EQ(several, chosen) << "--threads " << threads;
  }
}

// transformer_quantize writes the int8 weights once. Decoding them in int8 is decoding
// their dequantized values in int8 (quantizing q * s again gives q and s back; the lookups
// read the same rows); another compute type multiplies the dequantized values in float,
// as it would a float checkpoint of them, and says so. The tool refuses what it cannot
// quantize or where it must not write.
TEST_F(DecodeProgram, AQuantizedCheckpointDecodesAsItsDequantizedValuesDo) {
  const std::string quantize = thpc::binary_dir() + "/transformer_quantize";
  const fs::path model = dir_ / "model.h5", stored = dir_ / "model_int8.h5";
  const ProcessResult made = run_process(quantize + " --checkpoint " + model.string() +
                                         " --output " + stored.string());
  ASSERT_EQ(made.exit_code, 0) << made.output;
  EXPECT_NE(made.output.find("quantized 12 weight matrices"), std::string::npos) << made.output;
  EXPECT_LT(fs::file_size(stored), fs::file_size(model) * 6 / 10);
  // The dequantized values as a float checkpoint.
  Checkpoint dequantized = read_checkpoint(stored.string(), CheckpointParts::ParamsOnly);
  ASSERT_EQ(dequantized.quantized.size(), 12u);
  dequantized.quantized.clear();
  write_checkpoint((dir_ / "model_dequantized.h5").string(), dequantized);

  std::string from_store, from_floats, err;
  ASSERT_EQ(decode("--max-len-b 8 --threads 1", from_store, err, "model_int8.h5"), 0) << err;
  EXPECT_NE(err.find("stores its weight matrices in int8 (transformer_quantize): "
                     "--compute-type default multiplies their dequantized values in float"),
            std::string::npos)
      << err;
  ASSERT_EQ(decode("--max-len-b 8 --threads 1", from_floats, err, "model_dequantized.h5"), 0)
      << err;
  EXPECT_EQ(from_store, from_floats);
  // A compute type the CPU cannot run is refused alone: the note on how it would multiply
  // the stored weights came first.
  EXPECT_EQ(decode("--max-len-b 8 --compute-type bfloat16", from_floats, err, "model_int8.h5"),
            2);
  EXPECT_NE(err.find("transformer_decode: --compute-type bfloat16 needs a GPU, and this "
                     "decode runs on the CPU: use float32 or int8 there"),
            std::string::npos)
      << err;
  EXPECT_EQ(err.find("stores its weight matrices"), std::string::npos) << err;
  const int int8_exit =
      decode("--max-len-b 8 --threads 1 --compute-type int8 --nbest 2", from_store, err,
             "model_int8.h5");
  if (err.find("built without oneDNN") != std::string::npos) {
    GTEST_SKIP() << "this build has no oneDNN: " << err;
  }
  ASSERT_EQ(int8_exit, 0) << err;
  const bool seven_bits = err.find("this CPU's products take 7 bits") != std::string::npos;
  EXPECT_NE(err.find(seven_bits ? "(0 as the checkpoint stores them in int8, 12 quantized, 12 of "
                                : "int8: 12 weight matrices (12 as the checkpoint stores them "
                                  "in int8, 0 quantized) in "),
            std::string::npos)
      << err;
  EXPECT_EQ(err.find("note:"), std::string::npos) << err;
  ASSERT_EQ(decode("--max-len-b 8 --threads 1 --compute-type int8 --nbest 2", from_floats, err,
                   "model_dequantized.h5"),
            0)
      << err;
  EXPECT_EQ(from_store, from_floats);

  // Refused: quantizing twice (exit 1), over the input or with another type (exit 2).
  const ProcessResult again = run_process(quantize + " --checkpoint " + stored.string() +
                                          " --output " + (dir_ / "twice.h5").string());
  EXPECT_EQ(again.exit_code, 1) << again.output;
  EXPECT_NE(again.output.find("is quantized already"), std::string::npos) << again.output;
  EXPECT_FALSE(fs::exists(dir_ / "twice.h5"));
  const ProcessResult over_input = run_process(quantize + " --checkpoint " + model.string() +
                                               " --output " + model.string());
  EXPECT_EQ(over_input.exit_code, 2) << over_input.output;
  const ProcessResult fp8 = run_process(quantize + " --checkpoint " + model.string() +
                                        " --output x.h5 --type fp8");
  EXPECT_EQ(fp8.exit_code, 2) << fp8.output;
  EXPECT_NE(fp8.output.find("--type 'fp8': the one stored type is int8"), std::string::npos)
      << fp8.output;
}

TEST_F(DecodeProgram, GreedyIsBeamOneWithoutLengthPenalty) {
  std::string greedy, beam_one, err;
  ASSERT_EQ(decode("--greedy --max-len-b 6", greedy, err), 0) << err;
  ASSERT_EQ(decode("--beam 1 --lenpen 0 --max-len-b 6", beam_one, err), 0) << err;
  EXPECT_EQ(greedy, beam_one);
}

TEST_F(DecodeProgram, SentencePieceModelComesFromTheCheckpointOrTheCommandLine) {
  std::string given, stored, err;
  ASSERT_EQ(decode("--max-len-b 5", given, err), 0) << err;
  ASSERT_EQ(decode("--max-len-b 5", stored, err, "model_spm.h5", /*spm_model=*/false), 0) << err;
  EXPECT_EQ(stored, given);
  ASSERT_EQ(decode("--max-len-b 5", stored, err, "model_spm.h5", /*spm_model=*/true), 0) << err;
  EXPECT_EQ(stored, given);
  // Neither: one line naming the checkpoint and what to do, exit code 1.
  std::string out;
  EXPECT_EQ(decode("", out, err, "model.h5", /*spm_model=*/false), 1) << err;
  EXPECT_NE(err.find("transformer_decode: error: checkpoint " + (dir_ / "model.h5").string() +
                     " holds no SentencePiece model"),
            std::string::npos)
      << err;
  EXPECT_NE(err.find("give --spm-model FILE"), std::string::npos) << err;
  EXPECT_EQ(lines_of(err).size(), 1u) << err;
  EXPECT_EQ(out, "");
}

// A model whose SentencePiece model has no pad (spm_train's defaults: unk 0, bos 1, eos 2)
// decodes with the ids it was trained with, pad 300 after the pieces, as
// transformer_preprocess and the trainer derived them (before: refused, "special ids
// pad/unk/bos/eos are -1/0/1/2, the model expects 0/1/2/3"): the program's translations
// are the search's with those ids, which other ids would change.
TEST_F(DecodeProgram, AModelWithoutPadDecodesWithTheIdsItWasTrainedWith) {
  std::ofstream(dir_ / "short.en") << "A man is riding a bike.\nTwo dogs play in the snow.\n"
                                      "A woman sings.\n";
  std::string stored, given, err;
  ASSERT_EQ(decode("--greedy --max-len-b 5", stored, err, "model_default_spm.h5",
                   /*spm_model=*/false, "short.en"),
            0)
      << err;
  const std::string with_spm_model = thpc::binary_dir() +
      "/transformer_decode --checkpoint " + (dir_ / "model_default_spm.h5").string() +
      " --spm-model " + (dir_ / "spm_default.model").string() + " --input " +
      (dir_ / "short.en").string() + " --greedy --max-len-b 5 > " +
      (dir_ / "given.txt").string();
  ASSERT_EQ(std::system(with_spm_model.c_str()), 0);
  EXPECT_EQ(read_file(dir_ / "given.txt"), stored);

  sentencepiece::SentencePieceProcessor spm;
  ASSERT_TRUE(spm.Load((dir_ / "spm_default.model").string()).ok());
  std::vector<TokenSequence> sources;
  for (const std::string line :
       {"A man is riding a bike.", "Two dogs play in the snow.", "A woman sings."}) {
    std::vector<int> pieces;
    ASSERT_TRUE(spm.Encode(line, &pieces).ok());
    sources.emplace_back(pieces.begin(), pieces.end());
  }
  auto backend = make_cpu_backend(DType::F32);
  Transformer model = default_ids_transformer(*backend);
  // The same parameters (the same seed) with the project's ids.
  Transformer with_other_ids(small_model_config().model, 301, SpecialIds{}, *backend, 7);
  SearchOverrides overrides;
  overrides.greedy = true;
  overrides.max_len_b = 5;
  const BeamOptions options =
      configured_beam_options(small_model_config().decode, 40, overrides);
  const auto translations = [&](Transformer& searched, const SpecialIds& ids) {
    std::vector<std::vector<Hypothesis>> found(sources.size());
    for (const DecodeBatch& batch : make_decode_batches(sources, options, 4096, 1)) {
      translate_batch(searched, ids, sources, batch, options, found);
    }
    std::string text;
    for (const auto& hypotheses : found) text += detokenize(spm, hypotheses[0].tokens) + "\n";
    return text;
  };
  EXPECT_EQ(stored, translations(model, default_ids()));
  EXPECT_NE(stored, translations(with_other_ids, SpecialIds{})) << "the ids decided nothing";

  // A checkpoint that stores no model trained with 0/1/2/3 (a synthetic task): a model of
  // another layout given for it is refused (a helper's trial: taken, exit 0).
  const std::string refused = thpc::binary_dir() + "/transformer_decode --checkpoint " +
                              (dir_ / "model_default_no_spm.h5").string() + " --spm-model " +
                              (dir_ / "spm_default.model").string() + " --input " +
                              (dir_ / "short.en").string() + " 2> " +
                              (dir_ / "refused.txt").string();
  const int status = std::system(refused.c_str());
  EXPECT_EQ(WIFEXITED(status) ? WEXITSTATUS(status) : -1, 2);
  EXPECT_NE(read_file(dir_ / "refused.txt")
                .find("its special ids pad/unk/bos/eos are 300/0/1/2, but " +
                      (dir_ / "model_default_no_spm.h5").string() +
                      " stores no SentencePiece model, and a run without one trains with "
                      "0/1/2/3"),
            std::string::npos)
      << read_file(dir_ / "refused.txt");
}

// --spm-model with the stored model's pieces but other special ids (bos and eos swapped)
// is refused: the ids come from --spm-model, so the model would have started its
// translations from eos and ended them at bos, exit 0 (before: accepted silently; the old
// check against pad/unk/bos/eos 0/1/2/3 went with the derived ids).
TEST_F(DecodeProgram, ASentencePieceModelOfTheSamePiecesButOtherSpecialIdsIsRefused) {
  sentencepiece::SentencePieceProcessor stored, swapped;
  ASSERT_TRUE(stored.Load((dir_ / "spm_default.model").string()).ok());
  ASSERT_TRUE(swapped.Load((dir_ / "spm_swapped.model").string()).ok());
  ASSERT_EQ(swapped.GetPieceSize(), stored.GetPieceSize());
  for (int id = 0; id < stored.GetPieceSize(); ++id) {
    ASSERT_EQ(swapped.IdToPiece(id), stored.IdToPiece(id)) << id;
  }
  ASSERT_EQ(swapped.bos_id(), 2);
  ASSERT_EQ(swapped.eos_id(), 1);
  std::ofstream(dir_ / "short.en") << "A man is riding a bike.\n";
  const std::string command = thpc::binary_dir() + "/transformer_decode --checkpoint " +
                              (dir_ / "model_default_spm.h5").string() + " --spm-model " +
                              (dir_ / "spm_swapped.model").string() + " --input " +
                              (dir_ / "short.en").string() + " --greedy --max-len-b 5 > " +
                              (dir_ / "swapped.txt").string() + " 2> " +
                              (dir_ / "swapped.err").string();
  const int status = std::system(command.c_str());
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 2);
  const std::string err = read_file(dir_ / "swapped.err");
  EXPECT_NE(err.find("--spm-model " + (dir_ / "spm_swapped.model").string() +
                     " is not the SentencePiece model stored in " +
                     (dir_ / "model_default_spm.h5").string() +
                     " (its special ids pad/unk/bos/eos are 300/0/2/1, the checkpoint's "
                     "300/0/1/2)"),
            std::string::npos)
      << err;
  EXPECT_EQ(lines_of(err).size(), 1u) << err;
  EXPECT_EQ(read_file(dir_ / "swapped.txt"), "");
}

// --spm-model's vocabulary, when it is not the checkpoint's size, counts the specials added
// after the model's pieces: "a vocabulary of 300 pieces, but ... was trained with 300"
// would read as no mismatch at all (a mutation audit dropped the count, and no test saw
// it). And a --spm-model of other pieces than the stored model's is said to be of other
// pieces, even where its special ids differ as well: the pieces are what make it another
// model (the same audit let the special ids' message speak first, and no test saw it).
TEST_F(DecodeProgram, AnotherSentencePieceModelIsDescribedByWhatDiffersFirst) {
  std::string out, err;
  const std::string default_spm = (dir_ / "spm_default.model").string();
  EXPECT_EQ(decode("--max-len-b 2 --spm-model " + default_spm, out, err, "model.h5",
                   /*spm_model=*/false),
            2)
      << err;
  EXPECT_NE(err.find("a vocabulary of 300 pieces and 1 special ids after them, but " +
                     (dir_ / "model.h5").string() + " was trained with 300"),
            std::string::npos)
      << err;
  EXPECT_EQ(decode("--max-len-b 2", out, err, "model_default_spm.h5"), 2) << err;
  EXPECT_NE(err.find("--spm-model " + (dir_ / "spm.model").string() +
                     " is not the SentencePiece model stored in " +
                     (dir_ / "model_default_spm.h5").string() +
                     " (id 0 is '<pad>' there and '<unk>' in the checkpoint)"),
            std::string::npos)
      << err;
  EXPECT_EQ(lines_of(err).size(), 1u) << err;
}

// --tree-constraints with a parser's vocabulary that lacks pad (spm_train's defaults, the
// brackets and XX as user symbols): the filter knows the model's eos and never-generated
// pad and bos by the ids after the pieces, so every translation is a tree over the line's
// words, with placeholders and with the words as leaves (a mutation audit: the filter given
// the pieces without the added pad, or 0/1/2/3, passed every test).
TEST_F(DecodeProgram, TreeConstraintsHoldWithAParserVocabularyWithoutPad) {
  {
    std::ofstream corpus(dir_ / "trees.txt");
    const char* lines[] = {"the cat sat", "(S (NP XX XX ) (VP XX ) )", "a dog ran home",
                           "(S (NP XX XX ) (VP XX (NP XX ) ) )", "it rained",
                           "(S (NP XX ) (VP XX ) )"};
    for (int copy = 0; copy < 40; ++copy) {
      for (const char* line : lines) corpus << line << "\n";
    }
  }
  // A parser checkpoint NAME.h5 of a random model over a SentencePiece model of the trees
  // (`flags` added to its training's).
  const auto make_parser = [&](const std::string& name, const std::string& flags) {
    const auto trained = train_test_spm_model(
        (dir_ / "trees.txt").string(), (dir_ / ("spm_" + name)).string(), 40,
        "--user_defined_symbols=\xe2\x96\x81(S,\xe2\x96\x81(NP,\xe2\x96\x81(VP,\xe2\x96\x81),"
        "\xe2\x96\x81XX" + flags);
    ASSERT_TRUE(trained.ok()) << trained.ToString();
    sentencepiece::SentencePieceProcessor spm;
    ASSERT_TRUE(spm.Load((dir_ / ("spm_" + name + ".model")).string()).ok());
    ASSERT_EQ(spm.pad_id(), -1);
    const int vocab = spm.GetPieceSize() + 1;
    auto backend = make_cpu_backend(DType::F32);
    const Config config = small_model_config();
    const Transformer model(config.model, vocab, SpecialIds{vocab - 1, 0, 1, 2}, *backend, 11);
    Checkpoint checkpoint;
    checkpoint.architecture = architecture_text(config.model, vocab);
    checkpoint.config_ini = config.to_ini();
    checkpoint.params = gather_named(model.params(), *backend, model.params().params());
    checkpoint.spm_model = read_file(dir_ / ("spm_" + name + ".model"));
    write_checkpoint((dir_ / (name + ".h5")).string(), checkpoint);
  };
  make_parser("parser_no_pad", "");
  // The fourth with characters the vocabulary lacks: the tree's words are still the line's
  // (SentencePiece's text had " ⁇ " for each, and a tree of other words, a helper's walk).
  // The last with a word that SentencePiece splits in two (a no-break space, a space
  // after NFKC): one word of the tree still, no bracket inside it (a review's trees took
  // shifted words).
  const std::vector<std::string> sentences = {"the cat sat", "a dog ran home", "it rained",
                                              "the ~cat s\xc3\xa4t", "a\xc2\xa0" "dog ran"};
  {
    std::ofstream input(dir_ / "sentences.txt");
    for (const std::string& sentence : sentences) input << sentence << "\n";
  }
  // A SentencePiece model without the dummy prefix (its first word has no "▁") too: the
  // same trees of the line's words (each word encoded alone matched no such model, a
  // review's).
  make_parser("parser_no_prefix", " --add_dummy_prefix=false");
  for (const auto& [parser, leaves] : {std::pair<std::string, std::string>{"parser_no_pad", "XX"},
                                       {"parser_no_pad", "words"},
                                       {"parser_no_prefix", "words"}}) {
    SCOPED_TRACE(parser + ", " + leaves);
    std::string out, err;
    ASSERT_EQ(decode("--tree-constraints --tree-leaves " + leaves + " --beam 2", out, err,
                     parser + ".h5", /*spm_model=*/false, "sentences.txt"),
              0)
        << err;
    EXPECT_EQ(err.find("warning"), std::string::npos) << err;
    const std::vector<std::string> trees = lines_of(out);
    ASSERT_EQ(trees.size(), sentences.size()) << out;
    for (size_t i = 0; i < trees.size(); ++i) {
      // Brackets balanced, never closed below the root, each opened one closed; the
      // leaves the placeholders or the sentence's words, in order.
      std::istringstream tokens(trees[i]);
      int depth = 0, roots = 0;
      std::vector<std::string> leaf_words;
      for (std::string token; tokens >> token;) {
        if (token.front() == '(') {
          roots += depth == 0;
          ++depth;
        } else if (token == ")") {
          EXPECT_GT(depth, 0) << trees[i];
          --depth;
        } else {
          EXPECT_GT(depth, 0) << "a leaf outside the tree: " << trees[i];
          leaf_words.push_back(token);
        }
      }
      EXPECT_EQ(depth, 0) << trees[i];
      EXPECT_EQ(roots, 1) << trees[i];
      std::istringstream words(sentences[i]);
      std::vector<std::string> expected;
      for (std::string word; words >> word;) expected.push_back(leaves == "XX" ? "XX" : word);
      EXPECT_EQ(leaf_words, expected) << trees[i];
    }
  }
  // A word SentencePiece drops (a zero-width space): the line's tree is SentencePiece's
  // text, said.
  std::ofstream(dir_ / "dropped.txt") << "the \xe2\x80\x8b cat sat\n";
  std::string out, err;
  // Without --tree-constraints, a parser's vocabulary (its labelled brackets) is noted.
  ASSERT_EQ(decode("--beam 2", out, err, "parser_no_pad.h5", /*spm_model=*/false,
                   "sentences.txt"),
            0)
      << err;
  EXPECT_NE(err.find("holds the bracket pieces of a parser's linearized trees: "
                     "--tree-constraints decodes only well-formed trees"),
            std::string::npos)
      << err;
  ASSERT_EQ(decode("--tree-constraints --tree-leaves words --beam 2", out, err,
                   "parser_no_pad.h5", /*spm_model=*/false, "dropped.txt"),
            0)
      << err;
  EXPECT_NE(err.find("warning: 1 line's tree is written with SentencePiece's text, not the "
                     "line's own words"),
            std::string::npos)
      << err;
  // A length limit too short for a tree over a line's words is refused, naming the line:
  // its search could only end in an unfinished tree, which was written without a word.
  EXPECT_EQ(decode("--tree-constraints --max-len-a 0 --max-len-b 6 --beam 2", out, err,
                   "parser_no_pad.h5", /*spm_model=*/false, "sentences.txt"),
            2)
      << err;
  EXPECT_NE(err.find("--tree-constraints: line 2 of the input needs 7 tokens for the shortest "
                     "tree over its words"),
            std::string::npos)
      << err;
}

// An output's unknown token is written as SentencePiece writes it, " ⁇ ", not dropped: the
// reader sees where the model did not know a word, and BLEU counts it as the miss it is (a
// mutation audit dropped it in detokenize, which decoding and validation BLEU share, and
// every test passed: none decoded an output holding one).
TEST_F(DecodeProgram, AnUnknownTokenIsWrittenNotDropped) {
  sentencepiece::SentencePieceProcessor spm;
  ASSERT_TRUE(spm.Load((dir_ / "spm.model").string()).ok());
  const int man = spm.PieceToId("\xE2\x96\x81man");
  ASSERT_NE(man, spm.unk_id());
  const std::string with_unknown = detokenize(spm, {man, spm.unk_id(), man});
  EXPECT_NE(with_unknown.find("\xE2\x81\x87"), std::string::npos) << with_unknown;  // ⁇
  EXPECT_EQ(detokenize(spm, {man, man}), "man man");
}

// A byte_fallback model's byte pieces can spell a line feed, a carriage return or NUL
// (<0x0A>, <0x0D>, <0x00>; sampling at a high temperature drew them): written as they
// decode, a translation took two lines and every later line was another input's (a
// helper's trial: 25 lines out for 23 in). They are written as spaces.
TEST_F(DecodeProgram, ByteTokensNeverBreakATranslationsLine) {
  const auto trained = train_test_spm_model((dir_ / "sample.en").string(),
                                            (dir_ / "spm_bytes").string(), 600,
                                            std::string(kProjectSpecialIds) +
                                                " --byte_fallback=true");
  ASSERT_TRUE(trained.ok()) << trained.ToString();
  sentencepiece::SentencePieceProcessor spm;
  ASSERT_TRUE(spm.Load((dir_ / "spm_bytes.model").string()).ok());
  const int man = spm.PieceToId("\xE2\x96\x81man");
  ASSERT_NE(man, spm.unk_id());
  for (const char* byte : {"<0x0A>", "<0x0D>", "<0x00>"}) {
    const int id = spm.PieceToId(byte);
    ASSERT_TRUE(spm.IsByte(id)) << byte;
    EXPECT_EQ(detokenize(spm, {man, id, man}), "man  man") << byte;
  }
  EXPECT_EQ(detokenize(spm, {man, spm.PieceToId("<0x41>"), man}), "manA man");
}

TEST_F(DecodeProgram, NBestGivesKScoredLinesPerSentence) {
  std::string out, err;
  ASSERT_EQ(decode("--nbest 3 --max-len-b 4", out, err), 0) << err;
  const std::vector<std::string> lines = lines_of(out);
  // The empty line gives three without text too: a reader takes the list K at a time.
  ASSERT_EQ(lines.size(), 3u * 4u) << out;
  for (size_t line = 0; line < lines.size(); ++line) {
    EXPECT_EQ(lines[line].rfind(std::to_string(line / 3) + " ||| ", 0), 0u) << lines[line];
  }
  for (size_t line = 3; line < 6; ++line) EXPECT_EQ(lines[line], "1 |||  ||| 0.0000");
  // every score with four decimals, as the empty line's 0.0000 (A mutation audit's survivor.)
  for (const std::string& line : lines) {
    EXPECT_TRUE(std::regex_search(line, std::regex(" \\|\\|\\| -?[0-9]+\\.[0-9]{4}$"))) << line;
  }
}

// The n-best score is the length-normalised one, best first: with --lenpen 0 it is the
// log-probability; with the default 0.6 the same output scores that divided by
// ((5 + |y|) / 6)^0.6 > 1, so higher (log-probabilities are negative). A mutation audit
// printed the log-probability under every --lenpen, and the n-best worst first, and
// this suite's tests passed both (only a CTranslate2 comparison, which skips without
// its Python packages, saw the order).
TEST_F(DecodeProgram, NBestScoresAreLengthNormalisedAndBestFirst) {
  // Each sentence's outputs by text, with their scores.
  const auto scored = [&](const std::string& lenpen) {
    std::string out, err;
    EXPECT_EQ(decode("--nbest 4 --max-len-b 6 --lenpen " + lenpen, out, err), 0) << err;
    std::map<std::pair<std::string, std::string>, double> scores;
    std::map<std::string, double> previous;
    for (const std::string& line : lines_of(out)) {
      const size_t first = line.find(" ||| "), second = line.rfind(" ||| ");
      const std::string index = line.substr(0, first);
      const std::string text = line.substr(first + 5, second - first - 5);
      const double score = std::stod(line.substr(second + 5));
      if (previous.count(index) > 0) {
        EXPECT_LE(score, previous[index]) << "not best first: " << line << "\n" << out;
      }
      previous[index] = score;
      if (!text.empty()) scores[{index, text}] = score;
    }
    return scores;
  };
  const auto raw = scored("0");
  const auto normalised = scored("0.6");
  int shared = 0;
  for (const auto& [output, score] : normalised) {
    const auto found = raw.find(output);
    if (found == raw.end()) continue;
    ++shared;
    EXPECT_LT(found->second, 0.0) << output.second;
    EXPECT_GT(score, found->second + 1e-3) << output.second;
  }
  EXPECT_GT(shared, 0) << "no output both searches found";
}

TEST_F(DecodeProgram, EvaluateScriptAveragesDecodesAndScores) {
  // Two checkpoints of a run in a directory: the script averages them, translates and
  // prints sacreBLEU's line (the reference here is the input itself), and with
  // SCORE_OPTIONS a second line, here multi-bleu.perl's. With a SentencePiece model
  // given, and without one from checkpoints that carry theirs.
  std::ofstream(dir_ / "test.en") << "A man is riding a bike.\nTwo dogs play.\n";
  for (const auto& [checkpoint, spm_argument] :
       {std::pair{std::string("model.h5"), " " + (dir_ / "spm.model").string()},
        std::pair{std::string("model_spm.h5"), std::string()}}) {
    const fs::path run = dir_ / ("run_" + checkpoint);
    fs::create_directories(run);
    fs::copy_file(dir_ / checkpoint, run / "step_00000001.h5");
    fs::copy_file(dir_ / checkpoint, run / "step_00000002.h5");
    const ProcessResult result = run_process(
        "SCORE_OPTIONS='--tokenize moses-compound' THPC_BUILD=" + thpc::binary_dir() +
        " bash " + THPC_SOURCE_DIR +
        "/tools/evaluate.sh " + run.string() + spm_argument + " " + (dir_ / "test.en").string() +
        " " + (dir_ / "test.en").string() + " 2 -- --max-len-b 3");
    EXPECT_EQ(result.exit_code, 0) << result.output;
    EXPECT_NE(result.output.find("BLEU|nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp"),
              std::string::npos)
        << result.output;
    EXPECT_NE(result.output.find("\nBLEU = "), std::string::npos) << result.output;
    EXPECT_TRUE(fs::exists(run / "eval" / "average_last2.h5"));
    // Named by the decode options too: another search keeps its own file.
    EXPECT_EQ(lines_of(read_file(run / "eval" / "average_last2.test.en.max-len-b3.hyp")).size(),
              2u);
    // A checkpoint of the run decoded alone keeps its translations beside the average's.
    const ProcessResult single = run_process(
        "THPC_BUILD=" + thpc::binary_dir() + " bash " + THPC_SOURCE_DIR + "/tools/evaluate.sh " +
        (run / "step_00000001.h5").string() + spm_argument + " " + (dir_ / "test.en").string() +
        " " + (dir_ / "test.en").string() + " -- --max-len-b 3");
    EXPECT_EQ(single.exit_code, 0) << single.output;
    EXPECT_TRUE(fs::exists(run / "eval" / "step_00000001.test.en.max-len-b3.hyp"))
        << single.output;
    EXPECT_TRUE(fs::exists(run / "eval" / "average_last2.test.en.max-len-b3.hyp"));
    // The average the script wrote, decoded again with N given: beside it, not in
    // eval/eval/, and N said to apply to a directory alone (a helper's trial).
    const ProcessResult again = run_process(
        "THPC_BUILD=" + thpc::binary_dir() + " bash " + THPC_SOURCE_DIR + "/tools/evaluate.sh " +
        (run / "eval" / "average_last2.h5").string() + spm_argument + " " +
        (dir_ / "test.en").string() + " " + (dir_ / "test.en").string() + " 7 -- --beam 2");
    EXPECT_EQ(again.exit_code, 0) << again.output;
    EXPECT_TRUE(fs::exists(run / "eval" / "average_last2.test.en.beam2.hyp")) << again.output;
    EXPECT_FALSE(fs::exists(run / "eval" / "eval")) << again.output;
    EXPECT_NE(again.output.find("evaluate.sh: note: N = 7 averages a directory's last "
                                "checkpoints; "),
              std::string::npos)
        << again.output;
  }
  // A decode option that writes no one translation a line is refused before anything is
  // done (--nbest wrote its list over the 1-best file, then the score failed on its line
  // count; a helper's finding).
  const fs::path run = dir_ / "run_model_spm.h5";
  const std::string before = read_file(run / "eval" / "average_last2.test.en.max-len-b3.hyp");
  // Abbreviated too, as the decoder takes it (a review's finding: --nb passed).
  for (const std::string option : {"--nbest 2", "--nb 2", "--dump-att x.h5"}) {
    const ProcessResult nbest = run_process(
        "THPC_BUILD=" + thpc::binary_dir() + " bash " + THPC_SOURCE_DIR + "/tools/evaluate.sh " +
        run.string() + " " + (dir_ / "test.en").string() + " " + (dir_ / "test.en").string() +
        " 2 -- --max-len-b 3 " + option);
    EXPECT_EQ(nbest.exit_code, 2) << nbest.output;
    EXPECT_NE(nbest.output.find("evaluate.sh: decode option " +
                                option.substr(0, option.find(' ')) + " ("),
              std::string::npos)
        << nbest.output;
  }
  EXPECT_EQ(read_file(run / "eval" / "average_last2.test.en.max-len-b3.hyp"), before);
  // Names that start with '-', relative to the working directory: basename took the
  // source's for its options and the script stopped after averaging, and transformer_score
  // took the reference's (a helper's walk).
  const fs::path dashed = dir_ / "-run dir";
  fs::create_directories(dashed);
  fs::copy_file(run / "step_00000001.h5", dashed / "step_00000001.h5");
  fs::copy_file(run / "step_00000002.h5", dashed / "step_00000002.h5");
  fs::copy_file(dir_ / "test.en", dir_ / "-in ü=1,2.en");
  fs::copy_file(dir_ / "test.en", dir_ / "-ref ü.de");
  const ProcessResult dashes = run_process(
      "cd " + dir_.string() + " && THPC_BUILD=" + thpc::binary_dir() + " bash " +
      THPC_SOURCE_DIR + "/tools/evaluate.sh '-run dir' '-in ü=1,2.en' '-ref ü.de' 2");
  EXPECT_EQ(dashes.exit_code, 0) << dashes.output;
  EXPECT_NE(dashes.output.find("BLEU|nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp"),
            std::string::npos)
      << dashes.output;
  EXPECT_EQ(lines_of(read_file(dashed / "eval" / "average_last2.-in ü=1,2.en.hyp")).size(), 2u)
      << dashes.output;
}

// Ensembles (--checkpoint A B, or --checkpoint A --checkpoint B): two copies of a model
// translate as the model, byte for byte, with beam search and greedily; two different
// models (other sizes) translate deterministically whatever the workers; vocabularies
// that differ are refused in one line naming both files (exit 2).
TEST_F(DecodeProgram, EnsemblesOfCopiesTranslateAsTheModelAndVocabulariesMustAgree) {
  const std::string model = (dir_ / "model.h5").string(), model2 = (dir_ / "model2.h5").string();
  const std::string copy = (dir_ / "model_copy.h5").string();
  fs::copy_file(model, copy, fs::copy_options::overwrite_existing);
  for (const std::string mode : {"--max-len-b 8", "--greedy --max-len-b 8", "--beam 3 --nbest 2 --max-len-b 6"}) {
    std::string alone, copies, err;
    ASSERT_EQ(decode(mode, alone, err), 0) << err;
    ASSERT_EQ(decode(mode + " --checkpoint " + copy, copies, err), 0) << err;
    EXPECT_EQ(copies, alone) << mode;
    ASSERT_EQ(decode(mode + " --weights 1 1", copies, err, "model.h5 " + copy), 0) << err;
    EXPECT_EQ(copies, alone) << mode;
  }
  {
    // One file named twice (here by two spellings) would weigh double: refused, as
    // transformer_average refuses it (before: taken without a word).
    std::string out, err;
    EXPECT_EQ(decode("--checkpoint " + (dir_ / "." / "model.h5").string(), out, err), 2) << err;
    EXPECT_NE(err.find("--checkpoint names one file twice (" + model + " and " +
                       (dir_ / "." / "model.h5").string() + "): it would weigh double"),
              std::string::npos)
        << err;
  }
  std::string mixed, again, err;
  ASSERT_EQ(decode("--max-len-b 8 --threads 1 --checkpoint " + model2, mixed, err), 0) << err;
  EXPECT_EQ(lines_of(mixed).size(), 4u) << mixed;
  for (const char* threads : {"2", "3"}) {
    ASSERT_EQ(decode(std::string("--max-len-b 8 --threads ") + threads + " --checkpoint " + model2,
                     again, err),
              0)
        << err;
    EXPECT_EQ(again, mixed) << "--threads " << threads;
  }

  std::string out;
  EXPECT_EQ(decode("--checkpoint " + (dir_ / "model_200.h5").string(), out, err), 2) << err;
  EXPECT_NE(err.find(model + " has a vocabulary of 300 tokens, " +
                     (dir_ / "model_200.h5").string() + " of 200"),
            std::string::npos)
      << err;
  EXPECT_EQ(lines_of(err).size(), 1u) << err;
  EXPECT_EQ(decode("--checkpoint " + (dir_ / "model_de_spm.h5").string(), out, err, "model_spm.h5"),
            2)
      << err;
  EXPECT_NE(err.find((dir_ / "model_spm.h5").string() + " and " +
                     (dir_ / "model_de_spm.h5").string() +
                     " store different SentencePiece models (piece "),
            std::string::npos)
      << err;
  // One storing its model, the other not: the user must name the vocabulary.
  EXPECT_EQ(decode("--checkpoint " + model, out, err, "model_spm.h5", /*spm_model=*/false), 2)
      << err;
  EXPECT_NE(err.find("give --spm-model FILE"), std::string::npos) << err;
  EXPECT_EQ(decode("--max-len-b 3 --checkpoint " + model, out, err, "model_spm.h5"), 0) << err;
  EXPECT_EQ(decode("--weights 1", out, err, "model.h5 " + copy), 2) << err;
  EXPECT_NE(err.find("--weights: 1 weights for 2 checkpoints"), std::string::npos) << err;
  fs::remove(copy);
}

// --score-reference: one score a line, log P(reference | line) (decode/reference_scores.h
// has the library's exactness tests): negative, -inf for a pair the position table cannot
// hold (the 1,000-word line), the summary's log-likelihood their sum; --normalize divides
// each by its pieces + eos; batching, workers and buffers change only rounding; an
// ensemble of copies is the model, of two models their weighted mean; int8 near float.
TEST_F(DecodeProgram, ScoreReferenceWritesEachLinesLogProbability) {
  {
    std::ofstream references(dir_ / "references.en");
    references << "A man rides a bike.\n\nDogs are playing in the snow.\nA dog.\n";
  }
  const std::string scoring = "--score-reference " + (dir_ / "references.en").string();
  const auto scores_of = [&](const std::string& out) {
    std::vector<double> scores;
    for (const std::string& line : lines_of(out)) scores.push_back(std::stod(line));
    return scores;
  };
  std::string out, err;
  ASSERT_EQ(decode(scoring + " --threads 1", out, err), 0) << err;
  const std::vector<double> scores = scores_of(out);
  ASSERT_EQ(scores.size(), 4u) << out;
  double sum = 0;
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_TRUE(std::isfinite(scores[i]) && scores[i] < 0) << "line " << i + 1 << ": " << out;
    sum += scores[i];
  }
  EXPECT_EQ(lines_of(out)[3], "-inf") << out;
  EXPECT_NE(err.find("transformer_decode: scored 3 pairs ("), std::string::npos) << err;
  EXPECT_NE(err.find("1 pair is not scored (written -inf, left out of the sums above), the "
                     "first line 4, whose input has 1000 pieces: a side is longer than the "
                     "position table holds (39 pieces and eos, model.max_positions = 40)"),
            std::string::npos)
      << err;
  std::smatch summary;
  ASSERT_TRUE(std::regex_search(err, summary, std::regex("log-likelihood (-[0-9.]+), (-[0-9.]+) "
                                                         "a piece, perplexity ([0-9.]+)")))
      << err;
  EXPECT_NEAR(std::stod(summary[1]), sum, 1e-3) << err;
  EXPECT_NEAR(std::stod(summary[3]), std::exp(-std::stod(summary[2])), 1e-2 * std::stod(summary[3]))
      << err;

  // A translation beyond the table is not scored either (here line 1's; line 4's source).
  {
    std::ofstream long_reference(dir_ / "long_reference.en");
    for (int i = 0; i < 100; ++i) long_reference << "dog ";
    long_reference << "\n\nDogs are playing in the snow.\nA dog.\n";
  }
  ASSERT_EQ(decode("--score-reference " + (dir_ / "long_reference.en").string(), out, err), 0)
      << err;
  ASSERT_EQ(lines_of(out).size(), 4u) << out;
  EXPECT_EQ(lines_of(out)[0], "-inf");
  EXPECT_NEAR(std::stod(lines_of(out)[2]), scores[2], 1e-4);
  EXPECT_NE(err.find("2 pairs are not scored (written -inf, left out of the sums above), the "
                     "first line 1, whose translation has 100 pieces"),
            std::string::npos)
      << err;

  // --piece-scores: after the score, one log-probability a piece and eos, summing to it.
  ASSERT_EQ(decode(scoring + " --piece-scores", out, err), 0) << err;
  ASSERT_EQ(lines_of(out).size(), 4u) << out;
  for (size_t i = 0; i < 3; ++i) {
    const std::string line = lines_of(out)[i];
    const size_t bar = line.find(" ||| ");
    ASSERT_NE(bar, std::string::npos) << line;
    EXPECT_NEAR(std::stod(line.substr(0, bar)), scores[i], 1e-6) << line;
    std::istringstream pieces(line.substr(bar + 5));
    double piece_sum = 0, piece = 0;
    int count = 0;
    while (pieces >> piece) {
      EXPECT_LT(piece, 0) << line;
      piece_sum += piece;
      ++count;
    }
    EXPECT_NEAR(piece_sum, scores[i], 1e-3 * count) << line;  // (4 decimals a piece)
    if (i == 1) {
      EXPECT_EQ(count, 1) << "the empty reference is eos alone: " << line;
    } else {
      EXPECT_GE(count, 2) << line;
    }
  }
  EXPECT_EQ(lines_of(out)[3], "-inf |||") << out;
  EXPECT_EQ(decode("--piece-scores", out, err), 2) << err;
  EXPECT_NE(err.find("--piece-scores goes with --score-reference FILE"), std::string::npos) << err;

  // Per piece: each score over its reference's pieces and eos (the empty reference: eos
  // alone, so its score is unchanged).
  ASSERT_EQ(decode(scoring + " --normalize", out, err), 0) << err;
  const std::vector<double> per_piece = scores_of(out);
  ASSERT_EQ(per_piece.size(), 4u) << out;
  EXPECT_NEAR(per_piece[1], scores[1], 1e-6);
  for (size_t i = 0; i < 3; ++i) {
    const double pieces = scores[i] / per_piece[i];
    EXPECT_GE(pieces, 1 - 1e-4) << "line " << i + 1;
    EXPECT_NEAR(pieces, std::round(pieces), 1e-3) << "line " << i + 1;
  }
  EXPECT_GT(scores[2] / per_piece[2], 4) << "'Dogs are playing in the snow.' is more than 3 pieces";
  EXPECT_EQ(lines_of(out)[3], "-inf");

  // Other batches, workers and buffers: the same scores but for rounding.
  for (const std::string other : {"--threads 2", "--batch-tokens 16 --threads 1",
                                  "--buffer-sentences 1 --threads 2", "--batch-sentences 1"}) {
    ASSERT_EQ(decode(scoring + " " + other, out, err), 0) << other << ": " << err;
    const std::vector<double> again = scores_of(out);
    ASSERT_EQ(again.size(), 4u) << other;
    for (size_t i = 0; i < 3; ++i) EXPECT_NEAR(again[i], scores[i], 1e-4) << other << " line " << i + 1;
  }

  // A batch of more target rows than a worker's logits take at once (1,024: made in
  // chunks) against batches of one pair (made whole).
  {
    std::ofstream many(dir_ / "many.en"), many_references(dir_ / "many_references.en");
    for (int i = 0; i < 150; ++i) {
      many << "A man is riding a bike number " << i << ".\n";
      many_references << "Two dogs play " << i << " times in the snow.\n";
    }
  }
  const std::string many_scoring = "--score-reference " + (dir_ / "many_references.en").string();
  std::string chunked, whole;
  ASSERT_EQ(decode(many_scoring + " --threads 1 --batch-tokens 100000", chunked, err,
                   "model.h5", true, "many.en"),
            0)
      << err;
  ASSERT_EQ(decode(many_scoring + " --batch-sentences 1", whole, err, "model.h5", true, "many.en"),
            0)
      << err;
  const std::vector<double> chunked_scores = scores_of(chunked), whole_scores = scores_of(whole);
  ASSERT_EQ(chunked_scores.size(), 150u);
  ASSERT_EQ(whole_scores.size(), 150u);
  for (size_t i = 0; i < 150; ++i) EXPECT_NEAR(chunked_scores[i], whole_scores[i], 1e-4) << i;

  // Ensembles: of the model and a copy, the model's scores to the digit; of two models,
  // the weighted mean of each one's.
  const std::string model2 = (dir_ / "model2.h5").string(), copy = (dir_ / "model_copy.h5").string();
  fs::copy_file(dir_ / "model.h5", copy, fs::copy_options::overwrite_existing);
  std::string alone;
  ASSERT_EQ(decode(scoring, alone, err), 0) << err;
  ASSERT_EQ(decode(scoring + " --checkpoint " + copy, out, err), 0) << err;
  EXPECT_EQ(out, alone);
  ASSERT_EQ(decode(scoring, out, err, "model2.h5"), 0) << err;
  const std::vector<double> second = scores_of(out);
  ASSERT_EQ(decode(scoring + " --checkpoint " + model2 + " --weights 1 3", out, err), 0) << err;
  const std::vector<double> mixed = scores_of(out);
  ASSERT_EQ(mixed.size(), 4u) << out;
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_GT(std::abs(second[i] - scores[i]), 1e-2) << "the models must differ, line " << i + 1;
    EXPECT_NEAR(mixed[i], 0.25 * scores[i] + 0.75 * second[i], 1e-5) << "line " << i + 1;
  }
  fs::remove(copy);

  // int8 products: near the float scores (a random model's log-probabilities move by
  // ~0.1% under per-channel int8 weights and per-row int8 activations).
  if (decode("--compute-type int8 --max-len-b 2", out, err) == 0) {
    ASSERT_EQ(decode(scoring + " --compute-type int8", out, err), 0) << err;
    const std::vector<double> int8 = scores_of(out);
    ASSERT_EQ(int8.size(), 4u) << out;
    for (size_t i = 0; i < 3; ++i) {
      EXPECT_NEAR(int8[i], scores[i], 0.01 * std::abs(scores[i]) + 0.01) << "line " << i + 1;
    }
  }
}

// --reference-nbest: an n-best list in --nbest's format rescored against its input lines,
// each line written back with ' ||| SCORE' appended: the score --score-reference gives the
// same hypothesis as a plain line, -inf for the over-long input's, read a buffer of input
// lines at a time the same; lines that are not n-best lines, out of input order or beyond
// the input are refused naming the line.
TEST_F(DecodeProgram, ReferenceNbestRescoresEachHypothesisAgainstItsInputLine) {
  std::string nbest, out, err;
  ASSERT_EQ(decode("--nbest 3 --beam 3 --max-len-b 4", nbest, err), 0) << err;
  const std::vector<std::string> hypotheses = lines_of(nbest);
  ASSERT_EQ(hypotheses.size(), 12u) << nbest;
  {
    std::ofstream file(dir_ / "nbest.txt");
    file << nbest;
  }
  const std::string rescoring =
      "--score-reference " + (dir_ / "nbest.txt").string() + " --reference-nbest";
  ASSERT_EQ(decode(rescoring, out, err), 0) << err;
  const std::vector<std::string> rescored = lines_of(out);
  ASSERT_EQ(rescored.size(), hypotheses.size()) << out;
  // The same pairs as plain lines: each hypothesis' input line, and its text.
  const std::vector<std::string> inputs = lines_of(read_file(dir_ / "input.en") );
  {
    std::ofstream sources(dir_ / "nbest_sources.en"), texts(dir_ / "nbest_texts.en");
    for (const std::string& line : hypotheses) {
      const size_t first = line.find(" ||| "), second = line.rfind(" ||| ");
      sources << inputs.at(std::stoul(line.substr(0, first))) << "\n";
      texts << line.substr(first + 5, second - first - 5) << "\n";
    }
  }
  std::string plain;
  ASSERT_EQ(decode("--score-reference " + (dir_ / "nbest_texts.en").string(), plain, err,
                   "model.h5", true, "nbest_sources.en"),
            0)
      << err;
  const std::vector<std::string> plain_scores = lines_of(plain);
  ASSERT_EQ(plain_scores.size(), hypotheses.size());
  for (size_t i = 0; i < hypotheses.size(); ++i) {
    ASSERT_EQ(rescored[i].rfind(hypotheses[i] + " ||| ", 0), 0u) << rescored[i];
    const std::string score = rescored[i].substr(hypotheses[i].size() + 5);
    if (i >= 9) {  // line 3's: its input is beyond the position table
      EXPECT_EQ(score, "-inf") << rescored[i];
      continue;
    }
    EXPECT_NEAR(std::stod(score), std::stod(plain_scores[i]), 1e-5) << rescored[i];
  }
  // A buffer of input lines at a time, from a pipe: the same lines.
  const std::string command =
      "cat " + (dir_ / "input.en").string() + " | " + thpc::binary_dir() +
      "/transformer_decode --checkpoint " + (dir_ / "model.h5").string() + " --spm-model " +
      (dir_ / "spm.model").string() + " --input - --buffer-sentences 1 " + rescoring + " > " +
      (dir_ / "piped.txt").string() + " 2> " + (dir_ / "err.txt").string();
  ASSERT_EQ(std::system(command.c_str()), 0) << read_file(dir_ / "err.txt");
  const std::vector<std::string> piped = lines_of(read_file(dir_ / "piped.txt"));
  ASSERT_EQ(piped.size(), rescored.size());
  for (size_t i = 0; i < piped.size(); ++i) {
    const std::string a = piped[i].substr(piped[i].rfind(" ||| ") + 5);
    const std::string b = rescored[i].substr(rescored[i].rfind(" ||| ") + 5);
    if (b == "-inf") {
      EXPECT_EQ(a, b);
    } else {
      EXPECT_NEAR(std::stod(a), std::stod(b), 1e-5) << i;
    }
  }
  // Lines it cannot take, each named.
  const auto refused = [&](const std::string& text, const std::string& expected) {
    {
      std::ofstream file(dir_ / "bad_nbest.txt");
      file << text;
    }
    EXPECT_EQ(decode("--score-reference " + (dir_ / "bad_nbest.txt").string() +
                         " --reference-nbest",
                     out, err),
              1)
        << text << err;
    EXPECT_NE(err.find((dir_ / "bad_nbest.txt").string() + ": line " + expected),
              std::string::npos)
        << err;
  };
  refused("0 ||| A man.\nA dog. ||| -1.0\n", "2 is not an n-best line 'INDEX ||| text ||| ...'");
  refused("2 ||| A man. ||| -1.0\n0 ||| A dog. ||| -2.0\n",
          "2 is for input line 0 after a line for 2: the n-best list must be in input order");
  refused("0 ||| A man.\n4 ||| A dog.\n",
          "2 is for input line 4, but " + (dir_ / "input.en").string() + " has 4 lines");
  EXPECT_EQ(decode("--reference-nbest", out, err), 2) << err;
  EXPECT_NE(err.find("--reference-nbest goes with --score-reference FILE"), std::string::npos)
      << err;
}

// What --score-reference cannot mean is refused with the option's name (exit 2); files
// of other line counts, regular or read as they come, are the data's error (exit 1),
// said with both names.
TEST_F(DecodeProgram, ScoreReferenceRefusesOtherLineCountsAndSearchOptions) {
  {
    std::ofstream three(dir_ / "three.en");
    three << "A man rides a bike.\n\nDogs are playing in the snow.\n";
    std::ofstream five(dir_ / "five.en");
    five << "a\nb\nc\nd\ne\n";
  }
  const std::string input = (dir_ / "input.en").string(), three = (dir_ / "three.en").string(),
                    five = (dir_ / "five.en").string();
  const std::string line_n = ": line n of the one is scored as the translation of line n of the "
                             "other; give files of one line count";
  std::string out, err;
  EXPECT_EQ(decode("--score-reference " + three, out, err), 1) << err;
  EXPECT_NE(err.find(input + " has 4 lines and --score-reference " + three + " has 3 lines" +
                     line_n),
            std::string::npos)
      << err;
  EXPECT_EQ(out, "");
  // A file given as standard input is counted as well, before anything is scored.
  EXPECT_EQ(decode("--score-reference - --buffer-sentences 1 < " + five, out, err), 1) << err;
  EXPECT_NE(err.find(input + " has 4 lines and --score-reference <stdin> has 5 lines" + line_n),
            std::string::npos)
      << err;
  EXPECT_EQ(out, "");
  // Pipes, compared as they are read (a buffer of one line at a time): the shorter side
  // said where it ends, exactly, and the side not read to its end "at least".
  const auto piped = [&](const std::string& pipe, const std::string& options,
                         const std::string& buffer = "1") {
    const std::string command =
        "cat " + pipe + " | " + thpc::binary_dir() + "/transformer_decode --checkpoint " +
        (dir_ / "model.h5").string() + " --spm-model " + (dir_ / "spm.model").string() +
        " --buffer-sentences " + buffer + " " + options + " > " + (dir_ / "out.txt").string() +
        " 2> " +
        (dir_ / "err.txt").string();
    const int status = std::system(command.c_str());
    out = read_file(dir_ / "out.txt");
    err = read_file(dir_ / "err.txt");
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  };
  EXPECT_EQ(piped(three, "--input " + input + " --score-reference -"), 1) << err;
  EXPECT_NE(err.find(input + " has 4 lines and --score-reference <stdin> has 3 lines" + line_n),
            std::string::npos)
      << err;
  EXPECT_EQ(lines_of(out).size(), 3u) << "the pairs before the end are written: " << out;
  EXPECT_EQ(piped(five, "--input " + input + " --score-reference -"), 1) << err;
  EXPECT_NE(err.find(input + " has 4 lines and --score-reference <stdin> has at least 5 lines" +
                     line_n),
            std::string::npos)
      << err;
  EXPECT_EQ(piped(input, "--input - --score-reference " + three), 1) << err;
  EXPECT_NE(err.find("<stdin> has at least 4 lines and --score-reference " + three +
                     " has 3 lines" + line_n),
            std::string::npos)
      << err;
  // One count, the pipe ending with a buffer of two: every pair scored.
  EXPECT_EQ(piped(input, "--input - --score-reference " + input, "2"), 0) << err;
  EXPECT_EQ(lines_of(out).size(), 4u) << out;
  // One pipe as both sides is refused before anything is read.
  EXPECT_EQ(piped(input, "--input - --score-reference /dev/stdin"), 2) << err;
  EXPECT_NE(err.find("--input - and --score-reference /dev/stdin are one stream (standard "
                     "input): each would read lines of the other"),
            std::string::npos)
      << err;
  {
    std::ofstream empty(dir_ / "empty.en");
    std::ofstream one(dir_ / "one.en");
    one << "A dog.\n";
  }
  EXPECT_EQ(decode("--score-reference " + (dir_ / "one.en").string(), out, err, "model.h5", true,
                   "empty.en"),
            1)
      << err;
  EXPECT_NE(err.find((dir_ / "empty.en").string() + " has 0 lines and --score-reference " +
                     (dir_ / "one.en").string() + " has 1 line" + line_n),
            std::string::npos)
      << err;
  const std::string scoring = "--score-reference " + input;
  for (const std::string searching :
       {"--beam 2", "--lenpen 1", "--max-len-b 3", "--sampling full", "--nbest 2", "--greedy",
        "--tree-constraints"}) {
    EXPECT_EQ(decode(scoring + " " + searching, out, err), 2) << searching << ": " << err;
    const std::string option = searching.substr(0, searching.find(' '));
    EXPECT_NE(err.find(option + " does not go with --score-reference, which scores the given "
                                "lines instead of searching for translations"),
              std::string::npos)
        << err;
  }
  EXPECT_EQ(decode("--normalize", out, err), 2) << err;
  EXPECT_NE(err.find("--normalize goes with --score-reference"), std::string::npos) << err;
  EXPECT_EQ(decode("--score-reference " + (dir_ / "absent.en").string(), out, err), 1) << err;
  EXPECT_NE(err.find((dir_ / "absent.en").string() + ": no such file (--score-reference)"),
            std::string::npos)
      << err;
  // --dump-lines alone is refused as scoring's, not as half of a pair with --dump-attention.
  EXPECT_EQ(decode(scoring + " --dump-lines 1", out, err), 2) << err;
  EXPECT_NE(err.find("--dump-lines does not go with --score-reference"), std::string::npos) << err;
  // The reference may not be the output either.
  EXPECT_EQ(decode(scoring + " --output " + input, out, err), 2) << err;
}

// --sampling: a seed gives the same translations on every run and with any number of
// workers, another seed others; --beam N --nbest N gives N samples per sentence; the
// options are refused with their names (exit 2).
TEST_F(DecodeProgram, SamplingIsReproducibleForASeedAndRefusesBadOptions) {
  for (const std::string method :
       {"full", "topk=10", "topp=0.9 --temperature 1.5", "topk=10 --beam 3 --nbest 3"}) {
    const std::string options = "--max-len-b 8 --sampling " + method;
    std::string first, again, err;
    ASSERT_EQ(decode(options + " --seed 3 --threads 1", first, err), 0) << err;
    // Four input lines, one empty: with --nbest 3 three lines each.
    ASSERT_EQ(lines_of(first).size(), method.find("--nbest 3") != std::string::npos ? 12u : 4u)
        << first;
    for (const char* threads : {"1", "2", "3"}) {
      ASSERT_EQ(decode(options + " --seed 3 --threads " + threads, again, err), 0) << err;
      EXPECT_EQ(again, first) << method << " --threads " << threads;
    }
    ASSERT_EQ(decode(options + " --seed 4", again, err), 0) << err;
    EXPECT_NE(again, first) << method << ": another seed, other samples";
  }
  std::string out, err;
  ASSERT_EQ(decode("--max-len-b 5 --sampling full --beam 3 --nbest 3", out, err), 0) << err;
  EXPECT_EQ(lines_of(out).size(), 3u * 4u) << out;  // the empty line's three too
  // With an ensemble too.
  ASSERT_EQ(decode("--max-len-b 5 --sampling topk=5 --checkpoint " + (dir_ / "model2.h5").string(),
                   out, err),
            0)
      << err;
  for (const auto& [options, message] : std::vector<std::pair<std::string, std::string>>{
           {"--sampling topk=0", "--sampling 'topk=0': K must be a whole number >= 1"},
           {"--sampling topp=1.5", "--sampling 'topp=1.5': P must be a number in (0, 1]"},
           {"--sampling beam", "--sampling 'beam': not a sampling method"},
           {"--sampling full --temperature 0", "--temperature '0': expected a number > 0"},
           {"--sampling full --seed -3", "--seed '-3': expected a whole number"},
           {"--temperature 0.5", "--temperature goes with --sampling (a search draws nothing)"},
           {"--seed 5", "--seed goes with --sampling (a search draws nothing)"},
           {"--sampling full --greedy", "--sampling and --greedy: choose one"},
           // (it said "a beam of 1 (--beam)", no --beam given)
           {"--sampling full --nbest 2",
            "--nbest 2 asks for more translations a sentence than the search keeps: "
            "--sampling draws one unless --beam N asks for N; give --beam 2 or more"}}) {
    EXPECT_EQ(decode(options, out, err), 2) << options << ": " << err;
    EXPECT_NE(err.find(message), std::string::npos) << options << ": " << err;
    EXPECT_EQ(lines_of(err).size(), 1u) << err;
  }
}

TEST(DecodeHelp, ListsTheEnsembleAndSamplingOptions) {
  const ProcessResult help =
      run_process(thpc::binary_dir() + "/transformer_decode --help");
  EXPECT_EQ(help.exit_code, 0);
  for (const char* option : {"--checkpoint arg", "--weights arg", "--sampling arg",
                             "--temperature arg", "--seed arg", "ensemble", "topp=P"}) {
    EXPECT_NE(help.output.find(option), std::string::npos) << option << "\n" << help.output;
  }
}

// Options that cannot mean what they say are refused (issue 54): more n-best lines than
// the search keeps (they were cut to the beam; --greedy --nbest 2 wrote plain lines), an
// infinite length penalty (every score -0), and --spm-model of another vocabulary of the
// same size than the one the checkpoint stores (every translation in other pieces).
TEST_F(DecodeProgram, OptionsThatCannotMeanWhatTheySayAreRefused) {
  std::string out, err;
  EXPECT_EQ(decode("--nbest 5 --max-len-b 2", out, err), 2) << err;
  EXPECT_NE(err.find("--nbest 5 asks for more translations a sentence than the search keeps: a "
                     "beam of 4 (the checkpoint's decode.beam); give --beam 5 or more"),
            std::string::npos)
      << err;
  EXPECT_EQ(decode("--beam 3 --nbest 4 --max-len-b 2", out, err), 2) << err;
  EXPECT_NE(err.find("a beam of 3 (--beam)"), std::string::npos) << err;
  EXPECT_EQ(decode("--greedy --nbest 2 --max-len-b 2", out, err), 2) << err;
  EXPECT_NE(err.find("--greedy keeps one"), std::string::npos) << err;
  EXPECT_EQ(decode("--greedy --beam 5 --max-len-b 2", out, err), 2) << err;  // ignored before
  EXPECT_NE(err.find("--greedy and --beam 5: choose one"), std::string::npos) << err;
  EXPECT_EQ(decode("--greedy --lenpen 1 --max-len-b 2", out, err), 2) << err;  // ignored too
  EXPECT_NE(err.find("--greedy and --lenpen: greedy search has no length penalty"),
            std::string::npos)
      << err;
  EXPECT_EQ(decode("--beam 5 --nbest 5 --max-len-b 2", out, err), 0) << err;
  EXPECT_EQ(decode("--lenpen inf --max-len-b 2", out, err), 2) << err;
  EXPECT_NE(err.find("--lenpen must be finite"), std::string::npos) << err;
  // The checkpoint stores the German model; --spm-model names the English one.
  EXPECT_EQ(decode("--max-len-b 2", out, err, "model_de_spm.h5"), 2) << err;
  EXPECT_NE(err.find("--spm-model " + (dir_ / "spm.model").string() +
                     " is not the SentencePiece model stored in " +
                     (dir_ / "model_de_spm.h5").string() + " (id "),
            std::string::npos)
      << err;
  EXPECT_EQ(lines_of(err).size(), 1u) << err;
  EXPECT_NE(err.find("leave --spm-model out to use the stored one"), std::string::npos) << err;
  // Beside a member that stores none, leaving it out is no way out: it was advised, and
  // then refused for the member's sake.
  EXPECT_EQ(decode("--max-len-b 2 --checkpoint " + (dir_ / "model.h5").string(), out, err,
                   "model_de_spm.h5"),
            2)
      << err;
  EXPECT_NE(err.find("give the spm.model " + (dir_ / "model_de_spm.h5").string() +
                     " was trained with"),
            std::string::npos)
      << err;
  // The very model it stores is fine.
  EXPECT_EQ(decode("--max-len-b 2", out, err, "model_spm.h5"), 0) << err;
}

TEST_F(DecodeProgram, BadInputFailsWithAMessage) {
  std::string out, err;
  EXPECT_EQ(decode("--beam 0", out, err), 2) << err;
  EXPECT_EQ(decode("--threads -1", out, err), 2) << err;
  EXPECT_EQ(decode("--threads 2 --max-len-b 2", out, err), 0) << err;  // a valid setting
  const std::string missing = thpc::binary_dir() +
                              "/transformer_decode --checkpoint /nonexistent.h5 --spm-model x"
                              " < /dev/null > /dev/null 2>&1";
  const int status = std::system(missing.c_str());
  EXPECT_EQ(WIFEXITED(status) ? WEXITSTATUS(status) : -1, 1);
  // A file without line ends (zeroed blocks): refused at 256 MiB, not read until the
  // memory ran out and then said as "read error".
  if (fs::exists("/dev/zero")) {
    fs::create_symlink("/dev/zero", dir_ / "zeros.en");
    EXPECT_EQ(decode("--max-len-b 2", out, err, "model.h5", true, "zeros.en"), 1) << err;
    EXPECT_NE(err.find("line 1 is longer than 256 MiB without a line end"), std::string::npos)
        << err;
  }

  // A checkpoint that is a directory, an --spm-model that is text: said in the user's
  // words (before: "no such file", and SentencePiece's "Internal: ...cc(1101) [...]").
  const fs::path text = dir_ / "not_a_model.txt";
  std::ofstream(text) << "A dog runs.\n";
  // A run directory names its newest healthy step's file (a helper's walk: fairseq users
  // give one), not a newer damaged or diverged one.
  const fs::path run = dir_ / "a_run";
  fs::create_directories(run);
  fs::copy_file(dir_ / "model.h5", run / "step_00000010.h5");
  std::ofstream(run / "step_00000003.h5") << "x";
  std::ofstream(run / "step_00000012.h5") << "damaged";
  for (const auto& [arguments, message] : std::vector<std::pair<std::string, std::string>>{
           {"--checkpoint " + dir_.string(), dir_.string() + ": a directory, not a checkpoint"},
           {"--checkpoint " + run.string(),
            run.string() + ": a directory, not a checkpoint file: give one of its files, e.g. " +
                (run / "step_00000010.h5").string() + " (its newest healthy step)"},
           // (before: "no such file" for a device or a pipe that is there)
           {"--checkpoint /dev/null", "/dev/null: not a regular file, so not a checkpoint file"},
           {"--checkpoint " + (dir_ / "model.h5").string() + " --spm-model " + text.string(),
            "'" + text.string() + "': the file is not a SentencePiece model (give the spm"},
           // (before: libstdc++'s "basic_filebuf::underflow error reading the file: Is a
           // directory", and SentencePiece's `Not found: "F": ... Error #2`)
           {"--checkpoint " + (dir_ / "model.h5").string() + " --spm-model " + dir_.string(),
            "cannot load SentencePiece model '" + dir_.string() + "': is a directory, not a "
            "file"},
           {"--checkpoint " + (dir_ / "model.h5").string() + " --spm-model " +
                (dir_ / "nope.model").string(),
            "cannot load SentencePiece model '" + (dir_ / "nope.model").string() +
                "': no such file"}}) {
    const ProcessResult refused = run_process(thpc::binary_dir() + "/transformer_decode " +
                                              arguments + " --max-len-b 2 < /dev/null");
    EXPECT_EQ(refused.exit_code, 1) << refused.output;
    EXPECT_NE(refused.output.find(message), std::string::npos) << refused.output;
  }

  // Invalid UTF-8 is refused naming the file and line, as transformer_score does.
  const fs::path bad = dir_ / "bad_utf8.en";
  std::ofstream(bad, std::ios::binary) << "A dog runs.\nA \xC3(cat.\n";
  const ProcessResult invalid = run_process(
      thpc::binary_dir() + "/transformer_decode --checkpoint " +
      (dir_ / "model.h5").string() + " --spm-model " + (dir_ / "spm.model").string() +
      " --input " + bad.string() + " --max-len-b 2");
  EXPECT_EQ(invalid.exit_code, 1) << invalid.output;
  EXPECT_NE(invalid.output.find(bad.string() + ": line 2: invalid UTF-8 at byte 3 of the line: "
                                "the text is not UTF-8; convert the file first"),
            std::string::npos)
      << invalid.output;
  // A compressed input, or the checkpoint given for it, is said as such (before: "invalid
  // UTF-8 ... iconv -f LATIN1", which would not help).
  const fs::path gzipped = dir_ / "gzipped.en";
  std::ofstream(gzipped, std::ios::binary) << std::string("\x1f\x8b\x08\x00\x00\x00", 6);
  for (const auto& [input, message] :
       {std::pair<std::string, std::string>{gzipped.string(),
                                            ": is gzip-compressed, not text (--input): "
                                            "decompress it first (gunzip -k " +
                                                gzipped.string() + ")"},
        {(dir_ / "model.h5").string(),
         ": is a checkpoint, not text (--input): give the text file"},
        // (the option named: "in: is a directory, not a file" said nothing of --input; a
        // helper's trial)
        {dir_.string(), ": is a directory, not a file (--input)"}}) {
    const ProcessResult binary = run_process(
        thpc::binary_dir() + "/transformer_decode --checkpoint " +
        (dir_ / "model.h5").string() + " --spm-model " + (dir_ / "spm.model").string() +
        " --input " + input + " --max-len-b 2");
    EXPECT_EQ(binary.exit_code, 1) << binary.output;
    EXPECT_NE(binary.output.find(input + message), std::string::npos) << binary.output;
  }
  // So are a NUL byte and lines ended by a carriage return alone, as transformer_preprocess
  // refuses them (before: translated, the second file's three sentences as one line).
  const fs::path nul = dir_ / "nul.en";
  std::ofstream(nul, std::ios::binary) << std::string("A dog runs.\nA c\0at.\n", 20);
  const fs::path mac = dir_ / "mac.en";
  std::ofstream(mac, std::ios::binary) << "A dog runs.\rA cat.\rA bird.\r";
  // Two sentences: one carriage return inside the one line the file reads as (before:
  // translated as one sentence, exit 0).
  const fs::path mac_two = dir_ / "mac_two.en";
  std::ofstream(mac_two, std::ios::binary) << "A dog runs.\rA cat.\r";
  // Carriage returns inside lines of \n line ends: not called classic Mac text, and the
  // way that keeps the line count said (a helper's walk: told to tr '\r' '\n' alone).
  const fs::path mixed = dir_ / "mixed.en";
  std::ofstream(mixed, std::ios::binary) << "A dog\rruns.\rA cat.\nA bird\rsings.\r\n";
  for (const auto& [input, message] : std::vector<std::pair<fs::path, std::string>>{
           {mixed, mixed.string() + ": more of its sentences end in a carriage return alone "
                                    "than in a line end (its 2 lines hold 3 carriage returns "
                                    "before their ends: classic Mac OS text joined to text of "
                                    "\\n line ends?); if they are not sentence ends, delete "
                                    "them (tr -d '\\r' < FILE > NEW) or make them spaces, "
                                    "else: convert it to \\n line ends"},
           {nul, nul.string() + ":2: a NUL byte at byte 4 of the line"},
           {mac, mac.string() + ": its lines end in a carriage return alone"},
           {mac_two, mac_two.string() + ": its lines end in a carriage return alone "
                                        "(classic Mac OS text: what reads as 1 line holds "
                                        "1 carriage return before its end)"}}) {
    const ProcessResult refused = run_process(
        thpc::binary_dir() + "/transformer_decode --checkpoint " +
        (dir_ / "model.h5").string() + " --spm-model " + (dir_ / "spm.model").string() +
        " --input " + input.string() + " --max-len-b 2");
    EXPECT_EQ(refused.exit_code, 1) << refused.output;
    EXPECT_NE(refused.output.find(message), std::string::npos) << refused.output;
  }

  // The parsing mode's constraint on a translation model: its vocabulary has no tree
  // tokens, which the one line says.
  const ProcessResult not_a_parser = run_process(
      thpc::binary_dir() + "/transformer_decode --checkpoint " +
      (dir_ / "model.h5").string() + " --spm-model " + (dir_ / "spm.model").string() +
      " --tree-constraints --max-len-b 2 < /dev/null");
  EXPECT_EQ(not_a_parser.exit_code, 1) << not_a_parser.output;
  EXPECT_NE(not_a_parser.output.find("--tree-constraints: " + (dir_ / "spm.model").string() +
                                     ": the vocabulary has no"),
            std::string::npos)
      << not_a_parser.output;
  // ... also with the words as leaves (no '▁)' piece), and --tree-leaves only with the
  // constraint and only XX or words (a bad command line: exit 2).
  const std::string decode = thpc::binary_dir() + "/transformer_decode --checkpoint " +
                             (dir_ / "model.h5").string() + " --spm-model " +
                             (dir_ / "spm.model").string() + " --max-len-b 2";
  const ProcessResult words_not_a_parser =
      run_process(decode + " --tree-constraints --tree-leaves words < /dev/null");
  EXPECT_EQ(words_not_a_parser.exit_code, 1) << words_not_a_parser.output;
  EXPECT_NE(words_not_a_parser.output.find("the vocabulary has no"), std::string::npos)
      << words_not_a_parser.output;
  for (const auto& [arguments, message] :
       std::vector<std::pair<std::string, std::string>>{
           {" --tree-leaves words", "--tree-leaves goes with --tree-constraints"},
           {" --tree-constraints --tree-leaves tags", "--tree-leaves 'tags': expected XX or words"}}) {
    const ProcessResult refused = run_process(decode + arguments + " < /dev/null");
    EXPECT_EQ(refused.exit_code, 2) << arguments << ": " << refused.output;
    EXPECT_NE(refused.output.find(message), std::string::npos) << refused.output;
  }
}


// make_decode_batches: longest first, each batch within the token budget (its longest
// sentence + 1, times its size) and, when given, the sentence limit; every non-empty
// sentence in exactly one batch.
TEST(DecodeBatches, TokenBudgetAndSentenceLimitBothHold) {
  std::vector<TokenSequence> sources;
  for (int length : {3, 9, 0, 5, 5, 12, 1, 7, 7, 7, 2, 4}) {
    sources.push_back(TokenSequence(static_cast<size_t>(length), 5));
  }
  BeamOptions options;
  for (const int sentences : {0, 1, 2, 3, 5}) {
    const std::vector<DecodeBatch> batches =
        make_decode_batches(sources, options, /*batch_tokens=*/40, /*workers=*/1, sentences);
    std::vector<int> seen(sources.size(), 0);
    size_t previous_longest = 100;
    for (const DecodeBatch& batch : batches) {
      ASSERT_FALSE(batch.members.empty());
      if (sentences > 0) {
        EXPECT_LE(static_cast<int>(batch.members.size()), sentences);
      }
      size_t longest = 0;
      for (const size_t member : batch.members) {
        ++seen[member];
        longest = std::max(longest, sources[member].size() + 1);
        EXPECT_LE(sources[member].size() + 1, previous_longest) << "longest first";
      }
      if (batch.members.size() > 1) {
        EXPECT_LE(longest * batch.members.size(), 40u);
      }
      previous_longest = sources[batch.members.back()].size() + 1;
    }
    for (size_t i = 0; i < sources.size(); ++i) {
      EXPECT_EQ(seen[i], sources[i].empty() ? 0 : 1) << "sentence " << i << ", limit " << sentences;
    }
    if (sentences == 1) {
      EXPECT_EQ(batches.size(), 11u);  // one a batch, the empty one none
    }
  }
  // The limit only ever adds cuts to the budget's.
  EXPECT_GE(make_decode_batches(sources, options, 40, 1, 2).size(),
            make_decode_batches(sources, options, 40, 1, 0).size());
}

// Exactly 5 truncated lines are each said, and no count line follows (it says "the first 5 said
// above": only where more were truncated); a line of exactly max_positions - 1 = 39 pieces fits,
// is not truncated, and is not warned of. (A mutation audit's survivor.)
TEST_F(DecodeProgram, FiveTruncatedLinesNeedNoCountAndAFullLineNoWarning) {
  {
    std::ofstream five(dir_ / "five_long.en");
    std::string words;
    for (int w = 0; w < 80; ++w) words += "A man rides a bike. ";
    for (int line = 0; line < 5; ++line) five << words << "\n";
  }
  std::string out, err;
  ASSERT_EQ(decode("--max-len-b 1 --greedy", out, err, "model.h5", true, "five_long.en"), 0)
      << err;
  EXPECT_NE(err.find("warning: line 5 has"), std::string::npos) << err;
  EXPECT_EQ(err.find("in all were truncated"), std::string::npos) << err;
  sentencepiece::SentencePieceProcessor spm;
  ASSERT_TRUE(spm.Load((dir_ / "spm.model").string()).ok());
  std::string line;
  std::vector<int> pieces;
  for (int w = 0; w < 100; ++w) {
    line += (w == 0 ? "" : " ") + std::string("dog");
    pieces.clear();
    ASSERT_TRUE(spm.Encode(line, &pieces).ok());
    if (pieces.size() >= 39) break;
  }
  ASSERT_EQ(pieces.size(), 39u) << line;
  {
    std::ofstream full(dir_ / "full.en");
    full << line << "\n";
  }
  ASSERT_EQ(decode("--max-len-b 1 --greedy", out, err, "model.h5", true, "full.en"), 0) << err;
  EXPECT_EQ(err.find("truncated"), std::string::npos) << err;
}

// A batch's tokens, its longest source with eos times its sentences, reach --batch-tokens and no
// further: 8 sources of 9 tokens (10 with eos) make batches of 4 under a budget of 40 (4 x 10 =
// 40 fits) and of 45 (5 x 10 = 50 does not). (A mutation audit's survivor.)
TEST(DecodeBatches, ABatchFillsTheBudgetExactlyCountingEos) {
  const std::vector<TokenSequence> sources(8, TokenSequence(9, 5));
  BeamOptions options;
  for (const int budget : {40, 45}) {
    const std::vector<DecodeBatch> batches = make_decode_batches(sources, options, budget, 1, 0);
    ASSERT_EQ(batches.size(), 2u) << budget;
    EXPECT_EQ(batches[0].members.size(), 4u) << budget;
    EXPECT_EQ(batches[1].members.size(), 4u) << budget;
  }
}

}  // namespace
}  // namespace thpc
