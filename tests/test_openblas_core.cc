// The first line of a run names the kernels OpenBLAS multiplies with, and says when
// OPENBLAS_CORETYPE chose them (kernels/cpu/openblas_core.h): the CPU benchmarks' peers
// do not read that variable, so a number of ours means little without it.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <string>

#include "kernels/cpu/openblas_core.h"
#include "program.h"

namespace thpc {
namespace {

// The trainer's "device cpu (...)" line, run with `environment` before the command.
std::string device_line(const std::string& environment) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() /
                                    ("thpc_openblas_core_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  const ProcessResult run = run_process(
      environment + " " + std::string(THPC_BINARY_DIR) + "/transformer_hpc " +
      std::string(THPC_SOURCE_DIR) + "/input/tiny.ini --train.max_steps=1 " +
      "--train.backend=cpu --checkpoint.dir=" + (dir / "checkpoints").string() + " 2>&1");
  std::filesystem::remove_all(dir);
  EXPECT_EQ(run.exit_code, 0) << run.output;
  const size_t at = run.output.find("device cpu (");
  return at == std::string::npos ? run.output
                                 : run.output.substr(at, run.output.find('\n', at) - at);
}

TEST(OpenBlasCore, TheFirstLineNamesTheKernelsAndWhatChoseThem) {
  // Haswell's kernels run on every x86-64 CPU with AVX2, and asked for by name OpenBLAS
  // runs them.
  const std::string forced = device_line("OPENBLAS_CORETYPE=Haswell");
  EXPECT_NE(forced.find("(cpu-fp32, OpenBLAS Haswell kernels, set by OPENBLAS_CORETYPE=Haswell"),
            std::string::npos)
      << forced;
  EXPECT_EQ(forced.find("this CPU has AVX-512") != std::string::npos, cpu_runs_avx512_kernels())
      << forced;
  // Without the variable: OpenBLAS's own choice for this CPU, named, and nothing said of
  // the variable.
  const std::string own = device_line("env -u OPENBLAS_CORETYPE");
  EXPECT_NE(own.find("(cpu-fp32, OpenBLAS "), std::string::npos) << own;
  EXPECT_NE(own.find(" kernels)"), std::string::npos) << own;
  EXPECT_EQ(own.find("set by OPENBLAS_CORETYPE"), std::string::npos) << own;
}

TEST(OpenBlasCore, AvxTwoKernelsChosenOnAnAvx512CpuGetAdvice) {
  const std::string advice = ": this CPU has AVX-512, unset OPENBLAS_CORETYPE for faster matrix products";
  EXPECT_EQ(openblas_description("Haswell", "Haswell", true),
            "OpenBLAS Haswell kernels, set by OPENBLAS_CORETYPE=Haswell" + advice);
  EXPECT_EQ(openblas_description("Zen", "zen", true),
            "OpenBLAS Zen kernels, set by OPENBLAS_CORETYPE=zen" + advice);
  // No advice: a CPU without AVX-512, AVX-512 kernels asked for, or nothing asked for.
  EXPECT_EQ(openblas_description("Haswell", "Haswell", false),
            "OpenBLAS Haswell kernels, set by OPENBLAS_CORETYPE=Haswell");
  EXPECT_EQ(openblas_description("SkylakeX", "SkylakeX", true),
            "OpenBLAS SkylakeX kernels, set by OPENBLAS_CORETYPE=SkylakeX");
  EXPECT_EQ(openblas_description("Haswell", "", true), "OpenBLAS Haswell kernels");
}

TEST(OpenBlasCore, DescriptionSaysWhenTheVariableChose) {
  const char* before = std::getenv("OPENBLAS_CORETYPE");
  const std::string saved = before != nullptr ? before : "";
  ::setenv("OPENBLAS_CORETYPE", "Haswell", 1);
  const std::string forced = openblas_description();
  ::unsetenv("OPENBLAS_CORETYPE");
  const std::string own = openblas_description();
  if (before != nullptr) ::setenv("OPENBLAS_CORETYPE", saved.c_str(), 1);
  EXPECT_EQ(forced.rfind("OpenBLAS " + openblas_core() + " kernels, set by OPENBLAS_CORETYPE=Haswell", 0), 0u)
      << forced;
  EXPECT_EQ(own, "OpenBLAS " + openblas_core() + " kernels");
}

}  // namespace
}  // namespace thpc
