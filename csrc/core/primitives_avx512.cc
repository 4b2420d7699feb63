// AVX-512 version of the stochastic level rule (prim::Levels), where the CPU has it: the
// counter-based generator's four 32-bit multiplies per value dominate qsgd / terngrad encoding,
// and 16 lanes halve their cost. Same bytes as the scalar rule (primitives_lanes.h).
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

// [begin, end) of a stochastic Levels rule, 16 values at a time; returns where it stopped (the
// caller finishes the tail) and ORs non-finite inputs into *bad.
int64_t stochastic_levels_f32(const float* x, int64_t begin, int64_t end, const Levels& q,
                              uint8_t* codes, bool* bad) {
  const __m512 clip = _mm512_set1_ps(q.clip), num = _mm512_set1_ps(q.num);
  const __m512 den = _mm512_set1_ps(q.den), levels = _mm512_set1_ps(float(q.levels));
  const __m512 zero = _mm512_setzero_ps(), inf = _mm512_set1_ps(INFINITY);
  const __m512i neg_add = _mm512_set1_epi32(int(q.neg_add));
  const RngKey key = q.key;
  __mmask16 nonfinite = 0;
  int64_t i = begin;
  for (; i + 16 <= end; i += 16) {
    if ((uint64_t(i) & 0xffffffffu) > 0xfffffff0u) break;  // the generator's counter wraps
    _mm_prefetch(reinterpret_cast<const char*>(x + i) + 1024, _MM_HINT_T0);
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
