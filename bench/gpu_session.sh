#!/usr/bin/env bash
# Everything a session with a lent H200 should run, in one device call (see the device
# tool's README: few, full calls cost the least device time).
#
# Here (Debian, with apt):   bash ../shared/gpu-host/fetch.sh gpu-bundle
#                            cp -r ../shared shared-for-gpu   # ../shared does not travel
# Device call:               run(command="bash bench/gpu_session.sh", carry=["gpu-bundle",
#                                 "shared-for-gpu"])
# On the GPU host it unpacks the Debian libraries (gpu-host/use.sh), builds for sm_90,
# runs the CUDA twin tests, the whole-model GPU tests, the step benchmark against PyTorch
# and a short decode, and leaves the logs in $OUT (or ./gpu-logs without $OUT).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-logs}
mkdir -p "$OUT"
if [[ -d shared-for-gpu && ! -e ../shared ]]; then ln -s "$PWD/shared-for-gpu" ../shared; fi
# shellcheck disable=SC1091
source gpu-bundle/use.sh /tmp/sysroot gpu-bundle > "$OUT/setup.log" 2>&1 || {
  echo "gpu-bundle/use.sh failed"; tail -20 "$OUT/setup.log"; exit 1; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/gpu.txt"
{ cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 &&
  cmake --build build-gpu -j"$(nproc)"; } > "$OUT/build.log" 2>&1 || {
  echo "build failed"; tail -40 "$OUT/build.log"; exit 1; }
ldd build-gpu/transformer_hpc | grep -E "not found|cuda|nccl|mpi|hdf5" | tee "$OUT/ldd.txt"
# The twin tests and the whole-model tests (they skip nothing here: a GPU is present).
ctest --test-dir build-gpu -R "Cuda|GradientReducer" --output-on-failure -j4 \
  > "$OUT/ctest_cuda.log" 2>&1
grep -E "tests passed|Failed|\*\*\*" "$OUT/ctest_cuda.log" | tail -30
# The step benchmark against the PyTorch peer on base-shaped batches.
BUILD=build-gpu bash bench/step_vs_torch.sh base 25000 2>&1 | tee "$OUT/bench_base.txt"
# The rest of the CPU suite on this machine, for completeness.
ctest --test-dir build-gpu -E "Cuda|Learning" -j8 > "$OUT/ctest_rest.log" 2>&1
grep -E "tests passed|Failed" "$OUT/ctest_rest.log" | tail -5
