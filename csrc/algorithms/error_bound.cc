#include "error_bound.h"

#include "core/error.h"

namespace cgx {

// Each quantization of a value adds at most (range of what is quantized) / (2L) with nearest
// rounding, twice that with stochastic rounding; the range of what is quantized is at most the
// ranks' summed range plus twice the error so far. SRA quantizes every value twice (the W - 1
// first-stage errors, each from its own rank's range, are bounded by R / (2L) together), ring
// W times, the tree ceil(log2 W) + 1 times, allgather-reduce once. fp32 roundings (relative
// 1e-6 of the magnitudes, with a 1e-3 margin on the quantization terms) and the final rounding
// to the result's dtype are added.
double bucket_error_bound(double range_sum, double magnitude_sum, const BoundParams& p) {
  CGX_CHECK_ARG(p.bits >= 1 && p.bits <= 8, "bits must be in [1, 8], got ", p.bits);
  CGX_CHECK_ARG(p.world >= 1, "world size must be >= 1, got ", p.world);
  const double levels = double((1 << p.bits) - 1);
  const double per_unit = p.rounding == Rounding::kStochastic ? 1.0 : 0.5;
  // Allgather-reduce: each rank's values once, the W errors together within R / (2L).
  // Tree: a value is re-quantized at each of up to ceil(log2 W) levels, then once at the root.
  int depth = 0;
  while ((1 << depth) < p.world) ++depth;
  const int rounds = p.algorithm == Algorithm::kRing        ? p.world
                     : p.algorithm == Algorithm::kAllgather ? 1
                     : p.algorithm == Algorithm::kTree      ? depth + 1
                                                            : 2;
  double err = 0.0;
  if (p.world > 1) {
    for (int k = 0; k < rounds; ++k) err += (range_sum + 2 * err) / levels * per_unit;
  }
  double final_rounding = 0x1p-23;
  if (p.dtype == DType::kFloat16) final_rounding = 0x1p-10;
  if (p.dtype == DType::kBFloat16) final_rounding = 0x1p-7;
  err = err * (1 + 1e-3) + (1e-6 + final_rounding) * magnitude_sum;
  return p.average ? err / p.world : err;
}

}  // namespace cgx
