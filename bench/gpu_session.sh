#!/usr/bin/env bash
# Everything a session with a lent GPU (H100/H200) should run, in one device call (few,
# full calls cost the least device time).
#
#   bash bench/gpu_session.sh --prepare GPU_HOST_DIR   # here (Debian, apt): the bundle + data
#   bash bench/gpu_session.sh --dry-run                # here: rehearse everything but the GPU
#   bash bench/gpu_session.sh                          # on the GPU host (the device call):
#       run(command="bash bench/gpu_session.sh", carry=["gpu-bundle", "shared-for-gpu"])
#
# --prepare runs GPU_HOST_DIR/fetch.sh (the scripts that make a CUDA host without our
# Debian libraries able to build: .debs unpacked with dpkg -x, see their README) into
# gpu-bundle/, and copies what the GPU run reads into shared-for-gpu/: the data sets the
# GPU tests and benchmarks use, laid out for THPC_DATA (from $THPC_DATA, see
# tools/fetch_data.sh), and the PyTorch peer (from $TORCH_REFERENCE). Both folders are git-ignored: they travel only as
# the device call's carried paths.
#
# On the GPU host it unpacks the Debian libraries (gpu-bundle/use.sh), builds for sm_90,
# runs the CUDA twin tests, the whole-model GPU tests, the step benchmark against PyTorch
# and the rest of the suite, and leaves the logs in $OUT (or ./gpu-logs without $OUT).
set -uo pipefail
cd "$(dirname "$0")/.."

# The device call carries the tree and these paths, 64 MiB in all (the device tool's limit).
readonly CARRIED=(gpu-bundle shared-for-gpu)
readonly TRANSFER_LIMIT_BYTES=$((64 * 1024 * 1024))
# Data sets the GPU run reads (tests/test_cuda_training.cc: multi30k; the decode numbers:
# wmt14_test; the parser's GPU numbers: ptb_sample and evalb).
readonly GPU_DATA_SETS=(multi30k wmt14_test ptb_sample evalb)
# --prepare copies from the caller's THPC_DATA and TORCH_REFERENCE; the run reads the copies.
SOURCE_DATA=${SOURCE_DATA:-${THPC_DATA:-}}
SOURCE_TORCH_REFERENCE=${SOURCE_TORCH_REFERENCE:-${TORCH_REFERENCE:-}}
export THPC_DATA=$PWD/shared-for-gpu/data
export TORCH_REFERENCE=$PWD/shared-for-gpu/bench/torch_reference.py

prepare() {
  local host_dir=${1:?usage: bench/gpu_session.sh --prepare GPU_HOST_DIR}
  local data=${SOURCE_DATA:?set THPC_DATA to the data folder (tools/fetch_data.sh)}
  local reference=${SOURCE_TORCH_REFERENCE:?set TORCH_REFERENCE to torch_reference.py}
  bash "$host_dir/fetch.sh" gpu-bundle || { echo "fetch.sh failed" >&2; exit 1; }
  rm -rf shared-for-gpu
  mkdir -p shared-for-gpu/data shared-for-gpu/bench
  for set in "${GPU_DATA_SETS[@]}"; do
    [ -d "$data/$set" ] || { echo "$data/$set missing: bash tools/fetch_data.sh $set DIR" >&2; exit 1; }
    cp -r "$data/$set" shared-for-gpu/data/
  done
  cp "$reference" shared-for-gpu/bench/torch_reference.py
  dry_run
}

# Bytes the device call would carry: the files git tracks or would track, and CARRIED.
transfer_bytes() {
  { git ls-files -z --cached --others --exclude-standard; find "${CARRIED[@]}" -type f -print0 2>/dev/null; } |
    du -cb --files0-from=- 2>/dev/null | tail -1 | cut -f1
}

# Everything the GPU run needs that can be checked without a GPU.
dry_run() {
  local problems=0
  problem() { echo "dry-run: $*"; problems=$((problems + 1)); }
  [ -f gpu-bundle/use.sh ] || problem "gpu-bundle/use.sh missing (bash bench/gpu_session.sh --prepare GPU_HOST_DIR)"
  if [ -f gpu-bundle/MANIFEST.txt ]; then
    while IFS=$'\t' read -r sub package version sha; do
      [[ $sub == \#* || -z $sha ]] && continue
      compgen -G "gpu-bundle/$sub/${package}_*.deb" > /dev/null || problem "gpu-bundle/$sub: $package $version listed but absent"
    done < gpu-bundle/MANIFEST.txt
  else
    problem "gpu-bundle/MANIFEST.txt missing"
  fi
  for set in "${GPU_DATA_SETS[@]}"; do
    bash tools/fetch_data.sh --verify "$set" "$THPC_DATA" > /dev/null 2>&1 ||
      problem "$THPC_DATA/$set missing or not the expected bytes"
  done
  [ -f "$TORCH_REFERENCE" ] || problem "$TORCH_REFERENCE missing"
  for script in bench/step_vs_torch.sh tools/fetch_data.sh; do
    bash -n "$script" || problem "$script does not parse"
  done
  local bytes
  bytes=$(transfer_bytes)
  echo "dry-run: the device call carries $((bytes / 1024 / 1024)) MiB (limit 64)"
  [ "$bytes" -le "$TRANSFER_LIMIT_BYTES" ] || problem "over the 64 MiB transfer limit"
  local configure_dir
  configure_dir=$(mktemp -d)
  if cmake -S . -B "$configure_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release \
       -DCMAKE_CUDA_ARCHITECTURES=90 > "$configure_dir.log" 2>&1; then
    grep -q "THPC_HAVE_CUDA:INTERNAL=ON\|CMAKE_CUDA_COMPILER:" "$configure_dir/CMakeCache.txt" ||
      problem "configured without CUDA (see $configure_dir.log)"
  else
    problem "cmake configure failed: $(tail -3 "$configure_dir.log")"
  fi
  rm -rf "$configure_dir" "$configure_dir.log"
  if [ "$problems" -gt 0 ]; then echo "dry-run: $problems problem(s)"; exit 1; fi
  echo "dry-run: ready for the device call"
}

case ${1:-} in
  --prepare) prepare "${2:-}"; exit ;;
  --dry-run) dry_run; exit ;;
  "") ;;
  *) sed -n '2,9p' "$0" >&2; exit 2 ;;
esac

OUT=${OUT:-$PWD/gpu-logs}
mkdir -p "$OUT"
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
# Each twin case's measured error beside its tolerance, for tightening the bf16 bounds.
grep -E "^twin " "$OUT/ctest_cuda.log" > "$OUT/twin_errors.txt"
# The step benchmark against the PyTorch peer on base-shaped batches.
BUILD=build-gpu bash bench/step_vs_torch.sh base 25000 2>&1 | tee "$OUT/bench_base.txt"
# The rest of the CPU suite on this machine, for completeness.
ctest --test-dir build-gpu -E "Cuda|Learning" -j8 > "$OUT/ctest_rest.log" 2>&1
grep -E "tests passed|Failed" "$OUT/ctest_rest.log" | tail -5
