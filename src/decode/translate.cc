#include "decode/translate.h"

#include <sentencepiece_processor.h>

#include <algorithm>
#include <cstdint>
#include <optional>

#include "common/error.h"
#include "decode/ensemble.h"

namespace thpc {

std::vector<DecodeBatch> batches_by_length(const std::vector<size_t>& lengths, int batch_tokens,
                                           int workers, int batch_sentences,
                                           int cut_at_length_after) {
  std::vector<size_t> order;
  int64_t total_tokens = 0;
  for (size_t i = 0; i < lengths.size(); ++i) {
    if (lengths[i] == 0) continue;  // nothing to batch
    order.push_back(i);
    total_tokens += static_cast<int64_t>(lengths[i]);
  }
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return lengths[a] > lengths[b]; });
  int64_t budget = batch_tokens;
  if (workers > 1) budget = std::min<int64_t>(budget, (total_tokens + 2 * workers - 1) / (2 * workers));
  std::vector<DecodeBatch> batches;
  size_t next = 0;
  while (next < order.size()) {
    DecodeBatch batch;
    // The items come longest first: the first one's length is the batch's.
    const size_t longest = lengths[order[next]];
    while (next < order.size()) {
      const int64_t padded = static_cast<int64_t>(longest * batch.members.size());
      if (!batch.members.empty() &&
          (padded + static_cast<int64_t>(longest) > budget ||
           (batch_sentences > 0 && static_cast<int>(batch.members.size()) >= batch_sentences) ||
           (cut_at_length_after > 0 && lengths[order[next]] < longest &&
            padded >= cut_at_length_after))) {
        break;
      }
      batch.members.push_back(order[next++]);
    }
    batches.push_back(std::move(batch));
  }
  return batches;
}

std::vector<DecodeBatch> make_decode_batches(const std::vector<TokenSequence>& sources,
                                             const BeamOptions& options, int batch_tokens,
                                             int workers, int batch_sentences) {
  std::vector<size_t> lengths(sources.size(), 0);  // an empty line: nothing to translate
  for (size_t i = 0; i < sources.size(); ++i) {
    if (!sources[i].empty()) lengths[i] = sources[i].size() + 1;
  }
  std::vector<DecodeBatch> batches =
      batches_by_length(lengths, batch_tokens, workers, batch_sentences);
  for (DecodeBatch& batch : batches) {
    for (const size_t i : batch.members) {
      batch.max_output = std::max(batch.max_output,
                                  beam_detail::output_length_limit(sources[i].size(), options));
    }
  }
  return batches;
}

void translate_batch(Transformer& model, const SpecialIds& ids,
                     const std::vector<TokenSequence>& sources, const DecodeBatch& batch,
                     const BeamOptions& options,
                     std::vector<std::vector<Hypothesis>>& results) {
  translate_batch({&model}, {}, ids, sources, batch, options, nullptr, results);
}

void translate_batch(const std::vector<Transformer*>& models, const std::vector<float>& weights,
                     const SpecialIds& ids, const std::vector<TokenSequence>& sources,
                     const DecodeBatch& batch, const BeamOptions& options,
                     const SamplingOptions* sampling,
                     std::vector<std::vector<Hypothesis>>& results) {
  std::vector<TokenSequence> batch_sources;
  for (size_t i : batch.members) batch_sources.push_back(sources[i]);
  // One model keeps its own scorer (nothing combined); an ensemble of one would give the
  // same scores (EnsembleScorer: 0 + 1 * log p is exact).
  std::optional<CachedTransformerScorer> single;
  std::optional<EnsembleScorer> ensemble;
  NextTokenScorer* scorer = nullptr;
  if (models.size() == 1) {
    scorer = &single.emplace(*models[0], ids, batch.max_output);
  } else {
    scorer = &ensemble.emplace(models, weights, ids, batch.max_output);
  }
  // The filter answers for all sentences; the search numbers the batch's members.
  class MemberFilter final : public NextTokenFilter {
   public:
    MemberFilter(const NextTokenFilter& all, const std::vector<size_t>& members)
        : all_(all), members_(members) {}
    void allowed_next(int source, const TokenSequence& prefix, int max_len,
                      std::vector<char>& allowed) const override {
      all_.allowed_next(static_cast<int>(members_.at(source)), prefix, max_len, allowed);
    }
    void rescore(int source, const TokenSequence& prefix, float* log_probs) const override {
      all_.rescore(static_cast<int>(members_.at(source)), prefix, log_probs);
    }

   private:
    const NextTokenFilter& all_;
    const std::vector<size_t>& members_;
  };
  BeamOptions batch_options = options;
  std::optional<MemberFilter> member_filter;
  if (options.filter != nullptr) {
    member_filter.emplace(*options.filter, batch.members);
    batch_options.filter = &*member_filter;
  }
  std::vector<std::vector<Hypothesis>> found;
  if (sampling != nullptr) {
    THPC_CHECK(options.filter == nullptr, "sampling with a token filter");
    // A sentence's draws are numbered by its index in the whole input, not in the batch.
    std::vector<uint32_t> sentence_ids;
    for (const size_t member : batch.members) {
      sentence_ids.push_back(static_cast<uint32_t>(batch.sentence_offset + member));
    }
    found = sample_search(*scorer, batch_sources, sentence_ids, ids, batch_options, *sampling);
  } else {
    found = beam_search(*scorer, batch_sources, ids, batch_options);
  }
  for (size_t k = 0; k < batch.members.size(); ++k) results[batch.members[k]] = found[k];
}

BeamOptions configured_beam_options(const DecodeConfig& decode, int max_positions,
                                    const SearchOverrides& overrides) {
  BeamOptions options;
  options.beam = overrides.greedy ? 1 : overrides.beam.value_or(decode.beam);
  options.alpha = overrides.greedy ? 0.0f : overrides.alpha.value_or(decode.alpha);
  options.max_len_a = overrides.max_len_a.value_or(decode.max_len_a);
  options.max_len_b = overrides.max_len_b.value_or(decode.max_len_b);
  // The position table holds bos and the output: one position less than its size.
  options.max_len_cap = max_positions - 1;
  options.nbest = std::min(overrides.nbest, options.beam);
  return options;
}

std::string detokenize(const sentencepiece::SentencePieceProcessor& spm,
                       const TokenSequence& tokens) {
  std::string text;
  spm.Decode(std::vector<int>(tokens.begin(), tokens.end()), &text);
  std::replace_if(
      text.begin(), text.end(), [](char c) { return c == '\n' || c == '\r' || c == '\0'; },
      ' ');
  return text;
}

}  // namespace thpc
