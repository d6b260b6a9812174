#!/usr/bin/env bash
# What a checkpoint costs the steps around it, written in the step and beside training
# (checkpoint.background_write = false, then true), in one run on one machine: the base
# model (input/base.ini, synthetic data with a vocabulary of 37,000: 63,045,632 parameters,
# a 757 MB checkpoint), STEPS steps of TOKENS target tokens, a checkpoint every EVERY steps,
# every step's time logged. A step's excess is its time minus the median step's; a
# checkpoint's stall is the excess of all steps (the first, the warm-up, left out) divided
# by the checkpoints written before the last step. Ends with one line:
#   checkpoint_stall: backend=cpu threads=1 tokens=200 file_mb=756.7 step_ms=970.3 stall_in_step_s=3.21 stall_beside_s=1.05 ratio=3.06 copy_in_step_s=0.29 copy_beside_s=0.08 first_beside_s=1.30 later_beside_s=0.92
# (ratio = stall_in_step_s / stall_beside_s: how many times less a checkpoint costs;
# copy_*_s: the median of the checkpoint lines' "copy N s", what the step waited for to
# copy the state out; first_*_s and later_*_s: the excess of the step after the first
# checkpoint, which also makes the kept host buffer, and the median of the later ones').
# A checkpoint beside training waits for the one before to be written: when a write takes
# longer than EVERY steps the later checkpoints measure the writer, not the stall, and
# the script says so (on 2026-12-04 a GPU's 40 ms steps with EVERY=3 gave 2 s "stalls";
# gpu_session.sh now spaces them beyond a write).
# BACKEND=cuda measures the GPU's; THREADS is train.threads on the CPU (0 = every core:
# the writer's hashing then competes with the step's own threads). CANDIDATE (a
# train.cuda_kernels value) adds a third run, beside training with those kernels, and the
# field stall_candidate_s (pinned_snapshot, the GPU's pinned staging, was one until it
# became the default on 2026-12-04). Writes under WORK (default build/checkpoint_stall). CONFIG
# (default input/base.ini) and VOCAB (default 37000) give another model: gpu_session.sh's
# CPU rehearsal takes input/tiny.ini, whose files the 2-core machines write in seconds
# (the base model's 757 MB, six of them, took 98 s of the call's 130 on 2026-12-01).
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
CONFIG=${CONFIG:-input/base.ini}
VOCAB=${VOCAB:-37000}
mkdir -p "$WORK"
# input/base.ini reads WMT14 shards; the synthetic task has the same model and vocabulary.
sed 's/^dir = .*/dir =/' "$CONFIG" > "$WORK/base_synthetic.ini"
CANDIDATE=${CANDIDATE:-}
runs=(in_step beside)
[ -n "$CANDIDATE" ] && runs+=(candidate)
for run in "${runs[@]}"; do
  background=true kernels=verified
  [ "$run" = in_step ] && background=false
  [ "$run" = candidate ] && kernels=$CANDIDATE
  rm -rf "$WORK/ck_$run"
  "$BUILD/transformer_hpc" "$WORK/base_synthetic.ini" --data.synthetic_vocab="$VOCAB" \
    --train.backend="$BACKEND" --train.cuda_kernels="$kernels" \
    --train.threads="$THREADS" --train.max_steps="$STEPS" \
    --train.tokens_per_step="$TOKENS" --train.log_every=1 --train.valid_every=0 \
    --train.max_minutes=0 --checkpoint.minutes=0 --checkpoint.every_steps="$EVERY" \
    --checkpoint.keep=2 --checkpoint.average_last=0 \
    --checkpoint.background_write="$background" --checkpoint.dir="$WORK/ck_$run" \
    > "$WORK/$run.log" 2>&1 || { cat "$WORK/$run.log" >&2; exit 1; }
done
python3 - "$WORK" "$BACKEND" "$THREADS" "$TOKENS" "$STEPS" "$EVERY" "${runs[@]}" <<'EOF'
import re, statistics, sys
work, backend, threads, tokens, steps, every = sys.argv[1:7]
runs = sys.argv[7:]
steps, every = int(steps), int(every)
checkpoints = (steps - 1) // every  # those written before the last step
result = {}
for run in runs:
    log = open(f"{work}/{run}.log").read()
    ms = [float(m) for m in re.findall(r"^step \d+/\d+ .*\| ms/step ([0-9.]+)", log, re.M)]
    assert len(ms) == steps, f"{run}: {len(ms)} steps logged, {steps} expected"
    timed = ms[1:]
    median = statistics.median(timed)
    excess = sum(t - median for t in timed) / 1000.0
    size = re.search(r"^checkpoint \S+ \(([0-9.]+) MB", log, re.M).group(1)
    # What the step waited for to copy the state out, as the checkpoint lines say: the
    # median over the checkpoints (the first of a run beside training also makes its
    # kept buffer), steadier than the steps' excess on a noisy machine.
    copies = [float(c) for c in re.findall(r"^checkpoint \S+ \(.* copy ([0-9.]+) s", log, re.M)]
    writes = [float(w) for w in re.findall(r"^checkpoint \S+ \(.* write ([0-9.]+) s", log, re.M)]
    # The step after a checkpoint's step carries its cost (the save follows the step's line).
    each = [(ms[k] - median) / 1000.0 for k in range(every, steps, every)]
    later = statistics.median(each[1:]) if len(each) > 1 else float("nan")
    result[run] = (median, excess / checkpoints, size, statistics.median(copies), each[0], later)
    print(f"{run}: median step {median:.1f} ms, "
          f"steps {' '.join(f'{t:.0f}' for t in ms)} ms")
    spacing = every * median / 1000.0
    if run != "in_step" and writes and max(writes) > spacing:
        print(f"{run}: a write took {max(writes):.2f} s, longer than the {spacing:.2f} s between "
              f"checkpoints (EVERY={every}): the later checkpoints waited for the writer before "
              f"them; give EVERY above {max(writes) * 1000.0 / median:.0f} to measure the stall")
step_ms = result["in_step"][0]
in_step, beside = result["in_step"][1], result["beside"][1]
ratio = in_step / beside if beside > 0 else float("inf")
candidate = (f" stall_candidate_s={result['candidate'][1]:.2f}"
             f" copy_candidate_s={result['candidate'][3]:.2f}"
             f" first_candidate_s={result['candidate'][4]:.2f}"
             f" later_candidate_s={result['candidate'][5]:.2f}" if "candidate" in result else "")
print(f"checkpoint_stall: backend={backend} threads={threads} tokens={tokens} "
      f"file_mb={result['in_step'][2]} step_ms={step_ms:.1f} stall_in_step_s={in_step:.2f} "
      f"stall_beside_s={beside:.2f} ratio={ratio:.2f} copy_in_step_s={result['in_step'][3]:.2f} "
      f"copy_beside_s={result['beside'][3]:.2f} first_beside_s={result['beside'][4]:.2f} "
      f"later_beside_s={result['beside'][5]:.2f}{candidate}")
EOF
