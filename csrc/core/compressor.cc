#include "compressor.h"

#include <cmath>
#include <cstring>

#include "codec.h"
#include "error.h"

namespace cgx {
namespace {

constexpr uint8_t kMagic[4] = {'C', 'G', 'X', 'C'};
constexpr uint8_t kVersion = 1;

template <typename T>
void put(uint8_t* p, T v) {
  std::memcpy(p, &v, sizeof v);
}

template <typename T>
T get(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

}  // namespace

ParamValues::ParamValues(const std::string& compressor, const std::vector<ParamSpec>& specs,
                         const std::map<std::string, double>& given) {
  for (const auto& [name, value] : given) {
    const ParamSpec* spec = nullptr;
    for (const auto& s : specs) {
      if (s.name == name) spec = &s;
    }
    if (spec == nullptr) {
      std::string known;
      for (const auto& s : specs) known += (known.empty() ? "" : ", ") + s.name;
      throw_invalid(compressor, " has no parameter '", name,
                    "' (it takes: ", known.empty() ? "none" : known, ")");
    }
    CGX_CHECK_ARG(std::isfinite(value), compressor, " parameter ", name, " must be finite");
    CGX_CHECK_ARG(!spec->integer || value == std::floor(value), compressor, " parameter ", name,
                  " must be an integer, got ", value);
    CGX_CHECK_ARG(value >= spec->min && value <= spec->max, compressor, " parameter ", name,
                  " must be in [", spec->min, ", ", spec->max, "], got ", value);
    values_[name] = value;
  }
  for (const auto& s : specs) values_.emplace(s.name, s.default_value);
}

double ParamValues::get(const std::string& name) const {
  auto it = values_.find(name);
  CGX_CHECK_ARG(it != values_.end(), "internal: no parameter ", name);
  return it->second;
}

void write_envelope(const Envelope& e, uint8_t* out) {
  std::memcpy(out, kMagic, 4);
  out[4] = kVersion;
  out[5] = uint8_t(e.dtype);
  out[6] = e.compressor_id;
  out[7] = e.flags;
  put<uint64_t>(out + 8, uint64_t(e.count));
  put<uint64_t>(out + 16, e.body_bytes);
  put<uint32_t>(out + 24, e.param0);
  put<uint32_t>(out + 28, e.param1);
}

Envelope read_envelope(const uint8_t* payload, size_t size, uint8_t expected_id,
                       const char* compressor) {
  CGX_CHECK_ARG(payload != nullptr || size == 0, "payload is null");
  CGX_CHECK_ARG(size >= kEnvelopeBytes, compressor, " payload truncated: ", size,
                " bytes is shorter than the 32-byte header");
  CGX_CHECK_ARG(std::memcmp(payload, kMagic, 4) == 0, compressor,
                " payload corrupt: bad magic (not a torch_cgx compressor payload)");
  CGX_CHECK_ARG(payload[4] == kVersion, compressor, " payload has format version ", int(payload[4]),
                ", this build reads version ", int(kVersion));
  CGX_CHECK_ARG(payload[5] < kNumDTypes, compressor, " payload corrupt: unknown dtype code ",
                int(payload[5]));
  CGX_CHECK_ARG(payload[6] == expected_id, "payload was written by compressor #", int(payload[6]),
                ", not by ", compressor);
  Envelope e;
  e.dtype = DType(payload[5]);
  e.compressor_id = payload[6];
  e.flags = payload[7];
  const uint64_t count = get<uint64_t>(payload + 8);
  CGX_CHECK_ARG(count <= uint64_t(kMaxCount), compressor, " payload corrupt: element count ", count,
                " exceeds 2^48");
  e.count = int64_t(count);
  e.body_bytes = get<uint64_t>(payload + 16);
  e.param0 = get<uint32_t>(payload + 24);
  e.param1 = get<uint32_t>(payload + 28);
  CGX_CHECK_ARG(e.body_bytes <= size - kEnvelopeBytes, compressor,
                " payload truncated: header describes ", e.body_bytes, " body bytes, got ",
                size - kEnvelopeBytes);
  CGX_CHECK_ARG(e.body_bytes == size - kEnvelopeBytes, compressor, " payload has ",
                size - kEnvelopeBytes - e.body_bytes, " trailing bytes");
  return e;
}

void check_encode_args(const void* in, int64_t count, size_t capacity, size_t need,
                       const char* compressor) {
  CGX_CHECK_ARG(count >= 0 && count <= kMaxCount, compressor,
                ": element count must be in [0, 2^48], got ", count);
  CGX_CHECK_ARG(in != nullptr || count == 0, compressor, ": input buffer is null");
  CGX_CHECK_ARG(capacity >= need, compressor, ": output holds ", capacity, " bytes, encode needs ",
                need);
}

void check_decode_target(const void* out, int64_t count, int64_t payload_count,
                         const char* compressor) {
  CGX_CHECK_ARG(payload_count == count, compressor, " payload holds ", payload_count,
                " elements but the output has ", count);
  CGX_CHECK_ARG(out != nullptr || count == 0, compressor, ": output buffer is null");
}

Compressor::SummableSection Compressor::summable_section(const uint8_t*, size_t) const {
  throw_invalid(name(), " payloads cannot be summed in transit");
}

int64_t EnvelopeCompressor::payload_count(const uint8_t* payload, size_t size) const {
  const Envelope e = read_envelope(payload, size, id_, name_);
  // A caller without an output buffer sizes one by this count (Python's decode without out=):
  // refuse what the body cannot hold. Every dense compressor spends at least one bit per value,
  // whatever its parameters; a sparse payload's count is not bounded by its body (trusted).
  CGX_CHECK_ARG(traits().sparse || uint64_t(e.count) <= 8 * e.body_bytes, name_,
                " payload corrupt: a body of ", e.body_bytes, " bytes cannot hold ", e.count,
                " values");
  return e.count;
}

uint8_t* EnvelopeCompressor::begin_payload(const void* in, DType dtype, int64_t count,
                                           size_t capacity, uint64_t body_bytes, uint8_t flags,
                                           uint32_t param0, uint32_t param1, uint8_t* out) const {
  check_encode_args(in, count, capacity, kEnvelopeBytes + body_bytes, name_);
  Envelope e;
  e.compressor_id = id_;
  e.dtype = dtype;
  e.flags = flags;
  e.count = count;
  e.param0 = param0;
  e.param1 = param1;
  e.body_bytes = body_bytes;
  write_envelope(e, out);
  return out + kEnvelopeBytes;
}

Envelope EnvelopeCompressor::open_payload(const uint8_t* payload, size_t size, const void* out,
                                          int64_t count) const {
  const Envelope e = read_envelope(payload, size, id_, name_);
  check_decode_target(out, count, e.count, name_);
  return e;
}

}  // namespace cgx
