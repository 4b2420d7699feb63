// Building blocks the compressors are written in (csrc/compressors/): packing of 1..8-bit codes,
// per-range statistics, exact and sampled selection of large magnitudes, shared random indices.
// All are deterministic: the same input gives the same bytes on every thread count and machine.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "dtype.h"
#include "rng.h"

namespace cgx::prim {

// ---- element access -------------------------------------------------------------------------

// out[i] = v, or out[i] += v computed in fp32 and rounded once to out's dtype.
inline void put_value(void* out, DType t, int64_t i, float v, bool add) {
  if (add) v += load_as_float(out, t, i);
  store_from_float(out, t, i, v);
}

// Writes zero to [0, count) of out (unless add: nothing to do).
void clear(void* out, DType t, int64_t count, bool add);

// ---- bit packing: one little-endian bit stream, code i at bits [i*b, (i+1)*b) ----------------

inline size_t packed_bytes(int64_t n, int bits) { return size_t((n * bits + 7) / 8); }
// codes[i] < 2^bits; writes packed_bytes(n, bits) bytes.
void pack(const uint8_t* codes, int64_t n, int bits, uint8_t* out);
// Code i of a packed stream.
inline uint32_t unpack_one(const uint8_t* packed, int64_t i, int bits) {
  const int64_t bit = i * bits;
  uint32_t two = packed[bit >> 3];
  if (((bit & 7) + bits) > 8) two |= uint32_t(packed[(bit >> 3) + 1]) << 8;
  return (two >> (bit & 7)) & ((1u << bits) - 1u);
}

// ---- statistics over [begin, end) -----------------------------------------------------------

struct RangeStats {
  float min = 0, max = 0;  // NaN if any value is NaN
  float abs_max = 0;
  double abs_sum = 0;  // sum of |x|
  double sq_sum = 0;   // sum of x^2
  bool finite = true;
};
RangeStats stats(const void* in, DType t, int64_t begin, int64_t end);

// ---- selection -------------------------------------------------------------------------------

// The k indices of the largest |x| (ties: lower index first; NaN counts as largest), ascending.
std::vector<uint32_t> top_k(const void* in, DType t, int64_t n, int64_t k);

// Estimate of the k-th largest |x| from a deterministic sample of about `sample` values drawn
// with `key` (DGC's sampled threshold); exact when sample >= n.
float sampled_threshold(const void* in, DType t, int64_t n, int64_t k, int64_t sample, RngKey key);

// k distinct indices of [0, n), ascending, a function of (key, n, k) only (Floyd's algorithm).
std::vector<uint32_t> random_k(int64_t n, int64_t k, RngKey key);

}  // namespace cgx::prim
