#!/usr/bin/env bash
# The training program against its benchmark (issue 51 item 4: transformer_hpc's steady
# rate within 5% of transformer_bench_step's at the same shapes and batch), in one run on
# one machine: the same model, precision and batches, the two programs alternated ROUNDS
# times. The batches are the synthetic task's (PRESET's model with a vocabulary of
# 37,000, sentences of 8 to 60 tokens, TOKENS per side and step, one rank):
# transformer_bench_step --program-batches draws the very batches the trainer's steps
# 1, 2, ... train on, so both time the same steps WARMUP+1 .. WARMUP+STEPS. The program's
# step time is the median of its per-step log lines over those steps (no validation, no
# checkpoint before the last step); the benchmark's is its median step. One line:
#   program_vs_bench: device=cpu preset=small tokens=2000 steps=30 bench_step_ms=A
#     program_step_ms=B ratio=A/B rounds=2
# (ratio >= 0.95: the program within the issue's 5% of the step alone). On the CPU both run
# with THREADS threads (default 2); OPENBLAS_CORETYPE is passed on as it is set.
#
#   [DEVICE=cpu|cuda] [TOKENS=N] [STEPS=30] [WARMUP=5] [ROUNDS=2] [BUILD=build]
#     bash bench/program_vs_bench.sh [small|base|big]
set -euo pipefail
cd "$(dirname "$0")/.."
preset=${1:-small}
device=${DEVICE:-cpu}
build=${BUILD:-build}
steps=${STEPS:-30}
warmup=${WARMUP:-5}
rounds=${ROUNDS:-2}
threads=${THREADS:-2}
work=${WORK:-build/program_vs_bench}
case $device in
  cpu) tokens=${TOKENS:-$([[ $preset == small ]] && echo 2000 || echo 1000)} precision=fp32 ;;
  # One rank of an eight-GPU job at the paper's 25,000 tokens a step: 3,125.
  cuda) tokens=${TOKENS:-3125} precision=bf16 ;;
  *) echo "DEVICE must be cpu or cuda, not '$device'" >&2; exit 2 ;;
esac
[[ $preset =~ ^(small|base|big)$ ]] || { echo "preset must be small, base or big, not '$preset'" >&2; exit 2; }
mkdir -p "$work"

# input/PRESET.ini reads WMT14 shards; the synthetic task has the same model. The small
# preset is base.ini with torch_reference.py's small sizes (as bench/step_vs_torch.sh).
config=$work/$preset.ini
sed 's/^dir = .*/dir =/' "input/$([[ $preset == small ]] && echo base || echo "$preset").ini" > "$config"
settings=(data.synthetic_vocab=37000 data.synthetic_min_len=8 data.synthetic_max_len=60
          "train.threads=$threads" "train.tokens_per_step=$tokens" train.accumulate=1
          train.valid_every=0)
if [[ $preset == small ]]; then
  settings+=(model.layers=2 model.d_model=256 model.d_ff=1024 model.heads=4 model.d_k=64 model.d_v=64)
fi
# (the benchmark sets train.backend and train.precision from its own options)
bench_sets=() program_sets=("--train.backend=$device" "--train.precision=$precision")
for setting in "${settings[@]}"; do
  bench_sets+=(--set "$setting")
  program_sets+=("--$setting")
done

for round in $(seq "$rounds"); do
  "$build/transformer_bench_step" --config "$config" "${bench_sets[@]}" --program-batches \
    --backend "$device" --precision "$precision" --tokens "$tokens" --steps "$steps" \
    --warmup-steps "$warmup" > "$work/bench_$round.log" 2>&1 ||
    { cat "$work/bench_$round.log" >&2; exit 1; }
  rm -rf "$work/checkpoints"
  "$build/transformer_hpc" "$config" "${program_sets[@]}" --train.max_steps=$((warmup + steps)) \
    --train.log_every=1 --train.max_minutes=0 --checkpoint.minutes=0 \
    --checkpoint.every_steps=0 --checkpoint.keep=1 --checkpoint.average_last=0 \
    --checkpoint.dir="$work/checkpoints" > "$work/program_$round.log" 2>&1 ||
    { cat "$work/program_$round.log" >&2; exit 1; }
done

python3 - "$work" "$device" "$preset" "$tokens" "$steps" "$warmup" "$rounds" <<'EOF'
import json, re, statistics, sys
work, device, preset, tokens, steps, warmup, rounds = sys.argv[1:]
steps, warmup, rounds = int(steps), int(warmup), int(rounds)
bench, program = [], []
for round in range(1, rounds + 1):
    line = [l for l in open(f"{work}/bench_{round}.log") if l.startswith('{"system"')][-1]
    bench.append(json.loads(line)["median_step_ms"])
    log = open(f"{work}/program_{round}.log").read()
    ms = {int(n): float(t) for n, t in
          re.findall(r"^step (\d+)/\d+ .*\| ms/step ([0-9.]+)", log, re.M)}
    timed = [ms[n] for n in range(warmup + 1, warmup + steps + 1) if n in ms]
    assert len(timed) == steps, f"round {round}: {len(timed)} of {steps} steps logged"
    program.append(statistics.median(timed))
    print(f"round {round}: bench median step {bench[-1]:.2f} ms, program {program[-1]:.2f} ms")
b, p = statistics.median(bench), statistics.median(program)
print(f"program_vs_bench: device={device} preset={preset} tokens={tokens} steps={steps} "
      f"bench_step_ms={b:.2f} program_step_ms={p:.2f} ratio={b / p:.3f} rounds={rounds}")
EOF
