// Python's sacreBLEU as transformer_score's peer: the same command line run by both, their
// lines compared, when sacreBLEU is importable by the tests' interpreter
// (python_interpreter.h; tools/install_deps.sh installs it, as in CI).
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "program.h"
#include "python_interpreter.h"

namespace thpc {

// transformer_score ARGUMENTS: its exit code and its standard output and error together.
inline ProcessResult run_score(const std::string& arguments) {
  return run_process(binary_dir() + "/transformer_score " + arguments);
}

// `value` with `decimals` decimals, as sacreBLEU's -w prints it.
inline std::string fixed(double value, int decimals) {
  char buffer[64];
  std::snprintf(buffer, sizeof(buffer), "%.*f", decimals, value);
  return buffer;
}

// The columns `names` of a test set's SCORES.tsv (sacreBLEU's test vectors: a header line,
// then one tab-separated line per system file), by the line's first field; "" where a line
// lacks one.
inline std::map<std::string, std::vector<std::string>> scores_tsv(
    const std::string& path, const std::vector<std::string>& names) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  std::vector<std::string> header;
  std::stringstream header_stream(line);
  for (std::string field; std::getline(header_stream, field, '\t');) header.push_back(field);
  std::vector<size_t> columns;
  for (const std::string& name : names) {
    const auto found = std::find(header.begin(), header.end(), name);
    EXPECT_NE(found, header.end()) << path << ": no column " << name;
    columns.push_back(static_cast<size_t>(found - header.begin()));
  }
  std::map<std::string, std::vector<std::string>> rows;
  while (std::getline(in, line)) {
    std::vector<std::string> fields;
    std::stringstream stream(line);
    for (std::string field; std::getline(stream, field, '\t');) fields.push_back(field);
    if (fields.empty()) continue;
    for (size_t column : columns) {
      rows[fields[0]].push_back(column < fields.size() ? fields[column] : "");
    }
  }
  return rows;
}

// `output` with sacreBLEU's version ("version:2.6.0") and ours ("version:2.x-compatible")
// both written "version:*": everything else must be the same, alignment included.
inline std::string without_version(const std::string& output) {
  std::string kept;
  std::stringstream lines(output);
  for (std::string line; std::getline(lines, line);) {
    // -f json's field of its own.
    const size_t field = line.find("\"version\": \"");
    if (field != std::string::npos) line = line.substr(0, field) + "\"version\": *";
    const size_t at = line.find("|version:");
    if (at != std::string::npos) {
      // A line of the signatures under a table ends with the version.
      const size_t end = std::min(line.find(' ', at), line.size());
      line = line.substr(0, at) + "|version:*" + line.substr(end);
    }
    kept += line + "\n";
  }
  return kept;
}

class SacreBleuPeer : public ::testing::Test {
 protected:
  // `without_it`: what still checks the metric where sacreBLEU is not installed (said when
  // the test skips).
  explicit SacreBleuPeer(std::string without_it) : without_it_(std::move(without_it)) {}

  std::filesystem::path dir;
  std::string python;

  void SetUp() override {
    const Interpreter interpreter = python_interpreter();
    python = interpreter.path;
    const ProcessResult import = run_process(python + " -c 'import sacrebleu'");
    if (import.exit_code != 0) {
      // Named, or installed by install_deps.sh (as in CI), the interpreter must have it.
      ASSERT_FALSE(interpreter.named) << python << " cannot import sacrebleu";
      GTEST_SKIP() << "Python sacrebleu is not importable by '" << python
                   << "' (pip install sacrebleu, or set THPC_PYTHON); " << without_it_;
    }
    dir = std::filesystem::temp_directory_path() /
          ("test_sacrebleu_" + std::to_string(::getpid()) + "_" +
           ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(dir);
  }
  void TearDown() override {
    if (!dir.empty()) std::filesystem::remove_all(dir);
  }

  std::string write_lines(const std::string& name, const std::vector<std::string>& lines) {
    const std::string path = (dir / name).string();
    std::ofstream out(path, std::ios::binary);
    for (const std::string& line : lines) out << line << "\n";
    return path;
  }

  // Runs sacreBLEU and transformer_score with `arguments`, both with -q (sacreBLEU logs
  // nothing; ours no note: WMT17's online-A output begins with a byte-order mark); their
  // lines must agree.
  void expect_same_output(const std::string& arguments) {
    const ProcessResult expected = run_process(
        "{ " + python + " -m sacrebleu -q -f text " + arguments + " 2>/dev/null; }");
    ASSERT_EQ(expected.exit_code, 0) << arguments << "\n" << expected.output;
    const ProcessResult ours = run_score("-q " + arguments);
    ASSERT_EQ(ours.exit_code, 0) << arguments << "\n" << ours.output;
    EXPECT_EQ(without_version(ours.output), without_version(expected.output)) << arguments;
  }

  // sacreBLEU (with -f `format`, none if empty) and transformer_score with `arguments`, both
  // under `environment` (e.g. "SACREBLEU_SEED=7"): the same output, compared line by line
  // and the first difference shown as text (a table's box characters would otherwise fill
  // the log escaped).
  void expect_same_lines(const std::string& environment, const std::string& arguments,
                         const std::string& format = "text") {
    const std::string format_option = format.empty() ? "" : " -f " + format;
    const ProcessResult expected =
        run_process("{ env " + environment + " " + python + " -m sacrebleu -q" + format_option +
                    " " + arguments + " 2>/dev/null; }");
    ASSERT_EQ(expected.exit_code, 0) << arguments << "\n" << expected.output;
    const ProcessResult ours = run_process("env " + environment + " " + binary_dir() +
                                           "/transformer_score -q " + arguments);
    ASSERT_EQ(ours.exit_code, 0) << arguments << "\n" << ours.output;
    std::stringstream ours_lines(without_version(ours.output));
    std::stringstream expected_lines(without_version(expected.output));
    std::string our_line, expected_line;
    for (int number = 1;; ++number) {
      const bool more_ours = static_cast<bool>(std::getline(ours_lines, our_line));
      const bool more_expected = static_cast<bool>(std::getline(expected_lines, expected_line));
      if (!more_ours && !more_expected) break;
      if (more_ours != more_expected || our_line != expected_line) {
        ADD_FAILURE() << environment << " " << arguments << "\nline " << number
                      << "\n ours:      " << our_line << "\n sacreBLEU: " << expected_line;
        break;
      }
    }
  }

 private:
  std::string without_it_;
};

}  // namespace thpc
