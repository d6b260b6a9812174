#include "train/trainer.h"

#include <algorithm>
#include <exception>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <iomanip>
#include <optional>
#include <ostream>
#include <set>
#include <sstream>

#include <unistd.h>

#include <random>

#include "checkpoint/checkpoint_directory.h"
#include "common/cores.h"
#include "common/error.h"
#include "common/sha256.h"
#include "common/source_version.h"
#include "distributed/rank_failures.h"
#include "io/atomic_file.h"
#include "train/footprint.h"
#include "train/idle_settings.h"
#include "train/lr_schedule.h"
#include "train/rank_agreement.h"
#include "train/resume.h"
#include "train/run_progress.h"
#include "train/run_directory.h"
#include "train/run_log.h"
#include "train/stop_request.h"
#include "train/test_hooks.h"
#include "train/training_setup.h"
#include "train/validation.h"

namespace thpc {

namespace {

// Why a step diverged, in words: this rank's `verdict` described (its numbers) when it is
// the kind every rank agreed on, as it is where all ranks judge the same summed loss and
// norm; else the agreed kind's name.
std::string divergence_reason(const DivergenceDetector& detector, const DivergenceVerdict& verdict,
                              DivergenceKind agreed) {
  return verdict.kind == agreed ? detector.describe(verdict) : divergence_name(agreed);
}

// A new run's id: 16 hex digits of the sha256 of the host, the process, the time and 64
// random bits, so that two runs started anywhere at any time do not share one.
std::string new_run_id() {
  std::random_device random;
  std::ostringstream seed;
  seed << process_identity() << ' ' << ::getpid() << ' '
       << std::chrono::system_clock::now().time_since_epoch().count() << ' ' << random() << ' '
       << random();
  const std::string text = seed.str();
  return sha256_hex(text.data(), text.size()).substr(0, 16);
}

// "stopped before training: SIGTERM received during start-up; step=N, nothing to save":
// the last line of a run that a stop signal ended before its first step.
std::string stopped_before_training_line(int signal, int64_t step) {
  return std::string("stopped before training: ") + stop_signal_name(signal) +
         " received during start-up; step=" + std::to_string(step) + ", nothing to save";
}

// True (after its stopped_before_training_line) when any rank has seen a stop signal.
bool stopped_before_training(const Communicator& comm, int64_t step, std::ostream& log) {
  const int signal = stop_signal_of_any_rank(comm);
  if (signal == 0) return false;
  log << stopped_before_training_line(signal, step) << std::endl;
  if (comm.is_root()) record_stop_before_training(signal);
  return true;
}

// "stopping at step N: train.max_minutes = M of training reached".
void note_time_limit_stop(int64_t step, const TrainConfig& train, std::ostream& out) {
  out << "stopping at step " << step << ": train.max_minutes = " << train.max_minutes
      << " of training reached" << std::endl;
}

// A warning line when dist.bucket_mb cuts the gradient of `parameters` into more than
// kManyBuckets collectives a step (3e-6 MiB made a step of 0.02 s take 17 s).
constexpr double kManyBuckets = 1000;
void warn_of_many_buckets(const DistConfig& dist, int64_t parameters, std::ostream& log) {
  const double gradient_bytes = 4.0 * static_cast<double>(parameters);
  const double buckets = std::ceil(gradient_bytes / (dist.bucket_mb * 1024.0 * 1024.0));
  if (buckets <= kManyBuckets) return;
  log << "warning: dist.bucket_mb = " << dist.bucket_mb << " cuts the "
      << std::fixed << std::setprecision(1) << gradient_bytes / (1024.0 * 1024.0)
      << " MiB gradient into " << std::setprecision(0) << buckets << " buckets, one collective "
      << "each, every step: each costs tens of microseconds whatever its size (the default "
      << "25 MiB gives " << std::ceil(gradient_bytes / (25.0 * 1024.0 * 1024.0)) << ")"
      << std::endl;
}

// After a resume: a best.h5 that does not verify is moved aside (best.h5.corrupt) by rank
// 0 with a warning, and every rank drops the run's best value of checkpoint.keep_best
// (`best`), so that the next validation writes best.h5 again (a damaged best.h5 stayed,
// and the summary went on reporting its score) and checkpoint.patience cannot part them.
void drop_a_damaged_best_checkpoint(const Communicator& comm, CheckpointKeeping& keeping,
                                    const std::string& metric, ValidationRecord& best,
                                    std::ostream& log) {
  const bool moved = comm.is_root() && keeping.move_aside_a_damaged_best(log);
  if (comm.broadcast_from_root(static_cast<int64_t>(moved)) == 0) return;
  best.of(metric) = BestValidation{};
}

// Start-up's collectives wait for ranks whose work differs by a checkpoint's or a corpus's
// reading (rank 0 chooses the checkpoint and checks it alone): counted from the last sign
// of work, which those reads give as they go (common/still_working.h), so that a rank
// stopped or hung there ends the job after dist.timeout_s rather than hold every GPU of
// it until the time limit, and a rank reading slowly does not.
Communicator::WaitLimit start_up_limit(const Communicator& comm, const Config& config) {
  return Communicator::WaitLimit(
      comm, config.dist.timeout_s, "start-up", Communicator::WaitFrom::kLastSignOfWork,
      "start the job again",
      "a rank slower at start-up, as one reading a large checkpoint or corpus from a slow "
      "file system, or on a busy node");
}

}  // namespace

StoppedDuringStartUp::StoppedDuringStartUp(int signal_number)
    : AllRanksError(stopped_before_training_line(signal_number, 0), 0),
      signal_number_(signal_number) {}

void stop_if_signalled_during_start_up(const Communicator& comm) {
  if (const int signal = stop_signal_of_any_rank(comm)) throw StoppedDuringStartUp(signal);
}

Trainer::Trainer(const Config& config, Communicator comm)
    : config_(config), comm_(std::move(comm)) {
  const Communicator::WaitLimit starting = start_up_limit(comm_, config_);
  maybe_inject_failure(comm_, 0, InjectionPoint::StartUp);
  slow_start_up_if_asked(comm_);
  // Each rank asks its own node (a GPU visible or not): gathered, so that a rank whose node
  // cannot run the job ends it with one message rather than the others waiting for it.
  const std::string backend = backend_impossible(config_);
  throw_if_any_rank_failed(comm_, backend.empty() ? RankFailure::none()
                                                  : RankFailure::here(2, backend));
  // One rank per GPU: local rank modulo the visible devices unless dist.device forces one.
  const BackendRequest request = backend_request(
      config_.train,
      std::max(0, select_device(comm_.local_rank(), visible_cuda_devices(), config_.dist.device)));
  backend_ = make_backend(request);
  device_ = request.device;
  // Each rank reads the data itself, and a failure to is mostly every rank's (a data.dir
  // that is not there): one message, exit 3 from every rank.
  on_every_rank(comm_, [&] {
    source_ = make_training_source(config_, comm_.rank(), comm_.size());
    if (schedule_.validates()) {
      valid_source_ = make_validation_source(config_, comm_.rank(), comm_.size());
      check_validation_vocabulary(config_, *source_, *valid_source_);
    }
  });
  // (a refusal, the same on every rank, or rank 0's alone, is one message and one exit
  // code from every rank)
  if (valid_source_ && config_.train.valid_bleu) {
    on_every_rank(comm_, [&] { validation_scorer_ = make_validation_scorer(config_, comm_); });
  }
  // Reading the data is the part of start-up that a corpus makes long: a stop signal
  // that came meanwhile ends the job here, before the model is built.
  stop_if_signalled_during_start_up(comm_);
  check_every_rank_reads_the_same_data(comm_, *source_, config_.data.dir);
  if (valid_source_) {
    check_every_rank_reads_the_same_data(comm_, *valid_source_, config_.data.dir, "validation");
  }
  const int vocab = resolve_vocab_size(config_, *source_);
  // Checked in long double before any allocation: every rank alike, one message.
  const std::string too_large =
      training_does_not_fit(config_, vocab, host_memory_bytes(), comm_.size(),
                            source_->source_vocab_size());
  if (!too_large.empty()) throw AllRanksError(too_large, 2);
  if (const std::string impossible =
          configuration_impossible(config_, *source_, comm_.size(), valid_source_.get());
      !impossible.empty()) {
    throw AllRanksError(impossible, 2);
  }
  micro_budget_ = micro_batch_budget(config_, comm_);
  model_ = std::make_unique<Transformer>(config_.model,
                                         VocabularySizes{vocab, source_->source_vocab_size()},
                                         source_->special_ids(), *backend_, config_.train.seed);
  model_->set_loss_chunk_rows(config_.train.loss_chunk_rows);
  AdamSettings adam;
  adam.beta1 = config_.train.adam_beta1;
  adam.beta2 = config_.train.adam_beta2;
  adam.eps = config_.train.adam_eps;
  adam.weight_decay = config_.train.weight_decay;
  adam_ = std::make_unique<Adam>(model_->params(), *backend_, adam);
  step_totals_ = std::make_unique<StepTotalsBuffer>(*backend_);
  step_inputs_ = std::make_unique<StepInputsBuffer>(*backend_);
  detector_ = std::make_unique<DivergenceDetector>(config_.train, vocab);
  divergence_handling_ =
      std::make_unique<DivergenceHandling>(config_, comm_, *detector_, keeping_, run_id_);
  run_id_ = comm_.broadcast_from_root(comm_.is_root() ? new_run_id() : std::string());
  lineage_ = {BranchStart{0, run_id_}};  // a fresh run's line; a resume continues another
  std::error_code no_directory;  // removed under the process: recorded as unknown
  working_directory_ = std::filesystem::current_path(no_directory).string();
  computed_by_ = compute_identity(*backend_, device_);
  // What ran the run heads the configuration each checkpoint stores, in comment lines
  // that every version reads past: the settings alone did not say how to run it again.
  provenance_ = {header_line(kWrittenBy, version_line("transformer_hpc")),
                 header_line(kComputedBy, computed_by_)};
  if (!config_.command_line_keys.empty()) {
    provenance_.push_back(header_line(kCommandLine, config_.command_line_text()));
  }
  sums_ = std::make_unique<GradientSums>(config_, comm_, *backend_, model_->params().count());
}

Trainer::~Trainer() = default;

StepStats Trainer::compute_step() {
  const int64_t step = completed_steps_ + 1;
  // A step's collectives wait for ranks doing the same work: one that takes longer than
  // dist.timeout_s to come is stopped, hung or lost, and the job ends (main aborts it).
  const Communicator::WaitLimit bounded(comm_, config_.dist.timeout_s,
                                        "step " + std::to_string(step));
  maybe_inject_failure(comm_, step, InjectionPoint::StepStart);
  // Gather the step's micro-batches first: the loss is normalised by the step's target
  // tokens over all ranks and micro-batches, so every micro-batch's gradient is scaled by
  // 1 / total; the sum over micro-batches and ranks is then the gradient of the
  // per-token mean loss of the whole step.
  const int accumulate = config_.train.accumulate;
  std::vector<Batch> micro_batches;
  StepStats stats;
  stats.step = step;
  // The reader advances its position eagerly, so the epoch is read before drawing.
  stats.epoch = source_->position().epoch + 1;
  for (int i = 0; i < accumulate; ++i) {
    // A streamed shard read here that is damaged or changed is the data's failure, as at
    // start-up (exit 3).
    try {
      micro_batches.push_back(source_->next(micro_budget_));
    } catch (const Error& error) {
      // The step named: how much of the run the last checkpoint holds.
      throw DataError("step " + std::to_string(step) + ": " + error.what());
    }
    stats.src_tokens += micro_batches.back().src_tokens();
    stats.local_tgt_tokens += micro_batches.back().tgt_tokens();
  }
  stats.micro_batches = accumulate;
  // (one collective for both: each is a wait for every rank, before the step's first pass)
  const std::vector<int64_t> tokens =
      comm_.sums(std::vector<int64_t>{stats.src_tokens, stats.local_tgt_tokens});
  stats.src_tokens = tokens[0];
  stats.tgt_tokens = tokens[1];

  backend_->zero(model_->params().grads());
  step_totals_->zero();
  sums_->prepare(*model_, micro_batches);
  maybe_inject_failure(comm_, step, InjectionPoint::SumsPrepared);
  const float grad_scale = 1.0f / static_cast<float>(stats.tgt_tokens);
  // Nothing in the step waits for the backend until its totals are read at the end: the
  // micro-batches' loss sums are added up where they are computed (on the GPU too), and
  // the norm joins them there.
  for (int i = 0; i < accumulate; ++i) {
    DropoutContext dropout;
    dropout.seed = config_.train.seed;
    dropout.step = static_cast<uint32_t>(step);
    // Micro-batch i of rank r is the step's batch i * ranks + r (the reader deals the
    // batches round the ranks) and draws the masks a single rank accumulating all of
    // them would draw for that batch.
    dropout.stream = static_cast<uint32_t>(i * comm_.size() + comm_.rank());
    // What the micro-batch's ops read from memory as they run: the same step, stream and
    // scale (a captured pass reads nothing else that changes: Transformer::train_step).
    step_inputs_->set(step_inputs_for(dropout, grad_scale));
    // The last micro-batch's backward finishes the gradients: its buckets are summed
    // over ranks while backward goes on (gradient_sums.h).
    const bool last = i + 1 == accumulate;
    model_->train_step(micro_batches[i], dropout, step_inputs_->in_backend(),
                       step_totals_->tensor(), last ? sums_->begin_last_pass(*model_) : nullptr);
  }
  // Complete the sums over ranks (each gradient already scaled by 1 / global tokens).
  sums_->finish(*model_, step, schedule_.log_due(step));
  // Every rank now holds the same summed gradient, hence computes the same norm.
  const Tensor grads = model_->params().grads();
  backend_->sum_squares_into(step_totals_->tensor(), grads, grads.numel);
  // The step's one wait: the loss and the norm are known before the update, so that a
  // divergent step can be left out.
  StepTotals total = step_totals_->read(model_->vocab_size());
  if (poison_this_loss(comm_, ++steps_computed_)) total.loss = NAN;
  stats.grad_norm = std::sqrt(total.grad_squares);
  const std::vector<double> summed = comm_.sums(std::vector<double>{total.loss, total.nll});
  stats.loss = summed[0] / static_cast<double>(stats.tgt_tokens);
  stats.nll = summed[1] / static_cast<double>(stats.tgt_tokens);
  return stats;
}

void Trainer::apply_update(StepStats& stats) {
  const Tensor grads = model_->params().grads();
  // train.clip_norm: g *= min(1, clip / |g|), the same factor on every rank.
  const double clip = config_.train.clip_norm;
  if (clip > 0.0 && stats.grad_norm > clip) {
    backend_->scale(grads, grads.numel, static_cast<float>(clip / stats.grad_norm));
  }
  // The §5.3 schedule, times the reduction of the rollbacks so far (1 without any: exact).
  stats.lr = scheduled_learning_rate(stats.step, config_) * detector_->state().lr_factor;
  adam_->update(static_cast<float>(stats.lr), stats.step);
  detector_->accept(stats.loss, stats.grad_norm);
  checkpoint_loss_ = stats.loss;
  completed_steps_ = stats.step;
}

StepStats Trainer::step() {
  StepStats stats = compute_step();
  const DivergenceVerdict verdict = detector_->judge(stats.loss, stats.grad_norm);
  StepDecision mine;
  mine.divergence = verdict.kind;
  const DivergenceKind agreed = StepDecision::agree(comm_, mine).divergence;
  if (agreed == DivergenceKind::None) {
    apply_update(stats);
    return stats;
  }
  THPC_FAIL("step " << stats.step << " diverged: "
                    << divergence_reason(*detector_, verdict, agreed) << " (not applied)");
}

ValidationStats Trainer::validate() {
  THPC_CHECK(valid_source_ != nullptr, "validation without validation shards");
  // The ranks' shares of a validation may take minutes longer on one than on another (a
  // CPU translating longer sentences): a rank waits for the others as long as one of
  // them shows it is still working, and dist.timeout_s after the last such sign ends the
  // job (a rank stopped, hung or lost), where it waited until the job's time limit.
  const Communicator::WaitLimit bounded(comm_, config_.dist.timeout_s,
                                        "validation at step " + std::to_string(completed_steps_),
                                        Communicator::WaitFrom::kLastSignOfWork);
  maybe_inject_failure(comm_, completed_steps_, InjectionPoint::Validation);
  ValidationStats stats = validation_pass(*model_, *valid_source_, comm_, micro_budget_);
  if (const std::optional<double> nll = injected_validation_nll(completed_steps_)) {
    stats.nll = *nll;  // the test hook's exploded validation
  }
  if (validation_scorer_) score_translations(*validation_scorer_, *model_, completed_steps_, stats);
  stats.interrupted = stop_requested_by() != 0;
  return stats;
}

Checkpoint Trainer::snapshot() const {
  const ParamStore& params = model_->params();
  Checkpoint checkpoint = snapshot_without_state();
  checkpoint.params = gather_named(params, *backend_, params.params());
  checkpoint.adam_m = gather_named(params, *backend_, adam_->first_moment());
  checkpoint.adam_v = gather_named(params, *backend_, adam_->second_moment());
  return checkpoint;
}

Checkpoint Trainer::staged_snapshot(std::function<void(Checkpoint&)>& fill_state) {
  const ParamStore& params = model_->params();
  if (checkpoint_staging_ == nullptr) {
    checkpoint_staging_ = backend_->make_host_staging(3 * params.buffer_numel());
  }
  const auto staged = std::make_shared<const StagedNamedBuffers>(
      params, checkpoint_staging_,
      std::vector<Tensor>{params.params(), adam_->first_moment(), adam_->second_moment()});
  fill_state = [staged](Checkpoint& checkpoint) {
    checkpoint.params = staged->named(0);
    checkpoint.adam_m = staged->named(1);
    checkpoint.adam_v = staged->named(2);
  };
  return snapshot_without_state();
}

Checkpoint Trainer::snapshot_without_state() const {
  Checkpoint checkpoint;
  checkpoint.step = completed_steps_;
  checkpoint.seed = config_.train.seed;
  checkpoint.world_size = comm_.size();
  checkpoint.data_position = source_->position();
  checkpoint.architecture = architecture_text(*model_);
  checkpoint.config_ini = config_.to_ini(provenance_);
  // The vocabulary travels with the parameters, so that decoding needs only the file.
  if (const std::string* model = source_->spm_model()) checkpoint.spm_model = *model;
  if (const std::string* model = source_->source_spm_model()) {
    checkpoint.source_spm_model = *model;
  }
  checkpoint.direction = source_->direction();
  checkpoint.best_valid = best_valid_;
  checkpoint.run_id = run_id_;
  checkpoint.lineage = lineage_;
  checkpoint.corpus_sha256 = source_->corpus_sha256();
  if (valid_source_) checkpoint.valid_sha256 = valid_source_->corpus_sha256();
  checkpoint.working_directory = working_directory_;
  checkpoint.loss = checkpoint_loss_;
  // Saved while steps are being left out (train.divergence = skip): the parameters gave
  // the divergent loss of the last step judged.
  // Saved after a validation that diverged (DivergenceHandling::judge_validation): not a
  // model to resume.
  checkpoint.state = detector_->state().consecutive_skips > 0 ||
                     divergence_handling_->validation_diverged()
                         ? CheckpointState::Diverged
                         : CheckpointState::Healthy;
  checkpoint.divergence = detector_->state();
  checkpoint.validation_pending = validation_pending_step_ == completed_steps_;
  return checkpoint;
}

void Trainer::restore(const Checkpoint& checkpoint, const std::string& source) {
  check_checkpoint_vocabulary(checkpoint, source, *source_, config_);
  check_checkpoint_architecture(checkpoint, source, architecture_text(*model_));
  check_checkpoint_resumes_this_run(checkpoint, source, config_);
  ParamStore& params = model_->params();
  scatter_named(checkpoint.params, params, *backend_, params.params(), "checkpoint " + source);
  params.refresh_compute();
  scatter_named(checkpoint.adam_m, params, *backend_, adam_->first_moment(),
                "checkpoint " + source + " /adam/m");
  scatter_named(checkpoint.adam_v, params, *backend_, adam_->second_moment(),
                "checkpoint " + source + " /adam/v");
  source_->seek(position_at_this_budget(checkpoint, source, *source_, micro_budget_,
                                        comm_.size(), config_.train, data_position_note_));
  completed_steps_ = checkpoint.step;
  best_valid_ = checkpoint.best_valid.value_or(ValidationRecord{});
  // Other validation shards (re-preprocessed, replaced, another data.valid): their scores
  // are not comparable with the best ones stored, which ranked the new set's first
  // validations against the old set's best, and patience stopped the run without a word
  // (a helper's trial). The best values and patience start afresh, said at the resume.
  if (valid_source_ && !checkpoint.valid_sha256.empty() &&
      checkpoint.valid_sha256 != valid_source_->corpus_sha256() && checkpoint.best_valid) {
    best_valid_ = ValidationRecord{};
    earlier_valid_sha256_ = checkpoint.valid_sha256;
    valid_change_note_ =
        "warning: the validation shards under data.dir are not those the checkpoint's run "
        "scored (validation pairs sha256 " + valid_source_->corpus_sha256().substr(0, 12) +
        "... now, " + checkpoint.valid_sha256.substr(0, 12) + "... then): the best valid "
        "ppl and bleu, best.h5, the best_step_*.h5 of checkpoint.keep_best_count (and so "
        "checkpoint.average_best) and the checkpoint.patience count start afresh at this "
        "run's first validation; training moves checkpoint.dir's best.h5 and best_step_*.h5 "
        "into its best_of_valid_" + checkpoint.valid_sha256.substr(0, 12) + "/";
  }
  validation_pending_step_ = checkpoint.validation_pending ? checkpoint.step : -1;
  // The run continues under its own id; a checkpoint written before ids were stored gives
  // its run this process's.
  if (!checkpoint.run_id.empty()) run_id_ = checkpoint.run_id;
  // Rank 0 writes the checkpoints, on the restored one's line or a new one from it (a
  // resume or a rollback to an older checkpoint).
  if (comm_.is_root()) {
    lineage_ = keeping_.continued_lineage(checkpoint, source, run_id_, new_run_id());
  }
  checkpoint_loss_ = checkpoint.loss;
  detector_->restore(checkpoint.divergence.value_or(DivergenceState{}));
  // A fine-tuning's origin goes on in the checkpoints of its resumes.
  if (const std::string from = ini_header_value(checkpoint.config_ini, kInitialisedFrom);
      !from.empty()) {
    record_initialised_from(from);
  }
}

void Trainer::set_provenance(const char* label, const std::vector<std::string>& values) {
  const std::string prefix = std::string(label) + ": ";
  provenance_.erase(std::remove_if(provenance_.begin(), provenance_.end(),
                                   [&](const std::string& line) {
                                     return line.rfind(prefix, 0) == 0;
                                   }),
                    provenance_.end());
  // (a value read back from a header is escaped already; header_line's escaping leaves it)
  for (const std::string& value : values) provenance_.push_back(header_line(label, value));
}

void Trainer::record_settings_changed(const Checkpoint& checkpoint, const std::string& now) {
  std::vector<std::string> lines = ini_header_values(checkpoint.config_ini, kSettingsChanged);
  if (!now.empty()) lines.push_back("at step " + std::to_string(checkpoint.step) + ": " + now);
  set_provenance(kSettingsChanged, lines);
}

void Trainer::record_initialised_from(const std::string& model) {
  set_provenance(kInitialisedFrom, {model});
}

void Trainer::apply_start_options(std::ostream& log) {
  const CheckpointConfig& options = config_.checkpoint;
  const auto start = std::chrono::steady_clock::now();
  // Rank 0 chooses and reads, and every rank loads its choice: ranks choosing for
  // themselves would take different files when a shared filesystem shows them different
  // listings.
  Checkpoint checkpoint;
  CheckpointKeeping::StartChoice& choice = start_choice_;
  if (comm_.is_root()) choice = keeping_.choose_start(&checkpoint, log);
  const std::string path = comm_.broadcast_from_root(choice.path);
  // Every rank fails with rank 0's reason, rather than the others waiting for it: one
  // message (before: each rank aborted with its own copy).
  const std::string refusal = comm_.broadcast_from_root(choice.refusal);
  if (!refusal.empty()) throw AllRanksError(refusal, 1);
  if (path.empty() && !options.resume.empty()) {
    // A relative checkpoint.dir is named as this process finds it too: resumed from
    // another working directory, "checkpoints" was another folder, with nothing said.
    std::error_code no_path;
    const std::string absolute = std::filesystem::absolute(options.dir, no_path).string();
    const bool relative = !no_path && absolute != options.dir;
    nothing_to_resume_note_ = "checkpoint.resume=" + options.resume +
                              ": no valid checkpoint in " + options.dir +
                              (relative ? " (" + absolute + ")" : std::string()) +
                              ", starting from step 0";
  }
  if (!path.empty()) {
    resume_from(path, checkpoint, start, log);
    return;
  }
  if (!options.init.empty()) {
    // Each rank reads it (the start-up agreement compares what they read): a file missing
    // or of another model fails alike on every rank, one message.
    bool quantized = false;
    std::string init_said;  // kInitialisedFrom's "PATH (step S, run R"
    on_every_rank(comm_, [&] {
      const Checkpoint init = read_init_checkpoint(options);
      check_checkpoint_vocabulary(init, options.init, *source_, config_);
      // (before load_parameters' own check: a mismatch is the configuration's, exit 2)
      check_checkpoint_architecture(init, options.init, architecture_text(*model_));
      load_parameters(init, options.init, *model_);
      quantized = !init.quantized.empty();
      init_said = std::filesystem::absolute(options.init).lexically_normal().string() +
                  " (step " + std::to_string(init.step) +
                  (init.run_id.empty() ? std::string() : ", run " + init.run_id);
    });
    // The model a fine-tuning began from, in the head of its checkpoints' configuration:
    // checkpoint.init's path alone was kept, relative, and the model it named could not be
    // told (a helper's walk as a model's recipient).
    if (comm_.is_root()) {
      record_initialised_from(init_said + ", params_sha256 " + model_->params().sha256_hex() +
                              ")");
    }
    log << "parameters initialised from " << options.init
        // (as transformer_average says it of such an input; a resume refuses one)
        << (quantized ? ", a quantized checkpoint (transformer_quantize): its int8 parameters "
                        "dequantized, their rounding included"
                      : "")
        << std::endl;
    // What a fairseq user resets by hand (--reset-optimizer, --reset-lr-scheduler,
    // --reset-dataloader, --reset-meters) is said, beside what resume would keep (a
    // helper's walk: the line named the file alone).
    log << "note: checkpoint.init starts a new run from those parameters alone: Adam's "
        << "moments are zero, and the step, the learning-rate schedule (its warm-up of "
        << config_.train.warmup_steps << " steps included), the data's position and epochs "
        << "and the best validation values start from nothing; checkpoint.resume = FILE "
        << "would continue all of them" << std::endl;
  }
}

void Trainer::resume_from(const std::string& path, Checkpoint& checkpoint,
                          std::chrono::steady_clock::time_point start, std::ostream& log) {
  read_the_checkpoint_rank_zero_chose(comm_, path, &checkpoint);
  // A checkpoint of another architecture, vocabulary or seed fails alike on every rank:
  // one message (before: each rank's, and Open MPI's report of the abort).
  on_every_rank(comm_, [&] { restore(checkpoint, path); });
  // Settings that would delete what the run kept are refused before anything is written
  // (a resume with no step left writes and prunes nothing: not refused).
  // Read once for the refusal and the notes below (each read it apart before).
  const std::optional<Config> written = stored_configuration(checkpoint);
  std::string lowered;
  if (comm_.is_root() && written && completed_steps_ < config_.train.max_steps) {
    lowered = keeping_.lowered_keeping_refusal(*written, path);
  }
  lowered = comm_.broadcast_from_root(lowered);
  if (!lowered.empty()) throw AllRanksError(lowered, 2);
  resumed_from_ = path;
  resumed_lineage_ = checkpoint.lineage;
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::ostringstream line;  // the seconds' format stays off `log`
  line << "resumed from " << path << " at step " << completed_steps_ << " (data epoch "
       << checkpoint.data_position.epoch + 1 << ", index " << checkpoint.data_position.index
       << "; read and verified in " << std::fixed << std::setprecision(2) << seconds << " s)";
  log << line.str() << std::endl;
  if (checkpoint.state != CheckpointState::Healthy) {
    // Only checkpoint.resume=PATH takes a marked one: auto chooses among healthy ones.
    log << "note: " << path << " is marked " << checkpoint_state_name(checkpoint.state)
        << " (checkpoint.resume names it, so the run continues from it)" << std::endl;
  }
  const ResumeNotes notes =
      log_resume_notes(checkpoint, path, written, config_, comm_.size(),
                       /*on_gpu=*/backend_->device() >= 0, data_position_note_, log);
  idle_keys_said_at_resume_ = notes.idle_keys;
  record_settings_changed(checkpoint, notes.changed);
  if (!valid_change_note_.empty()) log << valid_change_note_ << std::endl;
  note_other_arithmetic(checkpoint, computed_by_, log);
  if (completed_steps_ >= config_.train.max_steps) {
    log << "note: the checkpoint is at step " << completed_steps_ << ", train.max_steps is "
        << config_.train.max_steps << ": no step is left to train (raise train.max_steps "
        << "to continue)" << std::endl;
  }
  drop_a_damaged_best_checkpoint(comm_, keeping_, config_.checkpoint.keep_best, best_valid_, log);
}

namespace {

enum class Better { Lower, Higher };

// Counts one validation's `value` of a metric into `best`: the first value, or one
// better than the best (an equal one is not), becomes the best, reached at `step`; any
// other is one more validation without improvement.
void note_validation(BestValidation& best, double value, Better better, int64_t step) {
  // A value that is not finite (a diverged model's perplexity) improves on nothing.
  const bool improved = std::isfinite(value) &&
                        (std::isnan(best.value) ||
                         (better == Better::Lower ? value < best.value : value > best.value));
  if (improved) {
    best = BestValidation{value, step, 0};
  } else {
    ++best.validations_since;
  }
}

}  // namespace

RunEnd Trainer::run(std::ostream& log) {
  const StopSignalGuard stop_signals;
  // The run directory's locks, which start_up() takes, are given back when run() returns
  // or throws: the run is over then, whatever becomes of this object. Not before a
  // checkpoint being written beside training is done: its writer writes and prunes there
  // (a failure's path comes here with one under way).
  struct ReleaseLocks {
    std::vector<std::unique_ptr<RunLock>>& locks;
    const CheckpointKeeping& keeping;
    ~ReleaseLocks() {
      keeping.wait_for_write();
      locks.clear();
    }
  } release_locks{run_locks_, keeping_};
  // Rank 0 speaks for the job; the other ranks' lines would only repeat it.
  std::ostream silent(nullptr);
  RunProgress run(comm_.is_root() ? log : silent);
  // However the run ends, unless by a failure (said as such): its last lines (the
  // summary, a stop's) reached the log or are said lost.
  struct SayIfTheLogIsLost {
    RunProgress& run;
    ~SayIfTheLogIsLost() {
      if (std::uncaught_exceptions() == 0) run.say_if_the_log_is_lost();
    }
  } say_if_the_log_is_lost{run};
  if (!start_up(run.out)) return RunEnd::Stopped;
  begin_training(run);
  // The checkpoint resumed from was saved by a stop that cut its step's validation short:
  // that validation first, as the uninterrupted run had it (the same best.h5, the same
  // patience count), and what a stop or patience makes of it.
  if (validation_pending_step_ == completed_steps_) {
    validation_pending_step_ = -1;
    if (schedule_.validation_due(completed_steps_)) {
      run.out << "validating step " << completed_steps_ << " first: its validation was cut "
              << "short by the stop that saved the checkpoint" << std::endl;
      StepDecision decision;
      run.last.step = completed_steps_;  // the step the validation is of
      validate_and_record(true, decision, run);
      // The checkpoint on disk says "pending" and lacks this validation's values: the
      // run's next or final checkpoint of this step is written again.
      run.last_saved_step = -1;
      if (decision.stop_signal != 0) return stop_by_signal(decision.stop_signal, run);
      if (run.stopped_by_patience) return finish_training(run);
    } else if (comm_.is_root()) {
      // (said: it was dropped without a word, a helper's walk)
      run.out << "note: step " << completed_steps_ << "'s validation, cut short by the stop "
              << "that saved the checkpoint, is not done: train.valid_every = "
              << config_.train.valid_every << config_.on_command_line("train.valid_every")
              << " validates no step " << completed_steps_ << std::endl;
    }
  }
  while (completed_steps_ < schedule_.max_steps()) {
    StepStats stats = compute_step();
    const DivergenceVerdict verdict = detector_->judge(stats.loss, stats.grad_norm);
    StepDecision decision = decide_step(stats, verdict.kind, run);
    if (decision.divergence != DivergenceKind::None) {
      const AfterStep next = after_divergent_step(stats, verdict, decision, run);
      if (next == AfterStep::NextStep) {
        end_with_the_epochs(run.out, false);  // a skip read its batches; a rollback went back
        continue;
      }
      if (next == AfterStep::EndTraining) {
        // (the last step trained, left out or not, has its progress line as at any end)
        run.log_step_unless_logged(schedule_.max_steps(), backend_->peak_memory_bytes());
        break;
      }
      return next == AfterStep::Stopped ? RunEnd::Stopped : RunEnd::Diverged;
    }
    apply_update(stats);
    keeping_.report_finished_write(run.out);
    run.count(stats);
    // The step a stop or the time limit ends the run at is logged too, before its
    // validation as every logged step is; one patience or a late stop ends is logged below.
    if (schedule_.log_due(stats.step) || decision.stop_signal != 0 || decision.out_of_time) {
      run.log_step(schedule_.max_steps(), backend_->peak_memory_bytes());
    }
    if (const std::string timings = sums_->take_timings_line(); !timings.empty()) {
      run.out << timings << std::endl;
    }
    validate_and_record(schedule_.validation_due(stats.step), decision, run);
    if (decision.stop_signal != 0) return stop_by_signal(decision.stop_signal, run);
    if (decision.checkpoint_due) {
      const Communicator::WaitLimit bounded =
          rank_zeros_work_limit("the checkpoint of step " + std::to_string(completed_steps_));
      save_completed_step(run);
      wait_for_rank_zeros_files();
    }
    if (ends_training_early(decision, run)) break;
  }
  return finish_training(run);
}

void Trainer::validate_and_record(bool due, StepDecision& decision, RunProgress& run) {
  std::optional<ValidationStats> valid;
  if (due) valid = validate();
  agree_on_late_stop_signal(due, decision, valid, run);
  if (valid) {
    const Communicator::WaitLimit bounded = rank_zeros_work_limit(
        "the records of the validation at step " + std::to_string(completed_steps_));
    record_validation(*valid, run);
    wait_for_rank_zeros_files();
  }
}

bool Trainer::start_up(std::ostream& out) {
  const Communicator::WaitLimit starting = start_up_limit(comm_, config_);
  out << "training " << model_->params().count() << " parameters on " << backend_->name()
      << " for " << config_.train.max_steps << " steps"
      << (config_.train.max_epochs > 0
              ? " or " + std::to_string(config_.train.max_epochs) +
                    (config_.train.max_epochs == 1 ? " epoch" : " epochs") +
                    ", whichever ends first,"
              : "")
      << " on " << comm_.size() << " rank"
      << (comm_.size() > 1 ? "s" : "") << std::endl;
  for (const auto& [what, source] :
       {std::pair<const char*, const BatchSource*>{"data.train", source_.get()},
        {"data.valid", valid_source_.get()}}) {
    const std::string corpus = source != nullptr ? source->corpus_line(what) : "";
    if (!corpus.empty()) out << corpus << std::endl;
  }
  source_->print_notes(out, "data.train");
  if (valid_source_) {
    valid_source_->print_notes(out, "data.valid");
    const std::string same = same_pairs_warning(config_, *source_, *valid_source_);
    if (!same.empty()) out << same << std::endl;
  }
  if (validation_scorer_ && comm_.is_root()) out << validation_scorer_->notes() << std::flush;
  // A signal during start-up (before run(): main installed the handler first) or while a
  // checkpoint was read ends the run here; the state is what is on disk already.
  if (stopped_before_training(comm_, completed_steps_, out)) return false;
  if (sums_->active()) warn_of_many_buckets(config_.dist, model_->params().count(), out);
  if (std::string note; comm_.is_root() && !keeping_.writes_in_background(&note) &&
                        !note.empty()) {
    out << "note: " << note << std::endl;
  }
  run_locks_ = lock_run_directory(config_, comm_, out);
  apply_start_options(out);
  // After a resume's notes, which named with the checkpoint's values the keys of this
  // run's that differ from it and do nothing here: the rest are said now.
  const std::string idle = idle_settings_note(config_, {backend_->device() >= 0, comm_.size()},
                                              idle_keys_said_at_resume_);
  if (!idle.empty()) out << idle << std::endl;
  // More threads than the cores this process may use (a Slurm cpuset, taskset, mpirun's
  // binding of each rank to a core) share them, each a fraction as fast: 8 threads on one
  // core ran a tiny step at 370 ms against 18.5 ms with 1 (a helper's walk), without a
  // word, where transformer_decode said so. Said, and honoured.
  if (const std::string note = more_threads_than_cores(
          config_.train.threads, "train.threads = " + std::to_string(config_.train.threads),
          "train.threads = ", ", or 0 for as many as it may use");
      backend_->host_memory() && !note.empty()) {
    out << "note: " << note << std::endl;
  }
  end_with_the_epochs(out, true);  // from the position resumed at
  const CheckpointConfig& start = config_.checkpoint;
  check_every_rank_starts_from_the_same_parameters(
      comm_, model_->params().sha256_hex(),
      !resumed_from_.empty() ? "checkpoint " + resumed_from_
      : !start.init.empty()  ? "checkpoint.init " + start.init
                             : "train.seed");
  if (stopped_before_training(comm_, completed_steps_, out)) return false;
  metrics_path_ = claim_run_directory(config_, comm_, run_id_, resumed_from_, completed_steps_,
                                      resumed_lineage_, out);
  if (!nothing_to_resume_note_.empty()) out << nothing_to_resume_note_ << std::endl;
  // The directory is this run's: the damaged checkpoints passed over go aside now, not
  // before a refusal (claim_run_directory judges by the files it can read).
  if (comm_.is_root()) keeping_.move_invalid_aside(start_choice_, out);
  if (comm_.is_root() && !earlier_valid_sha256_.empty()) {
    keeping_.set_aside_best_of_earlier_validation(earlier_valid_sha256_, out);
  }
  // A resume from a checkpoint older than the run's newest (checkpoint.resume = PATH)
  // starts another branch: the later step_*.h5 are marked superseded, as a rollback marks
  // them, so that resume=auto, a rollback, average_last and pruning pass over them (before:
  // the stop line's own advice, resume=auto, resumed the abandoned branch, and a rollback
  // went forward to it). resume=auto took the newest: nothing is later. A resume from a
  // superseded one returns to an abandoned branch: the branch it leaves is marked too, and
  // the abandoned one's checkpoints that led to it healthy again (their lineages say which).
  // Its best files too: out of the new branch's ranking, its average_best and the next
  // best.h5's way (the best values are the checkpoint's).
  if (comm_.is_root() && !resumed_from_.empty() && completed_steps_ < schedule_.max_steps()) {
    keeping_.follow_resumed_branch(run_id_, resumed_lineage_, completed_steps_, out);
    keeping_.set_aside_best_of_other_branches(run_id_, resumed_lineage_, completed_steps_, out);
  }
  return true;
}

void Trainer::end_with_the_epochs(std::ostream& log, bool at_start) {
  const int64_t epochs = config_.train.max_epochs;
  if (epochs == 0) return;
  const auto [left, epochs_end] =
      end_of_epochs_from(*source_, micro_budget_, comm_.size(), config_.train, completed_steps_);
  // What the lines below say.
  const int64_t per_epoch = source_->batches_per_epoch(micro_budget_);
  const int64_t per_step = static_cast<int64_t>(config_.train.accumulate) * comm_.size();
  const DataPosition at = source_->position();
  int64_t last_step = epochs_end;
  // A skipped step reads its batches without being a step: when it read the epoch's last
  // batch, the run ends at the next step (whose batches are the next epoch's first), a
  // healthy one, rather than on the skip.
  if (!at_start) last_step = std::max(last_step, completed_steps_ + 1);
  const int64_t before = schedule_.max_steps();
  schedule_.end_by_step(last_step);
  if (!at_start && schedule_.max_steps() == before) return;
  log << "train.max_epochs = " << epochs << ": ";
  if (at_start && left == 0) {
    log << "the data is past epoch " << epochs << "'s last batch (the next to read is batch "
        << at.index + 1 << " of epoch " << at.epoch + 1 << "): nothing left to train (raise "
        << "train.max_epochs to train on)" << std::endl;
  } else if (schedule_.max_steps() < last_step) {
    log << "train.max_steps = " << schedule_.max_steps() << " ends the run first (epoch "
        << epochs;
    if (last_step == INT64_MAX) {
      log << " lies beyond any step a run can count)" << std::endl;
    } else {
      log << " would end at step " << last_step << ")" << std::endl;
    }
  } else {
    // Only train.divergence = skip or rollback come back here after a divergent step.
    const bool skipped = config_.train.divergence == "skip";
    log << (at_start  ? "the run ends at step "
            : skipped ? "after the skipped step, the run ends at step "
                      : "after the rollback, the run ends at step ")
        << last_step << ", which reads the last batch of epoch " << epochs << " ("
        << per_epoch << " micro-batch" << (per_epoch == 1 ? "" : "es") << " an epoch, "
        << per_step << " a step)" << std::endl;
  }
}

void Trainer::begin_training(RunProgress& run) {
  run.stop_at_step = injected_stop_step();
  // The step training starts from passed, or had no validation to fail; one whose
  // validation a stop cut short (validated first, below) has not passed yet: should it
  // fail, its own checkpoint is marked as the uninterrupted run's would be.
  const bool pending = validation_pending_step_ == completed_steps_;
  divergence_handling_->begin(pending ? completed_steps_ - 1 : completed_steps_);
  run.begin(completed_steps_, checkpoint_clock_(completed_steps_), detector_->state());
  // A resumed run's checkpoint holds its starting point; a fresh run has none.
  run.last_saved_step = config_.checkpoint.resume.empty() ? -1 : completed_steps_;
  checkpoints_written_ = 0;
  // Rank 0 writes every value it logs to metrics.jsonl as well (run_log.h), after a
  // record that says which run, from which step, writes what follows.
  if (comm_.is_root()) run.metrics = MetricsFile(metrics_path_);
  run.metrics.warn_on(run.out);
  if (!run.metrics.repair_note().empty()) {
    run.out << "note: " << run.metrics.repair_note() << std::endl;
  }
  // (Absolute: a run that finds nothing to resume tells its own earlier start's file from
  // another run's by it, whatever directory each was started from.)
  MetricsFile::RunStart start;
  start.step = run.first_step;
  start.run_id = run_id_;
  start.resumed_from = resumed_from_;
  start.checkpoint_dir =
      std::filesystem::absolute(config_.checkpoint.dir).lexically_normal().string();
  start.lineage = lineage_text(lineage_);
  start.init = resumed_from_.empty() ? config_.checkpoint.init : "";
  start.valid_sha256 = valid_source_ ? valid_source_->corpus_sha256() : "";
  start.corpus_sha256 = source_->corpus_sha256();
  start.version = source_version();
  start.computed_by = computed_by_;
  std::error_code unknown;  // (a file that cannot be found again: written as given)
  start.config_file = config_.source_file.empty()
                          ? ""
                          : std::filesystem::absolute(config_.source_file, unknown)
                                .lexically_normal()
                                .string();
  start.command_line = config_.command_line_text();
  start.config = config_.to_ini();
  // Its first record not written (a full disk or quota, a file-size limit): nothing is
  // trained yet, so the run stops on every rank, saying why and what to do, as the start
  // refuses a directory it cannot write (before: rank 0 alone, "cannot write the metrics
  // file ... (No space left on device)", exit 1; a later record's failure costs only the
  // records). The empty files it opened are a start's that recorded no value: the next
  // start removes them.
  std::string unwritable;
  if (comm_.is_root()) {
    try {
      run.metrics.write_run_start(start);
    } catch (const Error& error) {
      const std::filesystem::path dir = std::filesystem::path(metrics_path_).parent_path();
      std::error_code unsized;
      const uintmax_t written = std::filesystem::file_size(metrics_path_, unsized);
      const std::string advice = storage_advice(dir.empty() ? "." : dir.string(), error.what(),
                                                unsized ? 0 : written);
      unwritable = std::string(error.what()) + ": " +
                   (advice.empty() ? "check its directory's permissions and space" : advice) +
                   " (train.metrics_dir chooses where it goes)";
    }
  }
  {
    const Communicator::WaitLimit bounded(comm_, config_.dist.timeout_s,
                                          "the metrics file's first record");
    unwritable = comm_.broadcast_from_root(unwritable);
  }
  if (!unwritable.empty()) throw AllRanksError(unwritable, 2);
}

StepDecision Trainer::decide_step(const StepStats& stats, DivergenceKind divergence,
                                  const RunProgress& run) {
  const Communicator::WaitLimit bounded(comm_, config_.dist.timeout_s,  // as compute_step
                                        "step " + std::to_string(stats.step));
  StepDecision mine;
  mine.divergence = divergence;
  // For rank 0's clock the step is complete (its work is done; only the update is left).
  const double now = checkpoint_clock_(stats.step);
  mine.out_of_time = schedule_.out_of_time(now - run.training_start);
  mine.checkpoint_due = schedule_.checkpoint_due(stats.step, now - run.last_save);
  mine.stop_signal = stop_requested_by();
  return StepDecision::agree(comm_, mine);
}

Trainer::AfterStep Trainer::after_divergent_step(StepStats& stats,
                                                 const DivergenceVerdict& verdict,
                                                 const StepDecision& decision,
                                                 RunProgress& run) {
  stats.divergence = decision.divergence;
  std::string stop_reason;
  checkpoint_loss_ = stats.loss;
  // A rollback puts every rank back at the checkpoint; the run's best validation values
  // stay (best.h5 may hold a better one from the abandoned branch: a later validation
  // must beat it).
  const auto restore_keeping_the_best = [this, &run](const Checkpoint& checkpoint,
                                                     const std::string& path) {
    const ValidationRecord best = best_valid_;
    restore(checkpoint, path);
    best_valid_ = best;
    // The records after it are the new line's (plot_metrics.py keeps them, TensorBoard
    // drops the values logged past the step rolled back to).
    run.metrics.write_branch(checkpoint.step, run.seconds_since_start(),
                             lineage_text(lineage_));
    // A checkpoint of an earlier run of this directory may have had another budget.
    if (!data_position_note_.empty()) run.out << data_position_note_ << std::endl;
  };
  DivergenceHandling::Action action;
  {
    const Communicator::WaitLimit bounded =
        rank_zeros_work_limit("the divergent step " + std::to_string(stats.step));
    action = divergence_handling_->handle(
        stats.step, stats.loss, stats.grad_norm, stats.divergence,
        divergence_reason(*detector_, verdict, decision.divergence), completed_steps_, run.out,
        run.metrics, run.seconds_since_start(), restore_keeping_the_best, &stop_reason);
    // Rank 0 may have marked checkpoints alone (a rollback, a skip): the ranks meet before
    // the next step's bounded waits. A stop ends the run here.
    if (action != DivergenceHandling::Action::Stop) wait_for_rank_zeros_files();
  }
  if (action == DivergenceHandling::Action::Stop) {
    // The steps trained since the last progress line have theirs (and their metrics
    // record), as at any end of a run: the curve up to the divergence is the user's clue.
    run.log_step_unless_logged(schedule_.max_steps(), backend_->peak_memory_bytes());
    run.log_summary(completed_steps_, best_valid_, config_, checkpoints_written_,
                    detector_->state(), "diverged");
    const std::string kept =
        comm_.is_root() ? keeping_.diverged_parameters_file(run_id_, completed_steps_) : "";
    run.out << "diverged: " << stop_reason << "; its update is not applied, and the "
            << "parameters that produced it are "
            << (kept.empty() ? "not saved"
                             : "in " + kept +
                                   ", marked diverged so that resume=auto passes over it")
            << "; "
            << detector_->advice(decision.divergence,
                                 resumed_from_.empty() && config_.checkpoint.init.empty(),
                                 comm_.is_root() ? keeping_.resume_point() : std::string(),
                                 config_.checkpoint.dir, stop_reason)
            << std::endl;
    return AfterStep::Diverged;
  }
  if (action == DivergenceHandling::Action::RolledBack) {
    // The steps after the checkpoint rolled back to are trained again: the progress
    // interval restarts there, and that checkpoint is the newest saved.
    run.restart_interval_at(completed_steps_);
    run.last_saved_step = completed_steps_;
    return AfterStep::NextStep;
  }
  // A left-out step changes nothing to save on schedule; a stop still saves.
  if (decision.stop_signal != 0) {
    stop_by_signal(decision.stop_signal, run);
    return AfterStep::Stopped;
  }
  if (decision.out_of_time) {
    note_time_limit_stop(completed_steps_, config_.train, run.out);
    return AfterStep::EndTraining;
  }
  return AfterStep::NextStep;
}

void Trainer::agree_on_late_stop_signal(bool validation_due, StepDecision& decision,
                                        std::optional<ValidationStats>& valid,
                                        RunProgress& run) {
  const int64_t step = run.last.step;
  // Test hook: SIGTERM once the step is complete (its validation included).
  if (step == run.stop_at_step) std::raise(SIGTERM);
  // A signal that came during the validation (which it cut short), or after the
  // decision, is agreed on now: the job stops at this step rather than one step later.
  if (!validation_due && step != run.stop_at_step) return;
  maybe_inject_failure(comm_, step, InjectionPoint::Validated);
  // (a rank stopped or hung as it left the validation ends the job after dist.timeout_s;
  // before, the others waited here without limit)
  const Communicator::WaitLimit bounded(
      comm_, config_.dist.timeout_s,
      (validation_due ? "validation at step " : "step ") + std::to_string(step));
  const std::vector<int64_t> late = comm_.max(
      {static_cast<int64_t>(stop_requested_by()), valid && valid->interrupted ? 1 : 0});
  if (decision.stop_signal == 0) decision.stop_signal = static_cast<int>(late[0]);
  if (valid && late[1] != 0) {
    run.out << "validation at step " << step << " interrupted by "
            << stop_signal_name(decision.stop_signal) << ": not recorded (a resumed run "
            << "validates step " << step << " first)" << std::endl;
    valid.reset();
    validation_pending_step_ = step;
  }
}

void Trainer::record_validation(const ValidationStats& valid, RunProgress& run) {
  const int64_t step = run.last.step;
  divergence_handling_->judge_validation(valid.nll, best_valid_.ppl, step, run.out);
  // A validation that diverged (a loss not finite, or spiking) improves on nothing: its
  // scores count as a validation without improvement, and its checkpoint, marked diverged,
  // is no best (a NaN model's BLEU of 0 was the first best: best.h5 and best_step_*.h5
  // of NaN parameters, which average_best then refused).
  const bool diverged = divergence_handling_->validation_diverged();
  const auto unless_diverged = [diverged](double value) {
    return diverged ? std::nan("") : value;  // (NaN improves on nothing)
  };
  note_validation(best_valid_.ppl, unless_diverged(std::exp(valid.nll)), Better::Lower, step);
  if (!std::isnan(valid.bleu)) {
    note_validation(best_valid_.bleu, unless_diverged(valid.bleu), Better::Higher, step);
  }
  if (!std::isnan(valid.chrf)) {
    note_validation(best_valid_.chrf, unless_diverged(valid.chrf), Better::Higher, step);
  }
  if (!std::isnan(valid.f1)) {
    note_validation(best_valid_.f1, unless_diverged(valid.f1), Better::Higher, step);
  }
  const std::vector<LogField> fields = validation_fields(valid);
  run.out << log_line("valid step " + std::to_string(step), fields) << std::endl;
  run.metrics.write("valid", step, run.seconds_since_start(), fields);
  // checkpoint.keep_best's metric, whose best step and validations since (patience) are
  // in best_valid_ with the others' (restored by a resume).
  const std::string& kept_metric = config_.checkpoint.keep_best;
  if (kept_metric == "none") return;
  const BestValidation& kept = best_valid_.of(kept_metric);
  // Every rank holds the same values (global sums, BLEU broadcast); rank 0's count
  // is broadcast all the same, so that best.h5 and the patience stop cannot part them.
  const int64_t since = comm_.broadcast_from_root(kept.validations_since);
  if (comm_.is_root() && !diverged) {
    const std::string key = "valid_" + kept_metric;
    for (const LogField& field : fields) {
      if (field.key == key) {
        keeping_.keep_best(kept_metric, field, since == 0, completed_steps_,
                           [this] { return snapshot(); }, run.out);
      }
    }
  }
  run.stopped_by_patience = schedule_.patience_exhausted(since);
  if (run.stopped_by_patience) {
    run.out << "stopping at step " << step << ": " << since
            << " validations without a better valid " << kept_metric << " than step "
            << kept.step << "'s (checkpoint.patience = " << config_.checkpoint.patience << ")"
            << std::endl;
  }
}

void Trainer::wait_for_rank_zeros_files() {
  // The others wait here for what rank 0 did alone: a checkpoint's copy (and its wait for
  // the write before, or the write itself without background_write), best.h5, a diverged
  // validation's marks. The next step's collectives then wait at most dist.timeout_s, for
  // ranks doing the same work. Rank 0, which comes last in a healthy run, waits within
  // the same limit: a rank stopped since the step's decision still ends the job.
  comm_.wait_for_every_rank();
}

Communicator::WaitLimit Trainer::rank_zeros_work_limit(const std::string& what) const {
  // Before, the others waited without limit: rank 0 held by a hung file system in a
  // checkpoint's write held the job until its time limit. A write that goes on gives a
  // sign with each dataset, however long the whole takes.
  return Communicator::WaitLimit(comm_, config_.dist.timeout_s, what,
                                 Communicator::WaitFrom::kLastSignOfWork,
                                 Communicator::WaitLimit::kResume,
                                 "rank 0 writing a large checkpoint to a slow file system");
}

std::string Trainer::save_completed_step(RunProgress& run) {
  std::string path;
  if (comm_.is_root()) {
    // Still this run's directory: a trainer suspended past the lock's staleness and taken
    // over went on writing and pruning beside the one that took it (both exited 0).
    for (const std::unique_ptr<RunLock>& lock : run_locks_) lock->check_held(run.out);
    // Copying the state out is what the other ranks wait for; the file is written beside
    // training (checkpoint.background_write), or here. Beside training the copy goes
    // into a host buffer kept from one checkpoint to the next: a fresh one costs the
    // host its page faults (a base snapshot, 757 MB: 0.48 s here against 0.08 s into
    // pages already the process's), and on a GPU with pinned_snapshot the copy is queued
    // and not waited for. The writer before must be done with that buffer.
    const bool staged =
        keeping_.writes_in_background() && backend_->param_dtype() == DType::F32;
    if (staged) keeping_.finish_write(run.out);
    const auto start = std::chrono::steady_clock::now();
    std::function<void(Checkpoint&)> fill_state;
    Checkpoint state = staged ? staged_snapshot(fill_state) : snapshot();
    const double copy_seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    ++checkpoints_written_;
    path = keeping_.save(std::move(state), copy_seconds, run.out, std::move(fill_state));
  }
  run.last_saved_step = completed_steps_;
  run.last_save = checkpoint_clock_(completed_steps_);
  return path;
}

RunEnd Trainer::stop_by_signal(int signal, RunProgress& run) {
  run.log_step_unless_logged(schedule_.max_steps(), backend_->peak_memory_bytes());
  const std::string path = save_completed_step(run);
  keeping_.finish_write(run.out);  // on disk before the job says so and exits
  run.log_summary(completed_steps_, best_valid_, config_, checkpoints_written_,
                  detector_->state(), "stopped", signal);
  run.out << "stopped: " << stop_signal_name(signal) << " received; step=" << completed_steps_
          << " checkpoint=" << path << " (resume with --checkpoint.resume=auto";
  if (detector_->state().consecutive_skips > 0) {
    run.out << ", which takes the newest healthy checkpoint: "
            << (comm_.is_root() ? keeping_.resume_point_text() : std::string());
  }
  run.out << ")" << std::endl;
  return RunEnd::Stopped;
}

bool Trainer::ends_training_early(const StepDecision& decision, RunProgress& run) {
  if (decision.out_of_time && !run.stopped_by_patience &&
      run.last.step < schedule_.max_steps()) {
    note_time_limit_stop(completed_steps_, config_.train, run.out);
  }
  const bool ends = run.stopped_by_patience || decision.out_of_time;
  if (ends) run.log_step_unless_logged(schedule_.max_steps(), backend_->peak_memory_bytes());
  return ends;
}

RunEnd Trainer::finish_training(RunProgress& run) {
  // The others wait in the gather below for rank 0's last checkpoint and averages.
  const Communicator::WaitLimit bounded = rank_zeros_work_limit("the end of the run");
  if (comm_.is_root()) {
    if (run.last_saved_step != completed_steps_) save_completed_step(run);
    keeping_.finish_write(run.out);
    for (const bool best : {false, true}) {
      const int wanted = best ? config_.checkpoint.average_best : config_.checkpoint.average_last;
      if (wanted > 0) keeping_.write_average(best, completed_steps_, run.out);
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
  run.out << "checkpoint to resume from: "
          << (comm_.is_root() ? keeping_.resume_point_text() : std::string()) << std::endl;
  // A run whose last validation failed ends at its last step, but not with a model to
  // use: its checkpoints since the last passed validation are marked diverged (a helper's
  // walk read "finished" as a good end). Said at the end, where the summary is read.
  if (divergence_handling_->validation_diverged()) {
    run.out << "warning: the run's last validation failed: its checkpoints after step "
            << divergence_handling_->last_good_validation_step()
            << " (the last validation it passed) are marked diverged, its end among them; "
            << "its model to use is the checkpoint to resume from above (or best.h5), and "
            << "a resume from it with a lower train.lr_scale may go on" << std::endl;
  }
  // Training ends at the schedule's last step, else early: by checkpoint.patience or by
  // train.max_minutes (the loop's only other ways out).
  const char* ended = run.stopped_by_patience                     ? "patience"
                      : completed_steps_ >= schedule_.max_steps() ? "finished"
                                                                  : "time_limit";
  run.log_summary(completed_steps_, best_valid_, config_, checkpoints_written_,
                  detector_->state(), ended, 0, digest);
  // A run resumed at its last step trains no step: it has no loss of its own to print.
  std::ostringstream loss;
  if (run.steps_trained > 0) {
    loss << std::fixed << std::setprecision(6) << run.last.loss;
  } else {
    loss << "n/a";
  }
  // Where the passes were captured into CUDA graphs (train.cuda_kernels step_graphs):
  // how many, so that a user (and the GPU test of the trainer with them) sees the graphs
  // replayed, not refused into the passes launched one by one.
  const Transformer::CaptureCounts& captures = model_->capture_counts();
  if (captures.captures + captures.refused > 0) {
    run.out << "captured passes: " << captures.captures << " captured, " << captures.replays
            << " replayed, " << captures.refused << " refused, " << captures.evicted
            << " evicted" << std::endl;
  }
  run.out << "final: step=" << completed_steps_ << " loss=" << loss.str()
          << " params_sha256=" << digest << std::endl;
  return RunEnd::Finished;
}

}  // namespace thpc
