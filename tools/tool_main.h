// The main() of a tool with a hand-parsed command line (transformer_score, _evalb,
// _trees): one place that maps a bad command line to exit 2 with "(see NAME --help)",
// --help to the usage text and exit 0, and any runtime failure to exit 1 with
// "NAME: error: ...".
#pragma once

#include <exception>
#include <iostream>

#include "common/error.h"

namespace thpc::tools {

// `parse(argc, argv)` returns the command line (with a bool `help`) or throws
// thpc::Error for a usage error; `run(command)` returns the exit code.
template <typename Parse, typename Run>
int tool_main(const char* name, const char* usage, int argc, char** argv, Parse parse,
              Run run) {
  decltype(parse(argc, argv)) command;
  try {
    command = parse(argc, argv);
  } catch (const thpc::Error& e) {
    std::cerr << name << ": " << e.what() << "\n(see " << name << " --help)\n";
    return 2;
  }
  if (command.help) {
    std::cout << usage;
    return 0;
  }
  try {
    return run(command);
  } catch (const std::exception& e) {
    std::cerr << name << ": error: " << e.what() << "\n";
    return 1;
  }
}

}  // namespace thpc::tools
