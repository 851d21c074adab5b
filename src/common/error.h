// One error type for every failure caused by outside input (files, flags, requests).
// The message says what was expected, what was found and where; callers add context
// with `Error::in` as the error travels up ("while reading model/config.json: ...").
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>
#include <utility>

namespace dsv4 {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}

  // A copy of this error with `where` prefixed to the message.
  Error in(const std::string& where) const { return Error(where + ": " + what()); }
};

template <typename... Args>
[[noreturn]] void fail(fmt::format_string<Args...> format, Args&&... args) {
  throw Error(fmt::format(format, std::forward<Args>(args)...));
}

}  // namespace dsv4
