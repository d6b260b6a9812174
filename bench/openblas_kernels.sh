#!/usr/bin/env bash
# The OpenBLAS kernels a program of ours multiplies with, for the benchmarks' lines:
#   bash bench/openblas_kernels.sh PROGRAM
# prints CORE (OpenBLAS's own choice), CORE-by-OPENBLAS_CORETYPE (the variable chose them:
# the peers' BLAS does not read it), or CORE-instead-of-OLD (OpenBLAS did not know the CPU
# and chose OLD, kernels older than AVX2; the program started again with CORE:
# kernels/cpu/openblas_core.h). OpenBLAS prints "Core: NAME" as it loads at
# OPENBLAS_VERBOSE=2, once per start.
set -euo pipefail
cores=$( (OPENBLAS_VERBOSE=2 "$1" --help 2>&1 || true) | sed -n 's/^Core: //p')
first=$(echo "$cores" | head -1)
last=$(echo "$cores" | tail -1)
if [ -z "$last" ]; then
  echo unknown
elif [ -n "${OPENBLAS_CORETYPE:-}" ]; then
  echo "${last}-by-OPENBLAS_CORETYPE"
elif [ "$first" != "$last" ]; then
  echo "${last}-instead-of-${first}"
else
  echo "$last"
fi
