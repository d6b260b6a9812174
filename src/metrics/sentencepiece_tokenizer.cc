#include "metrics/sentencepiece_tokenizer.h"

#include <pwd.h>
#include <sentencepiece_processor.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <vector>

#include "common/error.h"
#include "common/input_file.h"

namespace thpc::metrics {
namespace {

// Python's os.path.join of two parts.
std::string python_path_join(const std::string& first, const std::string& second) {
  if (!second.empty() && second.front() == '/') return second;
  if (first.empty() || first.back() == '/') return first + second;
  return first + "/" + second;
}

// Python's os.path.expanduser("~"): $HOME when set (even empty), else the password
// entry's home; trailing slashes removed, "/" when nothing is left.
std::string python_home() {
  std::string home;
  if (const char* variable = std::getenv("HOME")) {
    home = variable;
  } else if (const passwd* entry = getpwuid(getuid()); entry && entry->pw_dir) {
    home = entry->pw_dir;
  }
  while (!home.empty() && home.back() == '/') home.pop_back();
  return home.empty() ? "/" : home;
}

}  // namespace

std::string sacrebleu_model_url(TokenizerKind kind) {
  switch (kind) {
    case TokenizerKind::kFlores101:
      return "https://dl.fbaipublicfiles.com/fairseq/models/flores/sacrebleu_tokenizer_spm.model";
    case TokenizerKind::kFlores200: return "https://tinyurl.com/flores200sacrebleuspm";
    case TokenizerKind::kSpBleu1K:
      return "https://www.dlnlp.ai/spBLEU-1K/spbleu-1k_tokenizer_spm.model";
    default: break;
  }
  THPC_FAIL("the tokenizer " << tokenizer_name(kind) << " has no SentencePiece model");
}

std::string sacrebleu_model_path(TokenizerKind kind) {
  const std::string url = sacrebleu_model_url(kind);
  // SACREBLEU_DIR = os.environ.get('SACREBLEU', os.path.join(USERHOME, '.sacrebleu'))
  const char* variable = std::getenv("SACREBLEU");
  const std::string directory =
      variable ? std::string(variable) : python_path_join(python_home(), ".sacrebleu");
  return python_path_join(python_path_join(directory, "models"),
                          url.substr(url.rfind('/') + 1));
}

std::shared_ptr<const sentencepiece::SentencePieceProcessor> load_sacrebleu_model(
    TokenizerKind kind) {
  const std::string path = sacrebleu_model_path(kind);
  const std::string name = tokenizer_name(kind);
  std::error_code error;
  if (!std::filesystem::exists(path, error)) {
    THPC_FAIL("-tok " << name << ": sacreBLEU's SentencePiece model is not at " << path
                      << " (sacreBLEU downloads it there on first use; this program does not "
                      << "reach the network): fetch it with  curl -L --create-dirs -o " << path
                      << " " << sacrebleu_model_url(kind)
                      << "  or set SACREBLEU to the folder whose models/ holds it");
  }
  const std::string unreadable = unreadable_file_reason(path);
  if (!unreadable.empty()) THPC_FAIL("-tok " << name << ": " << path << ": " << unreadable);
  auto model = std::make_shared<sentencepiece::SentencePieceProcessor>();
  if (!model->Load(path).ok()) {
    THPC_FAIL("-tok " << name << ": " << path << " is not a SentencePiece model (a download "
                      << "that failed part way? fetch it again from "
                      << sacrebleu_model_url(kind) << ")");
  }
  return model;
}

std::u32string sentencepiece_tokenize(const sentencepiece::SentencePieceProcessor& model,
                                      std::u32string_view line) {
  std::vector<std::string> pieces;
  const auto status = model.Encode(encode_utf8(line), &pieces);
  if (!status.ok()) THPC_FAIL("SentencePiece cannot encode a segment: " << status.ToString());
  std::string joined;
  for (size_t i = 0; i < pieces.size(); ++i) {
    if (i > 0) joined += ' ';
    joined += pieces[i];
  }
  // The pieces are UTF-8 (SentencePiece writes valid UTF-8 pieces of valid input).
  std::optional<std::u32string> decoded = decode_utf8(joined);
  THPC_CHECK(decoded, "SentencePiece wrote a piece that is not UTF-8");
  return std::move(*decoded);
}

}  // namespace thpc::metrics
