// Tree allreduce (binomial, rooted at rank 0), for small messages at larger W: 2 ceil(log2 W)
// latency steps against ring's 2 (W - 1). Up: a rank adds (decodes into an fp32 sum) the
// payloads of its children, rank + 2^j for the 2^j below its lowest set bit, then compresses
// that partial sum once and sends it to its parent, rank - (lowest set bit). The root compresses
// the total (averaged if asked) once more; that payload travels down the same tree unchanged and
// every rank decodes the same bytes: replicas are bit-identical. A value is quantized at most
// ceil(log2 W) + 1 times (error_bound.cc). Bytes sent per rank: one payload up (none at the root)
// plus one per child down; the root sends ceil(log2 W) payloads.
#include "allreduce.h"
#include "payload.h"

namespace cgx {
namespace {

int lowest_bit(int r) { return r & -r; }

}  // namespace

void CompressedAllreduce::tree(Transport& t, uint8_t* data, DType dtype, int64_t count,
                               const AllreduceOptions& o, uint64_t piece) {
  const int world = t.size(), me = t.rank();
  const size_t bytes = payload_size(o, count, DType::kFloat32);
  if (send_.size() < bytes) send_.resize(bytes);
  if (recv_.size() < bytes) recv_.resize(bytes);
  if (final_send_.size() < bytes) final_send_.resize(bytes);
  if (acc_.size() < size_t(count)) acc_.resize(size_t(count));
  for (int64_t i = 0; i < count; ++i) acc_[size_t(i)] = load_as_float(data, dtype, i);
  // Children below the lowest set bit (every power of two below W for the root).
  const int span = me == 0 ? world : lowest_bit(me);
  for (int mask = 1; mask < span && me + mask < world; mask <<= 1) {
    t.recv(me + mask, recv_.data(), bytes);
    decode_payload(o, recv_.data(), bytes, acc_.data(), DType::kFloat32, count, true);
  }
  if (me != 0) {
    encode_payload(o, acc_.data(), DType::kFloat32, count, streams_for(o, piece, me, 0, 1),
                   send_.data(), bytes);
    if (residual_) {
      store_residual(o, acc_.data(), DType::kFloat32, count, send_.data(), bytes, residual_);
    }
    t.send(me - lowest_bit(me), send_.data(), bytes);
    bytes_sent_ += bytes;
    t.recv(me - lowest_bit(me), final_send_.data(), bytes);
  } else {
    encode_final(o, world, acc_.data(), count, streams_for(o, piece, 0, 0, 2), final_send_.data(),
                 bytes, residual_);
  }
  int top = 1;
  while (top * 2 < span) top *= 2;
  for (int mask = top; mask >= 1; mask >>= 1) {  // down: the farthest subtree first
    if (mask < span && me + mask < world) {
      t.send(me + mask, final_send_.data(), bytes);
      bytes_sent_ += bytes;
    }
  }
  decode_payload(o, final_send_.data(), bytes, data, dtype, count, false);
}

}  // namespace cgx
