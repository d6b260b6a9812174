#include "train/rank_agreement.h"

#include <sstream>
#include <vector>

#include "common/error.h"
#include "common/sha256.h"
#include "distributed/rank_failures.h"
#include "train/training_setup.h"

namespace thpc {

void check_every_rank_reads_the_same_data(const Communicator& comm, const BatchSource& source,
                                          const std::string& data_dir,
                                          const std::string& split) {
  // What the model is built from (the vocabulary) and what every rank walks in step (the
  // pairs of an epoch): equal on every rank, or the ranks would build different models
  // or leave each other waiting at the end of an epoch.
  std::ostringstream identity;
  identity << source.vocab_size() << " pieces";
  // Separate vocabularies: the source's too (the corpus digest covers the tokens alone).
  if (const std::string* model = source.source_spm_model()) {
    identity << ", a source vocabulary of " << source.source_vocab_size()
             << " pieces (SentencePiece model sha256 "
             << sha256_hex(model->data(), model->size()).substr(0, 12) << "...)";
  }
  const SpecialIds ids = source.special_ids();
  identity << " (ids " << ids.pad << "/" << ids.unk << "/" << ids.bos << "/" << ids.eos;
  if (const std::string* model = source.spm_model()) {
    identity << ", SentencePiece model sha256 "
             << sha256_hex(model->data(), model->size()).substr(0, 12) << "...) and "
             << source.pairs() << " " << split << " pairs (sha256 "
             << source.corpus_sha256().substr(0, 12) << "...)";
  } else {
    identity << ", the synthetic task)";
  }
  const std::vector<std::string> all = comm.all_gather_if_different(identity.str());
  if (all.empty()) return;
  std::ostringstream message;
  message << "the ranks read different " << split << " data: rank 0 reads " << all[0];
  for (size_t rank = 1; rank < all.size(); ++rank) {
    if (all[rank] != all[0]) message << ", rank " << rank << " " << all[rank];
  }
  message << "; every rank must read the same data.dir " << data_dir
          << " (a relative path from different working directories, or a shared filesystem "
             "that has not caught up?)";
  throw AllRanksError(message.str(), 3);
}

RankFailure failure_of(const std::exception& error) {
  if (const auto* everyone = dynamic_cast<const AllRanksError*>(&error)) {
    return RankFailure{everyone->exit_code(), everyone->what(), everyone->where()};
  }
  const int code = dynamic_cast<const DataError*>(&error) != nullptr            ? 3
                   : dynamic_cast<const ConfigurationError*>(&error) != nullptr ? 2
                                                                                 : 1;
  return RankFailure::here(code, failure_message(error));
}

void read_the_checkpoint_rank_zero_chose(const Communicator& comm, const std::string& path,
                                         Checkpoint* checkpoint) {
  const int64_t step = comm.broadcast_from_root(checkpoint->step);
  RankFailure failure;
  if (!comm.is_root()) {
    try {
      *checkpoint = read_checkpoint(path);
      if (checkpoint->step != step) {
        THPC_FAIL("checkpoint " << path << ": holds step " << checkpoint->step
                                << ", rank 0 read step " << step);
      }
    } catch (const Error& error) {
      failure = RankFailure::here(1, error.what());
    }
  }
  if (const std::optional<JobFailure> failed = gather_failures(comm, failure)) {
    std::ostringstream each;
    for (size_t i = 0; i < failed->ranks.size(); ++i) {
      each << "; rank " << failed->ranks[i] << ": " << failed->messages[i];
    }
    throw AllRanksError("rank 0 resumes from " + path + " (step " + std::to_string(step) +
                        ") but not every rank can read it (a shared filesystem that has not "
                        "caught up?)" + each.str());
  }
}

void check_every_rank_starts_from_the_same_parameters(const Communicator& comm,
                                                      const std::string& digest,
                                                      const std::string& source) {
  if (comm.size() == 1) return;
  // Each rank read checkpoint.init (or the checkpoint to resume) itself: the same path can
  // name different files (working directories, node-local disks). Ranks that start apart
  // never agree again; found here, not as a check failure at the end.
  const std::vector<std::string> digests = comm.all_gather(digest);
  std::ostringstream differing;
  for (size_t rank = 1; rank < digests.size(); ++rank) {
    if (digests[rank] != digests[0]) differing << (differing.str().empty() ? "" : ", ") << rank;
  }
  if (differing.str().empty()) return;
  throw AllRanksError("the ranks start from different parameters: rank " + differing.str() +
                      " read other values than rank 0 from " + source +
                      " (the same path names different files for them?); every rank must "
                      "read the same file");
}

}  // namespace thpc
