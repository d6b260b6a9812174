#include "train/trainer.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cmath>
#include <iomanip>
#include <optional>
#include <ostream>
#include <sstream>

#include "common/error.h"
#include "data/synthetic.h"
#include "kernels/cpu/cpu_backend.h"
#include "train/lr_schedule.h"

namespace thpc {

std::unique_ptr<Backend> make_backend(const TrainConfig& train) {
  if (train.backend == "auto" || train.backend == "cpu") {
    if (train.threads > 0) set_cpu_threads(train.threads);
    return make_cpu_backend(DType::F32);
  }
  THPC_FAIL("train.backend: unknown backend '" << train.backend << "'");
}

namespace {

std::unique_ptr<ShardReader> make_shard_reader(const Config& config, const std::string& prefix,
                                               bool shuffle, int shard, int shards) {
  ShardReaderSpec spec;
  spec.files = find_shards(config.data.dir, prefix);
  spec.seed = config.train.seed;
  spec.shuffle = shuffle;
  spec.rank = shard;
  spec.ranks = shards;
  spec.memory_budget_bytes = static_cast<int64_t>(config.data.memory_mb) << 20;
  return std::make_unique<ShardReader>(spec);
}

}  // namespace

std::unique_ptr<ShardReader> make_validation_source(const Config& config, int shard,
                                                    int shards) {
  return make_shard_reader(config, config.data.valid, /*shuffle=*/false, shard, shards);
}

std::unique_ptr<BatchSource> make_training_source(const Config& config, int shard,
                                                  int shards) {
  if (!config.data.dir.empty()) {
    return make_shard_reader(config, config.data.train, /*shuffle=*/true, shard, shards);
  }
  SyntheticSpec spec;
  spec.task = parse_synthetic_task(config.data.synthetic);
  spec.vocab = config.data.synthetic_vocab;
  spec.min_len = config.data.synthetic_min_len;
  spec.max_len = config.data.synthetic_max_len;
  spec.seed = config.train.seed;
  spec.split = SyntheticSplit::Train;
  spec.shard = shard;
  spec.shards = shards;
  return std::make_unique<SyntheticSource>(spec);
}

int resolve_vocab_size(const Config& config, const BatchSource& source) {
  const int data_vocab = source.vocab_size();
  if (config.model.vocab_size > 0 && config.model.vocab_size != data_vocab) {
    THPC_FAIL(config.source_file << ": model.vocab_size is " << config.model.vocab_size
                                 << " but the training data has a vocabulary of " << data_vocab
                                 << " (set 0 to take the data's)");
  }
  return data_vocab;
}

namespace {

// Fault injection for the tests of job failure: THPC_FAIL_AT=RANK:STEP makes that rank
// throw at the start of that step, as a real fault (an out-of-memory, a bad file) would.
void maybe_inject_failure(const Communicator& comm, int64_t step) {
  static const char* spec = std::getenv("THPC_FAIL_AT");
  if (spec == nullptr) return;
  int rank = -1;
  long long at_step = -1;
  if (std::sscanf(spec, "%d:%lld", &rank, &at_step) == 2 && rank == comm.rank() &&
      at_step == step) {
    THPC_FAIL("failure injected by THPC_FAIL_AT=" << spec << " at step " << step);
  }
}

}  // namespace

Trainer::Trainer(const Config& config, Communicator comm)
    : config_(config), comm_(std::move(comm)) {
  backend_ = make_backend(config_.train);
  THPC_CHECK(comm_.size() == 1 || backend_->host_memory(),
             "the " << backend_->name() << " backend has no gradient all-reduce yet");
  source_ = make_training_source(config_, comm_.rank(), comm_.size());
  const int vocab = resolve_vocab_size(config_, *source_);
  if (config_.train.valid_every > 0) {
    valid_source_ = make_validation_source(config_, comm_.rank(), comm_.size());
    // Both come from data.dir (validate() requires it), so the training source is a reader.
    const ShardReader& train_reader = static_cast<const ShardReader&>(*source_);
    if (valid_source_->metadata().spm_model != train_reader.metadata().spm_model) {
      THPC_FAIL(config_.data.dir << ": the " << config_.data.valid << " shards have another "
                                 << "vocabulary than the " << config_.data.train << " shards");
    }
  }
  // Each rank's micro-batch is the step's budget divided over ranks and micro-batches.
  micro_budget_ = std::max<int64_t>(
      1, config_.train.tokens_per_step /
             (static_cast<int64_t>(config_.train.accumulate) * comm_.size()));
  model_ = std::make_unique<Transformer>(config_.model, vocab, source_->special_ids(), *backend_,
                                         config_.train.seed);
  AdamSettings adam;
  adam.beta1 = config_.train.adam_beta1;
  adam.beta2 = config_.train.adam_beta2;
  adam.eps = config_.train.adam_eps;
  adam_ = std::make_unique<Adam>(model_->params(), *backend_, adam);
}

Trainer::~Trainer() = default;

StepStats Trainer::step() {
  const int64_t step = completed_steps_ + 1;
  maybe_inject_failure(comm_, step);
  // Gather the step's micro-batches first: the loss is normalised by the step's target
  // tokens over all ranks and micro-batches, so every micro-batch's gradient is scaled by
  // 1 / total; the sum over micro-batches and ranks is then the gradient of the
  // per-token mean loss of the whole step.
  const int accumulate = config_.train.accumulate;
  std::vector<Batch> micro_batches;
  StepStats stats;
  stats.step = step;
  for (int i = 0; i < accumulate; ++i) {
    micro_batches.push_back(source_->next(micro_budget_));
    stats.src_tokens += micro_batches.back().src_tokens();
    stats.local_tgt_tokens += micro_batches.back().tgt_tokens();
  }
  stats.micro_batches = accumulate;
  stats.src_tokens = comm_.sum(stats.src_tokens);
  stats.tgt_tokens = comm_.sum(stats.local_tgt_tokens);

  backend_->zero(model_->params().grads());
  const float grad_scale = 1.0f / static_cast<float>(stats.tgt_tokens);
  LossSums total;
  for (int i = 0; i < accumulate; ++i) {
    DropoutContext dropout;
    dropout.seed = config_.train.seed;
    dropout.step = static_cast<uint32_t>(step);
    // Micro-batch i of rank r draws the masks that micro-batch r * accumulate + i of a
    // single rank accumulating over all of them would draw.
    dropout.stream = static_cast<uint32_t>(comm_.rank() * accumulate + i);
    const LossSums sums = model_->train_step(micro_batches[i], grad_scale, dropout);
    total.loss += sums.loss;
    total.nll += sums.nll;
  }
  // Sum the gradients over ranks (each already scaled by 1 / global tokens).
  comm_.sum_in_place(model_->params().grads(),
                     static_cast<int64_t>(config_.dist.bucket_mb * 1024.0 * 1024.0));
  stats.lr = learning_rate(step, config_.model.d_model, config_.train.warmup_steps,
                           config_.train.lr_scale);
  adam_->update(static_cast<float>(stats.lr), step);
  stats.loss = comm_.sum(total.loss) / static_cast<double>(stats.tgt_tokens);
  stats.nll = comm_.sum(total.nll) / static_cast<double>(stats.tgt_tokens);
  THPC_CHECK(std::isfinite(stats.loss), "the loss of step " << step << " is " << stats.loss);
  completed_steps_ = step;
  return stats;
}

ValidationStats Trainer::validate() {
  THPC_CHECK(valid_source_ != nullptr, "validation without validation shards");
  valid_source_->seek(DataPosition{});
  LossSums sums;
  while (std::optional<Batch> batch = valid_source_->next_in_epoch(micro_budget_)) {
    const LossSums batch_sums = model_->evaluate(*batch);
    sums.loss += batch_sums.loss;
    sums.nll += batch_sums.nll;
    sums.tokens += batch_sums.tokens;
  }
  ValidationStats stats;
  stats.tgt_tokens = comm_.sum(sums.tokens);
  stats.loss = comm_.sum(sums.loss) / static_cast<double>(stats.tgt_tokens);
  stats.nll = comm_.sum(sums.nll) / static_cast<double>(stats.tgt_tokens);
  return stats;
}

void Trainer::run(std::ostream& log) {
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  auto interval_start = start;
  int64_t interval_tokens = 0;
  StepStats last;
  const bool logs = comm_.is_root();
  if (logs) {
    log << "training " << model_->params().count() << " parameters on " << backend_->name()
        << " for " << config_.train.max_steps << " steps on " << comm_.size() << " rank"
        << (comm_.size() > 1 ? "s" : "") << std::endl;
  }
  while (completed_steps_ < config_.train.max_steps) {
    last = step();
    interval_tokens += last.src_tokens + last.tgt_tokens;
    if (logs &&
        (last.step % config_.train.log_every == 0 || last.step == config_.train.max_steps)) {
      const auto now = Clock::now();
      const double interval = std::chrono::duration<double>(now - interval_start).count();
      const double elapsed = std::chrono::duration<double>(now - start).count();
      const double eta = elapsed / last.step * (config_.train.max_steps - last.step);
      std::ostringstream line;
      line << "step " << last.step << "/" << config_.train.max_steps << " | loss "
           << std::fixed << std::setprecision(4) << last.loss << " | ppl "
           << std::setprecision(2) << std::exp(last.nll) << " | lr " << std::scientific
           << std::setprecision(3) << last.lr << std::fixed << std::setprecision(0)
           << " | tokens/s " << interval_tokens / std::max(interval, 1e-9) << " | elapsed "
           << std::setprecision(1) << elapsed << "s | eta " << eta << "s";
      log << line.str() << std::endl;
      interval_start = now;
      interval_tokens = 0;
    }
    if (valid_source_ &&
        (last.step % config_.train.valid_every == 0 || last.step == config_.train.max_steps)) {
      const ValidationStats valid = validate();
      if (logs) {
        std::ostringstream line;
        line << "valid step " << last.step << " | loss " << std::fixed << std::setprecision(4)
             << valid.loss << " | ppl " << std::setprecision(2) << std::exp(valid.nll)
             << " | target tokens " << valid.tgt_tokens;
        log << line.str() << std::endl;
      }
    }
  }
  // Every rank applied the same update to the same parameters; a difference would mean
  // a broken all-reduce, so check before declaring the result.
  const std::string digest = model_->params().sha256_hex();
  const std::vector<std::string> digests = comm_.all_gather(digest);
  for (size_t r = 0; r < digests.size(); ++r) {
    THPC_CHECK(digests[r] == digest, "the parameters of rank " << r << " differ from rank "
                                     << comm_.rank() << "'s after " << completed_steps_
                                     << " steps");
  }
  if (logs) {
    log << "final: step=" << completed_steps_ << " loss=" << std::fixed << std::setprecision(6)
        << last.loss << " params_sha256=" << digest << std::endl;
  }
}

}  // namespace thpc
