#include "train/divergence.h"

#include <algorithm>
#include <cmath>
#include <iomanip>
#include <ostream>
#include <sstream>

#include "checkpoint/checkpoint_directory.h"
#include "train/rank_agreement.h"

namespace thpc {
namespace {

// Steps an average spans: a plain mean over the first kAverageSteps healthy steps, then
// an exponential average with weight 1 / kAverageSteps on the newest step.
constexpr double kAverageSteps = 50.0;

// The running average after one more healthy value (`count` values before it).
double averaged(double average, double value, int64_t count) {
  if (count == 0 || !std::isfinite(average)) return value;
  const double weight = std::max(1.0 / static_cast<double>(count + 1), 1.0 / kAverageSteps);
  return average + weight * (value - average);
}

// A factor as the user wrote it (float): 1.0001, not the value text's 4 digits ("1").
std::string factor_text(float factor) {
  std::ostringstream text;
  text << std::setprecision(7) << factor;
  return text.str();
}

}  // namespace

const char* divergence_name(DivergenceKind kind) {
  switch (kind) {
    case DivergenceKind::None: return "healthy";
    case DivergenceKind::NonFiniteLoss: return "non-finite loss";
    case DivergenceKind::NonFiniteGradNorm: return "non-finite gradient norm";
    case DivergenceKind::LossSpike: return "loss spike";
    case DivergenceKind::GradNormSpike: return "gradient-norm spike";
  }
  return "divergence";
}

DivergenceDetector::DivergenceDetector(const TrainConfig& config, int vocab_size)
    : config_(config), uniform_loss_(std::log(static_cast<double>(std::max(vocab_size, 2)))) {}

double DivergenceDetector::loss_reference() const {
  const double average = state_.healthy_steps > 0 && std::isfinite(state_.loss_average)
                             ? state_.loss_average
                             : uniform_loss_;
  // Never above ln(vocabulary): a loss that climbs slowly drags its running average up
  // with it (lr_scale = 30 rose from 5.7 to 26 over 80 steps on a vocabulary of 300, each
  // step within 4 x the average, exit 0). A healthy run's average is below the uniform
  // prediction's loss, where it starts; a loss the factor above that is worse than
  // guessing, whatever the average has drifted to.
  return std::max(1.0, std::min(average, uniform_loss_));
}

DivergenceVerdict DivergenceDetector::judge(double loss, double grad_norm) const {
  if (!std::isfinite(loss)) return {DivergenceKind::NonFiniteLoss, loss, 0.0};
  if (!std::isfinite(grad_norm)) return {DivergenceKind::NonFiniteGradNorm, grad_norm, 0.0};
  const double loss_factor = config_.divergence_loss_factor;
  if (loss_factor > 0.0 && loss > loss_factor * loss_reference()) {
    return {DivergenceKind::LossSpike, loss, loss_factor * loss_reference()};
  }
  const double gnorm_factor = config_.divergence_gnorm_factor;
  if (gnorm_factor > 0.0 && state_.healthy_steps >= config_.divergence_warmup &&
      state_.healthy_steps > 0 && grad_norm > gnorm_factor * state_.grad_norm_average) {
    return {DivergenceKind::GradNormSpike, grad_norm, gnorm_factor * state_.grad_norm_average};
  }
  return {};
}

void DivergenceDetector::accept(double loss, double grad_norm) {
  state_.loss_average = averaged(state_.loss_average, loss, state_.healthy_steps);
  state_.grad_norm_average = averaged(state_.grad_norm_average, grad_norm, state_.healthy_steps);
  ++state_.healthy_steps;
  state_.consecutive_skips = 0;
}

std::string DivergenceDetector::describe(const DivergenceVerdict& verdict) const {
  std::ostringstream text;
  text.precision(4);
  switch (verdict.kind) {
    case DivergenceKind::None:
      text << "healthy";
      break;
    case DivergenceKind::NonFiniteLoss:
      text << "the loss is " << verdict.value << " (not finite)";
      break;
    case DivergenceKind::NonFiniteGradNorm:
      text << "the gradient norm is " << verdict.value << " (not finite)";
      break;
    case DivergenceKind::LossSpike:
      text << "the loss " << verdict.value << " is above "
           << factor_text(config_.divergence_loss_factor)
           << " x " << verdict.reference / config_.divergence_loss_factor
           << " (train.divergence_loss_factor x max(1, the running average of the healthy "
              "steps' loss, at most ln(vocabulary)))";
      break;
    case DivergenceKind::GradNormSpike:
      text << "the gradient norm " << verdict.value << " is above "
           << factor_text(config_.divergence_gnorm_factor) << " x "
           << verdict.reference / config_.divergence_gnorm_factor
           << " (train.divergence_gnorm_factor x the running average of the healthy steps' "
              "gradient norm)";
      break;
  }
  return text.str();
}

std::string DivergenceDetector::advice(DivergenceKind kind, bool initialised_parameters,
                                       const std::string& resume_point,
                                       const std::string& checkpoint_dir,
                                       const std::string& stop_reason) const {
  std::ostringstream text;
  if (kind == DivergenceKind::LossSpike && state_.healthy_steps == 0 && initialised_parameters) {
    // Skipped steps update nothing: every step so far judged the initialised model.
    text.precision(4);
    text << "before any update the model's loss is judged against "
            "train.divergence_loss_factor x max(1, ln(vocabulary)) = "
         << config_.divergence_loss_factor * loss_reference()
         << ", and an initialised model can score above ln(vocabulary): set "
            "train.divergence_loss_factor higher (4 by default), or 0 to stop only on a "
            "loss that is not finite";
    return text.str();
  }
  if (resume_point.empty()) {
    text << "start again with a smaller train.lr_scale (or train.clip_norm)";
    // (a rollback's stop reason has said so already)
    if (stop_reason.find("no healthy checkpoint") == std::string::npos) {
      text << ": no healthy checkpoint in " << checkpoint_dir << " to resume from";
    }
  } else {
    text << "resume from " << resume_point
         << " with a smaller train.lr_scale (or train.clip_norm)";
  }
  if (config_.divergence == "stop") {
    text << ", or set train.divergence = skip or rollback";
  } else if (stop_reason.find("train.divergence_limit") != std::string::npos) {
    text << ", or a larger train.divergence_limit";
  }
  return text.str();
}

DivergenceHandling::DivergenceHandling(const Config& config, const Communicator& comm,
                                       DivergenceDetector& detector,
                                       CheckpointKeeping& keeping, const std::string& run_id)
    : config_(config), comm_(comm), detector_(detector), keeping_(keeping), run_id_(run_id) {}

void DivergenceHandling::begin(int64_t step) {
  last_good_validation_step_ = step;
  validation_diverged_ = false;
}

DivergenceHandling::Action DivergenceHandling::handle(
    int64_t step, double loss, double grad_norm, DivergenceKind kind, const std::string& why,
    int64_t completed_step, std::ostream& log, MetricsFile& metrics, double wall_s,
    const Restore& restore, std::string* stop_reason) {
  metrics.write("divergence", step, wall_s,
                {general_field("loss", "loss", loss, 6),
                 general_field("gnorm", "grad_norm", grad_norm, 6),
                 // Not "kind": that is the record's own key ("divergence"), and JSON
                 // readers keep the last of two (the record read as kind 4).
                 fixed_field("cause", "cause", static_cast<double>(kind), 0)});
  DivergenceState& state = detector_.state();
  const int limit = config_.train.divergence_limit;
  const std::string& policy = config_.train.divergence;
  const std::string at = "step " + std::to_string(step) + ": " + why;
  if (policy == "skip") {
    ++state.consecutive_skips;
    if (state.consecutive_skips <= limit) {
      ++state.skipped_steps;  // (the step past the limit is not left out: it ends the run)
      log << "skipped step " << step << ": " << why << "; no update, the next batch ("
          << state.consecutive_skips << " in a row of at most " << limit
          << ", train.divergence_limit)" << std::endl;
      return Action::Skipped;
    }
    *stop_reason = at + " (more than " + std::to_string(limit) + " steps in a row diverged, "
                   "the train.divergence_limit of train.divergence = skip)";
  } else if (policy == "rollback") {
    if (state.rollbacks < limit) {
      log << "diverged at " << at << std::endl;
      if (roll_back(step, completed_step, log, restore)) return Action::RolledBack;
      *stop_reason = at + " (no healthy checkpoint in " + config_.checkpoint.dir +
                     " to roll back to)";
    } else {
      *stop_reason = at + " (rolled back " + std::to_string(limit) +
                     " times already, the train.divergence_limit of train.divergence = "
                     "rollback)";
    }
  } else {
    *stop_reason = at + " (train.divergence = stop)";
  }
  if (comm_.is_root()) keeping_.mark_abandoned(run_id_, completed_step, -1, log);
  return Action::Stop;
}

bool DivergenceHandling::roll_back(int64_t diverged_step, int64_t completed_step,
                                   std::ostream& log, const Restore& restore) {
  if (comm_.is_root()) keeping_.mark_abandoned(run_id_, completed_step, -1, log);
  // Rank 0 chooses, as for resume=auto, and every rank reads its choice.
  Checkpoint checkpoint;
  std::string path, refusal;
  if (comm_.is_root()) {
    try {
      path = newest_valid_checkpoint(config_.checkpoint.dir, log, &checkpoint);
    } catch (const CheckpointOfANewerVersion& error) {
      refusal = error.what();  // every rank ends with it, as at a resume's refusal
    }
  }
  refusal = comm_.broadcast_from_root(refusal);
  if (!refusal.empty()) throw AllRanksError(refusal, 1);
  path = comm_.broadcast_from_root(path);
  if (path.empty()) return false;
  read_the_checkpoint_rank_zero_chose(comm_, path, &checkpoint);
  const DivergenceState before = detector_.state();
  restore(checkpoint, path);
  DivergenceState& state = detector_.state();
  state.rollbacks = before.rollbacks + 1;
  state.lr_factor = before.lr_factor * config_.train.divergence_lr_factor;
  state.skipped_steps = before.skipped_steps;
  state.consecutive_skips = 0;
  // The run now stands at the checkpoint's step.
  if (comm_.is_root()) keeping_.mark_abandoned(run_id_, checkpoint.step, checkpoint.step, log);
  std::ostringstream factor;
  factor << state.lr_factor;
  log << "rolled back to " << path << " (step " << checkpoint.step << ") after step "
      << diverged_step << " diverged; the learning rate is now " << factor.str()
      << " x the schedule's (rollback " << state.rollbacks << " of at most "
      << config_.train.divergence_limit << ", train.divergence_limit)" << std::endl;
  return true;
}

void DivergenceHandling::judge_validation(double nll, const BestValidation& best_ppl,
                                          int64_t step, std::ostream& log) {
  const double factor = config_.train.divergence_loss_factor;
  const double best_nll = std::log(best_ppl.value);  // NaN before the first
  // A loss that is not finite is a divergence whatever the factor (0 judges "only a
  // non-finite loss", as the key's help says: such a validation passed, and its BLEU of
  // a NaN model became best.h5, marked healthy; a helper's trial).
  const bool not_finite = !std::isfinite(nll);
  const bool diverged =
      not_finite ||
      (factor > 0 && std::isfinite(best_nll) && nll > factor * std::max(1.0, best_nll));
  if (!diverged) {
    validation_diverged_ = false;
    last_good_validation_step_ = step;
    return;
  }
  validation_diverged_ = true;
  std::ostringstream warning;  // the log's stream may be in fixed notation
  warning << std::setprecision(4) << "warning: the validation at step " << step;
  if (not_finite) {
    warning << " has a loss that is not finite (" << (std::isnan(nll) ? "nan" : "inf") << ")";
  } else {
    warning << " has a perplexity of " << std::exp(nll)
            << ", its log more than train.divergence_loss_factor = " << factor
            << " times the best's (" << best_ppl.value << " at step " << best_ppl.step << ")";
  }
  warning << ": the checkpoints after step " << last_good_validation_step_
          << " are marked diverged, and those written until a validation is below that again";
  log << warning.str() << std::endl;
  if (comm_.is_root()) {
    keeping_.mark_after_failed_validation(run_id_, last_good_validation_step_, log);
  }
}

}  // namespace thpc
