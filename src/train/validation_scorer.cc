#include "train/validation_scorer.h"

#include <sentencepiece_processor.h>

#include <cctype>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <sstream>

#include "common/error.h"
#include "common/still_working.h"
#include "data/shard_file.h"
#include "data/shard_reader.h"
#include "decode/translate.h"
#include "parse/evalb.h"
#include "parse/tree.h"
#include "train/stop_request.h"
#include "train/test_hooks.h"
#include "train/training_setup.h"

namespace thpc {

namespace {

// Padded source tokens per translation batch. The translations do not depend on it
// (decode/translate.h), only time and memory do: the decoding arenas grow with the batch
// and stay allocated beside the training's, so the batch is a quarter of
// transformer_decode's default, which on the default job's validation set was slower
// and held more memory (bench/RESULTS.md, "validation BLEU's decoding batch").
constexpr int kBatchTokens = 1024;

// The search of train.valid_beam hypotheses, greedy (no length penalty) when that is 1,
// otherwise with the run's [decode] length penalty and limits.
BeamOptions validation_search(const Config& config) {
  SearchOverrides overrides;
  overrides.beam = config.train.valid_beam;
  overrides.greedy = config.train.valid_beam == 1;
  return configured_beam_options(config.decode, config.model.max_positions, overrides);
}

// A word as EVALB reads it in a tree: no space, no bracket (the Penn Treebank's -LRB- and
// -RRB-), not empty. Gold and test trees hold the same words, so this changes no score;
// it keeps a validation line of words outside the treebank's readable.
std::string evalb_word(const std::string& word) {
  std::string out;
  for (const char c : word) {
    if (c == '(') {
      out += "-LRB-";
    } else if (c == ')') {
      out += "-RRB-";
    } else {
      out += std::isspace(static_cast<unsigned char>(c)) ? '_' : c;
    }
  }
  return out.empty() ? "_" : out;
}

// Whether every word of a linearized tree (`words`: tree_words') that is not a bracket is
// the placeholder: the trees' leaves are XX (else the words). A word that begins with the
// unknown piece (its text `unknown`) may be either (gold_tree_sequence).
bool placeholder_leaves(const std::vector<std::string>& words, const std::string& unknown) {
  for (const std::string& word : words) {
    if (is_bracket_word(word) || word.rfind(unknown, 0) == 0) continue;
    if (word != parse::kWordPlaceholder) return false;
  }
  return true;
}

// Refuses a validation pair whose tree the search cannot write, metric f1 (`pair`: its
// number in `file`, from 0; `words`: its source's): leaves other than decode.tree_leaves
// says (the search would write trees of the other kind), or a length limit below the
// shortest tree over its words, which would leave the search only unfinished trees.
void check_tree_pair(const Config& config, const BeamOptions& options,
                     const std::vector<std::string>& pieces, int unk, const std::string& file,
                     int64_t pair, const TokenSequence& source, const TokenSequence& target,
                     size_t words) {
  const bool placeholders = config.decode.tree_leaves == parse::kWordPlaceholder;
  const std::string where = file + ": validation pair " + std::to_string(pair + 1);
  // A sentence whose words the trees cannot hold: a bracket among them (the search could
  // not tell it from the tree's own), as the Penn Treebank writes -LRB- and -RRB-.
  const std::vector<std::string> sentence_words = tree_words(source, pieces);
  if (!placeholders) {
    for (const std::string& word : sentence_words) {
      if (is_bracket_word(word)) {
        throw DataError(where + ": its sentence holds the word '" + word + "', which a " +
                        "linearized tree reads as a bracket: write brackets in the words " +
                        "as -LRB- and -RRB-, as the Penn Treebank does, and preprocess again");
      }
    }
  }
  const std::string& unknown = pieces.at(static_cast<size_t>(unk));
  const bool target_placeholders = placeholder_leaves(tree_words(target, pieces), unknown);
  const bool source_placeholders = placeholder_leaves(sentence_words, unknown);
  if (placeholders != target_placeholders && !source_placeholders) {
    throw ConfigurationError(
        where + ": its tree's leaves are " + (target_placeholders ? "XX" : "the words") +
        ", and decode.tree_leaves = " + config.decode.tree_leaves +
        config.on_command_line("decode.tree_leaves") +
        " (train.valid_metric = f1 decodes trees of that kind): set decode.tree_leaves = " +
        (target_placeholders ? "XX" : "words") + ", as the shards were linearized");
  }
  const int needed = static_cast<int>(placeholders ? words : source.size()) + 3;
  const int limit = beam_detail::output_length_limit(source.size(), options);
  if (!words || limit >= needed) return;
  std::ostringstream message;
  message << where << " needs " << needed << " tokens for the shortest tree over its words "
          << "(the root's brackets, its words' " << needed - 3 << " tokens, the end), but "
          << "train.valid_metric = f1's search allows it " << limit << " (decode.max_len_a "
          << options.max_len_a << " x " << source.size() << " source tokens + decode.max_len_b "
          << options.max_len_b << ", at most model.max_positions - 1 = " << options.max_len_cap
          << "): raise decode.max_len_a or decode.max_len_b (the paper's parser: 1 and 300)";
  throw ConfigurationError(message.str());
}

// Runs `build`, which builds a TreeTokenFilter over the validation shards' vocabulary; its
// refusal (no bracket pieces: not a parser's shards) is the configuration's.
template <typename Build>
void refuse_unless_trees(const Config& config, Build&& build) {
  try {
    build();
  } catch (const Error& error) {
    throw ConfigurationError(config.source_file + ": train.valid_metric = f1 scores the " +
                             "trees of a parser, but data.valid's shards cannot hold one: " +
                             error.what() + "; score translations with bleu or chrf");
  }
}

}  // namespace

std::string gold_tree_sequence(const TokenSequence& target,
                               const std::vector<std::string>& pieces, int unk, size_t words) {
  const std::string& unknown = pieces.at(static_cast<size_t>(unk));
  const std::vector<std::string> items = tree_words(target, pieces);
  size_t opens = 0, closes = 0, slots = 0, unsure = 0;
  const auto is_unsure = [&](const std::string& item) {
    return item.size() > unknown.size() && item.compare(0, unknown.size(), unknown) == 0;
  };
  for (const std::string& item : items) {
    if (is_unsure(item)) {
      ++unsure;
    } else if (is_bracket_word(item)) {
      ++(item[0] == '(' ? opens : closes);
    } else {
      ++slots;
    }
  }
  const bool unsure_are_brackets = unsure > 0 && opens + unsure == closes && slots == words;
  std::string sequence;
  for (const std::string& item : items) {
    std::string written = parse::kWordPlaceholder;
    if (is_unsure(item)) {
      if (unsure_are_brackets) written = "(" + item.substr(unknown.size());
    } else if (is_bracket_word(item)) {
      written = item;
    }
    sequence += (sequence.empty() ? "" : " ") + written;
  }
  return sequence;
}

ValidationScorer::ValidationScorer(const Config& config, const Communicator& comm)
    : comm_(comm),
      options_(validation_search(config)),
      metric_(config.train.valid_metric) {
  const std::vector<std::string> files =
      find_shards(config.data.dir, config.data.valid, "data.valid = " + config.data.valid,
                  "data.dir = " + config.data.dir);
  // The pairs the validation loss reads (ShardReader drops those a position table cannot
  // hold with bos/eos).
  const int64_t longest = config.model.max_positions - 1;
  const bool trees = metric_ == "f1";
  const bool placeholders = config.decode.tree_leaves == parse::kWordPlaceholder;
  std::vector<std::string> references;
  std::vector<int> words_per_source;  // this rank's share, metric f1 with placeholders
  std::vector<TokenSequence> gold_sequences;  // rank 0, metric f1: the targets
  int64_t beyond_the_limit = 0;  // rank 0, metric f1: targets longer than the search's limit
  for (const std::string& file : files) {
    const ShardContents shard = read_shard(file);
    // (every rank's search needs the pieces with metric f1: they are its filter's)
    if (!spm_ && (comm_.is_root() || trees)) {
      if (shard.metadata.spm_model.empty()) {
        THPC_FAIL(file << ": holds no SentencePiece model, which train.valid_bleu needs to "
                       << "detokenise translations and references (shards of "
                       << "transformer_preprocess carry one)");
      }
      spm_ = std::make_unique<sentencepiece::SentencePieceProcessor>();
      const auto status = spm_->LoadFromSerializedProto(shard.metadata.spm_model);
      if (!status.ok()) {
        THPC_FAIL(file << ": cannot load its SentencePiece model: " << status.ToString());
      }
    }
    ids_ = shard.metadata.ids;
    // The trees' search reads the sources' words through the target's pieces: with a
    // source vocabulary of its own its ids are other pieces (a review's finding; decoding
    // refuses --tree-constraints alike).
    if (trees && shard.metadata.separate_vocabularies()) {
      throw ConfigurationError(
          file + ": separate source and target vocabularies (transformer_preprocess "
          "--source-vocab-size), and train.valid_metric = f1 searches trees over the "
          "sources' words read as target pieces: preprocess a parser's corpus with one "
          "vocabulary");
    }
    if (trees && pieces_.empty()) {
      for (int id = 0; id < spm_->GetPieceSize(); ++id) pieces_.push_back(spm_->IdToPiece(id));
      refuse_unless_trees(config, [&] { TreeTokenFilter(pieces_, ids_, {}); });
    }
    for (int64_t i = 0; i < shard.source.sentences(); ++i) {
      if (shard.source.length(i) > longest || shard.target.length(i) > longest) continue;
      const TokenSequence source = shard.source.sentence(i);
      const bool ours = pairs_ % comm_.size() == comm_.rank();
      if (ours) sources_.push_back(source);
      if (trees) {
        // Every rank checks every pair, so that a refusal is every rank's.
        const TokenSequence target = shard.target.sentence(i);
        const std::vector<TokenSequence> words = source_words(source, pieces_);
        check_tree_pair(config, options_, pieces_, ids_.unk, file, i, source, target,
                        words.size());
        if (ours) words_per_source.push_back(static_cast<int>(words.size()));
        if (comm_.is_root()) {
          words_.emplace_back();
          tags_.emplace_back();
          for (const TokenSequence& word : words) {
            words_.back().push_back(evalb_word(detokenize(*spm_, word)));
          }
          tags_.back() = parse::punctuation_tags(words_.back());
          gold_sequences.push_back(target);
          // (eos counted, as the limit counts it)
          beyond_the_limit += static_cast<int>(target.size()) + 1 >
                              beam_detail::output_length_limit(source.size(), options_);
        }
      } else if (comm_.is_root()) {
        references.push_back(detokenize(*spm_, shard.target.sentence(i)));
      }
      ++pairs_;
      show_still_working();  // at start-up, which the other ranks wait for
    }
  }
  if (trees) {
    refuse_unless_trees(config, [&] {
      trees_ = placeholders
                   ? std::make_unique<TreeTokenFilter>(pieces_, ids_.eos, words_per_source)
                   : std::make_unique<TreeTokenFilter>(pieces_, ids_, sources_);
    });
    options_.filter = trees_.get();
    std::vector<std::string> gold;
    for (const TokenSequence& target : gold_sequences) {
      gold.push_back(gold_tree_sequence(target, pieces_, ids_.unk, words_[gold.size()].size()));
    }
    // (a pair without words has no tree: both lines empty, which EVALB skips)
    int64_t repaired = 0;
    for (size_t k = 0; k < gold.size(); ++k) {
      if (words_[k].empty()) {
        gold_trees_.emplace_back();
        continue;
      }
      const parse::Delinearized tree = parse::delinearize(gold[k], words_[k], tags_[k]);
      repaired += tree.how != parse::Reconstruction::kWellFormed;
      gold_trees_.push_back(parse::to_evalb_line(tree.tree));
      show_still_working();  // the other ranks wait for rank 0's start-up
    }
    // What makes the F1 less than the parser's, said once at the start (a helper's walk:
    // a limit just above the shortest trees cut the F1 from 22.63 to 9.56 without a word).
    std::ostringstream notes;
    if (beyond_the_limit > 0) {
      notes << "note: " << beyond_the_limit << " of the " << gold.size() << " validation "
            << "trees are longer than the validation search's length limit (decode.max_len_a "
            << options_.max_len_a << " x source tokens + decode.max_len_b " << options_.max_len_b
            << ", at most model.max_positions - 1 = " << options_.max_len_cap << " with the "
            << "end): the F1 scores shorter trees for them (raise decode.max_len_a/b, or "
            << "model.max_positions where that caps them, to score the parser's own)\n";
    }
    if (repaired > 0) {
      notes << "note: " << repaired << " of the " << gold.size() << " validation targets "
            << "are no well-formed tree over their sentence's words (read back repaired, "
            << "parse/tree.h's rule): the F1 scores against those trees\n";
    }
    notes_ = notes.str();
  } else if (comm_.is_root()) {
    const std::vector<std::vector<std::string>> streams = {references};
    if (metric_ == "chrf") {
      chrf_ = std::make_unique<metrics::ChrfScorer>(streams, metrics::ChrfOptions{});
    } else {
      THPC_CHECK(metric_ == "bleu", "train.valid_metric " << metric_);
      metrics::BleuOptions options;  // sacreBLEU's defaults but for the tokenisation
      options.tokenizer = metrics::parse_tokenizer(config.train.valid_bleu_tokenize);
      bleu_ = std::make_unique<metrics::BleuScorer>(streams, options);
    }
  }
}

ValidationScorer::~ValidationScorer() = default;

namespace {

// A rank's best translations as int32s, each sentence's length then its ids (none for a
// sentence a stop left untranslated), for all_gather, which carries bytes.
std::string packed_ids(const std::vector<std::vector<Hypothesis>>& results) {
  std::vector<int32_t> values;
  for (const std::vector<Hypothesis>& found : results) {
    const TokenSequence none;
    const TokenSequence& tokens = found.empty() ? none : found.front().tokens;
    values.push_back(static_cast<int32_t>(tokens.size()));
    values.insert(values.end(), tokens.begin(), tokens.end());
  }
  return std::string(reinterpret_cast<const char*>(values.data()),
                     values.size() * sizeof(int32_t));
}

// packed_ids' sentences again, from rank `rank`'s bytes.
std::vector<TokenSequence> unpacked_ids(const std::string& bytes, size_t rank) {
  THPC_CHECK(bytes.size() % sizeof(int32_t) == 0,
             "rank " << rank << " sent " << bytes.size() << " bytes of translations");
  std::vector<int32_t> values(bytes.size() / sizeof(int32_t));
  std::memcpy(values.data(), bytes.data(), bytes.size());
  std::vector<TokenSequence> sentences;
  for (size_t at = 0; at < values.size();) {
    const size_t length = static_cast<size_t>(values[at++]);
    THPC_CHECK(length <= values.size() - at,
               "rank " << rank << "'s translations end inside a sentence");
    sentences.emplace_back(values.begin() + at, values.begin() + at + length);
    at += length;
  }
  return sentences;
}

}  // namespace

double ValidationScorer::tree_f1(const std::vector<std::string>& sequences) const {
  std::vector<std::string> trees;
  for (size_t k = 0; k < sequences.size(); ++k) {
    trees.push_back(words_[k].empty() ? std::string()
                                      : parse::to_evalb_line(
                                            parse::delinearize(sequences[k], words_[k], tags_[k])
                                                .tree));
    show_still_working();
  }
  std::string error;
  const double f1 =
      parse::bracketing_f_measure(parse::collins_parameters(), gold_trees_, trees, &error);
  // (gold and test trees hold the same words: EVALB finds no error in them)
  THPC_CHECK(error.empty(), "validation F1: EVALB: " << error);
  return f1;
}

double ValidationScorer::score(Transformer& model, int64_t step) const {
  std::vector<std::vector<Hypothesis>> results(sources_.size());
  for (const DecodeBatch& batch :
       make_decode_batches(sources_, options_, kBatchTokens, /*workers=*/1)) {
    // A stop signal ends the translation at the next batch (the trainer then records
    // nothing of this validation: ValidationStats::interrupted).
    if (stop_requested_by() != 0) break;
    translate_batch(model, ids_, sources_, batch, options_, results);
    comm_.show_working();  // the ranks done with their shares wait for this one
  }
  const std::vector<std::string> shares = comm_.all_gather(packed_ids(results));
  maybe_inject_failure(comm_, step, InjectionPoint::Scoring);
  double score = NAN;
  if (comm_.is_root()) {
    // Pair k was translated by rank k mod W as its (k / W)-th sentence.
    std::vector<std::string> hypotheses(pairs_);
    for (size_t rank = 0; rank < shares.size(); ++rank) {
      size_t k = rank;
      for (const TokenSequence& tokens : unpacked_ids(shares[rank], rank)) {
        THPC_CHECK(k < hypotheses.size(), "rank " << rank << " sent more translations than pairs");
        // (metric f1: each tree's brackets and a slot per word, the words are the pair's)
        hypotheses[k] = trees_ ? sequence_with_word_slots(tokens, pieces_)
                               : detokenize(*spm_, tokens);
        show_still_working();  // the other ranks wait for the score
        k += shares.size();
      }
    }
    score = trees_  ? tree_f1(hypotheses)
            : chrf_ ? chrf_->corpus_score(hypotheses)
                    : bleu_->corpus_score(hypotheses).score;
  }
  // Rank 0 scores alone (seconds for a large set) and signs its work between sentences,
  // so the caller's limit from the last sign of work holds here too: a rank 0 stopped or
  // hung while it scores ends the job after dist.timeout_s (before: the others waited for
  // its score without limit).
  comm_.broadcast_bytes_from_root(&score, sizeof score);
  return score;
}

}  // namespace thpc
