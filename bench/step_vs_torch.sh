#!/usr/bin/env bash
# The training-step benchmark against the PyTorch peer, in one run on one GPU:
#   [BUILD=build] bash bench/step_vs_torch.sh [base|big] [TOKENS]
# runs ../shared/bench/torch_reference.py (eager bf16, fused Adam, SDPA attention) and
# build/transformer_bench_step on the same batch shapes (tokens / L sentences of length
# L for L in 12..96, vocabulary 37000), prints both JSON lines and the ratio of their
# tokens/s. A ratio > 1 means transformer_hpc is faster.
set -euo pipefail
cd "$(dirname "$0")/.."
preset=${1:-base}
tokens=${2:-25000}
config=input/${preset}.ini
reference=${TORCH_REFERENCE:-../shared/bench/torch_reference.py}  # the PyTorch peer; not part of this repository
build=${BUILD:-build}
[[ -x $build/transformer_bench_step ]] || { echo "build first: cmake --build $build" >&2; exit 1; }
torch_line=$(python3 "$reference" --preset "$preset" --tokens "$tokens" --steps 60 | tail -1)
ours_line=$("$build"/transformer_bench_step --config "$config" --tokens "$tokens" --steps 60 \
            --backend cuda --precision bf16 | tail -1)
echo "$torch_line"
echo "$ours_line"
python3 - "$torch_line" "$ours_line" <<'PY'
import json, sys
torch, ours = json.loads(sys.argv[1]), json.loads(sys.argv[2])
print(f"tokens/s: transformer_hpc {ours['tokens_per_s']:.0f} / pytorch {torch['tokens_per_s']:.0f}"
      f" = {ours['tokens_per_s'] / torch['tokens_per_s']:.2f}x"
      f"  (median step {ours['median_step_ms']:.1f} ms vs {torch['median_step_ms']:.1f} ms)")
PY
