#!/usr/bin/env bash
# `cmake --install` into a scratch prefix, then the installation used without the
# repository or its build (PATH without either): jobs/run_local.sh of
# PREFIX/share/transformer_hpc trains input/tiny.ini with PREFIX/bin/transformer_hpc,
# writing runs/ in the caller's directory (not in the prefix), and tools/evaluate.sh
# there finds PREFIX/bin's decoder. Before, neither script was installed: a Spack
# installation could not run a job without a clone of the repository.
#
#   tests/install_test.sh SOURCE_DIR BINARY_DIR      (ctest runs it)
source "$(dirname "${BASH_SOURCE[0]}")/shell_test_lib.sh" "$@" || exit 1
require_programs "tools/install_deps.sh installs openmpi-bin" mpirun
scratch_directory install_test
prefix=$tmp/prefix
cmake --install "$binary_dir" --prefix "$prefix" > "$tmp/install.log" 2>&1 ||
  { status=$?; cat "$tmp/install.log"; fail "cmake --install exited $status"; }
share=$prefix/share/transformer_hpc
for file in bin/transformer_hpc bin/transformer_decode share/transformer_hpc/input/tiny.ini \
            share/transformer_hpc/jobs/common.sh share/transformer_hpc/jobs/run_local.sh \
            share/transformer_hpc/jobs/base.sbatch share/transformer_hpc/tools/evaluate.sh; do
  [ -e "$prefix/$file" ] || fail "$file is not installed"
done
[ -x "$share/jobs/run_local.sh" ] || fail "jobs/run_local.sh is installed without its x bit"

# A caller elsewhere, with a PATH that holds neither the repository nor the build.
mkdir -p "$tmp/work"
cd "$tmp/work" || fail "cd"
clean_path=/usr/local/bin:/usr/bin:/bin
# (A relative path among the options is the caller's too: train.metrics_dir here.)
env -u THPC_ROOT -u THPC_BUILD PATH=$clean_path THPC_RUN_NAME=installed \
  "$share/jobs/run_local.sh" 1 input/tiny.ini --train.max_steps=2 --train.backend=cpu \
  --train.metrics_dir=metrics_here > "$tmp/run.log" 2>&1 ||
  { status=$?; cat "$tmp/run.log"; fail "the installed run_local.sh exited $status"; }
grep -Eq "thpc: (setpriv --pdeathsig USR1 )?mpirun .* $prefix/bin/transformer_hpc " \
  "$tmp/run.log" ||
  { cat "$tmp/run.log"; fail "the installed job did not run $prefix/bin/transformer_hpc"; }
grep -q "^final: step=2 " "$tmp/run.log" || { cat "$tmp/run.log"; fail "no 2 steps trained"; }
[ -f "$tmp/work/runs/installed/checkpoints/step_00000002.h5" ] ||
  fail "no checkpoint in the caller's runs/installed: $(find "$tmp" -name 'step_*.h5')"
[ -e "$share/runs" ] && fail "the job wrote runs/ into the installation"
[ -f "$tmp/work/metrics_here/metrics.jsonl" ] ||
  fail "a relative train.metrics_dir was not the caller's: $(find "$tmp" -name metrics.jsonl)"

# tools/evaluate.sh of the installation finds PREFIX/bin's programs: its refusal of a
# missing source file comes after that lookup (no data is needed for it).
missing=$(env -u THPC_BUILD -u BUILD PATH=$clean_path \
  bash "$share/tools/evaluate.sh" runs/installed/checkpoints none.en none.de 2>&1) &&
  fail "evaluate.sh of missing files succeeded"
grep -q "evaluate.sh: no such file: none.en" <<< "$missing" ||
  fail "the installed evaluate.sh did not find its programs: $missing"
echo "PASSED"
