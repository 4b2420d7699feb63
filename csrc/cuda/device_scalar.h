// Scalar numerics of the CUDA codec (codec_device.h), for both sides: bit casts, single-rounding
// IEEE arithmetic (the __fadd_rn ... intrinsics on the device, plain operators under
// -ffp-contract=off on the host), the fp16 / bf16 conversions of core/dtype.h written for the
// device, and little-endian byte access at any alignment.
#pragma once

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "core/dtype.h"

#ifdef __CUDACC__
#define CGX_HD __host__ __device__ __forceinline__
#else
#define CGX_HD inline
#endif
#ifdef __CUDA_ARCH__
#define CGX_UNROLL _Pragma("unroll")
#else
#define CGX_UNROLL
#endif

namespace cgx::cuda::dev {

// ---- bit casts and single-rounding arithmetic ---------------------------------------------

CGX_HD uint32_t as_u32(float f) {
#ifdef __CUDA_ARCH__
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
#endif
}

CGX_HD float as_f32(uint32_t u) {
#ifdef __CUDA_ARCH__
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, 4);
  return f;
#endif
}

#ifdef __CUDA_ARCH__
CGX_HD float fadd(float a, float b) { return __fadd_rn(a, b); }
CGX_HD float fsub(float a, float b) { return __fsub_rn(a, b); }
CGX_HD float fmul(float a, float b) { return __fmul_rn(a, b); }
CGX_HD double dadd(double a, double b) { return __dadd_rn(a, b); }
CGX_HD double dsub(double a, double b) { return __dsub_rn(a, b); }
CGX_HD double dmul(double a, double b) { return __dmul_rn(a, b); }
CGX_HD double ddiv(double a, double b) { return __ddiv_rn(a, b); }
CGX_HD float d2f(double a) { return __double2float_rn(a); }
CGX_HD int32_t f2i_trunc(float a) { return __float2int_rz(a); }
CGX_HD float round_even(float a) { return rintf(a); }
#else
CGX_HD float fadd(float a, float b) { return a + b; }
CGX_HD float fsub(float a, float b) { return a - b; }
CGX_HD float fmul(float a, float b) { return a * b; }
CGX_HD double dadd(double a, double b) { return a + b; }
CGX_HD double dsub(double a, double b) { return a - b; }
CGX_HD double dmul(double a, double b) { return a * b; }
CGX_HD double ddiv(double a, double b) { return a / b; }
CGX_HD float d2f(double a) { return float(a); }
CGX_HD int32_t f2i_trunc(float a) { return int32_t(a); }
CGX_HD float round_even(float a) { return std::nearbyint(a); }
#endif

// ---- element types (the algorithms of core/dtype.h) ----------------------------------------

CGX_HD float bf16_to_float(uint16_t h) { return as_f32(uint32_t(h) << 16); }

CGX_HD uint16_t float_to_bf16(float f) {
  const uint32_t u = as_u32(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40u);
  return uint16_t((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

CGX_HD float half_to_float(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  const uint32_t em = h & 0x7fffu;
  const uint32_t exp = em & 0x7c00u;
  uint32_t out;
  if (exp == 0) {
    out = as_u32(fmul(float(em), 0x1p-24f));  // zero or subnormal: exact
  } else if (exp == 0x7c00u) {
    out = (em << 13) + (224u << 23);  // Inf / NaN, quieted (csrc/core/dtype.h's rule)
    if (em != 0x7c00u) out |= 0x400000u;
  } else {
    out = (em << 13) + (112u << 23);
  }
  return as_f32(out | sign);
}

CGX_HD uint16_t float_to_half(float f) {
  uint32_t u = as_u32(f);
  const uint16_t sign = uint16_t((u >> 16) & 0x8000u);
  u &= 0x7fffffffu;
  if (u >= 0x7f800000u) {
    return uint16_t(sign | 0x7c00u | (u > 0x7f800000u ? 0x200u | ((u >> 13) & 0x3ffu) : 0u));
  }
  if (u >= 0x477ff000u) return uint16_t(sign | 0x7c00u);  // >= 65520 rounds to Inf
  if (u < 0x38800000u) {                                  // below 2^-14: subnormal half
    return uint16_t(sign | uint16_t(round_even(fmul(as_f32(u), 0x1p24f))));
  }
  u += 0xc8000fffu + ((u >> 13) & 1u);  // rebias exponent, round to nearest even
  return uint16_t(sign | (u >> 13));
}

template <DType D>
struct ElemIO;

template <>
struct ElemIO<DType::kFloat32> {
  using Raw = float;
  static CGX_HD float to_float(Raw v) { return v; }
  static CGX_HD Raw from_float(float v) { return v; }
};

template <>
struct ElemIO<DType::kFloat16> {
  using Raw = uint16_t;
  static CGX_HD float to_float(Raw v) { return half_to_float(v); }
  static CGX_HD Raw from_float(float v) { return float_to_half(v); }
};

template <>
struct ElemIO<DType::kBFloat16> {
  using Raw = uint16_t;
  static CGX_HD float to_float(Raw v) { return bf16_to_float(v); }
  static CGX_HD Raw from_float(float v) { return float_to_bf16(v); }
};

// ---- little-endian byte access at any alignment ---------------------------------------------

CGX_HD uint64_t load_le(const uint8_t* p, int nbytes) {
  uint64_t w = 0;
  for (int k = 0; k < nbytes; ++k) w |= uint64_t(p[k]) << (8 * k);
  return w;
}

CGX_HD uint32_t load_u32(const uint8_t* p) {
#ifdef __CUDA_ARCH__
  if ((reinterpret_cast<uintptr_t>(p) & 3u) == 0) return *reinterpret_cast<const uint32_t*>(p);
#endif
  return uint32_t(load_le(p, 4));
}

CGX_HD void store_u32(uint8_t* p, uint32_t v) {
#ifdef __CUDA_ARCH__
  if ((reinterpret_cast<uintptr_t>(p) & 3u) == 0) {
    *reinterpret_cast<uint32_t*>(p) = v;
    return;
  }
#endif
  for (int k = 0; k < 4; ++k) p[k] = uint8_t(v >> (8 * k));
}

}  // namespace cgx::cuda::dev
