#!/usr/bin/env bash
# Evaluates a run as the paper does (§6.1): average the last N checkpoints, translate a
# test set with beam search, score with sacreBLEU-exact BLEU.
#
#   tools/evaluate.sh CHECKPOINT_DIR|CHECKPOINT [SPM_MODEL] SOURCE REFERENCE [N] [-- decode options]
#
#   tools/evaluate.sh checkpoints \
#       $THPC_DATA/wmt14_test/newstest2014.en $THPC_DATA/wmt14_test/newstest2014.de 5
#
# SPM_MODEL defaults to the SentencePiece model stored in the checkpoint (the trainer
# stores the one of its shards). N (default 5, the paper's base recipe; 20 for big)
# applies to a directory; a single checkpoint file is decoded as it is. The translations
# are kept next to the average, named by the model and the source (a checkpoint file's in
# eval/ beside it, or beside it when it is an average in an eval/ folder already)
# (DIR/eval/average_last5.newstest2014.en.hyp; the decode options after -- are part of the
# name, and those that write no one translation a line, --nbest and --dump-*, are
# refused). THPC_BUILD names the build directory (default: the repository's build/, or
# an installation's bin/). EVERY_STEPS=K averages the last N of the run's
# checkpoint.every_steps schedule (transformer_average --every-steps: a requeued job's
# stop checkpoints passed over), named average_lastN_everyK.h5. SCORE_OPTIONS, when set,
# scores the translations a second time with those transformer_score options:
# SCORE_OPTIONS="--tokenize moses-compound" adds the paper's tokenized BLEU with compound
# splitting (EN-DE; docs/wmt14.md) to sacreBLEU's.
set -euo pipefail
usage() { sed -n '2,23p' "$0" >&2; exit 2; }
positional=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do positional+=("$1"); shift; done
[ $# -gt 0 ] && shift  # the "--"
last=5 last_given=""
count=${#positional[@]}
if [ "$count" -ge 4 ] && [[ ${positional[count - 1]} =~ ^[0-9]+$ ]]; then
  last=${positional[count - 1]} last_given=1
  unset 'positional[count - 1]'
  count=$((count - 1))
fi
case $count in
  3) checkpoint=${positional[0]} spm='' source=${positional[1]} reference=${positional[2]} ;;
  4) checkpoint=${positional[0]} spm=${positional[1]} source=${positional[2]}
     reference=${positional[3]} ;;
  *) usage ;;
esac
# BUILD as the run_*.sh scripts name it; by default the repository's build/, wherever this
# runs from (a build/ of the working directory was taken, or none found); for the
# installed copy (PREFIX/share/transformer_hpc/tools) PREFIX/bin, else those on PATH.
here=$(cd "$(dirname "$0")" && pwd)
# BUILD before THPC_BUILD when both are set, as the run_*.sh scripts take them (the one
# order tools/README.md gives).
if [ -n "${BUILD:-${THPC_BUILD:-}}" ]; then
  build=${BUILD:-$THPC_BUILD}
elif [ -x "$here/../build/transformer_decode" ]; then
  build=$here/../build
elif [ -x "$here/../../../bin/transformer_decode" ]; then
  build=$(cd "$here/../../../bin" && pwd)
elif command -v transformer_decode > /dev/null; then
  build=$(dirname "$(command -v transformer_decode)")
else
  build=$here/../build
fi
if [ ! -x "$build/transformer_decode" ]; then
  echo "evaluate.sh: no program $build/transformer_decode: build it (README), or set" \
       "THPC_BUILD to the folder that holds it" >&2
  exit 1
fi
# The decode options it passes on give one translation a line, into the file it scores:
# --nbest wrote an n-best list over the 1-best file, then the score failed on its line
# count; --output and --input are this script's own. Abbreviated too, as the decoder
# takes them (--nb 2).
for option in "$@"; do
  name=${option%%=*}
  [[ $name == --?* ]] || continue
  for refused in --nbest --dump-attention --dump-lines --output --input; do
    if [[ $refused == "$name"* ]]; then
      echo "evaluate.sh: decode option $name ($refused) is not one to score with: run" \
           "$build/transformer_decode yourself for it" >&2
      exit 2
    fi
  done
done
for f in ${spm:+"$spm"} "$source" "$reference"; do
  [ -f "$f" ] || { echo "evaluate.sh: no such file: $f" >&2; exit 1; }
done

if [ -d "$checkpoint" ]; then
  out_dir=$checkpoint/eval
  mkdir -p -- "$out_dir"
  # (EVERY_STEPS's window is another average: its own name, its own translations.)
  model=$out_dir/average_last$last${EVERY_STEPS:+_every$EVERY_STEPS}.h5
  "$build/transformer_average" --inputs="$checkpoint" --last "$last" \
    ${EVERY_STEPS:+--every-steps "$EVERY_STEPS"} --output="$model"
else
  [ -f "$checkpoint" ] || { echo "evaluate.sh: no such checkpoint: $checkpoint" >&2; exit 1; }
  [ -z "$last_given" ] || echo "evaluate.sh: note: N = $last averages a directory's last" \
    "checkpoints; $checkpoint is one file, decoded as it is" >&2
  # Beside the checkpoint's folder, in eval/; an average this script wrote
  # (DIR/eval/average_last5.h5) keeps its translations beside it (they went to
  # DIR/eval/eval/). Only such an average: a run whose checkpoint.dir is named eval keeps
  # its .hyp files out of its checkpoints' folder.
  # (`--`: a name that starts with '-' is a name, not an option; a helper's walk)
  out_dir=$(dirname -- "$checkpoint")
  if [ "$(basename -- "$out_dir")" != eval ] || [[ $(basename -- "$checkpoint") != average_*.h5 ]]
  then
    out_dir=$out_dir/eval
  fi
  mkdir -p -- "$out_dir"
  model=$checkpoint
fi
# Named by the model, the source and the decode options (average_last5.newstest2014.en.hyp,
# average_last5.newstest2014.en.beam8.hyp for -- --beam 8): the last 5 and the last 20 of
# one run, two of its checkpoints, or two searches keep their translations apart (one name
# for all replaced each with the next).
suffix=""
for option in "$@"; do
  case $option in
    --*) option=${option#--}; suffix+=.${option//=/} ;;  # --beam=8: .beam8
    *) suffix+=$option ;;                                 # --beam 8: .beam8
  esac
done
suffix=${suffix//[^A-Za-z0-9._-]/_}
hypothesis=$out_dir/$(basename -- "$model" .h5).$(basename -- "$source")$suffix.hyp
"$build/transformer_decode" --checkpoint="$model" ${spm:+--spm-model="$spm"} --input="$source" \
  --output="$hypothesis" "$@"
echo "translations: $hypothesis"
"$build/transformer_score" --input="$hypothesis" -- "$reference"
if [ -n "${SCORE_OPTIONS:-}" ]; then
  # shellcheck disable=SC2086  # the options are words
  "$build/transformer_score" --input="$hypothesis" $SCORE_OPTIONS -- "$reference"
fi
