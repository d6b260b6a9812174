// The run configuration: ini file + command-line overrides, through
// Boost.Program_options, driven by one option table (config.cc) that also prints --help.
//
//   transformer_hpc CONFIG.ini [--section.key=value ...] [--dry-run] [--help]
//
// Every key lives in a section ([model] [train] [data] ...); on the command line it is
// written section.key. A command-line value overrides the file's.
#pragma once

#include <cstdint>
#include <set>
#include <string>
#include <vector>

namespace thpc {

// §3 and Table 3: every hyperparameter of the architecture is a key.
struct ModelConfig {
  int layers = 6;             // N, encoder and decoder stacks alike
  int d_model = 512;
  int d_ff = 2048;
  int heads = 8;              // h
  int d_k = 0;                // per-head query/key width; 0 = d_model / h
  int d_v = 0;                // per-head value width; 0 = d_model / h
  float dropout = 0.1f;       // P_drop on sub-layer outputs and embeddings (§5.4)
  float attention_dropout = 0.0f;  // on attention probabilities (the parser uses it)
  // On the FFN's hidden layer, after the ReLU: FFN(x) = Dropout(max(0, x W1 + b1)) W2 + b2
  // (fairseq's --activation-dropout, Marian's --transformer-dropout-ffn, tensor2tensor's
  // relu_dropout; not in the paper).
  float activation_dropout = 0.0f;
  float label_smoothing = 0.1f;    // eps_ls (§5.4)
  std::string positions = "sinusoidal";  // sinusoidal | learned (Table 3 row E)
  int max_positions = 1024;   // longest sequence the position table covers
  int vocab_size = 0;  // shared source/target vocabulary (else the target's); 0 = from the data
  bool attention_bias = false;  // biases on Q/K/V/O projections (the paper has none)
  float layernorm_eps = 1e-5f;
  // post | pre: where each sub-layer's layer norm sits. post (the paper, §3.1):
  // LayerNorm(x + Dropout(Sublayer(x))); pre (fairseq normalize_before, Marian
  // --transformer-preprocess n, tensor2tensor v2): x + Dropout(Sublayer(LayerNorm(x))),
  // with a final LayerNorm after each stack. Architecture: checkpoints record it.
  std::string norm = "post";
  // auto | on | off: the fused sub-layer ops (residual + dropout + layer norm, the FFN's
  // bias + ReLU) instead of the separate ones; auto = the backend's default
  // (Backend::fused_ops_by_default). How the model computes, not what: not architecture.
  std::string fused_ops = "auto";

  int head_dim_k() const { return d_k > 0 ? d_k : d_model / heads; }
  int head_dim_v() const { return d_v > 0 ? d_v : d_model / heads; }
};

// The most CPU threads train.threads may ask for: more than any node has, and OpenMP
// starts them all at once.
inline constexpr int kMaxCpuThreads = 1024;

struct TrainConfig {
  std::string backend = "auto";  // auto | cuda | cpu
  std::string precision = "bf16";  // GPU activations and GEMM operands: bf16 | fp32
  // verified | candidate: the GPU kernels whose twins passed on a GPU, or with them the
  // variants written since and not yet made the default (kernels/ops.h lists them;
  // docs/testing.md, "Kernels not yet run on a GPU").
  std::string cuda_kernels = "verified";
  // bf16 attention (d_k = d_v = 64) up to this many pieces a side in one kernel per op;
  // 0 = never (kernels/ops.h: CudaKernelChoice, kShortAttentionDefaultMaxLength).
  int short_attention_max_len = 48;
  uint64_t seed = 1;
  int64_t max_steps = 100000;
  float max_minutes = 0.0f;        // wall-clock limit of a run's training; 0 = none
  int64_t max_epochs = 0;          // passes over the training data; 0 = none
  int64_t tokens_per_step = 25000;  // padded tokens per step on each side (source, target)
  int accumulate = 1;              // micro-batches per optimizer step
  // Rows of [target tokens, vocabulary] logits made at once in training: the output
  // projection, the loss and the projection's backward a chunk at a time; 0 = all.
  int64_t loss_chunk_rows = 0;
  int warmup_steps = 4000;         // §5.3
  float lr_scale = 1.0f;           // multiplies the §5.3 schedule (1 = the paper)
  float adam_beta1 = 0.9f;         // §5.3
  float adam_beta2 = 0.98f;
  float adam_eps = 1e-9f;
  // Decoupled (AdamW) weight decay, p -= lrate * weight_decay * p before each Adam update;
  // 0 = none (the paper).
  float weight_decay = 0.0f;
  float clip_norm = 0.0f;          // gradient norm bound; 0 = no clipping (the paper has none)
  int log_every = 100;             // steps between progress lines
  int valid_every = 0;             // steps between validation passes; 0 = none
  bool valid_bleu = false;         // also translate the validation set and score it
  std::string valid_metric = "bleu";  // the score of those translations: bleu | chrf | f1
  int valid_beam = 1;              // beam of that translation; 1 = greedy
  std::string valid_bleu_tokenize = "13a";  // sacreBLEU's -tok: 13a | intl | char | none | zh
  int threads = 0;                 // CPU backend threads (ops and BLAS); 0 = OpenMP's default
  std::string metrics_dir;         // metrics.jsonl, event file; "" = checkpoint.dir
  // Divergence detection (train/divergence.h): what a step with a non-finite or spiking
  // loss or gradient norm does, and what counts as a spike.
  std::string divergence = "stop";       // stop | skip | rollback
  float divergence_loss_factor = 4.0f;   // spike: loss > this x max(1, its average); 0 = off
  float divergence_gnorm_factor = 100.0f;  // spike: norm > this x its average; 0 = off
  int divergence_warmup = 100;           // healthy steps before norm spikes are judged
  int divergence_limit = 3;              // skips in a row / rollbacks in a run, then stop
  float divergence_lr_factor = 0.5f;     // a rollback multiplies the learning rate by it
};

// Where batches come from: the HDF5 shards transformer_preprocess wrote to `dir`, or,
// when `dir` is empty, a synthetic task that needs no files: it generates (source,
// target) pairs from the seed, for smoke tests, learning tests and benchmarks.
struct DataConfig {
  std::string dir;              // shard directory; empty = the synthetic task
  std::string train = "train";  // training shards: dir/TRAIN.NNNNN.h5
  std::string valid = "valid";  // validation shards: dir/VALID.NNNNN.h5
  int memory_mb = 4096;         // token arrays a rank keeps; a larger corpus is streamed
  std::string synthetic = "reverse";  // reverse | copy | sort
  int synthetic_vocab = 32;     // vocabulary of the synthetic task, specials included
  int synthetic_min_len = 3;    // sentence lengths drawn uniformly in [min, max]
  int synthetic_max_len = 12;
};

// How the ranks of an MPI job work together (one rank per GPU).
struct DistConfig {
  float bucket_mb = 25.0f;  // gradient all-reduce bucket size, MiB
  int device = -1;          // GPU of this rank; -1 = local rank modulo visible devices
  float timeout_s = 300.0f;  // a step's wait for the other ranks (its collectives, the
                             // gradient sums, NCCL or MPI) that takes longer ends the job
  std::string reducer = "auto";       // auto (nccl on the GPU, mpi on the CPU) | nccl | mpi
  std::string reduce_dtype = "fp32";  // what the gradient buckets travel as: fp32 | bf16
  // The tied embedding's gradient: summed at the end of backward (at_end), or per use
  // (per_use: the output projection's share early, the lookups' rows apart); auto = per_use
  // on the CPU, at_end on the GPU.
  std::string embedding_sum = "auto";
  bool log_buckets = false;  // time each bucket's sum against backward, logged on log steps
};

// Checkpoints (docs/checkpoints.md): when rank 0 writes them, how many stay, and what a
// run starts from.
struct CheckpointConfig {
  std::string dir = "checkpoints";  // DIR/step_NNNNNNNN.h5, relative to the working directory
  float minutes = 10.0f;            // wall-clock minutes between checkpoints; 0 = none by time
  std::int64_t every_steps = 0;     // also every this many steps; 0 = none by step count
  int keep = 5;                     // the newest `keep` step_*.h5 of DIR are kept
  bool background_write = true;     // write from a thread while training goes on
  std::string resume;               // "" = fresh start | auto = newest valid in DIR | a path
  std::string init;                 // parameters only, when the run does not resume
  int average_last = 0;             // at the end, average the last N into DIR; 0 = off
  int average_best = 0;             // at the end, average the N best (keep_best_count); 0 = off
  std::string keep_best = "none";   // none | ppl | bleu | chrf | f1: DIR/best.h5 holds its best
  int keep_best_count = 0;          // also keep the K best as DIR/best_step_NNNNNNNN.h5; 0 = off
  int patience = 0;                 // stop after N validations without a better keep_best; 0 = off
  bool overwrite = false;           // a fresh run may delete another run's files in dir
};

// Beam search (§6.1; §6.3 for the parser): transformer_decode's defaults, stored in every
// checkpoint with the rest of the configuration so that a model decodes as its config says.
struct DecodeConfig {
  int beam = 4;           // beam size
  float alpha = 0.6f;     // length penalty ((5 + |Y|) / 6)^alpha
  double max_len_a = 1;   // output length <= max_len_a * input length + max_len_b
  int max_len_b = 50;
  std::string tree_leaves = "XX";  // parsing: XX | words (parse/tree.h's linearizations)
};

struct Config {
  ModelConfig model;
  TrainConfig train;
  DataConfig data;
  DistConfig dist;
  CheckpointConfig checkpoint;
  DecodeConfig decode;

  std::string source_file;  // the ini file the config came from ("" if none)
  // The keys given on the command line (--section.key=value) over the file's: a message
  // about one says so, where the file's name alone sent the user looking in the file.
  std::set<std::string> command_line_keys;
  bool dry_run = false;
  std::string eval_checkpoint;  // --eval CHECKPOINT: score it on the validation shards
  // The resolved configuration as ini text (every key, file and overrides applied).
  std::string to_ini() const;
  // The same with `header` ("LABEL: value" lines, kProvenance's) as comment lines after its
  // first: what a checkpoint stores. Every reader of ini text passes over comments, so
  // the versions before them read such a text as any other.
  std::string to_ini(const std::vector<std::string>& header) const;
  // The value of `key` ("train.lr_scale") as to_ini() writes it.
  std::string value_text(const std::string& key) const;
  // The keys given on the command line with their values, as they would be given again:
  // "--train.lr_scale=2 --checkpoint.dir=runs/lr2" (in the option table's order).
  std::string command_line_text() const;
  // " (on the command line)" after a message about `key` ("train.seed") when it was given
  // there, else "".
  std::string on_command_line(const std::string& key) const;
};

// The labels of the comment lines at the head of a checkpoint's configuration
// (Config::to_ini(header)): the program that ran it, what computed it
// (compute_identity), and the command line's settings over the file's; and an average's
// inputs (average_checkpoints).
inline constexpr const char* kWrittenBy = "written by";
inline constexpr const char* kComputedBy = "computed by";
inline constexpr const char* kCommandLine = "command line";
// "LABEL: value", for to_ini(header); a line break in `value` (a path may hold one) is
// written \n (\r), so that the line stays one comment line and the text an ini file.
std::string header_line(const char* label, const std::string& value);
inline constexpr const char* kAveragedFrom = "averaged from";
// A run begun from checkpoint.init's parameters: "PATH (step S, run R, params_sha256 X)",
// kept by its resumes, so that a fine-tuned model names the model it came from.
inline constexpr const char* kInitialisedFrom = "initialised from";
// An int8 copy's float source (transformer_quantize): "PATH (step S, params_sha256 X)".
inline constexpr const char* kQuantizedFrom = "quantized from";
// A resume's changes from its step: "at step S: ranks = N (was M), KEY = V (was W), ...,
// KEY = V (was W; why it has no effect here)", one line per resume that changed any,
// kept by the later ones (the configuration stored is the last process's: a run whose
// lr_scale a resume changed read as a clean run of the new value).
inline constexpr const char* kSettingsChanged = "settings changed";
// `ini` (a stored configuration) with "# LINE" comment lines added at the end of its head
// (after its last comment line before the first blank line or section): a derived
// checkpoint's own lines (kAveragedFrom) after those of the run it came from.
std::string with_header_lines(const std::string& ini, const std::vector<std::string>& lines);
// The value of the last comment line "# LABEL: value" at the head of `ini` (before its
// first section: an average of averages adds its own kAveragedFrom line after its
// input's), "" when it has none (a configuration stored before 2026-12-07).
std::string ini_header_value(const std::string& ini, const char* label);
// Every such value, in order (kSettingsChanged has one line per resume).
std::vector<std::string> ini_header_values(const std::string& ini, const char* label);

// Parses argv. Returns false if --help was given (the help text is printed to stdout).
// Any problem (unknown key, wrong type, bad value, missing file) throws thpc::Error
// whose message names the key and the file.
bool parse_command_line(int argc, const char* const* argv, Config& config);

// Parses an ini file with optional "section.key=value" overrides (tests use this).
Config load_config(const std::string& ini_path,
                   const std::vector<std::string>& overrides = {});

// Parses ini text, e.g. the configuration a checkpoint stores; `source_name` stands for
// the file in messages.
Config load_config_text(const std::string& ini_text, const std::string& source_name);

// Checks each value against its key's range (the option table's) and the relations
// between keys; throws thpc::Error naming the file, the key, the value and the range.
void validate(const Config& config);

// The --help text: every option of the table with its type, default, range and meaning.
std::string help_text();

// A key whose value differs between two resolved configurations (Config::to_ini() texts).
struct ConfigDifference {
  std::string key;        // "model.layers"
  std::string value;      // in the first text
  std::string reference;  // in the second
};
// The keys whose values differ, in the order of the texts (comments ignored; a key one
// text lacks has the value "(absent)" there).
std::vector<ConfigDifference> config_differences(const std::string& ini,
                                                 const std::string& reference_ini);

}  // namespace thpc
