#include "rotation.h"

#include <algorithm>
#include <cmath>

#include "error.h"
#include "rng.h"
#include "thread_pool.h"

namespace cgx::rotation {
namespace {

// The unnormalised Walsh-Hadamard transform of x[0, b), in place: log2(b) butterfly passes.
void hadamard(float* x, int64_t b) {
  for (int64_t h = 1; h < b; h *= 2) {
    for (int64_t i = 0; i < b; i += 2 * h) {
      float* lo = x + i;
      float* hi = x + i + h;
      for (int64_t j = 0; j < h; ++j) {  // contiguous for h >= 8: vectorized
        const float a = lo[j], c = hi[j];
        lo[j] = a + c;
        hi[j] = a - c;
      }
    }
  }
}

// x[j] *= scale * (sign bit j of the block's stream ? -1 : 1).
void signs(float* x, int64_t b, RngKey key, float scale) {
  for (int64_t j = 0; j < b; j += 32) {
    const uint32_t bits = rng_bits(key, uint64_t(j >> 5));
    const int64_t end = std::min<int64_t>(32, b - j);
    for (int64_t k = 0; k < end; ++k) {
      x[j + k] *= ((bits >> k) & 1u) ? -scale : scale;
    }
  }
}

// The scale commutes with H, so it rides on the sign pass: two passes per block either way.
void one_block(float* x, int64_t b, RngKey key, float scale, bool forward) {
  if (forward) {
    signs(x, b, key, scale);
    hadamard(x, b);
  } else {
    hadamard(x, b);
    signs(x, b, key, scale);
  }
}

}  // namespace

bool valid_block(int64_t block) {
  return block >= kMinBlock && block <= kMaxBlock && (block & (block - 1)) == 0;
}

void rotate(float* x, int64_t n, int64_t block, uint64_t seed, bool forward) {
  CGX_CHECK_ARG(valid_block(block), "rotation block must be a power of two in [", kMinBlock, ", ",
                kMaxBlock, "], got ", block);
  CGX_CHECK_ARG(n >= 0 && n % block == 0, "rotation: ", n,
                " values are not a multiple of the block (", block, ")");
  const int64_t blocks = n / block;
  const float scale = float(1.0 / std::sqrt(double(block)));
  // Tasks of at least 64 Ki values, so that small tensors stay on the caller's thread.
  const int64_t per_task = std::max<int64_t>(1, (int64_t(1) << 16) / block);
  const int64_t tasks = (blocks + per_task - 1) / per_task;
  auto run = [&](int64_t t) {
    const int64_t end = std::min(blocks, (t + 1) * per_task);
    for (int64_t k = t * per_task; k < end; ++k) {
      one_block(x + k * block, block, rng_key(seed, uint64_t(k)), scale, forward);
    }
  };
  if (tasks <= 1) {
    if (tasks == 1) run(0);
    return;
  }
  parallel_for(tasks, run);
}

}  // namespace cgx::rotation
