# One GoogleTest executable per tests/test_*.cc, and one per op family in
# tests/kernels/<op>_test.cc (test_kernel_<op>: the op's CPU reference tests beside its
# CUDA twins, which compile in every build and skip at run time without a GPU), every
# test registered with ctest under its GoogleTest name (Suite.Test).
# Tests find the repository (input/*.ini, Spack.yaml) through THPC_SOURCE_DIR, the built
# programs as the folder above their own executable's (tests/binary_dir.h), and the public
# data sets through the environment variable THPC_DATA (tests/data_dir.h; absent data
# makes those tests skip).
# This file is included by the top CMakeLists.txt rather than added as a subdirectory: the
# tests' objects are then compiled from the build folder's top, as the library's are, with
# the same relative paths under Ninja and under Makefiles (which compiles a subdirectory's
# objects from that subdirectory), and hold no build folder's path; ccache (CMakeLists.txt)
# then gives CI's Makefiles tree the Ninja tree's test objects.
set(THPC_TESTS_DIR ${CMAKE_CURRENT_LIST_DIR})
include(GoogleTest)
# No GPU visible: what CUDA reads as "no devices" (an empty list).
set(THPC_CPU_ONLY_ENVIRONMENT "CUDA_VISIBLE_DEVICES=")
# The jobs the script tests start (jobs/, the installed scripts): a wait for the other
# ranks outside every dist.timeout_s bound fails them (src/distributed/communicator.cc),
# as it fails test_distributed's.
set(THPC_JOB_CHECK_ENVIRONMENT "THPC_CHECK_BOUNDED_WAITS=1")
# The executables whose tests train for minutes: ctest starts the tests of highest COST
# first, so that these do not begin after the short ones and stretch the suite's wall
# time (a clean clone has no ctest timing data to order by).
set(THPC_LONG_TEST_EXECUTABLES test_parse_pipeline test_multi30k_bleu test_learning)
# The tests' own translation units (GoogleTest's expansions, fixtures, assertions) are
# compiled at -Og instead of the build type's -O3: half the compile time (all of them 232 s
# of CPU instead of 483; test_checkpoint.cc 6.9 instead of 18.8) for code that checks
# results rather than computes them. The library and the programs under test keep the
# build type's flags (header-only code the tests instantiate takes theirs; results are the
# same). tools/sanitize.sh passes -O0 (ASan and UBSan at -O1 made the tests' units 2/3 of
# that build). Set it empty to compile the tests as the library.
set(THPC_TESTS_CXX_FLAGS "-Og" CACHE STRING
    "Flags after the build type's for the test executables' own sources (empty: none)")
separate_arguments(THPC_TESTS_CXX_FLAGS_LIST UNIX_COMMAND "${THPC_TESTS_CXX_FLAGS}")
function(thpc_add_test test_name test_source)
  add_executable(${test_name} ${test_source})
  target_link_libraries(${test_name} PRIVATE thpc_core GTest::gtest GTest::gtest_main)
  target_include_directories(${test_name} PRIVATE ${THPC_TESTS_DIR})
  target_compile_definitions(${test_name} PRIVATE
    THPC_SOURCE_DIR="${CMAKE_SOURCE_DIR}" THPC_MPIEXEC="${MPIEXEC_EXECUTABLE}")
  # Expected values computed as the CPU ops compute them, rounding for rounding.
  target_compile_options(${test_name} PRIVATE ${THPC_WARNINGS} ${THPC_NO_FP_CONTRACTION}
                         ${THPC_TESTS_CXX_FLAGS_LIST})
  set_target_properties(${test_name} PROPERTIES RUNTIME_OUTPUT_DIRECTORY
                        ${CMAKE_BINARY_DIR}/tests)
  set(test_properties "")
  if(test_name IN_LIST THPC_LONG_TEST_EXECUTABLES)
    list(APPEND test_properties COST 1000)
  endif()
  # The CPU suite runs on the CPU on a GPU machine too: train.backend = auto (tiny.ini and
  # most configs) would otherwise train the golden, resume and MPI tests on the GPU in
  # bf16, against numbers measured on the CPU. Only the GPU tests see the devices: the
  # kernel twins (test_kernel_*, whose CPU tests name their backend), test_cuda_training,
  # and elsewhere the suites named Cuda* (CudaDistributed in test_distributed).
  if(NOT test_name MATCHES "^test_kernel_" AND NOT test_name STREQUAL "test_cuda_training")
    set(gpu_properties ${test_properties})
    if(gpu_properties)
      set(gpu_properties PROPERTIES ${gpu_properties})
    endif()
    gtest_discover_tests(${test_name} WORKING_DIRECTORY ${CMAKE_SOURCE_DIR}
                         DISCOVERY_TIMEOUT 60 TEST_FILTER "Cuda*" ${gpu_properties})
    list(APPEND test_properties ENVIRONMENT ${THPC_CPU_ONLY_ENVIRONMENT})
    set(test_filter TEST_FILTER "-Cuda*")
  else()
    set(test_filter "")
  endif()
  if(test_properties)
    set(test_properties PROPERTIES ${test_properties})
  endif()
  gtest_discover_tests(${test_name} WORKING_DIRECTORY ${CMAKE_SOURCE_DIR}
                       DISCOVERY_TIMEOUT 60 ${test_filter} ${test_properties})
endfunction()
file(GLOB THPC_TEST_SOURCES CONFIGURE_DEPENDS ${THPC_TESTS_DIR}/test_*.cc)
foreach(test_source ${THPC_TEST_SOURCES})
  get_filename_component(test_name ${test_source} NAME_WE)
  thpc_add_test(${test_name} ${test_source})
endforeach()
file(GLOB THPC_KERNEL_TEST_SOURCES CONFIGURE_DEPENDS
     ${THPC_TESTS_DIR}/kernels/*_test.cc)
foreach(test_source ${THPC_KERNEL_TEST_SOURCES})
  get_filename_component(op_name ${test_source} NAME_WE)
  string(REGEX REPLACE "_test$" "" op_name ${op_name})
  thpc_add_test(test_kernel_${op_name} ${test_source})
  # The CUDA twins once more as Rehearsal.<Suite>.<Test>, with a CPU backend standing in
  # for the GPU (tests/cuda_twin.h, twin_rehearsal): they prove nothing about the CUDA
  # code, but every build checks the twin tests' own logic, which otherwise first runs
  # on a scarce GPU. Tests that need the GPU's own behaviour skip there with the reason.
  gtest_discover_tests(test_kernel_${op_name} WORKING_DIRECTORY ${CMAKE_SOURCE_DIR}
                       DISCOVERY_TIMEOUT 60 TEST_FILTER "Cuda*" TEST_PREFIX "Rehearsal."
                       PROPERTIES ENVIRONMENT THPC_TWIN_REHEARSAL=1)
endforeach()
# The fp32 products' test looks at the OpenMP workers' signal masks (gemm_test.cc).
target_link_libraries(test_kernel_gemm PRIVATE OpenMP::OpenMP_CXX)
# Its products once more by oneDNN's rule (THPC_CPU_GEMM=onednn), on a CPU without AVX-512
# too, where OpenBLAS multiplies all by default (kernels/cpu/blas.h): the split at the
# smallest products and the workers' signal masks are then checked on every machine.
if(dnnl_FOUND AND DNNL_CPU_RUNTIME STREQUAL "OMP")
  gtest_discover_tests(test_kernel_gemm WORKING_DIRECTORY ${CMAKE_SOURCE_DIR}
                       DISCOVERY_TIMEOUT 60 TEST_FILTER "Gemm.*" TEST_PREFIX "OneDnn."
                       PROPERTIES ENVIRONMENT THPC_CPU_GEMM=onednn)
endif()
# The int8 products once more as on an AVX2 machine without VNNI (oneDNN's saturating
# u8 x s8 pairs, 7-bit weights): tests/kernels/int8_matmul_test.cc. On x86-64 only: the
# variable names an x86 instruction set, which oneDNN ignores elsewhere (aarch64's
# products reach int32 exactly, 8-bit weights; tools/check_aarch64.sh).
if(CMAKE_SYSTEM_PROCESSOR MATCHES "^(x86_64|AMD64|amd64)$")
  gtest_discover_tests(test_kernel_int8_matmul WORKING_DIRECTORY ${CMAKE_SOURCE_DIR}
                       DISCOVERY_TIMEOUT 60 TEST_FILTER "Int8*" TEST_PREFIX "Avx2."
                       PROPERTIES ENVIRONMENT DNNL_MAX_CPU_ISA=AVX2)
endif()

# Tests that need several MPI ranks run under mpirun (as root in CI: the environment
# allows it; --oversubscribe lets 2 ranks share fewer cores; --bind-to none: Open MPI binds
# a job of 2 ranks to cores 0 and 1, and ctest -j runs several such jobs at once, which
# would then all poll on the same two cores of a many-core GPU host).
add_executable(mpi_equivalence ${THPC_TESTS_DIR}/mpi_equivalence.cc)
target_link_libraries(mpi_equivalence PRIVATE thpc_core GTest::gtest)
target_compile_definitions(mpi_equivalence PRIVATE THPC_SOURCE_DIR="${CMAKE_SOURCE_DIR}")
target_compile_options(mpi_equivalence PRIVATE ${THPC_WARNINGS})
set_target_properties(mpi_equivalence PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/tests)
# One ctest test per gtest case (each its own mpirun, selected with --gtest_filter), so
# that ctest's name says which case failed. The cases are read from the source's
# TEST(Suite, Name) lines (gtest_discover_tests cannot run the binary under mpirun).
set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS
             ${THPC_TESTS_DIR}/mpi_equivalence.cc)
file(STRINGS ${THPC_TESTS_DIR}/mpi_equivalence.cc mpi_test_lines
     REGEX "^TEST\\([A-Za-z0-9_]+, *[A-Za-z0-9_]+\\)")
set(mpi_cases "")
foreach(line ${mpi_test_lines})
  string(REGEX REPLACE "^TEST\\(([A-Za-z0-9_]+), *([A-Za-z0-9_]+)\\).*" "\\1.\\2" mpi_case "${line}")
  list(APPEND mpi_cases ${mpi_case})
endforeach()
if(NOT mpi_cases)
  message(FATAL_ERROR "no TEST(Suite, Name) found in tests/mpi_equivalence.cc")
endif()
foreach(mpi_case ${mpi_cases})
  # Two ranks, or four for the suites named *FourRanks.
  set(mpi_ranks 2)
  if(mpi_case MATCHES "^[A-Za-z0-9_]*FourRanks\\.")
    set(mpi_ranks 4)
  endif()
  add_test(NAME ${mpi_case}
           COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${mpi_ranks} --oversubscribe
                   --bind-to none
                   $<TARGET_FILE:mpi_equivalence> --gtest_filter=${mpi_case}
           WORKING_DIRECTORY ${CMAKE_SOURCE_DIR})
  # The CPU cases see no GPU (as the suites above); the Cuda* cases see the devices. A
  # case that skips reports SKIPPED (GoogleTest's line), not a pass.
  set(mpi_environment "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1")
  if(NOT mpi_case MATCHES "^Cuda")
    set(mpi_environment "${mpi_environment};${THPC_CPU_ONLY_ENVIRONMENT}")
  endif()
  set_tests_properties(${mpi_case} PROPERTIES
    TIMEOUT 300
    SKIP_REGULAR_EXPRESSION "\\[  SKIPPED \\]"
    ENVIRONMENT "${mpi_environment}")
endforeach()
# The job scripts on a real Slurm (munged, slurmctld, slurmd started by the test on
# localhost): a job to the end, then one stopped by Slurm's warning signal that must
# checkpoint, requeue itself and resume to the same parameters. About a minute; exit 77
# (skipped, with the reason) where the daemons are not installed or cannot start.
add_test(NAME Slurm.JobCheckpointsRequeuesAndResumesIdentically
         COMMAND bash ${THPC_TESTS_DIR}/slurm_job_test.sh ${CMAKE_SOURCE_DIR}
                 ${CMAKE_BINARY_DIR})
set_tests_properties(Slurm.JobCheckpointsRequeuesAndResumesIdentically PROPERTIES
  TIMEOUT 400 SKIP_RETURN_CODE 77 PROCESSORS 2
  ENVIRONMENT "${THPC_CPU_ONLY_ENVIRONMENT};${THPC_JOB_CHECK_ENVIRONMENT}")
# jobs/common.sh's two-phase run (the averaged window of jobs/base.sbatch and big.sbatch) on
# input/tiny.ini under mpirun, one rank, no Slurm: some seconds.
add_test(NAME Jobs.AveragedWindowIsThePapersInSteps
         COMMAND bash ${THPC_TESTS_DIR}/jobs_averaged_window_test.sh ${CMAKE_SOURCE_DIR}
                 ${CMAKE_BINARY_DIR})
set_tests_properties(Jobs.AveragedWindowIsThePapersInSteps PROPERTIES
  TIMEOUT 300 SKIP_RETURN_CODE 77
  ENVIRONMENT "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1;${THPC_CPU_ONLY_ENVIRONMENT};\
${THPC_JOB_CHECK_ENVIRONMENT}")
# `cmake --install` and the installed job and evaluation scripts, used without the
# repository: some seconds.
add_test(NAME Install.JobsAndToolsRunFromThePrefixWithoutTheRepository
         COMMAND bash ${THPC_TESTS_DIR}/install_test.sh ${CMAKE_SOURCE_DIR} ${CMAKE_BINARY_DIR})
set_tests_properties(Install.JobsAndToolsRunFromThePrefixWithoutTheRepository PROPERTIES
  TIMEOUT 300 SKIP_RETURN_CODE 77
  ENVIRONMENT "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1;${THPC_CPU_ONLY_ENVIRONMENT};\
${THPC_JOB_CHECK_ENVIRONMENT}")
# The shell scripts pass shellcheck's warning level (skipped where it is not installed):
# about 15 s on 2 cores.
add_test(NAME Lint.ShellScriptsPassShellcheck
         COMMAND bash ${THPC_TESTS_DIR}/shellcheck_test.sh ${CMAKE_SOURCE_DIR} ${CMAKE_BINARY_DIR})
set_tests_properties(Lint.ShellScriptsPassShellcheck PROPERTIES TIMEOUT 120 SKIP_RETURN_CODE 77)
# No lambda uses a structured binding (C++17 forbids it; g++ accepts it, clang refuses, and
# only CI's fuzz stage and users build with clang): under a second.
add_test(NAME Lint.NoLambdaCapturesAStructuredBinding
         COMMAND python3 ${THPC_TESTS_DIR}/structured_binding_captures.py ${CMAKE_SOURCE_DIR})
set_tests_properties(Lint.NoLambdaCapturesAStructuredBinding PROPERTIES TIMEOUT 60)
# test_spack reads Spack.yaml with a YAML parser, as Spack does (a test-only dependency).
find_package(yaml-cpp REQUIRED)
target_link_libraries(test_spack PRIVATE yaml-cpp)
# test_bleu, test_chrf, test_moses_bleu, test_ter, test_significance and test_score_json
# run build/transformer_score as a program.
foreach(score_test test_bleu test_chrf test_moses_bleu test_ter test_significance
        test_score_json)
  if(TARGET ${score_test} AND TARGET transformer_score)
    add_dependencies(${score_test} transformer_score)
  endif()
endforeach()
# test_decode, test_attention_dump and test_ctranslate2 run build/transformer_decode as a
# program.
foreach(decode_test test_decode test_attention_dump test_ctranslate2)
  if(TARGET ${decode_test} AND TARGET transformer_decode)
    add_dependencies(${decode_test} transformer_decode)
  endif()
endforeach()
# ... and tools/evaluate.sh runs the averaging tool and the scorer too.
if(TARGET test_decode AND TARGET transformer_average AND TARGET transformer_score)
  add_dependencies(test_decode transformer_average transformer_score)
endif()
# test_multi30k_bleu runs the whole pipeline as programs: preprocess, train (with the
# end-of-run average), decode, score.
if(TARGET test_multi30k_bleu)
  add_dependencies(test_multi30k_bleu transformer_preprocess transformer_hpc transformer_average
                   transformer_decode transformer_score)
endif()
# test_parse_evalb runs build/transformer_evalb as a program.
if(TARGET test_parse_evalb AND TARGET transformer_evalb)
  add_dependencies(test_parse_evalb transformer_evalb)
endif()
# test_parse_trees runs build/transformer_trees as a program.
if(TARGET test_parse_trees AND TARGET transformer_trees)
  add_dependencies(test_parse_trees transformer_trees)
endif()
# test_parse_pipeline runs tools/run_parser.sh, which runs the tree tools, the
# preprocessor, the trainer, the decoder and EVALB as programs.
if(TARGET test_parse_pipeline)
  add_dependencies(test_parse_pipeline transformer_trees transformer_preprocess transformer_hpc
                   transformer_decode transformer_evalb)
endif()
# test_valid_f1 prepares the parser's shards with tools/run_parser.sh (the tree tools, the
# preprocessor) and trains with them.
if(TARGET test_valid_f1)
  add_dependencies(test_valid_f1 transformer_trees transformer_preprocess transformer_hpc)
endif()
# test_tools runs every program beside the trainer through its --help, a bad command line
# and a failing run.
if(TARGET test_tools)
  add_dependencies(test_tools transformer_preprocess transformer_decode transformer_average
                   transformer_data_stats transformer_bench_step transformer_score
                   transformer_evalb transformer_trees transformer_quantize)
endif()
# test_profile runs transformer_bench_step --profile.
if(TARGET test_profile)
  add_dependencies(test_profile transformer_bench_step)
endif()
# test_docs runs every program's --help to check the documents' command examples.
if(TARGET test_docs)
  add_dependencies(test_docs ${THPC_PROGRAMS})
endif()
