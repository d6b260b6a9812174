#!/usr/bin/env bash
# Constituency parsing end to end (§6.3): the NLTK WSJ sample split into train
# wsj_0001-0159, dev wsj_0160-0179 and test wsj_0180-0199, linearized, preprocessed
# into HDF5 shards (bracket tokens kept whole), trained with CONFIG, the dev and test
# sentences beam-searched with the config's [decode] settings, the sequences turned
# back into trees (repaired, or replaced by the right-branching baseline, and counted),
# and everything scored with EVALB's COLLINS.prm beside the right-branching baseline.
#
#   bash tools/run_parser.sh [CONFIG.ini] [--section.key=value ...]   # overrides go to the trainer
#
# CONFIG defaults to input/parse_tiny.ini; its model.vocab_size is the SentencePiece
# vocabulary and its data.dir / checkpoint.dir say where shards and checkpoints go
# (checkpoints of an earlier run there are moved to DIR.previous first).
# Environment: THPC_DATA (required: the folder `bash tools/fetch_data.sh ptb_sample DIR`
# and `bash tools/fetch_data.sh evalb DIR` fill), BUILD (default build), WORK (the text
# and trees, default BUILD/parse), MAX_LEN (the longest training pair in pieces, default
# 200), EVAL_LIMIT (decode only the first N dev and test sentences; default all),
# EVAL_MAX_WORDS (decode only the sentences of at most N words; default all), MPIRUN
# (e.g. "mpirun -np 2"), PREPARE_ONLY=1 (stop after the shards: to train elsewhere, e.g.
# sbatch jobs/parse_wsj.sbatch), CHECKPOINT=FILE (no preprocessing or training: decode
# and score this checkpoint, with the SentencePiece model it carries), TREE_CONSTRAINTS=0
# (decode without the well-formed-tree constraint).
set -euo pipefail
fail() { echo "run_parser.sh: $*" >&2; exit 1; }
fetch="fetch the data with 'bash tools/fetch_data.sh ptb_sample DIR' and 'bash tools/fetch_data.sh evalb DIR', then set THPC_DATA=DIR"
[[ -n ${THPC_DATA:-} && -d ${THPC_DATA:-} ]] || fail "THPC_DATA (${THPC_DATA:-unset}) is not a folder: $fetch"
data=$(cd "$THPC_DATA" && pwd)  # absolute: the script changes directory
# Paths the caller gives are the caller's: CONFIG and CHECKPOINT made absolute before the
# script changes directory (before: ./my.ini from elsewhere was "no such config file").
absolute() { [[ $1 == /* ]] && echo "$1" || echo "$PWD/$1"; }
config=input/parse_tiny.ini
if [[ $# -gt 0 && $1 != --* ]]; then config=$(absolute "$1"); shift; fi
[[ -n ${CHECKPOINT:-} ]] && CHECKPOINT=$(absolute "$CHECKPOINT")
build=${BUILD:-${THPC_BUILD:-}}  # THPC_BUILD as the job scripts and evaluate.sh name it
[[ -n $build ]] && build=$(absolute "$build")
[[ -n ${WORK:-} ]] && WORK=$(absolute "$WORK")
cd "$(dirname "$0")/.."
source tools/train_logged.sh
build=${build:-build}
[[ -f $config ]] || fail "$config: no such config file"
work=${WORK:-$build/parse}
trees=$data/ptb_sample/combined
prm=$data/evalb/COLLINS.prm
for needed in "$trees/wsj_0001.mrg" "$trees/wsj_0199.mrg" "$prm"; do
  [[ -e $needed ]] || fail "$needed is missing: $fetch"
done

# One key of the config file (the trainer's own parser checks the file; this only reads).
ini_value() {
  awk -F= -v section="$1" -v key="$2" '
    /^[[:space:]]*\[/ { gsub(/[][[:space:]]/, ""); current = $0; next }
    { name = $1; gsub(/[[:space:]]/, "", name) }
    current == section && name == key { sub(/^[^=]*=[[:space:]]*/, ""); sub(/[[:space:]]*#.*/, ""); print; exit }
  ' "$config"
}
vocab=$(ini_value model vocab_size)
shards=$(ini_value data dir)
checkpoints=$(ini_value checkpoint dir)
metrics_dir=$(ini_value train metrics_dir)
metrics_given=0
leaves=$(ini_value decode tree_leaves)
for override in "$@"; do  # the trainer's overrides of these keys hold here too
  case $override in
    --decode.tree_leaves=*) leaves=${override#*=} ;;
    --model.vocab_size=*) vocab=${override#*=} ;;
    --data.dir=*) shards=${override#*=} ;;
    --checkpoint.dir=*) checkpoints=${override#*=} ;;
    --train.metrics_dir=*) metrics_dir=${override#*=} metrics_given=1 ;;
  esac
done
if [[ -z $vocab || $vocab == 0 || -z $shards || -z $checkpoints ]]; then
  fail "$config must set model.vocab_size (> 0), data.dir and checkpoint.dir"
fi
leaves=${leaves:-XX}  # the trainer checks the value; the checkpoint carries it to decoding

mkdir -p "$work"
# The .mrg files of a split, one argument each (a THPC_DATA path with spaces split apart).
linearize() {
  local split=$1 first=$2 last=$3 i files=()
  for (( i = first; i <= last; i++ )); do files+=("$(printf '%s/wsj_%04d.mrg' "$trees" "$i")"); done
  "$build/transformer_trees" linearize --leaves "$leaves" --output "$work/$split" "${files[@]}"
}
linearize train 1 159
linearize dev 160 179
linearize test 180 199
# The sentences decoded: the first EVAL_LIMIT (0 = all) of those with at most
# EVAL_MAX_WORDS words (0 = any length), the same lines of words, tags and gold trees.
for split in dev test; do
  awk -v max="${EVAL_MAX_WORDS:-0}" -v limit="${EVAL_LIMIT:-0}" \
    '(max == 0 || NF <= max) && (limit == 0 || ++kept <= limit) { print NR }' \
    "$work/$split.words" > "$work/$split.eval.lines"
  for part in words tags gold; do
    awk 'NR == FNR { chosen[$1] = 1; next } FNR in chosen' "$work/$split.eval.lines" \
      "$work/$split.$part" > "$work/$split.eval.$part"
  done
done

if [[ -z ${CHECKPOINT:-} ]]; then
  # Every opening bracket of the training trees, ')' and the word placeholder: whole tokens
  # (with words as leaves, the words are split into pieces as the sentences are).
  symbols=$(tr ' ' '\n' < "$work/train.tree" | grep '^(' | sort -u | paste -sd, -)",)"
  [[ $leaves == XX ]] && symbols+=",XX"
  "$build/transformer_preprocess" --source-lang words --target-lang tree \
    --trainpref "$work/train" --validpref "$work/dev" --testpref "$work/test" \
    --destdir "$shards" --vocab-size "$vocab" --user-symbols "$symbols" \
    --max-len "${MAX_LEN:-200}" --seed 1 2> "$work/preprocess.log" \
    || { cat "$work/preprocess.log" >&2; exit 1; }
  grep -E '^(train|valid|test):' "$work/preprocess.log" || true
  if [[ ${PREPARE_ONLY:-0} == 1 ]]; then echo "run_parser.sh: shards in $shards"; exit 0; fi

  # An earlier run's checkpoints and metrics go to a folder of their own, never removed:
  # DIR.previous, or DIR.previous.2, .3, ... when the earlier ones are taken (a third run
  # used to delete the first one's, hours of training with parse_wsj.ini).
  previous=$checkpoints.previous
  for (( n = 2; ; n++ )); do
    [[ -e $previous ]] || break
    previous=$checkpoints.previous.$n
  done
  moved=0
  if compgen -G "$checkpoints/*.h5" > /dev/null; then
    mv "$checkpoints" "$previous"
    moved=1
  fi
  # Its metrics too: the trainer refuses to start a new run beside another run's files.
  # They go to the run directory that holds checkpoints/ unless train.metrics_dir says.
  run_dir=${metrics_dir:-$(dirname "$checkpoints")}
  for file in "$run_dir/metrics.jsonl" "$run_dir"/events.out.tfevents.*; do
    [[ -e $file ]] || continue
    mkdir -p "$previous"
    mv "$file" "$previous/"
    moved=1
  done
  if [[ $moved == 1 ]]; then
    echo "run_parser.sh: the files of an earlier run (checkpoints, metrics) are in $previous" >&2
  fi
  metrics=()
  [[ $metrics_given == 1 ]] || metrics=(--train.metrics_dir="$run_dir")
  # (tools/train_logged.sh: a training stopped by a signal is not scored; a second run of
  # this script, which the trainer's own advice asked for, moved its checkpoints away)
  thpc_train_logged "$work/train.log" \
    "continue it from $PWD with ${MPIRUN:+$MPIRUN }$build/transformer_hpc $config \
${metrics[*]:+${metrics[*]} }${*:+$* }--checkpoint.resume=auto, then score it with \
CHECKPOINT=FILE bash tools/run_parser.sh (a new run of this script starts over, the \
checkpoints moved to $checkpoints.previous*)" \
    ${MPIRUN:-} "$build/transformer_hpc" "$config" "${metrics[@]}" "$@"
  # (Not `ls | tail`: under pipefail ls's failure ended the script with its exit 2, this
  # line unsaid.)
  CHECKPOINT=$( { find "$checkpoints" -maxdepth 1 -name 'step_*.h5' 2> /dev/null || true; } |
               sort | tail -n 1)
  [[ -n $CHECKPOINT ]] || fail "no checkpoint in $checkpoints after training"
fi

# The "-- All --" F-measure of an EVALB report; EVALB's 0/0 (no bracket of a scored
# sentence matched, a parser that gave flat trees) prints as nan: F1 0.00 (a helper saw
# "parser F1 -nan" after a 20-step training).
f_measure() {
  awk '/^-- All --/ { all = 1 }
       all && /^Bracketing FMeasure/ {
         print ($NF ~ /nan/ ? "0.00 (no bracket matched)" : $NF); exit
       }' "$1"
}
# Constrained decoding (transformer_decode --tree-constraints): only well-formed trees
# over exactly the sentence's words (with words as leaves: its pieces copied in order;
# the checkpoint's decode.tree_leaves says which); TREE_CONSTRAINTS=0 decodes freely and
# leaves the repairs to delinearize.
constraints=--tree-constraints
[[ ${TREE_CONSTRAINTS:-1} == 0 ]] && constraints=
for split in dev test; do
  "$build/transformer_decode" --checkpoint "$CHECKPOINT" --input "$work/$split.eval.words" \
    --output "$work/$split.hyp.tree" $constraints
  "$build/transformer_trees" delinearize --words "$work/$split.eval.words" \
    --tags "$work/$split.eval.tags" --input "$work/$split.hyp.tree" \
    --output "$work/$split.hyp.gold" 2> "$work/$split.delinearize.log"
  "$build/transformer_trees" baseline --words "$work/$split.eval.words" \
    --tags "$work/$split.eval.tags" --output "$work/$split.baseline.gold" 2> /dev/null
  "$build/transformer_evalb" -p "$prm" "$work/$split.eval.gold" "$work/$split.hyp.gold" \
    > "$work/$split.evalb"
  "$build/transformer_evalb" -p "$prm" "$work/$split.eval.gold" "$work/$split.baseline.gold" \
    > "$work/$split.baseline.evalb"
  sentences=$(wc -l < "$work/$split.eval.gold")
  echo "$split: parser F1 $(f_measure "$work/$split.evalb") | right-branching F1" \
       "$(f_measure "$work/$split.baseline.evalb") | $sentences sentences," \
       "$(sed 's/^delinearize: [0-9]* trees: //; s/ ->.*//' "$work/$split.delinearize.log")"
done
