#include "data/batch.h"

#include <algorithm>

#include "common/error.h"

namespace thpc {

int64_t Batch::src_tokens() const {
  int64_t total = 0;
  for (int32_t n : src_lengths) total += n;
  return total;
}

int64_t Batch::tgt_tokens() const {
  int64_t total = 0;
  for (int32_t n : tgt_lengths) total += n;
  return total;
}

Batch make_batch(const std::vector<TokenSequence>& sources,
                 const std::vector<TokenSequence>& targets, const SpecialIds& ids) {
  THPC_CHECK(sources.size() == targets.size(),
             sources.size() << " sources but " << targets.size() << " targets");
  THPC_CHECK(!sources.empty(), "empty batch");
  Batch batch;
  batch.size = static_cast<int>(sources.size());
  for (size_t i = 0; i < sources.size(); ++i) {
    batch.src_len = std::max(batch.src_len, static_cast<int>(sources[i].size()) + 1);
    batch.tgt_len = std::max(batch.tgt_len, static_cast<int>(targets[i].size()) + 1);
  }
  batch.src.assign(static_cast<size_t>(batch.size) * batch.src_len, ids.pad);
  batch.tgt_in.assign(static_cast<size_t>(batch.size) * batch.tgt_len, ids.pad);
  batch.tgt_out.assign(static_cast<size_t>(batch.size) * batch.tgt_len, ids.pad);
  for (int b = 0; b < batch.size; ++b) {
    const TokenSequence& x = sources[b];
    const TokenSequence& y = targets[b];
    int32_t* src_row = batch.src.data() + static_cast<size_t>(b) * batch.src_len;
    std::copy(x.begin(), x.end(), src_row);
    src_row[x.size()] = ids.eos;
    int32_t* in_row = batch.tgt_in.data() + static_cast<size_t>(b) * batch.tgt_len;
    int32_t* out_row = batch.tgt_out.data() + static_cast<size_t>(b) * batch.tgt_len;
    in_row[0] = ids.bos;
    std::copy(y.begin(), y.end(), in_row + 1);
    std::copy(y.begin(), y.end(), out_row);
    out_row[y.size()] = ids.eos;
    batch.src_lengths.push_back(static_cast<int32_t>(x.size()) + 1);
    batch.tgt_lengths.push_back(static_cast<int32_t>(y.size()) + 1);
  }
  return batch;
}

}  // namespace thpc
