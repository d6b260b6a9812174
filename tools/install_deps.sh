#!/usr/bin/env bash
# Installs the Debian 12 packages transformer_hpc builds and tests with (as root).
# The CUDA toolkit (nvcc, cuBLAS, NCCL) is optional: without it the build is CPU-only.
# Clusters use Spack.yaml instead.
set -euo pipefail
packages=(
  cmake ninja-build g++ pkg-config ccache
  libopenmpi-dev openmpi-bin
  libhdf5-dev hdf5-tools
  libboost-program-options-dev
  libsentencepiece-dev sentencepiece
  libopenblas-dev
  libssl-dev
  libgtest-dev libyaml-cpp-dev
  python3-venv
  # tools/fuzz.sh: clang and its runtime libraries (libFuzzer, ASan, UBSan)
  clang libclang-rt-14-dev
  # tests/slurm_job_test.sh starts its own Slurm on localhost (jobs/*.sbatch on a real one)
  slurm-wlm munge
)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "install_deps: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
  echo "install_deps: all ${#packages[@]} packages present"
fi

# sacreBLEU (not packaged by Debian 12) from PyPI, for test_bleu's cross-check with the
# reference implementation: a virtual environment, so the system Python is left alone.
venv=${THPC_VENV:-$HOME/.cache/thpc-venv}
if ! "$venv/bin/python" -c 'import sacrebleu' 2>/dev/null; then
  echo "install_deps: installing sacrebleu into $venv"
  python3 -m venv "$venv"
  "$venv/bin/python" -m pip install -q 'sacrebleu>=2,<3'
fi
echo "install_deps: sacrebleu in $venv (THPC_PYTHON=$venv/bin/python)"
