// The BLEU the Transformer paper reports: mosesdecoder's scripts/generic/multi-bleu.perl
// over Moses-tokenized text, with tensor2tensor's compound splitting for German
// (get_ende_bleu.sh; the text steps are in metrics/moses_tokenize.h). Not sacreBLEU's
// BLEU (metrics/bleu.h): the tokens differ (Moses' tokenizer with its escapes and
// ##AT## splits against mteval-v13a's), and so does the formula in its corners:
//
//   BLEU = BP · exp( (1/4) Σ_{n=1..4} my_log(p_n) ),   BP = exp(1 − r/c) if c < r, else 1
//
// with p_n = matches/totals as fractions (0 when the corpus has no n-grams of order n),
// my_log(0) = −9999999999 (so one order without a match makes BLEU 0: no smoothing),
// r the sum of the closest reference lengths (the shorter on ties; multi-bleu.perl starts
// its search from a length of 9999, so a reference 9999 or more tokens away from the
// hypothesis is never chosen) and c the hypothesis length. Clipping is sacreBLEU's
// (ReferenceNgrams). The numbers are computed in multi-bleu.perl's order of operations,
// so the printed line is the same to the last digit (tests/test_moses_bleu.cc).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "metrics/moses_tokenize.h"

namespace thpc::metrics {

struct MultiBleuScore {
  double bleu = 0.0;                    // a fraction, as multi-bleu.perl keeps it
  std::array<double, 4> precisions{};   // p_1..p_4, fractions
  std::array<int64_t, 4> matches{};     // clipped matches per order
  std::array<int64_t, 4> totals{};      // hypothesis n-grams per order
  double brevity_penalty = 1.0;
  int64_t hyp_len = 0;
  int64_t ref_len = 0;

  double score() const { return 100.0 * bleu; }  // what the line prints, in percent
  // multi-bleu.perl's line, without its newline:
  // "BLEU = 27.30, 58.5/33.1/21.0/13.9 (BP=1.000, ratio=1.010, hyp_len=64578, ref_len=63924)"
  std::string line() const;
};

// multi-bleu.perl on token lines (already tokenized text, one segment per line, split
// as split_multi_bleu_tokens does): references[r][i] is segment i of reference stream r.
// Throws thpc::Error where multi-bleu.perl prints no score: every reference empty (it
// prints "BLEU = 0, 0/0/0/0 ..." and exits 1) or an empty hypothesis against a
// non-empty reference (it stops with "Illegal division by zero").
MultiBleuScore multi_bleu(const std::vector<std::string>& hypotheses,
                          const std::vector<std::vector<std::string>>& references);

struct MosesBleuOptions {
  MosesTokenizerOptions tokenizer;
  bool split_compounds = true;  // tensor2tensor's ##AT## splitting (EN-DE)
};

// A raw line (as read_lines gives it) as multi-bleu.perl receives it: tokenized, then
// compound-split when asked.
std::string moses_bleu_tokens(std::string_view line, const MosesBleuOptions& options);

// The whole pipeline on raw text: moses_bleu_tokens of every line, then multi_bleu.
MultiBleuScore moses_bleu(const std::vector<std::string>& hypotheses,
                          const std::vector<std::vector<std::string>>& references,
                          const MosesBleuOptions& options);

}  // namespace thpc::metrics
