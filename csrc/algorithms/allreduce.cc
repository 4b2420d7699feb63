#include "allreduce.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "core/rng.h"

namespace cgx {
namespace {

uint64_t stream_of(const AllreduceOptions& o, uint64_t piece, int rank, int chunk, int phase) {
  uint64_t s = splitmix64(splitmix64(o.call_index) ^ piece);
  return splitmix64(
      s ^ (uint64_t(uint32_t(rank)) << 32 | uint64_t(uint32_t(chunk)) << 2 | uint64_t(phase)));
}

CodecParams params_for(const AllreduceOptions& o, uint64_t piece, int rank, int chunk, int phase) {
  CodecParams p = o.codec;
  p.stream = stream_of(o, piece, rank, chunk, phase);
  return p;
}

// acc[0..n) = data[begin..begin+n) as fp32.
void load_fp32(const uint8_t* data, DType dtype, int64_t begin, int64_t n, float* acc) {
  if (dtype == DType::kFloat32) {
    std::memcpy(acc, data + begin * 4, size_t(n) * 4);
    return;
  }
  const void* src = data + begin * int64_t(elem_size(dtype));
  for (int64_t i = 0; i < n; ++i) acc[i] = load_as_float(src, dtype, i);
}

template <typename T>
void grow(std::vector<T>& v, size_t n) {
  if (v.size() < n) v.resize(n);
}

}  // namespace

const char* algorithm_name(Algorithm a) { return a == Algorithm::kRing ? "ring" : "sra"; }

Range chunk_range(int64_t count, int ranks, int64_t bucket_size, int j) {
  const int64_t per = (count + ranks - 1) / ranks;
  const int64_t chunk = (per + bucket_size - 1) / bucket_size * bucket_size;
  return Range{std::min(count, chunk * j), std::min(count, chunk * (j + 1))};
}

void CompressedAllreduce::run(Transport& t, void* data, DType dtype, int64_t count,
                              const AllreduceOptions& o) {
  validate(o.codec);
  CGX_CHECK_ARG(count >= 0, "element count must be >= 0, got ", count);
  CGX_CHECK_ARG(o.fusion_bytes >= elem_size(dtype), "fusion buffer must hold one element");
  bytes_sent_ = 0;
  if (t.size() == 1 || count == 0) {
    return;  // nothing to exchange; the average of one rank is the value itself
  }
  const int64_t piece_elems = int64_t(o.fusion_bytes / elem_size(dtype));
  uint8_t* bytes = static_cast<uint8_t*>(data);
  uint64_t piece = 0;
  for (int64_t begin = 0; begin < count; begin += piece_elems, ++piece) {
    const int64_t n = std::min(piece_elems, count - begin);
    uint8_t* p = bytes + begin * int64_t(elem_size(dtype));
    if (o.algorithm == Algorithm::kRing) {
      ring(t, p, dtype, n, o, piece);
    } else {
      sra(t, p, dtype, n, o, piece);
    }
  }
}

void CompressedAllreduce::sra(Transport& t, uint8_t* data, DType dtype, int64_t count,
                              const AllreduceOptions& o, uint64_t piece) {
  const int world = t.size(), me = t.rank();
  const size_t esize = elem_size(dtype);
  const Range mine = chunk_range(count, world, o.codec.bucket_size, me);
  std::vector<size_t> send_sizes(world, 0), recv_sizes(world, 0);
  size_t send_total = 0, recv_total = 0;
  for (int j = 0; j < world; ++j) {
    if (j == me) continue;
    send_sizes[j] =
        encoded_size(chunk_range(count, world, o.codec.bucket_size, j).size(), dtype, o.codec);
    recv_sizes[j] = encoded_size(mine.size(), dtype, o.codec);
    send_total += send_sizes[j];
    recv_total += recv_sizes[j];
  }
  grow(send_, send_total);
  grow(recv_, recv_total);
  // 1. Encode every chunk this rank does not own; chunk j goes to rank j.
  size_t off = 0;
  for (int j = 0; j < world; ++j) {
    if (j == me) continue;
    const Range c = chunk_range(count, world, o.codec.bucket_size, j);
    encode(data + c.begin * int64_t(esize), dtype, c.size(), params_for(o, piece, me, j, 0),
           send_.data() + off, send_sizes[j]);
    off += send_sizes[j];
  }
  t.alltoallv(send_.data(), send_sizes, recv_.data(), recv_sizes);
  bytes_sent_ += send_total;
  // 2. The owner adds the W - 1 received copies of its chunk to its own, uncompressed, in fp32.
  grow(acc_, size_t(mine.size()));
  load_fp32(data, dtype, mine.begin, mine.size(), acc_.data());
  off = 0;
  for (int j = 0; j < world; ++j) {
    if (j == me) continue;
    decode_add(recv_.data() + off, recv_sizes[j], acc_.data(), DType::kFloat32, mine.size());
    off += recv_sizes[j];
  }
  finish(t, data, dtype, count, o, piece, me);
}

void CompressedAllreduce::ring(Transport& t, uint8_t* data, DType dtype, int64_t count,
                               const AllreduceOptions& o, uint64_t piece) {
  const int world = t.size(), me = t.rank();
  const size_t esize = elem_size(dtype);
  const int next = (me + 1) % world, prev = (me + world - 1) % world;
  const int64_t bucket = o.codec.bucket_size;
  const int64_t max_chunk = chunk_range(count, world, bucket, 0).size();
  const size_t max_payload = std::max(encoded_size(max_chunk, dtype, o.codec),
                                      encoded_size(max_chunk, DType::kFloat32, o.codec));
  grow(send_, max_payload);
  grow(recv_, max_payload);
  grow(acc_, size_t(max_chunk));
  // Hop s: send the running sum of chunk (me - s), receive that of chunk (me - s - 1) and add
  // the local values. The first hop sends local values in their own dtype, later hops fp32 sums.
  Range out = chunk_range(count, world, bucket, me);
  size_t out_bytes = encoded_size(out.size(), dtype, o.codec);
  encode(data + out.begin * int64_t(esize), dtype, out.size(), params_for(o, piece, me, me, 0),
         send_.data(), out_bytes);
  for (int s = 0; s < world - 1; ++s) {
    const int k = ((me - s - 1) % world + world) % world;
    const Range in = chunk_range(count, world, bucket, k);
    const DType in_dtype = s == 0 ? dtype : DType::kFloat32;
    const size_t in_bytes = encoded_size(in.size(), in_dtype, o.codec);
    t.sendrecv(next, send_.data(), out_bytes, prev, recv_.data(), in_bytes);
    bytes_sent_ += out_bytes;
    load_fp32(data, dtype, in.begin, in.size(), acc_.data());
    decode_add(recv_.data(), in_bytes, acc_.data(), DType::kFloat32, in.size());
    if (s < world - 2) {
      out = in;
      out_bytes = encoded_size(in.size(), DType::kFloat32, o.codec);
      encode(acc_.data(), DType::kFloat32, in.size(), params_for(o, piece, me, k, 1), send_.data(),
             out_bytes);
    }
  }
  finish(t, data, dtype, count, o, piece, (me + 1) % world);
}

void CompressedAllreduce::finish(Transport& t, uint8_t* data, DType dtype, int64_t count,
                                 const AllreduceOptions& o, uint64_t piece, int owned) {
  const int world = t.size(), me = t.rank();
  const size_t esize = elem_size(dtype);
  const int64_t bucket = o.codec.bucket_size;
  const Range mine = chunk_range(count, world, bucket, owned);
  if (o.average) {
    const float w = float(world);
    for (int64_t i = 0; i < mine.size(); ++i) acc_[size_t(i)] /= w;
  }
  // Payload slots are padded to the largest chunk's size so that a plain allgather carries them.
  const size_t slot =
      encoded_size(chunk_range(count, world, bucket, 0).size(), DType::kFloat32, o.codec);
  grow(send_, slot);
  grow(recv_, slot * size_t(world));
  const size_t my_bytes = encoded_size(mine.size(), DType::kFloat32, o.codec);
  encode(acc_.data(), DType::kFloat32, mine.size(), params_for(o, piece, me, owned, 2),
         send_.data(), my_bytes);
  std::memset(send_.data() + my_bytes, 0, slot - my_bytes);
  t.allgather(send_.data(), slot, recv_.data());
  bytes_sent_ += slot * size_t(world - 1);  // each slot reaches every other rank
  // Every rank decodes the same bytes, the owner included: replicas stay bit-identical.
  for (int r = 0; r < world; ++r) {
    const int chunk = o.algorithm == Algorithm::kRing ? (r + 1) % world : r;
    const Range c = chunk_range(count, world, bucket, chunk);
    decode(recv_.data() + size_t(r) * slot, encoded_size(c.size(), DType::kFloat32, o.codec),
           data + c.begin * int64_t(esize), dtype, c.size());
  }
}

}  // namespace cgx
