// The text side of the BLEU the Transformer paper reports (27.3 EN-DE base, 41.8 EN-FR
// big): tensor2tensor's get_ende_bleu.sh runs mosesdecoder's
// scripts/tokenizer/tokenizer.perl -l de over hypothesis and reference, splits hyphenated
// compounds with
//
//   perl -ple 's{(\S)-(\S)}{$1 ##AT##-##AT## $2}g'
//
// and scores with scripts/generic/multi-bleu.perl (metrics/multi_bleu.h). This file
// reproduces the first two steps exactly, line for line and byte for byte, for the two
// target languages of the paper, German and French (tests/test_moses_bleu.cc checks it
// against the Perl scripts' output on generated vectors and on newstest2013/2014).
//
// Why C++ and not the PyPI package sacremoses: sacremoses re-states the rules as Python
// regular expressions over Unicode tables of its own, and is exact only where those agree
// with Perl's regex engine and Perl's character classes. Tried (sacremoses 0.1.1) on this
// project's 338 vector lines, it differs from tokenizer.perl -l de on 54 (25 against the
// 2017 script, whose final-period rule it follows): CJK letters split one by one (its
// IsAlnum lacks them), control characters turned into token breaks, blank lines emptied.
// Here each of tokenizer.perl's substitutions is one step of moses_tokenize that scans
// the way Perl's s///g does (leftmost match, a match consumes its characters), and the
// classes are read off Perl itself (tools/gen_moses_tables.pl), so exactness is checkable
// rule by rule against the script, and scoring needs no Python at run time.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace thpc::metrics {

enum class MosesLanguage { kGerman, kFrench };

// "de" | "fr"; anything else throws thpc::Error.
MosesLanguage parse_moses_language(const std::string& code);

// Which tokenizer.perl. One rule changed since the paper, in mosesdecoder 9fc964d
// (2018-11-07, "split final dots unconditionally"): a period after the last word of a
// line is now always split off; before, it stayed attached when the word was a
// nonbreaking prefix ("Nr.", "5." in German) or held a period and a letter ("z.B.").
// For German and French nothing else changed from 2016-07 to today (2021-03 is the last
// change of the script, for other languages).
//   kCurrent: what a checkout of mosesdecoder gives today.
//   k2017:    the script of 2016-07 .. 2018-11, which tensor2tensor's get_ende_bleu.sh
//             ran when the paper's scores were computed.
enum class MosesVersion { kCurrent, k2017 };

// "current" | "2017"; anything else throws thpc::Error.
MosesVersion parse_moses_version(const std::string& name);

struct MosesTokenizerOptions {
  MosesLanguage language = MosesLanguage::kGerman;
  MosesVersion version = MosesVersion::kCurrent;
};

// One line (without its \n) as `tokenizer.perl -l LANG` prints it (without the \n):
// default options (no -a, -x, -penn, -no-escape, -protected), so & | < > ' " [ ] come
// out as &amp; &#124; &lt; &gt; &apos; &quot; &#91; &#93;. A line of only whitespace
// (Perl's \s) is printed as it is, whitespace included, as tokenizer.perl does.
std::u32string moses_tokenize(std::u32string_view line, const MosesTokenizerOptions& options);

// The same on UTF-8; throws thpc::Error on invalid UTF-8.
std::string moses_tokenize_utf8(std::string_view line, const MosesTokenizerOptions& options);

// tensor2tensor's compound splitting, s{(\S)-(\S)}{$1 ##AT##-##AT## $2}g, as `perl -ple`
// applies it: to the line's bytes (no decoding), so \S is any byte but the six ASCII
// whitespace bytes, and a match consumes the byte after the hyphen: "a-b-c" becomes
// "a ##AT##-##AT## b-c", and in "a-ü-b" the second hyphen follows ü's second byte, which
// no match consumed, so both hyphens split.
std::string split_compounds(std::string_view tokenized_line);

// How multi-bleu.perl splits a line into tokens (Perl's split ' ' on undecoded bytes):
// runs of the ASCII whitespace bytes \t \n \v \f \r and space separate, leading and
// trailing ones are dropped. Anything else, U+00A0 and U+3000 included, is token text.
std::vector<std::string> split_multi_bleu_tokens(std::string_view line);

}  // namespace thpc::metrics
