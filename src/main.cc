// transformer_hpc: trains the Transformer of "Attention Is All You Need".
//
//   [mpirun -np N] transformer_hpc CONFIG.ini [--section.key=value ...]
//                  [--dry-run | --eval CHECKPOINT] [--help]
//
// Exit codes (docs/running.md "Exit codes"): 0 trained to the end, or stopped by SIGTERM/SIGUSR1
// (with a checkpoint, or before training when the signal came during start-up);
// 1 a runtime failure (on any rank: the whole job is ended); 2 a bad command line or
// config; 3 missing or invalid training data; 4 training diverged (train.divergence: a
// loss or gradient norm not finite or spiking), the checkpoint to resume from named.
#include <unistd.h>

#include <filesystem>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "backend/factory.h"
#include "checkpoint/checkpoint.h"
#include "common/error.h"
#include "config/config.h"
#include "distributed/communicator.h"
#include "distributed/mpi_sanitizer_options.h"
#include "io/atomic_file.h"
#include "kernels/cpu/openblas_core.h"
#include "model/params.h"
#include "model/transformer.h"
#include "train/footprint.h"
#include "train/stop_request.h"
#include "train/trainer.h"

namespace {

int dry_run(const thpc::Config& config, int ranks, std::ostream& out) {
  int vocab = config.model.vocab_size;
  // A configured vocabulary needs no data (base.ini checks before the shards exist); when
  // the data is there (the synthetic task always is) it is read and checked as training
  // would read it (drops and warnings included), and must agree with model.vocab_size.
  std::error_code missing;
  std::unique_ptr<thpc::BatchSource> source;
  if (config.data.dir.empty() || vocab == 0 ||
      std::filesystem::is_directory(config.data.dir, missing)) {
    source = thpc::make_training_source(config);
    // The synthetic task's line too; as comment lines, so that the output stays an ini file
    // (a resolved config saved and given back was refused at its first note).
    std::ostringstream notes;
    source->print_notes(notes, "data.train");
    std::istringstream note_lines(notes.str());
    for (std::string line; std::getline(note_lines, line);) out << "# " << line << "\n";
    vocab = thpc::resolve_vocab_size(config, *source);
    // The validation shards too, when training would read them (exit 3 as there).
    if (config.train.valid_every > 0) {
      const std::unique_ptr<thpc::ShardReader> valid = thpc::make_validation_source(config);
      if (!config.data.dir.empty()) thpc::check_validation_vocabulary(config, *source, *valid);
    }
  }
  // What training refuses before building anything, refused here alike: the build's
  // backend, and batches that cannot hold the data's longest pair (with the ranks of
  // this dry run: give it the job's -np).
  if (source) {
    const std::string impossible = thpc::configuration_impossible(config, *source, ranks);
    if (!impossible.empty()) throw thpc::AllRanksError(impossible, 2);
  }
  // Sizes that cannot be allocated are a configuration error here as in training.
  const std::string too_large =
      thpc::training_does_not_fit(config, vocab, thpc::host_memory_bytes(), ranks);
  if (!too_large.empty()) throw thpc::AllRanksError(too_large, 2);
  // A checkpoint training would start from must be readable and of this architecture
  // (exit 1 as there), read as training reads it: checkpoint.init's parameters only (an
  // average, which has no Adam moments, was refused here and trained from there), and the
  // whole state of the file checkpoint.resume names.
  const std::string& resume = config.checkpoint.resume;
  const bool resume_names_a_file = !resume.empty() && resume != "auto" && resume != "auto_or_fresh";
  const std::pair<std::string, thpc::CheckpointParts> starts[] = {
      {config.checkpoint.init, thpc::CheckpointParts::ParamsOnly},
      {resume_names_a_file ? resume : "", thpc::CheckpointParts::All}};
  for (const auto& [path, parts] : starts) {
    if (path.empty()) continue;
    const thpc::Checkpoint checkpoint = thpc::read_checkpoint(path, parts);
    if (source) thpc::check_checkpoint_vocabulary(checkpoint, path, *source, config);
    thpc::check_architecture(checkpoint, thpc::architecture_text(config.model, vocab), path);
  }
  thpc::ParamStore table;
  thpc::add_transformer_parameters(config.model, vocab, table);
  out << config.to_ini() << "\n# parameters: " << table.count() << " (vocabulary "
            << vocab << ")\n";
  // What this machine cannot check, said rather than passed in silence: a login node may
  // lack the job's GPUs or its data (staged later, or on the compute nodes' file system).
  // Comment lines, so that the output stays an ini file.
  if (!source) {
    out << "# note: data.dir " << config.data.dir << " is no directory here: its data was "
              << "not read (training stops without it, exit 3)\n";
  }
  if (config.train.backend == "cuda" && thpc::built_with_cuda() &&
      !thpc::cuda_unavailable_reason().empty()) {
    out << "# note: train.backend = cuda, but here " << thpc::cuda_unavailable_reason()
              << ": training needs a GPU (run it where the job's GPUs are)\n";
  }
  return 0;
}

// What a rank was asked to do, for the start-up agreement: its mode and the resolved
// keys (not the comment naming the file: ranks may read the same configuration under
// different paths), or its command line's mistake.
std::string rank_request(const thpc::Config& config, const std::string& config_error) {
  if (!config_error.empty()) return "error\n" + config_error;
  std::string request = config.dry_run ? "mode dry-run\n"
                        : config.eval_checkpoint.empty()
                            ? "mode train\n"
                            : "mode eval " + config.eval_checkpoint + "\n";
  std::istringstream lines(config.to_ini());
  for (std::string line; std::getline(lines, line);) {
    if (line.empty() || line.front() != '#') request += line + "\n";
  }
  return request;
}

// "" when every rank was asked what rank 0 was (or made the same mistake), else why not,
// naming the ranks and the keys that differ. A collective: every rank calls it, so that
// a rank with another configuration (or a bad one) ends the job with one message instead
// of a hang, a segfault or a check failure steps later.
// The dry run on every rank, rank 0 speaking: each rank checks what training would read
// there (its node's data, its working directory; rank 0's alone passed a job whose other
// ranks training then stopped, exit 3), and the first that cannot is named with its reason
// and training's exit code, before any rank prints the configuration.
int dry_run_on_every_rank(const thpc::Config& config, const thpc::Communicator& comm) {
  std::ostringstream output;
  int code = 0;
  std::string failure;
  try {
    dry_run(config, comm.size(), output);
  } catch (const thpc::AllRanksError& e) {
    code = e.exit_code();
    failure = "error: " + std::string(e.what());
  } catch (const thpc::DataError& e) {
    code = 3;
    failure = "error on " + thpc::process_identity() + ": " + e.what();
  } catch (const std::exception& e) {
    code = 1;
    failure = "error on " + thpc::process_identity() + ": " + thpc::failure_message(e);
  }
  for (const std::string& outcome : comm.all_gather(std::to_string(code) + "\n" + failure)) {
    const size_t end = outcome.find('\n');
    const int rank_code = std::stoi(outcome.substr(0, end));
    if (rank_code == 0) continue;
    if (comm.is_root()) std::cerr << "transformer_hpc: " << outcome.substr(end + 1) << std::endl;
    return rank_code;
  }
  if (comm.is_root()) std::cout << output.str() << std::flush;
  return 0;
}

std::string configuration_disagreement(const thpc::Communicator& comm,
                                       const std::string& request) {
  const std::vector<std::string> all = comm.all_gather_if_different(request);
  if (all.empty()) return "";
  const auto error_of = [](const std::string& text) {
    return text.rfind("error\n", 0) == 0 ? text.substr(6) : std::string();
  };
  if (!error_of(all[0]).empty()) return error_of(all[0]);  // rank 0's own mistake first
  const auto mode_of = [](const std::string& text) { return text.substr(0, text.find('\n')); };
  std::ostringstream message;
  message << "the ranks were not started alike";
  int listed = 0;
  for (size_t rank = 1; rank < all.size(); ++rank) {
    if (all[rank] == all[0]) continue;
    if (++listed > 3) {
      message << "; ...";
      break;
    }
    message << "; rank " << rank;
    if (!error_of(all[rank]).empty()) {
      message << ": " << error_of(all[rank]);
      continue;
    }
    if (mode_of(all[rank]) != mode_of(all[0])) {
      message << " has " << mode_of(all[rank]) << " where rank 0 has " << mode_of(all[0]);
      continue;
    }
    const std::vector<thpc::ConfigDifference> differences =
        thpc::config_differences(all[rank], all[0]);
    message << " has ";
    for (size_t i = 0; i < differences.size() && i < 6; ++i) {
      message << (i ? ", " : "") << differences[i].key << " = " << differences[i].value
              << " where rank 0 has " << differences[i].reference;
    }
    if (differences.size() > 6) message << ", ... (" << differences.size() << " keys)";
  }
  message << " (every rank must be started with the same config file and overrides)";
  return message.str();
}

// The test suite's hooks that this environment sets, "NAME=VALUE" each: they fake a
// divergence, a signal, a failure or a slow write (THPC_TEST_*, THPC_FAIL_AT, THPC_KILL_AT,
// THPC_STOP_AT), and a run that inherits one from a shell that ran tests was told of a
// divergence or a SIGTERM that never happened.
std::vector<std::string> test_hooks_set() {
  std::vector<std::string> hooks;
  for (char** entry = environ; entry != nullptr && *entry != nullptr; ++entry) {
    const std::string text = *entry;
    const std::string name = text.substr(0, text.find('='));
    if (name.rfind("THPC_TEST_", 0) == 0 || name == "THPC_FAIL_AT" || name == "THPC_KILL_AT" ||
        name == "THPC_STOP_AT") {
      hooks.push_back(text);
    }
  }
  return hooks;
}

}  // namespace

int main(int argc, char** argv) {
  // On a CPU that OpenBLAS does not know, its AVX-512 (or AVX2) kernels instead of its
  // fallback's SSE3 ones: the program starts again with OPENBLAS_CORETYPE set, before
  // anything else (kernels/cpu/openblas_core.h).
  thpc::run_with_openblas_kernels_for_this_cpu(argv);
  // Slurm's stop signals are recorded from the first instruction that can take time (MPI
  // start-up takes half a second): one that arrives while MPI starts, the shards are
  // checked or a checkpoint is read stops the run before training (exit 0), instead of
  // killing the process without a word (exit 143). Open MPI leaves SIGTERM and SIGUSR1
  // to the program (its own handlers are for crashes).
  const thpc::StopSignalGuard stop_signals;
  thpc::fail_writes_past_the_file_size_limit();
  thpc::MpiSession mpi(&argc, &argv);
  const thpc::Communicator comm = thpc::Communicator::world();
  thpc::Config config;
  std::string config_error;
  bool help = false;
  try {
    help = !thpc::parse_command_line(argc, argv, config);  // --help printed
  } catch (const thpc::Error& e) {
    config_error = e.what();
  }
  // A bad configuration is not one rank's own business: every rank takes part in the
  // agreement, so that the job ends together, with one message from rank 0. --help too:
  // a rank that left without it kept the others waiting forever.
  const std::string disagreement =
      configuration_disagreement(comm, help ? "mode help\n" : rank_request(config, config_error));
  if (help && disagreement.empty()) return 0;
  if (!disagreement.empty() || !config_error.empty()) {
    if (comm.is_root()) {
      const std::string& message = disagreement.empty() ? config_error : disagreement;
      // Once: many messages point at --help themselves.
      std::cerr << "transformer_hpc: " << message
                << (message.find("--help") == std::string::npos ? "\n(see --help)\n" : "\n");
    }
    return 2;
  }
  try {
    if (config.dry_run) return dry_run_on_every_rank(config, comm);
    if (!config.eval_checkpoint.empty()) {
      thpc::evaluate_checkpoint(config, config.eval_checkpoint, comm, std::cout);
      return 0;
    }
    // Rank 0 speaks for the job: a Ctrl-C says at once what it does.
    if (comm.is_root()) thpc::announce_interrupts();
    if (comm.is_root()) {
      for (const std::string& hook : test_hooks_set()) {
        std::cerr << "warning: the test suite's hook " << hook << " is set: it fakes what "
                  << "its name says (unset it for a real run)" << std::endl;
      }
    }
    thpc::Trainer trainer(config, comm);
    std::cout << thpc::startup_line(comm, "device " + trainer.device_description())
              << std::endl;
    if (trainer.run(std::cout) == thpc::RunEnd::Diverged) return thpc::kDivergedExitCode;
  } catch (const thpc::StoppedDuringStartUp& e) {
    // A stop, not a failure: the line a stop during start-up prints, exit 0.
    if (comm.is_root()) std::cout << e.what() << std::endl;
    return 0;
  } catch (const thpc::AllRanksError& e) {
    // Every rank raised it together: one message, and no rank needs ending by force.
    if (comm.is_root()) std::cerr << "transformer_hpc: error: " << e.what() << std::endl;
    return e.exit_code();
  } catch (const thpc::DataError& e) {
    comm.abort("transformer_hpc: error on " + thpc::process_identity() + ": " + e.what(), 3);
  } catch (const std::exception& e) {
    // A failure on one rank must end the whole job, not leave the others waiting in a
    // collective: report it with this rank's identity and abort every rank.
    comm.abort("transformer_hpc: error on " + thpc::process_identity() + ": " +
                   thpc::failure_message(e), 1);
  }
  return 0;
}
