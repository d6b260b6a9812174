# Cross-compiles transformer_hpc for aarch64 Linux (Grace, Graviton, Ampere nodes) with
# Debian 12's cross compiler (crossbuild-essential-arm64) against a folder holding the
# arm64 packages of tools/install_deps.sh, unpacked: tools/check_aarch64.sh makes the
# folder, configures with this file and runs the suite under qemu-user. CPU-only
# (TRANSFORMER_CUDA=OFF): the CUDA toolkit here is x86-64's.
#   cmake -S . -B build-aarch64 -DCMAKE_TOOLCHAIN_FILE=cmake/toolchains/aarch64-debian.cmake \
#         -DTHPC_AARCH64_SYSROOT=FOLDER -DTRANSFORMER_CUDA=OFF
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_LIBRARY_ARCHITECTURE aarch64-linux-gnu)
# try_compile projects inherit the toolchain file but not the cache: pass the folder on.
list(APPEND CMAKE_TRY_COMPILE_PLATFORM_VARIABLES THPC_AARCH64_SYSROOT)
if(NOT THPC_AARCH64_SYSROOT)
  message(FATAL_ERROR "aarch64-debian.cmake: set -DTHPC_AARCH64_SYSROOT=FOLDER, the "
                      "unpacked arm64 packages (tools/check_aarch64.sh makes it)")
endif()
set(CMAKE_SYSROOT "${THPC_AARCH64_SYSROOT}")
set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)
# Programs (protoc, git, python3) are the host's; libraries, headers and CMake packages
# come from the folder only.
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)
# gtest_discover_tests lists each test binary's tests through this, and ctest runs them so.
set(CMAKE_CROSSCOMPILING_EMULATOR qemu-aarch64 -L "${THPC_AARCH64_SYSROOT}")
# Open MPI's and HDF5's wrappers (mpicc, h5cc) here are the host's and name its folders:
# asked, they would put x86-64 headers on the include path. They are not asked; the arm64
# headers and libraries are named instead. (FindHDF5 has no switch to skip its wrapper:
# a path where none is makes it search the folder as it does without one.)
# FORCE: a build folder configured against another folder of packages takes these anew.
set(_thpc_lib "${THPC_AARCH64_SYSROOT}/usr/lib/aarch64-linux-gnu")
set(MPI_SKIP_COMPILER_WRAPPER ON CACHE BOOL "" FORCE)
set(HDF5_C_COMPILER_EXECUTABLE "${THPC_AARCH64_SYSROOT}/no-h5cc-wrapper" CACHE FILEPATH "" FORCE)
set(HDF5_C_INCLUDE_DIR "${THPC_AARCH64_SYSROOT}/usr/include/hdf5/serial" CACHE PATH "" FORCE)
set(MPI_C_HEADER_DIR "${_thpc_lib}/openmpi/include" CACHE PATH "" FORCE)
set(MPI_CXX_HEADER_DIR "${_thpc_lib}/openmpi/include" CACHE PATH "" FORCE)
set(MPI_C_LIB_NAMES mpi CACHE STRING "" FORCE)
set(MPI_CXX_LIB_NAMES mpi CACHE STRING "" FORCE)
set(MPI_mpi_LIBRARY "${_thpc_lib}/openmpi/lib/libmpi.so" CACHE FILEPATH "" FORCE)
set(MPI_CXX_SKIP_MPICXX ON CACHE BOOL "" FORCE)
set(HDF5_C_LIBRARY_hdf5 "${_thpc_lib}/hdf5/serial/libhdf5.so" CACHE FILEPATH "" FORCE)
set(HDF5_C_LIBRARIES "${_thpc_lib}/hdf5/serial/libhdf5.so" CACHE STRING "" FORCE)
# SentencePiece is found through pkg-config: its .pc files in the folder, paths under it.
set(ENV{PKG_CONFIG_SYSROOT_DIR} "${THPC_AARCH64_SYSROOT}")
set(ENV{PKG_CONFIG_LIBDIR}
    "${_thpc_lib}/pkgconfig:${THPC_AARCH64_SYSROOT}/usr/share/pkgconfig")
