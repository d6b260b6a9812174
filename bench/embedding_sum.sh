#!/usr/bin/env bash
# What the tied embedding's sum leaves exposed after backward, summed at the end
# (dist.embedding_sum = at_end) and per use (per_use), in one run on one machine: RANKS
# ranks (default 2) on the CPU backend, one thread each, on Multi30k EN-DE shards (a joint
# BPE vocabulary of VOCAB, default 8,000), a model of LAYERS layers of width D_MODEL (default
# 2 and 256: the embedding is then 40% of the gradient), TOKENS tokens a step (default
# 2,000), STEPS steps (default 30), every step's sums timed (dist.log_buckets). A step's
# exposed time is when its sums were done less when its backward was (rank 0's clock);
# the first 5 steps are left out. Ends with one line:
#   embedding_sum: ranks=2 vocab=8000 d_model=256 embedding_share=0.40 exposed_at_end_ms=4.1 exposed_per_use_ms=1.0 ratio=4.10 step_at_end_ms=120.0 step_per_use_ms=117.0
# Needs the Multi30k files under $THPC_DATA/multi30k (tools/fetch_data.sh); writes under
# WORK (default build/embedding_sum).
#
#   THPC_DATA=/path/to/data bash bench/embedding_sum.sh
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
RANKS=${RANKS:-2}
STEPS=${STEPS:-30}
TOKENS=${TOKENS:-2000}
VOCAB=${VOCAB:-8000}
LAYERS=${LAYERS:-2}
D_MODEL=${D_MODEL:-256}
WORK=${WORK:-build/embedding_sum}
mkdir -p "$WORK"
data="$WORK/data_$VOCAB"
bash bench/multi30k_shards.sh "$BUILD" "$VOCAB" "$data"
[ "$(id -u)" = 0 ] && export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
for mode in at_end per_use; do
  rm -rf "$WORK/ck_$mode"
  mpirun -np "$RANKS" --oversubscribe "$BUILD/transformer_hpc" input/multi30k_cpu.ini \
    --data.dir="$data" --model.layers="$LAYERS" --model.d_model="$D_MODEL" \
    --model.d_ff=$((4 * D_MODEL)) --model.heads=4 --train.backend=cpu --train.threads=1 \
    --train.tokens_per_step="$TOKENS" --train.max_steps="$STEPS" --train.log_every=1 \
    --train.valid_every=0 --train.max_minutes=0 --checkpoint.minutes=0 \
    --checkpoint.every_steps=$((STEPS * 10)) --checkpoint.keep_best=none \
    --checkpoint.keep_best_count=0 --checkpoint.patience=0 --checkpoint.average_last=0 \
    --checkpoint.average_best=0 --train.valid_bleu=false --dist.log_buckets=true \
    --dist.embedding_sum="$mode" --checkpoint.dir="$WORK/ck_$mode" > "$WORK/$mode.log" 2>&1 ||
    { cat "$WORK/$mode.log" >&2; exit 1; }
done
python3 - "$WORK" "$RANKS" "$VOCAB" "$D_MODEL" <<'EOF'
import re, statistics, sys
work, ranks, vocab, d_model = sys.argv[1:]
result = {}
for mode in ("at_end", "per_use"):
    log = open(f"{work}/{mode}.log").read()
    exposed = [float(x) for x in re.findall(r"^buckets at step \d+ .* exposed ([0-9.]+);", log, re.M)][5:]
    steps = [float(x) for x in re.findall(r"^step \d+/\d+ .*\| ms/step ([0-9.]+)", log, re.M)][5:]
    params = int(re.search(r"^training (\d+) parameters", log, re.M).group(1))
    result[mode] = (statistics.median(exposed), statistics.median(steps), params)
    print(f"{mode}: exposed ms (median of {len(exposed)} steps) {result[mode][0]:.2f}, "
          f"step ms {result[mode][1]:.1f}")
share = int(vocab) * int(d_model) / result["at_end"][2]
at_end, per_use = result["at_end"][0], result["per_use"][0]
print(f"embedding_sum: ranks={ranks} vocab={vocab} d_model={d_model} embedding_share={share:.2f} "
      f"exposed_at_end_ms={at_end:.2f} exposed_per_use_ms={per_use:.2f} "
      f"ratio={at_end / per_use if per_use > 0 else float('inf'):.2f} "
      f"step_at_end_ms={result['at_end'][1]:.1f} step_per_use_ms={result['per_use'][1]:.1f}")
EOF
