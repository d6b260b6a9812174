# What every job script of jobs/ does, sourced by them (bash), so that the four of them
# differ only in their #SBATCH lines and the trainer options of their model:
#
#   thpc_train CONFIG [trainer options...]
#   thpc_train_averaged CONFIG MAX_STEPS LAST EVERY [trainer options...]
#                                   (base and big: the paper's averaged window, below)
#
# runs build/transformer_hpc CONFIG on the job's ranks, with checkpoints in the job's run
# directory and checkpoint.resume=auto, and turns Slurm's warning signal into a
# checkpoint and a requeue:
#
#   1. Slurm sends SIGUSR1 to this batch shell (#SBATCH --signal=B:USR1@300: 300 s before
#      the time limit; or `scancel --batch --signal=USR1 JOBID` by hand). Without B:,
#      Slurm signals job steps only, and ranks started by mpirun inside the batch step
#      never hear of it.
#   2. The trap forwards it as SIGUSR1 to the launcher, which passes it to every rank
#      (mpirun and srun both forward SIGUSR1; mpirun would answer SIGTERM by killing the
#      ranks a second later, hence USR1 whatever the shell got). A SIGTERM to this shell is
#      forwarded the same way, so the shell itself never dies of it.
#   3. The trainer finishes its step, rank 0 writes the checkpoint, every rank exits 0.
#   4. This script sees a stop signal and a clean exit: `scontrol requeue $SLURM_JOB_ID`.
#      The job goes back to the queue under the same id, runs again in the same run
#      directory and resumes from the checkpoint; the log is appended to
#      (#SBATCH --open-mode=append). A job that ends without a signal is done: exit 0.
#   A SIGTERM with which Slurm itself ends the job (a plain `scancel`; `scontrol requeue`
#   or a preemption, which requeue it themselves) still has the ranks checkpoint, but is
#   not requeued by this script: it asks Slurm why (thpc_why_slurm_ends) and says so.
#   A stop sent to the ranks and not to this shell (under srun, `scancel --signal=USR1
#   JOBID` without --batch, or an #SBATCH --signal without B:) is read from the trainer's
#   summary record (metrics.jsonl, "ended": "stopped": thpc_recorded_end) and requeued
#   the same way; so is one that came during their start-up, which leaves no summary:
#   rank 0 then writes the signal's name to the file THPC_STARTUP_STOP_FILE names.
#
# Exit codes the batch system sees: 0 finished, or checkpointed and requeued (outside a
# batch job: checkpointed and stopped); 1 checkpointed and not requeued: cancelled
# (scancel), or `scontrol requeue` failed (submit it again with THPC_RUN_NAME); otherwise
# the trainer's (docs/running.md "Exit codes": 1 a runtime failure, 2 a bad configuration,
# 3 bad data), and the job ends FAILED without a requeue, since running it again would
# fail again.
#
# Settings (environment variables; sbatch passes the submitting shell's environment):
#   THPC_ROOT      the repository, or an installation's PREFIX/share/transformer_hpc
#                  (default: the one this file is in; the job scripts source it from
#                  the directory sbatch was called from)
#   THPC_BUILD     the directory holding transformer_hpc (default: $THPC_ROOT/build; for
#                  an installation, its PREFIX/bin; else the one on PATH)
#   THPC_RUN_NAME  the run directory runs/NAME (default: JOBNAME-JOBID, so every job has
#                  its own checkpoints and a requeued job finds its own again). Give
#                  the name of an earlier run to continue it in a new job (one folder
#                  under runs/: a name with "/" is refused). runs/ is in the job's
#                  directory: sbatch --chdir's, else the one sbatch is called from.
#   THPC_LAUNCHER  how the ranks are started:
#                    mpirun (default): Open MPI's mpirun inside the batch step. Works
#                      wherever Open MPI does, whatever Slurm's MPI plugins (Debian's
#                      packages, MpiDefault=none).
#                    srun: `srun --mpi=pmix`, Slurm starts the ranks as a job step. Needs
#                      Slurm's PMIx plugin (`srun --mpi=list` lists pmix) and an Open MPI
#                      built against the same PMIx; it is the choice where the site
#                      supports it (the Spack.yaml Open MPI is built with
#                      schedulers=slurm), since Slurm then tracks and binds every rank.
#   THPC_MPIRUN_OPTIONS, THPC_SRUN_OPTIONS  extra options for the launcher (GPU binding,
#                  e.g. THPC_SRUN_OPTIONS="--gpus-per-task=1 --gpu-bind=single:1").

# The folder above jobs/, wherever the caller stands (jobs/run_local.sh from elsewhere
# looked for build/ in its working directory).
thpc_root=${THPC_ROOT:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}
# The programs: THPC_BUILD, else the repository's build/, else, for the installed copy of
# this file (PREFIX/share/transformer_hpc/jobs), PREFIX/bin, else those on PATH (a Spack
# or `cmake --install` prefix: `spack load transformer-hpc`).
if [ -n "${THPC_BUILD:-}" ]; then
  thpc_build=$THPC_BUILD
elif [ ! -x "$thpc_root/build/transformer_hpc" ] &&
     [ -x "$thpc_root/../../bin/transformer_hpc" ]; then
  thpc_build=$(cd "$thpc_root/../../bin" && pwd)
elif [ ! -x "$thpc_root/build/transformer_hpc" ] && command -v transformer_hpc > /dev/null; then
  # Absolute: thpc_train moves to the repository before it runs the program.
  thpc_build=$(cd "$(dirname "$(command -v transformer_hpc)")" && pwd)
else
  thpc_build=$thpc_root/build
fi
# Where runs/ goes without Slurm: the repository's, or, for an installed copy (no
# CMakeLists.txt beside jobs/: a prefix that may not be writable), the caller's directory.
if [ -f "$thpc_root/CMakeLists.txt" ]; then
  thpc_runs_base=$thpc_root
else
  thpc_runs_base=$PWD
fi
# Where the job started: sbatch's --chdir, else the directory sbatch was called from (a
# batch shell starts there). Slurm writes the job's log there (--output=%x-%j.out), and
# runs/ goes beside it. Taken now: thpc_train moves to the repository.
thpc_job_dir=$PWD
thpc_stop_signal=""  # the stop signal this shell received, if any
thpc_slurm_ends=""   # on a SIGTERM: cancelled | requeued when Slurm itself is ending the job
thpc_requeued=0      # this job asked Slurm to requeue it
thpc_trapped=0       # a stop signal arrived during the current `wait`
thpc_launcher_pid=""
thpc_run_name=""     # the run directory's name, once thpc_train has made it
thpc_checkpoints_dir=""  # and the trainer's checkpoint.dir there (or the options')
thpc_own_checkpoints_dir=""  # the options' checkpoint.dir, if they give one
thpc_phase=""        # "phase 1" while thpc_train_averaged runs its first phase
# Taken from here on, not from the launch: a signal before it (the batch shell's first
# moments, a phase's checks) ended the shell, exit 138, and the job FAILED.
trap 'thpc_forward_stop USR1' USR1
trap 'thpc_forward_stop TERM' TERM
# Ctrl-C in a terminal (jobs/run_local.sh, a script run inside salloc): the same stop. The
# terminal sends SIGINT to mpirun and the ranks too, which mpirun answers with exit 1.
trap 'thpc_forward_stop INT' INT
# A closed terminal (jobs/run_local.sh, a script in a terminal's salloc) or `kill -HUP`: the
# trainer stops at SIGHUP as at the others, and the script too (before: exit 129 without a
# closing line, while the ranks checkpointed; a helper's trial).
trap 'thpc_forward_stop HUP' HUP

# The run directory of this job (created): runs/NAME in the job's directory under Slurm
# (sbatch --chdir's, else the submission directory: before, the submission directory's
# whatever --chdir said, apart from the job's log), else in the repository (an installed
# copy: the caller's directory), or SLURM_SUBMIT_DIR's when set without a job.
# A job's name is any text (sbatch -J exp/a): its '/' made the folder runs/exp/a-ID, which
# THPC_RUN_NAME=a-ID, as the messages give it, did not find (a fresh run from step 0), and
# -J ../../x wrote outside runs/ (a helper's walk): one folder, each '/' as '_'.
thpc_run_dir() {
  local job_name=${SLURM_JOB_NAME:-thpc}
  job_name=${job_name//\//_}
  local name=${THPC_RUN_NAME:-$job_name-${SLURM_JOB_ID:-local-$$}}
  local base=${SLURM_SUBMIT_DIR:-$thpc_runs_base}
  [ -n "${SLURM_JOB_ID:-}" ] && base=$thpc_job_dir
  local dir=$base/runs/$name
  mkdir -p "$dir"
  echo "$dir"
}

# Whether the launcher of the ranks (thpc_launcher_pid) still runs: known by its command
# line, as its pid may be another process's once bash has reaped it.
thpc_launcher_runs() {
  ps -o args= -p "$thpc_launcher_pid" 2> /dev/null | grep -q transformer_hpc
}

# True when the trainer options ("$@" after KEY) set KEY, as --KEY=VALUE or --KEY VALUE
# (the trainer takes both): the trainer refuses a key given twice, so a script's default
# for KEY must give way to the user's.
thpc_given() {
  thpc_option_value "$@" > /dev/null
}

# The value the trainer options ("$@" after KEY) give KEY (--KEY=VALUE or --KEY VALUE; ""
# for a last --KEY without one), on standard output; status 1 when they do not give KEY.
thpc_option_value() {
  local key=$1
  shift
  while [ $# -gt 0 ]; do
    case $1 in
      --"$key"=*) echo "${1#*=}"; return 0 ;;
      --"$key") echo "${2:-}"; return 0 ;;
    esac
    shift
  done
  return 1
}

# Whether METRICS (metrics.jsonl) has more than its first LINES lines: records written
# since the launch.
thpc_records_since() {
  [ -f "$1" ] && [ "$(wc -l < "$1")" -gt "$2" ]
}

# "ENDED STEP [SIGNAL]" ("stopped 345 SIGUSR1", "finished 70") when the last record of
# METRICS (metrics.jsonl), written after the file's first LINES lines, is the trainer's
# summary: how its run ended ("ended": finished, time_limit, patience, stopped with its
# "stop_signal", diverged) at that step; status 1 otherwise (it wrote none).
# How this shell learns of a stop its ranks were sent and it was not (`scancel
# --signal=USR1 JOBID` without --batch, or an #SBATCH --signal without B:, reach srun's
# ranks only, which checkpoint and exit 0, and the job ended COMPLETED, unfinished), and
# of a run that had ended on its own when a stop came.
thpc_recorded_end() {
  local metrics=$1 lines=$2 last ended step signal
  thpc_records_since "$metrics" "$lines" || return 1
  last=$(tail -n 1 "$metrics")
  [[ $last == '{"kind": "summary",'* ]] || return 1
  ended=$(sed -n 's/.*"ended": "\([a-z_]*\)".*/\1/p' <<< "$last")
  step=$(sed -n 's/^{"kind": "summary", "step": \([0-9]*\),.*/\1/p' <<< "$last")
  signal=$(sed -n 's/.*"stop_signal": "\([A-Z0-9]*\)".*/\1/p' <<< "$last")
  [ -n "$ended" ] && [ -n "$step" ] || return 1
  echo "$ended $step${signal:+ $signal}"
}

# The value CONFIG's ini gives SECTION.KEY (a line "key = value" under [section], or
# "section.key = value" before any section; a trailing " # comment" cut), on standard
# output; status 1 when it sets none. What the trainer reads there, for a script's default
# that would replace it.
thpc_config_value() {
  local name=$1 config=$2
  [ -f "$config" ] || return 1
  # A UTF-8 byte-order mark opening the file (Windows Notepad's) is skipped, as the trainer
  # skips it: read as text, it hid the first [section], and a config's checkpoint.resume
  # went unseen. (length(bom) is 1 in gawk's UTF-8 locale, 3 bytes in mawk.)
  awk -v section="${name%%.*}" -v key="${name#*.}" -v bom="$(printf '\357\273\277')" '
    NR == 1 && index($0, bom) == 1 { $0 = substr($0, length(bom) + 1) }
    { sub(/\r$/, ""); line = $0; sub(/^[ \t]+/, "", line) }
    line == "" || line ~ /^[#;]/ { next }
    line ~ /^\[/ {
      current = line; sub(/^\[[ \t]*/, "", current); sub(/[ \t]*\].*$/, "", current); next
    }
    {
      name = line; sub(/[ \t]*=.*$/, "", name)
      value = line; if (!sub(/^[^=]*=/, "", value)) next
      # As the trainer reads it: a comment from the first '#' on, then the spaces around.
      sub(/#.*$/, "", value); sub(/^[ \t]+/, "", value); sub(/[ \t]+$/, "", value)
      if ((current == section && name == key) || (current == "" && name == section "." key)) {
        found = value; seen = 1
      }
    }
    END { if (!seen) exit 1; print found }' "$config"
}

thpc_forward_stop() {
  thpc_stop_signal=$1
  thpc_trapped=1
  echo "thpc: $1 received, asking the ranks to checkpoint and stop (SIGUSR1 to the launcher)"
  [ -n "$thpc_launcher_pid" ] && kill -USR1 "$thpc_launcher_pid" 2>/dev/null
  [ "$1" = TERM ] && [ -z "$thpc_slurm_ends" ] && thpc_slurm_ends=$(thpc_why_slurm_ends)
  return 0
}

# What a new job needs to continue this one's run: "THPC_RUN_NAME=NAME", and the job's
# directory when it is not where sbatch was called (--chdir), as a plain resubmission
# would look for runs/ there.
# A checkpoint.dir of the user's own (the job's options) is named too: THPC_RUN_NAME alone
# looked in runs/NAME/checkpoints, found none and was refused (a helper's trial). A name
# the shell would split is quoted.
thpc_continue_with() {
  local name=${thpc_run_name:-NAME}
  [[ $name =~ ^[A-Za-z0-9._+-]+$ ]] || name=$(printf '%q' "$name")
  local with="THPC_RUN_NAME=$name"
  [ "$thpc_job_dir" != "${SLURM_SUBMIT_DIR:-$thpc_job_dir}" ] &&
    with+=" and sbatch --chdir=$thpc_job_dir"
  [ -n "$thpc_own_checkpoints_dir" ] &&
    with+=" with --checkpoint.dir=$(printf '%q' "$thpc_own_checkpoints_dir")"
  echo "$with"
}

# Whether this is a Slurm batch job, which can be requeued: not an interactive allocation
# (salloc, srun), whose SLURM_JOB_ID a script run inside it also has; there `scontrol
# requeue` failed ("Only batch jobs are accepted") and the stop was said to be a failure.
# sbatch's ENVIRONMENT=BATCH, else the job's BatchFlag.
thpc_batch_job() {
  [ -n "${SLURM_JOB_ID:-}" ] || return 1
  [ "${ENVIRONMENT:-}" = BATCH ] && return 0
  scontrol show job -o "$(thpc_slurm_job)" 2> /dev/null | head -n 1 | grep -q '\bBatchFlag=1\b'
}

# How Slurm's commands name this job: ARRAYID_TASK for a task of a job array, whose
# SLURM_JOB_ID is, for one of its tasks, the array's own id: `scontrol requeue` of it
# requeued every task of the array, and `scontrol show job` printed them all.
thpc_slurm_job() {
  if [ -n "${SLURM_ARRAY_TASK_ID:-}" ] && [ -n "${SLURM_ARRAY_JOB_ID:-}" ]; then
    echo "${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}"
  else
    echo "$SLURM_JOB_ID"
  fi
}

# Why Slurm sends this job SIGTERM, asked at once (the job is COMPLETING then, for
# KillWait seconds): "cancelled" for `scancel` (Reason None), "requeued" when Slurm puts it
# back in the queue itself (`scontrol requeue` by hand, a preemption that requeues: its
# Restarts count is already up; "requeued_held" for `scontrol requeuehold`), "" otherwise
# (its time limit, which the job script answers with a requeue; a SIGTERM from elsewhere;
# no Slurm). Before, a plain `scancel`
# under srun was taken for a warning and the job requeued itself and trained on, and a
# requeue by hand was said to have failed.
thpc_why_slurm_ends() {
  [ -n "${SLURM_JOB_ID:-}" ] || return 0
  local job
  job=$(scontrol show job -o "$(thpc_slurm_job)" 2> /dev/null | head -n 1) || return 0
  local state reason restarts
  state=$(sed -n 's/.*\bJobState=\([^ ]*\).*/\1/p' <<< "$job")
  reason=$(sed -n 's/.*\bReason=\([^ ]*\).*/\1/p' <<< "$job")
  restarts=$(sed -n 's/.*\bRestarts=\([0-9]*\).*/\1/p' <<< "$job")
  case $state in COMPLETING|CANCELLED|PENDING|REQUEUE*) ;; *) return 0 ;; esac
  if [ "${restarts:-0}" -gt "${SLURM_RESTART_COUNT:-0}" ]; then
    case $state$reason in *[Hh]eld*|*HOLD*) echo requeued_held ;; *) echo requeued ;; esac
  elif [ "$reason" = None ] || [ "$state" = CANCELLED ]; then
    echo cancelled
  fi
}

# The launcher command for the job's ranks, in the array thpc_launch_command.
thpc_launch_command_for() {
  local ranks=${THPC_RANKS:-${SLURM_NTASKS:-1}}
  case ${THPC_LAUNCHER:-mpirun} in
    mpirun)
      if [ "$(id -u)" = 0 ]; then
        # Open MPI refuses root unless told twice (containers, test clusters).
        export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
      fi
      # --bind-to none leaves the data reader's and the BLAS threads free; mpirun reads
      # the allocation (nodes, tasks per node) from Slurm.
      # shellcheck disable=SC2206
      thpc_launch_command=(mpirun -np "$ranks" --bind-to none ${THPC_MPIRUN_OPTIONS:-}) ;;
    srun)
      # shellcheck disable=SC2206
      thpc_launch_command=(srun --mpi=pmix --kill-on-bad-exit=1 ${THPC_SRUN_OPTIONS:-}) ;;
    *)
      echo "thpc: THPC_LAUNCHER must be mpirun or srun, not '$THPC_LAUNCHER'" >&2
      return 2 ;;
  esac
  # The batch shell killed (`scancel --batch JOBID` sends SIGKILL, which no trap takes):
  # under proctrack/linuxproc (Debian's default) mpirun and its ranks outlived it and
  # trained on outside Slurm, holding the node. The launcher gets SIGUSR1 when this shell
  # dies, as from the trap: the ranks checkpoint and stop. (util-linux's setpriv, 2.33 and
  # later; without it, as before.)
  if setpriv --help 2> /dev/null | grep -q -- --pdeathsig; then
    thpc_launch_command=(setpriv --pdeathsig USR1 "${thpc_launch_command[@]}")
  fi
}

thpc_train() {
  local config=$1 given=$1 called_from=$PWD
  shift
  # The repository's configs (input/...) name their files relative to the repository
  # (data.dir = build/...): with one of them the job moves there, from wherever it was
  # started. A config of the caller's own, outside the repository, names them relative to
  # where the caller stands, as the trainer run by hand reads them: there the job stays,
  # and the options' relative paths are the caller's too (it moved, and `data.dir = data`
  # beside the config was looked up in the repository: refused, or another corpus
  # trained on). An installation's copy stays where it is called from, as its runs/ is;
  # its input/... is the prefix's.
  [[ $config != /* && -f $config ]] && config=$PWD/$config
  # Under sbatch --chdir the job starts elsewhere than where sbatch was called, from which
  # the user gave the path (it was refused, "give its path from the directory sbatch is
  # called in").
  local submitted=${SLURM_SUBMIT_DIR:-$PWD}
  if [[ $config != /* && $submitted != "$PWD" && -f $submitted/$config ]]; then
    config=$submitted/$config
  fi
  if [ "$thpc_runs_base" = "$thpc_root" ]; then
    if [[ $config != /* || $config == "$thpc_root"/* ]]; then
      cd "$thpc_root" || return 1
    fi
  elif [[ $config != /* && -f $thpc_root/$config ]]; then
    config=$thpc_root/$config
  fi
  # Before the run directory is made: mpirun's own words for it were "could not access or
  # execute an executable", then "the trainer failed (exit 132)".
  if [ ! -x "$thpc_build/transformer_hpc" ]; then
    echo "thpc: no program $thpc_build/transformer_hpc: build it (README), or set THPC_BUILD" \
         "to the folder that holds it (an installed PREFIX/bin)" >&2
    return 1
  fi
  # A config that is not there, said before the launcher starts (the trainer's words came
  # after mpirun's banner, naming the path as given, from the directory the job had moved
  # to).
  if [ ! -f "$config" ]; then
    local places=$called_from
    [ "$submitted" != "$called_from" ] && places+=", $submitted"
    echo "thpc: no config file $given in $places${thpc_root:+ nor in $thpc_root}: give" \
         "its path from the directory sbatch is called in, or an absolute one (the" \
         "repository's own are input/*.ini)" >&2
    return 2
  fi
  # A checkpoint the config resumes from would be replaced by the job's own newest
  # (resume=auto, so that a requeued job continues itself): the job trained from step 0,
  # exit 0, without a word. Said before anything starts.
  local configured
  if ! thpc_given checkpoint.resume "$@" &&
     configured=$(thpc_config_value checkpoint.resume "$config") &&
     [ -n "$configured" ] && [ "$configured" != auto ] && [ "$configured" != auto_or_fresh ]; then
    echo "thpc: $config sets checkpoint.resume = $configured, which a job replaces by its" \
         "run directory's newest checkpoint (checkpoint.resume=auto, so that a requeued job" \
         "continues itself): remove it from $config, then set THPC_RUN_NAME to the name of" \
         "the run that wrote it to continue that run, or give" \
         "--checkpoint.init=$configured to start from its parameters; or keep it and give" \
         "--checkpoint.resume=$configured (the job starts there, a requeue continues its" \
         "own newest checkpoint)" >&2
    return 2
  fi
  # The launcher first: a THPC_LAUNCHER it refuses left an empty run directory behind.
  thpc_launch_command_for || return $?
  # A run's name is one folder under runs/: THPC_RUN_NAME=../../x wrote outside runs/
  # without a word (a helper's Slurm trial), and the job's messages give back the last
  # part alone to continue a run.
  case ${THPC_RUN_NAME:-} in
    */* | . | ..)
      echo "thpc: THPC_RUN_NAME=$THPC_RUN_NAME: a run's name is one folder under runs/," \
           "without '/': give that folder's name alone, as the job's messages print it" >&2
      return 2 ;;
  esac
  local run_dir
  run_dir=$(thpc_run_dir)
  thpc_run_name=${run_dir##*/}
  local trainer=("$thpc_build/transformer_hpc" "$config")
  local key
  for key in checkpoint.dir train.metrics_dir; do
    if ! thpc_given "$key" "$@" && configured=$(thpc_config_value "$key" "$config") &&
       [ -n "$configured" ]; then
      echo "thpc: note: $config sets $key = $configured; the job's run directory" \
           "$run_dir takes its place (give $(printf '%q' "--$key=$configured") to keep it)"
    fi
  done
  thpc_given checkpoint.dir "$@" || trainer+=("--checkpoint.dir=$run_dir/checkpoints")
  if thpc_own_checkpoints_dir=$(thpc_option_value checkpoint.dir "$@"); then
    thpc_checkpoints_dir=$thpc_own_checkpoints_dir
  else
    thpc_own_checkpoints_dir=""
    thpc_checkpoints_dir=$run_dir/checkpoints
  fi
  # The run directory holds the metrics and TensorBoard events beside checkpoints/ (the
  # trainer's own default is checkpoint.dir itself).
  thpc_given train.metrics_dir "$@" || trainer+=("--train.metrics_dir=$run_dir")
  # Where the trainer writes metrics.jsonl: the run directory, a train.metrics_dir given,
  # or, given empty, checkpoint.dir (the trainer's default; it was looked for in /: a
  # reviewer's finding).
  local metrics_dir
  metrics_dir=$(thpc_option_value train.metrics_dir "$@") || metrics_dir=$run_dir
  [ -n "$metrics_dir" ] || metrics_dir=$thpc_checkpoints_dir
  local metrics=$metrics_dir/metrics.jsonl
  thpc_given checkpoint.resume "$@" || trainer+=(--checkpoint.resume=auto)
  # A --checkpoint.resume=FILE of another directory starts the job there; once the job's
  # own checkpoint directory holds checkpoints (a requeue, thpc_train_averaged's phase 2)
  # it continues their newest instead: FILE again would start over and abandon them, which
  # the trainer refuses (before 2026-12-07 it marked them superseded and trained again).
  local given_resume own_newest
  if given_resume=$(thpc_option_value checkpoint.resume "$@") &&
     [ -n "$given_resume" ] && [ "$given_resume" != auto ] &&
     [ "$given_resume" != auto_or_fresh ] && [ -d "$thpc_checkpoints_dir" ] &&
     [ "$(cd "$(dirname -- "$given_resume")" 2>/dev/null && pwd -P)" != \
       "$(cd "$thpc_checkpoints_dir" && pwd -P)" ] &&
     own_newest=$(compgen -G "$thpc_checkpoints_dir/step_*.h5" | sort | tail -n 1) &&
     [ -n "$own_newest" ]; then
    echo "thpc: $thpc_checkpoints_dir holds this job's checkpoints (${own_newest##*/}):" \
         "continuing its newest (checkpoint.resume=auto) rather than $given_resume again"
    local without_resume=() skip_value=0 argument
    for argument in "$@"; do
      if [ "$skip_value" = 1 ]; then skip_value=0; continue; fi
      case $argument in
        --checkpoint.resume=*) continue ;;
        --checkpoint.resume) skip_value=1; continue ;;
      esac
      without_resume+=("$argument")
    done
    set -- ${without_resume[@]+"${without_resume[@]}"}
    trainer+=(--checkpoint.resume=auto)
  fi
  trainer+=("$@")
  echo "thpc: job ${SLURM_JOB_ID:-(none)} run ${SLURM_RESTART_COUNT:-0} on $(hostname)," \
       "run directory $run_dir"
  # A job script run with bash, not sbatch (or jobs/run_local.sh): no #SBATCH line is
  # read, so the ranks are THPC_RANKS's (1 unless set: tiny_cpu.sbatch's 2 became 1
  # without a word), and the run directory's name holds this shell's pid, which the next
  # start does not find: said, with how to stop and continue it. Inside an interactive
  # allocation (salloc) the same, without a requeue.
  local batch=0
  thpc_batch_job && batch=1
  if [ "$batch" = 0 ]; then
    local ranks=${THPC_RANKS:-${SLURM_NTASKS:-1}} where="not under Slurm (no SLURM_JOB_ID)"
    local on="on this machine"
    if [ -n "${SLURM_JOB_ID:-}" ]; then
      where="not a Slurm batch job (job $SLURM_JOB_ID is an allocation: no requeue)"
      on="in the allocation"
    fi
    local how=""
    [ -n "${THPC_RANKS:-}${SLURM_NTASKS:-}" ] ||
      how=" (THPC_RANKS sets how many; #SBATCH lines are read by sbatch only)"
    echo "thpc: $where: $ranks rank$([ "$ranks" = 1 ] || echo s) $on$how; kill -USR1 $$" \
         "(or Ctrl-C) checkpoints and stops it, $(thpc_continue_with) continues it"
  fi
  # (quoted as a shell reads it: a path with a space pasted back was two words)
  local launch_line
  printf -v launch_line '%q ' "${thpc_launch_command[@]}" "${trainer[@]}"
  echo "thpc: ${launch_line% }"
  if [ -n "$thpc_stop_signal" ]; then  # before the launch: nothing to stop, nothing lost
    echo "thpc: $thpc_stop_signal received before the trainer started; not started"
    thpc_stop_untrained "Nothing was trained in this run of it" "nothing was trained"
    return $?
  fi
  local metrics_lines=0
  [ -f "$metrics" ] && metrics_lines=$(wc -l < "$metrics")
  # Rank 0 of ranks stopped during their start-up writes the signal there (they write no
  # summary record): how a stop sent to them alone then is told from a run that ended. In
  # the run directory, which rank 0 reaches at the same path on any node (a node's /tmp
  # was the batch host's only when rank 0 ran there, outside a container); one a killed
  # batch shell left is removed at the next launch. THPC_JOB_RUN_DIR tells the trainer
  # that this directory is a job's, named by THPC_RUN_NAME (its lock refusal says so).
  local startup_stop=$run_dir/.startup_stop.${SLURM_JOB_ID:-local}.$$
  rm -f "$run_dir"/.startup_stop.*
  : > "$startup_stop" 2> /dev/null || startup_stop=""
  THPC_STARTUP_STOP_FILE=$startup_stop THPC_JOB_RUN_DIR=$run_dir \
    "${thpc_launch_command[@]}" "${trainer[@]}" &
  thpc_launcher_pid=$!
  local launched=$SECONDS
  # A stop that came between the check above and the launcher's pid found no one to tell.
  [ -n "$thpc_stop_signal" ] && kill -USR1 "$thpc_launcher_pid" 2> /dev/null
  # `wait` returns early (status > 128) when a trapped signal arrives; then wait again
  # for the launcher's own exit status, which bash keeps until it has been waited for.
  local status resent=0 stopped=checkpointed
  while :; do
    thpc_trapped=0
    status=0
    wait "$thpc_launcher_pid" || status=$?
    [ "$thpc_trapped" = 1 ] && [ "$status" -gt 128 ] || break
    # A stop forwarded before the launcher had started the ranks (its first ~0.1 s) was
    # lost, and the job trained on to its end: sent once more 10 s later, if the launcher
    # still runs (bash reaps an ended child at once, so its pid may be another process's
    # by then: the launcher is known by its command line). A rank that has the stop
    # already takes a repeated SIGUSR1 as the same request. Watched every 0.5 s: a
    # launcher that ends sooner ends the job then (it waited the whole 10 s).
    if [ "$resent" = 0 ]; then
      resent=1
      local watched=0
      while [ "$watched" -lt 20 ] && thpc_launcher_runs; do
        sleep 0.5 &
        wait $! 2> /dev/null
        watched=$((watched + 1))
      done
      thpc_launcher_runs && kill -USR1 "$thpc_launcher_pid" 2> /dev/null
    fi
  done
  # The launcher has ended: a signal from now on has no one to tell (its pid may be another
  # process's soon, which the trap's SIGUSR1 would kill).
  thpc_launcher_pid=""
  local stopped_at_start=""
  if [ -n "$startup_stop" ]; then
    stopped_at_start=$(head -c 16 "$startup_stop" 2> /dev/null | tr -dc 'A-Z0-9')
    rm -f "$startup_stop"
  fi
  # Killed by the stop signal itself: it came before the ranks could take it (their first
  # ~0.5 s, loading libraries and starting MPI), and nothing was trained. A stop, not a
  # failure: requeued like one (before: "failed (exit 138)", and the job ended FAILED).
  if [ -n "$thpc_stop_signal" ] && (( SECONDS - launched < 30 )) &&
     { [ "$status" = 138 ] || [ "$status" = 143 ] || [ "$status" = 130 ]; } &&
     ! thpc_records_since "$metrics" "$metrics_lines"; then
    echo "thpc: the ranks were ended by $thpc_stop_signal before they could take it" \
         "(exit $status, during their start-up): nothing was trained, nothing is lost"
    status=0
    stopped="stopped before training"
  fi
  # The ranks' own record of how they ended: a stop, their checkpoint written, or the run's
  # end.
  local recorded ended="" step="" signal=""
  recorded=$(thpc_recorded_end "$metrics" "$metrics_lines") &&
    read -r ended step signal <<< "$recorded"
  if [ "$ended" = stopped ] && [ -n "$signal" ]; then
    if [ "$status" = 0 ] && [ -z "$thpc_stop_signal" ]; then
      # A stop the ranks were sent and this shell was not: the same stop, requeued as one.
      echo "thpc: the ranks were stopped by $signal, sent to them and not to this batch" \
           "shell (by Slurm to the job's steps: a preemption's grace time, an #SBATCH" \
           "--signal without B:, scancel --signal without --batch): taken as the same stop;" \
           "they checkpointed at step $step"
      thpc_stop_signal=${signal#SIG}
    elif [ "$status" != 0 ]; then
      # A signal to mpirun itself: Slurm's SIGTERM to every process of the job (its time
      # limit reached without a warning, or too late for one), Ctrl-C's SIGINT. It answers
      # with exit 1 however the ranks stopped, and may cut their output short: the job was
      # said to have failed and was not requeued (under srun it was).
      echo "thpc: the ranks stopped on $signal and checkpointed at step $step; the" \
           "launcher's exit $status came after (mpirun answers a SIGTERM or SIGINT sent to" \
           "it with 1)"
      status=0
      [ -n "$thpc_stop_signal" ] || thpc_stop_signal=${signal#SIG}
    fi
  elif [ -n "$stopped_at_start" ]; then
    # The ranks were stopped during their start-up: they wrote no summary record. A stop
    # sent to them and not to this shell (a preemption's grace time while a large corpus
    # is checked) ended the job COMPLETED, unfinished, without a word.
    if [ -z "$thpc_stop_signal" ]; then
      echo "thpc: the ranks were stopped by $stopped_at_start during their start-up, sent" \
           "to them and not to this batch shell: nothing was trained, nothing is lost"
      thpc_stop_signal=${stopped_at_start#SIG}
    fi
    # (mpirun answers a SIGTERM or SIGINT sent to it with exit 1 however the ranks ended.)
    status=0
    stopped="stopped before training"
  fi
  # Slurm ending the job itself: not a stop to requeue after, whatever the launcher's exit
  # (mpirun answers Slurm's own SIGTERM with exit 1, however the ranks stopped).
  if [ -n "$thpc_slurm_ends" ]; then
    thpc_end_as_slurm_does "Its ranks were asked to checkpoint first"
    return $?
  fi
  if [ "$status" != 0 ]; then
    # A start refused before it wrote anything (a bad option, a missing corpus) left an
    # empty run directory of its own behind: removed; one holding files stays.
    local left=""
    if [ -z "$(find "$run_dir" ! -type d -print -quit 2> /dev/null)" ] &&
       find "$run_dir" -depth -type d -empty -delete 2> /dev/null && [ ! -e "$run_dir" ]; then
      left=" (its run directory, empty, removed)"
    fi
    # Exit 1 without a record is also the launcher's own refusal (a bad
    # THPC_MPIRUN_OPTIONS: mpirun's "unknown option", exit 1), which was said as the
    # trainer's failure.
    local failed="the trainer failed (exit $status)"
    if [ "$status" = 1 ] && ! thpc_records_since "$metrics" "$metrics_lines"; then
      failed="the trainer, or ${THPC_LAUNCHER:-mpirun} before it started the ranks, failed"
      failed+=" (exit 1: the lines above say which)"
    fi
    echo "thpc: $failed; not requeued$left"
    return "$status"
  fi
  if [ -n "$thpc_stop_signal" ] && [ "$ended" != stopped ] && [ -n "$ended" ]; then
    # The run had ended on its own (its summary says how) when the stop came, in its last
    # work (the final checkpoint, the averages): nothing is left to requeue for (it was
    # requeued, "checkpointed after USR1", and trained nothing). Between the two phases of
    # thpc_train_averaged, the stop still holds for the second.
    echo "thpc: $thpc_stop_signal came as ${thpc_phase:-the run} ended on its own ($ended at" \
         "step $step)"
  elif [ -n "$thpc_stop_signal" ] && [ "$batch" = 1 ]; then
    thpc_requeue "$stopped after $thpc_stop_signal" || return $?
  elif [ -n "$thpc_stop_signal" ]; then
    echo "thpc: $stopped after $thpc_stop_signal; $(thpc_continue_with) continues it"
  fi
  return 0
}

# thpc_end_as_slurm_does WHAT: the end of a job Slurm ends itself (thpc_slurm_ends): a
# cancel (scancel) says WHAT, the newest checkpoint and how to continue, and returns 1 (the
# job is unfinished); Slurm's own requeue (scontrol requeue, a preemption) says the job
# resumes, and returns 0. No requeue of ours either way.
thpc_end_as_slurm_does() {
  local newest
  newest=$(ls "$thpc_checkpoints_dir"/step_*.h5 2> /dev/null | tail -n 1)
  thpc_requeued=1
  if [ "$thpc_slurm_ends" = cancelled ]; then
    # Exit 1, unfinished: `sbatch --wait jobs/base.sbatch && sbatch my_evaluation` went on
    # to evaluate a cancelled run (exit 0).
    # (The newest's words built apart: a line continuation inside ${newest:+...} kept the
    # next line's indentation in the message.)
    local newest_text=""
    [ -n "$newest" ] && newest_text=" (the newest checkpoint: $newest)"
    echo "thpc: the job was cancelled (scancel): not requeued. $1$newest_text; to continue" \
         "the run, submit the job again with $(thpc_continue_with)"
    return 1
  fi
  echo "thpc: Slurm requeues the job itself (scontrol requeue, or a preemption): it" \
       "resumes from its newest checkpoint${newest:+ (${newest##*/})} in" \
       "$thpc_checkpoints_dir"
  if [ "$thpc_slurm_ends" = requeued_held ]; then
    echo "thpc: it is held (scontrol requeuehold): scontrol release $(thpc_slurm_job)" \
         "lets it run"
  fi
  return 0
}

# thpc_stop_untrained WHAT WHY [ELSEWHERE]: a stop this job has not acted on yet, when no
# trainer runs (before a launch, between the two phases). A cancel or Slurm's own requeue
# ends the job as Slurm says (WHAT: thpc_end_as_slurm_does's; a requeue of ours would put
# a cancelled job back in the queue, as Slurm takes one of a job that is ending); a batch
# job is requeued (WHY: thpc_requeue's); outside one (bash jobs/base.sbatch, salloc),
# ELSEWHERE is said when given. Returns what they return, else 0.
thpc_stop_untrained() {
  [ "$thpc_requeued" = 0 ] || return 0
  if [ -n "$thpc_slurm_ends" ]; then
    thpc_end_as_slurm_does "$1"
    return $?
  fi
  if thpc_batch_job; then
    thpc_requeue "$2"
    return $?
  fi
  [ -z "${3:-}" ] || echo "thpc: $3"
  return 0
}

# Puts the job back in the queue, where it resumes from its checkpoint, after "thpc:
# WHY; requeueing job ID". When Slurm refuses (a controller that does not answer) it says
# so and returns 1: the job ends unfinished with exit 1, not 0, which the batch system
# took for a finished job (COMPLETED, and a multi-day run left half done without a word).
thpc_requeue() {
  local job
  job=$(thpc_slurm_job)
  echo "thpc: $1; requeueing job $job"
  thpc_requeued=1
  if ! scontrol requeue "$job"; then
    # A new job has a new id and so a new run directory: the run's name is what finds
    # the checkpoint again.
    echo "thpc: scontrol requeue $job failed (the job submitted with --no-requeue, a" \
         "cluster with JobRequeue=0, a controller that does not answer): the job ends" \
         "here, unfinished; submit it again with $(thpc_continue_with) to resume from" \
         "its checkpoint" >&2
    return 1
  fi
}

# thpc_train_averaged CONFIG MAX_STEPS LAST EVERY [trainer options...]
#
# The paper evaluates the average of a run's last LAST checkpoints (§6.1: 5 for base, 20
# for big), written every 10 minutes (§5.2) on 8 P100 GPUs: every ~1500 base steps
# (0.4 s each) or ~600 big steps (1.0 s). On an H100 node 10 minutes hold far more steps
# (docs/wmt14.md), so "the last 5 checkpoints" would span a different, much longer stretch
# of training, or not exist. The window is kept in steps instead, in two phases:
#   1. up to the oldest averaged step, with CONFIG's own checkpoint schedule and no average;
#   2. on to MAX_STEPS with a checkpoint every EVERY steps and none by time, and the
#      trainer's end-of-run average of the last LAST (checkpoint.keep must be at least
#      LAST): the checkpoints at MAX_STEPS and the LAST - 1 multiples of EVERY below it,
#      DIR/average_lastLAST.h5. Only these few cost a checkpoint write more (a base
#      checkpoint is ~757 MB and stalls the ranks ~3-5 s; every 1500 steps from the start
#      would be ~66 of them, 4-5 minutes against an estimated 15-30 for the whole base run
#      on 8 H100s; big: 500 of 2.6 GB).
# A requeued job runs this again: phase 1 then resumes at or past its end and trains
# nothing. When the options already set train.max_steps or the checkpoint schedule, the
# caller has chosen otherwise and this is plain thpc_train.
thpc_train_averaged() {
  local config=$1 max_steps=$2 last=$3 every=$4
  shift 4
  local key
  for key in train.max_steps checkpoint.every_steps checkpoint.minutes checkpoint.average_last; do
    if thpc_given "$key" "$@"; then
      thpc_train "$config" "$@"
      return $?
    fi
  done
  # The newest averaged checkpoint is max_steps; the others are the multiples of every
  # below it, the oldest of which ends phase 1.
  local below=$(( (max_steps - 1) / every * every ))
  local phase1_end=$(( below - (last - 2) * every ))
  if [ "$last" -lt 2 ] || [ "$phase1_end" -le 0 ]; then
    echo "thpc: no averaged window of $last checkpoints $every steps apart in $max_steps steps" >&2
    return 2
  fi
  echo "thpc: phase 1 to step $phase1_end; phase 2 to step $max_steps, a checkpoint every" \
       "$every steps, the last $last averaged"
  # checkpoint.keep = LAST (base.ini 5, big.ini 20) holds the window however many requeues
  # came: the trainer prunes a stop checkpoint between its steps before them, and does not
  # count the one it keeps as the last known good (until 2026-12-06 it did, and phase 2
  # set keep = LAST + 1 to save the window's oldest step). A configured keep below LAST is
  # raised to it (unless the options set it): the trainer refuses average_last > keep, and
  # phase 2 would be refused only after phase 1 had trained. Phase 1 is given it too: a
  # requeue re-runs phase 1 from phase 2's checkpoints, and the trainer refuses a resume
  # whose keep, from the config file alone, is lower than its run's.
  local keep=()
  if ! thpc_given checkpoint.keep "$@"; then
    local configured
    configured=$(thpc_config_value checkpoint.keep "$config") || configured=5
    (( ${configured:-5} >= last )) || keep=("--checkpoint.keep=$last")
  fi
  thpc_phase="phase 1"
  local status=0
  # (${keep[@]+...}: an empty array is "unbound" under set -u to bash before 4.4, EL7's.)
  thpc_train "$config" "--train.max_steps=$phase1_end" --checkpoint.average_last=0 \
    ${keep[@]+"${keep[@]}"} "$@" || status=$?
  thpc_phase=""
  [ "$status" = 0 ] || return "$status"
  if [ -n "$thpc_stop_signal" ]; then  # stopped: phase 2 runs in the requeued job
    # (Unless phase 1's own stop was acted on already: the signal came between the phases,
    # after phase 1 had ended on its own.)
    thpc_stop_untrained "Phase 1 had ended" "$thpc_stop_signal received after phase 1" \
      "phase 2 not started after $thpc_stop_signal; $(thpc_continue_with) continues it"
    return $?
  fi
  thpc_train "$config" "--train.max_steps=$max_steps" --checkpoint.minutes=0 \
    "--checkpoint.every_steps=$every" "--checkpoint.average_last=$last" \
    ${keep[@]+"${keep[@]}"} "$@"
}
