#include "payload.h"

#include "core/error.h"
#include "core/rng.h"

namespace cgx {

Streams streams_for(const AllreduceOptions& o, uint64_t piece, int rank, int chunk, int phase) {
  const uint64_t s = splitmix64(splitmix64(o.call_index) ^ piece);
  auto mix = [&](uint64_t r) {
    return splitmix64(s ^ (r << 32 | uint64_t(uint32_t(chunk)) << 2 | uint64_t(phase)));
  };
  // `shared` mixes an impossible rank (2^32 - 1 is above any group size) with the same rest.
  return Streams{mix(uint64_t(uint32_t(rank))), mix(0xffffffffull)};
}

const CodecParams* codec_of(const AllreduceOptions& o) {
  return o.compressor ? o.compressor->codec() : &o.codec;
}

int64_t chunk_alignment(const AllreduceOptions& o) {
  const CodecParams* codec = codec_of(o);
  return codec ? codec->bucket_size : o.compressor->alignment();
}

size_t payload_size(const AllreduceOptions& o, int64_t n, DType dtype) {
  const CodecParams* codec = codec_of(o);
  return codec ? encoded_size(n, dtype, *codec) : o.compressor->max_encoded_size(n, dtype);
}

bool fixed_size(const AllreduceOptions& o) {
  return codec_of(o) != nullptr || o.compressor->traits().fixed_size;
}

bool gather_only(const AllreduceOptions& o) {
  if (codec_of(o) != nullptr) return false;
  const CompressorTraits t = o.compressor->traits();
  return !t.fixed_size || t.sparse;
}

bool sum_in_transit(const AllreduceOptions& o) {
  if (codec_of(o) != nullptr) return false;
  const CompressorTraits t = o.compressor->traits();
  return t.summable && t.sparse && t.fixed_size;
}

size_t encode_payload(const AllreduceOptions& o, const void* in, DType dtype, int64_t n, Streams s,
                      uint8_t* out, size_t capacity) {
  if (const CodecParams* codec = codec_of(o)) {
    CodecParams p = *codec;
    p.seed = o.codec.seed;
    p.stream = s.stream;
    encode(in, dtype, n, p, out, capacity);
    return capacity;
  }
  const EncodeContext ctx{o.codec.seed, s.stream, s.shared};
  return o.compressor->encode(in, dtype, n, ctx, out, capacity);
}

void decode_payload(const AllreduceOptions& o, const uint8_t* payload, size_t size, void* out,
                    DType dtype, int64_t n, bool add) {
  if (codec_of(o) == nullptr) {
    o.compressor->decode(payload, size, out, dtype, n, add);
  } else if (add) {
    decode_add(payload, size, out, dtype, n);
  } else {
    decode(payload, size, out, dtype, n);
  }
}

void store_residual(const AllreduceOptions& o, const void* x, DType dtype, int64_t n,
                    const uint8_t* payload, size_t size, float* residual) {
  decode_payload(o, payload, size, residual, DType::kFloat32, n, false);
  for (int64_t i = 0; i < n; ++i) residual[i] = load_as_float(x, dtype, i) - residual[i];
}

}  // namespace cgx
