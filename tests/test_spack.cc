// Spack.yaml must be a file Spack accepts and must name every dependency that the CMake
// files look for, so that a cluster user who installs the Spack environment can build
// without surprises. It is read with a YAML parser (yaml-cpp), as Spack reads it: an
// unquoted `cmake@3.25:` is then a mapping, not a spec, exactly as Spack sees it.
#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>

namespace {

const std::string kRoot = THPC_SOURCE_DIR;

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << "cannot open " << path;
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// The dependencies a CMake file asks for: find_package names, pkg-config modules and
// the libraries located with find_library.
std::set<std::string> cmake_dependencies(const std::string& cmake) {
  std::set<std::string> found;
  const std::regex find_package(R"(find_package\(([\w-]+))");
  const std::regex pkg_module(R"(pkg_check_modules\(\w+\s+(?:REQUIRED\s+)?(?:IMPORTED_TARGET\s+)?(\w+))");
  const std::regex find_library(R"(find_library\(\w+\s+(\w+))");
  for (const auto* re : {&find_package, &pkg_module, &find_library}) {
    for (std::sregex_iterator it(cmake.begin(), cmake.end(), *re), end; it != end; ++it) {
      found.insert((*it)[1]);
    }
  }
  return found;
}

class SpackEnvironment : public ::testing::Test {
 protected:
  void SetUp() override {
    try {
      environment_ = YAML::LoadFile(kRoot + "/Spack.yaml")["spack"];
    } catch (const YAML::Exception& error) {
      FAIL() << "Spack.yaml is not YAML: " << error.what();
    }
    ASSERT_TRUE(environment_.IsMap()) << "Spack.yaml has no 'spack:' mapping";
    const YAML::Node specs = environment_["specs"];
    ASSERT_TRUE(specs.IsSequence()) << "spack.specs is not a list";
    for (const YAML::Node& spec : specs) {
      // Spack wants strings; `- cmake@3.25:` unquoted parses as {cmake@3.25: null}.
      ASSERT_TRUE(spec.IsScalar()) << "a spec that is not a string (quote it): "
                                   << YAML::Dump(spec);
      const std::string text = spec.as<std::string>();
      std::smatch name;
      ASSERT_TRUE(std::regex_search(text, name, std::regex("^([a-z0-9_-]+)")))
          << "spec '" << text << "' does not start with a package name";
      specs_[name[1]] = text;
    }
  }

  // The spec of `package`, or "" when Spack.yaml has none.
  std::string spec(const std::string& package) const {
    const auto found = specs_.find(package);
    return found == specs_.end() ? "" : found->second;
  }

  YAML::Node environment_;
  std::map<std::string, std::string> specs_;  // package name -> spec text
};

TEST_F(SpackEnvironment, NamesEveryDependencyCMakeLooksFor) {
  std::set<std::string> deps = cmake_dependencies(read_file(kRoot + "/CMakeLists.txt"));
  const std::set<std::string> test_deps =
      cmake_dependencies(read_file(kRoot + "/tests/CMakeLists.txt"));
  deps.insert(test_deps.begin(), test_deps.end());
  // CMake's name -> the Spack package that provides it. Threads is the C library's,
  // OpenMP the compiler's, GoogleTest is CMake's own module for the tests.
  const std::map<std::string, std::string> provider = {
      {"MPI", "openmpi"},         {"HDF5", "hdf5"},       {"Boost", "boost"},
      {"PkgConfig", "pkgconf"},   {"sentencepiece", "sentencepiece"},
      {"OpenBLAS", "openblas"},   {"GTest", "googletest"}, {"CUDAToolkit", "cuda"},
      {"nccl", "nccl"},           {"yaml-cpp", "yaml-cpp"}, {"OpenSSL", "openssl"},
      {"Protobuf", "protobuf"},   {"Threads", ""},         {"OpenMP", ""}};
  ASSERT_GE(deps.size(), 10u) << "the CMakeLists.txt parser found too little";
  for (const std::string& dep : deps) {
    auto it = provider.find(dep);
    ASSERT_NE(it, provider.end()) << "CMake looks for '" << dep
                                  << "': add its Spack package to Spack.yaml and to this map";
    if (it->second.empty()) continue;
    EXPECT_NE(spec(it->second), "") << "Spack.yaml lacks '" << it->second << "' (for " << dep
                                    << ")";
  }
  EXPECT_NE(spec("cmake"), "") << "Spack.yaml lacks cmake";
}

// The variants the build relies on.
TEST_F(SpackEnvironment, VariantsTheBuildNeeds) {
  EXPECT_NE(spec("boost").find("+program_options"), std::string::npos) << spec("boost");
  // Serial HDF5 (rank 0 alone writes; h5ls/h5dump and the high-level library).
  EXPECT_NE(spec("hdf5").find("~mpi"), std::string::npos) << spec("hdf5");
  EXPECT_NE(spec("hdf5").find("+hl"), std::string::npos) << spec("hdf5");
  // Static protobuf: CMakeLists.txt links it hidden (Protobuf_USE_STATIC_LIBS).
  EXPECT_NE(spec("protobuf").find("~shared"), std::string::npos) << spec("protobuf");
  // One OpenMP team for the CPU kernels' loops and BLAS (CMakeLists.txt says why).
  EXPECT_NE(spec("openblas").find("threads=openmp"), std::string::npos) << spec("openblas");
  for (const char* variant : {"+cuda", "fabrics=ucx", "schedulers=slurm"}) {
    EXPECT_NE(spec("openmpi").find(variant), std::string::npos) << spec("openmpi");
  }
}

// schedulers=slurm makes Open MPI depend on slurm: without an external, Spack builds a
// Slurm of its own that does not talk to the site's daemons. CUDA likewise comes with
// the site's driver.
TEST_F(SpackEnvironment, SlurmAndCudaAreTheSitesExternals) {
  const YAML::Node packages = environment_["packages"];
  ASSERT_TRUE(packages.IsMap()) << "Spack.yaml has no packages: block";
  for (const char* package : {"slurm", "cuda"}) {
    const YAML::Node entry = packages[package];
    ASSERT_TRUE(entry.IsMap()) << "packages: has no " << package;
    EXPECT_FALSE(entry["buildable"].as<bool>(true)) << package << " must not be buildable";
    const YAML::Node externals = entry["externals"];
    ASSERT_TRUE(externals.IsSequence() && externals.size() >= 1) << package;
    const std::string external_spec = externals[0]["spec"].as<std::string>("");
    EXPECT_EQ(external_spec.rfind(std::string(package) + "@", 0), 0u)
        << package << " external spec '" << external_spec << "'";
    EXPECT_FALSE(externals[0]["prefix"].as<std::string>("").empty()) << package << " prefix";
  }
}

}  // namespace
