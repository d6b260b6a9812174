#include "data/preprocess.h"

#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <ostream>
#include <sstream>
#include <thread>
#include <unordered_map>
#include <vector>

#include "common/error.h"
#include "data/shard_file.h"

namespace thpc {
namespace {

namespace fs = std::filesystem;

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

std::vector<std::string> read_lines(const std::string& path, ProgressListener& progress) {
  std::error_code error;
  if (!fs::is_regular_file(path, error)) THPC_FAIL(path << ": no such file");
  std::ifstream stream(path, std::ios::binary);
  if (!stream) THPC_FAIL(path << ": cannot open");
  std::vector<std::string> lines;
  std::string line;
  while (std::getline(stream, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    for (size_t at = 0; at < line.size();) {
      const size_t length = utf8_sequence_length(line, at);
      if (length == 0) {
        THPC_FAIL(path << ":" << lines.size() + 1 << ": invalid UTF-8 at byte " << at + 1
                       << " of the line");
      }
      at += length;
    }
    lines.push_back(std::move(line));
    if (lines.size() % kProgressBlock == 0) progress.advance(kProgressBlock);
  }
  progress.advance(static_cast<int64_t>(lines.size()) % kProgressBlock);
  if (lines.empty()) THPC_FAIL(path << ": empty file (expected one sentence per line)");
  return lines;
}

struct ParallelText {
  std::string source_path, target_path;
  std::vector<std::string> source, target;
};

ParallelText read_parallel(const std::string& split, const std::string& prefix,
                           const PreprocessOptions& options, ProgressListener& progress) {
  ParallelText text;
  text.source_path = prefix + "." + options.source_lang;
  text.target_path = prefix + "." + options.target_lang;
  progress.begin(split, "lines read", ProgressListener::kUnknownTotal);
  text.source = read_lines(text.source_path, progress);
  text.target = read_lines(text.target_path, progress);
  progress.end();
  if (text.source.size() != text.target.size()) {
    THPC_FAIL(text.source_path << " has " << text.source.size() << " lines but "
                               << text.target_path << " has " << text.target.size()
                               << " (the files must be line-aligned)");
  }
  return text;
}

int hardware_threads(int requested) {
  if (requested > 0) return requested;
  return std::max(1u, std::thread::hardware_concurrency());
}

// The serialized SentencePiece model: trained on the training text of both languages
// (one shared vocabulary, §5.1), or read from options.spm_model.
std::string sentencepiece_model(const PreprocessOptions& options, const ParallelText& train) {
  if (!options.spm_model.empty()) {
    std::ifstream stream(options.spm_model, std::ios::binary);
    if (!stream) THPC_FAIL(options.spm_model << ": cannot open the SentencePiece model");
    std::ostringstream bytes;
    bytes << stream.rdbuf();
    return bytes.str();
  }
  sentencepiece::SetRandomGeneratorSeed(static_cast<unsigned int>(options.seed));
  std::unordered_map<std::string, std::string> arguments = {
      {"input", train.source_path + "," + train.target_path},
      {"model_type", options.model_type},
      {"vocab_size", std::to_string(options.vocab_size)},
      // Our id convention (batch.h): pad 0, unk 1, bos 2, eos 3.
      {"pad_id", "0"},
      {"unk_id", "1"},
      {"bos_id", "2"},
      {"eos_id", "3"},
      {"character_coverage", "1.0"},
      // A small corpus may not support the requested size: take what it supports.
      {"hard_vocab_limit", "false"},
      {"input_sentence_size", std::to_string(options.spm_sentences)},
      {"shuffle_input_sentence", "true"},  // sampled with the seed set above
      {"max_sentence_length", "65536"},
      {"num_threads", std::to_string(hardware_threads(options.threads))},
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
  std::string model;
  const auto status = sentencepiece::SentencePieceTrainer::Train(arguments, nullptr, &model);
  if (!status.ok()) {
    THPC_FAIL(train.source_path << ", " << train.target_path
                                << ": SentencePiece training failed: " << status.ToString());
  }
  return model;
}

// Encodes every line on all cores; each thread takes a contiguous block of lines.
std::vector<std::vector<int>> encode_lines(const sentencepiece::SentencePieceProcessor& processor,
                                           const std::vector<std::string>& lines,
                                           const std::string& path, int threads,
                                           ProgressListener& progress) {
  std::vector<std::vector<int>> encoded(lines.size());
  std::vector<std::string> failures(static_cast<size_t>(threads));
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      const size_t begin = lines.size() * t / threads;
      const size_t end = lines.size() * (t + 1) / threads;
      for (size_t i = begin; i < end; ++i) {
        const auto status = processor.Encode(lines[i], &encoded[i]);
        if (!status.ok()) {
          failures[t] = path + ":" + std::to_string(i + 1) + ": " + status.ToString();
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
  return encoded;
}

enum class Filter { LengthOnly, LengthAndRatio };

// The encoded pairs that survive the filters, with the counts of each kind of drop.
std::vector<std::pair<std::vector<int>, std::vector<int>>> encode_and_filter(
    const sentencepiece::SentencePieceProcessor& processor, const std::string& split,
    const ParallelText& text, const PreprocessOptions& options, Filter filter,
    SplitCounts* counts, ProgressListener& progress) {
  const int threads = hardware_threads(options.threads);
  progress.begin(split, "lines encoded",
                 static_cast<int64_t>(text.source.size() + text.target.size()));
  std::vector<std::vector<int>> source =
      encode_lines(processor, text.source, text.source_path, threads, progress);
  std::vector<std::vector<int>> target =
      encode_lines(processor, text.target, text.target_path, threads, progress);
  progress.end();
  std::vector<std::pair<std::vector<int>, std::vector<int>>> kept;
  counts->read = static_cast<int64_t>(source.size());
  for (size_t i = 0; i < source.size(); ++i) {
    const double shorter = static_cast<double>(std::min(source[i].size(), target[i].size()));
    const double longer = static_cast<double>(std::max(source[i].size(), target[i].size()));
    if (shorter == 0) {
      ++counts->empty;
    } else if (longer > options.max_len) {
      ++counts->too_long;
    } else if (filter == Filter::LengthAndRatio && longer > options.max_ratio * shorter) {
      ++counts->over_ratio;
    } else {
      kept.emplace_back(std::move(source[i]), std::move(target[i]));
    }
  }
  counts->kept = static_cast<int64_t>(kept.size());
  return kept;
}

// Files written under temporary names, renamed into place by commit(), removed if the
// run fails before that.
class PendingOutputs {
 public:
  ~PendingOutputs() {
    std::error_code ignored;
    for (const auto& [temporary, final_path] : files_) fs::remove(temporary, ignored);
  }
  std::string add(const std::string& final_path) {
    const std::string temporary = final_path + ".partial";
    files_.emplace_back(temporary, final_path);
    return temporary;
  }
  void commit() {
    for (const auto& [temporary, final_path] : files_) fs::rename(temporary, final_path);
    files_.clear();
  }

 private:
  std::vector<std::pair<std::string, std::string>> files_;
};

std::string shard_path(const std::string& dest_dir, const std::string& split, int index) {
  char name[64];
  std::snprintf(name, sizeof name, "%s.%05d.h5", split.c_str(), index);
  return (fs::path(dest_dir) / name).string();
}

// Shards of an earlier run that this run's numbering would not overwrite would be read
// as part of the new corpus: remove every shard of the splits this run writes.
void remove_old_shards(const std::string& dest_dir) {
  std::error_code error;
  for (const auto& entry : fs::directory_iterator(dest_dir, error)) {
    const std::string name = entry.path().filename().string();
    for (const std::string split : {"train", "valid", "test"}) {
      if (name.rfind(split + ".", 0) == 0 && name.size() == split.size() + 9 &&
          name.compare(name.size() - 3, 3, ".h5") == 0) {
        fs::remove(entry.path(), error);
      }
    }
  }
}

void write_split(const std::vector<std::pair<std::vector<int>, std::vector<int>>>& pairs,
                 const ShardMetadata& metadata, const std::string& dest_dir,
                 const std::string& split, int shards, PendingOutputs& outputs) {
  const size_t count = pairs.size();
  for (int shard = 0; shard < shards; ++shard) {
    ShardContents contents;
    contents.metadata = metadata;
    const size_t begin = count * shard / shards;
    const size_t end = count * (shard + 1) / shards;
    for (size_t i = begin; i < end; ++i) {
      contents.source.append(pairs[i].first);
      contents.target.append(pairs[i].second);
    }
    write_shard(outputs.add(shard_path(dest_dir, split, shard)), contents);
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
  if (options.shards < 1) THPC_FAIL("--shards must be >= 1, got " << options.shards);
  if (options.max_len < 1) THPC_FAIL("--max-len must be >= 1, got " << options.max_len);
  if (!(options.max_ratio >= 1.0)) {
    THPC_FAIL("--max-ratio must be >= 1, got " << options.max_ratio);
  }
  if (options.vocab_size < 5) {
    THPC_FAIL("--vocab-size must be >= 5 (4 special ids + 1), got " << options.vocab_size);
  }
}

PreprocessSummary preprocess(const PreprocessOptions& options, std::ostream& log,
                             ProgressListener& progress) {
  const auto start = std::chrono::steady_clock::now();
  check_preprocess_options(options);

  const ParallelText train = read_parallel("train", options.train_prefix, options, progress);
  const ParallelText valid = read_parallel("valid", options.valid_prefix, options, progress);
  ParallelText test;
  if (!options.test_prefix.empty()) {
    test = read_parallel("test", options.test_prefix, options, progress);
  }

  std::error_code error;
  fs::create_directories(options.dest_dir, error);
  if (!fs::is_directory(options.dest_dir, error)) {
    THPC_FAIL(options.dest_dir << ": cannot create the output directory");
  }

  ShardMetadata metadata;
  metadata.spm_model = sentencepiece_model(options, train);
  sentencepiece::SentencePieceProcessor processor;
  const auto loaded = processor.LoadFromSerializedProto(metadata.spm_model);
  const std::string model_name = options.spm_model.empty() ? "the trained model" : options.spm_model;
  if (!loaded.ok()) THPC_FAIL(model_name << ": not a SentencePiece model: " << loaded.ToString());
  metadata.vocab_size = processor.GetPieceSize();
  metadata.ids = SpecialIds{processor.pad_id(), processor.unk_id(), processor.bos_id(),
                            processor.eos_id()};
  if (metadata.ids.pad < 0 || metadata.ids.bos < 0 || metadata.ids.eos < 0) {
    THPC_FAIL(model_name << ": the model lacks a pad, bos or eos piece (train it with "
                         << "--pad_id=0 --unk_id=1 --bos_id=2 --eos_id=3)");
  }
  metadata.source_lang = options.source_lang;
  metadata.target_lang = options.target_lang;

  PreprocessSummary summary;
  summary.vocab_size = metadata.vocab_size;
  PendingOutputs outputs;
  write_split(encode_and_filter(processor, "train", train, options, Filter::LengthAndRatio,
                                &summary.train, progress),
              metadata, options.dest_dir, "train", options.shards, outputs);
  write_split(encode_and_filter(processor, "valid", valid, options, Filter::LengthOnly,
                                &summary.valid, progress),
              metadata, options.dest_dir, "valid", 1, outputs);
  if (!options.test_prefix.empty()) {
    write_split(encode_and_filter(processor, "test", test, options, Filter::LengthOnly,
                                  &summary.test, progress),
                metadata, options.dest_dir, "test", 1, outputs);
  }
  if (summary.train.kept == 0) THPC_FAIL(train.source_path << ": no training pair survived");
  if (summary.valid.kept == 0) THPC_FAIL(valid.source_path << ": no validation pair survived");
  const std::string model_path = (fs::path(options.dest_dir) / "spm.model").string();
  {
    std::ofstream model_file(outputs.add(model_path), std::ios::binary);
    model_file << metadata.spm_model;
    if (!model_file.flush()) THPC_FAIL(model_path << ": cannot write");
  }
  remove_old_shards(options.dest_dir);
  outputs.commit();

  summary.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  log << describe("train", summary.train) << "\n" << describe("valid", summary.valid) << "\n";
  if (!options.test_prefix.empty()) log << describe("test", summary.test) << "\n";
  log << "wrote " << options.shards << " train shard" << (options.shards > 1 ? "s" : "")
      << ", valid" << (options.test_prefix.empty() ? "" : ", test") << " and spm.model to "
      << options.dest_dir << ": vocabulary " << summary.vocab_size << ", "
      << summary.train.read + summary.valid.read + summary.test.read << " pairs in "
      << summary.seconds << " s" << std::endl;
  return summary;
}

}  // namespace thpc
