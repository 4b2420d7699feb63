// Inputs and comparisons shared by the tests that hold another implementation of the codec to
// the CPU one: the host run of the CUDA building blocks (codec_cuda_logic_test.cc) and the GPU
// tests (csrc/cuda/tests/codec_cuda_test.cc).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "core/codec.h"
#include "core/dtype.h"

namespace cgx::testing {

// The property matrix of codec_property_test.cc.
inline const std::vector<int64_t>& property_sizes() {
  static const std::vector<int64_t> v = {0, 1, 7, 8, 9, 100, 511, 512, 513, 1000, 4099, 70001};
  return v;
}
inline const std::vector<int64_t>& property_buckets() {
  static const std::vector<int64_t> v = {1, 3, 8, 100, 512, 1024};
  return v;
}
// Bucket sizes whose lcm with 8 exceeds the CUDA encoder's staged tile (4096 elements), so that
// it takes its chunked path, plus the edges of the staged path (32 / 33: thread / warp per
// bucket; 4096: one bucket per tile).
inline const std::vector<int64_t>& large_buckets() {
  static const std::vector<int64_t> v = {32, 33, 513, 1001, 4096, 4097, 5000, 65536, 100000};
  return v;
}

constexpr DType kDTypes[] = {DType::kFloat32, DType::kFloat16, DType::kBFloat16};

// n raw elements of `dtype`: normal values (offset 1, scale 3) rounded to the dtype.
inline std::vector<uint8_t> random_input(int64_t n, DType dtype, uint32_t seed, float scale = 3.0f,
                                         float offset = 1.0f) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> d(offset, scale);
  std::vector<uint8_t> raw(size_t(n) * elem_size(dtype));
  for (int64_t i = 0; i < n; ++i) store_from_float(raw.data(), dtype, i, d(gen));
  return raw;
}

// Values that exercise every branch of docs/FORMAT.md, in buckets of 4 (bits 1..8): a range
// wider than FLT_MAX, denormals, constant buckets, signed zeros, NaN / Inf buckets, a bucket
// within a factor two of overflow (the 1-bit overflow rule), tiny and huge magnitudes.
// Calls case_fn(input, dtype, n, params) over the property matrix: dtype x bits 1..8 x
// property_sizes() x property_buckets() x raw tail off / on (nearest rounding). Stops as soon as
// case_fn returns false (the caller's test hit a fatal failure).
template <typename Fn>
void for_each_property_case(Fn&& case_fn) {
  for (DType dtype : kDTypes) {
    for (int bits = 1; bits <= 8; ++bits) {
      for (int64_t n : property_sizes()) {
        const auto in = random_input(n, dtype, uint32_t(n * 31 + bits));
        for (int64_t bucket : property_buckets()) {
          for (bool raw : {false, true}) {
            CodecParams p;
            p.bits = bits;
            p.bucket_size = bucket;
            p.skip_incomplete_buckets = raw;
            if (!case_fn(in, dtype, n, p)) return;
          }
        }
      }
    }
  }
}

inline std::vector<float> extreme_values() {
  const float nan = std::nanf("");
  const float inf = INFINITY;
  return {-3e38f,   3e38f,    1e38f,    0.f,       // range > FLT_MAX
          1e-40f,   3e-41f,   -2e-42f,  7e-45f,    // denormal bucket: fp64 path
          2.5f,     2.5f,     2.5f,     2.5f,      // constant
          -0.f,     0.f,      -0.f,     0.f,       // zeros: canonical +0 minimum
          -0.f,     -0.f,     -0.f,     -0.f,      // all -0
          1.f,      nan,      2.f,      3.f,       // NaN bucket
          -inf,     1.f,      2.f,      3.f,       // Inf bucket
          -1.7e38f, 1.7e38f,  0.f,      1.f,       // range 3.4e38: 1 bit overflows the step
          1.4e-45f, 2.8e-45f, 0.f,      4.2e-45f,  // smallest denormals
          -7.f,     1e30f,    -1e30f,   5.f,       // wide but finite in fp32
          65504.f,  65520.f,  -70000.f, 1e-8f,     // fp16 edge values
          1.f,      1.f,      1.f,      1.0000001f};
}

// A decode_add accumulator of n elements of `dtype` (normal values, scale 2), cached.
inline const std::vector<uint8_t>& accumulator(int64_t n, DType dtype) {
  static std::map<std::pair<int64_t, int>, std::vector<uint8_t>> cache;
  auto& v = cache[{n, int(dtype)}];
  if (v.size() != size_t(n) * elem_size(dtype)) v = random_input(n, dtype, 7, 2.0f, 0.0f);
  return v;
}

inline std::vector<uint8_t> to_dtype(const std::vector<float>& x, DType dtype) {
  std::vector<uint8_t> raw(x.size() * elem_size(dtype));
  for (size_t i = 0; i < x.size(); ++i) store_from_float(raw.data(), dtype, int64_t(i), x[i]);
  return raw;
}

inline std::vector<uint8_t> cpu_encode(const std::vector<uint8_t>& in, DType dtype, int64_t n,
                                       const CodecParams& p) {
  std::vector<uint8_t> out(encoded_size(n, dtype, p));
  encode(in.data(), dtype, n, p, out.data(), out.size());
  return out;
}

// Index of the first element where two buffers of `dtype` differ, -1 if none. Bit equality,
// except that NaN equals NaN whatever the payload: NaN payloads are not part of the format
// (docs/gpu.md: the GPU's arithmetic makes canonical NaNs, x86 propagates payloads).
inline int64_t first_difference(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b,
                                DType dtype) {
  if (a.size() != b.size()) return 0;
  const int64_t n = int64_t(a.size() / elem_size(dtype));
  for (int64_t i = 0; i < n; ++i) {
    const size_t off = size_t(i) * elem_size(dtype);
    if (std::memcmp(a.data() + off, b.data() + off, elem_size(dtype)) == 0) continue;
    if (std::isnan(load_as_float(a.data(), dtype, i)) &&
        std::isnan(load_as_float(b.data(), dtype, i))) {
      continue;
    }
    return i;
  }
  return -1;
}

inline std::string describe(const char* what, int64_t n, DType dtype, const CodecParams& p) {
  std::ostringstream os;
  os << what << ": n " << n << " dtype " << dtype_name(dtype) << " bits " << p.bits << " bucket "
     << p.bucket_size << " raw_tail " << p.skip_incomplete_buckets
     << (p.rounding == Rounding::kStochastic ? " stochastic" : " nearest");
  return os.str();
}

}  // namespace cgx::testing
