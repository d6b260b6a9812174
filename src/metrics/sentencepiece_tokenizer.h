// sacreBLEU's SentencePiece tokenizers for BLEU (-tok flores101 | flores200 | spBLEU-1K,
// and spm, flores101's older name): "spBLEU", a segment's pieces joined by spaces,
// " ".join(model.EncodeAsPieces(line)), with the model sacreBLEU downloads on first use
// into $SACREBLEU/models/ (SACREBLEU unset: ~/.sacrebleu/models/). This program does not
// reach the network: where the file is missing, the error says where to fetch it from.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "metrics/tokenize.h"

namespace sentencepiece {
class SentencePieceProcessor;
}

namespace thpc::metrics {

// Where sacreBLEU keeps the model of `kind` (a SentencePiece tokenizer), as its
// tokenizer_spm.py names it: os.path.join(SACREBLEU_DIR, "models", basename(url)).
std::string sacrebleu_model_path(TokenizerKind kind);
// The address sacreBLEU downloads it from.
std::string sacrebleu_model_url(TokenizerKind kind);

// The model of `kind`, loaded from sacrebleu_model_path; thpc::Error naming the tokenizer,
// the path and what to do when the file is missing or is not a SentencePiece model.
std::shared_ptr<const sentencepiece::SentencePieceProcessor> load_sacrebleu_model(
    TokenizerKind kind);

// `line`'s pieces joined by single spaces (what sacreBLEU's TokenizerSPM returns).
std::u32string sentencepiece_tokenize(const sentencepiece::SentencePieceProcessor& model,
                                      std::u32string_view line);

}  // namespace thpc::metrics
