// transformer_hpc: trains the Transformer of "Attention Is All You Need".
//
//   [mpirun -np N] transformer_hpc CONFIG.ini [--section.key=value ...]
//                  [--dry-run | --eval CHECKPOINT] [--help] [--version]
//   transformer_hpc --show-checkpoint CHECKPOINT
//
// Exit codes (docs/running.md "Exit codes"): 0 trained to the end, or stopped by SIGTERM/SIGUSR1
// (with a checkpoint, or before training when the signal came during start-up);
// 1 a runtime failure (on any rank: the whole job is ended); 2 a bad command line or
// config; 3 missing or invalid training data; 4 training diverged (train.divergence: a
// loss or gradient norm not finite or spiking), the checkpoint to resume from named.
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iomanip>
#include <iostream>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "backend/factory.h"
#include "checkpoint/checkpoint.h"
#include "checkpoint/checkpoint_directory.h"
#include "common/error.h"
#include "common/sha256.h"
#include "common/source_version.h"
#include "config/config.h"
#include "distributed/communicator.h"
#include "distributed/mpi_check.h"
#include "distributed/mpi_sanitizer_options.h"
#include "distributed/rank_failures.h"
#include "io/atomic_file.h"
#include "io/hdf5.h"
#include "kernels/cpu/blas.h"
#include "kernels/cpu/openblas_core.h"
#include "model/checkpoint_params.h"
#include "model/params.h"
#include "model/transformer.h"
#include "train/checkpoint_keeping.h"
#include "train/footprint.h"
#include "train/idle_settings.h"
#include "train/lr_schedule.h"
#include "train/rank_agreement.h"
#include "train/resume.h"
#include "train/run_directory.h"
#include "train/stop_request.h"
#include "train/test_hooks.h"
#include "train/trainer.h"
#include "train/validation.h"

namespace {

// Where the dry run found that training would start: the checkpoint it would resume from
// ("" for step 0 or checkpoint.init), that checkpoint's step and run.
struct DryRunStart {
  std::string resumed_from;
  int64_t step = 0;
  std::string run_id;
  std::vector<thpc::BranchStart> lineage;  // the checkpoint's (Checkpoint::lineage)
  int64_t last_step = 0;  // where training would end: train.max_steps or max_epochs' end
  // The sha256 of the parameters this rank read (of the checkpoint resumed, else of
  // checkpoint.init's; "" for neither), which every rank's must equal, as in training:
  // parameters_sha256, the digest training compares (and its final: line prints).
  std::string params_digest;
  // The keys the resume's notes named as without effect (log_resume_notes), which the
  // dry run's note of settings without effect then leaves out, as training's does.
  std::vector<std::string> idle_keys_said;
};

// Whether training would run on a GPU: the backend named, or one visible to auto (a login
// node's auto may run on the job's GPUs: said apart).
bool on_a_gpu(const thpc::Config& config) {
  return config.train.backend == "cuda" ||
         (config.train.backend == "auto" && thpc::cuda_unavailable_reason().empty());
}

// Rank 0's choice of the checkpoint to resume from, training's own
// (CheckpointKeeping::choose_start; its refusal exits 1 as there), read into *checkpoint;
// "" for none. The invalid ones training would move aside first are said on `notes` and
// listed in *moved_aside.
std::string choose_the_start(const thpc::Config& config, thpc::Checkpoint* checkpoint,
                             std::set<std::string>* moved_aside, std::ostream& notes) {
  const thpc::CheckpointKeeping keeping(config);
  const thpc::CheckpointKeeping::StartChoice choice = keeping.choose_start(checkpoint, notes);
  // Rank 0 speaks for every rank here, as training does (it broadcasts the refusal).
  if (!choice.refusal.empty()) throw thpc::AllRanksError(choice.refusal, 1);
  for (const thpc::InvalidCheckpoint& file : choice.invalid) {
    notes << "note: training would move the invalid checkpoint " << file.path << " aside"
          << std::endl;
    moved_aside->insert(file.path);
  }
  return choice.path;
}

// The start every rank checks as training does (its exit codes: 2 for another
// architecture or seed, 1 for the rest): the checkpoint rank 0 chose (`chosen`; read here
// by the other ranks, as training's do), whole, of this architecture, vocabulary and
// seed, with Adam moments; else checkpoint.init's parameters
// (not read when a checkpoint is resumed: training ignores it then, and a file moved away
// after the first run was refused here). Where training would end from there: with
// train.max_epochs, from the data's position as training reckons it (`source`, when the
// data is here, is moved there). Later checkpoints a resume from an older one would mark
// superseded are said on `notes`.
DryRunStart check_the_start(const thpc::Config& config, const std::string& chosen,
                            thpc::Checkpoint& checkpoint, bool read_it,
                            const std::set<std::string>& moved_aside, thpc::BatchSource* source,
                            int vocab, int ranks, std::ostream& notes) {
  const thpc::CheckpointConfig& options = config.checkpoint;
  const std::string architecture =
      thpc::architecture_text(config.model, vocab, source ? source->source_vocab_size() : 0);
  DryRunStart start;
  if (!chosen.empty()) {
    if (read_it) checkpoint = thpc::read_checkpoint(chosen);
    if (source) thpc::check_checkpoint_vocabulary(checkpoint, chosen, *source, config);
    thpc::check_checkpoint_architecture(checkpoint, chosen, architecture);
    thpc::check_checkpoint_resumes_this_run(checkpoint, chosen, config);
    start.resumed_from = chosen;
    start.step = checkpoint.step;
    start.run_id = checkpoint.run_id;
    start.lineage = checkpoint.lineage;
    start.params_digest = thpc::parameters_sha256(checkpoint, config.model, chosen);
  }
  start.last_step = config.train.max_steps;
  std::string position_note;
  const int64_t budget =
      thpc::micro_batch_budget(config.train.tokens_per_step, config.train.accumulate, ranks);
  if (!chosen.empty() && source) {
    source->seek(thpc::position_at_this_budget(checkpoint, chosen, *source, budget, ranks,
                                               config.train, position_note));
  }
  if (config.train.max_epochs > 0 && source) {
    start.last_step = std::min(
        start.last_step,
        thpc::end_of_epochs_from(*source, budget, ranks, config.train, start.step).last_step);
  }
  if (!chosen.empty()) {
    // A resume from older than the run's newest starts another branch: training marks the
    // run's checkpoints of the branch it leaves superseded, and those of the one it returns
    // to healthy again (CheckpointKeeping::follow_resumed_branch).
    if (start.step < start.last_step) {
      const thpc::CheckpointKeeping::BranchChanges changes =
          thpc::CheckpointKeeping(config).branch_changes(start.run_id, start.lineage,
                                                         start.step);
      for (const std::string& later : changes.supersede) {
        if (moved_aside.count(later) > 0) continue;
        notes << "note: training would mark " << later << " superseded (the resume to step "
              << start.step << " abandons its branch)" << std::endl;
      }
      for (const std::string& back : changes.restore) {
        notes << "note: training would mark " << back << " healthy again (the resume to step "
              << start.step << " continues its branch)" << std::endl;
      }
      for (const std::string& best :
           thpc::CheckpointKeeping(config).best_of_other_branches(start.run_id, start.lineage,
                                                                   start.step)) {
        notes << "note: training would move " << best << " into " << options.dir
              << "/best_of_branch_left_at_" << start.step << "/ (of the branch the resume "
              << "leaves)" << std::endl;
      }
      for (const std::string& back :
           thpc::CheckpointKeeping(config).best_of_this_branch_set_aside(
               start.run_id, start.lineage, start.step)) {
        notes << "note: training would move " << back << " back into " << options.dir
              << " (of the branch the resume continues)" << std::endl;
      }
    }
    // The notes the resume prints: the settings that differ from the checkpoint's run and
    // the learning rate's jump (a dry run before a changed resume said none: a helper's
    // sweep), another number of ranks, where the data continues.
    start.idle_keys_said = thpc::log_resume_notes(
                               checkpoint, chosen, thpc::stored_configuration(checkpoint),
                               config, ranks, on_a_gpu(config), position_note, notes)
                               .idle_keys;
  } else if (!options.init.empty()) {
    const thpc::Checkpoint init = thpc::read_init_checkpoint(options);
    if (source) thpc::check_checkpoint_vocabulary(init, options.init, *source, config);
    thpc::check_checkpoint_architecture(init, options.init, architecture);
    start.params_digest = thpc::parameters_sha256(init, config.model, options.init);
  }
  return start;
}

// The dry run, every rank: training's start-up checks in training's order, reading what
// training reads and writing nothing, in phases whose failures are gathered as training's
// are (each rank checks its node's data and working directory; rank 0 the run directory
// and the choice of checkpoint, which the others then read). Throws AllRanksError on
// every rank for the first failure; fills `out` on rank 0.
void dry_run(const thpc::Config& config, const thpc::Communicator& comm, std::ostream& out) {
  // As training's start-up: a rank stopped or hung in it ends the job after
  // dist.timeout_s without a sign of work, which the reads give between their blocks.
  const thpc::Communicator::WaitLimit reading(
      comm, config.dist.timeout_s, "--dry-run", thpc::Communicator::WaitFrom::kLastSignOfWork,
      "run the --dry-run again",
      "a rank slower to read, as one reading a large checkpoint or corpus from a slow "
      "file system, or on a busy node");
  const int ranks = comm.size();
  const bool is_root = comm.is_root();
  int vocab = config.model.vocab_size;
  std::unique_ptr<thpc::BatchSource> source;
  std::unique_ptr<thpc::ShardReader> valid;  // when training would validate
  thpc::on_every_rank(comm, [&] {
    // First, as in training: a backend this build or this node cannot run (exit 2).
    if (const std::string backend = thpc::backend_impossible(config); !backend.empty()) {
      throw thpc::AllRanksError(backend, 2);
    }
    // A configured vocabulary needs no data (base.ini checks before the shards exist);
    // when the data is there (the synthetic task always is) it is read and checked as
    // training would read it (drops and warnings included), and must agree with
    // model.vocab_size.
    std::error_code missing;
    if (config.data.dir.empty() || vocab == 0 ||
        std::filesystem::is_directory(config.data.dir, missing)) {
      source = thpc::make_training_source(config);
      // The synthetic task's line too; as comment lines, so that the output stays an ini
      // file (a resolved config saved and given back was refused at its first note).
      std::ostringstream notes;
      if (const std::string corpus = source->corpus_line("data.train"); !corpus.empty()) {
        notes << corpus << "\n";
      }
      source->print_notes(notes, "data.train");
      // The validation shards too, when training would read them (exit 3 as there), and
      // their notes as training prints them (the pairs a position table cannot hold, left
      // out of the validation: said by training alone, a helper's walk).
      if (config.train.valid_every > 0) {
        valid = thpc::make_validation_source(config);
        if (const std::string corpus = valid->corpus_line("data.valid"); !corpus.empty()) {
          notes << corpus << "\n";
        }
        valid->print_notes(notes, "data.valid");
      }
      std::istringstream note_lines(notes.str());
      for (std::string line; std::getline(note_lines, line);) out << "# " << line << "\n";
    }
  });
  // Each rank read the data itself, and the same path can name different files for them
  // (relative to their working directories, a node-local disk): refused by training (exit
  // 3), passed by the dry run (a helper's walk). Before what is checked of the data (its
  // vocabulary, its longest pair), in training's order: one rank's other data is said as
  // such, not as a configuration that does not fit it. A rank that found no directory
  // there while another read it is refused as training would refuse it.
  if (const std::vector<std::string> read = comm.all_gather_if_different(source ? "1" : "0");
      !read.empty()) {
    const auto ranks_that = [&read](const char* flag) {
      std::string listed;
      for (size_t rank = 0; rank < read.size(); ++rank) {
        if (read[rank] == flag) listed += (listed.empty() ? "" : ", ") + std::to_string(rank);
      }
      return listed;
    };
    const auto named = [](const std::string& listed) {
      return (listed.find(',') == std::string::npos ? "rank " : "ranks ") + listed;
    };
    throw thpc::AllRanksError("data.dir " + config.data.dir + " is no directory for " +
                                  named(ranks_that("0")) + ", where " + named(ranks_that("1")) +
                                  " read it; every rank must read the same data.dir (a "
                                  "relative path from different working directories, or a "
                                  "node without the shared file system?)",
                              3);
  }
  if (source) {
    thpc::check_every_rank_reads_the_same_data(comm, *source, config.data.dir, "training");
    if (valid) {
      thpc::check_every_rank_reads_the_same_data(comm, *valid, config.data.dir, "validation");
    }
  }
  thpc::on_every_rank(comm, [&] {
    if (source) {
      // The validation shards' vocabulary before the vocabulary is resolved (exit 2), in
      // training's order.
      if (valid) {
        if (!config.data.dir.empty()) thpc::check_validation_vocabulary(config, *source, *valid);
        // The validation translation's scorer, as training builds it next: what it refuses
        // (a parser's F1 on a translation corpus, trees of the other kind, a length limit
        // below a validation tree: exit 2) a dry run passed (a helper's walk).
        // Its notes too, which training prints at its start (the trees longer than the
        // search's limit, a review's finding).
        if (!config.data.dir.empty() && config.train.valid_bleu) {
          std::istringstream scorer_notes(thpc::make_validation_scorer(config, comm)->notes());
          for (std::string line; std::getline(scorer_notes, line);) out << "# " << line << "\n";
        }
        const std::string same = thpc::same_pairs_warning(config, *source, *valid);
        if (!same.empty()) out << "# " << same << "\n";
      }
      vocab = thpc::resolve_vocab_size(config, *source);
    }
    // Sizes that cannot be allocated are a configuration error here as in training; so
    // are batches that cannot hold the data's longest pair (with the ranks of this dry
    // run: give it the job's -np).
    const std::string too_large =
        thpc::training_does_not_fit(config, vocab, thpc::host_memory_bytes(), ranks,
                                    source ? source->source_vocab_size() : 0);
    if (!too_large.empty()) throw thpc::AllRanksError(too_large, 2);
    if (source) {
      const std::string impossible =
          thpc::configuration_impossible(config, *source, ranks, valid.get());
      if (!impossible.empty()) throw thpc::AllRanksError(impossible, 2);
    }
  });
  // What training would do before writing, with its exit codes, as comment lines: a dry
  // run passed a job that training refused at once (another run's files in checkpoint.dir,
  // a directory that is a file, a trainer still running there).
  std::ostringstream notes;
  thpc::on_every_rank(comm, [&] {
    if (!is_root) return;
    const std::string locked = thpc::run_lock_refusal(config, notes);
    if (!locked.empty()) throw thpc::AllRanksError(locked, 2);
  });
  thpc::Checkpoint checkpoint;
  std::set<std::string> moved_aside;
  std::string chosen;
  thpc::on_every_rank(comm, [&] {
    if (is_root) chosen = choose_the_start(config, &checkpoint, &moved_aside, notes);
  });
  chosen = comm.broadcast_from_root(chosen);
  DryRunStart start;
  thpc::on_every_rank(comm, [&] {
    start = check_the_start(config, chosen, checkpoint, !is_root, moved_aside, source.get(),
                            vocab, ranks, notes);
  });
  // As training: each rank read the file itself (exit 1 when they differ).
  if (!start.params_digest.empty()) {
    thpc::check_every_rank_starts_from_the_same_parameters(
        comm, start.params_digest,
        chosen.empty() ? "checkpoint.init " + config.checkpoint.init : chosen);
  }
  thpc::on_every_rank(comm, [&] {
    if (!is_root) return;
    const std::string refusal =
        thpc::run_directory_refusal(config, start.run_id, start.resumed_from, start.step,
                                    start.lineage, notes);
    if (!refusal.empty()) throw thpc::AllRanksError(refusal, 2);
  });
  thpc::ParamStore table;
  const int source_vocab = source ? source->source_vocab_size() : 0;
  thpc::add_transformer_parameters(config.model, vocab, table, source_vocab);
  out << config.to_ini() << "\n# parameters: " << table.count() << " (vocabulary " << vocab
      << (source_vocab > 0 ? ", source vocabulary " + std::to_string(source_vocab) : "")
      << ")\n";
  // The rate the schedule peaks at (fairseq's --lr is the peak: a user bringing one works
  // train.lr_scale out from the formula, and read nowhere what it gave).
  const int64_t peak_step = std::max<int64_t>(1, config.train.warmup_steps);
  std::ostringstream rates;
  rates << std::setprecision(4) << "# learning rate: peak "
        << thpc::scheduled_learning_rate(peak_step, config) << " at step " << peak_step
        << " (train.lr_scale x (d_model x warmup_steps)^-0.5), "
        << thpc::scheduled_learning_rate(config.train.max_steps, config) << " at step "
        << config.train.max_steps << "\n";
  out << rates.str();
  if (!start.resumed_from.empty()) {
    out << "# training would resume from " << start.resumed_from << " (step " << start.step
        << ")\n";
  }
  if (start.last_step < config.train.max_steps) {
    out << "# training would end at step " << start.last_step << ", where train.max_epochs = "
        << config.train.max_epochs << " ends"
        << (start.last_step <= start.step ? " (no step is left to train)" : "") << "\n";
  }
  std::istringstream note_lines(notes.str());
  for (std::string line; std::getline(note_lines, line);) out << "# " << line << "\n";
  // Values that change nothing in the run, as training says them, for this dry run's -np
  // (the job's, as the batch budget's check asks); the GPU known where the backend is
  // named, or one is visible (auto on a login node may run on the job's GPUs).
  thpc::RunShape shape;
  shape.ranks = ranks;
  shape.on_gpu = on_a_gpu(config);
  shape.gpu_known = config.train.backend != "auto" || thpc::cuda_unavailable_reason().empty();
  const std::string idle = thpc::idle_settings_note(config, shape, start.idle_keys_said);
  if (!idle.empty()) out << "# " << idle << "\n";
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

// The line a failure is reported with: "transformer_hpc: error[ on rank R on HOST]: ...".
std::string failure_line(const std::string& where, const std::string& message) {
  return "transformer_hpc: error" + (where.empty() ? std::string() : " on " + where) + ": " +
         message;
}

// The dry run on every rank, rank 0 speaking: each rank checks what training would read
// there (its node's data, its working directory; rank 0's alone passed a job whose other
// ranks training then stopped, exit 3), and the first that cannot is named with its reason
// and training's exit code, before any rank prints the configuration.
int dry_run_on_every_rank(const thpc::Config& config, const thpc::Communicator& comm) {
  std::ostringstream output;
  try {
    dry_run(config, comm, output);
  } catch (const thpc::AllRanksError& e) {
    if (comm.is_root()) std::cerr << failure_line(e.where(), e.what()) << std::endl;
    return e.exit_code();
  }
  if (!comm.is_root()) return 0;
  std::cout << output.str();
  // The resolved configuration is a file users keep (`--dry-run > run.ini`): cut short by
  // a full disk, it is a failure.
  if (const std::string failure = thpc::standard_output_failure(); !failure.empty()) {
    std::cerr << failure_line("", failure) << std::endl;
    return 1;
  }
  return 0;
}

// "" when every rank was asked what rank 0 was (or made the same mistake), else why not,
// naming the ranks and the keys that differ. A collective: every rank calls it, so that
// a rank with another configuration (or a bad one) ends the job with one message instead
// of a hang, a segfault or a check failure steps later.
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

// The test hooks' last point (THPC_STOP_AT=RANK:0:exit): as main leaves, by whichever
// path, before MPI_Finalize.
class ExitHook {
 public:
  explicit ExitHook(const thpc::Communicator& comm) : comm_(comm) {}
  ~ExitHook() {
    try {
      thpc::maybe_inject_failure(comm_, 0, thpc::InjectionPoint::Exit);
    } catch (const thpc::Error&) {  // THPC_FAIL_AT there: the process is ending anyway
    }
  }
  ExitHook(const ExitHook&) = delete;
  ExitHook& operator=(const ExitHook&) = delete;

 private:
  const thpc::Communicator& comm_;
};

// Why the process's file-size limit is too small to start at all, or "": MPI's start-up
// writes a shared-memory store of 4 MiB (PMIx's), and under a smaller limit it failed
// with fifteen lines of "PMIX ERROR: OUT-OF-RESOURCE" and nothing naming the limit (a
// helper's trial; a bare MPI_Init_thread fails at ulimit -f 4090 and starts at 4096, one
// rank or two under mpirun). A larger limit that a checkpoint outgrows is said when it
// stops that write.
std::string file_size_limit_too_small() {
  constexpr rlim_t kSmallest = rlim_t{4} << 20;
  rlimit limit{};
  if (::getrlimit(RLIMIT_FSIZE, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY ||
      limit.rlim_cur >= kSmallest) {
    return "";
  }
  return "the process's file-size limit (ulimit -f, or the batch system's) is " +
         std::to_string(static_cast<unsigned long long>(limit.rlim_cur >> 10)) +
         " KiB: MPI's start-up writes a file of 4 MiB and fails under it; raise it "
         "(ulimit -f unlimited, or enough for the checkpoints)";
}

// Whether a launcher started this process as one rank of a job (MPI can start then).
bool started_by_a_launcher() { return thpc::launcher_rank() >= 0; }

// --version anywhere on the command line, and --help where no launcher started the
// process, answered before MPI's start-up (whichever comes first), as the other programs
// answer them: that start-up fails where the program runs alone inside an `srun --pty
// bash` step (Debian's Open MPI takes it for a direct launch by srun) or with an unusable
// TMPDIR, and --version is what a report of such a problem gives (a helper's walk: both
// exited 1 with Open MPI's page of text). --version needs no other rank, and every rank
// says its own build; under a launcher --help is a mode the ranks agree on (a rank that
// left alone kept the others waiting), printed by rank 0. Returns the exit code, or -1
// when neither is answered here.
// --show-checkpoint FILE: what FILE records of the run that wrote it, as comment lines,
// then its stored configuration, whose own head says what ran it (the program's version,
// what computed it, the command line's settings): an ini file that trains it again, and
// that `diff` sets beside another run's (a helper's sweep and reproducibility walks: the
// settings were in the files' HDF5 attributes alone). The parameters' params_sha256 is
// the one the final: line of the run that ended with them prints. The keys that name the
// run's own files (its checkpoint.dir, metrics directory, what it resumed from) are
// commented out: a run from the file in someone else's directory resumed, or with
// checkpoint.overwrite deleted, their run (a helper's walk as a model's recipient).
void show_checkpoint(const std::string& path, std::ostream& out) {
  const thpc::Checkpoint checkpoint =
      thpc::read_checkpoint(path, thpc::CheckpointParts::ParamsOnly);
  std::ostringstream loss;
  loss << std::fixed << std::setprecision(4) << checkpoint.loss;
  out << "# checkpoint " << path << ": step " << checkpoint.step << ", "
      << thpc::checkpoint_state_name(checkpoint.state)
      << (std::isnan(checkpoint.loss) ? std::string() : ", loss " + loss.str());
  if (checkpoint.validation) {
    std::ostringstream score;
    score << std::fixed << std::setprecision(2) << checkpoint.validation->value;
    out << ", kept for its valid " << checkpoint.validation->metric << " " << score.str();
  }
  if (!checkpoint.quantized.empty()) out << ", quantized";
  // (a resume validates the step first; said only by the file's dataset before)
  if (checkpoint.validation_pending) out << ", its validation pending (cut short by a stop)";
  out << "\n# architecture " << checkpoint.architecture << "\n";
  if (!checkpoint.spm_model.empty()) {
    out << "# SentencePiece model stored (" << checkpoint.spm_model.size() << " bytes, sha256 "
        << thpc::sha256_hex(checkpoint.spm_model.data(), checkpoint.spm_model.size())
        << "): transformer_decode reads it; transformer_preprocess --spm-model " << path
        << " preprocesses with it\n";
  }
  if (!checkpoint.source_spm_model.empty()) {
    out << "# source SentencePiece model stored (" << checkpoint.source_spm_model.size()
        << " bytes, sha256 "
        << thpc::sha256_hex(checkpoint.source_spm_model.data(),
                            checkpoint.source_spm_model.size())
        << "): separate vocabularies, the one above the target's\n";
  }
  if (!checkpoint.direction.empty()) out << "# direction " << checkpoint.direction << "\n";
  if (!checkpoint.run_id.empty()) {
    out << "# run " << checkpoint.run_id << ", lineage " << thpc::lineage_text(checkpoint.lineage)
        << ", " << checkpoint.world_size << (checkpoint.world_size == 1 ? " rank" : " ranks")
        << ", seed " << checkpoint.seed << ", data epoch " << checkpoint.data_position.epoch + 1
        << " (index " << checkpoint.data_position.index << ")\n";
  }
  if (!checkpoint.corpus_sha256.empty()) {
    out << "# training pairs sha256 " << checkpoint.corpus_sha256 << "\n";
  }
  if (!checkpoint.valid_sha256.empty()) {
    out << "# validation pairs sha256 " << checkpoint.valid_sha256 << "\n";
  }
  if (!checkpoint.working_directory.empty()) {
    out << "# working directory " << checkpoint.working_directory
        << " (its relative paths below are relative to it)\n";
  }
  const thpc::Config stored =
      thpc::load_config_text(checkpoint.config_ini, path + " (stored configuration)");
  try {
    out << "# params_sha256=" << thpc::parameters_sha256(checkpoint, stored.model, path)
        << "\n";
  } catch (const thpc::Error& error) {  // (parameters its configuration does not describe)
    out << "# params_sha256 n/a: " << error.what() << "\n";
  }
  if (!stored.checkpoint.resume.empty()) {
    // (No line is no proof of no change: a resume by a version before the lines, or of
    // a checkpoint written by one, wrote none.)
    const bool changed =
        !thpc::ini_header_values(checkpoint.config_ini, thpc::kSettingsChanged).empty();
    out << "# note: the process that wrote it was started with checkpoint.resume = "
        << stored.checkpoint.resume << ": its settings are that process's"
        << (changed ? ", and resumes of its run changed some (the \"settings changed\" lines "
                      "below say which, from which step)"
                    : ", and a resume may have changed some (the run's metrics.jsonl run "
                      "records hold each process's)")
        << "\n";
  }
  out << "# note: the keys that name the run's own files are commented out (\"# key = value "
         "(the run's own)\"): a run from this file writes its own\n";
  std::istringstream lines(checkpoint.config_ini);
  std::string section;
  for (std::string line; std::getline(lines, line);) {
    if (!line.empty() && line[0] == '[') section = line;
    const std::string key = line.substr(0, line.find(" = "));
    const bool own = (section == "[checkpoint]" &&
                      (key == "dir" || key == "resume" || key == "overwrite")) ||
                     (section == "[train]" && key == "metrics_dir");
    out << (own ? "# " + line + "  (the run's own)" : line) << "\n";
  }
}

int answer_help_or_version(int argc, char** argv) {
  const bool alone = !started_by_a_launcher();
  for (int i = 1; i < argc; ++i) {
    const std::string_view argument = argv[i];
    if (argument == "--show-checkpoint" || argument.rfind("--show-checkpoint=", 0) == 0) {
      const bool joined = argument != "--show-checkpoint";
      const std::string path = joined ? std::string(argument.substr(18))
                               : i + 1 < argc ? argv[i + 1]
                                              : "";
      if (path.empty() || argc != (joined ? 2 : 3)) {
        std::cerr << failure_line("", "--show-checkpoint takes one checkpoint file and "
                                      "nothing else (transformer_hpc --show-checkpoint FILE)")
                  << std::endl;
        return 2;
      }
      try {
        show_checkpoint(path, std::cout);
      } catch (const thpc::Error& error) {
        std::cerr << failure_line("", error.what()) << std::endl;
        return 1;
      }
      std::cout.flush();
    } else if (argument == "--version") {
      std::cout << thpc::version_line("transformer_hpc") << "\n";
    } else if (argument == "--help" || argument == "-h") {
      if (!alone) return -1;
      std::cout << thpc::help_text();
    } else {
      continue;
    }
    const std::string failure = thpc::standard_output_failure();
    if (!failure.empty()) std::cerr << failure_line("", failure) << std::endl;
    return failure.empty() ? 0 : 1;
  }
  return -1;
}

// The least bound of MPI's start-up: the ranks of a large job start seconds apart (srun's
// fan-out, the program loaded from a parallel file system, containers), which a
// dist.timeout_s chosen for a step's collectives (it may be 1 s) must not take for a rank
// that never starts.
constexpr double kLeastMpiStartSeconds = 30;

// How long MPI's start-up may wait for the other ranks: the configuration's
// dist.timeout_s, read here once before MPI starts (its mistakes are said after, as
// every rank's), else its default, and at least kLeastMpiStartSeconds; 0 (no bound) where
// no launcher started the process, as MPI then waits for no one.
double mpi_start_limit(int argc, char** argv) {
  if (!started_by_a_launcher()) return 0;
  const double otherwise = std::max<double>(thpc::Config{}.dist.timeout_s, kLeastMpiStartSeconds);
  for (int i = 1; i < argc; ++i) {
    const std::string_view argument = argv[i];
    // (answered after MPI's start-up, as a mode the ranks agree on)
    if (argument == "--help" || argument == "-h") return otherwise;
  }
  // (silenced: Boost's grouped short options, -hh, reach --help's printing there)
  std::streambuf* const printed = std::cout.rdbuf(nullptr);
  double limit = otherwise;
  try {
    thpc::Config config;
    if (thpc::parse_command_line(argc, argv, config)) limit = config.dist.timeout_s;
  } catch (const std::exception&) {
  }
  std::cout.rdbuf(printed);
  std::cout.clear();
  return std::max(limit, kLeastMpiStartSeconds);
}

// Why MPI's start-up cannot make its session directory in the temporary directory, or "":
// Open MPI takes the first of TMPDIR, TEMP and TMP that is set (else /tmp) and fails
// there with "orte_init failed" and a page naming none of them (a helper's walk:
// TMPDIR=/proc/missing). Tried as MPI uses it: a directory made in it and removed (a
// missing one made first, as MPI makes it), so that a failure is said with the system's
// reason (access() calls anything writable for root: /proc, a read-only mount). Not
// checked when the directory is set for MPI alone (OMPI_MCA_orte_tmpdir_base) or a
// launcher started this process (it made the directory already); Open MPI's rule, which
// another MPI may not share.
std::string temporary_directory_unusable() {
  if (std::getenv("OMPI_MCA_orte_tmpdir_base") != nullptr || started_by_a_launcher()) return "";
  for (const char* name : {"TMPDIR", "TEMP", "TMP"}) {
    const char* value = std::getenv(name);
    if (value == nullptr) continue;
    if (*value == '\0') return "";  // set, and empty: MPI's own choice then
    const std::string said = std::string(name) + "=" + value;
    const std::string advice = ": MPI's start-up keeps its session files there and would fail; "
                               "set " + std::string(name) + " to a directory this process can "
                               "write (export " + name + "=/tmp), or unset it";
    std::error_code error;
    if (!std::filesystem::exists(value, error)) {
      std::filesystem::create_directories(value, error);
      if (error) return said + " does not exist and cannot be made (" + error.message() + ")" +
                        advice;
    }
    if (!std::filesystem::is_directory(value, error)) return said + " is not a directory" + advice;
    std::string trial = (std::filesystem::path(value) / "thpc_tmpdir_check.XXXXXX").string();
    if (::mkdtemp(trial.data()) == nullptr) {
      return said + " is a directory in which this process cannot make one (" +
             std::strerror(errno) + ")" + advice;
    }
    ::rmdir(trial.c_str());
    return "";
  }
  return "";
}

}  // namespace

int main(int argc, char** argv) {
  // On a CPU that OpenBLAS does not know, its AVX-512 (or AVX2) kernels instead of its
  // fallback's SSE3 ones: the program starts again with OPENBLAS_CORETYPE set, before
  // anything else (kernels/cpu/openblas_core.h).
  thpc::run_with_openblas_kernels_for_this_cpu(argv);
  thpc::set_out_of_memory_advice(thpc::kTrainingMemoryAdvice);
  thpc::hdf5::use_our_locks_not_hdf5s();
  thpc::guard_standard_streams();
  // Slurm's stop signals are recorded from the first instruction that can take time (MPI
  // start-up takes half a second): one that arrives while MPI starts, the shards are
  // checked or a checkpoint is read stops the run before training (exit 0), instead of
  // killing the process without a word (exit 143). Open MPI leaves SIGTERM and SIGUSR1
  // to the program (its own handlers are for crashes).
  const thpc::StopSignalGuard stop_signals;
  thpc::fail_writes_past_the_file_size_limit();
  if (const int code = answer_help_or_version(argc, argv); code >= 0) return code;
  // Before MPI's start-up, which fails under them without a word of why: every rank says it.
  for (const std::string& unusable :
       {file_size_limit_too_small(), temporary_directory_unusable()}) {
    if (!unusable.empty()) {
      std::cerr << "transformer_hpc: error: " << unusable << std::endl;
      return 2;
    }
  }
  thpc::MpiSession mpi(&argc, &argv, mpi_start_limit(argc, argv));
  // A wait for the other ranks past dist.timeout_s ends the job without unwinding: the run
  // directory's lock and a checkpoint's temporary file are removed first.
  thpc::before_a_wait_ends_the_job(&thpc::remove_files_at_abrupt_stop);
  const thpc::Communicator comm = thpc::Communicator::world();
  thpc::Config config;
  std::string config_error;
  bool help = false;
  thpc::maybe_inject_failure(comm, 0, thpc::InjectionPoint::Configuration);
  try {
    help = !thpc::parse_command_line(argc, argv, config);  // --help printed
  } catch (const thpc::Error& e) {
    config_error = e.what();
  }
  // THPC_CPU_GEMM naming no library is a bad configuration (exit 2), said before anything
  // runs; not on a run that uses no CPU backend. (--help does not list the environment:
  // its message is not pointed there.)
  const bool error_in_the_options = !config_error.empty();
  try {
    if (!help && config_error.empty() && config.train.backend != "cuda") {
      thpc::cpu::gemm_library();
    }
  } catch (const thpc::Error& e) {
    config_error = e.what();
  }
  // Standard output into a file the run reads (`--dry-run >> m.ini`): refused before a
  // line is printed. Rank 0's alone, which prints the log (the others' mistake would be
  // said as ranks started unlike); under mpirun or srun every rank's is a pipe to them,
  // which no check here can follow.
  if (!help && config_error.empty() && comm.is_root()) {
    config_error = thpc::standard_output_into_an_input(config);
  }
  // A bad configuration is not one rank's own business: every rank takes part in the
  // agreement, so that the job ends together, with one message from rank 0. --help too:
  // a rank that left without it kept the others waiting forever.
  // Every wait for the other ranks from here to MPI_Finalize ends the job after
  // dist.timeout_s without them, this rank's own or its default.
  const double limit = help || !config_error.empty() ? thpc::Config{}.dist.timeout_s
                                                      : config.dist.timeout_s;
  mpi.bound_finalize(limit);
  // (test hook THPC_STOP_AT=RANK:0:exit: that rank stops as it leaves, before MPI_Finalize)
  const ExitHook exit_hook(comm);
  std::string disagreement;
  {
    // A rank stopped or hung before it came (a configuration file on a hung file system)
    // ends the job after dist.timeout_s (before: the others waited without limit). The
    // ranks have just left MPI_Init together.
    const thpc::Communicator::WaitLimit bounded(comm, limit, "start-up",
                                                thpc::Communicator::WaitFrom::kStart,
                                                "start the job again");
    disagreement =
        configuration_disagreement(comm, help ? "mode help\n" : rank_request(config, config_error));
  }
  if (help && disagreement.empty()) {
    const std::string failure = thpc::standard_output_failure();  // (where it was printed)
    if (!failure.empty()) std::cerr << failure_line("", failure) << std::endl;
    return failure.empty() ? 0 : 1;
  }
  if (!disagreement.empty() || !config_error.empty()) {
    if (comm.is_root()) {
      const std::string& message = disagreement.empty() ? config_error : disagreement;
      // Once: many messages point at --help themselves. On the same line, as the tools'
      // "NAME: PROBLEM (see --help)": a user's mistake is one line (a log's grep, a job
      // system's one-line reason; before, this pointer came on a second line).
      const bool see_help = (error_in_the_options || !disagreement.empty()) &&
                            message.find("--help") == std::string::npos;
      std::cerr << "transformer_hpc: " << message << (see_help ? " (see --help)\n" : "\n");
    }
    return 2;
  }
  try {
    if (config.dry_run) return dry_run_on_every_rank(config, comm);
    if (!config.eval_checkpoint.empty()) {
      thpc::evaluate_checkpoint(config, config.eval_checkpoint, comm, std::cout);
      const std::string failure = comm.is_root() ? thpc::standard_output_failure() : "";
      if (!failure.empty()) std::cerr << failure_line("", failure) << std::endl;
      return failure.empty() ? 0 : 1;
    }
    // Rank 0 speaks for the job: a Ctrl-C says at once what it does.
    if (comm.is_root()) thpc::announce_interrupts();
    // Closed (>&-), the log went nowhere without a word while the run went on (its files
    // are written): said once, as a warning.
    if (comm.is_root() && thpc::standard_output_was_closed()) {
      std::cerr << "transformer_hpc: warning: standard output is closed (>&-): this run's "
                << "log (its progress lines and summary) is lost; its checkpoints and metrics "
                << "file are written. Give it a file (> train.log) to keep the log"
                << std::endl;
    }
    if (comm.is_root()) {
      for (const std::string& hook : thpc::test_hooks_set()) {
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
    if (comm.is_root()) {
      std::cout << e.what() << std::endl;
      thpc::record_stop_before_training(e.signal_number());
    }
    return 0;
  } catch (const thpc::AllRanksError& e) {
    // Every rank raised it together: one message, and no rank needs ending by force.
    if (comm.is_root()) std::cerr << failure_line(e.where(), e.what()) << std::endl;
    return e.exit_code();
  } catch (const std::exception& e) {
    // A failure on one rank must end the whole job, not leave the others waiting in a
    // collective: report it with this rank's identity and abort every rank.
    // A one-rank job's failure is every rank's: said without a rank and host, as a failure
    // every rank met is.
    const thpc::RankFailure failure = thpc::failure_of(e);
    comm.abort(failure_line(comm.size() > 1 ? failure.where : std::string(), failure.message),
               failure.exit_code);
  }
  return 0;
}
