// The hierarchical compressed allreduce (process_group_cgx.h, Hierarchy): exact inside a node,
// compressed across nodes. The node sum is taken in fp32 over the node's Gloo group; each
// value crosses nodes compressed as part of a node sum (the cross algorithm runs over
// `nodes` ranks, so its bound is the flat one with W = nodes and the ranges of the node sums).
// Every rank ends with the same bytes: the leaders' (or each slice owner's) results are
// bit-identical across nodes, and the intra-node broadcast / allgather copies them.
#include <ATen/ops/from_blob.h>
#include <ATen/ops/zeros.h>

#include <algorithm>
#include <vector>

#include "core/error.h"
#include "process_group_cgx.h"

namespace cgx::binding {
namespace {

constexpr size_t kShmSlotBytes = size_t(16) << 20;  // per local rank; larger buffers in pieces

// out[i] = sum over local ranks l of slot l's value i, in local-rank order (fp32).
void sum_slots(const ShmNode& node, int64_t offset, int64_t n, float* out) {
  const float* first = reinterpret_cast<const float*>(node.slot(0)) + offset;
  std::copy(first, first + n, out);
  for (int l = 1; l < node.local_size(); ++l) {
    const float* s = reinterpret_cast<const float*>(node.slot(l)) + offset;
    for (int64_t i = 0; i < n; ++i) out[i] += s[i];
  }
}

float* slot_f32(const ShmNode& node, int l) { return reinterpret_cast<float*>(node.slot(l)); }

}  // namespace

void ProcessGroupCGX::set_hierarchy(const Hierarchy& h) {
  CGX_CHECK_ARG(h.intra && h.local_size >= 1 && h.nodes >= 1 && h.local_rank >= 0 &&
                    h.local_rank < h.local_size && h.local_size * h.nodes <= getSize(),
                "set_hierarchy: inconsistent node layout");
  CGX_CHECK_ARG(h.cross || (h.intra_broadcast && h.local_rank != 0),
                "set_hierarchy: this rank needs a cross-node group");
  hierarchy_ = std::make_unique<Hierarchy>(h);
  if (!h.shm_name.empty()) {
    hierarchy_->shm =
        std::make_shared<ShmNode>(h.shm_name, h.local_rank, h.local_size, kShmSlotBytes, timeout_);
  }
}

void ProcessGroupCGX::unlink_node_segment() {
  if (hierarchy_ && hierarchy_->shm && hierarchy_->local_rank == 0) hierarchy_->shm->unlink();
}

void ProcessGroupCGX::reduce_hierarchical(at::Tensor& t, const BackendConfig& c, bool average,
                                          float* residual) {
  const Hierarchy& h = *hierarchy_;
  // A private fp32 copy: the node sum is exact in fp32 whatever t's dtype.
  at::Tensor work = t.to(at::kCPU, at::kFloat, false, true).contiguous().view({-1});
  const int64_t n = work.numel();
  if (h.shm) {
    if (h.intra_broadcast) {
      shm_leaders(work.data_ptr<float>(), n, c, residual);
    } else {
      shm_slices(work.data_ptr<float>(), n, c, residual);
    }
    if (average) work.div_(getSize());
    t.copy_(work.view(t.sizes()));
    return;
  }
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

// Leaders over shared memory: every local rank puts its values in its slot, the leader sums the
// slots (local-rank order), reduces across nodes, and puts the result back for the others.
void ProcessGroupCGX::shm_leaders(float* w, int64_t n, const BackendConfig& c, float* residual) {
  const Hierarchy& h = *hierarchy_;
  ShmNode& node = *h.shm;
  const int64_t per = int64_t(node.slot_bytes() / 4);
  const bool leader = h.local_rank == 0;
  for (int64_t p0 = 0; p0 < n; p0 += per) {
    const int64_t m = std::min(per, n - p0);
    std::copy(w + p0, w + p0 + m, slot_f32(node, h.local_rank));
    node.barrier();
    if (leader) sum_slots(node, 0, m, w + p0);
    node.barrier();  // slots free again
  }
  if (leader) {
    at::Tensor whole = at::from_blob(w, {n}, at::TensorOptions().dtype(at::kFloat));
    run_algorithm(h.cross, whole, c, false, residual);
  } else {
    last_bytes_sent_ = 0;
  }
  for (int64_t p0 = 0; p0 < n; p0 += per) {
    const int64_t m = std::min(per, n - p0);
    if (leader) std::copy(w + p0, w + p0 + m, slot_f32(node, 0));
    node.barrier();
    if (!leader) std::copy(slot_f32(node, 0), slot_f32(node, 0) + m, w + p0);
    node.barrier();
  }
}

// Slices over shared memory, a piece at a time: local rank l sums sub-range l of the piece from
// every slot, reduces it across nodes with the ranks of local rank l, writes it back into its
// own slot, and every rank copies all sub-ranges out. Sub-ranges and pieces are multiples of
// the compressor's bucket, so that no bucket is cut.
void ProcessGroupCGX::shm_slices(float* w, int64_t n, const BackendConfig& c, float* residual) {
  const Hierarchy& h = *hierarchy_;
  ShmNode& node = *h.shm;
  const int64_t align = c.compressor == "maxmin" ? c.bucket_size : compressor_for(c).alignment();
  const int64_t slot_elems = int64_t(node.slot_bytes() / 4);
  const int64_t per = slot_elems >= align ? slot_elems / align * align : slot_elems;
  const int L = h.local_size;
  std::vector<float> mine;
  for (int64_t p0 = 0; p0 < n; p0 += per) {
    const int64_t m = std::min(per, n - p0);
    const int64_t chunk = ((m + L - 1) / L + align - 1) / align * align;
    auto range = [&](int l) {
      return std::make_pair(std::min(m, l * chunk), std::min(m, (l + 1) * chunk));
    };
    std::copy(w + p0, w + p0 + m, slot_f32(node, h.local_rank));
    node.barrier();
    const auto [a, b] = range(h.local_rank);
    mine.resize(size_t(std::max<int64_t>(b - a, 1)));
    if (b > a) sum_slots(node, a, b - a, mine.data());
    node.barrier();  // every rank has read the slots
    if (b > a) {
      at::Tensor slice = at::from_blob(mine.data(), {b - a}, at::TensorOptions().dtype(at::kFloat));
      run_algorithm(h.cross, slice, c, false, residual ? residual + p0 + a : nullptr);
      std::copy(mine.begin(), mine.begin() + (b - a), slot_f32(node, h.local_rank) + a);
    }
    node.barrier();
    for (int l = 0; l < L; ++l) {
      const auto [la, lb] = range(l);
      std::copy(slot_f32(node, l) + la, slot_f32(node, l) + lb, w + p0 + la);
    }
    node.barrier();
  }
}

}  // namespace cgx::binding
