#!/usr/bin/env bash
# thpc_train_averaged (jobs/common.sh), what jobs/base.sbatch and jobs/big.sbatch run: the
# paper's averaged window kept in steps by training in two phases. On input/tiny.ini
# (CPU, one rank under mpirun, no Slurm), 70 steps, the last 3 checkpoints 20 steps apart:
#
#   1. phase 1 ends at step 40, phase 2 checkpoints at 60 and 70 and averages 40, 60, 70
#      (the only step checkpoints left with checkpoint.keep = 3, and
#      average_last3.h5 equals transformer_average of those three);
#   2. the two phases are one run: the same final params_sha256 as 70 steps in one go;
#   3. run again (a requeued job that had finished), it trains nothing and keeps the files;
#   4. options that set the schedule themselves get one plain run;
#   5. a missing program is said; 6. a config's own checkpoint.resume is not replaced
#      without a word; 7. a requeue Slurm refuses fails the job; 8. an unknown launcher
#      is said, before the run directory is made; 9. a job script run with bash (no
#      Slurm) says its ranks and how to stop and continue it, and a refused start leaves
#      no empty run directory; 10. jobs/run_local.sh stopped by SIGTERM ends with its ranks;
#   11. a config file that is not there is said before the launcher starts, exit 2; 12. so
#   is a THPC_RUN_NAME that is not one folder under runs/; 13. a stop sent to the ranks
#   and not to the batch shell is requeued as the shell's own; 14. options mpirun refuses
#   are not said to be the trainer's failure; 15. nor is mpirun's exit 1 when Slurm's
#   SIGTERM reached it beside the ranks, which checkpointed: requeued; 16. a config's path
#   relative to where sbatch was called is found under sbatch --chdir; 17. Ctrl-C of
#   jobs/run_local.sh checkpoints and stops, exit 0; 18. a stop sent to the ranks alone
#   during their start-up is requeued too; 19. a job given the run name of one that runs
#   is told to give another; 21. a cancel before the launch is not requeued; 22. nor is
#   a run that had ended on its own when a stop came, 20. with an empty
#   train.metrics_dir too (checkpoint.dir's); 23. after phase 1, outside a batch job,
#   phase 2's not starting is said; 24. SIGHUP stops the job as the others do, and the
#   advice to continue names a checkpoint.dir of the options'; 25. a requeue inside the
#   window keeps all of it with checkpoint.keep = the window; 26. a config's keep below
#   the window, raised by the script, survives requeues; 27. a job name with '/' is one
#   folder under runs/; 28. a --checkpoint.resume=FILE of another run starts the job
#   there, and its requeues and phase 2 continue the job's own checkpoints.
#
#   tests/jobs_averaged_window_test.sh SOURCE_DIR BINARY_DIR      (ctest runs it)
source "$(dirname "${BASH_SOURCE[0]}")/shell_test_lib.sh" "$@" || exit 1
require_programs "tools/install_deps.sh installs openmpi-bin" mpirun
scratch_directory jobs_window_test
# A failing case leaves no job behind (its stand-in jobs train to step 1,000,000, and one
# trained on for hours after a failure): every process whose command line names the
# scratch directory is killed as the test exits.
trap 'pkill -KILL -f -- "$tmp/" 2> /dev/null; rm -rf "$tmp"' EXIT
export THPC_ROOT=$source_dir THPC_BUILD=$binary_dir THPC_LAUNCHER=mpirun THPC_RANKS=1
export SLURM_SUBMIT_DIR=$tmp  # the run directories go to $tmp/runs/NAME
unset SLURM_JOB_ID
source "$source_dir/jobs/common.sh"
options=(--train.backend=cpu --train.log_every=10 --checkpoint.keep=3)
digest_of() { sed -n 's/^final: .*params_sha256=\([0-9a-f]*\).*/\1/p' "$1" | tail -n 1; }

# 1. The window.
export THPC_RUN_NAME=averaged
thpc_train_averaged input/tiny.ini 70 3 20 "${options[@]}" > "$tmp/averaged.log" 2>&1 ||
  { status=$?; cat "$tmp/averaged.log"; fail "thpc_train_averaged exited $status"; }
grep -q "thpc: phase 1 to step 40; phase 2 to step 70" "$tmp/averaged.log" ||
  { cat "$tmp/averaged.log"; fail "no phase line"; }
dir=$tmp/runs/averaged/checkpoints
kept=$(cd "$dir" && ls step_*.h5 | tr '\n' ' ')
[ "$kept" = "step_00000040.h5 step_00000060.h5 step_00000070.h5 " ] ||
  fail "step checkpoints kept: '$kept', expected 40, 60 and 70"
[ -f "$dir/average_last3.h5" ] || fail "no $dir/average_last3.h5"
"$binary_dir/transformer_average" --inputs "$dir/step_00000040.h5" "$dir/step_00000060.h5" \
  "$dir/step_00000070.h5" --output "$tmp/by_hand.h5" > /dev/null || fail "transformer_average"
params_digest() {  # the sha256 of a checkpoint's parameters as h5dump prints them (the
  # first line, which names the file, left out)
  h5dump -g /params "$1" 2>/dev/null | tail -n +2 | sha256sum | cut -d' ' -f1
}
if command -v h5dump >/dev/null; then
  [ "$(params_digest "$dir/average_last3.h5")" = "$(params_digest "$tmp/by_hand.h5")" ] ||
    fail "average_last3.h5 is not the average of steps 40, 60 and 70"
fi
two_phase=$(digest_of "$tmp/averaged.log")
[ -n "$two_phase" ] || fail "no final params_sha256 in the log"

# 2. One run of 70 steps gives the same parameters.
export THPC_RUN_NAME=whole
thpc_train input/tiny.ini --train.max_steps=70 "${options[@]}" > "$tmp/whole.log" 2>&1 ||
  { status=$?; cat "$tmp/whole.log"; fail "the whole run exited $status"; }
[ "$(digest_of "$tmp/whole.log")" = "$two_phase" ] ||
  fail "two phases gave params_sha256 $two_phase, one run $(digest_of "$tmp/whole.log")"

# 3. Again, as a requeued job that had finished: nothing trained, nothing lost.
export THPC_RUN_NAME=averaged
thpc_train_averaged input/tiny.ini 70 3 20 "${options[@]}" > "$tmp/again.log" 2>&1 ||
  { status=$?; cat "$tmp/again.log"; fail "the second thpc_train_averaged exited $status"; }
grep -q "^step " "$tmp/again.log" && { cat "$tmp/again.log"; fail "the second call trained"; }
[ "$(digest_of "$tmp/again.log")" = "$two_phase" ] || fail "the second call changed the parameters"
kept_again=$(cd "$dir" && ls step_*.h5 | tr '\n' ' ')
[ "$kept_again" = "$kept" ] || fail "the second call left '$kept_again'"

# 4. A schedule given by the caller: one plain run. Given as `--KEY VALUE` (the trainer
# takes both forms; the scripts saw only --KEY=VALUE, so their own default came too and the
# trainer refused the key "given more than once").
thpc_given checkpoint.dir --checkpoint.dir x || fail "thpc_given missed --KEY VALUE"
thpc_given checkpoint.dir --checkpoint.dir=x || fail "thpc_given missed --KEY=VALUE"
thpc_given checkpoint.dir --checkpoint.dirs=x --x=--checkpoint.dir &&
  fail "thpc_given took another key for checkpoint.dir"
export THPC_RUN_NAME=plain
thpc_train_averaged input/tiny.ini 70 3 20 "${options[@]}" --train.max_steps 30 \
  > "$tmp/plain.log" 2>&1 ||
  { status=$?; cat "$tmp/plain.log"; fail "the plain run exited $status"; }
grep -q "phase 1" "$tmp/plain.log" && fail "options with train.max_steps still ran two phases"
grep -q "^final: step=30 " "$tmp/plain.log" || { cat "$tmp/plain.log"; fail "no plain 30 steps"; }
# 5. No program where THPC_BUILD says: one line saying so, no run directory (mpirun's
# "could not access or execute" and "the trainer failed (exit 132)" before).
export THPC_RUN_NAME=missing
missing=$( (thpc_build=$tmp/nothing; thpc_train input/tiny.ini) 2>&1 ) &&
  fail "thpc_train without a program succeeded"
grep -q "thpc: no program $tmp/nothing/transformer_hpc: build it" <<< "$missing" ||
  fail "no line naming the missing program: $missing"
[ -e "$tmp/runs/missing" ] && fail "a run directory was made without a program"
# 6. Keys the config file sets that a job replaces (a helper's trial): a checkpoint.resume
# is refused before anything starts (the job resumed its own empty run directory instead
# and trained from step 0, exit 0), checkpoint.dir and train.metrics_dir are said replaced.
thpc_config_value checkpoint.dir input/tiny.ini && fail "tiny.ini has no checkpoint.dir"
export THPC_RUN_NAME=configured
cp input/tiny.ini "$tmp/resumes.ini"
printf '[checkpoint]\nresume = %s   # the run to continue\n' "$dir/step_00000070.h5" \
  >> "$tmp/resumes.ini"
refused=$(thpc_train "$tmp/resumes.ini" 2>&1) && fail "a config's checkpoint.resume was replaced"
grep -q "thpc: $tmp/resumes.ini sets checkpoint.resume = $dir/step_00000070.h5, which a job" \
  <<< "$refused" || fail "no line naming the config's checkpoint.resume: $refused"
[ -e "$tmp/runs/configured" ] && fail "a run directory was made for a refused start"
# ... also in a file that opens with a UTF-8 byte-order mark (Windows Notepad's), which
# the trainer skips: the job's reader took '[checkpoint]' for text, passed the file, and the
# job trained from step 0 (a helper's trial).
printf '\357\273\277[checkpoint]\nresume = %s\n' "$dir/step_00000070.h5" > "$tmp/bom.ini"
[ "$(thpc_config_value checkpoint.resume "$tmp/bom.ini")" = "$dir/step_00000070.h5" ] ||
  fail "a config's checkpoint.resume after a byte-order mark was not read"
[ "$(LC_ALL=C.UTF-8 thpc_config_value checkpoint.resume "$tmp/bom.ini")" = \
  "$dir/step_00000070.h5" ] || fail "a byte-order mark was not skipped in a UTF-8 locale"
# A config of the caller's own, outside the repository: its relative paths are read from
# the caller's directory, as the trainer run by hand reads them (the job moved to the
# repository first, and `dir = mydata` beside the config was looked up there).
mkdir -p "$tmp/mine"
cp input/tiny.ini "$tmp/mine/my.ini"
export THPC_RUN_NAME=mine
mine=$( (cd "$tmp/mine" && thpc_train my.ini --data.dir=mydata "${options[@]}") 2>&1 ) &&
  fail "a run without its data directory succeeded"
grep -q "mydata: no such data directory in $tmp/mine " <<< "$mine" ||
  fail "the caller's config's data.dir was not read from the caller's directory: $mine"
cp input/tiny.ini "$tmp/places.ini"
printf '[checkpoint]\ndir = %s\n' "$tmp/elsewhere" >> "$tmp/places.ini"
thpc_train "$tmp/places.ini" --train.max_steps=1 --train.backend=cpu > "$tmp/places.log" 2>&1 ||
  { status=$?; cat "$tmp/places.log"; fail "the run with a configured checkpoint.dir exited" \
    "$status"; }
grep -q "thpc: note: $tmp/places.ini sets checkpoint.dir = $tmp/elsewhere; the job's run" \
  "$tmp/places.log" || { cat "$tmp/places.log"; fail "no note of the replaced checkpoint.dir"; }
# 7. A requeue Slurm refuses (a controller that does not answer) is said and fails the job
# (before: exit 0, and the batch system took the unfinished job for a finished one).
mkdir -p "$tmp/bin"
printf '#!/bin/sh\necho "scontrol: fatal: Could not establish a configuration source" >&2\nexit 1\n' \
  > "$tmp/bin/scontrol"
chmod +x "$tmp/bin/scontrol"
# A task of a job array is named ARRAY_TASK: `scontrol requeue` of its SLURM_JOB_ID
# requeued every task of the array (a helper's Slurm trial). The line says how to resume:
# a new job has a new run directory (it said "submit it again" alone).
requeue=$( (PATH=$tmp/bin:$PATH SLURM_JOB_ID=7 SLURM_ARRAY_JOB_ID=6 SLURM_ARRAY_TASK_ID=1 \
            thpc_run_name=averaged thpc_job_dir=$tmp thpc_requeue "checkpointed after USR1") \
           2>&1 ) &&
  fail "a refused requeue returned 0: $requeue"
grep -q "thpc: checkpointed after USR1; requeueing job 6_1" <<< "$requeue" ||
  fail "the array task was not named 6_1: $requeue"
grep -q "thpc: scontrol requeue 6_1 failed (the job submitted with --no-requeue, .*: the job" \
  <<< "$requeue" || fail "no line saying the requeue failed: $requeue"
grep -q "submit it again with THPC_RUN_NAME=averaged to resume" <<< "$requeue" ||
  fail "the failed requeue does not say how to resume: $requeue"
# 8. A launcher the scripts do not know is said, and leaves no run directory (it left an
# empty one).
export THPC_RUN_NAME=launcher
launcher=$( (THPC_LAUNCHER=mpiexec thpc_train input/tiny.ini) 2>&1 ) &&
  fail "an unknown THPC_LAUNCHER was run"
grep -q "thpc: THPC_LAUNCHER must be mpirun or srun, not 'mpiexec'" <<< "$launcher" ||
  fail "no line naming the launcher: $launcher"
[ -e "$tmp/runs/launcher" ] && fail "a run directory was made for an unknown launcher"
# 9. jobs/tiny_cpu.sbatch run with bash: its #SBATCH --ntasks=2 is read by sbatch only, so
# one rank ran without a word, and a refused start left runs/thpc-local-PID empty.
refused=$( (unset THPC_RUN_NAME THPC_RANKS; cd "$tmp" &&
            bash "$source_dir/jobs/tiny_cpu.sbatch" --train.max_steps=0) 2>&1 ) &&
  fail "tiny_cpu.sbatch with --train.max_steps=0 exited 0: $refused"
grep -q "thpc: not under Slurm (no SLURM_JOB_ID): 1 rank on this machine (THPC_RANKS sets" \
  <<< "$refused" || fail "no line saying the job runs outside Slurm with 1 rank: $refused"
grep -Eq "kill -USR1 [0-9]+ \(or Ctrl-C\) checkpoints and stops it, THPC_RUN_NAME=thpc-local-" \
  <<< "$refused" || fail "no line saying how to stop and continue the run: $refused"
grep -q "thpc: the trainer failed (exit 2); not requeued (its run directory, empty, removed)" \
  <<< "$refused" || fail "the refused start's empty run directory was not said removed: $refused"
left=$(find "$tmp/runs" -maxdepth 1 -name 'thpc-local-*')
[ -z "$left" ] || fail "a refused start left its run directory: $left"
# 10. jobs/run_local.sh stopped by SIGTERM ends when its ranks have stopped (about a
# second here): it waited 10 s more whatever they did, for a resend of the stop.
(cd "$tmp" && THPC_RUN_NAME=stopped exec bash "$source_dir/jobs/run_local.sh" 1 \
   input/tiny.ini --train.max_steps=1000000 "${options[@]}") > "$tmp/stopped.log" 2>&1 &
job=$!
for _ in $(seq 120); do grep -q '^step ' "$tmp/stopped.log" && break; sleep 0.5; done
grep -q '^step ' "$tmp/stopped.log" ||
  { cat "$tmp/stopped.log"; fail "run_local.sh never trained"; }
signalled=$SECONDS
kill -TERM "$job"
wait "$job" ||
  { status=$?; cat "$tmp/stopped.log"; fail "run_local.sh stopped by SIGTERM exited $status"; }
grep -q '^stopped: SIGUSR1 received' "$tmp/stopped.log" ||
  { cat "$tmp/stopped.log"; fail "no 'stopped' line after SIGTERM"; }
(( SECONDS - signalled < 8 )) ||
  fail "run_local.sh took $((SECONDS - signalled)) s to end after its ranks stopped"
# A start refused before the launcher: `thpc_train CONFIG` from $tmp with THPC_RUN_NAME=NAME
# exits 2 with a line starting LINE, and makes no folder LEFT_OUT.
expect_refused_start() {  # NAME CONFIG LINE LEFT_OUT
  local said status
  said=$( (cd "$tmp" && THPC_RUN_NAME=$1 thpc_train "$2" "${options[@]}") 2>&1 )
  status=$?
  [ "$status" = 2 ] || fail "THPC_RUN_NAME=$1 thpc_train $2 exited $status: $said"
  grep -q "^$3" <<< "$said" || fail "no line '$3...': $said"
  [ -e "$4" ] && fail "$4 was made for a refused start"
  return 0
}
# 11. THPC_CONFIG naming no file: said with where it was looked for, exit 2, and no
# launcher or run directory (a helper's Slurm trial: the trainer's "cannot open config
# file" after mpirun's banner, from the directory the job had moved to).
expect_refused_start missing input/nonexistent.ini \
  "thpc: no config file input/nonexistent.ini in $tmp nor in $source_dir: give" \
  "$tmp/runs/missing"
# 12. A run name that leaves runs/ (it made and trained in $tmp/escaped without a word).
expect_refused_start ../escaped input/tiny.ini \
  "thpc: THPC_RUN_NAME=../escaped: a run's name is one folder under runs/" "$tmp/escaped"
# start_stand_in_job NAME [READY [VARIABLE=VALUE...]]: thpc_train of input/tiny.ini as
# Slurm's job 7 (a stand-in scontrol that records its calls in $tmp/scontrol.NAME), its
# batch shell started in $tmp with those variables set, in the background (job: its pid,
# log $tmp/NAME.log); once its log has a line matching READY (default: it trains),
# launcher and rank hold the pids of its mpirun and its rank.
start_stand_in_job() {
  local ready=${2:-^step }
  printf '#!/bin/sh\necho "$*" >> "%s/scontrol.%s"\n' "$tmp" "$1" > "$tmp/bin/scontrol"
  (cd "$tmp" && source "$source_dir/jobs/common.sh" &&
     { [ $# -lt 3 ] || export "${@:3}"; } &&
     PATH=$tmp/bin:$PATH SLURM_JOB_ID=7 ENVIRONMENT=BATCH THPC_RUN_NAME=$1 \
     thpc_train input/tiny.ini --train.max_steps=1000000 "${options[@]}") \
    > "$tmp/$1.log" 2>&1 &
  job=$!
  launcher="" rank=""
  for _ in $(seq 120); do
    if grep -q "$ready" "$tmp/$1.log"; then
      launcher=$(pgrep -f "^mpirun .*/runs/$1/")
      rank=$(pgrep -f "^$binary_dir/transformer_hpc .*/runs/$1/") && break
    fi
    sleep 0.5
  done
  [ -n "$launcher" ] && [ -n "$rank" ] ||
    { cat "$tmp/$1.log"; fail "the rank of runs/$1 never came to '$ready' under mpirun"; }
}
# end_of_stand_in_job NAME: waits for it, which must exit 0; expect_in_log NAME PATTERN
# WHAT: its log has a line matching PATTERN (extended), else fails saying WHAT.
end_of_stand_in_job() {
  wait "$job" || { status=$?; cat "$tmp/$1.log"; fail "the job of runs/$1 exited $status"; }
}
expect_in_log() {
  grep -Eq "$2" "$tmp/$1.log" || { cat "$tmp/$1.log"; fail "$3"; }
}
# expect_requeued NAME: the stand-in scontrol was asked once, to requeue job 7.
expect_requeued() {
  [ "$(cat "$tmp/scontrol.$1")" = "requeue 7" ] ||
    fail "scontrol was called with: $(cat "$tmp/scontrol.$1")"
}
# 13. SIGUSR1 to the ranks alone (under srun, `scancel --signal=USR1 JOBID` without
# --batch, or an #SBATCH --signal without B:): they checkpoint and exit 0, and the job
# ended COMPLETED, unfinished, without a word. The script reads the trainer's summary
# record and requeues (a stand-in scontrol here, Slurm's job 7).
start_stand_in_job rankstop
# 19. A second job given the same THPC_RUN_NAME meanwhile: the trainer refuses the run
# directory another trainer holds, "give this run another checkpoint.dir", which a job
# sets through THPC_RUN_NAME (said by the trainer, which has it in its environment: a
# check of the lock file by the script took a crashed run's for a live one).
second=$( (THPC_RUN_NAME=rankstop thpc_train input/tiny.ini "${options[@]}") 2>&1 ) &&
  fail "a second job on runs/rankstop exited 0: $second"
grep -q "or give this run another checkpoint.dir (in a job of jobs/: another THPC_RUN_NAME" \
  <<< "$second" || fail "the second job on runs/rankstop did not name THPC_RUN_NAME: $second"
kill -USR1 $rank
end_of_stand_in_job rankstop
expect_in_log rankstop '^thpc: the ranks were stopped by SIGUSR1, sent to them and not to' \
  "no line saying the ranks were stopped"
expect_in_log rankstop '^thpc: checkpointed after USR1; requeueing job 7' \
  "the job stopped through its ranks was not requeued"
expect_requeued rankstop
[ -f "$tmp/runs/rankstop/metrics.jsonl" ] || fail "no runs/ in the job's directory $tmp"
# 14. A launcher option mpirun does not know: its own "unknown option" and exit 1, which
# the script said as "the trainer failed (exit 1)".
refused=$( (THPC_RUN_NAME=refused THPC_MPIRUN_OPTIONS=--no-such-option \
            thpc_train input/tiny.ini "${options[@]}") 2>&1 ) &&
  fail "mpirun with --no-such-option exited 0: $refused"
grep -q "thpc: the trainer, or mpirun before it started the ranks, failed (exit 1: the" \
  <<< "$refused" || fail "mpirun's refusal was not said as possibly its own: $refused"
# 15. SIGTERM to every process of the job, as Slurm sends at a time limit reached without
# its warning (or too late for one): mpirun forwards it and exits 1 however the ranks
# stopped, and the job was said to have failed and was not requeued (under srun it was).
start_stand_in_job timeout
kill -TERM "$job" "$launcher" $rank
end_of_stand_in_job timeout
expect_in_log timeout '^thpc: the ranks stopped on SIG(TERM|USR1) and checkpointed at step' \
  "no line saying the ranks checkpointed"
expect_in_log timeout '^thpc: checkpointed after TERM; requeueing job 7' \
  "the job ended by SIGTERM to all was not requeued"
# 16. `THPC_CONFIG=conf/mine.ini sbatch --chdir=DIR ...`: the job starts in DIR, and the
# path the user gave from where sbatch was called ($tmp here) was refused.
mkdir -p "$tmp/conf" "$tmp/jobdir"
cp input/tiny.ini "$tmp/conf/mine.ini"
chdir=$( (cd "$tmp/jobdir" && source "$source_dir/jobs/common.sh" && THPC_RUN_NAME=chdir \
          thpc_train conf/mine.ini --train.max_steps=1 "${options[@]}") 2>&1 ) ||
  fail "a config relative to the submission directory, from another directory: $chdir"
grep -q "^final: step=1 " <<< "$chdir" || fail "the run with conf/mine.ini did not train: $chdir"
# 17. Ctrl-C of jobs/run_local.sh in a terminal: SIGINT to its process group, mpirun and
# the ranks included (job control puts the job in a group of its own, as a terminal's
# shell does). mpirun answers it with exit 1 after the ranks checkpointed: "the trainer
# failed (exit 1)", exit 1 (a helper's trial, also inside salloc).
set -m
(cd "$tmp" && THPC_RUN_NAME=ctrlc exec bash "$source_dir/jobs/run_local.sh" 1 \
   input/tiny.ini --train.max_steps=1000000 "${options[@]}") > "$tmp/ctrlc.log" 2>&1 &
job=$!
set +m
for _ in $(seq 120); do grep -q '^step ' "$tmp/ctrlc.log" && break; sleep 0.5; done
kill -INT -- -"$job"
end_of_stand_in_job ctrlc
expect_in_log ctrlc '^thpc: the ranks stopped on SIG[A-Z0-9]+ and checkpointed at step [0-9]+' \
  "no line saying the ranks checkpointed after Ctrl-C"
expect_in_log ctrlc '^thpc: checkpointed after INT; THPC_RUN_NAME=ctrlc continues it' \
  "no line saying how to continue after Ctrl-C"
# 18. The same stop during the ranks' start-up (a preemption's grace time while a large
# corpus is checked): they print "stopped before training" and exit 0 without a summary
# record, and the job ended COMPLETED, unfinished, without a word. The rank's start-up is
# held 20 s (a test hook); the stop comes once its handler is in place (the hook's warning).
start_stand_in_job startstop "hook THPC_TEST_SLOW_START_UP=0:20 is set" \
  THPC_TEST_SLOW_START_UP=0:20
kill -USR1 $rank
end_of_stand_in_job startstop
expect_in_log startstop '^stopped before training: SIGUSR1 received during start-up' \
  "the rank was not stopped during its start-up"
expect_in_log startstop '^thpc: the ranks were stopped by SIGUSR1 during their start-up' \
  "no line saying the ranks were stopped during their start-up"
expect_in_log startstop '^thpc: stopped before training after USR1; requeueing job 7' \
  "the job stopped during its ranks' start-up was not requeued"
expect_requeued startstop
# 21. A cancel (scancel: SIGTERM, and Slurm's answer "Reason=None, Restarts=0") before the
# launch, as between the two phases: the script requeued the job anyway, and Slurm takes a
# requeue of a job that is ending, so the cancelled job ran on.
printf '#!/bin/sh\necho "$*" >> "%s/scontrol.cancelled"\n%s\n' "$tmp" \
  'case $1 in show) echo "JobId=7 JobState=COMPLETING Reason=None Restarts=0" ;; esac' \
  > "$tmp/bin/scontrol"
cancelled=$( (cd "$tmp" && PATH=$tmp/bin:$PATH SLURM_JOB_ID=7 ENVIRONMENT=BATCH \
              THPC_RUN_NAME=cancelled bash -c 'source "$1"/jobs/common.sh && kill -TERM $$ &&
              thpc_train input/tiny.ini --train.max_steps=2 --train.backend=cpu' _ \
              "$source_dir") 2>&1 ) &&
  fail "a job cancelled before its launch exited 0: $cancelled"
grep -q "^thpc: the job was cancelled (scancel): not requeued. Nothing was trained" \
  <<< "$cancelled" || fail "the cancel before the launch was not said: $cancelled"
grep -q requeue "$tmp/scontrol.cancelled" &&
  fail "the cancelled job was requeued: $(cat "$tmp/scontrol.cancelled")"
# 22. A stop that comes as the run ends on its own (its final checkpoint, the averages):
# it was requeued ("checkpointed after USR1") and trained nothing. A stand-in mpirun runs
# the real one, then sends SIGUSR1 to the batch shell. 20. The same with
# `--train.metrics_dir=` (empty: checkpoint.dir's, the trainer's default), with which the
# script looked for the summary in /metrics.jsonl.
mkdir -p "$tmp/late"
printf '#!/bin/bash\ntrap "" USR1\n%s "$@"\nstatus=$?\n%s\n' "$(command -v mpirun)" \
  'kill -USR1 $PPID; sleep 1; exit $status' > "$tmp/late/mpirun"
chmod +x "$tmp/late/mpirun"
# (And the start-up stop file a killed batch shell left in the run directory is removed.)
mkdir -p "$tmp/runs/lateststop"
: > "$tmp/runs/lateststop/.startup_stop.6.123"
for name in lateststop emptymetrics; do
  printf '#!/bin/sh\necho "$*" >> "%s/scontrol.%s"\n' "$tmp" "$name" > "$tmp/bin/scontrol"
  metrics_option=()
  [ "$name" = emptymetrics ] && metrics_option=(--train.metrics_dir=)
  (cd "$tmp" && source "$source_dir/jobs/common.sh" &&
     PATH=$tmp/late:$tmp/bin:$PATH SLURM_JOB_ID=7 ENVIRONMENT=BATCH THPC_RUN_NAME=$name \
     thpc_train input/tiny.ini --train.max_steps=2 "${metrics_option[@]}" "${options[@]}") \
    > "$tmp/$name.log" 2>&1 ||
    { cat "$tmp/$name.log"; fail "runs/$name, stopped as it ended, failed"; }
  expect_in_log "$name" '^thpc: USR1 came as the run ended on its own \(finished at step 2\)' \
    "no line saying runs/$name had ended when the stop came"
  [ ! -s "$tmp/scontrol.$name" ] ||
    fail "runs/$name, finished, was requeued: $(cat "$tmp/scontrol.$name")"
  left=$(find "$tmp/runs/$name" -name '.startup_stop.*')
  [ -z "$left" ] || fail "start-up stop files left in runs/$name: $left"
done
# 23. The same as phase 1 of the averaged window ends, outside a batch job (bash
# jobs/base.sbatch, salloc): phase 2 did not start, and the script said nothing of it.
(cd "$tmp" && source "$source_dir/jobs/common.sh" && PATH=$tmp/late:$PATH \
   THPC_RUN_NAME=phaseone thpc_train_averaged input/tiny.ini 70 3 20 "${options[@]}") \
  > "$tmp/phaseone.log" 2>&1 || { cat "$tmp/phaseone.log"; fail "runs/phaseone failed"; }
expect_in_log phaseone '^thpc: USR1 came as phase 1 ended on its own \(finished at step 40\)' \
  "no line saying phase 1 had ended when the stop came"
expect_in_log phaseone '^thpc: phase 2 not started after USR1; THPC_RUN_NAME=phaseone' \
  "no line saying phase 2 did not start"
# 24. SIGHUP (a closed terminal, kill -HUP) is a stop like the others: the script exited
# 129 without a word while its ranks checkpointed (a helper's trial). Here before the
# launch, with a checkpoint.dir of the options' own, which the advice to continue names
# (THPC_RUN_NAME alone looked in runs/NAME/checkpoints and was refused).
hup=$( (cd "$tmp" && THPC_RUN_NAME=hup bash -c 'source "$1"/jobs/common.sh && kill -HUP $$ &&
        thpc_train input/tiny.ini --train.max_steps=2 --train.backend=cpu \
          --checkpoint.dir="$2"' _ "$source_dir" "$tmp/own ck") 2>&1 ) ||
  fail "a job stopped by SIGHUP before its launch failed: $hup"
grep -q "^thpc: HUP received before the trainer started; not started" <<< "$hup" ||
  fail "the SIGHUP before the launch was not said: $hup"
grep -qF "THPC_RUN_NAME=hup with --checkpoint.dir=$(printf '%q' "$tmp/own ck") continues it" \
  <<< "$hup" || fail "the advice to continue does not name the options' checkpoint.dir: $hup"
# 25. A requeue inside phase 2's window with checkpoint.keep = the window (base.ini's 5 and
# 5, big.ini's 20 and 20): the stop checkpoint at 65, kept as the last known good, pruned
# step 40 when the run went on (the script set keep = LAST + 1 for it until 2026-12-06).
# Each job its own shell, as each requeue is.
export THPC_RUN_NAME=requeued
for stop in 65 ""; do
  (source "$source_dir/jobs/common.sh" && THPC_TEST_STOP_AT_STEP=$stop \
     thpc_train_averaged input/tiny.ini 70 3 20 "${options[@]}") > "$tmp/requeued.log" 2>&1 ||
    { cat "$tmp/requeued.log"; fail "runs/requeued (stop at '$stop') failed"; }
done
requeued=$tmp/runs/requeued/checkpoints
kept=$(cd "$requeued" && ls step_*.h5 | tr '\n' ' ')
[ "$kept" = "step_00000040.h5 step_00000060.h5 step_00000065.h5 step_00000070.h5 " ] ||
  fail "step checkpoints kept after a requeue at 65: '$kept', expected 40, 60, 65 and 70"
expect_in_log requeued "^average of the last 3 checkpoints written to $requeued/average_last3.h5" \
  "the requeued run's average was not of 3 checkpoints"
[ "$(digest_of "$tmp/requeued.log")" = "$two_phase" ] ||
  fail "the requeued run ended at other parameters than the uninterrupted one"
if command -v h5dump >/dev/null; then
  uninterrupted=$(params_digest "$dir/average_last3.h5")
  [ "$(params_digest "$requeued/average_last3.h5")" = "$uninterrupted" ] ||
    fail "the requeued run's average_last3.h5 is not the uninterrupted run's"
fi
# 26. A config whose checkpoint.keep (2) is below the window (3), raised by the script:
# requeued inside phase 2 and again after the end, each job re-running phase 1 (the
# trainer refuses a resume whose keep, from the config file alone, is lower than its
# run's; phase 1 was given the config's 2 against phase 2's 3, and every requeue failed).
{ cat "$source_dir/input/tiny.ini"; printf '\n[checkpoint]\nkeep = 2\n'; } > "$tmp/keep2.ini"
export THPC_RUN_NAME=keep_below
for stop in 65 "" ""; do
  (source "$source_dir/jobs/common.sh" && THPC_TEST_STOP_AT_STEP=$stop \
     thpc_train_averaged "$tmp/keep2.ini" 70 3 20 --train.backend=cpu --train.log_every=10) \
    > "$tmp/keep_below.log" 2>&1 ||
    { cat "$tmp/keep_below.log"; fail "runs/keep_below (stop at '$stop') failed"; }
done
[ "$(digest_of "$tmp/keep_below.log")" = "$two_phase" ] ||
  fail "the run of keep = 2 ended at other parameters than the uninterrupted one"
[ -f "$tmp/runs/keep_below/checkpoints/average_last3.h5" ] || fail "runs/keep_below: no average"
# 27. sbatch -J exp/a: runs/exp/a-ID, which the messages' THPC_RUN_NAME=a-ID did not find,
# and -J ../../x wrote outside runs/ (a helper's walk).
for job_name in exp/a ../../x; do
  made=$(unset THPC_RUN_NAME; SLURM_JOB_NAME=$job_name thpc_run_dir)
  [ "$(dirname -- "$made")" = "$tmp/runs" ] ||
    fail "the job name $job_name made the run directory $made, not one folder of $tmp/runs"
done
[ -d "$tmp/runs/exp_a-local-$$" ] || fail "no run directory runs/exp_a-local-$$: $(ls "$tmp/runs")"
# 28. A fine-tuning job given --checkpoint.resume=FILE of another run: phase 1 resumes FILE,
# phase 2 and a requeue continue the job's own checkpoints (the trainer refuses FILE again
# into a directory holding its continuation, which it would abandon; the job failed there).
export THPC_RUN_NAME=from_file
from_file=$tmp/runs/whole/checkpoints/step_00000070.h5
for stop in 85 ""; do
  (source "$source_dir/jobs/common.sh" && THPC_TEST_STOP_AT_STEP=$stop \
     thpc_train_averaged input/tiny.ini 110 3 10 "${options[@]}" \
     --checkpoint.resume "$from_file") > "$tmp/from_file.log" 2>&1 ||
    { cat "$tmp/from_file.log"; fail "runs/from_file (stop at '$stop') failed"; }
done
grep -q "continuing its newest (checkpoint.resume=auto) rather than $from_file again" \
  "$tmp/from_file.log" || { cat "$tmp/from_file.log"; fail "the continuation was not said"; }
[ -f "$tmp/runs/from_file/checkpoints/average_last3.h5" ] ||
  { cat "$tmp/from_file.log"; fail "runs/from_file: no average"; }
echo "PASSED"
