#include "codec.h"

#include <algorithm>
#include <cstring>
#include <numeric>

#include "codec_kernels.h"
#include "codec_layout.h"
#include "error.h"
#include "rng.h"
#include "thread_pool.h"

namespace cgx {
namespace {

constexpr uint8_t kMagic[4] = {'C', 'G', 'X', 'Q'};
constexpr uint8_t kVersion = 1;
constexpr uint8_t kFlagRawTail = 1;
constexpr uint8_t kFlagStochastic = 2;
constexpr uint8_t kFlagClipped = 4;
constexpr int64_t kSpanTarget = int64_t(1) << 18;  // elements per parallel task

template <typename T>
void put(uint8_t* p, T v) {
  std::memcpy(p, &v, sizeof v);  // little-endian hosts only (checked in codec_layout tests)
}

template <typename T>
T get(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// Spans of whole buckets, each starting at an element index that is a multiple of 8.
int64_t span_elements(int64_t bucket_size, int64_t quantized) {
  const int64_t step = bucket_size * (8 / std::gcd<int64_t>(bucket_size, 8));
  int64_t per_thread = (quantized + num_threads() - 1) / num_threads();
  int64_t target = std::max(kSpanTarget, std::min(per_thread, 4 * kSpanTarget));
  return std::max<int64_t>(1, target / step) * step;
}

void check_count(int64_t count) {
  CGX_CHECK_ARG(count >= 0 && count <= kMaxCount, "element count must be in [0, 2^48], got ",
                count);
}

void decode_impl(const uint8_t* payload, size_t size, void* out, DType out_dtype, int64_t count,
                 bool add) {
  const PayloadInfo info = inspect(payload, size);
  CGX_CHECK_ARG(info.count == count, "payload holds ", info.count, " elements but the output has ",
                count);
  CGX_CHECK_ARG(out != nullptr || count == 0, "output buffer is null");
  const Layout l = make_layout(count, info.dtype, info.bits, info.bucket_size, info.raw_tail);
  const int64_t span = span_elements(info.bucket_size, l.quantized);
  const int64_t tasks = (l.quantized + span - 1) / span;
  parallel_for(tasks, [&](int64_t t) {
    kernels::DecodeArgs a;
    a.begin = t * span;
    a.end = std::min(l.quantized, a.begin + span);
    a.meta = payload + l.meta_offset + size_t(a.begin / info.bucket_size) * 8;
    a.codes = payload + l.codes_offset + size_t(a.begin / 8 * info.bits);
    a.bucket_size = info.bucket_size;
    a.bits = info.bits;
    a.out = out;
    a.out_dtype = out_dtype;
    a.add = add;
    kernels::decode_span(a);
  });
  const uint8_t* tail = payload + l.tail_offset;
  for (int64_t i = l.quantized; i < count; ++i) {
    float v = load_as_float(tail, info.dtype, i - l.quantized);
    if (add) v = load_as_float(out, out_dtype, i) + v;
    store_from_float(out, out_dtype, i, v);
  }
}

}  // namespace

void validate(const CodecParams& p) {
  CGX_CHECK_ARG(p.bits >= 1 && p.bits <= 8, "bits must be in [1, 8], got ", p.bits);
  CGX_CHECK_ARG(p.bucket_size >= 1 && p.bucket_size <= int64_t(UINT32_MAX),
                "bucket_size must be in [1, 2^32 - 1], got ", p.bucket_size);
}

size_t encoded_size(int64_t count, DType dtype, const CodecParams& params) {
  validate(params);
  check_count(count);
  return make_layout(count, dtype, params.bits, params.bucket_size, params.skip_incomplete_buckets)
      .total;
}

void encode(const void* in, DType dtype, int64_t count, const CodecParams& params, uint8_t* out,
            size_t out_size) {
  const size_t need = encoded_size(count, dtype, params);
  CGX_CHECK_ARG(out_size == need, "encode needs an output of exactly ", need, " bytes, got ",
                out_size);
  CGX_CHECK_ARG(in != nullptr || count == 0, "input buffer is null");
  const bool stochastic = params.rounding == Rounding::kStochastic;
  std::memcpy(out, kMagic, 4);
  out[4] = kVersion;
  out[5] = uint8_t(dtype);
  out[6] = uint8_t(params.bits);
  out[7] = uint8_t((params.skip_incomplete_buckets ? kFlagRawTail : 0) |
                   (stochastic ? kFlagStochastic : 0) | (params.clip ? kFlagClipped : 0));
  put<uint32_t>(out + 8, uint32_t(params.bucket_size));
  put<uint32_t>(out + 12, 0);
  put<uint64_t>(out + 16, uint64_t(count));

  const Layout l =
      make_layout(count, dtype, params.bits, params.bucket_size, params.skip_incomplete_buckets);
  const RngKey key = rng_key(params.seed, params.stream);
  const int64_t span = span_elements(params.bucket_size, l.quantized);
  const int64_t tasks = (l.quantized + span - 1) / span;
  parallel_for(tasks, [&](int64_t t) {
    kernels::EncodeArgs a;
    a.in = in;
    a.dtype = dtype;
    a.begin = t * span;
    a.end = std::min(l.quantized, a.begin + span);
    a.bucket_size = params.bucket_size;
    a.bits = params.bits;
    a.stochastic = stochastic;
    a.clip = params.clip;
    a.key = key;
    a.meta = out + l.meta_offset + size_t(a.begin / params.bucket_size) * 8;
    a.codes = out + l.codes_offset + size_t(a.begin / 8 * params.bits);
    kernels::encode_span(a);
  });
  const size_t tail_bytes = size_t(count - l.quantized) * elem_size(dtype);
  if (tail_bytes > 0) {
    std::memcpy(out + l.tail_offset,
                static_cast<const uint8_t*>(in) + size_t(l.quantized) * elem_size(dtype),
                tail_bytes);
  }
}

PayloadInfo inspect(const uint8_t* payload, size_t size) {
  CGX_CHECK_ARG(payload != nullptr || size == 0, "payload is null");
  CGX_CHECK_ARG(size >= kHeaderBytes, "payload truncated: ", size,
                " bytes is shorter than the 24-byte header");
  CGX_CHECK_ARG(std::memcmp(payload, kMagic, 4) == 0,
                "payload corrupt: bad magic (not a torch_cgx max-min payload)");
  CGX_CHECK_ARG(payload[4] == kVersion, "payload has format version ", int(payload[4]),
                ", this build reads version ", int(kVersion));
  CGX_CHECK_ARG(payload[5] < kNumDTypes, "payload corrupt: unknown dtype code ", int(payload[5]));
  CGX_CHECK_ARG(payload[6] >= 1 && payload[6] <= 8, "payload corrupt: bits ", int(payload[6]),
                " not in [1, 8]");
  CGX_CHECK_ARG((payload[7] & ~(kFlagRawTail | kFlagStochastic | kFlagClipped)) == 0,
                "payload corrupt: unknown flags 0x", Hex{payload[7]});
  CGX_CHECK_ARG(get<uint32_t>(payload + 12) == 0, "payload corrupt: reserved field is not 0");
  PayloadInfo info;
  info.dtype = DType(payload[5]);
  info.bits = payload[6];
  info.raw_tail = payload[7] & kFlagRawTail;
  info.stochastic = payload[7] & kFlagStochastic;
  info.clipped = payload[7] & kFlagClipped;
  info.bucket_size = get<uint32_t>(payload + 8);
  CGX_CHECK_ARG(info.bucket_size >= 1, "payload corrupt: bucket size 0");
  const uint64_t count = get<uint64_t>(payload + 16);
  CGX_CHECK_ARG(count <= uint64_t(kMaxCount), "payload corrupt: element count ", count,
                " exceeds 2^48");
  info.count = int64_t(count);
  const size_t need =
      make_layout(info.count, info.dtype, info.bits, info.bucket_size, info.raw_tail).total;
  CGX_CHECK_ARG(size >= need, "payload truncated: header describes ", need, " bytes, got ", size);
  CGX_CHECK_ARG(size == need, "payload has ", size - need, " trailing bytes after the ", need,
                " its header describes");
  return info;
}

void decode(const uint8_t* payload, size_t size, void* out, DType out_dtype, int64_t count) {
  decode_impl(payload, size, out, out_dtype, count, false);
}

void decode_add(const uint8_t* payload, size_t size, void* out, DType out_dtype, int64_t count) {
  decode_impl(payload, size, out, out_dtype, count, true);
}

}  // namespace cgx
