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
  floor_ = 0;
  extras_.clear();
  buckets_started_ = 0;
  if (timing_) {
    pass_start_ = std::chrono::steady_clock::now();
    timings_ = ReductionTimings{};
    begin_timing();
  }
}

void GradientReducer::restart() {
  THPC_CHECK(grads_, "restart() outside begin()/finish()");
  discard_started();
  begin(grads_);
}

int64_t GradientReducer::bucket_elements() const {
  return std::max<int64_t>(1, bucket_bytes_ / static_cast<int64_t>(dtype_size(grads_.dtype)));
}

void GradientReducer::start_early(int64_t end) {
  THPC_CHECK(grads_, "start_early() outside begin()/finish()");
  THPC_CHECK(floor_ == 0 && pending_end_ == grads_.numel && end > 0 && end <= grads_.numel,
             "start_early(" << end << ") once a pass, before the watermark's buckets");
  const int64_t bucket = bucket_elements();
  for (int64_t top = end; top > 0; top -= bucket) {
    const int64_t bottom = std::max<int64_t>(0, top - bucket);
    start_bucket(bottom, top - bottom);
  }
  floor_ = end;
  progress();
}

void GradientReducer::sum_at_finish(Tensor extra) {
  THPC_CHECK(grads_, "sum_at_finish() outside begin()/finish()");
  extras_.push_back(extra);
}

int GradientReducer::tensor_apart(Tensor tensor) const {
  for (size_t i = 0; i < extras_.size(); ++i) {
    if (extras_[i].data == tensor.data) return static_cast<int>(i);
  }
  return -1;
}

void GradientReducer::ready_from(int64_t offset) {
  THPC_CHECK(grads_, "ready_from() outside begin()/finish()");
  const int64_t bucket = bucket_elements();
  // Whole buckets only: the last (lowest) one is whatever remains at finish().
  while (pending_end_ - bucket >= std::max(offset, floor_) && pending_end_ - bucket > floor_) {
    start_bucket(pending_end_ - bucket, bucket);
    pending_end_ -= bucket;
  }
  progress();
}

void GradientReducer::finish() {
  queue_finish();
  await_finish();
}

void GradientReducer::queue_finish() {
  THPC_CHECK(grads_, "finish() without begin()");
  if (timing_) timings_.backward_done_ms = host_ms();
  ready_from(0);
  if (pending_end_ > floor_) {
    start_bucket(floor_, pending_end_ - floor_);
    pending_end_ = floor_;
  }
  for (const Tensor& extra : extras_) post(extra, -1);
  queue_complete();
}

void GradientReducer::await_finish() {
  THPC_CHECK(grads_, "finish() without begin()");
  await_complete();
  extras_.clear();
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
  post(grads_.slice(offset, elements), offset);
}

void GradientReducer::post(Tensor bucket, int64_t offset) {
  if (timing_) timings_.buckets.push_back({offset, bucket.numel, host_ms(), -1.0});
  start(bucket);
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
