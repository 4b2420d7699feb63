// Building blocks the compressors are written in (csrc/compressors/): packing of 1..8-bit codes,
// per-range statistics, exact and sampled selection of large magnitudes, shared random indices.
// All are deterministic: the same input gives the same bytes on every thread count and machine.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "dtype.h"
#include "rng.h"

namespace cgx::prim {

// ---- element access -------------------------------------------------------------------------

// out[i] = v, or out[i] += v computed in fp32 and rounded once to out's dtype.
inline void put_value(void* out, DType t, int64_t i, float v, bool add) {
  if (add) v += load_as_float(out, t, i);
  store_from_float(out, t, i, v);
}

// Writes zero to [0, count) of out (unless add: nothing to do).
void clear(void* out, DType t, int64_t count, bool add);

// ---- bit packing: one little-endian bit stream, code i at bits [i*b, (i+1)*b) ----------------

inline size_t packed_bytes(int64_t n, int bits) { return size_t((n * bits + 7) / 8); }
// codes[i] < 2^bits; writes packed_bytes(n, bits) bytes.
void pack(const uint8_t* codes, int64_t n, int bits, uint8_t* out);
// Code i of a packed stream.
inline uint32_t unpack_one(const uint8_t* packed, int64_t i, int bits) {
  const int64_t bit = i * bits;
  uint32_t two = packed[bit >> 3];
  if (((bit & 7) + bits) > 8) two |= uint32_t(packed[(bit >> 3) + 1]) << 8;
  return (two >> (bit & 7)) & ((1u << bits) - 1u);
}

// ---- typed loops: one switch on the dtype, then a plain loop the compiler can vectorize ------

// f(i, x_i) for i in [begin, end), x_i as float.
template <typename F>
void for_each(const void* in, DType t, int64_t begin, int64_t end, F&& f) {
  switch (t) {
    case DType::kFloat32: {
      const float* p = static_cast<const float*>(in);
      for (int64_t i = begin; i < end; ++i) f(i, p[i]);
      break;
    }
    case DType::kFloat16: {
      const uint16_t* p = static_cast<const uint16_t*>(in);
      for (int64_t i = begin; i < end; ++i) f(i, half_to_float(p[i]));
      break;
    }
    case DType::kBFloat16: {
      const uint16_t* p = static_cast<const uint16_t*>(in);
      for (int64_t i = begin; i < end; ++i) f(i, bf16_to_float(p[i]));
      break;
    }
  }
}

// out[i] = g(i) (add: out[i] += g(i), in fp32, rounded once) for i in [begin, end).
template <typename G>
void write_each(void* out, DType t, int64_t begin, int64_t end, bool add, G&& g) {
  if (t == DType::kFloat32) {
    float* p = static_cast<float*>(out);
    if (add) {
      for (int64_t i = begin; i < end; ++i) p[i] += g(i);
    } else {
      for (int64_t i = begin; i < end; ++i) p[i] = g(i);
    }
    return;
  }
  for (int64_t i = begin; i < end; ++i) put_value(out, t, i, g(i), add);
}

// Writes codes of `bits` bits as one little-endian bit stream (pack()'s layout), in order.
class BitWriter {
 public:
  BitWriter(uint8_t* out, int bits) : out_(out), bits_(bits) {}
  void put(uint32_t code) {
    acc_ |= uint64_t(code) << used_;
    used_ += bits_;
    if (used_ >= 32) {
      const uint32_t word = uint32_t(acc_);
      std::memcpy(out_, &word, 4);  // little-endian hosts (checked in codec_layout tests)
      out_ += 4;
      acc_ >>= 32;
      used_ -= 32;
    }
  }
  // put() of codes[0..n), eight at a time while the stream is byte-aligned.
  void put_codes(const uint8_t* codes, int64_t n);
  // Flushes the last partial bytes (unused high bits 0).
  void finish() {
    for (; used_ > 0; used_ = used_ > 8 ? used_ - 8 : 0, acc_ >>= 8) *out_++ = uint8_t(acc_);
  }

 private:
  uint8_t* out_;
  int bits_;
  uint64_t acc_ = 0;
  int used_ = 0;
};

// Reads the codes of a BitWriter stream in order, from code `first` on.
class BitReader {
 public:
  BitReader(const uint8_t* in, int bits, int64_t first) : in_(in), bits_(bits) {
    const int64_t bit = first * bits;
    in_ += bit >> 3;
    skip_ = int(bit & 7);
  }
  uint32_t get() {
    if (avail_ < bits_ + skip_) refill();
    const uint32_t code = uint32_t(acc_ >> skip_) & ((1u << bits_) - 1u);
    acc_ >>= skip_ + bits_;
    avail_ -= skip_ + bits_;
    skip_ = 0;
    return code;
  }

 private:
  void refill() {  // only the bytes the next code needs: never past the stream's last byte
    while (avail_ < bits_ + skip_) {
      acc_ |= uint64_t(*in_++) << avail_;
      avail_ += 8;
    }
  }
  const uint8_t* in_;
  int bits_;
  int skip_ = 0;
  uint64_t acc_ = 0;
  int avail_ = 0;
};

// The sign bits (1 = x < 0; NaN: 0) of [0, n) as a 1-bit stream; returns whether every value
// is finite. AVX2 for fp32 where the codec uses AVX2 (primitives_avx2.cc); the same bytes.
bool sign_bits_fast(const void* in, DType t, int64_t n, uint8_t* out);

// out[i] = bit i ? neg : pos (add: +=, fp32, rounded once) for i in [begin, end) of a 1-bit
// stream; AVX2 for fp32 output.
void select_signs(const uint8_t* bits, int64_t begin, int64_t end, float neg, float pos, void* out,
                  DType t, bool add);

// Whether the AVX2 kernels are in use (the codec's switch, kernels::set_isa).
bool use_avx2();

// ---- statistics over [begin, end) -----------------------------------------------------------

// Sums run in fp64 over eight lanes (element begin + 8q + j in lane j), the lanes then added as
// ((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7)): the AVX2 path (fp32 input) gives the same
// bits as the scalar one. min / max ignore NaN (reported in `finite` and as NaN min / max).
struct RangeStats {
  float min = 0, max = 0;  // NaN if any value is NaN
  float abs_max = 0;
  double sum = 0;         // sum of x
  double abs_sum = 0;     // sum of |x|
  double sq_sum = 0;      // sum of x^2
  int64_t negatives = 0;  // count of x < 0
  bool finite = true;
};
RangeStats stats(const void* in, DType t, int64_t begin, int64_t end);

// Per bucket of [begin, end) cut into buckets of `bucket` values (the last one may be shorter):
// out[b] = stats(bucket b).sq_sum, resp. .abs_max, the same bits, without the other fields (a
// range is finite exactly when its sq_sum or abs_max is: fp32 squares cannot overflow fp64).
// Four buckets at a time with AVX2 for fp32 buckets of a multiple of 8 (primitives_buckets.cc).
void sq_sums(const void* in, DType t, int64_t begin, int64_t end, int64_t bucket, double* out);
void abs_maxes(const void* in, DType t, int64_t begin, int64_t end, int64_t bucket, float* out);

// ---- quantization to levels -------------------------------------------------------------------

// The shared rule of the level quantizers (qsgd, terngrad, tbq), element i of [begin, end):
//   a = min(|x|, clip); f = floor(num * a / den + u), u = rng_uniform(key, i) or 0;
//   l = min(f, levels); code = l + (x < 0 && l > 0 ? neg_add : 0)
// in fp32, operations in that order; a NaN x gives l = levels. Writes codes[i - begin] (bytes).
struct Levels {
  float num = 1, den = 1;
  float clip = INFINITY;
  int levels = 1;        // 1..255
  uint32_t neg_add = 1;  // code offset of negative values (qsgd: the sign bit)
  bool stochastic = false;
  RngKey key;
  int64_t ahead = 256;  // the vector kernels prefetch the input this many values ahead
};
// Returns whether every value of the range is finite. AVX2 for fp32 input.
bool level_codes(const void* in, DType t, int64_t begin, int64_t end, const Levels& q,
                 uint8_t* codes);

// out[i] = table[code i] (add: +=, fp32, rounded once) for i in [begin, end) of a stream of
// `bits`-bit codes (1..8) that is `stream_bytes` long; table has 2^bits entries. AVX2 for fp32
// output.
void decode_table(const uint8_t* packed, size_t stream_bytes, int bits, int64_t begin, int64_t end,
                  const float* table, void* out, DType t, bool add);

// The index of the first code equal to 3 in a stream of n 2-bit codes, or -1.
int64_t find_code3(const uint8_t* packed, int64_t n);

// ---- dtype conversion -------------------------------------------------------------------------

// out[i] = in[i] (add: out[i] += in[i] in fp32, rounded once) for i in [0, n), converting with
// dtype.h's rules (round to nearest even); the AVX2 / F16C path gives the same bits.
void convert(const void* in, DType in_t, void* out, DType out_t, int64_t n, bool add);

// ---- selection -------------------------------------------------------------------------------

// The indices of the values with |x| >= thr (NaN counts as +Inf), ascending. AVX2 for fp32.
std::vector<uint32_t> indices_at_least(const void* in, DType t, int64_t n, float thr);

// The k indices of the largest |x| (ties: lower index first; NaN counts as largest), ascending.
std::vector<uint32_t> top_k(const void* in, DType t, int64_t n, int64_t k);

// top_k's indices (the same) into out[0..min(k, n)), reusing `scratch` (no allocation once it
// holds n values), and fast when k is small against n: for many small ranges (SparseLoCo's
// chunks). primitives_topk.cc.
struct TopKScratch {
  std::vector<uint32_t> keys, cand, cand_keys, groups;
};
void top_k_into(const void* in, DType t, int64_t n, int64_t k, TopKScratch& scratch, uint32_t* out);

// Estimate of the k-th largest |x| from a deterministic sample of about `sample` values drawn
// with `key` (DGC's sampled threshold); exact when sample >= n.
float sampled_threshold(const void* in, DType t, int64_t n, int64_t k, int64_t sample, RngKey key);

// sampled_threshold in its three steps (n > 0, k > 0), for a caller that draws parts of the
// sample on several threads: the sample's size s; m[j - j0] = the magnitude (|x|, NaN as +Inf) of
// sample value j for j in [j0, j1) of [0, s); and the sample's value of the rank that k has in n
// (m is read only).
int64_t sample_size(int64_t n, int64_t sample);
void sample_magnitudes(const void* in, DType t, int64_t n, int64_t sample, RngKey key, int64_t j0,
                       int64_t j1, float* m);
float sample_quantile(const float* m, int64_t s, int64_t n, int64_t k);

// The k-th largest (1 <= k <= s) of s magnitudes (non-negative, no NaN), exact.
float kth_largest(const float* m, int64_t s, int64_t k);

// k distinct indices of [0, n), ascending, a function of (key, n, k) only (Floyd's algorithm).
std::vector<uint32_t> random_k(int64_t n, int64_t k, RngKey key);

}  // namespace cgx::prim
