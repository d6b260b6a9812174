#include "metrics/multi_bleu.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "common/error.h"
#include "metrics/bleu.h"

namespace thpc::metrics {
namespace {

constexpr int kOrders = 4;  // multi-bleu.perl's loops run n = 1..4

// multi-bleu.perl's my_log: log(0) is a large negative number, not -inf.
double my_log(double value) { return value == 0.0 ? -9999999999.0 : std::log(value); }

// multi-bleu.perl's closest reference length: the search starts from (diff, length) =
// (9999, 9999), takes a strictly closer reference, and on a tie the shorter one.
int64_t closest_reference_length(int64_t hyp_len, const std::vector<int64_t>& ref_lens) {
  int64_t closest_diff = 9999;
  int64_t closest_length = 9999;
  for (int64_t length : ref_lens) {
    const int64_t diff = std::llabs(hyp_len - length);
    if (diff < closest_diff) {
      closest_diff = diff;
      closest_length = length;
    } else if (diff == closest_diff && length < closest_length) {
      closest_length = length;
    }
  }
  return closest_length;
}

}  // namespace

std::string MultiBleuScore::line() const {
  // ratio = hyp_len / ref_len (ref_len > 0 here: multi_bleu refuses the rest).
  const double ratio = static_cast<double>(hyp_len) / static_cast<double>(ref_len);
  char buffer[256];
  std::snprintf(buffer, sizeof(buffer),
                "BLEU = %.2f, %.1f/%.1f/%.1f/%.1f (BP=%.3f, ratio=%.3f, hyp_len=%lld, "
                "ref_len=%lld)",
                100 * bleu, 100 * precisions[0], 100 * precisions[1], 100 * precisions[2],
                100 * precisions[3], brevity_penalty, ratio, static_cast<long long>(hyp_len),
                static_cast<long long>(ref_len));
  return buffer;
}

MultiBleuScore multi_bleu(const std::vector<std::string>& hypotheses,
                          const std::vector<std::vector<std::string>>& references) {
  if (references.empty()) THPC_FAIL("no reference streams given");
  for (size_t r = 0; r < references.size(); ++r) {
    if (references[r].size() != hypotheses.size()) {
      THPC_FAIL("reference stream " << r + 1 << " has " << references[r].size()
                                    << " segments, the hypothesis " << hypotheses.size());
    }
  }
  BleuStatistics statistics(kOrders);
  for (size_t i = 0; i < hypotheses.size(); ++i) {
    ReferenceNgrams segment;
    for (const std::vector<std::string>& stream : references) {
      segment.add_reference(split_multi_bleu_tokens(stream[i]), kOrders);
    }
    const std::vector<std::string> tokens = split_multi_bleu_tokens(hypotheses[i]);
    const int64_t hyp_len = static_cast<int64_t>(tokens.size());
    statistics.hyp_len += hyp_len;
    statistics.ref_len += closest_reference_length(hyp_len, segment.lengths);
    add_clipped_matches(tokens, segment, statistics);
  }

  MultiBleuScore score;
  score.hyp_len = statistics.hyp_len;
  score.ref_len = statistics.ref_len;
  if (score.ref_len == 0) {
    THPC_FAIL("every reference segment is empty after tokenization: BLEU is undefined "
              "(multi-bleu.perl prints 'BLEU = 0, 0/0/0/0 ...' and exits 1)");
  }
  for (int n = 0; n < kOrders; ++n) {
    score.matches[n] = statistics.matches[n];
    score.totals[n] = statistics.totals[n];
    score.precisions[n] = statistics.totals[n] != 0 ? static_cast<double>(statistics.matches[n]) /
                                                          static_cast<double>(statistics.totals[n])
                                                    : 0.0;
  }
  if (score.hyp_len < score.ref_len) {
    if (score.hyp_len == 0) {
      THPC_FAIL("the hypothesis has no tokens but the references do: BLEU is 0, and "
                "multi-bleu.perl stops here with 'Illegal division by zero'");
    }
    score.brevity_penalty = std::exp(1 - static_cast<double>(score.ref_len) /
                                             static_cast<double>(score.hyp_len));
  }
  // In multi-bleu.perl's order: the four logs summed left to right, divided by 4.
  score.bleu = score.brevity_penalty *
               std::exp((my_log(score.precisions[0]) + my_log(score.precisions[1]) +
                         my_log(score.precisions[2]) + my_log(score.precisions[3])) /
                        4);
  return score;
}

std::string moses_bleu_tokens(std::string_view line, const MosesBleuOptions& options) {
  std::string tokens = moses_tokenize_utf8(line, options.tokenizer);
  return options.split_compounds ? split_compounds(tokens) : tokens;
}

MultiBleuScore moses_bleu(const std::vector<std::string>& hypotheses,
                          const std::vector<std::vector<std::string>>& references,
                          const MosesBleuOptions& options) {
  auto tokenized = [&](const std::vector<std::string>& lines) {
    std::vector<std::string> out;
    out.reserve(lines.size());
    for (const std::string& line : lines) out.push_back(moses_bleu_tokens(line, options));
    return out;
  };
  std::vector<std::vector<std::string>> reference_tokens;
  for (const std::vector<std::string>& stream : references) {
    reference_tokens.push_back(tokenized(stream));
  }
  return multi_bleu(tokenized(hypotheses), reference_tokens);
}

}  // namespace thpc::metrics
