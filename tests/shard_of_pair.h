// Which training shard transformer_preprocess gives kept pair `pair` of `kept`, stated
// pair by pair (the program builds each shard's ranges: dealt_pairs in
// src/data/preprocess.cc): in the full rounds of `shards` runs of `run` pairs, its run's
// turn; after them, the shard whose equal consecutive slice of the rest holds it.
#pragma once

#include <cstdint>

namespace thpc {

inline int shard_of_pair(int64_t pair, int64_t kept, int shards, int64_t run) {
  const int64_t dealt = kept / (run * shards) * (run * shards);
  if (pair < dealt) return static_cast<int>(pair / run % shards);
  const int64_t rest = kept - dealt;
  int shard = 0;
  while (pair - dealt >= rest * (shard + 1) / shards) ++shard;
  return shard;
}

}  // namespace thpc
