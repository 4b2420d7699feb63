// Seeded random rotation of blocks (THC, SDP4Bit): y = H D x / sqrt(B) for every block of B = 2^k
// consecutive values, H the B x B Walsh-Hadamard matrix (Sylvester order), D a diagonal of random
// signs drawn from (seed, block index, position). The rotation is orthogonal, so its inverse is
// x = D H y / sqrt(B); it spreads one large value of a block over all B values, which shrinks the
// block's max-min range and with it the quantization step. Linear: the sum of rotated vectors is
// the rotated sum, so ranks that rotate with one seed can reduce in the rotated domain.
//
// Cost: B log2(B) additions per block (the fast transform) and one pass for the signs and the
// scale. Deterministic: the same input and seed give the same bits on any thread count.
#pragma once

#include <cstdint>

namespace cgx::rotation {

// Smallest and largest block: powers of two in [2, 2^20].
constexpr int64_t kMinBlock = 2;
constexpr int64_t kMaxBlock = int64_t(1) << 20;

bool valid_block(int64_t block);

// In place over x[0, n): n a multiple of `block`, `block` valid (InvalidArgument otherwise).
// forward: y = H D x / sqrt(B); inverse (forward = false): x = D H y / sqrt(B).
void rotate(float* x, int64_t n, int64_t block, uint64_t seed, bool forward);

}  // namespace cgx::rotation
