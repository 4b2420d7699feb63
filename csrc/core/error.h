// Errors raised by the torch-free core. Bad input from a caller (options, sizes, payload bytes)
// throws cgx::InvalidArgument, which the Python binding turns into ValueError.
#pragma once

#include <cstdio>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>

namespace cgx {

class InvalidArgument : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

// A number written in lowercase hexadecimal (as after `std::hex`), in a message.
struct Hex {
  unsigned long long value;
};

// Message text without iostreams: a shared library that carries its own copy of libstdc++ (a
// toolchain that links it statically) has locale facets the host process never initialised,
// and streaming a number through them crashes (seen on a GPU machine's compiler, docs/gpu.md).
// Each piece reads as `std::ostream <<` would write it: numbers as "%g" (6 digits) or decimal,
// bool as 0 / 1, a char type as its character, Hex{v} as hexadecimal.
template <typename T>
void append_text(std::string& out, const T& v) {
  using U = std::decay_t<T>;
  if constexpr (std::is_same_v<U, Hex>) {
    char buf[24];
    std::snprintf(buf, sizeof(buf), "%llx", v.value);
    out += buf;
  } else if constexpr (std::is_same_v<U, bool>) {
    out += v ? '1' : '0';
  } else if constexpr (std::is_same_v<U, char> || std::is_same_v<U, signed char> ||
                       std::is_same_v<U, unsigned char>) {
    out += static_cast<char>(v);
  } else if constexpr (std::is_integral_v<U>) {
    out += std::to_string(v);
  } else if constexpr (std::is_enum_v<U>) {
    out += std::to_string(static_cast<std::underlying_type_t<U>>(v));
  } else if constexpr (std::is_floating_point_v<U>) {
    char buf[64];
    std::snprintf(buf, sizeof(buf), "%g", static_cast<double>(v));
    out += buf;
  } else {
    static_assert(std::is_convertible_v<const T&, std::string_view>, "not a message piece");
    out += std::string_view(v);
  }
}

template <typename... Args>
std::string text(const Args&... args) {
  std::string out;
  (append_text(out, args), ...);
  return out;
}

template <typename... Args>
[[noreturn]] void throw_invalid(const Args&... args) {
  throw InvalidArgument(text(args...));
}

}  // namespace cgx

// Check a condition on caller-provided input; the message pieces are streamed together.
#define CGX_CHECK_ARG(cond, ...)         \
  do {                                   \
    if (!(cond)) {                       \
      ::cgx::throw_invalid(__VA_ARGS__); \
    }                                    \
  } while (0)
