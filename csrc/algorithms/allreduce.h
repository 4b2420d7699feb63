// Compressed allreduce: the reduction happens at the receivers, since the wire carries max-min
// payloads that cannot be summed in transit. Steps, bytes on the wire and error bounds of each
// algorithm are in docs/algorithms.md.
//
// Vocabulary: a *piece* is at most `fusion_bytes` of the buffer, reduced as one unit; SRA cuts a
// piece into *segments* of `segment_bytes` (whole buckets) that flow through a pipeline; a
// segment (ring: a piece) is cut into one *chunk* per rank, chunk boundaries on bucket
// boundaries; rank j *owns* chunk j (SRA) and reduces it.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "core/codec.h"
#include "core/compressor.h"
#include "core/serial_executor.h"
#include "transport.h"

namespace cgx {

enum class Algorithm : uint8_t {
  kScatterReduceAllgather = 0,  // each value quantized exactly twice (default)
  kRing = 1,                    // W - 1 re-quantizing hops, then a compressed allgather
  kAllgather = 2,               // every rank's payload to every rank, summed there (sparse)
  kTree = 3,                    // binomial tree: re-quantizing sums up, the root's payload down
};

// The algorithm with this numeric value; InvalidArgument for any other value.
Algorithm algorithm_from_int(int value);

struct AllreduceOptions {
  CodecParams codec;  // bits, bucket size, raw tail, rounding, seed (streams are set per message)
  // The registered compressor; null: the max-min codec of `codec`. For any compressor but the
  // codec itself (Compressor::codec()), only codec.seed is read. Sparse
  // compressors and those whose payload size depends on the data always use kAllgather, but
  // summable sparse ones (random-k), which use sum-reduce unless kAllgather is asked for.
  const Compressor* compressor = nullptr;
  Algorithm algorithm = Algorithm::kScatterReduceAllgather;
  bool average = false;                    // divide the sum by the group size
  size_t fusion_bytes = size_t(64) << 20;  // largest piece, in bytes of the buffer's dtype
  // Pipeline (CaSync): segments of about this many bytes are encoded while the previous one is
  // on the wire (SRA: allreduce.cc; the other algorithms: two lanes, lanes.cc); 0 or >= the
  // piece: one segment, no pipeline.
  size_t segment_bytes = size_t(4) << 20;
  // Sparse paths (allgather-reduce of sparse or data-sized payloads, sum-reduce) pipeline only
  // when this is set too: their encode dominates their wire time, and pipelining them by
  // default measured 15-100 % slower (docs/benchmarks.md, "CaSync"). The planner sets it where
  // its model says a pipeline pays.
  bool pipeline_sparse = false;
  uint64_t call_index = 0;  // makes each call's random streams distinct
  // Error feedback: when set (count fp32 values), receives what this rank's compressions left
  // out: x - decode(encode(x)) of its own values as it sent them (SRA's first stage, ring's
  // first hop, allgather-reduce) and, on the chunk it owns (SRA, ring), what the final
  // compression of the sum left out, times W when averaging; ring's intermediate hops and the
  // tree's partial sums add what their re-compressions left out. Summed over the ranks, the
  // residuals are what the allreduce lost: adding each to its rank's next input feeds it back.
  float* residual = nullptr;
};

// The random streams of one encode: `stream` is this rank's, `shared` the same on every rank
// (random-k's indices), both distinct per call, piece, chunk and phase (payload.h).
struct Streams {
  uint64_t stream = 0;
  uint64_t shared = 0;
};

// [begin, end) of chunk `j` of a piece of `count` elements split over `ranks`.
struct Range {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t size() const { return end - begin; }
};
Range chunk_range(int64_t count, int ranks, int64_t bucket_size, int j);

// Holds the working buffers, reused from call to call (they only grow).
class CompressedAllreduce {
 public:
  CompressedAllreduce();
  ~CompressedAllreduce();

  // Reduces `count` elements of `dtype` at `data` in place across the transport's ranks. Every
  // rank ends with bit-identical values.
  void run(Transport& t, void* data, DType dtype, int64_t count, const AllreduceOptions& opts);

  // Bytes this rank handed to the transport during the last run().
  size_t bytes_sent() const { return bytes_sent_; }

 private:
  struct Segment;
  // One piece with the algorithm `o` asks for (the choice between them).
  void reduce_piece(Transport& t, uint8_t* data, DType dtype, int64_t count,
                    const AllreduceOptions& o, uint64_t piece);
  // CaSync for the algorithms without a pipeline of their own (lanes.cc).
  static bool lanes_apply(const AllreduceOptions& o, DType dtype, int64_t count);
  void pipelined(Transport& t, uint8_t* data, DType dtype, int64_t count, const AllreduceOptions& o,
                 uint64_t piece);
  void sra(Transport& t, uint8_t* data, DType dtype, int64_t count, const AllreduceOptions& o,
           uint64_t piece);
  void sra_encode(const Segment& s, const uint8_t* data);
  void sra_reduce(const Segment& s, uint8_t* data);
  void sra_decode(const Segment& s, uint8_t* data);
  void ring(Transport& t, uint8_t* data, DType dtype, int64_t count, const AllreduceOptions& o,
            uint64_t piece);
  void allgather(Transport& t, uint8_t* data, DType dtype, int64_t count, const AllreduceOptions& o,
                 uint64_t piece);
  void tree(Transport& t, uint8_t* data, DType dtype, int64_t count, const AllreduceOptions& o,
            uint64_t piece);
  void sum_reduce(Transport& t, uint8_t* data, DType dtype, int64_t count,
                  const AllreduceOptions& o, uint64_t piece);
  void encode_final(const AllreduceOptions& o, int world, float* acc, int64_t n, Streams s,
                    uint8_t* dst, size_t slot, float* residual);

  std::vector<uint8_t> send_;
  std::vector<uint8_t> recv_;
  std::vector<uint8_t> final_send_;
  std::vector<uint8_t> final_recv_;
  std::vector<float> acc_;
  std::vector<Segment> segments_;                // SRA segment layouts of the current piece
  std::vector<SerialExecutor::Ticket> tickets_;  // pipeline: exchange and gather per segment
  size_t bytes_sent_ = 0;
  std::unique_ptr<SerialExecutor> comm_;  // started on the first pipelined call
  // lanes.cc: the second lane's thread and each lane's own buffers.
  std::unique_ptr<SerialExecutor> lane_exec_;
  std::unique_ptr<CompressedAllreduce> lanes_[2];
  float* residual_ = nullptr;  // of the current piece (AllreduceOptions::residual)
};

}  // namespace cgx
