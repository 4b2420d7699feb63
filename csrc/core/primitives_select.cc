// Selection primitives: indices at or above a magnitude, exact top-k, DGC's sampled threshold.
// top_k avoids a full nth_element when it can: a sampled lower bound of the k-th largest magnitude
// picks candidates in one (AVX2) pass, and the exact selection runs on those only; the result is
// the same as the full selection's, by construction (see top_k).
#include <algorithm>
#include <cmath>

#include "error.h"
#include "primitives.h"

namespace cgx::prim {

namespace avx2 {  // primitives_avx2.cc; false: not handled
bool indices_at_least_f32(const float* x, int64_t n, float thr, std::vector<uint32_t>& out);
}  // namespace avx2

namespace {

// |x| for ordering, NaN above +Inf.
float magnitude(float v) {
  const float a = std::fabs(v);
  return std::isnan(a) ? INFINITY : a;
}

// A key whose descending order is top_k's order: NaN first, then |x| descending, then the lower
// index first. |x|'s bits order like its value; NaN gets the largest.
uint64_t order_key(float v, uint32_t i) {
  const uint32_t bits = std::isnan(v) ? 0xffffffffu : float_bits(std::fabs(v));
  return (uint64_t(bits) << 32) | uint32_t(~i);
}

// The k largest keys' indices, ascending.
std::vector<uint32_t> select_keys(std::vector<uint64_t>& keys, int64_t k) {
  if (k < int64_t(keys.size())) {
    std::nth_element(keys.begin(), keys.begin() + k, keys.end(), std::greater<uint64_t>());
  }
  std::vector<uint32_t> idx(static_cast<size_t>(k));
  for (int64_t j = 0; j < k; ++j) idx[size_t(j)] = ~uint32_t(keys[size_t(j)]);
  std::sort(idx.begin(), idx.end());
  return idx;
}

std::vector<uint64_t> keys_of(const void* in, DType t, const std::vector<uint32_t>& idx) {
  std::vector<uint64_t> keys(idx.size());
  for (size_t j = 0; j < idx.size(); ++j) keys[j] = order_key(load_as_float(in, t, idx[j]), idx[j]);
  return keys;
}

}  // namespace

std::vector<uint32_t> indices_at_least(const void* in, DType t, int64_t n, float thr) {
  std::vector<uint32_t> idx;
  if (t == DType::kFloat32 && use_avx2() &&
      avx2::indices_at_least_f32(static_cast<const float*>(in), n, thr, idx)) {
    return idx;
  }
  for_each(in, t, 0, n, [&](int64_t i, float v) {
    if (magnitude(v) >= thr) idx.push_back(uint32_t(i));
  });
  return idx;
}

std::vector<uint32_t> top_k(const void* in, DType t, int64_t n, int64_t k) {
  CGX_CHECK_ARG(n < (int64_t(1) << 32), "top_k: at most 2^32 - 1 elements, got ", n);
  k = std::clamp<int64_t>(k, 0, n);
  if (k == 0) return {};
  // Candidates: every value at or above a sampled estimate of about the (2k + 4096)-th largest
  // magnitude. When there are at least k of them, the k-th largest magnitude is >= the bound, so
  // every member of the top k (ties included) is a candidate, and selecting among the candidates
  // gives the full selection's answer. Otherwise (an unlucky sample): all values.
  constexpr int64_t kSample = 16384;
  if (n >= 4 * kSample && 2 * k + 4096 < n / 2) {
    const float bound = sampled_threshold(in, t, n, 2 * k + 4096, kSample, rng_key(0, 0));
    std::vector<uint32_t> cand = indices_at_least(in, t, n, bound);
    if (int64_t(cand.size()) >= k) {
      std::vector<uint64_t> keys = keys_of(in, t, cand);
      return select_keys(keys, k);
    }
  }
  std::vector<uint64_t> keys(static_cast<size_t>(n));
  for_each(in, t, 0, n, [&](int64_t i, float v) { keys[size_t(i)] = order_key(v, uint32_t(i)); });
  return select_keys(keys, k);
}

float kth_largest(const float* m, int64_t s, int64_t k) {
  // Radix selection on the bits, 11 + 11 + 10 at a time from the top: the bits of non-negative
  // floats order like their values, so the k-th largest bits are the k-th largest value (the
  // value std::nth_element would put at k - 1; ties are equal values).
  std::vector<uint32_t> cur;  // the values still in the running, after the first digit
  uint32_t prefix = 0;
  int64_t rank = k;  // within the values that share `prefix`
  const int shifts[3] = {21, 10, 0};
  for (int level = 0; level < 3; ++level) {
    const int shift = shifts[level];
    const uint32_t mask = level == 2 ? 0x3ffu : 0x7ffu;
    int64_t count[2048] = {};
    if (level == 0) {
      for (int64_t j = 0; j < s; ++j) ++count[float_bits(m[j]) >> shift];
    } else {
      for (uint32_t v : cur) ++count[(v >> shift) & mask];
    }
    uint32_t b = mask;
    for (; b > 0 && rank > count[b]; --b) rank -= count[b];
    std::vector<uint32_t> next;
    next.reserve(size_t(count[b]));
    auto keep = [&](uint32_t v) {
      if (((v >> shift) & mask) == b) next.push_back(v);
    };
    if (level == 0) {
      for (int64_t j = 0; j < s; ++j) keep(float_bits(m[j]));
    } else {
      for (uint32_t v : cur) keep(v);
    }
    cur.swap(next);
    prefix |= b << shift;
  }
  return bits_float(prefix);
}

int64_t sample_size(int64_t n, int64_t sample) {
  return sample >= n ? n : std::max<int64_t>(sample, 1);
}

void sample_magnitudes(const void* in, DType t, int64_t n, int64_t sample, RngKey key, int64_t j0,
                       int64_t j1, float* m) {
  if (sample >= n) {
    for_each(in, t, j0, j1, [&](int64_t i, float v) { m[i - j0] = magnitude(v); });
    return;
  }
  // The positions first, then the values: the loads, prefetched ahead, overlap their misses.
  constexpr int64_t kAhead = 16;
  uint32_t at[kAhead];
  auto position = [&](int64_t j) {
    const uint64_t r = (uint64_t(rng_bits(key, 2 * j)) << 32) | rng_bits(key, 2 * j + 1);
    return uint32_t(r % uint64_t(n));
  };
  const auto* bytes = static_cast<const char*>(in);
  const size_t es = elem_size(t);
  for (int64_t j = j0; j < std::min(j1, j0 + kAhead); ++j) at[j % kAhead] = position(j);
  for (int64_t j = j0; j < j1; ++j) {
    const uint32_t i = at[j % kAhead];
    if (j + kAhead < j1) {
      at[(j + kAhead) % kAhead] = position(j + kAhead);
      __builtin_prefetch(bytes + size_t(at[(j + kAhead) % kAhead]) * es);
    }
    m[j - j0] = magnitude(load_as_float(in, t, i));
  }
}

float sample_quantile(const float* m, int64_t s, int64_t n, int64_t k) {
  // The sample's quantile of the same rank: the k-th largest of n becomes the
  // ceil(k * s / n)-th largest of s.
  const int64_t ks = std::clamp<int64_t>((k * s + n - 1) / n, 1, s);
  return kth_largest(m, s, ks);
}

float sampled_threshold(const void* in, DType t, int64_t n, int64_t k, int64_t sample, RngKey key) {
  if (n == 0 || k <= 0) return INFINITY;
  const int64_t s = sample_size(n, sample);
  std::vector<float> m(static_cast<size_t>(s));
  sample_magnitudes(in, t, n, sample, key, 0, s, m.data());
  return sample_quantile(m.data(), s, n, k);
}

}  // namespace cgx::prim
