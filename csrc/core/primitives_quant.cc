// Statistics, level quantization, dtype conversion and code packing: the scalar definitions
// (the AVX2 paths in primitives_avx2.cc give the same bits and are picked at run time).
#include <algorithm>
#include <cstring>

#include "codec_kernels.h"
#include "primitives.h"
#include "primitives_lanes.h"

namespace cgx::prim {

namespace avx2 {  // primitives_avx2.cc; false: not handled (no AVX2 build or not fp32)
bool stats_f32(const float* x, int64_t n, detail::StatLanes& s);
bool level_codes_f32(const float* x, int64_t begin, int64_t end, const Levels& q, uint8_t* codes,
                     bool* finite);
bool convert(const void* in, DType in_t, void* out, DType out_t, int64_t n, bool add);
// Handles [begin, end) from `first` on (a multiple of 8) while 8 bytes can be read; returns where
// it stopped.
int64_t decode_table_f32(const uint8_t* packed, size_t stream_bytes, int bits, int64_t first,
                         int64_t end, const float* table, float* out, bool add);
}  // namespace avx2

namespace detail {

void stat_lanes(const void* in, DType t, int64_t begin, int64_t end, StatLanes& s) {
  for_each(in, t, begin, end, [&](int64_t i, float v) { s.add(int((i - begin) & 7), v); });
}

RangeStats finish(const StatLanes& s) {
  auto lanes = [](const double* l) {
    return ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
  };
  float mn = s.mn[0], mx = s.mx[0];
  for (int j = 1; j < 8; ++j) {
    mn = s.mn[j] < mn ? s.mn[j] : mn;
    mx = s.mx[j] > mx ? s.mx[j] : mx;
  }
  RangeStats r;
  r.sum = lanes(s.sum);
  r.abs_sum = lanes(s.abs);
  r.sq_sum = lanes(s.sq);
  r.negatives = s.negatives;
  r.min = s.nan ? NAN : mn;
  r.max = s.nan ? NAN : mx;
  r.abs_max = s.nan ? NAN : std::max(std::fabs(mn), std::fabs(mx));
  r.finite = !s.nan && std::isfinite(mn) && std::isfinite(mx);
  return r;
}

}  // namespace detail

RangeStats stats(const void* in, DType t, int64_t begin, int64_t end) {
  if (end <= begin) return RangeStats{};
  detail::StatLanes s;
  const bool fast = t == DType::kFloat32 && use_avx2() &&
                    avx2::stats_f32(static_cast<const float*>(in) + begin, end - begin, s);
  if (!fast) detail::stat_lanes(in, t, begin, end, s);
  return detail::finish(s);
}

bool level_codes(const void* in, DType t, int64_t begin, int64_t end, const Levels& q,
                 uint8_t* codes) {
  bool finite = true;
  if (t == DType::kFloat32 && use_avx2() &&
      avx2::level_codes_f32(static_cast<const float*>(in), begin, end, q, codes, &finite)) {
    return finite;
  }
  for_each(in, t, begin, end, [&](int64_t i, float x) {
    finite &= std::isfinite(x);
    codes[i - begin] = detail::level_code(x, q, i);
  });
  return finite;
}

void decode_table(const uint8_t* packed, size_t stream_bytes, int bits, int64_t begin, int64_t end,
                  const float* table, void* out, DType t, bool add) {
  int64_t i = begin;
  if (t == DType::kFloat32 && use_avx2()) {
    const int64_t first = std::min(end, (begin + 7) / 8 * 8);
    BitReader head(packed, bits, begin);
    write_each(out, t, begin, first, add, [&](int64_t) { return table[head.get()]; });
    i = avx2::decode_table_f32(packed, stream_bytes, bits, first, end, table,
                               static_cast<float*>(out), add);
  }
  BitReader r(packed, bits, i);
  write_each(out, t, i, end, add, [&](int64_t) { return table[r.get()]; });
}

int64_t find_code3(const uint8_t* packed, int64_t n) {
  const int64_t full = n / 4;
  for (int64_t b = 0; b < full; ++b) {
    const uint8_t v = packed[b];
    if (v & (v >> 1) & 0x55) {
      for (int j = 0; j < 4; ++j) {
        if (((v >> (2 * j)) & 3) == 3) return 4 * b + j;
      }
    }
  }
  for (int64_t i = 4 * full; i < n; ++i) {
    if (unpack_one(packed, i, 2) == 3) return i;
  }
  return -1;
}

void convert(const void* in, DType in_t, void* out, DType out_t, int64_t n, bool add) {
  if (n <= 0) return;
  if (in_t == out_t && !add) {
    std::memcpy(out, in, size_t(n) * elem_size(in_t));
    return;
  }
  if (in_t == DType::kFloat32 && out_t == DType::kFloat32) {  // add: a loop the compiler vectorizes
    const float* x = static_cast<const float*>(in);
    float* o = static_cast<float*>(out);
    for (int64_t i = 0; i < n; ++i) o[i] += x[i];
    return;
  }
  if (use_avx2() && avx2::convert(in, in_t, out, out_t, n, add)) return;
  for_each(in, in_t, 0, n, [&](int64_t i, float v) { put_value(out, out_t, i, v, add); });
}

void BitWriter::put_codes(const uint8_t* codes, int64_t n) {
  int64_t i = 0;
  if (used_ % 8 == 0) {  // byte-aligned: whole groups of eight codes through the codec's packer
    for (; used_ > 0; used_ -= 8, acc_ >>= 8) *out_++ = uint8_t(acc_);
    const int64_t groups = n / 8;
    kernels::pack_groups(codes, groups, bits_, out_);
    out_ += groups * bits_;
    i = groups * 8;
  }
  for (; i < n; ++i) put(codes[i]);
}

}  // namespace cgx::prim
