// The max-min codec: bucketed uniform quantization to 1..8 bits. The byte format is specified in
// docs/FORMAT.md; this header is the whole public surface of the torch-free codec.
#pragma once

#include <cstddef>
#include <cstdint>

#include "dtype.h"

namespace cgx {

enum class Rounding : uint8_t { kNearest = 0, kStochastic = 1 };

struct CodecParams {
  int bits = 4;                          // 1..8
  int64_t bucket_size = 512;             // >= 1, < 2^32
  bool skip_incomplete_buckets = false;  // send the incomplete last bucket raw
  Rounding rounding = Rounding::kNearest;
  uint64_t seed = 0;    // stochastic rounding only
  uint64_t stream = 0;  // stochastic rounding only: give every rank / call its own stream
  // Narrow each bucket's range to the Gaussian-optimal one for `bits` (mean +- a multiple of the
  // bucket's standard deviation, docs/FORMAT.md "Clipped range") where that is narrower than
  // max - min; values outside decode to the nearest end. For rotated (Gaussian-like) buckets.
  bool clip = false;
};

constexpr size_t kHeaderBytes = 24;
constexpr int64_t kMaxCount = int64_t(1) << 48;

// Throws InvalidArgument naming the bad field.
void validate(const CodecParams& params);

// Exact byte size of encode()'s output.
size_t encoded_size(int64_t count, DType dtype, const CodecParams& params);

// Encodes `count` elements of `dtype` at `in` into `out`, which must hold exactly
// encoded_size(count, dtype, params) bytes (out_size is checked).
void encode(const void* in, DType dtype, int64_t count, const CodecParams& params, uint8_t* out,
            size_t out_size);

// What a payload's header says, after full validation (see docs/FORMAT.md, "Validation").
struct PayloadInfo {
  DType dtype = DType::kFloat32;
  int bits = 0;
  int64_t bucket_size = 0;
  bool raw_tail = false;
  bool stochastic = false;
  bool clipped = false;
  int64_t count = 0;
};

PayloadInfo inspect(const uint8_t* payload, size_t size);

// Decodes into `out` (count elements of out_dtype), or adds the decoded values to it. The payload
// must describe exactly `count` elements. The work is spread over the codec's threads.
void decode(const uint8_t* payload, size_t size, void* out, DType out_dtype, int64_t count);
void decode_add(const uint8_t* payload, size_t size, void* out, DType out_dtype, int64_t count);

}  // namespace cgx
