#include "common/error.h"

#include <unistd.h>

#include <climits>

namespace thpc {
namespace {
int g_rank = 0;
}

void set_process_rank(int rank) { g_rank = rank; }

std::string process_identity() {
  char host[HOST_NAME_MAX + 1] = {0};
  if (gethostname(host, sizeof(host) - 1) != 0) host[0] = '?';
  std::ostringstream out;
  out << "rank " << g_rank << " on " << host;
  return out.str();
}

void throw_check_failure(const char* expression, const char* file, int line,
                         const std::string& detail) {
  std::ostringstream out;
  out << "check failed: " << expression << " at " << file << ":" << line << " ("
      << process_identity() << ")";
  if (!detail.empty()) out << ": " << detail;
  throw Error(out.str());
}

}  // namespace thpc
