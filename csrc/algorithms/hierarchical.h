// The hierarchical (node-aware) compressed allreduce: exact inside a node, compressed across
// nodes. Vocabulary: a *node* is the ranks of one host (local ranks 0 .. local_size - 1); its
// *node sum* of a value is the exact fp32 sum of its ranks' values; the *cross* group of a rank
// holds one rank per node (the leaders, or the ranks of one local rank). Each value crosses
// nodes compressed once, as part of a node sum, so the cross algorithm's bound is the flat one
// with W = nodes and the ranges of the node sums (docs/algorithms.md, "Hierarchical").
//
// Two ways inside a node:
// - over the node's `intra` transport (exact collectives, transport.h): with intra_broadcast
//   (CGX's default) the node sum goes to local rank 0, which alone crosses nodes and broadcasts
//   the result; without, local rank l owns slice l of the buffer (a reduce-scatter), crosses
//   nodes with it and the node allgathers the slices;
// - over the node's shared-memory segment (core/shm_node.h), pipelined piece by piece with the
//   cross-node step on an executor (hierarchical_shm.cc), optionally with values rounded to
//   fp16 / bf16 on their way to their owner.
// Every rank ends with the same bytes: the cross results are bit-identical across nodes, and the
// node's broadcast / allgather / shared buffers copy them.
#pragma once

#include <cstdint>
#include <functional>

#include "core/dtype.h"
#include "core/serial_executor.h"
#include "core/shm_node.h"
#include "transport.h"

namespace cgx {

// One compressed allreduce of `n` fp32 node sums at `data`, in place, over `cross` (this rank's
// cross group); fills `residual` (n values, or null) as AllreduceOptions::residual. Returns the
// bytes it sent. The caller chooses the algorithm, compressor and random streams (each call
// must use streams of its own: its call index).
using CrossAllreduce =
    std::function<size_t(Transport& cross, float* data, int64_t n, float* residual)>;

struct HierarchicalOptions {
  int local_rank = 0;
  int local_size = 1;
  bool intra_broadcast = true;  // leaders (true) or slices (false); see above
  // Shared memory only: how values travel to the owner of their node sum (fp32: exact; fp16 /
  // bf16: rounded, the owner's own values staying fp32).
  DType intra_dtype = DType::kFloat32;
  // Slices and sub-ranges start at multiples of this (the compressor's bucket), so that none
  // cuts a bucket.
  int64_t alignment = 1;
  // Non-zero: the result is divided by it (the group size, for AVG); the cross allreduce sums.
  float divisor = 0.0f;
  // n values, or null: this rank's compression errors (on what it sent across nodes; zero
  // elsewhere), for error feedback.
  float* residual = nullptr;
};

// Where the node's steps run. `cross` may be null only on local ranks other than 0 with
// intra_broadcast (they send nothing across nodes). With `shm` (the node's segment, its slots
// at least 16 values per buffer), `cross_exec` runs the cross-node steps and `intra` is unused.
struct NodeGroups {
  Transport* intra = nullptr;
  Transport* cross = nullptr;
  ShmNode* shm = nullptr;
  SerialExecutor* cross_exec = nullptr;
};

// Reduces `n` fp32 values at `data` in place across every rank of every node; returns the bytes
// this rank sent across nodes.
size_t hierarchical_allreduce(const NodeGroups& groups, const HierarchicalOptions& o, float* data,
                              int64_t n, const CrossAllreduce& cross_allreduce);

// The shared-memory path (hierarchical_shm.cc), called by hierarchical_allreduce.
size_t shm_allreduce(const NodeGroups& groups, const HierarchicalOptions& o, float* data, int64_t n,
                     const CrossAllreduce& cross_allreduce);

}  // namespace cgx
