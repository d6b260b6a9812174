// transformer_preprocess in bounded memory (src/data/preprocess.cc): the text is read a
// block of pairs at a time, the kept pairs wait on disk, and shards are written a block
// at a time. Checks that the output is byte for byte what holding everything wrote, at
// any block size; that the heap's peak does not grow with the corpus (every allocation of
// this test program is counted: operator new is replaced below); that the streamed shard
// writer writes write_shard's bytes; and that SentencePiece trains on a bounded sample
// chosen by the seed. The corpus is generated here (no data set needed).
#include <gtest/gtest.h>
#include <malloc.h>
#include <sentencepiece_processor.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <new>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "common/sha256.h"
#include "data/preprocess.h"
#include "data/shard_file.h"
#include "shard_of_pair.h"

// ---- every heap allocation of this program, counted ----
// Bytes are the allocator's usable sizes, the same at allocation and release; the peak
// is what was live at once since the last reset.
namespace {

std::atomic<int64_t> g_live_bytes{0};
std::atomic<int64_t> g_peak_bytes{0};

void* counted(void* pointer) {
  if (pointer == nullptr) return nullptr;
  const int64_t live = g_live_bytes.fetch_add(static_cast<int64_t>(malloc_usable_size(pointer))) +
                       static_cast<int64_t>(malloc_usable_size(pointer));
  int64_t peak = g_peak_bytes.load();
  while (live > peak && !g_peak_bytes.compare_exchange_weak(peak, live)) {
  }
  return pointer;
}

void* counted_or_throw(void* pointer) {
  if (pointer == nullptr) throw std::bad_alloc();
  return counted(pointer);
}

void* aligned(size_t size, std::align_val_t alignment) {
  void* pointer = nullptr;
  const size_t align = std::max(sizeof(void*), static_cast<size_t>(alignment));
  return posix_memalign(&pointer, align, size == 0 ? 1 : size) == 0 ? pointer : nullptr;
}

void release(void* pointer) noexcept {
  if (pointer == nullptr) return;
  g_live_bytes.fetch_sub(static_cast<int64_t>(malloc_usable_size(pointer)));
  std::free(pointer);
}

}  // namespace

void* operator new(size_t size) { return counted_or_throw(std::malloc(size == 0 ? 1 : size)); }
void* operator new[](size_t size) { return counted_or_throw(std::malloc(size == 0 ? 1 : size)); }
void* operator new(size_t size, const std::nothrow_t&) noexcept {
  return counted(std::malloc(size == 0 ? 1 : size));
}
void* operator new[](size_t size, const std::nothrow_t&) noexcept {
  return counted(std::malloc(size == 0 ? 1 : size));
}
void* operator new(size_t size, std::align_val_t alignment) {
  return counted_or_throw(aligned(size, alignment));
}
void* operator new[](size_t size, std::align_val_t alignment) {
  return counted_or_throw(aligned(size, alignment));
}
void* operator new(size_t size, std::align_val_t alignment, const std::nothrow_t&) noexcept {
  return counted(aligned(size, alignment));
}
void* operator new[](size_t size, std::align_val_t alignment, const std::nothrow_t&) noexcept {
  return counted(aligned(size, alignment));
}
void operator delete(void* pointer) noexcept { release(pointer); }
void operator delete[](void* pointer) noexcept { release(pointer); }
void operator delete(void* pointer, size_t) noexcept { release(pointer); }
void operator delete[](void* pointer, size_t) noexcept { release(pointer); }
void operator delete(void* pointer, const std::nothrow_t&) noexcept { release(pointer); }
void operator delete[](void* pointer, const std::nothrow_t&) noexcept { release(pointer); }
void operator delete(void* pointer, std::align_val_t) noexcept { release(pointer); }
void operator delete[](void* pointer, std::align_val_t) noexcept { release(pointer); }
void operator delete(void* pointer, size_t, std::align_val_t) noexcept { release(pointer); }
void operator delete[](void* pointer, size_t, std::align_val_t) noexcept { release(pointer); }
void operator delete(void* pointer, std::align_val_t, const std::nothrow_t&) noexcept {
  release(pointer);
}
void operator delete[](void* pointer, std::align_val_t, const std::nothrow_t&) noexcept {
  release(pointer);
}

namespace thpc {
namespace {

namespace fs = std::filesystem;

// The most heap bytes `action` had live at once beyond what was live before it.
template <typename Action>
int64_t peak_heap_of(Action&& action) {
  const int64_t before = g_live_bytes.load();
  g_peak_bytes.store(before);
  action();
  return g_peak_bytes.load() - before;
}

std::string read_bytes(const fs::path& path) {
  std::ifstream stream(path, std::ios::binary);
  std::ostringstream bytes;
  bytes << stream.rdbuf();
  return bytes.str();
}

// `pairs` pairs of made-up words (the target's with umlauts: two-byte UTF-8), 3 to 30 a
// side, with every kind of pair the filters drop at fixed strides (an empty side, a side
// over max_len 60, a ratio over 3) and CRLF line ends now and then. The same every time.
void write_corpus(const fs::path& prefix, int64_t pairs, uint64_t seed) {
  static const char* kSyllables[] = {"ka", "lo", "mi", "ne", "ru", "sa", "ti", "vo", "ze", "pa",
                                     "do", "gu", "he", "ji", "bo", "fe"};
  static const char* kUmlauts[] = {"\xC3\xA4", "\xC3\xB6", "\xC3\xBC", "\xC3\x9F"};
  std::mt19937_64 generator(seed);
  const auto words = [&](int count, bool german) {
    std::string line;
    for (int w = 0; w < count; ++w) {
      if (w > 0) line += ' ';
      const int syllables = 1 + static_cast<int>(generator() % 3);
      for (int s = 0; s < syllables; ++s) {
        line += kSyllables[generator() % 16];
        if (german && generator() % 4 == 0) line += kUmlauts[generator() % 4];
      }
    }
    return line;
  };
  std::ofstream en(prefix.string() + ".en", std::ios::binary);
  std::ofstream de(prefix.string() + ".de", std::ios::binary);
  for (int64_t i = 0; i < pairs; ++i) {
    const int length = 3 + static_cast<int>(generator() % 28);
    std::string source = words(length, false);
    std::string target = words(std::max(1, length + static_cast<int>(generator() % 5) - 2), true);
    if (i % 97 == 5) source.clear();
    if (i % 101 == 7) source = words(80, false);
    if (i % 103 == 11) {
      source = words(25, false);
      target = words(1, true);
    }
    const char* end = i % 89 == 3 ? "\r\n" : "\n";
    en << source << end;
    de << target << end;
  }
}

// preprocess(options, log), with what SentencePiece writes to standard error meanwhile in
// *stderr_text (captured also when it throws, so that the next capture can start).
PreprocessSummary preprocess_capturing_stderr(const PreprocessOptions& options, std::ostream& log,
                                              std::string* stderr_text) {
  testing::internal::CaptureStderr();
  PreprocessSummary summary;
  try {
    summary = preprocess(options, log);
  } catch (...) {
    *stderr_text = testing::internal::GetCapturedStderr();
    throw;
  }
  *stderr_text = testing::internal::GetCapturedStderr();
  return summary;
}

// The corpora and a SentencePiece model trained once on the smallest, for the suite.
class PreprocessStreaming : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    root_ = fs::temp_directory_path() / ("thpc_test_preprocess_" + std::to_string(::getpid()));
    fs::create_directories(root_);
    write_corpus(root_ / "small", 1000, 1);
    write_corpus(root_ / "large", 8000, 2);
    write_corpus(root_ / "valid", 120, 3);
    std::ostringstream log;
    preprocess(options("small", root_ / "trained"), log);
  }
  static void TearDownTestSuite() { fs::remove_all(root_); }

  static PreprocessOptions options(const std::string& train, const fs::path& dest) {
    PreprocessOptions options;
    options.source_lang = "en";
    options.target_lang = "de";
    options.train_prefix = (root_ / train).string();
    options.valid_prefix = (root_ / "valid").string();
    options.test_prefix = (root_ / "valid").string();
    options.dest_dir = dest.string();
    options.vocab_size = 300;
    options.shards = 3;
    options.max_len = 60;
    options.max_ratio = 3.0;
    options.threads = 2;
    return options;
  }

  static std::string model() { return (root_ / "trained" / "spm.model").string(); }

  static fs::path root_;
};

fs::path PreprocessStreaming::root_;

std::vector<std::string> output_names(int shards) {
  std::vector<std::string> names = {"valid.00000.h5", "test.00000.h5", "spm.model"};
  for (int s = 0; s < shards; ++s) names.push_back("train.0000" + std::to_string(s) + ".h5");
  return names;
}

// The splits as transformer_preprocess wrote them when it held every line and every
// encoding at once (before it streamed, up to commit fd8e2e9): all lines read ('\r'
// dropped), all encoded, filtered in order, each kept pair given to its shard (pair by
// pair, the rule of PreprocessOptions::pairs_dealt_together), each shard written from
// memory. The reference the streamed output must equal.
void write_as_when_held(const PreprocessOptions& options, const fs::path& dest) {
  sentencepiece::SentencePieceProcessor processor;
  ASSERT_TRUE(processor.Load(options.spm_model).ok());
  ShardMetadata metadata;
  metadata.spm_model = read_bytes(options.spm_model);
  metadata.vocab_size = processor.GetPieceSize();
  metadata.ids = SpecialIds{processor.pad_id(), processor.unk_id(), processor.bos_id(),
                            processor.eos_id()};
  metadata.source_lang = options.source_lang;
  metadata.target_lang = options.target_lang;
  const auto read_lines = [](const std::string& path) {
    std::ifstream stream(path, std::ios::binary);
    std::vector<std::string> lines;
    for (std::string line; std::getline(stream, line);) {
      if (!line.empty() && line.back() == '\r') line.pop_back();
      lines.push_back(line);
    }
    return lines;
  };
  const auto split = [&](const std::string& name, const std::string& prefix, bool ratio,
                         int shards) {
    const std::vector<std::string> source = read_lines(prefix + ".en");
    const std::vector<std::string> target = read_lines(prefix + ".de");
    std::vector<std::pair<std::vector<int>, std::vector<int>>> kept;
    for (size_t i = 0; i < source.size(); ++i) {
      std::vector<int> src, tgt;
      ASSERT_TRUE(processor.Encode(source[i], &src).ok());
      ASSERT_TRUE(processor.Encode(target[i], &tgt).ok());
      const size_t shorter = std::min(src.size(), tgt.size());
      const size_t longer = std::max(src.size(), tgt.size());
      // --max-len for the training pairs, --valid-max-len for the validation and test ones.
      const int limit = ratio ? options.max_len : options.valid_max_len;
      if (shorter == 0 || longer > static_cast<size_t>(limit)) continue;
      if (ratio && static_cast<double>(longer) > options.max_ratio * static_cast<double>(shorter)) {
        continue;
      }
      kept.emplace_back(std::move(src), std::move(tgt));
    }
    const int64_t count = static_cast<int64_t>(kept.size());
    // The split's digest, as every shard records it: each side's lengths and ids in the
    // input's order (a length, then its ids), then the sha256 of the two digests.
    Sha256 source_digest, target_digest;
    for (const auto& [src, tgt] : kept) {
      for (const auto& [digest, ids] : {std::pair{&source_digest, &src}, {&target_digest, &tgt}}) {
        const int32_t length = static_cast<int32_t>(ids->size());
        digest->update(&length, sizeof length);
        digest->update(ids->data(), ids->size() * sizeof(int32_t));
      }
    }
    const std::string sides = source_digest.hex_digest() + target_digest.hex_digest();
    const std::string split_sha256 = sha256_hex(sides.data(), sides.size());
    std::vector<ShardContents> contents(static_cast<size_t>(shards));
    for (int64_t i = 0; i < count; ++i) {
      const int shard = shard_of_pair(i, count, shards, options.pairs_dealt_together);
      contents[shard].source.append(kept[i].first);
      contents[shard].target.append(kept[i].second);
    }
    for (int shard = 0; shard < shards; ++shard) {
      contents[shard].metadata = metadata;
      contents[shard].number = ShardNumber{shard, shards, split_sha256};
      write_shard((dest / (name + ".0000" + std::to_string(shard) + ".h5")).string(),
                  contents[shard]);
    }
  };
  fs::create_directories(dest);
  split("train", options.train_prefix, true, options.shards);
  split("valid", options.valid_prefix, false, 1);
  split("test", options.test_prefix, false, 1);
  std::ofstream(dest / "spm.model", std::ios::binary) << metadata.spm_model;
}

TEST_F(PreprocessStreaming, OutputIsWhatHoldingEverythingWroteAtAnyBlockSize) {
  // Blocks: 1, every pair its own block; 7, blocks, runs and shards cut at unrelated
  // places; the default, the whole split in one block; and blocks cut by their text's
  // bytes (500: a few pairs each, of varying counts). Runs dealt: the default (one full
  // round of 3 shards and a rest, here), 5 (many rounds), 1 (pair by pair).
  const PreprocessOptions defaults;
  struct Blocks {
    int64_t pairs, bytes, run;
  };
  for (const Blocks& blocks : {Blocks{1, defaults.bytes_per_block, defaults.pairs_dealt_together},
                               Blocks{7, defaults.bytes_per_block, 5},
                               Blocks{defaults.pairs_per_block, defaults.bytes_per_block, 1},
                               Blocks{defaults.pairs_per_block, 500, 5}}) {
    const int64_t block = blocks.pairs, run = blocks.run;
    SCOPED_TRACE("pairs_per_block " + std::to_string(block) + ", bytes_per_block " +
                 std::to_string(blocks.bytes) + ", pairs_dealt_together " + std::to_string(run));
    PreprocessOptions held = options("small", root_ / "held");
    held.spm_model = model();
    held.pairs_dealt_together = run;
    fs::remove_all(root_ / "held");
    write_as_when_held(held, root_ / "held");
    PreprocessOptions streamed = options("small", root_ / "streamed");
    streamed.spm_model = model();
    streamed.pairs_per_block = block;
    streamed.bytes_per_block = blocks.bytes;
    streamed.pairs_dealt_together = run;
    std::ostringstream log;
    const PreprocessSummary summary = preprocess(streamed, log);
    EXPECT_EQ(summary.train.read, 1000);
    EXPECT_GT(summary.train.empty, 0);
    EXPECT_GT(summary.train.too_long, 0);
    EXPECT_GT(summary.train.over_ratio, 0);
    for (const std::string& name : output_names(3)) {
      // Compared as a bool: a failure would print both files' bytes.
      EXPECT_TRUE(read_bytes(root_ / "streamed" / name) == read_bytes(root_ / "held" / name))
          << name << " differs";
    }
    // The scratch files of the encoded text are gone.
    for (const auto& entry : fs::directory_iterator(root_ / "streamed")) {
      EXPECT_EQ(entry.path().string().find(".partial"), std::string::npos) << entry.path();
    }
  }
}

// A corpus concatenated from two sub-corpora (as WMT14 is from Europarl, Common Crawl and
// News Commentary) gives every shard pairs of both, in equal parts here: the pairs are
// dealt in runs (16 pairs, so that this small corpus makes many rounds). Before, shards
// were consecutive slices of the input: the first held only the short sub-corpus, the
// last only the long one, and a reader streaming shard by shard trained on one at a time.
TEST_F(PreprocessStreaming, EveryShardHoldsPairsFromTheWholeInput) {
  static const char* kSyllables[] = {"ka", "lo", "mi", "ne", "ru", "sa", "ti", "vo"};
  std::mt19937_64 generator(4);
  const auto line = [&](int words) {
    std::string text;
    for (int w = 0; w < words; ++w) {
      text += w > 0 ? " " : "";
      text += std::string(kSyllables[generator() % 8]) + kSyllables[generator() % 8];
    }
    return text;
  };
  // 576 pairs of 2 words a side, then 576 of 16: sides of at most 8 pieces, then of at
  // least 16.
  const fs::path prefix = root_ / "concatenated";
  {
    std::ofstream en(prefix.string() + ".en"), de(prefix.string() + ".de");
    for (int i = 0; i < 1152; ++i) {
      const int words = i < 576 ? 2 : 16;
      en << line(words) << "\n";
      de << line(words) << "\n";
    }
  }
  PreprocessOptions dealt = options("concatenated", root_ / "dealt");
  dealt.spm_model = model();
  dealt.pairs_dealt_together = 16;
  std::ostringstream log;
  const PreprocessSummary summary = preprocess(dealt, log);
  ASSERT_EQ(summary.train.kept, 1152) << log.str();
  for (int shard = 0; shard < 3; ++shard) {
    SCOPED_TRACE("shard " + std::to_string(shard));
    const ShardContents contents =
        read_shard((root_ / "dealt" / ("train.0000" + std::to_string(shard) + ".h5")).string());
    int64_t short_pairs = 0;
    for (int64_t i = 0; i < contents.source.sentences(); ++i) {
      short_pairs += contents.source.sentence(i).size() <= 8 ? 1 : 0;
    }
    // 1152 pairs in 24 rounds of 3 runs of 16: 384 a shard, half from each sub-corpus.
    EXPECT_EQ(contents.source.sentences(), 384);
    EXPECT_EQ(short_pairs, 192);
  }
}

// A side too long in bytes to fit --max-len pieces is counted too long without being
// encoded: SentencePiece took ~85 bytes of memory a byte of it (a 100 MB line: 8 GB) before
// --max-len dropped it. Here a 4 MB line, which would have cost ~340 MB.
TEST_F(PreprocessStreaming, AHugeLineIsCountedTooLongWithoutBeingEncoded) {
  const fs::path prefix = root_ / "huge";
  {
    std::ofstream en(prefix.string() + ".en"), de(prefix.string() + ".de");
    std::string huge;
    while (huge.size() < (4u << 20)) huge += "kalo mine rusa ";
    for (int i = 0; i < 50; ++i) {
      en << (i == 7 ? huge : "kalo mine") << "\n";
      de << "rusa tivo" << "\n";
    }
  }
  PreprocessOptions options_huge = options("huge", root_ / "huge_out");
  options_huge.spm_model = model();
  options_huge.shards = 1;
  std::ostringstream log;
  PreprocessSummary summary;
  const int64_t peak = peak_heap_of([&] { summary = preprocess(options_huge, log); });
  EXPECT_EQ(summary.train.read, 50);
  EXPECT_EQ(summary.train.too_long, 1);
  EXPECT_EQ(summary.train.kept, 49);
  EXPECT_LT(peak, 48 << 20) << "peak heap " << peak;
}

// Holding every pair, the peak grew with the corpus. Streaming, it is the model, one
// block of pairs and the file buffers at any size. The 8 times larger corpus may add only
// what a block's buffers gain when they meet longer lines (each line and id buffer of a
// block keeps the longest it held: 64 pairs of 80-word lines are ~100 KB). The same
// measure with the whole split as one block shows what it catches (~3.5 MB more here).
TEST_F(PreprocessStreaming, PeakHeapDoesNotGrowWithTheCorpus) {
  const auto peak = [&](const std::string& corpus, int64_t block) {
    PreprocessOptions streamed = options(corpus, root_ / ("peak_" + corpus));
    streamed.spm_model = model();
    streamed.pairs_per_block = block;
    std::ostringstream log;
    return peak_heap_of([&] { preprocess(streamed, log); });
  };
  const int64_t small = peak("small", 64), large = peak("large", 64);
  const int64_t small_held = peak("small", 8000), large_held = peak("large", 8000);
  std::cout << "peak heap, blocks of 64 pairs: " << small << " bytes at 1,000 pairs, " << large
            << " at 8,000; one block: " << small_held << " and " << large_held << "\n";
  EXPECT_LT(large, small + 128 * 1024);
  EXPECT_GT(large_held, small_held + 2 * 1024 * 1024);
}

// A side given in blocks of whole sentences, `block` at a time.
class BlockColumn final : public ShardColumnSource {
 public:
  BlockColumn(const TokenColumn& column, int64_t block) : column_(column), block_(block) {}
  int64_t sentences() const override { return column_.sentences(); }
  int64_t tokens() const override { return static_cast<int64_t>(column_.tokens.size()); }
  void rewind() override { next_ = 0; }
  const TokenColumn& next_block() override {
    current_ = TokenColumn();
    for (int64_t i = next_; i < std::min(next_ + block_, sentences()); ++i) {
      const TokenSequence sentence = column_.sentence(i);
      current_.append(std::vector<int>(sentence.begin(), sentence.end()));
    }
    next_ = std::min(next_ + block_, sentences());
    return current_;
  }

 private:
  const TokenColumn& column_;
  int64_t block_, next_ = 0;
  TokenColumn current_;
};

TEST_F(PreprocessStreaming, AStreamedShardIsWriteShardsFileByteForByte) {
  std::mt19937_64 generator(5);
  for (const int pairs : {0, 1, 50}) {
    ShardContents contents;
    contents.metadata.vocab_size = 300;
    contents.metadata.ids = SpecialIds{0, 1, 2, 3};
    contents.metadata.source_lang = "en";
    contents.metadata.target_lang = "de";
    contents.metadata.spm_model = read_bytes(model());
    for (int i = 0; i < pairs; ++i) {
      std::vector<int> source(1 + generator() % 20), target(1 + generator() % 20);
      for (int& id : source) id = 4 + static_cast<int>(generator() % 296);
      for (int& id : target) id = 4 + static_cast<int>(generator() % 296);
      contents.source.append(source);
      contents.target.append(target);
    }
    const std::string whole = (root_ / "whole.h5").string();
    write_shard(whole, contents);
    for (const int64_t block : {1, 3, 7, 1000}) {
      SCOPED_TRACE(std::to_string(pairs) + " pairs, blocks of " + std::to_string(block));
      BlockColumn source(contents.source, block), target(contents.target, block);
      const std::string streamed = (root_ / "streamed.h5").string();
      write_shard_streamed(streamed, contents.metadata, source, target);
      EXPECT_EQ(read_bytes(streamed), read_bytes(whole));
    }
  }
}

// SentencePiece holds the lines it trains on: a corpus of more lines than --spm-sentences
// is sampled down to exactly that many, the sample chosen by --seed; a corpus of fewer
// is read whole by SentencePiece, as before (the seed then changes nothing).
TEST_F(PreprocessStreaming, SentencePieceTrainsOnABoundedSampleChosenByTheSeed) {
  const auto trained = [&](int64_t sample, uint64_t seed, const std::string& name) {
    PreprocessOptions options = this->options("small", root_ / name);
    options.spm_sentences = sample;
    options.seed = seed;
    options.shards = 1;
    std::ostringstream log;
    const PreprocessSummary summary = preprocess(options, log);
    EXPECT_EQ(summary.training_lines, 2000);
    EXPECT_EQ(summary.spm_lines, sample == 0 ? 2000 : std::min<int64_t>(sample, 2000)) << name;
    // Said on one line, with the seed when it chose the lines.
    const std::string said = "SentencePiece trained on " + std::to_string(summary.spm_lines) +
                             " of 2000 training lines (both languages";
    EXPECT_NE(log.str().find(said + (summary.spm_lines < 2000 ? ", a sample drawn with seed " +
                                                                    std::to_string(seed) + ")\n"
                                                              : ")\n")),
              std::string::npos)
        << log.str();
    return read_bytes(root_ / name / "spm.model");
  };
  const std::string sampled = trained(700, 1, "sample_seed1");
  EXPECT_EQ(trained(700, 1, "sample_seed1_again"), sampled);
  EXPECT_NE(trained(700, 2, "sample_seed2"), sampled);
  const std::string whole = trained(2000, 1, "whole_seed1");
  EXPECT_EQ(trained(2000, 2, "whole_seed2"), whole);
  trained(0, 2, "every_line");  // 0: every line
}

// Past a million lines SentencePiece warns, in its own format, "Too many sentences are
// loaded!" and advises its own flags (--input_sentence_size), not --spm-sentences, whose
// default (10M) lets such a corpus through whole (WMT's 9M lines): noise on the terminal,
// as the summary already says how many lines it trained on.
TEST_F(PreprocessStreaming, SentencePiecesOwnWarningsStayOffTheTerminal) {
  constexpr int kPairs = 500001;  // 1000002 lines, past SentencePiece's million
  {
    std::string en_text, de_text;
    for (int i = 0; i < kPairs; ++i) {
      en_text += "a dog runs\n";
      de_text += "ein Hund rennt\n";
    }
    std::ofstream(root_ / "million.en", std::ios::binary) << en_text;
    std::ofstream(root_ / "million.de", std::ios::binary) << de_text;
  }
  PreprocessOptions options = this->options("million", root_ / "million_out");
  options.shards = 1;
  std::ostringstream log;
  std::string stderr_text;
  const PreprocessSummary summary = preprocess_capturing_stderr(options, log, &stderr_text);
  EXPECT_EQ(stderr_text.find("LOG("), std::string::npos) << stderr_text;
  EXPECT_EQ(summary.spm_lines, 2 * kPairs);
  EXPECT_NE(log.str().find("SentencePiece trained on 1000002 of 1000002 training lines"),
            std::string::npos)
      << log.str();
}

// SentencePiece skips a line longer than it trains on (64 KiB) with three warnings naming
// its own flag, --max_sentence_length, which this program does not have. Such a line is
// left out before SentencePiece sees it, and the summary says so in its own words.
TEST_F(PreprocessStreaming, ALineTooLongForSentencePieceIsLeftOutAndSaidInOurWords) {
  fs::copy_file(root_ / "small.de", root_ / "long_line.de");
  fs::copy_file(root_ / "small.en", root_ / "long_line.en");
  {
    std::ofstream en(root_ / "long_line.en", std::ios::app);
    std::ofstream de(root_ / "long_line.de", std::ios::app);
    std::string long_line;
    while (long_line.size() <= 70000) long_line += "kalo mine rusa ";
    en << long_line << "\n";
    de << long_line << "\n";
  }
  PreprocessOptions options = this->options("long_line", root_ / "long_line_out");
  options.shards = 1;
  std::ostringstream log;
  std::string stderr_text;
  const PreprocessSummary summary = preprocess_capturing_stderr(options, log, &stderr_text);
  EXPECT_EQ(stderr_text.find("max_sentence_length"), std::string::npos) << stderr_text;
  EXPECT_EQ(summary.training_lines, 2002);
  EXPECT_EQ(summary.spm_lines, 2000);
  EXPECT_EQ(summary.spm_lines_too_long, 2);
  EXPECT_NE(log.str().find("SentencePiece trained on 2000 of 2002 training lines (both "
                           "languages; 2 left out, longer than 65536 bytes)\n"),
            std::string::npos)
      << log.str();
  // The lines left out change nothing: the pieces are those of the corpus without them.
  sentencepiece::SentencePieceProcessor with_line, without_line;
  ASSERT_TRUE(with_line.Load((root_ / "long_line_out" / "spm.model").string()).ok());
  ASSERT_TRUE(without_line.Load(model()).ok());
  ASSERT_EQ(with_line.GetPieceSize(), without_line.GetPieceSize());
  for (int id = 0; id < with_line.GetPieceSize(); ++id) {
    ASSERT_EQ(with_line.IdToPiece(id), without_line.IdToPiece(id)) << "id " << id;
  }
}

}  // namespace
}  // namespace thpc
