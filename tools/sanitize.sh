#!/usr/bin/env bash
# The CPU library, programs and tests built with AddressSanitizer + UBSan (g++,
# build-asan/, THPC_SANITIZE=ON; UBSan errors are fatal) and the test suite run under
# them, leaks included: what CI runs after the normal suite (docs/reliability.md
# "Sanitizers" has the times and the findings). With --threads, ThreadSanitizer instead
# (build-tsan/, THPC_SANITIZE_THREAD=ON): the threads our code starts and the data they
# share, with each other and with the signal handlers; not a CI stage (docs/reliability.md
# "ThreadSanitizer").
#
#   bash tools/sanitize.sh [--threads] [CTEST_ARGS...]   # e.g. -R Checkpoint
#
# Left out, by name: the tests that train for minutes to show learning, several times
# slower here and reaching little code the other tests do not (the parser's word-leaves
# filter and its rescoring run here in test_tree_filter's beam searches); and the CUDA
# twins' rehearsals (Rehearsal.*: the twin tests' own logic against a CPU stand-in, run
# unsanitized in the suite before this one; the library code they reach is the CPU
# backend the CPU tests check here), 73 tests and 118 s of this suite when it was
# measured (75 tests now); and the whole-program tests tools/sanitize_left_out.txt
# lists, for CI's time. With --threads also the tests about OpenMP's workers, whose
# loops that build runs serial (CMakeLists.txt says why): the fp32 products' (Gemm.*,
# OneDnn.Gemm.*, which look at the workers' signal masks) and the CPU threads'
# (CpuThreads.*).
set -euo pipefail
cd "$(dirname "$0")/.."
threads=0
if [ "${1:-}" = --threads ]; then
  threads=1
  shift
fi
build=${BUILD_ASAN:-build-asan}
[ "$threads" = 1 ] && build=${BUILD_TSAN:-build-tsan}
# ... and the tests tools/sanitize_left_out.txt names (whole-program runs of 6 s or more
# here, which CI's 40 minutes could not hold; the file says which and why), unless
# SANITIZE_LISTED=1: `SANITIZE_LISTED=1 bash tools/sanitize.sh -R Distributed` runs them.
# shellcheck source=tools/left_out_tests.sh
source tools/left_out_tests.sh
if [ "${SANITIZE_LISTED:-0}" != 1 ]; then
  left_out=$(left_out_tests_regex listed)
else
  left_out=$(left_out_tests_regex unlisted)
fi
[ "$threads" = 1 ] && left_out+='|^(OneDnn\.)?Gemm\..*$|^CpuThreads\..*$'

# ThreadSanitizer: -O1 -g1 as below, and the tests' own units instrumented too: unlike
# ASan's, TSan's checks need every access of shared data in view, and a test's thread
# that sets a flag the library reads is one of the pairs it is here for. A report fails
# its test (halt_on_error: a race is a bug wherever it is); second_deadlock_stack names
# both lock orders of a potential deadlock; .ci/tsan.supp names what is not ours.
# TSAN_OPTIONS already set are added after, e.g. log_path=/tmp/tsan/report (a file per
# process that reports, also where a test expects its program to fail anyway).
if [ "$threads" = 1 ]; then
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTRANSFORMER_CUDA=OFF \
    "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g1 -DNDEBUG" \
    "-DCMAKE_C_FLAGS_RELWITHDEBINFO=-O1 -g1 -DNDEBUG" \
    "-DTHPC_SANITIZE_THREAD=ON" "-DTHPC_TESTS_CXX_FLAGS=-O1" > /dev/null
  cmake --build "$build" -j2
  tsan="halt_on_error=1:second_deadlock_stack=1:suppressions=$PWD/.ci/tsan.supp"
  export TSAN_OPTIONS="$tsan${TSAN_OPTIONS:+:$TSAN_OPTIONS}"
  exec ctest --test-dir "$build" --output-on-failure -j2 -E "$left_out" "$@"
fi

# -O1 -g1 (line tables only) instead of RelWithDebInfo's -O2 -g: half the compile time
# (the whole build 808 s of CPU instead of 1674 when it was chosen), and sanitizer
# reports still name file:line; the tests run about as fast, their time going to the
# sanitizers' checks.
# The tests' own units at -O0 and not instrumented (THPC_TESTS_CXX_FLAGS,
# tests/tests.cmake): the library and the programs they test are, and the link brings
# the sanitizers' runtimes; instrumenting the tests' code itself cost most of this
# build's compile time (test_checkpoint.cc 18.2 s with both sanitizers at -O0, 7.7 s
# without, 2026-12-03), for checks of test code rather than of ours.
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTRANSFORMER_CUDA=OFF \
  "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g1 -DNDEBUG" "-DCMAKE_C_FLAGS_RELWITHDEBINFO=-O1 -g1 -DNDEBUG" \
  "-DTHPC_SANITIZE=ON" "-DTHPC_TESTS_CXX_FLAGS=-O0 -fno-sanitize=all" > /dev/null
cmake --build "$build" -j2
# Leaks are checked (LeakSanitizer); .ci/lsan.supp names the allocations of Open MPI
# that live until exit, by the MPI functions on their full stacks: the two programs that
# start MPI (transformer_hpc, mpi_equivalence) record full stacks by their own default
# (src/distributed/mpi_sanitizer_options.h); everything else keeps the fast unwinder, which
# this variable must therefore not override.
export ASAN_OPTIONS=detect_leaks=1:strict_string_checks=1
export LSAN_OPTIONS=suppressions=$PWD/.ci/lsan.supp:print_suppressions=0
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
ctest --test-dir "$build" --output-on-failure -j2 -E "$left_out" "$@"
