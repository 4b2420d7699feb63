// The fused level-quantizer (and bucketed sign) kernels' building blocks
// (csrc/cuda/levels_device.h), run on the host in the kernels' decomposition (levels_cuda.cu: eight
// lanes per bucket combined by an xor butterfly, one work item per group of eight codes, one per
// decoded element), must give the native qsgd / terngrad / onebit / efsignsgd / signsgd / signum /
// tbq compressors' bytes and decoded values. Needs no GPU and no CUDA toolkit; the GPU runs the
// same functions (tests/test_device_kernels_levels.py checks the kernels themselves against the
// reference where a device exists).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "compressors/registry.h"
#include "core/dtype.h"
#include "core/primitives.h"
#include "cuda/levels_device.h"

namespace cgx {
namespace {

namespace lv = cuda::lv;

struct Case {
  int kind;  // lv::Kind
  int bits;
  float clip;  // terngrad's clip, tbq's tau
  int64_t bucket;
};

std::string describe(const Case& c, int64_t n, DType t) {
  const char* names[7] = {"qsgd", "terngrad", "onebit", "efsignsgd", "signsgd", "signum", "tbq"};
  return std::string(names[c.kind]) + " bits=" + std::to_string(c.bits) +
         " clip=" + std::to_string(c.clip) + " bucket=" + std::to_string(c.bucket) +
         " n=" + std::to_string(n) + " dtype=" + std::to_string(int(t));
}

// Values over six decades, bucket by bucket (spacing 37), with a zero run, and optionally a NaN
// and an Inf in two places.
std::vector<uint8_t> make_input(int64_t n, DType t, uint32_t seed, bool specials) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> normal;
  std::vector<uint8_t> raw(size_t(n) * elem_size(t));
  for (int64_t i = 0; i < n; ++i) {
    float v = normal(gen) * std::pow(10.0f, float((i / 37) % 7) - 3.0f);
    if ((i / 37) % 11 == 5) v = 0.0f;
    if (specials && i == n / 3) v = NAN;
    if (specials && i == (2 * n) / 3 + 1) v = -INFINITY;
    store_from_float(raw.data(), t, i, v);
  }
  return raw;
}

// levels_cuda.cu's encode (envelope, scalars kernel, codes kernel), one work item at a time.
std::vector<uint8_t> emulate_encode(const Case& c, const std::vector<uint8_t>& in, DType t,
                                    int64_t n, uint64_t seed, uint64_t stream) {
  const lv::Params p = lv::make_params(c.kind, c.bits, c.clip, n, c.bucket, seed, stream);
  std::vector<uint8_t> out(32 + p.body, 0xAB);  // poison: every byte must be written
  lv::write_envelope(p, int(uint8_t(t)), uint32_t(c.bucket), out.data());
  EXPECT_EQ(p.buckets == 0, n == 0 || !lv::has_buckets(c.kind));
  for (int64_t b = 0; b < p.buckets; ++b) {
    const int64_t lo = b * p.bucket, hi = std::min(n, lo + p.bucket);
    lv::Lane lanes[lv::kLanes];
    for (int j = 0; j < lv::kLanes; ++j) {
      lanes[j] = lv::lane_init();
      for (int64_t i = lo + j; i < hi; i += lv::kLanes) {
        lv::lane_add(lanes[j], load_as_float(in.data(), t, i));
      }
    }
    for (int offset = 1; offset < lv::kLanes; offset <<= 1) {  // __shfl_xor_sync rounds
      lv::Lane next[lv::kLanes];
      for (int j = 0; j < lv::kLanes; ++j) next[j] = lv::lane_merge(lanes[j], lanes[j ^ offset]);
      std::copy(next, next + lv::kLanes, lanes);
    }
    for (int j = 1; j < lv::kLanes; ++j) {  // every thread of the group agrees
      EXPECT_EQ(std::memcmp(&lanes[j].sq, &lanes[0].sq, 8), 0);
    }
    // the fp64 sums themselves are prim::stats' (the f32 scalars alone would hide most order
    // changes), and so is the count of negatives
    const prim::RangeStats st = prim::stats(in.data(), t, lo, hi);
    EXPECT_EQ(std::memcmp(&lanes[0].sq, &st.sq_sum, 8), 0) << "bucket " << b << " of n=" << n;
    if (!std::isnan(st.sum)) {
      EXPECT_EQ(std::memcmp(&lanes[0].sum, &st.sum, 8), 0) << "bucket " << b << " of n=" << n;
      EXPECT_EQ(std::memcmp(&lanes[0].abs, &st.abs_sum, 8), 0) << "bucket " << b;
    }
    EXPECT_EQ(lanes[0].neg, st.negatives);
    const lv::Scalars v = lv::bucket_scalars(p, lanes[0], hi - lo);
    std::memcpy(out.data() + 32 + 4 * p.scalars * b, &v.s0, 4);
    if (p.scalars == 2) std::memcpy(out.data() + 32 + 4 * p.scalars * b + 4, &v.s1, 4);
  }
  uint8_t* codes = out.data() + 32 + p.codes_offset;
  for (int64_t g = 0; g < (n + 7) / 8; ++g) {
    bool nonfinite = false;  // per work item, as a thread's
    const uint64_t word = lv::group_codes(
        p, out.data() + 32, g, [&](int64_t i) { return load_as_float(in.data(), t, i); },
        nonfinite);
    for (int k = 0; k < lv::group_bytes(p, g); ++k)
      codes[g * p.bits + k] = uint8_t(word >> (8 * k));
    if (nonfinite && !lv::has_buckets(c.kind)) {  // the kernel's atomicOr on bytes 4..7
      uint32_t word4;
      std::memcpy(&word4, out.data() + 4, 4);
      word4 |= lv::kNonFiniteWord;
      std::memcpy(out.data() + 4, &word4, 4);
    }
  }
  return out;
}

// levels_cuda.cu's decode kernel, element by element.
template <DType D>
void emulate_decode_typed(const lv::Params& p, const uint8_t* payload, void* out, bool add) {
  auto* o = static_cast<typename cuda::dev::ElemIO<D>::Raw*>(out);
  for (int64_t i = 0; i < p.count; ++i) {
    lv::put<D>(o, i, lv::element_value(p, payload, i), add);
  }
}

void emulate_decode(const Case& c, const std::vector<uint8_t>& payload, int64_t n, DType t,
                    void* out, bool add) {
  const lv::Params p = lv::make_params(c.kind, c.bits, c.clip, n, c.bucket, 0, 0);
  if (t == DType::kFloat32)
    return emulate_decode_typed<DType::kFloat32>(p, payload.data(), out, add);
  if (t == DType::kFloat16)
    return emulate_decode_typed<DType::kFloat16>(p, payload.data(), out, add);
  emulate_decode_typed<DType::kBFloat16>(p, payload.data(), out, add);
}

std::unique_ptr<Compressor> native(const Case& c) {
  if (c.kind == lv::kSignSGD) return make_compressor("signsgd", {});
  if (c.kind == lv::kSignum) return make_compressor("signum", {});
  if (c.kind == lv::kTbq) return make_compressor("tbq", {{"tau", c.clip}});
  if (c.kind == lv::kOneBit) return make_compressor("onebit", {{"bucket_size", double(c.bucket)}});
  if (c.kind == lv::kEFSign) {
    return make_compressor("efsignsgd", {{"bucket_size", double(c.bucket)}});
  }
  if (c.kind == lv::kQsgd) {
    return make_compressor("qsgd", {{"bits", c.bits}, {"bucket_size", double(c.bucket)}});
  }
  return make_compressor("terngrad", {{"clip", c.clip}, {"bucket_size", double(c.bucket)}});
}

void check_case(const Case& c, int64_t n, DType t, bool specials) {
  const std::string what = describe(c, n, t) + (specials ? " with NaN / Inf" : "");
  const auto in = make_input(n, t, uint32_t(n * 7 + c.bucket), specials);
  auto comp = native(c);
  const uint64_t seed = 0x5EED + uint64_t(n), stream = 77;
  std::vector<uint8_t> want(comp->max_encoded_size(n, t));
  want.resize(
      comp->encode(in.data(), t, n, EncodeContext{seed, stream, 0}, want.data(), want.size()));
  const auto got = emulate_encode(c, in, t, n, seed, stream);
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t k = 0; k < got.size(); ++k) {
    ASSERT_EQ(int(got[k]), int(want[k])) << what << ": byte " << k << " of " << got.size();
  }
  for (bool add : {false, true}) {  // decode (add) onto the same starting values
    auto ref = make_input(n, t, 99, false), fused = ref;
    comp->decode(want.data(), want.size(), ref.data(), t, n, add);
    emulate_decode(c, want, n, t, fused.data(), add);
    ASSERT_EQ(fused, ref) << what << (add ? ": decode_add" : ": decode");
  }
}

const std::vector<int64_t> kSizes = {0, 1, 5, 8, 9, 63, 100, 513, 1000, 2049, 4103};
const std::vector<int64_t> kBuckets = {0, 1, 3, 8, 100, 512, 1000};
const DType kTypes[] = {DType::kFloat32, DType::kFloat16, DType::kBFloat16};

TEST(LevelsCudaLogic, QsgdBytesAndValuesAreTheNativeOnes) {
  for (int bits : {2, 3, 4, 5, 8}) {
    for (int64_t bucket : kBuckets) {
      for (int64_t n : kSizes) {
        for (DType t : kTypes) check_case({lv::kQsgd, bits, 0.0f, bucket}, n, t, n % 2 == 1);
      }
    }
  }
}

TEST(LevelsCudaLogic, TernGradBytesAndValuesAreTheNativeOnes) {
  for (float clip : {0.0f, 2.5f, 0.5f}) {
    for (int64_t bucket : kBuckets) {
      for (int64_t n : kSizes) {
        for (DType t : kTypes) check_case({lv::kTernGrad, 2, clip, bucket}, n, t, n % 2 == 1);
      }
    }
  }
}

TEST(LevelsCudaLogic, OneBitAndEFSignSGDBytesAndValuesAreTheNativeOnes) {
  for (int kind : {lv::kOneBit, lv::kEFSign}) {
    for (int64_t bucket : kBuckets) {
      for (int64_t n : kSizes) {
        for (DType t : kTypes) check_case({kind, 1, 0.0f, bucket}, n, t, n % 2 == 1);
      }
    }
  }
}

TEST(LevelsCudaLogic, SignSGDSignumAndTbqBytesAndValuesAreTheNativeOnes) {
  // No bucket scalars: the bucket size must change nothing; NaN / Inf set the flag.
  for (int64_t bucket : {0, 7}) {
    for (int64_t n : kSizes) {
      for (DType t : kTypes) {
        for (bool specials : {false, true}) {
          check_case({lv::kSignSGD, 1, 0.0f, bucket}, n, t, specials);
          check_case({lv::kSignum, 1, 0.0f, bucket}, n, t, specials);
          for (float tau : {1.0f, 0.37f, 1e-3f, 1e-30f}) {
            check_case({lv::kTbq, 2, tau, bucket}, n, t, specials);
          }
        }
      }
    }
  }
}

TEST(LevelsCudaLogic, TheFlagIsSetByAnyGroupAndOnlyByNonFiniteValues) {
  for (int64_t at : {0, 7, 8, 4102}) {
    for (float special : {NAN, INFINITY, -INFINITY}) {
      std::vector<uint8_t> in(4103 * 4);
      for (int64_t i = 0; i < 4103; ++i) store_from_float(in.data(), DType::kFloat32, i, 1e30f);
      store_from_float(in.data(), DType::kFloat32, at, special);
      for (int kind : {lv::kSignSGD, lv::kTbq}) {
        const auto p = emulate_encode({kind, 1, 0.5f, 0}, in, DType::kFloat32, 4103, 1, 2);
        EXPECT_EQ(p[7], 1) << "kind " << kind << " at " << at;
        std::vector<float> out(4103, 0.0f);
        emulate_decode({kind, 1, 0.5f, 0}, p, 4103, DType::kFloat32, out.data(), true);
        for (float v : out) ASSERT_TRUE(std::isnan(v));
      }
    }
  }
  std::vector<uint8_t> big(9 * 4);
  for (int64_t i = 0; i < 9; ++i) store_from_float(big.data(), DType::kFloat32, i, -3.4e38f);
  EXPECT_EQ(emulate_encode({lv::kTbq, 2, 1e-30f, 0}, big, DType::kFloat32, 9, 1, 2)[7], 0);
}

TEST(LevelsCudaLogic, LargeBucketsOfOneLaneOrder) {
  // fp64 sums over long lanes: any other summation order would change the norm's last bits.
  for (DType t : kTypes) {
    check_case({lv::kQsgd, 4, 0.0f, 0}, 100003, t, false);
    check_case({lv::kTernGrad, 2, 2.5f, 65536}, 100003, t, false);
    check_case({lv::kOneBit, 1, 0.0f, 0}, 100003, t, false);
    check_case({lv::kEFSign, 1, 0.0f, 65536}, 100003, t, false);
  }
}

TEST(LevelsCudaLogic, TernGradCode3DecodesToNaN) {
  const lv::Params p = lv::make_params(lv::kTernGrad, 2, 0.0f, 4, 0, 0, 0);
  EXPECT_TRUE(std::isnan(lv::code_value(p, 1.0f, 3)));
  EXPECT_EQ(lv::code_value(p, 1.5f, 2), -1.5f);
  EXPECT_TRUE(std::isnan(lv::code_value(p, NAN, 0)));
}

}  // namespace
}  // namespace cgx
