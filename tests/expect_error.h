// A check shared by the test suites: user-facing failures are one thpc::Error line that
// names the file or key and the problem.
#pragma once

#include <gtest/gtest.h>

#include <exception>
#include <functional>
#include <string>
#include <vector>

#include "common/error.h"

namespace thpc {

// Runs `action`, which must throw thpc::Error with one line containing every fragment.
// Returns the message ("" when there was none), for checks beyond the fragments.
inline std::string expect_error(const std::function<void()>& action,
                                const std::vector<std::string>& fragments) {
  try {
    action();
  } catch (const Error& error) {
    const std::string message = error.what();
    EXPECT_EQ(message.find('\n'), std::string::npos) << "not one line: " << message;
    for (const std::string& fragment : fragments) {
      EXPECT_NE(message.find(fragment), std::string::npos)
          << "message lacks '" << fragment << "': " << message;
    }
    return message;
  } catch (const std::exception& other) {
    ADD_FAILURE() << "threw a non-thpc exception: " << other.what();
    return "";
  }
  ADD_FAILURE() << "no error thrown; expected one mentioning '" << fragments.front() << "'";
  return "";
}

}  // namespace thpc
