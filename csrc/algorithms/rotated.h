// The rotation lever around any allreduce (docs/accuracy.md section 4): every full bucket of the
// buffer rotated with a seeded Walsh-Hadamard transform (core/rotation.h) before the compressed
// reduction and rotated back after, the residual too. The rotation is linear and orthogonal and
// every rank uses the same seed, so the ranks may reduce in the rotated domain: the result is
// the reduction of the rotated values, rotated back; a bucket's outliers are spread over its
// values, which narrows its max-min range. The tail that fills no bucket stays as it is.
#pragma once

#include <cstdint>
#include <functional>

namespace cgx {

// The rotation's seed of one call, the same on every rank: the group's seed and the call's index
// (an agreed stream, or the count of rotated calls before it).
uint64_t rotation_seed(uint64_t group_seed, uint64_t call);

// Reduces `n` fp32 values at `data` in place; fills `residual` (n values, or null) with this
// rank's compression error, as AllreduceOptions::residual.
using Reduction = std::function<void(float* data, int64_t n, float* residual)>;

// Rotates data[0, full) (full: n rounded down to a multiple of `block`, a power of two in
// [2, 2^20]) with `seed`, runs `reduce` over all n values, and rotates data and residual back:
// the residual is then in the caller's domain, ready to be added to the next input.
void with_rotation(float* data, int64_t n, int64_t block, uint64_t seed, float* residual,
                   const Reduction& reduce);

}  // namespace cgx
