#include "io/run_file_names.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>

namespace thpc {
namespace {

namespace fs = std::filesystem;

constexpr const char* kStepPrefix = "step_";
constexpr const char* kBestStepPrefix = "best_step_";
constexpr const char* kStepSuffix = ".h5";

}  // namespace

int64_t step_of_file_name(const std::string& name) {
  const std::string prefix = kStepPrefix, suffix = kStepSuffix;
  if (name.size() <= prefix.size() + suffix.size() || name.rfind(prefix, 0) != 0 ||
      name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0) {
    return -1;
  }
  const std::string digits = name.substr(prefix.size(), name.size() - prefix.size() - suffix.size());
  // More than 18 digits would overflow int64 (std::stoll throws): not a step of ours.
  if (digits.size() > 18 ||
      !std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    return -1;
  }
  return std::stoll(digits);
}

std::string checkpoint_file_name(int64_t step) {
  char name[64];
  std::snprintf(name, sizeof name, "%s%08lld%s", kStepPrefix, static_cast<long long>(step),
                kStepSuffix);
  return name;
}

std::string best_checkpoint_file_name(int64_t step) {
  return kBestStepPrefix + checkpoint_file_name(step).substr(std::string(kStepPrefix).size());
}

bool is_best_checkpoint_name(const std::string& path) {
  const std::string name = fs::path(path).filename().string();
  const std::string prefix = kBestStepPrefix;
  return name.rfind(prefix, 0) == 0 && step_of_file_name(kStepPrefix + name.substr(prefix.size())) >= 0;
}

bool is_step_checkpoint_name(const std::string& path) {
  return step_of_file_name(fs::path(path).filename().string()) >= 0;
}

bool is_run_checkpoint_file(const std::string& path) {
  const std::string name = fs::path(path).filename().string();
  const auto starts = [&](const char* prefix) { return name.rfind(prefix, 0) == 0; };
  const auto ends = [&](const std::string& suffix) {
    return name.size() >= suffix.size() &&
           name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
  };
  return is_step_checkpoint_name(name) || name == "best.h5" || is_best_checkpoint_name(name) ||
         ((starts("average_last") || starts("average_best")) && ends(".h5")) ||
         (starts("step_") && name.find(".h5.corrupt") != std::string::npos);
}

bool is_training_run_file(const std::string& path) {
  const std::string name = fs::path(path).filename().string();
  return is_run_checkpoint_file(name) || name == kTrainerLockName || name == kMetricsFileName ||
         name.rfind(kEventFilePrefix, 0) == 0;
}

}  // namespace thpc
