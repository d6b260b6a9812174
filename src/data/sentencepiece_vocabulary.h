// The model's vocabulary from a SentencePiece model: its pieces in their ids, then any of
// the special pieces pad, bos and eos that the SentencePiece model lacks.
//
// A model trained with spm_train's defaults has no pad (pad_id -1), one trained as Marian
// trains it has neither pad nor bos; the batches need all three, and the loss and the
// search tell padding from text by its id alone. Such a special gets the id after the
// model's last piece, in the order pad, bos, eos: a model of 8,000 pieces without pad
// gives a vocabulary of 8,001 with pad 8000. SentencePiece never writes an added id (its
// pieces are < 8000) and never reads one back: pad and bos are never generated, and eos
// ends a hypothesis without being part of it. transformer_preprocess, the shards' check
// of their stored model and transformer_decode all derive the ids here, so they agree.
#pragma once

#include <sentencepiece_processor.h>

#include <string>
#include <vector>

#include "data/batch.h"

namespace thpc {

struct SentencePieceVocabulary {
  int pieces = 0;  // the SentencePiece model's own
  int size = 0;    // pieces + the added specials: the embedding's rows
  SpecialIds ids;
  // The added specials' names, "<pad>", "<s>" or "</s>", in their ids' order (pieces,
  // pieces + 1, ...); empty when the model has all four.
  std::vector<std::string> added;
};

// The vocabulary of a loaded model. Throws for a model without an unk piece, which
// SentencePiece's trainer never writes.
SentencePieceVocabulary vocabulary_of(const sentencepiece::SentencePieceProcessor& model);

// The piece of `id` (0 <= id < vocabulary.size): the model's, or an added special's name.
std::string piece_of(const sentencepiece::SentencePieceProcessor& model,
                     const SentencePieceVocabulary& vocabulary, int id);

// "", or what was added, for a program to say once: "it has no pad or bos piece: pad is
// id 8000 and bos 8001, after its 8000 pieces".
std::string added_specials_text(const SentencePieceVocabulary& vocabulary);

// Where two serialized SentencePiece models differ as vocabularies, e.g. "piece 57 is
// '▁dog' in A, '▁cat' in B" (`a_name`, `b_name` name them); empty when they are one.
std::string sentencepiece_vocabulary_difference(const std::string& a, const std::string& a_name,
                                                const std::string& b, const std::string& b_name);

// Whether `line` reads as spm_encode's output rather than text: at least two words, and
// most of them starting with SentencePiece's word mark U+2581. Text has the mark rarely,
// if ever; fairseq's habit is to encode, then translate (and score) the pieces, which
// transformer_decode would encode again and BLEU would score as words (a helper's walk).
bool looks_encoded_into_pieces(const std::string& line);

}  // namespace thpc
