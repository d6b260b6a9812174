# The Spack package of transformer_hpc (docs/cluster.md "Building on a cluster with Spack").
#
# Spack.yaml adds this repository (../../repo.yaml) and asks for
# `transformer-hpc +cuda cuda_arch=90` with `develop:` pointing at the checkout, so
# `spack -e thpc install` builds the dependencies and then the project from the working
# tree; `spack load transformer-hpc` puts the programs on PATH. The dependencies are the
# ones CMakeLists.txt looks for (tests/test_spack.cc checks that every find_package has
# its depends_on here, and that Spack.yaml agrees on the variants).
#
# Package API v1 (`from spack.package import *`, a folder named as the package): Spack
# 0.2x reads it, and Spack 1.x gives such a package the build systems (CMakePackage,
# CudaPackage) through its compatibility layer.

from spack.package import *


class TransformerHpc(CMakePackage, CudaPackage):
    """The encoder-decoder Transformer of "Attention Is All You Need" (Vaswani et al.,
    2017) trained as an MPI job, one rank per GPU with NCCL, and a CPU reference backend
    that runs anywhere; with its tools: SentencePiece preprocessing into HDF5 shards,
    checkpoint averaging, beam-search decoding, BLEU, and a constituency parser mode."""

    # No release is published: Spack.yaml builds the checkout (`develop:`), whose
    # version it names `main`.
    version("main")

    # Unix Makefiles, Spack's default generator and CMake's: CI builds the whole tree
    # with it as well as with Ninja (.ci/run).

    depends_on("c", type="build")
    depends_on("cxx", type="build")
    depends_on("cmake@3.25:", type="build")
    depends_on("pkgconfig", type="build")  # finds SentencePiece

    # Any MPI for the build. The suite's multi-rank tests call Open MPI's mpirun
    # (--oversubscribe); Spack.yaml asks for Open MPI. Ranks hand MPI host memory only
    # (the GPU gradients go through NCCL), so MPI needs no CUDA support.
    depends_on("mpi")
    # Serial HDF5: rank 0 alone writes checkpoints and each rank reads its own shards.
    # +threadsafe: checkpoints written from a thread beside training
    # (checkpoint.background_write); without it each is written inside the step.
    depends_on("hdf5@1.10: ~mpi +threadsafe")
    depends_on("boost@1.74: +program_options")  # and the header-only Boost.CRC
    depends_on("sentencepiece")
    # The OpenMP build: the CPU kernels' loops and BLAS share one OpenMP thread team
    # (CMakeLists.txt says why); CMake finds it by OpenBLAS's own CMake config.
    depends_on("openblas@0.3.21: threads=openmp")
    depends_on("openssl@1.1.1:")  # SHA-256 of checkpoints and shards
    # int8 decoding on the CPU (transformer_decode --compute-type int8): oneDNN's int8
    # matmul, on the same OpenMP runtime as OpenBLAS (kernels/cpu/int8_matmul.h).
    depends_on("onednn@2.6: cpu_runtime=omp")
    # TensorBoard event files: protoc and the lite runtime, linked statically and kept out
    # of the dynamic symbol table, because SentencePiece carries and exports a protobuf
    # runtime of its own (docs/design-training.md "Metrics"). Pinned to 3.21, the last
    # series without Abseil (and Debian 12's, which CI builds with): from 22 on (Spack's
    # protobuf@3.22: and @32:) the static runtime needs some thirty static Abseil
    # libraries on the link line, which CMake's FindProtobuf (module mode, as
    # CMakeLists.txt uses it) does not name, and each of them would have to be hidden
    # as well. CMakeLists.txt stops with this advice when it finds a newer protobuf.
    depends_on("protobuf@3.21 ~shared")

    # Only for `spack install --test=root` (ctest).
    depends_on("googletest@1.12:", type="test")
    depends_on("yaml-cpp@0.6:", type="test")

    # The CUDA backend computes in bf16 (kernels and cuBLASLt), which the GPU has from
    # sm_80 (A100) on; CMakeLists.txt refuses older architectures at configure time, this
    # refuses them when concretizing. Without a cuda_arch, CMakeLists.txt chooses: the
    # build machine's GPUs when it has any, else 80 and 90.
    depends_on("cuda@12.0:", when="+cuda")
    depends_on("nccl@2.18: +cuda", when="+cuda")
    for arch in CudaPackage.cuda_arch_values:
        # NCCL's device code for the same GPUs.
        depends_on(f"nccl cuda_arch={arch}", when=f"+cuda cuda_arch={arch}")
        if int(arch.rstrip("af")) < 80:
            conflicts(
                f"cuda_arch={arch}",
                when="+cuda",
                msg="the CUDA backend computes in bf16 and needs sm_80 or later; on older "
                "GPUs the CPU backend runs the whole program: ~cuda",
            )

    def cmake_args(self):
        args = [
            self.define_from_variant("TRANSFORMER_CUDA", "cuda"),
            self.define("TRANSFORMER_TESTS", self.run_tests),
        ]
        if self.spec.satisfies("+cuda"):
            cuda_arch = self.spec.variants["cuda_arch"].value
            if cuda_arch and cuda_arch[0] != "none":
                args.append(self.define("CMAKE_CUDA_ARCHITECTURES", list(cuda_arch)))
        return args

    def check(self):
        """The GoogleTest suite, as README's test command runs it. Tests whose public
        data is absent ($THPC_DATA) skip with the reason; the CUDA tests skip without a
        GPU."""
        with working_dir(self.build_directory):
            ctest("--output-on-failure", f"-j{make_jobs}")
