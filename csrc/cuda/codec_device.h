// Per-element and per-bucket building blocks of the CUDA codec (codec_cuda.cu), written once for
// both sides: under nvcc they are __host__ __device__, under a plain C++ compiler they are
// ordinary inline functions. The CPU-only test csrc/tests/codec_cuda_logic_test.cc runs them on
// the host, in the kernels' tile / group decomposition, against the CPU codec; the kernels call
// exactly these functions, so the numerics and the bit layout are checked even where no GPU is.
//
// Bit-exactness with the CPU codec (docs/FORMAT.md):
// - every fp32 / fp64 operation is a separate IEEE round-to-nearest-even operation: on the device
//   through the __fadd_rn / __dmul_rn ... intrinsics (never contracted into FMA; the library is
//   also compiled with -fmad=false), on the host as plain operators under -ffp-contract=off;
// - fp16 / bf16 conversions are the bit-level algorithms of core/dtype.h, not the hardware ones
//   (which differ on NaN payloads);
// - the generator is the counter-based one of core/rng.h, evaluated per element index.
#pragma once

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "core/dtype.h"
#include "core/rng.h"
#include "device_scalar.h"
#include "header_error.h"

namespace cgx::cuda::dev {

// ---- stochastic-rounding generator (core/rng.h) ---------------------------------------------

using Key = RngKey;

// Uniform in [0, 1) with 24 random bits, for element `index` of the buffer: core/rng.h's, which
// is __host__ __device__ under nvcc (its one multiplication is exact: no rounding to match).
CGX_HD float uniform(Key key, uint64_t index) { return rng_uniform(key, index); }

// ---- encode: bucket range, bucket parameters, quantization, packing -----------------------

// Running min / max of a bucket and whether every element is finite. min / max of finite
// values do not depend on the order of reduction, except for the sign of a zero, which the
// format canonicalizes (docs/FORMAT.md, step 2), so any reduction tree gives the CPU's result.
struct MinMax {
  float mn;
  float mx;
  uint32_t finite;
};

CGX_HD MinMax minmax_init() { return MinMax{INFINITY, -INFINITY, 1u}; }

CGX_HD void minmax_add(MinMax& r, float v) {
  r.mn = v < r.mn ? v : r.mn;
  r.mx = v > r.mx ? v : r.mx;
  r.finite &= (as_u32(v) & 0x7f800000u) != 0x7f800000u ? 1u : 0u;
}

CGX_HD MinMax minmax_merge(MinMax a, const MinMax& b) {
  a.mn = b.mn < a.mn ? b.mn : a.mn;
  a.mx = b.mx > a.mx ? b.mx : a.mx;
  a.finite &= b.finite;
  return a;
}

enum : int32_t { kPathZero = 0, kPathF32 = 1, kPathF64 = 2 };

// What encoding one bucket needs: its metadata (mn, unit) and the quantization path.
struct BucketQuant {
  float mn;     // metadata: minimum (+0 for a zero minimum; NaN for a non-finite bucket)
  float unit;   // metadata: step (0 for a constant bucket; NaN for a non-finite bucket)
  float inv_f;  // (f32)inv, fp32 path
  int32_t path;
  double inv_d;  // L / range, fp64 path
};

// docs/FORMAT.md, "Encoding one bucket", steps 1-3.
CGX_HD BucketQuant bucket_quant(const MinMax& r, int levels) {
  BucketQuant s;
  s.mn = as_f32(0x7fc00000u);
  s.unit = as_f32(0x7fc00000u);
  s.inv_f = 0.0f;
  s.path = kPathZero;
  s.inv_d = 0.0;
  if (!r.finite) return s;
  const double range = dsub(double(r.mx), double(r.mn));
  const float unit = d2f(ddiv(range, double(levels)));
  if (!(unit <= FLT_MAX)) return s;  // 1 bit, range > FLT_MAX: the step cannot be stored
  s.mn = r.mn == 0.0f ? 0.0f : r.mn;
  s.unit = 0.0f;
  if (range > 0.0) {
    s.inv_d = ddiv(double(levels), range);
    s.unit = unit;
    s.inv_f = d2f(s.inv_d);
    s.path = (range <= double(FLT_MAX) && s.inv_d <= double(FLT_MAX)) ? kPathF32 : kPathF64;
  }
  return s;
}

// docs/FORMAT.md, step 4: the code of element `index` (value x) of a bucket.
CGX_HD uint32_t quantize(float x, const BucketQuant& s, int levels, bool stochastic, Key key,
                         uint64_t index) {
  if (s.path == kPathF32) {
    const float t = fmul(fsub(x, s.mn), s.inv_f);
    const float r = stochastic ? uniform(key, index) : 0.5f;
    const int32_t c = f2i_trunc(fadd(t, r));  // t + r >= 0: truncation is floor
    return uint32_t(c > levels ? levels : (c < 0 ? 0 : c));
  }
  if (s.path == kPathF64) {
    const double t = dmul(dsub(double(x), double(s.mn)), s.inv_d);
    const double r = stochastic ? double(uniform(key, index)) : 0.5;
    const double c = floor(dadd(t, r));
    return uint32_t(c > levels ? levels : (c < 0 ? 0 : c));
  }
  return 0;
}

// a / b for non-negative a, b, in 32 bits when both fit (64-bit division is slow on GPUs).
CGX_HD int64_t div_nonneg(int64_t a, int64_t b) {
  if (((a | b) >> 31) == 0) return int64_t(uint32_t(a) / uint32_t(b));
  return a / b;
}

// The packed codes of up to 8 consecutive elements x8[0 .. cnt): code j at bits
// [j * bits, (j + 1) * bits) of the result, codes j >= cnt are 0. `pos` is the position of x8[0]
// counted from the first element of the bucket described by stats[0]; `index` is x8[0]'s index
// in the whole buffer (the generator's counter).
CGX_HD uint64_t quantize_pack8(const float* x8, int cnt, int64_t pos, const BucketQuant* stats,
                               int64_t bucket_size, int bits, bool stochastic, Key key,
                               uint64_t index) {
  const int levels = (1 << bits) - 1;
  int64_t k = div_nonneg(pos, bucket_size);
  int64_t boundary = (k + 1) * bucket_size;
  uint64_t w = 0;
  CGX_UNROLL
  for (int j = 0; j < 8; ++j) {  // fixed trip count: x8 and the codes stay in registers
    if (j < cnt) {
      if (pos + j == boundary) {
        ++k;
        boundary += bucket_size;
      }
      w |= uint64_t(quantize(x8[j], stats[k], levels, stochastic, key, index + uint64_t(j)))
           << (j * bits);
    }
  }
  return w;
}

// ---- decode ---------------------------------------------------------------------------------

struct BucketDeq {
  float mn;
  float unit;
  bool wide;  // |mn| + L |unit| > FLT_MAX (or NaN): the fp64 path
};

CGX_HD BucketDeq bucket_deq(const uint8_t* meta, int64_t k, int levels) {
  BucketDeq d;
  d.mn = as_f32(load_u32(meta + 8 * k));
  d.unit = as_f32(load_u32(meta + 8 * k + 4));
  const double bound = dadd(fabs(double(d.mn)), dmul(double(levels), fabs(double(d.unit))));
  d.wide = !(bound <= double(FLT_MAX));
  return d;
}

CGX_HD float dequantize(uint32_t q, const BucketDeq& d) {
  if (d.wide) return d2f(dadd(double(d.mn), dmul(double(q), double(d.unit))));
  return fadd(d.mn, fmul(float(q), d.unit));
}

// Values of the up to 8 quantized elements [index, index + cnt), index a multiple of 8, from
// their packed codes w; meta is the payload's metadata section.
CGX_HD void dequant8(uint64_t w, int cnt, int64_t index, const uint8_t* meta, int64_t bucket_size,
                     int bits, float* v8) {
  const int levels = (1 << bits) - 1;
  int64_t k = div_nonneg(index, bucket_size);
  int64_t boundary = (k + 1) * bucket_size;
  BucketDeq d = bucket_deq(meta, k, levels);
  CGX_UNROLL
  for (int j = 0; j < 8; ++j) {
    if (j < cnt) {
      if (index + j == boundary) {
        ++k;
        boundary += bucket_size;
        d = bucket_deq(meta, k, levels);
      }
      v8[j] = dequantize(uint32_t(w >> (j * bits)) & uint32_t(levels), d);
    }
  }
}

// A raw-tail element (payload dtype `dt`, any alignment) as fp32.
CGX_HD float load_tail(const uint8_t* tail, DType dt, int64_t j) {
  if (dt == DType::kFloat32) return as_f32(uint32_t(load_le(tail + 4 * j, 4)));
  const uint16_t h = uint16_t(load_le(tail + 2 * j, 2));
  return dt == DType::kFloat16 ? half_to_float(h) : bf16_to_float(h);
}

// ---- header ---------------------------------------------------------------------------------

// The error flag bits are cgx::cuda::HeaderError (header_error.h).

constexpr uint8_t kFlagRawTail = 1;
constexpr uint8_t kFlagStochastic = 2;
constexpr uint8_t kFlagClipped = 4;  // informational, like kFlagStochastic

struct Header {
  uint8_t bytes[24];
};

// The 24 header bytes (docs/FORMAT.md, "Header").
inline Header make_header(DType dtype, int bits, int64_t bucket_size, bool raw_tail,
                          bool stochastic, int64_t count) {
  Header h = {};
  h.bytes[0] = 'C';
  h.bytes[1] = 'G';
  h.bytes[2] = 'X';
  h.bytes[3] = 'Q';
  h.bytes[4] = 1;
  h.bytes[5] = uint8_t(dtype);
  h.bytes[6] = uint8_t(bits);
  h.bytes[7] = uint8_t((raw_tail ? kFlagRawTail : 0) | (stochastic ? kFlagStochastic : 0));
  for (int k = 0; k < 4; ++k) h.bytes[8 + k] = uint8_t(uint64_t(bucket_size) >> (8 * k));
  for (int k = 0; k < 8; ++k) h.bytes[16 + k] = uint8_t(uint64_t(count) >> (8 * k));
  return h;
}

// Which fields of the header at `p` differ from `want` (0: none). The stochastic and clipped
// flags are informational (docs/FORMAT.md) and not compared.
CGX_HD uint32_t header_mismatch(const uint8_t* p, const Header& want) {
  const uint8_t* w = want.bytes;
  uint32_t bad = 0;
  for (int k = 0; k < 4; ++k) bad |= p[k] != w[k] ? kErrMagic : 0u;
  bad |= p[4] != w[4] ? kErrVersion : 0u;
  bad |= p[5] != w[5] ? kErrDType : 0u;
  bad |= p[6] != w[6] ? kErrBits : 0u;
  constexpr uint8_t kInfo = kFlagStochastic | kFlagClipped;
  bad |= (p[7] | kInfo) != (w[7] | kInfo) ? kErrFlags : 0u;
  for (int k = 8; k < 12; ++k) bad |= p[k] != w[k] ? kErrBucketSize : 0u;
  for (int k = 12; k < 16; ++k) bad |= p[k] != 0 ? kErrReserved : 0u;
  for (int k = 16; k < 24; ++k) bad |= p[k] != w[k] ? kErrCount : 0u;
  return bad;
}

// ---- work decomposition of the encoder -------------------------------------------------------

constexpr int kTileElems = 4096;   // elements staged in shared memory per tile
constexpr int kTileBuckets = 512;  // bucket parameters held in shared memory per tile

// The encoder cuts the quantized elements into tiles of whole buckets, each starting at an
// element index that is a multiple of 8, so that each tile's codes start on a byte boundary and
// no two blocks write the same byte. A chunk of lcm(bucket_size, 8) elements is the smallest such
// unit. Staged tiles (chunk <= kTileElems) are several chunks, loaded once into shared memory;
// otherwise a tile is one chunk (at most 8 buckets), read from global memory twice.
struct TilePlan {
  int64_t tile;  // elements per tile (the last tile may be shorter)
  bool staged;
};

inline TilePlan plan_tiles(int64_t bucket_size) {
  int64_t g = 8;
  for (int64_t a = bucket_size % 8; a != 0;) {  // gcd(bucket_size, 8)
    const int64_t t = g % a;
    g = a;
    a = t;
  }
  const int64_t chunk = bucket_size * (8 / g);
  if (chunk > kTileElems) return TilePlan{chunk, false};
  int64_t m = kTileElems / chunk;
  const int64_t max_by_buckets = kTileBuckets / (chunk / bucket_size);
  if (m > max_by_buckets) m = max_by_buckets;
  return TilePlan{m * chunk, true};
}

}  // namespace cgx::cuda::dev
