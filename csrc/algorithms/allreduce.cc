#include "allreduce.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "payload.h"

namespace cgx {
namespace {

// acc[0..n) = data[begin..begin+n) as fp32.
void load_fp32(const uint8_t* data, DType dtype, int64_t begin, int64_t n, float* acc) {
  if (dtype == DType::kFloat32) {
    std::memcpy(acc, data + begin * 4, size_t(n) * 4);
    return;
  }
  const void* src = data + begin * int64_t(elem_size(dtype));
  for (int64_t i = 0; i < n; ++i) acc[i] = load_as_float(src, dtype, i);
}

// Bytes of the largest reduced-chunk payload (fp32) of a piece: the allgather's slot. Not always
// chunk 0's: with a raw tail, a shorter last chunk can carry more bytes than a full one.
size_t final_slot(int64_t count, int world, const AllreduceOptions& o) {
  size_t slot = 0;
  for (int j = 0; j < world; ++j) {
    const int64_t n = chunk_range(count, world, chunk_alignment(o), j).size();
    slot = std::max(slot, payload_size(o, n, DType::kFloat32));
  }
  return slot;
}

template <typename T>
void grow(std::vector<T>& v, size_t n) {
  if (v.size() < n) v.resize(n);
}

}  // namespace

Algorithm algorithm_from_int(int value) {
  CGX_CHECK_ARG(value >= 0 && value <= int(Algorithm::kTree), "unknown allreduce algorithm ", value,
                " (0: sra, 1: ring, 2: allgather, 3: tree)");
  return Algorithm(value);
}

Range chunk_range(int64_t count, int ranks, int64_t bucket_size, int j) {
  const int64_t per = (count + ranks - 1) / ranks;
  const int64_t chunk = (per + bucket_size - 1) / bucket_size * bucket_size;
  return Range{std::min(count, chunk * j), std::min(count, chunk * (j + 1))};
}

struct CompressedAllreduce::Segment {
  int64_t begin = 0;  // first element of the segment in the piece
  int64_t count = 0;
  DType dtype = DType::kFloat32;
  const AllreduceOptions* opts = nullptr;
  uint64_t id = 0;  // distinguishes the segment's random streams
  int world = 1;
  int me = 0;
  std::vector<size_t> send_sizes, recv_sizes;
  size_t send_offset = 0, recv_offset = 0;  // stage 1 buffers
  size_t slot = 0;                          // stage 2: one padded payload per rank
  size_t final_send_offset = 0, final_recv_offset = 0;

  Range chunk(int j) const { return chunk_range(count, world, chunk_alignment(*opts), j); }
  size_t esize() const { return elem_size(dtype); }
};

CompressedAllreduce::CompressedAllreduce() = default;
CompressedAllreduce::~CompressedAllreduce() = default;

void CompressedAllreduce::run(Transport& t, void* data, DType dtype, int64_t count,
                              const AllreduceOptions& o) {
  if (const CodecParams* codec = codec_of(o)) validate(*codec);
  algorithm_from_int(int(o.algorithm));
  CGX_CHECK_ARG(count >= 0, "element count must be >= 0, got ", count);
  CGX_CHECK_ARG(o.fusion_bytes >= elem_size(dtype), "fusion buffer must hold one element");
  bytes_sent_ = 0;
  if (o.residual != nullptr && count > 0) std::memset(o.residual, 0, size_t(count) * 4);
  if (t.size() == 1 || count == 0) {
    return;  // nothing to exchange; the average of one rank is the value itself
  }
  const int64_t piece_elems = int64_t(o.fusion_bytes / elem_size(dtype));
  uint8_t* bytes = static_cast<uint8_t*>(data);
  uint64_t piece = 0;
  for (int64_t begin = 0; begin < count; begin += piece_elems, ++piece) {
    const int64_t n = std::min(piece_elems, count - begin);
    uint8_t* p = bytes + begin * int64_t(elem_size(dtype));
    residual_ = o.residual ? o.residual + begin : nullptr;
    if (lanes_apply(o, dtype, n)) {
      pipelined(t, p, dtype, n, o, piece);
    } else {
      reduce_piece(t, p, dtype, n, o, piece);
    }
  }
}

void CompressedAllreduce::reduce_piece(Transport& t, uint8_t* data, DType dtype, int64_t count,
                                       const AllreduceOptions& o, uint64_t piece) {
  if (o.algorithm != Algorithm::kAllgather && sum_in_transit(o)) {
    sum_reduce(t, data, dtype, count, o, piece);
  } else if (o.algorithm == Algorithm::kAllgather || gather_only(o)) {
    allgather(t, data, dtype, count, o, piece);
  } else if (o.algorithm == Algorithm::kTree) {
    tree(t, data, dtype, count, o, piece);
  } else if (o.algorithm == Algorithm::kRing) {
    ring(t, data, dtype, count, o, piece);
  } else {
    sra(t, data, dtype, count, o, piece);
  }
}

// ---- scatter-reduce-allgather -----------------------------------------------------------------

void CompressedAllreduce::sra(Transport& t, uint8_t* data, DType dtype, int64_t count,
                              const AllreduceOptions& o, uint64_t piece) {
  const int64_t bucket = chunk_alignment(o);
  int64_t seg_elems = count;
  if (o.segment_bytes > 0) {
    seg_elems = std::max<int64_t>(1, int64_t(o.segment_bytes / elem_size(dtype)) / bucket) * bucket;
  }
  const int64_t nseg = (count + seg_elems - 1) / seg_elems;
  // Lay out every segment's buffers first: nothing may move while the comm thread works.
  segments_.resize(size_t(nseg));  // reused across calls, like the byte buffers
  std::vector<Segment>& segs = segments_;
  size_t send_total = 0, recv_total = 0, final_total = 0, gathered_total = 0;
  for (int64_t k = 0; k < nseg; ++k) {
    Segment& s = segs[size_t(k)];
    s.begin = k * seg_elems;
    s.count = std::min(seg_elems, count - s.begin);
    s.dtype = dtype;
    s.opts = &o;
    s.id = piece * 1000003u + uint64_t(k);
    s.world = t.size();
    s.me = t.rank();
    s.send_sizes.assign(size_t(s.world), 0);
    s.recv_sizes.assign(size_t(s.world), 0);
    const size_t mine = payload_size(o, s.chunk(s.me).size(), dtype);
    for (int j = 0; j < s.world; ++j) {
      if (j == s.me) continue;
      s.send_sizes[size_t(j)] = payload_size(o, s.chunk(j).size(), dtype);
      s.recv_sizes[size_t(j)] = mine;
    }
    s.send_offset = send_total;
    s.recv_offset = recv_total;
    for (int j = 0; j < s.world; ++j) {
      send_total += s.send_sizes[size_t(j)];
      recv_total += s.recv_sizes[size_t(j)];
    }
    s.slot = final_slot(s.count, s.world, o);
    s.final_send_offset = final_total;
    s.final_recv_offset = gathered_total;
    final_total += s.slot;
    gathered_total += s.slot * size_t(s.world);
    // Stage 1 sends W - 1 payloads; stage 2's slot reaches every other rank.
    bytes_sent_ += send_total - s.send_offset + s.slot * size_t(s.world - 1);
  }
  grow(send_, send_total);
  grow(recv_, recv_total);
  grow(final_send_, final_total);
  grow(final_recv_, gathered_total);

  auto exchange = [this, &t](const Segment& s) {
    t.alltoallv(send_.data() + s.send_offset, s.send_sizes, recv_.data() + s.recv_offset,
                s.recv_sizes);
  };
  auto gather = [this, &t](const Segment& s) {
    t.allgather(final_send_.data() + s.final_send_offset, s.slot,
                final_recv_.data() + s.final_recv_offset);
  };

  if (nseg == 1) {
    const Segment& s = segs[0];
    sra_encode(s, data);
    exchange(s);
    sra_reduce(s, data);
    gather(s);
    sra_decode(s, data);
    return;
  }
  // Pipeline. The comm thread runs exchange(0), exchange(1), gather(0), exchange(2), gather(1),
  // ... in this post order on every rank, while this thread encodes segment k + 1 during
  // exchange(k) and reduces / decodes as segments arrive.
  if (!comm_) comm_ = std::make_unique<SerialExecutor>();
  tickets_.assign(2 * size_t(nseg), 0);
  SerialExecutor::Ticket* exchanged = tickets_.data();
  SerialExecutor::Ticket* gathered = tickets_.data() + nseg;
  try {
    sra_encode(segs[0], data);
    exchanged[0] = comm_->post([&, k = 0] { exchange(segs[size_t(k)]); });
    for (int64_t k = 0; k < nseg; ++k) {
      if (k + 1 < nseg) {
        sra_encode(segs[size_t(k + 1)], data);
        exchanged[size_t(k + 1)] = comm_->post([&, k] { exchange(segs[size_t(k + 1)]); });
      }
      comm_->wait(exchanged[size_t(k)]);
      sra_reduce(segs[size_t(k)], data);
      gathered[size_t(k)] = comm_->post([&, k] { gather(segs[size_t(k)]); });
      if (k >= 1) {
        comm_->wait(gathered[size_t(k - 1)]);
        sra_decode(segs[size_t(k - 1)], data);
      }
    }
    comm_->wait(gathered[size_t(nseg - 1)]);
    sra_decode(segs[size_t(nseg - 1)], data);
  } catch (...) {
    comm_->drain();  // no task may outlive the buffers and segments it points to
    throw;
  }
  comm_->drain();
}

// 1. Encode every chunk this rank does not own; chunk j goes to rank j.
void CompressedAllreduce::sra_encode(const Segment& s, const uint8_t* data) {
  size_t off = s.send_offset;
  for (int j = 0; j < s.world; ++j) {
    if (j == s.me) continue;
    const Range c = s.chunk(j);
    const uint8_t* x = data + (s.begin + c.begin) * int64_t(s.esize());
    encode_payload(*s.opts, x, s.dtype, c.size(), streams_for(*s.opts, s.id, s.me, j, 0),
                   send_.data() + off, s.send_sizes[size_t(j)]);
    if (residual_) {
      store_residual(*s.opts, x, s.dtype, c.size(), send_.data() + off, s.send_sizes[size_t(j)],
                     residual_ + s.begin + c.begin);
    }
    off += s.send_sizes[size_t(j)];
  }
}

// 2-3. The owner adds the W - 1 received copies of its chunk to its own, uncompressed, in fp32
// (in place for fp32 data: the final decode overwrites the chunk anyway), averages if asked,
// and encodes the result into its stage-2 slot.
void CompressedAllreduce::sra_reduce(const Segment& s, uint8_t* data) {
  const Range mine = s.chunk(s.me);
  float* acc;
  if (s.dtype == DType::kFloat32) {
    acc = reinterpret_cast<float*>(data + (s.begin + mine.begin) * 4);
  } else {
    grow(acc_, size_t(mine.size()));
    acc = acc_.data();
    load_fp32(data, s.dtype, s.begin + mine.begin, mine.size(), acc);
  }
  size_t off = s.recv_offset;
  for (int j = 0; j < s.world; ++j) {
    if (j == s.me) continue;
    decode_payload(*s.opts, recv_.data() + off, s.recv_sizes[size_t(j)], acc, DType::kFloat32,
                   mine.size(), true);
    off += s.recv_sizes[size_t(j)];
  }
  encode_final(*s.opts, s.world, acc, mine.size(), streams_for(*s.opts, s.id, s.me, s.me, 2),
               final_send_.data() + s.final_send_offset, s.slot,
               residual_ ? residual_ + s.begin + mine.begin : nullptr);
}

// 4. Every rank decodes every reduced payload, its own included: replicas stay bit-identical.
void CompressedAllreduce::sra_decode(const Segment& s, uint8_t* data) {
  for (int r = 0; r < s.world; ++r) {
    const Range c = s.chunk(r);
    decode_payload(*s.opts, final_recv_.data() + s.final_recv_offset + size_t(r) * s.slot,
                   payload_size(*s.opts, c.size(), DType::kFloat32),
                   data + (s.begin + c.begin) * int64_t(s.esize()), s.dtype, c.size(), false);
  }
}

// ---- ring ---------------------------------------------------------------------------------------

void CompressedAllreduce::ring(Transport& t, uint8_t* data, DType dtype, int64_t count,
                               const AllreduceOptions& o, uint64_t piece) {
  const int world = t.size(), me = t.rank();
  const size_t esize = elem_size(dtype);
  const int next = (me + 1) % world, prev = (me + world - 1) % world;
  const int64_t bucket = chunk_alignment(o);
  const int64_t max_chunk = chunk_range(count, world, bucket, 0).size();
  size_t max_payload = 0;
  for (int j = 0; j < world; ++j) {
    const int64_t n = chunk_range(count, world, bucket, j).size();
    max_payload =
        std::max({max_payload, payload_size(o, n, dtype), payload_size(o, n, DType::kFloat32)});
  }
  grow(send_, max_payload);
  grow(recv_, max_payload);
  grow(acc_, size_t(max_chunk));
  // Hop s: send the running sum of chunk (me - s), receive that of chunk (me - s - 1) and add
  // the local values. The first hop sends local values in their own dtype, later hops fp32 sums.
  Range out = chunk_range(count, world, bucket, me);
  size_t out_bytes = payload_size(o, out.size(), dtype);
  encode_payload(o, data + out.begin * int64_t(esize), dtype, out.size(),
                 streams_for(o, piece, me, me, 0), send_.data(), out_bytes);
  if (residual_) {
    store_residual(o, data + out.begin * int64_t(esize), dtype, out.size(), send_.data(), out_bytes,
                   residual_ + out.begin);
  }
  for (int s = 0; s < world - 1; ++s) {
    const int k = ((me - s - 1) % world + world) % world;
    const Range in = chunk_range(count, world, bucket, k);
    const DType in_dtype = s == 0 ? dtype : DType::kFloat32;
    const size_t in_bytes = payload_size(o, in.size(), in_dtype);
    t.sendrecv(next, send_.data(), out_bytes, prev, recv_.data(), in_bytes);
    bytes_sent_ += out_bytes;
    load_fp32(data, dtype, in.begin, in.size(), acc_.data());
    decode_payload(o, recv_.data(), in_bytes, acc_.data(), DType::kFloat32, in.size(), true);
    if (s < world - 2) {
      out = in;
      out_bytes = payload_size(o, in.size(), DType::kFloat32);
      encode_payload(o, acc_.data(), DType::kFloat32, in.size(), streams_for(o, piece, me, k, 1),
                     send_.data(), out_bytes);
      if (residual_) {  // what this re-compression of the running sum left out
        store_residual(o, acc_.data(), DType::kFloat32, in.size(), send_.data(), out_bytes,
                       residual_ + in.begin);
      }
    }
  }
  // Rank r now holds the sum of chunk r + 1: encode it, allgather, decode every chunk.
  const int owned = next;
  const size_t slot = final_slot(count, world, o);
  grow(final_send_, slot);
  grow(final_recv_, slot * size_t(world));
  const Range own = chunk_range(count, world, bucket, owned);
  encode_final(o, world, acc_.data(), own.size(), streams_for(o, piece, me, owned, 2),
               final_send_.data(), slot, residual_ ? residual_ + own.begin : nullptr);
  t.allgather(final_send_.data(), slot, final_recv_.data());
  bytes_sent_ += slot * size_t(world - 1);
  for (int r = 0; r < world; ++r) {
    const Range c = chunk_range(count, world, bucket, (r + 1) % world);
    decode_payload(o, final_recv_.data() + size_t(r) * slot,
                   payload_size(o, c.size(), DType::kFloat32), data + c.begin * int64_t(esize),
                   dtype, c.size(), false);
  }
}

// The reduced chunk `acc` (averaged here if asked) as an fp32 payload, zero-padded to `slot`
// bytes so that a plain allgather carries every rank's. With `residual`: the owner's error
// feedback, what the final compression left out, in the units of one rank's contribution (times
// W when averaging), so that adding it to this rank's next input restores it in the next sum.
void CompressedAllreduce::encode_final(const AllreduceOptions& o, int world, float* acc, int64_t n,
                                       Streams s, uint8_t* dst, size_t slot, float* residual) {
  if (o.average) {
    const float w = float(world);
    for (int64_t i = 0; i < n; ++i) acc[i] /= w;
  }
  const size_t bytes = payload_size(o, n, DType::kFloat32);
  CGX_CHECK_ARG(bytes <= slot, "internal: a ", bytes, "-byte payload does not fit its ", slot,
                "-byte slot");
  encode_payload(o, acc, DType::kFloat32, n, s, dst, bytes);
  std::memset(dst + bytes, 0, slot - bytes);
  if (residual) {
    store_residual(o, acc, DType::kFloat32, n, dst, bytes, residual);
    if (o.average) {
      for (int64_t i = 0; i < n; ++i) residual[i] *= float(world);
    }
  }
}

}  // namespace cgx
