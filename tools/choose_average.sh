#!/usr/bin/env bash
# Scores the averages a training run wrote (checkpoint.average_last, average_best: the
# "average of ... written to FILE" lines of its log), and its best single checkpoint when
# it kept one (checkpoint.keep_best: the last "best checkpoint FILE" line), on the
# validation set with `transformer_hpc CONFIG --eval FILE`, and names the better one by
# the metric the run ranked its best checkpoints by (checkpoint.keep_best: the log's
# "average of the N best checkpoints by valid METRIC" line), else BLEU, chrF or a
# parser's F1 when the config translates, else perplexity. Lower perplexity, higher BLEU,
# chrF and F1 are better;
# of equal scores (to the printed digits) the first of the log, the last N, is named. A
# run still improving when it ends can score better with its best checkpoint than with
# any average (bench/RESULTS.md, Multi30k on 2 CPU cores). What tools/run_multi30k.sh
# ends with (docs/checkpoints.md, "The k best checkpoints and their average").
#
#   bash tools/choose_average.sh NAME TRAINING_LOG TRANSFORMER_HPC CONFIG [--section.key=value ...]
#
# Prints one line per candidate ("NAME: FILE: valid step N | ... | ppl X ...") and then
#   NAME: the better validation ppl is average_best5.h5's (13.02; average_last5.h5: 22.90): FILE
# A log with no average: one line saying so, exit 0. An --eval that fails: exit 1, and
# so does one that scores another step than the log says its file holds (the log's
# paths are as the run gave them: a relative one is taken from where this script runs,
# and a directory of the same name there held another run's files), or that lacks the
# metric the run ranked by (say, BLEU without --train.valid_bleu=true).
set -euo pipefail
[ $# -ge 4 ] || { sed -n '2,22p' "$0" >&2; exit 2; }
name=$1 log=$2 trainer=$3
shift 3
mapfile -t candidates < <(sed -n 's/^\(warning: \)\{0,1\}average of the .* written to \(.*\)$/\2/p' "$log")
if [ ${#candidates[@]} -eq 0 ]; then
  echo "$name: the run wrote no average (checkpoint.average_last, average_best): nothing to choose"
  exit 0
fi
best_line=$(grep '^best checkpoint .* (step [0-9]*, valid .*)$' "$log" | tail -1 || true)
best=$(sed -n 's/^best checkpoint \(.*\) (step [0-9]*, valid .*)$/\1/p' <<< "$best_line")
best_step=$(sed -n 's/^best checkpoint .* (step \([0-9]*\), valid .*)$/\1/p' <<< "$best_line")
if [ -n "$best" ]; then
  [ -f "$best" ] || { echo "$name: the log's best checkpoint $best is not there (seen from $PWD)" >&2; exit 1; }
  candidates+=("$best")
fi
# The step each file must hold: the best's, as the log says; an average of the last N
# ends at the run's final step (the last "final: step=N" line).
final_step=$(sed -n 's/^final: step=\([0-9]*\) .*/\1/p' "$log" | tail -1)
kept_by=$(sed -n 's/^\(warning: \)\{0,1\}average of the .* best checkpoints\{0,1\} by valid \([a-z0-9]*\).*/\2/p' "$log" | head -1)
results=()
for file in "${candidates[@]}"; do
  line=$("$trainer" "$@" --eval "$file" | grep '^valid step ') ||
    { echo "$name: transformer_hpc --eval $file failed" >&2; exit 1; }
  echo "$name: $file: $line"
  scored=$(sed -n 's/^valid step \([0-9]*\) .*/\1/p' <<< "$line")
  expected=""
  if [ "$file" = "$best" ]; then
    expected=$best_step
  elif grep -F "written to $file" "$log" | grep -q '^\(warning: \)\{0,1\}average of the last '; then
    expected=$final_step
  fi
  if [ -n "$expected" ] && [ "$scored" != "$expected" ]; then
    echo "$name: $file holds step $scored, but the log's run wrote it at step $expected:" \
         "the log names it relative to where the run was started (run this from there;" \
         "here is $PWD), or it was replaced since" >&2
    exit 1
  fi
  if [ -n "$kept_by" ] && ! grep -q "| $kept_by " <<< "$line"; then
    echo "$name: the run ranked its checkpoints by valid $kept_by, which --eval did not" \
         "score: give the run's validation settings (e.g. --train.valid_bleu=true," \
         "train.valid_metric)" >&2
    exit 1
  fi
  results+=("$file	$line")
done
# LC_ALL=C: under a decimal comma's locale (de_DE.UTF-8) Debian's awk, mawk, reads
# "13.90" + 0 as 13, and scores that differ after the point tied: the first candidate
# was named, whichever was better (a helper's walk).
printf '%s\n' "${results[@]}" |
  LC_ALL=C awk -F '\t' -v name="$name" -v kept_by="$kept_by" '
  {
    metric = "ppl"
    if (kept_by != "") metric = kept_by
    else if ($2 ~ /\| bleu /) metric = "bleu"
    else if ($2 ~ /\| chrf /) metric = "chrf"
    else if ($2 ~ /\| f1 /) metric = "f1"
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
