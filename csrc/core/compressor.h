// The compressor interface: what every gradient compressor of torch_cgx declares and does, and
// what the algorithms may rely on (docs/adding-a-compressor.md walks through writing one).
//
// A compressor turns `count` values of a floating dtype into a self-describing payload and back.
// It is stateless: error feedback and momentum live with the caller (the hook state), so one
// instance can serve every tensor and thread. Payloads other than max-min's share one 32-byte
// envelope (docs/FORMAT.md, "Compressor payloads") that decoders validate before reading a byte
// of the body.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "dtype.h"

namespace cgx {

struct CodecParams;  // core/codec.h

// What the algorithms read to choose how a compressor's payloads travel.
struct CompressorTraits {
  bool biased = false;     // E[decode(encode(x))] != x: needs error feedback to converge
  bool fixed_size = true;  // the payload size depends on (count, dtype) only
  bool summable = false;   // payloads of one message can be summed as they travel
  bool sparse = false;     // carries a subset of the values (indices or shared selection)
};

// Randomness of one encode: every (seed, stream) pair gives an independent stream; `shared` is
// the same on every rank for one message (random-k draws its indices from it).
struct EncodeContext {
  uint64_t seed = 0;
  uint64_t stream = 0;
  uint64_t shared = 0;
};

// A typed parameter: numbers only (integers, reals, flags as 0 / 1), each with a range.
struct ParamSpec {
  std::string name;
  double default_value = 0;
  double min = 0;
  double max = 0;
  bool integer = false;
  std::string help;
};

// Parameter values after validation: every spec'd name present, nothing else.
class ParamValues {
 public:
  // Throws InvalidArgument naming the compressor and the parameter (unknown name, not an
  // integer, out of range).
  ParamValues(const std::string& compressor, const std::vector<ParamSpec>& specs,
              const std::map<std::string, double>& given);
  double get(const std::string& name) const;
  int64_t get_int(const std::string& name) const { return int64_t(get(name)); }
  bool get_bool(const std::string& name) const { return get(name) != 0; }
  const std::map<std::string, double>& all() const { return values_; }

 private:
  std::map<std::string, double> values_;
};

class Compressor {
 public:
  virtual ~Compressor() = default;
  virtual const char* name() const = 0;
  virtual CompressorTraits traits() const = 0;

  // Bytes encode() writes at most; exactly, for fixed-size compressors.
  virtual size_t max_encoded_size(int64_t count, DType dtype) const = 0;

  // Encodes `count` values of `dtype`; returns the payload's size. `capacity` (the bytes at
  // `out`) must be at least max_encoded_size(count, dtype).
  virtual size_t encode(const void* in, DType dtype, int64_t count, const EncodeContext& ctx,
                        uint8_t* out, size_t capacity) const = 0;

  // Validates the payload completely, then writes (add: adds, in fp32, rounding once) its
  // `count` values into `out`. Throws InvalidArgument on any malformed payload.
  virtual void decode(const uint8_t* payload, size_t size, void* out, DType out_dtype,
                      int64_t count, bool add) const = 0;

  // The element count a payload's header describes, after the header's checks and, where the
  // compressor allows, a check that the body could hold that many values (dense compressors:
  // at least one bit per value; max-min: the exact size). A sparse compressor's count is not
  // bounded by its payload: a receiver must compare it with the count it expects (decode()
  // does) before it allocates from it.
  virtual int64_t payload_count(const uint8_t* payload, size_t size) const = 0;

  // Splitting a buffer at multiples of this keeps its encoding's buckets intact (an algorithm
  // cuts chunks there); 1 when the compressor has no buckets.
  virtual int64_t alignment() const { return 1; }

  // Summable compressors (traits().summable): the `count` values of `dtype` at `offset` of a
  // payload are what sums as it travels; the bytes before them are the same on every rank for
  // one message but for the flags byte of the envelope, whose bits combine by OR.
  struct SummableSection {
    size_t offset = 0;
    int64_t count = 0;
    DType dtype = DType::kFloat32;
  };
  virtual SummableSection summable_section(const uint8_t* payload, size_t size) const;

  // The max-min codec's parameters when this compressor is that codec (its payloads are the
  // codec's, docs/FORMAT.md), else null. The algorithms then call the codec directly: the same
  // bytes without a virtual call per message. The seed and stream of the returned parameters are
  // not read: each message takes its own (EncodeContext).
  virtual const CodecParams* codec() const { return nullptr; }
};

// ---- the envelope shared by all compressors except max-min (docs/FORMAT.md) -----------------

constexpr size_t kEnvelopeBytes = 32;

struct Envelope {
  uint8_t compressor_id = 0;
  DType dtype = DType::kFloat32;
  uint8_t flags = 0;
  int64_t count = 0;
  uint32_t param0 = 0;  // compressor-specific (documented per compressor)
  uint32_t param1 = 0;
  uint64_t body_bytes = 0;
};

void write_envelope(const Envelope& e, uint8_t* out);

// Validates magic, version, dtype, the compressor id (must be `expected_id`), the count and
// that `size` is exactly the header plus its body; names `compressor` in errors.
Envelope read_envelope(const uint8_t* payload, size_t size, uint8_t expected_id,
                       const char* compressor);

// Base of the compressors whose payloads use the envelope: name, id and the envelope's checks.
class EnvelopeCompressor : public Compressor {
 public:
  EnvelopeCompressor(const char* name, uint8_t id) : name_(name), id_(id) {}
  const char* name() const override { return name_; }
  int64_t payload_count(const uint8_t* payload, size_t size) const override;

 protected:
  // Checks encode()'s arguments against `capacity`, writes the envelope for a body of
  // `body_bytes`; returns where the body starts.
  uint8_t* begin_payload(const void* in, DType dtype, int64_t count, size_t capacity,
                         uint64_t body_bytes, uint8_t flags, uint32_t param0, uint32_t param1,
                         uint8_t* out) const;
  // Validates the envelope (and that `out` takes `count` values); the body follows it.
  Envelope open_payload(const uint8_t* payload, size_t size, const void* out, int64_t count) const;

  const char* name_;
  uint8_t id_;
};

// Common checks of encode() / decode() arguments.
void check_encode_args(const void* in, int64_t count, size_t capacity, size_t need,
                       const char* compressor);
void check_decode_target(const void* out, int64_t count, int64_t payload_count,
                         const char* compressor);

}  // namespace cgx
