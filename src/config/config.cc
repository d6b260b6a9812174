// The run configuration. One option table (option_table() below) names every key once,
// with the values it accepts: it drives the Boost.Program_options descriptions for the
// ini file and the command line, the conversion of each value to its field, the --help
// text (docs/configuration.md is a copy, checked by test_config), the per-key checks
// of validate(), and Config::to_ini(). Adding a key means adding a field to config.h and
// one THPC_OPTION line here; only a constraint between keys needs code in validate().
//
// Every value is registered with Boost as plain text and converted here, so that a bad
// value yields one line naming the file and the key ("input/x.ini: model.heads: 'abc' is
// not an integer") rather than Boost's generic wording.
#include "config/config.h"

#include <boost/program_options.hpp>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <limits>
#include <set>
#include <sstream>
#include <type_traits>
#include <utility>
#include <variant>

#include "common/error.h"
#include "kernels/ops.h"

namespace thpc {
namespace {

namespace po = boost::program_options;

// Where a key's value lives in a Config; the alternative also tells the key's type.
using FieldPointer =
    std::variant<int*, std::int64_t*, std::uint64_t*, float*, bool*, std::string*>;

// The values a key accepts beyond those of its type: any, a closed set, a text that is
// not empty, or a numeric range, optionally with 0 besides (a key whose 0 means "off"
// or "from elsewhere"). --help prints range_text(), validate() asks problem().
struct Allowed {
  std::vector<std::string> values;  // a closed set; empty: no set
  bool non_empty = false;
  double min = -std::numeric_limits<double>::infinity();
  bool min_open = false;  // min itself excluded: > instead of ≥
  double max = std::numeric_limits<double>::infinity();
  bool max_open = false;  // max itself excluded: < instead of ≤
  bool zero_too = false;

  bool bounded() const { return std::isfinite(min) || std::isfinite(max); }
  std::string range_text() const;
  // "" when the field's value is allowed, else why not ("must be ≥ 1, got 0").
  std::string problem(const FieldPointer& field) const;
};

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
Allowed not_empty() {
  Allowed allowed;
  allowed.non_empty = true;
  return allowed;
}

struct Option {
  const char* section;
  const char* key;
  FieldPointer (*field)(Config&);
  Allowed allowed;
  const char* help;

  std::string name() const { return std::string(section) + "." + key; }
};

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
#define THPC_NOT_EMPTY not_empty()

// The single source of truth for the keys. Defaults are the member initializers of
// config.h (read from a default-constructed Config), so they are not repeated here.
const std::vector<Option>& option_table() {
  static const std::vector<Option> table = {
      // [model]: §3 and Table 3.
      THPC_OPTION(model, layers, THPC_AT_LEAST(1),
                  "N: identical layers in each of the encoder and decoder stacks (§3.1)"),
      THPC_OPTION(model, d_model, THPC_AT_LEAST(1),
                  "width of embeddings and of every sub-layer output (§3.1)"),
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
      THPC_OPTION(model, label_smoothing, THPC_FRACTION, "eps_ls (§5.4)"),
      THPC_OPTION(model, positions, THPC_ONE_OF("sinusoidal", "learned"),
                  "position encoding (§3.5; learned is Table 3 row E)"),
      THPC_OPTION(model, max_positions, THPC_AT_LEAST(1), "longest sequence the positions cover"),
      THPC_OPTION(model, vocab_size, THPC_ZERO_OR_AT_LEAST(5),
                  "shared source/target vocabulary, the 4 special ids (pad unk bos eos) "
                  "included; 0 = from the data (§5.1)"),
      THPC_OPTION(model, attention_bias, THPC_ANY,
                  "biases on the Q/K/V/O projections (the paper has none)"),
      THPC_OPTION(model, layernorm_eps, THPC_ABOVE(0), "epsilon of layer normalization"),
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
                  "GPU activations and GEMM operands (weights, moments stay fp32)"),
      THPC_OPTION(train, cuda_kernels, THPC_ANY,
                  "GPU kernels: verified = those whose twin tests passed on a GPU; candidate "
                  "= also every variant written since, not yet checked on one (none at "
                  "present); or some of them by name, comma-separated; the CPU ignores it"),
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
      THPC_OPTION(train, tokens_per_step, THPC_AT_LEAST(1),
                  "padded tokens per step on each side, source and target (§5.1)"),
      THPC_OPTION(train, accumulate, THPC_AT_LEAST(1), "micro-batches per optimizer step"),
      THPC_OPTION(train, warmup_steps, THPC_AT_LEAST(1), "linear learning-rate warmup (§5.3)"),
      THPC_OPTION(train, lr_scale, THPC_ABOVE(0), "factor on the §5.3 schedule; 1 = the paper"),
      THPC_OPTION(train, adam_beta1, THPC_FRACTION, "Adam beta1 (§5.3)"),
      THPC_OPTION(train, adam_beta2, THPC_FRACTION, "Adam beta2 (§5.3)"),
      THPC_OPTION(train, adam_eps, THPC_ABOVE(0), "Adam epsilon (§5.3)"),
      THPC_OPTION(train, clip_norm, THPC_AT_LEAST(0),
                  "scale the gradient to this L2 norm when it is larger, before Adam; "
                  "0 = no clipping (the paper has none)"),
      THPC_OPTION(train, log_every, THPC_AT_LEAST(1), "steps between progress lines"),
      THPC_OPTION(train, threads, THPC_AT_LEAST(0),
                  "CPU backend threads, for the ops' loops and BLAS alike (one OpenMP "
                  "team); 0 = OpenMP's default (all cores unless OMP_NUM_THREADS is set)"),
      THPC_OPTION(train, valid_every, THPC_AT_LEAST(0),
                  "steps between validation loss/perplexity lines; 0 = none (needs data.dir)"),
      THPC_OPTION(train, valid_bleu, THPC_ANY,
                  "at each validation also translate the validation sources (shared out "
                  "among the ranks) and log sacreBLEU-exact BLEU (or chrF, valid_metric) "
                  "against the targets, both detokenised with the shards' SentencePiece "
                  "model (needs valid_every)"),
      THPC_OPTION(train, valid_metric, THPC_ONE_OF("bleu", "chrf"),
                  "the score of the validation translations (with valid_bleu): bleu, or "
                  "chrf = chrF2 as transformer_score -m chrf (sacreBLEU's defaults)"),
      THPC_OPTION(train, valid_beam, THPC_AT_LEAST(1),
                  "beam of the validation translation; 1 = greedy (no length penalty), "
                  "else decode.alpha and decode.max_len_a/b as transformer_decode --beam"),
      THPC_OPTION(train, valid_bleu_tokenize, THPC_ONE_OF("13a", "intl", "char", "none"),
                  "tokenisation of the validation BLEU, as transformer_score -tok (char for "
                  "targets of one word, such as compounds)"),
      THPC_OPTION(train, metrics_dir, THPC_ANY,
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
      THPC_OPTION(data, dir, THPC_ANY,
                  "directory of HDF5 shards (transformer_preprocess --destdir); when set the "
                  "synthetic_* keys are ignored; empty = the synthetic task"),
      THPC_OPTION(data, train, THPC_ANY,
                  "training shards: dir/TRAIN.00000.h5, ... (not empty when dir is set)"),
      THPC_OPTION(data, valid, THPC_ANY,
                  "validation shards: dir/VALID.00000.h5, ... (read when train.valid_every > 0)"),
      THPC_OPTION(data, memory_mb, THPC_AT_LEAST(1),
                  "MiB of token arrays a rank keeps; a larger corpus is streamed shard by shard"),
      THPC_OPTION(data, synthetic, THPC_ONE_OF("reverse", "copy", "sort"),
                  "synthetic task: target = source reversed, copied or sorted"),
      THPC_OPTION(data, synthetic_vocab, THPC_AT_LEAST(5),
                  "synthetic vocabulary, 4 specials (pad unk bos eos) included"),
      THPC_OPTION(data, synthetic_min_len, THPC_AT_LEAST(1), "shortest synthetic sentence"),
      THPC_OPTION(data, synthetic_max_len, THPC_ANY,
                  "longest synthetic sentence, >= synthetic_min_len; + 2 (bos, eos) <= "
                  "model.max_positions"),

      // [dist]: the ranks of an MPI job.
      THPC_OPTION(dist, bucket_mb, THPC_AT_LEAST(0.001),
                  "gradient all-reduce bucket size in MiB (one collective per bucket, whose "
                  "fixed cost dominates small ones: a run warns above 1000 buckets)"),
      THPC_OPTION(dist, timeout_s, THPC_ABOVE(0),
                  "seconds a GPU gradient all-reduce may take before the job is ended "
                  "(a lost or stuck peer)"),
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

      // [checkpoint]: written by rank 0 (docs/checkpoints.md).
      THPC_OPTION(checkpoint, dir, THPC_NOT_EMPTY,
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
      THPC_OPTION(checkpoint, resume, THPC_ANY,
                  "continue a run: auto = newest valid checkpoint in dir (none there: step 0; "
                  "only invalid, or only diverged, ones: an error), auto_or_fresh = the same but step 0 when all "
                  "are invalid (they are renamed *.corrupt), or a file; empty = start fresh"),
      THPC_OPTION(checkpoint, keep_best, THPC_ONE_OF("none", "ppl", "bleu", "chrf"),
                  "write dir/best.h5 (the whole state, never pruned) at each validation that "
                  "improves this metric: lower perplexity, higher BLEU or chrF (bleu and "
                  "chrf need train.valid_bleu and that train.valid_metric)"),
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
                  "resumed one when they hold a different run's; true = delete those files "
                  "first"),
      THPC_OPTION(checkpoint, init, THPC_ANY,
                  "start from this checkpoint's parameters only (ignored when resuming)"),
      THPC_OPTION(checkpoint, average_last, THPC_AT_LEAST(0),
                  "at the end, write dir/average_lastN.h5 from the last N checkpoints, "
                  "N <= keep; 0 = off"),
      THPC_OPTION(checkpoint, average_best, THPC_AT_LEAST(0),
                  "at the end, write dir/average_bestN.h5 from the N best checkpoints "
                  "(best_step_*.h5), N <= keep_best_count; 0 = off"),

      // [decode]: transformer_decode's defaults (§6.1; the parser's §6.3).
      THPC_OPTION(decode, beam, THPC_AT_LEAST(1), "beam size (§6.1: 4; parsing §6.3: 21)"),
      THPC_OPTION(decode, alpha, THPC_AT_LEAST(0),
                  "length penalty ((5+|Y|)/6)^alpha (§6.1: 0.6; parsing: 0.3)"),
      THPC_OPTION(decode, max_len_a, THPC_AT_LEAST(0),
                  "output length <= max_len_a * input length + max_len_b"),
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
#undef THPC_NOT_EMPTY

// ---- values as text ----

const char* type_name(const FieldPointer& field) {
  struct Visitor {
    const char* operator()(int*) const { return "int"; }
    const char* operator()(std::int64_t*) const { return "int64"; }
    const char* operator()(std::uint64_t*) const { return "uint64"; }
    const char* operator()(float*) const { return "float"; }
    const char* operator()(bool*) const { return "bool"; }
    const char* operator()(std::string*) const { return "string"; }
  };
  return std::visit(Visitor{}, field);
}

// Shortest text that reads back to the same float, so to_ini() round-trips exactly.
std::string format_float(float value) {
  char buffer[64];
  const auto result = std::to_chars(buffer, buffer + sizeof buffer, value);
  return std::string(buffer, result.ptr);
}

std::string format_value(const FieldPointer& field) {
  struct Visitor {
    std::string operator()(const int* value) const { return std::to_string(*value); }
    std::string operator()(const std::int64_t* value) const { return std::to_string(*value); }
    std::string operator()(const std::uint64_t* value) const { return std::to_string(*value); }
    std::string operator()(const float* value) const { return format_float(*value); }
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

// Each parse_value returns "" on success, else why the text is not a value of the type.
template <typename Integer>
std::string parse_integer(const std::string& text, Integer* value) {
  const char* const end = text.data() + text.size();
  const auto result = std::from_chars(text.data(), end, *value);
  if (result.ec == std::errc::result_out_of_range) {
    return quoted(text) + " is out of range [" +
           std::to_string(std::numeric_limits<Integer>::min()) + ", " +
           std::to_string(std::numeric_limits<Integer>::max()) + "]";
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

std::string parse_value(const std::string& text, float* value) {
  const char* const end = text.data() + text.size();
  float parsed = 0.0f;
  const auto result = std::from_chars(text.data(), end, parsed);
  if (result.ec == std::errc::result_out_of_range) {
    return quoted(text) + " is out of the range of a float";
  }
  if (result.ec != std::errc() || result.ptr != end || text.empty()) {
    return quoted(text) + " is not a number";
  }
  if (!std::isfinite(parsed)) return quoted(text) + " is not a finite number";
  *value = parsed;
  return "";
}

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

// ---- Boost.Program_options plumbing ----

// The table's keys as Boost options, all taken as text and converted by parse_value.
// One lasting instance: Boost's parsed_options keep a pointer to their description.
const po::options_description& table_description() {
  static const po::options_description description = [] {
    po::options_description keys;
    for (const Option& option : option_table()) {
      keys.add_options()(option.name().c_str(), po::value<std::string>(), option.help);
    }
    return keys;
  }();
  return description;
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

// A hint after an unknown key: whether its section exists at all.
std::string unknown_key_hint(const std::string& name) {
  const auto dot = name.find('.');
  if (dot == std::string::npos) {
    return " (every key belongs to a section: " + known_sections() + ")";
  }
  const std::string section = name.substr(0, dot);
  const bool section_known =
      std::any_of(option_table().begin(), option_table().end(),
                  [&](const Option& option) { return section == option.section; });
  if (!section_known) return " (no such section; the sections are " + known_sections() + ")";
  return " (see --help for the keys of [" + section + "])";
}

// Boost prints option names with the prefix of their origin ("--model.heads"); the
// messages here name keys as the ini file does ("model.heads").
std::string key_name(const po::error_with_option_name& error) {
  std::string name = error.get_option_name();
  while (!name.empty() && name.front() == '-') name.erase(name.begin());
  return name;
}

// Rethrows a Boost error from the command line or the overrides as one thpc::Error line.
[[noreturn]] void fail_command_line(const std::string& file_label, const po::error& error) {
  if (const auto* repeated = dynamic_cast<const po::multiple_occurrences*>(&error)) {
    THPC_FAIL(file_label << ": " << key_name(*repeated)
                         << ": given more than once on the command line");
  }
  if (const auto* syntax = dynamic_cast<const po::invalid_command_line_syntax*>(&error)) {
    if (syntax->kind() == po::invalid_syntax::missing_parameter) {
      THPC_FAIL(file_label << ": " << key_name(*syntax) << ": missing value on the command line"
                           << " (write --" << key_name(*syntax) << "=VALUE)");
    }
  }
  THPC_FAIL(file_label << ": bad command line: " << error.what());
}

// Rejects command-line tokens that name no option (collected rather than thrown by
// Boost, so that the message can name the config file given on the same line), and a
// key whose value is the next option: Boost takes `--model.layers --dry-run` as layers =
// "--dry-run". No value of the table starts with "--".
void reject_unknown_options(const std::string& file_label, const po::parsed_options& parsed) {
  for (const po::option& option : parsed.options) {
    if (!option.unregistered && find_option(option.string_key) != nullptr &&
        !option.value.empty() && option.value.front().rfind("--", 0) == 0) {
      THPC_FAIL(file_label << ": " << option.string_key << ": missing value on the command "
                           << "line (the next argument " << quoted(option.value.front())
                           << " was taken for it; write --" << option.string_key << "=VALUE)");
    }
    if (!option.unregistered) continue;
    const std::string token =
        option.original_tokens.empty() ? option.string_key : option.original_tokens.front();
    const bool names_a_key = option.string_key.find('.') != std::string::npos;
    THPC_FAIL(file_label << ": unknown command-line option " << quoted(token)
                         << (names_a_key ? unknown_key_hint(option.string_key)
                                         : std::string(" (see --help)")));
  }
}

constexpr int kCommandLineStyle =
    // Exact names only: a misspelt key must fail, not silently match a longer one.
    po::command_line_style::unix_style & ~po::command_line_style::allow_guessing;

// Reads ini text from `stream` (named `ini_path` in messages) into `values`, which
// already holds the command line's values (Boost keeps the first value stored, so the
// command line wins), converts every value into a Config and validates it.
// `require_keys`: a file with no key at all is refused (an empty or wrong file would
// otherwise train the full base model on the defaults).
Config resolve(const std::string& ini_path, std::istream& stream, po::variables_map& values,
               bool require_keys) {
  std::set<std::string> from_command_line;
  for (const auto& [name, value] : values) {
    if (find_option(name) != nullptr) from_command_line.insert(name);
  }

  try {
    const bool allow_unregistered = false;
    const po::parsed_options parsed =
        po::parse_config_file(stream, table_description(), allow_unregistered);
    if (require_keys && parsed.options.empty()) {
      THPC_FAIL(ini_path << ": holds no keys at all (an empty config would train the "
                         << "defaults, the base model; write at least one 'key = value' "
                         << "under a [section])");
    }
    po::store(parsed, values);
  } catch (const Error&) {
    throw;
  } catch (const po::unknown_option& error) {
    const std::string name = key_name(error);
    THPC_FAIL(ini_path << ": unknown key " << quoted(name) << unknown_key_hint(name));
  } catch (const po::multiple_occurrences& error) {
    THPC_FAIL(ini_path << ": " << key_name(error) << ": given more than once");
  } catch (const po::invalid_config_file_syntax& error) {
    THPC_FAIL(ini_path << ": invalid line " << quoted(error.tokens())
                       << " (expected 'key = value' or '[section]')");
  } catch (const po::error& error) {
    THPC_FAIL(ini_path << ": " << error.what());
  }

  Config config;
  config.source_file = ini_path;
  for (const Option& option : option_table()) {
    const std::string name = option.name();
    const auto found = values.find(name);
    if (found == values.end()) continue;
    const std::string text = trim(found->second.as<std::string>());
    const std::string problem = std::visit(
        [&](auto* field) { return parse_value(text, field); }, option.field(config));
    if (!problem.empty()) {
      THPC_FAIL(ini_path << ": " << name << ": " << problem
                         << (from_command_line.count(name) ? " (on the command line)" : ""));
    }
  }
  validate(config);
  return config;
}

// ---- validation helpers ----

class Checker {
 public:
  explicit Checker(const Config& config)
      : where_(config.source_file.empty() ? std::string("config") : config.source_file) {}

  [[noreturn]] void fail(const char* key, const std::string& problem) const {
    THPC_FAIL(where_ << ": " << key << ": " << problem);
  }

 private:
  std::string where_;
};

// resolve() over the file at `ini_path`.
Config resolve_file(const std::string& ini_path, po::variables_map& values) {
  std::error_code ignored;
  if (std::filesystem::is_directory(ini_path, ignored)) {
    THPC_FAIL("cannot open config file '" << ini_path << "': it is a directory");
  }
  std::ifstream file(ini_path, std::ios::binary);
  if (!file) THPC_FAIL("cannot open config file '" << ini_path << "'");
  // A config is a few KB of text; a device such as /dev/zero, or a data file named by
  // mistake, would otherwise be read until memory runs out.
  constexpr std::streamsize kMaxConfigBytes = 1 << 20;
  std::string text(kMaxConfigBytes + 1, '\0');
  file.read(text.data(), static_cast<std::streamsize>(text.size()));
  text.resize(static_cast<size_t>(file.gcount()));
  if (static_cast<std::streamsize>(text.size()) > kMaxConfigBytes) {
    THPC_FAIL("config file '" << ini_path << "' is larger than 1 MiB: a config is a few KB "
              "of [section] and key = value lines; is it the right file?");
  }
  // Editors on Windows start UTF-8 files with a byte order mark; it is not part of the
  // first line.
  if (text.rfind("\xEF\xBB\xBF", 0) == 0) text.erase(0, 3);
  std::istringstream stream(text);
  return resolve(ini_path, stream, values, /*require_keys=*/true);
}

}  // namespace

// ---- public API ----

void validate(const Config& config) {
  const Checker check(config);

  // Each key against the values its table entry allows.
  Config copy = config;  // the table's accessors take a mutable Config
  for (const Option& option : option_table()) {
    const std::string problem = option.allowed.problem(option.field(copy));
    if (!problem.empty()) check.fail(option.name().c_str(), problem);
  }

  // Relations between keys.
  const ModelConfig& model = config.model;
  // Without explicit head widths each head gets d_model / h (§3.2.2), which must be exact.
  const bool head_widths_given = model.d_k > 0 && model.d_v > 0;
  if (!head_widths_given && model.d_model % model.heads != 0) {
    check.fail("model.heads", "d_model " + std::to_string(model.d_model) +
                                  " is not divisible by heads " + std::to_string(model.heads) +
                                  " (or set both model.d_k and model.d_v)");
  }

  const TrainConfig& train = config.train;
  unsigned candidates = kNoCandidates;
  std::string candidates_error;
  if (!parse_candidate_kernels(train.cuda_kernels, candidates, candidates_error)) {
    check.fail("train.cuda_kernels", candidates_error);
  }
  // Each micro-batch gets tokens_per_step / accumulate (/ ranks) tokens: fewer than one
  // made every micro-batch a batch of its own budget's floor, 10^8 of them a step.
  if (train.accumulate > train.tokens_per_step) {
    check.fail("train.accumulate",
               std::to_string(train.accumulate) + " micro-batches cannot share "
               "train.tokens_per_step " + std::to_string(train.tokens_per_step) +
               " tokens (each needs at least one)");
  }
  // OpenMP creates them all at once: 10^5 threads ended in a segfault in the runtime.
  if (train.threads > kMaxCpuThreads) {
    check.fail("train.threads", std::to_string(train.threads) + " is more than the " +
                                    std::to_string(kMaxCpuThreads) +
                                    " a node can run (0 = one per core)");
  }
  if (train.valid_bleu && train.valid_every == 0) {
    check.fail("train.valid_bleu", "translates at each validation: set train.valid_every > 0");
  }
  const DataConfig& data = config.data;
  if (train.valid_every > 0 && data.dir.empty()) {
    check.fail("train.valid_every",
               "validation reads shards: set data.dir (or train.valid_every = 0)");
  }
  if (!data.dir.empty() && data.train.empty()) {
    check.fail("data.train", "must name the training shards (e.g. train)");
  }
  if (train.valid_every > 0 && data.valid.empty()) {
    check.fail("data.valid", "must name the validation shards when train.valid_every > 0");
  }
  if (data.synthetic_max_len < data.synthetic_min_len) {
    check.fail("data.synthetic_max_len",
               "must be ≥ data.synthetic_min_len " + std::to_string(data.synthetic_min_len) +
                   ", got " + std::to_string(data.synthetic_max_len));
  }
  // A target sequence carries bos and eos around the sentence.
  if (static_cast<std::int64_t>(data.synthetic_max_len) + 2 > model.max_positions) {
    check.fail("data.synthetic_max_len",
               std::to_string(data.synthetic_max_len) + " + 2 (bos, eos) exceeds " +
                   "model.max_positions " + std::to_string(model.max_positions));
  }

  const CheckpointConfig& checkpoint = config.checkpoint;
  // Averaging reads the checkpoints the run kept: it cannot average more than that.
  if (checkpoint.average_last > checkpoint.keep) {
    check.fail("checkpoint.average_last",
               std::to_string(checkpoint.average_last) + " exceeds checkpoint.keep " +
                   std::to_string(checkpoint.keep) + " (the run keeps only that many)");
  }

  // keep_best and patience judge validations: they need validations, and BLEU or chrF
  // the translation pass scored with that metric.
  if (checkpoint.keep_best != "none" && train.valid_every == 0) {
    check.fail("checkpoint.keep_best",
               checkpoint.keep_best + " compares validations: set train.valid_every > 0");
  }
  const bool keeps_translation_score =
      checkpoint.keep_best == "bleu" || checkpoint.keep_best == "chrf";
  if (keeps_translation_score && !train.valid_bleu) {
    check.fail("checkpoint.keep_best", checkpoint.keep_best + " needs train.valid_bleu = true");
  }
  if (keeps_translation_score && checkpoint.keep_best != train.valid_metric) {
    check.fail("checkpoint.keep_best",
               checkpoint.keep_best + " needs train.valid_metric = " + checkpoint.keep_best +
                   " (the validations score " + train.valid_metric + ")");
  }
  // The k best are ranked by keep_best's metric; their average reads the ones kept.
  if (checkpoint.keep_best_count > 0 && checkpoint.keep_best == "none") {
    check.fail("checkpoint.keep_best_count",
               "ranks checkpoints by the checkpoint.keep_best metric: set checkpoint.keep_best "
               "= ppl, bleu or chrf");
  }
  if (checkpoint.average_best > checkpoint.keep_best_count) {
    check.fail("checkpoint.average_best",
               std::to_string(checkpoint.average_best) + " exceeds checkpoint.keep_best_count " +
                   std::to_string(checkpoint.keep_best_count) +
                   " (the run keeps only that many best checkpoints)");
  }
  if (checkpoint.patience > 0 && checkpoint.keep_best == "none") {
    check.fail("checkpoint.patience",
               "counts validations without a better checkpoint.keep_best metric: set "
               "checkpoint.keep_best = ppl, bleu or chrf");
  }
}

std::string Config::to_ini() const {
  Config copy = *this;  // the table's accessors take a mutable Config
  std::ostringstream ini;
  ini << "# transformer_hpc configuration, resolved"
      << (source_file.empty() ? std::string() : " from " + source_file)
      << " (file and command-line overrides applied)\n";
  std::string current_section;
  for (const Option& option : option_table()) {
    if (option.section != current_section) {
      current_section = option.section;
      ini << "\n[" << current_section << "]\n";
    }
    ini << option.key << " = " << format_value(option.field(copy)) << "\n";
  }
  return ini.str();
}

std::string help_text() {
  // Widths in characters, not bytes: a range may hold "≥".
  const auto width = [](const std::string& text) {
    return static_cast<std::size_t>(std::count_if(text.begin(), text.end(), [](char c) {
      return (static_cast<unsigned char>(c) & 0xC0) != 0x80;  // not a UTF-8 continuation
    }));
  };
  std::size_t key_width = 0;
  std::size_t type_width = 0;
  std::size_t default_width = 0;
  std::size_t range_width = std::string("range").size();
  Config defaults;
  for (const Option& option : option_table()) {
    key_width = std::max(key_width, width(option.key));
    type_width = std::max(type_width, width(type_name(option.field(defaults))));
    default_width = std::max(default_width, width(default_value_text(option)));
    range_width = std::max(range_width, width(option.allowed.range_text()));
  }
  const auto pad = [&](const std::string& text, std::size_t column_width) {
    const std::size_t used = width(text);
    return text + std::string(column_width > used ? column_width - used : 0, ' ');
  };

  std::ostringstream help;
  help << "usage: transformer_hpc CONFIG.ini [--section.key=value ...] [--dry-run | --eval "
          "CHECKPOINT] [--help]\n"
       << "\n"
       << "Trains the Transformer configured by CONFIG.ini. Every key below belongs to a\n"
       << "[section] of the file; --section.key=value on the command line overrides it.\n"
       << "A value outside its key's range stops the program before any work.\n"
       << "\n"
       << "  --help     print this text and exit\n"
       << "  --dry-run  load and check the configuration, then stop before training\n"
       << "  --eval CHECKPOINT\n"
       << "             print the validation loss and perplexity (and BLEU or chrF,\n"
       << "             with train.valid_bleu) of CHECKPOINT on the data.valid shards\n"
       << "             of data.dir, as a 'valid step N' line; trains and writes nothing\n";
  std::string current_section;
  for (const Option& option : option_table()) {
    if (option.section != current_section) {
      current_section = option.section;
      help << "\n[" << current_section << "]\n"
           << "  " << pad("key", key_width) << "  " << pad("type", type_width) << "  "
           << pad("default", default_width) << "  " << pad("range", range_width)
           << "  meaning\n";
    }
    help << "  " << pad(option.key, key_width) << "  "
         << pad(type_name(option.field(defaults)), type_width) << "  "
         << pad(default_value_text(option), default_width) << "  "
         << pad(option.allowed.range_text(), range_width) << "  " << option.help << "\n";
  }
  return help.str();
}

namespace {

// "section.key" -> value of each "key = value" line of a to_ini() text, in order.
std::vector<std::pair<std::string, std::string>> ini_values(const std::string& ini) {
  std::vector<std::pair<std::string, std::string>> values;
  std::istringstream lines(ini);
  std::string line, section;
  while (std::getline(lines, line)) {
    if (line.empty() || line.front() == '#') continue;
    if (line.front() == '[' && line.back() == ']') {
      section = line.substr(1, line.size() - 2);
      continue;
    }
    const size_t equals = line.find(" = ");
    if (equals == std::string::npos) continue;
    values.emplace_back(section + "." + line.substr(0, equals), line.substr(equals + 3));
  }
  return values;
}

}  // namespace

std::vector<ConfigDifference> config_differences(const std::string& ini,
                                                 const std::string& reference_ini) {
  const auto values = ini_values(ini);
  const auto references = ini_values(reference_ini);
  const auto find = [](const std::vector<std::pair<std::string, std::string>>& in,
                       const std::string& key) -> std::string {
    for (const auto& [name, value] : in) {
      if (name == key) return value;
    }
    return "(absent)";
  };
  std::vector<ConfigDifference> differences;
  for (const auto& [key, value] : values) {
    const std::string reference = find(references, key);
    if (reference != value) differences.push_back({key, value, reference});
  }
  for (const auto& [key, reference] : references) {
    if (find(values, key) == "(absent)") differences.push_back({key, "(absent)", reference});
  }
  return differences;
}

Config load_config(const std::string& ini_path, const std::vector<std::string>& overrides) {
  // An override is a command-line option without its dashes: same parser, same rules.
  std::vector<std::string> tokens;
  for (const std::string& override_text : overrides) {
    tokens.push_back(override_text.rfind("--", 0) == 0 ? override_text : "--" + override_text);
  }
  po::variables_map values;
  try {
    const po::parsed_options parsed = po::command_line_parser(tokens)
                                          .options(table_description())
                                          .style(kCommandLineStyle)
                                          .allow_unregistered()
                                          .run();
    reject_unknown_options(ini_path, parsed);
    po::store(parsed, values);
  } catch (const po::error& error) {
    fail_command_line(ini_path, error);
  }
  return resolve_file(ini_path, values);
}

Config load_config_text(const std::string& ini_text, const std::string& source_name) {
  std::istringstream stream(ini_text);
  po::variables_map values;
  return resolve(source_name, stream, values, /*require_keys=*/false);
}

bool parse_command_line(int argc, const char* const* argv, Config& config) {
  po::options_description flags;
  flags.add_options()("help", "print the help text and exit")(
      "dry-run", "check the configuration and stop")(
      "eval", po::value<std::string>(), "score a checkpoint on the validation shards")(
      "config", po::value<std::vector<std::string>>(), "the ini file");
  po::options_description all_options;
  all_options.add(flags).add(table_description());
  po::positional_options_description positional;
  positional.add("config", -1);  // any count, so that extra files get a clear message

  po::variables_map values;
  std::vector<std::string> config_files;
  std::string file_label = "command line";
  try {
    const po::parsed_options parsed = po::command_line_parser(argc, argv)
                                          .options(all_options)
                                          .positional(positional)
                                          .style(kCommandLineStyle)
                                          .allow_unregistered()
                                          .run();
    // Find the file first so that every later message can name it.
    for (const po::option& option : parsed.options) {
      if (option.string_key == "config") {
        config_files.insert(config_files.end(), option.value.begin(), option.value.end());
      }
    }
    if (!config_files.empty()) file_label = config_files.front();
    for (const po::option& option : parsed.options) {
      if (option.string_key == "help") {
        std::cout << help_text();
        return false;
      }
    }
    reject_unknown_options(file_label, parsed);
    po::store(parsed, values);
  } catch (const po::error& error) {
    // Boost stopped before the positional file was known: name the first argument that
    // is a file, which is what the user meant as CONFIG.ini.
    for (int index = 1; index < argc && config_files.empty(); ++index) {
      std::error_code ignored;
      if (argv[index][0] != '-' && std::filesystem::is_regular_file(argv[index], ignored)) {
        file_label = argv[index];
        break;
      }
    }
    fail_command_line(file_label, error);
  }

  if (config_files.empty()) {
    THPC_FAIL("no config file given (usage: transformer_hpc CONFIG.ini "
              "[--section.key=value ...] [--dry-run]; --help lists the keys)");
  }
  if (config_files.size() > 1) {
    THPC_FAIL("more than one config file given: '" << config_files[0] << "' and '"
                                                   << config_files[1] << "'");
  }
  values.erase("config");
  values.erase("help");
  const bool dry_run = values.count("dry-run") > 0;
  values.erase("dry-run");
  std::string eval_checkpoint;
  if (values.count("eval")) {
    eval_checkpoint = values["eval"].as<std::string>();
    values.erase("eval");
    if (eval_checkpoint.empty()) THPC_FAIL("--eval: needs a checkpoint file (--eval=FILE)");
    if (dry_run) THPC_FAIL("--eval and --dry-run: give one of them");
  }

  config = resolve_file(config_files.front(), values);
  config.dry_run = dry_run;
  config.eval_checkpoint = eval_checkpoint;
  return true;
}

}  // namespace thpc
