// cgx::text (core/error.h) writes every message piece as std::ostream would, without iostreams
// (a library that links its own libstdc++ crashes streaming numbers: docs/gpu.md).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <sstream>
#include <string>

#include "core/error.h"

namespace cgx {
namespace {

template <typename... Args>
std::string streamed(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}

TEST(ErrorText, NumbersReadAsStreamed) {
  const double inf = std::numeric_limits<double>::infinity();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (double v : {0.0, -0.0, 1.0, 2.5, -3.25, 1e-7, 123456789.0, 1e300, 4294967296.0, 0.1 + 0.2,
                   1.0 / 3.0, inf, -inf, nan}) {
    EXPECT_EQ(text(v), streamed(v)) << v;
    EXPECT_EQ(text(float(v)), streamed(float(v))) << v;
  }
  // int8_t / uint8_t are char types: streamed as a character, as text() writes them
  EXPECT_EQ(text(int8_t(65), int16_t(-300), int32_t(-70000), int64_t(-1099511627776)),
            streamed(int8_t(65), int16_t(-300), int32_t(-70000), int64_t(-1099511627776)));
  EXPECT_EQ(text(uint32_t(4294967295u), uint64_t(18446744073709551615ull), size_t(7)),
            streamed(uint32_t(4294967295u), uint64_t(18446744073709551615ull), size_t(7)));
  EXPECT_EQ(text(true, false), streamed(true, false));
  EXPECT_EQ(text('x', (unsigned char)'y'), streamed('x', (unsigned char)'y'));
}

TEST(ErrorText, StringsAndHex) {
  const std::string s = "bits";
  const char* p = "pointer";
  EXPECT_EQ(text("qsgd parameter ", s, " = ", 9, " not in [", 2, ", ", 8, "]", p),
            "qsgd parameter bits = 9 not in [2, 8]pointer");
  EXPECT_EQ(text("flags 0x", Hex{0x80}, " and 0x", Hex{0}), "flags 0x80 and 0x0");
  EXPECT_EQ(text(), "");
}

TEST(ErrorText, ThrowInvalidCarriesTheText) {
  try {
    throw_invalid("bucket_size ", -1.5, " must be >= ", 0);
    FAIL() << "no throw";
  } catch (const InvalidArgument& e) {
    EXPECT_STREQ(e.what(), "bucket_size -1.5 must be >= 0");
  }
}

}  // namespace
}  // namespace cgx
