// Internals of primitives_quant.cc and primitives_avx2.cc: the eight-lane statistics both
// paths accumulate into, and the scalar reference of each vectorized primitive.
#pragma once

#include <cmath>
#include <cstdint>

#include "primitives.h"

namespace cgx::prim::detail {

struct StatLanes {
  float mn[8], mx[8];
  double sum[8] = {}, abs[8] = {}, sq[8] = {};
  int64_t negatives = 0;
  bool nan = false;
  StatLanes() {
    for (int j = 0; j < 8; ++j) mn[j] = INFINITY, mx[j] = -INFINITY;
  }
  // Element v into lane j, with the operations of the AVX2 path (min_ps / max_ps semantics).
  void add(int j, float v) {
    nan |= std::isnan(v);
    mn[j] = v < mn[j] ? v : mn[j];
    mx[j] = v > mx[j] ? v : mx[j];
    const double d = v;
    sum[j] += d;
    abs[j] += std::fabs(d);
    sq[j] += d * d;
    negatives += v < 0;
  }
};

// Scalar lanes for [begin, end): element begin + 8q + j into lane j.
void stat_lanes(const void* in, DType t, int64_t begin, int64_t end, StatLanes& s);
RangeStats finish(const StatLanes& s);

// The Levels rule for one value (the scalar reference of level_codes).
inline uint8_t level_code(float x, const Levels& q, int64_t i) {
  float a = std::fabs(x);
  a = a < q.clip ? a : q.clip;
  const float u = q.stochastic ? rng_uniform(q.key, uint64_t(i)) : 0.0f;
  const float f = std::floor(q.num * a / q.den + u);
  const float l = f < float(q.levels) ? f : float(q.levels);
  const uint32_t code = uint32_t(l) + (x < 0 && l > 0 ? q.neg_add : 0u);
  return uint8_t(code);
}

}  // namespace cgx::prim::detail
