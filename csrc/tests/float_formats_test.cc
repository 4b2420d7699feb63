// The MX formats' native kernels (core/float_formats.h) on values worked out by hand; their
// bytes against the tensor-operation reference: tests/test_float_formats.py.
#include "core/float_formats.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

namespace cgx::floats {
namespace {

const Element kE2M1{2, 1, 1, 6.0f, 2, 0};
const Element kE4M3{4, 3, 7, 448.0f, 8, 1};

TEST(FloatFormats, E2M1CodesNearestEvenAndSaturating) {
  // E2M1 values 0, 0.5, 1, 1.5, 2, 3, 4, 6 are codes 0..7; the sign is bit 3
  const float in[] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  for (uint32_t c = 0; c < 8; ++c) {
    EXPECT_EQ(quantize(in[c], kE2M1, -1.0f), c);
    EXPECT_EQ(quantize(-in[c], kE2M1, -1.0f), c | 8u);
    EXPECT_EQ(value(c, kE2M1), in[c]);
  }
  EXPECT_EQ(quantize(0.25f, kE2M1, -1.0f), 0u);  // a tie: to the even code, 0
  EXPECT_EQ(quantize(0.75f, kE2M1, -1.0f), 2u);  // a tie: 1.0
  EXPECT_EQ(quantize(2.5f, kE2M1, -1.0f), 4u);   // a tie: 2.0
  EXPECT_EQ(quantize(5.0f, kE2M1, -1.0f), 6u);   // a tie: 4.0
  EXPECT_EQ(quantize(100.0f, kE2M1, -1.0f), 7u);
  EXPECT_EQ(quantize(NAN, kE2M1, -1.0f), 7u);
  EXPECT_EQ(quantize(2.5f, kE2M1, 0.49f), 4u);  // stochastic: floor(1.25 + u) quanta of 2
  EXPECT_EQ(quantize(2.5f, kE2M1, 0.76f), 5u);
}

TEST(FloatFormats, E4M3LargestAndItsNaN) {
  EXPECT_EQ(quantize(448.0f, kE4M3, -1.0f), 0x7Eu);
  EXPECT_EQ(quantize(1e9f, kE4M3, -1.0f), 0x7Eu);
  EXPECT_TRUE(std::isnan(value(0x7F, kE4M3)));
  EXPECT_EQ(value(0x01, kE4M3), std::ldexp(1.0f, -9));  // the smallest subnormal
}

TEST(FloatFormats, MxScaleFloorAndOneBlock) {
  EXPECT_EQ(mx_scale(6.0f, kE2M1, false), 127);  // 2^(2 - 2)
  EXPECT_EQ(mx_scale(7.9f, kE2M1, false), 127);  // saturates at 6 (FLOOR)
  EXPECT_EQ(mx_scale(7.9f, kE2M1, true), 128);   // stochastic: the next, no saturation
  EXPECT_EQ(mx_scale(INFINITY, kE2M1, false), 255);
  EXPECT_TRUE(std::isnan(mx_scale_value(255)));
  EXPECT_EQ(mx_scale_value(0), std::ldexp(1.0f, -126));
  std::vector<float> x(33, 0.0f), y(33, 1.0f);
  x[0] = 12.0f, x[1] = -3.0f, x[32] = 0.75f;  // block 0 scale 2^1; block 1 (one value) 2^-3
  std::vector<uint8_t> body(mx_body_bytes(33, kE2M1, 32));
  ASSERT_EQ(body.size(), 2u + 17u);
  mx_encode(x.data(), 33, kE2M1, 32, false, RngKey{}, 0, 2, body.data());
  EXPECT_EQ(body[0], 128);
  EXPECT_EQ(body[1], 124);               // 0.75 = 1.5 * 2^-1: 2^(-1 - 2)
  EXPECT_EQ(body[2], 0x7 | (0xB << 4));  // 6 * 2 and -1.5 * 2
  EXPECT_EQ(body[18], 0x7);              // 6 * 2^-3
  mx_decode(body.data(), 33, kE2M1, 32, 0, 2, y.data(), false);
  EXPECT_EQ(y[0], 12.0f);
  EXPECT_EQ(y[1], -3.0f);
  EXPECT_EQ(y[2], 0.0f);
  EXPECT_EQ(y[32], 0.75f);
}

}  // namespace
}  // namespace cgx::floats
