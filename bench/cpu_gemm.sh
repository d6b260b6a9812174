#!/usr/bin/env bash
# The library of our CPU's fp32 matrix products (kernels/cpu/blas.h), for the CPU
# benchmarks' lines:
#   bash bench/cpu_gemm.sh BUILD_DIR
# prints onednn or openblas: THPC_CPU_GEMM's choice, else the build's default (oneDNN where
# it has it and its kernels are AVX-512 ones; OpenBLAS then still multiplies the smallest
# products), as
# transformer_bench_step reports it after one step of input/tiny.ini.
set -euo pipefail
cd "$(dirname "$0")/.."
line=$("$1/transformer_bench_step" --config input/tiny.ini --tokens 40 --steps 1 \
         --warmup-steps 0 --backend cpu --set model.max_positions=128 2> /dev/null | tail -1) ||
  line=""
sed -n 's/.*"cpu_gemm": "\([a-z]*\)".*/\1/p' <<< "$line" | grep . || echo unknown
