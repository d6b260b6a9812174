// Spack.yaml must be a file Spack accepts and must name every dependency that the CMake
// files look for, so that a cluster user who installs the Spack environment can build
// without surprises. It is read with a YAML parser (yaml-cpp), as Spack reads it: an
// unquoted `cmake@3.25:` is then a mapping, not a spec, exactly as Spack sees it.
// The package of the project (spack/packages/transformer-hpc/package.py) is read as
// text: its depends_on lines must cover the same dependencies, with the variants the
// build needs, and Spack.yaml must reach it (repos:, develop:, a root spec). No Spack
// runs here (CI cannot reach one); docs/cluster.md "Building on a cluster with Spack" says which
// Spack release concretized and installed it, and how.
#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

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

// CMake's name for a dependency -> the Spack package that provides it in Spack.yaml
// (a concrete package) and in the recipe (where a virtual serves: any MPI, any
// pkg-config). Threads is the C library's and OpenMP the compiler's: "" (no package).
struct Provider {
  std::string environment;
  std::string recipe;
};
const std::map<std::string, Provider>& providers() {
  static const std::map<std::string, Provider> map = {
      {"MPI", {"openmpi", "mpi"}},
      {"HDF5", {"hdf5", "hdf5"}},
      {"Boost", {"boost", "boost"}},
      {"PkgConfig", {"pkgconf", "pkgconfig"}},
      {"sentencepiece", {"sentencepiece", "sentencepiece"}},
      {"OpenBLAS", {"openblas", "openblas"}},
      {"GTest", {"googletest", "googletest"}},
      {"CUDAToolkit", {"cuda", "cuda"}},
      {"nccl", {"nccl", "nccl"}},
      {"yaml-cpp", {"yaml-cpp", "yaml-cpp"}},
      {"OpenSSL", {"openssl", "openssl"}},
      {"dnnl", {"onednn", "onednn"}},
      {"Protobuf", {"protobuf", "protobuf"}},
      {"Threads", {"", ""}},
      {"OpenMP", {"", ""}}};
  return map;
}

// Every dependency CMakeLists.txt and tests/tests.cmake look for.
std::set<std::string> all_cmake_dependencies() {
  std::set<std::string> deps = cmake_dependencies(read_file(kRoot + "/CMakeLists.txt"));
  const std::set<std::string> test_deps =
      cmake_dependencies(read_file(kRoot + "/tests/tests.cmake"));
  deps.insert(test_deps.begin(), test_deps.end());
  return deps;
}

// The CUDA architectures a spec asks for ("cuda_arch=80,90" -> {80, 90}; "90a" -> 90).
std::vector<int> cuda_archs(const std::string& spec) {
  std::vector<int> archs;
  std::smatch match;
  if (std::regex_search(spec, match, std::regex(R"(cuda_arch=([0-9a-z,]+))"))) {
    std::stringstream list(match[1].str());
    for (std::string arch; std::getline(list, arch, ',');) archs.push_back(std::stoi(arch));
  }
  return archs;
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
  const std::set<std::string> deps = all_cmake_dependencies();
  ASSERT_GE(deps.size(), 10u) << "the CMakeLists.txt parser found too little";
  for (const std::string& dep : deps) {
    auto it = providers().find(dep);
    ASSERT_NE(it, providers().end())
        << "CMake looks for '" << dep
        << "': add its Spack package to Spack.yaml, to package.py and to providers()";
    const std::string& package = it->second.environment;
    if (package.empty()) continue;
    EXPECT_NE(spec(package), "") << "Spack.yaml lacks '" << package << "' (for " << dep << ")";
  }
  EXPECT_NE(spec("cmake"), "") << "Spack.yaml lacks cmake";
}

// The variants the build relies on.
TEST_F(SpackEnvironment, VariantsTheBuildNeeds) {
  EXPECT_NE(spec("boost").find("+program_options"), std::string::npos) << spec("boost");
  // Serial HDF5 (rank 0 alone writes).
  EXPECT_NE(spec("hdf5").find("~mpi"), std::string::npos) << spec("hdf5");
  // checkpoint.background_write needs it (the program falls back without it).
  EXPECT_NE(spec("hdf5").find("+threadsafe"), std::string::npos) << spec("hdf5");
  // Static protobuf: CMakeLists.txt links it hidden (Protobuf_USE_STATIC_LIBS), and the
  // 3.21 series, the last without Abseil: a floor (`@3.21:`) lets Spack pick 32.x.
  EXPECT_NE(spec("protobuf").find("~shared"), std::string::npos) << spec("protobuf");
  EXPECT_TRUE(std::regex_search(spec("protobuf"), std::regex(R"(@3\.21(\.[0-9]+)?(\s|$))")))
      << "protobuf must be pinned to the 3.21 series: " << spec("protobuf");
  // One OpenMP team for the CPU kernels' loops and BLAS (CMakeLists.txt says why).
  EXPECT_NE(spec("openblas").find("threads=openmp"), std::string::npos) << spec("openblas");
  for (const char* variant : {"fabrics=ucx", "schedulers=slurm"}) {
    EXPECT_NE(spec("openmpi").find(variant), std::string::npos) << spec("openmpi");
  }
}

// The ranks hand MPI host memory only (the CPU backend's gradients, the NCCL id,
// scalars); NCCL moves the GPU gradients. So neither Open MPI nor the UCX under it is
// built with CUDA, as Spack.yaml's comments say, and UCX gets its InfiniBand transports
// (Spack's UCX builds none by default: Open MPI would then go over TCP between nodes).
TEST_F(SpackEnvironment, MpiAndUcxCarryHostMemoryOverInfiniBand) {
  EXPECT_NE(spec("openmpi").find("~cuda"), std::string::npos) << spec("openmpi");
  EXPECT_EQ(spec("openmpi").find("+cuda"), std::string::npos) << spec("openmpi");
  const std::string ucx = environment_["packages"]["ucx"]["require"].as<std::string>("");
  ASSERT_FALSE(ucx.empty()) << "Spack.yaml has no packages: ucx: require:";
  EXPECT_TRUE(std::regex_search(ucx, std::regex(R"((^|\s)~cuda(\s|$))"))) << ucx;
  for (const char* transport : {"+verbs", "+rdmacm", "+rc", "+ud", "+dc", "+mlx5_dv", "+cma"}) {
    EXPECT_NE(ucx.find(transport), std::string::npos) << "ucx lacks " << transport << ": " << ucx;
  }
}

// The GPUs every cuda_arch in the environment names have bf16 (sm_80 and later), as
// CMakeLists.txt and the recipe require.
TEST_F(SpackEnvironment, CudaArchitecturesHaveBf16) {
  std::vector<std::string> texts;
  for (const auto& [name, text] : specs_) texts.push_back(text);
  texts.push_back(environment_["packages"]["all"]["variants"].as<std::string>(""));
  int named = 0;
  for (const std::string& text : texts) {
    for (int arch : cuda_archs(text)) {
      ++named;
      EXPECT_GE(arch, 80) << "'" << text << "' asks for sm_" << arch << ", which has no bf16";
    }
  }
  EXPECT_GE(named, 2) << "no cuda_arch found in the specs and packages:all:variants";
}

// `spack -e thpc install` builds the project itself: the root spec, the package
// repository of this checkout and the develop entry that points at it.
TEST_F(SpackEnvironment, BuildsTheProjectFromThisCheckout) {
  const std::string root_spec = spec("transformer-hpc");
  ASSERT_NE(root_spec, "") << "Spack.yaml has no transformer-hpc root spec";
  EXPECT_NE(root_spec.find("+cuda"), std::string::npos) << root_spec;
  EXPECT_FALSE(cuda_archs(root_spec).empty()) << "the root spec names no cuda_arch: " << root_spec;

  // repos: {name: path}, relative to Spack.yaml's folder (the form Spack 1.x rewrites to
  // an absolute path when `spack env create` copies the file).
  const YAML::Node repos = environment_["repos"];
  ASSERT_TRUE(repos.IsMap()) << "Spack.yaml has no repos: mapping";
  bool reaches_recipe = false;
  for (const auto& entry : repos) {
    const std::string path = entry.second.as<std::string>("");
    ASSERT_FALSE(path.empty() || path[0] == '/') << "repos: path '" << path
                                                 << "' must be relative to the checkout";
    const YAML::Node repo = YAML::LoadFile(kRoot + "/" + path + "/repo.yaml")["repo"];
    EXPECT_FALSE(repo["namespace"].as<std::string>("").empty()) << path << "/repo.yaml";
    reaches_recipe |= std::ifstream(kRoot + "/" + path + "/packages/transformer-hpc/package.py")
                          .good();
  }
  EXPECT_TRUE(reaches_recipe) << "no repos: entry holds packages/transformer-hpc/package.py";

  const YAML::Node develop = environment_["develop"]["transformer-hpc"];
  ASSERT_TRUE(develop.IsMap()) << "Spack.yaml has no develop: transformer-hpc entry";
  EXPECT_EQ(develop["path"].as<std::string>(""), ".") << "develop: must build this checkout";
  std::smatch version;
  const std::string develop_spec = develop["spec"].as<std::string>("");
  ASSERT_TRUE(std::regex_search(develop_spec, version, std::regex(R"(^transformer-hpc@=(\S+)$)")))
      << "develop: spec '" << develop_spec << "' is not transformer-hpc@=VERSION";
  const std::string recipe =
      read_file(kRoot + "/spack/packages/transformer-hpc/package.py");
  EXPECT_NE(recipe.find("version(\"" + version[1].str() + "\")"), std::string::npos)
      << "package.py has no version(\"" << version[1] << "\")";
}

// The recipe, read as text: the spec text of each depends_on("NAME...") line.
class SpackRecipe : public ::testing::Test {
 protected:
  void SetUp() override {
    recipe_ = read_file(kRoot + "/spack/packages/transformer-hpc/package.py");
    const std::regex depends_on(R"re(depends_on\(\s*f?"([a-z0-9-]+)([^"]*)")re");
    for (std::sregex_iterator it(recipe_.begin(), recipe_.end(), depends_on), end; it != end;
         ++it) {
      depends_[(*it)[1]] += (*it)[2].str() + " ";
    }
    ASSERT_GE(depends_.size(), 10u) << "the package.py parser found too little";
  }

  // The text after the name in every depends_on of `package`, or "" without one.
  std::string depends(const std::string& package) const {
    const auto found = depends_.find(package);
    return found == depends_.end() ? "" : found->second;
  }

  std::string recipe_;
  std::map<std::string, std::string> depends_;
};

TEST_F(SpackRecipe, DependsOnEveryDependencyCMakeLooksFor) {
  for (const std::string& dep : all_cmake_dependencies()) {
    auto it = providers().find(dep);
    ASSERT_NE(it, providers().end()) << "CMake looks for '" << dep << "': see providers()";
    const std::string& package = it->second.recipe;
    if (package.empty()) continue;
    EXPECT_FALSE(depends_.count(package) == 0)
        << "package.py has no depends_on(\"" << package << "...\") (for " << dep << ")";
  }
  EXPECT_NE(depends("cmake").find("@3.25:"), std::string::npos) << depends("cmake");
}

// The recipe asks for what the build needs, as Spack.yaml does.
TEST_F(SpackRecipe, VariantsTheBuildNeeds) {
  EXPECT_NE(depends("protobuf").find("~shared"), std::string::npos) << depends("protobuf");
  EXPECT_TRUE(std::regex_search(depends("protobuf"), std::regex(R"(^@3\.21(\.[0-9]+)?\s)")))
      << "protobuf must be pinned to the 3.21 series: " << depends("protobuf");
  EXPECT_NE(depends("openblas").find("threads=openmp"), std::string::npos) << depends("openblas");
  EXPECT_NE(depends("boost").find("+program_options"), std::string::npos) << depends("boost");
  EXPECT_NE(depends("hdf5").find("~mpi"), std::string::npos) << depends("hdf5");
  // As Spack.yaml: the recipe alone (outside the environment) got HDF5's default
  // ~threadsafe, and checkpoints written inside the step.
  EXPECT_NE(depends("hdf5").find("+threadsafe"), std::string::npos) << depends("hdf5");
  EXPECT_NE(depends("nccl").find("+cuda"), std::string::npos) << depends("nccl");
}

// +cuda / cuda_arch come from CudaPackage, and cmake_args hands both to CMakeLists.txt.
TEST_F(SpackRecipe, PassesTheCudaChoiceToCMake) {
  EXPECT_TRUE(std::regex_search(recipe_, std::regex(R"(class \w+\(CMakePackage, CudaPackage\))")))
      << "the recipe's class must be a CMakePackage and a CudaPackage";
  for (const char* passed : {"\"TRANSFORMER_CUDA\"", "\"CMAKE_CUDA_ARCHITECTURES\"",
                             "\"TRANSFORMER_TESTS\"", "def check"}) {
    EXPECT_NE(recipe_.find(passed), std::string::npos) << "package.py lacks " << passed;
  }
  // Architectures without bf16 conflict, as CMakeLists.txt refuses them.
  EXPECT_TRUE(std::regex_search(recipe_, std::regex(R"(< 80)"))) << "no conflict below sm_80";
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
