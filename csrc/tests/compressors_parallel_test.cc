// The encoders that run spans on the codec's thread pool: every compressor writes the same bytes
// on 1, 2 and 3 threads, and the reworked ones write the bytes of their first, sequential version
// (kept here as the reference: prim::stats per bucket, one bit writer, prim::top_k per chunk,
// indices_at_least over the whole tensor, stats(...).finite), on inputs large enough to be cut.
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <cstring>
#include <random>

#include "compressors/bucketed.h"
#include "compressors/registry.h"
#include "compressors/sparse_common.h"
#include "core/thread_pool.h"

namespace cgx {
namespace {

using Bytes = std::vector<uint8_t>;
using Params = std::map<std::string, double>;

Bytes input(int64_t n, DType t, uint32_t seed) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d;
  Bytes b(size_t(n) * elem_size(t));
  for (int64_t i = 0; i < n; ++i) {
    float v = d(g) * float(1 + i % 5);
    if (seed % 2 && i % 100003 == 77) v = i % 3 ? NAN : INFINITY;  // one bucket / chunk each
    store_from_float(b.data(), t, i, v);
  }
  return b;
}

Bytes encode(const Compressor& c, const Bytes& x, DType t, int64_t n, int threads) {
  set_num_threads(threads);
  Bytes out(c.max_encoded_size(n, t));
  out.resize(c.encode(x.data(), t, n, EncodeContext{3, 4, 5}, out.data(), out.size()));
  return out;
}

// The payload of `name` with an envelope of these fields and `body`.
Bytes payload(const char* name, DType t, int64_t n, uint8_t flags, uint32_t p0, uint32_t p1,
              const Bytes& body) {
  Envelope e;
  e.compressor_id = compressor_entry(name).id;
  e.dtype = t;
  e.flags = flags;
  e.count = n;
  e.param0 = p0;
  e.param1 = p1;
  e.body_bytes = body.size();
  Bytes out(kEnvelopeBytes);
  write_envelope(e, out.data());
  out.insert(out.end(), body.begin(), body.end());
  return out;
}

// qsgd (bits > 0) or terngrad (bits = 0, clip) as first written.
Bytes levels_v1(const Bytes& x, DType t, int64_t n, int64_t bucket, int bits, float clip) {
  const bool qsgd = bits > 0;
  const auto l = bucketed::layout(n, bucket, 1, qsgd ? bits : 2);
  Bytes body(l.body);
  prim::BitWriter w(body.data() + l.codes_offset, l.bits);
  prim::Levels q;
  if (qsgd) {
    q.levels = (1 << (bits - 1)) - 1;
    q.num = float(q.levels);
    q.neg_add = 1u << (bits - 1);
  }
  q.stochastic = true;
  q.key = rng_key(3, 4);
  bucketed::for_each_bucket(l, [&](int64_t b, int64_t lo, int64_t hi) {
    const auto st = prim::stats(x.data(), t, lo, hi);
    float s = qsgd ? float(std::sqrt(st.sq_sum)) : st.abs_max;
    if (!qsgd && clip > 0) s = std::min(s, float(clip * std::sqrt(st.sq_sum / double(hi - lo))));
    if (!st.finite) s = NAN;
    bucketed::put_f32(body.data() + 4 * b, s);
    if (!(s > 0 && std::isfinite(s))) return bucketed::put_zeros(hi - lo, w);
    q.den = s;
    if (!qsgd) q.clip = s;
    bucketed::put_levels(x.data(), t, lo, hi, q, w);
  });
  w.finish();
  uint32_t clip_bits;
  std::memcpy(&clip_bits, &clip, 4);
  return payload(qsgd ? "qsgd" : "terngrad", t, n, 0, uint32_t(bucket),
                 qsgd ? uint32_t(bits) : clip_bits, body);
}

// onebit (two means) or efsignsgd (mean |x|) as first written.
Bytes signs_v1(const Bytes& x, DType t, int64_t n, int64_t bucket, bool onebit) {
  const auto l = bucketed::layout(n, bucket, onebit ? 2 : 1, 1);
  Bytes body(l.body);
  bucketed::for_each_bucket(l, [&](int64_t b, int64_t lo, int64_t hi) {
    const auto st = prim::stats(x.data(), t, lo, hi);
    if (onebit) {
      const int64_t nneg = st.negatives, npos = hi - lo - nneg;
      const double neg = (st.sum - st.abs_sum) / 2, pos = (st.sum + st.abs_sum) / 2;
      bucketed::put_f32(body.data() + 8 * b, !st.finite ? NAN
                                             : nneg     ? float(neg / double(nneg))
                                                        : 0.0f);
      bucketed::put_f32(body.data() + 8 * b + 4, !st.finite ? NAN
                                                 : npos     ? float(pos / double(npos))
                                                            : 0.0f);
    } else {
      bucketed::put_f32(body.data() + 4 * b, st.finite ? float(st.abs_sum / double(hi - lo)) : NAN);
    }
  });
  prim::sign_bits_fast(x.data(), t, n, body.data() + l.codes_offset);
  return payload(onebit ? "onebit" : "efsignsgd", t, n, 0, uint32_t(bucket), 0, body);
}

Bytes randomk_v1(const Bytes& x, DType t, int64_t n, double ratio) {
  const int64_t k = sparse::count_for(ratio, n);
  const RngKey key = rng_key(3, 5);
  Bytes body(size_t(k) * elem_size(t));
  sparse::gather_values(x.data(), t, prim::random_k(n, k, key), body.data());
  const bool finite = prim::stats(x.data(), t, 0, n).finite;
  return payload("randomk", t, n, finite ? 0 : 2, key.k0, key.k1, body);
}

Bytes dgc_v1(const Bytes& x, DType t, int64_t n, int64_t k, double sample_rate, const char* name) {
  const int64_t sample =
      std::max(sparse::count_for(sample_rate, n), std::min(n, sparse::kMinSample));
  const float thr = prim::sampled_threshold(x.data(), t, n, k, sample, rng_key(3, 4));
  std::vector<uint32_t> idx = prim::indices_at_least(x.data(), t, n, thr);
  if (int64_t(idx.size()) > sparse::cap_for(k, n)) idx = prim::top_k(x.data(), t, n, 2 * k);
  Bytes body(idx.size() * (4 + elem_size(t)));
  std::memcpy(body.data(), idx.data(), idx.size() * 4);
  sparse::gather_values(x.data(), t, idx, body.data() + 4 * idx.size());
  return payload(name, t, n, 0, uint32_t(idx.size()), float_bits(thr), body);
}

Bytes sparseloco_v1(const Bytes& x, DType t, int64_t n, double ratio, int64_t chunk, int bits) {
  const int64_t chunks = (n + chunk - 1) / chunk, w = chunk <= 65536 ? 2 : 4;
  Bytes scalars, idx_bytes, codes(size_t(n) + 8);
  prim::BitWriter bw(codes.data(), bits);
  int64_t kept = 0;
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t lo = c * chunk, len = std::min(chunk, n - lo);
    const auto idx =
        prim::top_k(x.data() + lo * int64_t(elem_size(t)), t, len, sparse::count_for(ratio, len));
    float mn = INFINITY, mx = 0, a = 0, d = 0;
    double sum = 0;
    bool finite = true;
    for (uint32_t i : idx) {
      const float m = std::fabs(load_as_float(x.data(), t, lo + i));
      finite &= std::isfinite(m);
      mn = std::min(mn, m), mx = std::max(mx, m), sum += double(m);
    }
    if (!idx.empty()) {
      a = !finite ? NAN : bits == 1 ? float(sum / double(idx.size())) : mn;
      d = !finite ? NAN : bits == 1 ? 0.0f : (mx - mn) / float((1 << (bits - 1)) - 1);
    }
    for (float v : {a, d}) scalars.insert(scalars.end(), (uint8_t*)&v, (uint8_t*)&v + 4);
    for (uint32_t i : idx) {
      idx_bytes.insert(idx_bytes.end(), (uint8_t*)&i, (uint8_t*)&i + w);
      const float v = load_as_float(x.data(), t, lo + i);
      uint32_t q = v < 0 ? 1u << (bits - 1) : 0u;
      if (bits > 1 && d > 0 && std::isfinite(d)) {
        const float f = std::floor((std::fabs(v) - a) / d + 0.5f);
        q |= uint32_t(std::min(std::max(f, 0.0f), float((1 << (bits - 1)) - 1)));
      }
      bw.put(q);
    }
    kept += int64_t(idx.size());
  }
  bw.finish();
  Bytes body = scalars;
  body.insert(body.end(), idx_bytes.begin(), idx_bytes.end());
  body.insert(body.end(), codes.begin(), codes.begin() + long(prim::packed_bytes(kept, bits)));
  return payload("sparseloco", t, n, 0, uint32_t(chunk), uint32_t(bits), body);
}

class Parallel : public testing::Test {
 protected:
  void SetUp() override { saved_ = num_threads(); }
  void TearDown() override { set_num_threads(saved_); }
  int saved_ = 1;
};

constexpr int64_t kN = 3 * (int64_t(1) << 17) + 13;  // above a span: cut on 2 and 3 threads

TEST_F(Parallel, EveryCompressorWritesTheSameBytesOnAnyThreadCount) {
  for (const auto& name : compressor_names()) {
    auto c = make_compressor(name);
    for (DType t : {DType::kFloat32, DType::kBFloat16}) {
      for (uint32_t seed : {1u, 2u}) {
        const Bytes x = input(kN, t, seed);
        const Bytes one = encode(*c, x, t, kN, 1);
        EXPECT_EQ(encode(*c, x, t, kN, 2), one) << name;
        EXPECT_EQ(encode(*c, x, t, kN, 3), one) << name;
      }
    }
  }
}

TEST_F(Parallel, ReworkedEncodersWriteTheirFirstVersionsBytes) {
  for (DType t : {DType::kFloat32, DType::kFloat16}) {
    for (uint32_t seed : {1u, 2u}) {
      const Bytes x = input(kN, t, seed);
      for (int threads : {1, 2, 3}) {
        auto check = [&](const char* name, const Params& p, const Bytes& want) {
          EXPECT_EQ(encode(*make_compressor(name, p), x, t, kN, threads), want)
              << name << " threads " << threads << " seed " << seed;
        };
        for (int64_t bucket : {0, 7, 512}) {
          check("qsgd", {{"bucket_size", bucket}}, levels_v1(x, t, kN, bucket, 4, 0));
          check("terngrad", {{"bucket_size", bucket}}, levels_v1(x, t, kN, bucket, 0, 0));
          check("onebit", {{"bucket_size", bucket}}, signs_v1(x, t, kN, bucket, true));
          check("efsignsgd", {{"bucket_size", bucket}}, signs_v1(x, t, kN, bucket, false));
        }
        check("qsgd", {{"bits", 8}}, levels_v1(x, t, kN, 512, 8, 0));
        check("terngrad", {{"clip", 2.5}}, levels_v1(x, t, kN, 512, 0, 2.5f));
        check("randomk", {}, randomk_v1(x, t, kN, 0.01));
        check("dgc", {}, dgc_v1(x, t, kN, sparse::count_for(0.001, kN), 0.01, "dgc"));
        check("graddrop", {}, dgc_v1(x, t, kN, sparse::count_for(1 - 0.999, kN), 0.01, "graddrop"));
        check("sparseloco", {}, sparseloco_v1(x, t, kN, 0.03, 4096, 2));
        check("sparseloco", {{"bits", 1}, {"chunk", 1000}}, sparseloco_v1(x, t, kN, 0.03, 1000, 1));
        check("sparseloco", {{"bits", 4}, {"ratio", 0.2}, {"chunk", 70000}},
              sparseloco_v1(x, t, kN, 0.2, 70000, 4));
      }
    }
  }
}

}  // namespace
}  // namespace cgx
