#include "train/run_progress.h"

#include <algorithm>
#include <cmath>
#include <iostream>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "io/atomic_file.h"
#include "train/stop_request.h"

namespace thpc {

void RunProgress::begin(int64_t first, double clock_now, const DivergenceState& divergence) {
  first_step = first;
  start_ = Clock::now();
  interval_start_ = start_;
  interval_first_step_ = first;
  last_save = clock_now;
  training_start = clock_now;  // train.max_minutes counts from here
  divergence_at_start_ = divergence;
}

double RunProgress::seconds_since_start() const {
  return std::chrono::duration<double>(Clock::now() - start_).count();
}

void RunProgress::count(const StepStats& stats) {
  last = stats;
  ++steps_trained;
  interval_tgt_tokens_ += stats.tgt_tokens;
  total_tgt_tokens_ += stats.tgt_tokens;
}

void RunProgress::restart_interval_at(int64_t step, Clock::time_point now) {
  interval_start_ = now;
  interval_first_step_ = step;
  interval_tgt_tokens_ = 0;
}

void RunProgress::log_step(int64_t max_steps, int64_t peak_memory_bytes) {
  const auto now_wall = Clock::now();
  const double interval =
      std::max(std::chrono::duration<double>(now_wall - interval_start_).count(), 1e-9);
  const double elapsed = std::chrono::duration<double>(now_wall - start_).count();
  const double eta = elapsed / static_cast<double>(steps_trained) *
                     static_cast<double>(max_steps - last.step);
  const int64_t interval_steps = std::max<int64_t>(1, last.step - interval_first_step_);
  const std::vector<LogField> fields = {
      fixed_field("loss", "loss", last.loss, 4),
      fixed_field("ppl", "ppl", std::exp(last.nll), 2),
      fixed_field("epoch", "epoch", static_cast<double>(last.epoch), 0),
      scientific_field("lr", "lr", last.lr, 3),
      general_field("gnorm", "grad_norm", last.grad_norm, 4),
      fixed_field("tgt tokens/s", "tgt_tokens_per_s", interval_tgt_tokens_ / interval, 0),
      fixed_field("ms/step", "ms_per_step", 1000.0 * interval / interval_steps, 1),
      fixed_field("peak mem", "peak_mem_mib",
                  peak_memory_bytes < 0 ? NAN
                                        : static_cast<double>(peak_memory_bytes) / (1 << 20),
                  1, " MiB"),
      fixed_field("elapsed", "elapsed_s", elapsed, 1, "s"),
      fixed_field("eta", "eta_s", eta, 1, "s")};
  out << log_line("step " + std::to_string(last.step) + "/" + std::to_string(max_steps), fields)
      << std::endl;
  metrics.write("train", last.step, elapsed, fields);
  restart_interval_at(last.step, now_wall);
  say_if_the_log_is_lost();
}

void RunProgress::say_if_the_log_is_lost() {
  // (the other ranks' silent stream is never good, and is no file)
  if (lost_log_said_ || out.good() || &out != &std::cout || standard_output_was_closed()) return;
  const std::string failure = standard_output_failure();
  if (failure.empty()) return;  // a reader that left (`| head`): it had what it wanted
  lost_log_said_ = true;
  std::cerr << "transformer_hpc: warning: the log: " << failure << " (noticed at step "
            << last.step << "); training goes on, and its checkpoints and metrics file are "
            << "written" << std::endl;
}

void RunProgress::log_step_unless_logged(int64_t max_steps, int64_t peak_memory_bytes) {
  if (steps_trained > 0 && last.step > interval_first_step_) {
    log_step(max_steps, peak_memory_bytes);
  }
}

void RunProgress::log_summary(int64_t completed_step, const ValidationRecord& best,
                              const Config& config, int checkpoints_written,
                              const DivergenceState& divergence, const std::string& ended,
                              int stop_signal, const std::string& params_sha256) {
  const double wall = seconds_since_start();
  const auto best_field = [](const std::string& metric, const BestValidation& record) {
    LogField field =
        fixed_field("best valid " + metric, "best_valid_" + metric, record.value, 2);
    if (!std::isnan(record.value)) field.text += " (step " + std::to_string(record.step) + ")";
    return field;
  };
  std::vector<LogField> fields = {
      fixed_field("steps", "steps", static_cast<double>(steps_trained), 0,
                  " (" + std::to_string(first_step) + " to " + std::to_string(completed_step) +
                      ")"),
      fixed_field("wall", "train_wall_s", wall, 1, "s"),
      fixed_field("tgt tokens/s", "tgt_tokens_per_s",
                  static_cast<double>(total_tgt_tokens_) / std::max(wall, 1e-9), 0),
      best_field("ppl", best.ppl),
      // BLEU's field as before, or chrF's or F1's when the validations score one.
      best_field(config.train.valid_metric, best.of(config.train.valid_metric)),
      fixed_field("checkpoints", "checkpoints", checkpoints_written, 0)};
  // Only a run that met divergences has these, so that the others' lines stay as they were.
  if (divergence.skipped_steps > divergence_at_start_.skipped_steps) {
    fields.push_back(fixed_field(
        "skipped steps", "skipped_steps",
        static_cast<double>(divergence.skipped_steps - divergence_at_start_.skipped_steps), 0));
  }
  if (divergence.rollbacks > divergence_at_start_.rollbacks) {
    fields.push_back(
        fixed_field("rollbacks", "rollbacks",
                    static_cast<double>(divergence.rollbacks - divergence_at_start_.rollbacks), 0));
  }
  if (stopped_by_patience) {
    const std::string& kept_metric = config.checkpoint.keep_best;
    fields.push_back(fixed_field("stopped by patience", "stopped_by_patience",
                                 config.checkpoint.patience, 0,
                                 " (no better valid " + kept_metric + " since step " +
                                     std::to_string(best.of(kept_metric).step) + ")"));
  }
  out << "summary: " << log_line("", fields) << std::endl;
  // The steps of the best values follow them in the record (null without a value).
  std::vector<LogField> record;
  for (const LogField& field : fields) {
    record.push_back(field);
    for (const std::string& metric : {std::string("ppl"), config.train.valid_metric}) {
      if (field.key != "best_valid_" + metric) continue;
      const BestValidation& of = best.of(metric);
      record.push_back(fixed_field("", field.key + "_step",
                                   std::isnan(of.value) ? NAN : static_cast<double>(of.step),
                                   0));
    }
  }
  std::vector<std::pair<std::string, std::string>> texts = {{"ended", ended}};
  if (stop_signal != 0) texts.emplace_back("stop_signal", stop_signal_name(stop_signal));
  if (!params_sha256.empty()) texts.emplace_back("params_sha256", params_sha256);
  metrics.write("summary", completed_step, wall, record, texts);
}

}  // namespace thpc
