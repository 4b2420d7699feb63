#include "core/float_formats.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "core/error.h"

namespace cgx::floats {
namespace {

uint32_t bits_of(float v) {
  uint32_t b;
  std::memcpy(&b, &v, 4);
  return b;
}

float from_bits(uint32_t b) {
  float v;
  std::memcpy(&v, &b, 4);
  return v;
}

// `count` codes of `bits` bits as an LSB-first bit stream at out (whole bytes: count * bits is a
// multiple of 8 but for the last block, whose last byte's high bits are 0).
void pack(const uint32_t* codes, int64_t count, int bits, uint8_t* out) {
  const int64_t bytes = (count * bits + 7) / 8;
  if (bits == 8) {
    for (int64_t i = 0; i < count; ++i) out[i] = uint8_t(codes[i]);
    return;
  }
  std::memset(out, 0, size_t(bytes));
  if (bits == 4) {
    for (int64_t i = 0; i < count; ++i) out[i >> 1] |= uint8_t(codes[i] << ((i & 1) * 4));
    return;
  }
  uint64_t acc = 0;
  int have = 0;
  int64_t at = 0;
  for (int64_t i = 0; i < count; ++i) {
    acc |= uint64_t(codes[i]) << have;
    for (have += bits; have >= 8; have -= 8, acc >>= 8) out[at++] = uint8_t(acc);
  }
  if (have > 0) out[at] = uint8_t(acc);
}

uint32_t unpack(const uint8_t* in, int64_t i, int bits) {
  if (bits == 8) return in[i];
  if (bits == 4) return (in[i >> 1] >> ((i & 1) * 4)) & 0xF;
  const int64_t pos = i * bits;
  uint32_t word = in[pos >> 3];
  if (((pos & 7) + bits) > 8) word |= uint32_t(in[(pos >> 3) + 1]) << 8;
  return (word >> (pos & 7)) & ((1u << bits) - 1);
}

// The code of the largest finite value (the largest magnitude code quantize may write).
uint32_t max_code(const Element& e) {
  const int emin = 1 - e.bias;
  const int ex = int(bits_of(e.max) >> 23) - 127;
  const float r = e.max * from_bits(uint32_t(127 + e.mbits - ex) << 23);
  return (uint32_t(ex - emin) << e.mbits) + uint32_t(r);
}

}  // namespace

uint32_t quantize(float v, const Element& e, float u) {
  // In integers: |v| in the binade of exponent ex (fp32 subnormals and small values at emin)
  // is r quanta of 2^(ex - m), r = round(|v| 2^(m - ex)) (exact scaling by a power of two); the
  // magnitude's code is ((ex - emin) << m) + r, which carries into the next binade by itself
  // and is a subnormal code where ex == emin and r < 2^m. The same codes as rounding the value
  // and reading its fields (the reference's way).
  const uint32_t sign = bits_of(v) >> 31;
  float a = std::fabs(v);
  a = std::isnan(a) ? e.max : std::min(a, e.max);
  const int emin = 1 - e.bias;
  const int ex = std::max(int(bits_of(a) >> 23) - 127, emin);
  const float t = a * from_bits(uint32_t(127 + e.mbits - ex) << 23);
  // t < 2^(m + 2): nearest even by the 1.5 * 2^23 trick (the default rounding mode, no libm
  // call), floor of the non-negative t + u by truncation
  const float r = u < 0 ? (t + 0x1.8p23f) - 0x1.8p23f : float(int32_t(t + u));
  const uint32_t mag = (uint32_t(ex - emin) << e.mbits) + uint32_t(r);
  return (sign << (e.ebits + e.mbits)) | std::min(mag, max_code(e));
}

float value(uint32_t code, const Element& e) {
  const uint32_t m = code & ((1u << e.mbits) - 1);
  const int field = int((code >> e.mbits) & ((1u << e.ebits) - 1));
  const float frac = float(m) * std::ldexp(1.0f, -e.mbits);
  float mag = field > 0 ? (1.0f + frac) * std::ldexp(1.0f, field - e.bias)
                        : frac * std::ldexp(1.0f, 1 - e.bias);
  const bool top = field == (1 << e.ebits) - 1;
  if ((e.special == 1 && top && m == (1u << e.mbits) - 1) || (e.special == 2 && top && m != 0)) {
    mag = std::numeric_limits<float>::quiet_NaN();
  } else if (e.special == 2 && top) {
    mag = std::numeric_limits<float>::infinity();
  }
  return (code >> (e.bits() - 1)) ? -mag : mag;
}

float mx_scale_value(uint8_t biased) {
  if (biased == 255) return std::numeric_limits<float>::quiet_NaN();
  return std::max(from_bits(uint32_t(biased) << 23), 0x1p-126f);
}

uint8_t mx_scale(float amax, const Element& e, bool stochastic) {
  if (!std::isfinite(amax)) return 255;
  const int exp = int((bits_of(amax) >> 23) & 0xFF) - 127 - e.emax;
  int biased = std::clamp(exp, -127, 128) + 127;
  if (stochastic && biased < 254 && amax / mx_scale_value(uint8_t(biased)) > e.max) ++biased;
  return uint8_t(biased);
}

size_t mx_body_bytes(int64_t n, const Element& e, int64_t block) {
  return size_t((n + block - 1) / block) + size_t((n * e.bits() + 7) / 8);
}

namespace {

// The codes of `count` values x[i] * inv (quantize's rule, written for the vectorizer: no calls,
// no branches; `u`: the draws, or null for nearest even).
__attribute__((target_clones("avx2", "default"))) void quantize_block(const float* x, int64_t count,
                                                                      float inv, const Element& e,
                                                                      const float* u,
                                                                      uint32_t* codes) {
  const int emin = 1 - e.bias, mbits = e.mbits, shift = e.ebits + e.mbits;
  const float top = e.max;
  const uint32_t most = max_code(e);
  for (int64_t i = 0; i < count; ++i) {
    const uint32_t vb = bits_of(x[i] * inv);
    float a = from_bits(vb & 0x7FFFFFFFu);
    a = a != a ? top : (a < top ? a : top);
    int ex = int(bits_of(a) >> 23) - 127;
    ex = ex < emin ? emin : ex;
    const float t = a * from_bits(uint32_t(127 + mbits - ex) << 23);
    const float r = u ? float(int32_t(t + u[i])) : (t + 0x1.8p23f) - 0x1.8p23f;
    uint32_t mag = (uint32_t(ex - emin) << mbits) + uint32_t(int32_t(r));
    mag = mag < most ? mag : most;
    codes[i] = ((vb >> 31) << shift) | mag;
  }
}

__attribute__((target_clones("avx2", "default"))) void draws(RngKey key, int64_t lo, int64_t count,
                                                             float* u) {
  for (int64_t i = 0; i < count; ++i) u[i] = rng_uniform(key, uint64_t(lo + i));
}

// The block's largest magnitude as fp32 bits (above 0x7F800000: Inf or NaN).
uint32_t max_bits(const float* x, int64_t count) {
  uint32_t most = 0;
  for (int64_t i = 0; i < count; ++i) {
    const uint32_t b = bits_of(x[i]) & 0x7FFFFFFFu;
    most = b > most ? b : most;
  }
  return most;
}

}  // namespace

void mx_encode(const float* x, int64_t n, const Element& e, int64_t block, bool stochastic,
               RngKey key, int64_t first, int64_t last, uint8_t* out) {
  CGX_CHECK_ARG(block >= 1 && block <= 64, "MX blocks of 1..64 values, got ", block);
  const int64_t blocks = (n + block - 1) / block;
  uint8_t* stream = out + blocks;
  const int bits = e.bits();
  // Passes of whole blocks (kPass values at most): scales and scaled values block by block,
  // then the draws, the codes and the bit stream of the pass in one loop each.
  constexpr int64_t kPass = 2048;
  const int64_t per_pass = kPass / block;
  float scaled[kPass], u[kPass];
  uint32_t codes[kPass];
  for (int64_t b = first; b < last; b += per_pass) {
    const int64_t end = std::min(last, b + per_pass);
    const int64_t lo = b * block, count = std::min(n, end * block) - lo;
    for (int64_t k = b; k < end; ++k) {
      const int64_t from = k * block, size = std::min(n, from + block) - from;
      const uint32_t most = max_bits(x + from, size);
      const float amax =
          most > 0x7F800000u ? std::numeric_limits<float>::quiet_NaN() : from_bits(most);
      const uint8_t s = mx_scale(amax, e, stochastic);
      out[k] = s;
      // x / 2^j as x * 2^-j: the same rounding (the exact product, rounded once); NaN: NaN
      const float inv =
          s == 255 ? std::numeric_limits<float>::quiet_NaN() : 1.0f / mx_scale_value(s);
      for (int64_t i = 0; i < size; ++i) scaled[from - lo + i] = x[from + i] * inv;
    }
    if (stochastic) draws(key, lo, count, u);
    quantize_block(scaled, count, 1.0f, e, stochastic ? u : nullptr, codes);
    pack(codes, count, bits, stream + ((lo * bits) >> 3));
  }
}

void mx_decode(const uint8_t* body, int64_t n, const Element& e, int64_t block, int64_t first,
               int64_t last, float* out, bool add) {
  CGX_CHECK_ARG(block >= 1 && block <= 64, "MX blocks of 1..64 values, got ", block);
  const int64_t blocks = (n + block - 1) / block;
  const uint8_t* stream = body + blocks;
  const int bits = e.bits();
  float table[256];
  for (uint32_t c = 0; c < (1u << bits); ++c) table[c] = value(c, e);
  for (int64_t b = first; b < last; ++b) {
    const float scale = mx_scale_value(body[b]);
    const int64_t lo = b * block, hi = std::min(n, lo + block);
    if (add) {
      for (int64_t i = lo; i < hi; ++i) out[i] += table[unpack(stream, i, bits)] * scale;
    } else {
      for (int64_t i = lo; i < hi; ++i) out[i] = table[unpack(stream, i, bits)] * scale;
    }
  }
}

}  // namespace cgx::floats
