#!/usr/bin/env bash
# The project's shell scripts (jobs/, tools/, bench/, tests/ and .ci/run) pass shellcheck
# at its warning level, following the files they source (-x): what bash takes without a
# word and a user meets as a job that misbehaves (a variable never set, an array read as
# its first element, a trap's command expanded when set, `rm -rf "$dir/x"` with dir
# empty). Its "info" and "style" notes are not asked for: its unquoted expansions there
# were all deliberate word splitting (a list of pids, MPIRUN's words) when it came.
#
#   tests/shellcheck_test.sh SOURCE_DIR BINARY_DIR      (ctest runs it)
source "$(dirname "${BASH_SOURCE[0]}")/shell_test_lib.sh" "$@" || exit 1
require_programs "tools/install_deps.sh installs shellcheck" shellcheck
cd "$source_dir" || fail "cd $source_dir"
scripts=(.ci/run)
for directory in jobs tools bench tests; do
  for script in "$directory"/*.sh "$directory"/*.sbatch; do
    [ -f "$script" ] && scripts+=("$script")
  done
done
[ "${#scripts[@]}" -gt 20 ] || fail "only ${#scripts[@]} scripts found in $source_dir"
shellcheck --external-sources --source-path=SCRIPTDIR --shell=bash --severity=warning \
  "${scripts[@]}" || fail "shellcheck's warnings above, in ${#scripts[@]} scripts"
echo "PASSED: ${#scripts[@]} scripts"
