// Inner loops of the codec over a span of whole buckets. Internal to the core: codec.cc splits
// a buffer into spans (one per task) and calls these. Spans start at a bucket boundary whose
// element index is a multiple of 8, so every span's codes start on a byte boundary.
#pragma once

#include <cstdint>

#include "dtype.h"
#include "rng.h"

namespace cgx::kernels {

struct EncodeArgs {
  const void* in = nullptr;  // whole input buffer
  DType dtype = DType::kFloat32;
  int64_t begin = 0;  // first element of the span
  int64_t end = 0;    // one past the last element of the span
  int64_t bucket_size = 0;
  int bits = 0;
  bool stochastic = false;
  bool clip = false;  // CodecParams::clip
  RngKey key;
  uint8_t* meta = nullptr;   // metadata of the bucket holding `begin`
  uint8_t* codes = nullptr;  // code byte holding element `begin`
};

struct DecodeArgs {
  const uint8_t* meta = nullptr;   // metadata of the bucket holding `begin`
  const uint8_t* codes = nullptr;  // code byte holding element `begin`
  int64_t begin = 0;
  int64_t end = 0;
  int64_t bucket_size = 0;
  int bits = 0;
  void* out = nullptr;  // whole output buffer
  DType out_dtype = DType::kFloat32;
  bool add = false;
};

void encode_span(const EncodeArgs& args);
void decode_span(const DecodeArgs& args);

// Packs `groups` groups of 8 codes of `bits` bits (1..8; one code per byte of `codes`) into
// groups * bits bytes of the codec's little-endian bit stream.
void pack_groups(const uint8_t* codes, int64_t groups, int bits, uint8_t* out);

// Which instruction set the kernels run with on this machine ("avx2" or "generic").
const char* isa();

// Chooses AVX2 (when the CPU has it) or the baseline kernels; returns whether AVX2 is now used.
// Both produce the same bytes; tests and benchmarks switch to compare them.
bool set_isa(bool avx2);

}  // namespace cgx::kernels
