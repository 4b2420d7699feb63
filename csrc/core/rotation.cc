#include "rotation.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "clones.h"
#include "error.h"
#include "rng.h"
#include "thread_pool.h"

namespace cgx::rotation {
namespace {

// The three butterfly passes with h = 1, 2, 4 on each group of 8 values, written out: the
// generic loop's operations in its order (the same bits), without its 1-, 2- and 4-long loops.
inline void hadamard8(float* x, int64_t b) {
  for (int64_t i = 0; i < b; i += 8) {
    float* v = x + i;
    const float a0 = v[0] + v[1], a1 = v[0] - v[1], a2 = v[2] + v[3], a3 = v[2] - v[3];
    const float a4 = v[4] + v[5], a5 = v[4] - v[5], a6 = v[6] + v[7], a7 = v[6] - v[7];
    const float b0 = a0 + a2, b2 = a0 - a2, b1 = a1 + a3, b3 = a1 - a3;
    const float b4 = a4 + a6, b6 = a4 - a6, b5 = a5 + a7, b7 = a5 - a7;
    v[0] = b0 + b4, v[4] = b0 - b4, v[1] = b1 + b5, v[5] = b1 - b5;
    v[2] = b2 + b6, v[6] = b2 - b6, v[3] = b3 + b7, v[7] = b3 - b7;
  }
}

// The unnormalised Walsh-Hadamard transform of x[0, b), in place: log2(b) butterfly passes.
inline void hadamard(float* x, int64_t b) {
  int64_t h = 1;
  if (b >= 8) {
    hadamard8(x, b);
    h = 8;
  }
  for (; h < b; h *= 2) {
    for (int64_t i = 0; i < b; i += 2 * h) {
      float* lo = x + i;
      float* hi = x + i + h;
      for (int64_t j = 0; j < h; ++j) {  // contiguous, >= 8 long: vectorized
        const float a = lo[j], c = hi[j];
        lo[j] = a + c;
        hi[j] = a - c;
      }
    }
  }
}

// x[j] = +-x[j] * scale, the sign flipped where bit j of the block's stream is set (an XOR of
// the sign bit: the same bits as multiplying by -scale, without a branch).
inline void signs(float* x, int64_t b, RngKey key, float scale) {
  for (int64_t j = 0; j < b; j += 32) {
    const uint32_t bits = rng_bits(key, uint64_t(j >> 5));
    const int64_t end = std::min<int64_t>(32, b - j);
    for (int64_t k = 0; k < end; ++k) {
      uint32_t u;
      std::memcpy(&u, &x[j + k], 4);
      u ^= ((bits >> k) & 1u) << 31;
      float f;
      std::memcpy(&f, &u, 4);
      x[j + k] = f * scale;
    }
  }
}

}  // namespace

// Blocks [first, last) of x (external linkage: target_clones needs it), AVX2 and baseline copies
// (clones.h). The scale commutes with H, so it rides on the sign pass: two passes per block either
// way.
CGX_CLONES void rotate_blocks(float* x, int64_t first, int64_t last, int64_t b, uint64_t seed,
                              float scale, bool forward) {
  for (int64_t k = first; k < last; ++k) {
    float* block = x + k * b;
    const RngKey key = rng_key(seed, uint64_t(k));
    if (forward) {
      signs(block, b, key, scale);
      hadamard(block, b);
    } else {
      hadamard(block, b);
      signs(block, b, key, scale);
    }
  }
}

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
    rotate_blocks(x, t * per_task, std::min(blocks, (t + 1) * per_task), block, seed, scale,
                  forward);
  };
  if (tasks <= 1) {
    if (tasks == 1) run(0);
    return;
  }
  parallel_for(tasks, run);
}

}  // namespace cgx::rotation
