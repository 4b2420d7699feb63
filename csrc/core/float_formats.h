// The MX float formats' blocks (OCP Microscaling v1.0: MXFP8, MXFP6, MXFP4), the native fast path
// of torch_cgx/compressors/floats.py on CPU: the same body bytes as its tensor operations
// (docs/FORMAT.md, "Float formats"), which check this path at first use.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/rng.h"

namespace cgx::floats {

// An element format: exponent / mantissa bits, bias, largest finite value, OCP's emax.
struct Element {
  int ebits = 2;
  int mbits = 1;
  int bias = 1;
  float max = 6.0f;
  int emax = 2;
  int special = 0;  // 1: the all-ones code is NaN (E4M3); 2: the top exponent is Inf / NaN (E5M2)
  int bits() const { return 1 + ebits + mbits; }
};

// The code (sign bit highest) of the scaled value v: nearest even (u < 0) or floor(|v| / q + u)
// for the quantum q of |v|'s binade; saturating at the largest value; NaN gives the largest code.
uint32_t quantize(float v, const Element& e, float u);

// The value of a code, the special codes included (quantize writes none of them).
float value(uint32_t code, const Element& e);

// The E8M0 scale of a block whose largest magnitude is amax (255: NaN, for Inf / NaN);
// `stochastic`: one higher where FLOOR's would saturate.
uint8_t mx_scale(float amax, const Element& e, bool stochastic);
float mx_scale_value(uint8_t biased);  // NaN for 255, else at least 2^-126

size_t mx_body_bytes(int64_t n, const Element& e, int64_t block);

// Blocks [first, last) of the n values x into the body `out` (mx_body_bytes(n) bytes: the
// scales, then the elements' bit stream); the stream of block b starts at bit b * block * bits,
// a whole byte for blocks of 32. `stochastic`: draws rng_uniform(key, i) for value i.
void mx_encode(const float* x, int64_t n, const Element& e, int64_t block, bool stochastic,
               RngKey key, int64_t first, int64_t last, uint8_t* out);
// out[i] (+)= the decoded value i, for the blocks [first, last).
void mx_decode(const uint8_t* body, int64_t n, const Element& e, int64_t block, int64_t first,
               int64_t last, float* out, bool add);

}  // namespace cgx::floats
