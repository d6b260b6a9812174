#!/usr/bin/env bash
# Peak resident memory and wall time of transformer_preprocess on synthetic corpora of
# real sentences (tools/make_synthetic_corpus.py), 1M and 4.5M pairs by default, each run
# under /usr/bin/time -v: once training SentencePiece on a sample of --spm-sentences lines
# of the same size at every corpus size (so that SentencePiece's own sample, which holds
# its lines, stays out of the comparison), once with --spm-model (encode, filter, write).
#
#   THPC_DATA=DIR bash bench/preprocess_memory.sh [BINARY] [WORK]
#
# BINARY defaults to build/transformer_preprocess, WORK (corpora and outputs, several
# GB) to /tmp/thpc_preprocess_bench. LABEL (default "run") names the output folder
# WORK/LABEL, so that two binaries' shards can be compared with cmp; PAIRS, SAMPLE
# (--spm-sentences, default 2000000 lines), SHARDS (8) and THREADS (2) change the runs.
# Prints one markdown table row per run: label, pairs, mode, wall time, CPU time (user +
# system: what contention from other work on the machine changes least), peak RSS.
set -euo pipefail
binary=$(realpath "${1:-build/transformer_preprocess}")
work=${2:-/tmp/thpc_preprocess_bench}
label=${LABEL:-run}
pairs_list=${PAIRS:-"1000000 4500000"}
sample=${SAMPLE:-2000000}
shards=${SHARDS:-8}
threads=${THREADS:-2}
here=$(cd "$(dirname "$0")/.." && pwd)
: "${THPC_DATA:?set THPC_DATA (tools/fetch_data.sh fills it)}"

mkdir -p "$work/$label"
model="$work/spm.model"  # the --spm-model runs' model: the first trained run's

run() {  # NAME PAIRS ARGS...: one timed run, its table row
  local name=$1 pairs=$2
  shift 2
  local out="$work/$label/$pairs-$name"
  rm -rf "$out"
  /usr/bin/time -v "$binary" --source-lang en --target-lang de \
      --trainpref "$work/corpus-$pairs/train" --validpref "$THPC_DATA/multi30k/val" \
      --testpref "$THPC_DATA/wmt14_test/newstest2014" --destdir "$out" \
      --vocab-size 37000 --shards "$shards" --threads "$threads" "$@" \
      > "$out.log" 2> "$out.time"
  local wall cpu rss
  wall=$(sed -n 's/.*Elapsed (wall clock) time (h:mm:ss or m:ss): //p' "$out.time")
  cpu=$(awk -F': ' '/User time|System time/ {sum += $2} END {printf "%.0f s", sum}' "$out.time")
  rss=$(sed -n 's/.*Maximum resident set size (kbytes): //p' "$out.time")
  printf '| %s | %s | %s | %s | %s | %d MB |\n' "$label" "$pairs" "$name" "$wall" "$cpu" \
      $((rss / 1024))
}

for pairs in $pairs_list; do
  if [ ! -s "$work/corpus-$pairs/train.de" ]; then
    python3 "$here/tools/make_synthetic_corpus.py" --pairs "$pairs" --out "$work/corpus-$pairs" \
        > /dev/null
  fi
  run trained "$pairs" --spm-sentences "$sample"
  [ -s "$model" ] || cp "$work/$label/$pairs-trained/spm.model" "$model"
  run spm-model "$pairs" --spm-model "$model"
done
