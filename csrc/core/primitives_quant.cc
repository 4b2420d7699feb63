// Statistics, level quantization, dtype conversion and code packing: the scalar definitions
// (the AVX2 paths in primitives_avx2.cc give the same bits and are picked at run time).
#include <cstring>

#include "primitives.h"
#include "primitives_lanes.h"

namespace cgx::prim {

namespace avx2 {  // primitives_avx2.cc; false: not handled (no AVX2 build or not fp32)
bool stats_f32(const float* x, int64_t n, detail::StatLanes& s);
bool level_codes_f32(const float* x, int64_t begin, int64_t end, const Levels& q, uint8_t* codes,
                     bool* finite);
bool convert(const void* in, DType in_t, void* out, DType out_t, int64_t n, bool add);
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

void convert(const void* in, DType in_t, void* out, DType out_t, int64_t n, bool add) {
  if (n <= 0) return;
  if (in_t == out_t && !add) {
    std::memcpy(out, in, size_t(n) * elem_size(in_t));
    return;
  }
  if (use_avx2() && avx2::convert(in, in_t, out, out_t, n, add)) return;
  for_each(in, in_t, 0, n, [&](int64_t i, float v) { put_value(out, out_t, i, v, add); });
}

void BitWriter::put_codes(const uint8_t* codes, int64_t n) {
  int64_t i = 0;
  if (used_ % 8 == 0) {
    for (; used_ > 0; used_ -= 8, acc_ >>= 8) *out_++ = uint8_t(acc_);
    for (; i + 8 <= n; i += 8) {  // eight codes of bits_ bits fill bits_ bytes exactly
      uint64_t word = 0;
      for (int j = 0; j < 8; ++j) word |= uint64_t(codes[i + j]) << (j * bits_);
      std::memcpy(out_, &word, size_t(bits_));  // little-endian hosts
      out_ += bits_;
    }
  }
  for (; i < n; ++i) put(codes[i]);
}

}  // namespace cgx::prim
