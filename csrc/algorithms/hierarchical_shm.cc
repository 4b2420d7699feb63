// The hierarchical allreduce's intra-node steps over the node's shared-memory segment
// (core/shm_node.h), pipelined (hierarchical.h). Each local rank's slot holds two piece buffers;
// a piece is at most one buffer, and local rank l sums sub-range l of it (a multiple of the
// compressor's alignment, so that no bucket is cut). For piece k, every local rank copies the
// sub-ranges others sum into its buffer k % 2; each sums its own sub-range (local-rank order,
// fp32: its own values from the caller's memory, the others' from their buffers). Then the
// cross-node allreduce of the sums is posted to the cross executor: without intra_broadcast each
// rank sends its sub-range (summed in the caller's memory, shared through its buffer
// afterwards); with it (leaders) the sums go to the buffers and local rank 0 sends them all, in
// place. While that runs, piece k - 1 is published (every rank copies the results it lacks out
// of the buffers) and piece k + 1 staged: the node's copies and sums overlap the transfer between
// nodes, each value crosses shared memory once each way, and the summing is spread over the
// node's ranks in both modes.
#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

#include "core/error.h"
#include "core/primitives.h"
#include "hierarchical.h"

namespace cgx {
namespace {

constexpr int kBuffers = 2;

// The pieces of one call and who owns what.
struct Pieces {
  int64_t n = 0, per = 1, align = 1;
  int local_size = 1;
  DType staged = DType::kFloat32;  // how values travel to their owner (intra_dtype)

  int64_t count() const { return (n + per - 1) / per; }
  int64_t begin(int64_t k) const { return k * per; }
  int64_t size(int64_t k) const { return std::min(per, n - k * per); }
  // Local rank l's sub-range [first, second) of piece k.
  std::pair<int64_t, int64_t> range(int64_t k, int l) const {
    const int64_t m = size(k);
    const int64_t chunk = ((m + local_size - 1) / local_size + align - 1) / align * align;
    return {std::min(m, l * chunk), std::min(m, (l + 1) * chunk)};
  }
};

int64_t buffer_elems(const ShmNode& node) {
  return int64_t(node.slot_bytes() / sizeof(float)) / kBuffers;
}

// Where local rank l's owners share their results of piece k (fp32).
float* buffer(const ShmNode& node, int l, int64_t k) {
  return reinterpret_cast<float*>(node.slot(l)) + (k % kBuffers) * buffer_elems(node);
}

// Where local rank l stages its values of piece k for their owners: the result area itself
// with fp32 (the sub-ranges others own are not the ones it shares), else 16-bit values after
// it (a piece then holds at most 2/3 of a buffer).
uint8_t* staging(const ShmNode& node, const Pieces& p, int l, int64_t k) {
  float* b = buffer(node, l, k);
  return reinterpret_cast<uint8_t*>(p.staged == DType::kFloat32 ? b : b + p.per);
}

struct Source {
  const void* at;
  DType dtype;
};

// dst[i] = sum over l, in order, of src[l][i] in fp32; dst may be one of the sources.
void node_sum(const std::vector<Source>& src, int64_t n, float* dst) {
  constexpr int64_t kBlock = 2048;
  float acc[kBlock];
  for (int64_t i0 = 0; i0 < n; i0 += kBlock) {
    const int64_t b = std::min(kBlock, n - i0);
    for (size_t l = 0; l < src.size(); ++l) {
      const auto* at =
          static_cast<const uint8_t*>(src[l].at) + i0 * int64_t(elem_size(src[l].dtype));
      prim::convert(at, src[l].dtype, acc, DType::kFloat32, b, l > 0);
    }
    std::copy(acc, acc + b, dst + i0);
  }
}

// out[i] = in[i] / divisor (divisor 0: a copy).
void copy_out(const float* in, int64_t n, float divisor, float* out) {
  if (divisor == 0.0f) {
    std::copy(in, in + n, out);
  } else {
    for (int64_t i = 0; i < n; ++i) out[i] = in[i] / divisor;
  }
}

// An owner's result, in place in w, for the others: shared[i] = w[i], then w[i] /= divisor.
void share_own(float* w, int64_t n, float divisor, float* shared) {
  std::copy(w, w + n, shared);
  if (divisor != 0.0f) {
    for (int64_t i = 0; i < n; ++i) w[i] /= divisor;
  }
}

// Waits for the cross executor's tasks before the buffers they use go away, also on an error.
struct DrainOnExit {
  SerialExecutor& ex;
  ~DrainOnExit() { ex.drain(); }
};

}  // namespace

size_t shm_allreduce(const NodeGroups& g, const HierarchicalOptions& o, float* w, int64_t n,
                     const CrossAllreduce& cross_allreduce) {
  ShmNode& node = *g.shm;
  SerialExecutor& ex = *g.cross_exec;
  CGX_CHECK_ARG(o.intra_dtype == DType::kFloat32 || o.intra_dtype == DType::kFloat16 ||
                    o.intra_dtype == DType::kBFloat16,
                "hierarchical: unknown intra dtype");
  const float divisor = o.divisor;
  float* residual = o.residual;
  // What this rank does not send across nodes has no compression error of its own.
  if (residual && n > 0) std::memset(residual, 0, size_t(n) * sizeof(float));
  Pieces p;
  p.n = n;
  p.align = o.alignment;
  p.staged = o.intra_dtype;
  const int64_t elems =
      p.staged == DType::kFloat32 ? buffer_elems(node) : buffer_elems(node) * 2 / 3;
  p.per = elems >= p.align ? elems / p.align * p.align : elems;
  CGX_CHECK_ARG(p.per >= 1, "hierarchical: the node segment's slots are too small");
  p.local_size = o.local_size;
  const bool leaders = o.intra_broadcast, leader = o.local_rank == 0;
  const int me = o.local_rank;
  std::vector<SerialExecutor::Ticket> tickets(size_t(p.count()), 0);
  size_t sent = 0;  // written by the cross tasks only, read after they finished
  DrainOnExit drain{ex};
  // The cross-node allreduce of `len` node sums at `at`, on the executor; `shared`: then copy
  // them to `shared` for the node (the owner's own sums stay in the caller's memory).
  auto post_cross = [&](float* at, int64_t len, float* res, float* shared) {
    return ex.post([&g, &cross_allreduce, &sent, at, len, res, shared, divisor] {
      sent += cross_allreduce(*g.cross, at, len, res);
      if (shared) share_own(at, len, divisor, shared);
    });
  };
  auto publish = [&](int64_t k) {
    ex.wait(tickets[size_t(k)]);
    node.barrier();  // every result of piece k is in the buffers
    for (int l = 0; l < o.local_size; ++l) {
      const auto [a, b] = p.range(k, l);
      if (leaders || l != me) copy_out(buffer(node, l, k) + a, b - a, divisor, w + p.begin(k) + a);
    }
    node.barrier();  // buffer k % 2 is free again
  };
  std::vector<Source> src(size_t(o.local_size));
  const int64_t esize = int64_t(elem_size(p.staged));
  SerialExecutor::Ticket last = 0;
  for (int64_t k = 0; k < p.count(); ++k) {
    float* piece = w + p.begin(k);
    const auto [a, b] = p.range(k, me);
    // The others' sub-ranges go to this rank's buffer; its own stays in w.
    prim::convert(piece, DType::kFloat32, staging(node, p, me, k), p.staged, a, false);
    prim::convert(piece + b, DType::kFloat32, staging(node, p, me, k) + b * esize, p.staged,
                  p.size(k) - b, false);
    node.barrier();  // piece k is in every buffer
    for (int l = 0; l < o.local_size; ++l) {
      src[size_t(l)] = l == me ? Source{piece + a, DType::kFloat32}
                               : Source{staging(node, p, l, k) + a * esize, p.staged};
    }
    float* res = residual ? residual + p.begin(k) : nullptr;
    if (!leaders) {  // each rank sends its own sums across nodes
      node_sum(src, b - a, piece + a);
      if (b > a)
        last = post_cross(piece + a, b - a, res ? res + a : nullptr, buffer(node, me, k) + a);
    } else {  // the leader sends the node's sums, in place in their buffers
      node_sum(src, b - a, buffer(node, me, k) + a);
      node.barrier();  // the node's sums of piece k are in the buffers
      for (int l = 0; leader && l < o.local_size; ++l) {
        const auto [la, lb] = p.range(k, l);
        if (lb > la)
          last = post_cross(buffer(node, l, k) + la, lb - la, res ? res + la : nullptr, nullptr);
      }
    }
    tickets[size_t(k)] = last;
    if (k > 0) publish(k - 1);
  }
  if (p.count() > 0) publish(p.count() - 1);
  return sent;
}

}  // namespace cgx
