// The run configuration. One option table (option_table() below) names every key once:
// it drives the Boost.Program_options descriptions for the ini file and the command
// line, the conversion of each value to its field, the --help text, the allowed-value
// checks of validate(), and Config::to_ini(). Adding a key means adding a field to
// config.h and one OPTION line here.
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
#include <variant>

#include "common/error.h"

namespace thpc {
namespace {

namespace po = boost::program_options;

// Where a key's value lives in a Config; the alternative also tells the key's type.
using FieldPointer =
    std::variant<int*, std::int64_t*, std::uint64_t*, float*, bool*, std::string*>;

struct Option {
  const char* section;
  const char* key;
  FieldPointer (*field)(Config&);
  std::vector<std::string> allowed_values;  // empty: any value of the type
  const char* help;

  std::string name() const { return std::string(section) + "." + key; }
};

// The section and key are the member path itself, so a key can never drift from its field.
#define THPC_OPTION(section, key, allowed_values, help)                                 \
  Option {                                                                              \
    #section, #key, [](Config& config) -> FieldPointer { return &config.section.key; }, \
        allowed_values, help                                                            \
  }
#define THPC_ANY std::vector<std::string>{}
#define THPC_ONE_OF(...) std::vector<std::string>{__VA_ARGS__}

// The single source of truth for the keys. Defaults are the member initializers of
// config.h (read from a default-constructed Config), so they are not repeated here.
const std::vector<Option>& option_table() {
  static const std::vector<Option> table = {
      // [model]: §3 and Table 3.
      THPC_OPTION(model, layers, THPC_ANY,
                  "N: identical layers in each of the encoder and decoder stacks (§3.1)"),
      THPC_OPTION(model, d_model, THPC_ANY,
                  "width of embeddings and of every sub-layer output (§3.1)"),
      THPC_OPTION(model, d_ff, THPC_ANY, "inner width of the position-wise feed-forward (§3.3)"),
      THPC_OPTION(model, heads, THPC_ANY, "h: parallel attention heads (§3.2.2)"),
      THPC_OPTION(model, d_k, THPC_ANY, "per-head query/key width; 0 = d_model / heads (§3.2.2)"),
      THPC_OPTION(model, d_v, THPC_ANY, "per-head value width; 0 = d_model / heads (§3.2.2)"),
      THPC_OPTION(model, dropout, THPC_ANY,
                  "P_drop on sub-layer outputs and embedding sums, in [0, 1) (§5.4)"),
      THPC_OPTION(model, attention_dropout, THPC_ANY,
                  "dropout on attention probabilities, in [0, 1) (not in the paper)"),
      THPC_OPTION(model, label_smoothing, THPC_ANY, "eps_ls, in [0, 1) (§5.4)"),
      THPC_OPTION(model, positions, THPC_ONE_OF("sinusoidal", "learned"),
                  "position encoding (§3.5; learned is Table 3 row E)"),
      THPC_OPTION(model, max_positions, THPC_ANY, "longest sequence the positions cover"),
      THPC_OPTION(model, vocab_size, THPC_ANY,
                  "shared source/target vocabulary; 0 = from the data (§5.1)"),
      THPC_OPTION(model, attention_bias, THPC_ANY,
                  "biases on the Q/K/V/O projections (the paper has none)"),
      THPC_OPTION(model, layernorm_eps, THPC_ANY, "epsilon of layer normalization, > 0"),

      // [train]: §5.
      THPC_OPTION(train, backend, THPC_ONE_OF("auto", "cuda", "cpu"),
                  "where the math runs; auto = the GPU when one is visible, else the CPU"),
      THPC_OPTION(train, precision, THPC_ONE_OF("bf16", "fp32"),
                  "GPU activations and GEMM operands (weights, moments stay fp32)"),
      THPC_OPTION(train, seed, THPC_ANY, "seed of parameters, dropout and synthetic data"),
      THPC_OPTION(train, max_steps, THPC_ANY, "optimizer steps to train (§5.2)"),
      THPC_OPTION(train, tokens_per_step, THPC_ANY,
                  "padded tokens per step on each side, source and target (§5.1)"),
      THPC_OPTION(train, accumulate, THPC_ANY, "micro-batches per optimizer step"),
      THPC_OPTION(train, warmup_steps, THPC_ANY, "linear learning-rate warmup (§5.3)"),
      THPC_OPTION(train, lr_scale, THPC_ANY, "factor on the §5.3 schedule; 1 = the paper"),
      THPC_OPTION(train, adam_beta1, THPC_ANY, "Adam beta1, in [0, 1) (§5.3)"),
      THPC_OPTION(train, adam_beta2, THPC_ANY, "Adam beta2, in [0, 1) (§5.3)"),
      THPC_OPTION(train, adam_eps, THPC_ANY, "Adam epsilon, > 0 (§5.3)"),
      THPC_OPTION(train, clip_norm, THPC_ANY,
                  "scale the gradient to this L2 norm when it is larger, before Adam, >= 0; "
                  "0 = no clipping (the paper has none)"),
      THPC_OPTION(train, log_every, THPC_ANY, "steps between progress lines"),
      THPC_OPTION(train, threads, THPC_ANY,
                  "CPU backend BLAS threads; 0 = OpenBLAS's default (all cores unless "
                  "OPENBLAS_NUM_THREADS is set)"),
      THPC_OPTION(train, valid_every, THPC_ANY,
                  "steps between validation loss/perplexity lines; 0 = none (needs data.dir)"),
      THPC_OPTION(train, valid_bleu, THPC_ANY,
                  "at each validation also translate the validation sources (shared out "
                  "among the ranks) and log sacreBLEU-exact BLEU against the targets, both "
                  "detokenised with the shards' SentencePiece model (needs valid_every)"),
      THPC_OPTION(train, valid_beam, THPC_ANY,
                  "beam of the validation translation, >= 1; 1 = greedy (no length penalty), "
                  "else decode.alpha and decode.max_len_a/b as transformer_decode --beam"),
      THPC_OPTION(train, valid_bleu_tokenize, THPC_ONE_OF("13a", "intl", "char", "none"),
                  "tokenisation of the validation BLEU, as transformer_score -tok (char for "
                  "targets of one word, such as compounds)"),
      THPC_OPTION(train, metrics_dir, THPC_ANY,
                  "rank 0 appends every logged value to DIR/metrics.jsonl; empty = the "
                  "directory holding checkpoint.dir (a job's run directory)"),

      // [data]: HDF5 shards of transformer_preprocess, or a synthetic task.
      THPC_OPTION(data, dir, THPC_ANY,
                  "directory of HDF5 shards (transformer_preprocess --destdir); when set the "
                  "synthetic_* keys are ignored; empty = the synthetic task"),
      THPC_OPTION(data, train, THPC_ANY, "training shards: dir/TRAIN.00000.h5, ..."),
      THPC_OPTION(data, valid, THPC_ANY,
                  "validation shards: dir/VALID.00000.h5, ... (read when train.valid_every > 0)"),
      THPC_OPTION(data, memory_mb, THPC_ANY,
                  "MiB of token arrays a rank keeps; a larger corpus is streamed shard by shard"),
      THPC_OPTION(data, synthetic, THPC_ONE_OF("reverse", "copy", "sort"),
                  "synthetic task: target = source reversed, copied or sorted"),
      THPC_OPTION(data, synthetic_vocab, THPC_ANY,
                  "synthetic vocabulary, 4 specials (pad unk bos eos) included; >= 5"),
      THPC_OPTION(data, synthetic_min_len, THPC_ANY, "shortest synthetic sentence, >= 1"),
      THPC_OPTION(data, synthetic_max_len, THPC_ANY,
                  "longest synthetic sentence; + 2 (bos, eos) <= model.max_positions"),

      // [dist]: the ranks of an MPI job.
      THPC_OPTION(dist, bucket_mb, THPC_ANY,
                  "gradient all-reduce bucket size in MiB, > 0 (one collective per bucket)"),
      THPC_OPTION(dist, timeout_s, THPC_ANY,
                  "seconds a GPU gradient all-reduce may take before the job is ended "
                  "(a lost or stuck peer), > 0"),
      THPC_OPTION(dist, device, THPC_ANY,
                  "GPU index of every rank; -1 = local rank modulo the visible GPUs"),

      // [checkpoint]: written by rank 0 (docs/checkpoints.md).
      THPC_OPTION(checkpoint, dir, THPC_ANY,
                  "directory of step_NNNNNNNN.h5 checkpoints (relative to the working directory)"),
      THPC_OPTION(checkpoint, minutes, THPC_ANY,
                  "wall-clock minutes between checkpoints, fractions allowed; 0 = none by time"),
      THPC_OPTION(checkpoint, every_steps, THPC_ANY,
                  "also a checkpoint every this many steps; 0 = none by step count"),
      THPC_OPTION(checkpoint, keep, THPC_ANY, "newest checkpoints kept in dir, >= 1"),
      THPC_OPTION(checkpoint, resume, THPC_ANY,
                  "continue a run: auto = newest valid checkpoint in dir (none there: step 0; "
                  "only invalid ones: an error), auto_or_fresh = the same but step 0 when all "
                  "are invalid (they are renamed *.corrupt), or a file; empty = start fresh"),
      THPC_OPTION(checkpoint, keep_best, THPC_ONE_OF("none", "ppl", "bleu"),
                  "write dir/best.h5 (the whole state, never pruned) at each validation that "
                  "improves this metric: lower perplexity or higher BLEU (needs "
                  "train.valid_bleu)"),
      THPC_OPTION(checkpoint, patience, THPC_ANY,
                  "stop training (checkpoint, summary, exit 0) after this many validations "
                  "in a row without a better keep_best metric, >= 0; 0 = never"),
      THPC_OPTION(checkpoint, init, THPC_ANY,
                  "start from this checkpoint's parameters only (ignored when resuming)"),
      THPC_OPTION(checkpoint, average_last, THPC_ANY,
                  "at the end, write dir/average_lastN.h5 from the last N checkpoints; 0 = off"),

      // [decode]: transformer_decode's defaults (§6.1; the parser's §6.3).
      THPC_OPTION(decode, beam, THPC_ANY, "beam size, >= 1 (§6.1: 4; parsing §6.3: 21)"),
      THPC_OPTION(decode, alpha, THPC_ANY,
                  "length penalty ((5+|Y|)/6)^alpha, >= 0 (§6.1: 0.6; parsing: 0.3)"),
      THPC_OPTION(decode, max_len_a, THPC_ANY,
                  "output length <= max_len_a * input length + max_len_b, >= 0"),
      THPC_OPTION(decode, max_len_b, THPC_ANY, "(§6.1: 1, 50; parsing §6.3: 1, 300), >= 0"),
  };
  return table;
}

#undef THPC_OPTION
#undef THPC_ANY
#undef THPC_ONE_OF

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

  template <typename Number>
  void at_least(const char* key, Number value, Number minimum) const {
    if (!(value >= minimum)) fail(key, "must be ≥ " + text(minimum) + ", got " + text(value));
  }
  void positive(const char* key, float value) const {
    if (!(value > 0.0f)) fail(key, "must be > 0, got " + text(value));
  }
  // [0, 1): probabilities that must leave something (dropout 1 drops everything).
  void fraction(const char* key, float value) const {
    if (!(value >= 0.0f && value < 1.0f)) fail(key, "must be in [0, 1), got " + text(value));
  }

  static std::string text(float value) { return format_float(value); }
  template <typename Integer>
  static std::string text(Integer value) {
    return std::to_string(value);
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
  std::ostringstream bytes;
  bytes << file.rdbuf();
  std::string text = bytes.str();
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

  // Keys with a closed set of values, as the table lists them.
  Config copy = config;  // the table's accessors take a mutable Config
  for (const Option& option : option_table()) {
    if (option.allowed_values.empty()) continue;
    const std::string value = format_value(option.field(copy));
    const auto& allowed = option.allowed_values;
    if (std::find(allowed.begin(), allowed.end(), value) == allowed.end()) {
      std::string choices;
      for (const std::string& choice : allowed) choices += (choices.empty() ? "" : ", ") + choice;
      check.fail(option.name().c_str(), quoted(value) + " is not one of " + choices);
    }
  }

  const ModelConfig& model = config.model;
  check.at_least("model.layers", model.layers, 1);
  check.at_least("model.d_model", model.d_model, 1);
  check.at_least("model.heads", model.heads, 1);
  check.at_least("model.d_k", model.d_k, 0);
  check.at_least("model.d_v", model.d_v, 0);
  // Without explicit head widths each head gets d_model / h (§3.2.2), which must be exact.
  const bool head_widths_given = model.d_k > 0 && model.d_v > 0;
  if (!head_widths_given && model.d_model % model.heads != 0) {
    check.fail("model.heads", "d_model " + std::to_string(model.d_model) +
                                  " is not divisible by heads " + std::to_string(model.heads) +
                                  " (or set both model.d_k and model.d_v)");
  }
  check.at_least("model.d_ff", model.d_ff, 1);
  check.fraction("model.dropout", model.dropout);
  check.fraction("model.attention_dropout", model.attention_dropout);
  check.fraction("model.label_smoothing", model.label_smoothing);
  check.at_least("model.max_positions", model.max_positions, 1);
  // Ids 0..3 are pad, unk, bos, eos: a vocabulary needs at least one token besides them.
  if (model.vocab_size != 0 && model.vocab_size < 5) {
    check.fail("model.vocab_size", "must be 0 (the data's) or ≥ 5 (4 special ids + 1), got " +
                                       std::to_string(model.vocab_size));
  }
  check.positive("model.layernorm_eps", model.layernorm_eps);

  const TrainConfig& train = config.train;
  check.at_least("train.max_steps", train.max_steps, std::int64_t{1});
  check.at_least("train.tokens_per_step", train.tokens_per_step, std::int64_t{1});
  check.at_least("train.accumulate", train.accumulate, 1);
  check.at_least("train.warmup_steps", train.warmup_steps, 1);
  check.positive("train.lr_scale", train.lr_scale);
  check.fraction("train.adam_beta1", train.adam_beta1);
  check.fraction("train.adam_beta2", train.adam_beta2);
  check.positive("train.adam_eps", train.adam_eps);
  if (!(train.clip_norm >= 0.0f)) {
    check.fail("train.clip_norm", "must be ≥ 0 (0 = no clipping), got " +
                                      Checker::text(train.clip_norm));
  }
  check.at_least("train.log_every", train.log_every, 1);
  check.at_least("train.threads", train.threads, 0);
  check.at_least("train.valid_every", train.valid_every, 0);
  check.at_least("train.valid_beam", train.valid_beam, 1);
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
  check.at_least("data.memory_mb", data.memory_mb, 1);
  // Ids 0..3 are pad, unk, bos, eos; a task needs at least one symbol besides them.
  check.at_least("data.synthetic_vocab", data.synthetic_vocab, 5);
  check.at_least("data.synthetic_min_len", data.synthetic_min_len, 1);
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

  const DistConfig& dist = config.dist;
  check.positive("dist.bucket_mb", dist.bucket_mb);
  check.positive("dist.timeout_s", dist.timeout_s);
  check.at_least("dist.device", dist.device, -1);

  const CheckpointConfig& checkpoint = config.checkpoint;
  if (checkpoint.dir.empty()) check.fail("checkpoint.dir", "must not be empty");
  if (!(checkpoint.minutes >= 0.0f)) {
    check.fail("checkpoint.minutes", "must be ≥ 0, got " + Checker::text(checkpoint.minutes));
  }
  check.at_least("checkpoint.every_steps", checkpoint.every_steps, std::int64_t{0});
  check.at_least("checkpoint.keep", checkpoint.keep, 1);
  check.at_least("checkpoint.average_last", checkpoint.average_last, 0);
  // Averaging reads the checkpoints the run kept: it cannot average more than that.
  if (checkpoint.average_last > checkpoint.keep) {
    check.fail("checkpoint.average_last",
               std::to_string(checkpoint.average_last) + " exceeds checkpoint.keep " +
                   std::to_string(checkpoint.keep) + " (the run keeps only that many)");
  }

  // keep_best and patience judge validations: they need validations, and BLEU needs
  // the translation pass.
  if (checkpoint.keep_best != "none" && train.valid_every == 0) {
    check.fail("checkpoint.keep_best",
               checkpoint.keep_best + " compares validations: set train.valid_every > 0");
  }
  if (checkpoint.keep_best == "bleu" && !train.valid_bleu) {
    check.fail("checkpoint.keep_best", "bleu needs train.valid_bleu = true");
  }
  check.at_least("checkpoint.patience", checkpoint.patience, 0);
  if (checkpoint.patience > 0 && checkpoint.keep_best == "none") {
    check.fail("checkpoint.patience",
               "counts validations without a better checkpoint.keep_best metric: set "
               "checkpoint.keep_best = ppl or bleu");
  }

  const DecodeConfig& decode = config.decode;
  check.at_least("decode.beam", decode.beam, 1);
  if (!(decode.alpha >= 0.0f)) {
    check.fail("decode.alpha", "must be ≥ 0, got " + Checker::text(decode.alpha));
  }
  check.at_least("decode.max_len_a", decode.max_len_a, 0);
  check.at_least("decode.max_len_b", decode.max_len_b, 0);
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
  std::size_t key_width = 0;
  std::size_t type_width = 0;
  std::size_t default_width = 0;
  Config defaults;
  for (const Option& option : option_table()) {
    key_width = std::max(key_width, std::string(option.key).size());
    type_width = std::max(type_width, std::string(type_name(option.field(defaults))).size());
    default_width = std::max(default_width, default_value_text(option).size());
  }
  const auto pad = [](const std::string& text, std::size_t width) {
    return text + std::string(width > text.size() ? width - text.size() : 0, ' ');
  };

  std::ostringstream help;
  help << "usage: transformer_hpc CONFIG.ini [--section.key=value ...] [--dry-run | --eval "
          "CHECKPOINT] [--help]\n"
       << "\n"
       << "Trains the Transformer configured by CONFIG.ini. Every key below belongs to a\n"
       << "[section] of the file; --section.key=value on the command line overrides it.\n"
       << "\n"
       << "  --help     print this text and exit\n"
       << "  --dry-run  load and check the configuration, then stop before training\n"
       << "  --eval CHECKPOINT\n"
       << "             print the validation loss and perplexity (and BLEU, with\n"
       << "             train.valid_bleu) of CHECKPOINT on the data.valid shards of\n"
       << "             data.dir, as a 'valid step N' line; trains and writes nothing\n";
  std::string current_section;
  for (const Option& option : option_table()) {
    if (option.section != current_section) {
      current_section = option.section;
      help << "\n[" << current_section << "]\n"
           << "  " << pad("key", key_width) << "  " << pad("type", type_width) << "  "
           << pad("default", default_width) << "  meaning\n";
    }
    std::string meaning = option.help;
    if (!option.allowed_values.empty()) {
      std::string choices;
      for (const std::string& choice : option.allowed_values) {
        choices += (choices.empty() ? "" : " | ") + choice;
      }
      meaning += " [" + choices + "]";
    }
    help << "  " << pad(option.key, key_width) << "  "
         << pad(type_name(option.field(defaults)), type_width) << "  "
         << pad(default_value_text(option), default_width) << "  " << meaning << "\n";
  }
  return help.str();
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
