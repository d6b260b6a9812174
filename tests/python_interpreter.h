// The Python interpreter the tests run Python tools and reference implementations with
// (sacreBLEU's cross-check, TensorBoard's event reader, tools/plot_metrics.py and
// tools/plot_attention.py), and whether it was named (a named
// interpreter must have what a test needs: the test then fails instead of skipping).
#pragma once

#include <cstdlib>
#include <filesystem>
#include <string>

namespace thpc {

struct Interpreter {
  std::string path;
  bool named;
};

// $THPC_PYTHON; else the virtual environment tools/install_deps.sh makes ($THPC_VENV,
// default ~/.cache/thpc-venv), so the README's test command and CI use it with nothing
// set; else python3.
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
