#!/usr/bin/env bash
# What each kernel of a CUDA source costs the GPU, read without one: registers, spills and
# stack from ptxas, and, when cuobjdump is at hand, the SASS's instruction count and its
# local-memory accesses. Sessions without a GPU weigh a candidate kernel by these before a
# window times it (bench/RESULTS.md: fused_norm_grads' registers, fast_loss_exp's
# instructions a logit).
#
#   bash tools/kernel_resources.sh kernels/cuda/layernorm.cu [NAME_REGEX] [ARCH]
#
# NAME_REGEX: the kernels to list (a grep -E pattern on the demangled name; default all).
# ARCH: the SM version (default 90, the H100's and H200's). The flags are the build's
# (CMakeLists.txt: -O3 -DNDEBUG, C++17, THPC_HAVE_CUDA=1). cuobjdump: $CUOBJDUMP, else the
# one on PATH; the Debian CUDA packages lack it, PyPI has it:
#   pip download --no-deps nvidia-cuda-cuobjdump -d DIR && python3 -m zipfile -e DIR/*.whl DIR
#   CUOBJDUMP=DIR/nvidia/cu13/bin/cuobjdump bash tools/kernel_resources.sh ...
set -euo pipefail
usage="usage: bash tools/kernel_resources.sh FILE.cu [NAME_REGEX] [ARCH]"
[ $# -ge 1 ] || { echo "$usage" >&2; exit 2; }
case $1 in -h | --help) echo "$usage"; exit 0 ;; esac
# FILE.cu from where the script was called, or from the repository's root (as the header's
# example gives it): the script works from the root (a path relative to tools/ was not
# found; a helper's trial).
if [ -f "$1" ]; then
  source=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
else
  source=$1
fi
cd "$(dirname "$0")/.."
pattern=${2:-.}
arch=${3:-90}
[ -f "$source" ] || { echo "kernel_resources: no file $source, from here or from the" \
                           "repository's root" >&2; exit 2; }
command -v nvcc > /dev/null || { echo "kernel_resources: nvcc is not on PATH" >&2; exit 2; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

nvcc -O3 -DNDEBUG -DTHPC_HAVE_CUDA=1 -std=c++17 -I src -I . \
  --generate-code="arch=compute_$arch,code=sm_$arch" -Xptxas -v \
  -c "$source" -o "$work/kernels.o" 2> "$work/ptxas.txt" ||
  { cat "$work/ptxas.txt" >&2; exit 1; }

cuobjdump=${CUOBJDUMP:-$(command -v cuobjdump || true)}
if [ -n "$cuobjdump" ]; then
  "$cuobjdump" -sass "$work/kernels.o" > "$work/sass.txt"
else
  : > "$work/sass.txt"
  echo "(no cuobjdump: the SASS columns are empty; see this script's header)" >&2
fi

python3 - "$work/ptxas.txt" "$work/sass.txt" "$pattern" << 'EOF'
import re
import subprocess
import sys

ptxas_path, sass_path, pattern = sys.argv[1:4]
kernels = {}  # mangled name -> [registers, spill stores, stack]
name = None  # the entry being compiled: its "Used N registers" line
described = None  # the function whose properties follow (an entry, or a device function)
for line in open(ptxas_path):
    found = re.search(r"Compiling entry function '(\S+)'", line)
    if found:
        name = found.group(1)
        kernels[name] = ["?", "?", "?"]
        continue
    found = re.search(r"Function properties for (\S+)", line)
    if found:
        described = found.group(1)
        continue
    frame = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores", line)
    if frame and described in kernels:
        kernels[described][2], kernels[described][1] = frame.group(1), frame.group(2)
    used = re.search(r"Used (\d+) registers", line)
    if used and name is not None:
        kernels[name][0] = used.group(1)

sass = {}  # mangled name -> (instructions, local loads + stores)
parts = re.split(r"\n\s*Function : (\S+)\n", open(sass_path).read())
for i in range(1, len(parts), 2):
    body = parts[i + 1]
    instructions = len(re.findall(r"/\*[0-9a-f]{4,6}\*/", body))
    local = len(re.findall(r"\b(?:LDL|STL)\b", body))
    sass[parts[i]] = (instructions, local)

names = list(kernels)
demangled = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True,
                           text=True).stdout.splitlines() if names else []
print(f"{'regs':>4} {'spill':>5} {'stack':>5} {'sass':>6} {'local':>5}  kernel")
for mangled, readable in zip(names, demangled):
    readable = re.sub(r"\(anonymous namespace\)::", "", readable)
    if not re.search(pattern, readable):
        continue
    registers, spills, stack = kernels[mangled]
    instructions, local = sass.get(mangled, ("-", "-"))
    print(f"{registers:>4} {spills:>5} {stack:>5} {instructions!s:>6} {local!s:>5}  "
          f"{readable.split('(')[0]}")
EOF
