// The step's gradient sums over the ranks (the [dist] keys): the transport
// (distributed/gradient_reducer.h) chosen and sized, its buckets started during the last
// micro-batch's backward, the tied embedding summed per use (dist.embedding_sum), and the
// sums' timings for the log (dist.log_buckets). The trainer's step calls it at three points
// and reads top to bottom; with one rank there is nothing to sum and every call is a no-op.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "config/config.h"
#include "data/batch.h"
#include "distributed/communicator.h"
#include "distributed/gradient_reducer.h"
#include "model/gradient_listener.h"
#include "model/transformer.h"

namespace thpc {

class GradientSums : private GradientListener {
 public:
  // `config`, `comm` and `backend` must outlive this (the trainer's own).
  GradientSums(const Config& config, const Communicator& comm, Backend& backend,
               int64_t parameters);
  ~GradientSums();

  // Whether there is anything to sum (more than one rank).
  bool active() const { return reducer_ != nullptr; }

  // Before the step's micro-batches: with the embedding summed per use, the rows any
  // rank's micro-batches look up, agreed over the ranks, and handed to the model.
  void prepare(Transformer& model, const std::vector<Batch>& micro_batches);
  // Before the last micro-batch's train_step: the listener to hand it (null with nothing
  // to sum). Its backward starts the buckets as they become final (and, per use, the
  // embedding's share as soon as the output projection's backward is done); with NCCL
  // (GradientReducer::capturable) the pass's end also queues the sums' finish, so that a
  // pass captured into a CUDA graph holds them.
  GradientListener* begin_last_pass(Transformer& model);
  // After backward: every sum complete (per use, the lookups' rows added to the
  // embedding's); on a logged step (`logged`) with dist.log_buckets, the timings line of
  // `step` is kept.
  void finish(Transformer& model, int64_t step, bool logged);
  // The kept timings line ("buckets at step N ..."), once; "" when there is none.
  std::string take_timings_line();

 private:
  // The last pass's listener (begin_last_pass).
  void gradients_final_from(int64_t offset) override { reducer_->ready_from(offset); }
  void output_projection_final() override {
    if (sum_lookups_apart_) reducer_->start_early(embedding_elements_);
  }
  void pass_end() override {
    if (finish_queued_in_pass()) reducer_->queue_finish();
  }
  bool capturable() const override { return finish_queued_in_pass(); }
  void pass_discarded() override { reducer_->restart(); }

  // Every id a lookup of this rank's micro-batches reads in the shared table (the source
  // ids too unless `source_table_apart`), sorted and distinct, then the union over the
  // ranks.
  std::vector<int32_t> rows_looked_up_by_any_rank(const std::vector<Batch>& batches,
                                                  bool source_table_apart) const;
  // Whether the last pass's end queues the sums' finish (pass_end), so that finish() only
  // waits: a capturable transport (NCCL's), the embedding not summed per use (its rows
  // join at finish()).
  bool finish_queued_in_pass() const { return reducer_->capturable() && !sum_lookups_apart_; }

  const Config& config_;
  const Communicator& comm_;
  std::unique_ptr<GradientReducer> reducer_;  // null on one rank
  // dist.embedding_sum = per_use in effect (several ranks on the CPU).
  bool sum_lookups_apart_ = false;
  // The embedding's gradient, [0, vocab x d) of the gradients: summed early per use.
  int64_t embedding_elements_ = 0;

  std::string timings_line_;
};

}  // namespace thpc
