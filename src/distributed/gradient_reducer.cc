#include "distributed/gradient_reducer.h"

#include <algorithm>
#include <map>

#include "common/error.h"

namespace thpc {

void GradientReducer::begin(Tensor grads) {
  grads_ = grads;
  pending_end_ = grads.numel;
  buckets_started_ = 0;
}

void GradientReducer::ready_from(int64_t offset) {
  THPC_CHECK(grads_, "ready_from() outside begin()/finish()");
  const int64_t element = static_cast<int64_t>(dtype_size(grads_.dtype));
  const int64_t bucket = std::max<int64_t>(1, bucket_bytes_ / element);
  // Whole buckets only: the last (lowest) one is whatever remains at finish().
  while (pending_end_ - bucket >= std::max<int64_t>(offset, 0) && pending_end_ - bucket > 0) {
    start(grads_.slice(pending_end_ - bucket, bucket));
    pending_end_ -= bucket;
    ++buckets_started_;
  }
  progress();
}

void GradientReducer::finish() {
  THPC_CHECK(grads_, "finish() without begin()");
  ready_from(0);
  if (pending_end_ > 0) {
    start(grads_.slice(0, pending_end_));
    pending_end_ = 0;
    ++buckets_started_;
  }
  complete();
  grads_ = Tensor{};
}

std::pair<int, int> first_ranks_sharing_a_place(const std::vector<std::string>& places) {
  std::map<std::string, int> first_rank_at;
  for (int rank = 0; rank < static_cast<int>(places.size()); ++rank) {
    const auto [where, fresh] = first_rank_at.emplace(places[rank], rank);
    if (!fresh) return {where->second, rank};
  }
  return {-1, -1};
}

}  // namespace thpc
