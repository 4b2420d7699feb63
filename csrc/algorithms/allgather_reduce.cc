// Allgather-reduce: for compressors whose payload size depends on the data (sparse ones) or when
// asked for (kAllgather). Each rank encodes its whole piece once; the sizes travel first (one
// allgather of 8 bytes per rank), then the payloads, each padded to the largest; every rank
// decodes all W payloads, its own included, in rank order into an fp32 sum. Every value is
// quantized exactly once, by its sender, and every rank sums the same bytes in the same order:
// replicas are bit-identical. Bytes sent per rank: (W - 1) * (8 + the largest payload).
#include <algorithm>
#include <cstring>

#include "allreduce.h"
#include "core/error.h"
#include "payload.h"

namespace cgx {

void CompressedAllreduce::allgather(Transport& t, uint8_t* data, DType dtype, int64_t count,
                                    const AllreduceOptions& o, uint64_t piece) {
  const int world = t.size(), me = t.rank();
  const size_t cap = payload_size(o, count, dtype);
  if (send_.size() < cap) send_.resize(cap);
  const size_t mine =
      encode_payload(o, data, dtype, count, streams_for(o, piece, me, 0, 0), send_.data(), cap);
  if (residual_) store_residual(o, data, dtype, count, send_.data(), mine, residual_);

  std::vector<uint64_t> sizes(static_cast<size_t>(world));
  const uint64_t mine64 = mine;
  t.allgather(reinterpret_cast<const uint8_t*>(&mine64), 8,
              reinterpret_cast<uint8_t*>(sizes.data()));
  size_t slot = 0;
  for (uint64_t s : sizes) {
    CGX_CHECK_ARG(s <= cap, "allgather: rank sent a ", s, "-byte payload, more than the ", cap,
                  " this piece can take (settings differ between ranks?)");
    slot = std::max(slot, size_t(s));
  }
  std::memset(send_.data() + mine, 0, slot - mine);
  if (final_recv_.size() < slot * size_t(world)) final_recv_.resize(slot * size_t(world));
  t.allgather(send_.data(), slot, final_recv_.data());
  bytes_sent_ += (8 + slot) * size_t(world - 1);

  if (acc_.size() < size_t(count)) acc_.resize(size_t(count));
  std::fill(acc_.begin(), acc_.begin() + count, 0.0f);
  for (int r = 0; r < world; ++r) {
    decode_payload(o, final_recv_.data() + size_t(r) * slot, size_t(sizes[size_t(r)]), acc_.data(),
                   DType::kFloat32, count, true);
  }
  const float w = float(world);
  for (int64_t i = 0; i < count; ++i) {
    store_from_float(data, dtype, i, o.average ? acc_[size_t(i)] / w : acc_[size_t(i)]);
  }
}

}  // namespace cgx
