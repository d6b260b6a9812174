#!/usr/bin/env bash
# What a checkpoint costs the steps around it, written in the step and beside training
# (checkpoint.background_write = false, then true), in one run on one machine: the base
# model (input/base.ini, synthetic data with a vocabulary of 37,000: 63,045,632 parameters,
# a 757 MB checkpoint), STEPS steps of TOKENS target tokens, a checkpoint every EVERY steps,
# every step's time logged. A step's excess is its time minus the median step's; a
# checkpoint's stall is the excess of all steps (the first, the warm-up, left out) divided
# by the checkpoints written before the last step. Ends with one line:
#   checkpoint_stall: backend=cpu threads=1 tokens=200 file_mb=756.7 step_ms=970.3 stall_in_step_s=3.21 stall_beside_s=1.05 ratio=3.06
# (ratio = stall_in_step_s / stall_beside_s: how many times less a checkpoint costs).
# BACKEND=cuda measures the GPU's; THREADS is train.threads on the CPU (0 = every core:
# the writer's hashing then competes with the step's own threads). Writes under WORK
# (default build/checkpoint_stall).
#
#   bash bench/checkpoint_stall.sh
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
BACKEND=${BACKEND:-cpu}
THREADS=${THREADS:-1}
STEPS=${STEPS:-14}
EVERY=${EVERY:-4}
TOKENS=${TOKENS:-200}
WORK=${WORK:-build/checkpoint_stall}
mkdir -p "$WORK"
# input/base.ini reads WMT14 shards; the synthetic task has the same model and vocabulary.
sed 's/^dir = .*/dir =/' input/base.ini > "$WORK/base_synthetic.ini"
for background in false true; do
  rm -rf "$WORK/ck_$background"
  "$BUILD/transformer_hpc" "$WORK/base_synthetic.ini" --data.synthetic_vocab=37000 \
    --train.backend="$BACKEND" --train.threads="$THREADS" --train.max_steps="$STEPS" \
    --train.tokens_per_step="$TOKENS" --train.log_every=1 --train.valid_every=0 \
    --train.max_minutes=0 --checkpoint.minutes=0 --checkpoint.every_steps="$EVERY" \
    --checkpoint.keep=2 --checkpoint.average_last=0 \
    --checkpoint.background_write="$background" --checkpoint.dir="$WORK/ck_$background" \
    > "$WORK/$background.log" 2>&1 || { cat "$WORK/$background.log" >&2; exit 1; }
done
python3 - "$WORK" "$BACKEND" "$THREADS" "$TOKENS" "$STEPS" "$EVERY" <<'EOF'
import re, statistics, sys
work, backend, threads, tokens, steps, every = sys.argv[1:]
steps, every = int(steps), int(every)
checkpoints = (steps - 1) // every  # those written before the last step
result = {}
for background in ("false", "true"):
    log = open(f"{work}/{background}.log").read()
    ms = [float(m) for m in re.findall(r"^step \d+/\d+ .*\| ms/step ([0-9.]+)", log, re.M)]
    assert len(ms) == steps, f"{background}: {len(ms)} steps logged, {steps} expected"
    timed = ms[1:]
    median = statistics.median(timed)
    excess = sum(t - median for t in timed) / 1000.0
    size = re.search(r"^checkpoint \S+ \(([0-9.]+) MB", log, re.M).group(1)
    result[background] = (median, excess / checkpoints, size)
    print(f"background_write={background}: median step {median:.1f} ms, "
          f"steps {' '.join(f'{t:.0f}' for t in ms)} ms")
step_ms = result["false"][0]
in_step, beside = result["false"][1], result["true"][1]
ratio = in_step / beside if beside > 0 else float("inf")
print(f"checkpoint_stall: backend={backend} threads={threads} tokens={tokens} "
      f"file_mb={result['false'][2]} step_ms={step_ms:.1f} stall_in_step_s={in_step:.2f} "
      f"stall_beside_s={beside:.2f} ratio={ratio:.2f}")
EOF
