// Errors raised by the torch-free core. Bad input from a caller (options, sizes, payload bytes)
// throws cgx::InvalidArgument, which the Python binding turns into ValueError.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace cgx {

class InvalidArgument : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

template <typename... Args>
[[noreturn]] void throw_invalid(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  throw InvalidArgument(os.str());
}

}  // namespace cgx

// Check a condition on caller-provided input; the message pieces are streamed together.
#define CGX_CHECK_ARG(cond, ...)         \
  do {                                   \
    if (!(cond)) {                       \
      ::cgx::throw_invalid(__VA_ARGS__); \
    }                                    \
  } while (0)
