// A SentencePiece model for the tests that run transformer_decode: BPE with the project's
// special ids (pad 0, unk 1, bos 2, eos 3), as transformer_preprocess trains it.
#pragma once

#include <sentencepiece_trainer.h>

#include <string>

namespace thpc {

// Trains on the sentences of `text_file` (one a line) and writes PREFIX.model.
inline sentencepiece::util::Status train_test_spm_model(const std::string& text_file,
                                                        const std::string& prefix,
                                                        int vocab_size) {
  return sentencepiece::SentencePieceTrainer::Train(
      "--input=" + text_file + " --model_prefix=" + prefix +
      " --vocab_size=" + std::to_string(vocab_size) +
      " --model_type=bpe --pad_id=0 --unk_id=1 --bos_id=2 --eos_id=3 --minloglevel=2");
}

}  // namespace thpc
