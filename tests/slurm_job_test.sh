#!/usr/bin/env bash
# jobs/tiny_cpu.sbatch on a real Slurm: munged, slurmctld and slurmd started here on
# localhost, with a configuration written into a temporary directory (one node with this
# machine's CPUs, MpiDefault=none as Debian's packages have it), as a new user would try
# the job scripts.
#
#   1. A job runs to the end: exit code 0, the log, the last checkpoint in the job's own
#      run directory, and its final params_sha256; submitted by its path from outside
#      the repository, without THPC_ROOT.
#   2. The same job again, sent SIGUSR1 mid-run as Slurm's warning before a time limit
#      is sent (scancel --batch: the batch shell only): it must checkpoint, requeue
#      itself, run again under the same job id, resume from that checkpoint, append to
#      the same log and end COMPLETED with the uninterrupted job's params_sha256.
#   3. A job under srun cancelled by a plain scancel: CANCELLED, checkpointed, not
#      requeued; submitted with --chdir, its log and runs/ both there.
#   4. A job under srun whose ranks alone are sent SIGUSR1 (scancel --signal without
#      --batch): as 2, requeued, resumed, the uninterrupted job's params_sha256.
#   5. A job whose batch shell is killed (scancel --batch): its ranks checkpoint and stop.
#   6. A job array's task stopped as in 2: it alone is requeued, and resumes as its sibling
#      ran.
#   7. A job script run inside an interactive allocation (salloc), stopped: not requeued
#      (Slurm requeues batch jobs only), exit 0, and says how to continue.
#
#   tests/slurm_job_test.sh SOURCE_DIR BINARY_DIR      (ctest runs it)
#
# It installs nothing: tools/install_deps.sh installs slurm-wlm and munge. Exit 77 (ctest
# SKIP_RETURN_CODE) with the reason when the daemons cannot be had or cannot start; every
# daemon and job it started is stopped on every way out. THPC_KEEP_SLURM_TEST_DIR=1 keeps
# the temporary directory (configuration, daemon logs, job logs) for a look afterwards.
source "$(dirname "${BASH_SOURCE[0]}")/shell_test_lib.sh" "$@" || exit 1
require_programs "tools/install_deps.sh installs slurm-wlm, munge, openmpi-bin" \
  munged slurmctld slurmd sbatch scontrol scancel sinfo mpirun
[ "$(id -u)" = 0 ] || skip "slurmd must run as root to start jobs, and this is uid $(id -u)"
[ -x "$binary_dir/transformer_hpc" ] || fail "no $binary_dir/transformer_hpc"

tmp=$(mktemp -d /tmp/thpc_slurm_test.XXXXXX)
# munged checks that every directory above its key and socket is not writable by others.
chmod 755 "$tmp"
daemon_pids=()
export SLURM_CONF=$tmp/slurm.conf

cleanup() {
  # Jobs first (their slurmstepd outlives slurmd), then the daemons, by PID.
  if [ ${#daemon_pids[@]} -gt 0 ]; then
    scancel --full --quiet --user=root 2>/dev/null
    local waited=0
    while [ -n "$(squeue -h -o %i 2>/dev/null)" ] && [ $waited -lt 30 ]; do
      sleep 1
      waited=$((waited + 1))
    done
  fi
  local pid
  for pid in "${daemon_pids[@]}"; do kill "$pid" 2>/dev/null; done
  for pid in "${daemon_pids[@]}"; do wait "$pid" 2>/dev/null; done
  if [ -n "${THPC_KEEP_SLURM_TEST_DIR:-}" ]; then echo "kept $tmp"; else rm -rf "$tmp"; fi
}
trap cleanup EXIT

show_logs() {
  local log
  for log in "$tmp"/log/* "$tmp"/submit/*.out; do
    [ -f "$log" ] || continue
    echo "---- $log (last 40 lines)"
    tail -n 40 "$log"
  done
}

fail() {  # the library's, with the daemons' and jobs' logs
  echo "FAILED: $*"
  show_logs
  exit 1
}

# ---- the cluster ----
mkdir -p "$tmp"/munge "$tmp"/state "$tmp"/spool "$tmp"/log "$tmp"/submit
chmod 711 "$tmp"/munge
head -c 1024 /dev/urandom >"$tmp"/munge/munge.key
chmod 400 "$tmp"/munge/munge.key
munged --foreground --force --socket="$tmp"/munge/socket --key-file="$tmp"/munge/munge.key \
  --pid-file="$tmp"/munge/munged.pid --seed-file="$tmp"/munge/seed \
  --log-file="$tmp"/log/munged.log >"$tmp"/log/munged.out 2>&1 &
daemon_pids+=($!)

# Ports of our own, so that a Slurm already on this machine is not disturbed.
port=$((20000 + RANDOM % 20000))
cat >"$SLURM_CONF" <<EOF
ClusterName=thpctest
SlurmctldHost=localhost
SlurmctldPort=$port
SlurmdPort=$((port + 1))
SlurmUser=root
AuthType=auth/munge
AuthInfo=socket=$tmp/munge/socket
CredType=cred/munge
StateSaveLocation=$tmp/state
SlurmdSpoolDir=$tmp/spool
SlurmctldPidFile=$tmp/slurmctld.pid
SlurmdPidFile=$tmp/slurmd.pid
SlurmctldLogFile=$tmp/log/slurmctld.log
SlurmdLogFile=$tmp/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
ReturnToService=2
MailProg=/bin/true
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
NodeName=localhost NodeAddr=127.0.0.1 CPUs=$(nproc) State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP
EOF
slurmctld -D -f "$SLURM_CONF" >"$tmp"/log/slurmctld.out 2>&1 &
daemon_pids+=($!)
slurmd -D -N localhost -f "$SLURM_CONF" >"$tmp"/log/slurmd.out 2>&1 &
daemon_pids+=($!)

for _ in $(seq 60); do
  [ "$(sinfo -h -n localhost -o %T 2>/dev/null)" = idle ] && break
  sleep 0.5
done
if [ "$(sinfo -h -n localhost -o %T 2>/dev/null)" != idle ]; then
  show_logs
  skip "the Slurm daemons did not come up (node state: '$(sinfo -h -o %T 2>&1)')"
fi
echo "Slurm up: slurmctld on port $port, node localhost with $(nproc) CPUs"

# ---- the jobs ----
# The job scripts find the repository and the build through these (sbatch passes the
# environment on); the jobs write their logs and runs/ into the submission directory.
export THPC_ROOT=$source_dir THPC_BUILD=$binary_dir
cd "$tmp"/submit || exit 1
trainer_options=(--train.max_steps=40 --train.log_every=1 --checkpoint.minutes=0)

job_field() {  # job_field JOBID KEY: KEY=value from scontrol show job
  scontrol show job "$1" 2>/dev/null | tr ' ' '\n' | sed -n "s/^$2=//p" | head -n 1
}
digest_of() { sed -n 's/^final: .*params_sha256=\([0-9a-f]*\).*/\1/p' "$1" | tail -n 1; }
wait_for_step_5() {  # wait_for_step_5 LOG PATTERN: a minute at most for the job's 5th step
  for _ in $(seq 600); do
    grep -q "$2" "$1" 2>/dev/null && return 0
    sleep 0.1
  done
  fail "job $job_id never reached step 5 ($1)"
}

started=$SECONDS
# Without THPC_ROOT, from a directory that is not the repository: the script finds
# jobs/common.sh beside its own path (Slurm runs a copy of it), as a user who submits
# `sbatch ~/transformer_hpc/jobs/tiny_cpu.sbatch` from an experiment's directory.
whole_id=$(env -u THPC_ROOT sbatch --parsable --wait "$source_dir"/jobs/tiny_cpu.sbatch \
             "${trainer_options[@]}")
status=$?
whole_log=thpc-tiny-$whole_id.out
[ "$status" = 0 ] || fail "the uninterrupted job $whole_id: sbatch --wait gave $status"
grep -q '^final: step=40 ' "$whole_log" || fail "no 'final: step=40' in $whole_log"
[ -f runs/thpc-tiny-"$whole_id"/checkpoints/step_00000040.h5 ] ||
  fail "no runs/thpc-tiny-$whole_id/checkpoints/step_00000040.h5"
whole_digest=$(digest_of "$whole_log")
[ -n "${THPC_TRACE:-}" ] && { date +%T; scontrol show job "$whole_id" | grep -oE '(StartTime|EndTime)=[^ ]*'; }
echo "job $whole_id: trained 40 steps in $((SECONDS - started)) s, params_sha256=$whole_digest"

# await_requeued_end [DIGEST]: job_id's requeue and second run, to its end, which must be
# COMPLETED, exit 0, after exactly one requeue; then that it resumed from the checkpoint
# its stop wrote and ended with the uninterrupted job's params_sha256 (DIGEST, default
# the first job's).
await_requeued_end() {
  local reference=${1:-$whole_digest}
  local state="" released=""
  for _ in $(seq 300); do
    # Slurm holds a requeued job back for two minutes (its BeginTime); release it early,
    # as `scontrol update` lets a user do, to keep the test short. Not in the second the
    # first run ended: slurmd revoked that run's credential then, and refuses a credential
    # created no later than the revocation ("Job credential revoked"), so a restart
    # within the same second is killed (seen about once in three runs).
    if [ -z "$released" ] && [ "$(job_field "$job_id" Restarts)" = 1 ] &&
      [ "$(job_field "$job_id" JobState)" = PENDING ]; then
      sleep 2
      scontrol update JobId="$job_id" StartTime=now && released=yes
    fi
    [ -n "${THPC_TRACE:-}" ] && echo "$(date +%T) $(scontrol show job "$job_id" |
      grep -oE '(JobState|BeginTime|Restarts|StartTime|EndTime)=[^ ]*' | tr '\n' ' ')"
    state=$(job_field "$job_id" JobState)
    case $state in
      COMPLETED | FAILED | CANCELLED | TIMEOUT | NODE_FAIL | OUT_OF_MEMORY) break ;;
    esac
    sleep 0.5
  done
  echo "job $job_id: $state after $((SECONDS - started)) s," \
       "restarts $(job_field "$job_id" Restarts)"
  [ "$state" = COMPLETED ] || fail "job $job_id ended $state, exit $(job_field "$job_id" ExitCode)"
  [ "$(job_field "$job_id" ExitCode)" = 0:0 ] ||
    fail "job $job_id exit $(job_field "$job_id" ExitCode)"
  [ "$(job_field "$job_id" Restarts)" = 1 ] || fail "job $job_id was not requeued exactly once"
  stopped=$(sed -n 's/^stopped: SIGUSR1 received; step=\([0-9]*\) .*/\1/p' "$log")
  [ -n "$stopped" ] ||
    fail "job $job_id: no 'stopped: SIGUSR1 received' line (the signal never reached the ranks)"
  grep -q "^thpc: checkpointed after USR1; requeueing job $job_id" "$log" ||
    fail "job $job_id did not requeue itself"
  checkpoint=$(printf '%s/runs/thpc-tiny-%s/checkpoints/step_%08d.h5' "$PWD" \
                      "$(job_field "$job_id" JobId)" "$stopped")
  grep -qF "resumed from $checkpoint at step $stopped" "$log" ||
    fail "the requeued job did not resume from $checkpoint (the log was appended to?)"
  digest=$(digest_of "$log")
  [ -n "$reference" ] && [ "$digest" = "$reference" ] ||
    fail "stopped at step $stopped and resumed: params_sha256=$digest, uninterrupted $reference"
}

started=$SECONDS
job_id=$(sbatch --parsable "$source_dir"/jobs/tiny_cpu.sbatch "${trainer_options[@]}") ||
  fail "sbatch refused the second job"
log=thpc-tiny-$job_id.out
wait_for_step_5 "$log" "^step 5/40 "
# What #SBATCH --signal=B:USR1@60 does before the time limit: the batch shell only.
scancel --batch --signal=USR1 "$job_id" || fail "scancel --batch --signal=USR1 $job_id"
await_requeued_end
echo "PASSED: stopped at step $stopped by SIGUSR1, requeued, resumed, same params_sha256"

# 3. A plain `scancel` (SIGTERM to every process of the job) under srun: the job ends
#    CANCELLED with its checkpoint, and does not requeue itself. Before, the script took
#    the SIGTERM for a warning and the srun ranks' clean exit for a stop: it requeued the
#    job, which trained on to its end.
#    Submitted with --chdir: the log and runs/ go there (before, runs/ went to the
#    submission directory, away from the log).
mkdir -p "$tmp"/workdir
job_id=$(THPC_LAUNCHER=srun sbatch --parsable --chdir="$tmp"/workdir \
           "$source_dir"/jobs/tiny_cpu.sbatch \
           --train.max_steps=100000 --train.log_every=1 --checkpoint.minutes=0) ||
  fail "sbatch refused the third job"
log=$tmp/workdir/thpc-tiny-$job_id.out
wait_for_step_5 "$log" "^step 5/100000 "
scancel "$job_id" || fail "scancel $job_id"
for _ in $(seq 300); do
  grep -q '^thpc: the job was cancelled\|requeueing' "$log" 2>/dev/null && break
  sleep 0.1
done
sleep 1
state=$(job_field "$job_id" JobState)
[ "$state" = CANCELLED ] || fail "job $job_id ended $state after scancel (requeued itself?)"
[ "$(job_field "$job_id" Restarts)" = 0 ] || fail "job $job_id requeued itself after scancel"
[ "$(job_field "$job_id" ExitCode)" = 1:0 ] ||
  fail "job $job_id cancelled: exit $(job_field "$job_id" ExitCode), not 1 (unfinished)"
grep -q "^thpc: the job was cancelled (scancel): not requeued" "$log" ||
  fail "job $job_id: no line saying it was cancelled and not requeued"
grep -q "THPC_RUN_NAME=thpc-tiny-$job_id and sbatch --chdir=$tmp/workdir\$" "$log" ||
  fail "job $job_id: the cancel's line does not say to continue with the same --chdir"
grep -q "^stopped: SIGTERM received; step=[0-9]* checkpoint=$tmp/workdir/runs/" "$log" ||
  fail "job $job_id: its ranks did not checkpoint in --chdir's runs/ before the cancel"
[ -e runs/thpc-tiny-"$job_id" ] && fail "job $job_id made runs/ in the submission directory"
echo "PASSED: scancel under srun ended the job CANCELLED with its checkpoint, not requeued"

# 4. SIGUSR1 to srun's ranks alone (`scancel --signal=USR1` without --batch; an #SBATCH
#    --signal without B: does the same): the ranks checkpoint and exit 0, and the job
#    ended COMPLETED, unfinished, without a word. The script reads the trainer's summary
#    record, says so and requeues.
started=$SECONDS
job_id=$(THPC_LAUNCHER=srun sbatch --parsable "$source_dir"/jobs/tiny_cpu.sbatch \
           "${trainer_options[@]}") || fail "sbatch refused the fourth job"
log=thpc-tiny-$job_id.out
wait_for_step_5 "$log" "^step 5/40 "
scancel --signal=USR1 "$job_id" || fail "scancel --signal=USR1 $job_id"
await_requeued_end
grep -q "^thpc: the ranks were stopped by SIGUSR1, sent to them and not to this batch" "$log" ||
  fail "job $job_id: no line saying its ranks alone were stopped"
echo "PASSED: srun's ranks stopped by SIGUSR1 alone: requeued, resumed, same params_sha256"

# 5. The batch shell killed (`scancel --batch JOBID`: SIGKILL, which no trap takes).
#    Under proctrack/linuxproc (Debian's default) mpirun and its ranks outlived it and
#    trained on outside Slurm, holding their node's CPUs or GPUs. The launcher now gets
#    SIGUSR1 when the shell dies (setpriv --pdeathsig): the ranks checkpoint and stop.
job_id=$(sbatch --parsable "$source_dir"/jobs/tiny_cpu.sbatch \
           --train.max_steps=100000 --train.log_every=1 --checkpoint.minutes=0) ||
  fail "sbatch refused the fifth job"
log=thpc-tiny-$job_id.out
wait_for_step_5 "$log" "^step 5/100000 "
scancel --batch "$job_id" || fail "scancel --batch $job_id"
for _ in $(seq 300); do
  pgrep -f "runs/thpc-tiny-$job_id/" > /dev/null || break
  sleep 0.1
done
if left=$(pgrep -af "runs/thpc-tiny-$job_id/"); then
  pkill -KILL -f "runs/thpc-tiny-$job_id/"
  fail "job $job_id's batch shell killed: its launcher and ranks trained on: $left"
fi
grep -q '^stopped: SIGUSR1 received; step=[0-9]* checkpoint=' "$log" ||
  fail "job $job_id: its ranks did not checkpoint when its batch shell was killed"
echo "PASSED: the batch shell killed, the ranks checkpointed and stopped"

# 6. A task of a job array stopped as in 2. Its SLURM_JOB_ID is, for one task, the array's
#    own id, and `scontrol requeue` of that id requeued every task of the array: the
#    other, still training, was cut off and held back two minutes. One rank a task, so
#    that both run at once on this machine's CPUs; task 0 is the uninterrupted reference.
started=$SECONDS
array_id=$(sbatch --parsable --ntasks=1 --array=0-1 "$source_dir"/jobs/tiny_cpu.sbatch \
             "${trainer_options[@]}") || fail "sbatch refused the job array"
# Each task's own job id (that of its log), once the pending array is split into tasks
# (until then both names show the array's record).
for _ in $(seq 300); do
  task0=$(job_field "${array_id}_0" JobId) task1=$(job_field "${array_id}_1" JobId)
  [ -n "$task0" ] && [ -n "$task1" ] && [ "$task0" != "$task1" ] && break
  sleep 0.1
done
[ "$task0" != "$task1" ] || fail "the tasks of job array $array_id never started"
job_id=${array_id}_1
log=thpc-tiny-$task1.out
wait_for_step_5 "$log" "^step 5/40 "
scancel --batch --signal=USR1 "$job_id" || fail "scancel --batch --signal=USR1 $job_id"
for _ in $(seq 600); do
  [ "$(job_field "${array_id}_0" JobState)" = COMPLETED ] && break
  sleep 0.1
done
[ "$(job_field "${array_id}_0" JobState)" = COMPLETED ] &&
  [ "$(job_field "${array_id}_0" Restarts)" = 0 ] ||
  fail "task ${array_id}_0 was requeued with its sibling: $(job_field "${array_id}_0" JobState)," \
       "restarts $(job_field "${array_id}_0" Restarts)"
grep -q "^thpc: checkpointed after USR1; requeueing job ${array_id}_1\$" "$log" ||
  fail "task $job_id was not requeued by its own name"
reference=$(digest_of "thpc-tiny-$task0.out")
[ -n "$reference" ] || fail "task ${array_id}_0 completed without a final line"
await_requeued_end "$reference"
echo "PASSED: a job array's task stopped, requeued alone, resumed as its sibling ran"

# 7. A job script run inside `salloc`: SLURM_JOB_ID is set, but the job is not a batch job.
#    Stopped, it asked for a requeue, which Slurm refuses ("Only batch jobs are accepted"),
#    and said the stop had failed, exit 1.
salloc -n 2 bash -c "cd '$tmp/submit' && THPC_RUN_NAME=allocated exec bash \
  '$source_dir/jobs/tiny_cpu.sbatch' --train.max_steps=100000 --train.log_every=1" \
  > "$tmp/submit/allocated.log" 2>&1 &
allocation=$!
log=$tmp/submit/allocated.log
wait_for_step_5 "$log" "^step 5/100000 "
pkill -USR1 -f "^bash $source_dir/jobs/tiny_cpu.sbatch " || fail "no job script to stop in salloc"
wait "$allocation" || { status=$?; fail "salloc with a stopped job script exited $status"; }
grep -q "^thpc: not a Slurm batch job (job [0-9]* is an allocation: no requeue)" "$log" ||
  fail "the job script in salloc did not say it is not a batch job"
grep -q "^thpc: checkpointed after USR1; THPC_RUN_NAME=allocated continues it" "$log" ||
  fail "the job script in salloc did not say how to continue"
grep -q "requeueing\|scontrol requeue" "$log" && fail "the job script in salloc tried a requeue"
grep -q "allocation: no requeue): 2 ranks in the allocation; kill" "$log" ||
  fail "the job script in salloc did not say it runs salloc's 2 ranks"
echo "PASSED: a job script in salloc stopped: checkpointed, not requeued, exit 0"
