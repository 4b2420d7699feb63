// AVX-512 version of the stochastic level rule (prim::Levels), where the CPU has it: the
// counter-based generator's four 32-bit multiplies per value dominate qsgd / terngrad encoding,
// and 16 lanes halve their cost. Same bytes as the scalar rule (primitives_lanes.h).
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "primitives.h"
#include "primitives_lanes.h"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#include <immintrin.h>
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512dq")
// GCC 12's AVX-512 intrinsics start from _mm512_undefined_*, which -Wmaybe-uninitialized reports
// at -O3 (GCC bug 105593, fixed in GCC 13): not a defect of this file.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace cgx::prim::avx512 {
namespace {

__m512i fmix32(__m512i h) {
  h = _mm512_xor_si512(h, _mm512_srli_epi32(h, 16));
  h = _mm512_mullo_epi32(h, _mm512_set1_epi32(int(0x85ebca6bu)));
  h = _mm512_xor_si512(h, _mm512_srli_epi32(h, 13));
  h = _mm512_mullo_epi32(h, _mm512_set1_epi32(int(0xc2b2ae35u)));
  return _mm512_xor_si512(h, _mm512_srli_epi32(h, 16));
}

// rng_uniform(key, index + j) for j in [0, 16); the low 32 bits of index must not wrap.
__m512 uniform16(RngKey key, uint64_t index) {
  const uint32_t hi_term = key.k1 ^ (uint32_t(index >> 32) * 0x9e3779b1u);
  const __m512i lo =
      _mm512_add_epi32(_mm512_set1_epi32(int(uint32_t(index))),
                       _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
  __m512i r = fmix32(_mm512_xor_si512(lo, _mm512_set1_epi32(int(key.k0))));
  r = fmix32(_mm512_add_epi32(r, _mm512_set1_epi32(int(hi_term))));
  return _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_srli_epi32(r, 8)), _mm512_set1_ps(0x1p-24f));
}

}  // namespace

// The rule as written (primitives_lanes.h), 16 values at a time: for the ranges that
// stochastic_levels_f32's fast form does not cover.
int64_t plain_levels(const float* x, int64_t begin, int64_t end, const Levels& q, uint8_t* codes,
                     bool* bad) {
  const __m512 clip = _mm512_set1_ps(q.clip), num = _mm512_set1_ps(q.num);
  const __m512 den = _mm512_set1_ps(q.den), levels = _mm512_set1_ps(float(q.levels));
  const __m512 zero = _mm512_setzero_ps(), inf = _mm512_set1_ps(INFINITY);
  const __m512i neg_add = _mm512_set1_epi32(int(q.neg_add));
  const RngKey key = q.key;
  const int64_t ahead = q.ahead;
  __mmask16 nonfinite = 0;
  int64_t i = begin;
  for (; i + 16 <= end; i += 16) {
    if ((uint64_t(i) & 0xffffffffu) > 0xfffffff0u) break;  // the generator's counter wraps
    _mm_prefetch(reinterpret_cast<const char*>(x + i + ahead), _MM_HINT_T0);
    const __m512 v = _mm512_loadu_ps(x + i);
    const __m512 abs = _mm512_abs_ps(v);
    nonfinite |= _mm512_cmp_ps_mask(abs, inf, _CMP_NLT_UQ);
    const __m512 a = _mm512_min_ps(abs, clip);
    const __m512 t = _mm512_add_ps(_mm512_div_ps(_mm512_mul_ps(num, a), den), uniform16(key, i));
    const __m512 l = _mm512_min_ps(_mm512_roundscale_ps(t, _MM_FROUND_TO_NEG_INF), levels);
    const __mmask16 neg =
        _mm512_cmp_ps_mask(v, zero, _CMP_LT_OQ) & _mm512_cmp_ps_mask(l, zero, _CMP_GT_OQ);
    const __m512i code =
        _mm512_mask_add_epi32(_mm512_cvttps_epi32(l), neg, _mm512_cvttps_epi32(l), neg_add);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(codes + (i - begin)), _mm512_cvtepi32_epi8(code));
  }
  *bad |= nonfinite != 0;
  return i;
}

// The vector ports bound this kernel (two for 512-bit operations), so it spends as few
// operations per value as it can, with the rule's bytes:
// - scaled by 2^24: with num' = num * 2^24, t' = (num' * a) / den is t * 2^24 and t' + k (k the
//   generator's 24 bits as an integer) is (t + u) * 2^24, every rounding the same (powers of two,
//   no overflow or underflow in the ranges below); min(t' + k, levels * 2^24) truncated to an
//   integer and shifted right by 24 is then min(floor(t + u), levels), without a floor or a
//   multiply by 2^-24. A value whose t would underflow gives 0 on both ways (t < 2^-50: t + u
//   rounds to u or is t).
// - a clipped at a_max, where every a >= a_max gives `levels` both ways (t >= levels + 3);
//   a_max * num' stays finite.
// - the generator's first step, h ^ (h >> 16) of h = lo ^ k0, is lo ^ (k0 ^ k0 >> 16 ^ lo >> 16),
//   one XOR where lo >> 16 is the same over the vector (all but one vector in 65536).
// - non-finite inputs by the largest |x|'s bits (an unsigned max).
int64_t stochastic_levels_f32(const float* x, int64_t begin, int64_t end, const Levels& q,
                              uint8_t* codes, bool* bad) {
  // Where the argument above holds: den in [2^-70, 2^90], num in [2^-20, 2^20], clip >= 0.
  if (!(q.den >= 0x1p-70f && q.den <= 0x1p90f && q.num >= 0x1p-20f && q.num <= 0x1p20f &&
        q.clip >= 0 && q.levels >= 1 && q.levels <= 255)) {
    return plain_levels(x, begin, end, q, codes, bad);
  }
  const float a_max = float(double(q.den) * double(q.levels + 4) / double(q.num));
  const __m512 clip = _mm512_set1_ps(std::min(q.clip, a_max));
  const __m512 num = _mm512_set1_ps(q.num * 0x1p24f);
  const __m512 den = _mm512_set1_ps(q.den);
  const __m512 top = _mm512_set1_ps(float(q.levels) * 0x1p24f);
  const __m512 zero = _mm512_setzero_ps();
  const __m512i neg_add = _mm512_set1_epi32(int(q.neg_add));
  const __m512i c1 = _mm512_set1_epi32(int(0x85ebca6bu)), c2 = _mm512_set1_epi32(int(0xc2b2ae35u));
  const __m512i iota = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  const RngKey key = q.key;  // locals: the byte stores below may alias q
  const int64_t ahead = q.ahead;
  __m512i lo, seg, hi_term;  // lanes' low index bits; k0 ^ k0 >> 16 ^ lo >> 16; fmix's addend
  __m512i abs_bits = _mm512_setzero_si512();
  auto step = [&](int64_t i, bool one_segment) {
    _mm_prefetch(reinterpret_cast<const char*>(x + i + ahead), _MM_HINT_T0);
    const __m512 v = _mm512_loadu_ps(x + i);
    const __m512 abs = _mm512_abs_ps(v);
    abs_bits = _mm512_max_epu32(abs_bits, _mm512_castps_si512(abs));
    const __m512 t = _mm512_div_ps(_mm512_mul_ps(num, _mm512_min_ps(abs, clip)), den);
    __m512i h;
    if (one_segment) {
      h = _mm512_xor_si512(lo, seg);
    } else {
      h = _mm512_xor_si512(lo, _mm512_set1_epi32(int(key.k0)));
      h = _mm512_xor_si512(h, _mm512_srli_epi32(h, 16));
    }
    lo = _mm512_add_epi32(lo, _mm512_set1_epi32(16));
    h = _mm512_mullo_epi32(h, c1);
    h = _mm512_xor_si512(h, _mm512_srli_epi32(h, 13));
    h = _mm512_mullo_epi32(h, c2);
    h = _mm512_xor_si512(h, _mm512_srli_epi32(h, 16));
    h = _mm512_add_epi32(h, hi_term);
    h = _mm512_xor_si512(h, _mm512_srli_epi32(h, 16));
    h = _mm512_mullo_epi32(h, c1);
    h = _mm512_xor_si512(h, _mm512_srli_epi32(h, 13));
    h = _mm512_mullo_epi32(h, c2);
    h = _mm512_xor_si512(h, _mm512_srli_epi32(h, 16));
    const __m512 k = _mm512_cvtepi32_ps(_mm512_srli_epi32(h, 8));
    const __m512 s = _mm512_min_ps(_mm512_add_ps(t, k), top);
    const __m512i l = _mm512_srli_epi32(_mm512_cvttps_epu32(s), 24);
    const __mmask16 neg =
        _mm512_mask_cmp_ps_mask(_mm512_test_epi32_mask(l, l), v, zero, _CMP_LT_OQ);
    const __m512i code = _mm512_mask_add_epi32(l, neg, l, neg_add);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(codes + (i - begin)), _mm512_cvtepi32_epi8(code));
  };
  int64_t i = begin;
  while (i + 16 <= end && (uint64_t(i) & 0xffffffffu) <= 0xfffffff0u) {  // else the counter wraps
    const uint32_t low = uint32_t(uint64_t(i));
    lo = _mm512_add_epi32(_mm512_set1_epi32(int(low)), iota);
    seg = _mm512_set1_epi32(int(key.k0 ^ (key.k0 >> 16) ^ (low >> 16)));
    hi_term = _mm512_set1_epi32(int(key.k1 ^ (uint32_t(uint64_t(i) >> 32) * 0x9e3779b1u)));
    const int64_t seg_end = (i | 0xffff) + 1;  // the next multiple of 65536
    for (const int64_t stop = std::min(end, seg_end); i + 16 <= stop; i += 16) step(i, true);
    if (i < seg_end && i + 16 <= end && (uint64_t(i) & 0xffffffffu) <= 0xfffffff0u) {
      // the vector across seg_end: lo >> 16 differs within it
      step(i, false);
      i += 16;
    }
  }
  uint32_t top_bits[16];
  _mm512_storeu_si512(top_bits, abs_bits);
  *bad |= *std::max_element(top_bits, top_bits + 16) > 0x7f7fffffu;  // Inf or NaN
  return i;
}

bool available() { return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw"); }

}  // namespace cgx::prim::avx512

#pragma GCC diagnostic pop
#pragma GCC pop_options
#else
namespace cgx::prim::avx512 {
int64_t stochastic_levels_f32(const float*, int64_t begin, int64_t, const Levels&, uint8_t*,
                              bool*) {
  return begin;
}
bool available() { return false; }
}  // namespace cgx::prim::avx512
#endif
