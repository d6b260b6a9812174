#include "data/preprocess.h"

#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <ostream>
#include <random>
#include <set>
#include <sstream>
#include <thread>
#include <unordered_map>
#include <vector>

#include "common/cores.h"
#include "common/error.h"
#include "common/sha256.h"
#include "common/input_file.h"
#include "data/sentencepiece_vocabulary.h"
#include "data/shard_file.h"
#include "io/atomic_file.h"
#include "io/run_file_names.h"

namespace thpc {
namespace {

namespace fs = std::filesystem;

// `path`, a scratch or temporary file of the run in --destdir, made anew: a symbolic link
// at its name (planted in a shared directory, or left) had its target written, outside
// --destdir, and the run exited 0; a hard link had its other name's file truncated. A
// link or anything else that is no file is refused, as every writer of the project refuses
// one at its temporary file's name; a file (an interrupted run's leftover) is removed, so
// that the file written is this run's own.
std::string made_anew(const std::string& path) {
  if (const std::string why = why_no_file_can_be_made_at(path); !why.empty()) {
    THPC_FAIL("cannot write " << path << ": it " << why);
  }
  std::error_code error;
  fs::remove(path, error);  // (nothing there: no error)
  if (error) {
    THPC_FAIL("cannot write " << path << ": cannot remove the file there (" << error.message()
                              << ")");
  }
  return path;
}

// Length of the UTF-8 sequence starting at text[at], or 0 if it is not valid UTF-8
// (overlong forms, surrogates and code points above U+10FFFF included).
size_t utf8_sequence_length(const std::string& text, size_t at) {
  const auto byte = [&](size_t i) { return static_cast<unsigned char>(text[i]); };
  const unsigned char lead = byte(at);
  if (lead < 0x80) return 1;
  size_t length = 0;
  uint32_t code = 0;
  if ((lead & 0xE0) == 0xC0) {
    length = 2;
    code = lead & 0x1F;
  } else if ((lead & 0xF0) == 0xE0) {
    length = 3;
    code = lead & 0x0F;
  } else if ((lead & 0xF8) == 0xF0) {
    length = 4;
    code = lead & 0x07;
  } else {
    return 0;
  }
  if (at + length > text.size()) return 0;
  for (size_t i = 1; i < length; ++i) {
    if ((byte(at + i) & 0xC0) != 0x80) return 0;
    code = (code << 6) | (byte(at + i) & 0x3F);
  }
  static const uint32_t kSmallest[] = {0, 0, 0x80, 0x800, 0x10000};
  if (code < kSmallest[length] || code > 0x10FFFF || (code >= 0xD800 && code <= 0xDFFF)) return 0;
  return length;
}

// Lines are counted to `progress` in blocks of this many: often enough for a line that
// is redrawn ten times a second, rarely enough that its lock costs nothing.
constexpr int64_t kProgressBlock = 4096;

// The longest line SentencePiece's trainer is given (its max_sentence_length, bytes): it
// skips a longer one with three warnings naming its own flag, which this program does not
// have, so such lines are left out here (SampledLines) and said in the program's summary.
constexpr size_t kSentencePieceLongestLine = 65536;

// The lines of one text file, one at a time: a CRLF file's '\r' dropped, UTF-8 checked,
// NUL refused (text does not hold it: a file's blocks zeroed by a crash, or not text).
class LineReader {
 public:
  explicit LineReader(const std::string& path) : path_(path) {
    // A regular file: preprocessing reads each input more than once (its lines counted
    // first), which a pipe cannot give.
    std::error_code error;
    if (fs::exists(path, error) && !fs::is_directory(path, error) &&
        !fs::is_regular_file(path, error)) {
      THPC_FAIL(path << ": not a regular file (preprocessing reads its inputs more than "
                     << "once: write a pipe's text to a file first)");
    }
    stream_ = open_text_file(path, "");
  }

  // False after the last line.
  bool next(std::string* line) {
    if (!std::getline(stream_, *line)) {
      if (stream_.bad()) THPC_FAIL(path_ << ": read error after line " << lines_);
      return false;
    }
    // As SampledLines gives it to SentencePiece, a CRLF line's '\r' included.
    if (line->size() > kSentencePieceLongestLine) ++lines_too_long_for_training_;
    if (!line->empty() && line->back() == '\r') line->pop_back();
    for (size_t at = 0; at < line->size();) {
      const size_t length = utf8_sequence_length(*line, at);
      if (length == 0) {
        THPC_FAIL(path_ << ":" << lines_ + 1 << ": invalid UTF-8 at byte " << at + 1
                        << " of the line" << kNotUtf8Advice);
      }
      if ((*line)[at] == '\0') {
        THPC_FAIL(nul_byte_problem(path_, lines_ + 1, *line)
                  << "; repair or remove the line in both languages' files");
      }
      if ((*line)[at] == '\r') ++carriage_returns_;
      at += length;
    }
    ++lines_;
    return true;
  }

  int64_t lines() const { return lines_; }
  // Carriage returns inside lines (a CRLF line's own is not one of them).
  int64_t carriage_returns() const { return carriage_returns_; }
  // Lines SentencePiece's trainer would skip (longer than kSentencePieceLongestLine).
  int64_t lines_too_long_for_training() const { return lines_too_long_for_training_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::ifstream stream_;
  int64_t lines_ = 0, carriage_returns_ = 0, lines_too_long_for_training_ = 0;
};

// The lines of a file, counted and checked, none kept; `*too_long_for_training` += those
// longer than kSentencePieceLongestLine.
int64_t count_lines(const std::string& path, ProgressListener& progress,
                    int64_t* too_long_for_training) {
  LineReader reader(path);
  std::string line;
  while (reader.next(&line)) {
    if (reader.lines() % kProgressBlock == 0) progress.advance(kProgressBlock);
  }
  progress.advance(reader.lines() % kProgressBlock);
  *too_long_for_training += reader.lines_too_long_for_training();
  if (reader.lines() == 0) THPC_FAIL(path << ": empty file (expected one sentence per line)");
  // Lines ended by '\r' alone (classic Mac OS) read as one line: SentencePiece then failed
  // with its own words, or encoding the file as one sentence took ~240 bytes of memory a
  // byte. A stray '\r' inside a line of ordinary text is kept (web-crawled corpora have
  // them); more of them than lines, or any in a file of one line, is a file of '\r'-ended
  // lines (carriage_return_lines_problem).
  if (const std::string problem =
          carriage_return_lines_problem(path, reader.carriage_returns(), reader.lines());
      !problem.empty()) {
    THPC_FAIL(problem << ": convert both languages' files to \\n line ends, e.g. tr '\\r' "
                      << "'\\n' < " << path << " > NEW_PREFIX"
                      << fs::path(path).extension().string() << ", and give NEW_PREFIX");
  }
  return reader.lines();
}

// A split's two files, checked to be line-aligned UTF-8 text.
struct ParallelFiles {
  std::string source_path, target_path;
  int64_t pairs = 0;
  // Lines of both files longer than kSentencePieceLongestLine bytes.
  int64_t lines_too_long_for_training = 0;
};

// The share of the words of `path`'s first `lines` lines that begin with '▁' (U+2581,
// SentencePiece's word boundary), which no natural text has: text a user encoded with
// spm_encode already, as fairseq's preparation does, comes out near 1 (its first piece of
// every word carries it), raw text 0.
double share_of_words_marked_by_sentencepiece(const std::string& path, int lines = 1000) {
  std::ifstream text(path, std::ios::binary);
  int64_t words = 0, marked = 0;
  std::string line;
  for (int read = 0; read < lines && std::getline(text, line); ++read) {
    std::istringstream fields(line);
    for (std::string word; fields >> word;) {
      ++words;
      marked += word.rfind("\xE2\x96\x81", 0) == 0 ? 1 : 0;
    }
  }
  return words == 0 ? 0.0 : static_cast<double>(marked) / static_cast<double>(words);
}

// Said before the work: text encoded by SentencePiece already is encoded again, its
// pieces of pieces learnt as a vocabulary, and the model trained on it translates into
// pieces (a helper's trial: spm_encode's output went through without a word, exit 0).
void warn_of_text_encoded_already(const ParallelFiles& files, std::ostream& log) {
  for (const std::string& path : {files.source_path, files.target_path}) {
    const double share = share_of_words_marked_by_sentencepiece(path);
    if (share < 0.5) continue;
    log << "warning: " << path << " looks encoded by SentencePiece already ("
        << static_cast<int>(std::lround(100 * share)) << "% of the words of its first lines "
        << "begin with U+2581, SentencePiece's '\xE2\x96\x81'): transformer_preprocess "
        << "encodes the raw text itself, and a model trained on pieces of pieces translates "
        << "into them; give it the text before spm_encode (spm_decode restores it)" << std::endl;
  }
}

ParallelFiles check_parallel(const std::string& split, const std::string& prefix,
                             const PreprocessOptions& options, ProgressListener& progress) {
  ParallelFiles files;
  files.source_path = prefix + "." + options.source_lang;
  files.target_path = prefix + "." + options.target_lang;
  // A prefix given with a language ("--trainpref txt/train.en") reads txt/train.en.en: said
  // with the prefix meant (before: "txt/train.en.en: no such file" alone; a helper's trial).
  for (const std::string* language : {&options.source_lang, &options.target_lang}) {
    const std::string suffix = "." + *language;
    std::error_code error;
    if (prefix.size() > suffix.size() &&
        prefix.compare(prefix.size() - suffix.size(), suffix.size(), suffix) == 0 &&
        !fs::exists(files.source_path, error)) {
      const std::string meant = prefix.substr(0, prefix.size() - suffix.size());
      THPC_FAIL("--" << split << "pref " << prefix << ": no file " << files.source_path
                     << "; the prefix is the files' name without the language: --" << split
                     << "pref " << meant << " reads " << meant << "." << options.source_lang
                     << " and " << meant << "." << options.target_lang);
    }
  }
  progress.begin(split, "lines read", ProgressListener::kUnknownTotal);
  const int64_t source_lines =
      count_lines(files.source_path, progress, &files.lines_too_long_for_training);
  const int64_t target_lines =
      count_lines(files.target_path, progress, &files.lines_too_long_for_training);
  progress.end();
  if (source_lines != target_lines) {
    THPC_FAIL(files.source_path << " has " << source_lines << " lines but " << files.target_path
                                << " has " << target_lines << " (the files must be line-aligned)");
  }
  files.pairs = source_lines;
  return files;
}

// The most threads SentencePiece's trainer accepts (its trainer_interface.cc).
constexpr int kSentencePieceMaxThreads = 128;

int hardware_threads(int requested) {
  if (requested > 0) return requested;
  return cores_this_process_may_use();
}

// `wanted` of the `total` lines of `paths` (read in turn), for SentencePiece to train on,
// chosen with `seed` by selection sampling (Knuth, TAOCP vol. 2, 3.4.2, Algorithm S):
// line i is taken with probability (wanted - taken) / (total - i), so exactly `wanted`
// lines come out, in file order, every such set equally likely, in one pass that keeps
// nothing but the current line. SentencePiece's own sampling (its input_sentence_size
// with shuffle_input_sentence) would hold the same number of lines, but draws them with
// a seed fixed inside SentencePiece (12345678, trainer_interface.cc): --seed would not
// choose the sample. Lines go out as SentencePiece's file reader gives them (std::getline,
// nothing removed); a drawn line longer than `longest` bytes counts as drawn but is left
// out (the sample is the same with or without such lines).
class SampledLines final : public sentencepiece::SentenceIterator {
 public:
  SampledLines(std::vector<std::string> paths, int64_t total, int64_t wanted, uint64_t seed,
               size_t longest)
      : paths_(std::move(paths)), total_(total), wanted_(wanted), longest_(longest),
        generator_(seed) {
    Next();
  }

  bool done() const override { return done_; }
  const std::string& value() const override { return line_; }
  sentencepiece::util::Status status() const override { return status_; }
  // Lines given to SentencePiece, and those drawn but left out for their length.
  int64_t given() const { return taken_ - left_out_; }
  int64_t left_out() const { return left_out_; }

  void Next() override {
    while (taken_ < wanted_ && seen_ < total_) {
      if (!stream_.is_open() || !std::getline(stream_, line_)) {
        if (!open_next()) break;
        continue;
      }
      // std::mt19937_64's sequence is fixed by the C++ standard: the same sample on every
      // platform. The modulo's bias is below total / 2^64.
      const uint64_t left = static_cast<uint64_t>(total_ - seen_++);
      if (generator_() % left < static_cast<uint64_t>(wanted_ - taken_)) {
        ++taken_;
        if (line_.size() <= longest_) return;
        ++left_out_;
      }
    }
    done_ = true;
  }

 private:
  bool open_next() {
    stream_.close();
    if (next_path_ == paths_.size()) {
      if (seen_ < total_) {
        status_ = sentencepiece::util::Status(
            sentencepiece::util::StatusCode::kDataLoss,
            paths_.back() + ": fewer lines than when it was counted (changed while being read?)");
      }
      return false;
    }
    stream_.clear();
    stream_.open(paths_[next_path_], std::ios::binary);
    if (!stream_) {
      status_ = sentencepiece::util::Status(sentencepiece::util::StatusCode::kNotFound,
                                            paths_[next_path_] + ": cannot open");
      return false;
    }
    ++next_path_;
    return true;
  }

  std::vector<std::string> paths_;
  size_t next_path_ = 0;
  int64_t total_, wanted_, seen_ = 0, taken_ = 0, left_out_ = 0;
  size_t longest_;
  std::mt19937_64 generator_;
  std::ifstream stream_;
  std::string line_;
  bool done_ = false;
  sentencepiece::util::Status status_;
};

// Which training text a SentencePiece model is trained on: both languages' (one shared
// vocabulary, §5.1), or one side's (separate vocabularies, --source-vocab-size).
enum class TextSides { kBoth, kSource, kTarget };

// The serialized SentencePiece model trained on the training text of `sides`. Adds to the
// summary's training_lines and spm_lines.
std::string train_sentencepiece_model(const PreprocessOptions& options,
                                      const ParallelFiles& train, PreprocessSummary* summary,
                                      TextSides sides = TextSides::kBoth) {
  const int vocab_size =
      sides == TextSides::kSource ? options.source_vocab_size : options.vocab_size;
  const char* size_option = sides == TextSides::kSource ? "--source-vocab-size" : "--vocab-size";
  std::vector<std::string> paths;
  if (sides != TextSides::kTarget) paths.push_back(train.source_path);
  if (sides != TextSides::kSource) paths.push_back(train.target_path);
  std::unordered_map<std::string, std::string> arguments = {
      {"model_type", options.model_type},
      {"vocab_size", std::to_string(vocab_size)},
      // Our id convention (batch.h): pad 0, unk 1, bos 2, eos 3.
      {"pad_id", "0"},
      {"unk_id", "1"},
      {"bos_id", "2"},
      {"eos_id", "3"},
      {"character_coverage", "1.0"},
      // A small corpus may not support the requested size: take what it supports.
      {"hard_vocab_limit", "false"},
      {"input_sentence_size", std::to_string(options.spm_sentences)},
      // With the sample drawn here, SentencePiece gets no more lines than this size and
      // keeps them all; kept as it was so that the model's recorded trainer_spec is too.
      {"shuffle_input_sentence", "true"},
      {"max_sentence_length", std::to_string(kSentencePieceLongestLine)},
      // SentencePiece's trainer refuses more than 128 threads, which a node's cores (0 =
      // all) may exceed; the encoding below uses them all.
      {"num_threads", std::to_string(std::min(kSentencePieceMaxThreads,
                                              hardware_threads(options.threads)))},
      // Its errors only, which come with a failure. Its ~65 lines of progress (LOG(INFO))
      // on every run buried this program's own summary. Its warnings are noise here: "Too
      // many sentences are loaded!" past a million lines, which the default --spm-sentences
      // allows (WMT's 9M), advises its own flags, not --spm-sentences, and the summary says
      // how many lines it trained on; a line too long for it never reaches it.
      {"minloglevel", "2"},
  };
  if (!options.user_symbols.empty()) {
    // SentencePiece sees a word as "▁word": the symbol must carry that marker to match a
    // whole word (and only a whole word).
    std::string symbols;
    std::istringstream list(options.user_symbols);
    for (std::string symbol; std::getline(list, symbol, ',');) {
      if (symbol.empty()) THPC_FAIL("--user-symbols: an empty symbol in '" << options.user_symbols << "'");
      symbols += (symbols.empty() ? "" : ",") + std::string("\xe2\x96\x81") + symbol;
    }
    arguments["user_defined_symbols"] = symbols;
  }
  const int64_t lines = static_cast<int64_t>(paths.size()) * train.pairs;
  summary->training_lines += lines;
  std::string model;
  sentencepiece::util::Status status;
  // SentencePiece's `input` is a comma-separated list: a path with a comma in it named
  // other files (trained on them, or "Not found"). Those lines go through the sample,
  // which then takes every line. One side's text goes through it too (its long lines
  // are counted for both sides together).
  const bool listable = train.source_path.find(',') == std::string::npos &&
                        train.target_path.find(',') == std::string::npos;
  const bool every_line = options.spm_sentences == 0 || lines <= options.spm_sentences;
  if (every_line && listable && train.lines_too_long_for_training == 0 &&
      sides == TextSides::kBoth) {
    // Every line: SentencePiece reads the files itself (and records their names in the
    // model's trainer_spec, as it always did; through the sample, which leaves out lines
    // too long for it, it records none).
    arguments["input"] = train.source_path + "," + train.target_path;
    summary->spm_lines += lines;
    status = sentencepiece::SentencePieceTrainer::Train(arguments, nullptr, &model);
  } else {
    SampledLines sample(paths, lines, every_line ? lines : options.spm_sentences, options.seed,
                        kSentencePieceLongestLine);
    status = sentencepiece::SentencePieceTrainer::Train(arguments, &sample, &model);
    summary->spm_lines += sample.given();
    summary->spm_lines_too_long += sample.left_out();
  }
  if (!status.ok()) {
    // Its one failure a user's option causes, in the user's words: the vocabulary must
    // hold every character of the text (character_coverage 1) and the special ids; the
    // second number of its message is that sum (the smallest size it then accepts).
    const std::string text = status.ToString();
    const std::string too_small = "Vocabulary size is smaller than required_chars. ";
    if (const size_t at = text.find(too_small); at != std::string::npos) {
      std::istringstream counts(text.substr(at + too_small.size()));
      long long given = 0, needed = 0;
      std::string versus;
      if (counts >> given >> versus >> needed && versus == "vs") {
        std::string files;
        for (const std::string& path : paths) files += (files.empty() ? "" : ", ") + path;
        THPC_FAIL(size_option << " " << vocab_size << " is too small for the training "
                  << "text (" << files << "): its "
                  << "distinct characters, each a piece of its own, and the special ids "
                  << "need " << needed << "; give " << size_option << " " << needed
                  << " or more");
      }
    }
    THPC_FAIL(train.source_path << ", " << train.target_path
                                << ": SentencePiece training failed: " << text);
  }
  return model;
}

// Loads a serialized SentencePiece model (`name` says whose) into `processor`; refused
// unless it loads. A model without pad, bos or eos pieces (spm_train's defaults have no
// pad) gets them after its pieces (sentencepiece_vocabulary.h).
void load_sentencepiece_model(const std::string& model, const std::string& name,
                              sentencepiece::SentencePieceProcessor& processor) {
  // SentencePiece's own status reads "Internal: ./src/sentencepiece_processor.cc(232)
  // [model_proto->ParseFromArray(...)]": said in the user's words instead.
  if (!processor.LoadFromSerializedProto(model).ok()) {
    THPC_FAIL(name << ": not a SentencePiece model (give the .model file that spm_train or "
                   << "an earlier transformer_preprocess wrote, or a checkpoint, which stores "
                   << "its run's)");
  }
  try {
    vocabulary_of(processor);
  } catch (const Error& error) {
    THPC_FAIL(name << ": " << error.what());
  }
}

// The longest side, in bytes, that is encoded: a longer one is counted too long without
// it. Encoding a line takes SentencePiece ~85 bytes of memory a byte (a 100 MB line, 8 GB,
// then dropped by --max-len). A piece of a model this program trains is at most 16
// characters (SentencePiece's max_sentencepiece_length) of at most 4 bytes, so such a side
// rarely fits in --max-len pieces: only through what normalization removes (runs of
// spaces), a run of unknown characters (one unk piece), --user-symbols, or an --spm-model
// trained with longer pieces. 64 KiB at the least, SentencePiece's training limit here.
size_t longest_encoded_side(int max_len) {
  return std::max<size_t>(kSentencePieceLongestLine, 64 * static_cast<size_t>(max_len));
}

// Encodes lines[0, count) into ids[0, count) on all cores, each thread a contiguous
// range; `first_line` (0-based) numbers them in the file for a failure's message. A line
// longer than `longest` bytes is not encoded (its ids are left empty).
void encode_lines(const sentencepiece::SentencePieceProcessor& processor,
                  const std::vector<std::string>& lines, size_t count, const std::string& path,
                  int64_t first_line, int threads, size_t longest,
                  std::vector<std::vector<int>>* ids, ProgressListener& progress) {
  std::vector<std::string> failures(static_cast<size_t>(threads));
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      const size_t begin = count * t / threads;
      const size_t end = count * (t + 1) / threads;
      for (size_t i = begin; i < end; ++i) {
        if (lines[i].size() > longest) {
          (*ids)[i].clear();
        } else if (const auto status = processor.Encode(lines[i], &(*ids)[i]); !status.ok()) {
          failures[t] = path + ":" + std::to_string(first_line + static_cast<int64_t>(i) + 1) +
                        ": " + status.ToString();
          return;
        }
        if ((i + 1 - begin) % kProgressBlock == 0) progress.advance(kProgressBlock);
      }
      progress.advance(static_cast<int64_t>(end - begin) % kProgressBlock);
    });
  }
  for (std::thread& worker : workers) worker.join();
  for (const std::string& failure : failures) {
    if (!failure.empty()) THPC_FAIL(failure);
  }
}

static_assert(sizeof(int) == sizeof(int32_t), "SentencePiece's ids are the shards' int32");

// `count` int32 values from `file`, a scratch file at `path`, or an error naming it.
void read_int32s(std::ifstream& file, const std::string& path, int32_t* values, size_t count) {
  if (count == 0) return;
  file.read(reinterpret_cast<char*>(values), static_cast<std::streamsize>(count * sizeof(int32_t)));
  if (!file) THPC_FAIL(path << ": the encoded text ends early (removed or truncated?)");
}

// One side of a split's kept pairs on disk while the split is encoded: each sentence's
// length and its ids (int32, native order), in two scratch files removed with it. Where
// every `run`-th sentence's ids start is kept, so that a run's place in the tokens file
// is known without reading the lengths before it.
class SpilledColumn {
 public:
  SpilledColumn(const std::string& prefix, int64_t run)
      : lengths_path_(made_anew(prefix + ".lengths.partial")),
        tokens_path_(made_anew(prefix + ".tokens.partial")),
        lengths_interrupted_(lengths_path_), tokens_interrupted_(tokens_path_),
        lengths_(lengths_path_, std::ios::binary | std::ios::trunc),
        tokens_(tokens_path_, std::ios::binary | std::ios::trunc), run_(run) {
    if (!lengths_ || !tokens_) THPC_FAIL(prefix << ".*.partial: cannot create a scratch file");
  }
  SpilledColumn(const SpilledColumn&) = delete;
  SpilledColumn& operator=(const SpilledColumn&) = delete;
  ~SpilledColumn() {
    lengths_.close();
    tokens_.close();
    std::error_code ignored;
    fs::remove(lengths_path_, ignored);
    fs::remove(tokens_path_, ignored);
  }

  void append(const std::vector<int>& sentence) {
    if (sentences_ % run_ == 0) run_starts_.push_back(token_count_);
    ++sentences_;
    token_count_ += static_cast<int64_t>(sentence.size());
    const int32_t length = static_cast<int32_t>(sentence.size());
    lengths_.write(reinterpret_cast<const char*>(&length), sizeof length);
    tokens_.write(reinterpret_cast<const char*>(sentence.data()),
                  static_cast<std::streamsize>(sentence.size() * sizeof(int32_t)));
    if (!lengths_ || !tokens_) fail();
    digest_.update(&length, sizeof length);
    digest_.update(sentence.data(), sentence.size() * sizeof(int32_t));
  }

  // The sha256 of the lengths and ids appended (each sentence's length, then its ids),
  // once, after the last append.
  std::string hex_digest() { return digest_.hex_digest(); }

  // After the last append: the files complete on disk, or an error naming them.
  void finish() {
    lengths_.close();
    tokens_.close();
    if (lengths_.fail() || tokens_.fail()) fail();
  }

  const std::string& lengths_path() const { return lengths_path_; }
  const std::string& tokens_path() const { return tokens_path_; }

  // Where sentence `sentence`'s ids start in the tokens file (the end of the file for
  // the count of sentences): the start of its run, plus the lengths before it in the run,
  // read from `lengths` (a stream of the lengths file, left anywhere).
  int64_t first_token(int64_t sentence, std::ifstream& lengths) const {
    if (sentence == sentences_) return token_count_;
    const int64_t run_begin = sentence / run_ * run_;
    int64_t token = run_starts_[static_cast<size_t>(sentence / run_)];
    std::vector<int32_t> before(static_cast<size_t>(sentence - run_begin));
    if (!before.empty()) {
      lengths.clear();
      lengths.seekg(static_cast<std::streamoff>(run_begin * sizeof(int32_t)));
      read_int32s(lengths, lengths_path_, before.data(), before.size());
    }
    for (const int32_t length : before) token += length;
    return token;
  }

 private:
  [[noreturn]] void fail() const {
    THPC_FAIL(tokens_path_ << ": cannot write the encoded text (disk full?)");
  }

  std::string lengths_path_, tokens_path_;
  RemovedWhenInterrupted lengths_interrupted_, tokens_interrupted_;  // before the files
  std::ofstream lengths_, tokens_;
  int64_t run_, sentences_ = 0, token_count_ = 0;
  std::vector<int64_t> run_starts_;  // the first token of sentences 0, run, 2 run, ...
  Sha256 digest_;
};

// Sentences [begin, end) of a split's kept pairs.
struct PairRange {
  int64_t begin = 0, end = 0;
};

// The pairs that shard `shard` of `shards` holds, in the input's order: runs of `run`
// pairs dealt round by round, run k to shard k mod shards; then shard s's slice of what
// the last full round left, [rest * s / shards, rest * (s + 1) / shards) of it. One
// shard: every pair, as one range.
std::vector<PairRange> dealt_pairs(int64_t kept, int shards, int shard, int64_t run) {
  const int64_t round = run * shards;
  const int64_t rounds = kept / round;
  std::vector<PairRange> ranges;
  const auto add = [&](int64_t begin, int64_t end) {
    if (begin == end) return;
    if (!ranges.empty() && ranges.back().end == begin) {
      ranges.back().end = end;
    } else {
      ranges.push_back({begin, end});
    }
  };
  for (int64_t r = 0; r < rounds; ++r) add(r * round + shard * run, r * round + (shard + 1) * run);
  const int64_t rest = kept - rounds * round;
  add(rounds * round + rest * shard / shards, rounds * round + rest * (shard + 1) / shards);
  return ranges;
}

// The sentences of some PairRanges of a SpilledColumn, in order, as one side of a shard,
// `block` sentences at a time (a block may span ranges).
class SpilledRange final : public ShardColumnSource {
 public:
  SpilledRange(const SpilledColumn& column, const std::vector<PairRange>& ranges, int64_t block)
      : lengths_path_(column.lengths_path()), tokens_path_(column.tokens_path()),
        lengths_file_(lengths_path_, std::ios::binary), tokens_file_(tokens_path_, std::ios::binary),
        block_(block) {
    if (!lengths_file_ || !tokens_file_) THPC_FAIL(tokens_path_ << ": cannot open the encoded text");
    for (const PairRange& range : ranges) {
      const int64_t first = column.first_token(range.begin, lengths_file_);
      const int64_t end = column.first_token(range.end, lengths_file_);
      ranges_.push_back({range, first});
      sentences_ += range.end - range.begin;
      tokens_ += end - first;
    }
    rewind();
  }

  int64_t sentences() const override { return sentences_; }
  int64_t tokens() const override { return tokens_; }

  void rewind() override {
    start_range(0);
    tokens_range_ = ranges_.size();  // the first piece moves the tokens file
  }

  // The lengths first, a range's piece at a time, then the tokens into a buffer sized once
  // (grown piece by piece, its capacity could reach twice a block's tokens).
  const TokenColumn& next_block() override {
    current_.offsets.assign(1, 0);
    pieces_.clear();
    std::vector<int32_t>& lengths = lengths_buffer_;
    while (static_cast<int64_t>(current_.offsets.size()) - 1 < block_ && range_ < ranges_.size()) {
      const int64_t wanted = block_ - (static_cast<int64_t>(current_.offsets.size()) - 1);
      const int64_t count = std::min(wanted, ranges_[range_].pairs.end - next_);
      lengths.resize(static_cast<size_t>(count));
      read_int32s(lengths_file_, lengths_path_, lengths.data(), lengths.size());
      const int64_t first = current_.offsets.back();
      for (const int32_t length : lengths) {
        current_.offsets.push_back(current_.offsets.back() + length);
      }
      pieces_.push_back({range_, current_.offsets.back() - first});
      next_ += count;
      if (next_ == ranges_[range_].pairs.end) start_range(range_ + 1);
    }
    current_.tokens.resize(static_cast<size_t>(current_.offsets.back()));
    int32_t* tokens = current_.tokens.data();
    for (const Piece& piece : pieces_) {
      // The tokens file follows the lengths a range behind: it moves at a range's start.
      if (piece.range != tokens_range_) {
        tokens_range_ = piece.range;
        tokens_file_.clear();
        tokens_file_.seekg(
            static_cast<std::streamoff>(ranges_[piece.range].first_token * sizeof(int32_t)));
      }
      read_int32s(tokens_file_, tokens_path_, tokens, static_cast<size_t>(piece.tokens));
      tokens += piece.tokens;
    }
    return current_;
  }

 private:
  struct PlacedRange {
    PairRange pairs;
    int64_t first_token;  // where pairs.begin's ids start in the tokens file
  };
  struct Piece {  // a block's sentences from one range
    size_t range;
    int64_t tokens;
  };

  // The lengths file at the start of range `range` (none left when it is the count).
  void start_range(size_t range) {
    range_ = range;
    if (range_ == ranges_.size()) return;
    next_ = ranges_[range_].pairs.begin;
    lengths_file_.clear();
    lengths_file_.seekg(static_cast<std::streamoff>(next_ * sizeof(int32_t)));
  }

  std::string lengths_path_, tokens_path_;
  std::ifstream lengths_file_, tokens_file_;
  int64_t block_, sentences_ = 0, tokens_ = 0, next_ = 0;
  std::vector<PlacedRange> ranges_;
  size_t range_ = 0, tokens_range_ = 0;
  std::vector<Piece> pieces_;
  std::vector<int32_t> lengths_buffer_;
  TokenColumn current_;
};

enum class Filter { LengthOnly, LengthAndRatio };

// The most pieces a side of a split's pairs may have, and the option that says it:
// --max-len for the training pairs (filtered by length and ratio), --valid-max-len for
// the validation and test ones (by length only).
int length_limit(const PreprocessOptions& options, Filter filter) {
  return filter == Filter::LengthAndRatio ? options.max_len : options.valid_max_len;
}
const char* length_option(Filter filter) {
  return filter == Filter::LengthAndRatio ? "--max-len" : "--valid-max-len";
}

// Reads a split's pairs a block at a time, encodes each block on all cores and appends
// the pairs that survive the filters to `source` and `target`, counting each kind of drop.
void encode_and_filter(const sentencepiece::SentencePieceProcessor& source_processor,
                       const sentencepiece::SentencePieceProcessor& processor,
                       const std::string& split, const ParallelFiles& files,
                       const PreprocessOptions& options, Filter filter, SplitCounts* counts,
                       SpilledColumn* source, SpilledColumn* target, ProgressListener& progress) {
  const int threads = hardware_threads(options.threads);
  const size_t block = static_cast<size_t>(options.pairs_per_block);
  progress.begin(split, "lines encoded", 2 * files.pairs);
  LineReader source_text(files.source_path), target_text(files.target_path);
  // Reused from block to block: their strings and vectors keep their capacity.
  std::vector<std::string> source_lines(block), target_lines(block);
  std::vector<std::vector<int>> source_ids(block), target_ids(block);
  const int max_len = length_limit(options, filter);
  const size_t longest = longest_encoded_side(max_len);
  for (int64_t first = 0;;) {
    size_t count = 0, bytes = 0;
    bool ended = false;
    while (count < block && bytes < static_cast<size_t>(options.bytes_per_block)) {
      if (!source_text.next(&source_lines[count]) || !target_text.next(&target_lines[count])) {
        ended = true;
        break;
      }
      bytes += source_lines[count].size() + target_lines[count].size();
      ++count;
    }
    if (ended && (source_text.lines() != files.pairs || target_text.lines() != files.pairs)) {
      THPC_FAIL(files.source_path << " and " << files.target_path << " now have "
                                  << source_text.lines() << " and " << target_text.lines()
                                  << " lines or more, " << files.pairs
                                  << " when counted (changed while being read)");
    }
    if (count == 0) break;
    encode_lines(source_processor, source_lines, count, files.source_path, first, threads,
                 longest, &source_ids, progress);
    encode_lines(processor, target_lines, count, files.target_path, first, threads, longest,
                 &target_ids, progress);
    for (size_t i = 0; i < count; ++i) {
      const std::vector<int>& src = source_ids[i];
      const std::vector<int>& tgt = target_ids[i];
      // A side not encoded (over `longest` bytes) counts as one piece over the limit.
      const auto pieces = [&](const std::vector<int>& ids, const std::string& line) {
        return line.size() > longest ? static_cast<double>(max_len) + 1
                                     : static_cast<double>(ids.size());
      };
      const double source_pieces = pieces(src, source_lines[i]);
      const double target_pieces = pieces(tgt, target_lines[i]);
      const double shorter = std::min(source_pieces, target_pieces);
      const double longer = std::max(source_pieces, target_pieces);
      if (shorter == 0) {
        ++counts->empty;
      } else if (longer > max_len) {
        ++counts->too_long;
      } else if (filter == Filter::LengthAndRatio && longer > options.max_ratio * shorter) {
        ++counts->over_ratio;
      } else {
        source->append(src);
        target->append(tgt);
        ++counts->kept;
      }
    }
    counts->read += static_cast<int64_t>(count);
    first += static_cast<int64_t>(count);
    if (ended) break;
  }
  progress.end();
}

// Files written under temporary names, renamed into place by rename_into_place(), removed if the
// run fails before that.
class PendingOutputs {
 public:
  ~PendingOutputs() {
    std::error_code ignored;
    for (const auto& [temporary, final_path] : files_) fs::remove(temporary, ignored);
  }
  std::string add(const std::string& final_path) {
    const std::string temporary = made_anew(final_path + ".partial");
    files_.emplace_back(temporary, final_path);
    interrupted_.push_back(std::make_unique<RemovedWhenInterrupted>(temporary));
    return temporary;
  }
  // Every file synced before the first rename (as every writer of the project does: a
  // crash could leave a renamed shard empty). The slow part, and interruptible: an
  // interrupt until it ends removes the temporaries and leaves the directory as it was.
  void sync() const {
    for (const auto& [temporary, final_path] : files_) fsync_path(temporary, final_path);
  }
  // Renamed into place (over the files of those names), then their directories synced.
  // THPC_TEST_RENAME_DELAY_MS=N says "test hook: renaming into place" on standard error
  // and waits N ms before each rename: the tests' way into the section an interrupt must
  // wait for, with a line to wait for rather than a time.
  void rename_into_place() {
    const char* delay = std::getenv("THPC_TEST_RENAME_DELAY_MS");
    if (delay != nullptr) std::cerr << "test hook: renaming into place" << std::endl;
    std::error_code error;
    for (const auto& [temporary, final_path] : files_) {
      if (delay != nullptr) {
        std::this_thread::sleep_for(std::chrono::milliseconds(std::strtol(delay, nullptr, 10)));
      }
      // (a corpus made private, chmod 600, came back 0644)
      keep_permissions_of(final_path, temporary);
      fs::rename(temporary, final_path, error);
      if (error) {
        // The new shards renamed so far, beside earlier ones, are a set the trainer
        // refuses as mixed or incomplete (their shard_count, corpus and model).
        THPC_FAIL("cannot write " << final_path << ": rename of " << temporary << ": "
                                  << error.message() << " (the corpus in its directory is "
                                  << "incomplete: run transformer_preprocess again)");
      }
    }
    std::set<std::string> directories;
    for (const auto& [temporary, final_path] : files_) {
      const fs::path directory = fs::path(final_path).parent_path();
      directories.insert(directory.empty() ? "." : directory.string());
    }
    for (const std::string& directory : directories) fsync_path(directory, directory);
    files_.clear();
    interrupted_.clear();
  }
  // The paths the files get.
  std::set<std::string> final_paths() const {
    std::set<std::string> paths;
    for (const auto& [temporary, final_path] : files_) paths.insert(final_path);
    return paths;
  }

 private:
  std::vector<std::pair<std::string, std::string>> files_;
  std::vector<std::unique_ptr<RemovedWhenInterrupted>> interrupted_;
};

std::string shard_path(const std::string& dest_dir, const std::string& split, int index) {
  return (fs::path(dest_dir) / shard_file_name(split, index)).string();
}

// Whether `name` is a shard's: SPLIT.NNNNN.h5 of the train, valid or test split. A run's
// own replace those of an earlier run in --destdir, and it removes the rest: shards of an
// earlier run that this run's numbering would not overwrite would be read as part of the
// new corpus.
bool is_shard_name(const std::string& name) {
  for (const std::string split : {"train", "valid", "test"}) {
    if (is_shard_file_name(name, split)) return true;
  }
  return false;
}

// Whether a run writes, replaces or removes the file `name` in --destdir: a shard,
// spm.model, either under its temporary name (PendingOutputs), or a scratch file.
bool written_by_preprocessing(std::string name) {
  const std::string partial = ".partial";
  if (name.size() > partial.size() &&
      name.compare(name.size() - partial.size(), partial.size(), partial) == 0) {
    name.resize(name.size() - partial.size());
  }
  if (name == "spm.model" || name == kSourceSpmModelFile || is_shard_name(name)) return true;
  // The scratch files of a split (SpilledColumn): SPLIT.{src,tgt}.{lengths,tokens}.partial.
  for (const std::string split : {"train", "valid", "test"}) {
    for (const std::string side : {".src", ".tgt"}) {
      for (const std::string kind : {".lengths", ".tokens"}) {
        if (name == split + side + kind) return true;
      }
    }
  }
  return false;
}

// The shards an earlier run left in `dest_dir` (names, sorted; check_destdir_holds_only_shards
// made sure that they are shards).
std::vector<std::string> earlier_shards(const std::string& dest_dir) {
  std::error_code error;
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(dest_dir, error)) {
    const std::string name = entry.path().filename().string();
    if (is_shard_name(name)) names.push_back(name);
  }
  std::sort(names.begin(), names.end());
  return names;
}

// Removes those of `earlier` this run did not write over (a test split this run lacks,
// train shards beyond its --shards: they would be read as part of the new corpus).
void remove_shards_not_written(const std::string& dest_dir,
                               const std::vector<std::string>& earlier,
                               const std::set<std::string>& written) {
  std::error_code error;
  for (const std::string& name : earlier) {
    const std::string path = (fs::path(dest_dir) / name).string();
    if (written.count(path) == 0) fs::remove(path, error);
  }
}

// Refuses a file in --destdir under a name the run removes or replaces (a shard's,
// spm.model) that is not what such a name holds: the run would delete it unread (before:
// a checkpoint copied there as train.00007.h5 went without a word).
// A training run's directory (its checkpoints, lock or metrics) is refused outright: a
// corpus written among them is one `checkpoint.overwrite` may delete (a trial took a
// run's checkpoint directory as --destdir, and the shards went in beside step_*.h5).
void check_destdir_holds_only_shards(const PreprocessOptions& options) {
  std::error_code error;
  for (const fs::directory_entry& entry : fs::directory_iterator(options.dest_dir, error)) {
    const std::string name = entry.path().filename().string();
    if (is_training_run_file(name)) {
      THPC_FAIL("--destdir " << options.dest_dir << " is a training run's directory (it holds "
                << name << "): give the corpus a directory of its own");
    }
    const bool shard = is_shard_name(name);
    if (!shard && name != "spm.model" && name != kSourceSpmModelFile) continue;
    std::string wrong;
    if (!entry.is_regular_file(error)) {
      wrong = "not a file";
    } else if (shard) {
      try {
        read_shard_summary(entry.path().string());
      } catch (const Error& e) {
        wrong = e.what();
      }
    } else {
      sentencepiece::SentencePieceProcessor model;
      if (!model.Load(entry.path().string()).ok()) wrong = "not a SentencePiece model";
    }
    if (!wrong.empty()) {
      THPC_FAIL("--destdir " << options.dest_dir << " holds " << entry.path().string()
                << ", which this run would " << (shard ? "remove or replace" : "replace")
                << " but is not " << (shard ? "a shard" : "a SentencePiece model") << " ("
                << wrong << "): move it out of --destdir (delete it if it is a damaged "
                << "output of an earlier run), or give another --destdir");
    }
    // A corpus protected with chmod a-w was removed and written anew, exit 0.
    if (const std::string why = why_write_protected(entry.path().string()); !why.empty()) {
      THPC_FAIL("--destdir " << options.dest_dir << " holds " << entry.path().string()
                << ", which this run would " << (shard ? "remove or replace" : "replace")
                << ", but it " << why << "; or give another --destdir");
    }
  }
}

// Refuses an input that the run would write over or remove in --destdir, however its
// path is spelt: a symbolic or hard link to a shard counts, as does --spm-model
// DEST/spm.model.
void check_inputs_survive(const PreprocessOptions& options) {
  std::vector<std::pair<std::string, std::string>> inputs = {
      {"--spm-model", options.spm_model}, {"--source-spm-model", options.source_spm_model}};
  for (const auto& [option, prefix] : {std::pair{"--trainpref", options.train_prefix},
                                       std::pair{"--validpref", options.valid_prefix},
                                       std::pair{"--testpref", options.test_prefix}}) {
    if (prefix.empty()) continue;
    for (const std::string* language : {&options.source_lang, &options.target_lang}) {
      inputs.emplace_back(option, prefix + "." + *language);
    }
  }
  std::error_code error;
  std::vector<std::string> targets;  // what the run replaces or removes, as it is now
  for (const fs::directory_entry& entry : fs::directory_iterator(options.dest_dir, error)) {
    if (written_by_preprocessing(entry.path().filename().string())) {
      targets.push_back(entry.path().string());
    }
  }
  for (const auto& [option, input] : inputs) {
    if (input.empty()) continue;
    // An input under a name the run writes in --destdir, spelt any way.
    bool targeted = written_by_preprocessing(fs::path(input).filename().string()) &&
                    same_file(fs::path(input).parent_path().empty()
                                  ? std::string(".")
                                  : fs::path(input).parent_path().string(),
                              options.dest_dir.empty() ? std::string(".") : options.dest_dir);
    for (const std::string& target : targets) targeted = targeted || same_file(input, target);
    if (targeted) {
      THPC_FAIL(option << ": " << input << " is a file this run writes or removes in --destdir "
                       << options.dest_dir << " (its shards and spm.model): it would be lost; "
                       << "give another --destdir, or move the input out of it");
    }
  }
}

// More shards than pairs would write empty shards, one HDF5 file each (--shards 100000
// wrote for minutes): every shard must hold a pair. `what` says which pairs were counted.
// `read`: counted from the lines, before the filters drop any (a bound the kept pairs may
// not reach: "give at most 3" then failed as more than the 2 kept; a helper's trial).
void check_every_shard_holds_a_pair(int shards, int64_t pairs, const std::string& what,
                                    bool read = false) {
  if (shards > pairs) {
    THPC_FAIL("--shards " << shards << " is more than the " << pairs << " " << what
                          << ": give at most " << pairs
                          << (read ? ", fewer where pairs are dropped (empty, too long, over "
                                     "ratio)"
                                   : "")
                          << " (every shard holds at least one pair)");
  }
}

// Encodes a split into its scratch files, then writes its kept pairs to `shards` shards
// as dealt_pairs deals them (known only once the whole split has been encoded). One
// shard is what the output was when every pair was held at once.
// `source_processor` encodes the source side (the target's `processor` too, with one
// vocabulary).
void preprocess_split(const sentencepiece::SentencePieceProcessor& source_processor,
                      const sentencepiece::SentencePieceProcessor& processor,
                      const std::string& split, const ParallelFiles& files,
                      const PreprocessOptions& options, Filter filter, int shards,
                      const ShardMetadata& metadata, SplitCounts* counts,
                      PendingOutputs& outputs, ProgressListener& progress) {
  const std::string scratch = (fs::path(options.dest_dir) / split).string();
  const int64_t run = options.pairs_dealt_together;
  SpilledColumn source(scratch + ".src", run), target(scratch + ".tgt", run);
  encode_and_filter(source_processor, processor, split, files, options, filter, counts, &source,
                    &target, progress);
  source.finish();
  target.finish();
  const int64_t kept = counts->kept;
  if (kept > 0) check_every_shard_holds_a_pair(shards, kept, split + " pairs kept");
  // Every shard of the split records the split's pairs' digest: the reader tells a shard
  // of another run from this run's by it (ShardNumber).
  const std::string sides = source.hex_digest() + target.hex_digest();
  const std::string split_sha256 = sha256_hex(sides.data(), sides.size());
  for (int shard = 0; shard < shards; ++shard) {
    const std::vector<PairRange> pairs = dealt_pairs(kept, shards, shard, run);
    SpilledRange source_pairs(source, pairs, options.pairs_per_block);
    SpilledRange target_pairs(target, pairs, options.pairs_per_block);
    write_shard_streamed(outputs.add(shard_path(options.dest_dir, split, shard)), metadata,
                         source_pairs, target_pairs, ShardNumber{shard, shards, split_sha256});
  }
}

}  // namespace

std::string describe(const std::string& split, const SplitCounts& counts) {
  std::ostringstream text;
  text << split << ": " << counts.read << " read, " << counts.kept << " kept, "
       << counts.read - counts.kept << " dropped (" << counts.empty << " empty, "
       << counts.too_long << " too long, " << counts.over_ratio << " over ratio)";
  return text.str();
}

void check_preprocess_options(const PreprocessOptions& options) {
  if (options.model_type != "bpe" && options.model_type != "unigram") {
    THPC_FAIL("--model-type must be bpe or unigram, got '" << options.model_type << "'");
  }
  // The files read are PREFIX.SOURCE_LANG and PREFIX.TARGET_LANG: one suffix for both made
  // each pair a line and itself (a copy task, trained without a word).
  if (options.source_lang == options.target_lang) {
    THPC_FAIL("--source-lang and --target-lang are both '"
              << options.source_lang << "': both sides would be read from the same files "
              << "(PREFIX." << options.source_lang << "); give the suffixes of the two "
              << "languages' files");
  }
  if (options.shards < 1) THPC_FAIL("--shards must be >= 1, got " << options.shards);
  // Said here, as a usage error (exit 2): SentencePiece refused a symbol given twice
  // with its own source line ("Internal: ./src/trainer_interface.cc(796) ..."), exit 1.
  if (!options.user_symbols.empty()) {
    const std::string& given = options.user_symbols;
    const auto refuse = [&](const std::string& why) {
      THPC_FAIL("--user-symbols: " << why << " in '" << given << "'");
    };
    std::set<std::string> seen;
    std::istringstream list(given);
    for (std::string symbol; std::getline(list, symbol, ',');) {
      if (symbol.empty()) refuse("an empty symbol (they are separated by one comma)");
      if (!seen.insert(symbol).second) refuse("'" + symbol + "' is given twice");
      // SentencePiece splits the text at whitespace before it looks for a symbol, and its
      // special pieces keep their ids: such a symbol became a piece that never matched, or
      // an ordinary '<pad>' beside the real one (a helper's trial).
      if (symbol.find_first_of(" \t\n\r") != std::string::npos) {
        refuse("'" + symbol + "' holds whitespace, at which the text is split before any "
               "symbol is matched: it would never match");
      }
      for (const char* special : {"<pad>", "<unk>", "<s>", "</s>"}) {
        if (symbol == special) {
          refuse("'" + symbol + "' is one of the special pieces (<pad> <unk> <s> </s>), "
                 "which have their own ids already");
        }
      }
    }
    if (given.back() == ',') refuse("an empty symbol (they are separated by one comma)");
  }
  // Each is a thread started per block: 100,000 of them ended in std::terminate.
  if (options.threads < 0 || options.threads > 1024) {
    THPC_FAIL("--threads must be from 0 (every core, " << hardware_threads(0) << " here) to "
              << "1024, got " << options.threads);
  }
  if (options.max_len < 1) THPC_FAIL("--max-len must be >= 1, got " << options.max_len);
  if (options.valid_max_len < 1) {
    THPC_FAIL("--valid-max-len must be >= 1, got " << options.valid_max_len);
  }
  if (!(options.max_ratio >= 1.0)) {
    THPC_FAIL("--max-ratio must be >= 1, got " << options.max_ratio);
  }
  if (options.vocab_size < 5) {
    THPC_FAIL("--vocab-size must be >= 5 (4 special ids + 1), got " << options.vocab_size);
  }
  if (options.source_vocab_size != 0 && options.source_vocab_size < 5) {
    THPC_FAIL("--source-vocab-size must be 0 (one vocabulary for both languages) or >= 5 "
              << "(4 special ids + 1), got " << options.source_vocab_size);
  }
  if (options.source_vocab_size > 0 && !options.spm_model.empty()) {
    THPC_FAIL("--source-vocab-size trains a source model, --spm-model gives the models: "
              << "give one of them (a checkpoint of separate vocabularies given as "
              << "--spm-model has both; two .model files are --spm-model TARGET "
              << "--source-spm-model SOURCE)");
  }
  if (!options.source_spm_model.empty() &&
      (options.spm_model.empty() || !options.spm_model_of_checkpoint.empty() ||
       !options.source_spm_model_of_checkpoint.empty())) {
    THPC_FAIL("--source-spm-model " << options.source_spm_model << " goes with --spm-model "
              << "FILE, the target's .model (a checkpoint given as --spm-model has its "
              << "models)");
  }
  // SentencePiece refuses an input_sentence_size of 1 to 100.
  if (options.spm_sentences < 0 || (options.spm_sentences > 0 && options.spm_sentences <= 100)) {
    THPC_FAIL("--spm-sentences must be 0 (every line) or more than 100, got "
              << options.spm_sentences);
  }
  THPC_CHECK(options.pairs_per_block >= 1, "pairs_per_block " << options.pairs_per_block);
  THPC_CHECK(options.bytes_per_block >= 1, "bytes_per_block " << options.bytes_per_block);
  THPC_CHECK(options.pairs_dealt_together >= 1,
             "pairs_dealt_together " << options.pairs_dealt_together);
  check_inputs_survive(options);
  check_destdir_holds_only_shards(options);
}

namespace {

// Nothing of a split kept: says which filter took the pairs and what would keep them.
[[noreturn]] void refuse_a_split_without_pairs(const ParallelFiles& files, const char* what,
                                               const SplitCounts& c,
                                               const PreprocessOptions& options, Filter filter) {
  std::ostringstream why;
  std::string limits, suggestion;
  if (c.empty > 0) why << ", " << c.empty << " with an empty side";
  if (c.too_long > 0) {
    why << ", " << c.too_long << " with a side longer than " << length_option(filter) << " "
        << length_limit(options, filter) << " pieces";
    limits = length_option(filter);
  }
  if (c.over_ratio > 0) {
    why << ", " << c.over_ratio << " whose sides' lengths differ by more than --max-ratio "
        << options.max_ratio;
    limits += (limits.empty() ? "" : " or ") + std::string("--max-ratio");
  }
  if (!limits.empty()) suggestion = "raise " + limits;
  if (c.empty > 0) suggestion += suggestion.empty() ? "check the files" : ", or check the files";
  THPC_FAIL(files.source_path << ", " << files.target_path << ": no " << what
                              << " pair survived: of " << c.read << why.str()
                              << (suggestion.empty() ? "" : "; " + suggestion));
}

// The run's outputs into place: spm.model added to the shards, every file synced, then,
// in one section no interrupt stops, everything renamed over an earlier run's files and
// that run's other shards removed; both said after, with a replaced spm.model (a model of
// the user's own there went without a word; the same bytes are no replacement).
void commit_outputs(const PreprocessOptions& options, const ShardMetadata& metadata,
                    PendingOutputs& outputs, std::ostream& log) {
  const std::string& spm_model = metadata.spm_model;
  const std::string model_path = (fs::path(options.dest_dir) / "spm.model").string();
  {
    std::ofstream model_file(outputs.add(model_path), std::ios::binary);
    model_file << spm_model;
    if (!model_file.flush()) THPC_FAIL(model_path << ": cannot write");
  }
  // Separate vocabularies: the source's model beside it. One vocabulary: an earlier run's
  // source model is removed with its shards (it would be taken for this corpus's).
  const std::string source_model_path =
      (fs::path(options.dest_dir) / kSourceSpmModelFile).string();
  if (metadata.separate_vocabularies()) {
    std::ofstream model_file(outputs.add(source_model_path), std::ios::binary);
    model_file << metadata.source_spm_model;
    if (!model_file.flush()) THPC_FAIL(source_model_path << ": cannot write");
  }
  outputs.sync();
  std::error_code no_model;
  const bool replaces_a_model = fs::is_regular_file(model_path, no_model) &&
                                read_input_file(model_path, "spm.model") != spm_model;
  std::vector<std::string> earlier;
  bool removed_source_model = false;
  {
    // The earlier corpus gives way to this one without a stop between: its shards were
    // removed before this run's were renamed into place, and an interrupt there (the
    // syncs of a large corpus took seconds) left neither (a helper's finding). Now every
    // file is synced first, and the renames and the removal of earlier shards this run
    // does not replace are one section that an interrupt waits for. From here a signal's
    // end says what is in place (below), not the tool's "holds what it held before".
    say_when_interrupted("");
    const InterruptionsHeld held;
    earlier = earlier_shards(options.dest_dir);
    const std::set<std::string> written = outputs.final_paths();
    outputs.rename_into_place();
    remove_shards_not_written(options.dest_dir, earlier, written);
    if (!metadata.separate_vocabularies()) {
      std::error_code no_source_model;
      removed_source_model = fs::remove(source_model_path, no_source_model);
    }
    if (const int signal_number = InterruptionsHeld::signal_received(); signal_number != 0) {
      std::cerr << "transformer_preprocess: " << strsignal(signal_number) << " came while the "
                << "corpus was put in place: it is complete in " << options.dest_dir
                << "; stopping now" << std::endl;
    }
  }
  if (!earlier.empty()) {
    log << "removed the " << earlier.size() << " shard" << (earlier.size() > 1 ? "s" : "")
        << " an earlier run left in " << options.dest_dir << " (" << earlier.front()
        << (earlier.size() > 1 ? " ... " + earlier.back() : "")
        << "): this run writes its own" << std::endl;
  }
  if (removed_source_model) {
    log << "removed the " << kSourceSpmModelFile << " an earlier run of separate vocabularies "
        << "left in " << options.dest_dir << ": this run's one vocabulary is spm.model"
        << std::endl;
  }
  if (replaces_a_model) {
    log << "replaced the spm.model an earlier run (or you) left in " << options.dest_dir
        << ": this run writes its own" << std::endl;
  }
}

// What the run did: the vocabulary's size where it fell short of --vocab-size (a model
// trained here, hard_vocab_limit false, stops where the text has no more pieces to merge,
// and the shards, the model and every run's output layer take that size), SentencePiece's
// sample, each split's counts, and what was written where.
void log_summary(const PreprocessOptions& options, const PreprocessSummary& summary,
                 std::ostream& log) {
  if (options.spm_model.empty() && summary.vocab_size < options.vocab_size) {
    log << "note: the vocabulary has " << summary.vocab_size << " pieces, not --vocab-size "
        << options.vocab_size << ": the training text has no more to make" << std::endl;
  }
  if (options.spm_model.empty() && summary.source_vocab_size > 0 &&
      summary.source_vocab_size < options.source_vocab_size) {
    log << "note: the source vocabulary has " << summary.source_vocab_size
        << " pieces, not --source-vocab-size " << options.source_vocab_size
        << ": the source text has no more to make" << std::endl;
  }
  if (summary.spm_lines > 0) {
    const int64_t drawn = summary.spm_lines + summary.spm_lines_too_long;
    log << "SentencePiece trained on " << summary.spm_lines << " of " << summary.training_lines
        << " training lines ("
        << (summary.source_vocab_size > 0 ? "a model for each language" : "both languages")
        << ""
        << (drawn < summary.training_lines
                ? ", a sample drawn with seed " + std::to_string(options.seed)
                : std::string())
        << (summary.spm_lines_too_long > 0
                ? "; " + std::to_string(summary.spm_lines_too_long) + " left out, longer than " +
                      std::to_string(kSentencePieceLongestLine) + " bytes"
                : std::string())
        << ")\n";
  }
  log << describe("train", summary.train) << "\n" << describe("valid", summary.valid) << "\n";
  if (!options.test_prefix.empty()) log << describe("test", summary.test) << "\n";
  const bool separate = summary.source_vocab_size > 0;
  log << "wrote " << options.shards << " train shard" << (options.shards > 1 ? "s" : "")
      << ", valid" << (options.test_prefix.empty() ? "" : ", test") << " and spm.model"
      << (separate ? std::string(" (the target's), ") + kSourceSpmModelFile : std::string())
      << " to " << options.dest_dir << ": "
      << (separate ? "source vocabulary " + std::to_string(summary.source_vocab_size) +
                         ", target vocabulary "
                   : std::string("vocabulary "))
      << summary.vocab_size << ", "
      << summary.train.kept + summary.valid.kept + summary.test.kept << " pairs (of "
      << summary.train.read + summary.valid.read + summary.test.read << " read) in "
      << summary.seconds << " s" << std::endl;
}

}  // namespace

PreprocessSummary preprocess(const PreprocessOptions& options, std::ostream& log,
                             ProgressListener& progress) {
  const auto start = std::chrono::steady_clock::now();
  check_preprocess_options(options);
  // A model given is loaded before the text is read: a bad one was said only after the
  // reading (minutes on WMT14's 4.5 million pairs).
  PreprocessSummary summary;
  ShardMetadata metadata;
  sentencepiece::SentencePieceProcessor processor, source_processor;
  if (!options.source_spm_model_of_checkpoint.empty()) {
    metadata.source_spm_model = options.source_spm_model_of_checkpoint;
    load_sentencepiece_model(metadata.source_spm_model,
                             options.spm_model + "'s source model", source_processor);
    log << "note: --spm-model " << options.spm_model << ": separate vocabularies, the "
        << "source's SentencePiece model stored in the checkpoint too" << std::endl;
  } else if (!options.source_spm_model.empty()) {
    metadata.source_spm_model = read_input_file(options.source_spm_model, "--source-spm-model");
    load_sentencepiece_model(metadata.source_spm_model, options.source_spm_model,
                             source_processor);
  }
  if (!options.spm_model.empty()) {
    // A checkpoint stores its run's model: given one (all a model's recipient may have,
    // who was told to preprocess with the checkpoint's model and had no .model file; a
    // helper's walk), its model is the one used.
    if (!options.spm_model_of_checkpoint.empty()) {
      metadata.spm_model = options.spm_model_of_checkpoint;
      log << "note: --spm-model " << options.spm_model << ": the SentencePiece model stored "
          << "in the checkpoint" << std::endl;
    } else {
      metadata.spm_model = read_input_file(options.spm_model, "--spm-model");
    }
    load_sentencepiece_model(metadata.spm_model, options.spm_model, processor);
    const std::string added = added_specials_text(vocabulary_of(processor));
    if (!added.empty()) log << "note: " << options.spm_model << ": " << added << std::endl;
  }

  const ParallelFiles train = check_parallel("train", options.train_prefix, options, progress);
  warn_of_text_encoded_already(train, log);
  // Known from the line count already, before the encoding (the long part); the pairs that
  // the filters keep are checked again once they are known (preprocess_split).
  check_every_shard_holds_a_pair(options.shards, train.pairs,
                                 "training pairs of " + train.source_path + ", " +
                                     train.target_path,
                                 /*read=*/true);
  const ParallelFiles valid = check_parallel("valid", options.valid_prefix, options, progress);
  ParallelFiles test;
  if (!options.test_prefix.empty()) {
    test = check_parallel("test", options.test_prefix, options, progress);
  }

  std::error_code error;
  fs::create_directories(options.dest_dir, error);
  if (!fs::is_directory(options.dest_dir, error)) {
    THPC_FAIL(options.dest_dir << ": cannot create the output directory");
  }

  if (metadata.spm_model.empty()) {
    const bool separate = options.source_vocab_size > 0;
    if (separate) {
      metadata.source_spm_model =
          train_sentencepiece_model(options, train, &summary, TextSides::kSource);
      load_sentencepiece_model(metadata.source_spm_model, "the trained source model",
                               source_processor);
    }
    metadata.spm_model = train_sentencepiece_model(
        options, train, &summary, separate ? TextSides::kTarget : TextSides::kBoth);
    load_sentencepiece_model(metadata.spm_model, "the trained model", processor);
  }
  const SentencePieceVocabulary vocabulary = vocabulary_of(processor);
  metadata.vocab_size = vocabulary.size;
  metadata.ids = vocabulary.ids;
  if (!metadata.source_spm_model.empty()) {
    const SentencePieceVocabulary source_vocabulary = vocabulary_of(source_processor);
    // Both sides' batches are made with one pad, bos and eos.
    if (source_vocabulary.ids != vocabulary.ids) {
      THPC_FAIL("the source's SentencePiece model has the special ids pad/unk/bos/eos "
                << special_ids_text(source_vocabulary.ids) << ", the target's "
                << special_ids_text(vocabulary.ids) << ": both must have the same");
    }
    metadata.source_vocab_size = source_vocabulary.size;
    metadata.format_version = kShardFormatVersion;
    summary.source_vocab_size = metadata.source_vocab_size;
  }
  const sentencepiece::SentencePieceProcessor& source_side =
      metadata.source_spm_model.empty() ? processor : source_processor;
  metadata.source_lang = options.source_lang;
  metadata.target_lang = options.target_lang;

  summary.vocab_size = metadata.vocab_size;
  PendingOutputs outputs;
  preprocess_split(source_side, processor, "train", train, options, Filter::LengthAndRatio,
                   options.shards, metadata, &summary.train, outputs, progress);
  preprocess_split(source_side, processor, "valid", valid, options, Filter::LengthOnly, 1,
                   metadata, &summary.valid, outputs, progress);
  if (!options.test_prefix.empty()) {
    preprocess_split(source_side, processor, "test", test, options, Filter::LengthOnly, 1,
                     metadata, &summary.test, outputs, progress);
  }
  // Both files named: either side may be the empty or the long one. A test shard of no
  // pairs was refused only where it is read (transformer_data_stats: "the corpus has no
  // sentence pairs"): refused here, as the other splits are.
  if (summary.train.kept == 0) {
    refuse_a_split_without_pairs(train, "training", summary.train, options,
                                 Filter::LengthAndRatio);
  }
  if (summary.valid.kept == 0) {
    refuse_a_split_without_pairs(valid, "validation", summary.valid, options,
                                 Filter::LengthOnly);
  }
  if (!options.test_prefix.empty() && summary.test.kept == 0) {
    refuse_a_split_without_pairs(test, "test", summary.test, options, Filter::LengthOnly);
  }
  commit_outputs(options, metadata, outputs, log);
  summary.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  log_summary(options, summary, log);
  return summary;
}

}  // namespace thpc
