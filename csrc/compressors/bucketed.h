// Shared by the bucketed quantizers (onebit, efsignsgd, terngrad, qsgd; tbq's codes): buckets of B
// values (B = 0: the whole tensor is one bucket), each with a few fp32 scalars, then one stream of
// packed codes. Body layout: nb * scalars * 4 bytes of f32, then packed_bytes(n, bits) bytes.
#pragma once

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>

#include "core/compressor.h"
#include "core/error.h"
#include "core/primitives.h"
#include "spans.h"

namespace cgx::bucketed {

struct Layout {
  int64_t count = 0;
  int64_t bucket = 1;   // effective bucket size (>= 1)
  int64_t buckets = 0;  // nb
  int scalars = 0;      // f32 per bucket
  int bits = 0;         // per code
  size_t codes_offset = 0;
  size_t body = 0;
};

inline Layout layout(int64_t count, int64_t bucket_size, int scalars, int bits) {
  Layout l;
  l.count = count;
  l.bucket = bucket_size == 0 ? std::max<int64_t>(count, 1) : bucket_size;
  l.buckets = (count + l.bucket - 1) / l.bucket;
  l.scalars = scalars;
  l.bits = bits;
  l.codes_offset = size_t(l.buckets) * size_t(scalars) * 4;
  l.body = l.codes_offset + prim::packed_bytes(count, bits);
  return l;
}

inline void put_f32(uint8_t* p, float v) { std::memcpy(p, &v, 4); }
inline float get_f32(const uint8_t* p) {
  float v;
  std::memcpy(&v, p, 4);
  return v;
}

// fn(bucket, begin, end) for every bucket, in order.
template <typename F>
void for_each_bucket(const Layout& l, F&& fn) {
  for (int64_t b = 0; b < l.buckets; ++b) {
    const int64_t lo = b * l.bucket;
    fn(b, lo, std::min(l.count, lo + l.bucket));
  }
}

// Checks a decoded envelope against the layout it implies; returns the layout.
inline Layout check_body(const Envelope& e, int scalars, int bits, const char* name) {
  const Layout l = layout(e.count, e.param0, scalars, bits);
  CGX_CHECK_ARG(e.body_bytes == l.body, name, " payload corrupt: body of ", e.body_bytes,
                " bytes, the header describes ", l.body);
  return l;
}

// Sign bits (1 = negative) of [0, n) into `codes`, spans of whole bytes on the codec's pool;
// returns whether every value was finite.
inline bool put_signs(const void* in, DType t, int64_t n, uint8_t* codes) {
  std::atomic<bool> finite{true};
  spans::for_each_span(n, 8, [&](int64_t lo, int64_t hi) {
    if (!prim::sign_bits_fast(spans::at(in, t, lo), t, hi - lo, codes + lo / 8)) {
      finite.store(false, std::memory_order_relaxed);
    }
  });
  return finite.load();
}

// Level codes (prim::Levels' rule) of [lo, hi) appended to w, a chunk at a time; returns whether
// every value was finite.
inline bool put_levels(const void* in, DType t, int64_t lo, int64_t hi, const prim::Levels& q,
                       prim::BitWriter& w) {
  constexpr int64_t kChunk = 2048;
  uint8_t codes[kChunk];
  bool finite = true;
  for (int64_t c = lo; c < hi; c += kChunk) {
    const int64_t e = std::min(hi, c + kChunk);
    finite &= prim::level_codes(in, t, c, e, q, codes);
    w.put_codes(codes, e - c);
  }
  return finite;
}

// Writes n zero codes to w (a bucket without a usable scale).
inline void put_zeros(int64_t n, prim::BitWriter& w) {
  static const uint8_t zeros[256] = {};
  for (int64_t c = 0; c < n; c += 256) w.put_codes(zeros, std::min<int64_t>(256, n - c));
}

// Sign-coded bodies (onebit, efsignsgd): scalars(b, stats of bucket b) for every bucket, and the
// sign bits of every value at codes_offset. Spans of whole buckets, starting at whole bytes of the
// bit stream, run on the codec's pool, each block's statistics next to its signs while in cache;
// a single bucket's statistics (one fp64 sum in order) run beside the signs of its spans.
template <typename S>
void encode_signs(const void* in, DType t, const Layout& l, uint8_t* body, S&& scalars) {
  uint8_t* codes = body + l.codes_offset;
  auto signs = [&](int64_t lo, int64_t hi) {
    prim::sign_bits_fast(spans::at(in, t, lo), t, hi - lo, codes + lo / 8);
  };
  if (l.buckets <= 1) {
    auto stats = [&] {
      if (l.buckets == 1) scalars(int64_t(0), prim::stats(in, t, 0, l.count));
    };
    return spans::beside(stats, l.count, 8, signs);
  }
  constexpr int64_t kBlock = 16384;  // values per block: 64 KiB of fp32
  const int64_t align = spans::lcm(l.bucket, 8);
  const int64_t block = std::max<int64_t>(align, kBlock / align * align);
  spans::for_each_span(l.count, align, [&](int64_t lo, int64_t hi) {
    for (int64_t b0 = lo; b0 < hi; b0 += block) {
      const int64_t b1 = std::min(hi, b0 + block);
      for (int64_t s = b0; s < b1; s += l.bucket) {
        scalars(s / l.bucket, prim::stats(in, t, s, std::min(b1, s + l.bucket)));
      }
      signs(b0, b1);
    }
  });
}

// The most buckets encode_levels hands to scales() at once.
constexpr int64_t kBlockBuckets = 1024;

// Level-coded bodies (terngrad, qsgd): scales(lo, hi, s) writes the scalars of the buckets of
// [lo, hi) (lo a bucket start, hi a bucket end) to the body and their scales to s[0..); a bucket
// whose scale is a positive finite number takes levels with q.den = s (and q.clip = s with
// clip_to_scale), the others zero codes. Spans of whole buckets, starting at whole bytes of the
// code stream, run on the codec's pool, a block of buckets at a time (its scales, then its levels
// while in cache, the level kernel fetching the next block as it goes); a single bucket's scale
// comes first, then its levels in spans.
template <typename S>
void encode_levels(const void* in, DType t, const Layout& l, uint8_t* body, const prim::Levels& q0,
                   bool clip_to_scale, S&& scales) {
  uint8_t* codes = body + l.codes_offset;
  auto bytes_at = [&](int64_t i) { return codes + size_t(i) * size_t(l.bits) / 8; };
  auto put = [&](int64_t lo, int64_t hi, float s, prim::Levels& q, prim::BitWriter& w) {
    if (!(s > 0 && std::isfinite(s))) return put_zeros(hi - lo, w);
    q.den = s;
    if (clip_to_scale) q.clip = s;
    put_levels(in, t, lo, hi, q, w);
  };
  constexpr int64_t kBlock = 8192;  // values per block (fewer when buckets are short)
  // fp32's vector kernels prefetch a block ahead, a cache line per step: spread out, that keeps
  // the next block arriving during this one's levels (qsgd, one thread: 13.8 -> 12.0 ms for 16M
  // values, against bursts of a bucket's lines per bucket, which the other paths still issue).
  const bool kernel_prefetch = t == DType::kFloat32 && prim::use_avx2();
  prim::Levels q1 = q0;
  if (kernel_prefetch) q1.ahead = kBlock;
  if (l.buckets <= 1) {
    float s = 0;
    if (l.buckets == 1) scales(int64_t(0), l.count, &s);
    return spans::for_each_span(l.count, 8, [&](int64_t lo, int64_t hi) {
      prim::Levels q = q1;
      prim::BitWriter w(bytes_at(lo), l.bits);
      put(lo, hi, s, q, w);
      w.finish();
    });
  }
  const int64_t block = std::clamp<int64_t>(kBlock / l.bucket, 1, kBlockBuckets) * l.bucket;
  spans::for_each_span(l.count, spans::lcm(l.bucket, 8), [&](int64_t lo, int64_t hi) {
    prim::Levels q = q1;
    prim::BitWriter w(bytes_at(lo), l.bits);
    float s[kBlockBuckets];
    for (int64_t b0 = lo; b0 < hi; b0 += block) {
      const int64_t b1 = std::min(hi, b0 + block);
      scales(b0, b1, s);
      for (int64_t i = b0; i < b1; i += l.bucket) {
        // Without the kernel's prefetch, the next block's values are asked for a bucket's worth
        // per bucket (a bucket as long as a block is left to the level kernel's own prefetch).
        if (block > l.bucket && !kernel_prefetch) {
          spans::prefetch(in, t, std::min(hi, i + block), std::min(hi, i + block + l.bucket));
        }
        put(i, std::min(b1, i + l.bucket), s[(i - b0) / l.bucket], q, w);
      }
    }
    w.finish();
  });
}

// out[lo, hi) (+)= table[code] for the body's codes of [lo, hi).
inline void decode_codes(const uint8_t* body, const Layout& l, int64_t lo, int64_t hi,
                         const float* table, void* out, DType t, bool add) {
  prim::decode_table(body + l.codes_offset, l.body - l.codes_offset, l.bits, lo, hi, table, out, t,
                     add);
}

// Rejects code 3 of a 2-bit stream (before anything is written).
inline void check_no_code3(const uint8_t* codes, int64_t n, const char* name) {
  const int64_t at = prim::find_code3(codes, n);
  CGX_CHECK_ARG(at < 0, name, " payload corrupt: code 3 at element ", at);
}

// Decodes a sign-coded body: value(bucket, negative) for every element.
template <typename V>
void decode_signs(const uint8_t* body, const Layout& l, void* out, DType t, bool add, V&& value) {
  for_each_bucket(l, [&](int64_t b, int64_t lo, int64_t hi) {
    prim::select_signs(body + l.codes_offset, lo, hi, value(b, true), value(b, false), out, t, add);
  });
}

}  // namespace cgx::bucketed
