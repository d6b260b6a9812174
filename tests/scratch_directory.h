// A fixture for the suites whose tests write files: each test gets a fresh directory of
// its own, /tmp/thpc_test_SUITE_PID_TEST, removed when it ends.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>

namespace thpc {

class ScratchDirectoryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    directory_ = std::filesystem::temp_directory_path() /
                 ("thpc_test_" + std::string(info->test_suite_name()) + "_" +
                  std::to_string(::getpid()) + "_" + info->name());
    std::filesystem::remove_all(directory_);
    std::filesystem::create_directories(directory_);
  }
  void TearDown() override { std::filesystem::remove_all(directory_); }

  // `name` inside the test's directory.
  std::string path(const std::string& name) const { return (directory_ / name).string(); }

  std::filesystem::path directory_;
};

}  // namespace thpc
