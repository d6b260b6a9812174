// Helpers shared by the test suites that run the built programs (build/transformer_*)
// as a user does and read what they write.
#pragma once

#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace thpc {

struct ProcessResult {
  int exit_code = -1;
  std::string output;  // stdout and stderr together
};

// Runs a shell command; its exit code and everything it printed.
inline ProcessResult run_process(const std::string& command) {
  ProcessResult result;
  FILE* pipe = ::popen((command + " 2>&1").c_str(), "r");
  if (pipe == nullptr) return result;
  char buffer[4096];
  size_t read = 0;
  while ((read = std::fread(buffer, 1, sizeof buffer, pipe)) > 0) result.output.append(buffer, read);
  const int status = ::pclose(pipe);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return result;
}

inline std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

inline std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) lines.push_back(line);
  return lines;
}

// The Python interpreter for the tests that use PyPI packages (sacrebleu, tensorboard),
// and whether it was named: $THPC_PYTHON; else the virtual environment
// tools/install_deps.sh makes ($THPC_VENV, default ~/.cache/thpc-venv), so the README's
// test command and CI find the packages with nothing set; else python3 (not named).
struct Interpreter {
  std::string path;
  bool named;
};
inline Interpreter python_interpreter() {
  const char* configured = std::getenv("THPC_PYTHON");
  if (configured != nullptr && *configured != '\0') return {configured, true};
  const char* venv = std::getenv("THPC_VENV");
  const char* home = std::getenv("HOME");
  const std::string venv_dir = venv != nullptr && *venv != '\0' ? std::string(venv)
                               : home != nullptr ? std::string(home) + "/.cache/thpc-venv"
                                                 : std::string();
  if (!venv_dir.empty() && std::filesystem::exists(venv_dir + "/bin/python")) {
    return {venv_dir + "/bin/python", true};
  }
  return {"python3", false};
}

}  // namespace thpc
