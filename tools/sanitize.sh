#!/usr/bin/env bash
# The CPU library, programs and tests built with AddressSanitizer + UBSan (g++,
# build-asan/, THPC_SANITIZE=ON; UBSan errors are fatal) and the test suite run under
# them, leaks included: what CI runs after the normal suite (docs/reliability.md
# "Sanitizers" has the times and the findings).
#
#   bash tools/sanitize.sh [CTEST_ARGS...]   # e.g. -R Checkpoint
#
# Left out, by name: the tests that train for minutes to show learning, several times
# slower here and reaching no code the other tests do not.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${BUILD_ASAN:-build-asan}
long_tests='^(Learning\.TinyModelLearnsToReverseHeldOutSequences|Multi30kBleu\.TrainedModelClearsTheFloorThatBrokenDecodersCannotReach)$'

cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTRANSFORMER_CUDA=OFF \
  -DTHPC_SANITIZE=ON > /dev/null
cmake --build "$build" -j2
# Leaks are checked (LeakSanitizer); .ci/lsan.supp names the allocations of Open MPI
# that live until exit, by the MPI functions on their full stacks (slow unwinding).
export ASAN_OPTIONS=detect_leaks=1:fast_unwind_on_malloc=0:strict_string_checks=1
export LSAN_OPTIONS=suppressions=$PWD/.ci/lsan.supp:print_suppressions=0
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
ctest --test-dir "$build" --output-on-failure -j2 -E "$long_tests" "$@"
