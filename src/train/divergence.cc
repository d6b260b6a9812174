#include "train/divergence.h"

#include <algorithm>
#include <cmath>
#include <sstream>

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
      text << "the loss " << verdict.value << " is above " << config_.divergence_loss_factor
           << " x " << verdict.reference / config_.divergence_loss_factor
           << " (train.divergence_loss_factor x max(1, the running average of the healthy "
              "steps' loss, at most ln(vocabulary)))";
      break;
    case DivergenceKind::GradNormSpike:
      text << "the gradient norm " << verdict.value << " is above "
           << config_.divergence_gnorm_factor << " x "
           << verdict.reference / config_.divergence_gnorm_factor
           << " (train.divergence_gnorm_factor x the running average of the healthy steps' "
              "gradient norm)";
      break;
  }
  return text.str();
}

}  // namespace thpc
