#!/usr/bin/env bash
# Builds the libFuzzer targets of fuzz/ (clang, ASan + UBSan, build-fuzz/), makes their
# seed corpora and runs them (docs/reliability.md "Fuzzing" has the figures).
#
#   bash tools/fuzz.sh [TARGET|all] [SECONDS]   # each target for SECONDS (default 60)
#   RUNS=1000000 bash tools/fuzz.sh shard 3600  # ... or until RUNS executions, if sooner
#   FUZZ_JOBS=1 bash tools/fuzz.sh all 60       # one target at a time (default: a core each)
#
# TARGET: config, shard, checkpoint, bleu_tokenize, ter, ptb_trees. Seeds: input/*.ini; a
# shard pair preprocessed from a small numbers corpus (and a shard of separate
# vocabularies) and a 1-step checkpoint of a shrunk input/tiny.ini with its quantized
# form (and one of separate vocabularies), all made by the programs built here;
# the trees of the PTB .mrg files (one per seed) and Multi30k / sacreBLEU test lines from
# $THPC_DATA when it is there (a few hand-written lines when not). Inputs are at most the
# largest seed's size (4096 bytes at least). Inputs that found new coverage stay in
# build-fuzz/corpus/TARGET, a crashing input lands in build-fuzz/artifacts/ and the script
# exits 1.
set -euo pipefail
cd "$(dirname "$0")/.."
targets=(config shard checkpoint bleu_tokenize ter ptb_trees score_output)
which=${1:-all}
seconds=${2:-60}
build=${BUILD_FUZZ:-build-fuzz}
data=${THPC_DATA:-}
if [ "$which" != all ] && [[ ! " ${targets[*]} " == *" $which "* ]]; then
  echo "fuzz.sh: unknown target '$which' (one of: ${targets[*]}, all)" >&2
  exit 2
fi

# FUZZ_JOBS targets at a time (default: the cores here): each libFuzzer process is one
# thread, so `all` on 2 cores takes 3 rounds of SECONDS instead of 5.
at_once=${FUZZ_JOBS:-$(nproc)}
if ! [[ "$at_once" =~ ^[1-9][0-9]*$ ]]; then
  echo "fuzz.sh: FUZZ_JOBS must be a whole number of targets at once, 1 or more, not '$at_once'" >&2
  exit 2
fi
mkdir -p "$build"
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
  -DTHPC_FUZZ=ON -DTRANSFORMER_TESTS=OFF -DTRANSFORMER_CUDA=OFF > "$build/configure.log" ||
  { cat "$build/configure.log" >&2; exit 1; }
cmake --build "$build" -j2 --target "${targets[@]/#/fuzz_}" transformer_preprocess transformer_hpc \
  transformer_quantize

# ---- seed corpora (remade each time: cheap, and they follow the current formats) ----
seeds=$build/seeds
rm -rf "$seeds"
for t in "${targets[@]}"; do mkdir -p "$seeds/$t" "$build/corpus/$t"; done
mkdir -p "$build/artifacts"
# The seed programs are sanitized too; Open MPI's start-up allocations are not our leaks.
export ASAN_OPTIONS=detect_leaks=0
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

cp input/*.ini "$seeds/config/"

work=$build/seed_work
rm -rf "$work"
python3 tools/make_numbers_corpus.py --train 40 --valid 8 --test 8 --seed 1 --out "$work/text" > /dev/null
# The vocabulary without SentencePiece's default normalization (nmt_nfkc), whose table
# (238 KB) the shard stores inside spm_model: with it a 40-pair shard is 249 KB, HDF5
# copies all of it for every input and most mutations land in a table the reader only
# passes on; without it the shards are 11 KB and 7 KB, and an input costs half the time.
spm_train --input="$work/text/train.en,$work/text/train.de" --model_prefix="$work/spm" \
  --vocab_size=60 --model_type=bpe --pad_id=0 --unk_id=1 --bos_id=2 --eos_id=3 \
  --character_coverage=1.0 --hard_vocab_limit=false --normalization_rule_name=identity \
  --num_threads=1 > "$work/spm_train.log" 2>&1 || { cat "$work/spm_train.log" >&2; exit 1; }
"$build/transformer_preprocess" --source-lang en --target-lang de \
  --trainpref "$work/text/train" --validpref "$work/text/valid" --destdir "$work/data" \
  --spm-model "$work/spm.model" --seed 1 > "$work/preprocess.log" 2>&1 ||
  { cat "$work/preprocess.log" >&2; exit 1; }
cp "$work/data/train.00000.h5" "$work/data/valid.00000.h5" "$seeds/shard/"
# And a shard of separate source and target vocabularies (format 3: the source's model
# and its size among the attributes), the source's model trained on its side alone.
spm_train --input="$work/text/train.en" --model_prefix="$work/spm.source" \
  --vocab_size=40 --model_type=bpe --pad_id=0 --unk_id=1 --bos_id=2 --eos_id=3 \
  --character_coverage=1.0 --hard_vocab_limit=false --normalization_rule_name=identity \
  --num_threads=1 > "$work/spm_train.source.log" 2>&1 ||
  { cat "$work/spm_train.source.log" >&2; exit 1; }
"$build/transformer_preprocess" --source-lang en --target-lang de \
  --trainpref "$work/text/train" --validpref "$work/text/valid" --destdir "$work/data_separate" \
  --spm-model "$work/spm.model" --source-spm-model "$work/spm.source.model" --seed 1 \
  > "$work/preprocess.separate.log" 2>&1 ||
  { cat "$work/preprocess.separate.log" >&2; exit 1; }
cp "$work/data_separate/train.00000.h5" "$seeds/shard/separate_vocabularies.h5"

"$build/transformer_hpc" input/tiny.ini --model.layers=1 --model.d_model=8 --model.d_ff=16 \
  --model.heads=2 --train.max_steps=1 --checkpoint.every_steps=1 \
  --checkpoint.dir="$work/checkpoints" > "$work/train.log" 2>&1 ||
  { cat "$work/train.log" >&2; exit 1; }
cp "$work/checkpoints/step_00000001.h5" "$seeds/checkpoint/"
# One of separate vocabularies (src_embed.weight, /source_spm_model), trained on those shards.
"$build/transformer_hpc" input/tiny.ini --model.layers=1 --model.d_model=8 --model.d_ff=16 \
  --model.heads=2 --train.max_steps=1 --checkpoint.every_steps=1 \
  --data.dir="$work/data_separate" --model.vocab_size=0 --train.tokens_per_step=64 \
  --checkpoint.dir="$work/checkpoints_separate" > "$work/train.separate.log" 2>&1 ||
  { cat "$work/train.separate.log" >&2; exit 1; }
cp "$work/checkpoints_separate/step_00000001.h5" "$seeds/checkpoint/separate_vocabularies.h5"
# And its quantized form (format version 2: int8 weight matrices in /quantized).
"$build/transformer_quantize" --checkpoint "$work/checkpoints/step_00000001.h5" \
  --output "$seeds/checkpoint/quantized.h5" > "$work/quantize.log" 2>&1 ||
  { cat "$work/quantize.log" >&2; exit 1; }

if [ -n "$data" ] && [ -d "$data/ptb_sample/combined" ]; then
  # One tree per seed (each starts with '(' in the first column), not whole files: the
  # reader takes any number of trees, and a whole file (up to 130 KB, 185 trees) costs
  # every tree's work per input where a mutation touches one. The largest tree is 6.7 KB.
  awk -v out="$seeds/ptb_trees/tree" \
    '/^\(/ { if (n) close(out "." n); n++ } n { print > (out "." n) }' \
    "$data"/ptb_sample/combined/wsj_*.mrg
else
  printf '( (S (NP-SBJ (DT The) (NN cat)) (VP (VBD sat) (-NONE- *T*-1)) (. .)) )\n' \
    > "$seeds/ptb_trees/hand.mrg"
fi
# The first N lines of a file, one seed each: the tokenizer reads lines.
line_seeds() {
  local n=0
  while IFS= read -r line && [ $n -lt "$2" ]; do
    printf '%s' "$line" > "$seeds/bleu_tokenize/$(basename "$1").$n"
    n=$((n + 1))
  done < "$1"
}
if [ -n "$data" ] && [ -d "$data/multi30k" ]; then
  line_seeds "$data/multi30k/val.de" 100
  line_seeds "$data/multi30k/val.en" 100
  line_seeds "$data/sacrebleu_tests/wmt17_en-de/newstest2017-ende-ref.de" 100
fi
printf 'Die Katze saß auf der Matte — „schön“ (1.000,50 €)!' > "$seeds/bleu_tokenize/hand.0"
printf 'Ελληνικά ΣΊΣΥΦΟΣ 日本語のテキスト، عربى\t end.' > "$seeds/bleu_tokenize/hand.1"
# TER reads the same lines.
cp "$seeds/bleu_tokenize/"* "$seeds/ter/"
# transformer_score's output: a double's bytes, then cells apart at U+001F (a score, a
# two-line paired cell, a system name with quotes and non-ASCII characters).
printf '\x9a\x99\x99\x99\x99\x4c\x3c\x40System\x1fBLEU (\xce\xbc \xc2\xb1 95%% CI)\x1fTER\x1f'\
'Baseline: sys "1".txt\x1f28.3 (28.3 \xc2\xb1 0.7)\x1f61.2\x1fsyst\xc3\xa8me\\2\x1f'\
'26.1 (26.1 \xc2\xb1 0.7)\n(p = 0.0010)*\x1f64.1\n(p = 0.3417)' > "$seeds/score_output/paired"
cp "$seeds/bleu_tokenize/hand."* "$seeds/score_output/"

# ---- runs ----
# Stopped (Ctrl-C, a job's time limit), the fuzzers started in the background stop too,
# and so does the schedule (before: the trap killed the subshells, their fuzzers ran on
# with no parent, and the loop started the remaining targets).
stop_fuzzers() {
  local pid child
  for pid in $(jobs -p); do
    # The fuzzer its run_target started, found in /proc (pkill, of procps, is missing from
    # slim images: the fuzzers were orphaned and ran on).
    for child in $(cat /proc/"$pid"/task/*/children 2> /dev/null); do
      kill -TERM "$child" 2> /dev/null || true
    done
    kill "$pid" 2> /dev/null || true
  done
  exit "$1"
}
trap 'stop_fuzzers 130' INT
trap 'stop_fuzzers 143' TERM
run_target() {
  local t=$1
  # Inputs up to the largest seed (at least libFuzzer's usual 4096 bytes): without the
  # bound libFuzzer takes the largest file of the corpus too, which a corpus kept from
  # older, larger seeds would set.
  local largest_seed max_len
  largest_seed=$(find "$seeds/$t" -type f -printf '%s\n' | sort -n | tail -n 1)
  max_len=$((largest_seed > 4096 ? largest_seed : 4096))
  local bound=(-max_total_time="$seconds" -max_len="$max_len")
  [ -z "${RUNS:-}" ] || bound+=(-runs="$RUNS")
  echo "fuzz.sh: $t (${bound[*]})"
  # LeakSanitizer on: a reader that leaks on bad input is a finding like a crash
  # (fuzz/lsan.supp: what HDF5 itself leaks on a damaged file; fuzz/asan.supp: where it
  # reads past its own buffers decoding one). malloc returns NULL for an impossible size,
  # as outside ASan: HDF5 asks for sizes a damaged file states and checks for NULL; an
  # allocation of ours that fails throws std::bad_alloc, still a finding. Requests over
  # 1 GB get NULL (max_allocation_size_mb): opening a damaged checkpoint, HDF5 mallocs
  # the 4 or 20 GB its object header states and then refuses the file; unsanitized that
  # memory is never touched (16 MB peak RSS), but ASan poisons an eighth of it in shadow
  # memory (2.1 GB RSS), and libFuzzer stopped on the size or on its 2048 MB RSS limit.
  if ! ASAN_OPTIONS=detect_leaks=1:allocator_may_return_null=1:max_allocation_size_mb=1024:suppressions=$PWD/fuzz/asan.supp \
      LSAN_OPTIONS=suppressions=$PWD/fuzz/lsan.supp \
      "$build/fuzz_$t" "${bound[@]}" -timeout=30 \
      -rss_limit_mb=2048 -print_final_stats=1 -artifact_prefix="$build/artifacts/$t-" \
      "$build/corpus/$t" "$seeds/$t" > "$build/fuzz_$t.log" 2>&1; then
    tail -n 60 "$build/fuzz_$t.log" >&2
    echo "fuzz.sh: $t FAILED (log: $build/fuzz_$t.log, input: $build/artifacts/$t-*)" >&2
    return 1
  fi
  grep -E '^Done [0-9]+ runs|stat::number_of_executed_units|stat::peak_rss_mb' \
    "$build/fuzz_$t.log" | sed "s/^/fuzz.sh: $t: /"
}
status=0
running=0
for t in "${targets[@]}"; do
  [ "$which" = all ] || [ "$which" = "$t" ] || continue
  if [ "$running" -ge "$at_once" ]; then
    wait -n || status=1
    running=$((running - 1))
  fi
  run_target "$t" &
  running=$((running + 1))
done
while [ "$running" -gt 0 ]; do
  wait -n || status=1
  running=$((running - 1))
done
exit $status
