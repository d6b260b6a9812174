#include "distributed/rank_failures.h"

#include "common/error.h"

namespace thpc {

RankFailure RankFailure::here(int exit_code, const std::string& message) {
  return {exit_code, message, process_identity()};
}

RankFailure RankFailure::for_the_job(int exit_code, const std::string& message) {
  return {exit_code, message, ""};
}

std::optional<JobFailure> gather_failures(const Communicator& comm, const RankFailure& mine) {
  // "CODE\nWHERE\nMESSAGE" for a failure, "" for none (a message may hold line breaks: it
  // is the last field).
  const std::string packed =
      mine.exit_code == 0
          ? std::string()
          : std::to_string(mine.exit_code) + "\n" + mine.where + "\n" + mine.message;
  std::optional<JobFailure> failure;
  const std::vector<std::string> all = comm.all_gather(packed);
  for (size_t rank = 0; rank < all.size(); ++rank) {
    if (all[rank].empty()) continue;
    const size_t first = all[rank].find('\n');
    const size_t second = all[rank].find('\n', first + 1);
    const RankFailure theirs{std::stoi(all[rank].substr(0, first)),
                             all[rank].substr(second + 1),
                             all[rank].substr(first + 1, second - first - 1)};
    if (!failure) failure = JobFailure{theirs.exit_code, theirs.message, theirs.where, {}, {}};
    failure->ranks.push_back(static_cast<int>(rank));
    failure->messages.push_back(theirs.message);
  }
  if (!failure) return failure;
  // Every rank failing with one message (a data.dir missing everywhere) is the job's
  // failure: said once, without naming a rank.
  bool alike = failure->ranks.size() == all.size();
  for (const std::string& message : failure->messages) alike = alike && message == failure->message;
  if (alike) failure->where.clear();
  return failure;
}

void throw_if_any_rank_failed(const Communicator& comm, const RankFailure& mine) {
  if (const std::optional<JobFailure> failure = gather_failures(comm, mine)) {
    throw AllRanksError(failure->message, failure->exit_code, failure->where);
  }
}

}  // namespace thpc
