#include "decode/ensemble.h"

#include <sentencepiece_processor.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <optional>
#include <sstream>
#include <utility>

#include "common/error.h"
#include "data/sentencepiece_vocabulary.h"
#include "model/checkpoint_params.h"

namespace thpc {

using model_detail::ensure_capacity;
using model_detail::ensure_id_capacity;
using model_detail::ensure_ids;

namespace {

// The rows of the checkpoint's embedding: its vocabulary.
int vocabulary_size(const Checkpoint& checkpoint, const std::string& path) {
  const int64_t rows = embedding_rows(checkpoint);
  if (rows < 0) THPC_FAIL(path << ": no embed.weight dataset");
  return static_cast<int>(rows);
}

}  // namespace

EnsembleScorer::EnsembleScorer(const std::vector<Transformer*>& models,
                               const std::vector<float>& weights, const SpecialIds& ids,
                               int max_len)
    : backend_(models.at(0)->backend()),
      weights_(ensemble_weights(models.size(), std::vector<double>(weights.begin(),
                                                                    weights.end()))),
      ids_(ids),
      vocab_(models.at(0)->vocab_size()) {
  members_.reserve(models.size());
  for (Transformer* model : models) {
    THPC_CHECK(&model->backend() == &backend_, "the models of an ensemble share one backend");
    THPC_CHECK(model->vocab_size() == vocab_, "an ensemble of vocabularies "
                                                  << vocab_ << " and " << model->vocab_size());
    members_.emplace_back(*model, ids, max_len);
  }
}

EnsembleScorer::~EnsembleScorer() {
  for (Tensor* t : {&combined_, &ranked_input_, &best_values_}) {
    if (*t) backend_.free(*t);
  }
  backend_.free_ids(each_row_.ids);
  backend_.free_ids(best_columns_.ids);
}

void EnsembleScorer::start(const std::vector<TokenSequence>& sources) {
  for (CachedTransformerScorer& member : members_) member.start(sources);
}

void EnsembleScorer::combine(const BeamStep& step) {
  const int H = step.size();
  const int64_t count = int64_t(H) * vocab_;
  ensure_capacity(backend_, combined_, backend_.param_dtype(), count, false);
  const Tensor sum = combined_.slice(0, count);
  backend_.zero(sum);
  // 0..H-1 are the first H of any longer 0..N-1: uploaded only when H exceeds them, not
  // again as sentences finish and H falls.
  if (static_cast<int>(each_row_host_.size()) < H) {
    each_row_host_.resize(H);
    std::iota(each_row_host_.begin(), each_row_host_.end(), 0);
    ensure_ids(backend_, each_row_, each_row_host_);
  }
  for (size_t i = 0; i < members_.size(); ++i) {
    // Model i's log-probabilities, [H, vocab], row h hypothesis h's.
    const Tensor rows = members_[i].step_on_backend(step);
    // sum[h, :] += w_i * rows[h, :]. embedding_backward is this scaled add of rows
    // (d_table[tokens[r]] += scale * d_out[r], d_table in fp32, the rows in the
    // activations' dtype, each element one fp32 multiply and add, in model order, on
    // either backend) with the "tokens" 0..H-1. Cost per model and step: one read of its
    // [H, vocab] and a read-modify-write of the fp32 sum, next to a decoder step that
    // reads every weight; no new kernel.
    backend_.embedding_backward(sum, Tensor{}, rows, each_row_.ids, /*rows=*/H,
                                /*length=*/1, /*d=*/vocab_, /*vocab=*/H, weights_[i]);
  }
}

void EnsembleScorer::step(const BeamStep& step, std::vector<float>& log_probs) {
  combine(step);
  // combined_ and best_values_ are fp32 (param_dtype): nothing to widen.
  model_detail::download_as_f32(backend_, combined_, int64_t(step.size()) * vocab_, log_probs,
                                nullptr);
}

bool EnsembleScorer::step_best(const BeamStep& step, int count, std::vector<float>& values,
                               std::vector<int32_t>& tokens) {
  combine(step);
  const int H = step.size();
  const int64_t cells = int64_t(H) * vocab_;
  // row_top_k reads the activations' dtype: on a bf16 GPU the sum is rounded to bf16
  // first, as each model's own log-probabilities are.
  Tensor ranked = combined_.slice(0, cells);
  if (backend_.compute_dtype() != backend_.param_dtype()) {
    ensure_capacity(backend_, ranked_input_, backend_.compute_dtype(), cells, false);
    ranked = ranked_input_.slice(0, cells);
    backend_.copy(ranked, combined_.slice(0, cells));
  }
  const int64_t best = int64_t(H) * count;
  ensure_capacity(backend_, best_values_, backend_.param_dtype(), best, false);
  ensure_id_capacity(backend_, best_columns_, best);
  backend_.row_top_k(best_values_.slice(0, best), best_columns_.ids, ranked, H, vocab_, count,
                     ids_.pad, ids_.bos);
  model_detail::download_as_f32(backend_, best_values_, best, values, nullptr);
  tokens.resize(static_cast<size_t>(best));
  backend_.download_ids(tokens.data(), best_columns_.ids, best);
  return true;
}

std::vector<float> ensemble_weights(size_t models, const std::vector<double>& given) {
  THPC_CHECK(models >= 1, "an ensemble of no models");
  if (given.empty()) return std::vector<float>(models, static_cast<float>(1.0 / double(models)));
  if (given.size() != models) {
    THPC_FAIL("--weights: " << given.size() << " weights for " << models
                            << " checkpoints (one per --checkpoint, in order)");
  }
  double largest = 0;
  for (const double w : given) {
    if (!std::isfinite(w) || !(w > 0)) {
      THPC_FAIL("--weights: " << w << " is not a weight (each must be a finite number > 0)");
    }
    largest = std::max(largest, w);
  }
  // In double, each divided by the largest first: their sum then cannot overflow (1e308
  // twice was "inf", and every weight 0), and a weight as small as 1e-300 stays itself.
  double total = 0;
  for (const double w : given) total += w / largest;
  std::vector<float> weights;
  for (const double w : given) {
    weights.push_back(static_cast<float>(w / largest / total));
    if (!(weights.back() > 0)) {
      THPC_FAIL("--weights: " << w << " is too small beside the largest, " << largest
                              << ", to count (its share of their sum is 0 in float): "
                              << "leave its checkpoint out, or give it a larger weight");
    }
  }
  return weights;
}

DecodingCheckpoints read_decoding_checkpoints(const std::vector<std::string>& paths) {
  THPC_CHECK(!paths.empty(), "no checkpoint to decode with");
  DecodingCheckpoints read;
  read.paths = paths;
  for (const std::string& path : paths) {
    read.checkpoints.push_back(read_checkpoint(path, CheckpointParts::ParamsOnly));
    const Checkpoint& checkpoint = read.checkpoints.back();
    // The run configuration stored in the checkpoint, parsed by the same option table.
    Config stored = load_config_text(checkpoint.config_ini, path + " (stored configuration)");
    read.models.push_back(stored.model);
    if (read.checkpoints.size() == 1) {
      read.config = std::move(stored);
      read.max_positions = read.config.model.max_positions;
    }
    read.max_positions = std::min(read.max_positions, read.models.back().max_positions);
  }
  read.vocab_size = vocabulary_size(read.checkpoints.front(), paths.front());
  read.source_vocab_size = static_cast<int>(source_embedding_rows(read.checkpoints.front()));
  return read;
}

std::string DecodingCheckpoints::max_positions_said() const {
  std::string said = "model.max_positions = " + std::to_string(max_positions);
  const bool all_alike = std::all_of(models.begin(), models.end(), [&](const ModelConfig& m) {
    return m.max_positions == max_positions;
  });
  if (all_alike) return said;
  for (size_t m = 0; m < models.size(); ++m) {
    if (models[m].max_positions == max_positions) {
      return said + " of " + paths[m] + ", the smallest of the ensemble's";
    }
  }
  return said;
}

std::vector<std::unique_ptr<Transformer>> DecodingCheckpoints::build_models(
    const SpecialIds& ids, Backend& backend) const {
  std::vector<std::unique_ptr<Transformer>> built;
  for (size_t m = 0; m < checkpoints.size(); ++m) {
    const VocabularySizes sizes{
        vocabulary_size(checkpoints[m], paths[m]),
        static_cast<int>(source_embedding_rows(checkpoints[m]))};
    built.push_back(std::make_unique<Transformer>(models[m], sizes, ids, backend,
                                                  /*init_seed=*/std::nullopt,
                                                  Transformer::ModelUse::kInference));
    load_parameters(checkpoints[m], paths[m], *built.back());
  }
  return built;
}

std::string ensemble_vocabulary_mismatch(const DecodingCheckpoints& members,
                                         bool spm_model_given) {
  const std::string& first_path = members.paths.at(0);
  const Checkpoint& first = members.checkpoints.at(0);
  const std::string vocabulary = ": the models of an ensemble must share one vocabulary";
  // One vocabulary serves both directions: an en->de model beside a de->en one decoded
  // garbage, exit 0 (a helper's trial). Those that record none (older files) fit any.
  OneDirection direction;
  for (size_t i = 0; i < members.checkpoints.size(); ++i) {
    const std::string other = direction.add(members.paths[i], members.checkpoints[i].direction);
    if (!other.empty()) return other + ": the models of an ensemble must translate one direction";
  }
  for (size_t i = 1; i < members.checkpoints.size(); ++i) {
    const std::string& other_path = members.paths[i];
    const Checkpoint& other = members.checkpoints[i];
    const int other_size = vocabulary_size(other, other_path);
    const int other_source_size = static_cast<int>(source_embedding_rows(other));
    std::ostringstream why;
    if (other_size != members.vocab_size) {
      why << first_path << " has a vocabulary of " << members.vocab_size << " tokens, "
          << other_path << " of " << other_size << vocabulary;
    } else if (other_source_size != members.source_vocab_size) {
      const auto said = [](int size) {
        return size > 0 ? "a source vocabulary of " + std::to_string(size) + " tokens"
                        : std::string("one vocabulary for both sides");
      };
      why << first_path << " has " << said(members.source_vocab_size) << ", " << other_path
          << " " << said(other_source_size) << vocabulary;
    } else if (first.source_spm_model != other.source_spm_model &&
               !sentencepiece_vocabulary_difference(first.source_spm_model, first_path,
                                                    other.source_spm_model, other_path)
                    .empty()) {
      why << first_path << " and " << other_path << " store different source SentencePiece "
          << "models ("
          << sentencepiece_vocabulary_difference(first.source_spm_model, first_path,
                                                 other.source_spm_model, other_path)
          << ")" << vocabulary;
    } else if (!first.spm_model.empty() && !other.spm_model.empty()) {
      const std::string difference = sentencepiece_vocabulary_difference(
          first.spm_model, first_path, other.spm_model, other_path);
      if (difference.empty()) continue;
      why << first_path << " and " << other_path << " store different SentencePiece models ("
          << difference << ")" << vocabulary;
    } else if (first.spm_model.empty() != other.spm_model.empty() && !spm_model_given) {
      const bool first_stores = !first.spm_model.empty();
      why << (first_stores ? first_path : other_path) << " stores its SentencePiece model, "
          << (first_stores ? other_path : first_path)
          << " does not: give --spm-model FILE, the vocabulary both were trained with";
    } else {
      continue;
    }
    return why.str();
  }
  return "";
}

}  // namespace thpc
