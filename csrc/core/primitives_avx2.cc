// AVX2 versions of the hottest primitives (x86-64 with GCC); primitives.cc picks them at run
// time, with the codec's instruction-set switch (kernels::set_isa), and they give the same bytes.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "primitives.h"
#include "primitives_lanes.h"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#include <immintrin.h>
#pragma GCC push_options
#pragma GCC target("avx2,f16c")

namespace cgx::prim::avx512 {  // primitives_avx512.cc
int64_t stochastic_levels_f32(const float* x, int64_t begin, int64_t end, const Levels& q,
                              uint8_t* codes, bool* bad);
bool available();
}  // namespace cgx::prim::avx512

namespace cgx::prim::avx2 {

// The stochastic level rule goes to AVX-512 where the CPU has it (same bytes).
const bool avx512_ok = avx512::available();

// Streaming kernels fetch this far ahead (prefetching past the end of an array is harmless):
// the hardware prefetcher alone leaves them at half the memory bandwidth on the VMs measured.
constexpr int kPrefetchBytes = 1024;

// Eight sign bits (x < 0, NaN: 0) per byte, one compare and movemask per 8 values; `bad`
// collects NaN and +-Inf (|x| not below Inf).
bool sign_bits_f32(const float* x, int64_t n, uint8_t* out) {
  const __m256 zero = _mm256_setzero_ps();
  const __m256 inf = _mm256_set1_ps(INFINITY);
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  __m256 bad = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm_prefetch(reinterpret_cast<const char*>(x + i) + kPrefetchBytes, _MM_HINT_T0);
    const __m256 v = _mm256_loadu_ps(x + i);
    out[i / 8] = uint8_t(_mm256_movemask_ps(_mm256_cmp_ps(v, zero, _CMP_LT_OQ)));
    bad = _mm256_or_ps(bad, _mm256_cmp_ps(_mm256_and_ps(v, abs_mask), inf, _CMP_NLT_UQ));
  }
  bool finite = _mm256_movemask_ps(bad) == 0;
  if (i < n) {
    uint8_t last = 0;
    for (int64_t j = i; j < n; ++j) {
      finite = finite && std::isfinite(x[j]);
      last = uint8_t(last | (x[j] < 0 ? 1u : 0u) << (j - i));
    }
    out[i / 8] = last;
  }
  return finite;
}

// out[i] (+)= bit i ? neg : pos for i in [begin, end), bits as sign_bits_f32 writes them.
void select_signs_f32(const uint8_t* bits, int64_t begin, int64_t end, float neg, float pos,
                      float* out, bool add) {
  int64_t i = begin;
  auto scalar = [&](int64_t stop) {
    for (; i < stop; ++i) {
      const float v = (bits[i >> 3] >> (i & 7)) & 1 ? neg : pos;
      out[i] = add ? out[i] + v : v;
    }
  };
  scalar(std::min(end, (begin + 7) / 8 * 8));
  const __m256i lanes = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
  const __m256 vneg = _mm256_set1_ps(neg), vpos = _mm256_set1_ps(pos);
  for (; i + 8 <= end; i += 8) {
    const __m256i b = _mm256_set1_epi32(bits[i >> 3]);
    const __m256i on = _mm256_cmpeq_epi32(_mm256_and_si256(b, lanes), lanes);
    __m256 v = _mm256_blendv_ps(vpos, vneg, _mm256_castsi256_ps(on));
    if (add) v = _mm256_add_ps(_mm256_loadu_ps(out + i), v);
    _mm256_storeu_ps(out + i, v);
  }
  scalar(end);
}

namespace {

__m256i fmix32(__m256i h) {
  h = _mm256_xor_si256(h, _mm256_srli_epi32(h, 16));
  h = _mm256_mullo_epi32(h, _mm256_set1_epi32(int(0x85ebca6bu)));
  h = _mm256_xor_si256(h, _mm256_srli_epi32(h, 13));
  h = _mm256_mullo_epi32(h, _mm256_set1_epi32(int(0xc2b2ae35u)));
  return _mm256_xor_si256(h, _mm256_srli_epi32(h, 16));
}

// rng_uniform(key, index + j) for j in [0, 8); the low 32 bits of index must not wrap.
__m256 uniform8(RngKey key, uint64_t index) {
  const uint32_t hi_term = key.k1 ^ (uint32_t(index >> 32) * 0x9e3779b1u);
  __m256i lo = _mm256_add_epi32(_mm256_set1_epi32(int(uint32_t(index))),
                                _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  __m256i r = fmix32(_mm256_xor_si256(lo, _mm256_set1_epi32(int(key.k0))));
  r = fmix32(_mm256_add_epi32(r, _mm256_set1_epi32(int(hi_term))));
  return _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(r, 8)), _mm256_set1_ps(0x1p-24f));
}

void store8_bytes(__m256i v, uint8_t* out) {  // eight int32 in [0, 255] as bytes
  const __m128i w = _mm_packus_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  _mm_storel_epi64(reinterpret_cast<__m128i*>(out), _mm_packus_epi16(w, w));
}

__m256i f32_to_bf16_bits(__m256 v) {  // dtype.h's float_to_bf16 in the low 16 bits of each lane
  const __m256i u = _mm256_castps_si256(v);
  const __m256i hi = _mm256_srli_epi32(u, 16);
  const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff)),
                                         _mm256_set1_epi32(0x7f800000));
  const __m256i odd = _mm256_and_si256(hi, _mm256_set1_epi32(1));
  const __m256i rounded =
      _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)), odd), 16);
  return _mm256_blendv_epi8(rounded, _mm256_or_si256(hi, _mm256_set1_epi32(0x40)), nan);
}

}  // namespace

bool stats_f32(const float* x, int64_t n, detail::StatLanes& s) {
  __m256 mn = _mm256_loadu_ps(s.mn), mx = _mm256_loadu_ps(s.mx);
  __m256d sum[2], abs[2], sq[2];
  for (int h = 0; h < 2; ++h) {
    sum[h] = _mm256_loadu_pd(s.sum + 4 * h);
    abs[h] = _mm256_loadu_pd(s.abs + 4 * h);
    sq[h] = _mm256_loadu_pd(s.sq + 4 * h);
  }
  const __m256d sign = _mm256_set1_pd(-0.0);
  __m256 nan = _mm256_setzero_ps();
  int64_t negatives = 0, i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm_prefetch(reinterpret_cast<const char*>(x + i) + kPrefetchBytes, _MM_HINT_T0);
    const __m256 v = _mm256_loadu_ps(x + i);
    nan = _mm256_or_ps(nan, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    mn = _mm256_min_ps(v, mn);
    mx = _mm256_max_ps(v, mx);
    negatives += __builtin_popcount(
        unsigned(_mm256_movemask_ps(_mm256_cmp_ps(v, _mm256_setzero_ps(), _CMP_LT_OQ))));
    const __m256d d[2] = {_mm256_cvtps_pd(_mm256_castps256_ps128(v)),
                          _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1))};
    for (int h = 0; h < 2; ++h) {
      sum[h] = _mm256_add_pd(sum[h], d[h]);
      abs[h] = _mm256_add_pd(abs[h], _mm256_andnot_pd(sign, d[h]));
      sq[h] = _mm256_add_pd(sq[h], _mm256_mul_pd(d[h], d[h]));
    }
  }
  _mm256_storeu_ps(s.mn, mn);
  _mm256_storeu_ps(s.mx, mx);
  for (int h = 0; h < 2; ++h) {
    _mm256_storeu_pd(s.sum + 4 * h, sum[h]);
    _mm256_storeu_pd(s.abs + 4 * h, abs[h]);
    _mm256_storeu_pd(s.sq + 4 * h, sq[h]);
  }
  s.negatives += negatives;
  s.nan |= _mm256_movemask_ps(nan) != 0;
  detail::stat_lanes(x + i, DType::kFloat32, 0, n - i, s);  // the tail: lanes 0.. again
  return true;
}

bool level_codes_f32(const float* x, int64_t begin, int64_t end, const Levels& q, uint8_t* codes,
                     bool* finite) {
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  const __m256 clip = _mm256_set1_ps(q.clip), num = _mm256_set1_ps(q.num);
  const __m256 den = _mm256_set1_ps(q.den), levels = _mm256_set1_ps(float(q.levels));
  const __m256 zero = _mm256_setzero_ps(), inf = _mm256_set1_ps(INFINITY);
  const __m256i neg_add = _mm256_set1_epi32(int(q.neg_add));
  const bool stochastic = q.stochastic;  // locals: the byte stores below may alias q
  const RngKey key = q.key;
  const int64_t ahead = q.ahead;
  __m256 bad = zero;
  int64_t i = begin;
  bool bad512 = false;
  if (stochastic && avx512_ok) i = avx512::stochastic_levels_f32(x, begin, end, q, codes, &bad512);
  for (; i + 8 <= end; i += 8) {
    _mm_prefetch(reinterpret_cast<const char*>(x + i + ahead), _MM_HINT_T0);
    const __m256 v = _mm256_loadu_ps(x + i);
    const __m256 a = _mm256_min_ps(_mm256_and_ps(v, abs_mask), clip);
    bad = _mm256_or_ps(bad, _mm256_cmp_ps(_mm256_and_ps(v, abs_mask), inf, _CMP_NLT_UQ));
    __m256 t = _mm256_div_ps(_mm256_mul_ps(num, a), den);
    if (stochastic) {
      if ((uint64_t(i) & 0xffffffffu) > 0xfffffff8u) break;  // the generator's counter wraps
      t = _mm256_add_ps(t, uniform8(key, uint64_t(i)));
    }
    const __m256 l = _mm256_min_ps(_mm256_floor_ps(t), levels);
    const __m256 neg =
        _mm256_and_ps(_mm256_cmp_ps(v, zero, _CMP_LT_OQ), _mm256_cmp_ps(l, zero, _CMP_GT_OQ));
    const __m256i code = _mm256_add_epi32(_mm256_cvttps_epi32(l),
                                          _mm256_and_si256(_mm256_castps_si256(neg), neg_add));
    store8_bytes(code, codes + (i - begin));
  }
  bool ok = _mm256_movemask_ps(bad) == 0 && !bad512;
  for (; i < end; ++i) {
    ok &= std::isfinite(x[i]);
    codes[i - begin] = detail::level_code(x[i], q, i);
  }
  *finite = ok;
  return true;
}

int64_t decode_table_f32(const uint8_t* packed, size_t stream_bytes, int bits, int64_t first,
                         int64_t end, const float* table, float* out, bool add) {
  // Codes i..i+7 start at byte i * bits / 8: lanes 0-3 from the low 32 bits of that word,
  // lanes 4-7 from the 32 bits after 4 * bits.
  const __m256i shifts =
      _mm256_setr_epi32(0, bits, 2 * bits, 3 * bits, 0, bits, 2 * bits, 3 * bits);
  const __m256i mask = _mm256_set1_epi32((1 << bits) - 1);
  int64_t i = first;
  for (; i + 8 <= end; i += 8) {
    const size_t at = size_t(i) * size_t(bits) / 8;
    if (at + 8 > stream_bytes) break;
    uint64_t w;
    std::memcpy(&w, packed + at, 8);
    const __m256i words =
        _mm256_setr_epi32(int(uint32_t(w)), int(uint32_t(w)), int(uint32_t(w)), int(uint32_t(w)),
                          int(uint32_t(w >> (4 * bits))), int(uint32_t(w >> (4 * bits))),
                          int(uint32_t(w >> (4 * bits))), int(uint32_t(w >> (4 * bits))));
    const __m256i idx = _mm256_and_si256(_mm256_srlv_epi32(words, shifts), mask);
    __m256 v = _mm256_i32gather_ps(table, idx, 4);
    if (add) v = _mm256_add_ps(_mm256_loadu_ps(out + i), v);
    _mm256_storeu_ps(out + i, v);
  }
  return i;
}

bool indices_at_least_f32(const float* x, int64_t n, float thr, std::vector<uint32_t>& out) {
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  const __m256 t = _mm256_set1_ps(thr);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm_prefetch(reinterpret_cast<const char*>(x + i) + kPrefetchBytes, _MM_HINT_T0);
    const __m256 a = _mm256_and_ps(_mm256_loadu_ps(x + i), abs_mask);
    // not below thr, or NaN (unordered): NaN counts as +Inf
    for (unsigned m = unsigned(_mm256_movemask_ps(_mm256_cmp_ps(a, t, _CMP_NLT_UQ))); m != 0;
         m &= m - 1) {
      out.push_back(uint32_t(i + __builtin_ctz(m)));
    }
  }
  for (; i < n; ++i) {
    const float a = std::fabs(x[i]);
    if (std::isnan(a) || a >= thr) out.push_back(uint32_t(i));
  }
  return true;
}

bool convert(const void* in, DType in_t, void* out, DType out_t, int64_t n, bool add) {
  int64_t i = 0;
  if (in_t == DType::kFloat32 && out_t != DType::kFloat32 && !add) {
    const float* x = static_cast<const float*>(in);
    auto* o = static_cast<uint8_t*>(out);
    for (; i + 8 <= n; i += 8) {
      _mm_prefetch(reinterpret_cast<const char*>(x + i) + kPrefetchBytes, _MM_HINT_T0);
      const __m256 v = _mm256_loadu_ps(x + i);
      __m128i h;
      if (out_t == DType::kFloat16) {
        h = _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
      } else {
        const __m256i b = f32_to_bf16_bits(v);
        h = _mm256_castsi256_si128(
            _mm256_permute4x64_epi64(_mm256_packus_epi32(b, b), _MM_SHUFFLE(3, 1, 2, 0)));
      }
      _mm_storeu_si128(reinterpret_cast<__m128i*>(o + 2 * i), h);
    }
    for (; i < n; ++i) {
      const uint16_t h = out_t == DType::kFloat16 ? float_to_half(x[i]) : float_to_bf16(x[i]);
      std::memcpy(o + 2 * i, &h, 2);
    }
    return true;
  }
  if (in_t != DType::kFloat32 && out_t == DType::kFloat32) {
    const auto* p = static_cast<const uint8_t*>(in);
    float* o = static_cast<float*>(out);
    for (; i + 8 <= n; i += 8) {
      const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 2 * i));
      __m256 v = in_t == DType::kFloat16
                     ? _mm256_cvtph_ps(h)
                     : _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
      if (add) v = _mm256_add_ps(_mm256_loadu_ps(o + i), v);
      _mm256_storeu_ps(o + i, v);
    }
    for (; i < n; ++i) {
      uint16_t h;
      std::memcpy(&h, p + 2 * i, 2);
      const float v = in_t == DType::kFloat16 ? half_to_float(h) : bf16_to_float(h);
      o[i] = add ? o[i] + v : v;
    }
    return true;
  }
  return false;
}

}  // namespace cgx::prim::avx2

#pragma GCC pop_options
#define CGX_HAVE_AVX2_PRIMITIVES 1
#else
namespace cgx::prim::avx2 {  // no AVX2 build: every caller takes the scalar path
bool stats_f32(const float*, int64_t, detail::StatLanes&) { return false; }
bool level_codes_f32(const float*, int64_t, int64_t, const Levels&, uint8_t*, bool*) {
  return false;
}
bool convert(const void*, DType, void*, DType, int64_t, bool) { return false; }
bool indices_at_least_f32(const float*, int64_t, float, std::vector<uint32_t>&) { return false; }
int64_t decode_table_f32(const uint8_t*, size_t, int, int64_t first, int64_t, const float*, float*,
                         bool) {
  return first;
}
}  // namespace cgx::prim::avx2
#endif

namespace cgx::prim {

void select_signs(const uint8_t* bits, int64_t begin, int64_t end, float neg, float pos, void* out,
                  DType t, bool add) {
#ifdef CGX_HAVE_AVX2_PRIMITIVES
  if (t == DType::kFloat32 && use_avx2()) {
    avx2::select_signs_f32(bits, begin, end, neg, pos, static_cast<float*>(out), add);
    return;
  }
#endif
  BitReader r(bits, 1, begin);
  write_each(out, t, begin, end, add, [&](int64_t) { return r.get() ? neg : pos; });
}

bool sign_bits_fast(const void* in, DType t, int64_t n, uint8_t* out) {
#ifdef CGX_HAVE_AVX2_PRIMITIVES
  if (t == DType::kFloat32 && use_avx2()) {
    return avx2::sign_bits_f32(static_cast<const float*>(in), n, out);
  }
#endif
  BitWriter w(out, 1);
  bool finite = true;
  for_each(in, t, 0, n, [&](int64_t, float v) {
    finite &= std::isfinite(v);
    w.put(v < 0);
  });
  w.finish();
  return finite;
}

}  // namespace cgx::prim
