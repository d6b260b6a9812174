#!/usr/bin/env bash
# Evaluates a run as the paper does (§6.1): average the last N checkpoints, translate a
# test set with beam search, score with sacreBLEU-exact BLEU.
#
#   tools/evaluate.sh CHECKPOINT_DIR|CHECKPOINT SPM_MODEL SOURCE REFERENCE [N] [-- decode options]
#
#   tools/evaluate.sh checkpoints build/wmt14_en_de/data/spm.model \
#       ../shared/data/wmt14_test/newstest2014.en ../shared/data/wmt14_test/newstest2014.de 5
#
# N (default 5, the paper's base recipe; 20 for big) applies to a directory; a single
# checkpoint file is decoded as it is. The translations are kept next to the average
# (DIR/eval/). THPC_BUILD names the build directory (default: build).
set -euo pipefail
if [ $# -lt 4 ]; then
  sed -n '2,13p' "$0" >&2
  exit 2
fi
checkpoint=$1 spm=$2 source=$3 reference=$4
shift 4
last=5
if [ $# -gt 0 ] && [ "$1" != "--" ]; then last=$1; shift; fi
[ $# -gt 0 ] && [ "$1" = "--" ] && shift
build=${THPC_BUILD:-build}
for f in "$spm" "$source" "$reference"; do
  [ -f "$f" ] || { echo "evaluate.sh: no such file: $f" >&2; exit 1; }
done

if [ -d "$checkpoint" ]; then
  out_dir=$checkpoint/eval
  mkdir -p "$out_dir"
  model=$out_dir/average_last$last.h5
  "$build/transformer_average" --inputs "$checkpoint" --last "$last" --output "$model"
else
  [ -f "$checkpoint" ] || { echo "evaluate.sh: no such checkpoint: $checkpoint" >&2; exit 1; }
  out_dir=$(dirname "$checkpoint")/eval
  mkdir -p "$out_dir"
  model=$checkpoint
fi
hypothesis=$out_dir/$(basename "$source").hyp
"$build/transformer_decode" --checkpoint "$model" --spm-model "$spm" --input "$source" \
  --output "$hypothesis" "$@"
echo "translations: $hypothesis"
"$build/transformer_score" "$reference" -i "$hypothesis"
