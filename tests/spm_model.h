// A SentencePiece model for the tests that run transformer_decode: BPE with the project's
// special ids (pad 0, unk 1, bos 2, eos 3), as transformer_preprocess trains it.
#pragma once

#include <sentencepiece_trainer.h>

#include <fstream>
#include <string>

#include "data_dir.h"

namespace thpc {

// The project's special ids as spm_train's flags.
inline const char kProjectSpecialIds[] = "--pad_id=0 --unk_id=1 --bos_id=2 --eos_id=3";

// Trains on the sentences of `text_file` (one a line) and writes PREFIX.model; `ids`
// gives the special ids as spm_train's flags ("" for its defaults: unk 0, bos 1, eos 2,
// no pad).
inline sentencepiece::util::Status train_test_spm_model(const std::string& text_file,
                                                        const std::string& prefix,
                                                        int vocab_size,
                                                        const std::string& ids =
                                                            kProjectSpecialIds) {
  return sentencepiece::SentencePieceTrainer::Train(
      "--input=" + text_file + " --model_prefix=" + prefix +
      " --vocab_size=" + std::to_string(vocab_size) + " --model_type=bpe " + ids +
      " --minloglevel=2");
}

// The tests' usual model: `vocab_size` pieces on the first 3000 Multi30k English
// sentences ($THPC_DATA/multi30k/train.en, which the caller has checked), written as
// DIR/spm.model (DIR/sample.en holds the sentences).
inline sentencepiece::util::Status train_multi30k_spm_model(const std::string& dir,
                                                            int vocab_size) {
  std::ifstream corpus(data_path("multi30k/train.en"));
  std::ofstream sample(dir + "/sample.en");
  std::string line;
  for (int i = 0; i < 3000 && std::getline(corpus, line); ++i) sample << line << "\n";
  sample.close();
  return train_test_spm_model(dir + "/sample.en", dir + "/spm", vocab_size);
}

}  // namespace thpc
