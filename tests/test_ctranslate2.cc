// tools/convert_to_ctranslate2.py and tools/translate_ctranslate2.py: our checkpoint as a
// CTranslate2 model, decoded by CTranslate2 with transformer_decode's search settings,
// must give transformer_decode's translations: the same weights, the same model.
//
// The checkpoints are small random models (2 layers, d_model 32) with every parameter
// perturbed away from its initial value (layer-norm gains off 1, biases off 0), so that a
// mapping error anywhere (a transposed or swapped projection, heads in the wrong order,
// the wrong norm after a sub-layer, the position table's layout, a missing sqrt(d_model))
// changes the translations: random weights have no symmetry that hides one. Variants
// cover what the converter maps differently: sinusoidal and learned positions, attention
// biases, d_k * h != d_model (CTranslate2's head_dim), and separate source and target
// vocabularies (two tables, two SentencePiece models). Greedy translations must be
// identical, line for line. Beam search with no length penalty ranks by the raw
// log-probability on both sides, but CTranslate2 keeps only the finished hypotheses among
// the first `beam` candidates of a step while ours keeps those ranked before the
// beam-th continuing one, and it stops when the best candidate ends; the best
// hypothesis is the same unless two hypotheses tie within the two programs' rounding
// (which a random model's repetitive outputs do now and then): most lines must agree, and
// their scores to the 4 decimals printed.
//
// Needs a Python with numpy and h5py (the converter's refusals; tools/install_deps.sh
// installs them), and ctranslate2 and sentencepiece for the translations (`bash
// tools/install_deps.sh --ctranslate2`; those tests skip without them, since CI does not
// install CTranslate2). A trained model (Multi30k) is compared the same way by
// bench/decode_vs_ctranslate2.sh (bench/RESULTS.md).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <random>
#include <regex>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "config/config.h"
#include "data/sentencepiece_vocabulary.h"
#include "data_dir.h"
#include "kernels/cpu/cpu_backend.h"
#include "model/checkpoint_params.h"
#include "model/transformer.h"
#include "program.h"
#include "python_interpreter.h"
#include "scratch_directory.h"
#include "spm_model.h"

namespace thpc {
namespace {

namespace fs = std::filesystem;

constexpr int kVocab = 300;
constexpr int kGermanVocab = 250;  // not kVocab: a table of the wrong side's size shows
constexpr int kSentences = 20;
const std::string kTools = std::string(THPC_SOURCE_DIR) + "/tools/";

class CTranslate2Conversion : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (data_path("multi30k/train.en").empty() || data_path("multi30k/train.de").empty()) {
      return;  // every test skips in SetUp
    }
    dir_ = fs::temp_directory_path() / ("thpc_ctranslate2_" + std::to_string(getpid()));
    fs::create_directories(dir_);
    // A SentencePiece model on Multi30k English (pad 0, unk 1, bos 2, eos 3), and the
    // first sentences of the test set to translate.
    const auto status = train_multi30k_spm_model(dir_.string(), kVocab);
    ASSERT_TRUE(status.ok()) << status.ToString();
    // And one as Marian trains them (eos 0, unk 1, neither pad nor bos: pad is id 300 and
    // bos 301, after its pieces).
    const auto marian_status =
        train_test_spm_model((dir_ / "sample.en").string(), (dir_ / "spm_marian").string(),
                             kVocab, "--unk_id=1 --eos_id=0 --bos_id=-1 --pad_id=-1");
    ASSERT_TRUE(marian_status.ok()) << marian_status.ToString();
    // A German one of another size, the target's of a model of separate vocabularies
    // (English in, German out, as transformer_preprocess --source-vocab-size makes them),
    // and one spelling its unk otherwise, which CTranslate2's one unk_token cannot take;
    // and an English one spelling its bos otherwise, which a source never holds (the
    // converter refused it).
    {
      std::ifstream corpus(data_path("multi30k/train.de"));
      std::ofstream sample(dir_ / "sample.de");
      std::string line;
      for (int i = 0; i < 3000 && std::getline(corpus, line); ++i) sample << line << "\n";
    }
    for (const auto& [prefix, ids] :
         {std::pair<std::string, std::string>{"spm_de", kProjectSpecialIds},
          {"spm_de_unk", std::string(kProjectSpecialIds) + " --unk_piece=[UNK]"}}) {
      const auto german = train_test_spm_model((dir_ / "sample.de").string(),
                                               (dir_ / prefix).string(), kGermanVocab, ids);
      ASSERT_TRUE(german.ok()) << german.ToString();
    }
    const auto bos = train_test_spm_model((dir_ / "sample.en").string(),
                                          (dir_ / "spm_bos").string(), kVocab,
                                          std::string(kProjectSpecialIds) + " --bos_piece=<BOS>");
    ASSERT_TRUE(bos.ok()) << bos.ToString();
    std::ifstream test(data_path("multi30k/test_2016_flickr.en"));
    std::ofstream input(dir_ / "input.en");
    std::string line;
    for (int i = 0; i < kSentences && std::getline(test, line); ++i) input << line << "\n";
  }
  static void TearDownTestSuite() {
    if (!dir_.empty()) fs::remove_all(dir_);
  }
  void SetUp() override {
    THPC_REQUIRE_DATA("multi30k/train.en");
    THPC_REQUIRE_DATA("multi30k/train.de");
    THPC_REQUIRE_DATA("multi30k/test_2016_flickr.en");
  }

  // Writes NAME.h5: a model of input/tiny.ini shrunk and changed by `overrides`, every
  // parameter moved by 0.1 N(0, 1) from its initial value, with the SentencePiece model
  // SPM.model (its vocabulary and special ids). `recorded_too`: fields the architecture
  // text holds beyond what this version writes (a later version's key). `source_spm`:
  // a model of separate vocabularies, SOURCE_SPM.model the source's, SPM.model the
  // target's.
  static fs::path write_model(const std::string& name, std::vector<std::string> overrides,
                              const std::string& recorded_too = "",
                              const std::string& spm = "spm",
                              const std::string& source_spm = "") {
    for (const char* fixed : {"model.layers=2", "model.d_model=32", "model.d_ff=64",
                              "model.heads=4", "model.max_positions=48"}) {
      overrides.insert(overrides.begin(), fixed);
    }
    const Config config = load_config(std::string(THPC_SOURCE_DIR) + "/input/tiny.ini", overrides);
    auto backend = make_cpu_backend(DType::F32);
    sentencepiece::SentencePieceProcessor processor;
    EXPECT_TRUE(processor.Load((dir_ / (spm + ".model")).string()).ok());
    const SentencePieceVocabulary vocabulary = vocabulary_of(processor);
    int source_vocab = 0;
    if (!source_spm.empty()) {
      sentencepiece::SentencePieceProcessor source_processor;
      EXPECT_TRUE(source_processor.Load((dir_ / (source_spm + ".model")).string()).ok());
      source_vocab = vocabulary_of(source_processor).size;
    }
    Transformer model(config.model, VocabularySizes{vocabulary.size, source_vocab},
                      vocabulary.ids, *backend, /*init_seed=*/7);
    Checkpoint checkpoint;
    checkpoint.seed = config.train.seed;
    checkpoint.architecture =
        architecture_text(config.model, vocabulary.size, source_vocab) + recorded_too;
    checkpoint.config_ini = config.to_ini();
    checkpoint.params = gather_named(model.params(), *backend, model.params().params());
    std::mt19937 generator(11);
    std::normal_distribution<float> normal(0.0f, 0.1f);
    for (NamedTensor& tensor : checkpoint.params) {
      for (float& value : tensor.values) value += normal(generator);
    }
    checkpoint.spm_model = read_file(dir_ / (spm + ".model"));
    if (!source_spm.empty()) checkpoint.source_spm_model = read_file(dir_ / (source_spm + ".model"));
    const fs::path path = dir_ / (name + ".h5");
    write_checkpoint(path.string(), checkpoint);
    return path;
  }

  // Runs `python` on a script of tools/ with `arguments`.
  static ProcessResult run_tool(const std::string& python, const std::string& script,
                                const std::string& arguments) {
    return run_process(python + " " + kTools + script + " " + arguments);
  }

  // The interpreter, when it can import `modules`; otherwise skips (or, for modules that
  // tools/install_deps.sh installs into a named interpreter, fails).
  static std::string interpreter_with(const std::string& modules, bool optional,
                                      std::string& why_not) {
    const Interpreter interpreter = python_interpreter();
    const ProcessResult imported =
        run_process(interpreter.path + " -c 'import " + modules + "'");
    if (imported.exit_code == 0) return interpreter.path;
    const std::vector<std::string> said = lines_of(imported.output);  // the error is last
    why_not = interpreter.path + " cannot import " + modules + " (" +
              (optional ? "bash tools/install_deps.sh --ctranslate2 installs them"
                        : "bash tools/install_deps.sh installs them") +
              " into ~/.cache/thpc-venv, or set THPC_PYTHON): " +
              (said.empty() ? std::string() : said.back());
    if (!optional && interpreter.named) ADD_FAILURE() << why_not;
    return {};
  }

  // transformer_decode's and CTranslate2's translations of input.en, with `search`
  // options both programs take (--greedy, --beam N, --lenpen A, --nbest N).
  static void translate_both(const fs::path& checkpoint, const std::string& python,
                             const std::string& search, std::string& ours,
                             std::string& theirs) {
    const fs::path model = dir_ / (checkpoint.stem().string() + "_ct2");
    const ProcessResult converted =
        run_tool(python, "convert_to_ctranslate2.py",
                 "--checkpoint " + checkpoint.string() + " --output_dir " + model.string() +
                     " --force");
    ASSERT_EQ(converted.exit_code, 0) << converted.output;
    const fs::path input = dir_ / "input.en";
    const fs::path our_file = dir_ / "ours.txt", their_file = dir_ / "theirs.txt";
    const ProcessResult decoded = run_process(
        thpc::binary_dir() + "/transformer_decode --checkpoint " +
        checkpoint.string() + " --input " + input.string() + " --output " +
        our_file.string() + " --threads 1 " + search);
    ASSERT_EQ(decoded.exit_code, 0) << decoded.output;
    const ProcessResult translated =
        run_tool(python, "translate_ctranslate2.py",
                 "--model " + model.string() + " --input " + input.string() + " --output " +
                     their_file.string() + " " + search);
    ASSERT_EQ(translated.exit_code, 0) << translated.output;
    ours = read_file(our_file);
    theirs = read_file(their_file);
  }

  static fs::path dir_;
};

fs::path CTranslate2Conversion::dir_;

TEST_F(CTranslate2Conversion, GreedyTranslationsAreIdenticalForEveryMapping) {
  std::string why_not;
  const std::string python = interpreter_with("ctranslate2, sentencepiece, h5py, numpy",
                                              /*optional=*/true, why_not);
  if (python.empty()) GTEST_SKIP() << why_not;
  const std::vector<
      std::tuple<std::string, std::vector<std::string>, std::string, std::string>>
      variants = {
          {"sinusoidal", {}, "spm", ""},
          {"learned", {"model.positions=learned"}, "spm", ""},
          {"biases", {"model.attention_bias=true"}, "spm", ""},
          {"head_width", {"model.d_k=16", "model.d_v=16"}, "spm", ""},  // 4 heads of 16 in 32
          // The vocabulary's pad and bos after its pieces, as "<pad>" and "<s>".
          {"marian_vocabulary", {}, "spm_marian", ""},
          // English pieces in (src_embed.weight), German pieces out (embed.weight).
          {"separate_vocabularies", {}, "spm_de", "spm"},
          {"separate_source_bos_spelt_otherwise", {}, "spm_de", "spm_bos"},
      };
  for (const auto& [name, overrides, spm, source_spm] : variants) {
    std::string ours, theirs;
    translate_both(write_model(name, overrides, "", spm, source_spm), python, "--greedy", ours,
                   theirs);
    const std::vector<std::string> our_lines = lines_of(ours), their_lines = lines_of(theirs);
    ASSERT_EQ(our_lines.size(), static_cast<size_t>(kSentences)) << name;
    ASSERT_EQ(their_lines.size(), our_lines.size()) << name;
    for (int i = 0; i < kSentences; ++i) {
      EXPECT_FALSE(our_lines[i].empty()) << name << " line " << i + 1;
      EXPECT_EQ(their_lines[i], our_lines[i]) << name << " line " << i + 1;
    }
  }
}

// "LINE ||| text ||| score" lines (--nbest) as {text, score} per line, the best first.
std::vector<std::pair<std::string, double>> best_of_each(const std::string& nbest) {
  std::vector<std::pair<std::string, double>> best;
  for (const std::string& line : lines_of(nbest)) {
    const size_t first = line.find(" ||| "), second = line.rfind(" ||| ");
    if (first == std::string::npos || second == first) continue;
    const size_t number = std::stoul(line.substr(0, first));
    if (number < best.size()) continue;  // not the first of its sentence
    best.resize(number + 1);
    best[number] = {line.substr(first + 5, second - first - 5), std::stod(line.substr(second + 5))};
  }
  return best;
}

TEST_F(CTranslate2Conversion, BeamSearchWithoutLengthPenaltyFindsTheSameBest) {
  std::string why_not;
  const std::string python = interpreter_with("ctranslate2, sentencepiece, h5py, numpy",
                                              /*optional=*/true, why_not);
  if (python.empty()) GTEST_SKIP() << why_not;
  for (const bool separate : {false, true}) {
    std::string ours, theirs;
    translate_both(separate ? write_model("beam_separate", {}, "", "spm_de", "spm")
                            : write_model("beam", {}),
                   python, "--beam 4 --lenpen 0 --nbest 2", ours, theirs);
    const auto our_best = best_of_each(ours), their_best = best_of_each(theirs);
    ASSERT_EQ(our_best.size(), static_cast<size_t>(kSentences)) << ours;
    ASSERT_EQ(their_best.size(), our_best.size()) << theirs;
    int same = 0;
    for (int i = 0; i < kSentences; ++i) {
      if (our_best[i].first != their_best[i].first) continue;
      ++same;
      // Printed with 4 decimals: half a unit of the last place each, and fp32 sums of
      // ~60 log-probabilities in a different order (~1e-5).
      EXPECT_NEAR(our_best[i].second, their_best[i].second, 2e-4) << "line " << i + 1;
    }
    std::cout << same << " of " << kSentences << " best translations identical"
              << (separate ? " (separate vocabularies)\n" : "\n");
    // Measured: 20 of 20 with these models; a near-tie decided otherwise would show as 19.
    EXPECT_GE(same, kSentences - 2) << "ours:\n" << ours << "CTranslate2:\n" << theirs;
  }
}

// bench/decode_vs_ctranslate2.sh's GPU comparison runs only in a GPU window, where a
// mistake costs the window's minutes: CT2_DEVICE=cpu runs all of it (the cuBLAS stand-in,
// CTranslate2's runs, the candidate kernels' and two workers' runs, the profiles, the line) with
// CTranslate2 on the CPU, and the line must carry every number the window reports.
TEST_F(CTranslate2Conversion, GpuComparisonScriptRehearsesOnTheCpu) {
  THPC_REQUIRE_DATA("wmt14_test/newstest2014.en");
  std::string why_not;
  const std::string python = interpreter_with("ctranslate2, sentencepiece, h5py, numpy",
                                              /*optional=*/true, why_not);
  if (python.empty()) GTEST_SKIP() << why_not;
  const fs::path checkpoint = write_model("gpu_rehearsal", {});
  constexpr int kLines = 12;
  const ProcessResult run = run_process(
      "cd " + std::string(THPC_SOURCE_DIR) + " && DEVICE=cuda CT2_DEVICE=cpu RUNS=1 MAX_LEN=8 " +
      "CANDIDATE=candidate PYTHON=" + python + " THPC_BUILD=" + thpc::binary_dir() +
      " WMT14_TEST=" + fs::path(data_path("wmt14_test/newstest2014.en")).parent_path().string() +
      " bash bench/decode_vs_ctranslate2.sh " + checkpoint.string() + " " +
      std::to_string(kLines) + " 2>&1");
  ASSERT_EQ(run.exit_code, 0) << run.output;
  std::string line;
  for (const std::string& printed : lines_of(run.output)) {
    if (printed.rfind("decode_vs_ctranslate2: device=cuda", 0) == 0) line = printed;
  }
  ASSERT_FALSE(line.empty()) << run.output;
  auto field = [&](const std::string& name) {
    const size_t at = line.find(" " + name + "=");
    if (at == std::string::npos) return std::string();
    const size_t begin = at + name.size() + 2;
    return line.substr(begin, line.find(' ', begin) - begin);
  };
  // Ours is timed as a run's wall time less an empty run's, which for this tiny model is
  // noise around zero: a rate, or n/a where that difference was not positive (the
  // script then has no time to divide by). CTranslate2's own clock times its decoding
  // alone.
  for (const char* number : {"ours_bf16_tok_s", "ours_bf16_b32_tok_s", "ratio_fp16_b32",
                             "ratio_bf16_b32", "ratio_fp16_t4096", "ours_candidate_bf16_tok_s",
                             "ours_candidate_b32_tok_s", "ours_bf16_vs_ct2_int8_float16_b32",
                             "ours_bf16_b32_launched_tok_s", "graphs_gain_b32"}) {
    const std::string value = field(number);
    EXPECT_TRUE(std::regex_match(value, std::regex("[0-9]+(\\.[0-9]+)?|n/a")))
        << number << " is '" << value << "' in " << line;
  }
  for (const char* rate : {"ct2_fp16_b32_tok_s", "ct2_bf16_b32_tok_s", "ct2_fp16_t4096_tok_s",
                           "ct2_int8_float16_b32_tok_s"}) {
    EXPECT_GT(std::atof(field(rate).c_str()), 0.0) << rate << " in " << line;
  }
  // fp32 on both sides here (CTranslate2 refuses float16 on the CPU): the same best
  // translations but for a near-tie now and then, as in the beam test above.
  const std::string same = field("same_as_ct2_fp16_b32");
  ASSERT_FALSE(same.empty()) << line;
  EXPECT_GE(std::atoi(same.c_str()), kLines - 2) << line;
  EXPECT_EQ(field("candidate_same_lines"), std::to_string(kLines) + "/" + std::to_string(kLines))
      << line;  // the CPU ignores --cuda-kernels
  // GPU_WORKERS (default 2): ours with two workers (here the CPU's, --threads 2) against
  // CTranslate2's inter_threads 2, the same translations as one worker's.
  EXPECT_EQ(field("gpu_workers"), "2") << line;
  EXPECT_EQ(field("workers_same_lines"), std::to_string(kLines) + "/" + std::to_string(kLines))
      << line;
  // And with the candidates (worker_graphs among them: on a GPU every worker captures).
  for (const char* number : {"ours_bf16_b32_w2_tok_s", "ratio_fp16_b32_w2",
                             "ours_candidate_b32_w2_tok_s", "ratio_candidate_fp16_b32_w2"}) {
    const std::string value = field(number);
    EXPECT_TRUE(std::regex_match(value, std::regex("[0-9]+(\\.[0-9]+)?|n/a")))
        << number << " is '" << value << "' in " << line;
  }
  for (const char* rate : {"ct2_fp16_b32_w2_tok_s", "ct2_int8_float16_b32_w2_tok_s"}) {
    EXPECT_GT(std::atof(field(rate).c_str()), 0.0) << rate << " in " << line;
  }
  for (const char* profile : {"ours, profiled (4,096-token batches",
                              "ours, profiled (batches of 32 sentences",
                              "ours with --cuda-kernels candidate, profiled (batches of 32"}) {
    EXPECT_NE(run.output.find(profile), std::string::npos) << profile << "\n" << run.output;
  }
  // Ours in int8 (the CPU's products here, where oneDNN is built in), alone and with the
  // candidate kernels (on a GPU: its decoder steps captured), against CTranslate2's
  // int8_float16.
  if (run.output.find("ours in int8 cannot run here") == std::string::npos) {
    for (const char* number : {"ours_int8_b32_tok_s", "ours_int8_candidate_b32_tok_s",
                               "gpu_quant_vs_ct2_int8", "gpu_quant_candidate_vs_ct2_int8",
                               "ours_int8_b32_w2_tok_s", "gpu_quant_vs_ct2_int8_w2",
                               "ours_int8_candidate_b32_w2_tok_s",
                               "gpu_quant_candidate_vs_ct2_int8_w2"}) {
      const std::string value = field(number);
      EXPECT_TRUE(std::regex_match(value, std::regex("[0-9]+(\\.[0-9]+)?|n/a")))
          << number << " is '" << value << "' in " << line;
    }
    EXPECT_NE(run.output.find("ours in int8 with --cuda-kernels candidate, profiled (batches "
                              "of 32"),
              std::string::npos)
        << run.output;
    for (const char* profile : {"ours in int8 with --gpu-workers 2, profiled (batches of 32",
                                "ours in int8 with --gpu-workers 2 and --cuda-kernels candidate, "
                                "profiled (batches of 32"}) {
      EXPECT_NE(run.output.find(profile), std::string::npos) << profile << "\n" << run.output;
    }
  }
}

// translate_ctranslate2.py writes a translation as transformer_decode's detokenize does:
// the line feed, carriage return and NUL of a byte_fallback model's byte pieces as
// spaces, so that its output stays line for line with the input and with ours.
TEST_F(CTranslate2Conversion, ATranslationsBytePiecesNeverBreakItsLine) {
  std::string why_not;
  const std::string python = interpreter_with("sentencepiece", /*optional=*/true, why_not);
  if (python.empty()) GTEST_SKIP() << why_not;
  const auto trained = train_test_spm_model((dir_ / "sample.en").string(),
                                            (dir_ / "spm_bytes").string(), 600,
                                            std::string(kProjectSpecialIds) +
                                                " --byte_fallback=true");
  ASSERT_TRUE(trained.ok()) << trained.ToString();
  std::ofstream(dir_ / "one_line.py")
      << "import sys\nsys.path.insert(0, '" << kTools << "')\n"
      << "import sentencepiece\nimport translate_ctranslate2\n"
      << "spm = sentencepiece.SentencePieceProcessor(model_file=sys.argv[1])\n"
      << "pieces = ['\\u2581man', '<0x0A>', '<0x0D>', '<0x00>', '\\u2581man']\n"
      << "print(repr(translate_ctranslate2.one_line_text(spm, pieces)))\n";
  const ProcessResult printed = run_process(python + " " + (dir_ / "one_line.py").string() +
                                            " " + (dir_ / "spm_bytes.model").string());
  EXPECT_EQ(printed.exit_code, 0) << printed.output;
  EXPECT_EQ(printed.output, "'man    man'\n");
}

TEST_F(CTranslate2Conversion, ConverterRefusesWhatItCannotConvertWithOneLine) {
  std::string why_not;
  // (sentencepiece for the cases of the vocabularies' pieces and ids: tools/install_deps.sh
  // installs it with the other two)
  const std::string python =
      interpreter_with("h5py, numpy, sentencepiece", /*optional=*/false, why_not);
  if (python.empty()) GTEST_SKIP() << why_not;
  const fs::path out = dir_ / "refused";
  auto convert = [&](const std::string& arguments) {
    return run_tool(python, "convert_to_ctranslate2.py", arguments);
  };
  struct Case {
    std::string arguments, message;
    int exit_code;
  };
  const fs::path widths = write_model("widths", {"model.d_k=8", "model.d_v=16"});
  const fs::path pre_norm = write_model("pre_norm", {"model.norm=pre"});
  const fs::path later = write_model("later", {}, " activation=gelu");
  // Separate vocabularies: without the source's SentencePiece model, with one of another
  // size than the source's table, and with an unk spelt otherwise than the target's
  // (CTranslate2's config has one unk_token).
  const fs::path separate_unk = write_model("separate_unk", {}, "", "spm_de_unk", "spm");
  // (a source model of Marian's ids, eos 0 and pad and bos after its pieces: batches give
  // both sides one set of ids, which transformer_decode checks and the converter did not)
  const fs::path separate_other_ids =
      write_model("separate_other_ids", {}, "", "spm_de", "spm_marian");
  const fs::path separate_without_model = dir_ / "separate_without_model.h5";
  const fs::path separate_other_model = dir_ / "separate_other_model.h5";
  {
    Checkpoint checkpoint = read_checkpoint(
        write_model("separate", {}, "", "spm_de", "spm").string(), CheckpointParts::ParamsOnly);
    checkpoint.source_spm_model.clear();
    write_checkpoint(separate_without_model.string(), checkpoint);
    checkpoint.source_spm_model = read_file(dir_ / "spm_marian.model");
    write_checkpoint(separate_other_model.string(), checkpoint);
  }
  // A model of 300 ids storing a SentencePiece model of 300 pieces that lacks pad and bos
  // (302 ids): the count says the added ones.
  const fs::path other_vocabulary = dir_ / "other_vocabulary.h5";
  {
    Checkpoint checkpoint =
        read_checkpoint(write_model("good", {}).string(), CheckpointParts::ParamsOnly);
    checkpoint.spm_model = read_file(dir_ / "spm_marian.model");
    write_checkpoint(other_vocabulary.string(), checkpoint);
  }
  const fs::path run = dir_ / "run";
  fs::create_directories(run);
  std::ofstream(run / "step_00000002.h5") << "a run's checkpoint";
  std::ofstream(run / "config.json") << "{}";
  const fs::path damaged = dir_ / "damaged.h5";
  fs::copy_file(write_model("good", {}), damaged, fs::copy_options::overwrite_existing);
  {
    std::fstream file(damaged, std::ios::in | std::ios::out | std::ios::binary);
    file.seekp(4096);
    file.put('\x5a');
  }
  // Marked diverged by its run: refused as transformer_decode and transformer_quantize
  // refuse it (it converted a NaN model, exit 0).
  const fs::path diverged = dir_ / "diverged.h5";
  fs::copy_file(write_model("good", {}), diverged, fs::copy_options::overwrite_existing);
  mark_checkpoint(diverged.string(), CheckpointState::Diverged);
  const std::vector<Case> cases = {
      {"--checkpoint " + diverged.string() + " --output_dir " + out.string(),
       "checkpoint " + diverged.string() + ": is marked diverged (its run judged its "
       "parameters diverged", 2},
      {"--checkpoint " + widths.string() + " --output_dir " + out.string(),
       "d_k = 8 and d_v = 16 differ: CTranslate2's attention has one head width", 1},
      {"--checkpoint " + pre_norm.string() + " --output_dir " + out.string(),
       "holds a model.norm = pre model; this converter maps post-norm models only", 1},
      // A field it does not know is refused, not converted as if absent (a gelu model
      // would have been converted with ReLU; a helper's trial).
      {"--checkpoint " + later.string() + " --output_dir " + out.string(),
       " activation=gelu' records model.activation, which this converter does not map", 1},
      {"--checkpoint " + separate_without_model.string() + " --output_dir " + out.string(),
       "holds a model of separate vocabularies but no source_spm_model", 1},
      {"--checkpoint " + separate_other_model.string() + " --output_dir " + out.string(),
       "its source SentencePiece model has 300 pieces and 2 special ids after them, the model "
       "a source vocabulary of 300", 1},
      {"--checkpoint " + separate_other_ids.string() + " --output_dir " + out.string(),
       "its source SentencePiece model has the special ids pad/unk/bos/eos 300/1/301/0, the "
       "target's 0/1/2/3: the file is damaged", 1},
      {"--checkpoint " + separate_unk.string() + " --output_dir " + out.string(),
       "its source and target SentencePiece models spell unk as '<unk>' and '[UNK]': "
       "CTranslate2's model names one of each for both vocabularies", 1},
      {"--checkpoint " + damaged.string() + " --output_dir " + out.string(),
       "bad checksum for the file", 1},
      {"--checkpoint " + other_vocabulary.string() + " --output_dir " + out.string(),
       "its SentencePiece model has 300 pieces and 2 special ids after them, the model a "
       "vocabulary of 300", 1},
      {"--checkpoint " + (dir_ / "absent.h5").string() + " --output_dir " + out.string(),
       "absent.h5: No such file or directory", 1},
      {"--checkpoint " + (dir_ / "spm.model").string() + " --output_dir " + out.string(),
       "not a transformer_hpc checkpoint", 1},
      {"--checkpoint " + widths.string() + " --output_dir " + dir_.string(),
       dir_.string() + " exists (--force replaces it)", 2},
      // (An output_dir refused is a usage error, exit 2 as the C++ tools' outputs; it was 1.)
      // --force replaced any directory whole: a run's, with the checkpoint converted (a
      // helper's trial lost a run so); and a file took the whole conversion, then a
      // traceback.
      {"--checkpoint " + widths.string() + " --output_dir " + dir_.string() + " --force",
       dir_.string() + " holds the checkpoint " + widths.string() + ": --force would delete it",
       2},
      {"--checkpoint " + widths.string() + " --output_dir " + run.string() + " --force",
       run.string() + " holds step_00000002.h5, which no conversion writes (a training run's "
       "directory?)", 2},
      {"--checkpoint " + widths.string() + " --output_dir " + damaged.string() + " --force",
       damaged.string() + " is a file, not a directory", 2},
      {"--checkpoint " + widths.string(), "the following arguments are required: --output_dir",
       2},
  };
  for (const Case& c : cases) {
    const ProcessResult refused = convert(c.arguments);
    EXPECT_EQ(refused.exit_code, c.exit_code) << c.arguments << "\n" << refused.output;
    EXPECT_NE(refused.output.find(c.message), std::string::npos) << refused.output;
    EXPECT_EQ(lines_of(refused.output).size(), 1u) << refused.output;
    EXPECT_FALSE(fs::exists(out)) << c.arguments;
  }
  EXPECT_TRUE(fs::exists(run / "step_00000002.h5"));
  EXPECT_TRUE(fs::exists(widths));
}

// translate_ctranslate2.py opened its --output only after translating: a directory not
// made yet lost the whole translation to a traceback. It makes it before the work, as
// transformer_decode does. Driven here with a stand-in model and SentencePiece (the
// driver's own arguments), so that it runs without CTranslate2.
class CTranslate2Translate : public ScratchDirectoryTest {};

TEST_F(CTranslate2Translate, AnOutputInADirectoryNotMadeYetIsWritten) {
  std::ofstream(path("input.en")) << "a b c\nd e\n";
  const std::string output = path("not/made/yet/out.de");
  std::ofstream(path("drive.py")) << R"(import argparse, sys
sys.path.insert(0, sys.argv[1])
import translate_ctranslate2 as tool
class Pieces:
    def encode(self, line, out_type=str): return line.split()
    def decode(self, pieces): return " ".join(reversed(pieces))
args = argparse.Namespace(input=sys.argv[2], output=sys.argv[3], nbest=1, stats=False,
                          max_len_a=1.0, max_len_b=5)
tool.translate(args, "translate_ctranslate2.py", "test", 64, Pieces(), lambda: None,
               lambda model, pieces, limit: [([p], [0.0]) for p in pieces])
)";
  const ProcessResult run = run_process(python_interpreter().path + " " + path("drive.py") +
                                        " " + kTools + " " + path("input.en") + " " + output);
  ASSERT_EQ(run.exit_code, 0) << run.output;
  std::ifstream written(output);
  const std::string text((std::istreambuf_iterator<char>(written)),
                         std::istreambuf_iterator<char>());
  EXPECT_EQ(text, "c b a\ne d\n");
}

// A directory as --output failed only when the output was opened, after the whole
// translation, with an IsADirectoryError traceback: refused with one line before the work.
TEST_F(CTranslate2Translate, ADirectoryAsTheOutputIsRefusedBeforeTranslating) {
  std::ofstream(path("input.en")) << "a b c\n";
  fs::create_directories(path("outdir"));
  std::ofstream(path("drive.py")) << R"(import argparse, sys
sys.path.insert(0, sys.argv[1])
import translate_ctranslate2 as tool
class Pieces:
    def encode(self, line, out_type=str): return line.split()
    def decode(self, pieces): return " ".join(pieces)
def translate_group(model, pieces, limit):
    print("translated", file=sys.stderr)
    return [([p], [0.0]) for p in pieces]
args = argparse.Namespace(input=sys.argv[2], output=sys.argv[3], nbest=1, stats=False,
                          max_len_a=1.0, max_len_b=5)
tool.translate(args, "translate_ctranslate2.py", "test", 64, Pieces(), lambda: None,
               translate_group)
)";
  for (const std::string& output : {path("outdir"), path("outdir") + "/"}) {
    const ProcessResult run = run_process(python_interpreter().path + " " + path("drive.py") +
                                          " " + kTools + " " + path("input.en") + " " + output);
    EXPECT_NE(run.exit_code, 0) << run.output;
    EXPECT_NE(run.output.find("is a directory; give the path of a file"), std::string::npos)
        << run.output;
    EXPECT_EQ(run.output.find("translated"), std::string::npos) << run.output;
    EXPECT_EQ(run.output.find("Traceback"), std::string::npos) << run.output;
  }
}

}  // namespace
}  // namespace thpc
