// The shard reader's validation (src/data/shard_file): any bytes as an HDF5 shard,
// opened from memory. What read_shard_summary accepts (the checks every rank makes
// before training) read_shard must load consistently, with every id in the vocabulary.
#include "data/shard_file.h"
#include "fuzz_target.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace thpc;
  const std::string_view image = fuzz::bytes_of(data, size);
  fuzz::refused_or_read([&] {
    const ShardSummary summary = read_shard_summary_image("fuzz.h5", image);
    fuzz::require(static_cast<int64_t>(summary.source_lengths.size()) == summary.pairs &&
                      static_cast<int64_t>(summary.target_lengths.size()) == summary.pairs,
                  "a length per pair");
    const ShardContents contents = read_shard_image("fuzz.h5", image);
    for (const TokenColumn* column : {&contents.source, &contents.target}) {
      fuzz::require(column->sentences() == summary.pairs, "the summary's pair count");
      fuzz::require(column->offsets.back() == static_cast<int64_t>(column->tokens.size()),
                    "offsets end at the token count");
      for (const int32_t id : column->tokens) {
        fuzz::require(id >= 0 && id < contents.metadata.vocab_size, "ids in the vocabulary");
      }
    }
  });
  fuzz::require_no_open_hdf5_objects();
  return 0;
}
