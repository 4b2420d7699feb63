// Per-bucket statistics of many buckets at once: prim::stats' sq_sum / abs_max fields, bit for
// bit, without the fields a quantizer does not read. prim::stats sums one bucket in eight fp64
// lanes, so a 512-value bucket is a chain of dependent adds; here four buckets are summed side by
// side (AVX2, fp32 input, buckets of a multiple of 8 values), each still in its own eight lanes in
// the same order, so their adds overlap. Everything else goes through prim::stats itself.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "primitives.h"

namespace cgx::prim {

namespace avx2 {  // below; false: not handled (no AVX2 build)
bool sq_sums_f32(const float* x, int64_t buckets, int64_t len, double* out);
bool abs_max_f32(const float* x, int64_t n, float* out);
}  // namespace avx2

namespace {

// [begin, end) in buckets of `bucket` values (the last one may be shorter): fast(first, count)
// handles `count` whole buckets from bucket `first` when it can (returns false otherwise);
// slow(b, lo, hi) one bucket.
template <typename Fast, typename Slow>
void each_bucket(DType t, int64_t begin, int64_t end, int64_t bucket, Fast&& fast, Slow&& slow) {
  const int64_t n = end - begin;
  const int64_t whole = n / bucket;
  int64_t b = 0;
  if (t == DType::kFloat32 && use_avx2() && bucket % 8 == 0 && whole > 0 && fast(0, whole)) {
    b = whole;
  }
  for (; b * bucket < n; ++b) {
    slow(b, begin + b * bucket, std::min(end, begin + (b + 1) * bucket));
  }
}

}  // namespace

void sq_sums(const void* in, DType t, int64_t begin, int64_t end, int64_t bucket, double* out) {
  const float* x = static_cast<const float*>(in) + (t == DType::kFloat32 ? begin : 0);
  each_bucket(
      t, begin, end, bucket,
      [&](int64_t first, int64_t count) {
        return avx2::sq_sums_f32(x + first * bucket, count, bucket, out + first);
      },
      [&](int64_t b, int64_t lo, int64_t hi) { out[b] = stats(in, t, lo, hi).sq_sum; });
}

void abs_maxes(const void* in, DType t, int64_t begin, int64_t end, int64_t bucket, float* out) {
  const float* x = static_cast<const float*>(in) + (t == DType::kFloat32 ? begin : 0);
  each_bucket(
      t, begin, end, bucket,
      [&](int64_t first, int64_t count) {
        for (int64_t b = first; b < first + count; ++b) {
          if (!avx2::abs_max_f32(x + b * bucket, bucket, out + b)) return false;
        }
        return true;
      },
      [&](int64_t b, int64_t lo, int64_t hi) { out[b] = stats(in, t, lo, hi).abs_max; });
}

}  // namespace cgx::prim

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#include <immintrin.h>
#pragma GCC push_options
#pragma GCC target("avx2")

namespace cgx::prim::avx2 {
namespace {

// prim::stats' combination of its eight lanes (primitives_quant.cc, detail::finish).
double combine(__m256d lo, __m256d hi) {
  double l[8];
  _mm256_storeu_pd(l, lo);
  _mm256_storeu_pd(l + 4, hi);
  return ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
}

// G buckets of len values (a multiple of 8) from x, side by side.
template <int G>
void sq_group(const float* x, int64_t len, double* out) {
  __m256d acc[G][2];
  for (int g = 0; g < G; ++g) acc[g][0] = acc[g][1] = _mm256_setzero_pd();
  for (int64_t i = 0; i < len; i += 8) {
    // The next group, as far as this iteration reads (G * 32 bytes): the hardware prefetcher
    // alone is not enough.
    for (int line = 0; line < G * 32; line += 64) {
      _mm_prefetch(reinterpret_cast<const char*>(x + G * len + G * i) + line, _MM_HINT_T0);
    }
    for (int g = 0; g < G; ++g) {
      const __m256 v = _mm256_loadu_ps(x + g * len + i);
      const __m256d d0 = _mm256_cvtps_pd(_mm256_castps256_ps128(v));
      const __m256d d1 = _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1));
      acc[g][0] = _mm256_add_pd(acc[g][0], _mm256_mul_pd(d0, d0));
      acc[g][1] = _mm256_add_pd(acc[g][1], _mm256_mul_pd(d1, d1));
    }
  }
  for (int g = 0; g < G; ++g) out[g] = combine(acc[g][0], acc[g][1]);
}

}  // namespace

bool sq_sums_f32(const float* x, int64_t buckets, int64_t len, double* out) {
  int64_t b = 0;
  for (; b + 4 <= buckets; b += 4) sq_group<4>(x + b * len, len, out + b);
  for (; b < buckets; ++b) sq_group<1>(x + b * len, len, out + b);
  return true;
}

// max |x| by the bits of |x| (non-negative floats order like their bits; NaN's are above Inf's).
bool abs_max_f32(const float* x, int64_t n, float* out) {
  const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff);
  __m256i m = _mm256_setzero_si256();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm_prefetch(reinterpret_cast<const char*>(x + i) + 1024, _MM_HINT_T0);
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + i));
    m = _mm256_max_epi32(m, _mm256_and_si256(v, abs_mask));
  }
  uint32_t l[8];
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(l), m);
  uint32_t top = *std::max_element(l, l + 8);
  for (; i < n; ++i) {
    uint32_t u;
    std::memcpy(&u, x + i, 4);
    top = std::max(top, u & 0x7fffffffu);
  }
  if (top > 0x7f800000u) {
    *out = NAN;  // prim::stats' abs_max of a range holding NaN
  } else {
    std::memcpy(out, &top, 4);
  }
  return true;
}

}  // namespace cgx::prim::avx2

#pragma GCC pop_options
#else
namespace cgx::prim::avx2 {
bool sq_sums_f32(const float*, int64_t, int64_t, double*) { return false; }
bool abs_max_f32(const float*, int64_t, float*) { return false; }
}  // namespace cgx::prim::avx2
#endif
