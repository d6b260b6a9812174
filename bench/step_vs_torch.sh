#!/usr/bin/env bash
# The training-step benchmark against the PyTorch peer (torch_reference.py, which is not
# part of this repository: TORCH_REFERENCE names it), in one run on one machine:
#
#   TORCH_REFERENCE=PATH [BUILD=build] [DEVICE=cuda|cpu] [RUNS=1] [THREADS=2]
#       bash bench/step_vs_torch.sh [small|base|big] [TOKENS]
#
# Both systems train on the same batch shapes (TOKENS / L sentences of length L for L in
# 12..96, source and target alike) and print one JSON line each; then the ratio of their
# tokens/s (> 1: transformer_hpc is faster). RUNS > 1 alternates the two RUNS times and
# ends with the median ratio. On the GPU: bf16, vocabulary 37000, 60 timed steps after
# 15. On the CPU (bench/cpu_step_vs_torch.sh): fp32, vocabulary 8000, THREADS threads,
# 9 timed steps after 2. The last line is always
#   step_vs_torch: device=D preset=P tokens=T runs=R ours_tokens_per_s=A torch_tokens_per_s=B ratio=X ours_mfu=M torch_mfu=N
# with medians over the runs. MFU is model FLOPs/s over the GEMM ceiling: on the CPU the
# fp32 sgemm rate transformer_bench_step measures in the same run, on the GPU its
# --peak-tflops; the peer's share follows from the ratio (same FLOPs per token). Installs nothing: PyTorch comes from PyPI
# (`python3 -m pip install torch`); PYTHON names the interpreter that has it.
set -euo pipefail
cd "$(dirname "$0")/.."
preset=${1:-base}
device=${DEVICE:-cuda}
runs=${RUNS:-1}
threads=${THREADS:-2}
build=${BUILD:-build}
python=${PYTHON:-python3}
reference=${TORCH_REFERENCE:-}
case $device in
  cuda) tokens=${2:-25000} ;;
  cpu) tokens=${2:-$([[ $preset == small ]] && echo 2000 || echo 1000)} ;;
  *) echo "DEVICE must be cuda or cpu, not '$device'" >&2; exit 2 ;;
esac
[[ $preset =~ ^(small|base|big)$ ]] || { echo "preset must be small, base or big, not '$preset'" >&2; exit 2; }
[[ -n $reference && -f $reference ]] || {
  echo "TORCH_REFERENCE must name torch_reference.py (the PyTorch peer; got '${reference}')" >&2; exit 2; }
"$python" -c 'import torch' 2>/dev/null || {
  echo "$python has no PyTorch: python3 -m pip install torch (or set PYTHON)" >&2; exit 2; }
[[ -x $build/transformer_bench_step ]] || { echo "build first: cmake --build $build" >&2; exit 1; }

# The small preset is input/base.ini with torch_reference.py's "small" sizes.
model_sets=()
config=input/$preset.ini
if [[ $preset == small ]]; then
  config=input/base.ini
  model_sets=(--set model.layers=2 --set model.d_model=256 --set model.d_ff=1024
              --set model.heads=4 --set model.d_k=64 --set model.d_v=64)
fi
if [[ $device == cuda ]]; then
  torch_args=(--vocab 37000 --steps 60 --warmup-steps 15)
  ours_args=(--vocab 37000 --steps 60 --warmup-steps 15 --backend cuda --precision bf16)
else
  torch_args=(--device cpu --vocab 8000 --steps 9 --warmup-steps 2 --threads "$threads")
  ours_args=(--vocab 8000 --steps 9 --warmup-steps 2 --backend cpu --set "train.threads=$threads")
fi

# On the GPU, MFU is taken against the bf16 GEMM ceiling measured here, in this call, on
# this device: cuBLAS (through PyTorch's matmul) on 8192^3 random bf16 operands, the
# best of five timings of ten products after three warm-ups.
if [[ $device == cuda ]]; then
  ceiling=$("$python" - <<'PY'
import torch
n = 8192
a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
for _ in range(3):
    a @ b
torch.cuda.synchronize()
start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
best_ms = float("inf")
for _ in range(5):
    start.record()
    for _ in range(10):
        a @ b
    end.record()
    torch.cuda.synchronize()
    best_ms = min(best_ms, start.elapsed_time(end) / 10)
print(round(2 * n**3 / best_ms / 1e9, 1))
PY
)
  echo "bf16 GEMM ceiling (cuBLAS 8192^3, measured now): $ceiling TFLOP/s"
  ours_args+=(--peak-tflops "$ceiling")
fi

ratios=() ours_rates=() torch_rates=() ours_mfus=() torch_mfus=()
for ((run = 1; run <= runs; run++)); do
  torch_line=$("$python" "$reference" --preset "$preset" --tokens "$tokens" "${torch_args[@]}" | tail -1)
  ours_line=$("$build"/transformer_bench_step --config "$config" --tokens "$tokens" \
              "${ours_args[@]}" "${model_sets[@]}" | tail -1)
  echo "$torch_line"
  echo "$ours_line"
  read -r ours_rate torch_rate ratio ours_mfu torch_mfu < <("$python" - "$torch_line" "$ours_line" <<'PY'
import json, sys
torch, ours = json.loads(sys.argv[1]), json.loads(sys.argv[2])
ratio = ours["tokens_per_s"] / torch["tokens_per_s"]
# Both count the same model FLOPs per token on the same shapes, so the peer's share of
# the ceiling ours measured (or was given) is ours divided by the ratio.
print(ours["tokens_per_s"], torch["tokens_per_s"], round(ratio, 3), ours["mfu"],
      round(ours["mfu"] / ratio, 3))
PY
)
  echo "run $run: tokens/s transformer_hpc $ours_rate / pytorch $torch_rate = ${ratio}x;" \
       "share of the GEMM ceiling: transformer_hpc $ours_mfu, pytorch $torch_mfu"
  ratios+=("$ratio") ours_rates+=("$ours_rate") torch_rates+=("$torch_rate")
  ours_mfus+=("$ours_mfu") torch_mfus+=("$torch_mfu")
done
median() { printf '%s\n' "$@" | sort -g | awk '{v[NR] = $1} END {print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }
echo "step_vs_torch: device=$device preset=$preset tokens=$tokens runs=$runs" \
     "ours_tokens_per_s=$(median "${ours_rates[@]}") torch_tokens_per_s=$(median "${torch_rates[@]}")" \
     "ratio=$(median "${ratios[@]}") ours_mfu=$(median "${ours_mfus[@]}")" \
     "torch_mfu=$(median "${torch_mfus[@]}")"
