// Element types the codec reads and writes, and exact scalar conversions between them.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

namespace cgx {

enum class DType : uint8_t { kFloat32 = 0, kFloat16 = 1, kBFloat16 = 2 };

constexpr int kNumDTypes = 3;

inline size_t elem_size(DType t) { return t == DType::kFloat32 ? 4 : 2; }

inline const char* dtype_name(DType t) {
  switch (t) {
    case DType::kFloat32:
      return "float32";
    case DType::kFloat16:
      return "float16";
    case DType::kBFloat16:
      return "bfloat16";
  }
  return "unknown";
}

inline uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

inline float bits_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline float bf16_to_float(uint16_t h) { return bits_float(uint32_t(h) << 16); }

// Round to nearest even; NaN stays NaN (quiet).
inline uint16_t float_to_bf16(float f) {
  uint32_t u = float_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40u);
  return uint16_t((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

inline float half_to_float(uint16_t h) {
  uint32_t sign = uint32_t(h & 0x8000u) << 16;
  uint32_t em = h & 0x7fffu;
  uint32_t exp = em & 0x7c00u;
  uint32_t out;
  if (exp == 0) {
    out = float_bits(float(em) * 0x1p-24f);  // zero or subnormal: exact
  } else if (exp == 0x7c00u) {
    out = (em << 13) + (224u << 23);  // Inf / NaN, quieted as F16C's conversion does
    if (em != 0x7c00u) out |= 0x400000u;
  } else {
    out = (em << 13) + (112u << 23);
  }
  return bits_float(out | sign);
}

// Round to nearest even; overflow gives Inf, NaN stays NaN.
inline uint16_t float_to_half(float f) {
  uint32_t u = float_bits(f);
  uint16_t sign = uint16_t((u >> 16) & 0x8000u);
  u &= 0x7fffffffu;
  if (u >= 0x7f800000u) {
    return uint16_t(sign | 0x7c00u | (u > 0x7f800000u ? 0x200u | ((u >> 13) & 0x3ffu) : 0u));
  }
  if (u >= 0x477ff000u) return uint16_t(sign | 0x7c00u);  // >= 65520 rounds to Inf
  if (u < 0x38800000u) {                                  // below 2^-14: subnormal half
    return uint16_t(sign | uint16_t(std::nearbyint(bits_float(u) * 0x1p24f)));
  }
  u += 0xc8000fffu + ((u >> 13) & 1u);  // rebias exponent, round to nearest even
  return uint16_t(sign | (u >> 13));
}

// Element i of p, as float. p may be unaligned (values inside a received payload sit at any
// byte offset): the loads and stores go through memcpy, which compiles to a plain move.
inline float load_as_float(const void* p, DType t, int64_t i) {
  const auto* b = static_cast<const uint8_t*>(p);
  if (t == DType::kFloat32) {
    float f;
    std::memcpy(&f, b + 4 * i, 4);
    return f;
  }
  uint16_t h;
  std::memcpy(&h, b + 2 * i, 2);
  return t == DType::kFloat16 ? half_to_float(h) : bf16_to_float(h);
}

inline void store_from_float(void* p, DType t, int64_t i, float v) {
  auto* b = static_cast<uint8_t*>(p);
  if (t == DType::kFloat32) {
    std::memcpy(b + 4 * i, &v, 4);
    return;
  }
  const uint16_t h = t == DType::kFloat16 ? float_to_half(v) : float_to_bf16(v);
  std::memcpy(b + 2 * i, &h, 2);
}

}  // namespace cgx
