#!/usr/bin/env bash
# The main job on any machine, with nothing downloaded: generate the numbers corpus
# (English words -> German words, tools/make_numbers_corpus.py), preprocess it into
# HDF5 shards with a SentencePiece vocabulary, train input/numbers.ini on it (printing
# training loss and validation loss, perplexity and BLEU), then evaluate as the paper
# does (§6.1): average the last 5 checkpoints, translate the test set with beam 4, and
# print its BLEU, how many translations are exact, and three of them beside their
# references. About a minute and a half on 2 CPU cores.
#
#   bash tools/run_default_job.sh [--section.key=value ...]   # overrides go to the trainer
#
# BUILD (default: build) is the CMake build directory; MPIRUN="mpirun -np 2" runs the
# training on several ranks. Everything is written under BUILD/numbers: text/, data/
# (shards), checkpoints/, metrics.jsonl, train.log and eval/ (the average and the
# translations); a training stopped by a signal is not evaluated (exit 1). Each run starts
# afresh, removing the previous run's checkpoints, metrics and eval/, unless it is given
# --checkpoint.resume (=auto continues the run before, as the trainer's stop line advises).
# --checkpoint.dir and --train.metrics_dir put those files elsewhere (a directory given is
# never removed: the trainer refuses one that holds another run's checkpoints);
# --data.dir is refused: the job trains on the corpus it generates.
set -euo pipefail
# THPC_BUILD as the job scripts and evaluate.sh name it; a relative one is the caller's,
# made absolute before the script changes directory (the repository's build by default).
build=${BUILD:-${THPC_BUILD:-}}
[[ -n $build && $build != /* ]] && build=$PWD/$build
caller=$PWD
cd "$(dirname "$0")/.."
source tools/train_logged.sh
build=${build:-build}
corpus=$build/numbers
checkpoints=$corpus/checkpoints
metrics_dir=$corpus
eval_dir=$corpus/eval
# The trainer's overrides of the keys the job sets itself, in either spelling
# (--key=value, --key value): given twice, the trainer refused the user's one as "given
# more than once", after the whole preprocessing. A relative directory given is the
# caller's (the trainer runs from the repository).
resume=0 own_checkpoints=1 own_metrics=1 previous='' trainer_options=()
callers() { [[ $1 == /* ]] && echo "$1" || echo "$caller/$1"; }
for option in "$@"; do
  case $previous in
    --checkpoint.dir) option=$(callers "$option") checkpoints=$option own_checkpoints=0 ;;
    --train.metrics_dir) option=$(callers "$option") metrics_dir=$option own_metrics=0 ;;
  esac
  case $option in
    --checkpoint.dir=*)
      checkpoints=$(callers "${option#*=}") own_checkpoints=0
      option=--checkpoint.dir=$checkpoints ;;
    --train.metrics_dir=*)
      metrics_dir=$(callers "${option#*=}") own_metrics=0
      option=--train.metrics_dir=$metrics_dir ;;
    --checkpoint.resume | --checkpoint.resume=*) resume=1 ;;
    --data.dir | --data.dir=*)
      echo "run_default_job.sh: $option: this job trains on the numbers corpus it generates" \
           "($corpus/data); to train on other shards run $build/transformer_hpc CONFIG" \
           "--data.dir=DIR" >&2
      exit 2 ;;
  esac
  trainer_options+=("$option")
  previous=$option
done
own_options=(--data.dir="$corpus/data")
[[ $own_checkpoints == 0 ]] || own_options+=(--checkpoint.dir="$checkpoints")
[[ $own_metrics == 0 ]] || own_options+=(--train.metrics_dir="$metrics_dir")

python3 tools/make_numbers_corpus.py --out "$corpus/text" --seed 1
"$build/transformer_preprocess" --source-lang en --target-lang de \
  --trainpref "$corpus/text/train" --validpref "$corpus/text/valid" \
  --testpref "$corpus/text/test" --destdir "$corpus/data" \
  --vocab-size 200 --model-type bpe --shards 2 --seed 1 2> "$corpus/preprocess.log" ||
  { cat "$corpus/preprocess.log" >&2; exit 1; }
# An earlier run's checkpoints would be averaged with this run's (and its metrics
# appended to): the trainer refuses a directory that holds them, so the job's own go
# first, unless this run continues that one (--checkpoint.resume: they were removed
# before it started from step 0, though the trainer's stop line advised it).
rm -rf "$eval_dir"
if [[ $resume == 0 ]]; then
  [[ $own_checkpoints == 0 ]] || rm -rf "$checkpoints"
  [[ $own_metrics == 0 ]] ||
    rm -rf "$metrics_dir/metrics.jsonl" "$metrics_dir"/events.out.tfevents.*
fi
# (tools/train_logged.sh: a training stopped by a signal is not evaluated)
thpc_train_logged "$corpus/train.log" "nothing is evaluated; run the script again with \
--checkpoint.resume=auto to continue it (without it, it starts afresh)" \
  ${MPIRUN:-} "$build/transformer_hpc" input/numbers.ini "${own_options[@]}" \
  ${trainer_options[@]+"${trainer_options[@]}"}

mkdir -p "$eval_dir"
# The last 5, or all there are when a shorter run (--train.max_steps) wrote fewer.
written=$(find "$checkpoints" -maxdepth 1 -name 'step_*.h5' | wc -l)
last=$(( written < 5 ? written : 5 ))
if [[ $last -lt 5 ]]; then
  echo "run_default_job.sh: note: $written checkpoints written, fewer than 5: averaging $last" >&2
fi
"$build/transformer_average" --inputs "$checkpoints" --last "$last" \
  --output "$eval_dir/average_last$last.h5" > "$eval_dir/average.log"
"$build/transformer_decode" --checkpoint "$eval_dir/average_last$last.h5" --beam 4 --threads 0 \
  --input "$corpus/text/test.en" --output "$eval_dir/test.hyp"
# Each German number is one word, so word-level BLEU (13a) finds no bigrams and is 0
# for any system: the score is over characters (sacreBLEU's -tok char).
# (Assigned first: a failing score inside `echo "$(...)"` left "test: " and exit 0.)
score=$("$build/transformer_score" -tok char -w 2 "$corpus/text/test.de" -i "$eval_dir/test.hyp")
echo "test: $score"
paste -d '\t' "$corpus/text/test.en" "$eval_dir/test.hyp" "$corpus/text/test.de" | awk -F '\t' -v last="$last" '
  $2 == $3 { exact++ }
  NR <= 3 { example[NR] = sprintf("  %s\n    translation: %s\n    reference:   %s", $1, $2, $3) }
  END {
    printf "test: %d of %d translations exact (beam 4, average of the last %d checkpoints)\n", exact, NR, last
    for (i = 1; i <= 3 && i <= NR; i++) print example[i]
  }'
