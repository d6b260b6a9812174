#!/usr/bin/env bash
# Scores the averages a training run wrote (checkpoint.average_last, average_best: the
# "average of ... written to FILE" lines of its log), and its best single checkpoint when
# it kept one (checkpoint.keep_best: the last "best checkpoint FILE" line), on the
# validation set with `transformer_hpc CONFIG --eval FILE`, and names the better one by
# the metric the run ranked its best checkpoints by (checkpoint.keep_best: the log's
# "average of the N best checkpoints by valid METRIC" line), else BLEU or chrF when the
# config translates, else perplexity. Lower perplexity, higher BLEU and chrF are better;
# of equal scores (to the printed digits) the first of the log, the last N, is named. A
# run still improving when it ends can score better with its best checkpoint than with
# any average (bench/RESULTS.md, Multi30k on 2 CPU cores). What tools/run_multi30k.sh
# ends with (docs/checkpoints.md, "The k best checkpoints and their average").
#
#   bash tools/choose_average.sh NAME TRAINING_LOG TRANSFORMER_HPC CONFIG [--section.key=value ...]
#
# Prints one line per candidate ("NAME: FILE: valid step N | ... | ppl X ...") and then
#   NAME: the better validation ppl is average_best5.h5's (13.02; average_last5.h5: 22.90): FILE
# A log with no average: one line saying so, exit 0. An --eval that fails: exit 1.
set -euo pipefail
[ $# -ge 4 ] || { sed -n '2,18p' "$0" >&2; exit 2; }
name=$1 log=$2 trainer=$3
shift 3
mapfile -t candidates < <(sed -n 's/^\(warning: \)\{0,1\}average of the .* written to \(.*\)$/\2/p' "$log")
if [ ${#candidates[@]} -eq 0 ]; then
  echo "$name: the run wrote no average (checkpoint.average_last, average_best): nothing to choose"
  exit 0
fi
best=$(sed -n 's/^best checkpoint \(.*\) (step [0-9]*, valid .*)$/\1/p' "$log" | tail -1)
[ -n "$best" ] && [ -f "$best" ] && candidates+=("$best")
kept_by=$(sed -n 's/^\(warning: \)\{0,1\}average of the .* best checkpoints by valid \([a-z]*\).*/\2/p' "$log" | head -1)
results=()
for file in "${candidates[@]}"; do
  line=$("$trainer" "$@" --eval "$file" | grep '^valid step ') ||
    { echo "$name: transformer_hpc --eval $file failed" >&2; exit 1; }
  echo "$name: $file: $line"
  results+=("$file	$line")
done
printf '%s\n' "${results[@]}" | awk -F '\t' -v name="$name" -v kept_by="$kept_by" '
  {
    metric = "ppl"
    if (kept_by != "") metric = kept_by
    else if ($2 ~ /\| bleu /) metric = "bleu"
    else if ($2 ~ /\| chrf /) metric = "chrf"
    higher = metric != "ppl"
    value = ""
    n = split($2, fields, / \| /)
    for (i = 1; i <= n; i++) if (split(fields[i], kv, " ") == 2 && kv[1] == metric) value = kv[2]
    if (value == "") { printf "%s: no %s in the --eval line of %s\n", name, metric, $1 > "/dev/stderr"; failed = 1; exit 1 }
    file[NR] = $1; score[NR] = value + 0; text[NR] = value
    if (NR == 1 || (higher ? score[NR] > score[best] : score[NR] < score[best])) best = NR
  }
  END {
    if (failed) exit 1
    base = file[best]; sub(/.*\//, "", base)
    others = ""
    for (i = 1; i <= NR; i++) if (i != best) {
      other = file[i]; sub(/.*\//, "", other)
      others = others sprintf("; %s: %s", other, text[i])
    }
    printf "%s: the better validation %s is %s'"'"'s (%s%s): %s\n", name, metric, base, text[best], others, file[best]
  }'
