#!/bin/bash
# The job scripts' run without Slurm: RANKS ranks under mpirun on this machine, checkpoints
# in runs/NAME/checkpoints, checkpoint.resume=auto, and SIGUSR1 or SIGTERM to this script
# forwarded to every rank (checkpoint and stop, exit 0).
#   jobs/run_local.sh RANKS CONFIG [trainer options]      (from anywhere: runs/ is the
#       repository's; the relative paths in the repository's configs are the repository's,
#       those in a config of yours, and the options', are read from where you stand)
#   jobs/run_local.sh 2 input/tiny.ini --train.max_steps=200
#   THPC_RUN_NAME=mine jobs/run_local.sh 2 input/tiny.ini   # run again: resumes runs/mine
set -uo pipefail
if [ $# -lt 2 ]; then
  echo "usage: jobs/run_local.sh RANKS CONFIG [trainer options]" >&2
  exit 2
fi
if [[ ! $1 =~ ^[1-9][0-9]*$ ]]; then
  echo "jobs/run_local.sh: RANKS must be a number of ranks (1, 2, ...), not '$1'" >&2
  exit 2
fi
export THPC_RANKS=$1 THPC_LAUNCHER=mpirun
shift
# (As the sbatch scripts: a THPC_ROOT without jobs/common.sh is said, not "thpc_train:
# command not found".)
thpc_root_here=${THPC_ROOT:-$(cd "$(dirname "$0")/.." && pwd)}
source "$thpc_root_here/jobs/common.sh" || {
  echo "jobs/run_local.sh: no jobs/common.sh in $thpc_root_here: set THPC_ROOT to the" \
       "repository, or unset it" >&2
  exit 2
}
thpc_train "$@"
