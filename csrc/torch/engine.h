// The engine: how the cgx backend reduces a tensor it runs itself, on the worker thread. It holds
// the group's private Gloo connection (`wire`), the node layout, the compressor cache, the
// algorithms' buffers and call counters, and the group's stats, and composes the algorithms of
// csrc/algorithms: rotation (rotated.h) around a hierarchical (hierarchical.h) or flat
// (allreduce.h) compressed allreduce, the compressed reduce-scatter (reduce_scatter.h), or an
// exact reduction. ProcessGroupCGX (the c10d adapter) decides what to run and when; the engine
// runs it. Only the worker calls it, but for stats() and the byte counters (any thread).
//
// The algorithms' c10d sides, which build transports from c10d groups and adapt tensors, are
// engine methods too, each in the file of its algorithm: reduce_rotated.cc, hierarchical.cc,
// reduce_scatter.cc.
#pragma once

#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <torch/csrc/distributed/c10d/Backend.hpp>

#include "algorithms/allreduce.h"
#include "backend_config.h"
#include "core/compressor.h"
#include "core/serial_executor.h"
#include "core/shm_node.h"
#include "engine_stats.h"

namespace cgx::binding {

// Node-aware (hierarchical) compressed allreduce, hierarchical.cc: ranks on one node reduce
// exactly among themselves (`intra`, the node's Gloo group), and only node sums cross nodes,
// compressed (`cross`): among the node leaders (intra_broadcast, CGX's default; others: no
// cross group) followed by an intra-node broadcast, or with every local rank owning a slice of
// the buffer (cross: the ranks of its local rank across nodes) followed by an intra allgather.
struct Hierarchy {
  c10::intrusive_ptr<c10d::Backend> intra;
  c10::intrusive_ptr<c10d::Backend> cross;  // null on non-leaders with intra_broadcast
  int local_rank = 0;
  int local_size = 1;
  int nodes = 1;
  bool intra_broadcast = true;
  // Non-empty: the node's shared-memory segment (core/shm_node.h) carries the intra-node steps
  // instead of `intra` (CGX_INNER_COMMUNICATOR_TYPE=SHM, the default); local rank 0 creates it.
  std::string shm_name;
  // With shm: how values travel to the owner of their node sum (CGX_INTRA_COMPRESS): fp32
  // (exact), or rounded to fp16 / bf16 (the owner's own values stay fp32).
  std::string intra_compress = "off";
  std::shared_ptr<ShmNode> shm;  // set by set_hierarchy
  // With shm: runs the cross-node step of piece k while piece k + 1 is summed in the node.
  std::shared_ptr<SerialExecutor> cross_exec;
};

class Engine {
 public:
  // `timeout` bounds the waits on the node's shared memory (set_hierarchy).
  Engine(int rank, int size, c10::intrusive_ptr<c10d::Backend> wire,
         std::chrono::milliseconds timeout);

  // Compressed allreduce of t in place with c: rotated when c rotates, hierarchical when the
  // group has a node layout, else flat. `compressor`: the call's own (CallOptions), or null for
  // the engine's cache (max-min included). `residual`: AllreduceOptions::residual.
  void allreduce(at::Tensor& t, const BackendConfig& c, bool average, float* residual,
                 std::shared_ptr<const Compressor> compressor = nullptr);
  // Exact allreduce of t in place over the wire (any dtype and op; AVG divides after a SUM).
  void allreduce_exact(at::Tensor& t, const c10d::ReduceOp& op);
  // Compressed reduce-scatter: chunk rank() of the sum of the inputs (size() chunks of
  // output's numel) into output.
  void reduce_scatter(at::Tensor& output, const at::Tensor& input, const BackendConfig& c,
                      bool average);
  void reduce_scatter_exact(at::Tensor& output, at::Tensor& input,
                            const c10d::ReduceScatterOptions& opts);
  // Every rank's per-call settings compared (call_settings.h), over the wire.
  void agree(const BackendConfig& c);

  // Turns on the hierarchical path (before the group's first use; hierarchical.cc).
  void set_hierarchy(const Hierarchy& h);
  bool hierarchical() const { return hierarchy_ != nullptr; }
  // Removes the node segment's name once every local rank has mapped it (leader; idempotent).
  void unlink_node_segment();
  void set_timeout(std::chrono::milliseconds timeout);
  // Lets the Gloo groups and the node segment go (the worker has stopped).
  void release();

  int64_t last_bytes_sent() const { return last_bytes_sent_; }
  int64_t total_bytes_sent() const { return total_bytes_sent_; }
  StatsSnapshot stats() const { return stats_.snapshot(); }
  void reset_stats() { stats_.reset(); }

 private:
  int getRank() const { return rank_; }
  int getSize() const { return size_; }
  const Compressor& compressor_for(const BackendConfig& c);
  void reduce_rotated(at::Tensor& t, const BackendConfig& c, bool average, float* residual);
  void reduce_unrotated(at::Tensor& t, const BackendConfig& c, bool average, float* residual);
  void reduce_hierarchical(at::Tensor& t, const BackendConfig& c, bool average, float* residual);
  // One alltoall of the chunks this rank does not own, each encoded once; the owner adds them,
  // decoded, to its own in fp32 (reduce_scatter.cc).
  void reduce_scatter_compressed(at::Tensor& output, const at::Tensor& input,
                                 const BackendConfig& c, bool average);
  // The compressed algorithm of `c` over the ranks of `over`, in place on `work` (contiguous
  // CPU); its transport calls count as wire time.
  void run_algorithm(const c10::intrusive_ptr<c10d::Backend>& over, at::Tensor& work,
                     const BackendConfig& c, bool average, float* residual);

  const int rank_;
  const int size_;
  c10::intrusive_ptr<c10d::Backend> wire_;
  std::unique_ptr<Hierarchy> hierarchy_;
  std::chrono::milliseconds timeout_;

  CompressedAllreduce algorithm_;
  std::shared_ptr<const Compressor> compressor_;       // compressor_for's cache
  std::shared_ptr<const Compressor> call_compressor_;  // the running call's, if it has one
  std::string compressor_name_;
  std::map<std::string, double> compressor_params_;
  uint64_t calls_ = 0;
  uint64_t rotated_calls_ = 0;  // the rotation's call index (the same on every rank)
  std::atomic<int64_t> last_bytes_sent_{0};
  std::atomic<int64_t> total_bytes_sent_{0};
  GroupStats stats_;
};

}  // namespace cgx::binding
