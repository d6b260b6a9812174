// transformer_average: averages the parameters of checkpoints, after fairseq's
// scripts/average_checkpoints.py (the paper averages the last 5 checkpoints of a base
// run and the last 20 of a big one, §6.1).
//
//   transformer_average --inputs DIR --last N [--every-steps K] --output FILE
//   transformer_average --inputs DIR --best N --output FILE
//   transformer_average --inputs F1 F2 ... --output FILE
//
// --best takes the N best of the checkpoints a run kept with checkpoint.keep_best_count
// (DIR/best_step_*.h5), ranked by the validation score stored inside each file, as the
// run ranked them (fairseq's --keep-best-checkpoints, then average_checkpoints.py on
// those files).
//
// The result is a parameters-only checkpoint that decoding accepts and that training can
// start from (checkpoint.init=FILE). Exit codes: 0 success, 1 a bad checkpoint or
// mismatched architectures, 2 a bad command line (an output that is an input, a training
// run's file or anything but an earlier average included). On a terminal it shows the
// checkpoints read so far on stderr (tools/progress.h).
#include <boost/program_options.hpp>

#include <algorithm>
#include <filesystem>
#include <iostream>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "checkpoint/checkpoint_directory.h"
#include "checkpoint/output_file.h"
#include "common/error.h"
#include "tools/progress.h"
#include "tools/tool_main.h"

namespace {

namespace po = boost::program_options;

struct Arguments {
  std::vector<std::string> inputs;
  int last = 0;
  int64_t every_steps = 0;  // with --last: the schedule's checkpoints only
  int best = 0;
  std::string output;
  bool help = false;
  std::vector<std::string> paths;  // the checkpoints to average, from inputs and last/best
  std::string metric;              // with --best: the metric the files were ranked by
  // Inputs that are averages themselves, or quantized checkpoints (parameters only and of
  // no run too): said once the inputs are read and averaged.
  std::vector<std::string> averages;
};

// The files to average: the last N step_*.h5 of a directory, its N best best_step_*.h5,
// or the files as given.
std::vector<std::string> resolve_inputs(Arguments& arguments) {
  std::error_code error;
  const bool one_directory =
      arguments.inputs.size() == 1 && std::filesystem::is_directory(arguments.inputs[0], error);
  if (arguments.last > 0 && arguments.best > 0) {
    THPC_FAIL("--last and --best are two ways to choose from a directory: give one");
  }
  if (arguments.every_steps < 0) {
    THPC_FAIL("--every-steps " << arguments.every_steps << ": give the run's "
              << "checkpoint.every_steps (1 or more)");
  }
  if (arguments.every_steps > 0 && arguments.last < 1) {
    THPC_FAIL("--every-steps chooses among a directory's newest checkpoints: give --last N");
  }
  if (!one_directory) {
    if (arguments.last > 0 || arguments.best > 0) {
      const std::string option = arguments.last > 0 ? "--last" : "--best";
      // Said as it is: a directory that does not exist, or several, were told to "give
      // --inputs DIR", which they had.
      if (arguments.inputs.size() > 1) {
        THPC_FAIL(option << " selects from one directory, and --inputs gives "
                         << arguments.inputs.size() << " paths: give one --inputs DIR");
      }
      if (!std::filesystem::exists(arguments.inputs[0], error)) {
        THPC_FAIL("--inputs " << arguments.inputs[0] << ": no such directory (" << option
                              << " selects from a run's checkpoint.dir)");
      }
      THPC_FAIL(option << " selects from a directory, and --inputs " << arguments.inputs[0]
                       << " is a file: give --inputs DIR, or the checkpoints themselves "
                       << "without " << option);
    }
    return arguments.inputs;
  }
  if (arguments.best > 0) {
    const std::vector<std::string> paths =
        thpc::best_checkpoints(arguments.inputs[0], arguments.best, &arguments.metric);
    // None at all is a run that kept none (checkpoint.keep_best = none, the default): no
    // smaller N helps, which the advice for too few said ("holds 0 ...: give a smaller N").
    if (paths.empty()) {
      THPC_FAIL(arguments.inputs[0]
                << " holds no best checkpoints (best_step_*.h5 with a validation score): "
                << "the run kept none (they are kept with checkpoint.keep_best = ppl, bleu, "
                << "chrf or f1, checkpoint.keep_best_count >= 1 and validations, "
                << "train.valid_every); average its last checkpoints with --last N instead");
    }
    if (static_cast<int>(paths.size()) < arguments.best) {
      THPC_FAIL(arguments.inputs[0]
                << " holds " << paths.size() << " best checkpoints (best_step_*.h5 with a "
                << "validation score), --best asks for " << arguments.best
                << ": give a smaller N (the run kept checkpoint.keep_best_count of them, "
                << "fewer if fewer validations ran)");
    }
    return paths;
  }
  if (arguments.last < 1) THPC_FAIL("--inputs DIR needs --last N or --best N (N >= 1)");
  // By the step stored in each file, healthy ones only: a checkpoint its run marked
  // diverged or superseded would poison the average. With --every-steps, those of the
  // schedule, as the trainer's checkpoint.average_last chooses them: its multiples and the
  // newest (the run's end), so that a stop checkpoint a requeued job wrote between them
  // does not take the oldest step's place in the window.
  int64_t newest_step = -1;
  if (arguments.every_steps > 0) {
    for (const thpc::CheckpointSummary& summary : thpc::checkpoint_summaries(arguments.inputs[0])) {
      if (summary.state == thpc::CheckpointState::Healthy) newest_step = summary.step;
    }
  }
  const std::vector<std::string> paths = thpc::newest_healthy_checkpoints(
      arguments.inputs[0], arguments.last, arguments.every_steps, newest_step);
  if (static_cast<int>(paths.size()) < arguments.last) {
    THPC_FAIL(arguments.inputs[0]
              << " holds " << paths.size() << " healthy step_*.h5 checkpoint"
              << (paths.size() == 1 ? "" : "s")
              << (arguments.every_steps > 0
                      ? " of a schedule every " + std::to_string(arguments.every_steps) +
                            " steps (multiples of it, and the newest)"
                      : std::string())
              << ", --last asks for " << arguments.last
              << (paths.empty() ? std::string()
                                : ": give --last " + std::to_string(paths.size()) + " or less"));
  }
  return paths;
}

// Files named by hand (or by a glob) that cannot mean what the average would say: the same
// file twice, or the same step of one run under two names (best.h5 or best_step_N.h5
// beside step_N.h5, a copy: `--inputs DIR/*.h5` counted step 450 three times), each of
// which counts it twice, and a checkpoint marked diverged or superseded, whose parameters
// a run abandoned (a directory's --last and --best pass over those already). A
// command-line mistake: exit 2. An average among the inputs is said (its checkpoints
// weigh again), not refused: an average of averages may be meant; those are returned.
std::vector<std::string> check_each_input_once_and_healthy(const std::vector<std::string>& paths) {
  std::vector<std::string> averages;
  std::error_code error;
  std::map<std::pair<std::string, int64_t>, std::string> run_steps;
  for (size_t i = 0; i < paths.size(); ++i) {
    for (size_t j = 0; j < i; ++j) {
      if (std::filesystem::equivalent(paths[i], paths[j], error)) {
        THPC_FAIL("--inputs names one file twice (" << paths[j] << " and " << paths[i]
                  << "): it would weigh double in the average; name each checkpoint once");
      }
    }
    const std::optional<thpc::CheckpointSummary> summary = thpc::read_checkpoint_summary(paths[i]);
    if (summary && !summary->run_id.empty()) {
      const auto [same, fresh] =
          run_steps.emplace(std::pair{summary->run_id, summary->step}, paths[i]);
      if (!fresh) {
        THPC_FAIL("--inputs " << same->second << " and " << paths[i] << " are both step "
                  << summary->step << " of run " << summary->run_id << " (best.h5 or "
                  << "best_step_*.h5 beside its step_*.h5, or a copy): it would weigh double "
                  << "in the average; name each checkpoint once");
      }
    }
    // (named as a run's step a file is one, whatever it holds: a hand-made one say)
    if (summary && summary->parameters_only && summary->run_id.empty() &&
        !thpc::is_step_checkpoint_name(paths[i])) {
      averages.push_back(paths[i]);
    }
    if (summary && summary->state != thpc::CheckpointState::Healthy) {
      THPC_FAIL("--inputs " << paths[i] << " is marked "
                << thpc::checkpoint_state_name(summary->state)
                << (summary->state == thpc::CheckpointState::Diverged
                        ? " (its parameters produced a divergent loss)"
                        : " (a rollback, or a resume from an earlier step, abandoned its "
                          "branch)")
                << ": averaging it would mix those parameters into the result; leave it out");
    }
  }
  return averages;
}

// Checkpoints of different runs (run ids) average parameters that were never trained
// together: allowed (runs started from one checkpoint.init may share a basin), said.
void warn_of_other_runs(const std::vector<std::string>& paths) {
  std::string first_run, first_path;
  for (const std::string& path : paths) {
    const std::optional<thpc::CheckpointSummary> summary = thpc::read_checkpoint_summary(path);
    if (!summary || summary->run_id.empty()) continue;
    if (first_run.empty()) {
      first_run = summary->run_id;
      first_path = path;
    } else if (summary->run_id != first_run) {
      std::cerr << "transformer_average: warning: " << first_path << " (run " << first_run
                << ") and " << path << " (run " << summary->run_id << ") are of different "
                << "runs: their parameters were not trained together, and their average is "
                << "a model only where the runs started from one checkpoint" << std::endl;
      return;
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  Arguments arguments;
  po::options_description options(
      "usage: transformer_average --inputs DIR --last N [--every-steps K] --output FILE\n"
      "       transformer_average --inputs DIR --best N --output FILE\n"
      "       transformer_average --inputs F1 F2 ... --output FILE\n\n"
      "Averages the parameters of checkpoints (in double precision) into a new,\n"
      "parameters-only checkpoint. All inputs must share one architecture.\n\noptions");
  options.add_options()("help,h", "print this text and exit")(
      "version", "print the git commit the program was built from and exit")(
      "inputs", po::value(&arguments.inputs)->multitoken()->required(),
      "a run's checkpoint directory, or checkpoint files (required)")(
      "last", po::value(&arguments.last),
      "with a directory: average its newest N checkpoints (this or --best required then)")(
      "every-steps", po::value(&arguments.every_steps),
      "with --last: of a run's checkpoint.every_steps schedule only, its multiples and the "
      "newest (the run's end), as the trainer's checkpoint.average_last takes them: a "
      "checkpoint a stop signal wrote between them is passed over")(
      "best", po::value(&arguments.best),
      "with a directory: average its N best checkpoints (best_step_*.h5, ranked by the "
      "validation score stored in each)")(
      "output", po::value(&arguments.output)->required(),
      "the averaged checkpoint to write (required)");
  // Which files, and whether the output may be written, are part of the command line:
  // a mistake there is exit 2, like a bad option.
  const auto parse = [&](int count, char** values) {
    const po::variables_map given = thpc::tools::parse_options(options, count, values);
    arguments.help = given.count("help") > 0;
    // 0, given, read as the option left out (every checkpoint), with no word said.
    if (!arguments.help && given.count("every-steps") && arguments.every_steps == 0) {
      THPC_FAIL("--every-steps 0: give the run's checkpoint.every_steps (1 or more), or leave "
                "it out to average the newest checkpoints whatever their steps");
    }
    if (!arguments.help) {
      if (arguments.output.empty()) THPC_FAIL("--output is empty: give a file name");
      arguments.paths = resolve_inputs(arguments);
      arguments.averages = check_each_input_once_and_healthy(arguments.paths);
      // Never over an input (an average would replace a full checkpoint, Adam moments
      // included, by parameters only), a training run's file (step_*.h5, best.h5, a
      // checkpoint holding a training state) or anything but an earlier average, however
      // the path is spelt (checkpoint/output_file.h). Writing is atomic (write_checkpoint).
      thpc::check_output_path("--output", arguments.output, arguments.paths,
                              thpc::OutputKind::Checkpoint);
    }
    return arguments;
  };
  const auto run = [](const Arguments& command) {
    thpc::tools::StageProgress progress("transformer_average");
    thpc::Checkpoint average;
    try {
      average = thpc::average_checkpoints(command.paths, progress);
    } catch (const thpc::Error& failure) {
      // A file the directory's --last / --best chose that cannot be read (truncated,
      // damaged) said with the way on: the message named the file, and the user did not
      // (a helper's trial: "cannot be opened", and no more). Only where the message names
      // one of the files: two that do not go together (other architectures) are for the
      // user to tell apart.
      if (command.last < 1 && command.best < 1) throw;
      // A later version's file is no damaged one to move out of the way.
      if (dynamic_cast<const thpc::CheckpointOfANewerVersion*>(&failure) != nullptr) throw;
      const std::string what = failure.what();
      const auto named = std::count_if(command.paths.begin(), command.paths.end(),
                                       [&](const std::string& path) {
                                         return what.find(path) != std::string::npos;
                                       });
      if (named != 1) throw;
      const std::string& dir = command.inputs[0];
      // (--best: the run kept checkpoint.keep_best_count of them, often N; none is left)
      throw thpc::Error(what + " (" + (command.last > 0 ? "--last" : "--best") +
                        " chose it from " + dir + "; to average without it, move it out of " +
                        dir + " and run again" +
                        (command.last > 0 ? ", and --last takes the next older one"
                                          : " with a smaller --best") +
                        ", or name the checkpoints to average: --inputs FILE FILE ...)");
    }
    // Once the average is made: checkpoints that cannot be averaged (other shapes) are one
    // line, their error, not this warning first (a helper's walk).
    warn_of_other_runs(command.paths);
    for (const std::string& path : command.averages) {
      // (read again: such inputs are few, and the header does not tell the two apart)
      if (!thpc::read_checkpoint(path, thpc::CheckpointParts::ParamsOnly).quantized.empty()) {
        std::cerr << "transformer_average: warning: --inputs " << path << " is quantized "
                  << "(transformer_quantize): its parameters are averaged dequantized, their "
                  << "int8 rounding included" << std::endl;
      } else {
        std::cerr << "transformer_average: warning: --inputs " << path << " is itself an "
                  << "average (parameters only, of no one run): the checkpoints in it weigh "
                  << "again in this one" << std::endl;
      }
    }
    const std::string replaced = thpc::checkpoint_output_replaces(command.output);
    thpc::write_checkpoint(command.output, average);
    std::cout << "averaged " << command.paths.size()
              << (command.metric.empty() ? "" : " best (by valid " + command.metric + ")")
              << (command.paths.size() == 1 ? " checkpoint:" : " checkpoints:");
    for (const std::string& path : command.paths) std::cout << " " << path;
    std::cout << "\nwrote " << command.output << " (step " << average.step << ", "
              << average.architecture
              << (replaced.empty() ? "" : "; replacing " + replaced) << ")\n";
    return 0;
  };
  return thpc::tools::tool_main("transformer_average", thpc::tools::usage_text(options), argc,
                                argv, parse, run, "the --output checkpoint");
}
