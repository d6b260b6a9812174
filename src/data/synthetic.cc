#include "data/synthetic.h"

#include <algorithm>
#include <ostream>

#include "common/error.h"
#include "common/philox.h"

namespace thpc {
namespace {

// Philox sites of the synthetic generator, apart from dropout and initialisation.
constexpr uint32_t kSyntheticSite = 0x20000000u;
// One pair in ten goes to the held-out split.
constexpr uint64_t kHeldOutModulus = 10;

uint64_t fnv1a(const TokenSequence& tokens) {
  uint64_t hash = 1469598103934665603ull;
  for (int32_t token : tokens) {
    hash ^= static_cast<uint32_t>(token);
    hash *= 1099511628211ull;
  }
  return hash;
}

}  // namespace

SyntheticTask parse_synthetic_task(const std::string& name) {
  if (name == "reverse") return SyntheticTask::Reverse;
  if (name == "copy") return SyntheticTask::Copy;
  if (name == "sort") return SyntheticTask::Sort;
  THPC_FAIL("unknown synthetic task '" << name << "' (reverse | copy | sort)");
}

void SyntheticSource::print_notes(std::ostream& log, const std::string& what) const {
  if (spec_.split != SyntheticSplit::Train) return;
  const char* task = spec_.task == SyntheticTask::Reverse ? "reverse"
                     : spec_.task == SyntheticTask::Copy  ? "copy"
                                                          : "sort";
  log << what << ": the synthetic task, as data.dir is empty: " << task << " sequences of "
      << spec_.min_len << "-" << spec_.max_len << " tokens, vocabulary " << spec_.vocab
      << " (data.synthetic); to train on a corpus, set data.dir to transformer_preprocess's "
      << "--destdir" << std::endl;
}

TokenSequence synthetic_target(SyntheticTask task, const TokenSequence& source) {
  TokenSequence target = source;
  switch (task) {
    case SyntheticTask::Reverse: std::reverse(target.begin(), target.end()); break;
    case SyntheticTask::Copy: break;
    case SyntheticTask::Sort: std::sort(target.begin(), target.end()); break;
  }
  return target;
}

SyntheticSource::SyntheticSource(const SyntheticSpec& spec) : spec_(spec) {
  const SpecialIds ids;
  THPC_CHECK(spec.vocab > ids.eos + 1, "synthetic vocabulary " << spec.vocab
                                       << " has no room beside the 4 special ids");
  THPC_CHECK(spec.min_len >= 1 && spec.min_len <= spec.max_len,
             "synthetic lengths [" << spec.min_len << ", " << spec.max_len << "]");
  THPC_CHECK(spec.shards >= 1 && spec.shard >= 0 && spec.shard < spec.shards,
             "synthetic shard " << spec.shard << " of " << spec.shards);
}

TokenSequence SyntheticSource::candidate(int64_t index) const {
  // Element 0 of the candidate's stream draws its length, elements 1.. its symbols.
  const uint32_t stream = static_cast<uint32_t>(index);
  const uint32_t step = static_cast<uint32_t>(index >> 32);
  const int span = spec_.max_len - spec_.min_len + 1;
  const int length =
      spec_.min_len + static_cast<int>(philox_bits(spec_.seed, kSyntheticSite, step, stream, 0) %
                                       static_cast<uint32_t>(span));
  const int first_symbol = SpecialIds{}.eos + 1;
  const uint32_t symbols = static_cast<uint32_t>(spec_.vocab - first_symbol);
  TokenSequence tokens(length);
  for (int i = 0; i < length; ++i) {
    tokens[i] = first_symbol + static_cast<int32_t>(
                                   philox_bits(spec_.seed, kSyntheticSite, step, stream, i + 1) %
                                   symbols);
  }
  return tokens;
}

bool SyntheticSource::in_split(const TokenSequence& source) const {
  const bool held_out = fnv1a(source) % kHeldOutModulus == 0;
  return held_out == (spec_.split == SyntheticSplit::HeldOut);
}

TokenSequence SyntheticSource::next_source() {
  while (true) {
    TokenSequence source = candidate(cursor_++);
    if (in_split(source)) return source;
  }
}

Batch SyntheticSource::next(int64_t max_tokens) {
  // Of each group of `shards` consecutive batches, this rank keeps number `shard`. All
  // ranks pack with the same budget, so they agree on where every batch starts.
  Batch mine;
  for (int s = 0; s < spec_.shards; ++s) {
    Batch batch = next_of_stream(max_tokens);
    if (s == spec_.shard) mine = std::move(batch);
  }
  return mine;
}

Batch SyntheticSource::next_of_stream(int64_t max_tokens) {
  // Pack pairs in stream order while the padded batch stays within the budget on both
  // sides (a target is as long as its source in these tasks, plus bos/eos).
  std::vector<TokenSequence> sources, targets;
  int64_t longest = 0;
  while (true) {
    const int64_t cursor_before = cursor_;
    TokenSequence source = next_source();
    const int64_t padded_len = std::max<int64_t>(longest, static_cast<int64_t>(source.size()) + 1);
    if (!sources.empty() && padded_len * static_cast<int64_t>(sources.size() + 1) > max_tokens) {
      cursor_ = cursor_before;  // this pair starts the next batch
      break;
    }
    longest = padded_len;
    targets.push_back(synthetic_target(spec_.task, source));
    sources.push_back(std::move(source));
  }
  return make_batch(sources, targets, SpecialIds{});
}

}  // namespace thpc
