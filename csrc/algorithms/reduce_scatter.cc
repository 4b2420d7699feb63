#include "reduce_scatter.h"

#include <cstring>

#include "core/error.h"
#include "payload.h"

namespace cgx {

void CompressedReduceScatter::run(Transport& t, const void* input, DType dtype, int64_t count,
                                  const AllreduceOptions& o, float* out) {
  if (const CodecParams* codec = codec_of(o)) validate(*codec);
  CGX_CHECK_ARG(count >= 0, "element count must be >= 0, got ", count);
  const int world = t.size(), me = t.rank();
  const size_t n = size_t(count), esize = elem_size(dtype);
  const auto* in = static_cast<const uint8_t*>(input);
  const size_t cap = payload_size(o, count, dtype);
  // 1. Encode every chunk this rank does not own, packed in rank order.
  if (send_.size() < cap * size_t(world)) send_.resize(cap * size_t(world));
  std::vector<size_t> send_sizes(size_t(world), 0);
  size_t sent = 0;
  for (int j = 0; j < world; ++j) {
    if (j == me) continue;
    const Streams s = streams_for(o, 0, me, j, 0);
    send_sizes[size_t(j)] =
        encode_payload(o, in + size_t(j) * n * esize, dtype, count, s, send_.data() + sent, cap);
    sent += send_sizes[size_t(j)];
  }
  // 2. The sizes, then the payloads. A peer's size is checked against the most a payload of
  // `count` values can take before anything is allocated for it.
  std::vector<uint64_t> my_sizes(send_sizes.begin(), send_sizes.end());
  std::vector<uint64_t> their_sizes(size_t(world), 0);
  const std::vector<size_t> eight(size_t(world), sizeof(uint64_t));
  t.alltoallv(reinterpret_cast<const uint8_t*>(my_sizes.data()), eight,
              reinterpret_cast<uint8_t*>(their_sizes.data()), eight);
  std::vector<size_t> recv_sizes(size_t(world), 0);
  size_t total = 0;
  for (int j = 0; j < world; ++j) {
    if (j == me) continue;
    CGX_CHECK_ARG(their_sizes[size_t(j)] <= cap, "reduce-scatter: rank ", j, " announced a ",
                  their_sizes[size_t(j)], "-byte payload, more than the ", cap,
                  " bytes of any payload of ", count, " values");
    recv_sizes[size_t(j)] = size_t(their_sizes[size_t(j)]);
    total += recv_sizes[size_t(j)];
  }
  if (recv_.size() < total) recv_.resize(total);
  t.alltoallv(send_.data(), send_sizes, recv_.data(), recv_sizes);
  // 3. The owner's chunk in fp32, plus every decoded payload (each must hold `count` values).
  for (size_t i = 0; i < n; ++i) out[i] = load_as_float(in + size_t(me) * n * esize, dtype, i);
  size_t from = 0;
  for (int j = 0; j < world; ++j) {
    if (j == me) continue;
    decode_payload(o, recv_.data() + from, recv_sizes[size_t(j)], out, DType::kFloat32, count,
                   /*add=*/true);
    from += recv_sizes[size_t(j)];
  }
  if (o.average) {
    for (size_t i = 0; i < n; ++i) out[i] /= float(world);
  }
  bytes_sent_ = sent + eight.size() * sizeof(uint64_t);
}

}  // namespace cgx
