// Attention pictures like the paper's Figures 3-5: every layer's and head's attention
// weights of a translation, and the HDF5 file `transformer_decode --dump-attention`
// writes them to (tools/plot_attention.py draws it):
//
//   /              attributes format_version (1), layers, heads, checkpoint (its path)
//   /line_N        one group per dumped input line N (1-based); attribute line = N
//     source_text    string: the input line
//     target_text    string: the translation, detokenised (what decoding printed)
//     source_tokens  string [S]: the source's subword pieces x_1 .. x_m, </s>
//     target_tokens  string [T]: the decoder's input pieces <s>, y_1 .. y_n
//     source_ids     int32 [S], target_ids int32 [T]: the same as vocabulary ids
//     encoder_self   float32 [layers, heads, S, S]  encoder self-attention
//     decoder_self   float32 [layers, heads, T, T]  decoder self-attention (causal: 0
//                                                   above the diagonal)
//     cross          float32 [layers, heads, T, S]  encoder-decoder attention
//
// In every [.., Lq, Lk] matrix row q holds the weights query position q gives the keys:
// a softmax, so it sums to 1. Strings are variable-length UTF-8 (h5py: .asstr()).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "data/batch.h"
#include "io/atomic_file.h"
#include "model/transformer.h"

namespace thpc {

// Version 1: the layout above.
constexpr int64_t kAttentionDumpFormatVersion = 1;

struct AttentionDump {
  int line = 0;  // the input line, 1-based
  std::string source_text, target_text;
  TokenSequence source_ids;  // x + eos: what the encoder read
  TokenSequence target_ids;  // bos + y: what the decoder read
  std::vector<std::string> source_tokens, target_tokens;  // the ids' pieces
  int layers = 0, heads = 0;
  std::vector<float> encoder_self;  // [layers, heads, S, S]
  std::vector<float> decoder_self;  // [layers, heads, T, T]
  std::vector<float> cross;         // [layers, heads, T, S]
};

// Runs `model` teacher-forced over (source, output) — its ordinary forward pass, without
// dropout, over source + eos and bos + output, as evaluation runs it — and keeps every
// layer's and head's attention weights (Transformer::attention_weights). For `output`
// found by beam search these are the weights under which the model scored it. Fills
// everything but `line`, the texts and the token strings.
AttentionDump capture_attention(Transformer& model, const TokenSequence& source,
                                const TokenSequence& output, const SpecialIds& ids);

// Writes `dumps` to `path` in the layout above, atomically (io/atomic_file.h), under
// `claim` when the caller took it before its work (else write_atomically takes one).
// Throws thpc::Error naming the file.
void write_attention_dumps(const std::string& path, const std::vector<AttentionDump>& dumps,
                           const std::string& checkpoint,
                           OutputClaim* claim = nullptr);

}  // namespace thpc
