# What the shell tests (tests/*_test.sh, run by ctest as `bash TEST SOURCE_DIR BINARY_DIR`)
# share, sourced as their first line:
#
#   source "$(dirname "${BASH_SOURCE[0]}")/shell_test_lib.sh" "$@" || exit 1
#
# It sets source_dir and binary_dir (absolute), defines fail (exit 1) and skip (exit 77,
# ctest's SKIP_RETURN_CODE for these tests, with the reason), require_programs and
# scratch_directory, and turns on `set -uo pipefail` (not -e: each test says which
# command failed and shows its log).
# shellcheck disable=SC2034  # (source_dir, binary_dir: the tests that source this file use them)
set -uo pipefail
source_dir=$(cd "$1" && pwd) || { echo "FAILED: no source directory '$1'"; exit 1; }
binary_dir=$(cd "$2" && pwd) || { echo "FAILED: no binary directory '$2'"; exit 1; }

fail() {
  echo "FAILED: $*"
  exit 1
}
skip() {
  echo "SKIPPED: $*"
  exit 77
}

# require_programs HINT PROGRAM...: skip, naming the first missing program and HINT (what
# installs it), unless every PROGRAM is on PATH.
require_programs() {
  local hint=$1 program
  shift
  for program in "$@"; do
    command -v "$program" >/dev/null || skip "$program is not installed ($hint)"
  done
}

# scratch_directory NAME: tmp=a new /tmp/thpc_NAME.XXXXXX, removed when the test exits
# (a test with daemons to stop sets its own EXIT trap instead, after this).
scratch_directory() {
  tmp=$(mktemp -d "/tmp/thpc_$1.XXXXXX") || fail "mktemp"
  trap 'rm -rf "$tmp"' EXIT
}
