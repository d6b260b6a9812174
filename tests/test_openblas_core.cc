// The first line of a run names the kernels OpenBLAS multiplies with, and says when
// OPENBLAS_CORETYPE chose them (kernels/cpu/openblas_core.h): the CPU benchmarks' peers
// do not read that variable, so a number of ours means little without it. On a CPU that
// OpenBLAS does not know, the programs choose the kernels it runs instead of the fallback's.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <optional>
#include <string>

#include "kernels/cpu/openblas_core.h"
#include "program.h"
#include "scoped_environment.h"

namespace thpc {
namespace {

// The trainer's output, one step of tiny.ini on the CPU, run with `environment` (after a
// THPC_OPENBLAS_FALLBACK of the test's own environment is removed) before the command;
// OpenBLAS multiplying (THPC_CPU_GEMM=openblas), so that the line is OpenBLAS's alone
// (where oneDNN multiplies, it follows ", the smallest by ": tests/kernels/gemm_test.cc).
std::string trainer_output(const std::string& environment) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() /
                                    ("thpc_openblas_core_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  const ProcessResult run = run_process(
      "env -u THPC_OPENBLAS_FALLBACK " + environment + " THPC_CPU_GEMM=openblas " +
      thpc::binary_dir() + "/transformer_hpc " + std::string(THPC_SOURCE_DIR) + "/input/tiny.ini " +
      "--train.max_steps=1 --train.backend=cpu --checkpoint.dir=" +
      (dir / "checkpoints").string() + " 2>&1");
  std::filesystem::remove_all(dir);
  EXPECT_EQ(run.exit_code, 0) << run.output;
  return run.output;
}

// Its "device cpu (...)" line.
std::string device_line(const std::string& environment) {
  const std::string output = trainer_output(environment);
  const size_t at = output.find("device cpu (");
  return at == std::string::npos ? output : output.substr(at, output.find('\n', at) - at);
}

// How many times OpenBLAS loaded in a run: it prints "Core: NAME" as it loads at
// OPENBLAS_VERBOSE=2.
int openblas_loads(const std::string& environment) {
  const std::string output = trainer_output(environment + " OPENBLAS_VERBOSE=2");
  int loads = 0;
  for (size_t at = output.find("Core: "); at != std::string::npos;
       at = output.find("Core: ", at + 1)) {
    loads += 1;
  }
  return loads;
}

TEST(OpenBlasCore, TheFirstLineNamesTheKernelsAndWhatChoseThem) {
  const std::string forced = device_line("OPENBLAS_CORETYPE=Haswell");
#if defined(__x86_64__)
  // Haswell's kernels run on every x86-64 CPU with AVX2, and asked for by name OpenBLAS
  // runs them.
  EXPECT_NE(forced.find("(cpu-fp32, OpenBLAS Haswell kernels, set by OPENBLAS_CORETYPE=Haswell"),
            std::string::npos)
      << forced;
  EXPECT_EQ(forced.find("this CPU has AVX-512") != std::string::npos, cpu_runs_avx512_kernels())
      << forced;
#else
  // Elsewhere (aarch64: tools/check_aarch64.sh) the name is another architecture's, which
  // OpenBLAS does not take: its generic kernels run, and the line says so.
  EXPECT_NE(forced.find(" kernels, set by OPENBLAS_CORETYPE=Haswell, a name "), std::string::npos)
      << forced;
  EXPECT_NE(forced.find(" does not take here: it fell back to these kernels instead of choosing "
                        "this CPU's; unset OPENBLAS_CORETYPE"),
            std::string::npos)
      << forced;
#endif
  // Without the variable: OpenBLAS's own choice for this CPU, named, and nothing said of
  // the variable; or, on a CPU it does not know (it falls back to kernels older than
  // AVX2), the kernels the program chose instead and why.
  const std::string own = device_line("-u OPENBLAS_CORETYPE");
  EXPECT_NE(own.find("(cpu-fp32, OpenBLAS "), std::string::npos) << own;
  const size_t chosen = own.find(", set by this program as OPENBLAS_CORETYPE=");
  if (chosen == std::string::npos) {
    EXPECT_NE(own.find(" kernels)"), std::string::npos) << own;
    EXPECT_EQ(own.find("set by OPENBLAS_CORETYPE"), std::string::npos) << own;
    EXPECT_EQ(openblas_loads("-u OPENBLAS_CORETYPE"), 1);  // not started again
  } else {
    // The machine of 2026-11-30 (an Intel Xeon, family 6 model 207, and Debian 12's
    // OpenBLAS 0.3.21): Prescott's kernels replaced by SkylakeX's.
    const std::string chose = "and chose its ";
    const size_t older_at = own.find(chose);
    ASSERT_NE(older_at, std::string::npos) << own;
    const size_t name_at = older_at + chose.size();
    const std::string older = own.substr(name_at, own.find(' ', name_at) - name_at);
    EXPECT_TRUE(core_predates_avx2(older)) << own;
    EXPECT_NE(own.find("does not know this CPU (" + cpu_identity() + ")"), std::string::npos)
        << own;
    // Started again once, never twice; and where it cannot start again (here: the mark of
    // having done so, set by hand), it runs OpenBLAS's choice and says what to set.
    EXPECT_EQ(openblas_loads("-u OPENBLAS_CORETYPE"), 2);
    const std::string unchanged =
        device_line("-u OPENBLAS_CORETYPE THPC_OPENBLAS_FALLBACK=" + older);
    EXPECT_NE(unchanged.find("(cpu-fp32, OpenBLAS " + older + " kernels: "), std::string::npos)
        << unchanged;
    EXPECT_NE(unchanged.find("multiply several times faster here: run with OPENBLAS_CORETYPE="),
              std::string::npos)
        << unchanged;
    // A variable set, even empty, is the user's: OpenBLAS's choice, not started again.
    EXPECT_EQ(openblas_loads("OPENBLAS_CORETYPE="), 1);
  }
}

TEST(OpenBlasCore, ACpuOpenBlasDoesNotKnowGetsTheBestKernelsItRuns) {
  const CpuVectorUnits avx512{true, true}, avx2{true, false}, sse{false, false};
  // OpenBLAS's fallback for a CPU it does not know, on CPUs of each kind.
  EXPECT_EQ(openblas_core_to_choose("Prescott", true, false, avx512), "SkylakeX");
  EXPECT_EQ(openblas_core_to_choose("Prescott", true, false, avx2), "Haswell");
  EXPECT_EQ(openblas_core_to_choose("Prescott", true, false, sse), "");  // it is right there
  EXPECT_EQ(openblas_core_to_choose("Nehalem", true, false, avx2), "Haswell");
  EXPECT_EQ(openblas_core_to_choose("SANDYBRIDGE", true, false, avx512), "SkylakeX");
  // Left as they are: a choice of AVX2 kernels or newer (OpenBLAS's own, whatever this
  // program would have picked: Zen on an AVX-512 Zen 4 is its call), a user's variable
  // (even Prescott), and a library built for one CPU (the variable does nothing there).
  for (const char* modern : {"Haswell", "Zen", "SkylakeX", "Cooperlake", "SapphireRapids",
                             "Excavator", "Zen5", ""}) {
    EXPECT_EQ(openblas_core_to_choose(modern, true, false, avx512), "") << modern;
  }
  EXPECT_EQ(openblas_core_to_choose("Prescott", true, true, avx512), "");
  EXPECT_EQ(openblas_core_to_choose("Prescott", false, false, avx512), "");
}

TEST(OpenBlasCore, AvxTwoKernelsChosenOnAnAvx512CpuGetAdvice) {
  const auto described = [](const std::string& core, const std::string& forced, bool avx512) {
    OpenBlasChoice choice;
    choice.library = "OpenBLAS 0.3.21";
    choice.core = core;
    choice.variable_set = !forced.empty();
    choice.forced = forced;
    choice.cpu_runs_avx512 = avx512;
    return openblas_description(choice);
  };
  const std::string advice = ": this CPU has AVX-512, unset OPENBLAS_CORETYPE for faster matrix products";
  EXPECT_EQ(described("Haswell", "Haswell", true),
            "OpenBLAS Haswell kernels, set by OPENBLAS_CORETYPE=Haswell" + advice);
  EXPECT_EQ(described("Zen", "zen", true),
            "OpenBLAS Zen kernels, set by OPENBLAS_CORETYPE=zen" + advice);
  // No advice: a CPU without AVX-512, AVX-512 kernels asked for, or nothing asked for.
  EXPECT_EQ(described("Haswell", "Haswell", false),
            "OpenBLAS Haswell kernels, set by OPENBLAS_CORETYPE=Haswell");
  EXPECT_EQ(described("SkylakeX", "SkylakeX", true),
            "OpenBLAS SkylakeX kernels, set by OPENBLAS_CORETYPE=SkylakeX");
  EXPECT_EQ(described("Haswell", "", true), "OpenBLAS Haswell kernels");
  // A name OpenBLAS did not take: on aarch64 (an x86-64 core's there) OpenBLAS 0.3.21 fell
  // back to its generic armv8 kernels where it chose neoversen1 unset; on x86-64 (a name
  // it lacks, or none) it picks by the CPU's features.
#if defined(__x86_64__)
  EXPECT_EQ(described("Cooperlake", "SapphireRapids", true),
            "OpenBLAS Cooperlake kernels, set by OPENBLAS_CORETYPE=SapphireRapids, a name "
            "OpenBLAS 0.3.21 does not take: it chose by this CPU's features instead");
#else
  EXPECT_EQ(described("armv8", "Haswell", false),
            "OpenBLAS armv8 kernels, set by OPENBLAS_CORETYPE=Haswell, a name OpenBLAS 0.3.21 "
            "does not take here: it fell back to these kernels instead of choosing this CPU's; "
            "unset OPENBLAS_CORETYPE");
#endif
}

TEST(OpenBlasCore, AVariableALibraryBuiltForOneCpuIgnoresIsSaid) {
  OpenBlasChoice choice;
  choice.library = "OpenBLAS 0.3.26";
  choice.core = "Zen";
  choice.variable_set = true;
  choice.forced = "Haswell";
  choice.dynamic_arch = false;
  EXPECT_EQ(openblas_description(choice),
            "OpenBLAS Zen kernels, set by OPENBLAS_CORETYPE=Haswell, which OpenBLAS 0.3.26 "
            "ignores (built for one CPU, not DYNAMIC_ARCH)");
  choice.forced = "zen";  // what it runs anyway: nothing to say
  EXPECT_EQ(openblas_description(choice), "OpenBLAS Zen kernels, set by OPENBLAS_CORETYPE=zen");
  // Set but empty, in a library that reads it: a name it does not have either.
  choice.dynamic_arch = true;
  choice.forced = "";
  EXPECT_NE(openblas_description(choice).find("set by OPENBLAS_CORETYPE=, a name OpenBLAS "
                                               "0.3.26 does not take"),
            std::string::npos)
      << openblas_description(choice);
}

TEST(OpenBlasCore, KernelsChosenForACpuOpenBlasDoesNotKnowAreExplained) {
  OpenBlasChoice choice;
  choice.cpu = "GenuineIntel family 6 model 207";
  choice.library = "OpenBLAS 0.3.21";
  choice.cpu_runs_avx512 = true;
  // The program started again with the variable set.
  choice.core = "SkylakeX";
  choice.variable_set = true;
  choice.forced = "SkylakeX";
  choice.fallback = "Prescott";
  EXPECT_EQ(openblas_description(choice),
            "OpenBLAS SkylakeX kernels, set by this program as OPENBLAS_CORETYPE=SkylakeX: "
            "OpenBLAS 0.3.21 does not know this CPU (GenuineIntel family 6 model 207) and chose "
            "its Prescott kernels (set OPENBLAS_CORETYPE to choose others)");
  // ... and OpenBLAS did not take the name it set.
  choice.core = "Prescott";
  EXPECT_EQ(openblas_description(choice),
            "OpenBLAS Prescott kernels, though this program set OPENBLAS_CORETYPE=SkylakeX "
            "(OpenBLAS 0.3.21 does not know this CPU, GenuineIntel family 6 model 207, and did "
            "not take that name)");
  // It could not start again (or a program that does not try): what to set.
  choice.variable_set = false;
  choice.forced = "";
  choice.fallback = "";
  choice.better = "SkylakeX";
  EXPECT_EQ(openblas_description(choice),
            "OpenBLAS Prescott kernels: OpenBLAS 0.3.21 does not know this CPU (GenuineIntel "
            "family 6 model 207); its SkylakeX kernels multiply several times faster here: run "
            "with OPENBLAS_CORETYPE=SkylakeX");
}

// An OpenBLAS that is not the OpenMP build (an installed program that lost its run path
// loaded Debian's default pthread build: 1.5x slower in a measured run, other losses) is
// named on the first line with what to do; the program's own loads the OpenMP one.
TEST(OpenBlasCore, AnOpenBlasOtherThanTheOpenMpBuildIsAWarning) {
  OpenBlasChoice choice;
  choice.core = "Zen";
  choice.library = "OpenBLAS 0.3.21";
  EXPECT_EQ(openblas_description(choice), "OpenBLAS Zen kernels");
  choice.threading = 1;
  EXPECT_EQ(openblas_description(choice),
            "OpenBLAS Zen kernels; warning: this OpenBLAS 0.3.21 is not an OpenMP build but one "
            "with threads of its own (pthreads), which spin against the ops' OpenMP threads: "
            "build and run with OpenBLAS's OpenMP build (Debian: libopenblas0-openmp; Spack: "
            "openblas threads=openmp), and check LD_LIBRARY_PATH");
  choice.threading = 0;
  EXPECT_NE(openblas_description(choice).find("a sequential one, whose products use one core"),
            std::string::npos);
  EXPECT_EQ(openblas_choice().threading, 2) << "this test program loads another OpenBLAS";
}

TEST(OpenBlasCore, DescriptionSaysWhenTheVariableChose) {
  const ScopedEnvironment no_mark("THPC_OPENBLAS_FALLBACK", std::nullopt);
  std::string forced, own;
  {
    const ScopedEnvironment haswell("OPENBLAS_CORETYPE", "Haswell");
    forced = openblas_description();
  }
  {
    const ScopedEnvironment unset("OPENBLAS_CORETYPE", std::nullopt);
    own = openblas_description();
  }
  EXPECT_EQ(forced.rfind("OpenBLAS " + openblas_core() +
                             " kernels, set by OPENBLAS_CORETYPE=Haswell", 0),
            0u)
      << forced;
  EXPECT_EQ(own.rfind("OpenBLAS " + openblas_core() + " kernels", 0), 0u) << own;
  EXPECT_EQ(own.find("set by"), std::string::npos) << own;
}

}  // namespace
}  // namespace thpc
