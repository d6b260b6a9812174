#include "data/shard_reader.h"

#include <algorithm>
#include <filesystem>
#include <iomanip>
#include <limits>
#include <numeric>
#include <ostream>
#include <set>
#include <sstream>

#include <sentencepiece_processor.h>

#include "common/error.h"
#include "common/philox.h"
#include "common/sha256.h"
#include "common/still_working.h"
#include "data/sentencepiece_vocabulary.h"

namespace thpc {
namespace {

// Philox sites of the reader's shuffles, apart from dropout, initialisation and the
// synthetic tasks.
constexpr uint32_t kShardOrderSite = 0x30000000u;
constexpr uint32_t kBatchOrderSite = 0x30000001u;

int64_t token_bytes(int64_t tokens, int64_t pairs) {
  return tokens * static_cast<int64_t>(sizeof(int32_t)) +
         2 * (pairs + 1) * static_cast<int64_t>(sizeof(int64_t));
}

}  // namespace

struct ShardReader::Shard {
  std::string path;
  ShardSummary summary;
  int64_t bytes = 0;                       // token arrays and offsets, both sides
  std::vector<int32_t> order;              // pair indices sorted by lengths
  std::vector<int64_t> batch_starts;       // batch k is order[starts[k], starts[k + 1])
  std::unique_ptr<ShardContents> contents;  // loaded tokens, when resident

  int64_t batches() const { return static_cast<int64_t>(batch_starts.size()) - 1; }
};

namespace {

bool fits_positions(const ShardSummary& summary, int32_t pair, int64_t max_sentence_tokens) {
  return summary.source_lengths[pair] <= max_sentence_tokens &&
         summary.target_lengths[pair] <= max_sentence_tokens;
}

}  // namespace

std::vector<std::string> find_shards(const std::string& directory, const std::string& prefix,
                                     const std::string& named_by,
                                     const std::string& directory_named_by) {
  std::error_code error;
  if (!std::filesystem::is_directory(directory, error)) {
    const std::string named = directory_named_by.empty() ? directory : directory_named_by;
    if (std::filesystem::exists(directory, error)) {
      THPC_FAIL(named << ": is a file, not a data directory (data.dir names the directory "
                          << "transformer_preprocess --destdir wrote the shards to)");
    }
    // A relative path is the working directory's, which a job script or mpirun -wdir may
    // have changed: said, as the user stands elsewhere.
    std::string where;
    if (std::filesystem::path(directory).is_relative()) {
      where = " in " + std::filesystem::current_path(error).string();
    }
    THPC_FAIL(named << ": no such data directory" << where << " (run "
                        << "transformer_preprocess --destdir " << directory << ")");
  }
  std::vector<std::string> files;
  for (int index = 0;; ++index) {
    const std::filesystem::path path =
        std::filesystem::path(directory) / shard_file_name(prefix, index);
    if (!std::filesystem::exists(path, error)) break;
    files.push_back(path.string());
  }
  // Shard 0 lost beside later ones is a gap, not "no shards" (a helper took that for a
  // message about an empty directory): said as the gap below says one.
  for (const auto& entry : std::filesystem::directory_iterator(directory, error)) {
    if (files.empty() && is_shard_file_name(entry.path().filename().string(), prefix)) {
      THPC_FAIL(entry.path().string() << ": shard found, but "
                << shard_file_name(prefix, 0) << " is missing (shard 0 of the set: run "
                << "transformer_preprocess --destdir " << directory << " again)");
    }
  }
  if (files.empty()) {
    // A directory of other sets (train, valid, test) was told to be preprocessed again
    // when the prefix was mistyped (--data.valid=nope; a helper's trial): its sets named.
    std::set<std::string> sets;
    const std::string first_shard = shard_file_name("", 0);  // ".00000.h5"
    for (const auto& entry : std::filesystem::directory_iterator(directory, error)) {
      const std::string name = entry.path().filename().string();
      if (name.size() > first_shard.size() &&
          name.compare(name.size() - first_shard.size(), first_shard.size(), first_shard) == 0) {
        sets.insert(name.substr(0, name.size() - first_shard.size()));
      }
    }
    std::string held;
    for (const std::string& set : sets) held += (held.empty() ? "" : ", ") + set;
    const std::string for_setting = named_by.empty() ? "" : " for " + named_by;
    if (sets.empty()) {
      THPC_FAIL(directory << ": no shards " << shard_file_name(prefix, 0) << ", "
                          << shard_file_name(prefix, 1) << ", ..." << for_setting
                          << " (run transformer_preprocess --destdir " << directory << ")");
    }
    THPC_FAIL(directory << ": no shards " << shard_file_name(prefix, 0) << ", "
                        << shard_file_name(prefix, 1) << ", ..." << for_setting
                        << "; it holds the shards of " << held << ": give one of them, or "
                        << "preprocess a corpus named " << prefix << " into it");
  }
  // A later shard after a gap means one was lost: reading on would silently drop data.
  for (const auto& entry : std::filesystem::directory_iterator(directory, error)) {
    const bool is_shard = is_shard_file_name(entry.path().filename().string(), prefix);
    if (is_shard && std::find(files.begin(), files.end(), entry.path().string()) == files.end()) {
      THPC_FAIL(entry.path().string() << ": shard found after a gap in the numbering (shard "
                                      << files.size() << " is missing)");
    }
  }
  return files;
}

namespace {

// Shard `index`'s name in the set whose shard 0 is `first` (PREFIX.00000.h5 ->
// PREFIX.0000N.h5, as find_shards looks for them), or "shard N" when `first` is not so named.
std::string sibling_shard(const std::string& first, int64_t index) {
  const std::filesystem::path path(first);
  const std::string name = path.filename().string();
  const std::string split = name.size() > 9 ? name.substr(0, name.size() - 9) : "";
  if (split.empty() || name != shard_file_name(split, 0)) return "shard " + std::to_string(index);
  return (path.parent_path() / shard_file_name(split, index)).string();
}

// The shards of a split record their number and count (ShardNumber): a set copied short, a
// shard renamed, or shards of two preprocessing runs in one directory are refused, since
// each would train on other data than the corpus without a word. Sets without numbers
// (shards written before) are taken as they are.
void check_shard_numbers(const std::vector<std::string>& files,
                         const std::vector<ShardNumber>& numbers) {
  const ShardNumber& first = numbers.front();
  for (size_t i = 0; i < files.size(); ++i) {
    const ShardNumber& number = numbers[i];
    if (number.recorded() != first.recorded()) {
      THPC_FAIL(files[i] << (number.recorded() ? " records" : " records no")
                         << " its number among its split's shards, and " << files.front()
                         << (first.recorded() ? " does" : " does not")
                         << ": shards of different preprocessing runs in one directory (re-run "
                         << "transformer_preprocess into an empty --destdir)");
    }
    if (!number.recorded()) continue;
    if (number.count != first.count) {
      THPC_FAIL(files[i] << ": one of " << number.count << " shards, but " << files.front()
                         << " is one of " << first.count << ": shards of different "
                         << "preprocessing runs in one directory (re-run "
                         << "transformer_preprocess into an empty --destdir)");
    }
    // (Shards of the same count from another run of other pairs: one had the same filters
    // re-run with another --max-len, say, and part of its shards copied in.)
    if (number.split_sha256 != first.split_sha256) {
      THPC_FAIL(files[i] << ": a shard of another preprocessing run than " << files.front()
                         << " (" << (number.split_sha256.empty() ? "records no digest of its "
                                     "split's pairs, which " + files.front() + " does"
                                     : first.split_sha256.empty()
                                         ? "records a digest of its split's pairs, which " +
                                               files.front() + " does not"
                                         : std::string("the digests of their splits' pairs "
                                                       "differ"))
                         << "): shards of different preprocessing runs in one directory (copy "
                         << "the whole set again, or re-run transformer_preprocess into an "
                         << "empty --destdir)");
    }
    if (number.index != static_cast<int64_t>(i)) {
      THPC_FAIL(files[i] << ": is shard " << number.index << " of its split ("
                         << sibling_shard(files.front(), number.index)
                         << "), renamed or copied under another shard's name: give each "
                         << "shard its own name back, or re-run transformer_preprocess");
    }
  }
  const int64_t found = static_cast<int64_t>(files.size());
  if (first.recorded() && found < first.count) {
    THPC_FAIL(files.front() << ": one of " << first.count << " shards, but only " << found
                            << " are there: " << sibling_shard(files.front(), found)
                            << (first.count - found > 1 ? " and after it" : "")
                            << " missing (a copy cut short? copy the data directory again, "
                            << "or re-run transformer_preprocess)");
  }
}

// The SentencePiece model the shards store is what validation BLEU, every checkpoint and
// so decoding take: it must load, and agree with the shards' vocabulary size and special
// ids (a garbage model trained to exit 0 and failed only in transformer_decode, with
// SentencePiece's internal message; a vocab_size one above the model's pieces gave
// checkpoints no decoder could use). Read once, from the first shard: the others must
// store the same bytes.
// With separate vocabularies, the source's model (source_spm_model) against
// source_vocab_size alike.
void check_stored_sentencepiece_model(const std::string& path, const std::string& model,
                                      int vocab_size, const SpecialIds& ids,
                                      const char* attribute, const char* size_attribute) {
  if (model.empty()) return;  // written without one (tests' hand-made shards)
  sentencepiece::SentencePieceProcessor processor;
  if (!processor.LoadFromSerializedProto(model).ok()) {
    THPC_FAIL(path << ": the stored SentencePiece model (attribute " << attribute
                   << ") does not load: the shard is damaged, or was written with a newer "
                   << "SentencePiece than this build's (re-run transformer_preprocess)");
  }
  // A model without pad, bos or eos pieces has them after its own (vocabulary_of).
  SentencePieceVocabulary vocabulary;
  try {
    vocabulary = vocabulary_of(processor);
  } catch (const Error& error) {
    THPC_FAIL(path << ": the stored SentencePiece model (attribute " << attribute
                   << "): " << error.what() << " (re-run transformer_preprocess)");
  }
  if (vocabulary.size != vocab_size) {
    THPC_FAIL(path << ": " << size_attribute << " is " << vocab_size
                   << " but the stored SentencePiece model has " << vocabulary.pieces << " pieces"
                   << (vocabulary.added.empty()
                           ? std::string()
                           : " and " + std::to_string(vocabulary.added.size()) +
                                 " special ids after them")
                   << ": the shard is damaged (re-run transformer_preprocess)");
  }
  if (vocabulary.ids != ids) {
    THPC_FAIL(path << ": special ids pad/unk/bos/eos " << special_ids_text(ids)
                   << " are not the stored "
                   << (std::string(attribute) == "spm_model" ? "" : "source ")
                   << "SentencePiece model's " << special_ids_text(vocabulary.ids)
                   << ": the shard is damaged (re-run transformer_preprocess)");
  }
}

void check_stored_sentencepiece_models(const std::string& path, const ShardMetadata& meta) {
  check_stored_sentencepiece_model(path, meta.spm_model, meta.vocab_size, meta.ids, "spm_model",
                                   "vocab_size");
  if (meta.separate_vocabularies()) {
    check_stored_sentencepiece_model(path, meta.source_spm_model, meta.source_vocab_size,
                                     meta.ids, "source_spm_model", "source_vocab_size");
  }
}

// A shard read again (streamed, or at start-up after its summary) must be the one the
// run opened: the plan (batches of its
// pairs' lengths), the run's vocabulary and the corpus digest in its checkpoints are of
// that file. A corpus preprocessed again into data.dir during a run was trained on
// without a word (another SentencePiece model than the checkpoints', exit 0), or ended
// in internal errors (fewer pairs: indices past the new offsets). Data error: exit 3.
void check_unchanged_since_opened(const std::string& path, const ShardSummary& opened,
                                  const ShardContents& read) {
  const auto changed = [&](const std::string& what) {
    THPC_FAIL(path << ": the shard changed since the run opened it (" << what
                   << "): data.dir was written while the run read it; give the run the "
                   << "corpus it started with (or start a new run)");
  };
  const ShardMetadata& now = read.metadata;
  if (!same_vocabularies(now, opened.metadata)) changed("another vocabulary");
  if (read.source.sentences() != opened.pairs || read.target.sentences() != opened.pairs) {
    changed(std::to_string(read.source.sentences()) + " pairs, " +
            std::to_string(opened.pairs) + " then");
  }
  for (int64_t pair = 0; pair < opened.pairs; ++pair) {
    if (read.source.length(pair) != opened.source_lengths[pair] ||
        read.target.length(pair) != opened.target_lengths[pair]) {
      changed("pair " + std::to_string(pair) + "'s lengths");
    }
  }
  // read_shard checked the tokens against the digests the file records (format 2); the
  // same digests must be those recorded when the run opened it (no second hash).
  if (opened.checksummed && (read.source_tokens_sha256 != opened.source_tokens_sha256 ||
                             read.target_tokens_sha256 != opened.target_tokens_sha256)) {
    changed("other tokens");
  }
}

}  // namespace

ShardReader::ShardReader(const ShardReaderSpec& spec) : spec_(spec) {
  THPC_CHECK(!spec.files.empty(), "no shard files");
  THPC_CHECK(spec.ranks >= 1 && spec.rank >= 0 && spec.rank < spec.ranks,
             "rank " << spec.rank << " of " << spec.ranks);
  int64_t total_bytes = 0;
  for (const std::string& path : spec.files) {
    show_still_working();  // a corpus of many shards on a slow file system takes minutes
    auto shard = std::make_unique<Shard>();
    shard->path = path;
    shard->summary = read_shard_summary(path);
    const ShardMetadata& meta = shard->summary.metadata;
    if (shards_.empty()) {
      metadata_ = meta;
    } else {
      const std::string& first = shards_.front()->path;
      if (meta.vocab_size != metadata_.vocab_size) {
        THPC_FAIL(path << ": vocabulary size " << meta.vocab_size << " differs from "
                       << metadata_.vocab_size << " in " << first
                       << " (shards of different corpora?)");
      }
      if (!same_vocabularies(meta, metadata_)) {
        THPC_FAIL(path << ": SentencePiece vocabulary differs from the one in " << first
                       << " (shards of different corpora?)");
      }
      // One vocabulary serves both directions: a de->en shard among en->de ones was taken.
      if (meta.source_lang != metadata_.source_lang || meta.target_lang != metadata_.target_lang) {
        THPC_FAIL(path << ": a " << meta.source_lang << "->" << meta.target_lang << " shard, but "
                       << first << " is " << metadata_.source_lang << "->"
                       << metadata_.target_lang << " (shards of different corpora?)");
      }
    }
    // The same pairs twice (a shard copied under the next shard's name) were an epoch
    // that read them twice. Shards that record their numbers have that checked
    // (check_shard_numbers: a copy carries its original's number), and two of one run may
    // hold the same pairs: an input that repeats itself dealt in runs of 256 (refused as
    // copies of each other, the corpus preprocessing had written; a helper's trial).
    const ShardSummary& summary = shard->summary;
    if (!summary.source_tokens_sha256.empty() && !summary.number.recorded()) {
      for (const std::unique_ptr<Shard>& other : shards_) {
        if (other->summary.source_tokens_sha256 == summary.source_tokens_sha256 &&
            other->summary.target_tokens_sha256 == summary.target_tokens_sha256) {
          THPC_FAIL(path << ": holds the same pairs as " << other->path
                         << " (a copy? each pair belongs to one shard)");
        }
      }
    }
    shard->bytes = token_bytes(shard->summary.source_tokens + shard->summary.target_tokens,
                               shard->summary.pairs);
    if (shard->bytes > spec.memory_budget_bytes) {
      // Rounded up ("needs 1 MiB, more than the 1 MiB" said a 1.4 MiB shard).
      THPC_FAIL(path << ": the shard needs " << ((shard->bytes + (1 << 20) - 1) >> 20)
                     << " MiB, more than the " << (spec.memory_budget_bytes >> 20)
                     << " MiB of " << spec.setting_names.memory << " (raise "
                     << spec.setting_names.memory << "; or, for training "
                     << "shards, preprocess with more --shards, which cuts the training split "
                     << "only)");
    }
    total_bytes += shard->bytes;
    if (!shard->summary.checksummed) unchecksummed_files_.push_back(path);
    for (int32_t pair = 0; pair < shard->summary.pairs; ++pair) {
      if (fits_positions(shard->summary, pair, spec.max_sentence_tokens)) {
        ++total_pairs_;
        // Padded as make_batch pads: x + eos, bos + y (plan() cuts batches so).
        const int64_t padded_side = int64_t{std::max(shard->summary.source_lengths[pair],
                                                     shard->summary.target_lengths[pair])} + 1;
        if (padded_side > longest_padded_side_) {
          longest_padded_side_ = padded_side;
          longest_pair_file_ = path;
        }
      } else {
        ++dropped_too_long_;
      }
    }
    shards_.push_back(std::move(shard));
  }
  check_stored_sentencepiece_models(spec.files.front(), metadata_);
  if (total_pairs_ == 0 && dropped_too_long_ > 0) {
    THPC_FAIL(spec.files.front() << ": all " << dropped_too_long_ << " sentence pairs are longer "
                                 << "than the model's positions allow ("
                                 << spec.max_sentence_tokens << " tokens + bos/eos; raise "
                                 << spec.setting_names.positions << ")");
  }
  if (total_pairs_ == 0) THPC_FAIL(spec.files.front() << ": the corpus has no sentence pairs");
  // Hashed as read, not gathered first (WMT14's lengths alone are ~36 MB).
  Sha256 identity;
  for (const auto& shard : shards_) {
    const ShardSummary& summary = shard->summary;
    for (const std::vector<int32_t>* lengths :
         {&summary.source_lengths, &summary.target_lengths}) {
      identity.update(lengths->data(), lengths->size() * sizeof(int32_t));
    }
    for (const std::string* recorded :
         {&summary.source_tokens_sha256, &summary.target_tokens_sha256}) {
      identity.update(recorded->data(), recorded->size());
    }
  }
  corpus_sha256_ = identity.hex_digest();
  // Check every id now rather than hours into a run; keep the tokens if they all fit.
  all_resident_ = total_bytes <= spec.memory_budget_bytes;
  if (spec.between_reads) spec.between_reads();
  // (Each read checked against the summary the plan is made from, as a streamed read is:
  // a shard replaced between the two reads, another corpus preprocessed into data.dir,
  // was indexed past its offsets, or its ids reached the model unchecked; a helper's
  // finding.)
  for (auto& shard : shards_) {
    auto contents = std::make_unique<ShardContents>(read_shard(shard->path));
    check_unchanged_since_opened(shard->path, shard->summary, *contents);
    if (all_resident_) shard->contents = std::move(contents);
  }
  // After every file's own checks: a damaged shard is said as such, not as a set's problem.
  std::vector<ShardNumber> numbers;
  for (const auto& shard : shards_) numbers.push_back(shard->summary.number);
  check_shard_numbers(spec.files, numbers);
  numbered_ = numbers.front().recorded();
}

ShardReader::~ShardReader() = default;

void ShardReader::print_notes(std::ostream& log, const std::string& what) const {
  if (dropped_too_long_ > 0) {
    log << what << ": " << dropped_too_long_ << " of " << dropped_too_long_ + total_pairs_
        << " pairs dropped: a side longer than " << spec_.max_sentence_tokens
        << " tokens does not fit " << spec_.setting_names.positions << " with bos/eos"
        << std::endl;
  }
  if (!unchecksummed_files_.empty()) {
    log << "warning: " << what << ": " << unchecksummed_files_.size() << " of " << shards_.size()
        << " shards (" << unchecksummed_files_.front()
        << (unchecksummed_files_.size() > 1 ? ", ..." : "")
        << ") are of format 1, without checksums: corruption cannot be detected (re-run "
        << "transformer_preprocess)" << std::endl;
  }
  if (!numbered_) {
    log << what << ": the shards record no count (written before 2026-12-02): a last shard "
        << "missing from the set cannot be told (re-run transformer_preprocess to have it "
        << "checked)" << std::endl;
  }
}

std::string ShardReader::corpus_line(const std::string& what) const {
  int64_t bytes = 0;
  for (const auto& shard : shards_) bytes += shard->bytes;
  std::ostringstream line;
  line << what << ": " << total_pairs_ << " pairs " << direction() << " in " << shards_.size()
       << (shards_.size() == 1 ? " shard, " : " shards, ") << std::fixed
       << std::setprecision(1) << static_cast<double>(bytes) / (1024.0 * 1024.0)
       << " MiB of tokens "
       << (all_resident_ ? "held in memory"
                         : "streamed shard by shard (more than " +
                               spec_.setting_names.memory + ", " +
                               std::to_string(spec_.memory_budget_bytes / (1024 * 1024)) +
                               " MiB)");
  return line.str();
}

int64_t ShardReader::resident_token_bytes() const {
  int64_t bytes = 0;
  for (const auto& shard : shards_) {
    if (shard->contents) bytes += shard->bytes;
  }
  return bytes;
}

namespace {

// Padded lengths as make_batch builds them: x + eos, and bos + y (or y + eos).
struct PaddedLengths {
  const std::vector<int32_t>& source;
  const std::vector<int32_t>& target;
  int64_t src(int32_t pair) const { return int64_t{source[pair]} + 1; }
  int64_t tgt(int32_t pair) const { return int64_t{target[pair]} + 1; }
};

// Sorts a shard's pairs (indices into `lengths`) so that neighbours are alike on both sides.
void sort_by_lengths(std::vector<int32_t>& order, const PaddedLengths& lengths) {
  const std::vector<int32_t>& src = lengths.source;
  const std::vector<int32_t>& tgt = lengths.target;
  // The order: neighbours are alike on both sides. By the longer side L first (sorting
  // by the source alone leaves the targets of a batch ragged: 20% padding on Multi30k at
  // 25000 tokens); pairs of one L lie on an L-shape of the (source, target) grid, walked
  // by source - target, ascending for even L and descending for odd L, so that the
  // L-shapes of consecutive L meet at the same end (a snake) and a batch that spans two
  // of them stays compact. The index breaks ties, for determinism.
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    const int32_t longer_a = std::max(src[a], tgt[a]), longer_b = std::max(src[b], tgt[b]);
    if (longer_a != longer_b) return longer_a < longer_b;
    const int32_t skew_a = src[a] - tgt[a], skew_b = src[b] - tgt[b];
    if (skew_a != skew_b) return (longer_a % 2 == 0) == (skew_a < skew_b);
    return a < b;
  });
}

// Where the batches of `order` (sorted) start at a budget of `max_tokens` padded tokens a
// side: [0, ..., order.size()].
std::vector<int64_t> least_padded_cuts(const std::vector<int32_t>& order,
                                       const PaddedLengths& lengths, int64_t max_tokens) {
  // The cuts: as few batches as greedy packing makes, and among those the least padded.
  // A batch order[i, j) of B = j - i pairs, S and T its longest padded source and target,
  // is feasible when B * S <= budget and B * T <= budget; feasibility is hereditary (a
  // sub-range of a feasible batch is feasible), so packing greedily to the budget makes
  // the fewest batches G of any contiguous partition. Greedy alone pays for it in
  // padding: its cuts fall wherever the budget runs out, across whole ranges of lengths
  // (8.98% on Multi30k with one rank at 25000 tokens); least-padding cuts with a price
  // per step (the previous version) halved that but took 31 batches instead of 19, and
  // the step's tokens are the optimisation's batch size, so the count is kept at G.
  //   R[k] = end of the k-th greedy batch packed from the front (R[0] = 0, R[G] = n): the
  //          farthest any k batches reach;
  //   L[k] = start of the (G - k)-th greedy batch packed from the back (L[G] = n,
  //          L[0] = 0): the earliest point from which G - k batches still finish.
  // A partition into G batches puts its k-th cut c_k in [L[k], R[k]], and these windows
  // are disjoint and ordered (R[k] >= L[k+1] would finish in G - 1 batches). So the exact
  // least-padding G-batch partition is one dynamic program over the order:
  //   padded[0] = 0,  padded[j] = min over i in [L[k-1], R[k-1]], order[i, j) feasible, of
  //                   padded[i] + B * (S + T)            for j in [L[k], R[k]], k = 1..G,
  // padded[n] being the epoch's padded tokens (source + target). Integer, deterministic
  // (ties keep the later cut i), O(pairs x rows of a batch) once per budget.
  const int64_t count = static_cast<int64_t>(order.size());
  const auto fits = [&](int64_t rows, int64_t longest_src, int64_t longest_tgt) {
    return rows * longest_src <= max_tokens && rows * longest_tgt <= max_tokens;
  };
  std::vector<int64_t> reach{0};  // R[k]
  while (reach.back() < count) {
    int64_t longest_src = 0, longest_tgt = 0, j = reach.back();
    for (; j < count; ++j) {
      const int32_t pair = order[j];
      const int64_t s = std::max(longest_src, lengths.src(pair));
      const int64_t t = std::max(longest_tgt, lengths.tgt(pair));
      if (!fits(j + 1 - reach.back(), s, t)) break;
      longest_src = s;
      longest_tgt = t;
    }
    reach.push_back(j);
  }
  const size_t greedy = reach.size() - 1;  // G
  std::vector<int64_t> earliest(greedy + 1, count);  // L[k]
  for (size_t k = greedy; k-- > 0;) {
    int64_t longest_src = 0, longest_tgt = 0, i = earliest[k + 1];
    for (; i > 0; --i) {
      const int32_t pair = order[i - 1];
      const int64_t s = std::max(longest_src, lengths.src(pair));
      const int64_t t = std::max(longest_tgt, lengths.tgt(pair));
      if (!fits(earliest[k + 1] - i + 1, s, t)) break;
      longest_src = s;
      longest_tgt = t;
    }
    earliest[k] = i;
  }
  THPC_CHECK(earliest[0] == 0, "packing from the back took more batches than from the front");
  constexpr int64_t kUnreached = std::numeric_limits<int64_t>::max();
  std::vector<int64_t> padded(count + 1, kUnreached);
  std::vector<int64_t> cut(count + 1, 0);  // the batch ending before j starts at cut[j]
  padded[0] = 0;
  for (size_t k = 1; k <= greedy; ++k) {
    for (int64_t j = earliest[k]; j <= reach[k]; ++j) {
      int64_t longest_src = 0, longest_tgt = 0;
      for (int64_t i = j - 1; i >= earliest[k - 1]; --i) {
        const int32_t pair = order[i];
        longest_src = std::max(longest_src, lengths.src(pair));
        longest_tgt = std::max(longest_tgt, lengths.tgt(pair));
        const int64_t rows = j - i;
        if (!fits(rows, longest_src, longest_tgt)) break;
        if (i > reach[k - 1] || padded[i] == kUnreached) continue;
        const int64_t total = padded[i] + rows * (longest_src + longest_tgt);
        if (total < padded[j]) {
          padded[j] = total;
          cut[j] = i;
        }
      }
    }
  }
  THPC_CHECK(padded[count] != kUnreached, "no partition into " << greedy << " batches");
  std::vector<int64_t> starts;
  for (int64_t j = count; j > 0; j = cut[j]) starts.push_back(j);
  starts.push_back(0);
  std::reverse(starts.begin(), starts.end());
  return starts;
}

}  // namespace

void ShardReader::plan(int64_t max_tokens) {
  if (max_tokens == planned_budget_) return;
  THPC_CHECK(max_tokens >= 1, "token budget " << max_tokens);
  // Until this plan is whole, no plan is: a pair that does not fit throws half-way, and
  // the next call must plan again rather than read shards cut at two budgets. The
  // batches of a shard are others at another budget, so their order is drawn again.
  planned_budget_ = -1;
  batch_order_epoch_ = -1;
  batch_order_shard_ = -1;
  batches_per_epoch_ = 0;
  for (auto& shard : shards_) {
    const std::vector<int32_t>& src = shard->summary.source_lengths;
    const std::vector<int32_t>& tgt = shard->summary.target_lengths;
    const PaddedLengths lengths{src, tgt};
    shard->order.clear();
    for (int32_t pair = 0; pair < static_cast<int32_t>(src.size()); ++pair) {
      if (fits_positions(shard->summary, pair, spec_.max_sentence_tokens)) {
        shard->order.push_back(pair);
      }
    }
    for (int32_t pair : shard->order) {
      if (lengths.src(pair) > max_tokens || lengths.tgt(pair) > max_tokens) {
        THPC_FAIL(shard->path << ": pair " << pair << " (" << src[pair] << " source and "
                              << tgt[pair] << " target tokens) does not fit a batch of "
                              << max_tokens << " tokens per rank; raise "
                              << spec_.setting_names.budget
                              << " or preprocess with a smaller --max-len (of the training "
                              << "pairs) or --valid-max-len (of the validation and test ones)");
      }
    }
    sort_by_lengths(shard->order, lengths);
    shard->batch_starts = least_padded_cuts(shard->order, lengths, max_tokens);
    batches_per_epoch_ += shard->batches();
  }
  planned_budget_ = max_tokens;
}

int64_t ShardReader::batches_per_epoch(int64_t max_tokens) {
  plan(max_tokens);
  return batches_per_epoch_;
}

int64_t ShardReader::index_at_budget(const DataPosition& position, int64_t from_tokens,
                                     int64_t to_tokens) {
  plan(from_tokens);
  std::vector<int64_t> then(shards_.size());
  for (size_t s = 0; s < shards_.size(); ++s) then[s] = shards_[s]->batches();
  plan(to_tokens);
  const std::vector<int64_t> order =
      permutation(static_cast<int64_t>(shards_.size()), kShardOrderSite, 0, position.epoch);
  int64_t index = position.index, carried = 0;
  for (const int64_t s : order) {
    const int64_t now = shards_[s]->batches();
    if (index < then[s]) return carried + index * now / then[s];
    index -= then[s];
    carried += now;
  }
  return carried;  // at the epoch's end: the reader goes on into the next
}

std::vector<int64_t> ShardReader::permutation(int64_t size, uint32_t site, uint32_t stream,
                                              int64_t epoch) const {
  if (spec_.shuffle) return shuffled_order(size, spec_.seed, site, stream, epoch);
  std::vector<int64_t> order(static_cast<size_t>(size));
  std::iota(order.begin(), order.end(), 0);
  return order;
}

std::vector<int64_t> shuffled_order(int64_t size, uint64_t seed, uint32_t site,
                                    uint32_t stream, int64_t epoch) {
  std::vector<int64_t> order(static_cast<size_t>(size));
  std::iota(order.begin(), order.end(), 0);
  // Each position from the last down takes one of those at or before it: a 64-bit draw
  // (two of Philox's words), whose remainder's bias is below 2^-40 for any real size.
  for (int64_t i = size - 1; i > 0; --i) {
    const uint64_t draw =
        (static_cast<uint64_t>(philox_bits(seed, site, static_cast<uint32_t>(epoch), stream,
                                           2 * static_cast<uint64_t>(i)))
         << 32) |
        philox_bits(seed, site, static_cast<uint32_t>(epoch), stream,
                    2 * static_cast<uint64_t>(i) + 1);
    std::swap(order[i], order[draw % static_cast<uint64_t>(i + 1)]);
  }
  return order;
}

const ShardContents& ShardReader::load(int shard) {
  Shard& wanted = *shards_[shard];
  if (!wanted.contents) {
    // Streaming: drop the shard in hand before reading the next, so that one shard at a
    // time is what this rank holds.
    for (auto& other : shards_) other->contents.reset();
    std::unique_ptr<ShardContents> contents;
    try {
      contents = std::make_unique<ShardContents>(read_shard(wanted.path));
    } catch (const Error& error) {
      // It read well when the run opened it: what the user does is not what a bad corpus
      // asks for (a shard removed mid-run by a scratch purge said "no such shard file",
      // and nothing of what to do).
      THPC_FAIL(error.what() << " (the run read it when it started: removed, moved or "
                             << "damaged since; put the corpus back as it was, then continue "
                             << "the run with checkpoint.resume=auto)");
    }
    check_unchanged_since_opened(wanted.path, wanted.summary, *contents);
    wanted.contents = std::move(contents);
  }
  return *wanted.contents;
}

Batch ShardReader::assemble(int64_t epoch, int64_t index) {
  if (shard_order_epoch_ != epoch) {
    shard_order_ = permutation(static_cast<int64_t>(shards_.size()), kShardOrderSite, 0, epoch);
    shard_order_epoch_ = epoch;
  }
  int shard = -1;
  for (int64_t position : shard_order_) {
    const int64_t count = shards_[position]->batches();
    if (index < count) {
      shard = static_cast<int>(position);
      break;
    }
    index -= count;
  }
  THPC_CHECK(shard >= 0, "batch index beyond the epoch");
  if (batch_order_epoch_ != epoch || batch_order_shard_ != shard) {
    batch_order_ = permutation(shards_[shard]->batches(), kBatchOrderSite,
                               static_cast<uint32_t>(shard), epoch);
    batch_order_epoch_ = epoch;
    batch_order_shard_ = shard;
  }
  const Shard& planned = *shards_[shard];
  const int64_t batch = batch_order_[index];
  const ShardContents& contents = load(shard);
  std::vector<TokenSequence> sources, targets;
  for (int64_t i = planned.batch_starts[batch]; i < planned.batch_starts[batch + 1]; ++i) {
    const int32_t pair = planned.order[i];
    sources.push_back(contents.source.sentence(pair));
    targets.push_back(contents.target.sentence(pair));
  }
  return make_batch(sources, targets, metadata_.ids);
}

Batch ShardReader::next(int64_t max_tokens) {
  plan(max_tokens);
  const int64_t mine = position_.index + spec_.rank;
  Batch batch = assemble(position_.epoch + mine / batches_per_epoch_, mine % batches_per_epoch_);
  position_.index += spec_.ranks;
  position_.epoch += position_.index / batches_per_epoch_;
  position_.index %= batches_per_epoch_;
  return batch;
}

std::optional<Batch> ShardReader::next_in_epoch(int64_t max_tokens) {
  plan(max_tokens);
  const int64_t mine = position_.index + spec_.rank;
  if (mine >= batches_per_epoch_) return std::nullopt;
  position_.index += spec_.ranks;
  return assemble(position_.epoch, mine);
}

void ShardReader::seek(const DataPosition& position) {
  THPC_CHECK(position.epoch >= 0 && position.index >= 0,
             "data position (" << position.epoch << ", " << position.index << ")");
  position_ = position;
}

}  // namespace thpc
