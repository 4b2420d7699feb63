#include "core/float_formats.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "core/clones.h"
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

#define CGX_INLINE inline __attribute__((always_inline))

// The codes of `count` values x[i] * inv (quantize's rule, written for the vectorizer: no calls,
// no branches; `u`: the draws, or null for nearest even).
CGX_INLINE void quantize_block(const float* x, int64_t count, float inv, const Element& e,
                               const float* u, uint32_t* codes) {
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

// The block's largest magnitude as fp32 bits (above 0x7F800000: Inf or NaN).
CGX_INLINE uint32_t max_bits(const float* x, int64_t count) {
  uint32_t most = 0;
  for (int64_t i = 0; i < count; ++i) {
    const uint32_t b = bits_of(x[i]) & 0x7FFFFFFFu;
    most = b > most ? b : most;
  }
  return most;
}

// `count` codes of `bits` bits as an LSB-first bit stream at out (whole bytes: count * bits is a
// multiple of 8 but for the last block, whose last byte's high bits are 0); the widths of the
// MX elements (4, 6, 8) in loops the vectorizer takes.
CGX_INLINE void pack(const uint32_t* codes, int64_t count, int bits, uint8_t* out) {
  if (bits == 8) {
    for (int64_t i = 0; i < count; ++i) out[i] = uint8_t(codes[i]);
  } else if (bits == 4) {
    const int64_t pairs = count / 2;
    for (int64_t j = 0; j < pairs; ++j) out[j] = uint8_t(codes[2 * j] | (codes[2 * j + 1] << 4));
    if (count & 1) out[pairs] = uint8_t(codes[count - 1]);
  } else if (bits == 6 && count % 4 == 0) {
    for (int64_t j = 0; j < count / 4; ++j) {
      const uint32_t w = codes[4 * j] | (codes[4 * j + 1] << 6) | (codes[4 * j + 2] << 12) |
                         (codes[4 * j + 3] << 18);
      out[3 * j] = uint8_t(w);
      out[3 * j + 1] = uint8_t(w >> 8);
      out[3 * j + 2] = uint8_t(w >> 16);
    }
  } else {
    uint64_t acc = 0;
    int have = 0;
    int64_t at = 0;
    for (int64_t i = 0; i < count; ++i) {
      acc |= uint64_t(codes[i]) << have;
      for (have += bits; have >= 8; have -= 8, acc >>= 8) out[at++] = uint8_t(acc);
    }
    if (have > 0) out[at] = uint8_t(acc);
  }
}

// One pass of whole blocks [b, end) whose values start at lo (count of them): scales, codes and
// the bit stream (`u`: the pass's draws or null).
CGX_CLONES void encode_pass(const float* x, int64_t n, const Element& e, int64_t block,
                            bool stochastic, const float* u, int64_t b, int64_t end, uint8_t* out,
                            uint8_t* stream, uint32_t* codes) {
  const int64_t lo = b * block;
  for (int64_t k = b; k < end; ++k) {
    const int64_t from = k * block, size = std::min(n, from + block) - from;
    const uint32_t most = max_bits(x + from, size);
    const float amax =
        most > 0x7F800000u ? std::numeric_limits<float>::quiet_NaN() : from_bits(most);
    const uint8_t s = mx_scale(amax, e, stochastic);
    out[k] = s;
    // x / 2^j as x * 2^-j: the same rounding (the exact product, rounded once); NaN: NaN
    const float inv = s == 255 ? std::numeric_limits<float>::quiet_NaN() : 1.0f / mx_scale_value(s);
    quantize_block(x + from, size, inv, e, u ? u + (from - lo) : nullptr, codes + (from - lo));
  }
  const int bits = e.bits();
  pack(codes, std::min(n, end * block) - lo, bits, stream + ((lo * bits) >> 3));
}

CGX_CLONES void draws(RngKey key, int64_t lo, int64_t count, float* u) {
  if (lo + count > (int64_t(1) << 32)) {
    for (int64_t i = 0; i < count; ++i) u[i] = rng_uniform(key, uint64_t(lo + i));
    return;
  }
  // indices below 2^32: rng_bits with the high word 0, in 32-bit lanes the vectorizer takes
  const uint32_t base = uint32_t(lo), k0 = key.k0, k1 = key.k1;
  for (int32_t i = 0; i < int32_t(count); ++i) {
    u[i] = float(fmix32(fmix32((base + uint32_t(i)) ^ k0) + k1) >> 8) * 0x1p-24f;
  }
}

// out[i] (+)= table[code i] * scale for the values [lo, hi) of one block.
CGX_INLINE void decode_block(const uint8_t* stream, int64_t lo, int64_t hi, int bits,
                             const float* table, float scale, float* out, bool add) {
  if (bits == 4 && lo % 2 == 0) {
    const uint8_t* in = stream + lo / 2;
    const int64_t pairs = (hi - lo) / 2;
    float* o = out + lo;
    if (add) {
      for (int64_t j = 0; j < pairs; ++j) {
        o[2 * j] += table[in[j] & 0xF] * scale;
        o[2 * j + 1] += table[in[j] >> 4] * scale;
      }
    } else {
      for (int64_t j = 0; j < pairs; ++j) {
        o[2 * j] = table[in[j] & 0xF] * scale;
        o[2 * j + 1] = table[in[j] >> 4] * scale;
      }
    }
    lo += 2 * pairs;
  } else if (bits == 6 && lo % 4 == 0) {  // 4 codes in 3 bytes
    const uint8_t* in = stream + lo / 4 * 3;
    const int64_t groups = (hi - lo) / 4;
    float* o = out + lo;
    for (int64_t j = 0; j < groups; ++j) {
      const uint32_t w =
          in[3 * j] | (uint32_t(in[3 * j + 1]) << 8) | (uint32_t(in[3 * j + 2]) << 16);
      for (int k = 0; k < 4; ++k) {
        const float v = table[(w >> (6 * k)) & 63] * scale;
        o[4 * j + k] = add ? o[4 * j + k] + v : v;
      }
    }
    lo += 4 * groups;
  } else if (bits == 8) {
    if (add) {
      for (int64_t i = lo; i < hi; ++i) out[i] += table[stream[i]] * scale;
    } else {
      for (int64_t i = lo; i < hi; ++i) out[i] = table[stream[i]] * scale;
    }
    return;
  }
  for (int64_t i = lo; i < hi; ++i) {
    const float v = table[unpack(stream, i, bits)] * scale;
    out[i] = add ? out[i] + v : v;
  }
}

CGX_CLONES void decode_blocks(const uint8_t* body, int64_t n, int bits, int64_t block,
                              int64_t first, int64_t last, const float* table, float* out,
                              bool add) {
  const int64_t blocks = (n + block - 1) / block;
  const uint8_t* stream = body + blocks;
  for (int64_t b = first; b < last; ++b) {
    const int64_t lo = b * block, hi = std::min(n, lo + block);
    decode_block(stream, lo, hi, bits, table, mx_scale_value(body[b]), out, add);
  }
}

}  // namespace

void mx_encode(const float* x, int64_t n, const Element& e, int64_t block, bool stochastic,
               RngKey key, int64_t first, int64_t last, uint8_t* out) {
  CGX_CHECK_ARG(block >= 1 && block <= 64, "MX blocks of 1..64 values, got ", block);
  const int64_t blocks = (n + block - 1) / block;
  // Passes of whole blocks (kPass values at most): the draws, then per block its scale and
  // codes, then the pass's bit stream.
  constexpr int64_t kPass = 2048;
  const int64_t per_pass = kPass / block;
  float u[kPass];
  uint32_t codes[kPass];
  for (int64_t b = first; b < last; b += per_pass) {
    const int64_t end = std::min(last, b + per_pass);
    const int64_t lo = b * block, count = std::min(n, end * block) - lo;
    if (stochastic) draws(key, lo, count, u);
    encode_pass(x, n, e, block, stochastic, stochastic ? u : nullptr, b, end, out, out + blocks,
                codes);
  }
}

void mx_decode(const uint8_t* body, int64_t n, const Element& e, int64_t block, int64_t first,
               int64_t last, float* out, bool add) {
  CGX_CHECK_ARG(block >= 1 && block <= 64, "MX blocks of 1..64 values, got ", block);
  float table[256];
  for (uint32_t c = 0; c < (1u << e.bits()); ++c) table[c] = value(c, e);
  decode_blocks(body, n, e.bits(), block, first, last, table, out, add);
}

}  // namespace cgx::floats
