// The step's gradient sums (gradient_sums.h).
#include "train/gradient_sums.h"

#include <algorithm>

#include "common/error.h"

namespace thpc {

GradientSums::GradientSums(const Config& config, const Communicator& comm, Backend& backend,
                           int64_t parameters)
    : config_(config), comm_(comm) {
  // One rank sums nothing, unless it is asked to time NCCL's buckets (dist.log_buckets on
  // a GPU, dist.reducer not mpi): then its sums run as an N-rank job's do, each an
  // all-reduce of one rank (in place: NCCL moves nothing, the same bits), so that one GPU
  // measures by CUDA events when each bucket's collective is posted against backward, the
  // schedule an N-rank job's transfers would follow (issue 52; MPI needs two ranks, and
  // NCCL refuses two on one GPU).
  const bool time_one_rank = config_.dist.log_buckets && !backend.host_memory() &&
                             config_.dist.reducer != "mpi";
  if (comm_.size() == 1 && !time_one_rank) return;
  // A bucket larger than every gradient is one bucket: bounded before the conversion
  // (dist.bucket_mb = 1e30 overflowed int64, undefined behaviour), and at least a byte.
  const double bucket_limit = static_cast<double>(parameters) * 8.0 + 1.0;
  const int64_t bucket_bytes = static_cast<int64_t>(
      std::clamp(config_.dist.bucket_mb * 1024.0 * 1024.0, 1.0, bucket_limit));
  const bool bf16 = config_.dist.reduce_dtype == "bf16";
  if (backend.host_memory()) {
    reducer_ = make_mpi_gradient_reducer(comm_, bucket_bytes, config_.dist.timeout_s, bf16);
  } else if (config_.dist.reducer == "mpi") {
    reducer_ = make_staged_mpi_gradient_reducer(comm_, backend, bucket_bytes,
                                                config_.dist.timeout_s, bf16);
  } else {
    reducer_ = make_nccl_gradient_reducer(comm_, backend, bucket_bytes, config_.dist.timeout_s,
                                          bf16);
  }
  // Rank 0 logs its own sums' timings (every rank issues the same sums).
  if (config_.dist.log_buckets && comm_.is_root()) reducer_->time_passes();
  // The embedding's sum per use: auto takes it on the CPU; on the GPU it is asked for by
  // name (dist.embedding_sum = per_use) until a GPU run has shown it there.
  sum_lookups_apart_ = config_.dist.embedding_sum == "per_use" ||
                       (config_.dist.embedding_sum == "auto" && backend.host_memory());
}

GradientSums::~GradientSums() = default;

void GradientSums::prepare(Transformer& model, const std::vector<Batch>& micro_batches) {
  if (sum_lookups_apart_) {
    model.sum_lookups_apart(
        rows_looked_up_by_any_rank(micro_batches, model.separate_source_embedding()));
  }
}

GradientListener* GradientSums::begin_last_pass(Transformer& model) {
  if (!reducer_) return nullptr;
  reducer_->begin(model.params().grads());
  if (sum_lookups_apart_) {
    // The embedding's gradient is the first entry: [0, vocab x d).
    const ParamEntry& entry = model.params().entry("embed.weight");
    THPC_CHECK(entry.offset == 0, "the embedding at offset " << entry.offset);
    embedding_elements_ = entry.numel();
  }
  // A transport whose work is all stream work (NCCL's) queues its finish at the pass's
  // end, inside it (pass_end): a pass captured into a graph then holds its sums whole,
  // and finish() only waits. The embedding's rows summed per use join at finish(): not so.
  return this;
}

void GradientSums::finish(Transformer& model, int64_t step, bool logged) {
  if (!reducer_) return;
  // NCCL's failure (dist.timeout_s passed: a rank stopped, hung or lost) says in which
  // step, as the step's other collectives do. MPI's transports do not throw there: their
  // wait ends the job itself, its message led by the step's Communicator::WaitLimit.
  const auto naming_the_step = [step](const auto& wait) {
    try {
      wait();
    } catch (const Error& e) {
      throw Error("step " + std::to_string(step) + ": " + e.what());
    }
  };
  if (finish_queued_in_pass()) {  // queued by the pass (pass_end): only the wait is left
    naming_the_step([&] { reducer_->await_finish(); });
    return;
  }
  // Per use: the lookups' rows are summed with the last buckets, then added to the
  // embedding's summed share.
  const Tensor lookups = sum_lookups_apart_ ? model.lookup_gradient_rows() : Tensor{};
  if (lookups) reducer_->sum_at_finish(lookups);
  naming_the_step([&] { reducer_->finish(); });
  if (lookups) model.add_lookup_gradient_rows(lookups);
  if (!reducer_->timings().buckets.empty() && logged) {
    timings_line_ = "buckets at step " + std::to_string(step) + " " +
                    timings_text(reducer_->timings(), dtype_size(model.params().grads().dtype));
  }
}

std::string GradientSums::take_timings_line() {
  std::string line;
  line.swap(timings_line_);
  return line;
}

std::vector<int32_t> GradientSums::rows_looked_up_by_any_rank(
    const std::vector<Batch>& batches, bool source_table_apart) const {
  // pad included: its rows are looked up too.
  std::vector<int32_t> mine;
  for (const Batch& batch : batches) {
    if (!source_table_apart) mine.insert(mine.end(), batch.src.begin(), batch.src.end());
    mine.insert(mine.end(), batch.tgt_in.begin(), batch.tgt_in.end());
  }
  std::sort(mine.begin(), mine.end());
  mine.erase(std::unique(mine.begin(), mine.end()), mine.end());
  const std::string bytes(reinterpret_cast<const char*>(mine.data()),
                          mine.size() * sizeof(int32_t));
  std::vector<int32_t> all;
  for (const std::string& theirs : comm_.all_gather(bytes)) {
    const auto* ids = reinterpret_cast<const int32_t*>(theirs.data());
    all.insert(all.end(), ids, ids + theirs.size() / sizeof(int32_t));
  }
  std::sort(all.begin(), all.end());
  all.erase(std::unique(all.begin(), all.end()), all.end());
  return all;
}

}  // namespace thpc
