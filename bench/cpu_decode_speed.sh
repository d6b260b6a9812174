#!/usr/bin/env bash
# CPU decode speed of build/transformer_decode: target tokens per second with beam 4
# (alpha 0.6) and greedy, on the first LINES lines of newstest2014.en.
#
#   bench/cpu_decode_speed.sh CHECKPOINT [LINES] [-- decode options]
#
# Tokens are the SentencePiece pieces of the translations (the checkpoint's own model,
# extracted with h5dump; the end-of-sentence token not counted), divided by the wall
# time of the whole program (loading and encoding included), printed with the program's
# user and system seconds (system time: page faults, thread waits). Without --threads in
# the decode options, the workers are the checkpoint's train.threads (0 = one per core).
# THPC_BUILD names the build directory.
set -euo pipefail
[ $# -ge 1 ] || { sed -n '2,12p' "$0" >&2; exit 2; }
checkpoint=$1
shift
lines=300
if [ $# -gt 0 ] && [ "$1" != "--" ]; then lines=$1; shift; fi
[ $# -gt 0 ] && shift  # the "--"
build=${THPC_BUILD:-build}
data=${WMT14_TEST:-${THPC_DATA:-}/wmt14_test}
[ -f "$data/newstest2014.en" ] || { echo "$data/newstest2014.en not found: run 'bash tools/fetch_data.sh wmt14_test DIR' and set THPC_DATA=DIR" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
head -n "$lines" "$data/newstest2014.en" > "$work/source.en"
h5dump -d /spm_model -b LE -o "$work/spm.model" "$checkpoint" > /dev/null
echo "$(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
echo "checkpoint $checkpoint: $(h5dump -a /architecture "$checkpoint" | grep -o '"layers=[^"]*"')"
# bash's `time` gives the decoder's wall, user and system seconds (system time: page
# faults and thread synchronisation, which the speed work keeps under 10% of wall).
TIMEFORMAT='%R %U %S'
for mode in "--beam 4" "--greedy"; do
  read -ra mode_options <<< "$mode"
  { time "$build/transformer_decode" --checkpoint "$checkpoint" --input "$work/source.en" \
      --output "$work/hyp" "${mode_options[@]}" "$@" 2> "$work/stderr"; } 2> "$work/time" ||
    { cat "$work/stderr" >&2; exit 1; }
  read -r wall user sys < "$work/time"
  tokens=$(spm_encode --model "$work/spm.model" < "$work/hyp" | wc -w)
  awk -v mode="$mode" -v lines="$lines" -v tokens="$tokens" -v s="$wall" -v user="$user" \
    -v sys="$sys" 'BEGIN { printf "%-9s %d lines, %d target tokens in %.1f s: %.0f tokens/s, %.1f sentences/s; user %.1f s, system %.1f s (%.1f%% of wall)\n", mode, lines, tokens, s, tokens / s, lines / s, user, sys, 100 * sys / s }'
done
