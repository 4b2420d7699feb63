// How the allreduce algorithms encode and decode, whatever the compressor: the registered
// compressor `opts.compressor`, or, when it is null, the max-min codec of `opts.codec`. A
// compressor that is the codec (Compressor::codec()) takes the codec's direct path. The
// algorithms call only these, so they do not know which compressor they run.
#pragma once

#include "allreduce.h"

namespace cgx {

// The max-min codec parameters a call encodes with: the compressor's when it is the codec,
// `o.codec` when there is no compressor, null for any other compressor. Seeds and streams are
// not read from it (o.codec.seed and each message's stream are).
const CodecParams* codec_of(const AllreduceOptions& o);

Streams streams_for(const AllreduceOptions& o, uint64_t piece, int rank, int chunk, int phase);

// Chunk boundaries fall on multiples of this (the compressor's bucket), so that every stage's
// buckets coincide.
int64_t chunk_alignment(const AllreduceOptions& o);

// Exact payload bytes for fixed-size compressors, the most encode may write otherwise.
size_t payload_size(const AllreduceOptions& o, int64_t n, DType dtype);
bool fixed_size(const AllreduceOptions& o);
// Compressors whose payloads only allgather-reduce can carry well: data-dependent sizes, and
// sparse ones (re-sparsifying a sum in SRA or ring would drop most of it, unfed back).
bool gather_only(const AllreduceOptions& o);
// Sparse compressors whose payloads sum as they travel (random-k: shared indices): sum-reduce.
bool sum_in_transit(const AllreduceOptions& o);

// Returns the bytes written (== payload_size for fixed-size compressors).
size_t encode_payload(const AllreduceOptions& o, const void* in, DType dtype, int64_t n, Streams s,
                      uint8_t* out, size_t capacity);
// residual[0..n) = x - decode(payload), for error feedback (x: the n values encoded).
void store_residual(const AllreduceOptions& o, const void* x, DType dtype, int64_t n,
                    const uint8_t* payload, size_t size, float* residual);

void decode_payload(const AllreduceOptions& o, const uint8_t* payload, size_t size, void* out,
                    DType dtype, int64_t n, bool add);

}  // namespace cgx
