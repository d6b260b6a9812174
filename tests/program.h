// Helpers shared by the test suites that run the built programs (build/transformer_*)
// as a user does and read what they write.
#pragma once

#include <pty.h>
#include <sys/wait.h>
#include <termios.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "binary_dir.h"          // binary_dir(), the build folder the programs are in
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

// Starts `argv` with stdout and stderr into a pipe; returns the pid and the read end
// (for tests that signal a program while it runs).
inline pid_t start_process(const std::vector<std::string>& argv, FILE** output) {
  int fds[2];
  if (::pipe(fds) != 0) return -1;
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::dup2(fds[1], STDOUT_FILENO);
    ::dup2(fds[1], STDERR_FILENO);
    ::close(fds[0]);
    ::close(fds[1]);
    std::vector<char*> args;
    for (const std::string& arg : argv) args.push_back(const_cast<char*>(arg.c_str()));
    args.push_back(nullptr);
    ::execv(args[0], args.data());
    ::_exit(127);
  }
  ::close(fds[1]);
  *output = ::fdopen(fds[0], "r");
  return pid;
}

// Reads `output` to its end and waits for `pid`; its log and wait status.
inline std::string finish_process(pid_t pid, FILE* output, int* status) {
  std::string log;
  char line[4096];
  while (std::fgets(line, sizeof line, output) != nullptr) log += line;
  std::fclose(output);
  ::waitpid(pid, status, 0);
  return log;
}

// Whether `pid` has a handler for SIGTERM installed (/proc/PID/status, SigCgt): the
// moment from which a signal is recorded instead of killing it.
inline bool catches_sigterm(pid_t pid) {
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("SigCgt:", 0) == 0) {
      const unsigned long long caught = std::stoull(line.substr(7), nullptr, 16);
      return (caught >> (SIGTERM - 1)) & 1ULL;
    }
  }
  return false;
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
// (tools/make_numbers_corpus.py: 400 training, 60 validation, 10 test pairs; validation's
// tests ask for more validation pairs) to DIR/text and its shards (a 120-piece
// vocabulary) to DIR/data: seconds, nothing downloaded.
inline std::string small_numbers_corpus_command(const std::filesystem::path& dir,
                                                int valid_pairs = 60) {
  const std::string text = (dir / "text").string();
  return "python3 " THPC_SOURCE_DIR "/tools/make_numbers_corpus.py --train 400 --valid " +
         std::to_string(valid_pairs) + " "
         "--test 10 --seed 1 --out " + text + " && " + binary_dir() + "/transformer_preprocess "
         "--source-lang en --target-lang de --trainpref " + text + "/train --validpref " + text +
         "/valid --destdir " + (dir / "data").string() + " --vocab-size 120 --model-type bpe "
         "--seed 1";
}

}  // namespace thpc
