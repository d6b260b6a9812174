// Text handling for BLEU and chrF, exactly as sacreBLEU 2.x does it in Python: strict
// UTF-8, Python's str.lower(), str.rstrip() and str.split(), and BLEU's tokenizers 13a
// (the mteval-v13a.pl rules, sacreBLEU's default), intl (mteval-v14.pl --international-
// tokenization), char, none and zh (Chinese characters split, then 13a's rules). The
// SentencePiece tokenizers (flores101, flores200, spBLEU-1K) need their model:
// metrics/sentencepiece_tokenizer.h.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace thpc::metrics {

enum class TokenizerKind { k13a, kIntl, kChar, kNone, kZh, kFlores101, kFlores200, kSpBleu1K };

// "13a" | "intl" | "char" | "none" | "zh" | "flores101" | "flores200" | "spBLEU-1K", or
// "spm" (sacreBLEU's older name of flores101); anything else throws thpc::Error.
TokenizerKind parse_tokenizer(const std::string& name);
// The name sacreBLEU puts in the signature (tok:13a; spm's is flores101).
std::string tokenizer_name(TokenizerKind kind);
// flores101, flores200 or spBLEU-1K: pieces of a SentencePiece model.
bool is_sentencepiece_tokenizer(TokenizerKind kind);

// Decodes UTF-8 as Python's strict codec does (no overlong forms, no surrogates,
// nothing above U+10FFFF). Returns nullopt on invalid input and, if given, sets
// *error_offset to the byte offset of the first bad sequence.
std::optional<std::u32string> decode_utf8(std::string_view bytes,
                                          size_t* error_offset = nullptr);
std::string encode_utf8(std::u32string_view text);

// Python's str.isspace() for one code point: what str.split() separates on.
bool is_python_whitespace(char32_t c);

// Python's str.lower(), final sigma included.
std::u32string python_lower(std::u32string_view text);

// Python's str.rstrip(): trailing whitespace removed.
std::u32string_view python_rstrip(std::u32string_view text);

// Python's str.split() with no argument: runs of whitespace separate, no empty tokens.
std::vector<std::u32string_view> python_split(std::u32string_view text);

// One segment through the named tokenizer; the result is space-separated tokens
// (sacreBLEU's tokenizer output, before n-gram extraction splits it). A SentencePiece
// tokenizer throws: it needs its model (sentencepiece_tokenize).
std::u32string tokenize(std::u32string_view line, TokenizerKind kind);

// One segment of a scorer's input decoded, or thpc::Error naming it: "reference 2,
// segment 7: invalid UTF-8 at byte 5" (reference_stream is 0-based, nullopt for a
// hypothesis: "hypothesis segment 7: ..."; index is 0-based).
std::u32string decode_segment(std::string_view segment, std::optional<size_t> reference_stream,
                              size_t index);

// The segments per stream of a scorer's references (references[r][i] is segment i of
// stream r); thpc::Error when there is no stream or the streams' lengths differ.
size_t reference_segments(const std::vector<std::vector<std::string>>& references);

// The references of one segment as the streams a scorer takes: one stream each, of one
// segment (what sentence_bleu and sentence_chrf score against).
std::vector<std::vector<std::string>> single_segment_streams(
    const std::vector<std::string>& references);

// Convenience for UTF-8 callers: decode (throws thpc::Error on invalid UTF-8),
// tokenize, encode.
std::string tokenize_utf8(std::string_view line, TokenizerKind kind);

}  // namespace thpc::metrics
