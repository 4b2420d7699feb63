// The hierarchical allreduce over the node's transport (hierarchical.h); the shared-memory path
// is hierarchical_shm.cc.
#include "hierarchical.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "core/error.h"

namespace cgx {
namespace {

void check(const NodeGroups& g, const HierarchicalOptions& o, int64_t n) {
  CGX_CHECK_ARG(n >= 0, "element count must be >= 0, got ", n);
  CGX_CHECK_ARG(o.local_size >= 1 && o.local_rank >= 0 && o.local_rank < o.local_size,
                "hierarchical: local rank ", o.local_rank, " outside a node of ", o.local_size);
  CGX_CHECK_ARG(o.alignment >= 1, "hierarchical: alignment must be >= 1, got ", o.alignment);
  CGX_CHECK_ARG(g.cross || (o.intra_broadcast && o.local_rank != 0),
                "hierarchical: this rank needs a cross-node group");
  CGX_CHECK_ARG(g.shm ? g.cross_exec != nullptr : g.intra != nullptr,
                "hierarchical: a node segment needs a cross executor, a node transport otherwise");
  CGX_CHECK_ARG(g.shm || o.intra_dtype == DType::kFloat32,
                "hierarchical: fp16 / bf16 inside a node needs the shared-memory segment");
  CGX_CHECK_ARG(
      !g.shm || (g.shm->local_size() == o.local_size && g.shm->local_rank() == o.local_rank),
      "hierarchical: the node segment's layout differs from the options'");
}

// Leaders: the node sum to local rank 0, across nodes from there, broadcast back.
size_t leaders(const NodeGroups& g, const HierarchicalOptions& o, float* data, int64_t n,
               const CrossAllreduce& cross_allreduce) {
  g.intra->reduce_sum(data, size_t(n), 0);
  size_t sent = 0;
  if (o.local_rank == 0) {
    sent = cross_allreduce(*g.cross, data, n, o.residual);
  } else if (o.residual) {
    std::memset(o.residual, 0, size_t(n) * sizeof(float));
  }
  g.intra->broadcast(reinterpret_cast<uint8_t*>(data), size_t(n) * sizeof(float), 0);
  return sent;
}

// Slices: local rank l owns [l * per, (l + 1) * per) of the buffer padded with zeros to
// local_size * per; per is a multiple of the alignment, so that slices cut no bucket.
size_t slices(const NodeGroups& g, const HierarchicalOptions& o, float* data, int64_t n,
              const CrossAllreduce& cross_allreduce) {
  const int64_t L = o.local_size, a = o.alignment;
  const int64_t per = ((n + L - 1) / L + a - 1) / a * a;
  std::vector<float> padded(size_t(per * L), 0.0f);
  std::copy(data, data + n, padded.begin());
  std::vector<float> slice(static_cast<size_t>(per));
  g.intra->reduce_scatter_sum(padded.data(), slice.data(), size_t(per));
  std::vector<float> res(o.residual ? size_t(per) : 0, 0.0f);
  const size_t sent =
      cross_allreduce(*g.cross, slice.data(), per, o.residual ? res.data() : nullptr);
  g.intra->allgather(reinterpret_cast<const uint8_t*>(slice.data()), size_t(per) * sizeof(float),
                     reinterpret_cast<uint8_t*>(padded.data()));
  std::copy(padded.begin(), padded.begin() + n, data);
  if (o.residual) {  // this rank's compression errors sit on its slice; zero elsewhere
    std::memset(o.residual, 0, size_t(n) * sizeof(float));
    const int64_t begin = std::min(n, o.local_rank * per), end = std::min(n, begin + per);
    std::copy(res.begin(), res.begin() + (end - begin), o.residual + begin);
  }
  return sent;
}

}  // namespace

size_t hierarchical_allreduce(const NodeGroups& groups, const HierarchicalOptions& o, float* data,
                              int64_t n, const CrossAllreduce& cross_allreduce) {
  check(groups, o, n);
  if (groups.shm) return shm_allreduce(groups, o, data, n, cross_allreduce);
  const size_t sent = o.intra_broadcast ? leaders(groups, o, data, n, cross_allreduce)
                                        : slices(groups, o, data, n, cross_allreduce);
  if (o.divisor != 0.0f) {
    for (int64_t i = 0; i < n; ++i) data[i] /= o.divisor;
  }
  return sent;
}

}  // namespace cgx
