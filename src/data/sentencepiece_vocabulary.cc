#include "data/sentencepiece_vocabulary.h"

#include <algorithm>
#include <sstream>
#include <string>
#include <utility>

#include "common/error.h"

namespace thpc {

SentencePieceVocabulary vocabulary_of(const sentencepiece::SentencePieceProcessor& model) {
  SentencePieceVocabulary vocabulary;
  vocabulary.pieces = model.GetPieceSize();
  vocabulary.size = vocabulary.pieces;
  if (model.unk_id() < 0) {
    THPC_FAIL("the SentencePiece model has no unk piece (every model spm_train writes has "
              << "one): it is damaged or was not written by SentencePiece");
  }
  const auto present_or_added = [&](int id, const char* name) {
    if (id >= 0) return id;
    vocabulary.added.push_back(name);
    return vocabulary.size++;
  };
  vocabulary.ids.unk = model.unk_id();
  vocabulary.ids.pad = present_or_added(model.pad_id(), "<pad>");
  vocabulary.ids.bos = present_or_added(model.bos_id(), "<s>");
  vocabulary.ids.eos = present_or_added(model.eos_id(), "</s>");
  return vocabulary;
}

std::string piece_of(const sentencepiece::SentencePieceProcessor& model,
                     const SentencePieceVocabulary& vocabulary, int id) {
  THPC_CHECK(id >= 0 && id < vocabulary.size,
             "token id " << id << " outside the vocabulary of " << vocabulary.size);
  if (id < vocabulary.pieces) return model.IdToPiece(id);
  return vocabulary.added[static_cast<size_t>(id - vocabulary.pieces)];
}

std::string added_specials_text(const SentencePieceVocabulary& vocabulary) {
  if (vocabulary.added.empty()) return "";
  const auto name = [](const std::string& piece) -> std::string {
    return piece == "<pad>" ? "pad" : piece == "<s>" ? "bos" : "eos";
  };
  std::string lacked, given;
  for (size_t k = 0; k < vocabulary.added.size(); ++k) {
    const std::string separator =
        k == 0 ? "" : k + 1 == vocabulary.added.size() ? " and " : ", ";
    lacked += (k == 0 ? "" : k + 1 == vocabulary.added.size() ? " or " : ", ") +
              name(vocabulary.added[k]);
    given += separator + name(vocabulary.added[k]) + " is id " +
             std::to_string(vocabulary.pieces + static_cast<int>(k));
  }
  return "it has no " + lacked + " piece: " + given + ", after its " +
         std::to_string(vocabulary.pieces) + " pieces";
}

bool looks_encoded_into_pieces(const std::string& line) {
  static const std::string kWordMark = "\xE2\x96\x81";  // U+2581
  int words = 0, marked = 0;
  size_t at = 0;
  while (at < line.size()) {
    const size_t start = line.find_first_not_of(" \t", at);
    if (start == std::string::npos) break;
    const size_t end = std::min(line.find_first_of(" \t", start), line.size());
    ++words;
    if (line.compare(start, kWordMark.size(), kWordMark) == 0) ++marked;
    at = end;
  }
  return words >= 2 && 2 * marked > words;
}

std::string sentencepiece_vocabulary_difference(const std::string& a, const std::string& a_name,
                                                const std::string& b, const std::string& b_name) {
  if (a == b) return "";
  sentencepiece::SentencePieceProcessor model_a, model_b;
  const auto loaded_a = model_a.LoadFromSerializedProto(a);
  if (!loaded_a.ok()) return "cannot load " + a_name + "'s: " + loaded_a.ToString();
  const auto loaded_b = model_b.LoadFromSerializedProto(b);
  if (!loaded_b.ok()) return "cannot load " + b_name + "'s: " + loaded_b.ToString();
  std::ostringstream why;
  if (model_a.GetPieceSize() != model_b.GetPieceSize()) {
    why << model_a.GetPieceSize() << " pieces in " << a_name << ", " << model_b.GetPieceSize()
        << " in " << b_name;
    return why.str();
  }
  const std::pair<const char*, std::pair<int, int>> special[] = {
      {"pad", {model_a.pad_id(), model_b.pad_id()}},
      {"unk", {model_a.unk_id(), model_b.unk_id()}},
      {"bos", {model_a.bos_id(), model_b.bos_id()}},
      {"eos", {model_a.eos_id(), model_b.eos_id()}}};
  for (const auto& [name, id] : special) {
    if (id.first != id.second) {
      why << "the " << name << " id is " << id.first << " in " << a_name << ", " << id.second
          << " in " << b_name;
      return why.str();
    }
  }
  // What the pieces mean: the text, the type (normal, control, unknown, unused, byte),
  // and the score the segmentation ranks by (a unigram log-probability or a BPE merge's
  // rank).
  const auto type_of = [](const sentencepiece::SentencePieceProcessor& model, int id) {
    return model.IsControl(id)   ? "control"
           : model.IsUnknown(id) ? "unknown"
           : model.IsUnused(id)  ? "unused"
           : model.IsByte(id)    ? "byte"
                                 : "normal";
  };
  for (int id = 0; id < model_a.GetPieceSize(); ++id) {
    if (model_a.IdToPiece(id) != model_b.IdToPiece(id)) {
      why << "piece " << id << " is '" << model_a.IdToPiece(id) << "' in " << a_name << ", '"
          << model_b.IdToPiece(id) << "' in " << b_name;
    } else if (std::string(type_of(model_a, id)) != type_of(model_b, id)) {
      why << "piece " << id << " '" << model_a.IdToPiece(id) << "' is " << type_of(model_a, id)
          << " in " << a_name << ", " << type_of(model_b, id) << " in " << b_name;
    } else if (model_a.GetScore(id) != model_b.GetScore(id)) {
      why << "piece " << id << " '" << model_a.IdToPiece(id) << "' scores "
          << model_a.GetScore(id) << " in " << a_name << ", " << model_b.GetScore(id) << " in "
          << b_name;
    } else {
      continue;
    }
    return why.str();
  }
  return "";
}

}  // namespace thpc
