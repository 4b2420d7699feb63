// AVX2 versions of the hottest primitives (x86-64 with GCC); primitives.cc picks them at run
// time, with the codec's instruction-set switch (kernels::set_isa), and they give the same bytes.
#include <algorithm>
#include <cmath>

#include "primitives.h"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#include <immintrin.h>
#pragma GCC push_options
#pragma GCC target("avx2")

namespace cgx::prim::avx2 {

// Eight sign bits (x < 0, NaN: 0) per byte, one compare and movemask per 8 values; `bad`
// collects NaN and +-Inf (|x| not below Inf).
bool sign_bits_f32(const float* x, int64_t n, uint8_t* out) {
  const __m256 zero = _mm256_setzero_ps();
  const __m256 inf = _mm256_set1_ps(INFINITY);
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  __m256 bad = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
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

}  // namespace cgx::prim::avx2

#pragma GCC pop_options
#define CGX_HAVE_AVX2_PRIMITIVES 1
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
