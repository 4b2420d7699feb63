#include "rotated.h"

#include "core/error.h"
#include "core/rotation.h"

namespace cgx {

uint64_t rotation_seed(uint64_t group_seed, uint64_t call) {
  return group_seed * 1000003u + call + 1;
}

void with_rotation(float* data, int64_t n, int64_t block, uint64_t seed, float* residual,
                   const Reduction& reduce) {
  CGX_CHECK_ARG(rotation::valid_block(block), "rotation: bucket size ", block,
                " is not a power of two in [2, 2^20]");
  CGX_CHECK_ARG(n >= 0, "element count must be >= 0, got ", n);
  const int64_t full = n / block * block;
  rotation::rotate(data, full, block, seed, true);
  reduce(data, n, residual);
  rotation::rotate(data, full, block, seed, false);
  if (residual) rotation::rotate(residual, full, block, seed, false);
}

}  // namespace cgx
