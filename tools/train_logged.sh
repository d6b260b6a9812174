# Sourced by run_default_job.sh, run_parser.sh and run_multi30k.sh (from the repository's
# root): their training run, checked the same way in all three.
#
#   thpc_train_logged LOG WHAT_TO_DO TRAINER_COMMAND...
#
# Runs the trainer with its lines on standard output and in LOG, through a tee deaf to the
# INT, TERM and HUP that reach the whole process group, so that LOG keeps the last lines.
# A training stopped by a signal exits 0 after its checkpoint (mpirun 1): it is not to be
# evaluated as if it had finished (the scripts averaged, decoded and scored it, exit 0), so
# this says "SCRIPT: the training was stopped before its end (the 'stopped' line above):
# WHAT_TO_DO" and exits 1. Any other failure exits with the trainer's status. The script
# waits for the trainer through TERM and HUP as bash does through INT (a TERM to the group,
# timeout's or the scheduler's, ended the script at once, exit 143, without the advice,
# while the trainer wrote its checkpoint; a helper's finding).
thpc_train_logged() {
  local log=$1 what_to_do=$2 status=0
  shift 2
  trap : TERM HUP
  "$@" | (trap '' INT TERM HUP; exec tee "$log") || status=$?
  trap - TERM HUP
  if grep -q '^stopped' "$log"; then
    echo "$(basename "$0"): the training was stopped before its end (the 'stopped' line" \
         "above): $what_to_do" >&2
    exit 1
  fi
  (( status == 0 )) || exit "$status"
}
