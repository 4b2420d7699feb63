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

std::vector<uint32_t> random_k(int64_t n, int64_t k, RngKey key) {
  CGX_CHECK_ARG(n < (int64_t(1) << 32), "random_k: at most 2^32 - 1 elements, got ", n);
  k = std::clamp<int64_t>(k, 0, n);
  std::vector<uint32_t> out;
  out.reserve(size_t(k));
  if (k == n) {
    for (int64_t i = 0; i < n; ++i) out.push_back(uint32_t(i));
    return out;
  }
  // Floyd: for j = n - k .. n - 1, pick r in [0, j]; take r, or j if r was taken. The taken set
  // is a bitmap (then read out in order) unless that would take more than 4 MiB and 16 bytes per
  // pick; a hash set otherwise. Both give the same picks.
  auto draw = [&](int64_t step, int64_t j) {
    const uint64_t r64 =
        (uint64_t(rng_bits(key, 2 * uint64_t(step))) << 32) | rng_bits(key, 2 * uint64_t(step) + 1);
    return uint32_t(r64 % uint64_t(j + 1));
  };
  if ((n + 7) / 8 <= std::max<int64_t>(int64_t(1) << 22, 16 * k)) {
    std::vector<uint64_t> taken(size_t((n + 63) / 64));
    auto has = [&](uint32_t i) { return (taken[i >> 6] >> (i & 63)) & 1u; };
    // The draws run kAhead steps ahead of the picks, each prefetching its word of the bitmap
    // (megabytes for large n): the picks, in order as before, then find it in cache.
    constexpr int64_t kAhead = 32;
    uint32_t ahead[kAhead];
    auto fetch = [&](int64_t step) {
      const uint32_t r = draw(step, n - k + step);
      __builtin_prefetch(&taken[r >> 6]);
      ahead[step % kAhead] = r;
    };
    for (int64_t step = 0; step < std::min(k, kAhead); ++step) fetch(step);
    for (int64_t j = n - k, step = 0; j < n; ++j, ++step) {
      const uint32_t r = ahead[step % kAhead];
      if (step + kAhead < k) fetch(step + kAhead);
      const uint32_t pick = has(r) ? uint32_t(j) : r;
      taken[pick >> 6] |= uint64_t(1) << (pick & 63);
    }
    // Read out in order: exactly k bits are set. Two bits of a word without a branch (a sparse
    // bitmap's words hold 0, 1 or 2 bits at random: branching on each costs a misprediction),
    // writing one slot past the last index at most (not kept).
    out.resize(size_t(k) + 2);
    uint32_t* o = out.data();
    for (size_t w = 0; w < taken.size(); ++w) {
      uint64_t bits = taken[w];
      const uint32_t base = uint32_t(w * 64);
      for (int twice = 0; twice < 2; ++twice) {
        *o = base + uint32_t(__builtin_ctzll(bits | (uint64_t(1) << 63)));
        o += bits != 0;
        bits &= bits - 1;
      }
      for (; bits != 0; bits &= bits - 1) *o++ = base + uint32_t(__builtin_ctzll(bits));
    }
    out.resize(size_t(k));
    return out;
  }
  std::unordered_set<uint32_t> taken;
  taken.reserve(size_t(k) * 2);
  for (int64_t j = n - k, step = 0; j < n; ++j, ++step) {
    const uint32_t r = draw(step, j);
    const uint32_t pick = taken.count(r) ? uint32_t(j) : r;
    taken.insert(pick);
    out.push_back(pick);
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace cgx::prim
