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
# (checkpoints of an earlier run there are moved to DIR.previous first, once a dry run has
# accepted the options). CONFIG, the options' paths, CHECKPOINT, BUILD and WORK are read
# from where the caller stands; the paths inside CONFIG from the repository's root, where
# the script runs (the repository's configs name build/...).
# Environment: THPC_DATA (required: the folder `bash tools/fetch_data.sh ptb_sample DIR`
# and `bash tools/fetch_data.sh evalb DIR` fill), BUILD (default the repository's build/,
# wherever the caller stands), OUT=DIR (one folder for all the run writes: WORK defaults to
# DIR/work, --data.dir to DIR/data, --checkpoint.dir to DIR/checkpoints; a read-only
# install's user needed all three), WORK (the text and trees, default BUILD/parse), MAX_LEN
# (the longest training pair in pieces, default 200), EVAL_LIMIT (decode only the first N
# dev and test sentences; default all), EVAL_MAX_WORDS (decode only the sentences of at
# most N words; default all), MPIRUN (e.g. "mpirun -np 2"), PREPARE_ONLY=1 (stop after
# the shards: to train elsewhere, e.g. sbatch jobs/parse_wsj.sbatch; options other than
# --data.dir, --model.vocab_size and --decode.tree_leaves are refused), CHECKPOINT=FILE (no
# preprocessing or training: decode and score this checkpoint, with the SentencePiece model
# it carries; --decode.* options go to transformer_decode, others are refused),
# TREE_CONSTRAINTS=0 (decode without the well-formed-tree constraint).
set -euo pipefail
fail() { echo "run_parser.sh: $*" >&2; exit 1; }
# A setting or option that cannot be right: exit 2, as the trainer's for a bad configuration.
refuse() { echo "run_parser.sh: $*" >&2; exit 2; }
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
if [[ -n ${OUT:-} ]]; then
  OUT=$(absolute "$OUT")
  WORK=${WORK:-$OUT/work}
  # (an option given says where that part goes; CHECKPOINT= and PREPARE_ONLY=1 take only
  # the options they use)
  given() {
    local prefix=$1 option
    shift
    for option; do [[ $option == "$prefix"* ]] && return 0; done
    return 1
  }
  if [[ -z ${CHECKPOINT:-} ]] && ! given --data.dir= "$@"; then
    set -- "$@" "--data.dir=$OUT/data"
  fi
  if [[ -z ${CHECKPOINT:-} && ${PREPARE_ONLY:-0} != 1 ]] && ! given --checkpoint.dir= "$@"; then
    set -- "$@" "--checkpoint.dir=$OUT/checkpoints"
  fi
fi
[[ -n ${WORK:-} ]] && WORK=$(absolute "$WORK")

# The script's settings, checked before any work (MAX_LEN=abc was transformer_preprocess's
# "--max-len: 'abc' is not a whole number", an option the user never typed; EVAL_LIMIT=abc
# decoded everything; EVAL_LIMIT=-3 selected nothing and ended in an EVALB error).
for setting in MAX_LEN EVAL_LIMIT EVAL_MAX_WORDS; do
  value=${!setting:-}
  unset_means="all sentences"
  if [[ $setting == MAX_LEN ]]; then unset_means=200; fi
  [[ -z $value || $value =~ ^[1-9][0-9]*$ ]] || refuse "$setting='$value' is not a whole" \
    "number of at least 1: give one, or unset $setting (then $unset_means)"
done
for setting in PREPARE_ONLY TREE_CONSTRAINTS; do  # PREPARE_ONLY=yes trained
  value=${!setting:-}
  [[ $value =~ ^[01]?$ ]] || refuse "$setting='$value': give 0 or 1, or unset it"
done
if [[ -n ${CHECKPOINT:-} ]]; then
  [[ ${PREPARE_ONLY:-0} == 0 ]] || refuse "CHECKPOINT= scores a checkpoint and" \
    "PREPARE_ONLY=1 stops before training: unset one of them"
  # Before the splits are linearized (the train split too): a missing file was said by
  # transformer_decode, after all of that.
  [[ -f $CHECKPOINT ]] || fail "CHECKPOINT=$CHECKPOINT: no such file: give the path" \
    "of a checkpoint (runs/NAME/checkpoints/step_*.h5)"
fi

# The options: --section.key=value alone (the trainer also takes --key value, but this
# script reads some of the keys, and must read what the trainer gets). Their relative
# paths are the caller's, as CONFIG's are: made absolute before the script moves to the
# repository (--data.dir=mydata was the repository's mydata). Not a keyword (resume =
# auto) nor what the trainer refuses, naming it (~, $VAR, quotes).
options=()
for option in "$@"; do
  [[ $option =~ ^--[A-Za-z0-9_]+\.[A-Za-z0-9_]+= ]] || refuse "'$option' is not written" \
    "--section.key=value: write it so (build/transformer_hpc --help lists the keys)"
  case $option in
    --data.dir=*|--checkpoint.dir=*|--checkpoint.init=*|--checkpoint.resume=*|\
    --train.metrics_dir=*)
      case ${option#*=} in
        ''|/*|auto|auto_or_fresh|'~'*|*'$'*|\"*|\'*) ;;
        *) option=${option%%=*}=$PWD/${option#*=} ;;
      esac ;;
  esac
  options+=("$option")
done
set -- "${options[@]}"
# Options that would have no effect are refused, not dropped (CHECKPOINT= ignored
# --bogus.key=7, exit 0). With CHECKPOINT= the [decode] keys become transformer_decode's
# options, their values checked here against the keys' ranges (docs/configuration.md), so
# that a bad one is said as typed; with PREPARE_ONLY=1 only the keys the shards depend on
# apply.
decode_options=()
# A number >= 0 as the trainer's option table reads one: 0.3, .3, 3, 1e-1, 3E+0.
number='^([0-9]+[.]?[0-9]*|[.][0-9]+)([eE][-+]?[0-9]+)?$'
decode_option() {  # KEY VALUE
  local flag pattern range
  case $1 in
    beam) flag=--beam pattern='^[1-9][0-9]*$' range='a whole number of at least 1' ;;
    alpha) flag=--lenpen pattern=$number range='a number >= 0' ;;
    max_len_a) flag=--max-len-a pattern=$number range='a number >= 0' ;;
    max_len_b) flag=--max-len-b pattern='^[0-9]+$' range='a whole number >= 0' ;;
    tree_leaves) flag=--tree-leaves pattern='^(XX|words)$' range='XX or words'
      [[ ${TREE_CONSTRAINTS:-1} == 1 ]] || refuse "--decode.tree_leaves has no effect with" \
        "TREE_CONSTRAINTS=0 (only the constrained search reads it): drop one of them" ;;
    *) refuse "--decode.$1: not a key transformer_decode takes (beam, alpha, max_len_a," \
         "max_len_b, tree_leaves)" ;;
  esac
  [[ $2 =~ $pattern ]] || refuse "--decode.$1='$2': give $range"
  decode_options+=("$flag" "$2")
}
for option in "$@"; do
  key=${option%%=*}
  if [[ -n ${CHECKPOINT:-} ]]; then
    [[ $key == --decode.* ]] || refuse "$option has no effect with CHECKPOINT= (no" \
      "training): drop it; the --decode.* options apply, to transformer_decode"
    decode_option "${key#--decode.}" "${option#*=}"
  elif [[ ${PREPARE_ONLY:-0} == 1 ]]; then
    case $key in
      --data.dir|--model.vocab_size|--decode.tree_leaves) ;;
      *) refuse "$option has no effect with PREPARE_ONLY=1 (no training): give it to" \
           "the training; the shards take --data.dir, --model.vocab_size, --decode.tree_leaves" ;;
    esac
  fi
done

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
  # Said before training (EVAL_MAX_WORDS=3 ended in an EVALB error on test's empty files).
  if [[ ! -s $work/$split.eval.lines ]]; then
    shortest=$(awk 'NR == 1 || NF < min { min = NF } END { print min }' "$work/$split.words")
    refuse "EVAL_MAX_WORDS=${EVAL_MAX_WORDS:-}: no $split sentence is that short (the" \
      "shortest has $shortest word(s)): raise EVAL_MAX_WORDS, or unset it for all lengths"
  fi
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
  if [[ ${PREPARE_ONLY:-0} == 1 ]]; then
    echo "run_parser.sh: shards in $(absolute "$shards")"
    exit 0
  fi

  # The options checked before anything is moved (a typo in one moved the earlier run's
  # checkpoints aside, then the trainer refused it, exit 2: checkpoints/ empty, and one more
  # DIR.previous.N for each typo). A dry run of the same config and options on the new shards,
  # checkpoint.dir and metrics in an empty temporary folder, as the real ones are once the
  # earlier files are moved (beside them a dry run refuses them, as training would).
  probe=$(mktemp -d)
  probe_options=()
  for option in "$@"; do
    case $option in
      --checkpoint.dir=*|--train.metrics_dir=*) ;;
      *) probe_options+=("$option") ;;
    esac
  done
  status=0
  ${MPIRUN:-} "$build/transformer_hpc" "$config" --checkpoint.dir="$probe/checkpoints" \
    --train.metrics_dir="$probe" "${probe_options[@]}" --dry-run > "$probe/dry_run.log" 2>&1 ||
    status=$?
  if (( status != 0 )); then
    cat "$probe/dry_run.log" >&2
    rm -rf "$probe"
    exit "$status"
  fi
  rm -rf "$probe"

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
  # The newest healthy checkpoint, as the trainer names it at its end ("checkpoint to
  # resume from: PATH (step N, loss L)"): the newest by name may be marked diverged (a
  # validation after it diverged), which transformer_decode refuses (a review's finding).
  CHECKPOINT=$(sed -n 's/^checkpoint to resume from: \(.*\) (step [0-9]*, loss .*)$/\1/p' \
               "$work/train.log" | tail -n 1)
  if [[ -z $CHECKPOINT ]]; then
    CHECKPOINT=$( { find "$checkpoints" -maxdepth 1 -name 'step_*.h5' 2> /dev/null || true; } |
                 sort | tail -n 1)
  fi
  [[ -n $CHECKPOINT ]] || fail "no checkpoint in $checkpoints after training"
  # A run that keeps its best checkpoint (checkpoint.keep_best, parse_wsj.ini's f1: the dev
  # split's bracket F1 at each validation) is scored with it, as the paper chose its
  # settings on the development set: its last "best checkpoint PATH (step N, valid f1 X)".
  best=$(sed -n 's/^best checkpoint \(.*\) (step [0-9]*, valid .*)$/\1/p' "$work/train.log" |
         tail -n 1)
  if [[ -n $best && -f $best ]]; then
    echo "run_parser.sh: scoring $best, the best validation's ($(sed -n \
      's/^best checkpoint .* (\(step [0-9]*, valid .*\))$/\1/p' "$work/train.log" | tail -n 1);" \
      "the last: $CHECKPOINT); dev chose it, test's F1 is the unbiased one"
    CHECKPOINT=$best
  fi
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
    --output "$work/$split.hyp.tree" $constraints "${decode_options[@]}"
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
  # One sentence is "1 sentence", and delinearize's count ("1 tree:" too) is cut either way.
  noun=sentences
  (( sentences != 1 )) || noun=sentence
  echo "$split: parser F1 $(f_measure "$work/$split.evalb") | right-branching F1" \
       "$(f_measure "$work/$split.baseline.evalb") | $sentences $noun," \
       "$(sed -E 's/^delinearize: [0-9]+ trees?: //; s/ ->.*//' "$work/$split.delinearize.log")"
done
