// Checkpoints: one HDF5 file per saved step, DIR/step_NNNNNNNN.h5, holding the
// parameters by name, the Adam moments, and everything else a resumed run needs to
// continue the identical run (step, seed, data position, world size, config), and the
// SentencePiece model of the training data when it had one. Every
// dataset carries the sha256 of its bytes, so truncation and bit flips are caught on
// load. The layout is documented in docs/checkpoints.md.
//
// Files are written to DIR/.step_NNNNNNNN.h5.tmp, flushed, fsync'ed and renamed, so a
// step_*.h5 that exists was written completely (a crash leaves only a .tmp behind).
#pragma once

#include <cmath>
#include <cstdint>
#include <iosfwd>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/error.h"
#include "common/progress.h"
#include "config/config.h"
#include "data/batch_source.h"
#include "io/run_file_names.h"

namespace thpc {

// Version 1: the layout of docs/checkpoints.md. Version 2: the same with some parameters
// in int8 (/quantized: a quantized checkpoint, transformer_quantize), which a reader of
// version 1 only refuses by its number. A reader refuses other versions.
constexpr int64_t kCheckpointFormatVersion = 1;
constexpr int64_t kQuantizedCheckpointFormatVersion = 2;

// What a reader of this version meets in a checkpoint a later version wrote: a later
// format_version, a file header of a later version (its version, or a line, state or
// metric word this version does not know: checkpoint_header.h), or, in a read of every
// part (a resume), parts at the file's root this version does not know (a run resumed
// from it would go on without them). Not damage: a
// resume neither passes over such a file nor moves it aside as corrupt, as it does a
// damaged one, but stops and says so (checkpoint.resume = auto included).
class CheckpointOfANewerVersion : public Error {
 public:
  using Error::Error;
};

// The names at the root of a checkpoint that this version writes and reads: its
// attributes, and its groups and datasets. A part write_checkpoint gains goes here too, or
// resuming from the files it writes is refused; then derived_checkpoint_of,
// Trainer::restore and docs/checkpoints.md's layout sort it (checked against the layout:
// CheckpointLayout.TheLayoutNamesEveryPartAtTheRoot).
const std::vector<std::string>& checkpoint_root_attributes();
const std::vector<std::string>& checkpoint_root_members();

// A parameter stored in int8 with a scale per output channel (a quantized checkpoint):
// values [rows, cols] as the parameter lies, scales along `output_axis` (1: the columns
// of a linear layer's W [in, out]; 0: the rows of the tied embedding E [vocab, d], the
// output projection's outputs). Its value is values[r, c] * scales[output_axis ? c : r];
// the values lie in [-127, 127].
struct QuantizedTensor {
  std::string name;
  int64_t rows = 0, cols = 0;
  int output_axis = 1;
  std::vector<int8_t> values;
  std::vector<float> scales;
  // The count of scales: the columns or the rows, as output_axis says.
  int64_t outputs() const { return output_axis == 1 ? cols : rows; }
};
// The fp32 values a QuantizedTensor stands for, [rows, cols].
std::vector<float> dequantize(const QuantizedTensor& tensor);

// One parameter-shaped array (a parameter or one of its Adam moments), packed.
struct NamedTensor {
  std::string name;
  int64_t rows = 0, cols = 0;
  std::vector<float> values;  // rows * cols, row-major
};

// The best validation value of one metric up to a step, which checkpoint.keep_best
// compares against and checkpoint.patience counts from.
struct BestValidation {
  double value = NAN;             // NaN: no validation has measured the metric yet
  int64_t step = 0;               // the step that reached it
  int64_t validations_since = 0;  // validations after that step without a better value
};

// What a run has seen of its validations, kept in each checkpoint so that a resumed run
// continues the comparison (and best.h5, and the patience count) where the run was.
struct ValidationRecord {
  BestValidation ppl, bleu;  // lower perplexity is better, higher BLEU is
  BestValidation chrf;       // higher is better (train.valid_metric = chrf)
  BestValidation f1;         // higher is better (train.valid_metric = f1: parsing)

  // The record of `metric`: ppl, bleu, chrf or f1 (anything else: ppl).
  const BestValidation& of(const std::string& metric) const {
    return metric == "bleu" ? bleu : metric == "chrf" ? chrf : metric == "f1" ? f1 : ppl;
  }
  BestValidation& of(const std::string& metric) {
    return metric == "bleu" ? bleu : metric == "chrf" ? chrf : metric == "f1" ? f1 : ppl;
  }
};

// The validation score a best checkpoint (checkpoint.keep_best, keep_best_count) was kept
// for: its run's keep_best metric measured at the checkpoint's step. Stored twice in the
// file, as /validation/<metric> (checksummed with the rest) and as the header's `valid`
// line (read without reading the file, to rank a run's best checkpoints); a reader
// checks that the two agree.
struct ValidationScore {
  std::string metric;  // ppl (lower is better) | bleu | chrf | f1 (higher is better)
  double value = NAN;
};

// Whether a lower value of the validation `metric` is the better one (perplexity).
bool lower_is_better(const std::string& metric);

// The state of divergence detection (train/divergence.h) as of a checkpoint's step, so
// that a resumed run judges its steps as the uninterrupted run would, and keeps the
// learning-rate reduction of its rollbacks.
struct DivergenceState {
  double loss_average = NAN;       // running average of the healthy steps' loss (NaN: none yet)
  double grad_norm_average = NAN;  // and of their gradient norm
  int64_t healthy_steps = 0;       // healthy steps that went into the averages
  int64_t skipped_steps = 0;       // steps left out (train.divergence = skip), in all
  int64_t consecutive_skips = 0;   // of them, those since the last healthy step
  int64_t rollbacks = 0;           // returns to a healthy checkpoint (rollback)
  double lr_factor = 1.0;          // on the learning rate: divergence_lr_factor per rollback
};

// What a checkpoint's parameters are known to be worth, kept in its file header (the one
// part of a checkpoint that is revised after writing, docs/checkpoints.md): healthy when
// the step it completes was; diverged when that step, or the step after it, diverged (the
// parameters produced the divergent loss); superseded when a rollback or a resume from an
// older checkpoint abandoned the branch of training it belongs to. resume=auto, pruning
// and averaging prefer healthy checkpoints and never lose the newest one.
enum class CheckpointState { Healthy, Diverged, Superseded };
const char* checkpoint_state_name(CheckpointState state);


// Where a line of training began: the run's start (step 0, the run's id), or a resume or
// rollback from a checkpoint that was not the newest of its own line (its step, an id made
// then: 16 hex digits). A line goes on from one process to the next when a resume takes
// its newest checkpoint, as a requeued job does.
struct BranchStart {
  int64_t step = 0;
  std::string id;
  bool operator==(const BranchStart& other) const {
    return step == other.step && id == other.id;
  }
};

// The most lines a checkpoint's lineage keeps: the first and the newest. Each is a return
// to an older checkpoint (a resume or a rollback); a run that made more forgets those
// after its first (where_on_lineage answers Unknown for checkpoints they may hold).
inline constexpr size_t kLineageKept = 256;

// "STEP:ID STEP:ID ..." and back; parse_lineage returns "" or what is wrong with `text`.
std::string lineage_text(const std::vector<BranchStart>& lineage);
std::string parse_lineage(const std::string& text, std::vector<BranchStart>* lineage);

// Whether a checkpoint at `step` of run `run_id` is one the checkpoint at `last_step` with
// lineage `lineage` was trained through (itself included): its line (`recorded`, its
// header's branch line; without one, the run's start, 0:RUN_ID) is in the lineage, and
// the step lies before the next line began. Unknown where the lineage cannot tell: it is
// empty (an older file), or the checkpoint records no line (an older file's, or one of the
// run's start) and lies at or before the lineage's first line began, or its line may be
// one of those forgotten past kLineageKept.
enum class OnLineage { Yes, No, Unknown };
OnLineage where_on_lineage(const std::optional<BranchStart>& recorded, const std::string& run_id,
                           int64_t step, const std::vector<BranchStart>& lineage,
                           int64_t last_step);

struct Checkpoint {
  int64_t step = 0;          // optimizer steps completed
  uint64_t seed = 0;         // with step, the whole RNG state (Philox is counter-based)
  int64_t world_size = 1;    // ranks of the run that wrote it
  DataPosition data_position;  // where rank 0's reader continues
  std::string architecture;  // architecture_text() of the model: what averaging compares
  std::string config_ini;    // the resolved configuration of the run (Config::to_ini())
  // The serialized SentencePiece model of the training shards (their `spm_model`), so
  // that decoding needs no separate file; empty when the run had none (a synthetic task,
  // or a checkpoint written before this was stored). Stored as /spm_model, uint8.
  std::string spm_model;
  // With separate vocabularies, the source's model (the shards' `source_spm_model`, the
  // target's then spm_model); empty with one vocabulary. Stored as /source_spm_model.
  std::string source_spm_model;
  // The languages of the training shards ("en->de", BatchSource::direction): one
  // vocabulary serves both directions, so an en->de and a de->en model share it, and their
  // ensemble or average decoded garbage without a word (a helper's trial). "" for a
  // generated task and files written before it was stored. The attribute direction.
  std::string direction;
  std::vector<NamedTensor> params;
  // Adam's first and second moments, in the order of params; both empty in a
  // parameters-only checkpoint (an average, or a file read with ParamsOnly).
  std::vector<NamedTensor> adam_m, adam_v;
  // The run's best validation values as of `step`; absent from an average and from the
  // checkpoints written before they were stored (/best_valid).
  std::optional<ValidationRecord> best_valid;
  // The run that wrote it (16 hex digits, made when the run started afresh, kept by its
  // resumes): a run's directory holds its own files only. "" for averages and older files.
  std::string run_id;
  // The lines of training that led to it, oldest first (the attribute lineage; the file
  // header's branch line names the last when it is not the run's start): what tells the
  // checkpoints of the branch a resume continues from those of a branch it abandons.
  // Empty for averages and older files.
  std::vector<BranchStart> lineage;
  // The working directory of the run that wrote it, which the relative paths of its
  // config_ini are relative to: a resume from another directory tells the same directory
  // written two ways from another one. "" for averages and older files.
  std::string working_directory;
  // The training data it was reading (BatchSource::corpus_sha256), so that a resume over
  // other data can say so: its position means nothing there. "" for a generated task,
  // averages and older files.
  std::string corpus_sha256;
  // The validation shards its best validation values were scored on (the same digest of
  // the validation pairs), so that a resume over other ones starts the best values and
  // checkpoint.patience afresh rather than ranking scores of two sets. "" where the run did
  // not validate on shards, and for averages and older files.
  std::string valid_sha256;
  // The loss (label-smoothed, per target token) of the step it completes; NaN when unknown
  // (averages, older files, a run resumed and stopped before its first step).
  double loss = NAN;
  CheckpointState state = CheckpointState::Healthy;
  // Absent from averages and from checkpoints written before it was stored (/divergence).
  std::optional<DivergenceState> divergence;
  // Set in best checkpoints only (best.h5, best_step_*.h5): the score they were kept for.
  std::optional<ValidationScore> validation;
  // The validation due at `step` was cut short by a stop signal and not recorded: a run
  // resumed from this checkpoint validates `step` first, as the uninterrupted run did
  // (/validation_pending, float64 [1] = 1, only when set; older readers ignore it).
  bool validation_pending = false;
  // A quantized checkpoint's int8 parameters (format version 2, parameters only); empty
  // otherwise. Each is in `params` too, dequantized, so that every reader of parameters
  // reads a quantized checkpoint as it reads any other; the writer stores it only here.
  std::vector<QuantizedTensor> quantized;
};

// What a checkpoint's file header says, read without reading (or verifying) the file:
// enough to order, prune and choose checkpoints without hashing gigabytes.
struct CheckpointSummary {
  std::string path;
  int64_t step = -1;  // the step stored in the file; its name's for a header without one
  double loss = NAN;
  CheckpointState state = CheckpointState::Healthy;
  std::string run_id;           // "" when the header predates it
  bool parameters_only = false;  // an average (no Adam moments)
  std::optional<ValidationScore> validation;  // a best checkpoint's score (its `valid` line)
  // Its line of training as its header's branch line records it; unset without one (the
  // run's start, or a file older than lineages).
  std::optional<BranchStart> branch;
};

enum class CheckpointParts { All, ParamsOnly };

// "layers=6 d_model=512 ..." : every model key that shapes or interprets the parameters,
// and the vocabulary. Two checkpoints with equal texts hold interchangeable parameters.
std::string architecture_text(const ModelConfig& model, int vocab_size,
                              int source_vocab_size = 0);
// The model.norm an architecture text records: checkpoints written before model.norm
// existed record none and hold post-norm models, the only order there was.
std::string recorded_norm(const std::string& architecture);
// The text with its norm stated, as architecture_text() writes it now: what is compared.
std::string with_norm_recorded(const std::string& architecture);
// What differs between two architecture texts, each field by the setting a user changes:
// "model.layers is 2 in FIRST_NAME and 3 in SECOND_NAME; ..." (the vocabulary's by where
// it comes from), in the second's order, then the fields only the first records ("... is
// V in FIRST_NAME and absent in SECOND_NAME"); both whole texts when no field differs.
std::string architecture_differences(const std::string& first, const std::string& first_name,
                                     const std::string& second, const std::string& second_name);

// The one translation direction of checkpoints that record it (Checkpoint::direction; one
// vocabulary serves both directions, so the vocabulary cannot tell them apart), fed one
// at a time: add() says "A was trained en->de, B de->en" for the first that differs from
// the first recorded, "" while they agree (those that record none fit any). An average
// and an ensemble refuse what it says.
class OneDirection {
 public:
  std::string add(const std::string& path, const std::string& direction);
  const std::string& direction() const { return direction_; }

 private:
  std::string direction_, path_;
};

// What a checkpoint made from `source`'s parameters (an average, transformer_quantize's
// int8 copy) keeps of it: the model (architecture, settings, SentencePiece model,
// direction) and where its parameters stand (step, seed, world size, data position). Not
// the state of the run at that step, since no run resumes from the new file (Adam
// moments, best and pending validations, a kept best's score, loss and health, divergence
// state, run id, and the corpus, validation-set and directory records only a resume
// checks), nor the parameters and their int8 copies, which the caller makes. Every field
// of Checkpoint is sorted here by name: one added to it stops the build here until it is.
Checkpoint derived_checkpoint_of(const Checkpoint& source);

// Writes atomically (temporary file, fsync, rename). Throws thpc::Error naming the path.
void write_checkpoint(const std::string& path, const Checkpoint& checkpoint);

// (Re)writes the file header of the checkpoint `path` (docs/checkpoints.md, "File
// header": its size and the sha256 of its bytes after the header, which readers check
// before HDF5 parses the file). write_checkpoint() does it; a program that edits a
// checkpoint in place with HDF5 must do it after closing the file, or the checkpoint is
// refused as corrupt.
void stamp_checkpoint_header(const std::string& path);

// Why `checkpoint`, read from `path`, may not be used (`use` says what was asked:
// "decoding with it"), or "" when it may: it is marked diverged, its parameters a diverged
// step's (or saved after a validation that diverged), whose outputs are not a model's.
// transformer_decode and transformer_quantize refuse it as transformer_average does (they
// decoded NaN scores and quantized a NaN model, exit 0; a helper's trial), and like it as
// a command line naming the wrong file (exit 2): the message names the file to take.
std::string diverged_parameters_refusal(const Checkpoint& checkpoint, const std::string& path,
                                        const std::string& use);

// Verifies the file header (size and sha256 of the whole file) before HDF5 reads
// anything, then structure, format version, shapes and every dataset's sha256. Throws
// thpc::Error naming the file and the problem (truncated, bad checksum for the file or
// for dataset X, missing dataset, no file header, ...).
Checkpoint read_checkpoint(const std::string& path,
                           CheckpointParts parts = CheckpointParts::All);
// The same from the bytes of a checkpoint file in memory (HDF5's core driver; `name`
// stands for the file in messages): what the checkpoint reader's fuzzer feeds.
Checkpoint read_checkpoint_image(const std::string& name, std::string_view image,
                                 CheckpointParts parts = CheckpointParts::All);

// The file header of the checkpoint `path`, or nothing when it has none that parses
// (not a checkpoint, damaged, missing). Reads 512 bytes; verifies nothing else.
std::optional<CheckpointSummary> read_checkpoint_summary(const std::string& path);

// Rewrites the state in the file header of the checkpoint `path` (in place: 512 bytes,
// fsync'ed; the checksums cover the rest of the file and stay valid). Throws naming it.
void mark_checkpoint(const std::string& path, CheckpointState state);

// The rows of the checkpoint's embedding (embed.weight): the vocabulary it was trained
// with (the target's, with separate vocabularies); -1 when it has none.
int64_t embedding_rows(const Checkpoint& checkpoint);
// The rows of its separate source embedding (src_embed.weight); 0 with one vocabulary.
int64_t source_embedding_rows(const Checkpoint& checkpoint);

// Throws thpc::Error naming `source` when the checkpoint's architecture is not
// `expected`, the architecture_text() of the model it is for: its parameters would not
// fit, or would mean something else. A different model.norm is named on its own.
void check_architecture(const Checkpoint& checkpoint, const std::string& expected,
                        const std::string& source);

}  // namespace thpc
