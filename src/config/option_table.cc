#include "config/option_table.h"

#include <algorithm>
#include <charconv>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <sstream>
#include <type_traits>
#include <vector>

#include "common/error.h"
#include "kernels/ops.h"

namespace thpc {
namespace {

Allowed one_of(std::vector<std::string> values) {
  Allowed allowed;
  allowed.values = std::move(values);
  return allowed;
}
Allowed at_least(double minimum) {
  Allowed allowed;
  allowed.min = minimum;
  return allowed;
}
Allowed above(double bound) {
  Allowed allowed = at_least(bound);
  allowed.min_open = true;
  return allowed;
}
Allowed zero_or_at_least(double minimum) {
  Allowed allowed = at_least(minimum);
  allowed.zero_too = true;
  return allowed;
}
// [0, 1): a probability that must leave something (dropout 1 drops everything).
Allowed fraction() {
  Allowed allowed = at_least(0.0);
  allowed.max = 1.0;
  allowed.max_open = true;
  return allowed;
}
// (0, 1): a factor that must shrink what it multiplies (a fraction without 0).
Allowed open_fraction() {
  Allowed allowed = fraction();
  allowed.min_open = true;
  return allowed;
}
Allowed zero_or_above(double bound) {
  Allowed allowed = above(bound);
  allowed.zero_too = true;
  return allowed;
}
// [minimum, maximum], both included.
Allowed between(double minimum, double maximum) {
  Allowed allowed = at_least(minimum);
  allowed.max = maximum;
  return allowed;
}

Allowed path() {
  Allowed allowed;
  allowed.path = true;
  return allowed;
}
Allowed path_not_empty() {
  Allowed allowed = path();
  allowed.non_empty = true;
  return allowed;
}

}  // namespace

// The section and key are the member path itself, so a key can never drift from its field.
#define THPC_OPTION(section, key, allowed, help)                                        \
  Option {                                                                              \
    #section, #key, [](Config& config) -> FieldPointer { return &config.section.key; }, \
        allowed, help                                                                   \
  }
#define THPC_ANY Allowed{}
#define THPC_ONE_OF(...) one_of({__VA_ARGS__})
#define THPC_AT_LEAST(minimum) at_least(minimum)
#define THPC_ABOVE(bound) above(bound)
#define THPC_ZERO_OR_AT_LEAST(minimum) zero_or_at_least(minimum)
#define THPC_FRACTION fraction()
#define THPC_OPEN_FRACTION open_fraction()
#define THPC_ZERO_OR_ABOVE(bound) zero_or_above(bound)
#define THPC_BETWEEN(minimum, maximum) between(minimum, maximum)
#define THPC_PATH path()
#define THPC_PATH_NOT_EMPTY path_not_empty()

std::string section_purpose(const std::string& section) {
  if (section == "model") return "the network: §3 and Table 3";
  if (section == "train") return "the optimisation (§5), its stopping, validation and divergence";
  if (section == "data") return "HDF5 shards of transformer_preprocess, or a synthetic task";
  if (section == "dist") return "the ranks of an MPI job and their gradient sums";
  if (section == "checkpoint") {
    return "what rank 0 saves, keeps, averages and resumes from (docs/checkpoints.md)";
  }
  if (section == "decode") {
    return "transformer_decode's defaults (§6.1; the parser's §6.3), stored in every "
           "checkpoint; training's validation reads train.valid_beam";
  }
  return "";
}

// The single source of truth for the keys. Defaults are the member initializers of
// config.h (read from a default-constructed Config), so they are not repeated here.
const std::vector<Option>& option_table() {
  static const std::vector<Option> table = {
      // [model]: §3 and Table 3.
      THPC_OPTION(model, layers, THPC_AT_LEAST(1),
                  "N: identical layers in each of the encoder and decoder stacks (§3.1)"),
      // (1 trained a model blind to its input: a layer norm over one feature is its bias)
      THPC_OPTION(model, d_model, THPC_AT_LEAST(2),
                  "width of embeddings and of every sub-layer output (§3.1); at least 2, "
                  "as a layer norm over one feature outputs its bias alone"),
      THPC_OPTION(model, d_ff, THPC_AT_LEAST(1),
                  "inner width of the position-wise feed-forward (§3.3)"),
      THPC_OPTION(model, heads, THPC_AT_LEAST(1),
                  "h: parallel attention heads (§3.2.2); d_model must divide by h unless "
                  "d_k and d_v are both set"),
      THPC_OPTION(model, d_k, THPC_AT_LEAST(0),
                  "per-head query/key width; 0 = d_model / heads (§3.2.2)"),
      THPC_OPTION(model, d_v, THPC_AT_LEAST(0),
                  "per-head value width; 0 = d_model / heads (§3.2.2)"),
      THPC_OPTION(model, dropout, THPC_FRACTION,
                  "P_drop on sub-layer outputs and embedding sums (§5.4)"),
      THPC_OPTION(model, attention_dropout, THPC_FRACTION,
                  "dropout on attention probabilities (not in the paper)"),
      THPC_OPTION(model, activation_dropout, THPC_FRACTION,
                  "dropout on the FFN's hidden layer after the ReLU, in training (not in the "
                  "paper; fairseq --activation-dropout, tensor2tensor relu_dropout)"),
      THPC_OPTION(model, label_smoothing, THPC_FRACTION, "eps_ls (§5.4)"),
      THPC_OPTION(model, positions, THPC_ONE_OF("sinusoidal", "learned"),
                  "position encoding (§3.5; learned is Table 3 row E)"),
      THPC_OPTION(model, max_positions, THPC_AT_LEAST(2),
                  "longest sequence the positions cover (a sentence and its bos or eos)"),
      THPC_OPTION(model, vocab_size, THPC_ZERO_OR_AT_LEAST(5),
                  "shared source/target vocabulary (the target's when the shards have "
                  "a source vocabulary of their own), the 4 special ids (pad unk bos eos) "
                  "included; 0 = from the data (§5.1)"),
      THPC_OPTION(model, attention_bias, THPC_ANY,
                  "biases on the Q/K/V/O projections (the paper has none)"),
      // (0, 1): 1e30 was taken, and the model learnt nothing without a word.
      THPC_OPTION(model, layernorm_eps, THPC_OPEN_FRACTION, "epsilon of layer normalization"),
      THPC_OPTION(model, norm, THPC_ONE_OF("post", "pre"),
                  "post: LayerNorm(x + Dropout(Sublayer(x))) (§3.1); pre: x + "
                  "Dropout(Sublayer(LayerNorm(x))) and a final LayerNorm after each stack "
                  "(fairseq normalize_before)"),
      THPC_OPTION(model, fused_ops, THPC_ONE_OF("auto", "on", "off"),
                  "residual+dropout+layer norm and the FFN's bias+ReLU as fused ops; auto = "
                  "on (the CPU: the separate ops' bits; the GPU: twins checked on an H100), "
                  "off = the separate ops"),

      // [train]: §5.
      THPC_OPTION(train, backend, THPC_ONE_OF("auto", "cuda", "cpu"),
                  "where the math runs; auto = the GPU when one is visible, else the CPU"),
      THPC_OPTION(train, precision, THPC_ONE_OF("bf16", "fp32"),
                  "GPU activations and GEMM operands (weights, moments stay fp32); the CPU "
                  "computes in fp32 and ignores it"),
      THPC_OPTION(train, cuda_kernels, THPC_ANY,
                  "GPU kernels: verified = those whose twin tests passed on a GPU; candidate "
                  "= also the variants not yet made the default (at present fused_attention, "
                  "step_graphs, relu_masks, weight_grads_beside, fuller_column_sums, "
                  "worker_graphs, fused_norm_grads, fast_loss_exp, bias_grads_in_gemm, "
                  "weight_decay); or "
                  "some of them by name, comma-separated; the CPU ignores it"),
      THPC_OPTION(train, short_attention_max_len, THPC_BETWEEN(0, kShortAttentionLongest),
                  "GPU, bf16, d_k = d_v = 64: attention whose query and key lengths are both "
                  "at most this runs in one kernel per op (shared memory), longer attention "
                  "as batched GEMMs; 48 = where the one kernel stops paying on an H100, 0 = "
                  "never, at most 128; the CPU ignores it"),
      THPC_OPTION(train, seed, THPC_ANY, "seed of parameters, dropout and synthetic data"),
      THPC_OPTION(train, max_steps, THPC_AT_LEAST(1), "optimizer steps to train (§5.2)"),
      THPC_OPTION(train, max_minutes, THPC_AT_LEAST(0),
                  "end the run at the first step that ends after this many wall-clock "
                  "minutes of training (fractions allowed), as at max_steps: checkpoint, "
                  "average, summary, exit 0; a resumed run counts afresh; 0 = no limit"),
      THPC_OPTION(train, max_epochs, THPC_AT_LEAST(0),
                  "end the run at the step that reads the last batch of this epoch of the "
                  "training data (fairseq's --max-epoch), as at max_steps: checkpoint, "
                  "average, summary, exit 0; that step's other micro-batches are the next "
                  "epoch's first; counted from the data's start, so a resumed run ends at "
                  "the same step; the earlier of it and max_steps ends the run; needs "
                  "data.dir; 0 = no limit"),
      THPC_OPTION(train, tokens_per_step, THPC_AT_LEAST(1),
                  "padded tokens per step on each side, source and target, over all ranks "
                  "and micro-batches together (§5.1: ~25000 on the paper's eight GPUs); "
                  "each micro-batch takes tokens_per_step / (ranks x accumulate) (fairseq's "
                  "--max-tokens is each GPU's micro-batch)"),
      THPC_OPTION(train, accumulate, THPC_AT_LEAST(1),
                  "micro-batches per optimizer step on each rank: they share "
                  "tokens_per_step, so the step's batch stays the same (fairseq's "
                  "--update-freq multiplies its --max-tokens instead)"),
      THPC_OPTION(train, loss_chunk_rows, THPC_AT_LEAST(0),
                  "target rows whose vocabulary logits exist at once: the output projection, "
                  "the loss and their backward a chunk of rows at a time (a micro-batch's "
                  "[tokens x vocabulary] logits never whole); 0 = all rows at once"),
      THPC_OPTION(train, warmup_steps, THPC_AT_LEAST(1), "linear learning-rate warmup (§5.3)"),
      THPC_OPTION(train, lr_scale, THPC_ABOVE(0),
                  "factor on the §5.3 schedule, lrate = d_model^-0.5 x min(step^-0.5, step x "
                  "warmup_steps^-1.5), whose peak at step warmup_steps is lr_scale x "
                  "(d_model x warmup_steps)^-0.5; 1 = the paper"),
      THPC_OPTION(train, adam_beta1, THPC_FRACTION, "Adam beta1 (§5.3)"),
      THPC_OPTION(train, adam_beta2, THPC_FRACTION, "Adam beta2 (§5.3)"),
      THPC_OPTION(train, adam_eps, THPC_ABOVE(0), "Adam epsilon (§5.3)"),
      THPC_OPTION(train, weight_decay, THPC_FRACTION,
                  "decoupled weight decay (AdamW; fairseq's Adam --weight-decay): each step "
                  "also takes lrate x weight_decay x p from every parameter p (biases, norms "
                  "and embeddings too, as fairseq); 0 = none (the paper); a GPU run needs "
                  "weight_decay in train.cuda_kernels (its kernel has not yet run on a GPU)"),
      THPC_OPTION(train, clip_norm, THPC_AT_LEAST(0),
                  "scale the gradient to this L2 norm when it is larger, before Adam; "
                  "0 = no clipping (the paper has none)"),
      THPC_OPTION(train, log_every, THPC_AT_LEAST(1), "steps between progress lines"),
      THPC_OPTION(train, threads, THPC_AT_LEAST(0),
                  "CPU backend threads, for the ops' loops and BLAS alike (one OpenMP "
                  "team); 0 = OpenMP's default (the cores this process may use unless "
                  "OMP_NUM_THREADS is set); more than those cores share them, said at "
                  "start-up"),
      THPC_OPTION(train, valid_every, THPC_AT_LEAST(0),
                  "steps between validation loss/perplexity lines; 0 = none (needs data.dir)"),
      THPC_OPTION(train, valid_bleu, THPC_ANY,
                  "at each validation also translate the validation sources (shared out "
                  "among the ranks) and log sacreBLEU-exact BLEU (or chrF, or a parser's "
                  "bracket F1: valid_metric) against the targets, both detokenised with the "
                  "shards' SentencePiece model (needs valid_every)"),
      THPC_OPTION(train, valid_metric, THPC_ONE_OF("bleu", "chrf", "f1"),
                  "the score of the validation translations (with valid_bleu): bleu; chrf = "
                  "chrF2 as transformer_score -m chrf (sacreBLEU's defaults); f1 = a "
                  "parser's bracketing F1 (EVALB, COLLINS.prm) of trees decoded as "
                  "transformer_decode --tree-constraints (decode.tree_leaves) writes them"),
      THPC_OPTION(train, valid_beam, THPC_AT_LEAST(1),
                  "beam of the validation translation; 1 = greedy (no length penalty), "
                  "else decode.alpha too, as transformer_decode --beam; decode.max_len_a/b "
                  "cap both"),
      THPC_OPTION(train, valid_bleu_tokenize, THPC_ONE_OF("13a", "intl", "char", "none", "zh"),
                  "tokenisation of the validation BLEU, as transformer_score -tok (char for "
                  "targets of one word, such as compounds; zh for Chinese); chrF takes none"),
      THPC_OPTION(train, metrics_dir, THPC_PATH,
                  "rank 0 appends every logged value to DIR/metrics.jsonl and a TensorBoard "
                  "event file; empty = checkpoint.dir, the run's own directory (jobs/ give "
                  "their run directory, which holds checkpoint.dir)"),
      THPC_OPTION(train, divergence, THPC_ONE_OF("stop", "skip", "rollback"),
                  "what a diverged step (a loss or gradient norm that is not finite or spikes) "
                  "does: stop = no update, no checkpoint of it, exit 4, naming the checkpoint "
                  "to resume from; skip = no update, the next batch (divergence_limit in a "
                  "row, then stop); rollback = continue from the newest healthy checkpoint "
                  "with the learning rate times divergence_lr_factor (divergence_limit times, "
                  "then stop)"),
      THPC_OPTION(train, divergence_loss_factor, THPC_ZERO_OR_ABOVE(1),
                  "a loss above this times max(1, the running average of the healthy steps' "
                  "loss, at most ln(vocabulary), which it is before the first) is a "
                  "divergence; 0 = only a non-finite loss is"),
      THPC_OPTION(train, divergence_gnorm_factor, THPC_ZERO_OR_ABOVE(1),
                  "a gradient norm above this times the running average of the healthy "
                  "steps' norm is a divergence (after divergence_warmup steps); 0 = only a "
                  "non-finite norm is"),
      THPC_OPTION(train, divergence_warmup, THPC_AT_LEAST(0),
                  "healthy steps that set the gradient norm's average before its spikes count"),
      THPC_OPTION(train, divergence_limit, THPC_AT_LEAST(1),
                  "skipped steps in a row (skip) or rollbacks in a run (rollback) before a "
                  "divergence stops the run"),
      THPC_OPTION(train, divergence_lr_factor, THPC_OPEN_FRACTION,
                  "rollback: the learning rate is multiplied by this at each rollback (kept "
                  "in the checkpoints written after it)"),

      // [data]: HDF5 shards of transformer_preprocess, or a synthetic task.
      THPC_OPTION(data, dir, THPC_PATH,
                  "directory of HDF5 shards (transformer_preprocess --destdir); when set the "
                  "synthetic_* keys are ignored; empty = the synthetic task"),
      THPC_OPTION(data, train, THPC_PATH,
                  "training shards: dir/TRAIN.00000.h5, ... (not empty when dir is set)"),
      THPC_OPTION(data, valid, THPC_PATH,
                  "validation shards: dir/VALID.00000.h5, ... (read when train.valid_every > 0)"),
      THPC_OPTION(data, memory_mb, THPC_AT_LEAST(1),
                  "MiB of token arrays a rank keeps; a larger corpus is streamed shard by shard"),
      THPC_OPTION(data, synthetic, THPC_ONE_OF("reverse", "copy", "sort"),
                  "synthetic task: target = source reversed, copied or sorted"),
      THPC_OPTION(data, synthetic_vocab, THPC_AT_LEAST(5),
                  "synthetic vocabulary, 4 specials (pad unk bos eos) included"),
      THPC_OPTION(data, synthetic_min_len, THPC_AT_LEAST(1), "shortest synthetic sentence"),
      THPC_OPTION(data, synthetic_max_len, THPC_ANY,
                  "longest synthetic sentence, >= synthetic_min_len; + 1 (eos, or bos) <= "
                  "model.max_positions"),

      // [dist]: the ranks of an MPI job.
      THPC_OPTION(dist, bucket_mb, THPC_AT_LEAST(0.001),
                  "gradient all-reduce bucket size in MiB (one collective per bucket, whose "
                  "fixed cost dominates small ones: a run warns above 1000 buckets)"),
      // At least a second: 1e-9 was taken, and every step's sums ended the job as hung.
      THPC_OPTION(dist, timeout_s, THPC_AT_LEAST(1),
                  "seconds a rank waits for the others in a training step's collectives "
                  "(the gradient sums, NCCL or MPI, included) before the job is ended: a "
                  "rank stopped (SIGSTOP, a debugger), hung or lost; in start-up (and "
                  "--dry-run), validation, --eval and rank 0's work alone (its checkpoints, "
                  "best.h5, the averages at the end), seconds without a sign of work from a "
                  "rank still at its share (one comes after each batch, and between the "
                  "pieces of a checkpoint or corpus read, copied, hashed or written); the "
                  "time a rank was itself stopped (a suspended job) is not counted"),
      THPC_OPTION(dist, device, THPC_AT_LEAST(-1),
                  "GPU index of every rank; -1 = local rank modulo the visible GPUs"),
      THPC_OPTION(dist, reducer, THPC_ONE_OF("auto", "nccl", "mpi"),
                  "how the ranks sum gradients: auto = nccl on the GPU, mpi on the CPU; mpi on "
                  "the GPU stages each bucket through pinned host memory, so that several "
                  "ranks can share one GPU (NCCL refuses that); nccl needs the GPU"),
      THPC_OPTION(dist, reduce_dtype, THPC_ONE_OF("fp32", "bf16"),
                  "what the gradient buckets travel and are summed as: fp32, or bf16 (half "
                  "the bytes; each addition in fp32, rounded once; the gradient and the fp32 "
                  "master weights stay fp32; docs/cluster.md says when it is safe)"),

      THPC_OPTION(dist, embedding_sum, THPC_ONE_OF("auto", "at_end", "per_use"),
                  "the tied embedding's gradient sum: at_end (one sum when backward ends), or "
                  "per_use (the output projection's share summed while backward goes on, the "
                  "lookups' rows of the step apart: less exposed, whatever the vocabulary); "
                  "auto = per_use on the CPU, at_end on the GPU (where per_use is asked for by "
                  "name until a GPU run has shown it)"),
      THPC_OPTION(dist, log_buckets, THPC_ANY,
                  "on each progress line's step, rank 0 also logs when each bucket's sum was "
                  "posted and done, against when backward was done (host clock; GPU events "
                  "with NCCL): the overlap of the sums with backward, and what is exposed; "
                  "one rank on a GPU then sums through NCCL too (a copy) to time it"),

      // [checkpoint]: written by rank 0 (docs/checkpoints.md).
      THPC_OPTION(checkpoint, dir, THPC_PATH_NOT_EMPTY,
                  "directory of step_NNNNNNNN.h5 checkpoints (relative to the working directory)"),
      THPC_OPTION(checkpoint, minutes, THPC_AT_LEAST(0),
                  "wall-clock minutes between checkpoints, fractions allowed; 0 = none by time"),
      THPC_OPTION(checkpoint, every_steps, THPC_AT_LEAST(0),
                  "also a checkpoint every this many steps; 0 = none by step count"),
      THPC_OPTION(checkpoint, keep, THPC_AT_LEAST(1),
                  "newest checkpoints kept in dir; diverged ones go first, and the newest "
                  "healthy one and the last healthy one before the newest file always stay "
                  "(keep = 1 keeps two: the next step's loss may still mark the newest "
                  "diverged)"),
      THPC_OPTION(checkpoint, background_write, THPC_ANY,
                  "write each checkpoint from a thread while training goes on: the step "
                  "waits only for the copy of the state (a thread-safe HDF5 is needed, else "
                  "the step writes it, with a note); false = the step writes it"),
      THPC_OPTION(checkpoint, resume, THPC_PATH,
                  "continue a run: auto = newest valid checkpoint in dir (none there: step 0; "
                  "only invalid, or only diverged, ones: an error), auto_or_fresh = the same but step 0 when all "
                  "are invalid (they are renamed *.corrupt), or a file; empty = start fresh; "
                  "either stops at a later version's checkpoint, the newest"),
      THPC_OPTION(checkpoint, keep_best, THPC_ONE_OF("none", "ppl", "bleu", "chrf", "f1"),
                  "write dir/best.h5 (the whole state, never pruned) at each validation that "
                  "improves this metric: lower perplexity, higher BLEU, chrF or F1 (bleu, "
                  "chrf and f1 need train.valid_bleu and that train.valid_metric)"),
      THPC_OPTION(checkpoint, keep_best_count, THPC_AT_LEAST(0),
                  "also keep the K best checkpoints by the keep_best metric as "
                  "dir/best_step_NNNNNNNN.h5 (the whole state, score inside; never pruned "
                  "by keep; a better validation replaces the worst); 0 = off"),
      THPC_OPTION(checkpoint, patience, THPC_AT_LEAST(0),
                  "stop training (checkpoint, summary, exit 0) after this many validations "
                  "in a row without a better keep_best metric; 0 = never (needs keep_best)"),
      THPC_OPTION(checkpoint, overwrite, THPC_ANY,
                  "a run owns dir and its metrics file: a new run (resume empty) stops when "
                  "they hold another run's files (step_*.h5, best.h5, metrics.jsonl), a "
                  "resumed one when they hold a different run's, and a resume from a file "
                  "outside dir when dir holds its run's checkpoints of another branch (an "
                  "earlier resume of that file, trained on); true = delete another run's "
                  "files first, mark the other branch's superseded"),
      THPC_OPTION(checkpoint, init, THPC_PATH,
                  "start from this checkpoint's parameters only (ignored when resuming)"),
      THPC_OPTION(checkpoint, average_last, THPC_AT_LEAST(0),
                  "at the end, write dir/average_lastN.h5 from the last N checkpoints "
                  "(with every_steps and minutes = 0, of that schedule: its multiples and "
                  "the last step), "
                  "N <= keep; 0 = off"),
      THPC_OPTION(checkpoint, average_best, THPC_AT_LEAST(0),
                  "at the end, write dir/average_bestN.h5 from the N best checkpoints "
                  "(best_step_*.h5), N <= keep_best_count; 0 = off"),

      // [decode]: transformer_decode's defaults (§6.1; the parser's §6.3).
      THPC_OPTION(decode, beam, THPC_AT_LEAST(1),
                  "beam size (§6.1: 4; parsing §6.3: 21); stored in each checkpoint for "
                  "transformer_decode (training's validation uses train.valid_beam)"),
      THPC_OPTION(decode, alpha, THPC_AT_LEAST(0),
                  "length penalty ((5+|Y|)/6)^alpha (§6.1: 0.6; parsing: 0.3)"),
      THPC_OPTION(decode, max_len_a, THPC_AT_LEAST(0),
                  "output length <= max_len_a * input length + max_len_b, rounded down, "
                  "at least 1 token (a may be a ratio: 1.2)"),
      THPC_OPTION(decode, max_len_b, THPC_AT_LEAST(0), "(§6.1: 1, 50; parsing §6.3: 1, 300)"),
      THPC_OPTION(decode, tree_leaves, THPC_ONE_OF("XX", "words"),
                  "parsing: the linearized trees' word tokens, the placeholder XX or the "
                  "words themselves (tools/run_parser.sh linearizes so, transformer_decode "
                  "--tree-constraints decodes so)"),
  };
  return table;
}

#undef THPC_OPTION
#undef THPC_ANY
#undef THPC_ONE_OF
#undef THPC_AT_LEAST
#undef THPC_ABOVE
#undef THPC_ZERO_OR_AT_LEAST
#undef THPC_FRACTION
#undef THPC_OPEN_FRACTION
#undef THPC_ZERO_OR_ABOVE
#undef THPC_PATH
#undef THPC_PATH_NOT_EMPTY

// ---- values as text ----

const char* type_name(const FieldPointer& field) {
  struct Visitor {
    const char* operator()(int*) const { return "int"; }
    const char* operator()(std::int64_t*) const { return "int64"; }
    const char* operator()(std::uint64_t*) const { return "uint64"; }
    const char* operator()(float*) const { return "float"; }
    const char* operator()(double*) const { return "float"; }  // a real number to the user
    const char* operator()(bool*) const { return "bool"; }
    const char* operator()(std::string*) const { return "string"; }
  };
  return std::visit(Visitor{}, field);
}

// Shortest text that reads back to the same float (or double), so to_ini() round-trips
// exactly.
template <typename Real>
std::string format_real(Real value) {
  char buffer[64];
  const auto result = std::to_chars(buffer, buffer + sizeof buffer, value);
  return std::string(buffer, result.ptr);
}

std::string format_value(const FieldPointer& field) {
  struct Visitor {
    std::string operator()(const int* value) const { return std::to_string(*value); }
    std::string operator()(const std::int64_t* value) const { return std::to_string(*value); }
    std::string operator()(const std::uint64_t* value) const { return std::to_string(*value); }
    std::string operator()(const float* value) const { return format_real(*value); }
    std::string operator()(const double* value) const { return format_real(*value); }
    std::string operator()(const bool* value) const { return *value ? "true" : "false"; }
    std::string operator()(const std::string* value) const { return *value; }
  };
  return std::visit(Visitor{}, field);
}

// A range's bound as the shortest text that reads back to it: 0, 1, -1, 0.5.
std::string format_bound(double bound) {
  char buffer[64];
  const auto result = std::to_chars(buffer, buffer + sizeof buffer, bound);
  return std::string(buffer, result.ptr);
}

std::string Allowed::range_text() const {
  if (!values.empty()) {
    std::string choices;
    for (const std::string& choice : values) choices += (choices.empty() ? "" : " | ") + choice;
    return choices;
  }
  if (non_empty) return "not empty";
  if (!bounded()) return "";
  std::string text;
  if (std::isfinite(min) && std::isfinite(max)) {
    text = (min_open ? "(" : "[") + format_bound(min) + ", " + format_bound(max) +
           (max_open ? ")" : "]");
  } else if (std::isfinite(min)) {
    text = (min_open ? "> " : "≥ ") + format_bound(min);
  } else {
    text = (max_open ? "< " : "≤ ") + format_bound(max);
  }
  return zero_too ? "0 or " + text : text;
}

std::string Allowed::problem(const FieldPointer& field) const {
  const std::string value = format_value(field);
  if (!values.empty() && std::find(values.begin(), values.end(), value) == values.end()) {
    std::string choices;
    for (const std::string& choice : values) choices += (choices.empty() ? "" : ", ") + choice;
    return quoted(value) + " is not one of " + choices;
  }
  if (non_empty && value.empty()) return "must not be empty";
  if (!bounded()) return "";
  const double number = std::visit(
      [](const auto* field_value) {
        using Value = std::remove_cv_t<std::remove_pointer_t<decltype(field_value)>>;
        if constexpr (std::is_arithmetic_v<Value>) {
          return static_cast<double>(*field_value);
        } else {
          return std::numeric_limits<double>::quiet_NaN();
        }
      },
      field);
  const bool in_range = (min_open ? number > min : number >= min) &&
                        (max_open ? number < max : number <= max);
  if (in_range || (zero_too && number == 0.0)) return "";  // NaN is neither
  return outside(value);
}

std::string Allowed::outside(const std::string& value) const {
  const bool interval = std::isfinite(min) && std::isfinite(max);
  return "must be " + std::string(interval ? "in " : "") + range_text() + ", got " + value;
}

std::string default_value_text(const Option& option) {
  Config defaults;
  return format_value(option.field(defaults));
}

std::string trim(const std::string& text) {
  const char* const whitespace = " \t\r\n";
  const auto first = text.find_first_not_of(whitespace);
  if (first == std::string::npos) return "";
  const auto last = text.find_last_not_of(whitespace);
  return text.substr(first, last - first + 1);
}

// A path as written in a config file or after --key= reaches no shell: "dir = ~/runs/x"
// made the directories ./~/runs/x (one `rm -rf ~` away from the home directory), and
// "$SCRATCH/runs" a directory named '$SCRATCH'. Refused, with the path the user meant.
std::string shell_syntax_in_path(const std::string& value, bool on_command_line) {
  if (value.size() >= 2 && (value.front() == '"' || value.front() == '\'') &&
      value.back() == value.front()) {
    return quoted(value) + " is in quotes, which would be part of the path (a config "
           "value needs none, spaces included): write it without them";
  }
  if (!value.empty() && value[0] == '~') {
    const char* home = std::getenv("HOME");
    const bool own_home = value == "~" || value.rfind("~/", 0) == 0;
    std::string meant;
    if (own_home && home != nullptr && *home != '\0') {
      meant = " (" + quoted(std::string(home) + value.substr(1)) + " here)";
    }
    return quoted(value) + " begins with '~', which only a shell expands, and none reads "
           "this value: it would name a directory " + quoted(value.substr(0, value.find('/'))) +
           " in the working directory; write the path in full" + meant;
  }
  for (size_t at = value.find('$'); at != std::string::npos; at = value.find('$', at + 1)) {
    const bool braced = at + 1 < value.size() && value[at + 1] == '{';
    const size_t begin = at + (braced ? 2 : 1);
    size_t end = begin;
    while (end < value.size() &&
           (std::isalnum(static_cast<unsigned char>(value[end])) || value[end] == '_')) {
      ++end;
    }
    if (end == begin || std::isdigit(static_cast<unsigned char>(value[begin]))) continue;
    if (braced && (end >= value.size() || value[end] != '}')) continue;
    const std::string name = value.substr(begin, end - begin);
    const char* set = std::getenv(name.c_str());
    const std::string meant =
        set != nullptr ? " (" + quoted(value.substr(0, at) + set +
                                       value.substr(end + (braced ? 1 : 0))) + " here)"
                       : " ($" + name + " is not set here)";
    return quoted(value) + " names the environment variable $" + name + ", which only a "
           "shell expands, and none reads this value: write the path in full" + meant +
           (on_command_line ? "; in double quotes, not single ones, the shell expands it"
                            : ", or give the key on the command line in double quotes, where "
                              "the shell expands it");
  }
  return "";
}

// Each parse_value returns "" on success, else why the text is not a value of the type.
template <typename Integer>
std::string parse_integer(const std::string& text, Integer* value) {
  const char* const end = text.data() + text.size();
  const auto result = std::from_chars(text.data(), end, *value);
  if (result.ec == std::errc::result_out_of_range) {
    // Said as what the key can hold, not as the type's interval ("out of range
    // [-9223372036854775808, ...]" for a key of at least 1 read as a range of the key's).
    const bool negative = !text.empty() && text[0] == '-';
    return quoted(text) + " is " +
           (negative ? "below the smallest whole number the key holds ("
                       + std::to_string(std::numeric_limits<Integer>::min())
                     : "beyond the largest whole number the key holds ("
                       + std::to_string(std::numeric_limits<Integer>::max())) + ")";
  }
  if (result.ec != std::errc() || result.ptr != end || text.empty()) {
    return quoted(text) + " is not " +
           (std::is_signed_v<Integer> ? "an integer" : "a non-negative integer");
  }
  return "";
}

std::string parse_value(const std::string& text, int* value) { return parse_integer(text, value); }
std::string parse_value(const std::string& text, std::int64_t* value) {
  return parse_integer(text, value);
}
std::string parse_value(const std::string& text, std::uint64_t* value) {
  return parse_integer(text, value);
}

template <typename Real>
std::string parse_real(const std::string& text, Real* value) {
  const char* const end = text.data() + text.size();
  Real parsed = 0;
  const auto result = std::from_chars(text.data(), end, parsed);
  if (result.ec == std::errc::result_out_of_range && result.ptr == end) {
    // (from_chars says so of a value too small as of one too large: 1e-50 as a float)
    const size_t exponent = text.find_first_of("eE");
    const bool tiny = exponent != std::string::npos && exponent + 1 < text.size() &&
                      text[exponent + 1] == '-';
    return quoted(text) + (tiny ? " is too close to 0 for a " : " is out of the range of a ") +
           (std::is_same_v<Real, float> ? "float" : "double") + (tiny ? " (give 0)" : "");
  }
  if (result.ec != std::errc() || result.ptr != end || text.empty()) {
    return quoted(text) + " is not a number";
  }
  if (!std::isfinite(parsed)) return quoted(text) + " is not a finite number";
  *value = parsed;
  return "";
}

std::string parse_value(const std::string& text, float* value) { return parse_real(text, value); }
std::string parse_value(const std::string& text, double* value) { return parse_real(text, value); }

std::string parse_value(const std::string& text, bool* value) {
  if (text == "true" || text == "1") {
    *value = true;
  } else if (text == "false" || text == "0") {
    *value = false;
  } else {
    return quoted(text) + " is not a boolean (use true, false, 1 or 0)";
  }
  return "";
}

std::string parse_value(const std::string& text, std::string* value) {
  *value = text;
  return "";
}

const Option* find_option(const std::string& name) {
  for (const Option& option : option_table()) {
    if (option.name() == name) return &option;
  }
  return nullptr;
}

std::string known_sections() {
  std::string sections;
  for (const Option& option : option_table()) {
    const std::string section = option.section;
    if (sections.find("[" + section + "]") == std::string::npos) {
      sections += (sections.empty() ? "" : " ") + ("[" + section + "]");
    }
  }
  return sections;
}

namespace {

// Whether some key of the table is in `section` ("train").
bool is_known_section(const std::string& section) {
  return std::any_of(option_table().begin(), option_table().end(),
                     [&](const Option& option) { return section == option.section; });
}

// Edits (insertions, deletions, substitutions) between `a` and `b` (Levenshtein).
size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

// The names other toolkits give what a key here does (fairseq's and Marian's options, as
// users bring them), and what to write instead: said where such a key is unknown.
struct OtherToolkitsName {
  const char* section;  // where the key it means is: the name is taken there, or where the
                        // user named no section, or one that does not exist
  const char* name;     // after the section's dot
  const char* instead;  // nullptr: the text of the name before
};
constexpr OtherToolkitsName kOtherToolkitsNames[] = {
    {"train", "lr",
     "here it is train.lr_scale, a factor on the paper's schedule (lrate = lr_scale x "
     "d_model^-0.5 x min(step^-0.5, step x warmup_steps^-1.5), whose peak at step "
     "warmup_steps is lr_scale x (d_model x warmup_steps)^-0.5)"},
    {"train", "learning_rate", nullptr},
    {"train", "learn_rate", nullptr},  // Marian's --learn-rate
    {"train", "max_tokens",
     "here it is train.tokens_per_step, the step's padded tokens a side over all ranks and "
     "micro-batches together (fairseq's --max-tokens is each GPU's)"},
    {"train", "update_freq",
     "here it is train.accumulate, micro-batches that share train.tokens_per_step "
     "(fairseq's --update-freq multiplies --max-tokens instead)"},
    {"train", "max_update", "here it is train.max_steps"},
    {"train", "warmup_updates", "here it is train.warmup_steps"},
    {"train", "max_epoch", "here it is train.max_epochs"},
    {"checkpoint", "save_dir", "here it is checkpoint.dir"},
    {"checkpoint", "save_interval_updates", "here it is checkpoint.every_steps"},
    {"checkpoint", "keep_last_epochs", "here it is checkpoint.keep, of checkpoints saved by steps"},
    {"checkpoint", "keep_interval_updates", "here it is checkpoint.keep"},
    {"model", "relu_dropout", "here it is model.activation_dropout (tensor2tensor's name)"},
    {"model", "transformer_dropout_ffn", "here it is model.activation_dropout (Marian's name)"},
    {"train", "fp16", "here it is train.precision = bf16, on the GPU (the CPU trains in fp32)"},
    {"train", "lr_scheduler",
     "the schedule is always the paper's, fairseq's inverse_sqrt from 0: lrate = lr_scale x "
     "d_model^-0.5 x min(step^-0.5, step x warmup_steps^-1.5) (--dry-run prints its peak)"},
    {"train", "warmup_init_lr", "the warm-up starts from 0 here, for train.warmup_steps steps"},
    {"train", "optimizer",
     "the optimizer is Adam: train.adam_beta1, train.adam_beta2, train.adam_eps, and "
     "train.weight_decay for AdamW"},
    {"train", "criterion", "the loss is label-smoothed cross-entropy: model.label_smoothing"},
    {"train", "batch_size", "batches are counted in tokens here: train.tokens_per_step"},
    {"train", "max_sentences", nullptr},
    {"train", "eval_bleu", "here it is train.valid_bleu, at each train.valid_every steps"},
    {"checkpoint", "best_checkpoint_metric", "here it is checkpoint.keep_best"},
    {"checkpoint", "no_epoch_checkpoints",
     "checkpoints are written by steps and minutes here (checkpoint.every_steps, "
     "checkpoint.minutes), never by epochs"},
    {"model", "arch",
     "the architecture is set key by key: model.layers, model.d_model, model.d_ff, "
     "model.heads (input/base.ini and input/big.ini are the paper's base and big)"},
    {"model", "encoder_layers", "here it is model.layers, the encoder's and the decoder's alike"},
    {"model", "decoder_layers", nullptr},
    {"model", "encoder_embed_dim", "here it is model.d_model"},
    {"model", "decoder_embed_dim", nullptr},
    {"model", "encoder_ffn_embed_dim", "here it is model.d_ff"},
    {"model", "decoder_ffn_embed_dim", nullptr},
    {"model", "encoder_attention_heads", "here it is model.heads"},
    {"model", "decoder_attention_heads", nullptr},
    {"model", "encoder_normalize_before", "here it is model.norm = pre"},
    {"model", "decoder_normalize_before", nullptr},
    {"model", "share_all_embeddings",
     "the data decides here: shards of one vocabulary (the default) give one matrix that "
     "embeds the source and the target and is the output projection (§3.4); shards of "
     "transformer_preprocess --source-vocab-size give the encoder a table of its own, the "
     "target's still the projection's"},
    {"model", "share_decoder_input_output_embed", nullptr},
    {"model", "tied_embeddings_all", nullptr},  // Marian's
    {"model", "tied_embeddings", nullptr},
    // Marian's names (a Marian user's walk): the habits of `marian --task transformer-base`.
    {"checkpoint", "overwrite",
     "Marian's --overwrite (no model.iterN copies) is checkpoint.keep = 1 here (the newest "
     "two stay); "
     "checkpoint.overwrite = true is another thing: it deletes another run's checkpoints "
     "and metrics in checkpoint.dir before a new run starts"},
    {"model", "type",
     "the model is always the paper's encoder-decoder Transformer, set key by key: "
     "model.layers, model.d_model, model.d_ff, model.heads (input/base.ini and "
     "input/big.ini are Marian's --task transformer-base and transformer-big)"},
    {"model", "task", nullptr},
    {"model", "enc_depth", "here it is model.layers, the encoder's and the decoder's alike"},
    {"model", "dec_depth", nullptr},
    {"model", "dim_emb", "here it is model.d_model"},
    {"model", "transformer_dim_ffn", "here it is model.d_ff"},
    {"model", "transformer_heads", "here it is model.heads"},
    {"model", "transformer_dropout",
     "here it is model.dropout, on each sub-layer's output and on the embeddings (§5.4)"},
    {"model", "transformer_dropout_attention", "here it is model.attention_dropout"},
    {"model", "transformer_preprocess",
     "here it is model.norm: pre for Marian's --transformer-preprocess n with "
     "--transformer-postprocess da, post (the paper's) for --transformer-postprocess dan"},
    {"model", "transformer_postprocess", nullptr},
    {"train", "valid_freq",
     "here it is train.valid_every, in steps (no units: Marian's 5000u is 5000)"},
    {"train", "valid_metrics",
     "the loss and perplexity are always computed (the loss label-smoothed, the "
     "perplexity exp of the unsmoothed per-token loss); train.valid_bleu = true adds "
     "train.valid_metric: bleu, chrf or f1"},
    {"train", "beam_size", "here it is train.valid_beam (1, greedy, by default); "
     "transformer_decode --beam when translating"},
    {"train", "normalize",
     "here it is decode.alpha, GNMT's length penalty ((5+|Y|)/6)^alpha, not Marian's "
     "|Y|^alpha: neither ranks as the other"},
    {"checkpoint", "early_stopping",
     "here it is checkpoint.patience: validations in a row without a better "
     "checkpoint.keep_best metric, which it needs"},
    {"train", "after_epochs", "here it is train.max_epochs"},
    {"train", "after_batches", "here it is train.max_steps"},
    {"train", "after", "here it is train.max_steps or train.max_epochs"},
    {"train", "lr_warmup",
     "here it is train.warmup_steps, which is also where the paper's inverse square-root "
     "decay starts (Marian's --lr-decay-inv-sqrt equal to --lr-warmup)"},
    {"train", "lr_decay_inv_sqrt", nullptr},
    {"train", "optimizer_params", "here they are train.adam_beta1, train.adam_beta2, train.adam_eps"},
    {"train", "mini_batch_words",
     "here it is train.tokens_per_step: padded tokens a side, over all ranks and "
     "micro-batches (Marian counts target words without padding)"},
    {"train", "mini_batch", "batches are counted in tokens here: train.tokens_per_step"},
    {"train", "mini_batch_fit",
     "batches are fixed in tokens here (train.tokens_per_step); the memory a step needs is "
     "checked at start-up, and train.accumulate splits a step that does not fit"},
    {"train", "workspace", nullptr},
    {"train", "disp_freq", "here it is train.log_every"},
    {"train", "log",
     "the log goes to standard error (jobs/ scripts keep it); train.metrics_dir gets "
     "metrics.jsonl and TensorBoard events"},
    {"train", "exponential_smoothing",
     "not offered: average checkpoints instead (checkpoint.average_last, "
     "checkpoint.average_best, transformer_average)"},
    {"train", "cost_type", "the loss is label-smoothed cross-entropy: model.label_smoothing"},
    {"checkpoint", "save_freq",
     "here it is checkpoint.every_steps (checkpoint.minutes also writes one every 10 "
     "minutes unless set to 0)"},
    {"checkpoint", "model",
     "here it is checkpoint.dir, a directory of step_NNNNNNNN.h5 checkpoints "
     "(checkpoint.resume = auto continues from its newest)"},
    {"dist", "devices",
     "one GPU per MPI rank here: mpirun -np N (dist.device picks a rank's GPU, by default "
     "its local rank)"},
    {"dist", "sync_sgd", "always synchronous here: every step sums all ranks' gradients"},
    {"data", "train_sets",
     "here it is data.dir (the shards of transformer_preprocess) and data.train"},
    {"data", "valid_sets", "here it is data.valid, shards in data.dir"},
    {"data", "vocabs",
     "the SentencePiece model is made by transformer_preprocess and stored in the shards "
     "(and each checkpoint)"},
    {"data", "max_length",
     "longer training pairs are dropped at preprocessing: transformer_preprocess --max-len"},
};

// Whether `name` (valid_beam) holds `words` (beam) as one or more of its '_'-separated
// words, and more: "beam" is in valid_beam, "beam" is not in "beams", "valid_beam" is not in
// itself.
bool holds_as_words(const std::string& name, const std::string& words) {
  if (words.empty() || words.size() >= name.size()) return false;
  for (size_t at = name.find(words); at != std::string::npos; at = name.find(words, at + 1)) {
    const size_t end = at + words.size();
    if ((at == 0 || name[at - 1] == '_') && (end == name.size() || name[end] == '_')) return true;
  }
  return false;
}

// What a user who wrote `name` (unknown) most likely meant, said as a hint: another
// toolkit's name for a key, the same key in another section, or a key a typo or two away
// ("did you mean train.warmup_steps?"); "" when nothing is close.
std::string likely_meant(const std::string& written) {
  // fairseq's options are written with '-' (--max-tokens), the keys here with '_'.
  std::string name = written;
  std::replace(name.begin(), name.end(), '-', '_');
  const auto dot = name.find('.');
  const std::string key = dot == std::string::npos ? name : name.substr(dot + 1);
  const std::string section = dot == std::string::npos ? "" : name.substr(0, dot);
  const bool section_known = is_known_section(section);
  for (size_t i = 0; i < std::size(kOtherToolkitsNames); ++i) {
    if (key != kOtherToolkitsNames[i].name) continue;
    // ([decode] max_tokens is fairseq-generate's batch, not the training step's)
    if (section_known && section != kOtherToolkitsNames[i].section) continue;
    // (a name without its own text shares the one before it)
    size_t with_text = i;
    while (kOtherToolkitsNames[with_text].instead == nullptr) --with_text;
    return std::string("a name from other toolkits: ") + kOtherToolkitsNames[with_text].instead;
  }
  std::vector<std::string> meant;
  // Within the section written, a key that holds the written one as whole words of its
  // name: train.beam is most likely train.valid_beam (the validation's beam), named before
  // decode.beam (transformer_decode's), the same key in another section.
  if (section_known) {
    for (const Option& option : option_table()) {
      if (option.section == section && holds_as_words(option.key, key)) {
        meant.push_back(option.name());
      }
    }
  }
  for (const Option& option : option_table()) {
    if (option.key == key) meant.push_back(option.name());
  }
  if (meant.empty()) {
    // A typo or two, in a name long enough for two edits not to make any other.
    size_t closest = 3;
    for (const Option& option : option_table()) {
      const size_t distance = edit_distance(name, option.name());
      if (distance > 2 || distance * 4 > name.size()) continue;
      if (distance < closest) meant.clear();
      if (distance <= closest) {
        closest = distance;
        meant.push_back(option.name());
      }
    }
  }
  if (meant.empty()) return "";
  std::string said = "did you mean " + meant.front();
  for (size_t i = 1; i < meant.size(); ++i) {
    said += (i + 1 == meant.size() ? " or " : ", ") + meant[i];
  }
  return said + "?";
}

}  // namespace

std::string likely_meant_hint(const std::string& name) {
  const std::string meant = likely_meant(name);
  return meant.empty() ? "" : " (" + meant + ")";
}

std::string unknown_key_hint(const std::string& name) {
  const std::string meant = likely_meant(name);
  const std::string also = meant.empty() ? "" : "; " + meant;
  const auto dot = name.find('.');
  if (dot == std::string::npos) {
    return " (every key belongs to a section: " + known_sections() + also + ")";
  }
  const std::string section = name.substr(0, dot);
  if (!is_known_section(section)) {
    return " (no such section; the sections are " + known_sections() + also + ")";
  }
  if (!meant.empty()) return " (" + meant + ")";
  // Named with the program: tools that read a configuration (transformer_bench_step
  // --set) list their own options under --help, not the trainer's keys.
  return " (transformer_hpc --help lists the keys of [" + section + "])";
}

}  // namespace thpc
