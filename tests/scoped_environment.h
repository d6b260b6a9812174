// An environment variable set, or removed, for the life of the object, and put back as it
// was after it (the tests' hooks and the programs' start-up read the environment).
#pragma once

#include <cstdlib>
#include <optional>
#include <string>

namespace thpc {

class ScopedEnvironment {
 public:
  // `value` nullopt: the variable removed for the scope.
  ScopedEnvironment(const char* name, const std::optional<std::string>& value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value) {
      ::setenv(name, value->c_str(), 1);
    } else {
      ::unsetenv(name);
    }
  }
  ~ScopedEnvironment() {
    if (old_) {
      ::setenv(name_, old_->c_str(), 1);
    } else {
      ::unsetenv(name_);
    }
  }
  ScopedEnvironment(const ScopedEnvironment&) = delete;
  ScopedEnvironment& operator=(const ScopedEnvironment&) = delete;

 private:
  const char* name_;
  std::optional<std::string> old_;
};

}  // namespace thpc
