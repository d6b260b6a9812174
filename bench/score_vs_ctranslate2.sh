#!/usr/bin/env bash
# Scoring given translations against CTranslate2's Translator.score_batch, on the same
# weights and the same pairs, in one run on one machine (the CPU):
#
#   [THREADS="1 2"] [COMPUTE_TYPES="float32 int8"] [RUNS=3] [PYTHON=...]
#       bash bench/score_vs_ctranslate2.sh CHECKPOINT [LINES]
#
# The checkpoint is converted once (tools/convert_to_ctranslate2.py; not timed); the first
# LINES (default 400) lines of $THPC_DATA/wmt14_test/newstest2014.en, with their
# newstest2014.de references, are scored by transformer_decode --score-reference and by
# bench/ct2_score_batch.py: log P(reference | source) a line, both in batches of 4,096
# tokens. Pieces are the references' pieces and eos (what both score). CTranslate2's time
# is score_batch's own; ours is the program's wall time less that of the same command on
# an empty pair of files (start, checkpoint read, model build), as
# bench/decode_vs_ctranslate2.sh times decoding. With N threads ours runs --threads N
# (N workers of one thread taking batches in turn, or fewer sharing the threads), and
# CTranslate2 both ways, one replica of N threads (intra_threads) and N replicas of one
# (inter_threads): its faster is the peer. The systems are alternated RUNS times for each
# thread count and compute type; medians are reported. One line each:
#   score_vs_ctranslate2: device=cpu threads=N compute_type=T lines=L pieces=P
#     ours_pieces_s=A ct2_pieces_s=B ratio=A/B ct2_intra_pieces_s=.. ct2_inter_pieces_s=..
#     max_abs_diff=D mean_abs_diff=E ours_openblas=CORE[-by-OPENBLAS_CORETYPE] runs=R
#     loadavg=...
# (ratio > 1: ours faster; *_abs_diff: |ours - CTranslate2| of a line's score, first run,
# over the lines both score finitely.)
# PYTHON: an interpreter with ctranslate2, sentencepiece, h5py and numpy, found as
# bench/decode_vs_ctranslate2.sh finds it (`bash tools/install_deps.sh --ctranslate2`).
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 1 ] || { sed -n '2,30p' "$0" >&2; exit 2; }
checkpoint=$1
lines=${2:-400}
read -r -a thread_counts <<< "${THREADS:-1 2}"
read -r -a compute_types <<< "${COMPUTE_TYPES:-float32 int8}"
runs=${RUNS:-3}
[ "$runs" -ge 1 ] 2> /dev/null || { echo "RUNS must be a whole number >= 1, not '$runs'" >&2; exit 2; }
build=${THPC_BUILD:-${BUILD:-build}}
data=${WMT14_TEST:-${THPC_DATA:-}/wmt14_test}
[ -f "$checkpoint" ] || { echo "checkpoint '$checkpoint' not found" >&2; exit 2; }
[ -f "$data/newstest2014.en" ] || { echo "$data/newstest2014.en not found: run 'bash tools/fetch_data.sh wmt14_test DIR' and set THPC_DATA=DIR" >&2; exit 1; }
[ -x "$build/transformer_decode" ] || { echo "build first: cmake --build $build" >&2; exit 1; }
venv_python=${THPC_VENV:-$HOME/.cache/thpc-venv}/bin/python
python=${PYTHON:-${THPC_PYTHON:-$( [ -x "$venv_python" ] && echo "$venv_python" || echo python3)}}
"$python" -c 'import ctranslate2, sentencepiece, h5py, numpy' 2> /dev/null || {
  echo "$python cannot import ctranslate2, sentencepiece, h5py and numpy: bash tools/install_deps.sh --ctranslate2 (or set PYTHON)" >&2
  exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

echo "$(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'); load average $(cut -d' ' -f1-3 /proc/loadavg)"
ours_openblas=$(bash bench/openblas_kernels.sh "$build/transformer_decode")
echo "ours: OpenBLAS $ours_openblas kernels${OPENBLAS_CORETYPE:+ (OPENBLAS_CORETYPE=$OPENBLAS_CORETYPE)}; ctranslate2 $("$python" -c 'import ctranslate2; print(ctranslate2.__version__)')"
head -n "$lines" "$data/newstest2014.en" > "$work/source.en"
head -n "$lines" "$data/newstest2014.de" > "$work/reference.de"
: > "$work/empty.en"
: > "$work/empty.de"
"$python" tools/convert_to_ctranslate2.py --checkpoint "$checkpoint" --output_dir "$work/ct2_model"
seconds() {  # seconds COMMAND...: runs it, prints its wall seconds; its output in $work/log
  local start end
  start=$(date +%s.%N)
  "$@" > "$work/log" 2>&1 || { cat "$work/log" >&2; return 1; }
  end=$(date +%s.%N)
  awk -v a="$start" -v b="$end" 'BEGIN { printf "%.3f\n", b - a }'
}
median() { sort -g | awk '{ v[NR] = $1 } END { if (NR == 0) print "n/a"; else print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
ratio() {
  awk -v a="$1" -v b="$2" 'BEGIN {
    if (a ~ /^[0-9]/ && b ~ /^[0-9]/ && b + 0 > 0) printf "%.3f", a / b; else print "n/a"
  }'
}

for threads in "${thread_counts[@]}"; do
  for compute_type in "${compute_types[@]}"; do
    rm -f "$work/ours" "$work/ct2_intra" "$work/ct2_inter"
    for run in $(seq "$runs"); do
      ours=("$build/transformer_decode" --checkpoint "$checkpoint" --threads "$threads" --compute-type "$compute_type")
      load=$(seconds "${ours[@]}" --input "$work/empty.en" --score-reference "$work/empty.de" --output /dev/null)
      wall=$(seconds "${ours[@]}" --input "$work/source.en" --score-reference "$work/reference.de" --output "$work/ours.out")
      pieces=$(grep -o "scored [0-9]* pairs ([0-9]* pieces" "$work/log" | grep -o "[0-9]* pieces" | cut -d' ' -f1)
      echo "$pieces $(awk -v w="$wall" -v l="$load" 'BEGIN { print w - l }')" >> "$work/ours"
      for way in intra inter; do
        [ "$way" = inter ] && [ "$threads" = 1 ] && continue  # (one replica of one thread)
        ct2_threads=(--threads "$threads")
        [ "$way" = inter ] && ct2_threads=(--inter-threads "$threads")
        seconds "$python" bench/ct2_score_batch.py --model "$work/ct2_model" --source "$work/source.en" \
          --reference "$work/reference.de" --output "$work/ct2.out" "${ct2_threads[@]}" \
          --compute-type "$compute_type" > /dev/null
        echo "$(grep -o 'pieces=[0-9]*' "$work/log" | cut -d= -f2) $(grep -o 'score_s=[0-9.]*' "$work/log" | cut -d= -f2)" >> "$work/ct2_$way"
      done
      if [ "$run" = 1 ]; then
        differences=$(paste "$work/ours.out" "$work/ct2.out" | awk '
          $1 ~ /inf|nan/ || $2 ~ /inf|nan/ { next }
          { d = $1 - $2; if (d < 0) d = -d; if (d > m) m = d; s += d; n++ }
          END { if (n == 0) print "max_abs_diff=n/a mean_abs_diff=n/a"
                else printf "max_abs_diff=%.2g mean_abs_diff=%.2g", m, s / n }')
      fi
      echo "threads $threads $compute_type run $run (pieces, seconds): ours $(tail -1 "$work/ours") | ct2 intra $(tail -1 "$work/ct2_intra")$([ -f "$work/ct2_inter" ] && echo " | ct2 inter $(tail -1 "$work/ct2_inter")")"
    done
    rate() { [ -f "$work/$1" ] && awk '$2 > 0 { printf "%.1f\n", $1 / $2 }' "$work/$1" | median || echo n/a; }
    ours_rate=$(rate ours)
    intra_rate=$(rate ct2_intra)
    inter_rate=$(rate ct2_inter)
    ct2_rate=$(printf '%s\n%s\n' "$intra_rate" "$inter_rate" | grep -v n/a | sort -g | tail -1)
    echo "score_vs_ctranslate2: device=cpu threads=$threads compute_type=$compute_type lines=$lines" \
      "pieces=$(awk 'NR == 1 { print $1 }' "$work/ours") ct2_pieces=$(awk 'NR == 1 { print $1 }' "$work/ct2_intra")" \
      "ours_pieces_s=$ours_rate ct2_pieces_s=$ct2_rate ratio=$(ratio "$ours_rate" "$ct2_rate")" \
      "ct2_intra_pieces_s=$intra_rate ct2_inter_pieces_s=$inter_rate $differences" \
      "ours_openblas=$ours_openblas runs=$runs loadavg=$(cut -d' ' -f1 /proc/loadavg)"
  done
done
