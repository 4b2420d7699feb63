#include "primitives.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <unordered_set>

#include "codec_kernels.h"
#include "error.h"

namespace cgx::prim {

bool use_avx2() { return kernels::isa()[0] == 'a'; }

void clear(void* out, DType t, int64_t count, bool add) {
  if (!add && count > 0) std::memset(out, 0, size_t(count) * elem_size(t));  // +0.0 in all three
}

void pack(const uint8_t* codes, int64_t n, int bits, uint8_t* out) {
  std::memset(out, 0, packed_bytes(n, bits));
  if (bits == 8) {
    std::memcpy(out, codes, size_t(n));
    return;
  }
  for (int64_t i = 0; i < n; ++i) {
    const int64_t bit = i * bits;
    const uint32_t v = uint32_t(codes[i]) << (bit & 7);
    out[bit >> 3] |= uint8_t(v);
    if ((bit & 7) + bits > 8) out[(bit >> 3) + 1] |= uint8_t(v >> 8);
  }
}

namespace {

// |x| for ordering, NaN above +Inf.
float magnitude(const void* in, DType t, int64_t i) {
  const float v = std::fabs(load_as_float(in, t, i));
  return std::isnan(v) ? INFINITY : v;
}

bool greater(const void* in, DType t, uint32_t a, uint32_t b) {
  const float va = load_as_float(in, t, a), vb = load_as_float(in, t, b);
  const bool na = std::isnan(va), nb = std::isnan(vb);
  if (na != nb) return na;
  const float ma = na ? 0 : std::fabs(va), mb = nb ? 0 : std::fabs(vb);
  if (ma != mb) return ma > mb;
  return a < b;
}

}  // namespace

std::vector<uint32_t> top_k(const void* in, DType t, int64_t n, int64_t k) {
  CGX_CHECK_ARG(n < (int64_t(1) << 32), "top_k: at most 2^32 - 1 elements, got ", n);
  k = std::clamp<int64_t>(k, 0, n);
  std::vector<uint32_t> idx(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) idx[size_t(i)] = uint32_t(i);
  auto cmp = [&](uint32_t a, uint32_t b) { return greater(in, t, a, b); };
  if (k < n) std::nth_element(idx.begin(), idx.begin() + k, idx.end(), cmp);
  idx.resize(size_t(k));
  std::sort(idx.begin(), idx.end());
  return idx;
}

float sampled_threshold(const void* in, DType t, int64_t n, int64_t k, int64_t sample, RngKey key) {
  if (n == 0 || k <= 0) return INFINITY;
  std::vector<float> m;
  if (sample >= n) {
    m.resize(size_t(n));
    for (int64_t i = 0; i < n; ++i) m[size_t(i)] = magnitude(in, t, i);
  } else {
    m.resize(size_t(std::max<int64_t>(sample, 1)));
    for (size_t j = 0; j < m.size(); ++j) {
      const uint64_t r = (uint64_t(rng_bits(key, 2 * j)) << 32) | rng_bits(key, 2 * j + 1);
      m[j] = magnitude(in, t, int64_t(r % uint64_t(n)));
    }
  }
  // The sample's quantile of the same rank: the k-th largest of n becomes the
  // ceil(k * s / n)-th largest of s.
  const int64_t s = int64_t(m.size());
  int64_t ks = std::clamp<int64_t>((k * s + n - 1) / n, 1, s);
  std::nth_element(m.begin(), m.begin() + (ks - 1), m.end(), std::greater<float>());
  return m[size_t(ks - 1)];
}

std::vector<uint32_t> random_k(int64_t n, int64_t k, RngKey key) {
  CGX_CHECK_ARG(n < (int64_t(1) << 32), "random_k: at most 2^32 - 1 elements, got ", n);
  k = std::clamp<int64_t>(k, 0, n);
  std::vector<uint32_t> out;
  out.reserve(size_t(k));
  if (k == n) {
    for (int64_t i = 0; i < n; ++i) out.push_back(uint32_t(i));
    return out;
  }
  // Floyd: for j = n - k .. n - 1, pick r in [0, j]; take r, or j if r was taken.
  std::unordered_set<uint32_t> taken;
  taken.reserve(size_t(k) * 2);
  for (int64_t j = n - k, step = 0; j < n; ++j, ++step) {
    const uint64_t r64 =
        (uint64_t(rng_bits(key, 2 * uint64_t(step))) << 32) | rng_bits(key, 2 * uint64_t(step) + 1);
    const uint32_t r = uint32_t(r64 % uint64_t(j + 1));
    const uint32_t pick = taken.count(r) ? uint32_t(j) : r;
    taken.insert(pick);
    out.push_back(pick);
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace cgx::prim
