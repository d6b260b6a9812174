#!/usr/bin/env bash
# Builds transformer_hpc's CPU half for aarch64 Linux (Grace Hopper's Grace, Graviton,
# Ampere: the nodes beside many an HPC centre's H100s) and runs its suite there under
# qemu-user, from this x86-64 machine: Debian 12's cross compiler against the arm64
# builds of the packages tools/install_deps.sh installs, unpacked into a folder of their
# own (no multiarch: Debian's arm64 Open MPI, HDF5 and SentencePiece development
# packages cannot be installed beside the amd64 ones). What it guards: code that only
# compiles or only works on x86-64 (intrinsics, cpuid, the signedness of char, the
# alignment and memory order x86 forgives). What it cannot: the CUDA half (the CUDA
# toolkit here is x86-64's) and speed (qemu emulates; docs/testing.md "aarch64").
#
#   bash tools/check_aarch64.sh [CTEST_ARGS...]      # e.g. -R Checkpoint
#
# As root, like tools/install_deps.sh (it installs crossbuild-essential-arm64 and
# qemu-user). THPC_AARCH64_ROOT (default ~/.cache/thpc-aarch64) keeps the downloaded
# packages and the folder between runs; BUILD_AARCH64 (default build-aarch64) is the
# build. Left out of the suite as tools/sanitize.sh leaves them out, for time (emulated,
# the long whole-program runs take tens of minutes each): the learning tests, the CUDA
# twins' rehearsals and tools/sanitize_left_out.txt's list; CHECK_AARCH64_ALL=1 runs them.
set -euo pipefail
cd "$(dirname "$0")/.."
root=${THPC_AARCH64_ROOT:-$HOME/.cache/thpc-aarch64}
sysroot=$root/sysroot
build=${BUILD_AARCH64:-build-aarch64}

# shellcheck source=tools/debian_packages.sh
source tools/debian_packages.sh
install_missing_debian_packages check_aarch64 crossbuild-essential-arm64 qemu-user

# The arm64 packages, resolved and downloaded by an apt of their own (its lists and
# cache under $root, the host's sources and keys), then unpacked: the C and C++ runtime
# and headers, and the libraries of tools/install_deps.sh.
packages=(
  libc6-dev libstdc++-12-dev libgcc-12-dev libgomp1
  libopenmpi-dev libhdf5-dev libboost-program-options-dev libsentencepiece-dev
  libopenblas-openmp-dev libdnnl-dev ocl-icd-opencl-dev libssl-dev
  libgtest-dev libyaml-cpp-dev libprotobuf-dev zlib1g-dev
)
if [ ! -f "$sysroot/.complete" ] || [ "$(cat "$sysroot/.complete")" != "${packages[*]}" ]; then
  echo "check_aarch64: downloading the arm64 packages into $root"
  rm -rf "$sysroot"
  mkdir -p "$root/var/lib/apt/lists/partial" "$root/var/cache/apt/archives/partial" \
    "$root/var/lib/dpkg" "$sysroot"
  touch "$root/var/lib/dpkg/status"
  # (APT::Sandbox::User=root: as root the download is into root's own ~/.cache, which
  # apt's _apt user cannot enter.)
  apt_options=(-o "Dir::State=$root/var/lib/apt" -o "Dir::Cache=$root/var/cache/apt"
    -o "Dir::State::status=$root/var/lib/dpkg/status"
    -o APT::Architecture=arm64 -o APT::Architectures=arm64 -o APT::Sandbox::User=root)
  apt-get "${apt_options[@]}" update -qq
  # Only this list's packages unpacked: older versions and dropped packages out first.
  apt-get "${apt_options[@]}" clean
  apt-get "${apt_options[@]}" install -y -qq --download-only --no-install-recommends \
    "${packages[@]}" > /dev/null
  for deb in "$root"/var/cache/apt/archives/*.deb; do dpkg-deb -x "$deb" "$sysroot"; done
  # Links that name an absolute path (libm.so -> /lib/aarch64-linux-gnu/libm.so.6) would
  # reach the host's files: point them into the folder.
  find "$sysroot" -type l | while read -r link; do
    target=$(readlink "$link")
    case $target in /*) ln -sfn "$sysroot$target" "$link" ;; esac
  done
  # OpenBLAS's CMake file names its folders absolutely too (/usr/include/..., /usr/lib/...).
  sed -i "s# /usr/# $sysroot/usr/#g" \
    "$sysroot"/usr/lib/aarch64-linux-gnu/openblas-openmp/cmake/openblas/OpenBLASConfig.cmake
  echo "${packages[*]}" > "$sysroot/.complete"
fi

cmake -S . -B "$build" -G Ninja -DCMAKE_TOOLCHAIN_FILE=cmake/toolchains/aarch64-debian.cmake \
  "-DTHPC_AARCH64_SYSROOT=$sysroot" -DTRANSFORMER_CUDA=OFF > /dev/null
cmake --build "$build" -j2

# The programs the whole-program tests start (the trainer under mpirun, the tools from
# scripts) are aarch64 files the kernel must hand to qemu: binfmt_misc does, where
# qemu-user-binfmt or a line written here registered qemu-aarch64. Without it, only the
# tests ctest starts itself through the emulator run.
export QEMU_LD_PREFIX=$sysroot
binfmt=/proc/sys/fs/binfmt_misc
# An entry for aarch64's ELF header, by whatever name and interpreter it was registered
# (qemu-user-binfmt's is /usr/libexec/qemu-binfmt/aarch64-binfmt-P).
aarch64_registered() {
  grep -qsx 'magic 7f454c460201010000000000000000000200b700' "$binfmt"/*
}
if ! aarch64_registered; then
  [ -f "$binfmt/register" ] || mount -t binfmt_misc binfmt_misc "$binfmt" 2>/dev/null || true
  # ELF, 64-bit, little-endian, an executable or a shared object (PIE), machine 0xb7.
  magic='\x7fELF\x02\x01\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\x02\x00\xb7\x00'
  mask='\xff\xff\xff\xff\xff\xff\xff\x00\xff\xff\xff\xff\xff\xff\xff\xff\xfe\xff\xff\xff'
  if { printf '%s' ":qemu-aarch64:M::$magic:$mask:$(command -v qemu-aarch64):" \
      > "$binfmt/register"; } 2>/dev/null; then
    echo "check_aarch64: registered qemu-aarch64 with binfmt_misc (until the next boot)"
  fi
fi
# shellcheck source=tools/left_out_tests.sh
source tools/left_out_tests.sh
left_out=$(left_out_tests_regex listed)
[ "${CHECK_AARCH64_ALL:-0}" = 1 ] && left_out='^$'
# ... and, always, what cannot pass emulated: this test waits until the trainer's own
# SIGTERM handler is in (SigCgt in /proc), but under qemu-user the process is qemu, which
# catches every signal from its start, so the signal lands before the program's handler.
left_out+='|^CheckpointTest\.SigtermDuringStartUpStopsBeforeTrainingWithExitZero$'
if ! aarch64_registered; then
  echo "check_aarch64: qemu-aarch64 is not registered with binfmt_misc (install" \
    "qemu-user-binfmt, or run this as root): the tests that start programs will fail" >&2
fi
ctest --test-dir "$build" --output-on-failure -j2 --timeout 1800 -E "$left_out" "$@"
