// transformer_decode: translates text with a trained checkpoint (a step or an average),
// after fairseq-interactive / fairseq-generate.
//
//   transformer_decode --checkpoint FILE [FILE...] [--weights W...] [--spm-model FILE]
//                      [--input FILE|-] [--output FILE]
//                      [--beam B] [--lenpen A] [--max-len-a 1 --max-len-b 50]
//                      [--batch-tokens 4096] [--batch-sentences 0] [--buffer-sentences 100000]
//                      [--nbest 1] [--greedy] [--threads N]
//                      [--gpu-workers N] [--cuda-graphs on|off]
//                      [--compute-type default|float32|bfloat16|int8]
//                      [--sampling full|topk=K|topp=P [--temperature T] [--seed S]]
//                      [--dump-attention FILE.h5 --dump-lines 1,5,9]
//                      [--tree-constraints [--tree-leaves XX|words]] [--profile]
//   transformer_decode --checkpoint FILE [FILE...] --input FILE --score-reference FILE
//                      [--normalize] [--piece-scores] [--reference-nbest] [--batch-tokens ...]
//                      [--threads N]
//                      [--compute-type T]
//
// The SentencePiece model is --spm-model when given, else the one stored in the
// checkpoint by the trainer (fairseq-like). Each input line is SentencePiece-encoded,
// sentences are sorted by length into batches of at most --batch-tokens source tokens
// and --batch-sentences sentences when given (shared among --threads workers on the
// CPU, --gpu-workers on a GPU), translated by batched beam search with a KV
// cache (the checkpoint's [decode] settings unless given here; the defaults are §6.1's:
// beam 4, alpha 0.6, output length <= input length + 50) and written back
// detokenised, one line per input line, in input order; the input is read, translated and
// written --buffer-sentences lines at a time (the batches sorted within each), so that
// memory stays a buffer's. With --nbest K > 1 each input
// gives K lines `INDEX ||| hypothesis ||| score`. --dump-attention stores, for the input
// lines --dump-lines names, every layer's and head's attention weights of the best
// translation in an HDF5 file (decode/attention_dump.h has the layout;
// tools/plot_attention.py draws it). --tree-constraints (the parsing mode) lets the search
// write only well-formed linearized trees over exactly the input line's words
// (decode/tree_filter.h). Several checkpoints decode as an ensemble (decode/ensemble.h:
// the weighted mean of their log-probabilities; models of any sizes sharing one
// vocabulary, the first checkpoint's [decode] and [train] settings applying);
// --sampling draws the translations instead of searching (decode/sampling.h). Both
// outputs are written under a temporary name and renamed, and neither may be an input,
// the other output or a training run's file (checkpoint/output_file.h).
// --score-reference scores given translations instead of searching: log P(line | input
// line) a line, or with --reference-nbest each line of an n-best list against its input
// line (run_scoring, decode/reference_scores.h).
// --profile prints, after the translations, where the decoding time went: each op class's
// time per batch (kernels/profiling_backend.h: GEMMs, attention, layer norms, the
// log-softmax and top-k, the cache's row copies, transfers, and the host time between
// the backend's ops: on a GPU, the device waiting for the host), for the batches of the
// first CPU worker, or of every GPU worker with the time the device had no worker's op
// in flight; where decoding steps are captured into CUDA graphs, a line with the
// workers' captures, replays and refused captures. --compute-type int8 decodes with int8 weight
// matrices: oneDNN's products on the CPU, cuBLASLt's on a GPU (decode/compute_type.h).
// Exit codes:
// 0 success, 1 a bad file or checkpoint, 2 a bad command line (--dump-lines naming a
// line the input lacks, checkpoints of different vocabularies, an output that may not
// be written, included).
#include <fcntl.h>
#include <sentencepiece_processor.h>
#include <sys/stat.h>
#include <unistd.h>

#include <boost/program_options.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iomanip>
#include <iostream>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "backend/factory.h"
#include "checkpoint/checkpoint.h"
#include "checkpoint/output_file.h"
#include "common/cores.h"
#include "common/error.h"
#include "common/input_file.h"
#include "config/config.h"
#include "data/sentencepiece_vocabulary.h"
#include "decode/attention_dump.h"
#include "decode/beam_search.h"
#include "decode/compute_type.h"
#include "decode/ensemble.h"
#include "decode/reference_scores.h"
#include "decode/sampling.h"
#include "decode/translate.h"
#include "decode/tree_filter.h"
#include "io/atomic_file.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/int8_matmul.h"
#include "kernels/cpu/openblas_core.h"
#include "kernels/profiling_backend.h"
#include "metrics/bleu.h"
#include "model/transformer.h"
#include "tools/progress.h"
#include "tools/tool_main.h"

namespace {

namespace po = boost::program_options;

struct Arguments {
  std::vector<std::string> checkpoints;  // one model, or an ensemble
  std::vector<double> given_weights;     // --weights as given
  std::vector<float> weights;            // normalised; empty: equal
  std::string spm_model, input = "-", output = "-";
  int batch_tokens = 4096;
  int batch_sentences = 0;  // 0: no limit but --batch-tokens
  int64_t buffer_sentences = 100000;  // lines read, translated and written at a time; 0: all
  // --beam, --lenpen, --max-len-a, --max-len-b, --greedy, --nbest; unset: the
  // checkpoint's [decode] beam, alpha, max_len_a, max_len_b.
  thpc::SearchOverrides search;
  int threads = -1;  // < 0: the checkpoint's train.threads
  int gpu_workers = 1;  // workers sharing a GPU, each on its own stream
  bool cuda_graphs = true;  // --cuda-graphs: one GPU worker's steps captured and replayed
  std::optional<std::string> cuda_kernels;  // unset: the checkpoint's train.cuda_kernels
  thpc::ComputeType compute_type = thpc::ComputeType::kDefault;  // --compute-type
  bool tree_constraints = false;
  std::optional<std::string> tree_leaves;  // default: the checkpoint's decode.tree_leaves
  std::string dump_attention;   // empty: no attention dump
  std::vector<int> dump_lines;  // 1-based input lines, ascending, each once
  std::optional<thpc::SamplingOptions> sampling;  // unset: beam search
  std::string score_reference;  // --score-reference: score its lines instead of translating
  bool normalize = false;       // --normalize: those scores per piece
  bool reference_nbest = false;  // --reference-nbest: --score-reference's file is an n-best list
  bool piece_scores = false;     // --piece-scores: each piece's log-probability after the score
  bool profile = false;  // print the time per op class (first CPU worker, every GPU worker)
  bool help = false;
};

// "1,5,9" -> {1, 5, 9}: 1-based line numbers, comma-separated, ascending and each once
// in the result whatever the order given.
std::vector<int> parse_line_numbers(const std::string& text) {
  std::set<int> numbers;
  std::stringstream items(text);
  std::string item;
  while (std::getline(items, item, ',')) {
    const bool digits_only = !item.empty() && item.size() <= 9 &&
                             item.find_first_not_of("0123456789") == std::string::npos;
    if (!digits_only || std::stoi(item) < 1) {
      THPC_FAIL("--dump-lines '" << text << "': '" << item << "' is not a line number "
                << "(1-based numbers separated by commas, e.g. 1,5,9)");
    }
    numbers.insert(std::stoi(item));
  }
  if (numbers.empty() || text.back() == ',') {
    THPC_FAIL("--dump-lines '" << text << "': expected 1-based line numbers separated by "
              << "commas, e.g. 1,5,9");
  }
  return {numbers.begin(), numbers.end()};
}

// Whether `output` ("-": standard output) is the terminal a progress line would be shown on
// (standard error's).
bool output_is_the_terminal(const std::string& output) {
  struct stat terminal {}, written {};
  if (!isatty(STDERR_FILENO) || ::fstat(STDERR_FILENO, &terminal) != 0) return false;
  if (output == "-") {
    return isatty(STDOUT_FILENO) && ::fstat(STDOUT_FILENO, &written) == 0 &&
           written.st_rdev == terminal.st_rdev;
  }
  return ::stat(output.c_str(), &written) == 0 && S_ISCHR(written.st_mode) &&
         written.st_rdev == terminal.st_rdev;
}

// The input lines, a buffer at a time (--buffer-sentences), read and checked as
// transformer_score reads its files (the same checks): invalid UTF-8 is refused naming the
// file and line rather than passed to SentencePiece, which would decode it to something.
// Trailing whitespace is dropped, as SentencePiece's normalisation would drop it anyway.
//
// A NUL byte, or lines ended by a carriage return alone (read as one line, whose
// sentences came out as one translation), are refused as transformer_preprocess refuses
// them (before: translated, exit 0).
// A descriptor's bytes from `offset` on, read with pread: a second reading of a regular
// file that leaves the descriptor's own offset where it is (standard input given as
// `< FILE`, of which the caller may have read a part already).
class PositionedReadBuffer : public std::streambuf {
 public:
  PositionedReadBuffer(int descriptor, off_t offset) : descriptor_(descriptor), offset_(offset) {}

 protected:
  int_type underflow() override {
    if (gptr() < egptr()) return traits_type::to_int_type(*gptr());
    ssize_t got = 0;
    do {
      got = ::pread(descriptor_, block_, sizeof block_, offset_);
    } while (got < 0 && errno == EINTR);
    if (got <= 0) return traits_type::eof();
    offset_ += got;
    setg(block_, block_, block_ + got);
    return traits_type::to_int_type(*gptr());
  }

 private:
  int descriptor_;
  off_t offset_;
  char block_[1 << 16];
};

class SourceReader {
 public:
  // `option`: the command line's name for the file (--input, --score-reference).
  explicit SourceReader(const std::string& path, const std::string& option = "--input")
      : path_(path), name_(path == "-" ? "<stdin>" : path), option_(option) {
    struct stat status {};
    if (path != "-") {
      file_ = thpc::open_text_file(path, option);
      peekable_ = ::stat(path.c_str(), &status) == 0 && S_ISREG(status.st_mode);
      return;
    }
    // Closed, write-only or a directory: read as an empty input, the output was replaced
    // by an empty file, exit 0 and nothing said.
    if (const std::string why = thpc::standard_input_unreadable(); !why.empty()) {
      THPC_FAIL("standard input is " << why << ": give the "
                                     << (option_ == "--input" ? "text to translate" : "text")
                                     << " on it or with " << option_ << " FILE");
    }
    const bool known = ::fstat(STDIN_FILENO, &status) == 0;
    peekable_ = known && S_ISREG(status.st_mode);
  }

  const std::string& name() const { return name_; }
  int64_t lines_read() const { return lines_; }
  bool at_end() const { return at_end_; }

  // Up to `count` more lines (0: every line left) into `lines` (replaced); none at the end.
  void read(size_t count, std::vector<std::string>* lines) {
    lines->clear();
    std::istream& in = positioned_ ? *positioned_
                       : path_ == "-" ? static_cast<std::istream&>(std::cin)
                                      : file_;
    std::string line;
    while (!at_end_ && (count == 0 || lines->size() < count)) {
      if (!thpc::metrics::read_segment(in, name_, lines_ + 1, &line)) {
        at_end_ = true;  // (a read error of standard input is said by read_segment)
        break;
      }
      ++lines_;
      const std::string problem = thpc::nul_byte_problem(name_, lines_, line);
      if (!problem.empty()) THPC_FAIL(problem << "; repair or remove the line");
      carriage_returns_ += std::count(line.begin(), line.end(), '\r');
      lines->push_back(std::move(line));
    }
    // A file that ends with a buffer is known to end there (its input is one buffer, read,
    // checked and planned as a whole); a pipe or a terminal is not peeked at, which would
    // wait for the next line before the last one is translated.
    if (!at_end_ && peekable_ && in.peek() == std::char_traits<char>::eof()) at_end_ = true;
    // Judged on the whole input, at its end (judged a buffer at a time, an input with a
    // few stray carriage returns early on was refused or not by --buffer-sentences): an
    // input of one buffer before anything is translated, as before buffers; a larger one
    // once its earlier buffers are written, as a later buffer's invalid UTF-8 is.
    if (!at_end_) return;
    if (const std::string problem =
            thpc::carriage_return_lines_problem(name_, carriage_returns_, lines_);
        !problem.empty()) {
      THPC_FAIL(problem << thpc::kCarriageReturnAdvice);
    }
  }

  // The lines of the input file, counted without being kept (for the progress line, which
  // only a terminal shows: a batch job's log is spared the extra pass over the input);
  // kUnknownTotal for standard input, anything that is not a regular file, or no terminal.
  int64_t count_file_lines() const {
    if (path_ == "-" || !isatty(fileno(stderr))) return thpc::ProgressListener::kUnknownTotal;
    return lines_of_file();
  }

  // The lines of a regular file, counted without being kept, before any is read: the
  // file named, or one given as standard input (`< FILE`, read with pread from where its
  // descriptor stands); kUnknownTotal for a pipe, a terminal or anything else.
  int64_t lines_of_file() const {
    std::error_code error;
    std::ifstream file;
    std::optional<PositionedReadBuffer> from_stdin;
    std::optional<std::istream> stdin_stream;
    std::istream* in = &file;
    if (path_ == "-") {
      const off_t start = peekable_ ? ::lseek(STDIN_FILENO, 0, SEEK_CUR) : -1;
      if (start < 0) return thpc::ProgressListener::kUnknownTotal;
      from_stdin.emplace(STDIN_FILENO, start);
      in = &stdin_stream.emplace(&*from_stdin);
    } else if (std::filesystem::is_regular_file(path_, error)) {
      file = thpc::open_input_file(path_, "");
    } else {
      return thpc::ProgressListener::kUnknownTotal;
    }
    std::istream& counted = *in;
    std::vector<char> block(1 << 20);
    int64_t lines = 0;
    char last = '\n';
    while (counted.read(block.data(), static_cast<std::streamsize>(block.size())) ||
           counted.gcount() > 0) {
      const auto read = static_cast<size_t>(counted.gcount());
      lines += std::count(block.data(), block.data() + read, '\n');
      last = block[read - 1];
    }
    return lines + (last == '\n' ? 0 : 1);  // a last line without its \n is a line
  }

  // Reads a regular file's every line once with the checks `read` makes (invalid UTF-8, a
  // NUL byte, lines ended by a carriage return alone, an overlong line), before anything
  // is translated: a bad line late in an input of many buffers stopped the program after
  // it had translated the buffers before it, and --output FILE, written whole at the end,
  // was never written (a helper's trial lost 1,000 translations to a byte on line 1,001).
  // A file read through standard input (`< FILE`) is read with pread from where its
  // descriptor stands (reopening /dev/stdin read what a caller had read of it before,
  // and was refused where the file's permissions were the caller's shell's); a pipe cannot
  // be read twice, and is checked a buffer at a time.
  void check_every_line_first() const {
    if (!peekable_) return;
    std::optional<SourceReader> whole;
    if (path_ == "-") {
      const off_t start = ::lseek(STDIN_FILENO, 0, SEEK_CUR);
      if (start < 0) return;  // (not seekable after all: checked a buffer at a time)
      whole.emplace(SourceReader(name_, std::make_unique<PositionedReadBuffer>(STDIN_FILENO,
                                                                               start)));
    } else {
      whole.emplace(path_, option_);
    }
    std::vector<std::string> lines;
    while (!whole->at_end()) whole->read(10000, &lines);
  }

 private:
  // A reader of `buffer`'s bytes, said as `name`'s (check_every_line_first's of stdin).
  SourceReader(const std::string& name, std::unique_ptr<std::streambuf> buffer)
      : path_(name), name_(name), buffer_(std::move(buffer)),
        positioned_(std::make_unique<std::istream>(buffer_.get())), peekable_(true) {}

  std::string path_, name_, option_ = "--input";
  std::unique_ptr<std::streambuf> buffer_;
  std::unique_ptr<std::istream> positioned_;
  std::ifstream file_;
  int64_t lines_ = 0, carriage_returns_ = 0;
  bool at_end_ = false;
  bool peekable_ = false;  // a regular file: its end can be seen without waiting
};

// Every model of an ensemble, read and checked before anything is translated: none marked
// diverged, and their vocabularies must be one (a usage error naming the two files
// otherwise).
thpc::DecodingCheckpoints read_checkpoints(const Arguments& args) {
  thpc::DecodingCheckpoints ensemble = thpc::read_decoding_checkpoints(args.checkpoints);
  for (size_t m = 0; m < ensemble.checkpoints.size(); ++m) {
    const std::string diverged = thpc::diverged_parameters_refusal(
        ensemble.checkpoints[m], ensemble.paths[m], "decoding with it");
    if (!diverged.empty()) throw thpc::tools::Refusal(diverged);
  }
  const std::string mismatch =
      thpc::ensemble_vocabulary_mismatch(ensemble, !args.spm_model.empty());
  if (!mismatch.empty()) throw thpc::tools::UsageError(mismatch);
  return ensemble;
}

// The SentencePiece model that encodes the input and decodes the translations, and what
// error messages call it (the file, or the checkpoint's copy).
struct SentencePieceModel {
  sentencepiece::SentencePieceProcessor processor;
  std::string name;
  // Its pieces and the special ids the checkpoints' models were trained with, derived as
  // transformer_preprocess derived the shards' (a model without pad gets one after its
  // pieces).
  thpc::SentencePieceVocabulary vocabulary;
};

// Loads --spm-model, else the model the first checkpoint stores, into `model`, and checks
// that it is the checkpoints' vocabulary: their size. Throws naming the model or the
// checkpoint.
void load_sentencepiece_model(const Arguments& args, const thpc::DecodingCheckpoints& ensemble,
                              SentencePieceModel& model) {
  const thpc::Checkpoint& checkpoint = ensemble.checkpoints.front();
  const std::string& checkpoint_path = ensemble.paths.front();
  sentencepiece::SentencePieceProcessor& spm = model.processor;
  model.name = args.spm_model;
  if (!args.spm_model.empty()) {
    // A missing file got SentencePiece's `Not found: "F": No such file or directory Error
    // #2`, a directory libstdc++'s "basic_filebuf::underflow error", and a file that does
    // not parse "Internal: ...cc(1101) [...]": each said in the user's words instead.
    const std::string unreadable = thpc::unreadable_file_reason(args.spm_model);
    if (!unreadable.empty()) {
      THPC_FAIL("cannot load SentencePiece model '" << args.spm_model << "': " << unreadable);
    }
    if (!spm.Load(args.spm_model).ok()) {
      THPC_FAIL("cannot load SentencePiece model '"
                << args.spm_model << "': the file is not a SentencePiece model (give the "
                << "spm.model transformer_preprocess wrote beside the shards, or leave "
                << "--spm-model out: the checkpoint stores its model)");
    }
  } else if (!checkpoint.spm_model.empty()) {
    model.name = "the SentencePiece model stored in " + checkpoint_path;
    const auto status = spm.LoadFromSerializedProto(checkpoint.spm_model);
    if (!status.ok()) THPC_FAIL("cannot load " << model.name << ": " << status.ToString());
  } else {
    THPC_FAIL("checkpoint " << checkpoint_path << " holds no SentencePiece model (its run "
              << "trained on data without one, e.g. a synthetic task, or predates stored "
              << "models); give --spm-model FILE");
  }
  // Another model of the same size maps the ids to other pieces: every translation would
  // be detokenised into the wrong words without a word said.
  if (!args.spm_model.empty() && !checkpoint.spm_model.empty()) {
    sentencepiece::SentencePieceProcessor stored;
    if (stored.LoadFromSerializedProto(checkpoint.spm_model).ok()) {
      const int size = std::min(stored.GetPieceSize(), spm.GetPieceSize());
      int differing = stored.GetPieceSize() == spm.GetPieceSize() ? 0 : 1;
      int first = -1;
      for (int id = 0; id < size; ++id) {
        if (stored.IdToPiece(id) != spm.IdToPiece(id)) {
          if (first < 0) first = id;
          ++differing;
        }
      }
      // Leaving it out helps only where every member stores its model (an ensemble with
      // one that does not was told to, and then refused for not giving it).
      const bool every_member_stores =
          std::all_of(ensemble.checkpoints.begin(), ensemble.checkpoints.end(),
                      [](const thpc::Checkpoint& member) { return !member.spm_model.empty(); });
      const std::string advice = every_member_stores
                                     ? "leave --spm-model out to use the stored one"
                                     : "give the spm.model " + checkpoint_path +
                                           " was trained with";
      // The same pieces with other special ids (spm_train's --bos_piece=</s>
      // --eos_piece=<s>, or pad, bos or eos marked otherwise) give other ids to start and
      // end the translations with than the model was trained with: refused as well.
      // (as vocabulary_of derives them, the ids the search would use: a pad the models lack
      // is said as the id after their pieces, not SentencePiece's -1)
      const thpc::SpecialIds stored_ids = thpc::vocabulary_of(stored).ids;
      const thpc::SpecialIds given_ids = thpc::vocabulary_of(spm).ids;
      if (differing == 0 && stored_ids != given_ids) {
        throw thpc::tools::UsageError(
            "--spm-model " + args.spm_model + " is not the SentencePiece model stored in " +
            checkpoint_path + " (its special ids pad/unk/bos/eos are " +
            thpc::special_ids_text(given_ids) + ", the checkpoint's " +
            thpc::special_ids_text(stored_ids) +
            "): the model would start and end its translations at other ids; " + advice);
      }
      if (differing > 0) {
        throw thpc::tools::UsageError(
            "--spm-model " + args.spm_model + " is not the SentencePiece model stored in " +
            checkpoint_path + " (" +
            (stored.GetPieceSize() != spm.GetPieceSize() || first < 0
                 ? std::to_string(spm.GetPieceSize()) + " pieces against " +
                       std::to_string(stored.GetPieceSize())
                 : "id " + std::to_string(first) + " is '" + spm.IdToPiece(first) +
                       "' there and '" + stored.IdToPiece(first) + "' in the checkpoint") +
            "): the model's ids would be written as other pieces; " + advice);
      }
    }
  }
  try {
    model.vocabulary = thpc::vocabulary_of(spm);
  } catch (const thpc::Error& error) {
    THPC_FAIL(model.name << ": " << error.what());
  }
  if (model.vocabulary.size != ensemble.vocab_size) {
    std::ostringstream why;
    why << model.name << ": a vocabulary of " << spm.GetPieceSize() << " pieces";
    if (!model.vocabulary.added.empty()) {
      why << " and " << model.vocabulary.added.size() << " special ids after them";
    }
    why << ", but " << checkpoint_path << " was trained with " << ensemble.vocab_size;
    // --spm-model's is the command line's mistake (exit 2, as the check against a stored
    // model says it); a stored model of another size is the checkpoint's.
    if (!args.spm_model.empty()) {
      throw thpc::tools::UsageError(why.str() + ": give the spm.model it was trained with");
    }
    THPC_FAIL(why.str());
  }
  // A checkpoint without a stored model trained on a synthetic task (or hand-made shards
  // without one), whose ids are the project's 0/1/2/3: another layout would start and end
  // its translations at other ids.
  if (checkpoint.spm_model.empty() && model.vocabulary.ids != thpc::SpecialIds{}) {
    throw thpc::tools::UsageError(
        "--spm-model " + args.spm_model + ": its special ids pad/unk/bos/eos are " +
        thpc::special_ids_text(model.vocabulary.ids) + ", but " + checkpoint_path +
        " stores no SentencePiece model, and a run without one trains with " +
        thpc::special_ids_text(thpc::SpecialIds{}) + ": give the spm.model it was trained " +
        "with (a model spm_train wrote with --pad_id=0 --unk_id=1 --bos_id=2 --eos_id=3)");
  }
}

// With separate vocabularies (a model trained on transformer_preprocess
// --source-vocab-size shards): the source's SentencePiece model, which encodes the input,
// loaded from the first checkpoint into `source` (true); false with one vocabulary, whose
// model encodes both sides. --tree-constraints, which reads the input's words through the
// target's pieces, takes one vocabulary; so does --spm-model, which replaces a shared model
// (refused before the target's model is loaded).
bool load_source_sentencepiece_model(const Arguments& args,
                                     const thpc::DecodingCheckpoints& ensemble,
                                     const SentencePieceModel& target, SentencePieceModel& source) {
  if (ensemble.source_vocab_size == 0) return false;
  const thpc::Checkpoint& checkpoint = ensemble.checkpoints.front();
  const std::string& path = ensemble.paths.front();
  const std::string separate = path + " has separate source and target vocabularies";
  if (args.tree_constraints) {
    throw thpc::tools::UsageError(
        "--tree-constraints reads the input's words through the target's pieces, and " +
        separate +
        ": give a model of one vocabulary (transformer_preprocess without --source-vocab-size)");
  }
  if (checkpoint.source_spm_model.empty()) {
    THPC_FAIL(separate << " but stores no source SentencePiece model (its shards had none)");
  }
  source.name = "the source SentencePiece model stored in " + path;
  const auto status = source.processor.LoadFromSerializedProto(checkpoint.source_spm_model);
  if (!status.ok()) THPC_FAIL("cannot load " << source.name << ": " << status.ToString());
  try {
    source.vocabulary = thpc::vocabulary_of(source.processor);
  } catch (const thpc::Error& error) {
    THPC_FAIL(source.name << ": " << error.what());
  }
  if (source.vocabulary.size != ensemble.source_vocab_size ||
      source.vocabulary.ids != target.vocabulary.ids) {
    THPC_FAIL(source.name << ": a vocabulary of " << source.vocabulary.size << " (pad/unk/bos/eos "
              << thpc::special_ids_text(source.vocabulary.ids) << "), but its source table has "
              << ensemble.source_vocab_size << " rows (and the target's ids are "
              << thpc::special_ids_text(target.vocabulary.ids) << "): the file is damaged");
  }
  return true;
}

// A buffer of the input: its lines as read, each encoded into the pieces the models
// translate, the batches they are translated in, and what the workers found for them.
struct InputBuffer {
  int64_t first_line = 0;  // the 0-based number in the input of lines[0]
  std::vector<std::string> lines;
  std::vector<thpc::TokenSequence> sources;
  std::vector<thpc::DecodeBatch> batches;
  // Each line's hypotheses, best first (none for an empty line).
  std::vector<std::vector<thpc::Hypothesis>> hypotheses;
  // Each line's --dump-lines slot (the index of its entry), or -1 for a line not dumped.
  std::vector<int> dump_slot;
  // The search, with --tree-constraints' filter over these lines.
  thpc::BeamOptions options;
  std::unique_ptr<thpc::TreeTokenFilter> tree_filter;
  // With words as the trees' leaves: each line's words (split at spaces and tabs), which
  // its trees are written with; empty for a line whose pieces do not split into them
  // (written with SentencePiece's text), counted in unmatched_tree_lines.
  std::vector<std::vector<std::string>> tree_words;
  int64_t unmatched_tree_lines = 0;
  // --score-reference: the pairs scored (one a line; with --reference-nbest one an n-best
  // line, `sources` then each hypothesis' input line): each translation as read and
  // encoded, whether the pair is scored (both sides fit the position table), its score
  // log P(translation | line), and with --reference-nbest the n-best line it came from.
  std::vector<std::string> reference_lines;
  std::vector<thpc::TokenSequence> references;
  std::vector<char> scored;
  std::vector<double> scores;
  int64_t first_reference_line = 0;  // the 0-based line of the translations' file of pair 0
  std::vector<std::string> nbest_lines;
  std::vector<std::vector<float>> piece_scores;  // --piece-scores: each pair's, in order
};

// Encodes lines with `spm`: a line longer than the position table holds (eos takes one of
// `max_positions`) is truncated with a warning, the first few a line each, then their
// count (ended by say_count, once the input is read). With --score-reference (`too_long`
// given) such a line is kept whole and flagged instead: a score of a cut pair would be
// another pair's.
class SourceEncoder {
 public:
  // `positions_said`: the table's size, and whose it is in an ensemble
  // (DecodingCheckpoints::max_positions_said).
  SourceEncoder(const sentencepiece::SentencePieceProcessor& spm, int max_positions,
                std::string positions_said)
      : spm_(spm),
        longest_source_(max_positions - 1),
        positions_said_(std::move(positions_said)) {}

  // The pieces of the longest line the table holds (its eos the last position).
  int longest() const { return longest_source_; }

  void encode(const std::string& name, InputBuffer& buffer) {
    encode(name, buffer.first_line, buffer.lines, buffer.sources, nullptr);
  }

  // `lines`, the first of them line first_line + 1 of `name`, into `encoded`; with
  // `too_long`, each line's flag (set: longer than the table, kept whole, said by none).
  void encode(const std::string& name, int64_t first_line, const std::vector<std::string>& lines,
              std::vector<thpc::TokenSequence>& encoded, std::vector<char>* too_long) {
    encoded.resize(lines.size());
    if (too_long != nullptr) too_long->assign(lines.size(), 0);
    for (size_t i = 0; i < lines.size(); ++i) {
      const int64_t line = first_line + static_cast<int64_t>(i) + 1;
      std::vector<int> pieces;
      // (ignored, a failure gave the line an empty source, and a translation of nothing)
      const auto encoded_line = spm_.Encode(lines[i], &pieces);
      if (!encoded_line.ok()) {
        THPC_FAIL(name << ": line " << line << ": SentencePiece cannot encode it ("
                       << encoded_line.ToString() << ")");
      }
      if (thpc::looks_encoded_into_pieces(lines[i]) && ++encoded_already_ == 1) {
        std::cerr << "transformer_decode: warning: line " << line << " of " << name
                  << " looks encoded into SentencePiece pieces already (its words start with "
                  << "U+2581, '\xE2\x96\x81'): transformer_decode encodes raw text itself, "
                  << "and pieces encoded again translate as noise; give the text before "
                  << "spm_encode (spm_decode restores it)\n";
      }
      if (too_long != nullptr) {
        (*too_long)[i] = static_cast<int>(pieces.size()) > longest_source_;
      } else if (static_cast<int>(pieces.size()) > longest_source_) {
        if (++truncated_ <= kTruncationsSaid) {
          std::cerr << "transformer_decode: warning: line " << line << " has " << pieces.size()
                    << " tokens; truncated to " << longest_source_ << " (" << positions_said_
                    << ")\n";
        }
        pieces.resize(longest_source_);
      }
      encoded[i].assign(pieces.begin(), pieces.end());
    }
  }

  void say_count(const std::string& name) const {
    if (encoded_already_ > 1) {
      std::cerr << "transformer_decode: warning: " << encoded_already_ << " lines of " << name
                << " in all looked encoded into SentencePiece pieces already (the first said "
                << "above)\n";
    }
    if (truncated_ > kTruncationsSaid) {
      std::cerr << "transformer_decode: warning: " << truncated_ << " lines of " << name
                << " in all were truncated to " << longest_source_ << " tokens (the first "
                << kTruncationsSaid << " said above)\n";
    }
  }

 private:
  // newstest2014 through a model of 64 positions printed about a thousand warning lines.
  static constexpr int kTruncationsSaid = 5;
  const sentencepiece::SentencePieceProcessor& spm_;
  int longest_source_;
  std::string positions_said_;
  int64_t truncated_ = 0;
  int64_t encoded_already_ = 0;  // lines that looked like spm_encode's output
};

// A --dump-lines number beyond the input (`buffer`: --dump-lines reads it whole) is a
// usage error, found before anything is encoded.
void check_dump_lines_in(const std::vector<int>& dump_lines, const std::string& name,
                         const InputBuffer& buffer) {
  for (const int line : dump_lines) {
    if (line > static_cast<int>(buffer.lines.size())) {
      throw thpc::tools::UsageError("--dump-lines: line " + std::to_string(line) +
                                    " is beyond the " + std::to_string(buffer.lines.size()) +
                                    " lines of " + name);
    }
  }
}

// Where each line of `buffer` (the whole input) has its attention dump: the index of its
// --dump-lines entry, or -1 for a line not dumped. A dumped line that is empty (it has no
// translation to show) is a usage error.
std::vector<int> attention_dump_slots(const std::vector<int>& dump_lines,
                                      const std::string& name, const InputBuffer& buffer) {
  std::vector<int> slot_of_line(buffer.lines.size(), -1);
  for (size_t slot = 0; slot < dump_lines.size(); ++slot) {
    const int line = dump_lines[slot];
    if (buffer.sources[line - 1].empty()) {
      throw thpc::tools::UsageError("--dump-lines: line " + std::to_string(line) + " of " +
                                    name + " is empty (or only spaces): it has no translation "
                                    "to show");
    }
    slot_of_line[line - 1] = static_cast<int>(slot);
  }
  return slot_of_line;
}

// The search: the checkpoint's [decode] settings (`stored`) with the command line's
// overrides, outputs bounded by the smallest position table of the ensemble.
thpc::BeamOptions search_options(const Arguments& args, const thpc::DecodeConfig& stored,
                                 int max_positions) {
  thpc::SearchOverrides search = args.search;
  // Sampling draws one translation per sentence unless --beam asks for more; the
  // checkpoint's decode.beam is a search's width.
  if (args.sampling && !search.beam) search.beam = 1;
  const thpc::BeamOptions options = thpc::configured_beam_options(stored, max_positions, search);
  // An alpha whose penalty overflows for the longest output makes every score -0 (their
  // order, the early stop and the n-best then arbitrary): --lenpen 1e30 passed the check
  // for infinity.
  if (thpc::length_penalty_overflows(options.max_len_cap + 1, options.alpha)) {
    std::ostringstream alpha;
    alpha << options.alpha;
    throw thpc::tools::UsageError(
        "the length penalty's alpha " + alpha.str() +
        " (--lenpen, or the checkpoint's decode.alpha) makes ((5 + |Y|)/6)^alpha overflow for "
        "outputs of " + std::to_string(options.max_len_cap + 1) + " tokens (model.max_positions"
        "): every score would be -0; give a smaller alpha (§6.1: 0.6)");
  }
  // More best translations than the search keeps cannot be written: they were cut to the
  // beam, and --greedy --nbest 2 wrote plain lines without the n-best format.
  if (search.nbest > options.beam) {
    const bool beam_given = args.search.beam.has_value();
    throw thpc::tools::UsageError(
        "--nbest " + std::to_string(search.nbest) + " asks for more translations a sentence "
        "than the search keeps: " +
        (search.greedy ? std::string("--greedy keeps one")
         : args.sampling && !beam_given
             ? std::string("--sampling draws one unless --beam N asks for N")
             : "a beam of " + std::to_string(options.beam) +
                   (beam_given ? " (--beam)" : " (the checkpoint's decode.beam)")) +
        "; give --beam " + std::to_string(search.nbest) + " or more");
  }
  return options;
}

// A line's words (split at spaces and tabs) and how many of its pieces `source` (the line
// as encoded) each holds, by the byte span in the line of each piece SentencePiece gives:
// a piece belongs to the word holding its last byte, a piece of whitespace alone (the
// word marker of a model without the dummy prefix) to the next word. False, both left
// empty, where that is not one piece or more a word, in order (SentencePiece drops a word
// of a zero-width space, or the source was cut at the position table): a word split by a
// character NFKC makes a space (a no-break space) stays one word (a review's lines whose
// trees took shifted words, each word encoded alone fitted no model without the prefix).
bool line_words_and_pieces(const sentencepiece::SentencePieceProcessor& processor,
                           const std::string& line, const thpc::TokenSequence& source,
                           std::vector<std::string>* words, std::vector<int>* counts) {
  std::vector<std::pair<size_t, size_t>> spans;  // each word's [begin, end) in the line
  for (size_t at = line.find_first_not_of(" \t"); at != std::string::npos;) {
    const size_t end = std::min(line.find_first_of(" \t", at), line.size());
    spans.emplace_back(at, end);
    at = line.find_first_not_of(" \t", end);
  }
  const auto proto = processor.EncodeAsImmutableProto(line);
  if (proto.pieces_size() != source.size() || spans.empty()) return false;
  std::vector<int> per_word(spans.size(), 0);
  size_t word = 0;
  for (size_t k = 0; k < proto.pieces_size(); ++k) {
    const auto piece = proto.pieces(static_cast<int>(k));
    if (static_cast<int32_t>(piece.id()) != source[k]) return false;
    // The word holding the piece's last byte, else the next word after it.
    const size_t last = piece.end() > piece.begin() ? piece.end() - 1 : piece.begin();
    while (word < spans.size() && spans[word].second <= last) ++word;
    if (word == spans.size()) return false;
    ++per_word[word];
  }
  if (std::find(per_word.begin(), per_word.end(), 0) != per_word.end()) return false;
  for (const auto& [begin, end] : spans) words->push_back(line.substr(begin, end - begin));
  *counts = std::move(per_word);
  return true;
}

// --tree-constraints' filter: well-formed linearized trees over each input line's words,
// the words as placeholders XX or as themselves (--tree-leaves, else the checkpoint's
// decode.tree_leaves; with words, sets input.tree_words). Throws naming the SentencePiece
// model when its vocabulary cannot write trees.
std::unique_ptr<thpc::TreeTokenFilter> make_tree_filter(const Arguments& args,
                                                        const thpc::DecodeConfig& stored,
                                                        const SentencePieceModel& spm,
                                                        InputBuffer& input) {
  std::vector<std::string> pieces;
  for (int id = 0; id < spm.vocabulary.size; ++id) {
    pieces.push_back(thpc::piece_of(spm.processor, spm.vocabulary, id));
  }
  try {
    if (args.tree_leaves.value_or(stored.tree_leaves) == "words") {
      // Each line's words and the pieces of each (line_words_and_pieces): the trees
      // bracket only between the words and are written with them.
      std::vector<std::vector<int>> pieces_per_word(input.lines.size());
      input.tree_words.assign(input.lines.size(), {});
      for (size_t i = 0; i < input.lines.size(); ++i) {
        if (input.sources[i].empty()) continue;
        if (!line_words_and_pieces(spm.processor, input.lines[i], input.sources[i],
                                   &input.tree_words[i], &pieces_per_word[i])) {
          ++input.unmatched_tree_lines;
        }
      }
      return std::make_unique<thpc::TreeTokenFilter>(pieces, spm.vocabulary.ids, input.sources,
                                                     static_cast<size_t>(input.first_line),
                                                     pieces_per_word);
    }
    std::vector<int> words;
    for (const std::string& line : input.lines) {
      std::istringstream fields(line);
      int count = 0;
      for (std::string word; fields >> word;) ++count;
      words.push_back(count);
    }
    return std::make_unique<thpc::TreeTokenFilter>(pieces, spm.vocabulary.ids.eos,
                                                   std::move(words));
  } catch (const thpc::Error& error) {
    THPC_FAIL("--tree-constraints: " << spm.name << ": " << error.what());
  }
}

// Refuses a length limit (max_len_a x source length + max_len_b) too short for a tree over
// a line's words: its search could end only in an unfinished tree ("(S Genetics In", a
// helper's walk with --max-len-a 0.5 --max-len-b 0), written without a word. (A limit the
// position table sets is said by translations_stopped_by_the_table.)
void check_room_for_trees(const InputBuffer& buffer, const thpc::TreeTokenFilter& trees) {
  thpc::BeamOptions asked = buffer.options;
  asked.max_len_cap = 0;
  for (size_t i = 0; i < buffer.sources.size(); ++i) {
    if (buffer.sources[i].empty()) continue;
    const int needed = trees.shortest_tree(static_cast<int>(i));
    const int limit = thpc::beam_detail::output_length_limit(buffer.sources[i].size(), asked);
    if (limit >= needed) continue;
    std::ostringstream message;
    message << "--tree-constraints: line " << buffer.first_line + static_cast<int64_t>(i) + 1
            << " of the input needs " << needed << " tokens for the shortest tree over its "
            << "words (the root's brackets, its words' " << needed - 3 << " tokens, the "
            << "end), but its length limit is " << limit << " (max_len_a " << asked.max_len_a
            << " x " << buffer.sources[i].size() << " source tokens + max_len_b "
            << asked.max_len_b << "): raise --max-len-a or --max-len-b (or the checkpoint's "
            << "decode.max_len_a/b; the paper's parser: 1 and 300)";
    throw thpc::tools::UsageError(message.str());
  }
}

// Who translates what: the batches, and the backends of the workers that take them, one
// each.
struct Workers {
  std::vector<thpc::DecodeBatch> batches;  // the first buffer's
  std::vector<std::unique_ptr<thpc::Backend>> backends;
  int threads_each = 0;  // the CPU: each worker's ops and BLAS run on this many threads
  int batching_workers = 1;  // make_decode_batches' `workers`, for every buffer
  bool on_cpu = true;        // the workers' backends hold their memory on the host
};

// On the CPU, N threads are N workers, each with its own copy of the model and
// single-threaded BLAS, taking whole batches from a shared list: a decoding step is
// many small products and loops that BLAS threads share less well than workers share
// batches (their futex/sched_yield time was most of a 2-thread run on a Zen 5 EPYC,
// 2026-11-24), while batches are independent. Unless the input (`sources`: the whole
// input, or, when not `whole_input`, its first --buffer-sentences buffer, whole, which
// plans every buffer as an input of its size) fills fewer than 2N
// batches of --batch-tokens: then the workers' batches would be cut to share it out (a
// budget of a 2N-th of its tokens), each worker reading every weight matrix at each step
// for few hypotheses. Instead, as many workers as get two whole batches each and divide
// the N threads evenly (at least one) share them, each reading each weight once a step
// for all its hypotheses.
// Measured on 2 cores of an Intel Xeon (bench/RESULTS.md, 2026-11-30; base, float32,
// beam 4, 80 tokens): 40 newstest2014 lines (one batch) 9.6 s as 2 workers, 6.1 s as one
// worker of 2 threads; 200 lines (2 batches) 27.4 and 25.1 s; 600 lines (5 batches) 69.4
// and 73.0 s. (More threads a worker than two are not measured.) The translations were
// --threads 1's in both ways (40 and 200 lines, float32 and int8; the CPU ops give the
// same bits with any thread count; the matrix products may not, as they may not with
// another batching, so a beam's exact tie could break otherwise). Sampling, which a last
// bit moves more often, keeps one thread a worker (below). On a GPU, --gpu-workers N are
// N workers sharing the device, each with its own copy of the model and its own CUDA
// stream (CTranslate2's inter_threads on a GPU): a beam step ends in a round trip to the
// host (the best tokens downloaded, the next step planned and uploaded), during which one
// worker's stream is idle; another's kernels fill it.
// `batches_for(workers, on_cpu)` cuts the first buffer into batches for that many workers
// on the CPU or a GPU (make_decode_batches, or make_scoring_batches with
// --score-reference).
Workers plan_workers(const Arguments& args, const thpc::TrainConfig& train,
                     const std::function<std::vector<thpc::DecodeBatch>(int, bool)>& batches_for,
                     bool whole_input) {
  Workers plan;
  // One GPU worker's steps are captured (--cuda-graphs on). Several workers' concurrent
  // captures on one device have not run on a GPU (bench/RESULTS.md, 2026-12-04): theirs
  // are launched one by one, as with --cuda-graphs off, unless --cuda-kernels names the
  // candidate worker_graphs (kernels/ops.h). (The --gpu-workers asked for decide: an
  // input of one batch, which one of them translates, is launched one by one too.)
  const unsigned candidates = thpc::backend_request(train, 0).cuda_kernels.candidates;
  const bool capture_steps =
      args.cuda_graphs && (args.gpu_workers == 1 || (candidates & thpc::kWorkerGraphs) != 0);
  // A compute type this machine cannot run is the command line's error (exit 2).
  try {
    plan.backends.push_back(
        thpc::make_decoding_backend(train, args.compute_type, capture_steps));
  } catch (const thpc::Error& error) {
    throw thpc::tools::UsageError(error.what());
  }
  const bool on_cpu = plan.backends.front()->host_memory();
  plan.on_cpu = on_cpu;
  int workers = args.gpu_workers;
  if (on_cpu) {
    if (args.gpu_workers > 1) {
      throw thpc::tools::UsageError(
          "--gpu-workers " + std::to_string(args.gpu_workers) + ": this decoding runs on the "
          "CPU (" + plan.backends.front()->name() + ": the checkpoint's train.backend, or no "
          "GPU here), where --threads N runs N workers");
    }
    // The cores this process may run on (a Slurm cpuset, taskset), not the machine's.
    const int usable = thpc::cores_this_process_may_use();
    workers = train.threads > 0 ? train.threads : usable;
    // More threads than cores share them, each a fraction as fast (16 workers of 4
    // threads on 2 cores were planned without a word): said, once, and honoured.
    if (const std::string note = thpc::more_threads_than_cores(
            train.threads,
            (args.threads >= 0 ? "--threads " : "the checkpoint's train.threads ") +
                std::to_string(train.threads),
            "--threads ");
        !note.empty()) {
      std::cerr << "transformer_decode: note: " << note << "\n";
    }
  }
  const int threads = workers;
  // Samples are drawn from rows whose last bits depend on the batch's shape and on the
  // threads that computed them: when sampling, the batches are --batch-tokens' alone and
  // every worker has one thread (also the only worker of fewer batches than --threads),
  // so that --threads changes no sample.
  plan.batching_workers = args.sampling ? 1 : workers;
  plan.batches = batches_for(plan.batching_workers, on_cpu);
  if (on_cpu && workers > 1 && !args.sampling) {
    std::vector<thpc::DecodeBatch> whole = batches_for(1, on_cpu);
    // The most workers that get two whole batches each and share the threads evenly.
    int fed = static_cast<int>(std::min<size_t>(static_cast<size_t>(workers), whole.size() / 2));
    while (fed > 1 && threads % fed != 0) --fed;
    fed = std::max(1, fed);
    if (fed < workers) {
      plan.batches = std::move(whole);
      plan.batching_workers = 1;
      workers = fed;
    }
  }
  if (whole_input) {
    workers = std::max(1, std::min<int>(workers, static_cast<int>(plan.batches.size())));
  }
  if (on_cpu) plan.threads_each = args.sampling ? 1 : std::max(1, threads / workers);
  if (args.profile && on_cpu) {
    std::cerr << "transformer_decode: " << plan.batches.size()
              << (plan.batches.size() == 1 ? " batch" : " batches")
              << (whole_input ? "" : " in the input's first buffer") << ", " << workers
              << (workers == 1 ? " worker of " : " workers of ") << plan.threads_each
              << (plan.threads_each == 1 ? " thread" : " threads")
              << (workers > 1 ? " each\n" : "\n");
  }
  if (on_cpu) {
    thpc::TrainConfig worker_config = train;
    worker_config.threads = plan.threads_each;
    while (static_cast<int>(plan.backends.size()) < workers) {
      plan.backends.push_back(
          thpc::make_decoding_backend(worker_config, args.compute_type, capture_steps));
    }
    // Process-wide (the ops' loops, BLAS's thread count), and again on each worker's
    // thread (OpenMP's count is a per-thread setting).
    thpc::set_cpu_threads(plan.threads_each);
  }
  while (static_cast<int>(plan.backends.size()) < workers) {  // GPU workers
    plan.backends.push_back(thpc::make_decoding_backend(train, args.compute_type, capture_steps));
  }
  return plan;
}

// What the workers found besides each line's hypotheses (InputBuffer::hypotheses): the
// attention of the --dump-lines lines' best translations, in their order, and the profile.
struct Findings {
  std::vector<thpc::AttentionDump> dumps;
  std::optional<thpc::OpProfile> profile;  // --profile: the profiled workers' batches
  std::string backend_name;
};

// With --score-reference, the rows of logits a worker's model makes at a time.
constexpr int64_t kScoringLogitRows = 1024;

// The workers, kept from one buffer of the input to the next: each builds (and, for
// int8, quantizes) its copy of the models once. Worker 0 runs on the calling thread (on a
// GPU the thread that made the backends, as before buffers), the others on threads of
// their own, waiting between buffers. The workers take a buffer's batches in turn from
// a shared list; the first failure stops the others after their current batch and is
// rethrown by translate.
class WorkerPool {
 public:
  // `ids`: the special ids the checkpoints' models were trained with.
  WorkerPool(const Arguments& args, const thpc::DecodingCheckpoints& ensemble,
             const thpc::SpecialIds& ids, Workers plan, thpc::tools::Progress& progress,
             Findings& found)
      : args_(args), ensemble_(ensemble), ids_(ids), threads_each_(plan.threads_each),
        progress_(progress), found_(found),
        workers_(plan.backends.size()), failures_(plan.backends.size()) {
    on_gpu_ = !plan.backends.front()->host_memory();
    if (args.profile) {
      found_.profile.emplace();
      found_.profile->workers = on_gpu_ ? static_cast<int>(workers_.size()) : 1;
      found_.backend_name = plan.backends.front()->name();
    }
    for (size_t w = 1; w < workers_.size(); ++w) {
      helpers_.emplace_back(&WorkerPool::helper, this, static_cast<int>(w),
                            std::move(plan.backends[w]));
    }
    try {
      set_up(0, std::move(plan.backends[0]));
    } catch (...) {
      failures_[0] = std::current_exception();
    }
  }

  ~WorkerPool() {
    {
      const std::lock_guard<std::mutex> lock(mutex_);
      closing_ = true;
    }
    wake_.notify_all();
    for (std::thread& helper : helpers_) helper.join();
  }

  // The workers' models' captured decoding steps, summed (between translate calls, every
  // worker idle: their counts were written before they said they were done).
  thpc::Transformer::CaptureCounts capture_counts() const {
    thpc::Transformer::CaptureCounts sum;
    for (const Worker& worker : workers_) {
      for (const auto& model : worker.models) {
        const thpc::Transformer::CaptureCounts& one = model->capture_counts();
        sum.captures += one.captures;
        sum.replays += one.replays;
        sum.refused += one.refused;
        sum.evicted += one.evicted;
      }
    }
    return sum;
  }
  int count() const { return static_cast<int>(workers_.size()); }

  // Translates every batch of `buffer` into its hypotheses (and dumps).
  void translate(InputBuffer& buffer) {
    {
      const std::lock_guard<std::mutex> lock(mutex_);
      buffer_ = &buffer;
      next_batch_ = 0;
      running_ = static_cast<int>(helpers_.size());
      ++generation_;
    }
    wake_.notify_all();
    take_batches(0);
    std::unique_lock<std::mutex> lock(mutex_);
    finished_.wait(lock, [&] { return running_ == 0; });
    for (const std::exception_ptr& failure : failures_) {
      if (failure) std::rethrow_exception(failure);
    }
  }

 private:
  struct Worker {
    std::unique_ptr<thpc::Backend> backend;
    std::optional<thpc::ProfilingBackend> profiler;  // --profile
    std::vector<std::unique_ptr<thpc::Transformer>> models;
    std::vector<thpc::Transformer*> model_pointers;
  };

  // On the worker's own thread: the backend used there, its models built and quantized.
  void set_up(int index, std::unique_ptr<thpc::Backend> backend) {
    Worker& worker = workers_[index];
    worker.backend = std::move(backend);
    worker.backend->use_on_this_thread();  // a GPU worker's thread on the backend's device
    // Again on the worker's own thread: OpenMP's thread count is a per-thread setting,
    // a new std::thread starts from the default (one per core), and the OpenMP
    // OpenBLAS reads it at every call (it ran a worker's GEMMs on every core: 3 workers
    // on 2 cores spent 4 times the CPU time of one, and rounded a base model's rows
    // differently, which changed a sample).
    if (threads_each_ > 0) thpc::set_cpu_threads(threads_each_);
    // --profile: the worker's ops through a profiler, each batch one of its steps,
    // collected after each batch (a GPU's marks are events: they stay few).
    if (args_.profile && (index == 0 || on_gpu_)) worker.profiler.emplace(*worker.backend);
    thpc::Backend& ops = worker.profiler ? static_cast<thpc::Backend&>(*worker.profiler)
                                         : *worker.backend;
    worker.models = ensemble_.build_models(ids_, ops);
    // --score-reference: a batch's logits [its target tokens, vocabulary] made
    // kScoringLogitRows rows at a time (37,000 pieces x 4,096 tokens would be 606 MB a
    // worker in fp32).
    if (!args_.score_reference.empty()) {
      for (const auto& model : worker.models) model->set_loss_chunk_rows(kScoringLogitRows);
    }
    quantize(index, worker);
    for (const auto& model : worker.models) worker.model_pointers.push_back(model.get());
  }

  // --compute-type int8: each worker quantizes its own copy of the weights (0.14 s for a
  // base model on one core), as it loaded its own copy of them, or takes those a
  // quantized checkpoint stores. Worker 0 says what was done.
  void quantize(int index, Worker& worker) {
    const auto quantize_start = std::chrono::steady_clock::now();
    thpc::QuantizedCount count;
    for (size_t m = 0; m < worker.models.size(); ++m) {
      const thpc::QuantizedCount one = thpc::quantize_model_weights(
          *worker.models[m], *worker.backend, ensemble_.checkpoints[m].quantized);
      count.quantized += one.quantized;
      count.stored += one.stored;
      count.requantized += one.requantized;
      count.kept_in_float += one.kept_in_float;
    }
    if (count.quantized + count.stored == 0 || index != 0) return;
    const std::chrono::duration<double> took = std::chrono::steady_clock::now() - quantize_start;
    std::cerr << "transformer_decode: int8: " << count.quantized + count.stored
              << " weight matrices ";
    if (count.stored == 0 && count.requantized == 0) {
      std::cerr << "quantized";
    } else {
      const bool ensemble = ensemble_.checkpoints.size() > 1;
      const char* stores = ensemble ? "their checkpoints store" : "the checkpoint stores";
      std::cerr << "(" << count.stored << " as " << stores << " them in int8, "
                << count.quantized << " quantized";
      if (count.requantized > 0) {
        std::cerr << ", " << count.requantized << " of those again from the 8-bit "
                  << "weights " << stores << ": this CPU's products take 7 bits";
      }
      std::cerr << ")";
    }
    if (count.kept_in_float > 0) {
      std::cerr << ", " << count.kept_in_float << " kept in "
                << thpc::dtype_name(worker.backend->compute_dtype())
                << " (sizes the GPU's int8 kernels cannot take: not multiples of 4)";
    }
    std::cerr << " in " << std::fixed << std::setprecision(2) << took.count() << " s ("
              << thpc::int8_products_description(*worker.backend) << ")\n";
  }

  // A helper worker: set up, then each buffer's batches as they come, until closed.
  void helper(int index, std::unique_ptr<thpc::Backend> backend) {
    try {
      set_up(index, std::move(backend));
    } catch (...) {
      failures_[index] = std::current_exception();
    }
    uint64_t seen = 0;
    for (;;) {
      {
        std::unique_lock<std::mutex> lock(mutex_);
        wake_.wait(lock, [&] { return closing_ || generation_ != seen; });
        if (closing_) return;
        seen = generation_;
      }
      take_batches(index);
      {
        const std::lock_guard<std::mutex> lock(mutex_);
        --running_;
      }
      finished_.notify_all();
    }
  }

  // The buffer's batches this worker takes, until none is left or a worker failed.
  void take_batches(int index) {
    InputBuffer& buffer = *buffer_;
    const std::vector<thpc::DecodeBatch>& batches = buffer.batches;
    if (failures_[index]) {  // its set-up failed: the others stop too
      next_batch_ = batches.size();
      return;
    }
    Worker& worker = workers_[index];
    try {
      thpc::Transformer& model = *worker.models.front();  // the attention dumps show the first's
      for (size_t b = next_batch_++; b < batches.size(); b = next_batch_++) {
        if (worker.profiler) worker.profiler->begin_step();
        if (!args_.score_reference.empty()) {
          thpc::score_batch(worker.model_pointers, args_.weights, ids_, buffer.sources,
                            buffer.references, batches[b], buffer.scores,
                            args_.piece_scores ? &buffer.piece_scores : nullptr);
        } else {
          // Each sentence belongs to one batch: the workers write disjoint elements.
          thpc::translate_batch(worker.model_pointers, args_.weights, ids_, buffer.sources,
                                batches[b], buffer.options,
                                args_.sampling ? &*args_.sampling : nullptr,
                                buffer.hypotheses);
          // The weights of each dumped line's best translation, by a forward pass over it
          // (the search's cache keeps none); it leaves nothing the next batch reads.
          for (const size_t i : batches[b].members) {
            if (buffer.dump_slot.empty() || buffer.dump_slot[i] < 0) continue;
            thpc::AttentionDump& dump = found_.dumps[buffer.dump_slot[i]];
            dump = thpc::capture_attention(model, buffer.sources[i],
                                           buffer.hypotheses[i][0].tokens, ids_);
            dump.line = static_cast<int>(buffer.first_line + static_cast<int64_t>(i)) + 1;
          }
        }
        progress_.advance(static_cast<int64_t>(batches[b].members.size()));
        if (worker.profiler) {
          worker.profiler->end_step();
          const thpc::OpProfile batch_profile = worker.profiler->take();
          const std::lock_guard<std::mutex> lock(profile_mutex_);
          *found_.profile += batch_profile;
        }
      }
    } catch (...) {
      failures_[index] = std::current_exception();
      next_batch_ = batches.size();  // the others stop after their current batch
    }
  }

  const Arguments& args_;
  const thpc::DecodingCheckpoints& ensemble_;
  const thpc::SpecialIds ids_;
  const int threads_each_;
  thpc::tools::Progress& progress_;
  Findings& found_;
  bool on_gpu_ = false;
  std::vector<Worker> workers_;
  std::vector<std::exception_ptr> failures_;  // each worker's first, written by it alone
  std::vector<std::thread> helpers_;
  std::mutex mutex_, profile_mutex_;
  std::condition_variable wake_, finished_;
  InputBuffer* buffer_ = nullptr;  // the buffer being translated (set under mutex_)
  uint64_t generation_ = 0;        // how many buffers were given to translate
  int running_ = 0;                // helpers still on the current buffer
  bool closing_ = false;
  std::atomic<size_t> next_batch_{0};
};

// A buffer's translations, one line per input line in input order: its best, or with
// --nbest K > 1 each hypothesis as `INDEX ||| text ||| score` (INDEX the 0-based line of
// the input; an empty line's: K with no text, score 0, so that a reader may take the list
// K lines at a time).
void write_translations(std::ostream& out, const InputBuffer& buffer, int nbest,
                        const sentencepiece::SentencePieceProcessor& spm) {
  // A tree whose leaves are the words holds the input line's own (TreeTokenFilter::
  // text_with_words), where SentencePiece's text would have " ⁇ " for a character its
  // vocabulary lacks.
  const thpc::TreeTokenFilter* trees =
      buffer.tree_filter && buffer.tree_filter->copies_words() ? buffer.tree_filter.get()
                                                               : nullptr;
  const auto text = [&](size_t line, const thpc::Hypothesis& hypothesis) {
    const std::string with_words =
        trees && !buffer.tree_words[line].empty()
            ? trees->text_with_words(static_cast<int>(line), hypothesis.tokens,
                                     buffer.tree_words[line])
            : std::string();
    return with_words.empty() ? thpc::detokenize(spm, hypothesis.tokens) : with_words;
  };
  for (size_t i = 0; i < buffer.hypotheses.size(); ++i) {
    const std::vector<thpc::Hypothesis>& hypotheses = buffer.hypotheses[i];
    const int64_t index = buffer.first_line + static_cast<int64_t>(i);
    if (nbest == 1) {
      out << (hypotheses.empty() ? std::string() : text(i, hypotheses[0])) << "\n";
      continue;
    }
    for (const thpc::Hypothesis& h : hypotheses) {
      out << index << " ||| " << text(i, h) << " ||| " << std::fixed
          << std::setprecision(4) << h.score << "\n";
    }
    if (hypotheses.empty()) {
      for (int k = 0; k < nbest; ++k) out << index << " |||  ||| 0.0000\n";
    }
  }
}

// How many of `buffer`'s best translations the position table stopped, short of their
// length limit (max_len_a * |x| + max_len_b): they hold max_len_cap tokens, none of them
// eos, where the limit without the cap is longer. Said once at the end (a helper's
// trial: --max-len-a 5 --max-len-b 1000 gave the default's translations, cut at 63
// tokens, without a word, where truncated inputs are said).
int64_t translations_stopped_by_the_table(const InputBuffer& buffer,
                                          const thpc::BeamOptions& options) {
  thpc::BeamOptions uncapped = options;
  uncapped.max_len_cap = 0;
  int64_t stopped = 0;
  for (size_t i = 0; i < buffer.hypotheses.size(); ++i) {
    if (buffer.hypotheses[i].empty()) continue;
    const size_t source = buffer.sources[i].size();
    const int allowed = thpc::beam_detail::output_length_limit(source, options);
    stopped += thpc::beam_detail::output_length_limit(source, uncapped) > allowed &&
               buffer.hypotheses[i][0].tokens.size() >= static_cast<size_t>(allowed);
  }
  return stopped;
}

// What the messages of a write to --output FILE call it.
std::string output_file_name(const std::string& output) { return "output file " + output; }

// Writes to --output what `write` writes: standard output, flushed after each buffer
// (--buffer-sentences) and checked, so that a reader that went away stops the decoding;
// or a file written through a temporary one renamed at the end, so that an interrupted
// or failed decode leaves no half file.
// (`write` checks each buffer's write itself, the last included.)
void write_output(const Arguments& args, const std::function<void(std::ostream&)>& write) {
  if (args.output == "-") {
    write(std::cout);
  } else {
    // Said by the signal's handler, as it removes the temporary file; only while that
    // is this write's (a later signal, --dump-attention's file being written, says not).
    struct SaidWhileWriting {
      ~SaidWhileWriting() { thpc::say_when_interrupted(""); }
    } said_while_writing;
    thpc::say_when_interrupted(
        "transformer_decode: interrupted: " + args.output + " is not written (--output FILE "
        "appears only whole, at the end), and the " +
        (args.score_reference.empty() ? "translations" : "scores") + " made so far are gone; "
        "to keep them as they are made, a buffer at a time (--buffer-sentences), write to "
        "standard output instead: > " + args.output + "\n");
    thpc::write_text_atomically(args.output, output_file_name(args.output), write);
  }
}

// Each buffer's lines out before the next is read (a reader waiting for them: --output
// /dev/stdout, a pipe), and a failed write found at once, not after the whole input (a
// full disk, a reader gone). Standard output is flushed by standard_output_failure, which
// then still has the failed write's errno.
void check_buffer_written(const Arguments& args, std::ostream& out) {
  if (args.output != "-") out.flush();
  if (args.output == "-") {
    if (const std::string failure = thpc::standard_output_failure(); !failure.empty()) {
      THPC_FAIL(failure);
    }
  } else if (!out) {
    THPC_FAIL("cannot write " << output_file_name(args.output)
                              << ": the write failed (disk full?)");
  }
}

// Writes the --dump-lines lines' attention to --dump-attention with their text and
// pieces (decode/attention_dump.h has the layout), naming the checkpoint they came from.
void write_attention_file(const Arguments& args, const thpc::DecodingCheckpoints& ensemble,
                          const InputBuffer& input, Findings& found,
                          const SentencePieceModel& spm, const SentencePieceModel& source_spm,
                          thpc::OutputClaim& claim) {
  // (eos, which the dumps show, may be one of the ids after the model's pieces; the
  // source's pieces are its own model's with separate vocabularies)
  const auto pieces_of = [](const SentencePieceModel& model,
                            const thpc::TokenSequence& ids_of_pieces) {
    std::vector<std::string> pieces;
    for (int32_t id : ids_of_pieces) {
      pieces.push_back(thpc::piece_of(model.processor, model.vocabulary, id));
    }
    return pieces;
  };
  for (thpc::AttentionDump& dump : found.dumps) {
    dump.source_text = input.lines[dump.line - 1];
    dump.target_text =
        thpc::detokenize(spm.processor, input.hypotheses[dump.line - 1][0].tokens);
    dump.source_tokens = pieces_of(source_spm, dump.source_ids);
    dump.target_tokens = pieces_of(spm, dump.target_ids);
  }
  thpc::write_attention_dumps(args.dump_attention, found.dumps, ensemble.paths.front(), &claim);
}

// A failure to read, translate or score the input, said as it is and not as a failure to
// write the output (write_text_atomically's storage diagnosis: "the file system is full"
// for a line of invalid UTF-8 next to a full disk): carried past the write as Carried,
// which removes the output's temporary file as any failure does.
class InputFailure {
 public:
  struct Carried {};

  // Runs `step`; its failure is kept, and Carried thrown in its place.
  template <typename Step>
  void run(const Step& step) {
    try {
      step();
    } catch (...) {
      failure_ = std::current_exception();
      throw Carried{};
    }
  }

  // Rethrows the kept failure. After `lines_done` lines were `done` ("translated",
  // "scored") into --output FILE, which appears only whole, it says they are gone too,
  // which the input's message alone did not say (a later buffer's failure, a bad line 250
  // of a pipe: a helper's walk; on standard output they are kept), and how to keep the
  // `made` ("translations", "scores") next time.
  [[noreturn]] void rethrow(const std::string& output, size_t lines_done, const std::string& done,
                            const std::string& made) const {
    if (output != "-" && lines_done > 0) {
      const std::string lost = "; the " + std::to_string(lines_done) + " lines " + done +
                               " before it are not written either (--output FILE appears only "
                               "whole): mend the input, or write to standard output (> " +
                               output + ") to keep the " + made + " made before a failure";
      try {
        std::rethrow_exception(failure_);
      } catch (const thpc::Error& error) {
        THPC_FAIL(error.what() << lost);
      } catch (const thpc::tools::UsageError& error) {  // (a later line's length limit)
        throw thpc::tools::UsageError(error.what() + lost);
      }
    }
    std::rethrow_exception(failure_);
  }

 private:
  std::exception_ptr failure_;
};

// transformer_decode --score-reference: each input line's given translation scored,
// log P(translation | line) (decode/reference_scores.h), one number a line in input
// order (--normalize: per piece), a buffer of both files at a time as translations are;
// the corpus's per-piece log-likelihood and perplexity on standard error at the end.
// The two files must have one line count: regular files are counted before anything is
// scored, pipes as they are read (a shorter one is said where it ends).
// `source` encodes the input lines (spm's processor with one vocabulary), spm the
// translations scored.
int run_scoring(const Arguments& args, const thpc::DecodingCheckpoints& ensemble,
                const thpc::TrainConfig& train, const SentencePieceModel& spm,
                const sentencepiece::SentencePieceProcessor& source) {
  // One pipe read as both sides (--input - and --score-reference /dev/stdin, or the other
  // way): each would take lines of the other. (A regular file opened twice is read twice.)
  {
    const auto identity = [](const std::string& path, struct stat& status) {
      return path == "-" ? ::fstat(STDIN_FILENO, &status) == 0
                         : ::stat(path.c_str(), &status) == 0;
    };
    struct stat a {}, b {};
    if ((args.input == "-" || args.score_reference == "-") && identity(args.input, a) &&
        identity(args.score_reference, b) && a.st_dev == b.st_dev && a.st_ino == b.st_ino &&
        !S_ISREG(a.st_mode)) {
      throw thpc::tools::UsageError(
          "--input " + args.input + " and --score-reference " + args.score_reference +
          " are one stream (standard input): each would read lines of the other; give one "
          "of them as a file");
    }
  }
  SourceReader input(args.input), references(args.score_reference, "--score-reference");
  // "NAME has N lines", or "has at least N" for a pipe not read to its end.
  const auto count_said = [](const std::string& name, int64_t lines, bool exact) {
    return name + " has " + (exact ? "" : "at least ") + std::to_string(lines) +
           (lines == 1 ? " line" : " lines");
  };
  const auto mismatch = [&](const std::string& input_said, const std::string& reference_said) {
    THPC_FAIL(input_said << " and --score-reference " << reference_said
              << ": line n of the one is scored as the translation of line n of the other; "
              << "give files of one line count (one translation a line)");
  };
  // Regular files (named, or standard input's) are counted before anything is scored;
  // pipes are compared as they are read.
  const int64_t input_count = input.lines_of_file();
  const int64_t reference_count = references.lines_of_file();
  if (!args.reference_nbest && input_count >= 0 && reference_count >= 0 &&
      input_count != reference_count) {
    mismatch(count_said(input.name(), input_count, true),
             count_said(references.name(), reference_count, true));
  }
  SourceEncoder encoder(source, ensemble.max_positions, ensemble.max_positions_said());
  SourceEncoder reference_encoder(spm.processor, ensemble.max_positions,
                                  ensemble.max_positions_said());
  const size_t buffer_size = static_cast<size_t>(args.buffer_sentences);
  // The pairs not scored (a side longer than the position table): how many, and the
  // first, said by its line and its longer side.
  int64_t unscored = 0;
  std::string first_unscored;
  // --reference-nbest: the n-best line read ahead, the first of the next buffer's input
  // lines (or beyond the input: said at its end), and the last INDEX seen.
  struct NbestLine {
    int64_t index = 0;
    std::string text, whole;
  };
  std::optional<NbestLine> pending;
  int64_t last_index = -1;
  // An n-best line's INDEX and text ("INDEX ||| text ||| ...", transformer_decode --nbest's
  // and Moses' format), said by its line in the file when it is not one.
  const auto parse_nbest = [&](std::string line) {
    const std::string where =
        references.name() + ": line " + std::to_string(references.lines_read());
    const size_t first = line.find(" ||| ");
    const std::string index_text = line.substr(0, first);
    if (first == std::string::npos || index_text.empty() || index_text.size() > 15 ||
        index_text.find_first_not_of("0123456789") != std::string::npos) {
      THPC_FAIL(where << " is not an n-best line 'INDEX ||| text ||| ...' with INDEX the "
                      << "0-based input line (--reference-nbest: transformer_decode --nbest's "
                      << "format); give the n-best list as written, or leave --reference-nbest "
                      << "out to score a translation a line");
    }
    NbestLine parsed;
    parsed.index = std::stoll(index_text);
    if (parsed.index < last_index) {
      THPC_FAIL(where << " is for input line " << parsed.index << " after a line for "
                      << last_index << ": the n-best list must be in input order, as "
                      << "transformer_decode --nbest writes it (sort it by INDEX, keeping each "
                      << "line's hypotheses in their order)");
    }
    last_index = parsed.index;
    const size_t second = line.find(" ||| ", first + 5);
    parsed.text = line.substr(first + 5, second == std::string::npos ? std::string::npos
                                                                    : second - first - 5);
    parsed.whole = std::move(line);
    return parsed;
  };
  // The buffer's pairs: its input lines with as many lines of the translations (or, with
  // --reference-nbest, the n-best lines of those input lines), both encoded.
  const auto read_buffer = [&](InputBuffer& buffer) {
    buffer = InputBuffer();
    buffer.first_line = input.lines_read();
    input.read(buffer_size, &buffer.lines);
    buffer.first_reference_line = references.lines_read() - (pending ? 1 : 0);
    std::vector<char> long_source, long_reference;
    if (args.reference_nbest) {
      std::vector<thpc::TokenSequence> line_sources;
      std::vector<char> long_line;
      encoder.encode(input.name(), buffer.first_line, buffer.lines, line_sources, &long_line);
      const int64_t end = buffer.first_line + static_cast<int64_t>(buffer.lines.size());
      for (;;) {
        if (!pending) {
          std::vector<std::string> one;
          references.read(1, &one);
          if (one.empty()) break;
          pending = parse_nbest(std::move(one.front()));
        }
        if (pending->index >= end) break;  // a later buffer's
        const size_t line = static_cast<size_t>(pending->index - buffer.first_line);
        buffer.sources.push_back(line_sources[line]);
        long_source.push_back(long_line[line]);
        buffer.reference_lines.push_back(std::move(pending->text));
        buffer.nbest_lines.push_back(std::move(pending->whole));
        pending.reset();
      }
      if (input.at_end() && pending) {
        THPC_FAIL(references.name() << ": line " << references.lines_read() << " is for input "
                  << "line " << pending->index << ", but " << input.name() << " has "
                  << input.lines_read() << (input.lines_read() == 1 ? " line" : " lines")
                  << " (INDEX counts from 0): give the input the n-best list was made from");
      }
    } else {
      if (!buffer.lines.empty()) references.read(buffer.lines.size(), &buffer.reference_lines);
      if (buffer.reference_lines.size() < buffer.lines.size()) {
        // The translations ended; the input's count is known for a file, or so far (a
        // pipe's rest is not read to say it).
        mismatch(input_count >= 0 ? count_said(input.name(), input_count, true)
                                  : count_said(input.name(), input.lines_read(), input.at_end()),
                 count_said(references.name(), references.lines_read(), true));
      }
      if (input.at_end() && !references.at_end()) {
        std::vector<std::string> extra;
        references.read(1, &extra);
        if (!extra.empty()) {
          mismatch(count_said(input.name(), input.lines_read(), true),
                   reference_count >= 0
                       ? count_said(references.name(), reference_count, true)
                       : count_said(references.name(), references.lines_read(), false));
        }
      }
      encoder.encode(input.name(), buffer.first_line, buffer.lines, buffer.sources, &long_source);
    }
    reference_encoder.encode(references.name(), buffer.first_reference_line,
                             buffer.reference_lines, buffer.references, &long_reference);
    const size_t pairs = buffer.references.size();
    buffer.scored.assign(pairs, 1);
    for (size_t i = 0; i < pairs; ++i) {
      if (!long_source[i] && !long_reference[i]) continue;
      buffer.scored[i] = 0;
      if (unscored++ > 0) continue;
      const bool input_too_long = long_source[i] != 0;
      first_unscored =
          std::string(args.reference_nbest ? "n-best " : "") + "line " +
          std::to_string(buffer.first_reference_line + static_cast<int64_t>(i) + 1) + ", whose " +
          (input_too_long ? "input" : "translation") + " has " +
          std::to_string((input_too_long ? buffer.sources : buffer.references)[i].size()) +
          " pieces";
    }
    buffer.scores.assign(pairs, -std::numeric_limits<double>::infinity());
    if (args.piece_scores) buffer.piece_scores.assign(pairs, {});
  };
  const auto batches_of = [&](const InputBuffer& buffer, int workers, bool on_cpu) {
    return thpc::make_scoring_batches(buffer.sources, buffer.references, buffer.scored,
                                      args.batch_tokens, workers, args.batch_sentences,
                                      on_cpu ? thpc::kCpuScoringBatchCut : 0);
  };
  InputBuffer buffer;
  Findings found;
  std::optional<thpc::tools::Progress> progress;
  std::optional<WorkerPool> workers;
  int batching_workers = 1;
  bool on_cpu = true;
  bool one_buffer = false;
  double log_likelihood = 0;  // of the scored pairs
  int64_t pieces = 0;         // their references' pieces, eos included
  int64_t pairs = 0;          // written, scored or not
  const auto start = [&] {
    if (buffer_size != 0) {
      input.check_every_line_first();
      references.check_every_line_first();
    }
    read_buffer(buffer);
    one_buffer = input.at_end();
    Workers plan = plan_workers(
        args, train, [&](int count, bool cpu) { return batches_of(buffer, count, cpu); },
        one_buffer);
    buffer.batches = std::move(plan.batches);
    batching_workers = plan.batching_workers;
    on_cpu = plan.on_cpu;
    int64_t total = thpc::ProgressListener::kUnknownTotal;
    if (one_buffer) {
      total = static_cast<int64_t>(std::count(buffer.scored.begin(), buffer.scored.end(), 1));
    } else if (!output_is_the_terminal(args.output) && !args.reference_nbest) {
      total = input.count_file_lines();
    }
    progress.emplace("transformer_decode", "pairs", total, nullptr,
                     one_buffer || !output_is_the_terminal(args.output));
    workers.emplace(args, ensemble, spm.vocabulary.ids, std::move(plan), *progress, found);
  };
  InputFailure scoring;
  try {
    write_output(args, [&](std::ostream& out) {
      scoring.run(start);
      for (;;) {
        // Pairs not scored have no batch: done at once (an input of one buffer counts only
        // the scored ones).
        if (!one_buffer) {
          progress->advance(static_cast<int64_t>(
              std::count(buffer.scored.begin(), buffer.scored.end(), 0)));
        }
        scoring.run([&] { workers->translate(buffer); });
        if (input.at_end()) progress->finish();
        out << std::fixed << std::setprecision(6);
        for (size_t i = 0; i < buffer.references.size(); ++i) {
          const double tokens = static_cast<double>(buffer.references[i].size() + 1);
          if (buffer.scored[i]) {
            log_likelihood += buffer.scores[i];
            pieces += static_cast<int64_t>(tokens);
          }
          ++pairs;
          if (args.reference_nbest) out << buffer.nbest_lines[i] << " ||| ";
          out << (args.normalize && buffer.scored[i] ? buffer.scores[i] / tokens
                                                     : buffer.scores[i]);
          if (args.piece_scores) {
            out << " |||" << std::setprecision(4);
            for (const float piece : buffer.piece_scores[i]) out << ' ' << piece;
            out << std::setprecision(6);
          }
          out << "\n";
        }
        check_buffer_written(args, out);
        if (input.at_end()) break;
        scoring.run([&] { read_buffer(buffer); });
        if (buffer.lines.empty()) break;
        buffer.batches = batches_of(buffer, batching_workers, on_cpu);
      }
    });
  } catch (const InputFailure::Carried&) {
    scoring.rethrow(args.output, static_cast<size_t>(pairs), "scored", "scores");
  }
  progress->finish();
  const int64_t scored_pairs = pairs - unscored;
  std::cerr << "transformer_decode: scored " << scored_pairs
            << (scored_pairs == 1 ? " pair" : " pairs") << " (" << pieces
            << " pieces with eos): log-likelihood " << std::fixed << std::setprecision(4)
            << log_likelihood;
  if (pieces > 0) {
    std::cerr << ", " << log_likelihood / double(pieces) << " a piece, perplexity "
              << std::exp(-log_likelihood / double(pieces));
  }
  std::cerr << "\n";
  if (unscored > 0) {
    std::cerr << "transformer_decode: warning: " << unscored
              << (unscored == 1 ? " pair is" : " pairs are") << " not scored (written -inf, "
              << "left out of the sums above), the first " << first_unscored
              << ": a side is longer than the position table holds (" << encoder.longest()
              << " pieces and eos, " << ensemble.max_positions_said() << "); a filter that "
              << "combines scores must take -inf as the worst (docs/decoding.md)\n";
  }
  if (found.profile) {
    std::cerr << thpc::format_profile(*found.profile, found.backend_name, 0.0, "batch");
  }
  return 0;
}

int run(const Arguments& args) {
  const thpc::DecodingCheckpoints ensemble = read_checkpoints(args);
  // The first checkpoint's [train] gives the backend and its threads, its [decode] the
  // search's defaults.
  thpc::TrainConfig train = ensemble.config.train;
  if (args.threads >= 0) train.threads = args.threads;
  if (args.cuda_kernels) train.cuda_kernels = *args.cuda_kernels;
  try {
    thpc::check_compute_type_runs_here(train, args.compute_type);
  } catch (const thpc::Error& error) {
    throw thpc::tools::UsageError(error.what());
  }
  for (size_t m = 0; m < ensemble.checkpoints.size(); ++m) {
    if (!ensemble.checkpoints[m].quantized.empty() &&
        args.compute_type != thpc::ComputeType::kInt8) {
      std::cerr << "transformer_decode: note: " << ensemble.paths[m] << " stores its weight "
                << "matrices in int8 (transformer_quantize): --compute-type "
                << thpc::compute_type_name(args.compute_type) << " multiplies their "
                << "dequantized values in float; --compute-type int8 multiplies them as "
                << "stored\n";
    }
  }
  const thpc::DecodeConfig& stored = ensemble.config.decode;
  SentencePieceModel spm, source_spm;
  // (before --spm-model is compared with the stored target model: given the source's
  // spm.source.model, that comparison said "2000 pieces against 3000" and nothing of the
  // two vocabularies; a user's walk)
  if (ensemble.source_vocab_size > 0 && !args.spm_model.empty()) {
    throw thpc::tools::UsageError("--spm-model replaces one shared vocabulary, and " +
                                  ensemble.paths.front() + " has separate source and target "
                                  "vocabularies, both stored in it: leave --spm-model out");
  }
  load_sentencepiece_model(args, ensemble, spm);
  // With separate vocabularies the source's model encodes the input (and names its pieces
  // in an attention dump); with one, the model of both sides.
  const SentencePieceModel& source_model =
      load_source_sentencepiece_model(args, ensemble, spm, source_spm) ? source_spm : spm;
  const sentencepiece::SentencePieceProcessor& source_processor = source_model.processor;
  // A parser's vocabulary (its brackets whole pieces, transformer_preprocess --user-symbols)
  // decoded without --tree-constraints writes trees that delinearize must repair: test F1
  // 12.7 against 32.4 constrained, in a helper's walk, without a word.
  // (and an opening bracket with its label, "▁(NP": "▁)" alone is a piece of any
  // vocabulary of text with spaced parentheses, Moses-tokenized WMT's; a review's false
  // note)
  const bool labelled_bracket = [&] {
    for (int id = 0; id < spm.processor.GetPieceSize(); ++id) {
      const std::string piece = spm.processor.IdToPiece(id);
      if (piece.rfind("\xe2\x96\x81(", 0) == 0 && piece.size() > 4 &&
          std::isupper(static_cast<unsigned char>(piece[4]))) {
        return true;
      }
    }
    return false;
  }();
  if (!args.score_reference.empty()) {
    return run_scoring(args, ensemble, train, spm, source_processor);
  }
  if (!args.tree_constraints && !args.sampling &&
      spm.processor.PieceToId("\xe2\x96\x81)") != spm.processor.unk_id() && labelled_bracket) {
    std::cerr << "transformer_decode: note: " << spm.name << " holds the bracket pieces of a "
              << "parser's linearized trees: --tree-constraints decodes only well-formed trees "
              << "over each line's words (docs/parsing.md)\n";
  }

  // The search's options are checked before the output is opened (a usage error must
  // not wait for a FIFO's reader) or the input read.
  const thpc::BeamOptions options = search_options(args, stored, ensemble.max_positions);
  // A search wider than the vocabulary keeps hypotheses that no candidate fills at the
  // first step (fairseq caps it at the vocabulary less one); --beam 100000 on one short
  // line ran for minutes. Samples (--sampling --beam N) are independent draws: any N.
  // (Of the tokens a search can choose: a beam of the whole vocabulary wrote 2 lines
  // fewer than --nbest asked.)
  const int selectable = thpc::selectable_tokens(ensemble.vocab_size);
  if (!args.sampling && options.beam > selectable) {
    throw thpc::tools::UsageError(
        "the beam " + std::to_string(options.beam) + " (--beam, or the checkpoint's "
        "decode.beam) is wider than the " + std::to_string(selectable) + " tokens a search "
        "can choose (the vocabulary of " + std::to_string(ensemble.vocab_size) + " less pad "
        "and bos): give at most " + std::to_string(selectable));
  }

  // --dump-attention is written after the translations, its temporary file claimed
  // before them: another program writing it now is said at once, not after the input.
  std::optional<thpc::OutputClaim> dump_claim;
  if (!args.dump_attention.empty()) {
    dump_claim.emplace(args.dump_attention, "attention dump " + args.dump_attention);
  }

  // The input a buffer at a time (--buffer-sentences; --dump-lines reads it whole), each
  // buffer encoded, translated in batches sorted by length, and written in input order
  // before the next is read: memory is a buffer's whatever the input's size.
  SourceReader reader(args.input);
  SourceEncoder encoder(source_processor, ensemble.max_positions, ensemble.max_positions_said());
  const size_t buffer_size =
      args.dump_lines.empty() ? static_cast<size_t>(args.buffer_sentences) : 0;
  const auto read_buffer = [&](InputBuffer& buffer) {
    buffer = InputBuffer();
    buffer.first_line = reader.lines_read();
    reader.read(buffer_size, &buffer.lines);
    if (buffer.first_line == 0) check_dump_lines_in(args.dump_lines, reader.name(), buffer);
    encoder.encode(reader.name(), buffer);
    if (reader.at_end()) encoder.say_count(reader.name());
    buffer.hypotheses.resize(buffer.lines.size());
  };
  // The search for a buffer: --tree-constraints' filter is over its lines.
  const auto search_buffer = [&](InputBuffer& part) {
    part.options = options;
    if (args.tree_constraints) {
      part.tree_filter = make_tree_filter(args, stored, spm, part);
      part.options.filter = part.tree_filter.get();
      check_room_for_trees(part, *part.tree_filter);
    }
  };
  InputBuffer buffer;
  Findings found;
  int64_t stopped_by_the_table = 0;  // translations_stopped_by_the_table's, summed
  int64_t unmatched_tree_lines = 0;  // InputBuffer::unmatched_tree_lines, summed
  std::optional<thpc::tools::Progress> progress;
  std::optional<WorkerPool> workers;
  bool one_buffer = false;
  int batching_workers = 1;
  // The first buffer read, and where --dump-lines' dumps go.
  const auto read_first_buffer = [&] {
    read_buffer(buffer);
    if (!args.dump_lines.empty()) {
      buffer.dump_slot = attention_dump_slots(args.dump_lines, reader.name(), buffer);
      found.dumps.resize(args.dump_lines.size());
    }
  };
  // --dump-lines reads the whole input, before the output is opened: a line it names that
  // the input lacks is a usage error said at once (with --output FIFO it waited for the
  // FIFO's reader first).
  if (!args.dump_lines.empty()) read_first_buffer();
  // The first buffer's batches and the workers planned on it.
  const auto start = [&] {
    // (--buffer-sentences 0 reads the whole input before translating it anyway)
    if (buffer_size != 0) reader.check_every_line_first();
    if (args.dump_lines.empty()) read_first_buffer();
    search_buffer(buffer);
    // The workers are planned on the whole input when the first buffer holds it, else
    // for an input of many buffers (Workers::batching_workers then shares out each one).
    one_buffer = reader.at_end();
    Workers plan = plan_workers(
        args, train,
        [&](int count, bool) {
          return thpc::make_decode_batches(buffer.sources, options, args.batch_tokens, count,
                                           args.batch_sentences);
        },
        one_buffer);
    buffer.batches = std::move(plan.batches);
    batching_workers = plan.batching_workers;
    // As before buffers, an input of one buffer counts its sentences (its empty lines
    // have no translation to wait for); a larger one counts lines, of a total known for a
    // file. No progress line beside translations written a buffer at a time to the
    // terminal it would be on (it ran into them: "... 1000/5000 sentences (20%), 0.3
    // szweihundert"): they show how far it is themselves. An input of one buffer shows
    // it, ended before its translations are written.
    // Nor beside lines typed on the terminal (a helper's walk: "... 0.0 stwo dogs"),
    // whose translations show how far it is too.
    const bool translations_beside_the_line =
        !one_buffer && (output_is_the_terminal(args.output) ||
                        (args.input == "-" && isatty(STDIN_FILENO)));
    int64_t total = thpc::ProgressListener::kUnknownTotal;
    if (one_buffer) {
      total = 0;
      for (const thpc::DecodeBatch& batch : buffer.batches) total += batch.members.size();
    } else if (!translations_beside_the_line) {
      total = reader.count_file_lines();
    }
    progress.emplace("transformer_decode", "sentences", total, nullptr,
                     !translations_beside_the_line);
    workers.emplace(args, ensemble, spm.vocabulary.ids, std::move(plan), *progress, found);
  };
  InputFailure decoding;
  size_t lines_translated = 0;  // the input's lines whose translations were written
  // The output is opened before the input is read (but with --dump-lines, above), as
  // Marian's and CTranslate2's are: a program that opens the FIFO given as --output before
  // it writes the input waited for the decoder to open it, and the decoder for the end of
  // the input's first buffer.
  try {
    write_output(args, [&](std::ostream& out) {
      decoding.run(start);
      for (;;) {
        for (thpc::DecodeBatch& batch : buffer.batches) {
          batch.sentence_offset = static_cast<size_t>(buffer.first_line);
        }
        if (!one_buffer) {  // empty lines have no batch: done at once
          progress->advance(static_cast<int64_t>(
              std::count_if(buffer.sources.begin(), buffer.sources.end(),
                            [](const thpc::TokenSequence& source) { return source.empty(); })));
        }
        decoding.run([&] { workers->translate(buffer); });
        if (reader.at_end()) progress->finish();  // its line ended before the translations
        write_translations(out, buffer, options.nbest, spm.processor);
        lines_translated += buffer.lines.size();
        stopped_by_the_table += translations_stopped_by_the_table(buffer, options);
        unmatched_tree_lines += buffer.unmatched_tree_lines;
        check_buffer_written(args, out);
        if (reader.at_end()) break;
        decoding.run([&] {
          read_buffer(buffer);
          search_buffer(buffer);
        });
        if (buffer.lines.empty()) break;  // the input ended with the last buffer
        buffer.batches = thpc::make_decode_batches(buffer.sources, options, args.batch_tokens,
                                                   batching_workers, args.batch_sentences);
      }
    });
  } catch (const InputFailure::Carried&) {
    decoding.rethrow(args.output, lines_translated, "translated", "translations");
  }
  progress->finish();
  if (unmatched_tree_lines > 0) {
    std::cerr << "transformer_decode: warning: " << unmatched_tree_lines
              << (unmatched_tree_lines == 1 ? " line's tree is" : " lines' trees are")
              << " written with SentencePiece's text, not the line's own words: its pieces do "
              << "not split into those words one by one (a character SentencePiece makes a "
              << "space or drops, such as a no-break or zero-width space, or a line cut at "
              << "the position table), so its leaves may differ from them; replace such "
              << "characters in the input\n";
  }
  if (stopped_by_the_table > 0) {
    std::cerr << "transformer_decode: warning: " << stopped_by_the_table
              << (stopped_by_the_table == 1 ? " translation" : " translations")
              << " stopped at the model's position table (" << options.max_len_cap
              << " tokens, " << ensemble.max_positions_said()
              << "), short of the length limit asked for (max_len_a x source length + "
              << "max_len_b: --max-len-a, --max-len-b, or the checkpoint's decode.max_len_a/b)"
              << "; only a model with a larger model.max_positions translates longer\n";
  }
  if (found.profile) {
    std::cerr << thpc::format_profile(*found.profile, found.backend_name, 0.0, "batch");
    // Where steps are captured, how many were: a refused capture leaves its shape's steps
    // launched one by one for the rest of the run (their host gaps back in the profile),
    // and with several capturing workers (worker_graphs) whether one's calls ever refuse
    // another's capture is for a GPU to say.
    if (workers) {
      const thpc::Transformer::CaptureCounts captured = workers->capture_counts();
      if (captured.captures + captured.refused > 0) {
        std::cerr << "transformer_decode: captured decoding steps (" << workers->count()
                  << (workers->count() == 1 ? " worker" : " workers")
                  << "): " << captured.captures << " captured, " << captured.replays
                  << " replays, " << captured.refused << " refused, " << captured.evicted
                  << " evicted\n";
      }
    }
  }
  if (!args.dump_attention.empty()) {
    write_attention_file(args, ensemble, buffer, found, spm, source_model, *dump_claim);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  thpc::run_with_openblas_kernels_for_this_cpu(argv);  // first: it may start us again
  thpc::set_out_of_memory_advice(
      "lower --batch-tokens (or give --batch-sentences), --beam (with --sampling: the "
      "samples a sentence), --threads or --buffer-sentences");
  Arguments args;
  po::options_description options(
      "usage: transformer_decode --checkpoint FILE [FILE...] [options]\n\n"
      "Translates the input, one sentence per line, with beam search (or greedily, or by\n"
      "sampling) and writes one line per input line, in input order; with --score-reference\n"
      "FILE, scores FILE's lines as the input lines' translations instead.\n\noptions");
  options.add_options()
      ("help,h", "print this text and exit")(
      "version", "print the git commit the program was built from and exit")
      ("checkpoint", po::value(&args.checkpoints)->multitoken()->composing()->required(),
       "checkpoint (a step or an average; required); several decode as an ensemble, the "
       "weighted mean of their log-probabilities at every step (fairseq --path a:b, Marian "
       "--models; models of any sizes with one vocabulary; the first checkpoint's [decode] "
       "settings are the defaults, which transformer_hpc --show-checkpoint FILE prints)")
      ("weights", po::value(&args.given_weights)->multitoken(),
       "ensemble weights, one per --checkpoint in order, each > 0, normalised to sum 1 "
       "(default: equal)")
      ("spm-model", po::value(&args.spm_model),
       "SentencePiece model of the corpus (default: the one stored in the checkpoint; one "
       "that stores another is refused)")
      ("input", po::value(&args.input)->default_value(args.input),
       "source text, one sentence per line (- = stdin)")
      ("output", po::value(&args.output)->default_value(args.output),
       "translations (- = stdout)")
      ("beam", po::value<int>(), "beam size (default: the checkpoint's decode.beam; §6.1: 4)")
      ("lenpen", po::value<float>(),
       "length penalty alpha, ((5+|Y|)/6)^alpha (default: decode.alpha; §6.1: 0.6)")
      ("max-len-a", po::value<double>(), "output length <= a * input length + b, rounded "
                                          "down, at least 1 token (a may be a ratio: 1.2)")
      ("max-len-b", po::value<int>(), "(default: decode.max_len_a/b; §6.1: a = 1, b = 50)")
      ("batch-tokens", po::value(&args.batch_tokens)->default_value(args.batch_tokens),
       "padded source tokens per batch")
      ("batch-sentences", po::value(&args.batch_sentences)->default_value(args.batch_sentences),
       "sentences per batch, at most (0: as many as --batch-tokens allows)")
      ("buffer-sentences", po::value(&args.buffer_sentences)->default_value(args.buffer_sentences),
       "input lines read, sorted into batches, translated and written at a time, so that "
       "memory does not grow with the input and translations come out as they are done "
       "(fairseq-interactive's --buffer-size; 1 for text typed or sent line by line); 0: "
       "the whole input at once (--dump-lines always reads it whole)")
      ("nbest", po::value(&args.search.nbest)->default_value(args.search.nbest),
       "hypotheses per sentence (<= beam); 2 or more: each as INDEX ||| text ||| score (the "
       "log-probability over the length penalty, as the search ranks them), 1: the "
       "translation alone")
      ("greedy", po::bool_switch(&args.search.greedy), "greedy decoding (beam 1, no length penalty)")
      ("profile", po::bool_switch(&args.profile),
       "print to standard error where the decoding time went: each op class's time per "
       "batch and the host time between the backend's ops (the first CPU worker's batches; "
       "on a GPU every worker's, and the time the device had no worker's op in flight)")
      ("threads", po::value<int>(),
       "CPU decoding threads: as many workers, each translating whole batches with its own "
       "copy of the model on one thread, or, when an input of one --buffer-sentences buffer "
       "fills fewer than two batches (--batch-tokens) a thread, fewer workers sharing the "
       "threads; 0 = one per core this process may use (its Slurm cpuset, taskset) "
       "(default: the checkpoint's train.threads)")
      ("gpu-workers", po::value(&args.gpu_workers)->default_value(args.gpu_workers),
       "GPU decoding workers sharing the device, each translating whole batches with its "
       "own copy of the model on its own CUDA stream (CTranslate2's inter_threads on a "
       "GPU): while one worker's host picks the beam's next tokens, another's kernels run")
      ("cuda-graphs", po::value<std::string>()->default_value("on"),
       "on a GPU with one worker: on = each decoding step's kernels captured into a CUDA "
       "graph once per shape and replayed (the host launches one graph a step instead of "
       "~100 kernels; the same translations), off = launched one by one; several "
       "--gpu-workers launch theirs one by one, unless --cuda-kernels names the candidate "
       "worker_graphs")
      ("compute-type", po::value<std::string>(),
       "the arithmetic, as CTranslate2 names it: default (the checkpoint's train.precision), "
       "float32, bfloat16 (a GPU), or int8 (weights in int8 with a scale per output channel, "
       "activations quantized per row; the CPU: oneDNN's int8 products, the rest in "
       "float32; a GPU: cuBLASLt's, the rest in bfloat16)")
      ("cuda-kernels", po::value<std::string>(),
       "GPU kernels, as train.cuda_kernels: verified, candidate (the kernels not yet made "
       "the default), or candidate names; default: the checkpoint's")
      ("dump-attention", po::value(&args.dump_attention),
       "write every layer's and head's attention weights of the --dump-lines translations "
       "to this HDF5 file (tools/plot_attention.py draws them)")
      ("dump-lines", po::value<std::string>(),
       "the input lines to dump, 1-based and comma-separated, e.g. 1,5,9 (with an ensemble: "
       "the first model's attention)")
      ("sampling", po::value<std::string>(),
       "sample the translations instead of searching (back-translation): full (the whole "
       "distribution), topk=K (the K most probable tokens) or topp=P (the smallest set of "
       "most probable tokens with mass >= P), as fairseq --sampling and Marian "
       "--output-sampling; --beam N draws N independent samples per sentence (default 1), "
       "ranked by score for --nbest")
      ("temperature", po::value<std::string>(),
       "with --sampling: draw from softmax(log p / T), T > 0 (default 1; < 1 sharper)")
      ("seed", po::value<std::string>(),
       "with --sampling: the random seed, 0..2^64-1 (default 1); a sentence's draws depend "
       "only on the seed and its line, not on batching or --threads")
      ("tree-constraints", po::bool_switch(&args.tree_constraints),
       "parsing mode: write only well-formed linearized trees over exactly the input line's "
       "words: as many XX as it has words ('(S (NP XX ) XX )'), or its words themselves "
       "('(S (NP Prices ) fell )'), see --tree-leaves")
      ("tree-leaves", po::value<std::string>(),
       "with --tree-constraints: the trees' word tokens, XX (the placeholder) or words "
       "(the input line's own words, in order: transformer_trees linearize --leaves words; "
       "default: the checkpoint's decode.tree_leaves)")
      ("score-reference", po::value(&args.score_reference),
       "score this file's lines, one per input line (its translations: references, or "
       "another system's output), instead of translating: writes log P(line | input line) "
       "for each, the natural log summed over its pieces and eos (marian-scorer, "
       "fairseq-generate --score-reference), in one forward pass a batch; -inf for a pair "
       "longer than the position table; the corpus's per-piece log-likelihood and "
       "perplexity go to standard error. An ensemble scores the weighted mean of its "
       "models' scores")
      ("normalize", po::bool_switch(&args.normalize),
       "with --score-reference: each score divided by its line's pieces + eos (Marian's "
       "--normalize)")
      ("piece-scores", po::bool_switch(&args.piece_scores),
       "with --score-reference: after each score, ' ||| ' and the log-probability of each "
       "of the line's SentencePiece pieces and of eos, in order (fairseq's positional "
       "scores; Marian's --word-scores, by piece)")
      ("reference-nbest", po::bool_switch(&args.reference_nbest),
       "with --score-reference: its file is an n-best list (--nbest's INDEX ||| text ||| "
       "score lines, INDEX the 0-based input line, in input order; fields after the text "
       "are kept), each hypothesis scored against its input line and written back with "
       "' ||| SCORE' appended, for reranking (marian-scorer --n-best)");
  const auto parse = [&](int count, char** arguments) {
    // Marian's and fairseq-generate's names, as their users type them (a Marian user's
    // walk: each was "unrecognised" with nothing more).
    thpc::tools::refuse_other_toolkits_options(
        options, count, arguments,
        {{"m", "here it is --checkpoint FILE [FILE...], several an ensemble"},
         {"models", "here it is --checkpoint FILE [FILE...], several an ensemble"},
         {"path", "here it is --checkpoint FILE [FILE...], several an ensemble"},
         {"b", "here it is --beam"},
         {"beam-size", "here it is --beam"},
         {"n", "the length penalty is --lenpen, GNMT's ((5+|Y|)/6)^alpha, not Marian's "
               "|Y|^alpha: neither ranks as the other"},
         {"max-length", "inputs longer than the position table (model.max_positions) are "
                        "cut, with a warning; the output's length is --max-len-a, --max-len-b"},
         {"max-length-factor", "here it is --max-len-a A --max-len-b B: at most A x input "
                               "length + B"},
         {"mini-batch", "here it is --batch-sentences"},
         {"batch-size", "here it is --batch-sentences"},
         {"mini-batch-words", "here it is --batch-tokens, padded source tokens"},
         {"max-tokens", "here it is --batch-tokens, padded source tokens"},
         {"maxi-batch", "here it is --buffer-sentences, the lines read and sorted at a time"},
         {"buffer-size", "here it is --buffer-sentences"},
         {"cpu-threads", "here it is --threads"},
         {"d", "the GPU is the one CUDA_VISIBLE_DEVICES shows first; --gpu-workers runs "
               "several workers on it"},
         {"devices", "the GPU is the one CUDA_VISIBLE_DEVICES shows first; --gpu-workers "
                     "runs several workers on it"},
         {"n-best", "here it is --nbest N, hypotheses per sentence (<= --beam)"},
         {"i", "here it is --input"},
         {"o", "here it is --output"},
         {"v", "the checkpoint stores its SentencePiece models (both, with separate "
               "vocabularies); --spm-model replaces a shared one"},
         {"vocabs", "the checkpoint stores its SentencePiece models (both, with separate "
                    "vocabularies); --spm-model replaces a shared one"},
         {"output-sampling", "here it is --sampling full, topk=K or topp=P"},
         {"sampling-topk", "here it is --sampling topk=K"},
         {"sampling-topp", "here it is --sampling topp=P"},
         {"remove-bpe", "translations are always detokenised with the SentencePiece model"},
         {"word-penalty", "not offered: --lenpen is the length's only term"},
         {"word-scores", "here it is --piece-scores, with --score-reference"}});
    const po::variables_map values = thpc::tools::parse_options(options, count, arguments);
    args.help = values.count("help") > 0;
    if (!args.help) {
      // (an empty --output has its own refusal, beside its other checks)
      thpc::tools::refuse_empty_values(values,
                                       {"checkpoint", "spm-model", "input", "score-reference"});
    }
    thpc::SearchOverrides& search = args.search;
    if (values.count("beam")) search.beam = values["beam"].as<int>();
    if (values.count("lenpen")) search.alpha = values["lenpen"].as<float>();
    if (values.count("max-len-a")) search.max_len_a = values["max-len-a"].as<double>();
    if (values.count("max-len-b")) search.max_len_b = values["max-len-b"].as<int>();
    if (values.count("threads")) args.threads = values["threads"].as<int>();
    if (values.count("compute-type")) {
      args.compute_type = thpc::parse_compute_type(values["compute-type"].as<std::string>());
    }
    if (values.count("cuda-graphs")) {
      const std::string graphs = values["cuda-graphs"].as<std::string>();
      if (graphs != "on" && graphs != "off") {
        THPC_FAIL("--cuda-graphs: expected on or off, got '" << graphs << "'");
      }
      args.cuda_graphs = graphs == "on";
    }
    if (values.count("cuda-kernels")) {
      args.cuda_kernels = values["cuda-kernels"].as<std::string>();
      unsigned candidates = 0;
      std::string error;
      if (!thpc::parse_candidate_kernels(*args.cuda_kernels, candidates, error)) {
        THPC_FAIL("--cuda-kernels: " << error);
      }
    }
    // Each range on its own, so that the message names the option given.
    using thpc::tools::require_at_least;
    // As --greedy --nbest 2 and --sampling --greedy are: a width the search would ignore.
    if (search.greedy && search.beam) {
      THPC_FAIL("--greedy and --beam " << *search.beam
                << ": choose one (--greedy is a beam of 1 without a length penalty)");
    }
    if (search.greedy && search.alpha) {
      THPC_FAIL("--greedy and --lenpen: greedy search has no length penalty (it ranks no "
                "hypotheses); give --beam N --lenpen A, or --greedy alone");
    }
    if (search.beam) require_at_least("--beam", *search.beam, 1);
    require_at_least("--nbest", search.nbest, 1);
    require_at_least("--batch-tokens", args.batch_tokens, 1);
    require_at_least("--batch-sentences", args.batch_sentences, 0, "0: no limit");
    require_at_least("--buffer-sentences", args.buffer_sentences, int64_t{0}, "0: the whole input");
    require_at_least("--gpu-workers", args.gpu_workers, 1);
    if (search.max_len_a) {
      require_at_least("--max-len-a", *search.max_len_a, 0);
      if (!std::isfinite(*search.max_len_a)) {
        THPC_FAIL("--max-len-a must be finite, got " << *search.max_len_a);
      }
    }
    if (search.max_len_b) require_at_least("--max-len-b", *search.max_len_b, 0);
    if (search.alpha) {
      require_at_least("--lenpen", *search.alpha, 0, "§6.1: 0.6");
      if (!std::isfinite(*search.alpha)) {
        THPC_FAIL("--lenpen must be finite (an infinite alpha makes every score -0), got "
                  << *search.alpha);
      }
    }
    if (values.count("threads")) {
      require_at_least("--threads", args.threads, 0, "0: one per core");
      // Each is a worker with a copy of the model: 100,000 of them ended in a segfault.
      if (args.threads > 1024) {
        THPC_FAIL("--threads must be from 0 (one per core) to 1024, got " << args.threads);
      }
    }
    if (values.count("dump-lines")) {
      args.dump_lines = parse_line_numbers(values["dump-lines"].as<std::string>());
    }
    // Scoring reads the given lines' tokens: nothing is searched, sampled or dumped.
    if (!args.score_reference.empty()) {
      for (const char* searching : {"beam", "lenpen", "max-len-a", "max-len-b", "sampling",
                                    "dump-attention", "dump-lines", "tree-leaves"}) {
        if (values.count(searching)) {
          THPC_FAIL("--" << searching << " does not go with --score-reference, which scores "
                    << "the given lines instead of searching for translations");
        }
      }
      if (search.greedy || args.tree_constraints || search.nbest != 1) {
        THPC_FAIL((search.greedy ? "--greedy" : args.tree_constraints ? "--tree-constraints"
                                                                       : "--nbest")
                  << " does not go with --score-reference, which scores the given lines "
                  << "instead of searching for translations");
      }
      if (args.score_reference == "-" && args.input == "-") {
        THPC_FAIL("--score-reference - and the input both on standard input: give one of "
                  << "them as a file (--input FILE, or --score-reference FILE)");
      }
    } else if (args.normalize || args.reference_nbest || args.piece_scores) {
      THPC_FAIL((args.normalize ? "--normalize"
                 : args.reference_nbest ? "--reference-nbest" : "--piece-scores")
                << " goes with --score-reference FILE"
                << (args.normalize ? " (it divides each given line's score by its length); "
                                     "a translation's length penalty is --lenpen, GNMT's "
                                     "((5+|Y|)/6)^alpha, not Marian's |Y|^alpha"
                                   : ""));
    }
    if (args.dump_attention.empty() != args.dump_lines.empty()) {
      THPC_FAIL("--dump-attention FILE and --dump-lines N,... go together");
    }
    // As transformer_average refuses it: an ensemble of A, A and B weighed A double
    // without a word (a helper's trial).
    for (size_t i = 0; i < args.checkpoints.size(); ++i) {
      for (size_t j = 0; j < i; ++j) {
        std::error_code unknown;
        if (std::filesystem::equivalent(args.checkpoints[i], args.checkpoints[j], unknown)) {
          THPC_FAIL("--checkpoint names one file twice (" << args.checkpoints[j] << " and "
                    << args.checkpoints[i] << "): it would weigh double in the ensemble; name "
                    << "each model once (--weights gives a model more weight)");
        }
      }
    }
    if (values.count("weights")) {
      args.weights = thpc::ensemble_weights(args.checkpoints.size(), args.given_weights);
    }
    if (values.count("sampling")) {
      const auto given = [&](const char* name) {
        return values.count(name) ? std::optional(values[name].as<std::string>()) : std::nullopt;
      };
      args.sampling = thpc::parse_sampling_options(values["sampling"].as<std::string>(),
                                                   given("temperature"), given("seed"));
      if (search.greedy) THPC_FAIL("--sampling and --greedy: choose one (--sampling topk=1 draws greedily)");
      if (args.tree_constraints) THPC_FAIL("--sampling does not go with --tree-constraints");
    } else if (values.count("temperature") || values.count("seed")) {
      THPC_FAIL((values.count("temperature") ? "--temperature" : "--seed")
                << " goes with --sampling (a search draws nothing)");
    }
    if (values.count("tree-leaves")) {
      args.tree_leaves = values["tree-leaves"].as<std::string>();
      if (*args.tree_leaves != "XX" && *args.tree_leaves != "words") {
        THPC_FAIL("--tree-leaves '" << *args.tree_leaves << "': expected XX or words");
      }
      if (!args.tree_constraints) THPC_FAIL("--tree-leaves goes with --tree-constraints");
    }
    // Neither output may be an input, the other output or a training run's file, however
    // the path is spelt (the trained model turned into text, the source text replaced).
    if (!args.help) {
      if (args.output.empty()) THPC_FAIL("--output is empty: give a file, or - for standard output");
      std::vector<std::string> inputs = args.checkpoints;  // every model of an ensemble
      inputs.push_back(args.input);
      inputs.push_back(args.spm_model);
      inputs.push_back(args.score_reference);
      thpc::check_output_path("--output", args.output, inputs, thpc::OutputKind::Text,
                              {args.dump_attention});
      thpc::check_output_path("--dump-attention", args.dump_attention, inputs,
                              thpc::OutputKind::AttentionDump, {args.output});
    }
    return args;
  };
  return thpc::tools::tool_main("transformer_decode", thpc::tools::usage_text(options), argc,
                                argv, parse, run);
}
