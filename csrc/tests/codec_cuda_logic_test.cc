// The CUDA codec's building blocks (csrc/cuda/codec_device.h), run on the host in the kernels'
// decomposition (tiles of whole buckets, a warp-shaped min / max reduction, groups of 8 codes,
// one work item per group or raw-tail element), must give the CPU codec's bytes and values. This
// needs no GPU and no CUDA toolkit: it checks the numerics, the bit layout and the index
// arithmetic of the kernels everywhere; the GPU tests (csrc/cuda/tests) check the kernels
// themselves where a device exists.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <vector>

#include "core/codec.h"
#include "core/codec_layout.h"
#include "core/rng.h"
#include "cuda/codec_device.h"
#include "tests/codec_cases.h"

namespace cgx {
namespace {

namespace dev = cuda::dev;
using testing::describe;

// The kernels' reduction shapes: one thread per bucket of <= 32 elements; else 32 lanes take
// every 32nd element, then an xor butterfly (a block reduction adds a second such level).
dev::MinMax kernel_shaped_minmax(const float* x, int64_t n) {
  if (n <= 32) {
    dev::MinMax r = dev::minmax_init();
    for (int64_t i = 0; i < n; ++i) dev::minmax_add(r, x[i]);
    return r;
  }
  dev::MinMax lanes[32];
  for (auto& l : lanes) l = dev::minmax_init();
  for (int64_t i = 0; i < n; ++i) dev::minmax_add(lanes[i % 32], x[i]);
  for (int o = 16; o > 0; o >>= 1) {
    dev::MinMax next[32];
    for (int l = 0; l < 32; ++l) next[l] = dev::minmax_merge(lanes[l], lanes[l ^ o]);
    std::copy(next, next + 32, lanes);
  }
  return lanes[0];
}

// encode_staged / encode_chunked of codec_cuda.cu, one tile after the other.
std::vector<uint8_t> emulate_encode(const std::vector<uint8_t>& in, DType dtype, int64_t n,
                                    const CodecParams& p) {
  std::vector<uint8_t> out(encoded_size(n, dtype, p), 0xAB);  // poison: every byte is written
  const bool stochastic = p.rounding == Rounding::kStochastic;
  const Layout l = make_layout(n, dtype, p.bits, p.bucket_size, p.skip_incomplete_buckets);
  const dev::Header h =
      dev::make_header(dtype, p.bits, p.bucket_size, p.skip_incomplete_buckets, stochastic, n);
  std::copy(h.bytes, h.bytes + 24, out.begin());
  const RngKey rk = rng_key(p.seed, p.stream);
  const dev::Key key{rk.k0, rk.k1};
  const dev::TilePlan plan = dev::plan_tiles(p.bucket_size);
  const int levels = (1 << p.bits) - 1;
  uint8_t* meta = out.data() + l.meta_offset;
  uint8_t* codes = out.data() + l.codes_offset;
  for (int64_t t0 = 0; t0 < l.quantized; t0 += plan.tile) {
    const int64_t m = std::min(plan.tile, l.quantized - t0);
    std::vector<float> xs(static_cast<size_t>(m));
    for (int64_t i = 0; i < m; ++i) xs[size_t(i)] = load_as_float(in.data(), dtype, t0 + i);
    const int64_t nbk = (m + p.bucket_size - 1) / p.bucket_size;
    EXPECT_LE(nbk, plan.staged ? dev::kTileBuckets : 8);
    std::vector<dev::BucketQuant> stats(static_cast<size_t>(nbk));
    for (int64_t k = 0; k < nbk; ++k) {
      const int64_t s = k * p.bucket_size;
      const int64_t e = std::min(s + p.bucket_size, m);
      stats[size_t(k)] = dev::bucket_quant(kernel_shaped_minmax(xs.data() + s, e - s), levels);
      const int64_t bucket = t0 / p.bucket_size + k;
      dev::store_u32(meta + 8 * bucket, dev::as_u32(stats[size_t(k)].mn));
      dev::store_u32(meta + 8 * bucket + 4, dev::as_u32(stats[size_t(k)].unit));
    }
    for (int64_t gi = 0; gi < (m + 7) / 8; ++gi) {
      const int cnt = int(std::min<int64_t>(8, m - 8 * gi));
      const uint64_t w =
          dev::quantize_pack8(xs.data() + 8 * gi, cnt, 8 * gi, stats.data(), p.bucket_size, p.bits,
                              stochastic, key, uint64_t(t0 + 8 * gi));
      const int nbytes = cnt == 8 ? p.bits : (cnt * p.bits + 7) / 8;
      for (int b = 0; b < nbytes; ++b) {
        codes[(t0 / 8) * p.bits + gi * p.bits + b] = uint8_t(w >> (8 * b));
      }
    }
  }
  const size_t tail = size_t(n - l.quantized) * elem_size(dtype);
  if (tail > 0) {
    std::copy(in.begin() + ptrdiff_t(size_t(l.quantized) * elem_size(dtype)),
              in.begin() + ptrdiff_t(size_t(l.quantized) * elem_size(dtype) + tail),
              out.begin() + ptrdiff_t(l.tail_offset));
  }
  return out;
}

template <DType D>
void emulate_store(std::vector<uint8_t>& out, int64_t i, float v, bool add) {
  using IO = dev::ElemIO<D>;
  typename IO::Raw r;
  std::memcpy(&r, out.data() + size_t(i) * sizeof r, sizeof r);
  if (add) v = dev::fadd(IO::to_float(r), v);
  r = IO::from_float(v);
  std::memcpy(out.data() + size_t(i) * sizeof r, &r, sizeof r);
}

void emulate_store(std::vector<uint8_t>& out, DType d, int64_t i, float v, bool add) {
  switch (d) {
    case DType::kFloat32:
      return emulate_store<DType::kFloat32>(out, i, v, add);
    case DType::kFloat16:
      return emulate_store<DType::kFloat16>(out, i, v, add);
    case DType::kBFloat16:
      return emulate_store<DType::kBFloat16>(out, i, v, add);
  }
}

// decode_kernel of codec_cuda.cu; returns the error flag it would set.
uint32_t emulate_decode(const std::vector<uint8_t>& payload, const PayloadInfo& expected,
                        std::vector<uint8_t>& out, DType out_dtype, bool add) {
  const dev::Header want = dev::make_header(expected.dtype, expected.bits, expected.bucket_size,
                                            expected.raw_tail, expected.stochastic, expected.count);
  const uint32_t bad = dev::header_mismatch(payload.data(), want);
  if (bad != 0) return bad;
  const Layout l = make_layout(expected.count, expected.dtype, expected.bits, expected.bucket_size,
                               expected.raw_tail);
  const int64_t groups = (l.quantized + 7) / 8;
  const int64_t total = groups + (l.count - l.quantized);
  for (int64_t item = 0; item < total; ++item) {
    if (item < groups) {
      const int64_t i0 = 8 * item;
      const int cnt = int(std::min<int64_t>(8, l.quantized - i0));
      const int nbytes = cnt == 8 ? expected.bits : (cnt * expected.bits + 7) / 8;
      const uint64_t w =
          dev::load_le(payload.data() + l.codes_offset + size_t(item * expected.bits), nbytes);
      float v[8];
      dev::dequant8(w, cnt, i0, payload.data() + l.meta_offset, expected.bucket_size, expected.bits,
                    v);
      for (int j = 0; j < cnt; ++j) emulate_store(out, out_dtype, i0 + j, v[j], add);
    } else {
      const int64_t j = item - groups;
      const float v = dev::load_tail(payload.data() + l.tail_offset, expected.dtype, j);
      emulate_store(out, out_dtype, l.quantized + j, v, add);
    }
  }
  return 0;
}

PayloadInfo info_of(DType dtype, int64_t n, const CodecParams& p) {
  PayloadInfo info;
  info.dtype = dtype;
  info.bits = p.bits;
  info.bucket_size = p.bucket_size;
  info.raw_tail = p.skip_incomplete_buckets;
  info.stochastic = p.rounding == Rounding::kStochastic;
  info.count = n;
  return info;
}

// Encode (both roundings) and, for nearest rounding, decode and decode_add into the given
// output dtypes.
void check_case(const std::vector<uint8_t>& in, DType dtype, int64_t n, CodecParams p,
                std::vector<DType> out_dtypes = {DType::kFloat32, DType::kFloat16,
                                                 DType::kBFloat16}) {
  for (auto rounding : {Rounding::kNearest, Rounding::kStochastic}) {
    p.rounding = rounding;
    p.seed = 42;
    p.stream = uint64_t(n);
    const auto want = testing::cpu_encode(in, dtype, n, p);
    const auto got = emulate_encode(in, dtype, n, p);
    ASSERT_EQ(got.size(), want.size());
    const auto diff = std::mismatch(got.begin(), got.end(), want.begin());
    ASSERT_TRUE(diff.first == got.end())
        << describe("encode", n, dtype, p) << ": first differing byte "
        << (diff.first - got.begin()) << " of " << got.size();
  }
  p.rounding = Rounding::kNearest;
  const auto payload = testing::cpu_encode(in, dtype, n, p);
  for (DType od : out_dtypes) {
    for (bool add : {false, true}) {
      std::vector<uint8_t> want = testing::accumulator(n, od);
      std::vector<uint8_t> got = want;
      if (add) {
        decode_add(payload.data(), payload.size(), want.data(), od, n);
      } else {
        decode(payload.data(), payload.size(), want.data(), od, n);
      }
      ASSERT_EQ(emulate_decode(payload, info_of(dtype, n, p), got, od, add), 0u);
      ASSERT_EQ(testing::first_difference(got, want, od), -1)
          << describe(add ? "decode_add" : "decode", n, dtype, p) << " into " << dtype_name(od);
    }
  }
}

TEST(CodecCudaLogic, PropertyMatrixMatchesCpu) {
  size_t cases = 0;
  testing::for_each_property_case(
      [&cases](const std::vector<uint8_t>& in, DType dtype, int64_t n, const CodecParams& p) {
        ++cases;
        // Each case decodes into one output dtype, in turn: all pairs are covered.
        const int turn = p.bits + int(p.skip_incomplete_buckets) + int(p.bucket_size % 3);
        check_case(in, dtype, n, p, {testing::kDTypes[turn % 3]});
        return !::testing::Test::HasFatalFailure();
      });
  EXPECT_EQ(cases,
            3 * 8 * 2 * testing::property_sizes().size() * testing::property_buckets().size());
}

TEST(CodecCudaLogic, LargeBucketsMatchCpu) {
  for (int64_t bucket : testing::large_buckets()) {
    for (int64_t n : {int64_t(4099), int64_t(70001), int64_t(120011)}) {
      for (int bits : {1, 3, 4, 8}) {
        const DType dtype = bits == 3 ? DType::kBFloat16 : DType::kFloat32;
        const auto in = testing::random_input(n, dtype, uint32_t(bucket + bits));
        CodecParams p;
        p.bits = bits;
        p.bucket_size = bucket;
        p.skip_incomplete_buckets = bits == 8;
        check_case(in, dtype, n, p, {testing::kDTypes[(bits + n) % 3]});
        if (::testing::Test::HasFatalFailure()) return;
      }
    }
  }
}

TEST(CodecCudaLogic, ExtremeValuesMatchCpu) {
  const auto x = testing::extreme_values();
  for (DType dtype : testing::kDTypes) {
    const auto in = testing::to_dtype(x, dtype);
    for (int bits = 1; bits <= 8; ++bits) {
      for (int64_t bucket : {1, 2, 4, 5}) {
        CodecParams p;
        p.bits = bits;
        p.bucket_size = bucket;
        check_case(in, dtype, int64_t(x.size()), p);
        if (::testing::Test::HasFatalFailure()) return;
      }
    }
  }
}

TEST(CodecCudaLogic, GeneratorAndConversionsMatchCpu) {
  // Element indices past 2^32 (the generator's high word) and every fp16 / bf16 pattern; fp32
  // patterns in a stride over all 2^32 plus the rounding edges of fp16.
  const RngKey rk = rng_key(123, 456);
  const dev::Key key{rk.k0, rk.k1};
  std::mt19937_64 gen(1);
  for (int i = 0; i < 100000; ++i) {
    const uint64_t index = i < 1000 ? uint64_t(i) : gen() >> (gen() % 40);
    ASSERT_EQ(dev::uniform(key, index), rng_uniform(rk, index)) << index;
  }
  for (uint32_t h = 0; h < 0x10000; ++h) {
    ASSERT_EQ(dev::as_u32(dev::half_to_float(uint16_t(h))), float_bits(half_to_float(uint16_t(h))))
        << h;
    ASSERT_EQ(dev::as_u32(dev::bf16_to_float(uint16_t(h))), float_bits(bf16_to_float(uint16_t(h))))
        << h;
  }
  std::vector<uint32_t> patterns = {0x477ff000u, 0x477fefffu, 0x38800000u, 0x387fffffu,
                                    0x33000000u, 0x33000001u, 0x7f800000u, 0x7fc00001u};
  for (uint64_t u = 0; u < (uint64_t(1) << 32); u += 4093) patterns.push_back(uint32_t(u));
  for (uint32_t u : patterns) {
    for (uint32_t v : {u, u | 0x80000000u}) {
      ASSERT_EQ(dev::float_to_half(bits_float(v)), float_to_half(bits_float(v))) << v;
      ASSERT_EQ(dev::float_to_bf16(bits_float(v)), float_to_bf16(bits_float(v))) << v;
    }
  }
}

TEST(CodecCudaLogic, TilePlan) {
  for (int64_t b = 1; b <= 20000; b += (b < 300 ? 1 : 37)) {
    const dev::TilePlan t = dev::plan_tiles(b);
    ASSERT_EQ(t.tile % 8, 0) << b;
    ASSERT_EQ(t.tile % b, 0) << b;
    if (t.staged) {
      ASSERT_LE(t.tile, dev::kTileElems) << b;
      ASSERT_LE(t.tile / b, dev::kTileBuckets) << b;
      ASSERT_LE(b, dev::kTileElems) << b;
    } else {
      ASSERT_LE(t.tile / b, 8) << b;
      ASSERT_GT(t.tile, dev::kTileElems) << b;
    }
  }
  EXPECT_EQ(dev::plan_tiles(512).tile, 4096);
  EXPECT_EQ(dev::plan_tiles(1).tile, 512);  // 512 buckets per tile
  EXPECT_EQ(dev::plan_tiles(uint32_t(-1)).tile, 8 * int64_t(uint32_t(-1)));
}

TEST(CodecCudaLogic, HeaderMismatchNamesEachField) {
  CodecParams p;
  p.bits = 4;
  p.bucket_size = 100;
  const auto payload = testing::cpu_encode(testing::random_input(300, DType::kBFloat16, 1),
                                           DType::kBFloat16, 300, p);
  const dev::Header h = dev::make_header(DType::kBFloat16, 4, 100, false, false, 300);
  EXPECT_TRUE(std::equal(h.bytes, h.bytes + 24, payload.begin()));
  EXPECT_EQ(dev::header_mismatch(payload.data(), h), 0u);
  // The stochastic flag is informational.
  EXPECT_EQ(dev::header_mismatch(payload.data(),
                                 dev::make_header(DType::kBFloat16, 4, 100, false, true, 300)),
            0u);
  const struct {
    int byte;
    uint32_t flag;
  } fields[] = {{0, cuda::kErrMagic},      {3, cuda::kErrMagic},       {4, cuda::kErrVersion},
                {5, cuda::kErrDType},      {6, cuda::kErrBits},        {7, cuda::kErrFlags},
                {8, cuda::kErrBucketSize}, {11, cuda::kErrBucketSize}, {12, cuda::kErrReserved},
                {15, cuda::kErrReserved},  {16, cuda::kErrCount},      {23, cuda::kErrCount}};
  for (const auto& f : fields) {
    auto bad = payload;
    bad[size_t(f.byte)] ^= 0x01;
    EXPECT_EQ(dev::header_mismatch(bad.data(), h), f.flag) << "byte " << f.byte;
  }
  auto two = payload;
  two[6] = 5;
  two[16] = 1;
  EXPECT_EQ(dev::header_mismatch(two.data(), h), cuda::kErrBits | cuda::kErrCount);
}

}  // namespace
}  // namespace cgx
