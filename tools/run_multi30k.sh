#!/usr/bin/env bash
# Multi30k EN->DE: preprocess $THPC_DATA/multi30k (train, val, test_2016_flickr)
# into HDF5 shards with a shared 8000-piece BPE vocabulary, then train input/multi30k.ini.
# The run writes two averages, of its last 5 checkpoints and of its 5 best by validation
# perplexity (a small corpus overfits: its last are not its best); both and its best
# checkpoint are scored on val (transformer_hpc --eval, tools/choose_average.sh) and the
# better is named in the last line, of the form (numbers for illustration):
#   multi30k: the better validation ppl is average_best5.h5's (13.02; average_last5.h5: 22.90; best.h5: 13.40): DIR/average_best5.h5
#
#   bash tools/run_multi30k.sh [--config FILE] [--section.key=value ...]
#
# FILE is the trainer's configuration (default input/multi30k.ini; input/multi30k_cpu.ini
# is the recipe for 2 CPU cores in 50 minutes); the overrides go to the trainer.
#
# MULTI30K (default $THPC_DATA/multi30k; `bash tools/fetch_data.sh multi30k DIR` fetches
# it) is the text directory; BUILD (default
# build) the CMake build directory; MPIRUN="mpirun -np 8" trains on several ranks.
set -euo pipefail
# Paths the caller gives are the caller's: made absolute before the script changes
# directory (before: `--config m.ini` or THPC_DATA=./data from elsewhere were "not found").
absolute() { case $1 in /*) echo "$1" ;; *) echo "$PWD/$1" ;; esac; }
config=input/multi30k.ini
if [ "${1:-}" = --config ]; then
  config=$(absolute "${2:?--config needs a file}")
  shift 2
fi
build=${BUILD:-${THPC_BUILD:-}}  # THPC_BUILD as the job scripts and evaluate.sh name it
[ -n "$build" ] && build=$(absolute "$build")
text=${MULTI30K:-${THPC_DATA:+$THPC_DATA/multi30k}}
[ -n "$text" ] && text=$(absolute "$text")
cd "$(dirname "$0")/.."
source tools/train_logged.sh
build=${build:-build}
[ -f "$config" ] || { echo "run_multi30k: configuration '$config' not found" >&2; exit 1; }
[ -f "$text/train.en" ] || { echo "run_multi30k: $text/train.en not found: run 'bash tools/fetch_data.sh multi30k DIR' and set THPC_DATA=DIR" >&2; exit 1; }
data=$build/multi30k/data
mkdir -p "$build/multi30k"

"$build/transformer_preprocess" --source-lang en --target-lang de \
  --trainpref "$text/train" --validpref "$text/val" --testpref "$text/test_2016_flickr" \
  --destdir "$data" --vocab-size 8000 --model-type bpe --shards 1 --seed 1 \
  2> "$build/multi30k/preprocess.log" || { cat "$build/multi30k/preprocess.log" >&2; exit 1; }
# The reader's statistics at the run's own batch size (its resolved configuration).
tokens=$("$build/transformer_hpc" "$config" --data.dir="$data" "$@" --dry-run |
  sed -n 's/^tokens_per_step = \([0-9]*\).*/\1/p' | head -1)
"$build/transformer_data_stats" "$data" --tokens-per-step "$tokens"
log=$build/multi30k/train.log
# (tools/train_logged.sh: a training stopped by a signal is not scored)
thpc_train_logged "$log" "run the script again with --checkpoint.resume=auto to continue it" \
  ${MPIRUN:-} "$build/transformer_hpc" "$config" --data.dir="$data" "$@"
bash tools/choose_average.sh multi30k "$log" "$build/transformer_hpc" "$config" \
  --data.dir="$data" "$@"
