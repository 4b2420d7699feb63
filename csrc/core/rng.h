// Counter-based generator for stochastic rounding (docs/FORMAT.md, "The stochastic-rounding
// generator"): the random number of element i depends only on (seed, stream, i).
#pragma once

#include <cstdint>

namespace cgx {

inline uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

inline uint32_t fmix32(uint32_t h) {
  h ^= h >> 16;
  h *= 0x85ebca6bu;
  h ^= h >> 13;
  h *= 0xc2b2ae35u;
  h ^= h >> 16;
  return h;
}

struct RngKey {
  uint32_t k0 = 0;
  uint32_t k1 = 0;
};

inline RngKey rng_key(uint64_t seed, uint64_t stream) {
  uint64_t k = splitmix64(splitmix64(seed) ^ stream);
  return RngKey{uint32_t(k), uint32_t(k >> 32)};
}

inline uint32_t rng_bits(RngKey key, uint64_t index) {
  uint32_t lo = uint32_t(index);
  uint32_t hi = uint32_t(index >> 32);
  return fmix32(fmix32(lo ^ key.k0) + (key.k1 ^ (hi * 0x9e3779b1u)));
}

// Uniform in [0, 1) with 24 random bits.
inline float rng_uniform(RngKey key, uint64_t index) {
  return float(rng_bits(key, index) >> 8) * 0x1p-24f;
}

}  // namespace cgx
