// The hierarchical compressed allreduce (process_group_cgx.h, Hierarchy): exact inside a node,
// compressed across nodes. The node sum is taken in fp32 over the node's Gloo group; each
// value crosses nodes compressed as part of a node sum (the cross algorithm runs over
// `nodes` ranks, so its bound is the flat one with W = nodes and the ranges of the node sums).
// The shared-memory intra-node path is in hierarchical_shm.cc.
// Every rank ends with the same bytes: the leaders' (or each slice owner's) results are
// bit-identical across nodes, and the intra-node broadcast / allgather copies them.
#include <ATen/ops/from_blob.h>
#include <ATen/ops/zeros.h>

#include <algorithm>
#include <vector>

#include "call_options.h"
#include "core/error.h"
#include "process_group_cgx.h"

namespace cgx::binding {
namespace {

// Per local rank: two piece buffers of 8 MiB (hierarchical_shm.cc); larger buffers in pieces.
constexpr size_t kShmSlotBytes = size_t(16) << 20;

}  // namespace

void ProcessGroupCGX::set_hierarchy(const Hierarchy& h) {
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

void ProcessGroupCGX::unlink_node_segment() {
  if (hierarchy_ && hierarchy_->shm && hierarchy_->local_rank == 0) hierarchy_->shm->unlink();
}

void ProcessGroupCGX::reduce_hierarchical(at::Tensor& t, const BackendConfig& c, bool average,
                                          float* residual) {
  const Hierarchy& h = *hierarchy_;
  if (h.shm) {
    // In fp32, in place where t allows: the node sum is exact in fp32 whatever the dtype.
    const Fp32Work work = fp32_work(t);
    shm_allreduce(work.flat.data_ptr<float>(), work.flat.numel(), c,
                  average ? float(getSize()) : 0.0f, residual);
    work.finish(t);
    return;
  }
  // A private fp32 copy: the node sum is exact in fp32 whatever t's dtype.
  at::Tensor work = t.to(at::kCPU, at::kFloat, false, true).contiguous().view({-1});
  const int64_t n = work.numel();
  if (h.intra_broadcast) {
    std::vector<at::Tensor> v = {work};
    c10d::ReduceOptions ro;
    ro.rootRank = 0;
    ro.reduceOp = c10d::ReduceOp::SUM;
    h.intra->reduce(v, ro)->wait();
    if (h.local_rank == 0) {
      run_algorithm(h.cross, work, c, false, residual);
    } else {
      last_bytes_sent_ = 0;
    }
    c10d::BroadcastOptions bo;
    bo.rootRank = 0;
    h.intra->broadcast(v, bo)->wait();
  } else {
    // Slices: local rank l owns [l * per, (l + 1) * per) of the (padded) buffer; per is a
    // multiple of the compressor's bucket, so that slices cut no bucket.
    const int64_t align = c.compressor == "maxmin" ? c.bucket_size : compressor_for(c).alignment();
    const int64_t per = ((n + h.local_size - 1) / h.local_size + align - 1) / align * align;
    at::Tensor padded = at::zeros({per * h.local_size}, work.options());
    padded.narrow(0, 0, n).copy_(work);
    at::Tensor slice = at::empty({per}, work.options());
    c10d::ReduceScatterOptions rso;
    rso.reduceOp = c10d::ReduceOp::SUM;
    h.intra->_reduce_scatter_base(slice, padded, rso)->wait();
    at::Tensor res = residual ? at::zeros({per}, work.options()) : at::Tensor();
    run_algorithm(h.cross, slice, c, false, residual ? res.data_ptr<float>() : nullptr);
    h.intra->_allgather_base(padded, slice)->wait();
    work = padded.narrow(0, 0, n);
    if (residual) {  // this rank's compression errors sit on its slice; zero elsewhere
      const int64_t begin = std::min(n, h.local_rank * per), end = std::min(n, begin + per);
      std::copy(res.data_ptr<float>(), res.data_ptr<float>() + (end - begin), residual + begin);
    }
  }
  if (average) work.div_(getSize());
  t.copy_(work.view(t.sizes()));
}

}  // namespace cgx::binding
