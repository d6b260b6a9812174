// Helpers shared by the test suites that run the built programs (build/transformer_*)
// as a user does and read what they write.
#pragma once

#include <pty.h>
#include <sys/wait.h>
#include <termios.h>
#include <unistd.h>

#include <cerrno>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "python_interpreter.h"  // python_interpreter(), for suites running Python tools

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

// Runs a shell command with its standard input, output and error on a new pseudo-terminal,
// as at a user's terminal (isatty() is true for each); its exit code and everything it
// wrote there, byte for byte (the terminal is raw: it does not turn "\n" into "\r\n").
inline ProcessResult run_on_terminal(const std::string& command) {
  ProcessResult result;
  termios raw{};
  ::cfmakeraw(&raw);
  int terminal = -1;
  const pid_t pid = ::forkpty(&terminal, nullptr, &raw, nullptr);
  if (pid < 0) return result;
  if (pid == 0) {
    ::execl("/bin/sh", "sh", "-c", command.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  char buffer[4096];
  for (;;) {
    const ssize_t read = ::read(terminal, buffer, sizeof buffer);
    if (read > 0) {
      result.output.append(buffer, static_cast<size_t>(read));
    } else if (read < 0 && errno == EINTR) {
      continue;
    } else {
      break;  // EIO once the command and its children have closed the terminal
    }
  }
  ::close(terminal);
  int status = 0;
  ::waitpid(pid, &status, 0);
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

// The shell command that writes the default job's corpus at its small size
// (tools/make_numbers_corpus.py: 400 training, 60 validation, 10 test pairs) to DIR/text
// and its shards (a 120-piece vocabulary) to DIR/data: seconds, nothing downloaded.
inline std::string small_numbers_corpus_command(const std::filesystem::path& dir) {
  const std::string text = (dir / "text").string();
  return "python3 " THPC_SOURCE_DIR "/tools/make_numbers_corpus.py --train 400 --valid 60 "
         "--test 10 --seed 1 --out " + text + " && " THPC_BINARY_DIR "/transformer_preprocess "
         "--source-lang en --target-lang de --trainpref " + text + "/train --validpref " + text +
         "/valid --destdir " + (dir / "data").string() + " --vocab-size 120 --model-type bpe "
         "--seed 1";
}

}  // namespace thpc
