// Sum-reduce: for sparse compressors whose payloads sum as they travel (random-k, whose indices
// every rank draws from the same shared stream). Each rank encodes its piece once; the headers
// travel first (one allgather of the bytes before the values: they must agree, flags are OR-ed),
// then the values are reduced exactly like an uncompressed allreduce of a k-vector: chunk j of
// the values goes to rank j (alltoallv), which sums the W copies in fp32 in rank order and rounds
// once to the values' dtype, and an allgather returns the sums. Every rank then decodes the same
// payload: replicas are bit-identical. Bytes sent per rank: (W - 1) * head + about
// 2 (W - 1) / W * k * elem_size, against (W - 1) * k * elem_size for allgather-reduce.
#include <algorithm>
#include <cstring>

#include "allreduce.h"
#include "core/error.h"
#include "payload.h"

namespace cgx {
namespace {

// memcpy that accepts empty ranges with null pointers (chunks of other ranks can be empty).
void copy(uint8_t* dst, const uint8_t* src, size_t n) {
  if (n > 0) std::memcpy(dst, src, n);
}

// Header bytes of every rank must agree except the flags (byte 7), which are OR-ed into `mine`.
void merge_headers(const std::vector<uint8_t>& all, size_t head, int world, uint8_t* mine) {
  uint8_t flags = 0;
  for (int r = 0; r < world; ++r) {
    const uint8_t* h = all.data() + size_t(r) * head;
    for (size_t b = 0; b < head; ++b) {
      CGX_CHECK_ARG(b == 7 || h[b] == mine[b], "sum-reduce: rank ", r,
                    "'s payload header differs from this rank's at byte ", b,
                    " (compressor settings differ between ranks?)");
    }
    flags = uint8_t(flags | (head > 7 ? h[7] : 0));
  }
  if (head > 7) mine[7] = flags;
}

}  // namespace

void CompressedAllreduce::sum_reduce(Transport& t, uint8_t* data, DType dtype, int64_t count,
                                     const AllreduceOptions& o, uint64_t piece) {
  const int world = t.size(), me = t.rank();
  const size_t size = payload_size(o, count, dtype);
  if (send_.size() < size) send_.resize(size);
  uint8_t* payload = send_.data();
  encode_payload(o, data, dtype, count, streams_for(o, piece, me, 0, 0), payload, size);
  if (residual_) store_residual(o, data, dtype, count, payload, size, residual_);
  const Compressor::SummableSection sec = o.compressor->summable_section(payload, size);
  const size_t es = elem_size(sec.dtype), head = sec.offset;
  CGX_CHECK_ARG(head + size_t(sec.count) * es == size, "internal: summable section mismatch");

  std::vector<uint8_t> headers(head * size_t(world));
  t.allgather(payload, head, headers.data());
  merge_headers(headers, head, world, payload);

  // Reduce-scatter of the values, then allgather of the sums (chunks of whole values).
  uint8_t* values = payload + head;
  std::vector<size_t> send_sizes(size_t(world), 0), recv_sizes(size_t(world), 0);
  const Range mine = chunk_range(sec.count, world, 1, me);
  size_t send_total = 0;
  for (int j = 0; j < world; ++j) {
    if (j == me) continue;
    send_sizes[size_t(j)] = size_t(chunk_range(sec.count, world, 1, j).size()) * es;
    recv_sizes[size_t(j)] = size_t(mine.size()) * es;
    send_total += send_sizes[size_t(j)];
  }
  std::vector<uint8_t> out(send_total), in(size_t(mine.size()) * es * size_t(world));
  size_t off = 0;
  for (int j = 0; j < world; ++j) {
    if (j == me) continue;
    const Range c = chunk_range(sec.count, world, 1, j);
    copy(out.data() + off, values + size_t(c.begin) * es, send_sizes[size_t(j)]);
    off += send_sizes[size_t(j)];
  }
  t.alltoallv(out.data(), send_sizes, in.data(), recv_sizes);
  // The owner sums its chunk over the ranks in rank order, in fp32, and rounds once.
  const uint8_t* own = values + size_t(mine.begin) * es;
  for (int64_t i = 0; i < mine.size(); ++i) {
    float sum = 0.0f;
    size_t from = 0;
    for (int r = 0; r < world; ++r) {
      const uint8_t* src = r == me ? own : in.data() + from;
      if (r != me) from += recv_sizes[size_t(r)];
      sum += load_as_float(src, sec.dtype, i);
    }
    store_from_float(values, sec.dtype, mine.begin + i, sum);
  }
  const size_t slot = size_t(chunk_range(sec.count, world, 1, 0).size()) * es;
  std::vector<uint8_t> mine_slot(slot, 0), gathered(slot * size_t(world));
  copy(mine_slot.data(), values + size_t(mine.begin) * es, size_t(mine.size()) * es);
  t.allgather(mine_slot.data(), slot, gathered.data());
  for (int r = 0; r < world; ++r) {
    const Range c = chunk_range(sec.count, world, 1, r);
    copy(values + size_t(c.begin) * es, gathered.data() + size_t(r) * slot, size_t(c.size()) * es);
  }
  bytes_sent_ += (head + slot) * size_t(world - 1) + send_total;

  if (acc_.size() < size_t(count)) acc_.resize(size_t(count));
  decode_payload(o, payload, size, acc_.data(), DType::kFloat32, count, false);
  const float w = float(world);
  for (int64_t i = 0; i < count; ++i) {
    store_from_float(data, dtype, i, o.average ? acc_[size_t(i)] / w : acc_[size_t(i)]);
  }
}

}  // namespace cgx
