// The error bound of the compressed allreduce, derived in docs/algorithms.md ("Error bound").
// The one copy of the formula: the C++ tests call it directly, the Python tests and the
// benchmark's verify mode through torch_cgx.bounds.
#pragma once

#include "allreduce.h"

namespace cgx {

struct BoundParams {
  int bits = 4;
  int world = 1;
  Algorithm algorithm = Algorithm::kScatterReduceAllgather;
  bool average = false;
  Rounding rounding = Rounding::kNearest;
  DType dtype = DType::kFloat32;  // the dtype the result is stored in
};

// Largest |allreduce - exact sum| over one codec bucket, given the sum over ranks of the
// bucket's range (max - min) and the sum over ranks of its largest magnitude.
double bucket_error_bound(double range_sum, double magnitude_sum, const BoundParams& p);

}  // namespace cgx
