# The GPU architectures the CUDA backend is compiled for (docs/cluster.md, "CPU or GPU").
#
# The backend computes in bf16: __nv_bfloat16 arithmetic in the kernels and cuBLASLt bf16
# GEMMs with fp32 accumulation, which the hardware has from sm_80 (Ampere) on. The kernels
# use nothing newer than sm_80 (no thread-block clusters, TMA, wgmma or fp8), so the one
# source serves A100 (80), A10/A40 (86), L4/L40 (89), H100/H200 (90) and later GPUs.
#
# With no choice made (-DCMAKE_CUDA_ARCHITECTURES, or CMake's CUDAARCHS environment
# variable), the build is for
#  - the GPUs of the configuring machine (CMake's `native`) when it has any: a build on
#    a GPU node or a workstation runs where it was built, with no flag to get right;
#  - otherwise 80;90: A100 and H100/H200, machine code and PTX for each (a later GPU
#    compiles the sm_90 PTX when it loads the program). A login node without GPUs
#    builds for the GPUs clusters have most.
# CMake's `native` stops the configure step on a machine without a GPU (it finds none
# with a test program), so the machine is asked first, with nvidia-smi, which comes
# with the driver: no nvidia-smi, or one that lists no GPU, means no GPU.
#
# Use: thpc_choose_cuda_architectures() before enable_language(CUDA), which reads
# CMAKE_CUDA_ARCHITECTURES (and compiles a test program for it: an architecture the
# toolkit has dropped, sm_70 for CUDA 13, would fail there with nvcc's message, so a
# list of numbers is checked before); thpc_check_cuda_architectures() after it, which
# resolves `native`, `all` and `all-major` to the architectures they stand for, checks
# those, and sets THPC_CUDA_ARCHITECTURES_SUMMARY for the configure summary.

# Stops at any entry of `architectures` (90, 90-real, 90a, ...) before sm_80; sets
# `names_var` to the entries as "sm_NN" names. `requested` and `source` say in the
# message what asked for them.
function(thpc_require_bf16_architectures architectures requested source names_var)
  set(without_bf16 "")
  set(names "")
  foreach(arch IN LISTS architectures)
    # The number is the compute capability times ten; -real/-virtual/a/f follow it.
    if(NOT arch MATCHES "^([0-9]+)([af]?)")
      message(FATAL_ERROR "transformer_hpc: CMAKE_CUDA_ARCHITECTURES entry '${arch}' "
                          "is not an architecture number (80, 90-real, ...)")
    endif()
    list(APPEND names "sm_${CMAKE_MATCH_1}${CMAKE_MATCH_2}")
    if(CMAKE_MATCH_1 LESS 80)
      list(APPEND without_bf16 "sm_${CMAKE_MATCH_1}")
    endif()
  endforeach()
  list(REMOVE_DUPLICATES names)
  if(without_bf16)
    list(REMOVE_DUPLICATES without_bf16)
    list(JOIN without_bf16 ", " without_bf16)
    message(FATAL_ERROR
      "transformer_hpc: CMAKE_CUDA_ARCHITECTURES=${requested} (${source}) includes "
      "${without_bf16}, without bf16 arithmetic: the CUDA backend computes in bf16 and "
      "needs sm_80 or later (A100 80, A10/A40 86, L4/L40 89, H100/H200 90; for example "
      "-DCMAKE_CUDA_ARCHITECTURES=\"80;86;89;90\"). On older GPUs, or none, the CPU "
      "backend runs the whole program: -DTRANSFORMER_CUDA=OFF.")
  endif()
  set(${names_var} "${names}" PARENT_SCOPE)
endfunction()

# Sets CMAKE_CUDA_ARCHITECTURES (a normal variable, so that each configure decides
# afresh: a build folder configured on a login node and again on a GPU node follows the
# machine) unless the user chose, and THPC_CUDA_ARCHITECTURES_SOURCE to say which rule
# applied. THPC_NVIDIA_SMI_ARCHITECTURES holds what nvidia-smi reported ("90-real").
macro(thpc_choose_cuda_architectures)
  set(THPC_NVIDIA_SMI_ARCHITECTURES "")
  if(DEFINED CMAKE_CUDA_ARCHITECTURES)
    set(THPC_CUDA_ARCHITECTURES_SOURCE "as -DCMAKE_CUDA_ARCHITECTURES chose")
    set(thpc_requested "${CMAKE_CUDA_ARCHITECTURES}")
  elseif(DEFINED ENV{CUDAARCHS})
    # CMake itself initializes CMAKE_CUDA_ARCHITECTURES from it in enable_language.
    set(THPC_CUDA_ARCHITECTURES_SOURCE "as the CUDAARCHS environment variable chose")
    set(thpc_requested "$ENV{CUDAARCHS}")
  else()
    find_program(THPC_NVIDIA_SMI nvidia-smi)
    if(THPC_NVIDIA_SMI)
      # One line per GPU, "9.0"; the query needs a driver from 2022 (510) or later.
      execute_process(COMMAND "${THPC_NVIDIA_SMI}" --query-gpu=compute_cap
                              --format=csv,noheader
                      RESULT_VARIABLE thpc_smi_result OUTPUT_VARIABLE thpc_smi_output
                      ERROR_QUIET TIMEOUT 30)
      if(thpc_smi_result EQUAL 0)
        string(REGEX MATCHALL "[0-9]+\\.[0-9]+" thpc_smi_caps "${thpc_smi_output}")
        foreach(thpc_cap IN LISTS thpc_smi_caps)
          string(REPLACE "." "" thpc_cap "${thpc_cap}")
          list(APPEND THPC_NVIDIA_SMI_ARCHITECTURES "${thpc_cap}-real")
        endforeach()
        list(REMOVE_DUPLICATES THPC_NVIDIA_SMI_ARCHITECTURES)
      endif()
    endif()
    if(THPC_NVIDIA_SMI_ARCHITECTURES)
      set(CMAKE_CUDA_ARCHITECTURES native)
      set(THPC_CUDA_ARCHITECTURES_SOURCE "native: the GPUs of this machine; \
-DCMAKE_CUDA_ARCHITECTURES=... to choose")
    else()
      set(CMAKE_CUDA_ARCHITECTURES 80 90)
      set(THPC_CUDA_ARCHITECTURES_SOURCE "no GPU on this machine: A100 and H100/H200 by \
default; -DCMAKE_CUDA_ARCHITECTURES=... to choose")
    endif()
    set(thpc_requested "${CMAKE_CUDA_ARCHITECTURES}")
  endif()
  # A list of numbers is checked now, before nvcc is asked to compile for it.
  if(NOT thpc_requested MATCHES "^(native|all|all-major)$" AND thpc_requested)
    thpc_require_bf16_architectures("${thpc_requested}" "${thpc_requested}"
                                    "${THPC_CUDA_ARCHITECTURES_SOURCE}" thpc_unused_names)
  endif()
endmacro()

# After enable_language(CUDA): the architectures that will be compiled, checked.
macro(thpc_check_cuda_architectures)
  set(thpc_requested "${CMAKE_CUDA_ARCHITECTURES}")
  if(NOT thpc_requested)
    # OFF: CMake passes no architecture flags, CMAKE_CUDA_FLAGS carries them; not checked.
    set(thpc_resolved "")
  elseif(thpc_requested STREQUAL "native")
    # CMake ran its test program when it first identified the compiler in this build
    # folder. Empty: that program found no GPU although nvidia-smi did (a driver older
    # than the toolkit wants, or a folder first configured on a machine without a GPU);
    # what nvidia-smi reported is the same list, so build for it.
    if(CMAKE_CUDA_ARCHITECTURES_NATIVE)
      set(thpc_resolved ${CMAKE_CUDA_ARCHITECTURES_NATIVE})
    elseif(THPC_NVIDIA_SMI_ARCHITECTURES)
      set(thpc_resolved ${THPC_NVIDIA_SMI_ARCHITECTURES})
      set(CMAKE_CUDA_ARCHITECTURES ${THPC_NVIDIA_SMI_ARCHITECTURES})
    else()
      message(FATAL_ERROR
        "transformer_hpc: CMAKE_CUDA_ARCHITECTURES=native, but this machine has no GPU "
        "that CMake can see. Name the GPUs the program will run on instead, for example "
        "-DCMAKE_CUDA_ARCHITECTURES=\"80;90\" (A100, H100/H200), or build the CPU backend "
        "alone with -DTRANSFORMER_CUDA=OFF.")
    endif()
  elseif(thpc_requested STREQUAL "all")
    set(thpc_resolved ${CMAKE_CUDA_ARCHITECTURES_ALL})
  elseif(thpc_requested STREQUAL "all-major")
    set(thpc_resolved ${CMAKE_CUDA_ARCHITECTURES_ALL_MAJOR})
  else()
    set(thpc_resolved ${thpc_requested})
  endif()
  if(thpc_resolved)
    thpc_require_bf16_architectures("${thpc_resolved}" "${thpc_requested}"
                                    "${THPC_CUDA_ARCHITECTURES_SOURCE}" thpc_names)
  else()
    set(thpc_names "the architectures CMAKE_CUDA_FLAGS names")
  endif()
  list(JOIN thpc_names ", " THPC_CUDA_ARCHITECTURES_SUMMARY)
  string(APPEND THPC_CUDA_ARCHITECTURES_SUMMARY " (${THPC_CUDA_ARCHITECTURES_SOURCE})")
endmacro()
