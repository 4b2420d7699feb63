// The hierarchical compressed allreduce's c10d side (process_group_cgx.h, Hierarchy): builds the
// node's and the cross-node transports from the Gloo groups and runs the torch-free algorithm
// (csrc/algorithms/hierarchical.h: exact inside a node, over its Gloo group or its shared-memory
// segment; compressed across nodes with the group's settings).
#include "algorithms/hierarchical.h"

#include <ATen/ops/from_blob.h>

#include <optional>

#include "c10d_transport.h"
#include "call_options.h"
#include "core/error.h"
#include "engine.h"
#include "engine_stats.h"

namespace cgx::binding {
namespace {

// Per local rank: two piece buffers of 8 MiB (hierarchical_shm.cc); larger buffers in pieces.
constexpr size_t kShmSlotBytes = size_t(16) << 20;

DType intra_dtype(const std::string& intra_compress) {
  return intra_compress == "bf16"   ? DType::kBFloat16
         : intra_compress == "fp16" ? DType::kFloat16
                                    : DType::kFloat32;
}

}  // namespace

void Engine::set_hierarchy(const Hierarchy& h) {
  CGX_CHECK_ARG(h.intra && h.local_size >= 1 && h.nodes >= 1 && h.local_rank >= 0 &&
                    h.local_rank < h.local_size && h.local_size * h.nodes <= getSize(),
                "set_hierarchy: inconsistent node layout");
  CGX_CHECK_ARG(h.cross || (h.intra_broadcast && h.local_rank != 0),
                "set_hierarchy: this rank needs a cross-node group");
  CGX_CHECK_ARG(h.intra_compress == "off" || (!h.shm_name.empty() && (h.intra_compress == "fp16" ||
                                                                      h.intra_compress == "bf16")),
                "set_hierarchy: intra_compress must be off, or fp16 / bf16 over shared memory, "
                "got ",
                h.intra_compress);
  hierarchy_ = std::make_unique<Hierarchy>(h);
  if (!h.shm_name.empty()) {
    hierarchy_->shm =
        std::make_shared<ShmNode>(h.shm_name, h.local_rank, h.local_size, kShmSlotBytes, timeout_);
    hierarchy_->cross_exec = std::make_shared<SerialExecutor>();
  }
}

void Engine::unlink_node_segment() {
  if (hierarchy_ && hierarchy_->shm && hierarchy_->local_rank == 0) hierarchy_->shm->unlink();
}

void Engine::reduce_hierarchical(at::Tensor& t, const BackendConfig& c, bool average,
                                 float* residual) {
  const Hierarchy& h = *hierarchy_;
  // The node's exact steps count as time on the wire (the cross-node calls time their own).
  C10dTransport intra_c10d(h.intra);
  TimedTransport intra(intra_c10d, stats_.wire_ns);
  std::optional<C10dTransport> cross;
  if (h.cross) cross.emplace(h.cross);
  NodeGroups groups;
  groups.intra = &intra;
  groups.cross = cross ? &*cross : nullptr;
  groups.shm = h.shm.get();
  groups.cross_exec = h.cross_exec.get();
  HierarchicalOptions o;
  o.local_rank = h.local_rank;
  o.local_size = h.local_size;
  o.intra_broadcast = h.intra_broadcast;
  o.intra_dtype = h.shm ? intra_dtype(h.intra_compress) : DType::kFloat32;
  o.alignment = compressor_for(c).alignment();
  o.divisor = average ? float(getSize()) : 0.0f;
  o.residual = residual;
  // Each cross-node allreduce is one compressed call of the group (its own call index); the
  // transport it is given is `cross`, which run_algorithm builds again over the same group.
  const CrossAllreduce across = [this, &h, &c](Transport&, float* data, int64_t n, float* res) {
    at::Tensor part = at::from_blob(data, {n}, at::TensorOptions().dtype(at::kFloat));
    run_algorithm(h.cross, part, c, false, res);
    return size_t(last_bytes_sent_.load());
  };
  // The node sum is exact in fp32 whatever t's dtype: over shared memory in place where t allows,
  // otherwise on a private fp32 copy.
  Fp32Work work =
      h.shm ? fp32_work(t)
            : Fp32Work{t.to(at::kCPU, at::kFloat, false, true).contiguous().view({-1}), false};
  const size_t sent =
      hierarchical_allreduce(groups, o, work.flat.data_ptr<float>(), work.flat.numel(), across);
  last_bytes_sent_ = int64_t(sent);
  work.finish(t);
}

}  // namespace cgx::binding
