#!/usr/bin/env bash
# The CPU training-step benchmark against PyTorch (fp32), eager and torch.compile, in one run:
#   TORCH_REFERENCE=PATH [PEERS="eager compile"] bash bench/cpu_step_vs_torch.sh [small|base] [TOKENS]
# small: 2 layers, d_model 256, d_ff 1024, 4 heads, 2000 + 2000 tokens per step;
# base: input/base.ini, 1000 + 1000 tokens. Vocabulary 8000, THREADS=2 threads, the
# systems alternated RUNS=3 times; the last line holds the median ratios (the fields of
# bench/step_vs_torch.sh, which does the work). The compiled peer's first run compiles
# each of the nine shapes (minutes on two cores, not timed); later runs reuse the cache.
set -euo pipefail
DEVICE=cpu RUNS=${RUNS:-3} exec bash "$(dirname "$0")/step_vs_torch.sh" "${1:-small}" ${2:+"$2"}
