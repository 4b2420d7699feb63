// Building blocks of the fused level-quantizer and sign kernels (levels_cuda.cu: qsgd, terngrad
// and tbq, the prim::Levels rule of csrc/core/primitives.h; onebit and efsignsgd, per bucket;
// signsgd and signum, with tbq the kinds without bucket scalars, whose non-finite input sets the
// envelope's flag bit 0 instead), written once for both sides like codec_device.h:
// __host__ __device__ under nvcc, plain inline functions elsewhere. The CPU-only test
// csrc/tests/levels_cuda_logic_test.cc drives them in the kernels' decomposition (eight lanes
// per bucket, an xor butterfly over the lanes, groups of eight codes) against the native
// compressors' bytes and values.
//
// Bit-exactness with the native compressors (docs/FORMAT.md, "Compressor payloads"):
// - the bucket sums are prim::stats' eight fp64 lanes (element lo + 8q + j in lane j, each lane
//   summed in element order), the lanes added as ((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 +
//   l7)), which an xor butterfly over eight threads with offsets 1, 2, 4 computes exactly (IEEE
//   addition is commutative);
// - max |x| is order-free (min / max of the lanes, NaN ignored and reported);
// - every fp32 / fp64 operation is one IEEE round-to-nearest operation (device_scalar.h);
// - the uniforms are core/rng.h's, per global element index.
#pragma once

#include <cmath>
#include <cstdint>

#include "core/dtype.h"
#include "core/rng.h"
#include "device_scalar.h"

namespace cgx::cuda::lv {

using dev::as_f32;
using dev::as_u32;

// qsgd and terngrad (level codes); onebit and efsignsgd (one sign bit per value, 1 = x < 0);
// then the kinds without bucket scalars: signsgd and signum (sign bits), tbq (level codes of a
// fixed threshold).
enum Kind : int32_t {
  kQsgd = 0,
  kTernGrad = 1,
  kOneBit = 2,
  kEFSign = 3,
  kSignSGD = 4,
  kSignum = 5,
  kTbq = 6
};

CGX_HD bool has_buckets(int32_t kind) { return kind <= kEFSign; }
CGX_HD bool sign_codes(int32_t kind) { return kind >= kOneBit && kind != kTbq; }

constexpr int kLanes = 8;

#ifdef __CUDA_ARCH__
CGX_HD float fdiv(float a, float b) { return __fdiv_rn(a, b); }
CGX_HD double dsqrt(double a) { return __dsqrt_rn(a); }
CGX_HD float ffloor(float a) { return floorf(a); }
#else
CGX_HD float fdiv(float a, float b) { return a / b; }
CGX_HD double dsqrt(double a) { return std::sqrt(a); }
CGX_HD float ffloor(float a) { return std::floor(a); }
#endif

CGX_HD bool is_nan(float v) { return (as_u32(v) & 0x7fffffffu) > 0x7f800000u; }
CGX_HD bool is_finite(float v) { return (as_u32(v) & 0x7f800000u) != 0x7f800000u; }
CGX_HD float abs_f(float v) { return as_f32(as_u32(v) & 0x7fffffffu); }

// What one encode or decode needs (the compressor's parameters and the payload's layout).
struct Params {
  int32_t kind = kQsgd;
  int32_t bits = 2;       // code width: qsgd's bits, terngrad and tbq 2, the sign kinds 1
  int32_t scalars = 1;    // f32 per bucket: onebit 2, signsgd / signum / tbq 0, the others 1
  int32_t levels = 1;     // qsgd: 2^(bits-1) - 1; terngrad, tbq: 1
  uint32_t neg_add = 1;   // qsgd: 2^(bits-1); terngrad, tbq: 1
  float clip = 0.0f;      // terngrad's clip factor (0: off); tbq's tau
  int64_t count = 0;      // n
  int64_t bucket = 1;     // effective bucket size (>= 1)
  int64_t buckets = 0;    // nb (0 for the kinds without bucket scalars)
  uint64_t codes_offset;  // bytes of the scalars: 4 scalars nb
  uint64_t body = 0;      // body bytes
  RngKey key;
};

// bucketed::layout for one f32 scalar per bucket; bucket_size 0: the whole tensor. `clip`:
// terngrad's clip, tbq's tau (ignored otherwise); `bucket_size` is ignored by the kinds without
// bucket scalars.
CGX_HD Params make_params(int32_t kind, int32_t bits, float clip, int64_t count,
                          int64_t bucket_size, uint64_t seed, uint64_t stream) {
  Params p;
  p.kind = kind;
  p.bits = kind == kQsgd ? bits : (kind == kTernGrad || kind == kTbq ? 2 : 1);
  p.scalars = kind == kOneBit ? 2 : (has_buckets(kind) ? 1 : 0);
  p.levels = kind == kQsgd ? (1 << (bits - 1)) - 1 : 1;
  p.neg_add = kind == kQsgd ? (1u << (bits - 1)) : 1u;
  p.clip = kind == kTernGrad || kind == kTbq ? clip : 0.0f;
  p.count = count;
  p.bucket = bucket_size == 0 || !has_buckets(kind) ? (count > 1 ? count : 1) : bucket_size;
  p.buckets = has_buckets(kind) ? (count + p.bucket - 1) / p.bucket : 0;
  p.codes_offset = uint64_t(p.buckets) * 4u * uint64_t(p.scalars);
  p.body = p.codes_offset + uint64_t((count * p.bits + 7) / 8);
  p.key = rng_key(seed, stream);
  return p;
}

// The compressor id of the envelope: qsgd 13, terngrad 12, onebit 10, efsignsgd 11, signsgd 3,
// signum 4, tbq 14 (csrc/compressors/list.h).
CGX_HD uint8_t compressor_id(int32_t kind) {
  const uint8_t ids[7] = {13, 12, 10, 11, 3, 4, 14};
  return ids[kind];
}

// The 32-byte envelope (flags 0: the codes pass ORs in the non-finite flag of the kinds without
// bucket scalars; param0 the bucket size of the bucketed kinds, else 0; param1 qsgd's bits,
// terngrad's clip bits, tbq's tau bits, else 0).
CGX_HD void write_envelope(const Params& p, int dtype_code, uint32_t bucket_size, uint8_t* out) {
  const uint8_t head[8] = {'C', 'G', 'X', 'C', 1, uint8_t(dtype_code), compressor_id(p.kind), 0};
  for (int k = 0; k < 8; ++k) out[k] = head[k];
  const uint64_t count = uint64_t(p.count), body = p.body;
  const uint32_t param0 = has_buckets(p.kind) ? bucket_size : 0u;
  const uint32_t param1 = p.kind == kQsgd                           ? uint32_t(p.bits)
                          : (p.kind == kTernGrad || p.kind == kTbq) ? as_u32(p.clip)
                                                                    : 0u;
  for (int k = 0; k < 8; ++k) out[8 + k] = uint8_t(count >> (8 * k));
  for (int k = 0; k < 8; ++k) out[16 + k] = uint8_t(body >> (8 * k));
  for (int k = 0; k < 4; ++k) out[24 + k] = uint8_t(param0 >> (8 * k));
  for (int k = 0; k < 4; ++k) out[28 + k] = uint8_t(param1 >> (8 * k));
}

// ---- the bucket scalar ----------------------------------------------------------------------

// One lane of a bucket (prim::detail::StatLanes' fields): fp64 sums of x, |x| and x^2 in element
// order, the count of negatives, min / max ignoring NaN.
struct Lane {
  double sum, abs, sq;
  int64_t neg;
  float mn, mx;
  uint32_t nan;
};

CGX_HD Lane lane_init() { return Lane{0.0, 0.0, 0.0, 0, INFINITY, -INFINITY, 0u}; }

CGX_HD void lane_add(Lane& l, float v) {
  l.nan |= is_nan(v) ? 1u : 0u;
  l.mn = v < l.mn ? v : l.mn;
  l.mx = v > l.mx ? v : l.mx;
  const double d = double(v);
  l.sum = dev::dadd(l.sum, d);
  l.abs = dev::dadd(l.abs, double(abs_f(v)));  // fabs, exactly
  l.sq = dev::dadd(l.sq, dev::dmul(d, d));
  l.neg += v < 0.0f ? 1 : 0;
}

// Two lanes of one butterfly step: sums added (the order is symmetric), min / max merged.
CGX_HD Lane lane_merge(const Lane& a, const Lane& b) {
  Lane r;
  r.sum = dev::dadd(a.sum, b.sum);
  r.abs = dev::dadd(a.abs, b.abs);
  r.sq = dev::dadd(a.sq, b.sq);
  r.neg = a.neg + b.neg;
  r.mn = b.mn < a.mn ? b.mn : a.mn;
  r.mx = b.mx > a.mx ? b.mx : a.mx;
  r.nan = a.nan | b.nan;
  return r;
}

// The bucket's f32 scalars (p.scalars of them) from its merged lanes and length: qsgd's l2 norm;
// terngrad's scale (max |x|, or min(max |x|, clip * sqrt(mean x^2))); onebit's (mean of the
// negatives, mean of the non-negatives) from (sum -+ sum |x|) / 2, 0 for a kind not present;
// efsignsgd's sum |x| / length. NaN for a bucket holding NaN or Inf.
struct Scalars {
  float s0, s1;  // s1: onebit's second scalar only
};

CGX_HD Scalars bucket_scalars(const Params& p, const Lane& all, int64_t length) {
  const float qnan = as_f32(0x7fc00000u);
  const bool finite = !all.nan && is_finite(all.mn) && is_finite(all.mx);
  Scalars out{qnan, qnan};
  if (!finite) return out;
  if (p.kind == kQsgd) {
    out.s0 = dev::d2f(dsqrt(all.sq));
  } else if (p.kind == kTernGrad) {
    const float amn = abs_f(all.mn), amx = abs_f(all.mx);
    const float abs_max = amn < amx ? amx : amn;  // std::max(|mn|, |mx|)
    out.s0 = abs_max;
    if (p.clip > 0.0f) {
      const double sigma = dsqrt(dev::ddiv(all.sq, double(length)));
      const float c = dev::d2f(dev::dmul(double(p.clip), sigma));
      out.s0 = c < abs_max ? c : abs_max;  // std::min(abs_max, c)
    }
  } else if (p.kind == kOneBit) {
    const double neg = dev::ddiv(dev::dsub(all.sum, all.abs), 2.0);
    const double pos = dev::ddiv(dev::dadd(all.sum, all.abs), 2.0);
    const int64_t npos = length - all.neg;
    out.s0 = all.neg ? dev::d2f(dev::ddiv(neg, double(all.neg))) : 0.0f;
    out.s1 = npos ? dev::d2f(dev::ddiv(pos, double(npos))) : 0.0f;
  } else {
    out.s0 = dev::d2f(dev::ddiv(all.abs, double(length)));
  }
  return out;
}

// ---- per element ------------------------------------------------------------------------------

// prim::Levels' code of element `index` (value x) in a bucket of scalar s (zero unless s is
// finite and positive; tbq: s = tau, no clip, no uniform).
CGX_HD uint32_t level_code(const Params& p, float s, float x, uint64_t index) {
  if (sign_codes(p.kind)) return x < 0.0f ? 1u : 0u;  // 1 = negative (NaN: 0)
  if (!(is_finite(s) && s > 0.0f)) return 0u;
  const float clip = p.kind == kTernGrad ? s : INFINITY;
  float a = abs_f(x);
  a = a < clip ? a : clip;
  const float num = float(p.levels);
  const float u = p.kind == kTbq ? 0.0f : rng_uniform(p.key, index);
  const float f = ffloor(dev::fadd(fdiv(dev::fmul(num, a), s), u));
  const float l = f < num ? f : num;
  return uint32_t(l) + ((x < 0.0f && l > 0.0f) ? p.neg_add : 0u);
}

// Scalar k of element i's bucket, read from the payload's scalars (4-byte aligned there).
CGX_HD float scalar_of(const Params& p, const uint8_t* scalars, int64_t i, int k = 0) {
  return as_f32(dev::load_u32(scalars + 4 * (int64_t(p.scalars) * (i / p.bucket) + k)));
}

// The packed bytes of group g (elements 8g .. 8g + 7 that exist; code k at bits [k*bits,
// (k+1)*bits)), the scalars read from the payload and element i's value from load(i);
// `nonfinite` becomes true when one of the group's values is NaN or Inf.
template <typename Load>
CGX_HD uint64_t group_codes(const Params& p, const uint8_t* scalars, int64_t g, Load&& load,
                            bool& nonfinite) {
  const int64_t cnt = p.count - 8 * g < 8 ? p.count - 8 * g : 8;
  uint64_t w = 0;
  for (int k = 0; k < int(cnt); ++k) {
    const int64_t i = 8 * g + k;
    const float x = load(i);
    const float s = p.kind == kTbq ? p.clip : sign_codes(p.kind) ? 0.0f : scalar_of(p, scalars, i);
    nonfinite |= !is_finite(x);
    const uint32_t c = level_code(p, s, x, uint64_t(i));
    w |= uint64_t(c) << (k * p.bits);
  }
  return w;
}

// The envelope's flag bit 0 as the word the codes pass ORs into the payload's bytes 4..7
// (little-endian: byte 7 is the word's top byte); the kinds without bucket scalars only.
constexpr uint32_t kNonFiniteWord = 1u << 24;

// Bytes of group g (elements 8g .. 8g + 7) in the code stream: `bits` for a full group.
CGX_HD int group_bytes(const Params& p, int64_t g) {
  const int64_t cnt = p.count - 8 * g < 8 ? p.count - 8 * g : 8;
  return cnt == 8 ? p.bits : int((cnt * p.bits + 7) / 8);
}

// The value code c decodes to in a bucket of scalar s (qsgd: norm * l / levels with the sign
// bit; terngrad and tbq: 0, +s, -s, NaN for 3 and a NaN scale's 0).
CGX_HD float code_value(const Params& p, float s, uint32_t c) {
  if (p.kind == kQsgd) {
    const float mag = dev::fmul(s, fdiv(float(c & (p.neg_add - 1u)), float(p.levels)));
    return (c & p.neg_add) ? -mag : mag;
  }
  const float qnan = as_f32(0x7fc00000u);
  if (c == 0u) return is_nan(s) ? qnan : 0.0f;
  if (c == 1u) return s;
  if (c == 2u) return -s;
  return qnan;
}

// Code i of the stream.
CGX_HD uint32_t code_at(const uint8_t* codes, int64_t i, int bits) {
  const int64_t bit = i * bits;
  uint32_t two = codes[bit >> 3];
  if (((bit & 7) + bits) > 8) two |= uint32_t(codes[(bit >> 3) + 1]) << 8;
  return (two >> (bit & 7)) & ((1u << bits) - 1u);
}

// The decoded value of element i of a payload (envelope, scalars, then the code stream); the
// sign kinds: onebit's bit selects (negatives' mean, non-negatives' mean), efsignsgd's -s or +s,
// signsgd's -1 or +1; tbq's codes decode with the envelope's tau; with the envelope's flag bit 0
// signsgd, signum and tbq decode to NaN.
CGX_HD float element_value(const Params& p, const uint8_t* payload, int64_t i) {
  const uint8_t* body = payload + 32;
  const uint32_t c = code_at(body + p.codes_offset, i, p.bits);
  if (!has_buckets(p.kind) && (payload[7] & 1u)) return as_f32(0x7fc00000u);
  if (p.kind == kSignSGD || p.kind == kSignum) return c ? -1.0f : 1.0f;
  if (p.kind == kTbq) return code_value(p, as_f32(dev::load_u32(payload + 28)), c);
  if (p.kind == kOneBit) return scalar_of(p, body, i, c ? 0 : 1);
  const float s = scalar_of(p, body, i);
  if (p.kind == kEFSign) return c ? -s : s;
  return code_value(p, s, c);
}

// out = value (add: fp32 out + value, rounded once to out's type), core/dtype.h's conversions.
template <DType D>
CGX_HD void put(typename dev::ElemIO<D>::Raw* out, int64_t i, float v, bool add) {
  using IO = dev::ElemIO<D>;
  if (add) v = dev::fadd(IO::to_float(out[i]), v);
  out[i] = IO::from_float(v);
}

}  // namespace cgx::cuda::lv
