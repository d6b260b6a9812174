#include "distributed/gradient_reducer.h"

#include <algorithm>
#include <iomanip>
#include <map>
#include <sstream>

#include "common/error.h"

namespace thpc {

void GradientReducer::begin(Tensor grads) {
  grads_ = grads;
  pending_end_ = grads.numel;
  buckets_started_ = 0;
  if (timing_) {
    pass_start_ = std::chrono::steady_clock::now();
    timings_ = ReductionTimings{};
    begin_timing();
  }
}

void GradientReducer::ready_from(int64_t offset) {
  THPC_CHECK(grads_, "ready_from() outside begin()/finish()");
  const int64_t element = static_cast<int64_t>(dtype_size(grads_.dtype));
  const int64_t bucket = std::max<int64_t>(1, bucket_bytes_ / element);
  // Whole buckets only: the last (lowest) one is whatever remains at finish().
  while (pending_end_ - bucket >= std::max<int64_t>(offset, 0) && pending_end_ - bucket > 0) {
    start_bucket(pending_end_ - bucket, bucket);
    pending_end_ -= bucket;
  }
  progress();
}

void GradientReducer::finish() {
  THPC_CHECK(grads_, "finish() without begin()");
  if (timing_) timings_.backward_done_ms = host_ms();
  ready_from(0);
  if (pending_end_ > 0) {
    start_bucket(0, pending_end_);
    pending_end_ = 0;
  }
  complete();
  if (timing_) {
    timings_.sums_done_ms = host_ms();
    for (BucketTiming& bucket : timings_.buckets) {
      if (bucket.done_ms < 0.0) bucket.done_ms = timings_.sums_done_ms;
    }
    finish_timings(timings_);
  }
  grads_ = Tensor{};
}

void GradientReducer::bucket_done(size_t index) {
  if (timing_ && index < timings_.buckets.size() && timings_.buckets[index].done_ms < 0.0) {
    timings_.buckets[index].done_ms = host_ms();
  }
}

double GradientReducer::host_ms() const {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - pass_start_)
      .count();
}

void GradientReducer::start_bucket(int64_t offset, int64_t elements) {
  if (timing_) timings_.buckets.push_back({offset, elements, host_ms(), -1.0});
  start(grads_.slice(offset, elements));
  ++buckets_started_;
}

std::string timings_text(const ReductionTimings& timings, size_t element_bytes) {
  std::ostringstream text;
  text << std::fixed << std::setprecision(2) << "(ms from the last micro-batch's start, "
       << (timings.device_clock ? "GPU events" : "host clock")
       << "): backward done " << timings.backward_done_ms << ", sums done "
       << timings.sums_done_ms << ", exposed "
       << std::max(0.0, timings.sums_done_ms - timings.backward_done_ms) << "; "
       << timings.buckets.size() << " buckets (MiB posted done):";
  for (const BucketTiming& bucket : timings.buckets) {
    text << " | " << std::setprecision(3)
         << static_cast<double>(bucket.elements) * static_cast<double>(element_bytes) /
                (1024.0 * 1024.0)
         << std::setprecision(2) << " " << bucket.posted_ms << " " << bucket.done_ms;
  }
  return text.str();
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
