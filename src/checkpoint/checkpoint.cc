#include "checkpoint/checkpoint.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <set>
#include <ostream>
#include <sstream>
#include <string_view>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "checkpoint/checkpoint_header.h"
#include "common/cores.h"
#include "common/error.h"
#include "common/sha256.h"
#include "common/still_working.h"
#include "io/atomic_file.h"
#include "io/hdf5.h"
#include "io/run_file_names.h"

namespace thpc {
namespace {

namespace fs = std::filesystem;

constexpr const char* kSpmModelDataset = "spm_model";
constexpr const char* kSourceSpmModelDataset = "source_spm_model";
constexpr const char* kBestValidGroup = "best_valid";
constexpr const char* kDivergenceDataset = "divergence";
constexpr const char* kRunIdAttribute = "run_id";
constexpr const char* kCorpusAttribute = "corpus_sha256";
constexpr const char* kDirectionAttribute = "direction";
constexpr const char* kValidAttribute = "valid_sha256";
constexpr const char* kWorkingDirectoryAttribute = "working_directory";
constexpr const char* kLineageAttribute = "lineage";
constexpr const char* kValidationGroup = "validation";
constexpr const char* kValidationPendingDataset = "validation_pending";

// A BestValidation as its dataset holds it: the value, its step, the validations since.
std::vector<double> best_validation_values(const BestValidation& best) {
  return {best.value, static_cast<double>(best.step), static_cast<double>(best.validations_since)};
}

// /divergence as stored: the step's loss, then the DivergenceState.
std::vector<double> divergence_values(double loss, const DivergenceState& state) {
  return {loss,
          state.loss_average,
          state.grad_norm_average,
          static_cast<double>(state.healthy_steps),
          static_cast<double>(state.skipped_steps),
          static_cast<double>(state.consecutive_skips),
          static_cast<double>(state.rollbacks),
          state.lr_factor};
}

using hdf5::Handle;

// The bytes of one dataset's values in memory.
struct Bytes {
  const void* data;
  size_t size;
};

// The sha256 of each dataset's bytes, on all cores: hashing is most of the time a
// checkpoint takes to write and to verify (docs/checkpoints.md), and datasets hash
// independently of each other.
std::vector<std::string> sha256_of_each(const std::vector<Bytes>& datasets) {
  std::vector<std::string> digests(datasets.size());
  if (datasets.empty()) return digests;
  std::atomic<size_t> next{0};
  const auto hash_remaining = [&] {
    for (size_t i = next++; i < datasets.size(); i = next++) {
      digests[i] = sha256_hex(datasets[i].data, datasets[i].size);
      // Seconds for a large checkpoint, which other ranks may wait through: on this
      // thread a sign to them, on a helper a count a waiting thread sees move.
      show_still_working();
    }
  };
  const size_t helpers =
      std::min<size_t>(static_cast<size_t>(cores_this_process_may_use()), datasets.size()) - 1;
  std::vector<std::thread> threads;
  for (size_t i = 0; i < helpers; ++i) threads.emplace_back(hash_remaining);
  hash_remaining();
  for (std::thread& thread : threads) thread.join();
  return digests;
}

// The values of every tensor of `groups`, in order.
std::vector<Bytes> bytes_of(std::initializer_list<const std::vector<NamedTensor>*> groups) {
  std::vector<Bytes> bytes;
  for (const std::vector<NamedTensor>* group : groups) {
    for (const NamedTensor& tensor : *group) {
      bytes.push_back({tensor.values.data(), tensor.values.size() * sizeof(float)});
    }
  }
  return bytes;
}

// A quantized tensor's two datasets, values then scales.
void append_bytes_of(const QuantizedTensor& tensor, std::vector<Bytes>& bytes) {
  bytes.push_back({tensor.values.data(), tensor.values.size()});
  bytes.push_back({tensor.scales.data(), tensor.scales.size() * sizeof(float)});
}

// The group of the int8 parameters, and its members' datasets.
constexpr const char* kQuantizedGroup = "quantized";
constexpr const char* kOutputAxisAttribute = "output_axis";

}  // namespace

const std::vector<std::string>& checkpoint_root_attributes() {
  static const std::vector<std::string> names = {
      "format_version", "step", "seed", "world_size", "data_epoch", "data_index",
      "architecture", "config", kRunIdAttribute, kCorpusAttribute, kDirectionAttribute,
      kValidAttribute, kWorkingDirectoryAttribute, kLineageAttribute};
  return names;
}

std::string lineage_text(const std::vector<BranchStart>& lineage) {
  std::string text;
  for (const BranchStart& branch : lineage) {
    text += (text.empty() ? "" : " ") + std::to_string(branch.step) + ":" + branch.id;
  }
  return text;
}

std::string parse_lineage(const std::string& text, std::vector<BranchStart>* lineage) {
  lineage->clear();
  std::istringstream words(text);
  for (std::string word; words >> word;) {
    const size_t colon = word.find(':');
    const std::string step = word.substr(0, colon);
    const std::string id = colon == std::string::npos ? "" : word.substr(colon + 1);
    if (step.empty() || step.size() > 18 ||
        step.find_first_not_of("0123456789") != std::string::npos || id.size() != 16 ||
        id.find_first_not_of("0123456789abcdef") != std::string::npos) {
      return "'" + word.substr(0, 40) + "' is not STEP:ID (a step and 16 hex digits)";
    }
    const BranchStart branch{std::stoll(step), id};
    // A line begins at or after the one it left (a resume or rollback goes back in steps,
    // never before the line it leaves began).
    if (!lineage->empty() && branch.step < lineage->back().step) {
      return "its lines' steps go back (" + std::to_string(lineage->back().step) + ", then " +
             std::to_string(branch.step) + ")";
    }
    lineage->push_back(branch);
  }
  if (lineage->size() > kLineageKept) {
    return "it lists " + std::to_string(lineage->size()) + " lines, more than the " +
           std::to_string(kLineageKept) + " kept";
  }
  return "";
}

// The header's branch line of `checkpoint`: its lineage's last line, none for the run's
// start (older versions read such files as before) or without a lineage. The writer's and
// the reader's check alike.
namespace {
std::optional<BranchStart> header_branch(const Checkpoint& checkpoint) {
  if (checkpoint.lineage.empty() ||
      checkpoint.lineage.back() == BranchStart{0, checkpoint.run_id}) {
    return std::nullopt;
  }
  return checkpoint.lineage.back();
}
}  // namespace

OnLineage where_on_lineage(const std::optional<BranchStart>& recorded, const std::string& run_id,
                           int64_t step, const std::vector<BranchStart>& lineage,
                           int64_t last_step) {
  if (lineage.empty() || (!recorded && run_id.empty())) return OnLineage::Unknown;
  const BranchStart branch = recorded ? *recorded : BranchStart{0, run_id};
  for (size_t i = 0; i < lineage.size(); ++i) {
    if (lineage[i].id != branch.id) continue;
    if (lineage[i].step != branch.step) return OnLineage::No;
    const int64_t line_end = i + 1 < lineage.size() ? lineage[i + 1].step : last_step;
    return step >= branch.step && step <= line_end ? OnLineage::Yes : OnLineage::No;
  }
  // Not one of its lines: another branch's, unless the lineage cannot tell. Without a
  // recorded line it may be a file older than lineages, which the first line may have begun
  // from (a lineage that began at an older file starts there) or whose own run it
  // continued; with one, a line forgotten between the first and the kept ones.
  if (!recorded) return step <= lineage.front().step ? OnLineage::Unknown : OnLineage::No;
  const bool forgotten = lineage.size() >= kLineageKept && step <= lineage[1].step;
  return forgotten ? OnLineage::Unknown : OnLineage::No;
}

const std::vector<std::string>& checkpoint_root_members() {
  static const std::vector<std::string> names = {
      "params", "adam", kSpmModelDataset, kSourceSpmModelDataset, kBestValidGroup,
      kDivergenceDataset,
      kValidationPendingDataset, kValidationGroup, kQuantizedGroup};
  return names;
}

namespace {

// ---- writing ----

// The checkpoint's own datasets beside hdf5::Writer's attributes and groups.
class Writer : public hdf5::Writer {
 public:
  // The file header is the HDF5 user block (kHeaderBytes).
  explicit Writer(const std::string& path) : hdf5::Writer("checkpoint " + path, options()) {}

  static hdf5::FileOptions options() {
    hdf5::FileOptions options;
    options.user_block = kHeaderBytes;
    // The same checkpoint gives the same bytes: two runs of transformer_average or
    // transformer_quantize differed in 112 (HDF5's object times, and so the header's
    // sha256), and `sha256sum` could not tell equal averages (a helper's trial).
    options.timestamps = false;
    return options;
  }

  // A one-dimensional dataset of `count` Values (uint8 or float64) at `where` (its path,
  // for messages), named `name` in `parent`, with the sha256 of their bytes.
  template <typename Value>
  void vector_dataset(hid_t parent, const std::string& where, const std::string& name,
                      const Value* values, size_t count) const {
    const Handle dataset = this->dataset(parent, name, where, {count}, values);
    string_attribute(dataset.get(), "sha256", hdf5::values_sha256(values, count));
  }

  // A one-dimensional uint8 dataset of the root holding `bytes` (which may contain NULs).
  void bytes_dataset(hid_t root, const std::string& name, const std::string& bytes) const {
    vector_dataset(root, "/" + name, name, reinterpret_cast<const uint8_t*>(bytes.data()),
                   bytes.size());
  }

  // /best_valid/ppl, /best_valid/bleu, /best_valid/chrf and /best_valid/f1: float64 [3]
  // each, best_validation_values().
  void best_valid(hid_t root, const ValidationRecord& record) const {
    const Handle group = this->group(root, kBestValidGroup);
    for (const auto& [name, best] : {std::pair{"ppl", &record.ppl}, std::pair{"bleu", &record.bleu},
                                     std::pair{"chrf", &record.chrf}, std::pair{"f1", &record.f1}}) {
      const std::vector<double> values = best_validation_values(*best);
      vector_dataset(group.get(), std::string("/") + kBestValidGroup + "/" + name, name,
                     values.data(), values.size());
    }
  }

  // A contiguous (unchunked, uncompressed) fp32 dataset [rows, cols] with its sha256.
  // `digests` holds the sha256 of each tensor, in order, from `next_digest` on.
  void tensors(hid_t group_id, const std::string& group_path,
               const std::vector<NamedTensor>& named, const std::vector<std::string>& digests,
               size_t& next_digest) const {
    for (const NamedTensor& tensor : named) {
      show_still_working();  // a write's progress: the ranks waiting for it wait on
      const std::string where = group_path + "/" + tensor.name;
      THPC_CHECK(static_cast<int64_t>(tensor.values.size()) == tensor.rows * tensor.cols,
                 where << " holds " << tensor.values.size() << " values for shape "
                       << tensor.rows << "x" << tensor.cols);
      const Handle dataset =
          this->dataset(group_id, tensor.name, where,
                        {static_cast<hsize_t>(tensor.rows), static_cast<hsize_t>(tensor.cols)},
                        tensor.values.data());
      string_attribute(dataset.get(), "sha256", digests.at(next_digest++));
    }
  }

  // /quantized/<name>: a group with the attribute output_axis, the dataset values (int8
  // [rows, cols]) and the dataset scales (float32 [outputs]), each with its sha256 (the
  // next two of `digests`).
  void quantized_tensor(hid_t quantized, const QuantizedTensor& tensor,
                        const std::vector<std::string>& digests, size_t& next_digest) const {
    show_still_working();
    const std::string where = std::string("/") + kQuantizedGroup + "/" + tensor.name;
    const Handle group = this->group(quantized, tensor.name.c_str());
    integer_attribute(group.get(), kOutputAxisAttribute, static_cast<int64_t>(tensor.output_axis));
    const Handle values = this->dataset(
        group.get(), "values", where + "/values",
        {static_cast<hsize_t>(tensor.rows), static_cast<hsize_t>(tensor.cols)},
        tensor.values.data());
    string_attribute(values.get(), "sha256", digests.at(next_digest++));
    const Handle scales = this->dataset(group.get(), "scales", where + "/scales",
                                        {static_cast<hsize_t>(tensor.scales.size())},
                                        tensor.scales.data());
    string_attribute(scales.get(), "sha256", digests.at(next_digest++));
  }
};

// ---- reading ----

// A checkpoint's name in messages before HDF5 reads it: "checkpoint PATH: ...".
class Named {
 public:
  explicit Named(const std::string& path) : path_(path) {}
  [[noreturn]] void fail(const std::string& what) const {
    THPC_FAIL("checkpoint " << path_ << ": " << what);
  }
  std::string subject() const { return "checkpoint " + path_; }

 private:
  std::string path_;
};

// The checkpoint's own datasets beside hdf5::Reader's groups, attributes and values.
class Reader : public hdf5::Reader {
 public:
  explicit Reader(hdf5::Reader file) : hdf5::Reader(std::move(file)) {}

  using hdf5::Reader::integer_attribute;
  // An attribute of the root.
  template <typename Integer>
  Integer integer_attribute(hid_t object, const char* name) const {
    return integer_attribute<Integer>(object, "/", name);
  }

  // The values of a one-dimensional dataset of Values (Writer::vector_dataset()) named
  // `name` in `parent`, at `where`, checked against the sha256 recorded with it.
  template <typename Value>
  std::vector<Value> vector_dataset(hid_t parent, const std::string& where,
                                    const std::string& name) const {
    const Handle dataset = open_dataset(parent, name, where);
    std::vector<Value> values = this->values<Value>(dataset.get(), where, 1);
    verify_checksum(where, hdf5::values_sha256(values.data(), values.size()),
                    string_attribute(dataset.get(), where, "sha256"));
    return values;
  }

  // The bytes of a one-dimensional uint8 dataset of the root (Writer::bytes_dataset()).
  std::string bytes_dataset(hid_t root, const std::string& name) const {
    const std::vector<uint8_t> bytes = vector_dataset<uint8_t>(root, "/" + name, name);
    return std::string(bytes.begin(), bytes.end());
  }

  // The record of /best_valid (Writer::best_valid()), each value checked for what it
  // can be: a step of the run up to `step`, a count of validations. chrf and f1 are
  // absent from the checkpoints written before they were validation metrics: no value yet.
  ValidationRecord best_valid(hid_t root, int64_t step) const {
    Handle group = open_group(root, kBestValidGroup);
    ValidationRecord record;
    for (const auto& [name, best] : {std::pair{"ppl", &record.ppl}, std::pair{"bleu", &record.bleu},
                                     std::pair{"chrf", &record.chrf}, std::pair{"f1", &record.f1}}) {
      const bool later = best == &record.chrf || best == &record.f1;
      if (later && !exists(group.get(), name)) continue;
      const std::string where = std::string("/") + kBestValidGroup + "/" + name;
      const std::vector<double> values = vector_dataset<double>(group.get(), where, name);
      const auto is_count = [](double x, double most) {
        return x >= 0.0 && x <= most && x == std::floor(x);
      };
      if (values.size() != 3 || !is_count(values[1], static_cast<double>(step)) ||
          !is_count(values[2], static_cast<double>(step))) {
        fail("dataset " + where + " is not (best value, its step up to " +
             std::to_string(step) + ", validations since)");
      }
      best->value = values[0];
      best->step = static_cast<int64_t>(values[1]);
      best->validations_since = static_cast<int64_t>(values[2]);
    }
    return record;
  }

  // /divergence (divergence_values()): the step's loss and the DivergenceState, each
  // value checked for what it can be.
  std::pair<double, DivergenceState> divergence(hid_t root) const {
    const std::string where = std::string("/") + kDivergenceDataset;
    const std::vector<double> values = vector_dataset<double>(root, where, kDivergenceDataset);
    const auto is_count = [](double x) {
      return x >= 0.0 && x <= 9.0e15 && x == std::floor(x);
    };
    if (values.size() != 8 || !is_count(values[3]) || !is_count(values[4]) ||
        !is_count(values[5]) || !is_count(values[6]) || !(values[7] > 0.0 && values[7] <= 1.0)) {
      fail("dataset " + where + " is not (loss, loss average, gradient-norm average, healthy "
           "steps, skipped steps, consecutive skips, rollbacks, learning-rate factor in (0, 1])");
    }
    DivergenceState state;
    state.loss_average = values[1];
    state.grad_norm_average = values[2];
    state.healthy_steps = static_cast<int64_t>(values[3]);
    state.skipped_steps = static_cast<int64_t>(values[4]);
    state.consecutive_skips = static_cast<int64_t>(values[5]);
    state.rollbacks = static_cast<int64_t>(values[6]);
    state.lr_factor = values[7];
    return {values[0], state};
  }

  // /validation/<metric> (Writer: one float64, the score of a best checkpoint).
  ValidationScore validation(hid_t root) const {
    Handle group = open_group(root, kValidationGroup);
    const std::vector<std::string> names =
        member_names(group.get(), std::string("/") + kValidationGroup);
    const std::string where = std::string("/") + kValidationGroup;
    if (names.size() != 1 || std::find(std::begin(kValidationMetrics), std::end(kValidationMetrics),
                                       names[0]) == std::end(kValidationMetrics)) {
      fail("group " + where + " does not hold one score of ppl, bleu, chrf or f1");
    }
    const std::vector<double> values =
        vector_dataset<double>(group.get(), where + "/" + names[0], names[0]);
    if (values.size() != 1) fail("dataset " + where + "/" + names[0] + " is not one value");
    return ValidationScore{names[0], values[0]};
  }

  // Reads a dataset and the sha256 recorded with it (verified later, all at once).
  NamedTensor tensor(hid_t group, const std::string& group_path, const std::string& name,
                     std::vector<std::string>& recorded_digests) const {
    show_still_working();  // a rank's read of a large checkpoint keeps the others waiting
    const std::string where = group_path + "/" + name;
    const Handle dataset = open_dataset(group, name, where);
    std::vector<hsize_t> dims;
    NamedTensor tensor;
    tensor.name = name;
    tensor.values = values<float>(dataset.get(), where, 2, &dims);
    tensor.rows = static_cast<int64_t>(dims[0]);
    tensor.cols = static_cast<int64_t>(dims[1]);
    recorded_digests.push_back(string_attribute(dataset.get(), where, "sha256"));
    return tensor;
  }

  // /quantized/<name> (Writer::quantized_tensor), its shapes and values checked, its two
  // sha256 kept for the verification of all at once.
  QuantizedTensor quantized_tensor(hid_t quantized, const std::string& group_path,
                                   const std::string& name,
                                   std::vector<std::string>& recorded_digests) const {
    show_still_working();
    const std::string where = group_path + "/" + name;
    const Handle group = open_group(quantized, name);
    QuantizedTensor tensor;
    tensor.name = name;
    const auto axis = integer_attribute<int64_t>(group.get(), where, kOutputAxisAttribute);
    if (axis != 0 && axis != 1) {
      fail("group " + where + " has output_axis " + std::to_string(axis) + " (0 or 1)");
    }
    tensor.output_axis = static_cast<int>(axis);
    const Handle values = open_dataset(group.get(), "values", where + "/values");
    std::vector<hsize_t> dims;
    tensor.values = this->values<int8_t>(values.get(), where + "/values", 2, &dims);
    tensor.rows = static_cast<int64_t>(dims[0]);
    tensor.cols = static_cast<int64_t>(dims[1]);
    recorded_digests.push_back(string_attribute(values.get(), where + "/values", "sha256"));
    const Handle scales = open_dataset(group.get(), "scales", where + "/scales");
    tensor.scales = this->values<float>(scales.get(), where + "/scales", 1);
    recorded_digests.push_back(string_attribute(scales.get(), where + "/scales", "sha256"));
    if (static_cast<int64_t>(tensor.scales.size()) != tensor.outputs()) {
      fail("dataset " + where + "/scales holds " + std::to_string(tensor.scales.size()) +
           " scales for the " + std::to_string(tensor.outputs()) + " outputs of its " +
           std::to_string(tensor.rows) + " x " + std::to_string(tensor.cols) + " values");
    }
    for (const float scale : tensor.scales) {
      if (!(scale >= 0.0f) || !std::isfinite(scale)) {
        fail("dataset " + where + "/scales holds a scale that is negative or not finite");
      }
    }
    for (const int8_t value : tensor.values) {
      if (value == -128) fail("dataset " + where + "/values holds -128 (int8 weights are within +-127)");
    }
    return tensor;
  }
};


}  // namespace

const char* checkpoint_state_name(CheckpointState state) {
  return kCheckpointStateNames[static_cast<int>(state)];
}

std::string diverged_parameters_refusal(const Checkpoint& checkpoint, const std::string& path,
                                        const std::string& use) {
  if (checkpoint.state != CheckpointState::Diverged) return "";
  return path + " is marked diverged (its run judged its parameters diverged: a loss or "
         "gradient norm not finite or spiking, or a validation after it): " + use +
         " would give a broken model's output; take a healthy checkpoint (the newest healthy "
         "one of its directory, or best.h5)";
}

void stamp_checkpoint_header(const std::string& path) {
  // A file edited in place keeps what its header said of it.
  HeaderFields fields;
  std::string head;
  if (read_head(path, &head)) {
    const ParsedHeader parsed = parse_header(head);
    if (parsed.problem.empty()) fields = parsed.fields;
  }
  stamp_header(path, fields);
}

std::optional<CheckpointSummary> read_checkpoint_summary(const std::string& path) {
  std::string head;
  if (!read_head(path, &head)) return std::nullopt;
  const ParsedHeader parsed = parse_header(head);
  if (!parsed.problem.empty()) return std::nullopt;
  CheckpointSummary summary;
  summary.path = path;
  summary.step = parsed.fields.step.value_or(step_of_file_name(fs::path(path).filename().string()));
  summary.loss = parsed.fields.loss;
  summary.state = parsed.fields.state;
  summary.run_id = parsed.fields.run_id;
  summary.parameters_only = parsed.fields.parameters_only.value_or(false);
  summary.validation = parsed.fields.validation;
  summary.branch = parsed.fields.branch;
  return summary;
}

void mark_checkpoint(const std::string& path, CheckpointState state) {
  std::string head;
  if (!read_head(path, &head)) THPC_FAIL("checkpoint " << path << ": cannot be read");
  const ParsedHeader parsed = parse_header(head);
  if (!parsed.problem.empty()) {
    THPC_FAIL("checkpoint " << path << ": cannot mark it " << checkpoint_state_name(state)
                            << ": its file header does not parse");
  }
  HeaderFields fields = parsed.fields;
  fields.state = state;
  write_header_block(path, header_block(std::stoull(parsed.size), parsed.digest, fields),
                     std::string("mark it ") + checkpoint_state_name(state));
}

namespace {

// The HDF5 part of write_checkpoint(): the whole file at `temporary`, flushed and closed,
// its header stamped.
void write_hdf5_file(const std::string& temporary, const std::string& path,
                     const Checkpoint& checkpoint) {
  Writer writer(path);
  // A quantized checkpoint stores its int8 parameters once, in /quantized.
  const std::vector<NamedTensor>* float_params = &checkpoint.params;
  std::vector<NamedTensor> unquantized;
  if (!checkpoint.quantized.empty()) {
    std::set<std::string> quantized_names;
    for (const QuantizedTensor& tensor : checkpoint.quantized) {
      THPC_CHECK(tensor.values.size() == static_cast<size_t>(tensor.rows * tensor.cols) &&
                     (tensor.output_axis == 0 || tensor.output_axis == 1) &&
                     static_cast<int64_t>(tensor.scales.size()) == tensor.outputs(),
                 "quantized tensor " << tensor.name << " of " << tensor.values.size()
                                     << " values and " << tensor.scales.size()
                                     << " scales is not " << tensor.rows << " x " << tensor.cols);
      quantized_names.insert(tensor.name);
    }
    for (const NamedTensor& tensor : checkpoint.params) {
      if (quantized_names.count(tensor.name) == 0) unquantized.push_back(tensor);
    }
    float_params = &unquantized;
  }
  std::vector<Bytes> hashed = bytes_of({float_params, &checkpoint.adam_m, &checkpoint.adam_v});
  for (const QuantizedTensor& tensor : checkpoint.quantized) append_bytes_of(tensor, hashed);
  const std::vector<std::string> digests = sha256_of_each(hashed);
  size_t next_digest = 0;
  Handle file = writer.create_file(temporary);
  const hid_t root = file.get();
  writer.integer_attribute(root, "format_version", checkpoint.quantized.empty()
                                                       ? kCheckpointFormatVersion
                                                       : kQuantizedCheckpointFormatVersion);
  writer.integer_attribute(root, "step", checkpoint.step);
  writer.integer_attribute(root, "seed", checkpoint.seed);
  writer.integer_attribute(root, "world_size", checkpoint.world_size);
  writer.integer_attribute(root, "data_epoch", checkpoint.data_position.epoch);
  writer.integer_attribute(root, "data_index", checkpoint.data_position.index);
  writer.string_attribute(root, "architecture", checkpoint.architecture);
  writer.string_attribute(root, "config", checkpoint.config_ini);
  if (!checkpoint.spm_model.empty()) {
    writer.bytes_dataset(root, kSpmModelDataset, checkpoint.spm_model);
  }
  if (!checkpoint.source_spm_model.empty()) {
    writer.bytes_dataset(root, kSourceSpmModelDataset, checkpoint.source_spm_model);
  }
  if (checkpoint.best_valid) writer.best_valid(root, *checkpoint.best_valid);
  if (!checkpoint.run_id.empty()) {
    writer.string_attribute(root, kRunIdAttribute, checkpoint.run_id);
  }
  if (!checkpoint.corpus_sha256.empty()) {
    writer.string_attribute(root, kCorpusAttribute, checkpoint.corpus_sha256);
  }
  if (!checkpoint.direction.empty()) {
    writer.string_attribute(root, kDirectionAttribute, checkpoint.direction);
  }
  if (!checkpoint.valid_sha256.empty()) {
    writer.string_attribute(root, kValidAttribute, checkpoint.valid_sha256);
  }
  if (!checkpoint.working_directory.empty()) {
    writer.string_attribute(root, kWorkingDirectoryAttribute, checkpoint.working_directory);
  }
  if (!checkpoint.lineage.empty()) {
    writer.string_attribute(root, kLineageAttribute, lineage_text(checkpoint.lineage));
  }
  if (checkpoint.divergence) {
    const std::vector<double> values = divergence_values(checkpoint.loss, *checkpoint.divergence);
    writer.vector_dataset(root, std::string("/") + kDivergenceDataset, kDivergenceDataset,
                          values.data(), values.size());
  }
  if (checkpoint.validation_pending) {
    const double pending = 1.0;
    writer.vector_dataset(root, std::string("/") + kValidationPendingDataset,
                          kValidationPendingDataset, &pending, 1);
  }
  if (checkpoint.validation) {
    // /validation/<metric>: float64 [1], the score (its step is the file's).
    const ValidationScore& score = *checkpoint.validation;
    const Handle group = writer.group(root, kValidationGroup);
    writer.vector_dataset(group.get(), std::string("/") + kValidationGroup + "/" + score.metric,
                          score.metric, &score.value, 1);
  }
  {
    const Handle params = writer.group(root, "params");
    writer.tensors(params.get(), "/params", *float_params, digests, next_digest);
  }
  if (!checkpoint.adam_m.empty() || !checkpoint.adam_v.empty()) {
    const Handle adam = writer.group(root, "adam");
    const Handle m = writer.group(adam.get(), "m");
    writer.tensors(m.get(), "/adam/m", checkpoint.adam_m, digests, next_digest);
    const Handle v = writer.group(adam.get(), "v");
    writer.tensors(v.get(), "/adam/v", checkpoint.adam_v, digests, next_digest);
  }
  if (!checkpoint.quantized.empty()) {
    const Handle quantized = writer.group(root, kQuantizedGroup);
    for (const QuantizedTensor& tensor : checkpoint.quantized) {
      writer.quantized_tensor(quantized.get(), tensor, digests, next_digest);
    }
  }
  writer.check(H5Fflush(root, H5F_SCOPE_GLOBAL), "flush");
  writer.check(file.close(), "close");
  HeaderFields fields;
  fields.step = checkpoint.step;
  fields.loss = checkpoint.loss;
  fields.state = checkpoint.state;
  fields.run_id = checkpoint.run_id;
  fields.parameters_only = checkpoint.adam_m.empty() && checkpoint.adam_v.empty();
  fields.validation = checkpoint.validation;
  fields.branch = header_branch(checkpoint);
  stamp_header(temporary, fields);
}

}  // namespace

std::vector<float> dequantize(const QuantizedTensor& tensor) {
  std::vector<float> values(tensor.values.size());
  for (int64_t r = 0; r < tensor.rows; ++r) {
    for (int64_t c = 0; c < tensor.cols; ++c) {
      const int64_t at = r * tensor.cols + c;
      values[at] = static_cast<float>(tensor.values[at]) *
                   tensor.scales[tensor.output_axis == 1 ? c : r];
    }
  }
  return values;
}

std::string architecture_text(const ModelConfig& model, int vocab_size, int source_vocab_size) {
  std::ostringstream text;
  text << "layers=" << model.layers << " d_model=" << model.d_model << " d_ff=" << model.d_ff
       << " heads=" << model.heads << " d_k=" << model.head_dim_k()
       << " d_v=" << model.head_dim_v() << " vocab_size=" << vocab_size;
  // Only when separate: a model of one vocabulary keeps the text it always had.
  if (source_vocab_size > 0) text << " source_vocab_size=" << source_vocab_size;
  text << " positions=" << model.positions << " max_positions=" << model.max_positions
       << " attention_bias=" << (model.attention_bias ? "true" : "false")
       << " norm=" << model.norm;
  return text.str();
}

// The model.norm an architecture text records. Checkpoints written before model.norm
// existed record none and hold post-norm models, the only order there was.
std::string recorded_norm(const std::string& architecture) {
  const std::string key = " norm=";
  const size_t at = architecture.find(key);
  if (at == std::string::npos) return "post";
  const size_t begin = at + key.size();
  return architecture.substr(begin, architecture.find(' ', begin) - begin);
}

// The text with its norm stated, as architecture_text() writes it now: what is compared.
std::string with_norm_recorded(const std::string& architecture) {
  return architecture.find(" norm=") == std::string::npos ? architecture + " norm=post"
                                                          : architecture;
}


void write_checkpoint(const std::string& path, const Checkpoint& checkpoint) {
  write_atomically(path, "checkpoint " + path, [&](const std::string& temporary) {
    write_hdf5_file(temporary, path, checkpoint);
  });
}

bool lower_is_better(const std::string& metric) { return metric == "ppl"; }

namespace {

// Checks the file header (see kHeaderBytes) given the file's first bytes (`head`, up to
// 512), its size and a way to hash its bytes after the header; returns its fields when it
// verifies.
HeaderFields verify_file_header(const Named& reader, std::string_view head, uint64_t size,
                                const std::function<std::string()>& digest_after_header) {
  const ParsedHeader parsed = parse_header(head);
  if (parsed.hdf5_without_header) {
    reader.fail("an HDF5 file without a checkpoint header (a data shard of "
                "transformer_preprocess's? or written before checkpoints had one, or by another "
                "program): refused, since a damaged one could crash HDF5");
  }
  if (parsed.not_a_checkpoint) {
    reader.fail("not an HDF5 file (neither a checkpoint header nor an HDF5 signature at its "
                "start: empty, truncated to nothing, or another format)");
  }
  if (parsed.short_file) {
    reader.fail("cannot be opened, the file is truncated or damaged (" + std::to_string(size) +
                " bytes, shorter than its " + std::to_string(kHeaderBytes) + "-byte header)");
  }
  if (parsed.later_version) {
    throw CheckpointOfANewerVersion(
        reader.subject() + ": its file header holds what this version does not know (a later "
        "version's header?): " + parsed.problem + "; use the version that wrote it (if none "
        "did, the header is damaged: move the file aside)");
  }
  if (!parsed.problem.empty()) {
    reader.fail("damaged file header (" + parsed.problem + "): the file is corrupt");
  }
  if (std::stoull(parsed.size) != size) {
    reader.fail("cannot be opened, the file is truncated or damaged (its header records " +
                parsed.size + " bytes, the file has " + std::to_string(size) + ")");
  }
  const std::string actual = digest_after_header();
  if (actual != parsed.digest) {
    reader.fail("bad checksum for the file (sha256 of bytes " + std::to_string(kHeaderBytes) +
                " to " + parsed.size + " " + actual + ", recorded " + parsed.digest +
                "): the file is corrupt");
  }
  return parsed.fields;
}

// Everything read_checkpoint() checks, on a file already open.
// The file's format version, checked: true for a quantized checkpoint (format 2), which
// training cannot resume from.
bool read_format(Reader& reader, CheckpointParts parts) {
  const hid_t root = reader.root();
  const auto version = reader.integer_attribute<int64_t>(root, "format_version");
  if (version > kQuantizedCheckpointFormatVersion) {
    throw CheckpointOfANewerVersion(
        reader.subject() + ": format_version " + std::to_string(version) +
        ", written by a later version of this program (this one reads versions " +
        std::to_string(kCheckpointFormatVersion) + " and " +
        std::to_string(kQuantizedCheckpointFormatVersion) + "): use the version that wrote it");
  }
  if (version != kCheckpointFormatVersion && version != kQuantizedCheckpointFormatVersion) {
    reader.fail("format_version " + std::to_string(version) + ", this program reads versions " +
                std::to_string(kCheckpointFormatVersion) + " and " +
                std::to_string(kQuantizedCheckpointFormatVersion));
  }
  const bool quantized = version == kQuantizedCheckpointFormatVersion;
  if (quantized != reader.exists(root, kQuantizedGroup)) {
    reader.fail(quantized ? "format_version 2 (quantized) without its /quantized group"
                          : "a /quantized group in a checkpoint of format_version 1");
  }
  if (quantized && parts == CheckpointParts::All) {
    reader.fail("is a quantized checkpoint (int8 parameters for decoding, written by "
                "transformer_quantize): training cannot resume from it; resume from the "
                "checkpoint it was made from");
  }
  return quantized;
}

// For a read of every part (a resume): the file holds no part at its root that this
// version does not know, which a run resumed from it would go on without. A read of the
// parameters alone (decoding, averaging, checkpoint.init) takes what it reads whatever else
// the file holds.
void refuse_unknown_parts(Reader& reader) {
  const hid_t root = reader.root();
  std::vector<std::string> unknown;
  const auto known = [](const std::vector<std::string>& names, const std::string& name) {
    return std::find(names.begin(), names.end(), name) != names.end();
  };
  for (const std::string& name : reader.member_names(root, "/")) {
    if (!known(checkpoint_root_members(), name)) unknown.push_back("/" + name);
  }
  for (const std::string& name : reader.attribute_names(root, "/")) {
    if (!known(checkpoint_root_attributes(), name)) unknown.push_back("attribute " + name);
  }
  if (unknown.empty()) return;
  std::string listed;
  for (const std::string& part : unknown) listed += (listed.empty() ? "" : ", ") + part;
  throw CheckpointOfANewerVersion(
      reader.subject() + ": holds " + listed + ", which this version of the program does not "
      "know (the checkpoint of a later version?): a run resumed from it would go on without " +
      (unknown.size() == 1 ? "it" : "them") + "; resume with the version that wrote it, or "
      "start a new run (another checkpoint.dir) from its parameters with checkpoint.init");
}

// The run's attributes and the optional parts beside the tensors (step, seed, data
// position, architecture and settings, SentencePiece model, best and pending validation,
// run id, corpus, working directory, divergence state, a kept best's score).
void read_run_attributes(Reader& reader, Checkpoint& checkpoint) {
  const hid_t root = reader.root();
  checkpoint.step = reader.integer_attribute<int64_t>(root, "step");
  checkpoint.seed = reader.integer_attribute<uint64_t>(root, "seed");
  checkpoint.world_size = reader.integer_attribute<int64_t>(root, "world_size");
  checkpoint.data_position.epoch = reader.integer_attribute<int64_t>(root, "data_epoch");
  checkpoint.data_position.index = reader.integer_attribute<int64_t>(root, "data_index");
  checkpoint.architecture = reader.string_attribute(root, "/", "architecture");
  checkpoint.config_ini = reader.string_attribute(root, "/", "config");
  // Absent from checkpoints of runs without one and from those written before it was
  // stored: both read as "no model".
  if (reader.exists(root, kSpmModelDataset)) {
    checkpoint.spm_model = reader.bytes_dataset(root, kSpmModelDataset);
  }
  if (reader.exists(root, kSourceSpmModelDataset)) {
    checkpoint.source_spm_model = reader.bytes_dataset(root, kSourceSpmModelDataset);
  }
  // Absent from averages and from checkpoints written before it was stored.
  if (reader.exists(root, kBestValidGroup)) {
    checkpoint.best_valid = reader.best_valid(root, checkpoint.step);
  }
  if (reader.has_attribute(root, kRunIdAttribute)) {
    checkpoint.run_id = reader.string_attribute(root, "/", kRunIdAttribute);
  }
  if (reader.has_attribute(root, kCorpusAttribute)) {
    checkpoint.corpus_sha256 = reader.string_attribute(root, "/", kCorpusAttribute);
  }
  if (reader.has_attribute(root, kDirectionAttribute)) {
    checkpoint.direction = reader.string_attribute(root, "/", kDirectionAttribute);
  }
  if (reader.has_attribute(root, kValidAttribute)) {
    checkpoint.valid_sha256 = reader.string_attribute(root, "/", kValidAttribute);
  }
  if (reader.has_attribute(root, kWorkingDirectoryAttribute)) {
    checkpoint.working_directory = reader.string_attribute(root, "/", kWorkingDirectoryAttribute);
  }
  if (reader.has_attribute(root, kLineageAttribute)) {
    const std::string problem = parse_lineage(
        reader.string_attribute(root, "/", kLineageAttribute), &checkpoint.lineage);
    if (!problem.empty()) reader.fail("attribute lineage: " + problem);
  }
  if (reader.exists(root, kDivergenceDataset)) {
    std::tie(checkpoint.loss, checkpoint.divergence) = reader.divergence(root);
  }
  if (reader.exists(root, kValidationPendingDataset)) {
    const std::string where = std::string("/") + kValidationPendingDataset;
    if (reader.vector_dataset<double>(root, where, kValidationPendingDataset) !=
        std::vector<double>{1.0}) {
      reader.fail("dataset " + where + " is not [1] (the step's validation was cut short)");
    }
    checkpoint.validation_pending = true;
  }
  // Absent from every checkpoint but the best ones.
  if (reader.exists(root, kValidationGroup)) {
    checkpoint.validation = reader.validation(root);
  }
}

// The header's account of the file must be the file's: a header copied from another
// checkpoint, or damaged, would misorder, mislabel or misrank it.
void check_header_is_the_files(Reader& reader, const HeaderFields& header,
                               const Checkpoint& checkpoint) {
  const auto same_score = [](const std::optional<ValidationScore>& a,
                             const std::optional<ValidationScore>& b) {
    if (!a || !b) return !a && !b;
    // NaN never equals itself: a kept score is finite, a NaN one matches a NaN one.
    return a->metric == b->metric &&
           (a->value == b->value || (std::isnan(a->value) && std::isnan(b->value)));
  };
  if ((header.step && *header.step != checkpoint.step) ||
      (!header.run_id.empty() && header.run_id != checkpoint.run_id)) {
    reader.fail("damaged file header (its step or run is not the file's): the file is corrupt");
  }
  if (!(header.branch == header_branch(checkpoint))) {
    reader.fail("damaged file header (its branch is not the file's lineage's last): the file "
                "is corrupt");
  }
  if (!same_score(header.validation, checkpoint.validation)) {
    reader.fail("damaged file header (its validation score is not the file's): the file is "
                "corrupt");
  }
}

// The parameters (float, and int8 with their scales in a quantized checkpoint) and, for
// CheckpointParts::All, the Adam moments, one per parameter and of its shape; each
// dataset's recorded sha256 and path in `recorded_digests` and `dataset_paths`, in the
// order read_open_checkpoint hashes the values (a quantized checkpoint has no moments).
void read_tensors(Reader& reader, CheckpointParts parts, bool quantized, Checkpoint& checkpoint,
                  std::vector<std::string>& recorded_digests,
                  std::vector<std::string>& dataset_paths) {
  const hid_t root = reader.root();
  Handle params = reader.open_group(root, "params");
  const std::vector<std::string> names = reader.member_names(params.get(), "/params");
  for (const std::string& name : names) {
    checkpoint.params.push_back(reader.tensor(params.get(), "/params", name, recorded_digests));
    dataset_paths.push_back("/params/" + name);
  }
  if (quantized) {
    Handle group = reader.open_group(root, kQuantizedGroup);
    const std::string group_path = std::string("/") + kQuantizedGroup;
    for (const std::string& name : reader.member_names(group.get(), group_path)) {
      if (std::find(names.begin(), names.end(), name) != names.end()) {
        reader.fail("parameter " + name + " is in both /params and " + group_path);
      }
      checkpoint.quantized.push_back(
          reader.quantized_tensor(group.get(), group_path, name, recorded_digests));
      dataset_paths.push_back(group_path + "/" + name + "/values");
      dataset_paths.push_back(group_path + "/" + name + "/scales");
    }
  }
  if (checkpoint.params.empty() && checkpoint.quantized.empty()) {
    reader.fail("/params holds no datasets");
  }
  if (parts == CheckpointParts::All) {
    if (!reader.exists(root, "adam")) {
      reader.fail("holds parameters only (no /adam group: an average?); resuming needs the "
                  "Adam moments, checkpoint.init starts from parameters only");
    }
    Handle adam = reader.open_group(root, "adam");
    Handle m = reader.open_group(adam.get(), "m");
    Handle v = reader.open_group(adam.get(), "v");
    // A moment for each parameter, of its shape; extra moments mean a different model.
    for (const auto& [group, group_path, into] :
         {std::tuple{m.get(), "/adam/m", &checkpoint.adam_m},
          std::tuple{v.get(), "/adam/v", &checkpoint.adam_v}}) {
      if (reader.member_names(group, group_path).size() != names.size()) {
        reader.fail(std::string(group_path) + " does not hold one moment per parameter");
      }
      for (const NamedTensor& param : checkpoint.params) {
        into->push_back(reader.tensor(group, group_path, param.name, recorded_digests));
        dataset_paths.push_back(std::string(group_path) + "/" + param.name);
        if (into->back().rows != param.rows || into->back().cols != param.cols) {
          reader.fail("dataset " + std::string(group_path) + "/" + param.name +
                      " is not shaped like its parameter");
        }
      }
    }
  }
}

Checkpoint read_open_checkpoint(Reader reader, CheckpointParts parts,
                                const HeaderFields& header) {
  const bool quantized = read_format(reader, parts);
  if (parts == CheckpointParts::All) refuse_unknown_parts(reader);
  Checkpoint checkpoint;
  read_run_attributes(reader, checkpoint);
  check_header_is_the_files(reader, header, checkpoint);
  checkpoint.state = header.state;
  std::vector<std::string> recorded_digests, dataset_paths;
  read_tensors(reader, parts, quantized, checkpoint, recorded_digests, dataset_paths);
  reader.close();
  std::vector<Bytes> hashed = bytes_of({&checkpoint.params, &checkpoint.adam_m, &checkpoint.adam_v});
  for (const QuantizedTensor& tensor : checkpoint.quantized) append_bytes_of(tensor, hashed);
  const std::vector<std::string> digests = sha256_of_each(hashed);
  for (size_t i = 0; i < digests.size(); ++i) {
    reader.verify_checksum(dataset_paths[i], digests[i], recorded_digests[i]);
  }
  // Verified: each int8 parameter among the others, as its fp32 value, in name order as
  // a float checkpoint's (HDF5 lists members alphabetically).
  if (!checkpoint.quantized.empty()) {
    for (const QuantizedTensor& tensor : checkpoint.quantized) {
      NamedTensor dequantized;
      dequantized.name = tensor.name;
      dequantized.rows = tensor.rows;
      dequantized.cols = tensor.cols;
      dequantized.values = dequantize(tensor);
      checkpoint.params.push_back(std::move(dequantized));
    }
    std::sort(checkpoint.params.begin(), checkpoint.params.end(),
              [](const NamedTensor& a, const NamedTensor& b) { return a.name < b.name; });
  }
  return checkpoint;
}

}  // namespace

namespace {

// Which file `path` names now, and as written when: a checkpoint replaced by a rename
// (another inode), rewritten in place (its header marked: another time), or removed.
struct FileIdentity {
  bool exists = false;
  dev_t device = 0;
  ino_t inode = 0;
  off_t size = 0;
  timespec modified{};
  static FileIdentity of(const std::string& path) {
    struct stat status {};
    if (::stat(path.c_str(), &status) != 0) return FileIdentity{};
    return of(status);
  }
  static FileIdentity of(const struct stat& status) {
    FileIdentity identity;
    identity.exists = true;
    identity.device = status.st_dev;
    identity.inode = status.st_ino;
    identity.size = status.st_size;
    identity.modified = status.st_mtim;
    return identity;
  }
  bool operator==(const FileIdentity& other) const {
    return exists == other.exists && device == other.device && inode == other.inode &&
           size == other.size && modified.tv_sec == other.modified.tv_sec &&
           modified.tv_nsec == other.modified.tv_nsec;
  }
};

Checkpoint read_checkpoint_unguarded(const std::string& path, CheckpointParts parts);

}  // namespace

// A read that failed because a trainer replaced, marked or pruned the file meanwhile says
// so: its header and datasets are read through several opens, and one that met another
// file (or none) said "corrupt" or "not an HDF5 file" of a good checkpoint (a helper's
// trial: 7 of 15 averages of a live run's last 3, 1 of 12 --eval of its best.h5).
Checkpoint read_checkpoint(const std::string& path, CheckpointParts parts) {
  // Held open through the read, so that no file made meanwhile can get its inode number
  // (a removed file's number is given to the next one made), and compared by it.
  struct HeldOpen {
    int fd = -1;
    ~HeldOpen() {
      if (fd >= 0) ::close(fd);
    }
  } held{::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK)};  // a FIFO: no wait
  struct stat status {};
  if (held.fd < 0 || ::fstat(held.fd, &status) != 0) {
    const int error = errno;
    // (Not read on: a file made meanwhile would be read through opens of two files.)
    Named(path).fail(error == ENOENT ? std::string("no such file") : std::strerror(error));
  }
  const FileIdentity before = FileIdentity::of(status);
  try {
    return read_checkpoint_unguarded(path, parts);
  } catch (const Error&) {
    const FileIdentity after = FileIdentity::of(path);
    if (!(after == before)) {
      Named(path).fail(std::string(after.exists ? "it changed" : "it was removed") +
                       " while it was read (a trainer writing, marking or pruning checkpoints "
                       "there?): read it again" +
                       (after.exists ? "" : ", or a newer one"));
    }
    throw;
  }
}

namespace {

// For a run directory given where a checkpoint file is asked for (fairseq's tools take a
// file too, but a user may expect a directory's newest): ": give one of its files, e.g.
// DIR/step_N.h5 (its newest healthy step)", or "" when it holds no healthy step file (a
// diverged one would be refused next; a review's finding).
std::string newest_step_file_text(const std::string& dir) {
  std::error_code error;
  std::vector<std::pair<int64_t, std::string>> steps;
  for (const fs::directory_entry& entry : fs::directory_iterator(dir, error)) {
    const int64_t step = step_of_file_name(entry.path().filename().string());
    if (step >= 0) steps.emplace_back(step, entry.path().string());
  }
  std::sort(steps.rbegin(), steps.rend());
  for (const auto& [step, path] : steps) {
    const std::optional<CheckpointSummary> summary = read_checkpoint_summary(path);
    if (summary && summary->state == CheckpointState::Healthy) {
      return ": give one of its files, e.g. " + path + " (its newest healthy step)";
    }
  }
  return "";
}

Checkpoint read_checkpoint_unguarded(const std::string& path, CheckpointParts parts) {
  const Named reader(path);
  std::error_code error;
  if (!fs::is_regular_file(path, error)) {
    // A checkpoint is read by size and offsets: a pipe or device is not one (before, a
    // FIFO or /dev/null that exists read "no such file").
    reader.fail(fs::is_directory(path, error) ? "a directory, not a checkpoint file" +
                                                    newest_step_file_text(path)
                : fs::exists(path, error)     ? "not a regular file, so not a checkpoint file"
                                              : "no such file");
  }
  const uint64_t size = fs::file_size(path, error);
  if (error) reader.fail("cannot read its size (" + error.message() + ")");
  std::string head(std::min<uint64_t>(size, kHeaderBytes), '\0');
  std::ifstream in(path, std::ios::binary);
  if (!in.read(head.data(), static_cast<std::streamsize>(head.size()))) {
    reader.fail("cannot be read");
  }
  const HeaderFields header = verify_file_header(
      reader, head, size, [&] { return sha256_hex_of_file(path, kHeaderBytes); });
  if (!hdf5::is_hdf5(path)) {
    reader.fail("not an HDF5 file (no HDF5 signature: empty, truncated to nothing, or another "
                "format)");
  }
  return read_open_checkpoint(Reader(hdf5::Reader::open("checkpoint " + path, path)), parts,
                              header);
}

}  // namespace

Checkpoint read_checkpoint_image(const std::string& name, std::string_view image,
                                 CheckpointParts parts) {
  const Named reader(name);
  if (image.empty()) reader.fail("not an HDF5 file (empty)");
  const HeaderFields header =
      verify_file_header(reader, image.substr(0, kHeaderBytes), image.size(), [&] {
        return sha256_hex(image.data() + kHeaderBytes, image.size() - kHeaderBytes);
      });
  return read_open_checkpoint(
      Reader(hdf5::Reader::open_image("checkpoint " + name, name, image)), parts, header);
}

namespace {

// The fields of an architecture text ("layers=2 d_model=64 ..."), in their order.
std::vector<std::pair<std::string, std::string>> architecture_fields(const std::string& text) {
  std::vector<std::pair<std::string, std::string>> fields;
  std::istringstream words(text);
  std::string word;
  while (words >> word) {
    const size_t equals = word.find('=');
    if (equals != std::string::npos) {
      fields.emplace_back(word.substr(0, equals), word.substr(equals + 1));
    }
  }
  return fields;
}

}  // namespace

// (The two whole texts, which this replaced, left the user to find the difference.)
std::string OneDirection::add(const std::string& path, const std::string& direction) {
  if (direction.empty() || direction == direction_) return "";
  if (direction_.empty()) {
    direction_ = direction;
    path_ = path;
    return "";
  }
  return path_ + " was trained " + direction_ + ", " + path + " " + direction;
}

std::string architecture_differences(const std::string& first, const std::string& first_name,
                                     const std::string& second, const std::string& second_name) {
  const auto first_fields = architecture_fields(first);
  const auto second_fields = architecture_fields(second);
  const auto setting = [](const std::string& key) {
    return key == "vocab_size"          ? "the vocabulary (the shards', or model.vocab_size)"
           : key == "source_vocab_size" ? "the source vocabulary (the shards')"
                                        : "model." + key;
  };
  std::ostringstream out;
  for (const auto& [key, second_value] : second_fields) {
    std::string first_value = "absent";
    for (const auto& [first_key, value] : first_fields) {
      if (first_key == key) first_value = value;
    }
    if (first_value == second_value) continue;
    out << (out.tellp() > 0 ? "; " : "") << setting(key) << " is " << first_value << " in "
        << first_name << " and " << second_value << " in " << second_name
        // Derived unless set: a d_model changed alone changes them too (a helper took the
        // advice to give the file's values for keys never set).
        << (key == "d_k" || key == "d_v" ? " (d_model / heads, unless set)" : "");
  }
  // A field the first records and the second does not (a key written by a later version,
  // or only when it is not its default) is a difference too: walked from the second's
  // fields alone, it fell to the two whole texts below (a helper's trial).
  // Not a structured binding: C++17 lets no lambda capture one (clang refuses; CI's fuzz
  // build compiles with clang).
  for (const auto& first_field : first_fields) {
    const std::string& key = first_field.first;
    const std::string& first_value = first_field.second;
    const bool in_second = std::any_of(second_fields.begin(), second_fields.end(),
                                       [&](const auto& field) { return field.first == key; });
    if (in_second) continue;
    out << (out.tellp() > 0 ? "; " : "") << setting(key) << " is " << first_value << " in "
        << first_name << " and absent in " << second_name;
  }
  if (out.tellp() == 0) {
    return first_name + " has '" + first + "', " + second_name + " '" + second + "'";
  }
  return out.str();
}

Checkpoint derived_checkpoint_of(const Checkpoint& source) {
  // One name for each field of Checkpoint, in its order: a structured binding must name
  // them all, so a field added there stops the build here until it is sorted below.
  const auto& [step, seed, world_size, data_position, architecture, config_ini, spm_model,
               source_spm_model, direction, params, adam_m, adam_v, best_valid, run_id, lineage,
               working_directory, corpus_sha256, valid_sha256, loss, state, divergence,
               validation, validation_pending, quantized] = source;
  Checkpoint derived;
  derived.step = step;
  derived.seed = seed;
  derived.world_size = world_size;
  derived.data_position = data_position;
  derived.architecture = architecture;
  derived.config_ini = config_ini;
  derived.spm_model = spm_model;
  derived.source_spm_model = source_spm_model;
  derived.direction = direction;
  // The caller's to make: the parameters and their int8 copies.
  static_cast<void>(params), static_cast<void>(quantized);
  // The run's state at `step`, left at "none" (Checkpoint's defaults).
  static_cast<void>(adam_m), static_cast<void>(adam_v), static_cast<void>(best_valid);
  static_cast<void>(run_id), static_cast<void>(lineage), static_cast<void>(working_directory);
  static_cast<void>(corpus_sha256), static_cast<void>(valid_sha256);
  static_cast<void>(loss), static_cast<void>(state), static_cast<void>(divergence);
  static_cast<void>(validation), static_cast<void>(validation_pending);
  return derived;
}

int64_t embedding_rows(const Checkpoint& checkpoint) {
  for (const NamedTensor& tensor : checkpoint.params) {
    if (tensor.name == "embed.weight") return tensor.rows;
  }
  return -1;
}

int64_t source_embedding_rows(const Checkpoint& checkpoint) {
  for (const NamedTensor& tensor : checkpoint.params) {
    // (model/transformer.h's kSourceEmbeddingName, as embed.weight is named above)
    if (tensor.name == "src_embed.weight") return tensor.rows;
  }
  return 0;
}

void check_architecture(const Checkpoint& checkpoint, const std::string& expected,
                        const std::string& source) {
  // The one difference a config edit makes without touching a shape: named on its own.
  const std::string file_norm = recorded_norm(checkpoint.architecture);
  const std::string model_norm = recorded_norm(expected);
  if (file_norm != model_norm) {
    THPC_FAIL("checkpoint " << source << " holds a model.norm = " << file_norm
                            << " model, the configuration has model.norm = " << model_norm
                            << ": set model.norm = " << file_norm
                            << " to use it (the layer norms sit elsewhere in the other order)");
  }
  const std::string recorded = with_norm_recorded(checkpoint.architecture);
  if (recorded != expected) {
    THPC_FAIL("checkpoint " << source << ": architecture mismatch: "
                            << architecture_differences(recorded, "the file", expected,
                                                        "the configuration")
                            << "; to use this checkpoint, give the configuration the file's "
                               "values");
  }
}

}  // namespace thpc
