#!/usr/bin/env bash
# Installs the Debian 12 packages transformer_hpc builds and tests with (as root).
# The CUDA toolkit (nvcc, cuBLAS, NCCL) is optional: without it the build is CPU-only.
# Clusters use Spack.yaml instead.
#   bash tools/install_deps.sh [--ctranslate2]
# --ctranslate2 also puts CTranslate2 and SentencePiece's Python package into the virtual
# environment below: tools/convert_to_ctranslate2.py, tools/translate_ctranslate2.py,
# bench/decode_vs_ctranslate2.sh and the CTranslate2Conversion tests (which skip without
# them) use them. Optional, and CI does not ask for it: the wheel is ~40 MB.
set -euo pipefail
with_ctranslate2=false
for argument in "$@"; do
  case $argument in
    --ctranslate2) with_ctranslate2=true ;;
    *) echo "install_deps: unknown option '$argument' (the one option is --ctranslate2)" >&2; exit 2 ;;
  esac
done
packages=(
  cmake ninja-build g++ pkg-config ccache
  libopenmpi-dev openmpi-bin
  libhdf5-dev hdf5-tools
  libboost-program-options-dev
  libsentencepiece-dev sentencepiece
  libopenblas-dev libopenblas-openmp-dev
  # oneDNN: int8 decoding on the CPU (its CMake file names OpenCL: ocl-icd-opencl-dev)
  libdnnl-dev ocl-icd-opencl-dev
  libssl-dev
  libgtest-dev libyaml-cpp-dev
  # TensorBoard event files: the protobuf runtime and protoc (boost/crc.hpp gives CRC-32C)
  libprotobuf-dev protobuf-compiler
  python3-venv
  # tools/fuzz.sh: clang and its runtime libraries (libFuzzer, ASan, UBSan)
  clang libclang-rt-14-dev
  # tests/shellcheck_test.sh: the shell scripts' lint
  shellcheck
  # tests/slurm_job_test.sh starts its own Slurm on localhost (jobs/*.sbatch on a real one)
  slurm-wlm munge
)
# shellcheck source=tools/debian_packages.sh
source "$(dirname "$0")/debian_packages.sh"
install_missing_debian_packages install_deps "${packages[@]}"

# Python packages Debian 12 lacks or has too old, from PyPI into a virtual environment,
# so the system Python is left alone: sacreBLEU (test_bleu's cross-check with the
# reference implementation; sentencepiece for its spBLEU tokenizers), TensorBoard (to
# watch runs; test_run_outputs reads the event files back with its reader), matplotlib
# (tools/plot_metrics.py, tools/plot_attention.py) and h5py (tools/plot_attention.py
# reads the attention dumps).
venv=${THPC_VENV:-$HOME/.cache/thpc-venv}
if ! "$venv/bin/python" -c 'import sacrebleu, sentencepiece, tensorboard, matplotlib, h5py' \
    2>/dev/null; then
  echo "install_deps: installing sacrebleu, sentencepiece, tensorboard, matplotlib and h5py" \
    "into $venv"
  python3 -m venv "$venv"
  "$venv/bin/python" -m pip install -q 'sacrebleu>=2,<3' 'sentencepiece>=0.1.99' \
    'tensorboard>=2.12' 'matplotlib>=3.6' h5py
fi
echo "install_deps: sacrebleu, sentencepiece, tensorboard, matplotlib, h5py in $venv" \
  "(THPC_PYTHON=$venv/bin/python)"
if $with_ctranslate2; then
  if ! "$venv/bin/python" -c 'import ctranslate2, sentencepiece' 2>/dev/null; then
    echo "install_deps: installing ctranslate2 and sentencepiece into $venv"
    "$venv/bin/python" -m pip install -q 'ctranslate2>=4.5,<5' 'sentencepiece>=0.1.99'
  fi
  echo "install_deps: ctranslate2 $("$venv/bin/python" -c 'import ctranslate2; print(ctranslate2.__version__)') in $venv"
fi
