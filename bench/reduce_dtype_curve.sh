#!/usr/bin/env bash
# The loss curve with fp32 and with bf16 gradient sums (dist.reduce_dtype), in one run on
# one machine: Multi30k EN-DE (input/multi30k_cpu.ini, a joint BPE vocabulary of 8,000),
# RANKS ranks on the CPU backend (default 2), STEPS steps (default 300), the same seed and
# data for both, validation every STEPS/3 steps. Prints each run's logged losses side by
# side and ends with one line per run:
#   reduce_dtype: dtype=fp32 ranks=2 steps=300 valid_ppl=885.86,279.36,174.21 final_loss=5.8128 seconds=378
# Needs the Multi30k files under $THPC_DATA/multi30k (tools/fetch_data.sh); writes under
# WORK (default build/reduce_dtype_curve). With DEVICE=cuda the ranks share GPU 0 through
# dist.reducer = mpi (bench/gpu_session.sh ranks checks that path first).
#
#   THPC_DATA=/path/to/data bash bench/reduce_dtype_curve.sh
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
RANKS=${RANKS:-2}
STEPS=${STEPS:-300}
DEVICE=${DEVICE:-cpu}
WORK=${WORK:-build/reduce_dtype_curve}
mkdir -p "$WORK"
bash bench/multi30k_shards.sh "$BUILD" 8000 "$WORK/data"
placement=(--train.backend=cpu --train.threads=1)
[ "$DEVICE" = cuda ] && placement=(--train.backend=cuda --dist.reducer=mpi --dist.device=0)
for dtype in fp32 bf16; do
  rm -rf "$WORK/ck_$dtype"
  start=$SECONDS
  mpirun -np "$RANKS" --oversubscribe "$BUILD/transformer_hpc" input/multi30k_cpu.ini \
    --data.dir="$WORK/data" --train.max_steps="$STEPS" --train.log_every=25 \
    --train.valid_every=$((STEPS / 3)) --train.max_minutes=0 "${placement[@]}" \
    --checkpoint.minutes=0 --checkpoint.every_steps=$((STEPS * 10)) --checkpoint.keep_best=none \
    --checkpoint.keep_best_count=0 --checkpoint.patience=0 --checkpoint.average_last=0 \
    --checkpoint.average_best=0 --train.valid_bleu=false --dist.reduce_dtype="$dtype" \
    --checkpoint.dir="$WORK/ck_$dtype" > "$WORK/$dtype.log" 2>&1
  echo $((SECONDS - start)) > "$WORK/$dtype.seconds"
done
echo "step     fp32 loss  bf16 loss"
paste <(grep "^step " "$WORK/fp32.log" | awk '{print $2, $5}') \
      <(grep "^step " "$WORK/bf16.log" | awk '{print $5}') | awk '{printf "%-8s %-10s %s\n", $1, $2, $3}'
for dtype in fp32 bf16; do
  ppl=$(grep "^valid step" "$WORK/$dtype.log" | awk '{print $9}' | paste -sd,)
  loss=$(grep "^step $STEPS/" "$WORK/$dtype.log" | awk '{print $5}')
  echo "reduce_dtype: dtype=$dtype ranks=$RANKS steps=$STEPS valid_ppl=$ppl final_loss=$loss seconds=$(cat "$WORK/$dtype.seconds")"
done
